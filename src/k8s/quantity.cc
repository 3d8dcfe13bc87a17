#include "k8s/quantity.h"

#include <cctype>
#include <iterator>
#include <limits>

#include "common/strings.h"

namespace kgpu::k8s {

__extension__ typedef __int128 Int128;

std::optional<Quantity> Quantity::Parse(std::string_view s) {
  if (s.empty() || s.size() > 64) return std::nullopt;
  size_t i = 0;
  bool neg = false;
  if (s[i] == '+' || s[i] == '-') neg = s[i++] == '-';
  // Mantissa as an integer with a count of fraction digits.
  Int128 mant = 0;
  int frac_digits = 0;
  bool digits = false, dot = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits = true;
      if (mant > (static_cast<Int128>(1) << 100)) return std::nullopt;
      mant = mant * 10 + (c - '0');
      if (dot) ++frac_digits;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return std::nullopt;
  const std::string_view suffix = s.substr(i);
  int dec_exp = 0;  // power of ten
  int bin_exp = 0;  // power of 1024
  bool binary = false;
  if (suffix.empty()) {
  } else if (suffix == "m") {
    dec_exp = -3;
  } else if (suffix == "k") {
    dec_exp = 3;
  } else if (suffix == "M") {
    dec_exp = 6;
  } else if (suffix == "G") {
    dec_exp = 9;
  } else if (suffix == "T") {
    dec_exp = 12;
  } else if (suffix == "P") {
    dec_exp = 15;
  } else if (suffix == "E") {
    dec_exp = 18;
  } else if (suffix.size() == 2 && suffix[1] == 'i') {
    static constexpr std::string_view kBin = "KMGTPE";
    auto p = kBin.find(suffix[0]);
    if (p == std::string_view::npos) return std::nullopt;
    bin_exp = static_cast<int>(p) + 1;
    binary = true;
  } else if (suffix[0] == 'e' || suffix[0] == 'E') {
    int e = 0;
    size_t j = 1;
    bool eneg = false;
    if (j < suffix.size() && (suffix[j] == '+' || suffix[j] == '-')) eneg = suffix[j++] == '-';
    if (j >= suffix.size()) return std::nullopt;
    for (; j < suffix.size(); ++j) {
      if (!std::isdigit(static_cast<unsigned char>(suffix[j])) || e > 100) return std::nullopt;
      e = e * 10 + (suffix[j] - '0');
    }
    dec_exp = eneg ? -e : e;
  } else {
    return std::nullopt;
  }
  // value in milli = mant * 10^(dec_exp - frac_digits + 3) * 1024^bin_exp
  Int128 v = mant;
  for (int k = 0; k < bin_exp; ++k) v *= 1024;
  int e10 = dec_exp - frac_digits + 3;
  const Int128 kMax = std::numeric_limits<int64_t>::max();
  for (; e10 > 0; --e10) {
    v *= 10;
    if (v > kMax) return std::nullopt;
  }
  for (; e10 < 0; ++e10) {
    // Below a milli-unit rounds up, as the API rounds quantities to their scale.
    const bool rem = v % 10 != 0;
    v = v / 10 + (rem ? 1 : 0);
  }
  if (v > kMax) return std::nullopt;
  Quantity q;
  q.milli = static_cast<int64_t>(neg ? -v : v);
  q.binary = binary;
  return q;
}

std::string Quantity::Format() const {
  if (milli % 1000 != 0) return Cat(milli, "m");
  int64_t v = milli / 1000;
  if (binary && v != 0) {
    static constexpr std::string_view kBin[] = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
    int idx = -1;
    while (v % 1024 == 0 && idx < 5) {
      v /= 1024;
      ++idx;
    }
    return idx < 0 ? std::to_string(v) : Cat(v, kBin[idx]);
  }
  return std::to_string(v);
}

std::string Quantity::Canonical() const {
  if (milli % 1000 != 0) return Cat(milli, "m");  // nothing coarser keeps it whole
  int64_t v = milli / 1000;
  if (v == 0) return "0";
  if (binary && (v >= 1024 || v <= -1024)) return Format();
  static constexpr std::string_view kDec[] = {"", "k", "M", "G", "T", "P", "E"};
  size_t idx = 0;
  while (v % 1000 == 0 && idx + 1 < std::size(kDec)) {
    v /= 1000;
    ++idx;
  }
  return Cat(v, kDec[idx]);
}

}  // namespace kgpu::k8s
