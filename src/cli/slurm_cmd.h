#pragma once
// `kgpu slurm gres` (gres.conf and the slurm.conf node line from this node's inventory) and
// `kgpu slurm-bridge` (run, status, reclaim, hook): flag wiring for src/slurm.
//
// Thread-safety: set-up code, single-threaded.

#include <csignal>
#include <ostream>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/device_plugin_cmd.h"

namespace kgpu::cli {

struct SlurmGresFlags {
  std::string node_name;  // default: the host name
  std::string mig_minors = "/proc/driver/nvidia-caps/mig-minors";
  int mps_count = -1;  // per GPU; -1: 100 when the config shares by MPS, else none
  std::string gpu_type;
  bool no_cores = false, no_links = false;
  unsigned cpus = 0, real_memory = 0;
  std::string output = "both";  // gres | node | both
  std::string write_gres_conf;  // also write gres.conf here (atomically)
};

CLI::App* AddSlurmGresCommand(CLI::App* slurm, SlurmGresFlags* flags);
int RunSlurmGres(const NodeOptions& node, const DevicePluginFlags& dp, const SlurmGresFlags& flags, std::ostream& out);

}  // namespace kgpu::cli

#include <chrono>
#include <vector>

#include "cli/flags.h"  // LeaderElectFlags, the duration flags and deprecated spellings

namespace kgpu::cli {

// Every duration flag takes Go's form ("30s", "2m", "1h30m"); those that took a plain number
// before still take one in their old unit (seconds; milliseconds through the deprecated -ms
// spellings). Leader election: kube-scheduler's --leader-elect* flags (LeaderElectFlags), on by
// default (--leader-elect=false for a single replica).
struct SlurmBridgeFlags {
  std::string kubeconfig, context;
  std::string slurm_bin_dir, slurm_conf;
  // The REST backend (Slurm >= 23.02's slurmrestd, v0.0.39) instead of scontrol/squeue when set.
  std::string slurm_rest_url, slurm_rest_user, slurm_rest_token_file, slurm_rest_token;
  std::chrono::milliseconds slurm_timeout{10000};  // --slurm-timeout
  double kube_qps = 50;
  std::vector<std::string> nodes;
  int max_lent = 1, min_kept = 1;
  std::chrono::seconds lend_threshold{30}, reclaim_threshold{0}, cooldown{120}, lend_hysteresis{60};
  std::chrono::seconds lend_duration{0}, force_delete_after{0};
  std::chrono::milliseconds interval{2000}, confirm_gap{1000};
  std::vector<std::string> gpu_resources = {"nvidia.com/gpu"};
  bool dry_run = false, once = false;
  LeaderElectFlags leader{.enabled = true, .resource_name = "kgpu-slurm-bridge"};
  std::string identity;
  std::string metrics_listen;              // host:port; empty: no metrics server
  std::string crash_at;                    // --crash-at: a test hook, hidden from --help
  bool json = false;                       // status
  std::vector<std::string> reclaim_nodes;  // reclaim, hook: node names or hostlists
  std::string reclaim_reason = "operator";
  std::string lend_via = "drain";  // drain | power-save
  std::string resume_command;      // power-save: split as a shell would (SplitCommandLine), no shell, {node} replaced
  std::chrono::seconds resume_retry{20}, resume_timeout{60};
  std::string hook_event;  // hook: suspend | resume
};

struct SlurmBridgeCommands {
  CLI::App* run = nullptr;
  CLI::App* status = nullptr;
  CLI::App* reclaim = nullptr;
  CLI::App* hook = nullptr;
};
SlurmBridgeCommands AddSlurmBridgeCommands(CLI::App* app, SlurmBridgeFlags* flags);
int RunSlurmBridge(const SlurmBridgeFlags& flags, const volatile std::sig_atomic_t* stop, std::ostream& out);
int RunSlurmBridgeStatus(const SlurmBridgeFlags& flags, std::ostream& out);
int RunSlurmBridgeReclaim(const SlurmBridgeFlags& flags, std::ostream& out);
// Slurm's SuspendProgram/ResumeProgram (`hook suspend|resume HOSTLIST`): one annotation per node,
// then exit; never blocks slurmctld long and never starts a daemon.
int RunSlurmBridgeHook(const SlurmBridgeFlags& flags, std::ostream& out);

}  // namespace kgpu::cli
