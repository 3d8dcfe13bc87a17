#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/statfs.h>

#include "cli/commands.h"
#include "cli/doctor_cluster.h"
#include "common/strings.h"
#include "deviceplugin/health_file.h"
#include "deviceplugin/mps.h"
#include "deviceplugin/server.h"
#include "gpu/inventory.h"
#include "nvml/library.h"

namespace kgpu::cli {
namespace {

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass:
      return "PASS";
    case Verdict::kWarn:
      return "WARN";
    case Verdict::kFail:
      return "FAIL";
  }
  return "?";
}

// Missing or not-a-character-device paths among `paths`.
void CheckNodes(const std::vector<std::string>& paths, std::vector<std::string>* missing,
                std::vector<std::string>* not_char) {
  for (const auto& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      missing->push_back(p);
    } else if (!S_ISCHR(st.st_mode)) {
      not_char->push_back(p);
    }
  }
}

// What each device plugin socket in the kubelet directory advertises: resources with zero devices
// (their MIG instances are gone; pods asking for them stay Pending) and unhealthy devices.
// Returns whether a plugin answers ListAndWatch.
bool CheckPlugins(const NodeOptions& options, std::vector<Check>* checks) {
  const std::vector<std::string> sockets = deviceplugin::PluginSockets(options.kubelet_dir);
  if (sockets.empty()) {
    checks->push_back({"Device plugin", Verdict::kWarn, Cat("no plugin socket in ", options.kubelet_dir),
                       "run kgpu device-plugin (deploy/device-plugin) and mount the host's kubelet device-plugin "
                       "directory; use --kubelet-dir when kubelet uses another root"});
    return false;
  }
  std::vector<std::string> served, empty, unhealthy, dead;
  for (const auto& s : sockets) {
    // nvidia-mig-1g.10gb.sock -> nvidia.com/mig-1g.10gb (NVIDIA's and kgpu's socket naming).
    std::string resource = s.substr(0, s.size() - 5);
    if (resource.rfind("nvidia-", 0) == 0) resource = "nvidia.com/" + resource.substr(7);
    auto devices = deviceplugin::ReadAdvertised(Cat(options.kubelet_dir, "/", s), std::chrono::seconds(2));
    if (!devices.ok()) {
      dead.push_back(Cat(s, " (", devices.status().message(), ")"));
      continue;
    }
    const auto healthy = std::count_if(devices->begin(), devices->end(), [](const auto& d) { return d.healthy; });
    served.push_back(Cat(resource, "=", devices->size()));
    if (devices->empty()) empty.push_back(resource);
    if (healthy < static_cast<long>(devices->size())) {
      unhealthy.push_back(Cat(resource, " ", devices->size() - static_cast<size_t>(healthy), " of ", devices->size()));
    }
  }
  if (!dead.empty()) {
    checks->push_back({"Device plugin", Verdict::kFail, Cat("not answering: ", Join(dead, "; ")),
                       "a plugin died and left its socket: check its pod (kubectl -n kube-system logs ...) and restart "
                       "it; kubelet advertises nothing for these until it re-registers"});
  }
  if (dead.empty()) checks->push_back({"Device plugin", Verdict::kPass, Cat("advertising ", Join(served, ", ")), ""});
  std::error_code ec;
  std::vector<std::string> drains;
  for (const auto& e : std::filesystem::directory_iterator(options.kubelet_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(deviceplugin::kDrainPrefix, 0) == 0) drains.push_back(e.path().string());
  }
  if (!drains.empty()) {
    checks->push_back({"MIG re-partitioning", Verdict::kWarn,
                       Cat("GPUs marked as being re-partitioned: ", Join(drains, ", ")),
                       "their devices are Unhealthy while the marker exists; if no `kgpu mig apply` is running (it "
                       "removes its markers when it ends), delete the files"});
  }
  if (!empty.empty()) {
    checks->push_back({"Zero-device resources", Verdict::kWarn,
                       Cat(Join(empty, ", "), " advertised with 0 devices (their MIG instances no longer exist)"),
                       "pods requesting them stay Pending: move those workloads to a resource this node has "
                       "(kgpu mig show), or apply a MIG layout that has it (kgpu mig apply)"});
  }
  if (!unhealthy.empty()) {
    checks->push_back({"Device health", Verdict::kWarn, Cat("Unhealthy: ", Join(unhealthy, "; ")),
                       "see `kgpu health` and the plugin log for the XID or probe that failed; for MPS resources, the "
                       "MPS check below"});
  }
  return !served.empty();
}

// MPS control daemons under mpsRoot: each <resource>/pipe answers, .ready exists, shm is a tmpfs.
void CheckMps(const NodeOptions& options, std::vector<Check>* checks) {
  std::error_code ec;
  const std::filesystem::path root = std::filesystem::path(options.mps_root).lexically_normal();
  if (!std::filesystem::is_directory(root, ec)) {
    checks->push_back({"MPS daemons", Verdict::kPass, Cat("MPS not in use (no ", options.mps_root, ")"), ""});
    return;
  }
  // The daemons that were started: <resource>/.started (a stopped one removes it; its pipe
  // directory stays behind and means nothing).
  std::vector<std::filesystem::path> dirs;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it.depth() > 3) it.disable_recursion_pending();
    if (it->path().filename() == ".started") dirs.push_back(it->path().parent_path());
  }
  std::sort(dirs.begin(), dirs.end());
  if (dirs.empty()) {
    checks->push_back(
        {"MPS daemons", Verdict::kPass, Cat("MPS not in use (no daemon started under ", options.mps_root, ")"), ""});
    return;
  }
  std::vector<std::string> down, up;
  for (const auto& dir : dirs) {
    const std::string pipe = (dir / "pipe").string();
    const std::string resource = dir.lexically_relative(root).string();
    auto reply = deviceplugin::MpsCommand(options.mps_control, pipe, "get_default_active_thread_percentage",
                                          std::chrono::seconds(3));
    if (reply.ok()) {
      up.push_back(Cat(resource, " (", *reply, "% threads per client)"));
    } else {
      down.push_back(Cat(resource, ": ", reply.status().message()));
    }
  }
  if (!down.empty()) {
    checks->push_back(
        {"MPS daemons", Verdict::kFail, Cat("not ready: ", Join(down, "; ")),
         Cat("kgpu device-plugin starts and restarts the daemons (sharing.mps): check its log and ", options.mps_root,
             "/<resource>/log/control.log; until a daemon answers, its resource's "
             "devices are Unhealthy")});
  } else if (!std::filesystem::exists(options.mps_root + "/.ready")) {
    checks->push_back({"MPS daemons", Verdict::kWarn,
                       Cat(Join(up, ", "), " answer, but ", options.mps_root, "/.ready is missing"),
                       "the plugin writes .ready when every daemon is up; check its log"});
  } else {
    checks->push_back({"MPS daemons", Verdict::kPass, Cat("ready: ", Join(up, ", ")), ""});
  }
  // MPS clients share memory through <mpsRoot>/shm (their /dev/shm): on disk it is slow and
  // survives reboots with stale segments.
  const std::string shm = (root / "shm").string();
  struct statfs fs {};
  if (::statfs(shm.c_str(), &fs) == 0 && static_cast<unsigned long>(fs.f_type) != 0x01021994UL) {
    checks->push_back({"MPS shared memory", Verdict::kWarn, Cat(shm, " is not a tmpfs"),
                       Cat("mount one before the plugin starts: mount -t tmpfs -o size=50% tmpfs ", shm,
                           " (NVIDIA's mps-control-daemon does this in an init container)")});
  }
}

}  // namespace

std::vector<Check> DoctorChecks(const NodeOptions& options) {
  // Every check runs, whatever failed before it; one that depends on something missing says what
  // it could not check and why.
  std::vector<Check> checks;
  const std::string no_nvml = "not checked: NVML is not available (see the NVML library check)";
  std::shared_ptr<nvml::Library> lib;
  if (auto opened = nvml::Library::Open({options.nvml_library}); opened.ok()) {
    lib = std::move(*opened);
    checks.push_back({"NVML library", Verdict::kPass, Cat("loaded ", lib->path()), ""});
  } else {
    checks.push_back({"NVML library", Verdict::kFail, std::string(opened.status().message()),
                      "install the NVIDIA driver (its user-space libnvidia-ml.so.1), or set "
                      "--nvml-library / KGPU_NVML_LIBRARY to the library's path"});
  }

  if (!lib) {
    checks.push_back({"Driver version", Verdict::kWarn, no_nvml, "fix the NVML library check first"});
  } else if (auto driver = lib->DriverVersion(); driver.ok()) {
    auto cuda = lib->CudaDriverVersion();
    checks.push_back(
        {"Driver version", Verdict::kPass,
         Cat(*driver, cuda.ok() ? Cat(" (CUDA ", *cuda / 1000, ".", (*cuda % 1000) / 10, ")") : std::string()), ""});
  } else {
    checks.push_back({"Driver version", Verdict::kWarn, std::string(driver.status().message()),
                      "the driver and libnvidia-ml.so.1 may be from different releases: reinstall "
                      "the driver so both match"});
  }

  std::shared_ptr<const gpu::Inventory> inventory;
  if (!lib) {
    checks.push_back({"GPUs enumerable", Verdict::kFail, no_nvml, "fix the NVML library check first"});
  } else {
    auto inv = options.nvml_deadline.count() > 0
                   ? gpu::Inventory::Discover(lib, {options.sysfs_root}, options.nvml_deadline)
                   : gpu::Inventory::Discover(*lib, {options.sysfs_root});
    if (!inv.ok() || (*inv)->gpus().empty()) {
      checks.push_back({"GPUs enumerable", Verdict::kFail,
                        inv.ok() ? "NVML reports 0 GPUs" : std::string(inv.status().message()),
                        "check `lspci | grep -i nvidia` and `dmesg | grep -i nvrm`; in a container, "
                        "NVIDIA_VISIBLE_DEVICES=all and the NVIDIA runtime are needed"});
    } else {
      inventory = *inv;
      const auto& gpus = inventory->gpus();
      checks.push_back({"GPUs enumerable", Verdict::kPass, Cat(gpus.size(), " GPU(s): ", gpus[0].name), ""});
    }
  }
  static const std::vector<gpu::Gpu> kNoGpus;
  const std::vector<gpu::Gpu>& gpus = inventory ? inventory->gpus() : kNoGpus;

  // Device nodes the container runtime and the device plugin hand to pods. Without an inventory
  // only the GPU-independent ones can be checked.
  const std::string dev = options.dev_dir.empty() ? "/dev" : options.dev_dir;
  std::vector<std::string> nodes = {dev + "/nvidiactl", dev + "/nvidia-uvm"};
  for (const auto& g : gpus) {
    if (g.error.empty()) nodes.push_back(Cat(dev, "/nvidia", g.minor));
  }
  const std::string per_gpu =
      inventory ? std::string() : "; the per-GPU nodes (/dev/nvidiaN) not checked: no GPU was enumerated";
  std::vector<std::string> missing, not_char;
  CheckNodes(nodes, &missing, &not_char);
  if (!missing.empty()) {
    checks.push_back({"Device nodes", Verdict::kFail, Cat("missing: ", Join(missing, ", "), per_gpu),
                      "load the kernel modules and create the nodes (`nvidia-modprobe -c 0 -u`, or "
                      "`nvidia-smi` once as root); in a container, mount the host's /dev"});
  } else if (!not_char.empty()) {
    checks.push_back({"Device nodes", Verdict::kWarn, Cat("not character devices: ", Join(not_char, ", "), per_gpu),
                      "these paths exist but are not device nodes; pods given them cannot reach the GPU"});
  } else {
    checks.push_back({"Device nodes", inventory ? Verdict::kPass : Verdict::kWarn,
                      Cat(nodes.size(), " present", per_gpu), inventory ? "" : "fix the GPU checks above first"});
  }

  // The plugin's checks run now (their output follows "GPUs healthy"): GPU health comes from NVML
  // and from what the plugin serves.
  std::vector<Check> plugin_checks;
  const bool plugin_answers = CheckPlugins(options, &plugin_checks);
  std::vector<deviceplugin::ServedHealth> served;
  if (plugin_answers) {
    if (auto file = deviceplugin::ReadHealthFile(options.kubelet_dir); file.ok()) served = std::move(*file);
  }
  // UUIDs NVML cannot give (a hung or lost GPU): the plugin's state names them, even a stale one
  // (a GPU's UUID does not change); a live plugin's state wins.
  std::map<unsigned, std::string> served_uuid = PluginGpuUuids(options);
  for (const auto& d : served) {
    if (!d.mig && d.gpu >= 0) served_uuid[static_cast<unsigned>(d.gpu)] = d.id;
  }
  auto uuid_of = [&](const gpu::Gpu& g) -> std::string {
    if (!g.uuid.empty()) return g.uuid;
    const auto it = served_uuid.find(g.index);
    return it != served_uuid.end()
               ? it->second
               : Cat("unknown (NVML did not answer; no kgpu device plugin state in ", options.kubelet_dir, ")");
  };
  std::vector<std::string> bad, pending;
  std::set<std::string> named;  // device IDs already reported from NVML
  std::set<int> bad_index;      // and their GPU indices (their MIG devices need no line of their own)
  for (const auto& g : gpus) {
    if (g.lost) {
      bad.push_back(Cat("GPU ", g.index, " is lost (fell off the bus), UUID ", uuid_of(g)));
    } else if (g.hung) {
      bad.push_back(Cat("GPU ", g.index, " is hung: ", g.error, ", UUID ", uuid_of(g)));
    } else if (!g.error.empty()) {
      bad.push_back(Cat("GPU ", g.index, ": ", g.error, ", UUID ", uuid_of(g)));
    } else if (g.mig_pending) {
      pending.push_back(Cat("GPU ", g.index));
    }
    if (!g.error.empty()) {
      named.insert(uuid_of(g));
      bad_index.insert(static_cast<int>(g.index));
    }
  }
  for (const auto& d : served) {
    if (d.healthy || named.count(d.id) != 0 || bad_index.count(d.gpu) != 0) continue;
    const std::string gpu = d.gpu >= 0 ? Cat("GPU ", d.gpu) : std::string("a GPU");
    bad.push_back(Cat(gpu, d.mig ? Cat(" MIG device ", d.id) : std::string(), " is Unhealthy in the device plugin: ",
                      d.reason.empty() ? std::string("no reason given") : d.reason,
                      d.mig ? std::string() : Cat(", UUID ", d.id)));
  }
  if (!bad.empty()) {
    checks.push_back({"GPUs healthy", Verdict::kFail, Join(bad, "; "),
                      "drain the node and reset the GPU (`nvidia-smi -r -i <index>`) or reboot; a "
                      "GPU that stays lost or hung needs a hardware check; `kgpu health` shows the faults as they "
                      "happen"});
  } else if (!pending.empty()) {
    checks.push_back({"GPUs healthy", Verdict::kWarn, Cat("MIG mode change pending a reset on ", Join(pending, ", ")),
                      "stop the GPU's workloads and reset it (`nvidia-smi -r -i <index>`) to apply "
                      "the MIG mode"});
  } else if (!inventory) {
    checks.push_back({"GPUs healthy", Verdict::kWarn,
                      Cat("not checked through NVML: no GPU was enumerated",
                          plugin_answers ? (served.empty() ? "; the device plugin serves no health state here"
                                                           : "; the device plugin serves every device Healthy")
                                         : "; no device plugin answers either"),
                      "fix the GPU checks above first"});
  } else {
    checks.push_back({"GPUs healthy", Verdict::kPass,
                      Cat("all ", gpus.size(), " readable",
                          served.empty() ? std::string() : "; the device plugin serves every device Healthy"),
                      ""});
  }
  for (auto& c : plugin_checks) checks.push_back(std::move(c));
  CheckMps(options, &checks);
  if (!options.kubeconfig.empty() || options.in_cluster) {
    for (auto& c : ClusterChecks(options, gpus.size())) checks.push_back(std::move(c));
  }
  return checks;
}

int RunDoctor(const NodeOptions& options, bool json, std::ostream& out) {
  const auto checks = DoctorChecks(options);
  bool failed = false;
  nlohmann::json j = nlohmann::json::array();
  for (const auto& c : checks) {
    failed = failed || c.verdict == Verdict::kFail;
    if (json) {
      j.push_back({{"check", c.name}, {"result", VerdictName(c.verdict)}, {"detail", c.detail}, {"fix", c.fix}});
      continue;
    }
    out << "[" << VerdictName(c.verdict) << "] " << c.name;
    for (size_t i = c.name.size(); i < 23; ++i) out << ' ';
    out << c.detail << "\n";
    if (!c.fix.empty()) out << "       fix: " << c.fix << "\n";
  }
  const bool plugin = std::any_of(checks.begin(), checks.end(), [](const Check& c) {
    return c.name == "Device plugin" && c.verdict == Verdict::kPass;
  });
  if (json) {
    out << j.dump(2) << "\n";
  } else if (failed) {
    out << "\nnvidia.com/gpu will NOT be usable on this node until the FAIL items are fixed.\n";
  } else if (!plugin) {
    out << "\nNo FAIL, but no device plugin answers on this node: nvidia.com/gpu is advertised only once one "
           "runs (see the Device plugin check).\n";
  } else {
    out << "\nThis node can advertise nvidia.com/gpu.\n";
  }
  return failed ? 1 : 0;
}

}  // namespace kgpu::cli
