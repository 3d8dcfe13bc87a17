#include "slurm/lease.h"

#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace kgpu::slurm {
namespace {
struct Named {
  Phase phase;
  const char* name;
  const char* owner;
};
constexpr Named kPhases[] = {
    {Phase::kSlurm, "SLURM_OWNED", "slurm"},
    {Phase::kLendDraining, "L1_SLURM_DRAINING", "transition"},
    {Phase::kLendUnfencing, "L2_K8S_UNFENCING", "transition"},
    {Phase::kLent, "LENT", "k8s"},
    {Phase::kReclaimFencing, "R1_K8S_FENCING", "transition"},
    {Phase::kReclaimEvicting, "R2_K8S_EVICTING", "transition"},
    {Phase::kReclaimUnfencing, "R3_SLURM_UNFENCING", "transition"},
};
}  // namespace

const char* PhaseName(Phase p) {
  for (const auto& n : kPhases) {
    if (n.phase == p) return n.name;
  }
  return "?";
}

const char* Owner(Phase p) {
  for (const auto& n : kPhases) {
    if (n.phase == p) return n.owner;
  }
  return "?";
}

absl::StatusOr<Phase> PhaseFromName(std::string_view name) {
  for (const auto& n : kPhases) {
    if (name == n.name) return n.phase;
  }
  std::vector<std::string> names;
  for (const auto& n : kPhases) names.emplace_back(n.name);
  return absl::InvalidArgumentError(
      Cat("phase '", Printable(std::string(name)), "' is not one of ", Join(names, ", ")));
}

std::string OwnedReason(const std::string& op) {
  return Cat(kOwnedReasonPrefix, op);
}

std::string SerializeLease(const Lease& l) {
  nlohmann::json j = {{"op", l.op},   {"phase", PhaseName(l.phase)}, {"gen", l.generation}, {"since", l.since},
                      {"why", l.why}, {"by", l.requested_by},        {"holder", l.holder}};
  if (l.lent_until > 0) j["until"] = l.lent_until;
  if (!l.prev_slurm_reason.empty()) j["prevReason"] = l.prev_slurm_reason;
  if (l.admin_drained) j["adminDrained"] = true;
  if (l.admin_cordoned) j["adminCordoned"] = true;
  if (!l.jobs_seen.empty()) j["jobsSeen"] = l.jobs_seen;
  if (!l.pods_evicted.empty()) j["podsEvicted"] = l.pods_evicted;
  return j.dump();
}

absl::StatusOr<Lease> ParseLease(std::string_view text) {
  auto fail = [](const std::string& why) {
    return absl::InvalidArgumentError(Cat("annotation ", kLeaseAnnotation, ": ", why,
                                          " (written by kgpu slurm-bridge; remove it only with the node fenced)"));
  };
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail("not a JSON object");
  Lease l;
  auto str = [&](const char* key, std::string& into) -> absl::Status {
    if (!j.contains(key)) return absl::OkStatus();
    if (!j[key].is_string()) return fail(Cat("'", key, "' must be a string"));
    into = j[key].get<std::string>();
    return absl::OkStatus();
  };
  auto num = [&](const char* key, int64_t& into) -> absl::Status {
    if (!j.contains(key)) return absl::OkStatus();
    if (!j[key].is_number_integer()) return fail(Cat("'", key, "' must be an integer"));
    into = j[key].get<int64_t>();
    return absl::OkStatus();
  };
  auto list = [&](const char* key, std::vector<std::string>& into) -> absl::Status {
    if (!j.contains(key)) return absl::OkStatus();
    if (!j[key].is_array()) return fail(Cat("'", key, "' must be a list of strings"));
    for (const auto& v : j[key]) {
      if (!v.is_string()) return fail(Cat("'", key, "' must be a list of strings"));
      into.push_back(v.get<std::string>());
    }
    return absl::OkStatus();
  };
  std::string phase;
  for (auto s :
       {str("op", l.op), str("phase", phase), str("why", l.why), str("by", l.requested_by), str("holder", l.holder),
        str("prevReason", l.prev_slurm_reason), num("gen", l.generation), num("since", l.since),
        num("until", l.lent_until), list("jobsSeen", l.jobs_seen), list("podsEvicted", l.pods_evicted)}) {
    if (!s.ok()) return s;
  }
  if (j.contains("adminDrained")) {
    if (!j["adminDrained"].is_boolean()) return fail("'adminDrained' must be true or false");
    l.admin_drained = j["adminDrained"].get<bool>();
  }
  if (j.contains("adminCordoned")) {
    if (!j["adminCordoned"].is_boolean()) return fail("'adminCordoned' must be true or false");
    l.admin_cordoned = j["adminCordoned"].get<bool>();
  }
  if (phase.empty()) return fail("'phase' is missing");
  auto p = PhaseFromName(phase);
  if (!p.ok()) return fail(std::string(p.status().message()));
  l.phase = *p;
  if (l.generation < 0) return fail("'gen' must not be negative");
  if (l.phase != Phase::kSlurm && l.op.empty()) return fail(Cat("phase ", phase, " needs an 'op'"));
  return l;
}

}  // namespace kgpu::slurm
