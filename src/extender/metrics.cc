#include "extender/metrics.h"

namespace kgpu::extender {
namespace {

prom::Labels ToLabels(const std::map<std::string, std::string>& labels) {
  return {labels.begin(), labels.end()};
}

}  // namespace

Metrics::Metrics() {
  using T = prom::MetricsRegistry::Type;
  registry_.Declare("kgpu_extender_request_duration_seconds", T::kHistogram, "Time to answer one extender verb.",
                    {kBuckets.begin(), kBuckets.end()});
  const std::pair<const char*, const char*> counters[] = {
      {"kgpu_extender_requests_total", "Extender requests answered, by verb and HTTP code."},
      {"kgpu_extender_filter_nodes_total",
       "Filter verdicts per node: passed, failed (preemption may help), unresolvable."},
      {"kgpu_extender_filter_reasons_total", "Nodes failed by filter, by reason category."},
      {"kgpu_extender_binds_total", "Bind results: bound, already_bound, failed."},
      {"kgpu_extender_failures_total", "Verb requests that failed, by reason."},
      {"kgpu_extender_preempt_nodes_total", "Preempt candidates: kept (their victims make the pod fit) or dropped."},
      {"kgpu_extender_preemptions_total",
       "The extender's own preemptions (shortfalls kube-scheduler cannot see): started, or blocked (an eviction "
       "refused)."},
      {"kgpu_extender_preemption_victims_total", "Pods evicted by the extender's own preemptions."},
  };
  for (const auto& [name, help] : counters) registry_.Declare(name, T::kCounter, help);
}

void Metrics::Observe(const std::string& verb, double seconds) {
  registry_.Observe("kgpu_extender_request_duration_seconds", {{"verb", verb}}, seconds);
}

void Metrics::Count(const std::string& family, const std::map<std::string, std::string>& labels, uint64_t n) {
  registry_.Add(family, ToLabels(labels), static_cast<double>(n));
}

uint64_t Metrics::Get(const std::string& family, const std::map<std::string, std::string>& labels) const {
  return static_cast<uint64_t>(registry_.Get(family, ToLabels(labels)));
}

void Metrics::Set(const std::string& name, bool counter, const std::string& help, double value) {
  registry_.Declare(name, counter ? prom::MetricsRegistry::Type::kCounter : prom::MetricsRegistry::Type::kGauge, help);
  registry_.Set(name, value);
}

}  // namespace kgpu::extender
