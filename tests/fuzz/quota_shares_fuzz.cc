// Fuzz target for `kgpu quota plan --shares` (src/extender/quota.cc ParseTeamShares) and the plan's
// division. Properties: it never crashes; every error names the flag; accepted percentages add up
// to at most 100, and the parts of any total never add up to more than the total.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "extender/quota.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kgpu::extender;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto teams = ParseTeamShares(text);
  if (!teams.ok()) {
    if (std::string(teams.status().message()).rfind("--shares: ", 0) != 0) std::abort();
    return 0;
  }
  std::vector<int> pct;
  int sum = 0;
  for (const auto& t : *teams) {
    if (t.ns.empty() || t.percent < 0 || t.percent > 100) std::abort();
    pct.push_back(t.percent);
    sum += t.percent;
  }
  if (sum > 100) std::abort();
  for (int64_t total :
       {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{163840}, size > 0 ? int64_t{data[0]} * 1000003 : 3}) {
    int64_t given = 0;
    for (int64_t p : DivideByPercent(total, pct)) given += p;
    if (given > total || given != total / 100 * sum + (total % 100) * sum / 100) std::abort();
  }
  return 0;
}
