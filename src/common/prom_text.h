#pragma once
// The Prometheus text exposition format (version 0.0.4), written once for every /metrics kgpu
// serves: label-value and HELP escaping, number formatting, and a small registry of counters,
// gauges and histograms for the control-plane daemons (extender, Slurm bridge).
//
// Debian 12's prometheus-cpp (1.0.1) would do the registry too, but its text serializer prints
// doubles with 17 significant digits ("0.10000000000000001"), it would be one more shared library
// loaded by every kgpu command, and these daemons keep a few dozen series: the writer below is
// ~150 lines, shortest round-trip numbers, and `promtool check metrics`-clean. The dcgm-exporter
// page keeps its own pre-encoded buffer (a measured speed choice) but escapes through this file.
//
// Thread-safety: the free functions are pure; MetricsRegistry may be used from any thread.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kgpu::prom {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Appends `v` escaped as a label value: backslash, double quote and newline.
void AppendLabelValue(std::string& out, std::string_view v);
// `{k="v",...}` (empty when there are no labels), values escaped, in the order given.
std::string FormatLabels(const Labels& labels);
// A sample value as Prometheus parses it: integers without a fraction, other values in the
// shortest form that reads back to the same double, +Inf, -Inf, NaN.
std::string FormatNumber(double v);
// `# HELP name help` and `# TYPE name type` lines (HELP's backslashes and newlines escaped).
void AppendHeader(std::string& out, std::string_view name, std::string_view type, std::string_view help);

class MetricsRegistry {
 public:
  enum class Type { kCounter, kGauge, kHistogram };
  // Declares a family before its first sample: its type, HELP, and for a histogram its upper
  // bounds. Every declared family is written with HELP and TYPE, even before it has a sample.
  void Declare(const std::string& name, Type type, const std::string& help, std::vector<double> buckets = {});
  // Adds to a counter (or a gauge). An undeclared family is a programming error: it is written as
  // untyped with a HELP saying so, so promtool and the tests notice.
  void Add(const std::string& name, const Labels& labels = {}, double n = 1);
  void Set(const std::string& name, const Labels& labels, double v);
  void Set(const std::string& name, double v) { Set(name, {}, v); }
  void Observe(const std::string& name, const Labels& labels, double v);
  // A counter's or gauge's value (0 when the series does not exist).
  double Get(const std::string& name, const Labels& labels = {}) const;
  // The whole page, families in name order, series in label order.
  std::string Text() const;

 private:
  struct Histogram {
    std::vector<uint64_t> counts;  // per bucket, cumulative at write time
    uint64_t count = 0;
    double sum = 0;
  };
  struct Family {
    Type type = Type::kGauge;
    std::string help;
    bool declared = false;
    std::vector<double> buckets;
    std::map<Labels, double> values;
    std::map<Labels, Histogram> histograms;
  };
  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

}  // namespace kgpu::prom
