#pragma once
// `kgpu device-plugin`: NVIDIA k8s-device-plugin's flags and environment variables (same names,
// same meaning), the config file, and the run loop (SIGHUP reloads, SIGTERM stops cleanly).
//
// Thread-safety: AddDevicePluginFlags/ResolveConfig are single-threaded set-up code.

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/commands.h"
#include "deviceplugin/config.h"

namespace kgpu::cli {

struct DevicePluginFlags {
  // kgpu.io/gpu handoff (cli/share_handoff.h): where to read allocation records and PodResources.
  struct Shares {
    std::string kubeconfig;  // empty: $KUBECONFIG, ~/.kube/config, else in-cluster
    std::string node_name;   // NODE_NAME
    std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  } shares;
  std::string config_file;
  bool allow_empty_config = false;  // --allow-empty-config
  deviceplugin::Config values;  // what flags/env carried (only those whose Option* was given)
  std::vector<std::pair<CLI::Option*, void (*)(const deviceplugin::Config&, deviceplugin::Config*)>> given;
};

void AddDevicePluginFlags(CLI::App* app, DevicePluginFlags* flags);
// --kubeconfig, --node-name, --pod-resources-socket of the kgpu.io/gpu handoff (device-plugin and
// node only: node-labels has its own --kubeconfig and --node-name).
void AddShareFlags(CLI::App* app, DevicePluginFlags* flags);

// File (if any) < environment < flags; then DP_*_HEALTHCHECKS; then validation.
absl::StatusOr<deviceplugin::Config> ResolveConfig(const DevicePluginFlags& flags);

// Runs until SIGTERM/SIGINT. The caller must have blocked SIGHUP, SIGTERM, SIGINT and SIGQUIT.
int RunDevicePlugin(const NodeOptions& node, const DevicePluginFlags& flags);

}  // namespace kgpu::cli

namespace kgpu::deviceplugin {
class Manager;
}
namespace kgpu::gpu {
class Inventory;
}

namespace kgpu::cli {
// Gives `manager` the allocation-record resolver for kgpu.io/gpu when the config serves it; a
// missing API configuration is logged (PreStartContainer then fails, naming the flags).
void InstallShareHandoff(deviceplugin::Manager& manager, const DevicePluginFlags& flags, const deviceplugin::Config& config,
                         std::shared_ptr<const gpu::Inventory> inventory);

}  // namespace kgpu::cli
