#include "exporter/exporter.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include <httplib.h>

#include "common/http_compress.h"
#include "common/http_listen.h"
#include "common/log.h"
#include "common/prom_text.h"
#include "common/sleep.h"
#include "common/strings.h"
#include "exporter/gzip_body.h"

namespace kgpu::exporter {
namespace {

// Accept-Encoding names gzip (or *) with a non-zero q (RFC 9110 12.5.3).
bool AcceptsGzip(std::string_view header) {
  size_t at = 0;
  while (at < header.size()) {
    size_t end = header.find(',', at);
    if (end == std::string_view::npos) end = header.size();
    std::string_view item = header.substr(at, end - at);
    at = end + 1;
    const size_t semi = item.find(';');
    std::string_view coding = item.substr(0, semi);
    while (!coding.empty() && (coding.front() == ' ' || coding.front() == '\t')) coding.remove_prefix(1);
    while (!coding.empty() && (coding.back() == ' ' || coding.back() == '\t')) coding.remove_suffix(1);
    if (coding != "gzip" && coding != "x-gzip" && coding != "*") continue;
    if (semi == std::string_view::npos) return true;
    std::string_view params = item.substr(semi + 1);
    const size_t q = params.find("q=");
    if (q == std::string_view::npos) return true;
    const double v = std::strtod(std::string(params.substr(q + 2)).c_str(), nullptr);
    return v > 0;
  }
  return false;
}

// nvmlDeviceGetFieldValues ids (nvml.h's NVML_FI_DEV_*).
constexpr unsigned kFieldMemoryTemp = 82, kFieldNvlinkTx = 138, kFieldNvlinkRx = 139;
constexpr unsigned kFieldRetiredSbe = 29, kFieldRetiredDbe = 30, kFieldRetiredPending = 31;
constexpr unsigned kFieldNvlinkErrors[4] = {38, 45, 52, 59};  // CRC flit, CRC data, replay, recovery: all links

void AppendLabel(std::string& out, std::string_view key, std::string_view value) {
  if (!out.empty()) out += ',';
  out.append(key);
  out += "=\"";
  prom::AppendLabelValue(out, value);  // the escaping every kgpu /metrics shares
  out += '"';
}

using Attributes = std::vector<std::pair<std::string, std::string>>;

// Every label name the collector writes, besides the hostname label (--hostname-label) and the
// counters' label rows: the code that writes a label takes its name from here, and every name
// here is reserved against pod labels (a pod label of a name the series already has would repeat
// it, and Prometheus refuses the whole page for one such line). A new label goes here first.
namespace label {
constexpr char kGpu[] = "gpu";
constexpr char kUuid[] = "UUID";
constexpr char kOldUuid[] = "uuid";  // -o
constexpr char kPciBusId[] = "pci_bus_id";
constexpr char kDevice[] = "device";
constexpr char kModelName[] = "modelName";
constexpr char kGpuInstanceProfile[] = "GPU_I_PROFILE";
constexpr char kGpuInstanceId[] = "GPU_I_ID";
constexpr char kContainer[] = "container";
constexpr char kNamespace[] = "namespace";
constexpr char kPod[] = "pod";
constexpr char kOldContainer[] = "container_name";  // -o
constexpr char kOldNamespace[] = "pod_namespace";   // -o
constexpr char kOldPod[] = "pod_name";              // -o
constexpr char kPodUid[] = "pod_uid";
constexpr char kVgpu[] = "vgpu";
constexpr char kHpcJob[] = "hpc_job";
constexpr char kEnforcement[] = "enforcement";
constexpr char kErrCode[] = "err_code";
constexpr char kErrMsg[] = "err_msg";
constexpr char kXid[] = "xid";
constexpr char kWindowSize[] = "window_size_in_ms";
constexpr char kClockEvent[] = "clock_event";
constexpr char kHealthErrorCode[] = "health_error_code";
constexpr char kHealthWatch[] = "health_watch";
constexpr char kLinkStatus[] = "link_status";
constexpr char kPeerGpu[] = "peer_gpu";
constexpr char kValue[] = "value";  // a string field's info-style series
constexpr char kReason[] = "reason";
}  // namespace label

constexpr std::string_view kEmittedLabels[] = {
    label::kGpu, label::kUuid, label::kOldUuid, label::kPciBusId, label::kDevice, label::kModelName,
    label::kGpuInstanceProfile, label::kGpuInstanceId, label::kContainer, label::kNamespace, label::kPod,
    label::kOldContainer, label::kOldNamespace, label::kOldPod, label::kPodUid, label::kVgpu, label::kHpcJob,
    label::kEnforcement, label::kErrCode, label::kErrMsg, label::kXid, label::kWindowSize, label::kClockEvent,
    label::kHealthErrorCode, label::kHealthWatch, label::kLinkStatus, label::kPeerGpu, label::kValue, label::kReason,
    // Both spellings of the hostname label, whichever --hostname-label picked.
    "Hostname", "hostname"};

// How a pod's attributes are written: dcgm-exporter's names (-o: its 1.x ones) and what goes
// with them (pod_uid, vgpu, the pod's own labels), as the options ask.
struct PodLabelling {
  bool old_names = false;
  bool pod_uid = false;
  bool vgpu = false;
  const PodAttributor* attributor = nullptr;
  const PodMetadataReader* metadata = nullptr;                   // set when pod labels are on
  const std::set<std::string, std::less<>>* reserved = nullptr;  // the collector's reserved_labels_
};

// Whether a pod's own label must be left out: a name the series has already (any name the
// collector may write there), or one Prometheus reserves (__*). Left out rather than renamed
// (kube-state-metrics' label_ prefix): dcgm-exporter writes pod labels under their sanitised names,
// so a renamed one would match no query written for it either, and the series keeps its own
// label's meaning. DCGM_* stays reserved whatever the counters file holds now.
bool Reserved(std::string_view name, const PodLabelling& how) {
  if (how.reserved != nullptr && how.reserved->count(name) > 0) return true;
  return name.rfind("__", 0) == 0 || name.rfind("DCGM_", 0) == 0;
}

// `uuids`: the device's (the GPU's, or its GPU instance's MIG devices'), for the vgpu replica.
void AppendPod(Attributes& attrs, const kubelet::PodRef& pod, const PodLabelling& how,
               const std::vector<std::string>& uuids) {
  attrs.emplace_back(how.old_names ? label::kOldContainer : label::kContainer, pod.container);
  attrs.emplace_back(how.old_names ? label::kOldNamespace : label::kNamespace, pod.namespace_name);
  attrs.emplace_back(how.old_names ? label::kOldPod : label::kPod, pod.pod);
  std::optional<PodMetadata> meta;
  if (how.metadata != nullptr && *how.metadata) meta = (*how.metadata)(pod.namespace_name, pod.pod);
  if (how.pod_uid) {
    std::string uid = how.attributor != nullptr ? how.attributor->PodUid(pod) : std::string();
    if (uid.empty() && meta) uid = meta->uid;
    if (!uid.empty()) attrs.emplace_back(label::kPodUid, uid);
  }
  if (how.vgpu && how.attributor != nullptr) {
    if (std::string replica = how.attributor->ReplicaOn(pod, uuids); !replica.empty())
      attrs.emplace_back(label::kVgpu, replica);
  }
  if (meta) {
    for (const auto& [key, value] : meta->labels) {
      if (!Reserved(key, how)) attrs.emplace_back(key, value);  // never a second label of one name
    }
  }
}

// --hpc-job-mapping-dir with several jobs on one device: each of the device's series (the lines of
// `buf` from `from` on that carry hpc_job="<jobs[0]>") once more for every further job. `jobs` are
// distinct (HpcJobs de-duplicates them), so no two lines come out alike.
void RepeatForJobs(std::string& buf, size_t from, const std::vector<std::string>& jobs) {
  if (jobs.size() < 2 || from >= buf.size()) return;
  auto token = [](const std::string& job) {
    std::string t = Cat(",", label::kHpcJob, "=\"");
    prom::AppendLabelValue(t, job);
    t += '"';
    return t;
  };
  const std::string first = token(jobs.front());
  const std::string segment = buf.substr(from);
  for (size_t k = 1; k < jobs.size(); ++k) {
    const std::string other = token(jobs[k]);
    for (size_t at = 0; at < segment.size();) {
      size_t end = segment.find('\n', at);
      end = end == std::string::npos ? segment.size() : end + 1;
      const std::string_view line(segment.data() + at, end - at);
      if (const size_t t = line.find(first); t != std::string_view::npos) {
        buf.append(line.substr(0, t));
        buf += other;
        buf.append(line.substr(t + first.size()));
      }
      at = end;
    }
  }
}

// One sample line: name{base,sorted attributes} value
void Line(std::string& out, const std::string& name, const std::string& base, Attributes attrs,
          const std::string& value) {
  out += name;
  out += '{';
  std::string labels = base;
  std::sort(attrs.begin(), attrs.end());
  for (const auto& [k, v] : attrs) AppendLabel(labels, k, v);
  out += labels;
  out += "} ";
  out += value;
  out += '\n';
}

std::string Int(uint64_t v) {
  return std::to_string(v);
}
std::string Double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%f", v);  // dcgm-exporter prints doubles with %f
  return buf;
}

// A device a series is about: a whole GPU, or one GPU instance of a MIG GPU.
struct Entity {
  const gpu::Gpu* gpu = nullptr;
  const gpu::MigDevice* mig = nullptr;  // the GI's first MIG device (compute instance)
  std::vector<std::string> uuids;       // the GPU's UUID, or the UUIDs of every CI of the GI
  nvml::Device handle;
  std::string base;  // rendered base labels
};

// What one GPU read out in this collection (shared by its GPU instances). Only what the counters
// ask for is read; the rest stays empty.
struct GpuReadout {
  std::optional<unsigned> sm_clock, mem_clock, video_clock, app_sm_clock, app_mem_clock, max_sm_clock, max_mem_clock,
      max_video_clock;
  std::optional<uint64_t> clock_events;  // reason bits
  std::optional<unsigned> gpu_temp, mem_max_op_temp, gpu_max_op_temp, slowdown_temp, shutdown_temp;
  std::optional<unsigned> power_mw, power_limit_mw, power_default_mw, power_enforced_mw, pstate, fan;
  std::optional<nvml::Library::PowerLimits> power_limits;
  std::optional<unsigned> pcie_replay, pcie_tx_kbs, pcie_rx_kbs, pcie_gen, pcie_max_gen, pcie_width, pcie_max_width;
  std::optional<unsigned> enc, dec;
  std::optional<uint64_t> mem_temp, energy;
  std::optional<uint64_t> violation_ns[8];  // in kViolations order
  std::optional<nvml::Library::Utilization> util;
  std::optional<nvml::Library::RemappedRows> remapped;
  std::optional<uint64_t> ecc[4];  // sbe vol, dbe vol, sbe agg, dbe agg
  std::optional<std::pair<bool, bool>> ecc_mode;
  std::optional<uint64_t> retired[3];        // sbe, dbe, pending
  std::optional<uint64_t> nvlink_errors[4];  // CRC flit, CRC data, replay, recovery
  std::optional<nvml::Library::Bar1Memory> bar1;
  std::optional<int> compute_mode;
  std::optional<bool> persistence, mig_mode;
  std::optional<nvml::PciInfo> pci;
  // NVLink throughput, KiB/s over the last collection interval (0 on the first): all links, and by link.
  std::optional<double> nvlink_kibps;
  std::map<unsigned, double> lane_kibps;
  std::vector<nvml::Library::ProcessInfo> processes;
  std::map<unsigned, unsigned> sm_util_by_pid;
};

// The violation fields and the policy nvmlDeviceGetViolationStatus reads for each.
constexpr std::pair<Field, nvml::Library::ViolationPolicy> kViolations[8] = {
    {Field::kPowerViolation, nvml::Library::ViolationPolicy::kPower},
    {Field::kThermalViolation, nvml::Library::ViolationPolicy::kThermal},
    {Field::kSyncBoostViolation, nvml::Library::ViolationPolicy::kSyncBoost},
    {Field::kBoardLimitViolation, nvml::Library::ViolationPolicy::kBoardLimit},
    {Field::kLowUtilViolation, nvml::Library::ViolationPolicy::kLowUtilization},
    {Field::kReliabilityViolation, nvml::Library::ViolationPolicy::kReliability},
    {Field::kTotalAppClocksViolation, nvml::Library::ViolationPolicy::kTotalAppClocks},
    {Field::kTotalBaseClocksViolation, nvml::Library::ViolationPolicy::kTotalBaseClocks},
};

// What one device (a whole GPU, or one GPU instance) read out in this collection.
struct EntityData {
  std::optional<nvml::MemoryInfo> mem;
  std::map<unsigned, double> gpm;  // GPM metric id -> its value between the previous and this collection
};

// One value of a field: an integer, a double (printed with %f, as dcgm-exporter prints DCGM's
// doubles) or a string.
struct Reading {
  enum class Kind { kInt, kDouble, kString };
  Kind kind = Kind::kInt;
  int64_t i = 0;
  double d = 0;
  std::string s;
  static Reading OfInt(int64_t v) { return {Kind::kInt, v, 0, {}}; }
  static Reading OfDouble(double v) { return {Kind::kDouble, 0, v, {}}; }
  static Reading OfString(std::string v) { return {Kind::kString, 0, 0, std::move(v)}; }
  std::string Text() const {
    switch (kind) {
      case Kind::kInt:
        return std::to_string(i);
      case Kind::kDouble:
        return Double(d);
      default:
        return s;
    }
  }
};

template <typename T>
std::optional<Reading> IntOf(const std::optional<T>& v) {
  if (!v) return std::nullopt;
  return Reading::OfInt(static_cast<int64_t>(*v));
}
// The unit conversions of DCGM 4.7's base-unit names (Counter::base_units).
std::optional<Reading> Mhz(const std::optional<unsigned>& v, const Counter& c) {
  if (!v) return std::nullopt;
  return Reading::OfInt(static_cast<int64_t>(*v) * (c.base_units ? 1000000 : 1));  // hertz
}
std::optional<Reading> Percent(const std::optional<unsigned>& v, const Counter& c) {
  if (!v) return std::nullopt;
  return c.base_units ? Reading::OfDouble(*v / 100.0) : Reading::OfInt(*v);  // a 0..1 ratio
}
std::optional<Reading> Mib(std::optional<uint64_t> bytes, const Counter& c) {
  if (!bytes) return std::nullopt;
  return Reading::OfInt(static_cast<int64_t>(c.base_units ? *bytes : *bytes >> 20));  // bytes
}
std::optional<Reading> Watts(const std::optional<unsigned>& mw) {
  if (!mw) return std::nullopt;
  return Reading::OfDouble(*mw / 1000.0);
}

// One device key's XIDs as a collection reads them (a copy taken under the lock).
struct XidView {
  unsigned long long last = 0;
  std::chrono::steady_clock::time_point last_at{};
  uint64_t last_seq = 0;                          // the order of RecordXid calls: ties of last_at
  std::map<unsigned long long, uint64_t> counts;  // since the start
  std::map<uint64_t, uint64_t> recent;            // within -x
};

// The device's XIDs: whole-GPU XIDs count on every series of the GPU, a GPU instance's own XIDs
// on that instance; merged, so each label set appears once. The last XID is the newer of the
// instance's and the GPU's (DCGM reports a device's last XID by time): a GPU-wide XID 79 after an
// instance's XID 13 shows on the instance as 79.
XidView MergeXids(const std::map<std::pair<unsigned, unsigned>, XidView>& xids, unsigned gpu, unsigned gi) {
  XidView merged;
  bool any = false;
  for (const auto& key : {std::pair{gpu, nvml::kNoInstance}, std::pair{gpu, gi}}) {
    if (const auto it = xids.find(key); it != xids.end()) {
      const XidView& v = it->second;
      if (!any || std::tie(v.last_at, v.last_seq) > std::tie(merged.last_at, merged.last_seq)) {
        merged.last = v.last;
        merged.last_at = v.last_at;
        merged.last_seq = v.last_seq;
      }
      any = true;
      for (const auto& [xid, n] : v.counts) merged.counts[xid] += n;
      for (const auto& [xid, n] : v.recent) merged.recent[xid] += n;
    }
    if (gi == nvml::kNoInstance) break;  // a whole GPU: one key
  }
  return merged;
}

// NVML GPM metrics of the bus (PCIE_TX/RX_PER_SEC, NVLINK_TOTAL_RX/TX_PER_SEC): the whole GPU's,
// never asked of a GPU instance, where a driver may fail the whole nvmlGpmMetricsGet for them.
constexpr unsigned kGpmBusMetrics[] = {20, 21, 60, 61};

// "No value" as GPM means it: nvml::IsNoValue but NO_PERMISSION, which on a GPU that has GPM
// means profiling is restricted to administrators (a setting to fix, logged), not a GPU without it.
bool GpmNoValue(const absl::Status& status) {
  return nvml::IsNoValue(status) && nvml::ReturnOf(status) != nvml::Return::kNoPermission;
}

// DCGM_EXP_GPU_HEALTH_STATUS: dcgm-exporter's series per DCGM health system, in its order
// (internal/pkg/collector/gpu_health_collector.go), valued as DCGM's dcgmHealthWatchResults_t.
constexpr const char* kHealthSystems[] = {"PCIE", "MEM",     "NVLINK",  "PMU",   "MCU",
                                          "SM",   "INFOROM", "THERMAL", "POWER", "DRIVER"};
constexpr int kHealthPass = 0, kHealthWarn = 10, kHealthFail = 20;
struct HealthIncident {
  int health = kHealthPass;
  std::string code = "DCGM_FR_OK";
};
// The DCGM health system an XID belongs to (DCGM files XIDs by the subsystem they name): memory
// errors, NVLink, the bus; anything else is the driver's.
const char* XidHealthSystem(unsigned long long xid) {
  switch (xid) {
    case 48:
    case 63:
    case 64:
    case 92:
    case 94:
    case 95:
      return "MEM";
    case 74:
      return "NVLINK";
    case 79:
      return "PCIE";
    default:
      return "DRIVER";
  }
}

}  // namespace

// ---------------------------------------------------------------- WindowCounts

void WindowCounts::Add(TimePoint at, uint64_t key, std::chrono::milliseconds window, uint64_t n) {
  Expire(at, window);
  // Slots start at least `width` apart and the oldest is younger than the window: at most
  // window / width + 1 of them, about kSlots.
  const std::chrono::nanoseconds width =
      std::max<std::chrono::nanoseconds>(std::chrono::nanoseconds(window) / kSlots, std::chrono::milliseconds(1));
  if (slots_.empty() || at - slots_.back().start >= width) slots_.push_back({at, {}});
  slots_.back().counts[key] += n;
}

void WindowCounts::Expire(TimePoint now, std::chrono::milliseconds window) {
  while (!slots_.empty() && slots_.front().start <= now - window) slots_.pop_front();
}

std::map<uint64_t, uint64_t> WindowCounts::Counts(TimePoint now, std::chrono::milliseconds window) const {
  std::map<uint64_t, uint64_t> out;
  for (const Slot& slot : slots_) {
    if (slot.start <= now - window) continue;
    for (const auto& [key, n] : slot.counts) out[key] += n;
  }
  return out;
}

// ---------------------------------------------------------------- Collector

Collector::Collector(const nvml::Library& lib, std::shared_ptr<const gpu::Inventory> inventory,
                     const ExporterOptions& options, const PodAttributor* attributor)
    : lib_(lib), inventory_(std::move(inventory)), options_(options), attributor_(attributor) {
  for (const Counter& c : options_.counters) {
    wanted_.insert(c.field);
    if (c.field == Field::kNvlinkBandwidthLane) nvlink_lanes_.insert(c.index);
    if (c.field == Field::kProfRatio || c.field == Field::kProfBytes) gpm_ids_.push_back(c.index);
  }
  std::sort(gpm_ids_.begin(), gpm_ids_.end());
  gpm_ids_.erase(std::unique(gpm_ids_.begin(), gpm_ids_.end()), gpm_ids_.end());
  for (std::string_view name : kEmittedLabels) reserved_labels_.emplace(name);
  reserved_labels_.insert(options_.hostname_label);
  for (const Counter& c : options_.counters) {
    if (c.type == "label") reserved_labels_.insert(c.name);  // the label rows: labels named after the field
  }
}

void Collector::RecordXid(unsigned gpu, unsigned gi, unsigned long long xid) {
  const TimePoint at = now_();
  std::lock_guard<std::mutex> lock(xid_mu_);
  XidState& s = xids_[{gpu, gi}];
  s.last = xid;
  s.last_at = at;
  s.last_seq = ++xid_seq_;
  s.counts[xid]++;
  s.recent.Add(at, xid, options_.xid_count_window);
}

std::map<unsigned, double> Collector::SampleGpm(const gpu::Gpu& g, unsigned gi) {
  std::map<unsigned, double> out;
  auto supported = gpm_supported_.find(g.index);
  if (supported == gpm_supported_.end()) {
    auto s = lib_.GpmSupported(g.handle);
    if (!s.ok()) {
      NoteGpmFailure(g, s.status());
      return out;  // asked again at the next collection
    }
    supported = gpm_supported_.emplace(g.index, *s).first;
  }
  if (!supported->second) {
    // Logged once for all such GPUs, at the end of the collection.
    if (gpm_missing_logged_.insert(g.index).second) gpm_missing_new_.push_back(Cat(g.index, " (", g.name, ")"));
    return out;
  }
  GpmState& st = gpm_[{g.index, gi}];
  for (nvml::GpmSample* buffer : {&st.older, &st.newer}) {
    if (!buffer->empty()) continue;
    auto alloc = lib_.GpmSampleAlloc();
    if (!alloc.ok()) {
      nvml_errors_++;
      return out;
    }
    *buffer = std::move(*alloc);
  }
  const absl::Status taken =
      gi == nvml::kNoInstance ? lib_.GpmSampleGet(g.handle, st.newer) : lib_.GpmMigSampleGet(g.handle, gi, st.newer);
  if (!taken.ok()) {
    if (!GpmNoValue(taken)) NoteGpmFailure(g, taken);
    st.have_older = false;  // the next sample starts over
    return out;
  }
  if (st.have_older) {
    // What this device is asked: the counters' GPM ids, less those it refused alone before and, on
    // a GPU instance, the bus's (the PCIe and NVLink figures are the whole GPU's).
    std::vector<unsigned> ids;
    for (unsigned id : gpm_ids_) {
      const bool bus = std::find(std::begin(kGpmBusMetrics), std::end(kGpmBusMetrics), id) != std::end(kGpmBusMetrics);
      if (st.unsupported.count(id) == 0 && !(bus && gi != nvml::kNoInstance)) ids.push_back(id);
    }
    auto metrics = ids.empty()
                       ? absl::StatusOr<std::vector<std::optional<double>>>(std::vector<std::optional<double>>())
                       : lib_.GpmMetrics(st.older, st.newer, ids);
    std::vector<unsigned> refused;  // ids this device refused alone: not asked again here
    if (metrics.ok()) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if ((*metrics)[i]) out[ids[i]] = *(*metrics)[i];
      }
    } else if (ids.size() == 1) {
      if (nvml::ReturnOf(metrics.status()) == nvml::Return::kNotSupported) {
        refused.push_back(ids[0]);
      } else if (!GpmNoValue(metrics.status())) {
        NoteGpmFailure(g, metrics.status());
      }
    } else {
      // A driver may fail the whole call for one metric it does not give on this device, which
      // would take every DCGM_FI_PROF_* series of the device with it: each id alone, once. An id
      // refused alone as not supported, or while others are answered, is not asked again here.
      std::vector<unsigned> failed;
      bool answered = false;
      for (unsigned id : ids) {
        auto one = lib_.GpmMetrics(st.older, st.newer, std::vector<unsigned>{id});
        if (one.ok()) {
          answered = true;
          if (!one->empty() && (*one)[0]) out[id] = *(*one)[0];
        } else if (nvml::ReturnOf(one.status()) == nvml::Return::kNotSupported) {
          refused.push_back(id);
        } else {
          failed.push_back(id);
        }
      }
      if (answered) {
        refused.insert(refused.end(), failed.begin(), failed.end());
        if (!GpmNoValue(metrics.status())) nvml_errors_++;  // the failed call, worked around
      } else if (!failed.empty() && !GpmNoValue(metrics.status())) {
        NoteGpmFailure(g, metrics.status());  // the call fails whatever it asks: not the ids
      }
    }
    if (!refused.empty()) {
      std::sort(refused.begin(), refused.end());
      st.unsupported.insert(refused.begin(), refused.end());
      Log("exporter")
          ->info(
              "GPU {}{}: nvmlGpmMetricsGet refused GPM metric(s) {} ({}): not asked again of this device, so the "
              "other DCGM_FI_PROF_* series keep their values (logged once)",
              g.index, gi == nvml::kNoInstance ? std::string() : Cat(" GPU instance ", gi), Join(refused, ", "),
              std::string(metrics.status().message()));
    }
  }
  std::swap(st.older, st.newer);  // this sample is the next collection's older one
  st.have_older = true;
  return out;
}

void Collector::NoteGpmFailure(const gpu::Gpu& g, const absl::Status& status) {
  nvml_errors_++;
  if (!gpm_failure_logged_.insert(g.index).second) return;
  const bool permission = nvml::ReturnOf(status) == nvml::Return::kNoPermission;
  Log("exporter")
      ->warn(
          "GPU {} ({}): NVML's GPU performance monitoring failed: {}{}; its DCGM_FI_PROF_* series are absent while "
          "it fails (logged once per GPU; kgpu_exporter_nvml_errors_total counts the failures)",
          g.index, g.name, std::string(status.message()),
          permission ? " (profiling restricted to administrators? With the driver's "
                       "NVreg_RestrictProfilingToAdminUsers=1 only root or CAP_SYS_ADMIN may read GPM: give the "
                       "exporter CAP_SYS_ADMIN, or load the driver with NVreg_RestrictProfilingToAdminUsers=0)"
                     : "");
}

std::string Collector::Collect() {
  const auto& counters = options_.counters;
  std::vector<std::string> lines(counters.size());
  auto want = [&](std::initializer_list<Field> fields) {
    return std::any_of(fields.begin(), fields.end(), [&](Field f) { return wanted_.count(f) > 0; });
  };
  const bool has_labels =
      std::any_of(counters.begin(), counters.end(), [](const Counter& c) { return c.type == "label"; });

  // Reads a value; "no value" (NOT_SUPPORTED and friends) is omitted, other errors are counted.
  auto get = [&](auto result) -> std::optional<typename decltype(result)::value_type> {
    if (result.ok()) return *result;
    if (!nvml::IsNoValue(result.status())) nvml_errors_++;
    return std::nullopt;
  };

  const TimePoint now = now_();
  std::map<std::pair<unsigned, unsigned>, XidView> xids;
  {
    std::lock_guard<std::mutex> lock(xid_mu_);
    for (auto& [key, state] : xids_) {
      state.recent.Expire(now, options_.xid_count_window);
      XidView& v = xids[key];
      v.last = state.last;
      v.last_at = state.last_at;
      v.last_seq = state.last_seq;
      v.counts = state.counts;
      v.recent = state.recent.Counts(now, options_.xid_count_window);
    }
  }
  // A value that never changes, read until NVML gives it or says it has none (`done`); after any
  // other error it is asked again at the next collection, so one transient error at start does
  // not lose it for the process's life.
  auto read_once = [&](auto result, auto& into, bool& done) {
    if (done) return;
    if (result.ok()) {
      into = *result;
      done = true;
    } else if (nvml::IsNoValue(result.status())) {
      done = true;
    } else {
      nvml_errors_++;
    }
  };
  // The library's and the driver's versions: fixed for the process.
  if (want({Field::kNvmlVersion}) && !nvml_version_read_) {
    read_once(lib_.NvmlVersion(), nvml_version_, nvml_version_read_);
  }
  if (want({Field::kCudaDriverVersion}) && !cuda_driver_version_read_) {
    read_once(lib_.CudaDriverVersion(), cuda_driver_version_, cuda_driver_version_read_);
  }
  std::string up_lines, reason_lines, limit_lines;
  // The process's one health source (the device plugin's monitor in `kgpu node`, the exporter's
  // own otherwise): a device kubelet is told is Unhealthy has kgpu_gpu_up 0, with its reason.
  const std::map<std::string, gpu::DeviceHealth> health =
      health_ ? health_() : std::map<std::string, gpu::DeviceHealth>{};
  if (options_.hpc_jobs) options_.hpc_jobs->Refresh();  // --hpc-job-mapping-dir, read on this timer

  for (const auto& g : inventory_->gpus()) {
    // A GPU NVML cannot read (lost, or failed at discovery) keeps its identity: kgpu_gpu_up 0,
    // its reason and its XID families stay; its readings are absent (never zeroed) until it is back.
    std::string down = g.error.empty() ? "" : g.lost ? "lost" : "unreadable";
    std::string down_detail = g.error;
    GpuReadout r;
    if (down.empty()) {
      auto sm = lib_.ClockMhz(g.handle, nvml::Library::Clock::kSm);
      if (nvml::IsGpuLost(sm.status())) {
        nvml_errors_++;
        down = "lost";
        down_detail = std::string(sm.status().message());
      } else {
        using Clock = nvml::Library::Clock;
        using Threshold = nvml::Library::TemperatureThreshold;
        const nvml::Device h = g.handle;
        r.sm_clock = get(std::move(sm));
        if (want({Field::kMemClock})) r.mem_clock = get(lib_.ClockMhz(h, Clock::kMem));
        if (want({Field::kVideoClock})) r.video_clock = get(lib_.ClockMhz(h, Clock::kVideo));
        if (want({Field::kAppSmClock})) r.app_sm_clock = get(lib_.ApplicationsClockMhz(h, Clock::kSm));
        if (want({Field::kAppMemClock})) r.app_mem_clock = get(lib_.ApplicationsClockMhz(h, Clock::kMem));
        if (want({Field::kMaxSmClock})) r.max_sm_clock = get(lib_.MaxClockMhz(h, Clock::kSm));
        if (want({Field::kMaxMemClock})) r.max_mem_clock = get(lib_.MaxClockMhz(h, Clock::kMem));
        if (want({Field::kMaxVideoClock})) r.max_video_clock = get(lib_.MaxClockMhz(h, Clock::kVideo));
        if (want({Field::kClockEventReasons, Field::kClockEventsCount, Field::kClockEventsTotal})) {
          r.clock_events = get(lib_.ClocksEventReasons(h));
        }
        if (want({Field::kGpuTemp})) r.gpu_temp = get(lib_.TemperatureC(h));
        if (r.gpu_temp && *r.gpu_temp > 200) r.gpu_temp.reset();  // DCGM discards such readings
        if (want({Field::kMemMaxOpTemp})) r.mem_max_op_temp = get(lib_.TemperatureThresholdC(h, Threshold::kMemoryMax));
        if (want({Field::kGpuMaxOpTemp})) r.gpu_max_op_temp = get(lib_.TemperatureThresholdC(h, Threshold::kGpuMax));
        if (want({Field::kSlowdownTemp})) r.slowdown_temp = get(lib_.TemperatureThresholdC(h, Threshold::kSlowdown));
        if (want({Field::kShutdownTemp})) r.shutdown_temp = get(lib_.TemperatureThresholdC(h, Threshold::kShutdown));
        if (want({Field::kPowerUsage})) r.power_mw = get(lib_.PowerMw(h));
        if (want({Field::kTotalEnergy})) r.energy = get(lib_.EnergyMj(h));
        if (want({Field::kPowerMgmtLimit})) r.power_limit_mw = get(lib_.PowerManagementLimitMw(h));
        if (want({Field::kPowerMgmtLimitDef})) r.power_default_mw = get(lib_.PowerManagementDefaultLimitMw(h));
        if (want({Field::kEnforcedPowerLimit})) r.power_enforced_mw = get(lib_.PowerLimitMw(h));
        if (want({Field::kPowerMgmtLimitMin, Field::kPowerMgmtLimitMax})) {
          r.power_limits = get(lib_.PowerManagementLimitConstraints(h));
        }
        if (want({Field::kPstate})) r.pstate = get(lib_.PerformanceState(h));
        if (r.pstate && *r.pstate > 15) r.pstate.reset();  // NVML_PSTATE_UNKNOWN
        if (want({Field::kFanSpeed})) r.fan = get(lib_.FanSpeedPercent(h));
        if (want({Field::kPcieReplay})) r.pcie_replay = get(lib_.PcieReplayCounter(h));
        if (want({Field::kPcieTxThroughput})) r.pcie_tx_kbs = get(lib_.PcieThroughputKBs(h, false));
        if (want({Field::kPcieRxThroughput})) r.pcie_rx_kbs = get(lib_.PcieThroughputKBs(h, true));
        if (want({Field::kPcieLinkGen})) r.pcie_gen = get(lib_.PcieLinkGeneration(h, false));
        if (want({Field::kPcieMaxLinkGen})) r.pcie_max_gen = get(lib_.PcieLinkGeneration(h, true));
        if (want({Field::kPcieLinkWidth})) r.pcie_width = get(lib_.PcieLinkWidth(h, false));
        if (want({Field::kPcieMaxLinkWidth})) r.pcie_max_width = get(lib_.PcieLinkWidth(h, true));
        if (!g.mig_enabled) {  // NVML has no utilisation on MIG GPUs (dcgm-exporter omits it too)
          if (want({Field::kGpuUtil, Field::kMemCopyUtil})) r.util = get(lib_.GetUtilization(h));
          if (want({Field::kEncUtil})) r.enc = get(lib_.EncoderUtilization(h));
          if (want({Field::kDecUtil})) r.dec = get(lib_.DecoderUtilization(h));
        }
        for (size_t i = 0; i < std::size(kViolations); ++i) {
          if (want({kViolations[i].first})) r.violation_ns[i] = get(lib_.ViolationNs(h, kViolations[i].second));
        }
        // ECC and row remapping: always, for kgpu_gpu_unhealthy_reason.
        r.remapped = get(lib_.GetRemappedRows(h));
        for (int i = 0; i < 4; ++i) r.ecc[i] = get(lib_.EccErrors(h, i % 2 == 1, i >= 2));
        if (want({Field::kEccCurrent, Field::kEccPending})) r.ecc_mode = get(lib_.EccMode(h));
        if (want({Field::kBar1Total, Field::kBar1Used, Field::kBar1Free})) r.bar1 = get(lib_.Bar1(h));
        if (want({Field::kComputeMode})) {
          if (auto m = get(lib_.GetComputeMode(h))) r.compute_mode = static_cast<int>(*m);
        }
        if (want({Field::kPersistenceMode})) r.persistence = get(lib_.PersistenceMode(h));
        if (want({Field::kMigMode})) {
          if (auto m = get(lib_.GetMigMode(h))) r.mig_mode = m->current;
        }
        if (want({Field::kPciCombinedId, Field::kPciSubsysId})) r.pci = get(lib_.Pci(h));
        // Every field-value reading in one nvmlDeviceGetFieldValues call.
        std::vector<nvml::Library::ScopedField> ids;
        std::vector<std::optional<uint64_t>*> into;
        auto field = [&](bool wanted, unsigned id, unsigned scope, std::optional<uint64_t>* out) {
          if (!wanted) return;
          ids.push_back({id, scope});
          into.push_back(out);
        };
        std::optional<uint64_t> nvlink_tx, nvlink_rx;
        std::map<unsigned, std::pair<std::optional<uint64_t>, std::optional<uint64_t>>> lanes;  // tx, rx
        const bool nvlink_total = want({Field::kNvlinkBandwidthTotal});
        field(want({Field::kMemoryTemp}), kFieldMemoryTemp, 0, &r.mem_temp);
        field(nvlink_total, kFieldNvlinkTx, nvml::Library::kAllLinks, &nvlink_tx);
        field(nvlink_total, kFieldNvlinkRx, nvml::Library::kAllLinks, &nvlink_rx);
        for (unsigned lane : nvlink_lanes_) {
          field(true, kFieldNvlinkTx, lane, &lanes[lane].first);
          field(true, kFieldNvlinkRx, lane, &lanes[lane].second);
        }
        const Field retired[3] = {Field::kRetiredSbe, Field::kRetiredDbe, Field::kRetiredPending};
        const unsigned retired_ids[3] = {kFieldRetiredSbe, kFieldRetiredDbe, kFieldRetiredPending};
        for (int i = 0; i < 3; ++i) field(want({retired[i]}), retired_ids[i], 0, &r.retired[i]);
        const Field nvlink_errors[4] = {Field::kNvlinkCrcFlitErrors, Field::kNvlinkCrcDataErrors,
                                        Field::kNvlinkReplayErrors, Field::kNvlinkRecoveryErrors};
        for (int i = 0; i < 4; ++i) field(want({nvlink_errors[i]}), kFieldNvlinkErrors[i], 0, &r.nvlink_errors[i]);
        if (!ids.empty()) {
          if (auto fv = get(lib_.ScopedFieldValues(h, ids))) {
            for (size_t i = 0; i < into.size(); ++i) *into[i] = (*fv)[i];
          }
        }
        if (r.mem_temp && *r.mem_temp > 200) r.mem_temp.reset();
        // NVLink throughput as dcgm-exporter reports it: a rate over the collection interval; 0 on
        // the first sample.
        auto rate = [&](unsigned lane, const std::optional<uint64_t>& tx,
                        const std::optional<uint64_t>& rx) -> std::optional<double> {
          if (!tx || !rx) return std::nullopt;
          const uint64_t kib = *tx + *rx;
          double kibps = 0;
          auto it = nvlink_prev_.find({g.index, lane});
          if (it != nvlink_prev_.end()) {
            const double dt = std::chrono::duration<double>(now - it->second.second).count();
            if (dt > 0 && kib >= it->second.first) kibps = static_cast<double>(kib - it->second.first) / dt;
          }
          nvlink_prev_[{g.index, lane}] = {kib, now};
          return kibps;
        };
        r.nvlink_kibps = rate(nvml::Library::kAllLinks, nvlink_tx, nvlink_rx);
        for (const auto& [lane, counters_of_lane] : lanes) {
          if (auto v = rate(lane, counters_of_lane.first, counters_of_lane.second)) r.lane_kibps[lane] = *v;
        }
        // A GPU's strings that never change: read once each (once NVML gave it or said it has none).
        {
          using Inforom = nvml::Library::Inforom;
          auto& strings = strings_[g.uuid];
          auto& fetched = strings_read_[g.uuid];
          auto once = [&](Field f, auto reader) {
            if (!want({f}) || fetched.count(f) > 0) return;
            auto value = reader();
            if (value.ok()) {
              strings[f] = *value;
              fetched.insert(f);
            } else if (nvml::IsNoValue(value.status())) {
              fetched.insert(f);
            } else {
              nvml_errors_++;  // asked again at the next collection
            }
          };
          once(Field::kSerial, [&] { return lib_.Serial(h); });
          once(Field::kVbiosVersion, [&] { return lib_.VbiosVersion(h); });
          once(Field::kBrand, [&]() -> absl::StatusOr<std::string> {
            auto brand = lib_.Brand(h);
            if (!brand.ok()) return brand.status();
            return std::string(BrandName(*brand));
          });
          once(Field::kInforomImageVersion, [&] { return lib_.InforomImageVersion(h); });
          once(Field::kOemInforomVersion, [&] { return lib_.InforomVersion(h, Inforom::kOem); });
          once(Field::kEccInforomVersion, [&] { return lib_.InforomVersion(h, Inforom::kEcc); });
          once(Field::kPowerInforomVersion, [&] { return lib_.InforomVersion(h, Inforom::kPower); });
        }
        if (attributor_ != nullptr) {
          if (auto p = get(lib_.ComputeProcesses(h))) r.processes = std::move(*p);
          if (auto s = get(lib_.ProcessUtilization(h, 0))) {
            for (const auto& x : *s) r.sm_util_by_pid[x.pid] = x.sm_util;
          }
        }
      }
    }
    // The clock-event reasons: one sample per collection, for the counting window and the totals.
    const auto clock_window = options_.clock_events_count_window;
    if (r.clock_events) {
      ClockEventState& ce = clock_events_[g.index];
      for (uint64_t bit : ClockEventBits()) {
        if ((*r.clock_events & bit) != 0) ce.active.Add(now, bit, clock_window);
      }
      if (ce.primed) {
        const uint64_t activated = *r.clock_events & ~ce.previous;
        for (uint64_t bit : ClockEventBits()) {
          if ((activated & bit) != 0) ce.totals[bit]++;
        }
      }
      ce.primed = true;
      ce.previous = *r.clock_events;
    }
    // DCGM_EXP_CLOCK_EVENTS_COUNT of this GPU (reason bit -> samples within the window): the same
    // for each of its devices.
    std::map<uint64_t, uint64_t> clock_counts;
    if (auto ce = clock_events_.find(g.index); ce != clock_events_.end()) {
      ce->second.active.Expire(now, clock_window);
      clock_counts = ce->second.active.Counts(now, clock_window);
    }
    NoteTransition(g, down, down_detail);

    // What each device of this GPU read out (memory, GPM), once per collection: its label rows and
    // its families use the same figures. Keyed by GPU instance id (kNoInstance: the whole GPU).
    std::map<unsigned, EntityData> entity_data;
    auto entity = [&](const gpu::MigDevice* mig) -> const EntityData& {
      const unsigned gi = mig != nullptr ? mig->gi : nvml::kNoInstance;
      auto [it, fresh] = entity_data.try_emplace(gi);
      if (!fresh || !down.empty()) return it->second;
      EntityData& d = it->second;
      if (want({Field::kFbTotal, Field::kFbFree, Field::kFbUsed, Field::kFbReserved, Field::kFbUsedPercent})) {
        d.mem = get(lib_.Memory(mig != nullptr ? mig->handle : g.handle));
      }
      if (!gpm_ids_.empty()) d.gpm = SampleGpm(g, gi);
      return d;
    };
    // One field's value for one device of this GPU (nullopt: no value).
    auto read = [&](const Counter& c, const gpu::MigDevice* mig) -> std::optional<Reading> {
      const unsigned gi = mig != nullptr ? mig->gi : nvml::kNoInstance;
      auto string_of = [&](Field f) -> std::optional<Reading> {
        auto s = strings_.find(g.uuid);
        if (s == strings_.end()) return std::nullopt;
        auto v = s->second.find(f);
        if (v == s->second.end()) return std::nullopt;
        return Reading::OfString(v->second);
      };
      switch (c.field) {
        case Field::kSmClock:
          return Mhz(r.sm_clock, c);
        case Field::kMemClock:
          return Mhz(r.mem_clock, c);
        case Field::kVideoClock:
          return Mhz(r.video_clock, c);
        case Field::kAppSmClock:
          return Mhz(r.app_sm_clock, c);
        case Field::kAppMemClock:
          return Mhz(r.app_mem_clock, c);
        case Field::kMaxSmClock:
          return Mhz(r.max_sm_clock, c);
        case Field::kMaxMemClock:
          return Mhz(r.max_mem_clock, c);
        case Field::kMaxVideoClock:
          return Mhz(r.max_video_clock, c);
        case Field::kClockEventReasons:
          return IntOf(r.clock_events);
        case Field::kMemoryTemp:
          return IntOf(r.mem_temp);
        case Field::kGpuTemp:
          return IntOf(r.gpu_temp);
        case Field::kMemMaxOpTemp:
          return IntOf(r.mem_max_op_temp);
        case Field::kGpuMaxOpTemp:
          return IntOf(r.gpu_max_op_temp);
        case Field::kSlowdownTemp:
          return IntOf(r.slowdown_temp);
        case Field::kShutdownTemp:
          return IntOf(r.shutdown_temp);
        case Field::kPowerUsage:
          return Watts(r.power_mw);
        case Field::kTotalEnergy:
          if (!r.energy) return std::nullopt;
          return c.base_units ? Reading::OfDouble(*r.energy / 1000.0) : Reading::OfInt(static_cast<int64_t>(*r.energy));
        case Field::kPowerMgmtLimit:
          return Watts(r.power_limit_mw);
        case Field::kPowerMgmtLimitMin:
          return r.power_limits ? Watts(r.power_limits->min_mw) : std::nullopt;
        case Field::kPowerMgmtLimitMax:
          return r.power_limits ? Watts(r.power_limits->max_mw) : std::nullopt;
        case Field::kPowerMgmtLimitDef:
          return Watts(r.power_default_mw);
        case Field::kEnforcedPowerLimit:
          return Watts(r.power_enforced_mw);
        case Field::kPstate:
          return IntOf(r.pstate);
        case Field::kFanSpeed:
          return Percent(r.fan, c);
        case Field::kPcieReplay:
          return IntOf(r.pcie_replay);
        case Field::kPcieTxThroughput:
          return IntOf(r.pcie_tx_kbs);
        case Field::kPcieRxThroughput:
          return IntOf(r.pcie_rx_kbs);
        case Field::kPcieMaxLinkGen:
          return IntOf(r.pcie_max_gen);
        case Field::kPcieMaxLinkWidth:
          return IntOf(r.pcie_max_width);
        case Field::kPcieLinkGen:
          return IntOf(r.pcie_gen);
        case Field::kPcieLinkWidth:
          return IntOf(r.pcie_width);
        case Field::kGpuUtil:
          return r.util ? Percent(r.util->gpu, c) : std::nullopt;
        case Field::kMemCopyUtil:
          return r.util ? Percent(r.util->memory, c) : std::nullopt;
        case Field::kEncUtil:
          return Percent(r.enc, c);
        case Field::kDecUtil:
          return Percent(r.dec, c);
        case Field::kPowerViolation:
        case Field::kThermalViolation:
        case Field::kSyncBoostViolation:
        case Field::kBoardLimitViolation:
        case Field::kLowUtilViolation:
        case Field::kReliabilityViolation:
        case Field::kTotalAppClocksViolation:
        case Field::kTotalBaseClocksViolation:
          for (size_t i = 0; i < std::size(kViolations); ++i) {
            if (kViolations[i].first == c.field) return IntOf(r.violation_ns[i]);
          }
          return std::nullopt;
        case Field::kXidErrors:  // as a label: the last XID
          return Reading::OfInt(static_cast<int64_t>(MergeXids(xids, g.index, gi).last));
        case Field::kEccCurrent:
          return r.ecc_mode ? std::optional<Reading>(Reading::OfInt(r.ecc_mode->first ? 1 : 0)) : std::nullopt;
        case Field::kEccPending:
          return r.ecc_mode ? std::optional<Reading>(Reading::OfInt(r.ecc_mode->second ? 1 : 0)) : std::nullopt;
        case Field::kEccSbeVol:
          return IntOf(r.ecc[0]);
        case Field::kEccDbeVol:
          return IntOf(r.ecc[1]);
        case Field::kEccSbeAgg:
          return IntOf(r.ecc[2]);
        case Field::kEccDbeAgg:
          return IntOf(r.ecc[3]);
        case Field::kRetiredSbe:
          return IntOf(r.retired[0]);
        case Field::kRetiredDbe:
          return IntOf(r.retired[1]);
        case Field::kRetiredPending:
          return IntOf(r.retired[2]);
        case Field::kUncorrectableRemappedRows:
          return r.remapped ? IntOf(std::optional<unsigned>(r.remapped->uncorrectable)) : std::nullopt;
        case Field::kCorrectableRemappedRows:
          return r.remapped ? IntOf(std::optional<unsigned>(r.remapped->correctable)) : std::nullopt;
        case Field::kRowRemapFailure:
          return r.remapped ? IntOf(std::optional<unsigned>(r.remapped->failure)) : std::nullopt;
        case Field::kFbTotal:
        case Field::kFbFree:
        case Field::kFbUsed:
        case Field::kFbReserved:
        case Field::kFbUsedPercent: {
          const auto& mem = entity(mig).mem;
          if (!mem) return std::nullopt;
          if (c.field == Field::kFbTotal) return Mib(mem->total, c);
          if (c.field == Field::kFbFree) return Mib(mem->free, c);
          if (c.field == Field::kFbUsed) return Mib(mem->used, c);
          if (c.field == Field::kFbReserved) return mem->reserved_known ? Mib(mem->reserved, c) : std::nullopt;
          // DCGM's ratio: used / (total - reserved).
          if (mem->total <= mem->reserved) return std::nullopt;
          return Reading::OfDouble(static_cast<double>(mem->used) / static_cast<double>(mem->total - mem->reserved));
        }
        case Field::kBar1Total:
          return r.bar1 ? Mib(r.bar1->total, c) : std::nullopt;
        case Field::kBar1Used:
          return r.bar1 ? Mib(r.bar1->used, c) : std::nullopt;
        case Field::kBar1Free:
          return r.bar1 ? Mib(r.bar1->free, c) : std::nullopt;
        case Field::kNvlinkBandwidthTotal:
        case Field::kNvlinkBandwidthLane: {
          std::optional<double> kibps = r.nvlink_kibps;
          if (c.field == Field::kNvlinkBandwidthLane) {
            auto it = r.lane_kibps.find(c.index);
            kibps = it == r.lane_kibps.end() ? std::nullopt : std::optional<double>(it->second);
          }
          if (!kibps) return std::nullopt;
          // MB/s as kgpu always reported it (KiB/s / 1000), or bytes per second.
          return Reading::OfInt(static_cast<int64_t>(c.base_units ? *kibps * 1024 : *kibps / 1000.0));
        }
        case Field::kNvlinkCrcFlitErrors:
          return IntOf(r.nvlink_errors[0]);
        case Field::kNvlinkCrcDataErrors:
          return IntOf(r.nvlink_errors[1]);
        case Field::kNvlinkReplayErrors:
          return IntOf(r.nvlink_errors[2]);
        case Field::kNvlinkRecoveryErrors:
          return IntOf(r.nvlink_errors[3]);
        case Field::kComputeMode:
          return IntOf(r.compute_mode);
        case Field::kPersistenceMode:
          return IntOf(r.persistence);
        case Field::kMigMode:
          return IntOf(r.mig_mode);
        case Field::kCudaComputeCapability:
          return Reading::OfInt((static_cast<int64_t>(g.cc_major) << 16) | g.cc_minor);
        case Field::kMinorNumber:
          return Reading::OfInt(g.minor);
        case Field::kNvmlIndex:
          return Reading::OfInt(g.index);
        case Field::kPciCombinedId:
          return r.pci ? std::optional<Reading>(Reading::OfInt(r.pci->pci_device_id)) : std::nullopt;
        case Field::kPciSubsysId:
          return r.pci ? std::optional<Reading>(Reading::OfInt(r.pci->pci_subsystem_id)) : std::nullopt;
        case Field::kDevCount:
          return Reading::OfInt(static_cast<int64_t>(inventory_->gpus().size()));
        case Field::kCudaDriverVersion:
          return IntOf(cuda_driver_version_);
        case Field::kVgpuLicenseStatus:
          return std::nullopt;  // a vGPU's licence: a GPU has none (dcgm-exporter serves no value either)
        case Field::kDriverVersion:
          if (inventory_->driver_version().empty()) return std::nullopt;
          return Reading::OfString(inventory_->driver_version());
        case Field::kNvmlVersion:
          return nvml_version_ ? std::optional<Reading>(Reading::OfString(*nvml_version_)) : std::nullopt;
        case Field::kName:
          return Reading::OfString(g.name);
        case Field::kUuid:
          return Reading::OfString(mig != nullptr ? mig->uuid : g.uuid);
        case Field::kPciBusId:
          return Reading::OfString(g.bus_id);
        case Field::kBrand:
        case Field::kSerial:
        case Field::kVbiosVersion:
        case Field::kInforomImageVersion:
        case Field::kOemInforomVersion:
        case Field::kEccInforomVersion:
        case Field::kPowerInforomVersion:
          return string_of(c.field);
        case Field::kProfRatio:
        case Field::kProfBytes: {
          const auto& gpm = entity(mig).gpm;
          auto it = gpm.find(c.index);
          if (it == gpm.end()) return std::nullopt;
          if (c.field == Field::kProfRatio) return Reading::OfDouble(it->second / 100.0);  // GPM: percent
          return Reading::OfInt(static_cast<int64_t>(it->second * 1048576.0));             // GPM: MiB/s
        }
        case Field::kXidErrorsTotal:
        case Field::kXidErrorsCount:
        case Field::kClockEventsCount:
        case Field::kClockEventsTotal:
        case Field::kGpuHealthStatus:
        case Field::kP2pStatus:
          return std::nullopt;  // families of their own (below)
      }
      return std::nullopt;
    };
    // The GPU-level families: DCGM_EXP_GPU_HEALTH_STATUS and DCGM_EXP_P2P_STATUS.
    auto gpu_level = [&](const Counter& c, std::string& out, const std::string& base_labels, const Attributes& owner) {
      if (c.field == Field::kGpuHealthStatus) {
        // dcgm-exporter's series per DCGM health system (gpu_health_collector.go) from the
        // process's one health source, mapped onto DCGM's systems and failure codes as
        // docs/exporter.md tabulates; every kgpu fault is a failure (20), a system without one passes (0).
        std::map<std::string, HealthIncident> incidents;
        auto fail = [&](const char* system, const char* code) {
          incidents.try_emplace(system, HealthIncident{kHealthFail, code});  // a system's first cause stands
        };
        if (down == "lost") fail("PCIE", "DCGM_FR_NVML_API");
        if (!down.empty() && down != "lost") fail("DRIVER", "DCGM_FR_NVML_API");
        const unsigned long long last_xid = MergeXids(xids, g.index, nvml::kNoInstance).last;
        std::vector<std::string> uuids{g.uuid};
        for (const auto& m : g.migs) uuids.push_back(m.uuid);
        for (const auto& u : uuids) {
          const auto h = health.find(u);
          if (h == health.end() || h->second.healthy) continue;
          const std::string& cause = h->second.cause;
          if (cause == "xid") {
            fail(XidHealthSystem(last_xid), last_xid == 95 ? "DCGM_FR_UNCONTAINED_ERROR" : "DCGM_FR_XID_ERROR");
          } else if (cause == "ecc") {
            fail("MEM", "DCGM_FR_VOLATILE_DBE_DETECTED");
          } else if (cause == "lost") {
            fail("PCIE", "DCGM_FR_NVML_API");
          } else {
            fail("DRIVER", cause == "hung" || cause == "registration" ? "DCGM_FR_NVML_API" : "DCGM_FR_UNKNOWN");
          }
        }
        if (r.ecc[1] && *r.ecc[1] > 0) fail("MEM", "DCGM_FR_VOLATILE_DBE_DETECTED");
        if (r.remapped && r.remapped->failure) fail("MEM", "DCGM_FR_ROW_REMAP_FAILURE");
        for (const char* system : kHealthSystems) {
          const auto it = incidents.find(system);
          const HealthIncident incident = it == incidents.end() ? HealthIncident{} : it->second;
          Attributes a = owner;
          a.emplace_back(label::kHealthErrorCode, incident.code);
          a.emplace_back(label::kHealthWatch, system);
          Line(out, c.name, base_labels, a, std::to_string(incident.health));
        }
        return;
      }
      // dcgm-exporter's P2P status (p2p_status_collector.go, from dcgmGetNvLinkP2PStatus): the
      // NVLink capability towards every other GPU, by its index. Topology does not change while
      // the process runs: each pair is asked once.
      if (!down.empty()) return;
      for (const auto& peer : inventory_->gpus()) {
        if (peer.index == g.index || !peer.error.empty()) continue;
        const auto key = std::make_pair(g.uuid, peer.uuid);
        auto cached = p2p_.find(key);
        if (cached == p2p_.end()) {
          auto status = lib_.P2PStatus(g.handle, peer.handle, nvml::Library::P2PCaps::kNvLink);
          if (!status.ok()) {
            if (!nvml::IsNoValue(status.status())) nvml_errors_++;
            continue;
          }
          cached = p2p_.emplace(key, *status).first;
        }
        Attributes a = owner;
        a.emplace_back(label::kLinkStatus, P2pStatusName(cached->second));
        a.emplace_back(label::kPeerGpu, std::to_string(peer.index));
        Line(out, c.name, base_labels, a, std::to_string(cached->second));
      }
    };
    // The CSV's `label` rows: labels on every series of the device, named after the field as
    // written (dcgm-exporter's rule), in name order.
    auto label_fields = [&](const gpu::MigDevice* mig) {
      Attributes out;
      if (!has_labels) return out;
      for (const Counter& c : counters) {
        if (c.type != "label") continue;
        if (auto v = read(c, mig)) out.emplace_back(c.name, v->Text());
      }
      std::sort(out.begin(), out.end());
      return out;
    };

    // The entities of this GPU.
    std::vector<Entity> entities;
    auto base = [&](const gpu::MigDevice* mig) {
      std::string b;
      AppendLabel(b, label::kGpu, std::to_string(g.index));
      AppendLabel(b, options_.use_old_namespace ? label::kOldUuid : label::kUuid, g.uuid);  // -o: 1.x's name
      AppendLabel(b, label::kPciBusId, g.bus_id);
      AppendLabel(b, label::kDevice, Cat("nvidia", g.index));
      std::string model = g.name;
      if (options_.replace_blanks_in_model_name) std::replace(model.begin(), model.end(), ' ', '-');
      AppendLabel(b, label::kModelName, model);
      if (mig != nullptr) {
        AppendLabel(b, label::kGpuInstanceProfile, Cat(mig->gi_slices, "g.", (mig->memory_mib + 1023) / 1024, "gb"));
        AppendLabel(b, label::kGpuInstanceId, std::to_string(mig->gi));
      }
      // Hostname, or hostname as dcgm-exporter 4.6+ spells it (--hostname-label).
      if (!options_.hostname.empty()) AppendLabel(b, options_.hostname_label, options_.hostname);
      for (const auto& [k, v] : label_fields(mig)) AppendLabel(b, k, v);  // the CSV's `label` rows
      return b;
    };
    // -d: flex (the default) takes a GPU whole, or its GPU instances when MIG is on; g and i take
    // the GPUs and the GPU instances they name (a MIG GPU as a whole GPU too with g).
    const DeviceSelector& select = options_.devices;
    if (select.flex ? !g.mig_enabled : select.Gpu(g.index)) {
      entities.push_back({&g, nullptr, {g.uuid}, g.handle, base(nullptr)});
    }
    if (g.mig_enabled) {
      // One entity per GPU instance (dcgm-exporter's unit), whatever its compute instances.
      for (const auto& m : g.migs) {
        if (!select.flex && !select.Instance(m.gi)) continue;
        auto same = std::find_if(entities.begin(), entities.end(),
                                 [&](const Entity& x) { return x.mig != nullptr && x.mig->gi == m.gi; });
        if (same != entities.end()) {
          same->uuids.push_back(m.uuid);
          continue;
        }
        entities.push_back({&g, &m, {m.uuid}, m.handle, base(&m)});
      }
      // flex on a MIG GPU without a GPU instance (none made yet, or their listing failed at
      // discovery): the GPU whole, as -d g shows it, so that it keeps kgpu_gpu_up, its health and
      // XID families and its GPU-wide readings instead of going silent.
      if (select.flex && entities.empty()) entities.push_back({&g, nullptr, {g.uuid}, g.handle, base(nullptr)});
    }

    const PodLabelling pod_labelling{options_.use_old_namespace,
                                     options_.pod_uid,
                                     options_.virtual_gpus,
                                     attributor_,
                                     options_.pod_metadata ? &options_.pod_metadata : nullptr,
                                     &reserved_labels_};
    for (const auto& e : entities) {
      Attributes owner;
      std::vector<kubelet::PodRef> pods;
      if (attributor_ != nullptr) {
        for (const auto& u : e.uuids) {
          auto on = attributor_->PodsOnDevice(u);
          pods.insert(pods.end(), on.begin(), on.end());
        }
        std::sort(pods.begin(), pods.end(), [](const kubelet::PodRef& a, const kubelet::PodRef& b) {
          return std::tie(a.namespace_name, a.pod, a.container) < std::tie(b.namespace_name, b.pod, b.container);
        });
        pods.erase(std::unique(pods.begin(), pods.end()), pods.end());
        // kgpu.io/gpu containers on this GPU: the mode their CDI spec applies and the memory it
        // holds them to here (0: not limited, as with enforcement "none").
        for (const auto& p : pods) {
          const auto spec = e.mig == nullptr ? attributor_->ShareOf(p) : std::nullopt;  // shares are never MIG
          if (!spec) continue;
          Attributes a;
          AppendPod(a, p, pod_labelling, e.uuids);
          a.emplace_back(label::kEnforcement, spec->enforcement.empty() ? "hard" : spec->enforcement);
          const auto limit = spec->limit_mib.find(g.uuid);
          const int64_t mib = limit == spec->limit_mib.end() ? 0 : std::max<int64_t>(0, limit->second);
          Line(limit_lines, "kgpu_pod_gpu_memory_limit_bytes", e.base, a, Int(static_cast<uint64_t>(mib) << 20));
        }
        std::set<std::pair<std::string, std::string>> distinct;
        for (const auto& p : pods) distinct.emplace(p.namespace_name, p.pod);
        if (distinct.size() == 1) {  // one pod holds the device: its labels go on every series
          kubelet::PodRef o = pods[0];
          if (pods.size() > 1) o.container.clear();  // through several of its containers
          AppendPod(owner, o, pod_labelling, e.uuids);
          pods.clear();
        } else if (distinct.size() < 2) {
          pods.clear();
        }
      }
      // --hpc-job-mapping-dir: the device's first job on each of its series here; the others
      // repeat them (RepeatForJobs below), as dcgm-exporter writes one series per job.
      const std::vector<std::string> jobs =
          options_.hpc_jobs
              ? options_.hpc_jobs->Jobs(g.index, e.mig != nullptr ? std::optional<unsigned>(e.mig->gi) : std::nullopt)
              : std::vector<std::string>();
      if (!jobs.empty()) owner.emplace_back(label::kHpcJob, jobs.front());
      std::vector<size_t> job_marks;  // where this device's lines start in each buffer
      if (jobs.size() > 1) {
        for (const std::string& l : lines) job_marks.push_back(l.size());
        job_marks.push_back(up_lines.size());
        job_marks.push_back(reason_lines.size());
      }
      const unsigned gi = e.mig != nullptr ? e.mig->gi : nvml::kNoInstance;
      const bool whole_gpu_entity =
          std::any_of(entities.begin(), entities.end(), [](const Entity& x) { return x.mig == nullptr; });
      const XidView merged_xids = MergeXids(xids, g.index, gi);

      for (size_t i = 0; i < counters.size(); ++i) {
        const Counter& c = counters[i];
        if (c.type == "label") continue;  // on every series, through `base`
        std::string& out = lines[i];
        switch (c.field) {
          case Field::kXidErrors: {
            // dcgm-exporter serves every device's last XID from the start: 0, "No Error", before the
            // first (dashboards and increase() rules rely on the series being there).
            const unsigned long long last = merged_xids.last;
            Attributes a = owner;
            a.emplace_back(label::kErrCode, std::to_string(last));
            a.emplace_back(label::kErrMsg, XidMessage(last));
            Line(out, c.name, e.base, a, Int(last));
            break;
          }
          case Field::kXidErrorsTotal:
            // As dcgm-exporter's (xid_total_collector.go): a series per XID seen, none before the first.
            for (const auto& [xid, n] : merged_xids.counts) {
              Attributes a = owner;
              a.emplace_back(label::kXid, std::to_string(xid));
              Line(out, c.name, e.base, a, Int(n));
            }
            break;
          case Field::kXidErrorsCount:
          case Field::kClockEventsCount: {
            // dcgm-exporter's windowed counts (expcollector.go): one series per value seen within the
            // window, or one series of 0 without the value's label when none was.
            const bool xid = c.field == Field::kXidErrorsCount;
            const auto window = xid ? options_.xid_count_window : options_.clock_events_count_window;
            std::map<std::string, uint64_t> counts;  // xid or clock_event -> count
            if (xid) {
              for (const auto& [code, n] : merged_xids.recent) counts[std::to_string(code)] += n;
            } else {
              for (const auto& [bit, n] : clock_counts) counts[ClockEventName(bit)] += n;
            }
            Attributes a = owner;
            a.emplace_back(label::kWindowSize, std::to_string(window.count()));
            if (counts.empty()) {
              Line(out, c.name, e.base, a, "0");
              break;
            }
            for (const auto& [value, n] : counts) {
              Attributes v = a;
              v.emplace_back(xid ? label::kXid : label::kClockEvent, value);
              Line(out, c.name, e.base, v, Int(n));
            }
            break;
          }
          case Field::kClockEventsTotal:
            // As dcgm-exporter's (clock_events_total_collector.go): activations, none before the first.
            if (auto ce = clock_events_.find(g.index); ce != clock_events_.end()) {
              for (const auto& [bit, n] : ce->second.totals) {
                Attributes a = owner;
                a.emplace_back(label::kClockEvent, ClockEventName(bit));
                Line(out, c.name, e.base, a, Int(n));
              }
            }
            break;
          case Field::kGpuHealthStatus:
          case Field::kP2pStatus:
            // GPU-level families (dcgm-exporter reads them for GPU entities): with the GPU's own
            // series, or once with the GPU's labels on a MIG GPU shown as its instances.
            if (e.mig == nullptr) {
              gpu_level(c, out, e.base, owner);
            } else if (&e == &entities.front() && !whole_gpu_entity) {
              gpu_level(c, out, base(nullptr), Attributes{});
            }
            break;
          default: {
            if (!down.empty()) break;  // the readings of a GPU that cannot be read: absent, never zeroed
            const auto v = read(c, e.mig);
            if (!v) break;
            if (v->kind == Reading::Kind::kString) {
              // A string field with a type other than label: an info-style series, the string as its
              // `value` label (dcgm-exporter would write the string as the sample value, which
              // Prometheus cannot parse).
              Attributes a = owner;
              a.emplace_back(label::kValue, v->s);
              Line(out, c.name, e.base, a, "1");
            } else {
              Line(out, c.name, e.base, owner, v->Text());
            }
            break;
          }
        }
      }

      // The device's health: always one kgpu_gpu_up series, and one series per current reason.
      // Up means usable: readable, and healthy as kubelet is told (every UUID of the entity).
      std::set<std::string> reasons;
      if (!down.empty()) reasons.insert(down == "lost" ? "lost" : "unreadable");
      for (const auto& u : e.uuids) {
        const auto h = health.find(u);
        if (h != health.end() && !h->second.healthy)
          reasons.insert(h->second.cause.empty() ? "unhealthy" : h->second.cause);
      }
      Line(up_lines, "kgpu_gpu_up", e.base, owner, reasons.empty() ? "1" : "0");
      if (r.ecc[1] && *r.ecc[1] > 0) reasons.insert("ecc");
      if (r.remapped && r.remapped->failure) reasons.insert("row_remap_failure");
      for (const std::string& reason : reasons) {
        Attributes a = owner;
        a.emplace_back(label::kReason, reason);
        Line(reason_lines, "kgpu_gpu_unhealthy_reason", e.base, a, "1");
      }

      // Shared device: one series per pod from the pod's own processes.
      if (pods.size() > 1 && down.empty()) {
        std::map<std::string, std::pair<uint64_t, unsigned>> per_pod;  // key -> (bytes, sm%)
        auto key = [](const kubelet::PodRef& p) { return Cat(p.namespace_name, "/", p.pod, "/", p.container); };
        for (const auto& p : pods) per_pod[key(p)] = {0, 0};
        for (const auto& proc : r.processes) {
          if (e.mig != nullptr && proc.gi != e.mig->gi) continue;
          std::string mig_uuid;
          for (const auto& m : g.migs) {
            if (e.mig != nullptr && m.gi == proc.gi && m.ci == proc.ci) mig_uuid = m.uuid;
          }
          auto pod = attributor_->Attribute(proc.pid, g.uuid, mig_uuid);
          if (!pod) continue;
          auto it = per_pod.find(key(*pod));
          if (it == per_pod.end()) continue;
          it->second.first += proc.used_bytes;
          auto u = r.sm_util_by_pid.find(proc.pid);
          if (u != r.sm_util_by_pid.end()) it->second.second = std::min(100U, it->second.second + u->second);
        }
        for (size_t i = 0; i < counters.size(); ++i) {
          const Counter& c = counters[i];
          if (c.type == "label" || (c.field != Field::kFbUsed && !(c.field == Field::kGpuUtil && e.mig == nullptr))) {
            continue;
          }
          for (const auto& p : pods) {
            Attributes a;
            AppendPod(a, p, pod_labelling, e.uuids);
            const auto& fig = per_pod[key(p)];
            // In the row's unit: MiB and %, or bytes and a ratio for DCGM 4.7's names.
            const std::string value = c.field == Field::kFbUsed ? Int(c.base_units ? fig.first : fig.first >> 20)
                                      : c.base_units            ? Double(fig.second / 100.0)
                                                                : Int(fig.second);
            Line(lines[i], c.name, e.base, a, value);
          }
        }
      }
      if (!job_marks.empty()) {
        for (size_t i = 0; i < lines.size(); ++i) RepeatForJobs(lines[i], job_marks[i], jobs);
        RepeatForJobs(up_lines, job_marks[lines.size()], jobs);
        RepeatForJobs(reason_lines, job_marks[lines.size() + 1], jobs);
      }
    }
  }

  if (!gpm_missing_new_.empty()) {
    Log("exporter")
        ->info(
            "the DCGM_FI_PROF_* rows of the counters file have no series on GPU {}: NVML's GPU performance "
            "monitoring (GPM) needs a Hopper or newer GPU, as dcgm-exporter has none without DCGM's profiling "
            "module (logged once)",
            Join(gpm_missing_new_, ", "));
    gpm_missing_new_.clear();
  }
  std::string text;
  for (size_t i = 0; i < counters.size(); ++i) {
    if (lines[i].empty()) continue;
    prom::AppendHeader(text, counters[i].name, counters[i].type, counters[i].help);  // the CSV's help, escaped
    text += lines[i];
  }
  if (!up_lines.empty()) {
    text +=
        Cat("# HELP kgpu_gpu_up 1 when the GPU is usable, 0 when it is lost or cannot be read (its other series "
            "are absent meanwhile) or unhealthy as the device plugin serves it to kubelet (a fatal XID, a hung NVML "
            "call).\n# TYPE kgpu_gpu_up gauge\n",
            up_lines);
  }
  if (!limit_lines.empty()) {
    text +=
        Cat("# HELP kgpu_pod_gpu_memory_limit_bytes GPU memory a kgpu.io/gpu container is held to on this GPU "
            "(0: not limited), with the enforcement mode applied (hard, mps, none).\n"
            "# TYPE kgpu_pod_gpu_memory_limit_bytes gauge\n",
            limit_lines);
  }
  if (!reason_lines.empty()) {
    text +=
        Cat("# HELP kgpu_gpu_unhealthy_reason 1 for each reason the GPU is unusable now: lost, unreadable, xid (a "
            "fatal XID), hung (an NVML call that does not return), registration, ecc (uncorrectable ECC errors since "
            "its last reset), row_remap_failure.\n"
            "# TYPE kgpu_gpu_unhealthy_reason gauge\n",
            reason_lines);
  }
  return text;
}

void Collector::NoteTransition(const gpu::Gpu& g, const std::string& down, const std::string& detail) {
  auto it = down_seen_.find(g.index);
  const std::string before = it == down_seen_.end() ? std::string() : it->second;
  if (before == down) return;
  const std::string uuid = g.uuid.empty() ? "UUID unknown" : g.uuid;
  if (down.empty()) {
    down_seen_.erase(g.index);
    Log("exporter")->info("GPU {} ({}) is readable again: its series are back, kgpu_gpu_up is 1", g.index, uuid);
    return;
  }
  down_seen_[g.index] = down;
  Log("exporter")
      ->warn(
          "GPU {} ({}) is {}: {}; kgpu_gpu_up is 0 and its readings are absent until it is back "
          "(logged once)",
          g.index, uuid, down, detail);
}

// ---------------------------------------------------------------- Exporter

Exporter::Exporter(const nvml::Library& lib, std::shared_ptr<const gpu::Inventory> inventory, ExporterOptions options)
    : lib_(lib), inventory_(std::move(inventory)), options_(std::move(options)) {
  if (options_.kubernetes) {
    attributor_ = std::make_unique<PodAttributor>(
        PodAttributor::Options{options_.proc_root, options_.checkpoint_path, options_.cdi_spec_dir});
  }
  pod_resources_ = std::make_unique<kubelet::PodResourcesClient>(options_.pod_resources_socket);
  collector_ = std::make_unique<Collector>(lib_, inventory_, options_, attributor_.get());
  mig_seen_ = gpu::MigFingerprint(*inventory_);
  buffer_ = std::make_shared<const std::string>();
}

Exporter::~Exporter() {
  Stop();
}

void Exporter::RefreshPods() {
  auto allocations = pod_resources_->List(std::chrono::seconds(5));
  if (!allocations.ok()) {
    pod_errors_++;
    pods_log_.Report(spdlog::level::warn,
                     Cat("PodResources: ", allocations.status().message(),
                         "; pod labels keep their last known values (retried every ",
                         options_.pod_resources_interval.count(), " ms, logged again when the error changes)"));
    return;
  }
  pods_log_.Clear(Cat("PodResources: kubelet answers again on ", options_.pod_resources_socket, " after ",
                      pod_errors_.load(), " failed List call(s) in all"));
  if (options_.gpu_id_type == "device-name") {
    // Device IDs like "nvidia3" name GPUs by index: translate them to UUIDs.
    for (auto& a : *allocations) {
      if (a.device_id.rfind("nvidia", 0) != 0) continue;
      const std::string idx = a.device_id.substr(6, a.device_id.find('/') - 6);
      for (const auto& g : inventory_->gpus()) {
        if (std::to_string(g.index) == idx) a.device_id = g.uuid;
      }
    }
  }
  attributor_->Update(std::move(*allocations));
}

void Exporter::CollectNow() {
  const auto t0 = std::chrono::steady_clock::now();
  // MIG re-partitioned (kgpu mig apply, nvidia-smi mig): GPU instance series follow the new layout.
  if (const std::string seen = gpu::MigFingerprintNow(lib_, collector_->inventory()); seen != mig_seen_) {
    if (auto inv = gpu::Inventory::Discover(lib_, options_.discover); inv.ok()) {
      rediscovery_log_.Clear("MIG re-discovery works again");
      Log("exporter")->info("MIG layout changed: re-discovered {} GPU(s)", (*inv)->gpus().size());
      collector_->SetInventory(*inv);
      mig_seen_ = gpu::MigFingerprint(**inv);
    } else {  // tried again at the next collection
      rediscovery_log_.Report(spdlog::level::warn, Cat("MIG layout changed, but re-discovery failed: ",
                                                       inv.status().message(), " (retried at every collection)"));
    }
  }
  auto text = std::make_shared<const std::string>(collector_->Collect());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    std::lock_guard<std::mutex> lock(buffer_mu_);
    buffer_ = std::move(text);
  }
  collections_++;
  last_duration_ = seconds;
  last_timestamp_ = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::shared_ptr<const std::string> Exporter::Buffer() {
  std::lock_guard<std::mutex> lock(buffer_mu_);
  return buffer_;
}

std::string Exporter::Scrape() {
  const auto buffer = Buffer();
  const std::string tail = OwnMetrics();
  std::string out;
  out.reserve(buffer->size() + tail.size());
  out += *buffer;
  out += tail;
  return out;
}

std::optional<std::string> Exporter::ScrapeGzip() {
  const auto buffer = Buffer();
  std::shared_ptr<const GzipBody> gz;
  {
    // The collection is deflated once, by the first scrape that asks for gzip after it; the
    // others wait for it here instead of deflating it again.
    std::lock_guard<std::mutex> lock(gzip_mu_);
    if (gzip_of_ != buffer) {
      gzip_ = GzipBody::Make(*buffer);
      gzip_of_ = buffer;
      if (gzip_) gzip_compressions_++;
    }
    gz = gzip_;
  }
  if (!gz) return std::nullopt;
  return gz->With(OwnMetrics());
}

std::string Exporter::OwnMetrics() {
  const uint64_t scrapes = ++scrapes_;
  std::string out;
  // The exporter's own health, declared in one table.
  struct Own {
    const char* name;
    const char* type;
    const char* help;
    std::string value;
  };
  const Own own[] = {
      {"kgpu_exporter_scrapes_total", "counter", "Scrapes of /metrics served.", Int(scrapes)},
      {"kgpu_exporter_collections_total", "counter", "NVML collections completed.", Int(collections_.load())},
      {"kgpu_exporter_collection_duration_seconds", "gauge", "Duration of the last NVML collection.",
       Double(last_duration_.load())},
      {"kgpu_exporter_last_collection_timestamp_seconds", "gauge", "Unix time when the last NVML collection finished.",
       Double(last_timestamp_.load())},
      {"kgpu_exporter_nvml_errors_total", "counter", "NVML calls that failed (other than unsupported values).",
       Int(collector_->nvml_errors())},
      {"kgpu_exporter_podresources_errors_total", "counter", "Failed PodResources List calls.",
       Int(pod_errors_.load())},
      {"kgpu_exporter_log_repeats_suppressed_total", "counter",
       "Warnings not logged again because the same condition persisted (logged once, and when it changes).",
       Int(pods_log_.suppressed() + rediscovery_log_.suppressed())},
      {"kgpu_exporter_gzip_compressions_total", "counter",
       "Collections deflated for gzip scrapes (once per collection, however many scrapers ask).",
       Int(gzip_compressions_.load())},
  };
  for (const auto& m : own) {
    prom::AppendHeader(out, m.name, m.type, m.help);
    out += Cat(m.name, " ", m.value, "\n");
  }
  return out;
}

absl::Status Exporter::Start() {
  auto log = Log("exporter");
  // Health and XIDs (DCGM_FI_DEV_XID_ERRORS, DCGM_EXP_XID_ERRORS_TOTAL) from the process's one
  // health monitor: handed in by `kgpu node` (the device plugin's), else this exporter's own.
  if (options_.health) {
    collector_->SetHealthSource(options_.health);
  } else if (!own_health_) {
    gpu::HealthOptions ho;
    ho.recover_after = options_.health_recover_after;
    ho.on_xid = [this](unsigned g, unsigned gi, unsigned long long xid) { collector_->RecordXid(g, gi, xid); };
    own_health_ = std::make_unique<gpu::HealthMonitor>(lib_, inventory_, ho, nullptr);
    if (auto st = own_health_->Start(); !st.ok()) {
      log->warn("health monitor: {}; XID metrics may be missing", std::string(st.message()));
    }
    collector_->SetHealthSource([m = own_health_.get()] { return m->Snapshot(); });
  }
  if (attributor_) RefreshPods();
  CollectNow();

  // HTTP, or HTTPS, basic auth, extra headers and a rate limit as --web-config-file says.
  if (auto a = ParseListenAddress("-a/--address (DCGM_EXPORTER_LISTEN)", options_.address); !a.ok()) return a.status();
  auto server = web::MakeServer(options_.web ? &*options_.web : nullptr);
  if (!server.ok()) return server.status();
  http_ = std::move(*server);
  // dcgm-exporter's --web-read-timeout and --web-write-timeout (10 s and 30 s by default).
  auto seconds_and_micros = [](std::chrono::milliseconds d) {
    return std::pair<time_t, time_t>(static_cast<time_t>(d.count() / 1000),
                                     static_cast<time_t>(d.count() % 1000) * 1000);
  };
  const auto [read_s, read_us] = seconds_and_micros(options_.web_read_timeout);
  const auto [write_s, write_us] = seconds_and_micros(options_.web_write_timeout);
  http_->set_read_timeout(read_s, read_us);
  http_->set_write_timeout(write_s, write_us);
  // Small responses (gzip, /health) must not wait for the client's delayed ACK (Nagle): ~40 ms.
  http_->set_tcp_nodelay(true);
  // Scrapers are few: two workers instead of one per core keep threads and arenas small. With
  // basic auth the gate runs one bcrypt at a time and answers 429 to a second meanwhile (never a
  // wait), so wrong passwords hold at most one worker and the other serves the scrapes its cache
  // admits.
  http_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  // Every path goes through the web config's gate first, as exporter-toolkit wraps its whole
  // handler: its headers on every answer, then its rate limit and its basic auth users.
  auto gate = std::make_shared<web::Gate>(options_.web ? *options_.web : web::WebConfig{});
  auto admit = [gate](const httplib::Request& req, httplib::Response& res) {
    for (const auto& [name, value] : gate->headers()) res.headers.emplace(name, value);
    std::string authorization;
    if (const auto it = req.headers.find("Authorization"); it != req.headers.end()) authorization = it->second;
    web::Verdict verdict = gate->Admit(authorization);
    if (verdict.status == 200) return true;
    res.status = verdict.status;
    for (auto& [name, value] : verdict.headers) res.headers.emplace(std::move(name), std::move(value));
    res.set_content(verdict.body, "text/plain; charset=utf-8");
    return false;
  };
  http_->Get("/metrics", [this, admit](const httplib::Request& req, httplib::Response& res) {
    if (!admit(req, res)) return;
    constexpr const char* kType = "text/plain; version=0.0.4; charset=utf-8";
    // (The headers are read and written as the maps they are: the release binary loads httplib
    // lazily and forwards only the few functions src/cli/lazy_httplib.cc lists.)
    bool gzip = false;
    for (auto [it, end] = req.headers.equal_range("Accept-Encoding"); it != end; ++it)
      gzip = gzip || AcceptsGzip(it->second);
    // The encoding is decided here, from the page gzipped once per collection: httplib would
    // compress the text again by the request's Accept-Encoding alone (even for gzip;q=0).
    AnswerUncompressed(req);
    if (gzip) {
      if (auto gz = ScrapeGzip()) {
        res.headers.emplace("Content-Encoding", "gzip");
        res.set_content(*gz, kType);
        return;
      }
    }
    res.set_content(Scrape(), kType);
  });
  http_->Get("/health", [this, admit](const httplib::Request& req, httplib::Response& res) {
    if (!admit(req, res)) return;
    // --health-require-gpus: a liveness probe restarts an exporter that found no GPU.
    if (options_.health_require_gpus && inventory_->gpus().empty()) {
      res.status = 503;
      res.set_content("no GPU found (--health-require-gpus)\n", "text/plain");
      return;
    }
    res.set_content("OK", "text/plain");
  });
  http_->Get("/", [admit](const httplib::Request& req, httplib::Response& res) {
    if (!admit(req, res)) return;
    res.set_content("<html><body><h1>kgpu exporter</h1><a href=\"/metrics\">Metrics</a></body></html>", "text/html");
  });
  auto bound = BindListenAddress(*http_, "-a/--address (DCGM_EXPORTER_LISTEN)", options_.address);
  if (!bound.ok()) return bound.status();
  port_ = *bound;
  http_thread_ = ListenOnThread<httplib::Server, std::jthread>(*http_);
  const bool tls = options_.web && options_.web->tls.enabled;
  log->info("serving /metrics over {} on {} (port {}; {} GPU families, collection every {} ms{})",
            tls ? "HTTPS" : "HTTP", options_.address, port_, options_.counters.size(), options_.interval.count(),
            gate->auth_required() ? "; basic auth" : "");

  collect_thread_ = std::jthread([this](std::stop_token stop) {
    while (SleepFor(stop, options_.interval)) CollectNow();
  });
  if (attributor_) {
    pods_thread_ = std::jthread([this](std::stop_token stop) {
      while (SleepFor(stop, options_.pod_resources_interval)) RefreshPods();
    });
  }
  return absl::OkStatus();
}

void Exporter::Stop() {
  for (std::jthread* t : {&collect_thread_, &pods_thread_}) t->request_stop();
  if (http_) http_->stop();
  for (std::jthread* t : {&collect_thread_, &pods_thread_, &http_thread_}) {
    if (t->joinable()) t->join();
  }
  if (own_health_) own_health_->Stop();
}

}  // namespace kgpu::exporter
