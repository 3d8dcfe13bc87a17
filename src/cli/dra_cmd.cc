#include "cli/dra_cmd.h"

#include <map>

#include <unistd.h>

#include "common/strings.h"
#include "deviceplugin/config.h"
#include "dra/slices.h"
#include "gpu/mig_layout.h"

namespace kgpu::cli {
namespace {

std::string HostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string name = host;
  if (const auto dot = name.find('.'); dot != std::string::npos) name.resize(dot);
  return name;
}

// "1.34", "v1.35.2" -> 34, 35; nullopt for anything else.
std::optional<int> KubernetesMinor(std::string_view v) {
  if (!v.empty() && v.front() == 'v') v.remove_prefix(1);
  if (v.substr(0, 2) != "1.") return std::nullopt;
  v.remove_prefix(2);
  int minor = 0;
  size_t i = 0;
  for (; i < v.size() && v[i] >= '0' && v[i] <= '9' && i < 4; ++i) minor = minor * 10 + (v[i] - '0');
  if (i == 0 || (i < v.size() && v[i] != '.')) return std::nullopt;
  return minor;
}

}  // namespace

CLI::App* AddDraCommands(CLI::App* app, DraFlags* flags, DevicePluginFlags* plugin_flags) {
  auto* dra = app->add_subcommand("dra", "GPUs through Dynamic Resource Allocation (resource.k8s.io/v1)");
  dra->require_subcommand(1);
  auto* slices = dra->add_subcommand(
      "slices", "print the ResourceSlices this node publishes (a v1 List of resource.k8s.io/v1 objects)");
  slices->add_option("--node-name", flags->node_name, "this node's name: the pool and nodeName (default: host name)")
      ->envname("NODE_NAME");
  slices
      ->add_option("--driver-name", flags->driver,
                   "the DRA driver name (NVIDIA's by default, so its DeviceClasses and claims work unchanged; "
                   "another where both drivers run in one cluster, never on one node)")
      ->envname("KGPU_DRA_DRIVER_NAME")
      ->capture_default_str();
  slices
      ->add_flag("--dynamic-mig", flags->dynamic_mig,
                 "MIG-mode GPUs: publish every profile placement (carved when a claim is prepared) instead of "
                 "the instances that exist")
      ->envname("KGPU_DRA_DYNAMIC_MIG");
  slices
      ->add_option("--kubernetes-version", flags->kubernetes_version,
                   "the API server's version: 1.34 keeps each MIG GPU's counters in its device slice, "
                   "1.35 and later in slices of their own")
      ->capture_default_str();
  AddDevicePluginFlags(slices, plugin_flags, PluginFlags::kDescribe);
  return slices;
}

absl::StatusOr<std::vector<api::dra::ResourceSlice>> NodeSlices(const ConfiguredSession& cs, const DraFlags& flags) {
  dra::PoolOptions opts;
  opts.driver = flags.driver;
  if (!api::dra::IsDnsSubdomain(opts.driver, 63)) {
    return absl::InvalidArgumentError(Printable(Cat("--driver-name '", opts.driver,
                                                    "' is not a DRA driver name: a DNS subdomain of at most 63 "
                                                    "lower-case characters, like gpu.nvidia.com")));
  }
  opts.node_name = flags.node_name.empty() ? HostName() : flags.node_name;
  if (!api::dra::IsDnsSubdomain(opts.node_name)) {
    return absl::InvalidArgumentError(Printable(
        Cat("--node-name '", opts.node_name, "' is not a Kubernetes node name (a lower-case DNS subdomain)")));
  }
  const auto minor = KubernetesMinor(flags.kubernetes_version);
  if (!minor || *minor < 34) {
    return absl::InvalidArgumentError(Printable(Cat("--kubernetes-version '", flags.kubernetes_version,
                                                    "': DRA's resource.k8s.io/v1 needs Kubernetes 1.34 or later "
                                                    "(write it as 1.34 or v1.35.2)")));
  }
  opts.split_counters = *minor >= 35;
  opts.dynamic_mig = flags.dynamic_mig;
  const gpu::Inventory& inv = *cs.session.inventory;
  std::map<unsigned, gpu::MigCatalog> mig;
  for (const auto& g : inv.gpus()) {
    if (deviceplugin::ShareSlotsOf(g, cs.config) > 0) opts.shared_gpus.insert(g.index);
    if (!g.mig_enabled || !g.error.empty()) continue;
    auto cat = gpu::ReadMigCatalog(*cs.session.lib, g);
    if (!cat.ok())
      return absl::Status(cat.status().code(), Cat("GPU ", g.index, ": MIG profiles: ", cat.status().message()));
    mig[g.index] = std::move(*cat);
  }
  return dra::BuildPool(inv, mig, opts);
}

int RunDraSlices(const NodeOptions& node, const DevicePluginFlags& plugin, const DraFlags& flags, std::ostream& out,
                 std::ostream& err) {
  auto cs = OpenConfiguredSession(node, plugin);
  if (!cs.ok()) {
    err << "kgpu dra slices: " << cs.status().message() << "\n";
    return 1;
  }
  auto slices = NodeSlices(*cs, flags);
  if (!slices.ok()) {
    err << "kgpu dra slices: " << slices.status().message() << "\n";
    return 1;
  }
  nlohmann::json list = {{"apiVersion", "v1"}, {"kind", "List"}, {"items", nlohmann::json::array()}};
  for (const auto& s : *slices) list["items"].push_back(api::dra::ToJson(s));
  out << list.dump(2) << "\n";
  return 0;
}

}  // namespace kgpu::cli
