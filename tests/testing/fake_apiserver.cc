#include "testing/fake_apiserver.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

#include <httplib.h>

#include "common/files.h"
#include "common/http_compress.h"
#include "common/http_listen.h"
#include "common/strings.h"
#include "k8s/patch.h"
#include "k8s/resources.h"
#include "k8s/selector.h"
#include "testing/fake_apiserver_admission.h"
#include "testing/fake_apiserver_defaults.h"
#include "testing/fake_apiserver_dra.h"
#include "testing/fake_apiserver_tables.h"
#include "testing/http_conn.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

std::string RKey(const k8s::Resource& r) {
  return Cat(r.group, "/", r.plural);
}

const k8s::Resource* ByKey(const std::string& rkey) {
  for (const auto& r : k8s::Resources()) {
    if (RKey(r) == rkey) return &r;
  }
  return nullptr;
}

std::string ObjKey(const std::string& ns, const std::string& name) {
  return ns.empty() ? name : Cat(ns, "/", name);
}

// A Kubernetes Status (apimachinery pkg/api/errors).
json Status(int code, const std::string& reason, const std::string& message, const json& details = nullptr) {
  json s = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
            {"status", "Failure"}, {"message", message}, {"reason", reason},
            {"code", code}};
  if (!details.is_null()) s["details"] = details;
  return s;
}

FakeApiServer::Result Err(int code, const std::string& reason, const std::string& message,
                          const json& details = nullptr) {
  return {code, Status(code, reason, message, details)};
}

std::string Qualified(const k8s::Resource& r) {
  return r.group.empty() ? std::string(r.plural) : Cat(r.plural, ".", r.group);
}

FakeApiServer::Result NotFound(const k8s::Resource& r, const std::string& name) {
  return Err(404, "NotFound", Cat(Qualified(r), " \"", name, "\" not found"),
             {{"name", name}, {"group", r.group}, {"kind", r.plural}});
}

FakeApiServer::Result Conflict(const k8s::Resource& r, const std::string& name) {
  return Err(409, "Conflict",
             Cat("Operation cannot be fulfilled on ", Qualified(r), " \"", name,
                 "\": the object has been modified; please apply your changes to the latest version and try again"),
             {{"name", name}, {"group", r.group}, {"kind", r.plural}});
}

// errors.NewInvalid(kind, name, errs): the message aggregates the distinct errors ("[a, b]" for
// several), the causes list every one.
FakeApiServer::Result InvalidFields(const k8s::Resource& r, const std::string& name,
                                    const std::vector<FieldError>& errs) {
  std::vector<std::string> distinct;
  json causes = json::array();
  for (const auto& e : errs) {
    if (std::find(distinct.begin(), distinct.end(), e.Error()) == distinct.end()) distinct.push_back(e.Error());
    causes.push_back({{"reason", e.type}, {"message", e.body}, {"field", e.field}});
  }
  const std::string what = distinct.size() == 1 ? distinct[0] : Cat("[", Join(distinct, ", "), "]");
  // errors.NewInvalid(GroupKind, ...): the kind qualified by its group ("PodDisruptionBudget.policy").
  const std::string kind = r.group.empty() ? std::string(r.kind) : Cat(r.kind, ".", r.group);
  return Err(422, "Invalid", Cat(kind, " \"", name, "\" is invalid: ", what),
             {{"name", name}, {"group", r.group}, {"kind", r.kind}, {"causes", causes}});
}

// One field error. kubectl prints `The <Kind> "<name>" is invalid: <field>: <body>` from the
// cause; without causes it prints only `The <Kind> "<name>" is invalid` (helpers.go checkErr).
FakeApiServer::Result Invalid(const k8s::Resource& r, const std::string& name, const FieldError& e) {
  return InvalidFields(r, name, {e});
}

FakeApiServer::Result Forbidden(const k8s::Resource& r, const std::string& name, const std::string& why) {
  return Err(403, "Forbidden", Cat(Qualified(r), " \"", name, "\" is forbidden: ", why),
             {{"name", name}, {"group", r.group}, {"kind", r.plural}});
}

std::string RandomSuffix(size_t n) {
  // The apiserver's alphabet for generateName (k8s.io/apimachinery/pkg/util/rand): no vowels.
  static constexpr char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  thread_local std::mt19937 rng{std::random_device{}()};
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(kAlphabet[rng() % (sizeof(kAlphabet) - 1)]);
  return s;
}

bool WantsTable(const httplib::Request& req) {
  const std::string accept = req.get_header_value("Accept");
  return accept.find("as=Table") != std::string::npos;
}

// The list's continue token: base64 of {"rv": N, "start": "<key>"} as the apiserver's etcd3 store.
std::string B64(const std::string& in) {
  static constexpr char kA[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  unsigned v = 0;
  int bits = -6;
  for (unsigned char c : in) {
    v = (v << 8) + c;
    bits += 8;
    while (bits >= 0) {
      out.push_back(kA[(v >> bits) & 0x3f]);
      bits -= 6;
    }
  }
  if (bits > -6) out.push_back(kA[((v << 8) >> (bits + 8)) & 0x3f]);
  while (out.size() % 4) out.push_back('=');
  return out;
}
std::string UnB64(const std::string& in) {
  static constexpr std::string_view kA = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  unsigned v = 0;
  int bits = -8;
  for (char c : in) {
    const size_t p = kA.find(c);
    if (p == std::string_view::npos) break;
    v = (v << 6) + static_cast<unsigned>(p);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((v >> bits) & 0xff));
      bits -= 8;
    }
  }
  return out;
}

// A list's or watch's fieldSelector as the apiserver takes it (handlers/get.go: the kind's field
// label conversion, then 400 BadRequest with the conversion's error).
absl::StatusOr<k8s::FieldSelector> ParseFieldSelector(const k8s::Resource& r, const std::string& text) {
  auto sel = k8s::FieldSelector::Parse(text);
  if (!sel.ok()) return sel.status();
  if (r.kind == "Pod") sel->Rename("spec.host", "spec.nodeName");
  if (auto why = UnsupportedFieldLabel(std::string(r.kind), sel->Fields())) return absl::InvalidArgumentError(*why);
  return sel;
}

bool HasStatusSubresource(const k8s::Resource& r) {
  return std::find(r.subresources.begin(), r.subresources.end(), "status") != r.subresources.end();
}

bool PodTerminal(const json& pod) {
  const std::string phase = pod.contains("status") ? pod["status"].value("phase", "") : "";
  return phase == "Succeeded" || phase == "Failed";
}

}  // namespace

// What a request is about, parsed from its path.
class FakeApiServer::Request {
 public:
  const k8s::Resource* resource = nullptr;
  std::string ns, name, sub;
  std::string user;
  std::string verb;
  bool legacy_bindings = false;  // POST /api/v1/namespaces/<ns>/bindings (pods/binding by body name)
};

namespace {
// The field manager of the write being served (handlers' managerOrUserAgent): ?fieldManager=,
// else the User-Agent up to its first '/'. Empty for the in-process Create/Update calls, which
// leave managedFields alone.
thread_local std::string t_field_manager;
}  // namespace

FakeApiServer::FakeApiServer(FakeApiServerOptions opts)
    : opts_(std::move(opts)),
      pods_rkey_(RKey(*k8s::FindResource("pods"))),
      tokens_(opts_.tokens),
      rbac_(opts_.rbac),
      anonymous_admin_(opts_.tokens.empty()) {
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    json obj = {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}};
    DoCreate(RKey(*k8s::FindResource("namespaces")), "", obj, "system:admin");
  }
}

FakeApiServer::~FakeApiServer() {
  Stop();
}

int FakeApiServer::Minor() const {
  // "v1.34.2" -> 34
  const std::string& v = opts_.git_version;
  const size_t dot = v.find('.');
  return dot == std::string::npos ? 0 : std::atoi(v.c_str() + dot + 1);
}

bool FakeApiServer::Serves(const k8s::Resource& r) const {
  return Minor() >= r.since_minor;
}

std::string FakeApiServer::url() const {
  return Cat(opts_.tls ? "https" : "http", "://", opts_.host, ":", port_);
}

std::string FakeApiServer::KubeconfigFor(const DeployIdentity& id) {
  const std::string token = Cat("sa-", std::hash<std::string>{}(id.user));
  {
    std::lock_guard lock(mu_);
    tokens_[token] = id.user;
    rbac_[id.user] = id.rules;
  }
  // system:serviceaccount:<namespace>:<name>
  const std::string prefix = "system:serviceaccount:";
  std::string ns = id.user.rfind(prefix, 0) == 0 ? id.user.substr(prefix.size()) : "default";
  ns = ns.substr(0, ns.find(':'));
  if (Get("namespaces", "", ns).code == 404) {
    Create("namespaces", "", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  }
  return Kubeconfig(token, ns);
}

absl::StatusOr<DeployIdentity> ReadDeployRbac(const std::string& path, const std::string& service_account) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (e.path().extension() == ".yaml" && e.path().filename() != "kustomization.yaml") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::vector<json> docs;
  for (const auto& f : files) {
    auto text = ReadFile(f);
    if (!text) return absl::NotFoundError(Cat(f, ": cannot read the file"));
    auto d = YamlDocumentsToJson(*text, f);
    if (!d.ok()) return d.status();
    for (auto& doc : *d) {
      if (doc.is_object()) docs.push_back(std::move(doc));
    }
  }
  // Bindings to a ServiceAccount: role (kind/name) -> the user.
  std::map<std::pair<std::string, std::string>, std::string> bound;
  std::set<std::string> users;
  for (const auto& d : docs) {
    const std::string kind = d.value("kind", "");
    if (kind != "RoleBinding" && kind != "ClusterRoleBinding") continue;
    for (const auto& sub : d.value("subjects", json::array())) {
      if (sub.value("kind", "") != "ServiceAccount") continue;
      if (!service_account.empty() && sub.value("name", "") != service_account) continue;
      const std::string user =
          Cat("system:serviceaccount:", sub.value("namespace", "kgpu-system"), ":", sub.value("name", ""));
      users.insert(user);
      bound[{d["roleRef"].value("kind", ""), d["roleRef"].value("name", "")}] = user;
    }
  }
  if (users.size() != 1) {
    return absl::InvalidArgumentError(
        Cat(path, ": ", users.size(), " ServiceAccounts are bound to roles here; name the one to use"));
  }
  DeployIdentity id;
  id.user = *users.begin();
  for (const auto& d : docs) {
    const std::string kind = d.value("kind", "");
    if (kind != "Role" && kind != "ClusterRole") continue;
    if (!bound.contains({kind, d["metadata"].value("name", "")})) continue;
    for (const auto& r : d.value("rules", json::array())) {
      RbacRule rule;
      for (const auto& v : r.value("verbs", json::array())) rule.verbs.insert(v.get<std::string>());
      for (const auto& v : r.value("resources", json::array())) rule.resources.insert(v.get<std::string>());
      for (const auto& v : r.value("apiGroups", json::array())) rule.groups.insert(v.get<std::string>());
      for (const auto& v : r.value("resourceNames", json::array())) rule.names.insert(v.get<std::string>());
      if (rule.groups.empty()) rule.groups.insert("<no group>");  // a rule without apiGroups matches none
      if (kind == "Role") rule.ns = d["metadata"].value("namespace", "kgpu-system");
      id.rules.push_back(std::move(rule));
    }
  }
  return id;
}

std::string FakeApiServer::Kubeconfig(const std::string& token, const std::string& ns) const {
  std::string cluster = Cat("    server: ", url(), "\n");
  if (opts_.tls) {
    cluster += Cat("    certificate-authority-data: ", B64(ca_pem_), "\n");
  }
  std::string user = token.empty() ? "  user: {}\n" : Cat("  user:\n    token: ", token, "\n");
  return Cat("apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n", cluster, "users:\n- name: fake\n",
             user, "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: ", ns, "\n",
             "current-context: fake\n");
}

absl::Status FakeApiServer::Start() {
  if (opts_.tls) {
    cert_file_ = opts_.tls_cert_file;
    key_file_ = opts_.tls_key_file;
    if (cert_file_.empty() || key_file_.empty()) {
      std::string cert, key;
      if (auto s = GenerateSelfSigned(cert, key); !s.ok()) return s;
      char tmpl[] = "/tmp/kgpu-fake-apiserver-XXXXXX";
      if (!mkdtemp(tmpl)) return absl::InternalError("mkdtemp failed");
      cert_dir_ = tmpl;
      cert_file_ = cert_dir_ + "/tls.crt";
      key_file_ = cert_dir_ + "/tls.key";
      std::FILE* f = std::fopen(cert_file_.c_str(), "w");
      std::fputs(cert.c_str(), f);
      std::fclose(f);
      f = std::fopen(key_file_.c_str(), "w");
      std::fputs(key.c_str(), f);
      std::fclose(f);
    }
    auto ca = ReadFile(cert_file_);
    if (!ca) return absl::NotFoundError(Cat("cannot read ", cert_file_));
    ca_pem_ = *ca;
    http_ = std::make_unique<httplib::SSLServer>(cert_file_.c_str(), key_file_.c_str());
    if (!http_->is_valid())
      return absl::InvalidArgumentError(Cat("TLS setup failed for ", cert_file_, " / ", key_file_));
  } else {
    http_ = std::make_unique<httplib::Server>();
  }
  const size_t max_threads = opts_.max_threads;
  http_->new_task_queue = [max_threads] { return new ElasticTaskQueue(8, max_threads); };
  // Short: Stop() joins the workers, and an idle keep-alive connection holds one until this ends.
  http_->set_keep_alive_timeout(2);
  // As kube-apiserver (Go sets TCP_NODELAY): without it, every response waits 40 ms for the
  // client's delayed ACK of its headers before the body goes out.
  http_->set_tcp_nodelay(true);
  http_->set_keep_alive_max_count(100000);
  http_->set_read_timeout(60, 0);
  http_->set_write_timeout(60, 0);
  http_->set_payload_max_length(64u << 20);
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Route(req, res); };
  http_->Get(".*", handler);
  http_->Post(".*", handler);
  http_->Put(".*", handler);
  http_->Patch(".*", handler);
  http_->Delete(".*", handler);
  // Exclusively, with the kernel's backlog as kube-apiserver (common/http_listen.h).
  const std::string host = opts_.host.find(':') != std::string::npos ? Cat("[", opts_.host, "]") : opts_.host;
  auto bound = BindListenAddress(*http_, "--listen", Cat(host, ":", opts_.port));
  if (!bound.ok()) return bound.status();
  port_ = *bound;
  server_thread_ = ListenOnThread(*http_);
  if (opts_.reap_terminating_pods) reaper_ = std::jthread([this](std::stop_token st) { ReapLoop(st); });
  return absl::OkStatus();
}

void FakeApiServer::Stop() {
  if (!http_) return;
  stopping_ = true;
  cv_.notify_all();
  if (reaper_.joinable()) {
    reaper_.request_stop();
    reaper_.join();
  }
  http_->stop();
  if (server_thread_.joinable()) server_thread_.join();
  http_.reset();
  if (!cert_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(cert_dir_, ec);
  }
}

int64_t FakeApiServer::ResourceVersion() const {
  std::lock_guard lock(mu_);
  return rv_;
}

std::vector<std::string> FakeApiServer::RequestLog() const {
  std::lock_guard lock(mu_);
  return {request_log_.begin(), request_log_.end()};
}

std::string FakeApiServer::LastUserAgent() const {
  std::lock_guard lock(mu_);
  return last_user_agent_;
}

void FakeApiServer::DropWatches() {
  std::lock_guard lock(mu_);
  ++drop_generation_;
  cv_.notify_all();
}

void FakeApiServer::FailNext(int n, int code, const std::string& path_substr, const std::string& verb) {
  std::lock_guard lock(mu_);
  faults_.push_back({n, code, path_substr, std::chrono::milliseconds(0), verb});
}

void FakeApiServer::ClearFaults() {
  std::lock_guard lock(mu_);
  faults_.clear();
}

void FakeApiServer::DelayNext(int n, std::chrono::milliseconds delay) {
  std::lock_guard lock(mu_);
  faults_.push_back({n, 0, "", delay, ""});
}

void FakeApiServer::Compact() {
  std::lock_guard lock(mu_);
  compacted_rv_ = rv_;
  history_.clear();
  cv_.notify_all();
}

void FakeApiServer::SetToken(const std::string& token, const std::string& user) {
  std::lock_guard lock(mu_);
  tokens_[token] = user;
}

void FakeApiServer::RemoveToken(const std::string& token) {
  std::lock_guard lock(mu_);
  tokens_.erase(token);
}

json* FakeApiServer::FindLocked(const std::string& rkey, const std::string& ns, const std::string& name) {
  auto r = objects_.find(rkey);
  if (r == objects_.end()) return nullptr;
  auto it = r->second.find(ObjKey(ns, name));
  return it == r->second.end() ? nullptr : &it->second;
}

void FakeApiServer::StoreLocked(const std::string& rkey, const std::string& type, json obj) {
  obj["metadata"]["resourceVersion"] = std::to_string(++rv_);
  const std::string key = ObjKey(obj["metadata"].value("namespace", ""), obj["metadata"].value("name", ""));
  if (rkey == pods_rkey_) {
    if (obj["metadata"].contains("deletionTimestamp")) {
      terminating_.insert(key);
    } else {
      terminating_.erase(key);
    }
  }
  history_.push_back({rv_, type, rkey, obj});
  while (history_.size() > opts_.history_window) {
    compacted_rv_ = history_.front().rv;
    history_.pop_front();
  }
  objects_[rkey][key] = std::move(obj);
  cv_.notify_all();
}

void FakeApiServer::RemoveLocked(const std::string& rkey, const std::string& ns, const std::string& name) {
  auto& m = objects_[rkey];
  auto it = m.find(ObjKey(ns, name));
  if (it == m.end()) return;
  if (rkey == pods_rkey_) terminating_.erase(it->first);
  json obj = std::move(it->second);
  m.erase(it);
  obj["metadata"]["resourceVersion"] = std::to_string(++rv_);
  history_.push_back({rv_, "DELETED", rkey, std::move(obj)});
  while (history_.size() > opts_.history_window) {
    compacted_rv_ = history_.front().rv;
    history_.pop_front();
  }
  cv_.notify_all();
}

void FakeApiServer::RecomputeQuotasLocked(const std::string& ns) {
  const std::string qkey = RKey(*k8s::FindResource("resourcequotas"));
  const bool any = std::any_of(objects_[qkey].begin(), objects_[qkey].end(),
                               [&](const auto& kv) { return kv.second["metadata"].value("namespace", "") == ns; });
  if (!any) return;  // the quota controller has nothing to do in a namespace without quotas
  std::vector<json> pods;
  for (const auto& [k, p] : objects_[RKey(*k8s::FindResource("pods"))]) {
    if (p["metadata"].value("namespace", "") == ns) pods.push_back(p);
  }
  std::vector<json> changed;
  for (auto& [k, q] : objects_[qkey]) {
    if (q["metadata"].value("namespace", "") != ns) continue;
    json used = QuotaUsed(q, pods);
    json hard = q.contains("spec") ? q["spec"].value("hard", json::object()) : json::object();
    if (!q.contains("status") || q["status"].value("used", json()) != used ||
        q["status"].value("hard", json()) != hard) {
      json copy = q;
      copy["status"]["hard"] = hard;
      copy["status"]["used"] = used;
      changed.push_back(std::move(copy));
    }
  }
  for (auto& q : changed) StoreLocked(qkey, "MODIFIED", std::move(q));
}

void FakeApiServer::RunControllersLocked(const std::string& ns) {
  RecomputeQuotasLocked(ns);
  RecomputeBudgetsLocked(ns);
}

json FakeApiServer::BudgetStatusLocked(const json& pdb) {
  // pkg/controller/disruption: expected = the selected pods not finished; healthy = those
  // Running and Ready and not being deleted; desired from minAvailable, or expected less
  // maxUnavailable (a percentage of expected, rounded up).
  const std::string ns = pdb["metadata"].value("namespace", "");
  const auto sel = k8s::BudgetSelector(pdb);
  int64_t expected = 0, healthy = 0;
  if (sel) {
    for (const auto& [k, p] : objects_[pods_rkey_]) {
      if (p["metadata"].value("namespace", "") != ns || !sel->Matches(p["metadata"].value("labels", json::object())))
        continue;
      if (PodTerminal(p)) continue;
      ++expected;
      bool ready = p.contains("status") && p["status"].value("phase", "") == "Running" &&
                   !p["metadata"].contains("deletionTimestamp");
      if (ready) {
        for (const auto& c : p["status"].value("conditions", json::array())) {
          if (c.value("type", "") == "Ready" && c.value("status", "") != "True") ready = false;
        }
      }
      if (ready) ++healthy;
    }
  }
  auto count = [&](const json& v) -> int64_t {
    if (v.is_number()) return v.get<int64_t>();
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (!s.empty() && s.back() == '%') {
        const int64_t pct = std::atoll(s.c_str());
        return (pct * expected + 99) / 100;  // rounded up, as GetScaledValueFromIntOrPercent
      }
      return std::atoll(s.c_str());
    }
    return 0;
  };
  int64_t desired = 0;
  const json spec = pdb.value("spec", json::object());
  if (spec.contains("minAvailable")) {
    desired = count(spec["minAvailable"]);
  } else if (spec.contains("maxUnavailable")) {
    desired = std::max<int64_t>(0, expected - count(spec["maxUnavailable"]));
  }
  json status = pdb.value("status", json::object());
  status["currentHealthy"] = healthy;
  status["desiredHealthy"] = desired;
  status["expectedPods"] = expected;
  status["disruptionsAllowed"] = std::max<int64_t>(0, healthy - desired);
  if (pdb["metadata"].contains("generation")) status["observedGeneration"] = pdb["metadata"]["generation"];
  return status;
}

void FakeApiServer::RecomputeBudgetsLocked(const std::string& ns) {
  const std::string bkey = RKey(*k8s::FindResource("poddisruptionbudgets"));
  std::vector<json> changed;
  for (const auto& [k, b] : objects_[bkey]) {
    if (b["metadata"].value("namespace", "") != ns) continue;
    json status = BudgetStatusLocked(b);
    if (b.value("status", json()) != status) {
      json copy = b;
      copy["status"] = std::move(status);
      changed.push_back(std::move(copy));
    }
  }
  for (auto& b : changed) StoreLocked(bkey, "MODIFIED", std::move(b));
}

FakeApiServer::Result FakeApiServer::DoCreate(const std::string& rkey, const std::string& ns, json obj,
                                              const std::string& /*user_name*/) {
  const k8s::Resource* r = ByKey(rkey);
  if (!r) return Err(404, "NotFound", "the server could not find the requested resource");
  if (!obj.is_object()) return Err(400, "BadRequest", "the body of the request must be a JSON object");
  if (!obj.contains("metadata") || !obj["metadata"].is_object()) obj["metadata"] = json::object();
  json& meta = obj["metadata"];
  obj["apiVersion"] = r->GroupVersion();
  obj["kind"] = r->kind;
  CanonicalQuantities(std::string(r->kind), obj);  // decoded into resource.Quantity, stored canonical
  std::lock_guard lock(mu_);
  if (r->namespaced) {
    const std::string body_ns = meta.value("namespace", "");
    if (!body_ns.empty() && !ns.empty() && body_ns != ns) {
      return Err(400, "BadRequest",
                 "the namespace of the provided object does not match the namespace sent on the request");
    }
    const std::string use_ns = ns.empty() ? (body_ns.empty() ? "default" : body_ns) : ns;
    meta["namespace"] = use_ns;
    // NamespaceLifecycle admission: the namespace must exist.
    if (!FindLocked(RKey(*k8s::FindResource("namespaces")), "", use_ns)) {
      return Err(404, "NotFound", Cat("namespaces \"", use_ns, "\" not found"),
                 {{"name", use_ns}, {"kind", "namespaces"}});
    }
  } else {
    meta.erase("namespace");
  }
  std::string name = meta.value("name", "");
  if (name.empty()) {
    const std::string gen = meta.value("generateName", "");
    if (gen.empty()) {
      return Invalid(*r, "",
                     {"FieldValueRequired", "metadata.name", "Required value: name or generateName is required"});
    }
    name = gen + RandomSuffix(5);
    meta["name"] = name;
  }
  const std::string this_ns = meta.value("namespace", "");
  if (FindLocked(rkey, this_ns, name)) {
    return Err(409, "AlreadyExists", Cat(Qualified(*r), " \"", name, "\" already exists"),
               {{"name", name}, {"group", r->group}, {"kind", r->plural}});
  }
  meta.erase("resourceVersion");
  meta["uid"] = Cat("00000000-0000-4000-8000-", [this] {
    char b[13];
    std::snprintf(b, sizeof b, "%012llx", static_cast<unsigned long long>(++uid_counter_));
    return std::string(b);
  }());
  meta["creationTimestamp"] = k8s::NowRfc3339();
  meta.erase("deletionTimestamp");
  if (r->kind == "Pod") {
    // Decoding applies the defaults; PrepareForCreate (pkg/registry/core/pod/strategy.go) resets
    // the status; the mutating admission plugins follow.
    DefaultPod(obj);
    obj["status"] = {{"phase", "Pending"}};
    std::vector<json> lrs, quotas;
    for (const auto& [k, v] : objects_[RKey(*k8s::FindResource("limitranges"))]) {
      if (v["metadata"].value("namespace", "") == this_ns) lrs.push_back(v);
    }
    for (const auto& [k, v] : objects_[RKey(*k8s::FindResource("resourcequotas"))]) {
      if (v["metadata"].value("namespace", "") == this_ns) quotas.push_back(v);
    }
    const AdmissionResult a = AdmitPod(obj, lrs, quotas);
    if (!a.allowed) {
      if (a.code == 422) return InvalidFields(*r, name, a.errors);
      return Forbidden(*r, name, a.message);
    }
    AdmitNewPod(obj);
  } else if (r->kind == "Node") {
    // A created Node keeps its status; allocatable defaults from capacity. TaintNodesByCondition
    // taints it not-ready until the lifecycle controller sees it Ready.
    if (obj.contains("status") && obj["status"].contains("capacity") && !obj["status"].contains("allocatable")) {
      obj["status"]["allocatable"] = obj["status"]["capacity"];
    }
    TaintNewNode(obj);
    SyncNodeTaints(obj);
  } else if (r->kind == "Namespace") {
    obj["spec"]["finalizers"] = obj.contains("spec") && obj["spec"].contains("finalizers")
                                    ? obj["spec"]["finalizers"]
                                    : json::array({"kubernetes"});
    obj["status"] = {{"phase", "Active"}};
    meta["labels"]["kubernetes.io/metadata.name"] = name;
  } else if (r->kind == "LimitRange") {
    DefaultLimitRange(obj);
  } else if (r->kind == "ResourceQuota") {
    if (auto errs = ValidateResourceQuota(obj); !errs.empty()) return InvalidFields(*r, name, errs);
    obj["status"] = json::object();
  } else if (r->kind == "PodDisruptionBudget") {
    obj["status"] = {{"disruptionsAllowed", 0}, {"currentHealthy", 0}, {"desiredHealthy", 0}, {"expectedPods", 0}};
  } else if (r->group == "resource.k8s.io") {
    if (r->kind == "ResourceClaim") obj.erase("status");  // PrepareForCreate: status is the subresource's
    if (auto errs = ValidateDra(std::string(r->kind), obj, nullptr, Minor(), false); !errs.empty()) {
      return InvalidFields(*r, name, errs);
    }
    SetDraGeneration(obj, nullptr);
  }
  if (!t_field_manager.empty()) UpdateManagedFields(nullptr, obj, t_field_manager, "", HasStatusSubresource(*r));
  StoreLocked(rkey, "ADDED", obj);
  if (r->kind == "Pod" || r->kind == "ResourceQuota" || r->kind == "PodDisruptionBudget") RunControllersLocked(this_ns);
  return {201, *FindLocked(rkey, this_ns, name)};
}

FakeApiServer::Result FakeApiServer::DoUpdate(const std::string& rkey, const std::string& ns, const std::string& name,
                                              json obj, const std::string& sub) {
  const k8s::Resource* r = ByKey(rkey);
  std::lock_guard lock(mu_);
  json* cur = FindLocked(rkey, ns, name);
  if (!cur) return NotFound(*r, name);
  if (!obj.is_object() || !obj.contains("metadata") || !obj["metadata"].is_object()) {
    return Err(400, "BadRequest", "the body of the request must be an object with metadata");
  }
  if (obj["metadata"].value("name", name) != name) {
    return Err(400, "BadRequest", "the name of the object does not match the name on the URL");
  }
  CanonicalQuantities(std::string(r->kind), obj);
  const std::string want_rv = obj["metadata"].value("resourceVersion", "");
  if (!want_rv.empty() && want_rv != (*cur)["metadata"].value("resourceVersion", "")) return Conflict(*r, name);
  json next = *cur;
  if (sub == "status") {
    next["status"] = obj.value("status", json::object());  // the status subresource writes status only
  } else {
    if (r->kind == "Pod" && obj.contains("spec")) {
      // The body is decoded with defaults; what admission set at create (priority, service
      // account) is carried over when the body leaves it out, as the stored object has it.
      DefaultPod(obj);
      for (const char* f : {"priority", "preemptionPolicy", "serviceAccountName", "serviceAccount"}) {
        if (!obj["spec"].contains(f) && (*cur)["spec"].contains(f)) obj["spec"][f] = (*cur)["spec"][f];
      }
      // Pod spec is immutable but for a few fields (ValidatePodUpdate).
      json a = (*cur)["spec"], b = obj["spec"];
      for (json* s : {&a, &b}) {
        for (const char* f : {"activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"}) s->erase(f);
        for (const char* list : {"containers", "initContainers"}) {
          if (s->contains(list)) {
            for (auto& c : (*s)[list]) c.erase("image");
          }
        }
      }
      // ValidateContainerUpdates refuses a changed number of containers first, on its own.
      if (a.value("containers", json::array()).size() != b.value("containers", json::array()).size()) {
        return Invalid(
            *r, name,
            {"FieldValueForbidden", "spec.containers", "Forbidden: pod updates may not add or remove containers"});
      }
      if (a != b) {
        // ValidatePodUpdate (pkg/apis/core/validation/validation.go, 1.32) also appends a go-cmp
        // diff of the specs after a newline, whose spacing go-cmp varies on purpose; left out.
        return Invalid(*r, name,
                       {"FieldValueForbidden", "spec",
                        "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                        "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
                        "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set "
                        "to 1 if it was previously negative)"});
      }
    }
    json keep_status = cur->value("status", json());
    next = obj;
    // The main resource does not write status for kinds with a status subresource.
    if (HasStatusSubresource(*r)) {
      if (keep_status.is_null()) {
        next.erase("status");
      } else {
        next["status"] = keep_status;
      }
    }
    next["apiVersion"] = r->GroupVersion();
    next["kind"] = r->kind;
    for (const char* f : {"uid", "creationTimestamp", "namespace", "deletionTimestamp", "deletionGracePeriodSeconds"}) {
      if ((*cur)["metadata"].contains(f)) {
        next["metadata"][f] = (*cur)["metadata"][f];
      } else {
        next["metadata"].erase(f);
      }
    }
    next["metadata"]["name"] = name;
    // managedFields are the server's record; a body's copy (read, modified, written back) is
    // not taken as a new one.
    if ((*cur)["metadata"].contains("managedFields")) {
      next["metadata"]["managedFields"] = (*cur)["metadata"]["managedFields"];
    } else {
      next["metadata"].erase("managedFields");
    }
    if (r->kind == "LimitRange") DefaultLimitRange(next);
    if (r->kind == "ResourceQuota") {
      if (auto errs = ValidateResourceQuota(next, cur); !errs.empty()) return InvalidFields(*r, name, errs);
    }
  }
  if (r->group == "resource.k8s.io") {
    if (auto errs = ValidateDra(std::string(r->kind), next, cur, Minor(), sub == "status"); !errs.empty()) {
      return InvalidFields(*r, name, errs);
    }
    SetDraGeneration(next, cur);
  }
  if (r->kind == "Node") SyncNodeTaints(next);  // the node lifecycle controller's NoSchedule pass
  if (!t_field_manager.empty()) UpdateManagedFields(cur, next, t_field_manager, sub, HasStatusSubresource(*r));
  if (next == *cur) return {200, *cur};  // a no-op write does not bump the resourceVersion
  StoreLocked(rkey, "MODIFIED", next);
  if (r->kind == "Pod" || r->kind == "ResourceQuota" || r->kind == "PodDisruptionBudget") RunControllersLocked(ns);
  return {200, *FindLocked(rkey, ns, name)};
}

std::optional<FakeApiServer::Result> FakeApiServer::CheckFields(const k8s::Resource& r, json& obj, FieldValidation fv,
                                                                std::vector<std::string>* warnings) const {
  if (!obj.is_object()) return std::nullopt;
  const json original = fv == FieldValidation::kStrict ? obj : json();
  const auto extra = opts_.extra_fields.find(std::string(r.kind));
  const auto unknown = PruneUnknownFields(std::string(r.group), std::string(r.kind), obj,
                                          extra == opts_.extra_fields.end() ? std::set<std::string>{} : extra->second);
  if (unknown.empty() || fv == FieldValidation::kIgnore) return std::nullopt;
  if (fv == FieldValidation::kWarn) {
    for (const auto& u : unknown) warnings->push_back(Cat("unknown field ", json(u).dump()));
    return std::nullopt;
  }
  // transformDecodeError: the body's own kind and version when it names them, else the path's.
  const std::string body_kind = original.value("kind", std::string(r.kind));
  std::string version = original.value("apiVersion", r.GroupVersion());
  if (const auto slash = version.rfind('/'); slash != std::string::npos) version = version.substr(slash + 1);
  return Err(400, "BadRequest",
             Cat(body_kind, " in version ", json(version).dump(), " cannot be handled as a ", r.kind, ": ",
                 StrictDecodingError(unknown)));
}

FakeApiServer::Result FakeApiServer::DoPatch(const std::string& rkey, const std::string& ns, const std::string& name,
                                             const json& patch, const std::string& content_type, const std::string& sub,
                                             FieldValidation fv, std::vector<std::string>* warnings) {
  const k8s::Resource* r = ByKey(rkey);
  // A patch carrying metadata.resourceVersion is an optimistic lock; otherwise the apiserver
  // applies it to the current object and retries internally when a writer races it.
  const bool locked = patch.is_object() && patch.contains("metadata") && patch["metadata"].is_object() &&
                      patch["metadata"].contains("resourceVersion");
  for (int attempt = 0; attempt < 5; ++attempt) {
    json cur;
    {
      std::lock_guard lock(mu_);
      json* p = FindLocked(rkey, ns, name);
      if (!p) return NotFound(*r, name);
      cur = *p;
    }
    auto next = k8s::ApplyPatch(cur, patch, content_type, r->kind);
    if (!next.ok()) {
      const bool known = content_type.find("patch+json") != std::string::npos;
      if (!known) return Err(415, "UnsupportedMediaType", std::string(next.status().message()));
      return Invalid(*r, name, {"FieldValueInvalid", "patch", std::string(next.status().message())});
    }
    if (!locked) (*next)["metadata"]["resourceVersion"] = cur["metadata"].value("resourceVersion", "");
    // The patched object is decoded into the Go type: unknown fields are dropped, warned about,
    // or (Strict) refused as errors.NewInvalid(GroupKind{}, "", patch: Invalid value: ...).
    {
      const json patched = *next;
      const auto extra = opts_.extra_fields.find(std::string(r->kind));
      const auto unknown =
          PruneUnknownFields(std::string(r->group), std::string(r->kind), *next,
                             extra == opts_.extra_fields.end() ? std::set<std::string>{} : extra->second);
      if (!unknown.empty() && fv == FieldValidation::kStrict) {
        const bool strategic = content_type.find("strategic-merge-patch") != std::string::npos;
        const std::string value = strategic ? GoValue(patch) : patched.dump();
        const std::string detail = StrictDecodingError(unknown);
        return Err(422, "Invalid", Cat(" \"\" is invalid: patch: Invalid value: ", json(value).dump(), ": ", detail),
                   {{"name", ""},
                    {"group", ""},
                    {"kind", ""},
                    {"causes",
                     {{{"reason", "FieldValueInvalid"},
                       {"field", "patch"},
                       {"message", Cat("Invalid value: ", json(value).dump(), ": ", detail)}}}}});
      }
      if (!unknown.empty() && fv == FieldValidation::kWarn && warnings != nullptr) {
        for (const auto& u : unknown) warnings->push_back(Cat("unknown field ", json(u).dump()));
      }
    }
    Result res;
    if (sub == "status") {
      json only_status = cur;
      only_status["status"] = next->value("status", json::object());
      only_status["metadata"]["resourceVersion"] = (*next)["metadata"]["resourceVersion"];
      res = DoUpdate(rkey, ns, name, only_status, "status");
    } else {
      res = DoUpdate(rkey, ns, name, *next, "");  // status is kept: the main resource does not write it
    }
    if (res.code != 409 || locked || res.body.value("reason", "") != "Conflict") return res;
  }
  return Conflict(*r, name);
}

FakeApiServer::Result FakeApiServer::DoDelete(const std::string& rkey, const std::string& ns, const std::string& name,
                                              const json& opts) {
  const k8s::Resource* r = ByKey(rkey);
  std::lock_guard lock(mu_);
  json* cur = FindLocked(rkey, ns, name);
  if (!cur) return NotFound(*r, name);
  if (opts.is_object() && opts.contains("preconditions")) {
    const json& pre = opts["preconditions"];
    const std::string uid = pre.value("uid", "");
    const std::string rv = pre.value("resourceVersion", "");
    if (!uid.empty() && uid != (*cur)["metadata"].value("uid", "")) {
      return Err(409, "Conflict",
                 Cat("Operation cannot be fulfilled on ", Qualified(*r), " \"", name,
                     "\": Precondition failed: UID in precondition: ", uid,
                     ", UID in object meta: ", (*cur)["metadata"].value("uid", "")));
    }
    if (!rv.empty() && rv != (*cur)["metadata"].value("resourceVersion", "")) {
      return Err(409, "Conflict",
                 Cat("Operation cannot be fulfilled on ", Qualified(*r), " \"", name,
                     "\": Precondition failed: ResourceVersion in precondition: ", rv,
                     ", ResourceVersion in object meta: ", (*cur)["metadata"].value("resourceVersion", "")));
    }
  }
  if (r->kind == "Pod") {
    // Graceful deletion (pkg/registry/core/pod/strategy.go CheckGracefulDelete): a pod bound to
    // a node and not terminal gets deletionTimestamp + grace period; an unscheduled or terminal
    // pod, or grace 0, goes at once.
    int64_t grace = (*cur)["spec"].value("terminationGracePeriodSeconds", 30);
    if (opts.is_object() && opts.contains("gracePeriodSeconds") && opts["gracePeriodSeconds"].is_number()) {
      grace = opts["gracePeriodSeconds"].get<int64_t>();
    }
    const bool bound = !(*cur)["spec"].value("nodeName", "").empty();
    if (bound && !PodTerminal(*cur) && grace > 0) {
      if ((*cur)["metadata"].contains("deletionTimestamp")) {
        const int64_t old = (*cur)["metadata"].value("deletionGracePeriodSeconds", grace);
        if (grace >= old) return {200, *cur};  // only a shorter grace period changes anything
      }
      json next = *cur;
      const std::time_t at = std::time(nullptr) + grace;
      std::tm tm{};
      gmtime_r(&at, &tm);
      char buf[32];
      std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
      next["metadata"]["deletionTimestamp"] = buf;
      next["metadata"]["deletionGracePeriodSeconds"] = grace;
      StoreLocked(rkey, "MODIFIED", next);
      return {200, *FindLocked(rkey, ns, name)};
    }
  }
  json gone = *cur;
  RemoveLocked(rkey, ns, name);
  if (r->kind == "Namespace") {
    // The namespace controller empties the namespace; here it happens at once.
    for (auto& [k, m] : objects_) {
      std::vector<std::pair<std::string, std::string>> victims;
      for (const auto& [key, o] : m) {
        if (o["metadata"].value("namespace", "") == name) victims.emplace_back(name, o["metadata"].value("name", ""));
      }
      for (const auto& [vns, vname] : victims) RemoveLocked(k, vns, vname);
    }
  }
  if (r->kind == "Pod") RunControllersLocked(ns);
  // The apiserver answers a completed delete of most kinds with a Success Status... but pods
  // and most core kinds return the object; kubectl handles both.
  return {200, gone};
}

FakeApiServer::Result FakeApiServer::DoBinding(const std::string& ns, const std::string& name, const json& binding) {
  const k8s::Resource* pods = k8s::FindResource("pods");
  const std::string node = binding.contains("target") ? binding["target"].value("name", "") : "";
  std::lock_guard lock(mu_);
  json* cur = FindLocked(RKey(*pods), ns, name);
  if (!cur) return NotFound(*pods, name);
  if (node.empty()) return Invalid(*pods, name, {"FieldValueRequired", "target.name", "Required value"});
  // The Binding's metadata.uid and resourceVersion are storage preconditions, checked before
  // anything else (a failed one is a Conflict on "pods").
  const json bmeta = binding.value("metadata", json::object());
  for (const char* field : {"uid", "resourceVersion"}) {
    const std::string want = bmeta.contains(field) && bmeta[field].is_string() ? bmeta[field].get<std::string>() : "";
    const std::string have = (*cur)["metadata"].value(field, "");
    if (!want.empty() && want != have) {
      return Err(409, "Conflict",
                 Cat("Operation cannot be fulfilled on pods \"", name, "\": Precondition failed: ",
                     std::string(field) == "uid" ? "UID" : "ResourceVersion", " in precondition: ", want, ", ",
                     std::string(field) == "uid" ? "UID" : "ResourceVersion", " in object meta: ", have),
                 {{"name", name}, {"kind", "pods"}});
    }
  }
  // pkg/registry/core/pod/storage assignPod: an already-bound pod is a conflict.
  const std::string bound = (*cur)["spec"].value("nodeName", "");
  if (!bound.empty()) {
    return Err(409, "Conflict",
               Cat("Operation cannot be fulfilled on pods/binding \"", name, "\": pod ", name,
                   " is already assigned to node \"", bound, "\""),
               {{"name", name}, {"kind", "pods/binding"}});
  }
  if ((*cur)["metadata"].contains("deletionTimestamp")) {
    return Err(409, "Conflict",
               Cat("Operation cannot be fulfilled on pods/binding \"", name, "\": pod ", name,
                   " is being deleted, cannot be assigned to a host"));
  }
  json next = *cur;
  next["spec"]["nodeName"] = node;
  // setPodHostAndAnnotations: the Binding's annotations are merged into the pod's, in the same
  // write as spec.nodeName.
  if (auto ann = bmeta.find("annotations"); ann != bmeta.end() && ann->is_object()) {
    for (auto a = ann->begin(); a != ann->end(); ++a) {
      if (a->is_string()) next["metadata"]["annotations"][a.key()] = *a;
    }
  }
  json cond = {{"type", "PodScheduled"}, {"status", "True"}, {"lastTransitionTime", k8s::NowRfc3339()}};
  json conds = json::array();
  for (const auto& c : next["status"].value("conditions", json::array())) {
    if (c.value("type", "") != "PodScheduled") conds.push_back(c);
  }
  conds.push_back(cond);
  next["status"]["conditions"] = conds;
  StoreLocked(RKey(*pods), "MODIFIED", next);
  return {
      201,
      {{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", json::object()}, {"status", "Success"}, {"code", 201}}};
}

FakeApiServer::Result FakeApiServer::DoEviction(const std::string& ns, const std::string& name, const json& eviction,
                                                bool dry_run) {
  const k8s::Resource* pods = k8s::FindResource("pods");
  const std::string pdb_key = RKey(*k8s::FindResource("poddisruptionbudgets"));
  // The Eviction's deleteOptions (preconditions, grace period) go to the pod's deletion.
  json delete_opts = eviction.is_object() && eviction.contains("deleteOptions") && eviction["deleteOptions"].is_object()
                         ? eviction["deleteOptions"]
                         : json::object();
  {
    std::lock_guard lock(mu_);
    json* pod = FindLocked(RKey(*pods), ns, name);
    if (!pod) return NotFound(*pods, name);
    // pkg/registry/core/pod/storage/eviction.go: terminal pods, pods being deleted and pods
    // that are not running (Pending) are evicted without consulting PodDisruptionBudgets.
    const std::string phase = (*pod)["status"].value("phase", "Pending");
    const bool ignore_pdb = PodTerminal(*pod) || phase == "Pending" || (*pod)["metadata"].contains("deletionTimestamp");
    if (!ignore_pdb) {
      std::vector<std::string> matching;
      for (const auto& [k, pdb] : objects_[pdb_key]) {
        if (pdb["metadata"].value("namespace", "") != ns) continue;
        auto sel = k8s::BudgetSelector(pdb);
        if (sel && sel->Matches((*pod)["metadata"].value("labels", json::object()))) matching.push_back(k);
      }
      if (matching.size() > 1) {
        return Err(500, "InternalError",
                   "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.");
      }
      if (matching.size() == 1) {
        json pdb = objects_[pdb_key][matching[0]];
        // The disruption controller keeps the budget's status current (RunControllersLocked);
        // it is read fresh here, as if the controller had just run.
        pdb["status"] = BudgetStatusLocked(pdb);
        const int64_t allowed = pdb["status"].value("disruptionsAllowed", int64_t{0});
        const int64_t desired = pdb["status"].value("desiredHealthy", int64_t{0});
        const int64_t healthy = pdb["status"].value("currentHealthy", int64_t{0});
        const std::string pdb_name = pdb["metadata"].value("name", "");
        if (allowed <= 0) {
          if (!dry_run && pdb != objects_[pdb_key][matching[0]]) StoreLocked(pdb_key, "MODIFIED", pdb);
          return Err(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                     {{"causes",
                       {{{"reason", "DisruptionBudget"},
                         {"message", Cat("The disruption budget ", pdb_name, " needs ", desired,
                                         " healthy pods and has ", healthy, " currently")}}}}});
        }
        pdb["status"]["disruptionsAllowed"] = allowed - 1;
        if (!dry_run) StoreLocked(pdb_key, "MODIFIED", pdb);
      }
    }
  }
  // eviction.go: a dry run stops after the budget's check (the deletion would be a dry run too).
  if (dry_run) {
    return {
        201,
        {{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", json::object()}, {"status", "Success"}, {"code", 201}}};
  }
  // addConditionAndDeletePod (eviction.go): the pod first gets the DisruptionTarget condition,
  // then is deleted under the preconditions asked for, checked against the pod as it was.
  {
    std::lock_guard lock(mu_);
    json* pod = FindLocked(RKey(*pods), ns, name);
    if (!pod) return NotFound(*pods, name);
    const json pre = delete_opts.value("preconditions", json::object());
    const std::string want_rv = pre.value("resourceVersion", "");
    const std::string want_uid = pre.value("uid", "");
    const bool pre_ok = (want_rv.empty() || want_rv == (*pod)["metadata"].value("resourceVersion", "")) &&
                        (want_uid.empty() || want_uid == (*pod)["metadata"].value("uid", ""));
    if (pre_ok && !PodTerminal(*pod)) {
      json next = *pod;
      json conds = json::array();
      for (const auto& c : next["status"].value("conditions", json::array())) {
        if (c.value("type", "") != "DisruptionTarget") conds.push_back(c);
      }
      conds.push_back({{"type", "DisruptionTarget"},
                       {"status", "True"},
                       {"lastTransitionTime", k8s::NowRfc3339()},
                       {"reason", "EvictionByEvictionAPI"},
                       {"message", "Eviction API: evicting"}});
      next["status"]["conditions"] = conds;
      StoreLocked(RKey(*pods), "MODIFIED", next);
      if (!want_rv.empty()) delete_opts["preconditions"]["resourceVersion"] = next["metadata"]["resourceVersion"];
    }
  }
  auto del = DoDelete(RKey(*pods), ns, name, delete_opts);
  if (del.code >= 300) return del;
  return {
      201,
      {{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", json::object()}, {"status", "Success"}, {"code", 201}}};
}

void FakeApiServer::ReapLoop(std::stop_token stop) {
  const std::string pkey = RKey(*k8s::FindResource("pods"));
  while (!stop.stop_requested()) {
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop.stop_requested() || stopping_.load(); });
      if (stop.stop_requested() || stopping_) return;
      const double now = static_cast<double>(std::time(nullptr));
      std::vector<std::pair<std::string, std::string>> due;
      auto& pods = objects_[pkey];
      for (const auto& key : terminating_) {  // not every pod: a scan of 10,000 pods 10 times a second held the lock
        const auto it = pods.find(key);
        if (it == pods.end()) continue;
        const json& p = it->second;
        auto t = k8s::ParseRfc3339(p["metadata"].value("deletionTimestamp", ""));
        if (t && *t <= now) due.emplace_back(p["metadata"].value("namespace", ""), p["metadata"].value("name", ""));
      }
      for (const auto& [ns, name] : due) {
        RemoveLocked(pkey, ns, name);
        RunControllersLocked(ns);
      }
    }
  }
}

FakeApiServer::Result FakeApiServer::List(const std::string& rkey, const std::string& ns, const httplib::Request& req) {
  const k8s::Resource* r = ByKey(rkey);
  auto ls = k8s::LabelSelector::Parse(req.get_param_value("labelSelector"));
  if (!ls.ok()) return Err(400, "BadRequest", std::string(ls.status().message()));
  auto fsel = ParseFieldSelector(*r, req.get_param_value("fieldSelector"));
  if (!fsel.ok()) return Err(400, "BadRequest", std::string(fsel.status().message()));
  const int64_t limit = req.has_param("limit") ? std::atoll(req.get_param_value("limit").c_str()) : 0;
  std::string start;
  int64_t list_rv = 0;
  std::lock_guard lock(mu_);
  if (req.has_param("continue") && !req.get_param_value("continue").empty()) {
    auto tok = json::parse(UnB64(req.get_param_value("continue")), nullptr, false);
    if (tok.is_discarded() || !tok.contains("rv") || !tok.contains("start")) {
      return Err(400, "BadRequest", "continue key is not valid: invalid continue token");
    }
    list_rv = tok["rv"].get<int64_t>();
    start = tok["start"].get<std::string>();
    if (list_rv < compacted_rv_) {
      return Err(410, "Expired",
                 "The provided continue parameter is too old to display a consistent list result. You can start a new "
                 "list without the continue parameter.");
    }
  } else {
    list_rv = rv_;
  }
  json items = json::array();
  std::string next_start;
  // kube-apiserver counts the items after a page (metadata.remainingItemCount) when the list has
  // no label or field selector (etcd counts the keys left in the range); with one it cannot.
  const bool selected = !req.get_param_value("labelSelector").empty() || !req.get_param_value("fieldSelector").empty();
  int64_t remaining = 0;
  for (auto it = objects_[rkey].lower_bound(start); it != objects_[rkey].end(); ++it) {
    const json& o = it->second;
    if (!ns.empty() && o["metadata"].value("namespace", "") != ns) continue;
    if (!ls->Matches(o["metadata"].value("labels", json::object())) ||
        !fsel->Matches(SelectableView(std::string(r->kind), o)))
      continue;
    if (limit > 0 && static_cast<int64_t>(items.size()) >= limit) {
      if (next_start.empty()) next_start = it->first;
      if (selected) break;
      ++remaining;
      continue;
    }
    items.push_back(o);
  }
  json list = {{"kind", Cat(r->kind, "List")},
               {"apiVersion", r->GroupVersion()},
               {"metadata", {{"resourceVersion", std::to_string(list_rv)}}},
               {"items", items}};
  if (!next_start.empty()) {
    list["metadata"]["continue"] = B64(json({{"v", "meta.k8s.io/v1"}, {"rv", list_rv}, {"start", next_start}}).dump());
    if (!selected) list["metadata"]["remainingItemCount"] = remaining;
  }
  if (WantsTable(req)) {
    std::vector<json> v(items.begin(), items.end());
    json t = TableOf(std::string(r->kind), v, std::to_string(list_rv));
    if (list["metadata"].contains("continue")) t["metadata"]["continue"] = list["metadata"]["continue"];
    return {200, t};
  }
  return {200, list};
}

void FakeApiServer::ServeWatch(Request& r, const httplib::Request& req, httplib::Response& res) {
  auto ls = k8s::LabelSelector::Parse(req.get_param_value("labelSelector"));
  auto fsel = ParseFieldSelector(*r.resource, req.get_param_value("fieldSelector"));
  if (!ls.ok() || !fsel.ok()) {
    res.status = 400;
    res.set_content(Status(400, "BadRequest", std::string((!ls.ok() ? ls.status() : fsel.status()).message())).dump(),
                    "application/json");
    return;
  }
  struct State {
    std::string rkey, ns, kind, api_version;
    k8s::LabelSelector ls;
    k8s::FieldSelector fs;
    int64_t cursor = 0;
    uint64_t gen = 0;
    bool bookmarks = false, table = false, gone = false;
    std::vector<std::string> pending;  // encoded events not yet written
    std::chrono::steady_clock::time_point deadline, next_bookmark;
    int fd = -1;
  };
  auto st = std::make_shared<State>();
  st->rkey = RKey(*r.resource);
  st->ns = r.ns;
  st->kind = std::string(r.resource->kind);
  st->api_version = r.resource->GroupVersion();
  st->ls = *ls;
  st->fs = *fsel;
  st->bookmarks = req.get_param_value("allowWatchBookmarks") == "true";
  st->table = WantsTable(req);
  // As kube-apiserver's watch handler (apiserver/pkg/endpoints/handlers/get.go): the client's
  // timeoutSeconds, or else a random time in [min-request-timeout, 2 × min-request-timeout).
  const int asked = req.has_param("timeoutSeconds") ? std::atoi(req.get_param_value("timeoutSeconds").c_str()) : 0;
  std::chrono::milliseconds timeout{std::chrono::seconds(asked)};
  if (asked <= 0) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    const auto min = std::chrono::duration_cast<std::chrono::milliseconds>(opts_.min_request_timeout);
    timeout = min + std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(0, min.count())(rng));
  }
  st->deadline = std::chrono::steady_clock::now() + timeout;
  // The client's connection: a client that goes away ends its watch at the next tick.
  st->fd = ConnectionFd(req.local_port, req.remote_addr, req.remote_port);
  st->next_bookmark = std::chrono::steady_clock::now() + opts_.bookmark_interval;
  auto encode = [st](const std::string& type, const json& obj) {
    json o = obj;
    if (st->table && type != "ERROR" && type != "BOOKMARK")
      o = TableOf(st->kind, {obj}, obj["metadata"].value("resourceVersion", ""));
    return json({{"type", type}, {"object", o}}).dump() + "\n";
  };
  const std::string rv_param = req.get_param_value("resourceVersion");
  {
    std::lock_guard lock(mu_);
    st->gen = drop_generation_;
    if (rv_param.empty() || rv_param == "0") {
      // No version: the current state as ADDED events, then changes.
      for (const auto& [k, o] : objects_[st->rkey]) {
        if (!st->ns.empty() && o["metadata"].value("namespace", "") != st->ns) continue;
        if (st->ls.Matches(o["metadata"].value("labels", json::object())) &&
            st->fs.Matches(SelectableView(st->kind, o))) {
          st->pending.push_back(encode("ADDED", o));
        }
      }
      st->cursor = rv_;
    } else {
      st->cursor = std::atoll(rv_param.c_str());
      if (st->cursor < compacted_rv_) {
        // The watch cache answers a compacted version with 200 and an ERROR event (410 Expired).
        st->pending.push_back(encode(
            "ERROR",
            Status(410, "Expired", Cat("too old resource version: ", st->cursor, " (", compacted_rv_ + 1, ")"))));
        st->gone = true;
      }
    }
  }
  ++watches_started_;
  ++open_watches_;
  res.set_header("Cache-Control", "no-cache, private");
  res.set_chunked_content_provider(
      st->table ? "application/json;as=Table;v=v1;g=meta.k8s.io" : "application/json",
      [this, st, encode](size_t, httplib::DataSink& sink) {
        {
          std::unique_lock lock(mu_);
          if (st->pending.empty() && !st->gone) {
            cv_.wait_for(lock, std::chrono::milliseconds(200), [&] {
              return stopping_.load() || drop_generation_ != st->gen ||
                     (!history_.empty() && history_.back().rv > st->cursor) || st->cursor < compacted_rv_;
            });
          }
          if (stopping_ || drop_generation_ != st->gen) return false;  // cut the connection
          if (PeerClosed(st->fd)) return false;                        // the client has gone
          if (!st->gone && st->cursor < compacted_rv_) {
            st->pending.push_back(encode(
                "ERROR",
                Status(410, "Expired", Cat("too old resource version: ", st->cursor, " (", compacted_rv_ + 1, ")"))));
            st->gone = true;
          }
          if (!st->gone) {
            auto it = std::upper_bound(history_.begin(), history_.end(), st->cursor,
                                       [](int64_t v, const Event& e) { return v < e.rv; });
            for (; it != history_.end(); ++it) {
              st->cursor = it->rv;
              if (it->resource != st->rkey) continue;
              const json& o = it->object;
              if (!st->ns.empty() && o["metadata"].value("namespace", "") != st->ns) continue;
              if (!st->ls.Matches(o["metadata"].value("labels", json::object())) ||
                  !st->fs.Matches(SelectableView(st->kind, o)))
                continue;
              st->pending.push_back(encode(it->type, o));
            }
          }
        }
        for (const auto& line : st->pending) {
          if (!sink.write(line.data(), line.size())) return false;
        }
        st->pending.clear();
        if (st->gone) {
          sink.done();
          return true;
        }
        const auto now = std::chrono::steady_clock::now();
        if (st->bookmarks && now >= st->next_bookmark) {
          st->next_bookmark = now + opts_.bookmark_interval;
          const std::string line = json({{"type", "BOOKMARK"},
                                         {"object",
                                          {{"kind", st->kind},
                                           {"apiVersion", st->api_version},
                                           {"metadata", {{"resourceVersion", std::to_string(st->cursor)}}}}}})
                                       .dump() +
                                   "\n";
          if (!sink.write(line.data(), line.size())) return false;
        }
        if (now >= st->deadline) sink.done();
        return true;
      },
      [this](bool) { --open_watches_; });
}

void FakeApiServer::Route(const httplib::Request& req, httplib::Response& res) {
  RouteApi(req, res);
  // Response compression as kube-apiserver's: gzip only a body of 128 KiB or more for a client
  // that accepts it, and never a watch (common/http_compress.h).
  GzipOnlyFrom(req, res, kApiserverGzipThresholdBytes);
}

void FakeApiServer::RouteApi(const httplib::Request& req, httplib::Response& res) {
  ++requests_;
  auto send = [&](const Result& r) {
    res.status = r.code;
    res.set_content(r.body.dump(), "application/json");
  };
  {
    std::lock_guard lock(mu_);
    last_user_agent_ = req.get_header_value("User-Agent");
    if (req.path.rfind("/_fake/", 0) != 0) {
      const bool gzip = req.get_header_value("Accept-Encoding").find("gzip") != std::string::npos;
      request_log_.push_back(Cat(req.method, " ", req.target, gzip ? " (gzip)" : ""));
      if (request_log_.size() > 1000) request_log_.pop_front();
    }
  }
  const std::string& path = req.path;
  // Test controls (not part of the Kubernetes API).
  if (path.rfind("/_fake/", 0) == 0) {
    const std::string what = path.substr(7);
    if (what == "drop-watches") {
      DropWatches();
    } else if (what == "fail") {
      FailNext(std::atoi(req.get_param_value("n").c_str()), std::atoi(req.get_param_value("code").c_str()),
               req.get_param_value("path"), req.get_param_value("verb"));
    } else if (what == "clear") {
      ClearFaults();
    } else if (what == "delay") {
      DelayNext(std::atoi(req.get_param_value("n").c_str()),
                std::chrono::milliseconds(std::atoll(req.get_param_value("ms").c_str())));
    } else if (what == "compact") {
      Compact();
    } else if (what == "token") {
      SetToken(req.get_param_value("token"), req.get_param_value("user"));
    } else if (what == "revoke") {
      RemoveToken(req.get_param_value("token"));
    } else if (what == "stats") {
      send({200,
            {{"openWatches", OpenWatches()},
             {"watchesStarted", WatchesStarted()},
             {"requests", Requests()},
             {"resourceVersion", ResourceVersion()}}});
      return;
    } else {
      send(Err(404, "NotFound", "unknown fault"));
      return;
    }
    send({200, {{"ok", true}, {"resourceVersion", ResourceVersion()}}});
    return;
  }
  if (path == "/healthz" || path == "/livez" || path == "/readyz") {
    res.set_content("ok", "text/plain");
    return;
  }
  // Faults before anything else, as a failing apiserver would.
  {
    std::chrono::milliseconds delay{0};
    int fail = 0;
    {
      std::lock_guard lock(mu_);
      const bool is_watch =
          req.method == "GET" && (req.get_param_value("watch") == "true" || req.get_param_value("watch") == "1");
      for (auto& f : faults_) {
        if (f.remaining <= 0) continue;
        if (!f.path_substr.empty() && path.find(f.path_substr) == std::string::npos) continue;
        if (!f.verb.empty() && !(f.verb == "watch" ? is_watch : f.verb == req.method)) continue;
        if (f.code != 0 && fail == 0) {
          fail = f.code;
          --f.remaining;
        } else if (f.code == 0 && delay.count() == 0) {
          delay = f.delay;
          --f.remaining;
        }
      }
      std::erase_if(faults_, [](const Fault& f) { return f.remaining <= 0; });
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (fail != 0) {
      send(Err(fail,
               fail == 429   ? "TooManyRequests"
               : fail >= 500 ? "InternalError"
                             : "BadRequest",
               Cat("injected fault: HTTP ", fail)));
      return;
    }
  }
  // Authentication.
  std::string user = "admin";
  {
    std::lock_guard lock(mu_);
    const std::string auth = req.get_header_value("Authorization");
    if (!tokens_.empty() && !(anonymous_admin_ && auth.empty())) {
      auto it = auth.rfind("Bearer ", 0) == 0 ? tokens_.find(auth.substr(7)) : tokens_.end();
      if (it == tokens_.end()) {
        res.status = 401;
        res.set_content(Status(401, "Unauthorized", "Unauthorized").dump(), "application/json");
        return;
      }
      user = it->second;
    }
  }
  // Discovery and OpenAPI.
  const std::string host = Cat(opts_.host, ":", port_);
  if (path == "/version") {
    const std::string minor = std::to_string(Minor());
    send({200,
          {{"major", "1"},
           {"minor", minor},
           {"gitVersion", opts_.git_version},
           {"gitCommit", "kgpu-fake-apiserver"},
           {"gitTreeState", "clean"},
           {"buildDate", "2026-01-01T00:00:00Z"},
           {"goVersion", "go1.23"},
           {"compiler", "gc"},
           {"platform", "linux/amd64"}}});
    return;
  }
  auto verbs_of = [](const k8s::Resource&, const std::string& sub) -> json {
    // (the sub-resources' verbs; deletecollection is not served, so not declared)
    if (sub == "binding" || sub == "eviction") return {"create"};
    if (sub == "status") return {"get", "patch", "update"};
    return {"create", "delete", "get", "list", "patch", "update", "watch"};
  };
  auto resource_list = [&](std::string_view group, std::string_view version) {
    json list = {{"kind", "APIResourceList"},
                 {"apiVersion", "v1"},
                 {"groupVersion", group.empty() ? std::string(version) : Cat(group, "/", version)},
                 {"resources", json::array()}};
    if (group.empty()) {
      // The legacy Binding endpoint (api/discovery/api__v1.json: bindings, namespaced, create).
      list["resources"].push_back({{"name", "bindings"},
                                   {"singularName", "binding"},
                                   {"namespaced", true},
                                   {"kind", "Binding"},
                                   {"verbs", {"create"}}});
    }
    for (const auto& r : k8s::Resources()) {
      if (r.group != group || r.version != version || !Serves(r)) continue;
      std::string singular(r.kind);
      std::transform(singular.begin(), singular.end(), singular.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      json e = {{"name", r.plural},
                {"singularName", singular},
                {"namespaced", r.namespaced},
                {"kind", r.kind},
                {"verbs", verbs_of(r, "")}};
      if (!r.short_names.empty() && !(r.group == "events.k8s.io")) e["shortNames"] = r.short_names;
      if (r.group == "events.k8s.io") e["shortNames"] = {"ev"};
      list["resources"].push_back(e);
      for (auto sub : r.subresources) {
        json se = {{"name", Cat(r.plural, "/", sub)},
                   {"singularName", ""},
                   {"namespaced", r.namespaced},
                   {"kind", sub == "eviction"  ? "Eviction"
                            : sub == "binding" ? "Binding"
                                               : std::string(r.kind)},
                   {"verbs", verbs_of(r, std::string(sub))}};
        if (sub == "eviction") {  // an Eviction is a policy/v1 kind
          se["group"] = "policy";
          se["version"] = "v1";
        }
        list["resources"].push_back(se);
      }
    }
    return list;
  };
  if (path == "/api") {
    send({200,
          {{"kind", "APIVersions"},
           {"versions", {"v1"}},
           {"serverAddressByClientCIDRs", {{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", host}}}}}});
    return;
  }
  if (path == "/api/v1") {
    send({200, resource_list("", "v1")});
    return;
  }
  std::map<std::string, std::string> groups;  // group -> version
  for (const auto& r : k8s::Resources()) {
    if (!r.group.empty() && Serves(r)) groups[std::string(r.group)] = std::string(r.version);
  }
  if (path == "/apis") {
    json list = {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", json::array()}};
    for (const auto& [g, v] : groups) {
      const json gv = {{"groupVersion", Cat(g, "/", v)}, {"version", v}};
      list["groups"].push_back({{"name", g}, {"versions", {gv}}, {"preferredVersion", gv}});
    }
    send({200, list});
    return;
  }
  for (const auto& [g, v] : groups) {
    if (path == Cat("/apis/", g, "/", v)) {
      send({200, resource_list(g, v)});
      return;
    }
    if (path == Cat("/apis/", g)) {
      const json gv = {{"groupVersion", Cat(g, "/", v)}, {"version", v}};
      send({200,
            {{"kind", "APIGroup"}, {"apiVersion", "v1"}, {"name", g}, {"versions", {gv}}, {"preferredVersion", gv}}});
      return;
    }
  }
  if (path == "/openapi/v2" || path == "/swagger-2.0.0.pb-v1") {
    // kubectl validates a `kind: List` document on the client (its v3 and v2 query-param
    // verifiers say v1/List has no server-side fieldValidation), which needs the OpenAPI v2
    // document (client-go OpenAPISchema, asked as protobuf; 404 there makes `kubectl apply` of a
    // List fail with "the server could not find the requested resource"). An empty
    // openapi_v2.Document is a valid protobuf message: kubectl then finds no schema for the
    // items and leaves their validation to the server, which checks each item's fields.
    res.status = 200;
    res.set_header("ETag", "\"KGPU1\"");
    // (kube-openapi's handler answers the `...spec.v2@v1.0+protobuf` Accept with this type: Go's
    // mime parser, which client-go runs on every response, refuses the '@'.)
    res.set_content("", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf");
    return;
  }
  if (path == "/openapi/v3") {
    json paths = {{"api/v1", {{"serverRelativeURL", "/openapi/v3/api/v1?hash=KGPU1"}}}};
    for (const auto& [g, v] : groups) {
      paths[Cat("apis/", g, "/", v)] = {{"serverRelativeURL", Cat("/openapi/v3/apis/", g, "/", v, "?hash=KGPU1")}};
    }
    send({200, {{"paths", paths}}});
    return;
  }
  if (path.rfind("/openapi/v3/", 0) == 0) {
    // One document per group/version: every kind's schema (with its
    // x-kubernetes-group-version-kind) and the PATCH operations with the fieldValidation
    // parameter kubectl's QueryParamVerifierV3 looks for.
    const std::string gvpath = path.substr(12);
    json doc = {{"openapi", "3.0.0"},
                {"info", {{"title", "Kubernetes"}, {"version", opts_.git_version}}},
                {"paths", json::object()},
                {"components", {{"schemas", json::object()}}}};
    bool any = false;
    for (const auto& r : k8s::Resources()) {
      const std::string p = r.group.empty() ? "api/v1" : Cat("apis/", r.group, "/", r.version);
      if (p != gvpath || !Serves(r)) continue;
      any = true;
      const json gvk = {{"group", r.group}, {"version", r.version}, {"kind", r.kind}};
      const std::string schema_name =
          Cat("io.k8s.api.", r.group.empty() ? "core" : std::string(r.group.substr(0, r.group.find('.'))), ".",
              r.version, ".", r.kind);
      doc["components"]["schemas"][schema_name] = {
          {"type", "object"},
          {"x-kubernetes-group-version-kind", {gvk}},
          {"properties",
           {{"apiVersion", {{"type", "string"}}},
            {"kind", {{"type", "string"}}},
            {"metadata", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}},
            {"spec", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}},
            {"status", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}}}},
          {"x-kubernetes-preserve-unknown-fields", true}};
      const json params = {
          {{"name", "fieldValidation"}, {"in", "query"}, {"schema", {{"type", "string"}, {"uniqueItems", true}}}},
          {{"name", "fieldManager"}, {"in", "query"}, {"schema", {{"type", "string"}, {"uniqueItems", true}}}},
          {{"name", "dryRun"}, {"in", "query"}, {"schema", {{"type", "string"}, {"uniqueItems", true}}}}};
      const json ref = {{"$ref", Cat("#/components/schemas/", schema_name)}};
      const json op = {
          {"x-kubernetes-group-version-kind", gvk},
          {"x-kubernetes-action", "patch"},
          {"parameters", params},
          {"responses", {{"200", {{"description", "OK"}, {"content", {{"application/json", {{"schema", ref}}}}}}}}}};
      const std::string item = Cat("/", p, r.namespaced ? "/namespaces/{namespace}/" : "/", r.plural, "/{name}");
      doc["paths"][item]["patch"] = op;
      json put = op;
      put["x-kubernetes-action"] = "put";
      doc["paths"][item]["put"] = put;
      json post = op;
      post["x-kubernetes-action"] = "post";
      doc["paths"][Cat("/", p, r.namespaced ? "/namespaces/{namespace}/" : "/", r.plural)]["post"] = post;
    }
    if (!any) {
      send(Err(404, "NotFound", "the server could not find the requested resource"));
      return;
    }
    send({200, doc});
    return;
  }
  // Resource paths.
  std::vector<std::string> seg;
  for (size_t i = 1; i <= path.size();) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) seg.push_back(path.substr(i, j - i));
    i = j + 1;
  }
  std::string group, version;
  size_t at = 0;
  if (seg.size() >= 2 && seg[0] == "api") {
    version = seg[1];
    at = 2;
  } else if (seg.size() >= 3 && seg[0] == "apis") {
    group = seg[1];
    version = seg[2];
    at = 3;
  } else {
    send(Err(404, "NotFound", "the server could not find the requested resource"));
    return;
  }
  Request r;
  r.user = user;
  std::vector<std::string> rest(seg.begin() + static_cast<std::ptrdiff_t>(at), seg.end());
  if (rest.size() >= 3 && rest[0] == "namespaces" && rest[2] != "status" && rest[2] != "finalize") {
    r.ns = rest[1];
    rest.erase(rest.begin(), rest.begin() + 2);
  }
  if (rest.empty() || rest.size() > 3) {
    send(Err(404, "NotFound", "the server could not find the requested resource"));
    return;
  }
  for (const auto& res_def : k8s::Resources()) {
    if (res_def.group == group && res_def.version == version && res_def.plural == rest[0] && Serves(res_def)) {
      r.resource = &res_def;
    }
  }
  if (group.empty() && rest.size() == 1 && rest[0] == "bindings" && !r.ns.empty() && req.method == "POST") {
    r.resource = k8s::FindResource("pods");
    r.sub = "binding";
    r.legacy_bindings = true;
    rest.clear();
    rest.push_back("pods");
  }
  if (!r.resource) {
    send(Err(404, "NotFound", "the server could not find the requested resource"));
    return;
  }
  if (rest.size() >= 2) r.name = rest[1];
  if (rest.size() == 3) {
    r.sub = rest[2];
    if (std::find(r.resource->subresources.begin(), r.resource->subresources.end(), r.sub) ==
        r.resource->subresources.end()) {
      send(Err(404, "NotFound", "the server could not find the requested resource"));
      return;
    }
  }
  Serve(r, req, res);
}

void FakeApiServer::Serve(Request& r, const httplib::Request& req, httplib::Response& res) {
  auto send = [&](const Result& x) {
    res.status = x.code;
    res.set_content(x.body.dump(), "application/json");
  };
  const std::string& m = req.method;
  const bool watch = req.get_param_value("watch") == "true" || req.get_param_value("watch") == "1";
  if (m == "GET") {
    r.verb = r.name.empty() ? (watch ? "watch" : "list") : "get";
  } else if (m == "POST") {
    r.verb = "create";
  } else if (m == "PUT") {
    r.verb = "update";
  } else if (m == "PATCH") {
    r.verb = "patch";
  } else if (m == "DELETE") {
    r.verb = r.name.empty() ? "deletecollection" : "delete";
  }
  struct ManagerScope {
    ~ManagerScope() { t_field_manager.clear(); }
  } manager_scope;
  if (r.verb == "create" || r.verb == "update" || r.verb == "patch") {
    std::string manager = req.get_param_value("fieldManager");
    if (manager.empty()) {
      const std::string ua = req.get_header_value("User-Agent");
      manager = ua.substr(0, ua.find('/'));
    }
    t_field_manager = manager.substr(0, 128);
  }
  // Authorization: the static RBAC table (a user not in it may do anything).
  const std::string res_name = r.legacy_bindings ? std::string("bindings")
                               : r.sub.empty()   ? std::string(r.resource->plural)
                                                 : Cat(r.resource->plural, "/", r.sub);
  std::optional<std::vector<RbacRule>> rules;
  {
    std::lock_guard lock(mu_);
    if (auto it = rbac_.find(r.user); it != rbac_.end()) rules = it->second;
  }
  if (rules) {
    bool allowed = false;
    for (const auto& rule : *rules) {
      const bool verb_ok = rule.verbs.contains("*") || rule.verbs.contains(r.verb);
      const bool res_ok = rule.resources.contains("*") || rule.resources.contains(res_name);
      const bool group_ok =
          rule.groups.empty() || rule.groups.contains("*") || rule.groups.contains(std::string(r.resource->group));
      const bool ns_ok = rule.ns.empty() || rule.ns == r.ns;
      // resourceNames cannot restrict create, list or watch (there is no name to match).
      const bool name_ok = rule.names.empty() || (!r.name.empty() && rule.names.contains(r.name));
      allowed = allowed || (verb_ok && res_ok && group_ok && ns_ok && name_ok);
    }
    if (!allowed) {
      // pkg/registry/rbac ... forbidden message of the authorization filter.
      const std::string what =
          r.name.empty() ? Qualified(*r.resource) : Cat(Qualified(*r.resource), " \"", r.name, "\"");
      const std::string scope = r.ns.empty() ? "at the cluster scope" : Cat("in the namespace \"", r.ns, "\"");
      send(Err(403, "Forbidden",
               Cat(what, " is forbidden: User \"", r.user, "\" cannot ", r.verb, " resource \"", res_name,
                   "\" in API group \"", r.resource->group, "\" ", scope),
               {{"name", r.name}, {"group", r.resource->group}, {"kind", r.resource->plural}}));
      return;
    }
  }
  const std::string rkey = RKey(*r.resource);
  auto body_json = [&]() -> absl::StatusOr<json> {
    if (req.body.empty()) return json::object();
    const std::string ct = req.get_header_value("Content-Type");
    if (ct.rfind("application/vnd.kubernetes.protobuf", 0) == 0) return DecodeProtobufObject(req.body);
    auto j = json::parse(req.body, nullptr, false);
    if (j.is_discarded()) {
      // `create --raw -f file.yaml` sends YAML without a Content-Type.
      auto docs = YamlDocumentsToJson(req.body, "request body");
      if (docs.ok() && docs->size() == 1) return (*docs)[0];
      return absl::InvalidArgumentError("the request body is neither JSON nor YAML");
    }
    return j;
  };
  // dryRun=All (the only value the apiserver accepts): run the request's checks, persist nothing.
  // The stand-in does it where kgpu asks for it, on pods/eviction, and says so elsewhere.
  bool dry_run = false;
  if (req.has_param("dryRun")) {
    const std::string v = req.get_param_value("dryRun");
    if (v != "All") {
      send(Err(400, "BadRequest", Cat("Unsupported value: \"", v, "\": supported values: \"All\"")));
      return;
    }
    if (!(r.verb == "create" && r.sub == "eviction")) {
      send(Err(400, "BadRequest", "the stand-in supports dryRun only on pods/eviction"));
      return;
    }
    dry_run = true;
  }
  if (r.verb == "watch") {
    ServeWatch(r, req, res);
    return;
  }
  if (r.verb == "list") {
    send(List(rkey, r.ns, req));
    return;
  }
  if (r.verb == "get") {
    Result x = Get(std::string(r.resource->plural) + (r.resource->group.empty() ? "" : Cat(".", r.resource->group)),
                   r.ns, r.name);
    if (x.code == 200 && WantsTable(req))
      x.body = TableOf(std::string(r.resource->kind), {x.body}, x.body["metadata"].value("resourceVersion", ""));
    send(x);
    return;
  }
  if (r.verb == "deletecollection") {
    send(Err(405, "MethodNotAllowed", "deletecollection is not supported by the stand-in"));
    return;
  }
  auto body = body_json();
  if (!body.ok()) {
    send(Err(400, "BadRequest", std::string(body.status().message())));
    return;
  }
  // Field validation: the directive is checked with the request's options (422), before the body.
  FieldValidation fv = FieldValidation::kWarn;
  std::vector<std::string> warnings;
  if (r.verb == "create" || r.verb == "update" || r.verb == "patch") {
    const std::string options = r.verb == "create"   ? "CreateOptions"
                                : r.verb == "update" ? "UpdateOptions"
                                                     : "PatchOptions";
    auto directive = ParseFieldValidation(req.get_param_value("fieldValidation"), options);
    if (!directive.ok()) {
      send(Err(422, "Invalid", std::string(directive.status().message()),
               {{"group", "meta.k8s.io"},
                {"kind", options},
                {"name", ""},
                {"causes",
                 {{{"reason", "FieldValueNotSupported"},
                   {"field", "fieldValidation"},
                   {"message", std::string(directive.status().message())
                                   .substr(std::string(directive.status().message()).find("Unsupported"))}}}}}));
      return;
    }
    fv = *directive;
  }
  auto send_warned = [&](const Result& x) {
    for (const auto& w : warnings) res.set_header("Warning", WarningHeader(w));
    send(x);
  };
  const bool typed_body = r.sub.empty() || r.sub == "status";  // binding and eviction bodies are other kinds
  if ((r.verb == "create" || r.verb == "update") && typed_body) {
    if (auto refused = CheckFields(*r.resource, *body, fv, &warnings)) {
      send(*refused);
      return;
    }
  }
  if (r.verb == "create") {
    if (r.sub == "binding") {
      const std::string pod = r.legacy_bindings && body->contains("metadata") && (*body)["metadata"].is_object()
                                  ? (*body)["metadata"].value("name", "")
                                  : r.name;
      send(DoBinding(r.ns, pod, *body));
    } else if (r.sub == "eviction") {
      send(DoEviction(r.ns, r.name, *body, dry_run));
    } else if (!r.name.empty()) {
      send(Err(405, "MethodNotAllowed", "the server does not allow this method on the requested resource"));
    } else {
      send_warned(DoCreate(rkey, r.ns, *body, r.user));
    }
    return;
  }
  if (r.verb == "update") {
    send_warned(DoUpdate(rkey, r.ns, r.name, *body, r.sub));
    return;
  }
  if (r.verb == "patch") {
    send_warned(DoPatch(rkey, r.ns, r.name, *body, req.get_header_value("Content-Type"), r.sub, fv, &warnings));
    return;
  }
  if (r.verb == "delete") {
    send(DoDelete(rkey, r.ns, r.name, *body));
    return;
  }
  send(Err(405, "MethodNotAllowed", "the server does not allow this method on the requested resource"));
}

namespace {
const k8s::Resource* Lookup(const std::string& resource) {
  // "pods", "Pod", "events.events.k8s.io", "poddisruptionbudgets.policy".
  const auto dot = resource.find('.');
  if (dot != std::string::npos) {
    const std::string plural = resource.substr(0, dot), group = resource.substr(dot + 1);
    for (const auto& r : k8s::Resources()) {
      if (r.plural == plural && r.group == group) return &r;
    }
  }
  return k8s::FindResource(resource);
}
}  // namespace

FakeApiServer::Result FakeApiServer::Create(const std::string& resource, const std::string& ns, json obj) {
  const k8s::Resource* r = Lookup(resource);
  if (!r) return Err(404, "NotFound", Cat("unknown resource ", resource));
  std::vector<std::string> ignored;
  (void)CheckFields(*r, obj, FieldValidation::kWarn, &ignored);  // as a client sending no directive
  return DoCreate(RKey(*r), ns, std::move(obj), "admin");
}

FakeApiServer::Result FakeApiServer::Get(const std::string& resource, const std::string& ns, const std::string& name) {
  const k8s::Resource* r = Lookup(resource);
  if (!r) return Err(404, "NotFound", Cat("unknown resource ", resource));
  std::lock_guard lock(mu_);
  json* o = FindLocked(RKey(*r), r->namespaced ? ns : "", name);
  if (!o) return NotFound(*r, name);
  return {200, *o};
}

FakeApiServer::Result FakeApiServer::Update(const std::string& resource, const std::string& ns, json obj) {
  const k8s::Resource* r = Lookup(resource);
  if (!r) return Err(404, "NotFound", Cat("unknown resource ", resource));
  const std::string name = obj["metadata"].value("name", "");
  std::vector<std::string> ignored;
  (void)CheckFields(*r, obj, FieldValidation::kWarn, &ignored);
  // Direct updates write status too (a test playing kubelet or a controller).
  auto res = DoUpdate(RKey(*r), r->namespaced ? ns : "", name, obj, "");
  if (res.code == 200 && obj.contains("status")) {
    json s = res.body;
    s["status"] = obj["status"];
    res = DoUpdate(RKey(*r), r->namespaced ? ns : "", name, s, "status");
  }
  return res;
}

FakeApiServer::Result FakeApiServer::Delete(const std::string& resource, const std::string& ns,
                                            const std::string& name) {
  const k8s::Resource* r = Lookup(resource);
  if (!r) return Err(404, "NotFound", Cat("unknown resource ", resource));
  return DoDelete(RKey(*r), r->namespaced ? ns : "", name, json::object());
}

absl::Status FakeApiServer::PreloadText(const std::string& text, const std::string& origin) {
  auto docs = YamlDocumentsToJson(text, origin);
  if (!docs.ok()) return docs.status();
  for (size_t i = 0; i < docs->size(); ++i) {
    json& d = (*docs)[i];
    const std::string kind = d.value("kind", "");
    const std::string api_version = d.value("apiVersion", "");
    const k8s::Resource* r = nullptr;
    for (const auto& x : k8s::Resources()) {
      if (x.kind == kind && x.GroupVersion() == api_version && Serves(x)) r = &x;
    }
    if (!r)
      return absl::InvalidArgumentError(Cat(origin, ": document ", i + 1, ": unknown kind ", api_version, "/", kind));
    std::vector<std::string> dropped;
    (void)CheckFields(*r, d, FieldValidation::kWarn, &dropped);  // as kubectl create --validate=warn would
    json status = d.value("status", json());
    auto res = DoCreate(RKey(*r), d["metadata"].value("namespace", ""), d, "admin");
    if (res.code >= 300) {
      return absl::InvalidArgumentError(Cat(origin, ": document ", i + 1, " (", kind, " ",
                                            d["metadata"].value("name", ""), "): ", res.body.value("message", "")));
    }
    if (!status.is_null() && kind != "Node") {
      // Preloaded objects keep the status they were written with (a pod's phase, for instance).
      json s = res.body;
      s["status"] = status;
      DoUpdate(RKey(*r), s["metadata"].value("namespace", ""), s["metadata"].value("name", ""), s, "status");
    }
  }
  return absl::OkStatus();
}

absl::Status FakeApiServer::Preload(const std::string& path) {
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const auto ext = e.path().extension();
      if (ext == ".yaml" || ext == ".yml" || ext == ".json") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.emplace_back(path);
  }
  for (const auto& f : files) {
    auto text = ReadFile(f.string());
    if (!text) return absl::NotFoundError(Cat(f.string(), ": cannot read"));
    if (auto s = PreloadText(*text, f.string()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace kgpu::testing
