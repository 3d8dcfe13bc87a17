#include "extender/inventory.h"

#include <algorithm>
#include <cctype>

#include "common/strings.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;

absl::Status Bad(const std::string& node, const std::string& field, std::string_view what) {
  return absl::InvalidArgumentError(Cat("node ", node, ": annotation ", kInventoryAnnotation, ": ", field, ": ", what,
                                        " (re-run kgpu node-labels on the node)"));
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
  if (doc.value("v", 0) != 1) return Bad(name, "v", "format version 1 expected");
  const auto gpus = doc.find("gpus");
  if (gpus == doc.end() || !gpus->is_array()) return Bad(name, "gpus", "expected an array");
  for (size_t i = 0; i < gpus->size(); ++i) {
    const json& g = (*gpus)[i];
    const std::string where = Cat("gpus[", i, "]");
    if (!g.is_object()) return Bad(name, where, "expected an object");
    GpuInfo gi;
    if (!g.contains("uuid") || !g["uuid"].is_string()) return Bad(name, where + ".uuid", "missing");
    gi.uuid = g["uuid"].get<std::string>();
    gi.index = g.value("i", static_cast<int>(i));
    gi.model = g.value("model", "");
    if (gi.model.empty()) gi.model = "unknown";
    if (g.contains("memMiB") && !g["memMiB"].is_number_integer()) return Bad(name, where + ".memMiB", "expected an integer");
    gi.memory_mib = g.value("memMiB", int64_t{0});
    if (gi.memory_mib < 0) return Bad(name, where + ".memMiB", "must be >= 0");
    gi.healthy = g.value("health", "ok") == "ok";
    if (g.contains("slots") && !g["slots"].is_number_integer()) return Bad(name, where + ".slots", "expected an integer");
    gi.slots = std::max(0, g.value("slots", 0));
    if (const auto mig = g.find("mig"); mig != g.end() && mig->is_array()) {
      for (const auto& m : *mig) {
        if (!m.is_object()) return Bad(name, where + ".mig", "expected objects");
        MigInfo mi{m.value("uuid", ""), m.value("profile", ""), m.value("memMiB", int64_t{0})};
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
        if (!idx.is_number_integer()) return Bad(name, "nvlinkIslands", "expected GPU indices");
        for (auto& g : n.gpus) {
          if (g.index == idx.get<int>()) g.island = static_cast<int>(k);
        }
      }
    }
  }
  n.mig_strategy = doc.value("migStrategy", "none");
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

}  // namespace kgpu::extender
