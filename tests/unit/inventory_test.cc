#include "gpu/inventory.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "nvml/library.h"
#include "testing/sim_node.h"

namespace kgpu::gpu {
namespace {

using kgpu::testing::SimNode;

std::unique_ptr<nvml::Library> OpenSim() {
  auto lib = nvml::Library::Open({SimNode::LibraryPath()});
  EXPECT_TRUE(lib.ok()) << lib.status();
  return lib.ok() ? std::move(*lib) : nullptr;
}

TEST(MigNamingTest, MatchesNvidiaNames) {
  const uint64_t a100 = 40960ULL << 20, h100 = 81559ULL << 20, h200 = 143771ULL << 20;
  EXPECT_EQ(MigProfileName(1, 1, 4864, a100, 0), "1g.5gb");
  EXPECT_EQ(MigProfileName(1, 1, 4864, a100, 7), "1g.5gb+me");
  EXPECT_EQ(MigProfileName(1, 1, 9856, a100, 9), "1g.10gb");
  EXPECT_EQ(MigProfileName(3, 3, 19968, a100, 2), "3g.20gb");
  EXPECT_EQ(MigProfileName(3, 1, 19968, a100, 2), "1c.3g.20gb");
  EXPECT_EQ(MigProfileName(7, 7, 40192, a100, 4), "7g.40gb");
  EXPECT_EQ(MigProfileName(1, 1, 9984, h100, 0), "1g.10gb");
  EXPECT_EQ(MigProfileName(7, 7, 81408, h100, 4), "7g.80gb");
  EXPECT_EQ(MigProfileName(1, 1, 17920, h200, 0), "1g.18gb");
  EXPECT_EQ(MigProfileName(3, 3, 71808, h200, 2), "3g.71gb");
  EXPECT_EQ(MigProfileName(7, 7, 143616, h200, 4), "7g.141gb");
}

TEST(InventoryTest, DiscoversDgxH100) {
  SimNode node("dgx-h100");
  auto lib = OpenSim();
  ASSERT_NE(lib, nullptr);
  auto inv = Inventory::Discover(*lib, {node.dir()});
  ASSERT_TRUE(inv.ok()) << inv.status();
  const auto& gpus = (*inv)->gpus();
  ASSERT_EQ(gpus.size(), 8u);
  EXPECT_EQ((*inv)->driver_version(), "550.90.07");
  EXPECT_EQ((*inv)->cuda_version(), "12.4");
  for (const auto& g : gpus) {
    EXPECT_TRUE(g.error.empty()) << g.error;
    EXPECT_EQ(g.uuid.substr(0, 4), "GPU-");
    EXPECT_EQ(g.name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(g.memory_mib, 81559u);
    EXPECT_EQ(g.cc_major, 9);
    EXPECT_EQ(g.minor, g.index);
    EXPECT_EQ(g.power_limit_w, 700u);
    EXPECT_TRUE(g.mig_capable);
    EXPECT_FALSE(g.mig_enabled);
    EXPECT_EQ(g.numa_node, -1);  // no sysfs entries under the test's root
  }
  EXPECT_EQ(gpus[0].bus_id, "00000000:18:00.0");
  // NVSwitch: every pair has all 18 links.
  EXPECT_EQ((*inv)->TopologyLabel(0, 7), "NV18");
  EXPECT_EQ((*inv)->TopologyLabel(3, 3), "X");
  EXPECT_EQ((*inv)->link(0, 1).pcie, PcieLevel::kPix);
  EXPECT_EQ((*inv)->link(0, 2).pcie, PcieLevel::kNode);
  EXPECT_EQ((*inv)->link(0, 4).pcie, PcieLevel::kSys);
  EXPECT_EQ((*inv)->FindGpu(gpus[5].uuid), &gpus[5]);
  EXPECT_EQ((*inv)->IndexOfHandle(gpus[5].handle), 5);
}

TEST(InventoryTest, NumaFromSysfs) {
  SimNode node("dgx-h100");
  const std::string dir = node.dir() + "/bus/pci/devices/0000:9a:00.0";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/numa_node") << "1\n";
  auto lib = OpenSim();
  ASSERT_NE(lib, nullptr);
  auto inv = Inventory::Discover(*lib, {node.dir()});
  ASSERT_TRUE(inv.ok());
  EXPECT_EQ((*inv)->gpus()[4].numa_node, 1);
  EXPECT_EQ((*inv)->gpus()[0].numa_node, -1);
  std::filesystem::remove_all(node.dir() + "/bus");
}

TEST(InventoryTest, L4HasPcieTopologyOnly) {
  SimNode node("l4x4");
  auto lib = OpenSim();
  ASSERT_NE(lib, nullptr);
  auto inv = Inventory::Discover(*lib, {node.dir()});
  ASSERT_TRUE(inv.ok());
  ASSERT_EQ((*inv)->gpus().size(), 4u);
  EXPECT_FALSE((*inv)->gpus()[0].mig_capable);
  EXPECT_EQ((*inv)->TopologyLabel(0, 1), "PIX");
  EXPECT_EQ((*inv)->TopologyLabel(0, 2), "NODE");
}

TEST(InventoryTest, MigDevicesWithParentAndIds) {
  SimNode node("dgx-a100-mig");
  auto lib = OpenSim();
  ASSERT_NE(lib, nullptr);
  auto inv = Inventory::Discover(*lib, {node.dir()});
  ASSERT_TRUE(inv.ok());
  const auto& g0 = (*inv)->gpus()[0];
  ASSERT_TRUE(g0.mig_enabled);
  ASSERT_EQ(g0.migs.size(), 4u);
  std::vector<std::string> profiles;
  for (const auto& m : g0.migs) {
    profiles.push_back(m.profile);
    EXPECT_EQ(m.parent, 0u);
    EXPECT_EQ(m.uuid.substr(0, 4), "MIG-");
    EXPECT_EQ((*inv)->FindMig(m.uuid), &m);
  }
  EXPECT_EQ(profiles, (std::vector<std::string>{"3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"}));
  EXPECT_EQ(g0.migs[0].memory_mib, 19968u);
  EXPECT_EQ((*inv)->gpus()[1].migs.size(), 7u);
  EXPECT_TRUE((*inv)->gpus()[2].migs.empty());
}

TEST(InventoryTest, LostGpuIsRecordedNotFatal) {
  SimNode node("dgx-h100");
  ASSERT_EQ(node.Ctl("lose 2"), 0);
  auto lib = OpenSim();
  ASSERT_NE(lib, nullptr);
  auto inv = Inventory::Discover(*lib, {node.dir()});
  ASSERT_TRUE(inv.ok()) << inv.status();
  ASSERT_EQ((*inv)->gpus().size(), 8u);
  EXPECT_TRUE((*inv)->gpus()[2].lost);
  EXPECT_NE((*inv)->gpus()[2].error.find("GPU is lost"), std::string::npos);
  EXPECT_TRUE((*inv)->gpus()[3].error.empty());
  EXPECT_EQ((*inv)->TopologyLabel(1, 3), "NV18");
  EXPECT_EQ((*inv)->TopologyLabel(1, 2), "?");
}

TEST(NvmlLibraryTest, MissingLibraryNamesPathAndFix) {
  auto lib = nvml::Library::Open({"/nonexistent/libnvidia-ml.so.1"});
  ASSERT_FALSE(lib.ok());
  const std::string msg(lib.status().message());
  EXPECT_NE(msg.find("/nonexistent/libnvidia-ml.so.1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--nvml-library"), std::string::npos) << msg;
}

TEST(NvmlLibraryTest, NotAnNvmlLibrary) {
  auto lib = nvml::Library::Open({"libz.so.1"});
  ASSERT_FALSE(lib.ok());
  EXPECT_NE(std::string(lib.status().message()).find("is not a usable NVML library"), std::string::npos)
      << lib.status();
}

TEST(NvmlLibraryTest, BadProfileFailsInitWithReason) {
  SimNode node("no-such-profile");
  auto lib = nvml::Library::Open({SimNode::LibraryPath()});
  ASSERT_FALSE(lib.ok());
  // The simulator's own reason, not "Driver Not Loaded ... is the NVIDIA kernel driver loaded".
  EXPECT_EQ(nvml::ReturnOf(lib.status()), nvml::Return::kUnknown);
  const std::string message(lib.status().message());
  EXPECT_NE(message.find("nvmlInit: kgpu-simnvml: unknown node profile 'no-such-profile' (known: "), std::string::npos)
      << message;
  EXPECT_EQ(message.find("kernel driver"), std::string::npos) << message;
}

TEST(NvmlLibraryTest, ErrorsCarryCallAndNvmlString) {
  SimNode node("l4x4");
  auto lib = OpenSim();
  ASSERT_NE(lib, nullptr);
  auto mig = lib->GetMigMode(*lib->DeviceByIndex(0));
  ASSERT_FALSE(mig.ok());
  EXPECT_TRUE(nvml::IsNoValue(mig.status()));
  EXPECT_EQ(std::string(mig.status().message()), "nvmlDeviceGetMigMode: Not Supported (NVML error 3)");
  EXPECT_EQ(lib->DeviceByIndex(9).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kgpu::gpu
