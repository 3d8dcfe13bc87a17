#pragma once
// The device plugin's configuration: NVIDIA k8s-device-plugin's `version: v1` file schema, read
// unchanged (an existing NVIDIA config file works as is), plus kgpu's additions, which NVIDIA
// parses but ignores or does not have:
//   - sharing.timeSlicing.resources[].devices / rename are honoured (per-GPU sharing);
//   - a `health:` section (XID policy, recovery) next to NVIDIA's DP_*_HEALTHCHECKS variables.
// Flags and environment variables keep NVIDIA's names; precedence is flag > env > file.
//
// Thread-safety: plain values; the parser is pure.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/files.h"
#include "gpu/health.h"
#include "gpu/inventory.h"
#include "gpu/mig_layout.h"

namespace kgpu::deviceplugin {

struct ReplicatedResource {
  std::string name;  // "nvidia.com/gpu"
  int replicas = 0;
  std::string rename;  // kgpu: honoured; empty = name (or name.shared with renameByDefault)
  // Which GPUs: empty = all; else GPU indices ("0"), MIG indices ("0:1") or UUIDs.
  std::vector<std::string> devices;
  // Where the file declared them ("config.yaml:7:7"; empty when not from a file), so errors found
  // against this node's GPUs (a device that does not exist) still name the file, line and column.
  std::string position;
  std::vector<std::string> device_positions;  // one per element of `devices`
};

enum class SharingStrategy { kNone, kTimeSlicing, kMps };

struct Sharing {
  SharingStrategy strategy = SharingStrategy::kNone;
  bool rename_by_default = false;
  bool fail_requests_greater_than_one = false;
  // kgpu, timeSlicing only (memoryIsolation: hard): each replica's container is held to the GPU's
  // memory / replicas by the CUDA interposer (--cuda-interposer, docs/isolation.md).
  bool hard_memory = false;
  std::vector<ReplicatedResource> resources;
};

struct HealthConfig {
  bool disabled = false;                                                // DP_DISABLE_HEALTHCHECKS=all|xids
  std::set<uint64_t> ignored_xids = gpu::HealthOptions{}.ignored_xids;  // NVIDIA's application XIDs
  std::set<uint64_t> fatal_xids;  // DP_ENABLE_HEALTHCHECKS: override the ignore list
  bool all_xids_fatal = false;    // DP_ENABLE_HEALTHCHECKS=all
  // kgpu: return to Healthy this long after the last fault once a probe succeeds (nullopt: never).
  std::optional<std::chrono::milliseconds> recover_after = gpu::kDefaultRecoverAfter;
  std::chrono::milliseconds probe_interval = gpu::HealthOptions{}.probe_interval;  // kgpu: liveness probe
  std::chrono::milliseconds hang_threshold = gpu::HealthOptions{}.hang_threshold;  // kgpu: a hung NVML call
};

// kgpu: declared MIG layouts (mig-parted's entry schema) and which node uses which.
struct MigConfig {
  std::map<std::string, gpu::MigLayout> layouts;
  std::vector<std::pair<std::string, std::string>> nodes;     // node-name glob → layout name, in file order
  std::map<std::string, std::vector<std::string>> positions;  // layout name → "file:line:col" of each entry
  std::string nodes_position;                       // "file:line:col" of mig.nodes (empty when the file has none)
  std::chrono::milliseconds rescan_interval{5000};  // plugin: how often to look for a MIG change
};

// The health monitor's options for `health` (the ignore list, recovery, probes; hooks unset): the
// device plugin's and the DRA driver's monitor read the config the same way.
gpu::HealthOptions HealthOptionsFor(const HealthConfig& health);

// The layout `node` uses: the first `mig.nodes` glob that matches. NotFound when none does.
absl::StatusOr<std::string> LayoutForNode(const MigConfig& mig, const std::string& node);

// The values of --cuda-interposer-load (deviceplugin/interposer.h says what each does).
inline constexpr char kInterposerLoadEnv[] = "env";
inline constexpr char kInterposerLoadFile[] = "ld.so.preload";

struct Config {
  // flags.* (NVIDIA)
  std::string mig_strategy = "none";
  bool fail_on_init_error = true;
  std::string driver_root = "/";
  std::string dev_root;  // empty: = driver_root
  // The root of the host's device nodes, NVIDIA_DEV_ROOT's meaning: dev_root, else driver_root.
  const std::string& DevRoot() const { return dev_root.empty() ? driver_root : dev_root; }
  // The host path of the device node `dev_path` ("/dev/nvidia0") under DevRoot().
  std::string HostDevPath(std::string_view dev_path) const { return UnderRoot(DevRoot(), dev_path); }
  std::string mps_root;
  bool gds_enabled = false, mofed_enabled = false, gdrcopy_enabled = false;
  // flags.plugin.* (NVIDIA)
  bool pass_device_specs = false;
  std::vector<std::string> device_list_strategy = {"envvar"};
  std::string device_id_strategy = "uuid";
  std::string cdi_annotation_prefix = "cdi.k8s.io/";
  std::string nvidia_ctk_path = "/usr/bin/nvidia-ctk";
  std::string container_driver_root = "/driver-root";
  std::string shared_devices_allocation_policy = "distributed";
  // imex
  std::vector<int> imex_channel_ids;
  bool imex_required = false;

  Sharing sharing;
  HealthConfig health;
  MigConfig mig;

  // Not in NVIDIA's file: flags/env only.
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string kubelet_socket;  // default <kubelet_dir>/kubelet.sock; empty after "-": no registration
  std::string cdi_spec_dir = "/var/run/cdi";
  // The CUDA memory interposer (docs/isolation.md) for `hard` shares: its host path, in a
  // versioned directory that is never written over (a running pod keeps the file it mapped), and
  // the host directory under which each container gets its accounting region. Empty interposer:
  // this node offers no `hard` enforcement.
  std::string cuda_interposer;
  std::string cuda_shared_root = "/var/lib/kgpu/cuda";
  std::string cuda_interposer_load = kInterposerLoadEnv;  // or kInterposerLoadFile (deviceplugin/interposer.h)
  // Every this often, the accounting directories of time-slicing replicas that no container
  // mounts any more are removed (SweepTimeslicingRegions, interposer.h; 0: never), once older than
  // cuda_accounting_grace. Flag --cuda-accounting-sweep, which also sweeps kgpu.io/gpu's.
  std::chrono::seconds cuda_accounting_sweep{600};
  std::chrono::seconds cuda_accounting_grace{120};
  // The host's procfs, where the driver's /proc/driver/nvidia and /proc/driver/nvidia-caps trees
  // are (kernel-global, so not under the driver root): MIG capability minors come from
  // <proc_root>/driver/nvidia-caps/mig-minors.
  std::string proc_root = "/proc";
  std::string mps_control = "nvidia-cuda-mps-control";  // MPS control binary (PATH lookup when bare)
  std::vector<std::string> warnings;                    // ignored fields, as NVIDIA warns about them
  // "file:line:col" of the file's sections and keys that later checks name ("sharing.mps",
  // "flags.mpsRoot", ...); only those the file has.
  std::map<std::string, std::string> positions;
};

// The largest sharing.*.resources[].replicas: every replica is a device ID in every ListAndWatch
// message and kubelet checkpoint.
inline constexpr int kMaxReplicas = 1024;

struct ParseOptions {
  // An empty file (or one with only comments) is an error unless this is set (--allow-empty-config):
  // a config that silently means "all defaults" hides a wrong path or a truncated ConfigMap.
  bool allow_empty = false;
};

// Parses a config file's text (YAML or JSON). Errors read "<origin>:<line>:<col>: ...", with the
// input escaped (Printable). Every value of the file is checked here, enumerations included.
absl::StatusOr<Config> ParseConfig(std::string_view text, std::string_view origin, const ParseOptions& options = {});
// Reads and parses a file; a missing file, a directory or an unreadable file is an error naming it.
absl::StatusOr<Config> LoadConfigFile(const std::string& path, const ParseOptions& options = {});

// Validates the combination (flags and file merged); the message names the field and the fix, and
// starts with the file position when the file's part of the combination is known (positions).
absl::Status Validate(const Config& config);

// Applies DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS values (NVIDIA's semantics).
absl::Status ApplyHealthcheckEnv(const std::string& disable, const std::string& enable, HealthConfig* health);

// The kgpu.io/gpu slots GPU `g` serves (time-slicing or MPS of nvidia.com/gpu renamed to
// kgpu.io/gpu, on every GPU or on those the entry's devices name); 0 for none, and for a GPU in MIG
// mode. The one answer to "does this node offer GPU g for sharing" (node labels, the inventory
// annotation, DRA's consumable shares).
int ShareSlotsOf(const gpu::Gpu& g, const Config& config);

// "nvidia.com/gpu" -> "nvidia-gpu.sock" (NVIDIA's socket naming); "kgpu.io/gpu" -> "kgpu.io-gpu.sock".
std::string SocketName(const std::string& resource);

}  // namespace kgpu::deviceplugin
