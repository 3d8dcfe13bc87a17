#pragma once
// gpu::MigLayout: declared MIG layouts ("this GPU: 3g.20gb + 2g.10gb + 2× 1g.5gb") and applying one
// through NVML, the way `nvidia-smi mig -dci/-dgi/-cgi/-cci` or mig-parted would:
//
//   ResolveMigLayout  layout entries → what each GPU should look like (GPU indices checked);
//   PlanMigChange     one GPU: the profiles by name (from the GPU's own NVML profile table),
//                     placements that fit (backtracking over NVML's possible placements), or
//                     "nothing to do" when the GPU already has that layout;
//   ApplyMigChange    destroy the compute and GPU instances, create the planned ones, each with one
//                     compute instance spanning it; on failure the previous instances are restored.
//
// Whether a GPU is busy is the caller's business (kgpu mig apply asks kubelet's PodResources and
// NVML's process list before calling ApplyMigChange).
//
// Thread-safety: pure functions over their arguments; Apply changes the GPU, so one caller per GPU.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/inventory.h"
#include "nvml/library.h"

namespace kgpu::gpu {

// One entry of a layout (mig-parted's schema): which GPUs, MIG on or off, and the instances.
struct MigLayoutEntry {
  std::vector<unsigned> devices;  // GPU indices; empty: every GPU
  bool mig_enabled = true;
  std::vector<std::pair<std::string, int>> mig_devices;  // profile ("3g.20gb") → count, file order
};
using MigLayout = std::vector<MigLayoutEntry>;

// What one GPU should look like.
struct MigTarget {
  unsigned gpu = 0;
  bool mig_enabled = true;
  std::vector<std::string> profiles;  // one name per instance, sorted
};

// Errors name the layout and the entry (with the entry's file position first, from `positions`,
// one "file:line:col" per entry, when given): a GPU index the node does not have, a GPU selected by
// two entries, MIG asked of a GPU that cannot do MIG.
absl::StatusOr<std::vector<MigTarget>> ResolveMigLayout(const MigLayout& layout, const Inventory& inventory,
                                                        std::string_view layout_name,
                                                        const std::vector<std::string>& positions = {});

struct MigInstancePlan {
  nvml::GpuInstanceProfile profile;
  std::string name;
  nvml::Placement placement;
};

struct MigChange {
  unsigned gpu = 0;
  std::vector<std::string> current, wanted;  // profile names, sorted
  bool set_mode = false;                     // the MIG mode must change
  bool enable = true;
  std::vector<MigInstancePlan> create;  // in creation order
  bool noop() const { return !set_mode && current == wanted && !reshape; }
  bool reshape = false;  // instances exist that are not one full compute instance per GPU instance
};

// Plans one GPU's change. Errors: an unknown profile (the message lists the GPU's profiles), a set
// of instances that does not fit the GPU.
absl::StatusOr<MigChange> PlanMigChange(const nvml::Library& lib, const Gpu& gpu, const MigTarget& target);

struct MigApplyResult {
  bool pending_reset = false;  // the MIG mode change waits for a GPU reset
  std::string note;            // what happened, for the operator
};

// Applies a planned change. On failure after the old instances were destroyed, it recreates them
// and says so in the error.
absl::StatusOr<MigApplyResult> ApplyMigChange(const nvml::Library& lib, const Gpu& gpu, const MigChange& change);

// "1g.5gb + 3x 2g.10gb" for sorted instance names; "(none)" for none.
std::string DescribeInstances(const std::vector<std::string>& names);

// The names of the GPU instance profiles `gpu` offers, smallest first (for messages and `kgpu mig`).
absl::StatusOr<std::vector<std::pair<nvml::GpuInstanceProfile, std::string>>> MigProfiles(const nvml::Library& lib,
                                                                                          const Gpu& gpu);

// Everything MIG could make of one GPU, for publishing MIG as partitionable devices (DRA): every
// GPU-instance profile with its name and every placement NVML allows, the GPU's memory slices, and
// the GPU instances that exist now (with their profile ids and placements).
struct MigProfileOption {
  nvml::GpuInstanceProfile profile;
  std::string name;  // "1g.10gb", "1g.10gb+me"
  std::vector<nvml::Placement> placements;
};
struct MigCatalog {
  unsigned memory_slices = 0;              // the highest placement end of any profile (8 on A100/H100)
  std::vector<MigProfileOption> profiles;  // smallest first
  std::vector<nvml::GpuInstance> instances;
};
// NotFound-free: a GPU that is not MIG-capable gives an empty catalog; an NVML error is returned.
absl::StatusOr<MigCatalog> ReadMigCatalog(const nvml::Library& lib, const Gpu& gpu);

}  // namespace kgpu::gpu
