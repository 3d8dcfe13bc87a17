#include "testing/fake_kubelet.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <regex>
#include <system_error>
#include <utility>

#include <grpcpp/grpcpp.h>

namespace kgpu::testing {
namespace {

constexpr char kVersion[] = "v1beta1";
constexpr auto kDialTimeout = std::chrono::seconds(10);  // kubelet plugin/v1beta1/client.go
constexpr auto kShutdownGrace = std::chrono::seconds(1);

absl::Status ToAbsl(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return {static_cast<absl::StatusCode>(s.error_code()), s.error_message()};
}

std::string Quote(const std::string& s) {
  return "\"" + s + "\"";
}

bool IsDns1123Subdomain(const std::string& s) {
  static const std::regex re(R"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)");
  return !s.empty() && s.size() <= 253 && std::regex_match(s, re);
}

// k8s.io/apimachinery/pkg/util/validation IsQualifiedName.
bool IsQualifiedName(const std::string& value) {
  std::string name = value;
  const auto slash = value.find('/');
  if (slash != std::string::npos) {
    if (value.find('/', slash + 1) != std::string::npos) return false;
    const std::string prefix = value.substr(0, slash);
    if (!IsDns1123Subdomain(prefix)) return false;
    name = value.substr(slash + 1);
  }
  static const std::regex re(R"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])");
  return !name.empty() && name.size() <= 63 && std::regex_match(name, re);
}

void RemoveIfSocket(const std::filesystem::path& p) {
  std::error_code ec;
  if (std::filesystem::is_socket(std::filesystem::symlink_status(p, ec))) {
    std::filesystem::remove(p, ec);
  }
}

}  // namespace

bool IsExtendedResourceName(const std::string& name) {
  // IsNativeResource: no '/' or contains "kubernetes.io/" (strings.Contains, as kubernetes does).
  if (name.find('/') == std::string::npos) return false;
  if (name.find("kubernetes.io/") != std::string::npos) return false;
  if (name.rfind("requests.", 0) == 0) return false;
  return IsQualifiedName("requests." + name);
}

int ResourceState::Healthy() const {
  if (!connected) return 0;
  return static_cast<int>(
      std::count_if(devices.begin(), devices.end(), [](const FakeDevice& d) { return d.health == kHealthy; }));
}

int ResourceState::Unhealthy() const {
  return static_cast<int>(devices.size()) - Healthy();
}

std::vector<std::string> ResourceState::HealthyIds() const {
  std::vector<std::string> ids;
  for (const auto& d : devices) {
    if (d.health == kHealthy) ids.push_back(d.id);
  }
  return ids;
}

std::vector<std::string> ResourceState::UnhealthyIds() const {
  std::vector<std::string> ids;
  for (const auto& d : devices) {
    if (d.health != kHealthy) ids.push_back(d.id);
  }
  return ids;
}

// One registered plugin connection: the channel, and the ListAndWatch stream that follows it.
struct FakeKubelet::Endpoint {
  std::string resource;
  std::string endpoint;
  uint64_t generation = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
  grpc::ClientContext stream_ctx;  // cancelled to drop the stream
  std::thread thread;
  std::atomic<bool> done{false};
};

class FakeKubelet::RegistrationService final : public v1beta1::Registration::Service {
 public:
  explicit RegistrationService(FakeKubelet* owner) : owner_(owner) {}
  grpc::Status Register(grpc::ServerContext* /*context*/, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty* /*response*/) override {
    return owner_->Register(*request);
  }

 private:
  FakeKubelet* owner_;
};

FakeKubelet::FakeKubelet(std::string dir) : dir_(std::move(dir)) {}

FakeKubelet::~FakeKubelet() {
  Stop();
}

void FakeKubelet::OnEvent(std::function<void(const FakeKubeletEvent&)> callback) {
  std::lock_guard<std::mutex> lock(event_mu_);
  on_event_ = std::move(callback);
}

void FakeKubelet::SetCallTimeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  call_timeout_ = timeout;
}

std::chrono::milliseconds FakeKubelet::CallTimeout() const {
  std::lock_guard<std::mutex> lock(mu_);
  return call_timeout_;
}

absl::Status FakeKubelet::Start() {
  std::lock_guard<std::mutex> lock(server_mu_);
  if (server_) return absl::FailedPreconditionError("fake kubelet already serving " + SocketPath());
  return Serve();
}

absl::Status FakeKubelet::Serve() {
  std::error_code ec;
  std::filesystem::remove(SocketPath(), ec);  // a stale socket from an earlier run
  service_ = std::make_unique<RegistrationService>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + SocketPath(), grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_) {
    return absl::UnavailableError("fake kubelet: cannot serve unix:" + SocketPath());
  }
  return absl::OkStatus();
}

bool FakeKubelet::ShutdownServer() {
  if (!server_) return false;
  // Waits for running handlers; in-flight Register calls are cancelled after the grace period.
  server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  server_->Wait();
  server_.reset();
  service_.reset();
  return true;
}

absl::Status FakeKubelet::Restart() {
  std::lock_guard<std::mutex> lock(server_mu_);
  ShutdownServer();
  {
    // Cancel every live stream and wait for each to be marked disconnected, so that a caller
    // sees the restarted kubelet's view as soon as Restart returns.
    std::unique_lock<std::mutex> l(mu_);
    for (auto& [resource, ep] : current_) ep->stream_ctx.TryCancel();
    if (!cv_.wait_for(l, kDialTimeout, [this] { return current_.empty(); })) {
      return absl::DeadlineExceededError("fake kubelet restart: ListAndWatch streams did not end");
    }
  }
  ReapFinished();
  // CleanupPluginDirectory: every socket except the checkpoint (which is not a socket anyway).
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (entry.path().filename() == kKubeletCheckpoint) continue;
    RemoveIfSocket(entry.path());
  }
  Emit({FakeKubeletEvent::Kind::kRestarted, "", "", {}});
  return Serve();
}

void FakeKubelet::Stop() {
  std::lock_guard<std::mutex> lock(server_mu_);
  const bool was_serving = ShutdownServer();
  std::vector<std::shared_ptr<Endpoint>> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    all = endpoints_;
    endpoints_.clear();
  }
  for (auto& ep : all) ep->stream_ctx.TryCancel();
  for (auto& ep : all) {
    if (ep->thread.joinable()) ep->thread.join();
  }
  if (was_serving) RemoveIfSocket(SocketPath());  // as a kubelet that exits (gRPC 1.51 unlinks it already)
}

void FakeKubelet::ReapFinished() {
  std::vector<std::shared_ptr<Endpoint>> finished;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it =
        std::stable_partition(endpoints_.begin(), endpoints_.end(), [](const auto& ep) { return !ep->done.load(); });
    finished.assign(it, endpoints_.end());
    endpoints_.erase(it, endpoints_.end());
  }
  for (auto& ep : finished) {
    if (ep->thread.joinable()) ep->thread.join();
  }
}

void FakeKubelet::Emit(const FakeKubeletEvent& event) {
  std::lock_guard<std::mutex> lock(event_mu_);
  if (on_event_) on_event_(event);
}

grpc::Status FakeKubelet::Register(const v1beta1::RegisterRequest& request) {
  const std::string& resource = request.resource_name();
  auto refuse = [&](const std::string& message) {
    Emit({FakeKubeletEvent::Kind::kRefused, resource, message, {}});
    // A plain Go error returned by kubelet's handler reaches the plugin as UNKNOWN.
    return grpc::Status(grpc::StatusCode::UNKNOWN, message);
  };
  if (request.version() != kVersion) {
    return refuse("requested API version " + Quote(request.version()) +
                  " is not supported by kubelet. Supported versions are [\"v1beta1\"]");
  }
  if (!IsExtendedResourceName(resource)) {
    return refuse("the ResourceName " + Quote(resource) + " is invalid");
  }
  ReapFinished();

  auto ep = std::make_shared<Endpoint>();
  ep->resource = resource;
  ep->endpoint = request.endpoint();
  const std::string path = dir_ + "/" + request.endpoint();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);       // a connection of its own, as kubelet
  args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, "localhost");  // kubelet: WithAuthority("localhost")
  ep->channel = grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args);
  const auto deadline = std::chrono::system_clock::now() + kDialTimeout;
  if (!ep->channel->WaitForConnected(deadline)) {
    return refuse("failed to dial device plugin: unix:" + path + ": context deadline exceeded");
  }
  ep->stub = v1beta1::DevicePlugin::NewStub(ep->channel);
  v1beta1::DevicePluginOptions options;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    const grpc::Status s = ep->stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &options);
    if (!s.ok()) return refuse("failed to get device plugin options: " + s.error_message());
  }

  std::shared_ptr<Endpoint> old;
  ResourceState snapshot;
  {
    std::lock_guard<std::mutex> l(mu_);
    ep->generation = next_generation_++;
    ResourceState& st = resources_[resource];
    st.endpoint = request.endpoint();
    st.options = options;
    st.registrations++;
    st.connected = true;
    auto& slot = current_[resource];
    old = std::move(slot);
    slot = ep;
    endpoints_.push_back(ep);
    snapshot = st;
  }
  if (old) old->stream_ctx.TryCancel();  // kubelet disconnects the replaced endpoint
  cv_.notify_all();
  Emit({FakeKubeletEvent::Kind::kRegistered, resource, "", snapshot});
  ep->thread = std::thread(&FakeKubelet::FollowStream, this, ep);
  return grpc::Status::OK;
}

void FakeKubelet::FollowStream(const std::shared_ptr<Endpoint>& ep) {
  v1beta1::ListAndWatchResponse response;
  std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader =
      ep->stub->ListAndWatch(&ep->stream_ctx, v1beta1::Empty());
  while (reader->Read(&response)) {
    std::vector<FakeDevice> devices;
    devices.reserve(static_cast<size_t>(response.devices_size()));
    for (const auto& d : response.devices()) {
      FakeDevice fd{d.id(), d.health(), {}};
      for (const auto& n : d.topology().nodes()) fd.numa.push_back(n.id());
      devices.push_back(std::move(fd));
    }
    ResourceState snapshot;
    bool live = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = current_.find(ep->resource);
      live = it != current_.end() && it->second == ep;
      if (live) {
        ResourceState& st = resources_[ep->resource];
        st.devices = std::move(devices);
        st.updates++;
        snapshot = st;
      }
    }
    if (!live) continue;  // replaced: its stream is being cancelled
    cv_.notify_all();
    Emit({FakeKubeletEvent::Kind::kUpdate, ep->resource, "", snapshot});
  }
  const grpc::Status status = reader->Finish();
  ResourceState snapshot;
  bool live = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = current_.find(ep->resource);
    live = it != current_.end() && it->second == ep;
    if (live) {
      current_.erase(it);
      ResourceState& st = resources_[ep->resource];
      st.connected = false;
      snapshot = st;
    }
    ep->done = true;
  }
  cv_.notify_all();
  if (live) {
    std::string how =
        status.ok()
            ? std::string("stream closed by the plugin")
            : "rpc error: code = " + absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())) +
                  " desc = " + status.error_message();
    Emit({FakeKubeletEvent::Kind::kDisconnected, ep->resource, how, snapshot});
  }
}

bool FakeKubelet::WaitFor(const std::string& resource, std::function<bool(const ResourceState&)> pred,
                          std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    auto it = resources_.find(resource);
    return it != resources_.end() && pred(it->second);
  });
}

std::optional<ResourceState> FakeKubelet::Get(const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> FakeKubelet::Resources() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, st] : resources_) names.push_back(name);
  return names;
}

absl::StatusOr<std::shared_ptr<FakeKubelet::Endpoint>> FakeKubelet::CurrentEndpoint(const std::string& resource) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = current_.find(resource);
  if (it != current_.end()) return it->second;
  if (resources_.count(resource) != 0) {
    return absl::FailedPreconditionError("device plugin for " + resource + " is disconnected");
  }
  return absl::NotFoundError("unknown Device Plugin " + resource);
}

absl::StatusOr<v1beta1::AllocateResponse> FakeKubelet::Allocate(const std::string& resource,
                                                                std::vector<std::string> ids) {
  auto ep = CurrentEndpoint(resource);
  if (!ep.ok()) return ep.status();
  v1beta1::AllocateRequest request;
  auto* container = request.add_container_requests();
  for (auto& id : ids) container->add_devices_ids(std::move(id));
  grpc::ClientContext ctx;
  if (const auto t = CallTimeout(); t.count() > 0) ctx.set_deadline(std::chrono::system_clock::now() + t);
  v1beta1::AllocateResponse response;
  const grpc::Status s = (*ep)->stub->Allocate(&ctx, request, &response);
  if (!s.ok()) return ToAbsl(s);
  if (response.container_responses_size() == 0) {
    return absl::InternalError("no containers return in allocation response " + response.ShortDebugString());
  }
  return response;
}

absl::Status FakeKubelet::PreStartContainer(const std::string& resource, std::vector<std::string> ids) {
  auto ep = CurrentEndpoint(resource);
  if (!ep.ok()) return ep.status();
  v1beta1::PreStartContainerRequest request;
  for (auto& id : ids) request.add_devices_ids(std::move(id));
  grpc::ClientContext ctx;
  if (const auto t = CallTimeout(); t.count() > 0) ctx.set_deadline(std::chrono::system_clock::now() + t);
  v1beta1::PreStartContainerResponse response;
  return ToAbsl((*ep)->stub->PreStartContainer(&ctx, request, &response));
}

absl::StatusOr<std::vector<std::string>> FakeKubelet::GetPreferredAllocation(const std::string& resource,
                                                                             std::vector<std::string> available,
                                                                             std::vector<std::string> must_include,
                                                                             int size) {
  auto ep = CurrentEndpoint(resource);
  if (!ep.ok()) return ep.status();
  v1beta1::PreferredAllocationRequest request;
  auto* container = request.add_container_requests();
  for (auto& id : available) container->add_available_deviceids(std::move(id));
  for (auto& id : must_include) container->add_must_include_deviceids(std::move(id));
  container->set_allocation_size(size);
  grpc::ClientContext ctx;
  if (const auto t = CallTimeout(); t.count() > 0) ctx.set_deadline(std::chrono::system_clock::now() + t);
  v1beta1::PreferredAllocationResponse response;
  const grpc::Status s = (*ep)->stub->GetPreferredAllocation(&ctx, request, &response);
  if (!s.ok()) return ToAbsl(s);
  if (response.container_responses_size() == 0) {
    return absl::InternalError("no container responses in preferred allocation response");
  }
  const auto& ids = response.container_responses(0).deviceids();
  return std::vector<std::string>(ids.begin(), ids.end());
}

}  // namespace kgpu::testing
