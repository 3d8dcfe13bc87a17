#include "testing/fake_apiserver_admission.h"

#include <map>
#include <set>

#include "common/strings.h"
#include "k8s/quantity.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;
using k8s::Quantity;

Quantity Q(const json& v) {
  if (v.is_string()) {
    if (auto q = Quantity::Parse(v.get<std::string>())) return *q;
  } else if (v.is_number_integer()) {
    return Quantity{v.get<int64_t>() * 1000, false};
  } else if (v.is_number()) {
    return Quantity{static_cast<int64_t>(v.get<double>() * 1000), false};
  }
  return {};
}

std::string S(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// helper.IsNativeResource: no domain, or a *kubernetes.io/ domain.
bool IsNative(const std::string& name) {
  const auto slash = name.find('/');
  if (slash == std::string::npos) return true;
  const std::string domain = name.substr(0, slash);
  return domain == "kubernetes.io" || (domain.size() > 14 && domain.ends_with(".kubernetes.io"));
}
bool IsExtended(const std::string& name) {
  return !IsNative(name) && name.rfind("requests.", 0) != 0;
}
// IsOvercommitAllowed: native resources except hugepages-*.
bool OvercommitAllowed(const std::string& name) {
  return IsNative(name) && name.rfind("hugepages-", 0) != 0;
}

json& Resources(json& c) {
  if (!c.contains("resources") || !c["resources"].is_object()) c["resources"] = json::object();
  return c["resources"];
}

std::vector<std::string> ContainerLists() {
  return {"initContainers", "containers"};
}

// Aggregate.Error(): one message alone, several as "[a, b]".
std::string Aggregate(const std::vector<std::string>& errs) {
  if (errs.size() == 1) return errs[0];
  return Cat("[", Join(errs, ", "), "]");
}

std::string Pretty(const std::map<std::string, Quantity>& m) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : m) parts.push_back(Cat(k, "=", v.Canonical()));
  return Join(parts, ",");
}

}  // namespace

void DefaultLimitRange(json& lr) {
  if (!lr.contains("spec") || !lr["spec"].contains("limits") || !lr["spec"]["limits"].is_array()) return;
  for (auto& item : lr["spec"]["limits"]) {
    if (item.value("type", "") != "Container") continue;
    if (!item.contains("default")) item["default"] = json::object();
    if (!item.contains("defaultRequest")) item["defaultRequest"] = json::object();
    if (item.contains("max")) {
      for (auto it = item["max"].begin(); it != item["max"].end(); ++it) {
        if (!item["default"].contains(it.key())) item["default"][it.key()] = *it;
      }
    }
    for (auto it = item["default"].begin(); it != item["default"].end(); ++it) {
      if (!item["defaultRequest"].contains(it.key())) item["defaultRequest"][it.key()] = *it;
    }
    if (item.contains("min")) {
      for (auto it = item["min"].begin(); it != item["min"].end(); ++it) {
        if (!item["defaultRequest"].contains(it.key())) item["defaultRequest"][it.key()] = *it;
      }
    }
    if (item["default"].empty()) item.erase("default");
    if (item["defaultRequest"].empty()) item.erase("defaultRequest");
  }
}

json PodQuotaUsage(const json& pod) {
  // Per resource, as component-helpers' AggregateContainerRequests (and limits) with sidecars:
  // the app containers' sum plus every restartable init container (sidecar), or the largest
  // need while an init container runs (it plus the sidecars started before it), whichever is
  // more.
  std::map<std::string, Quantity> req_sum, lim_sum;
  const json spec = pod.value("spec", json::object());
  auto add = [](std::map<std::string, Quantity>& to, const json& list) {
    if (!list.is_object()) return;
    for (auto it = list.begin(); it != list.end(); ++it) to[it.key()] = to[it.key()] + Q(*it);
  };
  if (spec.contains("containers") && spec["containers"].is_array()) {
    for (const auto& c : spec["containers"]) {
      const json res = c.value("resources", json::object());
      add(req_sum, res.value("requests", json::object()));
      add(lim_sum, res.value("limits", json::object()));
    }
  }
  for (const char* kind : {"requests", "limits"}) {
    auto& sum = std::string(kind) == "requests" ? req_sum : lim_sum;
    std::map<std::string, Quantity> sidecars, init_max;
    if (!spec.contains("initContainers") || !spec["initContainers"].is_array()) continue;
    for (const auto& c : spec["initContainers"]) {
      const json own = c.value("resources", json::object()).value(kind, json::object());
      std::map<std::string, Quantity> need;
      if (c.value("restartPolicy", "") == "Always") {
        add(sum, own);
        add(sidecars, own);
        need = sidecars;
      } else {
        add(need, own);
        for (const auto& [k, v] : sidecars) need[k] = need[k] + v;
      }
      for (const auto& [k, v] : need) init_max[k] = std::max(init_max[k], v);
    }
    for (const auto& [k, v] : init_max) sum[k] = std::max(sum[k], v);
  }
  json usage = {{"pods", "1"}, {"count/pods", "1"}};
  for (const auto& [k, v] : req_sum) {
    if (k == "cpu" || k == "memory" || k == "ephemeral-storage") {
      usage["requests." + k] = v.Canonical();
      usage[k] = v.Canonical();
    } else if (IsExtended(k)) {
      usage["requests." + k] = v.Canonical();  // isExtendedResourceNameForQuota: requests. only
    }
  }
  for (const auto& [k, v] : lim_sum) {
    if (k == "cpu" || k == "memory" || k == "ephemeral-storage") usage["limits." + k] = v.Canonical();
  }
  return usage;
}

namespace {
// qos.GetPodQOS == BestEffort: no container (init or app) asks for or limits cpu or memory.
bool BestEffort(const json& pod) {
  const json spec = pod.value("spec", json::object());
  for (const auto& list : ContainerLists()) {
    if (!spec.contains(list) || !spec[list].is_array()) continue;
    for (const auto& c : spec[list]) {
      const json res = c.value("resources", json::object());
      for (const char* kind : {"requests", "limits"}) {
        if (!res.contains(kind) || !res[kind].is_object()) continue;
        for (const char* name : {"cpu", "memory"}) {
          if (res[kind].contains(name) && Q(res[kind][name]) > Quantity{}) return false;
        }
      }
    }
  }
  return true;
}

bool ScopeMatches(const std::string& scope, const std::string& op, const json& values, const json& pod) {
  const json spec = pod.value("spec", json::object());
  if (scope == "PriorityClass") {
    const std::string pc = spec.value("priorityClassName", "");
    bool in = false;
    if (values.is_array()) {
      for (const auto& v : values) in = in || (v.is_string() && v.get<std::string>() == pc);
    }
    if (op == "In") return in;
    if (op == "NotIn") return !in;
    if (op == "Exists") return true;  // the key is always in the set, even for ""
    return false;                     // DoesNotExist
  }
  bool matches = false;
  if (scope == "Terminating") {
    matches = spec.contains("activeDeadlineSeconds") && spec["activeDeadlineSeconds"].is_number() &&
              spec["activeDeadlineSeconds"].get<double>() >= 0;
  } else if (scope == "NotTerminating") {
    matches = !spec.contains("activeDeadlineSeconds") || spec["activeDeadlineSeconds"].is_null();
  } else if (scope == "BestEffort") {
    matches = BestEffort(pod);
  } else if (scope == "NotBestEffort") {
    matches = !BestEffort(pod);
  }
  return op == "DoesNotExist" ? !matches : matches;
}
}  // namespace

bool QuotaMatchesPod(const json& quota, const json& pod) {
  const json spec = quota.value("spec", json::object());
  if (spec.contains("scopes") && spec["scopes"].is_array()) {
    for (const auto& s : spec["scopes"]) {
      if (s.is_string() && !ScopeMatches(s.get<std::string>(), "Exists", json(), pod)) return false;
    }
  }
  if (spec.contains("scopeSelector") && spec["scopeSelector"].is_object() &&
      spec["scopeSelector"].contains("matchExpressions") && spec["scopeSelector"]["matchExpressions"].is_array()) {
    for (const auto& e : spec["scopeSelector"]["matchExpressions"]) {
      if (!e.is_object()) continue;
      if (!ScopeMatches(e.value("scopeName", ""), e.value("operator", ""), e.value("values", json()), pod))
        return false;
    }
  }
  return true;
}

namespace {
bool Terminal(const json& pod) {
  const std::string phase = pod.contains("status") ? pod["status"].value("phase", "") : "";
  return phase == "Succeeded" || phase == "Failed";
}
}  // namespace

json QuotaUsed(const json& quota, const std::vector<json>& pods) {
  std::map<std::string, Quantity> used;
  const json hard = quota.contains("spec") ? quota["spec"].value("hard", json::object()) : json::object();
  for (auto it = hard.begin(); it != hard.end(); ++it) used[it.key()] = Quantity{0, Q(*it).binary};
  for (const auto& pod : pods) {
    if (Terminal(pod) || !QuotaMatchesPod(quota, pod)) continue;
    const json u = PodQuotaUsage(pod);
    for (auto& [k, v] : used) {
      if (u.contains(k)) v = v + Q(u[k]);
    }
  }
  json out = json::object();
  for (const auto& [k, v] : used) out[k] = v.Canonical();
  return out;
}

AdmissionResult AdmitPod(json& pod, const std::vector<json>& limit_ranges, const std::vector<json>& quotas) {
  AdmissionResult r;
  json& spec = pod["spec"];
  if (!spec.is_object() || !spec.contains("containers") || !spec["containers"].is_array() ||
      spec["containers"].empty()) {
    r.allowed = false;
    r.code = 422;
    r.errors.push_back({"FieldValueRequired", "spec.containers", "Required value"});
    return r;
  }
  // Core defaulting: limits default the missing requests.
  for (const auto& list : ContainerLists()) {
    if (!spec.contains(list)) continue;
    for (auto& c : spec[list]) {
      json& res = Resources(c);
      if (res.contains("limits") && res["limits"].is_object()) {
        for (auto it = res["limits"].begin(); it != res["limits"].end(); ++it) {
          if (!res.contains("requests") || !res["requests"].contains(it.key())) res["requests"][it.key()] = *it;
        }
      }
    }
  }
  // LimitRanger: defaults, then min/max per container. What it set is noted, per container, in
  // the annotation mergePodResourceRequirements writes: "<sorted names> request for container
  // <c>" then "... limit for ...", init containers as "init container <c>", joined by "; ".
  std::vector<std::string> lr_errs;
  std::vector<std::string> lr_set;
  for (const auto& list : ContainerLists()) {
    if (!spec.contains(list)) continue;
    for (auto& c : spec[list]) {
      std::set<std::string> set_requests, set_limits;
      json& res = Resources(c);
      for (const auto& lr : limit_ranges) {
        if (!lr.contains("spec") || !lr["spec"].contains("limits")) continue;
        for (const auto& item : lr["spec"]["limits"]) {
          if (item.value("type", "") != "Container") continue;
          if (item.contains("default")) {
            for (auto it = item["default"].begin(); it != item["default"].end(); ++it) {
              if (!res.contains("limits") || !res["limits"].contains(it.key())) {
                res["limits"][it.key()] = *it;
                set_limits.insert(it.key());
              }
            }
          }
          if (item.contains("defaultRequest")) {
            for (auto it = item["defaultRequest"].begin(); it != item["defaultRequest"].end(); ++it) {
              if (!res.contains("requests") || !res["requests"].contains(it.key())) {
                res["requests"][it.key()] = *it;
                set_requests.insert(it.key());
              }
            }
          }
        }
      }
      const std::string who = Cat(list == "initContainers" ? "init container " : "container ", c.value("name", ""));
      auto names = [](const std::set<std::string>& v) {
        return Join(std::vector<std::string>(v.begin(), v.end()), ", ");
      };
      if (!set_requests.empty()) lr_set.push_back(Cat(names(set_requests), " request for ", who));
      if (!set_limits.empty()) lr_set.push_back(Cat(names(set_limits), " limit for ", who));
    }
  }
  if (!lr_set.empty()) {
    pod["metadata"]["annotations"]["kubernetes.io/limit-ranger"] = Cat("LimitRanger plugin set: ", Join(lr_set, "; "));
  }
  for (const auto& lr : limit_ranges) {
    if (!lr.contains("spec") || !lr["spec"].contains("limits")) continue;
    for (const auto& item : lr["spec"]["limits"]) {
      if (item.value("type", "") != "Container") continue;
      for (const auto& list : ContainerLists()) {
        if (!spec.contains(list)) continue;
        for (auto& c : spec[list]) {
          const json req = Resources(c).value("requests", json::object());
          const json lim = Resources(c).value("limits", json::object());
          if (item.contains("min")) {
            for (auto it = item["min"].begin(); it != item["min"].end(); ++it) {
              const std::string k = it.key();
              const std::string enforced = Q(*it).Canonical();
              if (!req.contains(k)) {
                lr_errs.push_back(
                    Cat("minimum ", k, " usage per Container is ", enforced, ".  No request is specified"));
              } else if (Q(req[k]) < Q(*it)) {
                lr_errs.push_back(
                    Cat("minimum ", k, " usage per Container is ", enforced, ", but request is ", S(req[k])));
              } else if (lim.contains(k) && Q(lim[k]) < Q(*it)) {
                lr_errs.push_back(
                    Cat("minimum ", k, " usage per Container is ", enforced, ", but limit is ", S(lim[k])));
              }
            }
          }
          if (item.contains("max")) {
            for (auto it = item["max"].begin(); it != item["max"].end(); ++it) {
              const std::string k = it.key();
              const std::string enforced = Q(*it).Canonical();
              if (!lim.contains(k)) {
                lr_errs.push_back(Cat("maximum ", k, " usage per Container is ", enforced, ".  No limit is specified"));
              } else if (Q(lim[k]) > Q(*it)) {
                lr_errs.push_back(
                    Cat("maximum ", k, " usage per Container is ", enforced, ", but limit is ", S(lim[k])));
              } else if (req.contains(k) && Q(req[k]) > Q(*it)) {
                lr_errs.push_back(
                    Cat("maximum ", k, " usage per Container is ", enforced, ", but request is ", S(req[k])));
              }
            }
          }
        }
      }
    }
  }
  // Validation of the resource requirements (422).
  std::vector<FieldError> invalid;
  for (const auto& list : ContainerLists()) {
    if (!spec.contains(list)) continue;
    for (size_t i = 0; i < spec[list].size(); ++i) {
      const json& c = spec[list][i];
      const std::string base = Cat("spec.", list, "[", i, "].resources");
      const json req = c["resources"].value("requests", json::object());
      const json lim = c["resources"].value("limits", json::object());
      for (const auto* m : {&lim, &req}) {
        const std::string kind = m == &lim ? "limits" : "requests";
        for (auto it = m->begin(); it != m->end(); ++it) {
          const std::string field = Cat(base, ".", kind, "[", it.key(), "]");
          if (!Quantity::Parse(S(*it))) {
            invalid.push_back({"FieldValueInvalid", field,
                               Cat("Invalid value: \"", S(*it),
                                   "\": quantities must match the regular expression "
                                   "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")});
          } else if (IsExtended(it.key()) && !Q(*it).IsInteger()) {
            invalid.push_back({"FieldValueInvalid", field, Cat("Invalid value: \"", S(*it), "\": must be an integer")});
          }
        }
      }
      for (auto it = req.begin(); it != req.end(); ++it) {
        if (lim.contains(it.key())) {
          if (Q(*it) != Q(lim[it.key()]) && !OvercommitAllowed(it.key())) {
            invalid.push_back({"FieldValueInvalid", Cat(base, ".requests"),
                               Cat("Invalid value: \"", Q(*it).Canonical(), "\": must be equal to ", it.key(),
                                   " limit of ", Q(lim[it.key()]).Canonical())});
          } else if (Q(*it) > Q(lim[it.key()])) {
            invalid.push_back({"FieldValueInvalid", Cat(base, ".requests"),
                               Cat("Invalid value: \"", Q(*it).Canonical(), "\": must be less than or equal to ",
                                   it.key(), " limit of ", Q(lim[it.key()]).Canonical())});
          }
        } else if (!OvercommitAllowed(it.key())) {
          invalid.push_back({"FieldValueRequired", Cat(base, ".limits"),
                             "Required value: Limit must be set for non overcommitable resources"});
        }
      }
    }
  }
  const std::string name = pod["metadata"].value("name", "");
  if (!invalid.empty()) return {false, 422, "", invalid};
  if (!lr_errs.empty()) return {false, 403, Aggregate(lr_errs), {}};
  // ResourceQuota, in the order the quotas are given (sorted by name by the caller).
  const json usage = PodQuotaUsage(pod);
  for (const auto& quota : quotas) {
    if (!QuotaMatchesPod(quota, pod)) continue;  // a scoped quota ignores the pods it does not select
    const json hard = quota.contains("spec") ? quota["spec"].value("hard", json::object()) : json::object();
    const json used = quota.contains("status") ? quota["status"].value("used", json::object()) : json::object();
    // Constraints: a quota on cpu/memory needs every container to state them.
    std::set<std::string> missing;
    for (auto it = hard.begin(); it != hard.end(); ++it) {
      const std::string k = it.key();
      std::string kind, resource;
      if (k == "cpu" || k == "memory") {
        kind = "requests", resource = k;
      } else if (k.rfind("requests.", 0) == 0 || k.rfind("limits.", 0) == 0) {
        kind = k.substr(0, k.find('.'));
        resource = k.substr(k.find('.') + 1);
      }
      if (resource != "cpu" && resource != "memory") continue;
      for (const auto& c : spec["containers"]) {
        if (!c["resources"].contains(kind) || !c["resources"][kind].contains(resource))
          missing.insert(Cat(kind, ".", resource));
      }
    }
    const std::string qname = quota["metadata"].value("name", "");
    if (!missing.empty()) {
      return {false, 403, Cat("failed quota: ", qname, ": must specify ", Join(missing, ",")), {}};
    }
    std::map<std::string, Quantity> req_f, used_f, hard_f;
    for (auto it = hard.begin(); it != hard.end(); ++it) {
      if (!usage.contains(it.key())) continue;
      const Quantity requested = Q(usage[it.key()]);
      const Quantity now = used.contains(it.key()) ? Q(used[it.key()]) : Quantity{};
      if (now + requested > Q(*it)) {
        req_f[it.key()] = requested;
        used_f[it.key()] = now;
        hard_f[it.key()] = Q(*it);
      }
    }
    if (!req_f.empty()) {
      return {false,
              403,
              Cat("exceeded quota: ", qname, ", requested: ", Pretty(req_f), ", used: ", Pretty(used_f),
                  ", limited: ", Pretty(hard_f)),
              {}};
    }
  }
  return r;
}

namespace {
// Go's %#v of the internal core types the validation prints.
std::string GoQuote(const json& v) {
  return json(v.is_string() ? v.get<std::string>() : v.dump()).dump();
}

std::string GoStringSlice(const std::string& type, const json& arr, bool present) {
  if (!present || !arr.is_array()) return Cat(type, "(nil)");
  std::vector<std::string> parts;
  for (const auto& v : arr) parts.push_back(GoQuote(v));
  return Cat(type, "{", Join(parts, ", "), "}");
}

std::string GoScopes(const json& spec) {
  return GoStringSlice("[]core.ResourceQuotaScope", spec.value("scopes", json()), spec.contains("scopes"));
}

std::string GoScopeSelector(const json& sel) {
  const bool has = sel.contains("matchExpressions") && sel["matchExpressions"].is_array();
  std::string out = "core.ScopeSelector{MatchExpressions:[]core.ScopedResourceSelectorRequirement";
  if (!has) return out + "(nil)}";
  std::vector<std::string> reqs;
  for (const auto& e : sel["matchExpressions"]) {
    const json o = e.is_object() ? e : json::object();
    reqs.push_back(Cat("core.ScopedResourceSelectorRequirement{ScopeName:", GoQuote(o.value("scopeName", "")),
                       ", Operator:", GoQuote(o.value("operator", "")),
                       ", Values:", GoStringSlice("[]string", o.value("values", json()), o.contains("values")), "}"));
  }
  return Cat(out, "{", Join(reqs, ", "), "}}");
}

bool HugePages(const std::string& k) {
  return k.rfind("hugepages-", 0) == 0 || k.rfind("requests.hugepages-", 0) == 0;
}

// helper.IsStandardResourceName and IsStandardQuotaResourceName (pkg/apis/core/helper).
bool StandardResource(const std::string& k) {
  static const std::set<std::string> kNames = {"cpu",
                                               "memory",
                                               "ephemeral-storage",
                                               "requests.cpu",
                                               "requests.memory",
                                               "requests.ephemeral-storage",
                                               "limits.cpu",
                                               "limits.memory",
                                               "limits.ephemeral-storage",
                                               "pods",
                                               "resourcequotas",
                                               "services",
                                               "replicationcontrollers",
                                               "secrets",
                                               "configmaps",
                                               "persistentvolumeclaims",
                                               "storage",
                                               "requests.storage",
                                               "services.nodeports",
                                               "services.loadbalancers"};
  return kNames.contains(k) || HugePages(k);
}
bool StandardQuotaResource(const std::string& k) {
  static const std::set<std::string> kNames = {"cpu",
                                               "memory",
                                               "ephemeral-storage",
                                               "requests.cpu",
                                               "requests.memory",
                                               "requests.storage",
                                               "requests.ephemeral-storage",
                                               "limits.cpu",
                                               "limits.memory",
                                               "limits.ephemeral-storage",
                                               "pods",
                                               "resourcequotas",
                                               "services",
                                               "replicationcontrollers",
                                               "secrets",
                                               "persistentvolumeclaims",
                                               "configmaps",
                                               "services.nodeports",
                                               "services.loadbalancers"};
  return kNames.contains(k) || HugePages(k);
}
bool StandardScope(const std::string& s) {
  return s == "Terminating" || s == "NotTerminating" || s == "BestEffort" || s == "NotBestEffort" ||
         s == "PriorityClass" || s == "CrossNamespacePodAffinity";
}
// helper.IsResourceQuotaScopeValidForResource.
bool ScopeValidFor(const std::string& scope, const std::string& k) {
  const bool count = k == "pods";
  const bool compute = k == "cpu" || k == "memory" || k == "limits.cpu" || k == "limits.memory" ||
                       k == "requests.cpu" || k == "requests.memory";
  if (scope == "BestEffort") return count;
  if (StandardScope(scope)) return count || compute;
  return true;
}

FieldError Invalid(const std::string& field, const std::string& value, const std::string& detail) {
  return {"FieldValueInvalid", field, Cat("Invalid value: ", value, ": ", detail)};
}

void ConflictingScopes(const std::set<std::string>& set, const std::string& field, const json& spec,
                       std::vector<FieldError>& errs) {
  for (const auto& [a, b] : {std::pair{"BestEffort", "NotBestEffort"}, std::pair{"Terminating", "NotTerminating"}}) {
    if (set.contains(a) && set.contains(b)) errs.push_back(Invalid(field, GoScopes(spec), "conflicting scopes"));
  }
}
}  // namespace

std::vector<FieldError> ValidateResourceQuota(const json& quota, const json* old) {
  std::vector<FieldError> errs;
  const json spec = quota.contains("spec") && quota["spec"].is_object() ? quota["spec"] : json::object();
  const json hard = spec.contains("hard") && spec["hard"].is_object() ? spec["hard"] : json::object();
  // ValidateResourceQuotaSpec: spec.hard (sorted here; Go walks the map in random order).
  for (auto it = hard.begin(); it != hard.end(); ++it) {
    const std::string& k = it.key();
    const std::string path = Cat("spec.hard[", k, "]");
    if (k.find('/') == std::string::npos) {
      if (!StandardResource(k)) {
        errs.push_back(Invalid(path, GoQuote(k), "must be a standard resource type or fully qualified"));
      }
      if (!StandardQuotaResource(k)) errs.push_back(Invalid(path, GoQuote(k), "must be a standard resource for quota"));
    }
    if (Q(*it) < Quantity{})
      errs.push_back(Invalid(path, GoQuote(Q(*it).Canonical()), "must be greater than or equal to 0"));
  }
  // validateResourceQuotaScopes: one error per scope and offending resource, as upstream.
  const json scopes = spec.value("scopes", json::array());
  if (scopes.is_array() && !scopes.empty()) {
    std::set<std::string> set;
    for (const auto& s : scopes) {
      const std::string scope = s.is_string() ? s.get<std::string>() : s.dump();
      if (!StandardScope(scope)) errs.push_back(Invalid("spec.scopes", GoScopes(spec), "unsupported scope"));
      for (auto it = hard.begin(); it != hard.end(); ++it) {
        if (StandardQuotaResource(it.key()) && !ScopeValidFor(scope, it.key())) {
          errs.push_back(Invalid("spec.scopes", GoScopes(spec), "unsupported scope applied to resource"));
        }
      }
      set.insert(scope);
    }
    ConflictingScopes(set, "spec.scopes", spec, errs);
  }
  // validateScopeSelector / validateScopedResourceSelectorRequirement.
  if (spec.contains("scopeSelector") && spec["scopeSelector"].is_object()) {
    const json& sel = spec["scopeSelector"];
    const std::string base = "spec.scopeSelector.matchExpressions";
    std::set<std::string> set;
    for (const auto& e : sel.value("matchExpressions", json::array())) {
      const json o = e.is_object() ? e : json::object();
      const std::string scope = o.value("scopeName", ""), op = o.value("operator", "");
      const json values = o.value("values", json::array());
      const size_t nvalues = values.is_array() ? values.size() : 0;
      if (!StandardScope(scope)) errs.push_back(Invalid(base + ".scopeName", GoQuote(scope), "unsupported scope"));
      for (auto it = hard.begin(); it != hard.end(); ++it) {
        if (StandardQuotaResource(it.key()) && !ScopeValidFor(scope, it.key())) {
          errs.push_back(Invalid(base, GoScopeSelector(sel), "unsupported scope applied to resource"));
        }
      }
      if ((scope == "BestEffort" || scope == "NotBestEffort" || scope == "Terminating" || scope == "NotTerminating" ||
           scope == "CrossNamespacePodAffinity") &&
          op != "Exists") {
        errs.push_back(Invalid(base + ".operator", GoQuote(op),
                               "must be 'Exist' when scope is any of ResourceQuotaScopeTerminating, "
                               "ResourceQuotaScopeNotTerminating, ResourceQuotaScopeBestEffort, "
                               "ResourceQuotaScopeNotBestEffort or ResourceQuotaScopeCrossNamespacePodAffinity"));
      }
      if (op == "In" || op == "NotIn") {
        if (nvalues == 0) {
          errs.push_back({"FieldValueRequired", base + ".values",
                          "Required value: must be at least one value when `operator` is 'In' or 'NotIn' for scope "
                          "selector"});
        }
      } else if (op == "Exists" || op == "DoesNotExist") {
        if (nvalues != 0) {
          errs.push_back(Invalid(base + ".values", GoStringSlice("[]string", values, true),
                                 "must be no value when `operator` is 'Exist' or 'DoesNotExist' for scope selector"));
        }
      } else {
        errs.push_back(Invalid(base + ".operator", GoQuote(op), "not a valid selector operator"));
      }
      set.insert(scope);
    }
    ConflictingScopes(set, base, spec, errs);
  }
  // ValidateResourceQuotaUpdate: the scopes may not change.
  if (old != nullptr) {
    auto scope_set = [](const json& q) {
      std::set<std::string> out;
      if (q.contains("spec") && q["spec"].is_object() && q["spec"].contains("scopes") &&
          q["spec"]["scopes"].is_array()) {
        for (const auto& s : q["spec"]["scopes"]) out.insert(s.is_string() ? s.get<std::string>() : s.dump());
      }
      return out;
    };
    if (scope_set(quota) != scope_set(*old))
      errs.push_back(Invalid("spec.scopes", GoScopes(spec), "field is immutable"));
  }
  return errs;
}

}  // namespace kgpu::testing
