#pragma once
// gpu::HealthMonitor turns NVML events and periodic probes into health changes for every device
// ID they affect: a whole-GPU event marks the GPU and all its MIG devices, a MIG event (GI/CI ids)
// marks that MIG device only. A lost GPU (GPU_IS_LOST) turns unhealthy and, when a probe reads
// it again, healthy. A hung NVML call is detected by a watchdog thread, reported and counted, and
// marks only the GPU it was made for; the rest of the process keeps serving.
//
// Thread-safety: Start/Stop from one owner thread; Snapshot() and the counters from any thread.
// The callback runs on the monitor's threads, never under its lock; keep it short.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpu/inventory.h"
#include "nvml/library.h"

namespace kgpu::gpu {

struct HealthOptions {
  // XIDs that are the application's fault, not the GPU's (NVIDIA's device plugin's defaults).
  std::set<uint64_t> ignored_xids = {13, 31, 43, 45, 68, 109};
  bool ignore_all_xids = false;
  // XIDs treated as fatal even when listed above (DP_ENABLE_HEALTHCHECKS).
  std::set<uint64_t> fatal_xids;
  bool double_bit_ecc_is_fatal = true;
  // After an XID/ECC fault, a device becomes healthy again once this long has passed with no new
  // fault and a probe succeeds. nullopt: never (NVIDIA's behaviour).
  std::optional<std::chrono::milliseconds> recover_after;
  std::chrono::milliseconds event_wait{200};       // one nvmlEventSetWait timeout (bounds Stop())
  std::chrono::milliseconds probe_interval{5000};  // per-GPU liveness probe period
  std::chrono::milliseconds hang_threshold{10000};  // an NVML call running longer is "hung"
  // Called (from the event thread) when NVML reports a MIG configuration change on a GPU: GPU or
  // compute instances were created or destroyed. Unset: such events are not registered.
  std::function<void(unsigned gpu)> on_mig_change;
};

struct DeviceHealth {
  std::string id;  // GPU or MIG UUID
  bool healthy = true;
  std::string reason;  // why unhealthy (empty when healthy)
  bool operator==(const DeviceHealth&) const = default;
};

using HealthCallback = std::function<void(const std::vector<DeviceHealth>& changes)>;

class HealthMonitor {
 public:
  HealthMonitor(const nvml::Library& lib, std::shared_ptr<const Inventory> inventory,
                HealthOptions options, HealthCallback on_change);
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  // Registers for events on every readable GPU and starts the threads. GPUs whose registration
  // fails for another reason than NOT_SUPPORTED start unhealthy.
  absl::Status Start();
  void Stop();

  // Current health of every device ID in the inventory.
  std::map<std::string, DeviceHealth> Snapshot() const;
  // Runs one probe round now (tests and the CLI).
  void ProbeNow();

  uint64_t hung_calls() const { return hung_calls_.load(); }
  uint64_t event_errors() const { return event_errors_.load(); }
  uint64_t events_seen() const { return events_seen_.load(); }

 private:
  struct Fault {
    bool xid = false;  // XID or ECC fault
    std::string xid_reason;
    std::chrono::steady_clock::time_point xid_at;
    bool lost = false;
    bool hung = false;
    std::string hung_reason;
    bool register_failed = false;
  };

  void EventLoop(std::stop_token stop);
  void ProbeLoop(std::stop_token stop);
  void WatchdogLoop(std::stop_token stop);
  void HandleEvent(const nvml::Event& event);
  // Applies `change` to faults_ under mu_, recomputes health and publishes the differences.
  void Update(const std::function<void()>& change);
  std::map<std::string, DeviceHealth> ComputeLocked() const;
  bool IsFatalXid(uint64_t xid) const;

  const nvml::Library& lib_;
  const std::shared_ptr<const Inventory> inventory_;
  const HealthOptions options_;
  const HealthCallback on_change_;
  std::unique_ptr<nvml::EventSet> events_;

  mutable std::mutex mu_;
  std::map<std::string, Fault> faults_;  // by device ID (GPU faults are keyed by the GPU UUID)
  std::map<std::string, DeviceHealth> published_;

  // The NVML call the probe thread is in, for the watchdog.
  std::mutex probe_round_mu_;  // one probe round at a time
  std::mutex probe_mu_;
  int probe_gpu_ = -1;
  const char* probe_call_ = nullptr;
  std::chrono::steady_clock::time_point probe_started_;
  bool probe_reported_ = false;

  std::atomic<uint64_t> hung_calls_{0}, event_errors_{0}, events_seen_{0};
  std::jthread event_thread_, probe_thread_, watchdog_thread_;
};

}  // namespace kgpu::gpu
