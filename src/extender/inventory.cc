#include "extender/inventory.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "api/inventory.h"
#include "api/names.h"
#include "common/strings.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;
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
  return api::MigSlices(profile);
}

absl::StatusOr<NodeInfo> ParseInventoryAnnotation(const std::string& name, const std::string& text) {
  // The annotation's one parser (api/inventory.h), then the extender's view of it.
  auto inv = api::ParseInventory(name, text);
  if (!inv.ok()) return inv.status();
  NodeInfo n;
  n.name = name;
  n.annotation = text;
  for (const auto& g : inv->gpus) {
    GpuInfo gi;
    gi.index = g.index;
    gi.uuid = g.uuid;
    gi.model = g.model;
    gi.memory_mib = g.memory_mib;
    gi.healthy = g.health == "ok";
    gi.slots = g.slots;
    gi.used_mib = g.used_mib;
    for (const auto& m : g.mig) gi.mig.push_back({m.uuid, m.profile, m.memory_mib});
    n.gpus.push_back(std::move(gi));
  }
  for (size_t k = 0; k < inv->nvlink_islands.size(); ++k) {
    for (int idx : inv->nvlink_islands[k]) {
      for (auto& g : n.gpus) {
        if (g.index == idx) g.island = static_cast<int>(k);
      }
    }
  }
  n.mig_strategy = inv->mig_strategy;
  n.enforcement = inv->EnforcementOrDefault();
  return n;
}

absl::StatusOr<NodeInfo> ParseNodeInventory(const json& node) {
  const json meta = node.value("metadata", json::object());
  const std::string name = meta.value("name", "");
  const json ann = meta.value("annotations", json::object());
  const auto it = ann.find(kInventoryAnnotation);
  if (it == ann.end() || !it->is_string()) {
    return absl::NotFoundError(
        Cat("node ", name, " has no ", kInventoryAnnotation, " annotation (run kgpu node-labels there)"));
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
        // The engine names an instance as the pod's resource does ("1g.10gb+me" as
        // nvidia.com/mig-1g.10gb.me asks for it); the record keeps NVML's name.
        const int slices = MigSlices(m.profile);
        gs.mig.push_back({api::MigResourceProfile(m.profile), slices, m.memory_mib, slices * sched::kMilli / 7});
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
