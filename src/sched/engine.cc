#include "sched/engine.h"

#include "common/strings.h"

namespace kgpu::sched {

absl::StatusOr<Request> Engine::Arrive(const PodRequest& pod) {
  auto req = cluster_.Compile(pod);
  if (!req.ok()) return req.status();
  if (cluster_.HasPod(req->name)) return absl::AlreadyExistsError(Cat("pod ", req->name, ": already bound"));
  policy_->Observe(*req);
  return req;
}

absl::StatusOr<Placement> Engine::Choose(const PodRequest& pod) {
  auto req = Arrive(pod);
  if (!req.ok()) return req.status();
  Placement p = policy_->Choose(cluster_, *req);
  if (!p.ok()) {
    return absl::ResourceExhaustedError(
        Cat("pod ", pod.name, ": no node fits (cpu ", pod.cpu_milli, "m, memory ", pod.memory_mib, " MiB, ",
            pod.mig_profile.empty() ? Cat(pod.num_gpus, " GPU x ", req->milli, " milli") : Cat("MIG ", pod.mig_profile),
            ")"));
  }
  return p;
}

absl::StatusOr<Placement> Engine::Schedule(const PodRequest& pod) {
  auto p = Choose(pod);
  if (!p.ok()) return p;
  auto req = cluster_.Compile(pod);
  if (!req.ok()) return req.status();
  auto st = cluster_.Bind(*req, *p);
  if (!st.ok()) return st;
  return *cluster_.FindPod(pod.name);
}

absl::StatusOr<std::vector<std::pair<int, Candidate>>> Engine::Scores(const PodRequest& pod) {
  auto req = cluster_.Compile(pod);
  if (!req.ok()) return req.status();
  std::vector<std::pair<int, Candidate>> out;
  for (size_t i = 0; i < cluster_.nodes().size(); ++i) {
    const int id = static_cast<int>(i);
    Candidate c;
    if (cluster_.NodeFits(*req, id) && policy_->Evaluate(cluster_, *req, id, &c)) out.emplace_back(id, std::move(c));
  }
  return out;
}

absl::Status Engine::Bind(const PodRequest& pod, const Placement& placement) {
  auto req = cluster_.Compile(pod);
  if (!req.ok()) return req.status();
  return cluster_.Bind(*req, placement);
}

}  // namespace kgpu::sched
