// A pod's own constraints against a node (k8s/node_fit.h), as kube-scheduler's NodeUnschedulable,
// NodeAffinity and TaintToleration filters decide them, plus the Ready condition: each operator,
// each effect, and the messages kube-scheduler prints.
#include "k8s/node_fit.h"

#include <gtest/gtest.h>

namespace kgpu::k8s {
namespace {

using json = nlohmann::json;

json Node(json labels = json::object(), json taints = json::array(), bool unschedulable = false,
          const char* ready = "True") {
  json n = {{"metadata", {{"name", "gpu-1"}, {"labels", labels}}},
            {"spec", {{"taints", taints}}},
            {"status", {{"conditions", json::array({{{"type", "Ready"}, {"status", ready}}})}}}};
  if (unschedulable) n["spec"]["unschedulable"] = true;
  return n;
}

json Pod(json spec) {
  spec["containers"] = json::array({{{"name", "main"}, {"image", "cuda"}}});
  return {{"metadata", {{"name", "p"}, {"namespace", "ns"}}}, {"spec", spec}};
}

json Required(json terms) {
  return {{"nodeAffinity", {{"requiredDuringSchedulingIgnoredDuringExecution", {{"nodeSelectorTerms", terms}}}}}};
}

constexpr const char* kAffinity = "node(s) didn't match Pod's node affinity/selector";

TEST(NodeFit, NodeSelectorNeedsEveryLabel) {
  const json node = Node({{"gpu", "h100"}, {"zone", "a"}});
  EXPECT_EQ(NodeRefusesPod(Pod({{"nodeSelector", {{"gpu", "h100"}}}}), node), "");
  EXPECT_EQ(NodeRefusesPod(Pod({{"nodeSelector", {{"gpu", "h100"}, {"zone", "a"}}}}), node), "");
  EXPECT_EQ(NodeRefusesPod(Pod({{"nodeSelector", {{"gpu", "a100"}}}}), node), kAffinity);
  EXPECT_EQ(NodeRefusesPod(Pod({{"nodeSelector", {{"rack", "1"}}}}), node), kAffinity);
  EXPECT_EQ(NodeRefusesPod(Pod(json::object()), node), "");
}

TEST(NodeFit, RequiredNodeAffinityOperatorsTermsAndFields) {
  const json node = Node({{"gpu", "h100"}, {"gpus", "8"}});
  auto expr = [](const char* key, const char* op, json values = json::array()) {
    json e = {{"key", key}, {"operator", op}};
    if (!values.empty()) e["values"] = values;
    return json::array({{{"matchExpressions", json::array({e})}}});
  };
  auto refuses = [&](const json& terms) { return NodeRefusesPod(Pod({{"affinity", Required(terms)}}), node); };
  EXPECT_EQ(refuses(expr("gpu", "In", {"a100", "h100"})), "");
  EXPECT_EQ(refuses(expr("gpu", "In", {"a100"})), kAffinity);
  EXPECT_EQ(refuses(expr("gpu", "NotIn", {"a100"})), "");
  EXPECT_EQ(refuses(expr("gpu", "NotIn", {"h100"})), kAffinity);
  EXPECT_EQ(refuses(expr("missing", "NotIn", {"x"})), "");
  EXPECT_EQ(refuses(expr("gpu", "Exists")), "");
  EXPECT_EQ(refuses(expr("missing", "Exists")), kAffinity);
  EXPECT_EQ(refuses(expr("missing", "DoesNotExist")), "");
  EXPECT_EQ(refuses(expr("gpu", "DoesNotExist")), kAffinity);
  EXPECT_EQ(refuses(expr("gpus", "Gt", {"4"})), "");
  EXPECT_EQ(refuses(expr("gpus", "Gt", {"8"})), kAffinity);
  EXPECT_EQ(refuses(expr("gpus", "Lt", {"9"})), "");
  EXPECT_EQ(refuses(expr("gpu", "Lt", {"9"})), kAffinity) << "not an integer";
  // Terms are ORed; the expressions of one term ANDed; an empty term matches nothing.
  json two = expr("gpu", "In", {"a100"});
  two.push_back(expr("gpu", "In", {"h100"})[0]);
  EXPECT_EQ(refuses(two), "");
  json both = expr("gpu", "In", {"h100"});
  both[0]["matchExpressions"].push_back({{"key", "gpus"}, {"operator", "In"}, {"values", {"4"}}});
  EXPECT_EQ(refuses(both), kAffinity);
  EXPECT_EQ(refuses(json::array({json::object()})), kAffinity);
  EXPECT_EQ(refuses(json::array()), kAffinity);
  // matchFields names the node.
  const json by_name = json::array(
      {{{"matchFields", json::array({{{"key", "metadata.name"}, {"operator", "In"}, {"values", {"gpu-1"}}}})}}});
  EXPECT_EQ(refuses(by_name), "");
  json other = by_name;
  other[0]["matchFields"][0]["values"] = {"gpu-2"};
  EXPECT_EQ(refuses(other), kAffinity);
  // The selector and the affinity must both hold.
  EXPECT_EQ(NodeRefusesPod(Pod({{"nodeSelector", {{"gpu", "a100"}}}, {"affinity", Required(by_name)}}), node),
            kAffinity);
}

TEST(NodeFit, TaintsNeedTolerationsAndPreferNoScheduleDoesNot) {
  const json taint = {{"key", "nvidia.com/gpu"}, {"value", "present"}, {"effect", "NoSchedule"}};
  const json node = Node(json::object(), json::array({taint}));
  EXPECT_EQ(NodeRefusesPod(Pod(json::object()), node), "node(s) had untolerated taint {nvidia.com/gpu: present}");
  auto with = [](json t) { return Pod({{"tolerations", json::array({t})}}); };
  EXPECT_EQ(NodeRefusesPod(with({{"key", "nvidia.com/gpu"}, {"operator", "Exists"}}), node), "");
  EXPECT_EQ(NodeRefusesPod(with({{"key", "nvidia.com/gpu"}, {"value", "present"}}), node), "") << "Equal by default";
  EXPECT_NE(NodeRefusesPod(with({{"key", "nvidia.com/gpu"}, {"value", "absent"}}), node), "");
  EXPECT_NE(NodeRefusesPod(with({{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoExecute"}}), node),
            "")
      << "another effect";
  EXPECT_EQ(NodeRefusesPod(with({{"operator", "Exists"}}), node), "") << "an empty key with Exists tolerates all";
  const json no_execute = Node(json::object(), json::array({{{"key", "k"}, {"effect", "NoExecute"}}}));
  EXPECT_EQ(NodeRefusesPod(Pod(json::object()), no_execute), "node(s) had untolerated taint {k: }");
  const json prefer = Node(json::object(), json::array({{{"key", "k"}, {"effect", "PreferNoSchedule"}}}));
  EXPECT_EQ(NodeRefusesPod(Pod(json::object()), prefer), "");
}

TEST(NodeFit, UnschedulableAndNotReadyNodesUnlessTolerated) {
  EXPECT_EQ(NodeRefusesPod(Pod(json::object()), Node(json::object(), json::array(), true)),
            "node(s) were unschedulable");
  const json tolerates_cordon =
      Pod({{"tolerations", json::array({{{"key", "node.kubernetes.io/unschedulable"}, {"operator", "Exists"}}})}});
  EXPECT_EQ(NodeRefusesPod(tolerates_cordon, Node(json::object(), json::array(), true)), "");
  EXPECT_EQ(NodeRefusesPod(Pod(json::object()), Node(json::object(), json::array(), false, "False")),
            "node(s) were not ready (Ready is False)");
  EXPECT_EQ(NodeRefusesPod(Pod(json::object()), Node(json::object(), json::array(), false, "Unknown")),
            "node(s) were not ready (Ready is Unknown)");
  // kube-apiserver's default tolerations (not-ready and unreachable, NoExecute, 300 s) do not let
  // a pod onto a node that is not Ready; tolerating every taint does, as kube-scheduler lets it.
  const json defaults = Pod({{"tolerations", json::array({{{"key", "node.kubernetes.io/not-ready"},
                                                           {"operator", "Exists"},
                                                           {"effect", "NoExecute"},
                                                           {"tolerationSeconds", 300}}})}});
  EXPECT_NE(NodeRefusesPod(defaults, Node(json::object(), json::array(), false, "False")), "");
  EXPECT_EQ(NodeRefusesPod(Pod({{"tolerations", json::array({{{"operator", "Exists"}}})}}),
                           Node(json::object(), json::array(), false, "False")),
            "");
  // A node without conditions (not reported yet) is left to its taints.
  json fresh = Node();
  fresh["status"].erase("conditions");
  EXPECT_EQ(NodeRefusesPod(Pod(json::object()), fresh), "");
}

}  // namespace
}  // namespace kgpu::k8s
