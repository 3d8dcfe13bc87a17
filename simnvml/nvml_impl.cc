// The NVML C API of the simulated node. Every entry point validates its arguments the way the
// real library does, reads or changes the shared node state (node.h) under its mutex, and returns
// NVML's error codes. Handles are addresses in process-lifetime tables, so they stay valid across
// nvmlShutdown/nvmlInit and dlclose/dlopen (the library is linked with -z nodelete).
//
// Thread-safety: every entry point may be called from any thread at any time.

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "node.h"
#include "nvml/nvml_abi.h"

#define NVML_EXPORT extern "C" __attribute__((visibility("default")))

namespace kgpu::sim {
namespace {

constexpr uint32_t kDevMagic = 0x4b444556;  // KDEV
constexpr uint32_t kGiMagic = 0x4b474931;
constexpr uint32_t kCiMagic = 0x4b434931;
constexpr uint32_t kSetMagic = 0x4b455653;

struct DevHandle {
  uint32_t magic;
  unsigned gpu;
  int gi_slot;  // -1: the whole GPU
  int ci_slot;
};
struct InstHandle {
  uint32_t magic;
  unsigned gpu;
  int gi_slot;
  int ci_slot;
};
struct EventSet {
  uint32_t magic = kSetMagic;
  std::mutex mu;
  uint64_t cursor = 0;
  uint64_t masks[kMaxGpus] = {};
  uint64_t since[kMaxGpus] = {};  // event seq when the GPU was first registered
};

struct Handles {
  DevHandle gpus[kMaxGpus];
  DevHandle migs[kMaxGpus][kMaxGis][kMaxCis];
  InstHandle gis[kMaxGpus][kMaxGis];
  InstHandle cis[kMaxGpus][kMaxGis][kMaxCis];
};

Handles& H() {
  static Handles* h = [] {
    auto* t = new Handles;  // never freed: handles outlive nvmlShutdown
    for (unsigned g = 0; g < kMaxGpus; ++g) {
      t->gpus[g] = {kDevMagic, g, -1, -1};
      for (int i = 0; i < static_cast<int>(kMaxGis); ++i) {
        t->gis[g][i] = {kGiMagic, g, i, -1};
        for (int c = 0; c < static_cast<int>(kMaxCis); ++c) {
          t->migs[g][i][c] = {kDevMagic, g, i, c};
          t->cis[g][i][c] = {kCiMagic, g, i, c};
        }
      }
    }
    return t;
  }();
  return *h;
}

template <typename T, typename A>
bool InArray(const T* p, const A& array) {
  const auto* begin = reinterpret_cast<const char*>(&array);
  const auto* q = reinterpret_cast<const char*>(p);
  return q >= begin && q < begin + sizeof(array) && (q - begin) % sizeof(T) == 0;
}

struct Library {
  std::mutex mu;
  std::atomic<int> refcount{0};
  std::unique_ptr<Node> node;  // opened by the first successful init; kept for the process
  // Why the last nvmlInit failed (the simulator's own words); nvmlErrorString(NVML_ERROR_UNKNOWN)
  // returns it while no init has succeeded since, so every client shows the real cause. Interned:
  // a string once returned stays valid for the process.
  const char* init_error = nullptr;
  std::set<std::string> messages;
};
Library& Lib() {
  static auto* lib = new Library;
  return *lib;
}

const Node* Current() {
  Library& lib = Lib();
  return lib.refcount.load(std::memory_order_acquire) > 0 ? lib.node.get() : nullptr;
}

nvmlReturn_t Init() {
  Library& lib = Lib();
  std::lock_guard<std::mutex> lock(lib.mu);
  const Environment env = ReadEnvironment();
  const bool env_changed = lib.node && (lib.node->environment().profile_spec != env.profile_spec ||
                                        lib.node->environment().state_path != env.state_path ||
                                        lib.node->environment().node_name != env.node_name);
  if (!lib.node || (env_changed && lib.refcount.load() == 0)) {
    // A first init, or a fresh one after every client shut down, reads the environment.
    auto node = Node::Open(env);
    if (!node.ok()) {
      // Not DRIVER_NOT_LOADED: no kernel driver is involved, and clients would say to load one.
      lib.init_error = lib.messages.insert("kgpu-simnvml: " + std::string(node.status().message())).first->c_str();
      return NVML_ERROR_UNKNOWN;
    }
    lib.node = std::move(*node);
  }
  lib.init_error = nullptr;
  lib.refcount.fetch_add(1, std::memory_order_acq_rel);
  return NVML_SUCCESS;
}

nvmlDevice_t GpuHandle(unsigned gpu) {
  return reinterpret_cast<nvmlDevice_t>(&H().gpus[gpu]);
}

const DevHandle* FromDevice(nvmlDevice_t d) {
  const auto* h = reinterpret_cast<const DevHandle*>(d);
  if (h == nullptr || !(InArray(h, H().gpus) || InArray(h, H().migs))) return nullptr;
  return h;
}

// What a device entry point sees: the node, the locked state and which GPU / MIG device.
struct Dev {
  const Node& node;
  const Node::Locked& lock;
  SimGpu& g;
  unsigned gpu;
  int gi_slot, ci_slot;
  bool mig() const { return gi_slot >= 0; }
  const GpuSpec& spec() const { return node.profile().gpus[gpu]; }
  const GpuModel& model() const { return *spec().model; }
  SimGi& gi() const { return g.gis[gi_slot]; }
  SimCi& ci() const { return g.gis[gi_slot].cis[ci_slot]; }
  const MigProfile& gi_profile() const { return *FindMigProfileByIndex(model(), gi().profile_index); }
  std::string uuid() const { return mig() ? MigUuid(node.uuid(gpu), gi().id, ci().id) : node.uuid(gpu); }
  // Processes on this device (on the parent: every process).
  bool Owns(const SimProcess& p) const { return !mig() || (p.gi == gi().id && p.ci == ci().id); }
};

enum class Lost { kFail, kAllow };

template <typename F>
nvmlReturn_t OnDevice(nvmlDevice_t device, F&& f, Lost lost = Lost::kFail) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  const DevHandle* h = FromDevice(device);
  if (h == nullptr || h->gpu >= node->gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
  node->WaitWhileHung(h->gpu);
  Node::Locked lock(*node);
  SimGpu& g = lock.gpu(h->gpu);
  if (g.lost != 0 && lost == Lost::kFail) return NVML_ERROR_GPU_IS_LOST;
  if (h->gi_slot >= 0 &&
      (g.mig_current == 0 || g.gis[h->gi_slot].used == 0 || g.gis[h->gi_slot].cis[h->ci_slot].used == 0)) {
    return NVML_ERROR_INVALID_ARGUMENT;  // the MIG device behind this handle is gone
  }
  return f(Dev{*node, lock, g, h->gpu, h->gi_slot, h->ci_slot});
}

// Runs f on a whole-GPU handle only (MIG device handles get NOT_SUPPORTED).
template <typename F>
nvmlReturn_t OnGpu(nvmlDevice_t device, F&& f) {
  return OnDevice(device, [&](const Dev& d) -> nvmlReturn_t {
    if (d.mig()) return NVML_ERROR_NOT_SUPPORTED;
    return f(d);
  });
}

nvmlReturn_t CopyString(const std::string& s, char* buf, unsigned length) {
  if (buf == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (length < s.size() + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return NVML_SUCCESS;
}

template <typename... P>
bool AnyNull(P*... p) {
  return ((p == nullptr) || ...);
}

void FillPci(const std::string& bus_id, unsigned domain, unsigned bus, unsigned device_id, unsigned subsys,
             nvmlPciInfo_t* pci) {
  std::memset(pci, 0, sizeof *pci);
  std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:00.0", domain & 0xffff, bus);
  std::snprintf(pci->busId, sizeof pci->busId, "%s", bus_id.c_str());
  pci->domain = domain;
  pci->bus = bus;
  pci->device = 0;
  pci->pciDeviceId = device_id;
  pci->pciSubSystemId = subsys;
}

uint64_t ProcessMemory(const Dev& d) {
  uint64_t sum = 0;
  for (unsigned i = 0; i < d.g.nproc; ++i) {
    if (d.Owns(d.g.procs[i])) sum += d.g.procs[i].mem_bytes;
  }
  return sum;
}

// A GPU's utilisation as NVML reports it: what simctl set as `util` (work of no listed process)
// plus the SM utilisation of every listed process (compute, graphics or MPS client), capped at
// 100 %, as a busy GPU's reading cannot exceed it.
uint32_t GpuUtilisation(const SimGpu& g) {
  uint64_t sum = g.util_gpu;
  for (unsigned i = 0; i < g.nproc && i < kMaxProcs; ++i) sum += g.procs[i].sm_util;
  return static_cast<uint32_t>(std::min<uint64_t>(sum, 100));
}

// ---- the kernels of the simulated CUDA driver (node.h SimExec, written by simcuda/exec_impl.cc)

// The window a utilisation reading covers. NVML's sample period "may be between 1 second and 1/6
// second, depending on the product" (NVML API Reference, nvmlUtilization_t); the simulation uses
// the longest.
constexpr int64_t kUtilWindowNs = 1000000000;

// The earliest time from which the ring still holds every kernel: once it has wrapped, the start
// of its oldest kernel (the kernels overwritten all ended before it); else no limit.
int64_t RingHorizon(const SimExec& x) {
  if (x.kernel_count <= kKernelRing) return INT64_MIN;
  return x.kernels[x.kernel_count % kKernelRing].start_ns;
}

// Calls f(kernel, ns) for each kernel of the ring with ns > 0 of it elapsed within [from, to),
// newest first. The ring is ordered and without overlaps (node.h), so the walk stops at the first
// kernel that ended by `from`.
template <typename F>
void ForKernelTime(const SimExec& x, int64_t from, int64_t to, F&& f) {
  const uint64_t n = std::min<uint64_t>(x.kernel_count, kKernelRing);
  for (uint64_t i = 1; i <= n; ++i) {
    const SimKernel& k = x.kernels[(x.kernel_count - i) % kKernelRing];
    if (k.end_ns <= from) break;
    const int64_t ns = std::min(k.end_ns, to) - std::max(k.start_ns, from);
    if (ns > 0) f(k, ns);
  }
}

// `part` of `whole` in percent, rounded to the nearest, at least 1 when part > 0, at most 100.
uint32_t Percent(int64_t part, int64_t whole) {
  if (part <= 0 || whole <= 0) return 0;
  const int64_t pct = (part * 100 + whole / 2) / whole;
  return static_cast<uint32_t>(std::clamp<int64_t>(pct, 1, 100));
}

// The percentage of the last second that kernels ran on the GPU (only the elapsed part of
// kernels that started), over the part of that second the ring still covers; nullopt when no
// kernel ran in it. A ring whose every kernel lies in the future (more kernels queued than it
// holds) reads 100 %.
std::optional<uint32_t> KernelUtilisation(const SimExec& x, int64_t now) {
  if (x.kernel_count == 0) return std::nullopt;
  const int64_t from = std::max(now - kUtilWindowNs, RingHorizon(x));
  if (from >= now) return 100;
  int64_t busy = 0;
  ForKernelTime(x, from, now, [&](const SimKernel&, int64_t ns) { busy += ns; });
  if (busy == 0) return std::nullopt;
  return Percent(busy, now - from);
}

// A GPU's utilisation: that of the simulated driver's kernels when some ran in the last second,
// else what simctl set (GpuUtilisation).
uint32_t DeviceUtilisation(const Dev& d) {
  if (auto k = KernelUtilisation(d.lock.state().exec[d.gpu], MonotonicNs())) return *k;
  return GpuUtilisation(d.g);
}

// Whether the stored value `key` of the device's GPU is in the range simctl accepts. A value
// outside it (a state file written by something else) is not served: the call fails with
// NVML_ERROR_UNKNOWN instead of returning a reading no GPU can give (util 150 %, used > total).
bool Valid(const Dev& d, const char* key) {
  const LiveField* f = FindLiveField(key);
  return f != nullptr && InRange(*f, d.model(), d.g);
}

struct MemoryFigures {
  uint64_t total, reserved, used;
  bool valid() const { return reserved <= total && used <= total - reserved; }
};
MemoryFigures Memory(const Dev& d) {
  if (d.mig()) return {d.gi_profile().memory_mib << 20, 0, ProcessMemory(d)};
  return {d.model().memory_mib << 20, d.model().reserved_mib << 20, d.g.mem_used_base + ProcessMemory(d)};
}

// Pair level as nvmlDeviceGetTopologyCommonAncestor reports it.
nvmlGpuTopologyLevel_t Level(const Node& node, unsigned a, unsigned b) {
  if (a == b) return NVML_TOPOLOGY_INTERNAL;
  const unsigned group = node.profile().pcie_switch_group;
  if (a / group == b / group) return NVML_TOPOLOGY_SINGLE;
  if (node.profile().gpus[a].numa_node == node.profile().gpus[b].numa_node) {
    return NVML_TOPOLOGY_NODE;
  }
  return NVML_TOPOLOGY_SYSTEM;
}

uint64_t SupportedEvents(const GpuModel& m) {
  return nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError |
         (m.max_mig_devices > 0 ? nvmlEventMigConfigChange : 0);
}

template <typename Info>
nvmlReturn_t RunningProcesses(nvmlDevice_t device, unsigned kind, unsigned* count, Info* infos, bool with_instances) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(device, [&](const Dev& d) -> nvmlReturn_t {
    std::vector<const SimProcess*> found;
    for (unsigned i = 0; i < d.g.nproc; ++i) {
      const SimProcess& p = d.g.procs[i];
      const bool kind_match = kind == 0 ? (p.kind == 0 || p.kind == 2) : p.kind == kind;
      if (kind_match && d.Owns(p)) found.push_back(&p);
    }
    if (infos == nullptr || *count < found.size()) {
      const bool fits = found.empty();
      *count = static_cast<unsigned>(found.size());
      return fits ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (size_t i = 0; i < found.size(); ++i) {
      std::memset(&infos[i], 0, sizeof(Info));
      infos[i].pid = found[i]->pid;
      infos[i].usedGpuMemory = found[i]->mem_bytes;
      if constexpr (sizeof(Info) == sizeof(nvmlProcessInfo_v2_t)) {
        auto* v2 = reinterpret_cast<nvmlProcessInfo_v2_t*>(&infos[i]);
        v2->gpuInstanceId = with_instances ? found[i]->gi : kNoId;
        v2->computeInstanceId = with_instances ? found[i]->ci : kNoId;
      }
    }
    *count = static_cast<unsigned>(found.size());
    return NVML_SUCCESS;
  });
}

nvmlReturn_t WaitImpl(nvmlEventSet_t set, nvmlEventData_t* data, unsigned timeout_ms) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  auto* es = reinterpret_cast<EventSet*>(set);
  if (es == nullptr || es->magic != kSetMagic || data == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  uint64_t cursor = 0;
  uint64_t masks[kMaxGpus];
  uint64_t since[kMaxGpus];
  {
    std::lock_guard<std::mutex> lock(es->mu);
    cursor = es->cursor;
    std::memcpy(masks, es->masks, sizeof masks);
    std::memcpy(since, es->since, sizeof since);
  }
  SimEvent e{};
  const bool got = node->WaitEvent(&cursor, masks, since, timeout_ms, &e);
  {
    std::lock_guard<std::mutex> lock(es->mu);
    if (cursor > es->cursor) es->cursor = cursor;
  }
  if (!got) return NVML_ERROR_TIMEOUT;
  data->device = GpuHandle(e.gpu);
  data->eventType = e.type;
  data->eventData = e.data;
  data->gpuInstanceId = e.gi;
  data->computeInstanceId = e.ci;
  return NVML_SUCCESS;
}

// MIG instance handle helpers.
InstHandle* GiHandle(unsigned gpu, unsigned slot) {
  return &H().gis[gpu][slot];
}
InstHandle* CiHandle(unsigned gpu, unsigned gi, unsigned ci) {
  return &H().cis[gpu][gi][ci];
}

template <typename F>
nvmlReturn_t OnInstance(const void* handle, uint32_t magic, F&& f) {
  const auto* h = static_cast<const InstHandle*>(handle);
  if (h == nullptr || !(InArray(h, H().gis) || InArray(h, H().cis)) || h->magic != magic) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  return OnDevice(GpuHandle(h->gpu), [&](const Dev& d) -> nvmlReturn_t {
    if (d.g.gis[h->gi_slot].used == 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (h->ci_slot >= 0 && d.g.gis[h->gi_slot].cis[h->ci_slot].used == 0) {
      return NVML_ERROR_INVALID_ARGUMENT;
    }
    return f(d, static_cast<unsigned>(h->gi_slot), h->ci_slot);
  });
}

unsigned CiSize(unsigned ci_profile_index) {
  return ci_profile_index == 4 ? 7 : ci_profile_index + 1;
}

// How many more instances of `p` fit on the GPU now (greedy over the placement starts).
unsigned GiRemaining(const Dev& d, const MigProfile& p) {
  unsigned used_mem = 0, compute = 0, same = 0;
  for (const auto& gi : d.g.gis) {
    if (gi.used == 0) continue;
    used_mem |= ((1U << gi.size) - 1U) << gi.start;
    compute += FindMigProfileByIndex(d.model(), gi.profile_index)->compute_slices;
    same += gi.profile_index == p.index ? 1 : 0;
  }
  unsigned n = 0;
  for (unsigned s : p.starts) {
    const unsigned mask = ((1U << p.memory_slices) - 1U) << s;
    if ((used_mem & mask) == 0 && same + n < p.max_instances && compute + p.compute_slices <= 7) {
      used_mem |= mask;
      compute += p.compute_slices;
      ++n;
    }
  }
  return n;
}

}  // namespace
}  // namespace kgpu::sim

using namespace kgpu::sim;  // NOLINT(google-build-using-namespace): C entry points below

// ---------------------------------------------------------------- init, errors, system
NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) {
  return Init();
}
NVML_EXPORT nvmlReturn_t nvmlInit(void) {
  return Init();
}
NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int /*flags*/) {
  return Init();
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void) {
  Library& lib = Lib();
  std::lock_guard<std::mutex> lock(lib.mu);
  if (lib.refcount.load() == 0) return NVML_ERROR_UNINITIALIZED;
  lib.refcount.fetch_sub(1, std::memory_order_acq_rel);
  return NVML_SUCCESS;
}

NVML_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  if (result == NVML_ERROR_UNKNOWN) {
    Library& lib = Lib();
    std::lock_guard<std::mutex> lock(lib.mu);
    // The string lives as long as the (never freed) library state, until the next init attempt.
    if (lib.init_error != nullptr) return lib.init_error;
  }
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
      return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED:
      return "Already Initialized";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER:
      return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT:
      return "Timeout";
    case NVML_ERROR_IRQ_ISSUE:
      return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND:
      return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
      return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM:
      return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED:
      return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM:
      return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
      return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE:
      return "In use by another client";
    case NVML_ERROR_MEMORY:
      return "Insufficient Memory";
    case NVML_ERROR_NO_DATA:
      return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
      return "The requested vgpu operation is not available on target device, because ECC is "
             "enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES:
      return "Insufficient resources for request";
    case NVML_ERROR_FREQ_NOT_SUPPORTED:
      return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
      return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED:
      return "Deprecated";
    case NVML_ERROR_NOT_READY:
      return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND:
      return "GPU not found";
    case NVML_ERROR_INVALID_STATE:
      return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED:
      return "Reset type not supported";
    default:
      return "Unknown Error";
  }
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  return CopyString(node->profile().driver_version, version, length);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  return CopyString(node->profile().nvml_version, version, length);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* cuda) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (cuda == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *cuda = node->profile().cuda_version;
  return NVML_SUCCESS;
}
NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* cuda) {
  return nvmlSystemGetCudaDriverVersion_v2(cuda);
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char* name, unsigned int length) {
  if (Current() == nullptr) return NVML_ERROR_UNINITIALIZED;
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  if (!in || !std::getline(in, comm)) return NVML_ERROR_NOT_FOUND;
  return CopyString(comm, name, length);
}

NVML_EXPORT nvmlReturn_t nvmlUnitGetCount(unsigned int* count) {
  if (Current() == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = 0;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlGetExcludedDeviceCount(unsigned int* count) {
  return nvmlUnitGetCount(count);
}

// ---------------------------------------------------------------- enumeration
NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = node->gpu_count();
  return NVML_SUCCESS;
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int* count) {
  return nvmlDeviceGetCount_v2(count);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= node->gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(GpuHandle(index), [&](const Dev&) {
    *device = GpuHandle(index);
    return NVML_SUCCESS;
  });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (uuid == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const std::string want(uuid);
  for (unsigned i = 0; i < node->gpu_count(); ++i) {
    if (node->uuid(i) == want) {
      return OnDevice(GpuHandle(i), [&](const Dev&) {
        *device = GpuHandle(i);
        return NVML_SUCCESS;
      });
    }
    if (want.rfind("MIG-", 0) != 0) continue;
    nvmlReturn_t found = NVML_ERROR_NOT_FOUND;
    const nvmlReturn_t rc = OnDevice(GpuHandle(i), [&](const Dev& d) {
      for (unsigned s = 0; s < kMaxGis; ++s) {
        for (unsigned c = 0; c < kMaxCis && d.g.gis[s].used != 0; ++c) {
          if (d.g.gis[s].cis[c].used != 0 && MigUuid(node->uuid(i), d.g.gis[s].id, d.g.gis[s].cis[c].id) == want) {
            *device = reinterpret_cast<nvmlDevice_t>(&H().migs[i][s][c]);
            found = NVML_SUCCESS;
          }
        }
      }
      return NVML_SUCCESS;
    });
    if (rc == NVML_SUCCESS && found == NVML_SUCCESS) return NVML_SUCCESS;
  }
  return NVML_ERROR_NOT_FOUND;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, nvmlDevice_t* device) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (bus_id == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  for (unsigned i = 0; i < node->gpu_count(); ++i) {
    if (domain == 0 && dev == 0 && fn == 0 && node->profile().gpus[i].bus == bus) {
      return nvmlDeviceGetHandleByIndex_v2(i, device);
    }
  }
  return NVML_ERROR_NOT_FOUND;
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char* bus_id, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char* serial, nvmlDevice_t* device) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (serial == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (unsigned i = 0; i < node->gpu_count(); ++i) {
    if (node->serial(i) == serial) return nvmlDeviceGetHandleByIndex_v2(i, device);
  }
  return NVML_ERROR_NOT_FOUND;
}

// ---------------------------------------------------------------- identity
NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *index = d.gpu;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int* minor) {
  if (minor == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *minor = d.gpu;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  return OnDevice(device, [&](const Dev& d) {
    return CopyString(d.mig() ? d.model().name + " MIG " + d.gi_profile().name : d.model().name, name, length);
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  return OnDevice(device, [&](const Dev& d) { return CopyString(d.uuid(), uuid, length); });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char* serial, unsigned int length) {
  return OnGpu(device, [&](const Dev& d) { return CopyString(d.node.serial(d.gpu), serial, length); });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char* part, unsigned int length) {
  return OnGpu(device, [&](const Dev& d) { return CopyString(d.model().part_number, part, length); });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char* version, unsigned int length) {
  return OnGpu(device, [&](const Dev& d) { return CopyString(d.model().vbios, version, length); });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char* version, unsigned int length) {
  return OnGpu(device, [&](const Dev& d) {
    return CopyString("G" + d.model().part_number.substr(5, 8) + ".00.05", version, length);
  });
}

// The inforom objects nvidia-smi -q lists: Hopper boards show OEM 2.1 and ECC 7.16, Ampere and Ada
// boards 2.0 and 6.16; none of them has a power-management object ("N/A").
NVML_EXPORT nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t device, nvmlInforomObject_t object, char* version,
                                                     unsigned int length) {
  if (object != NVML_INFOROM_OEM && object != NVML_INFOROM_ECC && object != NVML_INFOROM_POWER) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  return OnGpu(device, [&](const Dev& d) -> nvmlReturn_t {
    const bool hopper = d.model().architecture >= NVML_DEVICE_ARCH_HOPPER;
    switch (object) {
      case NVML_INFOROM_OEM:
        return CopyString(hopper ? "2.1" : "2.0", version, length);
      case NVML_INFOROM_ECC:
        return CopyString(hopper ? "7.16" : "6.16", version, length);
      default:
        return NVML_ERROR_NOT_SUPPORTED;
    }
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetBoardId(nvmlDevice_t device, unsigned int* board) {
  if (board == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *board = d.spec().bus << 8;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMultiGpuBoard(nvmlDevice_t device, unsigned int* multi) {
  if (multi == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev&) {
    *multi = 0;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t* type) {
  if (type == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(device, [&](const Dev&) {
    *type = NVML_BRAND_NVIDIA;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t* arch) {
  if (arch == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(device, [&](const Dev& d) {
    *arch = d.model().architecture;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major, int* minor) {
  if (AnyNull(major, minor)) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(device, [&](const Dev& d) {
    *major = d.model().cc_major;
    *minor = d.model().cc_minor;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int* cores) {
  if (cores == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *cores = d.model().cuda_cores;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryBusWidth(nvmlDevice_t device, unsigned int* width) {
  if (width == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *width = d.model().bus_width;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    FillPci(d.node.BusId(d.gpu), 0, d.spec().bus, d.model().pci_device_id, d.model().pci_subsystem_id, pci);
    return NVML_SUCCESS;
  });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  return nvmlDeviceGetPciInfo_v3(device, pci);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  return nvmlDeviceGetPciInfo_v3(device, pci);
}

namespace {
template <typename F>
nvmlReturn_t GpuUint(nvmlDevice_t device, unsigned* out, F&& value) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *out = value(d);
    return NVML_SUCCESS;
  });
}
}  // namespace

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int* v) {
  return GpuUint(device, v, [](const Dev& d) { return d.model().pcie_gen; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int* v) {
  return GpuUint(device, v, [](const Dev& d) { return d.model().pcie_gen; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int* v) {
  return GpuUint(device, v, [](const Dev& d) { return d.model().pcie_gen; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int* v) {
  return GpuUint(device, v, [](const Dev& d) { return d.model().pcie_width; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int* v) {
  return GpuUint(device, v, [](const Dev& d) { return d.model().pcie_width; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int* v) {
  return GpuUint(device, v, [](const Dev& d) { return d.g.pcie_replay; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                                     unsigned int* v) {
  if (counter != NVML_PCIE_UTIL_TX_BYTES && counter != NVML_PCIE_UTIL_RX_BYTES) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  return GpuUint(device, v, [&](const Dev& d) {
    return static_cast<unsigned>(counter == NVML_PCIE_UTIL_TX_BYTES ? d.g.pcie_tx_kbs : d.g.pcie_rx_kbs);
  });
}

namespace {
template <typename T, typename F>
nvmlReturn_t GpuEnum(nvmlDevice_t device, T* out, F&& value) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *out = value(d);
    return NVML_SUCCESS;
  });
}
}  // namespace

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t* mode) {
  return GpuEnum(device, mode,
                 [](const Dev& d) { return d.g.persistence != 0 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t* mode) {
  return GpuEnum(device, mode, [](const Dev&) { return NVML_FEATURE_DISABLED; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t* mode) {
  return GpuEnum(device, mode, [](const Dev&) { return NVML_FEATURE_DISABLED; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t* mode) {
  return GpuEnum(device, mode, [](const Dev& d) { return static_cast<nvmlComputeMode_t>(d.g.compute_mode); });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode) {
  if (mode != NVML_COMPUTEMODE_DEFAULT && mode != NVML_COMPUTEMODE_PROHIBITED &&
      mode != NVML_COMPUTEMODE_EXCLUSIVE_PROCESS) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  return OnGpu(device, [&](const Dev& d) {
    d.g.compute_mode = mode;
    return NVML_SUCCESS;
  });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t* p) {
  return GpuEnum(device, p, [](const Dev&) { return NVML_PSTATE_0; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t* p) {
  return nvmlDeviceGetPerformanceState(device, p);
}

// ---------------------------------------------------------------- telemetry
NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* u) {
  if (u == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if (!Valid(d, "util") || !Valid(d, "memutil")) return NVML_ERROR_UNKNOWN;
    u->gpu = DeviceUtilisation(d);
    u->memory = d.g.util_mem;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int* util,
                                                         unsigned int* period) {
  if (AnyNull(util, period)) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if (!Valid(d, "encutil")) return NVML_ERROR_UNKNOWN;
    *util = d.g.util_enc;
    *period = 167000;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int* util,
                                                         unsigned int* period) {
  if (AnyNull(util, period)) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if (!Valid(d, "decutil")) return NVML_ERROR_UNKNOWN;
    *util = d.g.util_dec;
    *period = 167000;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                                  unsigned int* temp) {
  if (temp == nullptr || sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if (!Valid(d, "temp")) return NVML_ERROR_UNKNOWN;
    *temp = d.g.temp_c;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t* t) {
  if (t == nullptr || t->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
  if (t->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  return OnGpu(device, [&](const Dev& d) {
    if (!Valid(d, "temp")) return NVML_ERROR_UNKNOWN;
    t->temperature = static_cast<int>(d.g.temp_c);
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t type,
                                                           unsigned int* temp) {
  if (temp == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) -> nvmlReturn_t {
    unsigned v = 0;
    switch (type) {
      case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
        v = d.model().temp_shutdown;
        break;
      case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
        v = d.model().temp_slowdown;
        break;
      case NVML_TEMPERATURE_THRESHOLD_MEM_MAX:
        v = d.model().temp_mem_max;
        break;
      case NVML_TEMPERATURE_THRESHOLD_GPU_MAX:
        v = d.model().temp_gpu_max;
        break;
      default:
        return NVML_ERROR_NOT_SUPPORTED;
    }
    if (v == 0) return NVML_ERROR_NOT_SUPPORTED;
    *temp = v;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int* speed) {
  if (speed == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [](const Dev&) { return NVML_ERROR_NOT_SUPPORTED; });  // passively cooled
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power) {
  return GpuUint(device, power, [](const Dev& d) { return d.g.power_mw; });
}

namespace {
uint64_t Energy(const Dev& d) {
  const int64_t now = MonotonicNs();
  const int64_t dt = now - d.g.energy_ts_ns;
  if (dt > 0) {
    d.g.energy_mj += static_cast<uint64_t>(static_cast<double>(d.g.power_mw) * static_cast<double>(dt) / 1e9);
    d.g.energy_ts_ns = now;
  }
  return d.g.energy_mj;
}
}  // namespace

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long* energy) {
  if (energy == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *energy = Energy(d);
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t device, nvmlEnableState_t* m) {
  return GpuEnum(device, m, [](const Dev&) { return NVML_FEATURE_ENABLED; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int* limit) {
  return GpuUint(device, limit, [](const Dev& d) { return d.g.power_limit_mw; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int* limit) {
  return GpuUint(device, limit, [](const Dev& d) { return d.g.power_limit_mw; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int* limit) {
  return GpuUint(device, limit, [](const Dev& d) { return d.model().power_limit_w * 1000; });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int* min_limit,
                                                                      unsigned int* max_limit) {
  if (AnyNull(min_limit, max_limit)) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *min_limit = d.model().power_min_w * 1000;
    *max_limit = d.model().power_limit_w * 1000;
    return NVML_SUCCESS;
  });
}

namespace {
nvmlReturn_t ClockOf(const Dev& d, nvmlClockType_t type, bool max, unsigned* out) {
  const GpuModel& m = d.model();
  switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM:
      *out = max ? m.max_sm_mhz : d.g.sm_clock;
      return NVML_SUCCESS;
    case NVML_CLOCK_MEM:
      *out = max ? m.max_mem_mhz : d.g.mem_clock;
      return NVML_SUCCESS;
    case NVML_CLOCK_VIDEO:
      *out = (max ? m.max_sm_mhz : d.g.sm_clock) * 9 / 10;
      return NVML_SUCCESS;
    default:
      return NVML_ERROR_INVALID_ARGUMENT;
  }
}
}  // namespace

NVML_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int* clock) {
  if (clock == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) { return ClockOf(d, type, false, clock); });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int* clock) {
  if (clock == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) { return ClockOf(d, type, true, clock); });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t type, nvmlClockId_t id,
                                            unsigned int* clock) {
  if (clock == nullptr || id > NVML_CLOCK_ID_CUSTOMER_BOOST_MAX) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) { return ClockOf(d, type, id != NVML_CLOCK_ID_CURRENT, clock); });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t type,
                                                        unsigned int* clock) {
  return nvmlDeviceGetMaxClockInfo(device, type, clock);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, nvmlClockType_t type,
                                                               unsigned int* clock) {
  return nvmlDeviceGetMaxClockInfo(device, type, clock);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t device, nvmlClockType_t type,
                                                            unsigned int* clock) {
  return nvmlDeviceGetMaxClockInfo(device, type, clock);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long* reasons) {
  if (reasons == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *reasons = (DeviceUtilisation(d) == 0 ? 0x1ULL : 0ULL) | (d.g.temp_c >= d.model().temp_slowdown ? 0x20ULL : 0ULL);
    return NVML_SUCCESS;
  });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long* reasons) {
  return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device, unsigned long long* reasons) {
  if (reasons == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev&) {
    *reasons = 0x1ULL | 0x2ULL | 0x4ULL | 0x8ULL | 0x20ULL | 0x40ULL | 0x80ULL | 0x100ULL;
    return NVML_SUCCESS;
  });
}

// Time the clocks were held back by each policy since the driver loaded. The simulated node does
// not integrate its state over time, so no policy has held them back: 0 ns (what an idle GPU
// shows), with the reference time of the reading.
NVML_EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t policy,
                                                      nvmlViolationTime_t* t) {
  if (t == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  switch (policy) {
    case NVML_PERF_POLICY_POWER:
    case NVML_PERF_POLICY_THERMAL:
    case NVML_PERF_POLICY_SYNC_BOOST:
    case NVML_PERF_POLICY_BOARD_LIMIT:
    case NVML_PERF_POLICY_LOW_UTILIZATION:
    case NVML_PERF_POLICY_RELIABILITY:
    case NVML_PERF_POLICY_TOTAL_APP_CLOCKS:
    case NVML_PERF_POLICY_TOTAL_BASE_CLOCKS:
      break;
    default:
      return NVML_ERROR_INVALID_ARGUMENT;
  }
  return OnGpu(device, [&](const Dev&) {
    t->referenceTime = RealtimeUs();
    t->violationTime = 0;
    return NVML_SUCCESS;
  });
}

// ---------------------------------------------------------------- memory and ECC
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(device, [&](const Dev& d) {
    const MemoryFigures m = Memory(d);
    if (!m.valid()) return NVML_ERROR_UNKNOWN;
    memory->total = m.total;
    memory->used = m.reserved + m.used;  // v1 counts the reserved memory as used
    memory->free = m.total - memory->used;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  return OnDevice(device, [&](const Dev& d) {
    const MemoryFigures m = Memory(d);
    if (!m.valid()) return NVML_ERROR_UNKNOWN;
    memory->total = m.total;
    memory->reserved = m.reserved;
    memory->used = m.used;
    memory->free = m.total - m.reserved - m.used;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t* bar1) {
  if (bar1 == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    const uint64_t mib = d.model().architecture >= 9 ? 131072 : d.model().architecture == 7 ? 65536 : 32768;
    bar1->bar1Total = mib << 20;
    bar1->bar1Used = (5ULL << 20) + ProcessMemory(d) / 1024;
    bar1->bar1Free = bar1->bar1Total - bar1->bar1Used;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t* current,
                                              nvmlEnableState_t* pending) {
  if (AnyNull(current, pending)) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev&) {
    *current = *pending = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
  });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetDefaultEccMode(nvmlDevice_t device, nvmlEnableState_t* mode) {
  return GpuEnum(device, mode, [](const Dev&) { return NVML_FEATURE_ENABLED; });
}

namespace {
nvmlReturn_t EccCount(const Dev& d, nvmlMemoryErrorType_t type, nvmlEccCounterType_t counter, unsigned long long* out) {
  if (type > NVML_MEMORY_ERROR_TYPE_UNCORRECTED || counter > NVML_AGGREGATE_ECC) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  const bool sbe = type == NVML_MEMORY_ERROR_TYPE_CORRECTED;
  if (counter == NVML_VOLATILE_ECC) {
    *out = sbe ? d.g.ecc_sbe_vol : d.g.ecc_dbe_vol;
  } else {
    *out = sbe ? d.g.ecc_sbe_agg : d.g.ecc_dbe_agg;
  }
  return NVML_SUCCESS;
}
}  // namespace

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                     nvmlEccCounterType_t counter, unsigned long long* count) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) { return EccCount(d, type, counter, count); });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, nvmlMemoryErrorType_t type,
                                                         nvmlEccCounterType_t counter, nvmlMemoryLocation_t location,
                                                         unsigned long long* count) {
  if (count == nullptr || location > NVML_MEMORY_LOCATION_SRAM) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if (location != NVML_MEMORY_LOCATION_DRAM) {
      *count = 0;
      return EccCount(d, type, counter, count) == NVML_SUCCESS ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    }
    return EccCount(d, type, counter, count);
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int* corr, unsigned int* unc,
                                                   unsigned int* pending, unsigned int* failure) {
  if (AnyNull(corr, unc, pending, failure)) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *corr = d.g.remapped_cor;
    *unc = d.g.remapped_unc;
    *pending = d.g.remapped_pending;
    *failure = d.g.remapped_failure;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t* values) {
  if (values == nullptr || count <= 0) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    const auto now = static_cast<long long>(RealtimeUs());
    for (int i = 0; i < count; ++i) {
      nvmlFieldValue_t& f = values[i];
      f.timestamp = now;
      f.latencyUsec = 0;
      f.nvmlReturn = NVML_SUCCESS;
      f.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
      unsigned long long v = 0;
      switch (f.fieldId) {
        case NVML_FI_DEV_ECC_CURRENT:
        case NVML_FI_DEV_ECC_PENDING:
          v = 1;
          break;
        case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
          v = d.g.ecc_sbe_vol;
          break;
        case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
          v = d.g.ecc_dbe_vol;
          break;
        case NVML_FI_DEV_ECC_SBE_AGG_TOTAL:
          v = d.g.ecc_sbe_agg;
          break;
        case NVML_FI_DEV_ECC_DBE_AGG_TOTAL:
          v = d.g.ecc_dbe_agg;
          break;
        case NVML_FI_DEV_MEMORY_TEMP:
          if (d.model().temp_mem_max == 0) f.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
          v = d.g.mem_temp_c;
          break;
        case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
          v = Energy(d);
          break;
        case NVML_FI_DEV_NVLINK_LINK_COUNT:
          v = d.node.profile().nvlink == "none" ? 0 : d.model().nvlinks;
          break;
        case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
          v = d.g.pcie_replay;
          break;
        case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
        case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
          // scopeId: one link (its share of the GPU's counter), or NVML_FI_SCOPE_ALL_LINKS for all.
          if (d.node.profile().nvlink == "none" || d.model().nvlinks == 0) {
            f.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
          } else if (f.scopeId != NVML_FI_SCOPE_ALL_LINKS && f.scopeId >= d.model().nvlinks) {
            f.nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
          }
          v = f.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX ? d.g.nvlink_tx_kib : d.g.nvlink_rx_kib;
          if (f.scopeId != NVML_FI_SCOPE_ALL_LINKS && d.model().nvlinks > 0) v /= d.model().nvlinks;
          break;
        case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
        case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL:
        case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
        case NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
          // Healthy links: no errors. PCIe-only GPUs have no NVLink counters.
          if (d.node.profile().nvlink == "none" || d.model().nvlinks == 0) f.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
          v = 0;
          break;
        case NVML_FI_DEV_RETIRED_SBE:
        case NVML_FI_DEV_RETIRED_DBE:
        case NVML_FI_DEV_RETIRED_PENDING:
          // Ampere and newer remap rows instead of retiring pages: drivers answer NOT_SUPPORTED
          // (nvidia-smi -q: "Retired Pages: N/A"); every simulated model is Ampere or newer.
          if (d.model().architecture >= NVML_DEVICE_ARCH_AMPERE) f.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
          v = 0;
          break;
        case NVML_FI_DEV_REMAPPED_COR:
          v = d.g.remapped_cor;
          break;
        case NVML_FI_DEV_REMAPPED_UNC:
          v = d.g.remapped_unc;
          break;
        case NVML_FI_DEV_REMAPPED_PENDING:
          v = d.g.remapped_pending;
          break;
        case NVML_FI_DEV_REMAPPED_FAILURE:
          v = d.g.remapped_failure;
          break;
        case NVML_FI_DEV_POWER_AVERAGE:
        case NVML_FI_DEV_POWER_INSTANT:
          v = d.g.power_mw;
          break;
        default:
          f.nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
          break;
      }
      f.value.ullVal = v;
    }
    return NVML_SUCCESS;
  });
}

// ---------------------------------------------------------------- processes
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int* count,
                                                                 nvmlProcessInfo_t* infos) {
  return RunningProcesses(device, 0, count, infos, true);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int* count,
                                                                 nvmlProcessInfo_v2_t* infos) {
  return RunningProcesses(device, 0, count, infos, true);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int* count,
                                                              nvmlProcessInfo_v1_t* infos) {
  return RunningProcesses(device, 0, count, infos, false);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int* count,
                                                                  nvmlProcessInfo_t* infos) {
  return RunningProcesses(device, 1, count, infos, true);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int* count,
                                                                  nvmlProcessInfo_v2_t* infos) {
  return RunningProcesses(device, 1, count, infos, true);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int* count,
                                                               nvmlProcessInfo_v1_t* infos) {
  return RunningProcesses(device, 1, count, infos, false);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int* count,
                                                                    nvmlProcessInfo_t* infos) {
  return RunningProcesses(device, 2, count, infos, true);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int* count,
                                                                    nvmlProcessInfo_v2_t* infos) {
  return RunningProcesses(device, 2, count, infos, true);
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int* count,
                                                                 nvmlProcessInfo_v1_t* infos) {
  return RunningProcesses(device, 2, count, infos, false);
}

// One sample per process: those kgpu-simctl added (with the utilisation and the time it set)
// when newer than last_seen, then one for each other process whose kernels (of the simulated
// driver) ran in the window (last_seen, now] capped to the last second (and to what the kernel
// ring still covers), stamped now, with smUtil the percentage of the window its kernels ran
// (elapsed parts only) and no memory, encoder or decoder figure. lastSeenTimeStamp and timeStamp
// are CPU timestamps in microseconds (NVML API Reference, nvmlDeviceGetProcessUtilization and
// nvmlProcessUtilizationSample_t: CLOCK_REALTIME here); 0 reads every sample the driver keeps.
// The buffer protocol is the real call's: samples NULL or *count too small gives the count
// needed with NVML_ERROR_INSUFFICIENT_SIZE; no sample newer than last_seen gives
// NVML_ERROR_NOT_FOUND.
NVML_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t* samples,
                                                         unsigned int* count, unsigned long long last_seen) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) -> nvmlReturn_t {
    std::vector<nvmlProcessUtilizationSample_t> found;
    for (unsigned i = 0; i < d.g.nproc; ++i) {
      const SimProcess& p = d.g.procs[i];
      if (p.sample_us > last_seen) found.push_back({p.pid, p.sample_us, p.sm_util, p.mem_util, 0, 0});
    }
    const int64_t now = MonotonicNs();
    const uint64_t now_us = RealtimeUs();
    const SimExec& x = d.lock.state().exec[d.gpu];
    if (last_seen < now_us && x.kernel_count > 0) {
      // last_seen on the monotonic clock (no further back than the window: no overflow).
      const uint64_t ago_us = std::min<uint64_t>(now_us - last_seen, kUtilWindowNs / 1000);
      const int64_t from = std::max(now - static_cast<int64_t>(ago_us) * 1000, RingHorizon(x));
      std::vector<std::pair<uint32_t, int64_t>> busy;  // pid, kernel time in the window
      ForKernelTime(x, from, now, [&](const SimKernel& k, int64_t ns) {
        auto it = std::find_if(busy.begin(), busy.end(), [&](const auto& b) { return b.first == k.pid; });
        if (it == busy.end()) {
          busy.emplace_back(k.pid, ns);
        } else {
          it->second += ns;
        }
      });
      for (const auto& b : busy) {
        const bool by_hand = std::any_of(d.g.procs, d.g.procs + std::min(d.g.nproc, kMaxProcs),
                                         [&](const SimProcess& p) { return p.pid == b.first && p.sample_us != 0; });
        if (!by_hand) found.push_back({b.first, now_us, Percent(b.second, now - from), 0, 0, 0});
      }
    }
    if (found.empty()) {
      *count = 0;
      return NVML_ERROR_NOT_FOUND;
    }
    if (samples == nullptr || *count < found.size()) {
      *count = static_cast<unsigned>(found.size());
      return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    std::copy(found.begin(), found.end(), samples);
    *count = static_cast<unsigned>(found.size());
    return NVML_SUCCESS;
  });
}

// ---------------------------------------------------------------- topology and NVLink
namespace {
// Runs f(node, a, b) with both handles resolved to their GPUs.
template <typename F>
nvmlReturn_t OnPair(nvmlDevice_t d1, nvmlDevice_t d2, F&& f) {
  unsigned a = 0;
  const nvmlReturn_t rc = OnDevice(d1, [&](const Dev& d) {
    a = d.gpu;
    return NVML_SUCCESS;
  });
  if (rc != NVML_SUCCESS) return rc;
  return OnDevice(d2, [&](const Dev& d) { return f(d.node, a, d.gpu); });
}

bool HasNvLink(const Dev& d) {
  return d.node.profile().nvlink == "nvswitch" && d.model().nvlinks > 0;
}

template <typename F>
nvmlReturn_t OnLink(nvmlDevice_t device, unsigned link, F&& f) {
  return OnGpu(device, [&](const Dev& d) -> nvmlReturn_t {
    if (!HasNvLink(d)) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= d.model().nvlinks) return NVML_ERROR_INVALID_ARGUMENT;
    return f(d, link % d.node.profile().nvswitches);
  });
}
}  // namespace

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t d1, nvmlDevice_t d2,
                                                             nvmlGpuTopologyLevel_t* level) {
  if (level == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnPair(d1, d2, [&](const Node& node, unsigned a, unsigned b) {
    *level = Level(node, a, b);
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, nvmlGpuTopologyLevel_t level,
                                                          unsigned int* count, nvmlDevice_t* devices) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    std::vector<unsigned> near;
    for (unsigned i = 0; i < d.node.gpu_count(); ++i) {
      if (i != d.gpu && Level(d.node, d.gpu, i) <= level) near.push_back(i);
    }
    if (devices == nullptr || *count < near.size()) {
      *count = static_cast<unsigned>(near.size());
      return devices == nullptr ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (size_t i = 0; i < near.size(); ++i) devices[i] = GpuHandle(near[i]);
    *count = static_cast<unsigned>(near.size());
    return NVML_SUCCESS;
  });
}

// Peer-to-peer between two GPUs: over NVSwitch every pair of NVLink GPUs has every capability;
// over PCIe, reads and writes work below one host bridge and nothing crosses the CPU's root
// complex (IOH topology); NVLink and atomics need NVLink.
NVML_EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, nvmlGpuP2PCapsIndex_t index,
                                                nvmlGpuP2PStatus_t* status) {
  if (status == nullptr || index > NVML_P2P_CAPS_INDEX_PROP) return NVML_ERROR_INVALID_ARGUMENT;
  return OnPair(d1, d2, [&](const Node& node, unsigned a, unsigned b) {
    const auto& gpus = node.profile().gpus;
    const bool nvlink = node.profile().nvlink == "nvswitch" && gpus[a].model->nvlinks > 0 && gpus[b].model->nvlinks > 0;
    if (a == b) {
      *status = NVML_P2P_STATUS_NOT_SUPPORTED;
    } else if (nvlink) {
      *status = NVML_P2P_STATUS_OK;
    } else if (index == NVML_P2P_CAPS_INDEX_NVLINK || index == NVML_P2P_CAPS_INDEX_ATOMICS) {
      *status = NVML_P2P_STATUS_NOT_SUPPORTED;
    } else {
      *status = Level(node, a, b) <= NVML_TOPOLOGY_HOSTBRIDGE ? NVML_P2P_STATUS_OK
                                                              : NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceOnSameBoard(nvmlDevice_t d1, nvmlDevice_t d2, int* same) {
  if (same == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnPair(d1, d2, [&](const Node&, unsigned a, unsigned b) {
    *same = a == b ? 1 : 0;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int size, unsigned long* cpus) {
  if (cpus == nullptr || size == 0) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    constexpr unsigned kCpusPerNuma = 56;  // a 2-socket, 56-core-per-socket host
    std::memset(cpus, 0, size * sizeof(unsigned long));
    const unsigned first = static_cast<unsigned>(d.spec().numa_node) * kCpusPerNuma;
    for (unsigned c = first; c < first + kCpusPerNuma && c / 64 < size; ++c) {
      cpus[c / 64] |= 1UL << (c % 64);
    }
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t* active) {
  if (active == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnLink(device, link, [&](const Dev&, unsigned) {
    *active = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int* version) {
  if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnLink(device, link, [&](const Dev& d, unsigned) {
    *version = d.model().nvlink_version;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                             nvmlPciInfo_t* pci) {
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnLink(device, link, [&](const Dev&, unsigned sw) {
    char bus_id[32];
    std::snprintf(bus_id, sizeof bus_id, "00000002:%02X:00.0", 0x10 + sw);
    FillPci(bus_id, 2, 0x10 + sw, 0x22A310DE, 0x16C310DE, pci);  // NVSwitch
    return NVML_SUCCESS;
  });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t* pci) {
  return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                             nvmlIntNvLinkDeviceType_t* type) {
  if (type == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnLink(device, link, [&](const Dev&, unsigned) {
    *type = NVML_NVLINK_DEVICE_TYPE_SWITCH;
    return NVML_SUCCESS;
  });
}

// ---------------------------------------------------------------- events
NVML_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  const Node* node = Current();
  if (node == nullptr) return NVML_ERROR_UNINITIALIZED;
  if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  auto* es = new EventSet;
  es->cursor = node->EventHead();
  *set = reinterpret_cast<nvmlEventSet_t>(es);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  if (Current() == nullptr) return NVML_ERROR_UNINITIALIZED;
  auto* es = reinterpret_cast<EventSet*>(set);
  if (es == nullptr || es->magic != kSetMagic) return NVML_ERROR_INVALID_ARGUMENT;
  es->magic = 0;
  delete es;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long* types) {
  if (types == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    *types = SupportedEvents(d.model());
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
  auto* es = reinterpret_cast<EventSet*>(set);
  if (es == nullptr || es->magic != kSetMagic) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if ((types & ~SupportedEvents(d.model())) != 0) return NVML_ERROR_NOT_SUPPORTED;
    std::lock_guard<std::mutex> lock(es->mu);
    if (es->masks[d.gpu] == 0) es->since[d.gpu] = d.lock.state().event_head;  // only later events
    es->masks[d.gpu] |= types;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data, unsigned int timeout_ms) {
  return WaitImpl(set, data, timeout_ms);
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_v1_t* data, unsigned int timeout_ms) {
  if (data == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  nvmlEventData_t full{};
  const nvmlReturn_t rc = WaitImpl(set, &full, timeout_ms);
  if (rc == NVML_SUCCESS) {
    data->device = full.device;
    data->eventType = full.eventType;
    data->eventData = full.eventData;
  }
  return rc;
}

// ---------------------------------------------------------------- MIG
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int* current, unsigned int* pending) {
  if (AnyNull(current, pending)) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if (d.model().max_mig_devices == 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = d.g.mig_current;
    *pending = d.g.mig_pending;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t* activation) {
  if (activation == nullptr || mode > 1) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if (d.model().max_mig_devices == 0) return NVML_ERROR_NOT_SUPPORTED;
    for (const auto& gi : d.g.gis) {
      if (gi.used != 0 && mode == 0) return NVML_ERROR_IN_USE;
    }
    d.g.mig_pending = mode;
    if (d.g.nproc == 0) {
      d.g.mig_current = mode;  // an idle GPU switches at once
      *activation = NVML_SUCCESS;
    } else {
      *activation = NVML_ERROR_IN_USE;  // pending until the GPU is reset
    }
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int* count) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if (d.model().max_mig_devices == 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = d.g.mig_current != 0 ? d.model().max_mig_devices : 0;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                             nvmlDevice_t* mig) {
  if (mig == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) {
    if (d.model().max_mig_devices == 0 || d.g.mig_current == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (index >= d.model().max_mig_devices) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (unsigned s = 0; s < kMaxGis; ++s) {
      for (unsigned c = 0; c < kMaxCis && d.g.gis[s].used != 0; ++c) {
        if (d.g.gis[s].cis[c].used != 0 && n++ == index) {
          *mig = reinterpret_cast<nvmlDevice_t>(&H().migs[d.gpu][s][c]);
          return NVML_SUCCESS;
        }
      }
    }
    return NVML_ERROR_NOT_FOUND;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t* device) {
  if (device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(mig, [&](const Dev& d) {
    if (!d.mig()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = GpuHandle(d.gpu);
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int* is_mig) {
  if (is_mig == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(device, [&](const Dev& d) {
    *is_mig = d.mig() ? 1 : 0;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int* id) {
  if (id == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(device, [&](const Dev& d) {
    if (!d.mig()) return NVML_ERROR_NOT_SUPPORTED;
    *id = d.gi().id;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int* id) {
  if (id == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(device, [&](const Dev& d) {
    if (!d.mig()) return NVML_ERROR_NOT_SUPPORTED;
    *id = d.ci().id;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t* a) {
  if (a == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnDevice(device, [&](const Dev& d) {
    std::memset(a, 0, sizeof *a);
    if (d.mig()) {
      const MigProfile& p = d.gi_profile();
      a->multiprocessorCount = p.sm_count * d.ci().size / p.compute_slices;
      a->sharedCopyEngineCount = p.copy_engines;
      a->sharedDecoderCount = p.decoders;
      a->sharedJpegCount = p.jpegs;
      a->sharedOfaCount = p.ofas;
      a->gpuInstanceSliceCount = p.compute_slices;
      a->computeInstanceSliceCount = d.ci().size;
      a->memorySizeMB = p.memory_mib;
    } else {
      a->multiprocessorCount = d.model().sm_count;
      a->gpuInstanceSliceCount = d.model().max_mig_devices;
      a->computeInstanceSliceCount = d.model().max_mig_devices;
      a->memorySizeMB = d.model().memory_mib;
    }
    return NVML_SUCCESS;
  });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t* a) {
  return nvmlDeviceGetAttributes_v2(device, a);
}

namespace {
template <typename F>
nvmlReturn_t OnMigGpu(nvmlDevice_t device, F&& f) {
  return OnGpu(device, [&](const Dev& d) -> nvmlReturn_t {
    if (d.model().max_mig_devices == 0) return NVML_ERROR_NOT_SUPPORTED;
    return f(d);
  });
}

template <typename Info>
void FillGiProfile(const MigProfile& p, Info* info) {
  info->id = p.id;
  info->isP2pSupported = 0;
  info->sliceCount = p.compute_slices;
  info->instanceCount = p.max_instances;
  info->multiprocessorCount = p.sm_count;
  info->copyEngineCount = p.copy_engines;
  info->decoderCount = p.decoders;
  info->encoderCount = p.encoders;
  info->jpegCount = p.jpegs;
  info->ofaCount = p.ofas;
  info->memorySizeMB = p.memory_mib;
}
}  // namespace

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                             nvmlGpuInstanceProfileInfo_t* info) {
  if (info == nullptr || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
  return OnMigGpu(device, [&](const Dev& d) {
    const MigProfile* p = FindMigProfileByIndex(d.model(), profile);
    if (p == nullptr) return NVML_ERROR_NOT_SUPPORTED;
    FillGiProfile(*p, info);
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                              nvmlGpuInstanceProfileInfo_v2_t* info) {
  if (info == nullptr || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
  if (info->version != nvmlGpuInstanceProfileInfo_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  return OnMigGpu(device, [&](const Dev& d) {
    const MigProfile* p = FindMigProfileByIndex(d.model(), profile);
    if (p == nullptr) return NVML_ERROR_NOT_SUPPORTED;
    FillGiProfile(*p, info);
    std::snprintf(info->name, sizeof info->name, "MIG %s", p->name.c_str());
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profile_id,
                                                                       nvmlGpuInstancePlacement_t* placements,
                                                                       unsigned int* count) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnMigGpu(device, [&](const Dev& d) {
    const MigProfile* p = FindMigProfileById(d.model(), profile_id);
    if (p == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (placements == nullptr) {
      *count = static_cast<unsigned>(p->starts.size());
      return NVML_SUCCESS;
    }
    if (*count < p->starts.size()) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (size_t i = 0; i < p->starts.size(); ++i) placements[i] = {p->starts[i], p->memory_slices};
    *count = static_cast<unsigned>(p->starts.size());
    return NVML_SUCCESS;
  });
}
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profile_id,
                                                                    nvmlGpuInstancePlacement_t* placements,
                                                                    unsigned int* count) {
  return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profile_id, placements, count);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profile_id,
                                                                   unsigned int* count) {
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnMigGpu(device, [&](const Dev& d) {
    const MigProfile* p = FindMigProfileById(d.model(), profile_id);
    if (p == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    *count = d.g.mig_current != 0 ? GiRemaining(d, *p) : 0;
    return NVML_SUCCESS;
  });
}

namespace {
nvmlReturn_t CreateGi(nvmlDevice_t device, unsigned profile_id, int start, nvmlGpuInstance_t* gi) {
  if (gi == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnMigGpu(device, [&](const Dev& d) {
    const MigProfile* p = FindMigProfileById(d.model(), profile_id);
    if (p == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned slot = 0;
    const int rc = d.node.CreateGpuInstance(d.lock, d.gpu, *p, start, &slot);
    if (rc == 0) *gi = reinterpret_cast<nvmlGpuInstance_t>(GiHandle(d.gpu, slot));
    return static_cast<nvmlReturn_t>(rc);
  });
}
}  // namespace

NVML_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profile_id,
                                                     nvmlGpuInstance_t* gi) {
  return CreateGi(device, profile_id, -1, gi);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profile_id,
                                                                  const nvmlGpuInstancePlacement_t* placement,
                                                                  nvmlGpuInstance_t* gi) {
  if (placement == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return CreateGi(device, profile_id, static_cast<int>(placement->start), gi);
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi) {
  return OnInstance(gi, kGiMagic, [&](const Dev& d, unsigned slot, int) {
    return static_cast<nvmlReturn_t>(d.node.DestroyGpuInstance(d.lock, d.gpu, slot));
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profile_id, nvmlGpuInstance_t* gis,
                                                   unsigned int* count) {
  if (AnyNull(gis, count)) return NVML_ERROR_INVALID_ARGUMENT;
  return OnMigGpu(device, [&](const Dev& d) {
    const MigProfile* p = FindMigProfileById(d.model(), profile_id);
    if (p == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    if (d.g.mig_current == 0) return NVML_ERROR_NOT_SUPPORTED;
    unsigned n = 0;
    for (unsigned s = 0; s < kMaxGis; ++s) {
      if (d.g.gis[s].used != 0 && d.g.gis[s].profile_index == p->index) {
        gis[n++] = reinterpret_cast<nvmlGpuInstance_t>(GiHandle(d.gpu, s));
      }
    }
    *count = n;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t* gi) {
  if (gi == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnMigGpu(device, [&](const Dev& d) {
    if (d.g.mig_current == 0) return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned s = 0; s < kMaxGis; ++s) {
      if (d.g.gis[s].used != 0 && d.g.gis[s].id == id) {
        *gi = reinterpret_cast<nvmlGpuInstance_t>(GiHandle(d.gpu, s));
        return NVML_SUCCESS;
      }
    }
    return NVML_ERROR_NOT_FOUND;
  });
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t* info) {
  if (info == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnInstance(gi, kGiMagic, [&](const Dev& d, unsigned slot, int) {
    const SimGi& g = d.g.gis[slot];
    info->device = GpuHandle(d.gpu);
    info->id = g.id;
    info->profileId = FindMigProfileByIndex(d.model(), g.profile_index)->id;
    info->placement = {g.start, g.size};
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gi, unsigned int profile,
                                                                      unsigned int eng_profile,
                                                                      nvmlComputeInstanceProfileInfo_t* info) {
  if (info == nullptr || profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  if (eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED) return NVML_ERROR_NOT_SUPPORTED;
  return OnInstance(gi, kGiMagic, [&](const Dev& d, unsigned slot, int) {
    const MigProfile& p = *FindMigProfileByIndex(d.model(), d.g.gis[slot].profile_index);
    if (profile > NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE) return NVML_ERROR_NOT_SUPPORTED;
    const unsigned size = CiSize(profile);
    if (size > p.compute_slices || p.compute_slices % size != 0) return NVML_ERROR_NOT_SUPPORTED;
    info->id = profile;
    info->sliceCount = size;
    info->instanceCount = p.compute_slices / size;
    info->multiprocessorCount = p.sm_count * size / p.compute_slices;
    info->sharedCopyEngineCount = p.copy_engines;
    info->sharedDecoderCount = p.decoders;
    info->sharedEncoderCount = p.encoders;
    info->sharedJpegCount = p.jpegs;
    info->sharedOfaCount = p.ofas;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gi,
                                                                            unsigned int profile_id,
                                                                            unsigned int* count) {
  if (count == nullptr || profile_id > NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  return OnInstance(gi, kGiMagic, [&](const Dev& d, unsigned slot, int) {
    const SimGi& g = d.g.gis[slot];
    const unsigned slices = FindMigProfileByIndex(d.model(), g.profile_index)->compute_slices;
    unsigned used = 0;
    for (const auto& ci : g.cis) used += ci.used != 0 ? ci.size : 0;
    *count = (slices - used) / CiSize(profile_id);
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gi, unsigned int profile_id,
                                                              nvmlComputeInstance_t* ci) {
  if (ci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnInstance(gi, kGiMagic, [&](const Dev& d, unsigned slot, int) {
    unsigned ci_slot = 0;
    const int rc = d.node.CreateComputeInstance(d.lock, d.gpu, slot, profile_id, &ci_slot);
    if (rc == 0) *ci = reinterpret_cast<nvmlComputeInstance_t>(CiHandle(d.gpu, slot, ci_slot));
    return static_cast<nvmlReturn_t>(rc);
  });
}

NVML_EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t ci) {
  return OnInstance(ci, kCiMagic, [&](const Dev& d, unsigned slot, int ci_slot) {
    return static_cast<nvmlReturn_t>(
        d.node.DestroyComputeInstance(d.lock, d.gpu, slot, static_cast<unsigned>(ci_slot)));
  });
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gi, unsigned int profile_id,
                                                            nvmlComputeInstance_t* cis, unsigned int* count) {
  if (AnyNull(cis, count)) return NVML_ERROR_INVALID_ARGUMENT;
  return OnInstance(gi, kGiMagic, [&](const Dev& d, unsigned slot, int) {
    unsigned n = 0;
    for (unsigned c = 0; c < kMaxCis; ++c) {
      const SimCi& x = d.g.gis[slot].cis[c];
      if (x.used != 0 && x.profile_index == profile_id) {
        cis[n++] = reinterpret_cast<nvmlComputeInstance_t>(CiHandle(d.gpu, slot, c));
      }
    }
    *count = n;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gi, unsigned int id,
                                                               nvmlComputeInstance_t* ci) {
  if (ci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnInstance(gi, kGiMagic, [&](const Dev& d, unsigned slot, int) {
    for (unsigned c = 0; c < kMaxCis; ++c) {
      if (d.g.gis[slot].cis[c].used != 0 && d.g.gis[slot].cis[c].id == id) {
        *ci = reinterpret_cast<nvmlComputeInstance_t>(CiHandle(d.gpu, slot, c));
        return NVML_SUCCESS;
      }
    }
    return NVML_ERROR_NOT_FOUND;
  });
}

NVML_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t* info) {
  if (info == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnInstance(ci, kCiMagic, [&](const Dev& d, unsigned slot, int ci_slot) {
    const SimCi& c = d.g.gis[slot].cis[ci_slot];
    info->device = GpuHandle(d.gpu);
    info->gpuInstance = reinterpret_cast<nvmlGpuInstance_t>(GiHandle(d.gpu, slot));
    info->id = c.id;
    info->profileId = c.profile_index;
    info->placement = {c.start, c.size};
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_v1_t* info) {
  if (info == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  nvmlComputeInstanceInfo_t full{};
  const nvmlReturn_t rc = nvmlComputeInstanceGetInfo_v2(ci, &full);
  if (rc == NVML_SUCCESS) {
    info->device = full.device;
    info->gpuInstance = full.gpuInstance;
    info->id = full.id;
    info->profileId = full.profileId;
  }
  return rc;
}

// ---------------------------------------------------------------- GPM (Hopper and newer)
namespace {

// A GPM sample of the simulated node. NVML's holds the GPU's cumulative performance counters; the
// simulated node keeps no such counters, only its current utilisation, so a sample records that
// (and the NVLink KiB counters) with its time, and a metric between two samples is the mean of
// the two readings (the trapezoid rule over the interval): a steady GPU reads its utilisation,
// and the figures follow kgpu-simctl's `set` deterministically. NVLink throughput is the
// difference of the counters over the interval, as on a real GPU.
struct GpmSampleData {
  bool filled = false;
  unsigned gpu = 0;
  uint32_t gi = kNoId;  // GPU instance id; kNoId: the whole GPU
  int64_t ts_ns = 0;
  double util = 0, mem_util = 0, dec_util = 0;  // percent
  double pcie_tx_mibps = 0, pcie_rx_mibps = 0;
  bool nvlink = false;
  uint64_t nvlink_tx_kib = 0, nvlink_rx_kib = 0;
  unsigned decoders = 0, jpegs = 0, ofas = 0;
};

struct GpmSamples {
  std::mutex mu;
  std::set<GpmSampleData*> live;  // a freed or forged pointer is refused, never dereferenced
};
GpmSamples& Samples() {
  static auto* s = new GpmSamples;
  return *s;
}

// The sample behind a handle, or nullptr.
GpmSampleData* SampleOf(nvmlGpmSample_t handle) {
  GpmSamples& s = Samples();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* p = reinterpret_cast<GpmSampleData*>(handle);
  return s.live.count(p) > 0 ? p : nullptr;
}

bool HasGpm(const GpuModel& m) {
  return m.architecture >= NVML_DEVICE_ARCH_HOPPER;
}

// The media engines of the whole GPU: those of its largest MIG profile (the 7-slice one has them all).
const MigProfile* FullProfile(const GpuModel& m) {
  const MigProfile* full = nullptr;
  for (const auto& p : m.mig_profiles) {
    if (full == nullptr || p.compute_slices > full->compute_slices) full = &p;
  }
  return full;
}

// One metric (NVML_GPM_METRIC_* id) between two samples of one device; nullopt: not supported there.
std::optional<double> GpmValue(unsigned id, const GpmSampleData& a, const GpmSampleData& b) {
  const double util = (a.util + b.util) / 2;
  auto engine = [&](unsigned first, unsigned count, double value) -> std::optional<double> {
    if (id - first < count) return value;
    return std::nullopt;
  };
  switch (id) {
    case NVML_GPM_METRIC_GRAPHICS_UTIL:
      return util;
    case NVML_GPM_METRIC_SM_UTIL:
      return util * 0.9;
    case NVML_GPM_METRIC_SM_OCCUPANCY:
      return util * 0.6;
    case NVML_GPM_METRIC_INTEGER_UTIL:
      return util * 0.1;
    case NVML_GPM_METRIC_ANY_TENSOR_UTIL:
      return util * 0.5;
    case NVML_GPM_METRIC_DFMA_TENSOR_UTIL:
    case NVML_GPM_METRIC_IMMA_TENSOR_UTIL:
      return util * 0.05;
    case NVML_GPM_METRIC_HMMA_TENSOR_UTIL:
      return util * 0.4;
    case NVML_GPM_METRIC_DRAM_BW_UTIL:
      return (a.mem_util + b.mem_util) / 2;
    case NVML_GPM_METRIC_FP64_UTIL:
      return util * 0.1;
    case NVML_GPM_METRIC_FP32_UTIL:
      return util * 0.3;
    case NVML_GPM_METRIC_FP16_UTIL:
      return util * 0.2;
    case NVML_GPM_METRIC_PCIE_TX_PER_SEC:
    case NVML_GPM_METRIC_PCIE_RX_PER_SEC:
      if (a.gi != kNoId) return std::nullopt;  // the bus is the whole GPU's
      return id == NVML_GPM_METRIC_PCIE_TX_PER_SEC ? (a.pcie_tx_mibps + b.pcie_tx_mibps) / 2
                                                   : (a.pcie_rx_mibps + b.pcie_rx_mibps) / 2;
    case NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC:
    case NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: {
      if (!a.nvlink || a.gi != kNoId) return std::nullopt;
      const bool rx = id == NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC;
      const uint64_t before = rx ? a.nvlink_rx_kib : a.nvlink_tx_kib, after = rx ? b.nvlink_rx_kib : b.nvlink_tx_kib;
      const double seconds = static_cast<double>(b.ts_ns - a.ts_ns) / 1e9;
      return after >= before ? static_cast<double>(after - before) / 1024 / seconds : 0;  // MiB/s
    }
    default:
      break;
  }
  if (id >= NVML_GPM_METRIC_NVDEC_0_UTIL && id < NVML_GPM_METRIC_NVDEC_0_UTIL + 8) {
    return engine(NVML_GPM_METRIC_NVDEC_0_UTIL, a.decoders, (a.dec_util + b.dec_util) / 2);
  }
  if (id >= NVML_GPM_METRIC_NVJPG_0_UTIL && id < NVML_GPM_METRIC_NVJPG_0_UTIL + 8) {
    return engine(NVML_GPM_METRIC_NVJPG_0_UTIL, a.jpegs, 0);
  }
  if (id >= NVML_GPM_METRIC_NVOFA_0_UTIL && id < NVML_GPM_METRIC_NVOFA_0_UTIL + 2) {
    return engine(NVML_GPM_METRIC_NVOFA_0_UTIL, a.ofas, 0);
  }
  return std::nullopt;
}

}  // namespace

// Support is per architecture: Hopper and newer have GPM; older GPUs answer "not supported" in
// the struct, as the real call does.
NVML_EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t* support) {
  if (support == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (support->version != NVML_GPM_SUPPORT_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  return OnGpu(device, [&](const Dev& d) {
    support->isSupportedDevice = HasGpm(d.model()) ? 1 : 0;
    return NVML_SUCCESS;
  });
}

NVML_EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t* sample) {
  if (sample == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (Current() == nullptr) return NVML_ERROR_UNINITIALIZED;
  auto* data = new GpmSampleData;
  GpmSamples& s = Samples();
  std::lock_guard<std::mutex> lock(s.mu);
  s.live.insert(data);
  *sample = reinterpret_cast<nvmlGpmSample_t>(data);
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
  GpmSamples& s = Samples();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* data = reinterpret_cast<GpmSampleData*>(sample);
  if (s.live.erase(data) == 0) return NVML_ERROR_INVALID_ARGUMENT;
  delete data;
  return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
  GpmSampleData* data = SampleOf(sample);
  if (data == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) -> nvmlReturn_t {
    if (!HasGpm(d.model())) return NVML_ERROR_NOT_SUPPORTED;
    GpmSampleData s;
    s.filled = true;
    s.gpu = d.gpu;
    s.ts_ns = MonotonicNs();
    s.util = DeviceUtilisation(d);
    s.mem_util = d.g.util_mem;
    s.dec_util = d.g.util_dec;
    s.pcie_tx_mibps = static_cast<double>(d.g.pcie_tx_kbs) / 1024;
    s.pcie_rx_mibps = static_cast<double>(d.g.pcie_rx_kbs) / 1024;
    s.nvlink = HasNvLink(d);
    s.nvlink_tx_kib = d.g.nvlink_tx_kib;
    s.nvlink_rx_kib = d.g.nvlink_rx_kib;
    if (const MigProfile* full = FullProfile(d.model())) {
      s.decoders = full->decoders;
      s.jpegs = full->jpegs;
      s.ofas = full->ofas;
    }
    *data = s;
    return NVML_SUCCESS;
  });
}

// A GPU instance's sample (the parent GPU's handle and the instance's id): the SM activity of its
// processes, their memory activity, and its own media engines; no PCIe or NVLink figures.
NVML_EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpu_instance_id,
                                             nvmlGpmSample_t sample) {
  GpmSampleData* data = SampleOf(sample);
  if (data == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  return OnGpu(device, [&](const Dev& d) -> nvmlReturn_t {
    if (!HasGpm(d.model())) return NVML_ERROR_NOT_SUPPORTED;
    if (d.g.mig_current == 0) return NVML_ERROR_INVALID_ARGUMENT;  // no GPU instances to sample
    const SimGi* gi = nullptr;
    for (const auto& x : d.g.gis) {
      if (x.used != 0 && x.id == gpu_instance_id) gi = &x;
    }
    if (gi == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    GpmSampleData s;
    s.filled = true;
    s.gpu = d.gpu;
    s.gi = gpu_instance_id;
    s.ts_ns = MonotonicNs();
    uint64_t sm = 0, mem = 0;
    for (unsigned i = 0; i < d.g.nproc && i < kMaxProcs; ++i) {
      if (d.g.procs[i].gi != gpu_instance_id) continue;
      sm += d.g.procs[i].sm_util;
      mem += d.g.procs[i].mem_util;
    }
    s.util = static_cast<double>(std::min<uint64_t>(sm, 100));
    s.mem_util = static_cast<double>(std::min<uint64_t>(mem, 100));
    if (const MigProfile* p = FindMigProfileByIndex(d.model(), gi->profile_index)) {
      s.decoders = p->decoders;
      s.jpegs = p->jpegs;
      s.ofas = p->ofas;
    }
    *data = s;
    return NVML_SUCCESS;
  });
}

// The metrics between two samples of one device, the older first. Real NVML wants the samples at
// least 100 ms apart for meaningful figures; the simulated node computes them for any interval,
// and refuses only samples that are empty, of different devices, or not in time order.
NVML_EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t* get) {
  if (get == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (get->version != NVML_GPM_METRICS_GET_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  if (get->numMetrics > NVML_GPM_METRIC_MAX) return NVML_ERROR_INVALID_ARGUMENT;
  if (Current() == nullptr) return NVML_ERROR_UNINITIALIZED;
  const GpmSampleData* a = SampleOf(get->sample1);
  const GpmSampleData* b = SampleOf(get->sample2);
  if (a == nullptr || b == nullptr || !a->filled || !b->filled) return NVML_ERROR_INVALID_ARGUMENT;
  if (a->gpu != b->gpu || a->gi != b->gi || b->ts_ns <= a->ts_ns) return NVML_ERROR_INVALID_ARGUMENT;
  static char kPercent[] = "%", kMibps[] = "MiB/sec", kName[] = "";
  for (unsigned i = 0; i < get->numMetrics; ++i) {
    nvmlGpmMetric_t& m = get->metrics[i];
    const std::optional<double> v = GpmValue(m.metricId, *a, *b);
    m.nvmlReturn = v ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    m.value = v.value_or(0);
    const bool rate = m.metricId == NVML_GPM_METRIC_PCIE_TX_PER_SEC || m.metricId == NVML_GPM_METRIC_PCIE_RX_PER_SEC ||
                      m.metricId == NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC ||
                      m.metricId == NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC;
    m.metricInfo.shortName = kName;
    m.metricInfo.longName = kName;
    m.metricInfo.unit = rate ? kMibps : kPercent;
  }
  return NVML_SUCCESS;
}
