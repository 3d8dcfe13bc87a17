#include "gpu/health.h"

#include <algorithm>

#include "common/bounded_thread.h"
#include "common/log.h"
#include "common/sleep.h"
#include "common/strings.h"

namespace kgpu::gpu {
namespace {

constexpr uint64_t kXidFallenOffBus = 79;

}  // namespace

// Everything the threads touch lives here, shared with them: a thread left behind in a hung NVML
// call by Stop() keeps it alive and, once the call returns, sees `stopped_` and ends.
class HealthMonitor::Impl : public std::enable_shared_from_this<HealthMonitor::Impl> {
 public:
  Impl(const nvml::Library& lib, std::shared_ptr<const Inventory> inventory, HealthOptions options,
       HealthCallback on_change)
      : lib_(lib), inventory_(std::move(inventory)), options_(std::move(options)), on_change_(std::move(on_change)) {}

  absl::Status Start();
  void Stop();
  std::map<std::string, DeviceHealth> Snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return published_;
  }
  void ProbeNow(std::stop_token stop = {});

  std::atomic<uint64_t> hung_calls_{0}, event_errors_{0}, events_seen_{0};

 private:
  struct Fault {
    bool xid = false;  // XID or ECC fault
    std::string xid_reason;
    bool lost = false;
    bool hung = false;
    std::string hung_reason;
    bool register_failed = false;
    std::chrono::steady_clock::time_point last_fault;  // when a fault was last seen
    bool active() const { return xid || lost || hung; }
  };

  void RegisterEvents();
  void EventLoop(std::stop_token stop);
  void ProbeLoop(std::stop_token stop);
  void WatchdogLoop(std::stop_token stop);
  void HandleEvent(const nvml::Event& event);
  // Applies `change` to faults_ under mu_, recomputes health and publishes the differences.
  void Update(const std::function<void()>& change);
  std::map<std::string, DeviceHealth> ComputeLocked() const;
  bool IsFatalXid(uint64_t xid) const;
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }

  const nvml::Library& lib_;
  const std::shared_ptr<const Inventory> inventory_;
  const HealthOptions options_;
  const HealthCallback on_change_;
  std::unique_ptr<nvml::EventSet> events_;  // set by the event thread before `registered_`

  std::mutex publish_mu_;             // one Update (compute + callback) at a time, in order
  std::atomic<bool> stopped_{false};  // set under publish_mu_: no callback after Stop()

  mutable std::mutex mu_;
  std::condition_variable registered_cv_;
  bool registered_ = false;              // the event thread has registered (or given up)
  std::map<std::string, Fault> faults_;  // by device ID (GPU faults are keyed by the GPU UUID)
  std::map<std::string, DeviceHealth> published_;

  // The NVML call the probe thread is in, for the watchdog.
  std::mutex probe_round_mu_;  // one probe round at a time
  std::mutex probe_mu_;
  int probe_gpu_ = -1;
  const char* probe_call_ = nullptr;
  std::chrono::steady_clock::time_point probe_started_;
  bool probe_reported_ = false;

  BoundedThread event_thread_, probe_thread_, watchdog_thread_;
};

HealthMonitor::HealthMonitor(const nvml::Library& lib, std::shared_ptr<const Inventory> inventory,
                             HealthOptions options, HealthCallback on_change)
    : impl_(std::make_shared<Impl>(lib, std::move(inventory), std::move(options), std::move(on_change))) {}

HealthMonitor::~HealthMonitor() {
  Stop();
}
absl::Status HealthMonitor::Start() {
  return impl_->Start();
}
void HealthMonitor::Stop() {
  impl_->Stop();
}
std::map<std::string, DeviceHealth> HealthMonitor::Snapshot() const {
  return impl_->Snapshot();
}
void HealthMonitor::ProbeNow() {
  impl_->ProbeNow();
}
uint64_t HealthMonitor::hung_calls() const {
  return impl_->hung_calls_.load();
}
uint64_t HealthMonitor::event_errors() const {
  return impl_->event_errors_.load();
}
uint64_t HealthMonitor::events_seen() const {
  return impl_->events_seen_.load();
}

bool HealthMonitor::Impl::IsFatalXid(uint64_t xid) const {
  if (options_.fatal_xids.count(xid) != 0) return true;
  if (options_.ignore_all_xids) return false;
  return options_.ignored_xids.count(xid) == 0;
}

absl::Status HealthMonitor::Impl::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (const auto& g : inventory_->gpus()) {
      if (g.uuid.empty()) continue;
      Fault& f = faults_[g.uuid];
      f.lost = g.lost;
      if (g.lost) f.last_fault = now;
    }
    published_ = ComputeLocked();
  }
  auto self = shared_from_this();
  // The event thread registers first: registration is NVML calls per GPU, and one on a hung GPU
  // must not hold up the start (or a reload) for longer than start_timeout.
  event_thread_.Start([self](std::stop_token st) {
    self->RegisterEvents();
    if (self->events_ && !st.stop_requested()) self->EventLoop(st);
  });
  probe_thread_.Start([self](std::stop_token st) { self->ProbeLoop(st); });
  watchdog_thread_.Start([self](std::stop_token st) { self->WatchdogLoop(st); });
  std::unique_lock<std::mutex> lock(mu_);
  if (!registered_cv_.wait_for(lock, options_.start_timeout, [&] { return registered_; })) {
    Log("health")->warn(
        "NVML event registration has not finished after {} ms (an NVML call is slow or hung); "
        "it goes on in the background",
        options_.start_timeout.count());
  }
  return absl::OkStatus();
}

void HealthMonitor::Impl::RegisterEvents() {
  auto log = Log("health");
  auto done = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    registered_ = true;
    registered_cv_.notify_all();
  };
  auto set = lib_.CreateEventSet();
  if (stopped()) return done();
  if (!set.ok()) {
    event_errors_++;
    log->warn("cannot create an NVML event set ({}); health comes from probes only",
              std::string(set.status().message()));
    return done();
  }
  std::unique_ptr<nvml::EventSet> events = std::move(*set);
  for (const auto& g : inventory_->gpus()) {
    if (!g.error.empty()) continue;
    auto supported = lib_.SupportedEvents(g.handle);
    absl::Status st = supported.status();
    if (supported.ok()) {
      const uint64_t mask = (nvml::kEventXid | nvml::kEventDoubleBitEcc | nvml::kEventSingleBitEcc |
                             (options_.on_mig_change ? nvml::kEventMigConfigChange : 0)) &
                            *supported;
      st = events->Register(g.handle, mask);
    }
    if (stopped()) {
      (void)events.release();  // the library may be gone: never free the set after Stop()
      return done();
    }
    if (nvml::ReturnOf(st) == nvml::Return::kNotSupported) {
      log->warn("GPU {} ({}) does not support health events; it is checked by probes only", g.index, g.uuid);
    } else if (!st.ok()) {
      log->error("GPU {} ({}): event registration failed: {}", g.index, g.uuid, std::string(st.message()));
      Update([&] { faults_[g.uuid].register_failed = true; });
    }
  }
  events_ = std::move(events);
  done();
}

void HealthMonitor::Impl::Stop() {
  {
    // After this, no callback runs (one in progress has finished).
    std::lock_guard<std::mutex> publish(publish_mu_);
    stopped_.store(true, std::memory_order_release);
  }
  for (BoundedThread* t : {&event_thread_, &probe_thread_, &watchdog_thread_}) t->RequestStop();
  const auto deadline = std::chrono::steady_clock::now() + options_.stop_timeout;
  bool all = true;
  for (BoundedThread* t : {&watchdog_thread_, &probe_thread_, &event_thread_}) {
    const bool joined = t->StopAndJoinUntil(deadline);
    all = all && joined;
    if (!joined && t == &event_thread_) {
      (void)events_.release();  // the thread may still be inside nvmlEventSetWait on it
    }
  }
  if (!all) {
    Log("health")->warn("an NVML call has not returned within {} ms of the stop; it is left behind and ends on its own",
                        options_.stop_timeout.count());
  }
  events_.reset();  // NVML calls are over: free the event set while the library is certainly there
}

std::map<std::string, DeviceHealth> HealthMonitor::Impl::ComputeLocked() const {
  std::map<std::string, DeviceHealth> out;
  // (reason, cause) of a fault.
  auto reason_of = [](const Fault& f) -> std::pair<std::string, std::string> {
    if (f.lost) return {"GPU is lost (fell off the bus)", "lost"};
    if (f.hung) return {f.hung_reason, "hung"};
    if (f.xid) return {f.xid_reason, f.xid_reason.starts_with("XID") ? "xid" : "ecc"};
    if (f.register_failed) return {"NVML event registration failed", "registration"};
    return {};
  };
  for (const auto& g : inventory_->gpus()) {
    if (g.uuid.empty()) continue;
    const auto it = faults_.find(g.uuid);
    const auto gpu_fault = it != faults_.end() ? reason_of(it->second) : std::pair<std::string, std::string>{};
    out[g.uuid] = DeviceHealth{g.uuid, gpu_fault.first.empty(), gpu_fault.first, gpu_fault.second};
    for (const auto& m : g.migs) {
      const auto mit = faults_.find(m.uuid);
      auto fault = mit != faults_.end() ? reason_of(mit->second) : std::pair<std::string, std::string>{};
      if (!gpu_fault.first.empty()) fault = {Cat("parent GPU: ", gpu_fault.first), gpu_fault.second};
      out[m.uuid] = DeviceHealth{m.uuid, fault.first.empty(), fault.first, fault.second};
    }
  }
  return out;
}

void HealthMonitor::Impl::Update(const std::function<void()>& change) {
  // Held until the callback has returned: callbacks come one at a time, in the order of the
  // changes, so a fault that recovers at once still reaches the callback before its recovery.
  std::lock_guard<std::mutex> publish(publish_mu_);
  if (stopped()) return;
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

void HealthMonitor::Impl::HandleEvent(const nvml::Event& event) {
  events_seen_++;
  auto log = Log("health");
  const int index = inventory_->IndexOfHandle(event.device);
  if (index < 0) {
    log->warn("NVML event 0x{:x} (data {}) for a device not in the inventory; ignored", event.type, event.data);
    return;
  }
  const Gpu& gpu = inventory_->gpus()[static_cast<unsigned>(index)];
  if ((event.type & nvml::kEventMigConfigChange) && options_.on_mig_change) {
    log->debug("GPU {}: MIG configuration changed", gpu.index);
    options_.on_mig_change(gpu.index);
    return;
  }
  std::string reason;
  if ((event.type & nvml::kEventXid) && options_.on_xid) options_.on_xid(gpu.index, event.gi, event.data);
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
      log->warn("GPU {}: {} names GI {} CI {}, which is not in the inventory; marking the GPU", gpu.index, reason,
                event.gi, event.ci);
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
    }
    f.last_fault = std::chrono::steady_clock::now();
  });
}

void HealthMonitor::Impl::EventLoop(std::stop_token stop) {
  auto log = Log("health");
  auto backoff = options_.event_wait;
  while (!stop.stop_requested()) {
    auto r = events_->Wait(static_cast<unsigned>(options_.event_wait.count()));
    if (stopped()) return;
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

void HealthMonitor::Impl::ProbeNow(std::stop_token stop) {
  std::lock_guard<std::mutex> round(probe_round_mu_);
  auto log = Log("health");
  for (const auto& g : inventory_->gpus()) {
    if (g.uuid.empty()) continue;
    if (stopped() || stop.stop_requested()) return;
    {
      std::lock_guard<std::mutex> lock(probe_mu_);
      probe_gpu_ = static_cast<int>(g.index);
      probe_call_ = "nvmlDeviceGetTemperature";
      probe_started_ = std::chrono::steady_clock::now();
      probe_reported_ = false;
    }
    auto t = lib_.TemperatureC(g.handle);
    if (stopped()) return;  // left behind by Stop(): the library may be gone
    bool was_hung = false;
    {
      std::lock_guard<std::mutex> lock(probe_mu_);
      probe_gpu_ = -1;
      was_hung = probe_reported_;
    }
    const bool lost = nvml::IsGpuLost(t.status());
    if (!t.ok() && !lost && !nvml::IsNoValue(t.status())) {
      log->warn("GPU {} probe: {}", g.index, std::string(t.status().message()));
    }
    const bool readable = t.ok() || nvml::IsNoValue(t.status());
    const auto now = std::chrono::steady_clock::now();
    Update([&] {
      Fault& f = faults_[g.uuid];
      if (lost) {
        f.lost = true;
        f.last_fault = now;
      }
      if (was_hung) f.last_fault = now;  // the hang lasted until this call returned
      if (!readable || !options_.recover_after) return;
      // Every kind of fault waits recover_after from when it was last seen, then clears once a
      // probe reads the GPU.
      auto recover = [&](Fault& x) {
        if (!x.active() || now - x.last_fault < *options_.recover_after) return;
        x.xid = x.lost = x.hung = false;
        x.xid_reason.clear();
        x.hung_reason.clear();
      };
      recover(f);
      for (const auto& m : g.migs) {
        if (auto it = faults_.find(m.uuid); it != faults_.end()) recover(it->second);
      }
    });
  }
}

void HealthMonitor::Impl::ProbeLoop(std::stop_token stop) {
  while (SleepFor(stop, options_.probe_interval)) ProbeNow(stop);
}

void HealthMonitor::Impl::WatchdogLoop(std::stop_token stop) {
  const auto tick = std::max(options_.hang_threshold / 4, std::chrono::milliseconds(10));
  while (SleepFor(stop, tick)) {
    int gpu = -1;
    const char* call = nullptr;
    std::chrono::milliseconds running{0};
    {
      std::lock_guard<std::mutex> lock(probe_mu_);
      if (probe_gpu_ < 0 || probe_reported_) continue;
      running =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - probe_started_);
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
      f.last_fault = std::chrono::steady_clock::now();
    });
  }
}

}  // namespace kgpu::gpu
