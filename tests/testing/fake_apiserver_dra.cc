#include "testing/fake_apiserver_dra.h"

#include <cctype>
#include <set>

#include "common/strings.h"
#include "k8s/quantity.h"
#include "k8s/resources.h"

namespace kgpu::testing {
namespace {

using json = nlohmann::json;

constexpr char kDnsLabelMsg[] =
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
constexpr char kDnsSubdomainMsg[] =
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
constexpr char kCIdentifierMsg[] =
    "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric "
    "characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is "
    "'[A-Za-z_][A-Za-z0-9_]*')";

// The errors of one object, field by field.
class Errors {
 public:
  void Required(const std::string& f, const std::string& detail = "") {
    Add("FieldValueRequired", f, detail.empty() ? "Required value" : Cat("Required value: ", detail));
  }
  void Invalid(const std::string& f, const json& v, const std::string& detail) {
    Add("FieldValueInvalid", f, Cat("Invalid value: ", Show(v), ": ", detail));
  }
  void TooMany(const std::string& f, size_t n, size_t max) {
    Add("FieldValueTooMany", f, Cat("Too many: ", n, ": must have at most ", max, " items"));
  }
  void TooLong(const std::string& f, size_t max) {
    Add("FieldValueTooLong", f, Cat("Too long: may not be more than ", max, " bytes"));
  }
  void Duplicate(const std::string& f, const json& v) {
    Add("FieldValueDuplicate", f, Cat("Duplicate value: ", Show(v)));
  }
  void NotSupported(const std::string& f, const json& v, const std::vector<std::string>& ok) {
    std::vector<std::string> q;
    for (const auto& s : ok) q.push_back(json(s).dump());
    Add("FieldValueNotSupported", f, Cat("Unsupported value: ", Show(v), ": supported values: ", Join(q, ", ")));
  }
  void Forbidden(const std::string& f, const std::string& detail) {
    Add("FieldValueForbidden", f, Cat("Forbidden: ", detail));
  }
  std::vector<FieldError> Take() { return std::move(errs_); }

 private:
  static std::string Show(const json& v) { return v.is_string() ? json(v.get<std::string>()).dump() : v.dump(); }
  void Add(const char* type, const std::string& f, const std::string& body) { errs_.push_back({type, f, body}); }
  std::vector<FieldError> errs_;
};

bool IsDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

bool IsDnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    const std::string label = s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!IsDnsLabel(label)) return false;
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

bool IsCIdentifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

std::string Str(const json& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : "";
}

const json& Arr(const json& o, const char* key) {
  static const json kEmpty = json::array();
  return o.is_object() && o.contains(key) && o[key].is_array() ? o[key] : kEmpty;
}

const json& Obj(const json& o, const char* key) {
  static const json kEmpty = json::object();
  return o.is_object() && o.contains(key) && o[key].is_object() ? o[key] : kEmpty;
}

void DnsSubdomain(Errors& e, const std::string& f, const json& o, const char* key, size_t max, bool required = true) {
  const std::string v = Str(o, key);
  if (v.empty()) {
    if (required) e.Required(f);
    return;
  }
  if (v.size() > max) e.TooLong(f, max);
  if (!IsDnsSubdomain(v)) e.Invalid(f, v, kDnsSubdomainMsg);
}

void DnsLabel(Errors& e, const std::string& f, const std::string& v) {
  if (v.empty()) {
    e.Required(f);
  } else if (!IsDnsLabel(v)) {
    e.Invalid(f, v, kDnsLabelMsg);
  }
}

// A QualifiedName: a C identifier of ≤ 32, optionally "<DNS subdomain ≤ 63>/".
void QualifiedName(Errors& e, const std::string& f, const std::string& name) {
  const size_t slash = name.find('/');
  const std::string id = slash == std::string::npos ? name : name.substr(slash + 1);
  if (slash != std::string::npos) {
    const std::string domain = name.substr(0, slash);
    if (domain.size() > 63) e.TooLong(f, 63);
    if (!IsDnsSubdomain(domain)) e.Invalid(f, domain, kDnsSubdomainMsg);
  }
  if (id.size() > 32) e.TooLong(f, 32);
  if (!IsCIdentifier(id)) e.Invalid(f, id, kCIdentifierMsg);
}

void Quantity(Errors& e, const std::string& f, const json& v) {
  if (!v.is_string() || !k8s::Quantity::Parse(v.get<std::string>())) {
    e.Invalid(f, v, "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'");
  }
}

bool IsSemVer(const std::string& v) {
  // MAJOR.MINOR.PATCH, no leading zeros, optional -prerelease and +build of [0-9A-Za-z-.].
  size_t i = 0;
  for (int part = 0; part < 3; ++part) {
    const size_t start = i;
    while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) ++i;
    if (i == start || (v[start] == '0' && i - start > 1)) return false;
    if (part < 2) {
      if (i >= v.size() || v[i] != '.') return false;
      ++i;
    }
  }
  for (; i < v.size(); ++i) {
    const char c = v[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '+')) return false;
  }
  return true;
}

void Selectors(Errors& e, const std::string& f, const json& list) {
  if (list.size() > 32) e.TooMany(f, list.size(), 32);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string p = Cat(f, "[", i, "]");
    const std::string expr = Str(Obj(list[i], "cel"), "expression");
    if (!list[i].is_object() || !list[i].contains("cel")) {
      e.Required(Cat(p, ".cel"));
    } else if (expr.empty()) {
      e.Required(Cat(p, ".cel.expression"));
    } else if (expr.size() > 10 * 1024) {
      e.TooLong(Cat(p, ".cel.expression"), 10 * 1024);
    }
  }
}

void OpaqueConfig(Errors& e, const std::string& f, const json& opaque) {
  DnsSubdomain(e, Cat(f, ".driver"), opaque, "driver", 63);
  if (!opaque.contains("parameters")) {
    e.Required(Cat(f, ".parameters"));
  } else if (opaque["parameters"].dump().size() > 10 * 1024) {
    e.TooLong(Cat(f, ".parameters"), 10 * 1024);
  }
}

void Tolerations(Errors& e, const std::string& f, const json& list) {
  if (list.size() > 16) e.TooMany(f, list.size(), 16);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string p = Cat(f, "[", i, "]");
    const std::string op = Str(list[i], "operator");
    if (!op.empty() && op != "Equal" && op != "Exists") e.NotSupported(Cat(p, ".operator"), op, {"Equal", "Exists"});
    if (op == "Exists" && !Str(list[i], "value").empty()) {
      e.Invalid(Cat(p, ".value"), Str(list[i], "value"), "must be empty when `operator` is 'Exists'");
    }
    const std::string effect = Str(list[i], "effect");
    if (!effect.empty() && effect != "NoSchedule" && effect != "NoExecute") {
      e.NotSupported(Cat(p, ".effect"), effect, {"NoExecute", "NoSchedule"});
    }
  }
}

// One request's (or subrequest's) device-selection fields.
void ExactRequest(Errors& e, const std::string& f, const json& r, bool sub) {
  DnsSubdomain(e, Cat(f, ".deviceClassName"), r, "deviceClassName", 253);
  Selectors(e, Cat(f, ".selectors"), Arr(r, "selectors"));
  const std::string mode = Str(r, "allocationMode");
  if (!mode.empty() && mode != "ExactCount" && mode != "All") {
    e.NotSupported(Cat(f, ".allocationMode"), mode, {"All", "ExactCount"});
  }
  if (r.contains("count")) {
    if (mode == "All") {
      e.Invalid(Cat(f, ".count"), r["count"], "must not be specified when allocationMode is 'All'");
    } else if (!r["count"].is_number_integer() || r["count"].get<int64_t>() <= 0) {
      e.Invalid(Cat(f, ".count"), r["count"], "must be greater than zero");
    }
  }
  if (sub && r.contains("adminAccess")) e.Forbidden(Cat(f, ".adminAccess"), "not allowed in a subrequest");
  Tolerations(e, Cat(f, ".tolerations"), Arr(r, "tolerations"));
  const json& caps = Obj(Obj(r, "capacity"), "requests");
  for (auto it = caps.begin(); it != caps.end(); ++it) {
    const std::string p = Cat(f, ".capacity.requests[", it.key(), "]");
    QualifiedName(e, p, it.key());
    Quantity(e, p, it.value());
  }
}

void ClaimSpec(Errors& e, const std::string& f, const json& spec) {
  const json& devices = Obj(spec, "devices");
  const json& requests = Arr(devices, "requests");
  const std::string rf = Cat(f, ".devices.requests");
  if (requests.size() > 32) e.TooMany(rf, requests.size(), 32);
  std::set<std::string> names;  // "req" and "req/sub"
  for (size_t i = 0; i < requests.size(); ++i) {
    const json& r = requests[i];
    const std::string p = Cat(rf, "[", i, "]");
    const std::string name = Str(r, "name");
    DnsLabel(e, Cat(p, ".name"), name);
    if (!name.empty() && !names.insert(name).second) e.Duplicate(Cat(p, ".name"), name);
    const bool exactly = r.is_object() && r.contains("exactly"), first = r.is_object() && r.contains("firstAvailable");
    if (exactly == first) {
      if (exactly) {
        e.Invalid(p, "{`exactly`, `firstAvailable`}",
                  "exactly one of `exactly` or `firstAvailable` is required, "
                  "but multiple fields are set");
      } else {
        e.Required(p, "exactly one of `exactly` or `firstAvailable` is required");
      }
      continue;
    }
    if (exactly) {
      ExactRequest(e, Cat(p, ".exactly"), Obj(r, "exactly"), false);
      continue;
    }
    const json& subs = Arr(r, "firstAvailable");
    const std::string sf = Cat(p, ".firstAvailable");
    if (subs.empty()) e.Required(sf);
    if (subs.size() > 8) e.TooMany(sf, subs.size(), 8);
    std::set<std::string> sub_names;
    for (size_t j = 0; j < subs.size(); ++j) {
      const std::string sp = Cat(sf, "[", j, "]");
      const std::string sub = Str(subs[j], "name");
      DnsLabel(e, Cat(sp, ".name"), sub);
      if (!sub.empty() && !sub_names.insert(sub).second) e.Duplicate(Cat(sp, ".name"), sub);
      names.insert(Cat(name, "/", sub));
      ExactRequest(e, sp, subs[j], true);
    }
  }
  auto request_refs = [&](const std::string& p, const json& list) {
    for (size_t k = 0; k < list.size(); ++k) {
      const std::string ref = list[k].is_string() ? list[k].get<std::string>() : "";
      if (!names.contains(ref))
        e.Invalid(
            Cat(p, "[", k, "]"), list[k],
            "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'");
    }
  };
  const json& constraints = Arr(devices, "constraints");
  const std::string cf = Cat(f, ".devices.constraints");
  if (constraints.size() > 32) e.TooMany(cf, constraints.size(), 32);
  for (size_t i = 0; i < constraints.size(); ++i) {
    const std::string p = Cat(cf, "[", i, "]");
    request_refs(Cat(p, ".requests"), Arr(constraints[i], "requests"));
    const std::string match = Str(constraints[i], "matchAttribute"),
                      distinct = Str(constraints[i], "distinctAttribute");
    if (match.empty() == distinct.empty()) {
      e.Required(p, "exactly one of `matchAttribute` or `distinctAttribute` is required");
    }
    for (const auto& [key, v] : {std::pair{"matchAttribute", match}, std::pair{"distinctAttribute", distinct}}) {
      if (v.empty()) continue;
      if (v.find('/') == std::string::npos) e.Invalid(Cat(p, ".", key), v, "must include a domain");
      QualifiedName(e, Cat(p, ".", key), v);
    }
  }
  const json& config = Arr(devices, "config");
  const std::string gf = Cat(f, ".devices.config");
  if (config.size() > 32) e.TooMany(gf, config.size(), 32);
  for (size_t i = 0; i < config.size(); ++i) {
    const std::string p = Cat(gf, "[", i, "]");
    request_refs(Cat(p, ".requests"), Arr(config[i], "requests"));
    if (!config[i].is_object() || !config[i].contains("opaque")) {
      e.Required(Cat(p, ".opaque"));
    } else {
      OpaqueConfig(e, Cat(p, ".opaque"), config[i]["opaque"]);
    }
  }
}

void Attribute(Errors& e, const std::string& f, const json& a) {
  int set = 0;
  for (const char* k : {"int", "bool", "string", "version", "ints", "bools", "strings", "versions"}) {
    set += a.is_object() && a.contains(k) ? 1 : 0;
  }
  if (set != 1) {
    e.Invalid(f, a, "exactly one value must be specified");
    return;
  }
  if (a.contains("int") && !a["int"].is_number_integer()) e.Invalid(Cat(f, ".int"), a["int"], "must be an integer");
  if (a.contains("bool") && !a["bool"].is_boolean()) e.Invalid(Cat(f, ".bool"), a["bool"], "must be a boolean");
  if (a.contains("string")) {
    if (!a["string"].is_string()) {
      e.Invalid(Cat(f, ".string"), a["string"], "must be a string");
    } else if (a["string"].get<std::string>().size() > 64) {
      e.TooLong(Cat(f, ".string"), 64);
    }
  }
  if (a.contains("version")) {
    const std::string v = a["version"].is_string() ? a["version"].get<std::string>() : "";
    if (!IsSemVer(v))
      e.Invalid(Cat(f, ".version"), a["version"], "must be a string compatible with semver.org spec 2.0.0");
    if (v.size() > 64) e.TooLong(Cat(f, ".version"), 64);
  }
}

void Counters(Errors& e, const std::string& f, const json& counters) {
  if (!counters.is_object() || counters.empty()) {
    e.Required(f);
    return;
  }
  if (counters.size() > 32) e.TooMany(f, counters.size(), 32);
  for (auto it = counters.begin(); it != counters.end(); ++it) {
    const std::string p = Cat(f, "[", it.key(), "]");
    if (!IsDnsLabel(it.key())) e.Invalid(p, it.key(), kDnsLabelMsg);
    Quantity(e, Cat(p, ".value"), Obj(counters, it.key().c_str()).value("value", json()));
  }
}

void Taints(Errors& e, const std::string& f, const json& taints, size_t max) {
  if (taints.size() > max) e.TooMany(f, taints.size(), max);
  for (size_t i = 0; i < taints.size(); ++i) {
    const std::string p = Cat(f, "[", i, "]");
    if (Str(taints[i], "key").empty()) e.Required(Cat(p, ".key"));
    const std::string effect = Str(taints[i], "effect");
    if (effect.empty()) {
      e.Required(Cat(p, ".effect"));
    } else if (effect != "NoSchedule" && effect != "NoExecute" && effect != "None") {
      e.NotSupported(Cat(p, ".effect"), effect, {"NoExecute", "NoSchedule", "None"});
    }
  }
}

void SliceSpec(Errors& e, const json& spec, int minor) {
  DnsSubdomain(e, "spec.driver", spec, "driver", 63);
  const json& pool = Obj(spec, "pool");
  const std::string pool_name = Str(pool, "name");
  if (pool_name.empty()) {
    e.Required("spec.pool.name");
  } else {
    if (pool_name.size() > 253) e.TooLong("spec.pool.name", 253);
    size_t start = 0;
    while (true) {
      const size_t slash = pool_name.find('/', start);
      const std::string part = pool_name.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
      if (!IsDnsSubdomain(part)) {
        e.Invalid("spec.pool.name", pool_name, kDnsSubdomainMsg);
        break;
      }
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
  }
  if (!pool.contains("resourceSliceCount") || !pool["resourceSliceCount"].is_number_integer() ||
      pool["resourceSliceCount"].get<int64_t>() <= 0) {
    e.Invalid("spec.pool.resourceSliceCount", pool.value("resourceSliceCount", json(0)), "must be greater than zero");
  }
  if (pool.contains("generation") &&
      (!pool["generation"].is_number_integer() || pool["generation"].get<int64_t>() < 0)) {
    e.Invalid("spec.pool.generation", pool["generation"], "must be greater than or equal to 0");
  }
  std::vector<std::string> chosen;
  if (!Str(spec, "nodeName").empty()) chosen.push_back("`nodeName`");
  if (spec.contains("nodeSelector")) chosen.push_back("`nodeSelector`");
  if (spec.value("allNodes", false)) chosen.push_back("`allNodes`");
  if (spec.value("perDeviceNodeSelection", false)) chosen.push_back("`perDeviceNodeSelection`");
  constexpr char kOneOf[] =
      "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required";
  if (chosen.empty()) {
    e.Required("spec", kOneOf);
  } else if (chosen.size() > 1) {
    e.Invalid("spec", Cat("{", Join(chosen, ", "), "}"), Cat(kOneOf, ", but multiple fields are set"));
  }
  if (!Str(spec, "nodeName").empty() && !IsDnsSubdomain(Str(spec, "nodeName"))) {
    e.Invalid("spec.nodeName", Str(spec, "nodeName"), kDnsSubdomainMsg);
  }
  const json& devices = Arr(spec, "devices");
  const json& sets = Arr(spec, "sharedCounters");
  if (minor >= 35 && !devices.empty() && !sets.empty()) {
    e.Invalid("spec", "{`devices`, `sharedCounters`}",
              "exactly one of `devices`, `sharedCounters` is required, but multiple fields are set");
  }
  bool limited = false;
  for (const auto& d : devices) {
    limited = limited || !Arr(d, "taints").empty() || !Arr(d, "consumesCounters").empty();
  }
  const size_t max_devices = limited ? 64 : 128;
  if (devices.size() > max_devices) e.TooMany("spec.devices", devices.size(), max_devices);
  std::set<std::string> names;
  for (size_t i = 0; i < devices.size(); ++i) {
    const json& d = devices[i];
    const std::string p = Cat("spec.devices[", i, "]");
    const std::string name = Str(d, "name");
    DnsLabel(e, Cat(p, ".name"), name);
    if (!name.empty() && !names.insert(name).second) e.Duplicate(Cat(p, ".name"), name);
    const json& attrs = Obj(d, "attributes");
    const json& caps = Obj(d, "capacity");
    if (attrs.size() + caps.size() > 32) {
      e.Invalid(Cat(p, ".attributes"), static_cast<int64_t>(attrs.size() + caps.size()),
                "the total number of attributes and capacities must not exceed 32");
    }
    for (auto it = attrs.begin(); it != attrs.end(); ++it) {
      const std::string ap = Cat(p, ".attributes[", it.key(), "]");
      QualifiedName(e, ap, it.key());
      Attribute(e, ap, it.value());
    }
    const bool multiple = d.value("allowMultipleAllocations", false);
    for (auto it = caps.begin(); it != caps.end(); ++it) {
      const std::string cp = Cat(p, ".capacity[", it.key(), "]");
      QualifiedName(e, cp, it.key());
      Quantity(e, Cat(cp, ".value"), Obj(caps, it.key().c_str()).value("value", json()));
      const json& policy = Obj(it.value(), "requestPolicy");
      if (!it.value().contains("requestPolicy")) continue;
      if (!multiple) {
        e.Forbidden(Cat(cp, ".requestPolicy"), "allowed only when allowMultipleAllocations is true");
        continue;
      }
      if (policy.contains("default")) Quantity(e, Cat(cp, ".requestPolicy.default"), policy["default"]);
      const bool range = policy.contains("validRange"), values = policy.contains("validValues");
      if (range && values) {
        e.Invalid(Cat(cp, ".requestPolicy"), "{`validRange`, `validValues`}",
                  "exactly one of `validRange`, `validValues` is required, but multiple fields are set");
      }
      if (range) {
        const json& r = Obj(policy, "validRange");
        if (!r.contains("min")) e.Required(Cat(cp, ".requestPolicy.validRange.min"));
        for (const char* k : {"min", "max", "step"}) {
          if (r.contains(k)) Quantity(e, Cat(cp, ".requestPolicy.validRange.", k), r[k]);
        }
      }
      if (values) {
        const json& list = Arr(policy, "validValues");
        if (list.size() > 10) e.TooMany(Cat(cp, ".requestPolicy.validValues"), list.size(), 10);
        for (size_t k = 0; k < list.size(); ++k) Quantity(e, Cat(cp, ".requestPolicy.validValues[", k, "]"), list[k]);
      }
    }
    const json& consumes = Arr(d, "consumesCounters");
    if (consumes.size() > 2) e.TooMany(Cat(p, ".consumesCounters"), consumes.size(), 2);
    for (size_t k = 0; k < consumes.size(); ++k) {
      const std::string kp = Cat(p, ".consumesCounters[", k, "]");
      DnsLabel(e, Cat(kp, ".counterSet"), Str(consumes[k], "counterSet"));
      Counters(e, Cat(kp, ".counters"), Obj(consumes[k], "counters"));
    }
    Taints(e, Cat(p, ".taints"), Arr(d, "taints"), minor >= 35 ? 16 : 4);
    int node_fields = 0;
    for (const char* k : {"nodeName", "nodeSelector", "allNodes"}) node_fields += d.contains(k) ? 1 : 0;
    if (node_fields > 0 && !spec.value("perDeviceNodeSelection", false)) {
      e.Invalid(p, name,
                "`nodeName`, `nodeSelector` and `allNodes` may only be set when `perDeviceNodeSelection` is true");
    }
  }
  if (sets.size() > 8) e.TooMany("spec.sharedCounters", sets.size(), 8);
  std::set<std::string> set_names;
  for (size_t i = 0; i < sets.size(); ++i) {
    const std::string p = Cat("spec.sharedCounters[", i, "]");
    const std::string name = Str(sets[i], "name");
    DnsLabel(e, Cat(p, ".name"), name);
    if (!name.empty() && !set_names.insert(name).second) e.Duplicate(Cat(p, ".name"), name);
    Counters(e, Cat(p, ".counters"), Obj(sets[i], "counters"));
  }
}

void ClassSpec(Errors& e, const json& spec) {
  Selectors(e, "spec.selectors", Arr(spec, "selectors"));
  const json& config = Arr(spec, "config");
  if (config.size() > 32) e.TooMany("spec.config", config.size(), 32);
  for (size_t i = 0; i < config.size(); ++i) {
    const std::string p = Cat("spec.config[", i, "]");
    if (!config[i].is_object() || !config[i].contains("opaque")) {
      e.Required(Cat(p, ".opaque"));
    } else {
      OpaqueConfig(e, Cat(p, ".opaque"), config[i]["opaque"]);
    }
  }
  const std::string ext = Str(spec, "extendedResourceName");
  if (!ext.empty()) {
    // An extended resource name: a qualified name with a domain that is not kubernetes.io.
    const size_t slash = ext.find('/');
    if (slash == std::string::npos || ext.rfind("kubernetes.io/", 0) == 0 || ext.rfind("requests.", 0) == 0) {
      e.Invalid("spec.extendedResourceName", ext,
                "must be a standard resource name or fully qualified outside the kubernetes.io domain");
    }
  }
}

void ClaimStatus(Errors& e, const json& claim, const json* old) {
  const json& status = Obj(claim, "status");
  const json& results = Arr(Obj(Obj(status, "allocation"), "devices"), "results");
  if (results.size() > 32) e.TooMany("status.allocation.devices.results", results.size(), 32);
  std::set<std::string> names;
  for (const auto& r : Arr(Obj(Obj(claim, "spec"), "devices"), "requests")) {
    names.insert(Str(r, "name"));
    for (const auto& s : Arr(r, "firstAvailable")) names.insert(Cat(Str(r, "name"), "/", Str(s, "name")));
  }
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string p = Cat("status.allocation.devices.results[", i, "]");
    const std::string req = Str(results[i], "request");
    if (req.empty()) {
      e.Required(Cat(p, ".request"));
    } else if (!names.contains(req)) {
      e.Invalid(
          Cat(p, ".request"), req,
          "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'");
    }
    DnsSubdomain(e, Cat(p, ".driver"), results[i], "driver", 63);
    if (Str(results[i], "pool").empty()) e.Required(Cat(p, ".pool"));
    DnsLabel(e, Cat(p, ".device"), Str(results[i], "device"));
  }
  const json& config = Arr(Obj(Obj(status, "allocation"), "devices"), "config");
  if (config.size() > 64) e.TooMany("status.allocation.devices.config", config.size(), 64);
  const json& reserved = Arr(status, "reservedFor");
  if (reserved.size() > 256) e.TooMany("status.reservedFor", reserved.size(), 256);
  if (!reserved.empty() && !status.contains("allocation")) {
    e.Forbidden("status.reservedFor", "may not be specified when `allocated` is not set");
  }
  std::set<std::string> uids;
  for (size_t i = 0; i < reserved.size(); ++i) {
    const std::string p = Cat("status.reservedFor[", i, "]");
    for (const char* k : {"resource", "name", "uid"}) {
      if (Str(reserved[i], k).empty()) e.Required(Cat(p, ".", k));
    }
    const std::string uid = Str(reserved[i], "uid");
    if (!uid.empty() && !uids.insert(uid).second) e.Duplicate(Cat(p, ".uid"), uid);
  }
  if (old != nullptr) {
    const json& before = Obj(*old, "status");
    if (before.contains("allocation") && status.contains("allocation") &&
        before["allocation"] != status["allocation"]) {
      e.Invalid("status.allocation", "...", "field is immutable");
    }
    if (before.contains("allocation") && !status.contains("allocation") && !Arr(before, "reservedFor").empty() &&
        !reserved.empty()) {
      e.Forbidden("status.allocation", "deallocation of a reserved resource is not allowed");
    }
  }
  const json& devices = Arr(status, "devices");
  for (size_t i = 0; i < devices.size(); ++i) {
    const std::string p = Cat("status.devices[", i, "]");
    DnsSubdomain(e, Cat(p, ".driver"), devices[i], "driver", 63);
    if (Str(devices[i], "pool").empty()) e.Required(Cat(p, ".pool"));
    DnsLabel(e, Cat(p, ".device"), Str(devices[i], "device"));
    if (Arr(devices[i], "conditions").size() > 8)
      e.TooMany(Cat(p, ".conditions"), Arr(devices[i], "conditions").size(), 8);
    bool allocated = false;
    for (const auto& r : results) {
      allocated =
          allocated || (Str(r, "driver") == Str(devices[i], "driver") && Str(r, "pool") == Str(devices[i], "pool") &&
                        Str(r, "device") == Str(devices[i], "device"));
    }
    if (!allocated) {
      e.Invalid(p, Cat(Str(devices[i], "driver"), "/", Str(devices[i], "pool"), "/", Str(devices[i], "device")),
                "must be an allocated device in the claim");
    }
  }
}

}  // namespace

std::vector<FieldError> ValidateDra(const std::string& kind, const json& obj, const json* old, int minor, bool status) {
  Errors e;
  const json& spec = Obj(obj, "spec");
  if (kind == "ResourceSlice") {
    SliceSpec(e, spec, minor);
    if (old != nullptr) {
      const json& before = Obj(*old, "spec");
      for (const char* f : {"driver", "nodeName"}) {
        if (Str(before, f) != Str(spec, f)) e.Invalid(Cat("spec.", f), Str(spec, f), "field is immutable");
      }
      if (Str(Obj(before, "pool"), "name") != Str(Obj(spec, "pool"), "name")) {
        e.Invalid("spec.pool.name", Str(Obj(spec, "pool"), "name"), "field is immutable");
      }
    }
  } else if (kind == "DeviceClass") {
    ClassSpec(e, spec);
  } else if (kind == "ResourceClaim") {
    if (status) {
      ClaimStatus(e, obj, old);
    } else {
      ClaimSpec(e, "spec", spec);
      if (old != nullptr && Obj(*old, "spec") != spec) e.Invalid("spec", "...", "field is immutable");
    }
  } else if (kind == "ResourceClaimTemplate") {
    ClaimSpec(e, "spec.spec", Obj(spec, "spec"));
    if (old != nullptr && Obj(*old, "spec") != spec) e.Invalid("spec", "...", "field is immutable");
  }
  return e.Take();
}

void SetDraGeneration(json& obj, const json* old) {
  if (!obj["metadata"].is_object()) obj["metadata"] = json::object();
  if (obj.value("kind", "") == "ResourceSlice" && obj.contains("spec") && obj["spec"].contains("devices") &&
      obj["spec"]["devices"].is_array()) {
    for (auto& d : obj["spec"]["devices"]) {
      if (!d.is_object() || !d.contains("taints") || !d["taints"].is_array()) continue;
      for (auto& t : d["taints"]) {
        if (t.is_object() && !t.contains("timeAdded")) t["timeAdded"] = k8s::NowRfc3339();
      }
    }
  }
  if (old == nullptr) {
    obj["metadata"]["generation"] = 1;
    return;
  }
  const int64_t before = Obj(*old, "metadata").value("generation", int64_t{1});
  obj["metadata"]["generation"] = Obj(*old, "spec") == Obj(obj, "spec") ? before : before + 1;
}

}  // namespace kgpu::testing
