#pragma once
// How the client reaches the API server, resolved as client-go resolves it
// (k8s.io/client-go/tools/clientcmd loading rules and rest.InClusterConfig):
//  - in-cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT, the service account's token
//    (re-read whenever the file changes: projected tokens rotate), its ca.crt and namespace;
//  - kubeconfig: an explicit --kubeconfig path (that file only), else every file of KUBECONFIG
//    (':'-separated) merged with the first file to set a value winning, else ~/.kube/config;
//    current-context or an explicit context; per user a bearer token, tokenFile, client
//    certificate and key (file or -data), per cluster the CA (file or -data),
//    insecure-skip-tls-verify and tls-server-name. Relative paths are resolved against the
//    file that names them. proxy-url, exec and auth-provider are refused with a message.
// Every error names the file and the field, e.g.
//   "/home/a/.kube/config: users[1] (name "alice").user.client-key: cannot read /x/key.pem".
//
// Thread-safety: pure functions; Config is a value.

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::k8s {

struct Config {
  std::string server;  // "https://10.0.0.1:6443" (no trailing slash)
  std::string ca_pem;  // CA bundle; empty with ca_file empty means the system store
  std::string ca_file;
  std::string client_cert_pem;
  std::string client_key_pem;
  std::string token;       // a static bearer token
  std::string token_file;  // re-read when it changes (rotation); wins over `token`
  bool insecure_skip_tls_verify = false;
  std::string tls_server_name;
  std::string ns = "default";  // the context's namespace
  std::string origin;          // where this came from, for messages ("kubeconfig /x, context y")
  // Client-side rate limit, client-go's defaults (rest.Config QPS 5, Burst 10).
  double qps = 5;
  int burst = 10;
  std::chrono::milliseconds timeout{30000};  // every request but watches
  int max_tries = 5;                         // per request, retries included (1: no retry)
  std::string user_agent;                    // "kgpu/<version>" when empty
};

// Parses one kubeconfig document; `origin` (the file name) prefixes every error. Relative
// file paths are resolved against `base_dir`. Reads the files it references.
absl::StatusOr<Config> ParseKubeconfig(std::string_view text, std::string_view origin, std::string_view context = "",
                                       std::string_view base_dir = "");

// Loads as kubectl does: explicit_path alone when given, else $KUBECONFIG merged, else
// $HOME/.kube/config. `context` overrides current-context.
absl::StatusOr<Config> LoadKubeconfig(std::string_view explicit_path = "", std::string_view context = "");

// In-cluster configuration. `sa_dir` is the service account directory
// (/var/run/secrets/kubernetes.io/serviceaccount on a pod; tests pass their own).
absl::StatusOr<Config> InClusterConfig(std::string_view sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

// In-cluster when KUBERNETES_SERVICE_HOST is set and no kubeconfig was named, else kubeconfig.
absl::StatusOr<Config> DefaultConfig(std::string_view explicit_path = "", std::string_view context = "");

// What a command's --kubeconfig / --context / --in-cluster flags ask for: --in-cluster forces the
// service account (an error when not in a pod), else DefaultConfig.
absl::StatusOr<Config> ConfigFromFlags(std::string_view kubeconfig, std::string_view context, bool in_cluster);

}  // namespace kgpu::k8s
