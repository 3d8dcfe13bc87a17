// `kgpu exporter` as a drop-in for dcgm-exporter 4.x: every flag and environment variable parses
// with its meaning or is refused with the reason (src/cli/exporter_cmd.h), dcgm-exporter's label
// options change the series as they do there, and --web-config-file serves Prometheus
// exporter-toolkit's TLS and basic auth (src/common/web_config.h).
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include "cli/exporter_cmd.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/web_config.h"
#include "exporter/attribution.h"
#include "exporter/counters.h"
#include "exporter/exporter.h"
#include "testing/exporter_fixture.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_podresources.h"
#include "testing/kubelet_checkpoint.h"

namespace kgpu::cli {
namespace {

// Made with Python's crypt module (libxcrypt): crypt.crypt("scrape-me",
// crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 4)), then the $2b$ prefix written as $2y$, the
// same bcrypt (htpasswd -nbBC 4 prometheus scrape-me writes this form). Cost 4 keeps tests fast.
constexpr char kHash[] = "$2y$04$TaSX4BmfD2fT/aAH5uEeDu45mtnClmDr7q6Q0KNg6ToZEUDXxSxly";
constexpr char kPassword[] = "scrape-me";

// A temporary directory, removed at the end of the test.
struct TempDir {
  TempDir() {
    char templ[] = "/tmp/kgpu-exporter-flags-XXXXXX";
    path = mkdtemp(templ);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string file = path + "/" + name;
    std::ofstream(file) << text;
    return file;
  }
  std::string path;
};

// Environment variables set for one test and restored after it.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<std::string, std::string>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, old] : saved_) {
      if (old) {
        setenv(name.c_str(), old->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Parses `args` (after "kgpu") as main() does, with the Go-style rewrite first. Returns the
// parser's error ("" when it parsed).
std::string Parse(const std::vector<std::string>& args, ExporterFlags* flags) {
  CLI::App app{"kgpu"};
  AddExporterFlags(app.add_subcommand("exporter", ""), flags);
  std::vector<std::string> argv = {"kgpu"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<const char*> raw;
  for (const auto& a : argv) raw.push_back(a.c_str());
  const auto rewritten = GoStyleFlags(app, static_cast<int>(raw.size()), raw.data());
  std::vector<const char*> ptrs;
  for (const auto& a : rewritten) ptrs.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(ptrs.size()), ptrs.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(ExporterFlagsTest, EveryDcgmExporterFlagIsAccepted) {
  ExporterFlags f;
  const std::string error = Parse({"exporter",
                                   "-f",
                                   "/x.csv",
                                   "--config-file",
                                   "/c.yaml",
                                   "-a",
                                   ":9500",
                                   "--web-read-timeout",
                                   "5s",
                                   "--web-write-timeout",
                                   "1m",
                                   "--max-concurrent-scrapes",
                                   "4",
                                   "--enable-exporter-metrics",
                                   "-c",
                                   "1000",
                                   "--watch-max-keep-age",
                                   "1m",
                                   "--watch-max-keep-samples",
                                   "10",
                                   "-k",
                                   "-o",
                                   "-p",
                                   "f",
                                   "-m",
                                   "gpu-operator:custom-metrics",
                                   "-r",
                                   "nvidia-dcgm:5555",
                                   "--kubernetes-enable-pod-labels",
                                   "--kubernetes-enable-pod-uid",
                                   "--kubernetes-gpu-id-type",
                                   "device-name",
                                   "--kubernetes-pod-label-allowlist-regex",
                                   "^app$,team",
                                   "-d",
                                   "g:0,1",
                                   "-n",
                                   "--health-require-gpus",
                                   "-s",
                                   "f",
                                   "--web-config-file",
                                   "/w.yml",
                                   "-x",
                                   "60000",
                                   "-rbmn",
                                   "--debug",
                                   "--clock-events-count-window-size",
                                   "1000",
                                   "--enable-dcgm-log",
                                   "--dcgm-log-level",
                                   "WARN",
                                   "--log-format",
                                   "json",
                                   "--pod-resources-kubelet-socket",
                                   "/s.sock",
                                   "--hpc-job-mapping-dir",
                                   "/hpc",
                                   "--container-runtime-socket",
                                   "/c.sock",
                                   "--nvidia-resource-names",
                                   "nvidia.com/a100,nvidia.com/a10",
                                   "--kubernetes-virtual-gpus",
                                   "--dump-enabled",
                                   "--dump-directory",
                                   "/d",
                                   "--dump-retention",
                                   "1",
                                   "--dump-compression=false",
                                   "--disable-startup-validate",
                                   "--enable-gpu-bind-unbind-watch",
                                   "--gpu-bind-unbind-poll-interval",
                                   "2s",
                                   "--enable-pprof",
                                   "--hostname-label",
                                   "hostname"},
                                  &f);
  ASSERT_EQ(error, "");
  EXPECT_TRUE(CheckExporterFlags(f).ok()) << CheckExporterFlags(f);
  EXPECT_EQ(f.collectors, "/x.csv");
  EXPECT_TRUE(f.collectors_given);
  EXPECT_EQ(f.config_file, "/c.yaml");
  EXPECT_EQ(f.interval_ms, 1000u);
  EXPECT_TRUE(f.interval_given);
  EXPECT_TRUE(f.kubernetes && f.use_old_namespace && f.pod_labels && f.pod_uid && f.no_hostname);
  EXPECT_EQ(f.configmap_data, "gpu-operator:custom-metrics");
  EXPECT_EQ(f.remote_hostengine, "nvidia-dcgm:5555");
  EXPECT_EQ(f.pod_label_allowlist, (std::vector<std::string>{"^app$", "team"}));
  EXPECT_EQ(f.devices, "g:0,1");
  EXPECT_EQ(f.xid_window_ms, 60000u);
  EXPECT_TRUE(f.replace_blanks);  // -rbmn
  EXPECT_TRUE(f.debug);
  EXPECT_EQ(f.clock_events_window_ms, 1000u);
  EXPECT_EQ(f.log_format, "json");
  EXPECT_EQ(f.nvidia_resource_names, (std::vector<std::string>{"nvidia.com/a100", "nvidia.com/a10"}));
  EXPECT_TRUE(f.virtual_gpus && f.dump_enabled && f.disable_startup_validate && f.bind_unbind_watch && f.pprof);
  EXPECT_FALSE(f.dump_compression);
  EXPECT_EQ(f.hostname_label, "hostname");
}

// urfave/cli reads a BoolFlag's variable with strconv.ParseBool: 1, t, T, TRUE, true, True and
// 0, f, F, FALSE, false, False.
TEST(ExporterFlagsTest, EnvironmentVariablesAsDcgmExporterReadsThem) {
  for (const char* yes : {"1", "t", "T", "TRUE", "true", "True"}) {
    ScopedEnv env({{"DCGM_EXPORTER_KUBERNETES", yes},
                   {"DCGM_EXPORTER_USE_OLD_NAMESPACE", yes},
                   {"KUBERNETES_VIRTUAL_GPUS", yes},
                   {"DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME", yes}});
    ExporterFlags f;
    ASSERT_EQ(Parse({"exporter"}, &f), "") << yes;
    EXPECT_TRUE(f.kubernetes && f.use_old_namespace && f.virtual_gpus && f.replace_blanks) << yes;
  }
  for (const char* no : {"0", "f", "F", "FALSE", "false", "False"}) {
    ScopedEnv env({{"DCGM_EXPORTER_KUBERNETES", no}, {"DCGM_EXPORTER_DUMP_COMPRESSION", no}});
    ExporterFlags f;
    ASSERT_EQ(Parse({"exporter"}, &f), "") << no;
    EXPECT_FALSE(f.kubernetes) << no;
    EXPECT_FALSE(f.dump_compression) << no;
  }
  ScopedEnv env({{"DCGM_EXPORTER_COLLECTORS", "/etc/c.csv"},
                 {"DCGM_EXPORTER_INTERVAL", "1000"},
                 {"DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "60000"},
                 {"DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE", "2000"},
                 {"DCGM_EXPORTER_DEVICES_STR", "i:1,3"},
                 {"NVIDIA_RESOURCE_NAMES", "nvidia.com/a100,nvidia.com/h100"},
                 {"DCGM_EXPORTER_WEB_CONFIG_FILE", "/w.yml"},
                 {"DCGM_REMOTE_HOSTENGINE_INFO", "nvidia-dcgm:5555"},
                 {"DCGM_EXPORTER_CONFIGMAP_DATA", "gpu-operator:metrics"},
                 {"DCGM_HPC_JOB_MAPPING_DIR", "/var/run/hpc"},
                 {"DCGM_EXPORTER_LOG_FORMAT", "json"},
                 {"DCGM_EXPORTER_CONFIG_FILE", "/c.yaml"},
                 {"DCGM_EXPORTER_WEB_READ_TIMEOUT", "3s"},
                 {"KGPU_HOSTNAME_LABEL", "hostname"}});
  ExporterFlags f;
  ASSERT_EQ(Parse({"exporter"}, &f), "");
  EXPECT_EQ(f.collectors, "/etc/c.csv");
  EXPECT_TRUE(f.collectors_given);  // an environment variable is "explicitly set" as in dcgm-exporter
  EXPECT_EQ(f.interval_ms, 1000u);
  EXPECT_TRUE(f.interval_given);
  EXPECT_EQ(f.xid_window_ms, 60000u);
  EXPECT_EQ(f.clock_events_window_ms, 2000u);
  EXPECT_EQ(f.devices, "i:1,3");
  EXPECT_EQ(f.nvidia_resource_names, (std::vector<std::string>{"nvidia.com/a100", "nvidia.com/h100"}));
  EXPECT_EQ(f.web_config_file, "/w.yml");
  EXPECT_EQ(f.remote_hostengine, "nvidia-dcgm:5555");
  EXPECT_EQ(f.configmap_data, "gpu-operator:metrics");
  EXPECT_EQ(f.hpc_job_mapping_dir, "/var/run/hpc");
  EXPECT_EQ(f.log_format, "json");
  EXPECT_EQ(f.config_file, "/c.yaml");
  EXPECT_EQ(f.web_read_timeout, "3s");
  EXPECT_EQ(f.hostname_label, "hostname");
}

TEST(ExporterFlagsTest, MalformedValuesAreUsageErrorsNamingTheFlag) {
  for (const auto& [args, want] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"-d", "x"}, "--devices"},
           {{"-d", "f:1"}, "--devices"},
           {{"-d", "g:3-1"}, "--devices"},
           {{"-p", "q"}, "--cpu-devices"},
           {{"--log-format", "yaml"}, "--log-format"},
           {{"--dcgm-log-level", "LOUD"}, "--dcgm-log-level"},
           {{"-m", "no-colon"}, "--configmap-data"},
           {{"--web-read-timeout", "5"}, "--web-read-timeout"},
           {{"--hostname-label", "HOSTNAME"}, "--hostname-label"},
           {{"-x", "0"}, "--xid-count-window-size"},
           {{"--no-such-flag"}, "--no-such-flag"},
       }) {
    ExporterFlags f;
    std::vector<std::string> full = {"exporter"};
    full.insert(full.end(), args.begin(), args.end());
    const std::string error = Parse(full, &f);
    EXPECT_NE(error, "") << Join(args, " ");
    EXPECT_NE(error.find(want), std::string::npos) << Join(args, " ") << ": " << error;
  }
}

// Refused: usage errors (exit 2) that say why and what to use instead.
TEST(ExporterFlagsTest, RefusedFlagsSayWhyAndTheKgpuEquivalent) {
  for (const auto& [set, want] : std::vector<std::pair<std::function<void(ExporterFlags&)>, std::string>>{
           {[](ExporterFlags& f) { f.fake_gpus = true; }, "--nvml-library"},
           {[](ExporterFlags& f) { f.dra = true; }, "DRA"},
           {[](ExporterFlags& f) { f.systemd_socket = true; }, "use -a"},
           {[](ExporterFlags& f) { f.container_labels = true; }, "-k/--kubernetes"},
           {[](ExporterFlags& f) { f.cpu_devices = "g"; }, "no CPU entities"},
           {[](ExporterFlags& f) { f.switch_devices = "g:0"; }, "no NVSwitch entities"},
           {[](ExporterFlags& f) { f.pod_label_allowlist = {"(unclosed"}; }, "not a regular expression"},
       }) {
    ExporterFlags f;
    set(f);
    const absl::Status st = CheckExporterFlags(f);
    ASSERT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_NE(std::string(st.message()).find(want), std::string::npos) << st.message();
    EXPECT_FALSE(ResolveExporterOptions(f).ok());
  }
}

TEST(ExporterFlagsTest, DeviceSelectorGrammar) {
  auto parse = [](const std::string& v) { return ParseDeviceSelector("-d", v); };
  auto f = parse("f");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->flex);
  auto g = parse("g");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(!g->flex && g->gpus && !g->instances && g->gpu_ids.empty());
  EXPECT_TRUE(g->Gpu(7));
  auto list = parse("g:0,1");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->gpu_ids, (std::vector<unsigned>{0, 1}));
  EXPECT_FALSE(list->Gpu(2));
  auto range = parse("g:0-3");
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->gpu_ids, (std::vector<unsigned>{0, 1, 2, 3}));
  auto gis = parse("i:0,2-4");
  ASSERT_TRUE(gis.ok());
  EXPECT_TRUE(gis->instances && !gis->gpus);
  EXPECT_EQ(gis->instance_ids, (std::vector<unsigned>{0, 2, 3, 4}));
  auto both = parse("g:1+i");
  ASSERT_TRUE(both.ok());
  EXPECT_TRUE(both->gpus && both->instances && both->instance_ids.empty());
  EXPECT_EQ(both->gpu_ids, (std::vector<unsigned>{1}));
  for (const char* bad : {"", "x", "f:1", "g:", "g:a", "g:3-1", "f+g", "g+g", "g:1:2", "g+", "i:1-2-3"}) {
    const auto s = parse(bad);
    EXPECT_FALSE(s.ok()) << "'" << bad << "'";
    if (!s.ok()) {
      EXPECT_EQ(std::string(s.status().message()).rfind(Cat("-d '", bad, "': "), 0), 0u) << s.status();
    }
  }
}

TEST(ExporterFlagsTest, GoStyleSingleDashLongFlagsAndRbmn) {
  CLI::App app{"kgpu"};
  ExporterFlags f;
  AddExporterFlags(app.add_subcommand("exporter", ""), &f);
  const char* argv[] = {
      "kgpu", "--log-level", "info", "exporter", "-collectors", "x.csv", "-rbmn", "-web-config-file=/w.yml",
      "-k",   "-c",          "500",  "-no-such", "--",          "-rbmn"};
  const auto out = GoStyleFlags(app, static_cast<int>(std::size(argv)), argv);
  EXPECT_EQ(out, (std::vector<std::string>{"kgpu", "--log-level", "info", "exporter", "--collectors", "x.csv",
                                           "--replace-blanks-in-model-name", "--web-config-file=/w.yml", "-k", "-c",
                                           "500", "-no-such", "--", "-rbmn"}));
  // Run as dcgm-exporter (a link to kgpu): `kgpu exporter` with dcgm-exporter's arguments.
  const char* linked[] = {"/usr/bin/dcgm-exporter", "-f", "/etc/dcgm-exporter/default-counters.csv", "-rbmn"};
  EXPECT_EQ(GoStyleFlags(app, 4, linked),
            (std::vector<std::string>{"/usr/bin/dcgm-exporter", "exporter", "-f",
                                      "/etc/dcgm-exporter/default-counters.csv", "--replace-blanks-in-model-name"}));
  // Before the subcommand nothing changes.
  const char* before[] = {"kgpu", "-collectors", "exporter"};
  EXPECT_EQ(GoStyleFlags(app, 3, before), (std::vector<std::string>{"kgpu", "-collectors", "exporter"}));
}

TEST(ExporterFlagsTest, ResolvedOptionsCarryEachMeaning) {
  TempDir dir;
  ExporterFlags f;
  f.kubernetes = true;
  f.use_old_namespace = true;
  f.hostname_label = "hostname";
  f.xid_window_ms = 60000;
  f.clock_events_window_ms = 2000;
  f.devices = "g:0+i:1";
  f.pod_uid = true;
  f.virtual_gpus = true;
  f.health_require_gpus = true;
  f.hpc_job_mapping_dir = dir.path;
  f.web_read_timeout = "0s";  // dcgm-exporter: 0 means its default
  f.web_write_timeout = "45s";
  f.remote_hostengine = "nvidia-dcgm:5555";  // accepted, logged: no host engine needed
  f.nvidia_resource_names = {"nvidia.com/a100"};
  auto o = ResolveExporterOptions(f);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->use_old_namespace);
  EXPECT_EQ(o->hostname_label, "hostname");
  EXPECT_EQ(o->xid_count_window, std::chrono::milliseconds(60000));
  EXPECT_EQ(o->clock_events_count_window, std::chrono::milliseconds(2000));
  EXPECT_TRUE(o->devices.Gpu(0) && !o->devices.Gpu(1) && o->devices.Instance(1) && !o->devices.Instance(0));
  EXPECT_TRUE(o->pod_uid && o->virtual_gpus && o->health_require_gpus);
  ASSERT_NE(o->hpc_jobs, nullptr);
  EXPECT_EQ(o->hpc_jobs->dir(), dir.path);
  EXPECT_EQ(o->web_read_timeout, std::chrono::milliseconds(10000));
  EXPECT_EQ(o->web_write_timeout, std::chrono::milliseconds(45000));
  // Without -k the pod options have no effect (as in dcgm-exporter).
  f.kubernetes = false;
  auto no_k = ResolveExporterOptions(f);
  ASSERT_TRUE(no_k.ok());
  EXPECT_FALSE(no_k->pod_uid || no_k->virtual_gpus);
}

// The Helm chart's -f /etc/dcgm-exporter/default-counters.csv and the GPU Operator's
// DCGM_EXPORTER_COLLECTORS=/etc/dcgm-exporter/dcp-metrics-included.csv name files of dcgm-exporter's
// image: absent, they mean the built-in default. Any other missing file is an error.
TEST(ExporterFlagsTest, DcgmExporterImageCountersPathsMeanTheBuiltInDefault) {
  std::vector<std::string> skipped;
  const auto builtin = exporter::ParseCounters(exporter::DefaultCountersCsv(), "default", &skipped);
  ASSERT_TRUE(builtin.ok());
  for (const char* path : {"/etc/dcgm-exporter/default-counters.csv", "/etc/dcgm-exporter/dcp-metrics-included.csv"}) {
    if (std::filesystem::exists(path)) continue;  // a dcgm-exporter image: read as it is
    ExporterFlags f;
    f.collectors = path;
    f.collectors_given = true;
    auto o = ResolveExporterOptions(f);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->counters.size(), builtin->size()) << path;
  }
  ExporterFlags missing;
  missing.collectors = "/etc/dcgm-exporter/no-such.csv";
  missing.collectors_given = true;
  EXPECT_FALSE(ResolveExporterOptions(missing).ok());
}

TEST(ExporterFlagsTest, ConfigFileMetricsAndIntervalYieldToExplicitFlags) {
  TempDir dir;
  const std::string config = dir.Write("config.yaml",
                                       "version: 1\n"
                                       "metrics:\n"
                                       "  fields:\n"
                                       "    - {name: DCGM_FI_DEV_GPU_TEMP, prometheusType: gauge, help: \"t in C\"}\n"
                                       "    - {name: DCGM_FI_DEV_POWER_USAGE, prometheusType: gauge, help: power}\n"
                                       "collection:\n"
                                       "  interval: 2s\n"
                                       "  watchGroups:\n"
                                       "    - {name: fast, interval: 1s, fields: [DCGM_FI_DEV_GPU_TEMP]}\n");
  ExporterFlags f;
  f.config_file = config;
  auto o = ResolveExporterOptions(f);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->counters.size(), 2u);
  EXPECT_EQ(o->counters[0].name, "DCGM_FI_DEV_GPU_TEMP");
  EXPECT_EQ(o->counters[0].help, "t in C");
  EXPECT_EQ(o->interval, std::chrono::milliseconds(2000));
  // Explicit -f and -c (flag or environment variable) win.
  f.collectors = dir.Write("c.csv", "DCGM_FI_DEV_SM_CLOCK, gauge, s\n");
  f.collectors_given = true;
  f.interval_ms = 500;
  f.interval_given = true;
  auto explicit_flags = ResolveExporterOptions(f);
  ASSERT_TRUE(explicit_flags.ok()) << explicit_flags.status();
  ASSERT_EQ(explicit_flags->counters.size(), 1u);
  EXPECT_EQ(explicit_flags->counters[0].name, "DCGM_FI_DEV_SM_CLOCK");
  EXPECT_EQ(explicit_flags->interval, std::chrono::milliseconds(500));
  // A counters file named by the config.
  ExporterFlags by_file;
  by_file.config_file = dir.Write("file.yaml", Cat("version: 1\nmetrics:\n  file: ", dir.path, "/c.csv\n"));
  auto file = ResolveExporterOptions(by_file);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->counters[0].name, "DCGM_FI_DEV_SM_CLOCK");
  // Errors name the file and the line.
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"version: 2\n", "bad.yaml:1:"},
           {"version: 1\nmetric:\n  file: x\n", "bad.yaml:2:1: unknown key 'metric'"},
           {"version: 1\nmetrics:\n  file: x\n  fields: [{name: a, prometheusType: gauge, help: h}]\n",
            "exactly one of file or fields"},
           {"version: 1\ncollection:\n  interval: soon\n", "bad.yaml:3:"},
       }) {
    ExporterFlags bad;
    bad.config_file = dir.Write("bad.yaml", text);
    auto r = ResolveExporterOptions(bad);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(std::string(r.status().message()).find(want), std::string::npos) << r.status();
  }
}

// -m <namespace>:<name>: the ConfigMap's data.metrics through the API server (dcgm-exporter reads it
// with its in-cluster client; kgpu with the same resolver as every command).
// A kubeconfig with exactly the rules deploy/exporter/pod-metadata/rbac.yaml grants.
std::string DeployKubeconfig(testing::FakeApiServer& api) {
  auto id = testing::ReadDeployRbac(std::string(KGPU_SOURCE_DIR) + "/deploy/exporter/pod-metadata/rbac.yaml");
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? api.KubeconfigFor(*id) : api.Kubeconfig();
}

TEST(ExporterFlagsTest, ConfigMapDataIsReadThroughTheApiServer) {
  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start().ok());
  api.Create("namespaces", "", {{"metadata", {{"name", "kgpu-system"}}}});
  ASSERT_EQ(api.Create("configmaps", "kgpu-system",
                       {{"metadata", {{"name", "custom-metrics"}, {"namespace", "kgpu-system"}}},
                        {"data",
                         {{"metrics",
                           "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                           "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n"}}}})
                    .code /
                100,
            2);
  ASSERT_EQ(api.Create("configmaps", "kgpu-system",
                       {{"metadata", {{"name", "wrong-key"}, {"namespace", "kgpu-system"}}},
                        {"data", {{"dcp-metrics-included.csv", "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"}}}})
                    .code /
                100,
            2);
  TempDir dir;
  ExporterFlags f;
  f.kubeconfig = dir.Write("kubeconfig", DeployKubeconfig(api));
  f.configmap_data = "kgpu-system:custom-metrics";
  f.collectors = "/ignored.csv";  // -m wins, as in dcgm-exporter
  f.collectors_given = true;
  auto o = ResolveExporterOptions(f);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->counters.size(), 2u);
  EXPECT_EQ(o->counters[1].name, "DCGM_FI_DEV_FB_USED");
  f.configmap_data = "kgpu-system:wrong-key";
  auto no_key = ResolveExporterOptions(f);
  ASSERT_FALSE(no_key.ok());
  EXPECT_NE(std::string(no_key.status().message()).find("has no key 'metrics'"), std::string::npos) << no_key.status();
  f.configmap_data = "kgpu-system:absent";
  auto absent = ResolveExporterOptions(f);
  ASSERT_FALSE(absent.ok());
  EXPECT_NE(std::string(absent.status().message()).find("-m/--configmap-data kgpu-system:absent: cannot read"),
            std::string::npos)
      << absent.status();
}

// The pod informer behind --kubernetes-enable-pod-labels: this node's pods only, labels sanitised
// and allow-listed, deletions followed.
TEST(ExporterFlagsTest, PodLabelsComeFromANodeScopedInformer) {
  testing::FakeApiServer api;
  ASSERT_TRUE(api.Start().ok());
  api.Create("namespaces", "", {{"metadata", {{"name", "ml"}}}});
  auto pod = [](const std::string& name, const std::string& node) {
    return nlohmann::json{
        {"metadata",
         {{"name", name},
          {"namespace", "ml"},
          {"labels", {{"app.kubernetes.io/name", "trainer"}, {"team", "vision"}, {"pod-template-hash", "abc"}}}}},
        {"spec", {{"nodeName", node}, {"containers", {{{"name", "c"}, {"image", "i"}}}}}}};
  };
  ASSERT_EQ(api.Create("pods", "ml", pod("train-0", "gpu-node")).code / 100, 2);
  ASSERT_EQ(api.Create("pods", "ml", pod("elsewhere", "other-node")).code / 100, 2);
  TempDir dir;
  ExporterFlags f;
  f.kubeconfig = dir.Write("kubeconfig", DeployKubeconfig(api));
  f.node_name = "gpu-node";
  f.pod_label_allowlist = {"^app\\.", "^team$"};
  auto source = PodMetadataSource::Start(f);
  ASSERT_TRUE(source.ok()) << source.status();
  const auto read = (*source)->Reader();
  const auto train = read("ml", "train-0");
  ASSERT_TRUE(train.has_value());
  EXPECT_FALSE(train->uid.empty());
  EXPECT_EQ(train->labels, (std::vector<std::pair<std::string, std::string>>{{"app_kubernetes_io_name", "trainer"},
                                                                             {"team", "vision"}}));
  EXPECT_FALSE(read("ml", "elsewhere").has_value());  // another node's pod
  api.Delete("pods", "ml", "train-0");
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = !read("ml", "train-0").has_value();
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // A graceful deletion may leave the pod terminating (still listed) until its grace period ends.
  (void)gone;
}

TEST(ExporterFlagsTest, PodLabelsAreSanitisedAndAllowListed) {
  const std::map<std::string, std::string> labels = {
      {"app.kubernetes.io/name", "x"}, {"team", "t"}, {"1st", "y"}, {"app_kubernetes_io_name", "dup"}};
  EXPECT_EQ(exporter::PodMetricLabels(labels, {}), (std::vector<std::pair<std::string, std::string>>{
                                                       {"_1st", "y"}, {"app_kubernetes_io_name", "x"}, {"team", "t"}}));
  EXPECT_EQ(exporter::PodMetricLabels(labels, {std::regex("^team")}),
            (std::vector<std::pair<std::string, std::string>>{{"team", "t"}}));
}

// ---------------------------------------------------------------- the series

using Fixture = kgpu::testing::ExporterFixture;
using kgpu::testing::Family;

TEST(ExporterFlagsTest, OldNamespaceAndHostnameLabelRenameLabels) {
  Fixture f("l4x4");
  f.options.use_old_namespace = true;
  f.options.hostname_label = "hostname";
  const std::string text = f.Collect();
  const auto temps = Family(text, "DCGM_FI_DEV_GPU_TEMP");
  ASSERT_EQ(temps.size(), 4u);
  EXPECT_EQ(temps[0].rfind("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",uuid=\"GPU-", 0), 0u) << temps[0];
  EXPECT_NE(temps[0].find(",hostname=\"node-a\""), std::string::npos) << temps[0];
  EXPECT_EQ(text.find("UUID=\""), std::string::npos);
  EXPECT_EQ(text.find("Hostname=\""), std::string::npos);
}

TEST(ExporterFlagsTest, DevicesSelectGpusAndGpuInstances) {
  Fixture f("dgx-a100-mig");  // 8 GPUs; GPU 0 has 4 GPU instances, GPU 1 has 7
  auto count = [&](const std::string& selector) {
    auto s = ParseDeviceSelector("-d", selector);
    EXPECT_TRUE(s.ok()) << s.status();
    f.options.devices = *s;
    return Family(f.Collect(), "DCGM_FI_DEV_GPU_TEMP");
  };
  EXPECT_EQ(count("f").size(), 6u + 4u + 7u);  // whole GPUs where MIG is off, instances where on
  EXPECT_EQ(count("g").size(), 8u);            // every GPU whole, MIG ones too
  EXPECT_EQ(count("i").size(), 4u + 7u);       // instances only
  EXPECT_EQ(count("g+i").size(), 8u + 4u + 7u);
  const auto two = count("g:0,2");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].rfind("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",", 0), 0u);
  EXPECT_EQ(two[0].find("GPU_I_ID"), std::string::npos);  // GPU 0 whole, though MIG is on
  EXPECT_EQ(two[1].rfind("DCGM_FI_DEV_GPU_TEMP{gpu=\"2\",", 0), 0u);
  const auto first_instances = count("i:1");
  ASSERT_FALSE(first_instances.empty());
  for (const auto& l : first_instances) EXPECT_NE(l.find("GPU_I_ID=\"1\""), std::string::npos) << l;
}

TEST(ExporterFlagsTest, HpcJobsLabelEverySeriesOncePerJob) {
  Fixture f("l4x4");
  TempDir jobs;
  jobs.Write("0", "slurm-101\nslurm-102\n");
  jobs.Write("1", "slurm-200\r\n\n");
  jobs.Write("notes.txt", "not a GPU\n");
  f.options.hpc_jobs = std::make_shared<exporter::HpcJobs>(jobs.path);
  const std::string text = f.Collect();
  std::vector<std::string> gpu0, gpu1, gpu2;
  for (const auto& l : Family(text, "DCGM_FI_DEV_GPU_TEMP")) {
    if (l.rfind("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"", 0) == 0) gpu0.push_back(l);
    if (l.rfind("DCGM_FI_DEV_GPU_TEMP{gpu=\"1\"", 0) == 0) gpu1.push_back(l);
    if (l.rfind("DCGM_FI_DEV_GPU_TEMP{gpu=\"2\"", 0) == 0) gpu2.push_back(l);
  }
  ASSERT_EQ(gpu0.size(), 2u) << text;
  EXPECT_NE(gpu0[0].find("hpc_job=\"slurm-101\""), std::string::npos) << gpu0[0];
  EXPECT_NE(gpu0[1].find("hpc_job=\"slurm-102\""), std::string::npos) << gpu0[1];
  ASSERT_EQ(gpu1.size(), 1u);
  EXPECT_NE(gpu1[0].find("hpc_job=\"slurm-200\""), std::string::npos) << gpu1[0];
  ASSERT_EQ(gpu2.size(), 1u);
  EXPECT_EQ(gpu2[0].find("hpc_job"), std::string::npos);
  EXPECT_EQ(Family(text, "kgpu_gpu_up").size(), 5u);  // GPU 0 once per job
  // The files are read at every collection.
  jobs.Write("2", "late-job\n");
  EXPECT_NE(f.Collect().find("hpc_job=\"late-job\""), std::string::npos);
}

// Pod series with --kubernetes-enable-pod-uid (the UID from kubelet's checkpoint),
// --kubernetes-virtual-gpus (the replica each pod holds) and pod labels (through the reader the
// CLI's informer provides), and -o's old attribute names.
TEST(ExporterFlagsTest, PodUidVirtualGpusAndPodLabels) {
  for (const bool old_names : {false, true}) {
    Fixture f("dgx-h100");
    const std::string g0 = f.inv->gpus()[0].uuid, g1 = f.inv->gpus()[1].uuid;
    const std::string dir = f.sim.dir();
    struct P {
      const char* uid;
      const char* pod;
      std::string device;
    };
    const std::vector<P> pods = {{"11111111-1111-1111-1111-111111111111", "train-0", g0 + "::0"},
                                 {"22222222-2222-2222-2222-222222222222", "infer-0", g0 + "::3"},
                                 {"44444444-4444-4444-4444-444444444444", "solo-0", g1}};
    v1::ListPodResourcesResponse list;
    std::string entries;
    for (const auto& p : pods) {
      if (!entries.empty()) entries += ",";
      entries += Cat(R"({"PodUID":")", p.uid, R"(","ContainerName":"main","ResourceName":"nvidia.com/gpu",)",
                     R"("DeviceIDs":{"-1":[")", p.device, R"("]},"AllocResp":""})");
      kgpu::testing::AddDevices(list, "ml", p.pod, "main", "nvidia.com/gpu", {p.device});
    }
    std::ofstream(dir + "/checkpoint") << kgpu::testing::SignedCheckpoint(
        Cat(R"({"Data":{"PodDeviceEntries":[)", entries, R"(],"RegisteredDevices":{}},"Checksum":1})"));
    kgpu::testing::FakePodResources server(dir + "/pr.sock");
    ASSERT_TRUE(server.Start().ok());
    f.options.kubernetes = true;
    f.options.pod_resources_socket = dir + "/pr.sock";
    f.options.proc_root = dir + "/proc";
    f.options.checkpoint_path = dir + "/checkpoint";
    f.options.address = "127.0.0.1:0";
    f.options.interval = std::chrono::hours(1);
    f.options.use_old_namespace = old_names;
    f.options.pod_uid = true;
    f.options.virtual_gpus = true;
    f.options.pod_metadata = [](const std::string& ns,
                                const std::string& name) -> std::optional<exporter::PodMetadata> {
      if (ns != "ml") return std::nullopt;
      // "pod" is one of the exporter's own names: never a second label of that name.
      return exporter::PodMetadata{"", {{"app", name.substr(0, name.find('-'))}, {"pod", "clash"}}};
    };
    server.SetListResponse(list);
    exporter::Exporter exp(*f.lib, f.inv, f.options);
    ASSERT_TRUE(exp.Start().ok());
    const std::string text = exp.Scrape();
    exp.Stop();
    const std::string pod_key = old_names ? "pod_name" : "pod";
    auto line_of = [&](const std::string& family, const std::string& uuid, const std::string& pod) {
      for (const auto& l : Family(text, family)) {
        if (l.find(uuid) != std::string::npos && l.find(pod_key + "=\"" + pod + "\"") != std::string::npos) return l;
      }
      return std::string();
    };
    // The shared GPU: one FB_USED series per pod, each with its replica and UID.
    const std::string train = line_of("DCGM_FI_DEV_FB_USED", g0, "train-0");
    ASSERT_NE(train, "") << text;
    // Sorted label names: the old ones order pod_name before pod_namespace.
    const std::string pod_attrs =
        old_names ? "app=\"train\",container_name=\"main\",pod_name=\"train-0\",pod_namespace=\"ml\","
                  : "app=\"train\",container=\"main\",namespace=\"ml\",pod=\"train-0\",";
    EXPECT_NE(train.find(pod_attrs + "pod_uid=\"11111111-1111-1111-1111-111111111111\",vgpu=\"0\"}"), std::string::npos)
        << train;
    EXPECT_NE(line_of("DCGM_FI_DEV_FB_USED", g0, "infer-0").find("vgpu=\"3\""), std::string::npos);
    EXPECT_EQ(train.find("\"clash\""), std::string::npos);
    // The GPU one pod holds whole: every series has its labels and UID, and no replica.
    const std::string solo = line_of("DCGM_FI_DEV_GPU_TEMP", g1, "solo-0");
    ASSERT_NE(solo, "") << text;
    EXPECT_NE(solo.find("pod_uid=\"44444444-4444-4444-4444-444444444444\""), std::string::npos) << solo;
    EXPECT_NE(solo.find("app=\"solo\""), std::string::npos) << solo;
    EXPECT_EQ(solo.find("vgpu="), std::string::npos) << solo;
    server.Stop();
  }
}

// ---------------------------------------------------------------- --web-config-file

TEST(WebConfigTest, ParsesExporterToolkitsFormat) {
  auto c = web::ParseWebConfig(Cat("tls_server_config:\n"
                                   "  cert_file: tls.crt\n"
                                   "  key_file: /abs/tls.key\n"
                                   "  client_auth_type: RequireAndVerifyClientCert\n"
                                   "  client_ca_file: ca/ca.crt\n"
                                   "  min_version: TLS13\n"
                                   "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n"
                                   "  curve_preferences: [X25519, CurveP256]\n"
                                   "  prefer_server_cipher_suites: true\n"
                                   "http_server_config:\n"
                                   "  http2: false\n"
                                   "  headers:\n"
                                   "    X-Frame-Options: deny\n"
                                   "    Strict-Transport-Security: max-age=31536000\n"
                                   "basic_auth_users:\n"
                                   "  prometheus: ",
                                   kHash,
                                   "\n"
                                   "rate_limit:\n"
                                   "  interval: 100ms\n"
                                   "  burst: 5\n"),
                               "web.yml", "/etc/kgpu");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tls.enabled);
  EXPECT_EQ(c->tls.cert_file, "/etc/kgpu/tls.crt");  // relative to the config's directory
  EXPECT_EQ(c->tls.key_file, "/abs/tls.key");
  EXPECT_EQ(c->tls.client_ca_file, "/etc/kgpu/ca/ca.crt");
  EXPECT_EQ(c->tls.client_auth_type, "RequireAndVerifyClientCert");
  EXPECT_EQ(c->tls.min_version, 0x0304);
  EXPECT_EQ(c->tls.ciphers, (std::vector<std::string>{"ECDHE-RSA-AES128-GCM-SHA256"}));  // TLS 1.3: not set
  EXPECT_EQ(c->tls.curves, (std::vector<std::string>{"X25519", "P-256"}));
  EXPECT_EQ(c->headers.size(), 2u);
  EXPECT_EQ(c->users.at("prometheus"), kHash);
  EXPECT_EQ(c->rate_interval, std::chrono::milliseconds(100));
  EXPECT_EQ(c->rate_burst, 5);
  // An empty file: plain HTTP, no users.
  auto empty = web::ParseWebConfig("", "web.yml", "/");
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->tls.enabled);
  EXPECT_TRUE(empty->users.empty());
}

TEST(WebConfigTest, ErrorsNameTheFileLineAndColumnAndNeverEchoASecret) {
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"tls_server_config:\n  cert_file: a\n  key_fil: b\n", "web.yml:3:3: unknown key 'key_fil'"},
           {"tls_server_config:\n  cert_file: a\n", "web.yml:2:3: tls_server_config: missing one of key or key_file"},
           {"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Maybe\n",
            "web.yml:4:21: tls_server_config.client_auth_type: unknown policy 'Maybe'"},
           {"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: c\n",
            "a client CA is configured without a client_auth_type"},
           {"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
            "verifies client certificates against client_ca_file"},
           {"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n"
            "  client_allowed_sans: [x]\n",
            "web.yml:5:24: tls_server_config.client_allowed_sans is not supported"},
           {"tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS14\n",
            "web.yml:4:16: tls_server_config.min_version: unknown TLS version 'TLS14'"},
           {"tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_FAKE]\n",
            "web.yml:4:19: tls_server_config.cipher_suites: unknown cipher 'TLS_FAKE'"},
           {"http_server_config:\n  headers:\n    X-Powered-By: kgpu\n",
            "web.yml:3:5: http_server_config.headers: HTTP header 'X-Powered-By' can not be configured"},
           {"http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "'allow' is not one of deny, sameorigin"},
           {"basic_auth_users:\n  alice: plain-text-password\n",
            "web.yml:2:10: basic_auth_users.alice: not a bcrypt hash"},
           {"basic_auth_user:\n  alice: x\n", "web.yml:1:1: unknown key 'basic_auth_user'"},
           {"rate_limit:\n  interval: fast\n", "web.yml:2:13: rate_limit.interval"},
           {"tls_server_config: [\n", "web.yml:"},
       }) {
    auto c = web::ParseWebConfig(text, "web.yml", "/");
    ASSERT_FALSE(c.ok()) << text;
    const std::string message(c.status().message());
    EXPECT_NE(message.find(want), std::string::npos) << message;
    EXPECT_EQ(message.find("plain-text-password"), std::string::npos) << message;
  }
  // A missing file is named.
  auto missing = web::LoadWebConfig("/no/such/web.yml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("/no/such/web.yml"), std::string::npos);
}

TEST(WebConfigTest, BasicAuthChecksBcryptHashes) {
  EXPECT_TRUE(web::BcryptMatches(kHash, kPassword));
  EXPECT_FALSE(web::BcryptMatches(kHash, "scrape-you"));
  EXPECT_FALSE(web::BcryptMatches(kHash, std::string("scrape-me\0x", 11)));
  EXPECT_FALSE(web::BcryptMatches("not-a-hash", kPassword));
  web::WebConfig c;
  c.users["prometheus"] = kHash;
  web::Gate gate(c);
  // "Basic " + base64("prometheus:scrape-me"); the scheme is case-insensitive.
  EXPECT_EQ(gate.Admit("Basic cHJvbWV0aGV1czpzY3JhcGUtbWU=").status, 200);
  EXPECT_EQ(gate.Admit("basic cHJvbWV0aGV1czpzY3JhcGUtbWU=").status, 200);
  const web::Verdict none = gate.Admit("");
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(none.headers, (std::vector<std::pair<std::string, std::string>>{{"WWW-Authenticate", "Basic"}}));
  EXPECT_EQ(gate.Admit("Basic cHJvbWV0aGV1czp3cm9uZw==").status, 401);  // prometheus:wrong
  EXPECT_EQ(gate.Admit("Basic YWxpY2U6c2NyYXBlLW1l").status, 401);      // alice:scrape-me (no such user)
  EXPECT_EQ(gate.Admit("Basic !!!").status, 401);
  EXPECT_EQ(gate.Admit("Bearer cHJvbWV0aGV1czpzY3JhcGUtbWU=").status, 401);
}

TEST(WebConfigTest, RateLimitAnswers429BeyondTheBurst) {
  web::WebConfig c;
  c.rate_interval = std::chrono::hours(1);
  c.rate_burst = 2;
  web::Gate gate(c);
  EXPECT_EQ(gate.Admit("").status, 200);
  EXPECT_EQ(gate.Admit("").status, 200);
  EXPECT_EQ(gate.Admit("").status, 429);
}

// Writes a CA, a server certificate for 127.0.0.1 and a client certificate it signed (openssl).
bool MakeCertificates(const std::string& dir) {
  const std::string cmd =
      Cat("cd ", dir,
          " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n' > server.ext"
          " && printf 'extendedKeyUsage=clientAuth\\n' > client.ext"
          " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2"
          " -subj /CN=kgpu-test-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign"
          " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr"
          " -subj /CN=localhost"
          " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2"
          " -extfile server.ext"
          " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout client.key -out client.csr"
          " -subj /CN=prometheus"
          " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2"
          " -extfile client.ext) >/dev/null 2>&1");
  return std::system(("(" + cmd).c_str()) == 0;
}

TEST(WebConfigTest, ServesHttpsWithBasicAuthOnEveryPath) {
  TempDir dir;
  if (!MakeCertificates(dir.path)) GTEST_SKIP() << "openssl is not installed";
  const std::string config = dir.Write("web.yml", Cat("tls_server_config:\n"
                                                      "  cert_file: server.pem\n"
                                                      "  key_file: server.key\n"
                                                      "http_server_config:\n"
                                                      "  headers: {X-Content-Type-Options: nosniff}\n"
                                                      "basic_auth_users:\n"
                                                      "  prometheus: ",
                                                      kHash, "\n"));
  auto web = web::LoadWebConfig(config);
  ASSERT_TRUE(web.ok()) << web.status();
  Fixture f("l4x4");
  f.options.address = "127.0.0.1:0";
  f.options.interval = std::chrono::hours(1);
  f.options.web = *web;
  exporter::Exporter exp(*f.lib, f.inv, f.options);
  ASSERT_TRUE(exp.Start().ok());
  httplib::SSLClient client("127.0.0.1", exp.port());
  client.set_ca_cert_path((dir.path + "/ca.pem").c_str());
  client.enable_server_certificate_verification(true);
  auto anonymous = client.Get("/metrics");
  ASSERT_TRUE(anonymous) << httplib::to_string(anonymous.error());
  EXPECT_EQ(anonymous->status, 401);
  EXPECT_EQ(anonymous->get_header_value("WWW-Authenticate"), "Basic");
  EXPECT_EQ(anonymous->get_header_value("X-Content-Type-Options"), "nosniff");
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 401);  // basic auth covers every path, as exporter-toolkit's
  client.set_basic_auth("prometheus", "wrong");
  auto wrong = client.Get("/metrics");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  client.set_basic_auth("prometheus", kPassword);
  auto ok = client.Get("/metrics");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_NE(ok->body.find("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\""), std::string::npos);
  auto health_ok = client.Get("/health");
  ASSERT_TRUE(health_ok);
  EXPECT_EQ(health_ok->status, 200);
  // Plain HTTP to the HTTPS port gets nothing served.
  httplib::Client plain("127.0.0.1", exp.port());
  plain.set_basic_auth("prometheus", kPassword);
  auto cleartext = plain.Get("/metrics");
  EXPECT_TRUE(!cleartext || cleartext->status != 200);
  exp.Stop();
}

TEST(WebConfigTest, RequireAndVerifyClientCertRefusesClientsWithoutOne) {
  TempDir dir;
  if (!MakeCertificates(dir.path)) GTEST_SKIP() << "openssl is not installed";
  for (const char* policy : {"RequireAndVerifyClientCert", "RequireAnyClientCert"}) {
    const std::string config = dir.Write("web.yml", Cat("tls_server_config:\n"
                                                        "  cert_file: server.pem\n"
                                                        "  key_file: server.key\n"
                                                        "  client_auth_type: ",
                                                        policy,
                                                        "\n"
                                                        "  client_ca_file: ca.pem\n"
                                                        "  min_version: TLS12\n"
                                                        "  curve_preferences: [CurveP256, X25519]\n"));
    auto web = web::LoadWebConfig(config);
    ASSERT_TRUE(web.ok()) << web.status();
    Fixture f("l4x4");
    f.options.address = "127.0.0.1:0";
    f.options.interval = std::chrono::hours(1);
    f.options.web = *web;
    exporter::Exporter exp(*f.lib, f.inv, f.options);
    ASSERT_TRUE(exp.Start().ok()) << policy;
    httplib::SSLClient without("127.0.0.1", exp.port());
    without.set_ca_cert_path((dir.path + "/ca.pem").c_str());
    auto refused = without.Get("/health");
    EXPECT_TRUE(!refused || refused->status != 200) << policy;
    httplib::SSLClient with("127.0.0.1", exp.port(), dir.path + "/client.pem", dir.path + "/client.key");
    with.set_ca_cert_path((dir.path + "/ca.pem").c_str());
    auto served = with.Get("/health");
    ASSERT_TRUE(served) << policy << ": " << httplib::to_string(served.error());
    EXPECT_EQ(served->status, 200) << policy;
    exp.Stop();
  }
}

TEST(WebConfigTest, UnloadableCertificateIsAnErrorNamingTheFile) {
  TempDir dir;
  dir.Write("server.pem", "not a certificate\n");
  dir.Write("server.key", "not a key\n");
  const std::string config =
      dir.Write("web.yml", "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n");
  auto web = web::LoadWebConfig(config);
  ASSERT_TRUE(web.ok()) << web.status();
  Fixture f("l4x4");
  f.options.address = "127.0.0.1:0";
  f.options.interval = std::chrono::hours(1);
  f.options.web = *web;
  exporter::Exporter exp(*f.lib, f.inv, f.options);
  const absl::Status st = exp.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_FALSE(absl::IsInvalidArgument(st)) << st;  // bad input (exit 1), not a usage error
  EXPECT_NE(std::string(st.message()).find(dir.path + "/server.pem"), std::string::npos) << st;
  exp.Stop();
}

TEST(ExporterFlagsTest, HealthRequireGpusAnswers503WithoutAGpu) {
  Fixture f("l4x4");
  f.options.address = "127.0.0.1:0";
  f.options.interval = std::chrono::hours(1);
  f.options.health_require_gpus = true;
  auto health_of = [&](std::shared_ptr<const gpu::Inventory> inventory) {
    exporter::Exporter exp(*f.lib, std::move(inventory), f.options);
    EXPECT_TRUE(exp.Start().ok());
    httplib::Client client("127.0.0.1", exp.port());
    auto r = client.Get("/health");
    const int status = r ? r->status : -1;
    exp.Stop();
    return status;
  };
  EXPECT_EQ(health_of(f.inv), 200);
  // A node whose GPUs the exporter cannot see: a liveness probe on /health restarts it.
  EXPECT_EQ(health_of(gpu::Inventory::FromPartsForTest({}, {})), 503);
}

// --log-format json: one JSON object per line, with slog's level names and the message escaped.
TEST(ExporterFlagsTest, LogFormatJsonWritesOneObjectPerLine) {
  ASSERT_TRUE(SetLogLevel("info"));  // whatever KGPU_LOG_LEVEL the run has
  ASSERT_TRUE(SetLogFormat("json"));
  ::testing::internal::CaptureStderr();
  Log("exporter")->warn("a \"quoted\" message\\with\ttab");
  const std::string out = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(SetLogFormat("text"));
  EXPECT_EQ(out.rfind("{\"time\":\"", 0), 0u) << out;
  EXPECT_NE(out.find(R"("level":"WARN","logger":"exporter","msg":"a \"quoted\" message\\with\u0009tab"})"),
            std::string::npos)
      << out;
  EXPECT_FALSE(SetLogFormat("yaml"));
}

}  // namespace
}  // namespace kgpu::cli

// ---------------------------------------------------------------- review fixes: flags, jobs, web config

#include <array>
#include <atomic>
#include <set>

namespace kgpu::cli {
namespace {

// Go's -x=value for one-letter flags (urfave/cli reads it as the flag and its value) and the
// search for the subcommand, which stops at the first positional argument that is not one.
TEST(ExporterFlagsTest, GoStyleOneLetterFlagsWithEqualsAndTheSubcommandSearch) {
  CLI::App app{"kgpu"};
  std::string log_level, node_name;
  app.add_option("--log-level", log_level, "kgpu's own option, with a value");
  ExporterFlags f;
  AddExporterFlags(app.add_subcommand("exporter", ""), &f);
  app.add_subcommand("node", "");  // no flags: a command line read with its table is left as it is
  app.add_subcommand("doctor", "")->add_option("--node-name", node_name, "");
  const char* eq[] = {"kgpu", "exporter", "-f=/x.csv", "-k=true", "-c=500", "-o=false", "-x=60000", "-k"};
  EXPECT_EQ(GoStyleFlags(app, static_cast<int>(std::size(eq)), eq),
            (std::vector<std::string>{"kgpu", "exporter", "--collectors=/x.csv", "--kubernetes=true",
                                      "--collect-interval=500", "--use-old-namespace=false",
                                      "--xid-count-window-size=60000", "-k"}));
  // A value spelled `node` of kgpu's own option is no subcommand: the exporter's table applies.
  const char* value_node[] = {"kgpu", "--log-level", "node", "exporter", "-collectors", "x.csv"};
  EXPECT_EQ(GoStyleFlags(app, static_cast<int>(std::size(value_node)), value_node),
            (std::vector<std::string>{"kgpu", "--log-level", "node", "exporter", "--collectors", "x.csv"}));
  // Another command first: nothing is rewritten, though an option value there is spelled `exporter`.
  const char* other[] = {"kgpu", "doctor", "--node-name", "exporter", "-collectors", "x.csv"};
  EXPECT_EQ(GoStyleFlags(app, static_cast<int>(std::size(other)), other),
            (std::vector<std::string>(std::begin(other), std::end(other))));
  // Parsed, the values land where Go puts them.
  ExporterFlags parsed;
  ASSERT_EQ(Parse({"exporter", "-f=/x.csv", "-k=true", "-c=500", "-o=false", "-x=60000"}, &parsed), "");
  EXPECT_EQ(parsed.collectors, "/x.csv");
  EXPECT_TRUE(parsed.kubernetes);
  EXPECT_EQ(parsed.interval_ms, 500u);
  EXPECT_FALSE(parsed.use_old_namespace);
  EXPECT_EQ(parsed.xid_window_ms, 60000u);
  ExporterFlags off;
  ASSERT_EQ(Parse({"exporter", "-k=false", "-o=true"}, &off), "");
  EXPECT_FALSE(off.kubernetes);
  EXPECT_TRUE(off.use_old_namespace);
}

// metrics.fields becomes counters CSV rows: a help text with line ends, quotes and commas comes
// through as written; a name or type that would change the row is refused.
TEST(ExporterFlagsTest, ConfigFileFieldsBecomeCsvRowsWhateverTheirHelpHolds) {
  TempDir dir;
  ExporterFlags f;
  f.config_file = dir.Write("c.yaml", R"(version: 1
metrics:
  fields:
    - {name: DCGM_FI_DEV_GPU_TEMP, prometheusType: gauge, help: "two\nlines, and \"quotes\""}
    - {name: DCGM_FI_DEV_POWER_USAGE, prometheusType: gauge, help: "a\rb"}
    - {name: DCGM_FI_DEV_SM_CLOCK, prometheusType: gauge, help: "  blanks first, a # inside"}
)");
  auto o = ResolveExporterOptions(f);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->counters.size(), 3u);
  EXPECT_EQ(o->counters[0].name, "DCGM_FI_DEV_GPU_TEMP");
  EXPECT_EQ(o->counters[0].help, "two\nlines, and \"quotes\"");
  EXPECT_EQ(o->counters[1].name, "DCGM_FI_DEV_POWER_USAGE");
  EXPECT_EQ(o->counters[1].help, "a\rb");
  EXPECT_EQ(o->counters[2].name, "DCGM_FI_DEV_SM_CLOCK");
  EXPECT_EQ(o->counters[2].help, "blanks first, a # inside");  // trimmed as dcgm-exporter trims
  for (const auto& [field, want] : std::vector<std::pair<std::string, std::string>>{
           {R"(name: "#DCGM_FI_DEV_GPU_TEMP", prometheusType: gauge)", "a leading '#' is not allowed"},
           {R"(name: "DCGM_FI_DEV_GPU_TEMP\x01", prometheusType: gauge)", "a control character is not allowed"},
           {R"(name: DCGM_FI_DEV_GPU_TEMP, prometheusType: "gauge\nx")", "prometheusType"},
       }) {
    ExporterFlags bad;
    bad.config_file = dir.Write("bad.yaml", Cat("version: 1\nmetrics:\n  fields:\n    - {", field, ", help: h}\n"));
    auto r = ResolveExporterOptions(bad);
    ASSERT_FALSE(r.ok()) << field;
    const std::string message(r.status().message());
    EXPECT_NE(message.find("bad.yaml:4:"), std::string::npos) << message;
    EXPECT_NE(message.find(want), std::string::npos) << message;
  }
}

// --hpc-job-mapping-dir: lines trimmed, a job listed twice once, at most kMaxJobsPerDevice jobs;
// the series come once per distinct job and no line twice.
TEST(ExporterFlagsTest, HpcJobsAreTrimmedDeduplicatedAndCapped) {
  TempDir jobs;
  jobs.Write("0", " slurm-1 \nslurm-2\n\tslurm-1\r\nslurm-2\n\n   \n");
  std::string many;
  for (int i = 0; i < 100; ++i) many += Cat("job-", i, "\n");
  jobs.Write("1", many);
  exporter::HpcJobs h(jobs.path);
  h.Refresh();
  EXPECT_EQ(h.Jobs(0, std::nullopt), (std::vector<std::string>{"slurm-1", "slurm-2"}));
  const auto capped = h.Jobs(1, std::nullopt);
  ASSERT_EQ(capped.size(), exporter::HpcJobs::kMaxJobsPerDevice);
  EXPECT_EQ(capped.front(), "job-0");
  EXPECT_EQ(capped.back(), Cat("job-", exporter::HpcJobs::kMaxJobsPerDevice - 1));
  Fixture f("l4x4");
  f.options.hpc_jobs = std::make_shared<exporter::HpcJobs>(jobs.path);
  const std::string text = f.Collect();
  EXPECT_EQ(Family(text, "kgpu_gpu_up").size(), 2u + exporter::HpcJobs::kMaxJobsPerDevice + 2u);
  std::set<std::string> seen;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') {
      EXPECT_TRUE(seen.insert(line.substr(0, line.rfind(' '))).second) << line;
    }
  }
}

// "Basic " and the base64 of "<user>:<password>".
std::string Basic(const std::string& user, const std::string& password) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const std::string in = user + ":" + password;
  std::string out = "Basic ";
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t n = static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << 16;
    if (i + 1 < in.size()) n |= static_cast<uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8;
    if (i + 2 < in.size()) n |= static_cast<unsigned char>(in[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < in.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

// Only successes are cached, so wrong passwords cannot push the valid entry out; a full cache
// drops one entry, not all.
TEST(WebConfigTest, BasicAuthCachesSuccessesOnlyAndEvictsOneEntry) {
  EXPECT_EQ(Basic("prometheus", kPassword), "Basic cHJvbWV0aGV1czpzY3JhcGUtbWU=");
  web::WebConfig c;
  c.users["prometheus"] = kHash;
  web::Gate gate(c);
  ASSERT_EQ(gate.Admit(Basic("prometheus", kPassword)).status, 200);
  EXPECT_EQ(gate.cached(), 1u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(gate.Admit(Basic("prometheus", Cat("wrong-", i))).status, 401);
  EXPECT_EQ(gate.cached(), 1u);  // no failure cached: the valid entry is still there
  EXPECT_EQ(gate.Admit(Basic("prometheus", kPassword)).status, 200);
  EXPECT_EQ(gate.cached(), 1u);
  web::WebConfig many;
  for (size_t i = 0; i <= web::Gate::kCacheSize; ++i) many.users[Cat("user", i)] = kHash;
  web::Gate full(many);
  for (size_t i = 0; i <= web::Gate::kCacheSize; ++i) {
    ASSERT_EQ(full.Admit(Basic(Cat("user", i), kPassword)).status, 200) << i;
  }
  EXPECT_EQ(full.cached(), web::Gate::kCacheSize);
  EXPECT_EQ(full.Admit(Basic("user0", kPassword)).status, 200);  // evicted or not, still admitted
}

// One bcrypt at a time: a request that needs a second one meanwhile is answered 429 at once.
TEST(WebConfigTest, ASecondPasswordCheckMeanwhileIsAnswered429) {
  web::WebConfig c;
  c.users["prometheus"] = kHash;
  web::Gate gate(c);
  std::atomic<bool> busy{false};
  auto hammer = [&](int who) {
    // An unknown user is checked against the cost-10 hash (tens of ms) and never cached.
    for (int i = 0; i < 40 && !busy.load(); ++i) {
      const web::Verdict v = gate.Admit(Basic(Cat("nobody-", who), Cat("pw-", i)));
      if (v.status == 429) {
        EXPECT_EQ(v.headers, (std::vector<std::pair<std::string, std::string>>{{"Retry-After", "1"}}));
        busy = true;
      } else {
        EXPECT_EQ(v.status, 401);
      }
    }
  };
  std::thread a(hammer, 0), b(hammer, 1);
  a.join();
  b.join();
  EXPECT_TRUE(busy.load());
  EXPECT_EQ(gate.cached(), 0u);
}

std::string Hex(const std::array<unsigned char, 32>& digest) {
  std::string out;
  for (unsigned char byte : digest) {
    out += "0123456789abcdef"[byte >> 4];
    out += "0123456789abcdef"[byte & 15];
  }
  return out;
}

// The cache's hash: FIPS 180-4's and RFC 4231's test vectors.
TEST(WebConfigTest, Sha256AndHmacMatchTheirTestVectors) {
  EXPECT_EQ(Hex(web::Sha256("").value()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(web::Sha256("abc").value()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(web::Sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").value()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex(web::Sha256(std::string(1000, 'a')).value()),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
  EXPECT_EQ(Hex(web::HmacSha256("Jefe", "what do ya want for nothing?").value()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(
      Hex(web::HmacSha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First").value()),
      "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

}  // namespace
}  // namespace kgpu::cli
