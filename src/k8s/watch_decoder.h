#pragma once
// Incremental decoder for a watch stream: the API server writes one JSON object per event
// ({"type": "ADDED", "object": {...}}), normally newline-separated, in chunks that split
// objects anywhere. Feed() takes bytes as they arrive and returns the complete events; framing
// is by JSON structure (braces outside strings), so it does not depend on the newlines.
// An error is sticky: after a malformed event the stream cannot be trusted.
//
// Thread-safety: one decoder per stream; not thread-safe.

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace kgpu::k8s {

struct WatchEvent {
  std::string type;  // ADDED, MODIFIED, DELETED, BOOKMARK, ERROR
  nlohmann::json object;
};

class WatchDecoder {
 public:
  explicit WatchDecoder(size_t max_event_bytes = 64u << 20) : max_(max_event_bytes) {}
  // Appends bytes; complete events go to `out`. Returns the sticky error, if any.
  absl::Status Feed(std::string_view bytes, std::vector<WatchEvent>& out);
  // True when no partial event is buffered (a clean end of stream).
  bool AtBoundary() const { return depth_ == 0 && buf_.empty(); }
  size_t Buffered() const { return buf_.size(); }

 private:
  absl::Status Emit(std::vector<WatchEvent>& out);
  size_t max_;
  std::string buf_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  absl::Status error_;
};

}  // namespace kgpu::k8s
