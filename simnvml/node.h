#pragma once
// The live state of a simulated node, shared by every process that uses the same node: a
// fixed-layout struct in a memory-mapped file, guarded by a robust process-shared mutex, with an
// event ring whose waiters sleep on a futex in the mapping (so an injected event wakes a waiter in
// another process at once).
//
// Thread-safety: Node is safe for concurrent use from any number of threads and processes. All
// reads and writes of SharedState go through Node::Locked (the shared mutex), except the futex word.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <pthread.h>

#include "absl/status/statusor.h"
#include "profile.h"

namespace kgpu::sim {

inline constexpr unsigned kMaxGpus = 16;
inline constexpr unsigned kMaxProcs = 64;
inline constexpr unsigned kMaxGis = 8;
inline constexpr unsigned kMaxCis = 8;
inline constexpr unsigned kEventRing = 1024;
inline constexpr unsigned kKernelRing = 4096;  // kernels remembered per GPU (SimExec)
inline constexpr unsigned kNoId = 0xFFFFFFFFU;

struct SimProcess {
  uint32_t pid;
  uint32_t gi, ci;  // kNoId when not on a MIG instance
  uint32_t sm_util, mem_util;
  uint32_t kind;  // 0 compute, 1 graphics, 2 MPS client
  uint64_t mem_bytes;
  uint64_t sample_us;  // time of the last utilisation sample
};

struct SimCi {
  uint32_t used;
  uint32_t id;
  uint32_t profile_index;  // NVML_COMPUTE_INSTANCE_PROFILE_*
  uint32_t start, size;    // compute slices within the GI
};

struct SimGi {
  uint32_t used;
  uint32_t id;
  uint32_t profile_index;  // NVML_GPU_INSTANCE_PROFILE_*
  uint32_t start, size;    // memory slices
  SimCi cis[kMaxCis];
};

struct SimGpu {
  uint32_t util_gpu, util_mem, util_enc, util_dec;
  uint32_t temp_c, mem_temp_c;
  uint32_t power_mw, power_limit_mw;
  uint32_t sm_clock, mem_clock;
  uint32_t lost;
  uint32_t compute_mode;
  uint32_t persistence;
  uint32_t mig_current, mig_pending;
  uint32_t pcie_replay;
  uint32_t remapped_cor, remapped_unc, remapped_pending, remapped_failure;
  uint32_t last_xid;
  uint32_t nproc;
  uint64_t mem_used_base;  // bytes used by no listed process
  uint64_t energy_mj;
  int64_t energy_ts_ns;
  uint64_t ecc_sbe_vol, ecc_dbe_vol, ecc_sbe_agg, ecc_dbe_agg;
  uint64_t nvlink_tx_kib, nvlink_rx_kib;
  uint64_t pcie_tx_kbs, pcie_rx_kbs;
  int64_t hang_until_ns;  // CLOCK_MONOTONIC; calls on this GPU block until then
  SimProcess procs[kMaxProcs];
  SimGi gis[kMaxGis];
};

struct SimEvent {
  uint64_t seq;
  uint32_t gpu;
  uint32_t gi, ci;
  uint32_t pad;
  uint64_t type;
  uint64_t data;
};

// A kernel the simulated CUDA driver (simcuda/exec_impl.cc) ran or queued on a GPU: the process
// that launched it and when it runs (CLOCK_MONOTONIC ns, end exclusive; end == start for an
// empty kernel).
struct SimKernel {
  int64_t start_ns, end_ns;
  uint32_t pid;
  uint32_t pad;
};

// A GPU's execution timeline: it runs one kernel at a time, so every kernel starts at or after
// the end of the one recorded before it, and the ring is ordered by start and by end, without
// overlaps. Written by the simulated CUDA driver, read by the simulated NVML's utilisation
// queries. All zero on a fresh state (no kernel yet).
struct SimExec {
  int64_t busy_until_ns;  // the end of the last kernel queued (0: none)
  uint64_t kernel_count;  // kernels recorded since the state was made; the newest is
                          // kernels[(kernel_count - 1) % kKernelRing], the ring holds the last
                          // min(kernel_count, kKernelRing)
  SimKernel kernels[kKernelRing];
};
static_assert(sizeof(SimKernel) == 24 && sizeof(SimExec) % 8 == 0, "SimExec: a fixed layout of 8-byte fields");

struct SharedState {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t gpu_count;
  uint64_t profile_hash;
  pthread_mutex_t mutex;
  alignas(64) uint32_t futex_word;  // bumped (atomically) on every event; waiters sleep on it
  alignas(64) uint64_t event_head;  // seq of the newest event (0: none yet)
  SimEvent ring[kEventRing];
  SimGpu gpus[kMaxGpus];
  // Appended after the fields above so that their offsets do not move: a state file of the
  // previous layout grows (ftruncate fills the new part with zeros, the initial value).
  SimExec exec[kMaxGpus];
};

// What selects the simulated node: KGPU_SIM_NODE, KGPU_SIM_STATE, KGPU_SIM_NODE_NAME.
struct Environment {
  std::string profile_spec;  // built-in name or YAML path (default "dgx-h100")
  std::string state_path;    // the shared state file
  std::string node_name;     // feeds the UUIDs
};
Environment ReadEnvironment();

class Node {
 public:
  // Opens the node's shared state, creating or re-initialising it when the file is new, has
  // another layout, or was made from another profile or node name.
  static absl::StatusOr<std::unique_ptr<Node>> Open(const Environment& env);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const NodeProfile& profile() const { return profile_; }
  const Environment& environment() const { return env_; }
  unsigned gpu_count() const { return static_cast<unsigned>(profile_.gpus.size()); }
  const std::string& uuid(unsigned gpu) const { return uuids_[gpu]; }
  const std::string& serial(unsigned gpu) const { return serials_[gpu]; }
  std::string BusId(unsigned gpu) const;  // "00000000:18:00.0"

  // Holds the shared mutex for its lifetime.
  class Locked {
   public:
    explicit Locked(const Node& node);
    ~Locked();
    Locked(const Locked&) = delete;
    Locked& operator=(const Locked&) = delete;
    SharedState& state() const { return *state_; }
    SimGpu& gpu(unsigned i) const { return state_->gpus[i]; }

   private:
    SharedState* state_;
  };

  // Appends an event and wakes every waiter (caller holds Locked).
  void PushEvent(const Locked& lock, unsigned gpu, uint64_t type, uint64_t data, uint32_t gi, uint32_t ci) const;
  // Waits up to timeout_ms for an event newer than *cursor on a GPU whose mask (masks[gpu])
  // selects its type and that happened after the GPU was registered (seq > since[gpu]).
  // Advances *cursor. Returns true and fills *out when one arrived.
  bool WaitEvent(uint64_t* cursor, const uint64_t* masks, const uint64_t* since, unsigned timeout_ms,
                 SimEvent* out) const;
  uint64_t EventHead() const;

  // Resets the live state to the profile's initial state.
  void Reset() const;

  // MIG (caller holds Locked). Return an NVML return code (0 on success).
  int CreateGpuInstance(const Locked& lock, unsigned gpu, const MigProfile& profile, int start, unsigned* slot) const;
  int DestroyGpuInstance(const Locked& lock, unsigned gpu, unsigned slot) const;
  int CreateComputeInstance(const Locked& lock, unsigned gpu, unsigned gi_slot, unsigned ci_profile_index,
                            unsigned* ci_slot) const;
  int DestroyComputeInstance(const Locked& lock, unsigned gpu, unsigned gi_slot, unsigned ci_slot) const;

  // Blocks while a hang is injected on `gpu` (see SimGpu::hang_until_ns).
  void WaitWhileHung(unsigned gpu) const;

 private:
  Node(Environment env, NodeProfile profile);
  void InitState(SharedState& s) const;

  Environment env_;
  NodeProfile profile_;
  std::vector<std::string> uuids_;
  std::vector<std::string> serials_;
  SharedState* state_ = nullptr;
  int fd_ = -1;
};

int64_t MonotonicNs();
uint64_t RealtimeUs();

// A live value of a simulated GPU that kgpu-simctl sets and the library serves, with the range
// both accept: simctl refuses a value outside it, and the library does not serve a stored value
// outside it (a state file written by something else) but fails the call with NVML_ERROR_UNKNOWN.
struct LiveField {
  const char* key;
  const char* help;                // what and the unit, e.g. "GPU temperature, degrees C"
  uint64_t scale;                  // stored = given * scale (power: W given, mW stored)
  uint64_t (*get)(const SimGpu&);  // stored units
  void (*set)(SimGpu&, uint64_t);  // stored units
  // The largest value accepted, in given units (may depend on the model and on the other values).
  uint64_t (*max)(const GpuModel&, const SimGpu&);
  uint64_t min;  // in given units
};
const std::vector<LiveField>& LiveFields();
const LiveField* FindLiveField(std::string_view key);
// Whether the stored value of `f` on `g` lies in its range (stored units).
bool InRange(const LiveField& f, const GpuModel& model, const SimGpu& g);
// Parses `value` (decimal digits, a sign is refused with the range) and stores it. Errors name the
// key, the accepted range with its unit and why: "temp=-400: GPU temperature, degrees C, must be
// an integer from 0 to 200".
absl::Status SetLiveValue(SimGpu& g, const GpuModel& model, std::string_view key, std::string_view value);
// Checks a process to add to slot `slot` of `g` (utilisation 0..100 %, memory within what the
// GPU, or its MIG instance, has free besides the other processes).
absl::Status CheckProcess(const GpuModel& model, const SimGpu& g, const SimProcess& p, unsigned slot);

}  // namespace kgpu::sim
