#pragma once
// Validation of resource.k8s.io/v1 objects as kube-apiserver does it
// (pkg/apis/resource/validation/validation.go, k8s.io/api resource/v1 types.go limits;
// k8s.io/api resource/v1 types.go limits): DeviceClass, ResourceSlice, ResourceClaim (spec and status),
// ResourceClaimTemplate — names, the per-object limits, exactly-one-of rules, value formats
// (DNS labels and subdomains, qualified names, semver, quantities) and immutable fields. CEL
// selectors are checked for presence and length only (the apiserver also compiles them).
// Messages follow field.ErrorList's wording; several errors come back as one 422 Invalid.
//
// Thread-safety: pure functions.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/fake_apiserver_admission.h"

namespace kgpu::testing {

// `old`: the stored object on update (immutable fields, a status update), null on create.
// `minor`: the server's Kubernetes minor (1.35 forbids devices and sharedCounters in one slice).
// `status`: the write is to the status subresource.
std::vector<FieldError> ValidateDra(const std::string& kind, const nlohmann::json& obj, const nlohmann::json* old,
                                    int minor, bool status);

// metadata.generation as the registries keep it: 1 at create, +1 when the spec changes; and a
// ResourceSlice device taint without timeAdded gets the time now (the strategy's PrepareFor*).
void SetDraGeneration(nlohmann::json& obj, const nlohmann::json* old);

}  // namespace kgpu::testing
