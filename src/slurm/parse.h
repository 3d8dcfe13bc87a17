#pragma once
// Slurm 22.05's machine-readable CLI output, parsed into plain values:
//  - `scontrol show node -o` (one `Key=value ...` line per node; values may hold spaces, as
//    OS= does, and Reason= runs to the end of the line with a trailing "[user@time]");
//  - `squeue -h -o '%i|%T|%N|%D|%r|%e|%P|%V|%n|%x|%b|%f'` (our fixed format, '|' separated; the
//    last field, the job's --constraint, may itself hold '|');
//  - Slurm hostlist expressions ("n[1-3,07],gpu-a") as written by %N and by the power-saving hooks.
// The node state is kept as scontrol prints it (base state plus flags, "MIXED+DRAIN"), because
// sinfo's compact words and CPU counts go stale in 22.05 (docs/slurm.md, "Signals").
//
// Thread-safety: pure functions and plain values.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::slurm {

struct SlurmNode {
  std::string name;
  std::string state;            // as printed: "IDLE+DRAIN"
  std::string base;             // "IDLE", "MIXED", "ALLOCATED", "DOWN", "UNKNOWN", ...
  std::set<std::string> flags;  // "DRAIN", "NOT_RESPONDING", "COMPLETING", "POWERED_DOWN", ...
  std::string reason;           // without the " [user@time]" suffix
  std::string reason_user;      // "root"
  std::string reason_time;      // "2026-12-03T16:50:43"
  std::string gres;             // "gpu:h100:8" ("(null)" as scontrol prints none)
  int cpu_alloc = 0, cpu_total = 0;
  std::set<std::string> partitions;  // Partitions= (empty: in none, or not said)
  // AvailableFeatures= and ActiveFeatures= together (a node_features plugin can reboot a node into
  // an available feature); "(null)": none.
  std::set<std::string> features;

  bool Has(std::string_view flag) const { return flags.count(std::string(flag)) > 0; }
  bool Drain() const { return Has("DRAIN"); }
  // Jobs may hold the node: allocated, mixed or completing (the authoritative "busy" signal).
  bool Busy() const { return base == "ALLOCATED" || base == "MIXED" || Has("COMPLETING"); }
  // Power saving (the power-save lend, docs/slurm.md): POWER_DOWN is requested and waits for the
  // node's jobs (State=POWER_DOWN_ASAP also sets DRAIN); POWERING_DOWN: the node was empty and
  // Slurm ran SuspendProgram; POWERED_DOWN: done (the DRAIN flag is gone, the reason stays);
  // POWERING_UP: Slurm ran ResumeProgram (it gave the node to a job, or State=POWER_UP) and waits
  // ResumeTimeout for slurmd to register as rebooted (the reason is cleared then).
  bool PowerDownRequested() const { return Has("POWER_DOWN"); }
  bool PoweringDown() const { return Has("POWERING_DOWN"); }
  bool PoweredDown() const { return Has("POWERED_DOWN"); }
  bool PoweringUp() const { return Has("POWERING_UP"); }
  // State=POWER_UP asked for and not yet acted on (Slurm's power thread runs ResumeProgram within
  // a second or so). A second POWER_UP in that window leaves the flag on a node that is already
  // up ("IDLE+POWER_UP", seen in a test run): never repeat one.
  bool PowerUpRequested() const { return Has("POWER_UP"); }
  // A power-down asked for, under way or done.
  bool PowerDownAskedOrDone() const { return PowerDownRequested() || PoweringDown() || PoweredDown(); }
  bool PowerSaving() const { return PowerDownAskedOrDone() || PoweringUp(); }
  // slurmd has registered and answers (not UNKNOWN, not NOT_RESPONDING, not powering up).
  bool Responding() const {
    return base != "UNKNOWN" && !Has("NOT_RESPONDING") && !Has("POWERING_UP") && base != "DOWN";
  }
};

// Parses every line; lines that are not a node record are an error naming the line.
absl::StatusOr<std::vector<SlurmNode>> ParseScontrolNodes(std::string_view text);

struct SlurmJob {
  std::string id;
  std::string state;               // RUNNING, PENDING, COMPLETING, CONFIGURING, SUSPENDED, ...
  std::vector<std::string> nodes;  // expanded; empty while pending
  int node_count = 0;
  std::string reason;               // pending reason, "None" when running
  std::optional<int64_t> end_time;  // seconds since the epoch (local time as Slurm prints it); none when unknown
  std::string partition;            // one, or several comma-separated (a job submitted to several)
  std::optional<int64_t> submit_time;
  // What the job asked for (squeue %n, %x, %f, %b; slurmrestd required_nodes, excluded_nodes,
  // features, tres_per_node):
  std::vector<std::string> required_nodes;  // -w, expanded; empty: none
  std::vector<std::string> excluded_nodes;  // -x, expanded; empty: none
  std::string features;                     // the --constraint expression; "" for none
  std::string gres;                         // GRES per node ("gres:gpu:2", "gres/gpu:h100=2"); "" for none
  bool Pending() const { return state == "PENDING"; }
  // On the node in any state that holds it (running, completing, configuring, suspended).
  bool Holding() const {
    return state == "RUNNING" || state == "COMPLETING" || state == "CONFIGURING" || state == "SUSPENDED" ||
           state == "STOPPED";
  }
  // Holding `node` now.
  bool Holds(std::string_view node) const {
    return Holding() && std::find(nodes.begin(), nodes.end(), node) != nodes.end();
  }
};

// The squeue format this parser reads (pass it to `squeue -h -o`). Checked against 22.05.8's
// squeue: %n (ReqNodeList: the hostlist, "" when none), %x (ExcNodeList, likewise), %b (the
// undocumented, "vestigial" letter for tres_per_node: "gres:gpu:2", "N/A" when none) and %f
// (the feature expression; "(null)" when none). %f is last: it may hold '|' (OR).
inline constexpr char kSqueueFormat[] = "%i|%T|%N|%D|%r|%e|%P|%V|%n|%x|%b|%f";
inline constexpr size_t kSqueueFields = 12;
// Lines with fewer fields are an error naming the line; more are the last field's '|'.
absl::StatusOr<std::vector<SlurmJob>> ParseSqueue(std::string_view text);

// Whether a node with `features` satisfies a --constraint expression. Read: plain feature names
// joined by '&' or ',' (all of them) or by '|' (any of them); "" is no constraint (true).
// Anything else (brackets, counts "*N", parentheses, '!', '&' and '|' mixed): nullopt, "cannot
// tell" — the caller must not rule the node out on it.
std::optional<bool> FeaturesMatch(std::string_view expr, const std::set<std::string>& features);
// Whether a node whose Gres= is `node_gres` ("gpu:h100:8(S:0-1),mps:400", "(null)") has at least
// what a job asks per node (`request`: "gres:gpu:2", "gres:gpu:h100:2", "gres/gpu=2",
// "gres/gpu:h100=2", "gpu:2"; comma-separated for several; no count is 1): per name (and type
// when the request names one), the node's counts summed. "" is no request (true); a request or a
// Gres= we cannot read: nullopt ("cannot tell").
std::optional<bool> GresFits(std::string_view request, std::string_view node_gres);
// Whether Slurm could give `node` to `job` by what the job asked: its partition(s), -x, -w,
// --constraint and --gres (a part we cannot tell does not rule the node out). Nothing of the
// node's state (drained, busy, down): the caller judges that.
bool JobMayUse(const SlurmJob& job, const SlurmNode& node);

// Expands a hostlist expression. Errors name the expression and the position.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view expr);

// "2026-12-03T16:50:43" (local time) to seconds since the epoch; nullopt for N/A, Unknown, None.
std::optional<int64_t> ParseSlurmTime(std::string_view text);

}  // namespace kgpu::slurm
