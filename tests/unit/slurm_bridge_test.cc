// The slurm-bridge state machine without a real Slurm: the Bridge class in process against
// FakeSlurm (tests/testing/fake_slurm.h: 22.05's node states, DRAIN reasons, jobs with end times,
// rendered as scontrol/squeue text and read by the product's parsers) and the API server stand-in
// over HTTP. Every Reconcile() goes through Step(), which asserts invariant F on every node
// (Slurm DRAIN, or the Kubernetes fence: taint kgpu.io/owner + cordon) after the reconcile.
// Time: the bridge's clock is the wall clock plus an offset the tests move forward; confirm gap,
// thresholds and cooldowns are 0, so nothing here waits on a timer.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "common/process.h"
#include "common/strings.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "k8s/events.h"
#include "k8s/patch.h"
#include "k8s/resources.h"
#include "slurm/bridge.h"
#include "slurm/lease.h"
#include "slurm/rest.h"
#include "testing/bridge_k8s.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_slurm.h"
#include "testing/fake_slurmrestd.h"
#include "testing/promtool.h"

namespace kgpu::slurm {
namespace {
using nlohmann::json;

class BridgeUnitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = std::make_unique<testing::FakeApiServer>();
    ASSERT_TRUE(api_->Start().ok());
    auto cfg = k8s::ParseKubeconfig(api_->Kubeconfig(), "test");
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    cfg->qps = 0;  // no client-side rate limit in tests
    auto c = k8s::Client::Create(*cfg);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    events_ = std::make_unique<k8s::EventRecorder>(*client_, "kgpu-slurm-bridge", "unit");
    slurm_ = std::make_unique<testing::FakeSlurm>([this] { return Now(); });
    if (rest_mode_) {
      // The REST backend against slurmrestd's v0.0.39 over the same fake Slurm.
      restd_ = std::make_unique<testing::FakeSlurmrestd>(*slurm_, "jwt-unit");
      ASSERT_TRUE(restd_->ok());
      RestOptions ro;
      ro.url = restd_->Url();
      ro.user = "slurm";
      ro.token = "jwt-unit";
      rest_ = std::make_unique<RestSlurmClient>(ro);
    }
    ASSERT_LT(
        api_->Create("namespaces", "", {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", "infer"}}}})
            .code,
        300);
    opts_.identity = "unit";
    opts_.max_lent = 1;
    opts_.min_kept = 0;
    opts_.lend_threshold = std::chrono::seconds(0);
    opts_.cooldown = std::chrono::seconds(0);
    opts_.lend_hysteresis = std::chrono::seconds(3600);
    opts_.confirm_gap = std::chrono::milliseconds(0);
    opts_.interval = std::chrono::milliseconds(10);
  }
  void TearDown() override {
    if (restd_) {
      EXPECT_GT(restd_->requests(), 0) << "the REST backend was not used";
    }
    bridge_.reset();
    if (api_) api_->Stop();
  }

  int64_t Now() const { return static_cast<int64_t>(std::time(nullptr)) + offset_; }

  // A Slurm node that is also a Kubernetes node labelled for the bridge. fenced: the
  // separated-pools fence (deploy/slurm/) is on; cordoned: spec.unschedulable (without the taint
  // when not fenced: an admin's `kubectl cordon`).
  void AddNode(const std::string& name, bool fenced = true, bool cordoned = false) {
    slurm_->AddNode(name);
    auto r = api_->Create("nodes", "", testing::SlurmPoolNode(name, fenced, cordoned));
    ASSERT_EQ(r.code, 201) << r.body.dump();
    names_.push_back(name);
  }

  Bridge& B() {
    SlurmClient& backend = rest_ ? static_cast<SlurmClient&>(*rest_) : *slurm_;
    if (!bridge_)
      bridge_ = std::make_unique<Bridge>(backend, *client_, opts_, events_.get(), &dry_, [this] { return Now(); });
    return *bridge_;
  }

  // One reconcile, then invariant F on every node.
  ReconcileResult Step() {
    auto r = B().Reconcile();
    for (const auto& n : names_) {
      // DRAIN; powered down or powering up (no job runs before slurmd registers as rebooted); or
      // our power-down under way (as tests/integration/slurm_bridge_test.cc counts it).
      const std::string st = slurm_->State(n);
      const bool going_down =
          st.find("+POWER_DOWN") != std::string::npos || st.find("POWERING_DOWN") != std::string::npos;
      const bool slurm_fenced = st.find("DRAIN") != std::string::npos || st.find("POWERED_DOWN") != std::string::npos ||
                                st.find("POWERING_UP") != std::string::npos ||
                                (going_down && IsOwnedReason(slurm_->Reason(n)));
      const bool k8s_fenced = K8sFenced(Node(n));
      EXPECT_TRUE(slurm_fenced || k8s_fenced)
          << "F violated on " << n << ": Slurm " << slurm_->State(n) << ", lease " << Annotation(n, kLeaseAnnotation);
    }
    return r;
  }
  // Reconciles until pred holds (at most `max` times; pods being deleted need the stand-in's
  // reaper, so there is a short pause between rounds). True when it held.
  bool StepUntil(const std::function<bool()>& pred, int max = 40) {
    for (int i = 0; i < max; ++i) {
      if (pred()) return true;
      Step();
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred();
  }

  // A PodDisruptionBudget that refuses every eviction of the app=infer pods (minAvailable 1).
  void RefusingPdb() {
    json pdb = {{"apiVersion", "policy/v1"},
                {"kind", "PodDisruptionBudget"},
                {"metadata", {{"name", "infer"}, {"namespace", "infer"}}},
                {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"app", "infer"}}}}}}}};
    ASSERT_LT(api_->Create("poddisruptionbudgets", "infer", pdb).code, 300);
  }

  // Four reconciles leave `node` with Slurm (`why`); once the clock is `wait` seconds on, it is lent.
  void ExpectLentOnlyAfter(const std::string& node, int64_t wait, const std::string& why) {
    for (int i = 0; i < 4; ++i) {
      Step();
      EXPECT_EQ(PhaseOf(node), Phase::kSlurm) << why;
    }
    offset_ += wait;
    EXPECT_TRUE(StepUntil([&] { return PhaseOf(node) == Phase::kLent; })) << PhaseName(PhaseOf(node));
  }

  json Node(const std::string& name) const { return api_->Get("nodes", "", name).body; }
  Lease LeaseOn(const std::string& name) const { return LeaseOf(Node(name)); }
  Phase PhaseOf(const std::string& name) const { return LeaseOn(name).phase; }
  std::string Annotation(const std::string& node, const std::string& key) const {
    const json n = Node(node);
    const json a = n["metadata"].value("annotations", json::object());
    return a.contains(key) && a[key].is_string() ? a[key].get<std::string>() : "";
  }
  bool Cordoned(const std::string& node) const { return Node(node)["spec"].value("unschedulable", false); }
  void SetCordon(const std::string& node, bool on) {
    json n = Node(node);
    if (on) {
      n["spec"]["unschedulable"] = true;
    } else {
      n["spec"].erase("unschedulable");
    }
    ASSERT_EQ(api_->Update("nodes", "", n).code, 200);
  }
  // What `kgpu slurm-bridge reclaim NODE` writes.
  void RequestReclaim(const std::string& node, const std::string& who = "operator") {
    auto r =
        client_->Patch(k8s::FindResource("nodes")->Path("", node),
                       {{"metadata", {{"annotations", {{kReclaimAnnotation, Cat(who, " at ", k8s::NowRfc3339())}}}}}},
                       k8s::kMergePatch);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  // An inference pod kube-scheduler could not place (GPUs requested, PodScheduled=False).
  void PendingGpuPod(const std::string& name) { ASSERT_EQ(testing::PendingGpuPod(*api_, "infer", name), ""); }
  // kube-scheduler and kubelet: bind the pod to an accepting node and run it.
  void RunPodOn(const std::string& name, const std::string& node) {
    ASSERT_FALSE(Cordoned(node)) << node << " is cordoned";
    ASSERT_EQ(testing::RunPodOn(*api_, *client_, "infer", name, node), "");
  }
  bool PodGone(const std::string& name) const { return api_->Get("pods", "infer", name).code == 404; }

  // Events the bridge recorded with this reason about this node: their notes.
  std::vector<std::string> Events(const std::string& node, const std::string& reason) const {
    std::vector<std::string> notes;
    auto list = client_->List("/apis/events.k8s.io/v1/namespaces/default/events");
    EXPECT_TRUE(list.ok()) << list.status();
    if (!list.ok()) return notes;
    for (const auto& e : (*list)["items"]) {
      if (e.value("reason", "") == reason && e["regarding"].value("name", "") == node)
        notes.push_back(e.value("note", ""));
    }
    return notes;
  }

  // Issue 35's cluster: gpu01..gpu03 (partition batch), gpu02 running a Slurm job for an hour,
  // gpu01 and gpu03 lent, each running one inference pod (p1, p3).
  void LentAroundABusyNode() {
    for (const char* n : {"gpu01", "gpu02", "gpu03"}) AddNode(n);
    ASSERT_TRUE(slurm_->StartJob({"gpu02"}, Now() + 3600).ok());
    opts_.max_lent = 2;
    Lend("gpu01", "p1");
    Lend("gpu03", "p3");
  }
  // `node` stays lent with its pod through `rounds` reconciles.
  void ExpectStaysLent(const std::string& node, const std::string& pod, int rounds = 4) {
    for (int i = 0; i < rounds; ++i) {
      Step();
      EXPECT_EQ(PhaseOf(node), Phase::kLent) << node << " after " << i + 1 << " reconcile(s)";
      EXPECT_FALSE(PodGone(pod)) << pod;
    }
    EXPECT_TRUE(Events(node, "ReclaimStarted").empty()) << Events(node, "ReclaimStarted").front();
  }

  // Adopts `node` and lends it on one pending GPU pod, then runs that pod there.
  void Lend(const std::string& node, const std::string& pod) {
    PendingGpuPod(pod);
    ASSERT_TRUE(StepUntil([&] { return PhaseOf(node) == Phase::kLent; })) << PhaseName(PhaseOf(node));
    EXPECT_TRUE(IsOwnedReason(slurm_->Reason(node))) << slurm_->Reason(node);
    RunPodOn(pod, node);
  }

  std::unique_ptr<testing::FakeApiServer> api_;
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<k8s::EventRecorder> events_;
  std::unique_ptr<testing::FakeSlurm> slurm_;
  bool rest_mode_ = false;  // the bridge talks to slurm_ through slurmrestd's REST API
  std::unique_ptr<testing::FakeSlurmrestd> restd_;
  std::unique_ptr<RestSlurmClient> rest_;
  std::unique_ptr<Bridge> bridge_;
  BridgeOptions opts_;
  std::ostringstream dry_;
  std::vector<std::string> names_;
  int64_t offset_ = 0;
};

// The bridge's scenarios, each run twice: against FakeSlurm as a SlurmClient (what the CLI
// backend reads, rendered as scontrol/squeue text) and through the REST backend against
// slurmrestd's v0.0.39 API over the same fake.
class BridgeTest : public BridgeUnitTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    rest_mode_ = GetParam() == "rest";
    BridgeUnitTest::SetUp();
  }
};
INSTANTIATE_TEST_SUITE_P(Backends, BridgeTest, ::testing::Values("cli", "rest"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ------------------------------------------------------------------ the fake itself

TEST(FakeSlurmTest, FollowsTwentyTwoOFiveSemantics) {
  testing::FakeSlurm s;
  s.AddNode("node1", 2);
  auto n = s.Node("node1");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->state, "IDLE");
  auto job = s.StartJob({"node1"}, 2000000000, 1);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(s.Node("node1")->state, "MIXED");
  auto d = s.Drain("node1", "kgpu-lend:op1", kOwnedReasonPrefix);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->state, "MIXED+DRAIN");
  EXPECT_EQ(d->reason, "kgpu-lend:op1");
  EXPECT_EQ(d->reason_user, "root");
  EXPECT_FALSE(s.StartJob({"node1"}).ok()) << "a drained node takes no new job";
  auto on = s.JobsOnNode("node1");
  ASSERT_TRUE(on.ok());
  ASSERT_EQ(on->size(), 1u);
  EXPECT_EQ(on->front().id, *job);
  EXPECT_TRUE(on->front().end_time.has_value());
  s.EndJob(*job);
  EXPECT_EQ(s.Node("node1")->state, "IDLE+COMPLETING+DRAIN");
  EXPECT_TRUE(s.Node("node1")->Busy());
  EXPECT_TRUE(s.JobsOnNode("node1")->empty());
  s.CompletingDone("node1");
  EXPECT_EQ(s.Node("node1")->state, "IDLE+DRAIN");
  // An admin's DRAIN overwrites our reason; our Drain then refuses to overwrite theirs.
  ASSERT_TRUE(s.AdminDrain("node1", "admin: bad fan").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(s.Drain("node1", "kgpu-lend:op1", kOwnedReasonPrefix).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(s.Undrain("node1", kOwnedReasonPrefix).status()));
  EXPECT_EQ(s.Reason("node1"), "admin: bad fan");
  ASSERT_TRUE(s.AdminResume("node1").ok());
  EXPECT_EQ(s.State("node1"), "IDLE");
  EXPECT_FALSE(s.AdminResume("node1").ok()) << "RESUME on IDLE: Invalid node state specified";
  s.SetResponding("node1", false);
  EXPECT_FALSE(s.Node("node1")->Responding());
  s.SetReachable(false);
  EXPECT_TRUE(absl::IsUnavailable(s.Nodes().status()));
  EXPECT_TRUE(absl::IsUnavailable(s.Jobs().status()));
  s.SetReachable(true);
  EXPECT_TRUE(absl::IsNotFound(s.Node("node9").status()));
  const std::string pending = s.SubmitPending(2, "Resources");
  auto jobs = s.Jobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->front().id, pending);
  EXPECT_TRUE(jobs->front().Pending());
  EXPECT_EQ(jobs->front().node_count, 2);
}

TEST(LeaseTest, AdminCordonedRoundTrips) {
  Lease l;
  l.op = "op-1";
  l.phase = Phase::kLent;
  l.admin_cordoned = true;
  auto back = ParseLease(SerializeLease(l));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->admin_cordoned);
  EXPECT_NE(SerializeLease(l).find("\"adminCordoned\":true"), std::string::npos);
  auto bad = ParseLease(R"({"phase":"SLURM_OWNED","adminCordoned":"yes"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("adminCordoned"), std::string::npos) << bad.status();
}

// ------------------------------------------------------------------ the parsers: where a job may run

// squeue -o kSqueueFormat as 22.05.8 prints it: %n and %x empty when none, %b "N/A", %f "(null)";
// %f last, with '|' in it.
TEST(SlurmParse, SqueueReadsWhatAJobAskedFor) {
  auto jobs = ParseSqueue(
      "10|PENDING||1|ReqNodeNotAvail, UnavailableNodes:gpu01|N/A|batch|2026-12-03T16:51:10|gpu01||N/A|(null)\n"
      "11|PENDING||2|Resources|N/A|batch,debug|2026-12-03T16:51:12||gpu[02-03]|gres:gpu:h100:2|a100|h100\n"
      "12|RUNNING|gpu02|1|None|2026-12-03T17:51:12|batch|2026-12-03T16:50:00|||N/A|(null)\n");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  const SlurmJob &pinned = (*jobs)[0], &asks = (*jobs)[1], &running = (*jobs)[2];
  EXPECT_EQ(pinned.required_nodes, std::vector<std::string>{"gpu01"});
  EXPECT_TRUE(pinned.excluded_nodes.empty());
  EXPECT_EQ(pinned.gres, "");
  EXPECT_EQ(pinned.features, "");
  EXPECT_EQ(pinned.reason, "ReqNodeNotAvail, UnavailableNodes:gpu01");
  EXPECT_TRUE(asks.required_nodes.empty());
  EXPECT_EQ(asks.excluded_nodes, (std::vector<std::string>{"gpu02", "gpu03"}));
  EXPECT_EQ(asks.gres, "gres:gpu:h100:2");
  EXPECT_EQ(asks.features, "a100|h100");
  EXPECT_EQ(asks.partition, "batch,debug");
  EXPECT_EQ(running.nodes, std::vector<std::string>{"gpu02"});
  EXPECT_TRUE(running.required_nodes.empty() && running.features.empty());
  // The old 8-field format, or a line cut short: an error naming the line.
  auto old = ParseSqueue("1|RUNNING|node2|1|None|N/A|batch|N/A\n");
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.status().message().find("line 1 has 8 fields, expected 12"), std::string::npos) << old.status();
  auto bad = ParseSqueue(
      "12|RUNNING|gpu02|1|None|N/A|batch|N/A|||N/A|(null)\n13|PENDING||1|Resources|N/A|batch|N/A|n[1-|||x\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("squeue: line 2: hostlist 'n[1-'"), std::string::npos) << bad.status();
}

// scontrol show node -o: Partitions= and the features (a real 22.05.8 record, with features).
TEST(SlurmParse, ScontrolReadsPartitionsAndFeatures) {
  auto nodes = ParseScontrolNodes(
      "NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.70 "
      "AvailableFeatures=ib,nvlink ActiveFeatures=ib Gres=gpu:tesla:2(S:0-1) NodeAddr=127.0.0.1 NodeHostName=localhost "
      "Version=22.05.8 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC  RealMemory=1000 State=IDLE+DRAIN ThreadsPerCore=1 "
      "Partitions=batch,debug  BootTime=2026-12-03T08:16:56 Reason=kgpu-lend:op-1 [root@2026-12-03T20:16:12]\n"
      "NodeName=node2 CPUAlloc=0 CPUTot=2 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) State=IDLE\n");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].partitions, (std::set<std::string>{"batch", "debug"}));
  EXPECT_EQ((*nodes)[0].features, (std::set<std::string>{"ib", "nvlink"}));
  EXPECT_EQ((*nodes)[0].gres, "gpu:tesla:2(S:0-1)");
  EXPECT_EQ((*nodes)[0].reason, "kgpu-lend:op-1");
  EXPECT_TRUE((*nodes)[1].partitions.empty());
  EXPECT_TRUE((*nodes)[1].features.empty());
}

TEST(SlurmParse, FeaturesGresAndWhereAJobMayRun) {
  const std::set<std::string> f = {"a100", "ib"};
  EXPECT_EQ(FeaturesMatch("", f), true);
  EXPECT_EQ(FeaturesMatch("(null)", f), true);
  EXPECT_EQ(FeaturesMatch("a100", f), true);
  EXPECT_EQ(FeaturesMatch("h100", f), false);
  EXPECT_EQ(FeaturesMatch("a100&ib", f), true);
  EXPECT_EQ(FeaturesMatch("a100,nvlink", f), false);
  EXPECT_EQ(FeaturesMatch("h100|a100", f), true);
  EXPECT_EQ(FeaturesMatch("h100|v100", f), false);
  // Beyond plain names: cannot tell.
  for (const char* expr : {"[a100|h100]", "a100*2", "(a100|h100)&ib", "a100&ib|h100", "!a100"}) {
    EXPECT_EQ(FeaturesMatch(expr, f), std::nullopt) << expr;
  }
  EXPECT_EQ(GresFits("", "(null)"), true);
  EXPECT_EQ(GresFits("gres:gpu:2", "gpu:h100:8(S:0-1)"), true);
  EXPECT_EQ(GresFits("gres:gpu:h100:8", "gpu:h100:8(S:0-1)"), true);
  EXPECT_EQ(GresFits("gres:gpu:h100:9", "gpu:h100:8"), false);
  EXPECT_EQ(GresFits("gres:gpu:a100:1", "gpu:h100:8"), false);
  EXPECT_EQ(GresFits("gres/gpu=6", "gpu:a100:4,gpu:h100:4"), true);
  EXPECT_EQ(GresFits("gres/gpu:a100=6", "gpu:a100:4,gpu:h100:4"), false);
  EXPECT_EQ(GresFits("gpu:1", "(null)"), false);
  EXPECT_EQ(GresFits("gres:gpu", "gpu:h100:1"), true) << "no count is one";
  EXPECT_EQ(GresFits("gres:gpu:1,gres:mps:100", "gpu:h100:8(S:0,1),mps:400"), true);
  EXPECT_EQ(GresFits("gres:mps:800", "gpu:h100:8,mps:400"), false);
  EXPECT_EQ(GresFits("license/x=1", "gpu:8"), std::nullopt);
  EXPECT_EQ(GresFits("gres:gpu:1", "gpu:h100:8:x:y"), std::nullopt);

  SlurmNode n;
  n.name = "gpu01";
  n.partitions = {"batch"};
  n.features = {"a100"};
  n.gres = "gpu:a100:4";
  SlurmJob j;
  j.partition = "batch";
  EXPECT_TRUE(JobMayUse(j, n));
  j.partition = "debug,batch";
  EXPECT_TRUE(JobMayUse(j, n));
  j.partition = "debug";
  EXPECT_FALSE(JobMayUse(j, n));
  j.partition = "batch";
  j.required_nodes = {"gpu02"};
  EXPECT_FALSE(JobMayUse(j, n));
  j.required_nodes = {"gpu01", "gpu02"};
  EXPECT_TRUE(JobMayUse(j, n));
  j.excluded_nodes = {"gpu01"};
  EXPECT_FALSE(JobMayUse(j, n));
  j = SlurmJob{};
  j.features = "h100";
  EXPECT_FALSE(JobMayUse(j, n));
  j.features = "[a100*1]";
  EXPECT_TRUE(JobMayUse(j, n)) << "an expression we cannot read does not rule the node out";
  j.gres = "gres:gpu:a100:8";
  EXPECT_FALSE(JobMayUse(j, n));
  n.partitions.clear();
  j = SlurmJob{};
  j.partition = "debug";
  EXPECT_TRUE(JobMayUse(j, n)) << "a node whose partitions are not said";
}

// slurmrestd v0.0.39: the same, from its JSON.
TEST(SlurmParse, RestReadsWhatAJobAskedForAndTheNodesPartitionsAndFeatures) {
  auto jobs = ParseRestJobs(R"({"jobs":[{"job_id":10,"job_state":"PENDING","node_count":1,"partition":"batch",
      "required_nodes":"gpu[01-02]","excluded_nodes":"","features":"a100|h100","tres_per_node":"gres/gpu:h100=2"},
      {"job_id":11,"job_state":"PENDING","required_nodes":null,"features":null,"tres_per_node":null}]})");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].required_nodes, (std::vector<std::string>{"gpu01", "gpu02"}));
  EXPECT_TRUE((*jobs)[0].excluded_nodes.empty());
  EXPECT_EQ((*jobs)[0].features, "a100|h100");
  EXPECT_EQ((*jobs)[0].gres, "gres/gpu:h100=2");
  EXPECT_TRUE((*jobs)[1].required_nodes.empty() && (*jobs)[1].features.empty() && (*jobs)[1].gres.empty());
  auto nodes = ParseRestNodes(R"({"nodes":[{"name":"gpu01","state":["IDLE"],"partitions":["batch","debug"],
      "features":"ib,nvlink","active_features":"ib","gres":"gpu:h100:8"}]})");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ((*nodes)[0].partitions, (std::set<std::string>{"batch", "debug"}));
  EXPECT_EQ((*nodes)[0].features, (std::set<std::string>{"ib", "nvlink"}));
  auto bad = ParseRestNodes(R"({"nodes":[{"name":"gpu01","state":["IDLE"],"partitions":[1]}]})");
  EXPECT_EQ(bad.status().message(), "slurmrestd nodes: node gpu01: \"partitions\" is not a list of strings");
}

// ------------------------------------------------------------------ item 1: reclaim requests

// ------------------------------------------------------------------ the lending policy's knobs

// Nodes lent or being lent.
int Lent(const std::vector<std::string>& nodes, const std::function<Phase(const std::string&)>& phase) {
  int n = 0;
  for (const auto& name : nodes) n += phase(name) != Phase::kSlurm ? 1 : 0;
  return n;
}

TEST_P(BridgeTest, MaxLentAndMinKeptBoundTheLending) {
  for (const char* n : {"node1", "node2", "node3"}) AddNode(n);
  for (const char* p : {"p1", "p2", "p3"}) PendingGpuPod(p);  // 8 GPUs per node: 3 pods fit one node...
  opts_.max_lent = 3;
  opts_.min_kept = 2;
  auto phase = [&](const std::string& n) { return PhaseOf(n); };
  for (int i = 0; i < 5; ++i) Step();
  EXPECT_EQ(Lent(names_, phase), 1) << "one node answers 3 one-GPU pods";
  // 20 pods of one GPU want 3 nodes; min_kept 2 of 3 leaves one to lend.
  for (int i = 4; i <= 20; ++i) PendingGpuPod(Cat("p", i));
  for (int i = 0; i < 5; ++i) Step();
  EXPECT_EQ(Lent(names_, phase), 1) << "Slurm keeps min_kept = 2 nodes";
  // min_kept 0, max_lent 2: two nodes, never the third.
  bridge_.reset();
  opts_.min_kept = 0;
  opts_.max_lent = 2;
  for (int i = 0; i < 8; ++i) Step();
  EXPECT_EQ(Lent(names_, phase), 2) << "at most max_lent = 2 lent or being lent";
}

// A lent node's Node object is deleted (an autoscaler, an operator): the lease went with it, so
// the node is LOST — Slurm's drain stays (nothing runs there unfenced), status and the metric say
// so — until the Node registers again, when it is adopted and given back to Slurm.
TEST_P(BridgeTest, ANodeWhoseObjectIsDeletedIsLostUntilItReturns) {
  AddNode("node1");
  Lend("node1", "p1");
  ASSERT_EQ(api_->Delete("pods", "infer", "p1").code, 200);
  ASSERT_EQ(api_->Delete("nodes", "", "node1").code, 200);
  auto r = B().Reconcile();
  auto lost = std::find_if(r.nodes.begin(), r.nodes.end(), [](const NodeView& v) { return v.name == "node1"; });
  ASSERT_NE(lost, r.nodes.end());
  EXPECT_TRUE(lost->lost);
  EXPECT_STREQ(ViewPhaseName(*lost), "LOST");
  EXPECT_NE(lost->frozen.find("no Node object with kgpu.io/pool is named node1"), std::string::npos) << lost->frozen;
  EXPECT_TRUE(IsOwnedReason(slurm_->Reason("node1"))) << "the drain stays: " << slurm_->Reason("node1");
  EXPECT_NE(B().Metrics().find("kgpu_slurm_bridge_nodes{phase=\"LOST\"} 1"), std::string::npos) << B().Metrics();
  // Prometheus' own linter: every family has HELP and TYPE (none had before), every line parses.
  EXPECT_EQ(testing::PromtoolFindings(B().Metrics()), "") << B().Metrics();
  for (int i = 0; i < 3; ++i) B().Reconcile();
  EXPECT_TRUE(IsOwnedReason(slurm_->Reason("node1"))) << "still drained while the Node is gone";
  // It registers again (fenced, as deploy/slurm labels it): adopted, and Slurm gets it back.
  ASSERT_EQ(api_->Create("nodes", "", testing::SlurmPoolNode("node1", true, false)).code, 201);
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm && !IsOwnedReason(slurm_->Reason("node1")); }))
      << slurm_->State("node1") << " " << slurm_->Reason("node1");
  EXPECT_NE(B().Metrics().find("kgpu_slurm_bridge_nodes{phase=\"LOST\"} 0"), std::string::npos);
}

TEST_P(BridgeTest, LendWaitsForTheUnschedulableThreshold) {
  AddNode("node1");
  opts_.lend_threshold = std::chrono::seconds(30);
  PendingGpuPod("p1");
  ExpectLentOnlyAfter("node1", 31, "the pod is unschedulable for less than 30 s");
}

TEST_P(BridgeTest, CooldownKeepsANodeBackWithSlurmForAWhile) {
  AddNode("node1");
  opts_.cooldown = std::chrono::seconds(120);
  Lend("node1", "p1");
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm && PodGone("p1"); }));
  PendingGpuPod("p2");
  ExpectLentOnlyAfter("node1", 121, "back with Slurm less than the 120 s cooldown ago");
}

TEST_P(BridgeTest, HysteresisCancelsADrainingLendOnlyAfterTheDemandStaysGone) {
  AddNode("node1");
  opts_.lend_hysteresis = std::chrono::seconds(60);
  auto job = slurm_->StartJob({"node1"}, Now() + 600);
  ASSERT_TRUE(job.ok());
  PendingGpuPod("p1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kLendDraining; }));
  // The demand goes away (the pod was deleted, or scheduled elsewhere).
  ASSERT_TRUE(client_->Delete(k8s::FindResource("pods")->Path("infer", "p1")).ok());
  ASSERT_TRUE(StepUntil([&] { return PodGone("p1"); }));
  Step();  // the bridge sees the demand gone now: the hysteresis counts from here
  offset_ += 30;
  for (int i = 0; i < 3; ++i) {
    Step();
    EXPECT_EQ(PhaseOf("node1"), Phase::kLendDraining) << "within the 60 s hysteresis";
  }
  offset_ += 31;
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; })) << PhaseName(PhaseOf("node1"));
  EXPECT_EQ(slurm_->State("node1"), "ALLOCATED") << "our drain is lifted, the job runs on";
  EXPECT_FALSE(Events("node1", "LendCancelled").empty());
  EXPECT_TRUE(slurm_->Ended().empty()) << "the job is never killed";
}

TEST_P(BridgeTest, AForcedDeleteComesOnlyAfterItsDeadline) {
  AddNode("node1");
  opts_.force_delete_after = std::chrono::seconds(300);
  Lend("node1", "p1");
  RefusingPdb();
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kReclaimEvicting; })) << PhaseName(PhaseOf("node1"));
  for (int i = 0; i < 4; ++i) {
    Step();
    EXPECT_FALSE(PodGone("p1")) << "the PDB refuses and the deadline is 300 s away";
  }
  offset_ += 301;
  ASSERT_TRUE(StepUntil([&] { return PodGone("p1") && PhaseOf("node1") == Phase::kSlurm; }))
      << PhaseName(PhaseOf("node1"));
  EXPECT_EQ(slurm_->State("node1"), "IDLE");
}

// Event-driven: with an hour between polls, a pending GPU pod and then a reclaim request are
// acted on within seconds, through the watches (BridgeWatch) that wake Run().
TEST_P(BridgeTest, WatchEventsWakeTheLoopLongBeforeTheInterval) {
  AddNode("node1");
  opts_.interval = std::chrono::hours(1);
  BridgeWatch watch(*client_, B());
  watch.Start();
  std::jthread loop([&](std::stop_token st) { B().Run(st); });
  auto within = [](const std::function<bool()>& pred, std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return pred();
  };
  PendingGpuPod("p1");
  EXPECT_TRUE(within([&] { return PhaseOf("node1") == Phase::kLent; }, std::chrono::seconds(20)))
      << PhaseName(PhaseOf("node1"));
  RunPodOn("p1", "node1");
  RequestReclaim("node1");
  EXPECT_TRUE(
      within([&] { return PhaseOf("node1") == Phase::kSlurm && slurm_->State("node1") == "IDLE" && PodGone("p1"); },
             std::chrono::seconds(20)))
      << PhaseName(PhaseOf("node1"));
  // Settled: no write of ours wakes the loop again (it would spin on its own events).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t rv = api_->ResourceVersion();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(api_->ResourceVersion(), rv) << "the bridge keeps writing while nothing changes";
  loop.request_stop();
  loop.join();
  watch.Stop();
}

// A lend starts when --lend-threshold expires, not at the next --interval: with an hour between
// polls and no watch to wake it, a pod pending since just now is lent a node about 2 s later.
TEST_P(BridgeTest, ALendStartsWhenTheThresholdExpiresNotAtTheNextInterval) {
  AddNode("node1");
  opts_.interval = std::chrono::hours(1);
  opts_.lend_threshold = std::chrono::seconds(2);
  PendingGpuPod("p1");
  const auto start = std::chrono::steady_clock::now();
  std::jthread loop([&](std::stop_token st) { B().Run(st); });
  bool lent = false;
  while (!lent && std::chrono::steady_clock::now() - start < std::chrono::seconds(8)) {
    lent = PhaseOf("node1") != Phase::kSlurm;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  loop.request_stop();
  loop.join();
  EXPECT_TRUE(lent) << "no lend within 8 s of a 2 s threshold (waited for the 1 h interval)";
  EXPECT_GE(took, std::chrono::milliseconds(900)) << "lent before the threshold";
}

TEST_P(BridgeTest, AReclaimRequestOnANodeThatIsNotLentIsRemovedWithAnEvent) {
  AddNode("node1");
  Step();
  ASSERT_EQ(PhaseOf("node1"), Phase::kSlurm);
  RequestReclaim("node1", "slurm ResumeProgram");
  Step();
  EXPECT_EQ(Annotation("node1", kReclaimAnnotation), "") << "a meaningless request must not stay on the Node";
  const auto notes = Events("node1", "ReclaimRequestRemoved");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("not lent"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("slurm ResumeProgram"), std::string::npos) << notes[0];
  // And it does not cancel the next lend.
  Lend("node1", "p1");
  EXPECT_TRUE(Events("node1", "LendCancelled").empty());
}

TEST_P(BridgeTest, AReclaimRequestThatCancelsALendIsRemovedSoTheNextLendGoesThrough) {
  AddNode("node1");
  auto job = slurm_->StartJob({"node1"}, Now() + 600);
  ASSERT_TRUE(job.ok());
  PendingGpuPod("p1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kLendDraining; }));
  Step();
  EXPECT_EQ(slurm_->State("node1"), "ALLOCATED+DRAIN");
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return !Events("node1", "LendCancelled").empty(); }));
  EXPECT_EQ(Annotation("node1", kReclaimAnnotation), "");
  const auto notes = Events("node1", "ReclaimRequestRemoved");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("acted on"), std::string::npos) << notes[0];
  EXPECT_EQ(slurm_->State("node1"), "ALLOCATED") << "our drain is gone with the cancelled lend";
  // The demand is still there: the next lend starts and, once the job has ended on its own,
  // completes. A stale request would cancel it at once, every time.
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kLendDraining; }));
  slurm_->EndJob(*job, /*completing=*/false);
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kLent; })) << PhaseName(PhaseOf("node1"));
  EXPECT_EQ(Events("node1", "LendCancelled").size(), 1u);
  EXPECT_EQ(slurm_->Ended(), std::vector<std::string>{*job});
}

TEST_P(BridgeTest, AReclaimRequestOnALentNodeIsRemovedOnceActedOn) {
  AddNode("node1");
  Lend("node1", "p1");
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm && PodGone("p1"); }));
  EXPECT_EQ(Annotation("node1", kReclaimAnnotation), "");
  EXPECT_EQ(Events("node1", "ReclaimRequestRemoved").size(), 1u);
  EXPECT_EQ(slurm_->State("node1"), "IDLE");
  EXPECT_EQ(LeaseOn("node1").pods_evicted, std::vector<std::string>{"infer/p1"});
  // Lent again on new demand: the old request is not re-read.
  Lend("node1", "p2");
  Step();
  EXPECT_EQ(PhaseOf("node1"), Phase::kLent);
}

TEST_P(BridgeTest, AReclaimRequestWhileAlreadyReclaimingIsRemoved) {
  AddNode("node1");
  Lend("node1", "p1");
  RefusingPdb();
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kReclaimEvicting; }));
  Step();
  EXPECT_FALSE(Events("node1", "EvictionBlocked").empty());
  RequestReclaim("node1", "impatient operator");
  Step();
  EXPECT_EQ(Annotation("node1", kReclaimAnnotation), "");
  const auto notes = Events("node1", "ReclaimRequestRemoved");
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_TRUE(notes[0].find("already being reclaimed") != std::string::npos ||
              notes[1].find("already being reclaimed") != std::string::npos)
      << notes[0] << " | " << notes[1];
  // The PDB allows it now; the reclaim finishes and nothing stale is left.
  json pdb = api_->Get("poddisruptionbudgets", "infer", "infer").body;
  pdb["spec"]["minAvailable"] = 0;
  ASSERT_EQ(api_->Update("poddisruptionbudgets", "infer", pdb).code, 200);
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; }, 200));
  EXPECT_EQ(Annotation("node1", kReclaimAnnotation), "");
  EXPECT_TRUE(PodGone("p1"));
}

TEST_P(BridgeTest, DryRunLeavesTheReclaimRequestInPlace) {
  AddNode("node1");
  Step();
  RequestReclaim("node1");
  opts_.dry_run = true;
  bridge_.reset();
  Step();
  EXPECT_NE(Annotation("node1", kReclaimAnnotation), "");
  EXPECT_NE(dry_.str().find("remove a reclaim request"), std::string::npos) << dry_.str();
}

// ------------------------------------------------------------------ item 2: an admin's cordon and drain

TEST_P(BridgeTest, AnAdminCordonBeforeAdoptionIsRecordedAndNeverLifted) {
  AddNode("node1", /*fenced=*/false, /*cordoned=*/true);  // kubectl cordon node1
  Step();
  auto lease = LeaseOn("node1");
  EXPECT_EQ(lease.phase, Phase::kSlurm);
  EXPECT_TRUE(lease.admin_cordoned) << SerializeLease(lease);
  EXPECT_EQ(Events("node1", "AdminCordon").size(), 1u);
  // Demand: the node is not lent (lending would uncordon it).
  PendingGpuPod("p1");
  for (int i = 0; i < 5; ++i) Step();
  EXPECT_EQ(PhaseOf("node1"), Phase::kSlurm);
  EXPECT_TRUE(Cordoned("node1"));
  EXPECT_EQ(slurm_->BridgeWrites("node1"), 0u);
  // The admin uncordons: the bridge's fence goes back on, and now the node may be lent.
  SetCordon("node1", false);
  Step();
  lease = LeaseOn("node1");
  EXPECT_FALSE(lease.admin_cordoned) << SerializeLease(lease);
  EXPECT_EQ(Events("node1", "AdminCordonLifted").size(), 1u);
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kLent; })) << PhaseName(PhaseOf("node1"));
  EXPECT_FALSE(Cordoned("node1"));
}

TEST_P(BridgeTest, TheSeparatedPoolsFenceIsNotMistakenForAnAdminCordon) {
  AddNode("node1", /*fenced=*/true);
  Step();
  EXPECT_FALSE(LeaseOn("node1").admin_cordoned);
  Lend("node1", "p1");
}

TEST_P(BridgeTest, AnAdminCordonOfALentNodeSurvivesTheReclaimAndBlocksTheNextLend) {
  AddNode("node1");
  Lend("node1", "p1");
  SetCordon("node1", true);  // kubectl cordon on the lent node
  Step();
  EXPECT_TRUE(LeaseOn("node1").admin_cordoned);
  EXPECT_EQ(PhaseOf("node1"), Phase::kLent) << "a cordon alone does not reclaim";
  EXPECT_EQ(Events("node1", "AdminCordon").size(), 1u);
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; }));
  EXPECT_TRUE(LeaseOn("node1").admin_cordoned);
  // New demand: the node stays cordoned and with Slurm.
  PendingGpuPod("p2");
  for (int i = 0; i < 5; ++i) Step();
  EXPECT_EQ(PhaseOf("node1"), Phase::kSlurm);
  EXPECT_TRUE(Cordoned("node1"));
}

TEST_P(BridgeTest, AnAdminCordonOfALentNodeThatIsLiftedIsForgotten) {
  AddNode("node1");
  Lend("node1", "p1");
  SetCordon("node1", true);
  Step();
  ASSERT_TRUE(LeaseOn("node1").admin_cordoned);
  SetCordon("node1", false);
  Step();
  EXPECT_FALSE(LeaseOn("node1").admin_cordoned);
  EXPECT_EQ(Events("node1", "AdminCordonLifted").size(), 1u);
}

TEST_P(BridgeTest, AnAdminDrainBeforeAdoptionIsRecordedAndLeftAlone) {
  AddNode("node1");
  ASSERT_TRUE(slurm_->AdminDrain("node1", "admin: PSU swap").ok());
  PendingGpuPod("p1");
  for (int i = 0; i < 5; ++i) Step();
  const auto lease = LeaseOn("node1");
  EXPECT_EQ(lease.phase, Phase::kSlurm);
  EXPECT_TRUE(lease.admin_drained) << SerializeLease(lease);
  EXPECT_EQ(lease.prev_slurm_reason, "admin: PSU swap");
  EXPECT_EQ(slurm_->Reason("node1"), "admin: PSU swap");
  EXPECT_EQ(slurm_->BridgeWrites("node1"), 0u);
}

TEST_P(BridgeTest, AnAdminDrainOfALentNodeIsNeverResumed) {
  AddNode("node1");
  Lend("node1", "p1");
  ASSERT_TRUE(slurm_->AdminDrain("node1", "admin: bad fan").ok());
  Step();
  EXPECT_TRUE(LeaseOn("node1").admin_drained);
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; }));
  for (int i = 0; i < 3; ++i) Step();
  EXPECT_EQ(slurm_->Reason("node1"), "admin: bad fan");
  EXPECT_EQ(slurm_->State("node1"), "IDLE+DRAIN");
  for (const auto& w : slurm_->Writes()) EXPECT_EQ(w.find("UNDRAIN"), std::string::npos) << w;
  EXPECT_EQ(Events("node1", "ReclaimedAdminDrain").size(), 1u);
  EXPECT_TRUE(K8sFenced(Node("node1")));
}

TEST_P(BridgeTest, AnAdminDrainThatTheAdminResumesIsForgottenWhileLent) {
  AddNode("node1");
  Lend("node1", "p1");
  ASSERT_TRUE(slurm_->AdminDrain("node1", "admin: quick check").ok());
  Step();
  ASSERT_TRUE(LeaseOn("node1").admin_drained);
  ASSERT_TRUE(slurm_->AdminResume("node1").ok());  // done: the lent node is unfenced in Slurm now
  Step();
  EXPECT_TRUE(IsOwnedReason(slurm_->Reason("node1"))) << "our fence goes back on: " << slurm_->Reason("node1");
  EXPECT_FALSE(LeaseOn("node1").admin_drained) << SerializeLease(LeaseOn("node1"));
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; }));
  EXPECT_EQ(slurm_->State("node1"), "IDLE");
  EXPECT_TRUE(Events("node1", "ReclaimedAdminDrain").empty());
}

// ------------------------------------------------------------------ the failure table (§C)

TEST_P(BridgeTest, ABusyNodeIsLentOnlyAfterItsJobEndsAndTheNodeLeavesCompleting) {
  AddNode("node1");
  auto job = slurm_->StartJob({"node1"}, Now() + 300, 1);
  ASSERT_TRUE(job.ok());
  PendingGpuPod("p1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kLendDraining; }));
  for (int i = 0; i < 4; ++i) {
    Step();
    EXPECT_EQ(PhaseOf("node1"), Phase::kLendDraining);
  }
  EXPECT_EQ(slurm_->State("node1"), "MIXED+DRAIN");
  EXPECT_EQ(LeaseOn("node1").jobs_seen, std::vector<std::string>{*job});
  // The job leaves squeue while the node is still COMPLETING: not empty yet.
  slurm_->EndJob(*job, /*completing=*/true);
  for (int i = 0; i < 3; ++i) {
    Step();
    EXPECT_EQ(PhaseOf("node1"), Phase::kLendDraining);
  }
  slurm_->CompletingDone("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kLent; }));
  EXPECT_EQ(slurm_->Ended(), std::vector<std::string>{*job});
}

TEST_P(BridgeTest, IdleNodesAndEarliestEndingJobsAreLentFirst) {
  AddNode("node1");
  AddNode("node2");
  AddNode("node3");
  ASSERT_TRUE(slurm_->StartJob({"node1"}, Now() + 3600).ok());
  ASSERT_TRUE(slurm_->StartJob({"node2"}, Now() + 60).ok());
  ASSERT_TRUE(slurm_->StartJob({"node3"}, Now() + 600).ok());
  PendingGpuPod("p1");
  Step();
  EXPECT_EQ(PhaseOf("node2"), Phase::kLendDraining);
  EXPECT_EQ(PhaseOf("node1"), Phase::kSlurm);
  EXPECT_EQ(PhaseOf("node3"), Phase::kSlurm);
}

TEST_P(BridgeTest, AForeignDrainMidLendCancelsItAndKeepsTheAdminReason) {
  AddNode("node1");
  auto job = slurm_->StartJob({"node1"}, Now() + 300);
  ASSERT_TRUE(job.ok());
  PendingGpuPod("p1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kLendDraining; }));
  Step();
  ASSERT_TRUE(slurm_->AdminDrain("node1", "admin: firmware").ok());
  Step();
  const auto lease = LeaseOn("node1");
  EXPECT_EQ(lease.phase, Phase::kSlurm);
  EXPECT_TRUE(lease.admin_drained);
  EXPECT_EQ(slurm_->Reason("node1"), "admin: firmware");
  EXPECT_FALSE(Events("node1", "ForeignDrain").empty());
  EXPECT_TRUE(slurm_->Ended().empty()) << "the job is never killed";
}

TEST_P(BridgeTest, SlurmUnreachableFreezesEveryTransitionThatNeedsIt) {
  AddNode("node1");
  AddNode("node2");
  Lend("node1", "p1");
  auto job = slurm_->StartJob({"node2"}, Now() + 300);
  ASSERT_TRUE(job.ok());
  opts_.max_lent = 2;
  bridge_.reset();
  PendingGpuPod("p2");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node2") == Phase::kLendDraining; }));
  slurm_->SetReachable(false);
  RequestReclaim("node1");
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 5; ++i) {
    auto r = Step();
    EXPECT_FALSE(r.slurm_ok);
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  // Said once, not every reconcile; the metric counts them.
  size_t said = 0;
  for (size_t at = 0; (at = log.find("every transition that needs it is frozen", at)) != std::string::npos; ++at) {
    ++said;
  }
  EXPECT_EQ(said, 1u) << log;
  EXPECT_NE(B().Metrics().find("kgpu_slurm_bridge_frozen_total{side=\"slurm\"} 5"), std::string::npos) << B().Metrics();
  // node1's Event says what waits for Slurm (the undrain), once (no series of repeats), and never
  // that the evictions, which went ahead, were frozen.
  auto events = client_->List("/apis/events.k8s.io/v1/namespaces/default/events");
  ASSERT_TRUE(events.ok()) << events.status();
  int unreachable = 0;
  for (const auto& e : (*events)["items"]) {
    if (e.value("reason", "") != "SlurmUnreachable" || e["regarding"].value("name", "") != "node1") continue;
    ++unreachable;
    EXPECT_EQ(e.value("note", ""),
              "R3_SLURM_UNFENCING frozen: Slurm unreachable: reclaim frozen (Slurm keeps its drain)");
    EXPECT_FALSE(e.contains("series")) << "said once, not every reconcile: " << e.dump();
  }
  EXPECT_EQ(unreachable, 1) << events->dump();
  // node2: still draining, Kubernetes fence on; node1: the Kubernetes side of the reclaim went
  // ahead, the undrain waits.
  EXPECT_EQ(PhaseOf("node2"), Phase::kLendDraining);
  EXPECT_TRUE(K8sFenced(Node("node2")));
  EXPECT_EQ(PhaseOf("node1"), Phase::kReclaimUnfencing);
  EXPECT_TRUE(PodGone("p1"));
  EXPECT_TRUE(IsOwnedReason(slurm_->Reason("node1")));
  EXPECT_NE(B().Metrics().find("kgpu_slurm_bridge_slurm_up 0"), std::string::npos) << B().Metrics();
  slurm_->SetReachable(true);
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; }));
  EXPECT_EQ(slurm_->State("node1"), "IDLE");
  EXPECT_TRUE(slurm_->Ended().empty());
}

TEST_P(BridgeTest, ReclaimWaitsForSlurmdBeforeTheUndrain) {
  AddNode("node1");
  Lend("node1", "p1");
  slurm_->SetResponding("node1", false);  // slurmd stopped while Kubernetes uses the host
  Step();
  EXPECT_EQ(PhaseOf("node1"), Phase::kLent);
  EXPECT_EQ(slurm_->State("node1"), "IDLE+DRAIN+NOT_RESPONDING");
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kReclaimUnfencing; }));
  for (int i = 0; i < 3; ++i) Step();
  EXPECT_EQ(PhaseOf("node1"), Phase::kReclaimUnfencing);
  EXPECT_NE(slurm_->State("node1").find("DRAIN"), std::string::npos);
  slurm_->SetResponding("node1", true);
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; }));
  EXPECT_EQ(slurm_->State("node1"), "IDLE");
}

TEST_P(BridgeTest, ALentNodeThatLostItsDrainIsDrainedAgain) {
  AddNode("node1");
  Lend("node1", "p1");
  ASSERT_TRUE(slurm_->AdminResume("node1").ok());  // someone "returned" it to Slurm by hand
  Step();
  EXPECT_TRUE(IsOwnedReason(slurm_->Reason("node1"))) << slurm_->State("node1");
  EXPECT_EQ(Events("node1", "SlurmFenceRestored").size(), 1u);
  EXPECT_EQ(PhaseOf("node1"), Phase::kLent);
}

TEST_P(BridgeTest, ABlockedSlurmJobReclaimsALentNode) {
  AddNode("node1");
  AddNode("node2");
  Lend("node1", "p1");
  slurm_->SubmitPending(2,
                        "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; }));
  EXPECT_TRUE(PodGone("p1"));
  EXPECT_EQ(slurm_->State("node1"), "IDLE");
  EXPECT_EQ(LeaseOn("node1").requested_by, "slurm-demand");
}

// ------------------------------------------------------------------ Slurm demand: the nodes a job can use

// The issue: gpu01 and gpu03 lent, gpu02 running a job, then `sbatch -w gpu01 -N1`: only gpu01
// comes back; gpu03 keeps its inference pod (no job could use it).
TEST_P(BridgeTest, AJobPinnedToOneLentNodeReclaimsThatNodeOnly) {
  ASSERT_NO_FATAL_FAILURE(LentAroundABusyNode());
  const std::string job = slurm_->Submit({.required = {"gpu01"}});
  EXPECT_EQ(slurm_->PendingReason(job), "ReqNodeNotAvail, UnavailableNodes:gpu01");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("gpu01") == Phase::kSlurm; })) << PhaseName(PhaseOf("gpu01"));
  EXPECT_TRUE(PodGone("p1"));
  EXPECT_EQ(slurm_->State("gpu01"), "IDLE");
  EXPECT_EQ(LeaseOn("gpu01").requested_by, "slurm-demand");
  const auto started = Events("gpu01", "ReclaimStarted");
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0],
            Cat("Slurm job ", job, " (1 node(s), -w gpu01) is pending: ReqNodeNotAvail, UnavailableNodes:gpu01"));
  EXPECT_EQ(slurm_->PendingReason(job), "None") << "Slurm can start it now";
  ExpectStaysLent("gpu03", "p3");
  EXPECT_TRUE(slurm_->Ended().empty()) << "no job is ever killed";
}

// With a PodDisruptionBudget that allows one disruption (minAvailable 1 of the two inference
// pods), the one eviction goes to the pinned job's node, never to gpu03.
TEST_P(BridgeTest, APdbsOneDisruptionGoesToThePinnedJobsNode) {
  ASSERT_NO_FATAL_FAILURE(LentAroundABusyNode());
  RefusingPdb();  // minAvailable 1: with p1 and p3 running, one of them may go
  slurm_->Submit({.required = {"gpu01"}});
  ASSERT_TRUE(StepUntil([&] { return PodGone("p1") && PhaseOf("gpu01") == Phase::kSlurm; }))
      << PhaseName(PhaseOf("gpu01"));
  EXPECT_TRUE(Events("gpu01", "EvictionBlocked").empty()) << "the budget was gpu01's";
  ExpectStaysLent("gpu03", "p3");
  EXPECT_TRUE(Events("gpu03", "EvictionBlocked").empty());
}

// -x: an excluded lent node is not taken back; the other one is.
TEST_P(BridgeTest, AJobExcludingALentNodeReclaimsAnotherOne) {
  ASSERT_NO_FATAL_FAILURE(LentAroundABusyNode());
  const std::string job = slurm_->Submit({.excluded = {"gpu01"}});
  EXPECT_EQ(slurm_->PendingReason(job), "Resources");  // gpu02 would do, once its job ends
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("gpu03") == Phase::kSlurm; })) << PhaseName(PhaseOf("gpu03"));
  EXPECT_EQ(Events("gpu03", "ReclaimStarted").at(0).find(Cat("Slurm job ", job, " (1 node(s), -x gpu01) is pending")),
            0u)
      << Events("gpu03", "ReclaimStarted").at(0);
  ExpectStaysLent("gpu01", "p1");
}

// -p: a job in another partition takes back only lent nodes of that partition, and none when no
// lent node is in it.
TEST_P(BridgeTest, AJobInAnotherPartitionReclaimsOnlyNodesOfThatPartition) {
  ASSERT_NO_FATAL_FAILURE(LentAroundABusyNode());
  slurm_->SetPartitions("gpu02", {"batch", "debug"});
  slurm_->SetPartitions("gpu03", {"batch", "inference"});
  const std::string debug = slurm_->Submit({.partition = "debug"});
  EXPECT_EQ(slurm_->PendingReason(debug), "Resources");
  ExpectStaysLent("gpu01", "p1");
  ExpectStaysLent("gpu03", "p3", 1);
  const std::string inference = slurm_->Submit({.partition = "inference"});
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("gpu03") == Phase::kSlurm; })) << PhaseName(PhaseOf("gpu03"));
  ExpectStaysLent("gpu01", "p1");
  EXPECT_EQ(slurm_->PendingReason(inference), "None");
}

// --gres and --constraint: only a lent node that has them comes back; an idle Slurm node without
// them does not count for the job.
TEST_P(BridgeTest, AJobNeedingGresOrAFeatureReclaimsOnlyANodeThatHasIt) {
  ASSERT_NO_FATAL_FAILURE(LentAroundABusyNode());
  slurm_->SetGres("gpu01", "gpu:a100:2(S:0)");  // gpu02 and gpu03: gpu:h100:8
  slurm_->SetFeatures("gpu03", {"ib", "nvlink"});
  const std::string gres = slurm_->Submit({.gres = "gres:gpu:a100:2"});
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("gpu01") == Phase::kSlurm; })) << PhaseName(PhaseOf("gpu01"));
  ExpectStaysLent("gpu03", "p3");
  EXPECT_EQ(slurm_->PendingReason(gres), "None");
  // gpu01 is idle now, but without nvlink: the job needs gpu03.
  const std::string feature = slurm_->Submit({.features = "nvlink&ib"});
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("gpu03") == Phase::kSlurm; })) << PhaseName(PhaseOf("gpu03"));
  EXPECT_NE(Events("gpu03", "ReclaimStarted").at(0).find("(1 node(s), -C nvlink&ib)"), std::string::npos);
  EXPECT_EQ(slurm_->PendingReason(feature), "None");
}

// An admin's drain of a lent node: no job is served by reclaiming it, so no job reclaims it; a job
// pinned to it gets nothing reclaimed (said once), and a job that can run anywhere gets gpu01.
TEST_P(BridgeTest, AnAdminDrainedLentNodeIsNeverReclaimedForAJob) {
  ASSERT_NO_FATAL_FAILURE(LentAroundABusyNode());
  ASSERT_TRUE(slurm_->AdminDrain("gpu03", "admin: bad fan").ok());
  Step();
  ASSERT_TRUE(LeaseOn("gpu03").admin_drained);
  const std::string pinned = slurm_->Submit({.required = {"gpu03"}});
  EXPECT_EQ(slurm_->PendingReason(pinned), "ReqNodeNotAvail, UnavailableNodes:gpu03");
  ::testing::internal::CaptureStderr();
  ExpectStaysLent("gpu03", "p3");
  ExpectStaysLent("gpu01", "p1", 1);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string said = Cat("Slurm job ", pinned, " (1 node(s), -w gpu03) is pending");
  size_t times = 0;
  for (size_t at = 0; (at = log.find(said, at)) != std::string::npos; ++at) ++times;
  EXPECT_EQ(times, 1u) << log;
  EXPECT_NE(log.find("it needs gpu03, which is drained by an admin ('admin: bad fan'): no node is reclaimed for it"),
            std::string::npos)
      << log;
  slurm_->Submit({});
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("gpu01") == Phase::kSlurm; })) << PhaseName(PhaseOf("gpu01"));
  ExpectStaysLent("gpu03", "p3");
  EXPECT_EQ(slurm_->Reason("gpu03"), "admin: bad fan");
}

// A job of 2 nodes with one idle Slurm node takes back exactly one lent node, also while that
// reclaim is still under way (its pod terminating): a node coming back counts.
TEST_P(BridgeTest, ATwoNodeJobWithOneIdleNodeReclaimsExactlyOne) {
  for (const char* n : {"node1", "node2", "node3"}) AddNode(n);
  opts_.max_lent = 2;
  Lend("node1", "p1");
  Lend("node2", "p2");
  const std::string job = slurm_->Submit({.node_count = 2});
  EXPECT_EQ(slurm_->PendingReason(job),
            "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions");
  auto back = [&] { return (PhaseOf("node1") != Phase::kLent ? 1 : 0) + (PhaseOf("node2") != Phase::kLent ? 1 : 0); };
  for (int i = 0; i < 30 && back() == 0; ++i) Step();
  ASSERT_EQ(back(), 1);
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; })) << PhaseName(PhaseOf("node1"));
  EXPECT_EQ(back(), 1) << "node2 too";
  ExpectStaysLent("node2", "p2");
  EXPECT_EQ(slurm_->PendingReason(job), "None");
}

// A lend still draining (L1) is cancelled only for a job that could use the node.
TEST_P(BridgeTest, ADrainingLendIsCancelledOnlyForAJobThatCouldUseTheNode) {
  AddNode("node1");
  AddNode("node2");
  slurm_->SetPartitions("node2", {"debug"});
  ASSERT_TRUE(slurm_->StartJob({"node1"}, Now() + 600).ok());
  ASSERT_TRUE(slurm_->StartJob({"node2"}, Now() + 3600).ok());
  PendingGpuPod("p1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kLendDraining; })) << PhaseName(PhaseOf("node1"));
  slurm_->Submit({.partition = "debug"});
  for (int i = 0; i < 4; ++i) {
    Step();
    EXPECT_EQ(PhaseOf("node1"), Phase::kLendDraining) << "node1 is not in partition debug";
  }
  EXPECT_TRUE(Events("node1", "LendCancelled").empty());
  const std::string batch = slurm_->Submit({});
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; })) << PhaseName(PhaseOf("node1"));
  const auto cancelled = Events("node1", "LendCancelled");
  ASSERT_EQ(cancelled.size(), 1u);
  EXPECT_EQ(cancelled[0].find(Cat("Slurm job ", batch, " (1 node(s)) is pending: Nodes required")), 0u) << cancelled[0];
  EXPECT_TRUE(slurm_->Ended().empty());
}

TEST_P(BridgeTest, TheApiServerDownChangesNothingAnywhere) {
  AddNode("node1");
  Lend("node1", "p1");
  const auto writes = slurm_->Writes().size();
  api_->FailNext(50, 503, "/api/v1/nodes", "GET");
  auto r = B().Reconcile();
  EXPECT_FALSE(r.k8s_ok);
  EXPECT_EQ(slurm_->Writes().size(), writes);
  EXPECT_NE(B().Metrics().find("kgpu_slurm_bridge_api_up 0"), std::string::npos);
  api_->ClearFaults();
  Step();
  EXPECT_EQ(PhaseOf("node1"), Phase::kLent);
}

TEST_P(BridgeTest, AStaleWriterLosesTheCompareAndSwap) {
  AddNode("node1");
  Step();
  // Someone else writes the Node between our read and our write: the write is a 409 and the
  // next reconcile recomputes from the new object.
  const auto gen = LeaseOn("node1").generation;
  RequestReclaim("node1");
  api_->FailNext(1, 409, "/api/v1/nodes/node1", "PUT");
  Step();
  EXPECT_EQ(LeaseOn("node1").generation, gen);
  EXPECT_NE(Annotation("node1", kReclaimAnnotation), "");
  Step();
  EXPECT_EQ(LeaseOn("node1").generation, gen + 1);
  EXPECT_EQ(Annotation("node1", kReclaimAnnotation), "");
}

// ------------------------------------------------------------------ the power-save lend

class PowerSaveUnitTest : public BridgeUnitTest {
 protected:
  void SetUp() override {
    BridgeUnitTest::SetUp();
    opts_.power_save = true;
    marker_ = ::testing::TempDir() + "kgpu-resume-" + std::to_string(::getpid());
    std::remove((marker_ + "-node1").c_str());
    opts_.resume_command = {"touch", marker_ + "-{node}"};
    opts_.resume_retry = std::chrono::seconds(3600);
  }
  void TearDown() override {
    std::remove((marker_ + "-node1").c_str());
    BridgeUnitTest::TearDown();
  }
  bool ResumeCommandRan(const std::string& node) const { return std::ifstream(marker_ + "-" + node).good(); }
  // Lends `node` the power-save way: the bridge asks for the power-down, Slurm (the test) runs
  // SuspendProgram and finishes it, and only then does Kubernetes get the node.
  void PowerLend(const std::string& node, const std::string& pod) {
    PendingGpuPod(pod);
    ASSERT_TRUE(StepUntil([&] { return slurm_->State(node) == "IDLE+DRAIN+POWER_DOWN"; })) << slurm_->State(node);
    for (int i = 0; i < 3; ++i) Step();
    EXPECT_EQ(PhaseOf(node), Phase::kLendDraining) << "lent before Slurm powered it down";
    ASSERT_TRUE(slurm_->AdvancePower(node));  // SuspendProgram: IDLE+POWERING_DOWN
    ASSERT_TRUE(StepUntil([&] { return PhaseOf(node) == Phase::kLent; })) << PhaseName(PhaseOf(node));
    ASSERT_TRUE(slurm_->AdvancePower(node));  // SuspendTimeout later: IDLE+POWERED_DOWN, reason kept
    EXPECT_EQ(slurm_->State(node), "IDLE+POWERED_DOWN");
    Step();
    EXPECT_EQ(PhaseOf(node), Phase::kLent);
    EXPECT_TRUE(IsOwnedReason(slurm_->Reason(node))) << slurm_->Reason(node);
    RunPodOn(pod, node);
  }
  // In R3 with our power-down pending: Slurm finishes it (SuspendProgram, then POWERED_DOWN), the
  // bridge powers the node up and runs the resume command, slurmd registers, and Slurm has it back.
  void FinishPowerDownThenRejoin(const std::string& node) {
    ASSERT_TRUE(slurm_->AdvancePower(node));
    ASSERT_TRUE(slurm_->AdvancePower(node));
    ASSERT_TRUE(StepUntil([&] { return ResumeCommandRan(node); })) << slurm_->State(node);
    slurm_->RegisterRebooted(node);
    ASSERT_TRUE(StepUntil([&] { return PhaseOf(node) == Phase::kSlurm; }));
    EXPECT_EQ(slurm_->State(node), "IDLE");
  }
  std::string marker_;
};

TEST_F(PowerSaveUnitTest, SlurmsJobOnTheLentNodeReclaimsItWithoutADrainAndTheJobRunsAfterThePods) {
  AddNode("node1");
  PowerLend("node1", "p1");
  const size_t writes_before = slurm_->Writes().size();
  auto job = slurm_->StartJobOnPoweredDown("node1");  // Slurm's demand: ALLOCATED+POWERED_DOWN
  ASSERT_TRUE(job.ok()) << job.status();
  // Before ResumeProgram runs the reclaim may already be under way; it must not power the node up
  // itself nor drain it.
  for (int i = 0; i < 3; ++i) Step();
  EXPECT_EQ(slurm_->Writes().size(), writes_before) << slurm_->Writes().back();
  slurm_->RunResumeProgram("node1");  // MIXED+NOT_RESPONDING+POWERING_UP, reason cleared
  ASSERT_TRUE(StepUntil([&] { return ResumeCommandRan("node1"); })) << PhaseName(PhaseOf("node1"));
  EXPECT_TRUE(PodGone("p1")) << "slurmd let in before the pods left";
  EXPECT_EQ(PhaseOf("node1"), Phase::kReclaimUnfencing);
  for (int i = 0; i < 3; ++i) Step();
  EXPECT_EQ(PhaseOf("node1"), Phase::kReclaimUnfencing) << "back before slurmd registered";
  slurm_->RegisterRebooted("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; }));
  EXPECT_EQ(LeaseOn("node1").requested_by, "slurm-resume") << LeaseOn("node1").why;
  const auto writes = slurm_->Writes();
  EXPECT_EQ(std::vector<std::string>(writes.begin() + static_cast<long>(writes_before), writes.end()),
            std::vector<std::string>{})
      << "Slurm asked for the node itself: no DRAIN (it would requeue the job), no POWER_UP";
  EXPECT_TRUE(slurm_->Requeued().empty());
  EXPECT_EQ(slurm_->State("node1"), "ALLOCATED");
  EXPECT_TRUE(K8sFenced(Node("node1")));
}

TEST_F(PowerSaveUnitTest, AnOperatorsReclaimPowersTheNodeUpAfterThePodsLeft) {
  AddNode("node1");
  PowerLend("node1", "p1");
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return slurm_->State("node1").find("POWERING_UP") != std::string::npos; }));
  EXPECT_TRUE(PodGone("p1"));
  EXPECT_EQ(slurm_->Writes().back(), "POWER_UP node1 ");
  ASSERT_TRUE(StepUntil([&] { return ResumeCommandRan("node1"); }));
  slurm_->RegisterRebooted("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; }));
  EXPECT_EQ(LeaseOn("node1").requested_by, "operator");
  EXPECT_EQ(slurm_->State("node1"), "IDLE");
  // The run's outcome is reported by the reconcile that finds it finished.
  EXPECT_TRUE(StepUntil([&] { return Events("node1", "ResumeCommand").size() == 1; }));
  EXPECT_EQ(Events("node1", "ResumeCommand").size(), 1u);
}

// The resume command runs in the background: a slow one (an ssh to a node that answers late)
// holds up neither this reconcile nor the other nodes', is never started twice at once, and its
// outcome is reported when it ends.
TEST_F(PowerSaveUnitTest, ASlowResumeCommandDoesNotHoldUpTheReconcile) {
  const std::string release = marker_ + "-release";
  std::remove(release.c_str());
  opts_.resume_command = {"sh", "-c",
                          "echo run >> '" + marker_ + "-{node}'; until [ -e '" + release +
                              "' ]; do sleep 0.02; done; echo slow >&2; exit 3"};
  opts_.resume_timeout = std::chrono::seconds(120);
  opts_.resume_retry = std::chrono::seconds(0);  // due again at once: only the run in flight stops a second one
  AddNode("node1");
  PowerLend("node1", "p1");
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return slurm_->State("node1").find("POWERING_UP") != std::string::npos; }));
  ASSERT_TRUE(StepUntil([&] { return ResumeCommandRan("node1"); }));
  // The command is still running (it waits for `release`), yet reconciles go on.
  for (int i = 0; i < 5; ++i) Step();
  EXPECT_EQ(PhaseOf("node1"), Phase::kReclaimUnfencing);
  EXPECT_TRUE(Events("node1", "ResumeCommand").empty());
  EXPECT_TRUE(Events("node1", "ResumeCommandFailed").empty()) << Events("node1", "ResumeCommandFailed")[0];
  std::ifstream runs(marker_ + "-node1");
  std::string all((std::istreambuf_iterator<char>(runs)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "run\n") << "started again while the first run was in flight";
  std::ofstream(release).put('x');
  ASSERT_TRUE(StepUntil([&] { return !Events("node1", "ResumeCommandFailed").empty(); }));
  const std::string note = Events("node1", "ResumeCommandFailed")[0];
  EXPECT_NE(note.find("exit 3: slow"), std::string::npos) << note;
  EXPECT_NE(note.find("sh -c"), std::string::npos) << note;
  bridge_.reset();  // runs started after the release end at once; none is left waiting for it
  std::remove(release.c_str());
}

// A stopping bridge kills a resume command still running rather than waiting up to
// --resume-timeout for it (longer than Kubernetes' 30 s grace period). Were it waited for, the
// reset below would block for the 600 s here and ctest's timeout would fail the test.
TEST_F(PowerSaveUnitTest, AStoppingBridgeKillsItsRunningResumeCommand) {
  opts_.resume_command = {"sh", "-c", "echo run >> '" + marker_ + "-{node}'; exec sleep 600"};
  opts_.resume_timeout = std::chrono::seconds(600);
  AddNode("node1");
  PowerLend("node1", "p1");
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return ResumeCommandRan("node1"); }));
  bridge_.reset();
  EXPECT_TRUE(ResumeCommandRan("node1"));
}

TEST_F(PowerSaveUnitTest, AResumeProgramRequestIsRecordedAsSlurmsDemand) {
  AddNode("node1");
  PowerLend("node1", "p1");
  RequestReclaim("node1", kResumeProgramRequest);  // what `kgpu slurm-bridge hook resume` writes
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kReclaimUnfencing; }));
  EXPECT_EQ(LeaseOn("node1").requested_by, "slurm-resume");
  const auto started = Events("node1", "ReclaimStarted");
  ASSERT_EQ(started.size(), 1u);
  EXPECT_NE(started[0].find("Slurm asked for it back"), std::string::npos) << started[0];
}

TEST_F(PowerSaveUnitTest, ACancelledLendWaitsForTheJobAndThePowerDownThenPowersUp) {
  AddNode("node1");
  auto job = slurm_->StartJob({"node1"});
  ASSERT_TRUE(job.ok());
  PendingGpuPod("p1");
  ASSERT_TRUE(StepUntil([&] { return slurm_->State("node1") == "ALLOCATED+DRAIN+POWER_DOWN"; }))
      << slurm_->State("node1");
  RequestReclaim("node1");                                   // cancel: 22.05 cannot undo POWER_DOWN_ASAP
  ASSERT_LT(api_->Delete("pods", "infer", "p1").code, 300);  // and the demand is gone (no lend again)
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kReclaimUnfencing; }));
  for (int i = 0; i < 3; ++i) Step();
  EXPECT_EQ(PhaseOf("node1"), Phase::kReclaimUnfencing);
  EXPECT_TRUE(slurm_->Ended().empty()) << "the job ended before the test ended it";
  slurm_->EndJob(*job, /*completing=*/false);
  FinishPowerDownThenRejoin("node1");
  EXPECT_TRUE(K8sFenced(Node("node1")));
  EXPECT_EQ(Events("node1", "LendCancelled").size(), 1u);
}

TEST_F(PowerSaveUnitTest, AnAdminDrainOfALentNodeKeepsItsReasonThroughTheReclaim) {
  AddNode("node1");
  PowerLend("node1", "p1");
  ASSERT_TRUE(slurm_->AdminDrain("node1", "maint: bad DIMM").ok());  // IDLE+DRAIN+POWERED_DOWN
  Step();
  EXPECT_TRUE(LeaseOn("node1").admin_drained);
  RequestReclaim("node1");
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kSlurm; })) << PhaseName(PhaseOf("node1"));
  EXPECT_TRUE(PodGone("p1"));
  // No POWER_UP: 22.05 would clear the admin's reason. The node goes back to Slurm powered down
  // and drained for the admin, Kubernetes fenced.
  EXPECT_EQ(slurm_->Reason("node1"), "maint: bad DIMM");
  EXPECT_EQ(slurm_->State("node1"), "IDLE+DRAIN+POWERED_DOWN");
  for (const auto& w : slurm_->Writes()) EXPECT_NE(w.rfind("POWER_UP", 0), 0u) << w;
  EXPECT_TRUE(K8sFenced(Node("node1")));
  EXPECT_EQ(Events("node1", "ReclaimedAdminDrain").size(), 1u);
  // The admin resumes and powers it up later: Kubernetes is fenced and empty, the resume command
  // lets slurmd register.
  ASSERT_TRUE(slurm_->AdminResume("node1").ok());
  ASSERT_TRUE(slurm_->PowerUp("node1", "").ok());
  ASSERT_TRUE(StepUntil([&] { return ResumeCommandRan("node1"); })) << slurm_->State("node1");
}

TEST_F(PowerSaveUnitTest, APowerDownWhoseLeaseIsLostIsBroughtBack) {
  AddNode("node1");
  PendingGpuPod("p1");
  ASSERT_TRUE(StepUntil([&] { return slurm_->State("node1") == "IDLE+DRAIN+POWER_DOWN"; })) << slurm_->State("node1");
  ASSERT_LT(api_->Delete("pods", "infer", "p1").code, 300);
  json n = Node("node1");
  n["metadata"]["annotations"].erase(kLeaseAnnotation);  // the lease lost (edited by hand)
  ASSERT_EQ(api_->Update("nodes", "", n).code, 200);
  // Re-adopted as Slurm's; our pending power-down is not merely undrained (22.05 would leave it
  // pending with no owner) but taken through R3.
  ASSERT_TRUE(StepUntil([&] { return PhaseOf("node1") == Phase::kReclaimUnfencing; })) << PhaseName(PhaseOf("node1"));
  FinishPowerDownThenRejoin("node1");
}

// ------------------------------------------------------------------ the REST backend itself

// The REST backend reads what the CLI backend reads (the same SlurmNode and SlurmJob values, as
// FakeSlurm parses its scontrol/squeue text), and its writes keep the same guard.
TEST(RestSlurmClient, ReadsWhatTheCliBackendReadsAndKeepsTheGuard) {
  testing::FakeSlurm slurm;
  slurm.AddNode("n1", 4);
  slurm.AddNode("n2", 4);
  ASSERT_TRUE(slurm.StartJob({"n1", "n2"}, 2000000000, 2).ok());
  slurm.SubmitPending(3, "Resources");
  slurm.SetPartitions("n1", {"batch", "debug"});
  slurm.SetFeatures("n1", {"a100", "ib"});
  slurm.Submit({.node_count = 2,
                .required = {"n1"},
                .excluded = {"n2"},
                .features = "a100|h100",
                .gres = "gres:gpu:a100:2",
                .partition = "batch,debug"});
  ASSERT_TRUE(slurm.AdminDrain("n2", "maint: bad DIMM").ok());
  testing::FakeSlurmrestd restd(slurm);
  ASSERT_TRUE(restd.ok());
  RestSlurmClient rest(
      RestOptions{.url = restd.Url(), .user = "", .token = "", .token_file = "", .timeout = std::chrono::seconds(5)});
  auto nodes = rest.Nodes();
  auto want = slurm.Nodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(nodes->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const SlurmNode &a = (*nodes)[i], &b = (*want)[i];
    EXPECT_EQ(std::tie(a.name, a.state, a.base, a.flags, a.reason, a.reason_user, a.reason_time, a.gres, a.cpu_alloc,
                       a.cpu_total, a.partitions, a.features),
              std::tie(b.name, b.state, b.base, b.flags, b.reason, b.reason_user, b.reason_time, b.gres, b.cpu_alloc,
                       b.cpu_total, b.partitions, b.features))
        << a.state << " / " << b.state;
  }
  EXPECT_EQ((*nodes)[1].state, "MIXED+DRAIN");
  auto jobs = rest.Jobs();
  auto want_jobs = slurm.Jobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const SlurmJob &a = (*jobs)[i], &b = (*want_jobs)[i];
    EXPECT_EQ(std::tie(a.id, a.state, a.nodes, a.node_count, a.reason, a.end_time, a.partition, a.submit_time,
                       a.required_nodes, a.excluded_nodes, a.features, a.gres),
              std::tie(b.id, b.state, b.nodes, b.node_count, b.reason, b.end_time, b.partition, b.submit_time,
                       b.required_nodes, b.excluded_nodes, b.features, b.gres))
        << a.id;
  }
  EXPECT_EQ((*nodes)[0].partitions, (std::set<std::string>{"batch", "debug"}));
  EXPECT_EQ((*nodes)[0].features, (std::set<std::string>{"a100", "ib"}));
  const SlurmJob& asks = (*jobs)[2];
  EXPECT_EQ(asks.required_nodes, std::vector<std::string>{"n1"});
  EXPECT_EQ(asks.excluded_nodes, std::vector<std::string>{"n2"});
  EXPECT_EQ(asks.features, "a100|h100");
  EXPECT_EQ(asks.gres, "gres:gpu:a100:2");
  EXPECT_EQ(asks.partition, "batch,debug");
  EXPECT_TRUE((*jobs)[0].required_nodes.empty() && (*jobs)[0].features.empty() && (*jobs)[0].gres.empty());
  auto on = rest.JobsOnNode("n2");
  ASSERT_TRUE(on.ok());
  ASSERT_EQ(on->size(), 1u);
  EXPECT_EQ(on->front().id, "1");
  // Unknown node: NotFound, although slurmrestd answers 200.
  auto none = rest.Node("n9");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_NE(std::string(none.status().message()).find("Failure to query node n9"), std::string::npos) << none.status();
  // The guard: an admin's drain is neither overwritten nor cleared; ours comes and goes.
  EXPECT_EQ(rest.Drain("n2", "kgpu-lend:op-1", "kgpu-lend:").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rest.Undrain("n2", "kgpu-lend:").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(slurm.Reason("n2"), "maint: bad DIMM");
  auto drained = rest.Drain("n1", "kgpu-lend:op-1", "kgpu-lend:");
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->state, "MIXED+DRAIN");
  EXPECT_EQ(drained->reason, "kgpu-lend:op-1");
  auto undrained = rest.Undrain("n1", "kgpu-lend:");
  ASSERT_TRUE(undrained.ok()) << undrained.status();
  EXPECT_EQ(undrained->state, "MIXED");
  EXPECT_EQ(slurm.Writes(),
            (std::vector<std::string>{"admin DRAIN n2 maint: bad DIMM", "DRAIN n1 kgpu-lend:op-1", "UNDRAIN n1 "}));
  // POWER_DOWN_ASAP is two flags slurmrestd cannot set in one update: not offered.
  EXPECT_EQ(rest.PowerDown("n1", "kgpu-lend:op-2", "kgpu-lend:").status().code(), absl::StatusCode::kUnimplemented);
}

// Each failure says what failed and how to fix it, in the classes the bridge acts on:
// Unavailable (freeze), Unauthenticated, FailedPrecondition (an older slurmrestd).
TEST(RestSlurmClient, FailuresAreClassifiedAndSayTheFix) {
  testing::FakeSlurm slurm;
  slurm.AddNode("n1");
  const std::string socket = "/tmp/kgpu-restd-" + std::to_string(::getpid()) + ".sock";  // well under sun_path's 108
  std::remove(socket.c_str());
  testing::FakeSlurmrestd restd(slurm, "jwt-1", socket);
  ASSERT_TRUE(restd.ok());
  RestOptions o;
  o.url = restd.Url();
  EXPECT_EQ(o.url.rfind("unix:", 0), 0u);
  // No token: 401.
  auto denied = RestSlurmClient(o).Nodes();
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(std::string(denied.status().message()).find("HTTP 401 Authentication failure (a JWT from `scontrol token`"),
            std::string::npos)
      << denied.status();
  // The token from a file, re-read each call, over the unix socket.
  const std::string token_file = ::testing::TempDir() + "kgpu-jwt-" + std::to_string(::getpid());
  std::ofstream(token_file) << "jwt-1\n";
  o.user = "slurm";
  o.token_file = token_file;
  RestSlurmClient rest(o);
  auto nodes = rest.Nodes();
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(nodes->at(0).name, "n1");
  // slurmctld down: Unavailable with its message.
  slurm.SetReachable(false);
  auto down = rest.Jobs();
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable) << down.status();
  EXPECT_NE(std::string(down.status().message())
                .find("jobs: Unable to contact slurm controller (connect failure) (slurm_load_node() failed) [1800]"),
            std::string::npos)
      << down.status();
  slurm.SetReachable(true);
  // slurmrestd itself gone: Unavailable, naming where it was looked for.
  RestOptions gone = o;
  gone.url = "unix:" + socket + ".missing";
  auto nobody = RestSlurmClient(gone).Nodes();
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(nobody.status().message()).find("is slurmrestd running at unix:"), std::string::npos)
      << nobody.status();
  // A slurmrestd without v0.0.39 (Slurm 22.05): 404, and the fix.
  httplib::Server old;
  const int port = old.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  auto t = ListenOnThread(old);
  RestOptions o22;
  o22.url = "http://127.0.0.1:" + std::to_string(port);
  auto v38 = RestSlurmClient(o22).Nodes();
  old.stop();
  t.join();
  EXPECT_EQ(v38.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(v38.status().message()).find("does not serve v0.0.39 (Slurm 23.02 or later"), std::string::npos)
      << v38.status();
  std::remove(token_file.c_str());
  std::remove(socket.c_str());
}

TEST(RestSlurmClient, MalformedAnswersAreErrorsNamingWhatWasWrong) {
  auto nodes = [](const std::string& body) { return std::string(ParseRestNodes(body).status().message()); };
  EXPECT_EQ(nodes("<html>"), "slurmrestd nodes: the answer is not JSON");
  EXPECT_EQ(nodes("{}"), "slurmrestd nodes: the answer has no \"nodes\" array");
  EXPECT_EQ(nodes(R"({"nodes":[{"name":"n1","state":"IDLE"}]})"),
            "slurmrestd nodes: node n1: \"state\" is not a non-empty array of strings");
  EXPECT_EQ(nodes(R"({"nodes":[{"state":["IDLE"]}]})"), "slurmrestd nodes: node 0 has no name");
  EXPECT_EQ(nodes(R"({"nodes":[{"name":"n1","state":["IDLE"],"cpus":"4"}]})"),
            "slurmrestd nodes: node n1: \"cpus\" is not an integer");
  auto jobs = [](const std::string& body) { return std::string(ParseRestJobs(body).status().message()); };
  EXPECT_EQ(jobs(R"({"jobs":[{"job_id":7,"job_state":"RUNNING","nodes":"n[1-"}]})")
                .rfind("slurmrestd jobs: job 7: hostlist 'n[1-'", 0),
            0u);
  EXPECT_EQ(jobs(R"({"jobs":[{"job_state":"RUNNING"}]})"), "slurmrestd jobs: job 0 has no job_id");
  // Ended jobs are left out; *_NO_VAL objects and plain integers both read.
  auto ok = ParseRestJobs(R"({"jobs":[{"job_id":1,"job_state":"COMPLETED","nodes":"n1"},
      {"job_id":2,"job_state":"RUNNING","nodes":"n[1-2]","node_count":{"set":true,"infinite":false,"number":2},"end_time":0},
      {"job_id":3,"job_state":"PENDING","nodes":"","node_count":4,"state_reason":"Priority","submit_time":1700000000}]})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].nodes, (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ((*ok)[0].node_count, 2);
  EXPECT_FALSE((*ok)[0].end_time.has_value());
  EXPECT_EQ((*ok)[1].node_count, 4);
  EXPECT_EQ((*ok)[1].reason, "Priority");
  EXPECT_EQ((*ok)[1].submit_time, 1700000000);
}

// ------------------------------------------------------------------ --resume-command's words

TEST(SplitCommandLine, SplitsAsAShellWouldWithoutExpandingAnything) {
  auto words = [](std::string_view line) {
    auto w = SplitCommandLine(line, "--resume-command");
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *w : std::vector<std::string>{};
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(words("ssh {node} /usr/local/sbin/slurmd-rejoin"), (V{"ssh", "{node}", "/usr/local/sbin/slurmd-rejoin"}));
  EXPECT_EQ(words("  ssh\t-o 'ConnectTimeout 5'  {node} "), (V{"ssh", "-o", "ConnectTimeout 5", "{node}"}));
  EXPECT_EQ(words("sh -c 'systemctl restart slurmd && echo ok | logger'"),
            (V{"sh", "-c", "systemctl restart slurmd && echo ok | logger"}));
  EXPECT_EQ(words(R"(echo "a \"b\" \$HOME \\ \x" it\'s '' "")"), (V{"echo", R"(a "b" $HOME \ \x)", "it's", "", ""}));
  EXPECT_EQ(words("a\\\nb c"), (V{"ab", "c"})) << "a backslash-newline continues the line";
  EXPECT_EQ(words("x 'it'\\''s'"), (V{"x", "it's"}));
  // CommandLine, which writes commands into Events and logs, reads back as the same words.
  const V odd = {"sh",    "-c",   "a|b; c && $d `e` (f) <g> 'h' \"i\" \\j", "", "tab\there", "new\nline", "#x", "~y",
                 "*.pid", "a[1]?"};
  EXPECT_EQ(words(CommandLine(odd)), odd) << CommandLine(odd);
}

TEST(SplitCommandLine, RefusesWhatOnlyAShellWouldDoAndSaysHow) {
  auto error = [](std::string_view line) {
    auto w = SplitCommandLine(line, "--resume-command");
    EXPECT_FALSE(w.ok()) << line;
    return w.ok() ? std::string() : std::string(w.status().message());
  };
  auto words_ok = [](std::string_view line) {
    auto w = SplitCommandLine(line, "--resume-command");
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? w->size() : 0u;
  };
  EXPECT_EQ(error("ssh {node} 'rejoin"),
            "--resume-command: 'ssh {node} 'rejoin' has a ' at offset 11 that is never closed");
  EXPECT_NE(error(R"(echo "x)").find("has a \" at offset 5 that is never closed"), std::string::npos);
  EXPECT_NE(error("echo x\\").find("ends in a backslash"), std::string::npos);
  const std::string pipe = error("ssh {node} rejoin | logger");
  EXPECT_NE(pipe.find("has an unquoted | at offset 18"), std::string::npos) << pipe;
  EXPECT_NE(pipe.find("run sh -c '...'"), std::string::npos) << pipe;
  EXPECT_NE(error("ssh $NODE").find("unquoted $"), std::string::npos);
  EXPECT_NE(error(R"(echo "$HOME")").find("inside \"...\""), std::string::npos);
  EXPECT_EQ(error("   "), "--resume-command: empty command");
  EXPECT_NE(error("ssh {node} rejoin\nrm -rf /").find("has a line break at offset 17: one command only"),
            std::string::npos);
  EXPECT_EQ(words_ok("ssh {node} rejoin\n"), 3u) << "a trailing line break is a blank";
  EXPECT_NE(error("ssh {node} rejoin #why")
                .find("unquoted # at the start of a word (offset 18): a shell would read a comment"),
            std::string::npos);
  EXPECT_NE(error("~/bin/rejoin {node}").find("unquoted ~ at the start of a word"), std::string::npos);
  EXPECT_NE(error("rm /var/run/*.pid").find("has an unquoted * at offset 12"), std::string::npos);
  EXPECT_EQ(words_ok("echo a#b 'x*y' \\~"), 4u) << "# and ~ inside a word, quoted globs, escaped ~";
  EXPECT_NE(error(std::string("a\0b", 3)).find("has a NUL byte at offset 1"), std::string::npos);
  EXPECT_EQ(error("a\x1b[2J 'b").find('\x1b'), std::string::npos) << "echoed raw";
}

}  // namespace
}  // namespace kgpu::slurm
