#pragma once
// The extender's own Prometheus metrics, on the control-plane daemons' one registry
// (common/prom_text.h): a histogram per verb and counters with one label set each.
//
//   kgpu_extender_request_duration_seconds{verb}   histogram of each verb's handling time
//   kgpu_extender_requests_total{verb,code}        answered requests by HTTP code
//   kgpu_extender_filter_nodes_total{result}       filter verdicts: passed, failed, unresolvable
//   kgpu_extender_filter_reasons_total{reason}     failed nodes by reason category
//   kgpu_extender_binds_total{result}              bound, already_bound, failed
//   kgpu_extender_failures_total{verb,reason}      requests that failed, by reason
//   kgpu_extender_preempt_nodes_total{result}      kept, dropped
//   and the gauges the server sets from its state at each scrape (server.cc).
//
// Thread-safety: every method may be called from any thread.

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "common/prom_text.h"

namespace kgpu::extender {

class Metrics {
 public:
  Metrics();
  void Observe(const std::string& verb, double seconds);
  void Count(const std::string& family, const std::map<std::string, std::string>& labels, uint64_t n = 1);
  uint64_t Get(const std::string& family, const std::map<std::string, std::string>& labels) const;
  // A value read from the server's state at a scrape: a gauge, or a counter the state keeps (every
  // such family is declared with its HELP in the constructor).
  void Set(const std::string& name, double value) { registry_.Set(name, value); }
  std::string Text() const { return registry_.Text(); }

  static constexpr std::array<double, 12> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.5,    1.0};

 private:
  prom::MetricsRegistry registry_;
};

}  // namespace kgpu::extender
