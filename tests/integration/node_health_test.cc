// `kgpu doctor`, `kgpu health` and `kgpu devices` as real processes next to a running
// `kgpu device-plugin` (against the kubelet stand-in) on a simulated node: they show the health
// the plugin serves, and a hung GPU does not block them.

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "testing/fake_kubelet.h"
#include "testing/plugin_fixture.h"
#include "testing/plugin_process.h"
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
    return kubelet_->WaitFor("nvidia.com/gpu", [&](const ResourceState& s) {
      return s.connected && s.devices.size() == 8 && s.Healthy() == healthy;
    }, 20s);
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
  const auto devices = Kgpu("devices --nvml-deadline-ms 1000 --kubelet-dir " + Dir());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "devices waited for the hung call";
  EXPECT_EQ(devices.code, 0) << devices.out;
  EXPECT_NE(devices.out.find(uuid3), std::string::npos) << devices.out;
  EXPECT_NE(devices.out.find("NVML did not answer within 1000 ms"), std::string::npos) << devices.out;
  ASSERT_EQ(sim_->Ctl("hang 3 0"), 0);
}

}  // namespace
}  // namespace kgpu
