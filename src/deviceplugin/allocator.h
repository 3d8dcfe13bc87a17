#pragma once
// Allocation logic, free of gRPC and NVML: what a container gets for a set of device IDs
// (Allocate), and which IDs to prefer (GetPreferredAllocation) — NVLink/PCIe-aware for whole
// GPUs from the topology computed at discovery, and `distributed` / `packed` for replicas.
//
// Thread-safety: pure functions over immutable inputs.

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deviceplugin/config.h"
#include "deviceplugin/plan.h"

namespace kgpu::deviceplugin {

struct MountSpec {
  std::string container_path, host_path;
  bool read_only = false;
  bool operator==(const MountSpec&) const = default;
};
struct DeviceNodeSpec {
  std::string container_path, host_path, permissions;
  bool operator==(const DeviceNodeSpec&) const = default;
};

struct ContainerAllocation {
  std::map<std::string, std::string> envs;
  std::vector<MountSpec> mounts;
  std::vector<DeviceNodeSpec> devices;
  std::map<std::string, std::string> annotations;
  std::vector<std::string> cdi_devices;
};

inline constexpr char kCdiVendor[] = "k8s.device-plugin.nvidia.com";

// `annotation_id` makes the CDI annotation key unique (NVIDIA uses a random UUID per response).
absl::StatusOr<ContainerAllocation> Allocate(const Plan& plan, const Resource& resource, const Config& config,
                                             const std::vector<std::string>& ids, const std::string& annotation_id);

// Chooses `size` IDs from `available`, including every ID of `must_include`. Never touches NVML.
absl::StatusOr<std::vector<std::string>> PreferredAllocation(const Plan& plan, const Resource& resource,
                                                             const Config& config,
                                                             const std::vector<std::string>& available,
                                                             const std::vector<std::string>& must_include, int size);

// Pair score used for whole-GPU choices (NVIDIA's scale: 100 per NVLink lane, else PCIe 10..60).
int PairScore(const gpu::Inventory& inventory, unsigned a, unsigned b);

}  // namespace kgpu::deviceplugin
