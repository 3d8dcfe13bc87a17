// GFD labels and the inventory annotation from a simulated node, and publishing them to the
// API server stand-in without touching labels we do not own.
#include "cli/node_labels.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

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

deviceplugin::GfdOptions Opts(bool timestamp, int64_t now = 0, const std::string& machine = "") {
  deviceplugin::GfdOptions o;
  o.timestamp = timestamp;
  o.now_seconds = now;
  o.machine = machine;
  return o;
}

TEST(GfdLabels, WholeGpus) {
  testing::SimGpus g("dgx-h100");
  ASSERT_TRUE(g.inv);
  Config c;
  auto l = GfdLabels(*g.inv, c, Opts(true, 1700000000, "DGX H100"));
  EXPECT_EQ(l["nvidia.com/gpu.count"], std::to_string(g.inv->gpus().size()));
  EXPECT_EQ(l["nvidia.com/gpu.product"], deviceplugin::SanitizeProduct(g.inv->gpus()[0].name));
  EXPECT_EQ(l["nvidia.com/gpu.product"].find(' '), std::string::npos);
  EXPECT_EQ(l["nvidia.com/gpu.family"], "hopper");
  EXPECT_EQ(l["nvidia.com/gpu.compute.major"], "9");
  EXPECT_EQ(l["nvidia.com/gpu.memory"], std::to_string(g.inv->gpus()[0].memory_mib));
  EXPECT_EQ(l["nvidia.com/gpu.replicas"], "1");
  EXPECT_EQ(l["nvidia.com/gpu.sharing-strategy"], "none");
  EXPECT_EQ(l["nvidia.com/gfd.timestamp"], "1700000000");
  EXPECT_EQ(l["nvidia.com/gpu.machine"], "DGX-H100");
  EXPECT_EQ(l["nvidia.com/mps.capable"], "false");
  EXPECT_FALSE(l["nvidia.com/cuda.driver-version.full"].empty());
  EXPECT_EQ(l["nvidia.com/cuda.driver-version.major"], l["nvidia.com/cuda.driver.major"]);
  EXPECT_FALSE(l["nvidia.com/cuda.runtime-version.major"].empty());
  for (const auto& [k, v] : l) EXPECT_TRUE(deviceplugin::OwnsLabel(k)) << k;
  // Time-slicing: replicas, strategy and the -SHARED suffix.
  c.sharing.strategy = deviceplugin::SharingStrategy::kTimeSlicing;
  c.sharing.resources = {{"nvidia.com/gpu", 4, "", {}, "", {}}};
  auto shared = GfdLabels(*g.inv, c, Opts(false));
  EXPECT_EQ(shared["nvidia.com/gpu.replicas"], "4");
  EXPECT_EQ(shared["nvidia.com/gpu.sharing-strategy"], "time-slicing");
  EXPECT_EQ(shared["nvidia.com/gpu.product"], l["nvidia.com/gpu.product"] + "-SHARED");
  EXPECT_FALSE(shared.contains("nvidia.com/gfd.timestamp"));
  c.sharing.strategy = deviceplugin::SharingStrategy::kMps;
  EXPECT_EQ(GfdLabels(*g.inv, c, {})["nvidia.com/mps.capable"], "true");
  EXPECT_EQ(GfdLabels(*g.inv, c, {})["nvidia.com/gpu.sharing-strategy"], "mps");
}

TEST(GfdLabels, MigStrategies) {
  testing::SimGpus g("dgx-a100-mig");
  ASSERT_TRUE(g.inv);
  Config c;
  c.mig_strategy = "mixed";
  auto mixed = GfdLabels(*g.inv, c, {});
  EXPECT_EQ(mixed["nvidia.com/mig.capable"], "true");
  EXPECT_EQ(mixed["nvidia.com/mig.strategy"], "mixed");
  size_t mig_devices = 0;
  for (const auto& gpu : g.inv->gpus()) mig_devices += gpu.migs.size();
  ASSERT_GT(mig_devices, 0u);
  size_t counted = 0;
  for (const auto& [k, v] : mixed) {
    if (k.rfind("nvidia.com/mig-", 0) == 0 && k.ends_with(".count")) counted += std::stoul(v);
  }
  EXPECT_EQ(counted, mig_devices);
  const auto& m = g.inv->gpus()[0].migs.at(0);
  EXPECT_EQ(mixed["nvidia.com/mig-" + m.profile + ".product"],
            deviceplugin::SanitizeProduct(g.inv->gpus()[0].name) + "-MIG-" + m.profile);
  c.mig_strategy = "single";
  auto single = GfdLabels(*g.inv, c, {});
  EXPECT_NE(single["nvidia.com/gpu.product"].find("-MIG-"), std::string::npos);
  EXPECT_EQ(single["nvidia.com/gpu.count"], std::to_string(mig_devices));
}

TEST(GfdLabels, Ownership) {
  EXPECT_TRUE(deviceplugin::OwnsLabel("nvidia.com/gpu.product"));
  EXPECT_TRUE(deviceplugin::OwnsLabel("nvidia.com/mig-1g.10gb.count"));
  EXPECT_FALSE(deviceplugin::OwnsLabel("nvidia.com/gpu.present"));
  EXPECT_FALSE(deviceplugin::OwnsLabel("nvidia.com/gpu.deploy.device-plugin"));
  EXPECT_FALSE(deviceplugin::OwnsLabel("nvidia.com/device-plugin.config"));
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
                 {"status", {{"capacity", capacity}, {"allocatable", allocatable}}}};
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
