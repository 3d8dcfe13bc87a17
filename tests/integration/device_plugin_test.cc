// `kgpu device-plugin` as a real process against the kubelet stand-in, over real unix sockets,
// on a simulated GPU node driven by kgpu-simctl.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testing/fake_kubelet.h"
#include "testing/plugin_fixture.h"
#include "testing/plugin_process.h"
#include "testing/sim_node.h"

namespace kgpu {
namespace {

using namespace std::chrono_literals;
using testing::FakeKubelet;
using testing::Plugin;
using testing::ResourceState;
using testing::SimNode;

class DevicePluginTest : public testing::PluginNodeTest {
 protected:
  bool WaitDevices(const std::string& resource, size_t count, int healthy, std::chrono::milliseconds t = 10s) {
    return kubelet_->WaitFor(
        resource,
        [&](const ResourceState& s) { return s.connected && s.devices.size() == count && s.Healthy() == healthy; }, t);
  }
  std::vector<std::string> Ids(const std::string& resource) {
    std::vector<std::string> ids;
    const auto state = kubelet_->Get(resource);
    for (const auto& d : state->devices) ids.push_back(d.id);
    return ids;
  }
};

TEST_F(DevicePluginTest, RegistersWholeGpusWithNumaAndOptions) {
  Init("dgx-h100");
  Plugin p(sim_->dir(), {});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 8)) << p.Log();
  auto s = kubelet_->Get("nvidia.com/gpu");
  EXPECT_EQ(s->endpoint, "nvidia-gpu.sock");
  EXPECT_TRUE(s->options.get_preferred_allocation_available());
  EXPECT_FALSE(s->options.pre_start_required());
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(5s), 0) << p.Log();
  EXPECT_FALSE(std::filesystem::exists(sim_->dir() + "/nvidia-gpu.sock"));  // removed on SIGTERM
}

TEST_F(DevicePluginTest, NumaTopologyFromSysfs) {
  Init("dgx-h100");
  ASSERT_EQ(sim_->Ctl("sysfs " + sim_->dir() + "/sys"), 0);
  // --sysfs-root is a global flag (before the subcommand); its variable is KGPU_SYSFS_ROOT.
  Plugin p(sim_->dir(), {"--config-file", WriteConfig("version: v1\n")}, {"KGPU_SYSFS_ROOT=" + sim_->dir() + "/sys"});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 8)) << p.Log();
  auto s = kubelet_->Get("nvidia.com/gpu");
  ASSERT_EQ(s->devices[0].numa, std::vector<int64_t>{0});
  ASSERT_EQ(s->devices[7].numa, std::vector<int64_t>{1});
}

TEST_F(DevicePluginTest, AllocateEveryStrategy) {
  Init("dgx-h100");
  const std::string cdi = sim_->dir() + "/cdi";
  Plugin p(sim_->dir(), {"--device-list-strategy", "envvar,volume-mounts,cdi-annotations,cdi-cri",
                         "--pass-device-specs", "--cdi-spec-dir", cdi});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 8)) << p.Log();
  const auto ids = Ids("nvidia.com/gpu");
  auto r = kubelet_->Allocate("nvidia.com/gpu", {ids[1], ids[6]});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->container_responses_size(), 1);
  const auto& c = r->container_responses(0);
  EXPECT_EQ(c.envs().at("NVIDIA_VISIBLE_DEVICES"), "/var/run/nvidia-container-devices");
  ASSERT_EQ(c.mounts_size(), 2);
  EXPECT_EQ(c.mounts(0).container_path(), "/var/run/nvidia-container-devices/" + ids[1]);
  EXPECT_EQ(c.mounts(0).host_path(), "/dev/null");
  ASSERT_EQ(c.annotations_size(), 1);
  EXPECT_EQ(c.annotations().begin()->first.rfind("cdi.k8s.io/nvidia-device-plugin_", 0), 0u);
  EXPECT_EQ(c.annotations().begin()->second,
            "k8s.device-plugin.nvidia.com/gpu=" + ids[1] + ",k8s.device-plugin.nvidia.com/gpu=" + ids[6]);
  ASSERT_EQ(c.cdi_devices_size(), 2);
  EXPECT_EQ(c.cdi_devices(1).name(), "k8s.device-plugin.nvidia.com/gpu=" + ids[6]);
  std::set<std::string> nodes;
  for (const auto& d : c.devices()) nodes.insert(d.container_path());
  EXPECT_EQ(nodes, (std::set<std::string>{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidia6"}));
  EXPECT_TRUE(std::filesystem::exists(cdi + "/k8s.device-plugin.nvidia.com-gpu.json"));

  auto unknown = kubelet_->Allocate("nvidia.com/gpu", {"GPU-does-not-exist"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(std::string(unknown.status().message()).find("unknown device: GPU-does-not-exist"), std::string::npos);
}

TEST_F(DevicePluginTest, IndexStrategyEnvvar) {
  Init("l4x4");
  Plugin p(sim_->dir(), {"--device-id-strategy", "index"});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 4, 4)) << p.Log();
  const auto ids = Ids("nvidia.com/gpu");
  auto r = kubelet_->Allocate("nvidia.com/gpu", {ids[3], ids[0]});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "3,0");
}

TEST_F(DevicePluginTest, TimeSlicingPerGpuReplicasAndXidMarksEveryReplica) {
  Init("dgx-h100");
  const std::string config = WriteConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n"
      "    resources:\n    - {name: nvidia.com/gpu, replicas: 4, devices: [0, 1, 2, 3]}\n"
      "    - {name: nvidia.com/gpu, replicas: 2, devices: [4, 5]}\n");
  Plugin p(sim_->dir(), {"--config-file", config});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu.shared", 20, 20)) << p.Log();
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 2, 2)) << p.Log();
  EXPECT_EQ(kubelet_->Get("nvidia.com/gpu.shared")->endpoint, "nvidia-gpu.shared.sock");

  const auto ids = Ids("nvidia.com/gpu.shared");
  auto two = kubelet_->Allocate("nvidia.com/gpu.shared", {ids[0], ids[5]});
  ASSERT_FALSE(two.ok());
  EXPECT_NE(std::string(two.status().message()).find("maximum request size for shared resources is 1; found 2"),
            std::string::npos);

  ASSERT_EQ(sim_->Ctl("xid 2 48"), 0);
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu.shared", 20, 16)) << p.Log();
  const auto bad = kubelet_->Get("nvidia.com/gpu.shared")->UnhealthyIds();
  ASSERT_EQ(bad.size(), 4u);
  for (const auto& id : bad) EXPECT_EQ(id.substr(0, id.size() - 3), ids[8].substr(0, ids[8].size() - 3));
  EXPECT_EQ(kubelet_->Get("nvidia.com/gpu")->Healthy(), 2);  // other resources untouched
}

TEST_F(DevicePluginTest, PreferredAllocationSpreadsReplicas) {
  Init("dgx-h100");
  const std::string config = WriteConfig("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n");
  Plugin p(sim_->dir(), {"--config-file", config});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 32, 32)) << p.Log();
  auto pick = kubelet_->GetPreferredAllocation("nvidia.com/gpu", Ids("nvidia.com/gpu"), {}, 4);
  ASSERT_TRUE(pick.ok()) << pick.status();
  ASSERT_EQ(pick->size(), 4u);
  std::set<std::string> gpus;
  for (const auto& id : *pick) gpus.insert(id.substr(0, id.find("::")));
  EXPECT_EQ(gpus.size(), 4u);
}

TEST_F(DevicePluginTest, LostGpuAndRecovery) {
  Init("dgx-h100");
  const std::string config = WriteConfig("health:\n  recoverAfter: 0s\n  probeInterval: 100ms\n");
  Plugin p(sim_->dir(), {"--config-file", config});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 8)) << p.Log();
  ASSERT_EQ(sim_->Ctl("lose 5"), 0);
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 7)) << p.Log();
  // The other GPUs are still allocatable, and preferred allocation does not fail.
  auto ids = kubelet_->Get("nvidia.com/gpu")->HealthyIds();
  auto pick = kubelet_->GetPreferredAllocation("nvidia.com/gpu", ids, {}, 4);
  ASSERT_TRUE(pick.ok()) << pick.status();
  ASSERT_TRUE(kubelet_->Allocate("nvidia.com/gpu", *pick).ok());
  ASSERT_EQ(sim_->Ctl("restore 5"), 0);
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 8)) << p.Log();
}

TEST_F(DevicePluginTest, HungNvmlCallKeepsServing) {
  Init("dgx-h100");
  const std::string config =
      WriteConfig("health:\n  probeInterval: 100ms\n  hangThreshold: 300ms\n  recoverAfter: 0s\n");
  Plugin p(sim_->dir(), {"--config-file", config});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 8)) << p.Log();
  ASSERT_EQ(sim_->Ctl("hang 3 4000"), 0);
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 7, 5s)) << p.Log();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = kubelet_->Allocate("nvidia.com/gpu", {Ids("nvidia.com/gpu")[0]});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);  // Allocate never waits for NVML
  EXPECT_NE(p.Log().find("has not returned"), std::string::npos);
  ASSERT_EQ(sim_->Ctl("hang 3 0"), 0);
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 8)) << p.Log();
}

TEST_F(DevicePluginTest, TwentyKubeletRestartsLoseNoResource) {
  Init("dgx-h100");
  const std::string config = WriteConfig(
      "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2, devices: [0, 1], rename: "
      "gpu.shared}\n");
  Plugin p(sim_->dir(), {"--config-file", config});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 6, 6)) << p.Log();
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu.shared", 4, 4)) << p.Log();
  for (int i = 1; i <= 20; ++i) {
    ASSERT_TRUE(kubelet_->Restart().ok());
    const auto t0 = std::chrono::steady_clock::now();
    for (const char* r : {"nvidia.com/gpu", "nvidia.com/gpu.shared"}) {
      ASSERT_TRUE(kubelet_->WaitFor(
          r,
          [&](const ResourceState& s) {
            return s.registrations == i + 1 && s.connected &&
                   s.Healthy() == (std::string(r) == "nvidia.com/gpu" ? 6 : 4);
          },
          5s))
          << "restart " << i << " " << r << "\n"
          << p.Log();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "restart " << i;
  }
}

// A socket removed while kubelet runs is served again at once and registered again; after such
// re-serves a kubelet restart still gets its registration.
TEST_F(DevicePluginTest, RemovedSocketIsServedAndRegisteredAgain) {
  Init("l4x4");
  Plugin p(sim_->dir(), {});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 4, 4)) << p.Log();
  const std::string socket = sim_->dir() + "/nvidia-gpu.sock";
  for (int i = 2; i <= 4; ++i) {
    ASSERT_TRUE(std::filesystem::remove(socket));
    ASSERT_TRUE(kubelet_->WaitFor(
        "nvidia.com/gpu",
        [&](const ResourceState& s) { return s.registrations >= i && s.connected && s.Healthy() == 4; }, 5s))
        << "removal " << i - 1 << "\n"
        << p.Log();
    EXPECT_TRUE(std::filesystem::exists(socket));
  }
  EXPECT_NE(p.Log().find("our socket was removed: re-serving"), std::string::npos) << p.Log();
  const int before = kubelet_->Get("nvidia.com/gpu")->registrations;
  ASSERT_TRUE(kubelet_->Restart().ok());
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/gpu",
      [&](const ResourceState& s) { return s.registrations > before && s.connected && s.Healthy() == 4; }, 5s))
      << p.Log();
}

TEST_F(DevicePluginTest, WaitsForAnAbsentKubelet) {
  Init("l4x4");
  kubelet_->Stop();
  std::filesystem::remove(sim_->dir() + "/kubelet.sock");
  Plugin p(sim_->dir(), {});
  // Let it fail a registration first: a fixed sleep was shorter than a sanitized plugin's start on
  // a busy machine, and the kubelet was back before the plugin first tried.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (p.Log().find("registering nvidia.com/gpu with kubelet at") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_NE(p.Log().find("registering nvidia.com/gpu with kubelet at"), std::string::npos) << p.Log();
  kubelet_ = std::make_unique<FakeKubelet>(sim_->dir());
  ASSERT_TRUE(kubelet_->Start().ok());
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 4, 4)) << p.Log();
}

TEST_F(DevicePluginTest, BrokenConfigDoesNotStart) {
  Init("l4x4");
  const std::string config =
      WriteConfig("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 1\n");
  Plugin p(sim_->dir(), {"--config-file", config});
  EXPECT_EQ(p.Wait(10s), 1);
  EXPECT_NE(p.Log().find("config.yaml:6:17: sharing.timeSlicing.resources[0].replicas must be an integer from 2 to "
                         "1024 (got 1, out of range)"),
            std::string::npos)
      << p.Log();
  EXPECT_FALSE(std::filesystem::exists(sim_->dir() + "/nvidia-gpu.sock"));
}

TEST_F(DevicePluginTest, SighupReloadsAndKeepsRunningOnABadConfig) {
  Init("l4x4");
  const std::string config = WriteConfig("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n");
  Plugin p(sim_->dir(), {"--config-file", config});
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 16, 16)) << p.Log();
  WriteConfig("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n");
  p.Signal(SIGHUP);
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 8, 8)) << p.Log();
  WriteConfig("sharing: [broken\n");
  p.Signal(SIGHUP);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(p.Wait(0ms), -1);  // still running
  EXPECT_NE(p.Log().find("reload refused, keeping the running configuration"), std::string::npos) << p.Log();
  // A config that parses but cannot be planned is refused too, without touching the servers.
  const int registrations = kubelet_->Get("nvidia.com/gpu")->registrations;
  WriteConfig("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2, devices: [9]}\n");
  p.Signal(SIGHUP);
  std::this_thread::sleep_for(500ms);
  EXPECT_NE(p.Log().find("no device '9'"), std::string::npos) << p.Log();
  EXPECT_EQ(kubelet_->Get("nvidia.com/gpu")->registrations, registrations);
  EXPECT_TRUE(kubelet_->Get("nvidia.com/gpu")->connected);
  auto r = kubelet_->Allocate("nvidia.com/gpu", {Ids("nvidia.com/gpu")[0]});
  EXPECT_TRUE(r.ok()) << r.status();
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// `kgpu node`: the device plugin and the exporter in one process, on one NVML session.
TEST_F(DevicePluginTest, NodeServesKubeletAndMetrics) {
  Init("dgx-h100");
  const int port = FreePort();
  const std::string config = WriteConfig("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n");
  Plugin node(sim_->dir(), {"--config-file", config, "-a", "127.0.0.1:" + std::to_string(port), "-c", "200"}, {},
              "node");
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 16, 16)) << node.Log();
  httplib::Client http("127.0.0.1", port);
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res) << node.Log();
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"7\""), std::string::npos);
  // One NVML session serves both: an XID reaches kubelet (health) and the metrics (XID counter).
  ASSERT_EQ(sim_->Ctl("xid 5 48"), 0);
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 16, 14)) << node.Log();
  bool counted = false;
  for (int i = 0; i < 50 && !counted; ++i) {
    auto r = http.Get("/metrics");
    counted = r && r->body.find("DCGM_EXP_XID_ERRORS_TOTAL{gpu=\"5\"") != std::string::npos;
    if (!counted) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(counted);
  node.Signal(SIGTERM);
  EXPECT_EQ(node.Wait(5s), 0) << node.Log();
}

// `kgpu node` reloads the device plugin's configuration on SIGHUP, as `kgpu device-plugin` does
// (it used to exit), and keeps its exporter serving.
TEST_F(DevicePluginTest, NodeReloadsOnSighup) {
  Init("dgx-h100");
  const int port = FreePort();
  const std::string config = WriteConfig("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n");
  Plugin node(sim_->dir(), {"--config-file", config, "-a", "127.0.0.1:" + std::to_string(port), "-c", "200"}, {},
              "node");
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 16, 16)) << node.Log();
  WriteConfig("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n");
  node.Signal(SIGHUP);
  ASSERT_TRUE(WaitDevices("nvidia.com/gpu", 32, 32)) << node.Log();
  EXPECT_EQ(node.Wait(0ms), -1) << node.Log();
  httplib::Client http("127.0.0.1", port);
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res) << node.Log();
  EXPECT_EQ(res->status, 200);
  node.Signal(SIGTERM);
  EXPECT_EQ(node.Wait(5s), 0) << node.Log();
  EXPECT_FALSE(std::filesystem::exists(sim_->dir() + "/nvidia-gpu.sock"));
}

// failOnInitError=false without NVML: SIGHUP reloads (and tries NVML again) instead of exiting.
TEST_F(DevicePluginTest, NoNvmlSighupReloadsInsteadOfExiting) {
  Init("l4x4");
  Plugin p(sim_->dir(), {"--fail-on-init-error=false"}, {"KGPU_NVML_LIBRARY=" + sim_->dir() + "/no-such-libnvml.so"});
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (p.Log().find("failOnInitError=false") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(p.Log().find("failOnInitError=false"), std::string::npos) << p.Log();
  p.Signal(SIGHUP);
  const auto reloaded = std::chrono::steady_clock::now() + 10s;
  while (p.Log().find("SIGHUP: reloading") == std::string::npos && std::chrono::steady_clock::now() < reloaded) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_NE(p.Log().find("SIGHUP: reloading"), std::string::npos) << p.Log();
  EXPECT_EQ(p.Wait(300ms), -1) << "exited on SIGHUP: " << p.Log();
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(5s), 0) << p.Log();
}

}  // namespace
}  // namespace kgpu
