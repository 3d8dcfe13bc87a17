#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "cli/commands.h"
#include "deviceplugin/health_file.h"
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
  o.dev_dir = node.dir() + "/dev";
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
  o.dev_dir = dev;
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

// The checks every run reports, whatever fails (cluster checks only with a kubeconfig).
const std::vector<std::string> kBaseChecks = {"NVML library", "Driver version", "GPUs enumerable", "Device nodes",
                                              "GPUs healthy", "Device plugin",  "MPS daemons"};

std::vector<std::string> Names(const std::vector<Check>& checks) {
  std::vector<std::string> names;
  for (const auto& c : checks) names.push_back(c.name);
  return names;
}

// <dir>/dev with the nodes a GPU node has (symlinks to /dev/null: character devices).
std::string FakeDevRoot(const std::string& dir, unsigned gpus) {
  const std::string dev = dir + "/dev";
  std::filesystem::create_directories(dev);
  std::vector<std::string> names = {"nvidiactl", "nvidia-uvm"};
  for (unsigned i = 0; i < gpus; ++i) names.push_back("nvidia" + std::to_string(i));
  for (const auto& n : names) std::filesystem::create_symlink("/dev/null", dev + "/" + n);
  return dev;
}

TEST(DoctorTest, EveryCheckRunsWithAndWithoutNvml) {
  SimNode node("l4x4");
  NodeOptions o;
  o.kubelet_dir = node.dir();
  o.mps_root = node.dir() + "/mps";
  o.nvml_library = SimNode::LibraryPath();
  const auto with = DoctorChecks(o);
  EXPECT_EQ(Names(with), kBaseChecks);
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  const auto without = DoctorChecks(o);
  EXPECT_EQ(Names(without), kBaseChecks);  // not 2 of 7
  EXPECT_EQ(without.size(), with.size());
  EXPECT_EQ(Find(without, "NVML library")->verdict, Verdict::kFail);
  EXPECT_NE(Find(without, "Driver version")->detail.find("not checked: NVML is not available"), std::string::npos);
  EXPECT_NE(Find(without, "Device nodes")->detail.find("per-GPU nodes (/dev/nvidiaN) not checked"), std::string::npos)
      << Find(without, "Device nodes")->detail;
  EXPECT_NE(Find(without, "GPUs healthy")->detail.find("not checked through NVML"), std::string::npos);
  EXPECT_EQ(Find(without, "Device plugin")->verdict, Verdict::kWarn);
  EXPECT_EQ(Find(without, "MPS daemons")->verdict, Verdict::kPass);
}

TEST(DoctorTest, OnlyWarningsButNoPluginIsNotAdvertising) {
  SimNode node("l4x4");
  NodeOptions o;
  o.nvml_library = SimNode::LibraryPath();
  o.dev_dir = FakeDevRoot(node.dir(), 4);
  o.kubelet_dir = node.dir();  // no plugin socket
  o.mps_root = node.dir() + "/mps";
  std::ostringstream out;
  EXPECT_EQ(RunDoctor(o, false, out), 0) << out.str();
  EXPECT_NE(out.str().find("[WARN] Device plugin"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("[FAIL]"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("This node can advertise nvidia.com/gpu."), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("no device plugin answers on this node"), std::string::npos) << out.str();
  std::filesystem::remove_all(o.dev_dir);
}

TEST(DoctorTest, HungGpuFailsWithinTheDeadlineNamingIndexAndUuid) {
  SimNode node("dgx-h100");
  NodeOptions o;
  o.nvml_library = SimNode::LibraryPath();
  o.kubelet_dir = node.dir();
  o.mps_root = node.dir() + "/mps";
  o.nvml_deadline = std::chrono::milliseconds(500);
  // The device plugin's state names GPU 3's UUID (NVML cannot while it hangs).
  std::string uuid3;
  {
    auto session = OpenSession(o);
    ASSERT_TRUE(session.ok()) << session.status();
    uuid3 = session->inventory->gpus()[3].uuid;
    std::vector<deviceplugin::ServedHealth> served;
    for (const auto& g : session->inventory->gpus())
      served.push_back({g.uuid, static_cast<int>(g.index), false, true, ""});
    ASSERT_TRUE(deviceplugin::WriteHealthFile(node.dir(), served).ok());
  }
  ASSERT_EQ(node.Ctl("hang 3 60000"), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto checks = DoctorChecks(o);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(30));  // not the 60 s of the hang
  const Check* healthy = Find(checks, "GPUs healthy");
  ASSERT_NE(healthy, nullptr);
  EXPECT_EQ(healthy->verdict, Verdict::kFail);
  EXPECT_NE(healthy->detail.find("GPU 3 is hung: NVML did not answer within 500 ms"), std::string::npos)
      << healthy->detail;
  EXPECT_NE(healthy->detail.find("UUID " + uuid3), std::string::npos) << healthy->detail;
  EXPECT_EQ(Find(checks, "GPUs enumerable")->verdict, Verdict::kPass);  // the other 7 were read

  std::ostringstream table;
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(RunDevices(o, false, table), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(30));
  EXPECT_NE(table.str().find(uuid3), std::string::npos) << table.str();
  EXPECT_NE(table.str().find(" hung\n"), std::string::npos) << table.str();
  deviceplugin::RemoveHealthFile(node.dir());
  o.kubelet_dir = node.dir() + "/none";
  const auto unnamed = DoctorChecks(o);
  EXPECT_NE(Find(unnamed, "GPUs healthy")->detail.find("GPU 3 is hung"), std::string::npos);
  EXPECT_NE(Find(unnamed, "GPUs healthy")->detail.find("UUID unknown (NVML did not answer"), std::string::npos)
      << Find(unnamed, "GPUs healthy")->detail;
  ASSERT_EQ(node.Ctl("hang 3 0"), 0);  // the threads left in the hung calls end now
}

TEST(HealthFileTest, RoundTripAndErrorsNameTheFile) {
  const std::vector<deviceplugin::ServedHealth> devices = {{"GPU-a", 0, false, true, ""},
                                                           {"MIG-b", 1, true, false, "XID 94 on MIG instance"}};
  auto back = deviceplugin::ParseHealthFile(deviceplugin::HealthFileJson(devices), "f");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, devices);
  for (const char* bad :
       {"", "[]", "{\"version\":2,\"devices\":[]}", "{\"version\":1}", "{\"version\":1,\"devices\":[{\"id\":\"x\"}]}",
        "{\"version\":1,\"devices\":[{\"id\":\"x\",\"healthy\":true,\"gpu\":99999}]}"}) {
    auto r = deviceplugin::ParseHealthFile(bad, "/k/.kgpu-health.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(std::string(r.status().message()).rfind("/k/.kgpu-health.json: ", 0), 0u) << r.status();
  }
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
