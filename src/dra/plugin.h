#pragma once
// kgpu's DRA kubelet plugin on its two unix sockets (k8s.io/kubelet pluginregistration/v1, dra/v1,
// dra/v1beta1, dra-health/v1alpha1 and v1; docs/dra.md "The kubelet plugin"):
//   <registry dir>/<driver>-reg.sock  Registration: GetInfo says type DRAPlugin, the driver name,
//                                     the service socket and the services served ("v1.DRAPlugin",
//                                     "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth",
//                                     "v1.DRAResourceHealth": 1.34-1.36 kubelets know the first);
//                                     kubelet's plugin watcher calls it, then NotifyRegistrationStatus;
//   <plugin dir>/dra.sock             DRAPlugin v1 and v1beta1 (NodePrepareResources,
//                                     NodeUnprepareResources through the Preparer: every claim of a
//                                     request gets an entry, a claim that fails its error) and the
//                                     health stream (the complete list of the driver's devices at
//                                     once and on every change).
// kubelet finds the registration socket again when it restarts (its watcher rescans the
// directory); a registration socket that disappears is created again.
//
// Thread-safety: every public method may be called from any thread.

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dra/prepare.h"

namespace kgpu::dra {

struct PluginOptions {
  std::string driver;
  std::string registry_dir = "/var/lib/kubelet/plugins_registry";
  std::string plugin_dir;  // the service socket dra.sock is here (/var/lib/kubelet/plugins/<driver>)
  std::chrono::milliseconds socket_check{1000};  // how often the registration socket's presence is checked
  // health_check_timeout_seconds on the health stream: how long kubelet trusts a report (<= 0:
  // kubelet's 30 s). The caller reports at least this often.
  int64_t health_timeout_seconds = 0;
};

// One device's health as kubelet's stream carries it.
struct DeviceHealthReport {
  std::string pool, device;
  enum class Health { kUnknown = 0, kHealthy = 1, kUnhealthy = 2 } health = Health::kUnknown;
  std::string message;  // cut to 1024 characters
  int64_t updated_unix = 0;
  bool operator==(const DeviceHealthReport&) const = default;
};

class Plugin {
 public:
  // Serves both sockets (stale socket files from an earlier run are replaced). Errors name the
  // socket and the directory to mount.
  static absl::StatusOr<std::unique_ptr<Plugin>> Start(PluginOptions options, std::shared_ptr<Preparer> preparer);
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;
  void Stop();

  std::string RegistrationSocket() const;
  std::string ServiceSocket() const;
  // What kubelet last said in NotifyRegistrationStatus: whether it registered us, and its error.
  // (false, "") before it said anything.
  std::pair<bool, std::string> Registration() const;
  uint64_t registrations() const;  // NotifyRegistrationStatus calls seen
  // Replaces what every health stream sends (the complete list) and sends it now.
  void SetHealth(std::vector<DeviceHealthReport> devices);

 private:
  class Impl;
  explicit Plugin(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace kgpu::dra
