// Unit tests of the placement engine (src/sched/): FGD's fragmentation measure on hand-computed
// nodes, each policy's choice on tiny clusters whose right answer is known, MIG placement,
// CPU/memory/pod-count fit, the trace replay on small synthetic traces (golden KPI, determinism,
// capacity invariants) and the CSV reader's errors.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sched/engine.h"
#include "sched/frag.h"
#include "sched/policy.h"
#include "sched/replay.h"
#include "sched/rng.h"
#include "sched/trace.h"

namespace kgpu::sched {
namespace {

constexpr uint64_t kAnyModel = ~uint64_t{0};

NodeSpec Node(const std::string& name, int64_t cpu, int64_t memory, int gpus, const std::string& model = "A10") {
  NodeSpec n;
  n.name = name;
  n.cpu_milli = cpu;
  n.memory_mib = memory;
  for (int i = 0; i < gpus; ++i) {
    GpuSpec g;
    g.model = model;
    g.memory_mib = 24576;
    n.gpus.push_back(g);
  }
  return n;
}

PodRequest Pod(const std::string& name, int64_t cpu, int64_t memory, int num_gpus, int milli) {
  PodRequest p;
  p.name = name;
  p.cpu_milli = cpu;
  p.memory_mib = memory;
  p.num_gpus = num_gpus;
  p.gpu_milli = milli;
  return p;
}

Shape GpuShape(int64_t cpu, int num_gpus, int milli, double weight, uint64_t models = kAnyModel) {
  Shape s;
  s.cpu = cpu;
  s.num_gpus = num_gpus;
  s.milli = milli;
  s.models = models;
  s.weight = weight;
  return s;
}

std::unique_ptr<Policy> MustPolicy(const std::string& name, std::vector<Shape> shapes = {}, uint64_t seed = 42) {
  PolicyOptions o;
  o.shapes = std::move(shapes);
  o.seed = seed;
  auto p = MakePolicy(name, o);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

// Binds a pod at an exact placement (to prepare a node's state by hand).
void BindAt(Engine& e, const PodRequest& pod, const std::string& node, std::vector<int> gpus) {
  Placement p;
  p.node = e.cluster().FindNode(node);
  p.gpus = std::move(gpus);
  ASSERT_TRUE(e.Bind(pod, p).ok()) << pod.name;
}

std::string NodeOf(const Engine& e, const Placement& p) {
  return e.cluster().node(p.node).name;
}

// Each feasible node's score for a pod, by node name.
std::map<std::string, double> ScoresByNode(Engine& e, const PodRequest& pod) {
  std::map<std::string, double> out;
  auto s = e.Scores(pod);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return out;
  for (const auto& [id, c] : *s) out[e.cluster().node(id).name] = c.score;
  return out;
}

// ------------------------------------------------------------------ fragmentation
// One node, 4 GPUs with free milli {1000, 500, 200, 0} (total 1700), and the workload
//   A: 1 GPU x 500 milli, 4000 mCPU, weight 0.5
//   B: 2 whole GPUs,      0 mCPU,    weight 0.3
//   C: CPU-only,                     weight 0.2
// By the paper's definition (the free milli a task of the shape could not use):
//   A fits (2 GPUs have >= 500): unusable = 1700 - (1000 + 500) = 200  -> 0.5 * 200  = 100
//   B does not fit (one fully free GPU): all 1700                      -> 0.3 * 1700 = 510
//   C uses no GPU: all 1700                                            -> 0.2 * 1700 = 340
//   F = 950.
class FragTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(engine_.AddNode(Node("n", 32000, 262144, 4)).ok());
    ASSERT_TRUE(engine_.AddNode(Node("cpu-poor", 2000, 262144, 4)).ok());
    for (const std::string node : {"n", "cpu-poor"}) {
      BindAt(engine_, Pod(node + "-s500", 0, 0, 1, 500), node, {1});
      BindAt(engine_, Pod(node + "-s800", 0, 0, 1, 800), node, {2});
      BindAt(engine_, Pod(node + "-w", 0, 0, 1, 1000), node, {3});
    }
    model_.SetShapes({GpuShape(4000, 1, 500, 0.5), GpuShape(0, 2, 1000, 0.3), Shape{0, 0, 0, kAnyModel, 0.2}});
  }
  const NodeState& N(const std::string& name) const { return engine_.cluster().node(engine_.cluster().FindNode(name)); }
  Engine engine_{MustPolicy("bestfit"), 1};
  FragModel model_;
};

TEST_F(FragTest, HandComputedNode) {
  const auto& n = N("n");
  ASSERT_EQ(n.FreeGpuMilli(), 1700);
  EXPECT_DOUBLE_EQ(model_.NodeFrag(n), 950.0);
  // Asked twice (the second from the memo): the same value.
  EXPECT_DOUBLE_EQ(model_.NodeFrag(n), 950.0);
}

TEST_F(FragTest, TooLittleCpuMakesTheShapeUnfit) {
  // A needs 4000 mCPU and the node has 2000 free: A counts all 1700 -> 850 + 510 + 340.
  EXPECT_DOUBLE_EQ(model_.NodeFrag(N("cpu-poor")), 1700.0);
}

TEST_F(FragTest, AfterAPlacement) {
  // 500 taken from GPU 0: free {500, 500, 200, 0}, total 1200.
  //   A fits on the two 500s: 1200 - 1000 = 200 -> 100; B: 0.3 * 1200 = 360; C: 0.2 * 1200 = 240.
  const int take[4] = {500, 0, 0, 0};
  EXPECT_DOUBLE_EQ(model_.NodeFragAfter(N("n"), 0, take), 700.0);
  // Taking 2500 mCPU as well leaves 29500: A still fits, same value.
  EXPECT_DOUBLE_EQ(model_.NodeFragAfter(N("n"), 2500, take), 700.0);
  // Taking 29000 mCPU leaves 3000 < 4000: A no longer fits -> 600 + 360 + 240.
  EXPECT_DOUBLE_EQ(model_.NodeFragAfter(N("n"), 29000, take), 1200.0);
}

TEST_F(FragTest, ModelConstraintAndIdleNode) {
  // A restricted to a model the node does not have counts all free milli (as if it did not fit).
  const uint64_t other = uint64_t{1} << 5;
  FragModel m;
  m.SetShapes({GpuShape(4000, 1, 500, 0.5, other), GpuShape(0, 2, 1000, 0.3), Shape{0, 0, 0, kAnyModel, 0.2}});
  EXPECT_DOUBLE_EQ(m.NodeFrag(N("n")), 1700.0);
  // An idle node of 4 GPUs (4000 free): A and B fit and use everything; only C counts: 800.
  Engine e(MustPolicy("bestfit"), 1);
  ASSERT_TRUE(e.AddNode(Node("idle", 32000, 262144, 4)).ok());
  EXPECT_DOUBLE_EQ(model_.NodeFrag(e.cluster().node(0)), 800.0);
  // A node without free GPU milli has no fragmentation.
  Engine full(MustPolicy("bestfit"), 1);
  ASSERT_TRUE(full.AddNode(Node("full", 32000, 262144, 1)).ok());
  BindAt(full, Pod("w", 0, 0, 1, 1000), "full", {0});
  EXPECT_DOUBLE_EQ(model_.NodeFrag(full.cluster().node(0)), 0.0);
}

TEST(TypicalShapes, MostFrequentCoveringTheShare) {
  Engine e(MustPolicy("bestfit"), 1);
  ASSERT_TRUE(e.AddNode(Node("n", 64000, 262144, 2)).ok());
  std::vector<Request> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(*e.cluster().Compile(Pod("s" + std::to_string(i), 1000, 0, 1, 500)));
  reqs.push_back(*e.cluster().Compile(Pod("w", 2000, 0, 1, 1000)));
  // 95 %: both shapes (3/4 = 75 % is not enough), weights 0.75 and 0.25.
  auto all = TypicalShapes(reqs, 0.95);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].milli, 500);
  EXPECT_EQ(all[0].cpu, 1000);
  EXPECT_DOUBLE_EQ(all[0].weight, 0.75);
  EXPECT_EQ(all[1].milli, 1000);
  EXPECT_DOUBLE_EQ(all[1].weight, 0.25);
  // 70 %: the first shape alone, renormalised to 1.
  auto top = TypicalShapes(reqs, 0.7);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_DOUBLE_EQ(top[0].weight, 1.0);
}

TEST(ShapeEstimator, DecayFollowsTheRecentMix) {
  ShapeEstimator est(/*half_life=*/10, /*coverage=*/1.0, /*max_shapes=*/10);
  const Shape a = GpuShape(1000, 1, 500, 0), b = GpuShape(1000, 1, 1000, 0);
  for (int i = 0; i < 10; ++i) est.Observe(a);
  for (int i = 0; i < 10; ++i) est.Observe(b);
  // With a half-life of 10 arrivals, the older 10 weigh half as much as the newer 10: a : b = 1 : 2.
  auto snap = est.Snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].milli, 1000);
  EXPECT_NEAR(snap[0].weight, 2.0 / 3.0, 1e-9);
  EXPECT_NEAR(snap[1].weight, 1.0 / 3.0, 1e-9);
  EXPECT_EQ(est.observed(), 20u);
}

// ------------------------------------------------------------------ policies
// Two 8-GPU nodes; "used" has 400 milli taken on GPU 3. A 500-milli share (no CPU) arrives.
class PolicyChoice : public ::testing::Test {
 protected:
  Engine Make(const std::string& policy, std::vector<Shape> shapes = {}) {
    Engine e(MustPolicy(policy, std::move(shapes)), 7);
    EXPECT_TRUE(e.AddNode(Node("idle", 64000, 262144, 8)).ok());
    EXPECT_TRUE(e.AddNode(Node("used", 64000, 262144, 8)).ok());
    BindAt(e, Pod("prior", 0, 0, 1, 400), "used", {3});
    return e;
  }
};

TEST_F(PolicyChoice, BestFitTakesTheTightestNodeAndGpu) {
  // Scores: idle int((1 - .5 - .5 * 7500/8000) * 100) = 3, used (7100 left) = 5.
  auto e = Make("bestfit");
  auto scores = e.Scores(Pod("s", 0, 0, 1, 500));
  ASSERT_TRUE(scores.ok());
  ASSERT_EQ(scores->size(), 2u);
  std::map<std::string, double> by_node;
  for (const auto& [id, c] : *scores) by_node[e.cluster().node(id).name] = c.score;
  EXPECT_EQ(by_node["idle"], 3);
  EXPECT_EQ(by_node["used"], 5);
  auto p = e.Schedule(Pod("s", 0, 0, 1, 500));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(NodeOf(e, *p), "used");
  EXPECT_EQ(p->gpus, std::vector<int>{3});
  EXPECT_EQ(p->milli_each, 500);
  EXPECT_EQ(e.cluster().node(p->node).gpus[3].free_milli, 100);
}

TEST_F(PolicyChoice, PackingPrefersASharedGpuThenAUsedNode) {
  auto e = Make("packing");
  auto p = e.Schedule(Pod("s", 0, 0, 1, 500));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(NodeOf(e, *p), "used");
  EXPECT_EQ(p->gpus, std::vector<int>{3});
  // A whole GPU: a free GPU on the used node (score 49) beats an idle node (25); the lowest index.
  auto w = e.Schedule(Pod("w", 0, 0, 1, 1000));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(NodeOf(e, *w), "used");
  EXPECT_EQ(w->gpus, std::vector<int>{0});
  EXPECT_EQ(w->milli_each, 1000);
}

TEST_F(PolicyChoice, SpreadTakesTheEmptiestNodeAndGpu) {
  auto e = Make("spread");
  auto p = e.Schedule(Pod("s", 0, 0, 1, 500));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(NodeOf(e, *p), "idle");
  EXPECT_EQ(p->gpus, std::vector<int>{0});
  // Next: "used" has 7600 free, "idle" now 7500: spread goes to "used", on a fully free GPU.
  auto q = e.Schedule(Pod("t", 0, 0, 1, 500));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(NodeOf(e, *q), "used");
  EXPECT_EQ(q->gpus, std::vector<int>{0});
}

TEST(RandomPolicy, OnlyFeasibleNodesAndBothOverSeeds) {
  std::map<std::string, int> chosen;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Engine e(MustPolicy("random", {}, seed), seed);
    ASSERT_TRUE(e.AddNode(Node("a", 64000, 262144, 2)).ok());
    ASSERT_TRUE(e.AddNode(Node("b", 64000, 262144, 2)).ok());
    ASSERT_TRUE(e.AddNode(Node("tiny", 500, 262144, 2)).ok());  // too little CPU for the pod
    auto p = e.Schedule(Pod("s", 4000, 1024, 1, 300));
    ASSERT_TRUE(p.ok());
    ++chosen[NodeOf(e, *p)];
    // The same seed gives the same choice.
    Engine again(MustPolicy("random", {}, seed), seed);
    ASSERT_TRUE(again.AddNode(Node("a", 64000, 262144, 2)).ok());
    ASSERT_TRUE(again.AddNode(Node("b", 64000, 262144, 2)).ok());
    ASSERT_TRUE(again.AddNode(Node("tiny", 500, 262144, 2)).ok());
    auto q = again.Schedule(Pod("s", 4000, 1024, 1, 300));
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->node, p->node);
    EXPECT_EQ(q->gpus, p->gpus);
  }
  EXPECT_EQ(chosen.count("tiny"), 0u);
  EXPECT_GT(chosen["a"], 0);
  EXPECT_GT(chosen["b"], 0);
  EXPECT_EQ(chosen["a"] + chosen["b"], 40);
}

// Two 2-GPU nodes: "idle" and "half" (500 taken on GPU 0); the workload is whole single GPUs.
// A 500 share on "idle" makes 500 unusable (+500); on "half" GPU 0 it frees the node of its
// fragment (-500), on "half" GPU 1 it leaves no whole GPU (+500).
class FragPolicies : public ::testing::Test {
 protected:
  Engine Make(const std::string& policy) {
    Engine e(MustPolicy(policy, {GpuShape(0, 1, 1000, 1.0)}), 3);
    EXPECT_TRUE(e.AddNode(Node("idle", 64000, 262144, 2)).ok());
    EXPECT_TRUE(e.AddNode(Node("half", 64000, 262144, 2)).ok());
    BindAt(e, Pod("prior", 0, 0, 1, 500), "half", {0});
    return e;
  }
};

TEST_F(FragPolicies, FgdScoresAreTheSigmoidOfTheFragmentationChange) {
  auto e = Make("fgd");
  auto s = ScoresByNode(e, Pod("s", 0, 0, 1, 500));
  EXPECT_EQ(s["idle"], 37);  // int(sigmoid(-0.5) * 100)
  EXPECT_EQ(s["half"], 62);  // int(sigmoid(+0.5) * 100)
  auto p = e.Schedule(Pod("s", 0, 0, 1, 500));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(NodeOf(e, *p), "half");
  EXPECT_EQ(p->gpus, std::vector<int>{0});
}

TEST_F(FragPolicies, OursGivenTheDistributionUsesExactChanges) {
  auto e = Make("ours");
  auto s = ScoresByNode(e, Pod("s", 0, 0, 1, 500));
  EXPECT_DOUBLE_EQ(s["idle"], -500);
  EXPECT_DOUBLE_EQ(s["half"], 500);
  auto p = e.Schedule(Pod("s", 0, 0, 1, 500));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(NodeOf(e, *p), "half");
  EXPECT_EQ(p->gpus, std::vector<int>{0});
}

TEST(OursPolicy, StrandedCapacityAvoidsTheCpuPoorNode) {
  // The workload: 1 GPU x 500 milli with 2000 mCPU, i.e. 4 mCPU per milli-GPU.
  // "lean" (6000 mCPU, 2 GPUs) can carry only 1500 of its 2000 free milli: 500 stranded. After a
  // pod of 4000 mCPU x 500 milli it has 1500 milli and 2000 mCPU (carries 500): 1000 stranded, a
  // cost of +500, while fragmentation does not change (the shape still fits). On "rich" nothing is
  // stranded before or after: cost 0. Both make the cluster's first 500 leftover, which the balance
  // of leftovers prices alike: (2 * 0 + 1) * 200000 / 4 GPUs.
  Engine e(MustPolicy("ours", {GpuShape(2000, 1, 500, 1.0)}), 5);
  ASSERT_TRUE(e.AddNode(Node("lean", 6000, 262144, 2)).ok());
  ASSERT_TRUE(e.AddNode(Node("rich", 64000, 262144, 2)).ok());
  const PodRequest pod = Pod("p", 4000, 0, 1, 500);
  auto by_node = ScoresByNode(e, pod);
  ASSERT_EQ(by_node.size(), 2u);
  EXPECT_DOUBLE_EQ(by_node["lean"], -500 - 50000);
  EXPECT_DOUBLE_EQ(by_node["rich"], -50000);
  auto p = e.Schedule(pod);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(NodeOf(e, *p), "rich");
  // FGD sees no difference here (both integer scores are int(sigmoid(0) * 100) = 50).
  Engine f(MustPolicy("fgd", {GpuShape(2000, 1, 500, 1.0)}), 5);
  ASSERT_TRUE(f.AddNode(Node("lean", 6000, 262144, 2)).ok());
  ASSERT_TRUE(f.AddNode(Node("rich", 64000, 262144, 2)).ok());
  auto fs = f.Scores(pod);
  ASSERT_TRUE(fs.ok());
  ASSERT_EQ(fs->size(), 2u);
  EXPECT_EQ((*fs)[0].second.score, 50);
  EXPECT_EQ((*fs)[1].second.score, 50);
}

TEST(OursPolicy, BalanceOfLeftoversKeepsSizesTheWorkloadNeeds) {
  // The workload: shares of 300 and of 700 milli, half each (no CPU). Two GPUs already have 300
  // left ("p1", "p2", a 700 on each; their nodes have no CPU left for the pod that arrives), none
  // has 700 left. A 300 arrives: best fit, FGD and the fragmentation alone take "x" (600 left,
  // leaving a third 300), but the 700s to come then each need a GPU of their own; "y" (free) keeps
  // a 700 leftover for one of them.
  //   fragmentation: x 600 -> 300: the 700 shape loses 600 * 0.5 = 300 before, 300 * 0.5 = 150
  //   after: -150; y 1000 -> 700: 0 -> 0.
  //   balance (4 GPUs, every leftover of 300 or more counts fully, W = 1): x turns a 600 (N = 1)
  //   into a 300 (N = 2): (2 * 2 + 1) - (2 * 1 - 1) = 4; y makes the first 700: 2 * 0 + 1 = 1;
  //   each times 200000 / 4 GPUs.
  const std::vector<Shape> shapes = {GpuShape(0, 1, 300, 0.5), GpuShape(0, 1, 700, 0.5)};
  auto setup = [](Engine& e) {
    for (const std::string n : {"p1", "p2"}) ASSERT_TRUE(e.AddNode(Node(n, 8000, 262144, 1)).ok());
    for (const std::string n : {"x", "y"}) ASSERT_TRUE(e.AddNode(Node(n, 64000, 262144, 1)).ok());
    BindAt(e, Pod("seven1", 8000, 0, 1, 700), "p1", {0});
    BindAt(e, Pod("seven2", 8000, 0, 1, 700), "p2", {0});
    BindAt(e, Pod("four", 0, 0, 1, 400), "x", {0});
  };
  Engine e(MustPolicy("ours", shapes), 5);
  setup(e);
  const auto& counts = e.cluster().FreeMilliCounts();
  EXPECT_EQ(counts[300], 2);
  EXPECT_EQ(counts[600], 1);
  EXPECT_EQ(counts[1000], 1);
  const PodRequest pod = Pod("three", 1000, 0, 1, 300);
  auto by_node = ScoresByNode(e, pod);
  ASSERT_EQ(by_node.size(), 2u);  // x and y: p1 and p2 have no CPU left
  EXPECT_DOUBLE_EQ(by_node["x"], -(-150 + 4 * 200000.0 / 4));
  EXPECT_DOUBLE_EQ(by_node["y"], -(0 + 1 * 200000.0 / 4));
  auto p = e.Schedule(pod);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(NodeOf(e, *p), "y");
  EXPECT_EQ(counts[700], 1);
  EXPECT_EQ(counts[1000], 0);
  for (const std::string other : {"bestfit", "fgd"}) {
    SCOPED_TRACE(other);
    Engine f(MustPolicy(other, shapes), 5);
    setup(f);
    auto q = f.Schedule(pod);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(NodeOf(f, *q), "x");
  }
  // A leftover that few arriving pods can use counts in proportion, W = min(1, F / 1 %): with the
  // 300s 0.4 % of the workload, leftovers from 300 to 699 have W = 0.4 and x's balance is
  // 0.4 * 5 - 0.4 * 1 = 1.6; its fragmentation change is -(600 - 300) * 0.996 for the 700s.
  Engine w(MustPolicy("ours", {GpuShape(0, 1, 300, 0.004), GpuShape(0, 1, 700, 0.996)}), 5);
  setup(w);
  by_node = ScoresByNode(w, pod);
  ASSERT_EQ(by_node.size(), 2u);
  EXPECT_NEAR(by_node["x"], -(-300 * 0.996 + 1.6 * 200000.0 / 4), 1e-6);
  EXPECT_NEAR(by_node["y"], -(0 + 1 * 200000.0 / 4), 1e-6);
}

TEST(OursPolicy, OnlineLearnsFromArrivals) {
  auto ours = MustPolicy("ours");
  EXPECT_TRUE(ours->Shapes().empty());
  Engine e(std::move(ours), 5);
  ASSERT_TRUE(e.AddNode(Node("n", 64000, 262144, 4)).ok());
  ASSERT_TRUE(e.Schedule(Pod("a", 1000, 0, 1, 250)).ok());
  ASSERT_TRUE(e.Schedule(Pod("b", 1000, 0, 1, 250)).ok());
  // Observed shapes: one (1000 mCPU, 1 x 250), weight 1; both pods on the same GPU (best fit ties).
  const auto shapes = e.policy().Shapes();
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_EQ(shapes[0].milli, 250);
  EXPECT_EQ(shapes[0].cpu, 1000);
  EXPECT_DOUBLE_EQ(shapes[0].weight, 1.0);
  EXPECT_EQ(e.cluster().FindPod("a")->gpus, e.cluster().FindPod("b")->gpus);
}

TEST(Policies, UnknownNameAndFgdWithoutShapesAreErrors) {
  auto bad = MakePolicy("bestfitt", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bestfit"), std::string::npos) << bad.status();
  auto fgd = MakePolicy("fgd", {});
  EXPECT_FALSE(fgd.ok());
}

// ------------------------------------------------------------------ MIG
TEST(Mig, BestFitInstanceOnTheFullestGpu) {
  for (const std::string policy : {"random", "bestfit", "packing", "spread", "ours"}) {
    SCOPED_TRACE(policy);
    Engine e(MustPolicy(policy), 11);
    NodeSpec n = Node("mig", 64000, 262144, 2, "A100");
    for (auto& g : n.gpus) {
      for (int i = 0; i < 7; ++i) g.mig.push_back(MigInstance{"1g.10gb", 1, 10240, kMilli / 7});
    }
    ASSERT_TRUE(e.AddNode(n).ok());
    PodRequest m = Pod("m0", 1000, 0, 0, 0);
    m.mig_profile = "1g.10gb";
    for (int i = 0; i < 3; ++i) {
      m.name = "prior" + std::to_string(i);
      BindAt(e, m, "mig", {1});
    }
    m.name = "new";
    auto p = e.Schedule(m);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->gpus, std::vector<int>{1});  // 4 free instances against 7
    EXPECT_EQ(p->mig_instance, 3);            // the first free instance
    EXPECT_EQ(p->milli_each, 142);            // 1000 / 7
    EXPECT_EQ(p->memory_mib_each, 10240);
    EXPECT_EQ(e.cluster().node(0).gpus[1].free_milli, 1000 - 4 * 142);
    // A profile the layout does not have, and a milli share on MIG GPUs, do not fit.
    PodRequest big = m;
    big.name = "big";
    big.mig_profile = "3g.40gb";
    auto b = e.Schedule(big);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
    auto share = e.Schedule(Pod("share", 1000, 0, 1, 300));
    EXPECT_EQ(share.status().code(), absl::StatusCode::kResourceExhausted);
    // Releasing gives the instance back.
    ASSERT_TRUE(e.Release("new").ok());
    EXPECT_EQ(e.cluster().node(0).gpus[1].free_milli, 1000 - 3 * 142);
  }
}

// MIG profiles are interned: instances and requests compare ids. A request compiled before any
// node had its profile carries no id and is matched by name.
TEST(Mig, ProfilesCompareByIdAndByNameBeforeAnyNodeHadThem) {
  Cluster c;
  PodRequest early = Pod("early", 0, 0, 0, 0);
  early.mig_profile = "2g.20gb";
  auto before = c.Compile(early);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->mig_profile_id, -1);
  NodeSpec n = Node("mig", 64000, 262144, 1, "A100");
  n.gpus[0].mig = {MigInstance{"1g.10gb", 1, 10240, kMilli / 7}, MigInstance{"2g.20gb", 2, 20480, 2 * kMilli / 7}};
  ASSERT_TRUE(c.AddNode(n, 0).ok());
  EXPECT_TRUE(c.NodeFits(*before, 0));
  auto two = c.Compile(early);
  ASSERT_TRUE(two.ok());
  EXPECT_GE(two->mig_profile_id, 0);
  EXPECT_TRUE(c.NodeFits(*two, 0));
  PodRequest other = early;
  other.mig_profile = "1g.10gb";
  auto one = c.Compile(other);
  ASSERT_TRUE(one.ok());
  EXPECT_NE(one->mig_profile_id, two->mig_profile_id);
  other.name = "o";
  Placement p;
  p.node = 0;
  p.gpus = {0};
  ASSERT_TRUE(c.Bind(*one, p).ok());
  EXPECT_FALSE(c.NodeFits(*one, 0)) << "the only 1g.10gb instance is taken";
  EXPECT_TRUE(c.NodeFits(*two, 0));
  other.mig_profile = "3g.40gb";
  auto none = c.Compile(other);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(c.NodeFits(*none, 0));
}

// Several single-GPU shares of one pod at once (the extender's filter for a pod with several GPU
// containers): first fit, largest first, on what each GPU has left.
TEST(Fit, SharesFitTogetherOnWhatIsLeft) {
  Cluster c;
  NodeSpec n = Node("n", 64000, 262144, 2);  // 2 x 24576 MiB
  ASSERT_TRUE(c.AddNode(n, 0).ok());
  auto share = [&](int64_t mib, int milli = 0) {
    PodRequest p = Pod("s" + std::to_string(mib), 0, 0, 1, milli);
    p.gpu_memory_mib = mib;
    return *c.Compile(p);
  };
  const Request a = share(16384), b = share(16384), small = share(8192), third = share(16384);
  auto fits = [&](std::vector<const Request*> reqs) { return c.SharesFitTogether(reqs, 0); };
  EXPECT_TRUE(fits({&a, &b}));
  EXPECT_TRUE(fits({&small, &a, &b}));  // largest first: 16384, 16384, then 8192 beside one of them
  EXPECT_FALSE(fits({&a, &b, &third}));
  const Request cores = share(1000, 600), cores2 = share(1000, 600), cores3 = share(1000, 600);
  EXPECT_TRUE(fits({&cores, &cores2}));
  EXPECT_FALSE(fits({&cores, &cores2, &cores3})) << "60% of the SMs three times on two GPUs";
  const Request whole = *c.Compile(Pod("w", 0, 0, 1, kMilli));
  EXPECT_FALSE(fits({&a, &whole})) << "only shares: anything else is for the caller's search";
  // What is bound counts: 10000 MiB on GPU 0 leaves 14576 there.
  Placement p;
  p.node = 0;
  p.gpus = {0};
  Request taken = share(10000);
  taken.name = "taken";
  ASSERT_TRUE(c.Bind(taken, p).ok());
  EXPECT_FALSE(fits({&a, &b}));
  EXPECT_TRUE(fits({&a, &small}));
  // A GPU's share limit (time-slicing replicas) and a MIG GPU take no share.
  Cluster limited;
  NodeSpec m = Node("m", 64000, 262144, 2);
  m.gpus[0].max_shares = 1;
  m.gpus[1].mig = {MigInstance{"1g.10gb", 1, 10240, kMilli / 7}};
  ASSERT_TRUE(limited.AddNode(m, 0).ok());
  PodRequest tiny = Pod("t", 0, 0, 1, 0);
  tiny.gpu_memory_mib = 100;
  const Request t1 = *limited.Compile(tiny), t2 = *limited.Compile(tiny);
  EXPECT_TRUE(limited.SharesFitTogether(std::vector<const Request*>{&t1}, 0));
  EXPECT_FALSE(limited.SharesFitTogether(std::vector<const Request*>{&t1, &t2}, 0));
}

// ------------------------------------------------------------------ CPU, memory, pod count, model
TEST(Fit, CpuMemoryPodsAndModel) {
  for (const std::string policy : {"random", "bestfit", "packing", "spread", "fgd", "ours"}) {
    SCOPED_TRACE(policy);
    Engine e(MustPolicy(policy, {GpuShape(8000, 1, 1000, 1.0)}), 13);
    ASSERT_TRUE(e.AddNode(Node("low-memory", 64000, 1000, 1)).ok());
    ASSERT_TRUE(e.AddNode(Node("low-cpu", 1000, 262144, 1)).ok());
    ASSERT_TRUE(e.AddNode(Node("fits", 64000, 262144, 1)).ok());
    auto p = e.Schedule(Pod("a", 8000, 4096, 1, 1000));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(NodeOf(e, *p), "fits");
    const auto& n = e.cluster().node(p->node);
    EXPECT_EQ(n.cpu_free, 64000 - 8000);
    EXPECT_EQ(n.memory_free, 262144 - 4096);
    // The only GPU that had room is taken: the next one fails with a message naming the pod.
    auto q = e.Schedule(Pod("b", 8000, 4096, 1, 1000));
    ASSERT_EQ(q.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(q.status().message().find("pod b: no node fits"), std::string::npos) << q.status();
    EXPECT_FALSE(e.cluster().HasPod("b"));
  }
}

TEST(Fit, PodLimitAndGpuModel) {
  Engine e(MustPolicy("bestfit"), 1);
  NodeSpec small = Node("t4", 64000, 262144, 1, "T4");
  small.max_pods = 2;
  ASSERT_TRUE(e.AddNode(small).ok());
  ASSERT_TRUE(e.AddNode(Node("a10", 64000, 262144, 1, "A10")).ok());
  PodRequest t4 = Pod("t4-0", 100, 100, 1, 100);
  t4.allowed_models = {"T4"};
  for (int i = 0; i < 2; ++i) {
    t4.name = "t4-" + std::to_string(i);
    auto p = e.Schedule(t4);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(NodeOf(e, *p), "t4");
  }
  // The T4 node holds its 2 pods: a third T4 pod fails although the GPU has 800 milli free.
  t4.name = "t4-2";
  EXPECT_EQ(e.Schedule(t4).status().code(), absl::StatusCode::kResourceExhausted);
  // Denying A10 leaves only the full T4 node: no fit; a CPU-only pod still goes to the A10 node.
  PodRequest deny = Pod("deny", 100, 100, 1, 100);
  deny.denied_models = {"A10"};
  EXPECT_EQ(e.Schedule(deny).status().code(), absl::StatusCode::kResourceExhausted);
  auto cpu = e.Schedule(Pod("cpu", 100, 100, 0, 0));
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(NodeOf(e, *cpu), "a10");
  EXPECT_TRUE(cpu->gpus.empty());
}

TEST(Fit, DefaultPodLimitIs1001) {
  // The paper's replay filters at most 1001 pods per node (kubelet's --max-pods ceiling); a node
  // from the CSV reader gets that limit. Pods of 1 mCPU: CPU and memory never bind here.
  auto nodes = ParseNodesCsv("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,1,T4\n", "nodes.csv");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ((*nodes)[0].max_pods, 1001);
  Engine e(MustPolicy("bestfit"), 1);
  ASSERT_TRUE(e.AddNode((*nodes)[0]).ok());
  for (int i = 0; i < 1001; ++i) {
    ASSERT_TRUE(e.Schedule(Pod("p" + std::to_string(i), 1, 1, 0, 0)).ok()) << i;
  }
  EXPECT_EQ(e.cluster().node(0).pods, 1001);
  auto over = e.Schedule(Pod("p1001", 1, 1, 0, 0));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  // A GPU pod is refused too although the GPU is fully free; releasing one pod frees a slot.
  EXPECT_EQ(e.Schedule(Pod("g", 1, 1, 1, 1000)).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(e.Release("p0").ok());
  auto g = e.Schedule(Pod("g", 1, 1, 1, 1000));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->gpus, std::vector<int>{0});
}

TEST(Fit, WholeGpusNeedFullyFreeGpusAndSharesAddUp) {
  for (const std::string policy : {"random", "bestfit", "packing", "spread", "fgd", "ours"}) {
    SCOPED_TRACE(policy);
    Engine e(MustPolicy(policy, {GpuShape(0, 1, 1000, 1.0)}), 17);
    ASSERT_TRUE(e.AddNode(Node("n", 64000, 262144, 2)).ok());
    BindAt(e, Pod("s100", 0, 0, 1, 100), "n", {0});
    // Two whole GPUs: only GPU 1 is fully free.
    EXPECT_EQ(e.Schedule(Pod("w2", 0, 0, 2, 1000)).status().code(), absl::StatusCode::kResourceExhausted);
    // One whole GPU: GPU 1, never the shared GPU 0 (which has 900 free).
    auto w = e.Schedule(Pod("w", 0, 0, 1, 1000));
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->gpus, std::vector<int>{1});
    EXPECT_EQ(w->milli_each, 1000);
    // A share cannot join a GPU taken whole; 900 fills GPU 0 exactly; then nothing fits.
    auto s900 = e.Schedule(Pod("s900", 0, 0, 1, 900));
    ASSERT_TRUE(s900.ok()) << s900.status();
    EXPECT_EQ(s900->gpus, std::vector<int>{0});
    const auto& n = e.cluster().node(0);
    EXPECT_EQ(n.gpus[0].free_milli, 0);
    EXPECT_EQ(n.gpus[0].pods, 2);
    EXPECT_EQ(n.gpus[1].free_milli, 0);
    EXPECT_EQ(n.gpus[1].pods, 1);
    EXPECT_EQ(e.Schedule(Pod("s1", 0, 0, 1, 1)).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(e.cluster().AllocatedGpuMilli(), 2000);
    // Releasing the whole GPU makes it fully free again (milli and memory).
    ASSERT_TRUE(e.Release("w").ok());
    EXPECT_TRUE(e.cluster().node(0).gpus[1].FullyFree());
    EXPECT_EQ(e.cluster().node(0).gpus[1].free_memory_mib, 24576);
  }
}

TEST(Fit, GpuMemoryShares) {
  // A share by GPU memory: each GPU has 24576 MiB; 16384 fits once per GPU.
  Engine e(MustPolicy("bestfit"), 1);
  ASSERT_TRUE(e.AddNode(Node("n", 64000, 262144, 2)).ok());
  PodRequest m = Pod("m0", 0, 0, 1, 0);
  m.gpu_memory_mib = 16384;
  auto a = e.Schedule(m);
  ASSERT_TRUE(a.ok()) << a.status();
  m.name = "m1";
  auto b = e.Schedule(m);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->gpus, b->gpus);
  m.name = "m2";
  EXPECT_EQ(e.Schedule(m).status().code(), absl::StatusCode::kResourceExhausted);
  // Milli and memory both count: a memory-only share leaves the milli untouched.
  EXPECT_EQ(e.cluster().node(0).gpus[0].free_milli, 1000);
  EXPECT_EQ(e.cluster().node(0).gpus[0].free_memory_mib, 24576 - 16384);
  // Malformed requests are InvalidArgument naming the pod, not "no fit".
  auto bad = e.Schedule(Pod("bad", 0, 0, 0, 500));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("pod bad"), std::string::npos) << bad.status();
  auto over = e.Schedule(Pod("over", 0, 0, 1, 1500));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Fit, NvlinkSetTakesTheSmallestIslandThatHoldsIt) {
  // 8 GPUs in islands {0,1,2,3}, {4,5}, {6,7}: two 2-GPU jobs take the two small islands, keeping
  // the 4-GPU island whole for a 4-GPU job.
  NodeSpec n = Node("nv", 128000, 524288, 8, "A100");
  for (int g = 0; g < 8; ++g) n.gpus[static_cast<size_t>(g)].nvlink_island = g < 4 ? 0 : (g < 6 ? 1 : 2);
  Engine e(MustPolicy("bestfit"), 1);
  ASSERT_TRUE(e.AddNode(n).ok());
  auto a = e.Schedule(Pod("a", 0, 0, 2, 1000));
  auto b = e.Schedule(Pod("b", 0, 0, 2, 1000));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->gpus, (std::vector<int>{4, 5}));
  EXPECT_EQ(b->gpus, (std::vector<int>{6, 7}));
  auto c4 = e.Schedule(Pod("c", 0, 0, 4, 1000));
  ASSERT_TRUE(c4.ok());
  EXPECT_EQ(c4->gpus, (std::vector<int>{0, 1, 2, 3}));
}

// Random arrivals and departures on a small mixed cluster, for every policy: after every
// operation the cluster's own figures are checked against an independent ledger of the bound
// pods (no GPU over 1000 milli, no node over its CPU, memory or pod count, whole GPUs exclusive,
// the allocated total exact).
TEST(Invariants, RandomArrivalsAndDeparturesStayWithinCapacity) {
  for (const std::string policy : {"random", "bestfit", "packing", "spread", "fgd", "ours"}) {
    SCOPED_TRACE(policy);
    Rng rng(99);
    Engine e(MustPolicy(policy, {GpuShape(4000, 1, 500, 0.5), GpuShape(8000, 1, 1000, 0.3),
                                 GpuShape(16000, 2, 1000, 0.1), Shape{2000, 0, 0, kAnyModel, 0.1}}),
             23);
    std::vector<NodeSpec> specs;
    for (int i = 0; i < 5; ++i) {
      specs.push_back(Node("n" + std::to_string(i), 16000 + 16000 * (i % 3), 65536 * (1 + i % 2), 2 + 2 * (i % 3),
                           i % 2 == 0 ? "A10" : "T4"));
      specs.back().max_pods = 12;
      ASSERT_TRUE(e.AddNode(specs.back()).ok());
    }
    struct Bound {
      PodRequest pod;
      Placement at;
    };
    std::map<std::string, Bound> ledger;
    int placed = 0, failed = 0, released = 0;
    for (int step = 0; step < 600; ++step) {
      if (!ledger.empty() && rng.Below(3) == 0) {
        auto it = ledger.begin();
        std::advance(it, static_cast<long>(rng.Below(ledger.size())));
        ASSERT_TRUE(e.Release(it->first).ok());
        ledger.erase(it);
        ++released;
      } else {
        const auto kind = rng.Below(10);
        PodRequest p = Pod("p" + std::to_string(step), 1000 * static_cast<int64_t>(rng.Below(9)),
                           4096 * static_cast<int64_t>(rng.Below(8)), 0, 0);
        if (kind >= 2 && kind <= 6) {
          p.num_gpus = 1;
          p.gpu_milli = 50 * static_cast<int>(1 + rng.Below(19));
        } else if (kind >= 7) {
          p.num_gpus = 1 + static_cast<int>(rng.Below(3));
          p.gpu_milli = 1000;
        }
        if (rng.Below(8) == 0) p.allowed_models = {"T4"};
        auto r = e.Schedule(p);
        if (r.ok()) {
          ++placed;
          const auto& node = e.cluster().node(r->node);
          for (int g : r->gpus) {
            const auto& model = e.cluster().models()[static_cast<size_t>(node.gpus[static_cast<size_t>(g)].model)];
            EXPECT_TRUE(p.allowed_models.empty() || model == "T4") << p.name << " on " << model;
          }
          EXPECT_EQ(static_cast<int>(r->gpus.size()), p.num_gpus);
          ledger[p.name] = {p, *r};
        } else {
          ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
          ++failed;
        }
      }
      // The ledger, independently of the cluster's accounting.
      std::map<std::pair<int, int>, int> milli, pods_on_gpu, whole_on_gpu;
      std::map<int, int64_t> cpu, mem;
      std::map<int, int> pods;
      int64_t total = 0;
      for (const auto& [name, b] : ledger) {
        cpu[b.at.node] += b.pod.cpu_milli;
        mem[b.at.node] += b.pod.memory_mib;
        ++pods[b.at.node];
        for (int g : b.at.gpus) {
          milli[{b.at.node, g}] += b.at.milli_each;
          ++pods_on_gpu[{b.at.node, g}];
          if (b.pod.gpu_milli >= 1000) ++whole_on_gpu[{b.at.node, g}];
          total += b.at.milli_each;
        }
      }
      for (const auto& [key, m] : milli) {
        ASSERT_LE(m, 1000) << "step " << step << " node " << key.first << " GPU " << key.second;
        ASSERT_EQ(e.cluster().node(key.first).gpus[static_cast<size_t>(key.second)].free_milli, 1000 - m);
        if (whole_on_gpu[key] > 0) {
          ASSERT_EQ(pods_on_gpu[key], 1) << "a whole GPU shared at step " << step;
        }
      }
      for (size_t i = 0; i < specs.size(); ++i) {
        const int id = static_cast<int>(i);
        const auto& n = e.cluster().node(id);
        ASSERT_LE(cpu[id], specs[i].cpu_milli) << "step " << step;
        ASSERT_LE(mem[id], specs[i].memory_mib) << "step " << step;
        ASSERT_LE(pods[id], specs[i].max_pods) << "step " << step;
        ASSERT_EQ(n.cpu_free, specs[i].cpu_milli - cpu[id]);
        ASSERT_EQ(n.memory_free, specs[i].memory_mib - mem[id]);
        ASSERT_EQ(n.pods, pods[id]);
      }
      ASSERT_EQ(e.cluster().AllocatedGpuMilli(), total) << "step " << step;
      std::vector<int64_t> by_free(1001, 0);
      for (const auto& n : e.cluster().nodes()) {
        for (const auto& g : n.gpus) ++by_free[static_cast<size_t>(g.free_milli)];
      }
      ASSERT_EQ(e.cluster().FreeMilliCounts(), by_free) << "step " << step;
      ASSERT_EQ(e.cluster().PodCount(), ledger.size());
    }
    // The workload overloads the cluster: both outcomes and departures really happened.
    EXPECT_GT(placed, 100);
    EXPECT_GT(failed, 20);
    EXPECT_GT(released, 100);
  }
}

// ------------------------------------------------------------------ replay
std::string PodsCsv(const std::vector<PodRequest>& pods) {
  std::string s = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n";
  for (const auto& p : pods) {
    s += p.name + "," + std::to_string(p.cpu_milli) + "," + std::to_string(p.memory_mib) + "," +
         std::to_string(p.num_gpus) + "," + std::to_string(p.gpu_milli) + ",\n";
  }
  return s;
}

const std::vector<std::string> kReplayPolicies = {"random", "bestfit", "packing",   "spread",
                                                  "fgd",    "ours",    "ours-trace"};

TEST(Replay, GoldenKpiOnATinyTrace) {
  // One node of 2 GPUs (2000 milli) and 4 pods of 500 milli (100 % demand). To reach 130 %
  // (2600) one clone is appended (2500; a second would make 3000). Every policy places the 4
  // originals (2 per GPU) and the clone fails: arrived 25/50/75/100/125 %, allocated
  // 25/50/75/100/100 %.
  auto nodes = ParseNodesCsv("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,A10\n", "nodes.csv");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  std::vector<PodRequest> pods;
  for (int i = 0; i < 4; ++i) pods.push_back(Pod("p" + std::to_string(i), 1000, 1024, 1, 500));
  auto trace = ParsePodsCsv(PodsCsv(pods), "pods.csv");
  ASSERT_TRUE(trace.ok()) << trace.status();
  for (const auto& policy : kReplayPolicies) {
    SCOPED_TRACE(policy);
    ReplayOptions o;
    o.policy = policy;
    o.seed = 42;
    o.keep_log = true;
    auto r = Replay(*nodes, *trace, o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->gpus, 2);
    EXPECT_EQ(r->total_milli, 2000);
    EXPECT_EQ(r->arrived, 5);
    EXPECT_EQ(r->placed, 4);
    EXPECT_EQ(r->failed, 1);
    const std::map<int, double> want = {{25, 25.0}, {50, 50.0}, {75, 75.0}, {100, 100.0}, {125, 100.0}};
    EXPECT_EQ(r->curve, want);
    EXPECT_DOUBLE_EQ(r->AllocAt(100), 100.0);
    EXPECT_TRUE(std::isnan(r->AllocAt(130)));
    EXPECT_EQ(r->failed_by_shape, (std::map<std::string, int64_t>{{"share", 1}}));
    EXPECT_DOUBLE_EQ(r->final_alloc, 100.0);
    EXPECT_DOUBLE_EQ(r->idle_milli, 0.0);
    ASSERT_EQ(r->log.size(), 5u);
    EXPECT_EQ(r->log.back().node, -1);
    EXPECT_EQ(r->log.back().pod.rfind("-tuned-0"), r->log.back().pod.size() - 8) << r->log.back().pod;
  }
}

// A synthetic trace drawn with a fixed seed: CPU-only pods, shares, whole and multi-GPU pods.
struct Synthetic {
  std::vector<NodeSpec> nodes;
  std::vector<TracePod> pods;
  std::map<std::string, PodRequest> by_name;
};

Synthetic MakeSynthetic(uint64_t seed) {
  Rng rng(seed);
  std::string nodes = "sn,cpu_milli,memory_mib,gpu,model\n";
  for (int i = 0; i < 6; ++i) {
    nodes += "node-" + std::to_string(i) + "," + std::to_string(32000 + 32000 * (i % 2)) + ",131072," +
             std::to_string(i < 2 ? 8 : (i < 4 ? 4 : 2)) + "," + (i % 3 == 0 ? "T4" : "A10") + "\n";
  }
  std::vector<PodRequest> pods;
  for (int i = 0; i < 80; ++i) {
    const auto kind = rng.Below(10);
    const int64_t cpu = 1000 * static_cast<int64_t>(1 + rng.Below(12));
    const int64_t mem = 1024 * static_cast<int64_t>(1 + rng.Below(16));
    char name[16];
    std::snprintf(name, sizeof name, "pod-%03d", i);
    if (kind == 0)
      pods.push_back(Pod(name, cpu, mem, 0, 0));
    else if (kind <= 5)
      pods.push_back(Pod(name, cpu, mem, 1, 100 * static_cast<int>(1 + rng.Below(9))));
    else if (kind <= 8)
      pods.push_back(Pod(name, cpu, mem, 1, 1000));
    else
      pods.push_back(Pod(name, cpu, mem, 2, 1000));
  }
  Synthetic s;
  auto n = ParseNodesCsv(nodes, "synthetic-nodes.csv");
  auto p = ParsePodsCsv(PodsCsv(pods), "synthetic-pods.csv");
  EXPECT_TRUE(n.ok() && p.ok());
  s.nodes = *n;
  s.pods = *p;
  for (const auto& pod : pods) s.by_name[pod.name] = pod;
  return s;
}

bool SameLog(const ReplayResult& a, const ReplayResult& b) {
  if (a.log.size() != b.log.size()) return false;
  for (size_t i = 0; i < a.log.size(); ++i) {
    const auto &x = a.log[i], &y = b.log[i];
    if (x.pod != y.pod || x.node != y.node || x.gpus != y.gpus || x.milli_each != y.milli_each) return false;
  }
  return true;
}

TEST(Replay, DeterministicForASeedAndWithinCapacity) {
  const Synthetic s = MakeSynthetic(2024);
  for (const auto& policy : kReplayPolicies) {
    SCOPED_TRACE(policy);
    ReplayOptions o;
    o.policy = policy;
    o.seed = 42;
    o.keep_log = true;
    auto a = Replay(s.nodes, s.pods, o);
    auto b = Replay(s.nodes, s.pods, o);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(SameLog(*a, *b));
    EXPECT_EQ(a->curve, b->curve);
    o.seed = 43;
    auto c = Replay(s.nodes, s.pods, o);
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(SameLog(*a, *c)) << "seed 43 should shuffle the arrivals differently";

    // Accounting and capacity, recomputed from the log alone.
    EXPECT_EQ(a->arrived, static_cast<int64_t>(a->log.size()));
    EXPECT_EQ(a->placed + a->failed, a->arrived);
    std::map<std::pair<int, int>, int> gpu_milli;
    std::map<int, int64_t> cpu, mem;
    int64_t placed = 0, milli = 0;
    for (const auto& e : a->log) {
      const std::string base = e.pod.substr(0, 7);  // "pod-NNN", clones add "-tuned-k"
      ASSERT_TRUE(s.by_name.contains(base)) << e.pod;
      const auto& req = s.by_name.at(base);
      if (e.node < 0) continue;
      ++placed;
      cpu[e.node] += req.cpu_milli;
      mem[e.node] += req.memory_mib;
      EXPECT_EQ(static_cast<int>(e.gpus.size()), req.num_gpus) << e.pod;
      for (int g : e.gpus) {
        gpu_milli[{e.node, g}] += e.milli_each;
        milli += e.milli_each;
      }
      if (req.num_gpus > 0) {
        EXPECT_EQ(e.milli_each, req.gpu_milli) << e.pod;
      }
    }
    EXPECT_EQ(placed, a->placed);
    for (const auto& [key, m] : gpu_milli) {
      EXPECT_LE(m, 1000) << "node " << key.first << " GPU " << key.second;
      EXPECT_LT(key.second, static_cast<int>(s.nodes[static_cast<size_t>(key.first)].gpus.size()));
    }
    for (const auto& [node, used] : cpu) EXPECT_LE(used, s.nodes[static_cast<size_t>(node)].cpu_milli);
    for (const auto& [node, m] : mem) EXPECT_LE(m, s.nodes[static_cast<size_t>(node)].memory_mib);
    EXPECT_NEAR(a->final_alloc, 100.0 * static_cast<double>(milli) / static_cast<double>(a->total_milli), 1e-9);
    EXPECT_DOUBLE_EQ(a->idle_milli, static_cast<double>(a->total_milli - milli));
  }
}

// ------------------------------------------------------------------ CSV errors
TEST(TraceCsv, ParsesTheAlibabaFormat) {
  auto pods = ParsePodsCsv(
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time\r\n"
      "a,6000,12288,1,460,,10,20\r\n"
      "\r\n"
      "b,88000,327680,8,1000,V100M16|V100M32,5,\r\n"
      "c,1000,100,2,300,,,\r\n",
      "pods.csv");
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_EQ(pods->size(), 3u);
  EXPECT_EQ((*pods)[0].request.gpu_milli, 460);
  EXPECT_EQ((*pods)[0].creation, 10);
  EXPECT_EQ((*pods)[0].deletion, 20);
  EXPECT_EQ((*pods)[1].request.num_gpus, 8);
  EXPECT_EQ((*pods)[1].request.allowed_models, (std::vector<std::string>{"V100M16", "V100M32"}));
  EXPECT_EQ((*pods)[1].deletion, -1);
  EXPECT_EQ((*pods)[2].request.gpu_milli, 1000);  // several GPUs are whole GPUs
}

TEST(TraceCsv, ErrorsNameTheFileLineAndColumn) {
  auto bad_value = ParsePodsCsv(
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
      "p1,1000,10,1,500\n"
      "\n"
      "p2,12x,10,1,500\n",
      "trace/pods.csv");
  ASSERT_FALSE(bad_value.ok());
  EXPECT_EQ(bad_value.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_value.status().message(), "trace/pods.csv:4: column 'cpu_milli': '12x' is not a non-negative integer");

  auto no_column = ParsePodsCsv("name,cpu_milli,num_gpu\np1,1,0\n", "pods.csv");
  ASSERT_FALSE(no_column.ok());
  EXPECT_EQ(no_column.status().message(),
            "pods.csv:1: the header has no column 'memory_mib' (a pod CSV needs name,cpu_milli,memory_mib,num_gpu)");

  auto twice = ParseNodesCsv("sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,1,T4\nn1,1,1,1,T4\n", "nodes.csv");
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().message(), "nodes.csv:3: column 'sn': node n1 appears twice");

  auto negative = ParseNodesCsv("sn,cpu_milli,memory_mib,gpu,model\nn1,-5,1,1,T4\n", "nodes.csv");
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.status().message(), "nodes.csv:2: column 'cpu_milli': '-5' is not a non-negative integer");

  auto no_model = ParseNodesCsv("sn,cpu_milli,memory_mib,gpu,model\nn1,5,1,2,\n", "nodes.csv");
  ASSERT_FALSE(no_model.ok());
  EXPECT_NE(no_model.status().message().find("nodes.csv:2: column 'model'"), std::string::npos) << no_model.status();

  auto empty = ParsePodsCsv("", "empty.csv");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message().rfind("empty.csv: empty", 0), 0u) << empty.status();

  auto header_only = ParseNodesCsv("sn,cpu_milli,memory_mib,gpu,model\n", "nodes.csv");
  ASSERT_FALSE(header_only.ok());
  EXPECT_EQ(header_only.status().message(), "nodes.csv: no nodes after the header");
}

TEST(TraceCsv, EveryRowHasTheHeadersFields) {
  // A row with a field missing was read with the missing column empty (the GPU count taken as 0);
  // a row with an unquoted comma, with its values shifted. Both are errors naming file:line.
  auto missing = ParseNodesCsv("sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,1,T4\nn2,64000,262144,8\n", "nodes.csv");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(),
            "nodes.csv:3:18: record has 4 fields, the header has 5 (add the missing field; an empty field is nothing "
            "between two ',')");

  auto extra = ParsePodsCsv("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1,1,0,0\np2,1,1,0,0,x\n", "pods.csv");
  ASSERT_FALSE(extra.ok());
  const std::string e(extra.status().message());
  EXPECT_EQ(e.rfind("pods.csv:3:12: record has 6 fields, the header has 5", 0), 0u) << e;
}

TEST(TraceCsv, QuotedFieldsReadAsEncodingCsvReadsThem) {
  // Quotes (a spreadsheet's export), "" for a quote, a byte-order mark, blanks trimmed.
  auto pods = ParsePodsCsv(
      "\xEF\xBB\xBF\"name\",cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\r\n"
      "\"p1\", 1000 ,\"100\",1,500,\"T4|A10\"\r\n",
      "pods.csv");
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_EQ(pods->size(), 1u);
  EXPECT_EQ((*pods)[0].request.name, "p1");
  EXPECT_EQ((*pods)[0].request.cpu_milli, 1000);
  EXPECT_EQ((*pods)[0].request.memory_mib, 100);
  EXPECT_EQ((*pods)[0].request.allowed_models, (std::vector<std::string>{"T4", "A10"}));

  // A quote inside an unquoted field, and a quoted field never closed: the reader's errors.
  auto bare = ParseNodesCsv("sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,1,T4 \"x\"\n", "nodes.csv");
  ASSERT_FALSE(bare.ok());
  EXPECT_EQ(std::string(bare.status().message()).rfind("nodes.csv:2:13: bare \" in a field that is not quoted", 0), 0u)
      << bare.status();
  auto open = ParseNodesCsv("sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,1,\"T4\n", "nodes.csv");
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(std::string(open.status().message()).rfind("nodes.csv:2:10: quoted field is not closed", 0), 0u)
      << open.status();
}

}  // namespace
}  // namespace kgpu::sched
