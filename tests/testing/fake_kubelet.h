#pragma once
// A kubelet stand-in for device-plugin tests and the demo. It speaks the real Device Plugin API
// v1beta1 over real unix sockets, and behaves as kubelet's device manager does
// (kubernetes pkg/kubelet/cm/devicemanager, plugin/v1beta1/{server,client,handler}.go):
//
//  * Start() serves v1beta1.Registration on <dir>/kubelet.sock.
//  * Register refuses a version other than "v1beta1" and a resource name that is not an
//    extended resource name, with kubelet's messages and status UNKNOWN (what a Go handler's
//    plain error becomes on the wire). Otherwise, before answering, it dials unix:<dir>/<endpoint>
//    (blocking, 10 s) and calls GetDevicePluginOptions; a failure fails Register. It stores those
//    options (not the ones in the request, as newer kubelets do), replaces any earlier endpoint
//    of the same resource (its ListAndWatch stream is cancelled) and follows ListAndWatch on a
//    thread for the life of the connection. Each message is a full device list.
//  * When the stream ends the resource is kept but marked disconnected: kubelet then counts all
//    its devices as unhealthy (allocatable 0). It never re-dials: the plugin must register again.
//  * Restart() is a kubelet restart: the Registration server stops, every ListAndWatch stream is
//    cancelled, every socket in <dir> is deleted (kubelet_internal_checkpoint and non-sockets are
//    kept), and a fresh kubelet.sock is served. Resource states survive (kubelet restores them
//    from its checkpoint), disconnected until their plugin registers again.
//
// Thread-safety: every public method may be called from any thread, except OnEvent (before
// Start). Waiting is condition-variable based.
//
// Deviations from kubelet, on purpose: GetDevicePluginOptions runs under the same 10 s deadline
// as the dial (kubelet has none), so a stuck plugin cannot wedge a test; Allocate and
// GetPreferredAllocation have no deadline unless SetCallTimeout() sets one (kubelet has none).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "deviceplugin_v1beta1.pb.h"

namespace grpc {
class Server;
}

namespace kgpu::testing {

inline constexpr char kKubeletSocket[] = "kubelet.sock";
inline constexpr char kKubeletCheckpoint[] = "kubelet_internal_checkpoint";
inline constexpr char kHealthy[] = "Healthy";
inline constexpr char kUnhealthy[] = "Unhealthy";

struct FakeDevice {
  std::string id;
  std::string health;         // as the plugin sent it: "Healthy" or "Unhealthy"
  std::vector<int64_t> numa;  // Device.topology.nodes[].ID; empty = no NUMA preference
};

struct ResourceState {
  std::string endpoint;                  // socket file name, relative to the dir
  v1beta1::DevicePluginOptions options;  // from GetDevicePluginOptions at registration
  std::vector<FakeDevice> devices;       // the last full list ListAndWatch sent (kept on
                                         // disconnect and re-registration, as kubelet does)
  int updates = 0;                       // ListAndWatch messages received, all registrations
  int registrations = 0;                 // successful Register calls for this resource
  bool connected = false;                // its ListAndWatch stream is live

  // Kubelet's view: a disconnected resource has no healthy device.
  int Healthy() const;
  int Unhealthy() const;
  // IDs by the health the plugin last reported (ignores `connected`).
  std::vector<std::string> HealthyIds() const;
  std::vector<std::string> UnhealthyIds() const;
};

// Something that happened, for a live log (kgpu-fake-kubelet serve). `state` is a snapshot
// taken right after the event; for kRefused it is empty and `message` says why.
struct FakeKubeletEvent {
  enum class Kind { kRegistered, kRefused, kUpdate, kDisconnected, kRestarted };
  Kind kind;
  std::string resource;
  std::string message;  // kRefused: the error; kDisconnected: how the stream ended
  ResourceState state;
};

class FakeKubelet {
 public:
  explicit FakeKubelet(std::string dir);
  ~FakeKubelet();
  FakeKubelet(const FakeKubelet&) = delete;
  FakeKubelet& operator=(const FakeKubelet&) = delete;
  FakeKubelet(FakeKubelet&&) = delete;
  FakeKubelet& operator=(FakeKubelet&&) = delete;

  // Called for every event, one at a time, from gRPC or stream threads. Set before Start().
  void OnEvent(std::function<void(const FakeKubeletEvent&)> callback);
  // Per-call deadline for Allocate and GetPreferredAllocation; zero (default) = none, as kubelet.
  void SetCallTimeout(std::chrono::milliseconds timeout);

  // Serves Registration on <dir>/kubelet.sock (a stale file is removed first).
  absl::Status Start();
  // A kubelet restart, see above. Serves a fresh kubelet.sock before returning.
  absl::Status Restart();
  // Stops the server, cancels and joins every stream. Idempotent; also done by the destructor.
  void Stop();

  const std::string& Dir() const { return dir_; }
  std::string SocketPath() const { return dir_ + "/" + kKubeletSocket; }

  // Waits until `resource` exists and pred(state) holds; false on timeout. pred runs under the
  // internal lock: keep it short, and do not call back into this object from it.
  bool WaitFor(const std::string& resource, std::function<bool(const ResourceState&)> pred,
               std::chrono::milliseconds timeout);
  std::optional<ResourceState> Get(const std::string& resource) const;
  std::vector<std::string> Resources() const;  // sorted

  // What kubelet sends at pod admission, on the resource's registered endpoint.
  // Allocate: exactly one ContainerAllocateRequest; error when the plugin's answer has no
  // container response (as kubelet). NOT_FOUND for an unknown resource, FAILED_PRECONDITION when
  // its plugin is disconnected; otherwise the plugin's gRPC status.
  absl::StatusOr<v1beta1::AllocateResponse> Allocate(const std::string& resource, std::vector<std::string> ids);
  // PreStartContainer with the container's device IDs, as kubelet calls it before creating a
  // container when the plugin's options set pre_start_required (check that yourself).
  absl::Status PreStartContainer(const std::string& resource, std::vector<std::string> ids);
  // One ContainerPreferredAllocationRequest; returns container_responses[0].deviceIDs. Called
  // whatever the plugin's options say (check Get(resource)->options yourself if that matters).
  absl::StatusOr<std::vector<std::string>> GetPreferredAllocation(const std::string& resource,
                                                                  std::vector<std::string> available,
                                                                  std::vector<std::string> must_include, int size);

 private:
  class RegistrationService;
  struct Endpoint;

  grpc::Status Register(const v1beta1::RegisterRequest& request);
  absl::Status Serve();
  bool ShutdownServer();  // true if it was serving
  void FollowStream(const std::shared_ptr<Endpoint>& endpoint);
  absl::StatusOr<std::shared_ptr<Endpoint>> CurrentEndpoint(const std::string& resource) const;
  void Emit(const FakeKubeletEvent& event);
  void ReapFinished();
  std::chrono::milliseconds CallTimeout() const;

  const std::string dir_;
  std::unique_ptr<RegistrationService> service_;
  std::mutex server_mu_;  // serializes Start/Restart/Stop
  std::unique_ptr<grpc::Server> server_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, ResourceState> resources_;
  std::map<std::string, std::shared_ptr<Endpoint>> current_;  // resource -> live endpoint
  std::vector<std::shared_ptr<Endpoint>> endpoints_;          // every stream thread, to join
  uint64_t next_generation_ = 1;
  std::chrono::milliseconds call_timeout_{0};

  std::mutex event_mu_;  // one callback at a time
  std::function<void(const FakeKubeletEvent&)> on_event_;
};

// True when `name` is a Kubernetes extended resource name (v1helper.IsExtendedResourceName):
// domain-prefixed, not in the kubernetes.io/ namespace, not "requests."-prefixed, and a
// qualified name once prefixed with "requests.".
bool IsExtendedResourceName(const std::string& name);

}  // namespace kgpu::testing
