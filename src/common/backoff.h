#pragma once
// The one retry delay of kgpu: exponential backoff from an initial delay, doubled after every
// failure up to a cap, each wait stretched by a random jitter so that many clients retrying the
// same server spread out (as client-go's wait.Backoff does). And the Retry-After rule for HTTP
// answers (RFC 9110 §10.2.3: delay-seconds; kgpu does not honour the HTTP-date form).
//
// Thread-safety: a Backoff is used by one thread (each retry loop owns its own).

#include <algorithm>
#include <charconv>
#include <chrono>
#include <optional>
#include <random>
#include <string_view>

namespace kgpu {

class Backoff {
 public:
  // `jitter`: each wait is the current delay times a uniform factor in [1, 1 + jitter].
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds cap, double jitter = 0)
      : initial_(initial), cap_(std::max(cap, initial)), jitter_(jitter), current_(initial) {}

  // The wait before the next try; the delay after it doubles (up to the cap).
  std::chrono::milliseconds Next() {
    const std::chrono::milliseconds wait = Jittered(current_);
    current_ = std::min(current_ * 2, cap_);
    return wait;
  }
  // The delay the next Next() starts from (without jitter): what a log line can promise.
  std::chrono::milliseconds current() const { return current_; }
  // After a success: the next failure waits the initial delay again.
  void Reset() { current_ = initial_; }

 private:
  std::chrono::milliseconds Jittered(std::chrono::milliseconds d) const {
    if (jitter_ <= 0) return d;
    thread_local std::mt19937 rng{std::random_device{}()};
    std::uniform_real_distribution<double> factor(1.0, 1.0 + jitter_);
    return std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(d.count()) * factor(rng)));
  }

  std::chrono::milliseconds initial_, cap_;
  double jitter_;
  std::chrono::milliseconds current_;
};

// The wait a Retry-After header asks for, in whole seconds, at most `max`; nullopt when the header
// is absent, an HTTP-date or not a number (the caller then uses its own backoff).
inline std::optional<std::chrono::milliseconds> RetryAfter(std::string_view header, std::chrono::seconds max) {
  while (!header.empty() && header.front() == ' ') header.remove_prefix(1);
  while (!header.empty() && header.back() == ' ') header.remove_suffix(1);
  long long seconds = 0;
  const auto [end, ec] = std::from_chars(header.data(), header.data() + header.size(), seconds);
  if (header.empty() || ec != std::errc() || end != header.data() + header.size() || seconds < 0) return std::nullopt;
  return std::chrono::milliseconds(std::min<long long>(seconds, max.count()) * 1000);
}

}  // namespace kgpu
