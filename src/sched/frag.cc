#include "sched/frag.h"

#include <algorithm>
#include <array>
#include <map>

namespace kgpu::sched {

namespace {
constexpr size_t kMemoGpus = 8;         // nodes with more GPUs are evaluated without the memo
constexpr size_t kMemoLimit = 1 << 22;  // entries; the memo restarts beyond this
}  // namespace

Shape ShapeOf(const Request& req) {
  Shape s;
  s.cpu = req.cpu;
  s.models = req.models;
  if (!req.CpuOnly() && !req.Mig()) {
    s.num_gpus = req.num_gpus;
    s.milli = req.milli;
  }
  return s;
}

namespace {
// Count order, then (as the paper's simulator sorts its typical pods) the larger CPU, per-GPU
// milli, GPU count and model constraint first (no constraint last), so the result never depends
// on hashing.
bool ByCountThenShape(const Shape& a, const Shape& b) {
  if (a.weight != b.weight) return a.weight > b.weight;
  if (a.cpu != b.cpu) return a.cpu > b.cpu;
  if (a.milli != b.milli) return a.milli > b.milli;
  if (a.num_gpus != b.num_gpus) return a.num_gpus > b.num_gpus;
  const uint64_t ma = a.models == ~uint64_t{0} ? 0 : a.models, mb = b.models == ~uint64_t{0} ? 0 : b.models;
  return ma > mb;
}

std::vector<Shape> Cover(std::vector<Shape> all, double coverage, size_t max_shapes) {
  std::sort(all.begin(), all.end(), ByCountThenShape);
  double total = 0;
  for (const auto& s : all) total += s.weight;
  if (total <= 0) return {};
  std::vector<Shape> out;
  double covered = 0;
  for (const auto& s : all) {
    if (covered >= coverage * total || out.size() >= max_shapes) break;
    out.push_back(s);
    covered += s.weight;
  }
  for (auto& s : out) s.weight /= covered;
  return out;
}
}  // namespace

std::vector<Shape> TypicalShapes(const std::vector<Request>& pods, double coverage) {
  absl::flat_hash_map<Shape, double> counts;
  for (const auto& p : pods) counts[ShapeOf(p)] += 1;
  std::vector<Shape> all;
  all.reserve(counts.size());
  for (const auto& [shape, c] : counts) {
    Shape s = shape;
    s.weight = c;
    all.push_back(s);
  }
  return Cover(std::move(all), coverage, all.size());
}

void FragModel::SetShapes(std::vector<Shape> shapes) {
  shapes_ = std::move(shapes);
  cpu_thresholds_.clear();
  for (const auto& s : shapes_) {
    if (s.num_gpus > 0) cpu_thresholds_.push_back(s.cpu);
  }
  std::sort(cpu_thresholds_.begin(), cpu_thresholds_.end());
  cpu_thresholds_.erase(std::unique(cpu_thresholds_.begin(), cpu_thresholds_.end()), cpu_thresholds_.end());
  memo_.clear();
  ++epoch_;
}

double FragModel::Compute(const NodeState& node, int64_t cpu_free, const int* free) const {
  const size_t n = node.gpus.size();
  int64_t total = 0;
  for (size_t g = 0; g < n; ++g) total += free[g];
  if (total == 0) return 0;
  double f = 0;
  for (const auto& s : shapes_) {
    if (s.num_gpus == 0) {
      f += s.weight * static_cast<double>(total);
      continue;
    }
    int fit = 0;
    int64_t usable = 0;
    for (size_t g = 0; g < n; ++g) {
      const auto& gpu = node.gpus[g];
      if (gpu.IsMig() || !gpu.healthy || ((s.models >> gpu.model) & 1U) == 0) continue;
      if (free[g] >= s.milli) {
        ++fit;
        usable += free[g];
      }
    }
    if (fit >= s.num_gpus && cpu_free >= s.cpu) {
      f += s.weight * static_cast<double>(total - usable);
    } else {
      f += s.weight * static_cast<double>(total);
    }
  }
  return f;
}

double FragModel::NodeFragAfter(const NodeState& node, int64_t cpu, const int* take) {
  const size_t n = node.gpus.size();
  std::array<int, kMemoGpus> small{};
  std::vector<int> big;
  int* free = small.data();
  if (n > kMemoGpus) {
    big.resize(n);
    free = big.data();
  }
  bool memo = n <= kMemoGpus && node.model >= 0 && cpu_thresholds_.size() < 256;
  for (size_t g = 0; g < n; ++g) {
    const auto& gpu = node.gpus[g];
    free[g] = gpu.healthy ? gpu.free_milli - (take != nullptr ? take[g] : 0) : 0;
    memo = memo && !gpu.IsMig();
  }
  const int64_t cpu_free = node.cpu_free - cpu;
  if (!memo) return Compute(node, cpu_free, free);

  // Sorted high to low (insertion sort: at most 8 values).
  std::array<int, kMemoGpus> sorted{};
  const size_t m = std::min(n, kMemoGpus);
  for (size_t i = 0; i < m; ++i) {
    size_t j = i;
    while (j > 0 && sorted[j - 1] < free[i]) {
      sorted[j] = sorted[j - 1];
      --j;
    }
    sorted[j] = free[i];
  }
  const auto bucket = static_cast<uint64_t>(std::upper_bound(cpu_thresholds_.begin(), cpu_thresholds_.end(), cpu_free) -
                                            cpu_thresholds_.begin());
  uint64_t k0 = static_cast<uint64_t>(node.model) | (bucket << 6) | (uint64_t{n} << 14) |
                (static_cast<uint64_t>(sorted[6]) << 18) | (static_cast<uint64_t>(sorted[7]) << 28);
  uint64_t k1 = 0;
  for (size_t i = 0; i < 6; ++i) k1 |= static_cast<uint64_t>(sorted[i]) << (10 * i);
  // A negative CPU left cannot be bucketed apart from "fits nothing": keep it out of the memo.
  if (cpu_free < 0) return Compute(node, cpu_free, free);
  auto key = std::make_pair(k0, k1);
  if (auto it = memo_.find(key); it != memo_.end()) return it->second;
  const double f = Compute(node, cpu_free, free);
  if (memo_.size() >= kMemoLimit) memo_.clear();
  memo_.emplace(key, f);
  return f;
}

double FragModel::NodeFrag(const NodeState& node) {
  return NodeFragAfter(node, 0, nullptr);
}

void ShapeEstimator::Observe(const Shape& s) {
  ++observed_;
  weights_[s] += scale_;
  scale_ /= decay_;
  if (scale_ > 1e100) {  // renormalise long before doubles overflow
    for (auto& [shape, w] : weights_) w /= scale_;
    scale_ = 1.0;
  }
}

std::vector<Shape> ShapeEstimator::Snapshot() const {
  std::vector<Shape> all;
  all.reserve(weights_.size());
  for (const auto& [shape, w] : weights_) {
    Shape s = shape;
    s.weight = w;
    all.push_back(s);
  }
  return Cover(std::move(all), coverage_, max_shapes_);
}

}  // namespace kgpu::sched
