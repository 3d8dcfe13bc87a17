#include "gpu/inventory.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>

#include "common/bounded_thread.h"
#include "common/log.h"
#include "common/strings.h"

namespace kgpu::gpu {
namespace {

// "00000000:18:00.0" -> "0000:18:00.0" (the sysfs name).
std::string SysfsBdf(const std::string& bus_id) {
  std::string s = bus_id.size() == 16 ? bus_id.substr(4) : bus_id;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

int ReadNumaNode(const std::string& root, const std::string& bus_id) {
  std::ifstream in(Cat(root, "/bus/pci/devices/", SysfsBdf(bus_id), "/numa_node"));
  int node = -1;
  if (!(in >> node)) return -1;
  return node < 0 ? -1 : node;
}

// "pci0000:00": the root complex component of the device's sysfs path
// (/sys/bus/pci/devices/<bdf> links to ../../../devices/pci0000:00/0000:00:01.0/<bdf>).
std::string ReadPcieRoot(const std::string& root, const std::string& bus_id) {
  std::error_code ec;
  const auto target = std::filesystem::read_symlink(Cat(root, "/bus/pci/devices/", SysfsBdf(bus_id)), ec);
  if (ec) return "";
  for (const auto& part : target) {
    const std::string p = part.string();
    // "pci" + domain (4 hex digits) + ':' + bus (2 hex digits)
    if (p.size() == 10 && p.rfind("pci", 0) == 0 && p[7] == ':' && std::all_of(p.begin() + 3, p.end(), [](char c) {
          return c == ':' || std::isxdigit(static_cast<unsigned char>(c));
        })) {
      return p;
    }
  }
  return "";
}

// The device's PCI class ("0x030200\n" in sysfs), or 0 when it cannot be read.
uint32_t ReadPciClass(const std::string& root, const std::string& bus_id) {
  std::ifstream in(Cat(root, "/bus/pci/devices/", SysfsBdf(bus_id), "/class"));
  std::string text;
  if (!(in >> text)) return 0;
  char* end = nullptr;
  const unsigned long value = std::strtoul(text.c_str(), &end, 16);
  if (end == text.c_str() || *end != '\0' || value > 0xFFFFFFUL) return 0;
  return static_cast<uint32_t>(value);
}

PcieLevel FromNvml(int level) {
  switch (level) {
    case 0:
      return PcieLevel::kPix;  // same board
    case 10:
      return PcieLevel::kPix;
    case 20:
      return PcieLevel::kPxb;
    case 30:
      return PcieLevel::kPhb;
    case 40:
      return PcieLevel::kNode;
    case 50:
      return PcieLevel::kSys;
    default:
      return PcieLevel::kUnknown;
  }
}

// Reads one GPU; per-GPU failures are recorded on the GPU, not returned.
void ReadGpu(const nvml::Library& lib, const DiscoverOptions& options, Gpu& g) {
  auto fail = [&](const absl::Status& st) {
    g.lost = nvml::IsGpuLost(st);
    g.error = std::string(st.message());
  };
  auto uuid = lib.Uuid(g.handle);
  if (!uuid.ok()) return fail(uuid.status());
  g.uuid = *uuid;
  auto name = lib.Name(g.handle);
  if (!name.ok()) return fail(name.status());
  g.name = *name;
  auto pci = lib.Pci(g.handle);
  if (!pci.ok()) return fail(pci.status());
  g.bus_id = pci->bus_id;
  auto minor = lib.MinorNumber(g.handle);
  if (!minor.ok()) return fail(minor.status());
  g.minor = *minor;
  auto mem = lib.Memory(g.handle);
  if (!mem.ok()) return fail(mem.status());
  g.memory_mib = mem->total >> 20;
  if (auto cc = lib.ComputeCapability(g.handle); cc.ok()) {
    g.cc_major = cc->first;
    g.cc_minor = cc->second;
  }
  if (auto p = lib.PowerLimitMw(g.handle); p.ok()) g.power_limit_w = *p / 1000;
  if (auto b = lib.Brand(g.handle); b.ok()) g.brand = *b;
  if (auto a = lib.Architecture(g.handle); a.ok()) g.architecture = *a;
  g.numa_node = ReadNumaNode(options.sysfs_root, g.bus_id);
  g.pcie_root = ReadPcieRoot(options.sysfs_root, g.bus_id);
  g.pci_class = ReadPciClass(options.sysfs_root, g.bus_id);

  auto mig = lib.GetMigMode(g.handle);
  if (!mig.ok()) {
    if (!nvml::IsNoValue(mig.status())) return fail(mig.status());
    return;  // not MIG capable
  }
  g.mig_capable = true;
  g.mig_enabled = mig->current;
  g.mig_pending = mig->current != mig->pending;
  if (!g.mig_enabled) return;
  auto migs = lib.MigDevices(g.handle);
  if (!migs.ok()) return fail(migs.status());
  unsigned index = 0;
  for (const auto& m : *migs) {
    MigDevice d;
    d.handle = m.handle;
    d.parent = g.index;
    d.index = index++;
    d.gi = m.gi;
    d.ci = m.ci;
    d.gi_slices = m.gi_slices;
    d.ci_slices = m.ci_slices;
    d.memory_mib = m.memory_mib;
    d.sm_count = m.sm_count;
    d.copy_engines = m.copy_engines;
    d.decoders = m.decoders;
    d.encoders = m.encoders;
    d.jpegs = m.jpegs;
    d.ofas = m.ofas;
    d.profile = MigProfileName(m.gi_slices, m.ci_slices, m.memory_mib, mem->total, m.profile_index);
    auto u = lib.Uuid(m.handle);
    if (!u.ok()) return fail(u.status());
    d.uuid = *u;
    g.migs.push_back(std::move(d));
  }
}

// Reads GPU `i`, from its handle on; per-GPU failures are recorded on the GPU.
Gpu ReadGpuAt(const nvml::Library& lib, const DiscoverOptions& options, unsigned i) {
  Gpu g;
  g.index = i;
  auto handle = lib.DeviceByIndex(i);
  if (!handle.ok()) {
    g.lost = nvml::IsGpuLost(handle.status());
    g.error = std::string(handle.status().message());
  } else {
    g.handle = *handle;
    ReadGpu(lib, options, g);
  }
  return g;
}

}  // namespace

const char* PcieLevelName(PcieLevel level) {
  switch (level) {
    case PcieLevel::kSelf:
      return "X";
    case PcieLevel::kPix:
      return "PIX";
    case PcieLevel::kPxb:
      return "PXB";
    case PcieLevel::kPhb:
      return "PHB";
    case PcieLevel::kNode:
      return "NODE";
    case PcieLevel::kSys:
      return "SYS";
    case PcieLevel::kUnknown:
      break;
  }
  return "?";
}

namespace {
std::string GpuMigState(const Gpu& g, bool current, bool pending, const std::vector<std::string>& uuids) {
  return Cat(g.index, ":", current ? 1 : 0, pending ? 1 : 0, ":", Join(uuids, ","), ";");
}
}  // namespace

std::string MigFingerprint(const Inventory& inventory) {
  std::string out;
  for (const auto& g : inventory.gpus()) {
    if (!g.mig_capable) continue;
    std::vector<std::string> uuids;
    for (const auto& m : g.migs) uuids.push_back(m.uuid);
    out += GpuMigState(g, g.mig_enabled, g.mig_enabled != g.mig_pending, uuids);
  }
  return out;
}

std::string MigFingerprintNow(const nvml::Library& lib, const Inventory& inventory) {
  std::string out;
  for (const auto& g : inventory.gpus()) {
    if (!g.mig_capable) continue;
    std::vector<std::string> uuids;
    for (const auto& m : g.migs) uuids.push_back(m.uuid);
    bool current = g.mig_enabled, pending = g.mig_enabled != g.mig_pending;
    if (auto mode = lib.GetMigMode(g.handle); mode.ok()) {
      current = mode->current;
      pending = mode->pending;
      if (current) {
        if (auto now = lib.MigDeviceUuids(g.handle); now.ok()) uuids = *now;
      } else {
        uuids.clear();
      }
    }
    out += GpuMigState(g, current, pending, uuids);
  }
  return out;
}

std::string MigProfileName(unsigned gi_slices, unsigned ci_slices, uint64_t memory_mib, uint64_t gpu_memory_bytes,
                           unsigned profile_index) {
  uint64_t gb = 0;
  if (gpu_memory_bytes > 0) {
    const double fraction = static_cast<double>(memory_mib << 20) / static_cast<double>(gpu_memory_bytes);
    const double eighths = std::ceil(fraction * 8.0);
    const double total_gb = std::ceil(static_cast<double>(gpu_memory_bytes) / (1ULL << 30));
    gb = static_cast<uint64_t>(std::round(eighths / 8.0 * total_gb));
  }
  std::string name = Cat(gi_slices, "g.", gb, "gb");
  if (ci_slices != 0 && ci_slices != gi_slices) name = Cat(ci_slices, "c.", name);
  switch (profile_index) {
    case 0x7:  // 1_SLICE_REV1
    case 0x8:
      name += "+me";
      break;
    case 0xA:
    case 0xB:
    case 0xC:
    case 0x11:
      name += "+gfx";
      break;
    case 0xD:
    case 0xE:
      name += "-me";
      break;
    case 0xF:
    case 0x10:
      name += "+me.all";
      break;
    default:
      break;
  }
  return name;
}

absl::StatusOr<std::shared_ptr<const Inventory>> Inventory::Discover(const nvml::Library& lib,
                                                                     const DiscoverOptions& options) {
  return Build(lib, [&](unsigned count) {
    std::vector<Gpu> gpus;
    for (unsigned i = 0; i < count; ++i) gpus.push_back(ReadGpuAt(lib, options, i));
    return gpus;
  });
}

absl::StatusOr<std::shared_ptr<const Inventory>> Inventory::Discover(std::shared_ptr<const nvml::Library> lib,
                                                                     const DiscoverOptions& options,
                                                                     std::chrono::milliseconds deadline) {
  return Build(*lib, [&](unsigned count) {
    // One thread per GPU, all at once; a GPU whose reads have not finished by the deadline is
    // hung. Its thread is left behind (BoundedThread) holding what it uses: the library and its
    // own result slot.
    struct Slot {
      std::mutex mu;
      std::optional<Gpu> gpu;
    };
    std::vector<std::shared_ptr<Slot>> slots;
    std::vector<std::unique_ptr<BoundedThread>> threads;
    for (unsigned i = 0; i < count; ++i) {
      auto slot = std::make_shared<Slot>();
      auto thread = std::make_unique<BoundedThread>();
      thread->Start([lib, options, i, slot](std::stop_token) {
        Gpu g = ReadGpuAt(*lib, options, i);
        std::lock_guard<std::mutex> lock(slot->mu);
        slot->gpu = std::move(g);
      });
      slots.push_back(std::move(slot));
      threads.push_back(std::move(thread));
    }
    const auto until = std::chrono::steady_clock::now() + deadline;
    std::vector<Gpu> gpus;
    for (unsigned i = 0; i < count; ++i) {
      threads[i]->StopAndJoinUntil(until);
      std::lock_guard<std::mutex> lock(slots[i]->mu);
      if (slots[i]->gpu) {
        gpus.push_back(std::move(*slots[i]->gpu));
        continue;
      }
      Gpu g;
      g.index = i;
      g.hung = true;
      g.error = Cat("NVML did not answer within ", deadline.count(), " ms (a hung call)");
      gpus.push_back(std::move(g));
    }
    return gpus;
  });
}

absl::StatusOr<std::shared_ptr<const Inventory>> Inventory::Build(
    const nvml::Library& lib, const std::function<std::vector<Gpu>(unsigned count)>& read_gpus) {
  std::shared_ptr<Inventory> inv(new Inventory);
  if (auto v = lib.DriverVersion(); v.ok()) inv->driver_version_ = *v;
  if (auto v = lib.NvmlVersion(); v.ok()) inv->nvml_version_ = *v;
  if (auto v = lib.CudaDriverVersion(); v.ok()) {
    inv->cuda_version_ = Cat(*v / 1000, ".", (*v % 1000) / 10);
  }
  auto count = lib.DeviceCount();
  if (!count.ok()) return count.status();
  inv->gpus_ = read_gpus(*count);
  for (const auto& g : inv->gpus_) {
    if (!g.error.empty()) Log("gpu")->warn("GPU {}: {}", g.index, g.error);
  }

  // Topology, once for every pair.
  const size_t n = inv->gpus_.size();
  std::vector<std::vector<nvml::NvLink>> nvlinks(n);
  std::set<std::string> gpu_buses;
  for (const auto& g : inv->gpus_) gpu_buses.insert(g.bus_id);
  for (size_t i = 0; i < n; ++i) {
    if (!inv->gpus_[i].error.empty()) continue;
    if (auto l = lib.ActiveNvLinks(inv->gpus_[i].handle); l.ok()) nvlinks[i] = std::move(*l);
  }
  inv->links_.assign(n, std::vector<Link>(n));
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      Link& link = inv->links_[a][b];
      if (a == b) {
        link.pcie = PcieLevel::kSelf;
        continue;
      }
      const Gpu& ga = inv->gpus_[a];
      const Gpu& gb = inv->gpus_[b];
      if (!ga.error.empty() || !gb.error.empty()) continue;
      if (auto level = lib.CommonAncestor(ga.handle, gb.handle); level.ok()) {
        link.pcie = FromNvml(*level);
      }
      std::set<std::string> b_switches;
      for (const auto& l : nvlinks[b]) {
        if (l.remote_is_switch || gpu_buses.count(l.remote_bus_id) == 0) b_switches.insert(l.remote_bus_id);
      }
      for (const auto& l : nvlinks[a]) {
        const bool to_switch = l.remote_is_switch || gpu_buses.count(l.remote_bus_id) == 0;
        if ((!to_switch && l.remote_bus_id == gb.bus_id) || (to_switch && b_switches.count(l.remote_bus_id) != 0)) {
          ++link.nvlinks;
        }
      }
    }
  }
  return std::shared_ptr<const Inventory>(std::move(inv));
}

std::shared_ptr<const Inventory> Inventory::FromPartsForTest(std::vector<Gpu> gpus,
                                                             std::vector<std::vector<Link>> links) {
  std::shared_ptr<Inventory> inv(new Inventory);
  inv->gpus_ = std::move(gpus);
  inv->links_ = std::move(links);
  return inv;
}

std::string Inventory::TopologyLabel(unsigned a, unsigned b) const {
  if (a == b) return "X";
  const Link& l = links_[a][b];
  if (l.nvlinks > 0) return Cat("NV", l.nvlinks);
  return PcieLevelName(l.pcie);
}

const Gpu* Inventory::FindGpu(const std::string& uuid) const {
  for (const auto& g : gpus_) {
    if (g.uuid == uuid) return &g;
  }
  return nullptr;
}

const MigDevice* Inventory::FindMig(const std::string& uuid) const {
  for (const auto& g : gpus_) {
    for (const auto& m : g.migs) {
      if (m.uuid == uuid) return &m;
    }
  }
  return nullptr;
}

int Inventory::IndexOfHandle(nvml::Device handle) const {
  for (const auto& g : gpus_) {
    if (g.handle == handle) return static_cast<int>(g.index);
  }
  return -1;
}

std::string BrandName(int brand) {
  static constexpr const char* kNames[] = {
      "Unknown",   "Quadro",      "Tesla",     "NVS",        "Grid",      "GeForce",
      "Titan",     "NvidiaVApps", "NvidiaVPC", "NvidiaVCS",  "NvidiaVWS", "NvidiaCloudGaming",
      "QuadroRTX", "NvidiaRTX",   "Nvidia",    "GeForceRTX", "TitanRTX"};
  if (brand < 0 || brand >= static_cast<int>(std::size(kNames))) return "Unknown";
  return kNames[brand];
}

std::string ArchitectureName(unsigned architecture) {
  switch (architecture) {
    case 2:
      return "Kepler";
    case 3:
      return "Maxwell";
    case 4:
      return "Pascal";
    case 5:
      return "Volta";
    case 6:
      return "Turing";
    case 7:
      return "Ampere";
    case 8:
      return "Ada Lovelace";
    case 9:
      return "Hopper";
    case 10:
      return "Blackwell";
    default:
      return "Unknown";
  }
}

}  // namespace kgpu::gpu
