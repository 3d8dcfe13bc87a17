#pragma once
// kgpu slurm-bridge: lends GPU nodes from Slurm to Kubernetes on Kubernetes demand (GPU pods
// unschedulable longer than a threshold) and takes them back on Slurm demand (blocked pending
// jobs), at the lease's end or on an operator's request — without ever killing or preempting a
// Slurm job, and with at least one side fenced at every instant (docs/slurm.md):
//   Slurm fence:      DRAIN with reason "kgpu-lend:<op>" (never DOWN; never a reason not ours)
//   Kubernetes fence: taint kgpu.io/owner=slurm:NoSchedule + spec.unschedulable
// Every reconcile observes both systems (scontrol/squeue; Nodes and Pods), recomputes each
// node's phase from the lease annotation plus those facts, and moves it forward with idempotent
// steps, writing the lease (compare-and-swap on the Node's resourceVersion) *before* each
// externally visible action. Pods leave only through the Eviction API (PDB 429s are retried;
// a forced delete only after force_delete_after, off by default). When Slurm or the API server
// cannot be reached, every transition that needs it freezes and no fence is removed; that is
// visible in metrics, Events and `kgpu slurm-bridge status`.
//
// Thread-safety: Reconcile()/Run() from one thread; Metrics() from any.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/backoff.h"
#include "common/process.h"
#include "common/prom_text.h"
#include "k8s/client.h"
#include "k8s/events.h"
#include "k8s/informer.h"
#include "k8s/resources.h"
#include "slurm/client.h"
#include "slurm/lease.h"

namespace kgpu::slurm {

struct BridgeOptions {
  std::string identity = "kgpu-slurm-bridge";
  // Node-name globs ('*', '?') the bridge may lend; empty: every node labelled kgpu.io/pool=slurm|lent.
  std::vector<std::string> allowed;
  int max_lent = 1;                            // nodes lent or being lent at once
  int min_kept = 1;                            // nodes Slurm keeps (undrained, Slurm-owned) whatever the demand
  std::chrono::seconds lend_threshold{30};     // GPU pods unschedulable at least this long
  std::chrono::seconds reclaim_threshold{0};   // blocked Slurm jobs pending at least this long
  std::chrono::seconds cooldown{120};          // a node back with Slurm is not lent again before this
  std::chrono::seconds lend_hysteresis{60};    // no demand this long: a lend still draining is cancelled
  std::chrono::seconds lend_duration{0};       // the lease ends after this (0: no end)
  std::chrono::seconds force_delete_after{0};  // R2: delete pods PDBs still protect after this (0: never)
  std::chrono::milliseconds interval{2000};
  std::chrono::milliseconds confirm_gap{1000};                  // "empty" must hold on two reads this far apart
  std::vector<std::string> gpu_resources = {"nvidia.com/gpu"};  // resource names (prefix match) that make a GPU pod
  // The power-save lend (--lend-via power-save; docs/slurm.md, "Power-save lending"): the Slurm
  // fence is State=POWER_DOWN_ASAP, then POWERED_DOWN, instead of DRAIN. Slurm keeps the node in
  // its inventory and asks for it back by giving it to a job and running ResumeProgram (`kgpu
  // slurm-bridge hook resume`: the reclaim's event). Once Kubernetes is empty, resume_command
  // ({node} replaced; no shell) makes the node's slurmd register as rebooted (slurmd -b), and the
  // job starts. `kgpu slurm-bridge run` requires one; empty here (tests), nothing is run and the
  // node is expected to register on its own.
  bool power_save = false;
  std::vector<std::string> resume_command;
  std::chrono::seconds resume_retry{20};    // run it again when slurmd has not registered by then
  std::chrono::seconds resume_timeout{60};  // deadline of one run of it
  bool dry_run = false;
  // Fault injection for the crash tests: the process exits (code 86) when it reaches this point
  // (see kCrashPoints); empty: never.
  std::string crash_at;
};

// The points Bridge can be stopped at, in lend/reclaim order.
extern const std::vector<std::string> kCrashPoints;

// One node as the bridge saw it in the last reconcile (for status and tests).
struct NodeView {
  std::string name;
  Phase phase = Phase::kSlurm;
  int64_t since = 0;
  int64_t generation = 0;
  std::string op, why;
  std::string slurm_state, slurm_reason;
  bool slurm_fenced = false, k8s_fenced = false;
  size_t pods = 0;                // non-DaemonSet, non-mirror, non-terminal pods bound to it
  std::vector<std::string> jobs;  // Slurm jobs holding it
  std::string frozen;             // why it could not move this time ("" when not frozen)
  // LOST: Slurm holds our drain (kgpu-lend:<op>) but no Node with kgpu.io/pool has this name (it
  // was deleted mid-lend, or relabelled). Not a lease phase: the lease lived on the Node. The
  // drain stays, so Slurm schedules nothing there and nothing runs unfenced; a Node that comes
  // back with kgpu.io/pool=slurm and no lease is adopted (fenced, the stale drain cleared).
  bool lost = false;
};

// How status output names a node's state: the lease phase, or LOST.
inline const char* ViewPhaseName(const NodeView& v) {
  return v.lost ? "LOST" : PhaseName(v.phase);
}
// Why node `node`, drained by Slurm with our `reason`, is LOST, and what ends it.
std::string LostWhy(std::string_view node, std::string_view reason);

struct ReconcileResult {
  bool slurm_ok = false, k8s_ok = false;
  std::vector<NodeView> nodes;
  std::vector<std::string> decisions;  // "lend node1: ...", "reclaim node2: ..."
  int unschedulable_gpu_pods = 0;
  int blocked_slurm_jobs = 0;
};

class Bridge {
 public:
  using Clock = std::function<int64_t()>;  // unix seconds
  // Kills a resume command still running (its run is waited for, a moment).
  ~Bridge();
  Bridge(SlurmClient& slurm, k8s::Client& kube, BridgeOptions options, k8s::EventRecorder* events = nullptr,
         std::ostream* dry_run_out = nullptr, Clock clock = {});
  Bridge(const Bridge&) = delete;
  Bridge& operator=(const Bridge&) = delete;

  ReconcileResult Reconcile();
  // Reconciles until stop: every interval, and soon after Wake().
  void Run(std::stop_token stop);
  // Ends Run()'s wait (an event: a GPU pod went pending, a reclaim was requested, a node
  // changed): the next reconcile starts after a short debounce instead of at the interval.
  // Polling stays the truth; events only make it come sooner. Any thread.
  void Wake();
  // Prometheus text exposition of the bridge's counters and gauges.
  std::string Metrics() const;
  ReconcileResult Last() const;

 private:
  struct Pod {
    std::string ns, name, node;
    bool terminating = false;
  };
  struct Facts;  // one node's observation
  bool Step(Facts& f, ReconcileResult& result);
  // CAS write of the node object (lease + fence changes); false on conflict or error.
  bool WriteNode(Facts& f, const Lease& lease, const std::function<void(nlohmann::json&)>& mutate,
                 const std::string& what);
  Lease NextLease(const Facts& f, Phase phase, const std::string& why) const;
  void Event(const Facts& f, const std::string& type, const std::string& reason, const std::string& note);
  void CrashPoint(const std::string& point);
  bool Allowed(const std::string& node) const;
  void Count(const std::string& metric, const prom::Labels& labels = {});
  void DeclareMetrics();  // every family with its HELP, once, at construction
  // L1/L2 of a power-save lend when Slurm powers the node up (it gave it to a job): off to R3.
  bool SlurmWantsItBack(Facts& f);
  // R3 of a power-save reclaim: starts resume_command for the node in the background, at most
  // once per resume_retry and never twice at once, so one slow node does not hold up the
  // reconcile of the others (a run may take up to resume_timeout).
  void RunResumeCommand(Facts& f);
  // A finished run of resume_command for the node: its metric and Event (Normal ResumeCommand,
  // or Warning ResumeCommandFailed with the exit status and stderr). Called for every node each
  // reconcile, so the outcome is reported even when the node has moved on meanwhile.
  void ReapResumeCommand(const Facts& f);

  SlurmClient& slurm_;
  k8s::Client& kube_;
  BridgeOptions opts_;
  k8s::EventRecorder* events_;
  std::ostream* dry_out_;
  Clock clock_;

  // Memory that may be lost (a restart only waits a little longer).
  std::map<std::string, std::chrono::steady_clock::time_point> empty_since_;  // L1 confirmation
  // A pod whose eviction was refused: when to try again, and the backoff (interval, doubling to 10 s).
  struct EvictRetry {
    std::chrono::steady_clock::time_point next;
    Backoff backoff;
  };
  std::map<std::string, EvictRetry> evict_backoff_;
  // What was last said of a condition that lasts (logged and recorded once, and again when it
  // changes or ends; kgpu_slurm_bridge_frozen_total counts every reconcile it lasts): a side that
  // cannot be read ("" while it can), and each node's SlurmUnreachable Event.
  std::string slurm_down_said_, k8s_down_said_;
  int64_t slurm_down_reconciles_ = 0, k8s_down_reconciles_ = 0;
  // The first reconcile reads everything (every pod of the cluster): its steps are logged with
  // their counts and times, so a slow start shows where it is.
  bool first_done_ = false;
  std::map<std::string, std::string> frozen_said_;
  // Blocked Slurm jobs that no reclaim can help (a required node down or admin-drained): what was
  // said of each, by job id (said once, again when it changes).
  std::map<std::string, std::string> unservable_said_;
  std::map<std::string, std::chrono::steady_clock::time_point> resumed_at_;  // resume_command last run
  struct ResumeRun {
    std::vector<std::string> argv;
    std::future<absl::StatusOr<ProcessResult>> done;  // std::async's: the destructor waits for the run
  };
  std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);  // kills resume runs
  std::map<std::string, ResumeRun> resume_runs_;  // by node: runs not reaped yet (a run touches
                                                  // nothing of the bridge's)
  std::set<std::string> lost_logged_;             // LOST nodes already logged (once each, until they return)
  int64_t demand_gone_since_ = 0;                 // clock_() seconds: the bridge's one clock (injected in tests)
  // When the last reconcile wants the next one sooner than the interval (a second read due).
  std::optional<std::chrono::steady_clock::time_point> recheck_at_;
  bool had_demand_ = false;

  std::mutex wake_mu_;
  std::condition_variable_any wake_cv_;
  bool woken_ = false;

  mutable std::mutex mu_;          // guards what Metrics()/Last() read
  prom::MetricsRegistry metrics_;  // thread-safe on its own
  ReconcileResult last_;
};

// The events that wake a Bridge: watches of pending pods (status.phase=Pending: a GPU pod
// kube-scheduler could not place) and of the bridge's nodes (label kgpu.io/pool: a reclaim
// request, a cordon, a node coming or going). Only pending pods are cached, not every pod.
class BridgeWatch {
 public:
  BridgeWatch(k8s::Client& kube, Bridge& bridge);
  ~BridgeWatch();
  BridgeWatch(const BridgeWatch&) = delete;
  BridgeWatch& operator=(const BridgeWatch&) = delete;
  void Start();
  void Stop();

 private:
  std::unique_ptr<k8s::Informer> pods_, nodes_;
};

// Kubernetes side helpers (pure, on Node JSON).
// j[key] for reading (k8s/resources.h).
using k8s::Field;
bool K8sFenced(const nlohmann::json& node);
// Slurm side: drained, or powered down (requested, under way or done), with a kgpu-lend reason.
bool SlurmFencedByUs(const SlurmNode& node);
void ApplyK8sFence(nlohmann::json& node);
// Lifts the bridge's fence (taint, cordon, autoscaler annotations; pool=lent). keep_cordon
// leaves spec.unschedulable as it is (an admin's cordon).
void RemoveK8sFence(nlohmann::json& node, bool keep_cordon = false);
// The node's lease, or an empty SLURM_OWNED one (generation 0) when it has none or it is unreadable
// (`error` says why).
Lease LeaseOf(const nlohmann::json& node, std::string* error = nullptr);

// Whether a glob ('*' any run, '?' one character) matches.
bool GlobMatch(std::string_view glob, std::string_view name);

}  // namespace kgpu::slurm
