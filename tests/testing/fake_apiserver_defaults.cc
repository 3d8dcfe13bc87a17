#include "testing/fake_apiserver_defaults.h"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "common/strings.h"
#include "k8s/quantity.h"
#include "k8s/resources.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;

void Default(json& obj, const char* key, const json& value) {
  if (!obj.contains(key) || obj[key].is_null()) obj[key] = value;
}

// parsers.ParseImageName: no tag (and no digest) is "latest".
std::string PullPolicy(const std::string& image) {
  if (image.find('@') != std::string::npos) return "IfNotPresent";
  const auto slash = image.rfind('/');
  const auto colon = image.rfind(':');
  const bool tagged = colon != std::string::npos && (slash == std::string::npos || colon > slash);
  const std::string tag = tagged ? image.substr(colon + 1) : "latest";
  return tag == "latest" ? "Always" : "IfNotPresent";
}

bool Tolerates(const json& tolerations, const std::string& key) {
  for (const auto& t : tolerations) {
    if (!t.is_object()) continue;
    const std::string effect = t.value("effect", "");
    if (effect != "" && effect != "NoExecute") continue;
    const std::string op = t.value("operator", "Equal");
    if (t.value("key", "") == key || (t.value("key", "").empty() && op == "Exists")) return true;
  }
  return false;
}

}  // namespace

void DefaultPod(json& pod) {
  if (!pod.contains("spec") || !pod["spec"].is_object()) return;
  json& spec = pod["spec"];
  Default(spec, "restartPolicy", "Always");
  Default(spec, "dnsPolicy", "ClusterFirst");
  Default(spec, "securityContext", json::object());
  Default(spec, "schedulerName", "default-scheduler");
  Default(spec, "terminationGracePeriodSeconds", 30);
  Default(spec, "enableServiceLinks", true);
  for (const char* list : {"initContainers", "containers", "ephemeralContainers"}) {
    if (!spec.contains(list) || !spec[list].is_array()) continue;
    for (auto& c : spec[list]) {
      if (!c.is_object()) continue;
      Default(c, "imagePullPolicy", PullPolicy(c.value("image", "")));
      Default(c, "terminationMessagePath", "/dev/termination-log");
      Default(c, "terminationMessagePolicy", "File");
      if (!c.contains("resources")) c["resources"] = json::object();
      if (c.contains("ports") && c["ports"].is_array()) {
        for (auto& p : c["ports"]) {
          if (p.is_object()) Default(p, "protocol", "TCP");
        }
      }
    }
  }
}

void AdmitNewPod(json& pod) {
  json& spec = pod["spec"];
  // Priority admission: the class's value; no class (and no globalDefault class, which the
  // stand-in does not serve) is 0. A class the stand-in cannot resolve is left without a value.
  static const std::map<std::string, int64_t> kSystemClasses = {{"system-cluster-critical", 2000000000},
                                                                {"system-node-critical", 2000001000}};
  const std::string cls = spec.value("priorityClassName", "");
  if (cls.empty()) {
    Default(spec, "priority", 0);
  } else if (auto it = kSystemClasses.find(cls); it != kSystemClasses.end()) {
    Default(spec, "priority", it->second);
  }
  Default(spec, "preemptionPolicy", "PreemptLowerPriority");
  // DefaultTolerationSeconds.
  if (!spec.contains("tolerations") || !spec["tolerations"].is_array()) spec["tolerations"] = json::array();
  for (const char* key : {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}) {
    if (!Tolerates(spec["tolerations"], key)) {
      spec["tolerations"].push_back(
          {{"key", key}, {"operator", "Exists"}, {"effect", "NoExecute"}, {"tolerationSeconds", 300}});
    }
  }
  // ServiceAccount admission (the name only; the stand-in serves no ServiceAccounts or tokens).
  Default(spec, "serviceAccountName", spec.value("serviceAccount", "default"));
  spec["serviceAccount"] = spec["serviceAccountName"];
  pod["status"]["qosClass"] = PodQosClass(pod);
}

std::string PodQosClass(const json& pod) {
  using k8s::Quantity;
  std::map<std::string, Quantity> requests, limits;
  bool all_limited = true;
  const json spec = pod.value("spec", json::object());
  for (const char* list : {"containers", "initContainers"}) {
    for (const auto& c : spec.value(list, json::array())) {
      const json res = c.value("resources", json::object());
      std::set<std::string> limited;
      for (const char* kind : {"requests", "limits"}) {
        const json m = res.value(kind, json::object());
        for (auto it = m.begin(); it != m.end(); ++it) {
          if (it.key() != "cpu" && it.key() != "memory") continue;
          const auto q = Quantity::Parse(it->is_string() ? it->get<std::string>() : it->dump());
          if (!q || !(Quantity{0, false} < *q)) continue;
          auto& sum = std::string(kind) == "requests" ? requests : limits;
          auto [pos, fresh] = sum.try_emplace(it.key(), *q);
          if (!fresh) pos->second = pos->second + *q;
          if (std::string(kind) == "limits") limited.insert(it.key());
        }
      }
      if (limited.size() != 2) all_limited = false;
    }
  }
  if (requests.empty() && limits.empty()) return "BestEffort";
  if (all_limited && requests.size() == limits.size()) {
    bool equal = true;
    for (const auto& [k, v] : requests) {
      auto l = limits.find(k);
      if (l == limits.end() || v != l->second) equal = false;
    }
    if (equal) return "Guaranteed";
  }
  return "Burstable";
}

namespace {

// Each value of a ResourceList (map of name -> quantity) canonical; a JSON number is a quantity
// too (resource.Quantity's UnmarshalJSON reads one unquoted).
void CanonicalList(json& list) {
  if (!list.is_object()) return;
  for (auto it = list.begin(); it != list.end(); ++it) {
    std::optional<k8s::Quantity> q;
    if (it->is_string()) {
      q = k8s::Quantity::Parse(it->get<std::string>());
    } else if (it->is_number()) {
      q = k8s::Quantity::Parse(it->dump());
    }
    if (q) *it = q->Canonical();
  }
}

json* At(json& obj, std::initializer_list<const char*> path) {
  json* j = &obj;
  for (const char* k : path) {
    if (!j->is_object() || !j->contains(k)) return nullptr;
    j = &(*j)[k];
  }
  return j;
}

}  // namespace

void CanonicalQuantities(const std::string& kind, json& obj) {
  auto list = [&](std::initializer_list<const char*> path) {
    if (json* j = At(obj, path)) CanonicalList(*j);
  };
  if (kind == "Pod") {
    for (const char* section : {"containers", "initContainers"}) {
      json* cs = At(obj, {"spec", section});
      if (cs == nullptr || !cs->is_array()) continue;
      for (auto& c : *cs) {
        for (const char* which : {"requests", "limits"}) {
          if (json* j = At(c, {"resources", which})) CanonicalList(*j);
        }
      }
    }
    list({"spec", "overhead"});
  } else if (kind == "Node") {
    list({"status", "capacity"});
    list({"status", "allocatable"});
  } else if (kind == "ResourceQuota") {
    list({"spec", "hard"});
    list({"status", "hard"});
    list({"status", "used"});
  } else if (kind == "LimitRange") {
    json* limits = At(obj, {"spec", "limits"});
    if (limits == nullptr || !limits->is_array()) return;
    for (auto& l : *limits) {
      for (const char* f : {"max", "min", "default", "defaultRequest", "maxLimitRequestRatio"}) {
        if (json* j = At(l, {f})) CanonicalList(*j);
      }
    }
  }
}

void TaintNewNode(json& node) {
  if (!node.contains("spec") || !node["spec"].is_object()) node["spec"] = json::object();
  json& taints = node["spec"]["taints"];
  if (!taints.is_array()) taints = json::array();
  for (const auto& t : taints) {
    if (t.value("key", "") == "node.kubernetes.io/not-ready" && t.value("effect", "") == "NoSchedule") return;
  }
  taints.push_back({{"key", "node.kubernetes.io/not-ready"}, {"effect", "NoSchedule"}});
}

bool SyncNodeTaints(json& node) {
  const json status = node.value("status", json::object());
  std::map<std::string, std::string> cond;
  for (const auto& c : status.value("conditions", json::array())) cond[c.value("type", "")] = c.value("status", "");
  // The taints this pass manages, and which of them the node should carry now. A node that has
  // not posted a Ready condition yet keeps what it has.
  const std::vector<std::string> managed = {
      "node.kubernetes.io/not-ready",     "node.kubernetes.io/unreachable",  "node.kubernetes.io/memory-pressure",
      "node.kubernetes.io/disk-pressure", "node.kubernetes.io/pid-pressure", "node.kubernetes.io/network-unavailable",
      "node.kubernetes.io/unschedulable"};
  std::set<std::string> want;
  const bool has_ready = cond.contains("Ready");
  if (has_ready && cond["Ready"] == "False") want.insert("node.kubernetes.io/not-ready");
  if (has_ready && cond["Ready"] == "Unknown") want.insert("node.kubernetes.io/unreachable");
  if (cond["MemoryPressure"] == "True") want.insert("node.kubernetes.io/memory-pressure");
  if (cond["DiskPressure"] == "True") want.insert("node.kubernetes.io/disk-pressure");
  if (cond["PIDPressure"] == "True") want.insert("node.kubernetes.io/pid-pressure");
  if (cond["NetworkUnavailable"] == "True") want.insert("node.kubernetes.io/network-unavailable");
  const json spec = node.value("spec", json::object());
  if (spec.value("unschedulable", false)) want.insert("node.kubernetes.io/unschedulable");
  json kept = json::array();
  std::set<std::string> have;
  for (const auto& t : spec.value("taints", json::array())) {
    const std::string key = t.value("key", "");
    const bool ours =
        t.value("effect", "") == "NoSchedule" && std::find(managed.begin(), managed.end(), key) != managed.end();
    if (ours && !has_ready && key == "node.kubernetes.io/not-ready") {
      kept.push_back(t);  // the admission's taint on a node that has not reported yet
      have.insert(key);
      continue;
    }
    if (ours && !want.contains(key)) continue;
    if (ours) have.insert(key);
    kept.push_back(t);
  }
  for (const auto& key : managed) {
    if (want.contains(key) && !have.contains(key)) kept.push_back({{"key", key}, {"effect", "NoSchedule"}});
  }
  const json before = spec.value("taints", json::array());
  if (kept == before) return false;
  if (kept.empty()) {
    node["spec"].erase("taints");
  } else {
    node["spec"]["taints"] = kept;
  }
  return true;
}

namespace {

constexpr char kSep = '\x1f';

// The key of a list element as the API's list-map keys name it, or "" for an atomic list.
std::string ElementKey(const json& e) {
  if (!e.is_object()) return "";
  if (e.contains("containerPort")) {
    return Cat("k:", json({{"containerPort", e["containerPort"]}, {"protocol", e.value("protocol", "TCP")}}).dump());
  }
  for (const char* k : {"name", "type", "mountPath", "devicePath"}) {
    if (e.contains(k) && e[k].is_string()) return Cat("k:", json({{k, e[k]}}).dump());
  }
  return "";
}

// Leaf paths of `v` under `prefix` with their values (list elements keyed get a "." marker).
void Flatten(const json& v, const std::string& prefix, std::map<std::string, json>& out) {
  if (v.is_object() && !v.empty()) {
    for (auto it = v.begin(); it != v.end(); ++it) Flatten(*it, Cat(prefix, kSep, "f:", it.key()), out);
    return;
  }
  if (v.is_array() && !v.empty()) {
    bool keyed = true;
    for (const auto& e : v) keyed = keyed && !ElementKey(e).empty();
    if (keyed) {
      for (const auto& e : v) {
        const std::string p = Cat(prefix, kSep, ElementKey(e));
        out[Cat(p, kSep, ".")] = nullptr;
        Flatten(e, p, out);
      }
      return;
    }
  }
  out[prefix] = v;
}

std::map<std::string, json> Fields(const json& obj, const std::string& only, const std::string& except) {
  std::map<std::string, json> out;
  static const std::set<std::string> kSkipMeta = {"managedFields",
                                                  "resourceVersion",
                                                  "uid",
                                                  "creationTimestamp",
                                                  "generation",
                                                  "selfLink",
                                                  "deletionTimestamp",
                                                  "deletionGracePeriodSeconds",
                                                  "name",
                                                  "namespace"};
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string k = it.key();
    if (k == "apiVersion" || k == "kind") continue;
    if (!only.empty() && k != only) continue;
    if (k == except) continue;
    if (k == "metadata" && it->is_object()) {
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!kSkipMeta.contains(m.key())) Flatten(*m, Cat("f:metadata", kSep, "f:", m.key()), out);
      }
      continue;
    }
    Flatten(*it, Cat("f:", k), out);
  }
  return out;
}

json Tree(const std::set<std::string>& paths) {
  json t = json::object();
  for (const auto& p : paths) {
    json* cur = &t;
    size_t start = 0;
    for (;;) {
      const size_t end = p.find(kSep, start);
      cur = &(*cur)[p.substr(start, end == std::string::npos ? std::string::npos : end - start)];
      if (end == std::string::npos) break;
      start = end + 1;
    }
    if (cur->is_null()) *cur = json::object();
  }
  return t;
}

void Paths(const json& tree, const std::string& prefix, std::set<std::string>& out) {
  if (!tree.is_object() || tree.empty()) {
    if (!prefix.empty()) out.insert(prefix);
    return;
  }
  for (auto it = tree.begin(); it != tree.end(); ++it)
    Paths(*it, prefix.empty() ? it.key() : Cat(prefix, kSep, it.key()), out);
}

}  // namespace

void UpdateManagedFields(const json* old, json& obj, const std::string& manager, const std::string& subresource,
                         bool status_is_subresource) {
  const std::string only = subresource == "status" ? "status" : "";
  const std::string except = subresource.empty() && status_is_subresource ? "status" : "";
  const auto before = old ? Fields(*old, only, except) : std::map<std::string, json>{};
  const auto after = Fields(obj, only, except);
  std::set<std::string> changed, removed;
  for (const auto& [p, v] : after) {
    auto b = before.find(p);
    if (b == before.end() || b->second != v) changed.insert(p);
  }
  for (const auto& [p, v] : before) {
    if (!after.contains(p)) removed.insert(p);
  }
  json entries =
      old && (*old)["metadata"].contains("managedFields") ? (*old)["metadata"]["managedFields"] : json::array();
  if (changed.empty() && removed.empty()) {
    if (!entries.empty()) obj["metadata"]["managedFields"] = entries;
    return;
  }
  const std::string api_version = obj.value("apiVersion", "v1");
  json out = json::array();
  std::set<std::string> mine;
  for (const auto& e : entries) {
    std::set<std::string> owned;
    Paths(e.value("fieldsV1", json::object()), "", owned);
    const bool is_mine = e.value("manager", "") == manager && e.value("operation", "") == "Update" &&
                         e.value("subresource", "") == subresource;
    for (const auto& p : changed) owned.erase(p);
    for (const auto& p : removed) owned.erase(p);
    // A list element's "." stays only while some field of the element is still owned, or the
    // element itself was not touched.
    if (is_mine) {
      mine = owned;
      continue;
    }
    if (owned.empty()) continue;
    json kept = e;
    kept["fieldsV1"] = Tree(owned);
    out.push_back(kept);
  }
  mine.insert(changed.begin(), changed.end());
  if (!mine.empty()) {
    json entry = {{"manager", manager},        {"operation", "Update"},    {"apiVersion", api_version},
                  {"time", k8s::NowRfc3339()}, {"fieldsType", "FieldsV1"}, {"fieldsV1", Tree(mine)}};
    if (!subresource.empty()) entry["subresource"] = subresource;
    out.push_back(entry);
  }
  if (out.empty()) {
    obj["metadata"].erase("managedFields");
  } else {
    obj["metadata"]["managedFields"] = out;
  }
}

}  // namespace kgpu::testing
