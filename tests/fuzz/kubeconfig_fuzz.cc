// Fuzz target for the kubeconfig parser (src/k8s/config.cc). Properties: it never crashes,
// every error names the input, and an accepted config has an http(s) server without a
// trailing slash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "k8s/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // No base directory: relative file references cannot reach into the fuzzer's cwd.
  auto c = kgpu::k8s::ParseKubeconfig(text, "fuzz.kubeconfig", "", "/nonexistent-kgpu-fuzz");
  if (!c.ok()) {
    if (std::string(c.status().message()).rfind("fuzz.kubeconfig", 0) != 0) std::abort();
    return 0;
  }
  if (c->server.rfind("http://", 0) != 0 && c->server.rfind("https://", 0) != 0) std::abort();
  if (!c->server.empty() && c->server.back() == '/') std::abort();
  return 0;
}
