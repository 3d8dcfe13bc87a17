#include "testing/fake_apiserver_fields.h"

#include <initializer_list>

#include "common/strings.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;

// A schema is JSON: null accepts anything below it; an object lists the known fields (each with
// its schema); a one-element array is a list of that schema. Field lists are k8s.io/api v0.32's.
json Fields(std::initializer_list<const char*> names) {
  json o = json::object();
  for (const char* n : names) o[n] = nullptr;
  return o;
}
json ListOf(json item) {
  return json::array({std::move(item)});
}

json Meta() {
  return Fields({"name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
                 "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
                 "ownerReferences", "finalizers", "managedFields"});
}

json Container(bool ephemeral) {
  json c = Fields({"name",
                   "image",
                   "command",
                   "args",
                   "workingDir",
                   "ports",
                   "envFrom",
                   "env",
                   "resources",
                   "resizePolicy",
                   "restartPolicy",
                   "volumeMounts",
                   "volumeDevices",
                   "livenessProbe",
                   "readinessProbe",
                   "startupProbe",
                   "lifecycle",
                   "terminationMessagePath",
                   "terminationMessagePolicy",
                   "imagePullPolicy",
                   "securityContext",
                   "stdin",
                   "stdinOnce",
                   "tty"});
  c["resources"] = Fields({"limits", "requests", "claims"});
  c["env"] = ListOf(Fields({"name", "value", "valueFrom"}));
  c["ports"] = ListOf(Fields({"name", "hostPort", "containerPort", "protocol", "hostIP"}));
  if (ephemeral) c["targetContainerName"] = nullptr;
  return c;
}

json PodSpec() {
  json s = Fields({"volumes",
                   "initContainers",
                   "containers",
                   "ephemeralContainers",
                   "restartPolicy",
                   "terminationGracePeriodSeconds",
                   "activeDeadlineSeconds",
                   "dnsPolicy",
                   "nodeSelector",
                   "serviceAccountName",
                   "serviceAccount",
                   "automountServiceAccountToken",
                   "nodeName",
                   "hostNetwork",
                   "hostPID",
                   "hostIPC",
                   "shareProcessNamespace",
                   "securityContext",
                   "imagePullSecrets",
                   "hostname",
                   "subdomain",
                   "affinity",
                   "schedulerName",
                   "tolerations",
                   "hostAliases",
                   "priorityClassName",
                   "priority",
                   "dnsConfig",
                   "readinessGates",
                   "runtimeClassName",
                   "enableServiceLinks",
                   "preemptionPolicy",
                   "overhead",
                   "topologySpreadConstraints",
                   "setHostnameAsFQDN",
                   "os",
                   "hostUsers",
                   "schedulingGates",
                   "resourceClaims",
                   "resources"});
  s["containers"] = ListOf(Container(false));
  s["initContainers"] = ListOf(Container(false));
  s["ephemeralContainers"] = ListOf(Container(true));
  s["tolerations"] = ListOf(Fields({"key", "operator", "value", "effect", "tolerationSeconds"}));
  return s;
}

json Top(std::initializer_list<std::pair<const char*, json>> rest) {
  json o = Fields({"apiVersion", "kind"});
  o["metadata"] = Meta();
  for (const auto& [k, v] : rest) o[k] = v;
  return o;
}

// resource.k8s.io/v1 (k8s.io/api v0.36, as npm kubernetes-models 5.1.0 has them). Maps keyed by
// the user (attributes, capacity, counters) and opaque parameters are not checked below.
json Selectors() {
  return ListOf({{"cel", Fields({"expression"})}});
}
json Opaque() {
  return Fields({"driver", "parameters"});
}
json Tolerations() {
  return ListOf(Fields({"key", "operator", "value", "effect", "tolerationSeconds"}));
}
json ClaimSpec() {
  json exactly =
      Fields({"deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations", "capacity"});
  exactly["selectors"] = Selectors();
  exactly["tolerations"] = Tolerations();
  exactly["capacity"] = Fields({"requests"});
  json sub = exactly;
  sub.erase("adminAccess");
  sub["name"] = nullptr;
  json request = Fields({"name", "exactly", "firstAvailable"});
  request["exactly"] = exactly;
  request["firstAvailable"] = ListOf(sub);
  json devices = Fields({"requests", "constraints", "config"});
  devices["requests"] = ListOf(request);
  devices["constraints"] = ListOf(Fields({"requests", "matchAttribute", "distinctAttribute"}));
  devices["config"] = ListOf({{"requests", nullptr}, {"opaque", Opaque()}});
  return {{"devices", devices}};
}
void AddResourceSchemas(json& s) {
  json class_spec = Fields({"selectors", "config", "extendedResourceName"});
  class_spec["selectors"] = Selectors();
  class_spec["config"] = ListOf({{"opaque", Opaque()}});
  s["resource.k8s.io/DeviceClass"] = Top({{"spec", class_spec}});

  json device = Fields({"name", "attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector", "allNodes",
                        "taints", "bindsToNode", "bindingConditions", "bindingFailureConditions",
                        "allowMultipleAllocations", "nodeAllocatableResourceMappings"});
  device["consumesCounters"] = ListOf(Fields({"counterSet", "counters"}));
  device["taints"] = ListOf(Fields({"key", "value", "effect", "timeAdded"}));
  json slice_spec = Fields({"driver", "pool", "nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection",
                            "devices", "sharedCounters"});
  slice_spec["pool"] = Fields({"name", "generation", "resourceSliceCount"});
  slice_spec["devices"] = ListOf(device);
  slice_spec["sharedCounters"] = ListOf(Fields({"name", "counters"}));
  s["resource.k8s.io/ResourceSlice"] = Top({{"spec", slice_spec}});

  json result = Fields({"request", "driver", "pool", "device", "adminAccess", "tolerations", "bindingConditions",
                        "bindingFailureConditions", "shareID", "consumedCapacity"});
  result["tolerations"] = Tolerations();
  json allocation = Fields({"devices", "nodeSelector", "allocationTimestamp"});
  allocation["devices"] = {{"results", ListOf(result)},
                           {"config", ListOf({{"source", nullptr}, {"requests", nullptr}, {"opaque", Opaque()}})}};
  json status = Fields({"allocation", "reservedFor", "devices"});
  status["allocation"] = allocation;
  status["reservedFor"] = ListOf(Fields({"apiGroup", "resource", "name", "uid"}));
  status["devices"] = ListOf(Fields({"driver", "pool", "device", "shareID", "conditions", "data", "networkData"}));
  s["resource.k8s.io/ResourceClaim"] = Top({{"spec", ClaimSpec()}, {"status", status}});
  s["resource.k8s.io/ResourceClaimTemplate"] = Top({{"spec", {{"metadata", nullptr}, {"spec", ClaimSpec()}}}});
}

const json& Schema(const std::string& group, const std::string& kind) {
  static const json schemas = [] {
    json s = json::object();
    s["/Pod"] = Top({{"spec", PodSpec()}, {"status", nullptr}});
    json node_spec =
        Fields({"podCIDR", "podCIDRs", "providerID", "unschedulable", "taints", "configSource", "externalID"});
    node_spec["taints"] = ListOf(Fields({"key", "value", "effect", "timeAdded"}));
    s["/Node"] = Top({{"spec", node_spec}, {"status", nullptr}});
    s["/Namespace"] = Top({{"spec", Fields({"finalizers"})}, {"status", nullptr}});
    s["/ConfigMap"] = Top({{"data", nullptr}, {"binaryData", nullptr}, {"immutable", nullptr}});
    json quota_spec = Fields({"hard", "scopes", "scopeSelector"});
    quota_spec["scopeSelector"] = {{"matchExpressions", ListOf(Fields({"scopeName", "operator", "values"}))}};
    s["/ResourceQuota"] = Top({{"spec", quota_spec}, {"status", nullptr}});
    s["/LimitRange"] = Top(
        {{"spec",
          {{"limits", ListOf(Fields({"type", "max", "min", "default", "defaultRequest", "maxLimitRequestRatio"}))}}}});
    s["/Event"] = Top({});
    for (const char* f :
         {"involvedObject", "reason", "message", "source", "firstTimestamp", "lastTimestamp", "count", "type",
          "eventTime", "series", "action", "related", "reportingComponent", "reportingInstance"}) {
      s["/Event"][f] = nullptr;
    }
    s["events.k8s.io/Event"] = Top({});
    for (const char* f : {"eventTime", "series", "reportingController", "reportingInstance", "action", "reason",
                          "regarding", "related", "note", "type", "deprecatedSource", "deprecatedFirstTimestamp",
                          "deprecatedLastTimestamp", "deprecatedCount"}) {
      s["events.k8s.io/Event"][f] = nullptr;
    }
    s["policy/PodDisruptionBudget"] =
        Top({{"spec", Fields({"minAvailable", "selector", "maxUnavailable", "unhealthyPodEvictionPolicy"})},
             {"status", nullptr}});
    s["coordination.k8s.io/Lease"] =
        Top({{"spec", Fields({"holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions",
                              "strategy", "preferredHolder"})}});
    AddResourceSchemas(s);
    return s;
  }();
  static const json any = nullptr;
  const auto it = schemas.find(Cat(group, "/", kind));
  return it == schemas.end() ? any : *it;
}

void Walk(const json& schema, json& value, const std::string& path, const std::string& bare,
          const std::set<std::string>& extra, std::vector<std::string>* unknown) {
  if (schema.is_null()) return;
  if (schema.is_array()) {
    if (!value.is_array()) return;
    for (size_t i = 0; i < value.size(); ++i) Walk(schema[0], value[i], Cat(path, "[", i, "]"), bare, extra, unknown);
    return;
  }
  if (!value.is_object()) return;
  std::vector<std::string> drop;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string p = path.empty() ? it.key() : Cat(path, ".", it.key());
    const std::string b = bare.empty() ? it.key() : Cat(bare, ".", it.key());
    if (const auto f = schema.find(it.key()); f != schema.end()) {
      Walk(*f, it.value(), p, b, extra, unknown);
    } else if (extra.count(b) == 0) {
      unknown->push_back(p);
      drop.push_back(it.key());
    }
  }
  for (const auto& k : drop) value.erase(k);
}

}  // namespace

absl::StatusOr<FieldValidation> ParseFieldValidation(const std::string& value, const std::string& options_kind) {
  if (value.empty() || value == "Warn") return FieldValidation::kWarn;
  if (value == "Ignore") return FieldValidation::kIgnore;
  if (value == "Strict") return FieldValidation::kStrict;
  // validation.ValidateFieldValidation: field.NotSupported over the set {"", Ignore, Warn, Strict}.
  return absl::InvalidArgumentError(
      Cat(options_kind, ".meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: ", json(value).dump(),
          ": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""));
}

std::vector<std::string> PruneUnknownFields(const std::string& group, const std::string& kind, json& obj,
                                            const std::set<std::string>& extra) {
  std::vector<std::string> unknown;
  Walk(Schema(group, kind), obj, "", "", extra, &unknown);
  return unknown;
}

std::string StrictDecodingError(const std::vector<std::string>& unknown) {
  std::vector<std::string> parts;
  for (const auto& u : unknown) parts.push_back(Cat("unknown field ", json(u).dump()));
  return Cat("strict decoding error: ", Join(parts, ", "));
}

std::string GoValue(const json& v) {
  if (v.is_null()) return "<nil>";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) {
    std::vector<std::string> parts;
    for (auto it = v.begin(); it != v.end(); ++it) parts.push_back(Cat(it.key(), ":", GoValue(it.value())));
    return Cat("map[", Join(parts, " "), "]");
  }
  if (v.is_array()) {
    std::vector<std::string> parts;
    for (const auto& e : v) parts.push_back(GoValue(e));
    return Cat("[", Join(parts, " "), "]");
  }
  return v.dump();
}

std::string WarningHeader(const std::string& text) {
  std::string escaped;
  for (char c : text) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return Cat("299 - \"", escaped, "\"");
}

std::optional<std::string> UnsupportedFieldLabel(const std::string& kind, const std::vector<std::string>& fields) {
  static const std::map<std::string, std::set<std::string>> kSupported = {
      // pkg/registry/resource/resourceslice/strategy.go: spec.nodeName, spec.driver (and the
      // pool's name after 1.36, not served here).
      {"ResourceSlice", {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.driver"}},
      {"Pod",
       {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
        "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs",
        "status.nominatedNodeName"}},
      {"Node", {"metadata.name", "spec.unschedulable"}},
      {"Namespace", {"metadata.name", "status.phase"}},
      {"Event",
       {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
        "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
        "reportingComponent", "source", "type", "metadata.namespace", "metadata.name"}},
  };
  const auto it = kSupported.find(kind);
  for (const auto& f : fields) {
    if (it != kSupported.end()) {
      if (!it->second.contains(f)) return "field label not supported: " + f;
    } else if (f != "metadata.name" && f != "metadata.namespace") {
      return nlohmann::json(f).dump() +
             " is not a known field selector: only \"metadata.name\", \"metadata.namespace\"";
    }
  }
  return std::nullopt;
}

nlohmann::json SelectableView(const std::string& kind, const nlohmann::json& obj) {
  nlohmann::json v = obj;
  auto ensure_bool = [&v](const char* parent, const char* field) {
    if (!v.contains(parent) || !v[parent].is_object()) v[parent] = nlohmann::json::object();
    if (!v[parent].contains(field)) v[parent][field] = false;
  };
  if (kind == "Pod") {
    ensure_bool("spec", "hostNetwork");
    if (!v.contains("status") || !v["status"].is_object()) v["status"] = nlohmann::json::object();
    const auto ips = v["status"].value("podIPs", nlohmann::json::array());
    v["status"]["podIP"] =
        ips.is_array() && !ips.empty() && ips[0].is_object() ? ips[0].value("ip", "") : v["status"].value("podIP", "");
    v["status"]["podIPs"] = "";  // accepted by the conversion, absent from the selectable set
  } else if (kind == "Node") {
    ensure_bool("spec", "unschedulable");
  } else if (kind == "Event") {
    std::string component =
        obj.contains("source") && obj["source"].is_object() ? obj["source"].value("component", "") : "";
    if (component.empty()) component = obj.value("reportingComponent", "");
    v["source"] = component;
    v["reportingComponent"] = obj.value("reportingComponent", "");
  }
  return v;
}

}  // namespace kgpu::testing
