#pragma once
// Helpers for strict YAML config parsers: every error names the input and the position,
// "<origin>:<line>:<column>: <what is wrong>", unknown keys are errors, and scalars convert with
// a message that names the expected type and range instead of an exception. Messages are escaped
// (Printable), so a binary file cannot put raw control bytes on a terminal.
//
// Thread-safety: pure functions.

#include <cctype>
#include <charconv>
#include <concepts>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/strings.h"

namespace kgpu::yaml {

absl::Status At(std::string_view origin, const YAML::Mark& mark, std::string_view what);
// "<origin>:<line>:<column>" of a node (for errors found after parsing, e.g. against the node's GPUs).
std::string Position(std::string_view origin, const YAML::Mark& mark);

// Fails on any key of `map` not in `allowed`; `where` names the mapping in the message.
absl::Status CheckKeys(std::string_view origin, const YAML::Node& map, std::string_view where,
                       const std::set<std::string>& allowed);

// An integer scalar within [min, max]. Errors name the expected type and range and echo the
// value: "<what> must be an integer from 2 to 1024 (got 'four')".
template <typename T>
requires std::integral<T> absl::StatusOr<T> ScalarIn(std::string_view origin, const YAML::Node& node,
                                                     std::string_view what, T min, T max) {
  const std::string range = Cat("an integer from ", min, " to ", max);
  if (!node.IsScalar()) return At(origin, node.Mark(), Cat(what, " must be ", range, ", not a list or a mapping"));
  const std::string& text = node.Scalar();
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  const bool negative = begin != end && *begin == '-';
  if (begin != end && (*begin == '+' || (negative && std::is_unsigned_v<T>))) ++begin;
  // YAML's integers: decimal, 0x hexadecimal, 0o octal. "1e3", "4.0" and "four" are not integers.
  int base = 10;
  if (end - begin > 2 && begin[0] == '0' && (begin[1] == 'x' || begin[1] == 'X' || begin[1] == 'o')) {
    base = begin[1] == 'o' ? 8 : 16;
    begin += 2;
  }
  using Wide = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
  Wide v = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, v, base);
  const bool digits = begin != end && ptr == end && *begin != '-' && *begin != '+';
  const bool parsed = digits || (std::is_signed_v<T> && negative && ptr == end && ptr != begin + 1);
  if (!parsed || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return At(origin, node.Mark(), Cat(what, " must be ", range, " (got '", text, "')"));
  }
  if (ec == std::errc::result_out_of_range || (negative && std::is_unsigned_v<T> && v != 0) ||
      v < static_cast<Wide>(min) || v > static_cast<Wide>(max)) {
    return At(origin, node.Mark(), Cat(what, " must be ", range, " (got ", text, ", out of range)"));
  }
  return static_cast<T>(v);
}

// A scalar of type T. Errors name the expected type (and an integer's range).
template <typename T>
absl::StatusOr<T> Scalar(std::string_view origin, const YAML::Node& node, std::string_view what) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!node.IsScalar()) return At(origin, node.Mark(), Cat(what, " must be true or false, not a list or a mapping"));
    try {
      return node.as<bool>();
    } catch (const YAML::Exception&) {
      return At(origin, node.Mark(), Cat(what, " must be true or false (got '", node.Scalar(), "')"));
    }
  } else if constexpr (std::is_integral_v<T>) {
    return ScalarIn<T>(origin, node, what, std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
  } else {
    if (!node.IsScalar()) return At(origin, node.Mark(), Cat(what, " must be a single value, not a list or a mapping"));
    try {
      return node.as<T>();
    } catch (const YAML::Exception&) {
      return At(origin, node.Mark(), Cat(what, " has an invalid value '", node.Scalar(), "'"));
    }
  }
}

// Loads a document; syntax errors come back positioned.
absl::StatusOr<YAML::Node> Load(std::string_view text, std::string_view origin);

}  // namespace kgpu::yaml
