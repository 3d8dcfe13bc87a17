#include "cli/mig_cmd.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/duration.h"
#include "common/progress.h"
#include "common/strings.h"
#include "deviceplugin/config.h"
#include "deviceplugin/server.h"
#include "gpu/mig_layout.h"
#include "kubelet/podresources.h"

namespace kgpu::cli {
namespace {

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

// "GPU-x::3" → "GPU-x" (replica IDs name their GPU or MIG device first).
std::string Physical(const std::string& id) {
  const auto pos = id.find("::");
  return pos == std::string::npos ? id : id.substr(0, pos);
}

// Who holds GPU `g` or one of its MIG devices: pods (from kubelet) and processes (from NVML).
std::vector<std::string> Holders(const nvml::Library& lib, const gpu::Gpu& g,
                                 const std::vector<kubelet::DeviceAllocation>& allocations) {
  std::vector<std::string> out;
  std::map<std::string, std::string> ours{{g.uuid, "the whole GPU"}};
  for (const auto& m : g.migs) ours[m.uuid] = Cat("MIG ", m.profile, " (GI ", m.gi, ")");
  for (const auto& a : allocations) {
    auto it = ours.find(Physical(a.device_id));
    if (it == ours.end()) continue;
    out.push_back(Cat("pod ", a.pod.namespace_name, "/", a.pod.pod,
                      a.pod.container.empty() ? "" : Cat(" container ", a.pod.container), " holds ", a.device_id, " (",
                      a.resource, ", ", it->second, ")"));
  }
  std::vector<nvml::Device> handles{g.handle};
  for (const auto& m : g.migs) handles.push_back(m.handle);
  for (const auto& h : handles) {
    auto procs = lib.ComputeProcesses(h);
    if (!procs.ok()) {
      // MIG handles of some drivers do not list processes (the GPU's list has them); without the
      // GPU's own list nobody can say the GPU is idle.
      if (h == g.handle)
        out.push_back(Cat("unknown: NVML cannot list the GPU's processes (", procs.status().message(), ")"));
      continue;
    }
    for (const auto& p : *procs) {
      const std::string where = p.gi != nvml::kNoInstanceId ? Cat(" in GPU instance ", p.gi) : "";
      std::string line = Cat("process ", p.pid, where, " uses ", p.used_bytes >> 20, " MiB");
      if (std::find(out.begin(), out.end(), line) == out.end()) out.push_back(line);
    }
  }
  return out;
}

struct Loaded {
  deviceplugin::Config config;
  std::string layout_name;
};

absl::StatusOr<Loaded> LoadLayouts(const MigFlags& flags, bool need_layout) {
  Loaded l;
  if (!flags.config_file.empty()) {
    auto c = deviceplugin::LoadConfigFile(flags.config_file, {.allow_empty = flags.allow_empty_config});
    if (!c.ok()) return c.status();
    l.config = std::move(*c);
  }
  if (!need_layout) return l;
  if (l.config.mig.layouts.empty()) {
    return absl::InvalidArgumentError(
        Cat(flags.config_file.empty() ? "no --config-file given" : Cat(flags.config_file, " declares no mig.layouts"),
            "; declare layouts under mig.layouts in the device plugin's config file (see docs/mig-mps.md, "
            "section Re-partitioning)"));
  }
  if (!flags.layout.empty()) {
    l.layout_name = flags.layout;
  } else {
    const std::string node = !flags.node_name.empty() ? flags.node_name : HostName();
    auto name = deviceplugin::LayoutForNode(l.config.mig, node);
    if (!name.ok()) {
      const std::string& where = l.config.mig.nodes_position;
      return absl::InvalidArgumentError(
          Cat(where.empty() ? Cat(flags.config_file, ": mig.nodes is not set") : Cat(where, ": mig.nodes"), ": ",
              name.status().message()));
    }
    l.layout_name = *name;
  }
  if (l.config.mig.layouts.count(l.layout_name) == 0) {
    std::vector<std::string> names;
    for (const auto& [n, layout] : l.config.mig.layouts) names.push_back(n);
    return absl::InvalidArgumentError(
        Cat(flags.config_file, ": no MIG layout '", l.layout_name, "' (declared: ", Join(names, ", "), ")"));
  }
  return l;
}

std::string Instances(const std::vector<std::string>& names) {
  return gpu::DescribeInstances(names);
}

// Until every plugin serving in `kubelet_dir` reports the devices in `ids` Unhealthy (up to 5 s),
// with progress on a terminal (devices drained of those offered at first). No plugin running:
// nothing to wait for.
void WaitForDrain(const std::string& kubelet_dir, const std::set<std::string>& ids, bool quiet, std::ostream& out) {
  if (ids.empty()) return;
  const auto sockets = deviceplugin::PluginSockets(kubelet_dir);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::optional<Progress> progress;
  size_t first = 0, drained = 0;
  for (;;) {
    std::vector<std::string> pending;
    for (const auto& s : sockets) {
      auto devices = deviceplugin::ReadAdvertised(Cat(kubelet_dir, "/", s), std::chrono::seconds(1));
      if (!devices.ok()) continue;  // a dead socket offers nothing
      for (const auto& d : *devices) {
        if (d.healthy && ids.count(Physical(d.id)) != 0) pending.push_back(d.id);
      }
    }
    if (pending.empty()) return;
    if (!progress) {
      first = pending.size();
      progress.emplace(std::cerr, ProgressWanted(STDERR_FILENO, quiet), "kgpu mig apply: draining", first, "devices");
    }
    if (first > pending.size() && first - pending.size() > drained) {
      progress->Advance(first - pending.size() - drained);
      drained = first - pending.size();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      progress->Print(out, Cat("note: the device plugin still offers ", pending.size(),
                               " device(s) of the GPUs to change (is it a kgpu plugin?); relying on kubelet's "
                               "answer alone\n"));
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::pair<CLI::App*, CLI::App*> AddMigCommands(CLI::App* mig, MigFlags* flags) {
  mig->require_subcommand(1);
  auto* show = mig->add_subcommand("show", "each GPU's MIG mode, instances and profiles, and the declared layouts");
  auto* apply = mig->add_subcommand(
      "apply", "re-partition GPUs to a declared layout; refused while a pod or process uses a GPU it changes");
  for (auto* cmd : {show, apply}) {
    cmd->add_option("--config-file", flags->config_file, "the device plugin's config file (mig.layouts, mig.nodes)")
        ->envname("CONFIG_FILE");
    cmd->add_flag("--allow-empty-config", flags->allow_empty_config, "accept an empty --config-file")
        ->envname("KGPU_ALLOW_EMPTY_CONFIG");
  }
  apply->add_option("--layout", flags->layout, "layout name (default: the mig.nodes entry matching this node)");
  apply->add_option("--node-name", flags->node_name, "this node's name for mig.nodes (default: host name)")
      ->envname("NODE_NAME");
  apply->add_option("--gpu", flags->gpus, "apply only to these GPU indices (repeatable)");
  flags->pod_resources_socket = kubelet::kPodResourcesSocket;
  apply->add_option("--pod-resources-socket", flags->pod_resources_socket, "kubelet's PodResources socket")
      ->envname("KGPU_POD_RESOURCES_SOCKET")
      ->capture_default_str();
  apply->add_flag("--no-kubelet-check", flags->no_kubelet_check,
                  "do not ask kubelet which pods hold GPUs (only when kubelet is stopped on purpose)");
  apply->add_flag("--dry-run", flags->dry_run, "print what would change, change nothing");
  apply->add_flag("--quiet", flags->quiet, "no progress line on a terminal (draining, GPUs changed)");
  apply
      ->add_option("--kubelet-dir", flags->kubelet_dir,
                   "kubelet's device-plugin directory: the plugin stops offering a GPU marked here while it changes")
      ->envname("KGPU_KUBELET_DIR")
      ->capture_default_str();
  flags->lock_file =
      std::filesystem::is_directory("/run/lock") ? "/run/lock/kgpu-mig-apply.lock" : "/tmp/kgpu-mig-apply.lock";
  apply->add_option("--lock-file", flags->lock_file, "held while applying: one apply at a time per node")
      ->envname("KGPU_MIG_LOCK_FILE")
      ->capture_default_str();
  return {show, apply};
}

int RunMigShow(const NodeOptions& node, const MigFlags& flags, std::ostream& out) {
  auto session = OpenSession(node);
  if (!session.ok()) {
    out << "kgpu mig show: " << session.status().message() << "\n";
    return 1;
  }
  for (const auto& g : session->inventory->gpus()) {
    out << "GPU " << g.index << " " << g.name << " " << g.uuid << "\n";
    if (!g.mig_capable) {
      out << "  MIG: not supported\n";
      continue;
    }
    out << "  MIG: " << (g.mig_enabled ? "enabled" : "disabled")
        << (g.mig_pending ? " (change pending a GPU reset)" : "") << "\n";
    std::vector<std::string> instances;
    for (const auto& m : g.migs) instances.push_back(m.profile);
    if (g.mig_enabled) out << "  instances: " << Instances(instances) << "\n";
    auto profiles = gpu::MigProfiles(*session->lib, g);
    if (profiles.ok()) {
      std::vector<std::string> names;
      for (const auto& [p, name] : *profiles) names.push_back(Cat(name, " (max ", p.max_instances, ")"));
      out << "  profiles: " << Join(names, ", ") << "\n";
    }
  }
  auto loaded = LoadLayouts(flags, false);
  if (!loaded.ok()) {
    out << "kgpu mig show: " << loaded.status().message() << "\n";
    return 1;
  }
  for (const auto& [name, layout] : loaded->config.mig.layouts) {
    out << "layout " << name << ":\n";
    for (const auto& e : layout) {
      std::vector<std::string> parts;
      for (const auto& [p, n] : e.mig_devices) parts.push_back(Cat(n, "x ", p));
      out << "  GPUs " << (e.devices.empty() ? "all" : Join(e.devices, ",")) << ": "
          << (e.mig_enabled ? Instances(parts) : "MIG disabled") << "\n";
    }
  }
  return 0;
}

int RunMigApply(const NodeOptions& node, const MigFlags& flags, std::ostream& out) {
  auto loaded = LoadLayouts(flags, true);
  if (!loaded.ok()) {
    out << "kgpu mig apply: " << loaded.status().message() << "\n";
    return 1;
  }
  // One apply at a time on a node: two interleaved ones would destroy each other's instances.
  // Taken before reading the GPUs, so the plan and the busy check see what the other one left.
  const int lock_fd = ::open(flags.lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    out << "kgpu mig apply: cannot open the lock file " << flags.lock_file << ": " << std::strerror(errno)
        << " (choose another with --lock-file)\n";
    return 1;
  }
  bool locked = false;
  for (int i = 0; i < 300 && !locked; ++i) {  // wait up to 30 s for another apply to finish
    locked = ::flock(lock_fd, LOCK_EX | LOCK_NB) == 0;
    if (!locked) {
      if (i == 0) out << "waiting for another kgpu mig apply on this node (it holds " << flags.lock_file << ")\n";
      ::usleep(100000);
    }
  }
  if (!locked) {
    out << "kgpu mig apply: refused: another kgpu mig apply has held " << flags.lock_file
        << " for 30 s; try again when it has finished\n";
    ::close(lock_fd);
    return 1;
  }
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{lock_fd};
  auto session = OpenSession(node);
  if (!session.ok()) {
    out << "kgpu mig apply: " << session.status().message() << "\n";
    return 1;
  }
  const nvml::Library& lib = *session->lib;
  const gpu::Inventory& inv = *session->inventory;
  const gpu::MigLayout& layout = loaded->config.mig.layouts.at(loaded->layout_name);
  const auto pos = loaded->config.mig.positions.find(loaded->layout_name);
  const std::vector<std::string> positions =
      pos != loaded->config.mig.positions.end() ? pos->second : std::vector<std::string>{};
  auto targets = gpu::ResolveMigLayout(layout, inv, loaded->layout_name, positions);
  // "file:line:col: " of the entry that selects GPU `index` (entries select disjoint GPUs).
  auto entry_at = [&](unsigned index) -> std::string {
    for (size_t e = 0; e < layout.size() && e < positions.size(); ++e) {
      const auto& d = layout[e].devices;
      if (d.empty() || std::find(d.begin(), d.end(), index) != d.end()) return positions[e] + ": ";
    }
    return "";
  };
  if (!targets.ok()) {
    out << "kgpu mig apply: " << targets.status().message() << "\n";  // starts with file:line:col
    return 1;
  }
  for (unsigned index : flags.gpus) {
    if (std::none_of(targets->begin(), targets->end(), [&](const gpu::MigTarget& t) { return t.gpu == index; })) {
      out << "kgpu mig apply: --gpu " << index << ": layout '" << loaded->layout_name << "' does not cover GPU "
          << index << "\n";
      return 1;
    }
  }
  // Plan every GPU first: a layout that does not fit fails before anything changes.
  std::vector<gpu::MigChange> changes;
  for (const auto& t : *targets) {
    if (!flags.gpus.empty() && std::find(flags.gpus.begin(), flags.gpus.end(), t.gpu) == flags.gpus.end()) continue;
    const gpu::Gpu& g = inv.gpus()[t.gpu];
    auto change = gpu::PlanMigChange(lib, g, t);
    if (!change.ok()) {
      out << "kgpu mig apply: " << entry_at(t.gpu) << "layout '" << loaded->layout_name
          << "': " << change.status().message() << "\n";
      return 1;
    }
    if (change->noop()) {
      out << "GPU " << t.gpu << ": already " << Instances(change->wanted) << ", nothing to do\n";
      continue;
    }
    changes.push_back(std::move(*change));
  }
  if (changes.empty()) return 0;
  // Drain: mark the GPUs, so the device plugin reports their devices Unhealthy and kubelet admits
  // no new pod to them between the busy check below and the change. The markers go when this ends.
  struct Markers {
    std::vector<std::string> paths;
    ~Markers() {
      for (const auto& p : paths) ::unlink(p.c_str());
    }
  } markers;
  std::set<std::string> draining;  // GPU and MIG UUIDs of the GPUs to change
  if (!flags.dry_run) {
    for (const auto& c : changes) {
      const gpu::Gpu& g = inv.gpus()[c.gpu];
      const std::string path = Cat(flags.kubelet_dir, "/", deviceplugin::kDrainPrefix, g.uuid);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) {
        out << "note: cannot mark GPU " << c.gpu << " in " << flags.kubelet_dir << " (" << std::strerror(errno)
            << "): the device plugin keeps offering it while it changes; cordon the node, or pass --kubelet-dir\n";
        continue;
      }
      ::close(fd);
      markers.paths.push_back(path);
      draining.insert(g.uuid);
      for (const auto& m : g.migs) draining.insert(m.uuid);
    }
    WaitForDrain(flags.kubelet_dir, draining, flags.quiet, out);
  }
  // Busy check: kubelet's view (pods holding devices) and NVML's (processes).
  std::vector<kubelet::DeviceAllocation> allocations;
  if (!flags.no_kubelet_check) {
    auto listed = kubelet::ListPodResources(flags.pod_resources_socket, std::chrono::seconds(5));
    if (!listed.ok()) {
      out << "kgpu mig apply: refused: cannot tell which pods hold GPUs: " << listed.status().message()
          << "\n  (pass --no-kubelet-check only when kubelet is stopped on purpose)\n";
      return 1;
    }
    allocations = std::move(*listed);
  }
  bool busy = false;
  for (const auto& c : changes) {
    const auto holders = Holders(lib, inv.gpus()[c.gpu], allocations);
    if (holders.empty()) continue;
    busy = true;
    out << "GPU " << c.gpu << " is busy, refusing to change it (" << Instances(c.current) << " -> "
        << Instances(c.wanted) << "):\n";
    for (const auto& h : holders) out << "  " << h << "\n";
  }
  if (busy) {
    out << "kgpu mig apply: refused: nothing was changed. Drain the pods (kubectl drain, or delete them), or "
           "apply to the idle GPUs only with --gpu.\n";
    return 1;
  }
  int rc = 0;
  // On a real GPU each change takes seconds (instances destroyed and created, a mode change resets
  // the GPU): progress on a terminal, each GPU's line printed as it is done.
  Progress progress(std::cerr, !flags.dry_run && ProgressWanted(STDERR_FILENO, flags.quiet), "kgpu mig apply",
                    changes.size(), "GPUs");
  for (const auto& c : changes) {
    if (flags.dry_run) {
      out << "GPU " << c.gpu << ": would change " << Instances(c.current) << " -> " << Instances(c.wanted) << "\n";
      continue;
    }
    auto result = gpu::ApplyMigChange(lib, inv.gpus()[c.gpu], c);
    progress.Advance();
    if (!result.ok()) {
      progress.Print(out, Cat("kgpu mig apply: ", result.status().message(), "\n"));
      rc = 1;
      continue;
    }
    progress.Print(out, result->note + "\n");
  }
  if (!flags.dry_run && rc == 0) {
    const std::string interval = FormatGoDuration(loaded->config.mig.rescan_interval);
    progress.Print(out, Cat("applied layout '", loaded->layout_name,
                            "'; the device plugin follows on NVML's MIG event, at the latest after "
                            "mig.rescanInterval (",
                            interval, ")\n"));
  }
  return rc;
}

}  // namespace kgpu::cli
