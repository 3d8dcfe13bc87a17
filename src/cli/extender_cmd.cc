#include "cli/extender_cmd.h"

#include <iostream>
#include <thread>
#include <utility>

#include "common/duration.h"
#include "common/listen_address.h"
#include "common/log.h"
#include "common/strings.h"
#include "k8s/config.h"
#include "sched/policy.h"

namespace kgpu::cli {

using std::chrono::hours, std::chrono::milliseconds, std::chrono::seconds;

void AddExtenderFlags(CLI::App* app, ExtenderFlags* f) {
  const std::string cmd = "kgpu extender";
  // No envname("KUBECONFIG"): that would make KUBECONFIG=a:b one --kubeconfig path. The resolver
  // reads KUBECONFIG itself, as kubectl does (its files merged).
  app->add_option("--kubeconfig", f->kubeconfig, k8s::kKubeconfigFlagHelp);
  app->add_option("--context", f->context, "kubeconfig context");
  app->add_option("--address", f->options.address, "listen on host:port")
      ->envname("KGPU_EXTENDER_ADDRESS")
      ->capture_default_str();
  app->add_option("--tls-cert-file", f->options.tls_cert_file, "serve HTTPS with this certificate (PEM)");
  app->add_option("--tls-key-file", f->options.tls_key_file, "and this key (PEM)");
  app->add_option(
      "--client-ca-file", f->options.client_ca_file,
      "answer filter, prioritize, preempt and bind only for clients presenting a certificate this CA "
      "signed (PEM; kube-scheduler's extender tlsConfig certFile/keyFile); the three TLS flags are required "
      "unless --insecure-http");
  app->add_flag("--insecure-http", f->options.insecure_http,
                "serve plain HTTP and answer every caller, who can then bind any pending pod (tests only)");
  app->add_option("--policy", f->options.state.policy,
                  "placement policy: random, bestfit, packing, spread, ours (fgd needs a workload file: use kgpu sim)")
      ->envname("KGPU_EXTENDER_POLICY")
      ->capture_default_str();
  app->add_option("--untracked-memory-tolerance-mib", f->options.state.untracked_tolerance_mib,
                  "a GPU whose node reports this much more memory in use than its allocation records book has another "
                  "user: that memory is not placed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_flag("--preemption,!--no-preemption", f->options.preemption,
                "preempt lower-priority GPU pods for pods short of what only the extender counts (share memory and "
                "cores), which kube-scheduler's own preemption cannot see; victims leave through the Eviction API, "
                "PodDisruptionBudgets honoured (default: on)");
  AddDurationOption(app, "--preemption-hold", &f->options.state.preemption_hold,
                    "how long the node of such a preemption is held for the preemptor against GPU pods of lower or "
                    "equal priority (until it is bound)",
                    {.bare_unit = "s", .min = seconds(1), .max = hours(1)});
  app->add_option("--kube-api-qps", f->qps, "API requests per second (kube-scheduler's default)")
      ->capture_default_str();
  app->add_option("--kube-api-burst", f->burst, "API request burst")->capture_default_str();
  app->add_option("--threads", f->options.threads, "HTTP worker threads")->capture_default_str();
  AddLeaderElectFlags(app, &f->leader,
                      "every synced replica answers filter and prioritize; only the Lease holder binds and preempts, "
                      "and the others pass binds on to it");
  app->add_option("--identity", f->options.identity, "this replica's identity in the Lease (default: host name)")
      ->envname("POD_NAME");
  app->add_option("--advertise-address", f->options.advertise_address,
                  "host:port where the other replicas reach this one to pass binds on (in a pod: $(POD_IP):8888; "
                  "default: --address when it names one address)");
  app->add_option("--peer-cert-file", f->options.peer_cert_file,
                  "with --leader-elect: the client certificate (PEM, signed by the --client-ca-file CA) a standby "
                  "presents when it passes a bind on to the leader, which must present --tls-cert-file");
  app->add_option("--peer-key-file", f->options.peer_key_file, "and its key (PEM)");
  // The extender's own spellings before kube-scheduler's (one release).
  AddDeprecatedOption(app, cmd, "--lease-namespace", "--leader-elect-resource-namespace",
                      [f](const std::string& v) { f->leader.resource_namespace = v; });
  AddDeprecatedOption(app, cmd, "--lease-name", "--leader-elect-resource-name",
                      [f](const std::string& v) { f->leader.resource_name = v; });
}

int RunExtender(const ExtenderFlags& flags, const volatile std::sig_atomic_t* stop, std::ostream& err) {
  // Flags first: a usage error is reported before the kubeconfig is read.
  if (auto st = CheckLeaderElectFlags(flags.leader); !st.ok()) {
    err << "kgpu extender: " << st.message() << "\n";
    return 2;
  }
  if (auto a = ParseListenAddress("--address", flags.options.address); !a.ok()) {
    err << "kgpu extender: " << a.status().message() << "\n";
    return 2;
  }
  auto cfg = k8s::ConfigFromFlags(flags.kubeconfig, flags.context, false);
  if (!cfg.ok()) {
    err << "kgpu extender: " << cfg.status().message() << "\n";
    return 1;  // a configuration error (README's exit codes), not a usage error
  }
  extender::ExtenderOptions options = flags.options;
  options.leader_elect = flags.leader.enabled;
  options.lease_namespace = flags.leader.resource_namespace;
  options.lease_name = flags.leader.resource_name;
  options.lease_duration = flags.leader.lease_duration;
  options.renew_deadline = flags.leader.renew_deadline;
  options.retry_period = flags.leader.retry_period;
  cfg->qps = flags.qps;
  cfg->burst = flags.burst;
  auto client = k8s::Client::Create(*cfg);
  if (!client.ok()) {
    err << "kgpu extender: " << client.status().message() << "\n";
    return 1;
  }
  extender::Extender ext(**client, options);
  if (auto st = ext.Start(); !st.ok()) {
    err << "kgpu extender: " << st.message() << "\n";
    ext.Stop();
    return absl::IsInvalidArgument(st) ? 2 : 1;
  }
  Log("extender")->info("listening on port {}", ext.port());
  while (stop == nullptr || *stop == 0) std::this_thread::sleep_for(milliseconds(100));
  ext.Stop();
  return 0;
}

}  // namespace kgpu::cli
