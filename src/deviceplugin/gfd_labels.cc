#include "deviceplugin/gfd_labels.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <vector>

#include "common/files.h"
#include "common/strings.h"

// The rules below are GFD's, from NVIDIA/k8s-device-plugin (cited by path):
//   internal/lm/nvml.go           NewDeviceLabeler: the labelers and their order, versions, mig.capable,
//                                 mps.capable, gpu.mode;
//   internal/lm/machine-type.go   gpu.machine;
//   internal/lm/mig-strategy.go   NewResourceLabeler: full-GPU labels and the single/mixed strategies;
//   internal/lm/resource.go       the per-resource labels (product, count, replicas, sharing-strategy,
//                                 memory, family, compute, MIG attributes) and sanitise;
//   internal/resource/nvml-mig-device.go  the MIG attribute labels and the profile name ('+' -> '.').

namespace kgpu::deviceplugin {
namespace {

constexpr size_t kMaxLabelValue = 63;  // a Kubernetes label value

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) return out;
    start = p + 1;
  }
}

bool IsAlnum(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0;
}

const std::set<std::string>& OwnedKeys() {
  static const std::set<std::string> keys = {
      "nvidia.com/gpu.product",
      "nvidia.com/gpu.count",
      "nvidia.com/gpu.replicas",
      "nvidia.com/gpu.sharing-strategy",
      "nvidia.com/gpu.memory",
      "nvidia.com/gpu.family",
      "nvidia.com/gpu.compute.major",
      "nvidia.com/gpu.compute.minor",
      "nvidia.com/gpu.machine",
      "nvidia.com/gpu.mode",
      "nvidia.com/gpu.multiprocessors",
      "nvidia.com/gpu.slices.gi",
      "nvidia.com/gpu.slices.ci",
      "nvidia.com/gpu.engines.copy",
      "nvidia.com/gpu.engines.decoder",
      "nvidia.com/gpu.engines.encoder",
      "nvidia.com/gpu.engines.jpeg",
      "nvidia.com/gpu.engines.ofa",
      "nvidia.com/cuda.driver-version.major",
      "nvidia.com/cuda.driver-version.minor",
      "nvidia.com/cuda.driver-version.revision",
      "nvidia.com/cuda.driver-version.full",
      "nvidia.com/cuda.driver.major",
      "nvidia.com/cuda.driver.minor",
      "nvidia.com/cuda.driver.rev",
      "nvidia.com/cuda.runtime-version.major",
      "nvidia.com/cuda.runtime-version.minor",
      "nvidia.com/cuda.runtime-version.full",
      "nvidia.com/cuda.runtime.major",
      "nvidia.com/cuda.runtime.minor",
      "nvidia.com/gfd.timestamp",
      "nvidia.com/mig.capable",
      "nvidia.com/mig.strategy",
      "nvidia.com/mps.capable",
  };
  return keys;
}

// The sharing of one resource as GFD's resourceLabeler sees it (internal/lm/resource.go): a null
// config means sharing is disabled (the labeler of MIG-enabled full GPUs), which gives 0 replicas.
struct Share {
  int replicas = 1;
  bool shared = false;   // replicas > 1: the strategy is named and the product gets -SHARED
  bool renamed = false;  // ... unless the resource is renamed
  std::string strategy = "none";
};
Share ShareOf(const Config* config, const std::string& resource) {
  Share s;
  if (config == nullptr) {
    s.replicas = 0;
    return s;
  }
  if (config->sharing.strategy == SharingStrategy::kNone) return s;
  // replicationInfo: the first replicated resource of that name.
  const auto it = std::find_if(config->sharing.resources.begin(), config->sharing.resources.end(),
                               [&](const ReplicatedResource& r) { return r.name == resource; });
  if (it == config->sharing.resources.end()) return s;
  if (it->replicas > 0) s.replicas = it->replicas;
  s.shared = it->replicas > 1;
  s.renamed = !it->rename.empty() || config->sharing.rename_by_default;
  if (s.shared) s.strategy = config->sharing.strategy == SharingStrategy::kMps ? "mps" : "time-slicing";
  return s;
}

// getProductName: the sanitised non-empty parts joined by '-', then "-SHARED" for a shared resource
// that is not renamed. The newest GFD keeps the value a valid label value by shortening the model
// (the first part) to fit 63 characters with the suffixes kept, and trimming what would end it
// with a separator (internal/lm/resource_test.go, TestGetProductName).
std::string ProductName(const std::vector<std::string>& parts, const Share& share) {
  std::vector<std::string> p;
  for (const auto& part : parts) {
    if (!part.empty()) p.push_back(SanitizeProduct(part));
  }
  if (p.empty()) return "";
  if (share.shared && !share.renamed) p.emplace_back("SHARED");
  std::string head = p.front(), tail;
  for (size_t i = 1; i < p.size(); ++i) tail += Cat("-", p[i]);
  if (head.size() + tail.size() > kMaxLabelValue) {
    head.resize(tail.size() < kMaxLabelValue ? kMaxLabelValue - tail.size() : 0);
    while (!head.empty() && !IsAlnum(head.back())) head.pop_back();
  }
  return head + tail;
}

// GetName of a MIG device: go-nvlib's profile string with '+' replaced by '.' ("1g.10gb+me" is
// mig-1g.10gb.me), the same name the plugin's resource has.
std::string ProfileName(const std::string& profile) {
  std::string name = profile;
  std::replace(name.begin(), name.end(), '+', '.');
  return name;
}

using Labels = std::map<std::string, std::string>;

// baseLabeler: <resource>.product, .count, .replicas, .sharing-strategy.
void BaseLabels(Labels& l, const std::string& resource, size_t count, const Share& share,
                const std::vector<std::string>& product_parts) {
  l[Cat(resource, ".product")] = ProductName(product_parts, share);
  l[Cat(resource, ".count")] = std::to_string(count);
  l[Cat(resource, ".replicas")] = std::to_string(share.replicas);
  l[Cat(resource, ".sharing-strategy")] = share.strategy;
}

// NewGPUResourceLabeler: a full GPU model. `config` null: sharing disabled (every GPU of the model
// is MIG-enabled). Memory only when known, family and compute capability only when CUDA reports one.
void FullGpuLabels(Labels& l, const gpu::Gpu& g, size_t count, const Config* config) {
  const std::string r = "nvidia.com/gpu";
  BaseLabels(l, r, count, ShareOf(config, r), {g.name});
  if (g.memory_mib != 0) l[Cat(r, ".memory")] = std::to_string(g.memory_mib);
  if (g.cc_major != 0) {
    l[Cat(r, ".family")] = GpuFamily(g.cc_major, g.cc_minor);
    l[Cat(r, ".compute.major")] = std::to_string(g.cc_major);
    l[Cat(r, ".compute.minor")] = std::to_string(g.cc_minor);
  }
}

// NewMIGResourceLabeler: MIG devices of one profile, named after their parent's model, with the
// MIG device's attributes (internal/resource/nvml-mig-device.go, GetAttributes).
void MigLabels(Labels& l, const std::string& resource, const gpu::Gpu& parent, const gpu::MigDevice& m, size_t count,
               const Config& config) {
  BaseLabels(l, resource, count, ShareOf(&config, resource), {parent.name, "MIG", ProfileName(m.profile)});
  l[Cat(resource, ".memory")] = std::to_string(m.memory_mib);
  l[Cat(resource, ".multiprocessors")] = std::to_string(m.sm_count);
  l[Cat(resource, ".slices.gi")] = std::to_string(m.gi_slices);
  l[Cat(resource, ".slices.ci")] = std::to_string(m.ci_slices);
  l[Cat(resource, ".engines.copy")] = std::to_string(m.copy_engines);
  l[Cat(resource, ".engines.decoder")] = std::to_string(m.decoders);
  l[Cat(resource, ".engines.encoder")] = std::to_string(m.encoders);
  l[Cat(resource, ".engines.jpeg")] = std::to_string(m.jpegs);
  l[Cat(resource, ".engines.ofa")] = std::to_string(m.ofas);
}

struct MigGroup {
  const gpu::Gpu* parent = nullptr;  // of the first device
  const gpu::MigDevice* device = nullptr;
  size_t count = 0;
};

// The MIG devices of the node by GFD profile name (GetAllMigDevices: MIG-enabled GPUs without MIG
// devices add nothing).
std::map<std::string, MigGroup> MigGroups(const std::vector<const gpu::Gpu*>& gpus) {
  std::map<std::string, MigGroup> groups;
  for (const auto* g : gpus) {
    for (const auto& m : g->migs) {
      MigGroup& group = groups[ProfileName(m.profile)];
      if (group.device == nullptr) {
        group.parent = g;
        group.device = &m;
      }
      ++group.count;
    }
  }
  return groups;
}

// NewResourceLabeler (mig-strategy.go): the full-GPU labels, then the strategy's.
void ResourceLabels(Labels& l, const std::vector<const gpu::Gpu*>& gpus, const Config& config) {
  // newGPULabelers counts every GPU of a model, MIG-enabled or not; the labeler of MIG-enabled GPUs
  // has sharing disabled and is overridden by the full GPUs' one when the model has any. GFD labels
  // one model; with several, Go's map order picks it (and GFD warns). kgpu labels the first GPU's.
  const std::string& model = gpus.front()->name;
  size_t count = 0;
  const gpu::Gpu* full = nullptr;
  const gpu::Gpu* mig_enabled = nullptr;
  for (const auto* g : gpus) {
    if (g->name != model) continue;
    ++count;
    if (!g->mig_enabled && full == nullptr) full = g;
    if (g->mig_enabled && mig_enabled == nullptr) mig_enabled = g;
  }
  if (full != nullptr) {
    FullGpuLabels(l, *full, count, &config);
  } else {
    FullGpuLabels(l, *mig_enabled, count, nullptr);
  }
  if (config.mig_strategy == "none") return;
  // migStrategyLabeler: written whatever the GPUs are, MIG-capable or not.
  l["nvidia.com/mig.strategy"] = config.mig_strategy;
  const auto groups = MigGroups(gpus);
  if (config.mig_strategy == "mixed") {
    // newMigStrategyMixedLabeler: nvidia.com/mig-<profile>.* per profile present.
    for (const auto& [profile, group] : groups) {
      MigLabels(l, Cat("nvidia.com/mig-", profile), *group.parent, *group.device, group.count, config);
    }
    return;
  }
  // newMigStrategySingleLabeler. No MIG-enabled GPU: the same as none.
  const gpu::Gpu* first_enabled = nullptr;
  bool any_empty = false, any_disabled = false;
  for (const auto* g : gpus) {
    if (g->mig_enabled) {
      if (first_enabled == nullptr) first_enabled = g;
      any_empty = any_empty || g->migs.empty();
    } else {
      any_disabled = true;
    }
  }
  if (first_enabled == nullptr) return;
  // newInvalidMigStrategyLabeler: a MIG-enabled GPU without MIG devices, MIG-enabled and disabled
  // GPUs together, or more than one profile. It overrides product, count, replicas and memory only
  // (the product without -SHARED: its labeler has no sharing); no attribute labels.
  if (any_empty || any_disabled || groups.size() != 1) {
    const std::string r = "nvidia.com/gpu";
    l[Cat(r, ".product")] = ProductName({first_enabled->name, "MIG", "INVALID"}, ShareOf(nullptr, r));
    l[Cat(r, ".count")] = "0";
    l[Cat(r, ".replicas")] = "0";
    l[Cat(r, ".memory")] = "0";
    return;
  }
  const MigGroup& group = groups.begin()->second;
  MigLabels(l, "nvidia.com/gpu", *group.parent, *group.device, group.count, config);
}

// newGPUModeLabeler (nvml.go): the distinct PCI classes of the GPUs; one class that is a VGA
// controller is graphics, a 3D controller compute; several classes, an unreadable one, or another
// class: unknown. The comparison is on the full class with its programming interface (go-nvlib:
// pkg/nvpci/nvpci.go, PCIVgaControllerClass 0x030000 and PCI3dControllerClass 0x030200).
std::string GpuMode(const std::vector<const gpu::Gpu*>& gpus) {
  std::set<uint32_t> classes;
  for (const auto* g : gpus) {
    if (g->pci_class == 0) return "unknown";  // GFD: "failed to get device classes", then unknown
    classes.insert(g->pci_class);
  }
  if (classes.size() != 1) return "unknown";
  switch (*classes.begin()) {
    case 0x030000:
      return "graphics";
    case 0x030200:
      return "compute";
    default:
      return "unknown";
  }
}

// newMachineTypeLabeler (machine-type.go): the file's content with surrounding white space trimmed
// and each space replaced by '-'. GFD writes anything else as it is, which the API server refuses
// in a label value (the whole patch fails); kgpu drops those characters, keeps 63 and trims what
// would start or end it with a separator, so every value GFD can publish is published the same.
std::string MachineLabel(const std::string& raw) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  size_t begin = 0, end = raw.size();
  while (begin < end && space(raw[begin])) ++begin;
  while (end > begin && space(raw[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    const char c = raw[i];
    if (c == ' ') {
      out.push_back('-');
    } else if (IsAlnum(c) || c == '-' || c == '_' || c == '.') {
      out.push_back(c);
    }
  }
  if (out.size() > kMaxLabelValue) out.resize(kMaxLabelValue);
  while (!out.empty() && !IsAlnum(out.back())) out.pop_back();
  const auto first = std::find_if(out.begin(), out.end(), IsAlnum);
  return std::string(first, out.end());
}

// newVersionLabeler (nvml.go): the driver version split on '.' (X.Y or X.Y.Z; the revision is
// empty for X.Y, any other shape fails GFD's pass and kgpu leaves the driver labels out), and the
// CUDA driver API version.
void VersionLabels(Labels& l, const gpu::Inventory& inv) {
  if (const auto v = Split(inv.driver_version(), '.'); v.size() == 2 || v.size() == 3) {
    const std::string rev = v.size() == 3 ? v[2] : "";
    l["nvidia.com/cuda.driver-version.full"] = inv.driver_version();
    l["nvidia.com/cuda.driver-version.major"] = l["nvidia.com/cuda.driver.major"] = v[0];
    l["nvidia.com/cuda.driver-version.minor"] = l["nvidia.com/cuda.driver.minor"] = v[1];
    l["nvidia.com/cuda.driver-version.revision"] = l["nvidia.com/cuda.driver.rev"] = rev;
  }
  if (!inv.cuda_version().empty()) {
    const auto v = Split(inv.cuda_version(), '.');
    l["nvidia.com/cuda.runtime-version.full"] = inv.cuda_version();
    l["nvidia.com/cuda.runtime-version.major"] = l["nvidia.com/cuda.runtime.major"] = v[0];
    l["nvidia.com/cuda.runtime-version.minor"] = l["nvidia.com/cuda.runtime.minor"] = v.size() > 1 ? v[1] : "0";
  }
}

}  // namespace

std::string SanitizeProduct(const std::string& name) {
  // sanitise (resource.go): drop [^A-Za-z0-9-_. ], then strings.Join(strings.Fields(s), "-").
  std::string out;
  bool gap = false;
  for (char c : name) {
    if (c == ' ') {
      gap = !out.empty();
    } else if (IsAlnum(c) || c == '-' || c == '_' || c == '.') {
      if (gap) out.push_back('-');
      gap = false;
      out.push_back(c);
    }
  }
  return out;
}

std::string GpuFamily(int major, int minor) {
  if (major < 2) return "tesla";
  switch (major) {
    case 2:
      return "fermi";
    case 3:
      return "kepler";
    case 5:
      return "maxwell";
    case 6:
      return "pascal";
    case 7:
      return minor < 5 ? "volta" : "turing";
    case 8:
      return minor < 9 ? "ampere" : "ada-lovelace";
    case 9:
      return "hopper";
    case 10:
    case 12:
      return "blackwell";
    case 13:
      return "rubin";
    default:
      return "undefined";
  }
}

bool OwnsLabel(const std::string& key) {
  if (OwnedKeys().contains(key)) return true;
  // Per-profile MIG labels of the mixed strategy: nvidia.com/mig-<profile>.<attribute>.
  return key.rfind("nvidia.com/mig-", 0) == 0 && key.find('.', 15) != std::string::npos;
}

std::optional<std::string> ReadMachineType(const std::string& path) {
  if (path.empty()) return std::nullopt;
  return ReadFile(path);
}

std::map<std::string, std::string> GfdLabels(const gpu::Inventory& inv, const Config& config,
                                             const GfdOptions& options) {
  Labels l;
  // timestampLabeler runs on every pass, GPUs or not (internal/lm/timestamp.go).
  if (options.timestamp) l["nvidia.com/gfd.timestamp"] = std::to_string(options.now_seconds);
  std::vector<const gpu::Gpu*> gpus;
  for (const auto& g : inv.gpus()) {
    if (g.error.empty() && !g.lost) gpus.push_back(&g);
  }
  // NewDeviceLabeler returns no labels when there are no devices.
  if (gpus.empty()) return l;
  l["nvidia.com/gpu.machine"] = options.machine ? MachineLabel(*options.machine) : "unknown";
  VersionLabels(l, inv);
  bool mig_capable = false, mig_enabled = false;
  for (const auto* g : gpus) {
    mig_capable = mig_capable || g->mig_capable;
    mig_enabled = mig_enabled || g->mig_enabled;
  }
  l["nvidia.com/mig.capable"] = mig_capable ? "true" : "false";
  // newSharingLabeler: the sharing strategy is MPS when the MPS section replicates any resource
  // (api/config/v1 Sharing.SharingStrategy); then capable unless a GPU is MIG-enabled, where GFD
  // fails the pass and kgpu says false.
  const bool mps = config.sharing.strategy == SharingStrategy::kMps &&
                   std::any_of(config.sharing.resources.begin(), config.sharing.resources.end(),
                               [](const ReplicatedResource& r) { return r.replicas > 1; });
  l["nvidia.com/mps.capable"] = mps && !mig_enabled ? "true" : "false";
  ResourceLabels(l, gpus, config);
  l["nvidia.com/gpu.mode"] = GpuMode(gpus);
  return l;
}

std::string NfdFeatureFile(const std::map<std::string, std::string>& labels) {
  std::string out;
  for (const auto& [k, v] : labels) out += Cat(k, "=", v, "\n");
  return out;
}

}  // namespace kgpu::deviceplugin
