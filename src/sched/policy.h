#pragma once
// Placement policies. Each one filters nodes at device level (Cluster::NodeFits), scores every
// feasible node, and returns the best node with the exact GPUs; ties between nodes go to the
// node's rank (a fixed random order per seed, as in the paper's replay).
//
//   random   a uniformly random feasible node, a random fitting GPU
//   bestfit  the paper's BestFit: least CPU and GPU left on the node; the tightest GPU
//   packing  the paper's GpuPacking: a shared GPU first, then a free GPU on a used node,
//            then an idle node
//   spread   the most free GPU capacity left (least-allocated); the emptiest GPU
//   fgd      FGD as the paper defines it: the steepest descent of the expected fragmentation for
//            a workload distribution given in advance (the trace's typical pods)
//   ours     the default: the same fragmentation measure on a distribution learned online from
//            the pods that have arrived (every shape, with decay), plus the GPU capacity a node
//            strands for lack of CPU or memory at the learned CPU and memory per GPU, plus, for
//            a share, the balance of the cluster's leftovers (Sum-of-Squares over the count of
//            GPUs by free milli, Cluster::FreeMilliCounts); exact rather than integer scores,
//            ties broken towards the busiest node
//
// Thread-safety: a policy belongs to one Engine.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sched/cluster.h"
#include "sched/frag.h"
#include "sched/rng.h"

namespace kgpu::sched {

// One feasible node's evaluation: higher score first, then higher tie, then lower rank.
struct Candidate {
  double score = 0;
  double tie = 0;
  double tie2 = 0;
  Placement placement;
};

struct PolicyOptions {
  // fgd (required) and ours: a workload distribution given in advance. For ours, when empty the
  // distribution is learned online from the arrived pods.
  std::vector<Shape> shapes;
  double half_life = 10000;  // ours, online: the decay of the learned distribution, in arrivals
  uint64_t seed = 42;        // random
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view Name() const = 0;
  // Every arriving pod, before Choose (online learners count it here).
  virtual void Observe(const Request&) {}
  // Evaluates one node that passed the filter; false when the policy would not use it.
  virtual bool Evaluate(const Cluster& cluster, const Request& req, int node, Candidate* out) = 0;
  // The best node and its GPUs; placement.node is -1 when no node fits.
  virtual Placement Choose(const Cluster& cluster, const Request& req);
  // The workload distribution the policy scores against (empty for the simple ones).
  virtual std::vector<Shape> Shapes() const { return {}; }
};

// Names: random, bestfit, packing (also gpupacking), spread, fgd, ours. Unknown names and fgd
// without shapes are errors that list the choices.
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name, const PolicyOptions& options);
std::vector<std::string> PolicyNames();

// The MIG path shared by all policies: the GPU with a free instance of the profile that has the
// fewest free instances (best fit), ties to the lower index.
bool EvaluateMig(const Cluster& cluster, const Request& req, int node, Candidate* out);

}  // namespace kgpu::sched
