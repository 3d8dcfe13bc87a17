#pragma once
// The subset of CEL that DeviceClasses and ResourceClaims use in practice, evaluated as
// kube-scheduler's structured allocator does (kubernetes/kubernetes
// staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go; docs/dra.md):
//   - the variable `device`: driver (string), attributes and capacity (maps domain -> map id ->
//     value; unqualified names are in the driver's domain), allowMultipleAllocations (bool);
//   - literals: strings ('..' or ".."), integers, true/false, lists [a, b];
//   - operators: == != < <= > >= (ints, strings), && || ! (bools), `in` (a list), parentheses;
//   - functions and methods: has(device.attributes['d'].x), quantity("40Gi"), semver("1.2.3"),
//     size(); strings: matches (ECMAScript regex, close to RE2 for the patterns used),
//     startsWith, endsWith, contains; quantities and versions: isGreaterThan, isLessThan,
//     compareTo; quantities: asInteger.
// Anything else is a compile error naming the construct, never a guess. A missing attribute is a
// runtime error ("no such key"), as in Kubernetes; an unknown domain is an empty map.
//
// Thread-safety: a compiled program is immutable; Eval may run on any thread.

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace kgpu::testing {

class CelProgram;

// The device as CEL sees it, from a ResourceSlice's device entry and its slice's driver.
struct CelDevice {
  std::string driver;
  nlohmann::json device;  // spec.devices[i]
};

absl::StatusOr<std::shared_ptr<const CelProgram>> CompileCel(std::string_view expression);
absl::StatusOr<bool> EvalCel(const CelProgram& program, const CelDevice& device);

}  // namespace kgpu::testing
