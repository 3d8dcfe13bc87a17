// kgpu-fake-apiserver: the API server stand-in as a command, for the demo, the
// separate-process tests and for pointing kubectl or kgpu at by hand. See docs/k8s.md.
//
//   kgpu-fake-apiserver --listen 127.0.0.1:6443 --tls --token s3cret=admin
//       --preload nodes.yaml --kubeconfig-out /tmp/fake.kubeconfig
//   kubectl --kubeconfig /tmp/fake.kubeconfig get nodes
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/strings.h"
#include "common/yaml_util.h"
#include "testing/fake_apiserver.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) {
  g_stop = 1;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kgpu-fake-apiserver: a kube-apiserver stand-in for tests, demos and manual checks"};
  std::string listen = "127.0.0.1:0";
  bool tls = false;
  std::string cert, key, kubeconfig_out, port_file, rbac_file;
  std::vector<std::string> tokens, preload;
  size_t window = 100000;
  int bookmark_ms = 1000;
  bool no_reap = false;
  app.add_option("--listen", listen, "address:port to listen on (port 0 picks a free one)")->capture_default_str();
  app.add_flag("--tls", tls,
               "serve HTTPS (a self-signed certificate for 127.0.0.1/localhost unless --tls-cert/--tls-key)");
  app.add_option("--tls-cert", cert, "PEM certificate file for --tls");
  app.add_option("--tls-key", key, "PEM private key file for --tls");
  app.add_option("--token", tokens,
                 "accept this bearer token, as TOKEN or TOKEN=USER (repeatable); without any, no authentication "
                 "(kubectl sends tokens over HTTPS only)");
  app.add_option("--rbac", rbac_file,
                 "YAML file: {users: {<user>: [{verbs: [get, list], resources: [nodes, pods/eviction]}]}}; users not "
                 "listed may do anything");
  app.add_option("--preload", preload, "YAML/JSON file or directory of objects to create at start (repeatable)");
  app.add_option("--history-window", window, "watch events kept; older resourceVersions answer 410 Gone")
      ->capture_default_str();
  app.add_option("--bookmark-interval-ms", bookmark_ms, "BOOKMARK period of watches that allow them")
      ->capture_default_str();
  app.add_flag("--no-reap", no_reap, "leave gracefully deleted pods Terminating (no kubelet finishing them)");
  app.add_option("--kubeconfig-out", kubeconfig_out, "write a kubeconfig for this server (CA and first token) here");
  app.add_option("--port-file", port_file, "write the port chosen here once listening");
  std::string git_version = kgpu::testing::FakeApiServerOptions{}.git_version;
  app.add_option("--git-version", git_version,
                 "the version /version reports (kubectl's dispatcher runs that minor's kubectl); v1.34 and later "
                 "also serve resource.k8s.io/v1")
      ->check([](const std::string& v) {
        return v.size() > 3 && v.rfind("v1.", 0) == 0 ? std::string() : std::string("must look like v1.34.2");
      })
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  kgpu::testing::FakeApiServerOptions opts;
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    std::cerr << "kgpu-fake-apiserver: --listen '" << listen << "' must be address:port\n";
    return 2;
  }
  opts.host = listen.substr(0, colon);
  opts.port = std::atoi(listen.substr(colon + 1).c_str());
  opts.tls = tls;
  opts.tls_cert_file = cert;
  opts.tls_key_file = key;
  opts.history_window = window;
  opts.bookmark_interval = std::chrono::milliseconds(bookmark_ms);
  opts.reap_terminating_pods = !no_reap;
  opts.git_version = git_version;
  std::string first_token;
  for (const auto& t : tokens) {
    const auto eq = t.find('=');
    const std::string tok = t.substr(0, eq);
    if (first_token.empty()) first_token = tok;
    opts.tokens[tok] = eq == std::string::npos ? "admin" : t.substr(eq + 1);
  }
  if (!rbac_file.empty()) {
    std::ifstream in(rbac_file);
    std::stringstream buf;
    buf << in.rdbuf();
    auto doc = kgpu::yaml::Load(buf.str(), rbac_file);
    if (!in || !doc.ok()) {
      std::cerr << "kgpu-fake-apiserver: --rbac " << rbac_file << ": "
                << (doc.ok() ? "cannot read the file" : std::string(doc.status().message())) << "\n";
      return 2;
    }
    for (const auto& u : (*doc)["users"]) {
      for (const auto& rule : u.second) {
        kgpu::testing::RbacRule r;
        for (const auto& v : rule["verbs"]) r.verbs.insert(v.as<std::string>());
        for (const auto& v : rule["resources"]) r.resources.insert(v.as<std::string>());
        opts.rbac[u.first.as<std::string>()].push_back(r);
      }
    }
  }
  kgpu::testing::FakeApiServer server(opts);
  for (const auto& p : preload) {
    if (auto s = server.Preload(p); !s.ok()) {
      std::cerr << "kgpu-fake-apiserver: --preload: " << s.message() << "\n";
      return 2;
    }
  }
  if (auto s = server.Start(); !s.ok()) {
    std::cerr << "kgpu-fake-apiserver: " << s.message() << "\n";
    return 1;
  }
  if (!kubeconfig_out.empty()) {
    std::ofstream out(kubeconfig_out);
    out << server.Kubeconfig(first_token);
  }
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << server.port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::printf("kgpu-fake-apiserver: serving %s\n", server.url().c_str());
  std::fflush(stdout);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.Stop();
  return 0;
}
