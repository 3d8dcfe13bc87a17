#include "testing/fake_apiserver_tables.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <set>

#include "common/strings.h"
#include "k8s/resources.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;

std::string Since(const std::string& rfc3339) {
  const auto t = k8s::ParseRfc3339(rfc3339);
  if (!t) return "<unknown>";
  return HumanAge(static_cast<double>(std::time(nullptr)) - *t);
}

std::string Age(const json& obj) {
  return Since(obj["metadata"].value("creationTimestamp", ""));
}

json Col(const std::string& name, const std::string& description, int priority = 0, const std::string& format = "",
         const std::string& type = "string") {
  return {{"name", name}, {"type", type}, {"format", format}, {"description", description}, {"priority", priority}};
}

const char* kNameDoc =
    "Name must be unique within a namespace. Is required when creating resources, although some resources may allow "
    "a client to request the generation of an appropriate name automatically.";
const char* kAgeDoc = "CreationTimestamp is a timestamp representing the server time when this object was created.";

json Columns(const std::string& kind) {
  if (kind == "Node") {
    return {
        Col("Name", kNameDoc, 0, "name"),
        Col("Status", "The status of the node"),
        Col("Roles", "The roles of the node"),
        Col("Age", kAgeDoc),
        Col("Version", "Kubelet Version reported by the node."),
        Col("Internal-IP", "List of addresses reachable to the node. Queried from cloud provider, if available.", 1),
        Col("External-IP", "List of addresses reachable to the node. Queried from cloud provider, if available.", 1),
        Col("OS-Image", "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).", 1),
        Col("Kernel-Version", "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).", 1),
        Col("Container-Runtime", "Container runtime version reported by the node through runtime remote API.", 1)};
  }
  if (kind == "Pod") {
    return {Col("Name", kNameDoc, 0, "name"),
            Col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
            Col("Status", "The aggregate status of the containers in this pod."),
            Col("Restarts",
                "The number of times the containers in this pod have been restarted and when the last container in "
                "this pod has restarted."),
            Col("Age", kAgeDoc),
            Col("IP", "podIP address allocated to the pod. Routable at least within the cluster.", 1),
            Col("Node", "NodeName is a request to schedule this pod onto a specific node.", 1),
            Col("Nominated Node",
                "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be "
                "scheduled right away as preemption victims receive their graceful termination periods.",
                1),
            Col("Readiness Gates",
                "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its "
                "containers are ready AND all conditions specified in the readiness gates have status equal to "
                "\"True\"",
                1)};
  }
  if (kind == "Event") {
    return {Col("Last Seen", "The last time this event was seen"),
            Col("Type", "Type of this event (Normal, Warning), new types could be added in the future."),
            Col("Reason", "The reason this event was generated"),
            Col("Object", "The object that this event is about"),
            Col("Subobject", "The subobject (fieldPath) that this event is about", 1),
            Col("Source", "The component reporting this event", 1),
            Col("Message", "A human-readable description of the status of this operation."),
            Col("First Seen", "The first time this event was seen", 1),
            Col("Count", "The number of times this event has occurred", 1),
            Col("Name", kNameDoc, 1, "name")};
  }
  if (kind == "Namespace") {
    return {Col("Name", kNameDoc, 0, "name"), Col("Status", "The status of the namespace"), Col("Age", kAgeDoc)};
  }
  if (kind == "ResourceQuota") {
    return {Col("Name", kNameDoc, 0, "name"), Col("Age", kAgeDoc),
            Col("Request", "Request represents a minimum amount of cpu/memory that a container may consume."),
            Col("Limit",
                "Limits control the maximum amount of cpu/memory that a container may use independent of contention on "
                "the node.")};
  }
  if (kind == "PodDisruptionBudget") {
    return {
        Col("Name", kNameDoc, 0, "name"), Col("Min Available", "The minimum number of pods that must be available."),
        Col("Max Unavailable", "The maximum number of pods that may be unavailable."),
        Col("Allowed Disruptions", "Calculated number of pods that may be disrupted at this time.", 0, "", "integer"),
        Col("Age", kAgeDoc)};
  }
  if (kind == "Lease") {
    return {Col("Name", kNameDoc, 0, "name"), Col("Holder", "The holder of the lease"), Col("Age", kAgeDoc)};
  }
  // pkg/printers/internalversion/printers.go (resource.k8s.io).
  if (kind == "ResourceClaim") {
    return {Col("Name", kNameDoc, 0, "name"),
            Col("State", "A summary of the current state (allocated, pending, reserved, etc.)."), Col("Age", kAgeDoc)};
  }
  if (kind == "ResourceSlice") {
    return {Col("Name", kNameDoc, 0, "name"), Col("Node", "The node providing the resources."),
            Col("Driver", "The driver providing the resources."), Col("Pool", "The pool containing the resources."),
            Col("Age", kAgeDoc)};
  }
  return {Col("Name", kNameDoc, 0, "name"), Col("Age", kAgeDoc)};
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

json NodeCells(const json& o, const std::string& name) {
  const json status = o.value("status", json::object());
  std::string ready = "Unknown";
  for (const auto& c : status.value("conditions", json::array())) {
    if (c.value("type", "") == "Ready") ready = c.value("status", "") == "True" ? "Ready" : "NotReady";
  }
  if (o.contains("spec") && o["spec"].value("unschedulable", false)) ready += ",SchedulingDisabled";
  // findNodeRoles: node-role.kubernetes.io/<role> labels and the value of kubernetes.io/role.
  std::set<std::string> roles;
  const json labels = o["metadata"].value("labels", json::object());
  for (auto it = labels.begin(); it != labels.end(); ++it) {
    if (it.key().rfind("node-role.kubernetes.io/", 0) == 0 && it.key().size() > 24) roles.insert(it.key().substr(24));
    if (it.key() == "kubernetes.io/role" && it->is_string() && !it->get<std::string>().empty())
      roles.insert(it->get<std::string>());
  }
  auto address = [&status](const char* type) -> std::string {
    for (const auto& a : status.value("addresses", json::array())) {
      if (a.value("type", "") == type) return a.value("address", "");
    }
    return "<none>";
  };
  const json info = status.value("nodeInfo", json::object());
  auto or_unknown = [](const std::string& v) { return v.empty() ? std::string("<unknown>") : v; };
  return {name,
          ready,
          roles.empty() ? "<none>" : Join(std::vector<std::string>(roles.begin(), roles.end()), ","),
          Age(o),
          info.value("kubeletVersion", ""),
          address("InternalIP"),
          address("ExternalIP"),
          or_unknown(info.value("osImage", "")),
          or_unknown(info.value("kernelVersion", "")),
          or_unknown(info.value("containerRuntimeVersion", ""))};
}

json PodCells(const json& o, const std::string& name) {
  const json status = o.value("status", json::object());
  const json spec = o.value("spec", json::object());
  const size_t total = spec.value("containers", json::array()).size();
  size_t ready = 0;
  int64_t restarts = 0;
  // printPod: the reason, else the phase; then the containers' waiting or terminated reasons
  // (the first container's wins), Terminating for a pod being deleted that is not terminal.
  std::string phase = status.value("phase", "");
  std::string reason = status.value("reason", phase);
  bool initializing = false;
  const auto init = status.value("initContainerStatuses", json::array());
  for (size_t i = 0; i < init.size(); ++i) {
    const json st = init[i].value("state", json::object());
    restarts += init[i].value("restartCount", 0);
    if (st.contains("terminated") && st["terminated"].value("exitCode", 0) == 0) continue;
    if (st.contains("terminated")) {
      const json t = st["terminated"];
      reason = !t.value("reason", "").empty() ? Cat("Init:", t.value("reason", ""))
               : t.value("signal", 0) != 0    ? Cat("Init:Signal:", t.value("signal", 0))
                                              : Cat("Init:ExitCode:", t.value("exitCode", 0));
    } else if (st.contains("waiting") && !st["waiting"].value("reason", "").empty() &&
               st["waiting"].value("reason", "") != "PodInitializing") {
      reason = Cat("Init:", st["waiting"].value("reason", ""));
    } else {
      reason = Cat("Init:", i, "/", spec.value("initContainers", json::array()).size());
    }
    initializing = true;
    break;
  }
  if (!initializing) {
    restarts = 0;
    bool has_running = false;
    const auto cs = status.value("containerStatuses", json::array());
    for (size_t k = cs.size(); k-- > 0;) {
      const json& c = cs[k];
      restarts += c.value("restartCount", 0);
      const json st = c.value("state", json::object());
      if (st.contains("waiting") && !st["waiting"].value("reason", "").empty()) {
        reason = st["waiting"].value("reason", "");
      } else if (st.contains("terminated")) {
        const json t = st["terminated"];
        reason = !t.value("reason", "").empty() ? t.value("reason", "")
                 : t.value("signal", 0) != 0    ? Cat("Signal:", t.value("signal", 0))
                                                : Cat("ExitCode:", t.value("exitCode", 0));
      } else if (c.value("ready", false) && st.contains("running")) {
        has_running = true;
        ++ready;
      }
    }
    if (reason == "Completed" && has_running) {
      bool pod_ready = false;
      for (const auto& c : status.value("conditions", json::array())) {
        if (c.value("type", "") == "Ready" && c.value("status", "") == "True") pod_ready = true;
      }
      reason = pod_ready ? "Running" : "NotReady";
    }
  }
  if (o["metadata"].contains("deletionTimestamp")) {
    if (status.value("reason", "") == "NodeLost") {
      reason = "Unknown";
    } else if (phase != "Succeeded" && phase != "Failed") {
      reason = "Terminating";
    }
  }
  const auto ips = status.value("podIPs", json::array());
  std::string ip = ips.is_array() && !ips.empty() ? ips[0].value("ip", "") : status.value("podIP", "");
  auto or_none = [](const std::string& v) { return v.empty() ? std::string("<none>") : v; };
  std::string gates = "<none>";
  if (const auto rg = spec.value("readinessGates", json::array()); !rg.empty()) {
    size_t true_count = 0;
    for (const auto& g : rg) {
      for (const auto& c : status.value("conditions", json::array())) {
        if (c.value("type", "") == g.value("conditionType", "") && c.value("status", "") == "True") ++true_count;
      }
    }
    gates = Cat(true_count, "/", rg.size());
  }
  return {name,
          Cat(ready, "/", total),
          reason,
          std::to_string(restarts),
          Age(o),
          or_none(ip),
          or_none(spec.value("nodeName", "")),
          or_none(status.value("nominatedNodeName", "")),
          gates};
}

// printEvent (core Events and events.k8s.io Events share the internal type).
json EventCells(const json& o, const std::string& name) {
  const bool v1 = o.contains("involvedObject");  // core/v1; events.k8s.io/v1 names it `regarding`
  const json regarding = o.value(v1 ? "involvedObject" : "regarding", json::object());
  const std::string first_ts = o.value(v1 ? "firstTimestamp" : "deprecatedFirstTimestamp", json()).is_string()
                                   ? o.value(v1 ? "firstTimestamp" : "deprecatedFirstTimestamp", "")
                                   : "";
  const std::string last_ts = o.value(v1 ? "lastTimestamp" : "deprecatedLastTimestamp", json()).is_string()
                                  ? o.value(v1 ? "lastTimestamp" : "deprecatedLastTimestamp", "")
                                  : "";
  const std::string event_time = o.value("eventTime", json()).is_string() ? o.value("eventTime", "") : "";
  std::string first = !first_ts.empty() ? Since(first_ts) : Since(event_time);
  std::string last = !last_ts.empty() ? Since(last_ts) : first;
  int64_t count = o.value(v1 ? "count" : "deprecatedCount", int64_t{0});
  if (const json series = o.value("series", json()); series.is_object()) {
    last = Since(series.value("lastObservedTime", ""));
    count = series.value("count", int64_t{0});
  } else if (count == 0) {
    count = 1;
  }
  const std::string kind = regarding.value("kind", "");
  const std::string rname = regarding.value("name", "");
  const std::string object = rname.empty() ? Lower(kind) : Cat(Lower(kind), "/", rname);
  const json source = o.value(v1 ? "source" : "deprecatedSource", json::object());
  std::string component = source.value("component", "");
  if (component.empty()) component = o.value(v1 ? "reportingComponent" : "reportingController", "");
  std::string host = source.value("host", "");
  if (host.empty()) host = o.value("reportingInstance", "");
  const std::string src = host.empty() ? component : Cat(component, ", ", host);
  std::string message = o.value(v1 ? "message" : "note", "");
  message.erase(0, message.find_first_not_of(" \t\n"));
  message.erase(message.find_last_not_of(" \t\n") + 1);
  return {last,
          o.value("type", ""),
          o.value("reason", ""),
          object,
          regarding.value("fieldPath", ""),
          src,
          message,
          first,
          count,
          name};
}

json Cells(const json& o) {
  const std::string kind = o.value("kind", "");
  const std::string name = o["metadata"].value("name", "");
  const json status = o.value("status", json::object());
  if (kind == "Node") return NodeCells(o, name);
  if (kind == "Pod") return PodCells(o, name);
  if (kind == "Event") return EventCells(o, name);
  if (kind == "Namespace") return {name, status.value("phase", "Active"), Age(o)};
  if (kind == "ResourceQuota") {
    std::vector<std::string> req, lim;
    const json hard = status.value("hard", json::object());
    const json used = status.value("used", json::object());
    for (auto it = hard.begin(); it != hard.end(); ++it) {
      const std::string cell = Cat(it.key(), ": ", used.value(it.key(), "0"), "/", it->get<std::string>());
      (it.key().rfind("limits.", 0) == 0 ? lim : req).push_back(cell);
    }
    return {name, Age(o), Join(req, ", "), Join(lim, ", ")};
  }
  if (kind == "PodDisruptionBudget") {
    const json spec = o.value("spec", json::object());
    auto v = [](const json& s, const char* k) {
      return s.contains(k) ? (s[k].is_string() ? s[k].get<std::string>() : s[k].dump()) : "N/A";
    };
    return {name, v(spec, "minAvailable"), v(spec, "maxUnavailable"), status.value("disruptionsAllowed", 0), Age(o)};
  }
  if (kind == "Lease") return {name, o.value("spec", json::object()).value("holderIdentity", ""), Age(o)};
  if (kind == "ResourceClaim") {
    // printResourceClaim's resourceClaimState: deleted, pending or allocated (+ reserved).
    std::vector<std::string> state;
    if (o["metadata"].contains("deletionTimestamp")) state.push_back("deleted");
    if (!status.contains("allocation")) {
      if (state.empty()) state.push_back("pending");
    } else {
      state.push_back("allocated");
      if (!status.value("reservedFor", json::array()).empty()) state.push_back("reserved");
    }
    return {name, Join(state, ","), Age(o)};
  }
  if (kind == "ResourceSlice") {
    const json spec = o.value("spec", json::object());
    return {name, spec.value("nodeName", ""), spec.value("driver", ""),
            spec.value("pool", json::object()).value("name", ""), Age(o)};
  }
  return {name, Age(o)};
}

}  // namespace

std::string HumanAge(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  if (s < -1) return "<invalid>";
  if (s < 0) return "0s";
  if (s < 120) return Cat(s, "s");
  const int64_t m = s / 60;
  if (m < 10) return Cat(m, "m", s % 60 == 0 ? "" : Cat(s % 60, "s"));
  if (m < 180) return Cat(m, "m");
  const int64_t h = m / 60;
  if (h < 8) return Cat(h, "h", m % 60 == 0 ? "" : Cat(m % 60, "m"));
  if (h < 48) return Cat(h, "h");
  const int64_t d = h / 24;
  if (d < 8) return Cat(d, "d", h % 24 == 0 ? "" : Cat(h % 24, "h"));
  if (h < 24 * 365 * 2) return Cat(d, "d");
  const int64_t y = d / 365;
  if (h < 24 * 365 * 8) return Cat(y, "y", d % 365 == 0 ? "" : Cat(d % 365, "d"));
  return Cat(y, "y");
}

json TableOf(const std::string& kind, const std::vector<json>& items, const std::string& rv) {
  json t = {{"kind", "Table"},
            {"apiVersion", "meta.k8s.io/v1"},
            {"metadata", {{"resourceVersion", rv}}},
            {"columnDefinitions", Columns(kind)},
            {"rows", json::array()}};
  for (const auto& o : items) {
    json row = {{"cells", Cells(o)}, {"object", o}};
    // printPod marks a finished pod's row Completed (kubectl hides such rows unless -a).
    if (kind == "Pod" && o.contains("status")) {
      const std::string phase = o["status"].value("phase", "");
      if (phase == "Succeeded" || phase == "Failed") {
        row["conditions"] = {{{"type", "Completed"},
                              {"status", "True"},
                              {"reason", phase},
                              {"message", "The pod has completed successfully."}}};
      }
    }
    t["rows"].push_back(std::move(row));
  }
  return t;
}

}  // namespace kgpu::testing
