// The simulated CUDA driver (libcuda.so.1): the device, context and memory entry points that
// kgpu's memory interposer (isolation/) hooks, backed by the simulated node's shared state
// (simnvml/node.h, selected by KGPU_SIM_NODE / KGPU_SIM_STATE / KGPU_SIM_NODE_NAME exactly as for
// the simulated NVML). Modules, kernel launches, streams and synchronisation are exec_impl.cc's
// (internal.h); this file asks it for a stream's context (StreamContext) and is told of each
// synchronisation (OnSynchronize). What it models:
//  - Devices: the node's GPUs that are not in MIG mode, filtered and ordered by
//    CUDA_VISIBLE_DEVICES (indices or unique GPU-UUID prefixes; enumeration stops at the first
//    entry that is invalid, names no GPU or repeats one, as the real driver does).
//    cuDeviceGetAttribute serves the SM count and the resident threads per SM of the node's model
//    (and a few constants); other attributes are CUDA_ERROR_INVALID_VALUE.
//  - Memory on the node: whatever physical memory the process holds is raised on this pid's
//    SimProcess entry of that GPU, so NVML's running-process list and memory figures show it, and
//    cuMemGetInfo's free figure is the GPU's total less its reservation, less every process's
//    memory and the memory of no listed process. Memory beyond that fails with
//    CUDA_ERROR_OUT_OF_MEMORY. No memory is allocated on the host: device pointers are addresses
//    of a private range and must not be dereferenced.
//  - cuMemAlloc: a request of up to 1 MiB (kSmallMax) is placed at 512-byte alignment in a 2 MiB
//    chunk of the process on that GPU; the driver charges the chunk when it opens it and gives it
//    back when its last sub-allocation is freed. A larger request is rounded up to 2 MiB (the
//    driver's large-page granularity) and charged on its own. Pitched, managed and array memory is
//    always rounded up to 2 MiB on its own.
//  - Virtual memory management: cuMemCreate makes physical memory (a multiple of the 2 MiB
//    granularity), cuMemAddressReserve / cuMemAddressFree a private address range, cuMemMap /
//    cuMemUnmap / cuMemSetAccess map it. The memory goes back when every reference to the handle
//    (cuMemCreate, cuMemRetainAllocationHandle, each import) is released and every mapping of it
//    unmapped. cuMemExportToShareableHandle gives a file descriptor (a memfd naming the
//    allocation) that another process of the node imports with cuMemImportFromShareableHandle;
//    such memory is recorded node-wide in a side file, <state>.cuda-shared (see SharedTable).
//  - Memory pools (stream-ordered allocation): a default pool per device and pools made with
//    cuMemPoolCreate. A pool reserves physical memory in 2 MiB granules when it lacks free reserved
//    memory; a free returns memory to the pool only; a synchronisation releases what each pool of
//    the context's device holds beyond max(used, its release threshold); cuMemPoolTrimTo releases
//    down to max(used, minBytesToKeep).
//  - Stream capture and graphs: while a stream captures, cuMemAllocAsync / cuMemAllocFromPoolAsync
//    and cuMemFreeAsync on it add memory nodes to the capture's graph. A graph launch allocates
//    what its alloc nodes ask for from the device's graph memory (reserved in 2 MiB granules,
//    reused by later launches, released by cuDeviceGraphMemTrim) and frees what its free nodes
//    name. Other node kinds are recorded but not run.
//  - Contexts: the process appears in the GPU's process list while it holds a context on it;
//    destroying a context, releasing the primary context to zero or resetting it frees its
//    allocations (and pool allocations made on its streams), as the real driver does. A context's
//    own memory (the real driver's takes a few hundred MiB: its local memory, printf buffer, device
//    heap, loaded modules) is KGPU_SIM_CUDA_CONTEXT_MIB (a knob of the simulator, default 0),
//    charged to the process like an allocation while the context lives; a context that does not
//    fit fails with CUDA_ERROR_OUT_OF_MEMORY. That base includes the default limits
//    (cuCtxSetLimit): raising a limit charges the difference, lowering one gives it back.
//    Contexts form a per-thread stack (cuCtxPushCurrent / cuCtxPopCurrent).
//  - Not modelled: multicast objects. cuMulticastCreate makes a handle to which physical memory
//    is bound later ("Memory is bound to the multicast object via cuMulticastBindMem ... The total
//    amount of memory that can be bound per device is specified by CUmulticastObjectProp::size",
//    CUDA Driver API, Multicast Object Management), so it holds no device memory of its own; the
//    memory is that of cuMemCreate allocations, charged there. CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
//    is 0 and the entry points are not exported.
//  - Process exit: at a normal exit the library's destructor removes the process's entries; a
//    process killed with SIGKILL is reaped by the next process that initialises the driver or
//    runs out of memory (the pids the simulated driver registered are kept in a side file,
//    <state>.cuda-pids, so entries that kgpu-simctl added by hand are never reaped).
//
// Thread-safety: every entry point may be called from any thread; the node state (and its side
// files) is changed under the node's process-shared mutex, this process's tables under a local
// mutex (always taken before the node's). The current context is per thread, as in CUDA.

#include <algorithm>
#include <atomic>
#include <bitset>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "internal.h"
#include "node.h"

#define CU_EXPORT extern "C" __attribute__((visibility("default")))

namespace kgpu::simcuda {

// From exec_impl.cc, which creates streams: the context a stream was created in (the Ctx* of
// this file, as const void*), or nullptr for the null / legacy / per-thread handles and for a
// stream it does not know. It must not call back into this file's entry points; this file never
// calls it while holding its own mutex.
const void* StreamContext(CUstream s);

// StreamCaptureStatus, CaptureKernelNode and OnStreamDestroy (internal.h) are defined below.

namespace {

using sim::kMaxGpus;
using sim::kMaxProcs;
using sim::kNoId;
using sim::Node;
using sim::SimGpu;
using sim::SimProcess;

constexpr uint64_t kGranule = 2ULL << 20;  // 2 MiB: the large page; VMM, chunk and pool granule
// Small cuMemAlloc requests share 2 MiB chunks. Since Pascal the driver's page is 2 MiB and
// "allocations larger than 1MB are now always page-aligned" while smaller ones are packed into
// pages (PyTorch's caching-allocator change for Pascal and newer GPUs,
// https://github.com/pytorch/pytorch/pull/17120); the least alignment of cudaMalloc is 512 bytes
// (measured on GTX TITAN X and Tesla K80, https://github.com/cupy/cupy/pull/176). NVIDIA does not
// document either figure: these are observations, and the model's choice.
constexpr uint64_t kSmallMax = 1ULL << 20;
constexpr uint64_t kSmallAlign = 512;
constexpr unsigned kChunkSlots = static_cast<unsigned>(kGranule / kSmallAlign);  // 4096
constexpr uint64_t kPoolAlign = 512;  // stream-ordered allocations, packed in their pool's granules

// Address ranges (never overlapping): allocations, VMM reservations, the legacy 32-bit ABI.
constexpr uint64_t kVaBase = 0x200000000000ULL, kVaEnd = 0x500000000000ULL;
constexpr uint64_t kResvBase = 0x600000000000ULL, kResvEnd = 0x700000000000ULL;
constexpr uint64_t kVa32Base = 0x10000000ULL, kVa32End = 0xF0000000ULL;

// Default context limits (CUDA C++ Programming Guide: the device malloc() heap is 8 MB by
// default, the printf() FIFO 1 MB; the per-thread stack 1024 bytes).
constexpr uint64_t kDefaultStack = 1024, kDefaultPrintf = 1ULL << 20, kDefaultHeap = 8ULL << 20;

constexpr uint32_t kCtxMagic = 0x4b435458;  // KCTX
constexpr uint32_t kArrMagic = 0x4b415252;  // KARR
constexpr uint64_t kPidsMagic = 0x4b47505543504944ULL;
constexpr uint64_t kSharedMagic = 0x4b47505553484152ULL;  // KGPUSHAR
constexpr uint64_t kBlobMagic = 0x4b4750555648444cULL;    // KGPUVHDL
constexpr unsigned kPidSlots = 1024;
constexpr unsigned kSharedSlots = 256;
constexpr unsigned kSharedHolders = 16;

struct Ctx {
  uint32_t magic = kCtxMagic;
  int dev = 0;  // visible ordinal
  bool primary = false;
  uint64_t limits[3] = {kDefaultStack, kDefaultPrintf, kDefaultHeap};  // by CUlimit
  uint64_t charged = 0;  // the context's own memory now charged (base +- the limits' changes)
};

struct Arr {
  uint32_t magic = kArrMagic;
};

struct Pool;

enum class Kind {
  kPtr,     // charged on its own (rounded to 2 MiB)
  kSmall,   // a sub-allocation of a chunk
  kArray,   // an array (key: the Arr*)
  kMipmap,  // a mipmapped array (key: the Arr*)
  kPool,    // stream-ordered, from `pool`
  kGraph,   // made by a graph launch on ordinal `dev`
};

struct Alloc {
  unsigned gpu = 0;          // physical index on the node
  uint64_t bytes = 0;        // charged (kPtr, kArray, kMipmap) or used in its chunk / pool / graph memory
  const Ctx* ctx = nullptr;  // freed with this context (nullptr: with none)
  Kind kind = Kind::kPtr;
  Pool* pool = nullptr;  // kPool
  int dev = -1;          // kGraph
};

// A 2 MiB chunk of small allocations, 512-byte slots.
struct Chunk {
  unsigned gpu = 0;
  bool low32 = false;  // below 4 GiB (the legacy cuMemAlloc)
  unsigned live = 0;   // sub-allocations in it
  std::bitset<kChunkSlots> used;
};

// Physical memory of the VMM API, by handle.
struct Phys {
  unsigned gpu = 0;
  int dev = 0;
  uint64_t size = 0;
  int refs = 0;            // handle references (cuMemCreate / import / retain, less cuMemRelease)
  int maps = 0;            // mappings
  uint64_t shared_id = 0;  // its SharedSlot id once exported or imported (0: private)
  CUmemAllocationProp prop{};
};

struct Mapping {
  uint64_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
  std::vector<std::pair<int, unsigned long long>> access;  // ordinal -> CUmemAccess_flags
};

struct Pool {
  int dev = 0;
  unsigned gpu = 0;
  bool is_default = false;
  bool destroyed = false;  // cuMemPoolDestroy with allocations outstanding: goes with the last
  uint64_t reserved = 0, used = 0, reserved_high = 0, used_high = 0;
  uint64_t threshold = 0;    // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
  int reuse[3] = {1, 1, 1};  // CU_MEMPOOL_ATTR_REUSE_*
  CUmemPoolProps props{};
};

// A device's graph memory (what graph launches allocate), per process.
struct GraphMem {
  uint64_t used = 0, used_high = 0, reserved = 0, reserved_high = 0;
};

struct Graph;

struct GraphNode {
  Graph* graph = nullptr;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  std::vector<GraphNode*> deps;
  CUDA_MEM_ALLOC_NODE_PARAMS params{};  // MEM_ALLOC (dptr: the allocation's fixed address)
  std::vector<CUmemAccessDesc> access;  // MEM_ALLOC: params.accessDescs points here
  int dev = -1;                         // MEM_ALLOC
  uint64_t bytes = 0;                   // MEM_ALLOC: bytesize rounded to kPoolAlign
  CUdeviceptr free_ptr = 0;             // MEM_FREE
};

struct GraphExec;

struct Graph {
  std::vector<std::unique_ptr<GraphNode>> nodes;  // in creation order, a topological order
  GraphExec* exec = nullptr;                      // the live instantiation of a graph with memory nodes
};

struct ExecItem {
  bool alloc = false;  // an alloc node (else a free node)
  uint64_t va = 0;
  uint64_t bytes = 0;
  int dev = 0;
};

struct GraphExec {
  Graph* source = nullptr;  // the graph it was made from while both live and it has memory nodes
  std::vector<ExecItem> items;
  bool auto_free = false;
  bool mem_nodes = false;
};

// A graph allocation's identity (its alloc node's address never changes, nor is reused).
struct GraphVa {
  int dev = 0;
  uint64_t bytes = 0;
};

struct Capture {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  std::thread::id thread;     // the thread that began it
  int dev = 0;                // the stream's device
  Graph* graph = nullptr;     // owned until cuStreamEndCapture hands it out
  GraphNode* last = nullptr;  // the newest captured node: the next one depends on it
};

// Pids of the processes the simulated driver put into the node's process lists.
struct PidTable {
  uint64_t magic;
  struct {
    int32_t pid;
    uint32_t pad;
  } slots[kPidSlots];
};

// VMM allocations shared between processes of the node (<state>.cuda-shared, changed under the
// node's mutex). The memory stays charged to the exporting process ("owner") until no process
// holds a handle or mapping of it, even after the exporter released its own: on a real GPU the
// physical memory belongs to the allocation the exporter made, which lives on through the
// importers' references, so NVML keeps counting it where it was allocated. When the owner exits
// (or dies) while others still hold it, the charge moves to one of them, so the node never loses
// memory that is still in use.
struct SharedSlot {
  uint64_t id;  // 0: free
  uint64_t bytes;
  uint32_t gpu;
  int32_t owner;                    // the pid whose SimProcess entry carries the charge
  int32_t holders[kSharedHolders];  // pids holding a handle or mapping (0: empty)
};

struct SharedTable {
  uint64_t magic;
  uint64_t next_id;
  SharedSlot slots[kSharedSlots];
};

// What an exported file descriptor reads: the allocation on this node.
struct ShareBlob {
  uint64_t magic;
  uint64_t node;  // Fnv1a of the state file's real path
  uint64_t id;
};

struct Driver {
  Node* node = nullptr;
  PidTable* pids = nullptr;
  SharedTable* shared = nullptr;
  uint64_t node_hash = 0;
  std::vector<unsigned> visible;  // ordinal -> physical GPU index
  std::mutex mu;                  // guards everything below
  Ctx primary[kMaxGpus];
  int primary_refs[kMaxGpus] = {};
  int ctx_count[kMaxGpus] = {};                // live contexts (primary counts once) per ordinal
  std::unordered_set<const Ctx*> ctxs;         // live contexts made by cuCtxCreate
  std::unordered_map<uint64_t, Alloc> allocs;  // device pointer or array handle -> allocation
  std::map<uint64_t, Chunk> chunks;            // base -> chunk of small allocations
  std::unordered_map<uint64_t, Phys> phys;     // VMM handle -> physical memory
  std::map<uint64_t, uint64_t> reservations;   // VMM range base -> size
  std::map<uint64_t, Mapping> mappings;        // mapped address -> mapping
  std::vector<std::unique_ptr<Pool>> pools;
  Pool* default_pool[kMaxGpus] = {};
  Pool* current_pool[kMaxGpus] = {};
  GraphMem graph_mem[kMaxGpus];
  std::unordered_set<Graph*> graphs;
  std::unordered_set<GraphNode*> nodes;
  std::unordered_set<GraphExec*> execs;
  std::unordered_map<uint64_t, GraphVa> graph_vas;
  std::unordered_map<uintptr_t, Capture> captures;  // by stream key (StreamKey)
  uint64_t next_va = kVaBase;
  uint64_t next_va32 = kVa32Base;
  uint64_t next_resv = kResvBase;
  uint64_t next_vmm = 0x1000ULL;  // VMM handles
  uint64_t ctx_bytes = 0;         // each context's own memory (KGPU_SIM_CUDA_CONTEXT_MIB)
};

std::once_flag g_once;
CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
Driver* g_drv = nullptr;  // never freed: entry points may run during exit
thread_local Ctx* t_current = nullptr;
thread_local std::vector<Ctx*> t_stack;  // the contexts below t_current on this thread's stack
std::atomic<uint64_t> g_thread_keys{0};
thread_local uint64_t t_ptds_key = 0;  // this thread's per-thread default stream (StreamKey)

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

// getpid() is a system call on every call (glibc caches nothing since 2.25): read once per
// process, again in a child after fork.
std::atomic<int32_t> g_self_pid{0};

int32_t SelfPid() {
  int32_t pid = g_self_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    static const int registered = pthread_atfork(nullptr, nullptr, [] { g_self_pid.store(0); });
    (void)registered;
    pid = static_cast<int32_t>(getpid());
    g_self_pid.store(pid, std::memory_order_relaxed);
  }
  return pid;
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

// Puts `pid` into GPU `gpu`'s process list (no memory). Nullptr when the list is full.
SimProcess* EnsureProcOf(const Driver& d, const Node::Locked& nl, unsigned gpu, int32_t pid) {
  SimGpu& g = nl.gpu(gpu);
  if (SimProcess* p = FindProc(g, pid); p != nullptr) return p;
  if (g.nproc >= kMaxProcs) return nullptr;
  SimProcess p{};
  p.pid = static_cast<uint32_t>(pid);
  p.gi = p.ci = kNoId;
  g.procs[g.nproc++] = p;
  RegisterPid(*d.pids, pid);
  return &g.procs[g.nproc - 1];
}

bool EnsureProc(const Driver& d, const Node::Locked& nl, unsigned gpu) {
  return EnsureProcOf(d, nl, gpu, SelfPid()) != nullptr;
}

// Memory that already exists moves onto `pid`'s entry (no check against the GPU's free memory).
void AddToProc(const Driver& d, const Node::Locked& nl, unsigned gpu, int32_t pid, uint64_t bytes) {
  if (SimProcess* p = EnsureProcOf(d, nl, gpu, pid); p != nullptr) p->mem_bytes += bytes;
}

void SubFromProc(const Node::Locked& nl, unsigned gpu, int32_t pid, uint64_t bytes) {
  SimProcess* p = FindProc(nl.gpu(gpu), pid);
  if (p != nullptr) p->mem_bytes -= std::min(p->mem_bytes, bytes);
}

// ---- memory shared between processes (caller holds Node::Locked) ----

SharedSlot* FindSlot(const Driver& d, uint64_t id) {
  if (id == 0) return nullptr;
  for (auto& s : d.shared->slots) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

bool HasHolder(const SharedSlot& s, int32_t pid) {
  return std::find(std::begin(s.holders), std::end(s.holders), pid) != std::end(s.holders);
}

bool AddHolder(SharedSlot& s, int32_t pid) {
  if (HasHolder(s, pid)) return true;
  for (auto& h : s.holders) {
    if (h == 0) {
      h = pid;
      return true;
    }
  }
  return false;
}

void RemoveHolder(SharedSlot& s, int32_t pid) {
  for (auto& h : s.holders) {
    if (h == pid) h = 0;
  }
}

// After holders went away (`exiting`: a pid that is leaving and whose entry is about to be
// removed, or 0): frees the slot and its charge when nobody holds it any more, or moves the
// charge from a gone owner to a remaining holder.
void SettleSlot(const Driver& d, const Node::Locked& nl, SharedSlot& s, int32_t exiting) {
  if (s.id == 0) return;
  const bool owner_gone = s.owner == 0 || s.owner == exiting || !PidAlive(s.owner);
  int32_t first = 0;
  for (int32_t h : s.holders) {
    if (h != 0 && first == 0) first = h;
  }
  const bool gpu_ok = s.gpu < d.node->gpu_count();
  if (first == 0) {
    if (!owner_gone && gpu_ok) SubFromProc(nl, s.gpu, s.owner, s.bytes);
    s = SharedSlot{};
    return;
  }
  if (owner_gone) {
    s.owner = first;
    if (gpu_ok) AddToProc(d, nl, s.gpu, first, s.bytes);
  }
}

// Removes the entries of registered processes that no longer exist (the real driver frees a
// dead process's memory when the kernel tears its file descriptors down), and their holds on
// shared memory.
void Reap(const Driver& d, const Node::Locked& nl) {
  for (auto& s : d.pids->slots) {
    if (s.pid == 0 || PidAlive(s.pid)) continue;
    for (unsigned gpu = 0; gpu < d.node->gpu_count(); ++gpu) RemoveProc(nl.gpu(gpu), s.pid);
    s.pid = 0;
  }
  for (auto& slot : d.shared->slots) {
    if (slot.id == 0) continue;
    for (auto& h : slot.holders) {
      if (h != 0 && !PidAlive(h)) h = 0;
    }
    SettleSlot(d, nl, slot, 0);
  }
}

CUresult Charge(Driver& d, unsigned gpu, uint64_t bytes) {
  Node::Locked nl(*d.node);
  for (int attempt = 0; attempt < 2; ++attempt) {
    SimGpu& g = nl.gpu(gpu);
    const uint64_t used = UsedBytes(g);
    const uint64_t usable = UsableBytes(*d.node, gpu);
    if (used <= usable && bytes <= usable - used && EnsureProc(d, nl, gpu)) {
      FindProc(g, SelfPid())->mem_bytes += bytes;
      return CUDA_SUCCESS;
    }
    Reap(d, nl);
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}

void Uncharge(Driver& d, unsigned gpu, uint64_t bytes) {
  Node::Locked nl(*d.node);
  SubFromProc(nl, gpu, SelfPid(), bytes);
}

// ---- set-up ----

// Maps the side file `path` holding a T that starts with a uint64_t magic (zeroed and stamped
// when it is new or holds something else).
template <typename T>
T* OpenTable(const std::string& path, uint64_t magic) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return nullptr;
  fchmod(fd, 0666);
  flock(fd, LOCK_EX);
  struct stat st {};
  fstat(fd, &st);
  if (static_cast<size_t>(st.st_size) != sizeof(T) && ftruncate(fd, sizeof(T)) != 0) {
    close(fd);
    return nullptr;
  }
  void* mem = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  auto* t = mem == MAP_FAILED ? nullptr : static_cast<T*>(mem);
  if (t != nullptr && t->magic != magic) {
    std::memset(static_cast<void*>(t), 0, sizeof *t);
    t->magic = magic;
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
    Node::Locked nl(node);
    for (unsigned i = 0; i < node.gpu_count(); ++i) {
      if (nl.gpu(i).mig_current == 0) all.push_back(i);
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
  const std::string& state = d->node->environment().state_path;
  d->pids = OpenTable<PidTable>(state + ".cuda-pids", kPidsMagic);
  d->shared = OpenTable<SharedTable>(state + ".cuda-shared", kSharedMagic);
  if (d->pids == nullptr || d->shared == nullptr) {
    std::fprintf(stderr, "simulated libcuda: cannot open %s.cuda-pids or %s.cuda-shared\n", state.c_str(),
                 state.c_str());
    g_init_result = CUDA_ERROR_NO_DEVICE;
    return;
  }
  {  // the node's identity in exported handles: its state file, however the path was spelt
    char* real = ::realpath(state.c_str(), nullptr);
    d->node_hash = sim::Fnv1a(real != nullptr ? std::string(real) : state);
    std::free(real);  // NOLINT(cppcoreguidelines-no-malloc): realpath's buffer
  }
  {
    Node::Locked nl(*d->node);
    Reap(*d, nl);
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

// At a normal exit the process's memory goes back, as with the real driver; memory it shared
// with processes that still hold it moves to one of them (SettleSlot).
struct ExitCleanup {
  ~ExitCleanup() {
    if (g_drv == nullptr) return;
    Node::Locked nl(*g_drv->node);
    const int32_t pid = SelfPid();
    for (auto& slot : g_drv->shared->slots) {
      if (slot.id == 0 || (slot.owner != pid && !HasHolder(slot, pid))) continue;
      RemoveHolder(slot, pid);
      SettleSlot(*g_drv, nl, slot, pid);
    }
    for (unsigned gpu = 0; gpu < g_drv->node->gpu_count(); ++gpu) RemoveProc(nl.gpu(gpu), pid);
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

// The ordinal of physical GPU `gpu` in this process, or -1.
int OrdinalOf(const Driver& d, unsigned gpu) {
  for (size_t i = 0; i < d.visible.size(); ++i) {
    if (d.visible[i] == gpu) return static_cast<int>(i);
  }
  return -1;
}

// Whether `c` is a live context (caller holds d.mu).
bool LiveCtx(const Driver& d, const Ctx* c) {
  if (c == nullptr) return false;
  for (unsigned i = 0; i < kMaxGpus; ++i) {
    if (c == &d.primary[i]) return d.primary_refs[i] > 0 && ValidDev(d, c->dev);
  }
  return d.ctxs.count(c) != 0;
}

// The current context's device, or an error.
CUresult CurrentGpu(const Driver& d, unsigned* gpu, const Ctx** ctx) {
  const Ctx* c = t_current;
  if (c == nullptr || c->magic != kCtxMagic || !ValidDev(d, c->dev)) return CUDA_ERROR_INVALID_CONTEXT;
  *gpu = d.visible[static_cast<size_t>(c->dev)];
  if (ctx != nullptr) *ctx = c;
  return CUDA_SUCCESS;
}

// The next address of `bytes` at `align` in the allocation range (or the 32-bit one), without
// taking it: CommitVa takes it once the memory is charged. False when the range is exhausted.
bool PeekVa(const Driver& d, uint64_t bytes, uint64_t align, bool low32, uint64_t* va) {
  const uint64_t start = RoundUp(low32 ? d.next_va32 : d.next_va, align);
  const uint64_t end = low32 ? kVa32End : kVaEnd;
  if (start > end || bytes > end - start) return false;
  *va = start;
  return true;
}

void CommitVa(Driver& d, uint64_t va, uint64_t bytes, bool low32) {
  (low32 ? d.next_va32 : d.next_va) = va + bytes;
}

// ---- stream capture (caller holds d.mu) ----

uint64_t PerThreadKey() {
  if (t_ptds_key == 0) t_ptds_key = ((++g_thread_keys) << 3) | 1;  // odd: never a stream's address
  return t_ptds_key;
}

// The key of a stream in Driver::captures: its address, this thread's per-thread key for the
// per-thread default stream, 0 for the legacy stream (which cannot capture).
uintptr_t StreamKey(CUstream stream, bool per_thread) {
  if (stream == CU_STREAM_LEGACY || (stream == nullptr && !per_thread)) return 0;
  if (stream == CU_STREAM_PER_THREAD || stream == nullptr) return PerThreadKey();
  return reinterpret_cast<uintptr_t>(stream);
}

// Whether this thread may make a "potentially unsafe" call (cuMemAlloc and its kin) now. The
// thread's interaction mode is the default, CU_STREAM_CAPTURE_MODE_GLOBAL: "If the local thread
// has an ongoing capture sequence that was not initiated with CU_STREAM_CAPTURE_MODE_RELAXED ...,
// or if any other thread has a concurrent capture sequence initiated with
// CU_STREAM_CAPTURE_MODE_GLOBAL, this thread is prohibited from potentially unsafe API calls"
// (CUDA Driver API, cuThreadExchangeStreamCaptureMode). A prohibited call fails with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates those captures.
CUresult CheckUnsafeCall(Driver& d) {
  const std::thread::id self = std::this_thread::get_id();
  bool prohibited = false;
  for (auto& [key, c] : d.captures) {
    if (c.status != CU_STREAM_CAPTURE_STATUS_ACTIVE) continue;
    if ((c.thread == self && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
        (c.thread != self && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
      c.status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// ---- small allocations (caller holds d.mu) ----

// Finds `n` free slots in a row in `c`; returns the first or kChunkSlots.
unsigned FindSlots(const Chunk& c, unsigned n) {
  unsigned run = 0;
  for (unsigned i = 0; i < kChunkSlots; ++i) {
    run = c.used[i] ? 0 : run + 1;
    if (run == n) return i + 1 - n;
  }
  return kChunkSlots;
}

// Places `bytes` (<= kSmallMax) in a chunk of GPU `gpu`, opening (and charging) a new chunk when
// none has room.
CUresult SmallAlloc(Driver& d, unsigned gpu, uint64_t bytes, bool low32, uint64_t* addr) {
  const auto n = static_cast<unsigned>(RoundUp(bytes, kSmallAlign) / kSmallAlign);
  for (auto& [base, c] : d.chunks) {
    if (c.gpu != gpu || c.low32 != low32) continue;
    const unsigned first = FindSlots(c, n);
    if (first == kChunkSlots) continue;
    for (unsigned i = first; i < first + n; ++i) c.used.set(i);
    ++c.live;
    *addr = base + first * kSmallAlign;
    return CUDA_SUCCESS;
  }
  uint64_t base = 0;
  if (!PeekVa(d, kGranule, kGranule, low32, &base)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (CUresult r = Charge(d, gpu, kGranule); r != CUDA_SUCCESS) return r;
  CommitVa(d, base, kGranule, low32);
  Chunk& c = d.chunks[base];
  c.gpu = gpu;
  c.low32 = low32;
  for (unsigned i = 0; i < n; ++i) c.used.set(i);
  c.live = 1;
  *addr = base;
  return CUDA_SUCCESS;
}

// Frees the sub-allocation of `bytes` at `addr`; a chunk left empty goes back.
void SmallFree(Driver& d, uint64_t addr, uint64_t bytes) {
  auto it = d.chunks.upper_bound(addr);
  if (it == d.chunks.begin()) return;
  --it;
  Chunk& c = it->second;
  const auto first = static_cast<unsigned>((addr - it->first) / kSmallAlign);
  const auto n = static_cast<unsigned>(RoundUp(bytes, kSmallAlign) / kSmallAlign);
  for (unsigned i = first; i < first + n && i < kChunkSlots; ++i) c.used.reset(i);
  if (c.live > 0) --c.live;
  if (c.live == 0) {
    Uncharge(d, c.gpu, kGranule);
    d.chunks.erase(it);
  }
}

// ---- memory pools (caller holds d.mu) ----

Pool* FindPool(const Driver& d, CUmemoryPool handle) {
  for (const auto& p : d.pools) {
    if (reinterpret_cast<CUmemoryPool>(p.get()) == handle && !p->destroyed) return p.get();
  }
  return nullptr;
}

Pool* DefaultPool(Driver& d, int dev) {
  if (d.default_pool[dev] == nullptr) {
    auto p = std::make_unique<Pool>();
    p->dev = dev;
    p->gpu = d.visible[static_cast<size_t>(dev)];
    p->is_default = true;
    p->props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    p->props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->props.location.id = dev;
    d.default_pool[dev] = p.get();
    d.pools.push_back(std::move(p));
  }
  return d.default_pool[dev];
}

Pool* CurrentPool(Driver& d, int dev) {
  if (d.current_pool[dev] == nullptr) d.current_pool[dev] = DefaultPool(d, dev);
  return d.current_pool[dev];
}

// Takes `bytes` (a multiple of kPoolAlign) from the pool, reserving 2 MiB granules as needed.
CUresult PoolTake(Driver& d, Pool& p, uint64_t bytes) {
  const uint64_t spare = p.reserved - p.used;
  if (bytes > spare) {
    const uint64_t grow = RoundUp(bytes - spare, kGranule);
    if (p.props.maxSize != 0 && p.reserved + grow > p.props.maxSize) return CUDA_ERROR_OUT_OF_MEMORY;
    if (CUresult r = Charge(d, p.gpu, grow); r != CUDA_SUCCESS) return r;
    p.reserved += grow;
    p.reserved_high = std::max(p.reserved_high, p.reserved);
  }
  p.used += bytes;
  p.used_high = std::max(p.used_high, p.used);
  return CUDA_SUCCESS;
}

// Releases reserved memory down to max(used, keep), in whole granules.
void PoolRelease(Driver& d, Pool& p, uint64_t keep) {
  const uint64_t target = std::max(p.used, keep);
  if (target >= p.reserved) return;
  const uint64_t kept = RoundUp(target, kGranule);
  if (kept >= p.reserved) return;
  Uncharge(d, p.gpu, p.reserved - kept);
  p.reserved = kept;
}

void DeletePool(Driver& d, Pool* p) {
  PoolRelease(d, *p, 0);
  for (auto it = d.pools.begin(); it != d.pools.end(); ++it) {
    if (it->get() == p) {
      d.pools.erase(it);
      return;
    }
  }
}

// An allocation of `bytes` goes back to its pool; a destroyed pool goes with its last one.
void PoolGive(Driver& d, Pool* p, uint64_t bytes) {
  p->used -= std::min(p->used, bytes);
  if (p->destroyed && p->used == 0) DeletePool(d, p);
}

// A synchronisation of (or the end of) a context on ordinal `dev`: each pool of the device gives
// back what it holds beyond max(used, release threshold), or beyond used with `to_used`.
void TrimPools(Driver& d, int dev, bool to_used) {
  for (const auto& p : d.pools) {
    if (p->dev == dev) PoolRelease(d, *p, to_used ? 0 : p->threshold);
  }
}

// ---- graph memory (caller holds d.mu) ----

void GraphMemGive(Driver& d, int dev, uint64_t bytes) {
  GraphMem& m = d.graph_mem[dev];
  m.used -= std::min(m.used, bytes);
}

// ---- frees (caller holds d.mu) ----

// Frees the allocation `it` points at, whatever its kind, and erases it.
void FreeAlloc(Driver& d, std::unordered_map<uint64_t, Alloc>::iterator it) {
  const Alloc a = it->second;
  const uint64_t key = it->first;
  d.allocs.erase(it);
  switch (a.kind) {
    case Kind::kPtr:
      Uncharge(d, a.gpu, a.bytes);
      break;
    case Kind::kSmall:
      SmallFree(d, key, a.bytes);
      break;
    case Kind::kArray:
    case Kind::kMipmap:
      Uncharge(d, a.gpu, a.bytes);
      delete reinterpret_cast<Arr*>(key);  // NOLINT(performance-no-int-to-ptr)
      break;
    case Kind::kPool:
      PoolGive(d, a.pool, a.bytes);
      break;
    case Kind::kGraph:
      GraphMemGive(d, a.dev, a.bytes);
      break;
  }
}

// Frees device memory at `ptr` (cuMemFree, cuMemFreeAsync): cuMemAlloc's, a pool's or a graph's.
CUresult FreePtr(Driver& d, uint64_t ptr) {
  auto it = d.allocs.find(ptr);
  if (it == d.allocs.end() || it->second.kind == Kind::kArray || it->second.kind == Kind::kMipmap) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FreeAlloc(d, it);
  return CUDA_SUCCESS;
}

// Frees the allocations made in context `ctx`.
void FreeAllocsOf(Driver& d, const Ctx* ctx) {
  std::vector<uint64_t> keys;
  for (const auto& [key, a] : d.allocs) {
    if (a.ctx == ctx) keys.push_back(key);
  }
  for (uint64_t key : keys) {
    auto it = d.allocs.find(key);
    if (it != d.allocs.end()) FreeAlloc(d, it);
  }
}

// ---- context memory ----

// Resident threads per SM by compute capability (CUDA C++ Programming Guide, "Technical
// Specifications per Compute Capability": 1024 on 7.5; 1536 on 8.6, 8.9 and 12.x; 2048 on the
// others since 5.0).
unsigned ThreadsPerSm(const sim::GpuModel& m) {
  if (m.cc_major == 7 && m.cc_minor == 5) return 1024;
  if ((m.cc_major == 8 && (m.cc_minor == 6 || m.cc_minor == 9)) || m.cc_major == 12) return 1536;
  return 2048;
}

// The model's SM count, from its profile, else by its name.
unsigned SmCount(const sim::GpuModel& m) {
  if (m.sm_count > 0) return m.sm_count;
  static const struct {
    const char* name;
    unsigned sms;
  } kTable[] = {{"H100 PCIe", 114}, {"H100", 132}, {"H200", 132}, {"A100", 108}, {"L4", 58}};
  for (const auto& e : kTable) {
    if (m.name.find(e.name) != std::string::npos || m.key.find(e.name) != std::string::npos) return e.sms;
  }
  return 1;
}

// Device memory behind a context's limits: the printf FIFO and the malloc heap at their sizes,
// and every resident thread's stack (stack size x SMs x resident threads per SM) rounded up to
// whole granules. (Saturated far beyond any GPU's memory, so that the sum cannot wrap.)
uint64_t LimitBytes(const Driver& d, int dev, const uint64_t (&limits)[3]) {
  const sim::GpuModel& m = *d.node->profile().gpus[d.visible[static_cast<size_t>(dev)]].model;
  const uint64_t threads = uint64_t{SmCount(m)} * ThreadsPerSm(m);
  constexpr uint64_t kMax = UINT64_MAX / 4;
  const uint64_t stack =
      limits[CU_LIMIT_STACK_SIZE] > kMax / threads ? kMax : RoundUp(limits[CU_LIMIT_STACK_SIZE] * threads, kGranule);
  return stack + std::min(limits[CU_LIMIT_PRINTF_FIFO_SIZE], kMax) + std::min(limits[CU_LIMIT_MALLOC_HEAP_SIZE], kMax);
}

// What a context with `limits` takes on ordinal `dev`: the base (which includes the defaults)
// plus what the limits take beyond the defaults (less, when they are lower; never below 0).
uint64_t CtxBytes(const Driver& d, int dev, const uint64_t (&limits)[3]) {
  static constexpr uint64_t kDefaults[3] = {kDefaultStack, kDefaultPrintf, kDefaultHeap};
  const uint64_t now = LimitBytes(d, dev, limits), dflt = LimitBytes(d, dev, kDefaults);
  if (d.ctx_bytes + now < dflt) return 0;
  return d.ctx_bytes + now - dflt;
}

void ResetLimits(Ctx& c) {
  c.limits[CU_LIMIT_STACK_SIZE] = kDefaultStack;
  c.limits[CU_LIMIT_PRINTF_FIFO_SIZE] = kDefaultPrintf;
  c.limits[CU_LIMIT_MALLOC_HEAP_SIZE] = kDefaultHeap;
}

// The primary context is reset: its limits go back to the defaults, and their memory to the base.
void ResetCtxMemory(Driver& d, Ctx& c) {
  ResetLimits(c);
  const unsigned gpu = d.visible[static_cast<size_t>(c.dev)];
  if (c.charged > d.ctx_bytes) Uncharge(d, gpu, c.charged - d.ctx_bytes);
  // (a context charged below its base, after lowering limits, keeps what it has: the base is
  // what a fresh context takes, and charging it could fail here)
  c.charged = std::min(c.charged, d.ctx_bytes);
}

// A context on ordinal `dev` goes away: its allocations are freed, the pools of the device
// released (a context's end waits for its work, as a synchronisation does; the device's last
// context takes everything the pools hold), and the process leaves the GPU's list when it was
// its last context there (caller holds d.mu).
void DropContext(Driver& d, Ctx* ctx, int dev) {
  const unsigned gpu = d.visible[static_cast<size_t>(dev)];
  FreeAllocsOf(d, ctx);
  if (ctx->charged > 0) Uncharge(d, gpu, ctx->charged);
  ctx->charged = 0;
  const bool last = --d.ctx_count[dev] == 0;
  TrimPools(d, dev, last);
  if (last) {
    Node::Locked nl(*d.node);
    SimProcess* p = FindProc(nl.gpu(gpu), SelfPid());
    if (p != nullptr && p->mem_bytes == 0) RemoveProc(nl.gpu(gpu), SelfPid());
  }
}

CUresult AddContext(Driver& d, Ctx& ctx, int dev) {
  const unsigned gpu = d.visible[static_cast<size_t>(dev)];
  ResetLimits(ctx);
  if (d.ctx_bytes > 0) {
    if (CUresult r = Charge(d, gpu, d.ctx_bytes); r != CUDA_SUCCESS) return r;
  } else {
    Node::Locked nl(*d.node);
    if (!EnsureProc(d, nl, gpu)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ctx.charged = d.ctx_bytes;
  ++d.ctx_count[dev];
  return CUDA_SUCCESS;
}

CUresult MemInfo(uint64_t* free_bytes, uint64_t* total_bytes) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  unsigned gpu = 0;
  if (CUresult r = CurrentGpu(*d, &gpu, nullptr); r != CUDA_SUCCESS) return r;
  Node::Locked nl(*d->node);
  const uint64_t used = UsedBytes(nl.gpu(gpu));
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

// KGPU_SIM_CUDA_FAIL_UUID=1 (a knob of the simulator, for tests): every UUID query fails with
// CUDA_ERROR_UNKNOWN, as a driver that cannot read the GPU's UUID.
CU_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  static const bool fail_uuid = [] {
    const char* v = std::getenv("KGPU_SIM_CUDA_FAIL_UUID");  // NOLINT(concurrency-mt-unsafe)
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  if (fail_uuid) return CUDA_ERROR_UNKNOWN;
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

// The attributes the simulation models: the SM count and resident threads per SM of the node's
// model, its compute capability, and the features this driver implements (VMM with POSIX file
// descriptors, memory pools without IPC, no multicast).
CU_EXPORT CUresult cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  const kgpu::sim::GpuModel& m = *d->node->profile().gpus[d->visible[static_cast<size_t>(dev)]].model;
  switch (static_cast<int>(attrib)) {  // (any int may come; unknown ones are refused below)
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *pi = static_cast<int>(SmCount(m));
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      *pi = static_cast<int>(ThreadsPerSm(m));
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *pi = m.cc_major;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *pi = m.cc_minor;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *pi = 1024;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      *pi = 32;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      *pi = 1;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
      *pi = CU_MEM_HANDLE_TYPE_NONE;
      return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
      *pi = 0;
      return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// ---------------------------------------------------------------- contexts
// Contexts form a stack per thread: t_current is its top, t_stack what lies below.

// A new context is pushed onto the calling thread's stack ("If a context is already current to
// the thread, it is supplanted by the newly created context and may be restored by a subsequent
// call to cuCtxPopCurrent()", cuCtxCreate).
CU_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (pctx == nullptr || flags > 0x1F) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> guard(d->mu);
  auto* c = new Ctx;
  c->dev = dev;
  if (CUresult r = AddContext(*d, *c, dev); r != CUDA_SUCCESS) {
    delete c;
    return r;
  }
  d->ctxs.insert(c);
  if (t_current != nullptr) t_stack.push_back(t_current);
  t_current = c;
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

// A context current to the calling thread is also popped from its stack.
CU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  auto* c = reinterpret_cast<Ctx*>(ctx);
  std::lock_guard<std::mutex> guard(d->mu);
  if (c == nullptr || d->ctxs.count(c) == 0) return CUDA_ERROR_INVALID_CONTEXT;  // (a primary one too)
  DropContext(*d, c, c->dev);
  d->ctxs.erase(c);
  t_stack.erase(std::remove(t_stack.begin(), t_stack.end(), c), t_stack.end());
  if (t_current == c) {
    t_current = t_stack.empty() ? nullptr : t_stack.back();
    if (!t_stack.empty()) t_stack.pop_back();
  }
  c->magic = 0;
  delete c;
  return CUDA_SUCCESS;
}

// Replaces the top of the thread's stack; NULL pops it.
CU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  auto* c = reinterpret_cast<Ctx*>(ctx);
  if (c != nullptr && c->magic != kCtxMagic) return CUDA_ERROR_INVALID_CONTEXT;
  if (c == nullptr) {
    t_current = t_stack.empty() ? nullptr : t_stack.back();
    if (!t_stack.empty()) t_stack.pop_back();
    return CUDA_SUCCESS;
  }
  t_current = c;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (Drv() == nullptr) return g_init_result;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(t_current);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  auto* c = reinterpret_cast<Ctx*>(ctx);
  if (c == nullptr || c->magic != kCtxMagic) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_current != nullptr) t_stack.push_back(t_current);
  t_current = c;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(t_current);
  t_current = t_stack.empty() ? nullptr : t_stack.back();
  if (!t_stack.empty()) t_stack.pop_back();
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
  std::lock_guard<std::mutex> guard(d->mu);
  if (d->primary_refs[dev] == 0) {
    if (CUresult r = AddContext(*d, d->primary[dev], dev); r != CUDA_SUCCESS) return r;
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
  std::lock_guard<std::mutex> guard(d->mu);
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
  std::lock_guard<std::mutex> guard(d->mu);
  *flags = 0;
  *active = d->primary_refs[dev] > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

// Frees every allocation of the primary context and resets its state (limits back to their
// defaults, the device's pools to what is in use); the context stays retained (its references
// are kept) and starts afresh.
CU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> guard(d->mu);
  FreeAllocsOf(*d, &d->primary[dev]);
  ResetCtxMemory(*d, d->primary[dev]);
  TrimPools(*d, dev, true);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return cuDevicePrimaryCtxReset_v2(dev);
}

CU_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  return cuCtxDestroy_v2(ctx);
}

// Limits of the current context (cuCtxSetLimit: "Setting limit to value is a request by the
// application to update the current limit maintained by the context"). The memory behind the
// stack, printf FIFO and malloc heap limits is the context's own (LimitBytes): raising one charges
// the difference on the context's GPU (CUDA_ERROR_OUT_OF_MEMORY when it does not fit, the limit
// unchanged), lowering one gives it back. The other limits are not modelled
// (CUDA_ERROR_UNSUPPORTED_LIMIT).
CU_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  Ctx* c = t_current;
  if (c == nullptr || c->magic != kCtxMagic) return CUDA_ERROR_INVALID_CONTEXT;
  const int which = static_cast<int>(limit);
  if (which < CU_LIMIT_STACK_SIZE || which > CU_LIMIT_MALLOC_HEAP_SIZE) return CUDA_ERROR_UNSUPPORTED_LIMIT;
  std::lock_guard<std::mutex> guard(d->mu);
  if (!LiveCtx(*d, c)) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t next[3] = {c->limits[0], c->limits[1], c->limits[2]};
  next[which] = value;
  const uint64_t want = CtxBytes(*d, c->dev, next);
  const unsigned gpu = d->visible[static_cast<size_t>(c->dev)];
  if (want > c->charged) {
    if (CUresult r = Charge(*d, gpu, want - c->charged); r != CUDA_SUCCESS) return r;
  } else if (want < c->charged) {
    Uncharge(*d, gpu, c->charged - want);
  }
  c->charged = want;
  c->limits[which] = value;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (pvalue == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Ctx* c = t_current;
  if (c == nullptr || c->magic != kCtxMagic) return CUDA_ERROR_INVALID_CONTEXT;
  const int which = static_cast<int>(limit);
  if (which < CU_LIMIT_STACK_SIZE || which > CU_LIMIT_MALLOC_HEAP_SIZE) return CUDA_ERROR_UNSUPPORTED_LIMIT;
  std::lock_guard<std::mutex> guard(d->mu);
  *pvalue = c->limits[which];
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- streams (what this file needs)
namespace kgpu::simcuda {
namespace {

// The context of `stream`: explicit streams through exec_impl.cc, the null, legacy and
// per-thread handles the calling thread's current one. Called without d.mu; the caller checks
// LiveCtx under it.
CUresult StreamCtx(CUstream stream, const Ctx** ctx) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    *ctx = t_current;
    return *ctx != nullptr && (*ctx)->magic == kCtxMagic ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  }
  const void* c = StreamContext(stream);
  if (c == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *ctx = static_cast<const Ctx*>(c);
  return CUDA_SUCCESS;
}

CUresult GetStreamCtx(CUstream stream, const Ctx** out) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  const Ctx* c = nullptr;
  if (CUresult r = StreamCtx(stream, &c); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> guard(d->mu);
  if (!LiveCtx(*d, c)) return CUDA_ERROR_INVALID_CONTEXT;
  *out = c;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace kgpu::simcuda

CU_EXPORT CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Ctx* c = nullptr;
  const CUresult r = GetStreamCtx(hStream, &c);
  if (r == CUDA_SUCCESS) *pctx = reinterpret_cast<CUcontext>(const_cast<Ctx*>(c));
  return r;
}
CU_EXPORT CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) {
  return cuStreamGetCtx(hStream, pctx);  // (the null stream is the current context's either way)
}

CU_EXPORT CUresult cuStreamGetDevice(CUstream hStream, CUdevice* device) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const Ctx* c = nullptr;
  const CUresult r = GetStreamCtx(hStream, &c);
  if (r == CUDA_SUCCESS) *device = c->dev;
  return r;
}
CU_EXPORT CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice* device) {
  return cuStreamGetDevice(hStream, device);
}

// ---------------------------------------------------------------- memory
namespace kgpu::simcuda {
namespace {

// Charges `bytes` (a multiple of the granule) on GPU `gpu` and records it under a new address
// (caller holds d.mu).
CUresult AllocWhole(Driver& d, unsigned gpu, const Ctx* ctx, uint64_t bytes, bool low32, uint64_t* out) {
  uint64_t va = 0;
  if (!PeekVa(d, bytes, kGranule, low32, &va)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (CUresult r = Charge(d, gpu, bytes); r != CUDA_SUCCESS) return r;
  CommitVa(d, va, bytes, low32);
  Alloc a;
  a.gpu = gpu;
  a.bytes = bytes;
  a.ctx = ctx;
  a.kind = Kind::kPtr;
  d.allocs[va] = a;
  *out = va;
  return CUDA_SUCCESS;
}

// Device memory in the current context (cuMemAlloc, pitched, managed): `bytesize` as asked;
// `small_ok`: a request of up to kSmallMax is sub-allocated from a chunk.
CUresult AllocDevice(uint64_t bytesize, bool low32, bool small_ok, uint64_t* out) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  unsigned gpu = 0;
  const Ctx* ctx = nullptr;
  if (CUresult r = CurrentGpu(*d, &gpu, &ctx); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> guard(d->mu);
  if (CUresult r = CheckUnsafeCall(*d); r != CUDA_SUCCESS) return r;
  if (!small_ok || bytesize > kSmallMax) return AllocWhole(*d, gpu, ctx, RoundUp(bytesize, kGranule), low32, out);
  uint64_t addr = 0;
  if (CUresult r = SmallAlloc(*d, gpu, bytesize, low32, &addr); r != CUDA_SUCCESS) return r;
  Alloc a;
  a.gpu = gpu;
  a.bytes = RoundUp(bytesize, kSmallAlign);
  a.ctx = ctx;
  a.kind = Kind::kSmall;
  d->allocs[addr] = a;
  *out = addr;
  return CUDA_SUCCESS;
}

CUresult FreeDevice(uint64_t ptr) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  return FreePtr(*d, ptr);
}

}  // namespace
}  // namespace kgpu::simcuda

CU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t p = 0;
  const CUresult r = AllocDevice(bytesize, false, true, &p);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

CU_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t p = 0;
  const CUresult r = AllocDevice(bytesize, true, true, &p);
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
  const CUresult r = AllocDevice(pitch * Height, false, false, &p);
  if (r == CUDA_SUCCESS) {
    *dptr = p;
    *pPitch = pitch;
  }
  return r;
}

CU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return FreeDevice(dptr);
}
CU_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
  return FreeDevice(dptr);
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
  const CUresult r = AllocDevice(bytesize, false, false, &p);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

// ---------------------------------------------------------------- memory pools and graphs (internals)
namespace kgpu::simcuda {
namespace {

bool ValidAccessFlags(unsigned long long f) {
  return f == CU_MEM_ACCESS_FLAGS_PROT_NONE || f == CU_MEM_ACCESS_FLAGS_PROT_READ ||
         f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

// A new node of `type` in `graph` depending on `deps` (each a node of the graph, no duplicates).
CUresult NewNode(Driver& d, Graph* graph, CUgraphNodeType type, const std::vector<GraphNode*>& deps, GraphNode** out) {
  for (size_t i = 0; i < deps.size(); ++i) {
    if (d.nodes.count(deps[i]) == 0 || deps[i]->graph != graph) return CUDA_ERROR_INVALID_VALUE;
    if (std::find(deps.begin(), deps.begin() + static_cast<std::ptrdiff_t>(i), deps[i]) !=
        deps.begin() + static_cast<std::ptrdiff_t>(i)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  auto n = std::make_unique<GraphNode>();
  n->graph = graph;
  n->type = type;
  n->deps = deps;
  GraphNode* raw = n.get();
  graph->nodes.push_back(std::move(n));
  d.nodes.insert(raw);
  *out = raw;
  return CUDA_SUCCESS;
}

CUresult NodeDeps(const Driver& d, const CUgraphNode* deps, size_t n, std::vector<GraphNode*>* out) {
  if (n > 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < n; ++i) {
    auto* node = reinterpret_cast<GraphNode*>(deps[i]);
    if (d.nodes.count(node) == 0) return CUDA_ERROR_INVALID_VALUE;
    out->push_back(node);
  }
  return CUDA_SUCCESS;
}

// An alloc node: its address is fixed now, for the node's life ("When cuGraphAddMemAllocNode
// creates an allocation node, it returns the address of the allocation in nodeParams.dptr. The
// allocation's address remains fixed across instantiations and launches.").
CUresult AddAllocNode(Driver& d, Graph* graph, const std::vector<GraphNode*>& deps, CUDA_MEM_ALLOC_NODE_PARAMS* p,
                      GraphNode** out) {
  const CUmemPoolProps& props = p->poolProps;
  if (p->bytesize == 0 || props.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props.location.type != CU_MEM_LOCATION_TYPE_DEVICE || props.handleTypes != CU_MEM_HANDLE_TYPE_NONE ||
      p->accessDescCount > d.visible.size() || (p->accessDescCount > 0 && p->accessDescs == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidDev(d, props.location.id)) return CUDA_ERROR_INVALID_DEVICE;
  for (size_t i = 0; i < p->accessDescCount; ++i) {
    const CUmemAccessDesc& a = p->accessDescs[i];
    if (a.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !ValidDev(d, a.location.id) || !ValidAccessFlags(a.flags)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  const uint64_t bytes = RoundUp(p->bytesize, kPoolAlign);
  uint64_t va = 0;
  if (!PeekVa(d, bytes, kPoolAlign, false, &va)) return CUDA_ERROR_OUT_OF_MEMORY;
  GraphNode* n = nullptr;
  if (CUresult r = NewNode(d, graph, CU_GRAPH_NODE_TYPE_MEM_ALLOC, deps, &n); r != CUDA_SUCCESS) return r;
  CommitVa(d, va, bytes, false);
  p->dptr = va;
  n->params = *p;
  n->access.assign(p->accessDescs, p->accessDescs + p->accessDescCount);
  n->params.accessDescs = n->access.empty() ? nullptr : n->access.data();
  n->dev = props.location.id;
  n->bytes = bytes;
  GraphVa gv;
  gv.dev = n->dev;
  gv.bytes = bytes;
  d.graph_vas[va] = gv;
  *out = n;
  return CUDA_SUCCESS;
}

// A free node of graph allocation `dptr`, which the graph frees at most once.
CUresult AddFreeNode(Driver& d, Graph* graph, const std::vector<GraphNode*>& deps, CUdeviceptr dptr, GraphNode** out) {
  if (d.graph_vas.count(dptr) == 0) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& n : graph->nodes) {
    if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE && n->free_ptr == dptr) return CUDA_ERROR_INVALID_VALUE;
  }
  GraphNode* n = nullptr;
  if (CUresult r = NewNode(d, graph, CU_GRAPH_NODE_TYPE_MEM_FREE, deps, &n); r != CUDA_SUCCESS) return r;
  n->free_ptr = dptr;
  *out = n;
  return CUDA_SUCCESS;
}

void DestroyGraph(Driver& d, Graph* g) {
  for (const auto& n : g->nodes) d.nodes.erase(n.get());
  if (g->exec != nullptr) g->exec->source = nullptr;
  d.graphs.erase(g);
  delete g;
}

Graph* FindGraph(const Driver& d, CUgraph h) {
  auto* g = reinterpret_cast<Graph*>(h);
  return d.graphs.count(g) != 0 ? g : nullptr;
}

GraphNode* FindNode(const Driver& d, CUgraphNode h) {
  auto* n = reinterpret_cast<GraphNode*>(h);
  return d.nodes.count(n) != 0 ? n : nullptr;
}

// The capture `stream` is in (per_thread: a _ptsz entry point), or nullptr.
Capture* FindCapture(Driver& d, CUstream stream, bool per_thread) {
  const uintptr_t key = StreamKey(stream, per_thread);
  if (key == 0) return nullptr;
  auto it = d.captures.find(key);
  return it == d.captures.end() ? nullptr : &it->second;
}

// Adds a node of `type` to a capture, after its newest node.
CUresult CaptureNode(Driver& d, Capture& c, CUgraphNodeType type, GraphNode** out) {
  std::vector<GraphNode*> deps;
  if (c.last != nullptr) deps.push_back(c.last);
  GraphNode* n = nullptr;
  if (CUresult r = NewNode(d, c.graph, type, deps, &n); r != CUDA_SUCCESS) return r;
  c.last = n;
  if (out != nullptr) *out = n;
  return CUDA_SUCCESS;
}

// Stream-ordered allocation of `bytesize` on `stream` from `pool_handle` (nullptr: the current
// pool of the stream's device). While the stream captures, an alloc node instead, whose address
// is returned.
CUresult AllocAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool_handle, CUstream stream, bool per_thread) {
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  const Ctx* ctx = nullptr;
  if (CUresult r = StreamCtx(stream, &ctx); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> guard(d->mu);
  if (!LiveCtx(*d, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  Pool* pool = pool_handle != nullptr ? FindPool(*d, pool_handle) : CurrentPool(*d, ctx->dev);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (Capture* c = FindCapture(*d, stream, per_thread); c != nullptr) {
    if (c->status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    CUDA_MEM_ALLOC_NODE_PARAMS p{};
    p.poolProps = pool->props;
    p.poolProps.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    p.bytesize = bytesize;
    std::vector<GraphNode*> deps;
    if (c->last != nullptr) deps.push_back(c->last);
    GraphNode* n = nullptr;
    if (CUresult r = AddAllocNode(*d, c->graph, deps, &p, &n); r != CUDA_SUCCESS) return r;
    c->last = n;
    *dptr = p.dptr;
    return CUDA_SUCCESS;
  }
  const uint64_t bytes = RoundUp(bytesize, kPoolAlign);
  uint64_t va = 0;
  if (!PeekVa(*d, bytes, kPoolAlign, false, &va)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (CUresult r = PoolTake(*d, *pool, bytes); r != CUDA_SUCCESS) return r;
  CommitVa(*d, va, bytes, false);
  Alloc a;
  a.gpu = pool->gpu;
  a.bytes = bytes;
  a.ctx = ctx;
  a.kind = Kind::kPool;
  a.pool = pool;
  d->allocs[va] = a;
  *dptr = va;
  return CUDA_SUCCESS;
}

// Stream-ordered free: memory goes back to its pool (or graph memory); while the stream
// captures, a free node instead ("During stream capture, this function results in the creation
// of a free node and must therefore be passed the address of a graph allocation", cuMemFreeAsync).
CUresult FreeAsync(CUdeviceptr dptr, CUstream stream, bool per_thread) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  if (Capture* c = FindCapture(*d, stream, per_thread); c != nullptr) {
    if (c->status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    std::vector<GraphNode*> deps;
    if (c->last != nullptr) deps.push_back(c->last);
    GraphNode* n = nullptr;
    if (CUresult r = AddFreeNode(*d, c->graph, deps, dptr, &n); r != CUDA_SUCCESS) return r;
    c->last = n;
    return CUDA_SUCCESS;
  }
  return FreePtr(*d, dptr);
}

}  // namespace
}  // namespace kgpu::simcuda

// ---------------------------------------------------------------- stream-ordered allocation
CU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return AllocAsync(dptr, bytesize, nullptr, hStream, false);
}
CU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return AllocAsync(dptr, bytesize, nullptr, hStream, true);
}
// From `pool`, whatever the stream's device.
CU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AllocAsync(dptr, bytesize, pool, hStream, false);
}
CU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AllocAsync(dptr, bytesize, pool, hStream, true);
}
CU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return FreeAsync(dptr, hStream, false);
}
CU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return FreeAsync(dptr, hStream, true);
}

// ---------------------------------------------------------------- memory pools
// The device's default pool ("A device's default memory pool cannot be destroyed").
CU_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> guard(d->mu);
  *pool = reinterpret_cast<CUmemoryPool>(DefaultPool(*d, dev));
  return CUDA_SUCCESS;
}

// The device's current pool: the one cuMemAllocAsync takes from (the default pool until
// cuDeviceSetMemPool).
CU_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> guard(d->mu);
  *pool = reinterpret_cast<CUmemoryPool>(CurrentPool(*d, dev));
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (!ValidDev(*d, dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> guard(d->mu);
  Pool* p = FindPool(*d, pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p->dev != dev) return CUDA_ERROR_INVALID_DEVICE;
  d->current_pool[dev] = p;
  return CUDA_SUCCESS;
}

// A pool of pinned device memory on poolProps->location (a device). Pools that allocations could
// be exported from (handleTypes other than NONE) are not modelled: CUDA_ERROR_NOT_SUPPORTED.
CU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (pool == nullptr || poolProps == nullptr || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidDev(*d, poolProps->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  if (poolProps->handleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> guard(d->mu);
  auto p = std::make_unique<Pool>();
  p->dev = poolProps->location.id;
  p->gpu = d->visible[static_cast<size_t>(p->dev)];
  p->props = *poolProps;
  *pool = reinterpret_cast<CUmemoryPool>(p.get());
  d->pools.push_back(std::move(p));
  return CUDA_SUCCESS;
}

// "If any pointers obtained from this pool haven't been freed or the pool has free operations
// that haven't completed when cuMemPoolDestroy is invoked, the function will return immediately
// and the resources associated with the pool will be released automatically once there are no
// more outstanding allocations. Destroying the current mempool of a device sets the default
// mempool of that device as the current mempool for that device." Until then the pool keeps
// only what its allocations use.
CU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  Pool* p = FindPool(*d, pool);
  if (p == nullptr || p->is_default) return CUDA_ERROR_INVALID_VALUE;
  if (d->current_pool[p->dev] == p) d->current_pool[p->dev] = DefaultPool(*d, p->dev);
  if (p->used > 0) {
    p->destroyed = true;
    PoolRelease(*d, *p, 0);
  } else {
    DeletePool(*d, p);
  }
  return CUDA_SUCCESS;
}

// Release threshold and reuse flags settable; the high watermarks may be reset (to the current
// figure) by setting 0: "It is illegal to set this attribute to a non-zero value".
CU_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  Pool* p = FindPool(*d, pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto v64 = [value] { return *static_cast<const cuuint64_t*>(value); };
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *static_cast<const int*>(value) != 0 ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      p->threshold = v64();
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (v64() != 0) return CUDA_ERROR_INVALID_VALUE;
      p->reserved_high = p->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (v64() != 0) return CUDA_ERROR_INVALID_VALUE;
      p->used_high = p->used;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      break;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CU_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  const Pool* p = FindPool(*d, pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* v64 = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *v64 = p->threshold;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *v64 = p->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      *v64 = p->reserved_high;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *v64 = p->used;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *v64 = p->used_high;
      return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// "Releases memory back to the OS until the pool contains fewer than minBytesToKeep reserved
// bytes, or there is no more memory that the allocator can safely release": down to
// max(used, minBytesToKeep), in whole granules.
CU_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  Pool* p = FindPool(*d, pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  PoolRelease(*d, *p, minBytesToKeep);
  return CUDA_SUCCESS;
}

// After a synchronisation: "When more than the release threshold bytes of memory are held by the
// memory pool, the allocator will try to release memory back to the OS on the next call to
// stream, event or context synchronize" (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, default 0). Every
// pool of the synchronised context's device keeps max(used, threshold); a threshold of
// UINT64_MAX keeps everything.
void kgpu::simcuda::OnSynchronize(CUstream stream, bool whole_context) {
  Driver* d = Drv();
  if (d == nullptr) return;
  const Ctx* c = nullptr;
  if (whole_context || StreamCtx(stream, &c) != CUDA_SUCCESS) c = t_current;
  std::lock_guard<std::mutex> guard(d->mu);
  if (!LiveCtx(*d, c)) return;
  TrimPools(*d, c->dev, false);
}

// ---------------------------------------------------------------- arrays
namespace kgpu::simcuda {
namespace {
// An array object (plain or mipmapped: `kind`) of `bytes`, rounded and charged; its handle in
// *handle.
CUresult NewArr(uint64_t bytes, Kind kind, void** handle) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  unsigned gpu = 0;
  const Ctx* ctx = nullptr;
  if (CUresult r = CurrentGpu(*d, &gpu, &ctx); r != CUDA_SUCCESS) return r;
  const uint64_t charged = RoundUp(bytes, kGranule);
  std::lock_guard<std::mutex> guard(d->mu);
  if (CUresult r = Charge(*d, gpu, charged); r != CUDA_SUCCESS) return r;
  auto* a = new Arr;
  Alloc rec;
  rec.gpu = gpu;
  rec.bytes = charged;
  rec.ctx = ctx;
  rec.kind = kind;
  d->allocs[reinterpret_cast<uint64_t>(a)] = rec;
  *handle = a;
  return CUDA_SUCCESS;
}

// Frees an array object made by NewArr with the same `kind`.
CUresult DeleteArr(void* handle, Kind kind) {
  if (handle == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  auto it = d->allocs.find(reinterpret_cast<uint64_t>(handle));
  if (it == d->allocs.end() || it->second.kind != kind) return CUDA_ERROR_INVALID_HANDLE;
  FreeAlloc(*d, it);
  return CUDA_SUCCESS;
}
}  // namespace
}  // namespace kgpu::simcuda

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
  const CUresult r = AllocDevice(pitch * Height, true, false, &p);
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

// ---------------------------------------------------------------- virtual memory management
namespace kgpu::simcuda {
namespace {

// Physical memory whose last reference and last mapping are gone: "The memory allocation will
// be freed when all outstanding mappings to the memory are unmapped and when all outstanding
// references to the handle (including it's shareable counterparts) are also released"
// (cuMemRelease). Memory shared with other processes goes when none of them holds it either
// (SettleSlot).
void DropPhys(Driver& d, std::unordered_map<uint64_t, Phys>::iterator it) {
  const Phys p = it->second;
  d.phys.erase(it);
  if (p.shared_id == 0) {
    Uncharge(d, p.gpu, p.size);
    return;
  }
  Node::Locked nl(*d.node);
  SharedSlot* s = FindSlot(d, p.shared_id);
  if (s == nullptr) return;
  RemoveHolder(*s, SelfPid());
  SettleSlot(d, nl, *s, 0);
}

void MaybeDropPhys(Driver& d, CUmemGenericAllocationHandle h) {
  auto it = d.phys.find(h);
  if (it != d.phys.end() && it->second.refs <= 0 && it->second.maps <= 0) DropPhys(d, it);
}

// The mapping that holds `addr`, or mappings.end().
std::map<uint64_t, Mapping>::iterator FindMapping(Driver& d, uint64_t addr) {
  auto it = d.mappings.upper_bound(addr);
  if (it == d.mappings.begin()) return d.mappings.end();
  --it;
  return addr - it->first < it->second.size ? it : d.mappings.end();
}

// The mappings that make up exactly [ptr, ptr + size) (whole mappings, back to back): the range
// [first, last). False when the range is not such.
bool MappedRange(Driver& d, uint64_t ptr, uint64_t size, std::map<uint64_t, Mapping>::iterator* first,
                 std::map<uint64_t, Mapping>::iterator* last) {
  auto it = d.mappings.find(ptr);
  if (it == d.mappings.end() || size == 0 || ptr + size < ptr) return false;
  *first = it;
  uint64_t at = ptr;
  while (at < ptr + size) {
    if (it == d.mappings.end() || it->first != at) return false;
    at += it->second.size;
    ++it;
  }
  *last = it;
  return at == ptr + size;
}

bool Overlaps(const std::map<uint64_t, uint64_t>& ranges, uint64_t base, uint64_t size) {
  auto it = ranges.lower_bound(base);
  if (it != ranges.end() && it->first < base + size) return true;
  if (it == ranges.begin()) return false;
  --it;
  return it->first + it->second > base;
}

}  // namespace
}  // namespace kgpu::simcuda

// 2 MiB, the minimum and the recommended granularity of device memory.
CU_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                                 CUmemAllocationGranularity_flags option) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (granularity == nullptr || prop == nullptr ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidDev(*d, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  *granularity = kGranule;
  return CUDA_SUCCESS;
}

// Physical memory of the virtual memory management API: pinned device memory on the device of
// prop->location, `size` a multiple of the 2 MiB granularity (else CUDA_ERROR_INVALID_VALUE, as
// the real driver); not tied to a context. Exportable as a POSIX file descriptor when asked;
// the other handle types are not modelled (CUDA_ERROR_NOT_SUPPORTED).
CU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                               unsigned long long flags) {
  if (handle == nullptr || prop == nullptr || size == 0 || size % kGranule != 0 || flags != 0 ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (!ValidDev(*d, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  if ((static_cast<unsigned>(prop->requestedHandleTypes) & ~unsigned{CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR}) != 0) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  std::lock_guard<std::mutex> guard(d->mu);
  const unsigned gpu = d->visible[static_cast<size_t>(prop->location.id)];
  if (CUresult r = Charge(*d, gpu, size); r != CUDA_SUCCESS) return r;
  Phys p;
  p.gpu = gpu;
  p.dev = prop->location.id;
  p.size = size;
  p.refs = 1;
  p.prop = *prop;
  const uint64_t h = d->next_vmm++;
  d->phys[h] = p;
  *handle = h;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  auto it = d->phys.find(handle);
  if (it == d->phys.end() || it->second.refs <= 0) return CUDA_ERROR_INVALID_HANDLE;
  --it->second.refs;
  MaybeDropPhys(*d, handle);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                          CUmemGenericAllocationHandle handle) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  auto it = d->phys.find(handle);
  if (it == d->phys.end() || it->second.refs <= 0) return CUDA_ERROR_INVALID_VALUE;
  *prop = it->second.prop;
  return CUDA_SUCCESS;
}

// A private range of `size` (a multiple of the granularity) aligned to `alignment` (a power of
// two; 0: the granularity). A non-zero `addr` is a hint, taken when it is free.
CU_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                       unsigned long long flags) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (ptr == nullptr || size == 0 || size % kGranule != 0 || flags != 0 || (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t align = std::max<uint64_t>(alignment, kGranule);
  std::lock_guard<std::mutex> guard(d->mu);
  uint64_t base = 0;
  if (addr != 0 && addr % align == 0 && addr >= kResvBase && addr < kResvEnd && size <= kResvEnd - addr &&
      !Overlaps(d->reservations, addr, size)) {
    base = addr;
  } else {
    base = RoundUp(d->next_resv, align);
    while (base < kResvEnd && size <= kResvEnd - base && Overlaps(d->reservations, base, size)) {
      base = RoundUp(base + kGranule, align);
    }
    if (base >= kResvEnd || size > kResvEnd - base) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  d->next_resv = std::max(d->next_resv, base + size);
  d->reservations[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

// Frees a reservation: `ptr` and `size` as cuMemAddressReserve gave them. A range still mapped is
// refused (CUDA_ERROR_INVALID_VALUE): its memory could then never be unmapped.
CU_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  auto it = d->reservations.find(ptr);
  if (it == d->reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  auto m = d->mappings.lower_bound(ptr);
  if (m != d->mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  d->reservations.erase(it);
  return CUDA_SUCCESS;
}

// Maps `size` bytes of `handle` from `offset` (both multiples of the granularity) at `ptr`, inside
// one reservation and over no other mapping. A mapping keeps the memory alive on its own.
CU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (size == 0 || size % kGranule != 0 || offset % kGranule != 0 || ptr % kGranule != 0 || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> guard(d->mu);
  auto p = d->phys.find(handle);
  if (p == d->phys.end() || p->second.refs <= 0) return CUDA_ERROR_INVALID_HANDLE;
  if (offset > p->second.size || size > p->second.size - offset) return CUDA_ERROR_INVALID_VALUE;
  auto r = d->reservations.upper_bound(ptr);
  if (r == d->reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --r;
  if (ptr - r->first >= r->second || size > r->second - (ptr - r->first)) return CUDA_ERROR_INVALID_VALUE;
  auto m = d->mappings.lower_bound(ptr);
  if (m != d->mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (m != d->mappings.begin() && std::prev(m)->first + std::prev(m)->second.size > ptr)
    return CUDA_ERROR_INVALID_VALUE;
  Mapping mapping;
  mapping.size = size;
  mapping.handle = handle;
  d->mappings[ptr] = mapping;
  ++p->second.maps;
  return CUDA_SUCCESS;
}

// "The range must be the entire contiguous address range that was mapped to" (one mapping or
// several back to back); memory with no reference and no mapping left goes.
CU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  std::map<uint64_t, Mapping>::iterator first, last;
  if (!MappedRange(*d, ptr, size, &first, &last)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUmemGenericAllocationHandle> handles;
  for (auto it = first; it != last; ++it) handles.push_back(it->second.handle);
  d->mappings.erase(first, last);
  for (CUmemGenericAllocationHandle h : handles) {
    auto p = d->phys.find(h);
    if (p != d->phys.end()) --p->second.maps;
    MaybeDropPhys(*d, h);
  }
  return CUDA_SUCCESS;
}

// Access of devices to whole mappings (recorded, not enforced: nothing reads device memory).
CU_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !ValidAccessFlags(desc[i].flags)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (!ValidDev(*d, desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
  }
  std::lock_guard<std::mutex> guard(d->mu);
  std::map<uint64_t, Mapping>::iterator first, last;
  if (!MappedRange(*d, ptr, size, &first, &last)) return CUDA_ERROR_INVALID_VALUE;
  for (auto it = first; it != last; ++it) {
    for (size_t i = 0; i < count; ++i) {
      auto& acc = it->second.access;
      auto a = std::find_if(acc.begin(), acc.end(), [&](const auto& e) { return e.first == desc[i].location.id; });
      if (a != acc.end()) {
        a->second = desc[i].flags;
      } else {
        acc.emplace_back(desc[i].location.id, desc[i].flags);
      }
    }
  }
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!ValidDev(*d, location->id)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> guard(d->mu);
  auto it = FindMapping(*d, ptr);
  if (it == d->mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  *flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  for (const auto& [dev, f] : it->second.access) {
    if (dev == location->id) *flags = f;
  }
  return CUDA_SUCCESS;
}

// The handle of the memory mapped at `addr` (anywhere in the mapping), with a new reference that
// needs its own cuMemRelease.
CU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  auto it = FindMapping(*d, reinterpret_cast<uint64_t>(addr));
  if (it == d->mappings.end()) return CUDA_ERROR_INVALID_VALUE;
  auto p = d->phys.find(it->second.handle);
  if (p == d->phys.end()) return CUDA_ERROR_INVALID_VALUE;
  ++p->second.refs;
  *handle = it->second.handle;
  return CUDA_SUCCESS;
}

// A POSIX file descriptor for memory made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in its
// requestedHandleTypes: a memfd holding the allocation's node-wide identity (ShareBlob). The
// first export records the allocation in <state>.cuda-shared, owned (and still charged) by this
// process. The descriptor itself holds no reference (the real driver's does): the memory lives
// while some process holds a handle or a mapping of it.
CU_EXPORT CUresult cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType, unsigned long long flags) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard<std::mutex> guard(d->mu);
  auto it = d->phys.find(handle);
  if (it == d->phys.end() || it->second.refs <= 0) return CUDA_ERROR_INVALID_HANDLE;
  Phys& p = it->second;
  if ((static_cast<unsigned>(p.prop.requestedHandleTypes) & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (p.shared_id == 0) {
    Node::Locked nl(*d->node);
    SharedSlot* s = nullptr;
    for (auto& slot : d->shared->slots) {
      if (slot.id == 0) {
        s = &slot;
        break;
      }
    }
    if (s == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;  // the node's table is full
    *s = SharedSlot{};
    s->id = ++d->shared->next_id;
    s->bytes = p.size;
    s->gpu = p.gpu;
    s->owner = SelfPid();
    s->holders[0] = SelfPid();
    p.shared_id = s->id;
  }
  const int fd = memfd_create("kgpu-cuda-vmm", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  ShareBlob b{};
  b.magic = kBlobMagic;
  b.node = d->node_hash;
  b.id = p.shared_id;
  if (pwrite(fd, &b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) {
    close(fd);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

// Imports memory exported by a process of the same node (osHandle: (void*)(uintptr_t)fd). The
// memory is not charged to the importer. Importing it again (or into the exporter) returns the
// same handle with one more reference: "Each time a recipient process imports a shareable handle,
// it needs to pair it with cuMemRelease for the handle to be freed". Memory on a GPU this process
// does not see is CUDA_ERROR_INVALID_DEVICE.
CU_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                                  CUmemAllocationHandleType shHandleType) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  const int fd = static_cast<int>(reinterpret_cast<uintptr_t>(osHandle));
  ShareBlob b{};
  if (fd < 0 || pread(fd, &b, sizeof b, 0) != static_cast<ssize_t>(sizeof b) || b.magic != kBlobMagic ||
      b.node != d->node_hash || b.id == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> guard(d->mu);
  for (auto& [h, existing] : d->phys) {
    if (existing.shared_id == b.id) {
      ++existing.refs;
      *handle = h;
      return CUDA_SUCCESS;
    }
  }
  Phys p;
  {
    Node::Locked nl(*d->node);
    SharedSlot* s = FindSlot(*d, b.id);
    if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;  // released meanwhile
    const int ordinal = OrdinalOf(*d, s->gpu);
    if (ordinal < 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!AddHolder(*s, SelfPid())) return CUDA_ERROR_OUT_OF_MEMORY;
    p.gpu = s->gpu;
    p.dev = ordinal;
    p.size = s->bytes;
  }
  p.refs = 1;
  p.shared_id = b.id;
  p.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.prop.location.id = p.dev;
  const uint64_t h = d->next_vmm++;
  d->phys[h] = p;
  *handle = h;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- stream capture
namespace kgpu::simcuda {
namespace {

// "Capture may not be initiated if stream is CU_STREAM_LEGACY. Capture must be ended on the same
// stream in which it was initiated, and it may only be initiated if the stream is not already in
// capture mode" (cuStreamBeginCapture).
CUresult BeginCapture(CUstream stream, CUstreamCaptureMode mode, bool per_thread) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const Ctx* ctx = nullptr;
  if (CUresult r = StreamCtx(stream, &ctx); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> guard(d->mu);
  const uintptr_t key = StreamKey(stream, per_thread);
  if (key == 0) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (!LiveCtx(*d, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (d->captures.count(key) != 0) return CUDA_ERROR_ILLEGAL_STATE;
  Capture c;
  c.mode = mode;
  c.thread = std::this_thread::get_id();
  c.dev = ctx->dev;
  c.graph = new Graph;
  d->captures[key] = c;
  return CUDA_SUCCESS;
}

// "If capture was invalidated, due to a violation of the rules of stream capture, then a NULL
// graph will be returned"; a capture not in relaxed mode ends on the thread that began it.
CUresult EndCapture(CUstream stream, CUgraph* graph, bool per_thread) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  const uintptr_t key = StreamKey(stream, per_thread);
  auto it = key == 0 ? d->captures.end() : d->captures.find(key);
  if (it == d->captures.end()) return CUDA_ERROR_ILLEGAL_STATE;
  if (it->second.mode != CU_STREAM_CAPTURE_MODE_RELAXED && it->second.thread != std::this_thread::get_id()) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  Graph* g = it->second.graph;
  const bool invalidated = it->second.status != CU_STREAM_CAPTURE_STATUS_ACTIVE;
  d->captures.erase(it);
  if (invalidated) {
    DestroyGraph(*d, g);
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  d->graphs.insert(g);
  *graph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

CUresult IsCapturing(CUstream stream, CUstreamCaptureStatus* status, bool per_thread) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  const Capture* c = FindCapture(*d, stream, per_thread);
  *status = c == nullptr ? CU_STREAM_CAPTURE_STATUS_NONE : c->status;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace kgpu::simcuda

CU_EXPORT CUresult cuStreamBeginCapture(CUstream hStream) {
  return BeginCapture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}
CU_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  return BeginCapture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}
CU_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return BeginCapture(hStream, mode, false);
}
CU_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return BeginCapture(hStream, mode, true);
}
CU_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return EndCapture(hStream, phGraph, false);
}
CU_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return EndCapture(hStream, phGraph, true);
}
CU_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return IsCapturing(hStream, captureStatus, false);
}
CU_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return IsCapturing(hStream, captureStatus, true);
}

CUstreamCaptureStatus kgpu::simcuda::StreamCaptureStatus(CUstream stream, bool per_thread) {
  CUstreamCaptureStatus s = CU_STREAM_CAPTURE_STATUS_NONE;
  IsCapturing(stream, &s, per_thread);
  return s;
}

bool kgpu::simcuda::CaptureKernelNode(CUstream stream, bool per_thread) {
  Driver* d = Drv();
  if (d == nullptr) return false;
  std::lock_guard<std::mutex> guard(d->mu);
  Capture* c = FindCapture(*d, stream, per_thread);
  if (c == nullptr) return false;
  if (c->status == CU_STREAM_CAPTURE_STATUS_ACTIVE &&
      CaptureNode(*d, *c, CU_GRAPH_NODE_TYPE_KERNEL, nullptr) != CUDA_SUCCESS) {
    c->status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  }
  return true;
}

void kgpu::simcuda::OnStreamDestroy(CUstream stream) {
  Driver* d = Drv();
  if (d == nullptr || stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return;
  std::lock_guard<std::mutex> guard(d->mu);
  auto it = d->captures.find(reinterpret_cast<uintptr_t>(stream));
  if (it == d->captures.end()) return;
  DestroyGraph(*d, it->second.graph);
  d->captures.erase(it);
}

// ---------------------------------------------------------------- graphs
CU_EXPORT CUresult cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  auto* g = new Graph;
  d->graphs.insert(g);
  *phGraph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

// Allocations its launches made stay until freed (they are the application's).
CU_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  Graph* g = FindGraph(*d, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  DestroyGraph(*d, g);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                          size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (phGraphNode == nullptr || nodeParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  Graph* g = FindGraph(*d, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<GraphNode*> deps;
  if (CUresult r = NodeDeps(*d, dependencies, numDependencies, &deps); r != CUDA_SUCCESS) return r;
  GraphNode* n = nullptr;
  if (CUresult r = AddAllocNode(*d, g, deps, nodeParams, &n); r != CUDA_SUCCESS) return r;
  *phGraphNode = reinterpret_cast<CUgraphNode>(n);
  return CUDA_SUCCESS;
}

// `dptr`: the address of a graph allocation (an alloc node's, of this graph or another).
CU_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode* phGraphNode, CUgraph hGraph, const CUgraphNode* dependencies,
                                         size_t numDependencies, CUdeviceptr dptr) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (phGraphNode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  Graph* g = FindGraph(*d, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<GraphNode*> deps;
  if (CUresult r = NodeDeps(*d, dependencies, numDependencies, &deps); r != CUDA_SUCCESS) return r;
  GraphNode* n = nullptr;
  if (CUresult r = AddFreeNode(*d, g, deps, dptr, &n); r != CUDA_SUCCESS) return r;
  *phGraphNode = reinterpret_cast<CUgraphNode>(n);
  return CUDA_SUCCESS;
}

// "If numNodes is larger than the number of nodes, the remaining entries in nodes will be set to
// NULL, and the number of nodes actually obtained will be returned in numNodes."
CU_EXPORT CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  const Graph* g = FindGraph(*d, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (nodes == nullptr) {
    *numNodes = g->nodes.size();
    return CUDA_SUCCESS;
  }
  const size_t n = std::min(*numNodes, g->nodes.size());
  for (size_t i = 0; i < *numNodes; ++i) {
    nodes[i] = i < n ? reinterpret_cast<CUgraphNode>(g->nodes[i].get()) : nullptr;
  }
  *numNodes = n;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType* type) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  const GraphNode* n = FindNode(*d, hNode);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *type = n->type;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS* params_out) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (params_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  const GraphNode* n = FindNode(*d, hNode);
  if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
  *params_out = n->params;
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr* dptr_out) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (dptr_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  const GraphNode* n = FindNode(*d, hNode);
  if (n == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEM_FREE) return CUDA_ERROR_INVALID_VALUE;
  *dptr_out = n->free_ptr;
  return CUDA_SUCCESS;
}

namespace kgpu::simcuda {
namespace {

// "If hGraph contains any allocation or free nodes, there can be at most one executable graph in
// existence for that graph at a time" (cuGraphInstantiateWithFlags; a second one is
// CUDA_ERROR_INVALID_VALUE here). The executable graph copies the memory nodes.
CUresult Instantiate(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  constexpr unsigned long long kKnown = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                        CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                        CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  const bool auto_free = (flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0;
  if (phGraphExec == nullptr || (flags & ~kKnown) != 0 ||
      (auto_free && (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) != 0)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> guard(d->mu);
  Graph* g = FindGraph(*d, hGraph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto e = std::make_unique<GraphExec>();
  for (const auto& n : g->nodes) {
    ExecItem item;
    if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      item.alloc = true;
      item.va = n->params.dptr;
      item.bytes = n->bytes;
      item.dev = n->dev;
    } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
      item.va = n->free_ptr;
      const GraphVa& gv = d->graph_vas[n->free_ptr];
      item.bytes = gv.bytes;
      item.dev = gv.dev;
    } else {
      continue;  // (kernel and other nodes are not run)
    }
    e->items.push_back(item);
  }
  e->mem_nodes = !e->items.empty();
  e->auto_free = auto_free;
  if (e->mem_nodes) {
    if (g->exec != nullptr) return CUDA_ERROR_INVALID_VALUE;
    e->source = g;
    g->exec = e.get();
  }
  GraphExec* raw = e.release();
  d->execs.insert(raw);
  *phGraphExec = reinterpret_cast<CUgraphExec>(raw);
  return CUDA_SUCCESS;
}

// A launch runs the memory nodes in order: each alloc node's bytes come from its device's graph
// memory (reserved in granules beyond what is reserved and unused), each free node gives its
// allocation back (reserved stays: cuDeviceGraphMemTrim). "If any allocations created by
// hGraphExec remain unfreed (from a previous launch) and hGraphExec was not instantiated with
// CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, the launch will fail with
// CUDA_ERROR_INVALID_VALUE" (cuGraphLaunch). A launch into a capturing stream (a child graph
// node in CUDA) is not modelled: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
CUresult Launch(CUgraphExec hGraphExec, CUstream stream, bool per_thread) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  const Ctx* ctx = nullptr;
  if (CUresult r = StreamCtx(stream, &ctx); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> guard(d->mu);
  if (!LiveCtx(*d, ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  auto* e = reinterpret_cast<GraphExec*>(hGraphExec);
  if (d->execs.count(e) == 0) return CUDA_ERROR_INVALID_VALUE;
  if (FindCapture(*d, stream, per_thread) != nullptr) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  const auto live = [d](uint64_t va) {
    auto it = d->allocs.find(va);
    return it != d->allocs.end() && it->second.kind == Kind::kGraph ? it : d->allocs.end();
  };
  std::unordered_set<uint64_t> mine;
  for (const ExecItem& item : e->items) {
    if (!item.alloc) continue;
    mine.insert(item.va);
    if (live(item.va) != d->allocs.end() && !e->auto_free) return CUDA_ERROR_INVALID_VALUE;
  }
  for (const ExecItem& item : e->items) {
    if (!item.alloc && mine.count(item.va) == 0 && live(item.va) == d->allocs.end()) return CUDA_ERROR_INVALID_VALUE;
  }
  for (const ExecItem& item : e->items) {  // (auto-free: as though cuMemFreeAsync ran first)
    if (auto it = live(item.va); item.alloc && it != d->allocs.end()) FreeAlloc(*d, it);
  }
  // What each device's graph memory must reserve at the launch's peak.
  uint64_t used[kMaxGpus], peak[kMaxGpus];
  for (unsigned i = 0; i < kMaxGpus; ++i) used[i] = peak[i] = d->graph_mem[i].used;
  for (const ExecItem& item : e->items) {
    uint64_t& u = used[item.dev];
    u = item.alloc ? u + item.bytes : u - std::min(u, item.bytes);
    peak[item.dev] = std::max(peak[item.dev], u);
  }
  uint64_t grow[kMaxGpus] = {};
  for (unsigned i = 0; i < kMaxGpus && i < d->visible.size(); ++i) {
    if (peak[i] <= d->graph_mem[i].reserved) continue;
    grow[i] = RoundUp(peak[i] - d->graph_mem[i].reserved, kGranule);
    if (Charge(*d, d->visible[i], grow[i]) != CUDA_SUCCESS) {
      for (unsigned j = 0; j < i; ++j) {
        if (grow[j] > 0) Uncharge(*d, d->visible[j], grow[j]);
      }
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  for (unsigned i = 0; i < kMaxGpus && i < d->visible.size(); ++i) {
    GraphMem& m = d->graph_mem[i];
    m.reserved += grow[i];
    m.reserved_high = std::max(m.reserved_high, m.reserved);
  }
  for (const ExecItem& item : e->items) {
    GraphMem& m = d->graph_mem[item.dev];
    if (item.alloc) {
      Alloc a;
      a.gpu = d->visible[static_cast<size_t>(item.dev)];
      a.bytes = item.bytes;
      a.kind = Kind::kGraph;
      a.dev = item.dev;
      d->allocs[item.va] = a;
      m.used += item.bytes;
      m.used_high = std::max(m.used_high, m.used);
    } else if (auto it = live(item.va); it != d->allocs.end()) {
      FreeAlloc(*d, it);
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace kgpu::simcuda

CU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
  return Instantiate(phGraphExec, hGraph, flags);
}

CU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode,
                                         char* logBuffer, size_t bufferSize) {
  const CUresult r = Instantiate(phGraphExec, hGraph, 0);
  if (phErrorNode != nullptr) *phErrorNode = nullptr;
  if (logBuffer != nullptr && bufferSize > 0) logBuffer[0] = '\0';
  return r;
}

CU_EXPORT CUresult cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph, CUgraphNode* phErrorNode,
                                      char* logBuffer, size_t bufferSize) {
  return cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

// CUDA 12.0; CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD is accepted (an upload has nothing to do here).
CU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  if (instantiateParams == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = Instantiate(phGraphExec, hGraph, instantiateParams->flags & ~CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
  instantiateParams->hErrNode_out = nullptr;
  instantiateParams->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}
CU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                     CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams) {
  return cuGraphInstantiateWithParams(phGraphExec, hGraph, instantiateParams);
}

CU_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return Launch(hGraphExec, hStream, false);
}
CU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return Launch(hGraphExec, hStream, true);
}

// Allocations its launches made stay until freed.
CU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  std::lock_guard<std::mutex> guard(d->mu);
  auto* e = reinterpret_cast<GraphExec*>(hGraphExec);
  if (d->execs.count(e) == 0) return CUDA_ERROR_INVALID_VALUE;
  if (e->source != nullptr) e->source->exec = nullptr;
  d->execs.erase(e);
  delete e;
  return CUDA_SUCCESS;
}

// "Free unused memory that was cached on the specified device for use with graphs back to the
// OS. Blocks which are not in use by a graph that is either currently executing or scheduled to
// execute are freed back to the operating system": reserved down to used, in whole granules.
CU_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (!ValidDev(*d, device)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> guard(d->mu);
  GraphMem& m = d->graph_mem[device];
  const uint64_t kept = RoundUp(m.used, kGranule);
  if (kept < m.reserved) {
    Uncharge(*d, d->visible[static_cast<size_t>(device)], m.reserved - kept);
    m.reserved = kept;
  }
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, device)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> guard(d->mu);
  const GraphMem& m = d->graph_mem[device];
  auto* v = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
      *v = m.used;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
      *v = m.used_high;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
      *v = m.reserved;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
      *v = m.reserved_high;
      return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// Only the high watermarks, and only to 0 ("High watermark can only be reset to zero"): they
// restart from the current figure.
CU_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  Driver* d = Drv();
  if (d == nullptr) return g_init_result;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDev(*d, device)) return CUDA_ERROR_INVALID_DEVICE;
  if (*static_cast<const cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> guard(d->mu);
  GraphMem& m = d->graph_mem[device];
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
      m.used_high = m.used;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
      m.reserved_high = m.reserved;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
      break;
  }
  return CUDA_ERROR_INVALID_VALUE;
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
    // virtual memory management (CUDA 10.2; cuMemRetainAllocationHandle 11.0)
    KGPU_PROC("cuMemGetAllocationGranularity", 10020, false, cuMemGetAllocationGranularity),
    KGPU_PROC("cuMemAddressReserve", 10020, false, cuMemAddressReserve),
    KGPU_PROC("cuMemAddressFree", 10020, false, cuMemAddressFree),
    KGPU_PROC("cuMemMap", 10020, false, cuMemMap),
    KGPU_PROC("cuMemUnmap", 10020, false, cuMemUnmap),
    KGPU_PROC("cuMemSetAccess", 10020, false, cuMemSetAccess),
    KGPU_PROC("cuMemGetAccess", 10020, false, cuMemGetAccess),
    KGPU_PROC("cuMemGetAllocationPropertiesFromHandle", 10020, false, cuMemGetAllocationPropertiesFromHandle),
    KGPU_PROC("cuMemExportToShareableHandle", 10020, false, cuMemExportToShareableHandle),
    KGPU_PROC("cuMemImportFromShareableHandle", 10020, false, cuMemImportFromShareableHandle),
    KGPU_PROC("cuMemRetainAllocationHandle", 11000, false, cuMemRetainAllocationHandle),
    // memory pools (CUDA 11.2)
    KGPU_PROC("cuMemPoolCreate", 11020, false, cuMemPoolCreate),
    KGPU_PROC("cuMemPoolDestroy", 11020, false, cuMemPoolDestroy),
    KGPU_PROC("cuMemPoolSetAttribute", 11020, false, cuMemPoolSetAttribute),
    KGPU_PROC("cuMemPoolGetAttribute", 11020, false, cuMemPoolGetAttribute),
    KGPU_PROC("cuMemPoolTrimTo", 11020, false, cuMemPoolTrimTo),
    KGPU_PROC("cuDeviceGetMemPool", 11020, false, cuDeviceGetMemPool),
    KGPU_PROC("cuDeviceSetMemPool", 11020, false, cuDeviceSetMemPool),
    // stream capture (CUDA 10.0; the capture mode 10.1) and graphs (memory nodes 11.4)
    KGPU_PROC("cuStreamBeginCapture", 10000, false, cuStreamBeginCapture),
    KGPU_PROC("cuStreamBeginCapture", 10000, true, cuStreamBeginCapture_ptsz),
    KGPU_PROC("cuStreamBeginCapture", 10010, false, cuStreamBeginCapture_v2),
    KGPU_PROC("cuStreamBeginCapture", 10010, true, cuStreamBeginCapture_v2_ptsz),
    KGPU_PROC("cuStreamEndCapture", 10000, false, cuStreamEndCapture),
    KGPU_PROC("cuStreamEndCapture", 10000, true, cuStreamEndCapture_ptsz),
    KGPU_PROC("cuStreamIsCapturing", 10000, false, cuStreamIsCapturing),
    KGPU_PROC("cuStreamIsCapturing", 10000, true, cuStreamIsCapturing_ptsz),
    KGPU_PROC("cuGraphCreate", 10000, false, cuGraphCreate),
    KGPU_PROC("cuGraphDestroy", 10000, false, cuGraphDestroy),
    KGPU_PROC("cuGraphGetNodes", 10000, false, cuGraphGetNodes),
    KGPU_PROC("cuGraphNodeGetType", 10000, false, cuGraphNodeGetType),
    KGPU_PROC("cuGraphAddMemAllocNode", 11040, false, cuGraphAddMemAllocNode),
    KGPU_PROC("cuGraphAddMemFreeNode", 11040, false, cuGraphAddMemFreeNode),
    KGPU_PROC("cuGraphMemAllocNodeGetParams", 11040, false, cuGraphMemAllocNodeGetParams),
    KGPU_PROC("cuGraphMemFreeNodeGetParams", 11040, false, cuGraphMemFreeNodeGetParams),
    KGPU_PROC("cuGraphInstantiate", 10000, false, cuGraphInstantiate),
    KGPU_PROC("cuGraphInstantiate", 11000, false, cuGraphInstantiate_v2),
    KGPU_PROC("cuGraphInstantiate", 12000, false, cuGraphInstantiateWithFlags),
    KGPU_PROC("cuGraphInstantiateWithFlags", 11040, false, cuGraphInstantiateWithFlags),
    KGPU_PROC("cuGraphInstantiateWithParams", 12000, false, cuGraphInstantiateWithParams),
    KGPU_PROC("cuGraphInstantiateWithParams", 12000, true, cuGraphInstantiateWithParams_ptsz),
    KGPU_PROC("cuGraphLaunch", 10000, false, cuGraphLaunch),
    KGPU_PROC("cuGraphLaunch", 10000, true, cuGraphLaunch_ptsz),
    KGPU_PROC("cuGraphExecDestroy", 10000, false, cuGraphExecDestroy),
    KGPU_PROC("cuDeviceGraphMemTrim", 11040, false, cuDeviceGraphMemTrim),
    KGPU_PROC("cuDeviceGetGraphMemAttribute", 11040, false, cuDeviceGetGraphMemAttribute),
    KGPU_PROC("cuDeviceSetGraphMemAttribute", 11040, false, cuDeviceSetGraphMemAttribute),
    // context limits and stack, device attributes, a stream's context and device
    KGPU_PROC("cuCtxSetLimit", 3010, false, cuCtxSetLimit),
    KGPU_PROC("cuCtxGetLimit", 3010, false, cuCtxGetLimit),
    KGPU_PROC("cuCtxPushCurrent", 4000, false, cuCtxPushCurrent_v2),
    KGPU_PROC("cuCtxPopCurrent", 4000, false, cuCtxPopCurrent_v2),
    KGPU_PROC("cuDeviceGetAttribute", 2000, false, cuDeviceGetAttribute),
    KGPU_PROC("cuStreamGetCtx", 9020, false, cuStreamGetCtx),
    KGPU_PROC("cuStreamGetCtx", 9020, true, cuStreamGetCtx_ptsz),
    KGPU_PROC("cuStreamGetDevice", 12080, false, cuStreamGetDevice),
    KGPU_PROC("cuStreamGetDevice", 12080, true, cuStreamGetDevice_ptsz),
    // modules, kernels, streams and synchronisation: simcuda/exec_impl.cc
    KGPU_PROC("cuModuleLoadData", 2000, false, cuModuleLoadData),
    KGPU_PROC("cuModuleGetFunction", 2000, false, cuModuleGetFunction),
    KGPU_PROC("cuModuleUnload", 2000, false, cuModuleUnload),
    KGPU_PROC("cuLaunchKernel", 4000, false, cuLaunchKernel),
    KGPU_PROC("cuLaunchKernel", 7000, true, cuLaunchKernel_ptsz),
    KGPU_PROC("cuStreamCreate", 2000, false, cuStreamCreate),
    KGPU_PROC("cuStreamDestroy", 4000, false, cuStreamDestroy_v2),
    KGPU_PROC("cuStreamQuery", 2000, false, cuStreamQuery),
    KGPU_PROC("cuStreamQuery", 7000, true, cuStreamQuery_ptsz),
    KGPU_PROC("cuStreamSynchronize", 2000, false, cuStreamSynchronize),
    KGPU_PROC("cuStreamSynchronize", 7000, true, cuStreamSynchronize_ptsz),
    KGPU_PROC("cuCtxSynchronize", 2000, false, cuCtxSynchronize),
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
