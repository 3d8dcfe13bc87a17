#pragma once
// Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection package:
// a candidate takes the Lease when it is absent, released (no holder) or expired — expiry is
// judged by the time *we* last saw the Lease change, not the holder's clock — and the leader
// renews it every retry_period; a leader that cannot renew within renew_deadline stops
// leading. On Stop the leader releases the Lease (holderIdentity cleared) so a successor need
// not wait for expiry. Writes use the Lease's resourceVersion, so two candidates never both
// win (one gets a 409).
//
// Thread-safety: Run() on one thread; IsLeader() and Observed() from any.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <stop_token>
#include <string>

#include "k8s/client.h"

namespace kgpu::k8s {

struct LeaderElectionConfig {
  std::string ns = "kube-system";
  std::string name;      // the Lease
  std::string identity;  // this candidate, e.g. the pod name
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  std::function<void(std::stop_token)> on_started_leading;  // runs on its own thread while leading
  std::function<void()> on_stopped_leading;
  std::function<void(const std::string&)> on_new_leader;
  // Annotations this candidate writes on the Lease whenever it takes or renews it, so that the
  // others can find it (the extender's address for forwarded binds). An empty value removes the
  // key: a successor that has none to give erases its predecessor's.
  std::map<std::string, std::string> holder_annotations;
};

// The Lease as this candidate last read or wrote it.
struct ObservedLease {
  std::string holder;  // empty: released, or never held
  std::map<std::string, std::string> annotations;
};

class LeaderElector {
 public:
  LeaderElector(Client& client, LeaderElectionConfig config);
  // Campaigns, leads, and returns when `stop` is requested (after releasing) or leadership is
  // lost. Call again to campaign again.
  void Run(std::stop_token stop);
  bool IsLeader() const { return leader_; }
  // Standbys see the Lease every retry_period (as they campaign), so this is at most that old.
  ObservedLease Observed() const;

 private:
  // One attempt: true when we hold the Lease afterwards.
  bool TryAcquireOrRenew();
  void Release();

  Client& client_;
  LeaderElectionConfig cfg_;
  std::atomic<bool> leader_{false};
  std::string observed_rv_;
  std::string observed_holder_;
  std::chrono::steady_clock::time_point observed_at_{};
  void Remember(const nlohmann::json& lease);
  mutable std::mutex observed_mu_;
  ObservedLease observed_;
};

}  // namespace kgpu::k8s
