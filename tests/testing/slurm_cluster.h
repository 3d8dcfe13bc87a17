#pragma once
// Test helper: a private Slurm 22.05 cluster on this machine (docs/slurm.md, "Testing"; the
// recipe of the Slurm facts, §B/§B.6): its own munged (key and socket under a temp dir),
// slurmctld, and one real `slurmd -N <node>` per node with a distinct Port= on 127.0.0.1
// (CommunicationParameters=NoInAddrAny,NoCtldInAddrAny), state, spool and logs under the same
// dir, cgroup-free plugins, fake GPUs as character devices (mknod; a /dev/null symlink where
// mknod is refused). The daemons run in the foreground as our children, are stopped by PID
// (SIGTERM to all at once, SIGKILL after a deadline) and die with the test process
// (PR_SET_PDEATHSIG) unless `detach` is set (for `kgpu-slurm-testcluster up`). Every wait is on a
// condition with a generous deadline; Start() cleans up after itself when it fails.
//
// Needs root (mknod, munged --force, slurmd) and the Debian packages slurmctld slurmd
// slurm-client munge: Unavailable() says what is missing.
//
// Thread-safety: one thread drives a cluster; Run() may be called from any thread.

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <sys/types.h>

#include "absl/status/status.h"
#include "common/process.h"

namespace kgpu::testing {

struct SlurmClusterOptions {
  std::vector<std::string> nodes = {"node1", "node2"};
  unsigned gpus_per_node = 2;  // fake /dev/nvidiaN under <base>/dev/<node>/ and Gres=gpu:tesla:N
  unsigned cpus_per_node = 2;
  // Per node: the rest of its NodeName line (after NodeName/NodeAddr/NodeHostname/Port), e.g.
  // "CPUs=2 RealMemory=1000 Gres=gpu:nvidia_h100:2"; default from cpus/gpus_per_node.
  std::map<std::string, std::string> node_params;
  std::string gres_conf;              // whole gres.conf; empty: File=<base>/dev/<node>/nvidia[..]
  std::string gres_types = "gpu";     // GresTypes=
  std::string extra_conf;             // appended to slurm.conf
  std::string base;                   // empty: a new /tmp/kgpu-slurm-XXXXXX (short: unix sockets)
  bool detach = false;                // daemons outlive this process (no PDEATHSIG, no Stop in ~)
  std::chrono::seconds deadline{90};  // for each wait of Start/StartController/StartSlurmd
};

class SlurmCluster {
 public:
  // Empty when a cluster can be started here; otherwise why not (for GTEST_SKIP).
  static std::string Unavailable();

  explicit SlurmCluster(SlurmClusterOptions options = {});
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // Writes the config, starts munged, slurmctld and every slurmd, and waits until every node is
  // IDLE and responding. On failure everything started is stopped and the logs are in the error.
  absl::Status Start();
  // Stops every daemon (by PID) and removes the directory (kept when KGPU_KEEP_SLURM is set).
  void Stop();

  absl::Status StopController();
  // Starts slurmctld again on the same state and waits until it answers a ping.
  absl::Status StartController();
  absl::Status StopSlurmd(const std::string& node);
  // as_rebooted: `slurmd -b`, which registers as a node that rebooted (what a node powered up
  // through ResumeProgram must do before Slurm counts it as resumed).
  absl::Status StartSlurmd(const std::string& node, bool as_rebooted = false);

  // Slurm's power saving with kgpu's hooks, as docs/slurm.md asks a site to set it up (call before
  // Start()): SuspendProgram/ResumeProgram run `<kgpu> slurm-bridge hook suspend|resume
  // --kubeconfig <kubeconfig> "$1"` (output in <base>/hooks/hooks.log), every node in
  // SuspendExcNodes (no automatic suspension), SuspendTimeout=5, ResumeTimeout=90.
  void EnablePowerSave(const std::string& kgpu, const std::string& kubeconfig);
  // A bridge --resume-command that asks ServeResumeRequests() (it touches <base>/resume-<node>).
  std::string ResumeCommand() const { return "touch " + base_ + "/resume-{node}"; }
  // The node side of that command, once: for each node asked for, `before(node)` (may be empty),
  // then its slurmd restarted with -b (registers as rebooted). Returns each node served and how.
  std::vector<std::pair<std::string, absl::Status>> ServeResumeRequests(
      const std::function<void(const std::string&)>& before = {});

  const std::string& base() const { return base_; }
  std::string conf() const { return base_ + "/etc/slurm.conf"; }
  // The node's device nodes (nvidia0...) are in dev_dir(node) = dev_root(node) + "/dev".
  std::string dev_root(const std::string& node) const { return base_ + "/nodes/" + node; }
  std::string dev_dir(const std::string& node) const { return dev_root(node) + "/dev"; }
  const std::vector<std::string>& nodes() const { return options_.nodes; }
  // The options, to change before Start() (the directory exists from construction on).
  SlurmClusterOptions& mutable_options() { return options_; }

  // A Slurm command (scontrol, squeue, sbatch, ...) with SLURM_CONF set; no shell.
  ProcessResult Run(const std::vector<std::string>& argv,
                    std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;
  // scontrol's State= of a node ("IDLE+DRAIN"), "" when it cannot be read.
  std::string State(const std::string& node) const;
  // The Reason= of a node ("" when none).
  std::string Reason(const std::string& node) const;
  // sbatch --parsable <args> (output to /dev/null); the job id, or "" on failure.
  std::string Submit(const std::vector<std::string>& args) const;
  // squeue's %T of a job ("" when squeue no longer lists it).
  std::string JobState(const std::string& id) const;

  // Polls `cond` every `every` until it holds or `deadline` passes.
  static bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds deadline,
                      std::chrono::milliseconds every = std::chrono::milliseconds(100));
  // The last lines of every daemon log, for failure messages.
  std::string Logs(size_t lines_per_file = 15) const;

 private:
  pid_t Spawn(const std::string& name, const std::vector<std::string>& argv);
  absl::Status WaitNodesIdle(const std::vector<std::string>& nodes);
  void Kill(const std::vector<std::string>& names);

  SlurmClusterOptions options_;
  std::string base_;
  bool own_base_ = false;
  int ctld_port_ = 0;
  std::map<std::string, int> node_ports_;
  std::map<std::string, pid_t> pids_;  // "munged", "slurmctld", "slurmd-<node>"
};

// Stops the daemons of a detached cluster by the PID files under <base>/run, and removes <base>.
void StopDetachedCluster(const std::string& base);

}  // namespace kgpu::testing
