#include "gpu/health.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "testing/sim_gpus.h"

namespace kgpu::gpu {
namespace {

using namespace std::chrono_literals;

// Collects health changes and waits for a predicate over the latest state.
class Recorder {
 public:
  void operator()(const std::vector<DeviceHealth>& changes) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : changes) {
      state_[c.id] = c;
      log_.push_back(c);
    }
    cv_.notify_all();
  }
  bool WaitFor(const std::function<bool(const std::map<std::string, DeviceHealth>&)>& pred,
               std::chrono::milliseconds timeout = 5s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(state_); });
  }
  bool WaitForLog(const std::function<bool(const std::vector<DeviceHealth>&)>& pred,
                  std::chrono::milliseconds timeout = 5s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(log_); });
  }
  std::vector<DeviceHealth> Log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, DeviceHealth> state_;
  std::vector<DeviceHealth> log_;
};

struct Fixture : kgpu::testing::SimGpus {
  explicit Fixture(const std::string& profile, HealthOptions options = {}) : SimGpus(profile) {
    options.event_wait = 200ms;
    monitor = std::make_unique<HealthMonitor>(*lib, inv, options, [this](const auto& c) { recorder(c); });
    EXPECT_TRUE(monitor->Start().ok());
  }
  ~Fixture() { monitor->Stop(); }
  bool Unhealthy(const std::string& id, const std::string& reason_part) {
    return recorder.WaitFor([&](const auto& s) {
      auto it = s.find(id);
      return it != s.end() && !it->second.healthy && it->second.reason.find(reason_part) != std::string::npos;
    });
  }
  bool Healthy(const std::string& id) {
    return recorder.WaitFor([&](const auto& s) {
      auto it = s.find(id);
      return it != s.end() && it->second.healthy;
    });
  }

  Recorder recorder;
  std::unique_ptr<HealthMonitor> monitor;
};

TEST(HealthMonitorTest, StartsAllHealthy) {
  Fixture f("dgx-a100-mig");
  const auto snap = f.monitor->Snapshot();
  EXPECT_EQ(snap.size(), 8u + 4u + 7u);
  for (const auto& [id, h] : snap) EXPECT_TRUE(h.healthy) << id << ": " << h.reason;
}

TEST(HealthMonitorTest, FatalXidMarksGpuAndItsMigDevicesOnly) {
  Fixture f("dgx-a100-mig");
  ASSERT_EQ(f.sim.Ctl("xid 0 48"), 0);
  const Gpu& g0 = f.inv->gpus()[0];
  ASSERT_TRUE(f.Unhealthy(g0.uuid, "XID 48"));
  for (const auto& m : g0.migs) ASSERT_TRUE(f.Unhealthy(m.uuid, "parent GPU: XID 48"));
  const auto snap = f.monitor->Snapshot();
  EXPECT_TRUE(snap.at(f.inv->gpus()[1].uuid).healthy);
  EXPECT_TRUE(snap.at(f.inv->gpus()[1].migs[0].uuid).healthy);
}

TEST(HealthMonitorTest, MigXidMarksThatInstanceOnly) {
  Fixture f("dgx-a100-mig");
  const Gpu& g0 = f.inv->gpus()[0];
  const MigDevice& target = g0.migs[2];
  ASSERT_EQ(f.sim.Ctl("xid 0 94 --gi " + std::to_string(target.gi) + " --ci " + std::to_string(target.ci)), 0);
  ASSERT_TRUE(f.Unhealthy(target.uuid, "XID 94 on MIG instance GI"));
  const auto snap = f.monitor->Snapshot();
  EXPECT_TRUE(snap.at(g0.uuid).healthy);
  EXPECT_TRUE(snap.at(g0.migs[0].uuid).healthy);
  EXPECT_TRUE(snap.at(g0.migs[3].uuid).healthy);
}

TEST(HealthMonitorTest, ApplicationXidsAreIgnored) {
  Fixture f("dgx-h100");
  for (const char* xid : {"13", "31", "43", "45", "68", "109"}) {
    ASSERT_EQ(f.sim.Ctl(std::string("xid 1 ") + xid), 0);
  }
  ASSERT_EQ(f.sim.Ctl("xid 2 48"), 0);  // a fatal one after them, as a marker
  ASSERT_TRUE(f.Unhealthy(f.inv->gpus()[2].uuid, "XID 48"));
  EXPECT_TRUE(f.monitor->Snapshot().at(f.inv->gpus()[1].uuid).healthy);
  EXPECT_GE(f.monitor->events_seen(), 7u);
}

TEST(HealthMonitorTest, FatalOverrideAndDoubleBitEcc) {
  HealthOptions o;
  o.fatal_xids = {43};
  Fixture f("dgx-h100", o);
  ASSERT_EQ(f.sim.Ctl("xid 1 43"), 0);
  ASSERT_TRUE(f.Unhealthy(f.inv->gpus()[1].uuid, "XID 43"));
  ASSERT_EQ(f.sim.Ctl("ecc 4 sbe 3"), 0);
  ASSERT_EQ(f.sim.Ctl("ecc 5 dbe"), 0);
  ASSERT_TRUE(f.Unhealthy(f.inv->gpus()[5].uuid, "double-bit ECC"));
  EXPECT_TRUE(f.monitor->Snapshot().at(f.inv->gpus()[4].uuid).healthy);
}

TEST(HealthMonitorTest, LostGpuAndRecovery) {
  HealthOptions o;
  o.recover_after = 0ms;
  Fixture f("dgx-h100", o);
  const std::string uuid = f.inv->gpus()[6].uuid;
  ASSERT_EQ(f.sim.Ctl("lose 6"), 0);
  ASSERT_TRUE(f.Unhealthy(uuid, "GPU is lost"));
  f.monitor->ProbeNow();  // still lost: stays unhealthy
  EXPECT_FALSE(f.monitor->Snapshot().at(uuid).healthy);
  ASSERT_EQ(f.sim.Ctl("restore 6"), 0);
  f.monitor->ProbeNow();
  ASSERT_TRUE(f.Healthy(uuid));
}

TEST(HealthMonitorTest, XidRecoveryIsConfigurable) {
  HealthOptions o;
  o.recover_after = 0ms;
  Fixture f("dgx-h100", o);
  const std::string uuid = f.inv->gpus()[0].uuid;
  ASSERT_EQ(f.sim.Ctl("xid 0 48"), 0);
  ASSERT_TRUE(f.Unhealthy(uuid, "XID 48"));
  f.monitor->ProbeNow();
  ASSERT_TRUE(f.Healthy(uuid));
}

TEST(HealthMonitorTest, XidWithoutRecoveryStaysUnhealthy) {
  Fixture f("dgx-h100");
  const std::string uuid = f.inv->gpus()[0].uuid;
  ASSERT_EQ(f.sim.Ctl("xid 0 48"), 0);
  ASSERT_TRUE(f.Unhealthy(uuid, "XID 48"));
  f.monitor->ProbeNow();
  EXPECT_FALSE(f.monitor->Snapshot().at(uuid).healthy);
}

TEST(HealthMonitorTest, HungCallIsDetectedAndOthersKeepWorking) {
  HealthOptions o;
  o.hang_threshold = 300ms;
  o.probe_interval = 100ms;
  o.recover_after = 0ms;
  Fixture f("dgx-h100", o);
  const std::string uuid = f.inv->gpus()[3].uuid;
  ASSERT_EQ(f.sim.Ctl("hang 3 3000"), 0);
  ASSERT_TRUE(f.Unhealthy(uuid, "has not returned"));
  EXPECT_GE(f.monitor->hung_calls(), 1u);
  // Events for other GPUs are still handled while the probe thread is stuck.
  ASSERT_EQ(f.sim.Ctl("xid 5 48"), 0);
  ASSERT_TRUE(f.Unhealthy(f.inv->gpus()[5].uuid, "XID 48"));
  // NVML calls on other GPUs from this thread do not block either.
  EXPECT_TRUE(f.lib->TemperatureC(f.inv->gpus()[4].handle).ok());
  ASSERT_EQ(f.sim.Ctl("hang 3 0"), 0);
  ASSERT_TRUE(f.Healthy(uuid));
}

// Probes until `uuid` is healthy again (or 20 s pass); returns how long that took.
std::chrono::milliseconds ProbeUntilHealthy(Fixture& f, const std::string& uuid) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < 20s) {
    f.monitor->ProbeNow();
    if (f.monitor->Snapshot().at(uuid).healthy) break;
    std::this_thread::sleep_for(20ms);
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
}

// recoverAfter applies to every kind of fault, not only XIDs: a lost GPU that is readable again,
// an ECC error and a hung call that returned all wait it out.
TEST(HealthMonitorTest, EveryFaultWaitsRecoverAfter) {
  HealthOptions o;
  o.recover_after = 1500ms;
  o.hang_threshold = 200ms;
  o.probe_interval = 1h;  // probes only when the test says so
  Fixture f("dgx-h100", o);
  const std::string xid = f.inv->gpus()[0].uuid, lost = f.inv->gpus()[1].uuid, ecc = f.inv->gpus()[2].uuid;

  ASSERT_EQ(f.sim.Ctl("xid 0 48"), 0);
  ASSERT_TRUE(f.Unhealthy(xid, "XID 48"));
  auto t0 = std::chrono::steady_clock::now();
  f.monitor->ProbeNow();
  EXPECT_FALSE(f.monitor->Snapshot().at(xid).healthy) << "XID recovered before recoverAfter";
  ProbeUntilHealthy(f, xid);
  EXPECT_TRUE(f.monitor->Snapshot().at(xid).healthy);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1400ms);

  ASSERT_EQ(f.sim.Ctl("lose 1"), 0);
  ASSERT_TRUE(f.Unhealthy(lost, "GPU is lost"));
  // The clock starts again at this probe (still lost), so the wait is measured from here: from
  // after `restore` it was short by the time kgpu-simctl took under load (1.31 s seen).
  t0 = std::chrono::steady_clock::now();
  f.monitor->ProbeNow();
  ASSERT_EQ(f.sim.Ctl("restore 1"), 0);
  f.monitor->ProbeNow();
  EXPECT_FALSE(f.monitor->Snapshot().at(lost).healthy) << "a lost GPU recovered at its first readable probe";
  ProbeUntilHealthy(f, lost);
  EXPECT_TRUE(f.monitor->Snapshot().at(lost).healthy);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1400ms);

  ASSERT_EQ(f.sim.Ctl("ecc 2 dbe"), 0);
  ASSERT_TRUE(f.Unhealthy(ecc, "double-bit ECC"));
  t0 = std::chrono::steady_clock::now();
  f.monitor->ProbeNow();
  EXPECT_FALSE(f.monitor->Snapshot().at(ecc).healthy);
  ProbeUntilHealthy(f, ecc);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1400ms);
}

TEST(HealthMonitorTest, HungCallWaitsRecoverAfter) {
  HealthOptions o;
  o.recover_after = 1500ms;
  o.hang_threshold = 200ms;
  o.probe_interval = 50ms;
  Fixture f("dgx-h100", o);
  const std::string uuid = f.inv->gpus()[3].uuid;
  ASSERT_EQ(f.sim.Ctl("hang 3 800"), 0);
  ASSERT_TRUE(f.Unhealthy(uuid, "has not returned"));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(f.Healthy(uuid));  // the probe thread recovers it by itself
  // The hang ends ~600 ms after it was detected; recovery comes >= 1.5 s after that.
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1500ms);
}

// recoverAfter: never means never, for every kind of fault.
TEST(HealthMonitorTest, NeverRecoversMeansNever) {
  HealthOptions o;  // recover_after unset: never
  o.hang_threshold = 200ms;
  o.probe_interval = 1h;
  Fixture f("dgx-h100", o);
  const std::string lost = f.inv->gpus()[6].uuid, xid = f.inv->gpus()[0].uuid;
  ASSERT_EQ(f.sim.Ctl("lose 6"), 0);
  ASSERT_EQ(f.sim.Ctl("xid 0 79"), 0);
  ASSERT_TRUE(f.Unhealthy(lost, "GPU is lost"));
  ASSERT_TRUE(f.Unhealthy(xid, "GPU is lost"));
  ASSERT_EQ(f.sim.Ctl("restore 6"), 0);
  for (int i = 0; i < 5; ++i) {
    f.monitor->ProbeNow();
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_FALSE(f.monitor->Snapshot().at(lost).healthy);
  EXPECT_FALSE(f.monitor->Snapshot().at(xid).healthy);
  for (const auto& c : f.recorder.Log()) EXPECT_FALSE(c.healthy) << c.id << " came back";
}

// With recoverAfter 0 a fault recovers at the next probe; the callback still gets the Unhealthy
// change first, every time, in order.
TEST(HealthMonitorTest, EveryFaultReachesTheCallbackBeforeItsRecovery) {
  HealthOptions o;
  o.recover_after = 0ms;
  o.probe_interval = 5ms;
  Fixture f("dgx-h100", o);
  const std::string uuid = f.inv->gpus()[4].uuid;
  constexpr int kFaults = 20;
  for (int i = 0; i < kFaults; ++i) {
    ASSERT_EQ(f.sim.Ctl("xid 4 48"), 0);
    ASSERT_TRUE(f.recorder.WaitForLog(
        [&](const std::vector<DeviceHealth>& log) {
          int n = 0;
          for (const auto& c : log) n += (c.id == uuid && !c.healthy) ? 1 : 0;
          return n > i;
        },
        10s))
        << "fault " << i << " never reported";
    ASSERT_TRUE(f.Healthy(uuid));
  }
  bool healthy = true;
  for (const auto& c : f.recorder.Log()) {
    if (c.id != uuid) continue;
    EXPECT_NE(c.healthy, healthy) << "two changes in a row with the same health";
    healthy = c.healthy;
  }
}

// Stop() returns within its bound while the probe thread is stuck in a hung NVML call.
TEST(HealthMonitorTest, StopIsBoundedDuringAHungCall) {
  HealthOptions o;
  o.hang_threshold = 200ms;
  o.probe_interval = 20ms;
  o.stop_timeout = 500ms;
  Fixture f("dgx-h100", o);
  ASSERT_EQ(f.sim.Ctl("hang 2 4000"), 0);
  ASSERT_TRUE(f.Unhealthy(f.inv->gpus()[2].uuid, "has not returned"));
  const auto t0 = std::chrono::steady_clock::now();
  f.monitor->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  ASSERT_EQ(f.sim.Ctl("hang 2 0"), 0);
  // The call left behind returns once the hang ends, and touches nothing of the monitor.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (f.lib->calls_in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(f.lib->calls_in_flight(), 0);
}

}  // namespace
}  // namespace kgpu::gpu
