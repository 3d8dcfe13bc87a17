#include "deviceplugin/allocator.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "common/strings.h"
#include "deviceplugin/interposer.h"
#include "deviceplugin/mps.h"

namespace kgpu::deviceplugin {
namespace {

// One GPU of a request for replicas: how many of its replicas were asked, how many the resource
// has, and its memory in that proportion (MiB).
struct GpuShare {
  unsigned gpu;
  int asked, replicas;
  uint64_t memory_mib;
};

// Per GPU the request's replicas are on, in GPU index order: CUDA numbers a container's GPUs in
// PCI bus order (NVML's index order), whatever the order of the request.
std::vector<GpuShare> SharesByGpu(const Plan& plan, const Resource& resource,
                                  const std::vector<const PluginDevice*>& devices) {
  std::set<unsigned> in_order;
  for (const auto* d : devices) in_order.insert(d->gpu);
  std::vector<GpuShare> out;
  for (unsigned gpu : in_order) {
    GpuShare s{gpu, 0, 0, 0};
    for (const auto* d : devices) s.asked += d->gpu == gpu ? 1 : 0;
    for (const auto& d : resource.devices) s.replicas += d.gpu == gpu ? 1 : 0;
    s.memory_mib =
        plan.inventory->gpus()[gpu].memory_mib * static_cast<uint64_t>(s.asked) / static_cast<uint64_t>(s.replicas);
    out.push_back(s);
  }
  return out;
}

bool Has(const std::vector<std::string>& v, const char* s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Replicas and MIG devices: spread over GPUs (distributed) or fill the busiest GPU first (packed).
std::vector<std::string> ChooseShared(const Resource& resource, const Config& config,
                                      const std::vector<const PluginDevice*>& candidates,
                                      const std::vector<std::string>& chosen, size_t need) {
  std::map<unsigned, int> total, available, picked;
  for (const auto& d : resource.devices) total[d.gpu]++;
  for (const auto* d : candidates) available[d->gpu]++;
  for (const auto& id : chosen) picked[resource.Find(id)->gpu]++;
  const bool packed = config.shared_devices_allocation_policy == "packed";
  std::vector<std::string> out;
  std::set<std::string> used(chosen.begin(), chosen.end());
  while (out.size() < need) {
    const PluginDevice* best = nullptr;
    std::tuple<int, int, unsigned, int> best_key{};
    for (const auto* d : candidates) {
      if (used.count(d->id) != 0) continue;
      const int in_use = total[d->gpu] - available[d->gpu] + picked[d->gpu];
      const auto key = packed ? std::make_tuple(-in_use, 0, d->gpu, d->replica)
                              : std::make_tuple(in_use, picked[d->gpu], d->gpu, d->replica);
      if (best == nullptr || key < best_key) {
        best = d;
        best_key = key;
      }
    }
    if (best == nullptr) break;
    used.insert(best->id);
    picked[best->gpu]++;
    out.push_back(best->id);
  }
  return out;
}

// MPS: a container's replicas are shares of one GPU's MPS server, so all of them come from one GPU
// when one has enough free replicas (the GPU of `chosen`, else by policy); otherwise as ChooseShared.
std::vector<std::string> ChooseMps(const Resource& resource, const Config& config,
                                   const std::vector<const PluginDevice*>& candidates,
                                   const std::vector<std::string>& chosen, size_t need) {
  std::map<unsigned, std::vector<const PluginDevice*>> free;
  for (const auto* d : candidates) free[d->gpu].push_back(d);
  std::set<unsigned> chosen_gpus;
  for (const auto& id : chosen) chosen_gpus.insert(resource.Find(id)->gpu);
  const bool packed = config.shared_devices_allocation_policy == "packed";
  const std::vector<const PluginDevice*>* best = nullptr;
  for (const auto& [gpu, list] : free) {
    if (list.size() < need) continue;
    if (chosen_gpus.size() > 1 || (chosen_gpus.size() == 1 && chosen_gpus.count(gpu) == 0)) continue;
    // distributed: the GPU with the most free replicas; packed: the fullest one that still fits.
    if (best == nullptr || (packed ? list.size() < best->size() : list.size() > best->size())) best = &list;
  }
  if (best == nullptr) return ChooseShared(resource, config, candidates, chosen, need);
  std::vector<const PluginDevice*> sorted = *best;
  std::sort(sorted.begin(), sorted.end(),
            [](const PluginDevice* a, const PluginDevice* b) { return a->replica < b->replica; });
  std::vector<std::string> out;
  for (size_t i = 0; i < need; ++i) out.push_back(sorted[i]->id);
  return out;
}

// Whole GPUs: the set with the highest summed pair score that contains `must`.
std::vector<std::string> ChooseTopology(const Plan& plan, const std::vector<const PluginDevice*>& candidates,
                                        const std::vector<const PluginDevice*>& must, size_t need) {
  const gpu::Inventory& inv = *plan.inventory;
  auto score_with = [&](const std::vector<const PluginDevice*>& set, const PluginDevice* d) {
    int s = 0;
    for (const auto* x : set) s += PairScore(inv, x->gpu, d->gpu);
    return s;
  };
  // Exhaustive search when the number of subsets is small (8 GPUs: at most 70), else greedy.
  double combos = 1;
  for (size_t i = 0; i < need; ++i)
    combos = combos * static_cast<double>(candidates.size() - i) / static_cast<double>(i + 1);
  std::vector<size_t> best_pick;
  if (combos <= 20000) {
    int best_score = -1;
    std::vector<size_t> pick(need);
    std::function<void(size_t, size_t, std::vector<const PluginDevice*>&, int)> rec =
        [&](size_t start, size_t depth, std::vector<const PluginDevice*>& set, int score) {
          if (depth == need) {
            if (score > best_score) {
              best_score = score;
              best_pick = pick;
            }
            return;
          }
          for (size_t i = start; i + (need - depth) <= candidates.size(); ++i) {
            const int add = score_with(set, candidates[i]);
            pick[depth] = i;
            set.push_back(candidates[i]);
            rec(i + 1, depth + 1, set, score + add);
            set.pop_back();
          }
        };
    std::vector<const PluginDevice*> set = must;
    int base = 0;
    for (size_t i = 0; i < must.size(); ++i) {
      for (size_t j = i + 1; j < must.size(); ++j) base += PairScore(inv, must[i]->gpu, must[j]->gpu);
    }
    rec(0, 0, set, base);
  } else {
    std::vector<const PluginDevice*> set = must;
    std::vector<bool> taken(candidates.size(), false);
    while (best_pick.size() < need) {
      size_t best = candidates.size();
      int best_score = -1;
      for (size_t i = 0; i < candidates.size(); ++i) {
        if (taken[i]) continue;
        const int s = score_with(set, candidates[i]);
        if (s > best_score) {
          best_score = s;
          best = i;
        }
      }
      taken[best] = true;
      set.push_back(candidates[best]);
      best_pick.push_back(best);
    }
  }
  std::vector<std::string> out;
  for (size_t i : best_pick) out.push_back(candidates[i]->id);
  return out;
}

}  // namespace

int PairScore(const gpu::Inventory& inventory, unsigned a, unsigned b) {
  if (a == b) return 0;
  const gpu::Link& l = inventory.link(a, b);
  if (l.nvlinks > 0) return 100 * static_cast<int>(l.nvlinks);
  switch (l.pcie) {
    case gpu::PcieLevel::kPix:
      return 50;
    case gpu::PcieLevel::kPxb:
      return 40;
    case gpu::PcieLevel::kPhb:
      return 30;
    case gpu::PcieLevel::kNode:
      return 20;
    case gpu::PcieLevel::kSys:
      return 10;
    default:
      return 0;
  }
}

absl::StatusOr<ContainerAllocation> Allocate(const Plan& plan, const Resource& resource, const Config& config,
                                             const std::vector<std::string>& ids, const std::string& annotation_id) {
  if (ids.empty()) return absl::InvalidArgumentError(Cat("invalid request: no device IDs for ", resource.name));
  if (resource.retired) {
    return absl::FailedPreconditionError(Cat(resource.name, " has no devices on this node any more (the MIG layout ",
                                             "changed); request one of the resources the node advertises now"));
  }
  std::vector<const PluginDevice*> devices;
  for (const auto& id : ids) {
    const PluginDevice* d = resource.Find(id);
    if (d == nullptr) {
      return absl::InvalidArgumentError(
          Cat("invalid request: unknown device: ", id, " (not a device of resource ", resource.name, ")"));
    }
    devices.push_back(d);
  }
  const bool any_replica =
      std::any_of(devices.begin(), devices.end(), [](const PluginDevice* d) { return d->replica >= 0; });
  if (any_replica && resource.fail_requests_greater_than_one && ids.size() > 1) {
    return absl::InvalidArgumentError(
        Cat("invalid request: maximum request size for shared resources is 1; found ", ids.size()));
  }
  std::vector<std::string> visible;  // replicas stripped, de-duplicated, in request order
  std::vector<unsigned> gpus;
  for (const auto* d : devices) {
    if (std::find(visible.begin(), visible.end(), d->visible_id) == visible.end()) visible.push_back(d->visible_id);
    if (std::find(gpus.begin(), gpus.end(), d->minor) == gpus.end()) gpus.push_back(d->minor);
  }

  ContainerAllocation out;
  const auto& strategies = config.device_list_strategy;
  const bool cdi_annotations = Has(strategies, "cdi-annotations");
  const bool cdi_cri = Has(strategies, "cdi-cri");
  if (cdi_annotations || cdi_cri) {
    std::vector<std::string> names;
    for (const auto& v : visible) names.push_back(Cat(kCdiVendor, "/gpu=", v));
    for (int ch : config.imex_channel_ids) names.push_back(Cat(kCdiVendor, "/imex-channel=", ch));
    if (config.gds_enabled) names.push_back(Cat(kCdiVendor, "/gds=all"));
    if (config.mofed_enabled) names.push_back(Cat(kCdiVendor, "/mofed=all"));
    if (config.gdrcopy_enabled) names.push_back(Cat(kCdiVendor, "/gdrcopy=all"));
    if (cdi_annotations) {
      out.annotations[Cat(config.cdi_annotation_prefix, "nvidia-device-plugin_", annotation_id)] = Join(names, ",");
    }
    if (cdi_cri) out.cdi_devices = names;
  }
  if (resource.mps && any_replica) {
    const MpsClient client = MpsClientFor(config.mps_root, resource.name);
    out.envs["CUDA_MPS_PIPE_DIRECTORY"] = client.pipe_dir;
    out.mounts.insert(out.mounts.end(), client.mounts.begin(), client.mounts.end());
    // kgpu: N replicas are N shares of memory and threads, for this container's CUDA clients;
    // the ordinals follow the GPU index (SharesByGpu).
    std::vector<std::string> limits;
    int percentage = 100;
    size_t ordinal = 0;
    for (const GpuShare& s : SharesByGpu(plan, resource, devices)) {
      limits.push_back(Cat(ordinal++, "=", s.memory_mib, "M"));
      percentage = std::min(percentage, 100 * s.asked / s.replicas);
    }
    out.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = Join(limits, ",");
    out.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = std::to_string(percentage);
  }
  if (resource.hard_memory && any_replica) {
    // kgpu: time-slicing with memoryIsolation hard. N replicas of a GPU are N shares of its memory,
    // enforced by the CUDA interposer (docs/isolation.md): preloaded from the node's read-only,
    // versioned copy, with one accounting region for the container's processes in a directory
    // of its own under the shared root (0777: random-UID containers write it).
    std::vector<std::string> limits;
    std::vector<InterposerLimit> config_limits;
    for (const GpuShare& s : SharesByGpu(plan, resource, devices)) {
      limits.push_back(Cat(plan.inventory->gpus()[s.gpu].uuid, "=", s.memory_mib, "Mi"));
      config_limits.push_back({plan.inventory->gpus()[s.gpu].uuid, static_cast<uint64_t>(s.memory_mib), 0});
    }
    if (config.cuda_interposer.empty()) {
      return absl::FailedPreconditionError(Cat(resource.name, ": memoryIsolation hard without --cuda-interposer"));
    }
    auto edits = InterposerEditsFor(config.cuda_interposer, config.cuda_interposer_load, config.cuda_shared_root,
                                    TimeslicingRegion(config.cuda_shared_root, annotation_id), config_limits);
    if (!edits.ok()) return edits.status();
    out.envs["KGPU_CUDA_MEMORY_LIMIT"] = Join(limits, ",");
    for (const auto& [k, v] : edits->envs) out.envs[k] = v;
    out.mounts.insert(out.mounts.end(), edits->mounts.begin(), edits->mounts.end());
  }
  if (config.gdrcopy_enabled) out.envs["NVIDIA_GDRCOPY"] = "enabled";
  if (config.gds_enabled) out.envs["NVIDIA_GDS"] = "enabled";
  if (config.mofed_enabled) out.envs["NVIDIA_MOFED"] = "enabled";
  const bool envvar = Has(strategies, "envvar");
  const bool volume_mounts = Has(strategies, "volume-mounts");
  if (!envvar && !volume_mounts) return out;  // CDI only: the runtime does the rest
  if (envvar) {
    out.envs["NVIDIA_VISIBLE_DEVICES"] = Join(visible, ",");
    if (!config.imex_channel_ids.empty()) out.envs["NVIDIA_IMEX_CHANNELS"] = Join(config.imex_channel_ids, ",");
  }
  if (volume_mounts) {
    out.envs["NVIDIA_VISIBLE_DEVICES"] = "/var/run/nvidia-container-devices";
    for (const auto& v : visible) {
      out.mounts.push_back({Cat("/var/run/nvidia-container-devices/", v), "/dev/null", false});
    }
  }
  if (config.pass_device_specs) {
    for (const auto& node : plan.control_nodes) out.devices.push_back({node, config.HostDevPath(node), "rw"});
    for (unsigned minor : gpus) {
      const std::string node = Cat("/dev/nvidia", minor);
      out.devices.push_back({node, config.HostDevPath(node), "rw"});
    }
    for (const auto* d : devices) {  // MIG: the GI and CI access capabilities
      for (const auto& cap : d->cap_nodes) {
        DeviceNodeSpec spec{cap, config.HostDevPath(cap), "rw"};
        if (std::find(out.devices.begin(), out.devices.end(), spec) == out.devices.end()) out.devices.push_back(spec);
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> PreferredAllocation(const Plan& plan, const Resource& resource,
                                                             const Config& config,
                                                             const std::vector<std::string>& available,
                                                             const std::vector<std::string>& must_include, int size) {
  if (size <= 0) return absl::InvalidArgumentError(Cat("allocation_size must be > 0 (got ", size, ")"));
  std::vector<const PluginDevice*> candidates, must;
  std::vector<std::string> chosen;
  std::set<std::string> seen;
  for (const auto& id : must_include) {
    const PluginDevice* d = resource.Find(id);
    if (d == nullptr) return absl::InvalidArgumentError(Cat("unknown must-include device: ", id));
    if (seen.insert(id).second) {
      must.push_back(d);
      chosen.push_back(id);
    }
  }
  for (const auto& id : available) {
    const PluginDevice* d = resource.Find(id);
    if (d == nullptr) return absl::InvalidArgumentError(Cat("unknown available device: ", id));
    if (seen.insert(id).second) candidates.push_back(d);
  }
  if (chosen.size() + candidates.size() < static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(
        Cat("allocation_size ", size, " is more than the ", chosen.size() + candidates.size(), " devices offered"));
  }
  if (chosen.size() > static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(
        Cat("must_include_deviceIDs has ", chosen.size(), " devices, more than allocation_size ", size));
  }
  const size_t need = static_cast<size_t>(size) - chosen.size();
  if (need == 0) return chosen;
  const bool shared = resource.mig || std::any_of(candidates.begin(), candidates.end(),
                                                  [](const PluginDevice* d) { return d->replica >= 0; });
  const std::vector<std::string> more = resource.mps ? ChooseMps(resource, config, candidates, chosen, need)
                                        : shared     ? ChooseShared(resource, config, candidates, chosen, need)
                                                     : ChooseTopology(plan, candidates, must, need);
  chosen.insert(chosen.end(), more.begin(), more.end());
  return chosen;
}

}  // namespace kgpu::deviceplugin
