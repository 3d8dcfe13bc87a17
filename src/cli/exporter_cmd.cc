#include "cli/exporter_cmd.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include <signal.h>
#include <unistd.h>

#include "cli/flags.h"
#include "common/csv.h"
#include "common/duration.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/yaml_util.h"
#include "deviceplugin/kubelet_dir.h"
#include "deviceplugin/server.h"
#include "exporter/device_selector.h"
#include "gpu/inventory.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "k8s/informer.h"
#include "nvml/library.h"

namespace kgpu::cli {
namespace {

std::string Hostname() {
  const char* node = std::getenv("NODE_NAME");  // NOLINT(concurrency-mt-unsafe): start-up only
  if (node != nullptr && *node != '\0') return node;
  char host[256] = {};
  return gethostname(host, sizeof host - 1) == 0 ? host : "";
}

int WaitForStop() {
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGHUP, SIGTERM, SIGINT, SIGQUIT}) sigaddset(&signals, s);
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) == 0 && sig != SIGHUP) return sig;
  }
}

// A CLI11 check from one of our parsers: "" when it accepts the value, else its message (CLI11
// names the flag before it).
std::string DurationError(const std::string& value) {
  auto d = ParseGoDuration("", value);
  return d.ok() ? std::string() : std::string(d.status().message());
}

// The counters files of dcgm-exporter's image: the Helm chart passes -f with the first, the GPU
// Operator sets DCGM_EXPORTER_COLLECTORS to the second. kgpu's image does not have them; when
// such a path does not exist the built-in default counters (dcgm-exporter's default-counters.csv
// and the ECC and XID rows) stand in, so those manifests run unchanged. A file mounted there (the
// GPU Operator's custom metrics ConfigMap) is read as it is.
bool IsDcgmExporterImageCsv(const std::string& path) {
  static const std::set<std::string> paths = {"/etc/dcgm-exporter/default-counters.csv",
                                              "/etc/dcgm-exporter/dcp-metrics-included.csv",
                                              "/etc/dcgm-exporter/1.x-compatibility-metrics.csv"};
  return paths.count(path) > 0;
}

// "<namespace>:<name>" of -m: DNS names, so that they can go into the API path as they are.
bool IsDnsName(std::string_view s) {
  return !s.empty() && s.size() <= 253 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
  });
}

std::string ConfigMapError(const std::string& value) {
  if (value.empty() || value == "none") return "";
  const size_t colon = value.find(':');
  if (colon == std::string::npos || value.find(':', colon + 1) != std::string::npos ||
      !IsDnsName(value.substr(0, colon)) || !IsDnsName(value.substr(colon + 1))) {
    return Cat("'", value, "' is not <namespace>:<name> of a ConfigMap (e.g. gpu-operator:custom-metrics), or none");
  }
  return "";
}

// --kubernetes-pod-label-allowlist-regex, compiled (ECMAScript: std::regex; RE2's (?i) flags are
// not available and are refused as a malformed pattern).
absl::StatusOr<std::vector<std::regex>> CompileAllowlist(const std::vector<std::string>& patterns) {
  std::vector<std::regex> out;
  for (const std::string& p : patterns) {
    try {
      out.emplace_back(p, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          Cat("--kubernetes-pod-label-allowlist-regex (DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX) '", p,
              "': not a regular expression: ", e.what()));
    }
  }
  return out;
}

absl::StatusOr<std::chrono::milliseconds> Milliseconds(std::string_view flag, const std::string& value) {
  auto d = ParseGoDuration(flag, value);
  if (!d.ok()) return d.status();
  return std::chrono::duration_cast<std::chrono::milliseconds>(*d);
}

// dcgm-exporter's YAML configuration file (--config-file, 4.6+, internal/pkg/appconfig/
// yaml_config.go): `version: 1`, `metrics` with exactly one of `file` (a counters CSV) or `fields`
// ([{name, prometheusType, help}]), and `collection` with `interval` (a duration) and
// `watchGroups` (per-group DCGM watch intervals). Explicit -f, -m and -c win over it.
struct ExporterConfigFile {
  std::string metrics_file;
  std::string fields_csv;  // metrics.fields, as counters CSV text
  std::optional<std::chrono::milliseconds> interval;
  bool watch_groups = false;
};

absl::StatusOr<ExporterConfigFile> LoadExporterConfigFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(Cat("--config-file ", path, ": is a directory"));
  }
  std::ifstream in(path);
  if (!in) return absl::FailedPreconditionError(Cat("--config-file ", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  auto doc = yaml::Load(text.str(), path);
  if (!doc.ok()) return doc.status();
  const YAML::Node& d = *doc;
  if (auto st = yaml::CheckKeys(path, d, "the config file", {"version", "metrics", "collection"}); !st.ok()) return st;
  if (!d["version"]) return yaml::At(path, d.Mark(), "version must be 1 (the only version dcgm-exporter defines)");
  auto version = yaml::Scalar<int>(path, d["version"], "version");
  if (!version.ok()) return version.status();
  if (*version != 1) return yaml::At(path, d["version"].Mark(), "version must be 1");
  ExporterConfigFile c;
  if (const YAML::Node m = d["metrics"]; m && !m.IsNull()) {
    if (auto st = yaml::CheckKeys(path, m, "metrics", {"file", "fields"}); !st.ok()) return st;
    if (m["file"] && !m["file"].IsNull()) {
      auto file = yaml::Scalar<std::string>(path, m["file"], "metrics.file");
      if (!file.ok()) return file.status();
      c.metrics_file = *file;
    }
    const YAML::Node fields = m["fields"];
    const bool has_fields = fields && !fields.IsNull() && fields.size() > 0;
    if (c.metrics_file.empty() == !has_fields) {
      return yaml::At(path, m.Mark(), "metrics must specify exactly one of file or fields");
    }
    if (has_fields) {
      if (!fields.IsSequence()) return yaml::At(path, fields.Mark(), "metrics.fields must be a list");
      std::set<std::string> names;
      for (size_t i = 0; i < fields.size(); ++i) {
        const YAML::Node f = fields[i];
        const std::string where = Cat("metrics.fields[", i, "]");
        if (auto st = yaml::CheckKeys(path, f, where, {"name", "prometheusType", "help"}); !st.ok()) return st;
        std::string values[3];
        const char* keys[3] = {"name", "prometheusType", "help"};
        for (int k = 0; k < 3; ++k) {
          if (!f[keys[k]] || f[keys[k]].IsNull()) {
            return yaml::At(path, f.Mark(), Cat(where, ".", keys[k], " is required"));
          }
          auto v = yaml::Scalar<std::string>(path, f[keys[k]], Cat(where, ".", keys[k]));
          if (!v.ok()) return v.status();
          values[k] = *v;
        }
        if (!names.insert(values[0]).second) {
          return yaml::At(path, f["name"].Mark(), Cat(where, ".name duplicates an earlier field '", values[0], "'"));
        }
        // The name and type are words of the counters CSV: a control character or a leading '#'
        // (a comment line there) would make the row say something else than the config.
        for (int k = 0; k < 2; ++k) {
          const bool control = std::any_of(values[k].begin(), values[k].end(), [](char ch) {
            return static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) == 0x7f;
          });
          if (control || (k == 0 && values[k].starts_with('#'))) {
            return yaml::At(path, f[keys[k]].Mark(),
                            Cat(where, ".", keys[k], " '", values[k],
                                "': ", control ? "a control character" : "a leading '#'", " is not allowed"));
          }
        }
        // One counters CSV row, written as the reader reads it back: a field quoted when it holds
        // the separator, a quote or a line end (a help text over several lines), or starts with a
        // blank, with no blank before the quote (Go's encoding/csv reads a quote after one as data).
        CsvOptions csv;
        csv.comment = '#';
        AppendCsvRecord(c.fields_csv, std::vector<std::string_view>{values[0], values[1], values[2]}, csv);
      }
    }
  }
  if (const YAML::Node col = d["collection"]; col && !col.IsNull()) {
    if (auto st = yaml::CheckKeys(path, col, "collection", {"interval", "watchGroups"}); !st.ok()) return st;
    if (col["interval"] && !col["interval"].IsNull()) {
      auto s = yaml::Scalar<std::string>(path, col["interval"], "collection.interval");
      if (!s.ok()) return s.status();
      auto d2 = ParseGoDuration("", *s);
      if (!d2.ok()) return yaml::At(path, col["interval"].Mark(), Cat("collection.interval: ", d2.status().message()));
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*d2);
      if (ms.count() < 100 || ms.count() > 3600000 || ms != *d2) {
        return yaml::At(path, col["interval"].Mark(),
                        "collection.interval must be whole milliseconds from 100ms to 1h (kgpu's -c range)");
      }
      c.interval = ms;
    }
    if (const YAML::Node groups = col["watchGroups"]; groups && !groups.IsNull()) {
      if (!groups.IsSequence()) return yaml::At(path, groups.Mark(), "collection.watchGroups must be a list");
      std::set<std::string> names;
      for (size_t i = 0; i < groups.size(); ++i) {
        const YAML::Node g = groups[i];
        const std::string where = Cat("collection.watchGroups[", i, "]");
        if (auto st = yaml::CheckKeys(path, g, where, {"name", "interval", "fields"}); !st.ok()) return st;
        auto name = g["name"] ? yaml::Scalar<std::string>(path, g["name"], Cat(where, ".name"))
                              : absl::StatusOr<std::string>(std::string());
        if (!name.ok()) return name.status();
        if (name->empty() || !names.insert(*name).second) {
          return yaml::At(path, g.Mark(), Cat(where, ".name is required and must be unique"));
        }
        auto interval = g["interval"] ? yaml::Scalar<std::string>(path, g["interval"], Cat(where, ".interval"))
                                      : absl::StatusOr<std::string>(std::string());
        if (!interval.ok()) return interval.status();
        if (auto d3 = ParseGoDuration(Cat(where, ".interval"), *interval); !d3.ok() || d3->count() <= 0) {
          return yaml::At(path, g.Mark(), Cat(where, ".interval must be a positive duration (e.g. 1s)"));
        }
        if (!g["fields"] || !g["fields"].IsSequence() || g["fields"].size() == 0) {
          return yaml::At(path, g.Mark(), Cat(where, ".fields must be a non-empty list"));
        }
      }
      c.watch_groups = groups.size() > 0;
    }
  }
  return c;
}

// -m <namespace>:<name>: the counters CSV in the ConfigMap's data.metrics, read once at start
// through the API server (dcgm-exporter: internal/pkg/counters/counter_config.go).
absl::StatusOr<std::vector<exporter::Counter>> CountersFromConfigMap(const ExporterFlags& f,
                                                                     std::vector<std::string>* skipped) {
  const size_t colon = f.configmap_data.find(':');
  const std::string ns = f.configmap_data.substr(0, colon), name = f.configmap_data.substr(colon + 1);
  const std::string what = Cat("-m/--configmap-data ", ns, ":", name);
  auto cfg = k8s::ConfigFromFlags(f.kubeconfig, f.kube_context, f.in_cluster);
  if (!cfg.ok()) return absl::FailedPreconditionError(Cat(what, ": ", cfg.status().message()));
  auto client = k8s::Client::Create(*cfg);
  if (!client.ok()) return absl::FailedPreconditionError(Cat(what, ": ", client.status().message()));
  auto cm = (*client)->Get(Cat("/api/v1/namespaces/", ns, "/configmaps/", name));
  if (!cm.ok()) {
    return absl::FailedPreconditionError(Cat(what, ": cannot read the ConfigMap: ", cm.status().message(),
                                             " (the exporter's ServiceAccount needs get on configmaps in ", ns, ")"));
  }
  const auto data = cm->find("data");
  if (data == cm->end() || !data->is_object() || !data->contains("metrics") || !(*data)["metrics"].is_string()) {
    return absl::FailedPreconditionError(
        Cat(what, ": the ConfigMap has no key 'metrics' (dcgm-exporter reads the counters CSV from data.metrics)"));
  }
  return exporter::ParseCounters((*data)["metrics"].get<std::string>(), Cat("configmap ", ns, "/", name), skipped);
}

// What a dcgm-exporter flag without a meaning in kgpu does not do, said once at start.
void LogCompatibilityNotes(const ExporterFlags& f) {
  auto log = Log("exporter");
  if (!f.remote_hostengine.empty()) {
    // The GPU Operator sets DCGM_REMOTE_HOSTENGINE_INFO when it runs a separate nv-hostengine:
    // refusing it would make kgpu fail where dcgm-exporter runs.
    log->warn(
        "-r/--remote-hostengine-info (DCGM_REMOTE_HOSTENGINE_INFO) {}: kgpu reads NVML directly and needs no DCGM "
        "host engine; it does not connect there (remove the setting once dcgm-exporter is replaced)",
        f.remote_hostengine);
  }
  if (f.dcgm_log) {
    log->info(
        "--enable-dcgm-log (level {}): kgpu has no DCGM, so there is no DCGM log; kgpu's own log: --log-level "
        "(KGPU_LOG_LEVEL) or --debug",
        f.dcgm_log_level);
  }
  if (f.dump_enabled) {
    log->warn("--dump-enabled: kgpu writes no debug dumps (--dump-* have no effect); use --debug and curl /metrics");
  }
  if (f.pprof) log->warn("--enable-pprof: kgpu is not a Go program and serves no /debug/pprof (profile it with perf)");
  if (f.bind_unbind_watch) {
    log->info(
        "--enable-gpu-bind-unbind-watch: kgpu follows MIG re-partitions and keeps a GPU that falls off the bus "
        "visible (kgpu_gpu_up 0), but a GPU bound to the driver after the start is exported after a restart");
  }
  if (f.watch_max_keep_age != "10m" || f.watch_max_keep_samples != 0) {
    log->info(
        "--watch-max-keep-age/--watch-max-keep-samples set DCGM's field-watch retention: kgpu keeps no sample "
        "history (it reads NVML at each collection), so they have no effect");
  }
  if (f.max_concurrent_scrapes != 16) {
    log->info(
        "--max-concurrent-scrapes {}: kgpu answers every scrape from the page its last collection encoded "
        "(no NVML call per scrape), so it needs no limit; the value has no effect",
        f.max_concurrent_scrapes);
  }
  if (f.exporter_metrics) {
    log->info(
        "--enable-exporter-metrics: the exporter's own kgpu_exporter_* series are always served; kgpu has no "
        "Go runtime metrics");
  }
  if (f.disable_startup_validate) {
    log->info(
        "--disable-startup-validate: kgpu's start-up checks (NVML opens, the counters are valid) are what it "
        "needs to run and stay on");
  }
  if (!f.nvidia_resource_names.empty()) {
    log->info(
        "--nvidia-resource-names {}: kgpu attributes a device to the pods holding its ID whatever the resource "
        "name (nvidia.com/gpu, nvidia.com/mig-*, renamed and shared resources, kgpu.io/gpu), so these need no "
        "listing",
        Join(f.nvidia_resource_names, ","));
  }
  if (!f.container_runtime_socket.empty()) {
    log->info("--container-runtime-socket is read only by --container-labels, which kgpu does not offer");
  }
  if (!f.kubernetes) {
    for (auto [on, flag] : {std::pair{f.pod_labels, "--kubernetes-enable-pod-labels"},
                            std::pair{f.pod_uid, "--kubernetes-enable-pod-uid"},
                            std::pair{f.virtual_gpus, "--kubernetes-virtual-gpus"}}) {
      if (on) log->warn("{} has no effect without -k/--kubernetes (as in dcgm-exporter)", flag);
    }
  }
}

// Applies --log-format and --debug (before anything else logs).
void ApplyLogging(const ExporterFlags& f) {
  SetLogFormat(f.log_format);
  if (f.debug && Log("exporter")->level() > spdlog::level::debug) SetLogLevel("debug");
}

// A GPU -d names by index must be on the node (dcgm-exporter: "devices with matching IDs must
// exist"); GPU instances may come with a later MIG layout, so only a warning for those.
absl::Status CheckSelectedDevices(const exporter::DeviceSelector& s, const gpu::Inventory& inventory) {
  std::set<unsigned> gpus, gis;
  for (const auto& g : inventory.gpus()) {
    gpus.insert(g.index);
    for (const auto& m : g.migs) gis.insert(m.gi);
  }
  for (unsigned id : s.gpu_ids) {
    if (gpus.count(id) == 0) {
      return absl::FailedPreconditionError(Cat("-d/--devices names GPU ", id, ", but this node has GPU(s) ",
                                               Join(gpus, ","), " (kgpu devices lists them)"));
    }
  }
  for (unsigned id : s.instance_ids) {
    if (gis.count(id) == 0) {
      Log("exporter")
          ->warn(
              "-d/--devices names GPU instance {}, which no MIG GPU has now (its series appear when it "
              "exists)",
              id);
    }
  }
  if (s.instances && gis.empty()) {
    Log("exporter")->warn("-d/--devices selects GPU instances, but no GPU is in MIG mode now");
  }
  return absl::OkStatus();
}

// Everything an exporter run holds besides the Exporter: what its options point into.
struct ExporterExtras {
  std::unique_ptr<PodMetadataSource> pods;
};

// Checks the flags (exit 2), resolves the options (exit 1) and starts what they need (the pod
// informer, exit 1); *exit_code says which failed.
absl::StatusOr<exporter::ExporterOptions> Prepare(const ExporterFlags& flags, ExporterExtras& x, int* exit_code) {
  if (auto st = CheckExporterFlags(flags); !st.ok()) {
    *exit_code = 2;
    return st;
  }
  ApplyLogging(flags);
  auto options = ResolveExporterOptions(flags);
  if (!options.ok()) {
    *exit_code = 1;
    return options.status();
  }
  if (flags.kubernetes && flags.pod_labels) {
    auto pods = PodMetadataSource::Start(flags);
    if (!pods.ok()) {
      *exit_code = 1;
      return pods.status();
    }
    x.pods = std::move(*pods);
    options->pod_metadata = x.pods->Reader();
  }
  return options;
}

}  // namespace

absl::StatusOr<exporter::DeviceSelector> ParseDeviceSelector(std::string_view flag, std::string_view value) {
  // The grammar lives with the exporter (exporter/device_selector.h), so that its fuzz target links
  // kgpu_exporter and not every command.
  return exporter::ParseDeviceSelector(flag, value);
}

PodMetadataSource::PodMetadataSource() = default;

PodMetadataSource::~PodMetadataSource() {
  if (informer_) informer_->Stop();
}

absl::StatusOr<std::unique_ptr<PodMetadataSource>> PodMetadataSource::Start(const ExporterFlags& f) {
  const std::string node = f.node_name.empty() ? Hostname() : f.node_name;
  if (node.empty()) {
    return absl::FailedPreconditionError(
        "--kubernetes-enable-pod-labels needs this node's name: set NODE_NAME (fieldRef spec.nodeName)");
  }
  auto allow = CompileAllowlist(f.pod_label_allowlist);
  if (!allow.ok()) return allow.status();
  auto cfg = k8s::ConfigFromFlags(f.kubeconfig, f.kube_context, f.in_cluster);
  if (!cfg.ok()) return absl::FailedPreconditionError(Cat("--kubernetes-enable-pod-labels: ", cfg.status().message()));
  auto client = k8s::Client::Create(*cfg);
  if (!client.ok()) {
    return absl::FailedPreconditionError(Cat("--kubernetes-enable-pod-labels: ", client.status().message()));
  }
  std::unique_ptr<PodMetadataSource> s(new PodMetadataSource());
  s->allow_ = std::move(*allow);
  s->client_ = std::move(*client);
  k8s::InformerOptions io;
  io.path = "/api/v1/pods";
  io.field_selector = Cat("spec.nodeName=", node);
  s->informer_ = std::make_unique<k8s::Informer>(*s->client_, io);
  PodMetadataSource* self = s.get();
  k8s::Handlers h;
  h.on_add = [self](const nlohmann::json& pod) { self->Put(pod); };
  h.on_update = [self](const nlohmann::json&, const nlohmann::json& pod) { self->Put(pod); };
  h.on_delete = [self](const nlohmann::json& pod) { self->Remove(pod); };
  s->informer_->AddHandler(std::move(h));
  s->informer_->Start();
  if (!s->informer_->WaitForSync(std::chrono::seconds(10))) {
    Log("exporter")
        ->warn(
            "--kubernetes-enable-pod-labels: the pods of node {} are not listed yet (the informer retries); their "
            "labels appear once they are (the ServiceAccount needs list and watch on pods)",
            node);
  }
  return s;
}

exporter::PodMetadataReader PodMetadataSource::Reader() {
  return [this](const std::string& ns, const std::string& name) -> std::optional<exporter::PodMetadata> {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = pods_.find({ns, name});
    if (it == pods_.end()) return std::nullopt;
    return it->second;
  };
}

void PodMetadataSource::Put(const nlohmann::json& pod) {
  const nlohmann::json meta = pod.value("metadata", nlohmann::json::object());
  exporter::PodMetadata m;
  m.uid = meta.value("uid", "");
  std::map<std::string, std::string> labels;
  if (const auto l = meta.find("labels"); l != meta.end() && l->is_object()) {
    for (const auto& [k, v] : l->items()) {
      if (v.is_string()) labels[k] = v.get<std::string>();
    }
  }
  m.labels = exporter::PodMetricLabels(labels, allow_);
  std::lock_guard<std::mutex> lock(mu_);
  pods_[{meta.value("namespace", ""), meta.value("name", "")}] = std::move(m);
}

void PodMetadataSource::Remove(const nlohmann::json& pod) {
  const nlohmann::json meta = pod.value("metadata", nlohmann::json::object());
  std::lock_guard<std::mutex> lock(mu_);
  pods_.erase({meta.value("namespace", ""), meta.value("name", "")});
}

void AddExporterFlags(CLI::App* app, ExporterFlags* f) {
  // `kgpu node` has the device plugin's --config-file, --proc-root and --cdi-spec-dir already
  // (declared before these): the exporter's take other names there, or the plugin's serve both.
  const bool plugin_config = app->get_option_no_throw("--config-file") != nullptr;
  const bool plugin_proc_root = app->get_option_no_throw("--proc-root") != nullptr;
  const bool plugin_cdi_dir = app->get_option_no_throw("--cdi-spec-dir") != nullptr;
  auto selector_error = [](const std::string& v) {
    auto s = ParseDeviceSelector("", v);
    return s.ok() ? std::string() : std::string(s.status().message());
  };

  // dcgm-exporter's flags, in pkg/cmd/app.go's order.
  app->add_option_function<std::string>(
         "-f,--collectors",
         [f](const std::string& v) {
           f->collectors = v;
           f->collectors_given = true;
         },
         "counters CSV in dcgm-exporter's format (default: built in; dcgm-exporter's own paths under "
         "/etc/dcgm-exporter, when absent, mean the built-in default)")
      ->envname("DCGM_EXPORTER_COLLECTORS");
  app->add_option(plugin_config ? "--exporter-config-file" : "--config-file", f->config_file,
                  "dcgm-exporter's YAML config (version: 1; metrics.file or metrics.fields, collection.interval); "
                  "explicit -f, -m and -c win over it")
      ->envname("DCGM_EXPORTER_CONFIG_FILE");
  app->add_option("-a,--address", f->address, "listen address")->envname("DCGM_EXPORTER_LISTEN")->capture_default_str();
  app->add_option("--web-read-timeout", f->web_read_timeout, "longest time to read a request (a duration)")
      ->envname("DCGM_EXPORTER_WEB_READ_TIMEOUT")
      ->check(DurationError)
      ->capture_default_str();
  app->add_option("--web-write-timeout", f->web_write_timeout, "longest time to write a response (a duration)")
      ->envname("DCGM_EXPORTER_WEB_WRITE_TIMEOUT")
      ->check(DurationError)
      ->capture_default_str();
  app->add_option("--max-concurrent-scrapes", f->max_concurrent_scrapes,
                  "accepted for dcgm-exporter (kgpu serves scrapes from a pre-encoded page: no limit is needed)")
      ->envname("DCGM_EXPORTER_MAX_CONCURRENT_SCRAPES");
  app->add_flag("--enable-exporter-metrics", f->exporter_metrics,
                "accepted for dcgm-exporter (kgpu's own kgpu_exporter_* series are always on)")
      ->envname("DCGM_EXPORTER_ENABLE_EXPORTER_METRICS");
  app->add_option_function<unsigned>(
         "-c,--collect-interval",
         [f](const unsigned& v) {
           f->interval_ms = v;
           f->interval_given = true;
         },
         "collection interval, ms (default 30000)")
      ->envname("DCGM_EXPORTER_INTERVAL")
      ->check(CLI::Range(100U, 3600000U));
  app->add_option("--watch-max-keep-age", f->watch_max_keep_age,
                  "accepted for dcgm-exporter (DCGM's field-watch retention: no effect without DCGM)")
      ->envname("DCGM_EXPORTER_WATCH_MAX_KEEP_AGE")
      ->check(DurationError);
  app->add_option("--watch-max-keep-samples", f->watch_max_keep_samples,
                  "accepted for dcgm-exporter (DCGM's field-watch retention: no effect without DCGM)")
      ->envname("DCGM_EXPORTER_WATCH_MAX_KEEP_SAMPLES")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("-k,--kubernetes", f->kubernetes, "attribute devices to pods (PodResources)")
      ->envname("DCGM_EXPORTER_KUBERNETES");
  app->add_flag("-o,--use-old-namespace", f->use_old_namespace,
                "dcgm-exporter 1.x label names: uuid, container_name, pod_namespace, pod_name")
      ->envname("DCGM_EXPORTER_USE_OLD_NAMESPACE");
  app->add_option("-p,--cpu-devices", f->cpu_devices, "CPU selector: only f (kgpu exports no CPU entities)")
      ->envname("DCGM_EXPORTER_CPU_DEVICES_STR")
      ->check(selector_error);
  app->add_option("-m,--configmap-data", f->configmap_data,
                  "<namespace>:<name> of a ConfigMap whose data.metrics is the counters CSV (read through the API)")
      ->envname("DCGM_EXPORTER_CONFIGMAP_DATA")
      ->check(ConfigMapError);
  app->add_option("-r,--remote-hostengine-info", f->remote_hostengine,
                  "accepted for dcgm-exporter (kgpu reads NVML and needs no DCGM host engine: logged, not used)")
      ->envname("DCGM_REMOTE_HOSTENGINE_INFO");
  app->add_flag("--kubernetes-enable-pod-labels", f->pod_labels,
                "the pod's labels on its series, from a pod informer of this node (NODE_NAME)")
      ->envname("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS");
  app->add_flag("--kubernetes-enable-pod-uid", f->pod_uid, "pod_uid on pod series")
      ->envname("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID");
  app->add_option("--kubernetes-gpu-id-type", f->gpu_id_type, "uid or device-name")
      ->envname("DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE")
      ->check(CLI::IsMember({"uid", "device-name"}));
  app->add_option("--kubernetes-pod-label-allowlist-regex", f->pod_label_allowlist,
                  "only pod labels whose key matches one of these (comma-separated, ECMAScript) regular expressions")
      ->envname("DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX")
      ->delimiter(',');
  app->add_option("-d,--devices", f->devices,
                  "devices with series: f (every GPU, or its GPU instances on MIG GPUs), g[:0,1], i[:0,2-4], g+i")
      ->envname("DCGM_EXPORTER_DEVICES_STR")
      ->check(selector_error);
  app->add_flag("-n,--no-hostname", f->no_hostname, "omit the Hostname label")->envname("DCGM_EXPORTER_NO_HOSTNAME");
  app->add_flag("--health-require-gpus", f->health_require_gpus, "/health answers 503 when the node has no GPU")
      ->envname("DCGM_EXPORTER_HEALTH_REQUIRE_GPUS");
  app->add_option("-s,--switch-devices", f->switch_devices, "NVSwitch selector: only f (kgpu exports no NVSwitches)")
      ->envname("DCGM_EXPORTER_OTHER_DEVICES_STR")
      ->check(selector_error);
  app->add_flag("--fake-gpus", f->fake_gpus, "refused: use the simulated NVML (--nvml-library) instead")
      ->envname("DCGM_EXPORTER_USE_FAKE_GPUS");
  app->add_option("--web-config-file", f->web_config_file,
                  "Prometheus exporter-toolkit web config: TLS, client certificates, basic auth, headers, rate limit")
      ->envname("DCGM_EXPORTER_WEB_CONFIG_FILE");
  app->add_option("-x,--xid-count-window-size", f->xid_window_ms, "window of DCGM_EXP_XID_ERRORS_COUNT, ms")
      ->envname("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE")
      ->check(CLI::Range(1U, 86400000U))
      ->capture_default_str();
  // Go's -rbmn alias: GoStyleFlags() rewrites it to this name (CLI11 has no 4-letter short names).
  app->add_flag("--replace-blanks-in-model-name", f->replace_blanks, "modelName with '-' for blanks (also -rbmn)")
      ->envname("DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME");
  app->add_flag("--debug", f->debug, "debug log level (as --log-level debug)")->envname("DCGM_EXPORTER_DEBUG");
  app->add_option("--clock-events-count-window-size", f->clock_events_window_ms,
                  "window of DCGM_EXP_CLOCK_EVENTS_COUNT, ms")
      ->envname("DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE")
      ->check(CLI::Range(1U, 86400000U))
      ->capture_default_str();
  app->add_flag("--enable-dcgm-log", f->dcgm_log, "accepted for dcgm-exporter (no DCGM, no DCGM log: logged once)")
      ->envname("DCGM_EXPORTER_ENABLE_DCGM_LOG");
  app->add_option("--dcgm-log-level", f->dcgm_log_level, "accepted for dcgm-exporter (no DCGM log)")
      ->envname("DCGM_EXPORTER_DCGM_LOG_LEVEL")
      ->check(CLI::IsMember({"NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "VERB"}));
  app->add_option("--log-format", f->log_format, "text or json (one JSON object per line)")
      ->envname("DCGM_EXPORTER_LOG_FORMAT")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app->add_option("--pod-resources-kubelet-socket", f->pod_resources_socket, "kubelet PodResources socket")
      ->envname("DCGM_POD_RESOURCES_KUBELET_SOCKET")
      ->capture_default_str();
  app->add_option("--hpc-job-mapping-dir", f->hpc_job_mapping_dir,
                  "directory of files named by GPU index (or <gpu>.<GPU instance>), one HPC job ID per line: hpc_job")
      ->envname("DCGM_HPC_JOB_MAPPING_DIR");
  app->add_flag("--container-labels", f->container_labels, "refused: kgpu attributes GPUs to Kubernetes pods (-k)")
      ->envname("DCGM_EXPORTER_CONTAINER_LABELS");
  app->add_option("--container-runtime-socket", f->container_runtime_socket, "only for --container-labels (refused)")
      ->envname("DCGM_CONTAINER_RUNTIME_SOCKET");
  app->add_option("--nvidia-resource-names", f->nvidia_resource_names,
                  "accepted for dcgm-exporter (kgpu attributes by device ID whatever the resource name)")
      ->envname("NVIDIA_RESOURCE_NAMES")
      ->delimiter(',');
  app->add_flag("--kubernetes-virtual-gpus", f->virtual_gpus,
                "vgpu (the replica a pod holds) on the per-pod series of shared GPUs")
      ->envname("KUBERNETES_VIRTUAL_GPUS");
  app->add_flag("--dump-enabled", f->dump_enabled, "accepted for dcgm-exporter (kgpu writes no debug dumps: logged)")
      ->envname("DCGM_EXPORTER_DUMP_ENABLED");
  app->add_option("--dump-directory", f->dump_directory, "accepted for dcgm-exporter (see --dump-enabled)")
      ->envname("DCGM_EXPORTER_DUMP_DIRECTORY");
  app->add_option("--dump-retention", f->dump_retention, "accepted for dcgm-exporter (see --dump-enabled)")
      ->envname("DCGM_EXPORTER_DUMP_RETENTION")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--dump-compression", f->dump_compression, "accepted for dcgm-exporter (see --dump-enabled)")
      ->envname("DCGM_EXPORTER_DUMP_COMPRESSION");
  app->add_flag("--kubernetes-enable-dra", f->dra, "refused: DRA attribution comes with kgpu's DRA driver")
      ->envname("KUBERNETES_ENABLE_DRA");
  app->add_flag("--disable-startup-validate", f->disable_startup_validate,
                "accepted for dcgm-exporter (kgpu's start-up checks stay on: logged)")
      ->envname("DISABLE_STARTUP_VALIDATE");
  app->add_flag("--enable-gpu-bind-unbind-watch", f->bind_unbind_watch,
                "accepted for dcgm-exporter (a GPU bound after the start needs a restart: logged)")
      ->envname("DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH");
  app->add_option("--gpu-bind-unbind-poll-interval", f->bind_unbind_poll_interval,
                  "accepted for dcgm-exporter (see --enable-gpu-bind-unbind-watch)")
      ->envname("DCGM_EXPORTER_GPU_BIND_UNBIND_POLL_INTERVAL")
      ->check(DurationError);
  app->add_flag("--enable-pprof", f->pprof, "accepted for dcgm-exporter (no Go profiler in kgpu: logged)")
      ->envname("DCGM_EXPORTER_ENABLE_PPROF");
  app->add_flag("--web-systemd-socket", f->systemd_socket, "refused: kgpu listens on -a itself")
      ->envname("DCGM_EXPORTER_SYSTEMD_SOCKET");

  // kgpu's own.
  app->add_option("--hostname-label", f->hostname_label,
                  "name of the node label: Hostname (dcgm-exporter up to 4.5, dashboard 12239) or hostname (4.6+)")
      ->envname("KGPU_HOSTNAME_LABEL")
      ->check(CLI::IsMember({"Hostname", "hostname"}))
      ->capture_default_str();
  AddDurationOption(app, "--pod-resources-interval", &f->pod_resources_interval,
                    "how often pod attribution is refreshed (never per scrape; a bare number counts milliseconds)",
                    {.bare_unit = "ms", .min = std::chrono::milliseconds(100), .max = std::chrono::hours(1)})
      ->envname("KGPU_POD_RESOURCES_INTERVAL");
  // `kgpu node` has the device plugin's --proc-root already (the same host procfs): RunNode uses it.
  if (!plugin_proc_root) {
    app->add_option("--proc-root", f->proc_root, "procfs of the host (process cgroups, for per-pod figures)")
        ->envname("KGPU_PROC_ROOT");
  }
  app->add_option("--kubelet-checkpoint", f->checkpoint, "kubelet's device-manager checkpoint file")
      ->envname("KGPU_KUBELET_CHECKPOINT");
  // `kgpu node` has the device plugin's --cdi-spec-dir already (the specs it writes): RunNode uses it.
  if (!plugin_cdi_dir) {
    app->add_option("--cdi-spec-dir", f->cdi_spec_dir,
                    "the device plugin's CDI spec directory (the GPUs and limits of kgpu.io/gpu containers)")
        ->envname("KGPU_CDI_SPEC_DIR")
        ->capture_default_str();
  }
  // `kgpu node` takes health.recoverAfter from the plugin's config file: one setting, one place.
  if (!plugin_config) {
    app->add_option("--health-recover-after", f->health_recover_after,
                    "how long after its last fault (an XID, a lost GPU) a GPU is up again, as the device plugin's "
                    "health.recoverAfter: a duration (5m, 30s) or never")
        ->envname("KGPU_HEALTH_RECOVER_AFTER")
        ->check([](const std::string& v) { return v == "never" ? std::string() : DurationError(v); })
        ->capture_default_str();
  }
}

absl::Status CheckExporterFlags(const ExporterFlags& f) {
  auto refuse = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (f.fake_gpus) {
    return refuse(
        "--fake-gpus (DCGM_EXPORTER_USE_FAKE_GPUS): kgpu has no fake-GPU mode; to run without GPUs, point it at the "
        "simulated NVML: --nvml-library <build>/simnvml/libnvidia-ml.so.1 (KGPU_NVML_LIBRARY) with KGPU_SIM_NODE");
  }
  if (f.dra) {
    return refuse(
        "--kubernetes-enable-dra (KUBERNETES_ENABLE_DRA): kgpu attributes GPUs allocated through the device plugin "
        "API (PodResources devices); DRA claims are attributed once kgpu's DRA driver exists. Remove the flag");
  }
  if (f.systemd_socket) {
    return refuse(
        "--web-systemd-socket (DCGM_EXPORTER_SYSTEMD_SOCKET): kgpu listens on -a/--address itself and takes no "
        "systemd-activated socket; use -a");
  }
  if (f.container_labels) {
    return refuse(
        "--container-labels (DCGM_EXPORTER_CONTAINER_LABELS): kgpu reads no container runtime; it attributes GPU "
        "processes to Kubernetes pods: use -k/--kubernetes");
  }
  for (auto [flag, value, what] : {std::tuple{"-p/--cpu-devices (DCGM_EXPORTER_CPU_DEVICES_STR)", &f.cpu_devices,
                                              "CPU entities (DCGM's CPU module for Grace)"},
                                   std::tuple{"-s/--switch-devices (DCGM_EXPORTER_OTHER_DEVICES_STR)",
                                              &f.switch_devices, "NVSwitch entities (DCGM's NVSwitch module)"}}) {
    auto s = ParseDeviceSelector(flag, *value);
    if (!s.ok()) return s.status();
    if (!s->flex) {
      return refuse(Cat(flag, " '", *value, "': kgpu exports no ", what,
                        "; leave it at f (its default) or unset. GPUs are selected with -d"));
    }
  }
  if (auto s = ParseDeviceSelector("-d/--devices (DCGM_EXPORTER_DEVICES_STR)", f.devices); !s.ok()) return s.status();
  if (const std::string e = ConfigMapError(f.configmap_data); !e.empty()) {
    return refuse(Cat("-m/--configmap-data (DCGM_EXPORTER_CONFIGMAP_DATA) ", e));
  }
  if (auto a = CompileAllowlist(f.pod_label_allowlist); !a.ok()) return a.status();
  for (auto [flag, value] :
       {std::pair{"--web-read-timeout", &f.web_read_timeout}, std::pair{"--web-write-timeout", &f.web_write_timeout},
        std::pair{"--gpu-bind-unbind-poll-interval", &f.bind_unbind_poll_interval},
        std::pair{"--watch-max-keep-age", &f.watch_max_keep_age}}) {
    if (auto d = ParseGoDuration(flag, *value); !d.ok()) return d.status();
  }
  if (f.bind_unbind_watch) {
    if (auto d = ParseGoDuration("", f.bind_unbind_poll_interval); d.ok() && d->count() <= 0) {
      return refuse("--gpu-bind-unbind-poll-interval must be greater than 0 with --enable-gpu-bind-unbind-watch");
    }
  }
  static const std::set<std::string> dcgm_levels = {"NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "VERB"};
  if (dcgm_levels.count(f.dcgm_log_level) == 0) {
    return refuse(Cat("--dcgm-log-level '", f.dcgm_log_level, "': use ", Join(dcgm_levels, ", ")));
  }
  if (f.log_format != "text" && f.log_format != "json") {
    return refuse(Cat("--log-format '", f.log_format, "': use text or json"));
  }
  if (f.hostname_label != "Hostname" && f.hostname_label != "hostname") {
    return refuse(Cat("--hostname-label '", f.hostname_label, "': use Hostname or hostname"));
  }
  return absl::OkStatus();
}

absl::StatusOr<exporter::ExporterOptions> ResolveExporterOptions(const ExporterFlags& f) {
  if (auto st = CheckExporterFlags(f); !st.ok()) return st;
  LogCompatibilityNotes(f);
  exporter::ExporterOptions o;

  std::optional<ExporterConfigFile> config;
  if (!f.config_file.empty()) {
    auto c = LoadExporterConfigFile(f.config_file);
    if (!c.ok()) return c.status();
    config = std::move(*c);
    if (config->watch_groups) {
      Log("exporter")
          ->info(
              "{}: collection.watchGroups set DCGM's per-group watch intervals; kgpu reads every field "
              "at each collection (every -c / collection.interval)",
              f.config_file);
    }
  }

  // The counters: -m, else an explicit -f, else the config file's metrics, else the built-in set.
  std::vector<std::string> skipped;
  absl::StatusOr<std::vector<exporter::Counter>> counters;
  const bool configmap = !f.configmap_data.empty() && f.configmap_data != "none";
  auto builtin = [&] {
    return exporter::ParseCounters(exporter::DefaultCountersCsv(), "<default counters>", &skipped);
  };
  if (configmap) {
    if (f.collectors_given && !f.collectors.empty()) {
      Log("exporter")->info("-m {} is read instead of -f {} (as dcgm-exporter does)", f.configmap_data, f.collectors);
    }
    counters = CountersFromConfigMap(f, &skipped);
  } else if (f.collectors_given || !config || (config->metrics_file.empty() && config->fields_csv.empty())) {
    std::error_code ec;
    if (f.collectors.empty()) {
      counters = builtin();
    } else if (IsDcgmExporterImageCsv(f.collectors) && !std::filesystem::exists(f.collectors, ec)) {
      Log("exporter")
          ->info("-f {}: dcgm-exporter's image file is not here; kgpu's built-in default counters stand in",
                 f.collectors);
      counters = builtin();
    } else {
      counters = exporter::LoadCountersFile(f.collectors, &skipped);
    }
  } else if (!config->metrics_file.empty()) {
    counters = exporter::LoadCountersFile(config->metrics_file, &skipped);
  } else {
    counters = exporter::ParseCounters(config->fields_csv, Cat(f.config_file, ": metrics.fields"), &skipped);
  }
  if (!counters.ok()) return counters.status();
  if (const std::string s = exporter::SummarizeSkipped(skipped); !s.empty()) Log("exporter")->info("{}", s);
  o.counters = std::move(*counters);

  o.address = f.address;
  o.interval = std::chrono::milliseconds(f.interval_ms);
  if (!f.interval_given && config && config->interval) o.interval = *config->interval;
  o.kubernetes = f.kubernetes;
  o.gpu_id_type = f.gpu_id_type;
  o.pod_resources_socket = f.pod_resources_socket;
  o.pod_resources_interval = f.pod_resources_interval;
  o.proc_root = f.proc_root;
  o.checkpoint_path = f.checkpoint;
  o.cdi_spec_dir = f.cdi_spec_dir;
  o.hostname = f.no_hostname ? "" : Hostname();
  o.hostname_label = f.hostname_label;
  o.replace_blanks_in_model_name = f.replace_blanks;
  o.use_old_namespace = f.use_old_namespace;
  o.xid_count_window = std::chrono::milliseconds(f.xid_window_ms);
  o.clock_events_count_window = std::chrono::milliseconds(f.clock_events_window_ms);
  auto devices = ParseDeviceSelector("-d/--devices", f.devices);
  if (!devices.ok()) return devices.status();
  o.devices = std::move(*devices);
  o.pod_uid = f.kubernetes && f.pod_uid;
  o.virtual_gpus = f.kubernetes && f.virtual_gpus;
  o.health_require_gpus = f.health_require_gpus;
  if (!f.hpc_job_mapping_dir.empty()) o.hpc_jobs = std::make_shared<exporter::HpcJobs>(f.hpc_job_mapping_dir);
  if (f.health_recover_after == "never") {
    o.health_recover_after.reset();
  } else if (auto d = ParseGoDuration("--health-recover-after", f.health_recover_after); d.ok()) {
    o.health_recover_after = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
  } else {
    return d.status();
  }

  if (!f.web_config_file.empty()) {
    auto web_config = web::LoadWebConfig(f.web_config_file);
    if (!web_config.ok()) return web_config.status();
    o.web = std::move(*web_config);
  }
  // dcgm-exporter: a timeout of 0 or less means its default.
  for (auto [flag, value, out, fallback] :
       {std::tuple{"--web-read-timeout", &f.web_read_timeout, &o.web_read_timeout, std::chrono::milliseconds(10000)},
        std::tuple{"--web-write-timeout", &f.web_write_timeout, &o.web_write_timeout,
                   std::chrono::milliseconds(30000)}}) {
    auto ms = Milliseconds(flag, *value);
    if (!ms.ok()) return ms.status();
    *out = ms->count() > 0 ? *ms : fallback;
  }
  return o;
}

std::vector<std::string> GoStyleFlags(const CLI::App& app, int argc, const char* const* argv) {
  std::vector<std::string> out(argv, argv + argc);
  // Run as dcgm-exporter (a link of that name to kgpu, in an image whose entrypoint or manifests
  // name dcgm-exporter): the exporter, with dcgm-exporter's arguments as they are.
  if (!out.empty() && std::filesystem::path(out[0]).filename() == "dcgm-exporter") {
    out.insert(out.begin() + 1, "exporter");
  }
  // The subcommand is the first positional argument after kgpu's own options and their values.
  // Another positional first (`kgpu doctor --node-name node ...`), or a value spelled `exporter` or
  // `node` of an option that takes one (`kgpu --log-level node ...`), selects nothing: the command
  // line is left as it is.
  const CLI::App* sub = nullptr;
  size_t i = 1;
  for (; i < out.size() && sub == nullptr; ++i) {
    const std::string& a = out[i];
    if (a == "--") return out;
    if (a.size() > 1 && a[0] == '-') {
      if (a.find('=') != std::string::npos) continue;  // the value is in the argument
      // A known option that takes a value takes the next argument, whatever it is spelled. An
      // unknown one might: a next argument that is no option and names no subcommand is taken for
      // its value (CLI11 refuses the unknown option anyway, so nothing rides on that guess).
      if (i + 1 < out.size()) {
        const std::string& next = out[i + 1];
        if (const CLI::Option* opt = app.get_option_no_throw(a); opt != nullptr) {
          if (opt->get_items_expected_min() > 0) ++i;
        } else if (!next.starts_with('-') && next != "exporter" && next != "node") {
          ++i;
        }
      }
      continue;
    }
    if (a == "exporter" || a == "node") {
      const auto found = app.get_subcommands([&](const CLI::App* s) { return s->get_name() == a; });
      if (!found.empty()) sub = found.front();
    }
    if (sub == nullptr) return out;  // another command's line
  }
  for (; sub != nullptr && i < out.size(); ++i) {
    std::string& a = out[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' || a[1] == '-') continue;
    const size_t eq = a.find('=');
    const std::string name = a.substr(1, eq == std::string::npos ? std::string::npos : eq - 1);
    const std::string rest = eq == std::string::npos ? std::string() : a.substr(eq);
    if (name == "rbmn") {
      a = "--replace-blanks-in-model-name" + rest;
    } else if (name.size() > 1 && sub->get_option_no_throw("--" + name) != nullptr) {
      a = "-" + a;
    } else if (name.size() == 1 && eq != std::string::npos) {
      // Go's -f=/path and -k=true: CLI11 reads "-f=/path" as -f with the value "=/path", and
      // "-k=true" as a cluster of short flags. The option's long name takes the value after '='
      // as Go does, a flag's too (--kubernetes=true).
      const CLI::Option* opt = sub->get_option_no_throw("-" + name);
      if (opt != nullptr && !opt->get_lnames().empty()) a = "--" + opt->get_lnames().front() + rest;
    }
  }
  return out;
}

int RunExporter(const NodeOptions& node, const ExporterFlags& flags) {
  ExporterExtras extras;
  int code = 0;
  auto options = Prepare(flags, extras, &code);
  if (!options.ok()) {
    std::cerr << "kgpu exporter: " << options.status().message() << "\n";
    return code;
  }
  auto session = OpenSession(node);
  if (!session.ok()) {
    std::cerr << "kgpu exporter: " << session.status().message() << "\n";
    return 1;
  }
  if (auto st = CheckSelectedDevices(options->devices, *session->inventory); !st.ok()) {
    std::cerr << "kgpu exporter: " << st.message() << "\n";
    return 1;
  }
  options->discover = {node.sysfs_root};
  exporter::Exporter exp(*session->lib, session->inventory, std::move(*options));
  if (auto st = exp.Start(); !st.ok()) {
    std::cerr << "kgpu exporter: " << st.message() << "\n";
    return absl::IsInvalidArgument(st) ? 2 : 1;  // a malformed -a is usage; a port in use, a failure
  }
  WaitForStop();
  exp.Stop();
  return 0;
}

int RunNode(const NodeOptions& node, const DevicePluginFlags& plugin, const ExporterFlags& exporter_flags,
            const NodeLabelsFlags& labels) {
  auto config = ResolveConfig(plugin);
  if (!config.ok()) {
    std::cerr << "kgpu node: " << config.status().message() << "\n";
    return 1;
  }
  if (auto st = deviceplugin::CheckKubeletDir(config->kubelet_dir); !st.ok()) {
    std::cerr << "kgpu node: " << st.message() << "\n";
    return 1;
  }
  // The exporter's API server (-m, pod labels) is the node agent's: --kubeconfig, --context,
  // --in-cluster, --node-name.
  ExporterFlags flags = exporter_flags;
  flags.kubeconfig = labels.kubeconfig;
  flags.kube_context = labels.context;
  flags.in_cluster = labels.in_cluster;
  flags.node_name = labels.node_name;
  ExporterExtras extras;
  int code = 0;
  auto options = Prepare(flags, extras, &code);
  if (!options.ok()) {
    std::cerr << "kgpu node: " << options.status().message() << "\n";
    return code;
  }
  options->proc_root = config->proc_root;        // one --proc-root for both halves
  options->cdi_spec_dir = config->cdi_spec_dir;  // the specs the plugin half writes
  auto session = OpenSession(node);
  if (!session.ok()) {
    std::cerr << "kgpu node: " << session.status().message() << "\n";
    return 1;
  }
  if (auto st = CheckSelectedDevices(options->devices, *session->inventory); !st.ok()) {
    std::cerr << "kgpu node: " << st.message() << "\n";
    return 1;
  }
  deviceplugin::Manager manager(*session->lib, session->inventory, {node.sysfs_root});
  auto publisher = MakeLabelPublisher(manager, labels);  // follows the plugin: health, MIG, SIGHUP
  if (!publisher.ok()) {
    std::cerr << "kgpu node: " << publisher.status().message() << "\n";
    return 1;
  }
  InstallShareHandoff(manager, plugin, labels, *config, session->inventory);
  // One health source for the node agent: the device plugin's monitor, which kubelet is served
  // from, also sets kgpu_gpu_up and feeds the exporter's XID counts (one NVML event loop). With
  // health checks disabled in the plugin's config the exporter keeps its own, as when alone.
  options->discover = {node.sysfs_root};
  if (!config->health.disabled) options->health = [&manager] { return manager.HealthSnapshot(); };
  exporter::Exporter exp(*session->lib, session->inventory, std::move(*options));
  if (!config->health.disabled) {
    manager.SetXidObserver([&exp](unsigned g, unsigned gi, unsigned long long xid) { exp.RecordXid(g, gi, xid); });
  }
  if (auto st = manager.Start(*config); !st.ok()) {
    std::cerr << "kgpu node: " << st.message() << "\n";
    return 1;
  }
  if (auto st = exp.Start(); !st.ok()) {
    std::cerr << "kgpu node: " << st.message() << "\n";
    manager.Stop();
    return absl::IsInvalidArgument(st) ? 2 : 1;
  }
  Log("node")->info("device plugin ({}) and exporter (port {}) share one NVML session",
                    Join(manager.ResourceNames(), ", "), exp.port());
  // SIGHUP reloads the device plugin's configuration, as for `kgpu device-plugin`.
  const int rc = ServeUntilStopped(manager, plugin);
  exp.Stop();
  manager.Stop();
  return rc;
}

}  // namespace kgpu::cli
