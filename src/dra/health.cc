#include "dra/health.h"

#include <cctype>

#include "common/strings.h"
#include "dra/slices.h"

namespace kgpu::dra {
namespace {

// "XID 48 (double-bit ECC error) ..." -> "48"; "" when the reason names no XID.
std::string XidOf(const std::string& reason) {
  const size_t at = reason.find("XID ");
  if (at == std::string::npos) return "";
  size_t end = at + 4;
  while (end < reason.size() && std::isdigit(static_cast<unsigned char>(reason[end]))) ++end;
  return reason.substr(at + 4, end - at - 4);
}

}  // namespace

std::map<unsigned, std::vector<api::dra::Taint>> HealthTaints(const gpu::Inventory& inventory,
                                                              const std::map<std::string, gpu::DeviceHealth>& health,
                                                              const TaintOptions& options) {
  std::map<unsigned, std::vector<api::dra::Taint>> out;
  for (const auto& g : inventory.gpus()) {
    const auto it = health.find(g.uuid);
    if (it == health.end() || it->second.healthy) continue;
    const gpu::DeviceHealth& h = it->second;
    api::dra::Taint t;
    t.effect = "NoSchedule";
    if (h.cause == "lost") {
      t.key = api::dra::kTaintGpuLost;
      t.effect = options.lost_effect;
    } else if (const std::string xid = XidOf(h.reason); h.cause == "xid" && !xid.empty()) {
      t.key = api::dra::kTaintXid;
      t.value = xid;
    } else if (h.cause == "ecc") {
      t.key = api::dra::kTaintXid;  // a double-bit ECC error is XID 48 to the driver
      t.value = "48";
    } else {
      t.key = kTaintUnhealthy;
      t.value = h.cause.empty() ? "unknown" : h.cause;
    }
    out[g.index].push_back(std::move(t));
  }
  return out;
}

std::vector<DeviceHealthReport> HealthReports(const std::vector<api::dra::ResourceSlice>& slices,
                                              const gpu::Inventory& inventory,
                                              const std::map<unsigned, gpu::MigCatalog>& mig,
                                              const std::map<std::string, gpu::DeviceHealth>& health,
                                              int64_t now_unix) {
  // Device name -> the UUID whose health it has.
  std::map<std::string, std::string> uuid_of;
  for (const auto& g : inventory.gpus()) {
    uuid_of[api::dra::GpuDeviceName(g.minor)] = g.uuid;
    const auto cat = mig.find(g.index);
    if (cat == mig.end()) continue;
    for (const auto& m : g.migs) uuid_of[StaticMigName(g, m, cat->second)] = m.uuid;
  }
  std::vector<DeviceHealthReport> out;
  for (const auto& s : slices) {
    for (const auto& d : s.devices) {
      DeviceHealthReport r{s.pool, d.name, DeviceHealthReport::Health::kUnknown, "", now_unix};
      const auto u = uuid_of.find(d.name);
      const auto h = u == uuid_of.end() ? health.end() : health.find(u->second);
      if (h != health.end()) {
        r.health = h->second.healthy ? DeviceHealthReport::Health::kHealthy : DeviceHealthReport::Health::kUnhealthy;
        r.message = h->second.reason;
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace kgpu::dra
