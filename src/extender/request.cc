#include "extender/request.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

#include "common/strings.h"
#include "k8s/quantity.h"

namespace kgpu::extender {
namespace {
using json = nlohmann::json;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// limits, else requests, of one container: name -> whole number.
absl::StatusOr<std::map<std::string, int64_t>> GpuResources(const json& c, const std::string& cname) {
  std::map<std::string, int64_t> out;
  const json res = c.value("resources", json::object());
  for (const char* section : {"requests", "limits"}) {  // limits win: read last
    const auto it = res.find(section);
    if (it == res.end() || !it->is_object()) continue;
    for (auto r = it->begin(); r != it->end(); ++r) {
      const std::string& name = r.key();
      const bool ours = name == kWholeGpu || name.rfind(kMigPrefix, 0) == 0 || name == kShares ||
                        name == kShareMemory || name == kShareCores;
      if (!ours) continue;
      auto v = WholeQuantity(*r, Cat("container ", cname, ": ", section, "[", name, "]"));
      if (!v.ok()) return v.status();
      out[name] = *v;
    }
  }
  return out;
}

// kubelet's device manager gives a regular init container's devices to the next containers that
// ask for the same resource (devicesToReuse): later init containers, then the first sidecar or
// app container, which keeps them. That container is the init container's target; the init
// container must fit in what the target gets, or its devices would stay with it, held but not
// booked (whole GPUs, MIG), or its share would run with no limits of its own (the node finds a
// share's container through PodResources, which lists no init containers, so it hands the init
// container its target's share).
absl::Status HandOnInitContainers(std::vector<ContainerRequest>& gpus) {
  for (size_t i = 0; i < gpus.size(); ++i) {
    auto& init = gpus[i];
    if (!init.init) continue;
    const std::string resource = init.Resource();
    for (size_t k = i + 1; k < gpus.size() && init.target < 0; ++k) {
      if (!gpus[k].init && gpus[k].Resource() == resource) init.target = static_cast<int>(k);
    }
    if (init.target < 0) {
      return absl::InvalidArgumentError(
          Cat("init container ", init.name, ": asks for ", resource,
              " but no later container does; kubelet hands an init container's devices on to the first later "
              "container asking for the same resource, which the extender places for both (ask for it in the app "
              "container too, or run the GPU work in a sidecar: an init container with restartPolicy: Always)"));
    }
    const auto& t = gpus[static_cast<size_t>(init.target)];
    const bool shares = init.kind == GpuKind::kShare;
    if (shares ? init.count != t.count : init.count > t.count) {
      return absl::InvalidArgumentError(Cat("init container ", init.name, ": asks for ", init.count, " ", resource,
                                            ", container ", t.name,
                                            " (which kubelet hands its devices on to) asks for ", t.count, "; ",
                                            shares ? "an init container's shares must be as many as its"
                                                   : "an init container may ask for at most as many as its",
                                            " (ask for ", shares ? Cat(t.count) : Cat("at most ", t.count), ")"));
    }
    if (shares && (init.memory_mib_total > t.memory_mib_total || init.cores_total > t.cores_total)) {
      return absl::InvalidArgumentError(
          Cat("init container ", init.name, ": asks for ", init.memory_mib_total, " ", kShareMemory, " and ",
              init.cores_total, " ", kShareCores, ", more than container ", t.name, " (", t.memory_mib_total, " and ",
              t.cores_total,
              "), whose shares it runs on (kubelet hands its devices on to it); ask for at "
              "most as much"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> SplitList(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string_view::npos) end = s.size();
    std::string_view item = s.substr(start, end - start);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.remove_prefix(1);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    start = end + 1;
  }
  return out;
}

bool ModelMatches(std::string_view pattern, std::string_view model) {
  if (pattern.empty()) return false;
  return Lower(model).find(Lower(pattern)) != std::string::npos;
}

absl::StatusOr<int64_t> WholeQuantity(const json& value, std::string_view what) {
  std::optional<k8s::Quantity> q;
  if (value.is_string()) {
    q = k8s::Quantity::Parse(value.get<std::string>());
  } else if (value.is_number_integer()) {
    q = k8s::Quantity{value.get<int64_t>() * 1000, false};
  }
  if (!q) {
    return absl::InvalidArgumentError(
        Cat(what, ": ", Printable(value.dump()), " is not a quantity (write a whole number such as 8000, 8k or 1Ki)"));
  }
  if (!q->IsInteger() || q->milli < 0) {
    return absl::InvalidArgumentError(Cat(what, ": ", Printable(value.dump()),
                                          " must be a whole number >= 0 (extended resources cannot be fractional)"));
  }
  return q->Value();
}

std::string ContainerRequest::Resource() const {
  switch (kind) {
    case GpuKind::kWhole:
      return kWholeGpu;
    case GpuKind::kMig:
      return std::string(kMigPrefix) + mig_profile;
    case GpuKind::kShare:
      return kShares;
  }
  return kWholeGpu;
}

std::vector<const ContainerRequest*> PodRequest::Placed() const {
  std::vector<const ContainerRequest*> out;
  for (const auto& c : gpus) {
    if (!c.init) out.push_back(&c);
  }
  return out;
}

absl::StatusOr<PodRequest> ParsePodRequest(const json& pod) {
  PodRequest r;
  const json meta = pod.value("metadata", json::object());
  r.ns = meta.value("namespace", "default");
  r.name = meta.value("name", "");
  r.uid = meta.value("uid", "");
  const json spec = pod.value("spec", json::object());
  if (spec.contains("priority") && spec["priority"].is_number_integer()) r.priority = spec["priority"].get<int64_t>();
  const json ann = meta.value("annotations", json::object());
  auto annotation = [&](const char* key) -> std::string {
    const auto it = ann.find(key);
    return it != ann.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  r.models = SplitList(annotation(kAnnotationModels));
  r.models_deny = SplitList(annotation(kAnnotationModelsDeny));
  r.uuids = SplitList(annotation(kAnnotationUuids));
  r.uuids_deny = SplitList(annotation(kAnnotationUuidsDeny));
  r.enforcement = annotation(kAnnotationEnforcement);
  if (!r.enforcement.empty() && r.enforcement != "hard" && r.enforcement != "mps" && r.enforcement != "none") {
    return absl::InvalidArgumentError(Cat("annotation ", kAnnotationEnforcement, ": '", Printable(r.enforcement),
                                          "' is not a mode (use hard, mps or none)"));
  }
  r.placement = annotation(kAnnotationPlacement);
  if (!r.placement.empty() && r.placement != "binpack" && r.placement != "spread") {
    return absl::InvalidArgumentError(Cat("annotation ", kAnnotationPlacement, ": '", Printable(r.placement),
                                          "' is not a placement (use binpack or spread)"));
  }

  for (const char* section : {"initContainers", "containers"}) {
    const auto list = spec.find(section);
    if (list == spec.end() || !list->is_array()) continue;
    for (const auto& c : *list) {
      if (!c.is_object()) continue;
      const std::string cname = c.value("name", "");
      auto res = GpuResources(c, cname);
      if (!res.ok()) return res.status();
      int64_t whole = 0, shares = 0, memory = 0, cores = 0;
      std::string mig;
      int64_t mig_count = 0;
      for (const auto& [name, v] : *res) {
        if (v == 0) continue;
        if (name == kWholeGpu)
          whole = v;
        else if (name == kShares)
          shares = v;
        else if (name == kShareMemory)
          memory = v;
        else if (name == kShareCores)
          cores = v;
        else {
          if (!mig.empty()) {
            return absl::InvalidArgumentError(Cat("container ", cname, ": asks for two MIG profiles (", kMigPrefix, mig,
                                                  " and ", name, "); one container takes one MIG instance"));
          }
          mig = name.substr(std::string_view(kMigPrefix).size());
          mig_count = v;
        }
      }
      const int kinds = (whole > 0) + (mig_count > 0) + (shares > 0 || memory > 0 || cores > 0);
      if (kinds == 0) continue;
      if (kinds > 1) {
        return absl::InvalidArgumentError(Cat("container ", cname, ": asks for more than one kind of GPU (", kWholeGpu,
                                              ", ", kMigPrefix, "<profile> and ", kShares,
                                              " exclude each other); keep one of them"));
      }
      ContainerRequest cr;
      cr.name = cname;
      // A restartable init container (restartPolicy: Always) is a sidecar: it runs beside the app
      // containers and keeps its devices, as they do.
      cr.init = std::string_view(section) == "initContainers" && c.value("restartPolicy", "") != "Always";
      if (whole > 0) {
        cr.kind = GpuKind::kWhole;
        cr.count = static_cast<int>(std::min<int64_t>(whole, 1 << 20));
      } else if (mig_count > 0) {
        if (mig_count != 1) {
          return absl::InvalidArgumentError(
              Cat("container ", cname, ": ", kMigPrefix, mig, ": ", mig_count,
                  " instances; the extender places one MIG instance per container (ask for 1)"));
        }
        cr.kind = GpuKind::kMig;
        cr.count = 1;
        cr.mig_profile = mig;
      } else {
        if (shares == 0) {
          return absl::InvalidArgumentError(Cat("container ", cname, ": asks for ",
                                                memory > 0 ? kShareMemory : kShareCores, " without ", kShares, " (add ",
                                                kShares, ": 1 to its requests and limits; kgpu webhook does this)"));
        }
        if (shares > 64) {
          return absl::InvalidArgumentError(Cat("container ", cname, ": ", kShares, ": ", shares,
                                                " shares is more GPUs than a node has (at most 64)"));
        }
        if (memory % shares != 0) {
          return absl::InvalidArgumentError(Cat("container ", cname, ": ", kShareMemory, " ", memory,
                                                " does not split evenly over ", shares, " shares (use a multiple of ",
                                                shares, ", e.g. ", memory - memory % shares, ")"));
        }
        if (cores % shares != 0) {
          return absl::InvalidArgumentError(Cat("container ", cname, ": ", kShareCores, " ", cores,
                                                " does not split evenly over ", shares, " shares (use a multiple of ",
                                                shares, ", e.g. ", cores - cores % shares, ")"));
        }
        if (cores / shares > 100) {
          return absl::InvalidArgumentError(Cat("container ", cname, ": ", kShareCores, " ", cores, " over ", shares,
                                                " shares is ", cores / shares,
                                                "% of one GPU per share (at most 100; ask for more shares)"));
        }
        cr.kind = GpuKind::kShare;
        cr.count = static_cast<int>(shares);
        cr.memory_mib_total = memory;
        cr.cores_total = cores;
      }
      const json sc = c.value("securityContext", json::object());
      cr.privileged = sc.is_object() && sc.value("privileged", false);
      r.gpus.push_back(std::move(cr));
    }
  }
  if (auto st = HandOnInitContainers(r.gpus); !st.ok()) return st;
  return r;
}

}  // namespace kgpu::extender
