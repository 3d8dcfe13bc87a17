// The simulated CUDA driver's execution part (libcuda.so.1 with cuda_impl.cc): modules, kernel
// launches, streams and synchronisation, on a timeline kept in the simulated node's shared state
// (simnvml/node.h, SimExec) so that the simulated NVML reports the GPU and per-process
// utilisation the kernels cause. No kernel code runs: a kernel is a span of time. What it models:
//  - Modules: cuModuleLoadData makes a module of any non-null image in the current context;
//    cuModuleGetFunction gives a function handle of that module for any name (the same handle for
//    the same name); cuModuleUnload invalidates the module and its functions.
//  - Kernel duration: duration_ns = (gx*gy*gz) * (bx*by*bz) * KGPU_SIM_CUDA_KERNEL_PS_PER_THREAD
//    / 1000 (a knob of the simulator: picoseconds per thread, 0 to 10^12, default 1000, i.e. 1 ns
//    per thread; read once, at the first call of this part; any other value fails every call of
//    this part with CUDA_ERROR_INVALID_VALUE, with a message on stderr). A 1000x1000-thread launch (grid
//    (1000,1,1), block (1000,1,1)) runs 1 ms; 1024x1024 threads run 1.048576 ms. cuLaunchKernel
//    invokes f on a gridDimX x gridDimY x gridDimZ grid of blocks of blockDimX x blockDimY x
//    blockDimZ threads (CUDA Driver API reference, cuLaunchKernel); a zero dimension, a block
//    beyond the device's limits (x, y <= 1024, z <= 64, at most 1024 threads, as on every GPU
//    since compute capability 2.0) or a grid beyond them (x < 2^31, y, z <= 65535), or both
//    kernelParams and extra given, is CUDA_ERROR_INVALID_VALUE. The parameters are not read.
//  - One GPU executes one kernel at a time (time-slicing between processes and streams, as a GPU
//    without MPS does). Each GPU's SimExec has busy_until_ns (CLOCK_MONOTONIC): a launch at time
//    `now` on stream s starts at max(now, busy_until, the end of s's last kernel) and ends
//    start + duration; busy_until becomes that end, and so do the stream's and its context's
//    last ends. Every kernel is recorded as (pid, start, end) in the GPU's ring of the last
//    kKernelRing kernels (node.h), which the simulated NVML reads (nvml_impl.cc:
//    nvmlDeviceGetUtilizationRates, nvmlDeviceGetProcessUtilization).
//  - A launch returns at once (launches are asynchronous) unless this process already has more
//    than kPushBuffer (1024) kernels pending (not yet ended) on that GPU: then it waits until the
//    oldest of them ends, as the driver's push buffer fills.
//  - Streams: cuStreamCreate (flags CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING) makes a stream
//    of the calling thread's current context and its GPU. The null stream is the legacy default
//    stream, or with the _ptsz entry points the per-thread default stream (the handles
//    CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2) select either explicitly), of the
//    current context. cuStreamQuery (and cuStreamQuery_ptsz) gives CUDA_SUCCESS once every kernel
//    of the stream has ended and CUDA_ERROR_NOT_READY before (CUDA Driver API reference,
//    cuStreamQuery). A launch, query or synchronisation needs a current context (else
//    CUDA_ERROR_INVALID_CONTEXT), except a query or synchronisation of a created stream; a
//    created stream's kernels run on its own context's GPU; a destroyed or unknown stream, function
//    or module is CUDA_ERROR_INVALID_HANDLE.
//  - Synchronisation sleeps (clock_nanosleep) until the end of the last kernel of the stream
//    (cuStreamSynchronize) or of every stream of the current context (cuCtxSynchronize), then
//    calls OnSynchronize (internal.h). The legacy default stream waits, as in CUDA, for the
//    blocking streams' work too: synchronising it waits for every kernel of the context's
//    blocking streams (non-blocking streams excluded).
//  - Process exit: at a normal exit this process's kernels that have not ended are dropped from
//    the rings (one running is cut at the exit, those queued become empty), as the real driver
//    tears a dead process's channels down; a killed process's queued kernels stay (not modelled).
//
// Thread-safety: every entry point may be called from any thread. This process's tables (modules,
// functions, streams, contexts' last ends, pending kernels) are guarded by a local mutex, taken
// before the node's process-shared mutex (Node::Locked) and never while sleeping; the per-thread
// default stream's last ends are thread-local.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "internal.h"
#include "node.h"

// cuda_abi.h has no per-thread-default-stream form of cuStreamQuery; the driver exports one.
extern "C" CUresult cuStreamQuery_ptsz(CUstream hStream);

#define CU_EXPORT extern "C" __attribute__((visibility("default")))

namespace kgpu::simcuda {
namespace {

using sim::kKernelRing;
using sim::kMaxGpus;
using sim::Node;
using sim::SimExec;
using sim::SimKernel;

constexpr unsigned kPushBuffer = 1024;  // pending kernels per process and GPU before a launch waits
constexpr unsigned kQueueSlots = 2048;  // a power of two above kPushBuffer + 1
static_assert((kQueueSlots & (kQueueSlots - 1)) == 0 && kQueueSlots > kPushBuffer + 1);
constexpr uint64_t kDefaultPsPerThread = 1000;
constexpr uint64_t kMaxPsPerThread = 1000000000000ULL;  // 1 s per thread
constexpr int64_t kMaxDurationNs = 1LL << 50;           // about 13 days: no timeline overflow

struct Function;
struct Module {
  const void* ctx;
  std::vector<Function*> functions;
};
struct Function {
  Module* module;
  std::string name;
};
struct Stream {
  const void* ctx;  // the context it was created in
  unsigned gpu;     // physical index on the node
  unsigned flags;
  int64_t last_end = 0;  // end of its last kernel (CLOCK_MONOTONIC ns)
};
struct CtxEnds {
  int64_t all = 0;       // every stream's kernels (cuCtxSynchronize)
  int64_t blocking = 0;  // the legacy default stream's and the blocking streams' kernels
};

// This process's kernels on one GPU that may not have ended: their ends, oldest first (they are
// ordered, as the GPU runs kernels one after the other).
struct Pending {
  int64_t ends[kQueueSlots];
  uint32_t head = 0, size = 0;

  void Prune(int64_t now) {
    while (size > 0 && ends[head] <= now) {
      head = (head + 1) & (kQueueSlots - 1);
      --size;
    }
  }
  void Push(int64_t end) {
    ends[(head + size) & (kQueueSlots - 1)] = end;
    ++size;
  }
};

struct Exec {
  Node* node = nullptr;
  uint64_t ps_per_thread = kDefaultPsPerThread;
  std::atomic<int> physical[kMaxGpus];  // CUDA ordinal -> physical GPU index; -1: not looked up
  std::mutex mu;                        // guards everything below
  std::unordered_set<const Module*> modules;
  std::unordered_set<const Function*> functions;
  std::unordered_set<const Stream*> streams;
  std::unordered_map<const void*, CtxEnds> contexts;
  Pending pending[kMaxGpus];
};

std::once_flag g_once;
CUresult g_result = CUDA_ERROR_NOT_INITIALIZED;
std::atomic<Exec*> g_exec{nullptr};  // never freed: entry points may run during exit

// The per-thread default stream's last end, per context.
struct PerThreadEnd {
  const void* ctx;
  int64_t end;
};
constexpr unsigned kPerThreadSlots = 8;
thread_local PerThreadEnd t_per_thread[kPerThreadSlots];

// The slot of `ctx`; with `create`, a new one when there is none (replacing the one whose work
// ended first). nullptr without `create` when there is none (no work of this thread there).
int64_t* PerThreadSlot(const void* ctx, bool create) {
  PerThreadEnd* oldest = &t_per_thread[0];
  for (auto& s : t_per_thread) {
    if (s.ctx == ctx) return &s.end;
    if (s.end < oldest->end || s.ctx == nullptr) oldest = &s;
  }
  if (!create) return nullptr;
  *oldest = PerThreadEnd{ctx, 0};
  return &oldest->end;
}

void InitExec() {
  uint64_t ps = kDefaultPsPerThread;
  if (const char* v = std::getenv("KGPU_SIM_CUDA_KERNEL_PS_PER_THREAD");  // NOLINT(concurrency-mt-unsafe)
      v != nullptr && *v != '\0') {
    char* end = nullptr;
    errno = 0;
    const unsigned long long parsed = std::strtoull(v, &end, 10);
    if (*v < '0' || *v > '9' || *end != '\0' || errno != 0 || parsed > kMaxPsPerThread) {
      std::fprintf(stderr,
                   "simulated libcuda: KGPU_SIM_CUDA_KERNEL_PS_PER_THREAD=%s is not a number of picoseconds "
                   "(0-%llu)\n",
                   v, static_cast<unsigned long long>(kMaxPsPerThread));
      g_result = CUDA_ERROR_INVALID_VALUE;
      return;
    }
    ps = parsed;
  }
  auto opened = Node::Open(sim::ReadEnvironment());
  if (!opened.ok()) {
    std::fprintf(stderr, "simulated libcuda: %s\n", std::string(opened.status().message()).c_str());
    g_result = CUDA_ERROR_NO_DEVICE;
    return;
  }
  auto* e = new Exec;
  e->node = opened->release();
  e->ps_per_thread = ps;
  for (auto& p : e->physical) p.store(-1, std::memory_order_relaxed);
  g_result = CUDA_SUCCESS;
  g_exec.store(e, std::memory_order_release);
}

// The execution state and the calling thread's current context (nullptr: none), once the driver
// is initialised; the driver's error otherwise.
CUresult Enter(Exec** exec, const void** ctx) {
  CUcontext current = nullptr;
  if (CUresult r = cuCtxGetCurrent(&current); r != CUDA_SUCCESS) return r;
  std::call_once(g_once, InitExec);
  if (g_result != CUDA_SUCCESS) return g_result;
  *exec = g_exec.load(std::memory_order_acquire);
  *ctx = current;
  return CUDA_SUCCESS;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Whether `text` ("GPU-8-4-4-4-12" hex digits) is the UUID `u`.
bool SameUuid(const std::string& text, const CUuuid& u) {
  unsigned n = 0;
  int high = -1;
  for (size_t i = 4; i < text.size(); ++i) {
    const int d = HexDigit(text[i]);
    if (d < 0) continue;  // the dashes
    if (high < 0) {
      high = d;
      continue;
    }
    if (n >= 16 || static_cast<unsigned char>(u.bytes[n]) != static_cast<unsigned>(high * 16 + d)) return false;
    ++n;
    high = -1;
  }
  return n == 16;
}

// The node's GPU behind CUDA ordinal `dev` (CUDA_VISIBLE_DEVICES ordering, as cuda_impl.cc
// enumerates them), found by UUID and cached; -1 when there is none.
int PhysicalGpu(Exec& e, CUdevice dev) {
  if (dev < 0 || static_cast<unsigned>(dev) >= kMaxGpus) return -1;
  std::atomic<int>& cached = e.physical[dev];
  if (const int p = cached.load(std::memory_order_relaxed); p >= 0) return p;
  CUuuid u{};
  if (cuDeviceGetUuid_v2(&u, dev) != CUDA_SUCCESS) return -1;
  for (unsigned i = 0; i < e.node->gpu_count() && i < kMaxGpus; ++i) {
    if (SameUuid(e.node->uuid(i), u)) {
      cached.store(static_cast<int>(i), std::memory_order_relaxed);
      return static_cast<int>(i);
    }
  }
  return -1;
}

// The physical GPU of the calling thread's current context; -1 when there is none.
int CurrentGpu(Exec& e) {
  CUdevice dev = -1;
  if (cuCtxGetDevice(&dev) != CUDA_SUCCESS) return -1;
  return PhysicalGpu(e, dev);
}

enum class StreamKind { kLegacy, kPerThread, kCreated };

// Which stream a handle names; `ptsz`: called through a _ptsz entry point, where the null stream
// is the per-thread default stream.
StreamKind KindOf(CUstream s, bool ptsz) {
  if (s == nullptr) return ptsz ? StreamKind::kPerThread : StreamKind::kLegacy;
  if (s == CU_STREAM_LEGACY) return StreamKind::kLegacy;
  if (s == CU_STREAM_PER_THREAD) return StreamKind::kPerThread;
  return StreamKind::kCreated;
}

// A live stream made by cuStreamCreate, or nullptr (caller holds e.mu).
Stream* FindStream(const Exec& e, CUstream s) {
  auto* p = reinterpret_cast<Stream*>(s);
  return e.streams.count(p) > 0 ? p : nullptr;
}

void SleepUntil(int64_t t_ns) {
  if (t_ns <= sim::MonotonicNs()) return;
  struct timespec ts {};
  ts.tv_sec = static_cast<time_t>(t_ns / 1000000000LL);
  ts.tv_nsec = static_cast<long>(t_ns % 1000000000LL);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// (gx*gy*gz) * (bx*by*bz) * ps / 1000, saturated at kMaxDurationNs.
int64_t DurationNs(uint64_t grid, uint64_t block, uint64_t ps) {
  uint64_t threads = 0, total_ps = 0;
  if (__builtin_mul_overflow(grid, block, &threads) || __builtin_mul_overflow(threads, ps, &total_ps)) {
    return kMaxDurationNs;
  }
  return static_cast<int64_t>(std::min<uint64_t>(total_ps / 1000, kMaxDurationNs));
}

CUresult Launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, CUstream hs,
                void** params, void** extra, bool ptsz) {
  Exec* e = nullptr;
  const void* cur = nullptr;
  if (CUresult r = Enter(&e, &cur); r != CUDA_SUCCESS) return r;
  if (cur == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (CaptureKernelNode(hs, ptsz)) return CUDA_SUCCESS;  // recorded into the capture's graph, not run
  const uint64_t grid = uint64_t{gx} * gy * gz, block = uint64_t{bx} * by * bz;
  if (grid == 0 || block == 0 || bx > 1024 || by > 1024 || bz > 64 || block > 1024 || gx > 0x7FFFFFFFU || gy > 65535 ||
      gz > 65535 || (params != nullptr && extra != nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const StreamKind kind = KindOf(hs, ptsz);
  const int cur_gpu = kind == StreamKind::kCreated ? 0 : CurrentGpu(*e);  // a created stream has its own
  if (cur_gpu < 0) return CUDA_ERROR_INVALID_CONTEXT;
  const int64_t duration = DurationNs(grid, block, e->ps_per_thread);
  const auto pid = static_cast<uint32_t>(getpid());
  const auto* fn = reinterpret_cast<const Function*>(f);

  std::unique_lock<std::mutex> local(e->mu);
  for (;;) {
    if (e->functions.count(fn) == 0) return CUDA_ERROR_INVALID_HANDLE;
    Stream* s = kind == StreamKind::kCreated ? FindStream(*e, hs) : nullptr;
    if (kind == StreamKind::kCreated && s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const unsigned gpu = s != nullptr ? s->gpu : static_cast<unsigned>(cur_gpu);
    Pending& pending = e->pending[gpu];
    pending.Prune(sim::MonotonicNs());
    if (pending.size > kPushBuffer) {  // the push buffer is full: wait for the oldest kernel
      const int64_t wake = pending.ends[pending.head];
      local.unlock();
      SleepUntil(wake);
      local.lock();
      continue;  // the function or the stream may have gone meanwhile
    }
    const void* ctx = s != nullptr ? s->ctx : cur;
    CtxEnds& ends = e->contexts[ctx];  // inserts once per context
    int64_t* per_thread = kind == StreamKind::kPerThread ? PerThreadSlot(ctx, true) : nullptr;
    const int64_t after = s != nullptr ? s->last_end : per_thread != nullptr ? *per_thread : ends.blocking;
    int64_t end = 0;
    {
      Node::Locked lock(*e->node);
      SimExec& x = lock.state().exec[gpu];
      const int64_t start = std::max({sim::MonotonicNs(), x.busy_until_ns, after});
      end = start + duration;
      x.busy_until_ns = end;
      x.kernels[x.kernel_count % kKernelRing] = SimKernel{start, end, pid, 0};
      ++x.kernel_count;
    }
    pending.Push(end);
    ends.all = std::max(ends.all, end);
    if (s != nullptr) s->last_end = end;
    if (per_thread != nullptr) *per_thread = end;
    if (s == nullptr || (s->flags & CU_STREAM_NON_BLOCKING) == 0) ends.blocking = std::max(ends.blocking, end);
    return CUDA_SUCCESS;
  }
}

// When the last kernel of stream `hs` ends (0: none).
CUresult StreamEnd(CUstream hs, bool ptsz, int64_t* out) {
  Exec* e = nullptr;
  const void* cur = nullptr;
  if (CUresult r = Enter(&e, &cur); r != CUDA_SUCCESS) return r;
  const StreamKind kind = KindOf(hs, ptsz);
  if (kind != StreamKind::kCreated && cur == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> local(e->mu);
  switch (kind) {
    case StreamKind::kCreated: {
      const Stream* s = FindStream(*e, hs);
      if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      *out = s->last_end;
      break;
    }
    case StreamKind::kPerThread: {
      const int64_t* end = PerThreadSlot(cur, false);
      *out = end != nullptr ? *end : 0;
      break;
    }
    case StreamKind::kLegacy: {
      auto it = e->contexts.find(cur);
      *out = it != e->contexts.end() ? it->second.blocking : 0;
      break;
    }
  }
  return CUDA_SUCCESS;
}

CUresult StreamQuery(CUstream hs, bool ptsz) {
  int64_t end = 0;
  if (CUresult r = StreamEnd(hs, ptsz, &end); r != CUDA_SUCCESS) return r;
  return end <= sim::MonotonicNs() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult StreamSynchronize(CUstream hs, bool ptsz) {
  if (StreamCaptureStatus(hs, ptsz) != CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  int64_t end = 0;
  if (CUresult r = StreamEnd(hs, ptsz, &end); r != CUDA_SUCCESS) return r;
  SleepUntil(end);
  OnSynchronize(hs, false);
  return CUDA_SUCCESS;
}

// At a normal exit this process's kernels that have not ended leave the rings: a running one
// ends now, queued ones become empty at the end of the kernel before them (so the ring stays
// ordered), and busy_until follows the newest kernel.
struct ExitCleanup {
  ~ExitCleanup() {
    Exec* e = g_exec.load(std::memory_order_acquire);
    if (e == nullptr) return;
    const auto pid = static_cast<uint32_t>(getpid());
    Node::Locked lock(*e->node);
    const int64_t now = sim::MonotonicNs();
    for (unsigned gpu = 0; gpu < e->node->gpu_count() && gpu < kMaxGpus; ++gpu) {
      SimExec& x = lock.state().exec[gpu];
      const uint64_t n = std::min<uint64_t>(x.kernel_count, kKernelRing);
      int64_t prev_end = INT64_MIN;
      bool changed = false;
      for (uint64_t i = x.kernel_count - n; i < x.kernel_count; ++i) {
        SimKernel& k = x.kernels[i % kKernelRing];
        if (k.pid == pid && k.end_ns > now) {
          if (k.start_ns < now) {
            k.end_ns = now;
          } else {
            k.start_ns = k.end_ns = std::max(now, prev_end);
          }
          changed = true;
        }
        prev_end = k.end_ns;
      }
      if (changed) x.busy_until_ns = x.kernels[(x.kernel_count - 1) % kKernelRing].end_ns;
    }
  }
} g_exit_cleanup;

}  // namespace

const void* StreamContext(CUstream s) {
  Exec* e = g_exec.load(std::memory_order_acquire);
  if (e == nullptr || KindOf(s, false) != StreamKind::kCreated) return nullptr;
  std::lock_guard<std::mutex> local(e->mu);
  const Stream* st = FindStream(*e, s);
  return st != nullptr ? st->ctx : nullptr;
}

}  // namespace kgpu::simcuda

using kgpu::simcuda::Exec;
using kgpu::simcuda::Function;
using kgpu::simcuda::Module;
using kgpu::simcuda::Stream;

// ---------------------------------------------------------------- modules
CU_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Exec* e = nullptr;
  const void* cur = nullptr;
  if (CUresult r = kgpu::simcuda::Enter(&e, &cur); r != CUDA_SUCCESS) return r;
  if (cur == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto* m = new Module{cur, {}};
  std::lock_guard<std::mutex> local(e->mu);
  e->modules.insert(m);
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Exec* e = nullptr;
  const void* cur = nullptr;
  if (CUresult r = kgpu::simcuda::Enter(&e, &cur); r != CUDA_SUCCESS) return r;
  auto* m = reinterpret_cast<Module*>(hmod);
  std::lock_guard<std::mutex> local(e->mu);
  if (e->modules.count(m) == 0) return CUDA_ERROR_INVALID_HANDLE;
  for (Function* f : m->functions) {
    if (f->name == name) {
      *hfunc = reinterpret_cast<CUfunction>(f);
      return CUDA_SUCCESS;
    }
  }
  auto* f = new Function{m, name};
  m->functions.push_back(f);
  e->functions.insert(f);
  *hfunc = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  Exec* e = nullptr;
  const void* cur = nullptr;
  if (CUresult r = kgpu::simcuda::Enter(&e, &cur); r != CUDA_SUCCESS) return r;
  auto* m = reinterpret_cast<Module*>(hmod);
  std::lock_guard<std::mutex> local(e->mu);
  if (e->modules.erase(m) == 0) return CUDA_ERROR_INVALID_HANDLE;
  for (Function* f : m->functions) {
    e->functions.erase(f);
    delete f;
  }
  delete m;
  return CUDA_SUCCESS;
}

// ---------------------------------------------------------------- launches
CU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                  unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int,
                                  CUstream hStream, void** kernelParams, void** extra) {
  return kgpu::simcuda::Launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams,
                               extra, false);
}

CU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                       unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                       unsigned int blockDimZ, unsigned int, CUstream hStream, void** kernelParams,
                                       void** extra) {
  return kgpu::simcuda::Launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams,
                               extra, true);
}

// ---------------------------------------------------------------- streams
CU_EXPORT CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  if (phStream == nullptr || (Flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) return CUDA_ERROR_INVALID_VALUE;
  Exec* e = nullptr;
  const void* cur = nullptr;
  if (CUresult r = kgpu::simcuda::Enter(&e, &cur); r != CUDA_SUCCESS) return r;
  const int gpu = cur != nullptr ? kgpu::simcuda::CurrentGpu(*e) : -1;
  if (gpu < 0) return CUDA_ERROR_INVALID_CONTEXT;
  auto* s = new Stream{cur, static_cast<unsigned>(gpu), Flags, 0};
  std::lock_guard<std::mutex> local(e->mu);
  e->streams.insert(s);
  *phStream = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}

// A stream with work left is destroyed at once; its kernels still run (and count for the
// context's synchronisation), as with the real driver.
CU_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  Exec* e = nullptr;
  const void* cur = nullptr;
  if (CUresult r = kgpu::simcuda::Enter(&e, &cur); r != CUDA_SUCCESS) return r;
  if (kgpu::simcuda::KindOf(hStream, false) != kgpu::simcuda::StreamKind::kCreated) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard<std::mutex> local(e->mu);
  Stream* s = kgpu::simcuda::FindStream(*e, hStream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  e->streams.erase(s);
  delete s;
  kgpu::simcuda::OnStreamDestroy(hStream);
  return CUDA_SUCCESS;
}

CU_EXPORT CUresult cuStreamQuery(CUstream hStream) {
  return kgpu::simcuda::StreamQuery(hStream, false);
}
CU_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream) {
  return kgpu::simcuda::StreamQuery(hStream, true);
}

// ---------------------------------------------------------------- synchronisation
CU_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  return kgpu::simcuda::StreamSynchronize(hStream, false);
}
CU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  return kgpu::simcuda::StreamSynchronize(hStream, true);
}

CU_EXPORT CUresult cuCtxSynchronize(void) {
  Exec* e = nullptr;
  const void* cur = nullptr;
  if (CUresult r = kgpu::simcuda::Enter(&e, &cur); r != CUDA_SUCCESS) return r;
  if (cur == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  int64_t end = 0;
  {
    std::lock_guard<std::mutex> local(e->mu);
    auto it = e->contexts.find(cur);
    if (it != e->contexts.end()) end = it->second.all;
  }
  kgpu::simcuda::SleepUntil(end);
  kgpu::simcuda::OnSynchronize(nullptr, true);
  return CUDA_SUCCESS;
}
