// The API server stand-in against the exact requests other clients send (Go's net/http as kubectl
// and client-go use it): what kube-apiserver does on the wire, not only what kgpu's client needs.
#include <zlib.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/fake_apiserver.h"
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

}  // namespace
}  // namespace kgpu::testing
