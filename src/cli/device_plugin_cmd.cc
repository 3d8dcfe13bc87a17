#include "cli/device_plugin_cmd.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <signal.h>
#include <unistd.h>

#include "cli/flags.h"
#include "cli/share_handoff.h"
#include "common/log.h"
#include "common/strings.h"
#include "deviceplugin/kubelet_dir.h"
#include "deviceplugin/plan.h"
#include "deviceplugin/server.h"
#include "gpu/inventory.h"
#include "k8s/config.h"
#include "nvml/library.h"

namespace kgpu::cli {
namespace {

using deviceplugin::Config;

std::string Env(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): start-up and SIGHUP only
  return v != nullptr ? v : "";
}

}  // namespace

// Each flag: NVIDIA's name(s), its environment variable(s), and how it overrides the file.
#define KGPU_FLAG(names, env, member, help)                                                   \
  flags->given.emplace_back(app->add_option(names, flags->values.member, help)->envname(env), \
                            [](const Config& from, Config* to) { to->member = from.member; })
#define KGPU_BOOL(names, env, member, help)                                                 \
  flags->given.emplace_back(app->add_flag(names, flags->values.member, help)->envname(env), \
                            [](const Config& from, Config* to) { to->member = from.member; })

void AddDevicePluginFlags(CLI::App* app, DevicePluginFlags* flags, PluginFlags use) {
  app->add_option("--config-file", flags->config_file, "NVIDIA v1 config file (YAML or JSON)")->envname("CONFIG_FILE");
  app->add_flag("--allow-empty-config", flags->allow_empty_config,
                "accept an empty --config-file (every setting at its default) instead of refusing it")
      ->envname("KGPU_ALLOW_EMPTY_CONFIG");
  KGPU_FLAG("--mig-strategy", "MIG_STRATEGY", mig_strategy, "none, single or mixed");
  KGPU_BOOL("--fail-on-init-error", "FAIL_ON_INIT_ERROR", fail_on_init_error,
            "exit when NVML cannot be initialised (false: wait, for non-GPU nodes)");
  KGPU_FLAG("--driver-root,--nvidia-driver-root", "NVIDIA_DRIVER_ROOT", driver_root, "driver root");
  KGPU_FLAG("--dev-root,--nvidia-dev-root", "NVIDIA_DEV_ROOT", dev_root,
            "root of the host's device nodes, /dev/nvidia* under it (default: the driver root)");
  KGPU_FLAG("--cuda-interposer", "KGPU_CUDA_INTERPOSER", cuda_interposer,
            "host path of libkgpu-cuda.so, in a versioned directory never written over: kgpu.io/gpu shares may then "
            "ask for hard memory limits (docs/isolation.md)");
  app->add_option("--device-discovery-strategy", "auto or nvml (accepted for compatibility)")
      ->envname("DEVICE_DISCOVERY_STRATEGY")
      ->check(CLI::IsMember({"auto", "nvml"}));
  if (use == PluginFlags::kDescribe) return;
  KGPU_FLAG("--cdi-spec-dir", "KGPU_CDI_SPEC_DIR", cdi_spec_dir, "where the CDI spec is written");
  KGPU_FLAG("--cuda-shared-root", "KGPU_CUDA_SHARED_ROOT", cuda_shared_root,
            "host directory for the per-container accounting regions of --cuda-interposer");
  KGPU_FLAG("--cuda-interposer-load", "KGPU_CUDA_INTERPOSER_LOAD", cuda_interposer_load,
            "how --cuda-interposer enters a container: env (LD_PRELOAD) or ld.so.preload (a file mounted at "
            "/etc/ld.so.preload: a process that clears LD_PRELOAD is still held)");
  KGPU_FLAG("--proc-root", "KGPU_PROC_ROOT", proc_root,
            "the host's procfs: the driver's driver/nvidia-caps/mig-minors is read under it (MIG device nodes)");
  if (use == PluginFlags::kDra) return;
  KGPU_BOOL("--pass-device-specs", "PASS_DEVICE_SPECS", pass_device_specs, "return DeviceSpecs in Allocate");
  flags->given.emplace_back(
      app->add_option("--device-list-strategy", flags->values.device_list_strategy,
                      "envvar, volume-mounts, cdi-annotations, cdi-cri (comma list)")
          ->envname("DEVICE_LIST_STRATEGY")
          ->delimiter(','),
      [](const Config& from, Config* to) { to->device_list_strategy = from.device_list_strategy; });
  KGPU_FLAG("--device-id-strategy", "DEVICE_ID_STRATEGY", device_id_strategy, "uuid or index");
  KGPU_BOOL("--gdrcopy-enabled", "GDRCOPY_ENABLED", gdrcopy_enabled, "NVIDIA_GDRCOPY=enabled");
  KGPU_BOOL("--gds-enabled", "GDS_ENABLED", gds_enabled, "NVIDIA_GDS=enabled");
  KGPU_BOOL("--mofed-enabled", "MOFED_ENABLED", mofed_enabled, "NVIDIA_MOFED=enabled");
  KGPU_FLAG("--cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX", cdi_annotation_prefix, "CDI annotation prefix");
  KGPU_FLAG("--nvidia-cdi-hook-path,--nvidia-ctk-path", "NVIDIA_CDI_HOOK_PATH", nvidia_ctk_path, "nvidia-ctk path");
  KGPU_FLAG("--driver-root-ctr-path,--container-driver-root", "DRIVER_ROOT_CTR_PATH", container_driver_root,
            "driver root inside this container");
  KGPU_FLAG("--mps-root", "MPS_ROOT", mps_root, "MPS root directory");
  KGPU_FLAG("--mps-control", "MPS_CONTROL", mps_control,
            "nvidia-cuda-mps-control binary (default: found on PATH; e.g. /driver-root/usr/bin/...)");
  KGPU_FLAG("--shared-devices-allocation-policy", "SHARED_DEVICES_ALLOCATION_POLICY", shared_devices_allocation_policy,
            "distributed or packed");
  KGPU_FLAG("--kubelet-socket", "KUBELET_SOCKET", kubelet_socket, "kubelet registration socket");
  KGPU_FLAG("--kubelet-dir", "KGPU_KUBELET_DIR", kubelet_dir, "kubelet device-plugin directory");
  // NVIDIA's IMEX flags: the config file's imex section, from the command line.
  flags->given.emplace_back(
      app->add_option("--imex-channel-ids", flags->values.imex_channel_ids,
                      "IMEX channels to inject into every container (comma list; only channel 0, as NVIDIA's plugin)")
          ->envname("IMEX_CHANNEL_IDS")
          ->delimiter(',')
          ->check(CLI::Validator(
              [](std::string& v) {
                return v == "0" ? std::string() : "IMEX channel " + v + ": only channel 0 can be injected";
              },
              "0")),
      [](const Config& from, Config* to) { to->imex_channel_ids = from.imex_channel_ids; });
  KGPU_BOOL("--imex-required", "IMEX_REQUIRED", imex_required,
            "refuse to start when the IMEX channels cannot be injected");
  // NVIDIA's plugin hands these to nvidia-container-toolkit's CDI generator; kgpu writes its CDI
  // specs itself, so a value has no meaning here: refused, with the reason, never ignored.
  app->add_option("--cdi-feature-flags", "nvidia-container-toolkit's CDI generator options (refused: not used)")
      ->envname("CDI_FEATURE_FLAGS")
      ->check(CLI::Validator(
          [](std::string& v) {
            return v.empty() ? std::string()
                             : "'" + v +
                                   "': kgpu writes its CDI specs itself and has no CDI feature flags (nvidia-container-"
                                   "toolkit's generator options); remove the flag or CDI_FEATURE_FLAGS";
          },
          "refused"));
}
#undef KGPU_FLAG
#undef KGPU_BOOL

void AddShareFlags(CLI::App* app, DevicePluginFlags* flags) {
  app->add_option("--pod-resources-socket", flags->shares.pod_resources_socket,
                  "kgpu.io/gpu: kubelet's PodResources socket")
      ->envname("KGPU_POD_RESOURCES_SOCKET")
      ->capture_default_str();
  AddDurationOption(app, "--cuda-accounting-sweep", &flags->shares.accounting_sweep,
                    "memory held by --cuda-interposer: this often, remove the accounting directories of containers "
                    "that are gone (kgpu.io/gpu hard shares: --cuda-shared-root/<pod UID> of pods no longer on this "
                    "node; time-slicing replicas: --cuda-shared-root/timeslicing/<id> that no container in "
                    "kubelet's checkpoint mounts; 0s: never; a bare number counts seconds)",
                    {.bare_unit = "s", .max = std::chrono::hours(24)})
      ->envname("KGPU_CUDA_ACCOUNTING_SWEEP");
}

void InstallShareHandoff(deviceplugin::Manager& manager, const DevicePluginFlags& flags, const NodeLabelsFlags& api,
                         const Config& config, std::shared_ptr<const gpu::Inventory> inventory) {
  const bool serves = std::any_of(config.sharing.resources.begin(), config.sharing.resources.end(),
                                  [](const auto& r) { return r.rename == api::kShares; });
  // A node that publishes its inventory is one kgpu extender places pods on: its whole-GPU and
  // MIG records are made to say what kubelet gave (cli/share_handoff.h).
  bool publishes = api.publish && api.output == "api";
  if (publishes && !serves && !std::filesystem::exists(flags.shares.pod_resources_socket)) {
    Log("deviceplugin")
        ->info(
            "whole-GPU and MIG allocation records keep the extender's choice, which kubelet's may differ "
            "from: kubelet's PodResources socket {} is not here (mount /var/lib/kubelet/pod-resources "
            "and grant get+patch on pods, as deploy/shares does)",
            flags.shares.pod_resources_socket);
    publishes = false;
  }
  if (!serves && !publishes) return;
  const char* what = serves ? api::kShares : "nvidia.com/gpu and MIG allocation records";
  auto cfg = k8s::ConfigFromFlags(api.kubeconfig, api.context, api.in_cluster);
  if (!cfg.ok()) {
    Log("deviceplugin")->error("{}: allocation records cannot be read: {}", what, std::string(cfg.status().message()));
    return;
  }
  // kubelet's own API budget (kubeAPIQPS 50, kubeAPIBurst 100) for each of the two clients, not
  // client-go's 5/10: a burst of admissions costs a LIST (GetPreferredAllocation) and a GET, a
  // PATCH and an Event (PreStartContainer) per container, and at 5 per second each would wait
  // 200 ms for its token.
  cfg->qps = 50;
  cfg->burst = 100;
  auto client = k8s::Client::Create(*cfg);
  if (!client.ok()) {
    Log("deviceplugin")->error("{}: {}", what, std::string(client.status().message()));
    return;
  }
  ShareHandoffOptions o;
  o.node_name = api.node_name;
  o.pod_resources_socket = flags.shares.pod_resources_socket;
  o.cdi_spec_dir = config.cdi_spec_dir;
  o.dev_root = config.DevRoot();
  o.cuda_interposer = config.cuda_interposer;
  o.cuda_shared_root = config.cuda_shared_root;
  o.cuda_interposer_load = config.cuda_interposer_load;
  o.accounting_sweep = flags.shares.accounting_sweep;
  if (config.sharing.strategy == deviceplugin::SharingStrategy::kMps) o.mps_root = config.mps_root;
  // GetPreferredAllocation's LIST: on kubelet's admission path, so one try with a short deadline.
  k8s::Config list_cfg = *cfg;
  list_cfg.timeout = std::chrono::milliseconds(2000);
  list_cfg.max_tries = 1;
  auto list_client = k8s::Client::Create(list_cfg);
  if (!list_client.ok()) {
    Log("deviceplugin")
        ->warn("kubelet is not steered to the extender's whole-GPU choice: {}",
               std::string(list_client.status().message()));
  }
  auto handoff = std::make_shared<ShareHandoff>(std::move(*client), std::move(inventory), o,
                                                list_client.ok() ? std::move(*list_client) : nullptr);
  if (serves) {
    manager.SetShareResolver([handoff](const std::vector<std::string>& ids, const std::string& name) {
      return handoff->Resolve(ids, name);
    });
  }
  manager.SetPreferenceAdvisor(
      [handoff](const std::string& resource, size_t size) { return handoff->Pending(resource, size); });
  manager.SetAssignmentReporter([handoff](const std::string& resource, const std::vector<std::string>& ids,
                                          const std::vector<deviceplugin::AssignedDevice>& devices) {
    handoff->RecordAssignmentLater(resource, ids, devices);
  });
}

absl::StatusOr<Config> ResolveConfig(const DevicePluginFlags& flags) {
  Config config;
  if (!flags.config_file.empty()) {
    auto loaded = deviceplugin::LoadConfigFile(flags.config_file, {.allow_empty = flags.allow_empty_config});
    if (!loaded.ok()) return loaded.status();
    config = std::move(*loaded);
  }
  for (const auto& [option, apply] : flags.given) {
    if (option->count() > 0) apply(flags.values, &config);
  }
  config.cuda_accounting_sweep = flags.shares.accounting_sweep;
  if (auto st = deviceplugin::ApplyHealthcheckEnv(Env("DP_DISABLE_HEALTHCHECKS"), Env("DP_ENABLE_HEALTHCHECKS"),
                                                  &config.health);
      !st.ok()) {
    return st;
  }
  if (!config.cuda_interposer.empty()) {
    // Checked at start and on every reload: a hard share must never start without its limit.
    if (config.cuda_interposer.front() != '/' || access(config.cuda_interposer.c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(
          Cat("--cuda-interposer ", Printable(config.cuda_interposer), ": ",
              config.cuda_interposer.front() != '/' ? "not an absolute path" : std::strerror(errno),
              " (the host path of libkgpu-cuda.so, e.g. "
              "/var/lib/kgpu/isolation/<version>/libkgpu-cuda.so)"));
    }
  }
  if (config.imex_required) {
    // NVIDIA's imex.required: the channels must exist on the node, or the plugin does not start.
    for (const int ch : config.imex_channel_ids) {
      const std::string path = config.HostDevPath(Cat("/dev/nvidia-caps-imex-channels/channel", ch));
      if (access(path.c_str(), F_OK) != 0) {
        return absl::FailedPreconditionError(Cat("IMEX channel ", ch,
                                                 " is required (imex.required, --imex-required) "
                                                 "but ",
                                                 Printable(path),
                                                 " does not exist: create the channel (the "
                                                 "driver's nvidia-caps-imex-channels device) or drop imex.required"));
      }
    }
  }
  if (auto st = deviceplugin::Validate(config); !st.ok()) {
    // The file's own values were checked with their positions; a message that does not start with
    // one is about a flag or an environment variable.
    const std::string message(st.message());
    const bool positioned = !flags.config_file.empty() && message.rfind(Printable(flags.config_file) + ":", 0) == 0;
    return absl::InvalidArgumentError(positioned ? message : Cat("flags and environment: ", message));
  }
  return config;
}

absl::StatusOr<ConfiguredSession> OpenConfiguredSession(const NodeOptions& node, const DevicePluginFlags& flags) {
  auto config = ResolveConfig(flags);
  if (!config.ok()) return config.status();
  auto session = OpenSession(node);
  if (!session.ok()) return session.status();
  return ConfiguredSession{std::move(*config), std::move(*session)};
}

namespace {

sigset_t StopAndReloadSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGHUP, SIGTERM, SIGINT, SIGQUIT}) sigaddset(&signals, s);
  return signals;
}

int WaitSignal() {
  const sigset_t signals = StopAndReloadSignals();
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) == 0) return sig;
  }
}

}  // namespace

int ServeUntilStopped(deviceplugin::Manager& manager, const DevicePluginFlags& flags) {
  auto log = Log("deviceplugin");
  for (;;) {
    const int sig = WaitSignal();
    if (sig != SIGHUP) {
      log->info("signal {}: removing our sockets and exiting", sig);
      return 0;
    }
    log->info("SIGHUP: reloading the configuration");
    auto next = ResolveConfig(flags);
    if (!next.ok()) {
      log->error("reload refused, keeping the running configuration: {}", std::string(next.status().message()));
      continue;
    }
    if (auto st = manager.Reload(*next); !st.ok()) {
      log->error("reload failed: {}", std::string(st.message()));
      if (st.code() == absl::StatusCode::kInternal) return 1;  // nothing could be restored
    }
  }
}

int RunDevicePlugin(const NodeOptions& node, const DevicePluginFlags& flags, const NodeLabelsFlags& labels) {
  auto log = Log("deviceplugin");
  auto config = ResolveConfig(flags);
  if (!config.ok()) {
    std::cerr << "kgpu device-plugin: " << config.status().message() << "\n";
    return 1;
  }
  // Before NVML and gRPC: a bad directory is named as such, not as gRPC's failure to listen.
  if (auto st = deviceplugin::CheckKubeletDir(config->kubelet_dir); !st.ok()) {
    std::cerr << "kgpu device-plugin: " << st.message() << "\n";
    return 1;
  }
  auto lib = nvml::Library::Open({node.nvml_library});
  while (!lib.ok()) {
    if (config->fail_on_init_error) {
      std::cerr << "kgpu device-plugin: " << lib.status().message()
                << "\n(set --fail-on-init-error=false to keep running on nodes without GPUs)\n";
      return 1;
    }
    log->warn("{}; failOnInitError=false: no devices; SIGHUP reloads the configuration and tries NVML again",
              std::string(lib.status().message()));
    if (WaitSignal() != SIGHUP) return 0;
    log->info("SIGHUP: reloading the configuration and opening NVML again");
    if (auto next = ResolveConfig(flags); next.ok()) {
      config = std::move(next);
    } else {
      log->error("reload refused, keeping the running configuration: {}", std::string(next.status().message()));
    }
    lib = nvml::Library::Open({node.nvml_library});
  }
  auto inventory = gpu::Inventory::Discover(**lib, {node.sysfs_root});
  if (!inventory.ok()) {
    std::cerr << "kgpu device-plugin: GPU discovery failed: " << inventory.status().message() << "\n";
    return 1;
  }
  deviceplugin::Manager manager(**lib, *inventory, {node.sysfs_root});
  auto publisher = MakeLabelPublisher(manager, labels);
  if (!publisher.ok()) {
    std::cerr << "kgpu device-plugin: " << publisher.status().message() << "\n";
    return 1;
  }
  InstallShareHandoff(manager, flags, labels, *config, *inventory);
  if (auto st = manager.Start(*config); !st.ok()) {
    std::cerr << "kgpu device-plugin: " << st.message() << "\n";
    return 1;
  }
  log->info("kgpu device-plugin running: {} resource(s): {}", manager.ResourceNames().size(),
            Join(manager.ResourceNames(), ", "));
  const int rc = ServeUntilStopped(manager, flags);
  manager.Stop();
  return rc;
}

}  // namespace kgpu::cli
