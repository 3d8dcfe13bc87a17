#pragma once
// `kgpu extender`: flags and the run loop of the kube-scheduler extender (src/extender/server.h).
//
// Thread-safety: RunExtender is called once from main.

#include <CLI/CLI.hpp>

#include <csignal>
#include <ostream>
#include <string>

#include "extender/server.h"

namespace kgpu::cli {

struct ExtenderFlags {
  std::string kubeconfig, context;
  double qps = 50;  // a bind costs 2-3 requests: client-go's 5/10 would cap binds at ~2/s
  int burst = 100;
  extender::ExtenderOptions options;
};
void AddExtenderFlags(CLI::App* app, ExtenderFlags* flags);
// Serves until *stop is set. Returns the exit code (1 when it cannot start, 2 for bad flags).
int RunExtender(const ExtenderFlags& flags, const volatile std::sig_atomic_t* stop, std::ostream& err);

}  // namespace kgpu::cli
