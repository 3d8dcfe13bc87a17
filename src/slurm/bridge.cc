#include "slurm/bridge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>
#include <utility>

#include <unistd.h>

#include "common/backoff.h"
#include "common/log.h"
#include "common/process.h"
#include "common/sleep.h"
#include "common/strings.h"
#include "k8s/resources.h"

namespace kgpu::slurm {

const std::vector<std::string> kCrashPoints = {"lend-decided",    "lend-drained",     "lend-confirmed",
                                               "lend-unfenced",   "reclaim-decided",  "reclaim-fenced",
                                               "reclaim-evicted", "reclaim-undrained"};

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Kubernetes side helpers.

bool GlobMatch(std::string_view glob, std::string_view name) {
  size_t g = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (g < glob.size() && (glob[g] == '?' || glob[g] == name[n])) {
      ++g;
      ++n;
    } else if (g < glob.size() && glob[g] == '*') {
      star = g++;
      mark = n;
    } else if (star != std::string_view::npos) {
      g = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (g < glob.size() && glob[g] == '*') ++g;
  return g == glob.size();
}

namespace {

// Appends `v` unless `to` has it; true when appended.
bool AddUnique(std::vector<std::string>& to, const std::string& v) {
  if (std::find(to.begin(), to.end(), v) != to.end()) return false;
  to.push_back(v);
  return true;
}

const json& F(const json& j, const char* key) {
  return Field(j, key);
}

bool IsOurTaint(const json& t) {
  return t.is_object() && t.value("key", "") == kOwnerTaintKey && t.value("effect", "") == "NoSchedule";
}

std::string Label(const json& node, const std::string& key) {
  const auto& labels = F(node, "metadata").value("labels", json::object());
  return labels.contains(key) && labels[key].is_string() ? labels[key].get<std::string>() : "";
}

std::string Annotation(const json& node, const std::string& key) {
  const auto& a = F(node, "metadata").value("annotations", json::object());
  return a.contains(key) && a[key].is_string() ? a[key].get<std::string>() : "";
}

bool HasOurTaint(const json& node) {
  for (const auto& t : F(node, "spec").value("taints", json::array())) {
    if (IsOurTaint(t)) return true;
  }
  return false;
}

// spec.unschedulable, whoever set it.
bool Cordoned(const json& node) {
  const json& u = F(node, "spec").value("unschedulable", json(false));
  return u.is_boolean() && u.get<bool>();
}

// The phases in which an operator's reclaim request (kgpu.io/slurm-reclaim) means something: the
// node is lent or on its way to being lent. Anywhere else it has been acted on or means nothing,
// and the write that enters such a phase removes it (else it would cancel the next lend at once).
bool ReclaimRequestMeaningful(Phase p) {
  return p == Phase::kLent || p == Phase::kLendDraining || p == Phase::kLendUnfencing;
}

int64_t GpuRequest(const json& pod, const std::vector<std::string>& resources) {
  int64_t total = 0;
  for (const auto& c : F(pod, "spec").value("containers", json::array())) {
    const json req = c.value("resources", json::object());
    for (const char* kind : {"limits", "requests"}) {
      int64_t here = 0;
      const json amounts = req.value(kind, json::object());
      for (const auto& [k, v] : amounts.items()) {
        for (const auto& r : resources) {
          if (k.rfind(r, 0) != 0) continue;
          if (v.is_number_integer()) here += v.get<int64_t>();
          if (v.is_string()) here += std::max<int64_t>(1, std::atoll(v.get<std::string>().c_str()));
        }
      }
      if (here > 0) {
        total += here;
        break;  // limits and requests name the same GPUs
      }
    }
  }
  return total;
}

std::string RandomHex(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kHex[rng() % 16];
  return s;
}

bool Blocking(const SlurmJob& j) {
  const std::string& r = j.reason;
  return r == "Resources" || r.rfind("ReqNodeNotAvail", 0) == 0 || r.rfind("Nodes required for job", 0) == 0 ||
         r.rfind("Nodes_required", 0) == 0;
}

// Nodes a pending reason names ("ReqNodeNotAvail, UnavailableNodes:node[2-3]").
std::vector<std::string> NamedUnavailable(const std::string& reason) {
  const auto p = reason.find("UnavailableNodes:");
  if (p == std::string::npos) return {};
  auto hosts = ExpandHostlist(reason.substr(p + 17));
  return hosts.ok() ? *hosts : std::vector<std::string>{};
}

// What a job asked for, for the reasons we give: "2 node(s), -w gpu01, -C a100".
std::string JobAsks(const SlurmJob& j) {
  auto hosts = [](const std::vector<std::string>& v) {
    constexpr size_t kShown = 6;
    std::vector<std::string> shown(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(v.size(), kShown)));
    return Cat(Join(shown, ","), v.size() > kShown ? Cat(",... (", v.size(), ")") : "");
  };
  std::string s = Cat(std::max(j.node_count, 1), " node(s)");
  if (!j.required_nodes.empty()) s += Cat(", -w ", hosts(j.required_nodes));
  if (!j.excluded_nodes.empty()) s += Cat(", -x ", hosts(j.excluded_nodes));
  if (!j.features.empty()) s += Cat(", -C ", j.features);
  if (!j.gres.empty()) s += Cat(", --gres ", j.gres);
  return s;
}

}  // namespace

bool SlurmFencedByUs(const SlurmNode& n) {
  return IsOwnedReason(n.reason) && (n.Drain() || n.PowerDownAskedOrDone());
}

bool K8sFenced(const json& node) {
  bool taint = false;
  for (const auto& t : F(node, "spec").value("taints", json::array())) taint = taint || IsOurTaint(t);
  return taint && F(node, "spec").value("unschedulable", false);
}

void ApplyK8sFence(json& node) {
  auto& spec = node["spec"];
  if (!spec.contains("taints") || !spec["taints"].is_array()) spec["taints"] = json::array();
  bool have = false;
  for (const auto& t : spec["taints"]) have = have || IsOurTaint(t);
  if (!have) spec["taints"].push_back({{"key", kOwnerTaintKey}, {"value", kOwnerTaintValue}, {"effect", "NoSchedule"}});
  spec["unschedulable"] = true;
  auto& md = node["metadata"];
  md["labels"][kPoolLabel] = "slurm";
  md["annotations"][kScaleDownDisabled] = "true";
  md["annotations"][kKarpenterDoNotDisrupt] = "true";
}

void RemoveK8sFence(json& node, bool keep_cordon) {
  auto& spec = node["spec"];
  if (spec.contains("taints") && spec["taints"].is_array()) {
    json kept = json::array();
    for (const auto& t : spec["taints"]) {
      if (!IsOurTaint(t)) kept.push_back(t);
    }
    if (kept.empty()) {
      spec.erase("taints");
    } else {
      spec["taints"] = kept;
    }
  }
  if (!keep_cordon) spec.erase("unschedulable");
  auto& md = node["metadata"];
  md["labels"][kPoolLabel] = "lent";
  if (md.contains("annotations")) {
    md["annotations"].erase(kScaleDownDisabled);
    md["annotations"].erase(kKarpenterDoNotDisrupt);
  }
}

Lease LeaseOf(const json& node, std::string* error) {
  const std::string text = Annotation(node, kLeaseAnnotation);
  if (text.empty()) return Lease{};
  auto l = ParseLease(text);
  if (!l.ok()) {
    if (error) *error = std::string(l.status().message());
    return Lease{};
  }
  return *l;
}

// ---------------------------------------------------------------------------------------------

struct Bridge::Facts {
  std::string name;
  json node;
  Lease lease;
  std::string lease_error;
  std::optional<SlurmNode> slurm;  // nullopt: Slurm unreachable (or the node unknown to it)
  std::vector<SlurmJob> jobs;      // holding this node
  std::vector<Pod> pods;
  std::string frozen;
  bool cancel = false;  // the policy cancels this lend
  std::string cancel_why;
  bool Ours() const { return slurm && slurm->Drain() && IsOwnedReason(slurm->reason); }
  bool Foreign() const { return slurm && slurm->Drain() && !IsOwnedReason(slurm->reason); }
  // Our power-down (the power-save lend): requested, in progress or done, with our reason.
  bool PowerFenced() const { return slurm && IsOwnedReason(slurm->reason) && slurm->PowerDownAskedOrDone(); }
  bool SlurmFenced() const { return slurm && SlurmFencedByUs(*slurm); }
  // The power-save lend: Slurm gave the powered-down node to a job (MIXED+POWERED_DOWN, then
  // POWERING_UP once ResumeProgram ran; 22.05 clears the reason) or was told POWER_UP: it wants
  // the node back. The job waits in CONFIGURING until slurmd registers. A DRAIN now would requeue
  // it ("DRAIN/FAIL request for node ... being powered up. Requeuing jobs"): never drain then.
  bool SlurmWantsBack() const {
    return slurm && (slurm->PoweringUp() || (slurm->PoweredDown() && (slurm->Busy() || !jobs.empty())));
  }
};

Bridge::Bridge(SlurmClient& slurm, k8s::Client& kube, BridgeOptions options, k8s::EventRecorder* events,
               std::ostream* dry_run_out, Clock clock)
    : slurm_(slurm),
      kube_(kube),
      opts_(std::move(options)),
      events_(events),
      dry_out_(dry_run_out),
      clock_(clock ? std::move(clock) : Clock([] { return static_cast<int64_t>(std::time(nullptr)); })) {
  DeclareMetrics();
}

void Bridge::DeclareMetrics() {
  using T = prom::MetricsRegistry::Type;
  const std::tuple<const char*, T, const char*> families[] = {
      {"kgpu_slurm_bridge_slurm_up", T::kGauge, "1 when the last reconcile read Slurm (scontrol or slurmrestd)."},
      {"kgpu_slurm_bridge_api_up", T::kGauge, "1 when the last reconcile read the Kubernetes API."},
      {"kgpu_slurm_bridge_unschedulable_gpu_pods", T::kGauge,
       "1 when GPU pods are Unschedulable for want of GPUs (a reason to reclaim lent capacity)."},
      {"kgpu_slurm_bridge_blocked_slurm_jobs", T::kGauge, "Pending Slurm jobs that lent nodes could run."},
      {"kgpu_slurm_bridge_frozen_nodes", T::kGauge,
       "Nodes whose transition waits because one side cannot be read or written."},
      {"kgpu_slurm_bridge_nodes", T::kGauge, "Managed nodes by lending phase (LOST: its Node object is gone)."},
      {"kgpu_slurm_bridge_reconcile_seconds", T::kGauge, "Duration of the last reconcile."},
      {"kgpu_slurm_bridge_reconciles_total", T::kCounter, "Reconciles run."},
      {"kgpu_slurm_bridge_frozen_total", T::kCounter, "Reconciles that froze every transition, by the side unread."},
      {"kgpu_slurm_bridge_write_conflicts_total", T::kCounter,
       "Node writes refused with 409 (another writer changed the node first); the bridge recomputes."},
      {"kgpu_slurm_bridge_transitions_total", T::kCounter, "Lending-phase transitions, by the phase entered."},
      {"kgpu_slurm_bridge_reclaim_requests_removed_total", T::kCounter,
       "Reclaim requests (annotations) removed: acted on, or on a node not lent."},
      {"kgpu_slurm_bridge_resume_commands_total", T::kCounter, "Power-save resume commands run, by result."},
      {"kgpu_slurm_bridge_evictions_total", T::kCounter,
       "Pod evictions from reclaimed nodes: evicted, refused (a PodDisruptionBudget), error, forced."},
  };
  for (const auto& [name, type, help] : families) metrics_.Declare(name, type, help);
}

bool Bridge::Allowed(const std::string& node) const {
  if (opts_.allowed.empty()) return true;
  return std::any_of(opts_.allowed.begin(), opts_.allowed.end(),
                     [&](const std::string& g) { return GlobMatch(g, node); });
}

void Bridge::Count(const std::string& metric, const prom::Labels& labels) {
  metrics_.Add(metric, labels);
}

void Bridge::CrashPoint(const std::string& point) {
  if (opts_.crash_at.empty() || opts_.crash_at != point) return;
  Log("slurm")->warn("crash-at {}: exiting now (fault injection)", point);
  Log("slurm")->flush();
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(86);
}

void Bridge::Event(const Facts& f, const std::string& type, const std::string& reason, const std::string& note) {
  (type == "Warning" ? Log("slurm")->warn("{}: {}: {}", f.name, reason, note)
                     : Log("slurm")->info("{}: {}: {}", f.name, reason, note));
  if (events_ == nullptr || opts_.dry_run) return;
  k8s::ObjectRef ref;
  ref.kind = "Node";
  ref.name = f.name;
  ref.uid = F(f.node, "metadata").value("uid", "");
  if (auto s = events_->Record(ref, type, reason, "SlurmLending", note); !s.ok()) {
    Log("slurm")->debug("event {} on {} not recorded: {}", reason, f.name, std::string(s.message()));
  }
}

Lease Bridge::NextLease(const Facts& f, Phase phase, const std::string& why) const {
  Lease l = f.lease;
  if (l.phase != phase) l.since = clock_();
  l.phase = phase;
  l.generation = f.lease.generation + 1;
  l.why = why;
  l.holder = opts_.identity;
  return l;
}

bool Bridge::WriteNode(Facts& f, const Lease& lease, const std::function<void(json&)>& mutate,
                       const std::string& what) {
  if (opts_.dry_run) {
    if (dry_out_)
      *dry_out_ << "[dry-run] " << f.name << ": would " << what << " (lease " << PhaseName(lease.phase) << ")\n";
    return false;
  }
  json node = f.node;
  if (mutate) mutate(node);
  // An operator's reclaim request is removed by the write that acts on it (the node leaves a lent
  // or lending phase) or, when it means nothing (the node is not lent), by the next write; the
  // compare-and-swap makes a request set after our read survive (409, recomputed).
  const std::string request = Annotation(f.node, kReclaimAnnotation);
  const bool drop_request = !request.empty() && !ReclaimRequestMeaningful(lease.phase);
  if (drop_request && node["metadata"].contains("annotations"))
    node["metadata"]["annotations"].erase(kReclaimAnnotation);
  node["metadata"]["annotations"][kLeaseAnnotation] = SerializeLease(lease);
  auto r = kube_.Update(k8s::FindResource("nodes")->Path("", f.name), node);
  if (!r.ok()) {
    if (k8s::IsApiConflict(r.status())) {
      Count("kgpu_slurm_bridge_write_conflicts_total");
      f.frozen = "the Node changed under us (409): recomputing next time";
    } else {
      f.frozen = Cat("cannot write the Node: ", r.status().message());
    }
    Log("slurm")->warn("{}: {}: {}", f.name, what, f.frozen);
    return false;
  }
  if (lease.phase != f.lease.phase) {
    Count("kgpu_slurm_bridge_transitions_total", {{"to", PhaseName(lease.phase)}});
    Log("slurm")->info("{}: {} -> {} (gen {}): {}", f.name, PhaseName(f.lease.phase), PhaseName(lease.phase),
                       lease.generation, lease.why);
  }
  const Phase was = f.lease.phase;
  f.node = std::move(*r);
  f.lease = lease;
  if (drop_request) {
    const bool acted = ReclaimRequestMeaningful(was);
    const bool reclaiming = lease.phase == Phase::kReclaimFencing || lease.phase == Phase::kReclaimEvicting ||
                            lease.phase == Phase::kReclaimUnfencing;
    Count("kgpu_slurm_bridge_reclaim_requests_removed_total", {{"why", acted ? "acted-on" : "not-lent"}});
    Event(f, "Normal", "ReclaimRequestRemoved",
          acted ? Cat("reclaim request '", request, "' acted on: ", PhaseName(was), " -> ", PhaseName(lease.phase),
                      " (", lease.why, "); annotation ", kReclaimAnnotation, " removed")
                : Cat("reclaim request '", request, "' ignored and removed: the node is ", PhaseName(lease.phase),
                      reclaiming ? ", already being reclaimed" : ", not lent to Kubernetes", " (annotation ",
                      kReclaimAnnotation, ")"));
  }
  return true;
}

bool Bridge::SlurmWantsItBack(Facts& f) {
  Lease l = NextLease(f, Phase::kReclaimUnfencing,
                      Cat("lend cancelled: Slurm wants it back (gave it to a job; State=", f.slurm->state, ")"));
  l.requested_by = "slurm-resume";
  if (!WriteNode(f, l, ApplyK8sFence, "cancel the lend (Slurm powers it up)")) return false;
  Event(f, "Normal", "LendCancelled", l.why);
  return true;
}

void Bridge::RunResumeCommand(Facts& f) {
  if (opts_.resume_command.empty()) return;  // the node registers on its own (a real power-on)
  ReapResumeCommand(f);
  if (resume_runs_.contains(f.name)) return;  // still running
  const auto now = std::chrono::steady_clock::now();
  if (auto it = resumed_at_.find(f.name); it != resumed_at_.end() && now - it->second < opts_.resume_retry) return;
  std::vector<std::string> argv = opts_.resume_command;
  for (auto& a : argv) {
    for (size_t at = a.find("{node}"); at != std::string::npos; at = a.find("{node}", at + f.name.size())) {
      a.replace(at, 6, f.name);
    }
  }
  resumed_at_[f.name] = now;
  if (opts_.dry_run) {
    if (dry_out_) *dry_out_ << "[dry-run] " << f.name << ": would run " << CommandLine(argv) << "\n";
    return;
  }
  ProcessOptions po;
  po.timeout = opts_.resume_timeout;
  po.cancel = stopping_.get();
  Log("slurm")->info("{}: running the resume command {} (Kubernetes is empty)", f.name, CommandLine(argv));
  resume_runs_[f.name] = {
      argv, std::async(std::launch::async, [argv, po, keep = stopping_] { return RunProcess(argv, po); })};
}

Bridge::~Bridge() {
  stopping_->store(true);
  resume_runs_.clear();  // each future waits for its run, killed now
}

void Bridge::ReapResumeCommand(const Facts& f) {
  auto run = resume_runs_.find(f.name);
  if (run == resume_runs_.end() || run->second.done.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return;
  const std::vector<std::string> argv = std::move(run->second.argv);
  const absl::StatusOr<ProcessResult> r = run->second.done.get();
  resume_runs_.erase(run);
  resumed_at_[f.name] = std::chrono::steady_clock::now();  // --resume-retry counts from the end of a run
  const bool ok = r.ok() && r->exit_code == 0 && !r->timed_out;
  Count("kgpu_slurm_bridge_resume_commands_total", {{"result", ok ? "ok" : "failed"}});
  std::string detail;
  if (!r.ok()) {
    detail = Cat(": cannot run it: ", r.status().message());
  } else if (!ok) {
    std::string err = r->err.size() > 300 ? r->err.substr(r->err.size() - 300) : r->err;
    while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
    detail = r->timed_out ? Cat(": no exit within ", opts_.resume_timeout.count(), " s")
                          : Cat(": exit ", r->exit_code, err.empty() ? "" : Cat(": ", Printable(err)));
  }
  if (!ok) Log("slurm")->warn("{}: the resume command {} failed{}", f.name, CommandLine(argv), detail);
  Event(f, ok ? "Normal" : "Warning", ok ? "ResumeCommand" : "ResumeCommandFailed",
        Cat(CommandLine(argv), detail,
            ok ? " (Kubernetes is empty: slurmd may register)" : Cat("; again in ", opts_.resume_retry.count(), " s")));
}

// One idempotent step for one node, chosen from its lease and what both systems say now.
// Returns true when something changed (the caller steps again).
bool Bridge::Step(Facts& f, ReconcileResult& result) {
  auto log = Log("slurm");
  const std::string reason = OwnedReason(f.lease.op);
  auto slurm_write = [&](const std::string& what, const std::function<absl::StatusOr<SlurmNode>()>& fn) -> bool {
    if (opts_.dry_run) {
      if (dry_out_) *dry_out_ << "[dry-run] " << f.name << ": would " << what << "\n";
      return false;
    }
    auto n = fn();
    if (!n.ok()) {
      f.frozen = Cat(what, ": ", n.status().message());
      log->warn("{}: {}", f.name, f.frozen);
      if (absl::IsUnavailable(n.status())) f.slurm.reset();
      return false;
    }
    f.slurm = *n;
    return true;
  };
  switch (f.lease.phase) {
    case Phase::kSlurm: {
      const bool adopt = f.lease.generation == 0;
      if (adopt || !K8sFenced(f.node) || Label(f.node, kPoolLabel) != "slurm" ||
          Annotation(f.node, kScaleDownDisabled) != "true") {
        Lease l = NextLease(f, Phase::kSlurm, adopt ? "adopted: Slurm owns it" : "Kubernetes fence restored");
        if (!f.lease_error.empty()) l.why += Cat(" (the old lease was unreadable: ", f.lease_error, ")");
        // Cordoned without our taint before we ever fenced it: an admin's cordon (kubectl cordon or
        // drain). Our fence goes on top; the lease remembers that the cordon is not ours to lift.
        const bool admin_cordon = adopt && Cordoned(f.node) && !HasOurTaint(f.node);
        // Uncordoned after we fenced it: the only cordon the admin can lift on a Slurm-owned node
        // is "theirs" (ours goes straight back on).
        const bool cordon_lifted = !adopt && f.lease.admin_cordoned && !Cordoned(f.node);
        if (admin_cordon) {
          l.admin_cordoned = true;
          l.why += "; it was cordoned by someone else: not lent until they uncordon it";
        }
        if (cordon_lifted) l.admin_cordoned = false;
        if (adopt && f.Foreign()) {
          l.prev_slurm_reason = f.slurm->reason;
          l.admin_drained = true;
        }
        if (!WriteNode(f, l, ApplyK8sFence, "fence it for Slurm (taint kgpu.io/owner=slurm:NoSchedule, cordon)"))
          return false;
        if (admin_cordon) {
          Event(f, "Warning", "AdminCordon",
                "the node was cordoned (spec.unschedulable) before the bridge fenced it: the bridge will not uncordon "
                "or lend it until an admin uncordons it");
        }
        if (cordon_lifted) {
          Event(f, "Normal", "AdminCordonLifted",
                "an admin uncordoned the node: the bridge's own fence is back on and the node may be lent again");
        }
        return true;
      }
      if (!Annotation(f.node, kReclaimAnnotation).empty()) {
        return WriteNode(f, NextLease(f, Phase::kSlurm, f.lease.why), nullptr, "remove a reclaim request (not lent)");
      }
      if (opts_.power_save && f.slurm && f.slurm->PoweringUp() && f.pods.empty()) {
        // Powered up while Slurm's (an admin's POWER_UP, or a job given a node whose power-down
        // outlived its lend): Kubernetes is fenced and empty, so slurmd may register.
        RunResumeCommand(f);
        f.frozen = Cat("Slurm is powering it up (State=", f.slurm->state, "): waiting for slurmd to register");
        return false;
      }
      if (opts_.power_save && f.PowerFenced() && f.pods.empty() && f.lease.generation > 0) {
        // Our power-down with no lend in progress: Kubernetes is fenced and empty; R3 powers it up.
        Lease l = NextLease(
            f, Phase::kReclaimUnfencing,
            Cat("a kgpu-lend power-down without a lend in progress (State=", f.slurm->state, "): powering it up"));
        if (l.op.empty()) l.op = f.slurm->reason.substr(std::string_view(kOwnedReasonPrefix).size());  // R3 needs one
        if (!WriteNode(f, l, nullptr, "bring a stale power-down back")) return false;
        Event(f, "Warning", "StaleDrainCleared", l.why);
        return true;
      }
      if (f.Ours() && f.pods.empty() && f.lease.generation > 0) {
        // Our drain with no lend in progress (a lease edited by hand, or lost): Kubernetes is
        // fenced and empty, so Slurm may have the node back.
        if (slurm_write("clear a stale kgpu-lend drain", [&] { return slurm_.Undrain(f.name, kOwnedReasonPrefix); })) {
          Event(f, "Warning", "StaleDrainCleared", "a kgpu-lend drain without a lend in progress was cleared");
          return true;
        }
      }
      if (!f.pods.empty()) {
        f.frozen = Cat(f.pods.size(), " pod(s) on a Slurm-owned node (placed around the fence?): not touched");
      }
      return false;
    }
    case Phase::kLendDraining: {
      if (!f.slurm) {
        f.frozen = "Slurm unreachable: lend frozen";
        return false;
      }
      if (opts_.power_save && f.SlurmWantsBack()) return SlurmWantsItBack(f);
      if (f.Foreign()) {
        Lease l = NextLease(f, Phase::kSlurm, Cat("lend cancelled: an admin drained it ('", f.slurm->reason, "')"));
        l.prev_slurm_reason = f.slurm->reason;
        l.admin_drained = true;
        if (!WriteNode(f, l, ApplyK8sFence, "cancel the lend (foreign drain)")) return false;
        Event(f, "Warning", "ForeignDrain", l.why);
        return true;
      }
      if (f.cancel && f.PowerFenced()) {
        // Slurm 22.05 cannot cancel POWER_DOWN_ASAP (RESUME is refused; UNDRAIN leaves the
        // power-down pending, and the node powers down when its jobs end): R3 powers it up again
        // once it is down. Kubernetes stays fenced.
        Lease l = NextLease(f, Phase::kReclaimUnfencing,
                            Cat("lend cancelled: ", f.cancel_why, " (powered up again once down)"));
        if (!WriteNode(f, l, ApplyK8sFence, "cancel the lend (power-save)")) return false;
        Event(f, "Normal", "LendCancelled", l.why);
        f.cancel = false;
        return true;
      }
      if (f.cancel) {
        if (f.Ours() &&
            !slurm_write("undrain (lend cancelled)", [&] { return slurm_.Undrain(f.name, kOwnedReasonPrefix); })) {
          return false;
        }
        if (f.slurm->Drain()) return false;
        if (!WriteNode(f, NextLease(f, Phase::kSlurm, Cat("lend cancelled: ", f.cancel_why)), ApplyK8sFence,
                       "cancel the lend")) {
          return false;
        }
        Event(f, "Normal", "LendCancelled", f.cancel_why);
        f.cancel = false;
        return true;
      }
      if (opts_.power_save ? !f.PowerFenced() || f.slurm->reason != reason
                           : !f.slurm->Drain() || f.slurm->reason != reason) {
        const bool ok = opts_.power_save
                            ? slurm_write(Cat("power down (State=POWER_DOWN_ASAP Reason=", reason, ")"),
                                          [&] { return slurm_.PowerDown(f.name, reason, kOwnedReasonPrefix); })
                            : slurm_write(Cat("drain (Reason=", reason, ")"),
                                          [&] { return slurm_.Drain(f.name, reason, kOwnedReasonPrefix); });
        if (!ok) return false;
        CrashPoint("lend-drained");
        return true;
      }
      // The jobs seen on the draining node go into the lease at once: it is re-read every reconcile,
      // and they are the record that the lend waited for them.
      Lease seen = NextLease(f, f.lease.phase, f.lease.why);
      bool new_jobs = false;
      for (const auto& j : f.jobs) new_jobs |= AddUnique(seen.jobs_seen, j.id);
      if (new_jobs) return WriteNode(f, seen, nullptr, "record the Slurm jobs on the draining node");
      if (f.slurm->Busy() || !f.jobs.empty()) {
        empty_since_.erase(f.name);
        f.frozen = Cat("waiting for ", f.jobs.size(), " Slurm job(s) to end on their own (State=", f.slurm->state, ")");
        return false;
      }
      if (opts_.power_save && !f.slurm->PoweringDown() && !f.slurm->PoweredDown()) {
        // Slurm says the node is empty by powering it down (SuspendProgram), about 1 s after its
        // last job: that, not our own reading of squeue, starts the confirmation.
        empty_since_.erase(f.name);
        f.frozen = Cat("empty; waiting for Slurm to power it down (State=", f.slurm->state, ")");
        return false;
      }
      const auto now = std::chrono::steady_clock::now();
      auto it = empty_since_.find(f.name);
      if (it == empty_since_.end()) it = empty_since_.emplace(f.name, now).first;
      if (now - it->second < opts_.confirm_gap) {
        f.frozen = "drained and empty once; confirming";
        // The second read is due confirm_gap after the first: Run() comes back then, not at
        // the next interval.
        const auto due = it->second + opts_.confirm_gap;
        recheck_at_ = recheck_at_ ? std::min(*recheck_at_, due) : due;
        return false;
      }
      // The second read, at least confirm_gap later: scontrol's flags and squeue -w both.
      auto again = slurm_.Node(f.name);
      auto on = slurm_.JobsOnNode(f.name);
      if (!again.ok() || !on.ok()) {
        f.frozen = Cat("Slurm unreachable while confirming: ", (!again.ok() ? again.status() : on.status()).message());
        return false;
      }
      f.slurm = *again;
      if (!f.SlurmFenced() || f.slurm->Busy() || !on->empty()) {
        empty_since_.erase(f.name);
        return false;
      }
      empty_since_.erase(f.name);
      if (!WriteNode(f, NextLease(f, Phase::kLendUnfencing, Cat("drained and empty (State=", f.slurm->state, ")")),
                     nullptr, "record that Slurm is drained and empty")) {
        return false;
      }
      CrashPoint("lend-confirmed");
      return true;
    }
    case Phase::kLendUnfencing: {
      if (!f.slurm) {
        f.frozen = "Slurm unreachable: the Kubernetes fence stays";
        return false;
      }
      if (f.Foreign()) {
        Lease l = NextLease(f, Phase::kSlurm, Cat("lend cancelled: an admin drained it ('", f.slurm->reason, "')"));
        l.admin_drained = true;
        l.prev_slurm_reason = f.slurm->reason;
        if (!WriteNode(f, l, ApplyK8sFence, "cancel the lend (foreign drain)")) return false;
        Event(f, "Warning", "ForeignDrain", l.why);
        return true;
      }
      if (opts_.power_save && f.SlurmWantsBack()) return SlurmWantsItBack(f);
      if (!f.SlurmFenced() || f.slurm->Busy() || !f.jobs.empty()) {
        return WriteNode(
            f,
            NextLease(f, Phase::kLendDraining,
                      Cat("Slurm is not drained and empty any more (State=", f.slurm->state, "): draining again")),
            nullptr, "go back to draining");
      }
      Lease l = NextLease(f, Phase::kLent, "lent to Kubernetes");
      if (opts_.lend_duration.count() > 0) l.lent_until = clock_() + opts_.lend_duration.count();
      const bool keep_cordon =
          f.lease.admin_cordoned;  // never lift an admin's cordon (the policy does not lend such nodes)
      if (!WriteNode(
              f, l, [keep_cordon](json& n) { RemoveK8sFence(n, keep_cordon); },
              "unfence it for Kubernetes (remove the taint, uncordon, pool=lent)")) {
        return false;
      }
      Event(f, "Normal", "Lent",
            Cat("lent to Kubernetes; Slurm keeps ", f.PowerFenced() ? "it powered down with" : "DRAIN",
                " Reason=", reason));
      CrashPoint("lend-unfenced");
      return true;
    }
    case Phase::kLent: {
      // We uncordoned it when we lent it: a cordon now is an admin's (kubectl cordon or drain), and
      // an uncordon after one lifts it. Kubernetes-only: done whether Slurm answers or not.
      if (Cordoned(f.node) != f.lease.admin_cordoned) {
        Lease l = NextLease(f, Phase::kLent, f.lease.why);
        l.admin_cordoned = Cordoned(f.node);
        if (!WriteNode(f, l, nullptr,
                       l.admin_cordoned ? "note the admin's cordon" : "note that the admin's cordon is lifted")) {
          return false;
        }
        if (l.admin_cordoned) {
          Event(f, "Warning", "AdminCordon",
                "an admin cordoned the lent node: the bridge will not uncordon it (a reclaim keeps it cordoned, and it "
                "is not lent again until an admin uncordons it)");
        } else {
          Event(f, "Normal", "AdminCordonLifted", "an admin uncordoned the lent node");
        }
        return true;
      }
      if (!f.slurm) return false;  // LENT stays LENT: Slurm's DRAIN is durable
      // Slurm gave the powered-down node to a job: the policy reclaims it now, and slurmd registers
      // only when R3 runs the resume command, after Kubernetes is empty. Powered down (whatever the
      // reason says) it runs no job: only a node that is neither drained nor powered down needs
      // our drain back.
      if (opts_.power_save && f.SlurmWantsBack()) return false;
      if (!f.slurm->Drain() && !(opts_.power_save && f.slurm->PowerSaving())) {
        if (!slurm_write("restore the Slurm drain", [&] { return slurm_.Drain(f.name, reason, kOwnedReasonPrefix); })) {
          return false;
        }
        Event(f, "Warning", "SlurmFenceRestored", "the node was lent but not drained in Slurm: drained again");
        return true;
      }
      if (f.Ours() && f.lease.admin_drained) {
        // The admin's drain is gone (they resumed the node and ours went back on): nothing of
        // theirs is left for the reclaim to keep.
        Lease l = NextLease(f, Phase::kLent, f.lease.why);
        l.admin_drained = false;
        if (!WriteNode(f, l, nullptr, "note that the admin's drain is gone")) return false;
        Event(f, "Normal", "AdminDrainLifted",
              Cat("the admin's drain is gone; Slurm keeps DRAIN Reason=", f.slurm->reason));
        return true;
      }
      if (f.Foreign() && !f.lease.admin_drained) {
        Lease l = NextLease(
            f, Phase::kLent,
            Cat("lent; an admin drained it meanwhile ('", f.slurm->reason, "'): the reclaim will leave it drained"));
        l.admin_drained = true;
        l.prev_slurm_reason = f.slurm->reason;
        l.since = f.lease.since;
        if (!WriteNode(f, l, nullptr, "note the admin's drain")) return false;
        Event(f, "Warning", "ForeignDrain", l.why);
        return true;
      }
      return false;
    }
    case Phase::kReclaimFencing: {
      Lease l = NextLease(f, Phase::kReclaimEvicting, f.lease.why);
      // Lent nodes are uncordoned by us: a cordon found here is an admin's, and it stays theirs.
      if (Cordoned(f.node)) l.admin_cordoned = true;
      if (!WriteNode(f, l, ApplyK8sFence, "fence it for Slurm (taint, cordon)")) return false;
      CrashPoint("reclaim-fenced");
      return true;
    }
    case Phase::kReclaimEvicting: {
      if (!Annotation(f.node, kReclaimAnnotation).empty()) {
        return WriteNode(f, NextLease(f, f.lease.phase, f.lease.why), nullptr, "remove a reclaim request (reclaiming)");
      }
      if (!K8sFenced(f.node)) {
        return WriteNode(f, NextLease(f, Phase::kReclaimEvicting, f.lease.why), ApplyK8sFence, "restore the fence");
      }
      if (f.pods.empty()) {
        if (!WriteNode(f, NextLease(f, Phase::kReclaimUnfencing, "no pods left"), nullptr,
                       "record that no pods are left")) {
          return false;
        }
        CrashPoint("reclaim-evicted");
        return true;
      }
      const auto now = std::chrono::steady_clock::now();
      const bool force =
          opts_.force_delete_after.count() > 0 && clock_() - f.lease.since >= opts_.force_delete_after.count();
      size_t refused = 0;
      Lease record = NextLease(f, f.lease.phase, f.lease.why);  // the pods evicted now, written after the loop
      bool evicted = false;
      for (const auto& p : f.pods) {
        if (p.terminating) continue;
        const std::string key = p.ns + "/" + p.name;
        auto retry =
            evict_backoff_.try_emplace(key, EvictRetry{now, Backoff(opts_.interval, std::chrono::seconds(10))});
        auto& [next, backoff] = retry.first->second;
        if (now < next) continue;
        if (opts_.dry_run) {
          if (dry_out_) *dry_out_ << "[dry-run] " << f.name << ": would evict pod " << key << "\n";
          continue;
        }
        if (force) {
          auto d = kube_.Delete(k8s::FindResource("pods")->Path(p.ns, p.name));
          Count("kgpu_slurm_bridge_evictions_total", {{"result", "forced"}});
          Event(f, "Warning", "ForcedDelete",
                Cat("pod ", key, " deleted after ", opts_.force_delete_after.count(), " s of refused evictions",
                    d.ok() ? "" : Cat(": ", d.status().message())));
          continue;
        }
        k8s::EvictOptions eo;
        eo.max_wait = std::chrono::milliseconds(0);
        auto s = kube_.Evict(p.ns, p.name, eo);
        if (s.ok()) {
          Count("kgpu_slurm_bridge_evictions_total", {{"result", "evicted"}});
          evicted |= AddUnique(record.pods_evicted, key);
          evict_backoff_.erase(key);
        } else {
          const bool pdb = absl::IsDeadlineExceeded(s) || k8s::HttpStatus(s) == 429;
          Count("kgpu_slurm_bridge_evictions_total", {{"result", pdb ? "refused" : "error"}});
          ++refused;
          next = now + backoff.Next();
          Event(f, "Warning", pdb ? "EvictionBlocked" : "EvictionFailed", Cat("pod ", key, ": ", s.message()));
        }
      }
      if (evicted) WriteNode(f, record, nullptr, "record the evicted pods");
      f.frozen =
          Cat("waiting for ", f.pods.size(), " pod(s) to leave", refused ? Cat(" (", refused, " refused now)") : "");
      return false;
    }
    case Phase::kReclaimUnfencing: {
      if (!Annotation(f.node, kReclaimAnnotation).empty()) {
        return WriteNode(f, NextLease(f, f.lease.phase, f.lease.why), nullptr, "remove a reclaim request (reclaiming)");
      }
      if (!K8sFenced(f.node)) {
        return WriteNode(f, NextLease(f, Phase::kReclaimEvicting, "the Kubernetes fence was gone: fenced again"),
                         ApplyK8sFence, "restore the fence");
      }
      if (!f.pods.empty()) {
        return WriteNode(f, NextLease(f, Phase::kReclaimEvicting, "pods appeared again"), nullptr, "evict again");
      }
      if (!f.slurm) {
        f.frozen = "Slurm unreachable: reclaim frozen (Slurm keeps its drain)";
        return false;
      }
      if (f.Foreign() || (f.lease.admin_drained && f.slurm->Drain())) {
        Lease l =
            NextLease(f, Phase::kSlurm, Cat("back with Slurm, left drained for the admin ('", f.slurm->reason, "')"));
        l.admin_drained = true;
        if (!WriteNode(f, l, nullptr, "hand it back to Slurm (admin drain kept)")) return false;
        Event(f, "Warning", "ReclaimedAdminDrain", l.why);
        return true;
      }
      if (opts_.power_save && f.slurm->PowerSaving() && !f.Foreign() && !(f.lease.admin_drained && f.slurm->Drain())) {
        if (f.slurm->PoweredDown() && (f.slurm->Busy() || !f.jobs.empty())) {
          // Slurm gave it to a job and runs ResumeProgram in a moment: no POWER_UP of ours.
          f.frozen = Cat("Slurm gave it to a job (State=", f.slurm->state, "): waiting for its ResumeProgram");
          return false;
        }
        if (f.slurm->PoweringUp()) {
          // Kubernetes is empty and fenced: now slurmd may register (as rebooted) and the job start.
          RunResumeCommand(f);
          f.frozen = Cat("waiting for slurmd to register as rebooted (State=", f.slurm->state, ")");
          return false;
        }
        if (!f.slurm->PoweredDown()) {
          f.frozen =
              Cat("waiting for Slurm to finish powering it down before the power-up (State=", f.slurm->state, ")");
          return false;
        }
        if (f.slurm->PowerUpRequested()) {
          f.frozen = Cat("POWER_UP asked for: waiting for Slurm to run ResumeProgram (State=", f.slurm->state, ")");
          return false;
        }
        // A drain of ours would outlive the power-up with its reason cleared (22.05 clears
        // Reason= on POWER_UP), and look like an admin's: lift it first; the power-down fences.
        if (f.Ours() &&
            !slurm_write("undrain before the power-up", [&] { return slurm_.Undrain(f.name, kOwnedReasonPrefix); })) {
          return false;
        }
        if (!slurm_write("power up (State=POWER_UP: Slurm runs ResumeProgram)",
                         [&] { return slurm_.PowerUp(f.name, kOwnedReasonPrefix); })) {
          return false;
        }
        CrashPoint("reclaim-undrained");  // the power-save lend's Slurm unfence
        return f.slurm->PoweringUp();     // else POWER_UP is pending: waited for above, never asked again
      }
      resumed_at_.erase(f.name);
      if (!f.slurm->Drain()) {
        Lease l = NextLease(f, Phase::kSlurm, "returned to Slurm");
        l.admin_drained = false;
        if (!WriteNode(f, l, nullptr, "record the return to Slurm")) return false;
        Event(f, "Normal", "Reclaimed", "returned to Slurm");
        return true;
      }
      if (!f.slurm->Responding()) {
        f.frozen = Cat("waiting for slurmd to register before the undrain (State=", f.slurm->state, ")");
        return false;
      }
      if (!slurm_write("undrain", [&] { return slurm_.Undrain(f.name, kOwnedReasonPrefix); })) return false;
      CrashPoint("reclaim-undrained");
      if (f.slurm->Drain()) {
        f.frozen = Cat("the undrain did not take (State=", f.slurm->state, ")");
        return false;
      }
      return true;
    }
  }
  (void)result;
  return false;
}

std::string LostWhy(std::string_view node, std::string_view reason) {
  return Cat("no Node object with ", kPoolLabel, " is named ", node, ": Slurm's drain (", reason,
             ") stays; a Node that ", "registers again with ", kPoolLabel,
             "=slurm is adopted, or undrain it in Slurm if the machine is gone for good");
}

ReconcileResult Bridge::Reconcile() {
  auto log = Log("slurm");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t now = clock_();
  ReconcileResult result;
  recheck_at_.reset();
  Count("kgpu_slurm_bridge_reconciles_total");
  const bool first = !std::exchange(first_done_, true);
  auto elapsed_ms = [&t0] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  };
  if (first) log->info("first reconcile: reading Slurm's nodes and jobs");

  // --- observe Slurm
  std::map<std::string, SlurmNode> snodes;
  std::vector<SlurmJob> jobs;
  {
    auto n = slurm_.Nodes();
    auto j = n.ok() ? slurm_.Jobs() : absl::StatusOr<std::vector<SlurmJob>>(n.status());
    result.slurm_ok = n.ok() && j.ok();
    if (result.slurm_ok) {
      for (auto& x : *n) snodes[x.name] = std::move(x);
      jobs = std::move(*j);
      if (first) {
        log->info(
            "first reconcile: Slurm has {} node(s) and {} job(s) ({} ms); reading Kubernetes' {} nodes and "
            "every pod",
            snodes.size(), jobs.size(), elapsed_ms(), kPoolLabel);
      }
      if (!slurm_down_said_.empty()) {
        log->info("Slurm reachable again after {} reconcile(s)", slurm_down_reconciles_);
        slurm_down_said_.clear();
        slurm_down_reconciles_ = 0;
      }
    } else {
      Count("kgpu_slurm_bridge_frozen_total", {{"side", "slurm"}});
      ++slurm_down_reconciles_;
      const std::string why((!n.ok() ? n.status() : j.status()).message());
      if (why != slurm_down_said_) {  // once, and again when the reason changes
        log->warn(
            "Slurm unreachable: {}: every transition that needs it is frozen (said once; "
            "kgpu_slurm_bridge_frozen_total{{side=\"slurm\"}} counts the reconciles)",
            why);
        slurm_down_said_ = why;
      }
    }
  }
  // --- observe Kubernetes
  k8s::ListOptions lo;
  lo.label_selector = kPoolLabel;
  auto knodes = kube_.List(k8s::FindResource("nodes")->Path(), lo);
  auto kpods = knodes.ok() ? kube_.List(k8s::FindResource("pods")->Path()) : absl::StatusOr<json>(knodes.status());
  result.k8s_ok = knodes.ok() && kpods.ok();
  if (first && result.k8s_ok) {
    log->info("first reconcile: Kubernetes has {} {} node(s) and {} pod(s) ({} ms)", F(*knodes, "items").size(),
              kPoolLabel, F(*kpods, "items").size(), elapsed_ms());
  }
  if (result.k8s_ok && !k8s_down_said_.empty()) {
    log->info("API server reachable again after {} reconcile(s)", k8s_down_reconciles_);
    k8s_down_said_.clear();
    k8s_down_reconciles_ = 0;
  }
  if (!result.k8s_ok) {
    Count("kgpu_slurm_bridge_frozen_total", {{"side", "k8s"}});
    ++k8s_down_reconciles_;
    const std::string why((!knodes.ok() ? knodes.status() : kpods.status()).message());
    if (why != k8s_down_said_) {
      log->warn(
          "API server unreachable: {}: every transition is frozen, no fence is removed (said once; "
          "kgpu_slurm_bridge_frozen_total{{side=\"k8s\"}} counts the reconciles)",
          why);
      k8s_down_said_ = why;
    }
    std::lock_guard lock(mu_);
    metrics_.Set("kgpu_slurm_bridge_slurm_up", result.slurm_ok);
    metrics_.Set("kgpu_slurm_bridge_api_up", 0);
    last_.slurm_ok = result.slurm_ok;
    last_.k8s_ok = false;
    return last_;
  }

  // Pods: bound ones per node (not DaemonSet, not mirror, not terminal), and GPU demand.
  std::map<std::string, std::vector<Pod>> pods_on;
  int64_t ripe_gpus = 0;
  int ripe_pods = 0, any_unsched = 0;
  for (const auto& p : F(*kpods, "items")) {
    const json& md = F(p, "metadata");
    const std::string phase = F(p, "status").value("phase", "Pending");
    if (phase == "Succeeded" || phase == "Failed") continue;
    const std::string node = F(p, "spec").value("nodeName", "");
    if (!node.empty()) {
      bool daemonset = false;
      for (const auto& o : md.value("ownerReferences", json::array()))
        daemonset = daemonset || o.value("kind", "") == "DaemonSet";
      if (daemonset || md.value("annotations", json::object()).contains("kubernetes.io/config.mirror")) continue;
      pods_on[node].push_back(
          {md.value("namespace", ""), md.value("name", ""), node, md.contains("deletionTimestamp")});
      continue;
    }
    const int64_t gpus = GpuRequest(p, opts_.gpu_resources);
    if (gpus <= 0) continue;
    for (const auto& c : F(p, "status").value("conditions", json::array())) {
      if (c.value("type", "") != "PodScheduled" || c.value("status", "") != "False" ||
          c.value("reason", "") != "Unschedulable") {
        continue;
      }
      ++any_unsched;
      const auto since = k8s::ParseRfc3339(c.value("lastTransitionTime", ""));
      if (!since || now - static_cast<int64_t>(*since) >= opts_.lend_threshold.count()) {
        ++ripe_pods;
        ripe_gpus += gpus;
      } else {
        // Ripe when the threshold expires: Run() comes back then, not at the next interval.
        const auto due = std::chrono::steady_clock::now() +
                         std::chrono::seconds(static_cast<int64_t>(*since) + opts_.lend_threshold.count() - now) +
                         std::chrono::milliseconds(50);
        recheck_at_ = recheck_at_ ? std::min(*recheck_at_, due) : due;
      }
    }
  }
  result.unschedulable_gpu_pods = any_unsched;

  // --- the managed nodes
  std::vector<Facts> facts;
  for (const auto& n : F(*knodes, "items")) {
    const std::string name = F(n, "metadata").value("name", "");
    const std::string pool = Label(n, kPoolLabel);
    if ((pool != "slurm" && pool != "lent") || !Allowed(name)) continue;
    Facts f;
    f.name = name;
    f.node = n;
    f.lease = LeaseOf(n, &f.lease_error);
    if (!f.lease_error.empty()) log->warn("{}: {}", name, f.lease_error);
    if (result.slurm_ok) {
      auto it = snodes.find(name);
      if (it == snodes.end()) {
        NodeView v;
        v.name = name;
        v.frozen = "Slurm has no node of this name: not managed";
        result.nodes.push_back(v);
        continue;
      }
      f.slurm = it->second;
      for (const auto& j : jobs) {
        if (j.Holds(name)) f.jobs.push_back(j);
      }
    }
    f.pods = pods_on[name];
    facts.push_back(std::move(f));
  }

  auto step_all = [&](Facts& f) {
    for (int i = 0; i < 8 && Step(f, result); ++i) {
    }
  };
  for (auto& f : facts) {
    ReapResumeCommand(f);
    step_all(f);
  }
  // A finished resume command of a node no longer managed (unlabelled, deleted): logged only.
  for (auto it = resume_runs_.begin(); it != resume_runs_.end();) {
    const bool managed = std::any_of(facts.begin(), facts.end(), [&](const Facts& f) { return f.name == it->first; });
    if (managed || it->second.done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      ++it;
      continue;
    }
    const auto r = it->second.done.get();
    log->info("{}: the resume command {} ended ({}) after the node left the bridge's care", it->first,
              CommandLine(it->second.argv), r.ok() ? Cat("exit ", r->exit_code) : std::string(r.status().message()));
    it = resume_runs_.erase(it);
  }

  // --- policy
  // Slurm demand: blocked pending jobs (old enough), each taking back only the lent nodes it could
  // use (JobMayUse: partition, -w, -x, --constraint, --gres; not admin-drained) and no more than
  // it needs; Slurm jobs on lent nodes.
  std::vector<const SlurmJob*> blocked;
  if (result.slurm_ok) {
    for (const auto& j : jobs) {
      if (!j.Pending() || !Blocking(j)) continue;
      if (j.submit_time && now - *j.submit_time < opts_.reclaim_threshold.count()) continue;
      blocked.push_back(&j);
    }
  }
  result.blocked_slurm_jobs = static_cast<int>(blocked.size());
  // --min-kept counts every node Slurm has undrained, the ones --nodes does not let us lend too.
  const auto kept = static_cast<int>(std::count_if(snodes.begin(), snodes.end(), [](const auto& kv) {
    const SlurmNode& n = kv.second;
    return !n.Drain() && !(n.PowerSaving() && IsOwnedReason(n.reason));  // our power-down is a fence too
  }));
  int lent = 0, in_flight = 0;
  int64_t last_lent_at = 0;
  for (const auto& f : facts) {
    if (f.lease.phase == Phase::kLent) {
      ++lent;
      last_lent_at = std::max(last_lent_at, f.lease.since);
    }
    if (f.lease.phase == Phase::kLendDraining || f.lease.phase == Phase::kLendUnfencing) ++in_flight;
  }
  std::vector<std::pair<Facts*, std::string>> reclaims;  // node, why
  // The reasons of their own first; a node they bring back counts for the blocked jobs below.
  for (auto& f : facts) {
    const std::string req = Annotation(f.node, kReclaimAnnotation);
    const bool lentish = f.lease.phase == Phase::kLent || f.lease.phase == Phase::kLendUnfencing;
    if (f.lease.phase == Phase::kLendDraining) {
      if (!req.empty()) {
        f.cancel = true;
        f.cancel_why = Cat("operator asked (", req, ")");
      }
      continue;
    }
    if (!lentish) continue;
    if (!req.empty()) {
      reclaims.emplace_back(&f, req.rfind(kResumeProgramRequest, 0) == 0 ? Cat("Slurm asked for it back (", req, ")")
                                                                         : Cat("operator asked (", req, ")"));
    } else if (opts_.power_save && f.SlurmWantsBack()) {
      reclaims.emplace_back(
          &f, Cat("Slurm asked for it back (gave it to a job", f.jobs.empty() ? "" : Cat(" ", f.jobs.front().id),
                  "; State=", f.slurm->state, ")"));
    } else if (f.lease.lent_until > 0 && now >= f.lease.lent_until) {
      reclaims.emplace_back(&f, "the lease ended");
    } else if (!f.jobs.empty()) {
      reclaims.emplace_back(&f, Cat("Slurm job ", f.jobs.front().id, " is on the lent node"));
    }
  }
  if (!blocked.empty()) {
    std::map<std::string, Facts*> fact_of;
    for (auto& f : facts) fact_of[f.name] = &f;
    std::set<std::string> held;  // nodes a job holds
    for (const auto& j : jobs) {
      if (j.Holding()) held.insert(j.nodes.begin(), j.nodes.end());
    }
    auto reclaiming = [&](const Facts* f) {
      return std::any_of(reclaims.begin(), reclaims.end(), [&](const auto& r) { return r.first == f; });
    };
    // An admin's drain (seen now, or recorded in the lease): a reclaim leaves it drained.
    auto admin_drained = [](const Facts& f) { return f.Foreign() || f.lease.admin_drained; };
    auto slurm_node = [&](const std::string& name) -> const SlurmNode* {
      if (auto it = fact_of.find(name); it != fact_of.end() && it->second->slurm) return &*it->second->slurm;
      auto it = snodes.find(name);
      return it == snodes.end() ? nullptr : &it->second;
    };
    // What a node is to a blocked job: Slurm's and free now, Slurm's and busy, on its way back to
    // Slurm (a reclaim or a cancelled lend), a lend to cancel, a lent node to reclaim, or of no use
    // (unknown, down, not responding, drained by someone else, admin-drained while lent).
    enum class Kind { kIdle, kBusy, kComing, kCancellable, kLent, kUnusable };
    auto kind_of = [&](const std::string& name) -> Kind {
      const SlurmNode* n = slurm_node(name);
      if (n == nullptr) return Kind::kUnusable;
      if (auto it = fact_of.find(name); it != fact_of.end() && it->second->lease.phase != Phase::kSlurm) {
        const Facts& f = *it->second;
        if (admin_drained(f)) return Kind::kUnusable;
        if (f.lease.phase == Phase::kLent || f.lease.phase == Phase::kLendUnfencing)
          return reclaiming(&f) ? Kind::kComing : Kind::kLent;
        if (f.lease.phase == Phase::kLendDraining) return f.cancel ? Kind::kComing : Kind::kCancellable;
        return Kind::kComing;  // R1-R3
      }
      if (n->Drain() || n->base == "DOWN" || n->Has("NOT_RESPONDING") || (n->PowerSaving() && IsOwnedReason(n->reason)))
        return Kind::kUnusable;
      return n->Busy() || held.count(name) > 0 ? Kind::kBusy : Kind::kIdle;
    };
    auto unusable_why = [&](const std::string& name) -> std::string {
      const SlurmNode* n = slurm_node(name);
      if (n == nullptr) return "Slurm does not list";
      if (auto it = fact_of.find(name); it != fact_of.end() && admin_drained(*it->second)) {
        const Facts& f = *it->second;
        return Cat("is drained by an admin ('", f.Foreign() ? f.slurm->reason : f.lease.prev_slurm_reason, "')");
      }
      if (n->Drain() && IsOwnedReason(n->reason))
        return Cat("is drained by kgpu (", n->reason, ") with no Node to reclaim");
      if (n->Drain()) return Cat("is drained ('", n->reason, "')");
      return Cat("is State=", n->state);
    };
    auto reclaim = [&](Facts& f, const std::string& why) {
      if (!reclaiming(&f)) reclaims.emplace_back(&f, why);
    };
    auto cancel = [&](Facts& f, const std::string& why) {
      f.cancel = true;
      f.cancel_why = why;
    };
    std::set<std::string> taken;  // nodes counted for a job already: free, coming back, reclaimed
    std::vector<const SlurmJob*> servable;
    std::set<std::string> unservable;
    // Required nodes (-w) first: a job needs every one of them, whatever comes before it.
    for (const SlurmJob* j : blocked) {
      const std::string why = Cat("Slurm job ", j->id, " (", JobAsks(*j), ") is pending: ", j->reason);
      std::string cannot;
      for (const auto& r : j->required_nodes) {
        if (kind_of(r) == Kind::kUnusable) {
          cannot = Cat(r, ", which ", unusable_why(r));
          break;
        }
      }
      if (!cannot.empty()) {
        // It cannot start whatever comes back: nothing is reclaimed for it (said once).
        const std::string note = Cat(why, "; it needs ", cannot, ": no node is reclaimed for it");
        unservable.insert(j->id);
        if (unservable_said_[j->id] != note) {
          log->warn("{}", note);
          unservable_said_[j->id] = note;
        }
        continue;
      }
      servable.push_back(j);
      for (const auto& r : j->required_nodes) {
        taken.insert(r);
        const Kind k = kind_of(r);
        if (k == Kind::kLent) reclaim(*fact_of.at(r), why);
        if (k == Kind::kCancellable) cancel(*fact_of.at(r), why);
      }
    }
    for (auto it = unservable_said_.begin(); it != unservable_said_.end();) {
      it = unservable.count(it->first) > 0 ? std::next(it) : unservable_said_.erase(it);
    }
    // Then the nodes beyond them: free Slurm nodes the job could use, nodes coming back, lends
    // to cancel, and only then lent nodes — those the reason names first, then the ones with
    // the fewest pods to evict.
    for (const SlurmJob* j : servable) {
      int want = std::max(1, j->node_count) - static_cast<int>(j->required_nodes.size());
      if (want <= 0) continue;
      const std::string why = Cat("Slurm job ", j->id, " (", JobAsks(*j), ") is pending: ", j->reason);
      auto usable = [&](const std::string& name) {
        const SlurmNode* n = slurm_node(name);
        return want > 0 && taken.count(name) == 0 && n != nullptr && JobMayUse(*j, *n);
      };
      for (const auto& kv : snodes) {
        if (usable(kv.first) && kind_of(kv.first) == Kind::kIdle) {
          taken.insert(kv.first);
          --want;
        }
      }
      for (auto& f : facts) {
        if (usable(f.name) && kind_of(f.name) == Kind::kComing) {
          taken.insert(f.name);
          --want;
        }
      }
      for (auto& f : facts) {
        if (usable(f.name) && kind_of(f.name) == Kind::kCancellable) {
          cancel(f, why);
          taken.insert(f.name);
          --want;
        }
      }
      std::vector<Facts*> lent_ones;
      for (auto& f : facts) {
        if (usable(f.name) && kind_of(f.name) == Kind::kLent) lent_ones.push_back(&f);
      }
      const std::vector<std::string> named = NamedUnavailable(j->reason);
      auto is_named = [&](const Facts* f) { return std::find(named.begin(), named.end(), f->name) != named.end(); };
      std::stable_sort(lent_ones.begin(), lent_ones.end(), [&](const Facts* a, const Facts* b) {
        if (is_named(a) != is_named(b)) return is_named(a);
        return a->pods.size() < b->pods.size();
      });
      for (Facts* f : lent_ones) {
        if (want <= 0) break;
        reclaim(*f, why);
        taken.insert(f->name);
        --want;
      }
    }
  } else {
    unservable_said_.clear();
  }
  for (auto& [f, why] : reclaims) {
    if (f->lease.phase == Phase::kLendUnfencing) {
      // Not unfenced yet: back to Slurm directly (both fences are on).
      f->cancel = true;
      Lease l = NextLease(*f, Phase::kReclaimUnfencing, Cat("reclaimed before it was lent: ", why));
      result.decisions.push_back(Cat("reclaim ", f->name, ": ", why));
      if (WriteNode(*f, l, ApplyK8sFence, "reclaim (not lent yet)")) step_all(*f);
      continue;
    }
    Lease l = NextLease(*f, Phase::kReclaimFencing, why);
    l.requested_by = why.rfind("operator", 0) == 0      ? "operator"
                     : why == "the lease ended"         ? "lease-expired"
                     : why.rfind("Slurm asked", 0) == 0 ? "slurm-resume"
                                                        : "slurm-demand";
    result.decisions.push_back(Cat("reclaim ", f->name, ": ", why));
    if (WriteNode(*f, l, nullptr, Cat("start the reclaim (", why, ")"))) {
      Event(*f, "Normal", "ReclaimStarted", why);
      CrashPoint("reclaim-decided");
      step_all(*f);
    }
  }
  for (auto& f : facts) {
    if (f.cancel && f.lease.phase == Phase::kLendDraining) {
      result.decisions.push_back(Cat("cancel the lend of ", f.name, ": ", f.cancel_why));
      step_all(f);
    }
  }

  // Kubernetes demand: lend when no Slurm job is blocked.
  if (any_unsched > 0) {
    had_demand_ = true;
  } else if (had_demand_) {
    had_demand_ = false;
    demand_gone_since_ = now;
  }
  if (any_unsched == 0 && in_flight > 0 && now - demand_gone_since_ >= opts_.lend_hysteresis.count()) {
    for (auto& f : facts) {
      if (f.lease.phase != Phase::kLendDraining) continue;
      f.cancel = true;
      f.cancel_why = Cat("no unschedulable GPU pods for ", opts_.lend_hysteresis.count(), " s");
      result.decisions.push_back(Cat("cancel the lend of ", f.name, ": ", f.cancel_why));
      step_all(f);
    }
  }
  if (blocked.empty() && ripe_pods > 0 && result.slurm_ok && now - last_lent_at >= opts_.lend_threshold.count()) {
    std::vector<Facts*> candidates;
    int64_t per_node = 0;
    for (auto& f : facts) {
      if (f.lease.phase != Phase::kSlurm || !f.slurm || f.slurm->Drain() || !f.slurm->Responding() ||
          f.slurm->PowerSaving()) {
        continue;
      }
      if (!f.lease.op.empty() && now - f.lease.since < opts_.cooldown.count()) continue;  // just came back
      if (!f.pods.empty()) continue;
      if (f.lease.admin_cordoned) continue;  // an admin's cordon: lending would lift it
      candidates.push_back(&f);
      const auto alloc = F(f.node, "status").value("allocatable", json::object());
      for (const auto& r : opts_.gpu_resources) {
        if (alloc.contains(r)) {
          const auto& v = alloc[r];
          per_node = std::max<int64_t>(per_node, v.is_string()   ? std::atoll(v.get<std::string>().c_str())
                                                 : v.is_number() ? v.get<int64_t>()
                                                                 : 0);
        }
      }
    }
    if (per_node <= 0) per_node = 1;
    const int wanted = static_cast<int>((ripe_gpus + per_node - 1) / per_node);
    int to_start = wanted - in_flight;
    to_start = std::min(to_start, opts_.max_lent - lent - in_flight);
    to_start = std::min(to_start, kept - opts_.min_kept);
    auto end_of = [](const Facts* f) {
      int64_t e = 0;
      for (const auto& j : f->jobs) e = std::max(e, j.end_time.value_or(INT64_MAX / 2));
      return e;
    };
    std::sort(candidates.begin(), candidates.end(), [&](const Facts* a, const Facts* b) {
      const bool ia = !a->slurm->Busy() && a->jobs.empty(), ib = !b->slurm->Busy() && b->jobs.empty();
      if (ia != ib) return ia;
      if (end_of(a) != end_of(b)) return end_of(a) < end_of(b);
      return a->name < b->name;
    });
    for (int i = 0; i < to_start && i < static_cast<int>(candidates.size()); ++i) {
      Facts& f = *candidates[static_cast<size_t>(i)];
      const std::string why = Cat(ripe_pods, " GPU pod(s) unschedulable for >= ", opts_.lend_threshold.count(), " s (",
                                  ripe_gpus, " GPU(s))");
      Lease l = NextLease(f, Phase::kLendDraining, why);
      l.op = Cat("op-", now, "-", RandomHex(4));
      l.requested_by = "demand";
      l.lent_until = 0;
      l.jobs_seen.clear();
      l.pods_evicted.clear();
      l.admin_drained = false;
      l.prev_slurm_reason.clear();
      result.decisions.push_back(Cat("lend ", f.name, ": ", why));
      if (WriteNode(f, l, nullptr, Cat("start a lend (", why, ")"))) {
        Event(f, "Normal", "LendStarted", why);
        CrashPoint("lend-decided");
        step_all(f);
      }
    }
  }

  // --- views and gauges
  std::map<std::string, int> by_phase;
  int frozen = 0;
  for (const auto& f : facts) {
    NodeView v;
    v.name = f.name;
    v.phase = f.lease.phase;
    v.since = f.lease.since;
    v.generation = f.lease.generation;
    v.op = f.lease.op;
    v.why = f.lease.why;
    if (f.slurm) {
      v.slurm_state = f.slurm->state;
      v.slurm_reason = f.slurm->reason;
      v.slurm_fenced = f.slurm->Drain() || SlurmFencedByUs(*f.slurm);
    }
    v.k8s_fenced = K8sFenced(f.node);
    v.pods = f.pods.size();
    for (const auto& j : f.jobs) v.jobs.push_back(j.id);
    v.frozen = f.frozen;
    if (!f.slurm && f.lease.phase != Phase::kLent && f.lease.phase != Phase::kSlurm && v.frozen.empty()) {
      v.frozen = "Slurm unreachable";
    }
    // Frozen for want of Slurm: a step that needs it (its f.frozen says "Slurm unreachable"), not
    // one that goes ahead without it (evictions while reclaiming). The Event once per node and
    // condition, again when it changes.
    if (!result.slurm_ok && f.lease.phase != Phase::kSlurm && v.frozen.rfind("Slurm unreachable", 0) == 0) {
      ++frozen;
      const std::string note = Cat(PhaseName(f.lease.phase), " frozen: ", v.frozen);
      if (frozen_said_[f.name] != note) {
        Event(f, "Warning", "SlurmUnreachable", note);
        frozen_said_[f.name] = note;
      }
    } else {
      frozen_said_.erase(f.name);
    }
    ++by_phase[PhaseName(f.lease.phase)];
    result.nodes.push_back(std::move(v));
  }
  // LOST: our drain on a Slurm node that no managed Node object names any more.
  int lost = 0;
  if (result.slurm_ok) {
    std::set<std::string> known;
    for (const auto& f : facts) known.insert(f.name);
    std::set<std::string> still_lost;
    for (const auto& [name, sn] : snodes) {
      if (known.count(name) || !SlurmFencedByUs(sn) || !Allowed(name)) continue;
      NodeView v;
      v.name = name;
      v.lost = true;
      v.slurm_state = sn.state;
      v.slurm_reason = sn.reason;
      v.slurm_fenced = true;
      for (const auto& j : jobs) {
        if (j.Holds(name)) v.jobs.push_back(j.id);
      }
      v.frozen = LostWhy(name, sn.reason);
      if (lost_logged_.insert(name).second) log->warn("{}: LOST: {}", name, v.frozen);
      still_lost.insert(name);
      result.nodes.push_back(std::move(v));
    }
    for (auto it = lost_logged_.begin(); it != lost_logged_.end();) {
      it = still_lost.count(*it) ? std::next(it) : lost_logged_.erase(it);
    }
    lost = static_cast<int>(still_lost.size());
  }
  if (opts_.dry_run && dry_out_) {
    for (const auto& d : result.decisions) *dry_out_ << "[dry-run] decision: " << d << "\n";
  }
  std::lock_guard lock(mu_);
  metrics_.Set("kgpu_slurm_bridge_slurm_up", result.slurm_ok);
  metrics_.Set("kgpu_slurm_bridge_api_up", 1);
  metrics_.Set("kgpu_slurm_bridge_unschedulable_gpu_pods", any_unsched);
  metrics_.Set("kgpu_slurm_bridge_blocked_slurm_jobs", result.blocked_slurm_jobs);
  metrics_.Set("kgpu_slurm_bridge_frozen_nodes", frozen);
  for (const char* p : {"SLURM_OWNED", "L1_SLURM_DRAINING", "L2_K8S_UNFENCING", "LENT", "R1_K8S_FENCING",
                        "R2_K8S_EVICTING", "R3_SLURM_UNFENCING"}) {
    metrics_.Set("kgpu_slurm_bridge_nodes", {{"phase", p}}, by_phase[p]);
  }
  metrics_.Set("kgpu_slurm_bridge_nodes", {{"phase", "LOST"}}, lost);
  metrics_.Set("kgpu_slurm_bridge_reconcile_seconds",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  last_ = result;
  if (first) log->info("first reconcile done in {} ms: {} decision(s)", elapsed_ms(), result.decisions.size());
  return result;
}

void Bridge::Run(std::stop_token stop) {
  // Events come in bursts (a Deployment scaled up: many pods; our own lease write: a node
  // event): one reconcile after a short pause answers the whole burst.
  constexpr auto kDebounce = std::chrono::milliseconds(100);
  while (!stop.stop_requested()) {
    Reconcile();
    bool woken = false;
    {
      std::unique_lock lock(wake_mu_);
      auto wait = std::chrono::duration_cast<std::chrono::steady_clock::duration>(opts_.interval);
      if (recheck_at_) wait = std::min(wait, std::max(*recheck_at_ - std::chrono::steady_clock::now(), wait.zero()));
      wake_cv_.wait_for(lock, stop, wait, [&] { return woken_; });
      woken = std::exchange(woken_, false);
    }
    if (stop.stop_requested()) break;
    if (woken) {
      if (!SleepFor(stop, kDebounce)) break;
      std::lock_guard lock(wake_mu_);
      woken_ = false;  // what came during the pause is answered by this reconcile
    }
  }
}

void Bridge::Wake() {
  {
    std::lock_guard lock(wake_mu_);
    woken_ = true;
  }
  wake_cv_.notify_all();
}

BridgeWatch::BridgeWatch(k8s::Client& kube, Bridge& bridge) {
  const k8s::Handlers wake{[&bridge](const nlohmann::json&) { bridge.Wake(); },
                           [&bridge](const nlohmann::json&, const nlohmann::json&) { bridge.Wake(); },
                           [&bridge](const nlohmann::json&) { bridge.Wake(); }};
  k8s::InformerOptions po;
  po.path = "/api/v1/pods";
  po.field_selector = "status.phase=Pending";
  pods_ = std::make_unique<k8s::Informer>(kube, po);
  pods_->AddHandler(wake);
  k8s::InformerOptions no;
  no.path = "/api/v1/nodes";
  no.label_selector = kPoolLabel;
  nodes_ = std::make_unique<k8s::Informer>(kube, no);
  nodes_->AddHandler(wake);
}

BridgeWatch::~BridgeWatch() {
  Stop();
}

void BridgeWatch::Start() {
  pods_->Start();
  nodes_->Start();
}

void BridgeWatch::Stop() {
  pods_->RequestStop();  // both watches wind down together
  nodes_->RequestStop();
  pods_->Stop();
  nodes_->Stop();
}

ReconcileResult Bridge::Last() const {
  std::lock_guard lock(mu_);
  return last_;
}

std::string Bridge::Metrics() const {
  return metrics_.Text();
}

}  // namespace kgpu::slurm
