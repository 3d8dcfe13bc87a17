#include "sched/policy.h"

#include <algorithm>
#include <cmath>

#include "common/strings.h"

namespace kgpu::sched {

namespace {

bool Better(const Candidate& a, uint64_t rank_a, const Candidate& b, uint64_t rank_b) {
  if (a.score != b.score) return a.score > b.score;
  if (a.tie != b.tie) return a.tie > b.tie;
  if (a.tie2 != b.tie2) return a.tie2 > b.tie2;
  return rank_a < rank_b;
}

Placement Base(const Request& req, int node) {
  Placement p;
  p.node = node;
  p.milli_each = req.CpuOnly() ? 0 : req.milli;
  p.memory_mib_each = req.gpu_memory;
  return p;
}

// The fitting GPU with the least free milli (lowest index on ties).
int TightestGpu(const Cluster& c, const Request& req, const NodeState& n) {
  int best = -1;
  for (size_t g = 0; g < n.gpus.size(); ++g) {
    if (!c.GpuFits(req, n, static_cast<int>(g))) continue;
    if (best < 0 || n.gpus[g].free_milli < n.gpus[static_cast<size_t>(best)].free_milli) best = static_cast<int>(g);
  }
  return best;
}

// GPUs for a request: one chosen GPU for a single share, else the NVLink-aware set.
void FillGpus(const Cluster& c, const Request& req, const NodeState& n, int single, Placement* p) {
  if (req.CpuOnly()) return;
  if (req.num_gpus == 1 && single >= 0) {
    p->gpus = {single};
  } else {
    p->gpus = c.PickGpuSet(req, n);
  }
}

double Sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// ------------------------------------------------------------------ random
class RandomPolicy : public Policy {
 public:
  explicit RandomPolicy(uint64_t seed) : rng_(seed ^ 0x5eed5eedULL) {}
  std::string_view Name() const override { return "random"; }
  bool Evaluate(const Cluster& c, const Request& req, int node, Candidate* out) override {
    if (req.Mig()) return EvaluateMig(c, req, node, out);
    const auto& n = c.node(node);
    out->placement = Base(req, node);
    if (req.Share() && req.num_gpus == 1) {
      std::vector<int> fit;
      for (size_t g = 0; g < n.gpus.size(); ++g) {
        if (c.GpuFits(req, n, static_cast<int>(g))) fit.push_back(static_cast<int>(g));
      }
      FillGpus(c, req, n, fit[rng_.Below(fit.size())], &out->placement);
    } else {
      FillGpus(c, req, n, -1, &out->placement);
    }
    return true;
  }
  Placement Choose(const Cluster& c, const Request& req) override {
    feasible_.clear();
    for (size_t i = 0; i < c.nodes().size(); ++i) {
      if (c.NodeFits(req, static_cast<int>(i))) feasible_.push_back(static_cast<int>(i));
    }
    if (feasible_.empty()) return {};
    // Feasible nodes in rank order, so the draw does not depend on the order nodes were added.
    std::sort(feasible_.begin(), feasible_.end(), [&](int a, int b) { return c.node(a).rank < c.node(b).rank; });
    Candidate cand;
    Evaluate(c, req, feasible_[rng_.Below(feasible_.size())], &cand);
    return cand.placement;
  }

 private:
  Rng rng_;
  std::vector<int> feasible_;
};

// ------------------------------------------------------------------ bestfit
class BestFitPolicy : public Policy {
 public:
  std::string_view Name() const override { return "bestfit"; }
  bool Evaluate(const Cluster& c, const Request& req, int node, Candidate* out) override {
    if (req.Mig()) return EvaluateMig(c, req, node, out);
    const auto& n = c.node(node);
    const double max_cpu = static_cast<double>(std::max<int64_t>(1, c.MaxNodeCpu()));
    const double max_gpu = static_cast<double>(std::max(1, c.MaxNodeGpus()) * kMilli);
    const double cpu_left = static_cast<double>(n.cpu_free - req.cpu);
    const double gpu_left = static_cast<double>(n.FreeGpuMilli() - req.GpuMilli());
    const double s = (1.0 - 0.5 * cpu_left / max_cpu - 0.5 * gpu_left / max_gpu) * 100.0;
    out->score = static_cast<double>(static_cast<int64_t>(s));  // integer scores, as the paper's
    out->placement = Base(req, node);
    FillGpus(c, req, n, req.Share() ? TightestGpu(c, req, n) : -1, &out->placement);
    return true;
  }
};

// ------------------------------------------------------------------ packing
class PackingPolicy : public Policy {
 public:
  std::string_view Name() const override { return "packing"; }
  bool Evaluate(const Cluster& c, const Request& req, int node, Candidate* out) override {
    if (req.Mig()) return EvaluateMig(c, req, node, out);
    const auto& n = c.node(node);
    out->placement = Base(req, node);
    if (req.CpuOnly()) {
      out->score = 0;
      return true;
    }
    // GPUs with the least milli left first (stable by index).
    order_.clear();
    for (size_t g = 0; g < n.gpus.size(); ++g) order_.push_back(static_cast<int>(g));
    std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) {
      return n.gpus[static_cast<size_t>(a)].free_milli < n.gpus[static_cast<size_t>(b)].free_milli;
    });
    std::vector<int> use;
    int fully_free_used = 0;
    for (int g : order_) {
      if (static_cast<int>(use.size()) == req.num_gpus) break;
      if (!c.GpuFits(req, n, g)) continue;
      use.push_back(g);
      if (n.gpus[static_cast<size_t>(g)].free_milli == kMilli) ++fully_free_used;
    }
    const int fully_free = n.FullyFreeGpus();
    int64_t score;
    if (fully_free == static_cast<int>(n.gpus.size())) {
      score = std::max<int64_t>(100 / 3 - fully_free, fully_free);
    } else if (fully_free_used > 0) {
      score = std::max<int64_t>(100 / 2 - fully_free_used, 100 / 3);
    } else {
      int64_t ratio = 0;
      for (int g : use) ratio += n.gpus[static_cast<size_t>(g)].free_milli * 100 / kMilli;
      score = std::max<int64_t>(100 - ratio / 10, 100 / 2);
    }
    out->score = static_cast<double>(score);
    std::sort(use.begin(), use.end());
    if (req.num_gpus == 1 || !req.whole) {
      out->placement.gpus = use;
    } else {
      FillGpus(c, req, n, -1, &out->placement);
    }
    return true;
  }

 private:
  std::vector<int> order_;
};

// ------------------------------------------------------------------ spread
class SpreadPolicy : public Policy {
 public:
  std::string_view Name() const override { return "spread"; }
  bool Evaluate(const Cluster& c, const Request& req, int node, Candidate* out) override {
    if (req.Mig()) return EvaluateMig(c, req, node, out);
    const auto& n = c.node(node);
    out->score = static_cast<double>(n.FreeGpuMilli() - req.GpuMilli());
    out->tie = static_cast<double>(n.cpu_free - req.cpu) / static_cast<double>(std::max<int64_t>(1, n.cpu_total));
    out->placement = Base(req, node);
    int emptiest = -1;
    if (req.Share()) {
      for (size_t g = 0; g < n.gpus.size(); ++g) {
        if (!c.GpuFits(req, n, static_cast<int>(g))) continue;
        if (emptiest < 0 || n.gpus[g].free_milli > n.gpus[static_cast<size_t>(emptiest)].free_milli) {
          emptiest = static_cast<int>(g);
        }
      }
    }
    FillGpus(c, req, n, emptiest, &out->placement);
    return true;
  }
};

// ------------------------------------------------------------------ fragmentation-based
// The fragmentation of each node as it is, recomputed only when the node changed (its version)
// or the workload distribution did (the model's epoch).
class FragCache {
 public:
  double Get(FragModel& model, const NodeState& n, int id) {
    const auto i = static_cast<size_t>(id);
    if (i >= frag_.size()) {
      frag_.resize(i + 1, 0);
      version_.resize(i + 1, ~uint64_t{0});
      epoch_.resize(i + 1, ~uint64_t{0});
    }
    if (version_[i] != n.version || epoch_[i] != model.epoch()) {
      frag_[i] = model.NodeFrag(n);
      version_[i] = n.version;
      epoch_[i] = model.epoch();
    }
    return frag_[i];
  }

 private:
  std::vector<double> frag_;
  std::vector<uint64_t> version_, epoch_;
};

class FragPolicyBase : public Policy {
 public:
  std::vector<Shape> Shapes() const override { return model_.shapes(); }

 protected:
  // The fragmentation after placing the request on GPU `single` (a share) or on the GPU set.
  double After(const Cluster&, const Request& req, const NodeState& n, int single, const std::vector<int>* set) {
    take_.assign(n.gpus.size(), 0);
    if (single >= 0) take_[static_cast<size_t>(single)] = req.milli;
    if (set != nullptr) {
      for (int g : *set)
        take_[static_cast<size_t>(g)] = req.whole ? n.gpus[static_cast<size_t>(g)].free_milli : req.milli;
    }
    return model_.NodeFragAfter(n, req.cpu, take_.data());
  }
  FragModel model_;
  FragCache cache_;
  std::vector<int> take_;
  std::vector<int> seen_;
};

class FgdPolicy : public FragPolicyBase {
 public:
  explicit FgdPolicy(std::vector<Shape> shapes) { model_.SetShapes(std::move(shapes)); }
  std::string_view Name() const override { return "fgd"; }
  bool Evaluate(const Cluster& c, const Request& req, int node, Candidate* out) override {
    if (req.Mig()) return EvaluateMig(c, req, node, out);
    const auto& n = c.node(node);
    out->placement = Base(req, node);
    if (req.CpuOnly() && req.cpu == 0 && req.memory == 0) {
      out->score = 100;  // a pod without requests
      return true;
    }
    const double before = cache_.Get(model_, n, node);
    if (req.Share() && req.num_gpus == 1) {
      // The GPU with the best integer score, the lowest index on ties; GPUs with the same free
      // milli give the same score, so each distinct value is evaluated once.
      int64_t best = -1;
      int best_gpu = -1;
      seen_.clear();
      for (size_t g = 0; g < n.gpus.size(); ++g) {
        if (!c.GpuFits(req, n, static_cast<int>(g))) continue;
        const int v = n.gpus[g].free_milli;
        if (std::find(seen_.begin(), seen_.end(), v) != seen_.end()) continue;
        seen_.push_back(v);
        const double after = After(c, req, n, static_cast<int>(g), nullptr);
        const auto s = static_cast<int64_t>(Sigmoid((before - after) / 1000.0) * 100.0);
        if (best_gpu < 0 || s > best) {
          best = s;
          best_gpu = static_cast<int>(g);
        }
      }
      out->score = static_cast<double>(best);
      out->placement.gpus = {best_gpu};
      return true;
    }
    FillGpus(c, req, n, -1, &out->placement);
    const double after = After(c, req, n, -1, &out->placement.gpus);
    out->score = static_cast<double>(static_cast<int64_t>(Sigmoid((before - after) / 1000.0) * 100.0));
    return true;
  }
};

// ours: FGD's fragmentation measure on a workload learned online from the arrived pods (every
// shape, decaying), plus the GPU capacity a node strands for lack of CPU or memory, plus a balance
// of the cluster's leftovers; exact scores, ties to the busiest node.
//
// Stranded capacity: the pods that will come ask, on average, rho milli-CPU and sigma MiB of
// memory per milli-GPU (learned from the arrived GPU pods, with the same decay). A node whose
// free CPU (memory) cannot carry its free GPU milli at that ratio strands the difference:
// stranded = max(0, free_gpu - min(free_cpu / rho, free_memory / sigma)). A placement's cost is
// the change of fragmentation plus the change of stranded milli (both in milli-GPU): a CPU-heavy
// pod goes where CPU is plentiful, a CPU-light one where CPU is short, which FGD alone only sees
// once a typical pod no longer fits.
//
// Balance of leftovers (the Sum-of-Squares rule of online bin packing, Csirik et al., "On the
// Sum-of-Squares algorithm for bin packing", J. ACM 2006): N(h) is the number of the cluster's
// GPUs with exactly h milli free, 0 < h < 1000. A share that turns a leftover of h into one of
// h - s changes sum_h W(h) N(h)^2; the cost adds that change, times kBalanceWeight / (number of
// GPUs). Leftovers of one size piling up while other sizes are missing is what leaves the pods
// that arrive later without a GPU that fits them exactly; FGD's measure looks at one node at a
// time and cannot see it. W(h) = min(1, F(h) / kLiveShare), F(h) the learned fraction of GPU pods
// that a leftover of h could take: a leftover almost no arriving pod can use (the 60 milli beside
// two 470s) must not count fully, or the rule would refuse the best pairs to avoid making more of
// it.
class OursPolicy : public FragPolicyBase {
 public:
  OursPolicy(std::vector<Shape> shapes, double half_life)
      : online_(shapes.empty()),
        estimator_(half_life, /*coverage=*/1.0, /*max_shapes=*/kMaxLearnedShapes),
        decay_(half_life > 0 ? std::exp2(-1.0 / half_life) : 1.0) {
    model_.SetShapes(std::move(shapes));
    UpdateWorkloadFigures();
  }
  std::string_view Name() const override { return "ours"; }
  void Observe(const Request& req) override {
    if (req.Mig()) return;
    if (!req.CpuOnly()) {
      memory_sum_ = memory_sum_ * decay_ + static_cast<double>(req.memory);
      milli_sum_ = milli_sum_ * decay_ + static_cast<double>(req.GpuMilli());
      sigma_ = milli_sum_ > 0 ? memory_sum_ / milli_sum_ : 0;
    }
    if (!online_) return;
    estimator_.Observe(ShapeOf(req));
    const uint64_t k = estimator_.observed();
    // Often while the estimate is young, then every 256 arrivals (each refresh clears the memo).
    if ((k & (k - 1)) == 0 || k % 256 == 0) {
      model_.SetShapes(estimator_.Snapshot());
      UpdateWorkloadFigures();
    }
  }
  bool Evaluate(const Cluster& c, const Request& req, int node, Candidate* out) override {
    if (req.Mig()) return EvaluateMig(c, req, node, out);
    const auto& n = c.node(node);
    out->placement = Base(req, node);
    const double before = cache_.Get(model_, n, node);
    double delta;
    if (req.Share() && req.num_gpus == 1) {
      // The GPU whose use adds the least fragmentation, then the tightest, then the lowest index.
      double best = 0;
      int best_gpu = -1;
      seen_.clear();
      for (size_t g = 0; g < n.gpus.size(); ++g) {
        if (!c.GpuFits(req, n, static_cast<int>(g))) continue;
        const int v = n.gpus[g].free_milli;
        if (std::find(seen_.begin(), seen_.end(), v) != seen_.end()) continue;
        seen_.push_back(v);
        const double d =
            Quantize(After(c, req, n, static_cast<int>(g), nullptr) - before) + Balance(c, v, v - req.milli);
        if (best_gpu < 0 || d < best || (d == best && v < n.gpus[static_cast<size_t>(best_gpu)].free_milli)) {
          best = d;
          best_gpu = static_cast<int>(g);
        }
      }
      delta = best;
      out->placement.gpus = {best_gpu};
    } else {
      FillGpus(c, req, n, -1, &out->placement);
      delta = Quantize(After(c, req, n, -1, req.CpuOnly() ? nullptr : &out->placement.gpus) - before);
    }
    const auto gpu0 = static_cast<double>(n.FreeGpuMilli()), gpu1 = gpu0 - static_cast<double>(req.GpuMilli());
    const auto cpu0 = static_cast<double>(n.cpu_free), cpu1 = cpu0 - static_cast<double>(req.cpu);
    const auto mem0 = static_cast<double>(n.memory_free), mem1 = mem0 - static_cast<double>(req.memory);
    delta += Quantize(Stranded(gpu1, cpu1, mem1) - Stranded(gpu0, cpu0, mem0));
    out->score = -delta;
    // Ties: the node with the least GPU left (keeps idle nodes and whole GPUs for big tasks),
    // then the least CPU left relative to its size.
    out->tie = -gpu1;
    out->tie2 = -cpu1 / static_cast<double>(std::max<int64_t>(1, n.cpu_total));
    return true;
  }

 private:
  static constexpr size_t kMaxLearnedShapes = 200;
  // See the class comment; measured on the default trace and the derived workloads of
  // bench/sim_workloads.py (docs/sim.md), not tuned per workload.
  static constexpr double kBalanceWeight = 200000;
  static constexpr double kLiveShare = 0.01;
  // W(h) of the class comment.
  double LeftoverWeight(int h) const {
    return h > 0 && h < kMilli ? std::min(1.0, fits_[static_cast<size_t>(h)] / kLiveShare) : 0.0;
  }
  // The cost of turning one leftover of `from` milli into one of `to` (1000: a free GPU, 0: full).
  double Balance(const Cluster& c, int from, int to) const {
    const auto gpus = static_cast<double>(c.TotalGpuMilli() / kMilli);
    if (gpus <= 0) return 0;
    const auto& count = c.FreeMilliCounts();
    double d = 0;
    d += LeftoverWeight(to) * (2.0 * static_cast<double>(count[static_cast<size_t>(to)]) + 1);
    d -= LeftoverWeight(from) * (2.0 * static_cast<double>(count[static_cast<size_t>(from)]) - 1);
    return Quantize(kBalanceWeight * d / gpus);
  }
  // Equal costs computed along different paths must compare equal.
  static double Quantize(double d) { return std::round(d * 1e6) / 1e6; }
  // rho_, and fits_: fits_[h] is the fraction of the GPU shapes' weight whose pods a GPU with h
  // milli free could take.
  void UpdateWorkloadFigures() {
    double cpu = 0, milli = 0, gpu_weight = 0;
    std::fill(fits_.begin(), fits_.end(), 0.0);
    for (const auto& sh : model_.shapes()) {
      if (sh.num_gpus == 0) continue;
      cpu += sh.weight * static_cast<double>(sh.cpu);
      milli += sh.weight * static_cast<double>(sh.milli) * sh.num_gpus;
      gpu_weight += sh.weight;
      if (sh.milli > 0 && sh.milli <= kMilli) fits_[static_cast<size_t>(sh.milli)] += sh.weight;
    }
    rho_ = milli > 0 ? cpu / milli : 0;
    double sum = 0;
    for (auto& f : fits_) {
      sum += f;
      f = gpu_weight > 0 ? sum / gpu_weight : 0;
    }
  }
  double Stranded(double gpu_free, double cpu_free, double memory_free) const {
    if (rho_ <= 0) return 0;
    double carried = cpu_free / rho_;
    if (sigma_ > 0) carried = std::min(carried, memory_free / sigma_);
    return std::max(0.0, gpu_free - carried);
  }
  bool online_;
  ShapeEstimator estimator_;
  double decay_;
  double rho_ = 0;  // milli-CPU per milli-GPU of the GPU shapes
  std::vector<double> fits_ = std::vector<double>(kMilli + 1, 0.0);
  double sigma_ = 0;  // MiB per milli-GPU of the arrived GPU pods (decayed)
  double memory_sum_ = 0, milli_sum_ = 0;
};

}  // namespace

bool EvaluateMig(const Cluster& c, const Request& req, int node, Candidate* out) {
  const auto& n = c.node(node);
  int best = -1, best_free = 0;
  for (size_t g = 0; g < n.gpus.size(); ++g) {
    if (!c.GpuFits(req, n, static_cast<int>(g))) continue;
    int free = 0;
    for (size_t i = 0; i < n.gpus[g].mig.size(); ++i) free += n.gpus[g].mig_used[i] ? 0 : 1;
    if (best < 0 || free < best_free) {
      best = static_cast<int>(g);
      best_free = free;
    }
  }
  if (best < 0) return false;
  out->placement = Placement{};
  out->placement.node = node;
  out->placement.gpus = {best};
  out->score = -static_cast<double>(best_free);
  out->tie = -static_cast<double>(n.FreeGpuMilli());
  return true;
}

Placement Policy::Choose(const Cluster& c, const Request& req) {
  Candidate best, cand;
  int best_node = -1;
  const auto& nodes = c.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int id = static_cast<int>(i);
    if (!c.NodeFits(req, id)) continue;
    if (!Evaluate(c, req, id, &cand)) continue;
    if (best_node < 0 || Better(cand, nodes[i].rank, best, nodes[static_cast<size_t>(best_node)].rank)) {
      best = std::move(cand);
      best_node = id;
      cand = Candidate{};
    }
  }
  return best_node < 0 ? Placement{} : best.placement;
}

std::vector<std::string> PolicyNames() {
  return {"random", "bestfit", "packing", "spread", "fgd", "ours"};
}

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name, const PolicyOptions& o) {
  if (name == "random") return std::unique_ptr<Policy>(new RandomPolicy(o.seed));
  if (name == "bestfit") return std::unique_ptr<Policy>(new BestFitPolicy());
  if (name == "packing" || name == "gpupacking") return std::unique_ptr<Policy>(new PackingPolicy());
  if (name == "spread") return std::unique_ptr<Policy>(new SpreadPolicy());
  if (name == "fgd") {
    if (o.shapes.empty()) {
      return absl::InvalidArgumentError("policy fgd: needs the workload's shape distribution in advance (none given)");
    }
    return std::unique_ptr<Policy>(new FgdPolicy(o.shapes));
  }
  if (name == "ours") return std::unique_ptr<Policy>(new OursPolicy(o.shapes, o.half_life));
  return absl::InvalidArgumentError(Cat("policy '", name, "': unknown (use one of ", Join(PolicyNames(), ", "), ")"));
}

}  // namespace kgpu::sched
