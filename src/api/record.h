#pragma once
// The allocation record: what the extender decided for a pod, written on the pod as the
// annotation kgpu.io/allocation by the binding itself (pods/binding merges the Binding's
// annotations into the pod with spec.nodeName), read back by a restarted extender
// to rebuild its state and by the node agent to hand each container exactly these GPUs and
// limits (docs/sharing-model.md). Compact JSON, format version 1:
//
//   {"v":1,"node":"node-a","containers":[{"name":"main","resource":"kgpu.io/gpu",
//     "enforcement":"hard","gpus":[{"uuid":"GPU-…","memMiB":4000,"cores":25}]}]}
//
// resource is kgpu.io/gpu (shares: memMiB and cores are per GPU), nvidia.com/gpu (whole GPUs) or
// nvidia.com/mig-<profile> (gpus[0] has the parent GPU's uuid, "mig" the MIG device's UUID and
// "profile"). This is its own small library (kgpu_allocation) so that the node side can read
// records without depending on the extender.
//
// Thread-safety: value types and pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace kgpu::api {

struct RecordGpu {
  std::string uuid;        // the physical GPU
  std::string mig;         // MIG device UUID (MIG records only)
  std::string profile;     // MIG profile (MIG records only)
  int64_t memory_mib = 0;  // shares: per GPU; MIG: the instance's memory; whole: 0
  int64_t cores = 0;       // shares: percent of this GPU; else 0
  // The device the container holds: the MIG device for MIG records, else the GPU.
  const std::string& Device() const { return mig.empty() ? uuid : mig; }
  bool operator==(const RecordGpu&) const = default;
};

struct RecordContainer {
  std::string name;
  std::string resource;     // kgpu.io/gpu, nvidia.com/gpu or nvidia.com/mig-<profile>
  std::string enforcement;  // shares: hard | mps | none; else empty
  std::vector<RecordGpu> gpus;
  bool operator==(const RecordContainer&) const = default;
};

struct AllocationRecord {
  std::string node;
  std::vector<RecordContainer> containers;
  bool operator==(const AllocationRecord&) const = default;
};

std::string EncodeRecord(const AllocationRecord& r);
// Errors name the field ("kgpu.io/allocation: containers[0].gpus[1].uuid: missing").
absl::StatusOr<AllocationRecord> ParseRecord(std::string_view text);
// The record on a Pod object (its kgpu.io/allocation annotation): nullopt when it has none (or
// the annotation is not a string), ParseRecord's error when it does not parse.
absl::StatusOr<std::optional<AllocationRecord>> RecordOnPod(const nlohmann::json& pod);

}  // namespace kgpu::api
