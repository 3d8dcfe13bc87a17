// The whole path plugin -> kubelet -> Node object: `kgpu device-plugin` registers with the
// kubelet stand-in, whose API side keeps the Node's capacity/allocatable in the API server
// stand-in; `kgpu node-labels` publishes the GFD labels and the inventory annotation there.
#include <gtest/gtest.h>

#include <chrono>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "k8s/client.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_kubelet_node.h"
#include "testing/plugin_fixture.h"
#include "testing/plugin_process.h"

namespace kgpu {
namespace {
using namespace std::chrono_literals;
using json = nlohmann::json;

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

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

// `kgpu doctor --kubeconfig`: the cluster checks against the Node the kubelet stand-in keeps.
TEST_F(NodeApiTest, DoctorClusterChecks) {
  Init("dgx-h100");
  StartApi();
  testing::KubeletNodeStatus status(*kubelet_, *client_, "sim-node", {{"cpu", "64"}}, 50ms);
  status.Start();
  testing::Plugin p(sim_->dir(), {});
  ASSERT_TRUE(WaitFor([&] { return Status("allocatable", "nvidia.com/gpu") == "8"; })) << p.Log();
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
  ASSERT_TRUE(client_
                  ->Patch("/api/v1/nodes/sim-node",
                          {{"spec", {{"unschedulable", true}, {"taints", {{{"key", "gpu.example/owner"}, {"value", "slurm"}, {"effect", "NoSchedule"}}}}}}})
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
  status.Stop();
}

}  // namespace
}  // namespace kgpu
