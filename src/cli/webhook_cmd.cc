#include "cli/webhook_cmd.h"

#include <chrono>
#include <thread>

#include "common/log.h"

namespace kgpu::cli {

void AddWebhookFlags(CLI::App* app, extender::WebhookOptions* o) {
  app->add_option("--address", o->address, "listen on host:port")
      ->envname("KGPU_WEBHOOK_ADDRESS")
      ->capture_default_str();
  app->add_option("--tls-cert-file", o->tls_cert_file, "serve HTTPS with this certificate (PEM)");
  app->add_option("--tls-key-file", o->tls_key_file, "and this key (PEM)");
  app->add_flag("--insecure-http", o->insecure_http, "serve plain HTTP without a certificate (tests only)");
  app->add_option("--threads", o->threads, "HTTP worker threads")->capture_default_str();
  app->add_option("--scheduler-name", o->scheduler_name,
                  "set spec.schedulerName of GPU pods that use default-scheduler (empty: leave it)")
      ->envname("KGPU_WEBHOOK_SCHEDULER_NAME");
  app->add_option("--replace-scheduler-names", o->replace_scheduler_names,
                  "GPU pods that name one of these schedulers (HAMi's) get --scheduler-name, or default-scheduler "
                  "when that is empty, with a warning to the client (\"\": keep every name)")
      ->envname("KGPU_WEBHOOK_REPLACE_SCHEDULER_NAMES")
      ->delimiter(',')
      ->capture_default_str();
  app->add_flag("--translate-hami", o->translate_hami,
                "treat nvidia.com/gpu as HAMi's vGPU count even without nvidia.com/gpumem or gpucores");
  app->add_option("--smallest-gpu-memory-mib", o->smallest_gpu_memory_mib,
                  "memory of the smallest GPU a share may land on: default kgpu.io/gpu-cores and "
                  "nvidia.com/gpumem-percentage are computed from it (0: unknown)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--largest-gpu-memory-mib", o->largest_gpu_memory_mib,
                  "memory of the largest GPU in the cluster: larger shares are refused (0: unknown)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--kubeconfig", o->kubeconfig,
                  "read the GPU sizes not given above from the nodes' kgpu.io/gpu-inventory (list+watch nodes)");
  app->add_option("--context", o->context, "kubeconfig context");
  app->add_flag("--in-cluster", o->in_cluster, "the same through the pod's service account");
}

int RunWebhook(const extender::WebhookOptions& options, const volatile std::sig_atomic_t* stop, std::ostream& err) {
  extender::Webhook hook(options);
  if (auto st = hook.Start(); !st.ok()) {
    err << "kgpu webhook: " << st.message() << "\n";
    hook.Stop();
    return absl::IsInvalidArgument(st) ? 2 : 1;
  }
  Log("webhook")->info("listening on port {}", hook.port());
  while (stop == nullptr || *stop == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  hook.Stop();
  return 0;
}

}  // namespace kgpu::cli
