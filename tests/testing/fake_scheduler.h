#pragma once
// A kube-scheduler stand-in that drives an extender exactly as kube-scheduler's scheduling cycle
// does (pkg/scheduler/schedule_one.go, extender.go, framework/preemption; facts §1.2-§1.4):
//  1. in-tree filtering: unschedulable nodes out; NodeResourcesFit on the extended resources the
//     scheduler counts (nvidia.com/gpu, nvidia.com/mig-*, kgpu.io/gpu: allocatable minus the
//     requests of the pods bound or assumed there, from a cache the informers keep current);
//     kgpu.io/gpu-memory and kgpu.io/gpu-cores are ignoredByScheduler and never looked at. As
//     kube-scheduler, it walks the nodes from where the last cycle stopped and stops once
//     numFeasibleNodesToFind nodes pass (percentageOfNodesToScore; every node below 100);
//  2. POST <prefix>/filter with the survivors (NodeNames when nodeCacheCapable, else the full
//     NodeList) — the reply's NodeNames (or Nodes) must be a subset of the input;
//  3. with more than one node left, POST <prefix>/prioritize; score x weight x 10; the highest
//     wins (ties: the lexically first name, where kube-scheduler picks at random);
//  4. POST <prefix>/bind (the extender is the binder); a non-empty Error fails the pod;
//  5. when no node is left: the FailedScheduling message "0/N nodes are available: ..." and, for
//     a pod with priority, the preemption dry run: per node that failed resolvably, remove every
//     lower-priority pod, check the in-tree fit, reprieve pods greedily (highest priority first)
//     while it still fits; a node with no victim left fails with "expected at least one victim
//     pod on node" and is not offered (this is why preempt is never reached for a pod short only
//     of an ignoredByScheduler resource); the candidates go to POST <prefix>/preempt and the
//     victims of the node it keeps with the fewest victims are deleted.
//
// Thread-safety: ScheduleOne may be called from several threads: as in kube-scheduler, the
// scheduling cycles (steps 1-3, ending with the pod assumed in the cache) run one at a time and
// the binding cycles (step 4) concurrently; RunLoop from one thread.

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "k8s/client.h"

namespace kgpu::testing {

struct FakeSchedulerOptions {
  std::string url_prefix;  // e.g. "http://127.0.0.1:8888/gpu"
  bool node_cache_capable = true;
  int64_t weight = 5;
  // KubeSchedulerConfiguration's percentageOfNodesToScore: 0 = adaptive (the default), 100 = all.
  int percentage_of_nodes_to_score = 0;
  std::string scheduler_name = "kgpu-scheduler";
  // Resources the extender manages with ignoredByScheduler: true (never counted in-tree).
  std::vector<std::string> ignored = {"kgpu.io/gpu-memory", "kgpu.io/gpu-cores"};
  // The extender's tlsConfig: the client certificate and key kube-scheduler presents, and the CA
  // it verifies the extender's certificate with (none: tlsConfig insecure, as without caFile).
  std::string cert_file, key_file, ca_file;
};

struct ScheduleOutcome {
  bool bound = false;
  std::string node;
  std::string message;                 // FailedScheduling text, or the bind error
  std::vector<std::string> preempted;  // "ns/name" of the victims deleted
  bool preempt_called = false;
  // Bound among several feasible nodes: each one's prioritize total (extender score x weight x
  // 10), in the order filter left them.
  std::vector<std::pair<std::string, int64_t>> scores;
  // ScheduleOne's timings: the scheduling cycle (in-tree filters and scores, the extender's
  // filter, prioritize and preempt), the part of it spent waiting on the extender, and the bind
  // call (in the binding cycle, which overlaps the next scheduling cycles).
  std::chrono::nanoseconds cycle{0}, extender{0}, bind{0};
};

class FakeScheduler {
 public:
  FakeScheduler(k8s::Client& api, FakeSchedulerOptions options);
  ~FakeScheduler();
  FakeScheduler(const FakeScheduler&) = delete;
  FakeScheduler& operator=(const FakeScheduler&) = delete;

  // One scheduling cycle and its binding cycle for `pod` (as read from the API).
  absl::StatusOr<ScheduleOutcome> ScheduleOne(const nlohmann::json& pod);
  // Filter and prioritize only: the node it would choose (empty when none) and why not.
  absl::StatusOr<ScheduleOutcome> Decide(const nlohmann::json& pod);
  // Pending pods of our schedulerName, oldest first, until `stop`; each failure is recorded as
  // a FailedScheduling Event on the pod.
  void RunLoop(std::stop_token stop, std::chrono::milliseconds idle = std::chrono::milliseconds(100));

  uint64_t calls(const std::string& verb) const;
  // Whether the Node and Pod informers listed within `timeout` (kube-scheduler schedules nothing
  // before its caches have synced; a benchmark waits for this before it starts the clock).
  bool WaitForSync(std::chrono::milliseconds timeout);

 private:
  absl::StatusOr<std::string> Post(const std::string& verb, const std::string& body);
  void Event(const nlohmann::json& pod, const std::string& reason, const std::string& message);

  struct Impl;
  k8s::Client& api_;
  FakeSchedulerOptions opts_;
  std::unique_ptr<Impl> impl_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> calls_;
  std::map<std::string, std::string> last_message_;  // pod key -> last FailedScheduling message
};

// The extended-resource requests of a pod that kube-scheduler counts (limits, else requests),
// summed over app containers and maxed with each init container, as the scheduler does.
std::map<std::string, int64_t> CountedRequests(const nlohmann::json& pod, const std::vector<std::string>& ignored);

}  // namespace kgpu::testing
