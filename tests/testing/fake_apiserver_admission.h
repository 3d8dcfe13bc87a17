#pragma once
// Admission as kube-apiserver does it for pods, on JSON objects (used by the stand-in):
//  - core defaulting (pkg/apis/core/v1/defaults.go SetDefaults_Pod): a container's limits
//    default its missing requests;
//  - LimitRanger (plugin/pkg/admission/limitranger/admission.go): LimitRange items of type
//    Container default the missing limits (`default`) and requests (`defaultRequest`), noted in
//    the pod's `kubernetes.io/limit-ranger` annotation as the plugin writes it, then
//    `min`/`max` are enforced with the plugin's messages; a LimitRange is itself defaulted on
//    create as SetDefaults_LimitRangeItem does (default from max, defaultRequest from default,
//    then from min);
//  - validation (pkg/apis/core/validation ValidateResourceRequirements): extended resources are
//    integers, need a limit and a request equal to it;
//  - ResourceQuota (plugin/pkg/admission/resourcequota, pkg/quota/v1/evaluator/core/pods.go):
//    the pod's usage (pods, count/pods, cpu/memory requests and limits, `requests.<extended>`;
//    `limits.<extended>` is accepted in a quota but not enforced, as upstream), refused with
//    "exceeded quota: <name>, requested: ..., used: ..., limited: ..."; a quota with scopes
//    (spec.scopes and spec.scopeSelector, ANDed: getScopeSelectorsFromQuota) counts and limits
//    only the pods it matches (pods.go podMatchesScopeFunc): Terminating (activeDeadlineSeconds
//    >= 0), NotTerminating (none), BestEffort (no cpu/memory request or limit in any container:
//    qos.GetPodQOS), NotBestEffort, PriorityClass (In/NotIn/Exists/DoesNotExist as a label
//    selector on {PriorityClass: spec.priorityClassName}: Exists matches every pod, as upstream).
//    CrossNamespacePodAffinity is not implemented (it matches no pod).
//
// Object validation for ResourceQuota (pkg/apis/core/validation ValidateResourceQuota and
// ValidateResourceQuotaUpdate, v1.32): spec.hard names (an unqualified name must be a standard
// quota resource), values not negative; spec.scopes: known scopes only, each hard resource that
// is a standard quota name valid for every scope (BestEffort tracks `pods` only; the other
// scopes pods, cpu and memory; `requests.nvidia.com/gpu` is not a standard name, so any scope
// may track it), not BestEffort with NotBestEffort nor Terminating with NotTerminating;
// spec.scopeSelector: the same per expression, Exists-only scopes, operator and values rules;
// scopes immutable on update. Bad values are printed as Go's %#v of the internal types, as the
// apiserver does (`[]core.ResourceQuotaScope{"BestEffort"}`). Not implemented: the
// qualified-name syntax of `a.b/c` names and the integer rule for object counts.
//
// Thread-safety: pure functions.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgpu::testing {

// Mutates `pod` (defaults); on refusal returns false with the HTTP code: 403 with the message
// the apiserver sends (without the `pods "x" is forbidden: ` prefix), or 422 with the field errors.
// One error of apimachinery's field.ErrorList: its type is the Status cause's reason
// (FieldValueRequired, FieldValueInvalid, FieldValueForbidden ...), body is ErrorBody()
// ("Required value", "Invalid value: \"x\": detail", "Forbidden: detail").
struct FieldError {
  std::string type, field, body;
  std::string Error() const { return field + ": " + body; }
};

struct AdmissionResult {
  bool allowed = true;
  int code = 0;
  std::string message;             // 403: the reasons (without `pods "x" is forbidden: `)
  std::vector<FieldError> errors;  // 422: the field errors (errors.NewInvalid's causes)
};
AdmissionResult AdmitPod(nlohmann::json& pod, const std::vector<nlohmann::json>& limit_ranges,
                         const std::vector<nlohmann::json>& quotas);

// SetDefaults_LimitRangeItem on create.
void DefaultLimitRange(nlohmann::json& lr);

// Whether the quota's scopes select the pod (a quota without scopes selects every pod).
bool QuotaMatchesPod(const nlohmann::json& quota, const nlohmann::json& pod);

// The quota usage of one non-terminal pod: "pods", "count/pods", "requests.cpu", ...
nlohmann::json PodQuotaUsage(const nlohmann::json& pod);

// status.used of a quota from the namespace's pods (terminal pods do not count).
nlohmann::json QuotaUsed(const nlohmann::json& quota, const std::vector<nlohmann::json>& pods);

// One apimachinery field.Error: the cause type ("FieldValueInvalid", "FieldValueRequired"),
// the path ("spec.scopes") and the body ("Invalid value: ...: detail"). Error() is
// "<field>: <body>".
// Errors of a ResourceQuota on create (old == nullptr) or update; empty when valid.
std::vector<FieldError> ValidateResourceQuota(const nlohmann::json& quota, const nlohmann::json* old = nullptr);

}  // namespace kgpu::testing
