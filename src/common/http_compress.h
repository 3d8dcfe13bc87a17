#pragma once
// Who decides whether an httplib response is gzipped. httplib (0.11, Debian 12) compresses a text
// or JSON body whenever the request's Accept-Encoding names gzip, when it writes the response after
// the handler ran, whatever the size and whether it pays. Go's HTTP transport (kube-scheduler,
// client-go, Prometheus) always asks for gzip, so every answer would be compressed. A handler that
// decides otherwise takes the header out of the request (httplib's own non-const object, handed to
// handlers by const reference), which is what these do.
//
// Thread-safety: per request.

#include <cstddef>

namespace kgpu {

// kube-apiserver's rule (apiserver/pkg/endpoints/handlers/responsewriters, defaultGzipThresholdBytes).
inline constexpr size_t kApiserverGzipThresholdBytes = 128 * 1024;

// The response goes out as it is (identity), whatever the client accepts.
template <typename Request>
void AnswerUncompressed(const Request& req) {
  const_cast<Request&>(req).headers.erase("Accept-Encoding");
}

// Gzip only a body of at least `threshold` bytes (for a client that accepts gzip), and never a
// streamed one (a watch, whose events must reach the client as they happen).
template <typename Request, typename Response>
void GzipOnlyFrom(const Request& req, const Response& res, size_t threshold) {
  if (res.is_chunked_content_provider_ || res.content_provider_ || res.body.size() < threshold) {
    AnswerUncompressed(req);
  }
}

}  // namespace kgpu
