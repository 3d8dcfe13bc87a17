#pragma once
// How the client reaches the API server, resolved as kubectl resolves it (client-go's
// clientcmd deferred loading rules, then rest.InClusterConfig):
//  - an explicit --kubeconfig path: that file only (it must exist);
//  - else every file of KUBECONFIG (':'-separated, missing ones skipped) merged, the first file
//    to define a name winning, else ~/.kube/config;
//  - else, when none of those exists, in-cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT
//    and the service account's token (re-read whenever the file changes: projected tokens
//    rotate), its ca.crt and namespace;
//  - else one error that says where it looked and how to point kgpu at a cluster.
// ConfigFromFlags is that resolver; every command uses it. From a kubeconfig: current-context or
// an explicit context; per user a bearer token, tokenFile, client certificate and key (file or
// -data), or an exec credential plugin (exec_credential.h); per cluster the CA (file or -data),
// insecure-skip-tls-verify, tls-server-name and disable-compression. Relative paths are resolved
// against the file that names them (an exec command only when it contains a '/', as client-go).
// proxy-url, auth-provider, basic auth and impersonation are refused with a message.
// Every error names the file and the field, e.g.
//   "/home/a/.kube/config: users[1] (name "alice").user.client-key: cannot read /x/key.pem".
//
// Thread-safety: pure functions (they read the environment and files); Config is a value.

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu::k8s {

// The help text of every command's --kubeconfig flag: one resolver, one description.
inline constexpr char kKubeconfigFlagHelp[] =
    "kubeconfig file (default: the files of $KUBECONFIG merged, else ~/.kube/config, else the pod's service account)";

// users[].user.exec: a client-go credential plugin (exec_credential.h runs it).
struct ExecConfig {
  // As it is run: a bare name is looked up in PATH; a relative path with a '/' has been made
  // absolute against the kubeconfig's directory.
  std::string command;
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;  // added to kgpu's environment
  std::string api_version;  // client.authentication.k8s.io/v1 or client.authentication.k8s.io/v1beta1
  std::string install_hint;
  bool provide_cluster_info = false;
  std::string interactive_mode;  // Never, IfAvailable or Always (v1beta1's default: IfAvailable)
  // clusters[].cluster.extensions[name=client.authentication.k8s.io/exec].extension as JSON
  // (KUBERNETES_EXEC_INFO's spec.cluster.config); empty when there is none.
  std::string cluster_config_json;
  std::string where;  // `/x/kubeconfig: users[0] (name "eks").user.exec`, for messages
};

struct Config {
  std::string server;  // "https://10.0.0.1:6443" (no trailing slash)
  std::string ca_pem;  // CA bundle; empty with ca_file empty means the system store
  std::string ca_file;
  std::string client_cert_pem;
  std::string client_key_pem;
  std::string token;       // a static bearer token
  std::string token_file;  // re-read when it changes (rotation); wins over `token`
  // The user's exec credential plugin. Its token is used when the user has no token or
  // tokenFile, its client certificate when the user has none (client-go's precedence).
  std::optional<ExecConfig> exec;
  bool insecure_skip_tls_verify = false;
  // The name the server's certificate is checked against (and sent as SNI) instead of the
  // server URL's host; the connection still goes to the URL's host.
  std::string tls_server_name;
  bool disable_compression = false;  // no Accept-Encoding: gzip
  std::string ns = "default";        // the context's namespace
  std::string origin;                // where this came from, for messages ("kubeconfig /x, context y")
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

// Loads the kubeconfig as kubectl does: explicit_path alone when given (it must exist), else
// $KUBECONFIG's files merged, else $HOME/.kube/config. `context` overrides current-context.
// Finding no file at all is a NotFound error saying where it looked.
absl::StatusOr<Config> LoadKubeconfig(std::string_view explicit_path = "", std::string_view context = "");

// In-cluster configuration. `sa_dir` is the service account directory
// (/var/run/secrets/kubernetes.io/serviceaccount on a pod; tests pass their own).
absl::StatusOr<Config> InClusterConfig(std::string_view sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

// The resolver of every command: --in-cluster forces the service account (an error when not in a
// pod, or together with --kubeconfig); else an explicit --kubeconfig, else KUBECONFIG, else
// ~/.kube/config, else the service account when in a pod, else a NotFound error naming each
// place it looked (KUBECONFIG, ~/.kube/config, in-cluster) and how to point it at a cluster.
// `sa_dir` is for tests.
absl::StatusOr<Config> ConfigFromFlags(std::string_view kubeconfig, std::string_view context, bool in_cluster,
                                       std::string_view sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

// ConfigFromFlags(explicit_path, context, false).
absl::StatusOr<Config> DefaultConfig(std::string_view explicit_path = "", std::string_view context = "");

}  // namespace kgpu::k8s
