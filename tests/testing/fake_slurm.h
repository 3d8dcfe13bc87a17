#pragma once
// FakeSlurm: an in-memory slurmctld behind the bridge's SlurmClient interface, for unit tests and
// benchmarks that must run without a real Slurm. It keeps what 22.05 keeps per node and job and
// answers through the same text the CLI backend reads: every read renders `scontrol show node -o`
// lines or `squeue -o kgpu::slurm::kSqueueFormat` lines and parses them with the product's parsers
// (so the fake cannot hand the bridge a value the real backend could not), and the writes follow
// 22.05's semantics (../shared/docs/facts/slurm.md §A2):
//  - node state is a base (IDLE / MIXED / ALLOCATED from the CPUs its jobs hold, or DOWN / UNKNOWN
//    when set) plus flags (DRAIN, COMPLETING, NOT_RESPONDING), printed as scontrol prints it;
//  - DRAIN needs a reason; an admin's DRAIN overwrites the reason and its user/time ("[user@time]");
//    a RESUME on a node that is neither drained nor down is "Invalid node state specified";
//    UNDRAIN clears DRAIN and keeps the base state;
//  - a drained node keeps running its jobs; a job that ends leaves squeue at once and leaves the
//    node COMPLETING until CompletingDone() (as the epilog does, ≈0.2 s in the trial);
//  - slurmctld down: every call fails Unavailable with scontrol's message;
//  - unknown node: NotFound with "Invalid node name specified";
//  - partitions (each node in "batch" unless set), features and GRES per node; a job submitted
//    with Submit() (-N, -w, -x, --constraint, --gres, -p) pends with the reason 22.05 gives, read
//    afresh at every squeue: a required node that is drained, down or not responding is
//    "ReqNodeNotAvail, UnavailableNodes:<those>"; fewer usable nodes that fit than it needs is
//    "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions";
//    enough that fit but busy is "Resources"; enough idle is "None" (the test is the scheduler:
//    Slurm would start it now, and it is no demand);
//  - power saving, as observed on 22.05.8 (docs/slurm.md, "Power-save lending"): POWER_DOWN_ASAP
//    sets DRAIN, the reason and a pending POWER_DOWN; once the node is empty Slurm runs
//    SuspendProgram (POWERING_DOWN, DRAIN gone, reason kept), then POWERED_DOWN — the test moves
//    it along with AdvancePower(); a job given a powered-down node waits in CONFIGURING while the
//    node is POWERING_UP+NOT_RESPONDING with its reason cleared, until RegisterRebooted() (slurmd
//    -b); POWER_UP does the same without a job; UNDRAIN leaves a pending power-down in place; a
//    DRAIN on a node powering up for a job requeues the job (Requeued()).
// The bridge-facing Drain/Undrain keep the CLI backend's guard (read first; never overwrite or
// clear a reason that does not start with owned_prefix; re-read afterwards).
//
// Thread-safety: every method locks one mutex; safe from any thread.

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slurm/client.h"
#include "slurm/parse.h"

namespace kgpu::testing {

class FakeSlurm : public slurm::SlurmClient {
 public:
  struct FakeJob {
    std::string id;
    std::string state;               // PENDING, RUNNING, SUSPENDED
    std::vector<std::string> nodes;  // empty while pending
    int node_count = 1;
    int cpus_per_node = 0;        // 0: the whole node (ALLOCATED); less: MIXED
    std::string reason = "None";  // pending reason
    int64_t end_time = 0;         // unix seconds; 0: N/A
    int64_t submit_time = 0;
    std::string partition = "batch";
    // What it asked for (squeue %n %x %f %b), and whether its reason is computed (Submit) or fixed.
    std::vector<std::string> required, excluded;
    std::string features, gres;  // "" for none; gres as squeue prints tres_per_node ("gres:gpu:2")
    bool computed_reason = false;
  };
  // sbatch's options that decide where a job may run.
  struct JobSpec {
    int node_count = 1;                      // -N
    std::vector<std::string> required = {};  // -w
    std::vector<std::string> excluded = {};  // -x
    std::string features = {};               // -C / --constraint
    std::string gres = {};                   // --gres, as squeue %b prints it: "gres:gpu:2"
    std::string partition = "batch";         // -p
    int64_t submit_time = -1;                // -1: now
  };

  // `now` gives the time reasons and jobs are stamped with (default: the wall clock).
  explicit FakeSlurm(std::function<int64_t()> now = {}) : now_(std::move(now)) {
    if (!now_) now_ = [] { return static_cast<int64_t>(std::time(nullptr)); };
  }

  // ------------------------------------------------------------------ the cluster (test side)

  void AddNode(const std::string& name, int cpus = 2, const std::string& gres = "gpu:h100:8") {
    std::lock_guard lock(mu_);
    NodeRec n;
    n.name = name;
    n.cpus = cpus;
    n.gres = gres;
    nodes_[name] = n;
    order_.push_back(name);
  }
  // slurm.conf's PartitionName=... Nodes=, Feature= and Gres= of a node.
  void SetPartitions(const std::string& node, const std::vector<std::string>& partitions) {
    std::lock_guard lock(mu_);
    if (auto* n = Find(node)) n->partitions = partitions;
  }
  void SetFeatures(const std::string& node, const std::vector<std::string>& features) {
    std::lock_guard lock(mu_);
    if (auto* n = Find(node)) n->features = features;
  }
  void SetGres(const std::string& node, const std::string& gres) {
    std::lock_guard lock(mu_);
    if (auto* n = Find(node)) n->gres = gres;
  }
  // slurmctld stopped (false) or running again (true).
  void SetReachable(bool up) {
    std::lock_guard lock(mu_);
    reachable_ = up;
  }
  // `scontrol update NodeName=N State=DRAIN Reason=R` as an admin (user "admin"): overwrites
  // any reason, ours included.
  absl::Status AdminDrain(const std::string& node, const std::string& reason) {
    std::lock_guard lock(mu_);
    auto* n = Find(node);
    if (n == nullptr) return NoNode(node);
    if (reason.empty()) return absl::InvalidArgumentError("You must specify a reason when DOWNING or DRAINING a node.");
    n->drain = true;
    SetReason(*n, reason, "admin");
    writes_.push_back("admin DRAIN " + node + " " + reason);
    return absl::OkStatus();
  }
  // `scontrol update NodeName=N State=RESUME` as an admin.
  absl::Status AdminResume(const std::string& node) {
    std::lock_guard lock(mu_);
    auto* n = Find(node);
    if (n == nullptr) return NoNode(node);
    if (!n->drain && !n->down) return absl::InternalError("slurm_update error: Invalid node state specified");
    n->drain = false;
    n->down = false;
    n->reason.clear();
    writes_.push_back("admin RESUME " + node);
    return absl::OkStatus();
  }
  // slurmd stopped (NOT_RESPONDING; a drained node stays drained, not DOWN) or back.
  void SetResponding(const std::string& node, bool responding) {
    std::lock_guard lock(mu_);
    if (auto* n = Find(node)) n->not_responding = !responding;
  }
  // Slurm's power-saving clock for `node`: a pending power-down of an empty node starts
  // (SuspendProgram runs: POWERING_DOWN), or one under way ends (POWERED_DOWN). False when there
  // is nothing to advance (jobs still on it, or no power-down).
  bool AdvancePower(const std::string& node) {
    std::lock_guard lock(mu_);
    auto* n = Find(node);
    if (n == nullptr) return false;
    if (n->power == Power::kDownRequested && AllocCpus(*n) == 0 && !n->completing) {
      n->power = Power::kPoweringDown;
      n->drain = false;
      return true;
    }
    if (n->power == Power::kPoweringDown) {
      n->power = Power::kPoweredDown;
      return true;
    }
    return false;
  }
  // Slurm gives a powered-down node to a job: the job CONFIGURING, the node still POWERED_DOWN
  // (ALLOCATED+POWERED_DOWN, its reason cleared) until RunResumeProgram(). Returns the job id.
  absl::StatusOr<std::string> StartJobOnPoweredDown(const std::string& node) {
    std::lock_guard lock(mu_);
    auto* n = Find(node);
    if (n == nullptr) return NoNode(node);
    if (n->power != Power::kPoweredDown || n->drain) return absl::InvalidArgumentError(node + " is not powered down");
    n->reason.clear();  // as 22.05 does at the allocation (MIXED+POWERED_DOWN, no Reason=)
    FakeJob j;
    j.id = std::to_string(next_id_++);
    j.state = "CONFIGURING";
    j.nodes = {node};
    j.submit_time = now_();
    jobs_.push_back(j);
    return j.id;
  }
  // About a second after the allocation Slurm runs ResumeProgram: POWERING_UP+NOT_RESPONDING,
  // the reason cleared.
  void RunResumeProgram(const std::string& node) {
    std::lock_guard lock(mu_);
    if (auto* n = Find(node); n != nullptr && n->power == Power::kPoweredDown) PowerUpLocked(*n);
  }
  // slurmd on a POWERING_UP node registers as rebooted (slurmd -b): the node is back, and jobs
  // waiting in CONFIGURING run.
  void RegisterRebooted(const std::string& node) {
    std::lock_guard lock(mu_);
    auto* n = Find(node);
    if (n == nullptr || n->power != Power::kPoweringUp) return;
    n->power = Power::kNone;
    n->not_responding = false;
    for (auto& j : jobs_) {
      if (j.state == "CONFIGURING" && std::find(j.nodes.begin(), j.nodes.end(), node) != j.nodes.end())
        j.state = "RUNNING";
    }
  }
  std::vector<std::string> Requeued() const {
    std::lock_guard lock(mu_);
    return requeued_;
  }
  // Starts a job now on `nodes` (the test is the scheduler; a drained node gets no new job, as in
  // Slurm: InvalidArgument). Returns the job id.
  absl::StatusOr<std::string> StartJob(const std::vector<std::string>& nodes, int64_t end_time = 0,
                                       int cpus_per_node = 0) {
    std::lock_guard lock(mu_);
    for (const auto& name : nodes) {
      auto* n = Find(name);
      if (n == nullptr) return NoNode(name);
      if (n->drain || n->down || n->power != Power::kNone) {
        return absl::InvalidArgumentError("node " + name + " is drained, down or powered down: no new job");
      }
    }
    FakeJob j;
    j.id = std::to_string(next_id_++);
    j.state = "RUNNING";
    j.nodes = nodes;
    j.node_count = static_cast<int>(nodes.size());
    j.cpus_per_node = cpus_per_node;
    j.end_time = end_time;
    j.submit_time = now_();
    jobs_.push_back(j);
    return j.id;
  }
  // A pending job that needs `node_count` nodes, with squeue's pending reason.
  std::string SubmitPending(int node_count, const std::string& reason, int64_t submit_time = -1) {
    std::lock_guard lock(mu_);
    FakeJob j;
    j.id = std::to_string(next_id_++);
    j.state = "PENDING";
    j.node_count = node_count;
    j.reason = reason;
    j.submit_time = submit_time >= 0 ? submit_time : now_();
    jobs_.push_back(j);
    return j.id;
  }
  // `sbatch` of a job that pends (the test starts jobs itself, with StartJob): its reason is
  // computed from the nodes at every read, as slurmctld's scheduler would set it. Returns the id.
  std::string Submit(const JobSpec& spec) {
    std::lock_guard lock(mu_);
    FakeJob j;
    j.id = std::to_string(next_id_++);
    j.state = "PENDING";
    j.node_count = spec.node_count;
    j.required = spec.required;
    j.excluded = spec.excluded;
    j.features = spec.features;
    j.gres = spec.gres;
    j.partition = spec.partition;
    j.computed_reason = true;
    j.submit_time = spec.submit_time >= 0 ? spec.submit_time : now_();
    jobs_.push_back(j);
    return j.id;
  }
  // The reason squeue gives job `id` now ("" when there is no such job).
  std::string PendingReason(const std::string& id) const {
    std::lock_guard lock(mu_);
    for (const auto& j : jobs_) {
      if (j.id == id) return ReasonOf(j);
    }
    return "";
  }
  // The job ends on its own: it leaves squeue; its nodes are COMPLETING until CompletingDone.
  void EndJob(const std::string& id, bool completing = true) {
    std::lock_guard lock(mu_);
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
      if (it->id != id) continue;
      if (completing) {
        for (const auto& name : it->nodes) {
          if (auto* n = Find(name)) n->completing = true;
        }
      }
      if (it->state != "PENDING") ended_.push_back(id);
      jobs_.erase(it);
      return;
    }
  }
  void CompletingDone(const std::string& node) {
    std::lock_guard lock(mu_);
    if (auto* n = Find(node)) n->completing = false;
  }
  void ClearJobs() {
    std::lock_guard lock(mu_);
    jobs_.clear();
  }

  // What happened: "DRAIN node1 kgpu-lend:op", "UNDRAIN node1", "admin DRAIN ...", "admin RESUME ...".
  std::vector<std::string> Writes() const {
    std::lock_guard lock(mu_);
    return writes_;
  }
  size_t BridgeWrites(const std::string& node) const {
    std::lock_guard lock(mu_);
    return static_cast<size_t>(std::count_if(writes_.begin(), writes_.end(), [&](const std::string& w) {
      return w.rfind("admin ", 0) != 0 && w.find(" " + node + " ") != std::string::npos;
    }));
  }
  // Jobs that ended on their own (EndJob), and jobs still held. The bridge has no way to end a
  // job through this interface; tests check that every job they started is either still running
  // or ended by them.
  std::vector<std::string> Ended() const {
    std::lock_guard lock(mu_);
    return ended_;
  }
  std::string State(const std::string& node) const {
    std::lock_guard lock(mu_);
    const auto it = nodes_.find(node);
    return it == nodes_.end() ? "" : StateOf(it->second);
  }
  std::string Reason(const std::string& node) const {
    std::lock_guard lock(mu_);
    const auto it = nodes_.find(node);
    return it == nodes_.end() ? "" : it->second.reason;
  }
  uint64_t Calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }

  // ------------------------------------------------------------------ SlurmClient (bridge side)

  absl::StatusOr<std::vector<slurm::SlurmNode>> Nodes() override {
    std::lock_guard lock(mu_);
    if (auto s = Call(); !s.ok()) return s;
    std::string text;
    for (const auto& name : order_) text += Line(nodes_.at(name));
    return slurm::ParseScontrolNodes(text);
  }
  absl::StatusOr<slurm::SlurmNode> Node(const std::string& name) override {
    std::lock_guard lock(mu_);
    return NodeLocked(name);
  }
  absl::StatusOr<std::vector<slurm::SlurmJob>> Jobs() override {
    std::lock_guard lock(mu_);
    if (auto s = Call(); !s.ok()) return s;
    std::string text;
    for (const auto& j : jobs_) text += JobLine(j);
    return slurm::ParseSqueue(text);
  }
  absl::StatusOr<std::vector<slurm::SlurmJob>> JobsOnNode(const std::string& node) override {
    std::lock_guard lock(mu_);
    if (auto s = slurm::ValidateNodeName(node); !s.ok()) return s;
    if (auto s = Call(); !s.ok()) return s;
    std::string text;
    for (const auto& j : jobs_) {
      if (j.state != "PENDING" && std::find(j.nodes.begin(), j.nodes.end(), node) != j.nodes.end()) text += JobLine(j);
    }
    return slurm::ParseSqueue(text);
  }
  absl::StatusOr<slurm::SlurmNode> Drain(const std::string& node, const std::string& reason,
                                         const std::string& owned_prefix) override {
    std::lock_guard lock(mu_);
    auto before = NodeLocked(node);
    if (!before.ok()) return before.status();
    if (auto s = slurm::NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
    if (!(before->Drain() && before->reason == reason)) {
      if (auto s = Call(); !s.ok()) return s;
      if (auto s = UpdateLocked(node, "DRAIN", reason); !s.ok()) return s;
    }
    return NodeLocked(node);
  }
  absl::StatusOr<slurm::SlurmNode> PowerDown(const std::string& node, const std::string& reason,
                                             const std::string& owned_prefix) override {
    std::lock_guard lock(mu_);
    auto before = NodeLocked(node);
    if (!before.ok()) return before.status();
    if (auto s = slurm::NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
    if (before->PowerSaving() && before->reason == reason) return before;
    if (auto s = Call(); !s.ok()) return s;
    auto& n = nodes_.at(node);
    n.drain = true;
    SetReason(n, reason, "root");
    if (n.power == Power::kNone) n.power = Power::kDownRequested;
    writes_.push_back("POWER_DOWN_ASAP " + node + " " + reason);
    return NodeLocked(node);
  }
  absl::StatusOr<slurm::SlurmNode> PowerUp(const std::string& node, const std::string& owned_prefix) override {
    std::lock_guard lock(mu_);
    auto before = NodeLocked(node);
    if (!before.ok()) return before.status();
    if (!before->PoweredDown() || before->PowerUpRequested()) return before;
    if (auto s = slurm::NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
    if (auto s = Call(); !s.ok()) return s;
    if (auto s = UpdateLocked(node, "POWER_UP", ""); !s.ok()) return s;
    return NodeLocked(node);
  }
  absl::StatusOr<slurm::SlurmNode> Undrain(const std::string& node, const std::string& owned_prefix) override {
    std::lock_guard lock(mu_);
    auto before = NodeLocked(node);
    if (!before.ok()) return before.status();
    if (!before->Drain()) return before;
    if (auto s = slurm::NotDrainedByOthers(*before, owned_prefix); !s.ok()) return s;
    if (auto s = Call(); !s.ok()) return s;
    if (auto s = UpdateLocked(node, "UNDRAIN", ""); !s.ok()) return s;
    return NodeLocked(node);
  }

  // ------------------------------------------------------------------ slurmrestd v0.0.39 (fake_slurmrestd.h)
  // What slurmrestd 23.02's v0.0.39 handlers answer from this state (the schema: src/slurm/rest.h):
  // the HTTP status and the JSON body. slurmctld unreachable: 500 with its error.
  std::pair<int, nlohmann::json> RestNodes(const std::string& only = "") {
    std::lock_guard lock(mu_);
    nlohmann::json out = RestEnvelope();
    if (auto s = Call(); !s.ok()) return RestControllerDown(out);
    out["nodes"] = nlohmann::json::array();
    for (const auto& name : order_) {
      if (!only.empty() && name != only) continue;
      const NodeRec& n = nodes_.at(name);
      nlohmann::json state = nlohmann::json::array();
      const std::string printed = StateOf(n);
      for (size_t at = 0; at <= printed.size();) {
        const size_t plus = std::min(printed.find('+', at), printed.size());
        state.push_back(printed.substr(at, plus - at));
        at = plus + 1;
      }
      out["nodes"].push_back({{"name", n.name},
                              {"state", state},
                              {"reason", n.reason},
                              {"reason_set_by_user", n.reason.empty() ? "" : n.reason_user},
                              {"reason_changed_at", n.reason.empty() ? 0 : n.reason_at},
                              {"gres", n.gres},
                              {"cpus", n.cpus},
                              {"alloc_cpus", AllocCpus(n)},
                              {"partitions", n.partitions},
                              {"features", Join(n.features)},
                              {"active_features", Join(n.features)},
                              {"free_mem", {{"set", true}, {"infinite", false}, {"number", 20479}}}});
    }
    // An unknown name is no 404: no node, and an error entry without a number.
    if (!only.empty() && out["nodes"].empty()) {
      out["errors"].push_back({{"description", "Failure to query node " + only}, {"source", "slurm_load_node_single"}});
    }
    return {200, out};
  }
  std::pair<int, nlohmann::json> RestJobs() {
    std::lock_guard lock(mu_);
    nlohmann::json out = RestEnvelope();
    if (auto s = Call(); !s.ok()) return RestControllerDown(out);
    out["jobs"] = nlohmann::json::array();
    for (const auto& j : jobs_) {
      std::string nodes;
      for (const auto& n : j.nodes) nodes += (nodes.empty() ? "" : ",") + n;
      out["jobs"].push_back({{"job_id", std::stoll(j.id)},
                             {"job_state", j.state},
                             {"nodes", nodes},
                             {"node_count", {{"set", true}, {"infinite", false}, {"number", j.node_count}}},
                             {"state_reason", ReasonOf(j)},
                             {"end_time", j.end_time},
                             {"submit_time", j.submit_time},
                             {"partition", j.partition},
                             {"required_nodes", Join(j.required)},
                             {"excluded_nodes", Join(j.excluded)},
                             {"features", j.features},
                             {"tres_per_node", j.gres}});
    }
    return {200, out};
  }
  // POST node/{name}: the body's state (a string or an array, of which slurmrestd's parser keeps
  // the last) and reason, applied as slurmctld applies `scontrol update` (no guard here).
  std::pair<int, nlohmann::json> RestUpdate(const std::string& node, const nlohmann::json& body) {
    std::lock_guard lock(mu_);
    nlohmann::json out = RestEnvelope();
    if (auto s = Call(); !s.ok()) return RestControllerDown(out);
    std::string state;
    if (body.contains("state") && body["state"].is_string()) state = body["state"];
    if (body.contains("state") && body["state"].is_array() && !body["state"].empty() &&
        body["state"].back().is_string()) {
      state = body["state"].back();
    }
    const std::string reason =
        body.contains("reason") && body["reason"].is_string() ? body["reason"].get<std::string>() : "";
    absl::Status st =
        Find(node) == nullptr ? absl::NotFoundError("Invalid node name specified") : UpdateLocked(node, state, reason);
    if (st.ok()) return {200, out};
    out["errors"].push_back({{"error", std::string(st.message())},
                             {"description", "slurm_update_node() failed"},
                             {"source", "update_node"}});
    return {500, out};
  }

 private:
  enum class Power { kNone, kDownRequested, kPoweringDown, kPoweredDown, kPoweringUp };
  struct NodeRec {
    std::string name, gres, reason, reason_user, reason_time;
    int64_t reason_at = 0;  // reason_time in unix seconds (slurmrestd's reason_changed_at)
    int cpus = 2;
    bool drain = false, down = false, completing = false, not_responding = false;
    Power power = Power::kNone;
    std::vector<std::string> partitions = {"batch"}, features;
  };
  static std::string Join(const std::vector<std::string>& v, const std::string& none = "") {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ",") + x;
    return out.empty() ? none : out;
  }
  // Slurm could give it to a job (a powered-down node too: Slurm powers it up for one).
  static bool Usable(const NodeRec& n) {
    return !n.drain && !n.down && !n.not_responding && (n.power == Power::kNone || n.power == Power::kPoweredDown);
  }
  bool Idle(const NodeRec& n) const {
    return Usable(n) && n.power == Power::kNone && !n.completing && AllocCpus(n) == 0;
  }
  // Partition, -x, --constraint and --gres (not -w: the job may use other nodes besides).
  static bool Fits(const FakeJob& j, const NodeRec& n) {
    slurm::SlurmJob sj;
    sj.partition = j.partition;
    sj.excluded_nodes = j.excluded;
    sj.features = j.features;
    sj.gres = j.gres;
    slurm::SlurmNode sn;
    sn.name = n.name;
    sn.gres = n.gres;
    sn.partitions.insert(n.partitions.begin(), n.partitions.end());
    sn.features.insert(n.features.begin(), n.features.end());
    return slurm::JobMayUse(sj, sn);
  }
  // The pending reason slurmctld would give the job now (see the header).
  std::string ReasonOf(const FakeJob& j) const {
    if (!j.computed_reason || j.state != "PENDING") return j.reason;
    std::vector<std::string> unavailable;
    bool required_idle = true;
    for (const auto& r : j.required) {
      const auto it = nodes_.find(r);
      if (it == nodes_.end() || !Usable(it->second)) unavailable.push_back(r);
      required_idle = required_idle && it != nodes_.end() && Idle(it->second);
    }
    if (!unavailable.empty()) return "ReqNodeNotAvail, UnavailableNodes:" + Join(unavailable);
    int usable = 0, idle = 0;
    for (const auto& name : order_) {
      const NodeRec& n = nodes_.at(name);
      if (!Fits(j, n)) continue;
      usable += Usable(n) ? 1 : 0;
      idle += Idle(n) ? 1 : 0;
    }
    if (usable < j.node_count)
      return "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions";
    return required_idle && idle >= j.node_count ? "None" : "Resources";
  }
  // `scontrol update NodeName=<node> State=<state> [Reason=<reason>]` as slurmctld applies it,
  // without the bridge's guard: DRAIN (with a reason), UNDRAIN, POWER_UP.
  absl::Status UpdateLocked(const std::string& node, const std::string& state, const std::string& reason) {
    auto* n = Find(node);
    if (n == nullptr) return NoNode(node);
    if (state == "DRAIN") {
      if (reason.empty())
        return absl::InvalidArgumentError("You must specify a reason when DOWNING or DRAINING a node.");
      n->drain = true;
      SetReason(*n, reason, "root");
      writes_.push_back("DRAIN " + node + " " + reason);
      if (n->power == Power::kPoweringUp) {
        // "DRAIN/FAIL request for node ... which is allocated and being powered up. Requeuing jobs"
        for (auto& j : jobs_) {
          if (j.state != "CONFIGURING" || std::find(j.nodes.begin(), j.nodes.end(), node) == j.nodes.end()) continue;
          j.state = "PENDING";
          j.nodes.clear();
          requeued_.push_back(j.id);
        }
      }
      return absl::OkStatus();
    }
    if (state == "UNDRAIN") {
      if (!n->drain) return absl::InternalError("slurm_update error: Invalid node state specified");
      n->drain = false;
      if (!n->down) n->reason.clear();
      writes_.push_back("UNDRAIN " + node + " ");
      return absl::OkStatus();
    }
    if (state == "POWER_UP") {
      PowerUpLocked(*n);
      writes_.push_back("POWER_UP " + node + " ");
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError("Invalid node state specified");
  }
  static nlohmann::json RestEnvelope() {
    return {{"meta",
             {{"plugin", {{"type", "openapi/v0.0.39"}, {"name", "Slurm OpenAPI v0.0.39"}, {"data_parser", "v0.0.39"}}},
              {"Slurm", {{"version", {{"major", 23}, {"minor", 2}, {"micro", 7}}}, {"release", "23.02.7"}}}}},
            {"errors", nlohmann::json::array()},
            {"warnings", nlohmann::json::array()}};
  }
  static std::pair<int, nlohmann::json> RestControllerDown(nlohmann::json out) {
    out["errors"].push_back({{"error_number", 1800},
                             {"error", "Unable to contact slurm controller (connect failure)"},
                             {"description", "slurm_load_node() failed"},
                             {"source", "slurm_load_node"}});
    return {500, out};
  }
  // ResumeProgram runs; 22.05 clears the reason and waits for slurmd.
  static void PowerUpLocked(NodeRec& n) {
    n.power = Power::kPoweringUp;
    n.not_responding = true;
    n.reason.clear();
  }

  absl::Status Call() {
    ++calls_;
    if (!reachable_) {
      return absl::UnavailableError(
          "scontrol: exit 1: slurm_load_node error: Unable to contact slurm controller (connect failure)");
    }
    return absl::OkStatus();
  }
  NodeRec* Find(const std::string& name) {
    const auto it = nodes_.find(name);
    return it == nodes_.end() ? nullptr : &it->second;
  }
  static absl::Status NoNode(const std::string& name) {
    return absl::NotFoundError("scontrol: exit 1: Node " + name + " not found (Invalid node name specified)");
  }
  absl::StatusOr<slurm::SlurmNode> NodeLocked(const std::string& name) {
    if (auto s = slurm::ValidateNodeName(name); !s.ok()) return s;
    if (auto s = Call(); !s.ok()) return s;
    const auto it = nodes_.find(name);
    if (it == nodes_.end()) return NoNode(name);
    auto parsed = slurm::ParseScontrolNodes(Line(it->second));
    if (!parsed.ok()) return parsed.status();
    return parsed->front();
  }
  void SetReason(NodeRec& n, const std::string& reason, const std::string& user) {
    n.reason = reason;
    n.reason_user = user;
    n.reason_at = now_();
    n.reason_time = Time(n.reason_at);
  }
  int AllocCpus(const NodeRec& n) const {
    int alloc = 0;
    for (const auto& j : jobs_) {
      if (j.state == "PENDING" || std::find(j.nodes.begin(), j.nodes.end(), n.name) == j.nodes.end()) continue;
      alloc += j.cpus_per_node > 0 ? j.cpus_per_node : n.cpus;
    }
    return std::min(alloc, n.cpus);
  }
  std::string StateOf(const NodeRec& n) const {
    const int alloc = AllocCpus(n);
    std::string s = n.down ? "DOWN" : alloc == 0 ? "IDLE" : alloc < n.cpus ? "MIXED" : "ALLOCATED";
    if (n.completing) s += "+COMPLETING";
    if (n.drain) s += "+DRAIN";
    if (n.not_responding) s += "+NOT_RESPONDING";
    static constexpr const char* kPowerFlag[] = {"", "+POWER_DOWN", "+POWERING_DOWN", "+POWERED_DOWN", "+POWERING_UP"};
    s += kPowerFlag[static_cast<int>(n.power)];
    return s;
  }
  static std::string Time(int64_t t) {
    if (t <= 0) return "N/A";
    const time_t tt = static_cast<time_t>(t);
    std::tm tm{};
    localtime_r(&tt, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    return buf;
  }
  std::string Line(const NodeRec& n) const {
    std::string l = "NodeName=" + n.name + " Arch=x86_64 CoresPerSocket=1 CPUAlloc=" + std::to_string(AllocCpus(n)) +
                    " CPUEfctv=" + std::to_string(n.cpus) + " CPUTot=" + std::to_string(n.cpus) +
                    " CPULoad=0.00 AvailableFeatures=" + Join(n.features, "(null)") +
                    " ActiveFeatures=" + Join(n.features, "(null)") + " Gres=" + n.gres +
                    " NodeAddr=127.0.0.1 NodeHostName=" + n.name +
                    " Version=22.05.8 OS=Linux 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)"
                    "  RealMemory=1000 AllocMem=0 FreeMem=20479 Sockets=2 Boards=1 State=" +
                    StateOf(n) + " ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A" +
                    (n.partitions.empty() ? "" : " Partitions=" + Join(n.partitions));
    if (!n.reason.empty()) l += " Reason=" + n.reason + " [" + n.reason_user + "@" + n.reason_time + "]";
    return l + "\n";
  }
  // kSqueueFormat: %i|%T|%N|%D|%r|%e|%P|%V|%n|%x|%b|%f, nothing printed as 22.05 prints it.
  std::string JobLine(const FakeJob& j) const {
    return j.id + "|" + j.state + "|" + Join(j.nodes) + "|" + std::to_string(j.node_count) + "|" + ReasonOf(j) + "|" +
           Time(j.end_time) + "|" + j.partition + "|" + Time(j.submit_time) + "|" + Join(j.required) + "|" +
           Join(j.excluded) + "|" + (j.gres.empty() ? "N/A" : j.gres) + "|" +
           (j.features.empty() ? "(null)" : j.features) + "\n";
  }

  std::function<int64_t()> now_;
  mutable std::mutex mu_;
  std::map<std::string, NodeRec> nodes_;
  std::vector<std::string> order_;
  std::vector<FakeJob> jobs_;
  std::vector<std::string> writes_, ended_, requeued_;
  bool reachable_ = true;
  int next_id_ = 1;
  uint64_t calls_ = 0;
};

}  // namespace kgpu::testing
