#include "kubelet/podresources.h"

#include <cerrno>
#include <mutex>
#include <system_error>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "common/strings.h"
#include "podresources_v1.grpc.pb.h"
#include "podresources_v1.pb.h"

namespace kgpu::kubelet {
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
      return absl::NotFoundError(
          Cat("kubelet PodResources socket ", path, " does not exist: is kubelet running? ", kMountHint));
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
    return absl::PermissionDeniedError(Cat("kubelet PodResources socket ", path, ": ", ErrnoText(errno),
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

std::vector<DeviceAllocation> Flatten(const v1::ListPodResourcesResponse& response) {
  std::vector<DeviceAllocation> out;
  for (const v1::PodResources& pod : response.pod_resources()) {
    for (const v1::ContainerResources& container : pod.containers()) {
      for (const v1::ContainerDevices& devices : container.devices()) {
        for (const std::string& id : devices.device_ids()) {
          out.push_back(DeviceAllocation{
              .resource = devices.resource_name(),
              .device_id = id,
              .pod = PodRef{.namespace_name = pod.namespace_(), .pod = pod.name(), .container = container.name()},
          });
        }
      }
    }
  }
  return out;
}

}  // namespace

struct PodResourcesClient::State {
  std::mutex mu;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::PodResourcesLister::Stub> stub;
  dev_t dev = 0;
  ino_t ino = 0;
  timespec ctime{};  // with the inode: a file made anew may get the freed inode number back
  int channels_created = 0;
};

PodResourcesClient::PodResourcesClient(std::string socket_path)
    : socket_path_(std::move(socket_path)), state_(std::make_unique<State>()) {}
PodResourcesClient::~PodResourcesClient() = default;

int PodResourcesClient::ChannelsCreated() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->channels_created;
}

absl::StatusOr<std::vector<DeviceAllocation>> PodResourcesClient::List(std::chrono::milliseconds timeout) {
  if (absl::Status s = CheckSocket(socket_path_); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(state_->mu);
  State& st = *state_;
  struct stat sock {};
  const bool have_inode = ::stat(socket_path_.c_str(), &sock) == 0;
  if (st.channel != nullptr && have_inode &&
      (sock.st_dev != st.dev || sock.st_ino != st.ino || sock.st_ctim.tv_sec != st.ctime.tv_sec ||
       sock.st_ctim.tv_nsec != st.ctime.tv_nsec)) {
    st.channel.reset();  // kubelet made a new socket: connect to it afresh
  }
  const std::string target = "unix:" + socket_path_;
  if (st.channel == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxResponseBytes);
    st.channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    st.stub = v1::PodResourcesLister::NewStub(st.channel);
    st.dev = have_inode ? sock.st_dev : 0;
    st.ino = have_inode ? sock.st_ino : 0;
    st.ctime = have_inode ? sock.st_ctim : timespec{};
    ++st.channels_created;
  }

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::ListPodResourcesResponse response;
  const grpc::Status status = st.stub->List(&context, v1::ListPodResourcesRequest(), &response);
  if (!status.ok()) {
    st.channel.reset();  // the next call starts from a new channel, not a broken one
    st.stub.reset();
    const std::string hint = Hint(status.error_code());
    return absl::Status(
        static_cast<absl::StatusCode>(status.error_code()),
        Cat("kubelet PodResources List on ", target, " (deadline ", static_cast<int64_t>(timeout.count()),
            " ms): ", status.error_message(), hint.empty() ? "" : "; ", hint));
  }
  return Flatten(response);
}

absl::StatusOr<std::vector<DeviceAllocation>> ListPodResources(const std::string& socket_path,
                                                               std::chrono::milliseconds timeout) {
  return PodResourcesClient(socket_path).List(timeout);
}

}  // namespace kgpu::kubelet
