// The client with the kubeconfigs of real clusters, against the API server stand-in over TLS:
//  - exec credential plugins (EKS, GKE, AKS, OIDC): a small shell plugin that counts its runs;
//    its arguments, env, KUBERNETES_EXEC_INFO and stdin; the credential cached until its
//    expirationTimestamp, the plugin run again after a 401 (token rotation); client certificates
//    from the plugin; failures that name the command, as client-go's;
//  - tls-server-name (a certificate for kubernetes.default.svc, server https://127.0.0.1:P) and
//    kubectl's x509 wording for each failed check (name, authority, validity period);
//  - the one resolver of every command: KUBECONFIG=b:a merged for `kgpu extender` as for kubectl,
//    and one message, exit 1, when nothing is configured.
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/strings.h"
#include "k8s/client.h"
#include "k8s/config.h"
#include "testing/fake_apiserver.h"
#include "testing/poll.h"
#include "testing/shell.h"
#include "testing/spawn.h"

namespace kgpu::k8s {
namespace {
using json = nlohmann::json;
using testing::FakeApiServer;
using testing::FakeApiServerOptions;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

class Dir {
 public:
  Dir() {
    char t[] = "/tmp/kgpu-kubeconfig-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  Dir(const Dir&) = delete;
  Dir& operator=(const Dir&) = delete;
  std::string File(const std::string& name) const { return (path / name).string(); }
  std::string Write(const std::string& name, const std::string& text, bool executable = false) const {
    fs::create_directories((path / name).parent_path());
    { std::ofstream(path / name) << text; }
    if (executable) fs::permissions(path / name, fs::perms::owner_all);
    return File(name);
  }
  std::string Read(const std::string& name) const { return testing::ReadFile(File(name)); }
  bool Has(const std::string& name) const { return fs::exists(path / name); }
  fs::path path;
};

std::string Message(const absl::Status& s) {
  return std::string(s.message());
}

// A key and a certificate made here (OpenSSL), PEM.
struct KeyPair {
  std::shared_ptr<EVP_PKEY> key;
  std::shared_ptr<X509> cert;
  std::string cert_pem, key_pem;
};

std::string ToPem(const std::function<int(BIO*)>& write) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  write(bio.get());
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(len));
}

// A certificate for `cn` and `sans` (OpenSSL's "DNS:a,IP:10.0.0.1"; "" for none), valid from
// now + not_before_s to now + not_after_s, signed by `issuer` (self-signed without one).
KeyPair MakeCert(const std::string& cn, const std::string& sans, long not_before_s, long not_after_s, bool ca,
                 const KeyPair* issuer) {
  static long serial = 1000;
  KeyPair kp;
  kp.key.reset(EVP_EC_gen("P-256"), EVP_PKEY_free);
  kp.cert.reset(X509_new(), X509_free);
  X509* x = kp.cert.get();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), not_before_s);
  X509_gmtime_adj(X509_getm_notAfter(x), not_after_s);
  X509_set_pubkey(x, kp.key.get());
  X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* issuer_cert = issuer != nullptr ? issuer->cert.get() : x;
  EVP_PKEY* issuer_key = issuer != nullptr ? issuer->key.get() : kp.key.get();
  X509_set_issuer_name(x, X509_get_subject_name(issuer_cert));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer_cert, x, nullptr, nullptr, 0);
  std::vector<std::pair<int, std::string>> exts;
  if (ca) {
    exts = {{NID_basic_constraints, "critical,CA:TRUE"},
            {NID_key_usage, "critical,keyCertSign,cRLSign,digitalSignature"}};
  } else {
    exts = {{NID_basic_constraints, "CA:FALSE"},
            {NID_key_usage, "critical,digitalSignature"},
            {NID_ext_key_usage, "serverAuth,clientAuth"}};
  }
  if (!sans.empty()) exts.emplace_back(NID_subject_alt_name, sans);
  for (const auto& [nid, value] : exts) {
    X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    EXPECT_NE(e, nullptr) << value;
    if (e == nullptr) continue;
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
  }
  EXPECT_NE(X509_sign(x, issuer_key, EVP_sha256()), 0);
  kp.cert_pem = ToPem([&](BIO* b) { return PEM_write_bio_X509(b, x); });
  kp.key_pem =
      ToPem([&](BIO* b) { return PEM_write_bio_PrivateKey(b, kp.key.get(), nullptr, nullptr, 0, nullptr, nullptr); });
  return kp;
}

// A kubeconfig with one cluster (server, then any further cluster lines) and one user (its YAML
// mapping), current-context set. Paths in it are relative to its directory.
std::string KubeconfigYaml(const std::string& server, const std::string& cluster_lines, const std::string& user) {
  return Cat("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: ", server, "\n",
             cluster_lines, "users:\n- name: u\n  user: ", user, "\n",
             "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n");
}

absl::StatusOr<std::unique_ptr<Client>> ClientFor(const Dir& d, const std::string& kubeconfig_yaml) {
  const std::string file = d.Write("kubeconfig", kubeconfig_yaml);
  auto cfg = LoadKubeconfig(file);
  if (!cfg.ok()) return cfg.status();
  cfg->qps = 0;
  cfg->timeout = 10s;
  return Client::Create(*cfg);
}

// A client-go credential plugin: counts its runs, records what it was given (arguments, $PLUGIN_ENV,
// KUBERNETES_EXEC_INFO, what its stdin is) and prints an ExecCredential with the token in ./token
// and, when ./expiry is there, that expirationTimestamp. It lives in bin/ (the kubeconfig names it
// ./bin/plugin.sh, relative to the kubeconfig's directory).
constexpr char kTokenPlugin[] = R"sh(#!/bin/sh
d=$(cd "$(dirname "$0")/.." && pwd)
n=$(($(cat "$d/runs" 2>/dev/null || echo 0) + 1))
echo $n > "$d/runs"
printf '%s' "$KUBERNETES_EXEC_INFO" > "$d/exec_info"
printf '%s\n' "$@" > "$d/args"
printf '%s' "$PLUGIN_ENV" > "$d/env"
readlink /proc/self/fd/0 > "$d/stdin"
echo "test plugin: run $n" >&2
exp=""
if [ -s "$d/expiry" ]; then exp=",\"expirationTimestamp\":\"$(cat "$d/expiry")\""; fi
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"%s}}\n' "$(cat "$d/token")" "$exp"
)sh";

TEST(ExecPlugin, TokenCachedUntilExpiryAndPluginRunAgainAfter401) {
  FakeApiServerOptions o;
  o.tls = true;
  o.tokens = {{"tok-1", "admin"}};
  FakeApiServer server(o);
  ASSERT_TRUE(server.Start().ok());
  Dir d;
  d.Write("ca.pem", server.ca_pem());
  d.Write("bin/plugin.sh", kTokenPlugin, true);
  d.Write("token", "tok-1");
  const std::string yaml = KubeconfigYaml(server.url(), R"(    certificate-authority: ca.pem
    extensions:
    - name: client.authentication.k8s.io/exec
      extension: {audience: kgpu-test}
)",
                                          R"(
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./bin/plugin.sh
      args: [--cluster, c1]
      env: [{name: PLUGIN_ENV, value: hello}]
      interactiveMode: Never
      provideClusterInfo: true)");
  auto client = ClientFor(d, yaml);
  ASSERT_TRUE(client.ok()) << client.status();
  auto get = [&](Client& c) { return c.Get("/api/v1/nodes"); };
  auto r = get(**client);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(d.Read("runs"), "1\n");
  // What client-go gives a plugin.
  EXPECT_EQ(d.Read("args"), "--cluster\nc1\n");
  EXPECT_EQ(d.Read("env"), "hello");
  EXPECT_EQ(d.Read("stdin"), "/dev/null\n") << "never interactive: stdin is not kgpu's";
  json info = json::parse(d.Read("exec_info"), nullptr, false);
  ASSERT_FALSE(info.is_discarded()) << d.Read("exec_info");
  EXPECT_EQ(info.value("kind", ""), "ExecCredential");
  EXPECT_EQ(info.value("apiVersion", ""), "client.authentication.k8s.io/v1");
  EXPECT_EQ(info["spec"]["interactive"], false);
  EXPECT_EQ(info["spec"]["cluster"]["server"], server.url());
  EXPECT_FALSE(info["spec"]["cluster"].value("certificate-authority-data", "").empty());
  EXPECT_EQ(info["spec"]["cluster"]["config"]["audience"], "kgpu-test");

  // No expirationTimestamp: cached for the life of the process.
  ASSERT_TRUE(get(**client).ok());
  EXPECT_EQ(d.Read("runs"), "1\n");

  // The token rotates: the server answers 401, the plugin runs again and the request is sent again.
  d.Write("token", "tok-2");
  server.SetToken("tok-2", "admin");
  server.RemoveToken("tok-1");
  r = get(**client);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(d.Read("runs"), "2\n");

  // A credential whose expirationTimestamp has passed is not used: the plugin runs first.
  d.Write("expiry", "2001-01-01T00:00:00Z");
  d.Write("token", "tok-3");
  server.SetToken("tok-3", "admin");
  server.RemoveToken("tok-2");
  ASSERT_TRUE(get(**client).ok());  // 401 with tok-2, run 3 (already expired), sent again
  EXPECT_EQ(d.Read("runs"), "3\n");
  ASSERT_TRUE(get(**client).ok());  // expired: run 4 before the request
  EXPECT_EQ(d.Read("runs"), "4\n");
  d.Write("expiry", "2999-01-01T00:00:00Z");
  ASSERT_TRUE(get(**client).ok());  // run 4's credential has expired: run 5, valid until 2999
  ASSERT_TRUE(get(**client).ok());
  EXPECT_EQ(d.Read("runs"), "5\n");

  // Every client of the same kubeconfig user shares the credential, as client-go's cache does.
  auto second = ClientFor(d, yaml);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(get(**second).ok());
  EXPECT_EQ(d.Read("runs"), "5\n");

  // A token the server keeps refusing: one more run and one more try, then the 401.
  d.Write("token", "refused");
  server.SetToken("someone-else", "admin");  // the server keeps authenticating (no token at all: no auth)
  server.RemoveToken("tok-3");
  auto refused = get(**client);
  EXPECT_EQ(HttpStatus(refused.status()), 401) << refused.status();
  EXPECT_EQ(d.Read("runs"), "6\n");
}

TEST(ExecPlugin, FailuresNameTheCommand) {
  FakeApiServerOptions o;
  o.tls = true;
  o.tokens = {{"t", "admin"}};
  FakeApiServer server(o);
  ASSERT_TRUE(server.Start().ok());
  Dir d;
  d.Write("ca.pem", server.ca_pem());
  auto failure = [&](const std::string& exec) -> std::string {
    auto client = ClientFor(d, KubeconfigYaml(server.url(), "    certificate-authority: ca.pem\n", exec));
    if (!client.ok()) return Message(client.status());
    auto r = (*client)->Get("/api/v1/nodes");
    return r.ok() ? std::string("no error") : Message(r.status());
  };

  // A plugin that fails: its exit code and its path; not run again by the GET's retries.
  d.Write("fail.sh", "#!/bin/sh\necho run >> \"$(dirname \"$0\")/fail-runs\"\necho 'run aws sso login' >&2\nexit 3\n",
          true);
  std::string m = failure("{exec: {command: ./fail.sh, apiVersion: client.authentication.k8s.io/v1beta1}}");
  EXPECT_NE(m.find(Cat("getting credentials: exec: executable ", d.File("fail.sh"), " failed with exit code 3")),
            std::string::npos)
      << m;
  EXPECT_EQ(d.Read("fail-runs"), "run\n") << "a failing plugin is not run again by the request's retries";

  // Not installed: client-go's paragraph and the kubeconfig's installHint.
  m = failure(
      "{exec: {command: kgpu-test-no-such-plugin, apiVersion: client.authentication.k8s.io/v1beta1, "
      "installHint: 'install it with: apt install kgpu-test-plugin'}}");
  for (const char* part : {"getting credentials: exec: executable kgpu-test-no-such-plugin not found",
                           "It looks like you are trying to use a client-go credential plugin that is not installed.",
                           "install it with: apt install kgpu-test-plugin"}) {
    EXPECT_NE(m.find(part), std::string::npos) << part << "\n" << m;
  }

  // The ExecCredential must be of the configured apiVersion.
  d.Write("beta.sh",
          "#!/bin/sh\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\","
          "\"status\":{\"token\":\"t\"}}'\n",
          true);
  m = failure("{exec: {command: ./beta.sh, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Never}}");
  EXPECT_NE(m.find("exec plugin is configured to use API version client.authentication.k8s.io/v1, plugin returned "
                   "version client.authentication.k8s.io/v1beta1"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(d.File("beta.sh")), std::string::npos) << m;

  // Output that is no ExecCredential.
  d.Write("garbage.sh", "#!/bin/sh\necho 'Please log in at https://example.com'\n", true);
  m = failure("{exec: {command: ./garbage.sh, apiVersion: client.authentication.k8s.io/v1beta1}}");
  EXPECT_NE(m.find("getting credentials: decoding stdout"), std::string::npos) << m;

  // interactiveMode Always: kgpu has no terminal to give; refused before the plugin runs.
  d.Write("always.sh", "#!/bin/sh\ntouch \"$(dirname \"$0\")/always-ran\"\n", true);
  m = failure("{exec: {command: ./always.sh, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Always}}");
  EXPECT_NE(m.find("exec plugin cannot support interactive mode"), std::string::npos) << m;
  EXPECT_NE(m.find("interactiveMode is Always"), std::string::npos) << m;
  EXPECT_FALSE(d.Has("always-ran"));

  // v1 must say whether it wants a terminal (clientcmd's validation).
  m = failure("{exec: {command: ./always.sh, apiVersion: client.authentication.k8s.io/v1}}");
  EXPECT_NE(m.find("interactiveMode: must be specified"), std::string::npos) << m;
}

// A plugin that returns a client certificate and key instead of a token: handed to libcurl as
// blobs; a pair that does not match is refused with the plugin named.
TEST(ExecPlugin, ClientCertificateFromThePlugin) {
  FakeApiServerOptions o;
  o.tls = true;
  FakeApiServer server(o);
  ASSERT_TRUE(server.Start().ok());
  const KeyPair a = MakeCert("alice", "", -3600, 86400, false, nullptr);
  const KeyPair b = MakeCert("bob", "", -3600, 86400, false, nullptr);
  auto credential = [](const std::string& cert, const std::string& key) {
    return json{{"apiVersion", "client.authentication.k8s.io/v1beta1"},
                {"kind", "ExecCredential"},
                {"status", {{"clientCertificateData", cert}, {"clientKeyData", key}}}}
        .dump();
  };
  const std::string plugin = "#!/bin/sh\ncat \"$(dirname \"$0\")/credential.json\"\n";
  Dir good;
  good.Write("ca.pem", server.ca_pem());
  good.Write("plugin.sh", plugin, true);
  good.Write("credential.json", credential(a.cert_pem, a.key_pem));
  const std::string exec = "{exec: {command: ./plugin.sh, apiVersion: client.authentication.k8s.io/v1beta1}}";
  auto client = ClientFor(good, KubeconfigYaml(server.url(), "    certificate-authority: ca.pem\n", exec));
  ASSERT_TRUE(client.ok()) << client.status();
  auto r = (*client)->Get("/api/v1/nodes");
  EXPECT_TRUE(r.ok()) << r.status();

  Dir bad;
  bad.Write("ca.pem", server.ca_pem());
  bad.Write("plugin.sh", plugin, true);
  bad.Write("credential.json", credential(a.cert_pem, b.key_pem));
  client = ClientFor(bad, KubeconfigYaml(server.url(), "    certificate-authority: ca.pem\n", exec));
  ASSERT_TRUE(client.ok()) << client.status();
  r = (*client)->Get("/api/v1/nodes");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(Message(r.status())
                .find(Cat("tls: the client certificate and key cannot be used (from the exec plugin ",
                          bad.File("plugin.sh"))),
            std::string::npos)
      << r.status();
}

// A server certificate for kubernetes.default.svc reached at https://127.0.0.1:P: kubectl works
// with tls-server-name, and so does kgpu; each failed check is named in kubectl's words.
TEST(TlsServerName, CertificateCheckedAgainstTheNameNotTheAddress) {
  const KeyPair ca = MakeCert("kgpu-test-ca", "", -3600, 86400, true, nullptr);
  const KeyPair leaf =
      MakeCert("kube-apiserver", "DNS:kubernetes.default.svc,DNS:kubernetes", -3600, 86400, false, &ca);
  const KeyPair expired =
      MakeCert("kube-apiserver", "DNS:kubernetes.default.svc,IP:127.0.0.1", -2 * 86400, -86400, false, &ca);
  Dir d;
  d.Write("ca.pem", ca.cert_pem);
  FakeApiServerOptions o;
  o.tls = true;
  o.tls_cert_file = d.Write("leaf.crt", leaf.cert_pem);
  o.tls_key_file = d.Write("leaf.key", leaf.key_pem);
  FakeApiServer server(o);
  ASSERT_TRUE(server.Start().ok());
  auto get = [&](const std::string& cluster_lines) -> absl::Status {
    auto client = ClientFor(d, KubeconfigYaml(server.url(), cluster_lines, "{}"));
    if (!client.ok()) return client.status();
    return (*client)->Get("/api/v1/nodes").status();
  };

  auto ok = get("    certificate-authority: ca.pem\n    tls-server-name: kubernetes.default.svc\n");
  EXPECT_TRUE(ok.ok()) << ok;

  auto by_address = get("    certificate-authority: ca.pem\n");
  ASSERT_FALSE(by_address.ok());
  const std::string m = Message(by_address);
  EXPECT_NE(m.find("tls: failed to verify certificate: x509: cannot validate certificate for 127.0.0.1 because it "
                   "doesn't contain any IP SANs"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("the certificate names kubernetes.default.svc, kubernetes"), std::string::npos) << m;
  EXPECT_EQ(m.find("SSL peer certificate or SSH remote key was not OK"), std::string::npos) << m;

  auto wrong_name = get("    certificate-authority: ca.pem\n    tls-server-name: api.example.com\n");
  EXPECT_NE(Message(wrong_name)
                .find("x509: certificate is valid for kubernetes.default.svc, kubernetes, not "
                      "api.example.com (the server name check against tls-server-name"),
            std::string::npos)
      << wrong_name;

  auto unknown_ca = get("    tls-server-name: kubernetes.default.svc\n");
  EXPECT_NE(Message(unknown_ca)
                .find("tls: failed to verify certificate: x509: certificate signed by unknown authority "
                      "(the certificate chain check against the system's trusted CAs"),
            std::string::npos)
      << unknown_ca;

  FakeApiServerOptions eo;
  eo.tls = true;
  eo.tls_cert_file = d.Write("expired.crt", expired.cert_pem);
  eo.tls_key_file = d.Write("expired.key", expired.key_pem);
  FakeApiServer old_cert(eo);
  ASSERT_TRUE(old_cert.Start().ok());
  auto client = ClientFor(d, KubeconfigYaml(old_cert.url(), "    certificate-authority: ca.pem\n", "{}"));
  ASSERT_TRUE(client.ok()) << client.status();
  auto stale = (*client)->Get("/api/v1/nodes").status();
  EXPECT_NE(Message(stale).find("tls: failed to verify certificate: x509: certificate has expired or is not yet "
                                "valid: current time "),
            std::string::npos)
      << stale;
  EXPECT_NE(Message(stale).find(" is after "), std::string::npos) << stale;
}

// KUBECONFIG=b.yaml:a.yaml: `kgpu extender` merges the files as kubectl does (it used to take the
// list for one file name), the first file to define a name winning.
TEST(Resolver, KubeconfigListIsMergedForTheExtender) {
  FakeApiServer server;
  ASSERT_TRUE(server.Start().ok());
  Dir d;
  const std::string b = d.Write("b.yaml", Cat("clusters: [{name: c, cluster: {server: \"", server.url(), "\"}}]\n",
                                              "contexts: [{name: x, context: {cluster: c}}]\n"));
  const std::string a = d.Write("a.yaml", R"(clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: x, context: {cluster: c}}]
current-context: x
)");
  testing::SpawnOptions so;
  so.log = d.File("extender.log");
  so.env = {"KUBECONFIG=" + b + ":" + a};
  const pid_t pid = testing::Spawn({KGPU_BIN, "extender", "--insecure-http", "--address", "127.0.0.1:0"}, so);
  ASSERT_GT(pid, 0) << std::strerror(errno);
  int status = 0;
  bool exited = false;
  const bool listening = testing::WaitFor(
                             [&] {
                               if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) exited = true;
                               return exited || d.Read("extender.log").find("listening on port") != std::string::npos;
                             },
                             60s) &&
                         !exited;
  const bool asked = listening && testing::WaitFor([&] { return server.Requests() > 0; }, 30s);
  if (!exited) {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, &status, 0);
  }
  EXPECT_TRUE(listening) << d.Read("extender.log");
  EXPECT_TRUE(asked) << "the extender reads the cluster of b.yaml, the first file to define it";
  EXPECT_EQ(d.Read("extender.log").find("cannot read"), std::string::npos) << d.Read("extender.log");
}

// Nothing configured: every command says where it looked and how to point it, and exits 1.
TEST(Resolver, NothingConfiguredIsOneMessageEverywhere) {
  Dir home;
  for (const char* command : {"extender --address 127.0.0.1:0", "quota", "slurm-bridge status"}) {
    const auto r = testing::Shell(Cat("env -u KUBECONFIG -u KUBERNETES_SERVICE_HOST -u KUBERNETES_SERVICE_PORT HOME=",
                                      testing::Quote(home.path.string()), " ", KGPU_BIN, " ", command));
    EXPECT_EQ(r.code, 1) << command << "\n" << r.out;
    for (const std::string& part :
         {Cat("no Kubernetes API server configured: looked at KUBECONFIG (not set), ", home.File(".kube/config"),
              " (does not exist), the in-cluster service account (not in a pod"),
          std::string("pass --kubeconfig FILE, set KUBECONFIG=FILE[:FILE...] or create ~/.kube/config")}) {
      EXPECT_NE(r.out.find(part), std::string::npos) << command << "\n" << r.out;
    }
  }
}

}  // namespace
}  // namespace kgpu::k8s
