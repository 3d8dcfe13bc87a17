// The simulated CUDA driver (libcuda.so.1): the device, context and memory entry points that
// kgpu's memory interposer (isolation/) hooks, backed by the simulated node's shared state
// (simnvml/node.h, selected by KGPU_SIM_NODE / KGPU_SIM_STATE / KGPU_SIM_NODE_NAME exactly as for
// the simulated NVML). What it models:
//  - Devices: the node's GPUs that are not in MIG mode, filtered and ordered by
//    CUDA_VISIBLE_DEVICES (indices or unique GPU-UUID prefixes; enumeration stops at the first
//    entry that is invalid, names no GPU or repeats one, as the real driver does).
//  - Memory: every allocation is rounded up to 2 MiB (the driver's large-page granularity) and
//    raised on this pid's SimProcess entry of that GPU, so NVML's running-process list and memory
//    figures show it. An allocation beyond what the GPU has free (total less its reservation,
//    less every process's memory and the memory of no listed process) fails with
//    CUDA_ERROR_OUT_OF_MEMORY. No memory is allocated on the host: device pointers are addresses
//    of a private range and must not be dereferenced.
//  - Contexts: the process appears in the GPU's process list while it holds a context on it;
//    destroying a context, releasing the primary context to zero or resetting it frees its
//    allocations, as the real driver does. A context's own memory (the real driver's takes a few
//    hundred MiB: its local memory, printf buffer, loaded modules) is KGPU_SIM_CUDA_CONTEXT_MIB
//    (a knob of the simulator, default 0), charged to the process like an allocation while the
//    context lives; a context that does not fit fails with CUDA_ERROR_OUT_OF_MEMORY.
//  - Process exit: at a normal exit the library's destructor removes the process's entries; a
//    process killed with SIGKILL is reaped by the next process that initialises the driver or
//    runs out of memory (the pids the simulated driver registered are kept in a side file,
//    <state>.cuda-pids, so entries that kgpu-simctl added by hand are never reaped).
//
// Thread-safety: every entry point may be called from any thread; the node state is changed
// under the node's process-shared mutex, this process's tables under a local mutex. The current
// context is per thread, as in CUDA.

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "node.h"

#define CU_EXPORT extern "C" __attribute__((visibility("default")))

namespace kgpu::simcuda {
namespace {

using sim::kMaxGpus;
using sim::kMaxProcs;
using sim::kNoId;
using sim::Node;
using sim::SimGpu;
using sim::SimProcess;

constexpr uint64_t kGranule = 2ULL << 20;   // 2 MiB
constexpr uint32_t kCtxMagic = 0x4b435458;  // KCTX
constexpr uint32_t kArrMagic = 0x4b415252;  // KARR
constexpr uint64_t kPidsMagic = 0x4b47505543504944ULL;
constexpr unsigned kPidSlots = 1024;

struct Ctx {
  uint32_t magic = kCtxMagic;
  int dev = 0;  // visible ordinal
  bool primary = false;
};

struct Arr {
  uint32_t magic = kArrMagic;
};

enum class Kind { kPtr, kArray, kVmm, kMipmap };

struct Alloc {
  unsigned gpu;  // physical index on the node
  uint64_t bytes;
  const Ctx* ctx;  // nullptr: not tied to a context (VMM)
  Kind kind;
};

// Pids of the processes the simulated driver put into the node's process lists.
struct PidTable {
  uint64_t magic;
  struct {
    int32_t pid;
    uint32_t pad;
  } slots[kPidSlots];
};

struct Driver {
  Node* node = nullptr;
  PidTable* pids = nullptr;
  std::vector<unsigned> visible;  // ordinal -> physical GPU index
  std::mutex mu;                  // guards everything below
  Ctx primary[kMaxGpus];
  int primary_refs[kMaxGpus] = {};
  int ctx_count[kMaxGpus] = {};                // live contexts (primary counts once) per ordinal
  std::unordered_map<uint64_t, Alloc> allocs;  // device pointer or array handle -> allocation
  uint64_t next_va = 0x200000000000ULL;
  uint64_t next_va32 = 0x10000000ULL;
  uint64_t next_vmm = 0x1000ULL;  // VMM handles
  uint64_t ctx_bytes = 0;         // each context's own memory (KGPU_SIM_CUDA_CONTEXT_MIB)
};

std::once_flag g_once;
CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
Driver* g_drv = nullptr;  // never freed: entry points may run during exit
thread_local Ctx* t_current = nullptr;

uint64_t RoundUp(uint64_t v, uint64_t g) {
  return (v + g - 1) / g * g;
}

// Whether `pid` still runs: a zombie (state Z or X in /proc/<pid>/stat) has exited, and the
// driver frees a process's memory at exit, not when its parent reaps it.
bool PidAlive(int32_t pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) return false;
  char path[64], buf[512];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  return p == nullptr || p[1] == '\0' || (p[2] != 'Z' && p[2] != 'X');
}

// ---- the node state (caller holds Node::Locked) ----

uint64_t UsedBytes(const SimGpu& g) {
  uint64_t sum = g.mem_used_base;
  for (unsigned i = 0; i < g.nproc && i < kMaxProcs; ++i) sum += g.procs[i].mem_bytes;
  return sum;
}

uint64_t UsableBytes(const Node& node, unsigned gpu) {
  const sim::GpuModel& m = *node.profile().gpus[gpu].model;
  return (m.memory_mib > m.reserved_mib ? m.memory_mib - m.reserved_mib : 0) << 20;
}

SimProcess* FindProc(SimGpu& g, int32_t pid) {
  for (unsigned i = 0; i < g.nproc && i < kMaxProcs; ++i) {
    if (static_cast<int32_t>(g.procs[i].pid) == pid && g.procs[i].gi == kNoId) return &g.procs[i];
  }
  return nullptr;
}

void RemoveProc(SimGpu& g, int32_t pid) {
  for (unsigned i = 0; i < g.nproc && i < kMaxProcs;) {
    if (static_cast<int32_t>(g.procs[i].pid) == pid && g.procs[i].gi == kNoId) {
      g.procs[i] = g.procs[g.nproc - 1];
      g.procs[g.nproc - 1] = SimProcess{};
      --g.nproc;
    } else {
      ++i;
    }
  }
}

void RegisterPid(PidTable& t, int32_t pid) {
  unsigned free_slot = kPidSlots;
  for (unsigned i = 0; i < kPidSlots; ++i) {
    if (t.slots[i].pid == pid) return;
    if (t.slots[i].pid == 0 && free_slot == kPidSlots) free_slot = i;
  }
  if (free_slot < kPidSlots) t.slots[free_slot].pid = pid;
}

// Removes the entries of registered processes that no longer exist (the real driver frees a
// dead process's memory when the kernel tears its file descriptors down).
void Reap(const Driver& d, const Node::Locked& lock) {
  for (auto& s : d.pids->slots) {
    if (s.pid == 0 || PidAlive(s.pid)) continue;
    for (unsigned gpu = 0; gpu < d.node->gpu_count(); ++gpu) RemoveProc(lock.gpu(gpu), s.pid);
    s.pid = 0;
  }
}

// Puts this process into GPU `gpu`'s process list (no memory). False when the list is full.
bool EnsureProc(const Driver& d, const Node::Locked& lock, unsigned gpu) {
  SimGpu& g = lock.gpu(gpu);
  const auto pid = static_cast<int32_t>(getpid());
  if (FindProc(g, pid) != nullptr) return true;
  if (g.nproc >= kMaxProcs) return false;
  SimProcess p{};
  p.pid = static_cast<uint32_t>(pid);
  p.gi = p.ci = kNoId;
  g.procs[g.nproc++] = p;
  RegisterPid(*d.pids, pid);
  return true;
}

CUresult Charge(Driver& d, unsigned gpu, uint64_t bytes) {
  Node::Locked lock(*d.node);
  for (int attempt = 0; attempt < 2; ++attempt) {
    SimGpu& g = lock.gpu(gpu);
    const uint64_t used = UsedBytes(g);
    const uint64_t usable = UsableBytes(*d.node, gpu);
    if (used <= usable && bytes <= usable - used && EnsureProc(d, lock, gpu)) {
      FindProc(g, static_cast<int32_t>(getpid()))->mem_bytes += bytes;
      return CUDA_SUCCESS;
    }
    Reap(d, lock);
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}

void Uncharge(Driver& d, unsigned gpu, uint64_t bytes) {
  Node::Locked lock(*d.node);
  SimProcess* p = FindProc(lock.gpu(gpu), static_cast<int32_t>(getpid()));
  if (p != nullptr) p->mem_bytes -= std::min(p->mem_bytes, bytes);
}

// ---- set-up ----

PidTable* OpenPidTable(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return nullptr;
  fchmod(fd, 0666);
  flock(fd, LOCK_EX);
  struct stat st {};
  fstat(fd, &st);
  if (static_cast<size_t>(st.st_size) != sizeof(PidTable) && ftruncate(fd, sizeof(PidTable)) != 0) {
    close(fd);
    return nullptr;
  }
  void* mem = mmap(nullptr, sizeof(PidTable), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  auto* t = mem == MAP_FAILED ? nullptr : static_cast<PidTable*>(mem);
  if (t != nullptr && t->magic != kPidsMagic) {
    std::memset(t, 0, sizeof *t);
    t->magic = kPidsMagic;
  }
  flock(fd, LOCK_UN);
  close(fd);
  return t;
}

bool StartsWithNoCase(const std::string& s, const std::string& prefix) {
  if (prefix.size() > s.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != std::tolower(static_cast<unsigned char>(prefix[i]))) {
      return false;
    }
  }
  return true;
}

std::vector<unsigned> VisibleGpus(const Node& node) {
  std::vector<unsigned> all;
  {
    Node::Locked lock(node);
    for (unsigned i = 0; i < node.gpu_count(); ++i) {
      if (lock.gpu(i).mig_current == 0) all.push_back(i);
    }
  }
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");  // NOLINT(concurrency-mt-unsafe)
  if (env == nullptr) return all;
  std::vector<unsigned> out;
  std::string list(env);
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string tok = list.substr(pos, end - pos);
    pos = end + 1;
    while (!tok.empty() && std::isspace(static_cast<unsigned char>(tok.front()))) tok.erase(0, 1);
    while (!tok.empty() && std::isspace(static_cast<unsigned char>(tok.back()))) tok.pop_back();
    int found = -1;
    if (!tok.empty() &&
        std::all_of(tok.begin(), tok.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      const unsigned long idx = std::strtoul(tok.c_str(), nullptr, 10);
      for (unsigned i : all) {
        if (i == idx) found = static_cast<int>(i);
      }
    } else if (StartsWithNoCase(tok, "GPU-") && tok.size() > 4) {
      for (unsigned i : all) {
        if (StartsWithNoCase(node.uuid(i), tok)) {
          if (found >= 0) {  // ambiguous prefix
            found = -1;
            break;
          }
          found = static_cast<int>(i);
        }
      }
    }
    if (found < 0 || std::find(out.begin(), out.end(), static_cast<unsigned>(found)) != out.end()) break;
    out.push_back(static_cast<unsigned>(found));
  }
  return out;
}

void InitOnce() {
  auto opened = Node::Open(sim::ReadEnvironment());
  if (!opened.ok()) {
    std::fprintf(stderr, "simulated libcuda: %s\n", std::string(opened.status().message()).c_str());
    g_init_result = CUDA_ERROR_NO_DEVICE;
    return;
  }
  auto* d = new Driver;
  d->node = opened->release();
  d->pids = OpenPidTable(d->node->environment().state_path + ".cuda-pids");
  if (d->pids == nullptr) {
    std::fprintf(stderr, "simulated libcuda: cannot open %s.cuda-pids\n", d->node->environment().state_path.c_str());
    g_init_result = CUDA_ERROR_NO_DEVICE;
    return;
  }
  {
    Node::Locked lock(*d->node);
    Reap(*d, lock);
  }
  d->visible = VisibleGpus(*d->node);
  if (const char* v = std::getenv("KGPU_SIM_CUDA_CONTEXT_MIB");
      v != nullptr && *v != '\0') {  // NOLINT(concurrency-mt-unsafe)
    char* end = nullptr;
    const unsigned long long mib = std::strtoull(v, &end, 10);
    if (*end != '\0' || mib > (1ULL << 24)) {
      std::fprintf(stderr, "simulated libcuda: KGPU_SIM_CUDA_CONTEXT_MIB=%s is not a number of MiB (0-16777216)\n", v);
      g_init_result = CUDA_ERROR_INVALID_VALUE;
      return;
    }
    d->ctx_bytes = mib << 20;
  }
  for (unsigned i = 0; i < kMaxGpus; ++i) {
    d->primary[i].dev = static_cast<int>(i);
    d->primary[i].primary = true;
  }
  g_drv = d;
  g_init_result = CUDA_SUCCESS;
}

// At a normal exit the process's memory goes back, as with the real driver.
struct ExitCleanup {
  ~ExitCleanup() {
    if (g_drv == nullptr) return;
    Node::Locked lock(*g_drv->node);
    const auto pid = static_cast<int32_t>(getpid());
    for (unsigned gpu = 0; gpu < g_drv->node->gpu_count(); ++gpu) RemoveProc(lock.gpu(gpu), pid);
    for (auto& s : g_drv->pids->slots) {
      if (s.pid == pid) s.pid = 0;
    }
  }
} g_exit_cleanup;

Driver* Drv() {
  return g_init_result == CUDA_SUCCESS ? g_drv : nullptr;
}

bool ValidDev(const Driver& d, CUdevice dev) {
  return dev >= 0 && static_cast<size_t>(dev) < d.visible.size();
}

// The current context's device, or an error.
CUresult CurrentGpu(const Driver& d, unsigned* gpu, const Ctx** ctx) {
  const Ctx* c = t_current;
  if (c == nullptr || c->magic != kCtxMagic || !ValidDev(d, c->dev)) return CUDA_ERROR_INVALID_CONTEXT;
  *gpu = d.visible[static_cast<size_t>(c->dev)];
  if (ctx != nullptr) *ctx = c;
  return CUDA_SUCCESS;
}

// Charges `bytes` (already rounded) on ordinal `dev`'s GPU (-1: the current context's) and
// records the allocation under a new device address (kPtr), a new handle (kVmm) or `given_key`
// (kArray).
CUresult Allocate(uint64_t bytes, bool low32, Kind kind, uint64_t* key_out, uint64_t given_key, int dev = -1) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  unsigned gpu = 0;
  const Ctx* ctx = nullptr;
  if (dev >= 0) {
    if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
    gpu = d->visible[static_cast<size_t>(dev)];
  } else if (CUresult r = CurrentGpu(*d, &gpu, &ctx); r != CUDA_SUCCESS) {
    return r;
  }
  std::lock_guard<std::mutex> lock(d->mu);
  uint64_t key = given_key;
  if (kind == Kind::kPtr) {
    uint64_t& next = low32 ? d->next_va32 : d->next_va;
    if (low32 && next + bytes > 0xF0000000ULL) return CUDA_ERROR_OUT_OF_MEMORY;
    key = next;
  } else if (kind == Kind::kVmm) {
    key = d->next_vmm;
  }
  if (CUresult r = Charge(*d, gpu, bytes); r != CUDA_SUCCESS) return r;
  if (kind == Kind::kPtr) (low32 ? d->next_va32 : d->next_va) += bytes;
  if (kind == Kind::kVmm) ++d->next_vmm;
  d->allocs[key] = Alloc{gpu, bytes, ctx, kind};
  *key_out = key;
  return CUDA_SUCCESS;
}

CUresult Free(uint64_t key, Kind kind) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> lock(d->mu);
  auto it = d->allocs.find(key);
  if (it == d->allocs.end() || it->second.kind != kind) {
    return kind == Kind::kPtr ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
  }
  Uncharge(*d, it->second.gpu, it->second.bytes);
  d->allocs.erase(it);
  return CUDA_SUCCESS;
}

// Frees the allocations made in context `ctx` (caller holds d.mu).
void FreeAllocsOf(Driver& d, const Ctx* ctx) {
  for (auto it = d.allocs.begin(); it != d.allocs.end();) {
    if (it->second.ctx == ctx) {
      Uncharge(d, it->second.gpu, it->second.bytes);
      if (it->second.kind == Kind::kArray || it->second.kind == Kind::kMipmap)
        delete reinterpret_cast<Arr*>(it->first);  // NOLINT(performance-no-int-to-ptr)
      it = d.allocs.erase(it);
    } else {
      ++it;
    }
  }
}

// A context on ordinal `dev` goes away: its allocations are freed, and the process leaves the
// GPU's list when it was its last context there (caller holds d.mu).
void DropContext(Driver& d, const Ctx* ctx, int dev) {
  const unsigned gpu = d.visible[static_cast<size_t>(dev)];
  FreeAllocsOf(d, ctx);
  if (d.ctx_bytes > 0) Uncharge(d, gpu, d.ctx_bytes);
  if (--d.ctx_count[dev] == 0) {
    Node::Locked lock(*d.node);
    SimProcess* p = FindProc(lock.gpu(gpu), static_cast<int32_t>(getpid()));
    if (p != nullptr && p->mem_bytes == 0) RemoveProc(lock.gpu(gpu), static_cast<int32_t>(getpid()));
  }
}

CUresult AddContext(Driver& d, int dev) {
  const unsigned gpu = d.visible[static_cast<size_t>(dev)];
  if (d.ctx_bytes > 0) {
    if (CUresult r = Charge(d, gpu, d.ctx_bytes); r != CUDA_SUCCESS) return r;
  } else {
    Node::Locked lock(*d.node);
    if (!EnsureProc(d, lock, gpu)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ++d.ctx_count[dev];
  return CUDA_SUCCESS;
}

CUresult MemInfo(uint64_t* free_bytes, uint64_t* total_bytes) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  unsigned gpu = 0;
  if (CUresult r = CurrentGpu(*d, &gpu, nullptr); r != CUDA_SUCCESS) return r;
  Node::Locked lock(*d->node);
  const uint64_t used = UsedBytes(lock.gpu(gpu));
  const uint64_t usable = UsableBytes(*d->node, gpu);
  *free_bytes = usable > used ? usable - used : 0;
  *total_bytes = d->node->profile().gpus[gpu].model->memory_mib << 20;
  return CUDA_SUCCESS;
}

CUresult ProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags,
                     CUdriverProcAddressQueryResult* status);

}  // namespace
}  // namespace kgpu::simcuda

using namespace kgpu::simcuda;  // NOLINT(google-build-using-namespace): entry points below

// ---------------------------------------------------------------- initialisation and devices
CU_EXPORT CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::call_once(g_once, InitOnce);
  return g_init_result;
}

CU_EXPORT CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Callable before cuInit, as with the real driver: the version comes from the node's profile.
  auto profile = kgpu::sim::LoadProfile(kgpu::sim::ReadEnvironment().profile_spec);
  if (!profile.ok()) return CUDA_ERROR_NO_DEVICE;
  *version = profile->cuda_version;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDeviceGetCount(int* count) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = static_cast<int>(d->visible.size());
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "%s",
                d->node->profile().gpus[d->visible[static_cast<size_t>(dev)]].model->name.c_str());
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = d->node->profile().gpus[d->visible[static_cast<size_t>(dev)]].model->memory_mib << 20;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  size_t b = 0;
  const CUresult r = cuDeviceTotalMem_v2(&b, dev);
  if (r == CUDA_SUCCESS) *bytes = static_cast<unsigned int>(std::min<size_t>(b, 0xFFFFFFFFU));
  return r;
}

CU_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  const std::string& s = d->node->uuid(d->visible[static_cast<size_t>(dev)]);  // GPU-8-4-4-4-12
  unsigned n = 0;
  for (size_t i = 4; i + 1 < s.size() && n < 16;) {
    if (s[i] == '-') {
      ++i;
      continue;
    }
    uuid->bytes[n++] = static_cast<char>(std::stoul(s.substr(i, 2), nullptr, 16));
    i += 2;
  }
  return n == 16 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

// On a whole GPU _v2 returns the GPU's UUID too (it differs only on MIG devices, not simulated).
CU_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  return cuDeviceGetUuid(uuid, dev);
}

// ---------------------------------------------------------------- contexts
CU_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (pctx == nullptr || flags > 0x1F) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(d->mu);
  if (CUresult r = AddContext(*d, dev); r != CUDA_SUCCESS) return r;
  auto* c = new Ctx;
  c->dev = dev;
  t_current = c;
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  auto* c = reinterpret_cast<Ctx*>(ctx);
  if (c == nullptr || c->magic != kCtxMagic || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> lock(d->mu);
  DropContext(*d, c, c->dev);
  if (t_current == c) t_current = nullptr;
  c->magic = 0;
  delete c;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  auto* c = reinterpret_cast<Ctx*>(ctx);
  if (c != nullptr && c->magic != kCtxMagic) return CUDA_ERROR_INVALID_CONTEXT;
  t_current = c;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (Drv() == nullptr) return g_init_result;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(t_current);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Ctx* c = t_current;
  if (c == nullptr || c->magic != kCtxMagic) return CUDA_ERROR_INVALID_CONTEXT;
  *device = c->dev;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(d->mu);
  if (d->primary_refs[dev] == 0) {
    if (CUresult r = AddContext(*d, dev); r != CUDA_SUCCESS) return r;
  }
  ++d->primary_refs[dev];
  d->primary[dev].magic = kCtxMagic;
  *pctx = reinterpret_cast<CUcontext>(&d->primary[dev]);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(d->mu);
  if (d->primary_refs[dev] == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--d->primary_refs[dev] == 0) DropContext(*d, &d->primary[dev], dev);  // destroyed at zero
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return cuDevicePrimaryCtxRelease_v2(dev);
}

CU_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(d->mu);
  *flags = 0;
  *active = d->primary_refs[dev] > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

// Frees every allocation of the primary context; the context stays retained (its references are
// kept) and starts afresh.
CU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(d->mu);
  FreeAllocsOf(*d, &d->primary[dev]);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return cuDevicePrimaryCtxReset_v2(dev);
}

CU_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  return cuCtxDestroy_v2(ctx);
}

// ---------------------------------------------------------------- memory
CU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t p = 0;
  const CUresult r = Allocate(RoundUp(bytesize, kGranule), false, Kind::kPtr, &p, 0);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

CU_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t p = 0;
  const CUresult r = Allocate(RoundUp(bytesize, kGranule), true, Kind::kPtr, &p, 0);
  if (r == CUDA_SUCCESS) *dptr = static_cast<CUdeviceptr_v1>(p);
  return r;
}

// Rows are padded to 512 bytes (the simulated device's pitch alignment).
CU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes) {
  if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
      (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t pitch = RoundUp(WidthInBytes, 512);
  uint64_t p = 0;
  const CUresult r = Allocate(RoundUp(pitch * Height, kGranule), false, Kind::kPtr, &p, 0);
  if (r == CUDA_SUCCESS) {
    *dptr = p;
    *pPitch = pitch;
  }
  return r;
}

CU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return Free(dptr, Kind::kPtr);
}
CU_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
  return Free(dptr, Kind::kPtr);
}

CU_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t f = 0, t = 0;
  const CUresult r = MemInfo(&f, &t);
  if (r == CUDA_SUCCESS) {
    *free_bytes = f;
    *total_bytes = t;
  }
  return r;
}

CU_EXPORT CUresult cuMemGetInfo(unsigned int* free_bytes, unsigned int* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t f = 0, t = 0;
  const CUresult r = MemInfo(&f, &t);
  if (r == CUDA_SUCCESS) {
    *free_bytes = static_cast<unsigned int>(std::min<uint64_t>(f, 0xFFFFFFFFU));
    *total_bytes = static_cast<unsigned int>(std::min<uint64_t>(t, 0xFFFFFFFFU));
  }
  return r;
}

// Managed memory is charged to the current context's GPU at its full size.
CU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  if (dptr == nullptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  uint64_t p = 0;
  const CUresult r = Allocate(RoundUp(bytesize, kGranule), false, Kind::kPtr, &p, 0);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

// Stream-ordered allocation from the device's default pool; the simulation completes it at once
// and keeps nothing in the pool after a free (a release threshold of 0, the default).
CU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream) {
  return cuMemAlloc_v2(dptr, bytesize);
}
CU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream) {
  return cuMemAlloc_v2(dptr, bytesize);
}
// Pools: one default pool per device (a handle only); allocations from any pool are device
// memory like cuMemAllocAsync's.
CU_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  static int default_pool;
  *pool = reinterpret_cast<CUmemoryPool>(&default_pool);
  return CUDA_SUCCESS;
}
CU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuMemAlloc_v2(dptr, bytesize);
}
CU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuMemAlloc_v2(dptr, bytesize);
}
CU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream) {
  return Free(dptr, Kind::kPtr);
}
CU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream) {
  return Free(dptr, Kind::kPtr);
}

namespace {
// An array object (plain or mipmapped: `kind`) of `bytes`, rounded and charged; its handle in
// *handle.
CUresult NewArr(uint64_t bytes, Kind kind, void** handle) {
  auto* a = new Arr;
  uint64_t key = 0;
  const CUresult r = Allocate(RoundUp(bytes, kGranule), false, kind, &key, reinterpret_cast<uint64_t>(a));
  if (r != CUDA_SUCCESS) {
    delete a;
    return r;
  }
  *handle = a;
  return CUDA_SUCCESS;
}

// Frees an array object made by NewArr with the same `kind`.
CUresult DeleteArr(void* handle, Kind kind) {
  auto* a = static_cast<Arr*>(handle);
  if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const CUresult r = Free(reinterpret_cast<uint64_t>(a), kind);
  if (r == CUDA_SUCCESS) delete a;
  return r;
}
}  // namespace

// A 1D or 2D array of Width x max(Height, 1) elements of NumChannels (1, 2 or 4) x the format's
// size.
CU_EXPORT CUresult cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  if (pHandle == nullptr || desc == nullptr || desc->Width == 0 || kgpu_cu_format_bytes(desc->Format) == 0 ||
      (desc->NumChannels != 1 && desc->NumChannels != 2 && desc->NumChannels != 4)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t bytes = static_cast<uint64_t>(desc->Width) * std::max<size_t>(desc->Height, 1) * desc->NumChannels *
                         kgpu_cu_format_bytes(desc->Format);
  return NewArr(bytes, Kind::kArray, reinterpret_cast<void**>(pHandle));
}

// A 1D, 2D or 3D array: Width x max(Height, 1) x max(Depth, 1) elements.
CU_EXPORT CUresult cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  if (pHandle == nullptr || desc == nullptr || desc->Width == 0 || kgpu_cu_format_bytes(desc->Format) == 0 ||
      (desc->NumChannels != 1 && desc->NumChannels != 2 && desc->NumChannels != 4) ||
      (desc->Depth != 0 && desc->Height == 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t bytes = static_cast<uint64_t>(desc->Width) * std::max<size_t>(desc->Height, 1) *
                         std::max<size_t>(desc->Depth, 1) * desc->NumChannels * kgpu_cu_format_bytes(desc->Format);
  return NewArr(bytes, Kind::kArray, reinterpret_cast<void**>(pHandle));
}

CU_EXPORT CUresult cuArrayDestroy(CUarray handle) {
  return DeleteArr(handle, Kind::kArray);
}

// The legacy 32-bit forms: the same arrays, and pitched memory below 4 GiB.
CU_EXPORT CUresult cuArrayCreate(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR_v1* desc) {
  if (desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_ARRAY_DESCRIPTOR d{desc->Width, desc->Height, desc->Format, desc->NumChannels};
  return cuArrayCreate_v2(pHandle, &d);
}
CU_EXPORT CUresult cuArray3DCreate(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1* desc) {
  if (desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUDA_ARRAY3D_DESCRIPTOR d{desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, desc->Flags};
  return cuArray3DCreate_v2(pHandle, &d);
}
CU_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pPitch, unsigned int WidthInBytes,
                                   unsigned int Height, unsigned int ElementSizeBytes) {
  if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
      (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t pitch = RoundUp(WidthInBytes, 512);
  if (pitch > UINT32_MAX || pitch * Height > UINT32_MAX)
    return CUDA_ERROR_OUT_OF_MEMORY;  // beyond what a 32-bit pointer can address
  uint64_t p = 0;
  const CUresult r = Allocate(RoundUp(pitch * Height, kGranule), true, Kind::kPtr, &p, 0);
  if (r == CUDA_SUCCESS) {
    *dptr = static_cast<CUdeviceptr_v1>(p);
    *pPitch = static_cast<unsigned int>(pitch);
  }
  return r;
}

// A mipmapped array: every level allocated at once (kgpu_cu_mipmap_bytes); at most
// 1 + floor(log2(the largest extent)) levels, the depth of a layered or cubemap array not counted.
CU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                          unsigned int numMipmapLevels) {
  if (pHandle == nullptr || desc == nullptr || desc->Width == 0 || kgpu_cu_format_bytes(desc->Format) == 0 ||
      (desc->NumChannels != 1 && desc->NumChannels != 2 && desc->NumChannels != 4) ||
      (desc->Depth != 0 && desc->Height == 0) || numMipmapLevels == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const bool keep_depth = (desc->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  uint64_t extent = std::max<uint64_t>(desc->Width, desc->Height);
  if (!keep_depth) extent = std::max<uint64_t>(extent, desc->Depth);
  unsigned max_levels = 0;
  for (; extent > 0; extent >>= 1) ++max_levels;
  if (numMipmapLevels > max_levels) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t bytes =
      kgpu_cu_mipmap_bytes(desc, numMipmapLevels, uint64_t{desc->NumChannels} * kgpu_cu_format_bytes(desc->Format));
  if (bytes > (uint64_t{1} << 50)) return CUDA_ERROR_OUT_OF_MEMORY;
  return NewArr(bytes, Kind::kMipmap, reinterpret_cast<void**>(pHandle));
}

CU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  return DeleteArr(handle, Kind::kMipmap);
}

// Physical memory of the virtual memory management API: pinned device memory on the device of
// prop->location, `size` a multiple of the 2 MiB granularity; not tied to a context.
CU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                               unsigned long long flags) {
  if (handle == nullptr || prop == nullptr || size == 0 || size % kGranule != 0 || flags != 0 ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  uint64_t key = 0;
  const CUresult r = Allocate(size, false, Kind::kVmm, &key, 0, prop->location.id);
  if (r == CUDA_SUCCESS) *handle = key;
  return r;
}

CU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return Free(handle, Kind::kVmm);
}

// ---------------------------------------------------------------- cuGetProcAddress
namespace kgpu::simcuda {
namespace {

struct ProcEntry {
  const char* name;  // the name callers ask for (no version suffix)
  int since;         // first CUDA version (1000 * major + 10 * minor) this entry point serves
  bool ptsz;         // the per-thread-default-stream variant
  void* fn;
  void* internal = nullptr;  // a non-exported entry point of the same call (see ProcAddress)
};

template <typename F>
void* Fn(F* f) {
  return reinterpret_cast<void*>(f);
}

// A function of its own address that makes the same call: what a driver whose cuGetProcAddress
// hands out internal entry points instead of its exported symbols returns.
template <auto F>
struct Thunk;
template <typename R, typename... A, R (*F)(A...)>
struct Thunk<F> {
  static R Call(A... a) { return F(a...); }
};
#define KGPU_PROC(name, since, ptsz, fn) \
  { name, since, ptsz, Fn(fn), Fn(Thunk<fn>::Call) }

const ProcEntry kProcs[] = {
    {"cuInit", 2000, false, Fn(cuInit)},
    {"cuDriverGetVersion", 2020, false, Fn(cuDriverGetVersion)},
    {"cuDeviceGetCount", 2000, false, Fn(cuDeviceGetCount)},
    {"cuDeviceGet", 2000, false, Fn(cuDeviceGet)},
    {"cuDeviceGetName", 2000, false, Fn(cuDeviceGetName)},
    KGPU_PROC("cuDeviceTotalMem", 2000, false, cuDeviceTotalMem),
    KGPU_PROC("cuDeviceTotalMem", 3020, false, cuDeviceTotalMem_v2),
    {"cuDeviceGetUuid", 9020, false, Fn(cuDeviceGetUuid)},
    {"cuDeviceGetUuid", 11040, false, Fn(cuDeviceGetUuid_v2)},
    {"cuCtxCreate", 3020, false, Fn(cuCtxCreate_v2)},
    KGPU_PROC("cuCtxDestroy", 2000, false, cuCtxDestroy),
    KGPU_PROC("cuCtxDestroy", 4000, false, cuCtxDestroy_v2),
    {"cuCtxSetCurrent", 4000, false, Fn(cuCtxSetCurrent)},
    {"cuCtxGetCurrent", 4000, false, Fn(cuCtxGetCurrent)},
    {"cuCtxGetDevice", 2000, false, Fn(cuCtxGetDevice)},
    {"cuDevicePrimaryCtxRetain", 7000, false, Fn(cuDevicePrimaryCtxRetain)},
    KGPU_PROC("cuDevicePrimaryCtxRelease", 7000, false, cuDevicePrimaryCtxRelease),
    KGPU_PROC("cuDevicePrimaryCtxRelease", 11000, false, cuDevicePrimaryCtxRelease_v2),
    KGPU_PROC("cuDevicePrimaryCtxReset", 7000, false, cuDevicePrimaryCtxReset),
    KGPU_PROC("cuDevicePrimaryCtxReset", 11000, false, cuDevicePrimaryCtxReset_v2),
    {"cuDevicePrimaryCtxGetState", 7000, false, Fn(cuDevicePrimaryCtxGetState)},
    KGPU_PROC("cuMemAlloc", 2000, false, cuMemAlloc),
    KGPU_PROC("cuMemAlloc", 3020, false, cuMemAlloc_v2),
    KGPU_PROC("cuMemAllocPitch", 3020, false, cuMemAllocPitch_v2),
    KGPU_PROC("cuMemFree", 2000, false, cuMemFree),
    KGPU_PROC("cuMemFree", 3020, false, cuMemFree_v2),
    KGPU_PROC("cuMemGetInfo", 2000, false, cuMemGetInfo),
    KGPU_PROC("cuMemGetInfo", 3020, false, cuMemGetInfo_v2),
    KGPU_PROC("cuMemAllocManaged", 6000, false, cuMemAllocManaged),
    KGPU_PROC("cuMemAllocAsync", 11020, false, cuMemAllocAsync),
    KGPU_PROC("cuMemAllocAsync", 11020, true, cuMemAllocAsync_ptsz),
    KGPU_PROC("cuMemAllocFromPoolAsync", 11020, false, cuMemAllocFromPoolAsync),
    KGPU_PROC("cuMemAllocFromPoolAsync", 11020, true, cuMemAllocFromPoolAsync_ptsz),
    KGPU_PROC("cuDeviceGetDefaultMemPool", 11020, false, cuDeviceGetDefaultMemPool),
    KGPU_PROC("cuMemFreeAsync", 11020, false, cuMemFreeAsync),
    KGPU_PROC("cuMemFreeAsync", 11020, true, cuMemFreeAsync_ptsz),
    KGPU_PROC("cuArrayCreate", 3020, false, cuArrayCreate_v2),
    KGPU_PROC("cuArray3DCreate", 3020, false, cuArray3DCreate_v2),
    KGPU_PROC("cuArrayDestroy", 2000, false, cuArrayDestroy),
    KGPU_PROC("cuArrayCreate", 2000, false, cuArrayCreate),
    KGPU_PROC("cuArray3DCreate", 2000, false, cuArray3DCreate),
    KGPU_PROC("cuMemAllocPitch", 2000, false, cuMemAllocPitch),
    KGPU_PROC("cuMipmappedArrayCreate", 5000, false, cuMipmappedArrayCreate),
    KGPU_PROC("cuMipmappedArrayDestroy", 5000, false, cuMipmappedArrayDestroy),
    KGPU_PROC("cuMemCreate", 10020, false, cuMemCreate),
    KGPU_PROC("cuMemRelease", 10020, false, cuMemRelease),
    {"cuGetProcAddress", 11030, false, Fn(cuGetProcAddress)},
    {"cuGetProcAddress", 12000, false, Fn(cuGetProcAddress_v2)},
};

CUresult ProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags,
                     CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *pfn = nullptr;
  const bool ptsz = flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  bool known = false, has_ptsz = false;
  for (const auto& e : kProcs) {
    if (std::strcmp(e.name, symbol) == 0 && e.ptsz) has_ptsz = true;
  }
  const ProcEntry* best = nullptr;
  for (const auto& e : kProcs) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    known = true;
    if (e.ptsz != (ptsz && has_ptsz) || e.since > version) continue;
    if (best == nullptr || e.since > best->since) best = &e;
  }
  if (best == nullptr) {
    if (status != nullptr) {
      *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return CUDA_ERROR_NOT_FOUND;
  }
  // KGPU_SIM_CUDA_PROC_INTERNAL=1 (a knob of the simulator, for tests): serve the internal entry
  // points, so that a caller cannot recognise a call by comparing with dlsym's answers.
  static const bool internal = [] {
    const char* v = std::getenv("KGPU_SIM_CUDA_PROC_INTERNAL");  // NOLINT(concurrency-mt-unsafe)
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  *pfn = internal && best->internal != nullptr ? best->internal : best->fn;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace kgpu::simcuda

CU_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return ProcAddress(symbol, pfn, cudaVersion, flags, nullptr);
}

CU_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult* symbolStatus) {
  return ProcAddress(symbol, pfn, cudaVersion, flags, symbolStatus);
}
