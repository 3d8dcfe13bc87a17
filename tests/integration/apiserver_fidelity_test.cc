// The API server stand-in against the exact requests other clients send (Go's net/http as kubectl
// and client-go use it): what kube-apiserver does on the wire, not only what kgpu's client needs.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <zlib.h>

#include "testing/fake_apiserver.h"
#include "testing/fake_apiserver_tables.h"
#include "testing/poll.h"
#include "testing/raw_http.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;
using namespace std::chrono_literals;

json Pod(const std::string& name, const json& annotations = json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", annotations}}},
          {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox:1.36"}}}}}}};
}

std::string Gunzip(const std::string& in) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return "";
  std::string out;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  char buf[65536];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
  }
  inflateEnd(&z);
  return rc == Z_STREAM_END ? out : "";
}

// The body of a chunked response (the chunks joined).
std::string Dechunk(const std::string& raw) {
  std::string body;
  size_t pos = raw.find("\r\n\r\n");
  if (pos == std::string::npos) return body;
  pos += 4;
  for (;;) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t n = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
    if (n == 0 || eol + 2 + n > raw.size()) break;
    body += raw.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
  return body;
}

class ApiServerFidelityTest : public ::testing::Test {
 protected:
  void Start(FakeApiServerOptions opts = {}) {
    server_ = std::make_unique<FakeApiServer>(opts);
    ASSERT_TRUE(server_->Start().ok());
  }
  void SetUp() override { Start(); }
  std::unique_ptr<FakeApiServer> server_;
};

// kubectl get pods -w (and every client-go informer) sends Accept-Encoding: gzip; kube-apiserver
// does not compress a watch, so each event reaches the client when it happens.
TEST_F(ApiServerFidelityTest, AWatchFromAGzipClientDeliversEachEventAtOnce) {
  ASSERT_EQ(server_->Create("pods", "default", Pod("p")).code, 201);
  const int64_t rv = server_->ResourceVersion();
  RawHttp w(server_->port());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w.Get("/api/v1/namespaces/default/pods?resourceVersion=" + std::to_string(rv) + "&watch=true"));
  ASSERT_TRUE(w.ReadFor(2s, "\r\n\r\n"));
  EXPECT_NE(w.Head().find("200 OK"), std::string::npos) << w.Head();
  EXPECT_EQ(w.Head().find("Content-Encoding"), std::string::npos) << w.Head();
  for (int i = 0; i < 3; ++i) {
    auto got = server_->Get("pods", "default", "p");
    got.body["metadata"]["labels"]["n"] = std::to_string(i);
    ASSERT_EQ(server_->Update("pods", "default", got.body).code, 200);
    const std::string want = "\"n\":\"" + std::to_string(i) + "\"";
    ASSERT_TRUE(w.ReadFor(3s, want));
    EXPECT_NE(Dechunk(w.received()).find(want), std::string::npos) << "event " << i << " not delivered";
  }
  const std::string body = Dechunk(w.received());
  EXPECT_NE(body.find("{\"object\":"), std::string::npos) << body.substr(0, 200);
}

// Lists: gzip only at 128 KiB and above (kube-apiserver's defaultGzipThresholdBytes).
TEST_F(ApiServerFidelityTest, ListsAreCompressedOnlyAboveTheThreshold) {
  ASSERT_EQ(server_->Create("pods", "default", Pod("small")).code, 201);
  {
    RawHttp c(server_->port());
    ASSERT_TRUE(c.Get("/api/v1/namespaces/default/pods"));
    c.ReadFor(3s, "\"items\"");
    EXPECT_EQ(c.Head().find("Content-Encoding"), std::string::npos) << c.Head();
  }
  const std::string filler(4096, 'x');
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(server_->Create("pods", "default", Pod("big-" + std::to_string(i), {{"filler", filler}})).code, 201);
  }
  RawHttp c(server_->port());
  ASSERT_TRUE(c.Get("/api/v1/namespaces/default/pods"));
  c.ReadFor(5s);
  ASSERT_NE(c.Head().find("Content-Encoding: gzip"), std::string::npos) << c.Head();
  std::string raw = c.received().substr(c.received().find("\r\n\r\n") + 4);
  if (c.Head().find("chunked") != std::string::npos) raw = Dechunk(c.received());
  const json list = json::parse(Gunzip(raw), nullptr, false);
  ASSERT_FALSE(list.is_discarded());
  EXPECT_EQ(list["items"].size(), 41u);
}

// Clients that go away (kubectl get -w stopped with ^C, a killed curl) release their watches at
// once, without an event to write; watches, open or abandoned, never starve other requests.
TEST_F(ApiServerFidelityTest, AbandonedWatchesAreReleasedAndNeverStarveOtherRequests) {
  std::vector<std::unique_ptr<RawHttp>> watches;
  for (int i = 0; i < 100; ++i) {
    watches.push_back(std::make_unique<RawHttp>(server_->port()));
    ASSERT_TRUE(watches.back()->Get("/api/v1/pods?watch=true"));
  }
  ASSERT_TRUE(WaitFor([&] { return server_->OpenWatches() == 100; }, 20s)) << server_->OpenWatches();
  {
    RawHttp v(server_->port());
    ASSERT_TRUE(v.Get("/version"));
    v.ReadFor(5s, "gitVersion");
    EXPECT_NE(v.received().find("gitVersion"), std::string::npos) << "/version starved by 100 open watches";
  }
  watches.clear();  // every client gone, no event written since
  EXPECT_TRUE(WaitFor([&] { return server_->OpenWatches() == 0; }, 5s))
      << server_->OpenWatches() << " watches still held after their clients left";
  RawHttp v(server_->port());
  ASSERT_TRUE(v.Get("/version"));
  v.ReadFor(5s, "gitVersion");
  EXPECT_NE(v.received().find("gitVersion"), std::string::npos);
}

// timeoutSeconds is honoured; without it the server ends a watch after a random time between
// --min-request-timeout and twice that, as kube-apiserver does.
TEST_F(ApiServerFidelityTest, WatchesEndAtTheirTimeout) {
  FakeApiServerOptions o;
  o.min_request_timeout = 1s;
  Start(o);
  const auto t0 = std::chrono::steady_clock::now();
  RawHttp asked(server_->port()), unasked(server_->port());
  ASSERT_TRUE(asked.Get("/api/v1/pods?watch=true&timeoutSeconds=1"));
  ASSERT_TRUE(unasked.Get("/api/v1/pods?watch=true"));
  asked.ReadFor(5s, "0\r\n\r\n");
  const auto t_asked = std::chrono::steady_clock::now() - t0;
  unasked.ReadFor(5s, "0\r\n\r\n");
  const auto t_unasked = std::chrono::steady_clock::now() - t0;
  EXPECT_NE(asked.received().find("\r\n0\r\n\r\n"), std::string::npos) << asked.received();
  EXPECT_NE(unasked.received().find("\r\n0\r\n\r\n"), std::string::npos) << unasked.received();
  EXPECT_GE(t_asked, 900ms);
  EXPECT_LT(t_asked, 4s);
  EXPECT_GE(t_unasked, 900ms);
  EXPECT_LT(t_unasked, 4s);
}

// A raw request and its JSON answer (status code and body), as a Go client sends it.
struct Answer {
  int code = 0;
  json body;
  std::string head;
};
Answer Call(int port, const std::string& method, const std::string& target, const std::string& body = "",
            const std::string& content_type = "application/json", const std::string& accept = "application/json") {
  RawHttp c(port);
  std::string req = method + " " + target +
                    " HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kubectl/v1.32.4 (linux/amd64)\r\n" +
                    "Accept: " + accept + "\r\nAccept-Encoding: gzip\r\nConnection: close\r\n";
  if (!body.empty())
    req += "Content-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  c.Send(req + "\r\n" + body);
  while (c.ReadFor(5s)) {
  }
  Answer a;
  a.head = c.Head();
  if (a.head.size() > 12) a.code = std::atoi(a.head.substr(9, 3).c_str());
  std::string raw = c.received().substr(std::min(c.received().size(), a.head.size() + 4));
  if (a.head.find("chunked") != std::string::npos) raw = Dechunk(c.received());
  a.body = json::parse(raw, nullptr, false);
  return a;
}

// kubectl prints `The Pod "p" is invalid: spec: Forbidden: ...` only from details.causes.
TEST_F(ApiServerFidelityTest, InvalidCarriesItsCauses) {
  ASSERT_EQ(server_->Create("pods", "default", Pod("p")).code, 201);
  auto a = Call(server_->port(), "PATCH", "/api/v1/namespaces/default/pods/p?fieldManager=kubectl-patch",
                R"({"spec":{"containers":[{"name":"c","env":[{"name":"K","value":"1"}]}]}})",
                "application/strategic-merge-patch+json");
  ASSERT_EQ(a.code, 422) << a.body.dump();
  EXPECT_EQ(a.body["reason"], "Invalid");
  ASSERT_EQ(a.body["details"]["causes"].size(), 1u) << a.body.dump();
  const json cause = a.body["details"]["causes"][0];
  EXPECT_EQ(cause["reason"], "FieldValueForbidden");
  EXPECT_EQ(cause["field"], "spec");
  EXPECT_EQ(cause["message"].get<std::string>().rfind("Forbidden: pod updates may not change fields other than", 0), 0u)
      << cause.dump();
  EXPECT_EQ(a.body["message"].get<std::string>().rfind("Pod \"p\" is invalid: spec: Forbidden: pod updates", 0), 0u);
  // A second container: ValidateContainerUpdates' own message.
  a = Call(server_->port(), "PATCH", "/api/v1/namespaces/default/pods/p",
           R"({"spec":{"containers":[{"name":"c","image":"busybox:1.36"},{"name":"d","image":"busybox"}]}})",
           "application/merge-patch+json");
  ASSERT_EQ(a.code, 422);
  EXPECT_EQ(a.body["details"]["causes"][0]["field"], "spec.containers");
  EXPECT_EQ(a.body["details"]["causes"][0]["message"], "Forbidden: pod updates may not add or remove containers");
  // An image change is allowed, and a read-modify-write of the stored (defaulted) pod too.
  auto cur = server_->Get("pods", "default", "p").body;
  cur["spec"]["containers"][0]["image"] = "busybox:1.37";
  EXPECT_EQ(server_->Update("pods", "default", cur).code, 200);
  // Admission's 422 (an extended resource without a limit) has causes as well.
  json bad = Pod("bad");
  bad["spec"]["containers"][0]["resources"] = {{"requests", {{"nvidia.com/gpu", "1"}}}};
  a = Call(server_->port(), "POST", "/api/v1/namespaces/default/pods", bad.dump());
  ASSERT_EQ(a.code, 422) << a.body.dump();
  EXPECT_EQ(a.body["details"]["causes"][0]["field"], "spec.containers[0].resources.limits");
}

TEST_F(ApiServerFidelityTest, FieldSelectorsAreThoseTheKindSupports) {
  ASSERT_EQ(server_->Create("pods", "default", Pod("p")).code, 201);
  auto a = Call(server_->port(), "GET", "/api/v1/namespaces/default/pods?fieldSelector=spec.bogus%3Dx");
  ASSERT_EQ(a.code, 400) << a.body.dump();
  EXPECT_EQ(a.body["reason"], "BadRequest");
  EXPECT_EQ(a.body["message"], "field label not supported: spec.bogus");
  a = Call(server_->port(), "GET", "/api/v1/pods?watch=true&fieldSelector=spec.bogus%3Dx");
  EXPECT_EQ(a.code, 400);
  a = Call(server_->port(), "GET", "/api/v1/namespaces/default/configmaps?fieldSelector=data.a%3Db");
  ASSERT_EQ(a.code, 400);
  EXPECT_EQ(a.body["message"], R"("data.a" is not a known field selector: only "metadata.name", "metadata.namespace")");
  // The selectable values: an unset boolean is "false"; spec.host is spec.nodeName.
  a = Call(server_->port(), "GET", "/api/v1/namespaces/default/pods?fieldSelector=spec.hostNetwork%3Dfalse");
  ASSERT_EQ(a.code, 200);
  EXPECT_EQ(a.body["items"].size(), 1u);
  a = Call(server_->port(), "GET", "/api/v1/namespaces/default/pods?fieldSelector=spec.host%3D");
  ASSERT_EQ(a.code, 200);
  EXPECT_EQ(a.body["items"].size(), 1u);
  ASSERT_EQ(server_->Create("nodes", "", {{"metadata", {{"name", "n1"}}}}).code, 201);
  a = Call(server_->port(), "GET", "/api/v1/nodes?fieldSelector=spec.unschedulable%3Dfalse");
  ASSERT_EQ(a.code, 200);
  EXPECT_EQ(a.body["items"].size(), 1u);
}

std::vector<std::string> ColumnNames(const json& table) {
  std::vector<std::string> v;
  for (const auto& c : table["columnDefinitions"]) v.push_back(c["name"]);
  return v;
}

TEST_F(ApiServerFidelityTest, TablesCarryThePrintersColumns) {
  const std::string table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
  json ev = {{"metadata", {{"name", "gpu-node-1.xid"}, {"namespace", "default"}}},
             {"involvedObject", {{"kind", "Node"}, {"name", "gpu-node-1"}}},
             {"reason", "XidError"},
             {"message", "GPU 2: XID 79  "},
             {"type", "Warning"},
             {"source", {{"component", "kgpu-device-plugin"}, {"host", "gpu-node-1"}}},
             {"count", 3}};
  ASSERT_EQ(server_->Create("events", "default", ev).code, 201);
  auto a = Call(server_->port(), "GET", "/api/v1/namespaces/default/events", "", "", table);
  ASSERT_EQ(a.code, 200) << a.body.dump();
  EXPECT_EQ(ColumnNames(a.body), (std::vector<std::string>{"Last Seen", "Type", "Reason", "Object", "Subobject",
                                                           "Source", "Message", "First Seen", "Count", "Name"}));
  const json cells = a.body["rows"][0]["cells"];
  EXPECT_EQ(cells[1], "Warning");
  EXPECT_EQ(cells[2], "XidError");
  EXPECT_EQ(cells[3], "node/gpu-node-1");
  EXPECT_EQ(cells[5], "kgpu-device-plugin, gpu-node-1");
  EXPECT_EQ(cells[6], "GPU 2: XID 79");
  EXPECT_EQ(cells[8], 3);
  EXPECT_EQ(cells[0], "<unknown>");  // no timestamps at all

  ASSERT_EQ(server_->Create("pods", "default", Pod("p")).code, 201);
  a = Call(server_->port(), "GET", "/api/v1/namespaces/default/pods", "", "", table);
  EXPECT_EQ(ColumnNames(a.body), (std::vector<std::string>{"Name", "Ready", "Status", "Restarts", "Age", "IP", "Node",
                                                           "Nominated Node", "Readiness Gates"}));
  EXPECT_EQ(a.body["rows"][0]["cells"][2], "Pending");
  EXPECT_EQ(a.body["rows"][0]["cells"][7], "<none>");
  EXPECT_EQ(a.body["rows"][0]["cells"][8], "<none>");
  EXPECT_EQ(HumanAge(-1), "0s");
  EXPECT_EQ(HumanAge(3 * 365 * 86400.0 + 5 * 86400), "3y5d");
}

TEST_F(ApiServerFidelityTest, DiscoveryListsBindingsAndTheLegacyBindingWorks) {
  auto a = Call(server_->port(), "GET", "/api/v1");
  bool bindings = false, eviction_group = false;
  for (const auto& r : a.body["resources"]) {
    if (r["name"] == "bindings")
      bindings = r["kind"] == "Binding" && r["namespaced"] == true && r["verbs"] == json({"create"});
    if (r["name"] == "pods/eviction")
      eviction_group = r.value("group", "") == "policy" && r.value("version", "") == "v1";
  }
  EXPECT_TRUE(bindings) << a.body.dump();
  EXPECT_TRUE(eviction_group);
  ASSERT_EQ(server_->Create("pods", "default", Pod("p")).code, 201);
  a = Call(server_->port(), "POST", "/api/v1/namespaces/default/bindings",
           R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"p"},"target":{"kind":"Node","name":"n1"}})");
  EXPECT_EQ(a.code, 201) << a.body.dump();
  EXPECT_EQ(server_->Get("pods", "default", "p").body["spec"]["nodeName"], "n1");
  // kubectl's client-side validation of a `kind: List` needs the OpenAPI v2 document.
  RawHttp v2(server_->port());
  ASSERT_TRUE(v2.Get("/openapi/v2?timeout=32s", "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"));
  v2.ReadFor(3s, "\r\n\r\n");
  EXPECT_NE(v2.Head().find("200 OK"), std::string::npos) << v2.Head();
}

TEST_F(ApiServerFidelityTest, WritesGetTheDefaultsAndAdmissionKubeApiserverApplies) {
  // Pod defaults, admission, qosClass.
  json p = Pod("p");
  p["spec"]["containers"][0]["image"] = "busybox";
  p["spec"]["containers"][0]["ports"] = {{{"containerPort", 80}}};
  auto a = Call(server_->port(), "POST", "/api/v1/namespaces/default/pods?fieldManager=kubectl-create", p.dump());
  ASSERT_EQ(a.code, 201) << a.body.dump();
  const json spec = a.body["spec"];
  EXPECT_EQ(spec["restartPolicy"], "Always");
  EXPECT_EQ(spec["dnsPolicy"], "ClusterFirst");
  EXPECT_EQ(spec["enableServiceLinks"], true);
  EXPECT_EQ(spec["schedulerName"], "default-scheduler");
  EXPECT_EQ(spec["terminationGracePeriodSeconds"], 30);
  EXPECT_EQ(spec["priority"], 0);
  EXPECT_EQ(spec["preemptionPolicy"], "PreemptLowerPriority");
  EXPECT_EQ(spec["serviceAccountName"], "default");
  EXPECT_EQ(spec["securityContext"], json::object());
  const json c = spec["containers"][0];
  EXPECT_EQ(c["imagePullPolicy"], "Always");  // no tag is :latest
  EXPECT_EQ(c["terminationMessagePath"], "/dev/termination-log");
  EXPECT_EQ(c["terminationMessagePolicy"], "File");
  EXPECT_EQ(c["ports"][0]["protocol"], "TCP");
  EXPECT_EQ(
      spec["tolerations"],
      json::parse(
          R"([{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300},
                            {"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}])"));
  EXPECT_EQ(a.body["status"]["qosClass"], "BestEffort");
  ASSERT_EQ(a.body["metadata"]["managedFields"].size(), 1u);
  const json mf = a.body["metadata"]["managedFields"][0];
  EXPECT_EQ(mf["manager"], "kubectl-create");
  EXPECT_EQ(mf["operation"], "Update");
  EXPECT_EQ(mf["fieldsType"], "FieldsV1");
  EXPECT_TRUE(mf["fieldsV1"]["f:spec"]["f:containers"].contains(R"(k:{"name":"c"})")) << mf.dump();
  // A label from another manager: it owns that label only.
  a = Call(server_->port(), "PATCH", "/api/v1/namespaces/default/pods/p?fieldManager=kubectl-label",
           R"({"metadata":{"labels":{"a":"b"}}})", "application/merge-patch+json");
  ASSERT_EQ(a.code, 200);
  ASSERT_EQ(a.body["metadata"]["managedFields"].size(), 2u);
  EXPECT_EQ(a.body["metadata"]["managedFields"][1]["manager"], "kubectl-label");
  EXPECT_EQ(a.body["metadata"]["managedFields"][1]["fieldsV1"],
            json::parse(R"({"f:metadata":{"f:labels":{"f:a":{}}}})"));
  // Guaranteed and Burstable.
  json g = Pod("g");
  g["spec"]["containers"][0]["resources"] = {{"limits", {{"cpu", "1"}, {"memory", "1Gi"}}}};
  EXPECT_EQ(server_->Create("pods", "default", g).body["status"]["qosClass"], "Guaranteed");
  json b = Pod("b");
  b["spec"]["containers"][0]["resources"] = {{"requests", {{"cpu", "1"}}}};
  EXPECT_EQ(server_->Create("pods", "default", b).body["status"]["qosClass"], "Burstable");

  // LimitRanger notes what it set.
  ASSERT_EQ(server_
                ->Create("limitranges", "default",
                         {{"metadata", {{"name", "lr"}}},
                          {"spec",
                           {{"limits",
                             {{{"type", "Container"},
                               {"default", {{"cpu", "500m"}, {"memory", "256Mi"}}},
                               {"defaultRequest", {{"cpu", "100m"}}}}}}}}})
                .code,
            201);
  const json lp = server_->Create("pods", "default", Pod("lp")).body;
  EXPECT_EQ(lp["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
            "LimitRanger plugin set: cpu, memory request for container c; cpu, memory limit for container c")
      << lp["metadata"].dump();

  // A new node is tainted not-ready until the lifecycle controller sees it Ready.
  a = Call(server_->port(), "POST", "/api/v1/nodes", R"({"metadata":{"name":"n1"}})");
  ASSERT_EQ(a.code, 201);
  EXPECT_EQ(a.body["spec"]["taints"], json::parse(R"([{"key":"node.kubernetes.io/not-ready","effect":"NoSchedule"}])"));
  a = Call(server_->port(), "PATCH", "/api/v1/nodes/n1/status",
           R"({"status":{"conditions":[{"type":"Ready","status":"True"}]}})", "application/merge-patch+json");
  ASSERT_EQ(a.code, 200);
  EXPECT_FALSE(a.body["spec"].contains("taints")) << a.body["spec"].dump();
  a = Call(server_->port(), "PATCH", "/api/v1/nodes/n1", R"({"spec":{"unschedulable":true}})",
           "application/strategic-merge-patch+json");
  EXPECT_EQ(a.body["spec"]["taints"],
            json::parse(R"([{"key":"node.kubernetes.io/unschedulable","effect":"NoSchedule"}])"));
}

TEST_F(ApiServerFidelityTest, AnEvictedPodGetsTheDisruptionTargetConditionFirst) {
  json p = Pod("p");
  p["spec"]["nodeName"] = "n1";
  ASSERT_EQ(server_->Create("pods", "default", p).code, 201);
  auto cur = server_->Get("pods", "default", "p").body;
  cur["status"]["phase"] = "Running";
  ASSERT_EQ(server_->Update("pods", "default", cur).code, 200);  // (in-process updates write status too)
  const int64_t rv = server_->ResourceVersion();
  RawHttp w(server_->port());
  ASSERT_TRUE(w.Get("/api/v1/namespaces/default/pods?watch=true&resourceVersion=" + std::to_string(rv)));
  auto a = Call(server_->port(), "POST", "/api/v1/namespaces/default/pods/p/eviction",
                R"({"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p"}})");
  ASSERT_EQ(a.code, 201) << a.body.dump();
  ASSERT_TRUE(w.ReadFor(3s, "EvictionByEvictionAPI"));
  const std::string events = Dechunk(w.received());
  const auto cond = events.find("\"DisruptionTarget\"");
  ASSERT_NE(cond, std::string::npos) << events;
  EXPECT_NE(events.find("Eviction API: evicting"), std::string::npos);
}

}  // namespace
}  // namespace kgpu::testing
