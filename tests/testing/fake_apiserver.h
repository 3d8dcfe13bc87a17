#pragma once
// kgpu-fake-apiserver: an in-repo stand-in for kube-apiserver that behaves like it on every
// path kgpu and kubectl 1.32 use (../shared/docs/facts/kubectl-and-apiserver.md):
//  - HTTP/1.1 or HTTPS (a self-signed certificate it generates, or given files); bearer tokens
//    (401 when wrong) and a small static RBAC table (403 with the apiserver's wording);
//  - /version (v1.32.x, so kubectl's dispatcher picks kubectl 1.32), /api, /apis and the
//    per-group resource lists (unaggregated discovery), /openapi/v3 with the PATCH operations
//    kubectl checks for fieldValidation;
//  - kinds Pod, Node, Namespace, Event (core and events.k8s.io), ResourceQuota, LimitRange,
//    PodDisruptionBudget, Lease, ConfigMap, and from git_version v1.34 on resource.k8s.io/v1's
//    DeviceClass, ResourceSlice, ResourceClaim (+ status) and ResourceClaimTemplate with their
//    validation and generations (fake_apiserver_dra.h); JSON bodies, and the protobuf envelope kubectl's
//    generator commands send (`kubectl create namespace|quota|pdb|configmap`);
//  - one global resourceVersion; list (limit/continue, label and field selectors) and watch
//    (ADDED/MODIFIED/DELETED/BOOKMARK; a compacted version gets an ERROR event with 410);
//    409 on a stale update; 404/409/410/422/429 as Kubernetes Status objects; merge, strategic
//    and JSON patches; generateName; pods/binding, pods/eviction with PodDisruptionBudgets,
//    pods/status, nodes/status; graceful pod deletion;
//  - field validation (fieldValidation=Strict/Warn/Ignore, Warn by default): unknown fields are
//    refused (400 on create/update, 422 on patch) or dropped with a Warning header
//    (fake_apiserver_fields.h);
//  - admission for the quota story: LimitRange defaulting and min/max, ResourceQuota
//    (status.used maintained; scopes Terminating, NotTerminating, BestEffort, NotBestEffort and
//    the PriorityClass scopeSelector), the container rules for extended resources;
//  - meta.k8s.io/v1 Tables for kubectl get;
//  - fault injection: drop every watch, fail or delay the next N requests, compact history.
// Faults can also be driven over HTTP (POST /_fake/...), for the separate-process tests.
//
// Thread-safety: every public method may be called from any thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "testing/fake_apiserver_fields.h"

namespace kgpu::k8s {
struct Resource;
}

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kgpu::testing {

// One PolicyRule of a Role or ClusterRole, as the RBAC authorizer matches it
// (plugin/pkg/auth/authorizer/rbac: verbs, apiGroups, resources with their subresource,
// resourceNames; a Role's rules hold in its namespace only).
struct RbacRule {
  RbacRule() = default;
  RbacRule(std::set<std::string> v, std::set<std::string> r, std::set<std::string> g = {})
      : verbs(std::move(v)), resources(std::move(r)), groups(std::move(g)) {}
  std::set<std::string> verbs;      // get list watch create update patch delete, or "*"
  std::set<std::string> resources;  // "pods", "pods/eviction", "nodes/status", or "*"
  std::set<std::string> groups;     // apiGroups ("" core, "*"); empty: any (a test's shorthand)
  std::string ns;                   // a Role's namespace; "" for a ClusterRole
  std::set<std::string> names;      // resourceNames; empty: any object
};

// The identity a folder of deploy/ gives a component: its ServiceAccount's user name
// ("system:serviceaccount:<ns>:<name>") and every rule of the Roles and ClusterRoles bound to it
// there. A Role without a namespace is in the one its kustomization.yaml sets (kgpu-system).
struct DeployIdentity {
  std::string user;
  std::vector<RbacRule> rules;
};
// `path`: a manifest or a folder of them (*.yaml, not recursing); `service_account`: which one,
// when the manifests bind several (empty: the only one bound).
absl::StatusOr<DeployIdentity> ReadDeployRbac(const std::string& path, const std::string& service_account = "");

struct FakeApiServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = any free port
  bool tls = false;
  std::string tls_cert_file, tls_key_file;  // both empty with tls: a generated self-signed pair
  // Bearer tokens -> user. Empty: a request without a token is served as user "admin" (a test's
  // own client), one with a token must carry a known one (KubeconfigFor adds them).
  std::map<std::string, std::string> tokens;
  // User -> rules. A user missing from the table may do anything (the cluster-admin of a test).
  std::map<std::string, std::vector<RbacRule>> rbac;
  size_t history_window = 100000;  // watch events kept; older versions answer 410 Gone
  std::chrono::milliseconds bookmark_interval{1000};
  // What /version says (kubectl's dispatcher runs the kubectl of this minor) and which API groups
  // are served: resource.k8s.io/v1 from v1.34 on.
  std::string git_version = "v1.32.4";
  // Stands in for kubelet finishing a graceful deletion: a terminating pod bound to a node is
  // removed when its grace period ends. Off: it stays Terminating as on a cluster whose kubelet
  // is gone.
  bool reap_terminating_pods = true;
  // Connections are served on threads added as needed (testing/http_conn.h), up to this many:
  // open watches never starve other requests.
  size_t max_threads = 4096;
  // kube-apiserver's --min-request-timeout: a watch without timeoutSeconds ends after a random
  // time between this and twice this, so clients re-establish their watches spread out.
  std::chrono::seconds min_request_timeout{1800};
  // Kind -> dotted field paths ("spec.futureField") this server knows besides k8s.io/api v0.32's,
  // as a newer apiserver would (fake_apiserver_fields.h): they pass field validation.
  std::map<std::string, std::set<std::string>> extra_fields;
};

class FakeApiServer {
 public:
  explicit FakeApiServer(FakeApiServerOptions opts = {});
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  absl::Status Start();
  void Stop();
  int port() const { return port_; }
  std::string url() const;
  const std::string& ca_pem() const { return ca_pem_; }
  // A kubeconfig for kubectl or kgpu (CA data when TLS, the token when given).
  std::string Kubeconfig(const std::string& token = "", const std::string& ns = "default") const;
  // A kubeconfig whose token is `id`'s and whose requests get exactly `id`'s rules: a component
  // runs in a test with the RBAC its deploy/ folder grants, no more. Its namespace is the
  // ServiceAccount's (as the in-cluster config of the component's pod), created if absent (as
  // deploy/namespace does).
  std::string KubeconfigFor(const DeployIdentity& id);

  // Direct access, through the same admission and watch paths as HTTP requests. `resource`
  // is a plural ("pods") or kind; returns the stored object or the Status the API would send.
  struct Result {
    int code = 200;
    nlohmann::json body;
  };
  Result Create(const std::string& resource, const std::string& ns, nlohmann::json obj);
  Result Get(const std::string& resource, const std::string& ns, const std::string& name);
  Result Update(const std::string& resource, const std::string& ns, nlohmann::json obj);
  Result Delete(const std::string& resource, const std::string& ns, const std::string& name);
  // Loads YAML or JSON documents (a file or every *.yaml/*.yml/*.json of a directory).
  absl::Status Preload(const std::string& path);
  absl::Status PreloadText(const std::string& text, const std::string& origin);

  // Faults.
  void DropWatches();  // every open watch is cut
  // The next n requests whose path contains path_substr and whose verb is `verb` ("" any,
  // "watch", or an HTTP method) fail with `code`.
  void FailNext(int n, int code, const std::string& path_substr = "", const std::string& verb = "");
  void ClearFaults();
  void DelayNext(int n, std::chrono::milliseconds delay);
  void Compact();  // forget the watch history: every older resourceVersion is now 410
  void SetToken(const std::string& token, const std::string& user);  // add or replace
  void RemoveToken(const std::string& token);

  int64_t ResourceVersion() const;
  uint64_t Requests() const { return requests_; }
  uint64_t WatchesStarted() const { return watches_started_; }
  size_t OpenWatches() const { return open_watches_; }
  // Requests seen per "<METHOD> <path without query>" and their User-Agent (last seen).
  std::string LastUserAgent() const;
  // The last 1,000 API requests as "<METHOD> <target>" (path and query as sent), with " (gzip)"
  // when the client accepted a gzipped answer; oldest first.
  std::vector<std::string> RequestLog() const;

 private:
  struct Event {
    int64_t rv;
    std::string type;
    std::string resource;  // Resource key (group/plural)
    nlohmann::json object;
  };
  struct Fault {
    int remaining = 0;
    int code = 0;
    std::string path_substr;
    std::chrono::milliseconds delay{0};
    std::string verb;
  };
  class Request;

  // The minor of opts_.git_version ("v1.34.2" -> 34), and whether this version serves `r`.
  int Minor() const;
  bool Serves(const k8s::Resource& r) const;
  void Route(const httplib::Request& req, httplib::Response& res);
  void RouteApi(const httplib::Request& req, httplib::Response& res);
  void Serve(Request& r, const httplib::Request& req, httplib::Response& res);
  void ServeWatch(Request& r, const httplib::Request& req, httplib::Response& res);
  Result DoCreate(const std::string& rkey, const std::string& ns, nlohmann::json obj, const std::string& user_name);
  Result DoUpdate(const std::string& rkey, const std::string& ns, const std::string& name, nlohmann::json obj,
                  const std::string& sub);
  Result DoPatch(const std::string& rkey, const std::string& ns, const std::string& name, const nlohmann::json& patch,
                 const std::string& content_type, const std::string& sub, FieldValidation fv = FieldValidation::kWarn,
                 std::vector<std::string>* warnings = nullptr);
  // Unknown fields of a create/update body under `fv`: removed (and, under Warn, added to
  // *warnings), or the 400 Strict refusal.
  std::optional<Result> CheckFields(const k8s::Resource& r, nlohmann::json& obj, FieldValidation fv,
                                    std::vector<std::string>* warnings) const;
  Result DoDelete(const std::string& rkey, const std::string& ns, const std::string& name, const nlohmann::json& opts);
  Result DoBinding(const std::string& ns, const std::string& name, const nlohmann::json& binding);
  // dry_run (?dryRun=All): the budget's verdict only; nothing is stored or deleted.
  Result DoEviction(const std::string& ns, const std::string& name, const nlohmann::json& eviction, bool dry_run);
  Result List(const std::string& rkey, const std::string& ns, const httplib::Request& req);

  // Under mu_.
  nlohmann::json* FindLocked(const std::string& rkey, const std::string& ns, const std::string& name);
  void StoreLocked(const std::string& rkey, const std::string& type, nlohmann::json obj);
  void RemoveLocked(const std::string& rkey, const std::string& ns, const std::string& name);
  absl::Status AdmitPodLocked(nlohmann::json& pod, Result& refusal);
  // The controllers that follow a namespace's pods: the quota controller (ResourceQuota
  // status.used) and the disruption controller (PodDisruptionBudget status), at once.
  void RunControllersLocked(const std::string& ns);
  void RecomputeQuotasLocked(const std::string& ns);
  void RecomputeBudgetsLocked(const std::string& ns);
  // The disruption controller's status of a budget from the pods as they are now.
  nlohmann::json BudgetStatusLocked(const nlohmann::json& pdb);
  void ReapLoop(std::stop_token stop);

  FakeApiServerOptions opts_;
  std::unique_ptr<httplib::Server> http_;
  std::thread server_thread_;
  std::jthread reaper_;
  int port_ = 0;
  std::string ca_pem_, cert_file_, key_file_, cert_dir_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t rv_ = 0;
  int64_t compacted_rv_ = 0;                                              // events with rv <= this are gone
  std::map<std::string, std::map<std::string, nlohmann::json>> objects_;  // rkey -> "ns/name" -> obj
  std::set<std::string> terminating_;  // "ns/name" of the pods with a deletionTimestamp (the reaper's work)
  std::string pods_rkey_;              // objects_' key of pods
  std::deque<Event> history_;
  uint64_t drop_generation_ = 0;
  std::vector<Fault> faults_;
  std::map<std::string, std::string> tokens_;
  std::map<std::string, std::vector<RbacRule>> rbac_;  // user -> rules (opts_.rbac, then KubeconfigFor)
  bool anonymous_admin_ = false;                       // no tokens configured: no token is admin
  std::string last_user_agent_;
  std::deque<std::string> request_log_;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> watches_started_{0};
  std::atomic<size_t> open_watches_{0};
  std::atomic<bool> stopping_{false};
  uint64_t uid_counter_ = 0;
};

// The protobuf envelope ("k8s\0" + runtime.Unknown) kubectl's generators send, decoded to
// JSON for the kinds they create (Namespace, ResourceQuota, PodDisruptionBudget, ConfigMap).
absl::StatusOr<nlohmann::json> DecodeProtobufObject(const std::string& body);

// YAML (one or more documents) or JSON to JSON documents; plain scalars keep their YAML type.
absl::StatusOr<std::vector<nlohmann::json>> YamlDocumentsToJson(const std::string& text, const std::string& origin);

// A self-signed certificate and key for 127.0.0.1 and localhost (PEM), for the TLS mode.
// `usage`: the extended key usage ("serverAuth"; "clientAuth" for a client certificate, which
// then may also serve as its own client CA).
absl::Status GenerateSelfSigned(std::string& cert_pem, std::string& key_pem,
                                const std::string& common_name = "kgpu-fake-apiserver",
                                const std::string& usage = "serverAuth");

}  // namespace kgpu::testing
