#include "gpu/mig_layout.h"

#include <algorithm>
#include <map>

#include "common/strings.h"

namespace kgpu::gpu {
namespace {

// The placement mask of `p` in memory slices.
uint32_t Mask(const nvml::Placement& p) {
  return ((1U << p.size) - 1U) << p.start;
}

// Finds non-overlapping placements for `wanted` (names) on a GPU; largest instances first, trying
// every NVML placement with backtracking (automatic placement alone fails layouts such as
// 3g + 2g + 1g + 1g on an A100, which need the 3g instance at the high end).
absl::StatusOr<std::vector<MigInstancePlan>> Fit(const nvml::Library& lib, const Gpu& gpu,
                                                 const std::vector<std::string>& wanted) {
  auto profiles = MigProfiles(lib, gpu);
  if (!profiles.ok()) return profiles.status();
  std::vector<MigInstancePlan> todo;
  for (const auto& name : wanted) {
    auto it = std::find_if(profiles->begin(), profiles->end(), [&](const auto& p) { return p.second == name; });
    if (it == profiles->end()) {
      std::vector<std::string> names;
      for (const auto& p : *profiles) names.push_back(p.second);
      return absl::InvalidArgumentError(Cat("GPU ", gpu.index, " (", gpu.name, ") has no MIG profile '", name,
                                            "'; its profiles are ", Join(names, ", ")));
    }
    todo.push_back({it->first, it->second, {}});
  }
  std::stable_sort(todo.begin(), todo.end(), [](const MigInstancePlan& a, const MigInstancePlan& b) {
    return a.profile.slices != b.profile.slices ? a.profile.slices > b.profile.slices
                                                : a.profile.memory_mib > b.profile.memory_mib;
  });
  unsigned compute = 0, max_compute = 0;
  std::map<unsigned, unsigned> per_profile;
  for (const auto& p : *profiles) max_compute = std::max(max_compute, p.first.slices);
  for (const auto& t : todo) {
    compute += t.profile.slices;
    if (++per_profile[t.profile.id] > t.profile.max_instances) {
      return absl::InvalidArgumentError(Cat("GPU ", gpu.index, " can hold at most ", t.profile.max_instances, " ",
                                            t.name, " instance(s); the layout asks for ", per_profile[t.profile.id]));
    }
  }
  if (compute > max_compute) {
    return absl::InvalidArgumentError(Cat("the instances ", Join(wanted, " + "), " need ", compute,
                                          " compute slices; GPU ", gpu.index, " has ", max_compute));
  }
  std::vector<std::vector<nvml::Placement>> options;
  for (const auto& t : todo) {
    auto placements = lib.GpuInstancePlacements(gpu.handle, t.profile.id);
    if (!placements.ok()) return placements.status();
    options.push_back(*placements);
  }
  auto place = [&](auto&& self, size_t i, uint32_t used) -> bool {
    if (i == todo.size()) return true;
    for (const auto& p : options[i]) {
      if ((used & Mask(p)) != 0) continue;
      todo[i].placement = p;
      if (self(self, i + 1, used | Mask(p))) return true;
    }
    return false;
  };
  if (!place(place, 0, 0)) {
    return absl::InvalidArgumentError(Cat("the instances ", Join(wanted, " + "), " do not fit GPU ", gpu.index,
                                          " together (no placement of their memory slices works)"));
  }
  return todo;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Removes every compute and GPU instance of the GPU.
absl::Status DestroyAll(const nvml::Library& lib, const Gpu& gpu) {
  auto gis = lib.GpuInstances(gpu.handle);
  if (!gis.ok()) return gis.status();
  for (const auto& gi : *gis) {
    auto cis = lib.ComputeInstances(gi);
    if (!cis.ok()) return cis.status();
    for (void* ci : *cis) {
      if (auto st = lib.DestroyComputeInstance(ci); !st.ok()) {
        return absl::Status(st.code(),
                            Cat("destroying a compute instance of GPU instance ", gi.id, ": ", st.message()));
      }
    }
    if (auto st = lib.DestroyGpuInstance(gi); !st.ok()) {
      return absl::Status(st.code(), Cat("destroying GPU instance ", gi.id, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CreateAll(const nvml::Library& lib, const Gpu& gpu, const std::vector<MigInstancePlan>& plans) {
  for (const auto& p : plans) {
    auto gi = lib.CreateGpuInstance(gpu.handle, p.profile, p.placement);
    if (!gi.ok()) {
      return absl::Status(gi.status().code(), Cat("creating ", p.name, " at memory slice ", p.placement.start, ": ",
                                                  gi.status().message()));
    }
    if (auto st = lib.CreateFullComputeInstance(*gi, p.profile.slices); !st.ok()) {
      return absl::Status(st.code(), Cat("creating the compute instance of ", p.name, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

// The GPU instances `gpu` has now, with their profiles and placements.
absl::StatusOr<std::vector<MigInstancePlan>> CurrentInstances(const nvml::Library& lib, const Gpu& gpu) {
  auto gis = lib.GpuInstances(gpu.handle);
  if (!gis.ok()) return gis.status();
  auto profiles = MigProfiles(lib, gpu);
  if (!profiles.ok()) return profiles.status();
  std::vector<MigInstancePlan> out;
  for (const auto& gi : *gis) {
    for (const auto& [p, name] : *profiles) {
      if (p.id == gi.profile_id) out.push_back({p, name, gi.placement});
    }
  }
  return out;
}

// After a failure part way: back to `previous` (what the GPU had), as far as NVML lets us. Keeps
// the instances that are still there (an IN_USE one could not be destroyed), removes new ones,
// recreates missing ones and gives every GPU instance its compute instance. Returns what happened,
// for the error message.
std::string Restore(const nvml::Library& lib, const Gpu& gpu, const std::vector<MigInstancePlan>& previous) {
  auto gis = lib.GpuInstances(gpu.handle);
  if (!gis.ok())
    return Cat("the previous instances could not be checked (", gis.status().message(), "); see `kgpu mig show`");
  auto was = [&](const nvml::GpuInstance& gi) {
    return std::any_of(previous.begin(), previous.end(), [&](const MigInstancePlan& p) {
      return p.profile.id == gi.profile_id && p.placement == gi.placement;
    });
  };
  std::vector<std::string> problems;
  std::vector<nvml::GpuInstance> kept;
  for (const auto& gi : *gis) {
    auto cis = lib.ComputeInstances(gi);
    if (was(gi)) {
      if (cis.ok() && cis->empty()) {
        const auto* p = &*std::find_if(previous.begin(), previous.end(), [&](const MigInstancePlan& x) {
          return x.profile.id == gi.profile_id && x.placement == gi.placement;
        });
        if (auto st = lib.CreateFullComputeInstance(gi, p->profile.slices); !st.ok())
          problems.push_back(std::string(st.message()));
      }
      kept.push_back(gi);
      continue;
    }
    for (void* ci : cis.ok() ? *cis : std::vector<void*>{}) (void)lib.DestroyComputeInstance(ci);
    if (auto st = lib.DestroyGpuInstance(gi); !st.ok()) problems.push_back(std::string(st.message()));
  }
  for (const auto& p : previous) {
    const bool there = std::any_of(kept.begin(), kept.end(), [&](const nvml::GpuInstance& gi) {
      return p.profile.id == gi.profile_id && p.placement == gi.placement;
    });
    if (there) continue;
    if (auto st = CreateAll(lib, gpu, {p}); !st.ok()) problems.push_back(std::string(st.message()));
  }
  if (!problems.empty()) {
    return Cat("restoring the previous instances failed too (", Join(problems, "; "), "); see `kgpu mig show`");
  }
  return "the previous instances were restored";
}

}  // namespace

std::string DescribeInstances(const std::vector<std::string>& names) {
  if (names.empty()) return "(none)";
  std::vector<std::string> parts;
  for (size_t i = 0; i < names.size();) {
    size_t j = i;
    while (j < names.size() && names[j] == names[i]) ++j;
    parts.push_back(j - i > 1 ? Cat(j - i, "x ", names[i]) : names[i]);
    i = j;
  }
  return Join(parts, " + ");
}

absl::StatusOr<std::vector<std::pair<nvml::GpuInstanceProfile, std::string>>> MigProfiles(const nvml::Library& lib,
                                                                                          const Gpu& gpu) {
  auto profiles = lib.GpuInstanceProfiles(gpu.handle);
  if (!profiles.ok()) return profiles.status();
  auto mem = lib.Memory(gpu.handle);
  if (!mem.ok()) return mem.status();
  std::vector<std::pair<nvml::GpuInstanceProfile, std::string>> out;
  for (const auto& p : *profiles) {
    out.emplace_back(p, MigProfileName(p.slices, p.slices, p.memory_mib, mem->total, p.index));
  }
  return out;
}

absl::StatusOr<std::vector<MigTarget>> ResolveMigLayout(const MigLayout& layout, const Inventory& inventory,
                                                        std::string_view layout_name,
                                                        const std::vector<std::string>& positions) {
  std::map<unsigned, size_t> owner;
  std::vector<MigTarget> out;
  for (size_t e = 0; e < layout.size(); ++e) {
    const MigLayoutEntry& entry = layout[e];
    std::vector<unsigned> gpus = entry.devices;
    if (gpus.empty()) {
      for (const auto& g : inventory.gpus()) gpus.push_back(g.index);
    }
    for (unsigned index : gpus) {
      const std::string where =
          Cat(e < positions.size() ? Cat(positions[e], ": ") : "", "MIG layout '", layout_name, "' entry ", e);
      if (index >= inventory.gpus().size()) {
        return absl::InvalidArgumentError(
            Cat(where, ": this node has no GPU ", index, " (it has ", inventory.gpus().size(), " GPUs)"));
      }
      if (auto [it, fresh] = owner.emplace(index, e); !fresh) {
        return absl::InvalidArgumentError(
            Cat(where, " selects GPU ", index, ", which entry ", it->second, " selects too; give each GPU one entry"));
      }
      const Gpu& g = inventory.gpus()[index];
      if (entry.mig_enabled && !g.mig_capable) {
        return absl::InvalidArgumentError(Cat(where, " enables MIG on GPU ", index, " (", g.name,
                                              "), which cannot do MIG; leave it out of the entry"));
      }
      MigTarget t{index, entry.mig_enabled, {}};
      for (const auto& [profile, count] : entry.mig_devices) {
        for (int i = 0; i < count; ++i) t.profiles.push_back(profile);
      }
      t.profiles = Sorted(std::move(t.profiles));
      out.push_back(std::move(t));
    }
  }
  std::sort(out.begin(), out.end(), [](const MigTarget& a, const MigTarget& b) { return a.gpu < b.gpu; });
  return out;
}

absl::StatusOr<MigChange> PlanMigChange(const nvml::Library& lib, const Gpu& gpu, const MigTarget& target) {
  MigChange c;
  c.gpu = gpu.index;
  c.enable = target.mig_enabled;
  c.wanted = target.mig_enabled ? target.profiles : std::vector<std::string>{};
  c.set_mode = target.mig_enabled != gpu.mig_enabled || gpu.mig_pending;
  if (gpu.mig_enabled) {
    auto instances = CurrentInstances(lib, gpu);
    if (!instances.ok()) return instances.status();
    for (const auto& i : *instances) c.current.push_back(i.name);
    c.current = Sorted(std::move(c.current));
    // The layout also means "one compute instance spanning each GPU instance".
    c.reshape =
        gpu.migs.size() != instances->size() ||
        std::any_of(gpu.migs.begin(), gpu.migs.end(), [](const MigDevice& m) { return m.ci_slices != m.gi_slices; });
  }
  if (c.enable && !c.wanted.empty()) {
    auto fit = Fit(lib, gpu, c.wanted);
    if (!fit.ok()) return fit.status();
    c.create = std::move(*fit);
  }
  return c;
}

absl::StatusOr<MigApplyResult> ApplyMigChange(const nvml::Library& lib, const Gpu& gpu, const MigChange& change) {
  MigApplyResult result;
  if (change.noop()) {
    result.note = Cat("GPU ", gpu.index, ": already ", DescribeInstances(change.wanted));
    return result;
  }
  // Remember what is there, to put it back if the new layout cannot be created.
  std::vector<MigInstancePlan> previous;
  if (gpu.mig_enabled) {
    auto instances = CurrentInstances(lib, gpu);
    if (!instances.ok()) return instances.status();
    previous = std::move(*instances);
    if (auto st = DestroyAll(lib, gpu); !st.ok()) {
      return absl::Status(st.code(), Cat("GPU ", gpu.index, ": ", st.message(), "; ", Restore(lib, gpu, previous)));
    }
  }
  if (change.set_mode) {
    auto activation = lib.SetMigMode(gpu.handle, change.enable);
    if (!activation.ok()) {
      return absl::Status(activation.status().code(),
                          Cat("GPU ", gpu.index, ": ", activation.status().message(), "; ",
                              gpu.mig_enabled ? Restore(lib, gpu, previous) : "nothing was changed"));
    }
    if (!activation->ok()) {
      result.pending_reset = true;
      result.note = Cat("GPU ", gpu.index, ": MIG mode ", change.enable ? "enable" : "disable", " is pending (",
                        activation->message(), "): reset the GPU (nvidia-smi -r -i ", gpu.index,
                        ") or reboot, then run kgpu mig apply again");
      return result;
    }
    if (!change.enable) {
      result.note = Cat("GPU ", gpu.index, ": MIG disabled");
      return result;
    }
  }
  std::vector<MigInstancePlan> create = change.create;
  if (create.empty() && !change.wanted.empty()) {  // MIG was just enabled: placements only now
    Gpu enabled = gpu;
    enabled.mig_enabled = true;
    auto fit = Fit(lib, enabled, change.wanted);
    if (!fit.ok()) return fit.status();
    create = std::move(*fit);
  }
  if (auto st = CreateAll(lib, gpu, create); !st.ok()) {
    return absl::Status(st.code(), Cat("GPU ", gpu.index, ": ", st.message(), "; ", Restore(lib, gpu, previous)));
  }
  result.note =
      Cat("GPU ", gpu.index, ": ", DescribeInstances(change.current), " -> ", DescribeInstances(change.wanted));
  return result;
}

absl::StatusOr<MigCatalog> ReadMigCatalog(const nvml::Library& lib, const Gpu& gpu) {
  MigCatalog out;
  if (!gpu.mig_capable) return out;
  auto profiles = MigProfiles(lib, gpu);
  if (!profiles.ok()) return profiles.status();
  for (const auto& [p, name] : *profiles) {
    auto placements = lib.GpuInstancePlacements(gpu.handle, p.id);
    if (!placements.ok()) return placements.status();
    for (const auto& pl : *placements) out.memory_slices = std::max(out.memory_slices, pl.start + pl.size);
    out.profiles.push_back({p, name, std::move(*placements)});
  }
  if (gpu.mig_enabled) {
    auto gis = lib.GpuInstances(gpu.handle);
    if (!gis.ok()) return gis.status();
    out.instances = std::move(*gis);
  }
  return out;
}

}  // namespace kgpu::gpu
