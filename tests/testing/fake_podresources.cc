#include "testing/fake_podresources.h"

#include <filesystem>
#include <system_error>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>

namespace kgpu::testing {

class FakePodResources::Service final : public v1::PodResourcesLister::Service {
 public:
  explicit Service(FakePodResources* owner) : owner_(owner) {}

  grpc::Status List(grpc::ServerContext* context, const v1::ListPodResourcesRequest* /*request*/,
                    v1::ListPodResourcesResponse* response) override {
    std::chrono::milliseconds delay{0};
    {
      std::lock_guard<std::mutex> lock(owner_->mu_);
      ++owner_->calls_;
      delay = owner_->delay_;
    }
    const auto until = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < until) {
      if (context->IsCancelled()) return {grpc::StatusCode::CANCELLED, "cancelled"};
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::lock_guard<std::mutex> lock(owner_->mu_);
    if (!owner_->status_.ok()) {
      return {static_cast<grpc::StatusCode>(owner_->status_.code()), std::string(owner_->status_.message())};
    }
    *response = owner_->response_;
    return grpc::Status::OK;
  }

 private:
  FakePodResources* const owner_;
};

FakePodResources::FakePodResources(std::string socket_path) : socket_path_(std::move(socket_path)) {}

FakePodResources::~FakePodResources() {
  Stop();
}

absl::Status FakePodResources::Start() {
  std::error_code ec;
  std::filesystem::remove(socket_path_, ec);
  service_ = std::make_unique<Service>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_) {
    service_.reset();
    return absl::UnavailableError("fake PodResources: cannot serve unix:" + socket_path_);
  }
  return absl::OkStatus();
}

void FakePodResources::Stop() {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_->Wait();
  server_.reset();
  service_.reset();
  std::error_code ec;
  std::filesystem::remove(socket_path_, ec);
}

void FakePodResources::SetListResponse(v1::ListPodResourcesResponse response) {
  std::lock_guard<std::mutex> lock(mu_);
  response_ = std::move(response);
}

void FakePodResources::SetListStatus(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = std::move(status);
}

void FakePodResources::SetListDelay(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_ = delay;
}

int FakePodResources::ListCalls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

void AddDevices(v1::ListPodResourcesResponse& response, const std::string& ns, const std::string& pod,
                const std::string& container, const std::string& resource, const std::vector<std::string>& ids,
                int64_t numa) {
  v1::PodResources* p = nullptr;
  for (auto& candidate : *response.mutable_pod_resources()) {
    if (candidate.namespace_() == ns && candidate.name() == pod) p = &candidate;
  }
  if (p == nullptr) {
    p = response.add_pod_resources();
    p->set_namespace_(ns);
    p->set_name(pod);
  }
  v1::ContainerResources* c = nullptr;
  for (auto& candidate : *p->mutable_containers()) {
    if (candidate.name() == container) c = &candidate;
  }
  if (c == nullptr) {
    c = p->add_containers();
    c->set_name(container);
  }
  v1::ContainerDevices* d = c->add_devices();
  d->set_resource_name(resource);
  for (const auto& id : ids) d->add_device_ids(id);
  if (numa != -1) d->mutable_topology()->add_nodes()->set_id(numa);
}

}  // namespace kgpu::testing
