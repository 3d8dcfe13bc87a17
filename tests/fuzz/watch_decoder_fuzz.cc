// Fuzz target for the watch-stream decoder (src/k8s/watch_decoder.cc). Properties: it never
// crashes; feeding the input in two pieces split anywhere gives the same events and the same
// verdict as feeding it whole; every event has a type and an object.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "k8s/watch_decoder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  kgpu::k8s::WatchDecoder whole(1 << 20);
  std::vector<kgpu::k8s::WatchEvent> a;
  const bool ok_whole = whole.Feed(in, a).ok();
  const size_t cut = size == 0 ? 0 : data[0] % (size + 1);
  kgpu::k8s::WatchDecoder split(1 << 20);
  std::vector<kgpu::k8s::WatchEvent> b;
  bool ok_split = split.Feed(std::string_view(in).substr(0, cut), b).ok();
  if (ok_split) ok_split = split.Feed(std::string_view(in).substr(cut), b).ok();
  if (ok_whole != ok_split || a.size() != b.size()) std::abort();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].type != b[i].type || a[i].object != b[i].object || !a[i].object.is_object()) std::abort();
  }
  return 0;
}
