#include "extender/quota.h"

#include <algorithm>
#include <cctype>
#include <numeric>
#include <set>

#include "api/names.h"
#include "common/strings.h"
#include "extender/request.h"

namespace kgpu::extender {
namespace {

std::string_view Unprefixed(std::string_view r) {
  for (std::string_view p : {"requests.", "limits."}) {
    if (r.substr(0, p.size()) == p) return r.substr(p.size());
  }
  return r;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

bool IsDnsLabel(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-'))
      return false;
  }
  return s.front() != '-' && s.back() != '-';
}

int MaxMigSlices(const GpuInfo& gpu) {
  return ModelMatches("A30", gpu.model) ? 4 : 7;
}

ClusterGpus SummarizeInventory(const std::vector<NodeInfo>& nodes) {
  ClusterGpus c;
  for (const auto& n : nodes) {
    ++c.nodes;
    for (const auto& g : n.gpus) {
      if (!g.healthy) {
        ++c.unhealthy;
        continue;
      }
      if (g.slots > 0) {
        ++c.share_gpus;
        c.share_slots += g.slots;
        c.share_memory_mib += g.memory_mib;
        c.share_cores += 100;
        if (c.share_ref_mib == 0 || g.memory_mib < c.share_ref_mib) {
          c.share_ref_mib = g.memory_mib;
          c.share_ref_model = g.model;
          c.share_ref_node = n.name;
        }
      } else if (!g.mig.empty()) {
        const int slices = MaxMigSlices(g);
        for (const auto& m : g.mig) {
          const std::string p = api::MigResourceProfile(m.profile);  // as nvidia.com/mig-<p> names it
          ++c.mig[p];
          auto [it, added] = c.mig_slices.emplace(p, slices);
          if (!added) it->second = std::min(it->second, slices);
        }
      } else {
        ++c.whole;
      }
    }
  }
  std::set<std::string> models;
  for (const auto& n : nodes) {
    for (const auto& g : n.gpus) {
      if (g.healthy && g.slots > 0) models.insert(g.model);
    }
  }
  c.share_models = static_cast<int>(models.size());
  return c;
}

int MigSlicesOf(const ClusterGpus& c, const std::string& profile) {
  const auto it = c.mig_slices.find(profile);
  return it != c.mig_slices.end() ? it->second : 7;
}

bool IsGpuResource(std::string_view resource) {
  const std::string_view r = Unprefixed(resource);
  return r == kWholeGpu || r.substr(0, std::string_view(kMigPrefix).size()) == kMigPrefix || r == kShares ||
         r == kShareMemory || r == kShareCores;
}

std::optional<double> GpuEquivalents(std::string_view resource, int64_t amount, const ClusterGpus& c) {
  const std::string_view r = Unprefixed(resource);
  if (r == kWholeGpu) return static_cast<double>(amount);
  if (r.substr(0, std::string_view(kMigPrefix).size()) == kMigPrefix) {
    const std::string profile(r.substr(std::string_view(kMigPrefix).size()));
    const int slices = MigSlices(profile);
    if (slices == 0) return std::nullopt;
    return static_cast<double>(amount) * slices / MigSlicesOf(c, profile);
  }
  if (r == kShareMemory) {
    if (c.share_ref_mib <= 0) return std::nullopt;
    return static_cast<double>(amount) / static_cast<double>(c.share_ref_mib);
  }
  return std::nullopt;
}

double CapacityGpuEquivalents(const ClusterGpus& c) {
  double total = c.whole;
  for (const auto& [profile, n] : c.mig) total += GpuEquivalents(Cat(kMigPrefix, profile), n, c).value_or(0);
  // Share memory by the same rule as a quota's (a sharing GPU larger than the reference counts
  // for more than one), so a quota holding all of it equals the capacity.
  return total + GpuEquivalents(kShareMemory, c.share_memory_mib, c).value_or(0);
}

absl::StatusOr<std::vector<TeamShare>> ParseTeamShares(std::string_view text, std::string_view flag) {
  std::vector<TeamShare> out;
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(Cat(flag, ": ", what)); };
  if (Trim(text).empty()) return bad("empty; list NAMESPACE=PERCENT pairs, e.g. team-a=50,team-b=30,team-c=20");
  std::set<std::string> seen;
  int sum = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = Trim(text.substr(start, end - start));
    start = end + 1;
    if (item.empty()) return bad(Cat("an empty item in '", Printable(std::string(text)), "' (remove the extra comma)"));
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return bad(Cat("'", Printable(std::string(item)), "' is not NAMESPACE=PERCENT (write e.g. team-a=50)"));
    }
    const std::string ns(Trim(item.substr(0, eq)));
    std::string_view pct = Trim(item.substr(eq + 1));
    if (!IsDnsLabel(ns)) {
      return bad(
          Cat("'", Printable(ns), "' in '", Printable(std::string(item)),
              "' is not a namespace name (lowercase letters, digits and '-', at most 63 characters, e.g. team-a)"));
    }
    if (!pct.empty() && pct.back() == '%') pct.remove_suffix(1);
    int p = -1;
    if (!pct.empty() && pct.size() <= 3 &&
        std::all_of(pct.begin(), pct.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      p = std::stoi(std::string(pct));
    }
    if (p < 0 || p > 100) {
      return bad(Cat("'", Printable(std::string(item)), "': the percent must be a whole number from 0 to 100 (e.g. ",
                     ns, "=50)"));
    }
    if (!seen.insert(ns).second) return bad(Cat(ns, " is named twice (give each namespace once)"));
    sum += p;
    out.push_back({ns, p});
  }
  if (sum > 100) {
    std::vector<std::string> parts;
    for (const auto& t : out) parts.push_back(Cat(t.ns, "=", t.percent));
    return bad(Cat("the percentages add up to ", sum, " (", Join(parts, " + "),
                   "); they must add up to at most 100 (lower some of them)"));
  }
  return out;
}

std::vector<int64_t> DivideByPercent(int64_t total, const std::vector<int>& percents) {
  std::vector<int64_t> parts(percents.size(), 0);
  if (total <= 0 || percents.empty()) return parts;
  int64_t sum_pct = 0;
  for (int p : percents) sum_pct += std::clamp(p, 0, 100);
  sum_pct = std::min<int64_t>(sum_pct, 100);
  // total * p / 100 as quotient and remainder without overflow: total = q * 100 + r.
  const int64_t q = total / 100, r = total % 100;
  int64_t given = 0;
  std::vector<int64_t> rem(percents.size());
  for (size_t i = 0; i < percents.size(); ++i) {
    const int64_t p = std::clamp(percents[i], 0, 100);
    parts[i] = q * p + (r * p) / 100;
    rem[i] = (r * p) % 100;
    given += parts[i];
  }
  const int64_t target = q * sum_pct + (r * sum_pct) / 100;
  std::vector<size_t> order(percents.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (rem[a] != rem[b]) return rem[a] > rem[b];
    return percents[a] > percents[b];
  });
  for (size_t k = 0; given < target && k < order.size(); ++k) {
    if (rem[order[k]] == 0) break;  // an exact part never gets more than its share
    ++parts[order[k]];
    ++given;
  }
  return parts;
}

std::vector<PlannedQuota> PlanQuotas(const ClusterGpus& c, const std::vector<TeamShare>& teams) {
  std::vector<int> pct;
  for (const auto& t : teams) pct.push_back(t.percent);
  std::vector<std::pair<std::string, int64_t>> totals = {{Cat("requests.", kWholeGpu), c.whole}};
  for (const auto& [profile, n] : c.mig) totals.emplace_back(Cat("requests.", kMigPrefix, profile), n);
  totals.emplace_back(Cat("requests.", kShares), c.share_slots);
  totals.emplace_back(Cat("requests.", kShareMemory), c.share_memory_mib);
  totals.emplace_back(Cat("requests.", kShareCores), c.share_cores);
  std::vector<PlannedQuota> out;
  for (const auto& t : teams) out.push_back({t.ns, t.percent, {}});
  for (const auto& [name, total] : totals) {
    const auto parts = DivideByPercent(total, pct);
    for (size_t i = 0; i < out.size(); ++i) out[i].hard.emplace_back(name, parts[i]);
  }
  return out;
}

}  // namespace kgpu::extender
