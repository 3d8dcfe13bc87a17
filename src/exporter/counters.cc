#include "exporter/counters.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "common/files.h"
#include "common/strings.h"

namespace kgpu::exporter {
namespace {

struct Known {
  const char* name;
  Field field;
};
// Every DCGM field name kgpu produces (and its aliases in newer DCGM headers).
constexpr Known kKnown[] = {
    {"DCGM_FI_DEV_SM_CLOCK", Field::kSmClock},
    {"DCGM_FI_DEV_MEM_CLOCK", Field::kMemClock},
    {"DCGM_FI_DEV_MEMORY_TEMP", Field::kMemoryTemp},
    {"DCGM_FI_DEV_GPU_TEMP", Field::kGpuTemp},
    {"DCGM_FI_DEV_POWER_USAGE", Field::kPowerUsage},
    {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", Field::kTotalEnergy},
    {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Field::kPcieReplay},
    {"DCGM_FI_DEV_GPU_UTIL", Field::kGpuUtil},
    {"DCGM_FI_DEV_MEM_COPY_UTIL", Field::kMemCopyUtil},
    {"DCGM_FI_DEV_ENC_UTIL", Field::kEncUtil},
    {"DCGM_FI_DEV_DEC_UTIL", Field::kDecUtil},
    {"DCGM_FI_DEV_XID_ERRORS", Field::kXidErrors},
    {"DCGM_FI_DEV_FB_FREE", Field::kFbFree},
    {"DCGM_FI_DEV_FB_USED", Field::kFbUsed},
    {"DCGM_FI_DEV_FB_RESERVED", Field::kFbReserved},
    {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", Field::kNvlinkBandwidthTotal},
    {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", Field::kUncorrectableRemappedRows},
    {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", Field::kCorrectableRemappedRows},
    {"DCGM_FI_DEV_ROW_REMAP_FAILURE", Field::kRowRemapFailure},
    {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", Field::kEccSbeVol},
    {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Field::kEccDbeVol},
    {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", Field::kEccSbeAgg},
    {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", Field::kEccDbeAgg},
    {"DCGM_EXP_XID_ERRORS_TOTAL", Field::kXidErrorsTotal},
    {"DCGM_FI_DRIVER_VERSION", Field::kDriverVersion},
};

// DCGM field names kgpu does not produce (DCGM's profiling module, vGPU, NVSwitch, inforom, ...):
// a dcgm-exporter CSV that lists them works, and they are omitted. Names from DCGM's
// dcgm_fields.h; per-lane, per-port and per-engine families are generated in KnownElsewhere().
constexpr const char* kDcgmOnly[] = {
    "DCGM_FI_UNKNOWN",
    "DCGM_FI_NVML_VERSION",
    "DCGM_FI_PROCESS_NAME",
    "DCGM_FI_DEV_COUNT",
    "DCGM_FI_CUDA_DRIVER_VERSION",
    "DCGM_FI_DEV_NAME",
    "DCGM_FI_DEV_BRAND",
    "DCGM_FI_DEV_NVML_INDEX",
    "DCGM_FI_DEV_SERIAL",
    "DCGM_FI_DEV_UUID",
    "DCGM_FI_DEV_MINOR_NUMBER",
    "DCGM_FI_DEV_OEM_INFOROM_VER",
    "DCGM_FI_DEV_PCI_BUSID",
    "DCGM_FI_DEV_PCI_COMBINED_ID",
    "DCGM_FI_DEV_PCI_SUBSYS_ID",
    "DCGM_FI_GPU_TOPOLOGY_PCI",
    "DCGM_FI_GPU_TOPOLOGY_NVLINK",
    "DCGM_FI_GPU_TOPOLOGY_AFFINITY",
    "DCGM_FI_DEV_CUDA_COMPUTE_CAPABILITY",
    "DCGM_FI_DEV_COMPUTE_MODE",
    "DCGM_FI_DEV_PERSISTENCE_MODE",
    "DCGM_FI_DEV_MIG_MODE",
    "DCGM_FI_DEV_CUDA_VISIBLE_DEVICES_STR",
    "DCGM_FI_DEV_ECC_INFOROM_VER",
    "DCGM_FI_DEV_POWER_INFOROM_VER",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER",
    "DCGM_FI_DEV_INFOROM_CONFIG_CHECK",
    "DCGM_FI_DEV_INFOROM_CONFIG_VALID",
    "DCGM_FI_DEV_VBIOS_VERSION",
    "DCGM_FI_DEV_BAR1_TOTAL",
    "DCGM_FI_SYNC_BOOST",
    "DCGM_FI_DEV_BAR1_USED",
    "DCGM_FI_DEV_BAR1_FREE",
    "DCGM_FI_DEV_VIDEO_CLOCK",
    "DCGM_FI_DEV_APP_SM_CLOCK",
    "DCGM_FI_DEV_APP_MEM_CLOCK",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_MAX_SM_CLOCK",
    "DCGM_FI_DEV_MAX_MEM_CLOCK",
    "DCGM_FI_DEV_MAX_VIDEO_CLOCK",
    "DCGM_FI_DEV_AUTOBOOST",
    "DCGM_FI_DEV_SUPPORTED_CLOCKS",
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP",
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP",
    "DCGM_FI_DEV_SLOWDOWN_TEMP",
    "DCGM_FI_DEV_SHUTDOWN_TEMP",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "DCGM_FI_DEV_PSTATE",
    "DCGM_FI_DEV_FAN_SPEED",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_ACCOUNTING_DATA",
    "DCGM_FI_DEV_MEM_COPY_UTIL_SAMPLES",
    "DCGM_FI_DEV_GPU_UTIL_SAMPLES",
    "DCGM_FI_DEV_GRAPHICS_PIDS",
    "DCGM_FI_DEV_COMPUTE_PIDS",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION",
    "DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION",
    "DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_FB_USED_PERCENT",
    "DCGM_FI_DEV_ECC_CURRENT",
    "DCGM_FI_DEV_ECC_PENDING",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_GPU_NVLINK_ERRORS",
    "DCGM_FI_DEV_VIRTUAL_MODE",
    "DCGM_FI_DEV_SUPPORTED_TYPE_INFO",
    "DCGM_FI_DEV_CREATABLE_VGPU_TYPE_IDS",
    "DCGM_FI_DEV_VGPU_INSTANCE_IDS",
    "DCGM_FI_DEV_VGPU_UTILIZATIONS",
    "DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION",
    "DCGM_FI_DEV_ENC_STATS",
    "DCGM_FI_DEV_FBC_STATS",
    "DCGM_FI_DEV_FBC_SESSIONS_INFO",
    "DCGM_FI_DEV_VGPU_VM_ID",
    "DCGM_FI_DEV_VGPU_VM_NAME",
    "DCGM_FI_DEV_VGPU_TYPE",
    "DCGM_FI_DEV_VGPU_UUID",
    "DCGM_FI_DEV_VGPU_DRIVER_VERSION",
    "DCGM_FI_DEV_VGPU_MEMORY_USAGE",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_VGPU_FRAME_RATE_LIMIT",
    "DCGM_FI_DEV_VGPU_ENC_STATS",
    "DCGM_FI_DEV_VGPU_ENC_SESSIONS_INFO",
    "DCGM_FI_DEV_VGPU_FBC_STATS",
    "DCGM_FI_DEV_VGPU_FBC_SESSIONS_INFO",
    "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS",
    "DCGM_FI_DEV_NVSWITCH_NON_FATAL_ERRORS",
    "DCGM_FI_DEV_FB_CAPACITY_BYTES",
    "DCGM_FI_SYSTEM_DRIVER_VERSION",
    "DCGM_FI_DEV_SYSIO_POWER_UTIL_CURRENT",
    "DCGM_FI_DEV_MODULE_POWER_UTIL_CURRENT",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND",
    "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND",
    "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND",
    "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND",
    "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
    "DCGM_FI_PROF_PIPE_INT_ACTIVE",
    "DCGM_FI_PROF_NVOFA0_ACTIVE",
};

// Every DCGM field name kgpu knows and does not produce: kDcgmOnly and the indexed families.
const std::vector<std::string>& KnownElsewhere() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out(std::begin(kDcgmOnly), std::end(kDcgmOnly));
    for (int i = 0; i < 8; ++i) {
      out.push_back(Cat("DCGM_FI_DEV_CPU_AFFINITY_", i));
      out.push_back(Cat("DCGM_FI_PROF_NVDEC", i, "_ACTIVE"));
      out.push_back(Cat("DCGM_FI_PROF_NVJPG", i, "_ACTIVE"));
    }
    for (const char* kind : {"CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY"}) {
      out.push_back(Cat("DCGM_FI_DEV_NVLINK_", kind, "_ERROR_COUNT_TOTAL"));
      for (int lane = 0; lane < 18; ++lane) out.push_back(Cat("DCGM_FI_DEV_NVLINK_", kind, "_ERROR_COUNT_L", lane));
    }
    for (int lane = 0; lane < 18; ++lane) out.push_back(Cat("DCGM_FI_DEV_NVLINK_BANDWIDTH_L", lane));
    for (int port = 0; port < 18; ++port) {
      const std::string p = Cat(port < 10 ? "P0" : "P", port);
      for (const char* bin : {"LOW", "MED", "HIGH", "MAX"})
        out.push_back(Cat("DCGM_FI_DEV_NVSWITCH_LATENCY_", bin, "_", p));
      for (const char* dir : {"TX", "RX"}) {
        for (int counter = 0; counter < 2; ++counter) {
          out.push_back(Cat("DCGM_FI_DEV_NVSWITCH_BANDWIDTH_", dir, "_", counter, "_", p));
        }
      }
    }
    return out;
  }();
  return names;
}

bool IsKnownElsewhere(const std::string& name) {
  const auto& names = KnownElsewhere();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The known name nearest to `name` (kgpu's own first), as " (did you mean X?)", or "".
std::string Suggestion(const std::string& name) {
  std::vector<std::string> candidates;
  for (const auto& k : kKnown) candidates.emplace_back(k.name);
  const auto& elsewhere = KnownElsewhere();
  candidates.insert(candidates.end(), elsewhere.begin(), elsewhere.end());
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
  std::istringstream in{std::string(csv)};
  int line_no = 0, records = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const std::string trimmed = Trim(line);
    if (trimmed.empty() || trimmed[0] == '#') continue;
    ++records;
    // Split into exactly three fields: the help text may not hold commas (as in encoding/csv).
    // columns[i]: the 1-based column where field i starts (after its blanks).
    std::vector<std::string> fields;
    std::vector<size_t> columns;
    for (size_t start = 0;;) {
      const size_t comma = line.find(',', start);
      const std::string raw = line.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const size_t lead = raw.find_first_not_of(" \t");
      columns.push_back(start + (lead == std::string::npos ? 0 : lead) + 1);
      fields.push_back(Trim(raw));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (fields.size() != 3) {
      return At(origin, line_no, columns[0],
                Cat("malformed CSV record, expected 3 fields (DCGM field, type, help), got ", fields.size()));
    }
    const std::string& name = fields[0];
    const std::string& type = fields[1];
    if (type != "gauge" && type != "counter" && type != "label" && type != "histogram" && type != "summary") {
      return At(origin, line_no, columns[1],
                Cat("type '", type, "' of ", name, " is not gauge, counter, histogram, summary or label"));
    }
    if (name.rfind("DCGM_FI_", 0) != 0 && name.rfind("DCGM_EXP_", 0) != 0) {
      return At(origin, line_no, columns[0],
                Cat("'", name, "' is not a DCGM field name (DCGM_FI_... or DCGM_EXP_...)", Suggestion(name)));
    }
    if (auto [it, inserted] = seen.emplace(name, line_no); !inserted) {
      return At(origin, line_no, columns[0], Cat(name, " is listed twice (first on line ", it->second, ")"));
    }
    const Known* known = nullptr;
    for (const auto& k : kKnown) {
      if (name == k.name) known = &k;
    }
    if (known == nullptr) {
      if (!IsKnownElsewhere(name)) {
        return At(origin, line_no, columns[0],
                  Cat("unknown DCGM field ", name, Suggestion(name),
                      "; fix the name, or remove the row (kgpu exports the fields in its default counters, "
                      "see docs/exporter.md)"));
      }
      if (skipped != nullptr) {
        skipped->push_back(Cat(origin, ":", line_no, ": ", name,
                               name.rfind("DCGM_FI_PROF_", 0) == 0 ? " needs DCGM's profiling module; omitted"
                                                                   : " is not available through NVML; omitted"));
      }
      continue;
    }
    if ((known->field == Field::kDriverVersion) != (type == "label")) {
      return At(origin, line_no, columns[1],
                Cat(name, known->field == Field::kDriverVersion ? " must have type label" : " cannot be a label"));
    }
    out.push_back({name, type, fields[2], known->field});
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
