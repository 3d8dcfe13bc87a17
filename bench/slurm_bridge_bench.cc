// slurm_bridge_bench: plain driver. `kgpu slurm-bridge`'s controller (slurm::Bridge, in process)
// against the API server stand-in (in process, over HTTP) and FakeSlurm (tests/testing/
// fake_slurm.h: an in-memory slurmctld answering through the scontrol/squeue text the CLI backend
// parses), so the figures are the controller's own, without slurmctld's latency:
//   1. the cost of one reconcile with N nodes (default 500), half of them running Slurm jobs,
//      and 2,000 pods elsewhere in the cluster: nothing to decide, p50/p99 over 100 reconciles;
//      then the same through the REST backend (slurmrestd v0.0.39's stand-in over the fake);
//   2. the time from the triggering event to the node being usable on the other side, per
//      direction, over repeated lends and reclaims of one node, with the deployed defaults
//      (interval 2 s, "empty" confirmed on two reads 1 s apart) and the watches that wake the
//      loop (BridgeWatch):
//        lend:    a GPU pod becomes unschedulable -> the node is uncordoned for Kubernetes;
//        reclaim: `kgpu slurm-bridge reclaim` (what a ResumeProgram runs) -> Slurm's DRAIN is gone
//                 (the node's pods evicted first).
//   3. with --real-slurm, figure 2 again through the CLI backend against a real Slurm 22.05
//      (slurmctld and two slurmd started by the bench: tests/testing/slurm_cluster.h; needs root
//      and Debian's slurmctld/slurmd/munge, else skipped), so slurmctld's latency is included;
//   4. with --real-slurm, the power-save lend (--lend-via power-save) on a second real cluster with
//      SuspendProgram/ResumeProgram running `kgpu slurm-bridge hook` and a resume command the bench
//      serves by restarting that node's slurmd with -b:
//        lend:            a GPU pod becomes unschedulable -> the node is uncordoned (Slurm has
//                         powered it down: SuspendProgram ran);
//        reclaim, ops:    `kgpu slurm-bridge reclaim` on the powered-down node -> slurmd
//                         registered and the node IDLE (POWER_UP, resume command, registration);
//        reclaim, Slurm:  `sbatch -w NODE` -> slurmd registered for the job (Slurm's allocation of
//                         the powered-down node and its ResumeProgram, the eviction, the resume
//                         command, the registration; the job's start after slurmctld's periodic
//                         check is not in it).
// Usage: slurm_bridge_bench [--nodes N] [--rounds R] [--real-slurm]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "bench_util.h"
#include "common/process.h"
#include "common/strings.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "k8s/patch.h"
#include "slurm/bridge.h"
#include "slurm/rest.h"
#include "testing/bridge_k8s.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_slurm.h"
#include "testing/fake_slurmrestd.h"
#include "testing/slurm_cluster.h"

namespace {
using json = nlohmann::json;
using namespace kgpu;

void Print(const char* what, const bench::Stats& s, const char* unit = "ms") {
  std::printf("  %-44s n=%-4zu p50 %8.2f %s  p99 %8.2f %s  max %8.2f %s\n", what, s.n, s.p50, unit, s.p99, unit, s.max,
              unit);
}

std::unique_ptr<k8s::Client> ClientOf(testing::FakeApiServer& api) {
  auto cfg = k8s::ParseKubeconfig(api.Kubeconfig(), "bench");
  if (!cfg.ok()) return nullptr;
  cfg->qps = 0;
  auto c = k8s::Client::Create(*cfg);
  return c.ok() ? std::move(*c) : nullptr;
}

// `rest`: through the REST backend and slurmrestd's v0.0.39 (the stand-in over the same fake).
int ReconcileCost(int nodes, bool rest) {
  testing::FakeApiServerOptions ao;
  ao.history_window = 1000000;
  testing::FakeApiServer api(ao);
  if (!api.Start().ok()) return 1;
  auto client = ClientOf(api);
  if (!client) return 1;
  testing::FakeSlurm slurm;
  api.Create("namespaces", "", {{"metadata", {{"name", "infer"}}}});
  for (int i = 0; i < nodes; ++i) {
    const std::string name = Cat("gpu", i);
    slurm.AddNode(name, 64);
    api.Create("nodes", "", testing::SlurmPoolNode(name));
    if (i % 2 == 0 && !slurm.StartJob({name}, std::time(nullptr) + 3600 + i, 32).ok()) return 1;
  }
  // The rest of the cluster: 2,000 running pods on 100 Kubernetes nodes the bridge does not own.
  for (int i = 0; i < 100; ++i) api.Create("nodes", "", {{"metadata", {{"name", Cat("web", i)}}}});
  for (int i = 0; i < 2000; ++i) {
    json pod = {{"metadata", {{"name", Cat("web-", i)}, {"namespace", "infer"}}},
                {"spec", {{"nodeName", Cat("web", i % 100)}, {"containers", {{{"name", "c"}, {"image", "web:1"}}}}}},
                {"status", {{"phase", "Running"}}}};
    api.Create("pods", "infer", pod);
  }
  slurm::BridgeOptions o;
  o.min_kept = 0;
  std::unique_ptr<testing::FakeSlurmrestd> restd;
  std::unique_ptr<slurm::RestSlurmClient> rest_client;
  if (rest) {
    restd = std::make_unique<testing::FakeSlurmrestd>(slurm);
    if (!restd->ok()) return 1;
    slurm::RestOptions ro;
    ro.url = restd->Url();
    rest_client = std::make_unique<slurm::RestSlurmClient>(ro);
  }
  slurm::Bridge bridge(rest ? static_cast<slurm::SlurmClient&>(*rest_client) : slurm, *client, o);
  std::vector<double> ms;
  for (int i = 0; i < 110; ++i) {
    const int64_t t0 = bench::NowNs();
    const auto r = bridge.Reconcile();
    const int64_t t1 = bench::NowNs();
    if (!r.slurm_ok || !r.k8s_ok || static_cast<int>(r.nodes.size()) != nodes) {
      std::printf("  reconcile failed (slurm %d, k8s %d, %zu nodes)\n", r.slurm_ok, r.k8s_ok, r.nodes.size());
      return 1;
    }
    if (i >= 10) ms.push_back(static_cast<double>(t1 - t0) / 1e6);
  }
  Print(Cat("reconcile", rest ? " (REST backend)" : "", ", ", nodes, " Slurm nodes + 2,000 other pods").c_str(),
        bench::Summarize(ms));
  return 0;
}

bool WaitUntil(const std::function<bool()>& pred, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// One lend: `pod` becomes an unschedulable GPU pod; once one of `nodes` is uncordoned for
// Kubernetes (its time appended to lend_ms) the pod runs there. The node, or "" (said why).
std::string LendOnePod(testing::FakeApiServer& api, k8s::Client& client, const std::vector<std::string>& nodes,
                       const std::string& pod, std::chrono::seconds limit, std::vector<double>* lend_ms) {
  const int64_t t0 = bench::NowNs();
  if (const std::string err = testing::PendingGpuPod(api, "infer", pod); !err.empty()) {
    std::printf("  %s\n", err.c_str());
    return "";
  }
  std::string n;
  const bool lent = WaitUntil(
      [&] {
        for (const auto& c : nodes) {
          const json j = api.Get("nodes", "", c).body;
          if (!j["spec"].value("unschedulable", false) && !slurm::K8sFenced(j)) {
            n = c;
            return true;
          }
        }
        return false;
      },
      limit);
  if (!lent) {
    std::printf("  %s: no node lent within %lld s\n", pod.c_str(), static_cast<long long>(limit.count()));
    return "";
  }
  lend_ms->push_back(static_cast<double>(bench::NowNs() - t0) / 1e6);
  if (const std::string err = testing::RunPodOn(api, client, "infer", pod, n); !err.empty()) {
    std::printf("  %s\n", err.c_str());
    return "";
  }
  return n;
}

// What `kgpu slurm-bridge reclaim NODE` writes.
bool RequestReclaim(k8s::Client& client, const std::string& node) {
  return client
      .Patch(k8s::FindResource("nodes")->Path("", node),
             {{"metadata", {{"annotations", {{slurm::kReclaimAnnotation, Cat("bench at ", k8s::NowRfc3339())}}}}}},
             k8s::kMergePatch)
      .ok();
}

// Lends and reclaims one of `nodes` `rounds` times through `slurm` (the node's Slurm state read
// with `state`); the pod's node must be given back to Slurm before the next round.
int LendAndReclaim(int rounds, slurm::SlurmClient& slurm, const std::vector<std::string>& nodes,
                   const std::function<std::string(const std::string&)>& state) {
  testing::FakeApiServer api;
  if (!api.Start().ok()) return 1;
  auto client = ClientOf(api);
  if (!client) return 1;
  api.Create("namespaces", "", {{"metadata", {{"name", "infer"}}}});
  for (const auto& n : nodes) api.Create("nodes", "", testing::SlurmPoolNode(n));
  slurm::BridgeOptions o;  // the deployed defaults, but for the policy's deliberate waits
  o.lend_threshold = std::chrono::seconds(0);
  o.cooldown = std::chrono::seconds(0);
  o.min_kept = 1;
  slurm::Bridge bridge(slurm, *client, o);
  slurm::BridgeWatch watch(*client, bridge);
  watch.Start();
  std::jthread loop([&](std::stop_token st) { bridge.Run(st); });
  std::vector<double> lend_ms, reclaim_ms;
  int rc = 0;
  for (int r = 0; r < rounds && rc == 0; ++r) {
    const std::string n = LendOnePod(api, *client, nodes, Cat("p", r), std::chrono::seconds(60), &lend_ms);
    const int64_t t1 = bench::NowNs();
    if (n.empty() || !RequestReclaim(*client, n)) {
      rc = 1;
      break;
    }
    if (!WaitUntil([&] { return state(n) == "IDLE"; }, std::chrono::seconds(60))) {
      std::printf("  round %d: %s not back with Slurm within 60 s (%s)\n", r, n.c_str(), state(n).c_str());
      rc = 1;
      break;
    }
    reclaim_ms.push_back(static_cast<double>(bench::NowNs() - t1) / 1e6);
  }
  loop.request_stop();
  loop.join();
  watch.Stop();
  if (rc != 0) return rc;
  Print("lend: pod unschedulable -> node uncordoned", bench::Summarize(lend_ms));
  Print("reclaim: request -> Slurm DRAIN gone", bench::Summarize(reclaim_ms));
  return 0;
}

int PowerSaveRounds(int rounds) {
  testing::SlurmCluster cluster;
  const std::string base = cluster.base();
  const std::string kubeconfig = base + "/kubeconfig";
  const std::string kgpu = std::filesystem::read_symlink("/proc/self/exe").parent_path().string() + "/kgpu";
  cluster.EnablePowerSave(kgpu, kubeconfig);
  if (auto st = cluster.Start(); !st.ok()) {
    std::printf("  cannot start Slurm: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  testing::FakeApiServer api;
  if (!api.Start().ok()) return 1;
  std::ofstream(kubeconfig) << api.Kubeconfig();
  auto client = ClientOf(api);
  if (!client) return 1;
  api.Create("namespaces", "", {{"metadata", {{"name", "infer"}}}});
  for (const auto& n : cluster.nodes()) api.Create("nodes", "", testing::SlurmPoolNode(n));
  slurm::CliSlurmClient cli({"", cluster.conf(), std::chrono::milliseconds(10000)});
  slurm::BridgeOptions o;
  o.lend_threshold = std::chrono::seconds(0);
  o.cooldown = std::chrono::seconds(0);
  o.min_kept = 1;
  o.power_save = true;
  o.resume_command = SplitCommandLine(cluster.ResumeCommand(), "resume command").value();
  slurm::Bridge bridge(cli, *client, o);
  slurm::BridgeWatch watch(*client, bridge);
  watch.Start();
  std::jthread loop([&](std::stop_token st) { bridge.Run(st); });
  // The node side of the resume command: slurmd restarted with -b.
  std::jthread resumer([&](std::stop_token st) {
    while (!st.stop_requested()) {
      for (const auto& [n, s2] : cluster.ServeResumeRequests()) {
        if (!s2.ok()) std::printf("  %s: %s\n", n.c_str(), std::string(s2.message()).c_str());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto wait = [](const std::function<bool()>& pred) { return WaitUntil(pred, std::chrono::seconds(90)); };
  auto registered = [&](const std::string& n) {
    const std::string st = cluster.State(n);
    return !st.empty() && st.find("POWER") == std::string::npos && st.find("NOT_RESPONDING") == std::string::npos;
  };
  std::vector<double> lend_ms, ops_ms, slurm_ms;
  int rc = 0;
  for (int r = 0; r < rounds && rc == 0; ++r) {
    const std::string n = LendOnePod(api, *client, cluster.nodes(), Cat("ps", r), std::chrono::seconds(90), &lend_ms);
    if (n.empty()) {
      rc = 1;
      break;
    }
    // Steady lent state first (SuspendTimeout later): the reclaim is timed from a powered-down node.
    if (!wait([&] { return cluster.State(n).find("POWERED_DOWN") != std::string::npos; })) {
      rc = 1;
      break;
    }
    const int64_t t1 = bench::NowNs();
    if (r % 2 == 0) {
      if (!RequestReclaim(*client, n)) {
        rc = 1;
        break;
      }
    } else {
      if (cluster.Submit({"-w", n, "--wrap", "true"}).empty()) {
        rc = 1;
        break;
      }
    }
    if (!wait([&] { return registered(n); })) {
      std::printf("  round %d: %s not back with Slurm within 90 s (%s)\n", r, n.c_str(), cluster.State(n).c_str());
      rc = 1;
      break;
    }
    (r % 2 == 0 ? ops_ms : slurm_ms).push_back(static_cast<double>(bench::NowNs() - t1) / 1e6);
    // The next round starts from an idle node owned by Slurm.
    if (!wait([&] {
          return cluster.State(n) == "IDLE" &&
                 slurm::LeaseOf(api.Get("nodes", "", n).body).phase == slurm::Phase::kSlurm;
        })) {
      std::printf("  round %d: %s not idle with Slurm (%s)\n", r, n.c_str(), cluster.State(n).c_str());
      rc = 1;
      break;
    }
  }
  loop.request_stop();
  loop.join();
  watch.Stop();
  resumer.request_stop();
  resumer.join();
  cluster.Stop();
  if (rc != 0) return rc;
  Print("lend: pod unschedulable -> uncordoned", bench::Summarize(lend_ms));
  Print("reclaim, ops: request -> slurmd registered", bench::Summarize(ops_ms));
  Print("reclaim, Slurm: sbatch -> slurmd registered", bench::Summarize(slurm_ms));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int nodes = 500, rounds = 20;
  bool real = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--real-slurm") == 0) real = true;
    if (i + 1 < argc && std::strcmp(argv[i], "--nodes") == 0) nodes = std::atoi(argv[i + 1]);
    if (i + 1 < argc && std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
  }
  std::printf("== the controller against FakeSlurm and the API server stand-in\n");
  if (int rc = ReconcileCost(nodes, false); rc != 0) return rc;
  if (int rc = ReconcileCost(nodes, true); rc != 0) return rc;
  testing::FakeSlurm fake;
  for (const char* n : {"gpu0", "gpu1"}) fake.AddNode(n, 64);
  if (int rc = LendAndReclaim(rounds, fake, {"gpu0", "gpu1"}, [&](const std::string& n) { return fake.State(n); });
      rc != 0) {
    return rc;
  }
  if (!real) return 0;
  // The same through the CLI backend against a real Slurm 22.05: slurmctld and two slurmd
  // (tests/testing/slurm_cluster.h), so slurmctld's own latency is in the figures.
  std::printf("== the controller against a real slurmctld (two slurmd, the CLI backend) and the API server stand-in\n");
  if (const std::string why = testing::SlurmCluster::Unavailable(); !why.empty()) {
    std::printf("  skipped: %s\n", why.c_str());
    return 0;
  }
  testing::SlurmCluster cluster;
  if (auto st = cluster.Start(); !st.ok()) {
    std::printf("  cannot start Slurm: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  slurm::CliSlurmClient cli({"", cluster.conf(), std::chrono::milliseconds(10000)});
  int rc = LendAndReclaim(rounds, cli, cluster.nodes(), [&](const std::string& n) { return cluster.State(n); });
  cluster.Stop();
  if (rc != 0) return rc;
  std::printf(
      "== the power-save lend (--lend-via power-save) against a real slurmctld with SuspendProgram/ResumeProgram\n");
  rc = PowerSaveRounds(std::max(2, rounds / 2));
  return rc;
}
