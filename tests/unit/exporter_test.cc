#include "exporter/exporter.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>
#include <zlib.h>

#include "api/share_cdi.h"
#include "cli/share_handoff.h"
#include "common/strings.h"
#include "exporter/counters.h"
#include "exporter/gzip_body.h"
#include "gpu/mig_layout.h"
#include "testing/exporter_fixture.h"

namespace kgpu::exporter {
namespace {

TEST(CountersTest, DefaultCsvMatchesDcgmExporterNamesAndHelp) {
  std::vector<std::string> skipped;
  auto c = ParseCounters(DefaultCountersCsv(), "default", &skipped);
  ASSERT_TRUE(c.ok()) << c.status();
  // dcgm-exporter's 26 rows (incl. the driver label; the profiling rows through GPM), 4 ECC
  // counters, the XID total: nothing of kgpu's own default is omitted.
  EXPECT_EQ(c->size(), 31u);
  EXPECT_EQ((*c)[0].name, "DCGM_FI_DEV_SM_CLOCK");
  EXPECT_EQ((*c)[0].help, "SM clock frequency (in MHz).");
  EXPECT_EQ((*c)[5].type, "counter");
  EXPECT_TRUE(skipped.empty()) << SummarizeSkipped(skipped);
  EXPECT_EQ(SummarizeSkipped(skipped), "");
}

TEST(CountersTest, OmittedFieldsAreSummarizedInOneLineByReason) {
  std::vector<std::string> skipped;
  auto c = ParseCounters(
      "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_VGPU_UTILIZATIONS, gauge, v\n"
      "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS, counter, n\nDCGM_FI_DEV_VGPU_TYPE, gauge, v\n",
      "c.csv", &skipped);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(skipped, (std::vector<std::string>{"DCGM_FI_DEV_VGPU_UTILIZATIONS", "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS",
                                               "DCGM_FI_DEV_VGPU_TYPE"}));
  const std::string line = SummarizeSkipped(skipped);
  EXPECT_EQ(line.rfind("3 DCGM field(s) of the counters file are omitted, as they need DCGM itself: vGPU", 0), 0u)
      << line;
  EXPECT_NE(line.find(": DCGM_FI_DEV_VGPU_UTILIZATIONS, DCGM_FI_DEV_VGPU_TYPE; NVSwitch"), std::string::npos) << line;
  EXPECT_TRUE(line.ends_with(": DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS")) << line;
}

// DCGM 4.7's canonical names (dcgm-exporter 4.9) and the 1.x lowercase names are the same fields;
// the names that change the unit are marked so.
TEST(CountersTest, CanonicalAndLegacyNamesAreTheSameFields) {
  auto c = ParseCounters(
      "DCGM_FI_DEV_SM_CLOCK_HERTZ, gauge, h\nDCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, t\ndcgm_gpu_temp, gauge, t\n"
      "DCGM_FI_SYSTEM_DRIVER_VERSION, label, d\nDCGM_FI_DEV_XID_ERROR, gauge, x\n"
      "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO, gauge, g\nDCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND, gauge, p\n"
      "DCGM_FI_DEV_FB_USED_BYTES, gauge, f\nDCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL, counter, r\n",
      "c.csv", nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 9u);
  EXPECT_EQ((*c)[0].field, Field::kSmClock);
  EXPECT_TRUE((*c)[0].base_units);
  EXPECT_EQ((*c)[1].field, Field::kGpuTemp);
  EXPECT_FALSE((*c)[1].base_units);  // still degrees C
  EXPECT_EQ((*c)[2].field, Field::kGpuTemp);
  EXPECT_EQ((*c)[2].name, "dcgm_gpu_temp");  // the metric name is the name as written
  EXPECT_EQ((*c)[3].field, Field::kDriverVersion);
  EXPECT_EQ((*c)[4].field, Field::kXidErrors);
  EXPECT_EQ((*c)[5].field, Field::kProfRatio);
  EXPECT_EQ((*c)[5].index, 1u);  // NVML_GPM_METRIC_GRAPHICS_UTIL
  EXPECT_EQ((*c)[6].field, Field::kProfBytes);
  EXPECT_EQ((*c)[6].index, 20u);  // NVML_GPM_METRIC_PCIE_TX_PER_SEC
  EXPECT_TRUE((*c)[7].base_units);
  EXPECT_EQ((*c)[8].field, Field::kRetiredSbe);
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
  auto exp_label =
      ParseCounters("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_EXP_XID_ERRORS_TOTAL, label, x\n", "my.csv", nullptr);
  ASSERT_FALSE(exp_label.ok());
  const std::string exp_message(exp_label.status().message());
  EXPECT_EQ(exp_message.rfind("my.csv:2:", 0), 0u) << exp_message;
  EXPECT_NE(exp_message.find("DCGM_EXP_XID_ERRORS_TOTAL cannot be a label"), std::string::npos) << exp_message;
  // A string field with another type than label is an info-style series (see CollectorTest below).
  EXPECT_TRUE(ParseCounters("DCGM_FI_DRIVER_VERSION, gauge, t\n", "my.csv", nullptr).ok());
}

using Fixture = kgpu::testing::ExporterFixture;
using kgpu::testing::Family;

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
  // No XID yet: 0, "No Error", on every GPU (as dcgm-exporter serves it); no XID total yet.
  EXPECT_NE(text.find("DCGM_FI_DEV_XID_ERRORS{" + labels + ",err_code=\"0\",err_msg=\"No Error\"} 0\n"),
            std::string::npos);
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_XID_ERRORS").size(), 8u);
  EXPECT_EQ(Family(text, "DCGM_EXP_XID_ERRORS_TOTAL").size(), 0u);
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
  std::vector<std::string> last;
  for (const auto& l : Family(text, "DCGM_FI_DEV_XID_ERRORS")) {
    if (l.find("gpu=\"4\"") != std::string::npos) last.push_back(l);
  }
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

// The value of the line of `family` about GPU `gpu` whose labels contain `with`, or "absent".
std::string ValueOf(const std::string& text, const std::string& family, unsigned gpu, const std::string& with = "") {
  for (const auto& l : Family(text, family)) {
    if (l.rfind(Cat(family, "{gpu=\"", gpu, "\","), 0) != 0) continue;
    if (!with.empty() && l.find(with) == std::string::npos) continue;
    return l.substr(l.rfind(' ') + 1);
  }
  return "absent";
}

// A double as dcgm-exporter prints it (%f).
std::string Fixed(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%f", v);
  return buf;
}

// The NVML fields dcgm-exporter's CSVs name besides the default ones, on the simulated H100s.
TEST(CollectorTest, NvmlFieldsOfDcgmExporterCsvsOnH100) {
  Fixture f("dgx-h100",
            "DCGM_FI_DEV_FB_TOTAL, gauge, t\nDCGM_FI_DEV_FB_CAPACITY_BYTES, gauge, t\n"
            "DCGM_FI_DEV_FB_USED_PERCENT, gauge, p\nDCGM_FI_DEV_POWER_MGMT_LIMIT, gauge, l\n"
            "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN, gauge, l\nDCGM_FI_DEV_POWER_MGMT_LIMIT_MAX, gauge, l\n"
            "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF, gauge, l\nDCGM_FI_DEV_ENFORCED_POWER_LIMIT, gauge, l\n"
            "DCGM_FI_DEV_FAN_SPEED, gauge, f\nDCGM_FI_DEV_PSTATE, gauge, p\n"
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, c\nDCGM_FI_DEV_CLOCKS_EVENT_REASONS, gauge, c\n"
            "DCGM_FI_DEV_RETIRED_SBE, counter, r\nDCGM_FI_DEV_RETIRED_DBE, counter, r\n"
            "DCGM_FI_DEV_RETIRED_PENDING, counter, r\nDCGM_FI_DEV_POWER_VIOLATION, counter, v\n"
            "DCGM_FI_DEV_THERMAL_VIOLATION, counter, v\nDCGM_FI_DEV_PCIE_TX_THROUGHPUT, counter, x\n"
            "DCGM_FI_DEV_PCIE_RX_THROUGHPUT, counter, x\nDCGM_FI_DEV_PCIE_LINK_GEN, gauge, g\n"
            "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH, gauge, w\nDCGM_FI_DEV_MAX_SM_CLOCK, gauge, m\n"
            "DCGM_FI_DEV_SLOWDOWN_TEMP, gauge, s\nDCGM_FI_DEV_SHUTDOWN_TEMP, gauge, s\n"
            "DCGM_FI_DEV_BAR1_TOTAL, gauge, b\nDCGM_FI_DEV_ECC_CURRENT, gauge, e\n"
            "DCGM_FI_DEV_COMPUTE_MODE, gauge, c\nDCGM_FI_DEV_PERSISTENCE_MODE, gauge, p\n"
            "DCGM_FI_DEV_MIG_MODE, gauge, m\nDCGM_FI_DEV_CUDA_COMPUTE_CAPABILITY, gauge, c\n"
            "DCGM_FI_DEV_COUNT, gauge, n\nDCGM_FI_DEV_MINOR_NUMBER, gauge, n\n"
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, n\nDCGM_FI_DEV_NVLINK_BANDWIDTH_L0, counter, n\n"
            "DCGM_FI_CUDA_DRIVER_VERSION, gauge, c\nDCGM_FI_DEV_NAME, gauge, n\n"
            "DCGM_FI_NVML_VERSION, label, v\nDCGM_FI_DEV_SERIAL, label, s\nDCGM_FI_DEV_VBIOS_VERSION, label, v\n"
            "DCGM_FI_DEV_BRAND, label, b\nDCGM_FI_DEV_OEM_INFOROM_VER, label, o\n"
            "DCGM_FI_DEV_POWER_INFOROM_VER, label, p\n");
  ASSERT_EQ(f.sim.Ctl("set 3 util=50 pcie_tx=1234 pcie_rx=4321 memused=2048 powerlimit=650"), 0);
  const std::string text = f.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_FB_TOTAL", 3), "81559");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_FB_CAPACITY_BYTES", 3), std::to_string(uint64_t{81559} << 20));
  // DCGM's used / (total - reserved), a ratio.
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_FB_USED_PERCENT", 3), Fixed(2048.0 / (81559 - 530)));
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_POWER_MGMT_LIMIT", 3), "650.000000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 3), "650.000000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", 3), "200.000000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", 3), "700.000000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", 3), "700.000000");
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_FAN_SPEED").size(), 0u);  // an H100 has no fan: absent, not 0
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_PSTATE", 3), "0");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 3), "0");  // busy
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0), "1");    // idle: gpu_idle
  for (const char* retired : {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING"}) {
    EXPECT_EQ(Family(text, retired).size(), 0u) << retired << ": Hopper remaps rows, it retires no pages";
  }
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_POWER_VIOLATION", 3), "0");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_THERMAL_VIOLATION", 3), "0");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 3), "1234");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 3), "4321");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_PCIE_LINK_GEN", 3), "5");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", 3), "16");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_MAX_SM_CLOCK", 3), "1980");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_SLOWDOWN_TEMP", 3), "89");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_SHUTDOWN_TEMP", 3), "92");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_BAR1_TOTAL", 3), "131072");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_ECC_CURRENT", 3), "1");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_COMPUTE_MODE", 3), "0");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_PERSISTENCE_MODE", 3), "1");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_MIG_MODE", 3), "0");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_CUDA_COMPUTE_CAPABILITY", 3), std::to_string(9 << 16));
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_COUNT", 3), "8");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_MINOR_NUMBER", 3), "3");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 3), "0");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", 3), "0");  // a rate: 0 on the first sample
  auto cuda = f.lib->CudaDriverVersion();
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(ValueOf(text, "DCGM_FI_CUDA_DRIVER_VERSION", 3), std::to_string(*cuda));
  // A string field of type gauge: an info-style series.
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_NAME", 3, "value=\"NVIDIA H100 80GB HBM3\""), "1");
  // The label rows, in name order after the base labels; a string NVML has no value for (the
  // power inforom object of an H100) is no label.
  auto serial = f.lib->Serial(f.inv->gpus()[3].handle);
  auto nvml = f.lib->NvmlVersion();
  ASSERT_TRUE(serial.ok() && nvml.ok());
  const std::string labels =
      Cat("Hostname=\"node-a\",DCGM_FI_DEV_BRAND=\"NVIDIA\",DCGM_FI_DEV_OEM_INFOROM_VER=\"2.1\",DCGM_FI_DEV_SERIAL=\"",
          *serial, "\",DCGM_FI_DEV_VBIOS_VERSION=\"96.00.74.00.0F\",DCGM_FI_NVML_VERSION=\"", *nvml, "\"}");
  EXPECT_NE(ValueOf(text, "DCGM_FI_DEV_PSTATE", 3, labels), "absent") << text;
  EXPECT_EQ(text.find("DCGM_FI_DEV_POWER_INFOROM_VER="), std::string::npos);
}

// DCGM_FI_PROF_* through NVML's GPM: the metrics between two collections (none on the first), as
// ratios (GPM's percent / 100) and bytes per second (GPM's MiB/s).
TEST(CollectorTest, ProfFieldsComeFromGpmFromTheSecondCollection) {
  Fixture f("dgx-h100",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, g\nDCGM_FI_PROF_SM_ACTIVE, gauge, s\n"
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\nDCGM_FI_PROF_DRAM_ACTIVE, gauge, d\n"
            "DCGM_FI_PROF_PCIE_TX_BYTES, gauge, p\nDCGM_FI_PROF_NVLINK_RX_BYTES, gauge, n\n"
            "DCGM_FI_PROF_NVDEC0_ACTIVE, gauge, d\nDCGM_FI_PROF_GR_ENGINE_UTIL_RATIO, gauge, g\n"
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\n");
  ASSERT_EQ(f.sim.Ctl("set 1 util=40 memutil=20 pcie_tx=2048 decutil=10"), 0);
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  EXPECT_EQ(collector.Collect().find("DCGM_FI_PROF_"), std::string::npos) << "no value before a second sample";
  const std::string text = collector.Collect();
  EXPECT_EQ(Family(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE").size(), 8u);
  EXPECT_EQ(ValueOf(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1), "0.400000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1), "0.400000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_PROF_SM_ACTIVE", 1), "0.360000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1), "0.200000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_PROF_DRAM_ACTIVE", 1), "0.200000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_PROF_PCIE_TX_BYTES", 1), "2097152");  // 2048 KB/s = 2 MiB/s
  EXPECT_EQ(ValueOf(text, "DCGM_FI_PROF_NVLINK_RX_BYTES", 1), "0");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_PROF_NVDEC0_ACTIVE", 1), "0.100000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0), "0.000000");
  EXPECT_EQ(collector.nvml_errors(), 0u);
}

// Without GPM (an A100: Ampere) the DCGM_FI_PROF_* series are omitted, as dcgm-exporter omits
// them without DCGM's profiling module; the reason is logged once, and it is no error.
TEST(CollectorTest, ProfFieldsAreOmittedWithoutGpm) {
  Fixture f("dgx-a100-mig", "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, g\nDCGM_FI_DEV_GPU_TEMP, gauge, t\n");
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  collector.Collect();
  const std::string text = collector.Collect();
  EXPECT_EQ(Family(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE").size(), 0u);
  EXPECT_EQ(text.find("# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE"), std::string::npos);
  EXPECT_EQ(Family(text, "DCGM_FI_DEV_GPU_TEMP").size(), 6u + 4u + 7u);
  EXPECT_EQ(collector.nvml_errors(), 0u);
}

// A profile file for SimGpus (a path: anything with a '/').
std::string WriteProfile(const std::string& name, const std::string& yaml) {
  const auto path = std::filesystem::temp_directory_path() / Cat("kgpu-", name, "-", ::getpid(), ".yaml");
  std::ofstream(path) << yaml;
  return path.string();
}

// On a Hopper MIG GPU each GPU instance has its own GPM figures (nvmlGpmMigSampleGet); the bus
// figures are the whole GPU's only.
TEST(CollectorTest, ProfFieldsPerGpuInstanceOnHopperMig) {
  const std::string profile = WriteProfile("h100-mig", R"(version: v1
name: h100-mig
driverVersion: "550.90.07"
cudaVersion: "12.4"
nvlink: nvswitch
nvswitches: 4
numaNodes: 1
pcieSwitchGroup: 2
gpus:
  - model: H100-SXM5-80GB
    count: 2
    busIds: [0x18, 0x2a]
mig:
  - gpu: 0
    instances: ["4g.40gb@0", "3g.40gb@4"]
)");
  {
    Fixture f(profile, "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, g\nDCGM_FI_PROF_PCIE_TX_BYTES, gauge, p\n");
    Collector collector(*f.lib, f.inv, f.options, nullptr);
    collector.Collect();
    const std::string text = collector.Collect();
    const auto gr = Family(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE");
    EXPECT_EQ(gr.size(), 3u) << text;  // GPU 1 whole, GPU 0's two instances
    size_t instances = 0;
    for (const auto& l : gr) instances += l.find("GPU_I_PROFILE=") != std::string::npos ? 1 : 0;
    EXPECT_EQ(instances, 2u);
    EXPECT_EQ(Family(text, "DCGM_FI_PROF_PCIE_TX_BYTES").size(), 1u);
    EXPECT_EQ(collector.nvml_errors(), 0u);
  }
  std::filesystem::remove(profile);
}

// DCGM_EXP_XID_ERRORS_COUNT counts the XIDs of the last window (dcgm-exporter's -x), per XID, and
// forgets them after it; with none, one series of 0 without an xid label.
TEST(CollectorTest, XidErrorsCountForgetsXidsAfterTheWindow) {
  Fixture f("dgx-h100", "DCGM_EXP_XID_ERRORS_COUNT, gauge, c\nDCGM_FI_DEV_XID_ERRORS, gauge, x\n");
  f.options.xid_count_window = std::chrono::milliseconds(60000);
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  auto t = std::chrono::steady_clock::time_point() + std::chrono::hours(1);
  collector.SetClock([&] { return t; });
  std::string text = collector.Collect();
  const auto none = Family(text, "DCGM_EXP_XID_ERRORS_COUNT");
  ASSERT_EQ(none.size(), 8u);
  for (const auto& l : none) EXPECT_TRUE(l.ends_with(",window_size_in_ms=\"60000\"} 0")) << l;
  collector.RecordXid(3, nvml::kNoInstance, 48);
  collector.RecordXid(3, nvml::kNoInstance, 48);
  t += std::chrono::seconds(10);
  collector.RecordXid(3, nvml::kNoInstance, 79);
  text = collector.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_XID_ERRORS_COUNT", 3, "window_size_in_ms=\"60000\",xid=\"48\"}"), "2");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_XID_ERRORS_COUNT", 3, "window_size_in_ms=\"60000\",xid=\"79\"}"), "1");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_XID_ERRORS_COUNT", 2), "0");
  EXPECT_EQ(Family(text, "DCGM_EXP_XID_ERRORS_COUNT").size(), 9u);
  t += std::chrono::seconds(55);  // the two 48s are 65 s old, the 79 55 s
  text = collector.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_XID_ERRORS_COUNT", 3, "xid=\"48\""), "absent");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_XID_ERRORS_COUNT", 3, "xid=\"79\""), "1");
  t += std::chrono::seconds(10);
  text = collector.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_XID_ERRORS_COUNT", 3), "0");
  // The last-XID gauge keeps its value (dcgm-exporter's is sticky).
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_XID_ERRORS", 3), "79");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_XID_ERRORS", 2, "err_code=\"0\",err_msg=\"No Error\""), "0");
}

// DCGM_EXP_CLOCK_EVENTS_COUNT: the collections within the window in which each reason was active
// (dcgm-exporter counts DCGM's samples); DCGM_EXP_CLOCK_EVENTS_TOTAL: each reason's activations
// since the first collection (a reason already active then is none).
TEST(CollectorTest, ClockEventsAreCountedInTheWindowAndInTotal) {
  Fixture f("dgx-h100",
            "DCGM_EXP_CLOCK_EVENTS_COUNT, gauge, c\nDCGM_EXP_CLOCK_EVENTS_TOTAL, counter, t\n"
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS, gauge, r\n");
  f.options.clock_events_count_window = std::chrono::milliseconds(60000);
  ASSERT_EQ(f.sim.Ctl("set 2 util=50"), 0);  // GPU 2 busy: no reason; the others idle: gpu_idle
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  auto t = std::chrono::steady_clock::time_point() + std::chrono::hours(1);
  collector.SetClock([&] { return t; });
  std::string text = collector.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 2), "0");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_COUNT", 0, "clock_event=\"gpu_idle\""), "1");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_COUNT", 2, "window_size_in_ms=\"60000\"}"), "0");
  EXPECT_EQ(Family(text, "DCGM_EXP_CLOCK_EVENTS_TOTAL").size(), 0u);
  t += std::chrono::seconds(10);
  ASSERT_EQ(f.sim.Ctl("set 2 util=0 temp=90"), 0);  // idle, and above its slowdown temperature (89)
  text = collector.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_COUNT", 0, "clock_event=\"gpu_idle\""), "2");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_COUNT", 2, "clock_event=\"gpu_idle\""), "1");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_COUNT", 2, "clock_event=\"sw_thermal\""), "1");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_TOTAL", 2, "clock_event=\"gpu_idle\""), "1");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_TOTAL", 2, "clock_event=\"sw_thermal\""), "1");
  EXPECT_EQ(Family(text, "DCGM_EXP_CLOCK_EVENTS_TOTAL").size(), 2u);
  t += std::chrono::seconds(55);  // the first collection is 65 s old: out of the window
  text = collector.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_COUNT", 0, "clock_event=\"gpu_idle\""), "2");
  t += std::chrono::seconds(61);
  text = collector.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_COUNT", 0, "clock_event=\"gpu_idle\""), "1");
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_TOTAL", 2, "clock_event=\"gpu_idle\""), "1");
}

// DCGM_EXP_GPU_HEALTH_STATUS from the process's one health source, per DCGM health system.
TEST(CollectorTest, GpuHealthStatusFollowsTheHealthSource) {
  Fixture f("dgx-h100", "DCGM_EXP_GPU_HEALTH_STATUS, gauge, h\n");
  ASSERT_EQ(f.sim.Ctl("ecc 2 dbe 1"), 0);
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  const std::string uuid1 = f.inv->gpus()[1].uuid;
  collector.SetHealthSource([&] {
    std::map<std::string, gpu::DeviceHealth> h;
    h[uuid1] = gpu::DeviceHealth{uuid1, false, "XID 79 (GPU has fallen off the bus)", "xid"};
    return h;
  });
  collector.RecordXid(1, nvml::kNoInstance, 79);
  const std::string text = collector.Collect();
  const auto lines = Family(text, "DCGM_EXP_GPU_HEALTH_STATUS");
  EXPECT_EQ(lines.size(), 8u * 10u);
  const std::string family = "DCGM_EXP_GPU_HEALTH_STATUS";
  EXPECT_EQ(ValueOf(text, family, 1, "health_error_code=\"DCGM_FR_XID_ERROR\",health_watch=\"PCIE\""), "20");
  EXPECT_EQ(ValueOf(text, family, 2, "health_error_code=\"DCGM_FR_VOLATILE_DBE_DETECTED\",health_watch=\"MEM\""), "20");
  EXPECT_EQ(ValueOf(text, family, 0, "health_error_code=\"DCGM_FR_OK\",health_watch=\"MEM\""), "0");
  size_t failing = 0;
  for (const auto& l : lines) failing += l.ends_with("} 0") ? 0 : 1;
  EXPECT_EQ(failing, 2u);
}

// DCGM_EXP_P2P_STATUS: the NVLink P2P status towards every other GPU.
TEST(CollectorTest, P2pStatusBetweenEveryPairOfGpus) {
  {
    // One simulated node per process at a time: this one is closed before the next is opened.
    Fixture h100("dgx-h100", "DCGM_EXP_P2P_STATUS, gauge, p\n");
    const auto nvswitch = Family(h100.Collect(), "DCGM_EXP_P2P_STATUS");
    EXPECT_EQ(nvswitch.size(), 8u * 7u);
    for (const auto& l : nvswitch) EXPECT_NE(l.find("link_status=\"OK\""), std::string::npos) << l;
  }
  Fixture l4("l4x4", "DCGM_EXP_P2P_STATUS, gauge, p\n");
  const std::string text = l4.Collect();
  EXPECT_EQ(Family(text, "DCGM_EXP_P2P_STATUS").size(), 4u * 3u);
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_P2P_STATUS", 0, "link_status=\"NotSupported\",peer_gpu=\"1\""), "5");
}

// A string field: with type label a label on every series of its device, named after the field
// as written; with another type an info-style series.
TEST(CollectorTest, StringFieldsAreLabelsOrInfoSeries) {
  Fixture f("dgx-h100",
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_SYSTEM_DRIVER_VERSION, label, d\n"
            "DCGM_FI_DEV_VBIOS_VERSION, label, v\nDCGM_FI_DEV_BRAND, gauge, b\nDCGM_FI_DEV_UUID, gauge, u\n");
  const std::string text = f.Collect();
  const auto temps = Family(text, "DCGM_FI_DEV_GPU_TEMP");
  ASSERT_EQ(temps.size(), 8u);
  EXPECT_NE(temps[0].find("Hostname=\"node-a\",DCGM_FI_DEV_VBIOS_VERSION=\"96.00.74.00.0F\","
                          "DCGM_FI_SYSTEM_DRIVER_VERSION=\"550.90.07\"}"),
            std::string::npos)
      << temps[0];
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_BRAND", 0, "value=\"NVIDIA\"}"), "1");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_UUID", 5, Cat("value=\"", f.inv->gpus()[5].uuid, "\"}")), "1");
  EXPECT_EQ(text.find("# TYPE DCGM_FI_SYSTEM_DRIVER_VERSION"), std::string::npos);  // a label row is no family
}

// dcgm-exporter 4.9's canonical names are the same fields, in the canonical unit where it differs.
TEST(CollectorTest, CanonicalNamesCarryCanonicalUnits) {
  Fixture f("dgx-h100",
            "DCGM_FI_DEV_SM_CLOCK, gauge, c\nDCGM_FI_DEV_SM_CLOCK_HERTZ, gauge, c\n"
            "DCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DEV_GPU_UTIL_RATIO, gauge, u\n"
            "DCGM_FI_DEV_FB_USED, gauge, f\nDCGM_FI_DEV_FB_USED_BYTES, gauge, f\n"
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, e\nDCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL, counter, e\n"
            "dcgm_gpu_temp, gauge, t\nDCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, t\n"
            "DCGM_FI_DEV_BOARD_POWER_WATTS, gauge, p\n");
  ASSERT_EQ(f.sim.Ctl("set 2 smclock=1755 util=64 memused=2048 temp=71 power=412"), 0);
  const std::string text = f.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_SM_CLOCK", 2), "1755");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_SM_CLOCK_HERTZ", 2), "1755000000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_GPU_UTIL", 2), "64");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_GPU_UTIL_RATIO", 2), "0.640000");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_FB_USED", 2), "2048");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_FB_USED_BYTES", 2), std::to_string(uint64_t{2048} << 20));
  EXPECT_EQ(ValueOf(text, "dcgm_gpu_temp", 2), "71");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_GPU_TEMP_CELSIUS", 2), "71");
  EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_BOARD_POWER_WATTS", 2), "412.000000");
  const std::string mj = ValueOf(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 2);
  const std::string joules = ValueOf(text, "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 2);
  ASSERT_NE(mj, "absent");
  ASSERT_NE(joules, "absent");
  EXPECT_EQ(joules, Fixed(std::stod(mj) / 1000.0));  // one reading, two units
}

// The GPU Operator's counters file with every commented row enabled: it parses, nothing is
// omitted on an H100, and every family NVML can give is there.
TEST(CollectorTest, GpuOperatorCsvParsesWithNothingOmittedOnH100) {
  const std::string path = std::string(KGPU_SOURCE_DIR) + "/tests/unit/testdata/dcgm-exporter/dcp-metrics-included.csv";
  std::vector<std::string> skipped;
  auto counters = LoadCountersFile(path, &skipped);
  ASSERT_TRUE(counters.ok()) << counters.status();
  EXPECT_TRUE(skipped.empty()) << SummarizeSkipped(skipped);
  Fixture f("dgx-h100");
  f.options.counters = *counters;
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  collector.Collect();
  const std::string text = collector.Collect();
  for (const char* family :
       {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_RELIABILITY_VIOLATION", "DCGM_EXP_CLOCK_EVENTS_COUNT", "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_P2P_STATUS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PCIE_RX_BYTES"}) {
    EXPECT_EQ(Family(text, family).size(), family == std::string("DCGM_EXP_GPU_HEALTH_STATUS") ? 80u
                                           : family == std::string("DCGM_EXP_P2P_STATUS")      ? 56u
                                                                                               : 8u)
        << family;
  }
  // What NVML has no value for on an H100 is absent, not 0: pages (it remaps rows), a vGPU licence.
  EXPECT_TRUE(Family(text, "DCGM_FI_DEV_RETIRED_SBE").empty());
  EXPECT_TRUE(Family(text, "DCGM_FI_DEV_VGPU_LICENSE_STATUS").empty());
  const auto temps = Family(text, "DCGM_FI_DEV_GPU_TEMP");
  ASSERT_FALSE(temps.empty());
  EXPECT_NE(temps[0].find("DCGM_FI_DEV_VBIOS_VERSION=\"96.00.74.00.0F\""), std::string::npos) << temps[0];
  EXPECT_NE(temps[0].find("DCGM_FI_DEV_BRAND=\"NVIDIA\""), std::string::npos);
  EXPECT_NE(temps[0].find("DCGM_FI_DRIVER_VERSION=\"550.90.07\""), std::string::npos);
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

// ---------------------------------------------------------------- review fixes: XIDs, windows, labels, MIG

namespace kgpu::exporter {
namespace {

// The lines of `family` about GPU `gpu`'s GPU instance `gi`.
std::vector<std::string> InstanceLines(const std::string& text, const std::string& family, unsigned gpu, unsigned gi) {
  std::vector<std::string> out;
  for (const auto& l : Family(text, family)) {
    if (l.rfind(Cat(family, "{gpu=\"", gpu, "\","), 0) == 0 &&
        l.find(Cat("GPU_I_ID=\"", gi, "\"")) != std::string::npos)
      out.push_back(l);
  }
  return out;
}

// DCGM reports a device's last XID by time: a GPU-wide XID after an instance's own shows on the
// instance, and an instance's later XID shows there again.
TEST(CollectorTest, MigLastXidIsTheNewerOfTheInstancesAndTheGpus) {
  Fixture f("dgx-a100-mig", "DCGM_FI_DEV_XID_ERRORS, gauge, x\n");
  ASSERT_GE(f.inv->gpus()[0].migs.size(), 2u);
  const unsigned gi = f.inv->gpus()[0].migs[0].gi;
  unsigned other = gi;
  for (const auto& m : f.inv->gpus()[0].migs) other = m.gi != gi ? m.gi : other;
  ASSERT_NE(other, gi);
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  auto t = std::chrono::steady_clock::time_point() + std::chrono::hours(1);
  collector.SetClock([&] { return t; });
  collector.RecordXid(0, gi, 13);
  t += std::chrono::seconds(1);
  collector.RecordXid(0, nvml::kNoInstance, 79);
  std::string text = collector.Collect();
  auto mine = InstanceLines(text, "DCGM_FI_DEV_XID_ERRORS", 0, gi);
  ASSERT_EQ(mine.size(), 1u) << text;
  EXPECT_TRUE(mine[0].ends_with("err_code=\"79\",err_msg=\"GPU has fallen off the bus\"} 79")) << mine[0];
  auto others = InstanceLines(text, "DCGM_FI_DEV_XID_ERRORS", 0, other);
  ASSERT_EQ(others.size(), 1u);
  EXPECT_TRUE(others[0].ends_with("} 79")) << others[0];
  // The instance's own XID, later: its own again; the other instance keeps the GPU's.
  t += std::chrono::seconds(1);
  collector.RecordXid(0, gi, 31);
  text = collector.Collect();
  mine = InstanceLines(text, "DCGM_FI_DEV_XID_ERRORS", 0, gi);
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_TRUE(mine[0].ends_with("} 31")) << mine[0];
  others = InstanceLines(text, "DCGM_FI_DEV_XID_ERRORS", 0, other);
  ASSERT_EQ(others.size(), 1u);
  EXPECT_TRUE(others[0].ends_with("} 79")) << others[0];
}

// An XID storm of one code within the window neither evicts a rare code seen before it nor
// stops being counted.
TEST(CollectorTest, XidStormKeepsRareXidsAndCountsEveryOne) {
  Fixture f("dgx-h100", "DCGM_EXP_XID_ERRORS_COUNT, gauge, c\n");
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  auto t = std::chrono::steady_clock::time_point() + std::chrono::hours(1);
  collector.SetClock([&] { return t; });
  collector.RecordXid(3, nvml::kNoInstance, 79);
  for (int i = 0; i < 5000; ++i) {
    if (i % 100 == 0) t += std::chrono::milliseconds(500);  // spread over 25 s of the 5-minute window
    collector.RecordXid(3, nvml::kNoInstance, 13);
  }
  const std::string text = collector.Collect();
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_XID_ERRORS_COUNT", 3, "xid=\"79\""), "1") << text;
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_XID_ERRORS_COUNT", 3, "xid=\"13\""), "5000");
}

// The windows' counts: in time slots, bounded whatever the rate, exact within the window.
TEST(WindowCountsTest, BoundedSlotsAndCountsWithinTheWindow) {
  const auto t0 = std::chrono::steady_clock::time_point() + std::chrono::hours(1);
  const std::chrono::milliseconds window(1000);
  WindowCounts w;
  for (int k = 0; k < 10000; ++k) w.Add(t0 + std::chrono::milliseconds(k), 7, window);  // one a ms for 10 s
  EXPECT_LE(w.slots(), static_cast<size_t>(WindowCounts::kSlots) + 2);
  const auto now = t0 + std::chrono::milliseconds(9999);
  EXPECT_EQ(w.Counts(now, window), (std::map<uint64_t, uint64_t>{{7, 1000}}));  // ms 9000..9999
  // A million events of one key in one window: a bounded number of slots, every event counted.
  WindowCounts storm;
  const std::chrono::milliseconds five_minutes(300000);
  storm.Add(t0, 79, five_minutes);
  for (int k = 0; k < 1000000; ++k) storm.Add(t0 + std::chrono::microseconds(k * 100), 13, five_minutes);
  EXPECT_LE(storm.slots(), static_cast<size_t>(WindowCounts::kSlots) + 2);
  const auto counts = storm.Counts(t0 + std::chrono::seconds(100), five_minutes);
  EXPECT_EQ(counts.at(79), 1u);
  EXPECT_EQ(counts.at(13), 1000000u);
  storm.Expire(t0 + std::chrono::hours(1), five_minutes);
  EXPECT_EQ(storm.slots(), 0u);
}

// DCGM_EXP_CLOCK_EVENTS_COUNT does not saturate with a long window: more collections than the
// 4096 samples the exporter used to keep, each counted.
TEST(CollectorTest, ClockEventsCountDoesNotSaturateWithALongWindow) {
  Fixture f("l4x4", "DCGM_EXP_CLOCK_EVENTS_COUNT, gauge, c\n");
  f.options.clock_events_count_window = std::chrono::milliseconds(86400000);  // a day, dcgm-exporter's maximum
  Collector collector(*f.lib, f.inv, f.options, nullptr);
  auto t = std::chrono::steady_clock::time_point() + std::chrono::hours(1);
  collector.SetClock([&] { return t; });
  std::string text;
  for (int i = 0; i < 4200; ++i) {  // idle GPUs: gpu_idle in every collection
    text = collector.Collect();
    t += std::chrono::seconds(1);
  }
  EXPECT_EQ(ValueOf(text, "DCGM_EXP_CLOCK_EVENTS_COUNT", 0, "clock_event=\"gpu_idle\""), "4200") << text;
}

// The label names of one sample line, in order (none for a comment line).
std::vector<std::string> LabelNames(const std::string& line) {
  std::vector<std::string> names;
  const size_t open = line.find('{');
  if (line.empty() || line[0] == '#' || open == std::string::npos) return names;
  size_t at = open + 1;
  while (at < line.size() && line[at] != '}') {
    const size_t eq = line.find('=', at);
    if (eq == std::string::npos) break;
    names.push_back(line.substr(at, eq - at));
    at = eq + 2;  // past ="
    while (at < line.size() && line[at] != '"') at += line[at] == '\\' ? 2 : 1;
    at += 1;  // past the closing quote
    if (at < line.size() && line[at] == ',') ++at;
  }
  return names;
}

// Prometheus refuses a whole page for one line that has a label name twice.
void ExpectNoLabelTwice(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::set<std::string> seen;
    for (const auto& name : LabelNames(line)) {
      EXPECT_TRUE(seen.insert(name).second) << "label " << name << " twice in: " << line;
    }
  }
}

// With pod labels on, a pod label named like any label the exporter writes (value, xid, the
// health and P2P labels, the base labels, the CSV's label rows, ...) is left out: every line has
// each label name once, and the pod's other labels stay.
TEST(CollectorTest, PodLabelsNeverRepeatALabelTheExporterWrites) {
  Fixture f("dgx-h100",
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_XID_ERRORS, gauge, x\nDCGM_EXP_XID_ERRORS_TOTAL, counter, x\n"
            "DCGM_EXP_XID_ERRORS_COUNT, gauge, x\nDCGM_EXP_CLOCK_EVENTS_COUNT, gauge, c\n"
            "DCGM_EXP_CLOCK_EVENTS_TOTAL, counter, c\nDCGM_EXP_GPU_HEALTH_STATUS, gauge, h\n"
            "DCGM_EXP_P2P_STATUS, gauge, p\nDCGM_FI_DEV_NAME, gauge, n\nDCGM_FI_DRIVER_VERSION, label, d\n"
            "DCGM_FI_DEV_SERIAL, label, s\n");
  const std::string dir = f.sim.dir();
  ASSERT_EQ(f.sim.Ctl("ecc 0 dbe 1"), 0);  // a kgpu_gpu_unhealthy_reason line (reason)
  std::filesystem::create_directories(dir + "/jobs");
  std::ofstream(dir + "/jobs/0") << "job-1\n";
  f.options.hpc_jobs = std::make_shared<HpcJobs>(dir + "/jobs");
  f.options.pod_uid = true;
  f.options.virtual_gpus = true;
  std::vector<std::pair<std::string, std::string>> pod_labels = {{"app", "trainer"}};
  f.options.pod_metadata = [&](const std::string& ns, const std::string& name) -> std::optional<PodMetadata> {
    if (ns != "ml" || name != "train-0") return std::nullopt;
    return PodMetadata{"11111111-1111-1111-1111-111111111111", pod_labels};
  };
  PodAttributor attributor({dir + "/proc", dir + "/no-checkpoint", dir + "/cdi"});
  attributor.Update({{"nvidia.com/gpu", f.inv->gpus()[0].uuid, {"ml", "train-0", "main"}}});
  Collector collector(*f.lib, f.inv, f.options, &attributor);
  collector.RecordXid(0, nvml::kNoInstance, 13);
  std::string text = collector.Collect();
  ExpectNoLabelTwice(text);
  // Every label name of the page, and the names the review found missing, as pod labels.
  std::set<std::string> names = {
      "value",    "xid",         "health_watch",   "health_error_code", "window_size_in_ms", "clock_event",
      "peer_gpu", "link_status", "err_code",       "err_msg",           "hpc_job",           "vgpu",
      "pod_uid",  "reason",      "enforcement",    "GPU_I_PROFILE",     "GPU_I_ID",          "Hostname",
      "hostname", "uuid",        "container_name", "pod_name",          "pod_namespace"};
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    for (const auto& name : LabelNames(line)) names.insert(name);
  }
  EXPECT_GT(names.count("DCGM_FI_DEV_SERIAL"), 0u);
  names.erase("app");  // the pod's own label, kept below
  for (const auto& name : names) pod_labels.emplace_back(name, "clash");
  std::sort(pod_labels.begin(), pod_labels.end());
  text = collector.Collect();
  ExpectNoLabelTwice(text);
  EXPECT_EQ(text.find("\"clash\""), std::string::npos) << "a pod label took a name the exporter writes";
  // The pod's own label is still there, on every series of the GPU it holds.
  const std::string temp = ValueOf(text, "DCGM_FI_DEV_GPU_TEMP", 0, "app=\"trainer\"");
  EXPECT_NE(temp, "absent") << text;
  EXPECT_NE(ValueOf(text, "DCGM_EXP_GPU_HEALTH_STATUS", 0, "app=\"trainer\""), "absent");
}

// -d f on a MIG GPU that has no GPU instance (or whose instances could not be listed): the GPU
// whole, so that it keeps kgpu_gpu_up, its health and XID families and its readings.
TEST(CollectorTest, MigGpuWithoutInstancesStaysVisibleAsAWholeGpu) {
  const std::string profile = WriteProfile("a100-mig-empty", R"(version: v1
name: a100-mig-empty
driverVersion: "535.183.01"
cudaVersion: "12.2"
nvlink: nvswitch
nvswitches: 6
numaNodes: 1
pcieSwitchGroup: 2
gpus:
  - model: A100-SXM4-40GB
    count: 2
    busIds: [0x07, 0x0f]
mig:
  - gpu: 0
    instances: []
)");
  {
    Fixture f(
        profile,
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_EXP_GPU_HEALTH_STATUS, gauge, h\nDCGM_FI_DEV_XID_ERRORS, gauge, x\n");
    ASSERT_EQ(f.inv->gpus().size(), 2u);
    ASSERT_TRUE(f.inv->gpus()[0].mig_enabled);
    ASSERT_TRUE(f.inv->gpus()[0].migs.empty());
    const std::string text = f.Collect();
    EXPECT_EQ(Family(text, "kgpu_gpu_up").size(), 2u) << text;
    EXPECT_EQ(ValueOf(text, "kgpu_gpu_up", 0), "1");
    EXPECT_NE(ValueOf(text, "DCGM_FI_DEV_GPU_TEMP", 0), "absent");
    EXPECT_EQ(ValueOf(text, "DCGM_FI_DEV_XID_ERRORS", 0), "0");
    EXPECT_EQ(Family(text, "DCGM_EXP_GPU_HEALTH_STATUS").size(), 2u * 10u);
    EXPECT_EQ(text.find("GPU_I_ID"), std::string::npos);
    // -d i selects GPU instances only: the GPU has none, so it has no series there (as asked).
    f.options.devices = DeviceSelector{false, false, true, {}, {}};
    EXPECT_EQ(Family(f.Collect(), "kgpu_gpu_up").size(), 0u);
  }
  std::filesystem::remove(profile);
}

}  // namespace
}  // namespace kgpu::exporter
