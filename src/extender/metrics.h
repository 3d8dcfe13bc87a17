#pragma once
// The extender's own Prometheus metrics, written by hand in the text exposition format (Debian has
// no prometheus-cpp): a histogram per verb and counters with one label set each.
//
//   kgpu_extender_request_duration_seconds{verb}   histogram of each verb's handling time
//   kgpu_extender_requests_total{verb,code}        answered requests by HTTP code
//   kgpu_extender_filter_nodes_total{result}       filter verdicts: passed, failed, unresolvable
//   kgpu_extender_filter_reasons_total{reason}     failed nodes by reason category
//   kgpu_extender_binds_total{result}              bound, already_bound, failed
//   kgpu_extender_failures_total{verb,reason}      requests that failed, by reason
//   kgpu_extender_preempt_nodes_total{result}      kept, dropped
//
// Thread-safety: every method may be called from any thread.

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kgpu::extender {

class Metrics {
 public:
  void Observe(const std::string& verb, double seconds);
  void Count(const std::string& family, const std::map<std::string, std::string>& labels, uint64_t n = 1);
  uint64_t Get(const std::string& family, const std::map<std::string, std::string>& labels) const;
  // The exposition text; `extra` is appended (gauges computed by the caller).
  std::string Text(const std::string& extra = "") const;

  static constexpr std::array<double, 12> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.5,    1.0};

 private:
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> counts{};
    uint64_t count = 0;
    double sum = 0;
  };
  mutable std::mutex mu_;
  std::map<std::string, Histogram> histograms_;                                     // by verb
  std::map<std::string, std::map<std::map<std::string, std::string>, uint64_t>> counters_;  // family -> labels
};

// Escapes a label value (backslash, double quote, newline).
std::string EscapeLabel(const std::string& v);

}  // namespace kgpu::extender
