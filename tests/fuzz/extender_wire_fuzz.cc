// Fuzz target for the extender's decoding (src/extender/wire.cc, request.cc, record.cc,
// inventory.cc): every envelope kube-scheduler sends, the pod's GPU request, allocation records and
// the inventory annotation. Properties: it never crashes; every error names the type it decoded;
// an accepted ExtenderArgs re-encodes to the same node names; an accepted record round-trips;
// simdjson's decoding (common/fast_json) agrees with nlohmann's wherever it accepts a text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "api/record.h"
#include "common/fast_json.h"
#include "extender/inventory.h"
#include "extender/request.h"
#include "extender/wire.h"

namespace {
void Expect(bool ok) {
  if (!ok) std::abort();
}
bool StartsWith(const absl::Status& s, const char* prefix) {
  return std::string(s.message()).rfind(prefix, 0) == 0;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kgpu::extender;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (auto fast = kgpu::ParseJsonFast(text)) {
    const auto slow = nlohmann::json::parse(text, nullptr, false);
    Expect(!slow.is_discarded() && slow == fast->doc);
  }
  if (auto pairs = kgpu::ParseStringIntArrayFast(text, "Host", "Score")) {
    const auto slow = nlohmann::json::parse(text, nullptr, false);
    Expect(slow.is_array() && slow.size() == pairs->size());
    for (size_t i = 0; i < pairs->size(); ++i) {
      const nlohmann::json* host = Field(slow[i], "Host");
      const nlohmann::json* score = Field(slow[i], "Score");
      Expect(host != nullptr && host->is_string() && *host == (*pairs)[i].first);
      Expect(score != nullptr && score->is_number_integer() && *score == (*pairs)[i].second);
    }
    auto list = ParseHostPriorityList(text);
    Expect(list.ok() && list->size() == pairs->size());
  }
  auto args = ParseExtenderArgs(text);
  if (args.ok()) {
    (void)ParsePodRequest(args->pod);
    if (args->node_names) {
      auto again = ParseExtenderArgs(EncodeExtenderArgs(args->pod, *args->node_names));
      Expect(again.ok() && again->node_names && *again->node_names == *args->node_names);
    }
  } else {
    Expect(StartsWith(args.status(), "ExtenderArgs"));
  }
  auto bind = ParseBindingArgs(text);
  if (!bind.ok()) Expect(StartsWith(bind.status(), "ExtenderBindingArgs"));
  auto pre = ParsePreemptionArgs(text);
  if (pre.ok()) {
    (void)EncodePreemptionResult(pre->victims);
  } else {
    Expect(StartsWith(pre.status(), "ExtenderPreemptionArgs"));
  }
  auto fr = ParseFilterResult(text);
  if (fr.ok()) (void)EncodeFilterResult(*fr);
  (void)ParseHostPriorityList(text);
  auto rec = kgpu::api::ParseRecord(text);
  if (rec.ok()) {
    auto back = kgpu::api::ParseRecord(kgpu::api::EncodeRecord(*rec));
    Expect(back.ok() && *back == *rec);
  } else {
    Expect(StartsWith(rec.status(), "kgpu.io/allocation"));
  }
  auto inv = ParseInventoryAnnotation("fuzz", text);
  if (inv.ok()) (void)ToNodeSpec(*inv);
  return 0;
}
