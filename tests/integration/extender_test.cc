// The extender as kube-scheduler meets it: a real HTTP(S) server fed by informers on the API
// server stand-in, driven by raw §1.3 JSON and by the kube-scheduler stand-in
// (testing/fake_scheduler.h): readiness after sync, every verb's wire form in both
// nodeCacheCapable modes, mixed whole/MIG/share pods with exact records and no GPU over-committed,
// quota refusing at admission, what preemption really reaches, 16 concurrent binds to one node,
// a restarted extender rebuilding from the records, HTTPS, and the `kgpu extender` process.
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/record.h"
#include "common/strings.h"
#include "extender/server.h"
#include "extender/wire.h"
#include "k8s/client.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_scheduler.h"
#include "testing/gpu_nodes.h"
#include "testing/poll.h"
#include "testing/promtool.h"
#include "testing/raw_http.h"
#include "testing/shell.h"
#include "testing/spawn.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;
using testing::MigGpu;
using testing::ShareGpu;
using testing::TestGpuUuid;
using testing::TestNode;
using testing::TestPod;
using testing::WholeGpu;

using testing::WaitFor;  // testing/poll.h

class ExtenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api.Start().ok());
    k8s::Config kc;
    kc.server = api.url();
    kc.qps = 0;  // no client-side rate limit in tests
    client = std::move(*k8s::Client::Create(kc));
    for (const char* ns : {"ns", "other"})
      ASSERT_EQ(api.Create("namespaces", "", {{"metadata", {{"name", ns}}}}).code, 201);
  }
  void TearDown() override {
    sched.reset();
    if (ext) ext->Stop();
  }
  void AddNode(const json& n) { ASSERT_EQ(api.Create("nodes", "", n).code, 201); }
  void StartExtender(ExtenderOptions o = {}) {
    o.address = "127.0.0.1:0";
    o.insecure_http = o.tls_cert_file.empty();
    ext = std::make_unique<Extender>(*client, o);
    ASSERT_TRUE(ext->Start().ok());
    ASSERT_TRUE(WaitFor([&] { return ext->NotReadyReason().empty(); }));
  }
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(ext->port()); }
  void StartScheduler(const std::string& url, bool cache_capable = true, testing::FakeSchedulerOptions so = {}) {
    so.url_prefix = url + "/gpu";
    so.node_cache_capable = cache_capable;
    sched = std::make_unique<testing::FakeScheduler>(*client, so);
  }
  json CreatePod(const json& pod) {
    auto r = api.Create("pods", pod["metadata"]["namespace"], pod);
    EXPECT_EQ(r.code, 201) << r.body.dump();
    return r.body;
  }
  json GetPod(const std::string& ns, const std::string& name) { return api.Get("pods", ns, name).body; }
  // The preemption tests' pods: one share of `mib`, label app=`app`, a 1 s grace period.
  static json SharePod(const std::string& name, const std::string& mib, int64_t prio, const std::string& app) {
    json p = TestPod("ns", name, {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", mib}}, {}, prio);
    p["metadata"]["labels"] = {{"app", app}};
    p["spec"]["terminationGracePeriodSeconds"] = 1;
    return p;
  }
  // The preemption tests' cluster: node "share" with one 16000 MiB share GPU, the extender (a
  // refused eviction gives up after 500 ms) and the kube-scheduler stand-in calling it.
  void StartForPreemption() {
    AddNode(TestNode("share", {ShareGpu(16000)}));
    ExtenderOptions o;
    o.eviction_wait = std::chrono::milliseconds(500);
    StartExtender(o);
    StartScheduler(Url());
  }
  // What kubelet would report for a started pod: Running and Ready (budgets count it healthy).
  void MarkRunning(const std::string& name) {
    auto st =
        client->Patch("/api/v1/namespaces/ns/pods/" + name + "/status",
                      {{"status", {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}},
                      "application/merge-patch+json");
    ASSERT_TRUE(st.ok()) << st.status();
  }
  // The Event with this reason about pod ns/`name`, waited for (the recorder writes Events on its
  // own thread, after the metrics are counted); null when none came.
  json WaitForEvent(const std::string& reason, const std::string& name) {
    json found;
    WaitFor([&] {
      auto events = client->List("/apis/events.k8s.io/v1/namespaces/ns/events");
      if (!events.ok()) return false;
      for (const auto& e : (*events)["items"]) {
        if (e.value("reason", "") == reason && e["regarding"].value("name", "") == name) found = e;
      }
      return !found.is_null();
    });
    return found;
  }
  // Schedules `pod` (created first) and returns the outcome.
  testing::ScheduleOutcome Schedule(const json& pod) {
    const json created = CreatePod(pod);
    auto out = sched->ScheduleOne(created);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : testing::ScheduleOutcome{};
  }
  // Runs scheduling cycles for an existing pod until one binds it (as kube-scheduler retries an
  // unschedulable pod); on failure the last cycle's message or error.
  ::testing::AssertionResult RescheduleUntilBound(const std::string& ns, const std::string& name) {
    std::string last;
    if (WaitFor([&] {
          auto retry = sched->ScheduleOne(GetPod(ns, name));
          if (!retry.ok()) return last = retry.status().ToString(), false;
          last = retry->message;
          return retry->bound;
        })) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << ns << "/" << name << " never bound: " << last;
  }
  std::optional<api::AllocationRecord> RecordOn(const json& pod) {
    const json ann = pod["metadata"].value("annotations", json::object());
    if (!ann.contains(kAnnotationAllocation)) return std::nullopt;
    auto r = api::ParseRecord(ann[kAnnotationAllocation].get<std::string>());
    if (!r.ok()) return std::nullopt;
    return *r;
  }
  // Per GPU (or MIG device): memory booked and holders, from every bound pod's record.
  struct Use {
    int64_t memory = 0, cores = 0;
    int holders = 0;
    bool whole = false;
  };
  std::map<std::string, Use> UseFromRecords() {
    std::map<std::string, Use> use;
    auto pods = client->List("/api/v1/pods");
    for (const auto& p : (*pods)["items"]) {
      if (p["spec"].value("nodeName", "").empty()) continue;
      auto r = RecordOn(p);
      if (!r) continue;
      EXPECT_EQ(r->node, p["spec"]["nodeName"]) << p["metadata"]["name"];
      for (const auto& c : r->containers) {
        for (const auto& g : c.gpus) {
          auto& u = use[g.Device()];
          u.memory += g.memory_mib;
          u.cores += g.cores;
          ++u.holders;
          u.whole = u.whole || c.resource == kWholeGpu;
        }
      }
    }
    return use;
  }

  testing::FakeApiServer api;
  std::unique_ptr<k8s::Client> client;
  std::unique_ptr<Extender> ext;
  std::unique_ptr<testing::FakeScheduler> sched;
};

// `kgpu extender` runs with exactly the RBAC deploy/extender grants its ServiceAccount.
std::string ExtenderKubeconfig(testing::FakeApiServer& api) {
  auto id = testing::ReadDeployRbac(std::string(KGPU_SOURCE_DIR) + "/deploy/extender/extender.yaml");
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? api.KubeconfigFor(*id) : api.Kubeconfig();
}

TEST_F(ExtenderTest, ReadyOnlyAfterTheInformersSynced) {
  AddNode(TestNode("n1", {ShareGpu()}));
  api.FailNext(3, 500, "/api/v1/pods", "GET");  // the pod list fails a few times first
  ExtenderOptions o;
  o.address = "127.0.0.1:0";
  o.insecure_http = true;
  ext = std::make_unique<Extender>(*client, o);
  ASSERT_TRUE(ext->Start().ok());
  httplib::Client http("127.0.0.1", ext->port());
  auto early = http.Get("/readyz");
  ASSERT_TRUE(early);
  if (early->status == 503) {
    EXPECT_NE(early->body.find("informer has not synced yet"), std::string::npos) << early->body;
    auto verb = http.Post("/gpu/filter", R"({"Pod":{},"NodeNames":["n1"]})", "application/json");
    ASSERT_TRUE(verb);
    EXPECT_EQ(verb->status, 503);
    EXPECT_NE(verb->body.find("not ready"), std::string::npos);
  }
  ASSERT_TRUE(WaitFor([&] {
    auto r = http.Get("/readyz");
    return r && r->status == 200;
  }));
  auto health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

// The TCP sockets of this process bound to local port `port`, with their TCP_NODELAY setting.
std::vector<int> NoDelayOfSocketsOnPort(int port) {
  std::vector<int> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(e.path().filename().c_str());
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || addr.ss_family != AF_INET) continue;
    if (ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port) != port) continue;
    int type = 0;
    socklen_t tl = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) continue;
    int nodelay = -1;
    socklen_t nl = sizeof nodelay;
    if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &nl) == 0) out.push_back(nodelay);
  }
  return out;
}

// httplib writes a response's headers and body in two send() calls: without TCP_NODELAY on the
// server's sockets, Nagle holds the body until the client's delayed ACK (40 ms) — every verb took
// 40 ms or more at 1,000 nodes. The listening socket and the accepted one must both have it set.
TEST_F(ExtenderTest, ServerSocketsHaveTcpNoDelay) {
  AddNode(TestNode("n1", {ShareGpu()}));
  StartExtender();
  httplib::Client http("127.0.0.1", ext->port());
  http.set_keep_alive(true);
  auto r = http.Get("/healthz");
  ASSERT_TRUE(r);
  const std::vector<int> nodelay = NoDelayOfSocketsOnPort(ext->port());
  // The listening socket and the server's end of the kept-alive connection.
  ASSERT_GE(nodelay.size(), 2u);
  for (int v : nodelay) EXPECT_NE(v, 0) << "a server socket on port " << ext->port() << " has Nagle on";
}

TEST_F(ExtenderTest, EveryVerbOnTheWire) {
  AddNode(TestNode("node-a", {ShareGpu(16384)}));
  AddNode(TestNode("node-b", {ShareGpu(8192)}));
  AddNode(TestNode("node-c", {WholeGpu("Tesla T4", 15360)}));
  // The extender's own preemption is off: the filter below that refuses q's only node would start
  // it, and preempt would then answer nothing for q (TheExtenderPreemptsForMemoryShortfalls...).
  ExtenderOptions o;
  o.preemption = false;
  StartExtender(o);
  httplib::Client http("127.0.0.1", ext->port());
  const json pod = CreatePod(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10k"}}));
  const std::string uid = pod["metadata"]["uid"];
  // nodeCacheCapable: true — NodeNames in, NodeNames out.
  auto f = http.Post("/gpu/filter",
                     json{{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", {"node-a", "node-b", "node-c"}}}.dump(),
                     "application/json");
  ASSERT_TRUE(f);
  ASSERT_EQ(f->status, 200) << f->body;
  const json fr = json::parse(f->body);
  EXPECT_EQ(fr["NodeNames"], json({"node-a"}));
  EXPECT_TRUE(fr["Nodes"].is_null());
  EXPECT_EQ(fr["Error"], "");
  EXPECT_EQ(fr["FailedAndUnresolvableNodes"]["node-b"], "no GPU on this node has 10000 MiB in total");
  EXPECT_EQ(fr["FailedAndUnresolvableNodes"]["node-c"], "no GPU on this node serves shares (kgpu.io/gpu)");
  // nodeCacheCapable: false — the full NodeList in, full Nodes out, NodeNames null.
  std::vector<json> full;
  for (const char* n : {"node-a", "node-b"}) full.push_back(api.Get("nodes", "", n).body);
  auto ff = http.Post("/gpu/filter", EncodeExtenderArgsFull(pod, full), "application/json");
  ASSERT_TRUE(ff);
  const json ffr = json::parse(ff->body);
  EXPECT_TRUE(ffr["NodeNames"].is_null());
  ASSERT_EQ(ffr["Nodes"]["items"].size(), 1u);
  EXPECT_EQ(ffr["Nodes"]["items"][0]["metadata"]["name"], "node-a");
  // lower-case envelope keys, as Go would accept too
  auto lower = http.Post("/gpu/filter", json{{"pod", pod}, {"nodenames", {"node-a"}}}.dump(), "application/json");
  ASSERT_TRUE(lower);
  EXPECT_EQ(json::parse(lower->body)["NodeNames"], json({"node-a"}));
  // prioritize: a bare array of {Host, Score}.
  auto p = http.Post("/gpu/prioritize", EncodeExtenderArgs(pod, {"node-a", "node-c"}), "application/json");
  ASSERT_TRUE(p);
  const json pr = json::parse(p->body);
  ASSERT_TRUE(pr.is_array());
  ASSERT_EQ(pr.size(), 2u);
  EXPECT_EQ(pr[0]["Host"], "node-a");
  EXPECT_EQ(pr[0]["Score"], 10);
  EXPECT_EQ(pr[1]["Score"], 0);
  // bind: the record comes with the binding, in one write (pods/binding merges the Binding's
  // annotations): the pod's resourceVersion moves once.
  const int64_t rv_before = std::stoll(GetPod("ns", "p")["metadata"]["resourceVersion"].get<std::string>());
  auto b = http.Post("/gpu/bind", R"({"PodName":"p","PodNamespace":"ns","PodUID":")" + uid + R"(","Node":"node-a"})",
                     "application/json");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->body, R"({"Error":""})");
  const json bound = GetPod("ns", "p");
  EXPECT_EQ(bound["spec"]["nodeName"], "node-a");
  EXPECT_EQ(std::stoll(bound["metadata"]["resourceVersion"].get<std::string>()), rv_before + 1);
  auto rec = RecordOn(bound);
  ASSERT_TRUE(rec.has_value());
  ASSERT_EQ(rec->containers.size(), 1u);
  EXPECT_EQ(rec->containers[0].resource, "kgpu.io/gpu");
  EXPECT_EQ(rec->containers[0].enforcement, "hard");
  EXPECT_EQ(rec->containers[0].gpus[0], (api::RecordGpu{TestGpuUuid("node-a", 0), "", "", 10000, 0}));
  // A repeated bind of the bound pod succeeds without a second booking.
  auto again =
      http.Post("/gpu/bind", R"({"PodName":"p","PodNamespace":"ns","PodUID":")" + uid + R"(","Node":"node-a"})",
                "application/json");
  EXPECT_EQ(again->body, R"({"Error":""})");
  // A bind for a re-created pod (wrong UID) is refused, with a message.
  auto wrong = http.Post("/gpu/bind", R"({"PodName":"p","PodNamespace":"ns","PodUID":"other","Node":"node-a"})",
                         "application/json");
  EXPECT_NE(json::parse(wrong->body)["Error"].get<std::string>().find("re-created"), std::string::npos);
  // The informer sees it: a second 10000 MiB pod no longer fits node-a (resolvable).
  const json second = CreatePod(TestPod("ns", "q", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}}, {}, 100));
  ASSERT_TRUE(WaitFor([&] { return ext->state().Stats().booked == 1; }));
  auto f2 = http.Post("/gpu/filter", EncodeExtenderArgs(second, {"node-a"}), "application/json");
  EXPECT_EQ(json::parse(f2->body)["FailedNodes"]["node-a"], "no single GPU with 10000 MiB free");
  // The nearest node's own figures: an Event on the pod, where `kubectl describe pod` shows them.
  const json near = WaitForEvent("GPUsUnavailable", "q");
  ASSERT_FALSE(near.is_null());
  EXPECT_EQ(near["type"], "Warning");
  EXPECT_EQ(near["note"],
            "none of 1 nodes can take the pod's GPUs; nearest: node node-a: no single GPU with 10000 MiB "
            "free (largest free: 6384 MiB on " +
                TestGpuUuid("node-a", 0) + ")");
  // preempt: p on node-a frees enough; an unknown node is dropped.
  auto pe = http.Post("/gpu/preempt", EncodePreemptionArgs(second, {{"node-a", {{uid}, 0}}, {"node-b", {{"x"}, 0}}}),
                      "application/json");
  ASSERT_TRUE(pe);
  EXPECT_EQ(pe->body,
            R"({"NodeNameToMetaVictims":{"node-a":{"NumPDBViolations":0,"Pods":[{"UID":")" + uid + R"("}]}}})");
  // Malformed input: 400 and an Error naming the field.
  auto bad = http.Post("/gpu/filter", R"({"Pod":{},"NodeNames":5})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["Error"], "ExtenderArgs.NodeNames: expected an array of strings or null");
  // Metrics: per-verb histograms, verdicts, failures by reason.
  auto m = http.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("kgpu_extender_request_duration_seconds_count{verb=\"filter\"} 5"), std::string::npos)
      << m->body;
  EXPECT_NE(m->body.find("kgpu_extender_filter_nodes_total{result=\"unresolvable\"} 3"), std::string::npos);
  EXPECT_NE(m->body.find("kgpu_extender_filter_reasons_total{reason=\"memory\"} 1"), std::string::npos);
  EXPECT_NE(m->body.find("kgpu_extender_failures_total{reason=\"bad_request\",verb=\"filter\"} 1"), std::string::npos);
  EXPECT_NE(m->body.find("kgpu_extender_failures_total{reason=\"pod_changed\",verb=\"bind\"} 1"), std::string::npos);
  EXPECT_NE(m->body.find("kgpu_extender_pods_booked 1"), std::string::npos);
  // Prometheus' own linter: every family has HELP and TYPE, every line parses.
  EXPECT_EQ(testing::PromtoolFindings(m->body), "") << m->body;
}

// kube-scheduler's Go client asks for gzip on every verb; the answers come back as they are (at
// 5,000 nodes a gzipped filter answer took three times as long: extender_bench).
TEST_F(ExtenderTest, VerbsAnswerGoClientsUncompressed) {
  AddNode(TestNode("node-a", {ShareGpu(16384)}));
  StartExtender();
  const json pod = CreatePod(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}));
  std::vector<std::string> names(2000, "node-a");  // a body well above any compression threshold
  for (const char* verb : {"filter", "prioritize"}) {
    const std::string body = EncodeExtenderArgs(pod, names);
    testing::RawHttp c(ext->port());
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c.Send(Cat("POST /gpu/", verb, " HTTP/1.1\r\nHost: 127.0.0.1:", ext->port(),
                           "\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: ", body.size(),
                           "\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n", body)));
    c.ReadFor(std::chrono::seconds(10), "\r\n\r\n");
    const std::string head = c.Head();
    EXPECT_NE(head.find("HTTP/1.1 200"), std::string::npos) << head;
    EXPECT_EQ(head.find("Content-Encoding"), std::string::npos) << verb << ": " << head;
  }
}

// Bind writes a binding only where the pod's own constraints allow it (kube-scheduler checked
// them before asking; a caller that did not cannot place a pod where its spec forbids): a node
// selector, an untolerated taint, a cordoned or NotReady node are refused and counted, and the
// pod stays unbound; with a matching toleration and selector the same bind goes through.
TEST_F(ExtenderTest, BindRefusesANodeThePodsOwnConstraintsForbid) {
  json plain = TestNode("node-a", {ShareGpu(16384)});
  json tainted = TestNode("node-t", {ShareGpu(16384)});
  tainted["spec"]["taints"] = json::array({{{"key", "gpu"}, {"value", "reserved"}, {"effect", "NoSchedule"}}});
  json cordoned = TestNode("node-c", {ShareGpu(16384)});
  cordoned["spec"]["unschedulable"] = true;
  json down = TestNode("node-d", {ShareGpu(16384)});
  down["status"]["conditions"][0]["status"] = "False";
  for (const json& n : {plain, tainted, cordoned, down}) AddNode(n);
  StartExtender();
  httplib::Client http("127.0.0.1", ext->port());
  json want = TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}});
  want["spec"]["nodeSelector"] = {{"pool", "inference"}};
  const json pod = CreatePod(want);
  const std::string uid = pod["metadata"]["uid"];
  auto bind = [&](const std::string& name, const std::string& node) {
    auto r =
        http.Post("/gpu/bind", json{{"PodName", name}, {"PodNamespace", "ns"}, {"PodUID", uid}, {"Node", node}}.dump(),
                  "application/json");
    return r ? json::parse(r->body).value("Error", "?") : std::string("no answer");
  };
  EXPECT_EQ(bind("p", "node-a"),
            "pod ns/p may not run on node node-a: node(s) didn't match Pod's node affinity/selector");
  EXPECT_FALSE(GetPod("ns", "p")["spec"].contains("nodeName"));
  const json free_pod = CreatePod(TestPod("ns", "q", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}));
  auto bind_q = [&](const std::string& node) {
    auto r = http.Post(
        "/gpu/bind",
        json{{"PodName", "q"}, {"PodNamespace", "ns"}, {"PodUID", free_pod["metadata"]["uid"]}, {"Node", node}}.dump(),
        "application/json");
    return r ? json::parse(r->body).value("Error", "?") : std::string("no answer");
  };
  EXPECT_EQ(bind_q("node-t"), "pod ns/q may not run on node node-t: node(s) had untolerated taint {gpu: reserved}");
  EXPECT_EQ(bind_q("node-c"), "pod ns/q may not run on node node-c: node(s) were unschedulable");
  EXPECT_NE(bind_q("node-d").find("may not run on node node-d: node(s)"), std::string::npos);
  EXPECT_FALSE(GetPod("ns", "q")["spec"].contains("nodeName"));
  auto m = http.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("kgpu_extender_failures_total{reason=\"pod_constraints\",verb=\"bind\"} 4"), std::string::npos)
      << m->body;
  // Tolerated and selected: the same binds go through.
  json ok = TestPod("ns", "r", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}});
  ok["spec"]["tolerations"] = json::array({{{"key", "gpu"}, {"operator", "Equal"}, {"value", "reserved"}}});
  ok["spec"]["nodeSelector"] = {{"kubernetes.io/hostname", "node-t"}};
  const json r = CreatePod(ok);
  auto rb = http.Post(
      "/gpu/bind",
      json{{"PodName", "r"}, {"PodNamespace", "ns"}, {"PodUID", r["metadata"]["uid"]}, {"Node", "node-t"}}.dump(),
      "application/json");
  ASSERT_TRUE(rb);
  EXPECT_EQ(rb->body, R"({"Error":""})");
  EXPECT_EQ(GetPod("ns", "r")["spec"]["nodeName"], "node-t");
}

TEST_F(ExtenderTest, MixedPodsThroughTheSchedulerWithQuota) {
  AddNode(TestNode("dgx", {WholeGpu(), WholeGpu(), WholeGpu(), WholeGpu()}, {{0, 1}, {2, 3}}));
  AddNode(TestNode("mig", {MigGpu({"1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"})}));
  AddNode(TestNode("share", {ShareGpu(16000), ShareGpu(16000)}));
  ASSERT_EQ(api.Create("namespaces", "", {{"metadata", {{"name", "team-a"}}}}).code, 201);
  ASSERT_EQ(
      api.Create("resourcequotas", "team-a",
                 {{"metadata", {{"name", "gpu"}, {"namespace", "team-a"}}},
                  {"spec", {{"hard", {{"requests.kgpu.io/gpu-memory", "24000"}, {"requests.kgpu.io/gpu", "8"}}}}}})
          .code,
      201);
  StartExtender();
  StartScheduler(Url());
  // Whole GPUs: 2 on an NVLink pair.
  auto w = Schedule(TestPod("team-a", "whole", {{"nvidia.com/gpu", "2"}}));
  ASSERT_TRUE(w.bound) << w.message;
  EXPECT_EQ(w.node, "dgx");
  auto wr = *RecordOn(GetPod("team-a", "whole"));
  const std::set<std::string> pair = {wr.containers[0].gpus[0].uuid, wr.containers[0].gpus[1].uuid};
  EXPECT_TRUE(pair == std::set<std::string>({TestGpuUuid("dgx", 0), TestGpuUuid("dgx", 1)}) ||
              pair == std::set<std::string>({TestGpuUuid("dgx", 2), TestGpuUuid("dgx", 3)}));
  // MIG: three instances, three different devices.
  std::set<std::string> migs;
  for (int i = 0; i < 3; ++i) {
    auto m = Schedule(TestPod("team-a", "mig-" + std::to_string(i), {{"nvidia.com/mig-1g.10gb", "1"}}));
    ASSERT_TRUE(m.bound) << m.message;
    EXPECT_EQ(m.node, "mig");
    migs.insert(RecordOn(GetPod("team-a", "mig-" + std::to_string(i)))->containers[0].gpus[0].mig);
  }
  EXPECT_EQ(migs.size(), 3u);
  // Shares up to the quota: 6 x 4000 MiB = 24000.
  for (int i = 0; i < 6; ++i) {
    auto s = Schedule(
        TestPod("team-a", "share-" + std::to_string(i), {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}}));
    ASSERT_TRUE(s.bound) << s.message;
    EXPECT_EQ(s.node, "share");
  }
  // The 7th is refused by the apiserver's quota admission, with its message.
  auto refused = api.Create("pods", "team-a",
                            TestPod("team-a", "share-6", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "4000"}}));
  EXPECT_EQ(refused.code, 403);
  // (the stand-in prints 4000 where kube-apiserver prints the canonical 4k)
  const std::string msg = refused.body["message"];
  EXPECT_EQ(
      msg.rfind("pods \"share-6\" is forbidden: exceeded quota: gpu, requested: requests.kgpu.io/gpu-memory=4", 0), 0u)
      << msg;
  EXPECT_NE(msg.find(", used: requests.kgpu.io/gpu-memory=24"), std::string::npos) << msg;
  EXPECT_NE(msg.find(", limited: requests.kgpu.io/gpu-memory=24"), std::string::npos) << msg;
  // Outside the quota'd namespace: a share too big for what is left says so in the event text.
  auto big = Schedule(TestPod("other", "big", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "12000"}}));
  EXPECT_FALSE(big.bound);
  EXPECT_NE(big.message.find("0/3 nodes are available: "), std::string::npos) << big.message;
  EXPECT_NE(big.message.find("1 no single GPU with 12000 MiB free"), std::string::npos) << big.message;
  // Nothing is over-committed: per GPU, what the records book fits the GPU.
  for (const auto& [id, u] : UseFromRecords()) {
    if (id.rfind("MIG-", 0) == 0 || u.whole) {
      EXPECT_EQ(u.holders, 1) << id;
    } else {
      EXPECT_LE(u.memory, 16000) << id;
      EXPECT_LE(u.holders, 16) << id;
    }
  }
}

// kube-scheduler's FailedScheduling counts identical reasons and its Event note is cut at 1,024
// bytes: 400 nodes whose GPUs differ in size give one line per cause, and the note still says
// why; the nearest node's figures come in the extender's own Event on the pod.
TEST_F(ExtenderTest, TheFailedSchedulingEventSaysWhyAtAnyClusterSize) {
  for (int i = 0; i < 400; ++i) AddNode(TestNode("n" + std::to_string(i), {ShareGpu(16000 + i)}));
  AddNode(TestNode("dgx-0", {WholeGpu(), WholeGpu()}));
  AddNode(TestNode("dgx-1", {WholeGpu(), WholeGpu()}));
  StartExtender();
  StartScheduler(Url());
  auto big = Schedule(TestPod("ns", "big", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "40000"}}));
  EXPECT_FALSE(big.bound);
  EXPECT_LE(big.message.size(), 1024u) << big.message;
  // kube-scheduler passes the extender the first feasible nodes it finds, 188 of 400 here (its
  // adaptive percentageOfNodesToScore: 50% - 402/125), and counts only the nodes it evaluated.
  EXPECT_EQ(big.message,
            "0/402 nodes are available: 188 no GPU on this node has 40000 MiB in total, 2 Insufficient kgpu.io/gpu.");
  const json near = WaitForEvent("GPUsUnavailable", "big");
  ASSERT_FALSE(near.is_null());
  const std::string note = near.value("note", "");
  const std::string head = "none of 188 nodes can take the pod's GPUs; nearest: node n";
  ASSERT_EQ(note.rfind(head, 0), 0u) << note;
  const int k = std::stoi(note.substr(head.size()));
  EXPECT_EQ(note.substr(note.find(':', head.size())),
            ": no GPU on this node has 40000 MiB in total (largest: " + std::to_string(16000 + k) + " MiB)");
  EXPECT_EQ(near["reportingController"], "kgpu.io/extender");
}

TEST_F(ExtenderTest, KubeSchedulerPreemptsForWholeGpusButCannotSeeMemoryShortfalls) {
  AddNode(TestNode("dgx", {WholeGpu(), WholeGpu()}));
  AddNode(TestNode("share", {ShareGpu(16000)}));
  StartExtender();
  StartScheduler(Url());
  ASSERT_TRUE(Schedule(TestPod("ns", "low-whole", {{"nvidia.com/gpu", "2"}}, {}, 10)).bound);
  ASSERT_TRUE(
      Schedule(TestPod("ns", "low-share", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "12000"}}, {}, 10)).bound);
  ASSERT_TRUE(WaitFor([&] { return ext->state().Stats().booked == 2; }));
  // A high-priority whole-GPU pod: kube-scheduler's dry run picks the victim (nvidia.com/gpu is
  // counted), the extender confirms it frees the GPUs, the victim goes, the pod binds next time.
  auto hi = Schedule(TestPod("ns", "hi-whole", {{"nvidia.com/gpu", "2"}}, {}, 1000));
  EXPECT_FALSE(hi.bound);
  EXPECT_TRUE(hi.preempt_called);
  EXPECT_EQ(hi.preempted, std::vector<std::string>{"ns/low-whole"});
  ASSERT_TRUE(WaitFor([&] { return ext->state().Stats().booked == 1; }));
  // The stand-in's pod informer may not have seen the deletion yet: its next cycle then finds the
  // victim still there, as kube-scheduler's would, and tries again later.
  EXPECT_TRUE(RescheduleUntilBound("ns", "hi-whole"));
  // A high-priority share short only of memory (ignoredByScheduler): the in-tree dry run finds
  // no victim (a slot is free), so preempt is never called — what kube-scheduler does (facts §1.4).
  // The extender's own preemption takes over (TheExtenderPreemptsForMemoryShortfalls...).
  auto mem = Schedule(TestPod("ns", "hi-share", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "8000"}}, {}, 1000));
  EXPECT_FALSE(mem.bound);
  EXPECT_FALSE(mem.preempt_called);
  EXPECT_NE(mem.message.find("expected at least one victim pod on node"), std::string::npos) << mem.message;
  EXPECT_NE(mem.message.find("no single GPU with 8000 MiB free"), std::string::npos) << mem.message;
}

// What kube-scheduler cannot do for shares, the extender does: it picks the victims as
// DefaultPreemption would, evicts them through the Eviction API (PodDisruptionBudgets honoured),
// holds the node for the preemptor, and the preemptor binds there once they are gone.
TEST_F(ExtenderTest, TheExtenderPreemptsForMemoryShortfallsThroughTheEvictionApi) {
  StartForPreemption();
  auto share = SharePod;
  auto running = [&](const std::string& name) { MarkRunning(name); };
  ASSERT_TRUE(Schedule(share("low", "12000", 10, "low")).bound);
  running("low");
  ASSERT_TRUE(Schedule(share("peer", "2000", 1000, "peer")).bound);  // same priority as hi: never a victim
  ASSERT_TRUE(WaitFor([&] { return ext->state().Stats().booked == 2; }));
  // kube-scheduler's dry run finds no victim (a slot is free) and never calls preempt; the
  // extender's filter starts its own preemption and says so in the FailedScheduling text.
  auto hi = Schedule(share("hi", "8000", 1000, "hi"));
  EXPECT_FALSE(hi.bound);
  EXPECT_FALSE(hi.preempt_called);
  EXPECT_NE(hi.message.find("no single GPU with 8000 MiB free"), std::string::npos) << hi.message;
  EXPECT_NE(WaitForEvent("GPUsUnavailable", "hi").value("note", "").find("(largest free: 2000 MiB"), std::string::npos);
  EXPECT_NE(hi.message.find("preempting 1 lower-priority pod(s) here: ns/low"), std::string::npos) << hi.message;
  // The victim is evicted (Terminating for its grace period, then gone); meanwhile nothing of
  // lower priority takes the node, and the preemptor binds there.
  ASSERT_TRUE(WaitFor([&] {
    return GetPod("ns", "low")["metadata"].contains("deletionTimestamp") || GetPod("ns", "low")["code"] == 404;
  }));
  auto sneaky = Schedule(share("sneaky", "1000", 5, "sneaky"));
  EXPECT_FALSE(sneaky.bound);
  EXPECT_NE(sneaky.message.find("held for a pod of higher or equal priority"), std::string::npos) << sneaky.message;
  EXPECT_NE(WaitForEvent("GPUsUnavailable", "sneaky").value("note", "").find("(pod ns/hi, priority 1000)"),
            std::string::npos);
  EXPECT_TRUE(RescheduleUntilBound("ns", "hi"));
  EXPECT_EQ(GetPod("ns", "hi")["spec"]["nodeName"], "share");
  EXPECT_EQ(GetPod("ns", "peer")["spec"]["nodeName"], "share");  // untouched
  EXPECT_EQ(ext->state().PreemptingOn(GetPod("ns", "hi")["metadata"]["uid"]), "");
  for (const auto& [id, u] : UseFromRecords()) EXPECT_LE(u.memory, 16000) << id;
  // Events on both sides (the recorder writes them on its own thread).
  std::set<std::pair<std::string, std::string>> seen;
  WaitFor([&] {
    auto events = client->List("/apis/events.k8s.io/v1/namespaces/ns/events");
    if (events.ok()) {
      for (const auto& e : (*events)["items"]) seen.insert({e.value("reason", ""), e["regarding"].value("name", "")});
    }
    return seen.contains({"Preempting", "hi"}) && seen.contains({"Preempted", "low"});
  });
  EXPECT_TRUE(seen.contains({"Preempting", "hi"}));
  EXPECT_TRUE(seen.contains({"Preempted", "low"}));

  // A PodDisruptionBudget that forbids the eviction: the preemption stops, says why, and the
  // hold ends (the guarded pod keeps running, others may use the node again).
  ASSERT_TRUE(Schedule(share("guarded", "4000", 10, "guarded")).bound);
  running("guarded");
  ASSERT_EQ(api.Create("poddisruptionbudgets", "ns",
                       {{"apiVersion", "policy/v1"},
                        {"kind", "PodDisruptionBudget"},
                        {"metadata", {{"name", "guard"}, {"namespace", "ns"}}},
                        {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"app", "guarded"}}}}}}}})
                .code,
            201);
  auto hi2 = Schedule(share("hi2", "4000", 1000, "hi2"));
  EXPECT_FALSE(hi2.bound);
  EXPECT_NE(hi2.message.find("preempting 1 lower-priority pod(s) here: ns/guarded"), std::string::npos) << hi2.message;
  EXPECT_TRUE(WaitFor([&] {
    return ext->MetricsText().find("kgpu_extender_preemptions_total{result=\"blocked\"} 1") != std::string::npos;
  }));
  EXPECT_FALSE(GetPod("ns", "guarded")["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(ext->state().PreemptingOn(GetPod("ns", "hi2")["metadata"]["uid"]), "");
  const json blocked = WaitForEvent("PreemptionBlocked", "hi2");
  EXPECT_TRUE(blocked.is_object());
  if (blocked.is_object()) {
    EXPECT_NE(blocked.value("note", "").find("Cannot preempt ns/guarded on node share"), std::string::npos)
        << blocked.dump();
  }
}

// Several victims, the second guarded by a PodDisruptionBudget that forbids its eviction: every
// eviction is first asked as a dry run (?dryRun=All), so the first victim is not evicted for a
// preemption that cannot complete. The dry run itself changes nothing (pod and budget as they were).
TEST_F(ExtenderTest, APreemptionThatABudgetWouldStopEvictsNoVictim) {
  StartForPreemption();
  auto share = [&](const std::string& name, const std::string& mib, int64_t prio) {
    ASSERT_TRUE(Schedule(SharePod(name, mib, prio, name)).bound) << name;
    MarkRunning(name);
  };
  share("first", "6000", 10);
  share("guarded", "6000", 20);
  ASSERT_EQ(api.Create("poddisruptionbudgets", "ns",
                       {{"apiVersion", "policy/v1"},
                        {"kind", "PodDisruptionBudget"},
                        {"metadata", {{"name", "guard"}, {"namespace", "ns"}}},
                        {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"app", "guarded"}}}}}}}})
                .code,
            201);
  ASSERT_TRUE(WaitFor([&] { return ext->state().Stats().booked == 2; }));

  // The stand-in's dry run, as the apiserver's: the budget's verdict, nothing stored or deleted.
  k8s::EvictOptions dry;
  dry.dry_run = true;
  const auto refused = client->Evict("ns", "guarded", dry);
  EXPECT_EQ(k8s::HttpStatus(refused), 429) << refused;
  EXPECT_TRUE(client->Evict("ns", "first", dry).ok());
  EXPECT_FALSE(GetPod("ns", "first")["metadata"].contains("deletionTimestamp"));
  auto bad = client->Create("/api/v1/namespaces/ns/pods/first/eviction?dryRun=Some",
                            {{"apiVersion", "policy/v1"}, {"kind", "Eviction"}, {"metadata", {{"name", "first"}}}});
  EXPECT_EQ(k8s::HttpStatus(bad.status()), 400) << bad.status();

  // 14000 MiB fits only with both gone: the plan names both, the dry run stops it before either.
  auto hi = Schedule([&] {
    json p = TestPod("ns", "hi", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "14000"}}, {}, 1000);
    return p;
  }());
  EXPECT_FALSE(hi.bound);
  EXPECT_NE(hi.message.find("preempting 2 lower-priority pod(s) here: ns/first, ns/guarded"), std::string::npos)
      << hi.message;
  EXPECT_TRUE(WaitFor([&] {
    return ext->MetricsText().find("kgpu_extender_preemptions_total{result=\"blocked\"} 1") != std::string::npos;
  }));
  EXPECT_EQ(ext->state().PreemptingOn(GetPod("ns", "hi")["metadata"]["uid"]), "");
  EXPECT_FALSE(GetPod("ns", "first")["metadata"].contains("deletionTimestamp"));
  EXPECT_FALSE(GetPod("ns", "guarded")["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(ext->MetricsText().find("kgpu_extender_preemption_victims_total 1"), std::string::npos);
  const json blocked = WaitForEvent("PreemptionBlocked", "hi");
  EXPECT_TRUE(blocked.is_object());
  if (blocked.is_object()) {
    EXPECT_NE(
        blocked.value("note", "").find("Cannot preempt ns/guarded on node share (asked as a dry run, nothing evicted)"),
        std::string::npos)
        << blocked.dump();
  }
}

// Two victims under one budget that allows one disruption: each dry run passes (it asks for one),
// so the extender reads the budget's status and stops the plan before evicting either. The
// stand-in keeps that status as the disruption controller does. With the budget raised to two,
// a new preemptor's plan goes through.
TEST_F(ExtenderTest, ABudgetGuardingSeveralVictimsStopsThePlanBeforeAnyEviction) {
  StartForPreemption();
  for (const auto& [name, prio] : std::vector<std::pair<std::string, int64_t>>{{"one", 10}, {"two", 20}}) {
    ASSERT_TRUE(Schedule(SharePod(name, "6000", prio, "batch")).bound) << name;
    MarkRunning(name);
  }
  json budget = {{"apiVersion", "policy/v1"},
                 {"kind", "PodDisruptionBudget"},
                 {"metadata", {{"name", "batch"}, {"namespace", "ns"}}},
                 {"spec", {{"maxUnavailable", 1}, {"selector", {{"matchLabels", {{"app", "batch"}}}}}}}};
  ASSERT_EQ(api.Create("poddisruptionbudgets", "ns", budget).code, 201);
  ASSERT_TRUE(WaitFor([&] { return ext->state().Stats().booked == 2; }));
  const json status = api.Get("poddisruptionbudgets", "ns", "batch").body["status"];
  EXPECT_EQ(status.value("expectedPods", -1), 2) << status.dump();
  EXPECT_EQ(status.value("currentHealthy", -1), 2) << status.dump();
  EXPECT_EQ(status.value("desiredHealthy", -1), 1) << status.dump();
  EXPECT_EQ(status.value("disruptionsAllowed", -1), 1) << status.dump();
  k8s::EvictOptions dry;
  dry.dry_run = true;
  EXPECT_TRUE(client->Evict("ns", "one", dry).ok());
  EXPECT_TRUE(client->Evict("ns", "two", dry).ok());

  auto hi = Schedule(TestPod("ns", "hi", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "14000"}}, {}, 1000));
  EXPECT_FALSE(hi.bound);
  EXPECT_NE(hi.message.find("preempting 2 lower-priority pod(s) here: ns/one, ns/two"), std::string::npos)
      << hi.message;
  EXPECT_TRUE(WaitFor([&] {
    return ext->MetricsText().find("kgpu_extender_preemptions_total{result=\"blocked\"} 1") != std::string::npos;
  }));
  EXPECT_FALSE(GetPod("ns", "one")["metadata"].contains("deletionTimestamp"));
  EXPECT_FALSE(GetPod("ns", "two")["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(ext->state().PreemptingOn(GetPod("ns", "hi")["metadata"]["uid"]), "");
  const json blocked = WaitForEvent("PreemptionBlocked", "hi");
  EXPECT_TRUE(blocked.is_object());
  if (blocked.is_object()) {
    EXPECT_NE(blocked.value("note", "")
                  .find("Cannot preempt ns/one, ns/two on node share: PodDisruptionBudget ns/batch "
                        "allows 1 disruption(s) now and guards 2 of the victims"),
              std::string::npos)
        << blocked.dump();
  }

  // Raised to two: the status follows, and the next preemptor evicts both and binds.
  budget = api.Get("poddisruptionbudgets", "ns", "batch").body;
  budget["spec"]["maxUnavailable"] = 2;
  ASSERT_EQ(api.Update("poddisruptionbudgets", "ns", budget).code, 200);
  EXPECT_EQ(api.Get("poddisruptionbudgets", "ns", "batch").body["status"].value("disruptionsAllowed", -1), 2);
  ASSERT_EQ(api.Delete("pods", "ns", "hi").code, 200);
  auto hi2 = Schedule(TestPod("ns", "hi2", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "14000"}}, {}, 1000));
  EXPECT_FALSE(hi2.bound);
  EXPECT_NE(hi2.message.find("preempting 2 lower-priority pod(s) here"), std::string::npos) << hi2.message;
  EXPECT_TRUE(RescheduleUntilBound("ns", "hi2"));
  EXPECT_EQ(GetPod("ns", "one")["code"], 404);
  EXPECT_EQ(GetPod("ns", "two")["code"], 404);
}

TEST_F(ExtenderTest, SixteenConcurrentBindsToOneNode) {
  AddNode(TestNode("n", {ShareGpu(40000), ShareGpu(40000)}));
  StartExtender();
  StartScheduler(Url());
  std::vector<json> pods;
  for (int i = 0; i < 16; ++i) {
    pods.push_back(
        CreatePod(TestPod("ns", "p" + std::to_string(i),
                          {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "5000"}, {"kgpu.io/gpu-cores", "10"}})));
  }
  // All 16 binding cycles at once, as kube-scheduler runs them (asynchronously per pod).
  std::vector<std::thread> threads;
  std::atomic<int> bound{0};
  httplib::Client probe("127.0.0.1", ext->port());
  for (const auto& p : pods) {
    threads.emplace_back([&, p] {
      httplib::Client http("127.0.0.1", ext->port());
      BindingArgs b{p["metadata"]["name"], "ns", p["metadata"]["uid"], "n"};
      auto r = http.Post("/gpu/bind", EncodeBindingArgs(b), "application/json");
      if (r && json::parse(r->body)["Error"] == "") ++bound;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bound.load(), 16);
  const auto use = UseFromRecords();
  int64_t total = 0;
  for (const auto& [id, u] : use) {
    EXPECT_LE(u.memory, 40000) << id;
    EXPECT_LE(u.cores, 100) << id;
    total += u.holders;
  }
  EXPECT_EQ(total, 16);
  ASSERT_TRUE(WaitFor([&] { return ext->state().Stats().booked == 16; }));
  // The extender's view matches the records on the pods exactly.
  for (const auto& p : pods) {
    const json now = GetPod("ns", p["metadata"]["name"]);
    EXPECT_EQ(now["spec"]["nodeName"], "n");
    EXPECT_EQ(*RecordOn(now), *ext->state().RecordOf(p["metadata"]["uid"]));
  }
}

TEST_F(ExtenderTest, ARestartedExtenderRebuildsFromRecordsAndNeverDoubleAllocates) {
  AddNode(TestNode("n", {ShareGpu(16000), ShareGpu(16000)}));
  StartExtender();
  StartScheduler(Url());
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(
        Schedule(TestPod("ns", "a" + std::to_string(i), {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "5000"}})).bound);
  }
  sched.reset();  // kube-scheduler's connections go first, as when it is restarted too
  ext->Stop();
  ext.reset();
  StartExtender();
  ASSERT_TRUE(WaitFor([&] { return ext->state().Stats().booked == 6; }));
  StartScheduler(Url());
  // 32000 - 30000 booked: room for no further 5000 MiB pod on either GPU... 16000 - 15000 = 1000 each.
  auto more = Schedule(TestPod("ns", "b0", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "5000"}}));
  EXPECT_FALSE(more.bound);
  EXPECT_NE(more.message.find("no single GPU with 5000 MiB free"), std::string::npos) << more.message;
  auto fits = Schedule(TestPod("ns", "b1", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}));
  EXPECT_TRUE(fits.bound) << fits.message;
  for (const auto& [id, u] : UseFromRecords()) EXPECT_LE(u.memory, 16000) << id;
  EXPECT_EQ(ext->state().Stats().record_conflicts, 0u);
}

// Only kube-scheduler may call the verbs (issue 36 §3): HTTPS, and filter, prioritize, preempt
// and bind only for a client certificate the client CA signed, as kube-scheduler's extender
// tlsConfig (certFile, keyFile, caFile) presents one. Anyone else who reaches the port is refused
// and counted; the probes and /metrics stay open.
TEST_F(ExtenderTest, ServesHttpsAndOnlyKubeSchedulersCertificateMayCallTheVerbs) {
  // The serving certificate (its own CA: kube-scheduler's caFile), the client CA (here the
  // client's own self-signed certificate) and a stranger's certificate.
  std::string cert, key, client_cert, client_key, other_cert, other_key;
  ASSERT_TRUE(testing::GenerateSelfSigned(cert, key).ok());
  ASSERT_TRUE(testing::GenerateSelfSigned(client_cert, client_key, "kgpu-scheduler", "clientAuth").ok());
  ASSERT_TRUE(testing::GenerateSelfSigned(other_cert, other_key, "intruder", "clientAuth").ok());
  char dir[] = "/tmp/kgpu-ext-tls-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d = dir;
  for (const auto& [name, pem] :
       std::initializer_list<std::pair<std::string, const std::string*>>{{"tls.crt", &cert},
                                                                         {"tls.key", &key},
                                                                         {"client.crt", &client_cert},
                                                                         {"client.key", &client_key},
                                                                         {"other.crt", &other_cert},
                                                                         {"other.key", &other_key}}) {
    std::ofstream(d + "/" + name) << *pem;
  }
  AddNode(TestNode("n", {ShareGpu()}));
  ExtenderOptions o;
  o.tls_cert_file = d + "/tls.crt";
  o.tls_key_file = d + "/tls.key";
  o.client_ca_file = d + "/client.crt";
  StartExtender(o);
  const json pod = CreatePod(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}));
  const std::string bind = R"({"PodName":"p","PodNamespace":"ns","PodUID":")" +
                           pod["metadata"]["uid"].get<std::string>() + R"(","Node":"n"})";
  // No client certificate: the probes and /metrics answer, the verbs do not.
  httplib::SSLClient anon("127.0.0.1", ext->port());
  anon.enable_server_certificate_verification(false);
  ASSERT_EQ(anon.Get("/healthz")->status, 200);
  ASSERT_EQ(anon.Get("/readyz")->status, 200);
  auto direct = anon.Post("/gpu/bind", bind, "application/json");
  ASSERT_TRUE(direct);
  EXPECT_EQ(direct->status, 403);
  EXPECT_NE(direct->body.find("a client certificate signed by its --client-ca-file is required"), std::string::npos)
      << direct->body;
  EXPECT_EQ(anon.Post("/gpu/filter", EncodeExtenderArgs(pod, {"n"}), "application/json")->status, 403);
  EXPECT_FALSE(GetPod("ns", "p")["spec"].contains("nodeName")) << "an unauthenticated bind placed the pod";
  const std::string metrics = anon.Get("/metrics")->body;
  EXPECT_NE(metrics.find(R"(kgpu_extender_unauthenticated_total{verb="bind"} 1)"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find(R"(kgpu_extender_unauthenticated_total{verb="filter"} 1)"), std::string::npos);
  // A certificate the client CA did not sign fails the handshake.
  httplib::SSLClient stranger("127.0.0.1", ext->port(), d + "/other.crt", d + "/other.key");
  stranger.enable_server_certificate_verification(false);
  EXPECT_FALSE(stranger.Post("/gpu/bind", bind, "application/json"));
  EXPECT_FALSE(GetPod("ns", "p")["spec"].contains("nodeName"));
  // kube-scheduler with its tlsConfig schedules the pod, verifying the extender's certificate.
  testing::FakeSchedulerOptions so;
  so.cert_file = d + "/client.crt";
  so.key_file = d + "/client.key";
  so.ca_file = d + "/tls.crt";
  StartScheduler("https://127.0.0.1:" + std::to_string(ext->port()), true, so);
  EXPECT_TRUE(RescheduleUntilBound("ns", "p"));
  EXPECT_EQ(GetPod("ns", "p")["spec"]["nodeName"], "n");
  EXPECT_EQ(sched->calls("bind"), 1u);
  // Flags: all three TLS files, or --insecure-http; never both, never a part.
  ExtenderOptions half;
  half.address = "127.0.0.1:0";
  half.tls_key_file = o.tls_key_file;
  Extender e2(*client, half);
  const auto st = e2.Start();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_NE(st.message().find("missing --tls-cert-file, --client-ca-file (--insecure-http serves plain HTTP"),
            std::string::npos)
      << st.message();
  ExtenderOptions both = o;
  both.address = "127.0.0.1:0";
  both.insecure_http = true;
  Extender e3(*client, both);
  EXPECT_EQ(e3.Start().message(),
            "--insecure-http serves plain HTTP: drop --tls-cert-file, --tls-key-file, --client-ca-file, "
            "--peer-cert-file and --peer-key-file, or drop --insecure-http");
  std::filesystem::remove_all(dir);
}

// The certificates deploy/extender/gen-certs.sh makes are the ones the manifests mount: with them
// kube-scheduler (its tlsConfig: client certificate, and the CA it verifies the extender's
// serving certificate with, here for the address the script was given) schedules a pod, and the
// extender's own serving certificate is no client certificate.
TEST_F(ExtenderTest, TheCertificatesGenCertsMakesLetKubeSchedulerIn) {
  char dir[] = "/tmp/kgpu-gen-certs-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d = dir;
  const auto gen = testing::Shell(std::string(KGPU_SOURCE_DIR) + "/deploy/extender/gen-certs.sh --out " + d +
                                  " --ip 127.0.0.1 --days 2");
  ASSERT_EQ(gen.code, 0) << gen.out;
  AddNode(TestNode("n", {ShareGpu()}));
  ExtenderOptions o;
  o.tls_cert_file = d + "/tls.crt";
  o.tls_key_file = d + "/tls.key";
  o.client_ca_file = d + "/ca.crt";
  StartExtender(o);
  testing::FakeSchedulerOptions so;
  so.cert_file = d + "/client.crt";
  so.key_file = d + "/client.key";
  so.ca_file = d + "/ca.crt";
  StartScheduler("https://127.0.0.1:" + std::to_string(ext->port()), true, so);
  auto s = Schedule(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}));
  EXPECT_TRUE(s.bound) << s.message;
  httplib::SSLClient posing("127.0.0.1", ext->port(), d + "/tls.crt", d + "/tls.key");
  posing.enable_server_certificate_verification(false);
  EXPECT_FALSE(posing.Post("/gpu/filter", "{}", "application/json")) << "a serving certificate passed as a client's";
  std::filesystem::remove_all(d);
}

// Under HTTPS (issue 36 §4), a standby passes a bind on to the leader presenting the peer
// certificate gen-certs.sh makes (the client CA signed it, so the leader's verbs accept it), and
// trusts only a leader that presents the serving certificate it serves with itself: a replica
// whose serving certificate differs passes nothing on to it.
TEST_F(ExtenderTest, AStandbyPassesBindsOnToTheLeaderOverMutualTls) {
  char dir[] = "/tmp/kgpu-ext-peer-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d = dir;
  for (const std::string sub : {"/one", "/two"}) {
    const auto gen = testing::Shell(std::string(KGPU_SOURCE_DIR) + "/deploy/extender/gen-certs.sh --out " + d + sub +
                                    " --ip 127.0.0.1 --days 2");
    ASSERT_EQ(gen.code, 0) << gen.out;
  }
  AddNode(TestNode("n", {ShareGpu(16000)}));
  ASSERT_EQ(api.Create("namespaces", "", {{"metadata", {{"name", "kgpu-system"}}}}).code, 201);  // the Lease's
  auto options = [&](const std::string& id, const std::string& serving) {
    ExtenderOptions o;
    o.address = "127.0.0.1:0";
    o.tls_cert_file = d + serving + "/tls.crt";
    o.tls_key_file = d + serving + "/tls.key";
    o.client_ca_file = d + "/one/ca.crt";
    o.peer_cert_file = d + "/one/peer.crt";
    o.peer_key_file = d + "/one/peer.key";
    o.leader_elect = true;
    o.lease_namespace = "kgpu-system";
    o.identity = id;
    o.lease_duration = std::chrono::milliseconds(2000);
    o.renew_deadline = std::chrono::milliseconds(1500);
    o.retry_period = std::chrono::milliseconds(250);
    return o;
  };
  // Without the peer certificate, --leader-elect under HTTPS is refused before anything starts.
  {
    ExtenderOptions o = options("x", "/one");
    o.peer_key_file.clear();
    Extender x(*client, o);
    const absl::Status st = x.Start();
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_NE(st.message().find("--peer-key-file"), std::string::npos) << st;
  }
  Extender a(*client, options("a", "/one"));
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(WaitFor([&] { return a.NotReadyReason().empty() && a.Leads(); })) << a.NotReadyReason();
  Extender b(*client, options("b", "/one"));
  ASSERT_TRUE(b.Start().ok());
  ASSERT_TRUE(WaitFor([&] { return b.NotReadyReason().empty(); }));
  EXPECT_FALSE(b.Leads());
  testing::FakeSchedulerOptions so;
  so.cert_file = d + "/one/client.crt";
  so.key_file = d + "/one/client.key";
  so.ca_file = d + "/one/ca.crt";
  StartScheduler("https://127.0.0.1:" + std::to_string(b.port()), true, so);
  auto one = Schedule(TestPod("ns", "one", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}}));
  EXPECT_TRUE(one.bound) << one.message;
  EXPECT_NE(b.MetricsText().find(R"(kgpu_extender_binds_total{result="forwarded"} 1)"), std::string::npos);
  EXPECT_NE(a.MetricsText().find(R"(kgpu_extender_binds_total{result="bound"} 1)"), std::string::npos);

  // Replica c serves with another certificate (the second set's): it does not trust a's.
  Extender c(*client, options("c", "/two"));
  ASSERT_TRUE(c.Start().ok());
  ASSERT_TRUE(WaitFor([&] { return c.NotReadyReason().empty(); }));
  so.ca_file = d + "/two/ca.crt";
  StartScheduler("https://127.0.0.1:" + std::to_string(c.port()), true, so);
  auto two = Schedule(TestPod("ns", "two", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}));
  EXPECT_FALSE(two.bound);
  EXPECT_NE(two.message.find("forwarding the bind to the leader at 127.0.0.1:" + std::to_string(a.port())),
            std::string::npos)
      << two.message;
  EXPECT_NE(two.message.find("SSL certificate problem"), std::string::npos) << two.message;
  EXPECT_TRUE(GetPod("ns", "two")["spec"].value("nodeName", "").empty());
  sched.reset();
  c.Stop();
  b.Stop();
  a.Stop();
  std::filesystem::remove_all(d);
}

TEST_F(ExtenderTest, FullNodeListModeThroughTheScheduler) {
  AddNode(TestNode("a", {ShareGpu(8000)}));
  AddNode(TestNode("b", {ShareGpu(16000)}));
  StartExtender();
  StartScheduler(Url(), /*cache_capable=*/false);
  auto s = Schedule(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "12000"}}));
  EXPECT_TRUE(s.bound) << s.message;
  EXPECT_EQ(s.node, "b");
}

// Two replicas with --leader-elect (issue 36 §4): each is ready once its informers have synced and
// answers filter and prioritize from its own state; only the Lease holder binds, and a standby
// passes the binds it gets on to the leader (the address on the Lease). When the leader is
// SIGKILLed (no release), the standby goes on answering filter — never offering what the dead
// leader booked — and its binds fail only until it takes the expired Lease: that gap is measured.
// A SIGTERMed leader hands over at once.
TEST_F(ExtenderTest, TwoReplicasBothAnswerFilterTheStandbyPassesBindsOnAndTakesOver) {
  AddNode(TestNode("n", {ShareGpu(16000)}));
  char dir[] = "/tmp/kgpu-ext-ha-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string kubeconfig = std::string(dir) + "/kubeconfig";
  std::ofstream(kubeconfig) << ExtenderKubeconfig(api);
  struct Replica {
    std::string id, log;
    pid_t pid = -1;
    int port = 0;
  };
  std::vector<Replica> replicas = {{"replica-a", std::string(dir) + "/a.log"},
                                   {"replica-b", std::string(dir) + "/b.log"}};
  auto text = [](const std::string& path) {
    std::stringstream t;
    t << std::ifstream(path).rdbuf();
    return t.str();
  };
  auto start = [&](Replica& r) {
    testing::SpawnOptions so;
    so.log = r.log;
    r.pid = testing::Spawn({KGPU_BIN, "extender", "--insecure-http", "--kubeconfig", kubeconfig, "--address",
                            "127.0.0.1:0", "--leader-elect", "--leader-elect-resource-namespace", "kgpu-system",
                            "--identity", r.id, "--leader-elect-lease-duration", "2s", "--leader-elect-renew-deadline",
                            "1500ms", "--leader-elect-retry-period", "250ms"},
                           so);
    ASSERT_GT(r.pid, 0) << std::strerror(errno);
    ASSERT_TRUE(WaitFor([&] {
      const std::string content = text(r.log);
      const size_t at = content.find("listening on port ");
      if (at == std::string::npos) return false;
      r.port = std::atoi(content.c_str() + at + std::strlen("listening on port "));
      return r.port > 0;
    })) << text(r.log);
  };
  for (auto& r : replicas) {
    start(r);
    if (HasFatalFailure()) return;
  }
  auto ready = [&](const Replica& r, std::string* body = nullptr) {
    httplib::Client http("127.0.0.1", r.port);
    auto res = http.Get("/readyz");
    if (res && body != nullptr) *body = res->body;
    return res && res->status == 200;
  };
  // A gauge or counter from the replica's /metrics; -1 when it cannot be read.
  auto metric = [&](const Replica& r, const std::string& series) -> double {
    httplib::Client http("127.0.0.1", r.port);
    auto res = http.Get("/metrics");
    if (!res) return -1;
    std::istringstream in(res->body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(series + " ", 0) == 0) return std::atof(line.c_str() + series.size() + 1);
    }
    return 0;
  };
  auto leads = [&](const Replica& r) { return metric(r, "kgpu_extender_leader") == 1; };
  int leader = -1;
  ASSERT_TRUE(WaitFor([&] {
    if (!ready(replicas[0]) || !ready(replicas[1])) return false;
    const bool a = leads(replicas[0]), b = leads(replicas[1]);
    if (a == b) return false;
    leader = a ? 0 : 1;
    return true;
  })) << "both replicas ready, one of them leading\n"
      << text(replicas[0].log) << text(replicas[1].log);
  Replica& first = replicas[static_cast<size_t>(leader)];
  Replica& second = replicas[static_cast<size_t>(1 - leader)];
  // The leader wrote where it is reached on its Lease.
  const json lease = api.Get("leases", "kgpu-system", "kgpu-extender").body;
  EXPECT_EQ(lease["spec"].value("holderIdentity", ""), first.id) << lease.dump();
  EXPECT_EQ(lease["metadata"].value("annotations", json::object()).value(kLeaderAddressAnnotation, ""),
            "127.0.0.1:" + std::to_string(first.port))
      << lease.dump();
  // The standby answers filter from its own informers.
  const json probe = CreatePod(TestPod("ns", "probe", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}));
  {
    httplib::Client http("127.0.0.1", second.port);
    auto f = http.Post("/gpu/filter", EncodeExtenderArgs(probe, {"n"}), "application/json");
    ASSERT_TRUE(f);
    EXPECT_EQ(f->status, 200) << f->body;
    EXPECT_EQ(json::parse(f->body)["NodeNames"], json::array({"n"})) << f->body;
    // A bind another replica passed on is never passed on again (no loop between two standbys).
    const std::string bind = R"({"PodName":"probe","PodNamespace":"ns","PodUID":")" +
                             probe["metadata"]["uid"].get<std::string>() + R"(","Node":"n"})";
    auto looped = http.Post("/gpu/bind", {{kForwardedHeader, "replica-x"}}, bind, "application/json");
    ASSERT_TRUE(looped);
    EXPECT_EQ(looped->status, 200) << looped->body;
    EXPECT_NE(looped->body.find("does not lead"), std::string::npos) << looped->body;
    EXPECT_TRUE(GetPod("ns", "probe")["spec"].value("nodeName", "").empty());
    // Preemption is the leader's (its holds live in its memory): a standby keeps no candidate.
    auto pe = http.Post("/gpu/preempt", EncodePreemptionArgs(probe, {{"n", {{"some-uid"}, 0}}}), "application/json");
    ASSERT_TRUE(pe);
    EXPECT_EQ(pe->status, 200) << pe->body;
    EXPECT_EQ(json::parse(pe->body)["NodeNameToMetaVictims"], json::object()) << pe->body;
  }
  // kube-scheduler reaches the standby through the Service: the bind is the leader's.
  StartScheduler("http://127.0.0.1:" + std::to_string(second.port));
  auto one = Schedule(TestPod("ns", "one", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}}));
  ASSERT_TRUE(one.bound) << one.message << text(second.log);
  EXPECT_EQ(metric(second, R"(kgpu_extender_binds_total{result="forwarded"})"), 1);
  EXPECT_NE(text(first.log).find("bound ns/one to n"), std::string::npos) << text(first.log);
  EXPECT_TRUE(RecordOn(GetPod("ns", "one"))) << GetPod("ns", "one").dump();

  // The leader dies without releasing the Lease.
  kill(first.pid, SIGKILL);
  int status = 0;
  waitpid(first.pid, &status, 0);
  const auto t0 = std::chrono::steady_clock::now();
  // The standby still answers filter, from its own record of "one": 10000 of 16000 MiB are taken.
  auto two = Schedule(TestPod("ns", "two", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "10000"}}));
  EXPECT_FALSE(two.bound) << "double allocation after the leader died";
  EXPECT_NE(two.message.find("no single GPU with 10000 MiB free"), std::string::npos) << two.message;
  // A pod that fits: filter passes at once; its bind waits for the standby to lead (kube-scheduler
  // retries the pod after a failed binding cycle, as this loop does).
  const bool standby_then = !leads(second);
  CreatePod(TestPod("ns", "three", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "6000"}}));
  int failed_binds = 0;
  std::string first_failure;
  ASSERT_TRUE(WaitFor([&] {
    auto r = sched->ScheduleOne(GetPod("ns", "three"));
    if (r.ok() && r->bound) return true;
    if (r.ok() && r->node == "n") {  // filtered and prioritized to n, the binding failed
      ++failed_binds;
      if (first_failure.empty()) first_failure = r->message;
    }
    return false;
  })) << text(second.log);
  const double gap = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("binds resumed %.2f s after the leader was killed (lease 2 s, retry 0.25 s); %d failed meanwhile\n", gap,
              failed_binds);
  EXPECT_LT(gap, 20.0) << "lease 2 s, retry 0.25 s";
  EXPECT_TRUE(leads(second));
  if (standby_then) {
    EXPECT_GT(failed_binds, 0) << "bound before the standby led";
    EXPECT_NE(first_failure.find("forwarding the bind to the leader at 127.0.0.1:" + std::to_string(first.port)),
              std::string::npos)
        << first_failure;
  }
  for (const auto& [gpu, use] : UseFromRecords()) EXPECT_LE(use.memory, 16000) << gpu;

  // A stopped leader (SIGTERM: a rollout) hands over at once: it releases the Lease before it
  // drains its HTTP connections, and closes each keep-alive connection after its next reply, so
  // kube-scheduler reconnects through the Service to a replica that is ready. A client holds a
  // keep-alive connection open, which keeps the stopping replica's HTTP server draining for its
  // keep-alive timeout: the other replica must lead before that one has exited.
  Replica third{"replica-c", std::string(dir) + "/c.log"};
  start(third);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(WaitFor([&] { return ready(third) && metric(third, "kgpu_extender_leader") == 0; })) << text(third.log);
  httplib::Client held("127.0.0.1", second.port);
  held.set_keep_alive(true);
  ASSERT_TRUE(held.Get("/healthz"));
  kill(second.pid, SIGTERM);
  bool exited_first = false;
  ASSERT_TRUE(WaitFor([&] {
    if (!exited_first && waitpid(second.pid, &status, WNOHANG) == second.pid) exited_first = true;
    return leads(third);
  })) << text(third.log);
  EXPECT_FALSE(exited_first) << "the Lease was released only when the stopping leader exited";
  // The held connection is still served (the drain has not ended, so the Lease went first): one
  // more reply, "stopping" (not ready), marked to close.
  auto r = held.Post("/gpu/filter", EncodeExtenderArgs(probe, {"n"}), "application/json");
  ASSERT_TRUE(r) << "the held connection was closed before the standby took over: " << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_NE(r->body.find("stopping"), std::string::npos) << r->body;
  EXPECT_EQ(r->get_header_value("Connection"), "close");
  if (!exited_first) waitpid(second.pid, &status, 0);
  kill(third.pid, SIGTERM);
  waitpid(third.pid, &status, 0);
  std::filesystem::remove_all(dir);
}

TEST_F(ExtenderTest, TheKgpuExtenderProcess) {
  AddNode(TestNode("n", {ShareGpu()}));
  char dir[] = "/tmp/kgpu-ext-proc-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string kubeconfig = std::string(dir) + "/kubeconfig", log = std::string(dir) + "/log";
  std::ofstream(kubeconfig) << ExtenderKubeconfig(api);
  // Port 0: the extender binds a free port and logs it. (A port probed by the test and handed over
  // is a race: httplib's probe socket stays bound and listening with SO_REUSEPORT, and half the
  // connections then land in its never-accepted queue.)
  testing::SpawnOptions so;
  so.log = log;
  const pid_t pid = testing::Spawn(
      {KGPU_BIN, "extender", "--insecure-http", "--kubeconfig", kubeconfig, "--address", "127.0.0.1:0"}, so);
  ASSERT_GT(pid, 0) << std::strerror(errno);
  int port = 0;
  ASSERT_TRUE(WaitFor([&] {
    std::stringstream text;
    text << std::ifstream(log).rdbuf();
    const std::string content = text.str();
    const size_t at = content.find("listening on port ");
    if (at == std::string::npos) return false;
    port = std::atoi(content.c_str() + at + std::strlen("listening on port "));
    return port > 0;
  })) << std::ifstream(log).rdbuf();
  httplib::Client http("127.0.0.1", port);
  ASSERT_TRUE(WaitFor([&] {
    auto r = http.Get("/readyz");
    return r && r->status == 200;
  })) << std::ifstream(log).rdbuf();
  const json pod = CreatePod(TestPod("ns", "p", {{"kgpu.io/gpu", "1"}, {"kgpu.io/gpu-memory", "1000"}}));
  http.set_read_timeout(60, 0);  // a loaded 2-core machine
  http.set_keep_alive(true);     // as kube-scheduler's Go client: the connection stays open, idle
  auto f = http.Post("/filter", EncodeExtenderArgs(pod, {"n"}), "application/json");
  ASSERT_TRUE(f) << httplib::to_string(f.error()) << "\n" << std::ifstream(log).rdbuf();
  EXPECT_EQ(json::parse(f->body)["NodeNames"], json({"n"}));
  // SIGTERM with an idle keep-alive connection open: the extender does not wait for the client to
  // hang up (it took 5-7 s when it did); kube-scheduler reconnects to the next replica.
  const auto term = std::chrono::steady_clock::now();
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_TRUE(WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }));
  const auto took = std::chrono::steady_clock::now() - term;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_LT(took, std::chrono::seconds(5)) << "SIGTERM to exit with an idle keep-alive connection open";
  // A bad policy name is a usage error that lists the choices.
  const std::string cmd =
      std::string(KGPU_BIN) + " extender --insecure-http --kubeconfig " + kubeconfig + " --policy nope 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int rc = pclose(p);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
  EXPECT_NE(out.find("nope"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kgpu::extender
