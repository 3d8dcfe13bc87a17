// GFD labels and the inventory annotation from a simulated node, and publishing them to the
// API server stand-in without touching labels we do not own.
#include "cli/node_labels.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <unistd.h>

#include "cli/doctor_cluster.h"
#include "common/files.h"
#include "deviceplugin/gfd_labels.h"
#include "extender/inventory.h"
#include "k8s/client.h"
#include "testing/fake_apiserver.h"
#include "testing/poll.h"
#include "testing/sim_gpus.h"

namespace kgpu::cli {
namespace {
using json = nlohmann::json;
using deviceplugin::Config;
using deviceplugin::GfdLabels;

deviceplugin::GfdOptions Opts(bool timestamp, int64_t now = 0, std::optional<std::string> machine = std::nullopt) {
  deviceplugin::GfdOptions o;
  o.timestamp = timestamp;
  o.now_seconds = now;
  o.machine = std::move(machine);
  return o;
}

using Labels = std::map<std::string, std::string>;

// A simulated node discovered as a node agent with --sysfs-root sees it: kgpu-simctl sysfs has
// written the GPUs' PCI functions (class 0x030200, a 3D controller, unless the profile's gpus entry
// says pciClass).
struct SysfsGpus : testing::SimGpus {
  explicit SysfsGpus(const std::string& profile) : SimGpus(profile) {
    EXPECT_EQ(sim.Ctl("sysfs " + sim.dir()), 0);
    Rediscover();
  }
  ~SysfsGpus() { std::filesystem::remove_all(sim.dir() + "/bus"); }
  SysfsGpus(const SysfsGpus&) = delete;
  SysfsGpus& operator=(const SysfsGpus&) = delete;
};

// A node profile for the simulator in a file (KGPU_SIM_NODE takes its path), removed at the end.
class ProfileFile {
 public:
  ProfileFile(const std::string& name, const std::string& yaml)
      : path_(::testing::TempDir() + "kgpu-gfd-" + name + "-" + std::to_string(::getpid()) + ".yaml") {
    std::ofstream(path_) << yaml;
  }
  ~ProfileFile() { std::remove(path_.c_str()); }
  ProfileFile(const ProfileFile&) = delete;
  ProfileFile& operator=(const ProfileFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The value format GFD gives each key it writes (NVIDIA/k8s-device-plugin: internal/lm/); empty for
// a key GFD does not write.
std::string GfdFormat(const std::string& key) {
  constexpr char kNum[] = "[0-9]+";
  constexpr char kValue[] = "([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?";  // a label value
  const std::map<std::string, std::string> node = {
      {"nvidia.com/gfd.timestamp", kNum},
      {"nvidia.com/gpu.machine", kValue},
      {"nvidia.com/gpu.mode", "compute|graphics|unknown"},
      {"nvidia.com/mig.capable", "true|false"},
      {"nvidia.com/mps.capable", "true|false"},
      {"nvidia.com/mig.strategy", "single|mixed"},
      {"nvidia.com/cuda.driver-version.full", "[0-9]+\\.[0-9]+(\\.[0-9]+)?"},
      {"nvidia.com/cuda.driver-version.major", kNum},
      {"nvidia.com/cuda.driver-version.minor", kNum},
      {"nvidia.com/cuda.driver-version.revision", "[0-9]*"},
      {"nvidia.com/cuda.driver.major", kNum},
      {"nvidia.com/cuda.driver.minor", kNum},
      {"nvidia.com/cuda.driver.rev", "[0-9]*"},
      {"nvidia.com/cuda.runtime-version.full", "[0-9]+\\.[0-9]+"},
      {"nvidia.com/cuda.runtime-version.major", kNum},
      {"nvidia.com/cuda.runtime-version.minor", kNum},
      {"nvidia.com/cuda.runtime.major", kNum},
      {"nvidia.com/cuda.runtime.minor", kNum},
      {"nvidia.com/gpu.family",
       "tesla|fermi|kepler|maxwell|pascal|volta|turing|ampere|ada-lovelace|hopper|blackwell|rubin|undefined"},
      {"nvidia.com/gpu.compute.major", kNum},
      {"nvidia.com/gpu.compute.minor", kNum},
  };
  if (const auto it = node.find(key); it != node.end()) return it->second;
  // Per resource: nvidia.com/gpu.<attribute> and, mixed, nvidia.com/mig-<profile>.<attribute>.
  const std::map<std::string, std::string> resource = {
      {"product", kValue},       {"count", kNum},
      {"replicas", kNum},        {"sharing-strategy", "none|time-slicing|mps"},
      {"memory", kNum},          {"multiprocessors", kNum},
      {"slices.gi", kNum},       {"slices.ci", kNum},
      {"engines.copy", kNum},    {"engines.decoder", kNum},
      {"engines.encoder", kNum}, {"engines.jpeg", kNum},
      {"engines.ofa", kNum},
  };
  for (const auto& [attribute, format] : resource) {
    if (key == "nvidia.com/gpu." + attribute) return format;
    if (key.starts_with("nvidia.com/mig-") && key.ends_with("." + attribute) &&
        key.size() > std::string("nvidia.com/mig-.").size() + attribute.size()) {
      return format;
    }
  }
  return "";
}

// Every label is one GFD writes, in GFD's format; and the labels are exactly `want`.
void ExpectGolden(const Labels& got, const Labels& want) {
  for (const auto& [k, v] : got) {
    const std::string format = GfdFormat(k);
    EXPECT_FALSE(format.empty()) << k << " is not a label GFD writes";
    EXPECT_TRUE(std::regex_match(v, std::regex(format))) << k << "=" << v << " does not match " << format;
    EXPECT_TRUE(deviceplugin::OwnsLabel(k)) << k;
  }
  // As the NFD feature file, so that a difference shows line by line.
  EXPECT_EQ(deviceplugin::NfdFeatureFile(got), deviceplugin::NfdFeatureFile(want));
}

// The labels every node with GPUs gets from its driver (internal/lm/nvml.go, newVersionLabeler).
Labels VersionLabels(const std::string& driver, const std::string& cuda) {
  const auto d1 = driver.find('.'), d2 = driver.find('.', d1 + 1);
  const auto c1 = cuda.find('.');
  const std::string major = driver.substr(0, d1), minor = driver.substr(d1 + 1, d2 - d1 - 1);
  const std::string rev = d2 == std::string::npos ? "" : driver.substr(d2 + 1);
  return {{"nvidia.com/cuda.driver-version.full", driver},
          {"nvidia.com/cuda.driver-version.major", major},
          {"nvidia.com/cuda.driver-version.minor", minor},
          {"nvidia.com/cuda.driver-version.revision", rev},
          {"nvidia.com/cuda.driver.major", major},
          {"nvidia.com/cuda.driver.minor", minor},
          {"nvidia.com/cuda.driver.rev", rev},
          {"nvidia.com/cuda.runtime-version.full", cuda},
          {"nvidia.com/cuda.runtime-version.major", cuda.substr(0, c1)},
          {"nvidia.com/cuda.runtime-version.minor", cuda.substr(c1 + 1)},
          {"nvidia.com/cuda.runtime.major", cuda.substr(0, c1)},
          {"nvidia.com/cuda.runtime.minor", cuda.substr(c1 + 1)}};
}

Labels Merged(Labels a, const Labels& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

// The dgx-h100 node's labels without MIG or sharing (8 x NVIDIA H100 80GB HBM3, driver 550.90.07,
// CUDA 12.4; 81559 MiB each as NVML reports it).
Labels DgxH100Labels() {
  return Merged(VersionLabels("550.90.07", "12.4"), {
                                                        {"nvidia.com/gpu.compute.major", "9"},
                                                        {"nvidia.com/gpu.compute.minor", "0"},
                                                        {"nvidia.com/gpu.count", "8"},
                                                        {"nvidia.com/gpu.family", "hopper"},
                                                        {"nvidia.com/gpu.machine", "unknown"},
                                                        {"nvidia.com/gpu.memory", "81559"},
                                                        {"nvidia.com/gpu.mode", "compute"},
                                                        {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"},
                                                        {"nvidia.com/gpu.replicas", "1"},
                                                        {"nvidia.com/gpu.sharing-strategy", "none"},
                                                        {"nvidia.com/mig.capable", "true"},
                                                        {"nvidia.com/mps.capable", "false"},
                                                    });
}

// Golden: whole GPUs, no MIG, no sharing. The timestamp is the pass's time; the machine type the
// DMI product name with its spaces as '-'.
// The keys GFD writes for one MIG profile under the mixed strategy (mig-<profile>.*): the
// product, the sharing, and the profile's NVML figures.
struct MigProfileWant {
  std::string product, count, replicas, strategy;
  int memory, sms, slices, copy_engines, decoders, jpegs, ofas;
};
void WantMigProfile(Labels& want, const std::string& profile, const MigProfileWant& w) {
  const std::string p = "nvidia.com/mig-" + profile + ".";
  want[p + "product"] = w.product;
  want[p + "count"] = w.count;
  want[p + "replicas"] = w.replicas;
  want[p + "sharing-strategy"] = w.strategy;
  want[p + "memory"] = std::to_string(w.memory);
  want[p + "multiprocessors"] = std::to_string(w.sms);
  want[p + "slices.gi"] = want[p + "slices.ci"] = std::to_string(w.slices);
  want[p + "engines.copy"] = std::to_string(w.copy_engines);
  want[p + "engines.decoder"] = std::to_string(w.decoders);
  want[p + "engines.encoder"] = "0";
  want[p + "engines.jpeg"] = std::to_string(w.jpegs);
  want[p + "engines.ofa"] = std::to_string(w.ofas);
}

TEST(GfdLabels, GoldenNoMig) {
  SysfsGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  const Labels want =
      Merged(DgxH100Labels(), {{"nvidia.com/gfd.timestamp", "1700000000"}, {"nvidia.com/gpu.machine", "DGX-H100"}});
  ExpectGolden(GfdLabels(*g.inv, Config{}, Opts(true, 1700000000, "DGX H100\n")), want);
}

// Golden: migStrategy mixed on 8 A100s, GPU 0 cut into 3g.20gb + 2g.10gb + 2 x 1g.5gb and GPU 1
// into 7 x 1g.5gb. gpu.count counts every GPU of the model, MIG-enabled or not (8); each profile
// carries the MIG device's attributes, the MIG user guide's A100-SXM4-40GB figures.
TEST(GfdLabels, GoldenMigMixed) {
  SysfsGpus g("dgx-a100-mig");
  ASSERT_TRUE(g.inv);
  Config c;
  c.mig_strategy = "mixed";
  Labels want = Merged(VersionLabels("535.183.01", "12.2"), {
                                                                {"nvidia.com/gpu.compute.major", "8"},
                                                                {"nvidia.com/gpu.compute.minor", "0"},
                                                                {"nvidia.com/gpu.count", "8"},
                                                                {"nvidia.com/gpu.family", "ampere"},
                                                                {"nvidia.com/gpu.machine", "unknown"},
                                                                {"nvidia.com/gpu.memory", "40960"},
                                                                {"nvidia.com/gpu.mode", "compute"},
                                                                {"nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"},
                                                                {"nvidia.com/gpu.replicas", "1"},
                                                                {"nvidia.com/gpu.sharing-strategy", "none"},
                                                                {"nvidia.com/mig.capable", "true"},
                                                                {"nvidia.com/mig.strategy", "mixed"},
                                                                {"nvidia.com/mps.capable", "false"},
                                                            });
  // profile, count, memory, SMs, slices, copy engines, decoders, JPEG, OFA
  struct Row {
    const char* profile;
    int count, memory, sms, slices, ce, dec, jpg, ofa;
  };
  for (const Row& r : {Row{"1g.5gb", 9, 4864, 14, 1, 1, 0, 0, 0}, Row{"2g.10gb", 1, 9856, 28, 2, 2, 1, 0, 0},
                       Row{"3g.20gb", 1, 19968, 42, 3, 3, 2, 0, 0}}) {
    WantMigProfile(want, r.profile,
                   {std::string("NVIDIA-A100-SXM4-40GB-MIG-") + r.profile, std::to_string(r.count), "1", "none",
                    r.memory, r.sms, r.slices, r.ce, r.dec, r.jpg, r.ofa});
  }
  ExpectGolden(GfdLabels(*g.inv, c, Opts(false)), want);
}

// Golden: migStrategy single on a uniform layout (every GPU MIG-enabled, one profile): gpu.* describe
// the MIG devices, with the H100's real 3g.40gb figures (nvidia-smi mig -lgip: 39.50 GiB, 60 SMs,
// 3 copy engines, 3 decoders, 3 JPEG); family and compute capability are the parent's. The machine
// type file cannot be read here: gpu.machine=unknown.
TEST(GfdLabels, GoldenMigSingleUniform) {
  ProfileFile file("single", R"(version: v1
name: gfd-h100-single
driverVersion: "550.90.07"
cudaVersion: "12.4"
gpus:
  - model: H100-SXM5-80GB
    count: 2
mig:
  - gpu: 0
    instances: [3g.40gb, 3g.40gb]
  - gpu: 1
    instances: [3g.40gb, 3g.40gb]
)");
  SysfsGpus g(file.path());
  ASSERT_TRUE(g.inv);
  Config c;
  c.mig_strategy = "single";
  const Labels want =
      Merged(VersionLabels("550.90.07", "12.4"), {
                                                     {"nvidia.com/gpu.compute.major", "9"},
                                                     {"nvidia.com/gpu.compute.minor", "0"},
                                                     {"nvidia.com/gpu.count", "4"},
                                                     {"nvidia.com/gpu.engines.copy", "3"},
                                                     {"nvidia.com/gpu.engines.decoder", "3"},
                                                     {"nvidia.com/gpu.engines.encoder", "0"},
                                                     {"nvidia.com/gpu.engines.jpeg", "3"},
                                                     {"nvidia.com/gpu.engines.ofa", "0"},
                                                     {"nvidia.com/gpu.family", "hopper"},
                                                     {"nvidia.com/gpu.machine", "unknown"},
                                                     {"nvidia.com/gpu.memory", "40448"},
                                                     {"nvidia.com/gpu.mode", "compute"},
                                                     {"nvidia.com/gpu.multiprocessors", "60"},
                                                     {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"},
                                                     {"nvidia.com/gpu.replicas", "1"},
                                                     {"nvidia.com/gpu.sharing-strategy", "none"},
                                                     {"nvidia.com/gpu.slices.ci", "3"},
                                                     {"nvidia.com/gpu.slices.gi", "3"},
                                                     {"nvidia.com/mig.capable", "true"},
                                                     {"nvidia.com/mig.strategy", "single"},
                                                     {"nvidia.com/mps.capable", "false"},
                                                 });
  ExpectGolden(GfdLabels(*g.inv, c, Opts(false, 0, deviceplugin::ReadMachineType(g.sim.dir() + "/no-such-file"))),
               want);
}

// Golden: migStrategy single on layouts it cannot serve: GFD's -MIG-INVALID with count, replicas and
// memory 0 and no MIG attributes, the rest from the full GPUs (internal/lm/mig-strategy.go,
// newInvalidMigStrategyLabeler). First MIG-enabled and disabled GPUs together with several
// profiles (dgx-a100-mig), then every GPU MIG-enabled but one without MIG devices.
TEST(GfdLabels, GoldenMigSingleNonUniform) {
  Config c;
  c.mig_strategy = "single";
  {
    SysfsGpus g("dgx-a100-mig");
    ASSERT_TRUE(g.inv);
    const Labels want =
        Merged(VersionLabels("535.183.01", "12.2"), {
                                                        {"nvidia.com/gpu.compute.major", "8"},
                                                        {"nvidia.com/gpu.compute.minor", "0"},
                                                        {"nvidia.com/gpu.count", "0"},
                                                        {"nvidia.com/gpu.family", "ampere"},
                                                        {"nvidia.com/gpu.machine", "unknown"},
                                                        {"nvidia.com/gpu.memory", "0"},
                                                        {"nvidia.com/gpu.mode", "compute"},
                                                        {"nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB-MIG-INVALID"},
                                                        {"nvidia.com/gpu.replicas", "0"},
                                                        {"nvidia.com/gpu.sharing-strategy", "none"},
                                                        {"nvidia.com/mig.capable", "true"},
                                                        {"nvidia.com/mig.strategy", "single"},
                                                        {"nvidia.com/mps.capable", "false"},
                                                    });
    ExpectGolden(GfdLabels(*g.inv, c, Opts(false)), want);
  }
  ProfileFile file("single-empty", R"(version: v1
name: gfd-h100-single-empty
driverVersion: "550.90.07"
cudaVersion: "12.4"
gpus:
  - model: H100-SXM5-80GB
    count: 2
mig:
  - gpu: 0
    instances: [3g.40gb, 3g.40gb]
  - gpu: 1
)");
  SysfsGpus g(file.path());
  ASSERT_TRUE(g.inv);
  ASSERT_TRUE(g.inv->gpus()[1].mig_enabled && g.inv->gpus()[1].migs.empty());
  const Labels want =
      Merged(VersionLabels("550.90.07", "12.4"), {
                                                     {"nvidia.com/gpu.compute.major", "9"},
                                                     {"nvidia.com/gpu.compute.minor", "0"},
                                                     {"nvidia.com/gpu.count", "0"},
                                                     {"nvidia.com/gpu.family", "hopper"},
                                                     {"nvidia.com/gpu.machine", "unknown"},
                                                     {"nvidia.com/gpu.memory", "0"},
                                                     {"nvidia.com/gpu.mode", "compute"},
                                                     {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-MIG-INVALID"},
                                                     {"nvidia.com/gpu.replicas", "0"},
                                                     {"nvidia.com/gpu.sharing-strategy", "none"},
                                                     {"nvidia.com/mig.capable", "true"},
                                                     {"nvidia.com/mig.strategy", "single"},
                                                     {"nvidia.com/mps.capable", "false"},
                                                 });
  ExpectGolden(GfdLabels(*g.inv, c, Opts(false)), want);
}

// Golden: time-slicing with 4 replicas of nvidia.com/gpu: replicas, strategy and -SHARED; gpu.count
// and gpu.memory unchanged. Renamed, the product has no -SHARED (internal/lm/resource.go).
TEST(GfdLabels, GoldenTimeSlicing) {
  SysfsGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  auto c = deviceplugin::ParseConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
      "ts.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  Labels want = Merged(DgxH100Labels(), {{"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-SHARED"},
                                         {"nvidia.com/gpu.replicas", "4"},
                                         {"nvidia.com/gpu.sharing-strategy", "time-slicing"},
                                         {"nvidia.com/gpu.machine", "PowerEdge-XE9680"}});
  ExpectGolden(GfdLabels(*g.inv, *c, Opts(false, 0, "PowerEdge XE9680\n")), want);
  c->sharing.resources[0].rename = "nvidia.com/gpu.shared";
  want["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3";
  ExpectGolden(GfdLabels(*g.inv, *c, Opts(false, 0, "PowerEdge XE9680\n")), want);
}

// Golden: MPS with 4 replicas: as time-slicing with strategy mps, and mps.capable=true.
TEST(GfdLabels, GoldenMps) {
  SysfsGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  auto c = deviceplugin::ParseConfig(
      "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n", "mps.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  const Labels want = Merged(DgxH100Labels(), {{"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-SHARED"},
                                               {"nvidia.com/gpu.replicas", "4"},
                                               {"nvidia.com/gpu.sharing-strategy", "mps"},
                                               {"nvidia.com/mps.capable", "true"}});
  ExpectGolden(GfdLabels(*g.inv, *c, Opts(false)), want);
}

// +me profiles are named with '.' for '+' (GFD's GetName: mig-1g.10gb.me, never an invalid
// 1g.10gb+me), and sharing applies by that name; a model whose every GPU is MIG-enabled gets
// gpu.replicas=0 and no -SHARED whatever the config says for nvidia.com/gpu.
TEST(GfdLabels, MigProfileNamesAndSharingOfMigEnabledGpus) {
  ProfileFile file("me", R"(version: v1
name: gfd-h100-me
driverVersion: "550.90.07"
cudaVersion: "12.4"
gpus:
  - model: H100-SXM5-80GB
mig:
  - gpu: 0
    instances: [1g.10gb+me, 1g.10gb, 1g.10gb]
)");
  SysfsGpus g(file.path());
  ASSERT_TRUE(g.inv);
  Config c;
  c.mig_strategy = "mixed";
  c.sharing.strategy = deviceplugin::SharingStrategy::kTimeSlicing;
  c.sharing.resources = {{"nvidia.com/gpu", 4, "", {}, "", {}}, {"nvidia.com/mig-1g.10gb.me", 2, "", {}, "", {}}};
  Labels want = Merged(VersionLabels("550.90.07", "12.4"), {
                                                               {"nvidia.com/gpu.compute.major", "9"},
                                                               {"nvidia.com/gpu.compute.minor", "0"},
                                                               {"nvidia.com/gpu.count", "1"},
                                                               {"nvidia.com/gpu.family", "hopper"},
                                                               {"nvidia.com/gpu.machine", "unknown"},
                                                               {"nvidia.com/gpu.memory", "81559"},
                                                               {"nvidia.com/gpu.mode", "compute"},
                                                               {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"},
                                                               {"nvidia.com/gpu.replicas", "0"},
                                                               {"nvidia.com/gpu.sharing-strategy", "none"},
                                                               {"nvidia.com/mig.capable", "true"},
                                                               {"nvidia.com/mig.strategy", "mixed"},
                                                               {"nvidia.com/mps.capable", "false"},
                                                           });
  for (const char* profile : {"1g.10gb", "1g.10gb.me"}) {
    const bool me = std::string(profile) == "1g.10gb.me";
    WantMigProfile(want, profile,
                   {std::string("NVIDIA-H100-80GB-HBM3-MIG-") + profile + (me ? "-SHARED" : ""), me ? "1" : "2",
                    me ? "2" : "1", me ? "time-slicing" : "none", 9984, 16, 1, 1, 1, 1, me ? 1 : 0});
  }
  ExpectGolden(GfdLabels(*g.inv, c, Opts(false)), want);
}

// gpu.mode from the GPUs' PCI class (sysfs): one VGA class is graphics; classes that differ, or a
// class that cannot be read, unknown. mig.strategy is written on a node that is not MIG capable.
TEST(GfdLabels, GpuModeFromThePciClass) {
  ProfileFile graphics("graphics", R"(version: v1
name: gfd-l4-graphics
driverVersion: "550.90.07"
cudaVersion: "12.4"
gpus:
  - model: L4
    count: 2
    pciClass: 0x030000
)");
  {
    SysfsGpus g(graphics.path());
    ASSERT_TRUE(g.inv);
    ASSERT_EQ(g.inv->gpus()[0].pci_class, 0x030000u);
    Config c;
    c.mig_strategy = "single";
    const Labels want = Merged(VersionLabels("550.90.07", "12.4"), {
                                                                       {"nvidia.com/gpu.compute.major", "8"},
                                                                       {"nvidia.com/gpu.compute.minor", "9"},
                                                                       {"nvidia.com/gpu.count", "2"},
                                                                       {"nvidia.com/gpu.family", "ada-lovelace"},
                                                                       {"nvidia.com/gpu.machine", "unknown"},
                                                                       {"nvidia.com/gpu.memory", "23034"},
                                                                       {"nvidia.com/gpu.mode", "graphics"},
                                                                       {"nvidia.com/gpu.product", "NVIDIA-L4"},
                                                                       {"nvidia.com/gpu.replicas", "1"},
                                                                       {"nvidia.com/gpu.sharing-strategy", "none"},
                                                                       {"nvidia.com/mig.capable", "false"},
                                                                       {"nvidia.com/mig.strategy", "single"},
                                                                       {"nvidia.com/mps.capable", "false"},
                                                                   });
    ExpectGolden(GfdLabels(*g.inv, c, Opts(false)), want);
  }
  ProfileFile mixed("mixed-class", R"(version: v1
name: gfd-l4-mixed-class
gpus:
  - model: L4
    pciClass: 0x030000
  - model: L4
)");
  {
    SysfsGpus g(mixed.path());
    ASSERT_TRUE(g.inv);
    EXPECT_EQ(g.inv->gpus()[1].pci_class, 0x030200u);
    EXPECT_EQ(GfdLabels(*g.inv, Config{}, Opts(false))["nvidia.com/gpu.mode"], "unknown");
  }
  testing::SimGpus unread("l4x4");  // no sysfs tree: the class cannot be read
  ASSERT_TRUE(unread.inv);
  EXPECT_EQ(GfdLabels(*unread.inv, Config{}, Opts(false))["nvidia.com/gpu.mode"], "unknown");
}

// No GPUs: GFD's device labeler writes nothing; only the timestamp is left.
TEST(GfdLabels, NoGpusOnlyTheTimestamp) {
  const auto none = gpu::Inventory::FromPartsForTest({}, {});
  EXPECT_EQ(GfdLabels(*none, Config{}, Opts(true, 1700000000, "DGX H100")),
            (Labels{{"nvidia.com/gfd.timestamp", "1700000000"}}));
  EXPECT_TRUE(GfdLabels(*none, Config{}, Opts(false)).empty());
}

// gpu.machine: GFD's TrimSpace and ' ' -> '-'; "unknown" when the file cannot be read (or the
// path is ""); an empty file gives an empty value. Characters a label value cannot hold are
// dropped (GFD would write them, and the API server refuse the patch). The flag and variable are
// GFD's --machine-type-file and GFD_MACHINE_TYPE_FILE.
TEST(GfdLabels, MachineType) {
  testing::SimGpus g("l4x4");
  ASSERT_TRUE(g.inv);
  const auto machine = [&](std::optional<std::string> content) {
    return GfdLabels(*g.inv, Config{}, Opts(false, 0, std::move(content)))["nvidia.com/gpu.machine"];
  };
  EXPECT_EQ(machine("  ProLiant DL380 Gen10  \n"), "ProLiant-DL380-Gen10");
  EXPECT_EQ(machine("ProLiant DL380 Gen10 (x86)\n"), "ProLiant-DL380-Gen10-x86");
  EXPECT_EQ(machine(""), "");
  EXPECT_EQ(machine(std::nullopt), "unknown");
  const std::string file = g.sim.dir() + "/product_name";
  std::ofstream(file) << "DGX H100\n";
  EXPECT_EQ(deviceplugin::ReadMachineType(file).value_or("(unread)"), "DGX H100\n");
  EXPECT_FALSE(deviceplugin::ReadMachineType("").has_value());
  EXPECT_FALSE(deviceplugin::ReadMachineType(file + ".missing").has_value());
  std::remove(file.c_str());

  NodeLabelsFlags flags;
  EXPECT_EQ(flags.machine_file, deviceplugin::kDefaultMachineTypeFile);
  CLI::App app;
  AddNodeLabelsFlags(&app, &flags);
  app.parse("--machine-type-file /etc/dmi", false);
  EXPECT_EQ(flags.machine_file, "/etc/dmi");
  NodeLabelsFlags from_env;
  CLI::App env_app;
  AddPublishLabelsFlags(&env_app, &from_env);
  ::setenv("GFD_MACHINE_TYPE_FILE", "/run/machine", 1);
  env_app.parse("", false);
  ::unsetenv("GFD_MACHINE_TYPE_FILE");
  EXPECT_EQ(from_env.machine_file, "/run/machine");
}

// gpu.product: GFD's sanitise (internal/lm/resource.go), and the newest GFD's shortening of long
// models to a 63-character value that keeps -MIG-<profile> and -SHARED
// (internal/lm/resource_test.go, TestGetProductName).
TEST(GfdLabels, ProductNames) {
  EXPECT_EQ(deviceplugin::SanitizeProduct("some ( thing )else"), "some-thing-else");
  EXPECT_EQ(deviceplugin::SanitizeProduct(" input  with multiple   spaces   "), "input-with-multiple-spaces");
  EXPECT_EQ(deviceplugin::SanitizeProduct("NVIDIA-TITAN-X-(Pascal)"), "NVIDIA-TITAN-X-Pascal");
  gpu::Gpu rtx;
  rtx.name = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition";
  rtx.memory_mib = 97887;
  rtx.cc_major = 12;
  rtx.mig_capable = rtx.mig_enabled = true;
  gpu::MigDevice m;
  m.profile = "1g.24gb+me";
  m.gi_slices = m.ci_slices = 1;
  rtx.migs = {m};
  Config c;
  c.mig_strategy = "single";
  const auto one = gpu::Inventory::FromPartsForTest({rtx}, {});
  EXPECT_EQ(GfdLabels(*one, c, Opts(false))["nvidia.com/gpu.product"],
            "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-MIG-1g.24gb.me");
  rtx.migs[0].profile = "1g.24gb";
  c.sharing.strategy = deviceplugin::SharingStrategy::kTimeSlicing;
  c.sharing.resources = {{"nvidia.com/gpu", 2, "", {}, "", {}}};
  const auto shared = gpu::Inventory::FromPartsForTest({rtx}, {});
  EXPECT_EQ(GfdLabels(*shared, c, Opts(false))["nvidia.com/gpu.product"],
            "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstat-MIG-1g.24gb-SHARED");
}

TEST(GfdLabels, Ownership) {
  EXPECT_TRUE(deviceplugin::OwnsLabel("nvidia.com/gpu.product"));
  EXPECT_TRUE(deviceplugin::OwnsLabel("nvidia.com/gpu.mode"));
  EXPECT_TRUE(deviceplugin::OwnsLabel("nvidia.com/gpu.engines.jpeg"));
  EXPECT_TRUE(deviceplugin::OwnsLabel("nvidia.com/mig-1g.10gb.count"));
  EXPECT_TRUE(deviceplugin::OwnsLabel("nvidia.com/mig-1g.10gb.me.engines.ofa"));
  EXPECT_FALSE(deviceplugin::OwnsLabel("nvidia.com/gpu.present"));
  EXPECT_FALSE(deviceplugin::OwnsLabel("nvidia.com/gpu.deploy.device-plugin"));
  EXPECT_FALSE(deviceplugin::OwnsLabel("nvidia.com/device-plugin.config"));
  EXPECT_FALSE(deviceplugin::OwnsLabel("nvidia.com/mig.config"));
  EXPECT_FALSE(deviceplugin::OwnsLabel("kubernetes.io/hostname"));
  EXPECT_EQ(deviceplugin::GpuFamily(8, 9), "ada-lovelace");
  EXPECT_EQ(deviceplugin::GpuFamily(7, 5), "turing");
  EXPECT_EQ(deviceplugin::GpuFamily(10, 0), "blackwell");
}

TEST(InventoryAnnotation, CompactVersionedAndStable) {
  testing::SimGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  Config c;
  const std::string a = InventoryAnnotation(*g.inv, c);
  EXPECT_EQ(a, InventoryAnnotation(*g.inv, c)) << "same inventory, same bytes";
  const json j = json::parse(a);
  EXPECT_EQ(j["v"], 1);
  ASSERT_EQ(j["gpus"].size(), g.inv->gpus().size());
  EXPECT_EQ(j["gpus"][0]["uuid"], g.inv->gpus()[0].uuid);
  EXPECT_EQ(j["gpus"][0]["health"], "ok");
  EXPECT_EQ(j["gpus"][0]["i"], 0);
  EXPECT_EQ(j["gpus"][0]["model"], g.inv->gpus()[0].name);
  EXPECT_EQ(j["gpus"][0]["memMiB"], g.inv->gpus()[0].memory_mib);
  EXPECT_GT(j["gpus"][0]["memMiB"].get<int64_t>(), 80000) << "an H100 80GB";
  EXPECT_EQ(j["gpus"][0]["numa"], g.inv->gpus()[0].numa_node);
  EXPECT_FALSE(j["gpus"][0].contains("slots")) << "no sharing configured";
  EXPECT_TRUE(j["nvlinkIslands"].is_array());
  EXPECT_TRUE(j["pcieIslands"].is_array());
  EXPECT_EQ(j["sharing"]["mode"], "none");
  EXPECT_LT(a.size(), 4096u) << "compact";
}

TEST(InventoryAnnotation, SharingGpusCarryTheirSlotsAndTheExtenderReadsThem) {
  testing::SimGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  ASSERT_GE(g.inv->gpus().size(), 3u);
  // GPUs 0 and 1 serve kgpu.io/gpu (16 slots each); the others stay whole nvidia.com/gpu.
  auto c = deviceplugin::ParseConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
      "    - {name: nvidia.com/gpu, replicas: 16, rename: kgpu.io/gpu, devices: [0, 1]}\n",
      "t");
  ASSERT_TRUE(c.ok()) << c.status();
  const json j = json::parse(InventoryAnnotation(*g.inv, *c));
  EXPECT_EQ(j["gpus"][0]["slots"], 16);
  EXPECT_EQ(j["gpus"][1]["slots"], 16);
  EXPECT_FALSE(j["gpus"][2].contains("slots"));
  // Without a CUDA interposer the node offers no hard limits: time-slicing without isolation only.
  EXPECT_EQ(j["sharing"]["kgpu"]["enforcement"], json({"none"}));
  // With one (--cuda-interposer), hard first: the default for shares that do not say.
  c->cuda_interposer = "/var/lib/kgpu/isolation/0.1.0/libkgpu-cuda.so";
  auto node = extender::ParseInventoryAnnotation("n", InventoryAnnotation(*g.inv, *c));
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->gpus[0].slots, 16);
  EXPECT_EQ(node->gpus[2].slots, 0);
  EXPECT_EQ(node->enforcement, (std::vector<std::string>{"hard", "none"}));
  // Without a kgpu.io/gpu resource nothing says shares.
  const json plain = json::parse(InventoryAnnotation(*g.inv, Config{}));
  EXPECT_FALSE(plain["gpus"][0].contains("slots"));
  EXPECT_FALSE(plain["sharing"].contains("kgpu"));
}

// Each GPU's memory in use (NVML) rides in the annotation for the extender's drift check, in
// steps of kUsedMemoryStepMiB so that the Node changes on real changes only.
TEST(InventoryAnnotation, MemoryInUseInStepsForTheExtender) {
  testing::SimGpus g("dgx-h100");
  ASSERT_TRUE(g.inv && g.lib);
  UsedMemoryMiB last;
  const auto base = UsedMemory(*g.lib, *g.inv, &last);
  ASSERT_EQ(base.size(), g.inv->gpus().size());
  const std::string uuid0 = g.inv->gpus()[0].uuid;
  ASSERT_EQ(g.sim.Ctl("proc add 0 4242 --mem 20000"), 0);
  const auto after = UsedMemory(*g.lib, *g.inv, &last);
  EXPECT_EQ(after.at(uuid0), base.at(uuid0) + 20000);
  // A small move stays at the published step.
  ASSERT_EQ(g.sim.Ctl("proc add 0 4243 --mem 300"), 0);
  EXPECT_EQ(UsedMemory(*g.lib, *g.inv, &last).at(uuid0), base.at(uuid0) + 20000);
  ASSERT_EQ(g.sim.Ctl("proc add 0 4244 --mem 300"), 0);
  EXPECT_EQ(UsedMemory(*g.lib, *g.inv, &last).at(uuid0), base.at(uuid0) + 20600);
  const auto used = UsedMemory(*g.lib, *g.inv, &last);
  auto node = extender::ParseInventoryAnnotation("n", InventoryAnnotation(*g.inv, Config{}, nullptr, &used));
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->gpus[0].used_mib, base.at(uuid0) + 20600);
  EXPECT_EQ(node->gpus[1].used_mib, base.at(g.inv->gpus()[1].uuid));
  // Without readings the field is absent (an older node agent): the extender does not guess.
  auto plain = extender::ParseInventoryAnnotation("n", InventoryAnnotation(*g.inv, Config{}));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->gpus[0].used_mib, -1);
}

TEST(PublishToNode, PatchesOnlyOwnedLabelsAndOnlyWhenChanged) {
  testing::SimGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  kgpu::testing::FakeApiServer server;
  ASSERT_TRUE(server.Start().ok());
  json node = {{"metadata",
                {{"name", "gpu-node-1"},
                 {"labels",
                  {{"kubernetes.io/hostname", "gpu-node-1"},
                   {"nvidia.com/gpu.present", "true"},
                   {"nvidia.com/mig-1g.10gb.count", "7"},
                   {"nvidia.com/gpu.product", "stale"}}}}}};
  ASSERT_EQ(server.Create("nodes", "", node).code, 201);
  k8s::Config kc;
  kc.server = server.url();
  auto client = std::move(*k8s::Client::Create(kc));
  Config c;
  auto labels = GfdLabels(*g.inv, c, Opts(false));
  const std::string ann = InventoryAnnotation(*g.inv, c);
  auto r = PublishToNode(*client, "gpu-node-1", labels, ann);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->patched);
  EXPECT_EQ(r->labels_removed, 1u) << "the stale MIG label of a previous layout";
  EXPECT_TRUE(r->annotation_changed);
  auto stored = server.Get("nodes", "", "gpu-node-1").body;
  EXPECT_EQ(stored["metadata"]["labels"]["kubernetes.io/hostname"], "gpu-node-1");
  EXPECT_EQ(stored["metadata"]["labels"]["nvidia.com/gpu.present"], "true") << "not ours";
  EXPECT_FALSE(stored["metadata"]["labels"].contains("nvidia.com/mig-1g.10gb.count"));
  EXPECT_EQ(stored["metadata"]["labels"]["nvidia.com/gpu.product"], labels["nvidia.com/gpu.product"]);
  EXPECT_EQ(stored["metadata"]["annotations"][kInventoryAnnotation], ann);
  const int64_t rv = server.ResourceVersion();
  auto again = PublishToNode(*client, "gpu-node-1", labels, ann);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->patched) << "nothing changed: no write";
  EXPECT_EQ(server.ResourceVersion(), rv);
  // A sharing change relabels.
  c.sharing.strategy = deviceplugin::SharingStrategy::kTimeSlicing;
  c.sharing.resources = {{"nvidia.com/gpu", 2, "", {}, "", {}}};
  auto relabel =
      PublishToNode(*client, "gpu-node-1", GfdLabels(*g.inv, c, Opts(false)), InventoryAnnotation(*g.inv, c));
  ASSERT_TRUE(relabel.ok());
  EXPECT_TRUE(relabel->patched && relabel->annotation_changed);
  EXPECT_EQ(server.Get("nodes", "", "gpu-node-1").body["metadata"]["labels"]["nvidia.com/gpu.replicas"], "2");
  EXPECT_TRUE(k8s::IsApiNotFound(PublishToNode(*client, "missing", labels, ann).status()));
}

// The share capacity autoscalers read (facts schedulers-and-quota §7(b)9): on the status
// subresource, capacity and allocatable alike, only when it changed, and removed when the node no
// longer serves shares; GPUs 0-3 of 8 serve kgpu.io/gpu here.
TEST(PublishToNode, ShareCapacityForAutoscalers) {
  testing::SimGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  kgpu::testing::FakeApiServer server;
  ASSERT_TRUE(server.Start().ok());
  ASSERT_EQ(server
                .Create("nodes", "",
                        {{"metadata", {{"name", "n1"}}},
                         {"status", {{"capacity", {{"cpu", "64"}}}, {"allocatable", {{"cpu", "63"}}}}}})
                .code,
            201);
  k8s::Config kc;
  kc.server = server.url();
  auto client = std::move(*k8s::Client::Create(kc));
  Config c;
  c.sharing.strategy = deviceplugin::SharingStrategy::kTimeSlicing;
  c.sharing.resources = {{"nvidia.com/gpu", 16, "kgpu.io/gpu", {"0", "1", "2", "3"}, "", {}}};
  const auto capacity = ShareCapacity(*g.inv, c);
  const int64_t mib = static_cast<int64_t>(g.inv->gpus()[0].memory_mib);
  EXPECT_EQ(capacity, (std::map<std::string, int64_t>{{"kgpu.io/gpu-memory", 4 * mib}, {"kgpu.io/gpu-cores", 400}}));
  const auto labels = GfdLabels(*g.inv, c, Opts(false));
  const std::string ann = InventoryAnnotation(*g.inv, c);
  auto r = PublishToNode(*client, "n1", labels, ann, &capacity);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->capacity_changed);
  json status = server.Get("nodes", "", "n1").body["status"];
  for (const char* field : {"capacity", "allocatable"}) {
    EXPECT_EQ(status[field]["kgpu.io/gpu-memory"], std::to_string(4 * mib)) << field;
    EXPECT_EQ(status[field]["kgpu.io/gpu-cores"], "400") << field;
  }
  EXPECT_EQ(status["capacity"]["cpu"], "64") << "kubelet's figures untouched";
  EXPECT_EQ(status["allocatable"]["cpu"], "63");
  const int64_t rv = server.ResourceVersion();
  auto again = PublishToNode(*client, "n1", labels, ann, &capacity);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->patched);
  EXPECT_EQ(server.ResourceVersion(), rv);
  // No shares any more: the figures go.
  const std::map<std::string, int64_t> none = ShareCapacity(*g.inv, Config{});
  EXPECT_TRUE(none.empty());
  auto gone = PublishToNode(*client, "n1", labels, ann, &none);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_TRUE(gone->capacity_changed);
  status = server.Get("nodes", "", "n1").body["status"];
  EXPECT_FALSE(status["capacity"].contains("kgpu.io/gpu-memory"));
  EXPECT_FALSE(status["allocatable"].contains("kgpu.io/gpu-cores"));
  EXPECT_EQ(status["capacity"]["cpu"], "64");
}

TEST(InventoryAnnotation, LiveHealthIsThePlugins) {
  testing::SimGpus g("dgx-a100-mig");
  ASSERT_TRUE(g.inv);
  Config c;
  const auto& gpus = g.inv->gpus();
  size_t mig_gpu = 0;
  while (mig_gpu < gpus.size() && gpus[mig_gpu].migs.empty()) ++mig_gpu;
  ASSERT_LT(mig_gpu, gpus.size());
  size_t whole = 0;
  while (whole < gpus.size() && gpus[whole].mig_enabled) ++whole;
  ASSERT_LT(whole, gpus.size());
  LiveHealth live;
  for (const auto& gpu : gpus) live[gpu.uuid] = true;
  live[gpus[whole].uuid] = false;
  live[gpus[mig_gpu].migs[0].uuid] = false;
  live[gpus[mig_gpu].uuid] = false;  // a device on it is Unhealthy
  const json j = json::parse(InventoryAnnotation(*g.inv, c, &live));
  for (size_t i = 0; i < gpus.size(); ++i) {
    EXPECT_EQ(j["gpus"][i]["health"], i == whole || i == mig_gpu ? "unhealthy" : "ok") << i;
  }
  EXPECT_EQ(j["gpus"][mig_gpu]["mig"][0]["health"], "unhealthy");
  if (gpus[mig_gpu].migs.size() > 1) {
    EXPECT_EQ(j["gpus"][mig_gpu]["mig"][1]["health"], "ok");
  }
  // Discovery's health without live health; a UUID the plugin does not serve keeps it.
  EXPECT_EQ(json::parse(InventoryAnnotation(*g.inv, c))["gpus"][whole]["health"], "ok");
  LiveHealth partial = {{gpus[whole].uuid, false}};
  const json p = json::parse(InventoryAnnotation(*g.inv, c, &partial));
  EXPECT_EQ(p["gpus"][whole]["health"], "unhealthy");
  EXPECT_EQ(p["gpus"][whole == 0 ? 1 : 0]["health"], "ok");
}

using testing::WaitFor;  // testing/poll.h

// The publisher behind `kgpu node --publish-labels`: a pass at start, one per burst of
// notifications, a failed pass retried, and a notifier that is harmless once it stopped.
TEST(LabelPublisher, PublishesOnStartAndOnChangeAndRetries) {
  testing::SimGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  kgpu::testing::FakeApiServer server;
  ASSERT_TRUE(server.Start().ok());
  char dir[] = "/tmp/kgpu-publisher-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string kubeconfig = std::string(dir) + "/kubeconfig";
  std::ofstream(kubeconfig) << server.Kubeconfig();
  NodeLabelsFlags flags;
  flags.kubeconfig = kubeconfig;
  flags.node_name = "gpu-node-1";
  flags.no_timestamp = true;
  auto labeller = NodeLabeller::Create(flags);
  ASSERT_TRUE(labeller.ok()) << labeller.status();
  std::mutex mu;
  LiveHealth live;
  auto config = std::make_shared<const Config>();
  std::atomic<int> calls{0};
  LabelPublisher publisher(
      std::move(*labeller),
      [&]() -> absl::StatusOr<LabelPublisher::Snapshot> {
        ++calls;
        std::lock_guard<std::mutex> lock(mu);
        return LabelPublisher::Snapshot{g.inv, config, live, {}};
      },
      std::chrono::seconds(0), std::chrono::milliseconds(50));
  auto notify = publisher.Notifier();
  publisher.Start();
  // The Node does not exist yet: the first pass fails and is retried (1 s backoff).
  ASSERT_TRUE(WaitFor([&] { return publisher.passes() >= 1; }));
  ASSERT_EQ(server.Create("nodes", "", {{"metadata", {{"name", "gpu-node-1"}, {"labels", {{"team", "ml"}}}}}}).code,
            201);
  auto node = [&] { return server.Get("nodes", "", "gpu-node-1").body; };
  ASSERT_TRUE(
      WaitFor([&] { return node()["metadata"].value("labels", json::object()).contains("nvidia.com/gpu.count"); }));
  EXPECT_EQ(node()["metadata"]["labels"]["team"], "ml");
  // A burst of changes makes one pass; the annotation shows the new health. (The source is
  // called once per pass, before the pass writes: `calls` is stable once the labels are there.)
  EXPECT_GE(publisher.passes(), 1u);
  const int before = calls.load();
  {
    std::lock_guard<std::mutex> lock(mu);
    live[g.inv->gpus()[3].uuid] = false;
  }
  for (int i = 0; i < 20; ++i) notify();
  ASSERT_TRUE(WaitFor([&] {
    const json a = json::parse(node()["metadata"]["annotations"].value(kInventoryAnnotation, "{}"));
    return a.contains("gpus") && a["gpus"][3]["health"] == "unhealthy";
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let a stray second pass show, if any
  EXPECT_EQ(calls.load(), before + 1) << "one pass per burst";
  // A pass that changes nothing writes nothing.
  const int64_t rv = server.ResourceVersion();
  notify();
  ASSERT_TRUE(WaitFor([&] { return calls.load() == before + 2; }));
  publisher.Stop();  // the pass has finished
  EXPECT_EQ(server.ResourceVersion(), rv);
  publisher.Stop();
  notify();  // after Stop: a no-op, not a use of a stopped publisher
  const int c = calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(calls.load(), c);
  std::filesystem::remove_all(dir);
}

// Relabel on an interval besides the changes: passes keep coming with no Notify(), and a pass
// whose labels changed meanwhile (here: the source's inventory) writes them.
TEST(LabelPublisher, RelabelsOnTheInterval) {
  testing::SimGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  kgpu::testing::FakeApiServer server;
  ASSERT_TRUE(server.Start().ok());
  ASSERT_EQ(server.Create("nodes", "", {{"metadata", {{"name", "gpu-node-1"}}}}).code, 201);
  char dir[] = "/tmp/kgpu-publisher-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string kubeconfig = std::string(dir) + "/kubeconfig";
  std::ofstream(kubeconfig) << server.Kubeconfig();
  NodeLabelsFlags flags;
  flags.kubeconfig = kubeconfig;
  flags.node_name = "gpu-node-1";
  flags.no_timestamp = true;
  auto labeller = NodeLabeller::Create(flags);
  ASSERT_TRUE(labeller.ok()) << labeller.status();
  std::mutex mu;
  auto config = std::make_shared<const Config>();
  LiveHealth live;
  LabelPublisher publisher(
      std::move(*labeller),
      [&]() -> absl::StatusOr<LabelPublisher::Snapshot> {
        std::lock_guard<std::mutex> lock(mu);
        return LabelPublisher::Snapshot{g.inv, config, live, {}};
      },
      std::chrono::seconds(1), std::chrono::milliseconds(50));
  publisher.Start();
  auto annotation = [&] {
    return json::parse(server.Get("nodes", "", "gpu-node-1")
                           .body["metadata"]
                           .value("annotations", json::object())
                           .value(kInventoryAnnotation, "{}"));
  };
  ASSERT_TRUE(WaitFor([&] { return annotation().contains("gpus"); }));
  const uint64_t first = publisher.passes();
  {
    std::lock_guard<std::mutex> lock(mu);
    live[g.inv->gpus()[5].uuid] = false;  // no Notify(): only the interval can publish it
  }
  ASSERT_TRUE(WaitFor([&] { return annotation()["gpus"][5]["health"] == "unhealthy"; }, std::chrono::seconds(5)));
  // The pass that wrote it is counted once Publish has returned, a moment after the write shows.
  EXPECT_TRUE(WaitFor([&] { return publisher.passes() >= first + 1; }, std::chrono::seconds(5)));
  ASSERT_TRUE(WaitFor([&] { return publisher.passes() >= first + 2; }, std::chrono::seconds(5)));
  publisher.Stop();
  std::filesystem::remove_all(dir);
}

TEST(LabelPublisher, FlagErrorsNameTheFlag) {
  NodeLabelsFlags flags;
  auto l = NodeLabeller::Create(flags);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("--node-name"), std::string::npos) << l.status();
  flags.node_name = "n";
  flags.in_cluster = true;
  flags.kubeconfig = "/x";
  l = NodeLabeller::Create(flags);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("--in-cluster and --kubeconfig"), std::string::npos) << l.status();
  flags.output = "file";  // no API: no node name or kubeconfig needed
  flags.node_name.clear();
  EXPECT_TRUE(NodeLabeller::Create(flags).ok());
}

TEST(FeatureFile, WrittenAtomically) {
  char dir[] = "/tmp/kgpu-nfd-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/features.d/gfd";
  ASSERT_TRUE(WriteFeatureFile(path, {{"nvidia.com/gpu.count", "8"}, {"nvidia.com/gpu.replicas", "1"}}).ok());
  EXPECT_EQ(*ReadFile(path), "nvidia.com/gpu.count=8\nnvidia.com/gpu.replicas=1\n");
  std::filesystem::remove_all(dir);
}

// The cluster half of kgpu doctor says why a count is missing or 0, from the Node as the API
// server has it and what the local plugins serve.
class DoctorClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start().ok());
    k8s::Config kc;
    kc.server = server_.url();
    kc.qps = 0;
    client_ = std::move(*k8s::Client::Create(kc));
  }
  // Creates (or replaces) Node n with the status, labels and spec given; runs the checks.
  std::vector<Check> Run(const json& capacity, const json& allocatable, const json& labels,
                         const std::map<std::string, Served>& served, size_t gpus, const json& spec = json::object()) {
    (void)server_.Delete("nodes", "", "n");
    json node = {{"metadata", {{"name", "n"}, {"labels", labels}}},
                 {"spec", spec},
                 {"status",
                  {{"capacity", capacity},
                   {"allocatable", allocatable},
                   {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
    EXPECT_EQ(server_.Create("nodes", "", node).code, 201);
    return ClusterChecks(*client_, "n", served, gpus, kNow);
  }
  static const Check* Find(const std::vector<Check>& checks, const std::string& name) {
    for (const auto& c : checks) {
      if (c.name == name) return &c;
    }
    ADD_FAILURE() << "no check " << name;
    return nullptr;
  }
  static constexpr int64_t kNow = 1'800'000'000;
  const json good_labels_ = {{"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"},
                             {"nvidia.com/gpu.count", "8"},
                             {"nvidia.com/gfd.timestamp", std::to_string(kNow - 30)}};
  kgpu::testing::FakeApiServer server_;
  std::unique_ptr<k8s::Client> client_;
};

TEST_F(DoctorClusterTest, SaysWhyACountIsMissingOrZero) {
  const std::map<std::string, Served> eight = {{"nvidia.com/gpu", {8, 8}}};
  // Everything in order.
  auto ok = Run({{"nvidia.com/gpu", "8"}}, {{"nvidia.com/gpu", "8"}}, good_labels_, eight, 8);
  EXPECT_EQ(Find(ok, "Node nvidia.com/gpu")->verdict, Verdict::kPass);
  EXPECT_EQ(Find(ok, "Node nvidia.com/gpu")->detail, "capacity 8, allocatable 8");
  EXPECT_EQ(Find(ok, "GFD labels")->verdict, Verdict::kPass);
  EXPECT_EQ(Find(ok, "Schedulable")->verdict, Verdict::kPass);
  // Not on the Node at all: the plugin did not register.
  auto missing = Run({{"cpu", "64"}}, {{"cpu", "64"}}, good_labels_, eight, 8);
  const Check* m = Find(missing, "Node nvidia.com/gpu");
  EXPECT_EQ(m->verdict, Verdict::kFail);
  EXPECT_NE(m->detail.find("the plugin did not register"), std::string::npos) << m->detail;
  EXPECT_EQ(m->detail.find("renamed"), std::string::npos) << m->detail;
  // Missing, and the Node shows another nvidia.com resource: a rename.
  auto renamed = Run({{"nvidia.com/gpu.shared", "32"}}, {{"nvidia.com/gpu.shared", "32"}}, good_labels_, eight, 8);
  const Check* r = Find(renamed, "Node nvidia.com/gpu");
  EXPECT_EQ(r->verdict, Verdict::kFail);
  EXPECT_NE(r->detail.find("the Node shows nvidia.com/gpu.shared=32 instead (a renamed resource?)"), std::string::npos)
      << r->detail;
  // Capacity kept, allocatable 0, the plugin serving healthy devices: kubelet lost the stream.
  auto restarted = Run({{"nvidia.com/gpu", "8"}}, {{"nvidia.com/gpu", "0"}}, good_labels_, eight, 8);
  const Check* k = Find(restarted, "Node nvidia.com/gpu");
  EXPECT_EQ(k->verdict, Verdict::kFail);
  EXPECT_NE(k->detail.find("kubelet lost the plugin's stream"), std::string::npos) << k->detail;
  EXPECT_NE(k->fix.find("registers again"), std::string::npos) << k->fix;
  // Allocatable 0 and nothing healthy served: every device is unhealthy.
  auto sick = Run({{"nvidia.com/gpu", "8"}}, {{"nvidia.com/gpu", "0"}}, good_labels_, {{"nvidia.com/gpu", {8, 0}}}, 8);
  const Check* u = Find(sick, "Node nvidia.com/gpu");
  EXPECT_EQ(u->verdict, Verdict::kFail);
  EXPECT_EQ(u->detail, "allocatable 0: all 8 devices are unhealthy");
  // Counts that differ from what the plugin serves: a WARN with both.
  auto differ =
      Run({{"nvidia.com/gpu", "8"}}, {{"nvidia.com/gpu", "8"}}, good_labels_, {{"nvidia.com/gpu", {8, 7}}}, 8);
  const Check* d = Find(differ, "Node nvidia.com/gpu");
  EXPECT_EQ(d->verdict, Verdict::kWarn);
  EXPECT_NE(d->detail.find("the plugin serves 8/7 healthy"), std::string::npos) << d->detail;
  // No local plugin: said, not silently passed.
  auto none = Run({{"nvidia.com/gpu", "8"}}, {{"nvidia.com/gpu", "8"}}, good_labels_, {}, 8);
  EXPECT_EQ(Find(none, "Node allocatable")->verdict, Verdict::kWarn);
  // No local plugin and allocatable 0 (kubelet keeps capacity, zeroes allocatable when the plugin
  // is gone): the node cannot serve GPUs, a FAIL with the fix.
  auto gone = Run({{"nvidia.com/gpu", "8"}}, {{"nvidia.com/gpu", "0"}}, good_labels_, {}, 8);
  const Check* g = Find(gone, "Node allocatable");
  EXPECT_EQ(g->verdict, Verdict::kFail);
  EXPECT_EQ(
      g->detail.rfind("allocatable nvidia.com/gpu is 0 (capacity 8): no device plugin is registered with kubelet", 0),
      0u)
      << g->detail;
  EXPECT_NE(g->fix.find("kubectl describe node n | grep nvidia.com/gpu"), std::string::npos) << g->fix;
  // GPUs on the node and no nvidia.com resource at all: the same.
  auto never = Run({{"cpu", "64"}}, {{"cpu", "64"}}, good_labels_, {}, 8);
  EXPECT_EQ(Find(never, "Node allocatable")->verdict, Verdict::kFail);
}

TEST_F(DoctorClusterTest, CordonTaintsAndStaleLabels) {
  const std::map<std::string, Served> eight = {{"nvidia.com/gpu", {8, 8}}};
  const json cap = {{"nvidia.com/gpu", "8"}};
  auto cordoned = Run(cap, cap, good_labels_, eight, 8,
                      {{"unschedulable", true},
                       {"taints",
                        {{{"key", "kgpu.io/owner"}, {"value", "slurm"}, {"effect", "NoSchedule"}},
                         {{"key", "soft"}, {"effect", "PreferNoSchedule"}}}}});
  EXPECT_EQ(Find(cordoned, "Schedulable")->verdict, Verdict::kWarn);
  const Check* t = Find(cordoned, "Taints");
  EXPECT_EQ(t->verdict, Verdict::kWarn);
  EXPECT_EQ(t->detail, "GPU pods need tolerations for: kgpu.io/owner=slurm:NoSchedule");
  // gpu.count that disagrees with NVML.
  auto count = Run(cap, cap, good_labels_, eight, 4);
  const Check* c = Find(count, "GFD labels");
  EXPECT_EQ(c->verdict, Verdict::kWarn);
  EXPECT_EQ(c->detail, "nvidia.com/gpu.count=8 but NVML sees 4 GPU(s): the labels are stale");
  // Relabelled more than 10 minutes ago.
  json old = good_labels_;
  old["nvidia.com/gfd.timestamp"] = std::to_string(kNow - 3600);
  auto stale = Run(cap, cap, old, eight, 8);
  const Check* s = Find(stale, "GFD labels");
  EXPECT_EQ(s->verdict, Verdict::kWarn);
  EXPECT_EQ(s->detail, "last relabelled 3600 s ago (nvidia.com/gfd.timestamp)");
  // No labels at all.
  auto bare = Run(cap, cap, json::object(), eight, 8);
  EXPECT_EQ(Find(bare, "GFD labels")->verdict, Verdict::kWarn);
  // A Node that does not exist: FAIL naming it and the fix.
  auto nope = ClusterChecks(*client_, "nope", eight, 8, kNow);
  ASSERT_EQ(nope.size(), 1u);
  EXPECT_EQ(nope[0].verdict, Verdict::kFail);
  EXPECT_NE(nope[0].detail.find("no Node named \"nope\""), std::string::npos) << nope[0].detail;
}

}  // namespace
}  // namespace kgpu::cli
