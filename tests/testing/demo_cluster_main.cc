// kgpu-demo-cluster: the small simulated cluster that `make demo` shows, in one process, from the
// same parts as the end-to-end test (tests/integration/e2e_cluster_test.cc): the API server
// stand-in with a namespace quota; three simulated nodes — `whole` (8x H100, whole GPUs), `mig`
// (8x A100, MIG mixed), `share` (8x H200 serving kgpu.io/gpu shares) — each with a kubelet
// stand-in, kubelet's pod admission and `kgpu device-plugin --publish-labels` as a process; `kgpu
// extender` as a process; the kube-scheduler stand-in calling it as kube-scheduler does.
//
// It creates pods of each kind, schedules them, lets each node admit its pods, and prints what
// every pod got. It checks what it prints: it exits 1 when a pod that should run does not, when a
// share's record disagrees with what its node gave it, or when the pod over quota is admitted,
// so a ctest run keeps the demo honest.
//   kgpu-demo-cluster [--keep DIR]
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include "api/record.h"
#include "extender/inventory.h"
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

namespace {
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace t = kgpu::testing;

using t::ReadFile;
using t::WaitFor;

struct Node {
  std::string name, profile, dir;
  std::unique_ptr<t::FakeKubelet> kubelet;
  std::unique_ptr<t::FakePodResources> pod_resources;
  std::unique_ptr<t::KubeletNodeStatus> status;
  std::unique_ptr<t::Plugin> plugin;
  std::unique_ptr<t::KubeletAdmission> admission;
};

struct Want {
  std::string ns, name, what;
  std::map<std::string, std::string> resources;
  std::map<std::string, std::string> annotations;
  enum { kRuns, kQuota, kUnschedulable } expect = kRuns;
  // More containers: {section, name, resources, sidecar} (t::WithContainer).
  struct More {
    const char* section;
    std::string name;
    std::map<std::string, std::string> resources;
    bool sidecar = false;
  };
  std::vector<More> more = {};
  // The node the policy should choose and why, said to the viewer (a different node fails the demo).
  std::string node = {}, why = {};
};

// "GPU-1f0e…" -> "GPU-1f0e"; MIG UUIDs likewise.
std::string Short(const std::string& uuid) {
  return uuid.size() > 12 ? uuid.substr(0, 12) : uuid;
}

int Fail(const std::string& why) {
  std::cerr << "kgpu-demo-cluster: FAIL: " << why << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string keep;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--keep" && i + 1 < argc) {
      keep = argv[++i];
    } else {
      std::cerr << "usage: kgpu-demo-cluster [--keep DIR]\n";
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  t::FakeApiServer api;
  if (auto st = api.Start(); !st.ok()) return Fail(std::string(st.message()));
  kgpu::k8s::Config kc;
  kc.server = api.url();
  kc.qps = 0;
  auto created_client = kgpu::k8s::Client::Create(kc);
  if (!created_client.ok()) return Fail(std::string(created_client.status().message()));
  auto& client = **created_client;
  std::string root = keep;
  if (root.empty()) {
    char dir[] = "/tmp/kgpu-demo-cluster-XXXXXX";
    if (mkdtemp(dir) == nullptr) return Fail(std::strerror(errno));
    root = dir;
  }
  std::filesystem::create_directories(root);
  const std::string kubeconfig = root + "/kubeconfig";
  std::ofstream(kubeconfig) << api.Kubeconfig();

  // Two teams; team-a has a quota of 2 whole GPUs and 40000 MiB of shared GPU memory.
  for (const char* ns : {"team-a", "team-b"}) api.Create("namespaces", "", {{"metadata", {{"name", ns}}}});
  api.Create("resourcequotas", "team-a",
             {{"metadata", {{"name", "gpu"}, {"namespace", "team-a"}}},
              {"spec", {{"hard", {{"requests.nvidia.com/gpu", "2"}, {"requests.kgpu.io/gpu-memory", "40000"}}}}}});
  std::cout << "API server stand-in: namespaces team-a (ResourceQuota gpu: requests.nvidia.com/gpu 2, "
               "requests.kgpu.io/gpu-memory 40000) and team-b\n";

  std::vector<Node> nodes;
  const std::vector<std::array<std::string, 3>> specs = {
      {"whole", "dgx-h100", "version: v1\n"},
      {"mig", "dgx-a100-mig", "version: v1\nflags:\n  migStrategy: mixed\n"},
      {"share", "hgx-h200",
       "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
       "    - {name: nvidia.com/gpu, replicas: 16, rename: kgpu.io/gpu, devices: all}\n"}};
  uint32_t seed = 42;
  for (const auto& [name, profile, config] : specs) {
    // The sharing node has the CUDA interposer: its shares get hard memory limits.
    std::vector<std::string> extra;
    if (name == "share") extra = {"--cuda-interposer", KGPU_CUDA_INTERPOSER, "--cuda-shared-root", root + "/cuda"};
    Node n;
    n.name = name;
    n.profile = profile;
    n.dir = root + "/" + name;
    std::filesystem::create_directories(n.dir + "/cdi");
    const std::vector<std::string> env = {"KGPU_SIM_NODE=" + profile, "KGPU_SIM_STATE=" + n.dir + "/sim.state",
                                          "KGPU_SIM_NODE_NAME=" + name};
    n.kubelet = std::make_unique<t::FakeKubelet>(n.dir);
    if (auto st = n.kubelet->Start(); !st.ok()) return Fail(std::string(st.message()));
    n.pod_resources = std::make_unique<t::FakePodResources>(n.dir + "/pod-resources.sock");
    if (auto st = n.pod_resources->Start(); !st.ok()) return Fail(std::string(st.message()));
    n.status = std::make_unique<t::KubeletNodeStatus>(*n.kubelet, client, name);
    if (auto st = n.status->SyncOnce(); !st.ok()) return Fail(std::string(st.message()));
    n.status->Start();
    std::ofstream(n.dir + "/config.yaml") << config;
    std::vector<std::string> args = {"--config-file",
                                     n.dir + "/config.yaml",
                                     "--publish-labels",
                                     "--kubeconfig",
                                     kubeconfig,
                                     "--node-name",
                                     name,
                                     "--sleep-interval",
                                     "0",
                                     "--pod-resources-socket",
                                     n.pod_resources->SocketPath(),
                                     "--cdi-spec-dir",
                                     n.dir + "/cdi"};
    args.insert(args.end(), extra.begin(), extra.end());
    n.plugin = std::make_unique<t::Plugin>(n.dir, args, env);
    n.admission = std::make_unique<t::KubeletAdmission>(*n.kubelet, *n.pod_resources, client, name, seed++);
    nodes.push_back(std::move(n));
  }
  auto allocatable = [&](const std::string& node, const std::string& r) {
    return api.Get("nodes", "", node).body["status"].value("allocatable", json::object()).value(r, "");
  };
  auto has_inventory = [&](const std::string& node) {
    return api.Get("nodes", "", node)
        .body["metadata"]
        .value("annotations", json::object())
        .contains("kgpu.io/gpu-inventory");
  };
  if (!WaitFor([&] {
        return has_inventory("whole") && has_inventory("mig") && has_inventory("share") &&
               allocatable("whole", "nvidia.com/gpu") == "8" && allocatable("share", "kgpu.io/gpu") == "128" &&
               allocatable("mig", "nvidia.com/mig-1g.5gb") != "";
      })) {
    return Fail("the nodes did not come up:\n" + nodes[0].plugin->Log() + nodes[1].plugin->Log() +
                nodes[2].plugin->Log());
  }
  std::cout << "three simulated nodes, each with a kubelet stand-in and `kgpu device-plugin --publish-labels`:\n";
  for (const auto& n : nodes) {
    const json alloc = api.Get("nodes", "", n.name).body["status"]["allocatable"];
    std::string gpus;
    for (auto it = alloc.begin(); it != alloc.end(); ++it) {
      if (it.key().find('/') == std::string::npos) continue;
      gpus += (gpus.empty() ? "" : ", ") + it.key() + "=" + it.value().get<std::string>();
    }
    std::cout << "  " << n.name << " (" << n.profile << "): " << gpus << "\n";
  }

  // The extender, as a process, as deploy/extender runs it: two replicas with leader election,
  // HTTPS, the verbs only for kube-scheduler's client certificate (and the replicas' own, with
  // which a standby passes binds on to the leader).
  std::string cert, key, client_cert, client_key, peer_cert, peer_key;
  if (!t::GenerateSelfSigned(cert, key, "kgpu-extender").ok() ||
      !t::GenerateSelfSigned(client_cert, client_key, "kgpu-scheduler", "clientAuth").ok() ||
      !t::GenerateSelfSigned(peer_cert, peer_key, "kgpu-extender-peer", "clientAuth").ok()) {
    return Fail("cannot generate the extender's certificates");
  }
  std::ofstream(root + "/tls.crt") << cert;
  std::ofstream(root + "/tls.key") << key;
  std::ofstream(root + "/client.crt") << client_cert;
  std::ofstream(root + "/client.key") << client_key;
  std::ofstream(root + "/peer.crt") << peer_cert;
  std::ofstream(root + "/peer.key") << peer_key;
  std::ofstream(root + "/client-ca.crt") << client_cert << peer_cert;  // both self-signed: each its own CA
  if (api.Create("namespaces", "", {{"metadata", {{"name", "kgpu-system"}}}}).code != 201) {
    return Fail("cannot create namespace kgpu-system");
  }
  struct Replica {
    std::string id, log;
    pid_t pid = -1;
    int port = 0;
    ~Replica() {
      if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, nullptr, 0);
      }
    }
  };
  Replica first{"kgpu-extender-a", root + "/extender-a.log"}, second{"kgpu-extender-b", root + "/extender-b.log"};
  auto start_replica = [&](Replica& r) -> std::string {
    t::SpawnOptions so;
    so.log = r.log;
    r.pid = t::Spawn({KGPU_BIN,
                      "extender",
                      "--kubeconfig",
                      kubeconfig,
                      "--address",
                      "127.0.0.1:0",
                      "--tls-cert-file",
                      root + "/tls.crt",
                      "--tls-key-file",
                      root + "/tls.key",
                      "--client-ca-file",
                      root + "/client-ca.crt",
                      "--peer-cert-file",
                      root + "/peer.crt",
                      "--peer-key-file",
                      root + "/peer.key",
                      "--leader-elect",
                      "--leader-elect-resource-namespace",
                      "kgpu-system",
                      "--identity",
                      r.id,
                      "--leader-elect-lease-duration",
                      "2s",
                      "--leader-elect-renew-deadline",
                      "1500ms",
                      "--leader-elect-retry-period",
                      "250ms"},
                     so);
    if (r.pid <= 0) return std::strerror(errno);
    if (!WaitFor([&] {
          const std::string text = ReadFile(r.log);
          const size_t at = text.find("listening on port ");
          if (at != std::string::npos) r.port = std::atoi(text.c_str() + at + std::strlen("listening on port "));
          return r.port > 0;
        })) {
      return "kgpu extender did not start:\n" + ReadFile(r.log);
    }
    httplib::SSLClient probe("127.0.0.1", r.port);  // no client certificate, as kubelet's probe
    probe.enable_server_certificate_verification(false);
    if (!WaitFor([&] {
          auto res = probe.Get("/readyz");
          return res && res->status == 200;
        })) {
      return "kgpu extender never became ready:\n" + ReadFile(r.log);
    }
    return "";
  };
  // Which replica holds the Lease (kgpu_extender_leader on its /metrics).
  auto leads = [](const Replica& r) {
    httplib::SSLClient c("127.0.0.1", r.port);
    c.enable_server_certificate_verification(false);
    auto res = c.Get("/metrics");
    return res && res->body.find("\nkgpu_extender_leader 1") != std::string::npos;
  };
  if (const std::string err = start_replica(first); !err.empty()) return Fail(err);
  if (!WaitFor([&] { return leads(first); })) return Fail("kgpu extender never led:\n" + ReadFile(first.log));
  if (const std::string err = start_replica(second); !err.empty()) return Fail(err);
  const int port = first.port;
  httplib::SSLClient anon("127.0.0.1", port);
  anon.enable_server_certificate_verification(false);
  const auto direct = anon.Post(
      "/gpu/bind", R"({"PodName":"any","PodNamespace":"default","PodUID":"x","Node":"dgx-h100"})", "application/json");
  std::cout << "kgpu extender: two replicas, https://127.0.0.1:" << first.port
            << " (leader) and https://127.0.0.1:" << second.port
            << " (standby), both ready once their informers synced; the kube-scheduler stand-in calls filter, "
               "prioritize, bind on the leader with its client certificate\n"
            << "  a bind from anyone without one: HTTP " << (direct ? direct->status : 0)
            << " (refused and counted)\n\n";
  t::FakeSchedulerOptions o;
  o.url_prefix = "https://127.0.0.1:" + std::to_string(port) + "/gpu";
  o.cert_file = root + "/client.crt";
  o.key_file = root + "/client.key";
  o.ca_file = root + "/tls.crt";
  t::FakeScheduler sched(client, o);

  const std::vector<Want> wants = {
      {"team-a",
       "train",
       "2 whole GPUs",
       {{"nvidia.com/gpu", "2"}},
       {},
       Want::kRuns,
       {},
       "mig",
       "whole and mig fit it alike (no GPU is split), so the policy's tie-break decides: the node left with the "
       "fewest free GPUs (mig: 6 -> 4, whole: 8 -> 6), which keeps the 8-GPU node whole for an 8-GPU pod"},
      {"team-a",
       "infer-1",
       "a share: 20000 MiB, 25% of the SMs",
       {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "20000"}, {"kgpu.io/gpu-cores", "25"}},
       {}},
      {"team-a", "infer-2", "a share: 20000 MiB", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "20000"}}, {}},
      {"team-a",
       "infer-3",
       "a share: 20000 MiB (over team-a's quota)",
       {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "20000"}},
       {},
       Want::kQuota},
      {"team-b", "notebook", "a MIG 1g.5gb instance", {{"nvidia.com/mig-1g.5gb", "1"}}, {}},
      {"team-b", "finetune", "a MIG 3g.20gb instance", {{"nvidia.com/mig-3g.20gb", "1"}}, {}},
      {"team-b",
       "serve",
       "2 shares of 50000 MiB on two GPUs, binpacked",
       {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-memory", "100000"}, {"kgpu.io/gpu-cores", "50"}},
       {{"kgpu.io/placement", "binpack"}}},
      {"team-b",
       "server",
       "a share of 16000 MiB, a sidecar with 2000 MiB of its own, a warm-up init container on the server's share",
       {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "16000"}, {"kgpu.io/gpu-cores", "50"}},
       {},
       Want::kRuns,
       {{"initContainers", "metrics", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "2000"}}, true},
        {"initContainers", "warmup", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}}}}},
      {"team-b",
       "huge",
       "a share of 200000 MiB (more than any GPU has)",
       {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "200000"}},
       {},
       Want::kUnschedulable},
  };
  int failures = 0;
  std::vector<const Want*> bound;
  for (const auto& w : wants) {
    std::cout << w.ns << "/" << w.name << " asks for " << w.what << "\n";
    json pod = t::TestPod(w.ns, w.name, w.resources, w.annotations);
    for (const auto& m : w.more) pod = t::WithContainer(pod, m.section, m.name, m.resources, m.sidecar);
    auto r = api.Create("pods", w.ns, pod);
    if (r.code != 201) {
      const std::string msg = r.body.value("message", r.body.dump());
      std::cout << "  refused by the API server: " << msg << "\n";
      if (w.expect != Want::kQuota) ++failures;
      continue;
    }
    if (w.expect == Want::kQuota) {
      std::cout << "  NOT refused by the quota\n";
      ++failures;
    }
    auto out = sched.ScheduleOne(api.Get("pods", w.ns, w.name).body);
    if (!out.ok()) return Fail(std::string(out.status().message()));
    if (out->bound) {
      std::cout << "  bound to " << out->node;
      if (out->scores.size() > 1) {  // why this node: the extender's prioritize scores
        std::cout << " (scores of the nodes that fit:";
        for (const auto& [n, v] : out->scores) std::cout << " " << n << " " << v;
        std::cout << ")";
      }
      std::cout << "\n";
      if (!w.node.empty()) {
        if (out->node == w.node) {
          std::cout << "    why: " << w.why << "\n";
        } else {
          std::cout << "  NOT on " << w.node << ", where the policy should put it: " << w.why << "\n";
          ++failures;
        }
      }
      bound.push_back(&w);
      if (w.expect != Want::kRuns) ++failures;
    } else {
      std::cout << "  not scheduled: " << out->message << "\n";
      if (w.expect != Want::kUnschedulable) ++failures;
      // The nearest node's own figures: the extender's Event on the pod (written on its own thread).
      std::string note;
      WaitFor([&] {
        auto events = client.List("/apis/events.k8s.io/v1/namespaces/" + w.ns + "/events");
        if (!events.ok()) return false;
        for (const auto& e : (*events)["items"]) {
          if (e.value("reason", "") == "GPUsUnavailable" && e["regarding"].value("name", "") == w.name) {
            note = e.value("note", "");
          }
        }
        return !note.empty();
      });
      std::cout << "  the extender's Event GPUsUnavailable: " << (note.empty() ? std::string("(none)") : note) << "\n";
      if (note.empty()) ++failures;
    }
  }
  // Each node admits its pods as kubelet does (Allocate, PreStart for shares), then what each got.
  for (auto& n : nodes) {
    auto round = n.admission->AdmitPending();
    if (!round.ok()) return Fail(std::string(round.status().message()));
    for (const auto& p : *round) {
      if (!p.status.ok()) {
        std::cout << n.name << ": " << p.ns << "/" << p.name << " not admitted: " << p.status << "\n";
        ++failures;
      }
    }
  }
  std::cout << "\nwhat each pod got (its allocation record, written by the extender at bind; the node's answer):\n";
  // Rows first, then columns as wide as their widest cell (a pod/container name, several GPUs).
  std::vector<std::array<std::string, 6>> rows = {
      {"POD", "NODE", "PHASE", "RESOURCE", "RECORD: GPUS (memory, SMs each)", "KUBELET'S ALLOCATE GAVE THE CONTAINER"}};
  for (const Want* w : bound) {
    const json pod = api.Get("pods", w->ns, w->name).body;
    const std::string node = pod["spec"].value("nodeName", "");
    const std::string phase = pod["status"].value("phase", "");
    auto rec = kgpu::api::ParseRecord(pod["metadata"]["annotations"].value(kgpu::extender::kAnnotationAllocation, ""));
    if (!rec.ok() || rec->containers.empty()) {
      std::cout << "  " << w->ns << "/" << w->name << ": no allocation record\n";
      ++failures;
      continue;
    }
    if (phase != "Running") ++failures;
    for (const auto& rc : rec->containers) {  // one row per container the record names
      std::string gpus;
      for (const auto& g : rc.gpus) {
        gpus += (gpus.empty() ? "" : ", ") + Short(g.Device());
        if (rc.resource == "kgpu.io/gpu") {
          gpus += " (" + std::to_string(g.memory_mib) + " MiB, " +
                  (g.cores > 0 ? std::to_string(g.cores) + "% SMs" : std::string("SMs not limited")) + ")";
        }
      }
      // What kubelet's Allocate gave the container: NVIDIA_VISIBLE_DEVICES, or the share's CDI device.
      std::string sees;
      const Node* n = nullptr;
      for (const auto& x : nodes) {
        if (x.name == node) n = &x;
      }
      if (n != nullptr) {
        const auto& admitted = n->admission->Admitted();
        auto it = admitted.find(pod["metadata"].value("uid", ""));
        const t::AdmittedContainer* found = nullptr;
        if (it != admitted.end()) {
          for (const auto& x : it->second.containers) {
            if (!x.init && x.name == rc.name) found = &x;
          }
        }
        if (found != nullptr) {
          const auto& ac = *found;
          if (ac.response.cdi_devices_size() > 0) {
            // The share's CDI spec: the GPUs of the record and the limits.
            const std::string cdi = ac.response.cdi_devices(0).name();
            const std::string file = n->dir + "/cdi/kgpu.io-share_" + cdi.substr(cdi.find('=') + 1) + ".json";
            const std::string text = ReadFile(file);
            if (!text.empty()) {
              std::map<std::string, std::string> env;
              const json spec = json::parse(text);
              for (const auto& e : spec["devices"][0]["containerEdits"]["env"]) {
                const std::string kv = e;
                env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
              }
              std::string want;
              for (const auto& g : rc.gpus) want += (want.empty() ? "" : ",") + g.uuid;
              if (env["NVIDIA_VISIBLE_DEVICES"] != want) {
                std::cout << "  " << w->name << ": the node gave " << env["NVIDIA_VISIBLE_DEVICES"]
                          << ", the record says " << want << "\n";
                ++failures;
              }
              std::string shortened;
              std::stringstream ss(env["NVIDIA_VISIBLE_DEVICES"]);
              for (std::string id; std::getline(ss, id, ',');) shortened += (shortened.empty() ? "" : ",") + Short(id);
              sees = "NVIDIA_VISIBLE_DEVICES=" + shortened + " (CDI), KGPU_ENFORCEMENT=" + env["KGPU_ENFORCEMENT"] +
                     (env.contains("LD_PRELOAD") ? ", LD_PRELOAD=" + env["LD_PRELOAD"] : "");
              if (env["KGPU_ENFORCEMENT"] == "hard" && !env.contains("LD_PRELOAD")) {
                std::cout << "  " << w->name << ": hard limits without the interposer preloaded\n";
                ++failures;
              }
            }
          } else if (ac.response.envs().contains("NVIDIA_VISIBLE_DEVICES")) {
            std::string v = ac.response.envs().at("NVIDIA_VISIBLE_DEVICES");
            std::string shortened;
            std::stringstream ss(v);
            for (std::string id; std::getline(ss, id, ',');) shortened += (shortened.empty() ? "" : ",") + Short(id);
            sees = "NVIDIA_VISIBLE_DEVICES=" + shortened;
          }
        }
      }
      const std::string who = w->ns + "/" + w->name + (rec->containers.size() > 1 ? "/" + rc.name : "");
      rows.push_back({who, node, phase, rc.resource, gpus, sees});
    }
  }
  std::array<size_t, 6> width{};
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line = " ";
    for (size_t i = 0; i < r.size(); ++i)
      line += " " + r[i] + (i + 1 < r.size() ? std::string(width[i] - r[i].size(), ' ') : "");
    std::cout << line << "\n";
  }
  // The quota as the API server counts it.
  const json quota = api.Get("resourcequotas", "team-a", "gpu").body;
  std::cout << "\nteam-a's quota: used " << quota["status"]["used"].dump() << " of hard "
            << quota["status"]["hard"].dump() << "\n";

  // Preemption for what kube-scheduler cannot see: a low-priority share fills a GPU nobody uses,
  // a high-priority share pinned there is short only of memory (ignoredByScheduler).
  std::set<std::string> used;
  auto all_pods = client.List("/api/v1/pods");
  if (!all_pods.ok()) return Fail(std::string(all_pods.status().message()));
  for (const auto& p : (*all_pods)["items"]) {
    auto rec = kgpu::api::ParseRecord(
        p["metadata"].value("annotations", json::object()).value(kgpu::extender::kAnnotationAllocation, ""));
    if (!rec.ok()) continue;
    for (const auto& rc : rec->containers) {
      for (const auto& g : rc.gpus) used.insert(g.uuid);
    }
  }
  auto inv = kgpu::extender::ParseNodeInventory(api.Get("nodes", "", "share").body);
  if (!inv.ok()) return Fail(std::string(inv.status().message()));
  const kgpu::extender::GpuInfo* free_gpu = nullptr;
  for (const auto& g : inv->gpus) {
    if (free_gpu == nullptr && !used.contains(g.uuid)) free_gpu = &g;
  }
  if (free_gpu == nullptr) return Fail("no unused GPU on the sharing node for the preemption scene");
  const std::string pin = free_gpu->uuid;
  const std::string fill = std::to_string(free_gpu->memory_mib - 10000);
  std::cout << "\npreemption for GPU memory, which kube-scheduler does not count (ignoredByScheduler):\n";
  auto create = [&](const std::string& name, const std::string& mib, int64_t prio) {
    json pod = t::TestPod("team-b", name, {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", mib}},
                          {{"kgpu.io/gpu-uuid", pin}}, prio);
    pod["spec"]["terminationGracePeriodSeconds"] = 1;
    return api.Create("pods", "team-b", pod).code == 201;
  };
  std::cout << "team-b/batch (priority 10) asks for a share of " << fill << " MiB on " << Short(pin) << "\n";
  if (!create("batch", fill, 10)) return Fail("cannot create team-b/batch");
  auto batch = sched.ScheduleOne(api.Get("pods", "team-b", "batch").body);
  if (!batch.ok() || !batch->bound) return Fail("team-b/batch was not scheduled");
  std::cout << "  bound to " << batch->node << "\n";
  std::cout << "team-b/realtime (priority 1000) asks for a share of 20000 MiB on the same GPU (10000 MiB free)\n";
  if (!create("realtime", "20000", 1000)) return Fail("cannot create team-b/realtime");
  auto rt = sched.ScheduleOne(api.Get("pods", "team-b", "realtime").body);
  if (!rt.ok()) return Fail(std::string(rt.status().message()));
  std::cout << "  not scheduled: " << rt->message << "\n";
  if (rt->bound || rt->message.find("preempting 1 lower-priority pod(s) here: team-b/batch") == std::string::npos)
    ++failures;
  const bool gone = WaitFor([&] { return api.Get("pods", "team-b", "batch").code == 404; }, std::chrono::seconds(20));
  std::cout << "  the extender evicted team-b/batch through the Eviction API: "
            << (gone ? "it is gone" : "it is STILL THERE") << "\n";
  if (!gone) ++failures;
  bool placed = false;
  WaitFor(
      [&] {
        auto again = sched.ScheduleOne(api.Get("pods", "team-b", "realtime").body);
        placed = again.ok() && again->bound;
        return placed;
      },
      std::chrono::seconds(20));
  const json rtpod = api.Get("pods", "team-b", "realtime").body;
  auto rtrec = kgpu::api::ParseRecord(
      rtpod["metadata"].value("annotations", json::object()).value(kgpu::extender::kAnnotationAllocation, ""));
  if (placed && rtrec.ok() && !rtrec->containers.empty() && !rtrec->containers[0].gpus.empty()) {
    const auto& g = rtrec->containers[0].gpus[0];
    std::cout << "  team-b/realtime bound to " << rtpod["spec"].value("nodeName", "") << ": " << Short(g.uuid) << " ("
              << g.memory_mib << " MiB)\n";
  } else {
    std::cout << "  team-b/realtime was NOT scheduled after the preemption\n";
    ++failures;
  }
  auto events = client.List("/apis/events.k8s.io/v1/namespaces/team-b/events");
  for (const auto& e : events.ok() ? (*events)["items"] : json::array()) {
    const std::string reason = e.value("reason", "");
    if (reason == "Preempting" || reason == "Preempted") {
      std::cout << "  Event " << reason << " on " << e["regarding"].value("name", "") << ": " << e.value("note", "")
                << "\n";
    }
  }
  // Failover: the leader dies without releasing its Lease. The standby filters at once, from its
  // own informers; binds resume once it takes the expired Lease.
  std::cout << "\nfailover: the leading extender is killed (SIGKILL); the stand-in now reaches the standby, as "
               "the Service would\n";
  kill(first.pid, SIGKILL);
  waitpid(first.pid, nullptr, 0);
  first.pid = -1;
  const auto killed = std::chrono::steady_clock::now();
  o.url_prefix = "https://127.0.0.1:" + std::to_string(second.port) + "/gpu";
  t::FakeScheduler via_standby(client, o);
  if (api.Create("pods", "team-b",
                 t::TestPod("team-b", "after-failover", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}}))
          .code != 201) {
    return Fail("cannot create team-b/after-failover");
  }
  int refused = 0;
  std::string refusal, node;
  const bool rebound = WaitFor(
      [&] {
        auto r = via_standby.ScheduleOne(api.Get("pods", "team-b", "after-failover").body);
        if (r.ok() && r->bound) node = r->node;
        if (r.ok() && !r->bound && !r->node.empty() && refused++ == 0) refusal = r->message;
        return !node.empty();
      },
      std::chrono::seconds(30));
  const double gap = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  if (refused > 0) {
    std::cout << "  the standby filtered and prioritized at once; " << refused
              << " binding cycle(s) refused while no replica led, e.g.: " << refusal << "\n";
  }
  if (rebound) {
    std::printf(
        "  team-b/after-failover bound to %s %.1f s after the kill, once the standby held the Lease "
        "(lease duration 2 s)\n",
        node.c_str(), gap);
  } else {
    std::cout << "  team-b/after-failover was NOT bound after the failover:\n" << ReadFile(second.log) << "\n";
    ++failures;
  }
  if (failures > 0) return Fail(std::to_string(failures) + " pod(s) did not end as expected (logs in " + root + ")");
  if (keep.empty()) std::filesystem::remove_all(root);
  return 0;
}
