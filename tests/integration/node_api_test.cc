// The whole path plugin -> kubelet -> Node object: `kgpu device-plugin` registers with the
// kubelet stand-in, whose API side keeps the Node's capacity/allocatable in the API server
// stand-in; `kgpu node-labels` publishes the GFD labels and the inventory annotation there, and so
// does the node agent itself (--publish-labels), following health, MIG layout and SIGHUP reloads.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include "extender/inventory.h"
#include "k8s/client.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_kubelet_node.h"
#include "testing/plugin_fixture.h"
#include "testing/plugin_process.h"
#include "testing/poll.h"
#include "testing/shell.h"

namespace kgpu {
namespace {
using namespace std::chrono_literals;
using json = nlohmann::json;

using testing::WaitFor;  // testing/poll.h

class NodeApiTest : public testing::PluginNodeTest {
 protected:
  void StartApi() {
    ASSERT_TRUE(api_.Start().ok());
    k8s::Config c;
    c.server = api_.url();
    client_ = std::move(*k8s::Client::Create(c));
    kubeconfig_ = sim_->dir() + "/kubeconfig";
    std::ofstream(kubeconfig_) << api_.Kubeconfig();
  }
  std::string Status(const std::string& field, const std::string& resource) {
    auto n = api_.Get("nodes", "", "sim-node");
    if (n.code != 200) return "";
    return n.body["status"].value(field, json::object()).value(resource, "");
  }
  testing::FakeApiServer api_;
  std::unique_ptr<k8s::Client> client_;
  std::string kubeconfig_;
};

TEST_F(NodeApiTest, AllocatableFollowsThePlugin) {
  Init("dgx-h100");
  StartApi();
  testing::KubeletNodeStatus status(*kubelet_, *client_, "sim-node", {{"cpu", "64"}}, 50ms);
  status.Start();
  ASSERT_TRUE(WaitFor([&] { return api_.Get("nodes", "", "sim-node").code == 200; })) << "kubelet registers its Node";
  {
    testing::Plugin p(sim_->dir(), {});
    ASSERT_TRUE(WaitFor([&] { return Status("allocatable", "nvidia.com/gpu") == "8"; })) << p.Log();
    EXPECT_EQ(Status("capacity", "nvidia.com/gpu"), "8");
    EXPECT_EQ(Status("capacity", "cpu"), "64");
    // An XID marks a GPU unhealthy: allocatable drops, capacity stays.
    ASSERT_EQ(sim_->Ctl("xid 2 48"), 0);
    EXPECT_TRUE(WaitFor([&] { return Status("allocatable", "nvidia.com/gpu") == "7"; })) << p.Log();
    EXPECT_EQ(Status("capacity", "nvidia.com/gpu"), "8");
    p.Signal(SIGTERM);
    EXPECT_EQ(p.Wait(5s), 0) << p.Log();
  }
  // The plugin is gone: kubelet counts its devices unhealthy.
  EXPECT_TRUE(WaitFor([&] { return Status("allocatable", "nvidia.com/gpu") == "0"; }));
  EXPECT_EQ(Status("capacity", "nvidia.com/gpu"), "8");
  status.Stop();
}

TEST_F(NodeApiTest, NodeLabelsCommandPublishes) {
  Init("dgx-h100");
  StartApi();
  ASSERT_EQ(api_.Create("nodes", "", {{"metadata", {{"name", "sim-node"}, {"labels", {{"team", "ml"}}}}}}).code, 201);
  testing::Plugin p(sim_->dir(), {"--kubeconfig", kubeconfig_, "--node-name", "sim-node", "--oneshot"}, {},
                    "node-labels");
  ASSERT_EQ(p.Wait(30s), 0) << p.Log();
  auto n = api_.Get("nodes", "", "sim-node").body;
  EXPECT_EQ(n["metadata"]["labels"]["team"], "ml");
  EXPECT_EQ(n["metadata"]["labels"]["nvidia.com/gpu.count"], "8");
  EXPECT_EQ(n["metadata"]["labels"]["nvidia.com/gpu.family"], "hopper");
  EXPECT_FALSE(n["metadata"]["labels"].value("nvidia.com/gfd.timestamp", "").empty());
  const json inv = json::parse(n["metadata"]["annotations"].value("kgpu.io/gpu-inventory", "{}"));
  EXPECT_EQ(inv["v"], 1);
  EXPECT_EQ(inv["gpus"].size(), 8u);
  // NFD feature file output.
  const std::string file = sim_->dir() + "/features.d/gfd";
  testing::Plugin f(sim_->dir(), {"--output", "file", "--output-file", file, "--oneshot", "--no-timestamp"}, {},
                    "node-labels");
  ASSERT_EQ(f.Wait(30s), 0) << f.Log();
  std::ifstream in(file);
  std::stringstream buf;
  buf << in.rdbuf();
  EXPECT_NE(buf.str().find("nvidia.com/gpu.count=8\n"), std::string::npos) << buf.str();
  EXPECT_EQ(buf.str().find("gfd.timestamp"), std::string::npos);
}

json Annotation(const json& node) {
  return json::parse(node["metadata"].value("annotations", json::object()).value("kgpu.io/gpu-inventory", "{}"));
}

// The node agent publishes its own labels: at start, when an XID makes a GPU unhealthy (the
// annotation carries the health ListAndWatch serves), and after a SIGHUP reload changed sharing;
// labels it does not own are never touched; an unchanged annotation is not rewritten.
TEST_F(NodeApiTest, DevicePluginPublishesLabelsAndLiveHealth) {
  Init("dgx-h100");
  StartApi();
  ASSERT_EQ(api_.Create("nodes", "",
                        {{"metadata",
                          {{"name", "sim-node"}, {"labels", {{"team", "ml"}, {"nvidia.com/gpu.present", "true"}}}}}})
                .code,
            201);
  const std::string cfg = WriteConfig("version: v1\n");
  testing::Plugin p(sim_->dir(), {"--config-file", cfg, "--publish-labels", "--kubeconfig", kubeconfig_, "--node-name",
                                  "sim-node", "--sleep-interval", "3600", "--no-timestamp"});
  auto node = [&] { return api_.Get("nodes", "", "sim-node").body; };
  ASSERT_TRUE(WaitFor([&] { return node()["metadata"]["labels"].value("nvidia.com/gpu.count", "") == "8"; }))
      << p.Log();
  json inv = Annotation(node());
  ASSERT_EQ(inv["gpus"].size(), 8u);
  for (const auto& g : inv["gpus"]) EXPECT_EQ(g["health"], "ok") << g;
  EXPECT_EQ(node()["metadata"]["labels"]["team"], "ml");
  EXPECT_EQ(node()["metadata"]["labels"]["nvidia.com/gpu.present"], "true");
  // An XID on GPU 2: what ListAndWatch serves, the annotation shows.
  ASSERT_EQ(sim_->Ctl("xid 2 48"), 0);
  ASSERT_TRUE(WaitFor([&] { return Annotation(node())["gpus"][2]["health"] == "unhealthy"; })) << p.Log();
  inv = Annotation(node());
  for (size_t i = 0; i < inv["gpus"].size(); ++i) EXPECT_EQ(inv["gpus"][i]["health"] == "ok", i != 2) << inv["gpus"][i];
  // SIGHUP after a sharing change: the labels and the annotation follow the new config.
  WriteConfig(
      "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n");
  p.Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return node()["metadata"]["labels"].value("nvidia.com/gpu.replicas", "") == "4"; }))
      << p.Log();
  EXPECT_EQ(node()["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"], "time-slicing");
  EXPECT_NE(node()["metadata"]["labels"].value("nvidia.com/gpu.product", "").find("-SHARED"), std::string::npos);
  ASSERT_TRUE(WaitFor([&] { return Annotation(node())["sharing"]["mode"] == "time-slicing"; })) << p.Log();
  EXPECT_EQ(Annotation(node())["sharing"]["replicas"]["nvidia.com/gpu"], 4);
  // After the reload the annotation still says what ListAndWatch serves for GPU 2 (a reload
  // restarts the health monitor: whether the XID is remembered is the plugin's business).
  const std::string gpu2 = Annotation(node())["gpus"][2]["uuid"];
  auto served = [&] {
    auto st = kubelet_->Get("nvidia.com/gpu");
    if (!st || !st->connected || st->devices.size() != 32) return std::string();
    for (const auto& id : st->UnhealthyIds()) {
      if (id.rfind(gpu2, 0) == 0) return std::string("unhealthy");
    }
    return std::string("ok");
  };
  EXPECT_TRUE(WaitFor([&] { return !served().empty() && Annotation(node())["gpus"][2]["health"] == served(); }))
      << served() << " " << Annotation(node())["gpus"][2] << p.Log();
  EXPECT_EQ(node()["metadata"]["labels"]["team"], "ml");
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(10s), 0) << p.Log();
}

// The node agent reports each GPU's memory in use with its inventory (facts §7(b)6): a process
// that no kgpu allocation accounts for shows at the next pass, and the extender reads it. (Run
// with the deprecated --labels-* spellings of --sleep-interval and --no-timestamp.)
TEST_F(NodeApiTest, NodeAgentReportsMemoryInUse) {
  Init("dgx-h100");
  StartApi();
  ASSERT_EQ(api_.Create("nodes", "", {{"metadata", {{"name", "sim-node"}}}}).code, 201);
  const std::string cfg = WriteConfig("version: v1\n");
  testing::Plugin p(sim_->dir(), {"--config-file", cfg, "--publish-labels", "--kubeconfig", kubeconfig_, "--node-name",
                                  "sim-node", "--labels-interval", "1", "--labels-no-timestamp"});
  auto node = [&] { return api_.Get("nodes", "", "sim-node").body; };
  ASSERT_TRUE(WaitFor([&] { return Annotation(node())["gpus"].size() == 8u; })) << p.Log();
  // The --labels-* spellings of earlier releases still work, each with one warning naming GFD's.
  EXPECT_NE(p.Log().find("--labels-interval is deprecated, use --sleep-interval"), std::string::npos) << p.Log();
  EXPECT_NE(p.Log().find("--labels-no-timestamp is deprecated, use --no-timestamp"), std::string::npos) << p.Log();
  EXPECT_EQ(node()["metadata"]["labels"].count("nvidia.com/gfd.timestamp"), 0u);
  const int64_t base = Annotation(node())["gpus"][3].value("usedMiB", int64_t{-1});
  ASSERT_GE(base, 0) << Annotation(node())["gpus"][3];
  ASSERT_EQ(sim_->Ctl("proc add 3 31337 --mem 12000"), 0);
  ASSERT_TRUE(WaitFor([&] { return Annotation(node())["gpus"][3].value("usedMiB", int64_t{-1}) == base + 12000; }))
      << Annotation(node())["gpus"][3] << p.Log();
  auto info = extender::ParseNodeInventory(node());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->gpus[3].used_mib, base + 12000);
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(10s), 0) << p.Log();
}

// After a MIG re-partition (`kgpu mig apply` while the agent runs) the MIG labels and the
// annotation's MIG devices follow, without waiting for the interval.
TEST_F(NodeApiTest, NodeAgentRelabelsAfterMigRepartition) {
  Init("dgx-a100-mig");
  StartApi();
  ASSERT_EQ(api_.Create("nodes", "", {{"metadata", {{"name", "sim-node"}}}}).code, 201);
  const std::string cfg = WriteConfig(
      "version: v1\nflags:\n  migStrategy: mixed\nmig:\n  layouts:\n    gpu1-split:\n      - devices: [1]\n"
      "        mig-devices: {\"2g.10gb\": 3, \"1g.5gb\": 1}\n");
  testing::Plugin p(sim_->dir(),
                    {"--config-file", cfg, "-a", "127.0.0.1:0", "--publish-labels", "--kubeconfig", kubeconfig_,
                     "--node-name", "sim-node", "--sleep-interval", "0"},
                    {}, "node");
  auto labels = [&] { return api_.Get("nodes", "", "sim-node").body["metadata"].value("labels", json::object()); };
  ASSERT_TRUE(WaitFor([&] { return labels().value("nvidia.com/mig-1g.5gb.count", "") == "9"; })) << p.Log();
  EXPECT_EQ(labels().value("nvidia.com/mig-2g.10gb.count", ""), "1");
  const std::string kgpu = "LD_LIBRARY_PATH=" + testing::LibDir() + " KGPU_MIG_LOCK_FILE=" + sim_->dir() +
                           "/mig.lock " + KGPU_BIN + " mig apply --no-kubelet-check --kubelet-dir " + sim_->dir() +
                           " --layout gpu1-split --config-file " + cfg;
  auto r = testing::Shell(kgpu);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(WaitFor([&] { return labels().value("nvidia.com/mig-2g.10gb.count", "") == "4"; })) << p.Log();
  EXPECT_EQ(labels().value("nvidia.com/mig-1g.5gb.count", ""), "3");
  const json inv = Annotation(api_.Get("nodes", "", "sim-node").body);
  size_t two_g = 0;
  for (const auto& m : inv["gpus"][1]["mig"]) two_g += m["profile"] == "2g.10gb";
  EXPECT_EQ(two_g, 3u) << inv["gpus"][1];
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(10s), 0) << p.Log();
}

// The deploy manifests' RBAC for the labelling plugin (deploy/node-labels/in-plugin) is enough, and
// is no more than get+patch on nodes: the stand-in enforces exactly those rules for the plugin's
// service account, and the plugin publishes.
TEST_F(NodeApiTest, ManifestRbacIsEnoughAndLeast) {
  Init("dgx-h100");
  const std::string dir = std::string(KGPU_SOURCE_DIR) + "/deploy/node-labels/in-plugin";
  std::vector<testing::RbacRule> rules;
  std::string subject;
  for (const auto& doc : YAML::LoadAllFromFile(dir + "/rbac.yaml")) {
    const std::string kind = doc["kind"].as<std::string>();
    if (kind == "ClusterRole") {
      for (const auto& r : doc["rules"]) {
        testing::RbacRule rule;
        for (const auto& g : r["apiGroups"]) EXPECT_EQ(g.as<std::string>(), "") << "core group only";
        for (const auto& v : r["verbs"]) rule.verbs.insert(v.as<std::string>());
        for (const auto& res : r["resources"]) rule.resources.insert(res.as<std::string>());
        rules.push_back(rule);
      }
    } else if (kind == "ClusterRoleBinding") {
      const auto sa = doc["subjects"][0];
      subject = "system:serviceaccount:" + sa["namespace"].as<std::string>() + ":" + sa["name"].as<std::string>();
    }
  }
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_EQ(rules[0].verbs, (std::set<std::string>{"get", "patch"}));
  EXPECT_EQ(rules[0].resources, (std::set<std::string>{"nodes"}));
  EXPECT_EQ(subject, "system:serviceaccount:kgpu-system:kgpu-device-plugin");
  std::ifstream k(dir + "/kustomization.yaml");
  std::stringstream ks;
  ks << k.rdbuf();
  EXPECT_NE(ks.str().find("value: --publish-labels"), std::string::npos);

  testing::FakeApiServerOptions o;
  o.tokens = {{"agent", subject}, {"admin", "admin"}};
  o.rbac = {{subject, rules}};
  testing::FakeApiServer api(o);
  ASSERT_TRUE(api.Start().ok());
  ASSERT_EQ(api.Create("nodes", "", {{"metadata", {{"name", "sim-node"}}}}).code, 201);
  const std::string kubeconfig = sim_->dir() + "/agent-kubeconfig";
  std::ofstream(kubeconfig) << api.Kubeconfig("agent");
  testing::Plugin p(sim_->dir(), {"--publish-labels", "--kubeconfig", kubeconfig, "--node-name", "sim-node"});
  EXPECT_TRUE(WaitFor([&] {
    return api.Get("nodes", "", "sim-node")
        .body["metadata"]
        .value("labels", json::object())
        .contains("nvidia.com/gpu.count");
  })) << p.Log();
  EXPECT_EQ(p.Log().find("forbidden"), std::string::npos) << p.Log();
  // And with get alone it is refused with the apiserver's 403, said in the log.
  p.Signal(SIGTERM);
  ASSERT_EQ(p.Wait(10s), 0) << p.Log();
  testing::FakeApiServerOptions ro = o;
  ro.rbac = {{subject, {{{"get"}, {"nodes"}}}}};
  testing::FakeApiServer readonly(ro);
  ASSERT_TRUE(readonly.Start().ok());
  ASSERT_EQ(readonly.Create("nodes", "", {{"metadata", {{"name", "sim-node"}}}}).code, 201);
  std::ofstream(kubeconfig) << readonly.Kubeconfig("agent");
  testing::Plugin q(sim_->dir(), {"--publish-labels", "--kubeconfig", kubeconfig, "--node-name", "sim-node"});
  EXPECT_TRUE(WaitFor([&] { return q.Log().find("cannot patch resource \"nodes\"") != std::string::npos; })) << q.Log();
}

// --publish-labels without a node name: the flag to fix, and no start.
TEST_F(NodeApiTest, PublishLabelsNeedsANodeName) {
  Init("dgx-h100");
  testing::Plugin p(sim_->dir(), {"--publish-labels", "--kubeconfig", "/nonexistent"}, {"NODE_NAME="});
  EXPECT_EQ(p.Wait(30s), 1) << p.Log();
  EXPECT_NE(p.Log().find("--publish-labels: --node-name (or NODE_NAME) is required"), std::string::npos) << p.Log();
}

// `kgpu doctor --kubeconfig`: the cluster checks against the Node the kubelet stand-in keeps.
TEST_F(NodeApiTest, DoctorClusterChecks) {
  Init("dgx-h100");
  StartApi();
  testing::KubeletNodeStatus status(*kubelet_, *client_, "sim-node", {{"cpu", "64"}}, 50ms);
  status.Start();
  testing::Plugin p(sim_->dir(), {});
  ASSERT_TRUE(WaitFor([&] { return Status("allocatable", "nvidia.com/gpu") == "8"; })) << p.Log();
  // The kubelet stand-in keeps its node Lease, as kubelet does (kubectl describe node shows it).
  const json lease = api_.Get("leases", "kube-node-lease", "sim-node").body;
  EXPECT_EQ(lease["spec"].value("holderIdentity", ""), "sim-node") << lease.dump();
  EXPECT_EQ(lease["spec"].value("leaseDurationSeconds", 0), 40);
  // Registered Ready: the not-ready taint TaintNodesByCondition puts on a new Node is gone.
  EXPECT_FALSE(api_.Get("nodes", "", "sim-node").body["spec"].contains("taints"));
  auto run = [&](const std::string& args, int* rc = nullptr) {
    const std::string cmd = "LD_LIBRARY_PATH=" + testing::LibDir() + " " + KGPU_BIN + " " + args + " 2>&1";
    std::string out;
    FILE* f = popen(cmd.c_str(), "r");
    char buf[4096];
    while (f && fgets(buf, sizeof buf, f)) out += buf;
    const int exit_status = f ? pclose(f) : -1;
    if (rc) *rc = WIFEXITED(exit_status) ? WEXITSTATUS(exit_status) : -1;
    return out;
  };
  auto doctor = [&](const std::string& node) {
    return run("doctor --kubelet-dir " + sim_->dir() + " --kubeconfig " + kubeconfig_ + " --node-name " + node);
  };
  std::string out = doctor("sim-node");
  EXPECT_NE(out.find("[PASS] Node object"), std::string::npos) << out;
  EXPECT_NE(out.find("[PASS] Node nvidia.com/gpu"), std::string::npos) << out;
  EXPECT_NE(out.find("capacity 8, allocatable 8"), std::string::npos) << out;
  EXPECT_NE(out.find("[PASS] Schedulable"), std::string::npos) << out;
  EXPECT_NE(out.find("[WARN] GFD labels"), std::string::npos) << out;
  // Cordoned and tainted, labelled.
  ASSERT_TRUE(
      client_
          ->Patch("/api/v1/nodes/sim-node",
                  {{"spec",
                    {{"unschedulable", true},
                     {"taints", {{{"key", "gpu.example/owner"}, {"value", "slurm"}, {"effect", "NoSchedule"}}}}}}})
          .ok());
  int rc = -1;
  const std::string labelled = run("node-labels --kubeconfig " + kubeconfig_ + " --node-name sim-node --oneshot", &rc);
  EXPECT_EQ(rc, 0) << labelled;
  out = doctor("sim-node");
  EXPECT_NE(out.find("[WARN] Schedulable"), std::string::npos) << out;
  EXPECT_NE(out.find("gpu.example/owner=slurm:NoSchedule"), std::string::npos) << out;
  EXPECT_NE(out.find("[PASS] GFD labels"), std::string::npos) << out;
  // Devices unhealthy on the Node, and a wrong node name.
  ASSERT_EQ(sim_->Ctl("xid 0 48"), 0);
  EXPECT_TRUE(WaitFor([&] { return Status("allocatable", "nvidia.com/gpu") == "7"; }));
  out = doctor("nope");
  EXPECT_NE(out.find("[FAIL] Node object"), std::string::npos) << out;
  EXPECT_NE(out.find("--node-name"), std::string::npos) << out;
  // The plugin stopped: kubelet keeps capacity 8 and sets allocatable 0. No plugin is there to
  // compare with, and the node cannot serve a GPU: FAIL (exit 1), not a WARN and a PASS.
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(30s), 0) << p.Log();
  ASSERT_TRUE(WaitFor([&] { return Status("allocatable", "nvidia.com/gpu") == "0"; }));
  const std::string cmd =
      "doctor --kubelet-dir " + sim_->dir() + " --kubeconfig " + kubeconfig_ + " --node-name sim-node";
  out = run(cmd, &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("[FAIL] Node allocatable"), std::string::npos) << out;
  EXPECT_NE(out.find("allocatable nvidia.com/gpu is 0 (capacity 8): no device plugin is registered with kubelet"),
            std::string::npos)
      << out;
  status.Stop();
}

}  // namespace
}  // namespace kgpu
