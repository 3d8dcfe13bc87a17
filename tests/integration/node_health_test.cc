// `kgpu doctor`, `kgpu health` and `kgpu devices` as real processes next to a running
// `kgpu device-plugin` (against the kubelet stand-in) on a simulated node: they show the health
// the plugin serves, and a hung GPU does not block them.

#include <chrono>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "testing/fake_kubelet.h"
#include "testing/net.h"
#include "testing/plugin_fixture.h"
#include "testing/plugin_process.h"
#include "testing/poll.h"
#include "testing/shell.h"

namespace kgpu {
namespace {

using namespace std::chrono_literals;
using testing::Plugin;
using testing::Quote;
using testing::ResourceState;
using testing::Shell;

class NodeHealthTest : public testing::PluginNodeTest {
 protected:
  bool WaitHealthy(int healthy) {
    return kubelet_->WaitFor(
        "nvidia.com/gpu",
        [&](const ResourceState& s) { return s.connected && s.devices.size() == 8 && s.Healthy() == healthy; }, 20s);
  }
  // `kgpu <args>` on the simulated node, against the plugin's kubelet directory.
  testing::CommandResult Kgpu(const std::string& args) {
    return Shell("LD_LIBRARY_PATH=" + Quote(testing::LibDir()) + " " + Quote(KGPU_BIN) + " " + args);
  }
  std::string Dir() const { return Quote(sim_->dir()); }
  std::string Uuid(unsigned index) {
    const auto r = Kgpu("devices --json");
    const std::string key = "\"index\": " + std::to_string(index) + ",";
    const auto at = r.out.find(key);
    if (at == std::string::npos) return "";
    const auto u = r.out.find("\"uuid\": \"", at);
    return r.out.substr(u + 9, r.out.find('"', u + 9) - u - 9);
  }
};

TEST_F(NodeHealthTest, DoctorAndHealthShowTheXidThePluginServes) {
  Init("dgx-h100");
  Plugin p(sim_->dir(), {});
  ASSERT_TRUE(WaitHealthy(8)) << p.Log();
  const std::string uuid4 = Uuid(4);
  ASSERT_EQ(uuid4.rfind("GPU-", 0), 0u) << uuid4;
  {
    const auto before = Kgpu("doctor --kubelet-dir " + Dir() + " --mps-root " + Dir() + "/mps");
    EXPECT_NE(before.out.find("[PASS] GPUs healthy"), std::string::npos) << before.out;
  }

  ASSERT_EQ(sim_->Ctl("xid 4 48"), 0);
  ASSERT_TRUE(WaitHealthy(7)) << p.Log();  // kubelet's ListAndWatch has GPU 4 Unhealthy
  ASSERT_EQ(kubelet_->Get("nvidia.com/gpu")->UnhealthyIds(), std::vector<std::string>{uuid4});

  // NVML reads GPU 4 fine now; the XID was an event only the plugin saw.
  const auto doctor = Kgpu("doctor --kubelet-dir " + Dir() + " --mps-root " + Dir() + "/mps");
  EXPECT_EQ(doctor.code, 1) << doctor.out;
  EXPECT_NE(doctor.out.find("[FAIL] GPUs healthy"), std::string::npos) << doctor.out;
  EXPECT_NE(doctor.out.find("GPU 4 is Unhealthy in the device plugin: XID 48"), std::string::npos) << doctor.out;
  EXPECT_NE(doctor.out.find("UUID " + uuid4), std::string::npos) << doctor.out;

  const auto health = Kgpu("--log-level warn health --duration 1 --kubelet-dir " + Dir());
  EXPECT_EQ(health.code, 0) << health.out;
  EXPECT_NE(health.out.find("device: " + uuid4 + " Unhealthy: XID 48"), std::string::npos) << health.out;
  EXPECT_EQ(health.out.find("device: " + uuid4 + " Healthy"), std::string::npos) << health.out;

  // Once the plugin is gone, its state is not trusted (the file is removed on SIGTERM anyway).
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(10s), 0) << p.Log();
  const auto after = Kgpu("doctor --kubelet-dir " + Dir() + " --mps-root " + Dir() + "/mps");
  EXPECT_EQ(after.out.find("Unhealthy in the device plugin"), std::string::npos) << after.out;
  EXPECT_EQ(after.out.find("This node can advertise nvidia.com/gpu."), std::string::npos) << after.out;
}

TEST_F(NodeHealthTest, HungGpuIsAFailWithinTheDeadline) {
  Init("dgx-h100");
  Plugin p(sim_->dir(), {});
  ASSERT_TRUE(WaitHealthy(8)) << p.Log();
  const std::string uuid3 = Uuid(3);
  ASSERT_EQ(uuid3.rfind("GPU-", 0), 0u) << uuid3;
  ASSERT_EQ(sim_->Ctl("hang 3 60000"), 0);  // every NVML call on GPU 3 blocks for 60 s

  auto t0 = std::chrono::steady_clock::now();
  const auto doctor = Kgpu("doctor --kubelet-dir " + Dir() + " --mps-root " + Dir() + "/mps");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "doctor waited for the hung call";
  EXPECT_EQ(doctor.code, 1) << doctor.out;
  EXPECT_NE(doctor.out.find("[FAIL] GPUs healthy"), std::string::npos) << doctor.out;
  EXPECT_NE(doctor.out.find("GPU 3 is hung: NVML did not answer within 2000 ms"), std::string::npos) << doctor.out;
  EXPECT_NE(doctor.out.find("UUID " + uuid3), std::string::npos) << doctor.out;

  t0 = std::chrono::steady_clock::now();
  const auto devices = Kgpu("devices --nvml-deadline 1s --kubelet-dir " + Dir());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "devices waited for the hung call";
  EXPECT_EQ(devices.code, 0) << devices.out;
  EXPECT_NE(devices.out.find(uuid3), std::string::npos) << devices.out;
  EXPECT_NE(devices.out.find("NVML did not answer within 1000 ms"), std::string::npos) << devices.out;
  ASSERT_EQ(sim_->Ctl("hang 3 0"), 0);
}

// `kgpu node` has one health source: the device plugin's monitor. An XID that makes kubelet see the
// GPU Unhealthy turns the same GPU's kgpu_gpu_up to 0 with its reason, counts in the XID families
// (one NVML event loop for both), and shows in `kgpu devices`, `kgpu health` and doctor.
TEST_F(NodeHealthTest, TheNodeAgentsMetricsDevicesAndDoctorAgreeWithKubelet) {
  Init("dgx-h100");
  const std::string port = std::to_string(testing::FreePort());
  Plugin p(sim_->dir(), {"-a", "127.0.0.1:" + port, "-c", "200"}, {"NODE_NAME=agree-node"}, "node");
  ASSERT_TRUE(WaitHealthy(8)) << p.Log();
  const std::string uuid2 = Uuid(2);
  ASSERT_EQ(uuid2.rfind("GPU-", 0), 0u) << uuid2;
  auto scrape = [&] { return Shell("curl -sf http://127.0.0.1:" + port + "/metrics").out; };
  const std::regex up2_is_1(R"(\nkgpu_gpu_up\{gpu="2",[^}]*\} 1\n)");
  ASSERT_TRUE(testing::WaitFor([&] { return std::regex_search(scrape(), up2_is_1); }, 20s)) << scrape();
  EXPECT_EQ(scrape().find("kgpu_gpu_unhealthy_reason{gpu=\"2\""), std::string::npos);

  ASSERT_EQ(sim_->Ctl("xid 2 119"), 0);
  ASSERT_TRUE(WaitHealthy(7)) << p.Log();
  ASSERT_EQ(kubelet_->Get("nvidia.com/gpu")->UnhealthyIds(), std::vector<std::string>{uuid2});

  const std::regex up2_is_0(R"(\nkgpu_gpu_up\{gpu="2",[^}]*\} 0\n)");
  const std::regex reason2(R"(\nkgpu_gpu_unhealthy_reason\{gpu="2",[^}]*reason="xid"\} 1\n)");
  const std::regex counted2(R"(\nDCGM_FI_DEV_XID_ERRORS\{gpu="2",[^}]*\} 119\n)");
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        const std::string m = scrape();
        return std::regex_search(m, up2_is_0) && std::regex_search(m, reason2) && std::regex_search(m, counted2);
      },
      20s))
      << scrape() << p.Log();
  // Only GPU 2: the seven others stay up.
  const std::string m = scrape();
  EXPECT_TRUE(std::regex_search(m, std::regex(R"(\nkgpu_gpu_up\{gpu="3",[^}]*\} 1\n)"))) << m;

  const auto devices = Kgpu("devices --kubelet-dir " + Dir());
  EXPECT_EQ(devices.code, 0) << devices.out;
  EXPECT_TRUE(std::regex_search(devices.out, std::regex(R"(\n2 +)" + uuid2 + R"( .* unhealthy\n)"))) << devices.out;
  EXPECT_NE(devices.out.find("unhealthy: XID 119"), std::string::npos) << devices.out;
  const auto json = Kgpu("devices --json --kubelet-dir " + Dir());
  EXPECT_NE(json.out.find("\"unhealthyReason\": \"XID 119\""), std::string::npos) << json.out;

  const auto doctor = Kgpu("doctor --kubelet-dir " + Dir() + " --mps-root " + Dir() + "/mps");
  EXPECT_EQ(doctor.code, 1) << doctor.out;
  EXPECT_NE(doctor.out.find("GPU 2 is Unhealthy in the device plugin: XID 119"), std::string::npos) << doctor.out;
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(10s), 0) << p.Log();
}

}  // namespace
}  // namespace kgpu
