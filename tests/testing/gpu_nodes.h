#pragma once
// Node objects carrying a kgpu.io/gpu-inventory annotation (format version 1, as `kgpu
// node-labels` writes it) and GPU pods, for the extender's tests, benchmark and demo.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgpu::testing {

struct TestGpu {
  std::string model = "NVIDIA A100-SXM4-80GB";
  int64_t memory_mib = 81920;
  int slots = 0;                 // > 0: serves kgpu.io/gpu shares
  std::vector<std::string> mig;  // MIG profiles ("1g.10gb"): the GPU is in MIG mode
  bool healthy = true;
};

inline TestGpu WholeGpu(std::string model = "NVIDIA A100-SXM4-80GB", int64_t memory_mib = 81920) {
  TestGpu g;
  g.model = std::move(model);
  g.memory_mib = memory_mib;
  return g;
}
inline TestGpu ShareGpu(int64_t memory_mib = 81920, int slots = 16, std::string model = "NVIDIA A100-SXM4-80GB") {
  TestGpu g = WholeGpu(std::move(model), memory_mib);
  g.slots = slots;
  return g;
}
inline TestGpu MigGpu(std::vector<std::string> profiles) {
  TestGpu g;
  g.mig = std::move(profiles);
  return g;
}

inline std::string TestGpuUuid(const std::string& node, size_t i) {
  return "GPU-" + node + "-" + std::to_string(i);
}

// The annotation value for `gpus` (UUIDs from TestGpuUuid; MIG devices "MIG-<node>-<i>-<k>").
inline std::string TestInventory(const std::string& node, const std::vector<TestGpu>& gpus,
                                 const std::vector<std::vector<int>>& nvlink = {},
                                 const std::vector<std::string>& enforcement = {"hard", "mps", "none"}) {
  using json = nlohmann::json;
  json list = json::array();
  for (size_t i = 0; i < gpus.size(); ++i) {
    const auto& g = gpus[i];
    json e = {{"i", i},    {"uuid", TestGpuUuid(node, i)},       {"model", g.model}, {"memMiB", g.memory_mib},
              {"numa", 0}, {"health", g.healthy ? "ok" : "lost"}};
    if (g.slots > 0) e["slots"] = g.slots;
    if (!g.mig.empty()) {
      json migs = json::array();
      for (size_t k = 0; k < g.mig.size(); ++k) {
        const std::string& p = g.mig[k];
        const int64_t mem = std::stoll(p.substr(p.find('.') + 1)) * 1024 - 256;
        migs.push_back({{"uuid", "MIG-" + node + "-" + std::to_string(i) + "-" + std::to_string(k)},
                        {"profile", p},
                        {"gi", k},
                        {"ci", 0},
                        {"memMiB", mem}});
      }
      e["mig"] = migs;
    }
    list.push_back(e);
  }
  json islands = json::array();
  for (const auto& isl : nvlink) islands.push_back(isl);
  const json doc = {{"v", 1},
                    {"gpus", list},
                    {"nvlinkIslands", islands},
                    {"pcieIslands", json::array()},
                    {"migStrategy", "mixed"},
                    {"sharing", {{"mode", "none"}, {"kgpu", {{"slots", 16}, {"enforcement", enforcement}}}}}};
  return doc.dump();
}

inline nlohmann::json TestNode(const std::string& name, const std::vector<TestGpu>& gpus,
                               const std::vector<std::vector<int>>& nvlink = {},
                               const std::vector<std::string>& enforcement = {"hard", "mps", "none"}) {
  using json = nlohmann::json;
  int whole = 0, slots = 0;
  std::map<std::string, int> mig;
  for (const auto& g : gpus) {
    if (!g.mig.empty()) {
      for (const auto& p : g.mig) ++mig["nvidia.com/mig-" + p];
    } else if (g.slots > 0) {
      slots += g.slots;
    } else {
      ++whole;
    }
  }
  json alloc = {{"cpu", "64"}, {"memory", "512Gi"}, {"pods", "110"}, {"nvidia.com/gpu", std::to_string(whole)}};
  if (slots > 0) alloc["kgpu.io/gpu"] = std::to_string(slots);
  for (const auto& [r, n] : mig) alloc[r] = std::to_string(n);
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata",
           {{"name", name},
            {"labels", {{"kubernetes.io/hostname", name}}},
            {"annotations", {{"kgpu.io/gpu-inventory", TestInventory(name, gpus, nvlink, enforcement)}}}}},
          // Ready, as kubelet reports it: without the condition the API server's node lifecycle
          // keeps the not-ready taint, and neither kube-scheduler nor the extender's bind places
          // a pod there.
          {"status",
           {{"capacity", alloc},
            {"allocatable", alloc},
            {"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})}}}};
}

// A pod with one container "main" asking for `resources` (as requests and limits).
inline nlohmann::json TestPod(const std::string& ns, const std::string& name,
                              const std::map<std::string, std::string>& resources,
                              const std::map<std::string, std::string>& annotations = {}, int64_t priority = 0) {
  using json = nlohmann::json;
  json res = json::object();
  for (const auto& [k, v] : resources) res[k] = v;
  json meta = {{"name", name}, {"namespace", ns}};
  if (!annotations.empty()) meta["annotations"] = annotations;
  json spec = {
      {"schedulerName", "kgpu-scheduler"},
      {"containers",
       json::array({{{"name", "main"}, {"image", "cuda:12"}, {"resources", {{"requests", res}, {"limits", res}}}}})}};
  if (priority != 0) spec["priority"] = priority;
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", meta}, {"spec", spec}};
}

// `pod` with one more container `name` asking for `resources` (limits), appended to
// spec.<section> ("containers" or "initContainers"); a sidecar is an init container with
// restartPolicy: Always.
inline nlohmann::json WithContainer(nlohmann::json pod, const char* section, const std::string& name,
                                    const std::map<std::string, std::string>& resources, bool sidecar = false) {
  using json = nlohmann::json;
  json c = {{"name", name}, {"image", "cuda:12"}, {"resources", {{"limits", json::object()}}}};
  for (const auto& [k, v] : resources) c["resources"]["limits"][k] = v;
  if (sidecar) c["restartPolicy"] = "Always";
  if (!pod["spec"].contains(section)) pod["spec"][section] = json::array();
  pod["spec"][section].push_back(c);
  return pod;
}

}  // namespace kgpu::testing
