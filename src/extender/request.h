#pragma once
// The GPU request model (docs/sharing-model.md), read from a Pod's JSON:
//   nvidia.com/gpu: N            N whole GPUs (kubelet and the device plugin count them)
//   nvidia.com/mig-<profile>: 1  one MIG instance of that profile
//   kgpu.io/gpu: N               N shares, each on a different physical GPU (slots on the node)
//   kgpu.io/gpu-memory: M        MiB for the container in total across its shares (M/N per GPU)
//   kgpu.io/gpu-cores: C         percent of one GPU's SMs in total across its shares (C/N per GPU)
// Annotations (all optional): kgpu.io/gpu-model, kgpu.io/gpu-model-deny (comma-separated model
// names, matched case-insensitively as substrings of the GPU's product name), kgpu.io/gpu-uuid,
// kgpu.io/gpu-uuid-deny (exact UUIDs), kgpu.io/enforcement (hard | mps | none), kgpu.io/placement
// (binpack | spread: overrides the cluster policy for this pod).
//
// Quantities are read in every form the apiserver may hand back (canonical "8k" for 8000, "1Ki",
// "2e3"); extended resources are whole numbers. Errors name the container, the resource and the
// fix; they are the reasons a user reads in `kubectl describe pod`.
//
// Thread-safety: pure functions and value types.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "api/names.h"

namespace kgpu::extender {

inline constexpr char kWholeGpu[] = "nvidia.com/gpu";
inline constexpr const auto& kMigPrefix = api::kMigResourcePrefix;  // one spelling: api/names.h
// kgpu.io/* names: spelled once, in api/names.h.
using api::kShareCores;
using api::kShareMemory;
using api::kShares;

using api::kAnnotationAllocation;  // written by the extender at bind: the allocation record (record.h)
using api::kAnnotationEnforcement;
using api::kAnnotationEnforcementApplied;  // written by the node agent when the container starts
using api::kAnnotationModels;
using api::kAnnotationModelsDeny;
using api::kAnnotationPlacement;
using api::kAnnotationUuids;
using api::kAnnotationUuidsDeny;

enum class GpuKind { kWhole, kMig, kShare };

struct ContainerRequest {
  std::string name;
  // A regular init container (not a restartable sidecar): it runs alone before the app
  // containers, and kubelet hands its devices on to the first later container asking for the
  // same resource (its `target`, an index into PodRequest::gpus), so it is placed and enforced
  // as that container: it has no booking and no entry of its own in the allocation record.
  bool init = false;
  int target = -1;
  bool privileged = false;
  GpuKind kind = GpuKind::kWhole;
  int count = 0;                 // whole GPUs, MIG instances or shares
  std::string mig_profile;       // kMig: "1g.10gb"
  int64_t memory_mib_total = 0;  // kShares
  int64_t cores_total = 0;       // kShares, percent of one GPU
  // kgpu.io/gpu, nvidia.com/gpu or nvidia.com/mig-<profile>
  std::string Resource() const;
  int64_t MemoryPerGpu() const { return count > 0 ? memory_mib_total / count : 0; }
  int64_t CoresPerGpu() const { return count > 0 ? cores_total / count : 0; }
};

struct PodRequest {
  std::string ns, name, uid;
  int64_t priority = 0;
  // The containers that ask for GPUs, in kubelet's admission order (init containers, then app
  // containers); empty for a pod without. Placed() are those with a booking of their own.
  std::vector<ContainerRequest> gpus;
  std::vector<const ContainerRequest*> Placed() const;
  std::vector<std::string> models, models_deny, uuids, uuids_deny;
  std::string enforcement;  // "" = the node's default
  std::string placement;    // "" | "binpack" | "spread"
  std::string Key() const { return ns + "/" + name; }
};

// Reads the pod's GPU request. InvalidArgument (a message for the user) for what can never be
// scheduled: both nvidia.com/gpu and kgpu.io/gpu in one container, memory or cores without
// kgpu.io/gpu, totals that do not split evenly, more than 100% cores per share, an unknown
// enforcement or placement value, a regular init container whose devices kubelet would not hand
// on to a later container that asks for at least as much (see ContainerRequest::init).
absl::StatusOr<PodRequest> ParsePodRequest(const nlohmann::json& pod);

// An extended-resource quantity as a whole number ("8k" -> 8000). InvalidArgument naming `what`.
absl::StatusOr<int64_t> WholeQuantity(const nlohmann::json& value, std::string_view what);

// Comma-separated, trimmed, empty items dropped.
std::vector<std::string> SplitList(std::string_view s);

// Case-insensitive substring match of a model pattern against a GPU product name.
bool ModelMatches(std::string_view pattern, std::string_view model);

}  // namespace kgpu::extender
