// MIG and MPS end to end, as real processes: `kgpu device-plugin` against the kubelet stand-in on
// the simulated 8× A100 node with MIG (GPU 0: 3g.20gb + 2g.10gb + 2× 1g.5gb, GPU 1: 7× 1g.5gb),
// `kgpu mig apply` against a PodResources stand-in, and MPS with the fake nvidia-cuda-mps-control.

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/statfs.h>

#include "absl/strings/escaping.h"
#include "testing/fake_kubelet.h"
#include "testing/fake_podresources.h"
#include "testing/kubelet_checkpoint.h"
#include "testing/plugin_fixture.h"
#include "testing/plugin_process.h"
#include "testing/shell.h"
#include "testing/sim_node.h"

namespace kgpu {
namespace {

using namespace std::chrono_literals;
using testing::FakeKubelet;
using testing::Plugin;
using testing::ResourceState;
using testing::Shell;
using testing::SimNode;

constexpr char kLayouts[] = R"(
mig:
  rescanInterval: 100ms
  layouts:
    gpu1-split:
      - devices: [1]
        mig-devices: {"2g.10gb": 3, "1g.5gb": 1}
    no-2g:
      - devices: [0]
        mig-devices: {"3g.20gb": 2}
      - devices: [1]
        mig-devices: {"1g.5gb": 7}
  nodes:
    "*": gpu1-split
)";

// The mixed strategy's resources on dgx-a100-mig as the profile sets it up.
const std::map<std::string, size_t> kProfileMixed = {
    {"nvidia.com/gpu", 6}, {"nvidia.com/mig-1g.5gb", 9}, {"nvidia.com/mig-2g.10gb", 1}, {"nvidia.com/mig-3g.20gb", 1}};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class MigMpsTest : public testing::PluginNodeTest {
 protected:
  // The resources kubelet sees, name → device count (connected plugins only).
  std::map<std::string, size_t> Counts() {
    std::map<std::string, size_t> out;
    for (const auto& name : kubelet_->Resources()) {
      auto s = kubelet_->Get(name);
      if (s && s->connected) out[name] = s->devices.size();
    }
    return out;
  }
  bool WaitCounts(const std::map<std::string, size_t>& want, std::chrono::milliseconds t = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + t;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Counts() == want) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
  std::string Kgpu(const std::string& args) {
    return "LD_LIBRARY_PATH=" + testing::LibDir() + " KGPU_MIG_LOCK_FILE=" + sim_->dir() +
           "/mig.lock KGPU_KUBELET_DIR=" + sim_->dir() + " " + KGPU_BIN + " " + args;
  }
  nlohmann::json Devices() { return nlohmann::json::parse(Shell(Kgpu("devices --json")).out); }
  std::string MigUuid(unsigned gpu, unsigned gi) {
    const nlohmann::json devices = Devices();
    for (const auto& m : devices["gpus"][gpu]["migDevices"]) {
      if (m["gpuInstanceId"] == gi) return m["uuid"];
    }
    ADD_FAILURE() << "no GI " << gi << " on GPU " << gpu;
    return "";
  }
};

std::string Describe(const std::map<std::string, size_t>& m) {
  std::string s;
  for (const auto& [k, v] : m) s += k + "=" + std::to_string(v) + " ";
  return s;
}

TEST_F(MigMpsTest, EachStrategyAdvertisesNvidiasNames) {
  Init("dgx-a100-mig");
  {
    Plugin p(sim_->dir(), {"--mig-strategy", "none"});
    ASSERT_TRUE(WaitCounts({{"nvidia.com/gpu", 8}})) << Describe(Counts()) << p.Log();
  }
  kubelet_->Stop();
  kubelet_ = std::make_unique<FakeKubelet>(sim_->dir());
  ASSERT_TRUE(kubelet_->Start().ok());
  {
    Plugin p(sim_->dir(), {"--mig-strategy", "mixed"});
    ASSERT_TRUE(WaitCounts(kProfileMixed)) << Describe(Counts()) << p.Log();
  }
  {
    // single on a node that mixes MIG and non-MIG GPUs: NVIDIA's error, and no start.
    Plugin p(sim_->dir(), {"--mig-strategy", "single"});
    EXPECT_EQ(p.Wait(10s), 1) << p.Log();
    EXPECT_NE(p.Log().find("all devices on the node must be configured with the same migEnabled value"),
              std::string::npos)
        << p.Log();
  }
  // Every GPU 7× 1g.5gb: single advertises the 56 MIG devices as nvidia.com/gpu.
  const std::string cfg = WriteConfig(
      "version: v1\nmig:\n  layouts:\n    all:\n      - devices: all\n"
      "        mig-devices: {\"1g.5gb\": 7}\n");
  auto applied = Shell(Kgpu("mig apply --no-kubelet-check --layout all --config-file " + cfg));
  ASSERT_EQ(applied.code, 0) << applied.out;
  kubelet_->Stop();
  kubelet_ = std::make_unique<FakeKubelet>(sim_->dir());
  ASSERT_TRUE(kubelet_->Start().ok());
  Plugin p(sim_->dir(), {"--mig-strategy", "single"});
  ASSERT_TRUE(WaitCounts({{"nvidia.com/gpu", 56}})) << Describe(Counts()) << p.Log();
}

TEST_F(MigMpsTest, XidOnAMigInstanceMarksOnlyThatInstance) {
  Init("dgx-a100-mig");
  Plugin p(sim_->dir(), {"--mig-strategy", "mixed"});
  ASSERT_TRUE(WaitCounts(kProfileMixed)) << p.Log();
  const std::string gi3 = MigUuid(0, 3);  // GPU 0's first 1g.5gb instance
  ASSERT_EQ(sim_->Ctl("xid 0 48 --gi 3 --ci 0"), 0);
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/mig-1g.5gb", [](const ResourceState& s) { return s.Healthy() == 8; }, 10s))
      << p.Log();
  const auto mig1g = kubelet_->Get("nvidia.com/mig-1g.5gb");
  for (const auto& d : mig1g->devices) {
    EXPECT_EQ(d.health == "Healthy", d.id != gi3) << d.id;
  }
  EXPECT_EQ(kubelet_->Get("nvidia.com/mig-3g.20gb")->Healthy(), 1);
  // A whole-GPU XID on GPU 0 marks all of its instances.
  ASSERT_EQ(sim_->Ctl("xid 0 79"), 0);
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/mig-3g.20gb", [](const ResourceState& s) { return s.Healthy() == 0; }, 10s))
      << p.Log();
  // Each resource has its own stream: wait for each update.
  EXPECT_TRUE(kubelet_->WaitFor(
      "nvidia.com/mig-2g.10gb", [](const ResourceState& s) { return s.Healthy() == 0; }, 10s));
  EXPECT_TRUE(kubelet_->WaitFor(
      "nvidia.com/mig-1g.5gb", [](const ResourceState& s) { return s.Healthy() == 7; }, 10s))
      << "GPU 1's seven stay Healthy, GPU 0's two do not";
}

// With a one-hour rescan timer only NVML's MIG configuration-change event can make the plugin follow.
TEST_F(MigMpsTest, MigApplyOnIdleGpusReRegistersAndRetiresVanishedResources) {
  Init("dgx-a100-mig");
  testing::FakePodResources pods(sim_->dir() + "/pod-resources.sock");
  ASSERT_TRUE(pods.Start().ok());
  std::string layouts = kLayouts;
  layouts.replace(layouts.find("100ms"), 5, "1h");
  const std::string cfg = WriteConfig("version: v1\nflags:\n  migStrategy: mixed\n" + layouts);
  Plugin p(sim_->dir(), {"--config-file", cfg});
  ASSERT_TRUE(WaitCounts(kProfileMixed)) << p.Log();
  const std::string apply = "mig apply --config-file " + cfg + " --pod-resources-socket " + pods.SocketPath();
  // The node's layout (mig.nodes "*"): GPU 1 from 7× 1g.5gb to 3× 2g.10gb + 1g.5gb.
  auto r = Shell(Kgpu(apply));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("GPU 1: 7x 1g.5gb -> 1g.5gb + 3x 2g.10gb"), std::string::npos) << r.out;
  ASSERT_TRUE(WaitCounts({{"nvidia.com/gpu", 6},
                          {"nvidia.com/mig-1g.5gb", 3},
                          {"nvidia.com/mig-2g.10gb", 4},
                          {"nvidia.com/mig-3g.20gb", 1}}))
      << Describe(Counts()) << p.Log();
  EXPECT_GE(pods.ListCalls(), 1);
  // While it changed, GPU 1 was marked and its devices reported Unhealthy; the marker is gone.
  EXPECT_NE(p.Log().find("is being re-partitioned (kgpu mig apply)"), std::string::npos) << p.Log();
  for (const auto& e : std::filesystem::directory_iterator(sim_->dir())) {
    EXPECT_EQ(e.path().filename().string().rfind(".kgpu-mig-drain-", 0), std::string::npos) << e.path();
  }
  // Again: nothing to do.
  r = Shell(Kgpu(apply));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("GPU 1: already"), std::string::npos) << r.out;
  // A layout without any 2g.10gb: the resource stays registered with zero devices.
  r = Shell(Kgpu(apply + " --layout no-2g"));
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(WaitCounts({{"nvidia.com/gpu", 6},
                          {"nvidia.com/mig-1g.5gb", 7},
                          {"nvidia.com/mig-2g.10gb", 0},
                          {"nvidia.com/mig-3g.20gb", 2}}))
      << Describe(Counts()) << p.Log();
  auto refused = kubelet_->Allocate("nvidia.com/mig-2g.10gb", {"MIG-gone"});
  EXPECT_FALSE(refused.ok());
  auto doctor = Shell(Kgpu("doctor --kubelet-dir " + sim_->dir()));
  EXPECT_NE(doctor.out.find("[WARN] Zero-device resources  nvidia.com/mig-2g.10gb advertised with 0 devices"),
            std::string::npos)
      << doctor.out;
  // A plugin restart still reports it with zero devices: kubelet's checkpoint remembers it.
  std::ofstream(sim_->dir() + "/kubelet_internal_checkpoint") << kgpu::testing::SignedCheckpoint(
      R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/mig-2g.10gb":[],"nvidia.com/mig-1g.5gb":[]}}})");
  p.Signal(SIGTERM);
  ASSERT_EQ(p.Wait(10s), 0) << p.Log();
  Plugin again(sim_->dir(), {"--config-file", cfg});
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/mig-2g.10gb", [](const ResourceState& s) { return s.connected && s.devices.empty(); }, 10s))
      << again.Log();
  EXPECT_NE(again.Log().find("serving nvidia.com/mig-2g.10gb with zero devices"), std::string::npos) << again.Log();
}

// A drain marker (what kgpu mig apply writes while it changes a GPU) makes the plugin report that
// GPU's devices Unhealthy at once, and doctor names a marker left behind.
TEST_F(MigMpsTest, DrainMarkerMakesTheGpuUnhealthyUntilRemoved) {
  Init("dgx-a100-mig");
  Plugin p(sim_->dir(), {"--mig-strategy", "mixed"});
  ASSERT_TRUE(WaitCounts(kProfileMixed)) << p.Log();
  const std::string uuid = Devices()["gpus"][2]["uuid"];  // a whole GPU
  const std::string marker = sim_->dir() + "/.kgpu-mig-drain-" + uuid;
  std::ofstream(marker).put('\n');
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/gpu", [](const ResourceState& s) { return s.Healthy() == 5; }, 10s))
      << p.Log();
  const auto gpus = kubelet_->Get("nvidia.com/gpu");
  for (const auto& d : gpus->devices) EXPECT_EQ(d.health == "Healthy", d.id != uuid);
  auto doctor = Shell(Kgpu("doctor --kubelet-dir " + sim_->dir()));
  EXPECT_NE(doctor.out.find("[WARN] MIG re-partitioning"), std::string::npos) << doctor.out;
  std::filesystem::remove(marker);
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/gpu", [](const ResourceState& s) { return s.Healthy() == 6; }, 10s))
      << p.Log();
}

// Without health events (health checks off: no NVML event set), the rescan timer finds the change.
TEST_F(MigMpsTest, RescanTimerFollowsWithoutEvents) {
  Init("dgx-a100-mig");
  const std::string cfg =
      WriteConfig("version: v1\nflags:\n  migStrategy: mixed\nhealth:\n  disabled: true\n" + std::string(kLayouts));
  Plugin p(sim_->dir(), {"--config-file", cfg});
  ASSERT_TRUE(WaitCounts(kProfileMixed)) << p.Log();
  auto r = Shell(Kgpu("mig apply --no-kubelet-check --config-file " + cfg));
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(WaitCounts({{"nvidia.com/gpu", 6},
                          {"nvidia.com/mig-1g.5gb", 3},
                          {"nvidia.com/mig-2g.10gb", 4},
                          {"nvidia.com/mig-3g.20gb", 1}}))
      << Describe(Counts()) << p.Log();
}

TEST_F(MigMpsTest, MigApplyRefusesABusyGpuAndChangesNothing) {
  Init("dgx-a100-mig");
  testing::FakePodResources pods(sim_->dir() + "/pod-resources.sock");
  ASSERT_TRUE(pods.Start().ok());
  const std::string cfg = WriteConfig("version: v1\nflags:\n  migStrategy: mixed\n" + std::string(kLayouts));
  const std::string gi3 = MigUuid(0, 3);
  v1::ListPodResourcesResponse list;
  testing::AddDevices(list, "ml", "train-0", "main", "nvidia.com/mig-1g.5gb", {gi3});
  pods.SetListResponse(list);
  const std::string apply = "mig apply --config-file " + cfg + " --pod-resources-socket " + pods.SocketPath();
  const std::string before = Shell(Kgpu("devices --json")).out;
  auto r = Shell(Kgpu(apply + " --layout no-2g"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("GPU 0 is busy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pod ml/train-0 container main holds " + gi3 + " (nvidia.com/mig-1g.5gb, MIG 1g.5gb (GI 3))"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("nothing was changed"), std::string::npos) << r.out;
  for (const auto& e : std::filesystem::directory_iterator(sim_->dir())) {  // markers removed on refusal too
    EXPECT_EQ(e.path().filename().string().rfind(".kgpu-mig-drain-", 0), std::string::npos) << e.path();
  }
  EXPECT_EQ(Shell(Kgpu("devices --json")).out, before);  // GPU 1 (idle) was not changed either
  // A process outside Kubernetes also makes a GPU busy.
  pods.SetListResponse({});
  ASSERT_EQ(sim_->Ctl("proc add 1 4242 --mem 1024 --gi 5 --ci 0"), 0) << "simctl proc syntax";
  r = Shell(Kgpu(apply));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("process 4242"), std::string::npos) << r.out;
  ASSERT_EQ(sim_->Ctl("proc rm 1 4242"), 0);
  // kubelet unreachable: refused, not guessed.
  pods.Stop();
  r = Shell(Kgpu(apply));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("cannot tell which pods hold GPUs"), std::string::npos) << r.out;
  // Only the idle GPU, with kubelet back and the pod still on GPU 0: GPU 1 changes.
  testing::FakePodResources pods2(sim_->dir() + "/pod-resources.sock");
  ASSERT_TRUE(pods2.Start().ok());
  pods2.SetListResponse(list);
  r = Shell(Kgpu(apply + " --gpu 1"));
  EXPECT_EQ(r.code, 0) << r.out;
}

// Time-slicing with memoryIsolation hard: each replica container gets an accounting directory
// (<--cuda-shared-root>/timeslicing/<id>) in its Allocate response. The plugin removes the ones no
// container in kubelet's checkpoint mounts any more (every --cuda-accounting-sweep, once
// older than two minutes), and keeps those that kubelet still replays.
TEST_F(MigMpsTest, TimeSlicingHardDirectoriesGoWhenKubeletForgetsTheirContainer) {
  namespace fs = std::filesystem;
  Init("dgx-h100");
  const std::string config = WriteConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    memoryIsolation: hard\n    resources:\n    - {name: gpu, replicas: "
      "4}\n");
  const std::string root = sim_->dir() + "/cuda";
  Plugin p(sim_->dir(), {"--config-file", config, "--cuda-interposer", KGPU_CUDA_INTERPOSER, "--cuda-shared-root", root,
                         "--cuda-accounting-sweep", "1s"});
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/gpu", [](const ResourceState& s) { return s.connected && s.Healthy() == 32; }, 20s))
      << p.Log();
  const auto ids = kubelet_->Get("nvidia.com/gpu")->HealthyIds();
  std::vector<std::string> dirs, resp;
  for (size_t i = 0; i < 2; ++i) {
    auto a = kubelet_->Allocate("nvidia.com/gpu", {ids[i]});
    ASSERT_TRUE(a.ok()) << a.status() << p.Log();
    const auto& c = a->container_responses(0);
    std::string dir;
    for (const auto& m : c.mounts()) {
      if (m.container_path() == "/run/kgpu-cuda") dir = m.host_path();
    }
    ASSERT_EQ(fs::path(dir).parent_path(), fs::path(root + "/timeslicing")) << c.DebugString();
    ASSERT_TRUE(fs::is_directory(dir));
    fs::last_write_time(dir, fs::file_time_type::clock::now() - std::chrono::hours(1));  // past the grace period
    dirs.push_back(dir);
    resp.push_back(absl::Base64Escape(c.SerializeAsString()));
  }
  // kubelet keeps the first container (its pod runs); the second one's pod is gone.
  const nlohmann::json entry = {{"PodUID", "0f5a-runs"},
                                {"ContainerName", "main"},
                                {"ResourceName", "nvidia.com/gpu"},
                                {"DeviceIDs", {{"-1", {ids[0]}}}},
                                {"AllocResp", resp[0]}};
  std::ofstream(sim_->dir() + "/kubelet_internal_checkpoint") << testing::SignedCheckpoint(nlohmann::json{
      {"Data",
       {{"PodDeviceEntries", {entry}}, {"RegisteredDevices", {{"nvidia.com/gpu", ids}}}}}}.dump());
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (fs::exists(dirs[1]) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(fs::exists(dirs[1])) << p.Log();
  EXPECT_TRUE(fs::is_directory(dirs[0])) << p.Log();
  EXPECT_NE(p.Log().find("removed the accounting directory " + dirs[1] + ": no container kubelet keeps mounts it"),
            std::string::npos)
      << p.Log();
}

// MPS with the fake control daemon: the daemon's layout and commands, then Allocate of 1 and 3
// replicas field by field.
class MpsTest : public MigMpsTest {
 protected:
  // A plugin killed with SIGKILL leaves its daemon running (as on a node, where the next plugin
  // reuses it); the test stops it.
  void TearDown() override {
    if (!sim_) return;
    const std::string pid = ReadAll(Root() + "/nvidia.com/gpu/pipe/nvidia-cuda-mps-control.pid");
    if (!pid.empty()) ::kill(std::stoi(pid), SIGTERM);
  }
  std::string Control() { return std::string(KGPU_FAKE_MPS_DIR) + "/nvidia-cuda-mps-control"; }
  std::string Root() { return sim_->dir() + "/mps"; }
  std::string ConfigWith(const std::string& fail) {
    return WriteConfig("version: v1\nflags:\n  mpsRoot: " + Root() + "\nsharing:\n  mps:\n" + fail +
                       "    resources:\n    - {name: gpu, replicas: 4}\n");
  }
  uint64_t MemoryMib() { return Devices()["gpus"][0]["memoryMiB"]; }
};

TEST_F(MpsTest, OneReplicaPerContainerByDefault) {
  Init("dgx-h100");
  Plugin p(sim_->dir(), {"--config-file", ConfigWith(""), "--mps-control", Control()});
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/gpu", [](const ResourceState& s) { return s.connected && s.Healthy() == 32; }, 15s))
      << p.Log();
  const std::string dir = Root() + "/nvidia.com/gpu";
  EXPECT_TRUE(std::filesystem::exists(dir + "/.started"));
  EXPECT_TRUE(std::filesystem::exists(Root() + "/.ready"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/pipe/control"));
  const uint64_t mib = MemoryMib();
  const std::string log = ReadAll(dir + "/log/control.log");
  for (int i = 0; i < 8; ++i) {
    EXPECT_NE(
        log.find("CMD set_default_device_pinned_mem_limit " + std::to_string(i) + " " + std::to_string(mib / 4) + "M"),
        std::string::npos)
        << log;
  }
  EXPECT_NE(log.find("CMD set_default_active_thread_percentage 25"), std::string::npos) << log;
  EXPECT_NE(log.find("CMD get_default_active_thread_percentage"), std::string::npos) << log;  // readiness probe
  // Every GPU of the resource in EXCLUSIVE_PROCESS (NVML compute mode 3) while MPS runs.
  auto compute_modes = [&] {
    std::set<int> modes;
    const auto show = nlohmann::json::parse(Shell(std::string(KGPU_SIMCTL) + " show").out);
    for (const auto& g : show["gpus"]) modes.insert(g["compute_mode"].get<int>());
    return modes;
  };
  EXPECT_EQ(compute_modes(), std::set<int>{3});

  const auto ids = kubelet_->Get("nvidia.com/gpu")->devices;
  auto a = kubelet_->Allocate("nvidia.com/gpu", {ids[5].id});
  ASSERT_TRUE(a.ok()) << a.status();
  const auto& c = a->container_responses(0);
  const std::string uuid = ids[5].id.substr(0, ids[5].id.find("::"));
  std::map<std::string, std::string> envs(c.envs().begin(), c.envs().end());
  EXPECT_EQ(envs, (std::map<std::string, std::string>{
                      {"CUDA_MPS_PIPE_DIRECTORY", "/mps/nvidia.com/gpu/pipe"},
                      {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=" + std::to_string(mib / 4) + "M"},
                      {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"},
                      {"NVIDIA_VISIBLE_DEVICES", uuid}}));
  ASSERT_EQ(c.mounts_size(), 2);
  EXPECT_EQ(c.mounts(0).container_path(), "/mps/nvidia.com/gpu/pipe");
  EXPECT_EQ(c.mounts(0).host_path(), dir + "/pipe");
  EXPECT_EQ(c.mounts(1).container_path(), "/dev/shm");
  EXPECT_EQ(c.mounts(1).host_path(), Root() + "/shm");
  auto three = kubelet_->Allocate("nvidia.com/gpu", {ids[0].id, ids[1].id, ids[2].id});
  EXPECT_FALSE(three.ok());
  auto doctor =
      Shell(Kgpu("doctor --kubelet-dir " + sim_->dir() + " --mps-root " + Root() + " --mps-control " + Control()));
  EXPECT_NE(doctor.out.find("[PASS] MPS daemons            ready: nvidia.com/gpu (25.0% threads per client)"),
            std::string::npos)
      << doctor.out;
  EXPECT_NE(doctor.out.find("[PASS] Device plugin          advertising nvidia.com/gpu=32"), std::string::npos)
      << doctor.out;
  // The test's mpsRoot is on /tmp, which is usually not a tmpfs here: then doctor says so.
  struct statfs fs {};
  if (::statfs((Root() + "/shm").c_str(), &fs) == 0 && static_cast<unsigned long>(fs.f_type) != 0x01021994UL) {
    EXPECT_NE(doctor.out.find("[WARN] MPS shared memory"), std::string::npos) << doctor.out;
  }

  // The daemon dies: its devices go Unhealthy, the plugin restarts it, they come back.
  const std::string pid = ReadAll(dir + "/pipe/nvidia-cuda-mps-control.pid");
  ASSERT_FALSE(pid.empty());
  ::kill(std::stoi(pid), SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (p.Log().find("MPS daemon of nvidia.com/gpu stopped answering") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_NE(p.Log().find("restarting it"), std::string::npos) << p.Log();
  // A new daemon (new pid file), and the devices Healthy again once it answers.
  while ((ReadAll(dir + "/pipe/nvidia-cuda-mps-control.pid") == pid ||
          p.Log().find("MPS daemon of nvidia.com/gpu is ready") == std::string::npos) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NE(ReadAll(dir + "/pipe/nvidia-cuda-mps-control.pid"), pid);
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/gpu", [](const ResourceState& s) { return s.Healthy() == 32; }, 20s))
      << p.Log();

  p.Signal(SIGTERM);
  ASSERT_EQ(p.Wait(10s), 0) << p.Log();
  EXPECT_NE(ReadAll(dir + "/log/control.log").find("CMD quit"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir + "/.started"));
  EXPECT_FALSE(std::filesystem::exists(Root() + "/.ready"));
  EXPECT_EQ(compute_modes(), std::set<int>{0});  // back to DEFAULT
}

TEST_F(MpsTest, ThreeReplicasAreThreeSharesOfOneGpu) {
  Init("dgx-h100");
  Plugin p(sim_->dir(),
           {"--config-file", ConfigWith("    failRequestsGreaterThanOne: false\n"), "--mps-control", Control()});
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/gpu", [](const ResourceState& s) { return s.connected && s.Healthy() == 32; }, 15s))
      << p.Log();
  const uint64_t mib = MemoryMib();
  const std::string log = ReadAll(Root() + "/nvidia.com/gpu/log/control.log");
  EXPECT_NE(log.find("CMD set_default_device_pinned_mem_limit 0 " + std::to_string(mib) + "M"), std::string::npos)
      << log;
  EXPECT_NE(log.find("CMD set_default_active_thread_percentage 100"), std::string::npos) << log;
  // kubelet's admission: GetPreferredAllocation for 3 among all, then Allocate.
  std::vector<std::string> all;
  const auto state = kubelet_->Get("nvidia.com/gpu");
  for (const auto& d : state->devices) all.push_back(d.id);
  auto preferred = kubelet_->GetPreferredAllocation("nvidia.com/gpu", all, {}, 3);
  ASSERT_TRUE(preferred.ok()) << preferred.status();
  ASSERT_EQ(preferred->size(), 3u);
  std::set<std::string> gpus;
  for (const auto& id : *preferred) gpus.insert(id.substr(0, id.find("::")));
  ASSERT_EQ(gpus.size(), 1u) << "all three replicas on one GPU";
  auto a = kubelet_->Allocate("nvidia.com/gpu", *preferred);
  ASSERT_TRUE(a.ok()) << a.status();
  const auto& c = a->container_responses(0);
  std::map<std::string, std::string> envs(c.envs().begin(), c.envs().end());
  EXPECT_EQ(envs, (std::map<std::string, std::string>{
                      {"CUDA_MPS_PIPE_DIRECTORY", "/mps/nvidia.com/gpu/pipe"},
                      {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=" + std::to_string(mib * 3 / 4) + "M"},
                      {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "75"},
                      {"NVIDIA_VISIBLE_DEVICES", *gpus.begin()}}));
  EXPECT_EQ(c.mounts_size(), 2);
}

TEST_F(MpsTest, DaemonThatCannotStartKeepsDevicesUnhealthy) {
  Init("dgx-h100");
  Plugin p(sim_->dir(), {"--config-file", ConfigWith(""), "--mps-control", Control()}, {"KGPU_FAKE_MPS_FAIL=1"});
  ASSERT_TRUE(kubelet_->WaitFor(
      "nvidia.com/gpu", [](const ResourceState& s) { return s.connected && s.devices.size() == 32; }, 15s))
      << p.Log();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(kubelet_->Get("nvidia.com/gpu")->Healthy(), 0);
  EXPECT_NE(p.Log().find("fake: start refused"), std::string::npos) << p.Log();
  EXPECT_FALSE(std::filesystem::exists(Root() + "/.ready"));
}

}  // namespace
}  // namespace kgpu
