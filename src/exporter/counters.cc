#include "exporter/counters.h"

#include <fstream>
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

}  // namespace

const char* DefaultCountersCsv() { return kDefaultCsv; }

absl::StatusOr<std::vector<Counter>> ParseCounters(std::string_view csv, std::string_view origin,
                                                   std::vector<std::string>* skipped) {
  std::vector<Counter> out;
  std::map<std::string, int> seen;
  std::istringstream in{std::string(csv)};
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const std::string trimmed = Trim(line);
    if (trimmed.empty() || trimmed[0] == '#') continue;
    // Split into exactly three fields: the help text may not hold commas (as in encoding/csv).
    std::vector<std::string> fields;
    std::stringstream parts(trimmed);
    for (std::string f; std::getline(parts, f, ',');) fields.push_back(Trim(f));
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(Cat(origin, ":", line_no, ": malformed CSV record, expected 3 fields "
                                                                   "(DCGM field, type, help), got ",
                                            fields.size()));
    }
    const std::string& name = fields[0];
    const std::string& type = fields[1];
    if (type != "gauge" && type != "counter" && type != "label" && type != "histogram" && type != "summary") {
      return absl::InvalidArgumentError(Cat(origin, ":", line_no, ": type '", type, "' of ", name,
                                            " is not gauge, counter, histogram, summary or label"));
    }
    if (name.rfind("DCGM_FI_", 0) != 0 && name.rfind("DCGM_EXP_", 0) != 0) {
      return absl::InvalidArgumentError(
          Cat(origin, ":", line_no, ": '", name, "' is not a DCGM field name (DCGM_FI_... or DCGM_EXP_...)"));
    }
    if (auto [it, inserted] = seen.emplace(name, line_no); !inserted) {
      return absl::InvalidArgumentError(
          Cat(origin, ":", line_no, ": ", name, " is listed twice (first on line ", it->second, ")"));
    }
    const Known* known = nullptr;
    for (const auto& k : kKnown) {
      if (name == k.name) known = &k;
    }
    if (known == nullptr) {
      if (skipped != nullptr) {
        skipped->push_back(Cat(origin, ":", line_no, ": ", name,
                               name.rfind("DCGM_FI_PROF_", 0) == 0
                                   ? " needs DCGM's profiling module; omitted"
                                   : " is not available through NVML; omitted"));
      }
      continue;
    }
    if ((known->field == Field::kDriverVersion) != (type == "label")) {
      return absl::InvalidArgumentError(Cat(origin, ":", line_no, ": ", name,
                                            known->field == Field::kDriverVersion ? " must have type label"
                                                                                  : " cannot be a label"));
    }
    out.push_back({name, type, fields[2], known->field});
  }
  return out;
}

absl::StatusOr<std::vector<Counter>> LoadCountersFile(const std::string& path, std::vector<std::string>* skipped) {
  const auto text = ReadFile(path);
  if (!text) {
    return absl::NotFoundError(Cat(path, ": cannot read the counters file (check -f / DCGM_EXPORTER_COLLECTORS)"));
  }
  return ParseCounters(*text, path, skipped);
}

const char* XidMessage(unsigned long long xid) {
  switch (xid) {
    case 0: return "No Error";
    case 13: return "Graphics Engine Exception";
    case 31: return "GPU memory page fault";
    case 32: return "Invalid or corrupted push buffer stream";
    case 38: return "Driver firmware error";
    case 43: return "GPU stopped processing";
    case 45: return "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda applications and hitting a DBE";
    case 48: return "Double Bit ECC Error";
    case 61: return "Internal micro-controller breakpoint/warning (newer drivers)";
    case 62: return "Internal micro-controller halt (newer drivers)";
    case 63: return "ECC page retirement or row remapping recording event";
    case 64: return "ECC page retirement or row remapper recording failure";
    case 68: return "NVDEC0 Exception";
    case 69: return "Graphics Engine class error";
    case 74: return "NVLINK Error";
    case 79: return "GPU has fallen off the bus";
    case 92: return "High single-bit ECC error rate";
    case 94: return "Contained ECC error";
    case 95: return "Uncontained ECC error";
    case 109: return "Context Switch Timeout Error";
    case 119: return "GSP RPC Timeout";
    case 120: return "GSP Error";
    default: return "Unknown Error";
  }
}

}  // namespace kgpu::exporter
