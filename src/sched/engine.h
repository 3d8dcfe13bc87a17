#pragma once
// The placement engine: a Cluster and a Policy behind one small API that the simulator and the
// scheduler extender both drive: add/remove nodes, schedule (choose + bind) or choose only,
// bind a choice made elsewhere, release, and query.
//
// Deterministic for a seed: the node tie-break order is drawn from the seed when nodes are added.
// Pure: no I/O, no clock.
//
// Thread-safety: not thread-safe; one owner.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sched/cluster.h"
#include "sched/policy.h"
#include "sched/rng.h"

namespace kgpu::sched {

class Engine {
 public:
  Engine(std::unique_ptr<Policy> policy, uint64_t seed) : policy_(std::move(policy)), rank_rng_(seed) {}

  absl::StatusOr<int> AddNode(const NodeSpec& spec) { return cluster_.AddNode(spec, rank_rng_.Next()); }
  absl::Status RemoveNode(std::string_view name, std::vector<std::string>* evicted = nullptr) {
    return cluster_.RemoveNode(name, evicted);
  }

  // Chooses a node and GPUs for the pod and binds it there. ResourceExhausted when nothing fits
  // (the pod is not bound); InvalidArgument for a malformed request.
  absl::StatusOr<Placement> Schedule(const PodRequest& pod);
  // Chooses without binding (the extender's filter/prioritize); the pod counts as arrived.
  absl::StatusOr<Placement> Choose(const PodRequest& pod);
  // Per-node scores for a pod (feasible nodes only), for a prioritize call.
  absl::StatusOr<std::vector<std::pair<int, Candidate>>> Scores(const PodRequest& pod);
  absl::Status Bind(const PodRequest& pod, const Placement& placement);
  absl::Status Release(std::string_view pod) { return cluster_.Release(pod); }

  const Cluster& cluster() const { return cluster_; }
  Cluster& mutable_cluster() { return cluster_; }
  Policy& policy() { return *policy_; }
  void SetPolicy(std::unique_ptr<Policy> policy) { policy_ = std::move(policy); }

 private:
  absl::StatusOr<Request> Arrive(const PodRequest& pod);
  Cluster cluster_;
  std::unique_ptr<Policy> policy_;
  Rng rank_rng_;
};

}  // namespace kgpu::sched
