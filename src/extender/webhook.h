#pragma once
// `kgpu webhook`: the admission webhook for GPU requests (docs/webhook.md).
//
//   POST /mutate    AdmissionReview (admission.k8s.io/v1) -> a JSONPatch that fills defaults,
//                   translates HAMi's names and sets schedulerName
//   POST /validate  AdmissionReview -> allowed, or denied with messages that name the field
//   GET  /healthz   200 while the process serves
//   GET  /metrics   Prometheus text: reviews by operation, result and resource, denials by
//                   reason code, handling time, malformed reviews, the GPU sizes in use and, with
//                   the node informer, its state (unauthenticated and read-only, as the extender's)
//
// Mutation, per container (init containers too), reading each GPU resource from limits, else
// requests (Kubernetes copies a limit into a missing request; a request without a limit would be
// refused by the apiserver, so the webhook promotes it):
//   - HAMi translation when the container has nvidia.com/gpumem, nvidia.com/gpumem-percentage or
//     nvidia.com/gpucores, or has nvidia.com/gpu and --translate-hami is set: nvidia.com/gpu (N,
//     default 1) -> kgpu.io/gpu N; gpumem M (per GPU) -> kgpu.io/gpu-memory M*N; gpumem-percentage
//     P -> P% of the smallest GPU (--smallest-gpu-memory-mib) * N; gpucores C -> kgpu.io/gpu-cores
//     C*N. The pod's nvidia.com/use-gputype, nouse-gputype, use-gpuuuid, nouse-gpuuuid
//     annotations become kgpu.io/gpu-model, -model-deny, -uuid, -uuid-deny (existing kgpu.io
//     annotations are kept).
//   - kgpu.io/gpu-memory or kgpu.io/gpu-cores without kgpu.io/gpu -> kgpu.io/gpu: 1.
//   - no kgpu.io/gpu-cores and --smallest-gpu-memory-mib known: cores per share =
//     floor(100 * memory per share / smallest GPU MiB), at least 1, at most 100.
//   - limits and requests both written, equal; schedulerName set when configured and the pod
//     asks for kgpu.io GPUs (a pod that names a scheduler other than default-scheduler is kept).
// Validation: refuses nvidia.com/gpu together with kgpu.io/gpu in one container, a request
// without a limit or unequal to it, more than 100% cores per share, a share larger than the
// largest GPU (--largest-gpu-memory-mib), a privileged container asking for shares, and anything
// the extender's request model (request.h) rejects.
//
// GPU sizes: the flags, else (with --kubeconfig, or in a pod with a service account) the smallest
// and largest memory of the GPUs that serve shares, from the nodes' kgpu.io/gpu-inventory
// annotations (an informer on nodes); unknown until it has synced or while no node serves shares.
//
// Thread-safety: the functions are pure; Webhook: Start/Stop from the owner thread; the handlers
// read the sizes under a lock; the metrics registry is thread-safe.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/prom_text.h"

namespace httplib {
class Server;
}

namespace kgpu::k8s {
class Client;
class Informer;
}  // namespace kgpu::k8s

namespace kgpu::extender {

inline constexpr char kHamiMemory[] = "nvidia.com/gpumem";
inline constexpr char kHamiMemoryPercent[] = "nvidia.com/gpumem-percentage";
inline constexpr char kHamiCores[] = "nvidia.com/gpucores";

struct WebhookOptions {
  std::string address = "0.0.0.0:8443";
  std::string tls_cert_file, tls_key_file;
  bool insecure_http = false;  // serve plain HTTP (tests only)
  int threads = 4;
  std::string scheduler_name;  // "" = leave schedulerName alone
  // A GPU pod whose schedulerName is one of these (HAMi's) gets scheduler_name instead, or
  // default-scheduler when that is empty (kgpu extends kube-scheduler), with a warning: once HAMi is
  // removed no scheduler of that name runs, and the pod would stay Pending. Empty: kept.
  std::vector<std::string> replace_scheduler_names = {"hami-scheduler"};
  bool translate_hami = false;          // nvidia.com/gpu alone is HAMi's vGPU count
  int64_t smallest_gpu_memory_mib = 0;  // 0 = unknown: no cores default, no gpumem-percentage
  int64_t largest_gpu_memory_mib = 0;   // 0 = unknown: share size not checked
  // Non-empty: the API server to read the nodes' GPU inventories (kgpu.io/gpu-inventory) from, so
  // that the two sizes above, where not given, follow the GPUs that serve shares (list+watch nodes).
  std::string kubeconfig, context;
  bool in_cluster = false;  // the pod's service account instead of a kubeconfig
};

struct Decision {
  bool allowed = true;
  std::string message;                             // denied: every reason, "; "-separated
  nlohmann::json patch = nlohmann::json::array();  // JSONPatch (RFC 6902) against the pod
  // Denied: one stable code per reason in `message`, in the same order (for
  // kgpu_webhook_denials_total{reason}: a fixed set of label values, never the message itself).
  std::vector<std::string> reasons;
  // Allowed: what the API server shows the client (AdmissionResponse.warnings; kubectl prints
  // "Warning: ..."), e.g. a scheduler name replaced.
  std::vector<std::string> warnings;
};

Decision MutatePod(const nlohmann::json& pod, const WebhookOptions& options);
Decision ValidatePod(const nlohmann::json& pod, const WebhookOptions& options);

// What Review() decided, for the metrics. `resource` is "pods" when the review's kind is Pod and
// "other" otherwise (the configurations send only pods; the label takes no value from the body, so
// a caller cannot grow the number of series); `result` is "allowed", "patched" (allowed with a
// JSONPatch) or "denied"; `reasons` the denial's codes (Decision::reasons).
struct ReviewOutcome {
  std::string resource;
  std::string result;
  std::vector<std::string> reasons;
};

// One AdmissionReview request -> its AdmissionReview response (uid echoed, patch base64).
// InvalidArgument naming what is missing when `body` is not an AdmissionReview. `outcome`, when
// given, is filled for an accepted review.
absl::StatusOr<nlohmann::json> Review(std::string_view body, bool mutate, const WebhookOptions& options,
                                      ReviewOutcome* outcome = nullptr);

// RFC 6901 escaping of one path segment ("kgpu.io/gpu" -> "kgpu.io~1gpu").
std::string PointerEscape(std::string_view segment);

class Webhook {
 public:
  explicit Webhook(WebhookOptions options);
  ~Webhook();
  Webhook(const Webhook&) = delete;
  Webhook& operator=(const Webhook&) = delete;
  absl::Status Start();  // listening when it returns
  void Stop();
  int port() const { return port_; }
  // The /metrics page (the gauges read at this call).
  std::string MetricsText() const;

  // kgpu_webhook_request_duration_seconds' upper bounds: a review is in-memory JSON work, so the
  // low end is resolved finely; past 1 s the API server's own deadline (timeoutSeconds: 5 in
  // deploy/webhook) is what matters, and +Inf counts those.
  static constexpr double kBuckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};

 private:
  // opts_ with the GPU sizes the inventories give where the flags gave none.
  WebhookOptions Effective() const;
  void NodeChanged(const nlohmann::json& node, bool removed);
  // One POST to /mutate or /validate: the answer's HTTP status and body, counted and timed.
  std::pair<int, std::string> Handle(bool mutate, std::string_view body);

  WebhookOptions opts_;
  mutable prom::MetricsRegistry metrics_;  // MetricsText() sets the gauges
  std::unique_ptr<k8s::Client> client_;
  std::unique_ptr<k8s::Informer> nodes_;
  mutable std::mutex sizes_mu_;
  std::map<std::string, std::pair<int64_t, int64_t>> node_sizes_;  // node -> smallest, largest share GPU
  int64_t smallest_ = 0, largest_ = 0;                             // over node_sizes_ (guarded by sizes_mu_)
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  int port_ = 0;
};

}  // namespace kgpu::extender
