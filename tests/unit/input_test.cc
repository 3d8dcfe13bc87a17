// Strict inputs, unit level: escaping, nearest-name suggestions, typed and ranged YAML scalars,
// config and counters errors with file:line:col, the kubelet directory check, the simulated
// GPU's value ranges (simctl's and the library's), and logging a repeated condition once.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>

#include "common/files.h"
#include "common/log_once.h"
#include "common/strings.h"
#include "common/yaml_util.h"
#include "deviceplugin/config.h"
#include "deviceplugin/kubelet_dir.h"
#include "deviceplugin/plan.h"
#include "exporter/counters.h"
#include "exporter/exporter.h"
#include "node.h"
#include "testing/fake_podresources.h"
#include "testing/sim_gpus.h"

namespace kgpu {
namespace {

using namespace std::chrono_literals;

std::string Message(const absl::Status& st) {
  return std::string(st.message());
}

// A private directory for one test.
struct TempDir {
  TempDir() {
    char dir[] = "/tmp/kgpu-input-XXXXXX";
    path = ::mkdtemp(dir) != nullptr ? dir : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = path + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string path;
};

// ---------------------------------------------------------------- strings

TEST(PrintableTest, EscapesControlBytesAndBrokenUtf8) {
  EXPECT_EQ(Printable("plain text: ok"), "plain text: ok");
  EXPECT_EQ(Printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(Printable("\x1b[2Jx\x7f"), "\\x1B[2Jx\\x7F");
  EXPECT_EQ(Printable("line\nnext\ttab"), "line\\nnext\\ttab");
  EXPECT_EQ(Printable("gr\xc3\xbc\xc3\x9f"), "gr\xc3\xbc\xc3\x9f");  // valid UTF-8 stays
  EXPECT_EQ(Printable("\xff\xfe"), "\\xFF\\xFE");
  EXPECT_EQ(Printable("\xc3"), "\\xC3");                    // truncated sequence
  EXPECT_EQ(Printable("\xed\xa0\x80"), "\\xED\\xA0\\x80");  // a UTF-16 surrogate
}

TEST(NearestTest, SuggestsTheClosestName) {
  EXPECT_EQ(EditDistance("DCGM_FI_DEV_GPU_TMEP", "DCGM_FI_DEV_GPU_TEMP"), 2u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  const std::vector<std::string> names = {"none", "single", "mixed"};
  EXPECT_EQ(Nearest("mixd", names, 2), "mixed");
  EXPECT_EQ(Nearest("singel", names, 2), "single");
  EXPECT_EQ(Nearest("everything", names, 2), "");
}

// ---------------------------------------------------------------- YAML scalars

TEST(YamlScalarTest, IntegersNameTheTypeAndTheRange) {
  const YAML::Node n = YAML::Load("{a: four, b: 100000000000, c: -3, d: 7, e: 1e3, f: [1]}");
  auto msg = [&](const char* key) { return Message(yaml::ScalarIn<int>("f.yaml", n[key], key, 0, 10).status()); };
  EXPECT_EQ(msg("a"), "f.yaml:1:5: a must be an integer from 0 to 10 (got 'four')");
  EXPECT_EQ(msg("b"), "f.yaml:1:14: b must be an integer from 0 to 10 (got 100000000000, out of range)");
  EXPECT_EQ(msg("c"), "f.yaml:1:31: c must be an integer from 0 to 10 (got -3, out of range)");
  EXPECT_EQ(*yaml::ScalarIn<int>("f.yaml", n["d"], "d", 0, 10), 7);
  EXPECT_EQ(msg("e"), "f.yaml:1:44: e must be an integer from 0 to 10 (got '1e3')");
  EXPECT_EQ(msg("f"), "f.yaml:1:52: f must be an integer from 0 to 10, not a list or a mapping");
  EXPECT_EQ(Message(yaml::Scalar<unsigned>("f.yaml", n["c"], "c").status()),
            "f.yaml:1:31: c must be an integer from 0 to 4294967295 (got -3, out of range)");
  EXPECT_EQ(Message(yaml::Scalar<bool>("f.yaml", n["a"], "a").status()),
            "f.yaml:1:5: a must be true or false (got 'four')");
}

// ---------------------------------------------------------------- device plugin config

TEST(ConfigInputTest, EmptyFileIsAnErrorUnlessAllowed) {
  for (const char* text : {"", "   \n", "# just a comment\n", "~\n"}) {
    auto c = deviceplugin::ParseConfig(text, "c.yaml");
    ASSERT_FALSE(c.ok()) << "'" << text << "'";
    EXPECT_EQ(Message(c.status()).rfind("c.yaml:1:1: the config file ", 0), 0u) << c.status();
    EXPECT_NE(Message(c.status()).find("pass --allow-empty-config"), std::string::npos);
    auto allowed = deviceplugin::ParseConfig(text, "c.yaml", {.allow_empty = true});
    ASSERT_TRUE(allowed.ok()) << allowed.status();
    EXPECT_EQ(allowed->mig_strategy, "none");
  }
}

TEST(ConfigInputTest, DirectoryMissingOrUnreadableFileIsNamed) {
  TempDir d;
  auto dir = deviceplugin::LoadConfigFile(d.path);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(Message(dir.status()).rfind(d.path + " is a directory, not a config file (check --config-file", 0), 0u)
      << dir.status();
  auto missing = deviceplugin::LoadConfigFile(d.path + "/nope.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(Message(missing.status()),
            d.path + "/nope.yaml: the config file does not exist (check --config-file / CONFIG_FILE)");
}

TEST(ConfigInputTest, EnumerationsAreCheckedWhereTheFileSetsThem) {
  const std::map<std::string, std::string> cases = {
      {"flags:\n  migStrategy: mixd\n",
       "c.yaml:2:16: flags.migStrategy 'mixd' is invalid: use none, single or mixed (did you mean mixed?)"},
      {"flags:\n  plugin:\n    deviceIDStrategy: uid\n",
       "c.yaml:3:23: flags.plugin.deviceIDStrategy 'uid' is invalid: use uuid or index (did you mean uuid?)"},
      {"flags:\n  plugin:\n    deviceListStrategy: envvar,cdi\n",
       "c.yaml:3:25: flags.plugin.deviceListStrategy 'cdi' is invalid: use envvar, volume-mounts, cdi-annotations or "
       "cdi-cri"},
      {"flags:\n  plugin:\n    sharedDevicesAllocationPolicy: pack\n",
       "c.yaml:3:36: flags.plugin.sharedDevicesAllocationPolicy 'pack' is invalid: use distributed or packed (did you "
       "mean packed?)"},
      {"flags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n",
       "c.yaml:5:5: sharing.mps is not supported with flags.migStrategy mixed"},
      {"imex:\n  channelIDs: [3]\n",
       "c.yaml:2:16: imex.channelIDs[] must be an integer from 0 to 0 (got 3, out of range)"},
      {"health:\n  fatalXids: [-1]\n",
       "c.yaml:2:15: health.fatalXids must be an integer from 0 to 18446744073709551615 "
       "(got -1, out of range)"},
      {"sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2, devices: 0}]\n",
       "c.yaml:3:51: sharing.timeSlicing.resources[0].devices must be \"all\", a count from 1 to 1024"},
      {"flags:\n  plugin:\n    passDeviceSpecs: maybe\n",
       "c.yaml:3:22: flags.plugin.passDeviceSpecs must be true or false (got 'maybe')"},
      {"falgs:\n  migStrategy: none\n", "c.yaml:1:1: unknown key 'falgs' in the config (did you mean flags?)"},
  };
  for (const auto& [yaml, want] : cases) {
    auto c = deviceplugin::ParseConfig(yaml, "c.yaml");
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_EQ(Message(c.status()).substr(0, want.size()), want) << c.status();
  }
}

TEST(ConfigInputTest, ValidateNamesTheFilePartOfACombination) {
  auto c = deviceplugin::ParseConfig("sharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Message(deviceplugin::Validate(*c)), "c.yaml:3:5: MPS sharing needs --mps-root (MPS_ROOT, flags.mpsRoot)");
  deviceplugin::Config flags_only;
  flags_only.mig_strategy = "mixd";
  EXPECT_EQ(Message(deviceplugin::Validate(flags_only)),
            "migStrategy 'mixd' (--mig-strategy / MIG_STRATEGY) is invalid: use none, single or mixed (did you mean "
            "mixed?)");
}

TEST(ConfigInputTest, BinaryInputIsEscapedInEveryError) {
  const std::string inputs[] = {std::string("\x00\x01\x02\x1b[31m", 8), std::string("key\x00: 1\n", 8),
                                std::string("fl\x1b]0;x\x07ags: 1\n"), std::string("\xff\xfe\xfd: [\n"),
                                std::string("version: \"v\x01\"\n")};
  for (const auto& text : inputs) {
    auto c = deviceplugin::ParseConfig(text, "bin.yaml");
    ASSERT_FALSE(c.ok()) << Printable(text);
    const std::string m = Message(c.status());
    EXPECT_TRUE(std::regex_search(m, std::regex("^bin\\.yaml:[0-9]+:[0-9]+: "))) << Printable(m);
    EXPECT_EQ(Printable(m), m) << "raw bytes in: " << Printable(m);
  }
}

TEST(ConfigInputTest, DevicesTheNodeDoesNotHaveKeepTheirPosition) {
  testing::SimGpus n("l4x4");
  auto c = deviceplugin::ParseConfig(
      "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 2\n      devices: [0, 12]\n",
      "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto plan = deviceplugin::BuildPlan(n.inv, *c);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(Message(plan.status())
                .rfind("c.yaml:6:20: sharing.timeSlicing.resources[0].devices: no device '12' of "
                       "resource nvidia.com/gpu on this node (it has 0, 1, 2, 3;",
                       0),
            0u)
      << plan.status();
  auto twice = deviceplugin::ParseConfig(
      "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 2, devices: [0]}\n"
      "    - {name: gpu, replicas: 3, devices: [0]}\n",
      "c.yaml");
  ASSERT_TRUE(twice.ok()) << twice.status();
  auto both = deviceplugin::BuildPlan(n.inv, *twice);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(Message(both.status()).rfind("c.yaml:5:7: sharing.timeSlicing.resources[0] and [1] both select", 0), 0u)
      << both.status();
}

TEST(ConfigInputTest, MigLayoutEntriesKeepTheirPosition) {
  testing::SimGpus n("l4x4");
  auto c = deviceplugin::ParseConfig("mig:\n  layouts:\n    a:\n      - devices: [12]\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = gpu::ResolveMigLayout(c->mig.layouts.at("a"), *n.inv, "a", c->mig.positions.at("a"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(Message(r.status()), "c.yaml:4:9: MIG layout 'a' entry 0: this node has no GPU 12 (it has 4 GPUs)");
}

// ---------------------------------------------------------------- counters CSV

TEST(CountersInputTest, UnknownFieldSuggestsTheNearestName) {
  auto typo =
      exporter::ParseCounters("DCGM_FI_DEV_SM_CLOCK, gauge, c\n  DCGM_FI_DEV_GPU_TMEP , gauge, t\n", "c.csv", nullptr);
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(Message(typo.status())
                .rfind("c.csv:2:3: unknown DCGM field DCGM_FI_DEV_GPU_TMEP (did you mean "
                       "DCGM_FI_DEV_GPU_TEMP?); fix the name, or remove the row",
                       0),
            0u)
      << typo.status();
  auto prof =
      exporter::ParseCounters("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_PROF_SM_ACTIV, gauge, s\n", "c.csv", nullptr);
  ASSERT_FALSE(prof.ok());
  EXPECT_NE(Message(prof.status()).find("(did you mean DCGM_FI_PROF_SM_ACTIVE?)"), std::string::npos) << prof.status();
  auto bad_type = exporter::ParseCounters("DCGM_FI_DEV_GPU_TEMP,gague, t\n", "c.csv", nullptr);
  EXPECT_EQ(Message(bad_type.status()).rfind("c.csv:1:22: type 'gague'", 0), 0u) << bad_type.status();
  auto not_dcgm = exporter::ParseCounters("gpu_temp, gauge, t\n", "c.csv", nullptr);
  EXPECT_NE(Message(not_dcgm.status()).find("is not a DCGM field name"), std::string::npos);
  // Known DCGM fields kgpu cannot produce are still accepted and omitted (dcgm-exporter's own CSVs).
  std::vector<std::string> skipped;
  auto known = exporter::ParseCounters(
      "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_VGPU_UTILIZATIONS, gauge, p\n"
      "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L3, counter, c\nDCGM_FI_DEV_NVSWITCH_LATENCY_LOW_P07, gauge, l\n",
      "c.csv", &skipped);
  ASSERT_TRUE(known.ok()) << known.status();
  EXPECT_EQ(known->size(), 1u);
  EXPECT_EQ(skipped.size(), 3u);
}

TEST(CountersInputTest, NoFamiliesIsAnError) {
  for (const char* csv : {"", "# Format: DCGM field, Prometheus metric type, help message\n\n",
                          "DCGM_FI_DRIVER_VERSION, label, Driver Version\n",
                          "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS, gauge, g\nDCGM_FI_DEV_VGPU_UTILIZATIONS, gauge, v\n"}) {
    auto c = exporter::ParseCounters(csv, "c.csv", nullptr);
    ASSERT_FALSE(c.ok()) << csv;
    EXPECT_EQ(Message(c.status()).rfind("c.csv:1:1: ", 0), 0u) << c.status();
    EXPECT_NE(Message(c.status()).find("the exporter would serve no GPU metrics"), std::string::npos) << c.status();
  }
  TempDir d;
  auto dir = exporter::LoadCountersFile(d.path, nullptr);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(Message(dir.status()).find("is a directory, not a counters file (check -f / DCGM_EXPORTER_COLLECTORS"),
            std::string::npos);
}

// ---------------------------------------------------------------- kubelet directory

TEST(KubeletDirTest, SaysWhichProblemItIs) {
  TempDir d;
  EXPECT_TRUE(deviceplugin::CheckKubeletDir(d.path).ok());
  EXPECT_TRUE(std::filesystem::is_empty(d.path)) << "the write probe must not stay behind";
  auto missing = deviceplugin::CheckKubeletDir(d.path + "/absent");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Message(missing).rfind("kubelet directory " + d.path + "/absent does not exist", 0), 0u) << missing;
  const std::string file = d.Write("file", "x");
  auto not_dir = deviceplugin::CheckKubeletDir(file);
  EXPECT_NE(Message(not_dir).find(file + " is not a directory (it is a regular file)"), std::string::npos) << not_dir;
  const std::string deep = d.path + "/" + std::string(90, 'd');
  std::filesystem::create_directories(deep);
  EXPECT_NE(Message(deviceplugin::CheckKubeletDir(deep)).find("is too long a path"), std::string::npos);
}

// ---------------------------------------------------------------- simulated GPU values

TEST(SimValuesTest, RangesFollowTheModel) {
  auto profile = sim::LoadProfile("l4x4");
  ASSERT_TRUE(profile.ok()) << profile.status();
  const sim::GpuModel& l4 = *profile->gpus[0].model;
  sim::SimGpu g{};
  EXPECT_EQ(Message(sim::SetLiveValue(g, l4, "temp", "-400")),
            "temp=-400: GPU temperature, degrees C, must be an integer from 0 to 200");
  EXPECT_EQ(Message(sim::SetLiveValue(g, l4, "util", "150")),
            "util=150 is out of range: GPU utilisation besides the listed processes' (served: sum of both, at most "
            "100), %, must be an integer from 0 to 100");
  const uint64_t usable = l4.memory_mib - l4.reserved_mib;
  EXPECT_NE(Message(sim::SetLiveValue(g, l4, "memused", "999999")).find(Cat("from 0 to ", usable)), std::string::npos);
  EXPECT_NE(Message(sim::SetLiveValue(g, l4, "temp", "4294967296")).find("out of range"), std::string::npos);
  EXPECT_TRUE(sim::SetLiveValue(g, l4, "memused", std::to_string(usable)).ok());
  EXPECT_EQ(g.mem_used_base, usable << 20);
  EXPECT_TRUE(sim::SetLiveValue(g, l4, "power", "60").ok());
  EXPECT_EQ(g.power_mw, 60000u);
  EXPECT_FALSE(sim::SetLiveValue(g, l4, "compute_mode", "1").ok());
  // A process may not take more than is free.
  sim::SimProcess p{};
  p.gi = p.ci = sim::kNoId;
  p.mem_bytes = 1ULL << 20;
  EXPECT_NE(Message(sim::CheckProcess(l4, g, p, 0)).find("more than the GPU has free (0 of"), std::string::npos);
  g.mem_used_base = 0;
  EXPECT_TRUE(sim::CheckProcess(l4, g, p, 0).ok());
  p.sm_util = 101;
  EXPECT_FALSE(sim::CheckProcess(l4, g, p, 0).ok());
}

TEST(SimValuesTest, LibraryDoesNotServeOutOfRangeState) {
  testing::SimGpus n("l4x4");
  ASSERT_TRUE(n.lib);
  const nvml::Device gpu0 = n.inv->gpus()[0].handle;
  ASSERT_TRUE(n.lib->GetUtilization(gpu0).ok());
  ASSERT_TRUE(n.lib->TemperatureC(gpu0).ok());
  ASSERT_TRUE(n.lib->Memory(gpu0).ok());
  // Another writer of the shared state (not simctl, which refuses these) puts garbage there.
  auto node = sim::Node::Open(sim::ReadEnvironment());
  ASSERT_TRUE(node.ok()) << node.status();
  {
    sim::Node::Locked lock(**node);
    lock.gpu(0).util_gpu = 150;
    lock.gpu(0).temp_c = static_cast<uint32_t>(-400);
    lock.gpu(0).mem_used_base = uint64_t{1} << 50;
  }
  EXPECT_EQ(nvml::ReturnOf(n.lib->GetUtilization(gpu0).status()), nvml::Return::kUnknown);
  EXPECT_EQ(nvml::ReturnOf(n.lib->TemperatureC(gpu0).status()), nvml::Return::kUnknown);
  EXPECT_EQ(nvml::ReturnOf(n.lib->Memory(gpu0).status()), nvml::Return::kUnknown);
  EXPECT_TRUE(n.lib->GetUtilization(n.inv->gpus()[1].handle).ok()) << "other GPUs are unaffected";
}

// ---------------------------------------------------------------- repeated conditions

// Captures what the "exporter" logger writes while it lives.
class CaptureSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string Text() {
    std::lock_guard<std::mutex> lock(text_mu_);
    return text_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(text_mu_);
    text_.append(msg.payload.data(), msg.payload.size());
    text_ += '\n';
  }
  void flush_() override {}

 private:
  std::mutex text_mu_;
  std::string text_;
};

struct CapturedLog {
  CapturedLog() : sink(std::make_shared<CaptureSink>()) { Log("exporter")->sinks().push_back(sink); }
  ~CapturedLog() {
    auto& sinks = Log("exporter")->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  }
  size_t Count(const std::string& what) const {
    const std::string text = sink->Text();
    size_t n = 0;
    for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
    return n;
  }
  std::string Text() const { return sink->Text(); }
  std::shared_ptr<CaptureSink> sink;
};

TEST(ConditionLogTest, LogsOncePerChange) {
  CapturedLog captured;
  ConditionLog log("exporter");
  EXPECT_FALSE(log.Clear("fine"));  // nothing was wrong
  EXPECT_TRUE(log.Report(spdlog::level::warn, "socket missing"));
  EXPECT_FALSE(log.Report(spdlog::level::warn, "socket missing"));
  EXPECT_FALSE(log.Report(spdlog::level::warn, "socket missing"));
  EXPECT_EQ(log.suppressed(), 2u);
  EXPECT_TRUE(log.Report(spdlog::level::warn, "permission denied"));  // changed
  EXPECT_TRUE(log.active());
  EXPECT_TRUE(log.Clear("fine"));
  EXPECT_FALSE(log.Clear("fine"));
  EXPECT_TRUE(log.Report(spdlog::level::warn, "socket missing"));  // back after clearing
  EXPECT_EQ(captured.Count("socket missing"), 2u);
  EXPECT_EQ(captured.Count("permission denied"), 1u);
  EXPECT_EQ(captured.Count("fine"), 1u);
}

// The exporter with pod attribution and no kubelet: the PodResources warning is logged once, the
// repeats are counted in its own metrics, and the recovery is logged once.
TEST(ConditionLogTest, ExporterLogsAMissingPodResourcesSocketOnce) {
  testing::SimGpus n("l4x4");
  ASSERT_TRUE(n.lib);
  TempDir d;
  CapturedLog captured;
  exporter::ExporterOptions o;
  auto counters = exporter::ParseCounters(exporter::DefaultCountersCsv(), "default", nullptr);
  ASSERT_TRUE(counters.ok());
  o.counters = *counters;
  o.address = "127.0.0.1:0";
  o.kubernetes = true;
  o.pod_resources_socket = d.path + "/kubelet.sock";
  o.pod_resources_interval = 100ms;
  o.proc_root = d.path;
  o.checkpoint_path = d.path + "/checkpoint";
  exporter::Exporter exp(*n.lib, n.inv, o);
  ASSERT_TRUE(exp.Start().ok());
  auto metric = [&](const std::string& name) {
    std::smatch m;
    const std::string text = exp.Scrape();
    return std::regex_search(text, m, std::regex("\n" + name + " ([0-9]+)")) ? std::stoull(m[1]) : 0ULL;
  };
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (metric("kgpu_exporter_podresources_errors_total") < 5 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(metric("kgpu_exporter_podresources_errors_total"), 5u);
  EXPECT_EQ(captured.Count("PodResources: kubelet PodResources socket"), 1u) << captured.Text();
  EXPECT_GE(metric("kgpu_exporter_log_repeats_suppressed_total"), 4u);
  // kubelet comes back: logged once.
  testing::FakePodResources kubelet(o.pod_resources_socket);
  ASSERT_TRUE(kubelet.Start().ok());
  while (captured.Count("PodResources: kubelet answers again") == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(captured.Count("PodResources: kubelet answers again"), 1u) << captured.Text();
  exp.Stop();
}

// Files the node writes for others to read (CDI specs, the health file, NFD features, gres.conf):
// all at once, world-readable, through a temporary file of each writer's own that never stays.
TEST(Files, WrittenAtomicallyAndNoTemporaryFileStays) {
  const auto dir = std::filesystem::temp_directory_path() / ("kgpu-files-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "spec.json").string();
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  std::vector<std::thread> writers;
  for (int i = 0; i < 8; ++i) {
    writers.emplace_back([&, i] { EXPECT_TRUE(WriteFileAtomically(path, "new " + std::to_string(i)).ok()); });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(ReadFile(path)->rfind("new ", 0), 0u);
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                std::filesystem::perms::group_read | std::filesystem::perms::others_read);
  // Renaming onto a directory fails: the error names both files, the temporary one is gone.
  std::filesystem::create_directories(dir / "taken");
  const auto st = WriteFileAtomically((dir / "taken").string(), "x");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("cannot rename "), std::string::npos) << st;
  EXPECT_NE(std::string(st.message()).find((dir / "taken").string()), std::string::npos) << st;
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u) << "only spec.json";
  EXPECT_NE(WriteFileAtomically((dir / "missing" / "f").string(), "x").message().find("cannot write "),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kgpu
