#include "common/duration.h"

#include <cmath>
#include <cstdint>
#include <limits>

namespace kgpu {
namespace {

// Nanoseconds per unit, longest unit names first where one is a prefix of another.
struct Unit {
  std::string_view name;
  double ns;
};
constexpr Unit kUnits[] = {{"ns", 1},   {"us", 1e3}, {"\xC2\xB5s", 1e3}, {"\xCE\xBCs", 1e3},
                           {"ms", 1e6}, {"s", 1e9},  {"m", 60e9},        {"h", 3600e9}};

}  // namespace

absl::StatusOr<std::chrono::nanoseconds> ParseGoDuration(std::string_view what, std::string_view text) {
  auto bad = [&](std::string_view why) {
    // (`what` empty: the caller names the flag itself, as CLI11 does before a validator's message.)
    return absl::InvalidArgumentError((what.empty() ? "" : std::string(what) + " ") + "'" + std::string(text) +
                                      "': " + std::string(why) + " (a duration such as 30s, 5m, 1h30m or 250ms)");
  };
  std::string_view s = text;
  bool negative = false;
  if (!s.empty() && (s.front() == '-' || s.front() == '+')) {
    negative = s.front() == '-';
    s.remove_prefix(1);
  }
  if (s == "0") return std::chrono::nanoseconds(0);
  if (s.empty()) return bad("empty");
  double total = 0;
  while (!s.empty()) {
    size_t i = 0;
    double value = 0, scale = 1;
    bool digits = false, dot = false;
    while (i < s.size() && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !dot))) {
      if (s[i] == '.') {
        dot = true;
      } else {
        digits = true;
        if (dot) {
          scale /= 10;
          value += (s[i] - '0') * scale;
        } else {
          value = value * 10 + (s[i] - '0');
        }
      }
      ++i;
    }
    if (!digits) return bad("expected a number");
    s.remove_prefix(i);
    const Unit* unit = nullptr;
    for (const Unit& u : kUnits) {
      if (s.substr(0, u.name.size()) == u.name && (unit == nullptr || u.name.size() > unit->name.size())) unit = &u;
    }
    if (unit == nullptr) return bad(s.empty() ? "missing unit" : "unknown unit");
    s.remove_prefix(unit->name.size());
    total += value * unit->ns;
  }
  if (total > static_cast<double>(std::numeric_limits<int64_t>::max())) return bad("out of range");
  const auto ns = static_cast<int64_t>(std::llround(total));
  return std::chrono::nanoseconds(negative ? -ns : ns);
}

std::string FormatGoDuration(std::chrono::nanoseconds d) {
  int64_t ns = d.count();
  if (ns == 0) return "0s";
  std::string out = ns < 0 ? "-" : "";
  if (ns < 0) ns = -ns;
  if (ns < 1000000000) {  // under a second: the largest unit that divides it
    if (ns % 1000000 == 0) return out + std::to_string(ns / 1000000) + "ms";
    if (ns % 1000 == 0) return out + std::to_string(ns / 1000) + "us";
    return out + std::to_string(ns) + "ns";
  }
  const int64_t h = ns / 3600000000000LL;
  ns %= 3600000000000LL;
  const int64_t m = ns / 60000000000LL;
  ns %= 60000000000LL;
  if (h > 0) out += std::to_string(h) + "h";
  if (h > 0 || m > 0) out += std::to_string(m) + "m";
  std::string sec = std::to_string(ns / 1000000000);
  if (const int64_t frac = ns % 1000000000; frac != 0) {
    std::string f = std::to_string(frac);
    f = std::string(9 - f.size(), '0') + f;
    while (!f.empty() && f.back() == '0') f.pop_back();
    sec += "." + f;
  }
  return out + sec + "s";
}

}  // namespace kgpu
