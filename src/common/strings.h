#pragma once
// Small string helpers: Cat() concatenates strings and numbers, Join() joins a range, Printable()
// escapes what a terminal must not receive raw, Nearest() finds the closest known name.
// (Debian's abseil is built with its own absl::string_view, so absl::StrCat does not take
// std::string_view; these do.)
//
// Thread-safety: pure functions.

#include <algorithm>
#include <concepts>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

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
inline void Append(std::string& out, const char* s) {
  out.append(s);
}
inline void Append(std::string& out, char c) {
  out.push_back(c);
}
template <typename T>
requires(std::integral<T> && !std::same_as<T, char> && !std::same_as<T, bool>) void Append(std::string& out, T v) {
  out.append(std::to_string(v));
}
inline void Append(std::string& out, bool v) {
  out.append(v ? "true" : "false");
}
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

// `text` with every byte that is not printable escaped: control characters (NUL, ESC, ...) and
// DEL as \xNN (\n, \r and \t as such), bytes that are not part of valid UTF-8 as \xNN. Input
// echoed in a message (a key, a value, a file name) goes through this, so a binary file cannot
// write raw bytes to an operator's terminal.
inline std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto hex = [&](unsigned char c) {
    char buf[5];
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    out += buf;
  };
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == '\r' || c == '\t') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
      ++i;
      continue;
    }
    if (c < 0x20 || c == 0x7F) {
      hex(c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: lead byte, then 1-3 continuation bytes; no overlong forms or surrogates.
    const size_t len = (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    bool valid = len != 0 && i + len <= text.size();
    for (size_t k = 1; valid && k < len; ++k) valid = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (valid && len >= 3) {
      const auto c1 = static_cast<unsigned char>(text[i + 1]);
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
          (c == 0xF4 && c1 > 0x8F)) {
        valid = false;
      }
    }
    if (!valid) {
      hex(c);
      ++i;
      continue;
    }
    out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

// Levenshtein distance (insertions, deletions, substitutions), for "did you mean" suggestions.
inline size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The candidate closest to `name` by edit distance (the first of equals), or "" when none is within
// `max_distance` edits.
template <typename Range>
std::string Nearest(std::string_view name, const Range& candidates, size_t max_distance) {
  std::string best;
  size_t best_distance = max_distance + 1;
  for (const auto& c : candidates) {
    const std::string_view candidate(c);
    // The length difference bounds the distance from below: skip what cannot win.
    const size_t gap = name.size() > candidate.size() ? name.size() - candidate.size() : candidate.size() - name.size();
    if (gap >= best_distance) continue;
    const size_t d = EditDistance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = std::string(candidate);
    }
  }
  return best;
}

}  // namespace kgpu
