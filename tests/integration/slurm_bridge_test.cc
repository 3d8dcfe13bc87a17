// kgpu slurm-bridge against a real Slurm 22.05 (a private cluster with one slurmd per node) and
// the API server stand-in, the bridge as a real process. A checker thread asserts the
// invariants at every observed step (about every 100 ms):
//   F: at every instant at least one side is fenced (Slurm DRAIN, or taint kgpu.io/owner + cordon);
//   P: no pod is bound to a node Slurm may schedule on (not drained);
// and at the end of each scenario: every Slurm job ended on its own (COMPLETED, Restarts=0),
// and no drain reason that was not ours was changed.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/process.h"
#include "common/strings.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "k8s/resources.h"
#include "slurm/bridge.h"
#include "slurm/lease.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_slurmrestd.h"
#include "testing/slurm_cluster.h"
#include "testing/spawn.h"

namespace kgpu {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::SlurmCluster;

constexpr auto kDeadline = seconds(90);

// `kgpu slurm-bridge run ...` as a child process, killed with the test.
class BridgeProcess {
 public:
  BridgeProcess(const std::string& log, const std::vector<std::string>& args) : log_(log) {
    std::vector<std::string> all = {KGPU_BIN, "--log-level", "debug", "slurm-bridge", "run"};
    all.insert(all.end(), args.begin(), args.end());
    testing::SpawnOptions o;
    o.log = log;
    o.append = true;
    pid_ = testing::Spawn(all, o);
  }
  ~BridgeProcess() { Kill(); }
  void Kill() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      exited_ = true;
    }
  }
  void Term() {
    if (pid_ > 0 && !exited_) ::kill(pid_, SIGTERM);
  }
  // Exit status, or -1 if still running after `timeout`.
  int Wait(milliseconds timeout) {
    if (exited_) return status_;
    const bool done = SlurmCluster::WaitFor(
        [&] {
          int st = 0;
          if (::waitpid(pid_, &st, WNOHANG) != pid_) return false;
          status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          exited_ = true;
          return true;
        },
        timeout, milliseconds(20));
    return done ? status_ : -1;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = -1;
};

// The bridge runs with exactly the RBAC deploy/slurm/bridge grants its ServiceAccount.
std::string BridgeKubeconfig(testing::FakeApiServer& api) {
  auto id = testing::ReadDeployRbac(std::string(KGPU_SOURCE_DIR) + "/deploy/slurm/bridge/rbac.yaml");
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? api.KubeconfigFor(*id) : api.Kubeconfig();
}

class SlurmBridgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = SlurmCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    cluster_ = std::make_unique<SlurmCluster>();
    testing::FakeApiServerOptions ao;
    ao.bookmark_interval = milliseconds(200);
    api_ = std::make_unique<testing::FakeApiServer>(ao);
    ASSERT_TRUE(api_->Start().ok());
    kubeconfig_ = cluster_->base() + "/kubeconfig";
    std::ofstream(kubeconfig_) << BridgeKubeconfig(*api_);
    // `kgpu slurm-bridge reclaim|status` are an operator's commands, with their own credentials.
    operator_kubeconfig_ = cluster_->base() + "/operator-kubeconfig";
    std::ofstream(operator_kubeconfig_) << api_->Kubeconfig();
    // The ResumeProgram/SuspendProgram hooks run on the Slurm controller with its own credential.
    if (power_save_) cluster_->EnablePowerSave(KGPU_BIN, operator_kubeconfig_);
    auto s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s.message();
    for (const auto& n : cluster_->nodes()) {
      json node = {{"apiVersion", "v1"},
                   {"kind", "Node"},
                   {"metadata", {{"name", n}, {"labels", {{slurm::kPoolLabel, "slurm"}}}}},
                   {"spec", json::object()},
                   {"status", {{"allocatable", {{"nvidia.com/gpu", "2"}, {"cpu", "2"}}}}}};
      slurm::ApplyK8sFence(node);  // the separated-pools setup: Slurm's nodes start fenced (deploy/slurm/)
      auto r = api_->Create("nodes", "", node);
      ASSERT_EQ(r.code, 201) << r.body.dump();
    }
    ASSERT_TRUE(
        api_->Create("namespaces", "", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "infer"}}}})
            .code < 300);
    checker_ = std::jthread([this](std::stop_token st) { CheckLoop(st); });
  }

  // The node side of the bridge's resume command (SlurmCluster::ServeResumeRequests), recording
  // each request and whether pods were still on the node when it came.
  void ServeResumeRequests(std::stop_token st) {
    while (!st.stop_requested()) {
      std::map<std::string, int> pods;  // the bridge asks only once Kubernetes has left the node
      auto count_pods = [&](const std::string& n) {
        std::vector<std::string> names;
        {
          std::lock_guard lock(mu_);
          names = pod_names_;
        }
        for (const auto& name : names) {
          auto r = api_->Get("pods", "infer", name);
          if (r.code == 200 && r.body["spec"].value("nodeName", "") == n) ++pods[n];
        }
      };
      for (const auto& [n, s] : cluster_->ServeResumeRequests(count_pods)) {
        std::lock_guard lock(mu_);
        resumes_.push_back(!s.ok()       ? Cat(n, ": ", s.message())
                           : pods[n] > 0 ? Cat(n, " with ", pods[n], " pod(s) still on it")
                                         : n);
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
  }

  void TearDown() override {
    if (resumer_.joinable()) {
      resumer_.request_stop();
      resumer_.join();
    }
    if (checker_.joinable()) {
      checker_.request_stop();
      checker_.join();
    }
    bridge_.reset();
    if (HasFailure() && cluster_) {
      std::cerr << "--- bridge log\n" << Tail(cluster_->base() + "/bridge.log", 80) << "\n" << cluster_->Logs(10);
    }
    if (api_) api_->Stop();
    if (cluster_) cluster_->Stop();
  }

  static std::string Tail(const std::string& path, size_t n) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    std::string out;
    for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) out += lines[i] + "\n";
    return out;
  }

  std::vector<std::string> BridgeArgs(const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {"--kubeconfig",
                                  kubeconfig_,
                                  "--slurm-conf",
                                  cluster_->conf(),
                                  "--interval",
                                  "300ms",
                                  "--lend-threshold",
                                  "1s",
                                  "--cooldown",
                                  "0s",
                                  "--lend-hysteresis",
                                  "10m",
                                  "--slurm-timeout",
                                  "4s",
                                  "--leader-elect-resource-namespace",
                                  "kgpu-system",
                                  "--leader-elect-lease-duration",
                                  "3s",
                                  "--leader-elect-renew-deadline",
                                  "2s",
                                  "--leader-elect-retry-period",
                                  "300ms"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  void StartBridge(const std::vector<std::string>& extra = {}) {
    bridge_ = std::make_unique<BridgeProcess>(cluster_->base() + "/bridge.log", BridgeArgs(extra));
  }

  json Node(const std::string& name) const { return api_->Get("nodes", "", name).body; }
  slurm::Phase PhaseOf(const std::string& name) const { return slurm::LeaseOf(Node(name)).phase; }
  bool WaitPhase(const std::string& name, slurm::Phase p, seconds deadline = kDeadline) const {
    return SlurmCluster::WaitFor([&] { return PhaseOf(name) == p; }, deadline, milliseconds(100));
  }

  // An inference pod that kube-scheduler could not place: GPUs requested, PodScheduled=False.
  void PendingGpuPod(const std::string& name) {
    json pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", "infer"}, {"labels", {{"app", "infer"}}}}},
        {"spec",
         {{"terminationGracePeriodSeconds", 1},
          {"containers",
           {{{"name", "server"}, {"image", "infer:1"}, {"resources", {{"limits", {{"nvidia.com/gpu", 1}}}}}}}}}}};
    auto r = api_->Create("pods", "infer", pod);
    ASSERT_EQ(r.code, 201) << r.body.dump();
    json p = r.body;
    p["status"] = {{"phase", "Pending"},
                   {"conditions",
                    {{{"type", "PodScheduled"},
                      {"status", "False"},
                      {"reason", "Unschedulable"},
                      {"message", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."},
                      {"lastTransitionTime", k8s::NowRfc3339()}}}}};
    auto u = api_->Update("pods", "infer", p);
    ASSERT_EQ(u.code, 200) << u.body.dump();
  }
  // What kube-scheduler and kubelet would do: bind the pod to a node that accepts it (no
  // kgpu.io/owner taint, not cordoned), then run it (Running, Ready).
  void SchedulePod(const std::string& name, const std::string& node) {
    const json n = Node(node);
    ASSERT_FALSE(n["spec"].value("unschedulable", false)) << node << " is cordoned";
    for (const auto& t : n["spec"].value("taints", json::array())) ASSERT_NE(t.value("key", ""), slurm::kOwnerTaintKey);
    auto cfg = k8s::ParseKubeconfig(api_->Kubeconfig(), "test");
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    auto client = k8s::Client::Create(*cfg);
    ASSERT_TRUE(client.ok()) << client.status();
    auto bound = (*client)->Bind("infer", name, node);
    ASSERT_TRUE(bound.ok()) << bound;
    auto p = api_->Get("pods", "infer", name).body;
    p["status"] = {{"phase", "Running"},
                   {"conditions",
                    {{{"type", "PodScheduled"}, {"status", "True"}, {"lastTransitionTime", k8s::NowRfc3339()}},
                     {{"type", "Ready"}, {"status", "True"}, {"lastTransitionTime", k8s::NowRfc3339()}}}}};
    auto u = api_->Update("pods", "infer", p);
    ASSERT_EQ(u.code, 200) << u.body.dump();
  }
  bool PodGone(const std::string& name) const { return api_->Get("pods", "infer", name).code == 404; }
  int PodsOn(const std::string& node) const {
    int n = 0;
    for (const auto& name : pod_names_) {
      auto r = api_->Get("pods", "infer", name);
      if (r.code == 200 && r.body["spec"].value("nodeName", "") == node) ++n;
    }
    return n;
  }

  std::string Submit(const std::vector<std::string>& args) {
    const std::string id = cluster_->Submit(args);
    EXPECT_FALSE(id.empty()) << "sbatch failed";
    std::lock_guard lock(mu_);
    jobs_.push_back(id);
    return id;
  }
  bool WaitJob(const std::string& id, const std::string& state, seconds deadline = kDeadline) const {
    return SlurmCluster::WaitFor([&] { return cluster_->JobState(id) == state; }, deadline, milliseconds(200));
  }
  // Every job we submitted ended on its own: COMPLETED, never requeued (Restarts=0).
  void ExpectNoJobKilled() {
    std::vector<std::string> jobs;
    {
      std::lock_guard lock(mu_);
      jobs = jobs_;
    }
    for (const auto& id : jobs) {
      EXPECT_TRUE(WaitFor([&] { return cluster_->JobState(id) == "COMPLETED"; }))
          << "job " << id << " is " << cluster_->JobState(id);
      auto r = cluster_->Run({"scontrol", "-o", "show", "job", id});
      EXPECT_NE(r.out.find(" Restarts=0 "), std::string::npos) << r.out;
    }
  }
  static bool WaitFor(const std::function<bool()>& f) { return SlurmCluster::WaitFor(f, kDeadline, milliseconds(200)); }

  // The invariant checker: Slurm first, then Kubernetes (a lend drains >= 1 s before it unfences,
  // a reclaim fences before it undrains, so this order cannot report a false violation).
  void CheckLoop(std::stop_token st) {
    while (!st.stop_requested()) {
      for (const auto& n : cluster_->nodes()) {
        const std::string state = cluster_->State(n);  // "" while slurmctld is down
        const json node = Node(n);
        const bool k8s_fenced = slurm::K8sFenced(node);
        // DRAIN; or (the power-save lend) powered down or powering up — no job runs there until
        // slurmd registers as rebooted, which only the bridge's resume command makes happen (22.05
        // clears the reason once it gives the node to a job) — or our power-down under way.
        const bool going_down =
            state.find("+POWER_DOWN") != std::string::npos || state.find("POWERING_DOWN") != std::string::npos;
        const bool slurm_fenced = state.find("DRAIN") != std::string::npos ||
                                  state.find("POWERED_DOWN") != std::string::npos ||
                                  state.find("POWERING_UP") != std::string::npos ||
                                  (going_down && cluster_->Reason(n).rfind(slurm::kOwnedReasonPrefix, 0) == 0);
        std::lock_guard lock(mu_);
        ++checks_;
        if (state.empty()) continue;  // Slurm unknown now: its fence is durable, judged on the next read
        if (!slurm_fenced && !k8s_fenced) {
          violations_.push_back(
              Cat("F: ", n, " unfenced on both sides (Slurm State=", state, ", lease ",
                  node["metadata"].value("annotations", json::object()).value(slurm::kLeaseAnnotation, ""), ")"));
        }
        if (!slurm_fenced) {
          for (const auto& name : pod_names_) {
            auto r = api_->Get("pods", "infer", name);
            if (r.code == 200 && r.body["spec"].value("nodeName", "") == n) {
              violations_.push_back(Cat("P: pod ", name, " on ", n, " while Slurm may schedule there (", state, ")"));
            }
          }
        }
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  void ExpectInvariantsHeld() {
    std::lock_guard lock(mu_);
    EXPECT_GT(checks_, 10u);
    for (const auto& v : violations_) ADD_FAILURE() << v;
  }
  void AddPod(const std::string& name) {
    std::lock_guard lock(mu_);
    pod_names_.push_back(name);
  }

  void KillAtEveryPhaseBoundary(const std::vector<std::string>& mode);
  std::vector<std::string> PowerSaveArgs() const {
    return {"--lend-via", "power-save", "--resume-command", cluster_->ResumeCommand()};
  }

  // Lends `node` (idle) on a pending GPU pod and places the pod there.
  void LendWithPod(const std::string& node, const std::string& pod) {
    AddPod(pod);
    PendingGpuPod(pod);
    ASSERT_TRUE(WaitPhase(node, slurm::Phase::kLent)) << slurm::PhaseName(PhaseOf(node));
    SchedulePod(pod, node);
  }

  std::unique_ptr<SlurmCluster> cluster_;
  std::unique_ptr<testing::FakeApiServer> api_;
  std::unique_ptr<BridgeProcess> bridge_;
  std::string kubeconfig_, operator_kubeconfig_;
  std::jthread checker_, resumer_;
  bool power_save_ = false;
  std::vector<std::string> resumes_;
  std::mutex mu_;
  std::vector<std::string> jobs_, pod_names_, violations_;
  uint64_t checks_ = 0;
};

// A resume command that only a shell could run, or none for the power-save lend, is refused at
// start with the fix, before anything (API server, Slurm) is contacted. No Slurm needed.
TEST(SlurmBridgeFlags, AResumeCommandIsCheckedBeforeAnythingIsContacted) {
  ProcessOptions po;
  po.timeout = seconds(30);
  auto r = RunProcess({KGPU_BIN, "slurm-bridge", "run", "--kubeconfig", "/nonexistent/kubeconfig", "--lend-via",
                       "power-save", "--resume-command", "ssh {node} rejoin | logger"},
                      po);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 2) << r->out << r->err;
  EXPECT_NE(r->out.find("--resume-command: 'ssh {node} rejoin | logger' has an unquoted | at offset 18"),
            std::string::npos)
      << r->out;
  r = RunProcess(
      {KGPU_BIN, "slurm-bridge", "run", "--kubeconfig", "/nonexistent/kubeconfig", "--lend-via", "power-save"}, po);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_NE(r->out.find("--lend-via power-save needs --resume-command"), std::string::npos) << r->out;
}

// The REST backend from the command line: `status` reads Slurm through slurmrestd's v0.0.39 API
// (the stand-in over a fake Slurm: Debian's slurmrestd 22.05 cannot update nodes), and the
// power-save lend, which the REST API cannot fence, is refused at start with the reason.
TEST(SlurmBridgeFlags, TheRestBackendFromTheCommandLine) {
  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start().ok());
  const std::string kubeconfig = ::testing::TempDir() + "kgpu-rest-kubeconfig-" + std::to_string(::getpid());
  std::ofstream(kubeconfig) << BridgeKubeconfig(api);
  testing::FakeSlurm slurm;
  slurm.AddNode("node1");
  ASSERT_TRUE(slurm.AdminDrain("node1", "maint: fan").ok());
  testing::FakeSlurmrestd restd(slurm, "jwt-cli");
  ASSERT_TRUE(restd.ok());
  // A node of Kubernetes' own pool (kgpu.io/pool=k8s) is listed as Kubernetes', not managed.
  ASSERT_EQ(api.Create("nodes", "", {{"metadata", {{"name", "k8s01"}, {"labels", {{"kgpu.io/pool", "k8s"}}}}}}).code,
            201);
  ProcessOptions po;
  po.timeout = seconds(30);
  po.env = {{"SLURM_JWT", "jwt-cli"}};
  auto r = RunProcess({KGPU_BIN, "slurm-bridge", "status", "--json", "--kubeconfig", kubeconfig, "--slurm-rest-url",
                       restd.Url(), "--slurm-rest-user", "slurm"},
                      po);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
  const json status = json::parse(r->out, nullptr, false);
  ASSERT_FALSE(status.is_discarded()) << r->out;
  EXPECT_TRUE(status.value("slurmReachable", false)) << r->out;
  ASSERT_EQ(status["nodes"].size(), 1u) << r->out;
  const json& k8s01 = status["nodes"][0];
  EXPECT_EQ(k8s01["node"], "k8s01");
  EXPECT_EQ(k8s01["phase"], "K8S_POOL");
  EXPECT_EQ(k8s01["owner"], "k8s");
  EXPECT_EQ(k8s01["pool"], "k8s");
  EXPECT_EQ(k8s01["managed"], false);
  r = RunProcess({KGPU_BIN, "slurm-bridge", "status", "--kubeconfig", kubeconfig, "--slurm-rest-url", restd.Url(),
                  "--slurm-rest-user", "slurm"},
                 po);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->out.find("k8s01         K8S_POOL            k8s        -"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("kgpu.io/pool=k8s: Kubernetes' own pool, not managed by the bridge"), std::string::npos)
      << r->out;
  EXPECT_GT(restd.requests(), 0);
  // A wrong token: Slurm is reported unreachable with slurmrestd's answer.
  po.env = {{"SLURM_JWT", "stale"}};
  r = RunProcess({KGPU_BIN, "slurm-bridge", "status", "--json", "--kubeconfig", kubeconfig, "--slurm-rest-url",
                  restd.Url(), "--slurm-rest-user", "slurm"},
                 po);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->out.find("HTTP 401 Authentication failure"), std::string::npos) << r->out;
  r = RunProcess({KGPU_BIN, "slurm-bridge", "run", "--kubeconfig", kubeconfig, "--slurm-rest-url", restd.Url(),
                  "--lend-via", "power-save", "--resume-command", "true"},
                 po);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_NE(r->out.find("--lend-via power-save needs the CLI backend (drop --slurm-rest-url)"), std::string::npos)
      << r->out;
  std::remove(kubeconfig.c_str());
}

// What the demand reads of a job and of the nodes, through the CLI backend against this Slurm:
// squeue's %n (-w), %x (-x), %b (tres_per_node: --gres) and %f (--constraint; "(null)" when
// none), scontrol's Partitions= and features. A held job (-H): it never runs, and is ours to cancel.
TEST_F(SlurmBridgeTest, TheCliBackendReadsWhatAHeldJobAskedFor) {
  const std::string held =
      cluster_->Submit({"-H", "-N", "1", "-w", "node1", "-x", "node2", "--gres=gpu:tesla:1", "--wrap", "true"});
  ASSERT_FALSE(held.empty()) << "sbatch failed";
  slurm::CliOptions co;
  co.slurm_conf = cluster_->conf();
  slurm::CliSlurmClient cli(co);
  auto jobs = cli.Jobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  auto job = std::find_if(jobs->begin(), jobs->end(), [&](const slurm::SlurmJob& j) { return j.id == held; });
  ASSERT_NE(job, jobs->end()) << "job " << held << " not in squeue";
  EXPECT_TRUE(job->Pending()) << job->state;
  EXPECT_EQ(job->required_nodes, std::vector<std::string>{"node1"});
  EXPECT_EQ(job->excluded_nodes, std::vector<std::string>{"node2"});
  EXPECT_NE(job->gres.find("gpu:tesla"), std::string::npos) << job->gres;  // 22.05: "gres:gpu:tesla:1"
  EXPECT_EQ(job->features, "");
  EXPECT_EQ(job->partition, "batch");
  auto nodes = cli.Nodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  for (const auto& n : *nodes) {
    EXPECT_EQ(n.partitions, std::set<std::string>{"batch"}) << n.name;
    EXPECT_TRUE(n.features.empty()) << n.name;
    EXPECT_EQ(slurm::GresFits(job->gres, n.gres), std::optional<bool>(true)) << n.name << ": " << n.gres;
    EXPECT_EQ(slurm::JobMayUse(*job, n), n.name == "node1") << n.name;
  }
  EXPECT_EQ(cluster_->Run({"scancel", held}).exit_code, 0);
}

TEST_F(SlurmBridgeTest, BurstLendsTheIdleNodeAndLeavesTheBusyOne) {
  const std::string busy = Submit({"-w", "node1", "--wrap", "sleep 12"});
  ASSERT_TRUE(WaitJob(busy, "RUNNING"));
  StartBridge();
  // The bridge adopts both nodes: fenced for Kubernetes, Slurm-owned.
  ASSERT_TRUE(WaitFor([&] { return slurm::K8sFenced(Node("node1")) && slurm::K8sFenced(Node("node2")); }));
  const auto t0 = std::chrono::steady_clock::now();
  LendWithPod("node2", "burst-1");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << "burst -> node2 LENT in " << secs << " s\n";
  EXPECT_EQ(cluster_->Reason("node2").rfind(slurm::kOwnedReasonPrefix, 0), 0u) << cluster_->Reason("node2");
  // node1 (running a job) was never touched, and stays with Slurm.
  EXPECT_EQ(PhaseOf("node1"), slurm::Phase::kSlurm);
  EXPECT_EQ(cluster_->State("node1").find("DRAIN"), std::string::npos);
  EXPECT_EQ(cluster_->JobState(busy), "RUNNING");
  // min-kept 1 / max-lent 1: a second burst lends nothing more.
  AddPod("burst-2");
  PendingGpuPod("burst-2");
  std::this_thread::sleep_for(seconds(3));  // several reconciles (a negative check: nothing may happen)
  EXPECT_EQ(PhaseOf("node1"), slurm::Phase::kSlurm);
  // Status shows the phases; the Event names the lend.
  auto status = cluster_->Run({KGPU_BIN, "slurm-bridge", "status", "--kubeconfig", operator_kubeconfig_});
  EXPECT_NE(status.out.find("LENT"), std::string::npos) << status.out << status.err;
  EXPECT_NE(status.out.find("SLURM_OWNED"), std::string::npos) << status.out;
  ExpectNoJobKilled();
  ExpectInvariantsHeld();
  // Under exactly its deploy/ RBAC the bridge watched (no 403 and no fall-back to polling).
  const std::string log = Tail(cluster_->base() + "/bridge.log", 2000);
  EXPECT_EQ(log.find("forbidden"), std::string::npos) << log;
  // The first reconcile said where it was: what it read from each side, then that it was done.
  const std::string whole = Tail(cluster_->base() + "/bridge.log", SIZE_MAX);
  const size_t read_slurm = whole.find("first reconcile: Slurm has 2 node(s) and ");
  const size_t read_k8s = whole.find("first reconcile: Kubernetes has 2 kgpu.io/pool node(s)");
  const size_t done = whole.find("first reconcile done in");
  EXPECT_NE(read_slurm, std::string::npos) << whole.substr(0, 4000);
  EXPECT_NE(read_k8s, std::string::npos) << whole.substr(0, 4000);
  EXPECT_NE(done, std::string::npos) << whole.substr(0, 4000);
  EXPECT_TRUE(read_slurm < read_k8s && read_k8s < done) << whole.substr(0, 4000);
  EXPECT_EQ(whole.find("first reconcile", done + 1), std::string::npos) << "only the first";
  bool watched = false;
  for (const auto& r : api_->RequestLog()) watched = watched || r.find("watch=true") != std::string::npos;
  EXPECT_TRUE(watched);
}

TEST_F(SlurmBridgeTest, ABusyNodeIsLentOnlyAfterItsJobEndsOnItsOwn) {
  const std::string job = Submit({"-w", "node1", "--wrap", "sleep 8"});
  ASSERT_TRUE(WaitJob(job, "RUNNING"));
  StartBridge({"--nodes", "node1"});
  AddPod("wait-1");
  PendingGpuPod("wait-1");
  ASSERT_TRUE(WaitPhase("node1", slurm::Phase::kLendDraining));
  ASSERT_TRUE(WaitFor([&] { return cluster_->State("node1") == "MIXED+DRAIN"; })) << cluster_->State("node1");
  // While the job runs the node is never lent.
  while (cluster_->JobState(job) == "RUNNING") {
    EXPECT_NE(PhaseOf("node1"), slurm::Phase::kLent);
    EXPECT_TRUE(slurm::K8sFenced(Node("node1")));
    std::this_thread::sleep_for(milliseconds(200));
  }
  ASSERT_TRUE(WaitPhase("node1", slurm::Phase::kLent));
  EXPECT_EQ(cluster_->JobState(job), "COMPLETED");
  const auto lease = slurm::LeaseOf(Node("node1"));
  EXPECT_NE(std::find(lease.jobs_seen.begin(), lease.jobs_seen.end(), job), lease.jobs_seen.end())
      << slurm::SerializeLease(lease);
  SchedulePod("wait-1", "node1");
  ExpectNoJobKilled();
  ExpectInvariantsHeld();
}

TEST_F(SlurmBridgeTest, AJobNeedingEveryNodeReclaimsThroughAPdbThatFirstRefuses) {
  StartBridge({"--nodes", "node2"});
  LendWithPod("node2", "pdb-1");
  // A PDB that allows no disruption of the only inference pod.
  json pdb = {{"apiVersion", "policy/v1"},
              {"kind", "PodDisruptionBudget"},
              {"metadata", {{"name", "infer"}, {"namespace", "infer"}}},
              {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"app", "infer"}}}}}}}};
  ASSERT_LT(api_->Create("poddisruptionbudgets", "infer", pdb).code, 300);
  const std::string train = Submit({"-N", "2", "--wrap", "sleep 2"});
  ASSERT_TRUE(WaitPhase("node2", slurm::Phase::kReclaimEvicting));
  // Refused (429) while the PDB forbids it: the Event says so, the pod stays, the fence is on.
  ASSERT_TRUE(WaitFor([&] {
    const std::string log = Tail(cluster_->base() + "/bridge.log", 400);
    return log.find("EvictionBlocked") != std::string::npos;
  }));
  EXPECT_FALSE(PodGone("pdb-1"));
  EXPECT_TRUE(slurm::K8sFenced(Node("node2")));
  EXPECT_EQ(cluster_->JobState(train), "PENDING");
  // The PDB allows it now: the pod is evicted, Slurm gets the node back, the job runs.
  pdb = api_->Get("poddisruptionbudgets", "infer", "infer").body;
  pdb["spec"]["minAvailable"] = 0;
  ASSERT_EQ(api_->Update("poddisruptionbudgets", "infer", pdb).code, 200);
  ASSERT_TRUE(WaitFor([&] { return PodGone("pdb-1"); }));
  ASSERT_TRUE(WaitPhase("node2", slurm::Phase::kSlurm));
  EXPECT_TRUE(WaitJob(train, "COMPLETED"));
  EXPECT_EQ(cluster_->State("node2").find("DRAIN"), std::string::npos) << cluster_->State("node2");
  const auto lease = slurm::LeaseOf(Node("node2"));
  EXPECT_EQ(lease.pods_evicted, std::vector<std::string>{"infer/pdb-1"}) << slurm::SerializeLease(lease);
  ExpectNoJobKilled();
  ExpectInvariantsHeld();
}

TEST_F(SlurmBridgeTest, AnAdminDrainOfALentNodeIsLeftAlone) {
  StartBridge({"--nodes", "node1"});
  LendWithPod("node1", "admin-1");
  // The admin drains the lent node for their own reason (overwriting ours, as scontrol does).
  auto r = cluster_->Run({"scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=admin: bad fan"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(WaitFor([&] { return slurm::LeaseOf(Node("node1")).admin_drained; }));
  EXPECT_EQ(PhaseOf("node1"), slurm::Phase::kLent);
  // Reclaim: the pod leaves, Kubernetes is fenced, and the node stays drained with their reason.
  r = cluster_->Run({KGPU_BIN, "slurm-bridge", "reclaim", "--kubeconfig", operator_kubeconfig_, "node1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(WaitPhase("node1", slurm::Phase::kSlurm));
  EXPECT_TRUE(PodGone("admin-1"));
  EXPECT_TRUE(slurm::K8sFenced(Node("node1")));
  std::this_thread::sleep_for(seconds(2));  // several reconciles (a negative check)
  EXPECT_EQ(cluster_->Reason("node1"), "admin: bad fan");
  EXPECT_NE(cluster_->State("node1").find("DRAIN"), std::string::npos);
  ExpectInvariantsHeld();
}

TEST_F(SlurmBridgeTest, SlurmctldStoppedMidReclaimFreezesThenFinishes) {
  StartBridge({"--nodes", "node1"});
  LendWithPod("node1", "ctld-1");
  ASSERT_TRUE(cluster_->StopController().ok());
  auto r = cluster_->Run({KGPU_BIN, "slurm-bridge", "reclaim", "--kubeconfig", operator_kubeconfig_, "node1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Kubernetes-side steps go ahead (fence, evict); the Slurm undrain freezes.
  ASSERT_TRUE(WaitPhase("node1", slurm::Phase::kReclaimUnfencing));
  EXPECT_TRUE(PodGone("ctld-1"));
  std::this_thread::sleep_for(seconds(3));  // frozen: several reconciles change nothing
  EXPECT_EQ(PhaseOf("node1"), slurm::Phase::kReclaimUnfencing);
  EXPECT_TRUE(slurm::K8sFenced(Node("node1")));
  auto status = cluster_->Run({KGPU_BIN, "slurm-bridge", "status", "--kubeconfig", operator_kubeconfig_, "--slurm-conf",
                               cluster_->conf(), "--slurm-timeout", "3s"});
  EXPECT_NE(status.out.find("UNREACHABLE"), std::string::npos) << status.out;
  // scontrol's several stderr lines are one line of the message, never a literal \n.
  EXPECT_EQ(status.out.find("\\n"), std::string::npos) << status.out;
  ASSERT_TRUE(cluster_->StartController().ok());
  ASSERT_TRUE(WaitPhase("node1", slurm::Phase::kSlurm));
  EXPECT_TRUE(WaitFor([&] { return cluster_->State("node1") == "IDLE"; })) << cluster_->State("node1");
  const std::string job = Submit({"-w", "node1", "--wrap", "true"});
  ExpectNoJobKilled();
  ExpectInvariantsHeld();
}

// Two replicas with leader election: the Lease holder lends; it is SIGKILLed (no release) while
// the node is LENT; the standby takes the Lease once it expires and carries out the reclaim an
// operator then asks for, from the durable state alone.
TEST_F(SlurmBridgeTest, ASecondReplicaTakesOverFromAKilledLeader) {
  auto holder = [&] {
    const json lease = api_->Get("leases", "kgpu-system", "kgpu-slurm-bridge").body;
    return lease.value("spec", json::object()).value("holderIdentity", "");
  };
  std::map<std::string, std::unique_ptr<BridgeProcess>> replicas;
  for (const std::string id : {"bridge-a", "bridge-b"}) {
    replicas[id] = std::make_unique<BridgeProcess>(cluster_->base() + "/" + id + ".log",
                                                   BridgeArgs({"--nodes", "node1", "--identity", id}));
  }
  std::string leader;
  ASSERT_TRUE(WaitFor([&] { return replicas.contains(leader = holder()); })) << leader;
  const std::string standby = leader == "bridge-a" ? "bridge-b" : "bridge-a";
  LendWithPod("node1", "ha-1");
  replicas[leader]->Kill();
  ASSERT_EQ(
      cluster_->Run({KGPU_BIN, "slurm-bridge", "reclaim", "--kubeconfig", operator_kubeconfig_, "node1"}).exit_code, 0);
  ASSERT_TRUE(WaitFor([&] { return holder() == standby; })) << holder() << "\n"
                                                            << Tail(cluster_->base() + "/" + standby + ".log", 30);
  ASSERT_TRUE(WaitPhase("node1", slurm::Phase::kSlurm)) << slurm::PhaseName(PhaseOf("node1"));
  ASSERT_TRUE(WaitFor([&] { return PodGone("ha-1"); }));
  EXPECT_TRUE(WaitFor([&] { return cluster_->State("node1") == "IDLE"; })) << cluster_->State("node1");
  EXPECT_TRUE(slurm::K8sFenced(Node("node1")));
  const std::string after = Submit({"-w", "node1", "--wrap", "true"});
  EXPECT_TRUE(WaitJob(after, "COMPLETED")) << "Slurm schedules on the reclaimed node";
  ExpectNoJobKilled();
  ExpectInvariantsHeld();
}

// Kills the bridge at every crash point in turn (lend points while lending node1 on a pending pod,
// reclaim points during an operator's reclaim) and restarts it; each round must end with node1
// back with Slurm, the pod gone, and the job on node2 untouched. `mode`: extra bridge flags.
void SlurmBridgeTest::KillAtEveryPhaseBoundary(const std::vector<std::string>& mode) {
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), mode.begin(), mode.end());
    return args;
  };
  // A job on node2 the whole time: lending node1 must never touch it.
  const std::string steady = Submit({"-w", "node2", "--wrap", "sleep 300"});
  ASSERT_TRUE(WaitJob(steady, "RUNNING"));
  int round = 0;
  for (const auto& point : slurm::kCrashPoints) {
    SCOPED_TRACE(point);
    const bool lend_point = point.rfind("lend-", 0) == 0;
    const std::string pod = Cat("crash-", round++);
    AddPod(pod);
    // Lend (crashing at `point` when it is a lend point, then restarted).
    StartBridge(with({"--nodes", "node1", "--crash-at", lend_point ? point : std::string("reclaim-decided")}));
    if (lend_point) {
      PendingGpuPod(pod);
      ASSERT_EQ(bridge_->Wait(kDeadline), 86) << "never reached " << point;
      StartBridge(with({"--nodes", "node1"}));
      ASSERT_TRUE(WaitPhase("node1", slurm::Phase::kLent)) << slurm::PhaseName(PhaseOf("node1"));
      SchedulePod(pod, "node1");
      // Reclaim without a crash.
      ASSERT_EQ(
          cluster_->Run({KGPU_BIN, "slurm-bridge", "reclaim", "--kubeconfig", operator_kubeconfig_, "node1"}).exit_code,
          0);
    } else {
      bridge_.reset();
      StartBridge(with({"--nodes", "node1"}));
      LendWithPod("node1", pod);
      bridge_.reset();  // killed while LENT (a boundary too)
      StartBridge(with({"--nodes", "node1", "--crash-at", point}));
      ASSERT_EQ(
          cluster_->Run({KGPU_BIN, "slurm-bridge", "reclaim", "--kubeconfig", operator_kubeconfig_, "node1"}).exit_code,
          0);
      ASSERT_EQ(bridge_->Wait(kDeadline), 86) << "never reached " << point;
      StartBridge(with({"--nodes", "node1"}));
    }
    ASSERT_TRUE(WaitPhase("node1", slurm::Phase::kSlurm)) << slurm::PhaseName(PhaseOf("node1"));
    ASSERT_TRUE(WaitFor([&] { return PodGone(pod); }));
    EXPECT_TRUE(WaitFor([&] { return cluster_->State("node1") == "IDLE"; })) << cluster_->State("node1");
    EXPECT_TRUE(slurm::K8sFenced(Node("node1")));
    EXPECT_EQ(cluster_->JobState(steady), "RUNNING");
    bridge_.reset();
  }
  ASSERT_EQ(cluster_->Run({"scancel", "--signal=KILL", "--full", steady}).exit_code, 0);  // our own test job
  {
    std::lock_guard lock(mu_);
    jobs_.clear();
  }
  const std::string after = Submit({"-w", "node1", "--wrap", "true"});
  ExpectNoJobKilled();
  ExpectInvariantsHeld();
}

TEST_F(SlurmBridgeTest, KilledAtEveryPhaseBoundaryItRestartsConsistent) {
  KillAtEveryPhaseBoundary({});
}

// The power-save lend (--lend-via power-save): the Slurm fence is State=POWER_DOWN_ASAP, Slurm's
// SuspendProgram says the node is empty, and Slurm asks for the node back itself: it gives it to a
// job and runs ResumeProgram (`kgpu slurm-bridge hook resume`), which is the reclaim's event. The
// job waits in CONFIGURING while the pods are evicted; only then does the resume command let the
// node's slurmd register (as rebooted), and the job runs. Nothing is killed or requeued.
class SlurmBridgePowerSaveTest : public SlurmBridgeTest {
 protected:
  void SetUp() override {
    power_save_ = true;
    SlurmBridgeTest::SetUp();
  }
};

TEST_F(SlurmBridgePowerSaveTest, SuspendProgramLendsAndResumeProgramReclaims) {
  const std::string busy = Submit({"-w", "node1", "--wrap", "sleep 5"});
  ASSERT_TRUE(WaitJob(busy, "RUNNING"));
  resumer_ = std::jthread([this](std::stop_token st) { ServeResumeRequests(st); });
  // A blocked job must pend 10 minutes before the bridge's own polling reclaims for it: here only
  // Slurm's ResumeProgram (or the POWERING_UP state it leaves) can start the reclaim.
  auto args = PowerSaveArgs();
  args.insert(args.end(), {"--reclaim-threshold", "600"});
  StartBridge(args);
  ASSERT_TRUE(WaitFor([&] { return slurm::K8sFenced(Node("node1")) && slurm::K8sFenced(Node("node2")); }));

  LendWithPod("node2", "ps-1");
  // Lent while Slurm holds it powered down with our reason (no DRAIN flag any more: 22.05 drops it
  // at POWERED_DOWN); SuspendProgram ran and woke the bridge through the node annotation.
  const std::string lent_state = cluster_->State("node2");
  EXPECT_NE(lent_state.find("POWER"), std::string::npos) << lent_state;
  EXPECT_EQ(cluster_->Reason("node2").rfind(slurm::kOwnedReasonPrefix, 0), 0u) << cluster_->Reason("node2");
  EXPECT_TRUE(WaitFor([&] {
    return Node("node2")["metadata"].value("annotations", json::object()).contains(slurm::kSuspendedAnnotation);
  })) << "SuspendProgram (kgpu slurm-bridge hook suspend) did not annotate node2:\n"
      << Tail(cluster_->base() + "/hooks/hooks.log", 20);
  EXPECT_EQ(PhaseOf("node1"), slurm::Phase::kSlurm);

  // A job for node2: Slurm allocates the powered-down node and runs ResumeProgram.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string job = Submit({"-w", "node2", "--wrap", "sleep 1"});
  auto since = [&] { return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0).count(); };
  // Slurm allocates the node once it is POWERED_DOWN (SuspendTimeout after SuspendProgram).
  ASSERT_TRUE(WaitFor([&] { return cluster_->JobState(job) == "CONFIGURING"; })) << cluster_->JobState(job);
  const auto allocated = since();
  ASSERT_TRUE(WaitFor([&] { return PodGone("ps-1"); }))
      << "the pod on node2 was not evicted; phase " << slurm::PhaseName(PhaseOf("node2"));
  const auto evicted = since();
  ASSERT_TRUE(WaitFor([&] {
    const std::string st = cluster_->State("node2");
    return !st.empty() && st.find("POWER") == std::string::npos && st.find("NOT_RESPONDING") == std::string::npos;
  })) << cluster_->State("node2");
  const auto registered = since();
  ASSERT_TRUE(WaitJob(job, "RUNNING", seconds(120)) || cluster_->JobState(job) == "COMPLETED")
      << "job " << job << " is " << cluster_->JobState(job) << ", node2 " << cluster_->State("node2");
  const auto running = since();
  ASSERT_TRUE(WaitPhase("node2", slurm::Phase::kSlurm));
  const auto lease = slurm::LeaseOf(Node("node2"));
  EXPECT_EQ(lease.requested_by, "slurm-resume") << lease.why;
  EXPECT_TRUE(slurm::K8sFenced(Node("node2")));
  std::string hooks_log = Tail(cluster_->base() + "/hooks/hooks.log", 50);
  EXPECT_NE(hooks_log.find("reclaim requested"), std::string::npos) << hooks_log;
  {
    std::lock_guard lock(mu_);
    EXPECT_EQ(resumes_, std::vector<std::string>{"node2"}) << "the resume command ran for other nodes, or failed";
  }
  std::cout << "[ measure ] power-save reclaim, from the job's submission: Slurm gave it node2 " << allocated
            << " ms, pod evicted " << evicted << " ms, slurmd -b "
            << "registered " << registered << " ms, job running " << running
            << " ms (the last wait is slurmctld's periodic job_time_limit check, up to ~30 s)\n";
  ExpectNoJobKilled();
  ExpectInvariantsHeld();
}

// The same crash points with the power-save lend: the Slurm-side steps are POWER_DOWN_ASAP and
// POWER_UP plus the resume command instead of DRAIN and UNDRAIN.
TEST_F(SlurmBridgePowerSaveTest, KilledAtEveryPhaseBoundaryItRestartsConsistent) {
  resumer_ = std::jthread([this](std::stop_token st) { ServeResumeRequests(st); });
  KillAtEveryPhaseBoundary(PowerSaveArgs());
  std::lock_guard lock(mu_);
  for (const auto& r : resumes_) EXPECT_EQ(r, "node1") << "a resume request for another node, or with pods still there";
}

}  // namespace
}  // namespace kgpu
