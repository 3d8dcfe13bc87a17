#include "cli/extender_cmd.h"

#include <chrono>
#include <thread>

#include "common/log.h"
#include "k8s/config.h"
#include "sched/policy.h"

namespace kgpu::cli {

void AddExtenderFlags(CLI::App* app, ExtenderFlags* f) {
  app->add_option("--kubeconfig", f->kubeconfig, "kubeconfig (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
      ->envname("KUBECONFIG");
  app->add_option("--context", f->context, "kubeconfig context");
  app->add_option("--address", f->options.address, "listen on host:port")->envname("KGPU_EXTENDER_ADDRESS")->capture_default_str();
  app->add_option("--tls-cert-file", f->options.tls_cert_file, "serve HTTPS with this certificate (PEM)");
  app->add_option("--tls-key-file", f->options.tls_key_file, "and this key (PEM)");
  app->add_option("--policy", f->options.state.policy,
                  "placement policy: random, bestfit, packing, spread, ours (fgd needs a workload file: use kgpu sim)")
      ->envname("KGPU_EXTENDER_POLICY")
      ->capture_default_str();
  app->add_option("--kube-api-qps", f->qps, "API requests per second (kube-scheduler's default)")->capture_default_str();
  app->add_option("--kube-api-burst", f->burst, "API request burst")->capture_default_str();
  app->add_option("--threads", f->options.threads, "HTTP worker threads")->capture_default_str();
  app->add_flag("--leader-elect", f->options.leader_elect, "run as one of several replicas: only the Lease holder serves");
  app->add_option("--lease-namespace", f->options.lease_namespace, "namespace of the leader Lease")->capture_default_str();
  app->add_option("--lease-name", f->options.lease_name, "name of the leader Lease")->capture_default_str();
  app->add_option("--identity", f->options.identity, "this replica's identity in the Lease (default: host name)")
      ->envname("POD_NAME");
}

int RunExtender(const ExtenderFlags& flags, const volatile std::sig_atomic_t* stop, std::ostream& err) {
  auto cfg = k8s::DefaultConfig(flags.kubeconfig, flags.context);
  if (!cfg.ok()) {
    err << "kgpu extender: " << cfg.status().message() << "\n";
    return 2;
  }
  cfg->qps = flags.qps;
  cfg->burst = flags.burst;
  auto client = k8s::Client::Create(*cfg);
  if (!client.ok()) {
    err << "kgpu extender: " << client.status().message() << "\n";
    return 2;
  }
  extender::Extender ext(**client, flags.options);
  if (auto st = ext.Start(); !st.ok()) {
    err << "kgpu extender: " << st.message() << "\n";
    ext.Stop();
    return absl::IsInvalidArgument(st) ? 2 : 1;
  }
  Log("extender")->info("listening on port {}", ext.port());
  while (stop == nullptr || *stop == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ext.Stop();
  return 0;
}

}  // namespace kgpu::cli
