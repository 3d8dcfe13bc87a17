#include "testing/fake_kubelet_dra.h"

#include <filesystem>

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include "common/strings.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "k8s/client.h"
#include "k8s/resources.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace kgpu::testing {
namespace {

using json = nlohmann::json;
namespace v1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace v1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

constexpr auto kCallTimeout = std::chrono::seconds(45);  // defaultClientCallTimeout

std::shared_ptr<grpc::Channel> Dial(const std::string& socket) {
  return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
}

uint64_t InodeOf(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) ? static_cast<uint64_t>(st.st_ino) : 0;
}

// One driver's NodePrepareResources (either version) for `claims` (uid -> ns/name); fills
// cdi_ids per UID, or says which claim failed and why.
template <typename Stub, typename Request, typename Response>
absl::Status CallPrepare(Stub& stub, const std::map<std::string, std::pair<std::string, std::string>>& claims,
                         std::map<std::string, std::vector<std::string>>* cdi_ids) {
  Request req;
  for (const auto& [uid, ref] : claims) {
    auto* c = req.add_claims();
    c->set_uid(uid);
    c->set_namespace_(ref.first);
    c->set_name(ref.second);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  Response resp;
  if (auto st = stub.NodePrepareResources(&ctx, req, &resp); !st.ok()) {
    return absl::UnavailableError(Cat("NodePrepareResources: ", st.error_message()));
  }
  size_t answered = 0;
  for (const auto& [uid, r] : resp.claims()) {
    if (!claims.contains(uid)) return absl::InternalError(Cat("NodePrepareResources returned unknown claim ", uid));
    ++answered;
    if (!r.error().empty()) {
      return absl::FailedPreconditionError(
          Cat("NodePrepareResources failed for ResourceClaim ", claims.at(uid).second, ": ", r.error()));
    }
    for (const auto& d : r.devices()) {
      for (const auto& id : d.cdi_device_ids()) (*cdi_ids)[uid].push_back(id);
    }
  }
  if (answered != claims.size()) {
    return absl::FailedPreconditionError(
        Cat("NodePrepareResources skipped ", claims.size() - answered, " ResourceClaims"));
  }
  return absl::OkStatus();
}

template <typename Stub, typename Request, typename Response>
absl::Status CallUnprepare(Stub& stub, const std::map<std::string, std::pair<std::string, std::string>>& claims) {
  Request req;
  for (const auto& [uid, ref] : claims) {
    auto* c = req.add_claims();
    c->set_uid(uid);
    c->set_namespace_(ref.first);
    c->set_name(ref.second);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  Response resp;
  if (auto st = stub.NodeUnprepareResources(&ctx, req, &resp); !st.ok()) {
    return absl::UnavailableError(Cat("NodeUnprepareResources: ", st.error_message()));
  }
  for (const auto& [uid, r] : resp.claims()) {
    if (!r.error().empty()) return absl::FailedPreconditionError(Cat("NodeUnprepareResources: ", r.error()));
  }
  return absl::OkStatus();
}

}  // namespace

FakeDraKubelet::FakeDraKubelet(std::string registry_dir, std::shared_ptr<k8s::Client> client)
    : registry_dir_(std::move(registry_dir)), client_(std::move(client)) {}

FakeDraKubelet::~FakeDraKubelet() {
  Stop();
}

void FakeDraKubelet::Start() {
  std::error_code ec;
  std::filesystem::create_directories(registry_dir_, ec);
  watcher_ = std::thread([this] { Watch(); });
}

void FakeDraKubelet::Stop() {
  if (stop_.exchange(true)) return;
  ++generation_;
  if (watcher_.joinable()) watcher_.join();
  for (auto& t : streams_) {
    if (t.joinable()) t.join();
  }
}

void FakeDraKubelet::Restart() {
  std::lock_guard lock(mu_);
  ++generation_;  // the health streams end
  drivers_.clear();
  seen_.clear();
  health_.clear();
}

std::map<std::string, FakeDraKubelet::Driver> FakeDraKubelet::Drivers() const {
  std::lock_guard lock(mu_);
  return drivers_;
}

std::map<std::string, std::string> FakeDraKubelet::Health(const std::string& driver) const {
  std::lock_guard lock(mu_);
  const auto it = health_.find(driver);
  return it == health_.end() ? std::map<std::string, std::string>{} : it->second;
}

void FakeDraKubelet::Watch() {
  while (!stop_) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(registry_dir_, ec)) {
      const std::string path = e.path().string();
      if (path.size() < 9 || path.substr(path.size() - 9) != "-reg.sock") continue;
      const uint64_t inode = InodeOf(path);
      bool known = false;
      {
        std::lock_guard lock(mu_);
        known = inode == 0 || seen_[path] == inode;
      }
      if (!known) TryRegister(path);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void FakeDraKubelet::TryRegister(const std::string& socket) {
  auto stub = ::pluginregistration::Registration::NewStub(Dial(socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ::pluginregistration::PluginInfo info;
  if (!stub->GetInfo(&ctx, {}, &info).ok()) return;  // not serving yet: the next scan tries again
  std::string version, error;
  bool health = false;
  for (const auto& v : info.supported_versions()) {
    if (v == "v1.DRAPlugin") version = "v1";
    if (v == "v1beta1.DRAPlugin" && version.empty()) version = "v1beta1";
    if (v == "v1alpha1.DRAResourceHealth") health = true;
  }
  if (info.type() != "DRAPlugin") error = Cat("plugin type ", info.type(), " is not DRAPlugin");
  if (error.empty() && version.empty()) error = "none of the plugin's versions are supported by kubelet";
  grpc::ClientContext nctx;
  nctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ::pluginregistration::RegistrationStatus status;
  status.set_plugin_registered(error.empty());
  status.set_error(error);
  ::pluginregistration::RegistrationStatusResponse resp;
  (void)stub->NotifyRegistrationStatus(&nctx, status, &resp);
  std::lock_guard lock(mu_);
  seen_[socket] = InodeOf(socket);
  if (!error.empty()) return;
  Driver& d = drivers_[info.name()];
  d.name = info.name();
  d.endpoint = info.endpoint();
  d.version = version;
  d.health = health;
  ++d.registrations;
  if (health) {
    streams_.emplace_back(
        [this, name = d.name, endpoint = d.endpoint, gen = generation_.load()] { FollowHealth(name, endpoint, gen); });
  }
}

void FakeDraKubelet::FollowHealth(std::string driver, std::string endpoint, uint64_t generation) {
  auto stub = ::v1alpha1::DRAResourceHealth::NewStub(Dial(endpoint));
  grpc::ClientContext ctx;
  std::atomic<bool> done{false};
  std::thread canceller([&] {
    while (!done && generation_ == generation) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ctx.TryCancel();
  });
  auto reader = stub->NodeWatchResources(&ctx, {});
  ::v1alpha1::NodeWatchResourcesResponse msg;
  while (reader->Read(&msg)) {
    std::map<std::string, std::string> list;
    for (const auto& d : msg.devices()) {
      std::string h = ::v1alpha1::HealthStatus_Name(d.health());
      if (!d.message().empty()) h += ": " + d.message();
      list[Cat(d.device().pool_name(), "/", d.device().device_name())] = h;
    }
    std::lock_guard lock(mu_);
    if (generation_ == generation) health_[driver] = std::move(list);
  }
  done = true;
  canceller.join();
}

absl::StatusOr<std::map<std::string, std::vector<std::string>>> FakeDraKubelet::PreparePod(const json& pod) {
  const json& meta = k8s::Field(pod, "metadata");
  const std::string ns = meta.value("namespace", ""), pod_name = meta.value("name", ""),
                    pod_uid = meta.value("uid", "");
  std::map<std::string, std::string> statuses;  // pod claim name -> generated claim name
  for (const auto& s : k8s::Field(pod, "status").value("resourceClaimStatuses", json::array())) {
    statuses[s.value("name", "")] = s.value("resourceClaimName", "");
  }
  // Per driver: the claims still to prepare.
  std::map<std::string, std::map<std::string, std::pair<std::string, std::string>>> todo;
  std::map<std::string, std::string> claim_uid;  // claim name -> UID
  for (const auto& rc : k8s::Field(pod, "spec").value("resourceClaims", json::array())) {
    std::string name = rc.value("resourceClaimName", "");
    if (name.empty()) {
      const auto it = statuses.find(rc.value("name", ""));
      if (it == statuses.end() || it->second.empty()) {
        return absl::FailedPreconditionError(
            Cat("pod ", pod_name, ": resource claim ", rc.value("name", ""), " has no generated ResourceClaim yet"));
      }
      name = it->second;
    }
    auto claim = client_->Get(k8s::FindResource("resourceclaims")->Path(ns, name));
    if (!claim.ok()) return claim.status();
    const std::string uid = k8s::Field(*claim, "metadata").value("uid", "");
    bool reserved = false;
    for (const auto& r : k8s::Field(*claim, "status").value("reservedFor", json::array())) {
      reserved = reserved || r.value("uid", "") == pod_uid;
    }
    if (!reserved) {
      return absl::FailedPreconditionError(
          Cat("pod ", pod_name, " (", pod_uid, ") is not allowed to use ResourceClaim ", name));
    }
    claim_uid[name] = uid;
    {
      std::lock_guard lock(mu_);
      if (const auto it = prepared_.find(uid); it != prepared_.end()) {
        it->second.pods.insert(pod_uid);
        continue;
      }
    }
    for (const auto& r : k8s::Field(k8s::Field(k8s::Field(*claim, "status"), "allocation"), "devices")
                             .value("results", json::array())) {
      todo[r.value("driver", "")][uid] = {ns, name};
    }
  }
  for (const auto& [driver, claims] : todo) {
    Driver d;
    {
      std::lock_guard lock(mu_);
      const auto it = drivers_.find(driver);
      if (it == drivers_.end()) {
        return absl::FailedPreconditionError(Cat("DRA driver ", driver, " is not registered"));
      }
      d = it->second;
    }
    std::map<std::string, std::vector<std::string>> ids;
    absl::Status st;
    if (d.version == "v1") {
      auto stub = v1::DRAPlugin::NewStub(Dial(d.endpoint));
      st = CallPrepare<v1::DRAPlugin::Stub, v1::NodePrepareResourcesRequest, v1::NodePrepareResourcesResponse>(
          *stub, claims, &ids);
    } else {
      auto stub = v1beta1::DRAPlugin::NewStub(Dial(d.endpoint));
      st = CallPrepare<v1beta1::DRAPlugin::Stub, v1beta1::NodePrepareResourcesRequest,
                       v1beta1::NodePrepareResourcesResponse>(*stub, claims, &ids);
    }
    if (!st.ok()) return st;
    std::lock_guard lock(mu_);
    for (const auto& [uid, ref] : claims) {
      Prepared& p = prepared_[uid];
      p.ns = ref.first;
      p.name = ref.second;
      p.driver = driver;
      p.pods.insert(pod_uid);
      p.cdi_ids = ids[uid];
    }
  }
  std::map<std::string, std::vector<std::string>> out;
  std::lock_guard lock(mu_);
  for (const auto& [name, uid] : claim_uid) out[name] = prepared_[uid].cdi_ids;
  return out;
}

absl::Status FakeDraKubelet::UnpreparePod(const json& pod) {
  const std::string pod_uid = k8s::Field(pod, "metadata").value("uid", "");
  std::map<std::string, std::map<std::string, std::pair<std::string, std::string>>> todo;  // driver -> claims
  {
    std::lock_guard lock(mu_);
    for (auto& [uid, p] : prepared_) {
      if (!p.pods.erase(pod_uid) || !p.pods.empty()) continue;  // another pod still uses it
      todo[p.driver][uid] = {p.ns, p.name};
    }
  }
  for (const auto& [driver, claims] : todo) {
    Driver d;
    {
      std::lock_guard lock(mu_);
      const auto it = drivers_.find(driver);
      if (it == drivers_.end()) return absl::FailedPreconditionError(Cat("DRA driver ", driver, " is not registered"));
      d = it->second;
    }
    absl::Status st;
    if (d.version == "v1") {
      auto stub = v1::DRAPlugin::NewStub(Dial(d.endpoint));
      st = CallUnprepare<v1::DRAPlugin::Stub, v1::NodeUnprepareResourcesRequest, v1::NodeUnprepareResourcesResponse>(
          *stub, claims);
    } else {
      auto stub = v1beta1::DRAPlugin::NewStub(Dial(d.endpoint));
      st = CallUnprepare<v1beta1::DRAPlugin::Stub, v1beta1::NodeUnprepareResourcesRequest,
                         v1beta1::NodeUnprepareResourcesResponse>(*stub, claims);
    }
    if (!st.ok()) return st;  // kubelet retries in its reconcile loop; the claims stay prepared
    std::lock_guard lock(mu_);
    for (const auto& [uid, ref] : claims) prepared_.erase(uid);
  }
  return absl::OkStatus();
}

}  // namespace kgpu::testing
