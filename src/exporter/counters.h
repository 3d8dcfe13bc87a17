#pragma once
// The exporter's metric families, selected by a counters CSV in dcgm-exporter's format
// (`<DCGM field name>, <prometheus type>, <help>`, '#' comments). Names, types and HELP texts are
// dcgm-exporter's, so dashboards and alerts written for it work unchanged. Every field kgpu can
// read through NVML is listed in one table; DCGM fields that need DCGM's profiling module
// (DCGM_FI_PROF_*) or vGPU are accepted and omitted, as dcgm-exporter omits them when DCGM
// reports no support. Names DCGM does not have are refused.
//
// Thread-safety: pure functions over immutable tables.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::exporter {

enum class Field {
  kSmClock,
  kMemClock,
  kMemoryTemp,
  kGpuTemp,
  kPowerUsage,
  kTotalEnergy,
  kPcieReplay,
  kGpuUtil,
  kMemCopyUtil,
  kEncUtil,
  kDecUtil,
  kXidErrors,
  kFbFree,
  kFbUsed,
  kFbReserved,
  kNvlinkBandwidthTotal,
  kUncorrectableRemappedRows,
  kCorrectableRemappedRows,
  kRowRemapFailure,
  kEccSbeVol,
  kEccDbeVol,
  kEccSbeAgg,
  kEccDbeAgg,
  kXidErrorsTotal,
  kDriverVersion,  // a label, not a family
};

struct Counter {
  std::string name;  // as written in the CSV: the metric name
  std::string type;  // gauge, counter, label
  std::string help;
  Field field;
};

// dcgm-exporter's default-counters.csv rows, plus the ECC counters and DCGM_EXP_XID_ERRORS_TOTAL
// (commented out or absent in dcgm-exporter's file; kgpu's alert rules need them).
const char* DefaultCountersCsv();

// Parses a counters CSV. Errors read "<origin>:<line>:<column>: ..." (escaped). DCGM fields kgpu
// knows but cannot produce (profiling, vGPU, NVSwitch, ...) are skipped with a message in *skipped;
// a name that is no DCGM field (a typo such as DCGM_FI_DEV_GPU_TMEP) is an error that suggests the
// nearest known name; a file that leaves no metric family to export is an error.
absl::StatusOr<std::vector<Counter>> ParseCounters(std::string_view csv, std::string_view origin,
                                                   std::vector<std::string>* skipped);
absl::StatusOr<std::vector<Counter>> LoadCountersFile(const std::string& path, std::vector<std::string>* skipped);

// The text of an XID as dcgm-exporter labels it (err_msg), from NVIDIA's XID catalogue.
const char* XidMessage(unsigned long long xid);

}  // namespace kgpu::exporter
