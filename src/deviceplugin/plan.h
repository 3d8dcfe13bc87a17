#pragma once
// deviceplugin::Plan turns an inventory and a config into the resources the plugin advertises:
// names (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb ...), device IDs (UUIDs,
// replicas "UUID::n"), per-device NUMA and the GPU each ID stands for. It is computed once per
// (re)start; Allocate and GetPreferredAllocation only read it, never NVML.
//
// Thread-safety: a Plan is immutable once built.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "api/names.h"
#include "api/share_cdi.h"
#include "deviceplugin/config.h"
#include "gpu/inventory.h"

namespace kgpu::deviceplugin {

struct PluginDevice {
  std::string id;                      // advertised: GPU/MIG UUID, or "<UUID>::<n>" for a replica
  std::string visible_id;              // in NVIDIA_VISIBLE_DEVICES: the UUID, or "<i>" / "<i>:<j>" (index)
  std::string health_key;              // the GPU or MIG UUID whose health this device has
  unsigned gpu = 0;                    // parent GPU index
  int mig = -1;                        // MIG device index on the parent, -1 for a whole GPU
  int replica = -1;                    // replica number, -1 when not replicated
  unsigned minor = 0;                  // /dev/nvidia<minor> of the parent GPU
  int numa = -1;                       // NUMA node, -1 unknown
  std::vector<std::string> cap_nodes;  // MIG: /dev/nvidia-caps/nvidia-cap<N> of its GI and CI
};

struct Resource {
  std::string name;    // "nvidia.com/gpu"
  std::string socket;  // "nvidia-gpu.sock"
  bool replicated = false;
  bool fail_requests_greater_than_one = false;
  bool mig = false;
  bool mps = false;          // replicas shared through an MPS control daemon
  bool hard_memory = false;  // time-slicing replicas held to memory / replicas (CUDA interposer)
  bool retired = false;      // advertised before (an earlier MIG layout): served with zero devices
  // kgpu.io/gpu: the devices are slots, a count only; which GPUs a container gets comes from the
  // pod's allocation record at PreStartContainer (docs/sharing-model.md §5).
  bool kgpu_shares = false;
  std::vector<PluginDevice> devices;
  const PluginDevice* Find(const std::string& id) const;
};

struct Plan {
  std::vector<Resource> resources;
  std::shared_ptr<const gpu::Inventory> inventory;
  std::vector<std::string> control_nodes;  // /dev/nvidiactl etc. that exist under the dev root
};

// The resource a MIG profile is advertised as with migStrategy mixed: api::MigResourceName, the
// rule the extender and quota read it back by.
using api::MigResourceName;

// Errors name the config field and the fix (e.g. MIG single strategy on a mixed node).
absl::StatusOr<std::shared_ptr<const Plan>> BuildPlan(std::shared_ptr<const gpu::Inventory> inventory,
                                                      const Config& config);

}  // namespace kgpu::deviceplugin
