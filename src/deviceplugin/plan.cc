#include "deviceplugin/plan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>

#include <sys/stat.h>

#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "gpu/mig_minors.h"

namespace kgpu::deviceplugin {
namespace {

// A whole GPU or a MIG device, before sharing is applied.
struct Unit {
  std::string base_resource;
  std::string uuid;
  std::string index;  // "3" or "3:1"
  unsigned gpu = 0;
  int mig = -1;
  unsigned minor = 0;
  int numa = -1;
  unsigned gi = 0, ci = 0;
};

absl::StatusOr<std::vector<Unit>> Units(const gpu::Inventory& inv, const std::string& strategy) {
  auto log = Log("deviceplugin");
  std::vector<Unit> units;
  bool any_mig = false, all_mig = true;
  std::set<std::string> mig_profiles;
  for (const auto& g : inv.gpus()) {
    if (!g.error.empty()) {
      log->warn("GPU {} is not advertised: {}", g.index, g.error);
      continue;
    }
    any_mig = any_mig || g.mig_enabled;
    all_mig = all_mig && g.mig_enabled;
    for (const auto& m : g.migs) mig_profiles.insert(m.profile);
  }
  if (strategy == "single" && any_mig) {
    if (!all_mig) {
      return absl::FailedPreconditionError(
          "migStrategy single: all devices on the node must be configured with the same migEnabled "
          "value (enable MIG on every GPU, or use --mig-strategy=mixed)");
    }
    if (mig_profiles.size() > 1) {
      return absl::FailedPreconditionError(Cat("migStrategy single: more than one MIG device type present on node (",
                                               Join(mig_profiles, ", "),
                                               "); use --mig-strategy=mixed or one profile on every GPU"));
    }
  }
  for (const auto& g : inv.gpus()) {
    if (!g.error.empty()) continue;
    const bool split = g.mig_enabled && strategy != "none";
    if (!split) {
      units.push_back({"nvidia.com/gpu", g.uuid, std::to_string(g.index), g.index, -1, g.minor, g.numa_node});
      continue;
    }
    if (g.migs.empty()) log->warn("GPU {} has MIG enabled but no MIG devices", g.index);
    for (const auto& m : g.migs) {
      std::string resource = "nvidia.com/gpu";
      if (strategy == "mixed") {
        if (m.ci_slices != m.gi_slices) {
          log->warn("MIG device {} ({}) is a compute-instance slice; it is not advertised", m.uuid, m.profile);
          continue;
        }
        resource = MigResourceName(m.profile);
      }
      units.push_back({resource, m.uuid, Cat(g.index, ":", m.index), g.index, static_cast<int>(m.index), g.minor,
                       g.numa_node, m.gi, m.ci});
    }
  }
  return units;
}

// "config.yaml:7:7: " where the file declared the entry (or its k-th device), "" when not from a file.
std::string At(const ReplicatedResource& r, size_t device = SIZE_MAX) {
  const std::string& p = device < r.device_positions.size() ? r.device_positions[device] : r.position;
  return p.empty() ? "" : p + ": ";
}

bool Selects(const ReplicatedResource& r, const Unit& u) {
  if (r.name != u.base_resource) return false;
  if (r.devices.empty()) return true;
  for (const auto& d : r.devices) {
    if (d == u.uuid || d == u.index) return true;
  }
  return false;
}

}  // namespace

const PluginDevice* Resource::Find(const std::string& id) const {
  for (const auto& d : devices) {
    if (d.id == id) return &d;
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<const Plan>> BuildPlan(std::shared_ptr<const gpu::Inventory> inventory,
                                                      const Config& config) {
  auto units = Units(*inventory, config.mig_strategy);
  if (!units.ok()) {
    const auto it = config.positions.find("flags.migStrategy");
    if (it == config.positions.end()) return units.status();
    return absl::Status(units.status().code(), Cat(it->second, ": ", units.status().message()));
  }
  const Sharing& sharing = config.sharing;
  const char* sharing_key = sharing.strategy == SharingStrategy::kMps ? "sharing.mps" : "sharing.timeSlicing";

  // Every device a sharing entry names must exist, and no unit may be shared twice.
  std::vector<std::vector<size_t>> selected_by(units->size());
  for (size_t e = 0; e < sharing.resources.size(); ++e) {
    const auto& r = sharing.resources[e];
    for (size_t k = 0; k < r.devices.size(); ++k) {
      const std::string& d = r.devices[k];
      bool found = false;
      for (const auto& u : *units) found = found || ((d == u.uuid || d == u.index) && r.name == u.base_resource);
      if (!found) {
        std::vector<std::string> have;
        for (const auto& u : *units) {
          if (u.base_resource == r.name) have.push_back(u.index);
        }
        return absl::InvalidArgumentError(
            Printable(Cat(At(r, k), sharing_key, ".resources[", e, "].devices: no device '", d, "' of resource ",
                          r.name, " on this node (it has ", have.empty() ? std::string("none") : Join(have, ", "),
                          "; use GPU indices, MIG indices like 0:1, or UUIDs from `kgpu devices`)")));
      }
    }
    for (size_t i = 0; i < units->size(); ++i) {
      if (Selects(r, (*units)[i])) selected_by[i].push_back(e);
    }
  }

  // MIG capability minors, for passDeviceSpecs and the CDI spec of MIG devices.
  gpu::MigMinors minors;
  const bool any_mig = std::any_of(units->begin(), units->end(), [](const Unit& u) { return u.mig >= 0; });
  if (any_mig) {
    const std::string path = UnderRoot(config.proc_root, "/driver/nvidia-caps/mig-minors");
    if (const auto text = ReadFile(path)) {
      auto parsed = gpu::ParseMigMinors(*text, path);
      if (!parsed.ok()) return parsed.status();
      minors = std::move(*parsed);
    } else {
      Log("deviceplugin")
          ->warn(
              "{} is not readable: MIG devices get no /dev/nvidia-caps device specs (set --proc-root "
              "to the host's procfs)",
              path);
    }
  }

  auto plan = std::make_shared<Plan>();
  plan->inventory = inventory;
  std::map<std::string, size_t> by_name;
  auto resource = [&](const std::string& name) -> Resource& {
    auto it = by_name.find(name);
    if (it != by_name.end()) return plan->resources[it->second];
    by_name[name] = plan->resources.size();
    Resource r;
    r.name = name;
    r.socket = SocketName(name);
    r.mig = name.rfind("nvidia.com/mig-", 0) == 0;
    r.kgpu_shares = name == api::kShares;
    plan->resources.push_back(r);
    return plan->resources.back();
  };
  for (size_t i = 0; i < units->size(); ++i) {
    const Unit& u = (*units)[i];
    PluginDevice base;
    base.id = u.uuid;
    base.visible_id = config.device_id_strategy == "index" ? u.index : u.uuid;
    base.health_key = u.uuid;
    base.gpu = u.gpu;
    base.mig = u.mig;
    base.minor = u.minor;
    base.numa = u.numa;
    // The driver names a GPU's capabilities by its minor number (gpu<minor>/gi<i>/...), not by index.
    if (u.mig >= 0) base.cap_nodes = gpu::MigCapNodes(minors, u.minor, u.gi, u.ci);
    if (selected_by[i].size() > 1) {
      return absl::InvalidArgumentError(Cat(At(sharing.resources[selected_by[i][1]]), sharing_key, ".resources[",
                                            selected_by[i][0], "] and [", selected_by[i][1], "] both select ", u.uuid,
                                            " (index ", u.index, "); give each device one entry"));
    }
    if (selected_by[i].empty()) {
      resource(u.base_resource).devices.push_back(base);
      continue;
    }
    const ReplicatedResource& r = sharing.resources[selected_by[i][0]];
    if (sharing.strategy == SharingStrategy::kMps) {
      if (u.mig >= 0) {
        return absl::InvalidArgumentError(Cat(At(r), "sharing.mps.resources[", selected_by[i][0], "] (", r.name,
                                              "): sharing using MPS is not supported for MIG ", "devices (", u.uuid,
                                              " on GPU ", u.gpu,
                                              "); share MIG devices with sharing.timeSlicing, or disable MIG"));
      }
      const auto& g = inventory->gpus()[u.gpu];
      const int max_clients = (g.cc_major > 7 || (g.cc_major == 7 && g.cc_minor >= 5)) ? 48 : 16;
      if (r.replicas > max_clients) {
        return absl::InvalidArgumentError(Cat(At(r), "sharing.mps.resources[", selected_by[i][0], "].replicas ",
                                              r.replicas, " exceeds the ", max_clients, " MPS clients GPU ", u.gpu,
                                              " (compute capability ", g.cc_major, ".", g.cc_minor, ") supports"));
      }
    }
    const std::string name = !r.rename.empty() ? r.rename : sharing.rename_by_default ? r.name + ".shared" : r.name;
    Resource& res = resource(name);
    res.replicated = true;
    res.mps = sharing.strategy == SharingStrategy::kMps;
    res.hard_memory = sharing.strategy == SharingStrategy::kTimeSlicing && sharing.hard_memory;
    res.fail_requests_greater_than_one = sharing.fail_requests_greater_than_one;
    for (int n = 0; n < r.replicas; ++n) {
      PluginDevice d = base;
      d.id = Cat(u.uuid, "::", n);
      d.replica = n;
      res.devices.push_back(d);
    }
  }
  // Control device nodes for passDeviceSpecs: the two required ones, and the optional ones that
  // exist under the dev root.
  plan->control_nodes = {"/dev/nvidiactl", "/dev/nvidia-uvm"};
  for (const char* node : {"/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}) {
    struct stat st {};
    if (::stat(config.HostDevPath(node).c_str(), &st) == 0) plan->control_nodes.emplace_back(node);
  }
  std::map<std::string, std::string> sockets;
  for (const auto& r : plan->resources) {
    if (auto [it, inserted] = sockets.emplace(r.socket, r.name); !inserted) {
      return absl::InvalidArgumentError(Cat("resources ", it->second, " and ", r.name, " would both be served on ",
                                            r.socket, "; rename one of them"));
    }
  }
  return std::shared_ptr<const Plan>(std::move(plan));
}

}  // namespace kgpu::deviceplugin
