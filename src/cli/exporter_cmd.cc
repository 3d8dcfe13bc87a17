#include "cli/exporter_cmd.h"

#include <cstdlib>
#include <iostream>

#include <signal.h>
#include <unistd.h>

#include "common/duration.h"
#include "common/log.h"
#include "common/strings.h"
#include "deviceplugin/kubelet_dir.h"
#include "deviceplugin/server.h"
#include "gpu/inventory.h"
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

}  // namespace

void AddExporterFlags(CLI::App* app, ExporterFlags* f) {
  app->add_option("-f,--collectors", f->collectors, "counters CSV in dcgm-exporter's format (default: built in)")
      ->envname("DCGM_EXPORTER_COLLECTORS");
  app->add_option("-a,--address", f->address, "listen address")->envname("DCGM_EXPORTER_LISTEN")->capture_default_str();
  app->add_option("-c,--collect-interval", f->interval_ms, "collection interval, ms")
      ->envname("DCGM_EXPORTER_INTERVAL")
      ->check(CLI::Range(100U, 3600000U))
      ->capture_default_str();
  app->add_flag("-k,--kubernetes", f->kubernetes, "attribute devices to pods (PodResources)")
      ->envname("DCGM_EXPORTER_KUBERNETES");
  app->add_option("--kubernetes-gpu-id-type", f->gpu_id_type, "uid or device-name")
      ->envname("DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE")
      ->check(CLI::IsMember({"uid", "device-name"}));
  app->add_option("--pod-resources-kubelet-socket", f->pod_resources_socket, "kubelet PodResources socket")
      ->envname("DCGM_POD_RESOURCES_KUBELET_SOCKET")
      ->capture_default_str();
  app->add_option("--pod-resources-interval", f->pod_resources_interval_ms,
                  "how often pod attribution is refreshed, ms (never per scrape)")
      ->envname("KGPU_POD_RESOURCES_INTERVAL")
      ->check(CLI::Range(100U, 3600000U));
  // `kgpu node` has the device plugin's --proc-root already (the same host procfs): RunNode uses it.
  if (app->get_option_no_throw("--proc-root") == nullptr) {
    app->add_option("--proc-root", f->proc_root, "procfs of the host (process cgroups, for per-pod figures)")
        ->envname("KGPU_PROC_ROOT");
  }
  app->add_option("--kubelet-checkpoint", f->checkpoint, "kubelet's device-manager checkpoint file")
      ->envname("KGPU_KUBELET_CHECKPOINT");
  // `kgpu node` has the device plugin's --cdi-spec-dir already (the specs it writes): RunNode uses it.
  if (app->get_option_no_throw("--cdi-spec-dir") == nullptr) {
    app->add_option("--cdi-spec-dir", f->cdi_spec_dir,
                    "the device plugin's CDI spec directory (the GPUs and limits of kgpu.io/gpu containers)")
        ->envname("KGPU_CDI_SPEC_DIR")
        ->capture_default_str();
  }
  app->add_flag("-n,--no-hostname", f->no_hostname, "omit the Hostname label")->envname("DCGM_EXPORTER_NO_HOSTNAME");
  app->add_flag("--replace-blanks-in-model-name", f->replace_blanks, "modelName with '-' for blanks")
      ->envname("DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME");
  // `kgpu node` takes health.recoverAfter from the plugin's config file: one setting, one place.
  if (app->get_option_no_throw("--config-file") == nullptr) {
    app->add_option("--health-recover-after", f->health_recover_after,
                    "how long after its last fault (an XID, a lost GPU) a GPU is up again, as the device plugin's "
                    "health.recoverAfter: a duration (5m, 30s) or never")
        ->envname("KGPU_HEALTH_RECOVER_AFTER")
        ->check([](const std::string& v) {
          if (v == "never") return std::string();
          auto d = ParseGoDuration("", v);  // CLI11 names the flag before this message
          return d.ok() ? std::string() : std::string(d.status().message());
        })
        ->capture_default_str();
  }
  app->add_option("-d,--devices", f->devices, "device selector (kgpu supports f: all GPUs, or GPU instances)")
      ->envname("DCGM_EXPORTER_DEVICES_STR");
}

absl::StatusOr<exporter::ExporterOptions> ResolveExporterOptions(const ExporterFlags& f) {
  if (f.devices != "f") {
    return absl::InvalidArgumentError(
        Cat("-d '", f.devices, "': kgpu monitors all GPUs (and GPU instances on MIG GPUs); use -d f"));
  }
  exporter::ExporterOptions o;
  std::vector<std::string> skipped;
  auto counters = f.collectors.empty()
                      ? exporter::ParseCounters(exporter::DefaultCountersCsv(), "<default counters>", &skipped)
                      : exporter::LoadCountersFile(f.collectors, &skipped);
  if (!counters.ok()) return counters.status();
  for (const auto& s : skipped) Log("exporter")->info("{}", s);
  o.counters = std::move(*counters);
  o.address = f.address;
  o.interval = std::chrono::milliseconds(f.interval_ms);
  o.kubernetes = f.kubernetes;
  o.gpu_id_type = f.gpu_id_type;
  o.pod_resources_socket = f.pod_resources_socket;
  o.pod_resources_interval = std::chrono::milliseconds(f.pod_resources_interval_ms);
  o.proc_root = f.proc_root;
  o.checkpoint_path = f.checkpoint;
  o.cdi_spec_dir = f.cdi_spec_dir;
  o.hostname = f.no_hostname ? "" : Hostname();
  o.replace_blanks_in_model_name = f.replace_blanks;
  if (f.health_recover_after == "never") {
    o.health_recover_after.reset();
  } else if (auto d = ParseGoDuration("--health-recover-after", f.health_recover_after); d.ok()) {
    o.health_recover_after = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
  } else {
    return d.status();
  }
  return o;
}

int RunExporter(const NodeOptions& node, const ExporterFlags& flags) {
  auto options = ResolveExporterOptions(flags);
  if (!options.ok()) {
    std::cerr << "kgpu exporter: " << options.status().message() << "\n";
    return 1;
  }
  auto session = OpenSession(node);
  if (!session.ok()) {
    std::cerr << "kgpu exporter: " << session.status().message() << "\n";
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
  auto options = ResolveExporterOptions(exporter_flags);
  if (!options.ok()) {
    std::cerr << "kgpu node: " << options.status().message() << "\n";
    return 1;
  }
  options->proc_root = config->proc_root;        // one --proc-root for both halves
  options->cdi_spec_dir = config->cdi_spec_dir;  // the specs the plugin half writes
  auto session = OpenSession(node);
  if (!session.ok()) {
    std::cerr << "kgpu node: " << session.status().message() << "\n";
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
