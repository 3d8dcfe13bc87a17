#pragma once
// Field validation as kube-apiserver does it for the kinds the stand-in serves
// (KEP-2885 server-side unknown field validation, GA in 1.27; apiserver
// pkg/endpoints/handlers/{create,update,patch,rest}.go):
//  - the directive is the `fieldValidation` query parameter: Ignore, Warn (the default when it is
//    absent: handlers/rest.go fieldValidation()) or Strict; any other value is refused (422);
//  - decoding into the Go types drops unknown fields, so under Ignore and Warn they are removed
//    from the stored object; Warn adds one `Warning: 299 - "unknown field \"<path>\""` response
//    header per field (addStrictDecodingWarnings);
//  - Strict refuses: create/update with 400 BadRequest `<Kind> in version "<v>" cannot be handled
//    as a <Kind>: strict decoding error: unknown field "<path>", ...` (transformDecodeError);
//    patches with 422 Invalid ` "" is invalid: patch: Invalid value: "<patched object>": strict
//    decoding error: ...` (jsonPatcher / applyPatchToObject: errors.NewInvalid(GroupKind{}, "")).
// Paths are the apiserver's: `spec.containers[0].foo`. Where the stand-in knows a subtree only
// loosely (volumes, affinity, probes, every status) it accepts any field there rather than
// refuse a real one. Deviations: duplicate JSON keys are not detected (the parser keeps the
// last), and several unknown fields are listed in key order, not document order.
//
// Thread-safety: pure functions.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace kgpu::testing {

enum class FieldValidation { kIgnore, kWarn, kStrict };

// The `fieldValidation` parameter; an error (the apiserver's 422 message, for `options_kind`
// "CreateOptions", "UpdateOptions" or "PatchOptions") for an unsupported value.
absl::StatusOr<FieldValidation> ParseFieldValidation(const std::string& value, const std::string& options_kind);

// Removes the fields `group`/`kind` does not have from `obj` and returns their paths (sorted
// as found). `extra` lists dotted paths without indices ("spec.futureField") this server also
// knows, as a newer apiserver would; their subtrees are not checked.
std::vector<std::string> PruneUnknownFields(const std::string& group, const std::string& kind, nlohmann::json& obj,
                                            const std::set<std::string>& extra = {});

// "strict decoding error: unknown field \"a\", unknown field \"b\"".
std::string StrictDecodingError(const std::vector<std::string>& unknown);

// Go's fmt %+v of a decoded JSON value (map[a:1 b:[x y]]), as applyPatchToObject prints a
// strategic merge patch in its error.
std::string GoValue(const nlohmann::json& v);

// The value of a Warning response header for one warning text (299 - "<escaped>").
std::string WarningHeader(const std::string& text);

// Field selectors as kube-apiserver serves them (pkg/apis/core/v1/conversion.go
// AddFieldLabelConversionFunc per kind; runtime.DefaultMetaV1FieldSelectorConversion for the
// rest): the 400 message for the first field label `kind` does not support ("field label not
// supported: spec.bogus", or for the metadata-only kinds `"spec.x" is not a known field
// selector: only "metadata.name", "metadata.namespace"`), nullopt when all are supported. `fields`
// are after the conversions (pods' spec.host is spec.nodeName).
std::optional<std::string> UnsupportedFieldLabel(const std::string& kind, const std::vector<std::string>& fields);

// The object as its field selectors see it (the registries' ToSelectableFields): unset booleans
// read "false" (pods' spec.hostNetwork, nodes' spec.unschedulable), a pod's status.podIP is
// status.podIPs[0].ip, an event's `source` is source.component (or reportingComponent) and its
// reportingComponent is reportingController.
nlohmann::json SelectableView(const std::string& kind, const nlohmann::json& obj);

}  // namespace kgpu::testing
