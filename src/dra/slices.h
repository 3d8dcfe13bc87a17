#pragma once
// The ResourceSlices of one node's pool, built from the node's one inventory
// (k8s.io/api resource/v1 types.go; NVIDIA's kubernetes-sigs/dra-driver-nvidia-gpu
// cmd/gpu-kubelet-plugin/{deviceinfo,mig,partitions}.go; docs/dra.md says what each device is):
//   - every GPU without MIG mode: a whole-GPU device `gpu-<minor>` with NVIDIA's attributes and its
//     memory; on a GPU the node offers for sharing, the same device with allowMultipleAllocations
//     and consumable capacity `memory` (bytes, 1 Mi steps) and `cores` (percent), a claim that asks
//     for neither taking all of both;
//   - a MIG-mode GPU: its MIG instances as they exist (static), or with dynamic MIG every
//     placement of every profile the GPU offers, consuming a per-GPU counter set (compute and
//     engine capacities, memory, one counter per memory slice), so the scheduler picks any profile
//     that fits and two devices that overlap are never allocated together;
//   - within the API's limits: ≤ 128 devices a slice (64 where devices consume counters or carry
//     taints), ≤ 8 counter sets a slice; on Kubernetes ≥ 1.35 counters live in slices of their own
//     (the API allows devices or counters in a slice), on 1.34 each MIG GPU's slice holds its set.
// One pool per node, named after it; every slice carries the pool's generation and slice count.
//
// Thread-safety: a pure function.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "api/dra.h"
#include "gpu/inventory.h"
#include "gpu/mig_layout.h"

namespace kgpu::dra {

struct PoolOptions {
  std::string driver = api::dra::kDriver;
  std::string node_name;
  int64_t generation = 1;
  // MIG-mode GPUs: every possible instance (carved at prepare) instead of the existing ones.
  bool dynamic_mig = false;
  // GPU indices offered as consumable shares (the device plugin's config: deviceplugin::ShareSlotsOf).
  std::set<unsigned> shared_gpus;
  // Kubernetes >= 1.35: a slice holds devices or counter sets, not both.
  bool split_counters = true;
  // Taints by GPU index, put on every device of that GPU (health: dra/health_taints.h).
  std::map<unsigned, std::vector<api::dra::Taint>> taints;
};

// `mig`: ReadMigCatalog of each MIG-mode GPU, by GPU index (a MIG-mode GPU without one is an
// error). GPUs that could not be read (Gpu::error) are left out. Errors name the GPU and the limit.
absl::StatusOr<std::vector<api::dra::ResourceSlice>> BuildPool(const gpu::Inventory& inventory,
                                                               const std::map<unsigned, gpu::MigCatalog>& mig,
                                                               const PoolOptions& options);

// The device name of an existing MIG instance `m` of GPU `g` (NVIDIA's formula with the GPU
// instance's profile id and placement from `catalog`, and "-<CI id>" after it where the GPU instance
// has several compute instances); "" when the catalog does not list its GPU instance (MIG changed
// since it was read).
std::string StaticMigName(const gpu::Gpu& g, const gpu::MigDevice& m, const gpu::MigCatalog& catalog);

// "<node>-<driver>-<i>", shortened to a valid object name.
std::string SliceName(const std::string& node, const std::string& driver, size_t index);

}  // namespace kgpu::dra
