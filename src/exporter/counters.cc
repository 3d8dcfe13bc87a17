#include "exporter/counters.h"

#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>

#include "common/csv.h"
#include "common/files.h"
#include "common/strings.h"

namespace kgpu::exporter {
namespace {

struct Known {
  std::string name;
  Field field;
  unsigned index = 0;
  bool base_units = false;
};

// Every name of every field kgpu produces: DCGM's legacy name first, then DCGM 4.7's canonical
// name (dcgm_fields.h's deprecated-alias table; dcgm-exporter 4.9 writes them), then the 1.x
// lowercase name of 1.x-compatibility-metrics.csv. `base` marks the canonical names whose unit
// differs (go-dcgm's base-unit field tests: hertz for MHz, joules for mJ, ratio for %, bytes for
// MiB); the others keep the legacy unit.
std::vector<Known> BuildKnown() {
  std::vector<Known> k;
  auto add = [&](Field f, std::initializer_list<const char*> same_unit, const char* base = nullptr) {
    for (const char* n : same_unit) k.push_back({n, f, 0, false});
    if (base != nullptr) k.push_back({base, f, 0, true});
  };
  add(Field::kSmClock, {"DCGM_FI_DEV_SM_CLOCK", "dcgm_sm_clock"}, "DCGM_FI_DEV_SM_CLOCK_HERTZ");
  add(Field::kMemClock, {"DCGM_FI_DEV_MEM_CLOCK", "dcgm_memory_clock"}, "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ");
  add(Field::kVideoClock, {"DCGM_FI_DEV_VIDEO_CLOCK"}, "DCGM_FI_DEV_VIDEO_CLOCK_HERTZ");
  add(Field::kAppSmClock, {"DCGM_FI_DEV_APP_SM_CLOCK"}, "DCGM_FI_DEV_SM_APP_CLOCK_HERTZ");
  add(Field::kAppMemClock, {"DCGM_FI_DEV_APP_MEM_CLOCK"}, "DCGM_FI_DEV_MEMORY_APP_CLOCK_HERTZ");
  add(Field::kMaxSmClock, {"DCGM_FI_DEV_MAX_SM_CLOCK"}, "DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ");
  add(Field::kMaxMemClock, {"DCGM_FI_DEV_MAX_MEM_CLOCK"}, "DCGM_FI_DEV_MEMORY_MAX_CLOCK_HERTZ");
  add(Field::kMaxVideoClock, {"DCGM_FI_DEV_MAX_VIDEO_CLOCK"}, "DCGM_FI_DEV_VIDEO_MAX_CLOCK_HERTZ");
  add(Field::kClockEventReasons, {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"});
  add(Field::kMemoryTemp, {"DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "dcgm_memory_temp"});
  add(Field::kGpuTemp, {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "dcgm_gpu_temp"});
  add(Field::kMemMaxOpTemp, {"DCGM_FI_DEV_MEM_MAX_OP_TEMP", "DCGM_FI_DEV_MEMORY_MAX_OP_TEMP_CELSIUS"});
  add(Field::kGpuMaxOpTemp, {"DCGM_FI_DEV_GPU_MAX_OP_TEMP", "DCGM_FI_DEV_GPU_MAX_OP_TEMP_CELSIUS"});
  add(Field::kSlowdownTemp, {"DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS"});
  add(Field::kShutdownTemp, {"DCGM_FI_DEV_SHUTDOWN_TEMP", "DCGM_FI_DEV_GPU_TEMP_SHUTDOWN_CELSIUS"});
  add(Field::kPowerUsage, {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", "dcgm_power_usage"});
  add(Field::kTotalEnergy, {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "dcgm_total_energy_consumption"},
      "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL");
  add(Field::kPowerMgmtLimit, {"DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS"});
  add(Field::kPowerMgmtLimitMin, {"DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", "DCGM_FI_DEV_BOARD_POWER_LIMIT_MIN_WATTS"});
  add(Field::kPowerMgmtLimitMax, {"DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "DCGM_FI_DEV_BOARD_POWER_LIMIT_MAX_WATTS"});
  add(Field::kPowerMgmtLimitDef, {"DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "DCGM_FI_DEV_BOARD_POWER_LIMIT_DEFAULT_WATTS"});
  add(Field::kEnforcedPowerLimit, {"DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS"});
  add(Field::kPstate, {"DCGM_FI_DEV_PSTATE", "DCGM_FI_DEV_GPU_PSTATE"});
  add(Field::kFanSpeed, {"DCGM_FI_DEV_FAN_SPEED"}, "DCGM_FI_DEV_FAN_SPEED_RATIO");
  add(Field::kPcieReplay,
      {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "dcgm_pcie_replay_counter"});
  add(Field::kPcieTxThroughput, {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT"});
  add(Field::kPcieRxThroughput, {"DCGM_FI_DEV_PCIE_RX_THROUGHPUT"});
  add(Field::kPcieMaxLinkGen, {"DCGM_FI_DEV_PCIE_MAX_LINK_GEN"});
  add(Field::kPcieMaxLinkWidth, {"DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"});
  add(Field::kPcieLinkGen, {"DCGM_FI_DEV_PCIE_LINK_GEN"});
  add(Field::kPcieLinkWidth, {"DCGM_FI_DEV_PCIE_LINK_WIDTH"});
  add(Field::kGpuUtil, {"DCGM_FI_DEV_GPU_UTIL", "dcgm_gpu_utilization"}, "DCGM_FI_DEV_GPU_UTIL_RATIO");
  add(Field::kMemCopyUtil, {"DCGM_FI_DEV_MEM_COPY_UTIL", "dcgm_mem_copy_utilization"}, "DCGM_FI_DEV_MEMORY_UTIL_RATIO");
  add(Field::kEncUtil, {"DCGM_FI_DEV_ENC_UTIL", "dcgm_enc_utilization"}, "DCGM_FI_DEV_ENC_UTIL_RATIO");
  add(Field::kDecUtil, {"DCGM_FI_DEV_DEC_UTIL", "dcgm_dec_utilization"}, "DCGM_FI_DEV_DEC_UTIL_RATIO");
  add(Field::kPowerViolation, {"DCGM_FI_DEV_POWER_VIOLATION"});
  add(Field::kThermalViolation, {"DCGM_FI_DEV_THERMAL_VIOLATION"});
  add(Field::kSyncBoostViolation, {"DCGM_FI_DEV_SYNC_BOOST_VIOLATION"});
  add(Field::kBoardLimitViolation, {"DCGM_FI_DEV_BOARD_LIMIT_VIOLATION"});
  add(Field::kLowUtilViolation, {"DCGM_FI_DEV_LOW_UTIL_VIOLATION"});
  add(Field::kReliabilityViolation, {"DCGM_FI_DEV_RELIABILITY_VIOLATION"});
  add(Field::kTotalAppClocksViolation, {"DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION"});
  add(Field::kTotalBaseClocksViolation, {"DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION"});
  add(Field::kXidErrors, {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR", "dcgm_xid_errors"});
  add(Field::kEccCurrent, {"DCGM_FI_DEV_ECC_CURRENT", "DCGM_FI_DEV_ECC_MODE"});
  add(Field::kEccPending, {"DCGM_FI_DEV_ECC_PENDING"});
  add(Field::kEccSbeVol, {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"});
  add(Field::kEccDbeVol, {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"});
  add(Field::kEccSbeAgg, {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"});
  add(Field::kEccDbeAgg, {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"});
  add(Field::kRetiredSbe, {"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL"});
  add(Field::kRetiredDbe, {"DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL"});
  add(Field::kRetiredPending, {"DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_PAGE_RETIRED_PENDING"});
  add(Field::kUncorrectableRemappedRows,
      {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"});
  add(Field::kCorrectableRemappedRows,
      {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL"});
  add(Field::kRowRemapFailure, {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"});
  add(Field::kFbTotal, {"DCGM_FI_DEV_FB_TOTAL"}, "DCGM_FI_DEV_FB_CAPACITY_BYTES");
  add(Field::kFbFree, {"DCGM_FI_DEV_FB_FREE", "dcgm_fb_free"}, "DCGM_FI_DEV_FB_FREE_BYTES");
  add(Field::kFbUsed, {"DCGM_FI_DEV_FB_USED", "dcgm_fb_used"}, "DCGM_FI_DEV_FB_USED_BYTES");
  add(Field::kFbReserved, {"DCGM_FI_DEV_FB_RESERVED"}, "DCGM_FI_DEV_FB_RESERVED_BYTES");
  add(Field::kFbUsedPercent, {"DCGM_FI_DEV_FB_USED_PERCENT", "DCGM_FI_DEV_FB_USED_RATIO"});
  add(Field::kBar1Total, {"DCGM_FI_DEV_BAR1_TOTAL"}, "DCGM_FI_DEV_BAR1_CAPACITY_BYTES");
  add(Field::kBar1Used, {"DCGM_FI_DEV_BAR1_USED"}, "DCGM_FI_DEV_BAR1_USED_BYTES");
  add(Field::kBar1Free, {"DCGM_FI_DEV_BAR1_FREE"}, "DCGM_FI_DEV_BAR1_FREE_BYTES");
  add(Field::kNvlinkBandwidthTotal,
      {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", "dcgm_nvlink_bandwidth_total"},
      "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND");
  for (unsigned lane = 0; lane < 18; ++lane) {
    k.push_back({Cat("DCGM_FI_DEV_NVLINK_BANDWIDTH_L", lane), Field::kNvlinkBandwidthLane, lane, false});
    k.push_back({Cat("DCGM_FI_DEV_NVLINK_THROUGHPUT_L", lane), Field::kNvlinkBandwidthLane, lane, false});
  }
  add(Field::kNvlinkCrcFlitErrors,
      {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL"});
  add(Field::kNvlinkCrcDataErrors,
      {"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL"});
  add(Field::kNvlinkReplayErrors,
      {"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL"});
  add(Field::kNvlinkRecoveryErrors,
      {"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL"});
  add(Field::kComputeMode, {"DCGM_FI_DEV_COMPUTE_MODE", "DCGM_FI_DEV_GPU_COMPUTE_MODE"});
  add(Field::kPersistenceMode, {"DCGM_FI_DEV_PERSISTENCE_MODE", "DCGM_FI_DEV_GPU_PERSISTENCE_MODE"});
  add(Field::kMigMode, {"DCGM_FI_DEV_MIG_MODE"});
  add(Field::kCudaComputeCapability, {"DCGM_FI_DEV_CUDA_COMPUTE_CAPABILITY", "DCGM_FI_CUDA_GPU_COMPUTE_CAPABILITY"});
  add(Field::kMinorNumber, {"DCGM_FI_DEV_MINOR_NUMBER", "DCGM_FI_DEV_GPU_MINOR_NUMBER"});
  add(Field::kNvmlIndex, {"DCGM_FI_DEV_NVML_INDEX"});
  add(Field::kPciCombinedId, {"DCGM_FI_DEV_PCI_COMBINED_ID"});
  add(Field::kPciSubsysId, {"DCGM_FI_DEV_PCI_SUBSYS_ID"});
  add(Field::kDevCount, {"DCGM_FI_DEV_COUNT", "DCGM_FI_SYSTEM_GPU_QUANTITY"});
  add(Field::kCudaDriverVersion, {"DCGM_FI_CUDA_DRIVER_VERSION"});
  add(Field::kVgpuLicenseStatus, {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"});
  add(Field::kDriverVersion, {"DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION"});
  add(Field::kNvmlVersion, {"DCGM_FI_NVML_VERSION", "DCGM_FI_SYSTEM_NVML_VERSION"});
  add(Field::kName, {"DCGM_FI_DEV_NAME", "DCGM_FI_DEV_GPU_NAME"});
  add(Field::kBrand, {"DCGM_FI_DEV_BRAND", "DCGM_FI_DEV_GPU_BRAND"});
  add(Field::kSerial, {"DCGM_FI_DEV_SERIAL", "DCGM_FI_DEV_BOARD_SERIAL"});
  add(Field::kUuid, {"DCGM_FI_DEV_UUID", "DCGM_FI_DEV_GPU_UUID"});
  add(Field::kPciBusId, {"DCGM_FI_DEV_PCI_BUSID", "DCGM_FI_DEV_PCI_BUS_ID"});
  add(Field::kVbiosVersion, {"DCGM_FI_DEV_VBIOS_VERSION"});
  add(Field::kInforomImageVersion, {"DCGM_FI_DEV_INFOROM_IMAGE_VER", "DCGM_FI_DEV_INFOROM_IMAGE_VERSION"});
  add(Field::kOemInforomVersion, {"DCGM_FI_DEV_OEM_INFOROM_VER", "DCGM_FI_DEV_INFOROM_OEM_VERSION"});
  add(Field::kEccInforomVersion, {"DCGM_FI_DEV_ECC_INFOROM_VER", "DCGM_FI_DEV_INFOROM_ECC_VERSION"});
  add(Field::kPowerInforomVersion, {"DCGM_FI_DEV_POWER_INFOROM_VER", "DCGM_FI_DEV_INFOROM_POWER_VERSION"});
  // DCGM's profiling fields and the GPM metric each one is (ids from nvml.h's NVML_GPM_METRIC_*).
  auto prof = [&](Field f, unsigned gpm, std::initializer_list<const char*> names) {
    for (const char* n : names) k.push_back({n, f, gpm, false});
  };
  prof(Field::kProfRatio, 1,
       {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", "dcgm_fi_prof_gr_engine_active"});
  prof(Field::kProfRatio, 2, {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"});
  prof(Field::kProfRatio, 3, {"DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"});
  prof(Field::kProfRatio, 5,
       {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO", "dcgm_fi_prof_pipe_tensor_active"});
  prof(Field::kProfRatio, 10, {"DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO", "dcgm_fi_prof_dram_active"});
  prof(Field::kProfRatio, 11, {"DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_FP64_UTIL_RATIO"});
  prof(Field::kProfRatio, 12, {"DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_FP32_UTIL_RATIO"});
  prof(Field::kProfRatio, 13, {"DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_FP16_UTIL_RATIO"});
  prof(Field::kProfRatio, 9, {"DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "DCGM_FI_PROF_IMMA_UTIL_RATIO"});
  prof(Field::kProfRatio, 7, {"DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "DCGM_FI_PROF_HMMA_UTIL_RATIO"});
  prof(Field::kProfRatio, 6, {"DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", "DCGM_FI_PROF_DFMA_UTIL_RATIO"});
  prof(Field::kProfRatio, 4, {"DCGM_FI_PROF_PIPE_INT_ACTIVE", "DCGM_FI_PROF_INT_UTIL_RATIO"});
  for (unsigned n = 0; n < 8; ++n) {
    k.push_back({Cat("DCGM_FI_PROF_NVDEC", n, "_ACTIVE"), Field::kProfRatio, 30 + n, false});
    k.push_back({Cat("DCGM_FI_PROF_NVDEC_UTIL_", n, "_RATIO"), Field::kProfRatio, 30 + n, false});
    k.push_back({Cat("DCGM_FI_PROF_NVJPG", n, "_ACTIVE"), Field::kProfRatio, 40 + n, false});
    k.push_back({Cat("DCGM_FI_PROF_NVJPG_UTIL_", n, "_RATIO"), Field::kProfRatio, 40 + n, false});
  }
  for (unsigned n = 0; n < 2; ++n) {
    k.push_back({Cat("DCGM_FI_PROF_NVOFA", n, "_ACTIVE"), Field::kProfRatio, 50 + n, false});
    k.push_back({Cat("DCGM_FI_PROF_NVOFA_UTIL_", n, "_RATIO"), Field::kProfRatio, 50 + n, false});
  }
  // dcgm-exporter 4.10 renamed the PCIe and NVLink rates *_PER_SECOND (same unit: bytes/s).
  prof(Field::kProfBytes, 20,
       {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", "dcgm_fi_prof_pcie_tx_bytes"});
  prof(Field::kProfBytes, 21,
       {"DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND", "dcgm_fi_prof_pcie_rx_bytes"});
  prof(Field::kProfBytes, 61, {"DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND"});
  prof(Field::kProfBytes, 60, {"DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND"});
  add(Field::kXidErrorsTotal, {"DCGM_EXP_XID_ERRORS_TOTAL"});
  add(Field::kXidErrorsCount, {"DCGM_EXP_XID_ERRORS_COUNT"});
  add(Field::kClockEventsCount, {"DCGM_EXP_CLOCK_EVENTS_COUNT"});
  add(Field::kClockEventsTotal, {"DCGM_EXP_CLOCK_EVENTS_TOTAL"});
  add(Field::kGpuHealthStatus, {"DCGM_EXP_GPU_HEALTH_STATUS"});
  add(Field::kP2pStatus, {"DCGM_EXP_P2P_STATUS"});
  return k;
}

const std::vector<Known>& KnownFields() {
  static const std::vector<Known> known = BuildKnown();
  return known;
}

const Known* FindKnown(const std::string& name) {
  for (const auto& k : KnownFields()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

// Why a DCGM field is omitted: it needs DCGM itself.
constexpr const char* kVgpu = "vGPU (NVML gives them for vGPU instances, not for a GPU)";
constexpr const char* kNvswitch = "NVSwitch (DCGM's NVSwitch module)";
constexpr const char* kLanes = "per-lane NVLink error counters (DCGM's per-link entities)";
constexpr const char* kModule = "Grace module power (DCGM's CPU module)";
constexpr const char* kDcgm = "DCGM's own bookkeeping (process accounting, samples, topology blobs)";

struct Elsewhere {
  const char* name;
  const char* reason;
};
// DCGM field names kgpu does not produce: a dcgm-exporter CSV that lists them works, and they are
// omitted. Names from DCGM's dcgm_fields.h; per-lane, per-port and per-engine families are
// generated in KnownElsewhere().
constexpr Elsewhere kDcgmOnly[] = {
    {"DCGM_FI_UNKNOWN", kDcgm},
    {"DCGM_FI_PROCESS_NAME", kDcgm},
    {"DCGM_FI_GPU_TOPOLOGY_PCI", kDcgm},
    {"DCGM_FI_GPU_TOPOLOGY_NVLINK", kDcgm},
    {"DCGM_FI_GPU_TOPOLOGY_AFFINITY", kDcgm},
    {"DCGM_FI_DEV_CUDA_VISIBLE_DEVICES_STR", kDcgm},
    {"DCGM_FI_DEV_INFOROM_CONFIG_CHECK", kDcgm},
    {"DCGM_FI_DEV_INFOROM_CONFIG_VALID", kDcgm},
    {"DCGM_FI_SYNC_BOOST", kDcgm},
    {"DCGM_FI_DEV_AUTOBOOST", kDcgm},
    {"DCGM_FI_DEV_SUPPORTED_CLOCKS", kDcgm},
    {"DCGM_FI_DEV_ACCOUNTING_DATA", kDcgm},
    {"DCGM_FI_DEV_MEM_COPY_UTIL_SAMPLES", kDcgm},
    {"DCGM_FI_DEV_GPU_UTIL_SAMPLES", kDcgm},
    {"DCGM_FI_DEV_GRAPHICS_PIDS", kDcgm},
    {"DCGM_FI_DEV_COMPUTE_PIDS", kDcgm},
    {"DCGM_FI_DEV_GPU_NVLINK_ERRORS", kDcgm},
    {"DCGM_FI_DEV_ENC_STATS", kDcgm},
    {"DCGM_FI_DEV_FBC_STATS", kDcgm},
    {"DCGM_FI_DEV_FBC_SESSIONS_INFO", kDcgm},
    {"DCGM_FI_DEV_VIRTUAL_MODE", kVgpu},
    {"DCGM_FI_DEV_SUPPORTED_TYPE_INFO", kVgpu},
    {"DCGM_FI_DEV_CREATABLE_VGPU_TYPE_IDS", kVgpu},
    {"DCGM_FI_DEV_VGPU_INSTANCE_IDS", kVgpu},
    {"DCGM_FI_DEV_VGPU_UTILIZATIONS", kVgpu},
    {"DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION", kVgpu},
    {"DCGM_FI_DEV_VGPU_VM_ID", kVgpu},
    {"DCGM_FI_DEV_VGPU_VM_NAME", kVgpu},
    {"DCGM_FI_DEV_VGPU_TYPE", kVgpu},
    {"DCGM_FI_DEV_VGPU_UUID", kVgpu},
    {"DCGM_FI_DEV_VGPU_DRIVER_VERSION", kVgpu},
    {"DCGM_FI_DEV_VGPU_MEMORY_USAGE", kVgpu},
    {"DCGM_FI_DEV_VGPU_FRAME_RATE_LIMIT", kVgpu},
    {"DCGM_FI_DEV_VGPU_ENC_STATS", kVgpu},
    {"DCGM_FI_DEV_VGPU_ENC_SESSIONS_INFO", kVgpu},
    {"DCGM_FI_DEV_VGPU_FBC_STATS", kVgpu},
    {"DCGM_FI_DEV_VGPU_FBC_SESSIONS_INFO", kVgpu},
    {"DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS", kNvswitch},
    {"DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS", kNvswitch},
    {"DCGM_FI_DEV_SYSIO_POWER_UTIL_CURRENT", kModule},
    {"DCGM_FI_DEV_MODULE_POWER_UTIL_CURRENT", kModule},
};

// Every DCGM field name kgpu knows and does not produce, with why: kDcgmOnly and the indexed families.
const std::vector<std::pair<std::string, const char*>>& KnownElsewhere() {
  static const std::vector<std::pair<std::string, const char*>> names = [] {
    std::vector<std::pair<std::string, const char*>> out;
    for (const auto& e : kDcgmOnly) out.emplace_back(e.name, e.reason);
    for (int i = 0; i < 8; ++i) out.emplace_back(Cat("DCGM_FI_DEV_CPU_AFFINITY_", i), kDcgm);
    for (const char* kind : {"CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY"}) {
      for (int lane = 0; lane < 18; ++lane) {
        out.emplace_back(Cat("DCGM_FI_DEV_NVLINK_", kind, "_ERROR_COUNT_L", lane), kLanes);
      }
    }
    for (int port = 0; port < 18; ++port) {
      const std::string p = Cat(port < 10 ? "P0" : "P", port);
      for (const char* bin : {"LOW", "MED", "HIGH", "MAX"}) {
        out.emplace_back(Cat("DCGM_FI_DEV_NVSWITCH_LATENCY_", bin, "_", p), kNvswitch);
      }
      for (const char* dir : {"TX", "RX"}) {
        for (int counter = 0; counter < 2; ++counter) {
          out.emplace_back(Cat("DCGM_FI_DEV_NVSWITCH_BANDWIDTH_", dir, "_", counter, "_", p), kNvswitch);
        }
      }
    }
    return out;
  }();
  return names;
}

// Why kgpu omits `name`, or nullptr when it is no DCGM field kgpu knows of.
const char* OmitReason(std::string_view name) {
  for (const auto& [n, reason] : KnownElsewhere()) {
    if (n == name) return reason;
  }
  return nullptr;
}

// The known name nearest to `name` (kgpu's own first), as " (did you mean X?)", or "".
std::string Suggestion(const std::string& name) {
  std::vector<std::string> candidates;
  for (const auto& k : KnownFields()) candidates.push_back(k.name);
  for (const auto& e : KnownElsewhere()) candidates.push_back(e.first);
  const std::string near = Nearest(name, candidates, std::max<size_t>(3, name.size() / 4));
  return near.empty() ? "" : Cat(" (did you mean ", near, "?)");
}

constexpr const char* kDefaultCsv = R"(# Format: DCGM field, Prometheus metric type, help message
# dcgm-exporter's default-counters.csv, in its order
DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE,              gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_ENC_UTIL,      gauge, Encoder utilization (in %).
DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_FB_RESERVED, gauge, Framebuffer memory reserved (in MiB).
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, Total number of NVLink bandwidth counters for all lanes.
DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge, Whether remapping of rows has failed
DCGM_FI_DRIVER_VERSION,        label, Driver Version
DCGM_FI_PROF_GR_ENGINE_ACTIVE,   gauge, Ratio of time the graphics engine is active.
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE,        gauge, Ratio of cycles the device memory interface is active sending or receiving data.
DCGM_FI_PROF_PCIE_TX_BYTES,      gauge, The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
DCGM_FI_PROF_PCIE_RX_BYTES,      gauge, The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
# kgpu: enabled by default, for the ECC and XID alerts
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, counter, Total number of single-bit persistent ECC errors.
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL, counter, Total number of double-bit persistent ECC errors.
DCGM_EXP_XID_ERRORS_TOTAL, counter, Total number of XID errors by XID code since the exporter started.
)";

std::string Trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// "<origin>:<line>:<column>: <what>", escaped.
absl::Status At(std::string_view origin, int line, size_t column, std::string_view what) {
  return absl::InvalidArgumentError(Printable(Cat(origin, ":", line, ":", column, ": ", what)));
}

}  // namespace

const char* DefaultCountersCsv() {
  return kDefaultCsv;
}

absl::StatusOr<std::vector<Counter>> ParseCounters(std::string_view csv, std::string_view origin,
                                                   std::vector<std::string>* skipped) {
  std::vector<Counter> out;
  std::map<std::string, int> seen;
  // Read as dcgm-exporter reads it: Go's encoding/csv with Comment '#' (common/csv.h), the whole
  // file first (as ReadAll), then 3 fields per record. A help text that holds a comma is quoted,
  // the quote right after the comma: DCGM_FI_DEV_GPU_TEMP, gauge,"GPU temperature, in C."
  CsvOptions csv_options;
  csv_options.comment = '#';
  csv_options.fields_per_record = -1;  // counted below, in this file's words
  auto rows = ReadCsv(csv, origin, csv_options);
  if (!rows.ok()) return rows.status();
  const int records = static_cast<int>(rows->size());
  for (const CsvRecord& row : *rows) {
    const int line_no = row.line;
    // Fields trimmed as dcgm-exporter trims them; columns[i]: the 1-based column where field i's
    // text starts (after its opening quote and blanks).
    std::vector<std::string> fields;
    std::vector<size_t> columns;
    for (size_t i = 0; i < row.fields.size(); ++i) {
      const std::string& raw = row.fields[i];
      const size_t lead = std::min(raw.find_first_not_of(" \t"), raw.size());
      const CsvPosition& at = row.positions[i];
      columns.push_back(static_cast<size_t>(at.column) + (at.quoted ? 1 : 0) + lead);
      fields.push_back(Trim(raw));
    }
    if (fields.size() != 3) {
      if (fields[0].starts_with('#')) {
        return At(origin, line_no, columns[0],
                  "'#' starts a comment only as the first character of a line (dcgm-exporter reads this line as a "
                  "record too): remove the blanks before it");
      }
      return At(origin, line_no, columns[0],
                Cat("malformed CSV record, expected 3 fields (DCGM field, type, help), got ", fields.size(),
                    fields.size() > 3 ? " (quote a help text that holds a comma, the quote right after the comma: "
                                        ",\"a, b\")"
                                      : ""));
    }
    const std::string& name = fields[0];
    const std::string& type = fields[1];
    if (type != "gauge" && type != "counter" && type != "label" && type != "histogram" && type != "summary") {
      return At(origin, line_no, columns[1],
                Cat("type '", type, "' of ", name, " is not gauge, counter, histogram, summary or label"));
    }
    const Known* known = FindKnown(name);
    const char* omit = known == nullptr ? OmitReason(name) : nullptr;
    if (known == nullptr && omit == nullptr && name.rfind("DCGM_FI_", 0) != 0 && name.rfind("DCGM_EXP_", 0) != 0) {
      return At(origin, line_no, columns[0],
                Cat("'", name, "' is not a DCGM field name (DCGM_FI_... or DCGM_EXP_...)", Suggestion(name)));
    }
    if (auto [it, inserted] = seen.emplace(name, line_no); !inserted) {
      return At(origin, line_no, columns[0], Cat(name, " is listed twice (first on line ", it->second, ")"));
    }
    if (known == nullptr) {
      if (omit == nullptr) {
        return At(origin, line_no, columns[0],
                  Cat("unknown DCGM field ", name, Suggestion(name),
                      "; fix the name, or remove the row (kgpu exports the fields in its default counters, "
                      "see docs/exporter.md)"));
      }
      if (skipped != nullptr) skipped->push_back(name);
      continue;
    }
    // dcgm-exporter makes any field a label; its own families have several series per device.
    if (IsExporterField(known->field) && type == "label") {
      return At(origin, line_no, columns[1],
                Cat(name, " cannot be a label: it is a family of its own (use gauge or counter)"));
    }
    out.push_back({name, type, fields[2], known->field, known->index, known->base_units});
  }
  const bool families = std::any_of(out.begin(), out.end(), [](const Counter& c) { return c.type != "label"; });
  if (!families) {
    return At(origin, 1, 1,
              records == 0 ? "the counters file lists no fields: the exporter would serve no GPU metrics (use the "
                             "built-in default by leaving -f / DCGM_EXPORTER_COLLECTORS unset)"
                           : Cat("none of the ", records,
                                 " fields of the counters file is one kgpu exports: the "
                                 "exporter would serve no GPU metrics (add fields such as DCGM_FI_DEV_GPU_UTIL, or "
                                 "leave -f unset for the built-in default)"));
  }
  return out;
}

absl::StatusOr<std::vector<Counter>> LoadCountersFile(const std::string& path, std::vector<std::string>* skipped) {
  auto text = ReadInputFile(path, "counters file", "check -f / DCGM_EXPORTER_COLLECTORS");
  if (!text.ok()) return text.status();
  return ParseCounters(*text, path, skipped);
}

std::string SummarizeSkipped(const std::vector<std::string>& skipped) {
  if (skipped.empty()) return "";
  // Reasons in the order they first appear, each with its fields.
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const std::string& name : skipped) {
    const char* why = OmitReason(name);
    const std::string reason = why != nullptr ? why : "not in NVML";
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == reason; });
    if (it == groups.end()) it = groups.emplace(groups.end(), reason, std::vector<std::string>{});
    it->second.push_back(name);
  }
  std::string out = Cat(skipped.size(), " DCGM field(s) of the counters file are omitted, as they need DCGM itself: ");
  for (size_t i = 0; i < groups.size(); ++i) {
    out += Cat(i == 0 ? "" : "; ", groups[i].first, ": ", Join(groups[i].second, ", "));
  }
  return out;
}

bool IsStringField(Field field) {
  switch (field) {
    case Field::kDriverVersion:
    case Field::kNvmlVersion:
    case Field::kName:
    case Field::kBrand:
    case Field::kSerial:
    case Field::kUuid:
    case Field::kPciBusId:
    case Field::kVbiosVersion:
    case Field::kInforomImageVersion:
    case Field::kOemInforomVersion:
    case Field::kEccInforomVersion:
    case Field::kPowerInforomVersion:
      return true;
    default:
      return false;
  }
}

bool IsExporterField(Field field) {
  switch (field) {
    case Field::kXidErrorsTotal:
    case Field::kXidErrorsCount:
    case Field::kClockEventsCount:
    case Field::kClockEventsTotal:
    case Field::kGpuHealthStatus:
    case Field::kP2pStatus:
      return true;
    default:
      return false;
  }
}

// dcgm-exporter's names of the clock-event reason bits (internal/pkg/collector/
// clock_events_collector.go, from DCGM's DCGM_CLOCKS_EVENT_REASON_* / nvml.h's
// nvmlClocksEventReason* bits).
constexpr std::pair<uint64_t, const char*> kClockEvents[] = {
    {0x1, "gpu_idle"},    {0x2, "clocks_setting"},  {0x4, "power_cap"},
    {0x8, "hw_slowdown"}, {0x10, "sync_boost"},     {0x20, "sw_thermal"},
    {0x40, "hw_thermal"}, {0x80, "hw_power_brake"}, {0x100, "display_clocks"},
};

const char* ClockEventName(uint64_t bit) {
  for (const auto& [b, name] : kClockEvents) {
    if (b == bit) return name;
  }
  return nullptr;
}

const std::vector<uint64_t>& ClockEventBits() {
  static const std::vector<uint64_t> bits = [] {
    std::vector<uint64_t> out;
    for (const auto& e : kClockEvents) out.push_back(e.first);
    return out;
  }();
  return bits;
}

// dcgm-exporter's link_status values (internal/pkg/collector/p2p_status_collector.go), in
// nvmlGpuP2PStatus_t order.
const char* P2pStatusName(int status) {
  switch (status) {
    case 0:
      return "OK";
    case 1:
      return "ChipsetNotSupported";
    case 2:
      return "GPUNotSupported";
    case 3:
      return "TopologyNotSupported";
    case 4:
      return "DisabledByRegKey";
    case 5:
      return "NotSupported";
    default:
      return "Unknown";
  }
}

// nvmlBrandType_t as nvidia-smi -q names it ("Product Brand").
const char* BrandName(int brand) {
  static constexpr const char* kNames[] = {"Unknown",
                                           "Quadro",
                                           "Tesla",
                                           "NVS",
                                           "Grid",
                                           "GeForce",
                                           "Titan",
                                           "NVIDIA Virtual Applications",
                                           "NVIDIA Virtual PC",
                                           "NVIDIA Virtual Compute Server",
                                           "NVIDIA RTX Virtual Workstation",
                                           "NVIDIA Cloud Gaming",
                                           "Quadro RTX",
                                           "NVIDIA RTX",
                                           "NVIDIA",
                                           "GeForce RTX",
                                           "Titan RTX"};
  if (brand < 0 || brand >= static_cast<int>(std::size(kNames))) return "Unknown";
  return kNames[brand];
}

const char* XidMessage(unsigned long long xid) {
  switch (xid) {
    case 0:
      return "No Error";
    case 13:
      return "Graphics Engine Exception";
    case 31:
      return "GPU memory page fault";
    case 32:
      return "Invalid or corrupted push buffer stream";
    case 38:
      return "Driver firmware error";
    case 43:
      return "GPU stopped processing";
    case 45:
      return "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda applications "
             "and hitting a DBE";
    case 48:
      return "Double Bit ECC Error";
    case 61:
      return "Internal micro-controller breakpoint/warning (newer drivers)";
    case 62:
      return "Internal micro-controller halt (newer drivers)";
    case 63:
      return "ECC page retirement or row remapping recording event";
    case 64:
      return "ECC page retirement or row remapper recording failure";
    case 68:
      return "NVDEC0 Exception";
    case 69:
      return "Graphics Engine class error";
    case 74:
      return "NVLINK Error";
    case 79:
      return "GPU has fallen off the bus";
    case 92:
      return "High single-bit ECC error rate";
    case 94:
      return "Contained ECC error";
    case 95:
      return "Uncontained ECC error";
    case 109:
      return "Context Switch Timeout Error";
    case 119:
      return "GSP RPC Timeout";
    case 120:
      return "GSP Error";
    default:
      return "Unknown Error";
  }
}

}  // namespace kgpu::exporter
