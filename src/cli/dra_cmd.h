#pragma once
// `kgpu dra`: GPUs through Dynamic Resource Allocation (docs/dra.md).
//
//   kgpu dra          the kubelet plugin: publishes the node's ResourceSlices (again when a GPU's
//                     health changes: taints), serves kubelet's plugin registration, DRA node
//                     service and health stream, until SIGTERM;
//   kgpu dra slices   the ResourceSlices this node publishes (a v1 List, for `kubectl apply -f -`
//                     or a look before enabling the plugin), from the one inventory and the device
//                     plugin's config (which GPUs are offered as shares).
//
// Thread-safety: single-threaded CLI code.

#include <chrono>
#include <csignal>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "api/dra.h"
#include "cli/commands.h"
#include "cli/device_plugin_cmd.h"

namespace kgpu::cli {

struct DraFlags {
  std::string node_name;                   // --node-name / NODE_NAME; default: the host name
  std::string driver = api::dra::kDriver;  // --driver-name
  bool dynamic_mig = false;                // --dynamic-mig
  // --kubernetes-version: the API server's; 1.34 puts each MIG GPU's counters in its device slice,
  // 1.35 and later in slices of their own.
  std::string kubernetes_version = "1.35";
  // The plugin (kgpu dra): the API connection, kubelet's directories, the resync period.
  std::string kubeconfig, context;
  bool in_cluster = false;
  std::string registry_dir = "/var/lib/kubelet/plugins_registry";
  std::string plugins_dir = "/var/lib/kubelet/plugins";  // the driver's directory is <this>/<driver>
  std::string lost_taint_effect = "NoSchedule";
  std::chrono::seconds resync{60};
};

// Adds `dra` with `dra slices`; returns both.
std::pair<CLI::App*, CLI::App*> AddDraCommands(CLI::App* app, DraFlags* flags, DevicePluginFlags* plugin_flags);

// The node's pool as the plugin publishes it. Errors name the flag or the GPU.
absl::StatusOr<std::vector<api::dra::ResourceSlice>> NodeSlices(const ConfiguredSession& cs, const DraFlags& flags);

// Exit codes as every kgpu command: 0 printed, 1 bad input (a flag value, the config) or NVML failed.
// The plugin, until *stop. Exit codes: 0 stopped, 1 bad input or a failure to start.
int RunDra(const NodeOptions& node, const DevicePluginFlags& plugin, const DraFlags& flags,
           const volatile std::sig_atomic_t* stop, std::ostream& err);

// Errors go to `err`, so the List on `out` can be piped.
int RunDraSlices(const NodeOptions& node, const DevicePluginFlags& plugin, const DraFlags& flags, std::ostream& out,
                 std::ostream& err);

}  // namespace kgpu::cli
