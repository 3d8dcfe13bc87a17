#pragma once
// Pod admission as kubelet's device manager does it (pkg/kubelet/cm/devicemanager/manager.go,
// facts kubelet-and-nvidia-plugin.md §1.7-§1.9), on top of the kubelet stand-in (FakeKubelet) and
// the PodResources stand-in, for one node of the API server stand-in:
//  * the pods bound to the node (spec.nodeName) that are not admitted yet are admitted in an order
//    the test controls (shuffled with the seed given);
//  * per pod, init containers first, then app containers; per container, for every limit that
//    names a resource a device plugin registered: kubelet picks the device IDs from the healthy
//    devices no live container holds (GetPreferredAllocation when the plugin offers it and there
//    is a choice, its answer checked and otherwise kubelet's own pick), then calls Allocate with
//    exactly one ContainerAllocateRequest; a regular init container's devices are reused first by
//    the pod's next containers asking for the resource (kubelet's devicesToReuse: passed on by
//    later init containers, kept by the first sidecar or app container that takes them, and
//    given to GetPreferredAllocation as must-include), and stay held until the pod ends;
//  * the allocations go into kubelet's PodResources view (what List answers: sidecars and app
//    containers, never a regular init container, as kubelet's List), then
//    PreStartContainer is called for every container whose plugin set pre_start_required — the
//    containers of all pods of the round at once, on their own threads, as kubelet's pod workers
//    run concurrently;
//  * an admitted pod is marked Running (pods/status); a pod whose Allocate or PreStart failed is
//    marked Failed with kubelet's reason UnexpectedAdmissionError and keeps no devices;
//  * pods deleted from the API give their devices back (and leave the PodResources view);
//  * after every change, kubelet's checkpoint (<kubelet dir>/kubelet_internal_checkpoint, signed
//    with kubelet's checksum) holds every container's devices and Allocate response, as kubelet
//    writes it and as the exporter and the plugin read it.
//
// Thread-safety: AdmitPending and the accessors from one thread at a time.

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "k8s/client.h"
#include "testing/fake_kubelet.h"
#include "testing/fake_podresources.h"

namespace kgpu::testing {

struct AdmittedContainer {
  std::string name;
  bool init = false;  // a regular init container (not a restartable sidecar)
  std::string resource;
  std::vector<std::string> ids;  // the device IDs kubelet chose
  v1beta1::ContainerAllocateResponse response;
  bool pre_started = false;
};

struct AdmittedPod {
  std::string ns, name, uid;
  std::vector<AdmittedContainer> containers;
  absl::Status status;  // Allocate or PreStart failure, OK when Running
};

class KubeletAdmission {
 public:
  KubeletAdmission(FakeKubelet& kubelet, FakePodResources& pod_resources, k8s::Client& api, std::string node,
                   uint32_t seed);

  // One admission round; returns the pods admitted in it (in admission order). Errors only when
  // the API cannot be read; per-pod failures are in AdmittedPod::status.
  absl::StatusOr<std::vector<AdmittedPod>> AdmitPending();

  // Every pod admitted and still live, by UID.
  const std::map<std::string, AdmittedPod>& Admitted() const { return admitted_; }
  // Device IDs held now, per resource.
  std::map<std::string, std::set<std::string>> InUse() const;
  const std::string& node() const { return node_; }

 private:
  absl::StatusOr<std::vector<std::string>> Choose(const std::string& resource, int need,
                                                  const std::set<std::string>& reusable);
  void Publish();
  void WriteCheckpoint();
  void SetPhase(const AdmittedPod& p, const std::string& phase, const std::string& reason, const std::string& message);

  FakeKubelet& kubelet_;
  FakePodResources& pod_resources_;
  k8s::Client& api_;
  const std::string node_;
  std::mt19937 rng_;
  std::map<std::string, AdmittedPod> admitted_;  // UID -> pod (only those that hold devices or run)
  std::set<std::string> failed_;                 // UIDs refused at admission (never retried)
};

}  // namespace kgpu::testing
