// State's preemption: kube-scheduler's preempt verb (which victims make room), the extender's own
// preemption for shortfalls kube-scheduler cannot see (PlanPreemption), the holds that keep a
// preempted node for its preemptor, and the PodDisruptionBudgets both weigh.
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "common/strings.h"
#include "extender/state.h"
#include "extender/state_internal.h"
#include "k8s/selector.h"

namespace kgpu::extender {

using json = nlohmann::json;

std::map<std::string, MetaVictims> State::Preempt(const json& pod, const std::map<std::string, MetaVictims>& victims) {
  std::lock_guard lock(mu_);
  std::map<std::string, MetaVictims> out;
  auto c = CompileLocked(pod);
  if (!c->pod_error.empty()) return out;
  if (!c->wants_gpu) return victims;
  if (auto h = holds_.find(c->uid); h != holds_.end() && h->second.Active(std::chrono::steady_clock::now())) {
    return out;  // our own preemption for it is under way
  }
  for (const auto& [node, mv] : victims) {
    const int id = engine_->cluster().FindNode(node);
    if (id < 0) continue;
    if (!HeldLocked(*c, node).empty()) continue;  // held for a preemption of ours: no second one there
    bool unres = false;
    const std::string why = ExplainLocked(*c, node, &unres, nullptr);
    if (why.empty()) {
      out[node] = mv;  // the GPUs fit already: the victims are for kube-scheduler's own resources
      continue;
    }
    if (unres) continue;  // no victims can make room
    // Take the victims we book off the node, see whether the pod fits, put them back.
    trial_ = true;
    absl::Cleanup end_trial = [&] { trial_ = false; };
    std::vector<std::string> removed;
    for (const auto& uid : mv.pod_uids) {
      auto it = pods_.find(uid);
      if (it == pods_.end() || !it->second.booked || it->second.node != node) continue;
      UnbookLocked(uid, it->second);
      removed.push_back(uid);
    }
    const bool fits = ExplainLocked(*c, node, &unres, nullptr).empty();
    for (const auto& uid : removed) BookLocked(uid, pods_.at(uid));
    if (fits) out[node] = mv;
  }
  return out;
}

std::string State::HeldLocked(const Compiled& c, const std::string& node, RefusalDetail* detail) {
  if (holds_.empty() || !c.wants_gpu || !c.pod_error.empty()) return "";
  const auto now = std::chrono::steady_clock::now();
  for (auto it = holds_.begin(); it != holds_.end();) {
    const Hold& h = it->second;
    if (h.until <= now) {
      it = holds_.erase(it);
      continue;
    }
    if (h.Active(now) && h.node == node && it->first != c.uid && h.priority >= c.pod.priority) {
      if (detail != nullptr && detail->want_text)
        detail->text = Cat("pod ", h.ns, "/", h.name, ", priority ", h.priority);
      return "the node's GPUs are held for a pod of higher or equal priority that is preempting lower-priority pods "
             "here";
    }
    ++it;
  }
  return "";
}

std::set<std::string> State::BudgetViolationsLocked(const std::vector<std::string>& uids) const {
  // kube-scheduler's filterPodsWithPDBViolation: in the given order, each pod takes one of the
  // disruptions allowed by every budget of its namespace that selects it; a pod for which some
  // budget has none left violates it.
  std::set<std::string> out;
  std::map<const Budget*, int64_t> left;
  for (const auto& uid : uids) {
    const PodEntry& e = pods_.at(uid);
    const auto in_ns = budgets_.find(e.ns);
    if (in_ns == budgets_.end()) continue;
    for (const auto& [name, b] : in_ns->second) {
      if (!b.selector || !b.selector->Matches(e.labels)) continue;
      auto it = left.try_emplace(&b, b.allowed).first;
      if (--it->second < 0) out.insert(uid);
    }
  }
  return out;
}

void State::UpsertBudget(const json& pdb) {
  const json meta = pdb.value("metadata", json::object());
  Budget b;
  b.selector = k8s::BudgetSelector(pdb);
  const json status = pdb.value("status", json::object());
  if (status.contains("disruptionsAllowed") && status["disruptionsAllowed"].is_number_integer()) {
    b.allowed = status["disruptionsAllowed"].get<int64_t>();
  }
  std::lock_guard lock(mu_);
  budgets_[meta.value("namespace", "default")][meta.value("name", "")] = std::move(b);
}

void State::RemoveBudget(const json& pdb) {
  const json meta = pdb.value("metadata", json::object());
  std::lock_guard lock(mu_);
  auto in_ns = budgets_.find(meta.value("namespace", "default"));
  if (in_ns == budgets_.end()) return;
  in_ns->second.erase(meta.value("name", ""));
  if (in_ns->second.empty()) budgets_.erase(in_ns);
}

std::optional<PreemptionPlan> State::PlanPreemption(const json& pod, const std::vector<std::string>& nodes) {
  std::lock_guard lock(mu_);
  auto c = CompileLocked(pod);
  if (!c->pod_error.empty() || !c->wants_gpu) return std::nullopt;
  const json spec = pod.value("spec", json::object());
  if (spec.value("preemptionPolicy", "") == "Never") return std::nullopt;
  if (!pod.value("status", json::object()).value("nominatedNodeName", "").empty()) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  std::string held_before;  // the node of this pod's hold that ran out (not of a failed one)
  if (auto h = holds_.find(c->uid); h != holds_.end()) {
    if (h->second.until > now) return std::nullopt;  // under way, or backing off after a failure
    if (!h->second.failed) held_before = h->second.node;
    holds_.erase(h);
  }
  struct Choice {
    PreemptionPlan plan;
    int64_t highest = 0, sum = 0;
  };
  std::optional<Choice> best;
  auto hold = [&](const std::string& node) {
    holds_[c->uid] = Hold{c->pod.ns, c->pod.name, node, c->pod.priority, false, now + opts_.preemption_hold};
  };
  // Higher priority first, then by namespace and name (kube-scheduler's MoreImportantPod, with
  // a stable tie-break in place of start times).
  auto more_important = [&](const std::string& a, const std::string& b) {
    const PodEntry &ea = pods_.at(a), &eb = pods_.at(b);
    if (ea.priority != eb.priority) return ea.priority > eb.priority;
    return std::tie(ea.ns, ea.name) < std::tie(eb.ns, eb.name);
  };
  bool unres = false;
  for (const auto& node : nodes) {
    if (!HeldLocked(*c, node).empty()) continue;
    const std::string why = ExplainLocked(*c, node, &unres, nullptr);
    if (why.empty()) return std::nullopt;  // it fits: nothing to preempt
    if (unres) continue;
    auto on = on_node_.find(node);
    if (on == on_node_.end()) continue;
    // What leaves anyway (terminating pods) and what may be preempted (lower priority).
    trial_ = true;
    absl::Cleanup end_trial = [&] { trial_ = false; };
    std::vector<std::string> leaving, lower;
    for (const auto& uid : on->second) {
      auto it = pods_.find(uid);
      if (it == pods_.end() || !it->second.booked || it->second.node != node) continue;
      if (it->second.terminating) {
        leaving.push_back(uid);
      } else if (it->second.priority < c->pod.priority) {
        lower.push_back(uid);
      }
    }
    for (const auto& uid : leaving) UnbookLocked(uid, pods_.at(uid));
    const bool fits_once_they_left = !leaving.empty() && ExplainLocked(*c, node, &unres, nullptr).empty();
    std::vector<std::string> victims;
    int violations = 0;
    if (!fits_once_they_left && !lower.empty()) {
      for (const auto& uid : lower) UnbookLocked(uid, pods_.at(uid));
      if (ExplainLocked(*c, node, &unres, nullptr).empty()) {
        // Reprieve the most important first; whoever the pod cannot fit beside stays a victim.
        std::sort(lower.begin(), lower.end(), more_important);
        // As kube-scheduler's selectVictimsOnNode: those whose eviction a budget would refuse
        // are reprieved first, each group from the highest priority down.
        const std::set<std::string> violating = BudgetViolationsLocked(lower);
        std::stable_partition(lower.begin(), lower.end(),
                              [&](const std::string& uid) { return violating.contains(uid); });
        for (const auto& uid : lower) {
          PodEntry& e = pods_.at(uid);
          BookLocked(uid, e);
          if (!ExplainLocked(*c, node, &unres, nullptr).empty()) {
            UnbookLocked(uid, e);
            victims.push_back(uid);
            violations += violating.contains(uid) ? 1 : 0;
          }
        }
      }
      for (const auto& uid : lower) {
        PodEntry& e = pods_.at(uid);
        if (!e.booked) BookLocked(uid, e);
      }
    }
    for (const auto& uid : leaving) BookLocked(uid, pods_.at(uid));
    if (fits_once_they_left) {  // wait for them, as kube-scheduler does
      // Our victims are still terminating (a long grace period): the hold goes on.
      if (node == held_before) hold(node);
      return std::nullopt;
    }
    if (victims.empty()) continue;
    // Reprieved in priority order within each group, the victims are listed by priority again.
    std::sort(victims.begin(), victims.end(), more_important);
    Choice ch;
    ch.plan.node = node;
    ch.plan.pdb_violations = violations;
    for (auto v = victims.rbegin(); v != victims.rend(); ++v) {  // lowest priority first
      const PodEntry& e = pods_.at(*v);
      ch.plan.victims.push_back({*v, e.ns, e.name, e.priority});
      ch.sum += e.priority;
    }
    ch.highest = ch.plan.victims.back().priority;
    // kube-scheduler's pickOneNodeForPreemption: the fewest budget violations, then the lowest
    // highest victim priority, the lowest sum of priorities, the fewest victims.
    auto key = [](const Choice& x) {
      return std::make_tuple(x.plan.pdb_violations, x.highest, x.sum, x.plan.victims.size(), x.plan.node);
    };
    if (!best || key(ch) < key(*best)) best = std::move(ch);
  }
  if (!best) return std::nullopt;
  PreemptionPlan plan = std::move(best->plan);
  plan.uid = c->uid;
  plan.ns = c->pod.ns;
  plan.name = c->pod.name;
  plan.priority = c->pod.priority;
  hold(plan.node);
  return plan;
}

void State::PreemptionFailed(const std::string& uid) {
  std::lock_guard lock(mu_);
  auto it = holds_.find(uid);
  if (it == holds_.end()) return;
  it->second.failed = true;
  it->second.until = std::chrono::steady_clock::now() + opts_.preemption_backoff;
}

std::string State::PreemptingOn(const std::string& uid) const {
  std::lock_guard lock(mu_);
  auto it = holds_.find(uid);
  return it != holds_.end() && it->second.Active(std::chrono::steady_clock::now()) ? it->second.node : "";
}

}  // namespace kgpu::extender
