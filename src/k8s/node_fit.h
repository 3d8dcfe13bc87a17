#pragma once
// Whether a pod's own constraints let it run on a node, as kube-scheduler's in-tree filter plugins
// decide them (pkg/scheduler/framework/plugins): NodeUnschedulable (spec.unschedulable, unless the
// pod tolerates node.kubernetes.io/unschedulable:NoSchedule), NodeAffinity (spec.nodeSelector and
// requiredDuringSchedulingIgnoredDuringExecution: terms ORed, each term's matchExpressions and
// matchFields ANDed, operators In, NotIn, Exists, DoesNotExist, Gt, Lt; matchFields on
// metadata.name) and TaintToleration (every NoSchedule and NoExecute taint tolerated), plus the
// node's Ready condition (kube-scheduler relies on the not-ready taint the node lifecycle
// controller sets; a binder checks the condition too, as that taint would, in case the controller
// has not tainted the node yet).
//
// The extender's bind checks these before it writes a binding: only kube-scheduler, which ran
// these filters, should ask it to bind, and a caller that did not cannot place a pod where its
// own spec forbids.
//
// Thread-safety: pure functions.

#include <string>

#include <nlohmann/json.hpp>

namespace kgpu::k8s {

// Whether one of the pod's `tolerations` (spec.tolerations) tolerates `taint` (v1.Toleration's
// ToleratesTaint: effect empty or equal; key empty with Exists matches every key; Exists ignores
// the value; Equal, the default, compares it).
bool Tolerates(const nlohmann::json& tolerations, const nlohmann::json& taint);

// "" when `pod` may run on `node`; otherwise why not, in kube-scheduler's words ("node(s) didn't
// match Pod's node affinity/selector", "node(s) had untolerated taint {key: value}", "node(s) were
// unschedulable") or "node(s) were not ready (Ready is False)".
std::string NodeRefusesPod(const nlohmann::json& pod, const nlohmann::json& node);

}  // namespace kgpu::k8s
