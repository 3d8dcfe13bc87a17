#pragma once
// The placement engine's vocabulary: nodes with their GPUs, pod requests and placements.
// Plain values, no Kubernetes types: the simulator and the scheduler extender both fill them.
//
// Thread-safety: plain values.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kgpu::sched {

// A whole GPU is 1000 milli-GPU.
inline constexpr int kMilli = 1000;
// Kubernetes' hard ceiling used by the paper's replay (kubelet --max-pods upper bound).
inline constexpr int kDefaultMaxPods = 1001;

// A MIG GPU instance: a fixed slice of one GPU.
struct MigInstance {
  std::string profile;     // e.g. "1g.10gb"
  int compute_slices = 1;  // out of the GPU's 7
  int64_t memory_mib = 0;
  int milli = 0;  // its share of the GPU in milli-GPU (slices * 1000 / 7)
};

struct GpuSpec {
  std::string model;       // e.g. "A100-SXM4-80GB", "T4", "G2"
  int64_t memory_mib = 0;  // 0: unknown (then requests by GPU memory cannot use this GPU)
  bool healthy = true;
  int nvlink_island = -1;        // GPUs with the same island id are NVLink peers; -1: none
  int max_shares = 0;            // at most this many pods share the GPU (MPS clients); 0: no limit
  std::vector<MigInstance> mig;  // non-empty: the GPU is in MIG mode with these instances
};

struct NodeSpec {
  std::string name;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int max_pods = kDefaultMaxPods;
  std::map<std::string, std::string> labels;
  std::vector<GpuSpec> gpus;
};

// What a pod asks for. GPU forms (one of):
//  - none:    num_gpus == 0 and mig_profile empty (a CPU-only pod);
//  - whole:   num_gpus >= 1, gpu_milli == 1000 and gpu_memory_mib == 0: fully free GPUs;
//  - shares:  num_gpus >= 1 with gpu_milli < 1000 and/or gpu_memory_mib > 0: each of num_gpus
//             GPUs gives gpu_milli milli-GPU and gpu_memory_mib MiB;
//  - MIG:     mig_profile names the instance profile (num_gpus ignored: one instance).
struct PodRequest {
  std::string name;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int num_gpus = 0;
  int gpu_milli = 0;           // per GPU
  int64_t gpu_memory_mib = 0;  // per GPU
  std::string mig_profile;
  std::vector<std::string> allowed_models;  // empty: any model
  std::vector<std::string> denied_models;

  bool WantsGpu() const { return num_gpus > 0 || !mig_profile.empty(); }
  bool WholeGpus() const { return mig_profile.empty() && num_gpus > 0 && gpu_milli >= kMilli && gpu_memory_mib == 0; }
};

// Where a pod goes: the node and the exact GPUs (indices on the node), and for MIG the instance.
struct Placement {
  int node = -1;                // node id in the Cluster
  std::vector<int> gpus;        // GPU indices on the node, ascending
  int milli_each = 0;           // milli-GPU taken on each GPU (1000 for whole GPUs)
  int64_t memory_mib_each = 0;  // GPU memory taken on each GPU
  int mig_instance = -1;        // index into GpuSpec::mig of gpus[0]

  bool ok() const { return node >= 0; }
};

}  // namespace kgpu::sched
