#pragma once
// The durable per-node record of the lending state machine: a JSON lease in the Node annotation
// kgpu.io/slurm-lease, written with the Node's resourceVersion (compare-and-swap), its
// generation incremented on every phase change (a fencing token: a writer that read an older
// generation loses with 409 and recomputes). Together with the Slurm drain reason
// "kgpu-lend:<op>" (durable in slurmctld's StateSaveLocation) and the Kubernetes fence (taint
// kgpu.io/owner=slurm:NoSchedule + cordon, durable in etcd) it is all the state there is: the
// controller keeps nothing else across restarts (docs/slurm.md, "State machine").
//
// Thread-safety: plain values and pure functions.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "api/names.h"

namespace kgpu::slurm {

// Label, taint and annotation names (firm: operators and manifests use them).
inline constexpr char kOwnedReasonPrefix[] = "kgpu-lend:";
using api::kOwnerTaintKey;
inline constexpr char kOwnerTaintValue[] = "slurm";
using api::kPoolLabel;
inline constexpr auto& kLeaseAnnotation = api::kSlurmLeaseAnnotation;
inline constexpr auto& kReclaimAnnotation = api::kSlurmReclaimAnnotation;
// The reclaim request that `kgpu slurm-bridge hook resume` (Slurm's ResumeProgram) writes starts
// with this; an operator's `kgpu slurm-bridge reclaim` writes its --reason.
inline constexpr char kResumeProgramRequest[] = "ResumeProgram";
// `kgpu slurm-bridge hook suspend` (Slurm's SuspendProgram) writes the time here: a wake-up only.
inline constexpr auto& kSuspendedAnnotation = api::kSlurmSuspendedAnnotation;
inline constexpr char kScaleDownDisabled[] = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
inline constexpr char kKarpenterDoNotDisrupt[] = "karpenter.sh/do-not-disrupt";

enum class Phase {
  kSlurm,            // SLURM_OWNED: Kubernetes fenced (taint + cordon), Slurm schedules
  kLendDraining,     // L1: DRAIN kgpu-lend:<op> set, waiting for the node's jobs to end on their own
  kLendUnfencing,    // L2: Slurm drained and empty (twice, >= 1 s apart); Kubernetes fence coming off
  kLent,             // K8S_OWNED: Slurm drained kgpu-lend:<op>, Kubernetes schedules
  kReclaimFencing,   // R1: reclaim decided; Kubernetes fence going on
  kReclaimEvicting,  // R2: fenced; pods leaving through the Eviction API (PDBs honoured)
  kReclaimUnfencing  // R3: no pods left; Slurm's DRAIN coming off (only when the reason is still ours)
};

// "SLURM_OWNED", "L1_SLURM_DRAINING", ... (the names of docs/slurm.md's diagram).
const char* PhaseName(Phase p);
absl::StatusOr<Phase> PhaseFromName(std::string_view name);
// Who may run work on the node in this phase: "slurm", "k8s" or "transition".
const char* Owner(Phase p);

struct Lease {
  std::string op;  // operation id, also in the Slurm reason "kgpu-lend:<op>"
  Phase phase = Phase::kSlurm;
  int64_t generation = 0;         // +1 per write
  int64_t since = 0;              // unix seconds: when this phase began
  std::string why;                // the decision or the observation that led here (for status and Events)
  std::string requested_by;       // demand | operator | lease-expired | slurm-demand | recovery
  int64_t lent_until = 0;         // unix seconds; 0: no end
  std::string prev_slurm_reason;  // a drain reason that was there when we started (never ours)
  bool admin_drained = false;     // an admin's drain (a reason not ours) was seen: the bridge must not resume the node
  // An admin's own cordon (spec.unschedulable without the bridge's fence: before adoption, or set
  // on a lent node) was seen: the bridge never uncordons the node, and does not lend it, until the
  // admin uncordons it.
  bool admin_cordoned = false;
  std::vector<std::string> jobs_seen;     // Slurm jobs that were on the node while it drained
  std::vector<std::string> pods_evicted;  // pods evicted on reclaim
  std::string holder;                     // identity of the controller that wrote it
};

std::string SerializeLease(const Lease& lease);
// Errors name the annotation and the field.
absl::StatusOr<Lease> ParseLease(std::string_view text);

// "kgpu-lend:<op>".
std::string OwnedReason(const std::string& op);
inline bool IsOwnedReason(std::string_view reason) {
  return reason.rfind(kOwnedReasonPrefix, 0) == 0;
}

}  // namespace kgpu::slurm
