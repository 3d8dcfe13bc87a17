#include "k8s/leader.h"

#include <thread>

#include "common/log.h"
#include "common/sleep.h"
#include "common/strings.h"
#include "k8s/resources.h"

namespace kgpu::k8s {

LeaderElector::LeaderElector(Client& client, LeaderElectionConfig config) : client_(client), cfg_(std::move(config)) {}

ObservedLease LeaderElector::Observed() const {
  std::lock_guard lock(observed_mu_);
  return observed_;
}

void LeaderElector::Remember(const nlohmann::json& lease) {
  ObservedLease o;
  o.holder = lease.value("spec", nlohmann::json::object()).value("holderIdentity", "");
  const auto annotations =
      lease.value("metadata", nlohmann::json::object()).value("annotations", nlohmann::json::object());
  for (const auto& [k, v] : annotations.items()) {
    if (v.is_string()) o.annotations[k] = v.get<std::string>();
  }
  std::lock_guard lock(observed_mu_);
  observed_ = std::move(o);
}

namespace {

void WriteHolderAnnotations(nlohmann::json& lease, const std::map<std::string, std::string>& wanted) {
  if (wanted.empty()) return;
  nlohmann::json& a = lease["metadata"]["annotations"];
  if (!a.is_object()) a = nlohmann::json::object();
  for (const auto& [k, v] : wanted) {
    if (v.empty()) {
      a.erase(k);
    } else {
      a[k] = v;
    }
  }
  if (a.empty()) lease["metadata"].erase("annotations");
}

}  // namespace

bool LeaderElector::TryAcquireOrRenew() {
  const Resource* leases = FindResource("leases");
  const std::string path = leases->Path(cfg_.ns, cfg_.name);
  const auto now = std::chrono::steady_clock::now();
  const int64_t duration_s =
      std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::seconds>(cfg_.lease_duration).count());
  auto current = client_.Get(path);
  if (!current.ok()) {
    if (!IsApiNotFound(current.status())) {
      Log("k8s")->warn("leader election: {}", std::string(current.status().message()));
      return false;
    }
    nlohmann::json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                            {"kind", "Lease"},
                            {"metadata", {{"name", cfg_.name}, {"namespace", cfg_.ns}}},
                            {"spec",
                             {{"holderIdentity", cfg_.identity},
                              {"leaseDurationSeconds", duration_s},
                              {"acquireTime", NowMicroTime()},
                              {"renewTime", NowMicroTime()},
                              {"leaseTransitions", 0}}}};
    WriteHolderAnnotations(lease, cfg_.holder_annotations);
    auto created = client_.Create(leases->Path(cfg_.ns), lease);
    if (!created.ok()) return false;
    Remember(*created);
    observed_rv_ = (*created)["metadata"].value("resourceVersion", "");
    observed_holder_ = cfg_.identity;
    observed_at_ = now;
    return true;
  }
  nlohmann::json lease = *current;
  const nlohmann::json spec = lease.value("spec", nlohmann::json::object());
  const std::string holder = spec.value("holderIdentity", "");
  const std::string rv = lease["metadata"].value("resourceVersion", "");
  Remember(lease);
  if (rv != observed_rv_) {
    observed_rv_ = rv;
    observed_at_ = now;
    if (holder != observed_holder_ && cfg_.on_new_leader && !holder.empty()) cfg_.on_new_leader(holder);
    observed_holder_ = holder;
  }
  const int64_t held_for = spec.value("leaseDurationSeconds", duration_s);
  const bool expired = now - observed_at_ > std::chrono::seconds(held_for);
  if (!holder.empty() && holder != cfg_.identity && !expired) return false;
  const bool transition = holder != cfg_.identity;
  lease["spec"]["holderIdentity"] = cfg_.identity;
  lease["spec"]["leaseDurationSeconds"] = duration_s;
  lease["spec"]["renewTime"] = NowMicroTime();
  if (transition) {
    lease["spec"]["acquireTime"] = NowMicroTime();
    lease["spec"]["leaseTransitions"] = spec.value("leaseTransitions", 0) + 1;
  }
  WriteHolderAnnotations(lease, cfg_.holder_annotations);
  auto updated = client_.Update(path, lease);
  if (!updated.ok()) return false;  // 409: somebody else wrote first; look again next time
  Remember(*updated);
  observed_rv_ = (*updated)["metadata"].value("resourceVersion", "");
  observed_holder_ = cfg_.identity;
  observed_at_ = now;
  return true;
}

void LeaderElector::Release() {
  auto s = client_.UpdateWithRetry(FindResource("leases")->Path(cfg_.ns, cfg_.name), [&](nlohmann::json& lease) {
    if (lease["spec"].value("holderIdentity", "") != cfg_.identity) return absl::AbortedError("not the holder");
    lease["spec"]["holderIdentity"] = "";
    lease["spec"]["leaseDurationSeconds"] = 1;
    lease["spec"]["renewTime"] = NowMicroTime();
    std::map<std::string, std::string> erase;  // nobody to find any more
    for (const auto& [k, v] : cfg_.holder_annotations) erase[k] = "";
    WriteHolderAnnotations(lease, erase);
    return absl::OkStatus();
  });
  if (!s.ok())
    Log("k8s")->info("leader election: release of {}/{}: {}", cfg_.ns, cfg_.name, std::string(s.status().message()));
}

void LeaderElector::Run(std::stop_token stop) {
  auto log = Log("k8s");
  // Campaign.
  while (!stop.stop_requested() && !TryAcquireOrRenew()) {
    if (!SleepFor(stop, cfg_.retry_period)) return;
  }
  if (stop.stop_requested()) return;
  leader_ = true;
  log->info("leader election: {} leads {}/{}", cfg_.identity, cfg_.ns, cfg_.name);
  if (cfg_.on_new_leader) cfg_.on_new_leader(cfg_.identity);
  std::jthread work;
  if (cfg_.on_started_leading) work = std::jthread([f = cfg_.on_started_leading](std::stop_token st) { f(st); });
  // Renew.
  auto last_renew = std::chrono::steady_clock::now();
  while (SleepFor(stop, cfg_.retry_period)) {
    if (TryAcquireOrRenew()) {
      last_renew = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - last_renew > cfg_.renew_deadline) {
      log->warn("leader election: {} lost {}/{} (no renewal within {} ms)", cfg_.identity, cfg_.ns, cfg_.name,
                cfg_.renew_deadline.count());
      break;
    }
  }
  leader_ = false;
  if (work.joinable()) {
    work.request_stop();
    work.join();
  }
  if (stop.stop_requested()) Release();
  if (cfg_.on_stopped_leading) cfg_.on_stopped_leading();
}

}  // namespace kgpu::k8s
