#pragma once
// `kgpu device-plugin`: NVIDIA k8s-device-plugin's flags and environment variables (same names,
// same meaning), the config file, and the run loop (SIGHUP reloads, SIGTERM stops cleanly).
//
// Thread-safety: AddDevicePluginFlags/ResolveConfig are single-threaded set-up code.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "cli/commands.h"
#include "cli/node_labels.h"
#include "deviceplugin/config.h"
#include "kubelet/podresources.h"

namespace kgpu::deviceplugin {
class Manager;
}  // namespace kgpu::deviceplugin

namespace kgpu::cli {

struct DevicePluginFlags {
  // kgpu.io/gpu handoff (cli/share_handoff.h): where to read PodResources. The API connection and
  // the node name are the node agent's (NodeLabelsFlags: --kubeconfig, --context, --in-cluster,
  // --node-name), shared with --publish-labels.
  struct Shares {
    std::string pod_resources_socket = kubelet::kPodResourcesSocket;
    std::chrono::seconds accounting_sweep{600};  // --cuda-accounting-sweep: 0 = never
  } shares;
  std::string config_file;
  bool allow_empty_config = false;  // --allow-empty-config
  deviceplugin::Config values;      // what flags/env carried (only those whose Option* was given)
  std::vector<std::pair<CLI::Option*, void (*)(const deviceplugin::Config&, deviceplugin::Config*)>> given;
};

// kServe: every flag of NVIDIA's plugin (device-plugin, node). kDescribe: only those that change
// what the node advertises (the config file, MIG strategy, driver and device roots, the CUDA
// interposer): node-labels, node-template and slurm gres show no flag that does nothing there.
// kDra: kDescribe's and those that say where the node's CDI specs, accounting regions and procfs
// are (kgpu dra prepares claims with them).
enum class PluginFlags { kServe, kDescribe, kDra };
void AddDevicePluginFlags(CLI::App* app, DevicePluginFlags* flags, PluginFlags use = PluginFlags::kServe);
// --pod-resources-socket of the kgpu.io/gpu handoff (device-plugin and node).
void AddShareFlags(CLI::App* app, DevicePluginFlags* flags);

// File (if any) < environment < flags; then DP_*_HEALTHCHECKS; then validation.
absl::StatusOr<deviceplugin::Config> ResolveConfig(const DevicePluginFlags& flags);

// For the one-shot commands that read the node as the plugin would (kgpu slurm gres, node-labels,
// node-template): the config (ResolveConfig), then an NVML session (OpenSession); the first error.
struct ConfiguredSession {
  deviceplugin::Config config;
  Session session;
};
absl::StatusOr<ConfiguredSession> OpenConfiguredSession(const NodeOptions& node, const DevicePluginFlags& flags);

// Waits for signals: SIGHUP re-reads the config and reloads `manager` (a refused config keeps the
// running one); SIGTERM/SIGINT/SIGQUIT return 0 (1 when a failed reload could restore nothing).
// The caller stops the manager. The caller must have blocked SIGHUP, SIGTERM, SIGINT and SIGQUIT.
int ServeUntilStopped(deviceplugin::Manager& manager, const DevicePluginFlags& flags);
// Runs until SIGTERM/SIGINT. With failOnInitError=false and no NVML, waits: SIGHUP reloads the
// config and tries NVML again. The caller must have blocked SIGHUP, SIGTERM, SIGINT and SIGQUIT.
// With labels.publish it also publishes the node's labels (MakeLabelPublisher).
int RunDevicePlugin(const NodeOptions& node, const DevicePluginFlags& flags, const NodeLabelsFlags& labels = {});

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
// `api` gives the API connection and the node name (those of --publish-labels).
void InstallShareHandoff(deviceplugin::Manager& manager, const DevicePluginFlags& flags, const NodeLabelsFlags& api,
                         const deviceplugin::Config& config, std::shared_ptr<const gpu::Inventory> inventory);

}  // namespace kgpu::cli
