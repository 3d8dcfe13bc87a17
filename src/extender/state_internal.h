#pragma once
// State's private types, shared by the files that implement it: state.cc (the booking ledger and
// the verbs), explain.cc (why a node cannot take a pod) and preemption.cc (the extender's own
// preemption, holds, budgets). Not for use outside src/extender.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/strings.h"
#include "extender/state.h"
#include "sched/types.h"

namespace kgpu::extender {

// One container with a booking of its own (PodRequest::Placed).
struct State::Part {
  size_t index = 0;  // into Compiled::pod.gpus
  sched::PodRequest ereq;
  sched::Request req;
};

struct State::Compiled {
  PodRequest pod;
  std::string uid;
  bool wants_gpu = false;
  // In the order they are placed: whole GPUs, then MIG, then shares, the largest first within
  // each (what is hardest to place goes where there is still a choice).
  std::vector<Part> parts;
  std::string pod_error;  // every node is unresolvable with this message
  const ContainerRequest& Gpu(const Part& p) const { return pod.gpus[p.index]; }
};

// How many trial placements SearchPartsLocked may make for one pod on one node.
inline constexpr int kSearchBudget = 4096;

// Whether SearchPartsLocked can try every arrangement of `parts` single-GPU shares on a node of
// `gpus` GPUs within kSearchBudget: at most `gpus` choices per share, so gpus + gpus^2 + ... +
// gpus^parts placements in all.
inline bool SearchIsComplete(size_t parts, size_t gpus) {
  int64_t total = 0, level = 1;
  for (size_t i = 0; i < parts; ++i) {
    level *= static_cast<int64_t>(std::max<size_t>(gpus, 1));
    total += level;
    if (total > kSearchBudget) return false;
  }
  return parts <= 16;
}

// "why (the node's figures)", as an operator reads one node's refusal.
inline std::string WithDetail(std::string why, const RefusalDetail& d) {
  if (!why.empty() && !d.text.empty()) why += Cat(" (", d.text, ")");
  return why;
}

}  // namespace kgpu::extender
