#include "extender/server.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <tuple>

#include <httplib.h>
#include <unistd.h>

#include "common/http_compress.h"
#include "common/http_listen.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/web_config.h"
#include "k8s/node_fit.h"
#include "k8s/resources.h"
#include "k8s/selector.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;

std::string PodPath(const std::string& ns, const std::string& name) {
  return k8s::FindResource("pods")->Path(ns, name);
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "kgpu-extender";
  return buf;
}

// The candidate nodes' names: NodeNames as sent, or the names of the full NodeList (in `scratch`).
const std::vector<std::string>& NamesOf(const ExtenderArgs& a, std::vector<std::string>& scratch) {
  if (a.node_names) return *a.node_names;
  if (a.nodes) {
    for (const auto& n : *a.nodes) scratch.push_back(n.value("metadata", json::object()).value("name", ""));
  }
  return scratch;
}

// "ns/name, ns/name" of a plan's victims.
std::string VictimNames(const PreemptionPlan& plan) {
  std::vector<std::string> names;
  for (const auto& v : plan.victims) names.push_back(Cat(v.ns, "/", v.name));
  return Join(names, ", ");
}

}  // namespace

std::string EscapePercent(std::string_view s) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '%') out += '%';
  }
  return out;
}

Extender::Extender(k8s::Client& client, ExtenderOptions options)
    : client_(client),
      opts_(std::move(options)),
      state_(opts_.state),
      identity_(opts_.identity.empty() ? HostName() : opts_.identity),
      events_(client_, "kgpu.io/extender", identity_) {}

Extender::~Extender() {
  Stop();
}

std::string Extender::NotReadyReason() const {
  if (!nodes_ || !nodes_->HasSynced()) return "the Node informer has not synced yet";
  if (!pods_ || !pods_->HasSynced()) return "the Pod informer has not synced yet";
  if (stopping_) return "the extender is stopping";
  return "";
}

Extender::Reply Extender::Timed(const std::string& verb, const std::function<Reply()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  Reply r;
  const std::string why = NotReadyReason();
  if (!why.empty()) {
    metrics_.Count("kgpu_extender_failures_total", {{"verb", verb}, {"reason", "not_ready"}});
    r.code = 503;
    r.body = json{{"Error", EscapePercent(Cat("kgpu extender is not ready: ", why))}}.dump();
  } else {
    r = f();
  }
  metrics_.Observe(verb, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  metrics_.Count("kgpu_extender_requests_total", {{"verb", verb}, {"code", std::to_string(r.code)}});
  return r;
}

Extender::Reply Extender::Filter(std::string_view body) {
  return Timed("filter", [&]() -> Reply {
    auto args = ParseExtenderArgs(body);
    if (!args.ok()) {
      metrics_.Count("kgpu_extender_failures_total", {{"verb", "filter"}, {"reason", "bad_request"}});
      FilterResult r;
      r.error = EscapePercent(std::string(args.status().message()));
      return {400, EncodeFilterResult(r)};
    }
    if (!args->node_names && args->nodes) {
      for (const auto& n : *args->nodes) state_.UpsertNode(n);  // nodeCacheCapable: false
    }
    std::vector<std::string> scratch;
    const std::vector<std::string>& names = NamesOf(*args, scratch);
    auto out = state_.Filter(args->pod, names);
    FilterResult r;
    const size_t passed = out.passed.size();
    if (args->node_names) {
      r.node_names = std::move(out.passed);
    } else {
      std::vector<json> keep;
      if (args->nodes) {
        const std::set<std::string> pass(out.passed.begin(), out.passed.end());
        for (auto& n : *args->nodes) {
          if (pass.contains(n.value("metadata", json::object()).value("name", ""))) keep.push_back(std::move(n));
        }
      }
      r.nodes = std::move(keep);
    }
    if (opts_.preemption && passed == 0 && !out.failed.empty() && Leads()) {
      // (A standby plans none: evictions are the leader's, as binds are. kube-scheduler retries
      // the pod, and its next filter may reach the leader.)
      // Every node kube-scheduler passed on is refused for what it cannot see: its own
      // preemption would find no victim there (facts §1.4), so the extender preempts.
      if (auto plan = state_.PlanPreemption(args->pod, names); plan) {
        std::string& why = out.failed[plan->node];
        why += Cat("; preempting ", plan->victims.size(), " lower-priority pod(s) here: ", VictimNames(*plan));
        metrics_.Count("kgpu_extender_preemptions_total", {{"result", "started"}});
        preemptions_.Push(std::move(*plan));
      }
    }
    if (!out.closest_node.empty()) {
      // The reasons kube-scheduler shows are one line per cause (it counts identical ones); the
      // nearest node's own figures go to an Event on the pod, where `kubectl describe` shows them.
      const json meta = args->pod.value("metadata", json::object());
      const std::string ns = meta.value("namespace", "default"), name = meta.value("name", "");
      const std::string note = Cat("none of ", names.size(), " nodes can take the pod's GPUs; nearest: node ",
                                   out.closest_node, ": ", out.closest_why);
      Log("extender")->debug("pod {}/{}: {}", ns, name, note);
      if (!name.empty()) {
        QueueEvent({{"v1", "Pod", ns, name, meta.value("uid", "")}, "Warning", "GPUsUnavailable", "Filter", note});
      }
    }
    r.failed_nodes = std::move(out.failed);
    r.failed_and_unresolvable = std::move(out.unresolvable);
    metrics_.Count("kgpu_extender_filter_nodes_total", {{"result", "passed"}}, passed);
    metrics_.Count("kgpu_extender_filter_nodes_total", {{"result", "failed"}}, r.failed_nodes.size());
    metrics_.Count("kgpu_extender_filter_nodes_total", {{"result", "unresolvable"}}, r.failed_and_unresolvable.size());
    for (const auto& [reason, n] : out.reasons) {
      metrics_.Count("kgpu_extender_filter_reasons_total", {{"reason", reason}}, static_cast<uint64_t>(n));
    }
    return {200, EncodeFilterResult(r)};
  });
}

Extender::Reply Extender::Prioritize(std::string_view body) {
  return Timed("prioritize", [&]() -> Reply {
    auto args = ParseExtenderArgs(body);
    if (!args.ok()) {
      metrics_.Count("kgpu_extender_failures_total", {{"verb", "prioritize"}, {"reason", "bad_request"}});
      return {400, json{{"Error", EscapePercent(std::string(args.status().message()))}}.dump()};
    }
    std::vector<std::string> scratch;
    return {200, EncodeHostPriorityList(state_.Prioritize(args->pod, NamesOf(*args, scratch)))};
  });
}

Extender::Reply Extender::Preempt(std::string_view body) {
  return Timed("preempt", [&]() -> Reply {
    auto args = ParsePreemptionArgs(body);
    if (!args.ok()) {
      metrics_.Count("kgpu_extender_failures_total", {{"verb", "preempt"}, {"reason", "bad_request"}});
      return {400, json{{"Error", EscapePercent(std::string(args.status().message()))}}.dump()};
    }
    // A standby keeps no candidate: the preemption holds live in the leader's memory only, so a
    // standby could offer victims on a node already held for another preemptor. kube-scheduler
    // preempts nothing this cycle and retries the pod.
    const auto out = Leads() ? state_.Preempt(args->pod, args->victims) : std::map<std::string, MetaVictims>{};
    metrics_.Count("kgpu_extender_preempt_nodes_total", {{"result", "kept"}}, out.size());
    metrics_.Count("kgpu_extender_preempt_nodes_total", {{"result", "dropped"}}, args->victims.size() - out.size());
    return {200, EncodePreemptionResult(out)};
  });
}

Extender::Reply Extender::Bind(std::string_view body, bool forwarded) {
  return Timed("bind", [&]() -> Reply {
    if (!Leads()) return ForwardBind(body, forwarded);
    auto args = ParseBindingArgs(body);
    if (!args.ok()) {
      metrics_.Count("kgpu_extender_failures_total", {{"verb", "bind"}, {"reason", "bad_request"}});
      return {400, EncodeBindingResult(EscapePercent(std::string(args.status().message())))};
    }
    const std::string err = BindPod(*args);
    metrics_.Count("kgpu_extender_binds_total", {{"result", err.empty() ? "bound" : "failed"}});
    if (!err.empty())
      Log("extender")->warn("bind {}/{} to {}: {}", args->pod_namespace, args->pod_name, args->node, err);
    return {200, EncodeBindingResult(EscapePercent(err))};
  });
}

Extender::Reply Extender::ForwardBind(std::string_view body, bool forwarded) {
  auto refuse = [&](std::string_view reason, const std::string& why) -> Reply {
    metrics_.Count("kgpu_extender_failures_total", {{"verb", "bind"}, {"reason", std::string(reason)}});
    Log("extender")->warn("bind not passed on to the leader: {}", why);
    // In the result's Error, as every refused bind: kube-scheduler puts it in the pod's event,
    // fails this binding cycle and retries the pod after its backoff.
    return {200, EncodeBindingResult(EscapePercent(Cat("kgpu extender: ", why)))};
  };
  if (forwarded) return refuse("no_leader", "a bind passed on by another replica reached one that does not lead");
  const k8s::ObservedLease lease = elector_->Observed();
  if (lease.holder.empty())
    return refuse("no_leader", "no replica leads now (the Lease is free; one takes it shortly)");
  if (lease.holder == identity_) {  // taken, or lost, a moment ago: never passed on to itself
    return refuse("no_leader", "this replica's hold on the Lease is changing; the bind is retried");
  }
  const auto at = lease.annotations.find(kLeaderAddressAnnotation);
  if (at == lease.annotations.end() || at->second.empty()) {
    return refuse("no_leader", Cat("the leader ", lease.holder, " wrote no ", kLeaderAddressAnnotation,
                                   " on its Lease (give it --advertise-address)"));
  }
  auto answer = forwarder_->Post(at->second, "/bind", body, identity_);
  if (!answer.ok()) return refuse("forward_failed", std::string(answer.status().message()));
  metrics_.Count("kgpu_extender_binds_total", {{"result", "forwarded"}});
  return {answer->code, std::move(answer->body)};
}

std::string Extender::BindPod(const BindingArgs& b) {
  const std::string ns = b.pod_namespace.empty() ? "default" : b.pod_namespace;
  const std::string path = PodPath(ns, b.pod_name);
  auto fail = [&](std::string_view reason, std::string msg) {
    metrics_.Count("kgpu_extender_failures_total", {{"verb", "bind"}, {"reason", std::string(reason)}});
    return msg;
  };
  auto uid_of = [](const json& p) { return p.value("metadata", json::object()).value("uid", ""); };
  auto node_of = [](const json& p) { return p.value("spec", json::object()).value("nodeName", ""); };
  // The pod from the informer's cache: kube-scheduler decided on it moments ago, so the cache
  // has it. Only a pod the cache has not seen yet (or under another UID: re-created, or the cache
  // lags) costs a GET. A stale copy cannot bind wrongly: the binding below carries the UID as a
  // precondition and the apiserver refuses to bind a pod twice.
  std::optional<json> pod = pods_ ? pods_->store().Get(Cat(ns, "/", b.pod_name)) : std::nullopt;
  if (!pod || (!b.pod_uid.empty() && uid_of(*pod) != b.pod_uid)) {
    auto got = client_.Get(path);
    if (!got.ok()) return fail("api_error", Cat("get pod ", ns, "/", b.pod_name, ": ", got.status().message()));
    pod = std::move(*got);
  }
  if (!b.pod_uid.empty() && uid_of(*pod) != b.pod_uid) {
    return fail("pod_changed", Cat("pod ", ns, "/", b.pod_name, " was re-created (UID ", uid_of(*pod),
                                   ", the binding is for ", b.pod_uid, ")"));
  }
  if (const std::string bound = node_of(*pod); !bound.empty()) {
    if (bound == b.node) {
      metrics_.Count("kgpu_extender_binds_total", {{"result", "already_bound"}});
      return "";
    }
    return fail("already_bound", Cat("pod ", ns, "/", b.pod_name, " is already bound to ", bound));
  }
  // The pod's own constraints on this node, as kube-scheduler's filters checked them before it
  // asked: a caller that is not kube-scheduler cannot place a pod where its spec forbids.
  std::optional<json> node = nodes_ ? nodes_->store().Get(b.node) : std::nullopt;
  if (!node) {
    auto got = client_.Get(k8s::FindResource("nodes")->Path("", b.node));
    if (!got.ok()) return fail("node_unknown", Cat("get node ", b.node, ": ", got.status().message()));
    node = std::move(*got);
  }
  if (const std::string refused = k8s::NodeRefusesPod(*pod, *node); !refused.empty()) {
    return fail("pod_constraints", Cat("pod ", ns, "/", b.pod_name, " may not run on node ", b.node, ": ", refused));
  }
  auto a = state_.Assume(*pod, b.node);
  if (!a.ok())
    return fail(absl::IsInvalidArgument(a.status()) ? "invalid_request" : "no_fit", std::string(a.status().message()));
  const std::string uid = a->uid;
  // One write: the apiserver sets spec.nodeName and merges the Binding's annotations (the
  // allocation record) into the pod atomically, under the UID precondition. No moment exists in
  // which the pod is bound without its record, or carries a record without being bound.
  k8s::Client::BindOptions bo;
  bo.uid = uid;
  if (!a->record.containers.empty()) bo.annotations[kAnnotationAllocation] = api::EncodeRecord(a->record);
  if (absl::Status st = client_.Bind(ns, b.pod_name, b.node, bo); !st.ok()) {
    if (k8s::IsApiConflict(st)) {
      // Bound meanwhile (a retried bind of ours whose first answer was lost), or re-created.
      auto again = client_.Get(path);
      if (again.ok() && uid_of(*again) == uid && node_of(*again) == b.node) {
        state_.UpsertPod(*again);  // book exactly what its record says
        metrics_.Count("kgpu_extender_binds_total", {{"result", "already_bound"}});
        return "";
      }
    }
    state_.Forget(uid);
    return fail(k8s::IsApiConflict(st) ? "conflict" : "api_error", Cat("create binding: ", st.message()));
  }
  state_.Confirm(uid);
  if (!a->record.containers.empty()) {
    std::vector<std::string> what;
    for (const auto& rc : a->record.containers) {
      std::vector<std::string> gpus;
      for (const auto& g : rc.gpus) gpus.push_back(g.Device());
      what.push_back(Cat(a->record.containers.size() > 1 ? Cat(rc.name, ": ") : "", rc.resource, " ", Join(gpus, ",")));
    }
    Log("extender")->info("bound {}/{} to {}: {}", ns, b.pod_name, b.node, Join(what, "; "));
  }
  return "";
}

std::string Extender::BudgetShortfall(const PreemptionPlan& plan) {
  std::map<std::string, std::vector<const PreemptionPlan::Victim*>> by_ns;
  for (const auto& v : plan.victims) by_ns[v.ns].push_back(&v);
  const k8s::Resource* pdbs = k8s::FindResource("poddisruptionbudgets");
  const k8s::Resource* pods = k8s::FindResource("pods");
  for (const auto& [ns, victims] : by_ns) {
    if (victims.size() < 2) continue;  // a budget is namespaced; one victim is the dry run's question
    auto list = client_.List(pdbs->Path(ns));
    if (!list.ok()) {
      // Without list on poddisruptionbudgets (an older ClusterRole) the dry runs still stand.
      Log("extender")
          ->warn(
              "preemption for {}/{}: cannot read the PodDisruptionBudgets of namespace {} ({}); "
              "relying on each victim's dry run (grant list on policy/poddisruptionbudgets)",
              plan.ns, plan.name, ns, std::string(list.status().message()));
      continue;
    }
    if (!list->contains("items") || (*list)["items"].empty()) continue;
    // The victims a budget guards at eviction: running pods not being deleted (eviction.go
    // evicts pending, finished and terminating pods without asking any budget).
    std::vector<std::pair<std::string, nlohmann::json>> guarded;
    for (const auto* v : victims) {
      auto pod = client_.Get(pods->Path(ns, v->name));
      if (!pod.ok() || pod->value("metadata", nlohmann::json::object()).value("uid", "") != v->uid) continue;
      const nlohmann::json& meta = (*pod)["metadata"];
      const std::string phase = pod->value("status", nlohmann::json::object()).value("phase", "Pending");
      if (phase != "Running" || meta.contains("deletionTimestamp")) continue;
      guarded.emplace_back(v->name, meta.value("labels", nlohmann::json::object()));
    }
    for (const auto& pdb : (*list)["items"]) {
      const auto sel = k8s::BudgetSelector(pdb);
      if (!sel) continue;  // guards no pod
      std::vector<std::string> covered;
      for (const auto& [name, labels] : guarded) {
        if (sel->Matches(labels)) covered.push_back(Cat(ns, "/", name));
      }
      if (covered.size() < 2) continue;
      const nlohmann::json meta = pdb.value("metadata", nlohmann::json::object());
      const nlohmann::json status = pdb.value("status", nlohmann::json::object());
      // A status the disruption controller has not brought up to this spec yet says nothing.
      if (meta.contains("generation") &&
          status.value("observedGeneration", int64_t{0}) < meta.value("generation", int64_t{0})) {
        continue;
      }
      const int64_t allowed = status.value("disruptionsAllowed", int64_t{0});
      if (allowed < static_cast<int64_t>(covered.size())) {
        return Cat("PodDisruptionBudget ", ns, "/", meta.value("name", ""), " allows ", allowed,
                   " disruption(s) now and guards ", covered.size(), " of the victims (", Join(covered, ", "), ")");
      }
    }
  }
  return "";
}

void Extender::CarryOut(const PreemptionPlan& plan, std::stop_token stop) {
  const k8s::ObjectRef preemptor{"v1", "Pod", plan.ns, plan.name, plan.uid};
  const std::string names = VictimNames(plan);
  Log("extender")
      ->info("preempting for {}/{} (priority {}) on {}: evicting {}{}", plan.ns, plan.name, plan.priority, plan.node,
             names,
             plan.pdb_violations > 0 ? Cat(" (", plan.pdb_violations,
                                           " of them guarded by a PodDisruptionBudget that allows no "
                                           "more disruptions now; no node's plan breaks fewer)")
                                     : "");
  (void)events_.Record(preemptor, "Normal", "Preempting", "Preempt",
                       Cat("Preempting ", names, " on node ", plan.node,
                           ": lower-priority pods holding the GPU memory or cores this pod needs"));
  k8s::EvictOptions eo;
  eo.max_wait = opts_.eviction_wait;
  eo.stop = stop;
  auto blocked = [&](const std::string& note) {
    state_.PreemptionFailed(plan.uid);
    metrics_.Count("kgpu_extender_preemptions_total", {{"result", "blocked"}});
    Log("extender")->warn("preemption for {}/{}: {}", plan.ns, plan.name, note);
    (void)events_.Record(preemptor, "Warning", "PreemptionBlocked", "Preempt", note);
  };
  auto refused = [&](const PreemptionPlan::Victim& v, const absl::Status& st, std::string_view when) {
    blocked(Cat("Cannot preempt ", v.ns, "/", v.name, " on node ", plan.node, when, ": ", st.message(),
                " (a PodDisruptionBudget forbids it now, or the API failed); tried again later"));
  };
  // Each victim's eviction asked as a dry run first: a PodDisruptionBudget that forbids one of
  // them now stops the preemption before any victim is evicted for nothing. A dry run asks for
  // one disruption; a budget guarding several victims must allow as many, read from its status.
  if (plan.victims.size() > 1) {
    k8s::EvictOptions dry = eo;
    dry.dry_run = true;
    for (const auto& v : plan.victims) {
      if (stop.stop_requested()) return;
      dry.uid = v.uid;
      absl::Status st = client_.Evict(v.ns, v.name, dry);
      if (st.ok() || k8s::IsApiConflict(st)) continue;
      refused(v, st, " (asked as a dry run, nothing evicted)");
      return;
    }
    if (stop.stop_requested()) return;
    if (std::string shortfall = BudgetShortfall(plan); !shortfall.empty()) {
      blocked(Cat("Cannot preempt ", names, " on node ", plan.node, ": ", shortfall,
                  "; nothing evicted, tried again later"));
      return;
    }
  }
  for (const auto& v : plan.victims) {
    // The plan may be stale by now: the preemptor bound or gone, the hold over, leadership lost.
    std::string why = stop.stop_requested() ? "the extender is stopping" : NotReadyReason();
    if (why.empty() && !Leads()) why = "this replica no longer leads";
    if (why.empty() && state_.PreemptingOn(plan.uid) != plan.node) {
      why = "its hold on the node ended (the pod was bound or deleted, or the hold expired)";
    }
    if (!why.empty()) {
      Log("extender")
          ->info("preemption for {}/{} stopped before evicting {}/{}: {}", plan.ns, plan.name, v.ns, v.name, why);
      return;
    }
    const k8s::ObjectRef victim{"v1", "Pod", v.ns, v.name, v.uid};
    eo.uid = v.uid;
    absl::Status st = client_.Evict(v.ns, v.name, eo);
    if (k8s::IsApiConflict(st)) {  // a successor of the same name: the victim itself is gone
      Log("extender")
          ->info("preemption for {}/{}: {}/{} was replaced by a new pod of that name (not evicted)", plan.ns, plan.name,
                 v.ns, v.name);
      continue;
    }
    if (!st.ok()) {
      if (absl::IsCancelled(st)) return;
      refused(v, st, "");
      return;
    }
    metrics_.Count("kgpu_extender_preemption_victims_total", {});
    (void)events_.Record(victim, "Normal", "Preempted", "Preempt",
                         Cat("Preempted by pod ", plan.ns, "/", plan.name, " (priority ", plan.priority, ") on node ",
                             plan.node, " (kgpu extender: GPU memory or cores)"));
  }
}

std::string Extender::MetricsText() const {
  // The state's figures at this scrape (their families are declared in metrics.cc).
  const auto s = state_.Stats();
  metrics_.Set("kgpu_extender_nodes", static_cast<double>(s.nodes));
  metrics_.Set("kgpu_extender_pods_booked", static_cast<double>(s.booked));
  metrics_.Set("kgpu_extender_record_conflicts_total", static_cast<double>(s.record_conflicts));
  metrics_.Set("kgpu_extender_records_waiting", static_cast<double>(s.records_waiting));
  metrics_.Set("kgpu_extender_bad_records_total", static_cast<double>(s.bad_records));
  metrics_.Set("kgpu_extender_gpus_reporting_usage", static_cast<double>(s.gpus_reporting_usage));
  metrics_.Set("kgpu_extender_gpus_untracked_memory", static_cast<double>(s.gpus_untracked));
  metrics_.Set("kgpu_extender_gpu_untracked_memory_mib", static_cast<double>(s.untracked_mib));
  metrics_.Set("kgpu_extender_ready", NotReadyReason().empty() ? 1 : 0);
  metrics_.Set("kgpu_extender_leader", Leads() ? 1 : 0);
  return metrics_.Text();
}

absl::Status Extender::Start() {
  // The address first: a malformed one is refused before anything is set up.
  if (auto a = ParseListenAddress("--address", opts_.address); !a.ok()) return a.status();
  if (auto st = MakeHttpServer(); !st.ok()) return st;  // and the TLS files, before anything starts
  if (auto st = state_.Init(); !st.ok()) return st;
  k8s::InformerOptions no;
  no.path = "/api/v1/nodes";
  nodes_ = std::make_unique<k8s::Informer>(client_, no);
  nodes_->AddHandler(
      {[this](const json& n) { state_.UpsertNode(n); }, [this](const json&, const json& n) { state_.UpsertNode(n); },
       [this](const json& n) { state_.RemoveNode(n.value("metadata", json::object()).value("name", "")); }});
  k8s::InformerOptions po;
  po.path = "/api/v1/pods";
  pods_ = std::make_unique<k8s::Informer>(client_, po);
  pods_->AddHandler({[this](const json& p) { state_.UpsertPod(p); },
                     [this](const json&, const json& p) { state_.UpsertPod(p); },
                     [this](const json& p) { state_.RemovePod(p); }});
  k8s::InformerOptions bo;
  bo.path = k8s::FindResource("poddisruptionbudgets")->Path();
  budgets_ = std::make_unique<k8s::Informer>(client_, bo);
  budgets_->AddHandler({[this](const json& b) { state_.UpsertBudget(b); },
                        [this](const json&, const json& b) { state_.UpsertBudget(b); },
                        [this](const json& b) { state_.RemoveBudget(b); }});
  // Nodes first, so that pods find their nodes (a pod whose node comes later is booked then).
  nodes_->Start();
  pods_->Start();
  budgets_->Start();
  // Plans left in the queue at Stop are dropped: their holds expire.
  preemptions_.Start([this](PreemptionPlan& plan, std::stop_token stop) { CarryOut(plan, stop); });
  pending_events_.Start([this](PendingEvent& e, std::stop_token) {
    if (auto st = events_.Record(e.regarding, e.type, e.reason, e.action, e.note); !st.ok()) {
      metrics_.Count("kgpu_extender_events_total", {{"result", "failed"}});
      Log("extender")
          ->warn("event {} on pod {}/{}: {}", e.reason, e.regarding.ns, e.regarding.name, std::string(st.message()));
    } else {
      metrics_.Count("kgpu_extender_events_total", {{"result", "written"}});
    }
  });

  const int threads = std::max(2, opts_.threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(64u << 20);
  // An idle keep-alive connection holds a worker, and holds up Stop(), until this timeout: httplib
  // checks for a stopped server only between requests. 1 s (httplib's default is 5): a pod's
  // filter, prioritize and bind calls come back to back, so kube-scheduler still reuses its
  // connections within a scheduling burst, and SIGTERM -> exit is about a second, not 6 (the
  // figures are extender_bench's).
  http_->set_keep_alive_timeout(1);
  // httplib writes a response's headers and its body in two send() calls. Without TCP_NODELAY,
  // Nagle holds the body until the client ACKs the headers, and the client (waiting for the body)
  // delays that ACK by 40 ms: every verb answered in 40 ms or more (strace, extender_bench at
  // 1,000 nodes). Go's net package — kube-scheduler's client — sets TCP_NODELAY on its side, so
  // this side is the one left. Accepted sockets inherit it from the listening socket.
  http_->set_tcp_nodelay(true);
  // httplib closes a keep-alive connection after 5 requests by default: kube-scheduler would open
  // a new connection (and this server hand it a new worker) every fifth verb.
  http_->set_keep_alive_max_count(1000);
  auto verb = [this](std::function<Reply(const httplib::Request&)> f) {
    return [this, f = std::move(f)](const httplib::Request& req, httplib::Response& res) {
      if (!opts_.insecure_http && !web::PresentedClientCertificate(req)) {
        metrics_.Count("kgpu_extender_unauthenticated_total", {{"verb", req.path.substr(req.path.rfind('/') + 1)}});
        Log("extender")->debug("refused {} from {}: no client certificate", req.path, req.remote_addr);
        res.status = 403;
        res.set_content(json{{"Error",
                              "kgpu extender: a client certificate signed by its --client-ca-file is required "
                              "(kube-scheduler: the extender's tlsConfig certFile and keyFile)"}}
                            .dump(),
                        "application/json");
        AnswerUncompressed(req);
        return;
      }
      const Reply r = f(req);
      res.status = r.code;
      res.set_content(r.body, "application/json");
      // Never gzipped, though kube-scheduler's Go client asks for it: these answers cross a
      // cluster network within one scheduling cycle, where compressing 5,000 node names costs
      // more than sending them (filter p50 3.2 ms gzipped vs 1.1 ms at 5,000 nodes; extender_bench).
      AnswerUncompressed(req);
      if (stopping_) res.set_header("Connection", "close");
    };
  };
  http_->Post(R"((.*)/filter)", verb([this](const httplib::Request& req) { return Filter(req.body); }));
  http_->Post(R"((.*)/prioritize)", verb([this](const httplib::Request& req) { return Prioritize(req.body); }));
  http_->Post(R"((.*)/bind)", verb([this](const httplib::Request& req) {
                // headers.find, not has_header(): that one lives in libcpp-httplib, which kgpu loads
                // lazily (src/cli/lazy_httplib.cc forwards only what the servers need).
                return Bind(req.body, req.headers.find(kForwardedHeader) != req.headers.end());
              }));
  http_->Post(R"((.*)/preempt)", verb([this](const httplib::Request& req) { return Preempt(req.body); }));
  http_->Get("/healthz",
             [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  http_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    const std::string why = NotReadyReason();
    res.status = why.empty() ? 200 : 503;
    res.set_content(why.empty() ? "ok\n" : why + "\n", "text/plain");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(), "text/plain; version=0.0.4");
  });
  auto bound = BindListenAddress(*http_, "--address", opts_.address);
  if (!bound.ok()) return bound.status();
  port_ = *bound;
  std::string advertise = opts_.advertise_address;
  if (const size_t colon = advertise.rfind(':');
      colon != std::string::npos && advertise.find(':') != colon && advertise.front() != '[') {
    advertise = Cat(UrlHost(advertise.substr(0, colon)), advertise.substr(colon));  // $(POD_IP) of IPv6
  }
  if (advertise.empty()) {
    const auto a = ParseListenAddress("--address", opts_.address);
    if (a->host != "0.0.0.0" && a->host != "::" && !a->host.empty()) advertise = Cat(UrlHost(a->host), ":", port_);
  }
  if (opts_.leader_elect) {
    k8s::LeaderElectionConfig lc;
    lc.ns = opts_.lease_namespace;
    lc.name = opts_.lease_name;
    lc.identity = identity_;
    lc.lease_duration = opts_.lease_duration;
    lc.renew_deadline = opts_.renew_deadline;
    lc.retry_period = opts_.retry_period;
    lc.on_new_leader = [](const std::string& who) { Log("extender")->info("leader is now {}", who); };
    lc.holder_annotations[kLeaderAddressAnnotation] = advertise;
    elector_ = std::make_unique<k8s::LeaderElector>(client_, lc);
    if (advertise.empty()) {
      Log("extender")
          ->warn(
              "--leader-elect without --advertise-address (and --address {} names no one address): while this "
              "replica leads, the others refuse the binds that reach them",
              opts_.address);
    }
    ForwardOptions fo;
    fo.insecure_http = opts_.insecure_http;
    fo.peer_cert_file = opts_.peer_cert_file;
    fo.peer_key_file = opts_.peer_key_file;
    fo.leader_cert_file = opts_.tls_cert_file;
    forwarder_ = std::make_unique<BindForwarder>(fo);
    // Before the first request: until the Lease is read, this replica is a standby.
    elector_thread_ = std::jthread([this](std::stop_token stop) {
      while (!stop.stop_requested()) elector_->Run(stop);
    });
  }
  http_thread_ = ListenOnThread(*http_);
  Log("extender")
      ->info("serving {} on {} (port {}; policy {})",
             http_->is_valid() ? (opts_.insecure_http ? "HTTP" : "HTTPS, verbs for client certificates only") : "?",
             opts_.address, port_, opts_.state.policy);
  return absl::OkStatus();
}

absl::Status Extender::MakeHttpServer() {
  const bool any_tls = !opts_.tls_cert_file.empty() || !opts_.tls_key_file.empty() || !opts_.client_ca_file.empty() ||
                       !opts_.peer_cert_file.empty() || !opts_.peer_key_file.empty();
  if (opts_.insecure_http) {
    if (any_tls) {
      return absl::InvalidArgumentError(
          "--insecure-http serves plain HTTP: drop --tls-cert-file, --tls-key-file, --client-ca-file, "
          "--peer-cert-file and --peer-key-file, or drop --insecure-http");
    }
    Log("extender")->warn("--insecure-http: any client that reaches this port can bind pending pods (tests only)");
    http_ = std::make_unique<httplib::Server>();
    return absl::OkStatus();
  }
  std::vector<std::string> missing;
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--tls-cert-file", &opts_.tls_cert_file},
                                    {"--tls-key-file", &opts_.tls_key_file},
                                    {"--client-ca-file", &opts_.client_ca_file}}) {
    if (value->empty()) missing.push_back(flag);
  }
  if (opts_.leader_elect) {
    for (const auto& [flag, value] :
         {std::pair<const char*, const std::string*>{"--peer-cert-file", &opts_.peer_cert_file},
          {"--peer-key-file", &opts_.peer_key_file}}) {
      if (value->empty()) missing.push_back(flag);
    }
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        Cat("HTTPS is required, with filter, prioritize, preempt and bind answered only for clients with a "
            "certificate signed by --client-ca-file (kube-scheduler's extender tlsConfig certFile/keyFile): missing ",
            Join(missing, ", "),
            opts_.leader_elect ? " (with --leader-elect a standby passes binds on to the leader, presenting "
                                 "--peer-cert-file, signed by --client-ca-file)"
                               : "",
            " (--insecure-http serves plain HTTP to any caller, for tests only)"));
  }
  // Bad input (a file that is missing or not PEM), not usage: exit 1, as every command's unreadable file.
  for (const auto& [flag, path, what] :
       {std::tuple<const char*, const std::string*, const char*>{"--tls-cert-file", &opts_.tls_cert_file,
                                                                 "the extender's serving certificate"},
        {"--tls-key-file", &opts_.tls_key_file, "its key"},
        {"--client-ca-file", &opts_.client_ca_file, "the CA that signed kube-scheduler's client certificate"},
        {"--peer-cert-file", &opts_.peer_cert_file, "the client certificate a standby presents to the leader"},
        {"--peer-key-file", &opts_.peer_key_file, "its key"}}) {
    std::error_code ec;
    if (path->empty()) continue;  // the peer's, without --leader-elect
    if (!std::filesystem::is_regular_file(*path, ec)) {
      return absl::FailedPreconditionError(
          Cat(flag, " ", *path, ": no such file (", what, ", PEM; deploy/extender/gen-certs.sh makes them)"));
    }
  }
  web::WebConfig wc;
  wc.origin = "--tls-cert-file/--tls-key-file/--client-ca-file";
  wc.tls.enabled = true;
  wc.tls.cert_file = opts_.tls_cert_file;
  wc.tls.key_file = opts_.tls_key_file;
  wc.tls.client_ca_file = opts_.client_ca_file;
  // Asked for, verified when given (a bad one fails the handshake); the verbs refuse a client
  // without one, the probes and /metrics do not.
  wc.tls.client_auth_type = "VerifyClientCertIfGiven";
  auto server = web::MakeServer(&wc);
  if (!server.ok()) return server.status();
  http_ = std::move(*server);
  return absl::OkStatus();
}

void Extender::QueueEvent(PendingEvent e) {
  if (!pending_events_.Push(std::move(e))) metrics_.Count("kgpu_extender_events_total", {{"result", "dropped"}});
}

void Extender::Stop() {
  // The Lease first: the standby takes over now, not after the HTTP drain below (this replica
  // answers "stopping", not ready, from here on). Every reply from now on closes its connection, so
  // kube-scheduler reconnects through the Service to the replica that leads.
  stopping_ = true;
  if (elector_thread_.joinable()) {
    elector_thread_.request_stop();
    elector_thread_.join();
  }
  if (http_) http_->stop();
  preemptions_.Stop();
  pending_events_.Stop();
  // Joining the listener waits for its workers: httplib lets an idle keep-alive connection sit for
  // the keep-alive timeout (1 s) without noticing that the server stopped.
  if (http_thread_.joinable()) http_thread_.join();
  // All three watches asked at once, then waited for: about a second in all, not one each.
  for (auto* inf : {budgets_.get(), pods_.get(), nodes_.get()}) {
    if (inf) inf->RequestStop();
  }
  if (budgets_) budgets_->Stop();
  if (pods_) pods_->Stop();
  if (nodes_) nodes_->Stop();
}

}  // namespace kgpu::extender
