// `kgpu webhook` as a process over HTTPS: a self-signed certificate made with openssl, real
// AdmissionReview JSON posted to /mutate and /validate (the client verifies the server against
// the certificate, as the API server does with the caBundle), the returned JSONPatch applied to
// the pod and compared with the expected pod; bad bodies are 400s; SIGTERM ends it cleanly.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include "testing/fake_apiserver.h"
#include "testing/gpu_nodes.h"
#include "testing/poll.h"
#include "testing/spawn.h"

namespace {
using json = nlohmann::json;

using kgpu::testing::WaitFor;  // testing/poll.h

std::string Slurp(const std::string& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

int RunToEnd(const std::vector<std::string>& argv, const std::string& log) {
  kgpu::testing::SpawnOptions so;
  so.log = log;
  so.stdin_null = true;
  const pid_t pid = kgpu::testing::Spawn(argv, so);
  if (pid <= 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

json Review(const std::string& uid, const json& pod) {
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", uid},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
            {"namespace", "team-a"},
            {"operation", "CREATE"},
            {"userInfo", {{"username", "alice"}}},
            {"object", pod},
            {"oldObject", nullptr},
            {"dryRun", false}}}};
}

class WebhookProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeCertificate();
    Launch({"--smallest-gpu-memory-mib", "40960", "--largest-gpu-memory-mib", "81920"});
  }
  // A temp dir with a self-signed certificate for 127.0.0.1.
  void MakeCertificate() {
    char tmpl[] = "/tmp/kgpu-webhook-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    cert_ = dir_ + "/tls.crt";
    key_ = dir_ + "/tls.key";
    ASSERT_EQ(RunToEnd({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key_, "-out", cert_,
                        "-days", "1", "-subj", "/CN=kgpu-webhook", "-addext", "subjectAltName=IP:127.0.0.1"},
                       dir_ + "/openssl.log"),
              0)
        << Slurp(dir_ + "/openssl.log");
  }
  // `kgpu webhook` over HTTPS with the fixture's certificate and these flags.
  void Launch(const std::vector<std::string>& flags) {
    log_ = dir_ + "/webhook.log";
    kgpu::testing::SpawnOptions so;
    so.log = log_;
    std::vector<std::string> argv = {KGPU_BIN, "webhook",        "--address", "127.0.0.1:0",      "--tls-cert-file",
                                     cert_,    "--tls-key-file", key_,        "--scheduler-name", "kgpu-scheduler"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    pid_ = kgpu::testing::Spawn(argv, so);
    ASSERT_GT(pid_, 0) << std::strerror(errno);
    ASSERT_TRUE(WaitFor([&] {
      const std::string content = Slurp(log_);
      const size_t at = content.find("listening on port ");
      if (at == std::string::npos) return false;
      port_ = std::atoi(content.c_str() + at + std::strlen("listening on port "));
      return port_ > 0;
    })) << Slurp(log_);
    client_ = std::make_unique<httplib::SSLClient>("127.0.0.1", port_);
    client_->set_ca_cert_path(cert_.c_str());
    client_->enable_server_certificate_verification(true);
    client_->set_read_timeout(30, 0);
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      EXPECT_TRUE(WaitFor([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }));
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << Slurp(log_);
    }
    std::filesystem::remove_all(dir_);
  }
  json Post(const std::string& path, const json& review) {
    auto r = client_->Post(path, review.dump(), "application/json");
    EXPECT_TRUE(r) << httplib::to_string(r.error()) << "\n" << Slurp(log_);
    if (!r) return nullptr;
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }

  std::string dir_, cert_, key_, log_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::unique_ptr<httplib::SSLClient> client_;
};

TEST_F(WebhookProcess, MutatesAHamiPodIntoTheExpectedPodAndValidatesIt) {
  const json pod = json::parse(R"({
    "apiVersion":"v1","kind":"Pod",
    "metadata":{"name":"train","namespace":"team-a","annotations":{"nvidia.com/use-gputype":"A100"}},
    "spec":{"containers":[
      {"name":"sidecar","image":"busybox","resources":{"limits":{"cpu":"100m"}}},
      {"name":"main","image":"cuda","resources":{
        "limits":{"nvidia.com/gpu":"2","nvidia.com/gpumem":"10240","memory":"4Gi"},
        "requests":{"memory":"4Gi"}}}]}})");
  const json out = Post("/mutate", Review("11111111-2222-3333-4444-555555555555", pod));
  ASSERT_TRUE(out.is_object());
  EXPECT_EQ(out["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(out["kind"], "AdmissionReview");
  const json& r = out["response"];
  EXPECT_EQ(r["uid"], "11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(r["allowed"], true);
  ASSERT_EQ(r["patchType"], "JSONPatch");
  std::string patch;
  ASSERT_TRUE(absl::Base64Unescape(r["patch"].get<std::string>(), &patch));
  const json mutated = pod.patch(json::parse(patch));
  const json want = json::parse(R"({
    "apiVersion":"v1","kind":"Pod",
    "metadata":{"name":"train","namespace":"team-a",
                "annotations":{"nvidia.com/use-gputype":"A100","kgpu.io/gpu-model":"A100"}},
    "spec":{"schedulerName":"kgpu-scheduler","containers":[
      {"name":"sidecar","image":"busybox","resources":{"limits":{"cpu":"100m"}}},
      {"name":"main","image":"cuda","resources":{
        "limits":{"memory":"4Gi","kgpu.io/gpu":"2","kgpu.io/gpu-memory":"20480","kgpu.io/gpu-cores":"50"},
        "requests":{"memory":"4Gi","kgpu.io/gpu":"2","kgpu.io/gpu-memory":"20480","kgpu.io/gpu-cores":"50"}}}]}})");
  EXPECT_EQ(mutated, want) << mutated.dump(2);

  const json ok = Post("/validate", Review("u-2", mutated));
  EXPECT_EQ(ok["response"], json::parse(R"({"uid":"u-2","allowed":true})"));
}

TEST_F(WebhookProcess, DeniesWithTheFieldAndRefusesGarbage) {
  json pod = json::parse(R"({"metadata":{"name":"p","namespace":"team-a"},"spec":{"containers":[
    {"name":"a","resources":{"limits":{"kgpu.io/gpu":"1","kgpu.io/gpu-memory":"90000"}}}]}})");
  const json out = Post("/validate", Review("u-3", pod));
  const json& r = out["response"];
  EXPECT_EQ(r["uid"], "u-3");
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["status"]["message"],
            "spec.containers[0].resources.limits[kgpu.io/gpu-memory]: 90000 MiB over 1 shares is 90000 MiB per GPU, "
            "more than the largest GPU in the cluster has (81920 MiB): ask for more kgpu.io/gpu or less memory");

  auto bad = client_->Post("/mutate", "{\"request\":", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(bad->body, "the body is not a JSON object (expected an AdmissionReview)\n");
  auto health = client_->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(WebhookFlags, PlainHttpOnlyWhenAsked) {
  char tmpl[] = "/tmp/kgpu-webhook-flags-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string log = std::string(tmpl) + "/log";
  EXPECT_EQ(RunToEnd({KGPU_BIN, "webhook", "--address", "127.0.0.1:0"}, log), 2);
  EXPECT_NE(Slurp(log).find("--tls-cert-file and --tls-key-file are required"), std::string::npos) << Slurp(log);
  std::filesystem::remove_all(tmpl);
}

// Without the size flags, and with --kubeconfig: the sizes come from the GPUs that serve shares
// in the nodes' inventories (a whole-GPU node's larger GPUs do not count), and follow them.
class WebhookFromInventory : public WebhookProcess {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.Start().ok());
    ASSERT_EQ(api_.Create("nodes", "", kgpu::testing::TestNode("small", {kgpu::testing::ShareGpu(16384)})).code, 201);
    ASSERT_EQ(
        api_.Create("nodes", "",
                    kgpu::testing::TestNode("big", {kgpu::testing::ShareGpu(81920), kgpu::testing::ShareGpu(40960)}))
            .code,
        201);
    ASSERT_EQ(
        api_.Create("nodes", "", kgpu::testing::TestNode("whole", {kgpu::testing::WholeGpu("NVIDIA H200", 143771)}))
            .code,
        201);
    MakeCertificate();
    // With exactly the rules deploy/webhook/inventory-rbac.yaml grants (list, watch nodes).
    const std::string kubeconfig = dir_ + "/kubeconfig";
    auto id = kgpu::testing::ReadDeployRbac(std::string(KGPU_SOURCE_DIR) + "/deploy/webhook/inventory-rbac.yaml");
    ASSERT_TRUE(id.ok()) << id.status();
    std::ofstream(kubeconfig) << api_.KubeconfigFor(*id);
    Launch({"--kubeconfig", kubeconfig});
    ASSERT_TRUE(WaitFor([&] {
      return Slurp(log_).find("smallest 16384 MiB, largest 81920 MiB (2 nodes)") != std::string::npos;
    })) << Slurp(log_);
  }
  json Validate(int64_t memory) {
    const json pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", "p"}, {"namespace", "team-a"}}},
        {"spec",
         {{"containers",
           json::array(
               {{{"name", "main"},
                 {"image", "cuda"},
                 {"resources",
                  {{"limits", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", std::to_string(memory)}}},
                   {"requests", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", std::to_string(memory)}}}}}}})}}}};
    return Post("/validate", Review("22222222-2222-3333-4444-555555555555", pod));
  }
  kgpu::testing::FakeApiServer api_;
};

TEST_F(WebhookFromInventory, ShareSizesFollowTheNodesInventories) {
  EXPECT_EQ(Validate(81920)["response"]["allowed"], true);
  const json big = Validate(100000);
  EXPECT_EQ(big["response"]["allowed"], false);
  EXPECT_NE(
      big["response"]["status"].value("message", "").find("more than the largest GPU in the cluster has (81920 MiB)"),
      std::string::npos)
      << big.dump();
  // The largest share GPU leaves: 40960 MiB is now the largest.
  ASSERT_EQ(api_.Delete("nodes", "", "big").code, 200);
  ASSERT_TRUE(WaitFor([&] {
    return Slurp(log_).find("smallest 16384 MiB, largest 16384 MiB (1 nodes)") != std::string::npos;
  })) << Slurp(log_);
  EXPECT_EQ(Validate(40960)["response"]["allowed"], false);
}

}  // namespace
