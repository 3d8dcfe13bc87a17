#include "deviceplugin/cdi.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "common/files.h"
#include "common/strings.h"
#include "deviceplugin/allocator.h"

namespace kgpu::deviceplugin {

std::string CdiSpecJson(const Plan& plan, const Config& config) {
  auto node = [&](const std::string& path) {
    return nlohmann::json{{"path", path}, {"hostPath", config.HostDevPath(path)}};
  };
  nlohmann::json devices = nlohmann::json::array();
  std::set<std::string> done;
  for (const auto& r : plan.resources) {
    for (const auto& d : r.devices) {
      if (!done.insert(d.health_key).second) continue;  // replicas share their GPU's entry
      const auto& g = plan.inventory->gpus()[d.gpu];
      const std::string index = d.mig < 0 ? std::to_string(d.gpu) : Cat(d.gpu, ":", d.mig);
      nlohmann::json nodes = nlohmann::json::array({node(Cat("/dev/nvidia", g.minor))});
      for (const auto& cap : d.cap_nodes) nodes.push_back(node(cap));
      nlohmann::json edits = {{"deviceNodes", nodes}};
      devices.push_back({{"name", d.health_key}, {"containerEdits", edits}});
      devices.push_back({{"name", index}, {"containerEdits", edits}});
    }
  }
  nlohmann::json common_nodes = nlohmann::json::array();
  for (const auto& n : plan.control_nodes) common_nodes.push_back(node(n));
  const nlohmann::json spec = {
      {"cdiVersion", "0.5.0"},
      {"kind", Cat(kCdiVendor, "/gpu")},
      {"devices", devices},
      {"containerEdits", {{"deviceNodes", common_nodes}, {"env", {"NVIDIA_VISIBLE_DEVICES=void"}}}}};
  return spec.dump(2) + "\n";
}

absl::StatusOr<std::string> WriteCdiSpec(const Plan& plan, const Config& config) {
  const auto& s = config.device_list_strategy;
  if (std::none_of(s.begin(), s.end(), [](const std::string& x) { return x.rfind("cdi-", 0) == 0; })) {
    return std::string();
  }
  std::error_code ec;
  std::filesystem::create_directories(config.cdi_spec_dir, ec);
  const std::string path = Cat(config.cdi_spec_dir, "/", kCdiVendor, "-gpu.json");
  if (auto st = WriteFileAtomically(path, CdiSpecJson(plan, config)); !st.ok()) {
    return absl::UnavailableError(
        Cat("the CDI spec: ", st.message(), " (mount the CDI spec directory, or change --cdi-spec-dir)"));
  }
  return path;
}

nlohmann::json CdiMounts(const std::vector<MountSpec>& mounts) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : mounts) {
    out.push_back({{"hostPath", m.host_path},
                   {"containerPath", m.container_path},
                   {"options", nlohmann::json::array({m.read_only ? "ro" : "rw", "nosuid", "nodev", "bind"})}});
  }
  return out;
}

}  // namespace kgpu::deviceplugin
