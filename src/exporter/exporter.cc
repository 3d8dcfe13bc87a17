#include "exporter/exporter.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include <httplib.h>

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

constexpr unsigned kFieldMemoryTemp = 82, kFieldNvlinkTx = 138, kFieldNvlinkRx = 139;

void AppendLabel(std::string& out, std::string_view key, std::string_view value) {
  if (!out.empty()) out += ',';
  out.append(key);
  out += "=\"";
  prom::AppendLabelValue(out, value);  // the escaping every kgpu /metrics shares
  out += '"';
}

using Attributes = std::vector<std::pair<std::string, std::string>>;

void AppendPod(Attributes& attrs, const kubelet::PodRef& pod) {
  attrs.emplace_back("container", pod.container);
  attrs.emplace_back("namespace", pod.namespace_name);
  attrs.emplace_back("pod", pod.pod);
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

// What one GPU read out in this collection (shared by its GPU instances).
struct GpuReadout {
  std::optional<unsigned> sm_clock, mem_clock, gpu_temp, power_mw, pcie_replay, enc, dec;
  std::optional<uint64_t> mem_temp, energy, nvlink_kib;
  std::optional<nvml::Library::Utilization> util;
  std::optional<nvml::Library::RemappedRows> remapped;
  std::optional<uint64_t> ecc[4];  // sbe vol, dbe vol, sbe agg, dbe agg
  std::vector<nvml::Library::ProcessInfo> processes;
  std::map<unsigned, unsigned> sm_util_by_pid;
};

}  // namespace

// ---------------------------------------------------------------- Collector

Collector::Collector(const nvml::Library& lib, std::shared_ptr<const gpu::Inventory> inventory,
                     const ExporterOptions& options, const PodAttributor* attributor)
    : lib_(lib), inventory_(std::move(inventory)), options_(options), attributor_(attributor) {}

void Collector::RecordXid(unsigned gpu, unsigned gi, unsigned long long xid) {
  std::lock_guard<std::mutex> lock(xid_mu_);
  XidState& s = xids_[{gpu, gi}];
  s.last = xid;
  s.counts[xid]++;
}

std::string Collector::Collect() {
  const auto& counters = options_.counters;
  std::vector<std::string> lines(counters.size());
  bool driver_label = false;
  for (const auto& c : counters) driver_label = driver_label || c.field == Field::kDriverVersion;

  // Reads a value; "no value" (NOT_SUPPORTED and friends) is omitted, other errors are counted.
  auto get = [&](auto result) -> std::optional<typename decltype(result)::value_type> {
    if (result.ok()) return *result;
    if (!nvml::IsNoValue(result.status())) nvml_errors_++;
    return std::nullopt;
  };

  std::map<std::pair<unsigned, unsigned>, XidState> xids;
  {
    std::lock_guard<std::mutex> lock(xid_mu_);
    xids = xids_;
  }
  const auto now = std::chrono::steady_clock::now();
  std::string up_lines, reason_lines, limit_lines;
  // The process's one health source (the device plugin's monitor in `kgpu node`, the exporter's
  // own otherwise): a device kubelet is told is Unhealthy has kgpu_gpu_up 0, with its reason.
  const std::map<std::string, gpu::DeviceHealth> health =
      health_ ? health_() : std::map<std::string, gpu::DeviceHealth>{};

  for (const auto& g : inventory_->gpus()) {
    // A GPU NVML cannot read (lost, or failed at discovery) keeps its identity: kgpu_gpu_up 0,
    // its reason and its XID families stay; its readings are absent (never zeroed) until it is back.
    std::string down = g.error.empty() ? "" : g.lost ? "lost" : "unreadable";
    std::string down_detail = g.error;
    GpuReadout r;
    std::optional<uint64_t> nvlink_rate;
    if (down.empty()) {
      auto sm = lib_.ClockMhz(g.handle, nvml::Library::Clock::kSm);
      if (nvml::IsGpuLost(sm.status())) {
        nvml_errors_++;
        down = "lost";
        down_detail = std::string(sm.status().message());
      } else {
        r.sm_clock = get(std::move(sm));
        r.mem_clock = get(lib_.ClockMhz(g.handle, nvml::Library::Clock::kMem));
        r.gpu_temp = get(lib_.TemperatureC(g.handle));
        if (r.gpu_temp && *r.gpu_temp > 200) r.gpu_temp.reset();  // DCGM discards such readings
        r.power_mw = get(lib_.PowerMw(g.handle));
        r.energy = get(lib_.EnergyMj(g.handle));
        r.pcie_replay = get(lib_.PcieReplayCounter(g.handle));
        if (!g.mig_enabled) {
          r.util = get(lib_.GetUtilization(g.handle));
          r.enc = get(lib_.EncoderUtilization(g.handle));
          r.dec = get(lib_.DecoderUtilization(g.handle));
        }
        r.remapped = get(lib_.GetRemappedRows(g.handle));
        for (int i = 0; i < 4; ++i) r.ecc[i] = get(lib_.EccErrors(g.handle, i % 2 == 1, i >= 2));
        if (auto fv = get(lib_.FieldValues(g.handle, {kFieldMemoryTemp, kFieldNvlinkTx, kFieldNvlinkRx}))) {
          r.mem_temp = (*fv)[0];
          if (r.mem_temp && *r.mem_temp > 200) r.mem_temp.reset();
          if ((*fv)[1] && (*fv)[2]) r.nvlink_kib = *(*fv)[1] + *(*fv)[2];
        }
        if (attributor_ != nullptr) {
          if (auto p = get(lib_.ComputeProcesses(g.handle))) r.processes = std::move(*p);
          if (auto s = get(lib_.ProcessUtilization(g.handle, 0))) {
            for (const auto& x : *s) r.sm_util_by_pid[x.pid] = x.sm_util;
          }
        }
        // NVLink bandwidth as dcgm-exporter reports it: a rate in MB/s; 0 on the first sample.
        if (r.nvlink_kib) {
          auto it = nvlink_prev_.find(g.index);
          nvlink_rate = 0;
          if (it != nvlink_prev_.end()) {
            const double dt = std::chrono::duration<double>(now - it->second.second).count();
            if (dt > 0 && *r.nvlink_kib >= it->second.first) {
              nvlink_rate = static_cast<uint64_t>(static_cast<double>(*r.nvlink_kib - it->second.first) / dt / 1000.0);
            }
          }
          nvlink_prev_[g.index] = {*r.nvlink_kib, now};
        }
      }
    }
    NoteTransition(g, down, down_detail);

    // The entities of this GPU.
    std::vector<Entity> entities;
    auto base = [&](const gpu::MigDevice* mig) {
      std::string b;
      AppendLabel(b, "gpu", std::to_string(g.index));
      AppendLabel(b, "UUID", g.uuid);
      AppendLabel(b, "pci_bus_id", g.bus_id);
      AppendLabel(b, "device", Cat("nvidia", g.index));
      std::string model = g.name;
      if (options_.replace_blanks_in_model_name) std::replace(model.begin(), model.end(), ' ', '-');
      AppendLabel(b, "modelName", model);
      if (mig != nullptr) {
        AppendLabel(b, "GPU_I_PROFILE", Cat(mig->gi_slices, "g.", (mig->memory_mib + 1023) / 1024, "gb"));
        AppendLabel(b, "GPU_I_ID", std::to_string(mig->gi));
      }
      if (!options_.hostname.empty()) AppendLabel(b, "Hostname", options_.hostname);
      if (driver_label) AppendLabel(b, "DCGM_FI_DRIVER_VERSION", inventory_->driver_version());
      return b;
    };
    if (g.mig_enabled) {
      // One entity per GPU instance (dcgm-exporter's unit), whatever its compute instances.
      for (const auto& m : g.migs) {
        auto same = std::find_if(entities.begin(), entities.end(), [&](const Entity& x) { return x.mig->gi == m.gi; });
        if (same != entities.end()) {
          same->uuids.push_back(m.uuid);
          continue;
        }
        entities.push_back({&g, &m, {m.uuid}, m.handle, base(&m)});
      }
    } else {
      entities.push_back({&g, nullptr, {g.uuid}, g.handle, base(nullptr)});
    }

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
          AppendPod(a, p);
          a.emplace_back("enforcement", spec->enforcement.empty() ? "hard" : spec->enforcement);
          const auto limit = spec->limit_mib.find(g.uuid);
          const int64_t mib = limit == spec->limit_mib.end() ? 0 : std::max<int64_t>(0, limit->second);
          Line(limit_lines, "kgpu_pod_gpu_memory_limit_bytes", e.base, a, Int(static_cast<uint64_t>(mib) << 20));
        }
        std::set<std::pair<std::string, std::string>> distinct;
        for (const auto& p : pods) distinct.emplace(p.namespace_name, p.pod);
        if (distinct.size() == 1) {  // one pod holds the device: its labels go on every series
          kubelet::PodRef o = pods[0];
          if (pods.size() > 1) o.container.clear();  // through several of its containers
          AppendPod(owner, o);
          pods.clear();
        } else if (distinct.size() < 2) {
          pods.clear();
        }
      }
      std::optional<nvml::MemoryInfo> mem;
      if (down.empty()) mem = get(lib_.Memory(e.handle));
      const unsigned gi = e.mig != nullptr ? e.mig->gi : nvml::kNoInstance;

      for (size_t i = 0; i < counters.size(); ++i) {
        const Counter& c = counters[i];
        std::string& out = lines[i];
        auto emit = [&](std::optional<uint64_t> v) {
          if (v) Line(out, c.name, e.base, owner, Int(*v));
        };
        switch (c.field) {
          case Field::kSmClock:
            emit(r.sm_clock);
            break;
          case Field::kMemClock:
            emit(r.mem_clock);
            break;
          case Field::kMemoryTemp:
            emit(r.mem_temp);
            break;
          case Field::kGpuTemp:
            emit(r.gpu_temp);
            break;
          case Field::kPowerUsage:
            if (r.power_mw) Line(out, c.name, e.base, owner, Double(*r.power_mw / 1000.0));
            break;
          case Field::kTotalEnergy:
            emit(r.energy);
            break;
          case Field::kPcieReplay:
            emit(r.pcie_replay);
            break;
          case Field::kGpuUtil:
            if (r.util) emit(r.util->gpu);
            break;
          case Field::kMemCopyUtil:
            if (r.util) emit(r.util->memory);
            break;
          case Field::kEncUtil:
            emit(r.enc);
            break;
          case Field::kDecUtil:
            emit(r.dec);
            break;
          case Field::kFbFree:
            if (mem) emit(mem->free >> 20);
            break;
          case Field::kFbUsed:
            if (mem) emit(mem->used >> 20);
            break;
          case Field::kFbReserved:
            if (mem && mem->reserved_known) emit(mem->reserved >> 20);
            break;
          case Field::kNvlinkBandwidthTotal:
            emit(nvlink_rate);
            break;
          case Field::kUncorrectableRemappedRows:
            if (r.remapped) emit(r.remapped->uncorrectable);
            break;
          case Field::kCorrectableRemappedRows:
            if (r.remapped) emit(r.remapped->correctable);
            break;
          case Field::kRowRemapFailure:
            if (r.remapped) emit(r.remapped->failure);
            break;
          case Field::kEccSbeVol:
            emit(r.ecc[0]);
            break;
          case Field::kEccDbeVol:
            emit(r.ecc[1]);
            break;
          case Field::kEccSbeAgg:
            emit(r.ecc[2]);
            break;
          case Field::kEccDbeAgg:
            emit(r.ecc[3]);
            break;
          case Field::kXidErrors:
          case Field::kXidErrorsTotal: {
            // Whole-GPU XIDs count on every series of the GPU, a GI's own XIDs on that GI: merged,
            // so each label set appears once.
            std::optional<XidState> merged;
            for (const auto& k : {std::pair{g.index, nvml::kNoInstance}, std::pair{g.index, gi}}) {
              const auto it = xids.find(k);
              if (it == xids.end() || (merged && k.second == nvml::kNoInstance)) continue;
              if (!merged) {
                merged = it->second;
                continue;
              }
              merged->last = it->second.last;  // the instance's own XID
              for (const auto& [xid, n] : it->second.counts) merged->counts[xid] += n;
            }
            if (!merged) break;
            if (c.field == Field::kXidErrors) {
              Attributes a = owner;
              a.emplace_back("err_code", std::to_string(merged->last));
              a.emplace_back("err_msg", XidMessage(merged->last));
              Line(out, c.name, e.base, a, Int(merged->last));
              break;
            }
            for (const auto& [xid, n] : merged->counts) {
              Attributes a = owner;
              a.emplace_back("xid", std::to_string(xid));
              Line(out, c.name, e.base, a, Int(n));
            }
            break;
          }
          case Field::kDriverVersion:
            break;
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
        a.emplace_back("reason", reason);
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
          if (c.field != Field::kFbUsed && !(c.field == Field::kGpuUtil && e.mig == nullptr)) continue;
          for (const auto& p : pods) {
            Attributes a;
            AppendPod(a, p);
            const auto& fig = per_pod[key(p)];
            Line(lines[i], c.name, e.base, a, Int(c.field == Field::kFbUsed ? fig.first >> 20 : fig.second));
          }
        }
      }
    }
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

  // HTTP.
  if (auto a = ParseListenAddress("-a/--address (DCGM_EXPORTER_LISTEN)", options_.address); !a.ok()) return a.status();
  http_ = std::make_unique<httplib::Server>();
  // Small responses (gzip, /health) must not wait for the client's delayed ACK (Nagle): ~40 ms.
  http_->set_tcp_nodelay(true);
  // Scrapers are few: two workers instead of one per core keep threads and arenas small.
  http_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  http_->Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    constexpr const char* kType = "text/plain; version=0.0.4; charset=utf-8";
    // (The headers are read and written as the maps they are: the release binary loads httplib
    // lazily and forwards only the few functions src/cli/lazy_httplib.cc lists.)
    bool gzip = false;
    for (auto [it, end] = req.headers.equal_range("Accept-Encoding"); it != end; ++it)
      gzip = gzip || AcceptsGzip(it->second);
    // The encoding is decided here. httplib (0.11) would compress a text body again by the
    // request's Accept-Encoding alone (whatever the response's Content-Encoding says, and even
    // for gzip;q=0), so the header is dropped from the request once read. (The Request is
    // httplib's own non-const object, handed to handlers by const reference.)
    const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
    if (gzip) {
      if (auto gz = ScrapeGzip()) {
        res.headers.emplace("Content-Encoding", "gzip");
        res.set_content(*gz, kType);
        return;
      }
    }
    res.set_content(Scrape(), kType);
  });
  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("OK", "text/plain"); });
  http_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("<html><body><h1>kgpu exporter</h1><a href=\"/metrics\">Metrics</a></body></html>", "text/html");
  });
  auto bound = BindListenAddress(*http_, "-a/--address (DCGM_EXPORTER_LISTEN)", options_.address);
  if (!bound.ok()) return bound.status();
  port_ = *bound;
  http_thread_ = ListenOnThread<httplib::Server, std::jthread>(*http_);
  log->info("serving /metrics on {} (port {}; {} GPU families, collection every {} ms)", options_.address, port_,
            options_.counters.size(), options_.interval.count());

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
