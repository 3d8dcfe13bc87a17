#include "slurm/rest.h"

#include <algorithm>
#include <ctime>
#include <optional>

#include <curl/curl.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/strings.h"

namespace kgpu::slurm {
namespace {
using json = nlohmann::json;

// A string field, "" when absent or null; an error when it is another type.
absl::StatusOr<std::string> Str(const json& o, const char* key, std::string_view what) {
  if (!o.contains(key) || o[key].is_null()) return std::string();
  if (!o[key].is_string()) return absl::InvalidArgumentError(Cat(what, ": \"", key, "\" is not a string"));
  return o[key].get<std::string>();
}

// An integer field, or {"set","infinite","number"} (data_parser's *_NO_VAL): nullopt when absent,
// null, unset or infinite.
absl::StatusOr<std::optional<int64_t>> Int(const json& o, const char* key, std::string_view what) {
  if (!o.contains(key) || o[key].is_null()) return std::optional<int64_t>();
  const json& v = o[key];
  if (v.is_number_integer()) return std::optional<int64_t>(v.get<int64_t>());
  if (v.is_number_unsigned()) return std::optional<int64_t>(static_cast<int64_t>(v.get<uint64_t>()));
  if (v.is_object()) {
    auto flag = [&](const char* k) { return v.contains(k) && v[k].is_boolean() && v[k].get<bool>(); };
    if (flag("infinite") || !flag("set")) return std::optional<int64_t>();
    if (v.contains("number") && v["number"].is_number_integer())
      return std::optional<int64_t>(v["number"].get<int64_t>());
  }
  return absl::InvalidArgumentError(Cat(what, ": \"", key, "\" is not an integer"));
}

// A list field: an array of strings (v0.0.39's CSV_LIST, as "partitions") or one comma-separated
// string (its STRING, as "features"); empty when absent or null.
absl::StatusOr<std::vector<std::string>> StrList(const json& o, const char* key, std::string_view what) {
  std::vector<std::string> out;
  if (!o.contains(key) || o[key].is_null()) return out;
  const json& v = o[key];
  auto add = [&](const std::string& text) {
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = std::min(text.find(',', start), text.size());
      if (comma > start) out.push_back(text.substr(start, comma - start));
      start = comma + 1;
    }
  };
  if (v.is_string()) {
    if (v.get<std::string>() != "(null)") add(v.get<std::string>());
    return out;
  }
  if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_string()) return absl::InvalidArgumentError(Cat(what, ": \"", key, "\" is not a list of strings"));
      add(e.get<std::string>());
    }
    return out;
  }
  return absl::InvalidArgumentError(Cat(what, ": \"", key, "\" is not a list of strings"));
}

absl::StatusOr<json> Parse(std::string_view body, std::string_view what, const char* list) {
  json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError(Cat(what, ": the answer is not JSON"));
  if (!doc.is_object()) return absl::InvalidArgumentError(Cat(what, ": the answer is not a JSON object"));
  if (!doc.contains(list) || !doc[list].is_array()) {
    return absl::InvalidArgumentError(Cat(what, ": the answer has no \"", list, "\" array"));
  }
  return doc;
}

std::string ApiPath(std::string_view path) {
  return Cat("/slurm/", kRestApiVersion, "/", path);
}

}  // namespace

absl::StatusOr<std::vector<SlurmNode>> ParseRestNodes(std::string_view body) {
  auto doc = Parse(body, "slurmrestd nodes", "nodes");
  if (!doc.ok()) return doc.status();
  std::vector<SlurmNode> out;
  size_t i = 0;
  for (const json& n : (*doc)["nodes"]) {
    const std::string what = Cat("slurmrestd nodes: node ", i++);
    if (!n.is_object()) return absl::InvalidArgumentError(Cat(what, " is not an object"));
    SlurmNode s;
    auto name = Str(n, "name", what);
    if (!name.ok()) return name.status();
    if (name->empty()) return absl::InvalidArgumentError(Cat(what, " has no name"));
    s.name = *name;
    const std::string named = Cat("slurmrestd nodes: node ", Printable(s.name));
    if (!n.contains("state") || !n["state"].is_array() || n["state"].empty()) {
      return absl::InvalidArgumentError(Cat(named, ": \"state\" is not a non-empty array of strings"));
    }
    for (const json& f : n["state"]) {
      if (!f.is_string() || f.get<std::string>().empty()) {
        return absl::InvalidArgumentError(Cat(named, ": \"state\" is not a non-empty array of strings"));
      }
      const std::string flag = f.get<std::string>();
      if (s.base.empty()) {
        s.base = flag;
        s.state = flag;
      } else {
        s.flags.insert(flag);
        s.state += "+" + flag;
      }
    }
    auto reason = Str(n, "reason", named);
    auto user = Str(n, "reason_set_by_user", named);
    auto gres = Str(n, "gres", named);
    auto at = Int(n, "reason_changed_at", named);
    auto cpus = Int(n, "cpus", named);
    auto alloc = Int(n, "alloc_cpus", named);
    auto partitions = StrList(n, "partitions", named);
    auto features = StrList(n, "features", named);
    auto active = StrList(n, "active_features", named);
    for (const absl::Status& st : {reason.status(), user.status(), gres.status(), at.status(), cpus.status(),
                                   alloc.status(), partitions.status(), features.status(), active.status()}) {
      if (!st.ok()) return st;
    }
    s.partitions.insert(partitions->begin(), partitions->end());
    s.features.insert(features->begin(), features->end());
    s.features.insert(active->begin(), active->end());
    s.reason = *reason;
    s.reason_user = *user;
    s.gres = *gres;
    if (at->value_or(0) > 0) {
      const std::time_t t = static_cast<std::time_t>(**at);
      std::tm tm{};
      char buf[32];
      if (localtime_r(&t, &tm) != nullptr && std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm) > 0) {
        s.reason_time = buf;
      }
    }
    s.cpu_total = static_cast<int>(cpus->value_or(0));
    s.cpu_alloc = static_cast<int>(alloc->value_or(0));
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<std::vector<SlurmJob>> ParseRestJobs(std::string_view body) {
  auto doc = Parse(body, "slurmrestd jobs", "jobs");
  if (!doc.ok()) return doc.status();
  std::vector<SlurmJob> out;
  size_t i = 0;
  for (const json& j : (*doc)["jobs"]) {
    const std::string what = Cat("slurmrestd jobs: job ", i++);
    if (!j.is_object()) return absl::InvalidArgumentError(Cat(what, " is not an object"));
    auto id = Int(j, "job_id", what);
    if (!id.ok()) return id.status();
    if (!id->has_value() || **id <= 0) return absl::InvalidArgumentError(Cat(what, " has no job_id"));
    SlurmJob s;
    s.id = std::to_string(**id);
    const std::string named = Cat("slurmrestd jobs: job ", s.id);
    auto state = Str(j, "job_state", named);
    auto nodes = Str(j, "nodes", named);
    auto reason = Str(j, "state_reason", named);
    auto partition = Str(j, "partition", named);
    auto count = Int(j, "node_count", named);
    auto end = Int(j, "end_time", named);
    auto submit = Int(j, "submit_time", named);
    auto required = Str(j, "required_nodes", named);
    auto excluded = Str(j, "excluded_nodes", named);
    auto features = Str(j, "features", named);
    auto gres = Str(j, "tres_per_node", named);
    for (const absl::Status& st :
         {state.status(), nodes.status(), reason.status(), partition.status(), count.status(), end.status(),
          submit.status(), required.status(), excluded.status(), features.status(), gres.status()}) {
      if (!st.ok()) return st;
    }
    if (state->empty()) return absl::InvalidArgumentError(Cat(named, " has no job_state"));
    s.state = *state;
    if (!s.Pending() && !s.Holding()) continue;  // ended: squeue -t PD,R,CG,CF,S,ST leaves it out too
    if (!s.Pending() && !nodes->empty()) {
      auto hosts = ExpandHostlist(*nodes);
      if (!hosts.ok()) return absl::InvalidArgumentError(Cat(named, ": ", hosts.status().message()));
      s.nodes = std::move(*hosts);
    }
    s.node_count = static_cast<int>(count->value_or(static_cast<int64_t>(s.nodes.size())));
    s.reason = reason->empty() ? "None" : *reason;
    s.partition = *partition;
    for (const auto& [text, to] :
         {std::pair{&*required, &s.required_nodes}, std::pair{&*excluded, &s.excluded_nodes}}) {
      if (text->empty() || *text == "(null)") continue;
      auto hosts = ExpandHostlist(*text);
      if (!hosts.ok()) return absl::InvalidArgumentError(Cat(named, ": ", hosts.status().message()));
      *to = std::move(*hosts);
    }
    if (*features != "(null)") s.features = *features;
    if (*gres != "N/A" && *gres != "(null)") s.gres = *gres;
    if (end->value_or(0) > 0) s.end_time = **end;
    if (submit->value_or(0) > 0) s.submit_time = **submit;
    out.push_back(std::move(s));
  }
  return out;
}

std::string RestErrors(std::string_view body, bool* controller_down) {
  *controller_down = false;
  json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("errors") || !doc["errors"].is_array()) return "";
  std::vector<std::string> out;
  for (const json& e : doc["errors"]) {
    if (!e.is_object()) continue;
    auto text = [&](const char* k) {
      return e.contains(k) && e[k].is_string() ? e[k].get<std::string>() : std::string();
    };
    const std::string error = text("error"), description = text("description");
    const int64_t number =
        e.contains("error_number") && e["error_number"].is_number_integer() ? e["error_number"].get<int64_t>() : 0;
    // 1800-1803: SLURMCTLD_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR; the texts as
    // the CLI backend matches them in scontrol's stderr.
    for (const char* down : {"Unable to contact slurm controller", "Socket timed out", "Connection refused"}) {
      if (error.find(down) != std::string::npos || description.find(down) != std::string::npos) *controller_down = true;
    }
    if (number >= 1800 && number <= 1803) *controller_down = true;
    std::string one = error.empty() ? description : description.empty() ? error : Cat(error, " (", description, ")");
    if (number != 0) one = Cat(one, " [", number, "]");
    if (!one.empty()) out.push_back(Printable(one));
  }
  return Join(out, "; ");
}

absl::Status ValidateRestUrl(const std::string& url) {
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0 || url.rfind("unix:/", 0) == 0) {
    if (url.find_first_of(" \t\r\n") == std::string::npos) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(Cat("--slurm-rest-url '", Printable(url),
                                        "': not http://host:port, https://host:port or unix:/path/to/slurmrestd.sock"));
}

namespace {
// The most of an answer kept (a nodes list of a large cluster is a few MiB).
constexpr size_t kMaxAnswer = 64u << 20;

size_t KeepAnswer(char* p, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  if (out->size() + size * n > kMaxAnswer) return 0;  // CURLE_WRITE_ERROR
  out->append(p, size * n);
  return size * n;
}

bool HasControl(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}
}  // namespace

absl::StatusOr<std::string> RestSlurmClient::Call(const std::string& method, const std::string& path,
                                                  const std::string& body) {
  ++calls_;
  auto fail = [&](absl::Status s) {
    ++failures_;
    return s;
  };
  const std::string what = Cat("slurmrestd ", method, " ", ApiPath(path));
  if (auto v = ValidateRestUrl(options_.url); !v.ok()) return fail(v);
  std::string base = options_.url, socket;
  if (base.rfind("unix:", 0) == 0) {
    socket = base.substr(5);
    base = "http://localhost";
  }
  while (!base.empty() && base.back() == '/') base.pop_back();
  const std::string url = base + ApiPath(path);
  std::string token = options_.token;
  if (!options_.token_file.empty()) {
    auto t = ReadFile(options_.token_file);
    if (!t) return fail(absl::UnauthenticatedError(Cat(what, ": cannot read the token file ", options_.token_file)));
    token = *t;
  }
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (HasControl(token) || HasControl(options_.user)) {
    return fail(absl::InvalidArgumentError(Cat(what, ": the Slurm user name or token holds a control character")));
  }
  CURL* c = curl_easy_init();
  if (c == nullptr) {
    return fail(absl::FailedPreconditionError(Cat(what, ": ", curl_easy_strerror(CURLE_FAILED_INIT))));
  }
  std::string answer;
  curl_slist* headers = nullptr;
  bool headers_ok = true;
  auto add = [&](const std::string& h) {
    curl_slist* next = curl_slist_append(headers, h.c_str());
    if (next == nullptr)
      headers_ok = false;
    else
      headers = next;
  };
  add("Accept: application/json");
  if (!body.empty()) add("Content-Type: application/json");
  if (!options_.user.empty()) add(Cat("X-SLURM-USER-NAME: ", options_.user));
  if (!token.empty()) add(Cat("X-SLURM-USER-TOKEN: ", token));
  if (!headers_ok) {
    curl_slist_free_all(headers);
    curl_easy_cleanup(c);
    return fail(absl::ResourceExhaustedError(Cat(what, ": out of memory")));
  }
  const long timeout_ms = std::max<long>(1, static_cast<long>(options_.timeout.count()));
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  if (!socket.empty()) curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, socket.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (!body.empty()) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &KeepAnswer);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &answer);
  const CURLcode rc = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  switch (rc) {
    case CURLE_OK:
      break;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return fail(
          absl::InvalidArgumentError(Cat(what, ": --slurm-rest-url ", options_.url, ": ", curl_easy_strerror(rc))));
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CONNECT_ERROR:
      return fail(absl::FailedPreconditionError(Cat(what, ": TLS with ", options_.url, ": ", curl_easy_strerror(rc),
                                                    " (the system's CA bundle must trust slurmrestd's certificate)")));
    case CURLE_WRITE_ERROR:
      return fail(absl::ResourceExhaustedError(Cat(what, ": the answer is larger than ", kMaxAnswer >> 20, " MiB")));
    case CURLE_FAILED_INIT:
      return fail(absl::FailedPreconditionError(Cat(what, ": ", curl_easy_strerror(rc))));
    default:
      return fail(absl::UnavailableError(
          Cat(what, ": ", curl_easy_strerror(rc), " (is slurmrestd running at ", options_.url, "?)")));
  }
  bool controller_down = false;
  const std::string errors = RestErrors(answer, &controller_down);
  if (code == 200 && errors.empty()) return answer;
  std::string text = answer.size() > 300 ? answer.substr(0, 300) : answer;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const std::string detail = errors.empty() ? Printable(text) : errors;
  if (controller_down || code == 502 || code == 503 || code == 504) {
    return fail(
        absl::UnavailableError(Cat(what, ": ", code == 200 || code == 500 ? "" : Cat("HTTP ", code, " "), detail)));
  }
  if (code == 401) {
    return fail(absl::UnauthenticatedError(
        Cat(what, ": HTTP 401 ", detail,
            " (a JWT from `scontrol token` in --slurm-rest-token-file, and --slurm-rest-user)")));
  }
  if (code == 404) {
    return fail(absl::FailedPreconditionError(Cat(what, ": HTTP 404: this slurmrestd does not serve ", kRestApiVersion,
                                                  " (Slurm 23.02 or later, openapi/", kRestApiVersion,
                                                  " plugin); use the CLI backend (no --slurm-rest-url)")));
  }
  if (errors.find("Invalid node name") != std::string::npos) return fail(absl::NotFoundError(Cat(what, ": ", detail)));
  if (code == 200) return answer;  // errors beside an answer: the caller decides (an unknown node)
  return fail(absl::InternalError(Cat(what, ": HTTP ", code, ": ", detail)));
}

absl::StatusOr<std::vector<SlurmNode>> RestSlurmClient::Nodes() {
  auto body = Call("GET", "nodes");
  if (!body.ok()) return body.status();
  return ParseRestNodes(*body);
}

absl::StatusOr<SlurmNode> RestSlurmClient::Node(const std::string& name) {
  if (auto s = ValidateNodeName(name); !s.ok()) return s;
  auto body = Call("GET", Cat("node/", name));
  if (!body.ok()) return body.status();
  auto nodes = ParseRestNodes(*body);
  if (!nodes.ok()) return nodes.status();
  for (auto& n : *nodes) {
    if (n.name == name) return std::move(n);
  }
  bool down = false;
  const std::string errors = RestErrors(*body, &down);
  return absl::NotFoundError(Cat("slurmrestd: node ", name, ": Invalid node name specified",
                                 errors.empty() ? std::string() : Cat(" (", errors, ")")));
}

absl::StatusOr<std::vector<SlurmJob>> RestSlurmClient::Jobs() {
  auto body = Call("GET", "jobs");
  if (!body.ok()) return body.status();
  return ParseRestJobs(*body);
}

absl::StatusOr<std::vector<SlurmJob>> RestSlurmClient::JobsOnNode(const std::string& node) {
  if (auto s = ValidateNodeName(node); !s.ok()) return s;
  auto all = Jobs();
  if (!all.ok()) return all.status();
  std::vector<SlurmJob> out;
  for (auto& j : *all) {
    if (j.Holds(node)) out.push_back(std::move(j));
  }
  return out;
}

absl::Status RestSlurmClient::Update(const std::string& node, const std::string& state, const std::string& reason) {
  json body = {{"state", json::array({state})}};
  if (!reason.empty()) body["reason"] = reason;
  auto r = Call("POST", Cat("node/", node), body.dump());
  return r.status();
}

absl::StatusOr<SlurmNode> RestSlurmClient::Drain(const std::string& node, const std::string& reason,
                                                 const std::string& owned_prefix) {
  auto before = Node(node);
  if (!before.ok()) return before.status();
  if (auto s = NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
  if (!(before->Drain() && before->reason == reason)) {
    if (auto s = Update(node, "DRAIN", reason); !s.ok()) return s;
  }
  return Node(node);
}

absl::StatusOr<SlurmNode> RestSlurmClient::Undrain(const std::string& node, const std::string& owned_prefix) {
  auto before = Node(node);
  if (!before.ok()) return before.status();
  if (!before->Drain()) return before;
  if (auto s = NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
  // A failed UNDRAIN is judged by the re-read (slurmctld answers "Invalid node state specified"
  // when the drain went meanwhile), as the CLI backend does.
  if (auto s = Update(node, "UNDRAIN", "");
      !s.ok() && std::string(s.message()).find("Invalid node state specified") == std::string::npos) {
    return s;
  }
  return Node(node);
}

absl::StatusOr<SlurmNode> RestSlurmClient::PowerUp(const std::string& node, const std::string& owned_prefix) {
  auto before = Node(node);
  if (!before.ok()) return before.status();
  if (!before->PoweredDown() || before->PowerUpRequested()) return before;
  if (auto s = NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
  if (auto s = Update(node, "POWER_UP", ""); !s.ok()) return s;
  return Node(node);
}

}  // namespace kgpu::slurm
