#pragma once
// GPU Feature Discovery compatible node labels (NVIDIA/k8s-device-plugin's GFD: the keys and
// value formats GFD v0.17 publishes, listed in docs/k8s.md), computed from the
// inventory and the plugin's config, and the NFD feature-file form of them. Which labels are
// ours: OwnsLabel() — a publisher removes only those, never anybody else's.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <map>
#include <string>

#include "deviceplugin/config.h"
#include "gpu/inventory.h"

namespace kgpu::deviceplugin {

struct GfdOptions {
  bool timestamp = true;  // nvidia.com/gfd.timestamp (GFD's --no-timestamp turns it off)
  int64_t now_seconds = 0;
  std::string machine;  // /sys/class/dmi/id/product_name; empty: no gpu.machine label
};

std::map<std::string, std::string> GfdLabels(const gpu::Inventory& inventory, const Config& config,
                                             const GfdOptions& options);

// True for the label keys GfdLabels can produce (the nvidia.com/gpu.*, cuda.*, mig.*, mig-<profile>.*,
// mps.* and gfd.* keys GFD writes), false for others such as the GPU operator's
// nvidia.com/gpu.deploy.* or nvidia.com/gpu.present.
bool OwnsLabel(const std::string& key);

// "<key>=<value>\n" lines, as GFD writes /etc/kubernetes/node-feature-discovery/features.d/gfd.
std::string NfdFeatureFile(const std::map<std::string, std::string>& labels);

// GFD's product sanitising: characters outside [A-Za-z0-9-_. ] removed, spaces to '-'.
std::string SanitizeProduct(const std::string& name);

// The CUDA architecture family of a compute capability ("hopper" for 9.0).
std::string GpuFamily(int major, int minor);

}  // namespace kgpu::deviceplugin
