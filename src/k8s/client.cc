#include "k8s/client.h"

#include <algorithm>
#include <thread>

#include <curl/curl.h>
#include <sys/stat.h>

#include "absl/strings/cord.h"
#include "common/backoff.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"

#ifndef KGPU_VERSION
#define KGPU_VERSION "0.0.0"
#endif

namespace kgpu::k8s {
namespace {

constexpr char kHttpPayload[] = "kgpu.k8s/http-status";
constexpr char kReasonPayload[] = "kgpu.k8s/reason";

absl::StatusCode CodeFor(long http) {
  switch (http) {
    case 400:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 409:
      return absl::StatusCode::kAborted;
    case 410:
      return absl::StatusCode::kOutOfRange;
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    default:
      return http >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnknown;
  }
}

absl::Status WithHttp(absl::Status s, long http, std::string_view reason) {
  s.SetPayload(kHttpPayload, absl::Cord(std::to_string(http)));
  if (!reason.empty()) s.SetPayload(kReasonPayload, absl::Cord(std::string(reason)));
  return s;
}

std::once_flag g_curl_once;

size_t WriteToString(char* ptr, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(ptr, size * n);
  return size * n;
}

struct HeaderSink {
  std::string content_type;
  std::string retry_after;
  std::vector<std::string> warnings;
};

// `299 - "text"` (RFC 7234, as apimachinery's warning package writes it) -> text.
std::string WarningText(std::string_view v) {
  const auto open = v.find('"');
  if (open == std::string_view::npos || v.size() < open + 2 || v.back() != '"') return std::string(v);
  std::string out;
  for (size_t i = open + 1; i + 1 < v.size(); ++i) {
    if (v[i] == '\\' && i + 2 < v.size()) ++i;
    out += v[i];
  }
  return out;
}

size_t HeaderCb(char* ptr, size_t size, size_t n, void* user) {
  auto* sink = static_cast<HeaderSink*>(user);
  std::string_view line(ptr, size * n);
  auto colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' '))
      value.remove_suffix(1);
    if (name == "content-type") sink->content_type = std::string(value);
    if (name == "retry-after") sink->retry_after = std::string(value);
    if (name == "warning") sink->warnings.push_back(WarningText(value));
  }
  return size * n;
}

bool Idempotent(std::string_view method) {
  return method == "GET";
}

}  // namespace

int HttpStatus(const absl::Status& s) {
  auto p = s.GetPayload(kHttpPayload);
  if (!p) return 0;
  return std::atoi(std::string(*p).c_str());
}

std::string Reason(const absl::Status& s) {
  auto p = s.GetPayload(kReasonPayload);
  return p ? std::string(*p) : std::string();
}

std::string UserAgent() {
  return "kgpu/" KGPU_VERSION " (linux/amd64)";
}

RateLimiter::RateLimiter(double qps, int burst)
    : qps_(qps), burst_(std::max(1, burst)), tokens_(std::max(1, burst)), last_(std::chrono::steady_clock::now()) {}

void RateLimiter::Wait() {
  ++taken_;
  if (qps_ <= 0) return;
  std::chrono::duration<double> wait{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    tokens_ = std::min(burst_, tokens_ + std::chrono::duration<double>(now - last_).count() * qps_);
    last_ = now;
    tokens_ -= 1;  // may go negative: this caller waits for the deficit, later ones queue behind
    if (tokens_ < 0) wait = std::chrono::duration<double>(-tokens_ / qps_);
  }
  if (wait.count() > 0) std::this_thread::sleep_for(wait);
}

struct Client::Handle {
  CURL* curl = nullptr;
  ~Handle() {
    if (curl) curl_easy_cleanup(curl);
  }
};

Client::Client(Config config) : config_(std::move(config)), limiter_(config_.qps, config_.burst) {
  if (config_.user_agent.empty()) config_.user_agent = UserAgent();
  token_ = config_.token;
}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Create(Config config) {
  std::call_once(g_curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (config.server.empty()) return absl::InvalidArgumentError("kubernetes client: no server address");
  if (config.server.rfind("http://", 0) != 0 && config.server.rfind("https://", 0) != 0) {
    return absl::InvalidArgumentError(Cat("kubernetes client: server '", config.server, "' must be http(s)://"));
  }
  return std::unique_ptr<Client>(new Client(std::move(config)));
}

std::unique_ptr<Client::Handle> Client::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      auto h = std::move(idle_.back());
      idle_.pop_back();
      curl_easy_reset(h->curl);
      return h;
    }
  }
  auto h = std::make_unique<Handle>();
  h->curl = curl_easy_init();
  return h;
}

void Client::Release(std::unique_ptr<Handle> h) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < 8) idle_.push_back(std::move(h));
}

std::string Client::Token(bool force_reread) {
  std::lock_guard<std::mutex> lock(mu_);
  if (config_.token_file.empty()) return token_;
  struct stat st {};
  const int64_t mtime = ::stat(config_.token_file.c_str(), &st) == 0
                            ? static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec + st.st_size
                            : -2;
  if (force_reread || mtime != token_mtime_) {
    if (auto t = ReadFile(config_.token_file); t) {
      std::string v = *t;
      while (!v.empty() && (v.back() == '\n' || v.back() == '\r' || v.back() == ' ')) v.pop_back();
      if (v != token_ && token_mtime_ != -1) Log("k8s")->info("re-read the bearer token from {}", config_.token_file);
      token_ = v;
      token_mtime_ = mtime;
    } else {
      Log("k8s")->warn("cannot read the token file {}; keeping the previous token", config_.token_file);
    }
  }
  return token_;
}

void Client::SetCommon(Handle& h, const std::string& url, std::string_view method, std::vector<std::string>& headers,
                       bool force_token) {
  CURL* c = h.curl;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_USERAGENT, config_.user_agent.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min<int64_t>(config_.timeout.count(), 10000)));
  curl_easy_setopt(c, CURLOPT_PROXY, "");  // never a proxy from the environment: proxy-url is refused too
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  if (method == "GET") {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, std::string(method).c_str());
  }
  if (config_.server.rfind("https://", 0) == 0) {
    if (config_.insecure_skip_tls_verify) {
      curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
    } else if (!config_.ca_pem.empty()) {
      curl_blob blob{const_cast<char*>(config_.ca_pem.data()), config_.ca_pem.size(), CURL_BLOB_COPY};
      curl_easy_setopt(c, CURLOPT_CAINFO_BLOB, &blob);
    }
    if (!config_.client_cert_pem.empty()) {
      curl_blob cert{const_cast<char*>(config_.client_cert_pem.data()), config_.client_cert_pem.size(), CURL_BLOB_COPY};
      curl_blob key{const_cast<char*>(config_.client_key_pem.data()), config_.client_key_pem.size(), CURL_BLOB_COPY};
      curl_easy_setopt(c, CURLOPT_SSLCERT_BLOB, &cert);
      curl_easy_setopt(c, CURLOPT_SSLCERTTYPE, "PEM");
      curl_easy_setopt(c, CURLOPT_SSLKEY_BLOB, &key);
      curl_easy_setopt(c, CURLOPT_SSLKEYTYPE, "PEM");
    }
  }
  const std::string token = Token(force_token);
  if (!token.empty()) headers.push_back(Cat("Authorization: Bearer ", token));
  headers.push_back("Accept: application/json");
}

absl::StatusOr<Client::Response> Client::DoOnce(Handle& h, std::string_view method, const std::string& url,
                                                const std::string& body, std::string_view content_type) {
  bool force_token = false;
  for (int auth_try = 0; auth_try < 2; ++auth_try) {
    limiter_.Wait();
    ++requests_;
    curl_easy_reset(h.curl);
    std::vector<std::string> headers;
    SetCommon(h, url, method, headers, force_token);
    if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
      headers.push_back(Cat("Content-Type: ", content_type));
      curl_easy_setopt(h.curl, CURLOPT_POSTFIELDS, body.c_str());
      curl_easy_setopt(h.curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    }
    curl_slist* list = nullptr;
    for (const auto& hd : headers) list = curl_slist_append(list, hd.c_str());
    Response r;
    HeaderSink hs;
    curl_easy_setopt(h.curl, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(h.curl, CURLOPT_TIMEOUT_MS, static_cast<long>(config_.timeout.count()));
    curl_easy_setopt(h.curl, CURLOPT_WRITEFUNCTION, &WriteToString);
    curl_easy_setopt(h.curl, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(h.curl, CURLOPT_HEADERFUNCTION, &HeaderCb);
    curl_easy_setopt(h.curl, CURLOPT_HEADERDATA, &hs);
    const CURLcode rc = curl_easy_perform(h.curl);
    curl_slist_free_all(list);
    if (rc != CURLE_OK) {
      const absl::StatusCode code =
          rc == CURLE_OPERATION_TIMEDOUT ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable;
      return absl::Status(code, Cat(method, " ", url, ": ", curl_easy_strerror(rc)));
    }
    curl_easy_getinfo(h.curl, CURLINFO_RESPONSE_CODE, &r.status);
    r.content_type = hs.content_type;
    r.retry_after = hs.retry_after;
    r.warnings = std::move(hs.warnings);
    // client-go's default WarningHandler logs what the server warns about (e.g. unknown fields).
    for (const auto& w : r.warnings) Log("k8s")->warn("{} {}: the API server warns: {}", method, url, w);
    if (r.status == 401 && !config_.token_file.empty() && !force_token) {
      force_token = true;  // the token may have rotated under us
      continue;
    }
    return r;
  }
  return absl::InternalError("unreachable");
}

absl::StatusOr<Client::Response> Client::Do(std::string_view method, const std::string& path_and_query,
                                            const std::string& body, std::string_view content_type) {
  const std::string url = config_.server + path_and_query;
  auto h = Acquire();
  Backoff backoff(std::chrono::milliseconds(100), std::chrono::milliseconds(2000), 0.5);
  const int max_tries = std::max(1, config_.max_tries);
  absl::StatusOr<Response> r;
  for (int attempt = 1; attempt <= max_tries; ++attempt) {
    r = DoOnce(*h, method, url, body, content_type);
    bool retry = false;
    std::chrono::milliseconds wait = backoff.Next();
    const auto asked = r.ok() ? RetryAfter(r->retry_after, std::chrono::seconds(10)) : std::nullopt;
    if (!r.ok()) {
      retry = Idempotent(method);
    } else if (asked && (r->status == 429 || r->status >= 500)) {
      // client-go retries responses carrying Retry-After (429 and 5xx), up to 10 times.
      retry = true;
      wait = *asked;
    } else if (r->status >= 500 && Idempotent(method)) {
      retry = true;
    }
    if (!retry || attempt == max_tries) break;
    Log("k8s")->debug("{} {}: {}; retrying in {} ms", method, path_and_query,
                      r.ok() ? Cat("HTTP ", r->status) : std::string(r.status().message()), wait.count());
    std::this_thread::sleep_for(wait);
  }
  Release(std::move(h));
  return r;
}

absl::Status Client::ApiError(std::string_view method, const std::string& path, const Response& r) const {
  std::string message;
  std::string reason;
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.value("kind", "") == "Status") {
    message = j.value("message", "");
    reason = j.value("reason", "");
  }
  if (message.empty())
    message = r.body.empty() ? Cat("HTTP ", r.status) : Cat("HTTP ", r.status, ": ", r.body.substr(0, 200));
  return WithHttp(absl::Status(CodeFor(r.status), Cat(method, " ", path, ": ", message)), r.status, reason);
}

absl::StatusOr<nlohmann::json> Client::JsonOf(std::string_view method, const std::string& path,
                                              const Response& r) const {
  if (r.status < 200 || r.status >= 300) return ApiError(method, path, r);
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return absl::DataLossError(Cat(method, " ", path, ": the response is not JSON"));
  return j;
}

absl::StatusOr<nlohmann::json> Client::Get(const std::string& path) {
  auto r = Do("GET", path);
  if (!r.ok()) return r.status();
  return JsonOf("GET", path, *r);
}

namespace {
std::string Query(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string q;
  for (const auto& [k, v] : kv) {
    if (v.empty()) continue;
    q += q.empty() ? "?" : "&";
    q += Cat(k, "=", UrlEncode(v));
  }
  return q;
}
}  // namespace

absl::StatusOr<nlohmann::json> Client::ListPage(const std::string& path, const ListOptions& opts,
                                                const std::string& continue_token) {
  const std::string q = Query({{"labelSelector", opts.label_selector},
                               {"fieldSelector", opts.field_selector},
                               {"limit", opts.limit > 0 ? std::to_string(opts.limit) : ""},
                               {"continue", continue_token},
                               {"resourceVersion", continue_token.empty() ? opts.resource_version : ""}});
  return Get(path + q);
}

absl::StatusOr<nlohmann::json> Client::List(const std::string& path, const ListOptions& opts) {
  for (int restart = 0; restart < 2; ++restart) {
    auto first = ListPage(path, opts);
    if (!first.ok()) return first.status();
    nlohmann::json out = *first;
    if (!out.contains("items") || out["items"].is_null()) out["items"] = nlohmann::json::array();
    std::string cont = out["metadata"].value("continue", "");
    bool expired = false;
    while (!cont.empty()) {
      auto page = ListPage(path, opts, cont);
      if (!page.ok()) {
        if (IsApiGone(page.status()) && restart == 0) {
          expired = true;  // the continue token outlived the compaction window: start over
          break;
        }
        return page.status();
      }
      for (auto& item : (*page)["items"]) out["items"].push_back(std::move(item));
      cont = (*page)["metadata"].value("continue", "");
    }
    if (expired) continue;
    out["metadata"].erase("continue");
    out["metadata"].erase("remainingItemCount");
    return out;
  }
  return absl::UnavailableError(Cat("LIST ", path, ": the continue token expired twice"));
}

absl::StatusOr<nlohmann::json> Client::Create(const std::string& collection_path, const nlohmann::json& obj) {
  auto r = Do("POST", collection_path, obj.dump());
  if (!r.ok()) return r.status();
  return JsonOf("POST", collection_path, *r);
}

absl::StatusOr<nlohmann::json> Client::Update(const std::string& path, const nlohmann::json& obj) {
  auto r = Do("PUT", path, obj.dump());
  if (!r.ok()) return r.status();
  return JsonOf("PUT", path, *r);
}

absl::StatusOr<nlohmann::json> Client::Patch(const std::string& path, const nlohmann::json& patch,
                                             std::string_view content_type) {
  auto r = Do("PATCH", path, patch.dump(), content_type);
  if (!r.ok()) return r.status();
  return JsonOf("PATCH", path, *r);
}

absl::StatusOr<nlohmann::json> Client::Delete(const std::string& path, const DeleteOptions& opts) {
  nlohmann::json body = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}};
  if (opts.grace_period_seconds) body["gracePeriodSeconds"] = *opts.grace_period_seconds;
  if (!opts.propagation_policy.empty()) body["propagationPolicy"] = opts.propagation_policy;
  if (!opts.precondition_uid.empty()) body["preconditions"]["uid"] = opts.precondition_uid;
  if (!opts.precondition_resource_version.empty()) {
    body["preconditions"]["resourceVersion"] = opts.precondition_resource_version;
  }
  auto r = Do("DELETE", path, body.dump());
  if (!r.ok()) return r.status();
  return JsonOf("DELETE", path, *r);
}

absl::StatusOr<nlohmann::json> Client::UpdateWithRetry(const std::string& path,
                                                       const std::function<absl::Status(nlohmann::json&)>& mutate,
                                                       int attempts) {
  Backoff backoff(std::chrono::milliseconds(10), std::chrono::seconds(1), 0.5);
  absl::Status last;
  for (int i = 0; i < attempts; ++i) {
    auto obj = Get(path);
    if (!obj.ok()) return obj.status();
    if (auto s = mutate(*obj); !s.ok()) return s;
    auto updated = Update(path, *obj);
    if (updated.ok() || !IsApiConflict(updated.status())) return updated;
    last = updated.status();
    std::this_thread::sleep_for(backoff.Next());
  }
  return last;
}

absl::Status Client::Bind(std::string_view ns, std::string_view pod, std::string_view node, const BindOptions& opts) {
  nlohmann::json binding = {{"apiVersion", "v1"},
                            {"kind", "Binding"},
                            {"metadata", {{"name", pod}, {"namespace", ns}}},
                            {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  if (!opts.uid.empty()) binding["metadata"]["uid"] = opts.uid;
  if (!opts.annotations.empty()) binding["metadata"]["annotations"] = opts.annotations;
  auto r = Create(FindResource("pods")->Path(ns, pod, "binding"), binding);
  return r.status();
}

absl::Status Client::Evict(std::string_view ns, std::string_view pod, const EvictOptions& opts) {
  nlohmann::json eviction = {
      {"apiVersion", "policy/v1"}, {"kind", "Eviction"}, {"metadata", {{"name", pod}, {"namespace", ns}}}};
  if (!opts.uid.empty()) eviction["deleteOptions"] = {{"preconditions", {{"uid", opts.uid}}}};
  const std::string path = FindResource("pods")->Path(ns, pod, "eviction") + (opts.dry_run ? "?dryRun=All" : "");
  const auto deadline = std::chrono::steady_clock::now() + opts.max_wait;
  Backoff backoff(opts.initial_backoff, opts.max_backoff, 0.5);
  for (;;) {
    auto r = Create(path, eviction);
    if (r.ok() || IsApiNotFound(r.status())) return absl::OkStatus();
    if (HttpStatus(r.status()) != 429 || opts.dry_run) return r.status();
    // 429: a PodDisruptionBudget allows no disruption now; the apiserver sends no Retry-After
    // (kubernetes/kubernetes#36409), so back off ourselves.
    if (std::chrono::steady_clock::now() + backoff.current() > deadline) {
      return absl::DeadlineExceededError(
          Cat(r.status().message(), " (still refused after ", opts.max_wait.count(), " ms)"));
    }
    Log("k8s")->info("eviction of {}/{} refused for now ({}); retrying in {} ms", ns, pod,
                     std::string(r.status().message()), backoff.current().count());
    const auto until = std::chrono::steady_clock::now() + backoff.Next();
    while (std::chrono::steady_clock::now() < until) {
      if (opts.stop.stop_requested()) return absl::CancelledError(Cat("eviction of ", ns, "/", pod, ": stopped"));
      std::this_thread::sleep_for(
          std::min<std::chrono::nanoseconds>(until - std::chrono::steady_clock::now(), std::chrono::milliseconds(50)));
    }
  }
}

namespace {
struct WatchCtx {
  WatchDecoder decoder;
  const std::function<bool(const WatchEvent&)>* on_event = nullptr;
  std::stop_token stop;
  bool stopped_by_caller = false;
  absl::Status error;
  std::string error_body;  // a non-2xx response's body
  long status = 0;
  CURL* curl = nullptr;
  std::vector<WatchEvent> batch;
};

size_t WatchWrite(char* ptr, size_t size, size_t n, void* user) {
  auto* ctx = static_cast<WatchCtx*>(user);
  const size_t len = size * n;
  if (ctx->status == 0) curl_easy_getinfo(ctx->curl, CURLINFO_RESPONSE_CODE, &ctx->status);
  if (ctx->status < 200 || ctx->status >= 300) {
    ctx->error_body.append(ptr, std::min<size_t>(len, 1 << 16));
    return len;
  }
  ctx->batch.clear();
  ctx->error = ctx->decoder.Feed(std::string_view(ptr, len), ctx->batch);
  if (!ctx->error.ok()) return 0;
  for (const auto& ev : ctx->batch) {
    if (!(*ctx->on_event)(ev)) {
      ctx->stopped_by_caller = true;
      return 0;
    }
  }
  return len;
}

int WatchProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* ctx = static_cast<WatchCtx*>(user);
  return ctx->stop.stop_requested() ? 1 : 0;
}
}  // namespace

absl::Status Client::Watch(const std::string& collection_path, const WatchOptions& opts,
                           const std::function<bool(const WatchEvent&)>& on_event, std::stop_token stop) {
  const std::string path =
      collection_path +
      Query({{"watch", "true"},
             {"resourceVersion", opts.resource_version},
             {"labelSelector", opts.label_selector},
             {"fieldSelector", opts.field_selector},
             {"allowWatchBookmarks", opts.allow_bookmarks ? "true" : ""},
             {"timeoutSeconds", opts.timeout_seconds > 0 ? std::to_string(opts.timeout_seconds) : ""}});
  const std::string url = config_.server + path;
  limiter_.Wait();
  ++requests_;
  auto h = Acquire();
  std::vector<std::string> headers;
  SetCommon(*h, url, "GET", headers, false);
  curl_slist* list = nullptr;
  for (const auto& hd : headers) list = curl_slist_append(list, hd.c_str());
  WatchCtx ctx;
  ctx.on_event = &on_event;
  ctx.stop = stop;
  ctx.curl = h->curl;
  curl_easy_setopt(h->curl, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, &WatchWrite);
  curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &ctx);
  curl_easy_setopt(h->curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h->curl, CURLOPT_XFERINFOFUNCTION, &WatchProgress);
  curl_easy_setopt(h->curl, CURLOPT_XFERINFODATA, &ctx);
  const CURLcode rc = curl_easy_perform(h->curl);
  curl_slist_free_all(list);
  if (ctx.status == 0) curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &ctx.status);
  Release(std::move(h));
  if (ctx.stopped_by_caller || stop.stop_requested()) return absl::OkStatus();
  if (!ctx.error.ok()) return ctx.error;
  if (rc != CURLE_OK) return absl::UnavailableError(Cat("WATCH ", path, ": ", curl_easy_strerror(rc)));
  if (ctx.status < 200 || ctx.status >= 300) {
    Response r;
    r.status = ctx.status;
    r.body = ctx.error_body;
    return ApiError("WATCH", path, r);
  }
  if (!ctx.decoder.AtBoundary()) return absl::DataLossError(Cat("WATCH ", path, ": the stream ended inside an event"));
  return absl::OkStatus();
}

}  // namespace kgpu::k8s
