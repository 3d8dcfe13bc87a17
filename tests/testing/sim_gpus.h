#pragma once
// Test helper: a simulated node (SimNode) with the product's NVML session open on it and its
// inventory discovered, as a node daemon starts. Fixtures derive from it.
//
// Thread-safety: construct and Rediscover() from the test thread.

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "gpu/inventory.h"
#include "nvml/library.h"
#include "testing/sim_node.h"

namespace kgpu::testing {

struct SimGpus {
  explicit SimGpus(const std::string& profile) : sim(profile) {
    auto l = nvml::Library::Open({SimNode::LibraryPath()});
    EXPECT_TRUE(l.ok()) << l.status();
    if (l.ok()) lib = std::move(*l);
    Rediscover();
  }
  // Discovers again (after a fault injected with sim.Ctl()).
  void Rediscover() {
    if (!lib) return;
    auto i = gpu::Inventory::Discover(*lib, {sim.dir()});
    EXPECT_TRUE(i.ok()) << i.status();
    if (i.ok()) inv = *i;
  }

  SimNode sim;
  std::unique_ptr<nvml::Library> lib;
  std::shared_ptr<const gpu::Inventory> inv;
};

}  // namespace kgpu::testing
