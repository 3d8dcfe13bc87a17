#pragma once
// A standby replica's bind, passed on to the leader (issue 36 §4). Every ready replica answers
// filter and prioritize from its own informers, but only the leader binds: it alone books the
// device-level record, so two pods can never be given the same GPU memory by two replicas. The
// leader's address comes from its Lease (kgpu.io/extender-address). Under HTTPS the standby
// presents its peer certificate (signed by the client CA, so the leader's verbs accept it) and
// accepts only a leader that presents the serving certificate this replica serves with (all
// replicas mount one Secret; that certificate is the only trust anchor).
//
// Thread-safety: Post from any thread (a handle per concurrent call, kept for reuse).

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::extender {

// On the extender's Lease while a replica leads: where the others reach it (host:port).
inline constexpr char kLeaderAddressAnnotation[] = "kgpu.io/extender-address";
// On a bind a standby passes on: the leader answers it or refuses it, never passes it on again.
inline constexpr char kForwardedHeader[] = "X-Kgpu-Forwarded-By";

struct ForwardOptions {
  bool insecure_http = false;                 // plain HTTP, no certificates (the replicas serve --insecure-http)
  std::string peer_cert_file, peer_key_file;  // the client certificate presented to the leader
  std::string leader_cert_file;               // the serving certificate the leader must present
  // Under kube-scheduler's extender httpTimeout (10 s as deployed): the leader's answer arrives
  // while kube-scheduler still waits for it.
  long timeout_ms = 8000;  // NOLINT(google-runtime-int): libcurl's type
};

class BindForwarder {
 public:
  explicit BindForwarder(ForwardOptions options);
  ~BindForwarder();
  BindForwarder(const BindForwarder&) = delete;
  BindForwarder& operator=(const BindForwarder&) = delete;

  struct Answer {
    int code = 0;
    std::string body;
  };
  // POSTs `body` to `path` at `address` (host:port). An error only when no HTTP answer came.
  // `from` (this replica's identity) goes in kForwardedHeader.
  absl::StatusOr<Answer> Post(const std::string& address, const std::string& path, std::string_view body,
                              const std::string& from);

 private:
  ForwardOptions opts_;
  std::mutex mu_;
  std::vector<void*> idle_;  // CURL handles: each keeps its connection to the leader alive
};

}  // namespace kgpu::extender
