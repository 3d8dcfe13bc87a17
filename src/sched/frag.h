#pragma once
// The fragmentation measure of FGD (Weng et al., ATC'23): for a target workload given as task
// shapes with weights, a node's fragmentation is the expected amount of its free GPU milli that
// a task drawn from the workload could not use. A shape that cannot run on the node at all (too
// little CPU, too few GPUs with enough free milli, a model it may not use) or a CPU-only shape
// counts all free GPU milli; a shape that fits counts only the GPUs too small for it.
//
// FragModel evaluates it with a memo keyed by the node's state signature (model, CPU bucket,
// sorted free milli of its GPUs): nodes in the same state share one evaluation, so scoring a pod
// over thousands of nodes is mostly table look-ups. The memo is cleared when the shapes change.
//
// Also here: the shapes of a set of pods (the paper's "typical pods") and the online, decaying
// estimate of the workload that the default policy learns from the pods that have arrived.
//
// Thread-safety: not thread-safe (the memo mutates on reads).

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "sched/cluster.h"

namespace kgpu::sched {

struct Shape {
  int64_t cpu = 0;
  int num_gpus = 0;  // 0: CPU-only
  int milli = 0;     // per GPU
  uint64_t models = ~uint64_t{0};
  double weight = 0;  // popularity (the weights of a workload sum to 1)
  bool operator==(const Shape& o) const {
    return cpu == o.cpu && num_gpus == o.num_gpus && milli == o.milli && models == o.models;
  }
  template <typename H>
  friend H AbslHashValue(H h, const Shape& s) {
    return H::combine(std::move(h), s.cpu, s.num_gpus, s.milli, s.models);
  }
};

// The shape of a request (MIG requests count as shares of their profile's milli: not used).
Shape ShapeOf(const Request& req);

// The paper's typical pods: shapes sorted by count (ties by shape), the most frequent ones until
// they cover `coverage` of the pods, weights renormalised to 1.
std::vector<Shape> TypicalShapes(const std::vector<Request>& pods, double coverage = 0.95);

class FragModel {
 public:
  void SetShapes(std::vector<Shape> shapes);
  const std::vector<Shape>& shapes() const { return shapes_; }
  // Bumped by SetShapes: per-node caches keyed by it know when to recompute.
  uint64_t epoch() const { return epoch_; }

  // Fragmentation of a node as it is.
  double NodeFrag(const NodeState& node);
  // Fragmentation of a node after taking `cpu` milli-CPU and `take[g]` milli on each GPU g
  // (take may be null: no GPU change).
  double NodeFragAfter(const NodeState& node, int64_t cpu, const int* take);
  size_t memo_size() const { return memo_.size(); }

 private:
  double Compute(const NodeState& node, int64_t cpu_free, const int* free) const;
  std::vector<Shape> shapes_;
  std::vector<int64_t> cpu_thresholds_;  // sorted distinct CPU of the GPU shapes
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, double> memo_;
  uint64_t epoch_ = 0;
};

// An online estimate of the workload: every observed request adds weight 1 to its shape, and
// all weights decay with the given half-life (in arrivals), so the estimate follows a changing
// mix. Snapshot() returns the most popular shapes covering `coverage` (at most max_shapes).
class ShapeEstimator {
 public:
  explicit ShapeEstimator(double half_life = 10000, double coverage = 1.0, size_t max_shapes = 200)
      : decay_(half_life > 0 ? std::exp2(-1.0 / half_life) : 1.0), coverage_(coverage), max_shapes_(max_shapes) {}
  void Observe(const Shape& s);
  std::vector<Shape> Snapshot() const;
  uint64_t observed() const { return observed_; }

 private:
  double decay_, coverage_;
  size_t max_shapes_;
  double scale_ = 1.0;  // weight of the next observation (grows instead of decaying the others)
  absl::flat_hash_map<Shape, double> weights_;
  uint64_t observed_ = 0;
};

}  // namespace kgpu::sched
