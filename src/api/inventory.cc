#include "api/inventory.h"

#include <algorithm>
#include <cctype>
#include <climits>

#include <nlohmann/json.hpp>

#include "api/names.h"
#include "common/strings.h"

namespace kgpu::api {
namespace {
using json = nlohmann::json;

absl::Status Bad(std::string_view node, const std::string& field, std::string_view what) {
  return absl::InvalidArgumentError(Cat("node ", node, ": annotation ", kInventoryAnnotation, ": ", field, ": ", what,
                                        " (re-run kgpu node-labels on the node)"));
}

std::string Field(const std::string& where, const char* key) {
  return Cat(where, where.empty() ? "" : ".", key);
}

// Optional members: absent -> `def`; present with another JSON type -> an error naming the field
// (json::value would throw, and one node's broken annotation must not take a reader down).
absl::StatusOr<std::string> Str(std::string_view node, const json& obj, const char* key, const std::string& where,
                                std::string def) {
  const auto it = obj.find(key);
  if (it == obj.end()) return def;
  if (!it->is_string()) return Bad(node, Field(where, key), "expected a string");
  return it->get<std::string>();
}

absl::StatusOr<int64_t> Int(std::string_view node, const json& obj, const char* key, const std::string& where,
                            int64_t def) {
  const auto it = obj.find(key);
  if (it == obj.end()) return def;
  if (!it->is_number_integer()) return Bad(node, Field(where, key), "expected an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT32_MAX}) {
    return Bad(node, Field(where, key), "out of range");
  }
  if (it->get<int64_t>() < INT32_MIN) return Bad(node, Field(where, key), "out of range");
  return it->get<int64_t>();
}

// A memory figure: absent -> `def`; else an integer >= 0.
absl::StatusOr<int64_t> Mib(std::string_view node, const json& obj, const char* key, const std::string& where,
                            int64_t def, const char* expected = "expected an integer") {
  const auto it = obj.find(key);
  if (it == obj.end()) return def;
  if (!it->is_number_integer()) return Bad(node, Field(where, key), expected);
  if (it->get<int64_t>() < 0) return Bad(node, Field(where, key), def < 0 ? expected : "must be >= 0");
  return it->get<int64_t>();
}

absl::StatusOr<std::vector<std::vector<int>>> Islands(std::string_view node, const json& doc, const char* key) {
  std::vector<std::vector<int>> out;
  const auto isl = doc.find(key);
  if (isl == doc.end() || !isl->is_array()) return out;
  for (const auto& island : *isl) {
    if (!island.is_array()) return Bad(node, key, "expected arrays of GPU indices");
    std::vector<int> ids;
    for (const auto& idx : island) {
      if (!idx.is_number_integer() || idx.get<int64_t>() < INT32_MIN || idx.get<int64_t>() > INT32_MAX) {
        return Bad(node, key, "expected GPU indices");
      }
      ids.push_back(idx.get<int>());
    }
    out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace

int MigSlices(std::string_view profile) {
  // "<N>g.<mem>gb", optionally "<C>c.<N>g.<mem>gb" (a compute-instance profile) or "+me" suffixes.
  const size_t g = profile.find('g');
  if (g == std::string_view::npos) return 0;
  size_t start = g;
  while (start > 0 && std::isdigit(static_cast<unsigned char>(profile[start - 1]))) --start;
  if (start == g) return 0;
  int n = 0;
  for (size_t i = start; i < g && i < start + 2; ++i) n = n * 10 + (profile[i] - '0');
  return n >= 1 && n <= 7 ? n : 0;
}

std::string EncodeInventory(const NodeInventory& inv) {
  json gpus = json::array();
  for (const auto& g : inv.gpus) {
    json e = {{"i", g.index},           {"uuid", g.uuid}, {"model", g.model},
              {"memMiB", g.memory_mib}, {"numa", g.numa}, {"health", g.health}};
    if (g.slots > 0) e["slots"] = g.slots;
    if (g.used_mib >= 0) e["usedMiB"] = g.used_mib;
    if (g.mig_enabled) {
      json migs = json::array();
      for (const auto& m : g.mig) {
        migs.push_back({{"uuid", m.uuid},
                        {"profile", m.profile},
                        {"gi", m.gi},
                        {"ci", m.ci},
                        {"memMiB", m.memory_mib},
                        {"health", m.health}});
      }
      e["mig"] = migs;
    }
    gpus.push_back(e);
  }
  json sharing = {{"mode", inv.sharing_mode}};
  if (!inv.replicas.empty()) sharing["replicas"] = inv.replicas;
  if (!inv.enforcement.empty()) sharing["kgpu"] = {{"enforcement", inv.enforcement}};
  const json doc = {
      {"v", 1},
      {"gpus", gpus},
      {"nvlinkIslands", inv.nvlink_islands},
      {"pcieIslands", inv.pcie_islands},
      {"migStrategy", inv.mig_strategy},
      {"sharing", sharing},
  };
  return doc.dump();
}

absl::StatusOr<NodeInventory> ParseInventory(std::string_view name, std::string_view text) {
  NodeInventory n;
  const json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return Bad(name, "value", "not a JSON object");
  if (auto v = Int(name, doc, "v", "", 0); !v.ok() || *v != 1) return Bad(name, "v", "format version 1 expected");
  const auto gpus = doc.find("gpus");
  if (gpus == doc.end() || !gpus->is_array()) return Bad(name, "gpus", "expected an array");
  for (size_t i = 0; i < gpus->size(); ++i) {
    const json& g = (*gpus)[i];
    const std::string where = Cat("gpus[", i, "]");
    if (!g.is_object()) return Bad(name, where, "expected an object");
    InventoryGpu gi;
    if (!g.contains("uuid") || !g["uuid"].is_string()) return Bad(name, where + ".uuid", "missing");
    gi.uuid = g["uuid"].get<std::string>();
    auto index = Int(name, g, "i", where, static_cast<int64_t>(i));
    auto model = Str(name, g, "model", where, "");
    auto health = Str(name, g, "health", where, "ok");
    auto slots = Int(name, g, "slots", where, 0);
    auto numa = Int(name, g, "numa", where, -1);
    auto memory = Mib(name, g, "memMiB", where, 0);
    auto used = Mib(name, g, "usedMiB", where, -1, "expected an integer >= 0");
    for (const absl::Status& st : {index.status(), model.status(), health.status(), slots.status(), numa.status(),
                                   memory.status(), used.status()}) {
      if (!st.ok()) return st;
    }
    gi.index = static_cast<int>(*index);
    gi.model = model->empty() ? "unknown" : *model;
    gi.memory_mib = *memory;
    gi.numa = static_cast<int>(*numa);
    gi.health = *health;
    gi.slots = static_cast<int>(std::max<int64_t>(0, *slots));
    gi.used_mib = *used;
    if (const auto mig = g.find("mig"); mig != g.end() && mig->is_array()) {
      gi.mig_enabled = true;
      for (const auto& m : *mig) {
        if (!m.is_object()) return Bad(name, where + ".mig", "expected objects");
        auto uuid = Str(name, m, "uuid", where + ".mig", "");
        auto profile = Str(name, m, "profile", where + ".mig", "");
        auto mig_health = Str(name, m, "health", where + ".mig", "ok");
        auto gi_id = Int(name, m, "gi", where + ".mig", 0);
        auto ci_id = Int(name, m, "ci", where + ".mig", 0);
        auto mem = Mib(name, m, "memMiB", where + ".mig", 0);
        for (const absl::Status& st :
             {uuid.status(), profile.status(), mig_health.status(), gi_id.status(), ci_id.status(), mem.status()}) {
          if (!st.ok()) return st;
        }
        if (MigSlices(*profile) == 0) {
          return Bad(name, where + ".mig.profile", Cat("'", Printable(*profile), "' is not a MIG profile"));
        }
        gi.mig.push_back({*uuid, *profile, static_cast<int>(*gi_id), static_cast<int>(*ci_id), *mem, *mig_health});
      }
    }
    n.gpus.push_back(std::move(gi));
  }
  for (auto [key, out] : {std::pair{"nvlinkIslands", &n.nvlink_islands}, std::pair{"pcieIslands", &n.pcie_islands}}) {
    auto islands = Islands(name, doc, key);
    if (!islands.ok()) return islands.status();
    *out = std::move(*islands);
  }
  auto strategy = Str(name, doc, "migStrategy", "", "none");
  if (!strategy.ok()) return strategy.status();
  n.mig_strategy = *strategy;
  if (const auto sh = doc.find("sharing"); sh != doc.end() && sh->is_object()) {
    auto mode = Str(name, *sh, "mode", "sharing", "none");
    if (!mode.ok()) return mode.status();
    n.sharing_mode = *mode;
    if (const auto r = sh->find("replicas"); r != sh->end() && r->is_object()) {
      for (auto it = r->begin(); it != r->end(); ++it) {
        if (!it.value().is_number_integer())
          return Bad(name, Cat("sharing.replicas.", it.key()), "expected an integer");
        n.replicas[it.key()] = it.value().get<int>();
      }
    }
    if (const auto k = sh->find("kgpu"); k != sh->end() && k->is_object()) {
      if (const auto e = k->find("enforcement"); e != k->end() && e->is_array()) {
        for (const auto& m : *e) {
          if (!m.is_string()) return Bad(name, "sharing.kgpu.enforcement", "expected strings");
          n.enforcement.push_back(m.get<std::string>());
        }
      }
    }
  }
  return n;
}

}  // namespace kgpu::api
