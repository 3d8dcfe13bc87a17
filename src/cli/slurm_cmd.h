#pragma once
// `kgpu slurm gres` (gres.conf and the slurm.conf node line from this node's inventory) and
// `kgpu slurm-bridge` (run, status, reclaim): flag wiring for src/slurm.
//
// Thread-safety: set-up code, single-threaded.

#include <CLI/CLI.hpp>

#include <csignal>
#include <ostream>
#include <string>

#include "cli/commands.h"
#include "cli/device_plugin_cmd.h"

namespace kgpu::cli {

struct SlurmGresFlags {
  std::string node_name;  // default: the host name
  std::string mig_minors = "/proc/driver/nvidia-caps/mig-minors";
  int mps_count = -1;     // per GPU; -1: 100 when the config shares by MPS, else none
  std::string gpu_type;
  bool no_cores = false, no_links = false;
  unsigned cpus = 0, real_memory = 0;
  std::string output = "both";  // gres | node | both
  std::string write_gres_conf;  // also write gres.conf here (atomically)
};

CLI::App* AddSlurmGresCommand(CLI::App* slurm, SlurmGresFlags* flags);
int RunSlurmGres(const NodeOptions& node, const DevicePluginFlags& dp, const SlurmGresFlags& flags, std::ostream& out);

}  // namespace kgpu::cli
