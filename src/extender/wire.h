#pragma once
// The kube-scheduler extender wire protocol (k8s.io/kube-scheduler/extender/v1 types.go), exactly:
// the envelope types have no json tags, so Go emits the field names verbatim (PascalCase) and its
// decoder matches keys case-insensitively. We parse the same way (an exact key first, then an
// ASCII case-insensitive match) and always emit PascalCase. Embedded Kubernetes objects (Pod,
// NodeList, Node) keep their own camelCase API JSON and are passed through untouched.
//
//   ExtenderArgs               { Pod; Nodes *NodeList; NodeNames *[]string }
//   ExtenderFilterResult       { Nodes; NodeNames; FailedNodes; FailedAndUnresolvableNodes; Error }
//   HostPriorityList           [ { Host; Score } ]
//   ExtenderBindingArgs        { PodName; PodNamespace; PodUID; Node }
//   ExtenderBindingResult      { Error }
//   ExtenderPreemptionArgs     { Pod; NodeNameToVictims; NodeNameToMetaVictims }
//   ExtenderPreemptionResult   { NodeNameToMetaVictims }
//   Victims { Pods []*Pod; NumPDBViolations }   MetaVictims { Pods []*MetaPod{UID}; NumPDBViolations }
//
// Parse errors name the field and what was expected ("ExtenderArgs.NodeNames: expected an array
// of strings or null"). Nothing we emit ever contains a null victim entry (a null MetaVictims or
// MetaPod panics kube-scheduler).
//
// Thread-safety: pure functions and value types.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace kgpu::extender {

// The member `name` of an object: the exact key, else the first key equal to it ignoring ASCII
// case (as Go's encoding/json). Null when `obj` is not an object or has no such key.
const nlohmann::json* Field(const nlohmann::json& obj, std::string_view name);

struct ExtenderArgs {
  nlohmann::json pod;                                  // the v1.Pod (object)
  std::optional<std::vector<nlohmann::json>> nodes;    // Nodes.items when Nodes is not null
  std::optional<std::vector<std::string>> node_names;  // NodeNames when not null
};

// FailedNodes / FailedAndUnresolvableNodes (Go: map[string]string, node name -> reason), kept in
// the order the nodes were added (kube-scheduler's own order): a filter over 5,000 nodes fails
// thousands, and keeping them sorted cost a third of the decision. Lookups are linear (tests and
// small lists); equality ignores the order, as for a map.
class NodeReasons {
 public:
  using Entry = std::pair<std::string, std::string>;
  // Appends without looking for `node` (the caller knows it is new: one entry per input node).
  void Append(std::string node, std::string why) { entries_.emplace_back(std::move(node), std::move(why)); }
  // The reason of `node`, appended empty when absent.
  std::string& operator[](std::string_view node);
  const std::string& at(std::string_view node) const;  // std::out_of_range when absent
  bool contains(std::string_view node) const { return Find(node) != nullptr; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }
  bool operator==(const NodeReasons& o) const;

 private:
  const Entry* Find(std::string_view node) const;
  std::vector<Entry> entries_;
};

struct FilterResult {
  std::optional<std::vector<nlohmann::json>> nodes;  // emitted as {"metadata":{},"items":[...]}
  std::optional<std::vector<std::string>> node_names;
  NodeReasons failed_nodes;
  NodeReasons failed_and_unresolvable;
  std::string error;
};

struct HostPriority {
  std::string host;
  int64_t score = 0;
};

struct BindingArgs {
  std::string pod_name, pod_namespace, pod_uid, node;
};

struct MetaVictims {
  std::vector<std::string> pod_uids;
  int64_t num_pdb_violations = 0;
};

struct PreemptionArgs {
  nlohmann::json pod;
  // Victims per node: from NodeNameToMetaVictims (nodeCacheCapable) or NodeNameToVictims (full
  // pods, their metadata.uid taken). `full_victims` says which one the scheduler sent.
  std::map<std::string, MetaVictims> victims;
  bool full_victims = false;
};

absl::StatusOr<ExtenderArgs> ParseExtenderArgs(std::string_view body);
absl::StatusOr<BindingArgs> ParseBindingArgs(std::string_view body);
absl::StatusOr<PreemptionArgs> ParsePreemptionArgs(std::string_view body);
// The scheduler's side, for our kube-scheduler stand-in and tests.
absl::StatusOr<FilterResult> ParseFilterResult(std::string_view body);
absl::StatusOr<std::vector<HostPriority>> ParseHostPriorityList(std::string_view body);
absl::StatusOr<std::map<std::string, MetaVictims>> ParsePreemptionResult(std::string_view body);
absl::StatusOr<std::string> ParseBindingResult(std::string_view body);  // its Error

std::string EncodeFilterResult(const FilterResult& r);
std::string EncodeHostPriorityList(const std::vector<HostPriority>& list);
std::string EncodeBindingResult(const std::string& error);
std::string EncodePreemptionResult(const std::map<std::string, MetaVictims>& victims);
// Requests as kube-scheduler encodes them (nodeCacheCapable: node names; else full nodes).
std::string EncodeExtenderArgs(const nlohmann::json& pod, const std::vector<std::string>& node_names);
std::string EncodeExtenderArgsFull(const nlohmann::json& pod, const std::vector<nlohmann::json>& nodes);
std::string EncodeBindingArgs(const BindingArgs& b);
std::string EncodePreemptionArgs(const nlohmann::json& pod, const std::map<std::string, MetaVictims>& victims);

}  // namespace kgpu::extender
