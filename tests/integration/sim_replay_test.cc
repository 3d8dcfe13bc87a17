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

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

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
  int milli = 0;                    // per GPU
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

// --plot: the same curves as SVG and as PNG (librsvg, loaded by kgpu on demand), on a small trace.
// The SVG is checked as text; the PNG is read back with cairo (loaded here the same way) and
// checked pixel by pixel: its size, the white background, and each policy's colour drawn.
struct Cairo {
  void* lib = dlopen("libcairo.so.2", RTLD_NOW | RTLD_LOCAL);
  template <typename F>
  F Fn(const char* name) const {
    return reinterpret_cast<F>(dlsym(lib, name));
  }
};

// Pixels of the ARGB32 picture whose colour is within 12 of 0xRRGGBB in every channel.
int64_t CountColour(const uint8_t* data, int w, int h, int stride, uint32_t rgb) {
  int64_t n = 0;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint32_t px = 0;
      std::memcpy(&px, data + static_cast<ptrdiff_t>(y) * stride + static_cast<ptrdiff_t>(x) * 4, 4);
      bool near = true;
      for (int shift = 0; shift < 24; shift += 8) {
        const int a = static_cast<int>((px >> shift) & 0xff), b = static_cast<int>((rgb >> shift) & 0xff);
        near = near && std::abs(a - b) <= 12;
      }
      n += near ? 1 : 0;
    }
  }
  return n;
}

TEST(SimPlot, TheCurvesAsSvgAndAsPng) {
  const fs::path dir = fs::temp_directory_path() / ("kgpu-sim-plot-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream nodes(dir / "nodes.csv");
    nodes << "sn,cpu_milli,memory_mib,gpu,model\n";
    for (int i = 0; i < 6; ++i) nodes << "n" << i << ",32000,131072,4,T4\n";
    std::ofstream pods(dir / "pods.csv");
    pods << "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n";
    const int milli[] = {1000, 500, 300, 700, 1000, 250, 1000, 600};
    for (int i = 0; i < 40; ++i) pods << "p" << i << ",2000,4096,1," << milli[i % 8] << "\n";
  }
  const std::string base = Quote(KGPU_BIN) + " sim --nodes " + Quote((dir / "nodes.csv").string()) + " --pods " +
                           Quote((dir / "pods.csv").string()) + " --policy bestfit,ours --seeds 42-43 --jobs 1";
  const std::string svg_path = (dir / "curves.svg").string(), png_path = (dir / "curves.PNG").string();
  auto r = Shell(base + " --plot " + Quote(svg_path));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string svg = Slurp(svg_path);
  // One panel (520 high), or two when the policies' curves part (1020: a zoom of that range).
  const bool zoomed = svg.find("url(#zoom)") != std::string::npos;
  const std::string svg_height = zoomed ? "1020" : "520";
  ASSERT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"820\" height=\"" + svg_height + "\"", 0), 0U)
      << svg;
  EXPECT_NE(svg.find("</svg>\n"), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#1f77b4\" stroke-width=\"1.8\" clip-path=\"url(#area)\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("stroke=\"#d62728\" stroke-width=\"1.8\" clip-path=\"url(#area)\""), std::string::npos) << svg;
  EXPECT_NE(svg.find(">bestfit ("), std::string::npos);
  EXPECT_NE(svg.find(">ours ("), std::string::npos);

  r = Shell(base + " --plot " + Quote(png_path));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("plot: " + png_path), std::string::npos) << r.out;
  const std::string png = Slurp(png_path);
  ASSERT_GT(png.size(), 24U);
  ASSERT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
  }

  Cairo cairo;
  ASSERT_NE(cairo.lib, nullptr) << "libcairo.so.2: " << dlerror() << " (scripts/install-deps.sh installs librsvg2-2)";
  auto from_png = cairo.Fn<void* (*)(const char*)>("cairo_image_surface_create_from_png");
  auto status = cairo.Fn<int (*)(void*)>("cairo_surface_status");
  auto width = cairo.Fn<int (*)(void*)>("cairo_image_surface_get_width");
  auto height = cairo.Fn<int (*)(void*)>("cairo_image_surface_get_height");
  auto stride = cairo.Fn<int (*)(void*)>("cairo_image_surface_get_stride");
  auto data = cairo.Fn<uint8_t* (*)(void*)>("cairo_image_surface_get_data");
  auto destroy = cairo.Fn<void (*)(void*)>("cairo_surface_destroy");
  ASSERT_TRUE(from_png && status && width && height && stride && data && destroy);
  void* surface = from_png(png_path.c_str());
  ASSERT_EQ(status(surface), 0);
  const int w = width(surface), h = height(surface);
  EXPECT_EQ(w, 1640);  // twice the SVG's size
  EXPECT_EQ(h, zoomed ? 2040 : 1040);
  const uint8_t* pixels = data(surface);
  const int64_t white = CountColour(pixels, w, h, stride(surface), 0xffffff);
  EXPECT_GT(white, int64_t{w} * h / 2) << "the background is not white";
  // The curves and legend keys: bestfit's blue and ours' red (kColors[0], kColors[1]).
  EXPECT_GT(CountColour(pixels, w, h, stride(surface), 0x1f77b4), 500);
  EXPECT_GT(CountColour(pixels, w, h, stride(surface), 0xd62728), 500);
  // Text (the title, axes, legend) is drawn: dark pixels beyond the frame's.
  EXPECT_GT(CountColour(pixels, w, h, stride(surface), 0x000000), 5000);
  destroy(surface);

  // A name that is neither .svg nor .png, and a directory that does not exist, are refused, and the
  // latter names the path.
  r = Shell(base + " --plot " + Quote((dir / "curves.gif").string()));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("name a .svg or a .png file"), std::string::npos) << r.out;
  const std::string missing = (dir / "no-such-dir" / "curves.png").string();
  r = Shell(base + " --plot " + Quote(missing));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(missing + ": cannot write the PNG"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace
