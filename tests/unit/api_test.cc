// api/: the node <-> control-plane contract. The inventory annotation's encoder and parser live
// side by side; these tests hold them to each other and to the documented format (docs/k8s.md).

#include <string>

#include <gtest/gtest.h>

#include "api/inventory.h"
#include "api/names.h"
#include "api/record.h"

namespace kgpu::api {
namespace {

NodeInventory Sample() {
  NodeInventory n;
  InventoryGpu share{0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81559, 0, "ok", 4, 1200, false, {}};
  InventoryGpu mig{1, "GPU-bbbb", "NVIDIA A100-SXM4-80GB", 81920, 1, "unhealthy", 0, -1, true, {}};
  mig.mig.push_back({"MIG-1111", "3g.40gb", 1, 0, 40192, "ok"});
  mig.mig.push_back({"MIG-2222", "1c.3g.40gb", 2, 0, 40192, "unhealthy"});
  InventoryGpu empty_mig{2, "GPU-cccc", "NVIDIA A100-SXM4-80GB", 81920, 1, "ok", 0, -1, true, {}};
  n.gpus = {share, mig, empty_mig};
  n.nvlink_islands = {{0, 1}};
  n.pcie_islands = {{1, 2}};
  n.mig_strategy = "mixed";
  n.sharing_mode = "time-slicing";
  n.replicas = {{"kgpu.io/gpu", 4}};
  n.enforcement = {"hard", "none"};
  return n;
}

TEST(Inventory, WhatTheNodeWritesTheReadersReadBackWhole) {
  const NodeInventory n = Sample();
  const std::string text = EncodeInventory(n);
  auto back = ParseInventory("node-a", text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(*back, n) << text;
  EXPECT_EQ(EncodeInventory(*back), text);
}

TEST(Inventory, TheEncodingIsTheDocumentedFormat) {
  NodeInventory n;
  n.gpus = {{0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", 81559, 0, "ok", 4, 1200, false, {}}};
  n.enforcement = {"hard", "none"};
  EXPECT_EQ(EncodeInventory(n),
            R"({"gpus":[{"health":"ok","i":0,"memMiB":81559,"model":"NVIDIA H100 80GB HBM3","numa":0,"slots":4,)"
            R"("usedMiB":1200,"uuid":"GPU-aaaa"}],"migStrategy":"none","nvlinkIslands":[],"pcieIslands":[],)"
            R"("sharing":{"kgpu":{"enforcement":["hard","none"]},"mode":"none"},"v":1})");
}

TEST(Inventory, AReaderNeedsOnlyTheUuidsAndDefaultsTheRest) {
  auto n = ParseInventory("n", R"({"v":1,"gpus":[{"uuid":"GPU-x"}]})");
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(n->gpus.size(), 1u);
  EXPECT_EQ(n->gpus[0].model, "unknown");
  EXPECT_EQ(n->gpus[0].health, "ok");
  EXPECT_EQ(n->gpus[0].used_mib, -1);
  EXPECT_FALSE(n->gpus[0].mig_enabled);
  EXPECT_EQ(n->EnforcementOrDefault(), std::vector<std::string>{"hard"});
}

TEST(Inventory, ErrorsNameTheNodeTheFieldAndTheFix) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {
           Case{"[]", "value: not a JSON object"},
           Case{R"({"v":2,"gpus":[]})", "v: format version 1 expected"},
           Case{R"({"v":1})", "gpus: expected an array"},
           Case{R"({"v":1,"gpus":[{"i":0}]})", "gpus[0].uuid: missing"},
           Case{R"({"v":1,"gpus":[{"uuid":"u","memMiB":-1}]})", "gpus[0].memMiB: must be >= 0"},
           Case{R"({"v":1,"gpus":[{"uuid":"u","memMiB":"8G"}]})", "gpus[0].memMiB: expected an integer"},
           Case{R"({"v":1,"gpus":[{"uuid":"u","usedMiB":-5}]})", "gpus[0].usedMiB: expected an integer >= 0"},
           Case{R"({"v":1,"gpus":[{"uuid":"u","i":4294967296}]})", "gpus[0].i: out of range"},
           Case{R"({"v":1,"gpus":[{"uuid":"u","mig":[{"uuid":"m","profile":"big"}]}]})",
                "gpus[0].mig.profile: 'big' is not a MIG profile"},
           Case{R"({"v":1,"gpus":[],"nvlinkIslands":[3]})", "nvlinkIslands: expected arrays of GPU indices"},
           Case{R"({"v":1,"gpus":[],"sharing":{"kgpu":{"enforcement":[1]}}})",
                "sharing.kgpu.enforcement: expected strings"},
       }) {
    auto n = ParseInventory("node-z", c.text);
    ASSERT_FALSE(n.ok()) << c.text;
    const std::string m(n.status().message());
    EXPECT_EQ(m.rfind(std::string("node node-z: annotation ") + kInventoryAnnotation + ": ", 0), 0u) << m;
    EXPECT_NE(m.find(c.message), std::string::npos) << c.text << " -> " << m;
    EXPECT_NE(m.find("(re-run kgpu node-labels on the node)"), std::string::npos) << m;
  }
}

TEST(Inventory, MigSlicesOfEveryProfileForm) {
  EXPECT_EQ(MigSlices("1g.10gb"), 1);
  EXPECT_EQ(MigSlices("7g.80gb"), 7);
  EXPECT_EQ(MigSlices("1c.3g.40gb"), 3);
  EXPECT_EQ(MigSlices("1g.10gb+me"), 1);
  EXPECT_EQ(MigSlices("12g.1gb"), 0);
  EXPECT_EQ(MigSlices("gpu"), 0);
  EXPECT_EQ(MigSlices(""), 0);
}

TEST(Record, TheAllocationRecordRoundTrips) {
  AllocationRecord r{"node-a",
                     {{"main", kShares, "hard", {{"GPU-aaaa", "", "", 4000, 25}}},
                      {"side", "nvidia.com/mig-3g.40gb", "", {{"GPU-bbbb", "MIG-1111", "3g.40gb", 40192, 0}}}}};
  auto back = ParseRecord(EncodeRecord(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, r);
}

}  // namespace
}  // namespace kgpu::api
