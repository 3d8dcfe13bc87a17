#include "testing/kubelet_admission.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "k8s/quantity.h"
#include "kubelet/checksum.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;

std::string PodPath(const std::string& ns, const std::string& name) {
  return "/api/v1/namespaces/" + ns + "/pods/" + name;
}

// limits, else requests: the device count kubelet allocates for `resource` (0 when absent).
int64_t DeviceRequest(const json& container, const std::string& resource) {
  const json res = container.value("resources", json::object());
  for (const char* field : {"limits", "requests"}) {
    const json m = res.value(field, json::object());
    if (m.contains(resource) && m[resource].is_string()) {
      const auto q = k8s::Quantity::Parse(m[resource].get<std::string>());
      return q ? q->Value() : 0;
    }
  }
  return 0;
}

std::vector<std::string> ResourceNames(const json& container) {
  std::set<std::string> names;
  const json res = container.value("resources", json::object());
  for (const char* field : {"limits", "requests"}) {
    const json m = res.value(field, json::object());
    for (const auto& [k, v] : m.items()) names.insert(k);
  }
  return {names.begin(), names.end()};
}

}  // namespace

KubeletAdmission::KubeletAdmission(FakeKubelet& kubelet, FakePodResources& pod_resources, k8s::Client& api,
                                   std::string node, uint32_t seed)
    : kubelet_(kubelet), pod_resources_(pod_resources), api_(api), node_(std::move(node)), rng_(seed) {}

// kubelet's podDevices.devices(): every container's devices, init containers' too (kubelet keeps
// them for the pod until it ends, whether or not a later container reused them).
std::map<std::string, std::set<std::string>> KubeletAdmission::InUse() const {
  std::map<std::string, std::set<std::string>> out;
  for (const auto& [uid, p] : admitted_) {
    for (const auto& c : p.containers) out[c.resource].insert(c.ids.begin(), c.ids.end());
  }
  return out;
}

// kubelet's devicesToAllocate: the pod's reusable devices (its init containers') first; then, when
// more are needed and there is a choice, GetPreferredAllocation with the reused ones as
// must-include, its answer checked and otherwise kubelet's own pick.
absl::StatusOr<std::vector<std::string>> KubeletAdmission::Choose(const std::string& resource, int need,
                                                                  const std::set<std::string>& reusable) {
  const auto state = kubelet_.Get(resource);
  if (!state || !state->connected) return absl::FailedPreconditionError(resource + ": no plugin serving it");
  const auto healthy_ids = state->HealthyIds();
  const std::set<std::string> healthy(healthy_ids.begin(), healthy_ids.end());
  std::vector<std::string> taken;
  for (const auto& id : reusable) {
    if (static_cast<int>(taken.size()) < need && healthy.contains(id)) taken.push_back(id);
  }
  if (static_cast<int>(taken.size()) == need) return taken;
  const int needed = need - static_cast<int>(taken.size());
  const auto used = InUse()[resource];
  std::vector<std::string> free;
  for (const auto& id : healthy) {
    if (!used.contains(id)) free.push_back(id);
  }
  if (static_cast<int>(free.size()) < needed) {
    return absl::ResourceExhaustedError("Requested: " + std::to_string(need) +
                                        ", Available: " + std::to_string(free.size()) + " of " + resource);
  }
  if (static_cast<int>(free.size()) > needed && state->options.get_preferred_allocation_available()) {
    std::vector<std::string> available = free;
    available.insert(available.end(), taken.begin(), taken.end());
    std::sort(available.begin(), available.end());
    auto pref = kubelet_.GetPreferredAllocation(resource, available, taken, need);
    if (!pref.ok())
      return absl::Status(pref.status().code(),
                          "GetPreferredAllocation rpc failed: " + std::string(pref.status().message()));
    // kubelet keeps the answer only when it is a valid choice, else picks by itself.
    std::set<std::string> chosen(pref->begin(), pref->end());
    const bool valid =
        static_cast<int>(chosen.size()) == need &&
        std::all_of(
            chosen.begin(), chosen.end(),
            [&](const std::string& id) { return std::binary_search(available.begin(), available.end(), id); }) &&
        std::all_of(taken.begin(), taken.end(), [&](const std::string& id) { return chosen.contains(id); });
    if (valid) return *pref;
  }
  // kubelet's own pick: a random subset (its map iteration order), here from the seeded rng.
  std::shuffle(free.begin(), free.end(), rng_);
  free.resize(static_cast<size_t>(needed));
  taken.insert(taken.end(), free.begin(), free.end());
  return taken;
}

void KubeletAdmission::Publish() {
  v1::ListPodResourcesResponse view;
  for (const auto& [uid, p] : admitted_) {
    for (const auto& c : p.containers) {
      if (!c.init) AddDevices(view, p.ns, p.name, c.name, c.resource, c.ids);
    }
  }
  pod_resources_.SetListResponse(view);
  WriteCheckpoint();
}

// kubelet's devicemanager writeCheckpoint: every container's devices (init containers too) grouped
// by the NUMA nodes the plugin reported for them (-1: none), its Allocate response as protobuf
// bytes (base64 in JSON), and each registered resource's healthy devices; signed as kubelet signs
// it; written to a temporary file and renamed, so a reader never sees half of it.
void KubeletAdmission::WriteCheckpoint() {
  std::map<std::string, std::map<std::string, std::vector<int64_t>>> numa;  // resource -> id -> nodes
  json registered = json::object();
  for (const auto& resource : kubelet_.Resources()) {
    const auto state = kubelet_.Get(resource);
    if (!state) continue;
    for (const auto& d : state->devices) numa[resource][d.id] = d.numa;
    registered[resource] = state->connected ? state->HealthyIds() : std::vector<std::string>{};
  }
  json entries = json::array();
  for (const auto& [uid, p] : admitted_) {
    for (const auto& c : p.containers) {
      std::map<int64_t, std::vector<std::string>> per_numa;
      for (const auto& id : c.ids) {
        const auto& nodes = numa[c.resource][id];
        if (nodes.empty()) per_numa[-1].push_back(id);
        for (int64_t n : nodes) per_numa[n].push_back(id);
      }
      json ids = json::object();
      for (const auto& [n, list] : per_numa) ids[std::to_string(n)] = list;
      entries.push_back({{"PodUID", uid},
                         {"ContainerName", c.name},
                         {"ResourceName", c.resource},
                         {"DeviceIDs", ids},
                         {"AllocResp", absl::Base64Escape(c.response.SerializeAsString())}});
    }
  }
  const json doc = kubelet::WithKubeletChecksum(
      {{"Data", {{"PodDeviceEntries", entries.empty() ? json(nullptr) : entries}, {"RegisteredDevices", registered}}}});
  const std::string path = kubelet_.Dir() + "/kubelet_internal_checkpoint";
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << doc.dump();
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

void KubeletAdmission::SetPhase(const AdmittedPod& p, const std::string& phase, const std::string& reason,
                                const std::string& message) {
  json status = {{"phase", phase}};
  if (!reason.empty()) {
    status["reason"] = reason;
    status["message"] = message;
  }
  (void)api_.Patch(PodPath(p.ns, p.name) + "/status", {{"status", status}}, "application/merge-patch+json");
}

absl::StatusOr<std::vector<AdmittedPod>> KubeletAdmission::AdmitPending() {
  k8s::ListOptions lo;
  lo.field_selector = "spec.nodeName=" + node_;
  auto list = api_.List("/api/v1/pods", lo);
  if (!list.ok()) return list.status();
  // Pods gone (or terminating) give their devices back, as kubelet's pod termination does.
  std::set<std::string> live;
  std::vector<json> pending;
  for (const auto& pod : (*list)["items"]) {
    const json& meta = pod["metadata"];
    const std::string uid = meta.value("uid", "");
    const std::string phase = pod.value("status", json::object()).value("phase", "");
    if (meta.contains("deletionTimestamp") || phase == "Succeeded" || phase == "Failed") continue;
    live.insert(uid);
    if (!admitted_.contains(uid) && !failed_.contains(uid)) pending.push_back(pod);
  }
  std::erase_if(admitted_, [&](const auto& kv) { return !live.contains(kv.first); });
  std::shuffle(pending.begin(), pending.end(), rng_);

  std::vector<AdmittedPod> round;
  for (const auto& pod : pending) {
    AdmittedPod p{pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"], {}, absl::OkStatus()};
    std::map<std::string, std::set<std::string>> from_init;  // devices init containers used, reusable
    std::vector<std::pair<const json*, bool>> order;         // container, regular init container
    const json& spec = pod["spec"];
    if (spec.contains("initContainers")) {
      // A restartable init container (sidecar) keeps its devices as an app container does.
      for (const auto& c : spec["initContainers"]) order.emplace_back(&c, c.value("restartPolicy", "") != "Always");
    }
    for (const auto& c : spec["containers"]) order.emplace_back(&c, false);
    for (const auto& [c, init] : order) {
      for (const auto& resource : ResourceNames(*c)) {
        if (!kubelet_.Get(resource)) continue;  // not a device-plugin resource: kubelet skips it
        const int64_t need = DeviceRequest(*c, resource);
        if (need <= 0) continue;
        // Devices held by this pod's earlier containers count as used; its init containers' are reusable.
        admitted_[p.uid] = p;
        auto ids = Choose(resource, static_cast<int>(need), from_init[resource]);
        admitted_.erase(p.uid);
        if (!ids.ok()) {
          p.status = ids.status();
          break;
        }
        auto a = kubelet_.Allocate(resource, *ids);
        if (!a.ok()) {
          p.status = a.status();
          break;
        }
        AdmittedContainer ac{(*c)["name"], init, resource, *ids, a->container_responses(0), false};
        // kubelet's devicesToReuse: a regular init container's devices go on to the next
        // containers; a sidecar or app container that took them keeps them.
        for (const auto& id : *ids) {
          if (init) {
            from_init[resource].insert(id);
          } else {
            from_init[resource].erase(id);
          }
        }
        p.containers.push_back(std::move(ac));
      }
      if (!p.status.ok()) break;
    }
    if (p.status.ok()) {
      admitted_[p.uid] = p;
    } else {
      failed_.insert(p.uid);
    }
    round.push_back(std::move(p));
  }
  Publish();
  // PreStartContainer for every container of the round at once (pod workers run concurrently).
  std::vector<std::thread> threads;
  std::vector<std::pair<size_t, size_t>> calls;
  for (size_t i = 0; i < round.size(); ++i) {
    if (!round[i].status.ok()) continue;
    for (size_t k = 0; k < round[i].containers.size(); ++k) {
      const auto state = kubelet_.Get(round[i].containers[k].resource);
      if (state && state->options.pre_start_required()) calls.emplace_back(i, k);
    }
  }
  std::vector<absl::Status> results(calls.size());
  for (size_t j = 0; j < calls.size(); ++j) {
    threads.emplace_back([&, j] {
      const auto& c = round[calls[j].first].containers[calls[j].second];
      results[j] = kubelet_.PreStartContainer(c.resource, c.ids);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t j = 0; j < calls.size(); ++j) {
    auto& p = round[calls[j].first];
    if (results[j].ok()) {
      p.containers[calls[j].second].pre_started = true;
    } else if (p.status.ok()) {
      p.status = results[j];
    }
  }
  for (auto& p : round) {
    if (p.status.ok()) {
      admitted_[p.uid] = p;
      SetPhase(p, "Running", "", "");
    } else {
      admitted_.erase(p.uid);
      failed_.insert(p.uid);
      SetPhase(p, "Failed", "UnexpectedAdmissionError", std::string(p.status.message()));
    }
  }
  Publish();
  return round;
}

}  // namespace kgpu::testing
