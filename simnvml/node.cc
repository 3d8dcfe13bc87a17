#include "node.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/strings.h"

namespace kgpu::sim {
using kgpu::Cat;
using kgpu::Join;
namespace {

constexpr uint64_t kMagic = 0x4b4750555349'4d31ULL;  // "KGPUSIM1"
constexpr uint32_t kLayoutVersion = 3;

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
  env.state_path = EnvOr("KGPU_SIM_STATE", Cat(base, "/kgpu-sim/", env.node_name, ".",
                                                        profile_tag, ".state"));
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
    return absl::PermissionDeniedError(Cat(
        env.state_path, ": cannot open the simulated node's state file: ", std::strerror(errno),
        " (set KGPU_SIM_STATE to a writable path)"));
  }
  node->fd_ = fd;
  if (flock(fd, LOCK_EX) != 0) {
    return absl::InternalError(Cat(env.state_path, ": flock: ", std::strerror(errno)));
  }
  struct stat st {};
  fstat(fd, &st);
  if (static_cast<size_t>(st.st_size) != sizeof(SharedState) &&
      ftruncate(fd, sizeof(SharedState)) != 0) {
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

Node::Locked::~Locked() { pthread_mutex_unlock(&state_->mutex); }

void Node::PushEvent(const Locked& lock, unsigned gpu, uint64_t type, uint64_t data, uint32_t gi,
                     uint32_t ci) const {
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

uint64_t Node::EventHead() const { return __atomic_load_n(&state_->event_head, __ATOMIC_ACQUIRE); }

bool Node::WaitEvent(uint64_t* cursor, const uint64_t* masks, const uint64_t* since,
                     unsigned timeout_ms, SimEvent* out) const {
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

int Node::CreateComputeInstance(const Locked& lock, unsigned gpu, unsigned gi_slot,
                                unsigned ci_profile_index, unsigned* ci_slot) const {
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

int Node::DestroyComputeInstance(const Locked& lock, unsigned gpu, unsigned gi_slot,
                                 unsigned ci_slot) const {
  SimGpu& g = lock.gpu(gpu);
  if (gi_slot >= kMaxGis || ci_slot >= kMaxCis || g.gis[gi_slot].used == 0 ||
      g.gis[gi_slot].cis[ci_slot].used == 0) {
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
