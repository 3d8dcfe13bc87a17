#include "sched/cluster.h"

#include <algorithm>
#include <array>
#include <tuple>

#include "absl/strings/string_view.h"
#include "common/strings.h"

namespace kgpu::sched {

int64_t NodeState::FreeGpuMilli() const {
  int64_t sum = 0;
  for (const auto& g : gpus) {
    if (g.healthy && !g.IsMig()) sum += g.free_milli;
  }
  return sum;
}

int NodeState::FullyFreeGpus() const {
  int n = 0;
  for (const auto& g : gpus) n += (g.healthy && !g.IsMig() && g.FullyFree()) ? 1 : 0;
  return n;
}

int Cluster::InternModel(const std::string& model) {
  for (size_t i = 0; i < models_.size(); ++i) {
    if (models_[i] == model) return static_cast<int>(i);
  }
  if (models_.size() >= kMaxModels) return -1;
  models_.push_back(model);
  return static_cast<int>(models_.size() - 1);
}

int Cluster::ModelId(std::string_view model) const {
  for (size_t i = 0; i < models_.size(); ++i) {
    if (models_[i] == model) return static_cast<int>(i);
  }
  return -1;
}

int Cluster::InternMigProfile(const std::string& profile) {
  return mig_profiles_.try_emplace(profile, static_cast<int>(mig_profiles_.size())).first->second;
}

int Cluster::FindNode(std::string_view name) const {
  auto it = node_index_.find(absl::string_view(name.data(), name.size()));  // no std::string built per lookup
  return it == node_index_.end() ? -1 : it->second;
}

absl::StatusOr<int> Cluster::AddNode(const NodeSpec& spec, uint64_t rank) {
  if (spec.name.empty()) return absl::InvalidArgumentError("node: the name is empty");
  if (node_index_.contains(spec.name)) {
    return absl::AlreadyExistsError(Cat("node ", spec.name, ": already in the cluster (remove it first)"));
  }
  if (spec.cpu_milli < 0 || spec.memory_mib < 0 || spec.max_pods < 0) {
    return absl::InvalidArgumentError(Cat("node ", spec.name, ": CPU, memory and max pods must be >= 0"));
  }
  NodeState n;
  n.name = spec.name;
  n.active = true;
  n.cpu_total = n.cpu_free = spec.cpu_milli;
  n.memory_total = n.memory_free = spec.memory_mib;
  n.max_pods = spec.max_pods;
  n.labels = spec.labels;
  n.rank = rank;
  bool mixed = false;
  for (size_t i = 0; i < spec.gpus.size(); ++i) {
    const auto& gs = spec.gpus[i];
    GpuState g;
    g.model = InternModel(gs.model);
    if (g.model < 0) {
      return absl::ResourceExhaustedError(Cat("node ", spec.name, ": GPU model ", gs.model, " is one more than the ",
                                              kMaxModels, " distinct models the engine supports"));
    }
    if (gs.memory_mib < 0) return absl::InvalidArgumentError(Cat("node ", spec.name, ": GPU ", i, " memory < 0"));
    g.memory_mib = g.free_memory_mib = gs.memory_mib;
    g.healthy = gs.healthy;
    g.nvlink_island = gs.nvlink_island;
    g.max_shares = gs.max_shares;
    int slices = 0;
    for (const auto& inst : gs.mig) {
      if (inst.compute_slices <= 0 || inst.milli <= 0 || inst.milli > kMilli) {
        return absl::InvalidArgumentError(
            Cat("node ", spec.name, ": GPU ", i, ": MIG instance ", inst.profile, " needs 1..7 compute slices"));
      }
      slices += inst.compute_slices;
    }
    if (slices > 7) {
      return absl::InvalidArgumentError(
          Cat("node ", spec.name, ": GPU ", i, ": MIG instances use ", slices, " compute slices (at most 7)"));
    }
    g.mig = gs.mig;
    g.mig_used.assign(gs.mig.size(), 0);
    for (const auto& inst : gs.mig) g.mig_ids.push_back(InternMigProfile(inst.profile));
    if (n.model == -1 && i == 0) n.model = g.model;
    if (g.model != n.model) mixed = true;
    n.gpus.push_back(std::move(g));
  }
  if (mixed) n.model = -1;
  const int id = static_cast<int>(nodes_.size());
  node_index_.emplace(n.name, id);
  nodes_.push_back(std::move(n));
  CountNode(nodes_.back(), +1);  // not Recount(): adding 5,000 nodes one by one must stay linear
  return id;
}

void Cluster::CountNode(const NodeState& n, int sign) {
  if (!n.active) return;
  active_nodes_ = sign > 0 ? active_nodes_ + 1 : active_nodes_ - 1;
  if (sign > 0) {
    max_cpu_ = std::max(max_cpu_, n.cpu_total);
    max_gpus_ = std::max(max_gpus_, static_cast<int>(n.gpus.size()));
  }
  for (const auto& g : n.gpus) {
    if (g.healthy) CountGpu(g, sign);
  }
}

void Cluster::CountGpu(const GpuState& g, int sign) {
  total_milli_ += sign * kMilli;
  allocated_milli_ += sign * (kMilli - g.free_milli);
  if (!g.IsMig()) free_counts_[static_cast<size_t>(g.free_milli)] += sign;
}

void Cluster::CountFreeChange(const NodeState& n, const GpuState& g, int delta) {
  if (!n.active || !g.healthy) return;  // as Recount counts: healthy GPUs of active nodes only
  allocated_milli_ -= delta;
  if (!g.IsMig()) {
    --free_counts_[static_cast<size_t>(g.free_milli)];
    ++free_counts_[static_cast<size_t>(g.free_milli + delta)];
  }
}

void Cluster::Recount() {
  total_milli_ = 0;
  allocated_milli_ = 0;
  std::fill(free_counts_.begin(), free_counts_.end(), 0);
  max_cpu_ = 0;
  max_gpus_ = 0;
  active_nodes_ = 0;
  for (const auto& n : nodes_) CountNode(n, +1);
}

absl::Status Cluster::RemoveNode(std::string_view name, std::vector<std::string>* evicted) {
  const int id = FindNode(name);
  if (id < 0) return absl::NotFoundError(Cat("node ", name, ": not in the cluster"));
  std::vector<std::string> gone;
  for (const auto& [pod, rec] : pods_) {
    if (rec.placement.node == id) gone.push_back(pod);
  }
  std::sort(gone.begin(), gone.end());
  for (const auto& pod : gone) {
    auto st = Release(pod);
    if (!st.ok()) return st;
  }
  auto& n = nodes_[static_cast<size_t>(id)];
  CountNode(n, -1);
  n.active = false;
  ++n.version;
  node_index_.erase(std::string(n.name));
  if (n.cpu_total >= max_cpu_ || static_cast<int>(n.gpus.size()) >= max_gpus_) Recount();  // a maximum may have gone
  if (evicted != nullptr) *evicted = std::move(gone);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<NodeState*, GpuState*>> Cluster::FindGpu(std::string_view node, int gpu) {
  const int id = FindNode(node);
  if (id < 0) return absl::NotFoundError(Cat("node ", node, ": not in the cluster"));
  auto& n = nodes_[static_cast<size_t>(id)];
  if (gpu < 0 || gpu >= static_cast<int>(n.gpus.size())) {
    return absl::OutOfRangeError(Cat("node ", node, ": no GPU ", gpu, " (it has ", n.gpus.size(), ")"));
  }
  return std::make_pair(&n, &n.gpus[static_cast<size_t>(gpu)]);
}

absl::Status Cluster::SetGpuHealth(std::string_view node, int gpu, bool healthy) {
  auto found = FindGpu(node, gpu);
  if (!found.ok()) return found.status();
  auto& [np, gp] = *found;
  auto& n = *np;
  auto& g = *gp;
  if (g.healthy != healthy && n.active) {
    // Only this GPU's share of the totals changes (the extender masks GPUs per request: a full
    // recount here cost O(nodes) per masked GPU).
    CountGpu(g, healthy ? 1 : -1);
  }
  g.healthy = healthy;
  ++n.version;
  return absl::OkStatus();
}

absl::Status Cluster::SetGpuUntracked(std::string_view node, int gpu, int64_t mib) {
  if (mib < 0) return absl::InvalidArgumentError(Cat("node ", node, ": GPU ", gpu, ": untracked memory must be >= 0"));
  auto found = FindGpu(node, gpu);
  if (!found.ok()) return found.status();
  auto& [n, g] = *found;
  g->free_memory_mib += g->untracked_mib - mib;
  g->untracked_mib = mib;
  ++n->version;
  return absl::OkStatus();
}

absl::StatusOr<Request> Cluster::Compile(const PodRequest& pod) const {
  Request r;
  r.name = pod.name;
  if (pod.cpu_milli < 0 || pod.memory_mib < 0 || pod.num_gpus < 0 || pod.gpu_milli < 0 || pod.gpu_memory_mib < 0) {
    return absl::InvalidArgumentError(Cat("pod ", pod.name, ": requests must be >= 0"));
  }
  if (pod.gpu_milli > kMilli) {
    return absl::InvalidArgumentError(
        Cat("pod ", pod.name, ": gpu_milli ", pod.gpu_milli, " is per GPU and at most 1000 (use num_gpus for more)"));
  }
  r.cpu = pod.cpu_milli;
  r.memory = pod.memory_mib;
  r.mig_profile = pod.mig_profile;
  if (!r.mig_profile.empty()) {
    const auto it = mig_profiles_.find(r.mig_profile);
    r.mig_profile_id = it == mig_profiles_.end() ? -1 : it->second;
  }
  if (r.mig_profile.empty()) {
    r.num_gpus = pod.num_gpus;
    r.gpu_memory = pod.gpu_memory_mib;
    r.milli = pod.num_gpus == 0 ? 0 : pod.gpu_milli;
    if (r.num_gpus > 0 && r.milli == 0 && r.gpu_memory == 0) r.milli = kMilli;  // a bare count: whole GPUs
    if (r.num_gpus == 0 && (pod.gpu_milli > 0 || pod.gpu_memory_mib > 0)) {
      return absl::InvalidArgumentError(
          Cat("pod ", pod.name, ": asks for GPU milli or memory with num_gpus 0 (set num_gpus to 1 for a share)"));
    }
    r.whole = r.num_gpus > 0 && r.milli >= kMilli && r.gpu_memory == 0;
  } else {
    r.num_gpus = 1;
  }
  if (!pod.allowed_models.empty()) {
    r.models = 0;
    for (const auto& m : pod.allowed_models) {
      const int id = ModelId(m);
      if (id >= 0) r.models |= uint64_t{1} << id;
    }
  }
  for (const auto& m : pod.denied_models) {
    const int id = ModelId(m);
    if (id >= 0) r.models &= ~(uint64_t{1} << id);
  }
  return r;
}

bool Cluster::GpuFits(const Request& req, const NodeState& node, int gpu) const {
  const auto& g = node.gpus[static_cast<size_t>(gpu)];
  if (!g.healthy || g.model < 0 || ((req.models >> g.model) & 1U) == 0) return false;
  if (req.Mig()) {
    for (size_t i = 0; i < g.mig.size(); ++i) {
      if (!g.mig_used[i] && MigMatches(g, i, req)) return true;
    }
    return false;
  }
  if (req.whole) return g.FullyFree();
  if (g.IsMig()) return false;  // shares need a GPU that is not partitioned
  if (g.max_shares > 0 && g.pods >= g.max_shares) return false;
  return g.free_milli >= req.milli && (req.gpu_memory == 0 || g.free_memory_mib >= req.gpu_memory);
}

int Cluster::FittingGpus(const Request& req, const NodeState& node) const {
  int n = 0;
  for (size_t i = 0; i < node.gpus.size(); ++i) n += GpuFits(req, node, static_cast<int>(i)) ? 1 : 0;
  return n;
}

bool Cluster::SharesFitTogether(std::span<const Request* const> reqs, int id) const {
  const auto& n = nodes_[static_cast<size_t>(id)];
  if (!n.active || reqs.empty() || n.gpus.size() > 64) return false;
  int64_t cpu = 0, memory = 0;
  for (const Request* r : reqs) {
    if (!r->Share() || r->num_gpus != 1) return false;
    cpu += r->cpu;
    memory += r->memory;
  }
  if (n.cpu_free < cpu || n.memory_free < memory || n.pods + static_cast<int>(reqs.size()) > n.max_pods) return false;
  struct Left {
    int milli;
    int64_t memory;
    int pods;
  };
  std::array<Left, 64> left{};
  for (size_t g = 0; g < n.gpus.size(); ++g)
    left[g] = {n.gpus[g].free_milli, n.gpus[g].free_memory_mib, n.gpus[g].pods};
  std::array<const Request*, 16> order{};
  if (reqs.size() > order.size()) return false;
  std::copy(reqs.begin(), reqs.end(), order.begin());
  std::sort(order.begin(), order.begin() + static_cast<long>(reqs.size()), [](const Request* a, const Request* b) {
    return std::tie(a->gpu_memory, a->milli) > std::tie(b->gpu_memory, b->milli);
  });
  for (size_t k = 0; k < reqs.size(); ++k) {
    const Request& r = *order[k];
    bool placed = false;
    for (size_t g = 0; g < n.gpus.size() && !placed; ++g) {
      const GpuState& gs = n.gpus[g];  // as GpuFits, on what is left
      Left& l = left[g];
      if (!gs.healthy || gs.model < 0 || ((r.models >> gs.model) & 1U) == 0 || gs.IsMig()) continue;
      if (gs.max_shares > 0 && l.pods >= gs.max_shares) continue;
      if (l.milli < r.milli || (r.gpu_memory != 0 && l.memory < r.gpu_memory)) continue;
      l.milli -= r.milli;
      l.memory -= r.gpu_memory;
      ++l.pods;
      placed = true;
    }
    if (!placed) return false;
  }
  return true;
}

bool Cluster::NodeFits(const Request& req, int id) const {
  const auto& n = nodes_[static_cast<size_t>(id)];
  if (!n.active || n.cpu_free < req.cpu || n.memory_free < req.memory || n.pods >= n.max_pods) return false;
  if (req.CpuOnly()) return true;
  int need = req.num_gpus;
  for (size_t i = 0; i < n.gpus.size() && need > 0; ++i) {
    if (GpuFits(req, n, static_cast<int>(i))) --need;
  }
  return need == 0;
}

std::vector<int> Cluster::PickGpuSet(const Request& req, const NodeState& node) const {
  std::vector<int> fit;
  bool islands = false;
  for (size_t i = 0; i < node.gpus.size(); ++i) {
    if (!GpuFits(req, node, static_cast<int>(i))) continue;
    fit.push_back(static_cast<int>(i));
    islands = islands || node.gpus[i].nvlink_island >= 0;
  }
  const auto count = static_cast<size_t>(req.num_gpus);
  if (fit.size() < count) return {};
  if (islands && count > 1) {
    // The smallest island that holds the whole set keeps bigger islands whole for bigger jobs.
    std::map<int, std::vector<int>> by_island;
    for (int g : fit) by_island[node.gpus[static_cast<size_t>(g)].nvlink_island].push_back(g);
    const std::vector<int>* best = nullptr;
    for (const auto& [island, gpus] : by_island) {
      if (island < 0 || gpus.size() < count) continue;
      if (best == nullptr || gpus.size() < best->size()) best = &gpus;
    }
    if (best != nullptr) return {best->begin(), best->begin() + static_cast<long>(count)};
  }
  fit.resize(count);
  return fit;
}

absl::Status Cluster::Bind(const Request& req, const Placement& p) {
  if (pods_.contains(req.name)) return absl::AlreadyExistsError(Cat("pod ", req.name, ": already bound"));
  if (p.node < 0 || p.node >= static_cast<int>(nodes_.size()) || !nodes_[static_cast<size_t>(p.node)].active) {
    return absl::InvalidArgumentError(Cat("pod ", req.name, ": placement names no active node"));
  }
  auto& n = nodes_[static_cast<size_t>(p.node)];
  if (n.cpu_free < req.cpu || n.memory_free < req.memory || n.pods >= n.max_pods) {
    return absl::FailedPreconditionError(Cat("pod ", req.name, ": node ", n.name, " lacks CPU, memory or a pod slot"));
  }
  if (static_cast<int>(p.gpus.size()) != (req.CpuOnly() ? 0 : req.num_gpus)) {
    return absl::InvalidArgumentError(
        Cat("pod ", req.name, ": placement has ", p.gpus.size(), " GPUs for a request of ", req.num_gpus));
  }
  for (size_t i = 0; i < p.gpus.size(); ++i) {
    const int g = p.gpus[i];
    if (g < 0 || g >= static_cast<int>(n.gpus.size()) || !GpuFits(req, n, g) ||
        std::count(p.gpus.begin(), p.gpus.end(), g) != 1) {
      return absl::FailedPreconditionError(Cat("pod ", req.name, ": GPU ", g, " on node ", n.name, " does not fit"));
    }
  }
  PodRecord rec{req, p, 0};
  rec.placement.milli_each = 0;
  rec.placement.memory_mib_each = req.gpu_memory;
  for (int gi : p.gpus) {
    auto& g = n.gpus[static_cast<size_t>(gi)];
    int take = req.milli;
    if (req.Mig()) {
      int inst = -1;
      if (p.mig_instance >= 0 && p.mig_instance < static_cast<int>(g.mig.size()) &&
          !g.mig_used[static_cast<size_t>(p.mig_instance)] && MigMatches(g, static_cast<size_t>(p.mig_instance), req)) {
        inst = p.mig_instance;
      }
      for (size_t i = 0; inst < 0 && i < g.mig.size(); ++i) {
        if (!g.mig_used[i] && MigMatches(g, i, req)) inst = static_cast<int>(i);
      }
      g.mig_used[static_cast<size_t>(inst)] = 1;
      rec.placement.mig_instance = inst;
      take = g.mig[static_cast<size_t>(inst)].milli;
      rec.placement.memory_mib_each = g.mig[static_cast<size_t>(inst)].memory_mib;
    } else if (req.whole) {
      take = kMilli;
      std::fill(g.mig_used.begin(), g.mig_used.end(), 1);
      g.free_memory_mib = 0;
    } else {
      g.free_memory_mib -= req.gpu_memory;
    }
    CountFreeChange(n, g, -take);
    g.free_milli -= take;
    ++g.pods;
    rec.placement.milli_each = take;
    rec.milli += take;
  }
  n.cpu_free -= req.cpu;
  n.memory_free -= req.memory;
  ++n.pods;
  ++n.version;
  pods_.emplace(req.name, std::move(rec));
  return absl::OkStatus();
}

absl::Status Cluster::Release(std::string_view pod) {
  auto it = pods_.find(std::string(pod));
  if (it == pods_.end()) return absl::NotFoundError(Cat("pod ", pod, ": not bound"));
  const auto& rec = it->second;
  auto& n = nodes_[static_cast<size_t>(rec.placement.node)];
  for (int gi : rec.placement.gpus) {
    auto& g = n.gpus[static_cast<size_t>(gi)];
    CountFreeChange(n, g, rec.placement.milli_each);
    g.free_milli += rec.placement.milli_each;
    --g.pods;
    if (rec.req.Mig()) {
      g.mig_used[static_cast<size_t>(rec.placement.mig_instance)] = 0;
    } else if (rec.req.whole) {
      std::fill(g.mig_used.begin(), g.mig_used.end(), 0);
      g.free_memory_mib = g.memory_mib - g.untracked_mib;
    } else {
      g.free_memory_mib += rec.req.gpu_memory;
    }
  }
  n.cpu_free += rec.req.cpu;
  n.memory_free += rec.req.memory;
  --n.pods;
  ++n.version;
  pods_.erase(it);
  return absl::OkStatus();
}

const Placement* Cluster::FindPod(std::string_view pod) const {
  auto it = pods_.find(std::string(pod));
  return it == pods_.end() ? nullptr : &it->second.placement;
}

}  // namespace kgpu::sched
