#include "sched/replay.h"

#include <algorithm>
#include <cmath>
#include <queue>

#include "common/strings.h"
#include "sched/engine.h"
#include "sched/rng.h"

namespace kgpu::sched {

namespace {

absl::StatusOr<MigInstance> ParseProfile(std::string_view p, std::string_view spec) {
  // <compute>g.<memory>gb, e.g. 1g.10gb, 3g.40gb, 1g.5gb
  const auto g = p.find("g.");
  const bool gb = p.size() > 2 && p.substr(p.size() - 2) == "gb";
  int compute = 0, memory = 0;
  bool ok = g != std::string_view::npos && gb && g > 0;
  if (ok) {
    for (char c : p.substr(0, g)) ok = ok && c >= '0' && c <= '9';
    for (char c : p.substr(g + 2, p.size() - g - 4)) ok = ok && c >= '0' && c <= '9';
    ok = ok && p.size() - g - 4 > 0 && g <= 1 && p.size() - g - 4 <= 4;
  }
  if (ok) {
    compute = std::stoi(std::string(p.substr(0, g)));
    memory = std::stoi(std::string(p.substr(g + 2, p.size() - g - 4)));
  }
  if (!ok || compute < 1 || compute > 7 || memory < 1) {
    return absl::InvalidArgumentError(
        Cat("--sharing ", spec, ": '", p, "' is not a MIG profile like 1g.10gb or 3g.40gb (compute slices 1-7)"));
  }
  MigInstance m;
  m.profile = std::string(p);
  m.compute_slices = compute;
  m.memory_mib = int64_t{memory} * 1024;
  m.milli = compute * kMilli / 7;
  return m;
}

double Round2(double v) {
  return std::nearbyint(v * 100.0) / 100.0;
}

// The paper's arrival sequence: the name-sorted pods shuffled with the seed, then
// TunePodsByNodeTotalResource: while the GPU demand is below the target, a clone of a random pod
// of the name-sorted list (`<name>-tuned-<k>`) is appended at the end; the simulator stops at the
// first drawn pod whose per-GPU milli would take the demand past the target (that pod is not
// added). A workload above the target has random pods removed instead.
std::vector<PodRequest> ArrivalOrder(const std::vector<PodRequest>& sorted, int64_t capacity, double target, Rng& rng) {
  const auto demand_of = [](const PodRequest& p) { return int64_t{p.num_gpus} * p.gpu_milli; };
  std::vector<PodRequest> out = sorted;
  rng.Shuffle(out);
  int64_t demand = 0;
  bool any_gpu = false;
  for (const auto& p : sorted) {
    demand += demand_of(p);
    any_gpu = any_gpu || demand_of(p) > 0;
  }
  const auto goal = static_cast<double>(capacity) * target;
  if (!any_gpu || target <= 0) return out;
  if (static_cast<double>(demand) < goal) {
    for (int k = 0;; ++k) {
      const PodRequest& src = sorted[rng.Below(sorted.size())];
      if (static_cast<double>(demand + src.gpu_milli) > goal) break;
      PodRequest c = src;
      c.name = Cat(src.name, "-tuned-", k);
      demand += demand_of(c);
      out.push_back(std::move(c));
    }
  } else {
    while (static_cast<double>(demand) > goal && !out.empty()) {
      const auto i = static_cast<size_t>(rng.Below(out.size()));
      demand -= demand_of(out[i]);
      out.erase(out.begin() + static_cast<long>(i));
    }
  }
  return out;
}

void ApplySharing(const Sharing& s, std::vector<NodeSpec>* nodes, std::vector<PodRequest>* pods) {
  if (s.kind == Sharing::kMps) {
    for (auto& n : *nodes) {
      for (auto& g : n.gpus) g.max_shares = s.mps_clients;
    }
  }
  if (s.kind != Sharing::kMig) return;
  for (auto& n : *nodes) {
    for (auto& g : n.gpus) g.mig = s.layout;
  }
  // A share takes the smallest profile that fits its milli (by compute, then memory).
  std::vector<MigInstance> profiles = s.layout;
  std::sort(profiles.begin(), profiles.end(), [](const MigInstance& a, const MigInstance& b) {
    return a.milli != b.milli ? a.milli < b.milli : a.memory_mib < b.memory_mib;
  });
  for (auto& p : *pods) {
    if (p.num_gpus != 1 || p.gpu_milli >= kMilli) continue;
    for (const auto& m : profiles) {
      if (m.milli >= p.gpu_milli && (p.gpu_memory_mib == 0 || m.memory_mib >= p.gpu_memory_mib)) {
        p.mig_profile = m.profile;
        break;
      }
    }
    if (p.mig_profile.empty()) p.gpu_milli = kMilli;  // bigger than any slice: a whole GPU
  }
}

}  // namespace

absl::StatusOr<Sharing> ParseSharing(std::string_view spec) {
  Sharing s;
  s.spec = std::string(spec);
  if (spec == "timeslice" || spec == "time-slicing") return s;
  if (spec == "mps" || spec.substr(0, 4) == "mps:") {
    s.kind = Sharing::kMps;
    if (spec.size() > 4) {
      const std::string n(spec.substr(4));
      const bool digits = !n.empty() && n.size() <= 3 && n.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoi(n) < 1) {
        return absl::InvalidArgumentError(Cat("--sharing ", spec, ": mps:<clients> needs a count 1-999"));
      }
      s.mps_clients = std::stoi(n);
    }
    return s;
  }
  if (spec.substr(0, 4) == "mig:") {
    s.kind = Sharing::kMig;
    std::string_view rest = spec.substr(4);
    int slices = 0;
    while (!rest.empty()) {
      const auto plus = rest.find('+');
      std::string_view item = rest.substr(0, plus);
      rest = plus == std::string_view::npos ? std::string_view{} : rest.substr(plus + 1);
      int count = 1;
      if (const auto star = item.find('*'); star != std::string_view::npos) {
        const std::string n(item.substr(star + 1));
        if (n.empty() || n.size() > 1 || n[0] < '1' || n[0] > '7') {
          return absl::InvalidArgumentError(Cat("--sharing ", spec, ": '", item, "': the count after * must be 1-7"));
        }
        count = n[0] - '0';
        item = item.substr(0, star);
      }
      auto m = ParseProfile(item, spec);
      if (!m.ok()) return m.status();
      for (int i = 0; i < count; ++i) {
        s.layout.push_back(*m);
        slices += m->compute_slices;
      }
    }
    if (s.layout.empty()) {
      return absl::InvalidArgumentError(
          Cat("--sharing ", spec, ": name a layout, e.g. mig:1g.10gb*7 or mig:3g.40gb+4g.40gb"));
    }
    if (slices > 7) {
      return absl::InvalidArgumentError(
          Cat("--sharing ", spec, ": the layout uses ", slices, " compute slices (a GPU has 7)"));
    }
    return s;
  }
  return absl::InvalidArgumentError(
      Cat("--sharing ", spec, ": unknown (use timeslice, mps, mps:<clients> or mig:<layout>)"));
}

std::string ShapeClass(const PodRequest& p) {
  if (!p.mig_profile.empty()) return "mig";
  if (p.num_gpus == 0) return "cpu";
  if (p.num_gpus == 1 && p.gpu_milli < kMilli) return "share";
  if (p.num_gpus == 1 || p.num_gpus == 2 || p.num_gpus == 4 || p.num_gpus == 8) return Cat(p.num_gpus, "-gpu");
  return "other-gpu";
}

double ReplayResult::AllocAt(int percent) const {
  auto it = curve.find(percent);
  return it == curve.end() ? NAN : it->second;
}

absl::StatusOr<ReplayResult> Replay(const std::vector<NodeSpec>& node_specs, const std::vector<TracePod>& trace,
                                    const ReplayOptions& o) {
  if (node_specs.empty()) return absl::InvalidArgumentError("replay: no nodes");
  if (trace.empty()) return absl::InvalidArgumentError("replay: no pods");
  std::vector<NodeSpec> nodes = node_specs;
  std::vector<PodRequest> original;
  original.reserve(trace.size());
  for (const auto& t : trace) original.push_back(t.request);
  std::sort(original.begin(), original.end(), [](const PodRequest& a, const PodRequest& b) { return a.name < b.name; });

  ReplayResult res;
  res.policy = o.policy;
  res.seed = o.seed;
  Rng rng(o.seed);
  Engine engine(nullptr, o.seed ^ 0x9d2c5680ULL);

  // Shapes of the trace (untuned, as given) for fgd, ours-trace and the final fragmentation.
  std::vector<NodeSpec> transformed_nodes = nodes;
  std::vector<PodRequest> dummy;
  ApplySharing(o.sharing, &transformed_nodes, &dummy);
  for (const auto& n : transformed_nodes) {
    auto id = engine.AddNode(n);
    if (!id.ok()) return id.status();
  }
  res.total_milli = engine.cluster().TotalGpuMilli();
  for (const auto& n : nodes) res.gpus += static_cast<int>(n.gpus.size());
  if (res.total_milli <= 0) return absl::InvalidArgumentError("replay: the cluster has no GPUs");
  std::vector<Request> compiled;
  compiled.reserve(original.size());
  for (const auto& p : original) {
    auto r = engine.cluster().Compile(p);
    if (!r.ok()) return r.status();
    compiled.push_back(*r);
  }
  const std::vector<Shape> typical = TypicalShapes(compiled);
  res.typical_shapes = typical.size();

  PolicyOptions po;
  po.seed = o.seed;
  po.half_life = o.half_life;
  std::string name = o.policy;
  // fgd: the paper's typical pods (95 % of the pods); ours-trace: the trace's whole distribution.
  if (name == "fgd") po.shapes = typical;
  if (name == "ours-trace") po.shapes = TypicalShapes(compiled, 1.0);
  if (name == "ours-trace") name = "ours";
  auto policy = MakePolicy(name, po);
  if (!policy.ok()) return policy.status();
  engine.SetPolicy(std::move(*policy));

  // The arrival sequence and, with departures, the times.
  struct Arrival {
    PodRequest pod;
    int64_t demand = 0;  // GPU milli it asks for, as in the trace
    int64_t creation = 0, deletion = -1;
  };
  std::vector<Arrival> arrivals;
  if (!o.departures) {
    auto order = ArrivalOrder(original, res.total_milli, o.target, rng);
    for (auto& p : order) arrivals.push_back({std::move(p), 0, 0, -1});
  } else {
    std::vector<const TracePod*> order;
    for (const auto& t : trace) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const TracePod* a, const TracePod* b) {
      return a->creation != b->creation ? a->creation < b->creation : a->request.name < b->request.name;
    });
    for (const auto* t : order) arrivals.push_back({t->request, 0, std::max<int64_t>(0, t->creation), t->deletion});
  }
  {
    std::vector<PodRequest> pods;
    pods.reserve(arrivals.size());
    for (auto& a : arrivals) {
      a.demand = int64_t{a.pod.num_gpus} * a.pod.gpu_milli;
      pods.push_back(std::move(a.pod));
    }
    std::vector<NodeSpec> none;
    ApplySharing(o.sharing, &none, &pods);
    for (size_t i = 0; i < arrivals.size(); ++i) arrivals[i].pod = std::move(pods[i]);
  }

  std::map<int, std::pair<double, int64_t>> buckets;
  int64_t arrived_milli = 0;
  const auto total = static_cast<double>(res.total_milli);
  auto log_placement = [&](const PodRequest& pod, const Placement* p, int64_t time) {
    if (!o.keep_log) return;
    LogEntry e;
    e.pod = pod.name;
    e.time = time;
    if (p != nullptr) {
      e.node = p->node;
      e.gpus = p->gpus;
      e.milli_each = p->gpus.empty() ? 0 : p->milli_each;
    }
    res.log.push_back(std::move(e));
  };

  if (!o.departures) {
    for (const auto& a : arrivals) {
      ++res.arrived;
      ++res.arrived_by_shape[ShapeClass(a.pod)];
      arrived_milli += a.demand;
      auto p = engine.Schedule(a.pod);
      if (p.ok()) {
        ++res.placed;
        log_placement(a.pod, &*p, -1);
      } else if (p.status().code() == absl::StatusCode::kResourceExhausted) {
        ++res.failed;
        ++res.failed_by_shape[ShapeClass(a.pod)];
        log_placement(a.pod, nullptr, -1);
      } else {
        return p.status();
      }
      const double arrived_pct = 100.0 * static_cast<double>(arrived_milli) / total;
      const double alloc_pct = 100.0 * static_cast<double>(engine.cluster().AllocatedGpuMilli()) / total;
      auto& b = buckets[static_cast<int>(std::nearbyint(arrived_pct))];
      b.first += Round2(alloc_pct);
      ++b.second;
    }
    for (const auto& [x, b] : buckets) res.curve[x] = b.first / static_cast<double>(b.second);
  } else {
    // Events: departures before arrivals at the same second; a pod that does not fit waits and
    // is retried (in arrival order) whenever something leaves, until its own deletion time.
    using Dep = std::pair<int64_t, size_t>;  // (time, arrival index)
    std::priority_queue<Dep, std::vector<Dep>, std::greater<Dep>> leaving;
    std::vector<size_t> waiting;
    std::vector<double> waits;
    int64_t last_t = arrivals.front().creation;
    double weighted = 0;
    const int64_t t0 = arrivals.front().creation;
    auto alloc_pct = [&] { return 100.0 * static_cast<double>(engine.cluster().AllocatedGpuMilli()) / total; };
    auto advance = [&](int64_t t) {
      if (t > last_t) {
        weighted += alloc_pct() * static_cast<double>(t - last_t);
        last_t = t;
      }
      res.timeline.emplace_back(t, alloc_pct());
    };
    auto try_place = [&](size_t i, int64_t now) -> absl::StatusOr<bool> {
      auto p = engine.Schedule(arrivals[i].pod);
      if (p.ok()) {
        ++res.placed;
        log_placement(arrivals[i].pod, &*p, now);
        if (arrivals[i].deletion > now)
          leaving.emplace(arrivals[i].deletion, i);
        else if (arrivals[i].deletion >= 0)
          leaving.emplace(now, i);
        return true;
      }
      if (p.status().code() != absl::StatusCode::kResourceExhausted) return p.status();
      return false;
    };
    auto retry_waiting = [&](int64_t now) -> absl::Status {
      std::vector<size_t> still;
      std::vector<Shape> failed_shapes;
      for (size_t i : waiting) {
        const auto& a = arrivals[i];
        if (a.deletion >= 0 && a.deletion <= now) {
          ++res.never_placed;
          continue;
        }
        auto req = engine.cluster().Compile(a.pod);
        if (!req.ok()) return req.status();
        const Shape s = ShapeOf(*req);
        if (std::find(failed_shapes.begin(), failed_shapes.end(), s) != failed_shapes.end()) {
          still.push_back(i);
          continue;
        }
        auto placed = try_place(i, now);
        if (!placed.ok()) return placed.status();
        if (*placed) {
          waits.push_back(static_cast<double>(now - a.creation));
        } else {
          failed_shapes.push_back(s);
          still.push_back(i);
        }
      }
      waiting = std::move(still);
      return absl::OkStatus();
    };
    auto depart_until = [&](int64_t t) -> absl::Status {
      while (!leaving.empty() && leaving.top().first <= t) {
        const int64_t now = leaving.top().first;
        while (!leaving.empty() && leaving.top().first == now) {
          auto st = engine.Release(arrivals[leaving.top().second].pod.name);
          if (!st.ok()) return st;
          leaving.pop();
        }
        advance(now);
        if (!waiting.empty()) {
          auto st = retry_waiting(now);
          if (!st.ok()) return st;
          advance(now);
        }
      }
      return absl::OkStatus();
    };
    for (size_t i = 0; i < arrivals.size(); ++i) {
      const auto& a = arrivals[i];
      auto st = depart_until(a.creation);
      if (!st.ok()) return st;
      ++res.arrived;
      ++res.arrived_by_shape[ShapeClass(a.pod)];
      auto placed = try_place(i, a.creation);
      if (!placed.ok()) return placed.status();
      if (*placed) {
        waits.push_back(0);
      } else {
        ++res.waited;
        ++res.failed_by_shape[ShapeClass(a.pod)];
        waiting.push_back(i);
      }
      advance(a.creation);
    }
    const int64_t t_end = last_t;
    res.mean_alloc = t_end > t0 ? weighted / static_cast<double>(t_end - t0) : alloc_pct();
    auto st = depart_until(INT64_MAX);
    if (!st.ok()) return st;
    res.never_placed += static_cast<int64_t>(waiting.size());
    res.failed = res.never_placed;
    std::sort(waits.begin(), waits.end());
    if (!waits.empty()) {
      auto pct = [&](double q) {
        auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(waits.size())));
        return waits[std::clamp<size_t>(rank, 1, waits.size()) - 1];
      };
      res.pending_p50 = pct(0.5);
      res.pending_p99 = pct(0.99);
      res.pending_max = waits.back();
      double sum = 0;
      for (double w : waits) sum += w;
      res.pending_mean = sum / static_cast<double>(waits.size());
    }
    // About 200 points for the picture.
    if (res.timeline.size() > 400) {
      std::vector<std::pair<int64_t, double>> thin;
      const size_t step = res.timeline.size() / 200;
      for (size_t i = 0; i < res.timeline.size(); i += step) thin.push_back(res.timeline[i]);
      thin.push_back(res.timeline.back());
      res.timeline = std::move(thin);
    }
  }

  res.final_alloc = 100.0 * static_cast<double>(engine.cluster().AllocatedGpuMilli()) / total;
  FragModel frag;
  frag.SetShapes(typical);
  for (const auto& n : engine.cluster().nodes()) {
    if (n.active) res.frag_milli += frag.NodeFrag(n);
  }
  res.idle_milli = static_cast<double>(engine.cluster().TotalGpuMilli() - engine.cluster().AllocatedGpuMilli());
  return res;
}

}  // namespace kgpu::sched
