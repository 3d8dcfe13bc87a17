#pragma once
// kubelet's DRA manager, stood in for tests and the demo (kubernetes/kubernetes
// pkg/kubelet/cm/dra/{manager.go,plugin/registration.go,plugin/dra_plugin_manager.go}; docs/dra.md):
//
//  * A plugin watcher on the registry directory: every <name>-reg.sock that appears (or is created
//    again) gets GetInfo; type must be "DRAPlugin" and the supported versions must include
//    "v1.DRAPlugin" (preferred) or "v1beta1.DRAPlugin", else NotifyRegistrationStatus(false,
//    why); then NotifyRegistrationStatus(true) and, when the plugin lists a DRAResourceHealth
//    service, a NodeWatchResources stream whose latest list is kept.
//  * PreparePod: for each pod.spec.resourceClaims entry the claim's name (resourceClaimName, or
//    pod.status.resourceClaimStatuses for a template's), GET the claim, require the pod in
//    status.reservedFor ("pod <name> (<uid>) is not allowed to use ResourceClaim <claim>"), skip
//    claims already prepared, and call NodePrepareResources once per driver (45 s deadline) with
//    the rest; a per-claim error, a claim missing from the answer or a result for an unknown UID
//    fails the pod. Returns the CDI device IDs per claim as kubelet hands them to the runtime.
//  * UnpreparePod: a claim other pods still use only loses this pod; the last user's unprepare
//    goes to the driver (NodeUnprepareResources, batched per driver).
//  * Restart(): a kubelet restart — registrations and streams are dropped and the watcher finds
//    the sockets again; prepared claims are kept (kubelet's dra_manager_state checkpoint).
//
// Thread-safety: every public method may be called from any thread.

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace kgpu::k8s {
class Client;
}

namespace kgpu::testing {

class FakeDraKubelet {
 public:
  FakeDraKubelet(std::string registry_dir, std::shared_ptr<k8s::Client> client);
  ~FakeDraKubelet();
  FakeDraKubelet(const FakeDraKubelet&) = delete;
  FakeDraKubelet& operator=(const FakeDraKubelet&) = delete;

  void Start();
  void Stop();
  void Restart();

  struct Driver {
    std::string name, endpoint, version;  // version: "v1" or "v1beta1"
    bool health = false;                  // lists a DRAResourceHealth service
    uint64_t registrations = 0;
  };
  // Registered drivers by name.
  std::map<std::string, Driver> Drivers() const;
  // The last health list each driver's stream sent: "<pool>/<device>" -> "HEALTHY" | "UNHEALTHY"
  // | "UNKNOWN", with the message after a ": " when there is one.
  std::map<std::string, std::string> Health(const std::string& driver) const;

  // claim name -> CDI device IDs (every device of the claim).
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> PreparePod(const nlohmann::json& pod);
  absl::Status UnpreparePod(const nlohmann::json& pod);

 private:
  struct Prepared {
    std::string ns, name, driver;
    std::set<std::string> pods;  // pod UIDs using it
    std::vector<std::string> cdi_ids;
  };
  void Watch();
  void TryRegister(const std::string& socket);
  void FollowHealth(std::string driver, std::string endpoint, uint64_t generation);

  std::string registry_dir_;
  std::shared_ptr<k8s::Client> client_;
  mutable std::mutex mu_;
  std::map<std::string, Driver> drivers_;
  std::map<std::string, uint64_t> seen_;  // socket path -> inode registered
  std::map<std::string, std::map<std::string, std::string>> health_;
  std::map<std::string, Prepared> prepared_;  // claim UID -> what was prepared
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> generation_{0};  // bumped by Restart: old health streams end
  std::thread watcher_;
  std::vector<std::thread> streams_;
};

}  // namespace kgpu::testing
