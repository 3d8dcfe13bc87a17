#pragma once
// A Node's GPUs as the extender sees them: the kgpu.io/gpu-inventory annotation that
// `kgpu node-labels` publishes (docs/k8s.md; format version 1), turned into the placement engine's
// NodeSpec. Per GPU: index, UUID, model, memory, health, MIG instances, and `slots` > 0 when the
// GPU serves shares (kgpu.io/gpu); `sharing.kgpu.enforcement` lists the enforcement modes the
// node permits (first = its default; absent: hard only). NVLink islands become the engine's
// nvlink_island ids.
//
// In the engine a GPU that serves shares takes only shares, a GPU in MIG mode only MIG pods, and
// any other GPU only whole-GPU pods (kubelet counts nvidia.com/gpu, nvidia.com/mig-* and
// kgpu.io/gpu on separate devices, and a GPU in MIG mode is never served whole): the engine's
// model name of a sharing GPU is kShareModelPrefix + its model, of a MIG-mode GPU
// kMigModelPrefix + its model.
//
// Thread-safety: pure functions and value types.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "api/names.h"
#include "sched/types.h"

namespace kgpu::extender {

using api::kInventoryAnnotation;
inline constexpr char kShareModelPrefix[] = "share:";
inline constexpr char kMigModelPrefix[] = "mig:";
inline constexpr int kDefaultSlots = 16;

struct MigInfo {
  std::string uuid, profile;
  int64_t memory_mib = 0;
};

struct GpuInfo {
  int index = 0;
  std::string uuid, model;
  int64_t memory_mib = 0;
  bool healthy = true;
  int slots = 0;          // > 0: serves kgpu.io/gpu shares
  int64_t used_mib = -1;  // memory in use by every user of the GPU, as its node last read NVML (-1: not reported)
  int island = -1;
  std::vector<MigInfo> mig;
};

struct NodeInfo {
  std::string name;
  std::string annotation;  // the raw value, to notice changes
  std::vector<GpuInfo> gpus;
  std::vector<std::string> enforcement = {"hard"};
  std::string mig_strategy = "none";
  int engine_id = -1;  // set by the extender's State: the placement engine's id of this node
  // What decides whether a pod could ever fit here, UUIDs aside (StaticShape), interned by the
  // extender's State: nodes with equal shapes refuse a pod for the same reason, so a filter
  // explains each shape once.
  int shape_id = -1;
  const GpuInfo* FindUuid(const std::string& uuid) const;
  int IndexOfUuid(const std::string& uuid) const;  // position in gpus, -1 if none
};

// NotFound when the Node has no inventory annotation; InvalidArgument naming the field when it
// does not parse.
absl::StatusOr<NodeInfo> ParseNodeInventory(const nlohmann::json& node);
absl::StatusOr<NodeInfo> ParseInventoryAnnotation(const std::string& node_name, const std::string& annotation);

sched::NodeSpec ToNodeSpec(const NodeInfo& node);
// The node's enforcement modes and, per GPU, whether it serves shares, its model, memory, health
// and MIG profiles: everything but the UUIDs that a pod's static feasibility depends on.
std::string StaticShape(const NodeInfo& node);
// Compute slices of a MIG profile ("3g.40gb" -> 3; 0 when it does not parse).
int MigSlices(const std::string& profile);

}  // namespace kgpu::extender
