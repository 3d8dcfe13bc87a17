#pragma once
// The Kubernetes side of a slurm-bridge scenario on the API server stand-in, shared by the
// bridge's unit tests and bench/slurm_bridge_bench.cc: a node of the Slurm pool, an inference
// pod kube-scheduler could not place, and that pod bound and running (what kube-scheduler and
// kubelet do once the node is lent).
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "common/strings.h"
#include "k8s/client.h"
#include "k8s/resources.h"
#include "slurm/bridge.h"
#include "slurm/lease.h"
#include "testing/fake_apiserver.h"

namespace kgpu::testing {

// A Kubernetes Node for Slurm node `name`, labelled kgpu.io/pool=slurm; fenced: the
// separated-pools fence (taint + cordon) on; cordoned: spec.unschedulable alone (an admin's).
inline nlohmann::json SlurmPoolNode(const std::string& name, bool fenced = true, bool cordoned = false) {
  nlohmann::json node = {{"apiVersion", "v1"},
                         {"kind", "Node"},
                         {"metadata", {{"name", name}, {"labels", {{slurm::kPoolLabel, "slurm"}}}}},
                         {"spec", nlohmann::json::object()},
                         {"status", {{"allocatable", {{"nvidia.com/gpu", "8"}, {"cpu", "64"}}}}}};
  if (fenced) slurm::ApplyK8sFence(node);
  if (cordoned) node["spec"]["unschedulable"] = true;
  return node;
}

// An inference pod (1 GPU, label app=infer) in `ns` with PodScheduled=False/Unschedulable.
// Returns "" or what went wrong.
inline std::string PendingGpuPod(FakeApiServer& api, const std::string& ns, const std::string& name) {
  nlohmann::json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", "infer"}}}}},
      {"spec",
       {{"terminationGracePeriodSeconds", 0},
        {"containers",
         {{{"name", "server"}, {"image", "infer:1"}, {"resources", {{"limits", {{"nvidia.com/gpu", 1}}}}}}}}}}};
  auto r = api.Create("pods", ns, pod);
  if (r.code != 201) return Cat("create pod ", name, ": ", r.body.dump());
  nlohmann::json p = r.body;
  p["status"] = {{"phase", "Pending"},
                 {"conditions",
                  {{{"type", "PodScheduled"},
                    {"status", "False"},
                    {"reason", "Unschedulable"},
                    {"lastTransitionTime", k8s::NowRfc3339()}}}}};
  r = api.Update("pods", ns, p);
  return r.code == 200 ? "" : Cat("mark pod ", name, " unschedulable: ", r.body.dump());
}

// kube-scheduler binds the pod to `node`, kubelet runs it. Returns "" or what went wrong.
inline std::string RunPodOn(FakeApiServer& api, k8s::Client& client, const std::string& ns, const std::string& name,
                            const std::string& node) {
  if (auto bound = client.Bind(ns, name, node); !bound.ok()) return Cat("bind ", name, ": ", bound.message());
  auto p = api.Get("pods", ns, name).body;
  p["status"] = {{"phase", "Running"},
                 {"conditions",
                  {{{"type", "PodScheduled"}, {"status", "True"}, {"lastTransitionTime", k8s::NowRfc3339()}},
                   {{"type", "Ready"}, {"status", "True"}, {"lastTransitionTime", k8s::NowRfc3339()}}}}};
  auto r = api.Update("pods", ns, p);
  return r.code == 200 ? "" : Cat("mark pod ", name, " running: ", r.body.dump());
}

}  // namespace kgpu::testing
