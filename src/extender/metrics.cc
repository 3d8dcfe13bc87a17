#include "extender/metrics.h"

#include <tuple>

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
      {"kgpu_extender_binds_total",
       "Bind results: bound, already_bound, failed, forwarded (a standby's, passed on to the leader)."},
      {"kgpu_extender_failures_total", "Verb requests that failed, by reason."},
      {"kgpu_extender_preempt_nodes_total", "Preempt candidates: kept (their victims make the pod fit) or dropped."},
      {"kgpu_extender_preemptions_total",
       "The extender's own preemptions (shortfalls kube-scheduler cannot see): started, or blocked (an eviction "
       "refused)."},
      {"kgpu_extender_preemption_victims_total", "Pods evicted by the extender's own preemptions."},
      {"kgpu_extender_unauthenticated_total",
       "Verb calls refused for coming without a client certificate (only kube-scheduler may call them), by verb."},
      {"kgpu_extender_events_total",
       "Events the extender wrote on pods (written, failed, dropped when queued too many)."},
  };
  for (const auto& [name, help] : counters) registry_.Declare(name, T::kCounter, help);
  // Read from the extender's state at each scrape (Extender::MetricsText).
  const std::tuple<const char*, T, const char*> state[] = {
      {"kgpu_extender_nodes", T::kGauge, "Nodes with a GPU inventory in the extender's cache."},
      {"kgpu_extender_pods_booked", T::kGauge, "Pods whose GPUs the extender books."},
      {"kgpu_extender_record_conflicts_total", T::kCounter,
       "Allocation records that claim capacity another record holds."},
      {"kgpu_extender_records_waiting", T::kGauge,
       "Bound pods whose allocation records wait for GPUs another record holds (a node's correction to kubelet's "
       "devices not yet complete, or the later of two conflicting records)."},
      {"kgpu_extender_bad_records_total", T::kCounter,
       "Allocation records that did not parse or name GPUs the node lacks."},
      {"kgpu_extender_gpus_reporting_usage", T::kGauge,
       "GPUs whose node reports their memory in use (kgpu.io/gpu-inventory usedMiB)."},
      {"kgpu_extender_gpus_untracked_memory", T::kGauge,
       "GPUs with memory in use beyond what the allocation records book there (another user of the GPU, or a share "
       "over its record)."},
      {"kgpu_extender_gpu_untracked_memory_mib", T::kGauge,
       "That memory in total (MiB), taken out of what the extender places."},
      {"kgpu_extender_ready", T::kGauge, "1 when the informers have synced (standbys too: they answer filter)."},
      {"kgpu_extender_leader", T::kGauge,
       "1 while this replica binds and preempts (it holds the Lease, or runs without --leader-elect)."},
  };
  for (const auto& [name, type, help] : state) registry_.Declare(name, type, help);
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

}  // namespace kgpu::extender
