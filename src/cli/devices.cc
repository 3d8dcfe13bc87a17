#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/strings.h"
#include "deviceplugin/health_file.h"
#include "deviceplugin/server.h"
#include "gpu/inventory.h"
#include "nvml/library.h"

namespace kgpu::cli {
namespace {

std::string Status(const gpu::Gpu& g) {
  if (g.lost) return "lost";
  if (g.hung) return "hung";
  if (!g.error.empty()) return "error";
  if (g.mig_pending) return "mig-pending-reset";
  return "ok";
}

// UUIDs of hung GPUs, from the device plugin's health file (NVML cannot be asked), and the health
// a live device plugin serves kubelet (the node's one health source: a GPU it serves Unhealthy
// is "unhealthy" here too, with its reason).
struct Names {
  std::map<unsigned, std::string> plugin_uuids;
  std::string kubelet_dir;
  std::map<std::string, std::pair<bool, std::string>> served;  // UUID -> (healthy, reason)
  std::string Status(const gpu::Gpu& g) const {
    const std::string s = kgpu::cli::Status(g);
    if (s != "ok") return s;
    const auto it = served.find(g.uuid);
    return it != served.end() && !it->second.first ? "unhealthy" : s;
  }
  // Why the plugin serves it Unhealthy; empty when it does not.
  std::string Unhealthy(const std::string& uuid) const {
    const auto it = served.find(uuid);
    return it != served.end() && !it->second.first ? it->second.second : "";
  }
  std::string Uuid(const gpu::Gpu& g) const {
    if (!g.uuid.empty() || !g.hung) return g.uuid;
    const auto it = plugin_uuids.find(g.index);
    return it == plugin_uuids.end() ? std::string() : it->second;
  }
  std::string Error(const gpu::Gpu& g) const {
    if (!g.hung) return g.error;
    return Cat(g.error, Uuid(g).empty() ? Cat("; UUID unknown (no kgpu device plugin state in ", kubelet_dir, ")")
                                        : std::string("; UUID as the device plugin last served it"));
  }
};

nlohmann::json ToJson(const gpu::Inventory& inv, const std::string& library, const Names& names) {
  nlohmann::json j;
  j["library"] = library;
  j["driverVersion"] = inv.driver_version();
  j["cudaVersion"] = inv.cuda_version();
  j["nvmlVersion"] = inv.nvml_version();
  j["gpus"] = nlohmann::json::array();
  for (const auto& g : inv.gpus()) {
    nlohmann::json x = {{"index", g.index},
                        {"uuid", names.Uuid(g)},
                        {"name", g.name},
                        {"pciBusId", g.bus_id},
                        {"minor", g.minor},
                        {"memoryMiB", g.memory_mib},
                        {"computeCapability", Cat(g.cc_major, ".", g.cc_minor)},
                        {"powerLimitW", g.power_limit_w},
                        {"numaNode", g.numa_node},
                        {"migCapable", g.mig_capable},
                        {"migEnabled", g.mig_enabled},
                        {"migPendingReset", g.mig_pending},
                        {"status", names.Status(g)}};
    if (!g.error.empty()) x["error"] = names.Error(g);
    if (const std::string why = names.Unhealthy(g.uuid); !why.empty()) x["unhealthyReason"] = why;
    x["migDevices"] = nlohmann::json::array();
    for (const auto& m : g.migs) {
      x["migDevices"].push_back({{"uuid", m.uuid},
                                 {"index", m.index},
                                 {"gpuInstanceId", m.gi},
                                 {"computeInstanceId", m.ci},
                                 {"profile", m.profile},
                                 {"memoryMiB", m.memory_mib}});
    }
    nlohmann::json topo = nlohmann::json::object();
    for (const auto& other : inv.gpus()) {
      if (other.index == g.index) continue;
      topo[Cat("GPU", other.index)] = inv.TopologyLabel(g.index, other.index);
    }
    x["topology"] = topo;
    j["gpus"].push_back(x);
  }
  return j;
}

void PrintTable(const gpu::Inventory& inv, const std::string& library, const Names& names, std::ostream& out) {
  out << "NVML library: " << library << "\n"
      << "Driver " << inv.driver_version() << "   CUDA " << inv.cuda_version() << "   NVML " << inv.nvml_version()
      << "   " << inv.gpus().size() << " GPU(s)\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-4s %-40s %-24s %-17s %9s %4s %4s %-5s %s\n", "IDX", "UUID", "NAME", "PCI BUS ID",
                "MEMORY", "CC", "NUMA", "MIG", "STATUS");
  out << line;
  for (const auto& g : inv.gpus()) {
    const std::string numa = g.numa_node < 0 ? "-" : std::to_string(g.numa_node);
    const std::string mig = !g.mig_capable ? "n/a" : g.mig_enabled ? "on" : "off";
    std::snprintf(line, sizeof line, "%-4u %-40s %-24s %-17s %6lluMiB %4s %4s %-5s %s\n", g.index,
                  names.Uuid(g).empty() ? "?" : names.Uuid(g).c_str(), g.name.substr(0, 24).c_str(), g.bus_id.c_str(),
                  static_cast<unsigned long long>(g.memory_mib), Cat(g.cc_major, ".", g.cc_minor).c_str(), numa.c_str(),
                  mig.c_str(), names.Status(g).c_str());
    out << line;
    if (!g.error.empty()) out << "     error: " << names.Error(g) << "\n";
    if (const std::string why = names.Unhealthy(g.uuid); !why.empty()) {
      out << "     unhealthy: " << why << " (as the device plugin serves it to kubelet)\n";
    }
    for (const auto& m : g.migs) {
      std::snprintf(line, sizeof line, "     `- MIG %-12s GI %-2u CI %-2u %-41s %6lluMiB\n", m.profile.c_str(), m.gi,
                    m.ci, m.uuid.c_str(), static_cast<unsigned long long>(m.memory_mib));
      out << line;
      if (const std::string why = names.Unhealthy(m.uuid); !why.empty()) out << "       unhealthy: " << why << "\n";
    }
  }
  out << "\nTopology (nvidia-smi topo -m legend: X self, NV# NVLink lanes, PIX one PCIe switch,\n"
         "PXB several switches, PHB host bridge, NODE same NUMA node, SYS across NUMA nodes)\n";
  std::ostringstream header;
  header << std::left << std::setw(7) << "";
  for (const auto& g : inv.gpus()) header << std::setw(6) << Cat("GPU", g.index);
  header << "NUMA";
  out << header.str() << "\n";
  for (const auto& a : inv.gpus()) {
    std::ostringstream row;
    row << std::left << std::setw(7) << Cat("GPU", a.index);
    for (const auto& b : inv.gpus()) row << std::setw(6) << inv.TopologyLabel(a.index, b.index);
    row << (a.numa_node < 0 ? "-" : std::to_string(a.numa_node));
    out << row.str() << "\n";
  }
}

}  // namespace

absl::StatusOr<Session> OpenSession(const NodeOptions& options) {
  auto opened = nvml::Library::Open({options.nvml_library});
  if (!opened.ok()) return opened.status();
  std::shared_ptr<nvml::Library> lib = std::move(*opened);
  auto inv = options.nvml_deadline.count() > 0
                 ? gpu::Inventory::Discover(lib, {options.sysfs_root}, options.nvml_deadline)
                 : gpu::Inventory::Discover(*lib, {options.sysfs_root});
  if (!inv.ok()) {
    return absl::Status(inv.status().code(), Cat("GPU discovery failed: ", inv.status().message()));
  }
  return Session{std::move(lib), *inv};
}

std::map<unsigned, std::string> PluginGpuUuids(const NodeOptions& options) {
  std::map<unsigned, std::string> out;
  auto served = deviceplugin::ReadHealthFile(options.kubelet_dir);
  if (!served.ok()) return out;
  for (const auto& d : *served) {
    if (!d.mig && d.gpu >= 0) out[static_cast<unsigned>(d.gpu)] = d.id;
  }
  return out;
}

std::map<std::string, std::pair<bool, std::string>> PluginServedHealth(const NodeOptions& options) {
  std::map<std::string, std::pair<bool, std::string>> out;
  bool answers = false;
  for (const auto& socket : deviceplugin::PluginSockets(options.kubelet_dir)) {
    if (deviceplugin::ReadAdvertised(Cat(options.kubelet_dir, "/", socket), std::chrono::seconds(2)).ok()) {
      answers = true;
      break;
    }
  }
  if (!answers) return out;  // a health file without a live plugin is stale
  auto served = deviceplugin::ReadHealthFile(options.kubelet_dir);
  if (!served.ok()) return out;
  for (const auto& d : *served) out[d.id] = {d.healthy, d.reason};
  return out;
}

int RunDevices(const NodeOptions& options, bool json, std::ostream& out) {
  auto session = OpenSession(options);
  if (!session.ok()) {
    out << "kgpu devices: " << session.status().message() << "\n";
    return 1;
  }
  // A hung GPU's UUID cannot be read from NVML: name it from the device plugin's last state.
  const bool hung = std::any_of(session->inventory->gpus().begin(), session->inventory->gpus().end(),
                                [](const gpu::Gpu& g) { return g.hung; });
  const Names names{hung ? PluginGpuUuids(options) : std::map<unsigned, std::string>{}, options.kubelet_dir,
                    PluginServedHealth(options)};
  if (json) {
    out << ToJson(*session->inventory, session->lib->path(), names).dump(2) << "\n";
  } else {
    PrintTable(*session->inventory, session->lib->path(), names, out);
  }
  return 0;
}

}  // namespace kgpu::cli
