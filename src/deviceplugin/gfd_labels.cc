#include "deviceplugin/gfd_labels.h"

#include <cctype>
#include <set>
#include <vector>

#include "common/strings.h"

namespace kgpu::deviceplugin {
namespace {

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
      "nvidia.com/gpu.multiprocessors",
      "nvidia.com/gpu.slices.gi",
      "nvidia.com/gpu.slices.ci",
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

// The sharing of one resource: replicas and strategy name.
struct Share {
  int replicas = 1;
  bool renamed = false;
};
Share ShareOf(const Config& config, const std::string& resource) {
  Share s;
  if (config.sharing.strategy == SharingStrategy::kNone) return s;
  for (const auto& r : config.sharing.resources) {
    if (r.name == resource && r.replicas > 1) {
      s.replicas = r.replicas;
      s.renamed = !r.rename.empty() || config.sharing.rename_by_default;
    }
  }
  return s;
}

std::string StrategyName(const Config& config, const Share& s) {
  if (s.replicas <= 1) return "none";
  return config.sharing.strategy == SharingStrategy::kMps ? "mps" : "time-slicing";
}

}  // namespace

std::string SanitizeProduct(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') {
      out.push_back(c);
    } else if (c == ' ') {
      out.push_back('-');
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

std::map<std::string, std::string> GfdLabels(const gpu::Inventory& inv, const Config& config,
                                             const GfdOptions& options) {
  std::map<std::string, std::string> l;
  std::vector<const gpu::Gpu*> gpus;
  for (const auto& g : inv.gpus()) {
    if (g.error.empty() && !g.lost) gpus.push_back(&g);
  }
  bool mig_capable = false;
  for (const auto* g : gpus) mig_capable = mig_capable || g->mig_capable;
  l["nvidia.com/mig.capable"] = mig_capable ? "true" : "false";
  const Share gpu_share = ShareOf(config, "nvidia.com/gpu");
  l["nvidia.com/mps.capable"] =
      config.sharing.strategy == SharingStrategy::kMps && gpu_share.replicas > 1 ? "true" : "false";
  if (!inv.driver_version().empty()) {
    const auto v = Split(inv.driver_version(), '.');
    l["nvidia.com/cuda.driver-version.full"] = inv.driver_version();
    l["nvidia.com/cuda.driver-version.major"] = l["nvidia.com/cuda.driver.major"] = v[0];
    l["nvidia.com/cuda.driver-version.minor"] = l["nvidia.com/cuda.driver.minor"] = v.size() > 1 ? v[1] : "0";
    l["nvidia.com/cuda.driver-version.revision"] = l["nvidia.com/cuda.driver.rev"] = v.size() > 2 ? v[2] : "0";
  }
  if (!inv.cuda_version().empty()) {
    const auto v = Split(inv.cuda_version(), '.');
    l["nvidia.com/cuda.runtime-version.full"] = inv.cuda_version();
    l["nvidia.com/cuda.runtime-version.major"] = l["nvidia.com/cuda.runtime.major"] = v[0];
    l["nvidia.com/cuda.runtime-version.minor"] = l["nvidia.com/cuda.runtime.minor"] = v.size() > 1 ? v[1] : "0";
  }
  if (options.timestamp) l["nvidia.com/gfd.timestamp"] = std::to_string(options.now_seconds);
  if (!options.machine.empty()) l["nvidia.com/gpu.machine"] = SanitizeProduct(options.machine);
  if (gpus.empty()) return l;
  const gpu::Gpu& first = *gpus.front();
  const std::string product = SanitizeProduct(first.name);
  l["nvidia.com/gpu.family"] = GpuFamily(first.cc_major, first.cc_minor);
  l["nvidia.com/gpu.compute.major"] = std::to_string(first.cc_major);
  l["nvidia.com/gpu.compute.minor"] = std::to_string(first.cc_minor);
  const bool any_mig = [&] {
    for (const auto* g : gpus) {
      if (g->mig_enabled) return true;
    }
    return false;
  }();
  if (config.mig_strategy != "none" && mig_capable) l["nvidia.com/mig.strategy"] = config.mig_strategy;
  const auto shared_suffix = [](const Share& s) { return s.replicas > 1 && !s.renamed ? "-SHARED" : ""; };
  if (config.mig_strategy == "single" && any_mig) {
    // Every GPU carries one MIG profile; labels describe the MIG devices.
    size_t count = 0;
    const gpu::MigDevice* m = nullptr;
    for (const auto* g : gpus) {
      for (const auto& d : g->migs) {
        ++count;
        if (!m) m = &d;
      }
    }
    if (m) {
      l["nvidia.com/gpu.product"] = Cat(product, "-MIG-", m->profile, shared_suffix(gpu_share));
      l["nvidia.com/gpu.count"] = std::to_string(count);
      l["nvidia.com/gpu.memory"] = std::to_string(m->memory_mib);
      l["nvidia.com/gpu.slices.gi"] = std::to_string(m->gi_slices);
      l["nvidia.com/gpu.slices.ci"] = std::to_string(m->ci_slices);
    }
  } else {
    size_t count = 0;
    for (const auto* g : gpus) {
      if (!(config.mig_strategy == "mixed" && g->mig_enabled)) ++count;
    }
    l["nvidia.com/gpu.product"] = Cat(product, shared_suffix(gpu_share));
    l["nvidia.com/gpu.count"] = std::to_string(config.mig_strategy == "mixed" ? count : gpus.size());
    l["nvidia.com/gpu.memory"] = std::to_string(first.memory_mib);
  }
  l["nvidia.com/gpu.replicas"] = std::to_string(gpu_share.replicas);
  l["nvidia.com/gpu.sharing-strategy"] = StrategyName(config, gpu_share);
  if (config.mig_strategy == "mixed") {
    std::map<std::string, std::vector<const gpu::MigDevice*>> by_profile;
    for (const auto* g : gpus) {
      for (const auto& d : g->migs) by_profile[d.profile].push_back(&d);
    }
    for (const auto& [profile, devs] : by_profile) {
      const std::string p = Cat("nvidia.com/mig-", profile, ".");
      const Share s = ShareOf(config, Cat("nvidia.com/mig-", profile));
      l[p + "count"] = std::to_string(devs.size());
      l[p + "memory"] = std::to_string(devs.front()->memory_mib);
      l[p + "product"] = Cat(product, "-MIG-", profile, shared_suffix(s));
      l[p + "replicas"] = std::to_string(s.replicas);
      l[p + "sharing-strategy"] = StrategyName(config, s);
      l[p + "slices.gi"] = std::to_string(devs.front()->gi_slices);
      l[p + "slices.ci"] = std::to_string(devs.front()->ci_slices);
    }
  }
  return l;
}

std::string NfdFeatureFile(const std::map<std::string, std::string>& labels) {
  std::string out;
  for (const auto& [k, v] : labels) out += Cat(k, "=", v, "\n");
  return out;
}

}  // namespace kgpu::deviceplugin
