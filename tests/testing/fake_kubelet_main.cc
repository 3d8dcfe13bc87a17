// kgpu-fake-kubelet: a kubelet stand-in for the demo and manual use (the v1beta1 Device Plugin
// API over real unix sockets). Not part of the product.
//
//   kgpu-fake-kubelet serve --dir D [--duration S]
//       serves D/kubelet.sock and prints one line per registration and ListAndWatch update.
//       SIGHUP simulates a kubelet restart (FakeKubelet::Restart); SIGINT/SIGTERM stop it.
//   kgpu-fake-kubelet allocate --dir D --endpoint nvidia-gpu.sock --count N [--available a,b]
//       does what kubelet does at pod admission: reads the device list (ListAndWatch, first
//       message), asks GetPreferredAllocation, then calls Allocate, and prints the response.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include "absl/status/status.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "testing/fake_kubelet.h"
#include "testing/fake_kubelet_node.h"

namespace {

using kgpu::testing::FakeKubelet;
using kgpu::testing::FakeKubeletEvent;

constexpr size_t kMaxListed = 8;

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string UnhealthyList(const std::vector<std::string>& ids) {
  std::string out = "unhealthy:";
  for (size_t i = 0; i < ids.size() && i < kMaxListed; ++i) out += " " + ids[i];
  if (ids.size() > kMaxListed) out += " ... (+" + std::to_string(ids.size() - kMaxListed) + " more)";
  return out;
}

void PrintEvent(const FakeKubeletEvent& e) {
  std::ostringstream line;
  switch (e.kind) {
    case FakeKubeletEvent::Kind::kRegistered:
      line << "registered " << e.resource << " (endpoint " << e.state.endpoint
           << ", preferred allocation: " << (e.state.options.get_preferred_allocation_available() ? "yes" : "no")
           << ")";
      break;
    case FakeKubeletEvent::Kind::kRefused:
      line << "refused registration of " << e.resource << ": " << e.message;
      break;
    case FakeKubeletEvent::Kind::kUpdate: {
      const auto unhealthy = e.state.UnhealthyIds();
      line << "ListAndWatch " << e.resource << ": " << e.state.devices.size() << " devices, "
           << e.state.devices.size() - unhealthy.size() << " healthy";
      if (!unhealthy.empty()) line << ", " << UnhealthyList(unhealthy);
      break;
    }
    case FakeKubeletEvent::Kind::kDisconnected:
      line << "disconnected " << e.resource << " (" << e.message << "): its " << e.state.devices.size()
           << " devices now count as unhealthy";
      break;
    case FakeKubeletEvent::Kind::kRestarted:
      line << "kubelet restart: sockets removed, serving a new kubelet.sock";
      break;
  }
  std::cout << line.str() << std::endl;  // flushed: a person (or the demo script) is watching
}

int Serve(const std::string& dir, unsigned duration_s, const std::string& kubeconfig, const std::string& node_name) {
  // Block the signals in every thread (gRPC's included) and take them here, synchronously.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  FakeKubelet kubelet(dir);
  kubelet.OnEvent(PrintEvent);
  if (auto s = kubelet.Start(); !s.ok()) {
    std::cerr << "kgpu-fake-kubelet: " << std::string(s.message()) << "\n";
    return 1;
  }
  std::cout << "fake kubelet serving " << kubelet.SocketPath() << " (SIGHUP: simulate a restart)" << std::endl;
  // With an API server: the Node's capacity/allocatable follow the registered resources.
  std::unique_ptr<kgpu::k8s::Client> client;
  std::unique_ptr<kgpu::testing::KubeletNodeStatus> node_status;
  if (!kubeconfig.empty()) {
    auto cfg = kgpu::k8s::LoadKubeconfig(kubeconfig);
    auto c =
        cfg.ok() ? kgpu::k8s::Client::Create(*cfg) : absl::StatusOr<std::unique_ptr<kgpu::k8s::Client>>(cfg.status());
    if (!c.ok()) {
      std::cerr << "kgpu-fake-kubelet: --kubeconfig: " << std::string(c.status().message()) << "\n";
      return 1;
    }
    client = std::move(*c);
    node_status = std::make_unique<kgpu::testing::KubeletNodeStatus>(kubelet, *client, node_name);
    node_status->Start();
    std::cout << "fake kubelet: node " << node_name << " on " << client->config().server << std::endl;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(duration_s);
  for (;;) {
    int sig = 0;
    if (duration_s == 0) {
      if (sigwait(&signals, &sig) != 0) continue;
    } else {
      const auto left = end - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds(0)) break;
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      sig = sigtimedwait(&signals, nullptr, &ts);
      if (sig < 0) {
        if (errno == EAGAIN) break;  // the duration is over
        continue;                    // EINTR
      }
    }
    if (sig != SIGHUP) break;  // SIGINT, SIGTERM
    if (auto s = kubelet.Restart(); !s.ok()) {
      std::cerr << "kgpu-fake-kubelet: restart: " << std::string(s.message()) << "\n";
      return 1;
    }
  }
  if (node_status) node_status->Stop();
  kubelet.Stop();
  std::cout << "fake kubelet stopped" << std::endl;
  return 0;
}

std::vector<std::string> SplitIds(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int RpcError(const std::string& what, const grpc::Status& s) {
  std::cerr << "kgpu-fake-kubelet: " << what << " failed: " << s.error_message() << " ("
            << absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())) << ")\n";
  return 1;
}

void PrintMap(const std::string& title, const google::protobuf::Map<std::string, std::string>& m) {
  std::cout << "  " << title << ":" << (m.empty() ? " (none)" : "") << "\n";
  const std::map<std::string, std::string> sorted(m.begin(), m.end());
  for (const auto& [k, v] : sorted) std::cout << "    " << k << "=" << v << "\n";
}

void PrintResponse(const v1beta1::AllocateResponse& response) {
  for (int i = 0; i < response.container_responses_size(); ++i) {
    const auto& c = response.container_responses(i);
    std::cout << "container response " << i << ":\n";
    PrintMap("envs", c.envs());
    std::cout << "  mounts:" << (c.mounts().empty() ? " (none)" : "") << "\n";
    for (const auto& m : c.mounts()) {
      std::cout << "    " << m.host_path() << " -> " << m.container_path() << (m.read_only() ? " (ro)" : " (rw)")
                << "\n";
    }
    std::cout << "  devices:" << (c.devices().empty() ? " (none)" : "") << "\n";
    for (const auto& d : c.devices()) {
      std::cout << "    " << d.host_path() << " -> " << d.container_path() << " (" << d.permissions() << ")\n";
    }
    PrintMap("annotations", c.annotations());
    std::cout << "  cdi_devices:" << (c.cdi_devices().empty() ? " (none)" : "") << "\n";
    for (const auto& d : c.cdi_devices()) std::cout << "    " << d.name() << "\n";
  }
}

int Allocate(const std::string& dir, const std::string& endpoint, int count, const std::string& available_flag,
             unsigned timeout_s) {
  const std::string path = dir + "/" + endpoint;
  const std::string target = "unix:" + path;
  std::error_code ec;
  if (!std::filesystem::is_socket(std::filesystem::status(path, ec))) {
    std::cerr << "kgpu-fake-kubelet: no plugin socket at " << path << "\n";
    return 1;
  }
  grpc::ChannelArguments args;
  args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, "localhost");
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  const auto deadline = [timeout_s] { return std::chrono::system_clock::now() + std::chrono::seconds(timeout_s); };
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    std::cerr << "kgpu-fake-kubelet: cannot connect to " << target << " within 10 s\n";
    return 1;
  }
  auto stub = v1beta1::DevicePlugin::NewStub(channel);

  v1beta1::DevicePluginOptions options;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    if (auto s = stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &options); !s.ok()) {
      return RpcError("GetDevicePluginOptions", s);
    }
  }

  // The device list: the first ListAndWatch message, then hang up.
  v1beta1::ListAndWatchResponse list;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    auto reader = stub->ListAndWatch(&ctx, v1beta1::Empty());
    const bool got = reader->Read(&list);
    ctx.TryCancel();
    const grpc::Status s = reader->Finish();
    if (!got) {
      if (!s.ok()) return RpcError("ListAndWatch", s);
      std::cerr << "kgpu-fake-kubelet: ListAndWatch ended without a device list\n";
      return 1;
    }
  }
  std::vector<std::string> healthy;
  for (const auto& d : list.devices()) {
    if (d.health() == kgpu::testing::kHealthy) healthy.push_back(d.id());
  }
  std::cout << "devices: " << list.devices_size() << " (" << healthy.size() << " healthy)\n";

  std::vector<std::string> available = available_flag.empty() ? healthy : SplitIds(available_flag);
  if (count <= 0 || static_cast<size_t>(count) > available.size()) {
    std::cerr << "kgpu-fake-kubelet: requested number of devices unavailable for " << endpoint
              << ". Requested: " << count << ", Available: " << available.size() << "\n";
    return 1;
  }

  std::vector<std::string> chosen;
  const std::vector<std::string> fallback(available.begin(), available.begin() + count);
  if (static_cast<size_t>(count) == available.size()) {
    // Kubelet asks only when there is a choice.
    std::cout << "preferred allocation: not asked, all " << count << " available devices are needed\n";
    chosen = fallback;
  } else if (!options.get_preferred_allocation_available()) {
    std::cout << "preferred allocation: not offered by the plugin, taking the first " << count << "\n";
    chosen = fallback;
  } else {
    v1beta1::PreferredAllocationRequest request;
    auto* c = request.add_container_requests();
    for (const auto& id : available) c->add_available_deviceids(id);
    c->set_allocation_size(count);
    v1beta1::PreferredAllocationResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    if (auto s = stub->GetPreferredAllocation(&ctx, request, &response); !s.ok()) {
      return RpcError("GetPreferredAllocation", s);
    }
    if (response.container_responses_size() > 0) {
      const auto& ids = response.container_responses(0).deviceids();
      chosen.assign(ids.begin(), ids.end());
    }
    // Kubelet keeps only an answer of the right size drawn from the available devices.
    const std::set<std::string> legal(available.begin(), available.end());
    const std::set<std::string> unique(chosen.begin(), chosen.end());
    const bool valid =
        chosen.size() == static_cast<size_t>(count) && unique.size() == chosen.size() &&
        std::all_of(chosen.begin(), chosen.end(), [&](const std::string& id) { return legal.count(id) != 0; });
    std::cout << "preferred allocation (size " << count << "): " << Join(chosen, " ") << "\n";
    if (!valid) {
      std::cout << "warning: not a valid choice of " << count
                << " available devices; kubelet would fall back to its own: " << Join(fallback, " ") << "\n";
      chosen = fallback;
    }
  }

  v1beta1::AllocateRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : chosen) c->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline());
  if (auto s = stub->Allocate(&ctx, request, &response); !s.ok()) return RpcError("Allocate", s);
  std::cout << "Allocate " << Join(chosen, " ") << "\n";
  PrintResponse(response);
  if (response.container_responses_size() != 1) {
    std::cerr << "kgpu-fake-kubelet: Allocate answered " << response.container_responses_size()
              << " container responses for 1 container request\n";
    return 1;
  }
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"kgpu-fake-kubelet: a kubelet stand-in speaking the Device Plugin API v1beta1"};
  app.require_subcommand(1);

  std::string dir;
  unsigned duration_s = 0;
  auto* serve = app.add_subcommand("serve", "serve <dir>/kubelet.sock and log what plugins do");
  serve->add_option("--dir", dir, "the device-plugin directory")->required();
  serve->add_option("--duration", duration_s, "stop after this many seconds (0: until a signal)");
  std::string kubeconfig, node_name = "sim-node";
  serve->add_option("--kubeconfig", kubeconfig,
                    "API server to keep this node's Node object in (status.capacity/allocatable of every resource)");
  serve->add_option("--node-name", node_name, "the Node's name with --kubeconfig")->capture_default_str();

  std::string endpoint;
  int count = 1;
  std::string available;
  unsigned timeout_s = 30;
  auto* alloc =
      app.add_subcommand("allocate", "pod admission against one plugin: GetPreferredAllocation, then Allocate");
  alloc->add_option("--dir", dir, "the device-plugin directory")->required();
  alloc->add_option("--endpoint", endpoint, "the plugin's socket file name, e.g. nvidia-gpu.sock")->required();
  alloc->add_option("--count", count, "how many devices")->capture_default_str();
  alloc->add_option("--available", available, "comma-separated IDs to choose from (default: the healthy devices)");
  alloc->add_option("--timeout", timeout_s, "deadline of each RPC, seconds")->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  if (serve->parsed()) return Serve(dir, duration_s, kubeconfig, node_name);
  if (alloc->parsed()) return Allocate(dir, endpoint, count, available, timeout_s);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kgpu-fake-kubelet: fatal: " << e.what() << "\n";
    return 1;
  }
}
