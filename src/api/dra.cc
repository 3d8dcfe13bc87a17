#include "api/dra.h"

#include <cctype>

#include "common/strings.h"

namespace kgpu::api::dra {

using nlohmann::json;

std::string CounterName(std::string_view capacity) {
  std::string out;
  for (size_t i = 0; i < capacity.size(); ++i) {
    const auto c = static_cast<unsigned char>(capacity[i]);
    if (std::isupper(c) && i > 0) {
      const auto prev = static_cast<unsigned char>(capacity[i - 1]);
      const bool next_lower = i + 1 < capacity.size() && std::islower(static_cast<unsigned char>(capacity[i + 1]));
      // "copyEngines" -> copy-engines; "HTTPServer" -> http-server
      if (std::islower(prev) || std::isdigit(prev) || (std::isupper(prev) && next_lower)) out.push_back('-');
    }
    out.push_back(static_cast<char>(std::tolower(c)));
  }
  return out;
}

std::string MemorySliceCounter(unsigned slice) {
  return Cat("memory-slice-", slice);
}

std::string GpuDeviceName(unsigned minor) {
  return Cat("gpu-", minor);
}

std::string CounterSetName(unsigned minor) {
  return Cat("gpu-", minor, "-counter-set");
}

std::string MigDeviceName(unsigned parent_minor, std::string_view profile, unsigned profile_id,
                          unsigned placement_start) {
  // NVIDIA's ToCanonicalName: dots removed, then RFC 1123 (lower case, anything else a hyphen,
  // hyphens trimmed): "1g.10gb+me" -> "1g10gb-me".
  std::string p;
  for (char ch : profile) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '.') continue;
    p.push_back(std::isalnum(c) || c == '-' ? static_cast<char>(std::tolower(c)) : '-');
  }
  const size_t b = p.find_first_not_of('-');
  p = b == std::string::npos ? "" : p.substr(b, p.find_last_not_of('-') - b + 1);
  return Cat("gpu-", parent_minor, "-mig-", p, "-", profile_id, "-", placement_start);
}

bool IsDnsSubdomain(std::string_view name, size_t max_size) {
  if (name.empty() || name.size() > max_size) return false;
  size_t start = 0;
  while (start <= name.size()) {
    const size_t dot = name.find('.', start);
    const std::string_view label = name.substr(start, dot == std::string_view::npos ? name.npos : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    for (char c : label) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
    }
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return true;
}

std::string BinaryQuantity(uint64_t value) {
  static constexpr const char* kSuffix[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  size_t k = 0;
  while (value != 0 && value % 1024 == 0 && k + 1 < std::size(kSuffix)) {
    value /= 1024;
    ++k;
  }
  return Cat(value, kSuffix[k]);
}

std::optional<std::string> SemVer(std::string_view dotted) {
  std::vector<uint64_t> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    const std::string_view part = dotted.substr(start, dot == std::string_view::npos ? dotted.npos : dot - start);
    if (part.empty() || part.size() > 18) return std::nullopt;
    uint64_t v = 0;
    for (char c : part) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    parts.push_back(v);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  if (parts.size() > 3) return std::nullopt;
  parts.resize(3, 0);
  return Cat(parts[0], ".", parts[1], ".", parts[2]);
}

namespace {

json AttributeJson(const Attribute& a) {
  switch (a.kind) {
    case Attribute::Kind::kInt:
      return {{"int", a.int_value}};
    case Attribute::Kind::kBool:
      return {{"bool", a.bool_value}};
    case Attribute::Kind::kVersion:
      return {{"version", a.text}};
    case Attribute::Kind::kString:
      break;
  }
  return {{"string", a.text}};
}

json CountersJson(const std::map<std::string, std::string>& counters) {
  json out = json::object();
  for (const auto& [name, value] : counters) out[name] = {{"value", value}};
  return out;
}

json DeviceJson(const Device& d) {
  json out = {{"name", d.name}};
  if (!d.attributes.empty()) {
    json& attrs = out["attributes"] = json::object();
    for (const auto& [name, a] : d.attributes) attrs[name] = AttributeJson(a);
  }
  if (!d.capacity.empty()) {
    json& caps = out["capacity"] = json::object();
    for (const auto& [name, c] : d.capacity) {
      json cap = {{"value", c.value}};
      if (c.policy) {
        json policy = json::object();
        if (!c.policy->default_value.empty()) policy["default"] = c.policy->default_value;
        if (!c.policy->min.empty()) {
          json range = {{"min", c.policy->min}};
          if (!c.policy->max.empty()) range["max"] = c.policy->max;
          if (!c.policy->step.empty()) range["step"] = c.policy->step;
          policy["validRange"] = std::move(range);
        }
        cap["requestPolicy"] = std::move(policy);
      }
      caps[name] = std::move(cap);
    }
  }
  if (!d.consumes_counters.empty()) {
    json& list = out["consumesCounters"] = json::array();
    for (const auto& c : d.consumes_counters) {
      list.push_back({{"counterSet", c.counter_set}, {"counters", CountersJson(c.counters)}});
    }
  }
  if (d.allow_multiple_allocations) out["allowMultipleAllocations"] = true;
  if (!d.taints.empty()) {
    json& list = out["taints"] = json::array();
    for (const auto& t : d.taints) {
      json taint = {{"key", t.key}, {"effect", t.effect}};
      if (!t.value.empty()) taint["value"] = t.value;
      if (!t.time_added.empty()) taint["timeAdded"] = t.time_added;
      list.push_back(std::move(taint));
    }
  }
  return out;
}

}  // namespace

json ToJson(const ResourceSlice& slice) {
  json spec = {
      {"driver", slice.driver},
      {"nodeName", slice.node_name},
      {"pool", {{"name", slice.pool}, {"generation", slice.generation}, {"resourceSliceCount", slice.slice_count}}},
  };
  if (!slice.devices.empty()) {
    json& devices = spec["devices"] = json::array();
    for (const auto& d : slice.devices) devices.push_back(DeviceJson(d));
  }
  if (!slice.shared_counters.empty()) {
    json& sets = spec["sharedCounters"] = json::array();
    for (const auto& s : slice.shared_counters)
      sets.push_back({{"name", s.name}, {"counters", CountersJson(s.counters)}});
  }
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceSlice"},
          {"metadata", {{"name", slice.name}}},
          {"spec", std::move(spec)}};
}

}  // namespace kgpu::api::dra
