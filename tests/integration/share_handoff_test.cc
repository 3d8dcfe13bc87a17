// The kgpu.io/gpu handoff (docs/sharing-model.md §5) end to end on one node: `kgpu device-plugin`
// as a process on the simulated dgx-h100 serving kgpu.io/gpu slots, the kubelet stand-in calling
// Allocate and then PreStartContainer as kubelet does (pre_start_required), the PodResources
// stand-in holding kubelet's container -> slot view, and the API server stand-in holding pods with
// allocation records. Many pods are admitted at once, in a random order, with slots deliberately
// on other GPUs than their records: every container gets exactly its record's GPUs and limits.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <signal.h>

#include "api/record.h"
#include "common/strings.h"
#include "deviceplugin/plan.h"
#include "k8s/client.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_podresources.h"
#include "testing/plugin_fixture.h"
#include "testing/plugin_process.h"
#include "testing/poll.h"
#include "testing/shell.h"

namespace kgpu {
namespace {
using json = nlohmann::json;
using namespace std::chrono_literals;

class ShareHandoffTest : public testing::PluginNodeTest {
 protected:
  void SetUp() override {
    Init("dgx-h100");
    ASSERT_TRUE(api_.Start().ok());
    ASSERT_EQ(api_.Create("namespaces", "", {{"metadata", {{"name", "ns"}}}}).code, 201);
    pr_ = std::make_unique<testing::FakePodResources>(sim_->dir() + "/pod-resources.sock");
    ASSERT_TRUE(pr_->Start().ok());
    cdi_ = sim_->dir() + "/cdi";
    kubeconfig_ = sim_->dir() + "/kubeconfig";
    std::ofstream(kubeconfig_) << api_.Kubeconfig();
    const auto devices = testing::Shell(std::string(KGPU_BIN) + " --nvml-library " + testing::SimNode::LibraryPath() +
                                        " devices --json");
    ASSERT_EQ(devices.code, 0) << devices.out;
    const json listed = json::parse(devices.out);
    for (const auto& g : listed["gpus"]) {
      uuids_.push_back(g["uuid"]);
      minors_[g["uuid"]] = g["minor"];
    }
    config_ = WriteConfig(kTimeSlicing);
    cuda_root_ = sim_->dir() + "/cuda";
    StartPlugin(true);
  }
  // The plugin, with the CUDA interposer (hard shares possible) or without.
  void StartPlugin(bool interposer, const std::vector<std::string>& extra = {}) {
    const int before = kubelet_->Get("kgpu.io/gpu") ? kubelet_->Get("kgpu.io/gpu")->registrations : 0;
    plugin_.reset();
    std::vector<std::string> args = {"--config-file",  config_,     "--kubeconfig",           kubeconfig_,
                                     "--node-name",    "test-node", "--pod-resources-socket", pr_->SocketPath(),
                                     "--cdi-spec-dir", cdi_};
    if (interposer)
      args.insert(args.end(), {"--cuda-interposer", KGPU_CUDA_INTERPOSER, "--cuda-shared-root", cuda_root_});
    args.insert(args.end(), extra.begin(), extra.end());
    plugin_ = std::make_unique<testing::Plugin>(sim_->dir(), args);
    ASSERT_TRUE(kubelet_->WaitFor(
        "kgpu.io/gpu",
        [&](const testing::ResourceState& s) {
          return s.connected && s.registrations > before && s.devices.size() == 64;
        },
        20s))
        << plugin_->Log();
    ASSERT_TRUE(kubelet_->WaitFor(
        "nvidia.com/gpu", [](const testing::ResourceState& s) { return s.devices.size() == 4; }, 10s));
  }
  static json Mounts(const json& spec) { return spec["devices"][0]["containerEdits"].value("mounts", json::array()); }
  void TearDown() override {
    plugin_.reset();
    pr_->Stop();
  }
  // GPUs 0-3 serve 16 kgpu.io/gpu slots each (time-slicing).
  static constexpr char kTimeSlicing[] =
      "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
      "    - {name: nvidia.com/gpu, replicas: 16, rename: kgpu.io/gpu, devices: [0, 1, 2, 3]}\n";
  // A pod whose container "main" holds `slot` and nothing else in kubelet's PodResources view.
  void PodHolding(const std::string& name, const api::RecordContainer& rc, const std::string& slot,
                  int64_t grace_s = 30) {
    CreatePod(name, rc, grace_s);
    v1::ListPodResourcesResponse view;
    testing::AddDevices(view, "ns", name, "main", "kgpu.io/gpu", {slot});
    pr_->SetListResponse(view);
  }
  // A pod bound to test-node with a record for container "main".
  void CreatePod(const std::string& name, const api::RecordContainer& rc, int64_t grace_s = 30) {
    api::AllocationRecord r{"test-node", {rc}};
    json pod = {
        {"metadata",
         {{"name", name}, {"namespace", "ns"}, {"annotations", {{"kgpu.io/allocation", api::EncodeRecord(r)}}}}},
        {"spec",
         {{"nodeName", "test-node"},
          {"terminationGracePeriodSeconds", grace_s},
          {"containers", json::array({{{"name", "main"}, {"image", "cuda"}}})}}}};
    ASSERT_EQ(api_.Create("pods", "ns", pod).code, 201);
  }
  // Slot IDs of GPU `gpu` (kubelet's view).
  std::vector<std::string> Slots(size_t gpu) {
    std::vector<std::string> out;
    const auto state = kubelet_->Get("kgpu.io/gpu");
    for (const auto& d : state->devices) {
      if (d.id.rfind(uuids_[gpu] + "::", 0) == 0) out.push_back(d.id);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // nvidia.com/gpu device IDs (GPUs 4-7), sorted.
  std::vector<std::string> WholeIds() {
    std::vector<std::string> ids;
    if (const auto whole = kubelet_->Get("nvidia.com/gpu")) {
      for (const auto& d : whole->devices) ids.push_back(d.id);
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  }
  // A record entry giving container "main" these whole GPUs.
  static api::RecordContainer WholeRecord(const std::vector<std::string>& gpus) {
    api::RecordContainer rc{"main", "nvidia.com/gpu", "", {}};
    for (const auto& g : gpus) rc.gpus.push_back({g, "", "", 0, 0});
    return rc;
  }
  json Spec(const std::string& cdi_name) {
    std::ifstream in(cdi_ + "/kgpu.io-share_" + cdi_name + ".json");
    std::stringstream s;
    s << in.rdbuf();
    return s.str().empty() ? json() : json::parse(s.str());
  }
  static std::map<std::string, std::string> Env(const json& spec) {
    std::map<std::string, std::string> env;
    for (const auto& e : spec["devices"][0]["containerEdits"]["env"]) {
      const std::string kv = e;
      env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    }
    return env;
  }
  std::vector<std::string> GpuNodes(const json& spec) {
    std::vector<std::string> out;
    for (const auto& n : spec["devices"][0]["containerEdits"]["deviceNodes"]) {
      const std::string p = n["path"];
      if (p.find_first_of("0123456789") != std::string::npos && p.rfind("/dev/nvidia", 0) == 0) out.push_back(p);
    }
    return out;
  }

  testing::FakeApiServer api_;
  std::unique_ptr<testing::FakePodResources> pr_;
  std::unique_ptr<testing::Plugin> plugin_;
  std::string cdi_, kubeconfig_, config_, cuda_root_;
  std::vector<std::string> uuids_;
  std::map<std::string, int> minors_;
};

TEST_F(ShareHandoffTest, ManyPodsAtOnceInAnyOrderGetExactlyTheirRecords) {
  EXPECT_TRUE(kubelet_->Get("kgpu.io/gpu")->options.pre_start_required());
  // Whole GPUs too: their records are made to say what kubelet gave (WholeGpuRecordsAreMadeToSayWhatKubeletGave).
  EXPECT_TRUE(kubelet_->Get("nvidia.com/gpu")->options.pre_start_required());
  // (mps needs a plugin whose MPS daemons serve kgpu.io/gpu: MpsSharesAreClientsOfTheGpuDaemon)
  const char* modes[] = {"hard", "none"};
  struct Want {
    std::string pod, slot, gpu, mode;
    int64_t mem, cores;
  };
  std::vector<Want> pods;
  for (int i = 0; i < 16; ++i) {
    // The record says GPU i%4; kubelet's slot is on GPU (i+1)%4: the record must win.
    Want w{"p" + std::to_string(i),
           Slots(static_cast<size_t>((i + 1) % 4))[static_cast<size_t>(i / 4)],
           uuids_[static_cast<size_t>(i % 4)],
           modes[i % 2],
           1000 + 100 * i,
           5 + i};
    CreatePod(w.pod, {"main", "kgpu.io/gpu", w.mode, {{w.gpu, "", "", w.mem, w.cores}}});
    pods.push_back(w);
  }
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("admission order seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::shuffle(pods.begin(), pods.end(), rng);
  // kubelet: Allocate per container (any order), then its PodResources view, then PreStart for all
  // containers at once.
  v1::ListPodResourcesResponse view;
  for (const auto& w : pods) {
    auto a = kubelet_->Allocate("kgpu.io/gpu", {w.slot});
    ASSERT_TRUE(a.ok()) << a.status();
    const auto& c = a->container_responses(0);
    ASSERT_EQ(c.cdi_devices_size(), 1);
    EXPECT_EQ(c.cdi_devices(0).name(), "kgpu.io/share=" + api::ShareCdiName({w.slot}));
    EXPECT_FALSE(c.envs().contains("NVIDIA_VISIBLE_DEVICES")) << "the GPUs come from the record, not from the slot";
    testing::AddDevices(view, "ns", w.pod, "main", "kgpu.io/gpu", {w.slot});
  }
  pr_->SetListResponse(view);
  std::shuffle(pods.begin(), pods.end(), rng);
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(pods.size());
  for (size_t i = 0; i < pods.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = kubelet_->PreStartContainer("kgpu.io/gpu", {pods[i].slot}); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < pods.size(); ++i) {
    const Want& w = pods[i];
    ASSERT_TRUE(results[i].ok()) << w.pod << ": " << results[i] << "\n" << plugin_->Log();
    const json spec = Spec(api::ShareCdiName({w.slot}));
    ASSERT_FALSE(spec.is_null()) << w.pod;
    EXPECT_EQ(spec["kind"], "kgpu.io/share");
    EXPECT_EQ(spec["devices"][0]["name"], api::ShareCdiName({w.slot}));
    const auto env = Env(spec);
    EXPECT_EQ(env.at("NVIDIA_VISIBLE_DEVICES"), w.gpu) << w.pod;
    EXPECT_EQ(env.at("KGPU_ENFORCEMENT"), w.mode);
    EXPECT_EQ(env.at("KGPU_GPU_CORES"), std::to_string(w.cores));
    if (w.mode == "hard") {
      EXPECT_EQ(env.at("KGPU_CUDA_MEMORY_LIMIT"), w.gpu + "=" + std::to_string(w.mem) + "Mi");
      // The interposer preloaded from the node's copy, read-only, and the container's own
      // accounting directory (0777: a random-UID container writes its region there).
      EXPECT_EQ(env.at("LD_PRELOAD"), "/usr/lib/kgpu/libkgpu-cuda.so") << w.pod;
      EXPECT_EQ(env.at("KGPU_CUDA_SHARED_DIR"), "/run/kgpu-cuda") << w.pod;
      const json mounts = Mounts(spec);
      ASSERT_EQ(mounts.size(), 3u) << spec.dump();
      EXPECT_EQ(mounts[0]["hostPath"], KGPU_CUDA_INTERPOSER);
      EXPECT_EQ(mounts[0]["containerPath"], "/usr/lib/kgpu/libkgpu-cuda.so");
      EXPECT_EQ(mounts[0]["options"][0], "ro");
      // The directory with the limits read-only, the region file read-write over it.
      const std::string uid = api_.Get("pods", "ns", w.pod).body["metadata"]["uid"];
      const std::string dir = cuda_root_ + "/" + uid + "/main";
      EXPECT_EQ(mounts[1]["hostPath"], dir);
      EXPECT_EQ(mounts[1]["containerPath"], "/run/kgpu-cuda");
      EXPECT_EQ(mounts[1]["options"][0], "ro");
      EXPECT_EQ(mounts[2]["hostPath"], dir + "/kgpu-cuda.region");
      EXPECT_EQ(mounts[2]["containerPath"], "/run/kgpu-cuda/kgpu-cuda.region");
      EXPECT_EQ(mounts[2]["options"][0], "rw");
      const auto perms = std::filesystem::status(dir + "/kgpu-cuda.region").permissions();
      EXPECT_EQ(perms & std::filesystem::perms::all, std::filesystem::perms(0666)) << w.pod;
      std::ifstream config(dir + "/config");
      std::stringstream text;
      text << config.rdbuf();
      EXPECT_NE(text.str().find(Cat("memory ", w.gpu, " ", static_cast<uint64_t>(w.mem) << 20, "\n")),
                std::string::npos)
          << text.str();
      if (w.cores > 0 && w.cores < 100) {
        EXPECT_NE(text.str().find(Cat("cores ", w.gpu, " ", w.cores, "\n")), std::string::npos) << text.str();
        EXPECT_EQ(env.at("KGPU_CUDA_CORE_LIMIT"), Cat(w.gpu, "=", w.cores)) << w.pod;
      }
    } else {
      EXPECT_FALSE(env.contains("LD_PRELOAD")) << w.pod;
      EXPECT_TRUE(Mounts(spec).empty()) << w.pod;
    }
    if (w.mode == "none") {
      EXPECT_FALSE(env.contains("KGPU_CUDA_MEMORY_LIMIT"));
      // Never a limit accepted silently that nothing enforces: the pod's Event (logged too) says so.
      EXPECT_NE(plugin_->Log().find(Cat(w.gpu, " (", w.mem, " MiB, ", w.cores,
                                        "% cores); enforcement none (time-slicing without isolation: these memory "
                                        "and compute limits are reserved by the scheduler but NOT enforced")),
                std::string::npos)
          << w.pod << "\n"
          << plugin_->Log();
    } else {
      EXPECT_NE(plugin_->Log().find(Cat(w.gpu, " (", w.mem, " MiB, ", w.cores,
                                        "% cores); enforcement hard (memory and compute share enforced")),
                std::string::npos)
          << w.pod;
    }
    EXPECT_EQ(GpuNodes(spec), std::vector<std::string>{"/dev/nvidia" + std::to_string(minors_[w.gpu])}) << w.pod;
    const json pod = api_.Get("pods", "ns", w.pod).body;
    EXPECT_EQ(pod["metadata"]["annotations"]["kgpu.io/enforcement-applied"], "main=" + w.mode);
  }
}

TEST_F(ShareHandoffTest, MultiGpuShareAndRefusals) {
  // Two slots of GPU 0 for a record of GPUs 1 and 2: both GPUs, their limits.
  const auto s0 = Slots(0);
  CreatePod("two", {"main", "kgpu.io/gpu", "hard", {{uuids_[1], "", "", 3000, 20}, {uuids_[2], "", "", 3000, 20}}});
  v1::ListPodResourcesResponse view;
  testing::AddDevices(view, "ns", "two", "main", "kgpu.io/gpu", {s0[0], s0[1]});
  // A pod without a record, one whose record is for another node, one with too few GPUs.
  ASSERT_EQ(api_.Create("pods", "ns",
                        {{"metadata", {{"name", "bare"}, {"namespace", "ns"}}},
                         {"spec", {{"nodeName", "test-node"}, {"containers", json::array({{{"name", "main"}}})}}}})
                .code,
            201);
  testing::AddDevices(view, "ns", "bare", "main", "kgpu.io/gpu", {s0[2]});
  api::AllocationRecord other{"other-node", {{"main", "kgpu.io/gpu", "hard", {{uuids_[0], "", "", 1000, 0}}}}};
  ASSERT_EQ(api_.Create("pods", "ns",
                        {{"metadata",
                          {{"name", "moved"},
                           {"namespace", "ns"},
                           {"annotations", {{"kgpu.io/allocation", api::EncodeRecord(other)}}}}},
                         {"spec", {{"nodeName", "test-node"}, {"containers", json::array({{{"name", "main"}}})}}}})
                .code,
            201);
  testing::AddDevices(view, "ns", "moved", "main", "kgpu.io/gpu", {s0[3]});
  CreatePod("short", {"main", "kgpu.io/gpu", "hard", {{uuids_[3], "", "", 1000, 0}}});
  testing::AddDevices(view, "ns", "short", "main", "kgpu.io/gpu", {s0[4], s0[5]});
  pr_->SetListResponse(view);

  ASSERT_TRUE(kubelet_->Allocate("kgpu.io/gpu", {s0[0], s0[1]}).ok());
  ASSERT_TRUE(kubelet_->PreStartContainer("kgpu.io/gpu", {s0[1], s0[0]}).ok()) << plugin_->Log();
  const json spec = Spec(api::ShareCdiName({s0[0]}));
  const auto env = Env(spec);
  EXPECT_EQ(env.at("NVIDIA_VISIBLE_DEVICES"), uuids_[1] + "," + uuids_[2]);
  EXPECT_EQ(env.at("KGPU_CUDA_MEMORY_LIMIT"), uuids_[1] + "=3000Mi," + uuids_[2] + "=3000Mi");
  EXPECT_EQ(GpuNodes(spec), (std::vector<std::string>{"/dev/nvidia" + std::to_string(minors_[uuids_[1]]),
                                                      "/dev/nvidia" + std::to_string(minors_[uuids_[2]])}));

  auto bare = kubelet_->PreStartContainer("kgpu.io/gpu", {s0[2]});
  EXPECT_NE(std::string(bare.message()).find("ns/bare container main: the pod has no kgpu.io/allocation record"),
            std::string::npos)
      << bare;
  auto moved = kubelet_->PreStartContainer("kgpu.io/gpu", {s0[3]});
  EXPECT_NE(std::string(moved.message()).find("the record is for node other-node, this is test-node"),
            std::string::npos)
      << moved;
  auto shorter = kubelet_->PreStartContainer("kgpu.io/gpu", {s0[4], s0[5]});
  EXPECT_NE(std::string(shorter.message()).find("the record names 1 GPUs but kubelet gave 2 slots"), std::string::npos)
      << shorter;
  auto nobody = kubelet_->PreStartContainer("kgpu.io/gpu", {s0[9]});
  EXPECT_NE(std::string(nobody.message()).find("no container holds kgpu.io/gpu devices"), std::string::npos) << nobody;
}

// A hard share's accounting directory (<--cuda-shared-root>/<pod UID>/<container>) goes once its
// pod has left the node: deleted, or Succeeded/Failed. A running pod's stays, and so do a fresh
// directory (younger than the grace period), the time-slicing directories and anything else.
TEST_F(ShareHandoffTest, AccountingDirectoriesOfPodsThatLeftTheNodeAreRemoved) {
  StartPlugin(true, {"--cuda-accounting-sweep", "1s"});
  namespace fs = std::filesystem;
  const auto s0 = Slots(0);
  const std::vector<std::string> names = {"runs", "ends", "goes"};
  std::map<std::string, fs::path> dir;
  for (size_t i = 0; i < names.size(); ++i) {
    PodHolding(names[i], {"main", "kgpu.io/gpu", "hard", {{uuids_[0], "", "", 1000, 0}}}, s0[i], 1);
    ASSERT_TRUE(kubelet_->Allocate("kgpu.io/gpu", {s0[i]}).ok());
    ASSERT_TRUE(kubelet_->PreStartContainer("kgpu.io/gpu", {s0[i]}).ok()) << plugin_->Log();
    const std::string uid = api_.Get("pods", "ns", names[i]).body["metadata"]["uid"];
    dir[names[i]] = fs::path(cuda_root_) / uid;
    ASSERT_TRUE(fs::is_directory(dir[names[i]] / "main")) << dir[names[i]];
    // Older than the grace period (120 s).
    fs::last_write_time(dir[names[i]], fs::file_time_type::clock::now() - std::chrono::hours(1));
  }
  const fs::path fresh = fs::path(cuda_root_) / "00000000-0000-4000-8000-0000000f7e57";  // no pod, but new
  const fs::path timeslicing = fs::path(cuda_root_) / "timeslicing" / "0123456789abcdef";
  fs::create_directories(fresh / "main");
  fs::create_directories(timeslicing);
  // "ends" finishes; "goes" is deleted (1 s of grace, then the stand-in removes it as kubelet would).
  json ends = api_.Get("pods", "ns", "ends").body;
  ends["status"]["phase"] = "Succeeded";
  ASSERT_EQ(api_.Update("pods", "ns", ends).code, 200);
  json goes = api_.Get("pods", "ns", "goes").body;
  ASSERT_EQ(api_.Delete("pods", "ns", "goes").code, 200);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while ((fs::exists(dir["ends"]) || fs::exists(dir["goes"])) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_FALSE(fs::exists(dir["ends"])) << plugin_->Log();
  EXPECT_FALSE(fs::exists(dir["goes"])) << plugin_->Log();
  EXPECT_TRUE(fs::is_directory(dir["runs"] / "main"));
  EXPECT_TRUE(fs::is_directory(fresh / "main"));
  EXPECT_TRUE(fs::is_directory(timeslicing));
  EXPECT_NE(plugin_->Log().find("removed the accounting directory " + dir["goes"].string() + ": pod UID " +
                                goes["metadata"]["uid"].get<std::string>() + " is no longer on this node"),
            std::string::npos)
      << plugin_->Log();
}

// Without --cuda-interposer the node offers no hard limits: its inventory lists only none, and a
// record that asks for hard anyway (written by hand, or for a node that had the interposer) is
// refused at PreStart rather than started without its limit.
TEST_F(ShareHandoffTest, HardWithoutTheInterposerIsRefused) {
  StartPlugin(false);
  const auto s1 = Slots(1);
  CreatePod("strict", {"main", "kgpu.io/gpu", "hard", {{uuids_[1], "", "", 2000, 0}}});
  CreatePod("loose", {"main", "kgpu.io/gpu", "none", {{uuids_[1], "", "", 2000, 0}}});
  v1::ListPodResourcesResponse view;
  testing::AddDevices(view, "ns", "strict", "main", "kgpu.io/gpu", {s1[0]});
  testing::AddDevices(view, "ns", "loose", "main", "kgpu.io/gpu", {s1[1]});
  pr_->SetListResponse(view);
  ASSERT_TRUE(kubelet_->Allocate("kgpu.io/gpu", {s1[0]}).ok());
  auto strict = kubelet_->PreStartContainer("kgpu.io/gpu", {s1[0]});
  EXPECT_NE(std::string(strict.message())
                .find("ns/strict container main: the record asks for hard memory limits, but this "
                      "node's plugin has no CUDA interposer (--cuda-interposer)"),
            std::string::npos)
      << strict;
  EXPECT_TRUE(Spec(api::ShareCdiName({s1[0]})).is_null()) << "no CDI spec for a refused container";
  ASSERT_TRUE(kubelet_->Allocate("kgpu.io/gpu", {s1[1]}).ok());
  EXPECT_TRUE(kubelet_->PreStartContainer("kgpu.io/gpu", {s1[1]}).ok()) << plugin_->Log();
  // And a path that is not there stops the plugin with the flag named.
  std::filesystem::create_directories(sim_->dir() + "/bad");
  testing::Plugin bad(sim_->dir() + "/bad",
                      {"--config-file", config_, "--cuda-interposer", "/nonexistent/libkgpu-cuda.so"});
  EXPECT_EQ(bad.Wait(20s), 1) << bad.Log();
  EXPECT_NE(bad.Log().find("--cuda-interposer /nonexistent/libkgpu-cuda.so: No such file or directory"),
            std::string::npos)
      << bad.Log();
}

// MPS daemons serve kgpu.io/gpu (sharing.mps): a share in mps mode becomes a client of its GPU's
// daemon, with the record's memory and cores as its per-client limits; a node without them
// refuses such a record at PreStart.
TEST_F(ShareHandoffTest, MpsSharesAreClientsOfTheGpuDaemon) {
  const std::string root = sim_->dir() + "/mps";
  config_ = WriteConfig("version: v1\nflags:\n  mpsRoot: " + root +
                        "\nsharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    resources:\n"
                        "    - {name: nvidia.com/gpu, replicas: 16, rename: kgpu.io/gpu, devices: [0, 1, 2, 3]}\n");
  StartPlugin(false, {"--mps-control", std::string(KGPU_FAKE_MPS_DIR) + "/nvidia-cuda-mps-control"});
  struct StopDaemon {  // a plugin leaves its daemon running (the next one reuses it): stop it
    std::string pidfile;
    ~StopDaemon() {
      std::ifstream in(pidfile);
      int pid = 0;
      if (in >> pid && pid > 0) ::kill(pid, SIGTERM);
    }
  } stop{root + "/kgpu.io/gpu/pipe/nvidia-cuda-mps-control.pid"};
  const auto s2 = Slots(2);
  PodHolding("client", {"main", "kgpu.io/gpu", "mps", {{uuids_[2], "", "", 4000, 30}}}, s2[0]);
  ASSERT_TRUE(kubelet_->Allocate("kgpu.io/gpu", {s2[0]}).ok());
  ASSERT_TRUE(kubelet_->PreStartContainer("kgpu.io/gpu", {s2[0]}).ok()) << plugin_->Log();
  const json spec = Spec(api::ShareCdiName({s2[0]}));
  const auto env = Env(spec);
  EXPECT_EQ(env.at("KGPU_ENFORCEMENT"), "mps");
  EXPECT_EQ(env.at("CUDA_MPS_PIPE_DIRECTORY"), "/mps/kgpu.io/gpu/pipe");
  EXPECT_EQ(env.at("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "0=4000M");
  EXPECT_EQ(env.at("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "30");
  EXPECT_EQ(env.count("LD_PRELOAD"), 0u);
  const json mounts = Mounts(spec);
  ASSERT_EQ(mounts.size(), 2u) << mounts.dump();
  EXPECT_EQ(mounts[0]["hostPath"], root + "/kgpu.io/gpu/pipe");
  EXPECT_EQ(mounts[0]["containerPath"], "/mps/kgpu.io/gpu/pipe");
  EXPECT_EQ(mounts[1]["hostPath"], root + "/shm");
  EXPECT_EQ(mounts[1]["containerPath"], "/dev/shm");
  // The daemon those mounts lead to runs.
  EXPECT_TRUE(std::filesystem::exists(root + "/kgpu.io/gpu/pipe/control")) << plugin_->Log();

  // The time-slicing plugin has no daemon: the same kind of record is refused, not run unlimited.
  config_ = WriteConfig(kTimeSlicing);
  StartPlugin(true);
  const auto s3 = Slots(3);
  PodHolding("client2", {"main", "kgpu.io/gpu", "mps", {{uuids_[3], "", "", 4000, 30}}}, s3[0]);
  ASSERT_TRUE(kubelet_->Allocate("kgpu.io/gpu", {s3[0]}).ok());
  auto refused = kubelet_->PreStartContainer("kgpu.io/gpu", {s3[0]});
  EXPECT_NE(std::string(refused.message())
                .find("ns/client2 container main: the record asks for MPS limits, but no MPS "
                      "daemon serves kgpu.io/gpu on this node"),
            std::string::npos)
      << refused;
}

// Whole GPUs: kubelet chooses the device IDs (with our GetPreferredAllocation) and stays the
// authority on the node; at PreStartContainer the plugin makes the pod's record say what kubelet
// gave when the extender had chosen another GPU, and leaves every other record alone.
TEST_F(ShareHandoffTest, WholeGpuRecordsAreMadeToSayWhatKubeletGave) {
  EXPECT_TRUE(kubelet_->Get("nvidia.com/gpu")->options.pre_start_required())
      << "a plugin with API access asks for PreStartContainer";
  const std::vector<std::string> ids = WholeIds();
  ASSERT_EQ(ids.size(), 4U);
  CreatePod("moved", WholeRecord({ids[0], ids[1]}));  // kubelet gives ids[1] and ids[2]
  CreatePod("exact", WholeRecord({ids[3]}));          // kubelet gives what the record says
  json plain = {
      {"metadata", {{"name", "plain"}, {"namespace", "ns"}}},
      {"spec", {{"nodeName", "test-node"}, {"containers", json::array({{{"name", "main"}, {"image", "cuda"}}})}}}};
  ASSERT_EQ(api_.Create("pods", "ns", plain).code, 201);
  v1::ListPodResourcesResponse view;
  testing::AddDevices(view, "ns", "moved", "main", "nvidia.com/gpu", {ids[2], ids[1]});
  testing::AddDevices(view, "ns", "exact", "main", "nvidia.com/gpu", {ids[3]});
  testing::AddDevices(view, "ns", "plain", "main", "nvidia.com/gpu", {ids[0]});
  pr_->SetListResponse(view);
  auto rv = [&](const std::string& name) {
    return api_.Get("pods", "ns", name).body["metadata"].value("resourceVersion", "");
  };
  const std::string exact_rv = rv("exact"), plain_rv = rv("plain");
  // The first write of the correction meets a conflict (409): it reads the pod again and retries.
  api_.FailNext(1, 409, "/namespaces/ns/pods/moved", "PATCH");
  // All at once, as pod workers start containers.
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(4);
  const std::vector<std::vector<std::string>> calls = {{ids[2], ids[1]}, {ids[3]}, {ids[0]}, {"GPU-nobody-holds-this"}};
  for (size_t i = 0; i < calls.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = kubelet_->PreStartContainer("nvidia.com/gpu", calls[i]); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(results[i].ok()) << i << ": " << results[i] << plugin_->Log();
  // The records are checked after PreStartContainer has returned (a queue: kubelet's 30 s for the
  // call never depend on the API server).
  const std::string note = "kubelet gave nvidia.com/gpu " + ids[2] + "," + ids[1] + " (the extender had chosen " +
                           ids[0] + "," + ids[1] + ")";
  EXPECT_TRUE(testing::WaitFor([&] { return plugin_->Log().find(note) != std::string::npos; }, 10s)) << plugin_->Log();
  auto moved =
      api::ParseRecord(api_.Get("pods", "ns", "moved").body["metadata"]["annotations"].value("kgpu.io/allocation", ""));
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_EQ(moved->containers.size(), 1U);
  std::vector<std::string> got;
  for (const auto& g : moved->containers[0].gpus) got.push_back(g.uuid);
  EXPECT_EQ(got, (std::vector<std::string>{ids[2], ids[1]}));
  EXPECT_EQ(moved->node, "test-node");
  EXPECT_NE(
      plugin_->Log().find("PreStartContainer names device GPU-nobody-holds-this, which this plugin does not serve"),
      std::string::npos)
      << plugin_->Log();
  // A device nobody holds in PodResources: the container still starts (on kubelet's device), and
  // the log says why the record may be stale.
  pr_->SetListResponse(v1::ListPodResourcesResponse());
  EXPECT_TRUE(kubelet_->PreStartContainer("nvidia.com/gpu", {ids[0]}).ok());
  const std::string stale =
      "the allocation record may not say what the container has: no container holds "
      "nvidia.com/gpu devices " +
      ids[0] + " in kubelet's PodResources yet";
  EXPECT_TRUE(testing::WaitFor([&] { return plugin_->Log().find(stale) != std::string::npos; }, 10s)) << plugin_->Log();
  // One worker takes the reports in order: by now every earlier one is done.
  EXPECT_EQ(rv("exact"), exact_rv) << "a record that says what kubelet gave is not written";
  EXPECT_EQ(rv("plain"), plain_rv) << "a pod without a record is left alone";
}

// kubelet is steered to the extender's whole-GPU choice: GetPreferredAllocation answers with the
// devices a record on this node chooses for a container that holds none yet, when kubelet can
// give them (all available, the must-include ones among them); otherwise the plugin's own choice.
TEST_F(ShareHandoffTest, KubeletIsSteeredToTheRecordsWholeGpus) {
  const std::vector<std::string> ids = WholeIds();
  ASSERT_EQ(ids.size(), 4U);
  const auto own = kubelet_->GetPreferredAllocation("nvidia.com/gpu", ids, {}, 1);
  ASSERT_TRUE(own.ok()) << own.status();
  // The plugin's own choice for one GPU, and a record choosing another.
  const std::string other = (*own)[0] == ids[2] ? ids[1] : ids[2];
  CreatePod("one", WholeRecord({other}));
  auto got = kubelet_->GetPreferredAllocation("nvidia.com/gpu", ids, {}, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::vector<std::string>{other});
  // Once the container holds a GPU, its record no longer steers.
  v1::ListPodResourcesResponse view;
  testing::AddDevices(view, "ns", "one", "main", "nvidia.com/gpu", {other});
  pr_->SetListResponse(view);
  got = kubelet_->GetPreferredAllocation("nvidia.com/gpu", ids, {}, 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, *own);
  // Two GPUs: the record's pair (one GPU outside the plugin's own pair), unless kubelet must
  // include a device outside it.
  std::vector<std::string> rest;
  for (const auto& id : ids) {
    if (id != other) rest.push_back(id);
  }
  const auto own2 = kubelet_->GetPreferredAllocation("nvidia.com/gpu", rest, {}, 2);
  ASSERT_TRUE(own2.ok() && own2->size() == 2U);
  const std::set<std::string> own_pair(own2->begin(), own2->end());
  std::string outside;
  for (const auto& id : rest) {
    if (!own_pair.contains(id)) outside = id;
  }
  const std::vector<std::string> pair = {outside, (*own2)[0]};
  CreatePod("two", WholeRecord(pair));
  got = kubelet_->GetPreferredAllocation("nvidia.com/gpu", rest, {}, 2);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, pair);
  got = kubelet_->GetPreferredAllocation("nvidia.com/gpu", rest, {(*own2)[1]}, 2);
  ASSERT_TRUE(got.ok());
  EXPECT_NE(std::find(got->begin(), got->end(), (*own2)[1]), got->end());
  // A record's GPU kubelet does not offer (held elsewhere): not suggested.
  got = kubelet_->GetPreferredAllocation("nvidia.com/gpu", *own2, {}, 2);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::set<std::string>(got->begin(), got->end()), own_pair);
  // A pod whose init container (1 GPU) hands its device on to main (2 GPUs): kubelet allocates the
  // init container first, and it is steered to the first GPU of main's record, so that main can
  // then be given its pair with that one as must-include.
  const auto own1 = kubelet_->GetPreferredAllocation("nvidia.com/gpu", rest, {}, 1);
  ASSERT_TRUE(own1.ok() && own1->size() == 1U);
  std::vector<std::string> warm_pair;
  for (const auto& id : rest) {
    if (id != (*own1)[0] && warm_pair.empty()) warm_pair.push_back(id);
  }
  warm_pair.push_back((*own1)[0]);
  {
    api::AllocationRecord r{"test-node", {WholeRecord(warm_pair)}};
    json pod = {
        {"metadata",
         {{"name", "warm"}, {"namespace", "ns"}, {"annotations", {{"kgpu.io/allocation", api::EncodeRecord(r)}}}}},
        {"spec",
         {{"nodeName", "test-node"},
          {"initContainers",
           json::array(
               {{{"name", "fetch"}, {"image", "cuda"}, {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}})},
          {"containers",
           json::array(
               {{{"name", "main"}, {"image", "cuda"}, {"resources", {{"limits", {{"nvidia.com/gpu", "2"}}}}}}})}}}};
    ASSERT_EQ(api_.Create("pods", "ns", pod).code, 201);
  }
  got = kubelet_->GetPreferredAllocation("nvidia.com/gpu", rest, {}, 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, std::vector<std::string>{warm_pair[0]}) << "the init container: the first of its target's GPUs";
  ASSERT_EQ(api_.Delete("pods", "ns", "warm").code, 200);
  // A refused LIST (RBAC without `list`) pauses the steering, with a warning: the plugin's own
  // choice, also on the next call although the API would now answer.
  api_.FailNext(1, 403, "/api/v1/pods", "GET");
  for (int i = 0; i < 2; ++i) {
    got = kubelet_->GetPreferredAllocation("nvidia.com/gpu", rest, {}, 2);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(std::set<std::string>(got->begin(), got->end()), own_pair) << i;
  }
  EXPECT_NE(plugin_->Log().find("kubelet is not steered to the extender's choice for 5 minute(s)"), std::string::npos)
      << plugin_->Log();
  EXPECT_NE(plugin_->Log().find("grant `list` on pods"), std::string::npos) << plugin_->Log();
}

}  // namespace
}  // namespace kgpu
