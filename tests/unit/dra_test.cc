// The DRA driver (src/dra/, src/api/dra.h): ResourceSlices with names as NVIDIA's driver spells
// them, every node profile of the simulated NVML, MIG as partitionable devices (the counters allow
// exactly the sets of instances NVML can carve), shares as consumable capacity, the API's limits
// per slice; prepare and unprepare against the API server stand-in (CDI, the interposer for
// shares, the checkpoint, refusals with the reason).

#include "api/dra.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "dra/prepare.h"
#include "dra/slices.h"
#include "gpu/inventory.h"
#include "gpu/mig_layout.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "nvml/library.h"
#include "testing/fake_apiserver.h"
#include "testing/sim_node.h"

namespace kgpu::dra {
namespace {

namespace a = api::dra;
using kgpu::testing::SimNode;
using nlohmann::json;

TEST(DraNamesTest, SpellNvidiasNames) {
  EXPECT_EQ(a::GpuDeviceName(3), "gpu-3");
  EXPECT_EQ(a::CounterSetName(3), "gpu-3-counter-set");
  // cmd/gpu-kubelet-plugin/mig.go ToCanonicalName: dots removed, RFC 1123, profile id, placement start.
  EXPECT_EQ(a::MigDeviceName(0, "1g.5gb", 19, 6), "gpu-0-mig-1g5gb-19-6");
  EXPECT_EQ(a::MigDeviceName(1, "1g.10gb+me", 20, 0), "gpu-1-mig-1g10gb-me-20-0");
  EXPECT_EQ(a::MigDeviceName(7, "7g.80gb", 0, 0), "gpu-7-mig-7g80gb-0-0");
  // partitions.go camelToDNSName.
  EXPECT_EQ(a::CounterName("copyEngines"), "copy-engines");
  EXPECT_EQ(a::CounterName("jpegEngines"), "jpeg-engines");
  EXPECT_EQ(a::CounterName("multiprocessors"), "multiprocessors");
  EXPECT_EQ(a::CounterName("HTTPServer"), "http-server");
  EXPECT_EQ(a::MemorySliceCounter(7), "memory-slice-7");
}

TEST(DraNamesTest, QuantitiesAndVersionsAsTheApiStoresThem) {
  EXPECT_EQ(a::BinaryQuantity(80ULL << 30), "80Gi");
  EXPECT_EQ(a::BinaryQuantity(4864ULL << 20), "4864Mi");
  EXPECT_EQ(a::BinaryQuantity(1), "1");
  EXPECT_EQ(a::BinaryQuantity(0), "0");
  EXPECT_EQ(a::BinaryQuantity(1536), "1536");
  EXPECT_EQ(a::BinaryQuantity(1024 * 1000), "1000Ki");
  EXPECT_EQ(a::SemVer("12.4"), "12.4.0");
  EXPECT_EQ(a::SemVer("9.0"), "9.0.0");
  EXPECT_EQ(a::SemVer("535.104.05"), "535.104.5");  // semver forbids leading zeros
  EXPECT_EQ(a::SemVer("550"), "550.0.0");
  EXPECT_EQ(a::SemVer("1.2.3.4"), std::nullopt);
  EXPECT_EQ(a::SemVer("1..2"), std::nullopt);
  EXPECT_EQ(a::SemVer("r550"), std::nullopt);
  EXPECT_EQ(a::SemVer(""), std::nullopt);
  EXPECT_TRUE(a::IsDnsSubdomain("gpu.nvidia.com", 63));
  EXPECT_TRUE(a::IsDnsSubdomain("node-1"));
  EXPECT_FALSE(a::IsDnsSubdomain("GPU.nvidia.com"));
  EXPECT_FALSE(a::IsDnsSubdomain("-gpu.example"));
  EXPECT_FALSE(a::IsDnsSubdomain("gpu..example"));
  EXPECT_FALSE(a::IsDnsSubdomain(std::string(64, 'a'), 63));
  EXPECT_FALSE(a::IsDnsSubdomain(""));
}

struct Node {
  std::unique_ptr<nvml::Library> lib;
  std::shared_ptr<const gpu::Inventory> inv;
  std::map<unsigned, gpu::MigCatalog> mig;
};

Node Discover(const SimNode& sim) {
  Node n;
  auto lib = nvml::Library::Open({SimNode::LibraryPath()});
  EXPECT_TRUE(lib.ok()) << lib.status();
  if (!lib.ok()) return n;
  n.lib = std::move(*lib);
  auto inv = gpu::Inventory::Discover(*n.lib, {sim.dir()});
  EXPECT_TRUE(inv.ok()) << inv.status();
  if (!inv.ok()) return n;
  n.inv = *inv;
  for (const auto& g : n.inv->gpus()) {
    if (!g.mig_enabled) continue;
    auto cat = gpu::ReadMigCatalog(*n.lib, g);
    EXPECT_TRUE(cat.ok()) << cat.status();
    if (cat.ok()) n.mig[g.index] = *cat;
  }
  return n;
}

PoolOptions On(const std::string& node) {
  PoolOptions o;
  o.node_name = node;
  return o;
}

std::vector<a::ResourceSlice> Build(const Node& n, const PoolOptions& o) {
  auto slices = BuildPool(*n.inv, n.mig, o);
  EXPECT_TRUE(slices.ok()) << slices.status();
  return slices.ok() ? *slices : std::vector<a::ResourceSlice>{};
}

std::map<std::string, a::Device> ByName(const std::vector<a::ResourceSlice>& slices) {
  std::map<std::string, a::Device> out;
  for (const auto& s : slices) {
    for (const auto& d : s.devices) EXPECT_TRUE(out.emplace(d.name, d).second) << "duplicate device " << d.name;
  }
  return out;
}

// What every pool must be: one pool named after the node, every slice with its generation and
// the slice count, within the API's limits, names unique.
void ExpectValidPool(const std::vector<a::ResourceSlice>& slices, const PoolOptions& o) {
  std::set<std::string> names, sets;
  for (const auto& s : slices) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_TRUE(a::IsDnsSubdomain(s.name)) << s.name;
    EXPECT_EQ(s.pool, o.node_name);
    EXPECT_EQ(s.node_name, o.node_name);
    EXPECT_EQ(s.driver, o.driver);
    EXPECT_EQ(s.generation, o.generation);
    EXPECT_EQ(s.slice_count, static_cast<int64_t>(slices.size()));
    if (o.split_counters) {
      EXPECT_TRUE(s.devices.empty() || s.shared_counters.empty()) << s.name;
    }
    EXPECT_LE(s.shared_counters.size(), a::kMaxCounterSetsPerSlice);
    const bool limited = std::any_of(s.devices.begin(), s.devices.end(), [](const a::Device& d) {
      return !d.taints.empty() || !d.consumes_counters.empty();
    });
    EXPECT_LE(s.devices.size(), limited ? a::kMaxDevicesPerSliceWithTaintsOrCounters : a::kMaxDevicesPerSlice);
    for (const auto& c : s.shared_counters) {
      EXPECT_TRUE(sets.insert(c.name).second) << "counter set " << c.name << " twice in the pool";
      EXPECT_LE(c.counters.size(), a::kMaxCountersPerSet);
    }
    for (const auto& d : s.devices) {
      EXPECT_TRUE(a::IsDnsSubdomain(d.name, 63) && d.name.find('.') == std::string::npos) << d.name;
      EXPECT_LE(d.attributes.size() + d.capacity.size(), a::kMaxAttributesAndCapacities) << d.name;
      for (const auto& [k, v] : d.attributes) {
        if (v.kind == a::Attribute::Kind::kString) {
          EXPECT_LE(v.text.size(), a::kMaxStringAttribute) << k;
        }
      }
    }
  }
}

TEST(DraSlicesTest, WholeGpusCarryNvidiasAttributesWithTheirTypes) {
  SimNode sim("l4x4");
  const Node n = Discover(sim);
  ASSERT_TRUE(n.inv);
  PoolOptions o;
  o.node_name = "node-a";
  o.generation = 3;
  const auto slices = Build(n, o);
  ExpectValidPool(slices, o);
  ASSERT_EQ(slices.size(), 1U);
  EXPECT_EQ(slices[0].name, "node-a-gpu.nvidia.com-0");
  const auto devices = ByName(slices);
  ASSERT_EQ(devices.size(), n.inv->gpus().size());
  for (const auto& g : n.inv->gpus()) {
    const auto it = devices.find("gpu-" + std::to_string(g.minor));
    ASSERT_NE(it, devices.end()) << g.minor;
    const auto& attrs = it->second.attributes;
    EXPECT_EQ(attrs.at("type"), a::Attribute::String("gpu"));
    EXPECT_EQ(attrs.at("uuid"), a::Attribute::String(g.uuid));
    EXPECT_EQ(attrs.at("index"), a::Attribute::Int(g.index));
    EXPECT_EQ(attrs.at("productName"), a::Attribute::String("NVIDIA L4"));
    EXPECT_EQ(attrs.at("brand"), a::Attribute::String("Nvidia"));
    EXPECT_EQ(attrs.at("architecture"), a::Attribute::String("Ada Lovelace"));
    EXPECT_EQ(attrs.at("cudaComputeCapability"), a::Attribute::Version("8.9.0"));
    EXPECT_EQ(attrs.at("driverVersion").kind, a::Attribute::Kind::kVersion);
    EXPECT_EQ(attrs.at("driverVersion").text, *a::SemVer(n.inv->driver_version()));
    EXPECT_EQ(attrs.at("cudaDriverVersion"), a::Attribute::Version(*a::SemVer(n.inv->cuda_version())));
    EXPECT_EQ(attrs.at("resource.kubernetes.io/pciBusID").text.size(), 12U);  // 0000:01:00.0
    EXPECT_FALSE(it->second.allow_multiple_allocations);
    EXPECT_EQ(it->second.capacity.at("memory").value, a::BinaryQuantity(g.memory_mib << 20));
    EXPECT_FALSE(it->second.capacity.at("memory").policy);
  }
  // The JSON the API gets: NVIDIA's value types ({"version": ...} for versions, {"int": ...}).
  const json j = a::ToJson(slices[0]);
  EXPECT_EQ(j["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(j["kind"], "ResourceSlice");
  EXPECT_EQ(j["spec"]["pool"], (json{{"name", "node-a"}, {"generation", 3}, {"resourceSliceCount", 1}}));
  EXPECT_EQ(j["spec"]["devices"][0]["attributes"]["cudaComputeCapability"], (json{{"version", "8.9.0"}}));
  EXPECT_EQ(j["spec"]["devices"][0]["attributes"]["index"], (json{{"int", 0}}));
  EXPECT_FALSE(j["spec"].contains("sharedCounters"));
}

TEST(DraSlicesTest, NumaAndPcieRootComeFromSysfs) {
  SimNode sim("dgx-h100");
  ASSERT_EQ(sim.Ctl("sysfs " + sim.dir()), 0);
  // A sysfs device entry is a link into the device tree; its root complex is the pcieRoot.
  const Node plain = Discover(sim);
  ASSERT_TRUE(plain.inv);
  const std::string bdf = a::ToJson(
      Build(plain, On("n"))[0])["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"]["string"];
  const std::string entry = sim.dir() + "/bus/pci/devices/" + bdf;
  const std::string real = sim.dir() + "/devices/pci0000:17/0000:17:01.0/" + bdf;
  std::filesystem::create_directories(std::filesystem::path(real).parent_path());
  std::filesystem::rename(entry, real);
  std::filesystem::create_symlink("../../../devices/pci0000:17/0000:17:01.0/" + bdf, entry);
  const Node n = Discover(sim);
  const auto devices = ByName(Build(n, On("n")));
  const auto& gpu0 = devices.at("gpu-" + std::to_string(n.inv->gpus()[0].minor));
  EXPECT_EQ(gpu0.attributes.at("resource.kubernetes.io/pcieRoot"), a::Attribute::String("pci0000:17"));
  ASSERT_GE(n.inv->gpus()[0].numa_node, 0);
  EXPECT_EQ(gpu0.attributes.at("resource.kubernetes.io/numaNode"), a::Attribute::Int(n.inv->gpus()[0].numa_node));
  const auto& gpu1 = devices.at("gpu-" + std::to_string(n.inv->gpus()[1].minor));
  EXPECT_FALSE(gpu1.attributes.contains("resource.kubernetes.io/pcieRoot"));  // a plain directory: unknown
}

TEST(DraSlicesTest, SharedGpusAreConsumableCapacity) {
  SimNode sim("l4x4");
  const Node n = Discover(sim);
  ASSERT_TRUE(n.inv);
  PoolOptions o;
  o.node_name = "node-a";
  o.shared_gpus = {0, 2};
  const auto devices = ByName(Build(n, o));
  for (const auto& g : n.inv->gpus()) {
    const auto& d = devices.at("gpu-" + std::to_string(g.minor));
    const std::string memory = a::BinaryQuantity(g.memory_mib << 20);
    if (g.index == 0 || g.index == 2) {
      EXPECT_TRUE(d.allow_multiple_allocations);
      // A claim asking for nothing takes all of both (a whole GPU); requests in whole MiB and percent.
      EXPECT_EQ(d.capacity.at("memory"), (a::Capacity{memory, a::RequestPolicy{memory, "1Mi", memory, "1Mi"}}));
      EXPECT_EQ(d.capacity.at("cores"), (a::Capacity{"100", a::RequestPolicy{"100", "1", "100", "1"}}));
      const json cap = a::ToJson(Build(n, o)[0])["spec"]["devices"][g.index]["capacity"]["memory"];
      EXPECT_EQ(cap["requestPolicy"]["validRange"], (json{{"min", "1Mi"}, {"max", memory}, {"step", "1Mi"}}));
    } else {
      EXPECT_FALSE(d.allow_multiple_allocations);
      EXPECT_FALSE(d.capacity.contains("cores"));
    }
  }
}

TEST(DraSlicesTest, StaticMigPublishesTheInstancesThatExist) {
  SimNode sim("dgx-a100-mig");
  const Node n = Discover(sim);
  ASSERT_TRUE(n.inv);
  const auto slices = Build(n, On("node-b"));
  ExpectValidPool(slices, On("node-b"));
  const auto devices = ByName(slices);
  size_t migs = 0;
  for (const auto& g : n.inv->gpus()) {
    const std::string whole = "gpu-" + std::to_string(g.minor);
    EXPECT_EQ(devices.contains(whole), !g.mig_enabled) << whole;  // a MIG-mode GPU is not usable whole
    for (const auto& m : g.migs) {
      ++migs;
      const auto it = std::find_if(devices.begin(), devices.end(), [&](const auto& kv) {
        const auto u = kv.second.attributes.find("uuid");
        return u != kv.second.attributes.end() && u->second.text == m.uuid;
      });
      ASSERT_NE(it, devices.end()) << m.uuid;
      const a::Device& d = it->second;
      EXPECT_EQ(d.name.rfind(whole + "-mig-", 0), 0U) << d.name;
      EXPECT_EQ(d.attributes.at("type"), a::Attribute::String("mig"));
      EXPECT_EQ(d.attributes.at("profile"), a::Attribute::String(m.profile));
      EXPECT_EQ(d.attributes.at("parentUUID"), a::Attribute::String(g.uuid));
      EXPECT_EQ(d.capacity.at("memory").value, a::BinaryQuantity(m.memory_mib << 20));
      EXPECT_EQ(d.capacity.at("multiprocessors").value, std::to_string(m.sm_count));
      size_t slices_held = 0;
      for (const auto& [k, v] : d.capacity) slices_held += k.rfind("memorySlice", 0) == 0 ? 1 : 0;
      EXPECT_GE(slices_held, 1U) << d.name;
      EXPECT_TRUE(d.consumes_counters.empty());
    }
  }
  EXPECT_GT(migs, 0U);
  EXPECT_EQ(devices.size(), migs + static_cast<size_t>(std::count_if(n.inv->gpus().begin(), n.inv->gpus().end(),
                                                                     [](const auto& g) { return !g.mig_enabled; })));
}

// A quantity as BinaryQuantity writes it ("4864Mi", "14") as a number.
int64_t Value(const std::string& q) {
  const size_t end = q.find_first_not_of("0123456789");
  int64_t v = std::stoll(q.substr(0, end));
  if (end == std::string::npos) return v;
  for (std::string_view suffix : {"Ki", "Mi", "Gi", "Ti"}) {
    v *= 1024;
    if (q.substr(end) == suffix) return v;
  }
  ADD_FAILURE() << "not a binary quantity: " << q;
  return 0;
}

// Whether a set of devices fits the pool's counters (KEP-4815: no counter below zero).
bool CountersFit(const std::map<std::string, a::CounterSet>& sets, const std::vector<const a::Device*>& picked) {
  std::map<std::string, std::map<std::string, int64_t>> used;
  for (const auto* d : picked) {
    for (const auto& c : d->consumes_counters) {
      for (const auto& [name, q] : c.counters) {
        used[c.counter_set][name] += Value(q);
      }
    }
  }
  for (const auto& [set, counters] : used) {
    for (const auto& [name, v] : counters) {
      if (v > Value(sets.at(set).counters.at(name))) return false;
    }
  }
  return true;
}

TEST(DraSlicesTest, DynamicMigCountersAllowExactlyWhatNvmlCanCarve) {
  SimNode sim("dgx-a100-mig");
  const Node n = Discover(sim);
  ASSERT_TRUE(n.inv);
  ASSERT_FALSE(n.mig.empty());
  PoolOptions o;
  o.node_name = "node-b";
  o.dynamic_mig = true;
  const auto slices = Build(n, o);
  ExpectValidPool(slices, o);
  std::map<std::string, a::CounterSet> sets;
  for (const auto& s : slices) {
    for (const auto& c : s.shared_counters) sets[c.name] = c;
  }
  const auto devices = ByName(slices);
  const unsigned gi = n.mig.begin()->first;
  const gpu::Gpu& g = n.inv->gpus()[gi];
  const gpu::MigCatalog& cat = n.mig.at(gi);
  ASSERT_TRUE(sets.contains(a::CounterSetName(g.minor)));
  EXPECT_EQ(sets.at(a::CounterSetName(g.minor)).counters.count(a::MemorySliceCounter(cat.memory_slices - 1)), 1U);
  // Every placement of every profile is a device.
  struct Option {
    const nvml::GpuInstanceProfile* profile;
    nvml::Placement placement;
    const a::Device* device;
  };
  std::vector<Option> options;
  for (const auto& p : cat.profiles) {
    for (const auto& pl : p.placements) {
      const auto it = devices.find(a::MigDeviceName(g.minor, p.name, p.profile.id, pl.start));
      ASSERT_NE(it, devices.end()) << p.name << "@" << pl.start;
      EXPECT_EQ(it->second.attributes.at("profile"), a::Attribute::String(p.name));
      EXPECT_FALSE(it->second.attributes.contains("uuid"));  // it does not exist yet
      options.push_back({&p.profile, pl, &it->second});
    }
  }
  ASSERT_GT(options.size(), 10U);
  // Empty the GPU, then ask NVML about every pair: carving both succeeds exactly when the counters
  // allow both.
  const auto existing = n.lib->GpuInstances(g.handle);
  ASSERT_TRUE(existing.ok()) << existing.status();
  for (const auto& inst : *existing) {
    const auto cis = n.lib->ComputeInstances(inst);
    ASSERT_TRUE(cis.ok()) << cis.status();
    for (void* ci : *cis) ASSERT_TRUE(n.lib->DestroyComputeInstance(ci).ok());
    ASSERT_TRUE(n.lib->DestroyGpuInstance(inst).ok());
  }
  size_t both = 0, refused = 0;
  for (size_t i = 0; i < options.size(); ++i) {
    for (size_t j = i + 1; j < options.size(); ++j) {
      auto first = n.lib->CreateGpuInstance(g.handle, *options[i].profile, options[i].placement);
      ASSERT_TRUE(first.ok()) << first.status();
      auto second = n.lib->CreateGpuInstance(g.handle, *options[j].profile, options[j].placement);
      const bool fits = CountersFit(sets, {options[i].device, options[j].device});
      EXPECT_EQ(second.ok(), fits) << options[i].device->name << " + " << options[j].device->name << ": NVML says "
                                   << (second.ok() ? "OK" : second.status().ToString());
      (second.ok() ? both : refused)++;
      if (second.ok()) {
        ASSERT_TRUE(n.lib->DestroyGpuInstance(*second).ok());
      }
      ASSERT_TRUE(n.lib->DestroyGpuInstance(*first).ok());
    }
  }
  EXPECT_GT(both, 0U);
  EXPECT_GT(refused, 0U);
  // The whole GPU is not offered while it is in MIG mode (its largest profile is).
  EXPECT_FALSE(devices.contains(a::GpuDeviceName(g.minor)));
}

TEST(DraSlicesTest, CountersSitWithTheirDevicesOnKubernetes134) {
  SimNode sim("dgx-a100-mig");
  const Node n = Discover(sim);
  ASSERT_TRUE(n.inv);
  PoolOptions o;
  o.node_name = "node-b";
  o.dynamic_mig = true;
  o.split_counters = false;
  const auto slices = Build(n, o);
  ExpectValidPool(slices, o);
  size_t with_counters = 0;
  for (const auto& s : slices) {
    if (s.shared_counters.empty()) continue;
    ++with_counters;
    ASSERT_EQ(s.shared_counters.size(), 1U);
    for (const auto& d : s.devices) {
      ASSERT_EQ(d.consumes_counters.size(), 1U);
      EXPECT_EQ(d.consumes_counters[0].counter_set, s.shared_counters[0].name);
    }
  }
  EXPECT_EQ(with_counters, n.mig.size());
}

TEST(DraSlicesTest, LargePoolsAndTaintsStayWithinTheApisLimits) {
  std::vector<gpu::Gpu> gpus;
  for (unsigned i = 0; i < 300; ++i) {
    gpu::Gpu g;
    g.index = i;
    g.minor = i;
    g.uuid = "GPU-" + std::to_string(i);
    g.name = "NVIDIA H100 80GB HBM3 with a product name longer than sixty-four characters in all";
    g.memory_mib = 81559;
    gpus.push_back(g);
  }
  gpu::Gpu broken;
  broken.index = 300;
  broken.error = "GPU is lost";
  gpus.push_back(broken);
  const auto inv = gpu::Inventory::FromPartsForTest(gpus, {});
  PoolOptions o;
  o.node_name = "big";
  o.taints[5] = {{a::kTaintXid, "48", "NoSchedule", ""}};
  auto slices = BuildPool(*inv, {}, o);
  ASSERT_TRUE(slices.ok()) << slices.status();
  ExpectValidPool(*slices, o);
  const auto devices = ByName(*slices);
  EXPECT_EQ(devices.size(), 300U);  // the GPU that could not be read is left out
  EXPECT_EQ(slices->size(), 5U);    // a tainted device: 64 a slice
  EXPECT_EQ(devices.at("gpu-5").taints, (std::vector<a::Taint>{{"gpu.nvidia.com/xid", "48", "NoSchedule", ""}}));
  EXPECT_TRUE(devices.at("gpu-6").taints.empty());
  o.taints.clear();
  slices = BuildPool(*inv, {}, o);
  ASSERT_TRUE(slices.ok());
  EXPECT_EQ(slices->size(), 3U);  // 128 a slice
  // A MIG-mode GPU whose profiles were not read is an error naming it, not a silent gap.
  gpus[0].mig_enabled = true;
  const auto mig_inv = gpu::Inventory::FromPartsForTest(gpus, {});
  const auto refused = BuildPool(*mig_inv, {}, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("GPU 0 (GPU-0) is in MIG mode"), std::string::npos) << refused.status();
}

TEST(DraSlicesTest, SliceNamesStayValidAndDistinctForLongNodeNames) {
  EXPECT_EQ(SliceName("node-a", "gpu.nvidia.com", 0), "node-a-gpu.nvidia.com-0");
  // 253 characters in labels of 63: too long with the driver, and the last label would grow past 63.
  std::string node =
      std::string(63, 'a') + "." + std::string(63, 'b') + "." + std::string(63, 'c') + "." + std::string(61, 'd');
  ASSERT_TRUE(a::IsDnsSubdomain(node));
  std::string other = node;
  other.back() = 'e';
  const std::string name = SliceName(node, "gpu.nvidia.com", 12);
  EXPECT_LE(name.size(), 253U);
  EXPECT_TRUE(a::IsDnsSubdomain(name)) << name;
  EXPECT_EQ(name.substr(name.size() - 18), "-gpu.nvidia.com-12");
  EXPECT_NE(name, SliceName(other, "gpu.nvidia.com", 12));
  // One label of 60: the node's label and "-gpu" would be 64.
  const std::string label60(60, 'x');
  EXPECT_TRUE(a::IsDnsSubdomain(SliceName(label60, "gpu.nvidia.com", 0))) << SliceName(label60, "gpu.nvidia.com", 0);
}

// ---- NodePrepareResources / NodeUnprepareResources (src/dra/prepare.h)

namespace prep {

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::FakeApiServerOptions o;
    o.git_version = "v1.34.2";
    api_ = std::make_unique<testing::FakeApiServer>(o);
    ASSERT_TRUE(api_->Start().ok());
    k8s::Config c;
    c.server = api_->url();
    auto client = k8s::Client::Create(c);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    dir_ = sim_.dir();
    node_ = Discover(sim_);
    ASSERT_TRUE(node_.inv);
    opts_.driver = a::kDriver;
    opts_.node_name = "node-a";
    opts_.plugin_dir = dir_ + "/plugin";
    opts_.cdi_dir = dir_ + "/cdi";
    opts_.cuda_shared_root = dir_ + "/cuda";
    opts_.mig = node_.mig;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Preparer> Make() {
    auto p = Preparer::Create(client_, node_.inv, opts_);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(*p) : nullptr;
  }

  // Creates a claim with one request and allocates `results` to it; returns its UID.
  std::string Claim(const std::string& name, const json& results, const json& config = json::array()) {
    const json claim = {
        {"apiVersion", "resource.k8s.io/v1"},
        {"kind", "ResourceClaim"},
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec",
         {{"devices", {{"requests", {{{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu.nvidia.com"}}}}}}}}}}};
    auto created = api_->Create("resourceclaims", "default", claim);
    EXPECT_EQ(created.code, 201) << created.body.dump();
    json allocated = created.body;
    allocated["status"] = {{"allocation", {{"devices", {{"results", results}, {"config", config}}}}}};
    auto updated = api_->Update("resourceclaims", "default", allocated);
    EXPECT_EQ(updated.code, 200) << updated.body.dump();
    return created.body["metadata"].value("uid", "");
  }
  json Result(const std::string& device, const json& consumed = nullptr) {
    json r = {{"request", "gpu"}, {"driver", a::kDriver}, {"pool", "node-a"}, {"device", device}};
    if (!consumed.is_null()) {
      r["consumedCapacity"] = consumed;
      r["shareID"] = "7b4f0c8e-8d1a-4b8e-9d3e-1f2a3b4c5d6e";
    }
    return r;
  }
  json Spec(const Preparer& p, const std::string& uid) {
    std::ifstream in(p.SpecPath(uid));
    return in ? json::parse(in, nullptr, false) : json();
  }
  const gpu::Gpu& Gpu(unsigned i) { return node_.inv->gpus()[i]; }

  SimNode sim_{"l4x4"};
  std::string dir_;
  Node node_;
  std::unique_ptr<testing::FakeApiServer> api_;
  std::shared_ptr<k8s::Client> client_;
  PrepareOptions opts_;
};

TEST_F(PrepareTest, AWholeGpuGetsItsDeviceNodesThroughCdiAndSurvivesARestart) {
  auto p = Make();
  ASSERT_TRUE(p);
  const std::string dev = a::GpuDeviceName(Gpu(1).minor);
  const std::string uid = Claim("one-gpu", json::array({Result(dev)}));
  const ClaimRef ref{"default", uid, "one-gpu"};
  auto got = p->Prepare(ref);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1U);
  EXPECT_EQ((*got)[0], (PreparedDevice{{"gpu"}, "node-a", dev, {"k8s.gpu.nvidia.com/claim=" + uid + "-" + dev}, ""}));
  const json spec = Spec(*p, uid);
  ASSERT_TRUE(spec.is_object()) << p->SpecPath(uid);
  EXPECT_EQ(spec["kind"], "k8s.gpu.nvidia.com/claim");
  EXPECT_EQ(p->SpecPath(uid), opts_.cdi_dir + "/k8s.gpu.nvidia.com-claim_" + uid + ".json");
  const json& edits = spec["devices"][0]["containerEdits"];
  EXPECT_EQ(spec["devices"][0]["name"], uid + "-" + dev);
  EXPECT_EQ(edits["deviceNodes"][0]["path"], "/dev/nvidia" + std::to_string(Gpu(1).minor));
  EXPECT_EQ(edits["env"], json::array({"NVIDIA_VISIBLE_DEVICES=" + Gpu(1).uuid}));
  EXPECT_FALSE(edits.contains("mounts"));
  // Asked again, and after a restart with the claim gone from the API server: the same answer,
  // from the checkpoint.
  auto again = p->Prepare(ref);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *got);
  EXPECT_EQ(api_->Delete("resourceclaims", "default", "one-gpu").code, 200);
  p.reset();
  auto restarted = Make();
  ASSERT_TRUE(restarted);
  EXPECT_EQ(restarted->Prepared(), std::vector<std::string>{uid});
  auto after = restarted->Prepare(ref);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *got);
  // Unprepare removes what prepare made; again, and for a claim never seen, it is a no-op.
  ASSERT_TRUE(restarted->Unprepare(ref).ok());
  EXPECT_FALSE(std::filesystem::exists(restarted->SpecPath(uid)));
  EXPECT_TRUE(restarted->Prepared().empty());
  EXPECT_TRUE(restarted->Unprepare(ref).ok());
  EXPECT_TRUE(restarted->Unprepare({"default", "no-such-uid", "gone"}).ok());
}

TEST_F(PrepareTest, AShareIsHeldToItsConsumedCapacityByTheInterposer) {
  opts_.shared_gpus = {0};
  opts_.cuda_interposer = dir_ + "/libkgpu-cuda.so";
  std::ofstream(opts_.cuda_interposer) << "not a library";
  auto p = Make();
  ASSERT_TRUE(p);
  const std::string dev = a::GpuDeviceName(Gpu(0).minor);
  const std::string uid = Claim("share", json::array({Result(dev, {{"memory", "20Gi"}, {"cores", "30"}})}));
  auto got = p->Prepare({"default", uid, "share"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].share_id, "7b4f0c8e-8d1a-4b8e-9d3e-1f2a3b4c5d6e");
  const json edits = Spec(*p, uid)["devices"][0]["containerEdits"];
  const auto env = edits["env"].get<std::vector<std::string>>();
  auto has = [&](const std::string& e) { return std::find(env.begin(), env.end(), e) != env.end(); };
  EXPECT_TRUE(has("KGPU_CUDA_MEMORY_LIMIT=" + Gpu(0).uuid + "=20480Mi")) << edits.dump();
  EXPECT_TRUE(has("KGPU_CUDA_CORE_LIMIT=" + Gpu(0).uuid + "=30")) << edits.dump();
  EXPECT_TRUE(has("LD_PRELOAD=/usr/lib/kgpu/libkgpu-cuda.so")) << edits.dump();
  // The claim's own accounting directory, with its limits in `config`.
  const std::string region = opts_.cuda_shared_root + "/dra/" + uid;  // the claim's one region
  std::ifstream config(region + "/config");
  std::string text((std::istreambuf_iterator<char>(config)), {});
  EXPECT_NE(text.find("memory " + Gpu(0).uuid + " " + std::to_string(20ULL << 30)), std::string::npos) << text;
  EXPECT_NE(text.find("cores " + Gpu(0).uuid + " 30"), std::string::npos) << text;
  bool mounted = false;
  for (const auto& m : edits["mounts"]) mounted = mounted || m["hostPath"] == region;
  EXPECT_TRUE(mounted) << edits["mounts"].dump();
  ASSERT_TRUE(p->Unprepare({"default", uid, "share"}).ok());
  EXPECT_FALSE(std::filesystem::exists(opts_.cuda_shared_root + "/dra/" + uid));
}

TEST_F(PrepareTest, SeveralSharesOfOneClaimShareOneRegionWithEveryLimit) {
  opts_.shared_gpus = {0, 1};
  opts_.cuda_interposer = dir_ + "/libkgpu-cuda.so";
  std::ofstream(opts_.cuda_interposer) << "x";
  auto p = Make();
  ASSERT_TRUE(p);
  const std::string d0 = a::GpuDeviceName(Gpu(0).minor), d1 = a::GpuDeviceName(Gpu(1).minor);
  // Two shares of GPU 0 (consumable capacity allows it) and one of GPU 1.
  const std::string uid = Claim("three", json::array({Result(d0, {{"memory", "1Gi"}, {"cores", "10"}}),
                                                      Result(d0, {{"memory", "2Gi"}, {"cores", "20"}}),
                                                      Result(d1, {{"memory", "3Gi"}, {"cores", "30"}})}));
  auto got = p->Prepare({"default", uid, "three"});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 3U);
  EXPECT_NE((*got)[0].cdi_ids[0], (*got)[1].cdi_ids[0]);  // the same GPU twice: two CDI devices
  const json spec = Spec(*p, uid);
  std::set<std::string> names;
  for (const auto& d : spec["devices"]) names.insert(d["name"]);
  EXPECT_EQ(names.size(), 3U);
  for (const auto& d : spec["devices"]) {
    const auto env = d["containerEdits"]["env"].get<std::vector<std::string>>();
    bool both = false;
    for (const auto& e : env) {
      both =
          both || (e.rfind("KGPU_CUDA_MEMORY_LIMIT=", 0) == 0 && e.find(Gpu(0).uuid + "=3072Mi") != std::string::npos &&
                   e.find(Gpu(1).uuid + "=3072Mi") != std::string::npos);
    }
    EXPECT_TRUE(both) << d.dump();  // every share device carries every limit of the claim
  }
  std::ifstream config(opts_.cuda_shared_root + "/dra/" + uid + "/config");
  const std::string text((std::istreambuf_iterator<char>(config)), {});
  EXPECT_NE(text.find("memory " + Gpu(0).uuid + " " + std::to_string(3ULL << 30)), std::string::npos) << text;
  EXPECT_NE(text.find("cores " + Gpu(0).uuid + " 30"), std::string::npos) << text;
  EXPECT_NE(text.find("memory " + Gpu(1).uuid + " " + std::to_string(3ULL << 30)), std::string::npos) << text;
  ASSERT_TRUE(p->Unprepare({"default", uid, "three"}).ok());
  EXPECT_FALSE(std::filesystem::exists(opts_.cuda_shared_root + "/dra/" + uid));
}

TEST_F(PrepareTest, WhatCannotBeEnforcedOrDoesNotMatchIsRefusedWithTheReason) {
  opts_.shared_gpus = {0};  // and no interposer
  auto p = Make();
  ASSERT_TRUE(p);
  const std::string gpu0 = a::GpuDeviceName(Gpu(0).minor), gpu1 = a::GpuDeviceName(Gpu(1).minor);
  auto refused = [&](const std::string& uid, const std::string& name, const std::string& why) {
    auto got = p->Prepare({"default", uid, name});
    ASSERT_FALSE(got.ok()) << name;
    EXPECT_NE(got.status().message().find(why), std::string::npos) << got.status();
    EXPECT_FALSE(std::filesystem::exists(p->SpecPath(uid))) << name;
    EXPECT_TRUE(p->Prepared().empty());
  };
  refused(Claim("share", json::array({Result(gpu0, {{"memory", "1Gi"}, {"cores", "10"}})})), "share",
          "no CUDA interposer");
  refused(Claim("not-shared", json::array({Result(gpu1, {{"memory", "1Gi"}})})), "not-shared",
          "does not offer it for sharing");
  json other = Result(gpu1);
  other["pool"] = "node-z";
  refused(Claim("elsewhere", json::array({other})), "elsewhere", "allocated from pool node-z");
  refused(Claim("unknown", json::array({Result("gpu-99")})), "unknown", "this node has no device gpu-99");
  refused(Claim("mig", json::array({Result("gpu-0-mig-1g5gb-19-0")})), "mig", "the driver runs without --dynamic-mig");
  const json mps = {{{"source", "FromClaim"},
                     {"requests", json::array()},
                     {"opaque",
                      {{"driver", a::kDriver},
                       {"parameters",
                        {{"apiVersion", "resource.nvidia.com/v1beta1"},
                         {"kind", "GpuConfig"},
                         {"sharing", {{"strategy", "MPS"}}}}}}}}};
  refused(Claim("mps", json::array({Result(gpu1)}), mps), "mps", "sharing strategy 'MPS'");
  json odd = mps;
  odd[0]["opaque"]["parameters"]["sharing"] = "MPS";  // the user's JSON, not the API's shape
  refused(Claim("odd", json::array({Result(gpu1)}), odd), "odd", "has a sharing that is not {strategy: <name>}");
  const std::string uid = Claim("replaced", json::array({Result(gpu1)}));
  refused("another-uid", "replaced", "got replaced");
  (void)uid;
  refused("no-uid", "absent", "not found");
  // Not allocated.
  const json pending = {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", "pending"}, {"namespace", "default"}}},
      {"spec",
       {{"devices", {{"requests", {{{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu.nvidia.com"}}}}}}}}}}};
  const auto created = api_->Create("resourceclaims", "default", pending);
  refused(created.body["metadata"].value("uid", ""), "pending", "is not allocated");
}

TEST_F(PrepareTest, ACorruptCheckpointIsAnErrorNotAFreshStart) {
  std::filesystem::create_directories(opts_.plugin_dir);
  std::ofstream(opts_.plugin_dir + "/checkpoint.json") << "{\"claims\": ";
  auto p = Preparer::Create(client_, node_.inv, opts_);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(p.status().message().find("checkpoint.json: not a kgpu DRA checkpoint"), std::string::npos) << p.status();
}

TEST(PrepareMigTest, AStaticMigInstanceGetsItsCapabilityNodes) {
  SimNode sim("dgx-a100-mig");
  ASSERT_EQ(sim.Ctl("mig-minors " + sim.dir() + "/mig-minors"), 0);
  const Node n = Discover(sim);
  ASSERT_TRUE(n.inv);
  testing::FakeApiServerOptions o;
  o.git_version = "v1.34.2";
  testing::FakeApiServer api(o);
  ASSERT_TRUE(api.Start().ok());
  k8s::Config c;
  c.server = api.url();
  std::shared_ptr<k8s::Client> client = std::move(*k8s::Client::Create(c));
  PrepareOptions opts;
  opts.driver = a::kDriver;
  opts.node_name = "node-b";
  opts.plugin_dir = sim.dir() + "/plugin";
  opts.cdi_dir = sim.dir() + "/cdi";
  opts.mig = n.mig;
  std::ifstream minors_file(sim.dir() + "/mig-minors");
  const std::string minors_text((std::istreambuf_iterator<char>(minors_file)), {});
  auto minors = gpu::ParseMigMinors(minors_text, "mig-minors");
  ASSERT_TRUE(minors.ok()) << minors.status();
  opts.mig_minors = *minors;
  const gpu::Gpu* g = nullptr;
  for (const auto& x : n.inv->gpus()) {
    if (x.mig_enabled && !x.migs.empty()) g = &x;
  }
  ASSERT_NE(g, nullptr);
  const std::string dev = StaticMigName(*g, g->migs[0], n.mig.at(g->index));
  ASSERT_FALSE(dev.empty());
  const json claim = {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", "mig"}, {"namespace", "default"}}},
      {"spec",
       {{"devices", {{"requests", {{{"name", "mig"}, {"exactly", {{"deviceClassName", "mig.nvidia.com"}}}}}}}}}}};
  json created = api.Create("resourceclaims", "default", claim).body;
  created["status"] = {
      {"allocation",
       {{"devices",
         {{"results", {{{"request", "mig"}, {"driver", a::kDriver}, {"pool", "node-b"}, {"device", dev}}}}}}}}};
  ASSERT_EQ(api.Update("resourceclaims", "default", created).code, 200);
  auto p = Preparer::Create(client, n.inv, opts);
  ASSERT_TRUE(p.ok());
  const std::string uid = created["metadata"]["uid"];
  auto got = (*p)->Prepare({"default", uid, "mig"});
  ASSERT_TRUE(got.ok()) << got.status();
  std::ifstream in((*p)->SpecPath(uid));
  const json spec = json::parse(in);
  const json& edits = spec["devices"][0]["containerEdits"];
  std::vector<std::string> paths;
  for (const auto& d : edits["deviceNodes"]) paths.push_back(d["path"]);
  const auto caps = gpu::MigCapNodes(*minors, g->minor, g->migs[0].gi, g->migs[0].ci);
  ASSERT_EQ(caps.size(), 2U);
  for (const auto& cap : caps) EXPECT_NE(std::find(paths.begin(), paths.end(), cap), paths.end()) << cap;
  EXPECT_EQ(edits["env"], json::array({"NVIDIA_VISIBLE_DEVICES=" + g->migs[0].uuid}));
}

// --dynamic-mig: the placement a claim was allocated is carved at prepare and destroyed at
// unprepare; what no prepared claim carved is destroyed when the driver starts; a placement that
// overlaps a carved one fails with NVML's reason and leaves nothing behind.
TEST(PrepareMigTest, DynamicMigCarvesAtPrepareAndDestroysAtUnprepare) {
  SimNode sim("dgx-a100-mig");
  ASSERT_EQ(sim.Ctl("mig-minors " + sim.dir() + "/mig-minors"), 0);
  Node n = Discover(sim);
  ASSERT_TRUE(n.inv);
  std::shared_ptr<const nvml::Library> lib = std::move(n.lib);
  testing::FakeApiServerOptions o;
  o.git_version = "v1.35.0";
  testing::FakeApiServer api(o);
  ASSERT_TRUE(api.Start().ok());
  k8s::Config c;
  c.server = api.url();
  std::shared_ptr<k8s::Client> client = std::move(*k8s::Client::Create(c));
  PrepareOptions opts;
  opts.driver = a::kDriver;
  opts.node_name = "node-b";
  opts.plugin_dir = sim.dir() + "/plugin";
  opts.cdi_dir = sim.dir() + "/cdi";
  opts.mig = n.mig;
  opts.dynamic_mig = true;
  std::ifstream minors_file(sim.dir() + "/mig-minors");
  opts.mig_minors = *gpu::ParseMigMinors(std::string((std::istreambuf_iterator<char>(minors_file)), {}), "mig-minors");
  const unsigned gi_index = n.mig.begin()->first;
  const gpu::Gpu& g = n.inv->gpus()[gi_index];
  const gpu::MigCatalog& cat = n.mig.at(gi_index);
  auto instances = [&] {
    auto gis = lib->GpuInstances(g.handle);
    EXPECT_TRUE(gis.ok());
    return gis.ok() ? gis->size() : 0;
  };
  ASSERT_GT(instances(), 0U);  // the profile's static instances
  auto p = Preparer::Create(client, n.inv, opts, lib);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(instances(), 0U);  // no prepared claim carved them: the driver owns MIG here
  // The smallest profile at its first placement, and the largest (overlapping it).
  const auto& small = cat.profiles.front();
  const auto& large = cat.profiles.back();
  const std::string small_name = a::MigDeviceName(g.minor, small.name, small.profile.id, small.placements[0].start);
  const std::string large_name = a::MigDeviceName(g.minor, large.name, large.profile.id, large.placements[0].start);
  auto claim = [&](const std::string& name, const std::string& device) {
    const json obj = {
        {"apiVersion", "resource.k8s.io/v1"},
        {"kind", "ResourceClaim"},
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec",
         {{"devices", {{"requests", {{{"name", "mig"}, {"exactly", {{"deviceClassName", "mig.nvidia.com"}}}}}}}}}}};
    json created = api.Create("resourceclaims", "default", obj).body;
    const json result = {{"request", "mig"}, {"driver", a::kDriver}, {"pool", "node-b"}, {"device", device}};
    created["status"]["allocation"]["devices"]["results"] = json::array({result});
    EXPECT_EQ(api.Update("resourceclaims", "default", created).code, 200);
    return created["metadata"].value("uid", "");
  };
  const std::string uid = claim("small", small_name);
  auto got = (*p)->Prepare({"default", uid, "small"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(instances(), 1U);
  std::ifstream in((*p)->SpecPath(uid));
  const json edits = json::parse(in)["devices"][0]["containerEdits"];
  const std::string env = edits["env"][0];
  EXPECT_EQ(env.rfind("NVIDIA_VISIBLE_DEVICES=MIG-", 0), 0U) << env;
  EXPECT_EQ(edits["deviceNodes"].size(), 6U) << edits.dump();  // the GPU, ctl, uvm x2, GI and CI access
  // The largest profile overlaps it: NVML refuses, nothing is left behind.
  const std::string other = claim("large", large_name);
  auto refused = (*p)->Prepare({"default", other, "large"});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("carving " + large.name), std::string::npos) << refused.status();
  EXPECT_EQ(instances(), 1U);
  EXPECT_FALSE(std::filesystem::exists((*p)->SpecPath(other)));
  // A restart keeps what a prepared claim carved.
  p->reset();
  auto restarted = Preparer::Create(client, n.inv, opts, lib);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(instances(), 1U);
  ASSERT_TRUE((*restarted)->Unprepare({"default", uid, "small"}).ok());
  EXPECT_EQ(instances(), 0U);
  auto now = (*restarted)->Prepare({"default", other, "large"});
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(instances(), 1U);
  // A placement that an instance of the start-up snapshot had (destroyed by Create): carved anew,
  // not taken for the instance that is gone.
  ASSERT_TRUE((*restarted)->Unprepare({"default", other, "large"}).ok());
  EXPECT_EQ(instances(), 0U);
  const std::string stale_name = StaticMigName(g, g.migs[0], cat);
  ASSERT_FALSE(stale_name.empty());
  const std::string again = claim("stale", stale_name);
  auto stale = (*restarted)->Prepare({"default", again, "stale"});
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(instances(), 1U);
}

}  // namespace prep

}  // namespace
}  // namespace kgpu::dra
