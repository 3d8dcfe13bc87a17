// MIG layouts (config, resolution, planning and applying through the simulated NVML) and MPS
// (plan rules, daemon limits, per-container limits, same-GPU preference).

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "absl/strings/escaping.h"
#include "deviceplugin/allocator.h"
#include "deviceplugin/config.h"
#include "deviceplugin/interposer.h"
#include "deviceplugin/mps.h"
#include "deviceplugin_v1beta1.pb.h"
#include "gpu/mig_layout.h"
#include "kubelet/checkpoint.h"
#include "testing/kubelet_checkpoint.h"
#include "testing/sim_plan.h"

namespace kgpu {
namespace {

using deviceplugin::Config;
using deviceplugin::ParseConfig;
using Node = testing::SimPlan;

constexpr char kLayouts[] = R"(version: v1
mig:
  rescanInterval: 250ms
  layouts:
    balanced:
      - devices: [1]
        mig-devices: {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}
    all-1g:
      - devices: all
        mig-enabled: true
        mig-devices: {"1g.5gb": 7}
    off:
      - devices: [0, 1]
        mig-enabled: false
  nodes:
    "dgx-*": balanced
    "*": all-1g
)";

std::vector<std::string> Profiles(const gpu::Gpu& g) {
  std::vector<std::string> out;
  for (const auto& m : g.migs) out.push_back(m.profile);
  std::sort(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------- config

TEST(MigConfigTest, LayoutsAndNodes) {
  auto c = ParseConfig(kLayouts, "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mig.rescan_interval, std::chrono::milliseconds(250));
  ASSERT_EQ(c->mig.layouts.size(), 3u);
  const auto& balanced = c->mig.layouts.at("balanced");
  ASSERT_EQ(balanced.size(), 1u);
  EXPECT_EQ(balanced[0].devices, (std::vector<unsigned>{1}));
  EXPECT_EQ(balanced[0].mig_devices,
            (std::vector<std::pair<std::string, int>>{{"3g.20gb", 1}, {"2g.10gb", 1}, {"1g.5gb", 2}}));
  EXPECT_TRUE(c->mig.layouts.at("all-1g")[0].devices.empty());
  EXPECT_FALSE(c->mig.layouts.at("off")[0].mig_enabled);
  EXPECT_EQ(*deviceplugin::LayoutForNode(c->mig, "dgx-07"), "balanced");
  EXPECT_EQ(*deviceplugin::LayoutForNode(c->mig, "worker"), "all-1g");
  Config none;
  auto missing = deviceplugin::LayoutForNode(none.mig, "worker");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("no mig.nodes pattern matches node 'worker'"),
            std::string::npos);
}

TEST(MigConfigTest, ErrorsNamePlaceAndFix) {
  const std::map<std::string, std::string> cases = {
      {"mig:\n  layouts:\n    a:\n      - devices: [x]\n",
       "c.yaml:4:19: mig.layouts.a[0].devices[] must be an integer from 0 to 1023 (got 'x')"},
      {"mig:\n  layouts:\n    a:\n      - mig-devices: {1g.5gb: 7}\n",
       "c.yaml:4:9: mig.layouts.a[0].devices is required (all, or a list of GPU indices)"},
      {"mig:\n  layouts:\n    a:\n      - {devices: all, mig-devices: {1g.5gb: 9}}\n",
       "c.yaml:4:46: mig.layouts.a[0].mig-devices.1g.5gb must be an integer from 0 to 7 (got 9, out of range)"},
      {"mig:\n  layouts:\n    a:\n      - {devices: all, mig-enabled: false, mig-devices: {1g.5gb: 1}}\n",
       "c.yaml:4:9: mig.layouts.a[0] has mig-enabled: false and mig-devices; drop one of them"},
      {"mig:\n  layouts:\n    a: [{devices: all}]\n  nodes:\n    \"*\": b\n",
       "c.yaml:5:10: mig.nodes.*: no layout 'b' in mig.layouts"},
      {"mig:\n  rescanInterval: soon\n",
       "c.yaml:2:19: mig.rescanInterval must be a duration such as 30s, 5m or 1h (got 'soon')"},
      {"mig:\n  layout: a\n", "c.yaml:2:3: unknown key 'layout' in mig"},
  };
  for (const auto& [yaml, want] : cases) {
    auto c = ParseConfig(yaml, "c.yaml");
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_EQ(std::string(c.status().message()).substr(0, want.size()), want) << c.status();
  }
}

// ---------------------------------------------------------------- layouts through NVML

// One simulated node per process at a time: the NVML library is loaded once, so every Node in a
// test lives in its own scope.
TEST(MigLayoutTest, ResolveChecksGpus) {
  {
    Node n("dgx-a100-mig");
    gpu::MigLayout bad_index = {{{9}, true, {{"1g.5gb", 1}}}};
    auto r = gpu::ResolveMigLayout(bad_index, *n.inv, "x");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(std::string(r.status().message()), "MIG layout 'x' entry 0: this node has no GPU 9 (it has 8 GPUs)");
    gpu::MigLayout twice = {{{1}, true, {}}, {{}, true, {}}};
    r = gpu::ResolveMigLayout(twice, *n.inv, "x");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(std::string(r.status().message()).find("selects GPU 1, which entry 0 selects too"), std::string::npos);
  }
  Node l4("l4x4");
  gpu::MigLayout on_l4 = {{{}, true, {{"1g.6gb", 4}}}};
  auto r = gpu::ResolveMigLayout(on_l4, *l4.inv, "x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("which cannot do MIG"), std::string::npos);
}

TEST(MigLayoutTest, PlansPlacementsAppliesAndIsIdempotent) {
  Node n("dgx-a100-mig");
  auto c = ParseConfig(kLayouts, "c.yaml");
  ASSERT_TRUE(c.ok());
  auto targets = gpu::ResolveMigLayout(c->mig.layouts.at("balanced"), *n.inv, "balanced");
  ASSERT_TRUE(targets.ok()) << targets.status();
  ASSERT_EQ(targets->size(), 1u);
  const gpu::Gpu& g1 = n.inv->gpus()[1];
  auto change = gpu::PlanMigChange(*n.lib, g1, (*targets)[0]);
  ASSERT_TRUE(change.ok()) << change.status();
  EXPECT_EQ(change->current, std::vector<std::string>(7, "1g.5gb"));
  EXPECT_FALSE(change->noop());
  // 3g + 2g + 1g + 1g fits only with the 3g instance on memory slices 4-7.
  ASSERT_EQ(change->create.size(), 4u);
  EXPECT_EQ(change->create[0].name, "3g.20gb");
  EXPECT_EQ(change->create[0].placement, (nvml::Placement{4, 4}));
  auto applied = gpu::ApplyMigChange(*n.lib, g1, *change);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_FALSE(applied->pending_reset);
  n.Rediscover();
  EXPECT_EQ(Profiles(n.inv->gpus()[1]), (std::vector<std::string>{"1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"}));
  for (const auto& m : n.inv->gpus()[1].migs) EXPECT_EQ(m.ci_slices, m.gi_slices) << m.profile;
  // Applying the same layout again changes nothing.
  auto again = gpu::PlanMigChange(*n.lib, n.inv->gpus()[1], (*targets)[0]);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->noop());
}

TEST(MigLayoutTest, EnablesAndDisablesMigMode) {
  Node n("dgx-a100-mig");
  const gpu::MigTarget enable{2, true, {"4g.20gb", "2g.10gb", "1g.5gb"}};
  auto change = gpu::PlanMigChange(*n.lib, n.inv->gpus()[2], enable);
  ASSERT_TRUE(change.ok()) << change.status();
  EXPECT_TRUE(change->set_mode);
  auto applied = gpu::ApplyMigChange(*n.lib, n.inv->gpus()[2], *change);
  ASSERT_TRUE(applied.ok()) << applied.status();
  n.Rediscover();
  EXPECT_TRUE(n.inv->gpus()[2].mig_enabled);
  EXPECT_EQ(Profiles(n.inv->gpus()[2]), (std::vector<std::string>{"1g.5gb", "2g.10gb", "4g.20gb"}));
  const gpu::MigTarget disable{2, false, {}};
  change = gpu::PlanMigChange(*n.lib, n.inv->gpus()[2], disable);
  ASSERT_TRUE(change.ok());
  applied = gpu::ApplyMigChange(*n.lib, n.inv->gpus()[2], *change);
  ASSERT_TRUE(applied.ok()) << applied.status();
  n.Rediscover();
  EXPECT_FALSE(n.inv->gpus()[2].mig_enabled);
  EXPECT_TRUE(n.inv->gpus()[2].migs.empty());
}

TEST(MigLayoutTest, RefusesWhatCannotExist) {
  Node n("dgx-a100-mig");
  const gpu::Gpu& g = n.inv->gpus()[1];
  auto unknown = gpu::PlanMigChange(*n.lib, g, {1, true, {"1g.10gb+gfx"}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(std::string(unknown.status().message())
                .find("has no MIG profile '1g.10gb+gfx'; its profiles are 1g.5gb, 2g.10gb"),
            std::string::npos)
      << unknown.status();
  auto too_many = gpu::PlanMigChange(*n.lib, g, {1, true, {"3g.20gb", "3g.20gb", "3g.20gb"}});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(std::string(too_many.status().message()).find("at most 2 3g.20gb instance(s)"), std::string::npos);
  auto compute = gpu::PlanMigChange(*n.lib, g, {1, true, {"4g.20gb", "3g.20gb", "1g.5gb"}});
  ASSERT_FALSE(compute.ok());
  EXPECT_NE(std::string(compute.status().message()).find("need 8 compute slices; GPU 1 has 7"), std::string::npos);
  auto no_fit = gpu::PlanMigChange(*n.lib, g, {1, true, {"1g.10gb", "1g.10gb", "1g.10gb", "3g.20gb"}});
  ASSERT_FALSE(no_fit.ok());
  EXPECT_NE(std::string(no_fit.status().message()).find("do not fit GPU 1 together"), std::string::npos);
  // Nothing was changed by the refused plans.
  n.Rediscover();
  EXPECT_EQ(Profiles(n.inv->gpus()[1]), std::vector<std::string>(7, "1g.5gb"));
}

// A process in one instance makes NVML refuse to destroy it part way: the instances destroyed
// before it are recreated, and the error says so.
TEST(MigLayoutTest, FailedDestroyRestoresThePreviousInstances) {
  Node n("dgx-a100-mig");
  const gpu::Gpu& g1 = n.inv->gpus()[1];
  const unsigned last_gi = g1.migs.back().gi;
  ASSERT_EQ(n.sim.Ctl("proc add 1 777 --mem 100 --gi " + std::to_string(last_gi) + " --ci 0"), 0);
  auto change = gpu::PlanMigChange(*n.lib, g1, {1, true, {"7g.40gb"}});
  ASSERT_TRUE(change.ok()) << change.status();
  auto applied = gpu::ApplyMigChange(*n.lib, g1, *change);
  ASSERT_FALSE(applied.ok());
  EXPECT_NE(std::string(applied.status().message()).find("the previous instances were restored"), std::string::npos)
      << applied.status();
  n.Rediscover();
  EXPECT_EQ(Profiles(n.inv->gpus()[1]), std::vector<std::string>(7, "1g.5gb"));
  for (const auto& m : n.inv->gpus()[1].migs) EXPECT_EQ(m.ci_slices, m.gi_slices);
}

TEST(MigLayoutTest, FingerprintSeesARepartition) {
  Node n("dgx-a100-mig");
  EXPECT_EQ(gpu::MigFingerprint(*n.inv), gpu::MigFingerprintNow(*n.lib, *n.inv));
  auto change = gpu::PlanMigChange(*n.lib, n.inv->gpus()[1], {1, true, {"7g.40gb"}});
  ASSERT_TRUE(change.ok()) << change.status();
  ASSERT_TRUE(gpu::ApplyMigChange(*n.lib, n.inv->gpus()[1], *change).ok());
  EXPECT_NE(gpu::MigFingerprint(*n.inv), gpu::MigFingerprintNow(*n.lib, *n.inv));
  n.Rediscover();
  EXPECT_EQ(gpu::MigFingerprint(*n.inv), gpu::MigFingerprintNow(*n.lib, *n.inv));
}

TEST(KubeletCheckpointTest, RegisteredResources) {
  auto names = kubelet::RegisteredResources(
      kgpu::testing::SignedCheckpoint(
          R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/mig-2g.10gb":["MIG-a"],"nvidia.com/gpu":[]}}})"),
      "cp");
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(std::set<std::string>(names->begin(), names->end()),
            (std::set<std::string>{"nvidia.com/mig-2g.10gb", "nvidia.com/gpu"}));
  auto bad = kubelet::RegisteredResources(R"({"Data":{"RegisteredDevices":[1]}})", "cp");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(std::string(bad.status().message()),
            "cp: Data.RegisteredDevices is a array, expected an object of resource name -> device IDs");
  EXPECT_FALSE(kubelet::RegisteredResources("{", "cp").ok());
}

// ---------------------------------------------------------------- time-slicing, memoryIsolation hard

// Each replica's container is held to the GPU's memory / replicas by the CUDA interposer: the
// limit per GPU it asked replicas of, the library mounted read-only from the plugin's host path,
// and an accounting directory of its own (0777) under the shared root.
TEST(TimeSlicingHardTest, EachReplicaGetsItsShareOfMemory) {
  Node n("dgx-h100");
  auto plan = n.PlanFor(
      "sharing:\n  timeSlicing:\n    memoryIsolation: hard\n"
      "    failRequestsGreaterThanOne: false\n    resources:\n    - {name: gpu, replicas: 4}\n");
  ASSERT_NE(plan, nullptr);
  const auto& r = plan->resources[0];
  EXPECT_TRUE(r.hard_memory);
  EXPECT_FALSE(r.mps);
  const std::string root = ::testing::TempDir() + "/kgpu-ts-hard";
  n.config.cuda_interposer = "/var/lib/kgpu/isolation/0.1.0/libkgpu-cuda.so";
  n.config.cuda_shared_root = root;
  const std::string u0 = n.inv->gpus()[0].uuid, u1 = n.inv->gpus()[1].uuid;
  const uint64_t mib0 = n.inv->gpus()[0].memory_mib, mib1 = n.inv->gpus()[1].memory_mib;
  auto a = deviceplugin::Allocate(*plan, r, n.config, {u1 + "::0", u0 + "::2", u0 + "::3"}, "c1");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->envs.at("KGPU_CUDA_MEMORY_LIMIT"),
            u0 + "=" + std::to_string(mib0 * 2 / 4) + "Mi," + u1 + "=" + std::to_string(mib1 / 4) + "Mi");
  EXPECT_EQ(a->envs.at("LD_PRELOAD"), "/usr/lib/kgpu/libkgpu-cuda.so");
  EXPECT_EQ(a->envs.at("KGPU_CUDA_SHARED_DIR"), "/run/kgpu-cuda");
  // The accounting directory read-only with the limits in its config, the region file
  // read-write over it: no process of the container can change either.
  EXPECT_EQ(a->mounts, (std::vector<deviceplugin::MountSpec>{
                           {"/usr/lib/kgpu/libkgpu-cuda.so", "/var/lib/kgpu/isolation/0.1.0/libkgpu-cuda.so", true},
                           {"/run/kgpu-cuda", root + "/timeslicing/c1", true},
                           {"/run/kgpu-cuda/kgpu-cuda.region", root + "/timeslicing/c1/kgpu-cuda.region", false}}));
  struct stat st {};
  ASSERT_EQ(::stat((root + "/timeslicing/c1/kgpu-cuda.region").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  ASSERT_EQ(::stat((root + "/timeslicing/c1/config").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
  {
    std::ifstream config(root + "/timeslicing/c1/config");
    std::stringstream text;
    text << config.rdbuf();
    EXPECT_NE(text.str().find("memory " + u0 + " " + std::to_string((mib0 * 2 / 4) << 20) + "\n"), std::string::npos)
        << text.str();
    EXPECT_NE(text.str().find("memory " + u1 + " " + std::to_string((mib1 / 4) << 20) + "\n"), std::string::npos)
        << text.str();
    EXPECT_EQ(text.str().find("cores"), std::string::npos) << text.str();
  }

  // --cuda-interposer-load ld.so.preload: a file naming the library is mounted at
  // /etc/ld.so.preload instead of LD_PRELOAD (a process that clears its environment is still held).
  n.config.cuda_interposer_load = "ld.so.preload";
  auto f = deviceplugin::Allocate(*plan, r, n.config, {u0 + "::1"}, "c3");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->envs.count("LD_PRELOAD"), 0u);
  EXPECT_EQ(f->envs.at("KGPU_CUDA_SHARED_DIR"), "/run/kgpu-cuda");
  EXPECT_EQ(f->mounts, (std::vector<deviceplugin::MountSpec>{
                           {"/usr/lib/kgpu/libkgpu-cuda.so", "/var/lib/kgpu/isolation/0.1.0/libkgpu-cuda.so", true},
                           {"/etc/ld.so.preload", root + "/ld.so.preload", true},
                           {"/run/kgpu-cuda", root + "/timeslicing/c3", true},
                           {"/run/kgpu-cuda/kgpu-cuda.region", root + "/timeslicing/c3/kgpu-cuda.region", false}}));
  std::ifstream preload(root + "/ld.so.preload");
  std::stringstream text;
  text << preload.rdbuf();
  EXPECT_EQ(text.str(), "/usr/lib/kgpu/libkgpu-cuda.so\n");
  n.config.cuda_interposer_load = "envv";
  EXPECT_EQ(std::string(deviceplugin::Validate(n.config).message()),
            "--cuda-interposer-load (KGPU_CUDA_INTERPOSER_LOAD) 'envv' is invalid: use env or ld.so.preload");
  n.config.cuda_interposer_load = "env";

  // Without it, plain time-slicing changes nothing.
  auto plain = n.PlanFor("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n");
  ASSERT_NE(plain, nullptr);
  auto b = deviceplugin::Allocate(*plain, plain->resources[0], n.config, {u0 + "::1"}, "c2");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->envs.count("KGPU_CUDA_MEMORY_LIMIT"), 0u);
  EXPECT_TRUE(b->mounts.empty());
}

// The accounting directories of replicas go once no container in kubelet's checkpoint mounts
// them (Allocate names no pod: the checkpoint's Allocate responses are the link), once older than
// the grace period; a checkpoint that is missing or broken removes nothing; links are not followed.
TEST(TimeSlicingHardTest, DirectoriesNoContainerMountsAreSwept) {
  namespace fs = std::filesystem;
  Node n("dgx-h100");
  auto plan = n.PlanFor(
      "sharing:\n  timeSlicing:\n    memoryIsolation: hard\n"
      "    failRequestsGreaterThanOne: false\n    resources:\n    - {name: gpu, replicas: 4}\n");
  ASSERT_NE(plan, nullptr);
  const std::string root = ::testing::TempDir() + "/kgpu-ts-sweep";
  fs::remove_all(root);
  n.config.cuda_interposer = "/var/lib/kgpu/isolation/0.1.0/libkgpu-cuda.so";
  n.config.cuda_shared_root = root;
  const std::string u0 = n.inv->gpus()[0].uuid;
  // Three containers; kubelet's checkpoint keeps the responses of "kept" and "slash" (its root
  // spelled with a trailing slash when it was admitted), not that of "gone".
  std::map<std::string, std::string> resp;
  for (const std::string id : {"kept", "slash", "gone"}) {
    Config c = n.config;
    if (id == "slash") c.cuda_shared_root = root + "/";
    auto a = deviceplugin::Allocate(*plan, plan->resources[0], c, {u0 + "::0"}, id);
    ASSERT_TRUE(a.ok()) << a.status();
    v1beta1::ContainerAllocateResponse r;
    for (const auto& m : a->mounts) {
      auto* mount = r.add_mounts();
      mount->set_container_path(m.container_path);
      mount->set_host_path(m.host_path);
      mount->set_read_only(m.read_only);
    }
    resp[id] = absl::Base64Escape(r.SerializeAsString());
    ASSERT_TRUE(fs::is_directory(root + "/timeslicing/" + id));
    std::ofstream(root + "/timeslicing/" + id + "/region") << "x";
  }
  // In "gone", a link a container planted to a directory outside; beside them, a link to another.
  const std::string outside = ::testing::TempDir() + "/kgpu-ts-outside";
  fs::create_directories(outside);
  std::ofstream(outside + "/keep") << "x";
  fs::create_directory_symlink(outside, root + "/timeslicing/gone/escape");
  fs::create_directory_symlink(outside, root + "/timeslicing/link");
  const auto entry = [&](const std::string& id) {
    return nlohmann::json{{"PodUID", "uid-" + id},
                          {"ContainerName", "main"},
                          {"ResourceName", "nvidia.com/gpu"},
                          {"DeviceIDs", {{"0", {u0 + "::0"}}}},
                          {"AllocResp", resp[id]}};
  };
  const nlohmann::json doc = {
      {"Data",
       {{"PodDeviceEntries", {entry("kept"), entry("slash")}}, {"RegisteredDevices", nlohmann::json::object()}}}};
  const std::string cp = root + "/kubelet_internal_checkpoint";

  // Missing, unparsable, or with a checksum kubelet would refuse: nothing goes.
  auto missing = deviceplugin::SweepTimeslicingRegions(root, cp, std::chrono::seconds(0));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find(cp + ": the kubelet device-manager checkpoint does not exist"),
            std::string::npos)
      << missing.status();
  nlohmann::json edited = nlohmann::json::parse(testing::SignedCheckpoint(doc.dump()));
  edited["Data"]["PodDeviceEntries"].erase(1);  // edited after kubelet signed it
  std::ofstream(cp) << edited.dump();
  auto corrupt = deviceplugin::SweepTimeslicingRegions(root, cp, std::chrono::seconds(0));
  ASSERT_FALSE(corrupt.ok());
  EXPECT_NE(std::string(corrupt.status().message()).find("does not match its contents"), std::string::npos)
      << corrupt.status();
  nlohmann::json garbled = doc;
  garbled["Data"]["PodDeviceEntries"][0]["AllocResp"] = "not base64!";
  std::ofstream(cp) << testing::SignedCheckpoint(garbled.dump());
  auto bad = deviceplugin::SweepTimeslicingRegions(root, cp, std::chrono::seconds(0));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(std::string(bad.status().message()), cp + ": Data.PodDeviceEntries[0].AllocResp is not base64");
  EXPECT_TRUE(fs::is_directory(root + "/timeslicing/gone"));

  // Younger than the grace period: kept.
  std::ofstream(cp) << testing::SignedCheckpoint(doc.dump());
  auto young = deviceplugin::SweepTimeslicingRegions(root, cp, std::chrono::seconds(3600));
  ASSERT_TRUE(young.ok()) << young.status();
  EXPECT_EQ(*young, 0);
  // Older: "gone" goes (its link unlinked, not followed); the mounted ones and the link stay.
  auto swept = deviceplugin::SweepTimeslicingRegions(root, cp, std::chrono::seconds(0));
  ASSERT_TRUE(swept.ok()) << swept.status();
  EXPECT_EQ(*swept, 1);
  EXPECT_FALSE(fs::exists(root + "/timeslicing/gone"));
  EXPECT_TRUE(fs::exists(root + "/timeslicing/kept/region"));
  EXPECT_TRUE(fs::exists(root + "/timeslicing/slash/region"));
  EXPECT_TRUE(fs::is_symlink(root + "/timeslicing/link"));
  EXPECT_TRUE(fs::exists(outside + "/keep"));

  // kubelet forgets the pods: an empty checkpoint (null entries, as kubelet writes it) frees all.
  std::ofstream(cp) << testing::SignedCheckpoint(R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}}})");
  auto all = deviceplugin::SweepTimeslicingRegions(root, cp, std::chrono::seconds(0));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, 2);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(root + "/timeslicing")) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"link"});
  EXPECT_TRUE(fs::exists(outside + "/keep"));
  fs::remove_all(root);
  fs::remove_all(outside);
}

TEST(TimeSlicingHardTest, BadInputNamesTheFileAndTheFix) {
  auto mps =
      ParseConfig("sharing:\n  mps:\n    memoryIsolation: hard\n    resources: [{name: gpu, replicas: 2}]\n", "c.yaml");
  ASSERT_FALSE(mps.ok());
  EXPECT_EQ(std::string(mps.status().message()),
            "c.yaml:3:22: sharing.mps.memoryIsolation is for timeSlicing; MPS limits each client's memory itself "
            "(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)");
  auto typo = ParseConfig(
      "sharing:\n  timeSlicing:\n    memoryIsolation: hrad\n    resources: [{name: gpu, replicas: 2}]\n", "c.yaml");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(std::string(typo.status().message())
                .find("c.yaml:3:22: sharing.timeSlicing.memoryIsolation 'hrad' is invalid: want none or hard"),
            std::string::npos)
      << typo.status();
  auto no_lib = ParseConfig(
      "sharing:\n  timeSlicing:\n    memoryIsolation: hard\n    resources: [{name: gpu, replicas: 2}]\n", "c.yaml");
  ASSERT_TRUE(no_lib.ok()) << no_lib.status();
  EXPECT_EQ(
      std::string(deviceplugin::Validate(*no_lib).message()),
      "c.yaml:3:22: memoryIsolation hard needs the CUDA interposer: --cuda-interposer (KGPU_CUDA_INTERPOSER), the "
      "host path of libkgpu-cuda.so (docs/isolation.md)");
  no_lib->cuda_interposer = "/lib/x.so";
  EXPECT_TRUE(deviceplugin::Validate(*no_lib).ok());
}

// ---------------------------------------------------------------- MPS

std::string MpsConfig(const std::string& extra) {
  return "flags:\n  mpsRoot: /run/nvidia/mps\nsharing:\n  mps:\n" + extra +
         "    resources:\n    - {name: gpu, replicas: 4}\n";
}

TEST(MpsTest, OneReplicaGetsOneShare) {
  Node n("dgx-h100");
  auto plan = n.PlanFor(MpsConfig(""));
  ASSERT_NE(plan, nullptr);
  const auto& r = plan->resources[0];
  EXPECT_TRUE(r.mps);
  EXPECT_TRUE(r.fail_requests_greater_than_one);  // NVIDIA's default for MPS
  const uint64_t mib = n.inv->gpus()[0].memory_mib;
  auto limits = deviceplugin::DaemonLimits(*plan, r);
  ASSERT_EQ(limits.pinned_mib.size(), 8u);
  EXPECT_EQ(limits.pinned_mib[3], (std::pair<unsigned, uint64_t>{3, mib / 4}));
  EXPECT_EQ(limits.thread_percentage, 25);

  const std::string u0 = n.inv->gpus()[0].uuid;
  auto a = deviceplugin::Allocate(*plan, r, n.config, {u0 + "::2"}, "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->envs, (std::map<std::string, std::string>{
                         {"CUDA_MPS_PIPE_DIRECTORY", "/mps/nvidia.com/gpu/pipe"},
                         {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=" + std::to_string(mib / 4) + "M"},
                         {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"},
                         {"NVIDIA_VISIBLE_DEVICES", u0}}));
  EXPECT_EQ(a->mounts, (std::vector<deviceplugin::MountSpec>{
                           {"/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe", false},
                           {"/dev/shm", "/run/nvidia/mps/shm", false}}));
  auto three = deviceplugin::Allocate(*plan, r, n.config, {u0 + "::0", u0 + "::1", u0 + "::2"}, "x");
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(std::string(three.status().message()),
            "invalid request: maximum request size for shared resources is 1; found 3");
}

TEST(MpsTest, ThreeReplicasGetThreeSharesOnOneGpu) {
  Node n("dgx-h100");
  auto plan = n.PlanFor(MpsConfig("    failRequestsGreaterThanOne: false\n"));
  ASSERT_NE(plan, nullptr);
  const auto& r = plan->resources[0];
  const uint64_t mib = n.inv->gpus()[0].memory_mib;
  // The daemon's defaults allow the most one container may get; each container's env holds it to its share.
  auto limits = deviceplugin::DaemonLimits(*plan, r);
  EXPECT_EQ(limits.pinned_mib[0].second, mib);
  EXPECT_EQ(limits.thread_percentage, 100);

  // GPU 0 has one replica in use, GPU 1 two: three replicas fit only on GPUs 2..7, and all come from one.
  std::vector<std::string> available;
  for (const auto& d : r.devices) {
    if (!(d.gpu == 0 && d.replica == 0) && !(d.gpu == 1 && d.replica < 2)) available.push_back(d.id);
  }
  auto chosen = deviceplugin::PreferredAllocation(*plan, r, n.config, available, {}, 3);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  std::set<unsigned> gpus;
  for (const auto& id : *chosen) gpus.insert(r.Find(id)->gpu);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_GE(*gpus.begin(), 2u);
  // With must_include on GPU 0 (3 free replicas), the others come from GPU 0 too.
  const std::string u0 = n.inv->gpus()[0].uuid;
  auto with_must = deviceplugin::PreferredAllocation(*plan, r, n.config, available, {u0 + "::3"}, 3);
  ASSERT_TRUE(with_must.ok());
  for (const auto& id : *with_must) EXPECT_EQ(r.Find(id)->gpu, 0u) << id;

  const unsigned g = *gpus.begin();
  auto a = deviceplugin::Allocate(*plan, r, n.config, *chosen, "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->envs.at("NVIDIA_VISIBLE_DEVICES"), n.inv->gpus()[g].uuid);
  EXPECT_EQ(a->envs.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=" + std::to_string(mib * 3 / 4) + "M");
  EXPECT_EQ(a->envs.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "75");
  EXPECT_EQ(a->mounts.size(), 2u);
  // Replicas that kubelet spread over two GPUs: each GPU's share, the smaller thread share.
  const std::string u1 = n.inv->gpus()[1].uuid;
  auto spread = deviceplugin::Allocate(*plan, r, n.config, {u0 + "::1", u0 + "::2", u1 + "::3"}, "x");
  ASSERT_TRUE(spread.ok());
  EXPECT_EQ(spread->envs.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
            "0=" + std::to_string(mib * 2 / 4) + "M,1=" + std::to_string(mib / 4) + "M");
  EXPECT_EQ(spread->envs.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "25");
  // Ordinals follow CUDA's order (PCI bus, i.e. GPU index), not the order kubelet listed the IDs in.
  auto reversed = deviceplugin::Allocate(*plan, r, n.config, {u1 + "::3", u0 + "::1", u0 + "::2"}, "x");
  ASSERT_TRUE(reversed.ok());
  EXPECT_EQ(reversed->envs.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), spread->envs.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
}

TEST(MpsTest, RefusedOnMigAndAboveMaxClients) {
  {
    Node n("dgx-a100-mig");
    auto c = ParseConfig(
        "flags:\n  mpsRoot: /m\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2, devices: [1]}\n",
        "t.yaml");
    ASSERT_TRUE(c.ok()) << c.status();
    // migStrategy none: GPU 1 is a whole GPU, MPS is fine.
    EXPECT_TRUE(deviceplugin::BuildPlan(n.inv, *c).ok());
    // All-MIG node with single strategy: the MIG devices are nvidia.com/gpu, and MPS refuses them.
    for (unsigned i = 0; i < 8; ++i) {
      auto change = gpu::PlanMigChange(*n.lib, n.inv->gpus()[i], {i, true, std::vector<std::string>(7, "1g.5gb")});
      ASSERT_TRUE(change.ok()) << change.status();
      ASSERT_TRUE(gpu::ApplyMigChange(*n.lib, n.inv->gpus()[i], *change).ok());
    }
    n.Rediscover();
    Config single = *c;
    single.mig_strategy = "single";
    single.sharing.resources[0].devices.clear();
    auto refused = deviceplugin::BuildPlan(n.inv, single);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(std::string(refused.status().message()).find("sharing using MPS is not supported for MIG devices"),
              std::string::npos)
        << refused.status();
  }
  Node h("l4x4");
  auto many =
      ParseConfig("flags:\n  mpsRoot: /m\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 49}\n", "t");
  ASSERT_TRUE(many.ok());
  auto over = deviceplugin::BuildPlan(h.inv, *many);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(std::string(over.status().message())
                .find("replicas 49 exceeds the 48 MPS clients GPU 0 (compute capability 8.9)"),
            std::string::npos);
}

}  // namespace
}  // namespace kgpu
