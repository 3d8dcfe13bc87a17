#pragma once
// The three patch formats of the Kubernetes API, applied to nlohmann::json documents:
// JSON merge patch (RFC 7386, application/merge-patch+json), JSON patch (RFC 6902,
// application/json-patch+json) and strategic merge patch
// (application/strategic-merge-patch+json). The strategic form merges the lists the core kinds
// declare with a patchMergeKey (containers, env, ports, volumes, conditions, taints, ...) by
// that key, honours the `$patch: delete|replace` and `$deleteFromPrimitiveList/<field>`
// directives, and drops the `$setElementOrder/<field>` and `$retainKeys` hints (the order
// they ask for is the order the merged list already has in every case we use).
//
// Thread-safety: pure functions.

#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace kgpu::k8s {

// RFC 7386: null deletes a key, objects merge recursively, anything else replaces.
nlohmann::json MergePatch(nlohmann::json target, const nlohmann::json& patch);

// RFC 6902 (add, remove, replace, move, copy, test). Fails with InvalidArgument naming the
// operation's index and path.
absl::StatusOr<nlohmann::json> JsonPatch(nlohmann::json target, const nlohmann::json& ops);

// Strategic merge patch for the core kinds. `kind` is the object's kind ("Pod", "Node", ...):
// it selects the merge keys of its lists.
absl::StatusOr<nlohmann::json> StrategicMergePatch(nlohmann::json target, const nlohmann::json& patch,
                                                   std::string_view kind);

// Applies `patch` of the given Content-Type. Unknown types fail with InvalidArgument.
absl::StatusOr<nlohmann::json> ApplyPatch(const nlohmann::json& target, const nlohmann::json& patch,
                                          std::string_view content_type, std::string_view kind);

// Content-Type strings.
inline constexpr std::string_view kMergePatch = "application/merge-patch+json";
inline constexpr std::string_view kJsonPatch = "application/json-patch+json";
inline constexpr std::string_view kStrategicMergePatch = "application/strategic-merge-patch+json";

}  // namespace kgpu::k8s
