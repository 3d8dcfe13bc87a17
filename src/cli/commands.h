#pragma once
// The node-side CLI commands: `kgpu devices` (what this node has) and `kgpu doctor` (why
// nvidia.com/gpu is or is not visible). Each returns the process exit code and writes to `out`.
//
// Thread-safety: each call is independent.

#include <chrono>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/inventory.h"
#include "nvml/library.h"

namespace kgpu::cli {

struct NodeOptions {
  std::string nvml_library;         // --nvml-library (else KGPU_NVML_LIBRARY, else by soname)
  std::string sysfs_root = "/sys";  // --sysfs-root
  // The directory of the device nodes (/dev/nvidia*): doctor's --dev-root + "/dev", or the
  // deprecated global --dev-root (the directory itself); empty: /dev (doctor) or the device
  // plugin's NVIDIA_DEV_ROOT (slurm gres).
  std::string dev_dir;
  // kgpu doctor: where the device plugins' sockets and the MPS daemons live.
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string mps_root = "/run/nvidia/mps";
  std::string mps_control = "nvidia-cuda-mps-control";
  // kgpu doctor's cluster checks: with a kubeconfig, or in-cluster when asked.
  std::string kubeconfig, kube_context, node_name;
  bool in_cluster = false;
  // kgpu doctor / devices (--nvml-deadline-ms): a GPU whose NVML calls take longer is reported
  // hung instead of blocking the command. 0: no deadline (wait for NVML).
  std::chrono::milliseconds nvml_deadline{0};
};

// One NVML session and the inventory discovered through it.
struct Session {
  std::shared_ptr<nvml::Library> lib;  // shared with threads left in a hung NVML call
  std::shared_ptr<const gpu::Inventory> inventory;
};
// Opens NVML and discovers the GPUs (within options.nvml_deadline per GPU when set); errors say
// which of the two failed.
absl::StatusOr<Session> OpenSession(const NodeOptions& options);
// GPU index -> UUID as the kgpu device plugin in options.kubelet_dir last served them (its
// health file), for naming a GPU NVML cannot read now; empty when there is none.
std::map<unsigned, std::string> PluginGpuUuids(const NodeOptions& options);
// The health a running kgpu device plugin in options.kubelet_dir serves now (its health file),
// per device ID; empty when no plugin socket there answers ListAndWatch or there is no file.
std::map<std::string, std::pair<bool, std::string>> PluginServedHealth(const NodeOptions& options);

int RunDevices(const NodeOptions& options, bool json, std::ostream& out);

enum class Verdict { kPass, kWarn, kFail };
struct Check {
  std::string name;
  Verdict verdict = Verdict::kPass;
  std::string detail;
  std::string fix;  // what to do (empty on PASS)
};

std::vector<Check> DoctorChecks(const NodeOptions& options);
// Prints the checks; returns 1 when any failed, else 0.
int RunDoctor(const NodeOptions& options, bool json, std::ostream& out);

}  // namespace kgpu::cli

#include <chrono>
#include <csignal>
#include <optional>

namespace kgpu::cli {
// Prints the health of every device, then each change, for `duration` (0: until *stop is set).
// `recover_after`: a faulty device turns healthy again this long after its last fault (none:
// never).
int RunHealth(const NodeOptions& options, std::chrono::seconds duration, std::chrono::milliseconds probe_interval,
              std::optional<std::chrono::milliseconds> recover_after, const volatile std::sig_atomic_t* stop,
              std::ostream& out);
}  // namespace kgpu::cli
