// Fuzz target for the admission webhook's decoding (src/extender/webhook.cc): any body posted to
// /mutate or /validate. Properties: it never crashes; an error names the AdmissionReview; an
// accepted review echoes the uid; an allowed mutation's patch is base64 of a JSONPatch that applies
// to the pod, and applying it again to the mutated pod yields no further patch (idempotent).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "extender/webhook.h"

namespace {
void Expect(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kgpu::extender;
  using json = nlohmann::json;
  const std::string text(reinterpret_cast<const char*>(data), size);
  WebhookOptions o;
  o.smallest_gpu_memory_mib = 16384;
  o.largest_gpu_memory_mib = 81920;
  o.scheduler_name = "kgpu-scheduler";
  for (const bool mutate : {true, false}) {
    auto out = Review(text, mutate, o);
    if (!out.ok()) {
      const std::string m(out.status().message());
      Expect(m.find("AdmissionReview") != std::string::npos);
      continue;
    }
    const json& r = (*out)["response"];
    const json review = json::parse(text);
    Expect(r["uid"] == review["request"]["uid"]);
    if (!mutate || !r.contains("patch")) continue;
    std::string patch;
    Expect(absl::Base64Unescape(r["patch"].get<std::string>(), &patch));
    const json& pod = review["request"]["object"];
    json mutated;
    try {
      mutated = pod.patch(json::parse(patch));
    } catch (const json::exception&) {
      std::abort();  // a patch the API server could not apply
    }
    const Decision again = MutatePod(mutated, o);
    Expect(again.allowed && again.patch.empty());
  }
  return 0;
}
