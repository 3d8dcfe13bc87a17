#include "cli/extender_cmd.h"

#include <chrono>
#include <thread>

#include "common/log.h"
#include "k8s/config.h"
#include "sched/policy.h"

namespace kgpu::cli {

void AddExtenderFlags(CLI::App* app, ExtenderFlags* f) {
  // No envname("KUBECONFIG"): that would make KUBECONFIG=a:b one --kubeconfig path. The resolver
  // reads KUBECONFIG itself, as kubectl does (its files merged).
  app->add_option("--kubeconfig", f->kubeconfig, k8s::kKubeconfigFlagHelp);
  app->add_option("--context", f->context, "kubeconfig context");
  app->add_option("--address", f->options.address, "listen on host:port")
      ->envname("KGPU_EXTENDER_ADDRESS")
      ->capture_default_str();
  app->add_option("--tls-cert-file", f->options.tls_cert_file, "serve HTTPS with this certificate (PEM)");
  app->add_option("--tls-key-file", f->options.tls_key_file, "and this key (PEM)");
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
  app->add_option("--preemption-hold", f->preemption_hold_s,
                  "seconds the node of such a preemption is held for the preemptor against GPU pods of lower or equal "
                  "priority (until it is bound)")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app->add_option("--kube-api-qps", f->qps, "API requests per second (kube-scheduler's default)")
      ->capture_default_str();
  app->add_option("--kube-api-burst", f->burst, "API request burst")->capture_default_str();
  app->add_option("--threads", f->options.threads, "HTTP worker threads")->capture_default_str();
  app->add_flag("--leader-elect", f->options.leader_elect,
                "run as one of several replicas: only the Lease holder serves");
  app->add_option("--lease-namespace", f->options.lease_namespace, "namespace of the leader Lease")
      ->capture_default_str();
  app->add_option("--lease-name", f->options.lease_name, "name of the leader Lease")->capture_default_str();
  app->add_option("--identity", f->options.identity, "this replica's identity in the Lease (default: host name)")
      ->envname("POD_NAME");
  // kube-scheduler's flag names and defaults (15 s, 10 s, 2 s), in seconds.
  app->add_option("--leader-elect-lease-duration", f->lease_duration_s,
                  "seconds a non-leader waits after the last renewal before it takes the Lease")
      ->check(CLI::Range(0.01, 86400.0))
      ->capture_default_str();
  app->add_option("--leader-elect-renew-deadline", f->renew_deadline_s,
                  "seconds the leader keeps trying to renew before it stops leading (< lease duration)")
      ->check(CLI::Range(0.01, 86400.0))
      ->capture_default_str();
  app->add_option("--leader-elect-retry-period", f->retry_period_s, "seconds between attempts to acquire or renew")
      ->check(CLI::Range(0.01, 86400.0))
      ->capture_default_str();
}

int RunExtender(const ExtenderFlags& flags, const volatile std::sig_atomic_t* stop, std::ostream& err) {
  // Flags first: a usage error is reported before the kubeconfig is read.
  if (flags.renew_deadline_s >= flags.lease_duration_s || flags.retry_period_s >= flags.renew_deadline_s) {
    err << "kgpu extender: --leader-elect-retry-period (" << flags.retry_period_s
        << " s) < --leader-elect-renew-deadline (" << flags.renew_deadline_s << " s) < --leader-elect-lease-duration ("
        << flags.lease_duration_s << " s) is required, as in kube-scheduler\n";
    return 2;
  }
  auto cfg = k8s::ConfigFromFlags(flags.kubeconfig, flags.context, false);
  if (!cfg.ok()) {
    err << "kgpu extender: " << cfg.status().message() << "\n";
    return 1;  // a configuration error (README's exit codes), not a usage error
  }
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  extender::ExtenderOptions options = flags.options;
  options.lease_duration = ms(flags.lease_duration_s);
  options.renew_deadline = ms(flags.renew_deadline_s);
  options.retry_period = ms(flags.retry_period_s);
  options.state.preemption_hold = ms(flags.preemption_hold_s);
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
  while (stop == nullptr || *stop == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ext.Stop();
  return 0;
}

}  // namespace kgpu::cli
