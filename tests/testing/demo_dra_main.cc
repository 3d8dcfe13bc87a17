// kgpu-demo-dra: GPUs through Dynamic Resource Allocation, as `make demo` shows them, in one
// process: the API server stand-in (v1.35, resource.k8s.io/v1) with deploy/dra's DeviceClasses;
// `kgpu dra` as a process on two simulated nodes — `h100` (8x H100; GPUs 6 and 7 offered as shares,
// the CUDA interposer) and `a100` (8x A100, MIG mode on GPUs 0 and 1, --dynamic-mig); kube-scheduler's
// allocator stood in (testing/dra_allocator.h) and kubelet's DRA manager stood in
// (testing/fake_kubelet_dra.h) on each node. It shows a whole-GPU claim, a MIG instance carved on
// demand and released, two shares of one H100 each held to its limits, and an XID that taints a
// device and reaches the pod's status. It checks what it prints (exit 1 on a mismatch), so a ctest
// run keeps the demo honest.
//   kgpu-demo-dra
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "k8s/client.h"
#include "k8s/config.h"
#include "k8s/resources.h"
#include "testing/dra_allocator.h"
#include "testing/fake_apiserver.h"
#include "testing/fake_kubelet_dra.h"
#include "testing/poll.h"
#include "testing/spawn.h"

namespace {
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace t = kgpu::testing;

int failures = 0;
void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::cout << "  CHECK FAILED: " << what << "\n";
    ++failures;
  }
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

struct DraNode {
  std::string name, profile, dir;
  pid_t pid = -1;
  std::unique_ptr<t::FakeDraKubelet> kubelet;
  std::vector<std::string> Env() const {
    return {"KGPU_SIM_NODE=" + profile, "KGPU_SIM_STATE=" + dir + "/sim.state", "KGPU_SIM_NODE_NAME=" + name,
            "KGPU_NVML_LIBRARY=" KGPU_SIM_LIB};
  }
  // kgpu-simctl against this node.
  int Ctl(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {KGPU_SIMCTL};
    argv.insert(argv.end(), args.begin(), args.end());
    const pid_t p = t::Spawn(argv, {.log = dir + "/simctl.log", .env = Env()});
    int status = 0;
    ::waitpid(p, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

class Demo {
 public:
  int Run() {
    work_ = (std::filesystem::temp_directory_path() / ("kgpu-demo-dra-" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(work_);
    t::FakeApiServerOptions o;
    o.git_version = "v1.35.0";
    api_ = std::make_unique<t::FakeApiServer>(o);
    if (!api_->Start().ok()) return 1;
    if (!api_->Preload(std::string(KGPU_SOURCE_DIR) + "/deploy/dra/deviceclasses.yaml").ok()) return 1;
    kgpu::k8s::Config c;
    c.server = api_->url();
    client_ = std::move(*kgpu::k8s::Client::Create(c));
    std::ofstream(work_ + "/kubeconfig") << api_->Kubeconfig();
    std::ofstream(work_ + "/shares.yaml") << "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                             "    - name: nvidia.com/gpu\n      rename: kgpu.io/gpu\n"
                                             "      replicas: 4\n      devices: [\"6\", \"7\"]\n";
    for (auto [name, profile] : {std::pair{"h100", "dgx-h100"}, std::pair{"a100", "dgx-a100-mig"}}) {
      if (!StartNode(name, profile)) return Finish(1);
    }
    std::cout << "$ kubectl get deviceclasses   # deploy/dra: NVIDIA's classes by name and selector, and kgpu's share "
                 "class\n";
    for (const auto& n : {"gpu.nvidia.com", "mig.nvidia.com", "gpu-share.kgpu.io"}) std::cout << "  " << n << "\n";
    std::cout << "\n$ kubectl get resourceslices   # published by kgpu dra on each node (one pool per node)\n";
    std::cout << "  NAME                       NODE   DEVICES  COUNTERS\n";
    for (const auto& s : List("resourceslices")) {
      const json& spec = s["spec"];
      std::printf("  %-26s %-6s %7zu  %s\n", s["metadata"].value("name", "").c_str(),
                  spec.value("nodeName", "").c_str(), spec.value("devices", json::array()).size(),
                  spec.contains("sharedCounters")
                      ? std::to_string(spec["sharedCounters"].size()).append(" sets").c_str()
                      : "-");
    }
    std::cout << "\n";

    // A whole GPU, any H100.
    const json whole = Claim("whole", "gpu.nvidia.com", json::object(),
                             "device.attributes['gpu.nvidia.com'].productName.matches('H100')");
    auto whole_got = Place(whole, "trainer");
    // A MIG instance carved on demand.
    const json mig =
        Claim("small", "mig.nvidia.com", json::object(), "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'");
    auto mig_got = Place(mig, "notebook");
    // Two shares of one H100, and a third that no longer fits there.
    const json s1 = Claim("share-20", "gpu-share.kgpu.io", {{"memory", "20Gi"}, {"cores", "30"}});
    const json s2 = Claim("share-40", "gpu-share.kgpu.io", {{"memory", "40Gi"}, {"cores", "60"}});
    const json s3 = Claim("share-40b", "gpu-share.kgpu.io", {{"memory", "40Gi"}, {"cores", "20"}});
    auto g1 = Place(s1, "infer-a");
    auto g2 = Place(s2, "infer-b");
    auto g3 = Place(s3, "infer-c");
    Check(g1.device == g2.device && g3.device != g1.device,
          "the 20Gi and 40Gi shares share a GPU and the next 40Gi goes elsewhere");

    std::cout
        << "\n$ kubectl delete pod notebook   # kubelet unprepares: the MIG instance carved for it is destroyed\n";
    const std::string mig_uuid = mig_got.uuid;
    Check(nodes_["a100"]->kubelet->UnpreparePod(Pod("notebook")).ok(), "unprepare notebook");
    nodes_["a100"]->Ctl({"show"});
    const bool gone = Slurp(nodes_["a100"]->dir + "/simctl.log").find(mig_uuid) == std::string::npos;
    std::cout << "  " << mig_uuid << (gone ? " destroyed" : " STILL THERE") << "; its CDI spec removed\n";
    Check(gone && !mig_uuid.empty(), "the carved MIG instance is destroyed at unprepare");
    bool spec_left = false;
    std::error_code ec;  // (no directory: nothing was ever prepared there, which a check above reports)
    for (const auto& e : std::filesystem::directory_iterator(nodes_["a100"]->dir + "/cdi", ec)) {
      spec_left = spec_left || e.is_regular_file();
    }
    Check(!spec_left, "the MIG claim's CDI spec is removed at unprepare");

    // An XID on the whole claim's GPU.
    DraNode& h100 = *nodes_["h100"];
    const std::string index = std::to_string(whole_got.index);
    std::cout << "\n$ kgpu-simctl xid " << index << " 48   # a double-bit ECC error on the trainer's GPU\n";
    h100.Ctl({"xid", index, "48"});
    json taint;
    t::WaitFor(
        [&] {
          for (const auto& s : List("resourceslices")) {
            for (const auto& d : s["spec"].value("devices", json::array())) {
              if (d.value("name", "") == whole_got.device && s["spec"].value("nodeName", "") == "h100" &&
                  d.contains("taints")) {
                taint = d["taints"][0];
                return true;
              }
            }
          }
          return false;
        },
        30s);
    std::cout << "  ResourceSlice device h100/" << whole_got.device << " taint: " << taint.value("key", "") << "="
              << taint.value("value", "") << ":" << taint.value("effect", "")
              << "   (the scheduler keeps new claims off it)\n";
    Check(taint.value("key", "") == "gpu.nvidia.com/xid" && taint.value("value", "") == "48", "the XID taint");
    const std::string resource = "h100/" + whole_got.device;
    t::WaitFor([&] { return h100.kubelet->Health("gpu.nvidia.com")[resource].rfind("UNHEALTHY", 0) == 0; }, 30s);
    const std::string health = h100.kubelet->Health("gpu.nvidia.com")[resource];
    const size_t colon = health.find(':');
    std::cout << "  pod trainer status.containerStatuses[0].allocatedResourcesStatus (kubelet, from kgpu dra's health "
                 "stream):\n"
              << "    claim:whole/gpu  gpu.nvidia.com/" << resource << "  "
              << (health.rfind("UNHEALTHY", 0) == 0 ? "Unhealthy" : health)
              << (colon == std::string::npos ? "" : health.substr(colon)) << "\n";
    Check(health.rfind("UNHEALTHY", 0) == 0, "kubelet's health stream says Unhealthy");
    const json again = Claim("whole-2", "gpu.nvidia.com", json::object(),
                             "device.attributes['gpu.nvidia.com'].productName.matches('H100')");
    std::cout << "\n";
    auto next = Place(again, "trainer-2");
    std::cout << "  (" << whole_got.device << " is tainted: the allocator passed it over)\n";
    Check(next.device != whole_got.device, "the tainted device is not allocated again");
    return Finish(failures == 0 ? 0 : 1);
  }

 private:
  struct Got {
    std::string node, device, uuid;
    unsigned index = 0;
  };

  bool StartNode(const std::string& name, const std::string& profile) {
    auto n = std::make_unique<DraNode>();
    n->name = name;
    n->profile = profile;
    n->dir = work_ + "/" + name;
    std::filesystem::create_directories(n->dir);
    api_->Create("nodes", "", {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}}}});
    std::vector<std::string> argv = {KGPU_BIN,
                                     "--log-level",
                                     "warn",
                                     "dra",
                                     "--kubeconfig",
                                     work_ + "/kubeconfig",
                                     "--node-name",
                                     name,
                                     "--kubelet-registry-dir",
                                     n->dir + "/registry",
                                     "--kubelet-plugins-dir",
                                     n->dir + "/plugins",
                                     "--cdi-spec-dir",
                                     n->dir + "/cdi"};
    if (name == "h100") {
      for (const std::string& a :
           {std::string("--config-file"), work_ + "/shares.yaml", std::string("--cuda-interposer"),
            std::string(KGPU_CUDA_INTERPOSER), std::string("--cuda-shared-root"), n->dir + "/cuda"}) {
        argv.push_back(a);
      }
    } else {
      n->Ctl({"mig-minors", n->dir + "/proc/driver/nvidia-caps/mig-minors"});
      for (const std::string& a : {std::string("--dynamic-mig"), std::string("--proc-root"), n->dir + "/proc"}) {
        argv.push_back(a);
      }
    }
    std::cout << "$ kgpu dra --node-name " << name
              << (name == "h100" ? " --config-file shares.yaml --cuda-interposer ..." : " --dynamic-mig") << "   # "
              << profile << "\n";
    n->pid = t::Spawn(argv, {.log = n->dir + "/dra.log", .env = n->Env()});
    n->kubelet = std::make_unique<t::FakeDraKubelet>(n->dir + "/registry", client_);
    n->kubelet->Start();
    const bool up = t::WaitFor([&] { return n->kubelet->Drivers().contains("gpu.nvidia.com"); }, 60s) &&
                    t::WaitFor(
                        [&] {
                          // The whole pool: every slice of it (a pool seen half published is
                          // incomplete, and the allocator skips it).
                          int64_t count = -1, have = 0;
                          for (const auto& s : List("resourceslices")) {
                            if (s["spec"].value("nodeName", "") != name) continue;
                            ++have;
                            count = s["spec"]["pool"].value("resourceSliceCount", int64_t{0});
                          }
                          return have > 0 && have == count;
                        },
                        60s);
    Check(up, "kgpu dra on " + name + " registers with kubelet and publishes its pool");
    if (!up) std::cout << Slurp(n->dir + "/dra.log");
    nodes_[name] = std::move(n);
    return up;
  }

  std::vector<json> List(const std::string& plural) {
    auto l = client_->List(kgpu::k8s::FindResource(plural)->Path());
    return l.ok() ? l->value("items", json::array()).get<std::vector<json>>() : std::vector<json>{};
  }

  json Claim(const std::string& name, const std::string& cls, const json& capacity, const std::string& selector = "") {
    json exactly = {{"deviceClassName", cls}};
    if (!capacity.empty()) exactly["capacity"]["requests"] = capacity;
    if (!selector.empty()) exactly["selectors"] = json::array({{{"cel", {{"expression", selector}}}}});
    const json claim = {
        {"apiVersion", "resource.k8s.io/v1"},
        {"kind", "ResourceClaim"},
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec", {{"devices", {{"requests", json::array({{{"name", "gpu"}, {"exactly", exactly}}})}}}}}};
    return api_->Create("resourceclaims", "default", claim).body;
  }

  json Pod(const std::string& name) const {
    const std::string claim = pod_claims_.count(name) ? pod_claims_.at(name) : "";
    return {{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "uid-" + name}}},
            {"spec", {{"resourceClaims", {{{"name", "gpu"}, {"resourceClaimName", claim}}}}}}};
  }

  // Allocates the claim as kube-scheduler's allocator would (trying the nodes in order), reserves
  // it for the pod, and has that node's kubelet prepare it.
  Got Place(json claim, const std::string& pod) {
    const std::string name = claim["metadata"]["name"];
    t::DraWorld world;
    world.slices = List("resourceslices");
    for (const auto& c : List("deviceclasses")) world.classes[c["metadata"]["name"]] = c;
    for (const auto& c : List("resourceclaims")) {
      if (c.contains("status") && c["status"].contains("allocation")) world.allocated.push_back(c);
    }
    Got got;
    for (const std::string node : {"h100", "a100"}) {
      auto a = t::AllocateClaim(claim, node, world);
      if (!a.ok()) continue;
      claim["status"]["allocation"] = *a;
      claim["status"]["reservedFor"] = json::array({{{"resource", "pods"}, {"name", pod}, {"uid", "uid-" + pod}}});
      api_->Update("resourceclaims", "default", claim);
      got.node = node;
      got.device = (*a)["devices"]["results"][0]["device"];
      break;
    }
    const json& request = claim["spec"]["devices"]["requests"][0]["exactly"];
    std::cout << "$ kubectl create -f " << name << ".yaml   # " << request.value("deviceClassName", "")
              << (request.contains("capacity") ? " " + request["capacity"]["requests"].dump() : "")
              << (request.contains("selectors") ? " where " + request["selectors"][0]["cel"].value("expression", "")
                                                : "")
              << "\n";
    if (got.node.empty()) {
      Check(false, "claim " + name + " allocated");
      return got;
    }
    pod_claims_[pod] = name;
    const json& result = claim["status"]["allocation"]["devices"]["results"][0];
    std::cout << "  allocated: " << got.node << "/" << got.device
              << (result.contains("consumedCapacity") ? "  consumedCapacity " + result["consumedCapacity"].dump() : "")
              << "\n";
    auto prepared = nodes_[got.node]->kubelet->PreparePod(Pod(pod));
    Check(prepared.ok(),
          "kubelet prepares " + name + (prepared.ok() ? "" : ": " + std::string(prepared.status().message())));
    if (!prepared.ok()) {
      std::cout << "  " << prepared.status().message() << "\n";
      return got;
    }
    std::cout << "  pod " << pod << " prepared: CDI " << prepared->at(name)[0] << "\n";
    const std::string uid = claim["metadata"]["uid"];
    const json spec =
        json::parse(Slurp(nodes_[got.node]->dir + "/cdi/k8s.gpu.nvidia.com-claim_" + uid + ".json"), nullptr, false);
    for (const auto& e : spec["devices"][0]["containerEdits"]["env"]) {
      const std::string s = e;
      if (s.rfind("NVIDIA_VISIBLE_DEVICES=", 0) == 0) got.uuid = s.substr(23);
      if (s.rfind("NVIDIA_VISIBLE_DEVICES=", 0) == 0 || s.rfind("KGPU_CUDA_", 0) == 0) std::cout << "    " << s << "\n";
    }
    for (const auto& d : spec["devices"][0]["containerEdits"]["deviceNodes"]) {
      const std::string p = d["path"];
      if (p.find("nvidia-caps") != std::string::npos)
        std::cout << "    device " << p << "   (the MIG instance's capability)\n";
    }
    if (result.contains("consumedCapacity")) {
      Check(
          Slurp(nodes_[got.node]->dir + "/cuda/dra/" + uid + "/config").find("memory " + got.uuid) != std::string::npos,
          "the share's interposer config holds its memory limit");
    }
    // The GPU's index, for kgpu-simctl.
    for (const auto& s : world.slices) {
      for (const auto& d : s["spec"].value("devices", json::array())) {
        if (d.value("name", "") == got.device && s["spec"].value("nodeName", "") == got.node &&
            d.contains("attributes") && d["attributes"].contains("index")) {
          got.index = d["attributes"]["index"].value("int", 0U);
        }
      }
    }
    return got;
  }

  int Finish(int rc) {
    for (auto& [name, n] : nodes_) {
      n->kubelet->Stop();
      if (n->pid > 0) {
        ::kill(n->pid, SIGTERM);
        int status = 0;
        ::waitpid(n->pid, &status, 0);
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(work_, ec);
    if (rc != 0) std::cout << "kgpu-demo-dra: " << failures << " check(s) failed\n";
    return rc;
  }

  std::string work_;
  std::unique_ptr<t::FakeApiServer> api_;
  std::shared_ptr<kgpu::k8s::Client> client_;
  std::map<std::string, std::unique_ptr<DraNode>> nodes_;
  std::map<std::string, std::string> pod_claims_;  // pod -> claim
};

}  // namespace

int main() {
  std::cout << std::unitbuf;  // every line out at once (a crash or a timeout still shows how far it got)
  return Demo().Run();
}
