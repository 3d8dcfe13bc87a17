#pragma once
// Test helper: a simulated node (SimGpus) plus the device plugin's plan for a config text, as the
// plugin builds it at start.
//
// Thread-safety: test-thread only.

#include <memory>
#include <string>

#include "deviceplugin/config.h"
#include "deviceplugin/plan.h"
#include "testing/sim_gpus.h"

namespace kgpu::testing {

struct SimPlan : SimGpus {
  using SimGpus::SimGpus;
  // proc_root: the config's proc_root (flag-only), when not empty.
  std::shared_ptr<const deviceplugin::Plan> PlanFor(const std::string& yaml, const std::string& proc_root = "") {
    auto c = deviceplugin::ParseConfig(yaml, "test.yaml", {.allow_empty = true});  // "": every default
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    config = *c;
    if (!proc_root.empty()) config.proc_root = proc_root;
    auto p = deviceplugin::BuildPlan(inv, config);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
  deviceplugin::Config config;
};

}  // namespace kgpu::testing
