// The only deviceplugin code that sees generated protobuf/gRPC types: it converts them to the
// domain structs of allocator.h and back.

#include "deviceplugin/server.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/backoff.h"
#include "common/files.h"
#include "common/log.h"
#include "common/sleep.h"
#include "common/strings.h"
#include "deviceplugin/allocator.h"
#include "deviceplugin/cdi.h"
#include "deviceplugin/health_file.h"
#include "deviceplugin/interposer.h"
#include "deviceplugin/kubelet_dir.h"
#include "deviceplugin/mps.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "kubelet/checkpoint.h"
#include "kubelet/registration.h"

namespace kgpu::deviceplugin {
namespace {

constexpr char kHealthy[] = "Healthy";
constexpr char kUnhealthy[] = "Unhealthy";
constexpr char kKubeletSocketName[] = "kubelet.sock";

grpc::Status ToGrpc(const absl::Status& st) {
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

std::string RandomId() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

// ---------------------------------------------------------------- ResourceServer

class ResourceServer::Service final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Service(ResourceServer& owner) : owner_(owner) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    out->set_pre_start_required(owner_.PreStartRequired());
    out->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    // This stream's own queue of device lists still to send: every Unhealthy edge reaches it,
    // even when the device recovers before this thread gets to send the list.
    Stream stream;
    {
      std::lock_guard<std::mutex> lock(owner_.mu_);
      stream.pending.push_back(owner_.devices_);
      owner_.streams_.insert(&stream);
    }
    struct Unlist {
      ResourceServer& owner;
      Stream* stream;
      ~Unlist() {
        std::lock_guard<std::mutex> lock(owner.mu_);
        owner.streams_.erase(stream);
      }
    } unlist{owner_, &stream};
    for (;;) {
      v1beta1::ListAndWatchResponse msg;
      {
        std::unique_lock<std::mutex> lock(owner_.mu_);
        while (!owner_.stopping_ && stream.pending.empty() && !ctx->IsCancelled()) {
          owner_.cv_.wait_for(lock, std::chrono::milliseconds(200));
        }
        if (owner_.stopping_ || ctx->IsCancelled()) return grpc::Status::OK;
        for (const auto& d : stream.pending.front()) {
          auto* dev = msg.add_devices();
          dev->set_id(d.id);
          dev->set_health(d.healthy ? kHealthy : kUnhealthy);
          if (d.numa >= 0) dev->mutable_topology()->add_nodes()->set_id(d.numa);
        }
        stream.pending.pop_front();
      }
      if (!writer->Write(msg)) return grpc::Status::OK;  // kubelet went away
    }
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* out) override {
    for (const auto& c : req->container_requests()) {
      const std::vector<std::string> available(c.available_deviceids().begin(), c.available_deviceids().end());
      const std::vector<std::string> must(c.must_include_deviceids().begin(), c.must_include_deviceids().end());
      if (auto advised = owner_.Advised(available, must, static_cast<size_t>(c.allocation_size()))) {
        auto* resp = out->add_container_responses();
        for (const auto& id : *advised) resp->add_deviceids(id);
        continue;
      }
      auto ids =
          PreferredAllocation(*owner_.plan_, owner_.resource(), *owner_.config_, available, must, c.allocation_size());
      if (!ids.ok()) return ToGrpc(ids.status());
      auto* resp = out->add_container_responses();
      for (const auto& id : *ids) resp->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* out) override {
    for (const auto& c : req->container_requests()) {
      const std::vector<std::string> ids(c.devices_ids().begin(), c.devices_ids().end());
      if (owner_.resource().kgpu_shares) {
        // Slots are a count: the GPUs come from the pod's record at PreStartContainer, through the
        // CDI device named here (docs/sharing-model.md §5).
        for (const auto& id : ids) {
          if (owner_.resource().Find(id) == nullptr) {
            return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, Cat("unknown ", api::kShares, " slot ", id));
          }
        }
        const std::string name = Cat(api::kShareCdiKind, "=", api::ShareCdiName(ids));
        auto* resp = out->add_container_responses();
        resp->add_cdi_devices()->set_name(name);
        (*resp->mutable_annotations())[Cat(owner_.config_->cdi_annotation_prefix, "kgpu-share_",
                                           api::ShareCdiName(ids))] = name;
        (*resp->mutable_envs())["KGPU_SHARE"] = api::ShareCdiName(ids);
        continue;
      }
      auto a = deviceplugin::Allocate(*owner_.plan_, owner_.resource(), *owner_.config_, ids, RandomId());
      if (!a.ok()) {
        Log("deviceplugin")
            ->warn("{}: Allocate {} refused: {}", owner_.resource().name, Join(ids, ","),
                   std::string(a.status().message()));
        return ToGrpc(a.status());
      }
      auto* resp = out->add_container_responses();
      for (const auto& [k, v] : a->envs) (*resp->mutable_envs())[k] = v;
      for (const auto& [k, v] : a->annotations) (*resp->mutable_annotations())[k] = v;
      for (const auto& m : a->mounts) {
        auto* mount = resp->add_mounts();
        mount->set_container_path(m.container_path);
        mount->set_host_path(m.host_path);
        mount->set_read_only(m.read_only);
      }
      for (const auto& d : a->devices) {
        auto* spec = resp->add_devices();
        spec->set_container_path(d.container_path);
        spec->set_host_path(d.host_path);
        spec->set_permissions(d.permissions);
      }
      for (const auto& name : a->cdi_devices) resp->add_cdi_devices()->set_name(name);
    }
    owner_.allocations_++;
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest* req,
                                 v1beta1::PreStartContainerResponse*) override {
    const std::vector<std::string> ids(req->devices_ids().begin(), req->devices_ids().end());
    if (!owner_.resource().kgpu_shares) {
      if (owner_.PreStartRequired()) owner_.ReportAssignment(ids);
      return grpc::Status::OK;
    }
    ShareResolver resolve;
    {
      std::lock_guard<std::mutex> lock(owner_.mu_);
      resolve = owner_.share_resolver_;
    }
    if (!resolve) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          Cat(api::kShares,
                              ": no allocation-record resolver (start the plugin with --kubeconfig "
                              "or in a pod, and --node-name)"));
    }
    const absl::Status st = resolve(ids, api::ShareCdiName(ids));
    if (!st.ok()) {
      Log("deviceplugin")
          ->warn("{}: PreStartContainer {}: {}", api::kShares, Join(ids, ","), std::string(st.message()));
      return ToGrpc(st);
    }
    return grpc::Status::OK;
  }

  std::unique_ptr<grpc::Server> server;

 private:
  ResourceServer& owner_;
};

ResourceServer::ResourceServer(std::shared_ptr<const Plan> plan, size_t resource_index,
                               std::shared_ptr<const Config> config, std::string socket_path)
    : plan_(std::move(plan)), index_(resource_index), config_(std::move(config)), socket_path_(std::move(socket_path)) {
  for (const auto& d : resource().devices) devices_.push_back({d.id, true, d.numa});
}

ResourceServer::~ResourceServer() {
  Stop();
}

bool ResourceServer::PreStartRequired() const {
  const Resource& r = resource();
  return r.kgpu_shares || (reporter_ && !r.replicated && !r.retired && !r.devices.empty());
}

void ResourceServer::ReportAssignment(const std::vector<std::string>& ids) const {
  const Resource& r = resource();
  std::vector<AssignedDevice> devices;
  for (const auto& id : ids) {
    const PluginDevice* d = r.Find(id);
    if (d == nullptr || plan_->inventory == nullptr || d->gpu >= plan_->inventory->gpus().size()) {
      Log("deviceplugin")->warn("{}: PreStartContainer names device {}, which this plugin does not serve", r.name, id);
      return;
    }
    const gpu::Gpu& g = plan_->inventory->gpus()[d->gpu];
    AssignedDevice a;
    a.gpu_uuid = g.uuid;
    if (d->mig >= 0 && static_cast<size_t>(d->mig) < g.migs.size()) {
      const auto& m = g.migs[static_cast<size_t>(d->mig)];
      a.mig_uuid = m.uuid;
      a.profile = m.profile;
      a.memory_mib = static_cast<int64_t>(m.memory_mib);
    }
    devices.push_back(std::move(a));
  }
  reporter_(r.name, ids, devices);
}

std::string ResourceServer::DeviceIdOf(const AssignedDevice& a) const {
  if (plan_->inventory == nullptr) return "";
  const auto& gpus = plan_->inventory->gpus();
  for (const auto& d : resource().devices) {
    if (d.gpu >= gpus.size() || gpus[d.gpu].uuid != a.gpu_uuid) continue;
    const bool mig = d.mig >= 0 && static_cast<size_t>(d.mig) < gpus[d.gpu].migs.size();
    if (mig ? gpus[d.gpu].migs[static_cast<size_t>(d.mig)].uuid == a.mig_uuid : a.mig_uuid.empty()) return d.id;
  }
  return "";
}

std::optional<std::vector<std::string>> ResourceServer::Advised(const std::vector<std::string>& available,
                                                                const std::vector<std::string>& must,
                                                                size_t size) const {
  const Resource& r = resource();
  if (!advisor_ || r.kgpu_shares || r.replicated || r.retired || size == 0) return std::nullopt;
  const std::set<std::string> free(available.begin(), available.end());
  for (const auto& set : advisor_(r.name, size)) {
    std::vector<std::string> ids;
    for (const auto& d : set) {
      const std::string id = DeviceIdOf(d);
      if (id.empty() || !free.contains(id)) break;
      ids.push_back(id);
    }
    if (ids.size() != size) continue;
    const std::set<std::string> chosen(ids.begin(), ids.end());
    if (chosen.size() != size) continue;
    if (std::all_of(must.begin(), must.end(), [&](const std::string& m) { return chosen.contains(m); })) return ids;
  }
  return std::nullopt;
}

void ResourceServer::SetShareResolver(ShareResolver resolver) {
  std::lock_guard<std::mutex> lock(mu_);
  share_resolver_ = std::move(resolver);
}

absl::Status ResourceServer::Start() {
  ::unlink(socket_path_.c_str());  // a stale socket from an earlier run
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
  }
  service_ = std::make_unique<Service>(*this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  // ListAndWatch holds one thread for the life of its stream; two more pollers keep unary calls
  // (Allocate, GetPreferredAllocation) from waiting on thread creation.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
  service_->server = builder.BuildAndStart();
  if (!service_->server) {
    service_.reset();
    return absl::UnavailableError(Cat("cannot serve ", resource().name, " on ", socket_path_,
                                      ": is the kubelet directory writable (mount it into the pod)?"));
  }
  return absl::OkStatus();
}

void ResourceServer::Stop() {
  if (!service_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  service_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  service_->server->Wait();
  service_.reset();
  ::unlink(socket_path_.c_str());
}

void ResourceServer::SetHealth(const std::map<std::string, gpu::DeviceHealth>& health) {
  std::lock_guard<std::mutex> lock(mu_);
  health_ = health;
  RecomputeLocked();
}

void ResourceServer::RecomputeLocked() {
  std::vector<DeviceState> next;
  for (const auto& d : resource().devices) {
    const auto it = health_.find(d.health_key);
    const bool drained = !drained_.empty() && drained_.count(plan_->inventory->gpus()[d.gpu].uuid) != 0;
    next.push_back({d.id, available_ && !drained && (it == health_.end() || it->second.healthy), d.numa});
  }
  if (next == devices_) return;
  devices_ = std::move(next);
  for (Stream* s : streams_) Enqueue(*s, devices_);
  cv_.notify_all();
  if (on_change_) on_change_();
}

bool ResourceServer::HidesUnhealthy(const std::vector<DeviceState>& before, const std::vector<DeviceState>& after) {
  std::map<std::string_view, bool> healthy_after;
  for (const auto& d : after) healthy_after[d.id] = d.healthy;
  for (const auto& d : before) {
    if (d.healthy) continue;
    const auto it = healthy_after.find(d.id);
    if (it == healthy_after.end() || it->second) return true;  // would recover (or vanish) unseen
  }
  return false;
}

void ResourceServer::Enqueue(Stream& stream, const std::vector<DeviceState>& devices) {
  auto& q = stream.pending;
  // Replacing the last unsent list loses nothing unless it carries an Unhealthy device that the
  // new one shows Healthy again: then both go, in order.
  if (!q.empty() && (!HidesUnhealthy(q.back(), devices) || q.size() >= kMaxPending)) {
    q.back() = devices;
  } else {
    q.push_back(devices);
  }
}

std::vector<DeviceState> ResourceServer::Devices() const {
  std::lock_guard<std::mutex> lock(mu_);
  return devices_;
}

std::vector<std::string> PluginSockets(const std::string& kubelet_dir) {
  std::error_code ec;
  std::vector<std::string> sockets;
  for (const auto& e : std::filesystem::directory_iterator(kubelet_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_socket(ec) && name != kKubeletSocketName && name.ends_with(".sock")) sockets.push_back(name);
  }
  std::sort(sockets.begin(), sockets.end());
  return sockets;
}

absl::StatusOr<std::vector<DeviceState>> ReadAdvertised(const std::string& socket, std::chrono::milliseconds timeout) {
  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::DevicePlugin::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  v1beta1::Empty empty;
  auto reader = stub->ListAndWatch(&ctx, empty);
  v1beta1::ListAndWatchResponse msg;
  if (!reader->Read(&msg)) {
    const grpc::Status st = reader->Finish();
    return absl::UnavailableError(
        Cat("ListAndWatch on ", socket, ": ", st.ok() ? "the stream ended without a device list" : st.error_message()));
  }
  std::vector<DeviceState> out;
  for (const auto& d : msg.devices()) {
    out.push_back({d.id(), d.health() == kHealthy,
                   d.topology().nodes_size() > 0 ? static_cast<int>(d.topology().nodes(0).id()) : -1});
  }
  ctx.TryCancel();
  (void)reader->Finish();
  return out;
}

// ---------------------------------------------------------------- Manager

namespace {

// kubelet's device-manager checkpoint in its device-plugin directory (kubelet_checkpoint.h).
std::string CheckpointPath(const Config& config) {
  return Cat(config.kubelet_dir, "/kubelet_internal_checkpoint");
}

// Resource names kubelet's checkpoint remembers from earlier runs (Data.RegisteredDevices keys)
// that kgpu could have advertised: nvidia.com/gpu[.shared], nvidia.com/mig-*, configured renames.
std::vector<std::string> CheckpointedResources(const Config& config) {
  const std::string path = CheckpointPath(config);
  const auto text = ReadFile(path);
  if (!text) return {};
  auto names = kubelet::RegisteredResources(*text, path);
  if (!names.ok()) {
    Log("deviceplugin")->warn("{}", std::string(names.status().message()));
    return {};
  }
  std::set<std::string> ours = {"nvidia.com/gpu", "nvidia.com/gpu.shared"};
  for (const auto& r : config.sharing.resources) {
    ours.insert(r.name);
    ours.insert(r.name + ".shared");
    if (!r.rename.empty()) ours.insert(r.rename);
  }
  std::vector<std::string> out;
  for (const auto& n : *names) {
    if (ours.count(n) != 0 || n.rfind("nvidia.com/mig-", 0) == 0) out.push_back(n);
  }
  return out;
}

}  // namespace

void ResourceServer::SetDrained(const std::set<std::string>& gpu_uuids) {
  std::lock_guard<std::mutex> lock(mu_);
  if (drained_ == gpu_uuids) return;
  drained_ = gpu_uuids;
  RecomputeLocked();
}

void ResourceServer::SetAvailable(bool available) {
  std::lock_guard<std::mutex> lock(mu_);
  if (available_ == available) return;
  available_ = available;
  RecomputeLocked();
}

Manager::Manager(const nvml::Library& lib, std::shared_ptr<const gpu::Inventory> inventory,
                 gpu::DiscoverOptions discover)
    : lib_(lib), discover_(std::move(discover)), inventory_(std::move(inventory)) {}

Manager::~Manager() {
  Stop();
}

std::vector<std::string> Manager::ResourceNames() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& s : servers_) names.push_back(s->resource().name);
  return names;
}

std::shared_ptr<const gpu::Inventory> Manager::inventory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inventory_;
}

std::map<std::string, gpu::DeviceHealth> Manager::HealthSnapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_state_;
}

Manager::Advertised Manager::advertised() const {
  std::lock_guard<std::mutex> lock(mu_);
  Advertised out{inventory_, config_, {}};
  for (const auto& s : servers_) {
    const Resource& r = s->resource();
    const auto states = s->Devices();  // built from r.devices, in order
    for (size_t i = 0; i < r.devices.size() && i < states.size(); ++i) {
      const PluginDevice& d = r.devices[i];
      const bool ok = states[i].healthy;
      auto mark = [&](const std::string& uuid) {
        auto [it, fresh] = out.healthy.emplace(uuid, ok);
        if (!fresh) it->second = it->second && ok;
      };
      mark(d.health_key);
      if (d.gpu < s->plan().inventory->gpus().size()) mark(s->plan().inventory->gpus()[d.gpu].uuid);
    }
  }
  return out;
}

std::shared_ptr<const Plan> Manager::WithRetired(std::shared_ptr<const Plan> plan) {
  std::vector<std::string> missing;
  for (const auto& name : retired_) {
    // Not one the plan serves, and not one whose socket a served resource uses (a renamed
    // resource, e.g. example.com/gpu, has nvidia.com/gpu's socket: that one stays live).
    if (std::none_of(plan->resources.begin(), plan->resources.end(),
                     [&](const Resource& r) { return r.name == name || r.socket == SocketName(name); })) {
      missing.push_back(name);
    }
  }
  if (missing.empty()) return plan;
  auto copy = std::make_shared<Plan>(*plan);
  for (const auto& name : missing) {
    Resource r;
    r.name = name;
    r.socket = SocketName(name);
    r.mig = name.rfind("nvidia.com/mig-", 0) == 0;
    r.retired = true;
    copy->resources.push_back(std::move(r));
  }
  return copy;
}

absl::Status Manager::StartServers() {
  auto log = Log("deviceplugin");
  servers_.clear();
  for (size_t i = 0; i < plan_->resources.size(); ++i) {
    const Resource& r = plan_->resources[i];
    auto server = std::make_unique<ResourceServer>(plan_, i, config_, Cat(config_->kubelet_dir, "/", r.socket));
    server->SetOnChange(on_change_);
    if (share_resolver_) server->SetShareResolver(share_resolver_);
    if (reporter_) server->SetAssignmentReporter(reporter_);
    if (advisor_) server->SetPreferenceAdvisor(advisor_);
    if (auto st = server->Start(); !st.ok()) {
      for (auto& s : servers_) s->Stop();
      servers_.clear();
      return st;
    }
    if (health_) server->SetHealth(health_state_);
    if (auto it = available_.find(r.name); it != available_.end()) server->SetAvailable(it->second);
    if (!drained_.empty()) server->SetDrained(drained_);
    if (r.retired) {
      log->info("serving {} with zero devices (it no longer exists on this node) on {}", r.name, server->socket_path());
    } else {
      log->info("serving {} ({} devices) on {}", r.name, r.devices.size(), server->socket_path());
    }
    servers_.push_back(std::move(server));
  }
  registered_.assign(servers_.size(), false);
  registered_inode_.assign(servers_.size(), 0);
  kubelet_inode_ = 0;
  ++generation_;
  if (on_change_) on_change_();  // a start, a reload, a new MIG layout
  return absl::OkStatus();
}

void Manager::StopServers() {
  for (auto& s : servers_) s->Stop();
  servers_.clear();
  registered_.clear();
  registered_inode_.clear();
}

void Manager::StartHealth() {
  auto log = Log("deviceplugin");
  const Config& config = *config_;
  if (config.health.disabled) {
    log->warn("health checks are disabled (DP_DISABLE_HEALTHCHECKS / health.disabled): devices stay Healthy");
    return;
  }
  gpu::HealthOptions ho = HealthOptionsFor(config.health);
  ho.on_xid = xid_observer_;
  ho.on_mig_change = [this](unsigned) {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      rescan_now_ = true;
    }
    wake_cv_.notify_all();
  };
  auto monitor = std::make_unique<gpu::HealthMonitor>(
      lib_, inventory_, ho, [this](const std::vector<gpu::DeviceHealth>& changes) { PublishHealth(changes); });
  if (auto st = monitor->Start(); !st.ok()) log->warn("health monitor: {}", std::string(st.message()));
  std::lock_guard<std::mutex> lock(mu_);
  health_ = std::move(monitor);
  // Every change published so far is in the snapshot; the callbacks apply the later ones in order.
  health_state_ = health_->Snapshot();
  WriteServedHealthLocked();
}

void Manager::WriteServedHealthLocked() {
  std::vector<ServedHealth> served;
  for (const auto& [id, h] : health_state_) {
    ServedHealth s{id, -1, false, h.healthy, h.reason};
    if (const gpu::Gpu* g = inventory_->FindGpu(id)) {
      s.gpu = static_cast<int>(g->index);
    } else if (const gpu::MigDevice* m = inventory_->FindMig(id)) {
      s.gpu = static_cast<int>(m->parent);
      s.mig = true;
    }
    served.push_back(std::move(s));
  }
  std::string text = HealthFileJson(served);
  if (text == health_written_) return;
  if (auto st = WriteHealthFile(config_->kubelet_dir, served); !st.ok()) {
    health_file_log_.Report(spdlog::level::warn, Cat(st.message(),
                                                     ": `kgpu doctor` and `kgpu health` cannot show "
                                                     "the health served here (logged again when this changes)"));
    return;
  }
  health_file_log_.Clear(Cat("the served health is written to ", config_->kubelet_dir, "/", kHealthFileName, " again"));
  health_written_ = std::move(text);
}

void Manager::StopHealth() {
  std::unique_ptr<gpu::HealthMonitor> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::move(health_);
  }
  if (old) old->Stop();  // not under mu_: its callback takes mu_
}

void Manager::StartMps() {
  bool any = false;
  for (size_t i = 0; i < plan_->resources.size(); ++i) {
    if (!plan_->resources[i].mps) continue;
    any = true;
    auto daemon = std::make_unique<MpsDaemon>(lib_, plan_, i, config_);
    const auto st = daemon->Start();
    if (!st.ok()) {
      Log("mps")->error("{}; its devices stay Unhealthy and the start is retried", std::string(st.message()));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      available_[plan_->resources[i].name] = st.ok();
    }
    mps_.push_back(std::move(daemon));
  }
  if (any) ProbeMps(true);
}

void Manager::StopMps() {
  if (mps_.empty()) return;
  MarkMpsReady(*config_, false);
  for (auto& d : mps_) d->Stop();
  mps_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  available_.clear();
}

void Manager::ProbeMps(bool force) {
  if (mps_.empty()) return;
  auto log = Log("mps");
  bool all = true;
  auto publish = [&](const std::string& name, bool up) {
    std::lock_guard<std::mutex> lock(mu_);
    bool& was = available_[name];
    if (was == up && !force) return;
    if (was != up) log->info("MPS daemon of {} is {}", name, up ? "ready" : "not answering: its devices are Unhealthy");
    was = up;
    for (auto& s : servers_) {
      if (s->resource().name == name) s->SetAvailable(up);
    }
  };
  for (auto& d : mps_) {
    bool up = false;
    if (d->started()) {
      const auto probe = d->Probe();
      up = probe.ok();
      if (!up)
        log->warn("MPS daemon of {} stopped answering ({}); restarting it", d->resource_name(),
                  std::string(probe.message()));
    }
    if (!up) {
      publish(d->resource_name(), false);  // no admissions while it is down
      if (auto st = d->Start(); !st.ok()) {
        log->warn("MPS daemon of {} is not ready: {}", d->resource_name(), std::string(st.message()));
      } else {
        up = d->Probe().ok();
      }
    }
    all = all && up;
    publish(d->resource_name(), up);
  }
  MarkMpsReady(*config_, all);
}

void Manager::ScanDrainMarkers() {
  std::set<std::string> now;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(config_->kubelet_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kDrainPrefix, 0) == 0) now.insert(name.substr(sizeof kDrainPrefix - 1));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (now == drained_) return;
  auto log = Log("deviceplugin");
  for (const auto& u : now) {
    if (drained_.count(u) == 0)
      log->info("GPU {} is being re-partitioned (kgpu mig apply): its devices are Unhealthy", u);
  }
  for (const auto& u : drained_) {
    if (now.count(u) == 0) log->info("GPU {}: re-partitioning finished", u);
  }
  drained_ = std::move(now);
  for (auto& server : servers_) server->SetDrained(drained_);
}

absl::Status Manager::Start(const Config& config) {
  auto log = Log("deviceplugin");
  if (auto st = Validate(config); !st.ok()) return st;
  if (auto st = CheckKubeletDir(config.kubelet_dir); !st.ok()) return st;
  auto plan = BuildPlan(inventory_, config);
  if (!plan.ok()) return plan.status();
  if ((*plan)->resources.empty()) {
    log->warn("no devices to advertise on this node");
  }
  auto cdi = WriteCdiSpec(**plan, config);
  if (!cdi.ok()) return cdi.status();
  if (!cdi->empty()) log->info("wrote CDI spec {}", *cdi);
  {
    std::lock_guard<std::mutex> lock(mu_);  // advertised() reads it from other threads
    config_ = std::make_shared<const Config>(config);
  }
  for (const auto& name : CheckpointedResources(config)) retired_.insert(name);
  plan_ = WithRetired(*plan);
  layout_seen_ = gpu::MigFingerprint(*inventory_);
  for (const auto& w : config.warnings) log->warn("{}", w);

  StartHealth();
  StartMps();
  ScanDrainMarkers();
  absl::Status served;
  {
    std::lock_guard<std::mutex> lock(mu_);
    served = StartServers();
  }
  if (!served.ok()) {
    StopHealth();
    StopMps();
    return served;
  }
  register_thread_ = std::jthread([this](std::stop_token st) { RegisterLoop(st); });
  watch_thread_ = std::jthread([this](std::stop_token st) { WatchLoop(st); });
  maintenance_thread_.Start([this](std::stop_token st) { MaintenanceLoop(st); });
  return absl::OkStatus();
}

absl::Status Manager::Reload(const Config& config) {
  // Everything that can fail before anything is stopped: a refused config changes nothing.
  if (auto st = Validate(config); !st.ok()) return st;
  if (auto st = CheckKubeletDir(config.kubelet_dir); !st.ok()) return st;
  auto plan = BuildPlan(inventory(), config);
  if (!plan.ok()) return plan.status();
  const Config previous = *config_;
  Stop();
  absl::Status st = Start(config);
  if (st.ok()) return st;
  if (auto back = Start(previous); !back.ok()) {
    return absl::InternalError(Cat("the new configuration failed (", st.message(),
                                   ") and the previous one could not be restored (", back.message(), ")"));
  }
  return absl::Status(st.code(), Cat(st.message(), "; the previous configuration is running again"));
}

void Manager::Stop() {
  // Bounded whatever NVML does: the maintenance thread (MIG rescans) and the health monitor may
  // be inside a hung NVML call; they are left behind after a short wait (see BoundedThread).
  register_thread_.request_stop();
  watch_thread_.request_stop();
  maintenance_thread_.RequestStop();
  cv_.notify_all();
  wake_cv_.notify_all();
  if (register_thread_.joinable()) register_thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (!maintenance_thread_.StopAndJoinUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(500))) {
    Log("deviceplugin")->warn("the MIG rescan is inside an NVML call that has not returned; stopping without it");
  }
  StopHealth();
  {
    std::lock_guard<std::mutex> lock(mu_);
    StopServers();
    if (!health_written_.empty()) RemoveHealthFile(config_->kubelet_dir);
    health_written_.clear();
  }
  if (config_) StopMps();
}

void Manager::PublishHealth(const std::vector<gpu::DeviceHealth>& changes) {
  // The monitor calls back one change at a time, in order: applying each one (not a snapshot
  // taken later) passes every Unhealthy edge to the servers, even one that recovered meanwhile.
  std::lock_guard<std::mutex> lock(mu_);
  if (!health_) return;
  for (const auto& c : changes) health_state_[c.id] = c;
  for (auto& s : servers_) s->SetHealth(health_state_);
  WriteServedHealthLocked();
}

namespace {
// MPS daemons only need a restart when the GPUs of an MPS resource changed.
std::string MpsSignature(const Plan& plan) {
  std::string out;
  for (const auto& r : plan.resources) {
    if (!r.mps) continue;
    out += r.name + ":";
    for (const auto& d : r.devices) out += d.id + ",";
    out += ";";
  }
  return out;
}
}  // namespace

bool Manager::Rediscover() {
  auto log = Log("deviceplugin");
  auto inventory = gpu::Inventory::Discover(lib_, discover_);
  if (!inventory.ok()) {
    log->error("MIG layout changed, but re-discovering the GPUs failed: {}; keeping the previous devices, retrying",
               std::string(inventory.status().message()));
    return false;
  }
  auto plan = BuildPlan(*inventory, *config_);
  if (!plan.ok()) {
    log->error(
        "MIG layout changed, but the new devices cannot be advertised: {}; keeping the previous devices "
        "(fix the layout or the config)",
        std::string(plan.status().message()));
    return false;
  }
  if (auto cdi = WriteCdiSpec(**plan, *config_); !cdi.ok()) {
    log->warn("rewriting the CDI spec: {}", std::string(cdi.status().message()));
  }
  std::vector<std::string> before, after;
  for (const auto& r : plan_->resources) {
    if (!r.retired) before.push_back(Cat(r.name, "=", r.devices.size()));
  }
  for (const auto& r : (*plan)->resources) after.push_back(Cat(r.name, "=", r.devices.size()));
  log->info("MIG layout changed: re-discovered {} GPU(s); resources {} -> {}", (*inventory)->gpus().size(),
            Join(before, " "), Join(after, " "));
  const bool mps_changed = MpsSignature(*plan_) != MpsSignature(**plan);
  if (mps_changed) StopMps();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : plan_->resources) retired_.insert(r.name);  // WithRetired keeps only the missing ones
    inventory_ = *inventory;
    plan_ = WithRetired(*plan);
  }
  if (mps_changed) StartMps();
  // Serve first (health of the GPUs carries over; new MIG devices start Healthy), then move the
  // health monitor to the new inventory: kubelet sees the new devices without waiting for it.
  RestartServers("MIG layout changed");
  StopHealth();
  StartHealth();
  PublishHealth({});
  return true;
}

void Manager::MaintenanceLoop(std::stop_token stop) {
  auto next_rescan = std::chrono::steady_clock::now() + config_->mig.rescan_interval;
  auto next_mps = std::chrono::steady_clock::now();
  // Time-slicing replicas held by the CUDA interposer leave an accounting directory each.
  bool sweeps = !config_->cuda_interposer.empty() && config_->cuda_accounting_sweep.count() > 0;
  if (sweeps) {
    std::lock_guard<std::mutex> lock(mu_);
    sweeps =
        std::any_of(plan_->resources.begin(), plan_->resources.end(), [](const Resource& r) { return r.hard_memory; });
  }
  auto next_sweep = std::chrono::steady_clock::now() + config_->cuda_accounting_sweep;
  while (!stop.stop_requested()) {
    const auto now = std::chrono::steady_clock::now();
    if (sweeps && now >= next_sweep) {
      auto n =
          SweepTimeslicingRegions(config_->cuda_shared_root, CheckpointPath(*config_), config_->cuda_accounting_grace);
      if (!n.ok()) {
        Log("deviceplugin")
            ->warn("time-slicing accounting directories under {} not swept: {}", config_->cuda_shared_root,
                   std::string(n.status().message()));
      }
      next_sweep = now + config_->cuda_accounting_sweep;
    }
    bool event = false;
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      std::swap(event, rescan_now_);
    }
    if (event) {
      // A re-partition is a burst of events (one per instance destroyed or created): look once
      // it has been quiet for a moment, not at its first event.
      next_rescan = now + std::chrono::milliseconds(100);
    } else if (now >= next_rescan) {
      std::shared_ptr<const gpu::Inventory> inventory = this->inventory();
      const std::string seen = gpu::MigFingerprintNow(lib_, *inventory);
      if (stop.stop_requested()) return;  // maybe left behind in a hung call by Stop(): touch nothing
      if (seen != layout_seen_ && Rediscover()) layout_seen_ = seen;  // a failed one is tried again
      next_rescan = now + config_->mig.rescan_interval;
    }
    if (!mps_.empty() && now >= next_mps && !stop.stop_requested()) {
      ProbeMps(false);
      bool all = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [name, up] : available_) all = all && up;
      }
      next_mps = now + (all ? std::chrono::seconds(5) : std::chrono::milliseconds(500));
    }
    // Until the next timer, or at once when NVML reports a MIG change (the timer is the fallback
    // for drivers without MIG events).
    auto wake = mps_.empty() ? next_rescan : std::min(next_rescan, next_mps);
    if (sweeps) wake = std::min(wake, next_sweep);
    std::unique_lock<std::mutex> lock(wake_mu_);
    wake_cv_.wait_until(lock, stop, wake + std::chrono::milliseconds(1), [&] { return rescan_now_; });
  }
}

void Manager::RestartServers(const char* why) {
  auto log = Log("deviceplugin");
  std::lock_guard<std::mutex> lock(mu_);
  log->info("{}: re-serving and re-registering {} resource(s)", why, plan_->resources.size());
  StopServers();
  serve_failed_ = false;
  if (auto st = StartServers(); !st.ok()) {
    log->error("re-serving failed: {}; retrying", std::string(st.message()));
    serve_failed_ = true;
    return;
  }
  cv_.notify_all();
}

namespace {
uint64_t InodeOf(const std::string& path) {
  struct stat sb {};
  return ::stat(path.c_str(), &sb) == 0 ? static_cast<uint64_t>(sb.st_ino) : 0;
}
}  // namespace

void Manager::Reregister(const char* why, const std::string& kubelet_socket) {
  auto log = Log("deviceplugin");
  const uint64_t inode = InodeOf(kubelet_socket);
  std::lock_guard<std::mutex> lock(mu_);
  kubelet_inode_ = inode;
  size_t n = 0;
  for (size_t i = 0; i < registered_.size(); ++i) {
    // One that already reached this kubelet (right after our re-serve) does not register twice.
    if (registered_[i] && registered_inode_[i] == inode && inode != 0) continue;
    registered_[i] = false;
    ++n;
  }
  log->info("{}: registering {} of {} resource(s) again (served since the kubelet's cleanup)", why, n,
            registered_.size());
  cv_.notify_all();
}

std::string Manager::KubeletSocket() const {
  return config_->kubelet_socket.empty() ? Cat(config_->kubelet_dir, "/", kKubeletSocketName) : config_->kubelet_socket;
}

void Manager::RegisterLoop(std::stop_token stop) {
  auto log = Log("deviceplugin");
  const std::string kubelet = KubeletSocket();
  // The first retry comes soon: right after a kubelet restart its new kubelet.sock can exist a
  // moment before it accepts connections. Then doubling, up to 5 s.
  Backoff backoff(std::chrono::milliseconds(5), std::chrono::milliseconds(5000));
  bool warned = false;
  size_t cursor = 0;  // rotates, so one refused resource cannot hold the others back
  while (!stop.stop_requested()) {
    std::string name, endpoint;
    bool pre_start = false;
    size_t index = 0;
    uint64_t generation = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto pending = [&] {
        for (size_t i = 0; i < registered_.size(); ++i) {
          if (!registered_[i]) return true;
        }
        return false;
      };
      if (!cv_.wait(lock, stop, pending)) return;
      for (size_t k = 0; k < registered_.size(); ++k) {
        const size_t i = (cursor + k) % registered_.size();
        if (!registered_[i]) {
          index = i;
          break;
        }
      }
      cursor = index + 1;
      generation = generation_;
      name = servers_[index]->resource().name;
      endpoint = servers_[index]->resource().socket;
      pre_start = servers_[index]->PreStartRequired();
    }
    const uint64_t inode = InodeOf(kubelet);  // the kubelet this registration reaches (if it does)
    const absl::Status st =
        ::kgpu::kubelet::RegisterDevicePlugin(kubelet, endpoint, name, pre_start, std::chrono::seconds(5));
    std::unique_lock<std::mutex> lock(mu_);
    if (st.ok()) {
      // Servers re-created meanwhile (a kubelet restart) need a registration of their own, and
      // so does a kubelet that replaced the one this call reached.
      if (generation == generation_ && (kubelet_inode_ == 0 || inode == kubelet_inode_)) {
        registered_[index] = true;
        registered_inode_[index] = inode;
      }
      registrations_++;
      log->info("registered {} with kubelet ({})", name, endpoint);
      backoff.Reset();
      warned = false;
      continue;
    }
    const auto wait = backoff.Next();
    if (!warned || wait >= std::chrono::seconds(5)) {
      log->warn("registering {} with kubelet at {} failed ({}); retrying in {} ms", name, kubelet,
                std::string(st.message()), wait.count());
      warned = true;
    }
    // Wait out the backoff, but go at once when the servers are re-created (kubelet is back).
    if (!cv_.wait_for(lock, stop, wait, [&] { return generation != generation_; }) && stop.stop_requested()) {
      return;
    }
  }
}

void Manager::WatchLoop(std::stop_token stop) {
  auto log = Log("deviceplugin");
  const std::string dir = config_->kubelet_dir;
  const std::string kubelet = KubeletSocket();
  const int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0 || inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM) < 0) {
    log->error("cannot watch {} for kubelet restarts: {}; restarts will not be noticed", dir, std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return;
  }
  bool kubelet_created = false, ours_deleted = false, drain_changed = false;
  // Our sockets were re-created after one of them was removed, and no kubelet.sock was created
  // since: a kubelet that restarts removes them first, so these servers already post-date it.
  bool reserved_after_removal = false;
  alignas(struct inotify_event) char buf[4096];
  // The stop wakes the poll at once (an eventfd the stop callback writes), so that a SIGTERM does
  // not wait for the poll's timeout.
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } wake_fd{eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};  // closed after on_stop is gone
  const int wake = wake_fd.fd;
  std::stop_callback on_stop(stop, [wake] {
    const uint64_t one = 1;
    if (wake >= 0) (void)!::write(wake, &one, sizeof one);
  });
  while (!stop.stop_requested()) {
    struct pollfd p[2] = {{fd, POLLIN, 0}, {wake, POLLIN, 0}};
    const bool pending = kubelet_created || ours_deleted;
    const int n = ::poll(p, wake >= 0 ? 2 : 1, pending ? 30 : 200);  // a short quiet period batches a burst
    if (stop.stop_requested()) break;
    if (n > 0 && (p[0].revents & POLLIN) != 0) {
      for (;;) {
        const ssize_t len = ::read(fd, buf, sizeof buf);
        if (len <= 0) break;
        for (char* ptr = buf; ptr < buf + len;) {
          const auto* ev = reinterpret_cast<const struct inotify_event*>(ptr);
          const std::string name = ev->len > 0 ? ev->name : "";
          if (name == kKubeletSocketName && (ev->mask & (IN_CREATE | IN_MOVED_TO))) kubelet_created = true;
          if (name.rfind(kDrainPrefix, 0) == 0) drain_changed = true;
          if (ev->mask & (IN_DELETE | IN_MOVED_FROM)) {
            std::lock_guard<std::mutex> lock(mu_);
            for (const auto& s : servers_) {
              if (s->resource().socket == name) ours_deleted = true;
            }
          }
          ptr += sizeof(struct inotify_event) + ev->len;
        }
      }
      if (drain_changed) {
        ScanDrainMarkers();  // at once: kgpu mig apply waits for the devices to turn Unhealthy
        drain_changed = false;
      }
      // No quiet period: a restarting kubelet removes the plugin sockets, then serves a new
      // kubelet.sock. Re-serve as soon as our socket is gone (a socket file that no longer exists
      // serves nobody), so that by the time kubelet.sock appears only the registration is left;
      // if kubelet's cleanup removes the new socket too, the next event re-serves again.
      // Our own re-serve removes the old socket files too: only a socket that is missing now
      // counts.
      bool missing = false;
      if (kubelet_created || ours_deleted) {
        std::lock_guard<std::mutex> lock(mu_);
        missing = serve_failed_ || servers_.empty();
        for (const auto& s : servers_) missing = missing || !Exists(s->socket_path());
      }
      if (kubelet_created) {
        if (reserved_after_removal && !missing) {
          Reregister("kubelet restarted (kubelet.sock re-created)", kubelet);
        } else {
          RestartServers("kubelet restarted (kubelet.sock re-created)");
        }
        reserved_after_removal = false;
      } else if (ours_deleted && missing) {
        RestartServers("our socket was removed");
        reserved_after_removal = true;
      }
      kubelet_created = ours_deleted = false;
      continue;
    }
    bool retry = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      retry = serve_failed_;
    }
    if (retry) {
      RestartServers("retrying the failed re-serve");
      if (!SleepFor(stop, std::chrono::seconds(1))) break;
      continue;
    }
    if (!pending) continue;
    bool missing = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& s : servers_) missing = missing || !Exists(s->socket_path());
    }
    if (kubelet_created || missing) {
      RestartServers(kubelet_created ? "kubelet restarted (kubelet.sock re-created)" : "our socket was removed");
    }
    kubelet_created = ours_deleted = false;
  }
  ::close(fd);
}

}  // namespace kgpu::deviceplugin
