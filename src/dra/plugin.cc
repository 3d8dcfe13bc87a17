#include "dra/plugin.h"

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/strings.h"
#include "dra_health_v1.grpc.pb.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace kgpu::dra {
namespace {

namespace v1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace v1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;
namespace health = ::v1alpha1;
namespace health_v1 = ::v1;
namespace reg = ::pluginregistration;

constexpr size_t kMaxHealthMessage = 1024;

bool IsSocket(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// NodePrepareResources of either version: every claim of the request gets an entry.
template <typename Request, typename Response>
void PrepareAll(Preparer& preparer, const Request& req, Response* resp, bool with_share_id) {
  for (const auto& c : req.claims()) {
    auto& entry = (*resp->mutable_claims())[c.uid()];
    absl::StatusOr<std::vector<PreparedDevice>> got;
    try {
      got = preparer.Prepare({c.namespace_(), c.uid(), c.name()});
    } catch (const std::exception& e) {  // never the whole batch for one claim
      got = absl::InternalError(Cat("preparing the claim: ", e.what()));
    }
    if (!got.ok()) {
      entry.set_error(std::string(got.status().message()));
      Log("dra")->warn("NodePrepareResources {}/{} ({}): {}", c.namespace_(), c.name(), c.uid(),
                       std::string(got.status().message()));
      continue;
    }
    for (const auto& d : *got) {
      auto* dev = entry.add_devices();
      for (const auto& r : d.requests) dev->add_request_names(r);
      dev->set_pool_name(d.pool);
      dev->set_device_name(d.device);
      for (const auto& id : d.cdi_ids) dev->add_cdi_device_ids(id);
      if constexpr (requires { dev->set_share_id(std::string()); }) {
        if (with_share_id && !d.share_id.empty()) dev->set_share_id(d.share_id);
      }
    }
  }
}

template <typename Request, typename Response>
void UnprepareAll(Preparer& preparer, const Request& req, Response* resp) {
  for (const auto& c : req.claims()) {
    auto& entry = (*resp->mutable_claims())[c.uid()];
    if (auto st = preparer.Unprepare({c.namespace_(), c.uid(), c.name()}); !st.ok()) {
      entry.set_error(std::string(st.message()));
      Log("dra")->warn("NodeUnprepareResources {}/{} ({}): {}", c.namespace_(), c.name(), c.uid(),
                       std::string(st.message()));
    }
  }
}

}  // namespace

class Plugin::Impl : public std::enable_shared_from_this<Plugin::Impl> {
 public:
  Impl(PluginOptions o, std::shared_ptr<Preparer> p) : opts(std::move(o)), preparer(std::move(p)) {}

  class RegistrationService final : public reg::Registration::Service {
   public:
    explicit RegistrationService(Impl* impl) : impl_(impl) {}
    grpc::Status GetInfo(grpc::ServerContext*, const reg::InfoRequest*, reg::PluginInfo* info) override {
      info->set_type("DRAPlugin");
      info->set_name(impl_->opts.driver);
      info->set_endpoint(impl_->ServiceSocket());
      // Kubelet takes the first of its own versions (v1, then v1beta1) that we list.
      for (const char* s :
           {"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"}) {
        info->add_supported_versions(s);
      }
      return grpc::Status::OK;
    }
    grpc::Status NotifyRegistrationStatus(grpc::ServerContext*, const reg::RegistrationStatus* status,
                                          reg::RegistrationStatusResponse*) override {
      {
        std::lock_guard lock(impl_->mu);
        impl_->registered = {status->plugin_registered(), status->error()};
      }
      ++impl_->registrations;
      if (status->plugin_registered()) {
        Log("dra")->info("kubelet registered DRA driver {}", impl_->opts.driver);
      } else {
        Log("dra")->error("kubelet refused DRA driver {}: {}", impl_->opts.driver, status->error());
      }
      return grpc::Status::OK;
    }

   private:
    Impl* impl_;
  };

  class V1Service final : public v1::DRAPlugin::Service {
   public:
    explicit V1Service(Impl* impl) : impl_(impl) {}
    grpc::Status NodePrepareResources(grpc::ServerContext*, const v1::NodePrepareResourcesRequest* req,
                                      v1::NodePrepareResourcesResponse* resp) override {
      PrepareAll(*impl_->preparer, *req, resp, true);
      return grpc::Status::OK;
    }
    grpc::Status NodeUnprepareResources(grpc::ServerContext*, const v1::NodeUnprepareResourcesRequest* req,
                                        v1::NodeUnprepareResourcesResponse* resp) override {
      UnprepareAll(*impl_->preparer, *req, resp);
      return grpc::Status::OK;
    }

   private:
    Impl* impl_;
  };

  class V1beta1Service final : public v1beta1::DRAPlugin::Service {
   public:
    explicit V1beta1Service(Impl* impl) : impl_(impl) {}
    grpc::Status NodePrepareResources(grpc::ServerContext*, const v1beta1::NodePrepareResourcesRequest* req,
                                      v1beta1::NodePrepareResourcesResponse* resp) override {
      PrepareAll(*impl_->preparer, *req, resp, false);
      return grpc::Status::OK;
    }
    grpc::Status NodeUnprepareResources(grpc::ServerContext*, const v1beta1::NodeUnprepareResourcesRequest* req,
                                        v1beta1::NodeUnprepareResourcesResponse* resp) override {
      UnprepareAll(*impl_->preparer, *req, resp);
      return grpc::Status::OK;
    }

   private:
    Impl* impl_;
  };

  // NodeWatchResources of either version (v1alpha1 for kubelet 1.34-1.36, v1 for 1.37).
  template <typename Service, typename Request, typename Response, typename Status>
  class HealthService final : public Service {
   public:
    explicit HealthService(Impl* impl) : impl_(impl) {}
    grpc::Status NodeWatchResources(grpc::ServerContext* ctx, const Request*,
                                    grpc::ServerWriter<Response>* writer) override {
      uint64_t sent = ~uint64_t{0};
      while (!ctx->IsCancelled() && !impl_->stopping) {
        Response msg;
        {
          std::unique_lock lock(impl_->mu);
          impl_->cv.wait_for(lock, std::chrono::milliseconds(500),
                             [&] { return impl_->stopping || impl_->health_version != sent; });
          if (impl_->stopping) break;
          if (impl_->health_version == sent) continue;
          sent = impl_->health_version;
          for (const auto& d : impl_->health) {
            auto* h = msg.add_devices();
            h->mutable_device()->set_pool_name(d.pool);
            h->mutable_device()->set_device_name(d.device);
            h->set_health(static_cast<Status>(d.health));
            h->set_last_updated_time(d.updated_unix);
            h->set_health_check_timeout_seconds(impl_->opts.health_timeout_seconds);
            h->set_message(d.message.size() > kMaxHealthMessage ? d.message.substr(0, kMaxHealthMessage - 3) + "..."
                                                                : d.message);
          }
        }
        if (!writer->Write(msg)) break;
      }
      return grpc::Status::OK;
    }

   private:
    Impl* impl_;
  };
  using HealthV1alpha1 = HealthService<health::DRAResourceHealth::Service, health::NodeWatchResourcesRequest,
                                       health::NodeWatchResourcesResponse, health::HealthStatus>;
  using HealthV1 = HealthService<health_v1::DRAResourceHealth::Service, health_v1::NodeWatchResourcesRequest,
                                 health_v1::NodeWatchResourcesResponse, health_v1::HealthStatus>;

  std::string RegistrationSocket() const { return Cat(opts.registry_dir, "/", opts.driver, "-reg.sock"); }
  std::string ServiceSocket() const { return Cat(opts.plugin_dir, "/dra.sock"); }

  absl::StatusOr<std::unique_ptr<grpc::Server>> Serve(const std::string& socket, std::vector<grpc::Service*> services,
                                                      const char* flag) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(socket).parent_path(), ec);
    ::unlink(socket.c_str());  // a stale socket from an earlier run
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    for (auto* s : services) builder.RegisterService(s);
    auto server = builder.BuildAndStart();
    if (!server) {
      return absl::UnavailableError(Cat("cannot serve ", socket, " (is ",
                                        std::filesystem::path(socket).parent_path().string(),
                                        " mounted from the host and writable? ", flag, ")"));
    }
    return server;
  }

  void Watch() {
    std::unique_lock lock(mu);
    while (!stopping) {
      cv.wait_for(lock, opts.socket_check, [&] { return stopping.load(); });
      if (stopping) break;
      if (IsSocket(RegistrationSocket())) continue;
      // Removed (a kubelet cleaning its registry, an operator): serve it again so that kubelet's
      // watcher registers the driver again.
      lock.unlock();
      Log("dra")->warn("{} disappeared: serving it again", RegistrationSocket());
      if (reg_server) reg_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      auto s = Serve(RegistrationSocket(), {&registration}, "--kubelet-registry-dir");
      if (s.ok()) {
        reg_server = std::move(*s);
      } else {
        Log("dra")->error("{}", std::string(s.status().message()));
      }
      lock.lock();
    }
  }

  PluginOptions opts;
  std::shared_ptr<Preparer> preparer;
  RegistrationService registration{this};
  V1Service v1_service{this};
  V1beta1Service v1beta1_service{this};
  HealthV1alpha1 health_service{this};
  HealthV1 health_v1_service{this};
  std::unique_ptr<grpc::Server> reg_server, dra_server;
  std::thread watcher;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> registrations{0};
  mutable std::mutex mu;
  std::condition_variable cv;
  std::pair<bool, std::string> registered{false, ""};
  std::vector<DeviceHealthReport> health;
  uint64_t health_version = 0;
};

absl::StatusOr<std::unique_ptr<Plugin>> Plugin::Start(PluginOptions options, std::shared_ptr<Preparer> preparer) {
  auto impl = std::make_shared<Impl>(std::move(options), std::move(preparer));
  // The service first: kubelet dials it as soon as it has read GetInfo.
  auto dra = impl->Serve(impl->ServiceSocket(),
                         {&impl->v1_service, &impl->v1beta1_service, &impl->health_service, &impl->health_v1_service},
                         "--kubelet-plugins-dir");
  if (!dra.ok()) return dra.status();
  impl->dra_server = std::move(*dra);
  auto regs = impl->Serve(impl->RegistrationSocket(), {&impl->registration}, "--kubelet-registry-dir");
  if (!regs.ok()) {
    impl->dra_server->Shutdown();
    return regs.status();
  }
  impl->reg_server = std::move(*regs);
  impl->watcher = std::thread([raw = impl.get()] { raw->Watch(); });
  Log("dra")->info("DRA driver {}: registration {}, service {}", impl->opts.driver, impl->RegistrationSocket(),
                   impl->ServiceSocket());
  return std::unique_ptr<Plugin>(new Plugin(std::move(impl)));
}

Plugin::~Plugin() {
  Stop();
}

void Plugin::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  impl_->cv.notify_all();
  if (impl_->watcher.joinable()) impl_->watcher.join();
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  if (impl_->reg_server) impl_->reg_server->Shutdown(deadline);
  if (impl_->dra_server) impl_->dra_server->Shutdown(deadline);
  ::unlink(impl_->RegistrationSocket().c_str());
  ::unlink(impl_->ServiceSocket().c_str());
}

std::string Plugin::RegistrationSocket() const {
  return impl_->RegistrationSocket();
}

std::string Plugin::ServiceSocket() const {
  return impl_->ServiceSocket();
}

std::pair<bool, std::string> Plugin::Registration() const {
  std::lock_guard lock(impl_->mu);
  return impl_->registered;
}

uint64_t Plugin::registrations() const {
  return impl_->registrations;
}

void Plugin::SetHealth(std::vector<DeviceHealthReport> devices) {
  {
    std::lock_guard lock(impl_->mu);
    if (devices == impl_->health && impl_->health_version != 0) return;
    impl_->health = std::move(devices);
    ++impl_->health_version;
  }
  impl_->cv.notify_all();
}

}  // namespace kgpu::dra
