#pragma once
// The API side of the kubelet stand-in: what kubelet's device manager and node status manager
// do with device plugins (pkg/kubelet/cm/devicemanager GetCapacity, kubelet_node_status.go):
// the Node object is registered if absent, and its status.capacity and status.allocatable carry
// every registered resource — capacity = all devices, allocatable = healthy ones (0 while the
// plugin is disconnected, as kubelet marks its devices unhealthy). The node's own resources
// (cpu, memory, pods) given at construction are kept. Patched through nodes/<name>/status with a
// strategic merge patch, only when the numbers change, and re-checked every `period` (kubelet
// reports device changes promptly and the node status every 10 s). Like kubelet's node lease
// controller it keeps the Lease kube-node-lease/<node> (holder the node, 40 s, renewed every 10 s),
// which `kubectl describe node` shows.
//
// Thread-safety: Start/Stop from one thread; the sync runs on its own thread.

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "k8s/client.h"
#include "testing/fake_kubelet.h"

namespace kgpu::testing {

class KubeletNodeStatus {
 public:
  KubeletNodeStatus(FakeKubelet& kubelet, k8s::Client& client, std::string node_name,
                    std::map<std::string, std::string> node_resources = {{"cpu", "64"},
                                                                         {"memory", "512Gi"},
                                                                         {"pods", "110"}},
                    std::chrono::milliseconds period = std::chrono::milliseconds(200));
  ~KubeletNodeStatus();
  void Start();
  void Stop();
  // One sync now: registers the node if needed and patches its status when it differs.
  absl::Status SyncOnce();
  uint64_t Patches() const { return patches_; }
  // What the device manager reports now: resource -> {capacity, allocatable}.
  std::map<std::string, std::pair<int, int>> DeviceCounts() const;

 private:
  FakeKubelet& kubelet_;
  k8s::Client& client_;
  std::string node_;
  std::map<std::string, std::string> node_resources_;
  std::chrono::milliseconds period_;
  std::atomic<uint64_t> patches_{0};
  std::chrono::steady_clock::time_point lease_renewed_{};
  std::jthread thread_;
  absl::Status RenewLease();
};

}  // namespace kgpu::testing
