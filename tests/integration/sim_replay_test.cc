// Integration: the default-trace replay of `kgpu sim` (policy ours, seed 42) as a process, and an
// independent check of its placement log.
//
// The test runs `kgpu sim --policy ours --seeds 42 --placements FILE --json` from an empty working
// directory, so the binary finds its default trace as an operator's copy would (the source tree's
// data/alibaba-gpu-v2023, compiled into sim_cmd.cc); the JSON names the node and pod files it read,
// and the test reads those same files with its own CSV reading (not the engine's parser). It then
// re-applies every line of the placements CSV to its own ledger of node CPU / memory / pod count
// and per-GPU milli, and checks:
//   - every arrival is a trace pod or a `<name>-tuned-<k>` clone of one, with its request's shape;
//   - a placement names a real node and distinct real GPUs, as many as the pod asks, each given the
//     pod's per-GPU milli (1000 for whole GPUs); whole GPUs were completely free; the GPU model is
//     one the pod's gpu_spec allows;
//   - no GPU above 1000 milli, no node above its CPU, memory or 1001 pods, at any point;
//   - every failed pod really did not fit anywhere when it arrived (no node with enough CPU,
//     memory, pod room and enough GPUs of an allowed model with enough free milli);
//   - the KPI printed in --json (arrived / placed / failed, failed by shape, the allocation ratio at
//     100..130 % and the whole curve) equals the KPI recomputed from the log by the facts file's
//     formula: mean of round(alloc %, 2) over the arrivals whose round(arrived %) is x.

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "testing/shell.h"

#ifndef KGPU_BIN
#error "KGPU_BIN must be defined by the build"
#endif

namespace {

namespace fs = std::filesystem;
using kgpu::testing::Quote;
using kgpu::testing::Shell;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// A CSV with a header: rows as column name -> value.
std::vector<std::map<std::string, std::string>> ReadCsv(const std::string& path) {
  std::vector<std::map<std::string, std::string>> rows;
  std::istringstream in(Slurp(path));
  std::string line;
  std::vector<std::string> header;
  while (std::getline(in, line)) {
    if (line.empty() || line == "\r") continue;
    auto cells = Split(line, ',');
    if (header.empty()) {
      header = cells;
      continue;
    }
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < cells.size(); ++i) row[header[i]] = cells[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

int64_t Num(const std::map<std::string, std::string>& row, const std::string& key, int64_t if_empty) {
  auto it = row.find(key);
  if (it == row.end() || it->second.empty()) return if_empty;
  return std::stoll(it->second);
}

struct Gpu {
  std::string model;
  int used = 0;  // milli
  int pods = 0;
};
struct Node {
  int64_t cpu = 0, memory = 0, cpu_used = 0, memory_used = 0;
  int pods = 0;
  std::vector<Gpu> gpus;
};
struct Pod {
  int64_t cpu = 0, memory = 0;
  int num_gpus = 0;
  int milli = 0;  // per GPU
  std::vector<std::string> models;  // allowed; empty: any
  bool Whole() const { return num_gpus > 0 && milli >= 1000; }
  bool Allows(const std::string& m) const {
    if (models.empty()) return true;
    for (const auto& x : models) {
      if (x == m) return true;
    }
    return false;
  }
  std::string Class() const {
    if (num_gpus == 0) return "cpu";
    if (num_gpus == 1 && milli < 1000) return "share";
    if (num_gpus == 1 || num_gpus == 2 || num_gpus == 4 || num_gpus == 8) return std::to_string(num_gpus) + "-gpu";
    return "other-gpu";
  }
};

constexpr int kMaxPods = 1001;

bool GpuTakes(const Pod& p, const Gpu& g) {
  if (!p.Allows(g.model)) return false;
  return p.Whole() ? (g.used == 0 && g.pods == 0) : (1000 - g.used >= p.milli);
}

bool Fits(const Pod& p, const Node& n) {
  if (n.cpu - n.cpu_used < p.cpu || n.memory - n.memory_used < p.memory || n.pods >= kMaxPods) return false;
  int fitting = 0;
  for (const auto& g : n.gpus) fitting += GpuTakes(p, g) ? 1 : 0;
  return fitting >= p.num_gpus;
}

TEST(SimReplay, DefaultTraceOursSeed42PlacementLogChecksOut) {
  const fs::path dir = fs::temp_directory_path() / ("kgpu-sim-replay-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string placements = (dir / "placements.csv").string();
  const std::string json_path = (dir / "kpi.json").string();
  const auto run = Shell("cd " + Quote(dir.string()) + " && " + Quote(KGPU_BIN) +
                         " sim --policy ours --seeds 42 --jobs 1 --placements " + Quote(placements) + " --json > " +
                         Quote(json_path));
  ASSERT_EQ(run.code, 0) << run.out;
  const auto kpi = nlohmann::json::parse(Slurp(json_path));
  const std::string nodes_file = kpi.at("nodes_file").get<std::string>();
  const std::string pods_file = kpi.at("pods_file").get<std::string>();
  ASSERT_NE(nodes_file.find("alibaba-gpu-v2023/openb_node_list_gpu_node.csv"), std::string::npos) << nodes_file;
  ASSERT_NE(pods_file.find("alibaba-gpu-v2023/openb_pod_list_default.csv"), std::string::npos) << pods_file;

  // The cluster and the trace, read independently.
  std::map<std::string, Node> nodes;
  int64_t total_milli = 0;
  for (const auto& r : ReadCsv(nodes_file)) {
    Node n;
    n.cpu = Num(r, "cpu_milli", 0);
    n.memory = Num(r, "memory_mib", 0);
    n.gpus.resize(static_cast<size_t>(Num(r, "gpu", 0)));
    for (auto& g : n.gpus) g.model = r.at("model");
    total_milli += 1000 * static_cast<int64_t>(n.gpus.size());
    nodes[r.at("sn")] = std::move(n);
  }
  ASSERT_EQ(nodes.size(), 1213U);
  ASSERT_EQ(total_milli, 6212000);
  EXPECT_EQ(kpi.at("gpus").get<int64_t>(), 6212);
  std::map<std::string, Pod> trace;
  for (const auto& r : ReadCsv(pods_file)) {
    Pod p;
    p.cpu = Num(r, "cpu_milli", 0);
    p.memory = Num(r, "memory_mib", 0);
    p.num_gpus = static_cast<int>(Num(r, "num_gpu", 0));
    p.milli = static_cast<int>(std::min<int64_t>(Num(r, "gpu_milli", 1000), 1000));
    if (p.num_gpus > 1) p.milli = 1000;
    if (auto it = r.find("gpu_spec"); it != r.end() && !it->second.empty()) p.models = Split(it->second, '|');
    trace[r.at("name")] = std::move(p);
  }
  ASSERT_EQ(trace.size(), 8152U);

  // Re-apply the log.
  std::ifstream log(placements);
  std::string line;
  ASSERT_TRUE(std::getline(log, line));
  ASSERT_EQ(line, "pod_name,node_sn,gpu_indices,gpu_milli_each");
  int64_t arrived = 0, placed = 0, failed = 0, arrived_milli = 0, alloc_milli = 0;
  std::map<std::string, int64_t> failed_by_shape, arrived_by_shape;
  std::map<int, std::pair<double, int64_t>> buckets;
  std::map<std::string, int> seen;
  int64_t failed_checked = 0;
  while (std::getline(log, line)) {
    const auto f = Split(line, ',');
    ASSERT_EQ(f.size(), 4U) << line;
    const std::string& name = f[0];
    ASSERT_EQ(++seen[name], 1) << "pod arrives twice: " << name;
    std::string base = name;
    if (const size_t at = name.find("-tuned-"); at != std::string::npos) base = name.substr(0, at);
    auto tp = trace.find(base);
    ASSERT_NE(tp, trace.end()) << "not a trace pod nor a clone of one: " << line;
    const Pod& pod = tp->second;
    ++arrived;
    ++arrived_by_shape[pod.Class()];
    arrived_milli += int64_t{pod.num_gpus} * pod.milli;
    if (f[1].empty()) {
      ASSERT_TRUE(f[2].empty() && f[3].empty()) << line;
      ++failed;
      ++failed_by_shape[pod.Class()];
      for (const auto& [sn, n] : nodes) ASSERT_FALSE(Fits(pod, n)) << name << " failed but fits on " << sn;
      ++failed_checked;
    } else {
      auto nit = nodes.find(f[1]);
      ASSERT_NE(nit, nodes.end()) << "unknown node: " << line;
      Node& n = nit->second;
      std::vector<int> gpus;
      if (!f[2].empty()) {
        for (const auto& s : Split(f[2], '|')) gpus.push_back(std::stoi(s));
      }
      ASSERT_EQ(static_cast<int>(gpus.size()), pod.num_gpus) << line;
      if (pod.num_gpus == 0) {
        ASSERT_TRUE(f[3].empty()) << line;
      } else {
        ASSERT_EQ(std::stoi(f[3]), pod.milli) << line;
      }
      for (size_t i = 0; i < gpus.size(); ++i) {
        ASSERT_TRUE(gpus[i] >= 0 && gpus[i] < static_cast<int>(n.gpus.size())) << line;
        for (size_t j = 0; j < i; ++j) ASSERT_NE(gpus[i], gpus[j]) << line;
        Gpu& g = n.gpus[static_cast<size_t>(gpus[i])];
        ASSERT_TRUE(pod.Allows(g.model)) << line << ": model " << g.model;
        if (pod.Whole()) {
          ASSERT_TRUE(g.used == 0 && g.pods == 0) << line << ": whole GPU not free";
        }
        g.used += pod.milli;
        ++g.pods;
        ASSERT_LE(g.used, 1000) << line << ": GPU over 1000 milli";
        alloc_milli += pod.milli;
      }
      n.cpu_used += pod.cpu;
      n.memory_used += pod.memory;
      ++n.pods;
      ASSERT_LE(n.cpu_used, n.cpu) << line << ": node over CPU";
      ASSERT_LE(n.memory_used, n.memory) << line << ": node over memory";
      ASSERT_LE(n.pods, kMaxPods) << line;
      ++placed;
    }
    const double arrived_pct = 100.0 * static_cast<double>(arrived_milli) / static_cast<double>(total_milli);
    const double alloc_pct = 100.0 * static_cast<double>(alloc_milli) / static_cast<double>(total_milli);
    auto& b = buckets[static_cast<int>(std::nearbyint(arrived_pct))];
    b.first += std::nearbyint(alloc_pct * 100.0) / 100.0;
    ++b.second;
  }
  // The replay goes to 130 % arrived GPU demand.
  ASSERT_GE(100.0 * static_cast<double>(arrived_milli) / static_cast<double>(total_milli), 129.5);

  // The printed KPI against the recomputed one.
  const auto& policy = kpi.at("policies").at(0);
  ASSERT_EQ(policy.at("policy"), "ours");
  const auto& r = policy.at("runs").at(0);
  EXPECT_EQ(r.at("seed").get<int>(), 42);
  EXPECT_EQ(r.at("arrived").get<int64_t>(), arrived);
  EXPECT_EQ(r.at("placed").get<int64_t>(), placed);
  EXPECT_EQ(r.at("failed").get<int64_t>(), failed);
  EXPECT_EQ(failed_checked, failed);
  using Counts = std::map<std::string, int64_t>;
  EXPECT_EQ(r.at("arrived_by_shape").get<Counts>(), arrived_by_shape);
  EXPECT_EQ(r.at("failed_by_shape").get<Counts>(), failed_by_shape);
  // JSON figures are rounded to 4 decimals.
  const auto& curve = r.at("curve");
  ASSERT_EQ(curve.size(), buckets.size());
  for (const auto& [x, b] : buckets) {
    const double mine = b.first / static_cast<double>(b.second);
    ASSERT_TRUE(curve.contains(std::to_string(x))) << x;
    EXPECT_NEAR(curve.at(std::to_string(x)).get<double>(), mine, 1e-4) << "curve at " << x << " %";
  }
  for (int x : {100, 110, 120, 130}) {
    const auto& b = buckets.at(x);
    const double mine = b.first / static_cast<double>(b.second);
    EXPECT_NEAR(r.at("alloc_at").at(std::to_string(x)).get<double>(), mine, 1e-4) << x;
    EXPECT_NEAR(policy.at("alloc_at").at(std::to_string(x)).get<double>(), mine, 1e-4) << x;
  }
  EXPECT_NEAR(r.at("final_alloc").get<double>(),
              100.0 * static_cast<double>(alloc_milli) / static_cast<double>(total_milli), 1e-4);
  EXPECT_NEAR(policy.at("unallocated_gpus_at_130").get<double>(),
              6212.0 * (1 - buckets.at(130).first / static_cast<double>(buckets.at(130).second) / 100), 1e-2);
  fs::remove_all(dir);
}

}  // namespace
