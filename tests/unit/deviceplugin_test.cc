#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "common/strings.h"
#include "deviceplugin/allocator.h"
#include "deviceplugin/cdi.h"
#include "deviceplugin/config.h"
#include "deviceplugin/plan.h"
#include "deviceplugin/server.h"
#include "gpu/mig_minors.h"
#include "kubelet/registration.h"
#include "nvml/library.h"
#include "testing/fake_kubelet.h"
#include "testing/sim_plan.h"

namespace kgpu::deviceplugin {
namespace {

// ---------------------------------------------------------------- config

TEST(ConfigTest, EmptyFileGivesNvidiaDefaults) {
  auto c = ParseConfig("", "c.yaml", {.allow_empty = true});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mig_strategy, "none");
  EXPECT_TRUE(c->fail_on_init_error);
  EXPECT_EQ(c->device_list_strategy, std::vector<std::string>{"envvar"});
  EXPECT_EQ(c->device_id_strategy, "uuid");
  EXPECT_EQ(c->sharing.strategy, SharingStrategy::kNone);
  EXPECT_EQ(c->health.ignored_xids, (std::set<uint64_t>{13, 31, 43, 45, 68, 109}));
  EXPECT_TRUE(Validate(*c).ok());
}

// NVIDIA's full example config (every documented key) parses unchanged.
TEST(ConfigTest, NvidiaConfigFileWorksUnchanged) {
  constexpr const char* kNvidia = R"(version: v1
flags:
  migStrategy: mixed
  failOnInitError: true
  mpsRoot: /run/nvidia/mps
  nvidiaDriverRoot: /
  nvidiaDevRoot: /
  gdrcopyEnabled: false
  gdsEnabled: false
  mofedEnabled: false
  useNodeFeatureAPI: true
  deviceDiscoveryStrategy: auto
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, cdi-annotations]
    deviceIDStrategy: index
    cdiAnnotationPrefix: cdi.k8s.io/
    nvidiaCTKPath: /usr/bin/nvidia-ctk
    containerDriverRoot: /driver-root
    sharedDevicesAllocationPolicy: packed
  gfd:
    oneshot: false
    noTimestamp: false
    sleepInterval: 60s
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    machineTypeFile: /sys/class/dmi/id/product_name
resources:
  gpus: [{pattern: "*", name: gpu}]
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: gpu
      replicas: 4
imex:
  channelIDs: []
  required: false
)";
  auto c = ParseConfig(kNvidia, "nvidia.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mig_strategy, "mixed");
  EXPECT_TRUE(c->pass_device_specs);
  EXPECT_EQ(c->device_list_strategy, (std::vector<std::string>{"envvar", "cdi-annotations"}));
  EXPECT_EQ(c->device_id_strategy, "index");
  EXPECT_EQ(c->shared_devices_allocation_policy, "packed");
  EXPECT_EQ(c->sharing.strategy, SharingStrategy::kTimeSlicing);
  EXPECT_TRUE(c->sharing.rename_by_default);
  ASSERT_EQ(c->sharing.resources.size(), 1u);
  EXPECT_EQ(c->sharing.resources[0].name, "nvidia.com/gpu");
  EXPECT_EQ(c->sharing.resources[0].replicas, 4);
  EXPECT_EQ(c->warnings.size(), 1u);  // 'resources' is ignored, with a warning
  EXPECT_TRUE(Validate(*c).ok());
}

TEST(ConfigTest, JsonAndCommaListStrategy) {
  auto c = ParseConfig(R"({"version": "v1", "flags": {"plugin": {"deviceListStrategy": "volume-mounts,cdi-cri"}}})",
                       "c.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device_list_strategy, (std::vector<std::string>{"volume-mounts", "cdi-cri"}));
}

TEST(ConfigTest, MpsDefaultsToFailRequestsGreaterThanOne) {
  auto c = ParseConfig("sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sharing.strategy, SharingStrategy::kMps);
  EXPECT_TRUE(c->sharing.fail_requests_greater_than_one);
  EXPECT_FALSE(Validate(*c).ok());  // needs mpsRoot
  c->mps_root = "/run/nvidia/mps";
  EXPECT_TRUE(Validate(*c).ok());
  c->mig_strategy = "mixed";
  EXPECT_EQ(std::string(Validate(*c).message()), "c.yaml:3:5: using --mig-strategy=mixed is not supported with MPS");
}

TEST(ConfigTest, KgpuHealthSection) {
  auto c = ParseConfig(
      "health:\n  ignoredXids: [13, 43]\n  fatalXids: [31]\n  recoverAfter: 90s\n"
      "  probeInterval: 250ms\n",
      "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->health.ignored_xids, (std::set<uint64_t>{13, 43}));
  EXPECT_EQ(c->health.fatal_xids, (std::set<uint64_t>{31}));
  EXPECT_EQ(*c->health.recover_after, std::chrono::seconds(90));
  EXPECT_EQ(c->health.probe_interval, std::chrono::milliseconds(250));
  auto never = ParseConfig("health:\n  recoverAfter: never\n", "c.yaml");
  ASSERT_TRUE(never.ok());
  EXPECT_FALSE(never->health.recover_after.has_value());
}

TEST(ConfigTest, HealthcheckEnvironment) {
  HealthConfig h;
  ASSERT_TRUE(ApplyHealthcheckEnv("48, 79", "13", &h).ok());
  EXPECT_TRUE(h.ignored_xids.count(48));
  EXPECT_TRUE(h.fatal_xids.count(13));
  EXPECT_FALSE(h.disabled);
  HealthConfig all;
  ASSERT_TRUE(ApplyHealthcheckEnv("xids", "", &all).ok());
  EXPECT_TRUE(all.disabled);
  HealthConfig enabled;
  ASSERT_TRUE(ApplyHealthcheckEnv("all", "all", &enabled).ok());
  EXPECT_FALSE(enabled.disabled);
  EXPECT_TRUE(enabled.all_xids_fatal);
  HealthConfig bad;
  EXPECT_EQ(std::string(ApplyHealthcheckEnv("4x", "", &bad).message()),
            "DP_DISABLE_HEALTHCHECKS: '4x' is not an XID number (expected a comma list, 'all' or 'xids')");
}

struct BadConfig {
  const char* yaml;
  const char* error;
};
class ConfigErrorTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigErrorTest, NamesFileLineColumnAndFix) {
  auto c = ParseConfig(GetParam().yaml, "config.yaml");
  absl::Status st = c.ok() ? Validate(*c) : c.status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find(GetParam().error), std::string::npos) << st.message();
}

INSTANTIATE_TEST_SUITE_P(
    Errors, ConfigErrorTest,
    ::testing::Values(
        BadConfig{"version: v2\n", "config.yaml:1:10: unknown version 'v2' (expected v1)"},
        BadConfig{"flags:\n  migStrategy: none\n  bogus: 1\n", "config.yaml:3:3: unknown key 'bogus' in flags"},
        BadConfig{"sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
                  "config.yaml:5:17: sharing.timeSlicing.resources[0].replicas must be an integer from 2 to 1024 (got "
                  "1, out of range)"},
        BadConfig{"sharing:\n  timeSlicing:\n    resources: []\n",
                  "config.yaml:3:16: sharing.timeSlicing.resources must be a non-empty list"},
        BadConfig{"sharing:\n  timeSlicing:\n    resources:\n    - replicas: 2\n",
                  "config.yaml:4:7: sharing.timeSlicing.resources[0].name is required"},
        BadConfig{"flags:\n  plugin:\n    deviceIDStrategy: serial\n", "deviceIDStrategy 'serial' is invalid"},
        BadConfig{"flags:\n  migStrategy: some\n", "migStrategy 'some' is invalid: use none, single or mixed"},
        BadConfig{"flags:\n  plugin:\n    deviceListStrategy: [envvar, magic]\n",
                  "deviceListStrategy 'magic' is invalid"},
        BadConfig{"health:\n  recoverAfter: soon\n",
                  "config.yaml:2:17: health.recoverAfter must be a duration such as 30s, 5m or 1h"},
        BadConfig{"flags: [unclosed\n", "config.yaml:"},
        BadConfig{"sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n  mps:\n"
                  "    resources: [{name: gpu, replicas: 2}]\n",
                  "cannot both be set"}));

TEST(ConfigTest, SocketNames) {
  EXPECT_EQ(SocketName("nvidia.com/gpu"), "nvidia-gpu.sock");
  EXPECT_EQ(SocketName("nvidia.com/gpu.shared"), "nvidia-gpu.shared.sock");
  EXPECT_EQ(SocketName("nvidia.com/mig-1g.10gb"), "nvidia-mig-1g.10gb.sock");
}

// ---------------------------------------------------------------- plan and allocation

using Node = kgpu::testing::SimPlan;

TEST(PlanTest, WholeGpus) {
  Node n("dgx-h100");
  auto plan = n.PlanFor("");
  ASSERT_EQ(plan->resources.size(), 1u);
  const Resource& r = plan->resources[0];
  EXPECT_EQ(r.name, "nvidia.com/gpu");
  EXPECT_EQ(r.socket, "nvidia-gpu.sock");
  ASSERT_EQ(r.devices.size(), 8u);
  EXPECT_EQ(r.devices[3].id, n.inv->gpus()[3].uuid);
  EXPECT_FALSE(r.replicated);
}

TEST(PlanTest, TimeSlicingReplicasAndRename) {
  Node n("dgx-h100");
  auto plan = n.PlanFor(
      "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: gpu\n      replicas: 3\n");
  ASSERT_EQ(plan->resources.size(), 1u);
  const Resource& r = plan->resources[0];
  EXPECT_EQ(r.name, "nvidia.com/gpu.shared");
  EXPECT_EQ(r.socket, "nvidia-gpu.shared.sock");
  ASSERT_EQ(r.devices.size(), 24u);
  EXPECT_EQ(r.devices[0].id, n.inv->gpus()[0].uuid + "::0");
  EXPECT_EQ(r.devices[2].id, n.inv->gpus()[0].uuid + "::2");
  EXPECT_EQ(r.devices[2].health_key, n.inv->gpus()[0].uuid);
}

// Per-GPU sharing: what NVIDIA parses but ignores.
TEST(PlanTest, PerGpuSharing) {
  Node n("dgx-h100");
  const std::string uuid7 = n.inv->gpus()[7].uuid;
  auto plan = n.PlanFor(
      "sharing:\n  timeSlicing:\n    resources:\n"
      "    - {name: gpu, replicas: 4, devices: [0, 1], rename: gpu.quarter}\n"
      "    - {name: gpu, replicas: 2, devices: [\"" +
      uuid7 + "\"], rename: gpu.half}\n");
  ASSERT_EQ(plan->resources.size(), 3u);
  std::map<std::string, size_t> sizes;
  for (const auto& r : plan->resources) sizes[r.name] = r.devices.size();
  EXPECT_EQ(sizes["nvidia.com/gpu"], 5u);  // GPUs 2..6 stay whole
  EXPECT_EQ(sizes["nvidia.com/gpu.quarter"], 8u);
  EXPECT_EQ(sizes["nvidia.com/gpu.half"], 2u);
}

TEST(PlanTest, SharingErrorsNameTheEntry) {
  Node n("l4x4");
  auto c = ParseConfig("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2, devices: [9]}\n", "t");
  ASSERT_TRUE(c.ok());
  auto p = BuildPlan(n.inv, *c);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("sharing.timeSlicing.resources[0].devices: no device '9'"),
            std::string::npos)
      << p.status();
  auto twice = ParseConfig(
      "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2}\n    - {name: gpu, replicas: 3, "
      "devices: [1]}\n",
      "t");
  ASSERT_TRUE(twice.ok());
  EXPECT_FALSE(BuildPlan(n.inv, *twice).ok());
}

TEST(PlanTest, ResourcesMustNotShareASocketOrHaveBadNames) {
  Node n("l4x4");
  // Another domain keeps its name in the socket: no collision with nvidia.com/gpu.
  auto acme = ParseConfig(
      "sharing:\n  timeSlicing:\n    resources:\n"
      "    - {name: gpu, replicas: 2, devices: [0], rename: acme.com/gpu}\n",
      "t");
  ASSERT_TRUE(acme.ok()) << acme.status();
  auto served = BuildPlan(n.inv, *acme);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(SocketName("acme.com/gpu"), "acme.com-gpu.sock");
  auto c = ParseConfig(
      "sharing:\n  timeSlicing:\n    resources:\n"
      "    - {name: gpu, replicas: 2, devices: [0], rename: nvidia/gpu}\n",
      "t");
  ASSERT_TRUE(c.ok()) << c.status();
  auto p = BuildPlan(n.inv, *c);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("would both be served on nvidia-gpu.sock"), std::string::npos)
      << p.status();
  auto bad = ParseConfig("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2, rename: \"a b\"}\n",
                         "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("is not an extended resource name"), std::string::npos);
}

TEST(PlanTest, MigStrategies) {
  Node n("dgx-a100-mig");
  auto none = n.PlanFor("");
  ASSERT_EQ(none->resources.size(), 1u);
  EXPECT_EQ(none->resources[0].devices.size(), 8u);

  auto mixed = n.PlanFor("flags:\n  migStrategy: mixed\n");
  std::map<std::string, size_t> sizes;
  for (const auto& r : mixed->resources) sizes[r.name] = r.devices.size();
  EXPECT_EQ(sizes, (std::map<std::string, size_t>{{"nvidia.com/gpu", 6},
                                                  {"nvidia.com/mig-1g.5gb", 9},
                                                  {"nvidia.com/mig-2g.10gb", 1},
                                                  {"nvidia.com/mig-3g.20gb", 1}}));
  auto c = ParseConfig("flags:\n  migStrategy: single\n", "t");
  auto single = BuildPlan(n.inv, *c);
  ASSERT_FALSE(single.ok());
  EXPECT_NE(std::string(single.status().message())
                .find("all devices on the node must be configured with the same migEnabled value"),
            std::string::npos);
}

TEST(AllocateTest, MigDeviceSpecsIncludeItsCapabilities) {
  Node n("dgx-a100-mig");
  ASSERT_EQ(n.sim.Ctl("mig-minors " + n.sim.dir() + "/proc/driver/nvidia-caps/mig-minors"), 0);
  auto plan = n.PlanFor("flags:\n  migStrategy: mixed\n  nvidiaDevRoot: /\n  plugin:\n    passDeviceSpecs: true\n",
                        n.sim.dir() + "/proc");
  ASSERT_NE(plan, nullptr);
  const Resource* r = nullptr;
  for (const auto& x : plan->resources) {
    if (x.name == "nvidia.com/mig-1g.5gb") r = &x;
  }
  ASSERT_NE(r, nullptr);
  // GPU 0's first 1g.5gb instance is GI 3, CI 0: minors 3 + 3*9 = 30 (GI) and 31 (CI).
  const PluginDevice& d = r->devices[0];
  ASSERT_EQ(d.gpu, 0u);
  EXPECT_EQ(d.cap_nodes, (std::vector<std::string>{"/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"}));
  auto a = Allocate(*plan, *r, n.config, {d.id}, "x");
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<std::string> nodes;
  for (const auto& s : a->devices) nodes.push_back(s.container_path);
  EXPECT_EQ(nodes, (std::vector<std::string>{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0",
                                             "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"}));
  EXPECT_EQ(a->envs.at("NVIDIA_VISIBLE_DEVICES"), d.id);
  EXPECT_NE(CdiSpecJson(*plan, n.config).find("/dev/nvidia-caps/nvidia-cap31"), std::string::npos);
}

// kgpu-simctl procfs writes the driver's trees; the plugin, given them as --proc-root, computes
// each MIG device's /dev/nvidia-caps nodes, and they are the minors the driver's capability files
// of that instance name (capabilities/gpu<minor>/mig/gi<i>[/ci<c>]/access).
TEST(MigMinorsTest, SimulatedProcfsGivesEachMigDeviceItsCapabilities) {
  Node n("dgx-a100-mig");
  const std::string proc = n.sim.dir() + "/procfs";
  ASSERT_EQ(n.sim.Ctl("procfs " + proc), 0);
  auto plan = n.PlanFor("flags:\n  migStrategy: mixed\n", proc);
  ASSERT_NE(plan, nullptr);
  auto minor_in = [](const std::string& path) -> std::string {
    std::ifstream in(path);
    std::string key, value;
    in >> key >> value;
    return key == "DeviceFileMinor:" ? value : "unreadable " + path;
  };
  size_t mig_devices = 0;
  for (const auto& r : plan->resources) {
    for (const auto& d : r.devices) {
      if (d.mig < 0) continue;
      ++mig_devices;
      const auto& migs = n.inv->gpus()[d.gpu].migs;
      const auto m_it =
          std::find_if(migs.begin(), migs.end(), [&](const auto& x) { return static_cast<int>(x.index) == d.mig; });
      ASSERT_NE(m_it, migs.end());
      const auto& m = *m_it;
      const std::string gi_dir = Cat(proc, "/driver/nvidia/capabilities/gpu", d.minor, "/mig/gi", m.gi);
      EXPECT_EQ(d.cap_nodes, (std::vector<std::string>{
                                 "/dev/nvidia-caps/nvidia-cap" + minor_in(gi_dir + "/access"),
                                 "/dev/nvidia-caps/nvidia-cap" + minor_in(Cat(gi_dir, "/ci", m.ci, "/access"))}))
          << r.name << " " << d.id;
    }
  }
  EXPECT_EQ(mig_devices, 4u + 7u);  // GPU 0's 4 and GPU 1's 7 instances
  // The first 1g.5gb instance (GPU 0, GI 3, CI 0): 3 + 3*9 = 30 and 31, as the driver numbers them.
  EXPECT_EQ(minor_in(proc + "/driver/nvidia/capabilities/gpu0/mig/gi3/access"), "30");
  EXPECT_EQ(minor_in(proc + "/driver/nvidia/capabilities/gpu0/mig/gi3/ci0/access"), "31");
  EXPECT_EQ(minor_in(proc + "/driver/nvidia/capabilities/mig/config"), "1");
  // A GPU instance that does not exist has no capability file (mig-minors lists it all the same).
  EXPECT_FALSE(std::filesystem::exists(proc + "/driver/nvidia/capabilities/gpu2/mig/gi1/access"));
  // gpus/<bus id>/information names each GPU's UUID and minor.
  const auto& g1 = n.inv->gpus()[1];
  std::string bus = g1.bus_id.substr(4);
  std::transform(bus.begin(), bus.end(), bus.begin(), [](unsigned char c) { return std::tolower(c); });
  std::ifstream info(proc + "/driver/nvidia/gpus/" + bus + "/information");
  const std::string text((std::istreambuf_iterator<char>(info)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("GPU UUID: \t " + g1.uuid + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Device Minor: \t 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Bus Location: \t " + bus + "\n"), std::string::npos) << text;
}

TEST(MigMinorsTest, ParsesAndNamesBadLines) {
  auto m = gpu::ParseMigMinors("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n", "mm");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(gpu::MigCapNodes(*m, 0, 1, 0),
            (std::vector<std::string>{"/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"}));
  EXPECT_TRUE(gpu::MigCapNodes(*m, 1, 1, 0).empty());
  auto bad = gpu::ParseMigMinors("gpu0/gi1/access twelve\n", "mm");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(std::string(bad.status().message()), "mm:1: minor 'twelve' is not a number");
}

TEST(AllocateTest, EnvvarStripsReplicasAndDeduplicates) {
  Node n("dgx-h100");
  auto plan = n.PlanFor("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n");
  const Resource& r = plan->resources[0];
  const std::string u0 = n.inv->gpus()[0].uuid, u1 = n.inv->gpus()[1].uuid;
  auto a = Allocate(*plan, r, n.config, {u0 + "::0", u0 + "::3", u1 + "::1"}, "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->envs.at("NVIDIA_VISIBLE_DEVICES"), u0 + "," + u1);
  EXPECT_TRUE(a->mounts.empty());
  EXPECT_TRUE(a->devices.empty());
}

TEST(AllocateTest, FailRequestsGreaterThanOneAndUnknownIds) {
  Node n("l4x4");
  auto plan = n.PlanFor(
      "sharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources:\n"
      "    - {name: gpu, replicas: 2}\n");
  const Resource& r = plan->resources[0];
  auto two = Allocate(*plan, r, n.config, {r.devices[0].id, r.devices[1].id}, "x");
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(std::string(two.status().message()),
            "invalid request: maximum request size for shared resources is 1; found 2");
  auto unknown = Allocate(*plan, r, n.config, {"GPU-nope"}, "x");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(std::string(unknown.status().message()).find("unknown device: GPU-nope"), std::string::npos);
}

TEST(AllocateTest, VolumeMountsCdiIndexAndDeviceSpecs) {
  Node n("dgx-h100");
  auto plan = n.PlanFor(
      "flags:\n  plugin:\n    passDeviceSpecs: true\n    deviceIDStrategy: index\n"
      "    deviceListStrategy: [volume-mounts, cdi-annotations, cdi-cri]\n");
  const Resource& r = plan->resources[0];
  auto a = Allocate(*plan, r, n.config, {r.devices[2].id, r.devices[5].id}, "abc");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->envs.at("NVIDIA_VISIBLE_DEVICES"), "/var/run/nvidia-container-devices");
  ASSERT_EQ(a->mounts.size(), 2u);
  EXPECT_EQ(a->mounts[0], (MountSpec{"/var/run/nvidia-container-devices/2", "/dev/null", false}));
  EXPECT_EQ(a->annotations.at("cdi.k8s.io/nvidia-device-plugin_abc"),
            "k8s.device-plugin.nvidia.com/gpu=2,k8s.device-plugin.nvidia.com/gpu=5");
  EXPECT_EQ(a->cdi_devices,
            (std::vector<std::string>{"k8s.device-plugin.nvidia.com/gpu=2", "k8s.device-plugin.nvidia.com/gpu=5"}));
  std::vector<std::string> nodes;
  for (const auto& d : a->devices) nodes.push_back(d.container_path);
  EXPECT_EQ(nodes, (std::vector<std::string>{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia2", "/dev/nvidia5"}));
  EXPECT_EQ(a->devices[0].permissions, "rw");
  const std::string spec = CdiSpecJson(*plan, n.config);
  EXPECT_NE(spec.find("\"kind\": \"k8s.device-plugin.nvidia.com/gpu\""), std::string::npos);
  EXPECT_NE(spec.find("\"name\": \"" + n.inv->gpus()[4].uuid + "\""), std::string::npos);
}

TEST(AllocateTest, CdiOnlyReturnsNoEnv) {
  Node n("l4x4");
  auto plan = n.PlanFor("flags:\n  plugin:\n    deviceListStrategy: cdi-cri\n");
  auto a = Allocate(*plan, plan->resources[0], n.config, {plan->resources[0].devices[0].id}, "x");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->envs.empty());
  EXPECT_EQ(a->cdi_devices.size(), 1u);
}

TEST(PreferredTest, NvlinkBeatsPcieAndHonoursMustInclude) {
  Node n("l4x4");  // PCIe only: GPUs 0,1 share a switch; 2,3 share another
  auto plan = n.PlanFor("");
  const Resource& r = plan->resources[0];
  std::vector<std::string> all;
  for (const auto& d : r.devices) all.push_back(d.id);
  auto two = PreferredAllocation(*plan, r, n.config, all, {}, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<std::string>{all[0], all[1]}));
  auto with3 = PreferredAllocation(*plan, r, n.config, all, {all[3]}, 2);
  ASSERT_TRUE(with3.ok());
  EXPECT_EQ(*with3, (std::vector<std::string>{all[3], all[2]}));
  EXPECT_FALSE(PreferredAllocation(*plan, r, n.config, all, {}, 5).ok());
}

TEST(PreferredTest, ReplicasDistributedAndPacked) {
  Node n("dgx-h100");
  auto plan = n.PlanFor("sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 4}\n");
  const Resource& r = plan->resources[0];
  std::vector<std::string> available;
  for (const auto& d : r.devices) {
    if (!(d.gpu == 0 && d.replica < 3)) available.push_back(d.id);  // GPU 0 is busy (3 of 4 used)
  }
  auto spread = PreferredAllocation(*plan, r, n.config, available, {}, 3);
  ASSERT_TRUE(spread.ok());
  std::set<unsigned> gpus;
  for (const auto& id : *spread) gpus.insert(r.Find(id)->gpu);
  EXPECT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus.count(0), 0u);
  Config packed = n.config;
  packed.shared_devices_allocation_policy = "packed";
  auto pack = PreferredAllocation(*plan, r, packed, available, {}, 2);
  ASSERT_TRUE(pack.ok());
  EXPECT_EQ(r.Find((*pack)[0])->gpu, 0u);  // the busiest GPU first
}

TEST(PreferredTest, LostGpuDoesNotFailTheCall) {
  Node n("dgx-h100");
  ASSERT_EQ(n.sim.Ctl("lose 5"), 0);
  n.Rediscover();  // GPU 5 is lost at discovery
  Node& m = n;
  auto plan = m.PlanFor("");
  const Resource& r = plan->resources[0];
  EXPECT_EQ(r.devices.size(), 7u);
  std::vector<std::string> all;
  for (const auto& d : r.devices) all.push_back(d.id);
  auto four = PreferredAllocation(*plan, r, m.config, all, {}, 4);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->size(), 4u);
}

}  // namespace
}  // namespace kgpu::deviceplugin

namespace kgpu::deviceplugin {
namespace {

// A device that turns Unhealthy and Healthy again before the stream's thread wakes up must still
// reach kubelet as an Unhealthy list first: ListAndWatch carries every edge, not only the level.
TEST(ListAndWatchTest, EveryUnhealthyEdgeReachesKubelet) {
  kgpu::testing::SimPlan n("dgx-h100");
  auto plan = n.PlanFor("");
  ASSERT_NE(plan, nullptr);
  kgpu::testing::FakeKubelet kubelet(n.sim.dir());
  std::atomic<int> unhealthy_lists{0};
  kubelet.OnEvent([&](const kgpu::testing::FakeKubeletEvent& e) {
    if (e.kind == kgpu::testing::FakeKubeletEvent::Kind::kUpdate && e.state.Unhealthy() > 0) ++unhealthy_lists;
  });
  ASSERT_TRUE(kubelet.Start().ok());
  auto config = std::make_shared<const Config>(n.config);
  ResourceServer server(plan, 0, config, n.sim.dir() + "/nvidia-gpu.sock");
  ASSERT_TRUE(server.Start().ok());
  ASSERT_TRUE(::kgpu::kubelet::RegisterDevicePlugin(kubelet.SocketPath(), "nvidia-gpu.sock", "nvidia.com/gpu", false,
                                                    std::chrono::seconds(5))
                  .ok());
  ASSERT_TRUE(kubelet.WaitFor(
      "nvidia.com/gpu", [](const auto& s) { return s.connected && s.updates >= 1; }, std::chrono::seconds(10)));
  const std::string uuid = n.inv->gpus()[2].uuid;
  constexpr int kFlaps = 50;
  for (int i = 0; i < kFlaps; ++i) {
    server.SetHealth({{uuid, gpu::DeviceHealth{uuid, false, "XID 48", "xid"}}});
    server.SetHealth({{uuid, gpu::DeviceHealth{uuid, true, "", ""}}});  // recovered at once
  }
  // Every flap ends Healthy: wait for that, then count the Unhealthy lists kubelet received.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline &&
         (unhealthy_lists.load() < kFlaps || kubelet.Get("nvidia.com/gpu")->Unhealthy() != 0)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(unhealthy_lists.load(), kFlaps);
  EXPECT_EQ(kubelet.Get("nvidia.com/gpu")->Unhealthy(), 0);
  server.Stop();
  kubelet.Stop();
}

}  // namespace
}  // namespace kgpu::deviceplugin
