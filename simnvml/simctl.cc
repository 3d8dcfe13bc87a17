// kgpu-simctl: changes the live state of a simulated NVML node while its clients run.
// It opens the same shared state as libnvidia-ml.so.1 (KGPU_SIM_NODE, KGPU_SIM_STATE,
// KGPU_SIM_NODE_NAME) so every process using that node sees the change, and injected events
// wake waiters in nvmlEventSetWait at once.

#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "node.h"

namespace kgpu::sim {
namespace {

constexpr uint64_t kXidEvent = 0x8, kSbeEvent = 0x1, kDbeEvent = 0x2;

int Fail(const std::string& msg) {
  std::cerr << "kgpu-simctl: " << msg << "\n";
  return 1;
}

// GPU index, UUID or bus id -> index.
bool ResolveGpu(const Node& node, const std::string& spec, unsigned* gpu) {
  for (unsigned i = 0; i < node.gpu_count(); ++i) {
    if (spec == node.uuid(i) || spec == node.BusId(i) || spec == std::to_string(i)) {
      *gpu = i;
      return true;
    }
  }
  return false;
}

// The driver's MIG capability numbering (nvidia-caps): config 1, monitor 2, then per GPU (by minor
// number) 15 GPU instances of 1 + 8 compute-instance minors: gpu0/gi1/access is 12.
constexpr unsigned kGisPerGpu = 15, kCisPerGi = 8;
unsigned GiMinor(unsigned gpu_minor, unsigned gi) {
  return 3 + (gpu_minor * kGisPerGpu + gi) * (1 + kCisPerGi);
}
unsigned CiMinor(unsigned gpu_minor, unsigned gi, unsigned ci) {
  return GiMinor(gpu_minor, gi) + 1 + ci;
}

// /proc/driver/nvidia-caps/mig-minors: every capability the driver can create, whether or not
// the instance exists now.
std::string MigMinorsText(const Node& node) {
  std::ostringstream out;
  out << "config 1\nmonitor 2\n";
  for (unsigned g = 0; g < node.gpu_count(); ++g) {  // the simulated GPU's minor is its index
    for (unsigned i = 0; i < kGisPerGpu; ++i) {
      out << "gpu" << g << "/gi" << i << "/access " << GiMinor(g, i) << "\n";
      for (unsigned c = 0; c < kCisPerGi; ++c)
        out << "gpu" << g << "/gi" << i << "/ci" << c << "/access " << CiMinor(g, i, c) << "\n";
    }
  }
  return out.str();
}

// One capability file of /proc/driver/nvidia/capabilities, as the driver prints it (mode in
// decimal: 292 = 0444, 256 = 0400).
std::string CapabilityText(unsigned minor, unsigned mode) {
  return "DeviceFileMinor: " + std::to_string(minor) + "\nDeviceFileMode: " + std::to_string(mode) +
         "\nDeviceFileModify: 1\n";
}

bool WriteText(const std::filesystem::path& path, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out);
}

// The driver's procfs trees under `dir` (a stand-in for /proc): driver/nvidia/version,
// driver/nvidia/gpus/<bus id>/information, driver/nvidia/capabilities/mig/{config,monitor},
// driver/nvidia/capabilities/gpu<minor>/mig/gi<i>[/ci<c>]/access for the instances that exist now,
// and driver/nvidia-caps/mig-minors.
int WriteProcfs(const Node& node, const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path nv = fs::path(dir) / "driver/nvidia";
  std::error_code ec;
  fs::remove_all(nv / "capabilities", ec);  // instances destroyed since the last call go away
  bool ok = WriteText(fs::path(dir) / "driver/nvidia-caps/mig-minors", MigMinorsText(node));
  ok = ok &&
       WriteText(nv / "version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  " + node.profile().driver_version +
                                     "  (kgpu simulated node " + node.profile().name + ")\n");
  ok = ok && WriteText(nv / "capabilities/mig/config", CapabilityText(1, 256));
  ok = ok && WriteText(nv / "capabilities/mig/monitor", CapabilityText(2, 292));
  Node::Locked lock(node);
  for (unsigned g = 0; ok && g < node.gpu_count(); ++g) {
    std::string bus = node.BusId(g).substr(4);  // "0000:18:00.0", lower case, as the driver names it
    for (char& c : bus) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::ostringstream info;
    info << "Model: \t\t " << node.profile().gpus[g].model->name << "\n"
         << "IRQ:   \t\t " << 100 + g << "\n"
         << "GPU UUID: \t " << node.uuid(g) << "\n"
         << "Video BIOS: \t ??.??.??.??.??\n"
         << "Bus Type: \t PCIe\n"
         << "DMA Size: \t 47 bits\n"
         << "DMA Mask: \t 0x7fffffffffff\n"
         << "Bus Location: \t " << bus << "\n"
         << "Device Minor: \t " << g << "\n"
         << "GPU Excluded:\t No\n";
    ok = WriteText(nv / "gpus" / bus / "information", info.str());
    const SimGpu& gpu = lock.gpu(g);
    for (const auto& gi : gpu.gis) {
      if (gi.used == 0 || gi.id >= kGisPerGpu) continue;
      const fs::path gi_dir =
          nv / "capabilities" / ("gpu" + std::to_string(g)) / "mig" / ("gi" + std::to_string(gi.id));
      ok = ok && WriteText(gi_dir / "access", CapabilityText(GiMinor(g, gi.id), 292));
      for (const auto& ci : gi.cis) {
        if (ci.used == 0 || ci.id >= kCisPerGi) continue;
        ok = ok && WriteText(gi_dir / ("ci" + std::to_string(ci.id)) / "access",
                             CapabilityText(CiMinor(g, gi.id, ci.id), 292));
      }
    }
  }
  return ok ? 0 : Fail("cannot write the procfs tree under " + dir);
}

// "0x" and `digits` lower-case hex digits, as sysfs prints PCI ids and classes.
std::string Hex(unsigned value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x\n", digits, value);
  return buf;
}

// The GPUs' PCI functions under `dir` (a stand-in for /sys): bus/pci/devices/<bdf>/ with the files
// kgpu and NVIDIA's tools read there (GPU Feature Discovery's gpu.mode reads `class`; go-nvlib's
// nvpci reads vendor, device and class).
int WriteSysfs(const Node& node, const std::string& dir) {
  namespace fs = std::filesystem;
  bool ok = true;
  for (unsigned i = 0; ok && i < node.gpu_count(); ++i) {
    std::string bdf = node.BusId(i).substr(4);
    for (char& c : bdf) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const fs::path d = fs::path(dir) / "bus/pci/devices" / bdf;
    const GpuSpec& spec = node.profile().gpus[i];
    const GpuModel& model = *spec.model;
    ok = WriteText(d / "class", Hex(spec.pci_class, 6)) &&
         WriteText(d / "vendor", Hex(model.pci_device_id & 0xffff, 4)) &&
         WriteText(d / "device", Hex(model.pci_device_id >> 16, 4)) &&
         WriteText(d / "subsystem_vendor", Hex(model.pci_subsystem_id & 0xffff, 4)) &&
         WriteText(d / "subsystem_device", Hex(model.pci_subsystem_id >> 16, 4)) &&
         WriteText(d / "numa_node", std::to_string(spec.numa_node) + "\n");
  }
  return ok ? 0 : Fail("cannot write the sysfs tree under " + dir);
}

nlohmann::json Show(const Node& node) {
  nlohmann::json out;
  out["profile"] = node.profile().name;
  out["node"] = node.environment().node_name;
  out["state"] = node.environment().state_path;
  out["driver"] = node.profile().driver_version;
  Node::Locked lock(node);
  for (unsigned i = 0; i < node.gpu_count(); ++i) {
    const SimGpu& g = lock.gpu(i);
    nlohmann::json j;
    j["index"] = i;
    j["uuid"] = node.uuid(i);
    j["busId"] = node.BusId(i);
    j["model"] = node.profile().gpus[i].model->name;
    for (const auto& f : LiveFields()) j[f.key] = f.get(g) / f.scale;
    j["lost"] = g.lost != 0;
    j["hung"] = g.hang_until_ns > MonotonicNs();
    j["eccSbe"] = g.ecc_sbe_vol;
    j["eccDbe"] = g.ecc_dbe_vol;
    j["lastXid"] = g.last_xid;
    j["migMode"] = g.mig_current;
    for (unsigned p = 0; p < g.nproc; ++p) {
      const SimProcess& proc = g.procs[p];
      j["processes"].push_back({{"pid", proc.pid},
                                {"memMiB", proc.mem_bytes >> 20},
                                {"smUtil", proc.sm_util},
                                {"memUtil", proc.mem_util},
                                {"gi", proc.gi == kNoId ? -1 : static_cast<int>(proc.gi)},
                                {"ci", proc.ci == kNoId ? -1 : static_cast<int>(proc.ci)}});
    }
    for (const auto& gi : g.gis) {
      if (gi.used == 0) continue;
      const MigProfile* mp = FindMigProfileByIndex(*node.profile().gpus[i].model, gi.profile_index);
      for (const auto& ci : gi.cis) {
        if (ci.used == 0) continue;
        j["mig"].push_back({{"gi", gi.id},
                            {"ci", ci.id},
                            {"profile", mp != nullptr ? mp->name : "?"},
                            {"start", gi.start},
                            {"uuid", MigUuid(node.uuid(i), gi.id, ci.id)}});
      }
    }
    out["gpus"].push_back(j);
  }
  return out;
}

int Run(int argc, char** argv) {
  CLI::App app{
      "kgpu-simctl: inspect and change a simulated NVML node (selected by KGPU_SIM_NODE, "
      "KGPU_SIM_STATE and KGPU_SIM_NODE_NAME, as for the library).\nGPU arguments take an index, "
      "a UUID or a PCI bus id."};
  app.require_subcommand(1);

  auto* profiles = app.add_subcommand("profiles", "list the built-in node profiles and GPU models");
  std::string validate_path;
  auto* validate = app.add_subcommand("validate", "check a node profile YAML file");
  validate->add_option("file", validate_path, "profile file")->required();
  auto* show = app.add_subcommand("show", "print the node's live state as JSON");
  auto* reset = app.add_subcommand("reset", "return the node to the profile's initial state");
  std::string minors_path;
  auto* mig_minors = app.add_subcommand(
      "mig-minors", "write the driver's MIG capability minors file (proc/driver/nvidia-caps/mig-minors)");
  mig_minors->add_option("file", minors_path, "where to write it")->required();
  std::string procfs_dir;
  auto* procfs =
      app.add_subcommand("procfs",
                         "write the driver's procfs trees for this node: DIR/driver/nvidia (gpus/<bus id>/information, "
                         "capabilities/...) and DIR/driver/nvidia-caps/mig-minors");
  procfs->add_option("dir", procfs_dir, "root of the tree (give it to kgpu device-plugin as --proc-root)")->required();
  std::string sysfs_dir;
  auto* sysfs = app.add_subcommand(
      "sysfs",
      "write a sysfs tree with the GPUs' PCI functions: DIR/bus/pci/devices/<bdf>/{class,vendor,device,"
      "subsystem_vendor,subsystem_device,numa_node} (class: the profile's pciClass, 0x030200 by default)");
  sysfs->add_option("dir", sysfs_dir, "root of the tree (give it to kgpu as --sysfs-root)")->required();

  std::string gpu_spec;
  std::vector<std::string> assignments;
  auto* set = app.add_subcommand("set", "set live values: set GPU key=value ... (see --help)");
  set->add_option("gpu", gpu_spec, "GPU")->required();
  set->add_option("values", assignments, "key=value pairs")->required();
  std::string fields_help = "keys (each value is checked against its range on this GPU's model):";
  for (const auto& f : LiveFields()) fields_help += std::string("\n  ") + f.key + ": " + f.help;
  set->footer(fields_help);

  unsigned xid_code = 0;
  int gi = -1, ci = -1;
  auto* xid = app.add_subcommand("xid", "inject an XID event: xid GPU CODE [--gi N --ci N]");
  xid->add_option("gpu", gpu_spec, "GPU")->required();
  xid->add_option("code", xid_code, "XID number")->required();
  xid->add_option("--gi", gi, "GPU instance id (MIG)");
  xid->add_option("--ci", ci, "compute instance id (MIG)");

  std::string ecc_kind;
  unsigned ecc_count = 1;
  auto* ecc = app.add_subcommand("ecc", "raise ECC counters and send the event: ecc GPU sbe|dbe [N]");
  ecc->add_option("gpu", gpu_spec, "GPU")->required();
  ecc->add_option("kind", ecc_kind, "sbe or dbe")->required()->check(CLI::IsMember({"sbe", "dbe"}));
  ecc->add_option("count", ecc_count, "how many errors");

  auto* lose = app.add_subcommand("lose", "make a GPU fall off the bus (XID 79, then GPU_IS_LOST)");
  lose->add_option("gpu", gpu_spec, "GPU")->required();
  auto* restore = app.add_subcommand("restore", "bring a lost GPU back");
  restore->add_option("gpu", gpu_spec, "GPU")->required();

  unsigned hang_ms = 0;
  auto* hang = app.add_subcommand("hang", "make every NVML call on a GPU block for MS ms (0 ends it)");
  hang->add_option("gpu", gpu_spec, "GPU")->required();
  hang->add_option("ms", hang_ms, "milliseconds")->required();

  unsigned pid = 0, mem_mib = 0, sm_util = 0, mem_util = 0;
  std::string kind = "compute";
  auto* proc = app.add_subcommand("proc", "add or remove processes on a GPU");
  proc->require_subcommand(1);
  auto* proc_add = proc->add_subcommand("add", "proc add GPU PID [--mem MiB --util % --memutil %]");
  proc_add->add_option("gpu", gpu_spec, "GPU")->required();
  proc_add->add_option("pid", pid, "process id")->required();
  proc_add->add_option("--mem", mem_mib, "GPU memory used, MiB");
  proc_add->add_option("--util", sm_util, "SM utilisation of the process, %");
  proc_add->add_option("--memutil", mem_util, "memory utilisation of the process, %");
  proc_add->add_option("--gi", gi, "GPU instance id (MIG)");
  proc_add->add_option("--ci", ci, "compute instance id (MIG)");
  proc_add->add_option("--kind", kind, "compute, graphics or mps")
      ->check(CLI::IsMember({"compute", "graphics", "mps"}));
  auto* proc_rm = proc->add_subcommand("rm", "proc rm GPU PID");
  proc_rm->add_option("gpu", gpu_spec, "GPU")->required();
  proc_rm->add_option("pid", pid, "process id")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a command line that cannot be parsed is a usage error: 2, as in kgpu.
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (profiles->parsed()) {
    for (const auto& name : BuiltinProfileNames()) {
      auto p = ParseProfile(BuiltinProfileYaml(name), name);
      std::printf("%-14s %zu x %s%s\n", name.c_str(), p->gpus.size(), p->gpus[0].model->name.c_str(),
                  p->nvlink == "nvswitch" ? ", NVLink (NVSwitch)" : ", PCIe only");
    }
    std::printf("\nGPU models:");
    for (const auto& m : Models()) std::printf(" %s", m.key.c_str());
    std::printf("\n");
    return 0;
  }
  if (validate->parsed()) {
    auto p = LoadProfile(validate_path);
    if (!p.ok()) return Fail(std::string(p.status().message()));
    std::printf("%s: ok (%s, %zu GPUs)\n", validate_path.c_str(), p->name.c_str(), p->gpus.size());
    return 0;
  }

  auto opened = Node::Open(ReadEnvironment());
  if (!opened.ok()) return Fail(std::string(opened.status().message()));
  const Node& node = **opened;
  if (show->parsed()) {
    std::cout << Show(node).dump(2) << "\n";
    return 0;
  }
  if (mig_minors->parsed()) {
    std::filesystem::create_directories(std::filesystem::path(minors_path).parent_path());
    std::ofstream out(minors_path);
    out << MigMinorsText(node);
    return out ? 0 : Fail("cannot write " + minors_path);
  }
  if (procfs->parsed()) return WriteProcfs(node, procfs_dir);
  if (sysfs->parsed()) return WriteSysfs(node, sysfs_dir);
  if (reset->parsed()) {
    node.Reset();
    return 0;
  }
  unsigned g = 0;
  if (!ResolveGpu(node, gpu_spec, &g)) {
    return Fail("no GPU '" + gpu_spec + "' on node " + node.profile().name + " (it has " +
                std::to_string(node.gpu_count()) + " GPUs: use 0.." + std::to_string(node.gpu_count() - 1) +
                ", a UUID or a bus id)");
  }
  Node::Locked lock(node);
  SimGpu& gpu = lock.gpu(g);
  const uint32_t gi_id = gi < 0 ? kNoId : static_cast<uint32_t>(gi);
  const uint32_t ci_id = ci < 0 ? kNoId : static_cast<uint32_t>(ci);
  if ((gi < 0) != (ci < 0)) return Fail("--gi and --ci go together");
  if (gi >= 0) {
    bool found = false;
    for (const auto& x : gpu.gis) {
      for (const auto& y : x.cis) found = found || (x.used && y.used && x.id == gi_id && y.id == ci_id);
    }
    if (!found)
      return Fail("GPU " + std::to_string(g) + " has no MIG instance gi=" + std::to_string(gi) +
                  " ci=" + std::to_string(ci));
  }

  if (set->parsed()) {
    // All or nothing: every assignment is checked (in order, so memused sees the processes)
    // on a copy before the GPU changes.
    SimGpu next = gpu;
    for (const auto& a : assignments) {
      const auto eq = a.find('=');
      if (eq == std::string::npos)
        return Fail("'" + kgpu::Printable(a) + "' is not key=value (kgpu-simctl set --help)");
      if (auto st = SetLiveValue(next, *node.profile().gpus[g].model, a.substr(0, eq), a.substr(eq + 1)); !st.ok()) {
        return Fail("GPU " + std::to_string(g) + ": " + std::string(st.message()) + "; nothing was changed");
      }
    }
    gpu = next;
  } else if (xid->parsed()) {
    gpu.last_xid = xid_code;
    node.PushEvent(lock, g, kXidEvent, xid_code, gi_id, ci_id);
  } else if (ecc->parsed()) {
    if (ecc_kind == "sbe") {
      gpu.ecc_sbe_vol += ecc_count;
      gpu.ecc_sbe_agg += ecc_count;
    } else {
      gpu.ecc_dbe_vol += ecc_count;
      gpu.ecc_dbe_agg += ecc_count;
    }
    node.PushEvent(lock, g, ecc_kind == "sbe" ? kSbeEvent : kDbeEvent, 0, kNoId, kNoId);
  } else if (lose->parsed()) {
    gpu.last_xid = 79;
    node.PushEvent(lock, g, kXidEvent, 79, kNoId, kNoId);
    gpu.lost = 1;
  } else if (restore->parsed()) {
    gpu.lost = 0;
  } else if (hang->parsed()) {
    __atomic_store_n(&gpu.hang_until_ns, hang_ms == 0 ? 0 : MonotonicNs() + int64_t{hang_ms} * 1000000,
                     __ATOMIC_RELEASE);
  } else if (proc_add->parsed()) {
    unsigned slot = 0;
    while (slot < gpu.nproc && gpu.procs[slot].pid != pid) ++slot;
    if (slot == gpu.nproc && gpu.nproc == kMaxProcs) return Fail("at most 64 processes per GPU");
    SimProcess p{};
    p.pid = pid;
    p.gi = gi_id;
    p.ci = ci_id;
    p.sm_util = sm_util;
    p.mem_util = mem_util;
    p.kind = kind == "compute" ? 0 : kind == "graphics" ? 1 : 2;
    p.mem_bytes = uint64_t{mem_mib} << 20;
    p.sample_us = RealtimeUs();
    if (auto st = CheckProcess(*node.profile().gpus[g].model, gpu, p, slot); !st.ok()) {
      return Fail("proc add on GPU " + std::to_string(g) + ": " + std::string(st.message()) + "; nothing was changed");
    }
    if (slot == gpu.nproc) ++gpu.nproc;
    gpu.procs[slot] = p;
  } else if (proc_rm->parsed()) {
    unsigned slot = 0;
    while (slot < gpu.nproc && gpu.procs[slot].pid != pid) ++slot;
    if (slot == gpu.nproc) return Fail("no process " + std::to_string(pid) + " on GPU " + std::to_string(g));
    gpu.procs[slot] = gpu.procs[--gpu.nproc];
  }
  return 0;
}

}  // namespace
}  // namespace kgpu::sim

int main(int argc, char** argv) {
  try {
    return kgpu::sim::Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kgpu-simctl: " << e.what() << "\n";
    return 1;
  }
}
