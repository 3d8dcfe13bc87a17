#pragma once
// gpu::HealthMonitor turns NVML events and periodic probes into health changes for every device
// ID they affect: a whole-GPU event marks the GPU and all its MIG devices, a MIG event (GI/CI ids)
// marks that MIG device only. A lost GPU (GPU_IS_LOST) turns unhealthy and, when a probe reads
// it again, healthy. A hung NVML call is detected by a watchdog thread, reported and counted, and
// marks only the GPU it was made for; the rest of the process keeps serving. Every kind of fault
// recovers only after HealthOptions::recover_after (never, when unset).
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
  // After any fault (XID, ECC, lost GPU, hung NVML call) a device becomes healthy again once this
  // long has passed since the fault was last seen and a probe reads the GPU. nullopt: never,
  // until the process restarts (NVIDIA's behaviour).
  std::optional<std::chrono::milliseconds> recover_after;
  std::chrono::milliseconds event_wait{200};        // one nvmlEventSetWait timeout
  std::chrono::milliseconds probe_interval{5000};   // per-GPU liveness probe period
  std::chrono::milliseconds hang_threshold{10000};  // an NVML call running longer is "hung"
  // Start() waits this long for the event registration (NVML calls) and then returns anyway;
  // Stop() waits this long for the threads and then leaves one stuck in a hung NVML call behind.
  std::chrono::milliseconds start_timeout{500};
  std::chrono::milliseconds stop_timeout{500};
  // Called (from the event thread) when NVML reports a MIG configuration change on a GPU: GPU or
  // compute instances were created or destroyed. Unset: such events are not registered.
  std::function<void(unsigned gpu)> on_mig_change;
  // Called (from the event thread) for every XID NVML reports, fatal or not, before its effect on
  // health: the GPU's index, the GPU instance (nvml::kNoInstance for the whole GPU) and the XID.
  // The exporter counts XIDs from here, so a process has one NVML event loop, not one per user.
  std::function<void(unsigned gpu, unsigned gi, unsigned long long xid)> on_xid;
};

// How long after its last fault a device is healthy again when nothing says otherwise: the device
// plugin's default (health.recoverAfter), and the exporter's when it runs without the plugin.
inline constexpr std::chrono::minutes kDefaultRecoverAfter{5};

struct DeviceHealth {
  std::string id;  // GPU or MIG UUID
  bool healthy = true;
  std::string reason;  // why unhealthy (empty when healthy)
  // The kind of fault, for metrics labels: xid, ecc, lost, hung, registration (empty when healthy).
  std::string cause;
  bool operator==(const DeviceHealth&) const = default;
};

// A process's one source of device health: the monitor's published state (per GPU and MIG UUID).
// The device plugin serves it to kubelet; the exporter, `kgpu devices` and doctor read the same.
using HealthReader = std::function<std::map<std::string, DeviceHealth>()>;

// Receives every health change, in the order they happened, one call at a time (a fault that
// recovers at once is still reported, before its recovery). Not called after Stop() returns.
using HealthCallback = std::function<void(const std::vector<DeviceHealth>& changes)>;

class HealthMonitor {
 public:
  HealthMonitor(const nvml::Library& lib, std::shared_ptr<const Inventory> inventory, HealthOptions options,
                HealthCallback on_change);
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  // Starts the threads and registers for events on every readable GPU (waiting at most
  // options.start_timeout for that). GPUs whose registration fails for another reason than
  // NOT_SUPPORTED turn unhealthy.
  absl::Status Start();
  // Returns within options.stop_timeout (plus a little), whatever NVML does: a thread stuck in a
  // hung NVML call is left to end on its own and touches nothing shared once it returns.
  // The nvml::Library must outlive the monitor unless the process exits.
  void Stop();

  // Current health of every device ID in the inventory.
  std::map<std::string, DeviceHealth> Snapshot() const;
  // Runs one probe round now (tests and the CLI).
  void ProbeNow();

  uint64_t hung_calls() const;
  uint64_t event_errors() const;
  uint64_t events_seen() const;

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kgpu::gpu
