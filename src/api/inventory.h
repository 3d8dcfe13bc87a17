#pragma once
// The kgpu.io/gpu-inventory annotation (format version 1): a node's GPUs as the node agent
// publishes them and the extender and webhook read them, as one value type with its encoder and
// its parser side by side, so writer and readers cannot drift apart (docs/k8s.md has the format).
//
//   {"v":1,"gpus":[{"i":0,"uuid":"GPU-…","model":"NVIDIA H100 80GB HBM3","memMiB":81559,"numa":0,
//     "health":"ok","slots":4,"usedMiB":1200,"mig":[{"uuid":"MIG-…","profile":"1g.10gb","gi":7,"ci":0,
//     "memMiB":9856,"health":"ok"}]}],"nvlinkIslands":[[0,1,2,3]],"pcieIslands":[],
//     "migStrategy":"none","sharing":{"mode":"none","replicas":{"nvidia.com/gpu":4},
//     "kgpu":{"enforcement":["hard","none"]}}}
//
// Thread-safety: value types and pure functions.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::api {

struct InventoryMig {
  std::string uuid, profile;
  int gi = 0, ci = 0;
  int64_t memory_mib = 0;
  std::string health = "ok";
  bool operator==(const InventoryMig&) const = default;
};

struct InventoryGpu {
  int index = 0;
  std::string uuid, model;
  int64_t memory_mib = 0;
  int numa = -1;
  std::string health = "ok";  // ok | unhealthy | lost | error
  int slots = 0;              // > 0: serves kgpu.io/gpu shares, this many at once
  int64_t used_mib = -1;      // memory in use by every user of the GPU (-1: not reported)
  bool mig_enabled = false;   // "mig" is written (possibly empty) exactly when the GPU is in MIG mode
  std::vector<InventoryMig> mig;
  bool operator==(const InventoryGpu&) const = default;
};

struct NodeInventory {
  std::vector<InventoryGpu> gpus;
  std::vector<std::vector<int>> nvlink_islands, pcie_islands;  // GPU indices, islands of 2 or more
  std::string mig_strategy = "none";
  std::string sharing_mode = "none";     // none | time-slicing | mps
  std::map<std::string, int> replicas;   // resource -> replicas (time-slicing or MPS > 1)
  std::vector<std::string> enforcement;  // share enforcement modes, default first; empty: not written
  bool operator==(const NodeInventory&) const = default;

  // The modes shares can have here as readers take them: "hard" alone when none is written.
  std::vector<std::string> EnforcementOrDefault() const {
    return enforcement.empty() ? std::vector<std::string>{"hard"} : enforcement;
  }
};

// The annotation's value (compact JSON, keys in a fixed order).
std::string EncodeInventory(const NodeInventory& inventory);
// Parses an annotation read from Node `node_name`. InvalidArgument naming the node, the annotation,
// the field and the fix when it does not parse; members a reader does not need may be absent.
absl::StatusOr<NodeInventory> ParseInventory(std::string_view node_name, std::string_view text);

// Compute slices of a MIG profile ("3g.40gb" -> 3, "1c.3g.40gb" -> 3; 0 when it does not parse).
int MigSlices(std::string_view profile);

}  // namespace kgpu::api
