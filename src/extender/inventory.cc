#include "extender/inventory.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "common/strings.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;

absl::Status Bad(const std::string& node, const std::string& field, std::string_view what) {
  return absl::InvalidArgumentError(Cat("node ", node, ": annotation ", kInventoryAnnotation, ": ", field, ": ", what,
                                        " (re-run kgpu node-labels on the node)"));
}

// Optional members of the annotation: absent -> `def`; present with another JSON type -> an error
// naming the field (json::value would throw, and one node's broken annotation must not take the
// extender down).
absl::StatusOr<std::string> Str(const std::string& node, const json& obj, const char* key, const std::string& where,
                                std::string def) {
  const auto it = obj.find(key);
  if (it == obj.end()) return def;
  if (!it->is_string()) return Bad(node, Cat(where, where.empty() ? "" : ".", key), "expected a string");
  return it->get<std::string>();
}

absl::StatusOr<int64_t> Int(const std::string& node, const json& obj, const char* key, const std::string& where,
                            int64_t def) {
  const auto it = obj.find(key);
  if (it == obj.end()) return def;
  if (!it->is_number_integer()) return Bad(node, Cat(where, where.empty() ? "" : ".", key), "expected an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT32_MAX}) {
    return Bad(node, Cat(where, where.empty() ? "" : ".", key), "out of range");
  }
  if (it->get<int64_t>() < INT32_MIN) return Bad(node, Cat(where, where.empty() ? "" : ".", key), "out of range");
  return it->get<int64_t>();
}

}  // namespace

const GpuInfo* NodeInfo::FindUuid(const std::string& uuid) const {
  for (const auto& g : gpus) {
    if (g.uuid == uuid) return &g;
  }
  return nullptr;
}

int NodeInfo::IndexOfUuid(const std::string& uuid) const {
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i].uuid == uuid) return static_cast<int>(i);
  }
  return -1;
}

int MigSlices(const std::string& profile) {
  // "<N>g.<mem>gb", optionally "<C>c.<N>g.<mem>gb" (a compute-instance profile) or "+me" suffixes.
  size_t g = profile.find('g');
  if (g == std::string::npos) return 0;
  size_t start = g;
  while (start > 0 && std::isdigit(static_cast<unsigned char>(profile[start - 1]))) --start;
  if (start == g) return 0;
  const int n = std::stoi(profile.substr(start, std::min<size_t>(g - start, 2)));
  return n >= 1 && n <= 7 ? n : 0;
}

absl::StatusOr<NodeInfo> ParseInventoryAnnotation(const std::string& name, const std::string& text) {
  NodeInfo n;
  n.name = name;
  n.annotation = text;
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return Bad(name, "value", "not a JSON object");
  if (auto v = Int(name, doc, "v", "", 0); !v.ok() || *v != 1) return Bad(name, "v", "format version 1 expected");
  const auto gpus = doc.find("gpus");
  if (gpus == doc.end() || !gpus->is_array()) return Bad(name, "gpus", "expected an array");
  for (size_t i = 0; i < gpus->size(); ++i) {
    const json& g = (*gpus)[i];
    const std::string where = Cat("gpus[", i, "]");
    if (!g.is_object()) return Bad(name, where, "expected an object");
    GpuInfo gi;
    if (!g.contains("uuid") || !g["uuid"].is_string()) return Bad(name, where + ".uuid", "missing");
    gi.uuid = g["uuid"].get<std::string>();
    auto index = Int(name, g, "i", where, static_cast<int64_t>(i));
    auto model = Str(name, g, "model", where, "");
    auto health = Str(name, g, "health", where, "ok");
    auto slots = Int(name, g, "slots", where, 0);
    for (const absl::Status& st : {index.status(), model.status(), health.status(), slots.status()}) {
      if (!st.ok()) return st;
    }
    gi.index = static_cast<int>(*index);
    gi.model = model->empty() ? "unknown" : *model;
    if (g.contains("memMiB") && !g["memMiB"].is_number_integer()) return Bad(name, where + ".memMiB", "expected an integer");
    gi.memory_mib = g.value("memMiB", int64_t{0});
    if (gi.memory_mib < 0) return Bad(name, where + ".memMiB", "must be >= 0");
    gi.healthy = *health == "ok";
    gi.slots = static_cast<int>(std::max<int64_t>(0, *slots));
    if (g.contains("usedMiB")) {
      if (!g["usedMiB"].is_number_integer() || g["usedMiB"].get<int64_t>() < 0) {
        return Bad(name, where + ".usedMiB", "expected an integer >= 0");
      }
      gi.used_mib = g["usedMiB"].get<int64_t>();
    }
    if (const auto mig = g.find("mig"); mig != g.end() && mig->is_array()) {
      for (const auto& m : *mig) {
        if (!m.is_object()) return Bad(name, where + ".mig", "expected objects");
        auto uuid = Str(name, m, "uuid", where + ".mig", "");
        auto profile = Str(name, m, "profile", where + ".mig", "");
        if (!uuid.ok()) return uuid.status();
        if (!profile.ok()) return profile.status();
        if (m.contains("memMiB") && !m["memMiB"].is_number_integer()) return Bad(name, where + ".mig.memMiB", "expected an integer");
        MigInfo mi{*uuid, *profile, m.value("memMiB", int64_t{0})};
        if (MigSlices(mi.profile) == 0) return Bad(name, where + ".mig.profile", Cat("'", Printable(mi.profile), "' is not a MIG profile"));
        gi.mig.push_back(std::move(mi));
      }
    }
    n.gpus.push_back(std::move(gi));
  }
  if (const auto isl = doc.find("nvlinkIslands"); isl != doc.end() && isl->is_array()) {
    for (size_t k = 0; k < isl->size(); ++k) {
      if (!(*isl)[k].is_array()) return Bad(name, "nvlinkIslands", "expected arrays of GPU indices");
      for (const auto& idx : (*isl)[k]) {
        if (!idx.is_number_integer() || idx.get<int64_t>() < INT32_MIN || idx.get<int64_t>() > INT32_MAX) {
          return Bad(name, "nvlinkIslands", "expected GPU indices");
        }
        for (auto& g : n.gpus) {
          if (g.index == idx.get<int>()) g.island = static_cast<int>(k);
        }
      }
    }
  }
  auto strategy = Str(name, doc, "migStrategy", "", "none");
  if (!strategy.ok()) return strategy.status();
  n.mig_strategy = *strategy;
  if (const auto sh = doc.find("sharing"); sh != doc.end() && sh->is_object()) {
    if (const auto k = sh->find("kgpu"); k != sh->end() && k->is_object()) {
      if (const auto e = k->find("enforcement"); e != k->end() && e->is_array() && !e->empty()) {
        n.enforcement.clear();
        for (const auto& m : *e) {
          if (!m.is_string()) return Bad(name, "sharing.kgpu.enforcement", "expected strings");
          n.enforcement.push_back(m.get<std::string>());
        }
      }
    }
  }
  return n;
}

absl::StatusOr<NodeInfo> ParseNodeInventory(const json& node) {
  const json meta = node.value("metadata", json::object());
  const std::string name = meta.value("name", "");
  const json ann = meta.value("annotations", json::object());
  const auto it = ann.find(kInventoryAnnotation);
  if (it == ann.end() || !it->is_string()) {
    return absl::NotFoundError(Cat("node ", name, " has no ", kInventoryAnnotation,
                                   " annotation (run kgpu node-labels there)"));
  }
  return ParseInventoryAnnotation(name, it->get<std::string>());
}

sched::NodeSpec ToNodeSpec(const NodeInfo& n) {
  sched::NodeSpec s;
  s.name = n.name;
  // CPU and memory are kube-scheduler's business: the engine sees no limit there.
  s.cpu_milli = 0;
  s.memory_mib = 0;
  s.max_pods = 1 << 20;
  for (const auto& g : n.gpus) {
    sched::GpuSpec gs;
    gs.model = g.slots > 0 ? kShareModelPrefix + g.model : !g.mig.empty() ? kMigModelPrefix + g.model : g.model;
    gs.memory_mib = g.memory_mib;
    gs.healthy = g.healthy;
    gs.nvlink_island = g.island;
    gs.max_shares = g.slots;
    if (g.slots == 0) {
      for (const auto& m : g.mig) {
        const int slices = MigSlices(m.profile);
        gs.mig.push_back({m.profile, slices, m.memory_mib, slices * sched::kMilli / 7});
      }
    }
    s.gpus.push_back(std::move(gs));
  }
  return s;
}

std::string StaticShape(const NodeInfo& node) {
  std::string out = Join(node.enforcement, ",");
  for (const auto& g : node.gpus) {
    // Names carry their length: no model or profile name can make two shapes look alike.
    out += Cat("|", g.slots > 0 ? "s" : "w", g.healthy ? "+" : "-", g.memory_mib, ":", g.model.size(), ":", g.model);
    for (const auto& m : g.mig) out += Cat(";", m.profile.size(), ":", m.profile);
  }
  return out;
}

}  // namespace kgpu::extender
