#pragma once
// Small string helpers: Cat() concatenates strings and numbers, Join() joins a range.
// (Debian's abseil is built with its own absl::string_view, so absl::StrCat does not take
// std::string_view; these do.)
//
// Thread-safety: pure functions.

#include <concepts>
#include <string>
#include <string_view>

namespace kgpu {

namespace internal {
// Any string-like type (std::string, std::string_view, absl::string_view).
template <typename T>
  requires requires(const T& t) {
    t.data();
    t.size();
  }
void Append(std::string& out, const T& s) {
  out.append(s.data(), s.size());
}
inline void Append(std::string& out, const char* s) { out.append(s); }
inline void Append(std::string& out, char c) { out.push_back(c); }
template <typename T>
  requires(std::integral<T> && !std::same_as<T, char> && !std::same_as<T, bool>)
void Append(std::string& out, T v) {
  out.append(std::to_string(v));
}
inline void Append(std::string& out, bool v) { out.append(v ? "true" : "false"); }
}  // namespace internal

template <typename... A>
std::string Cat(const A&... parts) {
  std::string out;
  (internal::Append(out, parts), ...);
  return out;
}

template <typename Range>
std::string Join(const Range& items, std::string_view sep) {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out.append(sep);
    first = false;
    internal::Append(out, item);
  }
  return out;
}

}  // namespace kgpu
