#pragma once
// The node side of the kgpu.io/gpu handoff (docs/sharing-model.md §5), without a node lock:
// at PreStartContainer kubelet has recorded which container holds the slot IDs, so
//  1. kubelet's PodResources List names the pod and container that hold `ids` (exactly one,
//     since kubelet never gives a slot to two live containers);
//  2. that pod's allocation record (kgpu.io/allocation, read from the API) says which GPUs and
//     limits the extender chose for the container;
//  3. the CDI spec of kgpu.io/share=<name> is written for exactly those GPUs and limits (one file
//     per container, named by its lowest slot: no two containers write the same file);
//  4. the pod gets kgpu.io/enforcement-applied and an Event saying what was applied.
//
// Whole GPUs and MIG (RecordAssignment) go the other way round: kubelet chooses their device IDs
// (through our GetPreferredAllocation, NVLink-aware) and is the authority on the node for them —
// its checkpoint, PodResources, dcgm-exporter and every pod outside kgpu count on its choice — so
// at PreStartContainer the node makes the pod's record say exactly what kubelet gave, when the
// extender had chosen other devices of the same kind (docs/sharing-model.md §5).
//
// Thread-safety: Resolve and RecordAssignment may be called from several gRPC threads at once;
// they share nothing but the API client (thread-safe) and the inventory (immutable).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "api/record.h"
#include "api/share_cdi.h"
#include "deviceplugin/server.h"
#include "gpu/inventory.h"
#include "k8s/client.h"
#include "k8s/events.h"
#include "kubelet/podresources.h"

namespace kgpu::cli {

struct ShareHandoffOptions {
  std::string node_name;  // this node (records for other nodes are refused)
  std::string pod_resources_socket = kubelet::kPodResourcesSocket;
  std::string cdi_spec_dir = "/var/run/cdi";
  std::string dev_root = "/";  // host paths of /dev/nvidia* (driver root)
  std::chrono::milliseconds timeout{5000};
  // `hard` shares: the interposer's host path (empty: refused) and the root of the
  // per-container accounting directories (deviceplugin::Config has the same two).
  std::string cuda_interposer;
  std::string cuda_shared_root = "/var/lib/kgpu/cuda";
  std::string cuda_interposer_load = "env";  // deviceplugin/interposer.h
  // SweepAccounting's period on a thread of its own (0: never; nor without cuda_interposer), and
  // how old a directory must be before it may go.
  std::chrono::seconds accounting_sweep{600};
  std::chrono::seconds accounting_grace{120};
  // Non-empty when MPS daemons serve kgpu.io/gpu (sharing.mps): the plugin's mpsRoot. Shares in
  // mps mode become clients of their GPU's daemon; without it such a record is refused.
  std::string mps_root;
};

// Where a `hard` share's container sees the interposer and its accounting directory.
using api::kInterposerInContainer;
using api::kRegionInContainer;

// The container's environment for a record entry (docs/sharing-model.md §6).
std::vector<std::string> ShareEnv(const api::RecordContainer& c);

class ShareHandoff {
 public:
  // `list_client`: for Pending()'s LIST on kubelet's admission path (a short deadline, no
  // retries); without it, Pending() suggests nothing.
  ShareHandoff(std::unique_ptr<k8s::Client> client, std::shared_ptr<const gpu::Inventory> inventory,
               ShareHandoffOptions options, std::unique_ptr<k8s::Client> list_client = nullptr);
  absl::Status Resolve(const std::vector<std::string>& ids, const std::string& cdi_name);
  // Whole GPUs and MIG: makes the record of the container holding `ids` name `devices` (what
  // kubelet gave it) when it names others; a pod without a record is left alone. A conflicting
  // write (409) is retried on the pod as it is then. Returns what it did, for logs and tests:
  // OK (nothing to do or corrected), or the error that left the record as it was.
  absl::Status RecordAssignment(const std::string& resource, const std::vector<std::string>& ids,
                                const std::vector<deviceplugin::AssignedDevice>& devices);
  // The same on this object's worker thread, so that PreStartContainer returns at once: kubelet
  // gives that call 30 s, and a slow API server must never fail a whole-GPU container's start.
  // Failures are logged. At most 1024 wait; beyond that a report is dropped with a warning.
  void RecordAssignmentLater(std::string resource, std::vector<std::string> ids,
                             std::vector<deviceplugin::AssignedDevice> devices);
  ~ShareHandoff();
  // Whole GPUs and MIG, at GetPreferredAllocation: what the records on this node choose for
  // containers of `resource` asking for `size` devices that hold none in PodResources yet, oldest
  // pod first (deviceplugin::PreferenceAdvisor). Empty when nothing is pending or the API or
  // PodResources cannot be read (the plugin's own preference then stands).
  std::vector<std::vector<deviceplugin::AssignedDevice>> Pending(const std::string& resource, size_t size) const;
  // The CDI spec path for a device name.
  std::string SpecPath(const std::string& cdi_name) const;
  // `hard` shares leave an accounting directory (cuda_shared_root/<pod UID>/<container>, one
  // ~280 KB region each) that nothing else removes. This removes those whose pod is no longer on
  // this node, as the API says now: gone, bound elsewhere, or Succeeded/Failed. The directories
  // are read before the pods, so a pod admitted meanwhile is in the list; a directory younger
  // than accounting_grace is left too. An API or directory error removes nothing. Returns how
  // many went. Other entries under the root (timeslicing/, ld.so.preload) are not touched.
  absl::StatusOr<int> SweepAccounting();

 private:
  // The one container that holds `ids` of `resource` in kubelet's PodResources.
  absl::StatusOr<kubelet::PodRef> Holder(const std::string& resource, const std::vector<std::string>& ids) const;

  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<k8s::Client> list_client_;
  std::shared_ptr<const gpu::Inventory> inventory_;
  ShareHandoffOptions opts_;
  std::unique_ptr<k8s::EventRecorder> events_;
  // Pending() after its LIST failed (5 minutes after a 403, RBAC without `list`; 1 minute after
  // anything else): not asked again before this time (steady clock, ns since epoch), so each
  // admission does not pay for the failure again.
  mutable std::atomic<int64_t> list_paused_until_{0};
  struct Report {
    std::string resource;
    std::vector<std::string> ids;
    std::vector<deviceplugin::AssignedDevice> devices;
  };
  std::mutex reports_mu_;
  std::condition_variable_any reports_cv_;
  std::deque<Report> reports_;   // guarded by reports_mu_
  std::jthread reports_worker_;  // started by the first report
  std::jthread sweeper_;         // SweepAccounting every accounting_sweep; last member: joined first
};

}  // namespace kgpu::cli
