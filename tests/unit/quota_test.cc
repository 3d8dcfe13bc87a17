// Quota arithmetic (src/extender/quota.h): GPU-equivalents of whole GPUs, MIG profiles and share
// memory, the inventory summary, --shares parsing, and plans whose parts never exceed the inventory.
#include "extender/quota.h"

#include <numeric>

#include <gtest/gtest.h>

#include "extender/inventory.h"
#include "testing/gpu_nodes.h"

namespace kgpu::extender {
namespace {
using testing::MigGpu;
using testing::ShareGpu;
using testing::TestInventory;
using testing::WholeGpu;

ClusterGpus Cluster() {
  std::vector<NodeInfo> nodes;
  nodes.push_back(*ParseInventoryAnnotation("whole", TestInventory("whole", {WholeGpu(), WholeGpu(), WholeGpu()})));
  nodes.push_back(*ParseInventoryAnnotation(
      "mig", TestInventory("mig", {MigGpu({"1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "3g.40gb"})})));
  testing::TestGpu a30 = MigGpu({"1g.6gb", "1g.6gb", "2g.12gb"});
  a30.model = "NVIDIA A30";
  a30.memory_mib = 24576;
  nodes.push_back(*ParseInventoryAnnotation("a30", TestInventory("a30", {a30})));
  nodes.push_back(*ParseInventoryAnnotation(
      "share", TestInventory("share", {ShareGpu(81920), ShareGpu(40960, 8, "NVIDIA A100-PCIE-40GB")})));
  testing::TestGpu lost = WholeGpu();
  lost.healthy = false;
  nodes.push_back(*ParseInventoryAnnotation("lost", TestInventory("lost", {lost})));
  return SummarizeInventory(nodes);
}

TEST(QuotaTest, InventorySummary) {
  const ClusterGpus c = Cluster();
  EXPECT_EQ(c.nodes, 5);
  EXPECT_EQ(c.whole, 3);
  EXPECT_EQ(c.unhealthy, 1);
  EXPECT_EQ(c.mig.at("1g.10gb"), 4);
  EXPECT_EQ(c.mig.at("3g.40gb"), 1);
  EXPECT_EQ(c.mig.at("1g.6gb"), 2);
  EXPECT_EQ(c.share_gpus, 2);
  EXPECT_EQ(c.share_slots, 24);
  EXPECT_EQ(c.share_memory_mib, 81920 + 40960);
  EXPECT_EQ(c.share_cores, 200);
  EXPECT_EQ(c.share_ref_mib, 40960);  // the smallest GPU serving shares
  EXPECT_EQ(c.share_ref_model, "NVIDIA A100-PCIE-40GB");
  EXPECT_EQ(c.share_models, 2);
}

// A media-extension profile counts under the resource name the plugin advertises it as
// (api::MigResourceName: "1g.6gb+me" is nvidia.com/mig-1g.6gb.me), with its GPU's slices.
TEST(QuotaTest, MediaExtensionProfilesCountUnderTheirResourceName) {
  testing::TestGpu a30 = MigGpu({"1g.6gb+me", "1g.6gb", "2g.12gb"});
  a30.model = "NVIDIA A30";
  a30.memory_mib = 24576;
  const ClusterGpus c = SummarizeInventory({*ParseInventoryAnnotation("a30", TestInventory("a30", {a30}))});
  EXPECT_EQ(c.mig.at("1g.6gb.me"), 1);
  EXPECT_FALSE(c.mig.contains("1g.6gb+me"));
  EXPECT_DOUBLE_EQ(*GpuEquivalents("requests.nvidia.com/mig-1g.6gb.me", 1, c), 1.0 / 4);  // A30: 4 slices
}

TEST(QuotaTest, GpuEquivalents) {
  const ClusterGpus c = Cluster();
  EXPECT_DOUBLE_EQ(*GpuEquivalents("requests.nvidia.com/gpu", 8, c), 8.0);
  EXPECT_DOUBLE_EQ(*GpuEquivalents("requests.nvidia.com/mig-1g.10gb", 1, c), 1.0 / 7);  // A100: 7 slices
  EXPECT_DOUBLE_EQ(*GpuEquivalents("requests.nvidia.com/mig-3g.40gb", 2, c), 6.0 / 7);
  EXPECT_DOUBLE_EQ(*GpuEquivalents("requests.nvidia.com/mig-1g.6gb", 1, c), 1.0 / 4);  // A30: 4 slices
  EXPECT_DOUBLE_EQ(*GpuEquivalents("requests.nvidia.com/mig-2g.12gb", 3, c), 6.0 / 4);
  EXPECT_DOUBLE_EQ(*GpuEquivalents("nvidia.com/mig-7g.80gb", 1, c), 1.0);           // on no node: 7 slices
  EXPECT_DOUBLE_EQ(*GpuEquivalents("requests.kgpu.io/gpu-memory", 20480, c), 0.5);  // of 40960 MiB
  EXPECT_FALSE(GpuEquivalents("requests.kgpu.io/gpu", 4, c));
  EXPECT_FALSE(GpuEquivalents("requests.kgpu.io/gpu-cores", 50, c));
  EXPECT_FALSE(GpuEquivalents("requests.cpu", 4, c));
  // 3 whole + 4/7 + 3/7 + 2/4 + 2/4 + (81920 + 40960) / 40960.
  EXPECT_DOUBLE_EQ(CapacityGpuEquivalents(c), 3 + 1.0 + 1.0 + 3.0);
  EXPECT_FALSE(GpuEquivalents("requests.kgpu.io/gpu-memory", 1, ClusterGpus{}));  // no sharing GPU
  GpuInfo g;
  g.model = "NVIDIA A30";
  EXPECT_EQ(MaxMigSlices(g), 4);
  g.model = "NVIDIA H100 80GB HBM3";
  EXPECT_EQ(MaxMigSlices(g), 7);
}

TEST(QuotaTest, DivideNeverOverAllocates) {
  EXPECT_EQ(DivideByPercent(4, {50, 30, 20}), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(DivideByPercent(7, {50, 30, 20}), (std::vector<int64_t>{4, 2, 1}));  // 3.5 2.1 1.4
  EXPECT_EQ(DivideByPercent(1, {50, 50}), (std::vector<int64_t>{1, 0}));         // tie: earlier entry
  EXPECT_EQ(DivideByPercent(10, {33, 33}), (std::vector<int64_t>{3, 3}));        // floor(10 x 66 / 100) = 6
  EXPECT_EQ(DivideByPercent(5, {0, 100}), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(DivideByPercent(0, {50, 50}), (std::vector<int64_t>{0, 0}));
  // Exhaustively: the parts add up to floor(total x sum / 100) <= total, each is floor or ceil.
  for (int64_t total : {1, 2, 3, 7, 16, 99, 101, 163840}) {
    for (int a = 0; a <= 100; a += 7) {
      for (int b = 0; a + b <= 100; b += 11) {
        const int c = (100 - a - b) / 2;
        const auto parts = DivideByPercent(total, {a, b, c});
        const int64_t sum = std::accumulate(parts.begin(), parts.end(), int64_t{0});
        EXPECT_EQ(sum, total * (a + b + c) / 100) << total << " " << a << " " << b << " " << c;
        EXPECT_LE(sum, total);
        const int pct[] = {a, b, c};
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_GE(parts[i], total * pct[i] / 100);
          EXPECT_LE(parts[i], (total * pct[i] + 99) / 100);
        }
      }
    }
  }
}

TEST(QuotaTest, PlanCoversEveryResourceAndStaysWithinTheInventory) {
  const ClusterGpus c = Cluster();
  auto teams = ParseTeamShares("team-a=50,team-b=30%, team-c=20");
  ASSERT_TRUE(teams.ok()) << teams.status();
  const auto plan = PlanQuotas(c, *teams);
  ASSERT_EQ(plan.size(), 3u);
  std::map<std::string, int64_t> sum;
  for (const auto& q : plan) {
    ASSERT_EQ(q.hard.size(), 1u + c.mig.size() + 3u);  // "0" entries included
    for (const auto& [r, v] : q.hard) sum[r] += v;
  }
  EXPECT_EQ(sum["requests.nvidia.com/gpu"], 3);
  EXPECT_EQ(sum["requests.nvidia.com/mig-1g.10gb"], 4);
  EXPECT_EQ(sum["requests.nvidia.com/mig-3g.40gb"], 1);
  EXPECT_EQ(sum["requests.kgpu.io/gpu"], 24);
  EXPECT_EQ(sum["requests.kgpu.io/gpu-memory"], 122880);
  EXPECT_EQ(sum["requests.kgpu.io/gpu-cores"], 200);
  // 3 GPUs: exact 1.5 / 0.9 / 0.6; floors 1 / 0 / 0, the 2 left go to the largest remainders.
  EXPECT_EQ(plan[0].hard[0], (std::pair<std::string, int64_t>{"requests.nvidia.com/gpu", 1}));
  EXPECT_EQ(plan[1].hard[0].second, 1);
  EXPECT_EQ(plan[2].hard[0].second, 1);
  // Under 100%: what is left stays unassigned.
  const auto part = PlanQuotas(c, *ParseTeamShares("team-a=25"));
  EXPECT_EQ(part[0].hard[0].second, 0);  // floor(3 x 25 / 100)
}

TEST(QuotaTest, SharesErrorsNameTheInputAndTheFix) {
  auto msg = [](const char* s) { return std::string(ParseTeamShares(s).status().message()); };
  EXPECT_EQ(msg("team-a=60,team-b=50"),
            "--shares: the percentages add up to 110 (team-a=60 + team-b=50); they must add up to at most 100 (lower "
            "some of them)");
  EXPECT_EQ(msg("team-a50"), "--shares: 'team-a50' is not NAMESPACE=PERCENT (write e.g. team-a=50)");
  EXPECT_EQ(msg("team-a=5.5"),
            "--shares: 'team-a=5.5': the percent must be a whole number from 0 to 100 (e.g. team-a=50)");
  EXPECT_EQ(msg("team-a=-1"),
            "--shares: 'team-a=-1': the percent must be a whole number from 0 to 100 (e.g. team-a=50)");
  EXPECT_EQ(msg("team-a=1,team-a=2"), "--shares: team-a is named twice (give each namespace once)");
  EXPECT_EQ(msg("team-a=1,,b=2"), "--shares: an empty item in 'team-a=1,,b=2' (remove the extra comma)");
  EXPECT_NE(msg("Team_A=5").find("is not a namespace name"), std::string::npos);
  EXPECT_NE(msg("").find("empty"), std::string::npos);
  EXPECT_TRUE(ParseTeamShares("a=0").ok());
}

// kgpu quota -n and --shares hold namespace names to the same rule: a lowercase RFC 1123 label.
TEST(QuotaTest, NamespaceNamesAreRfc1123Labels) {
  for (const char* good : {"team-a", "a", "0", "kube-system", "x1-2y"}) EXPECT_TRUE(IsDnsLabel(good)) << good;
  for (const char* bad : {"", "TEAM-A", "team_a", "-team", "team-", "team.a", "t\u00EBam"}) {
    EXPECT_FALSE(IsDnsLabel(bad)) << bad;
  }
  EXPECT_TRUE(IsDnsLabel(std::string(63, 'a')));
  EXPECT_FALSE(IsDnsLabel(std::string(64, 'a')));
}

}  // namespace
}  // namespace kgpu::extender
