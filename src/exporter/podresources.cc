#include "exporter/podresources.h"

#include <cerrno>
#include <system_error>

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "common/strings.h"
#include "podresources_v1.grpc.pb.h"
#include "podresources_v1.pb.h"

namespace kgpu::exporter {
namespace {

// Kubelet's answer grows with pods x containers x devices/CPUs; gRPC's default limit is 4 MiB.
constexpr int kMaxResponseBytes = 64 * 1024 * 1024;

constexpr char kMountHint[] =
    "mount the host directory /var/lib/kubelet/pod-resources into the exporter (the directory, "
    "not the socket file, so that the socket survives kubelet restarts)";

std::string ErrnoText(int err) {
  return std::error_code(err, std::generic_category()).message();
}

absl::Status CheckSocket(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(Cat("kubelet PodResources socket ", path,
                                     " does not exist: is kubelet running? ", kMountHint));
    }
    return absl::PermissionDeniedError(
        Cat("kubelet PodResources socket ", path, ": ", ErrnoText(err), "; ", kMountHint));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        Cat("kubelet PodResources socket ", path,
            " is not a unix socket (a mount of the socket file made before kubelet created it "
            "becomes an empty directory): ",
            kMountHint));
  }
  if (::access(path.c_str(), R_OK | W_OK) != 0) {
    return absl::PermissionDeniedError(
        Cat("kubelet PodResources socket ", path, ": ", ErrnoText(errno),
            ": the exporter must run as root (or as the socket's owner) to connect"));
  }
  return absl::OkStatus();
}

std::string Hint(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
      return "kubelet is not answering on this socket; is it running? (a stale socket file is "
             "left behind when kubelet stops)";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "kubelet did not answer in time";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "this kubelet does not serve v1.PodResourcesLister/List (needs Kubernetes 1.20 or "
             "newer)";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "kubelet rate-limits PodResources calls (100 per second, burst 10), or the answer "
             "exceeded the client's message size limit";
    default:
      return "";
  }
}

}  // namespace

absl::StatusOr<std::vector<DeviceAllocation>> ListPodResources(const std::string& socket_path,
                                                               std::chrono::milliseconds timeout) {
  if (absl::Status s = CheckSocket(socket_path); !s.ok())
    return s;

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxResponseBytes);
  const std::string target = "unix:" + socket_path;
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::PodResourcesLister::NewStub(channel);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::ListPodResourcesResponse response;
  const grpc::Status status = stub->List(&context, v1::ListPodResourcesRequest(), &response);
  if (!status.ok()) {
    const std::string hint = Hint(status.error_code());
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        Cat("kubelet PodResources List on ", target, " (deadline ",
                            static_cast<int64_t>(timeout.count()), " ms): ", status.error_message(),
                            hint.empty() ? "" : "; ", hint));
  }

  std::vector<DeviceAllocation> out;
  for (const v1::PodResources& pod : response.pod_resources()) {
    for (const v1::ContainerResources& container : pod.containers()) {
      for (const v1::ContainerDevices& devices : container.devices()) {
        for (const std::string& id : devices.device_ids()) {
          out.push_back(DeviceAllocation{
              .resource = devices.resource_name(),
              .device_id = id,
              .pod = PodRef{.namespace_name = pod.namespace_(),
                            .pod = pod.name(),
                            .container = container.name()},
          });
        }
      }
    }
  }
  return out;
}

}  // namespace kgpu::exporter
