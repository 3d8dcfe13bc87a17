// The scheduler stand-in's DRA allocator and CEL subset (testing/dra_allocator.h, dra_cel.h),
// over the ResourceSlices kgpu's own driver builds for simulated nodes and deploy/dra's classes.

#include "testing/dra_allocator.h"

#include <fstream>

#include <gtest/gtest.h>

#include "dra/slices.h"
#include "gpu/inventory.h"
#include "gpu/mig_layout.h"
#include "nvml/library.h"
#include "testing/dra_cel.h"
#include "testing/fake_apiserver.h"
#include "testing/sim_node.h"

namespace kgpu::testing {
namespace {

using json = nlohmann::json;

absl::StatusOr<bool> Cel(const std::string& expr, const json& device, const std::string& driver = "gpu.nvidia.com") {
  auto p = CompileCel(expr);
  if (!p.ok()) return p.status();
  return EvalCel(**p, {driver, device});
}

const json kGpu = {{"name", "gpu-0"},
                   {"attributes",
                    {{"type", {{"string", "gpu"}}},
                     {"productName", {{"string", "NVIDIA H100 80GB HBM3"}}},
                     {"index", {{"int", 3}}},
                     {"cudaComputeCapability", {{"version", "9.0.0"}}},
                     {"resource.kubernetes.io/pcieRoot", {{"string", "pci0000:17"}}}}},
                   {"capacity", {{"memory", {{"value", "80Gi"}}}}}};

TEST(DraCelTest, EvaluatesTheSubsetClassesAndClaimsUse) {
  EXPECT_EQ(*Cel("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'", kGpu), true);
  EXPECT_EQ(*Cel("device.attributes[\"gpu.nvidia.com\"].type == \"mig\"", kGpu), false);
  EXPECT_EQ(*Cel("device.attributes['gpu.nvidia.com'].productName.matches('H100')", kGpu), true);
  EXPECT_EQ(*Cel("device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A')", kGpu), false);
  EXPECT_EQ(*Cel("device.attributes['gpu.nvidia.com'].index in [1, 3, 5]", kGpu), true);
  EXPECT_EQ(*Cel("device.attributes['gpu.nvidia.com'].index >= 4 || !device.allowMultipleAllocations", kGpu), true);
  EXPECT_EQ(*Cel("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40Gi'))", kGpu), true);
  EXPECT_EQ(*Cel("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) == 0", kGpu), true);
  EXPECT_EQ(*Cel("device.attributes['gpu.nvidia.com'].cudaComputeCapability.isLessThan(semver('10.0.0'))", kGpu), true);
  EXPECT_EQ(*Cel("device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:17'", kGpu), true);
  EXPECT_EQ(*Cel("has(device.attributes['gpu.nvidia.com'].profile)", kGpu), false);
  EXPECT_EQ(*Cel("has(device.attributes['example.com'].x)", kGpu), false);  // an unknown domain is empty
  // A missing attribute is a runtime error, as in Kubernetes; false && error is false.
  auto missing = Cel("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'", kGpu);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no such key: profile"), std::string::npos);
  EXPECT_EQ(*Cel("device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile "
                 "== '1g.10gb'",
                 kGpu),
            false);
  // What the stand-in does not evaluate is refused by name.
  for (const auto& [expr, what] : std::vector<std::pair<std::string, std::string>>{
           {"device.attributes.all(x, true)", "method all()"},
           {"cel.bind(x, 1, x == 1)", "variable 'cel'"},
           {"device.attributes['gpu.nvidia.com'].index + 1 == 4", "operator '+'"},
           {"int(device.driver) == 1", "function int()"}}) {
    auto r = Cel(expr, kGpu);
    ASSERT_FALSE(r.ok()) << expr;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << expr << ": " << r.status();
  }
  EXPECT_FALSE(Cel("device.driver", kGpu).ok());  // not a bool
}

// deploy/dra's classes, read as the API server would store them.
std::map<std::string, json> Classes() {
  auto docs = YamlDocumentsToJson(
      [] {
        std::ifstream in(std::string(KGPU_SOURCE_DIR) + "/deploy/dra/deviceclasses.yaml");
        return std::string((std::istreambuf_iterator<char>(in)), {});
      }(),
      "deviceclasses.yaml");
  EXPECT_TRUE(docs.ok());
  std::map<std::string, json> out;
  for (const auto& d : *docs) out[d["metadata"]["name"]] = d;
  return out;
}

struct Pool {
  DraWorld world;
  std::shared_ptr<const gpu::Inventory> inv;
};

Pool Build(const SimNode& sim, std::set<unsigned> shared, bool dynamic) {
  Pool p;
  auto lib = nvml::Library::Open({SimNode::LibraryPath()});
  EXPECT_TRUE(lib.ok());
  auto inv = gpu::Inventory::Discover(**lib, {sim.dir()});
  EXPECT_TRUE(inv.ok());
  p.inv = *inv;
  std::map<unsigned, gpu::MigCatalog> mig;
  for (const auto& g : p.inv->gpus()) {
    if (g.mig_enabled) mig[g.index] = *gpu::ReadMigCatalog(**lib, g);
  }
  dra::PoolOptions o;
  o.node_name = "node-a";
  o.shared_gpus = std::move(shared);
  o.dynamic_mig = dynamic;
  const auto slices = dra::BuildPool(*p.inv, mig, o);
  EXPECT_TRUE(slices.ok()) << slices.status();
  for (const auto& s : *slices) p.world.slices.push_back(api::dra::ToJson(s));
  p.world.classes = Classes();
  return p;
}

json Claim(const std::string& name, json request) {
  static int uid = 0;
  return {{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "uid-" + std::to_string(++uid)}}},
          {"spec", {{"devices", {{"requests", json::array({std::move(request)})}}}}}};
}

json Exactly(const std::string& cls, json extra = json::object()) {
  extra["deviceClassName"] = cls;
  return {{"name", "r"}, {"exactly", extra}};
}

// Allocates and records the claim as allocated; returns its results.
json Allocate(Pool& p, json claim) {
  auto a = AllocateClaim(claim, "node-a", p.world);
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return json::array();
  claim["status"]["allocation"] = *a;
  p.world.allocated.push_back(claim);
  return (*a)["devices"]["results"];
}

TEST(DraAllocatorTest, WholeGpusThenSharesHeldToTheirPolicy) {
  SimNode sim("dgx-h100");
  Pool p = Build(sim, {6, 7}, false);
  // Whole GPUs: first fit in slice order, never twice.
  const json a = Allocate(p, Claim("a", Exactly("gpu.nvidia.com")));
  const json b = Allocate(p, Claim("b", Exactly("gpu.nvidia.com")));
  ASSERT_EQ(a.size(), 1U);
  EXPECT_EQ(a[0]["device"], "gpu-" + std::to_string(p.inv->gpus()[0].minor));
  EXPECT_EQ(b[0]["device"], "gpu-" + std::to_string(p.inv->gpus()[1].minor));
  EXPECT_FALSE(a[0].contains("shareID"));
  // Shares of 20Gi/30% and 40Gi/60% fit one GPU; another 40Gi does not, and goes to the next.
  auto share = [](const std::string& mem, const std::string& cores) {
    return Exactly("gpu-share.kgpu.io", {{"capacity", {{"requests", {{"memory", mem}, {"cores", cores}}}}}});
  };
  const json s1 = Allocate(p, Claim("s1", share("20Gi", "30")));
  const json s2 = Allocate(p, Claim("s2", share("40Gi", "60")));
  const json s3 = Allocate(p, Claim("s3", share("40Gi", "20")));
  const std::string gpu6 = "gpu-" + std::to_string(p.inv->gpus()[6].minor);
  const std::string gpu7 = "gpu-" + std::to_string(p.inv->gpus()[7].minor);
  EXPECT_EQ(s1[0]["device"], gpu6);
  EXPECT_EQ(s1[0]["consumedCapacity"], (json{{"memory", "20Gi"}, {"cores", "30"}}));
  EXPECT_EQ(s2[0]["device"], gpu6);
  EXPECT_EQ(s3[0]["device"], gpu7);  // 40Gi more would pass gpu-6's memory
  EXPECT_FALSE(s1[0].value("shareID", "").empty());
  // A request rounds up to whole MiB (validRange step 1Mi).
  const json s4 = Allocate(p, Claim("s4", share("1000Ki", "1")));
  EXPECT_EQ(s4[0]["consumedCapacity"]["memory"], "1Mi");
  // A share asking more than a GPU has fits nowhere.
  auto big = AllocateClaim(Claim("big", share("100Gi", "10")), "node-a", p.world);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("cannot allocate all claims"), std::string::npos) << big.status();
}

TEST(DraAllocatorTest, DynamicMigCountersTaintsAndFirstAvailable) {
  SimNode sim("dgx-a100-mig");
  Pool p = Build(sim, {}, true);
  const gpu::Gpu* mig_gpu = nullptr;
  for (const auto& g : p.inv->gpus()) {
    if (g.mig_enabled && mig_gpu == nullptr) mig_gpu = &g;
  }
  ASSERT_NE(mig_gpu, nullptr);
  auto profile = [&](const std::string& prof) {
    return Exactly("mig.nvidia.com",
                   {{"selectors",
                     {{{"cel",
                        {{"expression", "device.attributes['gpu.nvidia.com'].profile == '" + prof +
                                            "' && device.attributes['gpu.nvidia.com'].parentUUID == '" + mig_gpu->uuid +
                                            "'"}}}}}}});
  };
  // Seven 1g.5gb fit one A100; the eighth does not (its memory slices are taken); a 7g.40gb no longer fits.
  std::set<std::string> devices;
  for (int i = 0; i < 7; ++i)
    devices.insert(Allocate(p, Claim("m" + std::to_string(i), profile("1g.5gb")))[0]["device"]);
  EXPECT_EQ(devices.size(), 7U);
  EXPECT_FALSE(AllocateClaim(Claim("m8", profile("1g.5gb")), "node-a", p.world).ok());
  EXPECT_FALSE(AllocateClaim(Claim("full", profile("7g.40gb")), "node-a", p.world).ok());
  // firstAvailable: the first subrequest that fits wins.
  json first = {{"name", "mig"},
                {"firstAvailable",
                 {{{"name", "one-g"},
                   {"deviceClassName", "mig.nvidia.com"},
                   {"selectors", profile("1g.5gb")["exactly"]["selectors"]}},
                  {{"name", "whole"}, {"deviceClassName", "gpu.nvidia.com"}}}}};
  const json got = Allocate(p, Claim("first", first));
  EXPECT_EQ(got[0]["request"], "mig/whole");
  // A tainted device is skipped unless tolerated.
  std::string tainted;
  for (auto& s : p.world.slices) {
    for (auto& d : s["spec"]["devices"]) {
      if (d["attributes"]["type"]["string"] == "gpu" && tainted.empty() &&
          !std::any_of(p.world.allocated.begin(), p.world.allocated.end(), [&](const json& c) {
            return c["status"]["allocation"]["devices"]["results"][0]["device"] == d["name"];
          })) {
        d["taints"] = {{{"key", "gpu.nvidia.com/xid"}, {"value", "48"}, {"effect", "NoSchedule"}}};
        tainted = d["name"];
      }
    }
  }
  ASSERT_FALSE(tainted.empty());
  const json next = Allocate(p, Claim("next", Exactly("gpu.nvidia.com")));
  EXPECT_NE(next[0]["device"], tainted);
  const json tolerant = Allocate(
      p, Claim("tolerant", Exactly("gpu.nvidia.com",
                                   {{"tolerations", {{{"key", "gpu.nvidia.com/xid"}, {"operator", "Exists"}}}}})));
  EXPECT_EQ(tolerant[0]["device"], tainted);
}

}  // namespace
}  // namespace kgpu::testing
