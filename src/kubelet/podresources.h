#pragma once
// Client for kubelet's PodResources API v1 (`/v1.PodResourcesLister/List` on the pod-resources
// unix socket, by default /var/lib/kubelet/pod-resources/kubelet.sock): which container of which
// pod holds which device ID. The answer is flattened to one DeviceAllocation per device ID and
// container; kubelet may split one container's devices of one resource over several entries (one
// per NUMA node), and the flat form makes that invisible. DRA claims (dynamic_resources) are not
// reported. This is the only exporter file that includes the generated protobuf headers.
//
// Thread-safety: ListPodResources is a pure function of the socket; call it from any thread.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::kubelet {

inline constexpr char kPodResourcesSocket[] = "/var/lib/kubelet/pod-resources/kubelet.sock";

struct PodRef {
  std::string namespace_name;
  std::string pod;
  std::string container;  // may be empty when the container is ambiguous (see attribution.h)
  bool operator==(const PodRef&) const = default;
};

struct DeviceAllocation {
  std::string resource;   // e.g. "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
  std::string device_id;  // as the device plugin named it: "GPU-<uuid>", "MIG-<uuid>", "...::<n>"
  PodRef pod;
};

// A PodResources client that keeps one gRPC channel (one connection) to the socket across List
// calls, as a periodic refresh needs: the channel is made again only when the socket file was
// replaced (another inode: kubelet restarted) or the last call on it failed.
//
// Thread-safety: List may be called from any thread; calls are serialised.
class PodResourcesClient {
 public:
  explicit PodResourcesClient(std::string socket_path);
  ~PodResourcesClient();
  PodResourcesClient(const PodResourcesClient&) = delete;
  PodResourcesClient& operator=(const PodResourcesClient&) = delete;

  // One List call with the given deadline. Errors name the socket and the fix: NOT_FOUND when the
  // socket file is missing, PERMISSION_DENIED when it cannot be opened, otherwise the gRPC status
  // (UNAVAILABLE when kubelet is not listening, DEADLINE_EXCEEDED).
  [[nodiscard]] absl::StatusOr<std::vector<DeviceAllocation>> List(std::chrono::milliseconds timeout);
  // How many channels this client has made (1 while the socket stays the same and calls succeed).
  int ChannelsCreated() const;

 private:
  struct State;
  const std::string socket_path_;
  std::unique_ptr<State> state_;
};

// One List call on a channel of its own (for one-shot callers such as `kgpu mig`).
[[nodiscard]] absl::StatusOr<std::vector<DeviceAllocation>> ListPodResources(const std::string& socket_path,
                                                                             std::chrono::milliseconds timeout);

}  // namespace kgpu::kubelet
