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
// Thread-safety: Resolve may be called from several gRPC threads at once; it shares nothing but
// the API client (thread-safe) and the inventory (immutable).

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "deviceplugin/share_cdi.h"
#include "extender/record.h"
#include "gpu/inventory.h"
#include "k8s/client.h"
#include "k8s/events.h"

namespace kgpu::cli {

struct ShareHandoffOptions {
  std::string node_name;  // this node (records for other nodes are refused)
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::string cdi_spec_dir = "/var/run/cdi";
  std::string dev_root = "/";  // host paths of /dev/nvidia* (driver root)
  std::chrono::milliseconds timeout{5000};
  // `hard` shares: the interposer's host path (empty: refused) and the root of the
  // per-container accounting directories (deviceplugin::Config has the same two).
  std::string cuda_interposer;
  std::string cuda_shared_root = "/var/lib/kgpu/cuda";
  std::string cuda_interposer_load = "env";  // deviceplugin/interposer.h
  // Non-empty when MPS daemons serve kgpu.io/gpu (sharing.mps): the plugin's mpsRoot. Shares in
  // mps mode become clients of their GPU's daemon; without it such a record is refused.
  std::string mps_root;
};

// Where a `hard` share's container sees the interposer and its accounting directory.
using deviceplugin::kInterposerInContainer;
using deviceplugin::kRegionInContainer;

// The container's environment for a record entry (docs/sharing-model.md §6).
std::vector<std::string> ShareEnv(const extender::RecordContainer& c);

class ShareHandoff {
 public:
  ShareHandoff(std::unique_ptr<k8s::Client> client, std::shared_ptr<const gpu::Inventory> inventory,
               ShareHandoffOptions options);
  absl::Status Resolve(const std::vector<std::string>& ids, const std::string& cdi_name);
  // The CDI spec path for a device name.
  std::string SpecPath(const std::string& cdi_name) const;

 private:
  std::unique_ptr<k8s::Client> client_;
  std::shared_ptr<const gpu::Inventory> inventory_;
  ShareHandoffOptions opts_;
  std::unique_ptr<k8s::EventRecorder> events_;
};

}  // namespace kgpu::cli
