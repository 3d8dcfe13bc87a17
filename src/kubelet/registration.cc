#include "kubelet/registration.h"

#include <grpcpp/grpcpp.h>

#include "common/strings.h"
#include "deviceplugin_v1beta1.grpc.pb.h"

namespace kgpu::kubelet {

absl::Status RegisterDevicePlugin(const std::string& kubelet_socket, const std::string& endpoint,
                                  const std::string& resource, bool pre_start_required,
                                  std::chrono::milliseconds timeout) {
  auto channel = grpc::CreateChannel("unix:" + kubelet_socket, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest req;
  req.set_version("v1beta1");
  req.set_endpoint(endpoint);
  req.set_resource_name(resource);
  req.mutable_options()->set_pre_start_required(pre_start_required);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  v1beta1::Empty resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  ctx.set_wait_for_ready(false);
  const grpc::Status st = stub->Register(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::UnavailableError(Cat("Register ", resource, " with ", kubelet_socket, ": ", st.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace kgpu::kubelet
