#pragma once
// A kubelet PodResources v1 server for tests: serves v1.PodResourcesLister on a unix socket,
// answers List with whatever the test set (SetListResponse) or with an error (SetListStatus),
// optionally after a delay (to test client deadlines), and counts List calls.
// GetAllocatableResources and Get answer UNIMPLEMENTED.
//
// Thread-safety: every public method may be called from any thread; handlers run on gRPC's
// threads.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "podresources_v1.grpc.pb.h"
#include "podresources_v1.pb.h"

namespace grpc {
class Server;
}

namespace kgpu::testing {

class FakePodResources {
 public:
  explicit FakePodResources(std::string socket_path);
  ~FakePodResources();
  FakePodResources(const FakePodResources&) = delete;
  FakePodResources& operator=(const FakePodResources&) = delete;
  FakePodResources(FakePodResources&&) = delete;
  FakePodResources& operator=(FakePodResources&&) = delete;

  // Removes a stale socket file and serves unix:<socket_path>.
  absl::Status Start();
  // Shuts the server down (in-flight calls are cancelled) and removes the socket. Idempotent.
  void Stop();

  void SetListResponse(v1::ListPodResourcesResponse response);
  // A non-OK status makes List fail with the same code and message.
  void SetListStatus(absl::Status status);
  // List waits this long (or until the client gives up) before answering.
  void SetListDelay(std::chrono::milliseconds delay);
  int ListCalls() const;

  const std::string& SocketPath() const { return socket_path_; }

 private:
  class Service;

  const std::string socket_path_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;

  mutable std::mutex mu_;
  v1::ListPodResourcesResponse response_;
  absl::Status status_;
  std::chrono::milliseconds delay_{0};
  int calls_ = 0;
};

// Appends devices to container `container` of pod `ns`/`pod` in `response` (creating the pod and
// the container as needed) as one ContainerDevices entry, with NUMA node `numa` unless it is -1.
// Kubelet sends one entry per NUMA node, so a container may hold one resource in several entries.
void AddDevices(v1::ListPodResourcesResponse& response, const std::string& ns, const std::string& pod,
                const std::string& container, const std::string& resource, const std::vector<std::string>& ids,
                int64_t numa = -1);

}  // namespace kgpu::testing
