#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "testing/sim_node.h"

namespace kgpu::cli {
namespace {

using kgpu::testing::SimNode;

const Check* Find(const std::vector<Check>& checks, const std::string& name) {
  for (const auto& c : checks) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

TEST(DoctorTest, MissingLibraryFailsWithFix) {
  NodeOptions o;
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  std::ostringstream out;
  EXPECT_EQ(RunDoctor(o, false, out), 1);
  EXPECT_NE(out.str().find("[FAIL] NVML library"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("fix: install the NVIDIA driver"), std::string::npos);
}

TEST(DoctorTest, SimulatedNodeWithoutDeviceNodes) {
  SimNode node("dgx-h100");
  NodeOptions o;
  o.nvml_library = SimNode::LibraryPath();
  o.dev_root = node.dir() + "/dev";
  const auto checks = DoctorChecks(o);
  ASSERT_NE(Find(checks, "NVML library"), nullptr);
  EXPECT_EQ(Find(checks, "NVML library")->verdict, Verdict::kPass);
  EXPECT_EQ(Find(checks, "Driver version")->detail, "550.90.07 (CUDA 12.4)");
  EXPECT_EQ(Find(checks, "GPUs enumerable")->verdict, Verdict::kPass);
  EXPECT_EQ(Find(checks, "Device nodes")->verdict, Verdict::kFail);
  EXPECT_NE(Find(checks, "Device nodes")->detail.find("/dev/nvidiactl"), std::string::npos);
  EXPECT_EQ(Find(checks, "GPUs healthy")->verdict, Verdict::kPass);
}

TEST(DoctorTest, DeviceNodesThatAreNotDevicesWarn) {
  SimNode node("l4x4");
  const std::string dev = node.dir() + "/dev";
  std::filesystem::create_directories(dev);
  for (const char* n : {"nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3"}) {
    std::ofstream(dev + "/" + n) << "";
  }
  NodeOptions o;
  o.nvml_library = SimNode::LibraryPath();
  o.dev_root = dev;
  const auto checks = DoctorChecks(o);
  EXPECT_EQ(Find(checks, "Device nodes")->verdict, Verdict::kWarn);
  std::filesystem::remove_all(dev);
}

TEST(DoctorTest, LostGpuAndPendingMigFail) {
  SimNode node("dgx-a100-mig");
  ASSERT_EQ(node.Ctl("lose 4"), 0);
  NodeOptions o;
  o.nvml_library = SimNode::LibraryPath();
  auto checks = DoctorChecks(o);
  EXPECT_EQ(Find(checks, "GPUs healthy")->verdict, Verdict::kFail);
  EXPECT_NE(Find(checks, "GPUs healthy")->detail.find("GPU 4 is lost"), std::string::npos);
  ASSERT_EQ(node.Ctl("restore 4"), 0);
  ASSERT_EQ(node.Ctl("set 2 mig_pending=1"), 0);
  checks = DoctorChecks(o);
  EXPECT_EQ(Find(checks, "GPUs healthy")->verdict, Verdict::kWarn);
  EXPECT_NE(Find(checks, "GPUs healthy")->detail.find("pending a reset on GPU 2"), std::string::npos);
}

TEST(DoctorTest, JsonOutput) {
  SimNode node("l4x4");
  NodeOptions o;
  o.nvml_library = SimNode::LibraryPath();
  std::ostringstream out;
  RunDoctor(o, true, out);
  EXPECT_NE(out.str().find("\"check\": \"NVML library\""), std::string::npos) << out.str();
}

TEST(DevicesTest, TableAndJson) {
  SimNode node("dgx-a100-mig");
  NodeOptions o;
  o.nvml_library = SimNode::LibraryPath();
  std::ostringstream table, json;
  ASSERT_EQ(RunDevices(o, false, table), 0);
  EXPECT_NE(table.str().find("MIG 3g.20gb"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("NV12"), std::string::npos);
  ASSERT_EQ(RunDevices(o, true, json), 0);
  EXPECT_NE(json.str().find("\"profile\": \"1g.5gb\""), std::string::npos);
}

}  // namespace
}  // namespace kgpu::cli
