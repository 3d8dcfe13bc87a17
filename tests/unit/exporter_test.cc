#include "exporter/exporter.h"

#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <httplib.h>
#include <zlib.h>

#include "api/share_cdi.h"
#include "cli/share_handoff.h"
#include "common/strings.h"
#include "exporter/counters.h"
#include "exporter/gzip_body.h"
#include "gpu/mig_layout.h"
#include "testing/sim_gpus.h"

namespace kgpu::exporter {
namespace {

TEST(CountersTest, DefaultCsvMatchesDcgmExporterNamesAndHelp) {
  std::vector<std::string> skipped;
  auto c = ParseCounters(DefaultCountersCsv(), "default", &skipped);
  ASSERT_TRUE(c.ok()) << c.status();
  // 20 of dcgm-exporter's rows kgpu produces (incl. the driver label), 4 ECC counters, the XID total.
  EXPECT_EQ(c->size(), 25u);
  EXPECT_EQ((*c)[0].name, "DCGM_FI_DEV_SM_CLOCK");
  EXPECT_EQ((*c)[0].help, "SM clock frequency (in MHz).");
  EXPECT_EQ((*c)[5].type, "counter");
  EXPECT_EQ(skipped.size(), 6u);  // 5 DCGM_FI_PROF_* and the vGPU licence status
  EXPECT_NE(skipped[0].find("DCGM_FI_DEV_VGPU_LICENSE_STATUS is not available through NVML"), std::string::npos);
}

TEST(CountersTest, ErrorsNameTheLine) {
  auto three = ParseCounters("# c\nDCGM_FI_DEV_GPU_TEMP, gauge\n", "my.csv", nullptr);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(std::string(three.status().message()),
            "my.csv:2:1: malformed CSV record, expected 3 fields (DCGM field, type, help), got 2");
  auto type = ParseCounters("DCGM_FI_DEV_GPU_TEMP, gague, t\n", "my.csv", nullptr);
  ASSERT_FALSE(type.ok());
  EXPECT_NE(std::string(type.status().message()).find("my.csv:1:23: type 'gague'"), std::string::npos);
  auto twice = ParseCounters("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n", "my.csv", nullptr);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(std::string(twice.status().message()).find("listed twice (first on line 1)"), std::string::npos);
  EXPECT_FALSE(ParseCounters("gpu_temp, gauge, t\n", "my.csv", nullptr).ok());
  EXPECT_FALSE(ParseCounters("DCGM_FI_DRIVER_VERSION, gauge, t\n", "my.csv", nullptr).ok());
}

struct Fixture : kgpu::testing::SimGpus {
  explicit Fixture(const std::string& profile, const std::string& csv = DefaultCountersCsv()) : SimGpus(profile) {
    auto c = ParseCounters(csv, "csv", nullptr);
    EXPECT_TRUE(c.ok());
    options.counters = *c;
    options.hostname = "node-a";
  }
  std::string Collect() {
    Collector collector(*lib, inv, options, nullptr);
    return collector.Collect();
  }
  ExporterOptions options;
};

// All lines of one family.
std::vector<std::string> Family(const std::string& text, const std::string& name) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) == 0) out.push_back(line);
  }
  return out;
}

TEST(CollectorTest, DcgmExporterLabelsAndValues) {
  Fixture f("dgx-h100");
  ASSERT_EQ(f.sim.Ctl("set 2 temp=71 util=64 memutil=12 power=412 smclock=1755 memused=2048"), 0);
  const std::string text = f.Collect();
  const std::string uuid = f.inv->gpus()[2].uuid;
  const std::string labels = "gpu=\"2\",UUID=\"" + uuid +
                             "\",pci_bus_id=\"00000000:3A:00.0\",device=\"nvidia2\",modelName=\"NVIDIA H100 80GB "
                             "HBM3\",Hostname=\"node-a\",DCGM_FI_DRIVER_VERSION=\"550.90.07\"";
  EXPECT_NE(text.find("# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"),
            std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_TEMP{" + labels + "} 71\n"), std::string::npos) << text;
  EXPECT_NE(text.find("DCGM_FI_DEV_GPU_UTIL{" + labels + "} 64\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_MEM_COPY_UTIL{" + labels + "} 12\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_POWER_USAGE{" + labels + "} 412.000000\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_SM_CLOCK{" + labels + "} 1755\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_FB_USED{" + labels + "} 2048\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_FB_RESERVED{" + labels + "} 530\n"), std::string::npos);
  EXPECT_NE(text.find("DCGM_FI_DEV_FB_FREE{" + labels + "} " + std::to_string(81559 - 530 - 2048) + "\n"),
            std::string::npos);
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_GPU_TEMP").size(), 8u);
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_XID_ERRORS").size(), 0u);  // no XID yet: absent, not 0
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL").size(), 8u);
}

// A process's SM utilisation counts toward its GPU's (as on a real GPU, where the device figure
// covers every process): `util` set by simctl plus every process, capped at 100 %.
TEST(CollectorTest, ProcessUtilisationCountsTowardTheGpu) {
  Fixture f("dgx-h100");
  ASSERT_EQ(f.sim.Ctl("set 1 util=0 memused=0"), 0);
  auto util_of_gpu1 = [&](const std::string& family) {
    for (const auto& l : Family(f.Collect(), family)) {
      if (l.rfind(family + "{gpu=\"1\",", 0) == 0) return l.substr(l.rfind(' ') + 1);
    }
    return std::string("absent");
  };
  EXPECT_EQ(util_of_gpu1("DCGM_FI_DEV_GPU_UTIL"), "0");
  ASSERT_EQ(f.sim.Ctl("proc add 1 4242 --mem 1024 --util 60"), 0);
  EXPECT_EQ(util_of_gpu1("DCGM_FI_DEV_FB_USED"), "1024");
  EXPECT_EQ(util_of_gpu1("DCGM_FI_DEV_GPU_UTIL"), "60");
  ASSERT_EQ(f.sim.Ctl("set 1 util=30"), 0);
  EXPECT_EQ(util_of_gpu1("DCGM_FI_DEV_GPU_UTIL"), "90");
  ASSERT_EQ(f.sim.Ctl("proc add 1 4243 --util 50"), 0);
  EXPECT_EQ(util_of_gpu1("DCGM_FI_DEV_GPU_UTIL"), "100");
  ASSERT_EQ(f.sim.Ctl("proc rm 1 4242"), 0);
  EXPECT_EQ(util_of_gpu1("DCGM_FI_DEV_GPU_UTIL"), "80");
}

TEST(CollectorTest, UnsupportedValuesAreOmitted) {
  Fixture f("l4x4");
  const std::string text = f.Collect();
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_MEMORY_TEMP").size(), 0u);             // L4: no memory sensor
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL").size(), 0u);  // no NVLink
  EXPECT_EQ(text.find("# HELP DCGM_FI_DEV_MEMORY_TEMP"), std::string::npos);
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_GPU_TEMP").size(), 4u);
}

TEST(CollectorTest, MigSeriesPerGpuInstance) {
  Fixture f("dgx-a100-mig");
  const std::string text = f.Collect();
  const auto temps = Family(text, "DCGM_FI_DEV_GPU_TEMP");
  EXPECT_EQ(temps.size(), 6u + 4u + 7u);  // 6 whole GPUs + GPU 0's 4 and GPU 1's 7 instances
  EXPECT_NE(text.find("GPU_I_PROFILE=\"3g.20gb\",GPU_I_ID=\"1\""), std::string::npos);
  // Utilisation is not supported on MIG: 6 series, from the whole GPUs only.
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_GPU_UTIL").size(), 6u);
  // Framebuffer per GPU instance.
  bool found = false;
  for (const auto& l : Family(text, "DCGM_FI_DEV_FB_FREE")) {
    if (l.find("GPU_I_PROFILE=\"1g.5gb\"") != std::string::npos) found = found || l.ends_with(" 4864");
  }
  EXPECT_TRUE(found);
}

TEST(CollectorTest, XidLastValueAndTotals) {
  Fixture f("dgx-h100");
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  collector.RecordXid(4, nvml::kNoInstance, 48);
  collector.RecordXid(4, nvml::kNoInstance, 79);
  collector.RecordXid(4, nvml::kNoInstance, 48);
  const std::string text = collector.Collect();
  const auto last = Family(text, "DCGM_FI_DEV_XID_ERRORS");
  ASSERT_EQ(last.size(), 1u);
  EXPECT_NE(last[0].find("err_code=\"48\",err_msg=\"Double Bit ECC Error\"} 48"), std::string::npos) << last[0];
  const auto totals = Family(text, "DCGM_EXP_XID_ERRORS_TOTAL");
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_TRUE(totals[0].ends_with("xid=\"48\"} 2"));
  EXPECT_TRUE(totals[1].ends_with("xid=\"79\"} 1"));
}

TEST(CollectorTest, MigXidsAreMergedIntoOneSeriesPerCode) {
  Fixture f("dgx-a100-mig");
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  collector.RecordXid(0, nvml::kNoInstance, 31);  // whole GPU 0
  collector.RecordXid(0, 1, 31);                  // its GPU instance 1
  const std::string text = collector.Collect();
  std::vector<std::string> gi1;
  for (const auto& l : Family(text, "DCGM_EXP_XID_ERRORS_TOTAL")) {
    if (l.find("GPU_I_ID=\"1\"") != std::string::npos) gi1.push_back(l);
  }
  ASSERT_EQ(gi1.size(), 1u) << text;
  EXPECT_TRUE(gi1[0].ends_with("xid=\"31\"} 2"));
  std::set<std::string> unique;
  for (const auto& l : Family(text, "DCGM_FI_DEV_XID_ERRORS"))
    EXPECT_TRUE(unique.insert(l.substr(0, l.rfind(' '))).second) << l;
}

TEST(CollectorTest, LostGpuStaysVisibleWithItsXidAndHealth) {
  Fixture f("dgx-h100");
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  const std::string uuid = f.inv->gpus()[6].uuid;
  EXPECT_EQ(Family(collector.Collect(), "kgpu_gpu_up").size(), 8u);
  ASSERT_EQ(f.sim.Ctl("lose 6"), 0);
  collector.RecordXid(6, nvml::kNoInstance, 79);  // what the event loop records for `lose`
  const std::string text = collector.Collect();
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_GPU_TEMP").size(), 7u);  // readings: absent, not zeroed
  EXPECT_GE(collector.nvml_errors(), 1u);
  std::vector<std::string> up6, reason6, xid6;
  for (const auto& l : Family(text, "kgpu_gpu_up")) {
    if (l.find("gpu=\"6\"") != std::string::npos) up6.push_back(l);
  }
  for (const auto& l : Family(text, "kgpu_gpu_unhealthy_reason")) reason6.push_back(l);
  for (const auto& l : Family(text, "DCGM_EXP_XID_ERRORS_TOTAL")) xid6.push_back(l);
  ASSERT_EQ(up6.size(), 1u) << text;
  EXPECT_NE(up6[0].find("UUID=\"" + uuid + "\""), std::string::npos);
  EXPECT_NE(up6[0].find("Hostname=\"node-a\""), std::string::npos);
  EXPECT_TRUE(up6[0].ends_with("} 0")) << up6[0];
  ASSERT_EQ(reason6.size(), 1u) << text;  // only GPU 6 has a reason
  EXPECT_NE(reason6[0].find("gpu=\"6\""), std::string::npos);
  EXPECT_TRUE(reason6[0].ends_with("reason=\"lost\"} 1")) << reason6[0];
  ASSERT_EQ(xid6.size(), 1u) << text;  // counted while lost, not only after a restore
  EXPECT_TRUE(xid6[0].ends_with("xid=\"79\"} 1")) << xid6[0];
  EXPECT_NE(text.find("# TYPE kgpu_gpu_up gauge\n"), std::string::npos);
  ASSERT_EQ(f.sim.Ctl("restore 6"), 0);
  const std::string back = collector.Collect();
  EXPECT_EQ(Family(back, "DCGM_FI_DEV_GPU_TEMP").size(), 8u);
  for (const auto& l : Family(back, "kgpu_gpu_up")) EXPECT_TRUE(l.ends_with("} 1")) << l;
  EXPECT_EQ(Family(back, "kgpu_gpu_unhealthy_reason").size(), 0u);
}

TEST(CollectorTest, UncorrectableEccIsAReasonButTheGpuIsUp) {
  Fixture f("dgx-h100");
  ASSERT_EQ(f.sim.Ctl("ecc 1 dbe 2"), 0);
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  const auto reasons = Family(collector.Collect(), "kgpu_gpu_unhealthy_reason");
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("gpu=\"1\""), std::string::npos);
  EXPECT_TRUE(reasons[0].ends_with("reason=\"ecc\"} 1")) << reasons[0];
}

TEST(CollectorTest, LabelValuesAreEscaped) {
  Fixture f("l4x4");
  f.options.hostname = "we\"ird\\host";
  const std::string text = f.Collect();
  EXPECT_NE(text.find("Hostname=\"we\\\"ird\\\\host\""), std::string::npos);
}

TEST(ExporterTest, ScrapeServesTheLatestBufferAndOwnMetrics) {
  Fixture f("l4x4");
  f.options.address = "127.0.0.1:0";
  f.options.interval = std::chrono::hours(1);
  Exporter exporter(*f.lib, f.inv, f.options);
  ASSERT_TRUE(exporter.Start().ok());
  EXPECT_GT(exporter.port(), 0);
  std::string a = exporter.Scrape();
  EXPECT_NE(a.find("kgpu_exporter_scrapes_total 1\n"), std::string::npos);
  EXPECT_NE(a.find("kgpu_exporter_collections_total 1\n"), std::string::npos);
  ASSERT_EQ(f.sim.Ctl("set 0 temp=90"), 0);
  EXPECT_EQ(exporter.Scrape().find("} 90\n"), std::string::npos);  // not sampled on a scrape
  exporter.CollectNow();
  EXPECT_NE(exporter.Scrape().find("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\""), std::string::npos);
  EXPECT_NE(exporter.Scrape().find("} 90\n"), std::string::npos);
  exporter.Stop();
}

// Inflates a gzip body; *members is how many gzip members it held.
std::string Gunzip(const std::string& gz, int* members) {
  std::string out;
  *members = 0;
  size_t at = 0;
  while (at < gz.size()) {
    z_stream zs{};
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return "inflateInit2 failed";
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data() + at));
    zs.avail_in = static_cast<uInt>(gz.size() - at);
    int rc = Z_OK;
    char buf[65536];
    while (rc == Z_OK) {
      zs.next_out = reinterpret_cast<Bytef*>(buf);
      zs.avail_out = sizeof buf;
      rc = inflate(&zs, Z_NO_FLUSH);
      out.append(buf, sizeof buf - zs.avail_out);
    }
    const size_t used = gz.size() - at - zs.avail_in;
    inflateEnd(&zs);
    if (rc != Z_STREAM_END) return "corrupt gzip";
    ++*members;
    at += used;
  }
  return out;
}

TEST(GzipBodyTest, OneMemberOfPrefixAndTail) {
  std::string prefix;
  for (int i = 0; i < 20000; ++i) prefix += Cat("series{gpu=\"", i % 8, "\"} ", i, "\n");
  auto gz = GzipBody::Make(prefix);
  ASSERT_NE(gz, nullptr);
  for (const std::string& tail : std::vector<std::string>{"", "a 1\n", std::string(100000, 'x')}) {
    auto body = gz->With(tail);
    ASSERT_TRUE(body.has_value());
    int members = 0;
    EXPECT_EQ(Gunzip(*body, &members), prefix + tail);
    EXPECT_EQ(members, 1);
  }
  auto empty = GzipBody::Make("");
  ASSERT_NE(empty, nullptr);
  int members = 0;
  EXPECT_EQ(Gunzip(*empty->With("x"), &members), "x");
  EXPECT_EQ(members, 1);
}

// GET /metrics with Accept-Encoding: gzip (as Prometheus asks): one gzip member holding the same
// series as the identity scrape, and the collection deflated once for all the scrapes until
// the next collection (per scrape only the exporter's own counters are deflated).
TEST(ExporterTest, GzipScrapesDeflateEachCollectionOnce) {
  Fixture f("l4x4");
  f.options.address = "127.0.0.1:0";
  f.options.interval = std::chrono::hours(1);
  Exporter exporter(*f.lib, f.inv, f.options);
  ASSERT_TRUE(exporter.Start().ok());
  httplib::Client http("127.0.0.1", exporter.port());
  http.set_decompress(false);
  auto without_scrapes = [](const std::string& text) {
    std::string out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("kgpu_exporter_scrapes_total ", 0) != 0) out += line + "\n";
    }
    return out;
  };
  std::string gunzipped;
  for (int i = 0; i < 3; ++i) {
    auto r = http.Get("/metrics", {{"Accept-Encoding", "gzip"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Encoding"), "gzip");
    int members = 0;
    gunzipped = Gunzip(r->body, &members);
    EXPECT_EQ(members, 1) << "gzipped once, not twice";
    EXPECT_NE(gunzipped.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\""), std::string::npos);
    EXPECT_NE(gunzipped.find("kgpu_exporter_gzip_compressions_total 1\n"), std::string::npos) << gunzipped;
    EXPECT_NE(gunzipped.find(Cat("kgpu_exporter_scrapes_total ", i + 1, "\n")), std::string::npos);
  }
  auto plain = http.Get("/metrics", {{"Accept-Encoding", "gzip;q=0, identity"}});
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->has_header("Content-Encoding"));
  EXPECT_EQ(without_scrapes(plain->body), without_scrapes(gunzipped));
  exporter.CollectNow();
  auto next = http.Get("/metrics", {{"Accept-Encoding", "deflate, gzip"}});
  ASSERT_TRUE(next);
  int members = 0;
  EXPECT_NE(Gunzip(next->body, &members).find("kgpu_exporter_gzip_compressions_total 2\n"), std::string::npos);
  exporter.Stop();
}

TEST(ExporterTest, MigSeriesFollowARepartition) {
  Fixture f("dgx-a100-mig");
  f.options.address = "127.0.0.1:0";
  f.options.interval = std::chrono::hours(1);
  f.options.discover = {f.sim.dir()};
  Exporter exporter(*f.lib, f.inv, f.options);
  ASSERT_TRUE(exporter.Start().ok());
  auto gpu1_small = [](const std::string& text) {
    size_t n = 0;
    for (const auto& l : Family(text, "DCGM_FI_DEV_GPU_TEMP")) {
      if (l.find("gpu=\"1\"") != std::string::npos && l.find("GPU_I_PROFILE=\"1g.5gb\"") != std::string::npos) ++n;
    }
    return n;
  };
  EXPECT_EQ(Family(exporter.Scrape(), "DCGM_FI_DEV_GPU_TEMP").size(), 6u + 4u + 7u);
  EXPECT_EQ(gpu1_small(exporter.Scrape()), 7u);
  // GPU 1: 7× 1g.5gb -> one 7g.40gb instance (as `kgpu mig apply` or nvidia-smi would).
  auto change = gpu::PlanMigChange(*f.lib, f.inv->gpus()[1], {1, true, {"7g.40gb"}});
  ASSERT_TRUE(change.ok()) << change.status();
  ASSERT_TRUE(gpu::ApplyMigChange(*f.lib, f.inv->gpus()[1], *change).ok());
  exporter.CollectNow();
  const std::string text = exporter.Scrape();
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_GPU_TEMP").size(), 6u + 4u + 1u);
  EXPECT_NE(text.find("GPU_I_PROFILE=\"7g.40gb\""), std::string::npos);
  EXPECT_EQ(gpu1_small(text), 0u);  // the old instances are gone from the output
  exporter.Stop();
}

}  // namespace
}  // namespace kgpu::exporter

// ---------------------------------------------------------------- per-pod attribution

#include <filesystem>
#include <fstream>

#include "testing/fake_podresources.h"
#include "testing/kubelet_checkpoint.h"

namespace kgpu::exporter {
namespace {

// Writes kubelet's checkpoint of `entries` (PodDeviceEntries JSON) into the fixture's directory,
// serves `list` as PodResources, and returns one scrape of an exporter with pod attribution.
std::string ScrapeWithPods(Fixture& f, kgpu::testing::FakePodResources& server,
                           const v1::ListPodResourcesResponse& list, const std::string& entries) {
  const std::string dir = f.sim.dir();
  std::ofstream(dir + "/checkpoint") << kgpu::testing::SignedCheckpoint(
      Cat(R"({"Data":{"PodDeviceEntries":[)", entries, R"(],"RegisteredDevices":{}},"Checksum":1})"));
  server.SetListResponse(list);
  EXPECT_TRUE(server.Start().ok());
  f.options.kubernetes = true;
  f.options.pod_resources_socket = dir + "/pr.sock";
  f.options.proc_root = dir + "/proc";
  f.options.checkpoint_path = dir + "/checkpoint";
  f.options.address = "127.0.0.1:0";
  f.options.interval = std::chrono::hours(1);
  Exporter exporter(*f.lib, f.inv, f.options);
  EXPECT_TRUE(exporter.Start().ok());
  const std::string text = exporter.Scrape();
  exporter.Stop();
  return text;
}

// The lines of `family` about GPU `uuid` that carry pod="<pod>".
std::vector<std::string> PodSeries(const std::string& text, const std::string& family, const std::string& uuid,
                                   const std::string& pod) {
  std::vector<std::string> out;
  for (const auto& l : Family(text, family)) {
    if (l.find(uuid) != std::string::npos && l.find("pod=\"" + pod + "\"") != std::string::npos) out.push_back(l);
  }
  return out;
}

// A time-sliced (or MPS-shared) GPU 0 shared by three pods, and GPU 1 held by one pod; processes
// on the simulated GPUs (MPS clients when `kind` is "mps"), a fake /proc with their cgroups,
// kubelet's checkpoint and PodResources.
void SharedGpuGetsOneSeriesPerPod(const std::string& kind) {
  Fixture f("dgx-h100");
  const std::string g0 = f.inv->gpus()[0].uuid, g1 = f.inv->gpus()[1].uuid;
  const std::string dir = f.sim.dir();
  struct P {
    unsigned pid;
    const char* uid;
    const char* ns;
    const char* pod;
    const char* container;
    std::string device;
    unsigned mem_mib, util;
    unsigned gpu;
  };
  const std::vector<P> procs = {
      {4101, "11111111-1111-1111-1111-111111111111", "ml", "train-0", "trainer", g0 + "::0", 1000, 20, 0},
      {4102, "22222222-2222-2222-2222-222222222222", "ml", "infer-0", "server", g0 + "::1", 2000, 30, 0},
      {4103, "33333333-3333-3333-3333-333333333333", "web", "eval-0", "eval", g0 + "::2", 3000, 40, 0},
      {4104, "44444444-4444-4444-4444-444444444444", "hpc", "solo-0", "main", g1, 5000, 90, 1},
  };
  v1::ListPodResourcesResponse list;
  std::string entries;
  for (const auto& p : procs) {
    ASSERT_EQ(
        f.sim.Ctl(Cat("proc add ", p.gpu, " ", p.pid, " --mem ", p.mem_mib, " --util ", p.util, " --kind ", kind)), 0);
    std::filesystem::create_directories(Cat(dir, "/proc/", p.pid));
    std::string uid_ = p.uid;
    std::replace(uid_.begin(), uid_.end(), '-', '_');
    std::ofstream(Cat(dir, "/proc/", p.pid, "/cgroup"))
        << "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" << uid_ << ".slice/cri-containerd-"
        << std::string(64, 'a') << ".scope\n";
    if (!entries.empty()) entries += ",";
    entries += Cat(R"({"PodUID":")", p.uid, R"(","ContainerName":")", p.container,
                   R"(","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":[")", p.device, R"("]},"AllocResp":""})");
    kgpu::testing::AddDevices(list, p.ns, p.pod, p.container, "nvidia.com/gpu", {p.device});
  }
  kgpu::testing::FakePodResources server(dir + "/pr.sock");
  const std::string text = ScrapeWithPods(f, server, list, entries);
  auto series = [&](const std::string& family, const std::string& uuid, const std::string& pod) {
    return PodSeries(text, family, uuid, pod);
  };
  // Three different per-pod figures on the shared GPU, from each pod's own processes.
  const auto train = series("DCGM_FI_DEV_FB_USED", g0, "train-0");
  const auto infer = series("DCGM_FI_DEV_FB_USED", g0, "infer-0");
  const auto eval = series("DCGM_FI_DEV_FB_USED", g0, "eval-0");
  ASSERT_EQ(train.size(), 1u) << text;
  ASSERT_EQ(infer.size(), 1u);
  ASSERT_EQ(eval.size(), 1u);
  EXPECT_TRUE(train[0].ends_with("container=\"trainer\",namespace=\"ml\",pod=\"train-0\"} 1000")) << train[0];
  EXPECT_TRUE(infer[0].ends_with("} 2000"));
  EXPECT_TRUE(eval[0].ends_with("container=\"eval\",namespace=\"web\",pod=\"eval-0\"} 3000"));
  if (kind == "compute") {  // utilisation samples per process (MPS: see docs/exporter.md)
    EXPECT_TRUE(series("DCGM_FI_DEV_GPU_UTIL", g0, "infer-0")[0].ends_with("} 30"));
    EXPECT_TRUE(series("DCGM_FI_DEV_GPU_UTIL", g0, "eval-0")[0].ends_with("} 40"));
  }
  // The device-level series of the shared GPU carries no pod labels (it is nobody's alone).
  const auto temps = Family(text, "DCGM_FI_DEV_GPU_TEMP");
  ASSERT_FALSE(temps.empty());
  EXPECT_EQ(temps[0].find("pod="), std::string::npos);
  // A GPU held by one pod: every series carries that pod.
  EXPECT_EQ(series("DCGM_FI_DEV_GPU_TEMP", g1, "solo-0").size(), 1u);
  EXPECT_EQ(series("DCGM_FI_DEV_FB_USED", g1, "solo-0").size(), 1u);
  EXPECT_GE(server.ListCalls(), 1);
}

TEST(PodAttributionTest, SharedGpuGetsOneSeriesPerPod) {
  SharedGpuGetsOneSeriesPerPod("compute");
}
// MPS clients (nvmlDeviceGetMPSComputeRunningProcesses) are attributed to their pods the same way.
TEST(PodAttributionTest, MpsClientsGetOneSeriesPerPod) {
  SharedGpuGetsOneSeriesPerPod("mps");
}

// kgpu.io/gpu slots are only a count: kubelet gave these containers slots of GPU 0, but their
// allocation records put them on GPU 2 (hard, 4000 MiB) and GPU 2 (mps, 8000 MiB); the plugin's
// CDI specs say so. Their processes, on GPU 2, are attributed there; a container whose spec is
// not written yet (it has not started) is on no GPU.
TEST(PodAttributionTest, KgpuSharesAreAttributedByTheirSpecNotTheirSlots) {
  Fixture f("dgx-h100");
  const std::string g0 = f.inv->gpus()[0].uuid, g2 = f.inv->gpus()[2].uuid;
  const std::string dir = f.sim.dir();
  const std::string cdi = dir + "/cdi";
  std::filesystem::create_directories(cdi);
  struct P {
    unsigned pid;
    const char* uid;
    const char* pod;
    std::string slot;
    const char* mode;
    int64_t limit_mib;
    unsigned mem_mib;
    bool started;
  };
  const std::vector<P> procs = {
      {5101, "51515151-5151-5151-5151-515151515151", "a-0", g0 + "::0", "hard", 4000, 1500, true},
      {5102, "52525252-5252-5252-5252-525252525252", "b-0", g0 + "::1", "mps", 8000, 2500, true},
      {5103, "53535353-5353-5353-5353-535353535353", "c-0", g0 + "::2", "hard", 4000, 0, false},
  };
  v1::ListPodResourcesResponse list;
  std::string entries;
  for (const auto& p : procs) {
    if (!entries.empty()) entries += ",";
    entries +=
        Cat(R"({"PodUID":")", p.uid, R"(","ContainerName":"main","ResourceName":"kgpu.io/gpu","DeviceIDs":{"-1":[")",
            p.slot, R"("]},"AllocResp":""})");
    kgpu::testing::AddDevices(list, "ml", p.pod, "main", "kgpu.io/gpu", {p.slot});
    if (!p.started) continue;
    ASSERT_EQ(f.sim.Ctl(Cat("proc add 2 ", p.pid, " --mem ", p.mem_mib)), 0);
    std::filesystem::create_directories(Cat(dir, "/proc/", p.pid));
    std::ofstream(Cat(dir, "/proc/", p.pid, "/cgroup"))
        << "0::/kubepods/besteffort/pod" << p.uid << "/" << std::string(64, 'b') << "\n";
    // The spec as the plugin's handoff writes it (its env from cli::ShareEnv of the record).
    api::RecordContainer rc{"main", "kgpu.io/gpu", p.mode, {{g2, "", "", p.limit_mib, 25}}};
    const nlohmann::json spec = {
        {"cdiVersion", "0.5.0"},
        {"kind", "kgpu.io/share"},
        {"devices", {{{"name", api::ShareCdiName({p.slot})}, {"containerEdits", {{"env", cli::ShareEnv(rc)}}}}}}};
    std::ofstream(api::ShareCdiSpecFile(cdi, api::ShareCdiName({p.slot}))) << spec.dump();
  }
  kgpu::testing::FakePodResources server(dir + "/pr.sock");
  f.options.cdi_spec_dir = cdi;
  const std::string text = ScrapeWithPods(f, server, list, entries);
  auto series = [&](const std::string& family, const std::string& uuid, const std::string& pod) {
    return PodSeries(text, family, uuid, pod);
  };
  const auto a = series("DCGM_FI_DEV_FB_USED", g2, "a-0"), b = series("DCGM_FI_DEV_FB_USED", g2, "b-0");
  ASSERT_EQ(a.size(), 1u) << text;
  ASSERT_EQ(b.size(), 1u) << text;
  EXPECT_TRUE(a[0].ends_with("} 1500")) << a[0];
  EXPECT_TRUE(b[0].ends_with("} 2500")) << b[0];
  for (const char* pod : {"a-0", "b-0", "c-0"}) {
    EXPECT_TRUE(series("DCGM_FI_DEV_FB_USED", g0, pod).empty()) << pod << " is not on its slots' GPU";
  }
  EXPECT_TRUE(series("DCGM_FI_DEV_FB_USED", g2, "c-0").empty());
  const auto la = series("kgpu_pod_gpu_memory_limit_bytes", g2, "a-0");
  const auto lb = series("kgpu_pod_gpu_memory_limit_bytes", g2, "b-0");
  ASSERT_EQ(la.size(), 1u) << text;
  ASSERT_EQ(lb.size(), 1u) << text;
  EXPECT_NE(la[0].find("enforcement=\"hard\""), std::string::npos) << la[0];
  EXPECT_TRUE(la[0].ends_with(Cat("} ", int64_t{4000} << 20))) << la[0];
  EXPECT_NE(lb[0].find("enforcement=\"mps\""), std::string::npos) << lb[0];
  EXPECT_TRUE(lb[0].ends_with(Cat("} ", int64_t{8000} << 20))) << lb[0];
  EXPECT_TRUE(series("kgpu_pod_gpu_memory_limit_bytes", g2, "c-0").empty());
}

TEST(ParseShareSpecTest, ErrorsNameTheFileAndField) {
  EXPECT_FALSE(ParseShareSpec("{", "s.json").ok());
  auto none = ParseShareSpec(R"({"devices":[{"containerEdits":{"env":["A=1"]}}]})", "s.json");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "s.json: no NVIDIA_VISIBLE_DEVICES in the container's env");
  auto bad = ParseShareSpec(
      R"({"devices":[{"containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=GPU-a","CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=3=1M"]}}]})",
      "s.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("names device 3 of 1"), std::string::npos);
  auto ok = ParseShareSpec(
      R"({"devices":[{"containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b","KGPU_ENFORCEMENT=hard",)"
      R"("KGPU_CUDA_MEMORY_LIMIT=GPU-a=100Mi,GPU-b=200Mi","KGPU_GPU_CORES=30"]}}]})",
      "s.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->uuids, (std::vector<std::string>{"GPU-a", "GPU-b"}));
  EXPECT_EQ(ok->enforcement, "hard");
  EXPECT_EQ(ok->limit_mib.at("GPU-b"), 200);
  EXPECT_EQ(ok->cores, 30);
}

TEST(PodAttributionTest, MissingPodResourcesSocketIsCountedNotFatal) {
  Fixture f("l4x4");
  f.options.kubernetes = true;
  f.options.pod_resources_socket = f.sim.dir() + "/missing.sock";
  f.options.proc_root = f.sim.dir();
  f.options.checkpoint_path = f.sim.dir() + "/none";
  f.options.address = "127.0.0.1:0";
  f.options.interval = std::chrono::hours(1);
  Exporter exporter(*f.lib, f.inv, f.options);
  ASSERT_TRUE(exporter.Start().ok());
  const std::string text = exporter.Scrape();
  exporter.Stop();
  EXPECT_NE(text.find("kgpu_exporter_podresources_errors_total 1\n"), std::string::npos);
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_GPU_TEMP").size(), 4u);
}

}  // namespace
}  // namespace kgpu::exporter
