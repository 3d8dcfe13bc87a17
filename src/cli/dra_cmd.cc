#include "cli/dra_cmd.h"

#include <atomic>
#include <map>
#include <thread>

#include <unistd.h>

#include "cli/flags.h"
#include "common/backoff.h"
#include "common/files.h"
#include "common/log.h"
#include "common/strings.h"
#include "deviceplugin/config.h"
#include "dra/health.h"
#include "dra/plugin.h"
#include "dra/prepare.h"
#include "dra/publish.h"
#include "dra/slices.h"
#include "gpu/health.h"
#include "gpu/mig_layout.h"
#include "gpu/mig_minors.h"
#include "k8s/client.h"
#include "k8s/config.h"

namespace kgpu::cli {
namespace {

std::string HostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string name = host;
  if (const auto dot = name.find('.'); dot != std::string::npos) name.resize(dot);
  return name;
}

// "1.34", "v1.35.2" -> 34, 35; nullopt for anything else.
std::optional<int> KubernetesMinor(std::string_view v) {
  if (!v.empty() && v.front() == 'v') v.remove_prefix(1);
  if (v.substr(0, 2) != "1.") return std::nullopt;
  v.remove_prefix(2);
  int minor = 0;
  size_t i = 0;
  for (; i < v.size() && v[i] >= '0' && v[i] <= '9' && i < 4; ++i) minor = minor * 10 + (v[i] - '0');
  if (i == 0 || (i < v.size() && v[i] != '.')) return std::nullopt;
  return minor;
}

}  // namespace

namespace {
void AddPoolFlags(CLI::App* cmd, DraFlags* flags) {
  cmd->add_option("--node-name", flags->node_name, "this node's name: the pool and nodeName (default: host name)")
      ->envname("NODE_NAME");
  cmd->add_option("--driver-name", flags->driver,
                  "the DRA driver name (NVIDIA's by default, so its DeviceClasses and claims work unchanged; "
                  "another where both drivers run in one cluster, never on one node)")
      ->envname("KGPU_DRA_DRIVER_NAME")
      ->capture_default_str();
  cmd->add_flag("--dynamic-mig", flags->dynamic_mig,
                "MIG-mode GPUs: publish every profile placement (carved when a claim is prepared) instead of the "
                "instances that exist")
      ->envname("KGPU_DRA_DYNAMIC_MIG");
}
}  // namespace

std::pair<CLI::App*, CLI::App*> AddDraCommands(CLI::App* app, DraFlags* flags, DevicePluginFlags* plugin_flags) {
  auto* dra = app->add_subcommand(
      "dra", "the DRA kubelet plugin: GPUs, MIG and enforced shares through Dynamic Resource Allocation");
  dra->require_subcommand(0, 1);
  auto* slices = dra->add_subcommand(
      "slices", "print the ResourceSlices this node publishes (a v1 List of resource.k8s.io/v1 objects)");
  AddPoolFlags(slices, flags);
  slices
      ->add_option("--kubernetes-version", flags->kubernetes_version,
                   "the API server's version: 1.34 keeps each MIG GPU's counters in its device slice, "
                   "1.35 and later in slices of their own")
      ->capture_default_str();
  AddDevicePluginFlags(slices, plugin_flags, PluginFlags::kDescribe);

  AddPoolFlags(dra, flags);
  dra->add_option("--kubeconfig", flags->kubeconfig, "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)");
  dra->add_option("--context", flags->context, "kubeconfig context");
  dra->add_flag("--in-cluster", flags->in_cluster, "use the pod's service account");
  dra->add_option("--kubelet-registry-dir", flags->registry_dir,
                  "kubelet's plugin registry: <driver>-reg.sock is served here")
      ->envname("KGPU_KUBELET_REGISTRY_DIR")
      ->capture_default_str();
  dra->add_option("--kubelet-plugins-dir", flags->plugins_dir,
                  "kubelet's plugins directory: <this>/<driver>/dra.sock and the checkpoint")
      ->envname("KGPU_KUBELET_PLUGINS_DIR")
      ->capture_default_str();
  dra->add_option("--lost-gpu-taint-effect", flags->lost_taint_effect,
                  "the effect of a lost GPU's device taint: NoSchedule, or NoExecute to have the scheduler evict the "
                  "pods that use it")
      ->check(CLI::IsMember({"NoSchedule", "NoExecute"}))
      ->capture_default_str();
  AddDurationOption(dra, "--resync-interval", &flags->resync,
                    "how often the ResourceSlices are compared with the node's and written again if they differ",
                    {.bare_unit = "s", .min = std::chrono::seconds(1)});
  AddDevicePluginFlags(dra, plugin_flags, PluginFlags::kDra);
  return {dra, slices};
}

namespace {

// What the pool is built from, checked: the flags' names, the version's layout, the MIG catalogs.
struct PoolInputs {
  dra::PoolOptions options;
  std::map<unsigned, gpu::MigCatalog> mig;
};

absl::StatusOr<PoolInputs> ReadPoolInputs(const ConfiguredSession& cs, const DraFlags& flags) {
  PoolInputs in;
  dra::PoolOptions& opts = in.options;
  opts.driver = flags.driver;
  if (!api::dra::IsDnsSubdomain(opts.driver, 63)) {
    return absl::InvalidArgumentError(Printable(Cat("--driver-name '", opts.driver,
                                                    "' is not a DRA driver name: a DNS subdomain of at most 63 "
                                                    "lower-case characters, like gpu.nvidia.com")));
  }
  opts.node_name = flags.node_name.empty() ? HostName() : flags.node_name;
  if (!api::dra::IsDnsSubdomain(opts.node_name)) {
    return absl::InvalidArgumentError(Printable(
        Cat("--node-name '", opts.node_name, "' is not a Kubernetes node name (a lower-case DNS subdomain)")));
  }
  const auto minor = KubernetesMinor(flags.kubernetes_version);
  if (!minor || *minor < 34) {
    return absl::InvalidArgumentError(Printable(Cat("Kubernetes version '", flags.kubernetes_version,
                                                    "': DRA's resource.k8s.io/v1 needs Kubernetes 1.34 or later "
                                                    "(write it as 1.34 or v1.35.2)")));
  }
  opts.split_counters = *minor >= 35;
  opts.dynamic_mig = flags.dynamic_mig;
  for (const auto& g : cs.session.inventory->gpus()) {
    if (deviceplugin::ShareSlotsOf(g, cs.config) > 0) opts.shared_gpus.insert(g.index);
    if (!g.mig_enabled || !g.error.empty()) continue;
    auto cat = gpu::ReadMigCatalog(*cs.session.lib, g);
    if (!cat.ok()) {
      return absl::Status(cat.status().code(), Cat("GPU ", g.index, ": MIG profiles: ", cat.status().message()));
    }
    in.mig[g.index] = std::move(*cat);
  }
  return in;
}

}  // namespace

absl::StatusOr<std::vector<api::dra::ResourceSlice>> NodeSlices(const ConfiguredSession& cs, const DraFlags& flags) {
  auto in = ReadPoolInputs(cs, flags);
  if (!in.ok()) return in.status();
  return dra::BuildPool(*cs.session.inventory, in->mig, in->options);
}

int RunDra(const NodeOptions& node, const DevicePluginFlags& plugin, const DraFlags& flags,
           const volatile std::sig_atomic_t* stop, std::ostream& err) {
  auto log = Log("dra");
  auto cs = OpenConfiguredSession(node, plugin);
  if (!cs.ok()) {
    err << "kgpu dra: " << cs.status().message() << "\n";
    return 1;
  }
  const deviceplugin::Config& config = cs->config;
  auto cfg = k8s::ConfigFromFlags(flags.kubeconfig, flags.context, flags.in_cluster);
  if (!cfg.ok()) {
    err << "kgpu dra: " << cfg.status().message() << "\n";
    return 1;
  }
  // kubelet's own API budget (kubeAPIQPS 50, kubeAPIBurst 100), not client-go's 5/10: every
  // NodePrepareResources reads its claims, and at 5 per second a burst of pods would wait 200 ms each.
  cfg->qps = 50;
  cfg->burst = 100;
  auto created = k8s::Client::Create(*cfg);
  if (!created.ok()) {
    err << "kgpu dra: " << created.status().message() << "\n";
    return 1;
  }
  std::shared_ptr<k8s::Client> client = std::move(*created);
  // The API server's version decides the slices' layout (NVIDIA's driver asks the same way).
  auto version = client->Get("/version");
  if (!version.ok()) {
    err << "kgpu dra: asking the API server its version: " << version.status().message() << "\n";
    return 1;
  }
  DraFlags f = flags;
  f.kubernetes_version = version->value("gitVersion", "");
  if (const auto minor = KubernetesMinor(f.kubernetes_version); !minor || *minor < 34) {
    err << "kgpu dra: the API server reports version '" << Printable(f.kubernetes_version)
        << "'; DRA's resource.k8s.io/v1 needs Kubernetes 1.34 or later (use the device plugin there)\n";
    return 1;
  }
  auto in = ReadPoolInputs(*cs, f);
  if (!in.ok()) {
    err << "kgpu dra: " << in.status().message() << "\n";
    return 1;
  }
  const dra::PoolOptions& pool = in->options;
  const gpu::Inventory& inv = *cs->session.inventory;

  dra::PrepareOptions po;
  po.driver = pool.driver;
  po.node_name = pool.node_name;
  po.plugin_dir = Cat(flags.plugins_dir, "/", pool.driver);
  po.cdi_dir = config.cdi_spec_dir;
  po.dev_root = config.DevRoot() == "/" ? "" : config.DevRoot();
  po.shared_gpus = pool.shared_gpus;
  po.cuda_interposer = config.cuda_interposer;
  po.cuda_interposer_load = config.cuda_interposer_load;
  po.cuda_shared_root = config.cuda_shared_root;
  po.mig = in->mig;
  po.dynamic_mig = pool.dynamic_mig;
  if (!in->mig.empty()) {
    const std::string path = UnderRoot(config.proc_root, "/driver/nvidia-caps/mig-minors");
    if (const auto text = ReadFile(path)) {
      auto minors = gpu::ParseMigMinors(*text, path);
      if (!minors.ok()) {
        err << "kgpu dra: " << minors.status().message() << "\n";
        return 1;
      }
      po.mig_minors = std::move(*minors);
    } else {
      log->warn("{} is not readable: MIG claims cannot be prepared (set --proc-root to the host's procfs)", path);
    }
  }
  auto preparer = dra::Preparer::Create(client, cs->session.inventory, po, cs->session.lib);
  if (!preparer.ok()) {
    err << "kgpu dra: " << preparer.status().message() << "\n";
    return 1;
  }
  std::shared_ptr<dra::Preparer> shared_preparer = std::move(*preparer);
  dra::PluginOptions plo;
  plo.driver = pool.driver;
  plo.registry_dir = flags.registry_dir;
  plo.plugin_dir = po.plugin_dir;
  // Reports go out at every resync at least: kubelet trusts each for two periods and a margin.
  plo.health_timeout_seconds = 2 * flags.resync.count() + 30;
  auto started = dra::Plugin::Start(plo, shared_preparer);
  if (!started.ok()) {
    err << "kgpu dra: " << started.status().message() << "\n";
    return 1;
  }
  std::unique_ptr<dra::Plugin> server = std::move(*started);

  // The one health source: taints in the slices, kubelet's stream.
  std::atomic<bool> health_changed{true};
  std::unique_ptr<gpu::HealthMonitor> monitor;
  if (!config.health.disabled) {
    monitor = std::make_unique<gpu::HealthMonitor>(
        *cs->session.lib, cs->session.inventory, deviceplugin::HealthOptionsFor(config.health),
        [&](const std::vector<gpu::DeviceHealth>&) { health_changed = true; });
    if (auto st = monitor->Start(); !st.ok()) log->warn("health monitor: {}", std::string(st.message()));
  } else {
    log->warn("health checks are disabled (health.disabled): devices are published untainted");
  }
  dra::SlicePublisher publisher(client, pool.driver, pool.node_name);
  dra::TaintOptions to;
  to.lost_effect = flags.lost_taint_effect;
  Backoff backoff(std::chrono::seconds(1), std::chrono::minutes(1), 0.2);
  auto next_publish = std::chrono::steady_clock::now();
  int64_t last_generation = -1;
  while (!*stop) {
    const auto now = std::chrono::steady_clock::now();
    if (health_changed.exchange(false) || now >= next_publish) {
      const auto health = monitor ? monitor->Snapshot() : std::map<std::string, gpu::DeviceHealth>{};
      dra::PoolOptions with_taints = pool;
      with_taints.taints = dra::HealthTaints(inv, health, to);
      auto slices = dra::BuildPool(inv, in->mig, with_taints);
      if (!slices.ok()) {
        err << "kgpu dra: " << slices.status().message() << "\n";
        return 1;
      }
      server->SetHealth(dra::HealthReports(
          *slices, inv, in->mig, health,
          std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
              .count()));
      auto published = publisher.Publish(*slices);
      if (published.ok()) {
        if (published->changed || published->generation != last_generation) {
          log->info("ResourceSlices of pool {}: generation {}, {} written, {} deleted", pool.node_name,
                    published->generation, published->written, published->deleted);
        }
        last_generation = published->generation;
        backoff.Reset();
        next_publish = now + flags.resync;
      } else {
        const auto wait = backoff.Next();
        log->warn("publishing ResourceSlices: {} (again in {} ms)", std::string(published.status().message()),
                  wait.count());
        health_changed = false;
        next_publish = now + wait;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  server->Stop();
  if (monitor) monitor->Stop();
  log->info("stopped; the ResourceSlices stay published (kubelet withdraws them when the driver is gone)");
  return 0;
}

int RunDraSlices(const NodeOptions& node, const DevicePluginFlags& plugin, const DraFlags& flags, std::ostream& out,
                 std::ostream& err) {
  auto cs = OpenConfiguredSession(node, plugin);
  if (!cs.ok()) {
    err << "kgpu dra slices: " << cs.status().message() << "\n";
    return 1;
  }
  auto slices = NodeSlices(*cs, flags);
  if (!slices.ok()) {
    err << "kgpu dra slices: " << slices.status().message() << "\n";
    return 1;
  }
  nlohmann::json list = {{"apiVersion", "v1"}, {"kind", "List"}, {"items", nlohmann::json::array()}};
  for (const auto& s : *slices) list["items"].push_back(api::dra::ToJson(s));
  out << list.dump(2) << "\n";
  return 0;
}

}  // namespace kgpu::cli
