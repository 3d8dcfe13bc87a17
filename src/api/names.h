#pragma once
// The contract between kgpu's node agent and its control plane, as Kubernetes carries it: every
// kgpu.io/* resource, annotation, label and taint name, written once. The device plugin, the
// label publisher, the share handoff, the extender, the webhook, quota and the Slurm bridge all
// spell them from here (docs/architecture.md: the api room depends on nothing).
//
// Thread-safety: constants and pure functions only.

#include <string>
#include <string_view>

namespace kgpu::api {

// ---- extended resources a pod asks for
// A share of one GPU: the pod's container asks for N of them (usually 1); the memory and
// compute it gets come with it as the two resources below. Also the device plugin's resource
// name for share slots, and the resource the allocation record's entries name.
inline constexpr char kShares[] = "kgpu.io/gpu";
inline constexpr char kShareMemory[] = "kgpu.io/gpu-memory";  // MiB of GPU memory
inline constexpr char kShareCores[] = "kgpu.io/gpu-cores";    // percent of one GPU's SMs

// ---- pod annotations: what the user asks (read by the webhook and the extender)
inline constexpr char kAnnotationModels[] = "kgpu.io/gpu-model";
inline constexpr char kAnnotationModelsDeny[] = "kgpu.io/gpu-model-deny";
inline constexpr char kAnnotationUuids[] = "kgpu.io/gpu-uuid";
inline constexpr char kAnnotationUuidsDeny[] = "kgpu.io/gpu-uuid-deny";
inline constexpr char kAnnotationEnforcement[] = "kgpu.io/enforcement";
inline constexpr char kAnnotationPlacement[] = "kgpu.io/placement";
// ---- pod annotations: what kgpu decided (written by the extender at bind, the node at start)
inline constexpr char kAnnotationAllocation[] = "kgpu.io/allocation";  // the allocation record
inline constexpr char kAnnotationEnforcementApplied[] = "kgpu.io/enforcement-applied";

// ---- node annotations and labels
// The node's GPUs as the extender places on them (written by the node agent's publisher).
inline constexpr char kInventoryAnnotation[] = "kgpu.io/gpu-inventory";
// Which scheduler owns a node that Kubernetes and Slurm share (the Slurm bridge).
inline constexpr char kPoolLabel[] = "kgpu.io/pool";
inline constexpr char kOwnerTaintKey[] = "kgpu.io/owner";
inline constexpr char kSlurmLeaseAnnotation[] = "kgpu.io/slurm-lease";
inline constexpr char kSlurmReclaimAnnotation[] = "kgpu.io/slurm-reclaim";
inline constexpr char kSlurmSuspendedAnnotation[] = "kgpu.io/slurm-suspended";

// ---- NVIDIA's MIG resources (the device plugin's migStrategy mixed), one naming rule for every
// side: the plugin advertises them, the extender places them, quota counts them.
inline constexpr char kMigResourcePrefix[] = "nvidia.com/mig-";
// A MIG profile as its resource name spells it: '+' is not allowed in a resource name, so NVIDIA
// writes "1g.10gb+me" as "1g.10gb.me" ("nvidia.com/mig-1g.10gb.me"); other profiles unchanged.
inline std::string MigResourceProfile(std::string_view profile) {
  std::string out(profile);
  for (char& c : out) {
    if (c == '+') c = '.';
  }
  return out;
}
inline std::string MigResourceName(std::string_view profile) {
  return kMigResourcePrefix + MigResourceProfile(profile);
}

// ---- CDI
// The CDI device kind of a share container's spec (one spec per container).
inline constexpr char kShareCdiKind[] = "kgpu.io/share";

}  // namespace kgpu::api
