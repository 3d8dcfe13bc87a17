#pragma once
// Test fixture base: a simulated node (SimNode) and the kubelet stand-in (FakeKubelet) serving in
// the node's directory, which is also the kubelet device-plugin directory the plugin under test
// uses. Fixtures for `kgpu device-plugin` as a process derive from it.
//
// Thread-safety: test-thread only.

#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "testing/fake_kubelet.h"
#include "testing/sim_node.h"

namespace kgpu::testing {

class PluginNodeTest : public ::testing::Test {
 protected:
  void Init(const std::string& profile) {
    sim_ = std::make_unique<SimNode>(profile);
    kubelet_ = std::make_unique<FakeKubelet>(sim_->dir());
    ASSERT_TRUE(kubelet_->Start().ok());
  }
  // Writes <node dir>/config.yaml; returns its path.
  std::string WriteConfig(const std::string& yaml) {
    const std::string path = sim_->dir() + "/config.yaml";
    std::ofstream(path) << yaml;
    return path;
  }

  std::unique_ptr<SimNode> sim_;
  std::unique_ptr<FakeKubelet> kubelet_;
};

}  // namespace kgpu::testing
