// dra_bench: kgpu's DRA driver (src/dra/) as kubelet and the API server meet it.
//   1. the ResourceSlices of an 8-GPU A100 node with every GPU in MIG mode and --dynamic-mig (every
//      placement of every profile on counters): objects, bytes of JSON, build time; and of the
//      simulated dgx-a100-mig as it is (two MIG GPUs, six whole);
//   2. NodePrepareResources for a share claim (20Gi / 30 %: CDI spec, interposer config and
//      accounting region, checkpoint) over the plugin's unix socket as kubelet calls it, the claim
//      read from the API server stand-in over HTTP; and NodeUnprepareResources. Goal: p99 <= 5 ms.
//   dra_bench [--claims N] [--builds N]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "api/dra.h"
#include "bench_util.h"
#include "dra/plugin.h"
#include "dra/prepare.h"
#include "dra/slices.h"
#include "dra_v1.grpc.pb.h"
#include "gpu/inventory.h"
#include "gpu/mig_layout.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "nvml/library.h"
#include "testing/fake_apiserver.h"

namespace {
using json = nlohmann::json;
namespace v1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
using kgpu::bench::NowNs;
using kgpu::bench::Summarize;

int Slices(const kgpu::gpu::Inventory& inv, const std::map<unsigned, kgpu::gpu::MigCatalog>& mig, bool dynamic,
           const char* what, int builds) {
  kgpu::dra::PoolOptions o;
  o.node_name = "bench-node";
  o.dynamic_mig = dynamic;
  std::vector<double> ms;
  std::vector<kgpu::api::dra::ResourceSlice> slices;
  for (int i = 0; i < builds; ++i) {
    const int64_t t0 = NowNs();
    auto s = kgpu::dra::BuildPool(inv, mig, o);
    std::string bytes;
    if (s.ok()) {
      for (const auto& x : *s) bytes += kgpu::api::dra::ToJson(x).dump();
    }
    ms.push_back(static_cast<double>(NowNs() - t0) / 1e6);
    if (!s.ok()) {
      std::fprintf(stderr, "BuildPool: %s\n", std::string(s.status().message()).c_str());
      return 1;
    }
    slices = std::move(*s);
  }
  size_t devices = 0, sets = 0, bytes = 0;
  for (const auto& x : slices) {
    devices += x.devices.size();
    sets += x.shared_counters.size();
    bytes += kgpu::api::dra::ToJson(x).dump().size();
  }
  const auto st = Summarize(ms);
  std::printf("%-52s %3zu slices %4zu devices %2zu counter sets %7zu bytes   build+encode p50 %.3f ms p99 %.3f ms\n",
              what, slices.size(), devices, sets, bytes, st.p50, st.p99);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int claims = 500, builds = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--claims") claims = std::atoi(argv[i + 1]);
    if (a == "--builds") builds = std::atoi(argv[i + 1]);
  }
  char dir_template[] = "/tmp/kgpu-dra-bench-XXXXXX";
  const std::string dir = ::mkdtemp(dir_template);
  ::setenv("KGPU_SIM_NODE", "dgx-a100-mig", 1);
  ::setenv("KGPU_SIM_STATE", (dir + "/sim.state").c_str(), 1);
  auto lib = kgpu::nvml::Library::Open({KGPU_SIM_LIB});
  if (!lib.ok()) return std::fprintf(stderr, "%s\n", std::string(lib.status().message()).c_str()), 1;
  auto inv = kgpu::gpu::Inventory::Discover(**lib, {"/sys"});
  if (!inv.ok()) return 1;
  std::map<unsigned, kgpu::gpu::MigCatalog> mig;
  for (const auto& g : (*inv)->gpus()) {
    if (g.mig_enabled) mig[g.index] = *kgpu::gpu::ReadMigCatalog(**lib, g);
  }
  // 1. Slices.
  std::printf("== ResourceSlices (kgpu dra's pool)\n");
  if (Slices(**inv, mig, true, "dgx-a100-mig (2 MIG GPUs), --dynamic-mig", builds) != 0) return 1;
  std::vector<kgpu::gpu::Gpu> all = (*inv)->gpus();
  std::map<unsigned, kgpu::gpu::MigCatalog> all_mig;
  const auto& catalog = mig.begin()->second;
  for (auto& g : all) {
    g.mig_enabled = true;
    g.migs.clear();
    all_mig[g.index] = catalog;
  }
  const auto all_inv = kgpu::gpu::Inventory::FromPartsForTest(all, {});
  if (Slices(*all_inv, all_mig, true, "8x A100 all in MIG mode, --dynamic-mig (1.35 layout)", builds) != 0) return 1;
  if (Slices(**inv, mig, false, "dgx-a100-mig, static MIG", builds) != 0) return 1;

  // 2. Prepare over the socket.
  kgpu::testing::FakeApiServerOptions ao;
  ao.git_version = "v1.35.0";
  kgpu::testing::FakeApiServer api(ao);
  if (!api.Start().ok()) return 1;
  kgpu::k8s::Config c;
  c.server = api.url();
  c.qps = 50;  // what kgpu dra's client has (kubelet's budget)
  c.burst = 100;
  std::shared_ptr<kgpu::k8s::Client> client = std::move(*kgpu::k8s::Client::Create(c));
  kgpu::dra::PrepareOptions po;
  po.driver = kgpu::api::dra::kDriver;
  po.node_name = "bench-node";
  po.plugin_dir = dir + "/plugins/gpu.nvidia.com";
  po.cdi_dir = dir + "/cdi";
  po.cuda_shared_root = dir + "/cuda";
  po.cuda_interposer = dir + "/libkgpu-cuda.so";
  std::ofstream(po.cuda_interposer) << "x";
  const kgpu::gpu::Gpu* shared = nullptr;
  for (const auto& g : (*inv)->gpus()) {
    if (!g.mig_enabled && shared == nullptr) shared = &g;
  }
  po.shared_gpus = {shared->index};
  std::shared_ptr<kgpu::dra::Preparer> preparer = std::move(*kgpu::dra::Preparer::Create(client, *inv, po));
  kgpu::dra::PluginOptions plo;
  plo.driver = po.driver;
  plo.registry_dir = dir + "/registry";
  plo.plugin_dir = po.plugin_dir;
  auto plugin = kgpu::dra::Plugin::Start(plo, preparer);
  if (!plugin.ok()) return 1;
  auto stub = v1::DRAPlugin::NewStub(
      grpc::CreateChannel("unix:" + (*plugin)->ServiceSocket(), grpc::InsecureChannelCredentials()));
  std::vector<double> prep_ms, unprep_ms;
  const std::string device = kgpu::api::dra::GpuDeviceName(shared->minor);
  // One claim every 25 ms: under the client's 50 requests/s, so the figures are the calls' own
  // cost, not the rate limiter's (a burst beyond 100 waits 20 ms per claim for its token).
  int64_t next = NowNs();
  for (int i = 0; i < claims; ++i) {
    const std::string name = "share-" + std::to_string(i);
    next += 25'000'000;
    while (NowNs() < next) std::this_thread::sleep_for(std::chrono::microseconds(200));
    json claim = {
        {"apiVersion", "resource.k8s.io/v1"},
        {"kind", "ResourceClaim"},
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec",
         {{"devices", {{"requests", {{{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu-share.kgpu.io"}}}}}}}}}}};
    claim = api.Create("resourceclaims", "default", claim).body;
    const json result = {{"request", "gpu"},
                         {"driver", po.driver},
                         {"pool", "bench-node"},
                         {"device", device},
                         {"shareID", "7b4f0c8e-8d1a-4b8e-9d3e-1f2a3b4c5d6e"},
                         {"consumedCapacity", {{"memory", "20Gi"}, {"cores", "30"}}}};
    claim["status"]["allocation"]["devices"]["results"] = json::array({result});
    if (api.Update("resourceclaims", "default", claim).code != 200) return 1;
    v1::NodePrepareResourcesRequest req;
    auto* rc = req.add_claims();
    rc->set_namespace_("default");
    rc->set_name(name);
    rc->set_uid(claim["metadata"]["uid"].get<std::string>());
    grpc::ClientContext ctx;
    v1::NodePrepareResourcesResponse resp;
    const int64_t t0 = NowNs();
    const auto st = stub->NodePrepareResources(&ctx, req, &resp);
    prep_ms.push_back(static_cast<double>(NowNs() - t0) / 1e6);
    if (!st.ok() || !resp.claims().at(rc->uid()).error().empty()) {
      std::fprintf(stderr, "prepare failed: %s %s\n", st.error_message().c_str(),
                   resp.claims().count(rc->uid()) ? resp.claims().at(rc->uid()).error().c_str() : "");
      return 1;
    }
    v1::NodeUnprepareResourcesRequest ureq;
    *ureq.add_claims() = *rc;
    grpc::ClientContext uctx;
    v1::NodeUnprepareResourcesResponse uresp;
    const int64_t t1 = NowNs();
    if (!stub->NodeUnprepareResources(&uctx, ureq, &uresp).ok()) return 1;
    unprep_ms.push_back(static_cast<double>(NowNs() - t1) / 1e6);
  }
  const auto p = Summarize(prep_ms), u = Summarize(unprep_ms);
  std::printf(
      "\n== NodePrepareResources over dra.sock, one share claim (20Gi, 30 %%) per call, %d calls, one per 25 ms\n",
      claims);
  std::printf("prepare   p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  max %.3f ms   (goal: p99 <= 5 ms)\n", p.p50, p.p90,
              p.p99, p.max);
  std::printf("unprepare p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  max %.3f ms\n", u.p50, u.p90, u.p99, u.max);
  (*plugin)->Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
