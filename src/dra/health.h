#pragma once
// The process's one health source (gpu::HealthMonitor) as DRA shows it: device taints in the
// node's ResourceSlices, so the scheduler keeps new claims off a sick GPU (NVIDIA's keys,
// cmd/gpu-kubelet-plugin/device_health.go: gpu.nvidia.com/xid with the XID as value,
// gpu.nvidia.com/gpu-lost; kgpu.io/gpu-unhealthy with the cause for the faults NVIDIA has no key
// for), and kubelet's health stream, so pod status shows which allocated device is unhealthy
// (KEP-4680). A device is tainted while the monitor says unhealthy and untainted when it recovers
// (health.recoverAfter).
//
// Thread-safety: pure functions.

#include <map>
#include <string>
#include <vector>

#include "api/dra.h"
#include "dra/plugin.h"
#include "gpu/health.h"
#include "gpu/inventory.h"
#include "gpu/mig_layout.h"

namespace kgpu::dra {

inline constexpr char kTaintUnhealthy[] = "kgpu.io/gpu-unhealthy";

struct TaintOptions {
  // The effect of a lost GPU's taint: NoSchedule, or NoExecute where the operator wants the pods
  // using it evicted (kube-scheduler's device taint eviction, KEP-5055).
  std::string lost_effect = "NoSchedule";
};

// The taints of each GPU (by index) whose GPU device is unhealthy in `health` (keyed by GPU UUID).
std::map<unsigned, std::vector<api::dra::Taint>> HealthTaints(const gpu::Inventory& inventory,
                                                              const std::map<std::string, gpu::DeviceHealth>& health,
                                                              const TaintOptions& options);

// One report per published device (its GPU's or MIG instance's health), for kubelet's stream.
std::vector<DeviceHealthReport> HealthReports(const std::vector<api::dra::ResourceSlice>& slices,
                                              const gpu::Inventory& inventory,
                                              const std::map<unsigned, gpu::MigCatalog>& mig,
                                              const std::map<std::string, gpu::DeviceHealth>& health, int64_t now_unix);

}  // namespace kgpu::dra
