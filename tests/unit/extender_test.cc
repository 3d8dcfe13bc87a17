// The extender's pure parts: the wire JSON (exact casing both ways), the request model and its
// quantity forms, allocation records, the inventory annotation, and the decisions of State —
// reasons, FailedNodes vs FailedAndUnresolvableNodes, exact GPUs, rebuild from records, preempt.
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "api/record.h"
#include "extender/inventory.h"
#include "extender/request.h"
#include "extender/state.h"
#include "extender/state_internal.h"
#include "extender/wire.h"
#include "testing/gpu_nodes.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;
using testing::MigGpu;
using testing::ShareGpu;
using testing::TestGpuUuid;
using testing::TestNode;
using testing::TestPod;
using testing::WholeGpu;
using testing::WithContainer;

json WithUid(json pod, const std::string& uid) {
  pod["metadata"]["uid"] = uid;
  return pod;
}

// A pod as the informer sees it once bound with a record.
// The node as its agent reports it, with each GPU's memory in use (usedMiB).
json Reported(json node, const std::vector<int64_t>& used) {
  auto& ann = node["metadata"]["annotations"]["kgpu.io/gpu-inventory"];
  json inv = json::parse(ann.get<std::string>());
  for (size_t i = 0; i < used.size(); ++i) inv["gpus"][i]["usedMiB"] = used[i];
  ann = inv.dump();
  return node;
}

json Bound(json pod, const std::string& node, const api::AllocationRecord& r) {
  pod["spec"]["nodeName"] = node;
  pod["metadata"]["annotations"][kAnnotationAllocation] = api::EncodeRecord(r);
  pod["status"]["phase"] = "Running";
  return pod;
}

TEST(Wire, ParsesPascalCaseAndAnyCaseLikeGo) {
  const std::string body = R"({"Pod":{"metadata":{"name":"p","namespace":"ns","uid":"u1"},"spec":{}},
                               "Nodes":null,"NodeNames":["node-a","node-b"]})";
  auto a = ParseExtenderArgs(body);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->pod["metadata"]["name"], "p");
  EXPECT_FALSE(a->nodes.has_value());
  ASSERT_TRUE(a->node_names.has_value());
  EXPECT_EQ(*a->node_names, (std::vector<std::string>{"node-a", "node-b"}));
  // Go's decoder folds case: lowercase and camelCase envelopes are the same request.
  auto lower = ParseExtenderArgs(R"({"pod":{"metadata":{"name":"p"}},"nodenames":["x"]})");
  ASSERT_TRUE(lower.ok()) << lower.status();
  EXPECT_EQ(*lower->node_names, std::vector<std::string>{"x"});
  // nodeCacheCapable: false: the full NodeList, NodeNames null.
  auto full =
      ParseExtenderArgs(R"({"Pod":{},"Nodes":{"metadata":{},"items":[{"metadata":{"name":"n1"}}]},"NodeNames":null})");
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(full->nodes.has_value());
  EXPECT_EQ((*full->nodes)[0]["metadata"]["name"], "n1");
  EXPECT_FALSE(full->node_names.has_value());
  auto b = ParseBindingArgs(R"({"PodName":"p","PodNamespace":"ns","PodUID":"1b2c","Node":"node-a"})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->pod_uid, "1b2c");
  EXPECT_EQ(b->node, "node-a");
  auto p = ParsePreemptionArgs(
      R"({"Pod":{},"NodeNameToVictims":null,"NodeNameToMetaVictims":{"node-a":{"Pods":[{"UID":"9f"}],"NumPDBViolations":1}}})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->full_victims);
  EXPECT_EQ(p->victims.at("node-a").pod_uids, std::vector<std::string>{"9f"});
  EXPECT_EQ(p->victims.at("node-a").num_pdb_violations, 1);
  auto pf = ParsePreemptionArgs(
      R"({"Pod":{},"NodeNameToVictims":{"n":{"Pods":[{"metadata":{"uid":"v1"}}],"NumPDBViolations":0}}})");
  ASSERT_TRUE(pf.ok()) << pf.status();
  EXPECT_TRUE(pf->full_victims);
  EXPECT_EQ(pf->victims.at("n").pod_uids, std::vector<std::string>{"v1"});
}

TEST(Wire, ErrorsNameTheField) {
  auto bad = ParseExtenderArgs(R"({"Pod":{},"NodeNames":"node-a"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "ExtenderArgs.NodeNames: expected an array of strings or null");
  EXPECT_EQ(ParseExtenderArgs("{").status().message(), "ExtenderArgs: the request body is not valid JSON (1 bytes)");
  EXPECT_EQ(ParseExtenderArgs("{}").status().message(), "ExtenderArgs.Pod: missing (the pod to schedule)");
  EXPECT_EQ(ParseBindingArgs(R"({"PodName":"p"})").status().message(), "ExtenderBindingArgs.Node: missing");
  EXPECT_FALSE(ParsePreemptionArgs(R"({"Pod":{},"NodeNameToMetaVictims":{"n":{"Pods":[null]}}})").ok());
}

TEST(Wire, EmitsUpstreamPascalCase) {
  FilterResult r;
  r.node_names = std::vector<std::string>{"node-a"};
  r.failed_nodes["node-b"] = "no single GPU with 8000 MiB free";
  r.failed_and_unresolvable["node-c"] = "no GPU of type A100";
  EXPECT_EQ(EncodeFilterResult(r),
            R"({"Error":"","FailedAndUnresolvableNodes":{"node-c":"no GPU of type A100"},)"
            R"("FailedNodes":{"node-b":"no single GPU with 8000 MiB free"},"NodeNames":["node-a"],"Nodes":null})");
  FilterResult full;
  full.nodes = std::vector<json>{json{{"metadata", {{"name", "n1"}}}}};
  const json f = json::parse(EncodeFilterResult(full));
  EXPECT_TRUE(f["NodeNames"].is_null());
  EXPECT_EQ(f["Nodes"]["items"][0]["metadata"]["name"], "n1");
  EXPECT_EQ(EncodeHostPriorityList({{"node-a", 7}, {"node-b", 0}}),
            R"([{"Host":"node-a","Score":7},{"Host":"node-b","Score":0}])");
  EXPECT_EQ(EncodeBindingResult(""), R"({"Error":""})");
  EXPECT_EQ(EncodePreemptionResult({{"node-a", {{"9f"}, 0}}}),
            R"({"NodeNameToMetaVictims":{"node-a":{"NumPDBViolations":0,"Pods":[{"UID":"9f"}]}}})");
  // Round trips through the scheduler side's parsers.
  auto back = ParseFilterResult(EncodeFilterResult(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->failed_nodes, r.failed_nodes);
  EXPECT_EQ(*back->node_names, *r.node_names);
}

TEST(Request, ReadsEveryQuantityForm) {
  for (const auto& [text, want] : std::vector<std::pair<std::string, int64_t>>{{"8000", 8000},
                                                                               {"8k", 8000},
                                                                               {"1Ki", 1024},
                                                                               {"2e3", 2000},
                                                                               {"10240", 10240},
                                                                               {"10Ki", 10240},
                                                                               {"1M", 1000000}}) {
    auto v = WholeQuantity(json(text), "q");
    ASSERT_TRUE(v.ok()) << text << ": " << v.status();
    EXPECT_EQ(*v, want) << text;
  }
  EXPECT_EQ(*WholeQuantity(json(3), "q"), 3);
  EXPECT_FALSE(WholeQuantity(json("500m"), "q").ok());
  EXPECT_FALSE(WholeQuantity(json("lots"), "q").ok());
  auto r = ParsePodRequest(
      TestPod("ns", "p", {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-memory", "8k"}, {"kgpu.io/gpu-cores", "60"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->gpus.size(), 1u);
  EXPECT_EQ(r->gpus[0].kind, GpuKind::kShare);
  EXPECT_EQ(r->gpus[0].count, 2);
  EXPECT_EQ(r->gpus[0].MemoryPerGpu(), 4000);
  EXPECT_EQ(r->gpus[0].CoresPerGpu(), 30);
  auto w = ParsePodRequest(TestPod("ns", "w", {{"nvidia.com/gpu", "4"}}));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->gpus.at(0).kind, GpuKind::kWhole);
  auto m = ParsePodRequest(TestPod("ns", "m", {{"nvidia.com/mig-1g.10gb", "1"}}));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->gpus.at(0).mig_profile, "1g.10gb");
  auto none = ParsePodRequest(TestPod("ns", "cpu", {{"cpu", "2"}}));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->gpus.empty());
}

TEST(Request, SeveralGpuContainersAndInitContainersHandedOn) {
  // Two app containers and a sidecar, each with its own GPUs.
  json pod = TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}});
  pod = WithContainer(pod, "containers", "side", {{"nvidia.com/gpu", "1"}});
  pod = WithContainer(pod, "initContainers", "proxy", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}, true);
  auto r = ParsePodRequest(pod);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->gpus.size(), 3u);
  EXPECT_EQ(r->gpus[0].name, "proxy");  // kubelet's order: init containers first
  EXPECT_FALSE(r->gpus[0].init);        // a sidecar keeps its devices
  EXPECT_EQ(r->Placed().size(), 3u);
  // A regular init container runs on the devices kubelet hands on to the first later container
  // asking for the same resource.
  json warm = WithContainer(pod, "initContainers", "warmup", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "2000"}});
  auto w = ParsePodRequest(warm);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->gpus.size(), 4u);
  EXPECT_EQ(w->gpus[1].name, "warmup");
  EXPECT_TRUE(w->gpus[1].init);
  EXPECT_EQ(w->gpus[1].target, 2);  // main (the sidecar came before it)
  EXPECT_EQ(w->Placed().size(), 3u);
  json whole = WithContainer(TestPod("ns", "p", {{"nvidia.com/gpu", "2"}}), "initContainers", "fetch",
                             {{"nvidia.com/gpu", "1"}});
  auto h = ParsePodRequest(whole);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->gpus[0].target, 1);

  auto msg = [](const json& p) { return std::string(ParsePodRequest(p).status().message()); };
  EXPECT_EQ(
      msg(WithContainer(TestPod("ns", "p", {{"cpu", "1"}}), "initContainers", "fetch", {{"nvidia.com/gpu", "1"}})),
      "init container fetch: asks for nvidia.com/gpu but no later container does; kubelet hands an init container's "
      "devices on to the first later container asking for the same resource, which the extender places for both (ask "
      "for it in the app container too, or run the GPU work in a sidecar: an init container with restartPolicy: "
      "Always)");
  EXPECT_EQ(
      msg(WithContainer(TestPod("ns", "p", {{"nvidia.com/gpu", "1"}}), "initContainers", "fetch",
                        {{"nvidia.com/gpu", "2"}})),
      "init container fetch: asks for 2 nvidia.com/gpu, container main (which kubelet hands its devices on to) asks "
      "for 1; an init container may ask for at most as many as its (ask for at most 1)");
  EXPECT_EQ(
      msg(WithContainer(TestPod("ns", "p", {{"kgpu.io/gpu", "2"}}), "initContainers", "fetch", {{"kgpu.io/gpu", "1"}})),
      "init container fetch: asks for 1 kgpu.io/gpu, container main (which kubelet hands its devices on to) asks for "
      "2; "
      "an init container's shares must be as many as its (ask for 2)");
  EXPECT_EQ(
      msg(WithContainer(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}), "initContainers",
                        "fetch", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "2000"}})),
      "init container fetch: asks for 2000 kgpu.io/gpu-memory and 0 kgpu.io/gpu-cores, more than container main (1000 "
      "and 0), whose shares it runs on (kubelet hands its devices on to it); ask for at most as much");
}

TEST(Request, RefusesWhatCanNeverBeScheduled) {
  auto msg = [](const json& pod) { return std::string(ParsePodRequest(pod).status().message()); };
  EXPECT_EQ(
      msg(TestPod("ns", "p", {{"nvidia.com/gpu", "1"}, {"kgpu.io/gpu", "1"}})),
      "container main: asks for more than one kind of GPU (nvidia.com/gpu, nvidia.com/mig-<profile> and kgpu.io/gpu "
      "exclude each other); keep one of them");
  EXPECT_EQ(msg(TestPod("ns", "p", {{"kgpu.io/gpu-memory", "4000"}})),
            "container main: asks for kgpu.io/gpu-memory without kgpu.io/gpu (add kgpu.io/gpu: 1 to its requests and "
            "limits; kgpu webhook does this)");
  EXPECT_EQ(
      msg(TestPod("ns", "p", {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-memory", "4001"}})),
      "container main: kgpu.io/gpu-memory 4001 does not split evenly over 2 shares (use a multiple of 2, e.g. 4000)");
  EXPECT_EQ(msg(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-cores", "150"}})),
            "container main: kgpu.io/gpu-cores 150 over 1 shares is 150% of one GPU per share (at most 100; ask for "
            "more shares)");
  EXPECT_EQ(msg(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}}, {{"kgpu.io/enforcement", "soft"}})),
            "annotation kgpu.io/enforcement: 'soft' is not a mode (use hard, mps or none)");
}

TEST(Record, OnAPodItsAnnotationOrNoneOrTheParseError) {
  api::AllocationRecord r{"node-a", {{"main", "nvidia.com/mig-1g.10gb", "", {{"GPU-1", "MIG-1", "1g.10gb", 9984, 0}}}}};
  auto got = api::RecordOnPod(Bound(TestPod("ns", "p", {{"nvidia.com/mig-1g.10gb", "1"}}), "node-a", r));
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  EXPECT_EQ(**got, r);
  EXPECT_EQ((**got).containers[0].gpus[0].Device(), "MIG-1");
  auto none = api::RecordOnPod(json{{"metadata", {{"name", "p"}}}});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto number = api::RecordOnPod(json{{"metadata", {{"annotations", {{"kgpu.io/allocation", 5}}}}}});
  ASSERT_TRUE(number.ok());
  EXPECT_FALSE(number->has_value());
  auto bad = api::RecordOnPod(json{{"metadata", {{"annotations", {{"kgpu.io/allocation", "{"}}}}}});
  EXPECT_FALSE(bad.ok());
}

TEST(Record, RoundTripsAndNamesBadFields) {
  api::AllocationRecord r{
      "node-a", {{"main", "kgpu.io/gpu", "hard", {{"GPU-1", "", "", 4000, 25}, {"GPU-2", "", "", 4000, 25}}}}};
  const std::string text = api::EncodeRecord(r);
  EXPECT_EQ(
      text,
      R"({"containers":[{"enforcement":"hard","gpus":[{"cores":25,"memMiB":4000,"uuid":"GPU-1"},)"
      R"({"cores":25,"memMiB":4000,"uuid":"GPU-2"}],"name":"main","resource":"kgpu.io/gpu"}],"node":"node-a","v":1})");
  auto back = api::ParseRecord(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, r);
  EXPECT_EQ(api::ParseRecord(R"({"v":1,"node":"n","containers":[{"name":"c","resource":"kgpu.io/gpu","gpus":[{}]}]})")
                .status()
                .message(),
            "kgpu.io/allocation: containers[0].gpus[0].uuid: missing");
  EXPECT_EQ(api::ParseRecord(R"({"v":2})").status().message(),
            "kgpu.io/allocation: v: format version 1 expected (written by a different kgpu version?)");
  EXPECT_FALSE(api::ParseRecord("not json").ok());
}

TEST(Inventory, ParsesTheAnnotation) {
  const json node = TestNode("n1", {WholeGpu(), ShareGpu(), MigGpu({"3g.40gb", "1g.10gb"})}, {{0, 1}});
  auto n = ParseNodeInventory(node);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(n->gpus.size(), 3u);
  EXPECT_EQ(n->gpus[0].uuid, TestGpuUuid("n1", 0));
  EXPECT_EQ(n->gpus[1].slots, 16);
  EXPECT_EQ(n->gpus[0].island, 0);
  EXPECT_EQ(n->gpus[2].island, -1);
  EXPECT_EQ(n->enforcement, (std::vector<std::string>{"hard", "mps", "none"}));
  const auto spec = ToNodeSpec(*n);
  EXPECT_EQ(spec.gpus[1].model, std::string(kShareModelPrefix) + "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(spec.gpus[1].max_shares, 16);
  ASSERT_EQ(spec.gpus[2].mig.size(), 2u);
  EXPECT_EQ(spec.gpus[2].mig[0].compute_slices, 3);
  EXPECT_EQ(MigSlices("1c.3g.40gb"), 3);
  EXPECT_EQ(MigSlices("7g.80gb"), 7);
  EXPECT_EQ(MigSlices("bogus"), 0);
  EXPECT_TRUE(absl::IsNotFound(ParseNodeInventory(json{{"metadata", {{"name", "cpu"}}}}).status()));
  auto bad = ParseInventoryAnnotation("n", R"({"v":1,"gpus":[{"i":0}]})");
  EXPECT_EQ(bad.status().message(),
            "node n: annotation kgpu.io/gpu-inventory: gpus[0].uuid: missing (re-run kgpu node-labels on the node)");
}

class StateTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(state.Init().ok()); }
  std::string Book(const json& pod, const std::string& node) {
    auto a = state.Assume(pod, node);
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return "";
    state.Confirm(a->uid);
    std::vector<std::string> gpus;
    for (const auto& g : a->record.containers[0].gpus) gpus.push_back(g.Device());
    return gpus.empty() ? "" : gpus[0];
  }
  // A one-share pod "ns/<name>" (UID "u<name>") of `mib` MiB at priority `prio`.
  static json Share(const std::string& name, const std::string& mib, int64_t prio) {
    return WithUid(TestPod("ns", name, {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", mib}}, {}, prio), "u" + name);
  }
  // Binds `pod` to `node` as the extender would and feeds the bound pod back (kept in `bound`).
  void Run(const json& pod, const std::string& node) {
    auto a = state.Assume(pod, node);
    ASSERT_TRUE(a.ok()) << a.status();
    bound_[a->name] = Bound(pod, node, a->record);
    state.UpsertPod(bound_[a->name]);
  }
  State state;
  std::map<std::string, json> bound_;
};

// A filter explains each node shape once (State's refusal memo): nodes alike get the same
// refusal, and any difference that changes the answer (memory, health, model, MIG layout, UUID
// lists) gets its own, in the order kube-scheduler sent the nodes.
TEST_F(StateTest, NodesOfOneShapeShareTheirRefusalAndEveryDifferenceCounts) {
  kgpu::testing::TestGpu sick = ShareGpu(16384);
  sick.healthy = false;
  state.UpsertNode(TestNode("w1", {WholeGpu(), WholeGpu()}));
  state.UpsertNode(TestNode("s16a", {ShareGpu(16384), ShareGpu(16384)}));
  state.UpsertNode(TestNode("s32", {ShareGpu(32768), ShareGpu(16384)}));
  state.UpsertNode(TestNode("w2", {WholeGpu(), WholeGpu()}));
  state.UpsertNode(TestNode("s16b", {ShareGpu(16384), ShareGpu(16384)}));
  state.UpsertNode(TestNode("sick", {sick, sick}));
  state.UpsertNode(TestNode("t4", {ShareGpu(16384, 16, "Tesla T4"), ShareGpu(16384, 16, "Tesla T4")}));
  state.UpsertNode(TestNode("mig", {MigGpu({"3g.40gb", "3g.40gb"})}));
  const std::vector<std::string> order = {"w1", "s16a", "s32", "w2", "s16b", "sick", "t4", "mig"};
  auto out =
      state.Filter(WithUid(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "20000"}}), "u-p"), order);
  EXPECT_EQ(out.passed, std::vector<std::string>{"s32"});
  const std::string too_small = "no GPU on this node has 20000 MiB in total";
  const std::string no_shares = "no GPU on this node serves shares (kgpu.io/gpu)";
  std::vector<std::pair<std::string, std::string>> got(out.unresolvable.begin(), out.unresolvable.end());
  EXPECT_EQ(got,
            (std::vector<std::pair<std::string, std::string>>{{"w1", no_shares},
                                                              {"s16a", too_small},
                                                              {"w2", no_shares},
                                                              {"s16b", too_small},
                                                              {"sick", "no healthy GPU of the pod's kind on this node"},
                                                              {"t4", too_small},
                                                              {"mig", no_shares}}));
  EXPECT_TRUE(out.failed.empty());
  EXPECT_EQ(out.reasons.at("too_few_gpus"), 3);
  EXPECT_EQ(out.reasons.at("gpu_too_small"), 3);
  // The node's own figures, for whoever asks about one node.
  const json p = WithUid(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "20000"}}), "u-p");
  EXPECT_EQ(state.Explain(p, "s16a"), too_small + " (largest: 16384 MiB)");
  EXPECT_EQ(state.Explain(p, "sick"), "no healthy GPU of the pod's kind on this node (2 unhealthy)");
  // A model list: the T4 node refuses for its model now, the A100 nodes as before.
  auto t4 = state.Filter(WithUid(TestPod("ns", "m", {{"kgpu.io/gpu", "1"}}, {{"kgpu.io/gpu-model", "A100"}}), "u-m"),
                         {"t4", "s16a", "s16b"});
  EXPECT_EQ(t4.unresolvable.at("t4"), "no GPU of the pod's models here");
  EXPECT_EQ(t4.passed, (std::vector<std::string>{"s16a", "s16b"}));
  // UUID lists depend on more than the shape: two nodes alike answer differently.
  auto pinned = state.Filter(WithUid(TestPod("ns", "u", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "20000"}},
                                             {{"kgpu.io/gpu-uuid", TestGpuUuid("s32", 0)}}),
                                     "u-u"),
                             {"s16a", "s32", "s16b"});
  EXPECT_EQ(pinned.passed, std::vector<std::string>{"s32"});
  EXPECT_EQ(pinned.unresolvable.at("s16a"), "the pod's GPU UUID lists leave no GPU on this node");
  EXPECT_EQ(pinned.unresolvable.at("s16b"), "the pod's GPU UUID lists leave no GPU on this node");
  // A node whose inventory changes takes its new shape's answer at once.
  state.UpsertNode(TestNode("s16b", {ShareGpu(32768), ShareGpu(16384)}));
  auto again = state.Filter(
      WithUid(TestPod("ns", "p2", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "20000"}}), "u-p2"), {"s16a", "s16b"});
  EXPECT_EQ(again.passed, std::vector<std::string>{"s16b"});
  EXPECT_EQ(again.unresolvable.at("s16a"), too_small);
}

// kube-scheduler counts identical reasons into one line each ("0/5000 nodes are available: 5000
// Insufficient cpu") and cuts its event at 1,024 bytes: a reason names the cause and the pod's
// numbers, never the node's, so 300 nodes each with a different largest free GPU give one line.
// The node's own figures are asked for one node: the nearest, which Filter names.
TEST_F(StateTest, ReasonsAreOneTextPerCauseWhateverEachNodeHasFree) {
  std::vector<std::string> names;
  for (int i = 0; i < 300; ++i) {
    const std::string n = "n" + std::to_string(i);
    state.UpsertNode(TestNode(n, {ShareGpu(81920), ShareGpu(81920)}));
    for (int g = 0; g < 2; ++g) {
      const std::string pod = "f" + std::to_string(g) + n;
      Book(WithUid(
               TestPod("ns", pod, {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", std::to_string(10000 * (g + 1) + i)}},
                       {{"kgpu.io/gpu-uuid", TestGpuUuid(n, g)}}),
               "u" + pod),
           n);
    }
    names.push_back(n);
  }
  state.UpsertNode(TestNode("whole", {WholeGpu()}));
  state.UpsertNode(TestNode("small", {ShareGpu(40960)}));
  names.insert(names.begin() + 150, {"whole", "small"});
  const json pod = WithUid(TestPod("ns", "big", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "75000"}}), "u-big");
  const auto out = state.Filter(pod, names);
  EXPECT_TRUE(out.passed.empty());
  // kube-scheduler's histogram of FailedNodes and FailedAndUnresolvableNodes.
  std::map<std::string, int> counts;
  for (const auto& [n, why] : out.failed) ++counts[why];
  for (const auto& [n, why] : out.unresolvable) ++counts[why];
  EXPECT_EQ(counts, (std::map<std::string, int>{{"no GPU on this node has 75000 MiB in total", 1},
                                                {"no GPU on this node serves shares (kgpu.io/gpu)", 1},
                                                {"no single GPU with 75000 MiB free", 300}}));
  // n0 has the most free (81920 - 10000 on GPU 0); a node preemption can help on comes first.
  EXPECT_EQ(out.closest_node, "n0");
  EXPECT_EQ(out.closest_why,
            "no single GPU with 75000 MiB free (largest free: 71920 MiB on " + TestGpuUuid("n0", 0) + ")");
  EXPECT_EQ(state.Explain(pod, "n299"),
            "no single GPU with 75000 MiB free (largest free: 71621 MiB on " + TestGpuUuid("n299", 0) + ")");
  EXPECT_EQ(state.Explain(pod, "small"), "no GPU on this node has 75000 MiB in total (largest: 40960 MiB)");
  // Only unresolvable nodes: the nearest of those.
  const auto rest = state.Filter(pod, {"whole", "small"});
  EXPECT_EQ(rest.closest_node, "small");
}

// Drift (facts §7(b)6): a node reports each GPU's memory in use; what exceeds the records'
// bookings there (by the tolerance) belongs to somebody kgpu does not know, and is not placed.
TEST_F(StateTest, MemoryInUseBeyondTheRecordsIsNotPlacedAndIsCounted) {
  state.UpsertNode(Reported(TestNode("share", {ShareGpu(16384), ShareGpu(16384)}), {0, 0}));
  state.UpsertNode(Reported(TestNode("whole", {WholeGpu(), WholeGpu()}), {0, 0}));
  Book(WithUid(TestPod("ns", "a", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}},
                       {{"kgpu.io/gpu-uuid", TestGpuUuid("share", 0)}}),
               "u-a"),
       "share");
  auto st = state.Stats();
  EXPECT_EQ(st.gpus_reporting_usage, 4U);
  EXPECT_EQ(st.gpus_untracked, 0U);
  // The next report: GPU 0 runs pod a (3900 MiB of its 4000) and 10000 MiB of somebody else's;
  // GPU 1 600 MiB of driver and contexts (under the 1024 MiB tolerance); whole GPU 1 a stray
  // 2048 MiB process.
  state.UpsertNode(Reported(TestNode("share", {ShareGpu(16384), ShareGpu(16384)}), {13900, 600}));
  state.UpsertNode(Reported(TestNode("whole", {WholeGpu(), WholeGpu()}), {0, 2048}));
  st = state.Stats();
  EXPECT_EQ(st.gpus_untracked, 2U);
  EXPECT_EQ(st.untracked_mib, 9900 + 2048);
  // 16384 - 4000 booked - 9900 untracked = 2484 MiB free on GPU 0; GPU 1 is free but for 600.
  const json p = WithUid(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}},
                                 {{"kgpu.io/gpu-uuid", TestGpuUuid("share", 0)}}),
                         "u-p");
  auto out = state.Filter(p, {"share"});
  EXPECT_EQ(out.failed.at("share"), "no single GPU with 8000 MiB free");
  EXPECT_EQ(out.closest_why, "no single GPU with 8000 MiB free (largest free: 2484 MiB on " + TestGpuUuid("share", 0) +
                                 "; 9900 MiB of their memory is in use outside kgpu's records)");
  EXPECT_EQ(
      state
          .Filter(WithUid(TestPod("ns", "q", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}}), "u-q"), {"share"})
          .passed,
      std::vector<std::string>{"share"});
  // The whole GPU with a stray process is not handed out.
  auto two = state.Filter(WithUid(TestPod("ns", "w", {{"nvidia.com/gpu", "2"}}), "u-w"), {"whole"});
  EXPECT_EQ(two.failed.at("whole"), "fewer than 2 free GPUs here for a whole-GPU pod");
  EXPECT_EQ(two.closest_why,
            "fewer than 2 free GPUs here for a whole-GPU pod (1 of 2 free; 2048 MiB of their memory is in use outside "
            "kgpu's records)");
  auto one = state.Assume(WithUid(TestPod("ns", "w1", {{"nvidia.com/gpu", "1"}}), "u-w1"), "whole");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->record.containers[0].gpus[0].uuid, TestGpuUuid("whole", 0));
  // The stray process goes: the next report frees the GPU.
  state.UpsertNode(Reported(TestNode("whole", {WholeGpu(), WholeGpu()}), {0, 0}));
  EXPECT_EQ(state.Stats().gpus_untracked, 1U);
  EXPECT_TRUE(state.Filter(WithUid(TestPod("ns", "w2", {{"nvidia.com/gpu", "1"}}), "u-w2"), {"whole"}).passed.size() ==
              1);
}

// kubelet chooses whole GPUs itself, and the node makes each record say what kubelet gave
// (cli/share_handoff.h): swapped devices are corrected one pod after the other, so the first
// corrected record waits for the second without counting as a conflict, and memory in use on a
// device that only the corrected record names stops counting as untracked.
TEST_F(StateTest, RecordsCorrectedToKubeletsDevicesAreBookedWithoutConflicts) {
  auto reported = [](const std::vector<int64_t>& used) {
    return Reported(TestNode("whole", {WholeGpu(), WholeGpu(), WholeGpu(), WholeGpu()}), used);
  };
  state.UpsertNode(reported({0, 0, 0, 0}));
  std::map<std::string, json> pods;
  std::map<std::string, api::AllocationRecord> records;
  for (const char* name : {"a", "b", "c"}) {
    pods[name] = WithUid(TestPod("ns", name, {{"nvidia.com/gpu", "1"}}), std::string("u-") + name);
    auto a = state.Assume(pods[name], "whole");
    ASSERT_TRUE(a.ok()) << a.status();
    state.Confirm(a->uid);
    records[name] = a->record;
    state.UpsertPod(Bound(pods[name], "whole", a->record));
  }
  ASSERT_EQ(records["a"].containers[0].gpus[0].uuid, TestGpuUuid("whole", 0));
  ASSERT_EQ(records["b"].containers[0].gpus[0].uuid, TestGpuUuid("whole", 1));
  ASSERT_EQ(records["c"].containers[0].gpus[0].uuid, TestGpuUuid("whole", 2));
  // kubelet gave a GPU 1, b GPU 0 (swapped) and c GPU 3; their processes use 20000 MiB each.
  state.UpsertNode(reported({20000, 20000, 0, 20000}));
  EXPECT_EQ(state.Stats().gpus_untracked, 1U);  // GPU 3: in use, booked by no record
  auto corrected = [&](const char* name, int gpu) {
    api::AllocationRecord r = records[name];
    r.containers[0].gpus[0].uuid = TestGpuUuid("whole", gpu);
    state.UpsertPod(Bound(pods[name], "whole", r));
  };
  corrected("a", 1);  // GPU 1 is still b's by b's old record: a waits
  EXPECT_EQ(state.Stats().record_conflicts, 0U);
  EXPECT_EQ(state.Stats().records_waiting, 1U);
  // A node report between the two corrections rebooks the node: b's booking stays first.
  state.UpsertNode(reported({20500, 20000, 0, 20000}));
  EXPECT_EQ(state.Stats().record_conflicts, 0U);
  EXPECT_EQ(state.Stats().records_waiting, 1U);
  corrected("b", 0);  // frees GPU 1: a is booked there
  corrected("c", 3);
  const auto st = state.Stats();
  EXPECT_EQ(st.record_conflicts, 0U);
  EXPECT_EQ(st.records_waiting, 0U);
  EXPECT_EQ(st.gpus_untracked, 0U);
  // Exactly GPU 2 is left, and the extender knows it.
  auto two = state.Filter(WithUid(TestPod("ns", "w", {{"nvidia.com/gpu", "2"}}), "u-w"), {"whole"});
  EXPECT_EQ(two.closest_why, "fewer than 2 free GPUs here for a whole-GPU pod (1 of 4 free)");
  auto one = state.Assume(WithUid(TestPod("ns", "d", {{"nvidia.com/gpu", "1"}}), "u-d"), "whole");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->record.containers[0].gpus[0].uuid, TestGpuUuid("whole", 2));
  // A corrected record that names a GPU the node does not have is a stale record, counted as
  // such, not a waiting one.
  corrected("c", 9);
  EXPECT_EQ(state.Stats().bad_records, 1U);
  EXPECT_EQ(state.Stats().records_waiting, 0U);
  corrected("c", 3);
  EXPECT_EQ(state.Stats().booked, 4U);
}

// A restarted extender sees its nodes' reports before the pods: the memory those pods use must
// not stand in the way of booking their records.
TEST_F(StateTest, RecordsAreBookedWhenTheirNodesMemoryReportCameFirst) {
  const json whole = TestNode("whole", {WholeGpu(), WholeGpu()});
  const json share = TestNode("share", {ShareGpu(16384)});
  state.UpsertNode(whole);
  state.UpsertNode(share);
  api::AllocationRecord w, s1, s2;
  auto a = state.Assume(WithUid(TestPod("ns", "w", {{"nvidia.com/gpu", "1"}}), "u-w"), "whole");
  auto b = state.Assume(WithUid(TestPod("ns", "s1", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "9000"}}), "u-s1"),
                        "share");
  auto c = state.Assume(WithUid(TestPod("ns", "s2", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "7000"}}), "u-s2"),
                        "share");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  State fresh;
  ASSERT_TRUE(fresh.Init().ok());
  fresh.UpsertNode(Reported(whole, {30000, 0}));
  fresh.UpsertNode(Reported(share, {15872}));
  EXPECT_EQ(fresh.Stats().gpus_untracked, 2U);  // nothing booked yet
  fresh.UpsertPod(Bound(WithUid(TestPod("ns", "w", {{"nvidia.com/gpu", "1"}}), "u-w"), "whole", a->record));
  fresh.UpsertPod(Bound(WithUid(TestPod("ns", "s1", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "9000"}}), "u-s1"),
                        "share", b->record));
  fresh.UpsertPod(Bound(WithUid(TestPod("ns", "s2", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "7000"}}), "u-s2"),
                        "share", c->record));
  const auto st = fresh.Stats();
  EXPECT_EQ(st.record_conflicts, 0U);
  EXPECT_EQ(st.gpus_untracked, 0U);
  auto two = fresh.Filter(WithUid(TestPod("ns", "x", {{"nvidia.com/gpu", "2"}}), "u-x"), {"whole"});
  EXPECT_EQ(two.closest_why, "fewer than 2 free GPUs here for a whole-GPU pod (1 of 2 free)");
}

TEST_F(StateTest, FilterReasonsSayWhatIsShortAndWhetherPreemptionHelps) {
  state.UpsertNode(TestNode("share", {ShareGpu(16384), ShareGpu(16384)}));
  state.UpsertNode(TestNode("whole", {WholeGpu(), WholeGpu()}));
  state.UpsertNode(TestNode("t4", {ShareGpu(15360, 8, "Tesla T4")}));
  // Fill "share": 10240 MiB on GPU 0 and 12288 MiB on GPU 1 -> 6144 and 4096 free.
  Book(WithUid(TestPod("ns", "a", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10240"}},
                       {{"kgpu.io/gpu-uuid", TestGpuUuid("share", 0)}}),
               "u-a"),
       "share");
  Book(WithUid(TestPod("ns", "b", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "12288"}},
                       {{"kgpu.io/gpu-uuid", TestGpuUuid("share", 1)}}),
               "u-b"),
       "share");
  const json pod = WithUid(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}}), "u-p");
  auto out = state.Filter(pod, {"share", "whole", "t4", "unknown"});
  EXPECT_EQ(out.failed.at("share"), "no single GPU with 8000 MiB free");
  EXPECT_EQ(state.Explain(pod, "share"),
            "no single GPU with 8000 MiB free (largest free: 6144 MiB on " + TestGpuUuid("share", 0) + ")");
  EXPECT_EQ(out.closest_node, "") << "a node passed";
  EXPECT_EQ(out.unresolvable.at("whole"), "no GPU on this node serves shares (kgpu.io/gpu)");
  EXPECT_EQ(out.unresolvable.at("unknown"),
            "node has no kgpu.io/gpu-inventory annotation (run kgpu node-labels on it)");
  EXPECT_EQ(out.passed, std::vector<std::string>{"t4"});
  EXPECT_EQ(out.reasons.at("memory"), 1);
  // A share larger than any GPU: unresolvable, preemption cannot help.
  auto big = state.Filter(
      WithUid(TestPod("ns", "big", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "20000"}}), "u-big"), {"share"});
  EXPECT_EQ(big.unresolvable.at("share"), "no GPU on this node has 20000 MiB in total");
  EXPECT_EQ(big.closest_why, "no GPU on this node has 20000 MiB in total (largest: 16384 MiB)");
  // Models: the pod's list against what the node has.
  auto a100 = state.Filter(WithUid(TestPod("ns", "m", {{"kgpu.io/gpu", "1"}}, {{"kgpu.io/gpu-model", "A100"}}), "u-m"),
                           {"t4", "share"});
  EXPECT_EQ(a100.unresolvable.at("t4"), "no GPU of the pod's models here");
  EXPECT_EQ(
      state.Explain(WithUid(TestPod("ns", "m", {{"kgpu.io/gpu", "1"}}, {{"kgpu.io/gpu-model", "A100"}}), "u-m"), "t4"),
      "no GPU of the pod's models here (this node has: Tesla T4)");
  EXPECT_EQ(a100.passed, std::vector<std::string>{"share"});
  auto none =
      state.Filter(WithUid(TestPod("ns", "h", {{"kgpu.io/gpu", "1"}}, {{"kgpu.io/gpu-model", "H100"}}), "u-h"), {"t4"});
  EXPECT_EQ(none.unresolvable.at("t4"),
            "no GPU in the cluster that serves shares (kgpu.io/gpu) matches the pod's models (H100; models here: "
            "NVIDIA A100-SXM4-80GB, Tesla T4)");
  // Cores.
  auto cores = state.Filter(WithUid(TestPod("ns", "c", {{"kgpu.io/gpu", "2"}, {"kgpu.io/gpu-cores", "200"}}), "u-c"),
                            {"share", "t4"});
  EXPECT_EQ(cores.unresolvable.at("t4"), "fewer than 2 GPUs on this node serve shares (kgpu.io/gpu)");
  EXPECT_EQ(cores.passed, std::vector<std::string>{"share"}) << "memory shares take no cores";
  // Privileged share: refused everywhere.
  json priv = WithUid(TestPod("ns", "priv", {{"kgpu.io/gpu", "1"}}), "u-priv");
  priv["spec"]["containers"][0]["securityContext"]["privileged"] = true;
  EXPECT_NE(state.Filter(priv, {"t4"}).unresolvable.at("t4").find("is privileged"), std::string::npos);
  // Enforcement the node does not permit.
  state.UpsertNode(TestNode("strict", {ShareGpu(81920, 4)}, {}, {"hard"}));
  auto mps = state.Filter(WithUid(TestPod("ns", "x", {{"kgpu.io/gpu", "1"}}, {{"kgpu.io/enforcement", "none"}}), "u-x"),
                          {"strict"});
  EXPECT_EQ(mps.unresolvable.at("strict"), "enforcement 'none' is not permitted on this node");
  EXPECT_EQ(mps.closest_why, "enforcement 'none' is not permitted on this node (it permits: hard)");
}

TEST_F(StateTest, WholeMigAndUuidLists) {
  state.UpsertNode(TestNode("dgx", {WholeGpu(), WholeGpu(), WholeGpu(), WholeGpu()}, {{2, 3}}));
  state.UpsertNode(TestNode("mig", {MigGpu({"3g.40gb", "1g.10gb", "1g.10gb"})}));
  // Two whole GPUs go to the NVLink pair, not to 0 and 1 (no link).
  auto a = state.Assume(WithUid(TestPod("ns", "w2", {{"nvidia.com/gpu", "2"}}), "u-w2"), "dgx");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->record.containers[0].gpus.size(), 2u);
  EXPECT_EQ(a->record.containers[0].resource, "nvidia.com/gpu");
  EXPECT_EQ(a->record.containers[0].gpus[0].uuid, TestGpuUuid("dgx", 2));
  EXPECT_EQ(a->record.containers[0].gpus[1].uuid, TestGpuUuid("dgx", 3));
  auto three = state.Filter(WithUid(TestPod("ns", "w3", {{"nvidia.com/gpu", "3"}}), "u-w3"), {"dgx", "mig"});
  EXPECT_EQ(three.failed.at("dgx"), "fewer than 3 free GPUs here for a whole-GPU pod");
  EXPECT_EQ(three.unresolvable.at("mig"), "fewer than 3 GPUs on this node serve whole-GPU pods (nvidia.com/gpu)");
  EXPECT_EQ(three.closest_node, "dgx") << "preemption can help there";
  EXPECT_EQ(three.closest_why, "fewer than 3 free GPUs here for a whole-GPU pod (2 of 4 free)");
  // MIG: the instance with the profile; then every one in use.
  auto m1 = state.Assume(WithUid(TestPod("ns", "m1", {{"nvidia.com/mig-1g.10gb", "1"}}), "u-m1"), "mig");
  ASSERT_TRUE(m1.ok()) << m1.status();
  EXPECT_EQ(m1->record.containers[0].gpus[0].profile, "1g.10gb");
  EXPECT_EQ(m1->record.containers[0].gpus[0].uuid, TestGpuUuid("mig", 0));
  EXPECT_TRUE(m1->record.containers[0].gpus[0].mig.rfind("MIG-mig-0-", 0) == 0);
  ASSERT_TRUE(state.Assume(WithUid(TestPod("ns", "m2", {{"nvidia.com/mig-1g.10gb", "1"}}), "u-m2"), "mig").ok());
  auto m3 = state.Filter(WithUid(TestPod("ns", "m3", {{"nvidia.com/mig-1g.10gb", "1"}}), "u-m3"), {"mig", "dgx"});
  EXPECT_EQ(m3.failed.at("mig"), "every MIG 1g.10gb instance here is in use");
  EXPECT_EQ(m3.closest_why, "every MIG 1g.10gb instance here is in use (2 of 2 in use)");
  EXPECT_EQ(m3.unresolvable.at("dgx"), "no GPU on this node is in MIG mode");
  auto p7 = state.Filter(WithUid(TestPod("ns", "m7", {{"nvidia.com/mig-7g.80gb", "1"}}), "u-m7"), {"mig"});
  EXPECT_EQ(p7.unresolvable.at("mig"), "no MIG 7g.80gb instance on this node");
  EXPECT_EQ(p7.closest_why, "no MIG 7g.80gb instance on this node (it has: 1g.10gb x2, 3g.40gb x1)");
  // A node whose plugin runs migStrategy single (MIG devices as nvidia.com/gpu) says so instead of
  // claiming it has no GPUs.
  json single = TestNode("single", {MigGpu({"1g.10gb", "1g.10gb"})});
  json inv = json::parse(single["metadata"]["annotations"]["kgpu.io/gpu-inventory"].get<std::string>());
  inv["migStrategy"] = "single";
  single["metadata"]["annotations"]["kgpu.io/gpu-inventory"] = inv.dump();
  state.UpsertNode(single);
  auto on_single = state.Filter(WithUid(TestPod("ns", "s1", {{"nvidia.com/gpu", "1"}}), "u-s1"), {"single", "dgx"});
  EXPECT_EQ(
      on_single.unresolvable.at("single"),
      "this node's device plugin runs migStrategy single (its MIG devices are nvidia.com/gpu), which kgpu extender "
      "does not place; run it with migStrategy mixed (nvidia.com/mig-<profile>)");
  EXPECT_EQ(on_single.passed, std::vector<std::string>{"dgx"});
  // UUID allow list: only GPU 1; deny list: not GPU 0.
  auto only1 = state.Assume(
      WithUid(TestPod("ns", "u1", {{"nvidia.com/gpu", "1"}}, {{"kgpu.io/gpu-uuid", TestGpuUuid("dgx", 1)}}), "u-u1"),
      "dgx");
  ASSERT_TRUE(only1.ok()) << only1.status();
  EXPECT_EQ(only1->record.containers[0].gpus[0].uuid, TestGpuUuid("dgx", 1));
  auto deny = state.Filter(
      WithUid(TestPod("ns", "d", {{"nvidia.com/gpu", "1"}}, {{"kgpu.io/gpu-uuid-deny", TestGpuUuid("dgx", 0)}}), "u-d"),
      {"dgx"});
  EXPECT_EQ(deny.closest_why, "no free GPU here for a whole-GPU pod (0 of 3 free)")
      << "GPU 0 is free but denied; 1..3 are taken";
  auto only0 = state.Filter(
      WithUid(TestPod("ns", "o", {{"nvidia.com/gpu", "2"}}, {{"kgpu.io/gpu-uuid", TestGpuUuid("dgx", 0)}}), "u-o"),
      {"dgx"});
  EXPECT_EQ(only0.closest_why, "the pod's GPU UUID lists leave fewer than 2 GPUs on this node (1 left)");
}

// NVIDIA names the media-extension profiles "1g.10gb+me"; '+' is not allowed in a resource name,
// so the plugin advertises them as nvidia.com/mig-1g.10gb.me (api::MigResourceName). The
// extender reads a pod's resource back by the same rule: the pod gets the +me instance, the
// record names NVML's profile and the plugin's resource, and quota counts it under the resource.
TEST_F(StateTest, MediaExtensionMigProfilesArePlacedByTheirResourceName) {
  state.UpsertNode(TestNode("mig", {MigGpu({"1g.10gb+me", "1g.10gb", "1g.10gb"})}));
  const json pod = WithUid(TestPod("ns", "me", {{"nvidia.com/mig-1g.10gb.me", "1"}}), "u-me");
  EXPECT_EQ(state.Filter(pod, {"mig"}).passed, std::vector<std::string>{"mig"});
  auto a = state.Assume(pod, "mig");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->record.containers[0].resource, "nvidia.com/mig-1g.10gb.me");
  EXPECT_EQ(a->record.containers[0].gpus[0].profile, "1g.10gb+me");
  EXPECT_EQ(a->record.containers[0].gpus[0].mig, "MIG-mig-0-0");
  // The only +me instance is taken: the next one is refused, the plain 1g.10gb still fits.
  EXPECT_EQ(state.Filter(WithUid(TestPod("ns", "me2", {{"nvidia.com/mig-1g.10gb.me", "1"}}), "u-me2"), {"mig"})
                .failed.at("mig"),
            "every MIG 1g.10gb.me instance here is in use");
  EXPECT_EQ(state.Filter(WithUid(TestPod("ns", "plain", {{"nvidia.com/mig-1g.10gb", "1"}}), "u-plain"), {"mig"}).passed,
            std::vector<std::string>{"mig"});
  // A restarted extender books the +me instance again from the record.
  State fresh;
  ASSERT_TRUE(fresh.Init().ok());
  fresh.UpsertNode(TestNode("mig", {MigGpu({"1g.10gb+me", "1g.10gb", "1g.10gb"})}));
  fresh.UpsertPod(Bound(pod, "mig", a->record));
  EXPECT_EQ(fresh.Stats().booked, 1u);
  EXPECT_EQ(fresh.Stats().record_conflicts, 0u);
  EXPECT_TRUE(fresh.Filter(WithUid(TestPod("ns", "me3", {{"nvidia.com/mig-1g.10gb.me", "1"}}), "u-me3"), {"mig"})
                  .passed.empty());
  EXPECT_EQ(api::MigResourceName("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
  EXPECT_EQ(api::MigResourceName("1g.20gb+me.all"), "nvidia.com/mig-1g.20gb.me.all");
  EXPECT_EQ(api::MigResourceName("3g.40gb"), "nvidia.com/mig-3g.40gb");
}

// A GPU in MIG mode is never given whole (kubelet has no nvidia.com/gpu device for it), however
// idle its instances are: a whole-GPU pod takes the node's other GPUs, and the MIG instances stay
// free for MIG pods. (Seen in the demo cluster: a 2-GPU pod booked both MIG GPUs of an A100 node,
// after which every MIG instance read as in use.)
TEST_F(StateTest, WholePodsNeverTakeMigModeGpus) {
  state.UpsertNode(
      TestNode("mig", {MigGpu({"3g.40gb", "1g.10gb"}), MigGpu({"3g.40gb", "1g.10gb"}), WholeGpu(), WholeGpu()}));
  auto w = state.Assume(WithUid(TestPod("ns", "w", {{"nvidia.com/gpu", "2"}}), "u-w"), "mig");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->record.containers[0].gpus.size(), 2u);
  EXPECT_EQ(w->record.containers[0].gpus[0].uuid, TestGpuUuid("mig", 2));
  EXPECT_EQ(w->record.containers[0].gpus[1].uuid, TestGpuUuid("mig", 3));
  auto three = state.Filter(WithUid(TestPod("ns", "w3", {{"nvidia.com/gpu", "3"}}), "u-w3"), {"mig"});
  EXPECT_EQ(three.closest_why, "fewer than 3 GPUs on this node serve whole-GPU pods (nvidia.com/gpu) (it has 2)");
  for (int i = 0; i < 2; ++i) {
    auto m = state.Assume(
        WithUid(TestPod("ns", "m" + std::to_string(i), {{"nvidia.com/mig-3g.40gb", "1"}}), "u-m" + std::to_string(i)),
        "mig");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->record.containers[0].gpus[0].profile, "3g.40gb");
  }
  auto none = state.Filter(
      WithUid(TestPod("ns", "x", {{"nvidia.com/mig-1g.10gb", "1"}}, {{"kgpu.io/gpu-model", "H100"}}), "u-x"), {"mig"});
  EXPECT_EQ(none.unresolvable.at("mig"),
            "no GPU in the cluster that is in MIG mode (nvidia.com/mig-*) matches the pod's models (H100; models here: "
            "NVIDIA A100-SXM4-80GB)");
}

TEST_F(StateTest, ConcurrentAssumesNeverDoubleBookAGpu) {
  state.UpsertNode(TestNode("n", {ShareGpu(16000), ShareGpu(16000)}));
  // 16 pods of 4000 MiB on 2 GPUs of 16000: exactly 8 fit, 4 per GPU, whatever the interleaving.
  std::vector<std::thread> threads;
  std::mutex mu;
  std::map<std::string, int64_t> per_gpu;
  int ok = 0;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      const std::string name = "p" + std::to_string(i);
      auto a = state.Assume(
          WithUid(TestPod("ns", name, {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}}), "u" + name), "n");
      if (!a.ok()) return;
      std::lock_guard lock(mu);
      ++ok;
      per_gpu[a->record.containers[0].gpus[0].uuid] += a->record.containers[0].gpus[0].memory_mib;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 8);
  for (const auto& [uuid, mib] : per_gpu) EXPECT_LE(mib, 16000) << uuid;
}

TEST_F(StateTest, RebuildsFromRecordsAndCountsConflicts) {
  const json node = TestNode("n", {ShareGpu(16000), ShareGpu(16000)});
  state.UpsertNode(node);
  std::vector<json> bound;
  for (int i = 0; i < 3; ++i) {
    const json pod =
        WithUid(TestPod("ns", "p" + std::to_string(i), {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "6000"}}),
                "u" + std::to_string(i));
    auto a = state.Assume(pod, "n");
    ASSERT_TRUE(a.ok()) << a.status();
    bound.push_back(Bound(pod, "n", a->record));
  }
  // A fresh extender: pods first (their node is not known yet), then the node.
  State fresh;
  ASSERT_TRUE(fresh.Init().ok());
  for (const auto& p : bound) fresh.UpsertPod(p);
  EXPECT_EQ(fresh.Stats().booked, 0u);
  fresh.UpsertNode(node);
  EXPECT_EQ(fresh.Stats().booked, 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(*fresh.RecordOf("u" + std::to_string(i)), *state.RecordOf("u" + std::to_string(i)));
  // Same decisions afterwards: a 6000 MiB pod fits (one GPU has 10000 free), a 12000 one does not.
  EXPECT_EQ(
      fresh.Filter(WithUid(TestPod("ns", "q", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "6000"}}), "uq"), {"n"})
          .passed.size(),
      1u);
  EXPECT_EQ(
      fresh.Filter(WithUid(TestPod("ns", "r", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "12000"}}), "ur"), {"n"})
          .failed.size(),
      1u);
  // A record that claims capacity another one holds is not booked, and counted.
  api::AllocationRecord clash = *fresh.RecordOf("u0");
  clash.containers[0].gpus[0].memory_mib = 16000;
  json dup = Bound(WithUid(TestPod("ns", "dup", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "16000"}}), "u-dup"), "n",
                   clash);
  fresh.UpsertPod(dup);
  EXPECT_EQ(fresh.Stats().record_conflicts, 1u);
  EXPECT_FALSE(fresh.RecordOf("u-dup").has_value());
  // Deleting a pod frees its GPU; a record for another node is ignored.
  fresh.RemovePod(bound[0]);
  EXPECT_FALSE(fresh.RecordOf("u0").has_value());
  json wrong = bound[1];
  wrong["spec"]["nodeName"] = "elsewhere";
  fresh.UpsertPod(wrong);
  EXPECT_FALSE(fresh.RecordOf("u1").has_value());
  EXPECT_GE(fresh.Stats().bad_records, 1u);
}

TEST_F(StateTest, ForgetDropsAnAssumptionThatNeverBound) {
  state.UpsertNode(TestNode("n", {WholeGpu()}));
  const json pod = WithUid(TestPod("ns", "w", {{"nvidia.com/gpu", "1"}}), "uw");
  ASSERT_TRUE(state.Assume(pod, "n").ok());
  EXPECT_EQ(state.Filter(WithUid(TestPod("ns", "w2", {{"nvidia.com/gpu", "1"}}), "uw2"), {"n"}).failed.size(), 1u);
  // The informer sees the record written but no binding (our bind is still in flight): kept.
  json pending = pod;
  pending["metadata"]["annotations"][kAnnotationAllocation] = api::EncodeRecord(*state.RecordOf("uw"));
  state.UpsertPod(pending);
  EXPECT_TRUE(state.RecordOf("uw").has_value());
  state.Forget("uw");
  EXPECT_FALSE(state.RecordOf("uw").has_value());
  // The stale record on the unbound pod books nothing.
  state.UpsertPod(pending);
  EXPECT_FALSE(state.RecordOf("uw").has_value());
  EXPECT_EQ(state.Filter(WithUid(TestPod("ns", "w2", {{"nvidia.com/gpu", "1"}}), "uw2"), {"n"}).passed.size(), 1u);
}

// The watch delivers events after the verbs that caused them: the record write (pod unbound, with
// the record) and even the pod's creation (no record) can arrive after our binding was confirmed.
// Neither may free the GPUs of the bound pod: a concurrent bind would take them (seen as 17 share
// holders of a 16-slot GPU and record conflicts in the end-to-end test).
TEST_F(StateTest, LateUnboundEventsKeepAConfirmedBooking) {
  state.UpsertNode(TestNode("n", {ShareGpu(16000)}));
  const json pod = WithUid(TestPod("ns", "a", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "12000"}}), "ua");
  auto a = state.Assume(pod, "n");
  ASSERT_TRUE(a.ok()) << a.status();
  state.Confirm(a->uid);
  json written = pod;
  written["metadata"]["annotations"][kAnnotationAllocation] = api::EncodeRecord(a->record);
  const json other = WithUid(TestPod("ns", "b", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "12000"}}), "ub");
  for (const json& late : {written, pod}) {
    state.UpsertPod(late);
    EXPECT_TRUE(state.RecordOf("ua").has_value()) << late.dump();
    EXPECT_EQ(state.Filter(other, {"n"}).failed.size(), 1u) << "the GPU's 12000 MiB must stay booked";
    EXPECT_FALSE(state.Assume(other, "n").ok());
  }
  // The binding's own event, then the pod's end, still act.
  state.UpsertPod(Bound(pod, "n", a->record));
  EXPECT_TRUE(state.RecordOf("ua").has_value());
  EXPECT_EQ(state.Stats().record_conflicts, 0u);
  json done = Bound(pod, "n", a->record);
  done["status"]["phase"] = "Succeeded";
  state.UpsertPod(done);
  EXPECT_FALSE(state.RecordOf("ua").has_value());
  EXPECT_TRUE(state.Assume(other, "n").ok());
}

TEST_F(StateTest, PrioritizeScoresFeasibleNodesZeroToTen) {
  state.UpsertNode(TestNode("busy", {ShareGpu(16000)}));
  state.UpsertNode(TestNode("idle", {ShareGpu(16000)}));
  state.UpsertNode(TestNode("whole", {WholeGpu()}));
  Book(WithUid(TestPod("ns", "a", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}, {"kgpu.io/gpu-cores", "20"}}),
               "ua"),
       "busy");
  const json pod = WithUid(
      TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}, {"kgpu.io/gpu-cores", "20"}}), "up");
  auto scores = state.Prioritize(pod, {"busy", "idle", "whole"});
  ASSERT_EQ(scores.size(), 3u);
  std::map<std::string, int64_t> by;
  for (const auto& h : scores) {
    EXPECT_GE(h.score, 0);
    EXPECT_LE(h.score, 10);
    by[h.host] = h.score;
  }
  EXPECT_EQ(by["whole"], 0) << "infeasible";
  auto binpack = state.Prioritize(
      WithUid(TestPod("ns", "b", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}, {"kgpu.io/gpu-cores", "20"}},
                      {{"kgpu.io/placement", "binpack"}}),
              "ub"),
      {"busy", "idle"});
  EXPECT_GT(binpack[0].score, binpack[1].score) << "binpack prefers the used GPU";
  auto spread = state.Prioritize(
      WithUid(TestPod("ns", "s", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}, {"kgpu.io/gpu-cores", "20"}},
                      {{"kgpu.io/placement", "spread"}}),
              "us"),
      {"busy", "idle"});
  EXPECT_GT(spread[1].score, spread[0].score) << "spread prefers the idle node";
}

// Two nodes that fit a 2-whole-GPU pod with the same fragmentation: the policy's tie-break (fewer
// GPUs left, which keeps the 8-GPU node whole for an 8-GPU pod) reaches kube-scheduler as the only
// 10, where both used to score 10 and kube-scheduler picked one at random.
TEST_F(StateTest, PrioritizeGivesThePolicysTieBreakToKubeScheduler) {
  state.UpsertNode(TestNode("eight", std::vector<kgpu::testing::TestGpu>(8, WholeGpu())));
  state.UpsertNode(TestNode("four", std::vector<kgpu::testing::TestGpu>(4, WholeGpu())));
  const json pod = WithUid(TestPod("ns", "train", {{"nvidia.com/gpu", "2"}}), "ut");
  for (const auto& order : {std::vector<std::string>{"eight", "four"}, std::vector<std::string>{"four", "eight"}}) {
    std::map<std::string, int64_t> by;
    for (const auto& h : state.Prioritize(pod, order)) by[h.host] = h.score;
    EXPECT_EQ(by["four"], 10);
    EXPECT_LT(by["eight"], 10);
    EXPECT_GE(by["eight"], 0);
  }
}

// A pod with several GPU containers: a sidecar, two app containers (a share and a whole GPU) and
// an init container that runs on its target's share. Each placed container books its own GPUs,
// the record names them in the pod's order, a fresh extender rebuilds the same bookings, and a
// refusal names the container that does not fit.
TEST_F(StateTest, SeveralGpuContainersArePlacedTogetherAndRebuilt) {
  const json node = TestNode("mix", {ShareGpu(16000), ShareGpu(16000), WholeGpu(), WholeGpu()});
  state.UpsertNode(node);
  json pod = WithUid(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}}), "u-p");
  pod = WithContainer(pod, "containers", "side", {{"nvidia.com/gpu", "1"}});
  pod = WithContainer(pod, "initContainers", "proxy", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "6000"}}, true);
  pod = WithContainer(pod, "initContainers", "warmup", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}});
  auto a = state.Assume(pod, "mix");
  ASSERT_TRUE(a.ok()) << a.status();
  state.Confirm(a->uid);
  ASSERT_EQ(a->record.containers.size(), 3u) << "warmup runs on main's share: no entry of its own";
  EXPECT_EQ(a->record.containers[0].name, "proxy");
  EXPECT_EQ(a->record.containers[1].name, "main");
  EXPECT_EQ(a->record.containers[2].name, "side");
  EXPECT_EQ(a->record.containers[0].gpus.at(0).memory_mib, 6000);
  EXPECT_EQ(a->record.containers[1].gpus.at(0).memory_mib, 8000);
  EXPECT_EQ(a->record.containers[2].resource, "nvidia.com/gpu");
  const std::string whole = a->record.containers[2].gpus.at(0).uuid;
  EXPECT_TRUE(whole == TestGpuUuid("mix", 2) || whole == TestGpuUuid("mix", 3)) << whole;
  for (int i : {0, 1}) {
    const std::string share = a->record.containers[static_cast<size_t>(i)].gpus.at(0).uuid;
    EXPECT_TRUE(share == TestGpuUuid("mix", 0) || share == TestGpuUuid("mix", 1)) << share;
  }
  // 18000 MiB of shares left on two GPUs, one whole GPU: two containers of 10000 MiB do not fit
  // together (only one GPU can have 10000 free), and the refusal names the second one.
  json two = WithUid(TestPod("ns", "q", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}}), "u-q");
  two = WithContainer(two, "containers", "b", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}});
  auto f = state.Filter(two, {"mix"});
  ASSERT_EQ(f.passed.size(), 0u);
  EXPECT_EQ(f.failed.at("mix"),
            "container b: no single GPU with 10000 MiB free (with the pod's other GPU containers placed)");
  EXPECT_EQ(f.closest_why.rfind("container b: no single GPU with 10000 MiB free (with the pod's other GPU containers "
                                "placed) (largest free: ",
                                0),
            0u)
      << f.closest_why;
  json wide = WithUid(TestPod("ns", "w", {{"nvidia.com/gpu", "1"}}), "u-w");
  wide = WithContainer(wide, "containers", "b", {{"nvidia.com/gpu", "2"}});
  EXPECT_EQ(state.Filter(wide, {"mix"}).unresolvable.at("mix"),
            "fewer than 3 GPUs on this node serve whole-GPU pods (nvidia.com/gpu), which the pod's containers ask for "
            "together");
  json fits = WithUid(TestPod("ns", "s", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}}), "u-s");
  fits = WithContainer(fits, "containers", "b", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}});
  EXPECT_EQ(state.Filter(fits, {"mix"}).passed.size(), 1u);
  const auto scores = state.Prioritize(fits, {"mix"});
  ASSERT_EQ(scores.size(), 1u);
  EXPECT_EQ(scores[0].score, 10);
  // A fresh extender books the same GPUs from the record.
  State fresh;
  ASSERT_TRUE(fresh.Init().ok());
  fresh.UpsertNode(node);
  fresh.UpsertPod(Bound(pod, "mix", a->record));
  EXPECT_EQ(fresh.Stats().booked, 1u);
  EXPECT_EQ(fresh.Stats().record_conflicts, 0u);
  EXPECT_EQ(*fresh.RecordOf("u-p"), a->record);
  EXPECT_EQ(fresh.Filter(WithUid(TestPod("ns", "w2", {{"nvidia.com/gpu", "2"}}), "u-w2"), {"mix"}).closest_why,
            "fewer than 2 free GPUs here for a whole-GPU pod (1 of 2 free)");
  // Gone: every container's GPUs come back.
  fresh.RemovePod(pod);
  EXPECT_EQ(fresh.Filter(wide, {"mix"}).unresolvable.at("mix"),
            "fewer than 3 GPUs on this node serve whole-GPU pods (nvidia.com/gpu), which the pod's containers ask for "
            "together");
  EXPECT_EQ(fresh.Filter(WithUid(TestPod("ns", "w2", {{"nvidia.com/gpu", "2"}}), "u-w2"), {"mix"}).passed.size(), 1u);
}

// Placed one after the other where the policy puts each, one container may take the only GPU
// that fits another; filter and bind then search for an arrangement that fits. Here only main on
// the 8000 MiB GPU and b on the 16000 MiB one do, whatever the policy would pick for main first.
TEST_F(StateTest, SeveralGpuContainersFindTheArrangementThatFits) {
  for (const std::string placement : {"spread", "binpack", ""}) {
    State st;
    ASSERT_TRUE(st.Init().ok());
    st.UpsertNode(TestNode("m", {ShareGpu(16000), ShareGpu(8000)}));
    std::map<std::string, std::string> ann;
    if (!placement.empty()) ann["kgpu.io/placement"] = placement;
    json pod = WithUid(
        TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}, {"kgpu.io/gpu-cores", "50"}}, ann),
        "u-p");
    pod = WithContainer(pod, "containers", "b",
                        {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "12000"}, {"kgpu.io/gpu-cores", "10"}});
    const auto f = st.Filter(pod, {"m"});
    EXPECT_EQ(f.passed.size(), 1u) << placement << ": " << (f.failed.empty() ? "" : f.failed.begin()->second);
    EXPECT_EQ(st.Stats().booked, 0u);
    auto a = st.Assume(pod, "m");
    ASSERT_TRUE(a.ok()) << placement << ": " << a.status();
    ASSERT_EQ(a->record.containers.size(), 2u);
    EXPECT_EQ(a->record.containers[0].name, "main");
    EXPECT_EQ(a->record.containers[0].gpus.at(0).uuid, TestGpuUuid("m", 1)) << placement;
    EXPECT_EQ(a->record.containers[1].gpus.at(0).uuid, TestGpuUuid("m", 0)) << placement;
    // Full now: a third container of any size finds nothing, and says which.
    json more = WithUid(TestPod("ns", "q", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}}), "u-q");
    more = WithContainer(more, "containers", "b", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}});
    EXPECT_EQ(st.Filter(more, {"m"}).passed.size(), 0u);
  }
}

// Trials leave nothing behind (the same pod filtered and scored again, then bound), UUID lists
// hold for every container, preemption counts every container, and a privileged init container
// with a share is refused like any other.
TEST_F(StateTest, SeveralGpuContainersTrialsUuidListsAndPreemption) {
  state.UpsertNode(TestNode("a", {ShareGpu(16000), ShareGpu(16000)}));
  auto two = [](const std::string& name, const std::string& mib, const std::map<std::string, std::string>& ann = {}) {
    json p = WithUid(TestPod("ns", name, {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", mib}}, ann, 1000), "u-" + name);
    return WithContainer(p, "containers", "b", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", mib}});
  };
  const json pod = two("p", "9000");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(state.Filter(pod, {"a"}).passed.size(), 1u) << i;
    EXPECT_EQ(state.Prioritize(pod, {"a"}).size(), 1u);
  }
  EXPECT_EQ(state.Stats().booked, 0u);
  auto a = state.Assume(pod, "a");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->record.containers.size(), 2u);
  EXPECT_NE(a->record.containers[0].gpus[0].uuid, a->record.containers[1].gpus[0].uuid) << "9000 + 9000 > 16000";
  state.Confirm(a->uid);
  state.RemovePod(pod);
  // Both containers held to one GPU by the pod's UUID list: 2 x 9000 do not fit there, 2 x 8000 do.
  const std::map<std::string, std::string> only0 = {{"kgpu.io/gpu-uuid", TestGpuUuid("a", 0)}};
  EXPECT_EQ(state.Filter(two("q", "9000", only0), {"a"}).failed.at("a").rfind("container b: ", 0), 0u);
  auto q = state.Assume(two("r", "8000", only0), "a");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->record.containers[0].gpus[0].uuid, TestGpuUuid("a", 0));
  EXPECT_EQ(q->record.containers[1].gpus[0].uuid, TestGpuUuid("a", 0));
  state.Confirm(q->uid);
  // Preemption: r fills GPU 0; a 12000 + 12000 pod needs both GPUs empty: r is a sufficient victim
  // only if it frees GPU 0 (it does), and no victims leave it short.
  const json big = two("big", "12000");
  EXPECT_EQ(state.Filter(big, {"a"}).failed.size(), 1u);
  EXPECT_TRUE(state.Preempt(big, {{"a", {{"u-r"}, 0}}}).contains("a"));
  EXPECT_FALSE(state.Preempt(big, {{"a", {{"nobody"}, 0}}}).contains("a"));
  EXPECT_TRUE(state.RecordOf("u-r").has_value()) << "the victims are booked again";
  // A privileged init container on its target's share sees every GPU: refused.
  json priv = WithUid(TestPod("ns", "priv", {{"kgpu.io/gpu", "1"}}), "u-priv");
  priv = WithContainer(priv, "initContainers", "warm", {{"kgpu.io/gpu", "1"}});
  priv["spec"]["initContainers"][0]["securityContext"] = {{"privileged", true}};
  EXPECT_EQ(
      state.Filter(priv, {"a"}).unresolvable.at("a"),
      "init container warm is privileged: a privileged container sees every GPU of the node, so a share cannot be "
      "enforced (drop privileged, or ask for whole GPUs with nvidia.com/gpu)");
}

TEST_F(StateTest, PreemptKeepsOnlyNodesWhereTheVictimsMakeRoom) {
  state.UpsertNode(TestNode("a", {ShareGpu(16000)}));
  state.UpsertNode(TestNode("b", {ShareGpu(16000)}));
  state.UpsertNode(TestNode("c", {ShareGpu(8000)}));
  Book(WithUid(TestPod("ns", "a1", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "12000"}}), "ua1"), "a");
  Book(WithUid(TestPod("ns", "b1", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "6000"}}), "ub1"), "b");
  Book(WithUid(TestPod("ns", "b2", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "6000"}}), "ub2"), "b");
  const json pod =
      WithUid(TestPod("ns", "hi", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}}, {}, 1000), "uhi");
  std::map<std::string, MetaVictims> in = {
      {"a", {{"ua1"}, 0}},       // removing a1 frees 12000: fits
      {"b", {{"ub1"}, 0}},       // removing only b1 leaves 10000 - 6000 = ... 4000+6000 = 10000 free: fits
      {"c", {{"whatever"}, 0}},  // 8000 MiB GPU: never fits
  };
  auto out = state.Preempt(pod, in);
  EXPECT_TRUE(out.contains("a"));
  EXPECT_TRUE(out.contains("b"));
  EXPECT_FALSE(out.contains("c"));
  EXPECT_EQ(out.at("a").pod_uids, std::vector<std::string>{"ua1"});
  // The victims are still booked afterwards.
  EXPECT_TRUE(state.RecordOf("ua1").has_value());
  EXPECT_EQ(state.Filter(pod, {"a", "b"}).failed.size(), 2u);
  // A victim set that does not free enough drops the node.
  const json bigger =
      WithUid(TestPod("ns", "hi2", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "14000"}}, {}, 1000), "uhi2");
  EXPECT_FALSE(state.Preempt(bigger, {{"b", {{"ub1"}, 0}}}).contains("b"));
  EXPECT_TRUE(state.Preempt(bigger, {{"b", {{"ub1", "ub2"}, 0}}}).contains("b"));
}

// The extender's own preemption, for what kube-scheduler's cannot see (share memory): victims
// chosen as DefaultPreemption chooses them, the node held for the preemptor.
TEST_F(StateTest, PlanPreemptionPicksTheFewestLowestPriorityVictimsAndHoldsTheNode) {
  state.UpsertNode(TestNode("a", {ShareGpu(16000)}));
  state.UpsertNode(TestNode("b", {ShareGpu(16000)}));
  Run(Share("a1", "6000", 10), "a");
  Run(Share("a2", "6000", 10), "a");
  Run(Share("a3", "2000", 500), "a");  // a: 2000 MiB free
  Run(Share("b1", "12000", 500), "b");
  Run(Share("b2", "2000", 10), "b");  // b: 2000 MiB free
  const json hi = Share("hi", "8000", 1000);
  ASSERT_TRUE(state.Filter(hi, {"a", "b"}).passed.empty());
  // a: a3 (500) is reprieved first, then a1; a2 must go. b: b1 (500) must go. The lower highest
  // victim priority wins: a, with one victim.
  auto plan = state.PlanPreemption(hi, {"a", "b"});
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->node, "a");
  ASSERT_EQ(plan->victims.size(), 1u);
  EXPECT_EQ(plan->victims[0].name, "a2");
  EXPECT_EQ(plan->victims[0].priority, 10);
  EXPECT_EQ(plan->name, "hi");
  EXPECT_EQ(plan->priority, 1000);
  // Nothing was unbooked by the trial.
  EXPECT_EQ(state.Stats().booked, 5u);
  EXPECT_EQ(state.PreemptingOn("uhi"), "a");
  // Under way: no second plan, and kube-scheduler's preempt gets no node for it.
  EXPECT_FALSE(state.PlanPreemption(hi, {"a", "b"}).has_value());
  EXPECT_TRUE(state.Preempt(hi, {{"b", {{"ub1"}, 0}}}).empty());
  // The node is held against GPU pods of lower or equal priority, not against higher ones.
  auto low = state.Filter(Share("low", "1000", 10), {"a", "b"});
  EXPECT_EQ(low.passed, std::vector<std::string>{"b"});
  EXPECT_EQ(low.failed.at("a"),
            "the node's GPUs are held for a pod of higher or equal priority that is preempting lower-priority pods "
            "here");
  EXPECT_EQ(state.Explain(Share("low", "1000", 10), "a"), low.failed.at("a") + " (pod ns/hi, priority 1000)");
  EXPECT_EQ(low.reasons.at("held"), 1);
  EXPECT_EQ(state.Filter(Share("same", "1000", 1000), {"a"}).passed.size(), 0u);
  EXPECT_EQ(state.Filter(Share("higher", "1000", 2000), {"a"}).passed, std::vector<std::string>{"a"});
  EXPECT_FALSE(state.Assume(Share("low2", "1000", 10), "a").ok());
  // kube-scheduler's own preemption for another pod is not given the held node either.
  EXPECT_TRUE(state.Preempt(Share("other", "1000", 10), {{"a", {{"ua1"}, 0}}}).empty());
  EXPECT_TRUE(state.Preempt(Share("other", "1000", 10), {{"b", {{"ub2"}, 0}}}).contains("b"));
  // The victim leaves: the preemptor fits there (its own hold does not stop it) and binds.
  state.RemovePod(bound_["a2"]);
  EXPECT_EQ(state.Filter(hi, {"a", "b"}).passed, std::vector<std::string>{"a"});
  Run(hi, "a");
  EXPECT_EQ(state.PreemptingOn("uhi"), "");
  EXPECT_EQ(state.Filter(Share("low3", "1000", 10), {"a"}).failed.at("a").rfind("no single GPU with 1000 MiB free", 0),
            0u);
}

// PodDisruptionBudgets weigh as in kube-scheduler's DefaultPreemption: on a node, a victim a
// budget protects is reprieved before one it does not; across nodes, the plan breaking the fewest
// budgets wins before priorities are compared.
TEST_F(StateTest, PlanPreemptionAvoidsVictimsABudgetProtects) {
  auto labelled = [](json pod, const std::string& app) {
    pod["metadata"]["labels"] = {{"app", app}};
    return pod;
  };
  auto budget = [](const std::string& name, const std::string& app, int allowed) {
    return json{{"apiVersion", "policy/v1"},
                {"kind", "PodDisruptionBudget"},
                {"metadata", {{"name", name}, {"namespace", "ns"}}},
                {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"app", app}}}}}}},
                {"status", {{"disruptionsAllowed", allowed}}}};
  };
  state.UpsertNode(TestNode("a", {ShareGpu(16000)}));
  state.UpsertNode(TestNode("b", {ShareGpu(16000)}));
  // a: either of two 7000 MiB pods frees enough; the lower-priority one is guarded.
  Run(labelled(Share("a-guarded", "7000", 5), "db"), "a");
  Run(labelled(Share("a-free", "7000", 10), "web"), "a");
  // b: one victim of priority 50, unguarded.
  Run(labelled(Share("b-free", "14000", 50), "web"), "b");
  ASSERT_TRUE(state.Filter(Share("hi", "8000", 1000), {"a", "b"}).passed.empty());
  // Plans for a new preemptor (name, MiB) and checks the node, the one victim and the
  // violations; the preemption is then called off, leaving the pods as they were.
  auto expect_plan = [&](const std::string& name, const std::string& mib, const std::string& node,
                         const std::string& victim, int violations) {
    auto plan = state.PlanPreemption(Share(name, mib, 1000), {"a", "b"});
    ASSERT_TRUE(plan.has_value()) << name;
    EXPECT_EQ(plan->node, node) << name;
    ASSERT_EQ(plan->victims.size(), 1u) << name;
    EXPECT_EQ(plan->victims[0].name, victim) << name;
    EXPECT_EQ(plan->pdb_violations, violations) << name;
    state.PreemptionFailed("u" + name);
  };

  // No budget known: the lowest victim priority wins (a, a-guarded at 5).
  expect_plan("hi", "8000", "a", "a-guarded", 0);
  // A budget on app=db that allows no disruption: on a, a-guarded is reprieved and a-free goes.
  state.UpsertBudget(budget("db", "db", 0));
  expect_plan("hi2", "8000", "a", "a-free", 0);

  // Both pods of a under the db budget, and a 14000 MiB preemptor: a's plan breaks the budget
  // twice, b's (web allows one) not at all, so b wins although its victim's priority is higher.
  state.UpsertBudget(budget("web", "web", 1));
  state.RemovePod(bound_["a-free"]);
  Run(labelled(Share("a-db2", "7000", 10), "db"), "a");
  expect_plan("big", "14000", "b", "b-free", 0);
  // Every node breaks a budget: the fewest violations, and the plan says so.
  state.UpsertBudget(budget("web", "web", 0));
  expect_plan("big2", "14000", "b", "b-free", 1);
  // A budget gone, or one without a selector, guards nothing.
  state.RemoveBudget(budget("web", "web", 0));
  json no_selector = budget("all", "x", 0);
  no_selector["spec"].erase("selector");
  state.UpsertBudget(no_selector);
  expect_plan("big3", "14000", "b", "b-free", 0);
}

// On a node that reports its memory in use, with another user holding 2000 MiB: taking the
// victims off on trial must not make their memory (still in use) look like another user's.
TEST_F(StateTest, PreemptionTrialsLeaveUntrackedMemoryAlone) {
  state.UpsertNode(Reported(TestNode("a", {ShareGpu(16000)}), {0}));
  Run(Share("x", "2000", 500), "a");
  Run(Share("y", "6000", 10), "a");
  state.UpsertNode(Reported(TestNode("a", {ShareGpu(16000)}), {10000}));  // x + y + 2000 of somebody else's
  ASSERT_EQ(state.Stats().untracked_mib, 2000);
  // 6000 MiB free; y must go (then 12000), x stays.
  auto plan = state.PlanPreemption(Share("hi", "8000", 1000), {"a"});
  ASSERT_TRUE(plan.has_value());
  ASSERT_EQ(plan->victims.size(), 1u);
  EXPECT_EQ(plan->victims[0].name, "y");
  EXPECT_EQ(state.Stats().untracked_mib, 2000);
  EXPECT_EQ(state.Stats().booked, 2u);
}

TEST_F(StateTest, NoPreemptionWhereItMustNotOrCannotHelp) {
  state.UpsertNode(TestNode("a", {ShareGpu(16000)}));
  Run(Share("same", "8000", 100), "a");
  Run(Share("low", "6000", 10), "a");  // 2000 MiB free
  // Only pods of lower priority are victims: `low` alone frees too little.
  EXPECT_FALSE(state.PlanPreemption(Share("p", "12000", 100), {"a"}).has_value());
  // A pod that fits needs none; one too big for the GPU cannot get any.
  EXPECT_FALSE(state.PlanPreemption(Share("fits", "1000", 1000), {"a"}).has_value());
  EXPECT_FALSE(state.PlanPreemption(Share("huge", "20000", 1000), {"a"}).has_value());
  // preemptionPolicy: Never, and kube-scheduler's own preemption under way (nominatedNodeName).
  json never = Share("never", "8000", 1000);
  never["spec"]["preemptionPolicy"] = "Never";
  EXPECT_FALSE(state.PlanPreemption(never, {"a"}).has_value());
  json nominated = Share("nom", "8000", 1000);
  nominated["status"]["nominatedNodeName"] = "a";
  EXPECT_FALSE(state.PlanPreemption(nominated, {"a"}).has_value());
  // A pod already terminating will make room: wait for it rather than preempt another.
  json going = bound_["low"];
  going["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z";
  state.UpsertPod(going);
  EXPECT_FALSE(state.PlanPreemption(Share("wait", "8000", 1000), {"a"}).has_value());
  // A failed preemption backs off; the hold is gone at once.
  state.UpsertPod(bound_["low"]);
  const json hi = Share("hi", "8000", 1000);
  ASSERT_TRUE(state.PlanPreemption(hi, {"a"}).has_value());
  state.PreemptionFailed("uhi");
  EXPECT_EQ(state.PreemptingOn("uhi"), "");
  EXPECT_FALSE(state.PlanPreemption(hi, {"a"}).has_value());
  EXPECT_EQ(state.Filter(Share("tiny", "1000", 10), {"a"}).passed, std::vector<std::string>{"a"});
}

// The filter's first-fit shortcut for single-GPU shares is taken only where the bind's search is
// sure to try every arrangement within its budget (so a pod the filter passes always binds).
TEST(SearchBudget, CompleteOnlyWhereEveryArrangementFitsTheBudget) {
  EXPECT_TRUE(SearchIsComplete(1, 8));
  EXPECT_TRUE(SearchIsComplete(3, 8));    // 8 + 64 + 512
  EXPECT_TRUE(SearchIsComplete(4, 7));    // 7 + 49 + 343 + 2401 = 2800
  EXPECT_FALSE(SearchIsComplete(4, 8));   // 8 + 64 + 512 + 4096 > 4096
  EXPECT_FALSE(SearchIsComplete(3, 16));  // 16 + 256 + 4096
  EXPECT_TRUE(SearchIsComplete(16, 1));
  EXPECT_FALSE(SearchIsComplete(17, 1)) << "the shortcut places at most 16";
}

TEST(StateHold, EndsAfterItsTime) {
  StateOptions o;
  o.preemption_hold = std::chrono::milliseconds(50);
  o.preemption_backoff = std::chrono::milliseconds(50);
  State state(o);
  ASSERT_TRUE(state.Init().ok());
  state.UpsertNode(TestNode("a", {ShareGpu(16000)}));
  const json low =
      WithUid(TestPod("ns", "low", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}}, {}, 1), "ulow");
  auto a = state.Assume(low, "a");
  ASSERT_TRUE(a.ok());
  state.UpsertPod(Bound(low, "a", a->record));
  const json hi = WithUid(TestPod("ns", "hi", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}}, {}, 9), "uhi");
  ASSERT_TRUE(state.PlanPreemption(hi, {"a"}).has_value());
  const json other = WithUid(TestPod("ns", "o", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}), "uo");
  EXPECT_TRUE(state.Filter(other, {"a"}).passed.empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  EXPECT_EQ(state.PreemptingOn("uhi"), "");
  EXPECT_EQ(state.Filter(other, {"a"}).passed, std::vector<std::string>{"a"});
  EXPECT_TRUE(state.PlanPreemption(hi, {"a"}).has_value());  // planned again once the hold ended
  // Its victim terminates with a grace period longer than the hold: the hold goes on.
  json going = Bound(low, "a", a->record);
  going["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z";
  state.UpsertPod(going);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  EXPECT_FALSE(state.PlanPreemption(hi, {"a"}).has_value());  // it waits for the victim
  EXPECT_EQ(state.PreemptingOn("uhi"), "a");
  EXPECT_TRUE(state.Filter(other, {"a"}).passed.empty());
}

}  // namespace
}  // namespace kgpu::extender
