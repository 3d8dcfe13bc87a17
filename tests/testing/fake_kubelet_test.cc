// Tests of the kubelet stand-in itself, against a tiny device plugin served in-process on a real
// unix socket in the same directory.

#include "testing/fake_kubelet.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <unistd.h>

namespace kgpu::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr auto kWait = 10s;

v1beta1::Device MakeDevice(const std::string& id, const std::string& health, int numa = -1) {
  v1beta1::Device d;
  d.set_id(id);
  d.set_health(health);
  if (numa >= 0) d.mutable_topology()->add_nodes()->set_id(numa);
  return d;
}

// A minimal DevicePlugin: a settable device list streamed by ListAndWatch, a predictable
// GetPreferredAllocation (must_include first, then available in order) and an Allocate that
// echoes the IDs. It records what it was asked.
class TestPlugin final : public v1beta1::DevicePlugin::Service {
 public:
  explicit TestPlugin(bool preferred) { options_.set_get_preferred_allocation_available(preferred); }

  void SetDevices(std::vector<v1beta1::Device> devices) {
    std::lock_guard<std::mutex> l(mu_);
    devices_ = std::move(devices);
    ++version_;
    cv_.notify_all();
  }
  // Ends the ListAndWatch streams (before a server shutdown), or allows them again.
  void EndStreams(bool end = true) {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = end;
    cv_.notify_all();
  }
  int CancelledStreams() {
    std::lock_guard<std::mutex> l(mu_);
    return cancelled_streams_;
  }
  bool WaitCancelledStreams(int n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, timeout, [&] { return cancelled_streams_ >= n; });
  }
  v1beta1::AllocateRequest LastAllocate() {
    std::lock_guard<std::mutex> l(mu_);
    return last_allocate_;
  }
  v1beta1::PreferredAllocationRequest LastPreferred() {
    std::lock_guard<std::mutex> l(mu_);
    return last_preferred_;
  }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    *out = options_;
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    std::unique_lock<std::mutex> l(mu_);
    uint64_t sent = 0;
    for (;;) {
      if (version_ != sent) {
        v1beta1::ListAndWatchResponse response;
        for (const auto& d : devices_) *response.add_devices() = d;
        sent = version_;
        l.unlock();
        const bool ok = writer->Write(response);
        l.lock();
        if (!ok) break;
      }
      // The sync API has no cancellation callback: look at the context now and then.
      cv_.wait_for(l, 20ms, [&] { return version_ != sent || stop_ || ctx->IsCancelled(); });
      if (stop_ || ctx->IsCancelled()) break;
    }
    if (ctx->IsCancelled()) {
      ++cancelled_streams_;
      cv_.notify_all();
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      last_preferred_ = *request;
    }
    for (const auto& c : request->container_requests()) {
      auto* out = response->add_container_responses();
      for (const auto& id : c.must_include_deviceids()) out->add_deviceids(id);
      for (const auto& id : c.available_deviceids()) {
        if (out->deviceids_size() >= c.allocation_size()) break;
        bool dup = false;
        for (const auto& have : out->deviceids()) dup = dup || have == id;
        if (!dup) out->add_deviceids(id);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      last_allocate_ = *request;
    }
    for (const auto& c : request->container_requests()) {
      auto* out = response->add_container_responses();
      std::string ids;
      for (const auto& id : c.devices_ids()) {
        if (id == "bad") return {grpc::StatusCode::INVALID_ARGUMENT, "unknown device bad"};
        ids += (ids.empty() ? "" : ",") + id;
        auto* spec = out->add_devices();
        spec->set_host_path("/dev/fake-" + id);
        spec->set_container_path("/dev/fake-" + id);
        spec->set_permissions("rw");
      }
      (*out->mutable_envs())["TEST_VISIBLE_DEVICES"] = ids;
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  v1beta1::DevicePluginOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1beta1::Device> devices_;
  uint64_t version_ = 0;
  bool stop_ = false;
  int cancelled_streams_ = 0;
  v1beta1::AllocateRequest last_allocate_;
  v1beta1::PreferredAllocationRequest last_preferred_;
};

// The plugin's gRPC server on <dir>/<endpoint>.
class PluginServer {
 public:
  PluginServer(std::string dir, std::string endpoint, bool preferred = true)
      : dir_(std::move(dir)), endpoint_(std::move(endpoint)), plugin_(preferred) {}
  ~PluginServer() { Shutdown(); }
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;
  PluginServer(PluginServer&&) = delete;
  PluginServer& operator=(PluginServer&&) = delete;

  TestPlugin& Plugin() { return plugin_; }
  std::string Path() const { return dir_ + "/" + endpoint_; }

  bool Serve() {
    std::error_code ec;
    fs::remove(Path(), ec);
    plugin_.EndStreams(false);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + Path(), grpc::InsecureServerCredentials());
    builder.RegisterService(&plugin_);
    server_ = builder.BuildAndStart();
    return server_ != nullptr;
  }
  void Shutdown() {
    if (!server_) return;
    plugin_.EndStreams();
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
    server_->Wait();
    server_.reset();
  }

  grpc::Status Register(const std::string& resource, const std::string& version = "v1beta1") {
    auto channel = grpc::CreateChannel("unix:" + dir_ + "/kubelet.sock", grpc::InsecureChannelCredentials());
    auto stub = v1beta1::Registration::NewStub(channel);
    v1beta1::RegisterRequest request;
    request.set_version(version);
    request.set_endpoint(endpoint_);
    request.set_resource_name(resource);
    request.mutable_options()->set_get_preferred_allocation_available(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 20s);
    ctx.set_wait_for_ready(true);
    v1beta1::Empty empty;
    return stub->Register(&ctx, request, &empty);
  }

 private:
  std::string dir_;
  std::string endpoint_;
  TestPlugin plugin_;
  std::unique_ptr<grpc::Server> server_;
};

bool IsSocket(const std::string& p) {
  std::error_code ec;
  return fs::is_socket(fs::symlink_status(p, ec));
}

// The directory events queued on a non-blocking inotify descriptor, as "CREATE name".
std::vector<std::string> ReadInotify(int fd) {
  std::vector<std::string> out;
  alignas(inotify_event) char buf[4096];
  ssize_t n = 0;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) {
    for (ssize_t off = 0; off < n;) {
      inotify_event event{};
      std::memcpy(&event, buf + off, sizeof event);
      const std::string name(buf + off + sizeof event);
      out.push_back(std::string((event.mask & IN_CREATE) != 0 ? "CREATE " : "DELETE ") + name);
      off += static_cast<ssize_t>(sizeof event + event.len);
    }
  }
  return out;
}

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

class FakeKubeletTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fk-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    kubelet_ = std::make_unique<FakeKubelet>(dir_);
    ASSERT_TRUE(kubelet_->Start().ok());
    ASSERT_TRUE(IsSocket(dir_ + "/kubelet.sock"));
  }
  void TearDown() override {
    kubelet_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::vector<v1beta1::Device> FourGpus() {
    return {MakeDevice("GPU-0", kHealthy, 0), MakeDevice("GPU-1", kHealthy, 0), MakeDevice("GPU-2", kHealthy, 1),
            MakeDevice("GPU-3", kHealthy, 1)};
  }

  std::string dir_;
  std::unique_ptr<FakeKubelet> kubelet_;
};

TEST(ExtendedResourceName, FollowsKubernetes) {
  EXPECT_TRUE(IsExtendedResourceName("nvidia.com/gpu"));
  EXPECT_TRUE(IsExtendedResourceName("nvidia.com/mig-1g.10gb"));
  EXPECT_TRUE(IsExtendedResourceName("example.com/foo_bar.baz"));
  EXPECT_FALSE(IsExtendedResourceName("gpu"));
  EXPECT_FALSE(IsExtendedResourceName("kubernetes.io/gpu"));
  EXPECT_FALSE(IsExtendedResourceName("foo.kubernetes.io/gpu"));
  EXPECT_FALSE(IsExtendedResourceName("requests.nvidia.com/gpu"));
  EXPECT_FALSE(IsExtendedResourceName("nvidia.com/"));
  EXPECT_FALSE(IsExtendedResourceName("/gpu"));
  EXPECT_FALSE(IsExtendedResourceName("Nvidia.com/gpu"));
  EXPECT_FALSE(IsExtendedResourceName("nvidia.com/gpu/x"));
  EXPECT_FALSE(IsExtendedResourceName("nvidia.com/-gpu"));
  EXPECT_FALSE(IsExtendedResourceName("nvidia.com/" + std::string(64, 'g')));
}

TEST_F(FakeKubeletTest, RefusesBadVersionAndResourceName) {
  PluginServer p(dir_, "p.sock");
  ASSERT_TRUE(p.Serve());
  p.Plugin().SetDevices(FourGpus());

  grpc::Status s = p.Register("example.com/gpu", "v1alpha");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_NE(s.error_message().find("\"v1alpha\" is not supported"), std::string::npos) << s.error_message();

  for (const char* bad : {"gpu", "kubernetes.io/gpu", "requests.example.com/gpu"}) {
    s = p.Register(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.error_message().find("is invalid"), std::string::npos) << s.error_message();
  }
  EXPECT_TRUE(kubelet_->Resources().empty());
}

TEST_F(FakeKubeletTest, RefusesPluginWithoutOptions) {
  // A server that does not implement DevicePlugin: GetDevicePluginOptions is UNIMPLEMENTED.
  grpc::ServerBuilder builder;
  v1beta1::Registration::Service wrong;
  builder.AddListeningPort("unix:" + dir_ + "/wrong.sock", grpc::InsecureServerCredentials());
  builder.RegisterService(&wrong);
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  PluginServer p(dir_, "wrong.sock");
  const grpc::Status s = p.Register("example.com/gpu");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("failed to get device plugin options"), std::string::npos) << s.error_message();
  EXPECT_FALSE(kubelet_->Get("example.com/gpu").has_value());
  server->Shutdown();
}

TEST_F(FakeKubeletTest, RecordsRegistrationAndListAndWatch) {
  PluginServer p(dir_, "p.sock", /*preferred=*/true);
  ASSERT_TRUE(p.Serve());
  p.Plugin().SetDevices(FourGpus());
  ASSERT_TRUE(p.Register("example.com/gpu").ok());

  // Register is synchronous: the resource exists when it returns.
  auto st = kubelet_->Get("example.com/gpu");
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->endpoint, "p.sock");
  EXPECT_TRUE(st->options.get_preferred_allocation_available());
  EXPECT_FALSE(st->options.pre_start_required());
  EXPECT_EQ(st->registrations, 1);
  EXPECT_EQ(kubelet_->Resources(), std::vector<std::string>{"example.com/gpu"});

  ASSERT_TRUE(kubelet_->WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return s.updates >= 1; }, kWait));
  st = kubelet_->Get("example.com/gpu");
  ASSERT_EQ(st->devices.size(), 4u);
  EXPECT_EQ(st->devices[2].id, "GPU-2");
  EXPECT_EQ(st->devices[2].health, kHealthy);
  EXPECT_EQ(st->devices[2].numa, std::vector<int64_t>{1});
  EXPECT_TRUE(st->connected);
  EXPECT_EQ(st->Healthy(), 4);
  EXPECT_EQ(st->Unhealthy(), 0);

  // A second full list with one unhealthy device.
  auto devices = FourGpus();
  devices[1].set_health(kUnhealthy);
  p.Plugin().SetDevices(devices);
  ASSERT_TRUE(kubelet_->WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return s.Unhealthy() == 1; }, kWait));
  st = kubelet_->Get("example.com/gpu");
  EXPECT_EQ(st->updates, 2);
  EXPECT_EQ(st->Healthy(), 3);
  EXPECT_EQ(st->UnhealthyIds(), std::vector<std::string>{"GPU-1"});
  EXPECT_EQ(st->devices[1].health, kUnhealthy);
}

TEST_F(FakeKubeletTest, AllocateAndPreferredAllocationRoundTrip) {
  PluginServer p(dir_, "p.sock");
  ASSERT_TRUE(p.Serve());
  p.Plugin().SetDevices(FourGpus());
  ASSERT_TRUE(p.Register("example.com/gpu").ok());

  auto preferred =
      kubelet_->GetPreferredAllocation("example.com/gpu", {"GPU-0", "GPU-1", "GPU-2", "GPU-3"}, {"GPU-3"}, 2);
  ASSERT_TRUE(preferred.ok()) << preferred.status();
  EXPECT_EQ(*preferred, (std::vector<std::string>{"GPU-3", "GPU-0"}));
  const auto asked = p.Plugin().LastPreferred();
  ASSERT_EQ(asked.container_requests_size(), 1);
  EXPECT_EQ(asked.container_requests(0).allocation_size(), 2);
  EXPECT_EQ(asked.container_requests(0).available_deviceids_size(), 4);
  EXPECT_EQ(asked.container_requests(0).must_include_deviceids_size(), 1);

  auto response = kubelet_->Allocate("example.com/gpu", *preferred);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->container_responses_size(), 1);
  EXPECT_EQ(response->container_responses(0).envs().at("TEST_VISIBLE_DEVICES"), "GPU-3,GPU-0");
  EXPECT_EQ(response->container_responses(0).devices_size(), 2);
  const auto request = p.Plugin().LastAllocate();
  ASSERT_EQ(request.container_requests_size(), 1);
  EXPECT_EQ(request.container_requests(0).devices_ids_size(), 2);

  // The plugin's error comes back with its code and message.
  auto refused = kubelet_->Allocate("example.com/gpu", {"bad"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(refused.status().message()), "unknown device bad");

  auto unknown = kubelet_->Allocate("example.com/none", {"GPU-0"});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(FakeKubeletTest, PluginGoneMeansDisconnectedAndUnhealthy) {
  PluginServer p(dir_, "p.sock");
  ASSERT_TRUE(p.Serve());
  p.Plugin().SetDevices(FourGpus());
  ASSERT_TRUE(p.Register("example.com/gpu").ok());
  ASSERT_TRUE(kubelet_->WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return s.Healthy() == 4; }, kWait));

  p.Shutdown();
  ASSERT_TRUE(kubelet_->WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return !s.connected; }, kWait));
  const auto st = kubelet_->Get("example.com/gpu");
  EXPECT_EQ(st->devices.size(), 4u);  // kept, as kubelet keeps the resource
  EXPECT_EQ(st->Healthy(), 0);
  EXPECT_EQ(st->Unhealthy(), 4);
  auto response = kubelet_->Allocate("example.com/gpu", {"GPU-0"});
  EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(FakeKubeletTest, ReRegistrationReplacesTheEndpoint) {
  PluginServer a(dir_, "a.sock");
  PluginServer b(dir_, "b.sock", /*preferred=*/false);
  ASSERT_TRUE(a.Serve());
  ASSERT_TRUE(b.Serve());
  a.Plugin().SetDevices(FourGpus());
  b.Plugin().SetDevices({MakeDevice("X-0", kHealthy)});
  ASSERT_TRUE(a.Register("example.com/gpu").ok());
  ASSERT_TRUE(kubelet_->WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return s.updates == 1; }, kWait));

  ASSERT_TRUE(b.Register("example.com/gpu").ok());
  ASSERT_TRUE(kubelet_->WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return s.registrations == 2 && s.devices.size() == 1; }, kWait));
  const auto st = kubelet_->Get("example.com/gpu");
  EXPECT_EQ(st->endpoint, "b.sock");
  EXPECT_FALSE(st->options.get_preferred_allocation_available());
  EXPECT_TRUE(st->connected);
  // The old stream was cancelled by the kubelet side.
  EXPECT_TRUE(a.Plugin().WaitCancelledStreams(1, kWait));
  EXPECT_EQ(a.Plugin().CancelledStreams(), 1);
  // And later updates from the old plugin are not taken.
  a.Plugin().SetDevices({});
  auto response = kubelet_->Allocate("example.com/gpu", {"X-0"});
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(b.Plugin().LastAllocate().container_requests_size(), 1);
  EXPECT_EQ(a.Plugin().LastAllocate().container_requests_size(), 0);
}

TEST_F(FakeKubeletTest, RestartDeletesSocketsAndPluginRegistersAgain) {
  // Files kubelet keeps: its checkpoint and anything that is not a socket.
  { std::ofstream(dir_ + "/kubelet_internal_checkpoint") << "{}"; }
  { std::ofstream(dir_ + "/DEPRECATION"); }

  PluginServer p(dir_, "p.sock");
  ASSERT_TRUE(p.Serve());
  p.Plugin().SetDevices(FourGpus());
  ASSERT_TRUE(p.Register("example.com/gpu").ok());
  ASSERT_TRUE(kubelet_->WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return s.updates == 1; }, kWait));
  // Watch the directory as a plugin does (NVIDIA's reacts to IN_CREATE of kubelet.sock).
  const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(watch, 0);
  ASSERT_GE(::inotify_add_watch(watch, dir_.c_str(), IN_CREATE | IN_DELETE), 0);

  ASSERT_TRUE(kubelet_->Restart().ok());
  const std::vector<std::string> events = ReadInotify(watch);
  ::close(watch);
  EXPECT_FALSE(fs::exists(p.Path()));  // the plugin's socket is gone
  ASSERT_TRUE(IsSocket(dir_ + "/kubelet.sock"));
  EXPECT_TRUE(Contains(events, "DELETE p.sock")) << ::testing::PrintToString(events);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "CREATE kubelet.sock") << ::testing::PrintToString(events);
  EXPECT_TRUE(fs::exists(dir_ + "/kubelet_internal_checkpoint"));
  EXPECT_TRUE(fs::exists(dir_ + "/DEPRECATION"));
  auto st = kubelet_->Get("example.com/gpu");
  ASSERT_TRUE(st.has_value());  // restored, but disconnected until the plugin registers again
  EXPECT_FALSE(st->connected);
  EXPECT_EQ(st->Healthy(), 0);

  // What a plugin does on kubelet restart: serve again, register again.
  p.Shutdown();
  ASSERT_TRUE(p.Serve());
  ASSERT_TRUE(IsSocket(p.Path()));
  ASSERT_TRUE(p.Register("example.com/gpu").ok());
  ASSERT_TRUE(kubelet_->WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return s.registrations == 2 && s.connected && s.updates == 2; },
      kWait));
  EXPECT_EQ(kubelet_->Get("example.com/gpu")->Healthy(), 4);
  EXPECT_TRUE(kubelet_->Allocate("example.com/gpu", {"GPU-0"}).ok());
}

TEST_F(FakeKubeletTest, EventsArriveInOrder) {
  std::mutex mu;
  std::vector<FakeKubeletEvent::Kind> kinds;
  FakeKubelet k(dir_ + "/k2");
  fs::create_directory(dir_ + "/k2");
  k.OnEvent([&](const FakeKubeletEvent& e) {
    std::lock_guard<std::mutex> l(mu);
    kinds.push_back(e.kind);
  });
  ASSERT_TRUE(k.Start().ok());
  PluginServer p(dir_ + "/k2", "p.sock");
  ASSERT_TRUE(p.Serve());
  p.Plugin().SetDevices(FourGpus());
  ASSERT_TRUE(p.Register("example.com/gpu").ok());
  ASSERT_TRUE(k.WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return s.updates == 1; }, kWait));
  p.Shutdown();
  ASSERT_TRUE(k.WaitFor(
      "example.com/gpu", [](const ResourceState& s) { return !s.connected; }, kWait));
  k.Stop();
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(kinds,
            (std::vector<FakeKubeletEvent::Kind>{FakeKubeletEvent::Kind::kRegistered, FakeKubeletEvent::Kind::kUpdate,
                                                 FakeKubeletEvent::Kind::kDisconnected}));
  EXPECT_FALSE(fs::exists(dir_ + "/k2/kubelet.sock"));
}

}  // namespace
}  // namespace kgpu::testing
