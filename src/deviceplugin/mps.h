#pragma once
// MPS control daemons, one per MPS-shared resource, managed by the device plugin itself (NVIDIA
// needs a separate mps-control-daemon DaemonSet and a GFD label for this; a missing one is its
// most reported MPS failure). The layout under mpsRoot is NVIDIA's, so pods and tools that know it
// keep working:
//
//   <mpsRoot>/<resource>/pipe       CUDA_MPS_PIPE_DIRECTORY of the daemon (mounted into pods)
//   <mpsRoot>/<resource>/log        CUDA_MPS_LOG_DIRECTORY (control.log)
//   <mpsRoot>/<resource>/.started   the daemon was started and configured
//   <mpsRoot>/shm                   mounted into pods at /dev/shm (should be a tmpfs)
//   <mpsRoot>/.ready                every daemon of this plugin is up
//
// Start: compute mode EXCLUSIVE_PROCESS on each GPU (NVML), `nvidia-cuda-mps-control -d` with
// CUDA_VISIBLE_DEVICES = the resource's GPUs, then through the pipe
// `set_default_device_pinned_mem_limit <i> <M>M` and `set_default_active_thread_percentage <P>`.
// The defaults are one replica's share (memory / replicas, 100 / replicas) when a container can get
// only one replica (failRequestsGreaterThanOne), else the most one container can be given (all
// replicas of a GPU); each container is then held to its own share by the
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT / CUDA_MPS_ACTIVE_THREAD_PERCENTAGE its Allocate sets (clients
// may only lower the daemon's limits). Probe: `get_default_active_thread_percentage` through the
// pipe. Stop: `quit`, compute mode back to DEFAULT, .started removed.
//
// Thread-safety: a daemon object is used from one thread at a time (the Manager's).

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deviceplugin/allocator.h"
#include "deviceplugin/config.h"
#include "deviceplugin/plan.h"
#include "nvml/library.h"

namespace kgpu::deviceplugin {

// Runs `control` (nvidia-cuda-mps-control) as a client with CUDA_MPS_PIPE_DIRECTORY=pipe_dir, sends
// `command` on its standard input and returns what it printed. Errors name the binary, the pipe
// directory and the command; a client that hangs is killed after `timeout`.
absl::StatusOr<std::string> MpsCommand(const std::string& control, const std::string& pipe_dir,
                                       const std::string& command, std::chrono::milliseconds timeout);

// What the daemon of a resource is told.
struct MpsLimits {
  std::vector<std::pair<unsigned, uint64_t>> pinned_mib;  // (device ordinal seen by the daemon, MiB)
  int thread_percentage = 100;
};
MpsLimits DaemonLimits(const Plan& plan, const Resource& resource);

// What a client container of `resource`'s daemon gets, for MPS replicas (allocator.cc) and for
// kgpu.io/gpu shares in mps mode (src/cli/share_handoff.cc): CUDA_MPS_PIPE_DIRECTORY = the
// daemon's pipe directory, mounted at /mps/<resource>/pipe, and the host's <mpsRoot>/shm as
// /dev/shm (the daemon and its clients share memory there).
struct MpsClient {
  std::string pipe_dir;  // in the container: the value of CUDA_MPS_PIPE_DIRECTORY
  std::vector<MountSpec> mounts;
};
MpsClient MpsClientFor(const std::string& mps_root, const std::string& resource);

class MpsDaemon {
 public:
  MpsDaemon(const nvml::Library& lib, std::shared_ptr<const Plan> plan, size_t resource_index,
            std::shared_ptr<const Config> config);
  ~MpsDaemon();
  MpsDaemon(const MpsDaemon&) = delete;
  MpsDaemon& operator=(const MpsDaemon&) = delete;

  // Prepares the directories and the GPUs, starts and configures the daemon. Idempotent: a daemon
  // already answering on the pipe is configured again, not started twice.
  absl::Status Start();
  // The readiness probe: the daemon answers through the pipe.
  absl::Status Probe() const;
  // Stops the daemon and restores the GPUs' compute mode. Idempotent.
  void Stop();

  const std::string& resource_name() const;
  std::string dir() const;  // <mpsRoot>/<resource>
  bool started() const { return started_; }

 private:
  const nvml::Library& lib_;
  const std::shared_ptr<const Plan> plan_;
  const size_t index_;
  const std::shared_ptr<const Config> config_;
  // Stops a daemon that left its pid in `pipe` but no longer answers (SIGTERM, then SIGKILL).
  void KillStale(const std::string& pipe);

  bool started_ = false;  // started and configured
  bool touched_ = false;  // something to undo: a compute mode set, a daemon started
};

// Writes or removes <mpsRoot>/.ready.
void MarkMpsReady(const Config& config, bool ready);

}  // namespace kgpu::deviceplugin
