#pragma once
// The cluster model the placement engine works on: nodes (CPU, memory, pods, labels) and their
// GPUs (model, memory, free milli-GPU and memory, health, MIG instances, NVLink islands), the pods
// bound to them, and device-level feasibility. Every change bumps the touched node's version, so
// policies can cache per-node figures and recompute only what a placement touched.
//
// Thread-safety: not thread-safe; one owner (the Engine) drives it.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sched/types.h"

namespace kgpu::sched {

// At most this many distinct GPU models in one cluster (model sets are 64-bit masks).
inline constexpr int kMaxModels = 64;

struct GpuState {
  int model = -1;  // interned model id
  int64_t memory_mib = 0;
  int free_milli = kMilli;
  int64_t free_memory_mib = 0;
  bool healthy = true;
  int nvlink_island = -1;
  int pods = 0;        // pods using this GPU
  int max_shares = 0;  // 0: no limit
  // Memory in use that no placement here accounts for (another user of the GPU, seen by its node's
  // NVML report): out of free_memory_mib, and the GPU is not free for a whole-GPU pod.
  int64_t untracked_mib = 0;
  std::vector<MigInstance> mig;
  std::vector<int> mig_used;  // per instance: 1 when taken
  std::vector<int> mig_ids;   // per instance: its profile's interned id (compared, not the names)
  bool IsMig() const { return !mig.empty(); }
  bool FullyFree() const { return pods == 0 && free_milli == kMilli && untracked_mib == 0; }
};

struct NodeState {
  std::string name;
  bool active = false;
  int64_t cpu_total = 0, cpu_free = 0;
  int64_t memory_total = 0, memory_free = 0;
  int max_pods = kDefaultMaxPods;
  int pods = 0;
  std::map<std::string, std::string> labels;
  std::vector<GpuState> gpus;
  int model = -1;        // the model id of all its GPUs; -1: none or mixed
  uint64_t rank = 0;     // tie-break order (lower first), fixed per seed
  uint64_t version = 0;  // bumped on every change
  // Free milli and fully free GPUs of the healthy GPUs that whole-GPU and shared pods may use: a
  // GPU in MIG mode serves only MIG instances, so it is not counted (as in the fragmentation
  // counts): a node whose two MIG GPUs are idle does not read as two GPUs emptier.
  int64_t FreeGpuMilli() const;
  int FullyFreeGpus() const;
};

// A PodRequest checked and resolved against the cluster's model names.
struct Request {
  std::string name;
  int64_t cpu = 0, memory = 0;
  int num_gpus = 0;
  int milli = 0;           // per GPU (1000 for whole GPUs)
  int64_t gpu_memory = 0;  // per GPU
  std::string mig_profile;
  int mig_profile_id = -1;         // interned (Compile); -1: no node had the profile then (names compared)
  uint64_t models = ~uint64_t{0};  // allowed model ids
  bool whole = false;

  bool CpuOnly() const { return num_gpus == 0 && mig_profile.empty(); }
  bool Mig() const { return !mig_profile.empty(); }
  bool Share() const { return !CpuOnly() && !Mig() && !whole; }
  // GPU milli this pod takes in total (a MIG pod: its instance's share, set at placement).
  int64_t GpuMilli() const { return Mig() ? 0 : int64_t{num_gpus} * milli; }
};

class Cluster {
 public:
  absl::StatusOr<int> AddNode(const NodeSpec& spec, uint64_t rank);
  // Removes a node and the pods bound to it (their names in *evicted when given).
  absl::Status RemoveNode(std::string_view name, std::vector<std::string>* evicted = nullptr);
  // Health of one GPU; an unhealthy GPU takes no new pods (bound pods stay).
  absl::Status SetGpuHealth(std::string_view node, int gpu, bool healthy);
  // Memory of one GPU in use outside the placements (GpuState::untracked_mib), replacing the last.
  absl::Status SetGpuUntracked(std::string_view node, int gpu, int64_t mib);

  // Resolves a request: validates its form and turns model names into a mask.
  absl::StatusOr<Request> Compile(const PodRequest& pod) const;

  // Node-level filter: CPU, memory, pod count and enough fitting GPUs.
  bool NodeFits(const Request& req, int node) const;
  // Whether one GPU can take (one GPU's part of) the request.
  bool GpuFits(const Request& req, const NodeState& node, int gpu) const;
  // Whether single-GPU shares `reqs` fit on node `id` all at once: first fit, largest first, on a
  // copy of the node's free figures. True proves an arrangement exists (what a filter asks);
  // false proves nothing (other kinds of request, or an arrangement first fit misses).
  bool SharesFitTogether(std::span<const Request* const> reqs, int id) const;
  // Number of GPUs on the node that fit the request.
  int FittingGpus(const Request& req, const NodeState& node) const;
  // For a multi-GPU request: `count` GPUs from the fitting ones, NVLink-aware (the smallest
  // island that holds them all, else the lowest indices).
  std::vector<int> PickGpuSet(const Request& req, const NodeState& node) const;

  // Binds a pod at a placement after checking it still fits; Release undoes it.
  absl::Status Bind(const Request& req, const Placement& placement);
  absl::Status Release(std::string_view pod);
  bool HasPod(std::string_view pod) const { return pods_.contains(std::string(pod)); }
  const Placement* FindPod(std::string_view pod) const;

  int FindNode(std::string_view name) const;
  const std::vector<NodeState>& nodes() const { return nodes_; }
  const NodeState& node(int id) const { return nodes_[static_cast<size_t>(id)]; }
  int ModelId(std::string_view model) const;
  const std::vector<std::string>& models() const { return models_; }

  // Totals over healthy GPUs of active nodes, in milli-GPU.
  int64_t TotalGpuMilli() const { return total_milli_; }
  int64_t AllocatedGpuMilli() const { return allocated_milli_; }
  int64_t MaxNodeCpu() const { return max_cpu_; }
  // How many healthy GPUs without MIG on active nodes have each amount of free milli (index
  // 0..kMilli): the leftovers that shares can still use, kept up to date by every change.
  const std::vector<int64_t>& FreeMilliCounts() const { return free_counts_; }
  int MaxNodeGpus() const { return max_gpus_; }
  size_t PodCount() const { return pods_.size(); }
  size_t ActiveNodes() const { return active_nodes_; }

 private:
  struct PodRecord {
    Request req;
    Placement placement;
    int64_t milli = 0;  // GPU milli it took
  };
  int InternModel(const std::string& model);
  int InternMigProfile(const std::string& profile);
  // Instance i of g is of req's MIG profile.
  static bool MigMatches(const GpuState& g, size_t i, const Request& req) {
    return req.mig_profile_id >= 0 ? g.mig_ids[i] == req.mig_profile_id : g.mig[i].profile == req.mig_profile;
  }
  // A node's GPU by node name and index; NotFound / OutOfRange naming what is missing.
  absl::StatusOr<std::pair<NodeState*, GpuState*>> FindGpu(std::string_view node, int gpu);
  void Recount();
  void CountNode(const NodeState& n, int sign);  // add (+1) or take (-1) one node's share of the totals
  void CountGpu(const GpuState& g, int sign);    // one healthy GPU's share of them
  // Moves one GPU's free milli by `delta` in the totals it counts in (when it counts: a healthy GPU
  // of an active node), before the change is applied to the GPU.
  void CountFreeChange(const NodeState& n, const GpuState& g, int delta);

  std::vector<NodeState> nodes_;
  absl::flat_hash_map<std::string, int> node_index_;
  absl::flat_hash_map<std::string, PodRecord> pods_;
  std::vector<std::string> models_;
  absl::flat_hash_map<std::string, int> mig_profiles_;  // MIG profile -> interned id
  int64_t total_milli_ = 0, allocated_milli_ = 0, max_cpu_ = 0;
  std::vector<int64_t> free_counts_ = std::vector<int64_t>(kMilli + 1, 0);
  int max_gpus_ = 0;
  size_t active_nodes_ = 0;
};

}  // namespace kgpu::sched
