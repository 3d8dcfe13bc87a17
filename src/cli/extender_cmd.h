#pragma once
// `kgpu extender`: flags and the run loop of the kube-scheduler extender (src/extender/server.h).
//
// Thread-safety: RunExtender is called once from main.

#include <csignal>
#include <ostream>
#include <string>

#include <CLI/CLI.hpp>

#include "extender/server.h"

namespace kgpu::cli {

struct ExtenderFlags {
  std::string kubeconfig, context;
  // kube-scheduler's clientConnection defaults. A bind costs one request (a GET more only when
  // the informer has not seen the pod yet), so this caps binds at ~50/s: raise it with
  // kube-scheduler's own for more throughput.
  double qps = 50;
  int burst = 100;
  double lease_duration_s = 15, renew_deadline_s = 10, retry_period_s = 2;
  double preemption_hold_s = 60;
  extender::ExtenderOptions options;
};
void AddExtenderFlags(CLI::App* app, ExtenderFlags* flags);
// Serves until *stop is set. Returns the exit code (1 when it cannot start, 2 for bad flags).
int RunExtender(const ExtenderFlags& flags, const volatile std::sig_atomic_t* stop, std::ostream& err);

}  // namespace kgpu::cli
