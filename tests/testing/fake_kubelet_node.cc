#include "testing/fake_kubelet_node.h"

#include "common/log.h"
#include "common/sleep.h"
#include "common/strings.h"
#include "k8s/resources.h"

namespace kgpu::testing {
namespace {
using json = nlohmann::json;
}

KubeletNodeStatus::KubeletNodeStatus(FakeKubelet& kubelet, k8s::Client& client, std::string node_name,
                                     std::map<std::string, std::string> node_resources,
                                     std::chrono::milliseconds period)
    : kubelet_(kubelet),
      client_(client),
      node_(std::move(node_name)),
      node_resources_(std::move(node_resources)),
      period_(period) {}

KubeletNodeStatus::~KubeletNodeStatus() {
  Stop();
}

std::map<std::string, std::pair<int, int>> KubeletNodeStatus::DeviceCounts() const {
  std::map<std::string, std::pair<int, int>> out;
  for (const auto& name : kubelet_.Resources()) {
    if (auto st = kubelet_.Get(name)) out[name] = {static_cast<int>(st->devices.size()), st->Healthy()};
  }
  return out;
}

absl::Status KubeletNodeStatus::SyncOnce() {
  const k8s::Resource* nodes = k8s::FindResource("nodes");
  auto node = client_.Get(nodes->Path("", node_));
  if (!node.ok() && k8s::IsApiNotFound(node.status())) {
    // Node registration (kubelet's registerWithAPIServer).
    json obj = {
        {"apiVersion", "v1"},
        {"kind", "Node"},
        {"metadata", {{"name", node_}, {"labels", {{"kubernetes.io/hostname", node_}, {"kubernetes.io/os", "linux"}}}}},
        {"status",
         {{"capacity", node_resources_},
          {"allocatable", node_resources_},
          {"conditions",
           {{{"type", "Ready"},
             {"status", "True"},
             {"reason", "KubeletReady"},
             {"message", "kubelet is posting ready status"},
             {"lastHeartbeatTime", k8s::NowRfc3339()},
             {"lastTransitionTime", k8s::NowRfc3339()}}}},
          {"nodeInfo", {{"kubeletVersion", "v1.32.4"}, {"operatingSystem", "linux"}, {"architecture", "amd64"}}}}}};
    node = client_.Create(nodes->Path(), obj);
    if (!node.ok() && !k8s::IsApiConflict(node.status())) return node.status();
    node = client_.Get(nodes->Path("", node_));
  }
  if (!node.ok()) return node.status();
  if (std::chrono::steady_clock::now() - lease_renewed_ >= std::chrono::seconds(10)) {
    if (auto s = RenewLease(); !s.ok()) return s;
  }
  const json status = node->value("status", json::object());
  json capacity = json::object(), allocatable = json::object();
  for (const auto& [k, v] : node_resources_) {
    capacity[k] = v;
    allocatable[k] = v;
  }
  for (const auto& [name, counts] : DeviceCounts()) {
    capacity[name] = std::to_string(counts.first);
    allocatable[name] = std::to_string(counts.second);
  }
  // Extended resources the node still shows but no plugin serves any more drop to 0, as kubelet
  // does once a resource's endpoint is gone.
  for (const char* field : {"capacity", "allocatable"}) {
    const json cur = status.value(field, json::object());
    json& want = std::string(field) == "capacity" ? capacity : allocatable;
    for (auto it = cur.begin(); it != cur.end(); ++it) {
      if (!want.contains(it.key()) && it.key().find('/') != std::string::npos) want[it.key()] = "0";
    }
  }
  if (status.value("capacity", json::object()) == capacity &&
      status.value("allocatable", json::object()) == allocatable) {
    return absl::OkStatus();
  }
  auto r = client_.Patch(nodes->Path("", node_, "status"),
                         {{"status", {{"capacity", capacity}, {"allocatable", allocatable}}}},
                         "application/strategic-merge-patch+json");
  if (!r.ok()) return r.status();
  ++patches_;
  return absl::OkStatus();
}

// pkg/kubelet/nodelease: the Lease named after the node in kube-node-lease, owned by the Node.
absl::Status KubeletNodeStatus::RenewLease() {
  const k8s::Resource* leases = k8s::FindResource("leases");
  const std::string now = k8s::NowMicroTime();
  auto cur = client_.Get(leases->Path("kube-node-lease", node_));
  if (!cur.ok() && !k8s::IsApiNotFound(cur.status())) return cur.status();
  json lease = cur.ok() ? *cur
                        : json{{"apiVersion", "coordination.k8s.io/v1"},
                               {"kind", "Lease"},
                               {"metadata", {{"name", node_}, {"namespace", "kube-node-lease"}}},
                               {"spec", {{"holderIdentity", node_}, {"leaseDurationSeconds", 40}}}};
  lease["spec"]["renewTime"] = now;
  auto r = cur.ok() ? client_.Update(leases->Path("kube-node-lease", node_), lease)
                    : client_.Create(leases->Path("kube-node-lease"), lease);
  if (!r.ok() && !k8s::IsApiConflict(r.status())) return r.status();
  lease_renewed_ = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

void KubeletNodeStatus::Start() {
  thread_ = std::jthread([this](std::stop_token st) {
    std::string last;
    do {
      auto s = SyncOnce();
      const std::string msg = s.ok() ? "" : std::string(s.message());
      if (msg != last && !msg.empty()) Log("kubelet")->warn("node status of {}: {}", node_, msg);
      last = msg;
    } while (SleepFor(st, period_));
  });
}

void KubeletNodeStatus::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

}  // namespace kgpu::testing
