#pragma once
// client-go credential plugins (kubeconfig users[].user.exec), run as client-go's exec
// authenticator (k8s.io/client-go/plugin/pkg/client/auth/exec) runs them:
//  - the command (looked up in PATH when it is a bare name) with its args; no shell; the
//    environment is kgpu's plus the config's env plus KUBERNETES_EXEC_INFO, an ExecCredential in
//    the configured apiVersion (spec.interactive; spec.cluster only with provideClusterInfo);
//  - kgpu runs plugins non-interactively: stdin is /dev/null and spec.interactive is false
//    (interactiveMode Never and IfAvailable); interactiveMode Always is refused with a message
//    before anything runs. The plugin's stderr passes through to kgpu's; its stdout must be an
//    ExecCredential of the same apiVersion;
//  - the credential (a bearer token, a client certificate and key, or both) is kept until
//    status.expirationTimestamp (for the life of the process without one), and dropped after a
//    401 (Invalidate), so the next request runs the plugin again;
//  - errors read as client-go's: "getting credentials: exec: executable aws not found" followed by
//    client-go's paragraph on plugins that are not installed and the installHint, "getting
//    credentials: exec: executable /x/plugin failed with exit code 1", "getting credentials: exec
//    plugin didn't return a token or cert/key pair".
//
// Thread-safety: an ExecCredentialSource may be used from any thread; one plugin run at a time,
// and callers that wait for it get its result.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "k8s/config.h"

namespace kgpu::k8s {

struct ExecCredential {
  std::string token;
  std::string client_cert_pem;  // PEM, may include intermediates
  std::string client_key_pem;
  std::optional<std::chrono::system_clock::time_point> expiry;  // none: until a 401
  uint64_t generation = 0;                                      // which run of the plugin produced it (1 for the first)
};

// KUBERNETES_EXEC_INFO for `config.exec` (set) as client-go encodes it:
// {"kind":"ExecCredential","apiVersion":<exec.api_version>,"spec":{["cluster":{...},]"interactive":false}}
// with spec.cluster (server, tls-server-name, insecure-skip-tls-verify, certificate-authority-data,
// disable-compression, config) only when provideClusterInfo is set.
std::string ExecInfoJson(const Config& config, bool interactive);

// The plugin's stdout as client-go's exec authenticator checks it: an ExecCredential of
// `api_version` with a status holding a token, a client certificate and key, or both.
absl::StatusOr<ExecCredential> ParseExecCredential(std::string_view stdout_text, std::string_view api_version);

class ExecCredentialSource {
 public:
  using Now = std::function<std::chrono::system_clock::time_point()>;
  // `config.exec` must be set. `now` is the wall clock (expirationTimestamp is wall-clock time).
  explicit ExecCredentialSource(Config config, Now now = {});
  ExecCredentialSource(const ExecCredentialSource&) = delete;
  ExecCredentialSource& operator=(const ExecCredentialSource&) = delete;

  // One source per plugin configuration and cluster for the whole process, as client-go caches its
  // authenticators: every Client of the same kubeconfig user shares one credential and one run.
  static std::shared_ptr<ExecCredentialSource> Shared(const Config& config);

  // The credential: the cached one until it expires, else a new run of the plugin. Errors start
  // with "getting credentials: " and name the command.
  absl::StatusOr<ExecCredential> Get();
  // A request with the credential of run `generation` got a 401: forget it (unless a newer run
  // already replaced it), so the next Get runs the plugin again.
  void Invalidate(uint64_t generation);
  uint64_t Runs() const;

 private:
  absl::StatusOr<ExecCredential> RunLocked();

  const Config config_;
  const Now now_;
  mutable std::mutex mu_;
  std::optional<ExecCredential> cached_;
  uint64_t runs_ = 0;
};

}  // namespace kgpu::k8s
