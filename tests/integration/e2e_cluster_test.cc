// Issue 12 end to end, in one test: the API server stand-in (quota admission), the kube-scheduler
// stand-in calling `kgpu extender` (a process on port 0) as kube-scheduler does (filter,
// prioritize with weights, bind through the extender, preempt), four simulated nodes — dgx-h100
// with whole GPUs, dgx-h100 with four GPUs serving kgpu.io/gpu shares, dgx-a100-mig in MIG mixed
// mode, hgx-h200 serving shares on all eight GPUs — each running `kgpu device-plugin
// --publish-labels` against its own kubelet stand-in, PodResources stand-in and kubelet's pod
// admission (testing/kubelet_admission.h, random order, PreStart concurrently).
//
// 200 pods of mixed shapes (about 60 s in the asan build on 2 cores; every phase below scales
// with kPods) in two namespaces, one under a ResourceQuota. The extender is SIGKILLed and restarted mid-run; 16 share
// pods are scheduled to one node at the same time. Checked for every bound pod: the node gives it exactly what its
// allocation record says (shares: the CDI spec's devices, NVIDIA_VISIBLE_DEVICES and limits; whole and MIG: the count,
// profile and exclusivity of what kubelet allocated); no GPU is over-committed, in the records and in the simulated
// NVML (each share container's memory is registered there as a process, which NVML refuses beyond the GPU's memory);
// the pod over quota is refused with the apiserver's `exceeded quota:` message.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include "api/record.h"
#include "deviceplugin/plan.h"
#include "exporter/attribution.h"
#include "extender/request.h"
#include "k8s/client.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_kubelet.h"
#include "testing/fake_kubelet_node.h"
#include "testing/fake_podresources.h"
#include "testing/fake_scheduler.h"
#include "testing/gpu_nodes.h"
#include "testing/kubelet_admission.h"
#include "testing/plugin_process.h"
#include "testing/poll.h"
#include "testing/spawn.h"

namespace kgpu {
namespace {
using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr int kPods = 200;

using testing::ReadFile;
using testing::WaitFor;

int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// One simulated node: its directory (kubelet dir, sim state, CDI specs), the kubelet stand-in, its
// Node status, PodResources, the device plugin process and kubelet's admission.
struct Node {
  std::string name, profile, dir, cdi;
  std::vector<std::string> sim_env;
  std::unique_ptr<testing::FakeKubelet> kubelet;
  std::unique_ptr<testing::FakePodResources> pod_resources;
  std::unique_ptr<testing::KubeletNodeStatus> status;
  std::unique_ptr<testing::Plugin> plugin;
  std::unique_ptr<testing::KubeletAdmission> admission;

  // `kgpu-simctl <args>` on this node's simulated NVML; its exit status and output.
  std::pair<int, std::string> Ctl(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {KGPU_SIMCTL};
    argv.insert(argv.end(), args.begin(), args.end());
    testing::SpawnOptions o;
    o.log = dir + "/simctl.log";
    o.env = sim_env;
    const pid_t pid = testing::Spawn(argv, o);
    if (pid <= 0) return {-1, std::strerror(errno)};
    const int rc = WaitExit(pid);
    return {rc, ReadFile(o.log)};
  }
};

struct Created {
  std::string ns, name, kind;  // kind: whole, mig, share
};

class E2eClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.Start().ok());
    k8s::Config kc;
    kc.server = api_.url();
    kc.qps = 0;
    client_ = std::move(*k8s::Client::Create(kc));
    char dir[] = "/tmp/kgpu-e2e-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
    // Each component with exactly the RBAC its deploy/ folders grant: the node agent (device
    // plugin, its labels, the share handoff) and the extender.
    kubeconfig_ = root_ + "/kubeconfig";
    std::ofstream(kubeconfig_) << api_.KubeconfigFor(
        DeployRbac({"device-plugin/rbac.yaml", "node-labels/in-plugin/rbac.yaml", "shares/rbac.yaml"}));
    extender_kubeconfig_ = root_ + "/extender-kubeconfig";
    std::ofstream(extender_kubeconfig_) << api_.KubeconfigFor(DeployRbac({"extender/extender.yaml"}));
    seed_ = std::random_device{}();
  }
  void TearDown() override {
    sched_.reset();
    StopExtender(SIGKILL);
    for (auto& n : nodes_) {
      n.plugin.reset();
      if (n.status) n.status->Stop();
      if (n.pod_resources) n.pod_resources->Stop();
      if (n.kubelet) n.kubelet->Stop();
    }
    if (!HasFailure()) std::filesystem::remove_all(root_);
  }

  void AddNode(const std::string& name, const std::string& profile, const std::string& config,
               const std::vector<std::string>& extra = {}) {
    Node n;
    n.name = name;
    n.profile = profile;
    n.dir = root_ + "/" + name;
    n.cdi = n.dir + "/cdi";
    std::filesystem::create_directories(n.cdi);
    n.sim_env = {"KGPU_SIM_NODE=" + profile, "KGPU_SIM_STATE=" + n.dir + "/sim.state", "KGPU_SIM_NODE_NAME=" + name};
    n.kubelet = std::make_unique<testing::FakeKubelet>(n.dir);
    ASSERT_TRUE(n.kubelet->Start().ok());
    n.pod_resources = std::make_unique<testing::FakePodResources>(n.dir + "/pod-resources.sock");
    ASSERT_TRUE(n.pod_resources->Start().ok());
    n.status = std::make_unique<testing::KubeletNodeStatus>(*n.kubelet, *client_, name);
    ASSERT_TRUE(n.status->SyncOnce().ok());  // kubelet registers its Node first
    n.status->Start();
    const std::string cfg = n.dir + "/config.yaml";
    std::ofstream(cfg) << config;
    std::vector<std::string> args = {"--config-file",
                                     cfg,
                                     "--publish-labels",
                                     "--kubeconfig",
                                     kubeconfig_,
                                     "--node-name",
                                     name,
                                     "--sleep-interval",
                                     "0",
                                     "--pod-resources-socket",
                                     n.pod_resources->SocketPath(),
                                     "--cdi-spec-dir",
                                     n.cdi};
    args.insert(args.end(), extra.begin(), extra.end());
    n.plugin = std::make_unique<testing::Plugin>(n.dir, args, n.sim_env);
    n.admission = std::make_unique<testing::KubeletAdmission>(*n.kubelet, *n.pod_resources, *client_, name,
                                                              seed_ + static_cast<uint32_t>(nodes_.size()));
    nodes_.push_back(std::move(n));
  }
  Node& NodeNamed(const std::string& name) {
    for (auto& n : nodes_) {
      if (n.name == name) return n;
    }
    ADD_FAILURE() << "no node " << name;
    return nodes_.front();
  }
  json Inventory(const std::string& node) {
    const json n = api_.Get("nodes", "", node).body;
    const std::string text = n["metadata"].value("annotations", json::object()).value("kgpu.io/gpu-inventory", "");
    return text.empty() ? json() : json::parse(text);
  }

  // As deployed (deploy/extender): HTTPS, and the verbs only for kube-scheduler's client
  // certificate (its tlsConfig certFile/keyFile/caFile).
  void StartExtender() {
    const std::string log = root_ + "/extender-" + std::to_string(++extender_runs_) + ".log";
    const std::string tls = root_ + "/extender-tls";
    if (!std::filesystem::exists(tls)) {
      std::filesystem::create_directories(tls);
      std::string cert, key, client_cert, client_key;
      ASSERT_TRUE(testing::GenerateSelfSigned(cert, key, "kgpu-extender").ok());
      ASSERT_TRUE(testing::GenerateSelfSigned(client_cert, client_key, "kgpu-scheduler", "clientAuth").ok());
      std::ofstream(tls + "/tls.crt") << cert;
      std::ofstream(tls + "/tls.key") << key;
      std::ofstream(tls + "/client.crt") << client_cert;
      std::ofstream(tls + "/client.key") << client_key;
    }
    testing::SpawnOptions so;
    so.log = log;
    extender_pid_ = testing::Spawn(
        {KGPU_BIN, "extender", "--kubeconfig", extender_kubeconfig_, "--address", "127.0.0.1:0", "--tls-cert-file",
         tls + "/tls.crt", "--tls-key-file", tls + "/tls.key", "--client-ca-file", tls + "/client.crt"},
        so);
    ASSERT_GT(extender_pid_, 0) << std::strerror(errno);
    int port = 0;
    ASSERT_TRUE(WaitFor([&] {
      const std::string text = ReadFile(log);
      const size_t at = text.find("listening on port ");
      if (at == std::string::npos) return false;
      port = std::atoi(text.c_str() + at + std::strlen("listening on port "));
      return port > 0;
    })) << ReadFile(log);
    extender_url_ = "https://127.0.0.1:" + std::to_string(port);
    // /readyz turns 200 once the informers synced (and, after a restart, every record is booked).
    ASSERT_TRUE(WaitFor([&] { return Ready(port); })) << ReadFile(log);
    testing::FakeSchedulerOptions o;
    o.url_prefix = extender_url_ + "/gpu";
    o.cert_file = tls + "/client.crt";
    o.key_file = tls + "/client.key";
    o.ca_file = tls + "/tls.crt";
    sched_ = std::make_unique<testing::FakeScheduler>(*client_, o);
  }
  bool Ready(int port) {  // as kubelet's probe: HTTPS, no client certificate
    httplib::SSLClient probe("127.0.0.1", port);
    probe.enable_server_certificate_verification(false);
    auto r = probe.Get("/readyz");
    return r && r->status == 200;
  }
  void StopExtender(int sig) {
    if (extender_pid_ <= 0) return;
    kill(extender_pid_, sig);
    WaitExit(extender_pid_);
    extender_pid_ = -1;
  }

  // Creates the pod; returns false when the apiserver refused it (the refusal in *refusal).
  bool Create(const json& pod, std::string* refusal = nullptr) {
    auto r = api_.Create("pods", pod["metadata"]["namespace"], pod);
    if (r.code != 201) {
      if (refusal) *refusal = r.body.value("message", r.body.dump());
      return false;
    }
    return true;
  }
  testing::ScheduleOutcome Schedule(const std::string& ns, const std::string& name) {
    auto out = sched_->ScheduleOne(api_.Get("pods", ns, name).body);
    EXPECT_TRUE(out.ok()) << ns << "/" << name << ": " << out.status();
    return out.ok() ? *out : testing::ScheduleOutcome{};
  }
  // One admission round on every node, the nodes in a random order.
  void AdmitAll() {
    std::vector<size_t> order(nodes_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng_);
    for (size_t i : order) {
      auto round = nodes_[i].admission->AdmitPending();
      ASSERT_TRUE(round.ok()) << round.status();
      for (const auto& p : *round) {
        EXPECT_TRUE(p.status.ok()) << nodes_[i].name << " " << p.ns << "/" << p.name << ": " << p.status << "\n"
                                   << nodes_[i].plugin->Log();
        for (const auto& c : p.containers) {
          if (c.resource == "kgpu.io/gpu") RegisterShareProcesses(nodes_[i], p);
        }
      }
    }
  }
  // The simulated NVML's view: each share container runs a process holding its record's memory
  // on each of its GPUs; NVML refuses one that does not fit what the GPU has free.
  void RegisterShareProcesses(const Node& n, const testing::AdmittedPod& p) {
    const json pod = api_.Get("pods", p.ns, p.name).body;
    auto rec = api::ParseRecord(pod["metadata"]["annotations"].value(extender::kAnnotationAllocation, ""));
    ASSERT_TRUE(rec.ok()) << rec.status();
    const int pid = next_pid_++;
    pids_[p.uid] = pid;
    for (const auto& g : rec->containers[0].gpus) {
      if (g.memory_mib == 0) continue;
      const auto [rc, out] = n.Ctl({"proc", "add", g.uuid, std::to_string(pid), "--mem", std::to_string(g.memory_mib)});
      EXPECT_EQ(rc, 0) << n.name << " " << p.ns << "/" << p.name << " on " << g.uuid << ": " << out;
    }
  }
  // A pod finishing: deleted at once; its NVML processes go with it.
  void Finish(const Created& c) {
    const json pod = api_.Get("pods", c.ns, c.name).body;
    const std::string uid = pod["metadata"]["uid"], node = pod["spec"].value("nodeName", "");
    if (pids_.contains(uid) && !node.empty()) {
      auto rec = api::ParseRecord(pod["metadata"]["annotations"].value(extender::kAnnotationAllocation, ""));
      ASSERT_TRUE(rec.ok());
      for (const auto& g : rec->containers[0].gpus) {
        if (g.memory_mib > 0) {
          EXPECT_EQ(NodeNamed(node).Ctl({"proc", "rm", g.uuid, std::to_string(pids_[uid])}).first, 0);
        }
      }
    }
    k8s::DeleteOptions d;
    d.grace_period_seconds = 0;
    ASSERT_TRUE(client_->Delete("/api/v1/namespaces/" + c.ns + "/pods/" + c.name, d).ok());
    ASSERT_TRUE(WaitFor([&] { return api_.Get("pods", c.ns, c.name).code == 404; }));
  }

  // The pod of shape i (whole 1/2/4, MIG profiles, shares with memory/cores, multi-GPU shares).
  json Shape(int i, const std::string& ns, const std::string& name, std::string* kind) {
    static const std::vector<std::string> migs = {"1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"};
    switch (i % 8) {
      case 0:
        *kind = "whole";
        return testing::TestPod(ns, name, {{"nvidia.com/gpu", std::to_string(1 << (i / 8 % 3))}});
      case 1:
        *kind = "mig";
        return testing::TestPod(ns, name, {{"nvidia.com/mig-" + migs[static_cast<size_t>(i / 8 % 4)], "1"}});
      case 5:
        // Several GPU containers: a sidecar and an init container beside the main one; the init
        // container runs on what kubelet hands on to main.
        if (i / 8 % 2 == 0) {
          *kind = "multi-share";
          json pod = testing::TestPod(ns, name,
                                      {{"kgpu.io/gpu", "1"},
                                       {"kgpu.io/gpu-memory", std::to_string(3000 + 1000 * (i % 5))},
                                       {"kgpu.io/gpu-cores", "10"}});
          pod = testing::WithContainer(pod, "initContainers", "proxy",
                                       {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}, true);
          return testing::WithContainer(
              pod, "initContainers", "warmup",
              {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "2000"}, {"kgpu.io/gpu-cores", "5"}});
        }
        *kind = "multi-whole";
        return testing::WithContainer(testing::WithContainer(testing::TestPod(ns, name, {{"nvidia.com/gpu", "2"}}),
                                                             "containers", "side", {{"nvidia.com/gpu", "1"}}),
                                      "initContainers", "fetch", {{"nvidia.com/gpu", "1"}});
      case 2:
        *kind = "share";  // two shares on two GPUs, totals
        return testing::TestPod(ns, name,
                                {{"kgpu.io/gpu", "2"},
                                 {"kgpu.io/gpu-memory", std::to_string(2 * (3000 + 500 * (i % 5)))},
                                 {"kgpu.io/gpu-cores", "10"}});
      default:
        *kind = "share";
        return testing::TestPod(ns, name,
                                {{"kgpu.io/gpu", "1"},
                                 {"kgpu.io/gpu-memory", std::to_string(2000 + 1000 * (i % 7))},
                                 {"kgpu.io/gpu-cores", std::to_string(5 * (i % 3))}});
    }
  }
  // Creates and schedules pods [from, to); every 10th admits on all nodes.
  void Run(int from, int to) {
    for (int i = from; i < to; ++i) {
      const std::string ns = i % 2 == 0 ? "team-a" : "team-b";
      const std::string name = "p" + std::to_string(i);
      std::string kind, refusal;
      const json pod = Shape(i, ns, name, &kind);
      if (!Create(pod, &refusal)) {
        EXPECT_NE(refusal.find("exceeded quota: gpu, requested: "), std::string::npos) << refusal;
        EXPECT_EQ(ns, "team-a") << refusal;
        ++quota_refused_;
        continue;
      }
      created_.push_back({ns, name, kind});
      auto out = Schedule(ns, name);
      if (out.bound) ++bound_;
      if ((i + 1) % 10 == 0) AdmitAll();
    }
    AdmitAll();
  }

  // Every bound pod: Running, admitted on its node, given exactly what its record says.
  void CheckEveryPod() {
    struct Share {
      int64_t memory = 0, cores = 0;
      int holders = 0;
    };
    std::map<std::string, Share> shares;             // GPU UUID -> from the CDI specs
    std::map<std::string, std::string> exclusive;    // whole GPU or MIG UUID -> pod (records)
    std::map<std::string, std::string> kubelet_ids;  // whole/MIG device ID -> pod (kubelet)
    int checked = 0, whole_record_differs = 0;
    for (const auto& c : created_) {
      const auto got = api_.Get("pods", c.ns, c.name);
      if (got.code == 404) continue;  // finished
      const json& pod = got.body;
      const std::string node = pod["spec"].value("nodeName", "");
      const std::string key = c.ns + "/" + c.name;
      if (node.empty()) continue;  // never fitted: pending, as on a full cluster
      auto rec = api::ParseRecord(pod["metadata"]["annotations"].value(extender::kAnnotationAllocation, ""));
      ASSERT_TRUE(rec.ok()) << key << ": " << rec.status();
      EXPECT_EQ(rec->node, node) << key;
      EXPECT_EQ(pod["status"].value("phase", ""), "Running") << key;
      const auto& admitted = NodeNamed(node).admission->Admitted();
      auto it = admitted.find(pod["metadata"]["uid"]);
      ASSERT_NE(it, admitted.end()) << key << " bound to " << node << " but not admitted there";
      size_t placed = 0;
      std::vector<std::string> applied;  // kgpu.io/enforcement-applied, as the node writes it
      for (const auto& ac : it->second.containers) {
        if (!ac.init) {
          ++placed;
          continue;
        }
        // A regular init container: kubelet handed its devices on to a container the record names.
        const bool handed_on =
            std::any_of(it->second.containers.begin(), it->second.containers.end(), [&](const auto& x) {
              return !x.init && x.resource == ac.resource &&
                     std::all_of(ac.ids.begin(), ac.ids.end(), [&](const std::string& id) {
                       return std::find(x.ids.begin(), x.ids.end(), id) != x.ids.end();
                     });
            });
        EXPECT_TRUE(handed_on) << key << " init container " << ac.name;
        EXPECT_TRUE(ac.pre_started || ac.resource != "kgpu.io/gpu") << key << " init container " << ac.name;
        ++init_handed_on_;
      }
      ASSERT_EQ(rec->containers.size(), placed) << key;
      ++checked;
      multi_ += placed > 1;
      for (const auto& rc : rec->containers) {
        const auto ac_it = std::find_if(it->second.containers.begin(), it->second.containers.end(),
                                        [&](const auto& x) { return !x.init && x.name == rc.name; });
        ASSERT_NE(ac_it, it->second.containers.end()) << key << ": container " << rc.name << " not admitted";
        const auto& ac = *ac_it;
        EXPECT_EQ(ac.resource, rc.resource) << key;
        {
          // kubelet's checkpoint on that node holds the container's devices, signed as kubelet signs
          // it (the exporter's parser verifies the checksum).
          const std::string path = NodeNamed(node).kubelet->Dir() + "/kubelet_internal_checkpoint";
          auto entries = exporter::ParseCheckpoint(ReadFile(path), path);
          ASSERT_TRUE(entries.ok()) << key << ": " << entries.status();
          auto e = std::find_if(entries->begin(), entries->end(), [&](const exporter::CheckpointEntry& x) {
            return x.pod_uid == it->first && x.container == ac.name && x.resource == ac.resource;
          });
          ASSERT_NE(e, entries->end()) << key << ": not in " << path;
          EXPECT_EQ(std::set<std::string>(e->device_ids.begin(), e->device_ids.end()),
                    std::set<std::string>(ac.ids.begin(), ac.ids.end()))
              << key;
        }
        if (rc.resource == "kgpu.io/gpu") {
          EXPECT_TRUE(ac.pre_started) << key;
          ASSERT_EQ(ac.ids.size(), rc.gpus.size()) << key;
          const std::string cdi_name = api::ShareCdiName(ac.ids);
          ASSERT_EQ(ac.response.cdi_devices_size(), 1) << key;
          EXPECT_EQ(ac.response.cdi_devices(0).name(), "kgpu.io/share=" + cdi_name) << key;
          const std::string text = ReadFile(NodeNamed(node).cdi + "/kgpu.io-share_" + cdi_name + ".json");
          ASSERT_FALSE(text.empty()) << key << ": no CDI spec " << cdi_name;
          const json spec = json::parse(text);
          std::map<std::string, std::string> env;
          for (const auto& e : spec["devices"][0]["containerEdits"]["env"]) {
            const std::string kv = e;
            env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
          }
          std::string uuids, limits;
          for (const auto& g : rc.gpus) {
            uuids += (uuids.empty() ? "" : ",") + g.uuid;
            limits += (limits.empty() ? "" : ",") + g.uuid + "=" + std::to_string(g.memory_mib) + "Mi";
            auto& s = shares[g.uuid];
            s.memory += g.memory_mib;
            s.cores += g.cores;
            ++s.holders;
            EXPECT_FALSE(exclusive.contains(g.uuid))
                << key << " shares " << g.uuid << " held whole by " << exclusive[g.uuid];
          }
          EXPECT_EQ(env["NVIDIA_VISIBLE_DEVICES"], uuids) << key;
          EXPECT_EQ(env["KGPU_ENFORCEMENT"], rc.enforcement) << key;
          EXPECT_EQ(env["KGPU_GPU_CORES"], std::to_string(rc.gpus[0].cores)) << key;
          if (rc.enforcement == "hard") {
            EXPECT_EQ(env["KGPU_CUDA_MEMORY_LIMIT"], limits) << key;
            EXPECT_EQ(env["LD_PRELOAD"], "/usr/lib/kgpu/libkgpu-cuda.so") << key;
            ++hard_;
          } else {
            EXPECT_EQ(rc.enforcement, "none") << key;
            EXPECT_EQ(node, "share") << key << ": only the node without the interposer gives none";
            EXPECT_FALSE(env.contains("LD_PRELOAD")) << key;
            ++none_;
          }
          size_t gpu_nodes = 0;
          for (const auto& d : spec["devices"][0]["containerEdits"]["deviceNodes"]) {
            const std::string p = d["path"];
            gpu_nodes += p.rfind("/dev/nvidia", 0) == 0 && p.find_first_of("0123456789") != std::string::npos;
          }
          EXPECT_EQ(gpu_nodes, rc.gpus.size()) << key;
          applied.push_back(rc.name + "=" + rc.enforcement);
        } else {
          // Whole GPUs and MIG: kubelet picked the device IDs; the container sees exactly those.
          ASSERT_EQ(ac.ids.size(), rc.gpus.size()) << key;
          std::set<std::string> ids(ac.ids.begin(), ac.ids.end()), visible;
          std::stringstream env(ac.response.envs().contains("NVIDIA_VISIBLE_DEVICES")
                                    ? ac.response.envs().at("NVIDIA_VISIBLE_DEVICES")
                                    : "");
          for (std::string v; std::getline(env, v, ',');) visible.insert(v);
          EXPECT_EQ(visible, ids) << key;
          // The node makes the record say what kubelet gave (docs/sharing-model.md §5), after
          // PreStartContainer has returned: give a correction in flight a moment.
          auto ids_of = [](const api::RecordContainer& x) {
            std::set<std::string> out;
            for (const auto& g : x.gpus) out.insert(g.Device());
            return out;
          };
          api::RecordContainer cur = rc;
          if (ids_of(cur) != ids) {
            WaitFor(
                [&] {
                  const auto again = api::ParseRecord(api_.Get("pods", c.ns, c.name)
                                                          .body["metadata"]["annotations"]
                                                          .value(extender::kAnnotationAllocation, ""));
                  if (!again.ok()) return false;
                  for (const auto& x : again->containers) {
                    if (x.name == rc.name) cur = x;
                  }
                  return ids_of(cur) == ids;
                },
                std::chrono::seconds(10));
          }
          const std::set<std::string> recorded = ids_of(cur);
          for (const auto& g : cur.gpus) {
            const std::string id = g.Device();
            EXPECT_FALSE(exclusive.contains(id))
                << "records of " << key << " and " << exclusive[id] << " both hold " << id;
            exclusive[id] = key;
            if (!g.profile.empty()) {
              EXPECT_EQ(rc.resource, "nvidia.com/mig-" + g.profile) << key;
            }
          }
          for (const auto& id : ac.ids) {
            EXPECT_FALSE(kubelet_ids.contains(id)) << key << " and " << kubelet_ids[id] << " both got " << id;
            kubelet_ids[id] = key;
          }
          EXPECT_EQ(recorded, ids) << key << ": the record does not name the devices kubelet gave";
          whole_record_differs += recorded != ids;
        }
      }
      if (!applied.empty()) {
        std::sort(applied.begin(), applied.end());
        std::string want;
        for (const auto& x : applied) want += (want.empty() ? "" : ",") + x;
        // The node annotates after PreStartContainer returned: give the last write a moment.
        std::string said = pod["metadata"]["annotations"].value("kgpu.io/enforcement-applied", "");
        if (said != want) {
          WaitFor(
              [&] {
                said = api_.Get("pods", c.ns, c.name)
                           .body["metadata"]["annotations"]
                           .value("kgpu.io/enforcement-applied", "");
                return said == want;
              },
              std::chrono::seconds(10));
        }
        EXPECT_EQ(said, want) << key;
      }
    }
    // Nothing over-committed: shares per GPU within its memory and cores (the NVML processes were
    // checked as they were added), and no share on a GPU some pod holds whole.
    std::map<std::string, int64_t> memory;
    for (const auto& n : nodes_) {
      const json inv = Inventory(n.name);
      for (const auto& g : inv["gpus"]) memory[g["uuid"]] = g.value("memMiB", 0);
    }
    for (const auto& [uuid, s] : shares) {
      ASSERT_TRUE(memory.contains(uuid)) << uuid;
      EXPECT_LE(s.memory, memory[uuid]) << uuid;
      EXPECT_LE(s.cores, 100) << uuid;
      EXPECT_LE(s.holders, 16) << uuid;
      EXPECT_FALSE(kubelet_ids.contains(uuid)) << uuid << " shared and given whole to " << kubelet_ids[uuid];
    }
    // How many whole/MIG records the nodes corrected to kubelet's choice (their Events).
    int corrected = 0;
    if (auto events = client_->Get("/apis/events.k8s.io/v1/events"); events.ok()) {
      for (const auto& e : (*events)["items"]) {
        if (e.value("reason", "") != "GpuAssignmentRecorded") continue;
        ++corrected;
        std::cout << "  corrected: " << e["regarding"].value("name", "") << ": " << e.value("note", "") << "\n";
      }
    }
    std::cout << "checked " << checked << " bound pods (" << bound_ << " binds, " << quota_refused_
              << " refused by quota); whole/MIG records their node corrected to kubelet's devices: " << corrected
              << "; still differing: " << whole_record_differs << "; pods with several GPU containers: " << multi_
              << " (init containers handed on: " << init_handed_on_ << ")\n";
    checked_ = checked;
  }

  // Progress with the time since the start, for the log of a slow run.
  void Phase(const std::string& what) {
    const auto s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::cout << "[" << s << " s] " << what << std::endl;
  }

  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  testing::FakeApiServer api_;
  std::unique_ptr<k8s::Client> client_;
  std::string root_, kubeconfig_, extender_kubeconfig_, extender_url_;
  // The union of the rules the given deploy/ files grant one ServiceAccount (kustomize composes
  // them for one component).
  static testing::DeployIdentity DeployRbac(const std::vector<std::string>& files) {
    testing::DeployIdentity all;
    for (const auto& f : files) {
      auto id = testing::ReadDeployRbac(std::string(KGPU_SOURCE_DIR) + "/deploy/" + f);
      EXPECT_TRUE(id.ok()) << id.status();
      if (!id.ok()) continue;
      EXPECT_TRUE(all.user.empty() || all.user == id->user) << f << " binds " << id->user;
      all.user = id->user;
      all.rules.insert(all.rules.end(), id->rules.begin(), id->rules.end());
    }
    return all;
  }
  uint32_t seed_ = 0;
  std::mt19937 rng_;
  std::vector<Node> nodes_;
  pid_t extender_pid_ = -1;
  int extender_runs_ = 0;
  std::unique_ptr<testing::FakeScheduler> sched_;
  std::vector<Created> created_;
  std::map<std::string, int> pids_;
  int next_pid_ = 100000, bound_ = 0, quota_refused_ = 0, checked_ = 0, hard_ = 0, none_ = 0, multi_ = 0,
      init_handed_on_ = 0;
};

TEST_F(E2eClusterTest, MixedPodsOnFourNodesThroughTheExtender) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  rng_.seed(seed_);
  for (const char* ns : {"team-a", "team-b"})
    ASSERT_EQ(api_.Create("namespaces", "", {{"metadata", {{"name", ns}}}}).code, 201);
  ASSERT_EQ(
      api_.Create("resourcequotas", "team-a",
                  {{"metadata", {{"name", "gpu"}, {"namespace", "team-a"}}},
                   {"spec", {{"hard", {{"requests.kgpu.io/gpu-memory", "120000"}, {"requests.nvidia.com/gpu", "8"}}}}}})
          .code,
      201);
  AddNode("whole", "dgx-h100", "version: v1\n");
  AddNode("share", "dgx-h100",
          "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
          "    - {name: nvidia.com/gpu, replicas: 16, rename: kgpu.io/gpu, devices: [0, 1, 2, 3]}\n");
  AddNode("mig", "dgx-a100-mig", "version: v1\nflags:\n  migStrategy: mixed\n");
  // The H200 node has the CUDA interposer, so its shares default to hard limits; the other
  // sharing node offers none (time-slicing without isolation) only.
  AddNode("h200", "hgx-h200",
          "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
          "    - {name: nvidia.com/gpu, replicas: 16, rename: kgpu.io/gpu, devices: all}\n",
          {"--cuda-interposer", KGPU_CUDA_INTERPOSER, "--cuda-shared-root", root_ + "/cuda"});
  // Each Node carries its allocatable (kubelet) and its inventory annotation (the plugin).
  for (auto& n : nodes_) {
    ASSERT_TRUE(WaitFor([&] { return !Inventory(n.name).is_null(); })) << n.name << "\n" << n.plugin->Log();
  }
  auto allocatable = [&](const std::string& node, const std::string& r) {
    return api_.Get("nodes", "", node).body["status"].value("allocatable", json::object()).value(r, "");
  };
  ASSERT_TRUE(WaitFor([&] {
    return allocatable("whole", "nvidia.com/gpu") == "8" && allocatable("share", "kgpu.io/gpu") == "64" &&
           allocatable("share", "nvidia.com/gpu") == "4" && allocatable("mig", "nvidia.com/mig-1g.5gb") == "9" &&
           allocatable("h200", "kgpu.io/gpu") == "128";
  })) << api_.Get("nodes", "", "mig").body.dump()
      << NodeNamed("h200").plugin->Log();
  EXPECT_TRUE(NodeNamed("share").kubelet->Get("kgpu.io/gpu")->options.pre_start_required());
  Phase("four nodes up");
  StartExtender();
  if (HasFatalFailure()) return;
  Phase("extender ready");

  // Phase 1: half the pods, some finishing on the way.
  Run(0, kPods / 2);
  for (size_t i = 0; i < created_.size(); i += 7) Finish(created_[i]);
  AdmitAll();
  Phase("phase 1 done");
  // The extender dies hard mid-run and comes back: it rebuilds from the records before it is ready.
  StopExtender(SIGKILL);
  sched_.reset();
  StartExtender();
  if (HasFatalFailure()) return;
  Phase("extender restarted and ready");
  // 16 share pods bound to one node at once (the H200 node, by model): concurrent binding cycles,
  // then one admission round with every PreStart at once.
  std::vector<std::string> burst;
  for (int i = 0; i < 16; ++i) {
    const std::string name = "burst-" + std::to_string(i);
    ASSERT_TRUE(Create(testing::TestPod(
        "team-b", name,
        {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", std::to_string(3000 + 250 * i)}, {"kgpu.io/gpu-cores", "5"}},
        {{"kgpu.io/gpu-model", "H200"}})));
    created_.push_back({"team-b", name, "share"});
    burst.push_back(name);
  }
  std::vector<std::thread> threads;
  std::vector<testing::ScheduleOutcome> outs(burst.size());
  for (size_t i = 0; i < burst.size(); ++i) threads.emplace_back([&, i] { outs[i] = Schedule("team-b", burst[i]); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < burst.size(); ++i) {
    EXPECT_TRUE(outs[i].bound) << burst[i] << ": " << outs[i].message;
    EXPECT_EQ(outs[i].node, "h200") << burst[i];
    bound_ += outs[i].bound;
  }
  auto round = NodeNamed("h200").admission->AdmitPending();
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_GE(round->size(), 16u);
  for (const auto& p : *round) {
    EXPECT_TRUE(p.status.ok()) << p.name << ": " << p.status;
    RegisterShareProcesses(NodeNamed("h200"), p);
  }
  Phase("16 at once done");
  // Phase 2: the rest, on the restarted extender.
  Run(kPods / 2, kPods - 16);
  Phase("phase 2 done");
  // Preemption as kube-scheduler reaches it (whole GPUs are counted in-tree): a high-priority pod
  // for all 8 GPUs of the whole node; the whole pods there are the victims, the extender confirms
  // them, they are deleted, and the pod binds on a later cycle and is admitted like any other.
  ASSERT_TRUE(Create(testing::TestPod("team-b", "hi-whole", {{"nvidia.com/gpu", "8"}}, {}, 1000)));
  created_.push_back({"team-b", "hi-whole", "whole"});
  auto hi = Schedule("team-b", "hi-whole");
  if (!hi.bound) {
    EXPECT_TRUE(hi.preempt_called) << hi.message;
    EXPECT_FALSE(hi.preempted.empty()) << hi.message;
    ASSERT_TRUE(WaitFor([&] {
      hi = Schedule("team-b", "hi-whole");
      return hi.bound;
    })) << hi.message;
  }
  ++bound_;
  EXPECT_EQ(hi.node, "whole");
  AdmitAll();
  Phase("preemption done");
  CheckEveryPod();
  EXPECT_GT(quota_refused_, 0) << "team-a's quota never refused a pod: raise the load";
  EXPECT_GT(checked_, kPods / 2) << "too few pods bound to say anything";
  EXPECT_GT(hard_, 0) << "no share with hard limits (the H200 node's default)";
  EXPECT_GT(none_, 0) << "no share without isolation (the other sharing node's only mode)";
  EXPECT_GT(multi_, 0) << "no pod with several GPU containers was bound";
  EXPECT_GT(init_handed_on_, 0) << "no GPU init container was admitted";
  // The restarted extender booked every record and found no conflict (a double allocation would be one).
  // /metrics needs no client certificate; the extender's own is verified against its CA.
  httplib::Client mc(extender_url_);
  mc.set_ca_cert_path(root_ + "/extender-tls/tls.crt");
  mc.enable_server_certificate_verification(true);
  auto metrics = mc.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_NE(metrics->body.find("kgpu_extender_record_conflicts_total 0\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("kgpu_extender_bad_records_total 0\n"), std::string::npos) << metrics->body;
}

}  // namespace
}  // namespace kgpu
