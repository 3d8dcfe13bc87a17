#pragma once
// The extender's picture of the cluster and its decisions: the placement engine (src/sched) fed
// from informer caches — Nodes with the GPU inventory annotation, Pods with allocation records —
// plus the verbs' logic: filter (device-level feasibility with reasons, FailedNodes for what
// preemption can free, FailedAndUnresolvableNodes for what it cannot), prioritize (the engine's
// policy scores mapped to 0..10: 10 for the nodes the policy itself would choose, tie-breaks
// included, the others 0..9 by score), assume (bind: the exact GPUs, booked in memory before the
// binding carries the record, so that concurrent binds never double-book a GPU) and preempt
// (only victims whose removal makes the pod fit).
//
// Rebuilding: a pod bound to a node with a record is booked at exactly the record's GPUs, so a
// restarted extender has the same state; two records that claim the same capacity are counted
// (record_conflicts) and the later one is not booked.
//
// Thread-safety: every public method may be called from any thread (one internal mutex).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "api/record.h"
#include "extender/inventory.h"
#include "extender/request.h"
#include "extender/wire.h"
#include "k8s/selector.h"
#include "sched/engine.h"

namespace kgpu::extender {

struct StateOptions {
  std::string policy = "ours";  // the engine's policy (sched::PolicyNames())
  uint64_t seed = 42;
  // A GPU whose node reports more memory in use than the records book there by at least this
  // much has an untracked user (another process, a pod outside kgpu, a share exceeding its
  // record): that memory is taken out of what the extender places. Below it: driver overhead.
  int64_t untracked_tolerance_mib = 1024;
  // The extender's own preemption (PlanPreemption): the node it preempts on is held for the
  // preemptor against GPU pods of lower or equal priority until the preemptor is bound or
  // deleted, or for this long at most; after a preemption that could not be carried out
  // (PreemptionFailed), the pod is not planned for again for `preemption_backoff`.
  std::chrono::milliseconds preemption_hold{60000}, preemption_backoff{30000};
};

// A refused node's own figures, beside the reason every node refused for that cause shares.
struct RefusalDetail {
  bool want_text = true;  // false: nearness only (Filter ranks every refused node, words one)
  std::string text;       // "largest free: 6144 MiB on GPU-…"; may be empty
  // How near the node came, 0..1 (what its best GPUs offer of what the pod asks, for the cause
  // that refused it): the node an operator should look at first is the nearest.
  double nearness = 0;
};

struct FilterOutcome {
  std::vector<std::string> passed;
  NodeReasons failed;                  // preemption may help
  NodeReasons unresolvable;            // it cannot
  std::map<std::string, int> reasons;  // failed nodes by reason category
  // With no node passed: the refused node nearest to taking the pod (one preemption could help
  // before one it cannot), and its reason with its figures; empty otherwise.
  std::string closest_node, closest_why;
};

struct Assumption {
  std::string uid, ns, name, node;
  api::AllocationRecord record;
  bool already_bound = false;  // the pod was bound there with this record before (a retry)
};

// A preemption kube-scheduler cannot carry out itself: a pod short only of what the extender
// alone counts (share memory and cores, ignoredByScheduler; or GPUs the extender refuses, e.g.
// an untracked user) passed kube-scheduler's own filters everywhere, so its dry run finds no
// victim and never calls the extender's preempt (facts §1.4). The extender picks the victims as
// kube-scheduler's DefaultPreemption does and evicts them itself.
struct PreemptionPlan {
  std::string uid, ns, name;  // the preemptor
  int64_t priority = 0;
  std::string node;
  struct Victim {
    std::string uid, ns, name;
    int64_t priority = 0;
  };
  std::vector<Victim> victims;  // lowest priority first
  // Victims whose eviction a PodDisruptionBudget would refuse now (as kube-scheduler counts
  // them): the plan with the fewest is chosen, so this is 0 where any node allows it.
  int pdb_violations = 0;
};

struct StateStats {
  size_t nodes = 0, gpu_nodes = 0, pods = 0, booked = 0;
  uint64_t record_conflicts = 0, bad_records = 0, bad_inventories = 0;
  size_t records_waiting = 0;  // bound pods whose records wait for GPUs another record holds
  // Drift between the records and the nodes' NVML reports (facts §7(b)6).
  size_t gpus_reporting_usage = 0;  // GPUs whose node reports the memory in use
  size_t gpus_untracked = 0;        // of which used beyond their bookings (by the tolerance)
  int64_t untracked_mib = 0;        // that memory, in total
};

class State {
 public:
  explicit State(StateOptions options = {});
  // InvalidArgument when the policy name is unknown (the message lists the choices).
  absl::Status Init();

  // Informer feed.
  void UpsertNode(const nlohmann::json& node);
  void RemoveNode(const std::string& name);
  void UpsertPod(const nlohmann::json& pod);
  void RemovePod(const nlohmann::json& pod);
  // PodDisruptionBudgets: the preemption planner prefers victims that no budget protects.
  void UpsertBudget(const nlohmann::json& pdb);
  void RemoveBudget(const nlohmann::json& pdb);

  FilterOutcome Filter(const nlohmann::json& pod, const std::vector<std::string>& nodes);
  // Why `node` cannot take the pod now, with the node's own figures ("no single GPU with 8000
  // MiB free (largest free: 6144 MiB on GPU-…)"); empty when it can. For operators (/debug) and
  // tests: Filter answers the reason alone.
  std::string Explain(const nlohmann::json& pod, const std::string& node);
  std::vector<HostPriority> Prioritize(const nlohmann::json& pod, const std::vector<std::string>& nodes);
  // Chooses the GPUs on `node` and books them. FailedPrecondition with the reason when the pod no
  // longer fits there; InvalidArgument for a request that can never be scheduled.
  absl::StatusOr<Assumption> Assume(const nlohmann::json& pod, const std::string& node);
  // Drops a booking that was never bound (the binding failed).
  void Forget(const std::string& uid);
  // The binding was created: the booking stays until the pod goes away.
  void Confirm(const std::string& uid);
  // Per node: the victims that must go for the pod to fit (nodes where none do are dropped).
  // Empty while the extender's own preemption for the pod is under way (PlanPreemption), so that
  // kube-scheduler never preempts a second time for it elsewhere.
  std::map<std::string, MetaVictims> Preempt(const nlohmann::json& pod,
                                             const std::map<std::string, MetaVictims>& victims);

  // For a pod that none of `nodes` (those that passed kube-scheduler's own filters) can take:
  // the node and the fewest lower-priority GPU pods whose removal lets it fit there, chosen as
  // kube-scheduler's DefaultPreemption chooses (every lower-priority pod removed, then reprieved
  // highest priority first while the pod still fits; among nodes the lowest highest victim
  // priority, then the lowest sum of priorities, then the fewest victims, then the name). The
  // node is held for the pod from now on (Filter and Assume refuse it to GPU pods of lower or
  // equal priority). None when the pod may not preempt (spec.preemptionPolicy: Never, or
  // kube-scheduler's own preemption is under way: status.nominatedNodeName), when a preemption
  // of ours for it is under way or backing off, when pods already terminating will make room,
  // or when no set of victims does.
  std::optional<PreemptionPlan> PlanPreemption(const nlohmann::json& pod, const std::vector<std::string>& nodes);
  // Evicting a victim failed (a PodDisruptionBudget, an API error): the hold ends, and the pod
  // is not planned for again for opts.preemption_backoff.
  void PreemptionFailed(const std::string& uid);
  // The node held for the pod by a preemption of ours (empty when none).
  std::string PreemptingOn(const std::string& uid) const;

  // The record booked for a pod (by UID), if any.
  std::optional<api::AllocationRecord> RecordOf(const std::string& uid) const;
  StateStats Stats() const;

 private:
  struct PodEntry {
    std::string ns, name;
    std::string node;  // spec.nodeName, or the node of an in-flight assumption
    std::optional<api::AllocationRecord> record;
    bool bound = false;    // spec.nodeName is set (or the binding was confirmed)
    bool assumed = false;  // booked by Assume, binding not yet seen
    bool booked = false;   // in the engine
    // Bound, its record not booked because another record holds those GPUs: a record its node
    // corrected to kubelet's devices whose old holder's correction has not arrived (or, after a
    // split brain, the later of two conflicting records). Retried whenever bookings on its node
    // are released (BookWaitingLocked).
    bool waiting = false;
    bool terminating = false;  // metadata.deletionTimestamp is set: its GPUs are freed soon
    int64_t priority = 0;
    nlohmann::json labels = nlohmann::json::object();  // metadata.labels (budgets select by them)
  };
  // A PodDisruptionBudget as the planner reads it: no selector (or an empty or invalid one)
  // guards no pod, as the Eviction API matches them.
  struct Budget {
    std::optional<k8s::LabelSelector> selector;
    int64_t allowed = 0;  // status.disruptionsAllowed
  };
  // A preemption of ours: the node it holds for the preemptor until `until`; a failed one only
  // keeps the pod from being planned for again before `until`.
  struct Hold {
    std::string ns, name, node;
    int64_t priority = 0;
    bool failed = false;
    std::chrono::steady_clock::time_point until;
    // Holding the node now (a failed one only backs off).
    bool Active(std::chrono::steady_clock::time_point now) const { return !failed && until > now; }
  };
  struct Compiled;
  struct Part;

  absl::StatusOr<Compiled> CompileLocked(const nlohmann::json& pod) const;
  // Why `node` cannot take the pod: empty when it can; sets *unresolvable and the reason category.
  // The reason depends on the pod and the cause only, never on the node's figures, so that
  // kube-scheduler's event, which counts identical reasons, stays one line per cause at any
  // cluster size ("5000 no single GPU with 80000 MiB free"). The node's own figures go to
  // *detail when asked for (Explain(), the closest node of a Filter, a refused bind).
  // A node's refusal that depends only on its StaticShape (never on what runs there), per shape.
  struct StaticRefusal {
    std::string why;
    const char* category;
    RefusalDetail detail;
  };
  using RefusalMemo = absl::flat_hash_map<int, StaticRefusal>;  // keys: NodeInfo::shape_id
  std::string ExplainLocked(const Compiled& c, const std::string& node, bool* unresolvable, const char** category,
                            RefusalMemo* memo = nullptr, RefusalDetail* detail = nullptr);
  // One GPU container's refusal on a node (the node is known and has an inventory).
  std::string ExplainPartLocked(const Compiled& c, const Part& part, const std::string& node, const NodeInfo& info,
                                int id, bool* unresolvable, const char*& category, RefusalMemo* memo,
                                RefusalDetail* detail);
  // Books one GPU container on node `id` under engine key `key` where the pod's policy puts it;
  // false when it does not fit. Appends the key to *placed; adds the policy's score to *score
  // (when scoring, a node the policy would not use is false too).
  bool TryPlacePartLocked(const Compiled& c, const Part& part, int id, const std::string& key,
                          std::vector<std::string>* placed, double* score);
  // Every GPU container of `c` on node `id` (engine keys prefix + container), for when placing
  // them one after the other where the policy puts each found no room for one: a depth-first
  // search, in Compiled::parts order, over every GPU that fits each single-GPU share (the fullest
  // first, one of each kind) and the policy's choice for the others, at most 4096 placements
  // tried. Called only when a container found no room beside the others already placed. True with
  // every part placed (keys in *placed); false with nothing left placed.
  bool SearchPartsLocked(const Compiled& c, int id, const std::string& prefix, std::vector<std::string>* placed);
  std::vector<int> MaskLocked(const Compiled& c, const std::string& node);
  void UnmaskLocked(const std::string& node, const std::vector<int>& masked);
  // Why `node` is held for another pod's preemption against this one (empty when it is not).
  std::string HeldLocked(const Compiled& c, const std::string& node, RefusalDetail* detail = nullptr);
  // Of these pods (in this order), those a PodDisruptionBudget would not let go.
  std::set<std::string> BudgetViolationsLocked(const std::vector<std::string>& uids) const;
  sched::Policy& PolicyFor(const Compiled& c);
  // `quiet`: a record that cannot be booked yet is not counted as a conflict (a record the node
  // corrected to kubelet's devices, whose old holder's correction has not arrived yet).
  void BookLocked(const std::string& uid, PodEntry& e, bool quiet = false);
  void UnbookLocked(const std::string& uid, PodEntry& e);
  void RebookNodeLocked(const std::string& node);
  // Books the waiting pods on `node` (capacity was freed).
  void BookWaitingLocked(const std::string& node);
  // Takes each GPU's memory in use beyond its bookings (by the node's last report) out of what is
  // placed there (sched::GpuState::untracked_mib).
  // `before`: the values it had before they were cleared for a booking (not logged again).
  void ApplyReportedUsageLocked(const std::string& node, const std::vector<int64_t>* before = nullptr);

  StateOptions opts_;
  mutable std::mutex mu_;
  std::unique_ptr<sched::Engine> engine_;
  std::unique_ptr<sched::Policy> binpack_, spread_;
  absl::flat_hash_map<std::string, NodeInfo> nodes_;
  absl::flat_hash_map<std::string, int> shape_ids_;  // StaticShape -> NodeInfo::shape_id (never shrinks: few shapes)
  absl::flat_hash_map<std::string, PodEntry> pods_;  // by UID
  std::map<std::string, std::set<std::string>> on_node_;  // node -> UIDs whose record names it
  std::map<std::string, Hold> holds_;                     // preemptor UID -> its hold
  // PodDisruptionBudgets by namespace, then name (a pod is matched only against its namespace's).
  std::map<std::string, std::map<std::string, Budget>> budgets_;
  // Inside a preemption trial (victims taken off and put back): bookings leave each GPU's
  // untracked memory as it was. Recomputed there, the victims' memory, still reported in use,
  // would count as another user's, and the trial would pick more victims than needed.
  bool trial_ = false;
  uint64_t record_conflicts_ = 0, bad_records_ = 0, bad_inventories_ = 0;
};

// The engine's request for one container of a record (rebuilding) or of a pod.
sched::PodRequest EngineRequest(const std::string& key, const api::RecordContainer& c);

}  // namespace kgpu::extender
