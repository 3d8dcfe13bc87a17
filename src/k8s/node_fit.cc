#include "k8s/node_fit.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

#include "common/strings.h"
#include "k8s/resources.h"

namespace kgpu::k8s {
namespace {

using json = nlohmann::json;

std::string Str(const json& j, const char* key) {
  const json& v = Field(j, key);
  return v.is_string() ? v.get<std::string>() : std::string();
}

std::optional<int64_t> Int(std::string_view s) {
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

bool Contains(const json& values, const std::string& v) {
  if (!values.is_array()) return false;
  return std::any_of(values.begin(), values.end(), [&](const json& x) { return x.is_string() && x == v; });
}

// One NodeSelectorRequirement against a value that is present (`have`) or not.
bool Requirement(const json& req, const std::optional<std::string>& have) {
  const std::string op = Str(req, "operator");
  const json& values = Field(req, "values");
  if (op == "In") return have && Contains(values, *have);
  if (op == "NotIn") return !have || !Contains(values, *have);
  if (op == "Exists") return have.has_value();
  if (op == "DoesNotExist") return !have.has_value();
  if (op == "Gt" || op == "Lt") {
    if (!have || !values.is_array() || values.size() != 1 || !values[0].is_string()) return false;
    const auto l = Int(*have), r = Int(values[0].get<std::string>());
    if (!l || !r) return false;
    return op == "Gt" ? *l > *r : *l < *r;
  }
  return false;  // an unknown operator matches nothing (the API refuses it at create)
}

// A NodeSelectorTerm: its requirements ANDed; an empty term matches no node.
bool Term(const json& term, const json& labels, const std::string& node_name) {
  const json& exprs = Field(term, "matchExpressions");
  const json& fields = Field(term, "matchFields");
  const bool any_expr = exprs.is_array() && !exprs.empty();
  const bool any_field = fields.is_array() && !fields.empty();
  if (!any_expr && !any_field) return false;
  if (any_expr) {
    for (const auto& r : exprs) {
      const std::string key = Str(r, "key");
      const json& v = Field(labels, key);
      const std::optional<std::string> have = labels.is_object() && labels.contains(key) && v.is_string()
                                                  ? std::optional(v.get<std::string>())
                                                  : std::nullopt;
      if (!Requirement(r, have)) return false;
    }
  }
  if (any_field) {
    for (const auto& r : fields) {
      // metadata.name is the one field a node selector term may name.
      if (Str(r, "key") != "metadata.name") return false;
      if (!Requirement(r, node_name)) return false;
    }
  }
  return true;
}

bool AffinityMatches(const json& spec, const json& node) {
  const json& metadata = Field(node, "metadata");
  const json& labels = Field(metadata, "labels");
  const std::string name = Str(metadata, "name");
  const json& selector = Field(spec, "nodeSelector");
  if (selector.is_object()) {
    for (auto it = selector.begin(); it != selector.end(); ++it) {
      const json& v = Field(labels, it.key());
      if (!v.is_string() || v != *it) return false;
    }
  }
  const json& required =
      Field(Field(Field(spec, "affinity"), "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution");
  if (!required.is_object() || required.empty()) return true;
  const json& terms = Field(required, "nodeSelectorTerms");
  if (!terms.is_array()) return true;
  return std::any_of(terms.begin(), terms.end(), [&](const json& t) { return Term(t, labels, name); });
}

}  // namespace

bool Tolerates(const json& tolerations, const json& taint) {
  if (!tolerations.is_array()) return false;
  const std::string key = Str(taint, "key"), value = Str(taint, "value"), effect = Str(taint, "effect");
  for (const auto& t : tolerations) {
    const std::string t_effect = Str(t, "effect");
    if (!t_effect.empty() && t_effect != effect) continue;
    const std::string t_key = Str(t, "key");
    const std::string op = Str(t, "operator").empty() ? "Equal" : Str(t, "operator");
    if (t_key.empty()) {
      if (op == "Exists") return true;  // an empty key with Exists tolerates every taint
      continue;
    }
    if (t_key != key) continue;
    if (op == "Exists") return true;
    if (op == "Equal" && Str(t, "value") == value) return true;
  }
  return false;
}

std::string NodeRefusesPod(const json& pod, const json& node) {
  const json& spec = Field(pod, "spec");
  const json& tolerations = Field(spec, "tolerations");
  const json& node_spec = Field(node, "spec");
  // NodeUnschedulable.
  const json& unschedulable = Field(node_spec, "unschedulable");
  if (unschedulable.is_boolean() && unschedulable.get<bool>() &&
      !Tolerates(tolerations, {{"key", "node.kubernetes.io/unschedulable"}, {"effect", "NoSchedule"}})) {
    return "node(s) were unschedulable";
  }
  // NodeAffinity.
  if (!AffinityMatches(spec, node)) return "node(s) didn't match Pod's node affinity/selector";
  // TaintToleration: the taints that keep pods off (PreferNoSchedule only scores).
  const json& taints = Field(node_spec, "taints");
  if (taints.is_array()) {
    for (const auto& t : taints) {
      const std::string effect = Str(t, "effect");
      if ((effect == "NoSchedule" || effect == "NoExecute") && !Tolerates(tolerations, t)) {
        return Cat("node(s) had untolerated taint {", Str(t, "key"), ": ", Str(t, "value"), "}");
      }
    }
  }
  // Ready, as the taint the node lifecycle controller puts on a node that is not (not-ready for
  // False, unreachable for Unknown) would say, should the controller not have done so yet: a pod
  // that tolerates that taint may still go there, as kube-scheduler would let it.
  const json& conditions = Field(Field(node, "status"), "conditions");
  if (conditions.is_array()) {
    for (const auto& c : conditions) {
      if (Str(c, "type") != "Ready" || Str(c, "status") == "True") continue;
      const char* key = Str(c, "status") == "False" ? "node.kubernetes.io/not-ready" : "node.kubernetes.io/unreachable";
      if (!Tolerates(tolerations, {{"key", key}, {"effect", "NoSchedule"}})) {
        return Cat("node(s) were not ready (Ready is ", Str(c, "status"), ")");
      }
    }
  }
  return "";
}

}  // namespace kgpu::k8s
