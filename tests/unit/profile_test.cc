#include "profile.h"

#include <gtest/gtest.h>

namespace kgpu::sim {
namespace {

TEST(ProfileTest, BuiltinsParse) {
  for (const auto& name : BuiltinProfileNames()) {
    auto p = LoadProfile(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_EQ(p->name, name);
    EXPECT_FALSE(p->gpus.empty());
  }
}

TEST(ProfileTest, DgxH100HasEightNvlinkedGpusOnTwoNumaNodes) {
  auto p = LoadProfile("dgx-h100");
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->gpus.size(), 8u);
  EXPECT_EQ(p->nvlink, "nvswitch");
  EXPECT_EQ(p->gpus[0].model->name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(p->gpus[0].numa_node, 0);
  EXPECT_EQ(p->gpus[7].numa_node, 1);
  EXPECT_EQ(p->gpus[0].bus, 0x18u);
  EXPECT_EQ(p->cuda_version, 12040);
}

TEST(ProfileTest, A100MigLayouts) {
  auto p = LoadProfile("dgx-a100-mig");
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->gpus[0].mig_enabled);
  ASSERT_EQ(p->gpus[0].mig.size(), 4u);
  EXPECT_EQ(p->gpus[0].mig[0].profile, "3g.20gb");
  EXPECT_EQ(p->gpus[0].mig[0].start, 4);
  EXPECT_EQ(p->gpus[1].mig.size(), 7u);
  // Automatic placement fills memory slices 0..6 in order.
  for (int i = 0; i < 7; ++i) EXPECT_EQ(p->gpus[1].mig[static_cast<size_t>(i)].start, i);
  EXPECT_FALSE(p->gpus[2].mig_enabled);
}

TEST(ProfileTest, L4HasNoNvlinkNorMig) {
  auto p = LoadProfile("l4x4");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->gpus.size(), 4u);
  EXPECT_EQ(p->nvlink, "none");
  EXPECT_EQ(p->gpus[0].model->max_mig_devices, 0u);
}

// The MIG names follow NVIDIA's tables (kubelet-and-nvidia-plugin.md §3.9).
TEST(ProfileTest, MigProfileNamesPerModel) {
  auto names = [](const char* key) {
    std::vector<std::string> out;
    for (const auto& p : FindModel(key)->mig_profiles) out.push_back(p.name);
    return out;
  };
  EXPECT_EQ(names("A100-SXM4-40GB"),
            (std::vector<std::string>{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}));
  EXPECT_EQ(names("H100-SXM5-80GB"),
            (std::vector<std::string>{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}));
  EXPECT_EQ(names("H200-SXM-141GB"), (std::vector<std::string>{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb",
                                                               "4g.71gb", "7g.141gb"}));
}

struct BadCase {
  const char* yaml;
  const char* error;  // expected substring, including file:line:col
};

class ProfileErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ProfileErrorTest, NamesPositionAndProblem) {
  auto p = ParseProfile(GetParam().yaml, "node.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find(GetParam().error), std::string::npos) << p.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Errors, ProfileErrorTest,
    ::testing::Values(BadCase{"version: v1\nname: x\ngpus: [{model: H100-SXM5-80GB, count: 2}]\nbogus: 1\n",
                              "node.yaml:4:1: unknown key 'bogus' in the profile"},
                      BadCase{"version: v2\nname: x\n", "node.yaml:1:10: unsupported version 'v2'"},
                      BadCase{"version: v1\nname: x\ngpus:\n  - model: B300\n",
                              "node.yaml:4:12: unknown GPU model 'B300'"},
                      BadCase{"version: v1\nname: x\ngpus: [{model: L4, count: 20}]\n", "at most 16 GPUs"},
                      BadCase{"version: v1\nname: x\ngpus: [{model: L4}]\nmig: [{gpu: 0, instances: [1g.5gb]}]\n",
                              "L4 is not MIG capable"},
                      BadCase{"version: v1\nname: x\ngpus: [{model: A100-SXM4-40GB}]\nmig:\n  - gpu: 0\n    "
                              "instances: [7g.40gb, 1g.5gb]\n",
                              "node.yaml:6:16: no free placement left for 1g.5gb"},
                      BadCase{"version: v1\nname: x\ngpus: [{model: A100-SXM4-40GB}]\nmig:\n  - gpu: 0\n    "
                              "instances: [\"3g.20gb@2\"]\n",
                              "3g.20gb cannot start at memory slice 2 (valid starts: 0, 4)"},
                      BadCase{"version: v1\nname: x\ngpus: [{model: A100-SXM4-40GB}]\nmig: [{gpu: 3}]\n",
                              "gpu 3 does not exist (the node has 1 GPUs)"},
                      BadCase{"version: v1\nname: x\ncudaVersion: twelve\ngpus: [{model: L4}]\n",
                              "node.yaml:3:14: cudaVersion must look like \"12.4\""},
                      BadCase{"version: v1\nname: [unclosed\n", "node.yaml:"},
                      BadCase{"- just\n- a list\n", "node.yaml:1:1: a node profile must be a YAML mapping"}));

TEST(ProfileTest, UnknownNameListsBuiltins) {
  auto p = LoadProfile("dgx-b200");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("known: dgx-h100, dgx-a100-mig, hgx-h200, l4x4"), std::string::npos);
}

TEST(ProfileTest, MissingFileNamesPath) {
  auto p = LoadProfile("/nonexistent/node.yaml");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("/nonexistent/node.yaml"), std::string::npos);
}

TEST(ProfileTest, UuidsAreStablePerProfileAndNode) {
  EXPECT_EQ(GpuUuid("dgx-h100", "node-a", 0), GpuUuid("dgx-h100", "node-a", 0));
  EXPECT_NE(GpuUuid("dgx-h100", "node-a", 0), GpuUuid("dgx-h100", "node-b", 0));
  EXPECT_NE(GpuUuid("dgx-h100", "node-a", 0), GpuUuid("dgx-h100", "node-a", 1));
  const std::string u = GpuUuid("dgx-h100", "node-a", 0);
  ASSERT_EQ(u.size(), 40u);
  EXPECT_EQ(u.substr(0, 4), "GPU-");
  EXPECT_EQ(MigUuid(u, 1, 0).substr(0, 4), "MIG-");
}

}  // namespace
}  // namespace kgpu::sim
