#pragma once
// `kgpu extender`: flags and the run loop of the kube-scheduler extender (src/extender/server.h).
//
// Thread-safety: RunExtender is called once from main.

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "extender/server.h"

namespace kgpu::cli {

struct ExtenderFlags {
  std::string kubeconfig, context;
  // kube-scheduler's clientConnection defaults. A bind costs one request (a GET more only when
  // the informer has not seen the pod yet), so this caps binds at ~50/s: raise it with
  // kube-scheduler's own for more throughput.
  double qps = 50;
  int burst = 100;
  LeaderElectFlags leader{.enabled = false, .resource_name = "kgpu-extender"};
  extender::ExtenderOptions options;  // --preemption-hold goes to options.state.preemption_hold
};
void AddExtenderFlags(CLI::App* app, ExtenderFlags* flags);
// Serves until *stop is set. Returns the exit code (1 when it cannot start, 2 for bad flags).
int RunExtender(const ExtenderFlags& flags, const volatile std::sig_atomic_t* stop, std::ostream& err);

}  // namespace kgpu::cli
