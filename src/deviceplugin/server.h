#pragma once
// The kubelet-facing side of the device plugin.
//
// ResourceServer: one gRPC DevicePlugin server per resource on its own unix socket in the kubelet
// directory. ListAndWatch sends the full list at once and again on every health change and never
// ends while the server lives; Allocate and GetPreferredAllocation read only the immutable plan
// (and, for whole GPUs and MIG, ask the PreferenceAdvisor, which reads the allocation records).
//
// Manager: builds the plan, serves and registers every resource, re-serves and re-registers
// when kubelet restarts (inotify on the kubelet directory) or its socket disappears, retries with
// backoff while kubelet is absent, feeds health changes to the servers, reloads on request.
// Its maintenance thread re-discovers the GPUs when their MIG layout changes (on NVML's MIG
// configuration-change event, once the burst is over, and every mig.rescanInterval as the
// fallback) and re-serves; a resource that no longer exists keeps being served with zero
// devices (also one kubelet's checkpoint lists from before a plugin restart), so node capacity
// drops to 0 instead of lingering. It also runs the MPS control daemons (mps.h): starts them, probes
// them, restarts one that stops answering, and keeps its resource Unhealthy meanwhile.
//
// Thread-safety: ResourceServer methods are thread-safe. Manager's Start/Stop/Reload are called
// from one owner thread; its internal threads synchronise with it.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/bounded_thread.h"
#include "common/log_once.h"
#include "deviceplugin/config.h"
#include "deviceplugin/plan.h"
#include "gpu/health.h"
#include "nvml/library.h"

namespace kgpu::deviceplugin {

struct DeviceState {
  std::string id;
  bool healthy = true;
  int numa = -1;
  bool operator==(const DeviceState&) const = default;
};

// Resolves a kgpu.io/gpu container at PreStartContainer: finds the container holding the slot
// `ids` and writes the CDI spec of device api::kShareCdiKind=`cdi_name` from its allocation record
// (cli/share_handoff.h). An error fails the container start; kubelet retries it.
using ShareResolver = std::function<absl::Status(const std::vector<std::string>& ids, const std::string& cdi_name)>;

// What kubelet gave a whole-GPU or MIG container, device by device, at PreStartContainer.
struct AssignedDevice {
  std::string gpu_uuid;    // the physical GPU
  std::string mig_uuid;    // MIG devices: the instance's UUID
  std::string profile;     // MIG devices: the profile
  int64_t memory_mib = 0;  // MIG devices: the instance's memory
  bool operator==(const AssignedDevice&) const = default;
};
// Told, at PreStartContainer of an nvidia.com/gpu or nvidia.com/mig-* container, which devices
// kubelet gave it (kubelet chooses them; its choice is the truth on the node), so that the pod's
// allocation record can be made to say exactly that (cli/share_handoff.h). It must return at once
// (the work goes to a queue: kubelet gives PreStartContainer 30 s) and never fails the container:
// whatever goes wrong later is logged, and the container starts on kubelet's devices.
using AssignmentReporter = std::function<void(const std::string& resource, const std::vector<std::string>& ids,
                                              const std::vector<AssignedDevice>& devices)>;
// Asked at GetPreferredAllocation of a whole-GPU or MIG resource (not replicas): the device sets
// that allocation records on this node choose for containers of this resource and size that hold
// none yet, the likeliest first (kubelet admits pods oldest first). kubelet is steered to the first
// of them it can give; with none, the plugin's own (NVLink-aware) preference stands. A wrong guess
// costs nothing but a correction: the record follows kubelet at PreStartContainer.
using PreferenceAdvisor =
    std::function<std::vector<std::vector<AssignedDevice>>(const std::string& resource, size_t size)>;

class ResourceServer {
 public:
  ResourceServer(std::shared_ptr<const Plan> plan, size_t resource_index, std::shared_ptr<const Config> config,
                 std::string socket_path);
  ~ResourceServer();
  ResourceServer(const ResourceServer&) = delete;
  ResourceServer& operator=(const ResourceServer&) = delete;

  // Removes a stale socket file, listens and serves.
  absl::Status Start();
  // Ends the streams, shuts the server down and removes the socket file.
  void Stop();
  // Recomputes device health from per-UUID health; pushes a ListAndWatch update if it changed.
  void SetHealth(const std::map<std::string, gpu::DeviceHealth>& health);
  // False while the resource cannot serve (its MPS daemon is not answering): every device is
  // Unhealthy, so kubelet admits no pod to it.
  void SetAvailable(bool available);
  // GPUs (UUIDs) being re-partitioned by `kgpu mig apply`: their devices are Unhealthy meanwhile.
  void SetDrained(const std::set<std::string>& gpu_uuids);
  // Runs whenever the device list ListAndWatch serves changes (under this server's lock: it must
  // only record and wake). Set before Start.
  void SetOnChange(std::function<void()> fn) { on_change_ = std::move(fn); }
  // kgpu.io/gpu only: who resolves PreStartContainer (none: it fails, naming the missing flags).
  void SetShareResolver(ShareResolver resolver);
  // Whole GPUs and MIG (not replicas): who is told kubelet's choice at PreStartContainer. Set
  // before Start: it makes the resource ask for PreStartContainer.
  void SetAssignmentReporter(AssignmentReporter reporter) { reporter_ = std::move(reporter); }
  // Whole GPUs and MIG: who suggests the extender's choice at GetPreferredAllocation. Before Start.
  void SetPreferenceAdvisor(PreferenceAdvisor advisor) { advisor_ = std::move(advisor); }
  // Whether kubelet must call PreStartContainer (GetDevicePluginOptions and Register say so).
  bool PreStartRequired() const;

  const Resource& resource() const { return plan_->resources[index_]; }
  const Plan& plan() const { return *plan_; }
  const std::string& socket_path() const { return socket_path_; }
  std::vector<DeviceState> Devices() const;
  uint64_t allocations() const { return allocations_.load(); }

 private:
  class Service;
  friend class Service;
  // One ListAndWatch stream: the device lists not sent yet.
  struct Stream {
    std::deque<std::vector<DeviceState>> pending;
  };
  static constexpr size_t kMaxPending = 256;  // a stream that stops reading cannot grow without bound
  // True when `before` has an Unhealthy device that `after` shows Healthy (or not at all).
  static bool HidesUnhealthy(const std::vector<DeviceState>& before, const std::vector<DeviceState>& after);
  static void Enqueue(Stream& stream, const std::vector<DeviceState>& devices);
  // devices_ from health_, available_ and drained_; pushes a ListAndWatch update on a change.
  void RecomputeLocked();
  // Maps kubelet's device IDs to GPUs and MIG instances and tells reporter_.
  void ReportAssignment(const std::vector<std::string>& ids) const;

  const std::shared_ptr<const Plan> plan_;
  const size_t index_;
  const std::shared_ptr<const Config> config_;
  const std::string socket_path_;
  std::unique_ptr<Service> service_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<DeviceState> devices_;
  std::map<std::string, gpu::DeviceHealth> health_;
  bool available_ = true;
  std::set<std::string> drained_;
  std::set<Stream*> streams_;  // open ListAndWatch streams
  bool stopping_ = false;
  std::atomic<uint64_t> allocations_{0};
  std::function<void()> on_change_;
  ShareResolver share_resolver_;  // guarded by mu_
  AssignmentReporter reporter_;   // set before Start, then read-only
  PreferenceAdvisor advisor_;     // set before Start, then read-only
  // The device ID standing for a GPU or MIG instance in this resource ("" when it has none).
  std::string DeviceIdOf(const AssignedDevice& d) const;
  // The advisor's first set that kubelet can give (all available, the must-include ones in it).
  std::optional<std::vector<std::string>> Advised(const std::vector<std::string>& available,
                                                  const std::vector<std::string>& must, size_t size) const;
};

// `kgpu mig apply` marks a GPU it is about to re-partition with the file
// <kubelet dir>/<kDrainPrefix><GPU UUID>; the plugin reports that GPU's devices Unhealthy until
// the file is gone, so kubelet admits no pod to it meanwhile.
inline constexpr char kDrainPrefix[] = ".kgpu-mig-drain-";

// The device-plugin sockets in a kubelet directory (file names, sorted; kubelet.sock excluded).
std::vector<std::string> PluginSockets(const std::string& kubelet_dir);

// What a device plugin serving on `socket` advertises: the first ListAndWatch message, as kubelet
// would read it (for `kgpu doctor`). Errors name the socket.
absl::StatusOr<std::vector<DeviceState>> ReadAdvertised(const std::string& socket, std::chrono::milliseconds timeout);

class Manager {
 public:
  Manager(const nvml::Library& lib, std::shared_ptr<const gpu::Inventory> inventory,
          gpu::DiscoverOptions discover = {});
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // Builds the plan from `config`, serves every resource, starts registration, the kubelet
  // watcher and the health monitor. Fails (and starts nothing) on an invalid config.
  absl::Status Start(const Config& config);
  // Applies a new config (SIGHUP). On error the running configuration stays in place.
  absl::Status Reload(const Config& config);
  // Stops everything and removes our sockets (SIGTERM).
  void Stop();
  // Before Start: resolves kgpu.io/gpu containers at PreStartContainer (every server gets it).
  void SetShareResolver(ShareResolver resolver) { share_resolver_ = std::move(resolver); }
  // Before Start: told kubelet's choice for whole-GPU and MIG containers (every server gets it).
  void SetAssignmentReporter(AssignmentReporter reporter) { reporter_ = std::move(reporter); }
  void SetPreferenceAdvisor(PreferenceAdvisor advisor) { advisor_ = std::move(advisor); }

  std::vector<std::string> ResourceNames() const;
  // Number of completed (re-)registrations, for tests and logs.
  uint64_t registrations() const { return registrations_.load(); }
  // The inventory the running plan was built from (changes when MIG is re-partitioned).
  std::shared_ptr<const gpu::Inventory> inventory() const;

  // What is advertised now, for publishing it (node labels, the inventory annotation).
  struct Advertised {
    std::shared_ptr<const gpu::Inventory> inventory;
    std::shared_ptr<const Config> config;
    // Per GPU UUID and MIG UUID that has devices: false when ListAndWatch serves any of them
    // Unhealthy (an XID, a lost GPU, a drain marker, an MPS daemon down).
    std::map<std::string, bool> healthy;
  };
  Advertised advertised() const;
  // The health monitor's state as served to kubelet (per GPU and MIG UUID): the process's one
  // health source, which `kgpu node`'s exporter reads. Empty while health checks are disabled.
  std::map<std::string, gpu::DeviceHealth> HealthSnapshot() const;
  // Before Start: told every XID the health monitor sees (from its event thread; keep it short).
  void SetXidObserver(std::function<void(unsigned gpu, unsigned gi, unsigned long long xid)> fn) {
    xid_observer_ = std::move(fn);
  }
  const nvml::Library& lib() const { return lib_; }
  // `fn` runs after what is advertised may have changed: a device's health, a MIG re-partition, a
  // reload (SIGHUP). It runs on the Manager's threads with their locks held: it must only record
  // and wake. Set before Start.
  void SetOnChange(std::function<void()> fn) { on_change_ = std::move(fn); }

 private:
  absl::Status StartServers();
  void StopServers();
  void RegisterLoop(std::stop_token stop);
  void WatchLoop(std::stop_token stop);
  void MaintenanceLoop(std::stop_token stop);
  void RestartServers(const char* why);
  void PublishHealth(const std::vector<gpu::DeviceHealth>& changes);
  // Every resource not yet registered with the kubelet now serving kubelet.sock registers again,
  // at once, on the servers as they are (a new kubelet whose cleanup the servers post-date).
  void Reregister(const char* why, const std::string& kubelet_socket);
  std::string KubeletSocket() const;
  void StartHealth();
  void StopHealth();
  void StartMps();
  void StopMps();
  void ProbeMps(bool force);
  // Plan + zero-device resources for every retired name.
  std::shared_ptr<const Plan> WithRetired(std::shared_ptr<const Plan> plan);
  // False when the new layout could not be read or advertised (the previous one stays).
  bool Rediscover();

  const nvml::Library& lib_;
  const gpu::DiscoverOptions discover_;
  ShareResolver share_resolver_;
  AssignmentReporter reporter_;
  PreferenceAdvisor advisor_;
  std::shared_ptr<const gpu::Inventory> inventory_;  // guarded by mu_ after Start
  std::shared_ptr<const Config> config_;
  std::shared_ptr<const Plan> plan_;
  std::unique_ptr<gpu::HealthMonitor> health_;
  std::map<std::string, gpu::DeviceHealth> health_state_;  // the monitor's published state; guarded by mu_
  std::function<void(unsigned, unsigned, unsigned long long)> xid_observer_;
  // health_state_ as <kubelet dir>/.kgpu-health.json (health_file.h), for doctor and `kgpu health`.
  void WriteServedHealthLocked();
  std::string health_written_;                    // the file's content as last written; guarded by mu_
  ConditionLog health_file_log_{"deviceplugin"};  // a failing write, logged once
  std::set<std::string> retired_;                 // guarded by mu_
  std::map<std::string, bool> available_;         // resource → serving (MPS daemon up); guarded by mu_
  std::set<std::string> drained_;                 // GPU UUIDs with a drain marker; guarded by mu_
  void ScanDrainMarkers();
  std::vector<std::unique_ptr<class MpsDaemon>> mps_;  // owner thread / maintenance thread only
  std::string layout_seen_;                            // MIG fingerprint of the running inventory (maintenance thread)
  std::mutex wake_mu_;                                 // wakes the maintenance thread early:
  std::condition_variable_any wake_cv_;                // NVML reported a MIG configuration change
  bool rescan_now_ = false;                            // guarded by wake_mu_

  mutable std::mutex mu_;  // guards servers_, registered_, generation_, serve_failed_, health_ use
  std::condition_variable_any cv_;
  std::vector<std::unique_ptr<ResourceServer>> servers_;
  std::vector<bool> registered_;
  // Per resource: the inode of the kubelet.sock it registered through. kubelet_inode_: that of
  // the kubelet.sock a registration must have reached to count (0: any), set by Reregister().
  std::vector<uint64_t> registered_inode_;
  uint64_t kubelet_inode_ = 0;
  uint64_t generation_ = 0;    // bumped whenever the servers are (re-)created
  bool serve_failed_ = false;  // the last re-serve failed: the watch loop retries it
  std::atomic<uint64_t> registrations_{0};
  std::jthread register_thread_, watch_thread_;
  BoundedThread maintenance_thread_;  // makes NVML calls: Stop() does not wait for a hung one
  std::function<void()> on_change_;
};

}  // namespace kgpu::deviceplugin
