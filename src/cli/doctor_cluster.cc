#include "cli/doctor_cluster.h"

#include <algorithm>
#include <ctime>

#include <unistd.h>

#include "common/strings.h"
#include "deviceplugin/server.h"
#include "k8s/config.h"
#include "k8s/quantity.h"

namespace kgpu::cli {
namespace {
using json = nlohmann::json;

int64_t Count(const json& list, const std::string& resource) {
  if (!list.is_object() || !list.contains(resource)) return -1;
  const auto q =
      k8s::Quantity::Parse(list[resource].is_string() ? list[resource].get<std::string>() : list[resource].dump());
  return q ? q->Value() : -1;
}

}  // namespace

std::map<std::string, Served> ServedResources(const std::string& kubelet_dir) {
  std::map<std::string, Served> out;
  for (const auto& s : deviceplugin::PluginSockets(kubelet_dir)) {
    std::string resource = s.substr(0, s.size() - 5);
    if (resource.rfind("nvidia-", 0) == 0) resource = "nvidia.com/" + resource.substr(7);
    auto devices = deviceplugin::ReadAdvertised(Cat(kubelet_dir, "/", s), std::chrono::seconds(2));
    if (!devices.ok()) continue;
    Served v;
    v.devices = devices->size();
    v.healthy =
        static_cast<size_t>(std::count_if(devices->begin(), devices->end(), [](const auto& d) { return d.healthy; }));
    out[resource] = v;
  }
  return out;
}

std::vector<Check> ClusterChecks(k8s::Client& client, const std::string& node_name,
                                 const std::map<std::string, Served>& served, size_t gpus, int64_t now) {
  std::vector<Check> checks;
  auto node = client.Get(k8s::FindResource("nodes")->Path("", node_name));
  if (!node.ok()) {
    if (k8s::IsApiNotFound(node.status())) {
      checks.push_back({"Node object", Verdict::kFail,
                        Cat("no Node named \"", node_name, "\" in ", client.config().server),
                        "pass --node-name (or NODE_NAME) with the name kubelet registered (kubectl get nodes)"});
    } else {
      checks.push_back(
          {"Node object", Verdict::kFail, std::string(node.status().message()),
           k8s::HttpStatus(node.status()) == 403
               ? "grant this identity get on nodes (deploy/device-plugin/rbac.yaml, ClusterRole kgpu-device-plugin)"
               : "check the kubeconfig (server, credentials) or the in-cluster service account"});
    }
    return checks;
  }
  checks.push_back({"Node object", Verdict::kPass,
                    Cat(node_name, " (resourceVersion ", (*node)["metadata"].value("resourceVersion", ""), ")"), ""});
  const json status = node->value("status", json::object());
  const json capacity = status.value("capacity", json::object());
  const json allocatable = status.value("allocatable", json::object());
  // Extended nvidia.com resources the node advertises that no local plugin serves: a rename.
  std::vector<std::string> foreign;
  for (auto it = capacity.begin(); it != capacity.end(); ++it) {
    if (it.key().rfind("nvidia.com/", 0) == 0 && !served.contains(it.key()) && Count(capacity, it.key()) > 0) {
      foreign.push_back(Cat(it.key(), "=", Count(capacity, it.key())));
    }
  }
  if (served.empty()) {
    // No plugin socket here to compare with: the Node alone says whether kubelet can hand out
    // GPUs. Allocatable 0 (or absent) on a node with GPUs is the seed's `kubectl describe node |
    // grep nvidia.com/gpu` case: no pod asking for one can land here.
    std::vector<std::string> resources;
    for (auto it = capacity.begin(); it != capacity.end(); ++it) {
      if (it.key().rfind("nvidia.com/", 0) == 0) resources.push_back(it.key());
    }
    if (resources.empty() && gpus > 0) resources.push_back("nvidia.com/gpu");
    bool failed = false;
    for (const auto& resource : resources) {
      const int64_t cap = Count(capacity, resource);
      if (Count(allocatable, resource) > 0) continue;
      failed = true;
      checks.push_back(
          {"Node allocatable", Verdict::kFail,
           Cat("allocatable ", resource, " is 0", cap > 0 ? Cat(" (capacity ", cap, ")") : std::string(),
               ": no device plugin is registered with kubelet",
               gpus > 0 ? Cat(" although NVML sees ", gpus, " GPU(s)") : ""),
           Cat("start the kgpu device plugin on this node (kgpu node, or the kgpu DaemonSet) and check its log for "
               "\"registered with kubelet\"; then `kubectl describe node ",
               node_name, " | grep ", resource, "` shows an allocatable count")});
    }
    if (!failed) {
      checks.push_back(
          {"Node allocatable", Verdict::kWarn,
           resources.empty()
               ? std::string("no local device plugin to compare with, and no nvidia.com resource on the Node")
               : "no local device plugin to compare with",
           "run kgpu device-plugin on this node; the Node shows nvidia.com/gpu only once a plugin registers"});
    }
  }
  for (const auto& [resource, s] : served) {
    const int64_t cap = Count(capacity, resource);
    const int64_t alloc = Count(allocatable, resource);
    const std::string name = Cat("Node ", resource);
    if (cap < 0) {
      std::string why =
          "the plugin serves it but kubelet has not put it on the Node: the plugin did not register "
          "(or kubelet restarted and it has not re-registered yet)";
      if (!foreign.empty()) why += Cat("; the Node shows ", Join(foreign, ", "), " instead (a renamed resource?)");
      checks.push_back({name, Verdict::kFail, why,
                        "check the plugin log for \"registered with kubelet\"; restart the kgpu device-plugin pod; if "
                        "the resource was renamed, update the pods' requests or the sharing config's rename"});
    } else if (alloc <= 0 && s.healthy > 0) {
      checks.push_back({name, Verdict::kFail,
                        Cat("capacity ", cap, " but allocatable ", alloc, " while the plugin serves ", s.healthy,
                            " healthy: kubelet lost the plugin's stream (kubelet restarted?)"),
                        "restart the kgpu device-plugin pod so it registers again"});
    } else if (alloc <= 0) {
      checks.push_back({name, Verdict::kFail, Cat("allocatable 0: all ", s.devices, " devices are unhealthy"),
                        "see `kgpu doctor` Device health and `kgpu health` for the XID; reset or replace the GPU"});
    } else if (static_cast<size_t>(alloc) != s.healthy || static_cast<size_t>(cap) != s.devices) {
      checks.push_back({name, Verdict::kWarn,
                        Cat("Node says capacity ", cap, "/allocatable ", alloc, ", the plugin serves ", s.devices, "/",
                            s.healthy, " healthy (kubelet updates the Node within ~10 s)"),
                        "if it persists, restart the device plugin; compare with `kubectl describe node`"});
    } else {
      checks.push_back({name, Verdict::kPass, Cat("capacity ", cap, ", allocatable ", alloc), ""});
    }
  }
  // Cordon and taints.
  const json spec = node->value("spec", json::object());
  if (spec.value("unschedulable", false)) {
    checks.push_back({"Schedulable", Verdict::kWarn, "the node is cordoned (spec.unschedulable): no new pods land here",
                      Cat("kubectl uncordon ", node_name, " when maintenance is over")});
  } else {
    checks.push_back({"Schedulable", Verdict::kPass, "not cordoned", ""});
  }
  std::vector<std::string> taints;
  for (const auto& t : spec.value("taints", json::array())) {
    const std::string effect = t.value("effect", "");
    // The node lifecycle controller's taint of a cordoned node: the Schedulable check says it.
    if (t.value("key", "") == "node.kubernetes.io/unschedulable") continue;
    if (effect == "NoSchedule" || effect == "NoExecute") {
      taints.push_back(Cat(t.value("key", ""), t.contains("value") ? Cat("=", t.value("value", "")) : "", ":", effect));
    }
  }
  if (!taints.empty()) {
    checks.push_back({"Taints", Verdict::kWarn, Cat("GPU pods need tolerations for: ", Join(taints, ", ")),
                      "add matching tolerations to GPU workloads, or remove the taint (kubectl taint nodes ... -)"});
  } else {
    checks.push_back({"Taints", Verdict::kPass, "no NoSchedule/NoExecute taints", ""});
  }
  // GFD labels.
  const json labels = (*node)["metadata"].value("labels", json::object());
  if (!labels.contains("nvidia.com/gpu.product") || !labels.contains("nvidia.com/gpu.count")) {
    checks.push_back(
        {"GFD labels", Verdict::kWarn, "nvidia.com/gpu.product / nvidia.com/gpu.count are not on the Node",
         "run kgpu node-labels (or GPU Feature Discovery) on this node; selectors on GPU models match nothing "
         "until then"});
  } else {
    const std::string count = labels.value("nvidia.com/gpu.count", "");
    const std::string ts = labels.value("nvidia.com/gfd.timestamp", "");
    const int64_t age = ts.empty() ? -1 : now - std::atoll(ts.c_str());
    if (labels.value("nvidia.com/mig.strategy", "") != "single" && count != std::to_string(gpus)) {
      checks.push_back({"GFD labels", Verdict::kWarn,
                        Cat("nvidia.com/gpu.count=", count, " but NVML sees ", gpus, " GPU(s): the labels are stale"),
                        "check that the labeller (kgpu node-labels) runs on this node"});
    } else if (age > 600) {
      checks.push_back({"GFD labels", Verdict::kWarn, Cat("last relabelled ", age, " s ago (nvidia.com/gfd.timestamp)"),
                        "the labeller relabels every 60 s: check that it still runs"});
    } else {
      checks.push_back(
          {"GFD labels", Verdict::kPass,
           Cat(labels.value("nvidia.com/gpu.product", ""), " x", count, age >= 0 ? Cat(", ", age, " s old") : ""), ""});
    }
  }
  return checks;
}

std::vector<Check> ClusterChecks(const NodeOptions& options, size_t gpus) {
  auto cfg = k8s::ConfigFromFlags(options.kubeconfig, options.kube_context, options.in_cluster);
  if (!cfg.ok()) {
    return {{"Kubernetes API", Verdict::kFail, std::string(cfg.status().message()),
             "pass --kubeconfig, or run in a pod with a service account"}};
  }
  cfg->timeout = std::chrono::seconds(10);
  auto client = k8s::Client::Create(*cfg);
  if (!client.ok())
    return {{"Kubernetes API", Verdict::kFail, std::string(client.status().message()), "fix the kubeconfig"}};
  std::string node = options.node_name;
  if (node.empty()) {
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) == 0) node = host;
  }
  return ClusterChecks(**client, node, ServedResources(options.kubelet_dir), gpus,
                       static_cast<int64_t>(std::time(nullptr)));
}

}  // namespace kgpu::cli
