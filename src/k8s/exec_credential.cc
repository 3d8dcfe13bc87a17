#include "k8s/exec_credential.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/process.h"
#include "common/strings.h"
#include "k8s/resources.h"

namespace kgpu::k8s {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr size_t kMaxStdout = 4u << 20;                    // an ExecCredential is a few KiB; more is not kept
constexpr std::chrono::milliseconds kExecTimeout{300000};  // gke-gcloud-auth-plugin, kubelogin: seconds

std::string Base64Encode(std::string_view in) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << 16) |
                       (static_cast<uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8) |
                       static_cast<uint32_t>(static_cast<unsigned char>(in[i + 2]));
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << 16) |
                       (static_cast<uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// Go's syscall error texts are lower case ("permission denied"); strerror's are capitalised.
std::string GoErrno(int err) {
  std::string m = std::error_code(err, std::generic_category()).message();
  if (!m.empty() && m[0] >= 'A' && m[0] <= 'Z' && (m.size() < 2 || !(m[1] >= 'A' && m[1] <= 'Z'))) {
    m[0] = static_cast<char>(m[0] - 'A' + 'a');
  }
  return m;
}

}  // namespace

std::string ExecInfoJson(const Config& config, bool interactive) {
  const ExecConfig& x = *config.exec;
  ordered_json spec = ordered_json::object();
  if (x.provide_cluster_info) {
    // client-go's ConfigToExecCluster; the empty fields are omitted (omitempty).
    ordered_json cluster = ordered_json::object();
    cluster["server"] = config.server;
    if (!config.tls_server_name.empty()) cluster["tls-server-name"] = config.tls_server_name;
    if (config.insecure_skip_tls_verify) cluster["insecure-skip-tls-verify"] = true;
    if (!config.ca_pem.empty()) cluster["certificate-authority-data"] = Base64Encode(config.ca_pem);
    if (config.disable_compression) cluster["disable-compression"] = true;
    if (!x.cluster_config_json.empty()) {
      auto ext = ordered_json::parse(x.cluster_config_json, nullptr, false);
      if (!ext.is_discarded()) cluster["config"] = std::move(ext);
    }
    spec["cluster"] = std::move(cluster);
  }
  spec["interactive"] = interactive;
  ordered_json info = ordered_json::object();
  info["kind"] = "ExecCredential";
  info["apiVersion"] = x.api_version;
  info["spec"] = std::move(spec);
  return info.dump();
}

absl::StatusOr<ExecCredential> ParseExecCredential(std::string_view stdout_text, std::string_view api_version) {
  auto j = nlohmann::json::parse(stdout_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    std::string head(stdout_text.substr(0, 200));
    return absl::InvalidArgumentError(
        Cat("decoding stdout: not an ExecCredential in JSON (the plugin wrote '", Printable(head), "')"));
  }
  auto text = [&](const nlohmann::json& o, const char* key) -> std::string {
    auto it = o.find(key);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string version = text(j, "apiVersion");
  const std::string kind = text(j, "kind");
  if (version.empty() || kind.empty()) {
    return absl::InvalidArgumentError(Cat("decoding stdout: Object '", version.empty() ? "apiVersion" : "Kind",
                                          "' is missing in the plugin's output"));
  }
  if (kind != "ExecCredential") {
    return absl::InvalidArgumentError(Cat("decoding stdout: the plugin returned a ", kind, ", not an ExecCredential"));
  }
  if (version != api_version) {
    return absl::InvalidArgumentError(
        Cat("exec plugin is configured to use API version ", api_version, ", plugin returned version ", version));
  }
  auto status = j.find("status");
  if (status == j.end() || status->is_null())
    return absl::InvalidArgumentError("exec plugin didn't return a status field");
  if (!status->is_object()) return absl::InvalidArgumentError("decoding stdout: status must be an object");
  ExecCredential c;
  c.token = text(*status, "token");
  c.client_cert_pem = text(*status, "clientCertificateData");
  c.client_key_pem = text(*status, "clientKeyData");
  if (c.token.empty() && c.client_cert_pem.empty() && c.client_key_pem.empty()) {
    return absl::InvalidArgumentError("exec plugin didn't return a token or cert/key pair");
  }
  if (c.client_cert_pem.empty() != c.client_key_pem.empty()) {
    return absl::InvalidArgumentError("exec plugin returned only certificate or key, not both");
  }
  if (!c.client_cert_pem.empty()) {
    // client-go parses the pair (tls.X509KeyPair); libcurl checks it when it uses it. The PEM
    // framing is checked here so that a plugin printing base64 or DER gets a clear message.
    if (c.client_cert_pem.find("-----BEGIN") == std::string::npos) {
      return absl::InvalidArgumentError(
          "failed parsing client key/certificate: tls: failed to find any PEM data in certificate input");
    }
    if (c.client_key_pem.find("-----BEGIN") == std::string::npos) {
      return absl::InvalidArgumentError(
          "failed parsing client key/certificate: tls: failed to find any PEM data in key input");
    }
  }
  if (auto at = status->find("expirationTimestamp"); at != status->end() && !at->is_null()) {
    const std::string v = at->is_string() ? at->get<std::string>() : at->dump();
    auto t = ParseRfc3339Time(v);
    if (!t) {
      return absl::InvalidArgumentError(
          Cat("decoding stdout: status.expirationTimestamp: parsing time \"", Printable(v), "\" as RFC 3339 failed"));
    }
    c.expiry = *t;
  }
  return c;
}

ExecCredentialSource::ExecCredentialSource(Config config, Now now)
    : config_(std::move(config)), now_(now ? std::move(now) : Now([] { return std::chrono::system_clock::now(); })) {}

std::shared_ptr<ExecCredentialSource> ExecCredentialSource::Shared(const Config& config) {
  // The key: what the plugin is given (client-go keys its cache on the ExecConfig and the cluster).
  const ExecConfig& x = *config.exec;
  nlohmann::json key = {{"command", x.command},
                        {"args", x.args},
                        {"api", x.api_version},
                        {"mode", x.interactive_mode},
                        {"info", ExecInfoJson(config, false)},
                        {"server", config.server},
                        {"sni", config.tls_server_name}};
  for (const auto& [k, v] : x.env) key["env"].push_back({k, v});
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<ExecCredentialSource>> sources;
  std::lock_guard lock(mu);
  auto& s = sources[key.dump()];
  if (!s) s = std::make_shared<ExecCredentialSource>(config);
  return s;
}

absl::StatusOr<ExecCredential> ExecCredentialSource::Get() {
  std::lock_guard lock(mu_);
  // client-go: cached until now is after the expiry; without one, until a 401.
  if (cached_ && (!cached_->expiry || !(now_() > *cached_->expiry))) return *cached_;
  auto c = RunLocked();
  if (!c.ok()) return c.status();
  cached_ = *c;
  return *c;
}

void ExecCredentialSource::Invalidate(uint64_t generation) {
  std::lock_guard lock(mu_);
  if (cached_ && cached_->generation == generation) cached_.reset();
}

uint64_t ExecCredentialSource::Runs() const {
  std::lock_guard lock(mu_);
  return runs_;
}

absl::StatusOr<ExecCredential> ExecCredentialSource::RunLocked() {
  const ExecConfig& x = *config_.exec;
  if (x.interactive_mode == "Always") {
    // client-go: "exec plugin cannot support interactive mode: standard input is not a terminal".
    return absl::FailedPreconditionError(
        Cat("getting credentials: exec plugin cannot support interactive mode: standard input is unavailable (kgpu "
            "runs credential plugins without a terminal, and ",
            x.where,
            ".interactiveMode is Always: log in with the plugin beforehand and set interactiveMode to IfAvailable or "
            "Never)"));
  }
  std::vector<std::pair<std::string, std::string>> env = x.env;
  env.emplace_back("KUBERNETES_EXEC_INFO", ExecInfoJson(config_, false));
  ++runs_;
  // Without a shell, stdin /dev/null, stdout captured, stderr passed through (client-go's
  // cmd.Stderr = os.Stderr). client-go waits for ever; a plugin that hangs is killed after
  // kExecTimeout, so a control loop is not stuck on it.
  std::vector<std::string> argv = {x.command};
  argv.insert(argv.end(), x.args.begin(), x.args.end());
  ProcessOptions po;
  po.env = env;
  po.timeout = kExecTimeout;
  po.max_output = kMaxStdout;
  po.inherit_stderr = true;
  auto ran = RunProcess(argv, po);
  if (!ran.ok()) {
    const int spawn_error = SpawnErrno(ran.status());
    std::string msg;
    if (spawn_error == 0) {
      msg = Cat("getting credentials: exec: ", ran.status().message());
    } else if (spawn_error == ENOENT && x.command.find('/') == std::string::npos) {
      // client-go's wrapCmdRunErrorLocked for *exec.Error (the binary is not in PATH).
      msg = Cat("getting credentials: exec: executable ", x.command,
                " not found\n\nIt looks like you are trying to use a client-go credential plugin that is not "
                "installed.\n\nTo learn more about this feature, consult the documentation available at:\n      "
                "https://kubernetes.io/docs/reference/access-authn-authz/authentication/#client-go-credential-plugins");
    } else {
      // Go's os/exec for a path: "fork/exec /x/plugin: no such file or directory".
      msg = Cat("getting credentials: exec: fork/exec ", x.command, ": ", GoErrno(spawn_error));
    }
    if (!x.install_hint.empty()) msg += Cat("\n\n", x.install_hint);
    return absl::UnavailableError(msg);
  }
  if (ran->timed_out) {
    return absl::UnavailableError(Cat("getting credentials: exec: executable ", x.command, " did not exit within ",
                                      kExecTimeout.count() / 1000, " s (killed)"));
  }
  if (ran->exit_code != 0) {
    return absl::UnavailableError(
        Cat("getting credentials: exec: executable ", x.command, " failed with exit code ", ran->exit_code));
  }
  auto c = ParseExecCredential(ran->out, x.api_version);
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        Cat("getting credentials: ", c.status().message(), " (exec plugin ", x.command, ")"));
  }
  c->generation = runs_;
  Log("k8s")->debug(
      "exec plugin {} returned a {}{}", x.command,
      c->token.empty() ? "client certificate" : (c->client_cert_pem.empty() ? "token" : "token and client certificate"),
      c->expiry ? " with an expiry" : "");
  return c;
}

}  // namespace kgpu::k8s
