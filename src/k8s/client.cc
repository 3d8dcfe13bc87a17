#include "k8s/client.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <optional>
#include <thread>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <sys/stat.h>

#include "absl/strings/cord.h"
#include "common/backoff.h"
#include "common/files.h"
#include "common/listen_address.h"
#include "common/log.h"
#include "common/strings.h"
#include "k8s/exec_credential.h"

#ifndef KGPU_VERSION
#define KGPU_VERSION "0.0.0"
#endif

namespace kgpu::k8s {
namespace {

constexpr char kHttpPayload[] = "kgpu.k8s/http-status";
constexpr char kReasonPayload[] = "kgpu.k8s/reason";
// Errors that another try cannot fix (a certificate that fails verification, a credential plugin
// that fails): Do() does not retry them.
constexpr char kNoRetryPayload[] = "kgpu.k8s/no-retry";

absl::Status NoRetry(absl::Status s) {
  s.SetPayload(kNoRetryPayload, absl::Cord("1"));
  return s;
}

bool IsNoRetry(const absl::Status& s) {
  return s.GetPayload(kNoRetryPayload).has_value();
}

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

// The parts of a server URL "https://host:port/prefix" (host may be a bracketed IPv6 address).
struct ServerParts {
  std::string scheme;       // "https"
  std::string authority;    // "10.0.0.1:6443", as written
  std::string host;         // "10.0.0.1", "::1"
  std::string host_in_url;  // "10.0.0.1", "[::1]"
  std::string port;         // "6443"; the scheme's default when absent
  std::string suffix;       // "/prefix" or ""
};

ServerParts SplitServer(const std::string& server) {
  ServerParts p;
  const size_t sep = server.find("://");
  p.scheme = server.substr(0, sep);
  const std::string rest = sep == std::string::npos ? server : server.substr(sep + 3);
  const size_t slash = rest.find('/');
  p.authority = rest.substr(0, slash);
  p.suffix = slash == std::string::npos ? std::string() : rest.substr(slash);
  std::string a = p.authority;
  if (const size_t at = a.rfind('@'); at != std::string::npos) a = a.substr(at + 1);
  if (!a.empty() && a[0] == '[' && a.find(']') != std::string::npos) {
    const size_t close = a.find(']');
    p.host_in_url = a.substr(0, close + 1);
    p.host = a.substr(1, close - 1);
    if (close + 1 < a.size() && a[close + 1] == ':') p.port = a.substr(close + 2);
  } else {
    const size_t colon = a.rfind(':');
    p.host_in_url = a.substr(0, colon);
    p.host = p.host_in_url;
    if (colon != std::string::npos) p.port = a.substr(colon + 1);
  }
  if (p.port.empty()) p.port = p.scheme == "https" ? "443" : "80";
  return p;
}

// What the server's certificate says, read through a second handshake that verifies nothing
// (CURLOPT_CERTINFO: libcurl's OpenSSL backend lists "X509v3 Subject Alternative Name:DNS:a,
// IP Address:10.0.0.1", "Start date:Jan  2 03:04:05 2025 GMT", "Expire date:..." per
// certificate). Only made after a verification failed, to say which names or dates it has.
struct PeerCert {
  bool ok = false;
  std::vector<std::string> dns, ips;
  std::optional<time_t> not_before, not_after;
};

std::optional<time_t> CertDate(std::string_view v) {
  static constexpr std::string_view kMonths = "JanFebMarAprMayJunJulAugSepOctNovDec";
  char mon[4] = {0};
  int d = 0, h = 0, mi = 0, sec = 0, y = 0;
  if (std::sscanf(std::string(v).c_str(), "%3s %d %d:%d:%d %d", mon, &d, &h, &mi, &sec, &y) != 6) return std::nullopt;
  const size_t m = kMonths.find(mon);
  if (m == std::string_view::npos || m % 3 != 0) return std::nullopt;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = static_cast<int>(m / 3);
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  return ::timegm(&tm);
}

std::string Rfc3339(time_t t) {
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

PeerCert ProbePeerCert(const std::string& url, curl_slist* connect_to) {
  PeerCert pc;
  CURL* c = curl_easy_init();
  if (c == nullptr) return pc;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_CONNECT_ONLY, 1L);  // the TLS handshake, no request
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  curl_easy_setopt(c, CURLOPT_CERTINFO, 1L);
  if (connect_to != nullptr) curl_easy_setopt(c, CURLOPT_CONNECT_TO, connect_to);
  if (curl_easy_perform(c) == CURLE_OK) {
    curl_certinfo* info = nullptr;
    if (curl_easy_getinfo(c, CURLINFO_CERTINFO, &info) == CURLE_OK && info != nullptr && info->num_of_certs > 0) {
      pc.ok = true;
      for (curl_slist* e = info->certinfo[0]; e != nullptr; e = e->next) {  // [0]: the server's own
        const std::string_view line(e->data);
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos) continue;
        const std::string_view name = line.substr(0, colon);
        std::string_view value = line.substr(colon + 1);
        if (name == "X509v3 Subject Alternative Name") {
          while (!value.empty()) {
            const size_t comma = value.find(',');
            std::string_view item = value.substr(0, comma);
            value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
            while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
            while (!item.empty() && (item.back() == ' ' || item.back() == '\n')) item.remove_suffix(1);
            if (item.rfind("DNS:", 0) == 0) pc.dns.emplace_back(item.substr(4));
            if (item.rfind("IP Address:", 0) == 0) pc.ips.emplace_back(item.substr(11));
          }
        } else if (name == "Start date") {
          pc.not_before = CertDate(value);
        } else if (name == "Expire date") {
          pc.not_after = CertDate(value);
        }
      }
    }
  }
  curl_easy_cleanup(c);
  return pc;
}

// Go's x509.HostnameError text.
std::string HostnameError(const PeerCert& pc, const std::string& host) {
  if (!pc.ok) return Cat("x509: certificate is not valid for ", host);
  unsigned char buf[16];
  const bool ip = ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
  std::string valid;
  if (ip) {
    if (pc.ips.empty()) {
      return Cat("x509: cannot validate certificate for ", host, " because it doesn't contain any IP SANs");
    }
    valid = Join(pc.ips, ", ");
  } else {
    valid = Join(pc.dns, ", ");
  }
  if (valid.empty()) return Cat("x509: certificate is not valid for any names, but wanted to match ", host);
  return Cat("x509: certificate is valid for ", valid, ", not ", host);
}

bool Contains(std::string_view text, std::string_view what) {
  return text.find(what) != std::string_view::npos;
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
  char errbuf[CURL_ERROR_SIZE] = {0};  // libcurl's words on the last failure (CURLOPT_ERRORBUFFER)
  ~Handle() {
    if (curl) curl_easy_cleanup(curl);
  }
};

Client::Client(Config config) : config_(std::move(config)), limiter_(config_.qps, config_.burst) {
  if (config_.user_agent.empty()) config_.user_agent = UserAgent();
  token_ = config_.token;
  const ServerParts p = SplitServer(config_.server);
  curl_server_ = config_.server;
  verify_host_ = p.host;
  if (!config_.tls_server_name.empty() && p.scheme == "https") {
    // tls-server-name, as client-go's tls.Config.ServerName: the SNI and the name the certificate
    // is checked against, while the connection goes to the server URL's host. libcurl takes both
    // from the URL's host and has no option for them alone, so the URL names tls-server-name and
    // CURLOPT_CONNECT_TO ("name:port:real-host:port") sends the connection to the real address;
    // curl documents that CONNECT_TO does not affect the name used for TLS (SNI, certificate
    // verification). An explicit Host header keeps the server's own host:port, as client-go sends.
    const std::string& name = config_.tls_server_name;
    const std::string name_in_url = UrlHost(name);
    curl_server_ = Cat("https://", name_in_url, ":", p.port, p.suffix);
    connect_to_ = curl_slist_append(nullptr, Cat(name_in_url, ":", p.port, ":", p.host_in_url, ":", p.port).c_str());
    host_header_ = Cat("Host: ", p.authority);
    verify_host_ = name;
  }
  // client-go: a request that already has a bearer token never runs the plugin; the plugin's
  // client certificate is used only when the kubeconfig gives none.
  if (config_.exec && config_.token.empty() && config_.token_file.empty()) {
    exec_ = ExecCredentialSource::Shared(config_);
  }
}

Client::~Client() {
  idle_.clear();
  if (connect_to_ != nullptr) curl_slist_free_all(connect_to_);
}

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

absl::StatusOr<uint64_t> Client::SetCommon(Handle& h, const std::string& path_and_query, std::string_view method,
                                           std::vector<std::string>& headers, bool force_token) {
  CURL* c = h.curl;
  const std::string url = curl_server_ + path_and_query;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_USERAGENT, config_.user_agent.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min<int64_t>(config_.timeout.count(), 10000)));
  curl_easy_setopt(c, CURLOPT_PROXY, "");  // never a proxy from the environment: proxy-url is refused too
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  h.errbuf[0] = '\0';
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h.errbuf);
  if (method == "GET") {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, std::string(method).c_str());
  }
  if (connect_to_ != nullptr) {
    curl_easy_setopt(c, CURLOPT_CONNECT_TO, connect_to_);
    headers.push_back(host_header_);
  }
  std::optional<ExecCredential> cred;
  if (exec_) {
    auto got = exec_->Get();
    if (!got.ok()) return got.status();
    cred = std::move(*got);
  }
  if (config_.server.rfind("https://", 0) == 0) {
    if (config_.insecure_skip_tls_verify) {
      curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
    } else if (!config_.ca_pem.empty()) {
      curl_blob blob{const_cast<char*>(config_.ca_pem.data()), config_.ca_pem.size(), CURL_BLOB_COPY};
      curl_easy_setopt(c, CURLOPT_CAINFO_BLOB, &blob);
    }
    const std::string* cert_pem = &config_.client_cert_pem;
    const std::string* key_pem = &config_.client_key_pem;
    if (cert_pem->empty() && cred && !cred->client_cert_pem.empty()) {
      cert_pem = &cred->client_cert_pem;  // the plugin's: libcurl reuses a connection only for the same one
      key_pem = &cred->client_key_pem;
    }
    if (!cert_pem->empty()) {
      curl_blob cert{const_cast<char*>(cert_pem->data()), cert_pem->size(), CURL_BLOB_COPY};
      curl_blob key{const_cast<char*>(key_pem->data()), key_pem->size(), CURL_BLOB_COPY};
      curl_easy_setopt(c, CURLOPT_SSLCERT_BLOB, &cert);
      curl_easy_setopt(c, CURLOPT_SSLCERTTYPE, "PEM");
      curl_easy_setopt(c, CURLOPT_SSLKEY_BLOB, &key);
      curl_easy_setopt(c, CURLOPT_SSLKEYTYPE, "PEM");
    }
  }
  std::string token = Token(force_token);
  if (token.empty() && cred) token = cred->token;
  if (!token.empty()) headers.push_back(Cat("Authorization: Bearer ", token));
  headers.push_back("Accept: application/json");
  return cred ? cred->generation : uint64_t{0};
}

absl::Status Client::TransportError(Handle& h, int curl_code, std::string_view verb, const std::string& url) const {
  const auto rc = static_cast<CURLcode>(curl_code);
  const std::string detail = h.errbuf[0] != '\0' ? std::string(h.errbuf) : std::string(curl_easy_strerror(rc));
  const absl::StatusCode code =
      rc == CURLE_OPERATION_TIMEDOUT ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable;
  std::string lower = detail;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  const std::string where = config_.origin.empty() ? std::string("the client's configuration") : config_.origin;
  std::string tls;
  if (rc == CURLE_PEER_FAILED_VERIFICATION) {
    // Which check failed, in Go's crypto/x509 words (what kubectl prints), then libcurl's own.
    long verify = 0;  // OpenSSL's X509_V_ERR_* of the chain check
    curl_easy_getinfo(h.curl, CURLINFO_SSL_VERIFYRESULT, &verify);
    std::string x509, check;
    if (verify == 9 || verify == 10 || Contains(lower, "expired") || Contains(lower, "not yet valid")) {
      x509 = "x509: certificate has expired or is not yet valid";
      const PeerCert pc = ProbePeerCert(curl_server_ + "/", connect_to_);
      const time_t now = std::time(nullptr);
      if (pc.not_after && now > *pc.not_after) {
        x509 += Cat(": current time ", Rfc3339(now), " is after ", Rfc3339(*pc.not_after));
      } else if (pc.not_before && now < *pc.not_before) {
        x509 += Cat(": current time ", Rfc3339(now), " is before ", Rfc3339(*pc.not_before));
      }
      check = "the certificate's validity period check";
    } else if (Contains(lower, "host name") || Contains(lower, "hostname") || Contains(lower, "subject name")) {
      const PeerCert pc = ProbePeerCert(curl_server_ + "/", connect_to_);
      x509 = HostnameError(pc, verify_host_);
      if (!config_.tls_server_name.empty()) {
        check = Cat("the server name check against tls-server-name ", verify_host_);
      } else {
        check = Cat("the server name check against ", verify_host_, ", the host of the server URL");
        if (!pc.dns.empty()) {
          check += Cat(" (the certificate names ", Join(pc.dns, ", "),
                       ": the cluster's tls-server-name can name one of them, as for kubectl)");
        }
      }
    } else if (verify == 2 || verify == 18 || verify == 19 || verify == 20 || verify == 21 ||
               Contains(lower, "issuer") || Contains(lower, "self-signed") || Contains(lower, "self signed") ||
               Contains(lower, "unable to verify")) {
      x509 = "x509: certificate signed by unknown authority";
      check = config_.ca_pem.empty()
                  ? std::string(
                        "the certificate chain check against the system's trusted CAs (no certificate-authority "
                        "is configured)")
                  : Cat("the certificate chain check against the certificate-authority of ", where);
    } else {
      x509 = Cat("x509: ", detail);
      check = "the certificate verification";
    }
    tls = Cat("tls: failed to verify certificate: ", x509, " (", check, " failed; libcurl: ", detail, ")");
  } else if (rc == CURLE_SSL_CERTPROBLEM || rc == CURLE_SSL_CLIENTCERT) {
    tls = Cat("tls: the client certificate and key cannot be used (",
              config_.client_cert_pem.empty() && exec_ ? Cat("from the exec plugin ", config_.exec->command)
                                                       : Cat("client-certificate and client-key of ", where),
              "): ", detail);
  } else if (rc == CURLE_SSL_CACERT_BADFILE) {
    tls = Cat("tls: the certificate-authority of ", where, " cannot be used: ", detail);
  } else if (rc == CURLE_SSL_CONNECT_ERROR) {
    tls = Cat("tls: the TLS handshake failed: ", detail);
  } else if (rc == CURLE_SSL_CIPHER || rc == CURLE_SSL_ISSUER_ERROR || rc == CURLE_SSL_PINNEDPUBKEYNOTMATCH ||
             rc == CURLE_SSL_INVALIDCERTSTATUS || rc == CURLE_SSL_CRL_BADFILE || rc == CURLE_SSL_ENGINE_NOTFOUND ||
             rc == CURLE_SSL_ENGINE_SETFAILED || rc == CURLE_SSL_ENGINE_INITFAILED) {
    tls = Cat("tls: ", detail);
  }
  if (tls.empty()) return absl::Status(code, Cat(verb, " ", url, ": ", detail));
  absl::Status s(code, Cat(verb, " ", url, ": ", tls));
  const bool permanent = rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CERTPROBLEM ||
                         rc == CURLE_SSL_CLIENTCERT || rc == CURLE_SSL_CACERT_BADFILE;
  return permanent ? NoRetry(std::move(s)) : s;
}

absl::StatusOr<Client::Response> Client::DoOnce(Handle& h, std::string_view method, const std::string& path_and_query,
                                                const std::string& body, std::string_view content_type) {
  const std::string url = config_.server + path_and_query;  // for messages
  bool force_token = false;
  for (int auth_try = 0;; ++auth_try) {
    limiter_.Wait();
    ++requests_;
    curl_easy_reset(h.curl);
    std::vector<std::string> headers;
    auto generation = SetCommon(h, path_and_query, method, headers, force_token);
    if (!generation.ok()) {
      return NoRetry(
          absl::Status(generation.status().code(), Cat(method, " ", url, ": ", generation.status().message())));
    }
    // client-go's transport asks for gzip (Go's http.Transport unless disable-compression), and the
    // API server compresses large list responses (128 KiB and more); libcurl decodes them.
    if (!config_.disable_compression) curl_easy_setopt(h.curl, CURLOPT_ACCEPT_ENCODING, "gzip");
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
    if (rc != CURLE_OK) return TransportError(h, rc, method, url);
    curl_easy_getinfo(h.curl, CURLINFO_RESPONSE_CODE, &r.status);
    r.content_type = hs.content_type;
    r.retry_after = hs.retry_after;
    r.warnings = std::move(hs.warnings);
    // client-go's default WarningHandler logs what the server warns about (e.g. unknown fields).
    for (const auto& w : r.warnings) Log("k8s")->warn("{} {}: the API server warns: {}", method, url, w);
    if (r.status == 401 && auth_try == 0 && (!config_.token_file.empty() || *generation != 0)) {
      // The token may have rotated under us: re-read the token file, or run the exec plugin again
      // (client-go drops the plugin's credential on a 401 too, but returns the 401 and lets the
      // next request use the new one; sending this one again is kgpu's).
      if (*generation != 0) exec_->Invalidate(*generation);
      force_token = true;
      continue;
    }
    return r;
  }
}

absl::StatusOr<Client::Response> Client::Do(std::string_view method, const std::string& path_and_query,
                                            const std::string& body, std::string_view content_type) {
  auto h = Acquire();
  Backoff backoff(std::chrono::milliseconds(100), std::chrono::milliseconds(2000), 0.5);
  const int max_tries = std::max(1, config_.max_tries);
  absl::StatusOr<Response> r;
  for (int attempt = 1; attempt <= max_tries; ++attempt) {
    r = DoOnce(*h, method, path_and_query, body, content_type);
    bool retry = false;
    std::chrono::milliseconds wait = backoff.Next();
    const auto asked = r.ok() ? RetryAfter(r->retry_after, std::chrono::seconds(10)) : std::nullopt;
    if (!r.ok()) {
      retry = Idempotent(method) && !IsNoRetry(r.status());
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
  limiter_.Wait();
  ++requests_;
  auto h = Acquire();
  std::vector<std::string> headers;
  auto generation = SetCommon(*h, path, "GET", headers, false);
  if (!generation.ok()) {
    Release(std::move(h));
    return absl::Status(generation.status().code(), Cat("WATCH ", path, ": ", generation.status().message()));
  }
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
  // The server ends the watch after timeoutSeconds. A connection still open well after that has
  // died without a word (the peer vanished, a NAT or load balancer forgot it): client-go's
  // reflector randomises timeoutSeconds for the server; kgpu also gives up on its own side.
  const long grace_s = opts.timeout_seconds > 0 ? std::max<long>(30, opts.timeout_seconds / 10) : 0;
  if (opts.timeout_seconds > 0) {
    curl_easy_setopt(h->curl, CURLOPT_TIMEOUT_MS, (static_cast<long>(opts.timeout_seconds) + grace_s) * 1000L);
  }
  const CURLcode rc = curl_easy_perform(h->curl);
  curl_slist_free_all(list);
  if (ctx.status == 0) curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, &ctx.status);
  absl::Status transport;
  if (rc == CURLE_OPERATION_TIMEDOUT && opts.timeout_seconds > 0 && ctx.status != 0) {
    transport = absl::UnavailableError(Cat("WATCH ", path, ": the API server did not end the watch ", grace_s,
                                           " s after its timeoutSeconds=", opts.timeout_seconds,
                                           ": the connection is taken for dead"));
  } else if (rc != CURLE_OK) {
    transport = TransportError(*h, rc, "WATCH", path);
  }
  Release(std::move(h));
  if (ctx.status == 401 && *generation != 0) exec_->Invalidate(*generation);  // the next watch runs the plugin
  if (ctx.stopped_by_caller || stop.stop_requested()) return absl::OkStatus();
  if (!ctx.error.ok()) return ctx.error;
  if (!transport.ok()) return transport;
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
