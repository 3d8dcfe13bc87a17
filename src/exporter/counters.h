#pragma once
// The exporter's metric families, selected by a counters CSV in dcgm-exporter's format
// (`<DCGM field name>, <prometheus type>, <help>`, '#' comments). Names, types and HELP texts are
// dcgm-exporter's, so dashboards and alerts written for it work unchanged. Every field kgpu can
// read through NVML is listed in one table, under every name DCGM gives it: the legacy names
// (DCGM_FI_DEV_GPU_TEMP), DCGM 4.7's canonical names that dcgm-exporter 4.9 writes
// (DCGM_FI_DEV_GPU_TEMP_CELSIUS; those that change the unit are served in the new unit: hertz,
// joules, ratios, bytes) and the lowercase 1.x names of 1.x-compatibility-metrics.csv
// (dcgm_gpu_temp). The DCGM_FI_PROF_* fields come from NVML's GPU performance monitoring (GPM,
// Hopper and newer). DCGM fields that need DCGM itself (vGPU, NVSwitch, per-lane NVLink error
// counters, DCGM's own bookkeeping) are accepted and omitted; names DCGM does not have are refused.
//
// Thread-safety: pure functions over immutable tables.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::exporter {

enum class Field {
  // Clocks (MHz).
  kSmClock,
  kMemClock,
  kVideoClock,
  kAppSmClock,
  kAppMemClock,
  kMaxSmClock,
  kMaxMemClock,
  kMaxVideoClock,
  kClockEventReasons,  // bit mask (nvmlClocksEventReasons)
  // Temperatures (C).
  kMemoryTemp,
  kGpuTemp,
  kMemMaxOpTemp,
  kGpuMaxOpTemp,
  kSlowdownTemp,
  kShutdownTemp,
  // Power (W, a double), energy (mJ), performance state, fan.
  kPowerUsage,
  kTotalEnergy,
  kPowerMgmtLimit,
  kPowerMgmtLimitMin,
  kPowerMgmtLimitMax,
  kPowerMgmtLimitDef,
  kEnforcedPowerLimit,
  kPstate,
  kFanSpeed,  // %
  // PCIe.
  kPcieReplay,
  kPcieTxThroughput,  // KB/s
  kPcieRxThroughput,
  kPcieMaxLinkGen,
  kPcieMaxLinkWidth,
  kPcieLinkGen,
  kPcieLinkWidth,
  // Utilisation (%).
  kGpuUtil,
  kMemCopyUtil,
  kEncUtil,
  kDecUtil,
  // Time the clocks were held back, ns since the driver loaded (nvmlDeviceGetViolationStatus).
  kPowerViolation,
  kThermalViolation,
  kSyncBoostViolation,
  kBoardLimitViolation,
  kLowUtilViolation,
  kReliabilityViolation,
  kTotalAppClocksViolation,
  kTotalBaseClocksViolation,
  // Errors.
  kXidErrors,  // the last XID (err_code, err_msg); 0 "No Error" before any
  kEccCurrent,
  kEccPending,
  kEccSbeVol,
  kEccDbeVol,
  kEccSbeAgg,
  kEccDbeAgg,
  kRetiredSbe,
  kRetiredDbe,
  kRetiredPending,
  kUncorrectableRemappedRows,
  kCorrectableRemappedRows,
  kRowRemapFailure,
  // Memory (MiB).
  kFbTotal,
  kFbFree,
  kFbUsed,
  kFbReserved,
  kFbUsedPercent,  // a 0..1 ratio, as DCGM computes it: used / (total - reserved)
  kBar1Total,
  kBar1Used,
  kBar1Free,
  // NVLink.
  kNvlinkBandwidthTotal,  // MB/s over the last collection interval, all links
  kNvlinkBandwidthLane,   // the same for link `index`
  kNvlinkCrcFlitErrors,
  kNvlinkCrcDataErrors,
  kNvlinkReplayErrors,
  kNvlinkRecoveryErrors,
  // Modes and identity (numbers).
  kComputeMode,
  kPersistenceMode,
  kMigMode,
  kCudaComputeCapability,  // major << 16 | minor, as DCGM stores it
  kMinorNumber,
  kNvmlIndex,
  kPciCombinedId,  // device << 16 | vendor
  kPciSubsysId,
  kDevCount,
  kCudaDriverVersion,  // 12040 = 12.4
  kVgpuLicenseStatus,  // a vGPU's: NVML has no value for a GPU (dcgm-exporter serves none either)
  // Identity (strings): a label with type `label`, else an info-style series (value="...").
  kDriverVersion,
  kNvmlVersion,
  kName,
  kBrand,
  kSerial,
  kUuid,
  kPciBusId,
  kVbiosVersion,
  kInforomImageVersion,
  kOemInforomVersion,
  kEccInforomVersion,
  kPowerInforomVersion,
  // DCGM_FI_PROF_* through GPM, between two collections; Counter::index is the GPM metric id.
  kProfRatio,  // GPM percent / 100
  kProfBytes,  // GPM MiB/s * 1048576 (bytes per second)
  // Exporter-owned families (dcgm-exporter's DCGM_EXP_*).
  kXidErrorsTotal,    // XIDs since the exporter started, by xid
  kXidErrorsCount,    // XIDs within ExporterOptions::xid_count_window, by xid
  kClockEventsCount,  // collections within clock_events_count_window with each reason active
  kClockEventsTotal,  // activations of each reason since the exporter started
  kGpuHealthStatus,   // per health system: 0 pass, 10 warn, 20 fail
  kP2pStatus,         // nvmlGpuP2PStatus_t towards each other GPU (NVLink capability)
};

struct Counter {
  std::string name;  // as written in the CSV: the metric name
  std::string type;  // gauge, counter, histogram, summary, label
  std::string help;
  Field field;
  unsigned index = 0;       // the link (kNvlinkBandwidthLane) or the GPM metric id (kProf*)
  bool base_units = false;  // a DCGM 4.7 name in base units: hertz, joules, ratio, bytes (not MHz, mJ, %, MiB)
};

// Whether a field's value is a string (served as a label, or as an info-style series).
bool IsStringField(Field field);
// Whether a field is one of the exporter's own DCGM_EXP_* families (several series per device).
bool IsExporterField(Field field);

// dcgm-exporter's default-counters.csv rows, plus the ECC counters and DCGM_EXP_XID_ERRORS_TOTAL
// (commented out or absent in dcgm-exporter's file; kgpu's alert rules need them).
const char* DefaultCountersCsv();

// Parses a counters CSV. Errors read "<origin>:<line>:<column>: ..." (escaped). DCGM fields kgpu
// knows but cannot produce (vGPU, NVSwitch, ...) are skipped: their names, as written, are
// appended to *skipped (see SummarizeSkipped); a name that is no DCGM field (a typo such as
// DCGM_FI_DEV_GPU_TMEP) is an error that suggests the nearest known name; a file that leaves no
// metric family to export is an error.
absl::StatusOr<std::vector<Counter>> ParseCounters(std::string_view csv, std::string_view origin,
                                                   std::vector<std::string>* skipped);
absl::StatusOr<std::vector<Counter>> LoadCountersFile(const std::string& path, std::vector<std::string>* skipped);

// One line for the log naming every skipped field, grouped by why, e.g. "2 DCGM field(s) of the
// counters file are omitted, as they need DCGM itself: vGPU (...): DCGM_FI_DEV_VGPU_UTILIZATIONS;
// NVSwitch (...): DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS". "" when nothing was skipped (log nothing).
std::string SummarizeSkipped(const std::vector<std::string>& skipped);

// The text of an XID as dcgm-exporter labels it (err_msg), from NVIDIA's XID catalogue.
const char* XidMessage(unsigned long long xid);

// dcgm-exporter's clock_event label for one reason bit (gpu_idle, power_cap, ...); nullptr for a
// bit it does not name.
const char* ClockEventName(uint64_t bit);
// The reason bits dcgm-exporter names, in bit order.
const std::vector<uint64_t>& ClockEventBits();
// dcgm-exporter's link_status label for an nvmlGpuP2PStatus_t value (OK, ChipsetNotSupported, ...).
const char* P2pStatusName(int status);
// The brand DCGM reports for an nvmlBrandType_t (Tesla, NVIDIA, GeForce RTX, ...).
const char* BrandName(int brand);

}  // namespace kgpu::exporter
