#pragma once
// kube-scheduler's structured-parameters allocator, stood in for tests and the demo
// (kubernetes/kubernetes staging/src/k8s.io/dynamic-resource-allocation/structured/internal/
// {stable/allocator_stable.go,incubating/consumable_capacity.go}; docs/dra.md): one claim on one
// node, from the node's ResourceSlices (per pool the highest generation; a pool whose slice count
// is short is incomplete), the DeviceClasses and the claims already allocated.
//  - a device fits a request when the class's and the request's CEL selectors (testing/dra_cel.h)
//    are true, it is not in use (unless allowMultipleAllocations and its capacity suffices), no
//    NoSchedule/NoExecute taint goes untolerated, and its consumesCounters fit what its pool's
//    counter sets have left;
//  - consumable capacity: the request (or the policy's default, or all of it) rounded by the
//    requestPolicy (validRange min/step/max, validValues); the result carries a shareID and every
//    capacity consumed;
//  - requests in order, exactly/count or firstAvailable (subrequests in order), with
//    matchAttribute/distinctAttribute constraints, depth-first with backtracking; the first
//    complete solution wins (devices in slice order);
//  - the allocation: results, class configs (FromClass) then claim configs (FromClaim), the node
//    selector of the node-local pool.
// Not done: allocationMode All across pools, admin access, binding conditions, per-device node
// selection.
//
// Thread-safety: pure functions.

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace kgpu::testing {

struct DraWorld {
  std::vector<nlohmann::json> slices;             // every ResourceSlice
  std::map<std::string, nlohmann::json> classes;  // DeviceClass by name
  std::vector<nlohmann::json> allocated;          // every claim with status.allocation
};

// The claim's status.allocation on `node`; FailedPrecondition (the reason) when it cannot be
// satisfied there, InvalidArgument for a selector the stand-in cannot evaluate.
absl::StatusOr<nlohmann::json> AllocateClaim(const nlohmann::json& claim, const std::string& node,
                                             const DraWorld& world);

}  // namespace kgpu::testing
