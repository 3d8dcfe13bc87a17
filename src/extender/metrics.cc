#include "extender/metrics.h"

#include <cstdio>

namespace kgpu::extender {
namespace {

const std::map<std::string, std::string>& Help() {
  static const std::map<std::string, std::string> help = {
      {"kgpu_extender_requests_total", "Extender requests answered, by verb and HTTP code."},
      {"kgpu_extender_filter_nodes_total", "Filter verdicts per node: passed, failed (preemption may help), unresolvable."},
      {"kgpu_extender_filter_reasons_total", "Nodes failed by filter, by reason category."},
      {"kgpu_extender_binds_total", "Bind results: bound, already_bound, failed."},
      {"kgpu_extender_failures_total", "Verb requests that failed, by reason."},
      {"kgpu_extender_preempt_nodes_total", "Preempt candidates: kept (their victims make the pod fit) or dropped."},
      {"kgpu_extender_preemptions_total",
       "The extender's own preemptions (shortfalls kube-scheduler cannot see): started, or blocked (an eviction refused)."},
      {"kgpu_extender_preemption_victims_total", "Pods evicted by the extender's own preemptions."},
  };
  return help;
}

std::string Labels(const std::map<std::string, std::string>& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ",";
    first = false;
    out += k + "=\"" + EscapeLabel(v) + "\"";
  }
  return out + "}";
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void Metrics::Observe(const std::string& verb, double seconds) {
  std::lock_guard lock(mu_);
  auto& h = histograms_[verb];
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) ++h.counts[i];
  }
  ++h.count;
  h.sum += seconds;
}

void Metrics::Count(const std::string& family, const std::map<std::string, std::string>& labels, uint64_t n) {
  std::lock_guard lock(mu_);
  counters_[family][labels] += n;
}

uint64_t Metrics::Get(const std::string& family, const std::map<std::string, std::string>& labels) const {
  std::lock_guard lock(mu_);
  const auto f = counters_.find(family);
  if (f == counters_.end()) return 0;
  const auto v = f->second.find(labels);
  return v == f->second.end() ? 0 : v->second;
}

std::string Metrics::Text(const std::string& extra) const {
  std::lock_guard lock(mu_);
  std::string out;
  out += "# HELP kgpu_extender_request_duration_seconds Time to answer one extender verb.\n";
  out += "# TYPE kgpu_extender_request_duration_seconds histogram\n";
  for (const auto& [verb, h] : histograms_) {
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      out += "kgpu_extender_request_duration_seconds_bucket{verb=\"" + EscapeLabel(verb) + "\",le=\"" + Num(kBuckets[i]) +
             "\"} " + std::to_string(h.counts[i]) + "\n";
    }
    out += "kgpu_extender_request_duration_seconds_bucket{verb=\"" + EscapeLabel(verb) + "\",le=\"+Inf\"} " +
           std::to_string(h.count) + "\n";
    out += "kgpu_extender_request_duration_seconds_sum{verb=\"" + EscapeLabel(verb) + "\"} " + Num(h.sum) + "\n";
    out += "kgpu_extender_request_duration_seconds_count{verb=\"" + EscapeLabel(verb) + "\"} " + std::to_string(h.count) + "\n";
  }
  for (const auto& [family, help] : Help()) {
    out += "# HELP " + family + " " + help + "\n# TYPE " + family + " counter\n";
    const auto f = counters_.find(family);
    if (f == counters_.end()) continue;
    for (const auto& [labels, v] : f->second) out += family + Labels(labels) + " " + std::to_string(v) + "\n";
  }
  return out + extra;
}

}  // namespace kgpu::extender
