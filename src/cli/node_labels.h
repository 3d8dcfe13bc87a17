#pragma once
// Publishing what schedulers need about this node to the Kubernetes API:
//  - GFD-compatible labels (deviceplugin/gfd_labels.h) patched onto the Node (JSON merge patch on
//    metadata.labels; RBAC: get and patch nodes), or written as an NFD feature file, as GFD
//    offers; only labels we own are ever set or removed;
//  - the GPU inventory annotation kgpu.io/gpu-inventory for the scheduler extender: compact,
//    versioned JSON (per GPU index, UUID, model, memory MiB, NUMA node, health (the plugin's live
//    health when the node agent publishes it, else discovery's), MIG
//    devices with profiles; NVLink and PCIe-switch islands; the sharing mode and slots), written
//    only when it changes.
// `kgpu node-labels` runs it once or on an interval (GFD's --sleep-interval), relabelling when the
// inventory (a MIG re-partition) or the config (sharing) changes. The node agent (`kgpu node`,
// `kgpu device-plugin` with --publish-labels) runs the same NodeLabeller in a LabelPublisher:
// on the interval and whenever what the plugin advertises changes (a device's health, a MIG
// re-partition, a SIGHUP reload), with the plugin's live health in the annotation.
//
// Thread-safety: functions are reentrant; each call does its own API requests. A NodeLabeller is
// used by one thread at a time; LabelPublisher's methods are thread-safe (Notify() may be called
// under any lock: it only records and wakes).

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "api/names.h"
#include "cli/commands.h"
#include "deviceplugin/config.h"
#include "gpu/inventory.h"
#include "k8s/client.h"

namespace kgpu::deviceplugin {
class Manager;
}

namespace kgpu::cli {

struct DevicePluginFlags;

using api::kInventoryAnnotation;

// The plugin's live health per GPU UUID and MIG UUID (deviceplugin::Manager::Advertised::healthy).
using LiveHealth = std::map<std::string, bool>;

// The annotation's value (format version 1). Per GPU (and MIG device) `health` is "lost" or
// "error" when discovery says so, else, with `live`, "unhealthy" when the plugin serves any of its
// devices Unhealthy, else "ok". Without `live` (or for a UUID it lacks) discovery's health.
// With `used` (GPU UUID -> MiB in use, UsedMemory), each GPU it names also carries `usedMiB`: the
// extender compares it with the allocation records to see untracked users (facts §7(b)6).
using UsedMemoryMiB = std::map<std::string, int64_t>;
std::string InventoryAnnotation(const gpu::Inventory& inventory, const deviceplugin::Config& config,
                                const LiveHealth* live = nullptr, const UsedMemoryMiB* used = nullptr);

// The memory in use on each GPU that is not in MIG mode (NVML: every process and context, not
// the driver's reservation where the v2 call reports it), per UUID, in steps: a reading replaces
// the one in `*last` only when it moved by kUsedMemoryStepMiB or more, so that the annotation (and
// every Node watcher) changes on real changes, not on every allocation. GPUs NVML cannot read are
// left out.
inline constexpr int64_t kUsedMemoryStepMiB = 512;
UsedMemoryMiB UsedMemory(const nvml::Library& lib, const gpu::Inventory& inventory, UsedMemoryMiB* last);

// The merge patch that brings `node` to the desired labels and annotation: owned labels not
// desired become null, changed ones are set, others untouched; the annotation only when it
// differs. Null when nothing changes.
nlohmann::json NodePatch(const nlohmann::json& node, const std::map<std::string, std::string>& labels,
                         const std::string& inventory_annotation);

struct PublishResult {
  bool patched = false;
  size_t labels_set = 0, labels_removed = 0;
  bool annotation_changed = false;
  bool capacity_changed = false;
};

// The node-level capacity of kgpu.io/gpu shares for cluster autoscalers (facts
// schedulers-and-quota §7(b)9): kgpu.io/gpu-memory = the memory (MiB) and kgpu.io/gpu-cores = 100
// per GPU that serves kgpu.io/gpu slots, whatever their health (a coarse upper bound: the extender
// places each share on one GPU that fits it; kubelet's admission sums requests against it and so
// never refuses what the extender placed). Empty when the node serves no shares.
std::map<std::string, int64_t> ShareCapacity(const gpu::Inventory& inventory, const deviceplugin::Config& config);

// The merge patch of the node's status that brings capacity and allocatable of kgpu.io/gpu-memory
// and kgpu.io/gpu-cores to `capacity` (absent names are removed where present). Null when nothing
// changes.
nlohmann::json CapacityPatch(const nlohmann::json& node, const std::map<std::string, int64_t>& capacity);

// Labels and annotation (one merge patch of metadata), then, with `capacity`, the share capacity
// (one merge patch of nodes/status); each only when something changed.
absl::StatusOr<PublishResult> PublishToNode(k8s::Client& client, const std::string& node_name,
                                            const std::map<std::string, std::string>& labels,
                                            const std::string& inventory_annotation,
                                            const std::map<std::string, int64_t>* capacity = nullptr);

// Writes the NFD feature file atomically (temporary file, then rename).
absl::Status WriteFeatureFile(const std::string& path, const std::map<std::string, std::string>& labels);

struct NodeLabelsFlags {
  bool publish = false;  // kgpu node / device-plugin: --publish-labels
  std::string kubeconfig, context;
  bool in_cluster = false;
  std::string node_name;       // NODE_NAME
  std::string output = "api";  // api | file
  std::string feature_file = "/etc/kubernetes/node-feature-discovery/features.d/gfd";
  std::chrono::seconds interval{60};  // --sleep-interval; 0: once (node-labels), on change only (agent)
  bool oneshot = false;
  bool no_timestamp = false;
  // GFD's --machine-type-file (GFD_MACHINE_TYPE_FILE): nvidia.com/gpu.machine, "unknown" when it
  // cannot be read (or is "").
  std::string machine_file = "/sys/class/dmi/id/product_name";
};
void AddNodeLabelsFlags(CLI::App* app, NodeLabelsFlags* flags);
// The same for the node agent, opt-in: --publish-labels, --kubeconfig, --context, --in-cluster,
// --node-name, and GFD's --output-file, --sleep-interval, --no-timestamp, --machine-type-file with
// kgpu node-labels' --output (the --labels-* spellings of earlier releases are deprecated aliases).
void AddPublishLabelsFlags(CLI::App* app, NodeLabelsFlags* flags);

// One pass's labels and annotation, to the Node (--output api) or the feature file (--output file).
class NodeLabeller {
 public:
  // Errors name the flag to fix (no node name, an unusable kubeconfig).
  static absl::StatusOr<std::unique_ptr<NodeLabeller>> Create(const NodeLabelsFlags& flags);
  // Publishes what `inventory` and `config` give (and the live health, when known). The log line
  // says what changed; an error is the API's or the file's.
  absl::Status Publish(const gpu::Inventory& inventory, const deviceplugin::Config& config, const LiveHealth* live,
                       const UsedMemoryMiB* used = nullptr);
  const NodeLabelsFlags& flags() const { return flags_; }

 private:
  explicit NodeLabeller(const NodeLabelsFlags& flags) : flags_(flags) {}
  const NodeLabelsFlags flags_;
  std::unique_ptr<k8s::Client> client_;
  std::optional<std::string> machine_;  // the machine type file's content; nullopt: unreadable
};

// Runs a NodeLabeller beside a running device plugin: a pass at Start, every interval, and soon
// after each Notify() (bursts within `debounce` make one pass); a failed pass is retried with
// backoff (1 s doubling, at most the interval). Stop() ends it (also the destructor).
class LabelPublisher {
 public:
  struct Snapshot {
    std::shared_ptr<const gpu::Inventory> inventory;
    std::shared_ptr<const deviceplugin::Config> config;
    LiveHealth healthy;
    UsedMemoryMiB used;  // UsedMemory
  };
  // What to publish now; an error skips the pass (logged, retried with backoff). A snapshot
  // without a config (the plugin is not serving yet) skips it silently until the next Notify().
  using Source = std::function<absl::StatusOr<Snapshot>()>;
  // Passes every `interval` (0: only at Start and on Notify()).
  LabelPublisher(std::unique_ptr<NodeLabeller> labeller, Source source, std::chrono::seconds interval,
                 std::chrono::milliseconds debounce = std::chrono::milliseconds(200));
  ~LabelPublisher();
  LabelPublisher(const LabelPublisher&) = delete;
  LabelPublisher& operator=(const LabelPublisher&) = delete;

  void Start();
  void Stop();
  void Notify();
  // A Notify() that outlives this publisher safely (a no-op once it stopped): for hooks such as
  // deviceplugin::Manager::SetOnChange held by objects that live longer.
  std::function<void()> Notifier();
  uint64_t passes() const;  // completed passes, successful or not (tests, logs)

 private:
  struct Hook {
    std::mutex mu;
    LabelPublisher* target = nullptr;  // null once stopped
  };
  void Loop(std::stop_token stop);
  const std::shared_ptr<Hook> hook_ = std::make_shared<Hook>();
  std::unique_ptr<NodeLabeller> labeller_;
  const Source source_;
  const std::chrono::seconds interval_;
  const std::chrono::milliseconds debounce_;
  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  bool pending_ = false;
  uint64_t passes_ = 0;
  std::jthread thread_;
};

// For `kgpu node` and `kgpu device-plugin`: null when --publish-labels was not given; else a
// started publisher fed by `manager`, hooked to its changes with SetOnChange (so call this before
// manager.Start(); its first pass follows the start) and stopped before the manager. Errors name
// the flag to fix.
absl::StatusOr<std::unique_ptr<LabelPublisher>> MakeLabelPublisher(deviceplugin::Manager& manager,
                                                                   const NodeLabelsFlags& flags);

// Runs until *stop is set (or once). Returns the exit code.
int RunNodeLabels(const NodeOptions& node, const DevicePluginFlags& dp, const NodeLabelsFlags& flags,
                  const volatile std::sig_atomic_t* stop, std::ostream& out);

// `kgpu node-template`: what a node like this one would advertise, for a cluster-autoscaler node
// group that scales from zero (it has no node to copy): the device plugin's resources (with the
// config's sharing and MIG strategy, every device healthy), the share capacity (ShareCapacity)
// and the GPU Feature Discovery labels. format: yaml (capacity + labels), aws (the ASG tags
// k8s.io/cluster-autoscaler/node-template/resources/<name> and .../label/<key>) or json (main.cc
// accepts only those three). Exit 0; 1 when NVML or the config fails.
int RunNodeTemplate(const NodeOptions& node, const DevicePluginFlags& dp, const std::string& format, std::ostream& out);

}  // namespace kgpu::cli
