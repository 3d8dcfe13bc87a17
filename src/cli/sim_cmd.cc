#include "cli/sim_cmd.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include <unistd.h>

#include "cli/svg_png.h"
#include "common/files.h"
#include "common/progress.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "sched/policy.h"
#include "sched/trace.h"

#ifndef KGPU_SOURCE_DIR
#define KGPU_SOURCE_DIR "."
#endif

namespace kgpu::cli {

namespace {

constexpr int kReportAt[] = {100, 110, 120, 130};
constexpr const char* kNodesFile = "openb_node_list_gpu_node.csv";
constexpr const char* kPodsFile = "openb_pod_list_default.csv";
constexpr double kPngScale = 2;  // --plot FILE.png: twice the SVG's 820x520, sharp on a high-DPI screen

// The file name's extension, compared without case.
bool HasExtension(const std::string& path, std::string_view ext) {
  if (path.size() < ext.size()) return false;
  for (size_t i = 0; i < ext.size(); ++i) {
    const char c = path[path.size() - ext.size() + i];
    if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) != ext[i]) return false;
  }
  return true;
}
bool PlotIsPng(const std::string& path) {
  return HasExtension(path, ".png");
}

// The default trace: $KGPU_SIM_DATA_DIR, ./data/alibaba-gpu-v2023, then the source tree's copy.
std::string DefaultDataFile(const char* name) {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("KGPU_SIM_DATA_DIR"); env != nullptr && *env != '\0') dirs.emplace_back(env);
  dirs.emplace_back("data/alibaba-gpu-v2023");
  dirs.emplace_back(Cat(KGPU_SOURCE_DIR, "/data/alibaba-gpu-v2023"));
  for (const auto& d : dirs) {
    const std::string path = Cat(d, "/", name);
    if (ReadFile(path).has_value()) return path;
  }
  return Cat("data/alibaba-gpu-v2023/", name);
}

std::string Fixed(double v, int decimals) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string Pad(std::string s, size_t width, bool left = false) {
  if (s.size() >= width) return s;
  return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  size_t n = 0;
  for (double x : v) {
    if (std::isnan(x)) continue;
    sum += x;
    ++n;
  }
  return n == 0 ? NAN : sum / static_cast<double>(n);
}

// The mean over seeds of one run figure.
template <typename F>
double MeanOf(const PolicyRuns& p, F f) {
  std::vector<double> v;
  for (const auto& r : p.runs) v.push_back(f(r));
  return Mean(v);
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

absl::Status WritePlacements(const std::string& path, const sched::ReplayResult& r,
                             const std::vector<sched::NodeSpec>& nodes) {
  std::ofstream f(path, std::ios::trunc);
  if (!f)
    return absl::PermissionDeniedError(Cat(Printable(path), ": cannot write the placements file (check --placements)"));
  f << "pod_name,node_sn,gpu_indices,gpu_milli_each\n";
  for (const auto& e : r.log) {
    f << e.pod << ',';
    if (e.node >= 0) {
      f << nodes[static_cast<size_t>(e.node)].name << ',' << Join(e.gpus, "|") << ',';
      if (!e.gpus.empty()) f << e.milli_each;
    } else {
      f << ",,";
    }
    f << '\n';
  }
  f.close();
  if (!f) return absl::DataLossError(Cat(Printable(path), ": write error in the placements file"));
  return absl::OkStatus();
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

}  // namespace

absl::StatusOr<std::vector<uint64_t>> ParseSeeds(const std::string& spec) {
  std::vector<uint64_t> out;
  auto number = [&](std::string_view s) -> absl::StatusOr<uint64_t> {
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string_view::npos) {
      return absl::InvalidArgumentError(
          Cat("--seeds ", Printable(spec), ": '", Printable(s), "' is not a seed (use e.g. 42-51 or 42,43)"));
    }
    return std::stoull(std::string(s));
  };
  std::string_view rest(spec);
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t dash = item.find('-');
    if (dash == std::string_view::npos) {
      auto v = number(item);
      if (!v.ok()) return v.status();
      out.push_back(*v);
    } else {
      auto a = number(item.substr(0, dash));
      if (!a.ok()) return a.status();
      auto b = number(item.substr(dash + 1));
      if (!b.ok()) return b.status();
      if (*b < *a || *b - *a >= 10000) {
        return absl::InvalidArgumentError(
            Cat("--seeds ", Printable(spec), ": the range ", Printable(item), " must go up, at most 10000 seeds"));
      }
      for (uint64_t s = *a; s <= *b; ++s) out.push_back(s);
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (out.size() > 10000) return absl::InvalidArgumentError(Cat("--seeds ", Printable(spec), ": at most 10000 seeds"));
  return out;
}

void AddSimFlags(CLI::App* sim, SimFlags* f) {
  sim->add_option("--nodes", f->nodes,
                  "node list CSV (sn,cpu_milli,memory_mib,gpu,model); default: the repository's "
                  "data/alibaba-gpu-v2023/" +
                      std::string(kNodesFile));
  sim->add_option("--pods", f->pods,
                  "pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]); "
                  "default: data/alibaba-gpu-v2023/" +
                      std::string(kPodsFile));
  sim->add_option("--policy", f->policies,
                  "policies to compare, comma-separated: random, bestfit, packing, spread, fgd, ours, ours-trace "
                  "(ours given the trace's distribution)")
      ->capture_default_str();
  sim->add_option("--seeds", f->seeds, "seeds: a range 42-51 or a list 42,43")->capture_default_str();
  sim->add_option("--target", f->target, "arrived GPU demand to reach, as a fraction of the cluster's GPUs")
      ->capture_default_str();
  sim->add_option("--placements", f->placements,
                  "write every arrival as CSV pod_name,node_sn,gpu_indices,gpu_milli_each; {policy} and {seed} "
                  "in the name are replaced");
  sim->add_option("--plot", f->plot,
                  "draw the allocation curves into this file: FILE.svg, or FILE.png (drawn at twice the SVG's "
                  "size; needs librsvg, Debian package librsvg2-2)");
  sim->add_flag("--json", f->json, "one JSON object instead of the table");
  sim->add_option("--jobs", f->jobs, "replays run at once (default: every core)");
  sim->add_flag("--departures", f->departures,
                "dynamic replay: pods arrive at creation_time and leave at deletion_time; a pod that does not fit "
                "waits and is retried when something leaves");
  sim->add_option("--sharing", f->sharing,
                  "how a GPU is shared: timeslice, mps[:<clients>] or mig:<layout> (e.g. mig:1g.10gb*7, "
                  "mig:3g.40gb+2g.20gb+1g.10gb*2)")
      ->capture_default_str();
  sim->add_option("--half-life", f->half_life, "ours: half-life of the learned workload, in arrivals")
      ->capture_default_str();
  sim->add_flag("--quiet", f->quiet,
                "no progress line (runs done, elapsed, an estimate of what is left) on stderr; it is shown only "
                "when stderr is a terminal");
}

std::string RenderSvg(const std::vector<PolicyRuns>& results, int gpus, bool departures) {
  // Mean curve per policy: x (arrived % or hours) -> allocation %.
  std::vector<std::vector<std::pair<double, double>>> curves;
  double xmax = 0, ymin = 100;
  for (const auto& p : results) {
    std::map<double, std::vector<double>> points;
    for (const auto& r : p.runs) {
      if (departures) {
        for (const auto& [t, a] : r.timeline) points[static_cast<double>(t) / 3600.0].push_back(a);
      } else {
        for (const auto& [x, a] : r.curve) points[x].push_back(a);
      }
    }
    std::vector<std::pair<double, double>> c;
    for (const auto& [x, v] : points) {
      c.emplace_back(x, Mean(v));
      xmax = std::max(xmax, x);
      if (x >= (departures ? 0.0 : 50.0)) ymin = std::min(ymin, c.back().second);
    }
    curves.push_back(std::move(c));
  }
  const double xhi = xmax > 0 ? xmax : 1;
  // The zoom: from where the policies' curves first part (more than half a point between the
  // highest and the lowest) to the end, down to the lowest curve there. Over most of the range
  // every curve is the same diagonal; the differences that matter are in the last few points.
  double zx = xhi, zymin = 100;
  if (!departures && curves.size() > 1) {
    std::map<double, std::pair<double, double>> spread;  // x -> (min, max) over policies
    for (const auto& c : curves) {
      for (const auto& [x, y] : c) {
        if (std::isnan(y)) continue;
        auto [it, fresh] = spread.emplace(x, std::make_pair(y, y));
        if (!fresh) it->second = {std::min(it->second.first, y), std::max(it->second.second, y)};
      }
    }
    for (const auto& [x, mm] : spread) {
      if (mm.second - mm.first > 0.5) {
        zx = x;
        break;
      }
    }
    for (const auto& c : curves) {
      for (const auto& [x, y] : c) {
        if (x >= zx && !std::isnan(y)) zymin = std::min(zymin, y);
      }
    }
  }
  const bool zoom = !departures && zx < xhi && zymin < 100;
  const double W = 820, L = 70, R = 250, T = 50, PH = 410, GAP = 90;
  const double H = zoom ? T + PH + GAP + PH + 60 : T + PH + 60;
  std::string s;
  s += Cat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", static_cast<int>(W), "\" height=\"",
           static_cast<int>(H), "\" viewBox=\"0 0 ", static_cast<int>(W), " ", static_cast<int>(H),
           "\" font-family=\"sans-serif\" font-size=\"12\">\n");
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += Cat("<text x=\"", static_cast<int>(L), "\" y=\"28\" font-size=\"15\">GPU allocation ratio vs ",
           departures ? "time" : "arrived GPU demand", " (", gpus, " GPUs, mean over seeds)</text>\n");
  // One panel: x in [x0, x1], y in [y0, 100], drawn from `top`; `id` names its clip path.
  auto panel = [&](const std::string& id, double x0, double x1, double y0, double top, double xstep, double ystep,
                   int decimals) {
    const double yhi = 100;
    auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    // Unclamped: the curves are clipped to the plot area (below its floor they are not drawn,
    // rather than drawn flat along it).
    auto py = [&](double y) { return top + (yhi - y) / (yhi - y0) * PH; };
    s += Cat("<clipPath id=\"", id, "\"><rect x=\"", Fixed(L, 1), "\" y=\"", Fixed(top, 1), "\" width=\"",
             Fixed(W - L - R, 1), "\" height=\"", Fixed(PH, 1), "\"/></clipPath>\n");
    for (double y = y0; y <= yhi + 1e-9; y += ystep) {
      s += Cat("<line x1=\"", Fixed(px(x0), 1), "\" y1=\"", Fixed(py(y), 1), "\" x2=\"", Fixed(px(x1), 1), "\" y2=\"",
               Fixed(py(y), 1), "\" stroke=\"#ddd\"/>\n");
      s += Cat("<text x=\"", Fixed(L - 8, 1), "\" y=\"", Fixed(py(y) + 4, 1), "\" text-anchor=\"end\">",
               Fixed(y, decimals), "%</text>\n");
    }
    for (double x = x0; x <= x1 + 1e-9; x += xstep) {
      s += Cat("<line x1=\"", Fixed(px(x), 1), "\" y1=\"", Fixed(py(y0), 1), "\" x2=\"", Fixed(px(x), 1), "\" y2=\"",
               Fixed(py(yhi), 1), "\" stroke=\"#eee\"/>\n");
      s += Cat("<text x=\"", Fixed(px(x), 1), "\" y=\"", Fixed(top + PH + 18, 1), "\" text-anchor=\"middle\">",
               Fixed(x, 0), departures ? "h" : "%", "</text>\n");
    }
    if (!departures && x0 <= 100 && x1 >= 100) {
      s += Cat("<line x1=\"", Fixed(px(100), 1), "\" y1=\"", Fixed(py(y0), 1), "\" x2=\"", Fixed(px(100), 1),
               "\" y2=\"", Fixed(py(yhi), 1), "\" stroke=\"#999\" stroke-dasharray=\"4 4\"/>\n");
    }
    s += Cat("<rect x=\"", Fixed(L, 1), "\" y=\"", Fixed(top, 1), "\" width=\"", Fixed(W - L - R, 1), "\" height=\"",
             Fixed(PH, 1), "\" fill=\"none\" stroke=\"#333\"/>\n");
    s += Cat("<text x=\"", Fixed((L + W - R) / 2, 1), "\" y=\"", Fixed(top + PH + 42, 1), "\" text-anchor=\"middle\">",
             departures ? "time since the first arrival (hours)" : "arrived GPU demand (% of the cluster's GPUs)",
             "</text>\n");
    s += Cat("<text transform=\"translate(18,", Fixed(top + PH / 2, 1),
             ") rotate(-90)\" text-anchor=\"middle\">GPU milli allocated (%)</text>\n");
    for (size_t i = 0; i < results.size(); ++i) {
      std::string pts;
      for (const auto& [x, y] : curves[i]) {
        if (std::isnan(y) || x < x0 - 1e-9) continue;
        pts += Cat(Fixed(px(x), 1), ",", Fixed(py(y), 1), " ");
      }
      s += Cat("<polyline fill=\"none\" stroke=\"", kColors[i % (sizeof kColors / sizeof kColors[0])],
               "\" stroke-width=\"1.8\" clip-path=\"url(#", id, ")\" points=\"", pts, "\"/>\n");
    }
  };
  const double ylo = std::max(0.0, std::floor(ymin / 10) * 10);
  panel("area", 0, xhi, ylo, T, departures ? std::max(1.0, std::ceil(xhi / 10)) : 10, (100 - ylo) > 30 ? 10 : 5, 0);
  if (zoom) {
    const double zx0 = std::floor(zx / 5) * 5;
    const double zy0 = std::max(0.0, std::floor(zymin - 0.5));  // at least half a point under the lowest
    const double zspan = 100 - zy0;
    const double ystep = zspan > 20 ? 5 : zspan > 8 ? 2 : zspan > 4 ? 1 : 0.5;
    const double ztop = T + PH + GAP;
    s += Cat("<text x=\"", static_cast<int>(L), "\" y=\"", Fixed(ztop - 14, 1), "\" font-size=\"14\">Zoom: from ",
             Fixed(zx0, 0), "% of demand, where the policies part</text>\n");
    panel("zoom", zx0, xhi, zy0, ztop, (xhi - zx0) > 30 ? 10 : 5, ystep, ystep < 1 ? 1 : 0);
  }
  // The legend: each policy's figure and, at 130 %, the GPUs it leaves unallocated.
  for (size_t i = 0; i < results.size(); ++i) {
    const char* color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    const double at = departures ? MeanOf(results[i], [](const sched::ReplayResult& r) { return r.mean_alloc; })
                                 : MeanOf(results[i], [](const sched::ReplayResult& r) { return r.AllocAt(130); });
    const double ly = T + 14 + 34 * static_cast<double>(i);
    s += Cat("<line x1=\"", Fixed(W - R + 14, 1), "\" y1=\"", Fixed(ly - 4, 1), "\" x2=\"", Fixed(W - R + 36, 1),
             "\" y2=\"", Fixed(ly - 4, 1), "\" stroke=\"", color, "\" stroke-width=\"3\"/>\n");
    s += Cat("<text x=\"", Fixed(W - R + 42, 1), "\" y=\"", Fixed(ly, 1), "\">", results[i].policy, " (", Fixed(at, 2),
             departures ? "% mean)" : "% at 130%)", "</text>\n");
    if (!departures && !std::isnan(at)) {
      s += Cat("<text x=\"", Fixed(W - R + 42, 1), "\" y=\"", Fixed(ly + 14, 1), "\" fill=\"#555\">",
               Fixed(static_cast<double>(gpus) * (1 - at / 100), 1), " GPUs unallocated</text>\n");
    }
  }
  s += "</svg>\n";
  return s;
}

int RunSim(const SimFlags& flags, std::ostream& out, std::ostream& err) {
  const std::string nodes_path = flags.nodes.empty() ? DefaultDataFile(kNodesFile) : flags.nodes;
  const std::string pods_path = flags.pods.empty() ? DefaultDataFile(kPodsFile) : flags.pods;
  auto fail = [&](const absl::Status& st) {
    err << "kgpu sim: " << st.message() << "\n";
    return 1;
  };
  auto node_text = ReadInputFile(nodes_path, "node list", "check --nodes");
  if (!node_text.ok()) return fail(node_text.status());
  auto pod_text = ReadInputFile(pods_path, "pod list", "check --pods");
  if (!pod_text.ok()) return fail(pod_text.status());
  auto nodes = sched::ParseNodesCsv(*node_text, nodes_path);
  if (!nodes.ok()) return fail(nodes.status());
  auto pods = sched::ParsePodsCsv(*pod_text, pods_path);
  if (!pods.ok()) return fail(pods.status());
  auto seeds = ParseSeeds(flags.seeds);
  if (!seeds.ok()) return fail(seeds.status());
  auto sharing = sched::ParseSharing(flags.sharing);
  if (!sharing.ok()) return fail(sharing.status());
  if (!(flags.target > 0 && flags.target <= 10)) {
    return fail(
        absl::InvalidArgumentError(Cat("--target ", Fixed(flags.target, 3), ": use a fraction in (0, 10], e.g. 1.3")));
  }
  if (!(flags.half_life > 0)) return fail(absl::InvalidArgumentError("--half-life: use a positive number of arrivals"));
  std::vector<std::string> policies;
  {
    std::string_view rest(flags.policies);
    while (true) {
      const size_t comma = rest.find(',');
      std::string name(rest.substr(0, comma));
      auto known = sched::PolicyNames();
      known.push_back("ours-trace");
      known.push_back("gpupacking");
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        const std::string near = Nearest(name, known, 3);
        return fail(absl::InvalidArgumentError(Cat("--policy: unknown policy '", Printable(name), "'",
                                                   near.empty() ? "" : Cat(" (did you mean ", near, "?)"), "; use ",
                                                   Join(known, ", "))));
      }
      if (std::find(policies.begin(), policies.end(), name) != policies.end()) {
        return fail(absl::InvalidArgumentError(Cat("--policy: '", name, "' is named twice")));
      }
      policies.push_back(std::move(name));
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  }
  if (!flags.placements.empty()) {
    if (policies.size() > 1 && flags.placements.find("{policy}") == std::string::npos) {
      return fail(absl::InvalidArgumentError(Cat("--placements ", Printable(flags.placements), ": ", policies.size(),
                                                 " policies would write one file; put {policy} in the name")));
    }
    if (seeds->size() > 1 && flags.placements.find("{seed}") == std::string::npos) {
      return fail(absl::InvalidArgumentError(Cat("--placements ", Printable(flags.placements), ": ", seeds->size(),
                                                 " seeds would write one file; put {seed} in the name")));
    }
  }
  const bool png = PlotIsPng(flags.plot);
  if (!flags.plot.empty()) {
    if (!png && !HasExtension(flags.plot, ".svg")) {
      return fail(absl::InvalidArgumentError(
          Cat("--plot ", Printable(flags.plot), ": name a .svg or a .png file (the name says which is drawn)")));
    }
    // Before the replays: a missing library must not cost a long run.
    if (png) {
      if (auto st = PngAvailable(); !st.ok()) return fail(absl::FailedPreconditionError(Cat("--plot: ", st.message())));
    }
  }

  // The runs: policy x seed, on --jobs threads.
  struct Job {
    size_t policy, seed;
    absl::StatusOr<sched::ReplayResult> result = absl::UnknownError("not run");
    double seconds = 0;
  };
  std::vector<Job> jobs;
  for (size_t p = 0; p < policies.size(); ++p) {
    for (size_t s = 0; s < seeds->size(); ++s) jobs.push_back({p, s});
  }
  unsigned threads = flags.jobs > 0 ? flags.jobs : std::max(1U, std::thread::hardware_concurrency());
  threads = std::min<unsigned>(threads, static_cast<unsigned>(jobs.size()));
  std::atomic<size_t> next{0};
  std::optional<Progress> progress;
  progress.emplace(err, ProgressWanted(STDERR_FILENO, flags.quiet), "kgpu sim", jobs.size(), "runs");
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      auto& j = jobs[i];
      sched::ReplayOptions o;
      o.policy = policies[j.policy] == "gpupacking" ? "packing" : policies[j.policy];
      o.seed = (*seeds)[j.seed];
      o.target = flags.target;
      o.sharing = *sharing;
      o.departures = flags.departures;
      o.half_life = flags.half_life;
      o.keep_log = !flags.placements.empty();
      const auto t0 = std::chrono::steady_clock::now();
      j.result = sched::Replay(*nodes, *pods, o);
      j.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress->Advance();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  progress.reset();  // the line cleared before the table

  std::vector<PolicyRuns> results(policies.size());
  std::vector<std::vector<double>> seconds(policies.size());
  for (size_t p = 0; p < policies.size(); ++p) results[p].policy = policies[p];
  for (auto& j : jobs) {
    if (!j.result.ok()) return fail(j.result.status());
    if (!flags.placements.empty()) {
      std::string path = ReplaceAll(flags.placements, "{policy}", policies[j.policy]);
      path = ReplaceAll(path, "{seed}", std::to_string((*seeds)[j.seed]));
      auto st = WritePlacements(path, *j.result, *nodes);
      if (!st.ok()) return fail(st);
      j.result->log.clear();
    }
    results[j.policy].runs.push_back(std::move(*j.result));
    seconds[j.policy].push_back(j.seconds);
  }
  const int gpus = results.front().runs.front().gpus;
  if (!flags.plot.empty()) {
    const std::string svg = RenderSvg(results, gpus, flags.departures);
    if (png) {
      if (auto st = WriteSvgAsPng(svg, flags.plot, kPngScale); !st.ok()) return fail(st);
    } else {
      std::ofstream f(flags.plot, std::ios::trunc);
      f << svg;
      f.close();
      if (!f)
        return fail(absl::PermissionDeniedError(Cat(Printable(flags.plot), ": cannot write the plot (check --plot)")));
    }
  }

  auto unalloc = [&](double pct) { return std::isnan(pct) ? NAN : static_cast<double>(gpus) * (1 - pct / 100); };
  if (flags.json) {
    using nlohmann::json;
    auto num = [](double v) { return std::isnan(v) ? json(nullptr) : json(std::round(v * 10000) / 10000); };
    json j;
    j["nodes_file"] = nodes_path;
    j["pods_file"] = pods_path;
    j["nodes"] = nodes->size();
    j["gpus"] = gpus;
    j["pods"] = pods->size();
    j["seeds"] = *seeds;
    j["target"] = flags.target;
    j["sharing"] = sharing->spec;
    j["departures"] = flags.departures;
    j["policies"] = json::array();
    for (size_t p = 0; p < results.size(); ++p) {
      const auto& pr = results[p];
      json jp;
      jp["policy"] = pr.policy;
      json runs = json::array();
      std::map<std::string, std::vector<double>> failed_shapes;
      for (size_t s = 0; s < pr.runs.size(); ++s) {
        const auto& r = pr.runs[s];
        json jr;
        jr["seed"] = r.seed;
        jr["seconds"] = num(seconds[p][s]);
        jr["arrived"] = r.arrived;
        jr["placed"] = r.placed;
        jr["failed"] = r.failed;
        jr["failed_by_shape"] = r.failed_by_shape;
        jr["arrived_by_shape"] = r.arrived_by_shape;
        jr["final_alloc"] = num(r.final_alloc);
        jr["frag_gpus"] = num(r.frag_milli / 1000);
        jr["idle_gpus"] = num(r.idle_milli / 1000);
        jr["typical_shapes"] = r.typical_shapes;
        if (flags.departures) {
          jr["mean_alloc"] = num(r.mean_alloc);
          jr["pending_p50_s"] = num(r.pending_p50);
          jr["pending_p99_s"] = num(r.pending_p99);
          jr["pending_max_s"] = num(r.pending_max);
          jr["waited"] = r.waited;
          jr["never_placed"] = r.never_placed;
        } else {
          for (int x : kReportAt) jr["alloc_at"][std::to_string(x)] = num(r.AllocAt(x));
          json curve = json::object();
          for (const auto& [x, a] : r.curve) curve[std::to_string(x)] = num(a);
          jr["curve"] = curve;
        }
        for (const auto& [k, v] : r.arrived_by_shape) {
          auto it = r.failed_by_shape.find(k);
          failed_shapes[k].push_back(it == r.failed_by_shape.end() ? 0.0 : static_cast<double>(it->second));
        }
        runs.push_back(std::move(jr));
      }
      if (flags.departures) {
        jp["mean_alloc"] = num(MeanOf(pr, [](const sched::ReplayResult& r) { return r.mean_alloc; }));
        jp["pending_p99_s"] = num(MeanOf(pr, [](const sched::ReplayResult& r) { return r.pending_p99; }));
        jp["never_placed"] =
            num(MeanOf(pr, [](const sched::ReplayResult& r) { return static_cast<double>(r.never_placed); }));
      } else {
        for (int x : kReportAt) {
          jp["alloc_at"][std::to_string(x)] =
              num(MeanOf(pr, [x](const sched::ReplayResult& r) { return r.AllocAt(x); }));
        }
        jp["unallocated_gpus_at_130"] =
            num(unalloc(MeanOf(pr, [](const sched::ReplayResult& r) { return r.AllocAt(130); })));
      }
      jp["failed_pods"] = num(MeanOf(pr, [](const sched::ReplayResult& r) { return static_cast<double>(r.failed); }));
      for (const auto& [k, v] : failed_shapes) jp["failed_by_shape"][k] = num(Mean(v));
      jp["frag_gpus"] = num(MeanOf(pr, [](const sched::ReplayResult& r) { return r.frag_milli / 1000; }));
      jp["idle_gpus"] = num(MeanOf(pr, [](const sched::ReplayResult& r) { return r.idle_milli / 1000; }));
      jp["seconds_per_run"] = num(Mean(seconds[p]));
      jp["runs"] = std::move(runs);
      j["policies"].push_back(std::move(jp));
    }
    out << j.dump(2) << "\n";
    return 0;
  }

  out << "kgpu sim: " << nodes->size() << " nodes (" << gpus << " GPUs) from " << nodes_path << ", " << pods->size()
      << " pods from " << pods_path << "\n";
  out << "  "
      << (flags.departures ? "dynamic replay (creation/deletion times)"
                           : Cat("arrivals to ", Fixed(flags.target * 100, 0), "% of GPU capacity"))
      << ", sharing " << sharing->spec << ", " << seeds->size() << " seed" << (seeds->size() == 1 ? "" : "s") << " ("
      << flags.seeds << "), mean over seeds\n\n";
  if (flags.departures) {
    out << Pad("policy", 12, true) << Pad("mean alloc %", 14) << Pad("final %", 10) << Pad("waited", 9)
        << Pad("never placed", 14) << Pad("pending p50 s", 15) << Pad("p99 s", 10) << Pad("max s", 10)
        << Pad("s/run", 8) << "\n";
    for (size_t p = 0; p < results.size(); ++p) {
      const auto& pr = results[p];
      out << Pad(pr.policy, 12, true)
          << Pad(Fixed(MeanOf(pr, [](const sched::ReplayResult& r) { return r.mean_alloc; }), 2), 14)
          << Pad(Fixed(MeanOf(pr, [](const sched::ReplayResult& r) { return r.final_alloc; }), 2), 10)
          << Pad(Fixed(MeanOf(pr, [](const sched::ReplayResult& r) { return static_cast<double>(r.waited); }), 1), 9)
          << Pad(Fixed(MeanOf(pr, [](const sched::ReplayResult& r) { return static_cast<double>(r.never_placed); }), 1),
                 14)
          << Pad(Fixed(MeanOf(pr, [](const sched::ReplayResult& r) { return r.pending_p50; }), 0), 15)
          << Pad(Fixed(MeanOf(pr, [](const sched::ReplayResult& r) { return r.pending_p99; }), 0), 10)
          << Pad(Fixed(MeanOf(pr, [](const sched::ReplayResult& r) { return r.pending_max; }), 0), 10)
          << Pad(Fixed(Mean(seconds[p]), 2), 8) << "\n";
    }
  } else {
    out << Pad("policy", 12, true) << "GPU allocation % at arrived demand" << Pad("unallocated", 14) << Pad("failed", 9)
        << Pad("frag GPUs", 11) << Pad("s/run", 8) << "\n";
    out << Pad("", 12, true);
    for (int x : kReportAt) out << Pad(Cat(x, "%"), 8);
    out << Pad("", 2) << Pad("GPUs @130%", 14) << Pad("pods", 9) << Pad("at end", 11) << "\n";
    for (size_t p = 0; p < results.size(); ++p) {
      const auto& pr = results[p];
      out << Pad(pr.policy, 12, true);
      for (int x : kReportAt)
        out << Pad(Fixed(MeanOf(pr, [x](const sched::ReplayResult& r) { return r.AllocAt(x); }), 2), 8);
      out << Pad("", 2)
          << Pad(Fixed(unalloc(MeanOf(pr, [](const sched::ReplayResult& r) { return r.AllocAt(130); })), 0), 14)
          << Pad(Fixed(MeanOf(pr, [](const sched::ReplayResult& r) { return static_cast<double>(r.failed); }), 1), 9)
          << Pad(Fixed(MeanOf(pr, [](const sched::ReplayResult& r) { return r.frag_milli / 1000; }), 1), 11)
          << Pad(Fixed(Mean(seconds[p]), 2), 8) << "\n";
    }
  }
  // Failed pods by shape class.
  std::vector<std::string> classes;
  for (const auto& pr : results) {
    for (const auto& r : pr.runs) {
      for (const auto& [k, v] : r.arrived_by_shape) {
        if (std::find(classes.begin(), classes.end(), k) == classes.end()) classes.push_back(k);
      }
    }
  }
  std::sort(classes.begin(), classes.end());
  out << "\nfailed (or, with --departures, waiting) pods by shape, mean over seeds (arrived in brackets)\n"
      << Pad("policy", 12, true);
  for (const auto& c : classes) out << Pad(c, 18);
  out << "\n";
  for (const auto& pr : results) {
    out << Pad(pr.policy, 12, true);
    for (const auto& c : classes) {
      const double f = MeanOf(pr, [&](const sched::ReplayResult& r) {
        auto it = r.failed_by_shape.find(c);
        return it == r.failed_by_shape.end() ? 0.0 : static_cast<double>(it->second);
      });
      const double a = MeanOf(pr, [&](const sched::ReplayResult& r) {
        auto it = r.arrived_by_shape.find(c);
        return it == r.arrived_by_shape.end() ? 0.0 : static_cast<double>(it->second);
      });
      out << Pad(Cat(Fixed(f, 1), " (", Fixed(a, 0), ")"), 18);
    }
    out << "\n";
  }
  if (!flags.plot.empty()) out << "\nplot: " << flags.plot << "\n";
  if (!flags.placements.empty()) out << "placements: " << flags.placements << "\n";
  return 0;
}

}  // namespace kgpu::cli
