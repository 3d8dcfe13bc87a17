// The Kubernetes client against the API server stand-in: in-process (every fault injected
// directly) and as a separate process driven over HTTP(S) with its /_fake controls.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/files.h"
#include "k8s/client.h"
#include "k8s/events.h"
#include "k8s/informer.h"
#include "k8s/leader.h"
#include "testing/fake_apiserver.h"
#include "testing/poll.h"
#include "testing/spawn.h"

namespace kgpu::k8s {
namespace {
using json = nlohmann::json;
using testing::FakeApiServer;
using testing::FakeApiServerOptions;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

using testing::WaitFor;  // testing/poll.h

json NodeObj(const std::string& name, int gpus = 8) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", name}, {"labels", {{"kubernetes.io/hostname", name}}}}},
          {"spec", {{"futureField", {{"kept", true}}}}},
          {"status",
           {{"capacity", {{"nvidia.com/gpu", std::to_string(gpus)}, {"cpu", "64"}}},
            {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
}

json PodObj(const std::string& name, const std::string& ns = "default", const json& labels = json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", labels}}},
          {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}};
}

class K8sClientTest : public ::testing::Test {
 protected:
  void StartServer(FakeApiServerOptions opts = {}) {
    server_ = std::make_unique<FakeApiServer>(opts);
    ASSERT_TRUE(server_->Start().ok());
    Config c;
    c.server = server_->url();
    c.ca_pem = server_->ca_pem();
    c.qps = 0;  // tests measure behaviour, not the limiter
    c.timeout = 10s;
    auto cl = Client::Create(c);
    ASSERT_TRUE(cl.ok());
    client_ = std::move(*cl);
  }
  void SetUp() override { StartServer(); }
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<Client> client_;
};

const Resource& R(const char* name) {
  return *FindResource(name);
}

ListOptions Paged(int64_t n) {
  ListOptions o;
  o.limit = n;
  return o;
}

TEST_F(K8sClientTest, UnknownFieldsSurviveReadModifyWrite) {
  // A server newer than this client: it knows spec.futureField, the client does not.
  FakeApiServerOptions newer;
  newer.extra_fields = {{"Node", {"spec.futureField"}}};
  StartServer(newer);
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n1")).ok());
  auto updated = client_->UpdateWithRetry(R("nodes").Path("", "n1"), [](json& n) {
    n["metadata"]["labels"]["x"] = "y";
    return absl::OkStatus();
  });
  ASSERT_TRUE(updated.ok()) << updated.status();
  auto stored = server_->Get("nodes", "", "n1");
  EXPECT_EQ(stored.body["spec"]["futureField"]["kept"], true);
  EXPECT_EQ(stored.body["metadata"]["labels"]["x"], "y");
  EXPECT_EQ(stored.body["status"]["allocatable"]["nvidia.com/gpu"], "8") << "allocatable defaults from capacity";
  EXPECT_EQ(server_->LastUserAgent().rfind("kgpu/", 0), 0u) << server_->LastUserAgent();
}

TEST_F(K8sClientTest, ErrorsCarryStatus) {
  auto missing = client_->Get(R("pods").Path("default", "nope"));
  EXPECT_TRUE(IsApiNotFound(missing.status()));
  EXPECT_NE(std::string(missing.status().message()).find("pods \"nope\" not found"), std::string::npos);
  ASSERT_TRUE(client_->Create(R("configmaps").Path("default"), {{"metadata", {{"name", "a"}}}}).ok());
  auto dup = client_->Create(R("configmaps").Path("default"), {{"metadata", {{"name", "a"}}}});
  EXPECT_EQ(HttpStatus(dup.status()), 409);
  EXPECT_EQ(Reason(dup.status()), "AlreadyExists");
  auto no_ns = client_->Create(R("configmaps").Path("nope"), {{"metadata", {{"name", "a"}}}});
  EXPECT_EQ(HttpStatus(no_ns.status()), 404);
  auto gen = client_->Create(R("configmaps").Path("default"), {{"metadata", {{"generateName", "cm-"}}}});
  ASSERT_TRUE(gen.ok());
  EXPECT_EQ((*gen)["metadata"]["name"].get<std::string>().size(), 8u);
  auto invalid = client_->Create(R("pods").Path("default"), {{"metadata", {{"name", "p"}}}, {"spec", json::object()}});
  EXPECT_EQ(HttpStatus(invalid.status()), 422);
  EXPECT_NE(std::string(invalid.status().message()).find("spec.containers: Required value"), std::string::npos);
}

TEST_F(K8sClientTest, ListPaginatesAndSelects) {
  for (int i = 0; i < 25; ++i) {
    ASSERT_TRUE(
        client_
            ->Create(R("configmaps").Path("default"),
                     {{"metadata", {{"name", "cm" + std::to_string(i)}, {"labels", {{"even", i % 2 ? "no" : "yes"}}}}}})
            .ok());
  }
  const uint64_t before = server_->Requests();
  ListOptions lo;
  lo.limit = 10;
  auto all = client_->List(R("configmaps").Path("default"), lo);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)["items"].size(), 25u);
  EXPECT_EQ(server_->Requests() - before, 3u) << "three pages of 10";
  EXPECT_FALSE((*all)["metadata"].contains("continue"));
  lo.label_selector = "even=yes";
  EXPECT_EQ((*client_->List(R("configmaps").Path("default"), lo))["items"].size(), 13u);
  lo.label_selector = "";
  lo.field_selector = "metadata.name=cm3";
  EXPECT_EQ((*client_->List(R("configmaps").Path(), lo))["items"].size(), 1u);
  // A continue token that outlived compaction: the client restarts the list once.
  auto page = client_->ListPage(R("configmaps").Path("default"), Paged(5));
  ASSERT_TRUE(page.ok());
  // As kube-apiserver: a page without selectors says how many items follow; one with a selector
  // cannot, and the last page has neither a continue token nor a count.
  EXPECT_EQ((*page)["metadata"].value("remainingItemCount", -1), 20);
  ListOptions selected = Paged(5);
  selected.label_selector = "even=yes";
  auto even = client_->ListPage(R("configmaps").Path("default"), selected);
  ASSERT_TRUE(even.ok());
  EXPECT_TRUE((*even)["metadata"].contains("continue"));
  EXPECT_FALSE((*even)["metadata"].contains("remainingItemCount"));
  auto last = client_->ListPage(R("configmaps").Path("default"), Paged(30));
  ASSERT_TRUE(last.ok());
  EXPECT_FALSE((*last)["metadata"].contains("remainingItemCount"));
  ASSERT_TRUE(client_->Create(R("configmaps").Path("default"), {{"metadata", {{"name", "late"}}}}).ok());
  server_->Compact();
  auto expired =
      client_->ListPage(R("configmaps").Path("default"), Paged(5), (*page)["metadata"]["continue"].get<std::string>());
  EXPECT_TRUE(IsApiGone(expired.status())) << expired.status();
  EXPECT_EQ((*client_->List(R("configmaps").Path("default"), Paged(5)))["items"].size(), 26u);
}

TEST_F(K8sClientTest, ConflictIsRetriedWithAFreshRead) {
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n1")).ok());
  int calls = 0;
  auto r = client_->UpdateWithRetry(R("nodes").Path("", "n1"), [&](json& n) {
    if (++calls == 1) {
      // Somebody else writes between our read and our write.
      json other = server_->Get("nodes", "", "n1").body;
      other["metadata"]["labels"]["other"] = "1";
      EXPECT_EQ(server_->Update("nodes", "", other).code, 200);
    }
    n["metadata"]["labels"]["mine"] = "1";
    return absl::OkStatus();
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ((*r)["metadata"]["labels"]["other"], "1");
  EXPECT_EQ((*r)["metadata"]["labels"]["mine"], "1");
  // A stale resourceVersion without the helper is a 409.
  json stale = *r;
  stale["metadata"]["resourceVersion"] = "1";
  auto c = client_->Update(R("nodes").Path("", "n1"), stale);
  EXPECT_TRUE(IsApiConflict(c.status()));
  EXPECT_NE(std::string(c.status().message()).find("the object has been modified"), std::string::npos);
}

TEST_F(K8sClientTest, PatchTypesAndStatus) {
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n1")).ok());
  const std::string p = R("nodes").Path("", "n1");
  ASSERT_TRUE(client_->Patch(p, {{"metadata", {{"labels", {{"a", "1"}}}}}}, "application/merge-patch+json").ok());
  ASSERT_TRUE(client_->Patch(p, {{"spec", {{"taints", {{{"key", "t"}, {"effect", "NoSchedule"}}}}}}}).ok());
  auto j = client_->Patch(p, json::parse(R"([{"op":"add","path":"/metadata/labels/b","value":"2"}])"),
                          "application/json-patch+json");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["metadata"]["labels"]["a"], "1");
  EXPECT_EQ((*j)["metadata"]["labels"]["b"], "2");
  EXPECT_EQ((*j)["spec"]["taints"][0]["key"], "t");
  // The main resource ignores status; the status subresource writes only status.
  auto ignored =
      client_->Patch(p, {{"status", {{"capacity", {{"nvidia.com/gpu", "1"}}}}}}, "application/merge-patch+json");
  ASSERT_TRUE(ignored.ok());
  EXPECT_EQ((*ignored)["status"]["capacity"]["nvidia.com/gpu"], "8");
  auto st = client_->Patch(
      R("nodes").Path("", "n1", "status"),
      {{"status", {{"allocatable", {{"nvidia.com/gpu", "4"}}}}}, {"metadata", {{"labels", {{"z", "1"}}}}}},
      "application/strategic-merge-patch+json");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ((*st)["status"]["allocatable"]["nvidia.com/gpu"], "4");
  EXPECT_FALSE((*st)["metadata"]["labels"].contains("z"));
  auto bad = client_->Patch(p, json::parse(R"([{"op":"remove","path":"/nope"}])"), "application/json-patch+json");
  EXPECT_EQ(HttpStatus(bad.status()), 422);
}

TEST_F(K8sClientTest, DeletePreconditionsAndGracefulPods) {
  auto cm = client_->Create(R("configmaps").Path("default"), {{"metadata", {{"name", "a"}}}});
  ASSERT_TRUE(cm.ok());
  DeleteOptions wrong;
  wrong.precondition_uid = "not-the-uid";
  EXPECT_TRUE(IsApiConflict(client_->Delete(R("configmaps").Path("default", "a"), wrong).status()));
  DeleteOptions right;
  right.precondition_uid = (*cm)["metadata"]["uid"];
  right.propagation_policy = "Background";
  EXPECT_TRUE(client_->Delete(R("configmaps").Path("default", "a"), right).ok());
  EXPECT_TRUE(IsApiNotFound(client_->Get(R("configmaps").Path("default", "a")).status()));
  // An unscheduled pod goes at once; a bound one terminates with its grace period.
  ASSERT_TRUE(client_->Create(R("pods").Path("default"), PodObj("loose")).ok());
  ASSERT_TRUE(client_->Delete(R("pods").Path("default", "loose")).ok());
  EXPECT_TRUE(IsApiNotFound(client_->Get(R("pods").Path("default", "loose")).status()));
  json bound = PodObj("bound");
  bound["spec"]["nodeName"] = "n1";
  bound["spec"]["terminationGracePeriodSeconds"] = 1;
  ASSERT_TRUE(client_->Create(R("pods").Path("default"), bound).ok());
  ASSERT_TRUE(client_->Delete(R("pods").Path("default", "bound")).ok());
  auto terminating = client_->Get(R("pods").Path("default", "bound"));
  ASSERT_TRUE(terminating.ok());
  EXPECT_TRUE((*terminating)["metadata"].contains("deletionTimestamp"));
  EXPECT_TRUE(WaitFor([&] { return IsApiNotFound(client_->Get(R("pods").Path("default", "bound")).status()); }));
}

// pods/binding as kube-apiserver's BindingREST does it: the Binding's metadata.uid is a
// precondition, and its annotations are merged into the pod in the same write as spec.nodeName.
TEST_F(K8sClientTest, BindingCarriesAnnotationsUnderAUidPrecondition) {
  auto created = client_->Create(R("pods").Path("default"), PodObj("p2", "default", {{"app", "web"}}));
  ASSERT_TRUE(created.ok());
  const std::string uid = (*created)["metadata"]["uid"];
  const std::string rv = (*created)["metadata"]["resourceVersion"];
  Client::BindOptions stale;
  stale.uid = "not-" + uid;
  stale.annotations["example.com/a"] = "x";
  auto refused = client_->Bind("default", "p2", "n1", stale);
  EXPECT_TRUE(IsApiConflict(refused)) << refused;
  EXPECT_NE(std::string(refused.message()).find("Precondition failed: UID in precondition: not-" + uid),
            std::string::npos)
      << refused;
  auto untouched = client_->Get(R("pods").Path("default", "p2"));
  ASSERT_TRUE(untouched.ok());
  EXPECT_FALSE((*untouched)["spec"].contains("nodeName"));
  EXPECT_EQ((*untouched)["metadata"]["resourceVersion"], rv);

  Client::BindOptions ok;
  ok.uid = uid;
  ok.annotations["example.com/a"] = "x";
  ASSERT_TRUE(client_->Bind("default", "p2", "n1", ok).ok());
  auto bound = client_->Get(R("pods").Path("default", "p2"));
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ((*bound)["spec"]["nodeName"], "n1");
  EXPECT_EQ((*bound)["metadata"]["annotations"]["example.com/a"], "x");
  EXPECT_EQ((*bound)["metadata"]["labels"]["app"], "web");  // merged, nothing else replaced
  // One write: the resourceVersion moved once.
  EXPECT_EQ(std::stoll((*bound)["metadata"]["resourceVersion"].get<std::string>()), std::stoll(rv) + 1);
}

TEST_F(K8sClientTest, BindingAndEvictionWithBudgets) {
  ASSERT_TRUE(client_->Create(R("pods").Path("default"), PodObj("p1", "default", {{"app", "web"}})).ok());
  ASSERT_TRUE(client_->Bind("default", "p1", "n1").ok());
  EXPECT_EQ((*client_->Get(R("pods").Path("default", "p1")))["spec"]["nodeName"], "n1");
  auto again = client_->Bind("default", "p1", "n2");
  EXPECT_TRUE(IsApiConflict(again));
  EXPECT_NE(std::string(again.message()).find("is already assigned to node \"n1\""), std::string::npos) << again;
  // The pod runs; a budget needing one healthy pod forbids evicting it.
  json running = server_->Get("pods", "default", "p1").body;
  running["status"]["phase"] = "Running";
  ASSERT_EQ(server_->Update("pods", "default", running).code, 200);
  ASSERT_TRUE(client_
                  ->Create(R("poddisruptionbudgets").Path("default"),
                           {{"metadata", {{"name", "web-pdb"}}},
                            {"spec", {{"minAvailable", 1}, {"selector", {{"matchLabels", {{"app", "web"}}}}}}}})
                  .ok());
  auto raw = client_->Create(R("pods").Path("default", "p1", "eviction"),
                             {{"apiVersion", "policy/v1"}, {"kind", "Eviction"}, {"metadata", {{"name", "p1"}}}});
  EXPECT_EQ(HttpStatus(raw.status()), 429);
  EXPECT_NE(
      std::string(raw.status().message()).find("Cannot evict pod as it would violate the pod's disruption budget."),
      std::string::npos);
  EvictOptions quick;
  quick.max_wait = 300ms;
  EXPECT_EQ(client_->Evict("default", "p1", quick).code(), absl::StatusCode::kDeadlineExceeded);
  // A second healthy replica arrives while the evictor backs off: the retry then succeeds.
  std::thread replica([&] {
    std::this_thread::sleep_for(300ms);
    auto p2 = PodObj("p2", "default", {{"app", "web"}});
    p2["spec"]["nodeName"] = "n2";
    server_->Create("pods", "default", p2);
    json r2 = server_->Get("pods", "default", "p2").body;
    r2["status"]["phase"] = "Running";
    server_->Update("pods", "default", r2);
  });
  EvictOptions patient;
  patient.max_wait = 20s;
  EXPECT_TRUE(client_->Evict("default", "p1", patient).ok());
  replica.join();
  EXPECT_TRUE(client_->Evict("default", "gone-already").ok()) << "404 counts as done";
}

TEST_F(K8sClientTest, ServerErrorsAreRetriedAndTimeoutsBite) {
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n1")).ok());
  server_->FailNext(2, 500);
  EXPECT_TRUE(client_->Get(R("nodes").Path("", "n1")).ok()) << "GET retried over two 500s";
  server_->FailNext(10, 503);
  auto failed = client_->Get(R("nodes").Path("", "n1"));
  EXPECT_EQ(HttpStatus(failed.status()), 503);
  // A write is not retried on 500.
  auto srv = std::make_unique<FakeApiServer>();
  ASSERT_TRUE(srv->Start().ok());
  Config c;
  c.server = srv->url();
  c.timeout = 300ms;
  c.qps = 0;
  auto slow_client = std::move(*Client::Create(c));
  srv->DelayNext(1, 1500ms);
  const auto t0 = std::chrono::steady_clock::now();
  auto slow = slow_client->Create(R("configmaps").Path("default"), {{"metadata", {{"name", "x"}}}});
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded) << slow.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1400ms);
  EXPECT_TRUE(WaitFor([&] { return slow_client->Get(R("namespaces").Path("", "default")).ok(); }));
  // max_tries 1: a GET is not retried (a caller on someone else's clock, e.g. kubelet's).
  c.max_tries = 1;
  auto once = std::move(*Client::Create(c));
  srv->FailNext(1, 500);
  EXPECT_EQ(HttpStatus(once->Get(R("namespaces").Path("", "default")).status()), 500);
  EXPECT_TRUE(once->Get(R("namespaces").Path("", "default")).ok());
}

TEST_F(K8sClientTest, WatchStreamsAndResumes) {
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n1")).ok());
  auto list = client_->List(R("nodes").Path());
  const std::string rv = (*list)["metadata"]["resourceVersion"];
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n2")).ok());
  ASSERT_TRUE(client_->Delete(R("nodes").Path("", "n1")).ok());
  std::vector<std::string> seen;
  WatchOptions wo;
  wo.resource_version = rv;
  wo.timeout_seconds = 2;
  auto s = client_->Watch(R("nodes").Path(), wo, [&](const WatchEvent& ev) {
    if (ev.type != "BOOKMARK") seen.push_back(ev.type + " " + ev.object["metadata"].value("name", ""));
    return seen.size() < 2;
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED n2", "DELETED n1"}));
  // Bookmarks arrive on an idle watch that allows them.
  bool bookmark = false;
  wo.resource_version = std::to_string(server_->ResourceVersion());
  EXPECT_TRUE(client_
                  ->Watch(R("nodes").Path(), wo,
                          [&](const WatchEvent& ev) {
                            bookmark =
                                ev.type == "BOOKMARK" && !ev.object["metadata"].value("resourceVersion", "").empty();
                            return !bookmark;
                          })
                  .ok());
  EXPECT_TRUE(bookmark);
  // A compacted version answers an ERROR event with code 410.
  server_->Compact();
  int code = 0;
  wo.resource_version = rv;
  EXPECT_TRUE(client_
                  ->Watch(R("nodes").Path(), wo,
                          [&](const WatchEvent& ev) {
                            if (ev.type == "ERROR") code = ev.object.value("code", 0);
                            return ev.type != "ERROR";
                          })
                  .ok());
  EXPECT_EQ(code, 410);
  // stop_token ends a watch promptly.
  std::stop_source stop;
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    stop.request_stop();
  });
  wo.resource_version = "";
  wo.timeout_seconds = 60;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(client_
                  ->Watch(
                      R("nodes").Path(), wo, [](const WatchEvent&) { return true; }, stop.get_token())
                  .ok());
  t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

// The watch cache keeps a window of events: a version that fell out of it answers 410 (as
// kube-apiserver's watch cache does), one inside it resumes; no Compact() involved.
TEST_F(K8sClientTest, WatchOlderThanTheHistoryWindowIsGone) {
  FakeApiServerOptions o;
  o.history_window = 2;
  StartServer(o);
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n0")).ok());
  const std::string rv0 = std::to_string(server_->ResourceVersion());
  for (const char* n : {"n1", "n2", "n3"}) ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj(n)).ok());
  WatchOptions wo;
  wo.timeout_seconds = 2;
  wo.resource_version = rv0;
  int code = 0;
  EXPECT_TRUE(client_
                  ->Watch(R("nodes").Path(), wo,
                          [&](const WatchEvent& ev) {
                            if (ev.type == "ERROR") code = ev.object.value("code", 0);
                            return ev.type != "ERROR";
                          })
                  .ok());
  EXPECT_EQ(code, 410) << "3 events since rv " << rv0 << " with a window of 2";
  // From the version before the last event: still in the window, the event comes.
  wo.resource_version = std::to_string(server_->ResourceVersion() - 1);
  std::vector<std::string> seen;
  EXPECT_TRUE(client_
                  ->Watch(R("nodes").Path(), wo,
                          [&](const WatchEvent& ev) {
                            if (ev.type == "ERROR") seen.push_back("ERROR");
                            if (ev.type == "ADDED") seen.push_back(ev.object["metadata"].value("name", ""));
                            return seen.empty();
                          })
                  .ok());
  EXPECT_EQ(seen, std::vector<std::string>{"n3"});
}

struct Recorder {
  std::mutex mu;
  std::vector<std::string> log;
  Handlers handlers() {
    return {[this](const json& o) { Add("add " + o["metadata"].value("name", "")); },
            [this](const json&, const json& n) { Add("update " + n["metadata"].value("name", "")); },
            [this](const json& o) { Add("delete " + o["metadata"].value("name", "")); }};
  }
  void Add(const std::string& s) {
    std::lock_guard l(mu);
    log.push_back(s);
  }
  bool Has(const std::string& s) {
    std::lock_guard l(mu);
    return std::find(log.begin(), log.end(), s) != log.end();
  }
  size_t Count(const std::string& s) {
    std::lock_guard l(mu);
    return static_cast<size_t>(std::count(log.begin(), log.end(), s));
  }
};

TEST_F(K8sClientTest, InformerSyncsResumesAndRelists) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n" + std::to_string(i))).ok());
  InformerOptions io;
  io.path = R("nodes").Path();
  io.page_size = 2;
  io.initial_backoff = 10ms;
  Informer inf(*client_, io);
  Recorder rec;
  inf.AddHandler(rec.handlers());
  inf.AddIndexer("gpus", [](const json& n) {
    return std::vector<std::string>{n["status"]["capacity"].value("nvidia.com/gpu", "0")};
  });
  EXPECT_FALSE(inf.HasSynced());
  inf.Start();
  ASSERT_TRUE(inf.WaitForSync(30s));
  EXPECT_EQ(inf.store().Size(), 3u);
  EXPECT_TRUE(rec.Has("add n0") && rec.Has("add n2"));
  ASSERT_TRUE(WaitFor([&] { return server_->OpenWatches() >= 1; }));
  // As client-go's reflector: the first list from the watch cache (resourceVersion=0), gzip
  // accepted on lists and not on watches, a watch timeout of 300-600 s.
  std::vector<std::string> lists, watches;
  for (const auto& r : server_->RequestLog()) {
    if (r.rfind("GET /api/v1/nodes?", 0) != 0) continue;
    (r.find("watch=true") != std::string::npos ? watches : lists).push_back(r);
  }
  ASSERT_FALSE(lists.empty());
  ASSERT_FALSE(watches.empty());
  EXPECT_NE(lists[0].find("resourceVersion=0"), std::string::npos) << lists[0];
  EXPECT_NE(lists[0].find(" (gzip)"), std::string::npos) << lists[0];
  EXPECT_EQ(watches[0].find(" (gzip)"), std::string::npos) << watches[0];
  const auto t = watches[0].find("timeoutSeconds=");
  ASSERT_NE(t, std::string::npos) << watches[0];
  const int timeout = std::atoi(watches[0].c_str() + t + 15);
  EXPECT_GE(timeout, 300);
  EXPECT_LE(timeout, 600);
  ASSERT_TRUE(
      client_
          ->Patch(R("nodes").Path("", "n1"), {{"metadata", {{"labels", {{"a", "b"}}}}}}, "application/merge-patch+json")
          .ok());
  EXPECT_TRUE(WaitFor([&] { return rec.Has("update n1"); }));
  // A dropped watch resumes from the last resourceVersion: no relist, nothing missed.
  server_->DropWatches();
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n3", 4)).ok());
  EXPECT_TRUE(WaitFor([&] { return rec.Has("add n3"); }));
  EXPECT_EQ(inf.stats().lists, 1u);
  EXPECT_GE(inf.stats().watches, 2u);
  EXPECT_EQ(inf.store().ByIndex("gpus", "4").size(), 1u);
  // The watch is cut and cannot come back while a node is deleted and the history compacted:
  // its resourceVersion is then too old (410), the informer relists, and the deletion is
  // still delivered.
  server_->FailNext(100000, 503, "", "watch");
  server_->DropWatches();
  ASSERT_TRUE(client_->Delete(R("nodes").Path("", "n0")).ok());
  server_->Compact();
  EXPECT_TRUE(WaitFor([&] { return inf.stats().errors >= 1; })) << "the watch was refused at least once";
  server_->ClearFaults();
  EXPECT_TRUE(WaitFor([&] { return rec.Has("delete n0"); }));
  EXPECT_TRUE(WaitFor([&] { return inf.stats().lists >= 2; }));
  EXPECT_GE(inf.stats().gone, 1u);
  EXPECT_EQ(inf.store().Size(), 3u);
  {
    // The relist after 410 Gone is a consistent list (no resourceVersion=0).
    std::string last_list;
    for (const auto& r : server_->RequestLog()) {
      if (r.rfind("GET /api/v1/nodes?", 0) == 0 && r.find("watch=true") == std::string::npos) last_list = r;
    }
    EXPECT_EQ(last_list.find("resourceVersion=0"), std::string::npos) << last_list;
  }
  // The watch after the relist keeps working.
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n4")).ok());
  EXPECT_TRUE(WaitFor([&] { return rec.Has("add n4"); }));
  inf.Stop();
}

TEST_F(K8sClientTest, InformerResyncAndFailingLists) {
  ASSERT_TRUE(client_->Create(R("nodes").Path(), NodeObj("n0")).ok());
  server_->FailNext(8, 500, "/api/v1/nodes");  // the first list fails several times (after GET retries)
  InformerOptions io;
  io.path = R("nodes").Path();
  io.resync = 200ms;
  io.initial_backoff = 10ms;
  Informer inf(*client_, io);
  Recorder rec;
  inf.AddHandler(rec.handlers());
  inf.Start();
  ASSERT_TRUE(inf.WaitForSync(30s));
  EXPECT_GE(inf.stats().errors, 1u);
  EXPECT_TRUE(WaitFor([&] { return rec.Count("update n0") >= 2; })) << "resync redelivers";
  inf.Stop();
}

TEST_F(K8sClientTest, EventsAggregate) {
  EventRecorder rec(*client_, "kgpu/node", "node-1");
  ObjectRef node{"v1", "Node", "", "n1", "uid-1"};
  ASSERT_TRUE(rec.Record(node, "Normal", "GPUsFound", "Discover", "8 GPUs").ok());
  ASSERT_TRUE(rec.Record(node, "Normal", "GPUsFound", "Discover", "8 GPUs").ok());
  ASSERT_TRUE(rec.Record(node, "Warning", "GPULost", "Health", "GPU 3 fell off the bus").ok());
  auto list = client_->List("/apis/events.k8s.io/v1/namespaces/default/events");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ((*list)["items"].size(), 2u);
  int64_t series = 0;
  for (const auto& e : (*list)["items"]) {
    if (e["reason"] == "GPUsFound") series = e["series"].value("count", 0);
  }
  EXPECT_EQ(series, 2);
}

TEST_F(K8sClientTest, LeaderElectionHandsOver) {
  auto make = [&](const std::string& id, std::atomic<int>& leading) {
    LeaderElectionConfig cfg;
    cfg.ns = "kube-system";
    cfg.name = "kgpu-extender";
    cfg.identity = id;
    cfg.lease_duration = 2s;
    cfg.renew_deadline = 1500ms;
    cfg.retry_period = 100ms;
    cfg.on_started_leading = [&leading](std::stop_token st) {
      ++leading;
      while (!st.stop_requested()) std::this_thread::sleep_for(10ms);
      --leading;
    };
    return cfg;
  };
  std::atomic<int> a_leads{0}, b_leads{0};
  LeaderElector a(*client_, make("a", a_leads));
  LeaderElector b(*client_, make("b", b_leads));
  std::jthread ta([&](std::stop_token st) { a.Run(st); });
  ASSERT_TRUE(WaitFor([&] { return a.IsLeader(); }));
  std::jthread tb([&](std::stop_token st) { b.Run(st); });
  std::this_thread::sleep_for(500ms);
  EXPECT_FALSE(b.IsLeader()) << "only one leader";
  EXPECT_EQ(a_leads + b_leads, 1);
  ta.request_stop();
  ta.join();  // releases the Lease
  ASSERT_TRUE(WaitFor([&] { return b.IsLeader(); }, 10s));
  auto lease = server_->Get("leases", "kube-system", "kgpu-extender");
  EXPECT_EQ(lease.body["spec"]["holderIdentity"], "b");
  EXPECT_EQ(lease.body["spec"]["leaseTransitions"], 1);
}

TEST_F(K8sClientTest, QuotaAdmissionThroughTheApi) {
  ASSERT_TRUE(client_->Create(R("namespaces").Path(), {{"metadata", {{"name", "team-a"}}}}).ok());
  ASSERT_TRUE(
      client_
          ->Create(R("resourcequotas").Path("team-a"),
                   {{"metadata", {{"name", "gpu-quota"}}}, {"spec", {{"hard", {{"requests.nvidia.com/gpu", "2"}}}}}})
          .ok());
  json pod = PodObj("a", "team-a");
  pod["spec"]["containers"][0]["resources"] = {{"limits", {{"nvidia.com/gpu", "2"}}}};
  ASSERT_TRUE(client_->Create(R("pods").Path("team-a"), pod).ok());
  auto q = client_->Get(R("resourcequotas").Path("team-a", "gpu-quota"));
  EXPECT_EQ((*q)["status"]["used"]["requests.nvidia.com/gpu"], "2");
  pod["metadata"]["name"] = "b";
  pod["spec"]["containers"][0]["resources"] = {{"limits", {{"nvidia.com/gpu", "1"}}}};
  auto refused = client_->Create(R("pods").Path("team-a"), pod);
  EXPECT_EQ(HttpStatus(refused.status()), 403);
  EXPECT_NE(std::string(refused.status().message())
                .find("pods \"b\" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, used: "
                      "requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"),
            std::string::npos)
      << refused.status();
  ASSERT_TRUE(client_->Delete(R("pods").Path("team-a", "a")).ok());
  EXPECT_EQ(
      (*client_->Get(R("resourcequotas").Path("team-a", "gpu-quota")))["status"]["used"]["requests.nvidia.com/gpu"],
      "0");
  EXPECT_TRUE(client_->Create(R("pods").Path("team-a"), pod).ok());
}

// fieldValidation as kube-apiserver 1.32 does it (fake_apiserver_fields.h): Strict refuses
// unknown fields (400 on create/update, 422 on patch), Warn (also no parameter) and Ignore drop
// them, Warn with a Warning header each; a directive it does not know is a 422.
TEST_F(K8sClientTest, FieldValidationStrictWarnIgnore) {
  const std::string pods = R("pods").Path("default");
  json pod = PodObj("strict");
  pod["bogus"] = 1;
  pod["spec"]["containers"][0]["foo"] = "bar";
  auto strict = client_->Do("POST", pods + "?fieldManager=kubectl-create&fieldValidation=Strict", pod.dump());
  ASSERT_TRUE(strict.ok()) << strict.status();
  EXPECT_EQ(strict->status, 400);
  const json st = json::parse(strict->body);
  EXPECT_EQ(st["reason"], "BadRequest");
  EXPECT_EQ(st["message"],
            "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field "
            "\"bogus\", unknown field \"spec.containers[0].foo\"");
  EXPECT_EQ(server_->Get("pods", "default", "strict").code, 404) << "nothing stored";
  // Warn, the default: stored without them, one warning per field (and the client logs them).
  pod["metadata"]["name"] = "warned";
  auto warned = client_->Do("POST", pods, pod.dump());
  ASSERT_TRUE(warned.ok());
  EXPECT_EQ(warned->status, 201);
  EXPECT_EQ(warned->warnings,
            (std::vector<std::string>{"unknown field \"bogus\"", "unknown field \"spec.containers[0].foo\""}));
  const json stored = server_->Get("pods", "default", "warned").body;
  EXPECT_FALSE(stored.contains("bogus"));
  EXPECT_FALSE(stored["spec"]["containers"][0].contains("foo"));
  EXPECT_EQ(stored["spec"]["containers"][0]["image"], "busybox");
  pod["metadata"]["name"] = "ignored";
  auto ignored = client_->Do("POST", pods + "?fieldValidation=Ignore", pod.dump());
  ASSERT_TRUE(ignored.ok());
  EXPECT_EQ(ignored->status, 201);
  EXPECT_TRUE(ignored->warnings.empty());
  EXPECT_FALSE(server_->Get("pods", "default", "ignored").body.contains("bogus"));
  // A directive the apiserver does not know.
  auto unknown = client_->Do("POST", pods + "?fieldValidation=strict", pod.dump());
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->status, 422);
  EXPECT_EQ(
      json::parse(unknown->body)["message"],
      "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"strict\": supported values: "
      "\"\", \"Ignore\", \"Strict\", \"Warn\"");
  // Update (PUT) under Strict: 400 as for create.
  json w = stored;
  w["spec"]["bogus"] = true;
  auto put = client_->Do("PUT", R("pods").Path("default", "warned") + "?fieldValidation=Strict", w.dump());
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->status, 400);
  EXPECT_NE(json::parse(put->body).value("message", "").find("unknown field \"spec.bogus\""), std::string::npos)
      << put->body;
  // Patches: the patched object is decoded; Strict is a 422 naming the patch.
  const std::string node = R("nodes").Path("", "n1");
  ASSERT_TRUE(client_->Create(R("nodes").Path(), {{"metadata", {{"name", "n1"}}}}).ok());
  auto merge =
      client_->Do("PATCH", node + "?fieldValidation=Strict", R"({"spec":{"bogus":1}})", "application/merge-patch+json");
  ASSERT_TRUE(merge.ok());
  EXPECT_EQ(merge->status, 422);
  const std::string mm = json::parse(merge->body).value("message", "");
  EXPECT_EQ(mm.rfind(" \"\" is invalid: patch: Invalid value: \"{", 0), 0u) << mm;
  EXPECT_NE(mm.find("\": strict decoding error: unknown field \"spec.bogus\""), std::string::npos) << mm;
  auto smp = client_->Do("PATCH", node + "?fieldValidation=Strict", R"({"spec":{"bogus":1}})",
                         "application/strategic-merge-patch+json");
  ASSERT_TRUE(smp.ok());
  EXPECT_EQ(smp->status, 422);
  EXPECT_EQ(json::parse(smp->body)["message"],
            " \"\" is invalid: patch: Invalid value: \"map[spec:map[bogus:1]]\": strict decoding error: unknown field "
            "\"spec.bogus\"");
  auto warn_patch =
      client_->Do("PATCH", node, R"({"spec":{"bogus":1,"unschedulable":true}})", "application/merge-patch+json");
  ASSERT_TRUE(warn_patch.ok());
  EXPECT_EQ(warn_patch->status, 200);
  EXPECT_EQ(warn_patch->warnings, (std::vector<std::string>{"unknown field \"spec.bogus\""}));
  // The unknown field was dropped; the known one written (the node lifecycle controller adds its
  // taints beside it: this node never reported Ready, and it is cordoned).
  const json spec = server_->Get("nodes", "", "n1").body["spec"];
  EXPECT_FALSE(spec.contains("bogus")) << spec.dump();
  EXPECT_EQ(spec["unschedulable"], true);
  EXPECT_EQ(spec["taints"].back(), json::parse(R"({"key":"node.kubernetes.io/unschedulable","effect":"NoSchedule"})"));
}

// ResourceQuota scopes (pkg/quota/v1/evaluator/core/pods.go): a scoped quota counts and limits
// only the pods it selects.
TEST_F(K8sClientTest, QuotaScopesSelectPods) {
  const std::string quotas = R("resourcequotas").Path("default");
  ASSERT_TRUE(client_
                  ->Create(quotas, {{"metadata", {{"name", "best-effort"}}},
                                    {"spec", {{"hard", {{"pods", "1"}}}, {"scopes", {"BestEffort"}}}}})
                  .ok());
  ASSERT_TRUE(
      client_
          ->Create(quotas, {{"metadata", {{"name", "gpu-high"}}},
                            {"spec",
                             {{"hard", {{"requests.nvidia.com/gpu", "1"}}},
                              {"scopeSelector",
                               {{"matchExpressions",
                                 {{{"scopeName", "PriorityClass"}, {"operator", "In"}, {"values", {"high"}}}}}}}}}})
          .ok());
  ASSERT_TRUE(
      client_
          ->Create(quotas, {{"metadata", {{"name", "terminating"}}},
                            {"spec", {{"hard", {{"pods", "1"}}}, {"scopes", {"Terminating", "NotBestEffort"}}}}})
          .ok());
  const std::string pods = R("pods").Path("default");
  auto create = [&](const std::string& name, const json& resources, const std::string& priority = "",
                    std::optional<int> deadline = std::nullopt) {
    json p = PodObj(name);
    if (!resources.is_null()) p["spec"]["containers"][0]["resources"] = resources;
    if (!priority.empty()) p["spec"]["priorityClassName"] = priority;
    if (deadline) p["spec"]["activeDeadlineSeconds"] = *deadline;
    return client_->Create(pods, p);
  };
  auto used = [&](const std::string& q, const std::string& k) {
    return (*client_->Get(R("resourcequotas").Path("default", q)))["status"]["used"].value(k, "");
  };
  // BestEffort: only pods without cpu/memory requests or limits count.
  ASSERT_TRUE(create("be-1", nullptr).ok());
  EXPECT_EQ(used("best-effort", "pods"), "1");
  auto be2 = create("be-2", nullptr);
  EXPECT_EQ(HttpStatus(be2.status()), 403);
  EXPECT_NE(std::string(be2.status().message())
                .find("exceeded quota: best-effort, requested: pods=1, used: pods=1, limited: pods=1"),
            std::string::npos)
      << be2.status();
  EXPECT_TRUE(create("burstable", {{"requests", {{"cpu", "100m"}}}}).ok()) << "not BestEffort: not that quota's";
  EXPECT_EQ(used("best-effort", "pods"), "1");
  // PriorityClass In [high]: only high-priority GPU pods are limited (they ask for cpu, so the
  // BestEffort quota does not select them).
  const json gpu = {{"requests", {{"cpu", "100m"}}}, {"limits", {{"nvidia.com/gpu", "1"}}}};
  ASSERT_TRUE(create("high-1", gpu, "high").ok());
  EXPECT_EQ(used("gpu-high", "requests.nvidia.com/gpu"), "1");
  auto high2 = create("high-2", gpu, "high");
  EXPECT_EQ(HttpStatus(high2.status()), 403);
  EXPECT_NE(std::string(high2.status().message()).find("exceeded quota: gpu-high"), std::string::npos)
      << high2.status();
  EXPECT_TRUE(create("low-1", gpu, "low").ok());
  EXPECT_TRUE(create("none-1", gpu).ok());
  EXPECT_EQ(used("gpu-high", "requests.nvidia.com/gpu"), "1");
  // Terminating AND NotBestEffort: pods with activeDeadlineSeconds and some cpu/memory.
  const json cpu = {{"requests", {{"cpu", "100m"}}}};
  ASSERT_TRUE(create("job-1", cpu, "", 600).ok());
  EXPECT_EQ(used("terminating", "pods"), "1");
  EXPECT_EQ(HttpStatus(create("job-2", cpu, "", 600).status()), 403);
  EXPECT_TRUE(create("service-1", cpu).ok()) << "NotTerminating";
  ASSERT_TRUE(client_->Delete(R("pods").Path("default", "job-1")).ok());
  EXPECT_TRUE(WaitFor([&] { return used("terminating", "pods") == "0"; }));
  EXPECT_TRUE(create("job-2", cpu, "", 600).ok());
}

class K8sTlsTest : public ::testing::Test {};

TEST_F(K8sTlsTest, TokensRbacAndRotation) {
  FakeApiServerOptions opts;
  opts.tls = true;
  opts.tokens = {{"t1", "node-agent"}, {"admin", "admin"}};
  opts.rbac["node-agent"] = {{{"get", "list", "watch", "patch"}, {"nodes", "nodes/status"}}};
  FakeApiServer server(opts);
  ASSERT_TRUE(server.Start().ok());
  char dir[] = "/tmp/kgpu-k8s-tls-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string token_file = std::string(dir) + "/token";
  std::ofstream(token_file) << "t1\n";
  Config c;
  c.server = server.url();
  c.ca_pem = server.ca_pem();
  c.token_file = token_file;
  c.qps = 0;
  auto client = std::move(*Client::Create(c));
  ASSERT_TRUE(server.Create("nodes", "", NodeObj("n1")).code == 201);
  EXPECT_TRUE(client->Get(FindResource("nodes")->Path("", "n1")).ok());
  auto forbidden = client->Create(FindResource("pods")->Path("default"), PodObj("p"));
  EXPECT_EQ(HttpStatus(forbidden.status()), 403);
  EXPECT_NE(std::string(forbidden.status().message())
                .find("pods is forbidden: User \"node-agent\" cannot create resource \"pods\" in API group \"\" in the "
                      "namespace \"default\""),
            std::string::npos)
      << forbidden.status();
  // The token rotates: the server accepts only the new one; the client re-reads its file.
  server.SetToken("t2", "node-agent");
  server.RemoveToken("t1");
  std::ofstream(token_file) << "t2\n";
  EXPECT_TRUE(client->Get(FindResource("nodes")->Path("", "n1")).ok());
  // Wrong token: 401.
  Config bad = c;
  bad.token_file.clear();
  bad.token = "wrong";
  EXPECT_EQ(HttpStatus((*Client::Create(bad))->Get("/api/v1/nodes").status()), 401);
  // TLS: no CA fails verification; insecure-skip-tls-verify works.
  Config no_ca = c;
  no_ca.ca_pem.clear();
  no_ca.ca_file = "/nonexistent";
  EXPECT_EQ(HttpStatus((*Client::Create(no_ca))->Get("/api/v1/nodes").status()), 0);
  Config insecure = no_ca;
  insecure.insecure_skip_tls_verify = true;
  EXPECT_TRUE((*Client::Create(insecure))->Get("/api/v1/nodes").ok());
  fs::remove_all(dir);
}

// The stand-in as a separate process, configured by the kubeconfig it writes, its faults
// driven over HTTP.
TEST(K8sProcessTest, SeparateProcessWithFaults) {
  char dir[] = "/tmp/kgpu-k8s-proc-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string d = dir;
  std::ofstream(d + "/nodes.yaml") << "apiVersion: v1\nkind: Node\nmetadata:\n  name: gpu-node-1\n"
                                      "status:\n  capacity:\n    nvidia.com/gpu: \"8\"\n";
  const pid_t pid =
      testing::Spawn({KGPU_FAKE_APISERVER, "--tls", "--token", "s3cret=admin", "--preload", d + "/nodes.yaml",
                      "--kubeconfig-out", d + "/kubeconfig", "--port-file", d + "/port"});
  ASSERT_GT(pid, 0) << std::strerror(errno);
  ASSERT_TRUE(WaitFor([&] { return fs::exists(d + "/port"); }));
  auto cfg = LoadKubeconfig(d + "/kubeconfig");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  cfg->qps = 0;
  auto client = std::move(*Client::Create(*cfg));
  auto node = client->Get("/api/v1/nodes/gpu-node-1");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ((*node)["status"]["allocatable"]["nvidia.com/gpu"], "8");
  InformerOptions io;
  io.path = "/api/v1/nodes";
  io.initial_backoff = 10ms;
  Informer inf(*client, io);
  Recorder rec;
  inf.AddHandler(rec.handlers());
  inf.Start();
  ASSERT_TRUE(inf.WaitForSync(30s));
  auto fault = [&](const std::string& what) { ASSERT_TRUE(client->Do("POST", "/_fake/" + what).ok()); };
  fault("drop-watches");
  ASSERT_TRUE(client->Create("/api/v1/nodes", NodeObj("n2")).ok());
  EXPECT_TRUE(WaitFor([&] { return rec.Has("add n2"); }));
  fault("fail?n=100000&code=503&verb=watch");
  fault("drop-watches");
  ASSERT_TRUE(client->Delete("/api/v1/nodes/n2").ok());
  fault("compact");
  EXPECT_TRUE(WaitFor([&] { return inf.stats().errors >= 1; }));
  fault("clear");
  EXPECT_TRUE(WaitFor([&] { return rec.Has("delete n2"); }));
  EXPECT_GE(inf.stats().gone, 1u);
  fault("fail?n=2&code=500");
  EXPECT_TRUE(client->Get("/api/v1/nodes/gpu-node-1").ok());
  fault("delay?n=1&ms=100");
  EXPECT_TRUE(client->Get("/api/v1/nodes/gpu-node-1").ok());
  fault("token?token=rotated&user=admin");
  fault("revoke?token=s3cret");
  EXPECT_EQ(HttpStatus(client->Get("/api/v1/nodes").status()), 401);
  inf.Stop();
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  fs::remove_all(d);
}

}  // namespace
}  // namespace kgpu::k8s
