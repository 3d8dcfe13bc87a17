#pragma once
// Keeps the API server's ResourceSlices of this node's pool equal to what the node has
// (kubernetes/kubernetes staging/src/k8s.io/dynamic-resource-allocation/resourceslice, what its
// controller does for Go drivers): the slices of this driver on this node are listed
// (fieldSelector spec.nodeName=<node>,spec.driver=<driver>); when what should be published
// differs from what is, every slice is written with the pool's generation one higher than any
// seen (consumers only use the highest generation of a pool) and slices left over are deleted
// after. Each slice is owned by the Node (ownerReferences), so it goes when the Node does.
// RBAC: resourceslices get, list, create, update, delete; nodes get.
//
// Thread-safety: one caller at a time.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "api/dra.h"

namespace kgpu::k8s {
class Client;
}

namespace kgpu::dra {

struct PublishResult {
  bool changed = false;    // anything was written or deleted
  int64_t generation = 0;  // the pool's generation now
  size_t written = 0, deleted = 0;
};

class SlicePublisher {
 public:
  SlicePublisher(std::shared_ptr<k8s::Client> client, std::string driver, std::string node);
  // `slices` as BuildPool made them (their generation is replaced).
  absl::StatusOr<PublishResult> Publish(std::vector<api::dra::ResourceSlice> slices);
  // Deletes every slice of this driver on this node (the driver is being removed).
  absl::Status Withdraw();

 private:
  std::shared_ptr<k8s::Client> client_;
  std::string driver_, node_;
  std::string node_uid_;  // read once
  // What the last publish asked for, and what the API server stored of each slice (it drops the
  // fields of a feature gate that is off): a pool is unchanged when it asks the same again and the
  // server still has what it stored.
  std::vector<nlohmann::json> last_desired_;
  std::map<std::string, nlohmann::json> stored_;
  bool warned_dropped_ = false;
};

}  // namespace kgpu::dra
