#pragma once
// `kgpu extender`: the kube-scheduler extender over HTTP or HTTPS (cpp-httplib).
//
//   POST <prefix>/filter       ExtenderArgs -> ExtenderFilterResult
//   POST <prefix>/prioritize   ExtenderArgs -> HostPriorityList (0..10)
//   POST <prefix>/bind         ExtenderBindingArgs -> ExtenderBindingResult: books the GPUs, writes
//                              the allocation record (a merge patch carrying the pod's
//                              resourceVersion: a concurrent change is a 409 and is retried on the
//                              fresh pod), then creates pods/binding; any failure forgets the booking
//   POST <prefix>/preempt      ExtenderPreemptionArgs -> ExtenderPreemptionResult
//                              (and, for what kube-scheduler's preemption cannot see, the
//                              extender's own: a filter that refuses every node starts it,
//                              State::PlanPreemption picks the victims, a worker evicts them
//                              through the Eviction API, honouring PodDisruptionBudgets)
//   GET  /healthz              200 while the process serves
//   GET  /readyz               200 once the Node and Pod informers have synced (and, with leader
//                              election, while this replica leads); 503 with the reason otherwise
//   GET  /metrics              Prometheus text (metrics.h)
// Any prefix works (kube-scheduler calls urlPrefix + "/" + verb). Both nodeCacheCapable modes are
// answered: NodeNames in, NodeNames out; full Nodes in, full Nodes out. Before the informers have
// synced every verb answers with an Error (kube-scheduler retries the pod later), never with a
// decision from an empty cache.
//
// Thread-safety: Start/Stop from the owner thread; handlers run on the server's pool.

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "common/work_queue.h"
#include "extender/forward.h"
#include "extender/metrics.h"
#include "extender/state.h"
#include "k8s/client.h"
#include "k8s/events.h"
#include "k8s/informer.h"
#include "k8s/leader.h"

namespace httplib {
class Server;
}

namespace kgpu::extender {

struct ExtenderOptions {
  std::string address = "0.0.0.0:8888";  // host:port; port 0 = any free port
  // HTTPS with this certificate and key, and the verbs answered only for clients that present a
  // certificate signed by client_ca_file (kube-scheduler's extender tlsConfig certFile/keyFile):
  // a bind from anyone else could place any pending pod anywhere. /healthz, /readyz and /metrics
  // need no client certificate (kubelet's probes, Prometheus). All three are required unless
  // insecure_http, which serves plain HTTP to any caller (tests and demos on one machine).
  std::string tls_cert_file, tls_key_file, client_ca_file;
  bool insecure_http = false;
  StateOptions state;
  // HTTP workers. The server gives each connection a worker until it has been idle for the
  // keep-alive timeout, and kube-scheduler keeps one connection per concurrent binding cycle alive:
  // with fewer workers than its connections, a call waits for an idle one to time out (then 5 s,
  // now 1 s) and met kube-scheduler's own 5 s httpTimeout first (seen with 16 binds at once,
  // e2e_cluster_test).
  int threads = 64;
  // Two or more replicas: every replica whose informers have synced is ready and answers filter,
  // prioritize and preempt from its own state; only the Lease holder binds and preempts, and a
  // standby passes each bind on to it (forward.h), so that scheduling goes on through a failover
  // (no Service without endpoints while a new leader waits for the Lease to expire).
  bool leader_elect = false;
  // host:port where the other replicas reach this one (written on the Lease while it leads; a pod
  // gives its IP: --advertise-address=$(POD_IP):8888). Default: --address when its host is a
  // specific address, with the port bound; none for 0.0.0.0 (standbys then cannot forward).
  std::string advertise_address;
  // The client certificate a standby presents to the leader (signed by client_ca_file); with
  // leader_elect under HTTPS, required. The leader must present tls_cert_file (the replicas share it).
  std::string peer_cert_file, peer_key_file;
  std::string lease_namespace = "kube-system";
  std::string lease_name = "kgpu-extender";
  std::string identity;  // default: the host name
  // client-go's (and kube-scheduler's) defaults: a crashed leader is replaced after at most
  // lease_duration + retry_period.
  std::chrono::milliseconds lease_duration{15000}, renew_deadline{10000}, retry_period{2000};
  // The extender's own preemption for shortfalls kube-scheduler cannot see (share memory and
  // cores): off, pods short only of those wait until capacity frees up by itself.
  bool preemption = true;
  // How long one victim's eviction may be refused (429: a PodDisruptionBudget) before the
  // preemption gives up (State::PreemptionFailed).
  std::chrono::milliseconds eviction_wait{10000};
};

class Extender {
 public:
  Extender(k8s::Client& client, ExtenderOptions options);
  ~Extender();
  Extender(const Extender&) = delete;
  Extender& operator=(const Extender&) = delete;

  // Starts the informers, leader election and the server (listening when it returns).
  absl::Status Start();
  void Stop();
  int port() const { return port_; }
  // Empty when ready, else why not.
  std::string NotReadyReason() const;
  // True without leader election, else while this replica holds the Lease: it binds and preempts.
  bool Leads() const { return !elector_ || elector_->IsLeader(); }

  struct Reply {
    int code = 200;
    std::string body;
  };
  Reply Filter(std::string_view body);
  Reply Prioritize(std::string_view body);
  // `forwarded`: passed on by a standby (never passed on again).
  Reply Bind(std::string_view body, bool forwarded = false);
  Reply Preempt(std::string_view body);
  std::string MetricsText() const;

  State& state() { return state_; }
  const Metrics& metrics() const { return metrics_; }

 private:
  Reply Timed(const std::string& verb, const std::function<Reply()>& f);
  // A standby's bind, answered by the leader (or refused when none can be reached).
  Reply ForwardBind(std::string_view body, bool forwarded);
  std::string BindPod(const BindingArgs& args);
  // Evicts the plan's victims one after the other (on preemptions_' worker), each only while this
  // replica leads and the plan's hold stands.
  void CarryOut(const PreemptionPlan& plan, std::stop_token stop);
  // A PodDisruptionBudget that guards more of the plan's victims than it allows disruptions now
  // (each dry run asks for one disruption only): "" when none, else which budget and victims.
  std::string BudgetShortfall(const PreemptionPlan& plan);

  k8s::Client& client_;
  ExtenderOptions opts_;
  State state_;
  mutable Metrics metrics_;  // thread-safe; MetricsText() sets the state gauges
  std::unique_ptr<k8s::Informer> nodes_, pods_;
  // PodDisruptionBudgets, for the preemption planner; not needed to be ready (without them the
  // planner weighs no budget, and the evictions still honour them).
  std::unique_ptr<k8s::Informer> budgets_;
  std::unique_ptr<k8s::LeaderElector> elector_;
  std::unique_ptr<BindForwarder> forwarder_;
  std::jthread elector_thread_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};  // Stop() began: replies close their connections
  const std::string identity_;         // --identity, else the host name
  k8s::EventRecorder events_;
  // Plans of the extender's own preemption, carried out one after the other (CarryOut).
  WorkQueue<PreemptionPlan> preemptions_;
  // Events written off the verbs' path (a filter answers before its Event is written): the
  // nearest node's figures for a pod no node takes. At most kMaxQueuedEvents wait; more are
  // dropped (and counted in kgpu_extender_events_total).
  struct PendingEvent {
    k8s::ObjectRef regarding;
    std::string type, reason, action, note;
  };
  static constexpr size_t kMaxQueuedEvents = 256;
  WorkQueue<PendingEvent> pending_events_{kMaxQueuedEvents};
  void QueueEvent(PendingEvent e);
  // http_ as the TLS options say (ExtenderOptions::client_ca_file).
  absl::Status MakeHttpServer();
};

// `%` doubled: kube-scheduler passes an Error through fmt.Errorf.
std::string EscapePercent(std::string_view s);

}  // namespace kgpu::extender
