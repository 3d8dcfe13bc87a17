#pragma once
// `kgpu mig`: MIG layouts declared in the device plugin's config file (`mig.layouts`, chosen per
// node by `mig.nodes` or --layout), shown and applied through NVML.
//
//   kgpu mig show    each GPU's MIG mode, instances and the profiles it offers; the layouts
//   kgpu mig apply   re-partitions the GPUs whose layout differs — only when no pod holds a device
//                    of the GPU (kubelet's PodResources) and no process runs on it (NVML). A busy GPU
//                    refuses the whole apply, with the pods and processes named, and nothing changes.
//                    The device plugin notices the new layout within mig.rescanInterval and
//                    re-registers; resources that disappeared are reported with zero devices.
//
// Thread-safety: single-threaded CLI code.

#include <ostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace kgpu::cli {

struct MigFlags {
  std::string config_file;  // the device plugin's config file (CONFIG_FILE)
  bool allow_empty_config = false;
  std::string layout;          // --layout: overrides mig.nodes
  std::string node_name;       // --node-name / NODE_NAME; default: the host name
  std::vector<unsigned> gpus;  // --gpu: only these GPUs of the layout
  std::string pod_resources_socket;
  bool no_kubelet_check = false;
  bool dry_run = false;
  bool quiet = false;                                           // --quiet: no progress line
  std::string lock_file;                                        // --lock-file: one apply at a time per node
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";  // drain markers, plugin sockets
};

// Adds `mig show` and `mig apply` under `mig`; returns them so main can tell which was parsed.
std::pair<CLI::App*, CLI::App*> AddMigCommands(CLI::App* mig, MigFlags* flags);

int RunMigShow(const NodeOptions& node, const MigFlags& flags, std::ostream& out);
// Exit codes (as every kgpu command): 0 applied or nothing to do, 1 bad input (config, layout
// name, --gpu) or refused or failed; 2 is left to command-line usage errors.
int RunMigApply(const NodeOptions& node, const MigFlags& flags, std::ostream& out);

}  // namespace kgpu::cli
