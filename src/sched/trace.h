#pragma once
// The Alibaba GPU trace's CSV format (cluster-trace-gpu-v2023), parsed from text:
//   nodes: sn,cpu_milli,memory_mib,gpu,model
//   pods:  name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,
//          deletion_time,scheduled_time]
// Columns are found by their header name (order free, extra columns ignored). `gpu_milli` is per
// GPU and capped at 1000 (1000 when the column is absent); a pod with num_gpu > 1 takes whole
// GPUs; `gpu_spec` is a '|'-separated list of allowed models. Errors name the source, line and
// column. Pure: the caller reads the file.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sched/types.h"

namespace kgpu::sched {

struct TracePod {
  PodRequest request;
  std::string gpu_spec;   // as written
  int64_t creation = -1;  // seconds; -1: not given
  int64_t deletion = -1;
};

absl::StatusOr<std::vector<NodeSpec>> ParseNodesCsv(std::string_view text, std::string_view source);
absl::StatusOr<std::vector<TracePod>> ParsePodsCsv(std::string_view text, std::string_view source);

// GPU memory (MiB) of the models the trace names, 0 when unknown (G1-G3 are undisclosed).
int64_t KnownGpuMemoryMib(std::string_view model);

}  // namespace kgpu::sched
