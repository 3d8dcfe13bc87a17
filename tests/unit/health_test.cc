#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "gpu/health.h"
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
    monitor = std::make_unique<HealthMonitor>(*lib, inv, options,
                                              [this](const auto& c) { recorder(c); });
    EXPECT_TRUE(monitor->Start().ok());
  }
  ~Fixture() { monitor->Stop(); }
  bool Unhealthy(const std::string& id, const std::string& reason_part) {
    return recorder.WaitFor([&](const auto& s) {
      auto it = s.find(id);
      return it != s.end() && !it->second.healthy &&
             it->second.reason.find(reason_part) != std::string::npos;
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
  ASSERT_EQ(f.sim.Ctl("xid 0 94 --gi " + std::to_string(target.gi) + " --ci " +
                       std::to_string(target.ci)),
            0);
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
  Fixture f("dgx-h100");
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

}  // namespace
}  // namespace kgpu::gpu
