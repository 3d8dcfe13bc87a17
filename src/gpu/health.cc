#include "gpu/health.h"

#include <algorithm>

#include "common/log.h"
#include "common/sleep.h"
#include "common/strings.h"

namespace kgpu::gpu {
namespace {

constexpr uint64_t kXidFallenOffBus = 79;


}  // namespace

HealthMonitor::HealthMonitor(const nvml::Library& lib, std::shared_ptr<const Inventory> inventory,
                             HealthOptions options, HealthCallback on_change)
    : lib_(lib),
      inventory_(std::move(inventory)),
      options_(std::move(options)),
      on_change_(std::move(on_change)) {}

HealthMonitor::~HealthMonitor() { Stop(); }

bool HealthMonitor::IsFatalXid(uint64_t xid) const {
  if (options_.fatal_xids.count(xid) != 0) return true;
  if (options_.ignore_all_xids) return false;
  return options_.ignored_xids.count(xid) == 0;
}

absl::Status HealthMonitor::Start() {
  auto log = Log("health");
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& g : inventory_->gpus()) {
      if (g.uuid.empty()) continue;
      faults_[g.uuid].lost = g.lost;
    }
  }
  auto set = lib_.CreateEventSet();
  if (!set.ok()) {
    event_errors_++;
    log->warn("cannot create an NVML event set ({}); health comes from probes only",
              std::string(set.status().message()));
  } else {
    events_ = std::move(*set);
    for (const auto& g : inventory_->gpus()) {
      if (!g.error.empty()) continue;
      auto supported = lib_.SupportedEvents(g.handle);
      absl::Status st = supported.status();
      if (supported.ok()) {
        const uint64_t mask = (nvml::kEventXid | nvml::kEventDoubleBitEcc | nvml::kEventSingleBitEcc |
                               (options_.on_mig_change ? nvml::kEventMigConfigChange : 0)) &
                              *supported;
        st = events_->Register(g.handle, mask);
      }
      if (nvml::ReturnOf(st) == nvml::Return::kNotSupported) {
        log->warn("GPU {} ({}) does not support health events; it is checked by probes only",
                  g.index, g.uuid);
      } else if (!st.ok()) {
        log->error("GPU {} ({}): event registration failed: {}", g.index, g.uuid, std::string(st.message()));
        std::lock_guard<std::mutex> lock(mu_);
        faults_[g.uuid].register_failed = true;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    published_ = ComputeLocked();
  }
  if (events_) event_thread_ = std::jthread([this](std::stop_token st) { EventLoop(st); });
  probe_thread_ = std::jthread([this](std::stop_token st) { ProbeLoop(st); });
  watchdog_thread_ = std::jthread([this](std::stop_token st) { WatchdogLoop(st); });
  return absl::OkStatus();
}

void HealthMonitor::Stop() {
  // A probe stuck in a hung NVML call is waited for here: the watchdog has reported it already.
  for (std::jthread* t : {&event_thread_, &probe_thread_, &watchdog_thread_}) {
    t->request_stop();
  }
  for (std::jthread* t : {&event_thread_, &probe_thread_, &watchdog_thread_}) {
    if (t->joinable()) t->join();
  }
}

std::map<std::string, DeviceHealth> HealthMonitor::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

std::map<std::string, DeviceHealth> HealthMonitor::ComputeLocked() const {
  std::map<std::string, DeviceHealth> out;
  auto reason_of = [](const Fault& f) -> std::string {
    if (f.lost) return "GPU is lost (fell off the bus)";
    if (f.hung) return f.hung_reason;
    if (f.xid) return f.xid_reason;
    if (f.register_failed) return "NVML event registration failed";
    return "";
  };
  for (const auto& g : inventory_->gpus()) {
    if (g.uuid.empty()) continue;
    const auto it = faults_.find(g.uuid);
    const std::string gpu_reason = it != faults_.end() ? reason_of(it->second) : "";
    out[g.uuid] = DeviceHealth{g.uuid, gpu_reason.empty(), gpu_reason};
    for (const auto& m : g.migs) {
      const auto mit = faults_.find(m.uuid);
      std::string reason = mit != faults_.end() ? reason_of(mit->second) : "";
      if (!gpu_reason.empty()) reason = Cat("parent GPU: ", gpu_reason);
      out[m.uuid] = DeviceHealth{m.uuid, reason.empty(), reason};
    }
  }
  return out;
}

void HealthMonitor::Update(const std::function<void()>& change) {
  std::vector<DeviceHealth> changes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    change();
    auto now = ComputeLocked();
    for (const auto& [id, h] : now) {
      auto it = published_.find(id);
      if (it == published_.end() || !(it->second == h)) changes.push_back(h);
    }
    published_ = std::move(now);
  }
  auto log = Log("health");
  for (const auto& c : changes) {
    if (c.healthy) {
      log->info("{} is healthy again", c.id);
    } else {
      log->warn("{} is unhealthy: {}", c.id, c.reason);
    }
  }
  if (!changes.empty() && on_change_) on_change_(changes);
}

void HealthMonitor::HandleEvent(const nvml::Event& event) {
  events_seen_++;
  auto log = Log("health");
  const int index = inventory_->IndexOfHandle(event.device);
  if (index < 0) {
    log->warn("NVML event 0x{:x} (data {}) for a device not in the inventory; ignored", event.type,
              event.data);
    return;
  }
  const Gpu& gpu = inventory_->gpus()[static_cast<unsigned>(index)];
  if ((event.type & nvml::kEventMigConfigChange) && options_.on_mig_change) {
    log->debug("GPU {}: MIG configuration changed", gpu.index);
    options_.on_mig_change(gpu.index);
    return;
  }
  std::string reason;
  if (event.type & nvml::kEventXid) {
    if (!IsFatalXid(event.data)) {
      log->info("GPU {}: XID {} is an application error; health unchanged", gpu.index, event.data);
      return;
    }
    reason = Cat("XID ", event.data);
  } else if (event.type & nvml::kEventDoubleBitEcc) {
    if (!options_.double_bit_ecc_is_fatal) return;
    reason = "double-bit ECC error";
  } else {
    log->debug("GPU {}: event 0x{:x} does not affect health", gpu.index, event.type);
    return;
  }
  // Which IDs: the MIG device the GI/CI ids name, else the whole GPU (and so its MIG devices).
  std::string target = gpu.uuid;
  if (event.gi != nvml::kNoInstance && event.data != kXidFallenOffBus) {
    const MigDevice* found = nullptr;
    for (const auto& m : gpu.migs) {
      if (m.gi == event.gi && (event.ci == nvml::kNoInstance || m.ci == event.ci)) found = &m;
    }
    if (found != nullptr) {
      target = found->uuid;
      reason = Cat(reason, " on MIG instance GI ", event.gi,
                   event.ci != nvml::kNoInstance ? Cat(" CI ", event.ci) : std::string());
    } else {
      log->warn("GPU {}: {} names GI {} CI {}, which is not in the inventory; marking the GPU",
                gpu.index, reason, event.gi, event.ci);
    }
  }
  const bool lost = (event.type & nvml::kEventXid) && event.data == kXidFallenOffBus;
  Update([&] {
    Fault& f = faults_[target];
    if (lost) {
      f.lost = true;
    } else {
      f.xid = true;
      f.xid_reason = reason;
      f.xid_at = std::chrono::steady_clock::now();
    }
  });
}

void HealthMonitor::EventLoop(std::stop_token stop) {
  auto log = Log("health");
  auto backoff = options_.event_wait;
  while (!stop.stop_requested()) {
    auto r = events_->Wait(static_cast<unsigned>(options_.event_wait.count()));
    if (!r.ok()) {
      event_errors_++;
      log->warn("nvmlEventSetWait failed: {}; retrying in {} ms", std::string(r.status().message()), backoff.count());
      if (!SleepFor(stop, backoff)) return;
      backoff = std::min(backoff * 2, std::chrono::milliseconds(30000));
      continue;
    }
    backoff = options_.event_wait;
    if (r->has_value()) HandleEvent(**r);
  }
}

void HealthMonitor::ProbeNow() {
  std::lock_guard<std::mutex> round(probe_round_mu_);
  auto log = Log("health");
  for (const auto& g : inventory_->gpus()) {
    if (g.uuid.empty()) continue;
    {
      std::lock_guard<std::mutex> lock(probe_mu_);
      probe_gpu_ = static_cast<int>(g.index);
      probe_call_ = "nvmlDeviceGetTemperature";
      probe_started_ = std::chrono::steady_clock::now();
      probe_reported_ = false;
    }
    auto t = lib_.TemperatureC(g.handle);
    {
      std::lock_guard<std::mutex> lock(probe_mu_);
      probe_gpu_ = -1;
    }
    const bool lost = nvml::IsGpuLost(t.status());
    if (!t.ok() && !lost && !nvml::IsNoValue(t.status())) {
      log->warn("GPU {} probe: {}", g.index, std::string(t.status().message()));
    }
    const bool readable = t.ok() || nvml::IsNoValue(t.status());
    const auto now = std::chrono::steady_clock::now();
    Update([&] {
      Fault& f = faults_[g.uuid];
      f.hung = false;
      if (lost) f.lost = true;
      if (readable) f.lost = false;
      if (!readable || !options_.recover_after) return;
      auto recover = [&](Fault& x) {
        if (x.xid && now - x.xid_at >= *options_.recover_after) x.xid = false;
      };
      recover(f);
      for (const auto& m : g.migs) {
        if (auto it = faults_.find(m.uuid); it != faults_.end()) recover(it->second);
      }
    });
  }
}

void HealthMonitor::ProbeLoop(std::stop_token stop) {
  while (SleepFor(stop, options_.probe_interval)) ProbeNow();
}

void HealthMonitor::WatchdogLoop(std::stop_token stop) {
  const auto tick = std::max(options_.hang_threshold / 4, std::chrono::milliseconds(10));
  while (SleepFor(stop, tick)) {
    int gpu = -1;
    const char* call = nullptr;
    std::chrono::milliseconds running{0};
    {
      std::lock_guard<std::mutex> lock(probe_mu_);
      if (probe_gpu_ < 0 || probe_reported_) continue;
      running = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - probe_started_);
      if (running < options_.hang_threshold) continue;
      probe_reported_ = true;
      gpu = probe_gpu_;
      call = probe_call_;
    }
    hung_calls_++;
    const Gpu& g = inventory_->gpus()[static_cast<unsigned>(gpu)];
    const std::string reason = Cat("NVML call ", call, " has not returned for ", running.count(), " ms");
    Log("health")->error("GPU {} ({}): {}; the driver may be wedged", g.index, g.uuid, reason);
    Update([&] {
      Fault& f = faults_[g.uuid];
      f.hung = true;
      f.hung_reason = reason;
    });
  }
}

}  // namespace kgpu::gpu
