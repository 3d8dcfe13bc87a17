// State's explanations: why a node cannot take a pod, as one reason per cause (what kube-scheduler
// counts) and the node's own figures (RefusalDetail) for whoever asks about one node.
#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/strings.h"
#include "extender/state.h"
#include "extender/state_internal.h"

namespace kgpu::extender {

using json = nlohmann::json;

std::string State::ExplainLocked(const Compiled& c, const std::string& name, bool* unresolvable, const char** category,
                                 RefusalMemo* memo, RefusalDetail* detail) {
  *unresolvable = true;
  const char* unused = nullptr;
  const char*& cat = category != nullptr ? *category : unused;
  cat = "invalid_request";
  if (!c.pod_error.empty()) return c.pod_error;
  if (!c.wants_gpu) {
    *unresolvable = false;
    return "";
  }
  const auto it = nodes_.find(name);
  const int id = it == nodes_.end() ? -1 : it->second.engine_id;  // one lookup per node, not two
  cat = "no_inventory";
  if (it == nodes_.end() || id < 0)
    return Cat("node has no ", kInventoryAnnotation, " annotation (run kgpu node-labels on it)");
  const NodeInfo& info = it->second;
  const bool shares =
      std::any_of(c.parts.begin(), c.parts.end(), [&](const Part& p) { return c.Gpu(p).kind == GpuKind::kShare; });
  if (shares && !c.pod.enforcement.empty()) {  // else the node's first mode, permitted by definition
    const std::string& mode = c.pod.enforcement;
    if (std::find(info.enforcement.begin(), info.enforcement.end(), mode) == info.enforcement.end()) {
      cat = "enforcement";
      if (detail != nullptr && detail->want_text) detail->text = Cat("it permits: ", Join(info.enforcement, ", "));
      return Cat("enforcement '", mode, "' is not permitted on this node");
    }
  }
  if (c.parts.size() == 1) return ExplainPartLocked(c, c.parts[0], name, info, id, unresolvable, cat, memo, detail);

  // Several GPU containers: each must fit with those before it booked (a trial, undone).
  const auto& ns = engine_->cluster().node(id);
  int whole_needed = 0, whole_here = 0;
  for (const auto& p : c.parts) whole_needed += c.Gpu(p).kind == GpuKind::kWhole ? c.Gpu(p).count : 0;
  for (size_t i = 0; i < info.gpus.size() && i < ns.gpus.size(); ++i) {
    whole_here += info.gpus[i].slots == 0 && ns.gpus[i].mig.empty() ? 1 : 0;
  }
  if (whole_needed > whole_here) {
    cat = "too_few_gpus";
    if (detail != nullptr) {
      detail->nearness = static_cast<double>(whole_here) / whole_needed;
      if (detail->want_text) detail->text = Cat("it has ", whole_here);
    }
    return Cat("fewer than ", whole_needed, " GPUs on this node serve whole-GPU pods (", kWholeGpu,
               "), which the pod's containers ask for together");
  }
  if (c.pod.uuids.empty() && c.pod.uuids_deny.empty() && SearchIsComplete(c.parts.size(), info.gpus.size())) {
    // The common case: single-GPU shares that first fit places side by side on a copy of the
    // node's figures, without booking each on trial. The bind's search (SearchPartsLocked) tries
    // every GPU for each such share within a budget this pod and node cannot exhaust, so it finds
    // an arrangement wherever this one exists: the filter never passes what the bind refuses.
    std::array<const sched::Request*, 16> reqs{};
    for (size_t i = 0; i < c.parts.size(); ++i) reqs[i] = &c.parts[i].req;
    if (engine_->cluster().SharesFitTogether({reqs.data(), c.parts.size()}, id)) {
      *unresolvable = false;
      return "";
    }
  }
  const auto masked = MaskLocked(c, name);
  std::vector<std::string> placed;
  std::string why;
  bool beside_others = false;  // the refusal came with some of the pod's containers placed
  for (const auto& part : c.parts) {
    why = ExplainPartLocked(c, part, name, info, id, unresolvable, cat, nullptr, detail);
    if (!why.empty()) {
      beside_others = !placed.empty();
      why = Cat("container ", c.Gpu(part).name, ": ", why,
                placed.empty() ? std::string() : Cat(" (with the pod's other GPU containers placed)"));
      break;
    }
    beside_others = !placed.empty();
    if (!TryPlacePartLocked(c, part, id, Cat("?", part.ereq.name), &placed, nullptr)) {
      *unresolvable = false;
      cat = "gpus_busy";
      why = Cat("container ", c.Gpu(part).name, ": no GPUs left for it once the pod's other GPU containers are placed");
      break;
    }
  }
  for (const auto& key : placed) (void)engine_->Release(key);
  placed.clear();
  // The policy's choice for one container may take the only GPU that fits another: before
  // refusing for what the containers do to each other, look for an arrangement that fits.
  if (!why.empty() && beside_others && SearchPartsLocked(c, id, "?", &placed)) {
    for (const auto& key : placed) (void)engine_->Release(key);
    why.clear();
    *unresolvable = false;
  }
  UnmaskLocked(name, masked);
  return why;
}

std::string State::ExplainPartLocked(const Compiled& c, const Part& part, const std::string& name, const NodeInfo& info,
                                     int id, bool* unresolvable, const char*& cat, RefusalMemo* memo,
                                     RefusalDetail* detail) {
  *unresolvable = true;
  const auto& ns = engine_->cluster().node(id);
  const ContainerRequest& g = c.Gpu(part);
  const bool shares = g.kind == GpuKind::kShare;
  // The common case first: the node takes the pod now. NodeFits checks the kind (the engine's
  // model names carry it), models, health and free capacity; only the UUID lists need masking.
  if (c.pod.uuids.empty() && c.pod.uuids_deny.empty() && engine_->cluster().NodeFits(part.req, id)) {
    *unresolvable = false;
    return "";
  }
  // NVIDIA's `single` MIG strategy advertises each MIG device as nvidia.com/gpu: kubelet counts
  // them as GPUs, and the extender does not place such devices (it books MIG as nvidia.com/mig-*).
  if (info.mig_strategy == "single") {
    cat = "mig_strategy_single";
    return "this node's device plugin runs migStrategy single (its MIG devices are nvidia.com/gpu), which kgpu "
           "extender does not place; run it with migStrategy mixed (nvidia.com/mig-<profile>)";
  }
  const bool want_text = detail != nullptr && detail->want_text;
  // UUID lists make the answer depend on more than the shape.
  if (memo != nullptr && !c.pod.uuids.empty()) memo = nullptr;
  if (memo != nullptr && !c.pod.uuids_deny.empty()) memo = nullptr;
  if (memo != nullptr) {
    if (const auto m = memo->find(info.shape_id); m != memo->end()) {
      cat = m->second.category;
      if (detail != nullptr) detail->nearness = m->second.detail.nearness;
      if (want_text) detail->text = m->second.detail.text;
      return m->second.why;
    }
  }
  const int need = g.kind == GpuKind::kMig ? 1 : g.count;
  const int64_t per_mem = shares ? g.MemoryPerGpu() : 0;
  int kind_ok = 0, model_ok = 0, uuid_ok = 0, healthy_ok = 0, fit_ok = 0;
  int64_t largest_total = 0;
  std::vector<size_t> eligible, healthy;
  auto right_kind = [&](size_t i) {
    return shares ? info.gpus[i].slots > 0
                  : (info.gpus[i].slots == 0 && (g.kind == GpuKind::kMig) == !ns.gpus[i].mig.empty());
  };
  for (size_t i = 0; i < info.gpus.size() && i < ns.gpus.size(); ++i) {
    const GpuInfo& gi = info.gpus[i];
    const auto& gs = ns.gpus[i];
    if (!right_kind(i)) continue;
    ++kind_ok;
    if (gs.model < 0 || ((part.req.models >> gs.model) & 1U) == 0) continue;
    ++model_ok;
    const bool allowed =
        c.pod.uuids.empty() || std::find(c.pod.uuids.begin(), c.pod.uuids.end(), gi.uuid) != c.pod.uuids.end();
    const bool denied = std::find(c.pod.uuids_deny.begin(), c.pod.uuids_deny.end(), gi.uuid) != c.pod.uuids_deny.end();
    if (!allowed || denied) continue;
    ++uuid_ok;
    if (!gi.healthy) continue;
    ++healthy_ok;
    healthy.push_back(i);
    bool fits = true;
    if (shares) {
      largest_total = std::max(largest_total, gi.memory_mib);
      fits = gi.memory_mib >= per_mem && (per_mem == 0 || gi.memory_mib > 0);
    } else if (g.kind == GpuKind::kMig) {
      fits = std::any_of(gs.mig.begin(), gs.mig.end(), [&](const auto& m) { return m.profile == g.mig_profile; });
    }
    if (!fits) continue;
    ++fit_ok;
    eligible.push_back(i);
  }
  // "no GPU …" for a pod that needs one, "fewer than N GPUs …" for one that needs several.
  const auto few = [&](std::string_view one, std::string_view many) {
    return need == 1 ? Cat("no GPU ", one) : Cat("fewer than ", need, " GPUs ", many);
  };
  const auto fraction = [](double have, double want) { return want <= 0 ? 0.0 : std::min(1.0, have / want); };
  if (fit_ok < need) {  // no capacity of the right kind here, used or not: preemption cannot help
    RefusalDetail d;    // a shape's refusal is words once, whoever asks
    std::string why = [&]() -> std::string {
      if (kind_ok < need) {
        cat = "too_few_gpus";
        d.nearness = fraction(kind_ok, need);
        d.text = Cat("it has ", kind_ok);
        if (shares)
          return few(Cat("on this node serves shares (", kShares, ")"),
                     Cat("on this node serve shares (", kShares, ")"));
        if (g.kind == GpuKind::kMig) return "no GPU on this node is in MIG mode";
        return few(Cat("on this node serves whole-GPU pods (", kWholeGpu, ")"),
                   Cat("on this node serve whole-GPU pods (", kWholeGpu, ")"));
      }
      if (model_ok < need) {
        cat = "model";
        std::set<std::string> node_models;
        for (size_t i = 0; i < info.gpus.size() && i < ns.gpus.size(); ++i) {
          if (right_kind(i)) node_models.insert(info.gpus[i].model);
        }
        d.text = Cat("this node has: ", Join(node_models, ", "));
        return few("of the pod's models here", "of the pod's models here");
      }
      if (uuid_ok < need) {
        cat = "uuid";
        d.text = Cat(uuid_ok, " left");
        return Cat("the pod's GPU UUID lists leave ", need == 1 ? "no GPU" : Cat("fewer than ", need, " GPUs"),
                   " on this node");
      }
      cat = "unhealthy";
      if (healthy_ok < need) {
        d.nearness = fraction(healthy_ok, need);
        d.text = Cat(uuid_ok - healthy_ok, " unhealthy");
        return need == 1 ? std::string("no healthy GPU of the pod's kind on this node")
                         : Cat("fewer than ", need, " healthy GPUs of the pod's kind on this node");
      }
      cat = shares ? "gpu_too_small" : "no_mig_profile";
      if (shares) {
        d.nearness = need == 1 ? fraction(static_cast<double>(largest_total), static_cast<double>(per_mem))
                               : fraction(fit_ok, need);
        d.text = need == 1 ? Cat("largest: ", largest_total, " MiB") : Cat(fit_ok, " have");
        return Cat(few("on this node has ", "on this node have "), per_mem, " MiB in total");
      }
      std::map<std::string, int> mig_profiles;
      for (size_t i : healthy) {
        for (const auto& m : ns.gpus[i].mig) ++mig_profiles[m.profile];
      }
      std::vector<std::string> have;
      for (const auto& [p, n] : mig_profiles) have.push_back(Cat(p, " x", n));
      d.text = Cat("it has: ", have.empty() ? std::string("none") : Join(have, ", "));
      return Cat("no MIG ", g.mig_profile, " instance on this node");
    }();
    if (detail != nullptr) detail->nearness = d.nearness;
    if (want_text) detail->text = d.text;
    if (memo != nullptr) memo->emplace(info.shape_id, StaticRefusal{why, cat, std::move(d)});
    return why;
  }

  // Capacity exists: is it free now?
  const auto masked = MaskLocked(c, name);
  const bool fits = engine_->cluster().NodeFits(part.req, id);
  UnmaskLocked(name, masked);
  if (fits) {
    *unresolvable = false;
    return "";
  }
  *unresolvable = false;  // lower-priority pods hold it: preemption can help
  cat = "gpus_busy";
  // Memory of the eligible GPUs in use outside the records (its node's report).
  const auto outside = [&]() -> std::string {
    int64_t untracked = 0;
    for (size_t i : eligible) untracked += ns.gpus[i].untracked_mib;
    return untracked > 0 ? Cat("; ", untracked, " MiB of their memory is in use outside kgpu's records") : "";
  };
  if (g.kind == GpuKind::kWhole) {
    int free = 0;
    for (size_t i : eligible) free += ns.gpus[i].FullyFree() ? 1 : 0;
    if (detail != nullptr) detail->nearness = fraction(free, need);
    if (want_text) detail->text = Cat(free, " of ", eligible.size(), " free", outside());
    return need == 1 ? std::string("no free GPU here for a whole-GPU pod")
                     : Cat("fewer than ", need, " free GPUs here for a whole-GPU pod");
  }
  if (g.kind == GpuKind::kMig) {
    cat = "mig_busy";
    int total = 0, used = 0;
    for (size_t i : eligible) {
      const auto& gs = ns.gpus[i];
      for (size_t k = 0; k < gs.mig.size(); ++k) {
        if (gs.mig[k].profile != g.mig_profile) continue;
        ++total;
        used += gs.mig_used[k] ? 1 : 0;
      }
    }
    if (want_text) detail->text = Cat(used, " of ", total, " in use");
    return Cat("every MIG ", g.mig_profile, " instance here is in use");
  }
  int mem_ok = 0, cores_ok = 0, slots_ok = 0, all_ok = 0;
  int64_t best_mem = -1, best_milli = -1;
  size_t best_mem_gpu = 0, best_cores_gpu = 0;
  for (size_t i : eligible) {
    const auto& gs = ns.gpus[i];
    const bool m = gs.free_memory_mib >= per_mem;
    const bool k = gs.free_milli >= part.req.milli;
    const bool s = gs.max_shares == 0 || gs.pods < gs.max_shares;
    mem_ok += m;
    cores_ok += k;
    slots_ok += s;
    all_ok += m && k && s;
    if (s && gs.free_memory_mib > best_mem) {
      best_mem = gs.free_memory_mib;
      best_mem_gpu = i;
    }
    if (s && gs.free_milli > best_milli) {
      best_milli = gs.free_milli;
      best_cores_gpu = i;
    }
  }
  if (slots_ok < need) {
    cat = "slots";
    if (detail != nullptr) detail->nearness = fraction(slots_ok, need);
    if (want_text) {
      detail->text =
          Cat(slots_ok, " have; ", eligible.empty() ? 0 : ns.gpus[eligible[0]].max_shares, " shares per GPU");
    }
    return need == 1 ? std::string("every GPU here already holds its most shares")
                     : Cat("fewer than ", need, " GPUs here have a free share slot");
  }
  if (mem_ok < need || (per_mem > 0 && all_ok < need && cores_ok >= need)) {
    cat = "memory";
    if (detail != nullptr) {
      detail->nearness = need == 1 ? fraction(static_cast<double>(best_mem), static_cast<double>(per_mem))
                                   : fraction(std::min(mem_ok, all_ok), need);
    }
    if (want_text) {
      detail->text = Cat(need == 1 ? std::string() : Cat(std::min(mem_ok, all_ok), " have; "),
                         best_mem >= 0 ? Cat("largest free: ", best_mem, " MiB on ", info.gpus[best_mem_gpu].uuid) : "",
                         outside());
    }
    if (need == 1) return Cat("no single GPU with ", per_mem, " MiB free");
    return Cat("fewer than ", need, " GPUs here have ", per_mem, " MiB free");
  }
  cat = "cores";
  const int64_t pct = part.req.milli / 10;
  if (detail != nullptr) {
    detail->nearness = need == 1 ? fraction(static_cast<double>(best_milli), static_cast<double>(part.req.milli))
                                 : fraction(std::min(cores_ok, all_ok), need);
  }
  if (want_text) {
    detail->text =
        Cat(need == 1 ? std::string() : Cat(std::min(cores_ok, all_ok), " have; "),
            best_milli >= 0 ? Cat("most free: ", best_milli / 10, "% on ", info.gpus[best_cores_gpu].uuid) : "");
  }
  if (need == 1) return Cat("no single GPU with ", pct, "% of its cores free");
  return Cat("fewer than ", need, " GPUs here have ", pct, "% of their cores free");
}

std::string State::Explain(const json& pod, const std::string& node) {
  std::lock_guard lock(mu_);
  auto c = CompileLocked(pod);
  bool unres = false;
  RefusalDetail d;
  std::string why = HeldLocked(*c, node, &d);
  if (why.empty()) why = ExplainLocked(*c, node, &unres, nullptr, nullptr, &d);
  return WithDetail(std::move(why), d);
}

}  // namespace kgpu::extender
