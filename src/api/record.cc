#include "api/record.h"

#include <nlohmann/json.hpp>

#include "api/names.h"
#include "common/strings.h"

namespace kgpu::api {
namespace {
using json = nlohmann::json;
constexpr std::string_view kWhere = api::kAnnotationAllocation;

absl::Status Bad(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(Cat(kWhere, ": ", field, ": ", what));
}

absl::StatusOr<std::string> Str(const json& o, const char* key, const std::string& where, bool required) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) {
    if (required) return Bad(Cat(where, ".", key), "missing");
    return std::string();
  }
  if (!it->is_string()) return Bad(Cat(where, ".", key), "expected a string");
  return it->get<std::string>();
}

absl::StatusOr<int64_t> Int(const json& o, const char* key, const std::string& where) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 0) return Bad(Cat(where, ".", key), "expected an integer >= 0");
  return it->get<int64_t>();
}

}  // namespace

absl::StatusOr<std::optional<AllocationRecord>> RecordOnPod(const json& pod) {
  const auto meta = pod.find("metadata");
  if (meta == pod.end() || !meta->is_object()) return std::nullopt;
  const auto ann = meta->find("annotations");
  if (ann == meta->end() || !ann->is_object()) return std::nullopt;
  const auto it = ann->find(std::string(kWhere));
  if (it == ann->end() || !it->is_string()) return std::nullopt;
  auto r = ParseRecord(it->get<std::string>());
  if (!r.ok()) return r.status();
  return std::optional<AllocationRecord>(std::move(*r));
}

std::string EncodeRecord(const AllocationRecord& r) {
  json containers = json::array();
  for (const auto& c : r.containers) {
    json gpus = json::array();
    for (const auto& g : c.gpus) {
      json e = {{"uuid", g.uuid}};
      if (!g.mig.empty()) e["mig"] = g.mig;
      if (!g.profile.empty()) e["profile"] = g.profile;
      if (g.memory_mib > 0) e["memMiB"] = g.memory_mib;
      if (g.cores > 0) e["cores"] = g.cores;
      gpus.push_back(std::move(e));
    }
    json e = {{"name", c.name}, {"resource", c.resource}, {"gpus", std::move(gpus)}};
    if (!c.enforcement.empty()) e["enforcement"] = c.enforcement;
    containers.push_back(std::move(e));
  }
  return json{{"v", 1}, {"node", r.node}, {"containers", std::move(containers)}}.dump(-1, ' ', false,
                                                                                      json::error_handler_t::replace);
}

absl::StatusOr<AllocationRecord> ParseRecord(std::string_view text) {
  json doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return absl::InvalidArgumentError(Cat(kWhere, ": not a JSON object"));
  const auto v = doc.find("v");
  if (v == doc.end() || !v->is_number_integer() || v->get<int64_t>() != 1) {
    return Bad("v", "format version 1 expected (written by a different kgpu version?)");
  }
  AllocationRecord r;
  auto node = Str(doc, "node", "record", true);
  if (!node.ok()) return node.status();
  r.node = *node;
  const auto cs = doc.find("containers");
  if (cs == doc.end() || !cs->is_array()) return Bad("containers", "expected an array");
  for (size_t i = 0; i < cs->size(); ++i) {
    const json& c = (*cs)[i];
    const std::string where = Cat("containers[", i, "]");
    if (!c.is_object()) return Bad(where, "expected an object");
    RecordContainer rc;
    auto name = Str(c, "name", where, true);
    if (!name.ok()) return name.status();
    rc.name = *name;
    auto res = Str(c, "resource", where, true);
    if (!res.ok()) return res.status();
    rc.resource = *res;
    auto enf = Str(c, "enforcement", where, false);
    if (!enf.ok()) return enf.status();
    rc.enforcement = *enf;
    const auto gs = c.find("gpus");
    if (gs == c.end() || !gs->is_array() || gs->empty()) return Bad(Cat(where, ".gpus"), "expected a non-empty array");
    for (size_t j = 0; j < gs->size(); ++j) {
      const json& g = (*gs)[j];
      const std::string gw = Cat(where, ".gpus[", j, "]");
      if (!g.is_object()) return Bad(gw, "expected an object");
      RecordGpu rg;
      auto uuid = Str(g, "uuid", gw, true);
      if (!uuid.ok()) return uuid.status();
      rg.uuid = *uuid;
      auto mig = Str(g, "mig", gw, false);
      if (!mig.ok()) return mig.status();
      rg.mig = *mig;
      auto prof = Str(g, "profile", gw, false);
      if (!prof.ok()) return prof.status();
      rg.profile = *prof;
      auto mem = Int(g, "memMiB", gw);
      if (!mem.ok()) return mem.status();
      rg.memory_mib = *mem;
      auto cores = Int(g, "cores", gw);
      if (!cores.ok()) return cores.status();
      if (*cores > 100) return Bad(Cat(gw, ".cores"), "at most 100 (percent of one GPU)");
      rg.cores = *cores;
      rc.gpus.push_back(std::move(rg));
    }
    r.containers.push_back(std::move(rc));
  }
  return r;
}

}  // namespace kgpu::api
