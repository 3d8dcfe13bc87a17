#pragma once
// Trace replay, exactly as the FGD paper's simulator does it (Weng et al., USENIX ATC'23, and its open simulator): pods
// sorted by name and shuffled with the seed, then random clones `<name>-tuned-<k>` appended at the end until the
// arrived GPU demand reaches the target (130 % of the cluster's GPUs), scheduled one at a time; a pod that does not fit
// fails and is not retried (docs/sim.md). The KPI: the GPU allocation ratio at x % arrived demand (the mean of
// round(alloc %, 2) over the arrivals whose round(arrived %) is x).
//
// Beyond the paper: a dynamic replay (pods leave at their deletion time; a pod that does not fit
// waits and is retried when something leaves) and sharing modes for planning (time-slicing,
// MPS, MIG with fixed slices).
//
// Pure: no I/O, no clock; deterministic for a seed. Thread-safety: Replay() is reentrant.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sched/frag.h"
#include "sched/trace.h"
#include "sched/types.h"

namespace kgpu::sched {

struct Sharing {
  enum Kind { kTimeSlice, kMps, kMig } kind = kTimeSlice;
  std::vector<MigInstance> layout;  // kMig: the instances every GPU is cut into
  int mps_clients = 48;             // kMps: clients per GPU (the MPS server's limit)
  std::string spec = "timeslice";
};
// "timeslice", "mps", "mps:<clients>" or "mig:<layout>" where the layout is profiles joined by
// '+' with optional counts, e.g. "mig:3g.40gb+2g.20gb+1g.10gb*2" or "mig:1g.10gb*7".
absl::StatusOr<Sharing> ParseSharing(std::string_view spec);

struct ReplayOptions {
  std::string policy = "ours";  // a policy name, or "ours-trace": ours given the trace's shapes
  uint64_t seed = 42;
  double target = 1.3;  // arrived GPU demand / cluster GPU capacity
  Sharing sharing;
  bool departures = false;
  double half_life = 10000;  // ours, online
  bool keep_log = false;
};

struct LogEntry {
  std::string pod;
  int node = -1;  // -1: failed
  std::vector<int> gpus;
  int milli_each = 0;
  int64_t time = -1;  // departures: when it was placed
};

struct ReplayResult {
  std::string policy;
  uint64_t seed = 0;
  int gpus = 0;
  int64_t total_milli = 0;
  // Allocation ratio (%) per integer arrived demand (%), for the arrivals seen.
  std::map<int, double> curve;
  double AllocAt(int percent) const;
  int64_t arrived = 0, placed = 0, failed = 0;
  std::map<std::string, int64_t> failed_by_shape;  // "cpu", "share", "1-gpu", ..., "mig"
  std::map<std::string, int64_t> arrived_by_shape;
  double final_alloc = 0;  // % at the end
  double frag_milli = 0;   // fragmentation at the end, for the trace's typical pods
  double idle_milli = 0;
  size_t typical_shapes = 0;
  std::vector<LogEntry> log;  // keep_log: every arrival in order (placements for departures)
  // Departures only.
  std::vector<std::pair<int64_t, double>> timeline;  // (time s, allocation %), about 200 points
  double mean_alloc = 0;                             // time-weighted over the arrivals' span
  double pending_p50 = 0, pending_p99 = 0, pending_max = 0, pending_mean = 0;  // seconds
  int64_t waited = 0, never_placed = 0;
};

// The shape class a request is counted in.
std::string ShapeClass(const PodRequest& pod);

absl::StatusOr<ReplayResult> Replay(const std::vector<NodeSpec>& nodes, const std::vector<TracePod>& pods,
                                    const ReplayOptions& options);

}  // namespace kgpu::sched
