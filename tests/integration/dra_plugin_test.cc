// kgpu's DRA kubelet plugin (src/dra/plugin.h) driven over its unix sockets as kubelet drives it
// (k8s.io/kubelet pluginregistration/v1, dra/v1, dra/v1beta1, dra-health/v1alpha1): GetInfo and
// NotifyRegistrationStatus on the registration socket, NodePrepareResources and
// NodeUnprepareResources batched per driver with an entry for every claim, the health stream, and
// the registration socket served again when it disappears.

#include <filesystem>
#include <fstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include "api/dra.h"
#include "dra/plugin.h"
#include "dra/prepare.h"
#include "dra/publish.h"
#include "dra/slices.h"
#include "dra_health_v1.grpc.pb.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "gpu/inventory.h"
#include "gpu/mig_layout.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "nvml/library.h"
#include "pluginregistration_v1.grpc.pb.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_kubelet_dra.h"
#include "testing/poll.h"
#include "testing/sim_node.h"
#include "testing/spawn.h"

namespace kgpu::dra {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
namespace v1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace v1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

class DraPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::FakeApiServerOptions o;
    o.git_version = "v1.34.2";
    api_ = std::make_unique<testing::FakeApiServer>(o);
    ASSERT_TRUE(api_->Start().ok());
    k8s::Config c;
    c.server = api_->url();
    client_ = std::move(*k8s::Client::Create(c));
    auto lib = nvml::Library::Open({testing::SimNode::LibraryPath()});
    ASSERT_TRUE(lib.ok()) << lib.status();
    lib_ = std::move(*lib);
    auto inv = gpu::Inventory::Discover(*lib_, {sim_.dir()});
    ASSERT_TRUE(inv.ok()) << inv.status();
    inv_ = *inv;
    PrepareOptions p;
    p.driver = api::dra::kDriver;
    p.node_name = "node-a";
    p.plugin_dir = sim_.dir() + "/plugins/gpu.nvidia.com";
    p.cdi_dir = sim_.dir() + "/cdi";
    auto preparer = Preparer::Create(client_, inv_, p);
    ASSERT_TRUE(preparer.ok()) << preparer.status();
    preparer_ = std::move(*preparer);
    opts_.driver = api::dra::kDriver;
    opts_.registry_dir = sim_.dir() + "/plugins_registry";
    opts_.plugin_dir = p.plugin_dir;
    opts_.socket_check = 100ms;
    auto plugin = Plugin::Start(opts_, preparer_);
    ASSERT_TRUE(plugin.ok()) << plugin.status();
    plugin_ = std::move(*plugin);
  }
  void TearDown() override {
    plugin_.reset();
    std::filesystem::remove_all(sim_.dir());
  }

  std::shared_ptr<grpc::Channel> Dial(const std::string& socket) {
    return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  }
  // An allocated claim for GPU `index` in this node's pool; returns its UID.
  std::string Claim(const std::string& name, unsigned index, bool allocate = true) {
    const json claim = {
        {"apiVersion", "resource.k8s.io/v1"},
        {"kind", "ResourceClaim"},
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec",
         {{"devices", {{"requests", {{{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu.nvidia.com"}}}}}}}}}}};
    json created = api_->Create("resourceclaims", "default", claim).body;
    if (allocate) {
      const json result = {{"request", "gpu"},
                           {"driver", api::dra::kDriver},
                           {"pool", "node-a"},
                           {"device", api::dra::GpuDeviceName(inv_->gpus()[index].minor)}};
      created["status"]["allocation"]["devices"]["results"] = json::array({result});
      EXPECT_EQ(api_->Update("resourceclaims", "default", created).code, 200);
    }
    return created["metadata"]["uid"];
  }

  testing::SimNode sim_{"l4x4"};
  std::unique_ptr<testing::FakeApiServer> api_;
  std::shared_ptr<k8s::Client> client_;
  std::unique_ptr<nvml::Library> lib_;
  std::shared_ptr<const gpu::Inventory> inv_;
  std::shared_ptr<Preparer> preparer_;
  PluginOptions opts_;
  std::unique_ptr<Plugin> plugin_;
};

TEST_F(DraPluginTest, RegistersAsKubeletsPluginWatcherAsks) {
  auto stub = ::pluginregistration::Registration::NewStub(Dial(opts_.registry_dir + "/gpu.nvidia.com-reg.sock"));
  grpc::ClientContext ctx;
  ::pluginregistration::InfoRequest req;
  ::pluginregistration::PluginInfo info;
  ASSERT_TRUE(stub->GetInfo(&ctx, req, &info).ok());
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), "gpu.nvidia.com");
  EXPECT_EQ(info.endpoint(), opts_.plugin_dir + "/dra.sock");
  ASSERT_EQ(info.supported_versions_size(), 4);
  EXPECT_EQ(info.supported_versions(0), "v1.DRAPlugin");
  EXPECT_EQ(info.supported_versions(1), "v1beta1.DRAPlugin");
  EXPECT_EQ(info.supported_versions(2), "v1alpha1.DRAResourceHealth");
  EXPECT_EQ(info.supported_versions(3), "v1.DRAResourceHealth");
  grpc::ClientContext ctx2;
  ::pluginregistration::RegistrationStatus status;
  status.set_plugin_registered(true);
  ::pluginregistration::RegistrationStatusResponse resp;
  ASSERT_TRUE(stub->NotifyRegistrationStatus(&ctx2, status, &resp).ok());
  EXPECT_EQ(plugin_->Registration(), (std::pair<bool, std::string>{true, ""}));
  // The socket removed: served again, and kubelet's watcher can register us again.
  std::filesystem::remove(plugin_->RegistrationSocket());
  ASSERT_TRUE(testing::WaitFor([&] { return std::filesystem::is_socket(plugin_->RegistrationSocket()); }, 5s));
  auto again = ::pluginregistration::Registration::NewStub(Dial(plugin_->RegistrationSocket()));
  grpc::ClientContext ctx3;
  ctx3.set_deadline(std::chrono::system_clock::now() + 5s);
  ::pluginregistration::PluginInfo info2;
  ASSERT_TRUE(again->GetInfo(&ctx3, req, &info2).ok());
  EXPECT_EQ(info2.name(), "gpu.nvidia.com");
}

TEST_F(DraPluginTest, PreparesEveryClaimOfABatchAndUnpreparesThem) {
  const std::string good = Claim("good", 0), pending = Claim("pending", 1, false);
  auto stub = v1::DRAPlugin::NewStub(Dial(plugin_->ServiceSocket()));
  v1::NodePrepareResourcesRequest req;
  for (const auto& [name, uid] : {std::pair{"good", good}, std::pair{"pending", pending}}) {
    auto* c = req.add_claims();
    c->set_namespace_("default");
    c->set_name(name);
    c->set_uid(uid);
  }
  grpc::ClientContext ctx;
  v1::NodePrepareResourcesResponse resp;
  ASSERT_TRUE(stub->NodePrepareResources(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.claims_size(), 2);  // every claim of the request has its entry
  const auto& ok = resp.claims().at(good);
  EXPECT_EQ(ok.error(), "");
  ASSERT_EQ(ok.devices_size(), 1);
  const std::string dev = api::dra::GpuDeviceName(inv_->gpus()[0].minor);
  EXPECT_EQ(ok.devices(0).pool_name(), "node-a");
  EXPECT_EQ(ok.devices(0).device_name(), dev);
  ASSERT_EQ(ok.devices(0).request_names_size(), 1);
  EXPECT_EQ(ok.devices(0).request_names(0), "gpu");
  ASSERT_EQ(ok.devices(0).cdi_device_ids_size(), 1);
  EXPECT_EQ(ok.devices(0).cdi_device_ids(0), "k8s.gpu.nvidia.com/claim=" + good + "-" + dev);
  EXPECT_NE(resp.claims().at(pending).error().find("is not allocated"), std::string::npos)
      << resp.claims().at(pending).error();
  EXPECT_TRUE(std::filesystem::exists(preparer_->SpecPath(good)));
  // The same claim through v1beta1: the same answer (prepared once).
  auto beta = v1beta1::DRAPlugin::NewStub(Dial(plugin_->ServiceSocket()));
  v1beta1::NodePrepareResourcesRequest breq;
  auto* bc = breq.add_claims();
  bc->set_namespace_("default");
  bc->set_name("good");
  bc->set_uid(good);
  grpc::ClientContext bctx;
  v1beta1::NodePrepareResourcesResponse bresp;
  ASSERT_TRUE(beta->NodePrepareResources(&bctx, breq, &bresp).ok());
  ASSERT_EQ(bresp.claims().at(good).devices_size(), 1);
  EXPECT_EQ(bresp.claims().at(good).devices(0).cdi_device_ids(0), ok.devices(0).cdi_device_ids(0));
  // Unprepare both (one was never prepared): an entry each, no error.
  v1::NodeUnprepareResourcesRequest ureq;
  for (const auto& c : req.claims()) *ureq.add_claims() = c;
  grpc::ClientContext uctx;
  v1::NodeUnprepareResourcesResponse uresp;
  ASSERT_TRUE(stub->NodeUnprepareResources(&uctx, ureq, &uresp).ok());
  ASSERT_EQ(uresp.claims_size(), 2);
  EXPECT_EQ(uresp.claims().at(good).error(), "");
  EXPECT_EQ(uresp.claims().at(pending).error(), "");
  EXPECT_FALSE(std::filesystem::exists(preparer_->SpecPath(good)));
}

TEST_F(DraPluginTest, TheHealthStreamSendsTheCompleteListOnEveryChange) {
  const std::string dev = api::dra::GpuDeviceName(inv_->gpus()[0].minor);
  plugin_->SetHealth({{"node-a", dev, DeviceHealthReport::Health::kHealthy, "", 100}});
  auto stub = ::v1alpha1::DRAResourceHealth::NewStub(Dial(plugin_->ServiceSocket()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  ::v1alpha1::NodeWatchResourcesRequest req;
  auto reader = stub->NodeWatchResources(&ctx, req);
  ::v1alpha1::NodeWatchResourcesResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_EQ(msg.devices_size(), 1);
  EXPECT_EQ(msg.devices(0).device().device_name(), dev);
  EXPECT_EQ(msg.devices(0).health(), ::v1alpha1::HEALTHY);
  plugin_->SetHealth({{"node-a", dev, DeviceHealthReport::Health::kUnhealthy, std::string(2000, 'x'), 200}});
  ASSERT_TRUE(reader->Read(&msg));
  ASSERT_EQ(msg.devices_size(), 1);
  EXPECT_EQ(msg.devices(0).health(), ::v1alpha1::UNHEALTHY);
  EXPECT_EQ(msg.devices(0).last_updated_time(), 200);
  EXPECT_EQ(msg.devices(0).message().size(), 1024U);  // kubelet's limit: cut with "..."
  EXPECT_EQ(msg.devices(0).message().substr(1021), "...");
  ctx.TryCancel();
  // kubelet 1.37's v1 service: the same list.
  auto v1stub = ::v1::DRAResourceHealth::NewStub(Dial(plugin_->ServiceSocket()));
  grpc::ClientContext ctx1;
  ctx1.set_deadline(std::chrono::system_clock::now() + 10s);
  auto reader1 = v1stub->NodeWatchResources(&ctx1, {});
  ::v1::NodeWatchResourcesResponse msg1;
  ASSERT_TRUE(reader1->Read(&msg1));
  ASSERT_EQ(msg1.devices_size(), 1);
  EXPECT_EQ(msg1.devices(0).health(), ::v1::UNHEALTHY);
  ctx1.TryCancel();
}

// The publisher writes only when the pool changed, and finishes a publish that was cut short (slices
// at different generations).
TEST(SlicePublisherTest, WritesOnChangeAndRepairsMixedGenerations) {
  testing::SimNode sim("dgx-a100-mig", "node-b");
  testing::FakeApiServerOptions o;
  o.git_version = "v1.35.0";
  testing::FakeApiServer api(o);
  ASSERT_TRUE(api.Start().ok());
  ASSERT_EQ(api.Create("nodes", "", {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node-b"}}}}).code,
            201);
  k8s::Config c;
  c.server = api.url();
  std::shared_ptr<k8s::Client> client = std::move(*k8s::Client::Create(c));
  auto lib = nvml::Library::Open({testing::SimNode::LibraryPath()});
  ASSERT_TRUE(lib.ok());
  auto inv = gpu::Inventory::Discover(**lib, {sim.dir()});
  ASSERT_TRUE(inv.ok());
  std::map<unsigned, gpu::MigCatalog> mig;
  for (const auto& g : (*inv)->gpus()) {
    if (g.mig_enabled) mig[g.index] = *gpu::ReadMigCatalog(**lib, g);
  }
  PoolOptions po;
  po.node_name = "node-b";
  po.dynamic_mig = true;
  const auto slices = BuildPool(**inv, mig, po);
  ASSERT_TRUE(slices.ok());
  ASSERT_GT(slices->size(), 2U);
  SlicePublisher pub(client, "gpu.nvidia.com", "node-b");
  auto first = pub.Publish(*slices);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->changed);
  EXPECT_EQ(first->generation, 1);
  auto again = pub.Publish(*slices);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->changed);
  // One slice ahead of the others, as when a publish stops half way.
  json one = api.Get("resourceslices", "", (*slices)[1].name).body;
  one["spec"]["pool"]["generation"] = 2;
  ASSERT_EQ(api.Update("resourceslices", "", one).code, 200);
  auto repaired = pub.Publish(*slices);
  ASSERT_TRUE(repaired.ok());
  EXPECT_TRUE(repaired->changed);
  EXPECT_EQ(repaired->generation, 3);
  for (const auto& s : *slices) {
    EXPECT_EQ(api.Get("resourceslices", "", s.name).body["spec"]["pool"]["generation"], 3) << s.name;
  }
  // Fewer slices (the MIG GPUs gone): the leftovers are deleted after the rest is written.
  po.dynamic_mig = false;
  auto fewer = pub.Publish(*BuildPool(**inv, mig, po));
  ASSERT_TRUE(fewer.ok());
  EXPECT_EQ(fewer->deleted, slices->size() - 1);
  EXPECT_EQ(api.Get("resourceslices", "", (*slices)[1].name).code, 404);
}

// `kgpu dra` as a process, as its DaemonSet runs it (with deploy/dra's RBAC): it publishes the pool (owned by the
// Node), an XID taints the GPU's device (timeAdded kept across resyncs: no churn), recovery removes the taint, a
// deleted slice comes back at the next resync, SIGTERM ends it with 0.
TEST(DraDriverProcessTest, PublishesThePoolAndFollowsHealth) {
  testing::SimNode sim("l4x4", "node-a");
  testing::FakeApiServerOptions o;
  o.git_version = "v1.35.0";
  testing::FakeApiServer api(o);
  ASSERT_TRUE(api.Start().ok());
  const json node = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node-a"}}}};
  const auto created = api.Create("nodes", "", node);
  ASSERT_EQ(created.code, 201);
  const std::string dir = sim.dir();
  // Exactly the RBAC deploy/dra grants.
  const auto identity = testing::ReadDeployRbac(std::string(KGPU_SOURCE_DIR) + "/deploy/dra");
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(identity->user, "system:serviceaccount:kgpu-system:kgpu-dra");
  std::ofstream(dir + "/kubeconfig") << api.KubeconfigFor(*identity);
  std::ofstream(dir + "/config.yaml") << "version: v1\nhealth:\n  recoverAfter: 8s\n  probeInterval: 200ms\n";
  const pid_t pid =
      testing::Spawn({KGPU_BIN, "dra", "--kubeconfig", dir + "/kubeconfig", "--node-name", "node-a",
                      "--kubelet-registry-dir", dir + "/registry", "--kubelet-plugins-dir", dir + "/plugins",
                      "--cdi-spec-dir", dir + "/cdi", "--resync-interval", "1s", "--config-file", dir + "/config.yaml"},
                     {.log = dir + "/dra.log", .env = {"KGPU_NVML_LIBRARY=" + testing::SimNode::LibraryPath()}});
  ASSERT_GT(pid, 0);
  auto log = [&] {
    std::ifstream in(dir + "/dra.log");
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string name = "node-a-gpu.nvidia.com-0";
  auto slice = [&] { return api.Get("resourceslices", "", name); };
  ASSERT_TRUE(testing::WaitFor([&] { return slice().code == 200; }, 30s)) << log();
  const json first = slice().body;
  EXPECT_EQ(first["metadata"]["ownerReferences"][0]["kind"], "Node");
  EXPECT_EQ(first["metadata"]["ownerReferences"][0]["uid"], created.body["metadata"]["uid"]);
  EXPECT_EQ(first["spec"]["devices"].size(), 4U);
  EXPECT_TRUE(std::filesystem::is_socket(dir + "/registry/gpu.nvidia.com-reg.sock"));
  // An XID: the GPU's device is tainted as NVIDIA's driver taints it.
  ASSERT_EQ(sim.Ctl("xid 1 48"), 0);
  auto taints = [&] {
    for (const auto& d : slice().body["spec"].value("devices", json::array())) {
      if (d.value("taints", json::array()).size() > 0) return d["taints"];
    }
    return json::array();
  };
  ASSERT_TRUE(testing::WaitFor([&] { return !taints().empty(); }, 30s)) << log();
  const json tainted = taints();
  EXPECT_EQ(tainted[0]["key"], "gpu.nvidia.com/xid");
  EXPECT_EQ(tainted[0]["value"], "48");
  EXPECT_EQ(tainted[0]["effect"], "NoSchedule");
  ASSERT_TRUE(tainted[0].contains("timeAdded"));  // set by the API server
  // Resyncs every second leave it alone (the taint's timeAdded is not a change). A negative: it
  // needs a few resync periods to mean anything.
  const auto generation = slice().body["spec"]["pool"]["generation"];
  std::this_thread::sleep_for(3s);
  ASSERT_FALSE(taints().empty()) << "recovered before recoverAfter (8 s)";
  EXPECT_EQ(slice().body["spec"]["pool"]["generation"], generation) << log();
  // Recovered after recoverAfter: untainted.
  ASSERT_TRUE(testing::WaitFor([&] { return taints().empty(); }, 30s)) << log();
  // A slice deleted behind its back comes back at the next resync.
  ASSERT_EQ(api.Delete("resourceslices", "", name).code, 200);
  ASSERT_TRUE(testing::WaitFor([&] { return slice().code == 200; }, 30s)) << log();
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_TRUE(testing::WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, 20s)) << log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << log();
}

// The whole node: kgpu dra as a process and kubelet's DRA manager (the stand-in) around pods'
// lives — registration, a claim prepared once for the two pods that share it and unprepared
// after the last, the pod refused a claim not reserved for it, health reaching kubelet, and a
// kubelet restart that registers the driver again.
TEST(DraDriverProcessTest, KubeletPreparesClaimsAroundPodsLives) {
  testing::SimNode sim("l4x4", "node-a");
  testing::FakeApiServerOptions o;
  o.git_version = "v1.35.0";
  testing::FakeApiServer api(o);
  ASSERT_TRUE(api.Start().ok());
  ASSERT_EQ(api.Create("nodes", "", {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "node-a"}}}}).code,
            201);
  const std::string dir = sim.dir();
  std::ofstream(dir + "/kubeconfig") << api.Kubeconfig();
  const pid_t pid = testing::Spawn(
      {KGPU_BIN, "dra", "--kubeconfig", dir + "/kubeconfig", "--node-name", "node-a", "--kubelet-registry-dir",
       dir + "/registry", "--kubelet-plugins-dir", dir + "/plugins", "--cdi-spec-dir", dir + "/cdi"},
      {.log = dir + "/dra.log", .env = {"KGPU_NVML_LIBRARY=" + testing::SimNode::LibraryPath()}});
  ASSERT_GT(pid, 0);
  auto log = [&] {
    std::ifstream in(dir + "/dra.log");
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  k8s::Config c;
  c.server = api.url();
  std::shared_ptr<k8s::Client> client = std::move(*k8s::Client::Create(c));
  testing::FakeDraKubelet kubelet(dir + "/registry", client);
  kubelet.Start();
  ASSERT_TRUE(testing::WaitFor([&] { return kubelet.Drivers().contains("gpu.nvidia.com"); }, 30s)) << log();
  const auto driver = kubelet.Drivers().at("gpu.nvidia.com");
  EXPECT_EQ(driver.version, "v1");
  EXPECT_TRUE(driver.health);
  EXPECT_EQ(driver.endpoint, dir + "/plugins/gpu.nvidia.com/dra.sock");
  // A claim for GPU 2, allocated and reserved for two pods as kube-scheduler would.
  auto inv = gpu::Inventory::Discover(**nvml::Library::Open({testing::SimNode::LibraryPath()}), {dir});
  ASSERT_TRUE(inv.ok());
  const std::string dev = api::dra::GpuDeviceName((*inv)->gpus()[2].minor);
  json claim = {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", "shared"}, {"namespace", "default"}}},
      {"spec",
       {{"devices", {{"requests", {{{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu.nvidia.com"}}}}}}}}}}};
  claim = api.Create("resourceclaims", "default", claim).body;
  const json result = {{"request", "gpu"}, {"driver", "gpu.nvidia.com"}, {"pool", "node-a"}, {"device", dev}};
  claim["status"]["allocation"]["devices"]["results"] = json::array({result});
  claim["status"]["reservedFor"] = json::array({{{"resource", "pods"}, {"name", "p1"}, {"uid", "uid-p1"}},
                                                {{"resource", "pods"}, {"name", "p2"}, {"uid", "uid-p2"}}});
  ASSERT_EQ(api.Update("resourceclaims", "default", claim).code, 200);
  const std::string uid = claim["metadata"]["uid"];
  auto pod = [](const std::string& name, const std::string& pod_uid) {
    return json{{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", pod_uid}}},
                {"spec", {{"resourceClaims", {{{"name", "gpu"}, {"resourceClaimName", "shared"}}}}}}};
  };
  auto first = kubelet.PreparePod(pod("p1", "uid-p1"));
  ASSERT_TRUE(first.ok()) << first.status() << "\n" << log();
  EXPECT_EQ(first->at("shared"), std::vector<std::string>{"k8s.gpu.nvidia.com/claim=" + uid + "-" + dev});
  const std::string spec = dir + "/cdi/k8s.gpu.nvidia.com-claim_" + uid + ".json";
  ASSERT_TRUE(std::filesystem::exists(spec));
  auto second = kubelet.PreparePod(pod("p2", "uid-p2"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, *first);
  auto stranger = kubelet.PreparePod(pod("p3", "uid-p3"));
  ASSERT_FALSE(stranger.ok());
  EXPECT_NE(stranger.status().message().find("pod p3 (uid-p3) is not allowed to use ResourceClaim shared"),
            std::string::npos)
      << stranger.status();
  ASSERT_TRUE(kubelet.UnpreparePod(pod("p1", "uid-p1")).ok());
  EXPECT_TRUE(std::filesystem::exists(spec));  // p2 still uses it
  ASSERT_TRUE(kubelet.UnpreparePod(pod("p2", "uid-p2")).ok());
  EXPECT_FALSE(std::filesystem::exists(spec));
  // Health reaches kubelet: an XID on GPU 2.
  ASSERT_TRUE(testing::WaitFor([&] { return kubelet.Health("gpu.nvidia.com").contains("node-a/" + dev); }, 30s));
  EXPECT_EQ(kubelet.Health("gpu.nvidia.com").at("node-a/" + dev), "HEALTHY");
  ASSERT_EQ(sim.Ctl("xid 2 79"), 0);  // fallen off the bus: lost
  ASSERT_TRUE(testing::WaitFor(
      [&] { return kubelet.Health("gpu.nvidia.com").at("node-a/" + dev).rfind("UNHEALTHY", 0) == 0; }, 30s))
      << log();
  // A kubelet restart: the watcher finds the socket again and registers the driver again.
  kubelet.Restart();
  ASSERT_TRUE(testing::WaitFor([&] { return kubelet.Drivers().contains("gpu.nvidia.com"); }, 30s));
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_TRUE(testing::WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, 20s)) << log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace kgpu::dra
