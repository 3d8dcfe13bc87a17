#pragma once
// `kgpu sim`: replays a GPU cluster trace (the Alibaba cluster-trace-gpu-v2023 CSV format) through
// the placement engine, one or several policies over one or several seeds, exactly as the FGD
// paper's simulator does (src/sched/replay.h), and reports the GPU allocation ratio at 100, 110,
// 120 and 130 % arrived demand, unallocated GPUs, failed pods by shape and the fragmentation at
// the end: a table, or one JSON object with --json. --placements writes every arrival as CSV
// (pod_name,node_sn,gpu_indices,gpu_milli_each) for an independent checker; --plot draws the
// allocation curves as SVG. --departures replays with creation/deletion times instead; --sharing
// models time-slicing, MPS or MIG.
//
// Thread-safety: RunSim runs the replays on --jobs threads; each replay is independent.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "sched/replay.h"

namespace kgpu::cli {

struct SimFlags {
  std::string nodes;  // --nodes (default: the repository's default trace)
  std::string pods;   // --pods
  std::string policies = "random,bestfit,packing,fgd,ours";
  std::string seeds = "42-51";
  double target = 1.3;     // --target: arrived GPU demand / capacity
  std::string placements;  // --placements FILE ({policy}, {seed} replaced)
  std::string plot;        // --plot FILE.svg
  bool json = false;
  unsigned jobs = 0;  // 0: every core
  bool departures = false;
  std::string sharing = "timeslice";
  double half_life = 10000;
  bool quiet = false;  // --quiet: no progress line on the terminal
};

void AddSimFlags(CLI::App* sim, SimFlags* flags);

// Exit codes as every kgpu command: 0 done, 1 bad input (a file, a flag value), 2 usage.
int RunSim(const SimFlags& flags, std::ostream& out, std::ostream& err);

// "42-51", "42,44,50", "7": the seeds in order; an error names the bad part.
absl::StatusOr<std::vector<uint64_t>> ParseSeeds(const std::string& spec);

// One policy's runs, as RunSim aggregates them (exposed for tests and the plot).
struct PolicyRuns {
  std::string policy;
  std::vector<sched::ReplayResult> runs;  // one per seed, in seed order
};
// The SVG picture of the mean allocation curves (allocation % against arrived demand %, or
// against time in hours for departures).
std::string RenderSvg(const std::vector<PolicyRuns>& results, int gpus, bool departures);

}  // namespace kgpu::cli
