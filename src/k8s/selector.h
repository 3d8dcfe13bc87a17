#pragma once
// Label and field selectors in the API's string forms, parsed once and matched against JSON
// objects. Label selector grammar (apimachinery pkg/labels/selector.go): comma-separated
// requirements `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k`.
// Field selectors (pkg/fields): `path=v`, `path==v`, `path!=v`, where path is a dotted JSON
// path such as spec.nodeName, metadata.name, status.phase or involvedObject.uid.
//
// Thread-safety: immutable after Parse.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace kgpu::k8s {

class LabelSelector {
 public:
  enum class Op { kEq, kNe, kIn, kNotIn, kExists, kNotExists };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };
  static absl::StatusOr<LabelSelector> Parse(std::string_view text);
  // The metav1.LabelSelector JSON form (matchLabels, matchExpressions), as in PDBs.
  static absl::StatusOr<LabelSelector> FromJson(const nlohmann::json& selector);
  bool Matches(const nlohmann::json& labels) const;
  bool Empty() const { return reqs_.empty(); }

 private:
  std::vector<Requirement> reqs_;
};

class FieldSelector {
 public:
  static absl::StatusOr<FieldSelector> Parse(std::string_view text);
  bool Matches(const nlohmann::json& object) const;
  // The field paths the terms compare, in order (a server checks them against what it supports).
  std::vector<std::string> Fields() const;
  // Every term on `from` compares `to` instead (an apiserver's field label conversion).
  void Rename(std::string_view from, std::string_view to);

 private:
  struct Term {
    std::string path;
    bool equal;
    std::string value;
  };
  std::vector<Term> terms_;
};

// The pods a PodDisruptionBudget guards, as the Eviction API (pkg/registry/core/pod/storage/
// eviction.go) matches them: its spec.selector, where a missing, empty or invalid selector
// guards no pod (nullopt).
std::optional<LabelSelector> BudgetSelector(const nlohmann::json& pdb);

// The string value at a dotted path ("" when absent), as field selectors compare it.
std::string FieldValue(const nlohmann::json& object, std::string_view dotted_path);

}  // namespace kgpu::k8s
