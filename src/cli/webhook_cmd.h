#pragma once
// `kgpu webhook`: flags and the run loop of the admission webhook (src/extender/webhook.h).
//
// Thread-safety: RunWebhook is called once from main.

#include <csignal>
#include <ostream>

#include <CLI/CLI.hpp>

#include "extender/webhook.h"

namespace kgpu::cli {

void AddWebhookFlags(CLI::App* app, extender::WebhookOptions* options);
// Serves until *stop is set. Returns the exit code (1 when it cannot listen, 2 for bad flags).
int RunWebhook(const extender::WebhookOptions& options, const volatile std::sig_atomic_t* stop, std::ostream& err);

}  // namespace kgpu::cli
