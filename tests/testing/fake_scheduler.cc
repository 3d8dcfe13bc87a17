#include "testing/fake_scheduler.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <httplib.h>

#include "absl/cleanup/cleanup.h"
#include "common/strings.h"
#include "extender/request.h"
#include "extender/wire.h"
#include "k8s/events.h"
#include "k8s/informer.h"
#include "k8s/node_fit.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;

bool Counted(const std::string& name, const std::vector<std::string>& ignored) {
  if (std::find(ignored.begin(), ignored.end(), name) != ignored.end()) return false;
  return name == extender::kWholeGpu || name == extender::kShares || name.rfind(extender::kMigPrefix, 0) == 0;
}

std::map<std::string, int64_t> ContainerCounted(const json& c, const std::vector<std::string>& ignored) {
  std::map<std::string, int64_t> out;
  const json res = c.value("resources", json::object());
  for (const char* section : {"requests", "limits"}) {
    const auto it = res.find(section);
    if (it == res.end() || !it->is_object()) continue;
    for (auto r = it->begin(); r != it->end(); ++r) {
      if (!Counted(r.key(), ignored)) continue;
      auto v = extender::WholeQuantity(*r, r.key());
      if (v.ok()) out[r.key()] = *v;
    }
  }
  return out;
}

int64_t Priority(const json& pod) {
  const json spec = pod.value("spec", json::object());
  return spec.contains("priority") && spec["priority"].is_number_integer() ? spec["priority"].get<int64_t>() : 0;
}

std::string Key(const json& pod) {
  const json m = pod.value("metadata", json::object());
  return m.value("namespace", "default") + "/" + m.value("name", "");
}

bool Terminal(const json& pod) {
  const std::string phase = pod.value("status", json::object()).value("phase", "");
  return phase == "Succeeded" || phase == "Failed";
}

}  // namespace

std::map<std::string, int64_t> CountedRequests(const json& pod, const std::vector<std::string>& ignored) {
  std::map<std::string, int64_t> sum;
  const json spec = pod.value("spec", json::object());
  if (auto cs = spec.find("containers"); cs != spec.end() && cs->is_array()) {
    for (const auto& c : *cs) {
      for (const auto& [k, v] : ContainerCounted(c, ignored)) sum[k] += v;
    }
  }
  if (auto is = spec.find("initContainers"); is != spec.end() && is->is_array()) {
    for (const auto& c : *is) {
      for (const auto& [k, v] : ContainerCounted(c, ignored)) sum[k] = std::max(sum[k], v);
    }
  }
  return sum;
}

// kube-scheduler's cache (pkg/scheduler/internal/cache): per node, its allocatable and the
// counted requests of the pods bound or assumed there, kept up to date by the informers' events
// and by assume/forget, so that a scheduling cycle never walks every pod.
// Counted quantities by interned resource id (Impl::ResId): a scheduling cycle compares them for
// a thousand nodes, where string-keyed maps cost more than the extender's whole decision.
using Amounts = std::vector<int64_t>;
int64_t At(const Amounts& a, int id) {
  return static_cast<size_t>(id) < a.size() ? a[static_cast<size_t>(id)] : 0;
}
void Add(Amounts& a, int id, int64_t v) {
  if (a.size() <= static_cast<size_t>(id)) a.resize(static_cast<size_t>(id) + 1);
  a[static_cast<size_t>(id)] += v;
}
using Counts = std::vector<std::pair<int, int64_t>>;  // resource id, quantity

struct CachedPod {
  std::string node;
  Counts requests;
  int64_t priority = 0;
  bool assumed = false;
  json pod;
};

struct CachedNode {
  std::string name;
  json node;
  Amounts allocatable;
  Amounts used;
  std::set<std::string> pods;  // pod keys
};

struct FakeScheduler::Impl {
  std::unique_ptr<k8s::Informer> nodes, pods;
  std::unique_ptr<k8s::EventRecorder> events;
  std::mutex cycle_mu;  // one scheduling cycle at a time (binding cycles run concurrently)
  std::mutex cache_mu;
  std::map<std::string, CachedNode> node_cache;
  std::vector<CachedNode*> node_order;  // the snapshot's node list (std::map nodes do not move)
  bool order_dirty = true;
  size_t next_start = 0;                       // nextStartNodeIndex
  std::map<std::string, CachedPod> pod_cache;  // pod key -> bound or assumed pod
  std::mutex clients_mu;
  std::vector<std::unique_ptr<httplib::Client>> clients;
  std::string base, path;
  std::vector<std::string> ignored;
  std::deque<std::string> res_names;  // id -> name (a deque: the names never move)
  std::unordered_map<std::string, int> res_ids;

  int ResId(const std::string& name) {
    const auto [it, added] = res_ids.try_emplace(name, static_cast<int>(res_names.size()));
    if (added) res_names.push_back(name);
    return it->second;
  }
  Counts Interned(const std::map<std::string, int64_t>& named) {
    Counts out;
    for (const auto& [k, v] : named) out.emplace_back(ResId(k), v);
    return out;
  }
  void RemovePodLocked(const std::string& key) {
    auto it = pod_cache.find(key);
    if (it == pod_cache.end()) return;
    if (auto n = node_cache.find(it->second.node); n != node_cache.end()) {
      for (const auto& [k, v] : it->second.requests) Add(n->second.used, k, -v);
      n->second.pods.erase(key);
    }
    pod_cache.erase(it);
  }
  void AddPodLocked(const std::string& key, const std::string& node, const json& pod, bool assumed) {
    RemovePodLocked(key);
    CachedPod c{node, Interned(CountedRequests(pod, ignored)), Priority(pod), assumed, pod};
    auto& n = node_cache[node];  // a pod may arrive before its node
    for (const auto& [k, v] : c.requests) Add(n.used, k, v);
    n.pods.insert(key);
    pod_cache[key] = std::move(c);
  }
  void OnPod(const json& p) {
    const std::string key = Key(p);
    const std::string node = p.value("spec", json::object()).value("nodeName", "");
    std::lock_guard lock(cache_mu);
    if (Terminal(p)) {
      RemovePodLocked(key);
    } else if (!node.empty()) {
      AddPodLocked(key, node, p, false);  // confirms an assumed pod
    } else if (auto it = pod_cache.find(key); it != pod_cache.end() && !it->second.assumed) {
      RemovePodLocked(key);
    }
  }
  void OnNode(const json& n) {
    const std::string name = n.value("metadata", json::object()).value("name", "");
    std::lock_guard lock(cache_mu);
    auto& c = node_cache[name];
    order_dirty = order_dirty || c.node.is_null();
    c.name = name;
    c.node = n;
    c.allocatable.clear();
    const json alloc = n.value("status", json::object()).value("allocatable", json::object());
    for (auto a = alloc.begin(); a != alloc.end(); ++a) {
      if (!Counted(a.key(), ignored)) continue;
      if (auto q = extender::WholeQuantity(*a, a.key()); q.ok()) Add(c.allocatable, ResId(a.key()), *q);
    }
  }
  void OnNodeGone(const json& n) {
    std::lock_guard lock(cache_mu);
    node_cache.erase(n.value("metadata", json::object()).value("name", ""));
    order_dirty = true;
  }
};

FakeScheduler::FakeScheduler(k8s::Client& api, FakeSchedulerOptions options) : api_(api), opts_(std::move(options)) {
  impl_ = std::make_unique<Impl>();
  impl_->ignored = opts_.ignored;
  const auto scheme = opts_.url_prefix.find("://");
  const auto slash = opts_.url_prefix.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  impl_->base = slash == std::string::npos ? opts_.url_prefix : opts_.url_prefix.substr(0, slash);
  impl_->path = slash == std::string::npos ? "" : opts_.url_prefix.substr(slash);
  while (!impl_->path.empty() && impl_->path.back() == '/') impl_->path.pop_back();
  k8s::InformerOptions no;
  no.path = "/api/v1/nodes";
  impl_->nodes = std::make_unique<k8s::Informer>(api_, no);
  impl_->nodes->AddHandler({[this](const json& n) { impl_->OnNode(n); },
                            [this](const json&, const json& n) { impl_->OnNode(n); },
                            [this](const json& n) { impl_->OnNodeGone(n); }});
  k8s::InformerOptions po;
  po.path = "/api/v1/pods";
  impl_->pods = std::make_unique<k8s::Informer>(api_, po);
  impl_->pods->AddHandler({[this](const json& p) { impl_->OnPod(p); },
                           [this](const json&, const json& p) { impl_->OnPod(p); },
                           [this](const json& p) {
                             std::lock_guard lock(impl_->cache_mu);
                             impl_->RemovePodLocked(Key(p));
                           }});
  impl_->nodes->Start();
  impl_->pods->Start();
  impl_->events = std::make_unique<k8s::EventRecorder>(api_, "default-scheduler", "kgpu-fake-scheduler");
}

FakeScheduler::~FakeScheduler() {
  impl_->pods->Stop();
  impl_->nodes->Stop();
}

bool FakeScheduler::WaitForSync(std::chrono::milliseconds timeout) {
  return impl_->nodes->WaitForSync(timeout) && impl_->pods->WaitForSync(timeout);
}

uint64_t FakeScheduler::calls(const std::string& verb) const {
  std::lock_guard lock(mu_);
  const auto it = calls_.find(verb);
  return it == calls_.end() ? 0 : it->second;
}

namespace {
thread_local std::chrono::nanoseconds tl_extender{0};  // this thread's time in extender calls
}  // namespace

absl::StatusOr<std::string> FakeScheduler::Post(const std::string& verb, const std::string& body) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::Cleanup count = [t0] { tl_extender += std::chrono::steady_clock::now() - t0; };
  {
    std::lock_guard lock(mu_);
    ++calls_[verb];
  }
  auto fresh = [&] {
    auto n = opts_.cert_file.empty() ? std::make_unique<httplib::Client>(impl_->base)
                                     : std::make_unique<httplib::Client>(impl_->base, opts_.cert_file, opts_.key_file);
    if (opts_.ca_file.empty()) {
      n->enable_server_certificate_verification(false);  // kube-scheduler: no caFile -> Insecure
    } else {
      n->set_ca_cert_path(opts_.ca_file);
      n->enable_server_certificate_verification(true);
    }
    n->set_keep_alive(true);
    n->set_tcp_nodelay(true);   // as Go's net.Dialer (kube-scheduler's HTTP client) does by default
    n->set_read_timeout(5, 0);  // httpTimeout 0 -> 5 s
    n->set_write_timeout(5, 0);
    return n;
  };
  std::unique_ptr<httplib::Client> c;
  {
    std::lock_guard lock(impl_->clients_mu);
    if (!impl_->clients.empty()) {
      c = std::move(impl_->clients.back());
      impl_->clients.pop_back();
    }
  }
  const bool reused = c != nullptr;
  if (!c) c = fresh();
  const std::string url = impl_->path + "/" + verb;
  auto res = c->Post(url, body, "application/json");
  if (!res && reused) {
    // An idle connection the server closed (its keep-alive timeout). Go's transport learns that
    // from its background read and dials again; httplib's client finds out only when it writes
    // (over TLS, the server's close_notify makes the socket look alive), so dial again here.
    c = fresh();
    res = c->Post(url, body, "application/json");
  }
  if (!res)
    return absl::UnavailableError(
        Cat("failed ", verb, " with extender at URL ", opts_.url_prefix, ": ", httplib::to_string(res.error())));
  if (res->status != 200) {
    return absl::UnavailableError(
        Cat("failed ", verb, " with extender at URL ", opts_.url_prefix, ", code ", res->status));
  }
  std::string out = res->body;
  std::lock_guard lock(impl_->clients_mu);
  impl_->clients.push_back(std::move(c));
  return out;
}

void FakeScheduler::Event(const json& pod, const std::string& reason, const std::string& message) {
  const json m = pod.value("metadata", json::object());
  k8s::ObjectRef ref{"v1", "Pod", m.value("namespace", "default"), m.value("name", ""), m.value("uid", "")};
  (void)impl_->events->Record(ref, reason == "Scheduled" ? "Normal" : "Warning", reason, "Scheduling", message);
}

size_t NumFeasibleNodesToFind(int percentage, size_t all) {
  // kube-scheduler's numFeasibleNodesToFind (schedule_one.go): every node below 100 nodes;
  // percentageOfNodesToScore 0 means adaptive, 50 % - 1 % per 125 nodes, at least 5 %; never
  // fewer than 100 nodes.
  constexpr size_t kMinFeasible = 100;
  if (all < kMinFeasible || percentage >= 100) return all;
  int64_t pct = percentage;
  if (pct <= 0) pct = std::max<int64_t>(5, 50 - static_cast<int64_t>(all) / 125);
  return std::max(kMinFeasible, all * static_cast<size_t>(pct) / 100);
}

absl::StatusOr<ScheduleOutcome> FakeScheduler::Decide(const json& pod) {
  if (!impl_->nodes->WaitForSync(std::chrono::seconds(30)) || !impl_->pods->WaitForSync(std::chrono::seconds(30))) {
    return absl::DeadlineExceededError("fake scheduler: informers did not sync");
  }
  ScheduleOutcome out;
  const auto want_named = CountedRequests(pod, opts_.ignored);
  Counts want;  // interned under cache_mu
  const int64_t prio = Priority(pod);
  // The resource a node lacks (nullptr: it has room).
  auto lacks = [&](const CachedNode& n, const Amounts& used) -> const std::string* {
    for (const auto& [k, v] : want) {
      if (At(n.allocatable, k) - At(used, k) < v) return &impl_->res_names[static_cast<size_t>(k)];
    }
    return nullptr;
  };
  auto fits = [&](const CachedNode& n, const Amounts& used) -> std::string {
    const std::string* k = lacks(n, used);
    return k == nullptr ? "" : Cat("Insufficient ", *k);
  };
  // In-tree filtering over the cache, from nextStartNodeIndex, until numFeasibleNodesToFind nodes
  // pass (findNodesThatPassFilters); only those go to the extender.
  std::map<std::string, json> by_name;  // survivors' Node objects (nodeCacheCapable: false)
  std::vector<std::string> survivors;
  // node, the resource it lacks (nullptr: refused by the pod's own constraints, `why`).
  struct Rejected {
    std::string node;
    const std::string* lacks;
    std::string why;
  };
  std::vector<Rejected> rejected;
  size_t all_nodes = 0;
  {
    std::lock_guard lock(impl_->cache_mu);
    want = impl_->Interned(want_named);
    if (impl_->order_dirty) {
      impl_->node_order.clear();
      for (auto& [name, n] : impl_->node_cache) {
        if (!n.node.is_null()) impl_->node_order.push_back(&n);
      }
      impl_->order_dirty = false;
    }
    const auto& order = impl_->node_order;
    all_nodes = order.size();
    const size_t find = NumFeasibleNodesToFind(opts_.percentage_of_nodes_to_score, all_nodes);
    size_t processed = 0;
    for (; processed < all_nodes && survivors.size() < find; ++processed) {
      const CachedNode& n = *order[(impl_->next_start + processed) % all_nodes];
      // NodeUnschedulable, NodeAffinity, TaintToleration (and the Ready condition), then
      // NodeResourcesFit, as kube-scheduler's filter plugins run.
      if (std::string why = k8s::NodeRefusesPod(pod, n.node); !why.empty()) {
        rejected.push_back({n.name, nullptr, std::move(why)});
      } else if (const std::string* k = lacks(n, n.used); k != nullptr) {
        rejected.push_back({n.name, k, ""});
      } else {
        survivors.push_back(n.name);
        if (!opts_.node_cache_capable) by_name[n.name] = n.node;
      }
    }
    impl_->next_start = all_nodes == 0 ? 0 : (impl_->next_start + processed) % all_nodes;
  }
  std::map<std::string, std::string> reasons, resolvable;  // the extender's, then (no node left) in-tree's
  if (!survivors.empty()) {
    std::string body;
    if (opts_.node_cache_capable) {
      body = extender::EncodeExtenderArgs(pod, survivors);
    } else {
      std::vector<json> full;
      for (const auto& s : survivors) full.push_back(by_name[s]);
      body = extender::EncodeExtenderArgsFull(pod, full);
    }
    auto reply = Post("filter", body);
    if (!reply.ok()) return reply.status();
    auto fr = extender::ParseFilterResult(*reply);
    if (!fr.ok()) return fr.status();
    if (!fr->error.empty()) return absl::UnavailableError(fr->error);
    std::vector<std::string> passed;
    if (opts_.node_cache_capable && fr->node_names) {
      // kube-scheduler checks every name against a set of the input; an extender that keeps the
      // input's order (ours does) is checked by one walk, anything else through the set.
      std::optional<std::unordered_set<std::string_view>> sent;
      size_t at = 0;
      for (const auto& n : *fr->node_names) {
        while (!sent && at < survivors.size() && survivors[at] != n) ++at;
        if (!sent && at == survivors.size()) sent.emplace(survivors.begin(), survivors.end());
        if (!sent) {
          ++at;
        } else if (!sent->contains(n)) {
          return absl::InternalError(Cat("extender \"", opts_.url_prefix, "\" claims a filtered node \"", n,
                                         "\" which is not found in the input node list"));
        }
        passed.push_back(n);
      }
    } else if (fr->nodes) {
      for (const auto& n : *fr->nodes) passed.push_back(n.value("metadata", json::object()).value("name", ""));
    }
    for (const auto& [n, why] : fr->failed_nodes) reasons[n] = resolvable[n] = why;
    for (const auto& [n, why] : fr->failed_and_unresolvable) {
      reasons[n] = why;
      resolvable.erase(n);
    }
    survivors = passed;
  }
  if (survivors.size() == 1) {
    out.node = survivors[0];
    return out;
  }
  if (survivors.size() > 1) {
    auto reply = Post(
        "prioritize", opts_.node_cache_capable ? extender::EncodeExtenderArgs(pod, survivors) : [&] {
          std::vector<json> full;
          for (const auto& s : survivors) full.push_back(by_name[s]);
          return extender::EncodeExtenderArgsFull(pod, full);
        }());
    std::vector<extender::HostPriority> list;
    if (reply.ok()) {  // prioritize errors are ignored
      if (auto l = extender::ParseHostPriorityList(*reply); l.ok()) list = std::move(*l);
    }
    // Per survivor, its score x weight x 10: by position when the reply lists the survivors in
    // their order (ours does), else by name.
    std::vector<int64_t> score(survivors.size(), 0);
    bool aligned = list.size() == survivors.size();
    for (size_t i = 0; aligned && i < list.size(); ++i) aligned = list[i].host == survivors[i];
    if (aligned) {
      for (size_t i = 0; i < list.size(); ++i) score[i] = list[i].score * opts_.weight * 10;
    } else {
      std::unordered_map<std::string_view, int64_t> by_host;
      for (const auto& h : list) by_host[h.host] += h.score * opts_.weight * 10;
      for (size_t i = 0; i < survivors.size(); ++i) {
        if (const auto it = by_host.find(survivors[i]); it != by_host.end()) score[i] = it->second;
      }
    }
    for (size_t i = 0; i < survivors.size(); ++i) out.scores.emplace_back(survivors[i], score[i]);
    // The highest total wins; ties go to the lexically first name.
    const std::string* best = nullptr;
    int64_t best_score = 0;
    for (size_t i = 0; i < survivors.size(); ++i) {
      const std::string& s = survivors[i];
      const int64_t v = score[i];
      if (best == nullptr || v > best_score || (v == best_score && s < *best)) {
        best = &s;
        best_score = v;
      }
    }
    out.node = *best;
    return out;
  }
  // No node: the FailedScheduling message as kube-scheduler writes it, and the nodes that
  // preemption may make room on.
  for (const auto& r : rejected) {
    if (r.lacks == nullptr) {
      reasons[r.node] = r.why;
    } else {
      reasons[r.node] = resolvable[r.node] = Cat("Insufficient ", *r.lacks);
    }
  }
  std::map<std::string, int> counts;
  for (const auto& [n, why] : reasons) ++counts[why];
  std::vector<std::string> parts;  // FitError.Error(): "<count> <reason>" strings, sorted as strings
  for (const auto& [why, c] : counts) parts.push_back(Cat(c, " ", why));
  std::sort(parts.begin(), parts.end());
  out.message = Cat("0/", all_nodes, " nodes are available: ", Join(parts, ", "), ".");
  if (prio <= 0 || resolvable.empty()) return out;
  // Preemption dry run on the resolvable nodes (in-tree fit only), then the extender's preempt.
  std::map<std::string, extender::MetaVictims> candidates;
  std::map<std::string, std::vector<json>> on_node;  // the candidates' victims
  std::vector<std::string> no_victims;
  {
    std::lock_guard lock(impl_->cache_mu);
    for (const auto& [n, why] : resolvable) {
      const auto ni = impl_->node_cache.find(n);
      if (ni == impl_->node_cache.end()) continue;
      Amounts used;
      std::vector<const CachedPod*> lower;
      for (const auto& key : ni->second.pods) {
        const CachedPod& p = impl_->pod_cache.at(key);
        if (p.priority < prio) {
          lower.push_back(&p);
        } else {
          for (const auto& [k, v] : p.requests) Add(used, k, v);
        }
      }
      if (!fits(ni->second, used).empty()) continue;
      std::stable_sort(lower.begin(), lower.end(),
                       [](const CachedPod* a, const CachedPod* b) { return a->priority > b->priority; });
      extender::MetaVictims mv;
      for (const CachedPod* p : lower) {
        auto with = used;
        for (const auto& [k, v] : p->requests) Add(with, k, v);
        if (fits(ni->second, with).empty()) {  // reprieved
          used = std::move(with);
          continue;
        }
        mv.pod_uids.push_back(p->pod.value("metadata", json::object()).value("uid", ""));
        on_node[n].push_back(p->pod);
      }
      if (mv.pod_uids.empty()) {
        no_victims.push_back(n);  // "expected at least one victim pod on node"
        continue;
      }
      candidates[n] = std::move(mv);
    }
  }
  if (candidates.empty()) {
    out.message += Cat(" preemption: 0/", all_nodes, " nodes are available: ",
                       no_victims.empty() ? std::string("no node has lower-priority pods to remove")
                                          : Cat(no_victims.size(), " expected at least one victim pod on node"),
                       ".");
    return out;
  }
  out.preempt_called = true;
  auto reply = Post("preempt", extender::EncodePreemptionArgs(pod, candidates));
  if (!reply.ok()) return reply.status();
  auto kept = extender::ParsePreemptionResult(*reply);
  if (!kept.ok()) return kept.status();
  std::string best;
  for (const auto& [n, mv] : *kept) {
    if (!candidates.contains(n))
      return absl::InternalError(Cat("extender returned node ", n, " that was not a candidate"));
    if (best.empty() || mv.pod_uids.size() < kept->at(best).pod_uids.size()) best = n;
  }
  if (best.empty()) {
    out.message += " preemption: the extender found no node where the victims make room.";
    return out;
  }
  for (const auto& uid : kept->at(best).pod_uids) {
    for (const auto& p : on_node[best]) {
      if (p.value("metadata", json::object()).value("uid", "") != uid) continue;
      const json m = p["metadata"];
      k8s::DeleteOptions d;
      d.grace_period_seconds = 0;
      (void)api_.Delete(k8s::FindResource("pods")->Path(m.value("namespace", "default"), m.value("name", "")), d);
      out.preempted.push_back(Key(p));
    }
  }
  out.message += Cat(" preempted ", out.preempted.size(), " pods on ", best, ".");
  return out;
}

absl::StatusOr<ScheduleOutcome> FakeScheduler::ScheduleOne(const json& pod) {
  absl::StatusOr<ScheduleOutcome> out;
  {
    // The scheduling cycle: one at a time, ending with the pod assumed on its node.
    std::lock_guard cycle(impl_->cycle_mu);
    tl_extender = std::chrono::nanoseconds(0);
    const auto t0 = std::chrono::steady_clock::now();
    out = Decide(pod);
    if (out.ok()) {
      out->cycle = std::chrono::steady_clock::now() - t0;
      out->extender = tl_extender;
    }
    if (!out.ok() || out->node.empty()) return out;
    std::lock_guard lock(impl_->cache_mu);
    impl_->AddPodLocked(Key(pod), out->node, pod, true);
  }
  // The binding cycle, concurrent with the next scheduling cycles.
  const json m = pod.value("metadata", json::object());
  extender::BindingArgs b{m.value("name", ""), m.value("namespace", "default"), m.value("uid", ""), out->node};
  tl_extender = std::chrono::nanoseconds(0);
  auto reply = Post("bind", extender::EncodeBindingArgs(b));
  out->bind = tl_extender;
  std::string err;
  if (!reply.ok()) {
    err = std::string(reply.status().message());
  } else {
    auto e = extender::ParseBindingResult(*reply);
    err = e.ok() ? *e : std::string(e.status().message());
  }
  if (!err.empty()) {
    std::lock_guard lock(impl_->cache_mu);  // ForgetPod
    if (auto it = impl_->pod_cache.find(Key(pod)); it != impl_->pod_cache.end() && it->second.assumed) {
      impl_->RemovePodLocked(Key(pod));
    }
    out->message = Cat("binding rejected: ", err);
    return out;
  }
  out->bound = true;
  return out;
}

void FakeScheduler::RunLoop(std::stop_token stop, std::chrono::milliseconds idle) {
  while (!stop.stop_requested()) {
    if (!impl_->pods->WaitForSync(std::chrono::milliseconds(500))) continue;
    std::vector<json> pending;
    for (const auto& p : impl_->pods->store().List()) {
      const json spec = p.value("spec", json::object());
      if (!spec.value("nodeName", "").empty() ||
          spec.value("schedulerName", "default-scheduler") != opts_.scheduler_name)
        continue;
      if (Terminal(p) || p.value("metadata", json::object()).contains("deletionTimestamp")) continue;
      std::lock_guard lock(impl_->cache_mu);
      if (impl_->pod_cache.contains(Key(p))) continue;  // assumed
      pending.push_back(p);
    }
    std::sort(pending.begin(), pending.end(), [](const json& a, const json& b) {
      if (Priority(a) != Priority(b)) return Priority(a) > Priority(b);
      return a["metadata"].value("creationTimestamp", "") + Key(a) <
             b["metadata"].value("creationTimestamp", "") + Key(b);
    });
    for (const auto& p : pending) {
      if (stop.stop_requested()) return;
      auto r = ScheduleOne(p);
      std::string msg = r.ok() ? r->message : std::string(r.status().message());
      if (r.ok() && r->bound) {
        Event(p, "Scheduled", Cat("Successfully assigned ", Key(p), " to ", r->node));
        continue;
      }
      std::lock_guard lock(mu_);
      if (last_message_[Key(p)] != msg) {
        last_message_[Key(p)] = msg;
        Event(p, "FailedScheduling", msg);
      }
    }
    std::mutex m;
    std::condition_variable_any cv;
    std::unique_lock lock(m);
    cv.wait_for(lock, stop, idle, [] { return false; });
  }
}

}  // namespace kgpu::testing
