#include "extender/state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "common/log.h"
#include "common/strings.h"
#include "extender/state_internal.h"
#include "sched/policy.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;

std::string EngineKey(const std::string& uid, const std::string& container) {
  return uid + "/" + container;
}

std::string UidOf(const json& pod) {
  const json meta = pod.value("metadata", json::object());
  std::string uid = meta.value("uid", "");
  if (uid.empty()) uid = meta.value("namespace", "default") + "/" + meta.value("name", "");
  return uid;
}

bool IsShareModel(const std::string& m) {
  return m.rfind(kShareModelPrefix, 0) == 0;
}
bool IsMigModel(const std::string& m) {
  return m.rfind(kMigModelPrefix, 0) == 0;
}
std::string BaseModel(const std::string& m) {
  if (IsShareModel(m)) return m.substr(std::string_view(kShareModelPrefix).size());
  if (IsMigModel(m)) return m.substr(std::string_view(kMigModelPrefix).size());
  return m;
}
// Whether a GPU of engine model `m` can take a container of `kind` (see inventory.h).
bool ModelTakes(const std::string& m, GpuKind kind) {
  switch (kind) {
    case GpuKind::kShare:
      return IsShareModel(m);
    case GpuKind::kMig:
      return IsMigModel(m);
    case GpuKind::kWhole:
      return !IsShareModel(m) && !IsMigModel(m);
  }
  return false;
}

int64_t MilliOf(int64_t memory_each, int64_t cores_each) {
  // A share with neither memory nor cores still takes one slot (and a token of the GPU's time),
  // never a whole GPU (the engine reads milli 0 with memory 0 as "whole").
  if (memory_each == 0 && cores_each == 0) return 1;
  // Nor may 100% of the cores without memory read as "whole": it stays a share of one slot.
  if (memory_each == 0 && cores_each * 10 >= sched::kMilli) return sched::kMilli - 1;
  return cores_each * 10;
}

}  // namespace

sched::PodRequest EngineRequest(const std::string& key, const api::RecordContainer& c) {
  sched::PodRequest p;
  p.name = key;
  if (c.resource.rfind(kMigPrefix, 0) == 0) {
    p.mig_profile = c.resource.substr(std::string_view(kMigPrefix).size());
    p.num_gpus = 1;
  } else if (c.resource == kShares) {
    p.num_gpus = static_cast<int>(c.gpus.size());
    p.gpu_memory_mib = c.gpus.empty() ? 0 : c.gpus[0].memory_mib;
    p.gpu_milli = static_cast<int>(MilliOf(p.gpu_memory_mib, c.gpus.empty() ? 0 : c.gpus[0].cores));
  } else {
    p.num_gpus = static_cast<int>(c.gpus.size());
    p.gpu_milli = sched::kMilli;
  }
  return p;
}

State::State(StateOptions options) : opts_(std::move(options)) {}

absl::Status State::Init() {
  auto p = sched::MakePolicy(opts_.policy, {});
  if (!p.ok()) return p.status();
  engine_ = std::make_unique<sched::Engine>(std::move(*p), opts_.seed);
  auto b = sched::MakePolicy("packing", {});
  auto s = sched::MakePolicy("spread", {});
  if (!b.ok()) return b.status();
  if (!s.ok()) return s.status();
  binpack_ = std::move(*b);
  spread_ = std::move(*s);
  return absl::OkStatus();
}

absl::StatusOr<State::Compiled> State::CompileLocked(const json& pod) const {
  Compiled c;
  c.uid = UidOf(pod);
  auto pr = ParsePodRequest(pod);
  if (!pr.ok()) {
    c.pod_error = std::string(pr.status().message());
    return c;
  }
  c.pod = std::move(*pr);
  const auto placed = c.pod.Placed();
  if (placed.empty()) return c;
  c.wants_gpu = true;
  for (const auto& g : c.pod.gpus) {  // init containers too: they run on their target's share
    if (g.kind == GpuKind::kShare && g.privileged) {
      c.pod_error = Cat(g.init ? "init container " : "container ", g.name,
                        " is privileged: a privileged container sees every GPU of the node, so a share cannot be "
                        "enforced (drop privileged, or ask for whole GPUs with ",
                        kWholeGpu, ")");
      return c;
    }
  }
  const auto& cluster = engine_->cluster();
  for (const ContainerRequest* gp : placed) {
    const ContainerRequest& g = *gp;
    // A pod with one GPU container keeps the messages it always had; with several, each names its container.
    const std::string who = placed.size() > 1 ? Cat("container ", g.name, ": ") : std::string();
    Part part;
    part.index = static_cast<size_t>(gp - c.pod.gpus.data());
    part.ereq.name = EngineKey(c.uid, g.name);
    switch (g.kind) {
      case GpuKind::kWhole:
        part.ereq.num_gpus = g.count;
        part.ereq.gpu_milli = sched::kMilli;
        break;
      case GpuKind::kMig:
        part.ereq.mig_profile = g.mig_profile;
        part.ereq.num_gpus = 1;
        break;
      case GpuKind::kShare:
        part.ereq.num_gpus = g.count;
        part.ereq.gpu_memory_mib = g.MemoryPerGpu();
        part.ereq.gpu_milli = static_cast<int>(MilliOf(g.MemoryPerGpu(), g.CoresPerGpu()));
        break;
    }
    std::set<std::string> seen;
    for (const auto& m : cluster.models()) {
      if (!ModelTakes(m, g.kind)) continue;
      const std::string base = BaseModel(m);
      seen.insert(base);
      if (!c.pod.models.empty() && std::none_of(c.pod.models.begin(), c.pod.models.end(),
                                                [&](const auto& p) { return ModelMatches(p, base); })) {
        continue;
      }
      if (std::any_of(c.pod.models_deny.begin(), c.pod.models_deny.end(),
                      [&](const auto& p) { return ModelMatches(p, base); })) {
        continue;
      }
      part.ereq.allowed_models.push_back(m);
    }
    if (part.ereq.allowed_models.empty()) {
      const char* what = g.kind == GpuKind::kShare ? "serves shares (kgpu.io/gpu)"
                         : g.kind == GpuKind::kMig ? "is in MIG mode (nvidia.com/mig-*)"
                                                   : "takes whole-GPU pods (nvidia.com/gpu)";
      if (seen.empty()) {
        c.pod_error = Cat(who, "no GPU in the cluster ", what);
      } else {
        c.pod_error = Cat(who, "no GPU in the cluster that ", what, " matches the pod's models (",
                          c.pod.models.empty() ? std::string("any") : Join(c.pod.models, ","),
                          c.pod.models_deny.empty() ? std::string() : Cat(" except ", Join(c.pod.models_deny, ",")),
                          "; models here: ", Join(seen, ", "), ")");
      }
      return c;
    }
    auto req = cluster.Compile(part.ereq);
    if (!req.ok()) {
      c.pod_error = Cat(who, req.status().message());
      return c;
    }
    part.req = std::move(*req);
    c.parts.push_back(std::move(part));
  }
  auto rank = [&](const Part& p) {
    const GpuKind k = c.Gpu(p).kind;
    return std::pair<int, int64_t>(k == GpuKind::kWhole ? 2
                                   : k == GpuKind::kMig ? 1
                                                        : 0,
                                   static_cast<int64_t>(p.ereq.num_gpus) * std::max(1, p.ereq.gpu_milli));
  };
  std::stable_sort(c.parts.begin(), c.parts.end(), [&](const Part& a, const Part& b) { return rank(a) > rank(b); });
  return c;
}

std::vector<int> State::MaskLocked(const Compiled& c, const std::string& node) {
  std::vector<int> masked;
  if (c.pod.uuids.empty() && c.pod.uuids_deny.empty()) return masked;
  const auto it = nodes_.find(node);
  const int id = engine_->cluster().FindNode(node);
  if (it == nodes_.end() || id < 0) return masked;
  const auto& ns = engine_->cluster().node(id);
  for (size_t i = 0; i < it->second.gpus.size() && i < ns.gpus.size(); ++i) {
    const auto& uuid = it->second.gpus[i].uuid;
    const bool allowed =
        c.pod.uuids.empty() || std::find(c.pod.uuids.begin(), c.pod.uuids.end(), uuid) != c.pod.uuids.end();
    const bool denied = std::find(c.pod.uuids_deny.begin(), c.pod.uuids_deny.end(), uuid) != c.pod.uuids_deny.end();
    if ((!allowed || denied) && ns.gpus[i].healthy) {
      (void)engine_->mutable_cluster().SetGpuHealth(node, static_cast<int>(i), false);
      masked.push_back(static_cast<int>(i));
    }
  }
  return masked;
}

void State::UnmaskLocked(const std::string& node, const std::vector<int>& masked) {
  for (int i : masked) (void)engine_->mutable_cluster().SetGpuHealth(node, i, true);
}

sched::Policy& State::PolicyFor(const Compiled& c) {
  if (c.pod.placement == "binpack") return *binpack_;
  if (c.pod.placement == "spread") return *spread_;
  return engine_->policy();
}

bool State::SearchPartsLocked(const Compiled& c, int id, const std::string& prefix, std::vector<std::string>* placed) {
  auto& cluster = engine_->cluster();
  int budget = kSearchBudget;
  std::function<bool(size_t)> place_from = [&](size_t i) -> bool {
    if (i == c.parts.size()) return true;
    const Part& part = c.parts[i];
    if (!cluster.NodeFits(part.req, id)) return false;
    const sched::NodeState& ns = cluster.node(id);
    std::vector<sched::Placement> choices;
    if (part.req.Share() && part.req.num_gpus == 1) {
      // One GPU of each kind: GPUs alike in everything a later container's fit depends on lead to
      // the same outcomes, so trying one of them is enough.
      auto kind = [&](int g) {
        const auto& x = ns.gpus[static_cast<size_t>(g)];
        return std::make_tuple(x.model, x.memory_mib, x.free_milli, x.free_memory_mib, x.pods, x.max_shares,
                               x.untracked_mib, x.healthy, x.nvlink_island);
      };
      std::vector<int> gpus;
      for (int g = 0; g < static_cast<int>(ns.gpus.size()); ++g) {
        if (!cluster.GpuFits(part.req, ns, g)) continue;
        if (std::none_of(gpus.begin(), gpus.end(), [&](int h) { return kind(h) == kind(g); })) gpus.push_back(g);
      }
      // The fullest first: what is left large stays for the containers still to come.
      std::stable_sort(gpus.begin(), gpus.end(), [&](int a, int b) {
        const auto& ga = ns.gpus[static_cast<size_t>(a)];
        const auto& gb = ns.gpus[static_cast<size_t>(b)];
        return std::tie(ga.free_memory_mib, ga.free_milli) < std::tie(gb.free_memory_mib, gb.free_milli);
      });
      for (int g : gpus) {
        sched::Placement p;
        p.gpus = {g};
        choices.push_back(std::move(p));
      }
    } else {
      sched::Candidate cand;
      if (PolicyFor(c).Evaluate(cluster, part.req, id, &cand) && cand.placement.ok()) {
        choices.push_back(cand.placement);
      } else {
        sched::Placement p;
        p.gpus = cluster.PickGpuSet(part.req, ns);
        if (!p.gpus.empty()) choices.push_back(std::move(p));
      }
    }
    for (auto& p : choices) {
      if (--budget < 0) return false;
      p.node = id;
      sched::PodRequest er = part.ereq;
      er.name = Cat(prefix, part.ereq.name);
      if (!engine_->Bind(er, p).ok()) continue;
      placed->push_back(er.name);
      if (place_from(i + 1)) return true;
      (void)engine_->Release(er.name);
      placed->pop_back();
    }
    return false;
  };
  return place_from(0);
}

bool State::TryPlacePartLocked(const Compiled& c, const Part& part, int id, const std::string& key,
                               std::vector<std::string>* placed, double* score) {
  auto& cluster = engine_->cluster();
  if (!cluster.NodeFits(part.req, id)) return false;
  sched::Candidate cand;
  sched::Placement p;
  if (PolicyFor(c).Evaluate(cluster, part.req, id, &cand) && cand.placement.ok()) {
    p = cand.placement;
    if (score != nullptr) *score += cand.score;
  } else if (score != nullptr) {
    return false;  // as for one container: a node the policy would not use gets no score
  } else {
    p.gpus = cluster.PickGpuSet(part.req, cluster.node(id));
  }
  p.node = id;
  sched::PodRequest er = part.ereq;
  er.name = key;
  if (!engine_->Bind(er, p).ok()) return false;
  placed->push_back(key);
  return true;
}

FilterOutcome State::Filter(const json& pod, const std::vector<std::string>& nodes) {
  std::lock_guard lock(mu_);
  FilterOutcome out;
  auto c = CompileLocked(pod);
  std::vector<std::pair<const char*, int>> reasons;  // few categories: a map per node cost more
  RefusalMemo memo;
  // The nearest refused node: one preemption can help on before one it cannot, then nearness.
  const std::string* closest = nullptr;
  std::pair<bool, double> closest_key{false, -1};
  for (const auto& n : nodes) {
    bool unres = false;
    const char* cat = "held";
    RefusalDetail d;
    d.want_text = false;
    std::string why = HeldLocked(*c, n);
    if (why.empty()) why = ExplainLocked(*c, n, &unres, &cat, &memo, &d);
    if (!why.empty()) {
      auto r =
          std::find_if(reasons.begin(), reasons.end(), [&](const auto& e) { return std::strcmp(e.first, cat) == 0; });
      if (r == reasons.end()) r = reasons.insert(reasons.end(), {cat, 0});
      ++r->second;
      if (const std::pair<bool, double> key{!unres, d.nearness}; closest == nullptr || key > closest_key) {
        closest = &n;
        closest_key = key;
      }
    }
    if (why.empty()) {
      out.passed.push_back(n);
    } else if (unres) {
      out.unresolvable.Append(n, std::move(why));
    } else {
      out.failed.Append(n, std::move(why));
    }
  }
  for (const auto& [cat, count] : reasons) out.reasons[cat] += count;
  if (out.passed.empty() && closest != nullptr) {
    bool unres = false;
    RefusalDetail d;
    std::string why = HeldLocked(*c, *closest, &d);
    if (why.empty()) why = ExplainLocked(*c, *closest, &unres, nullptr, nullptr, &d);
    out.closest_node = *closest;
    out.closest_why = WithDetail(std::move(why), d);
  }
  return out;
}

std::vector<HostPriority> State::Prioritize(const json& pod, const std::vector<std::string>& nodes) {
  std::lock_guard lock(mu_);
  std::vector<HostPriority> out;
  out.reserve(nodes.size());
  auto c = CompileLocked(pod);
  // The policy's score, then its tie-breaks (Candidate::tie, tie2: the engine picks by all three).
  using Key = std::tuple<double, double, double>;
  std::vector<std::optional<Key>> raw(nodes.size());
  if (c->pod_error.empty() && c->wants_gpu) {
    auto& policy = PolicyFor(*c);
    const auto& cluster = engine_->cluster();
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int id = cluster.FindNode(nodes[i]);
      if (id < 0) continue;
      const auto masked = MaskLocked(*c, nodes[i]);
      if (c->parts.size() == 1) {
        const Part& part = c->parts[0];
        sched::Candidate cand;
        if (cluster.NodeFits(part.req, id) && policy.Evaluate(cluster, part.req, id, &cand)) {
          raw[i] = Key{cand.score, cand.tie, cand.tie2};
        }
      } else {  // the sum of the containers' scores, each placed (on trial) after those before it
        std::vector<std::string> placed;
        double score = 0;
        bool all = true;
        for (const auto& part : c->parts) {
          all = all && TryPlacePartLocked(*c, part, id, Cat("?", part.ereq.name), &placed, &score);
        }
        for (const auto& key : placed) (void)engine_->Release(key);
        if (all) raw[i] = Key{score, 0, 0};
      }
      UnmaskLocked(nodes[i], masked);
    }
  }
  // 10 for the nodes the policy itself would choose (the best score and tie-breaks), the others
  // spread over 0..9 by score: kube-scheduler, which sees only these integers, then picks among
  // the policy's choices, not at random among nodes of equal score but different tie-breaks
  // (of two nodes that fit a whole-GPU pod equally, the one with fewer GPUs left, which keeps the
  // other whole for larger pods).
  std::optional<Key> best;
  double lo = 0, hi = 0;
  for (const auto& r : raw) {
    if (!r) continue;
    lo = best ? std::min(lo, std::get<0>(*r)) : std::get<0>(*r);
    hi = best ? std::max(hi, std::get<0>(*r)) : std::get<0>(*r);
    best = best ? std::max(*best, *r) : *r;
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    int64_t score = 0;
    if (raw[i] && *raw[i] == *best) {
      score = 10;
    } else if (raw[i]) {
      score = hi > lo ? std::llround(9.0 * (std::get<0>(*raw[i]) - lo) / (hi - lo)) : 9;
    }
    out.push_back({nodes[i], score});
  }
  return out;
}

void State::BookLocked(const std::string& uid, PodEntry& e, bool quiet) {
  if (e.booked || !e.record) return;
  const auto it = nodes_.find(e.node);
  const int id = engine_->cluster().FindNode(e.node);
  if (it == nodes_.end() || id < 0) {  // booked when the node appears
    e.waiting = false;
    return;
  }
  const NodeInfo& info = it->second;
  // A record is a fact, not a placement: memory its node reports in use may be this very pod's
  // (its report can arrive before the pod: a restarted extender, a record the node corrected), so
  // untracked memory does not stand in its way; it is worked out again with the record booked.
  auto& cluster = engine_->mutable_cluster();
  std::vector<int64_t> before;
  for (size_t g = 0; g < cluster.node(id).gpus.size() && !trial_; ++g) {
    before.push_back(cluster.node(id).gpus[g].untracked_mib);
    if (before.back() != 0) (void)cluster.SetGpuUntracked(e.node, static_cast<int>(g), 0);
  }
  absl::Cleanup reapply = [&] {
    if (std::any_of(before.begin(), before.end(), [](int64_t v) { return v != 0; }))
      ApplyReportedUsageLocked(e.node, &before);
  };
  std::vector<std::string> done;
  for (const auto& rc : e.record->containers) {
    sched::Placement p;
    p.node = id;
    for (const auto& rg : rc.gpus) {
      const int idx = info.IndexOfUuid(rg.uuid);
      if (idx < 0) {
        ++bad_records_;
        Log("extender")
            ->warn("pod {}/{}: allocation record names GPU {} which node {} does not have (a stale record)", e.ns,
                   e.name, rg.uuid, e.node);
        p.gpus.clear();
        break;
      }
      p.gpus.push_back(idx);
      if (!rg.mig.empty()) {
        const auto& migs = info.gpus[static_cast<size_t>(idx)].mig;
        for (size_t k = 0; k < migs.size(); ++k) {
          if (migs[k].uuid == rg.mig) p.mig_instance = static_cast<int>(k);
        }
      }
    }
    std::sort(p.gpus.begin(), p.gpus.end());
    const std::string key = EngineKey(uid, rc.name);
    absl::Status st =
        p.gpus.empty() ? absl::FailedPreconditionError("stale record") : engine_->Bind(EngineRequest(key, rc), p);
    if (!st.ok()) {
      if (!p.gpus.empty() && !e.waiting) {
        if (quiet) {
          Log("extender")
              ->info(
                  "pod {}/{}: allocation record on node {} waits for its GPUs, which another record still "
                  "holds ({}); booked when they are released",
                  e.ns, e.name, e.node, std::string(st.message()));
        } else {
          ++record_conflicts_;
          Log("extender")
              ->warn(
                  "pod {}/{}: allocation record on node {} cannot be booked ({}): another record holds that "
                  "capacity; booked if it is released",
                  e.ns, e.name, e.node, std::string(st.message()));
        }
      }
      e.waiting = !p.gpus.empty() && e.bound;
      for (const auto& k : done) (void)engine_->Release(k);
      return;
    }
    done.push_back(key);
  }
  e.booked = true;
  e.waiting = false;
}

void State::UnbookLocked(const std::string& uid, PodEntry& e) {
  if (!e.booked) return;
  if (e.record) {
    for (const auto& rc : e.record->containers) (void)engine_->Release(EngineKey(uid, rc.name));
  }
  e.booked = false;
}

void State::RebookNodeLocked(const std::string& node) {
  const auto it = on_node_.find(node);
  if (it == on_node_.end()) return;
  // Those that were booked first, then those that waited (quietly): a record waiting for its
  // node's next correction must not take the GPUs from the record that still holds them.
  for (const bool waiting : {false, true}) {
    for (const auto& uid : it->second) {
      auto p = pods_.find(uid);
      if (p == pods_.end() || p->second.waiting != waiting) continue;
      p->second.booked = false;  // the engine dropped them with the node
      if (p->second.bound || p->second.assumed) BookLocked(uid, p->second, /*quiet=*/waiting);
    }
  }
}

void State::BookWaitingLocked(const std::string& node) {
  const auto it = on_node_.find(node);
  if (it == on_node_.end()) return;
  for (const auto& uid : it->second) {
    auto p = pods_.find(uid);
    if (p != pods_.end() && p->second.waiting && !p->second.booked) BookLocked(uid, p->second, /*quiet=*/true);
  }
}

void State::UpsertNode(const json& node) {
  auto info = ParseNodeInventory(node);
  const std::string name = node.value("metadata", json::object()).value("name", "");
  std::lock_guard lock(mu_);
  if (!info.ok()) {
    if (absl::IsNotFound(info.status())) {
      if (nodes_.contains(name)) {
        (void)engine_->RemoveNode(name);
        nodes_.erase(name);
        RebookNodeLocked(name);
      }
      return;
    }
    ++bad_inventories_;
    Log("extender")
        ->warn("{} (the node keeps its previous GPUs in the extender)", std::string(info.status().message()));
    return;
  }
  const auto it = nodes_.find(name);
  if (it != nodes_.end() && it->second.annotation == info->annotation) return;
  if (it != nodes_.end()) (void)engine_->RemoveNode(name);
  auto id = engine_->AddNode(ToNodeSpec(*info));
  if (!id.ok()) {
    ++bad_inventories_;
    Log("extender")->warn("node {}: {}", name, std::string(id.status().message()));
    nodes_.erase(name);
    RebookNodeLocked(name);
    return;
  }
  info->engine_id = *id;
  info->shape_id = shape_ids_.try_emplace(StaticShape(*info), static_cast<int>(shape_ids_.size())).first->second;
  nodes_[name] = std::move(*info);
  RebookNodeLocked(name);
  ApplyReportedUsageLocked(name);
}

void State::ApplyReportedUsageLocked(const std::string& node, const std::vector<int64_t>* before) {
  const auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.engine_id < 0) return;
  auto& cluster = engine_->mutable_cluster();
  const NodeInfo& info = it->second;
  for (size_t i = 0; i < info.gpus.size() && i < cluster.node(info.engine_id).gpus.size(); ++i) {
    const auto& gs = cluster.node(info.engine_id).gpus[i];
    int64_t untracked = 0;
    if (info.gpus[i].used_mib >= 0 && !gs.IsMig()) {
      // A whole-GPU pod owns all of it; shares book their records' memory.
      const int64_t booked = gs.pods > 0 && info.gpus[i].slots == 0
                                 ? gs.memory_mib
                                 : gs.memory_mib - gs.free_memory_mib - gs.untracked_mib;
      untracked = info.gpus[i].used_mib - booked;
      if (untracked < opts_.untracked_tolerance_mib) untracked = 0;
    }
    if (untracked == gs.untracked_mib) continue;
    const bool was = before != nullptr && i < before->size() && (*before)[i] == untracked;  // only re-applied
    if (untracked > 0 && !was) {
      Log("extender")
          ->info(
              "node {} GPU {}: {} MiB in use beyond what the allocation records book there (another user); "
              "not placed until its node reports it gone",
              node, info.gpus[i].uuid, untracked);
    }
    (void)cluster.SetGpuUntracked(node, static_cast<int>(i), untracked);
  }
}

void State::RemoveNode(const std::string& name) {
  std::lock_guard lock(mu_);
  if (!nodes_.contains(name)) return;
  (void)engine_->RemoveNode(name);
  nodes_.erase(name);
  RebookNodeLocked(name);
}

void State::UpsertPod(const json& pod) {
  const std::string uid = UidOf(pod);
  const json meta = pod.value("metadata", json::object());
  const json spec = pod.value("spec", json::object());
  const std::string phase = pod.value("status", json::object()).value("phase", "");
  const std::string node = spec.value("nodeName", "");
  std::optional<api::AllocationRecord> rec;
  std::lock_guard lock(mu_);
  if (!node.empty() || phase == "Succeeded" || phase == "Failed") holds_.erase(uid);  // the preemptor got its place
  if (auto r = api::RecordOnPod(pod); r.ok()) {
    rec = std::move(*r);
  } else {
    ++bad_records_;
    Log("extender")
        ->warn("pod {}/{}: {} (ignored)", meta.value("namespace", ""), meta.value("name", ""),
               std::string(r.status().message()));
  }
  auto it = pods_.find(uid);
  auto drop = [&] {
    if (it == pods_.end()) return;
    const std::string was_on = it->second.node;
    UnbookLocked(uid, it->second);
    if (auto o = on_node_.find(was_on); o != on_node_.end()) o->second.erase(uid);
    pods_.erase(it);
    BookWaitingLocked(was_on);
  };
  // spec.nodeName is never unset once a pod is bound (the apiserver refuses it), so an unbound
  // copy of a pod we booked is an event the watch delivers late: an update made before the
  // binding (a label, an earlier record write), or the pod's creation, arriving after our
  // binding was confirmed. Dropping the booking on it would free the GPUs of a bound pod until
  // the binding's event comes, and a concurrent bind could take them (a double allocation,
  // counted as a record conflict when the binding arrives).
  if (it != pods_.end() && node.empty() && (it->second.bound || it->second.assumed) && phase != "Succeeded" &&
      phase != "Failed") {
    return;
  }
  if (phase == "Succeeded" || phase == "Failed" || !rec) {
    drop();
    return;
  }
  if (node.empty()) {
    drop();  // a record left by a bind that failed
    return;
  }
  if (rec->node != node) {
    ++bad_records_;
    Log("extender")
        ->warn("pod {}/{}: allocation record is for node {} but the pod is bound to {} (ignored)",
               meta.value("namespace", ""), meta.value("name", ""), rec->node, node);
    drop();
    return;
  }
  if (it == pods_.end()) it = pods_.emplace(uid, PodEntry{}).first;
  PodEntry& e = it->second;
  e.ns = meta.value("namespace", "default");
  e.name = meta.value("name", "");
  if (spec.contains("priority") && spec["priority"].is_number_integer()) e.priority = spec["priority"].get<int64_t>();
  e.terminating = meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null();
  e.labels = meta.contains("labels") && meta["labels"].is_object() ? meta["labels"] : json::object();
  if (e.booked && e.record == rec && e.node == node) {
    e.bound = true;
    e.assumed = false;
    return;
  }
  // A bound pod whose record changed on the same node: its node made the record say which whole
  // GPUs or MIG instances kubelet gave (cli/share_handoff.h). Pods whose devices kubelet swapped
  // are corrected one after the other, so the new devices may still be booked by the other's old
  // record: that one waits, quietly, until the other's correction frees them.
  const bool corrected = e.bound && e.record && e.node == node;
  UnbookLocked(uid, e);
  if (auto o = on_node_.find(e.node); o != on_node_.end()) o->second.erase(uid);
  e.record = std::move(rec);
  e.node = node;
  e.bound = true;
  e.assumed = false;
  on_node_[node].insert(uid);
  BookLocked(uid, e, /*quiet=*/corrected);
  if (corrected) {
    BookWaitingLocked(node);
    ApplyReportedUsageLocked(node);  // memory in use on the devices the record now names is booked
  }
}

void State::RemovePod(const json& pod) {
  const std::string uid = UidOf(pod);
  std::lock_guard lock(mu_);
  holds_.erase(uid);
  auto it = pods_.find(uid);
  if (it == pods_.end()) return;
  const std::string was_on = it->second.node;
  UnbookLocked(uid, it->second);
  if (auto o = on_node_.find(was_on); o != on_node_.end()) o->second.erase(uid);
  pods_.erase(it);
  BookWaitingLocked(was_on);
}

absl::StatusOr<Assumption> State::Assume(const json& pod, const std::string& node) {
  std::lock_guard lock(mu_);
  auto c = CompileLocked(pod);
  if (!c->pod_error.empty()) return absl::InvalidArgumentError(c->pod_error);
  Assumption a;
  a.uid = c->uid;
  a.ns = c->pod.ns;
  a.name = c->pod.name;
  a.node = node;
  if (!c->wants_gpu) return a;
  if (auto it = pods_.find(c->uid); it != pods_.end()) {
    PodEntry& e = it->second;
    if (e.booked && e.node == node && e.record) {
      a.record = *e.record;
      a.already_bound = e.bound;
      return a;
    }
    const std::string was_on = e.node;
    UnbookLocked(c->uid, e);  // an earlier attempt elsewhere that never bound
    if (auto o = on_node_.find(was_on); o != on_node_.end()) o->second.erase(c->uid);
    pods_.erase(it);
    BookWaitingLocked(was_on);
  }
  bool unres = false;
  RefusalDetail d;
  std::string why = HeldLocked(*c, node, &d);
  if (why.empty()) why = ExplainLocked(*c, node, &unres, nullptr, nullptr, &d);
  if (!why.empty()) return absl::FailedPreconditionError(Cat("node ", node, ": ", WithDetail(std::move(why), d)));
  const int id = engine_->cluster().FindNode(node);
  const NodeInfo& info = nodes_.at(node);
  const auto masked = MaskLocked(*c, node);
  std::vector<std::string> placed;
  for (const auto& part : c->parts) {
    if (!TryPlacePartLocked(*c, part, id, part.ereq.name, &placed, nullptr)) {
      const bool beside_others = !placed.empty();
      for (const auto& key : placed) (void)engine_->Release(key);
      placed.clear();
      if (beside_others && SearchPartsLocked(*c, id, "", &placed)) break;  // another arrangement fits
      UnmaskLocked(node, masked);
      return absl::FailedPreconditionError(Cat("node ", node, ": ",
                                               c->parts.size() > 1 ? Cat("container ", c->Gpu(part).name, ": ") : "",
                                               "the GPUs it would take are no longer free"));
    }
  }
  UnmaskLocked(node, masked);
  for (const auto& part : c->parts) engine_->policy().Observe(part.req);
  a.record.node = node;
  // In the pod's container order, as the node reads it.
  for (const ContainerRequest* g : c->pod.Placed()) {
    const sched::Placement* got = engine_->cluster().FindPod(EngineKey(c->uid, g->name));
    if (got == nullptr) continue;  // cannot happen: placed above
    api::RecordContainer rc;
    rc.name = g->name;
    rc.resource = g->Resource();
    if (g->kind == GpuKind::kShare)
      rc.enforcement = c->pod.enforcement.empty() ? info.enforcement.front() : c->pod.enforcement;
    for (int idx : got->gpus) {
      const GpuInfo& gi = info.gpus[static_cast<size_t>(idx)];
      api::RecordGpu rg;
      rg.uuid = gi.uuid;
      if (g->kind == GpuKind::kShare) {
        rg.memory_mib = g->MemoryPerGpu();
        rg.cores = g->CoresPerGpu();
      } else if (g->kind == GpuKind::kMig && got->mig_instance >= 0 &&
                 got->mig_instance < static_cast<int>(gi.mig.size())) {
        const MigInfo& m = gi.mig[static_cast<size_t>(got->mig_instance)];
        rg.mig = m.uuid;
        rg.profile = m.profile;
        rg.memory_mib = m.memory_mib;
      }
      rc.gpus.push_back(std::move(rg));
    }
    a.record.containers.push_back(std::move(rc));
  }
  PodEntry e;
  e.ns = a.ns;
  e.name = a.name;
  e.node = node;
  e.record = a.record;
  e.assumed = true;
  e.booked = true;
  e.priority = c->pod.priority;
  pods_[c->uid] = std::move(e);
  on_node_[node].insert(c->uid);
  return a;
}

void State::Forget(const std::string& uid) {
  std::lock_guard lock(mu_);
  auto it = pods_.find(uid);
  if (it == pods_.end() || it->second.bound) return;
  const std::string was_on = it->second.node;
  UnbookLocked(uid, it->second);
  if (auto o = on_node_.find(was_on); o != on_node_.end()) o->second.erase(uid);
  pods_.erase(it);
  BookWaitingLocked(was_on);
}

void State::Confirm(const std::string& uid) {
  std::lock_guard lock(mu_);
  holds_.erase(uid);  // a preemptor got its place
  auto it = pods_.find(uid);
  if (it == pods_.end()) return;
  it->second.bound = true;
  it->second.assumed = false;
}

std::optional<api::AllocationRecord> State::RecordOf(const std::string& uid) const {
  std::lock_guard lock(mu_);
  auto it = pods_.find(uid);
  if (it == pods_.end() || !it->second.booked) return std::nullopt;
  return it->second.record;
}

StateStats State::Stats() const {
  std::lock_guard lock(mu_);
  StateStats s;
  s.nodes = nodes_.size();
  for (const auto& [n, info] : nodes_) s.gpu_nodes += info.gpus.empty() ? 0 : 1;
  s.pods = pods_.size();
  for (const auto& [uid, e] : pods_) {
    s.booked += e.booked ? 1 : 0;
    s.records_waiting += e.waiting ? 1 : 0;
  }
  s.record_conflicts = record_conflicts_;
  s.bad_records = bad_records_;
  s.bad_inventories = bad_inventories_;
  const auto& cluster = engine_->cluster();
  for (const auto& [n, info] : nodes_) {
    if (info.engine_id < 0) continue;
    const auto& gpus = cluster.node(info.engine_id).gpus;
    for (size_t i = 0; i < info.gpus.size() && i < gpus.size(); ++i) {
      if (info.gpus[i].used_mib < 0) continue;
      ++s.gpus_reporting_usage;
      s.gpus_untracked += gpus[i].untracked_mib > 0 ? 1 : 0;
      s.untracked_mib += gpus[i].untracked_mib;
    }
  }
  return s;
}

}  // namespace kgpu::extender
