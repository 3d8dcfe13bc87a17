#pragma once
// What kube-apiserver adds to the objects it stores, which clients read back (1.32):
//  - pod defaults (pkg/apis/core/v1/defaults.go SetDefaults_PodSpec, SetDefaults_Pod,
//    SetDefaults_Container): restartPolicy Always, dnsPolicy ClusterFirst, securityContext {},
//    schedulerName default-scheduler, terminationGracePeriodSeconds 30, enableServiceLinks true;
//    per container imagePullPolicy (Always for :latest or no tag, else IfNotPresent),
//    terminationMessagePath /dev/termination-log, terminationMessagePolicy File, ports' protocol
//    TCP. Applied to create and update bodies alike (they are decoded with defaults);
//  - pod admission on create: Priority (priority 0 and preemptionPolicy PreemptLowerPriority with
//    no class; the system classes' values), DefaultTolerationSeconds (not-ready and unreachable,
//    NoExecute, 300 s), ServiceAccount (serviceAccountName/serviceAccount "default"; the token
//    volume is not added), and status.qosClass (pkg/apis/core/helper/qos ComputePodQOS);
//  - node taints: TaintNodesByCondition admission puts node.kubernetes.io/not-ready:NoSchedule
//    on a new Node; the node lifecycle controller's NoSchedule pass (doNoScheduleTaintingPass)
//    keeps the condition taints (not-ready, unreachable, memory/disk/pid-pressure,
//    network-unavailable) and node.kubernetes.io/unschedulable in line with the node's status;
//  - quantities in their canonical form (resource.Quantity decodes every quantity field and
//    encodes it back canonical: "8000" -> "8k", cpu 1.5 -> "1500m", a JSON number as a string):
//    pods' container requests and limits and overhead, nodes' capacity and allocatable,
//    ResourceQuotas' hard and used, LimitRanges' limits. A value that is not a quantity is left
//    for validation to refuse;
//  - metadata.managedFields for the Update operations of every write (manager, operation,
//    apiVersion, time, fieldsType FieldsV1, fieldsV1; subresource "status" for status writes):
//    the writer owns the fields it changed, taken from other managers; removed fields are owned
//    by no one. Lists of objects are keyed as the API's list-map keys are (name, type,
//    containerPort+protocol, mountPath); other lists are atomic.
//
// Thread-safety: pure functions (the times read the clock).

#include <string>

#include <nlohmann/json.hpp>

namespace kgpu::testing {

void DefaultPod(nlohmann::json& pod);
void AdmitNewPod(nlohmann::json& pod);
std::string PodQosClass(const nlohmann::json& pod);

// Every quantity field of a `kind` object (see above) in its canonical form.
void CanonicalQuantities(const std::string& kind, nlohmann::json& obj);

void TaintNewNode(nlohmann::json& node);
// The lifecycle controller's pass over a node as it now is; true when it changed the taints.
bool SyncNodeTaints(nlohmann::json& node);

// `manager`: the fieldManager parameter, else the User-Agent up to its first '/'. `old` is null
// on create. `subresource` is "" or "status"; `status_is_subresource` whether the kind's main
// resource leaves status alone.
void UpdateManagedFields(const nlohmann::json* old, nlohmann::json& obj, const std::string& manager,
                         const std::string& subresource, bool status_is_subresource);

}  // namespace kgpu::testing
