#include "node.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/strings.h"

namespace kgpu::sim {
using kgpu::Cat;
using kgpu::Join;
namespace {

constexpr uint64_t kMagic = 0x4b4750555349'4d31ULL;  // "KGPUSIM1"
constexpr uint32_t kLayoutVersion = 4;

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read-only use
  return (v != nullptr && *v != '\0') ? std::string(v) : fallback;
}

long Futex(uint32_t* addr, int op, uint32_t val, const struct timespec* timeout) {
  return syscall(SYS_futex, addr, op, val, timeout, nullptr, 0);
}

void MkdirParents(const std::string& path) {
  for (size_t pos = 1; (pos = path.find('/', pos)) != std::string::npos; ++pos) {
    const std::string dir = path.substr(0, pos);
    ::mkdir(dir.c_str(), 0777);
  }
}

// Lowest id not used by any element of `items` (ids start at `first`).
template <typename T, size_t N>
uint32_t FreeId(const T (&items)[N], uint32_t first) {
  uint32_t id = first;
  for (bool clash = true; clash;) {
    clash = false;
    for (const auto& it : items) {
      if (it.used != 0 && it.id == id) {
        clash = true;
        ++id;
      }
    }
  }
  return id;
}

// Puts a GPU instance of profile `p` at memory slice `start` into a free slot of `g`, with no
// compute instance. Returns the slot, or kMaxGis when none is free.
unsigned PlaceGi(SimGpu& g, const MigProfile& p, unsigned start) {
  unsigned slot = 0;
  while (slot < kMaxGis && g.gis[slot].used != 0) ++slot;
  if (slot == kMaxGis) return slot;
  SimGi& gi = g.gis[slot];
  gi = SimGi{};
  gi.used = 1;
  gi.id = FreeId(g.gis, 1);
  gi.profile_index = p.index;
  gi.start = start;
  gi.size = p.memory_slices;
  return slot;
}

}  // namespace

int64_t MonotonicNs() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

uint64_t RealtimeUs() {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000ULL + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

Environment ReadEnvironment() {
  Environment env;
  env.profile_spec = EnvOr("KGPU_SIM_NODE", "dgx-h100");
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "sim-node");
  env.node_name = EnvOr("KGPU_SIM_NODE_NAME", EnvOr("NODE_NAME", host));
  std::string base = EnvOr("XDG_RUNTIME_DIR", "/tmp");
  std::string profile_tag = env.profile_spec;
  for (char& c : profile_tag) {
    if (c == '/' || c == '.') c = '_';
  }
  env.state_path = EnvOr("KGPU_SIM_STATE", Cat(base, "/kgpu-sim/", env.node_name, ".", profile_tag, ".state"));
  return env;
}

Node::Node(Environment env, NodeProfile profile) : env_(std::move(env)), profile_(std::move(profile)) {
  for (unsigned i = 0; i < profile_.gpus.size(); ++i) {
    uuids_.push_back(GpuUuid(profile_.name, env_.node_name, i));
    serials_.push_back(GpuSerial(profile_.name, env_.node_name, i));
  }
}

Node::~Node() {
  if (state_ != nullptr) munmap(state_, sizeof(SharedState));
  if (fd_ >= 0) close(fd_);
}

std::string Node::BusId(unsigned gpu) const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "00000000:%02X:00.0", profile_.gpus[gpu].bus);
  return buf;
}

absl::StatusOr<std::unique_ptr<Node>> Node::Open(const Environment& env) {
  auto profile = LoadProfile(env.profile_spec);
  if (!profile.ok()) return profile.status();
  std::unique_ptr<Node> node(new Node(env, std::move(*profile)));

  MkdirParents(env.state_path);
  const int fd = ::open(env.state_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    return absl::PermissionDeniedError(Cat(env.state_path, ": cannot open the simulated node's state file: ",
                                           std::strerror(errno), " (set KGPU_SIM_STATE to a writable path)"));
  }
  node->fd_ = fd;
  if (flock(fd, LOCK_EX) != 0) {
    return absl::InternalError(Cat(env.state_path, ": flock: ", std::strerror(errno)));
  }
  struct stat st {};
  fstat(fd, &st);
  if (static_cast<size_t>(st.st_size) != sizeof(SharedState) && ftruncate(fd, sizeof(SharedState)) != 0) {
    flock(fd, LOCK_UN);
    return absl::InternalError(Cat(env.state_path, ": ftruncate: ", std::strerror(errno)));
  }
  void* mem = mmap(nullptr, sizeof(SharedState), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    flock(fd, LOCK_UN);
    return absl::InternalError(Cat(env.state_path, ": mmap: ", std::strerror(errno)));
  }
  node->state_ = static_cast<SharedState*>(mem);
  const uint64_t hash = Fnv1a(Cat(node->profile_.source, "\n", env.node_name));
  SharedState& s = *node->state_;
  if (s.magic != kMagic || s.layout_version != kLayoutVersion || s.profile_hash != hash) {
    std::memset(&s, 0, sizeof s);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s.mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    node->InitState(s);
    s.profile_hash = hash;
    s.layout_version = kLayoutVersion;
    s.gpu_count = node->gpu_count();
    __atomic_store_n(&s.magic, kMagic, __ATOMIC_RELEASE);
  }
  flock(fd, LOCK_UN);
  return node;
}

void Node::InitState(SharedState& s) const {
  std::memset(s.exec, 0, sizeof s.exec);  // the kernel record (simcuda/exec_impl.cc)
  const int64_t now = MonotonicNs();
  for (unsigned i = 0; i < gpu_count(); ++i) {
    const GpuSpec& spec = profile_.gpus[i];
    const GpuModel& m = *spec.model;
    SimGpu& g = s.gpus[i];
    std::memset(&g, 0, sizeof g);
    g.temp_c = m.idle_temp + i % 3;
    g.mem_temp_c = m.temp_mem_max > 0 ? g.temp_c + 6 : 0;
    g.power_mw = m.idle_power_w * 1000 + (i % 4) * 700;
    g.power_limit_mw = m.power_limit_w * 1000;
    g.sm_clock = m.idle_sm_mhz;
    g.mem_clock = m.max_mem_mhz;
    g.persistence = 1;
    g.energy_ts_ns = now;
    g.energy_mj = 1000000ULL * (i + 1);
    g.mig_current = g.mig_pending = spec.mig_enabled ? 1 : 0;
    for (unsigned k = 0; k < kMaxGis; ++k) g.gis[k].used = 0;
  }
  s.event_head = 0;
  // Initial MIG layouts (validated by the profile parser).
  for (unsigned i = 0; i < gpu_count(); ++i) {
    const GpuSpec& spec = profile_.gpus[i];
    if (!spec.mig_enabled) continue;
    for (const auto& inst : spec.mig) {
      const MigProfile* p = FindMigProfileByName(*spec.model, inst.profile);
      SimGpu& g = s.gpus[i];
      SimGi& gi = g.gis[PlaceGi(g, *p, static_cast<unsigned>(inst.start))];
      gi.cis[0].used = 1;
      gi.cis[0].id = 0;
      gi.cis[0].profile_index = p->compute_slices == 7 ? 4 : p->compute_slices - 1;
      gi.cis[0].start = 0;
      gi.cis[0].size = p->compute_slices;
    }
  }
}

void Node::Reset() const {
  Locked lock(*this);
  const uint64_t head = lock.state().event_head;
  InitState(lock.state());
  lock.state().event_head = head;  // keep sequence numbers monotonic for open event sets
}

Node::Locked::Locked(const Node& node) : state_(node.state_) {
  const int rc = pthread_mutex_lock(&state_->mutex);
  if (rc == EOWNERDEAD) {
    // A process died holding the lock; the state is a set of independent fields, keep it.
    pthread_mutex_consistent(&state_->mutex);
  }
}

Node::Locked::~Locked() {
  pthread_mutex_unlock(&state_->mutex);
}

void Node::PushEvent(const Locked& lock, unsigned gpu, uint64_t type, uint64_t data, uint32_t gi, uint32_t ci) const {
  SharedState& s = lock.state();
  const uint64_t seq = s.event_head + 1;
  SimEvent& e = s.ring[seq % kEventRing];
  e.seq = seq;
  e.gpu = gpu;
  e.gi = gi;
  e.ci = ci;
  e.type = type;
  e.data = data;
  __atomic_store_n(&s.event_head, seq, __ATOMIC_RELEASE);
  __atomic_fetch_add(&s.futex_word, 1U, __ATOMIC_SEQ_CST);
  Futex(&s.futex_word, FUTEX_WAKE, 0x7fffffff, nullptr);
}

uint64_t Node::EventHead() const {
  return __atomic_load_n(&state_->event_head, __ATOMIC_ACQUIRE);
}

bool Node::WaitEvent(uint64_t* cursor, const uint64_t* masks, const uint64_t* since, unsigned timeout_ms,
                     SimEvent* out) const {
  const int64_t deadline = MonotonicNs() + static_cast<int64_t>(timeout_ms) * 1000000LL;
  for (;;) {
    const uint32_t word = __atomic_load_n(&state_->futex_word, __ATOMIC_SEQ_CST);
    {
      Locked lock(*this);
      const SharedState& s = lock.state();
      uint64_t next = *cursor + 1;
      if (s.event_head >= kEventRing && next <= s.event_head - kEventRing) {
        next = s.event_head - kEventRing + 1;  // the ring overwrote what this set did not read
      }
      for (; next <= s.event_head; ++next) {
        const SimEvent& e = s.ring[next % kEventRing];
        *cursor = next;
        if (e.gpu < kMaxGpus && (masks[e.gpu] & e.type) != 0 && e.seq > since[e.gpu]) {
          *out = e;
          return true;
        }
      }
    }
    const int64_t left = deadline - MonotonicNs();
    if (left <= 0) return false;
    struct timespec ts {};
    ts.tv_sec = left / 1000000000LL;
    ts.tv_nsec = left % 1000000000LL;
    Futex(&state_->futex_word, FUTEX_WAIT, word, &ts);
  }
}

void Node::WaitWhileHung(unsigned gpu) const {
  while (__atomic_load_n(&state_->gpus[gpu].hang_until_ns, __ATOMIC_ACQUIRE) > MonotonicNs()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int Node::CreateGpuInstance(const Locked& lock, unsigned gpu, const MigProfile& p, int start,
                            unsigned* slot_out) const {
  SimGpu& g = lock.gpu(gpu);
  if (g.mig_current == 0) return 3;  // NOT_SUPPORTED: MIG disabled
  unsigned used_mem = 0, compute = 0, same = 0;
  for (const auto& gi : g.gis) {
    if (gi.used == 0) continue;
    used_mem |= ((1U << gi.size) - 1U) << gi.start;
    const MigProfile* other = FindMigProfileByIndex(*profile_.gpus[gpu].model, gi.profile_index);
    compute += other != nullptr ? other->compute_slices : 0;
    if (gi.profile_index == p.index) ++same;
  }
  if (same >= p.max_instances || compute + p.compute_slices > 7) return 23;  // INSUFFICIENT_RESOURCES
  auto mask_at = [&](unsigned s) { return ((1U << p.memory_slices) - 1U) << s; };
  if (start < 0) {
    for (unsigned s : p.starts) {
      if ((used_mem & mask_at(s)) == 0) {
        start = static_cast<int>(s);
        break;
      }
    }
    if (start < 0) return 23;
  } else {
    bool valid = false;
    for (unsigned s : p.starts) valid = valid || s == static_cast<unsigned>(start);
    if (!valid) return 2;  // INVALID_ARGUMENT
    if ((used_mem & mask_at(static_cast<unsigned>(start))) != 0) return 23;
  }
  const unsigned slot = PlaceGi(g, p, static_cast<unsigned>(start));
  if (slot == kMaxGis) return 23;
  const uint32_t id = g.gis[slot].id;
  *slot_out = slot;
  PushEvent(lock, gpu, 0x100, 0, id, kNoId);
  return 0;
}

int Node::DestroyGpuInstance(const Locked& lock, unsigned gpu, unsigned slot) const {
  SimGpu& g = lock.gpu(gpu);
  if (slot >= kMaxGis || g.gis[slot].used == 0) return 2;
  for (const auto& ci : g.gis[slot].cis) {
    if (ci.used != 0) return 19;  // IN_USE: destroy compute instances first
  }
  for (unsigned p = 0; p < g.nproc; ++p) {
    if (g.procs[p].gi == g.gis[slot].id) return 19;
  }
  const uint32_t id = g.gis[slot].id;
  g.gis[slot] = SimGi{};
  PushEvent(lock, gpu, 0x100, 0, id, kNoId);
  return 0;
}

int Node::CreateComputeInstance(const Locked& lock, unsigned gpu, unsigned gi_slot, unsigned ci_profile_index,
                                unsigned* ci_slot) const {
  SimGpu& g = lock.gpu(gpu);
  if (gi_slot >= kMaxGis || g.gis[gi_slot].used == 0) return 2;
  SimGi& gi = g.gis[gi_slot];
  const MigProfile* gp = FindMigProfileByIndex(*profile_.gpus[gpu].model, gi.profile_index);
  const unsigned size = ci_profile_index == 4 ? 7 : ci_profile_index + 1;
  if (ci_profile_index > 4 || gp == nullptr || size > gp->compute_slices) return 2;
  unsigned used = 0;
  for (const auto& ci : gi.cis) {
    if (ci.used != 0) used |= ((1U << ci.size) - 1U) << ci.start;
  }
  int start = -1;
  for (unsigned s = 0; s + size <= gp->compute_slices; s += size) {
    if ((used & (((1U << size) - 1U) << s)) == 0) {
      start = static_cast<int>(s);
      break;
    }
  }
  if (start < 0) return 23;
  unsigned slot = 0;
  while (slot < kMaxCis && gi.cis[slot].used != 0) ++slot;
  if (slot == kMaxCis) return 23;
  const uint32_t id = FreeId(gi.cis, 0);
  gi.cis[slot] = SimCi{1, id, ci_profile_index, static_cast<uint32_t>(start), size};
  *ci_slot = slot;
  PushEvent(lock, gpu, 0x100, 0, gi.id, id);
  return 0;
}

int Node::DestroyComputeInstance(const Locked& lock, unsigned gpu, unsigned gi_slot, unsigned ci_slot) const {
  SimGpu& g = lock.gpu(gpu);
  if (gi_slot >= kMaxGis || ci_slot >= kMaxCis || g.gis[gi_slot].used == 0 || g.gis[gi_slot].cis[ci_slot].used == 0) {
    return 2;
  }
  SimGi& gi = g.gis[gi_slot];
  for (unsigned p = 0; p < g.nproc; ++p) {
    if (g.procs[p].gi == gi.id && g.procs[p].ci == gi.cis[ci_slot].id) return 19;
  }
  const uint32_t id = gi.cis[ci_slot].id;
  gi.cis[ci_slot] = SimCi{};
  PushEvent(lock, gpu, 0x100, 0, gi.id, id);
  return 0;
}

}  // namespace kgpu::sim

// ---------------------------------------------------------------- live values and their ranges
namespace kgpu::sim {
namespace {

constexpr uint64_t kMiB = 1048576ULL;
constexpr uint64_t kU32 = 0xFFFFFFFFULL;

uint64_t ProcessBytes(const SimGpu& g, uint32_t gi, unsigned skip_slot) {
  uint64_t sum = 0;
  for (unsigned i = 0; i < g.nproc && i < kMaxProcs; ++i) {
    if (i != skip_slot && (gi == kNoId || g.procs[i].gi == gi)) sum += g.procs[i].mem_bytes;
  }
  return sum;
}

// Memory a GPU offers its users: total less the driver's reservation, in bytes.
uint64_t UsableBytes(const GpuModel& m) {
  return (m.memory_mib > m.reserved_mib ? m.memory_mib - m.reserved_mib : 0) * kMiB;
}

#define KGPU_LIVE(key, member, scale, help, min_value, max_expr)                       \
  LiveField {                                                                          \
    key, help, scale, [](const SimGpu& g) { return static_cast<uint64_t>(g.member); }, \
        [](SimGpu& g, uint64_t v) { g.member = static_cast<decltype(g.member)>(v); },  \
        [](const GpuModel& m, const SimGpu& g) -> uint64_t {                           \
          (void)m;                                                                     \
          (void)g;                                                                     \
          return max_expr;                                                             \
        },                                                                             \
        min_value                                                                      \
  }

}  // namespace

const std::vector<LiveField>& LiveFields() {
  static const std::vector<LiveField> fields = {
      KGPU_LIVE("util", util_gpu, 1,
                "GPU utilisation besides the listed processes' (served: sum of both, at most 100), %", 0, 100),
      KGPU_LIVE("memutil", util_mem, 1, "memory-copy utilisation, %", 0, 100),
      KGPU_LIVE("encutil", util_enc, 1, "encoder utilisation, %", 0, 100),
      KGPU_LIVE("decutil", util_dec, 1, "decoder utilisation, %", 0, 100),
      // NVML reports unsigned degrees; DCGM discards readings above 200 as invalid.
      KGPU_LIVE("temp", temp_c, 1, "GPU temperature, degrees C", 0, 200),
      KGPU_LIVE("memtemp", mem_temp_c, 1, "memory temperature, degrees C", 0, 200),
      KGPU_LIVE("power", power_mw, 1000, "power draw, W", 0, 2ULL * m.power_limit_w),
      KGPU_LIVE("powerlimit", power_limit_mw, 1000, "power limit, W", 1, m.power_limit_w),
      KGPU_LIVE("smclock", sm_clock, 1, "SM clock, MHz", 0, m.max_sm_mhz),
      KGPU_LIVE("memclock", mem_clock, 1, "memory clock, MHz", 0, m.max_mem_mhz),
      KGPU_LIVE("memused", mem_used_base, kMiB, "memory used outside listed processes, MiB", 0,
                (UsableBytes(m) - std::min(UsableBytes(m), ProcessBytes(g, kNoId, kMaxProcs))) / kMiB),
      KGPU_LIVE("pcie_replay", pcie_replay, 1, "PCIe replay counter", 0, kU32),
      KGPU_LIVE("pcie_tx", pcie_tx_kbs, 1, "PCIe TX throughput, KB/s", 0, 128000000),
      KGPU_LIVE("pcie_rx", pcie_rx_kbs, 1, "PCIe RX throughput, KB/s", 0, 128000000),
      KGPU_LIVE("nvlink_tx", nvlink_tx_kib, 1, "NVLink TX counter, KiB", 0, UINT64_MAX / 2),
      KGPU_LIVE("nvlink_rx", nvlink_rx_kib, 1, "NVLink RX counter, KiB", 0, UINT64_MAX / 2),
      KGPU_LIVE("remapped_cor", remapped_cor, 1, "correctable remapped rows", 0, kU32),
      KGPU_LIVE("remapped_unc", remapped_unc, 1, "uncorrectable remapped rows", 0, kU32),
      KGPU_LIVE("remapped_pending", remapped_pending, 1, "row remapping pending (0/1)", 0, 1),
      KGPU_LIVE("remapped_failure", remapped_failure, 1, "row remapping failed (0/1)", 0, 1),
      KGPU_LIVE("mig_pending", mig_pending, 1, "pending MIG mode (0/1), applied at reset; 0 on GPUs without MIG", 0,
                m.max_mig_devices > 0 ? 1 : 0),
      KGPU_LIVE("compute_mode", compute_mode, 1, "0 default, 2 prohibited, 3 exclusive-process", 0, 3),
  };
  return fields;
}
#undef KGPU_LIVE

const LiveField* FindLiveField(std::string_view key) {
  for (const auto& f : LiveFields()) {
    if (key == f.key) return &f;
  }
  return nullptr;
}

bool InRange(const LiveField& f, const GpuModel& model, const SimGpu& g) {
  const uint64_t v = f.get(g);
  if (f.key == std::string_view("compute_mode") && v == 1) return false;  // EXCLUSIVE_THREAD: gone since CUDA 8
  if (f.key == std::string_view("memused")) {
    return v + ProcessBytes(g, kNoId, kMaxProcs) <= UsableBytes(model);
  }
  return v >= f.min * f.scale && v / f.scale <= f.max(model, g);
}

absl::Status SetLiveValue(SimGpu& g, const GpuModel& model, std::string_view key, std::string_view value) {
  const LiveField* f = FindLiveField(key);
  if (f == nullptr) {
    std::vector<std::string> keys;
    for (const auto& x : LiveFields()) keys.emplace_back(x.key);
    const std::string near = Nearest(key, keys, 3);
    return absl::InvalidArgumentError(Cat("'", Printable(key), "' is not a settable value",
                                          near.empty() ? "" : Cat(" (did you mean ", near, "?)"),
                                          "; see kgpu-simctl set --help"));
  }
  const uint64_t max = f->max(model, g);
  const std::string range = Cat(f->help, ", must be an integer from ", f->min, " to ", max,
                                f->key == std::string_view("memused") ? " (the GPU's memory less its reservation and "
                                                                        "the listed processes)"
                                                                      : "");
  const std::string given = Cat(key, "=", Printable(value));
  uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ptr != value.data() + value.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return absl::InvalidArgumentError(Cat(given, ": ", range));
  }
  if (ec == std::errc::result_out_of_range || v < f->min || v > max) {
    return absl::InvalidArgumentError(Cat(given, " is out of range: ", range));
  }
  if (f->key == std::string_view("compute_mode") && v == 1) {
    return absl::InvalidArgumentError(Cat(given, ": mode 1 (exclusive-thread) no longer exists; use 0, 2 or 3"));
  }
  f->set(g, v * f->scale);
  return absl::OkStatus();
}

absl::Status CheckProcess(const GpuModel& model, const SimGpu& g, const SimProcess& p, unsigned slot) {
  if (p.sm_util > 100) return absl::InvalidArgumentError(Cat("--util ", p.sm_util, ": must be 0 to 100 (%)"));
  if (p.mem_util > 100) return absl::InvalidArgumentError(Cat("--memutil ", p.mem_util, ": must be 0 to 100 (%)"));
  uint64_t capacity = UsableBytes(model);
  uint64_t others = g.mem_used_base + ProcessBytes(g, kNoId, slot);
  std::string where = "the GPU";
  if (p.gi != kNoId) {
    for (const auto& gi : g.gis) {
      if (gi.used == 0 || gi.id != p.gi) continue;
      const MigProfile* mp = FindMigProfileByIndex(model, gi.profile_index);
      capacity = mp != nullptr ? mp->memory_mib * kMiB : 0;
      others = ProcessBytes(g, p.gi, slot);
      where = Cat("GPU instance ", p.gi);
    }
  }
  const uint64_t free = capacity > others ? capacity - others : 0;
  if (p.mem_bytes > free) {
    return absl::InvalidArgumentError(Cat("--mem ", p.mem_bytes / kMiB, ": more than ", where, " has free (",
                                          free / kMiB, " of ", capacity / kMiB, " MiB)"));
  }
  return absl::OkStatus();
}

}  // namespace kgpu::sim
