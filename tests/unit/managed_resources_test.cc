// The kgpu scheduler's extender configuration manages every resource a kgpu node can advertise:
// every MIG profile of every GPU model kgpu knows (the simulated NVML's model table, which follows
// `nvidia-smi mig -lgip` of each model), as the device plugin names it with migStrategy mixed. A
// profile missing from managedResources never reaches the extender: its pods get no device-level
// choice and no allocation record (issue 36 §4: A100-40GB's 1g.5gb and H200's 1g.18gb were
// missing).
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "deviceplugin/plan.h"
#include "profile.h"  // simnvml/

namespace kgpu {
namespace {

std::map<std::string, bool> Managed(const std::string& path) {
  std::map<std::string, bool> out;  // name -> ignoredByScheduler
  const YAML::Node config = YAML::LoadFile(path);
  for (const auto& ext : config["extenders"]) {
    for (const auto& r : ext["managedResources"]) {
      out[r["name"].as<std::string>()] = r["ignoredByScheduler"] && r["ignoredByScheduler"].as<bool>();
    }
  }
  return out;
}

TEST(ManagedResources, TheKgpuSchedulerManagesEveryMigProfileOfEveryModel) {
  const std::string path = std::string(KGPU_SOURCE_DIR) + "/deploy/extender/kgpu-scheduler-config.yaml";
  const auto managed = Managed(path);
  ASSERT_FALSE(managed.empty()) << path;
  std::set<std::string> missing;
  size_t profiles = 0;
  for (const auto& model : sim::Models()) {
    for (const auto& p : model.mig_profiles) {
      ++profiles;
      const std::string name = deviceplugin::MigResourceName(p.name);
      const auto it = managed.find(name);
      if (it == managed.end()) {
        // As the line to add to the file (the failure message is the generated list).
        missing.insert("      - {name: " + name + ", ignoredByScheduler: false}  # " + model.name);
      } else {
        EXPECT_FALSE(it->second) << name << ": kube-scheduler counts MIG devices (ignoredByScheduler: false)";
      }
    }
  }
  EXPECT_GT(profiles, 20u) << "the model table lost its MIG profiles";
  std::string list;
  for (const auto& m : missing) list += "\n  " + m;
  EXPECT_TRUE(missing.empty()) << path << " does not manage:" << list;
  // And kgpu's own and the whole-GPU resources.
  for (const char* r : {"kgpu.io/gpu", "kgpu.io/gpu-memory", "kgpu.io/gpu-cores", "nvidia.com/gpu"}) {
    EXPECT_TRUE(managed.contains(r)) << r;
  }
  EXPECT_TRUE(managed.at("kgpu.io/gpu-memory"));
  EXPECT_TRUE(managed.at("kgpu.io/gpu-cores"));
  EXPECT_FALSE(managed.at("kgpu.io/gpu"));
}

}  // namespace
}  // namespace kgpu
