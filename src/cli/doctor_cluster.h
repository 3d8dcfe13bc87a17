#pragma once
// The cluster half of `kgpu doctor` (with --kubeconfig, or in-cluster): the Node object as the
// API server sees it — it exists; status.capacity/allocatable list every resource the local
// plugins serve with the same count (and, when not, why: no plugin registered, kubelet
// restarted, devices unhealthy, resource renamed); the node is not cordoned or tainted against
// GPU pods; the GFD labels are present and current. PASS/WARN/FAIL with the fix, as the node
// checks.
//
// Thread-safety: reentrant.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "k8s/client.h"

namespace kgpu::cli {

struct Served {
  size_t devices = 0;
  size_t healthy = 0;
};
// What the device plugins on this node advertise, read from their sockets (resource -> counts).
std::map<std::string, Served> ServedResources(const std::string& kubelet_dir);

// `gpus`: the GPUs NVML sees (for the label check); `now`: epoch seconds.
std::vector<Check> ClusterChecks(k8s::Client& client, const std::string& node_name,
                                 const std::map<std::string, Served>& served, size_t gpus, int64_t now);

// The checks with a client made from the options (kubeconfig or in-cluster); a single FAIL
// check when the API cannot be reached.
std::vector<Check> ClusterChecks(const NodeOptions& options, size_t gpus);

}  // namespace kgpu::cli
