#pragma once
// GPU Feature Discovery compatible node labels (NVIDIA/k8s-device-plugin's GFD, internal/lm/: the
// keys, values and rules GFD applies, listed in docs/k8s.md), computed from the inventory and the
// plugin's config, and the NFD feature-file form of them. Which labels are ours: OwnsLabel() — a
// publisher removes only those, never anybody else's.
//
// Thread-safety: pure functions, except ReadMachineType (reads one file).

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "deviceplugin/config.h"
#include "gpu/inventory.h"

namespace kgpu::deviceplugin {

// GFD's --machine-type-file default (GFD_MACHINE_TYPE_FILE).
inline constexpr char kDefaultMachineTypeFile[] = "/sys/class/dmi/id/product_name";

struct GfdOptions {
  bool timestamp = true;  // nvidia.com/gfd.timestamp (GFD's --no-timestamp turns it off)
  int64_t now_seconds = 0;
  // What the machine type file holds (ReadMachineType), untrimmed; nullopt when it could not be
  // read, which GFD labels nvidia.com/gpu.machine=unknown.
  std::optional<std::string> machine;
};

// The content of the machine type file at `path`; nullopt when `path` is empty or the file cannot
// be read (GFD: internal/lm/machine-type.go).
std::optional<std::string> ReadMachineType(const std::string& path);

// The labels GFD writes for this node. Like GFD: with no GPUs (none that discovery could read)
// only gfd.timestamp. kgpu leaves out the GPUs discovery could not read, where GFD fails the pass.
std::map<std::string, std::string> GfdLabels(const gpu::Inventory& inventory, const Config& config,
                                             const GfdOptions& options);

// True for the label keys GfdLabels can produce (the nvidia.com/gpu.*, cuda.*, mig.*, mig-<profile>.*,
// mps.* and gfd.* keys GFD writes), false for others such as the GPU operator's
// nvidia.com/gpu.deploy.* or nvidia.com/gpu.present.
bool OwnsLabel(const std::string& key);

// "<key>=<value>\n" lines, as GFD writes /etc/kubernetes/node-feature-discovery/features.d/gfd.
std::string NfdFeatureFile(const std::map<std::string, std::string>& labels);

// GFD's product sanitising: characters outside [A-Za-z0-9-_. ] removed, then the words joined by
// '-' (runs of spaces collapse, leading and trailing ones go).
std::string SanitizeProduct(const std::string& name);

// The CUDA architecture family of a compute capability ("hopper" for 9.0).
std::string GpuFamily(int major, int minor);

}  // namespace kgpu::deviceplugin
