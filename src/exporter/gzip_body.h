#pragma once
// A gzip body whose long prefix is compressed once and whose short tail is compressed per use:
// /metrics is the latest collection (the same bytes until the next one) followed by the
// exporter's own counters (new on every scrape). Compressing the whole body per scrape cost a
// full deflate of every series for every scraper; this deflates the collection once, keeps the
// compressor's state at a byte boundary (Z_SYNC_FLUSH), and per scrape copies that state
// (deflateCopy), deflates only the tail and writes the gzip trailer (CRC-32 combined, length).
// The result is one ordinary gzip member (RFC 1952), readable by every client.
//
// Thread-safety: With() may be called from several threads at once.

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <zlib.h>

namespace kgpu::exporter {

class GzipBody {
 public:
  // nullptr when zlib fails (out of memory): serve the body uncompressed then.
  static std::shared_ptr<const GzipBody> Make(std::string_view prefix);
  ~GzipBody();
  GzipBody(const GzipBody&) = delete;
  GzipBody& operator=(const GzipBody&) = delete;

  // gzip(prefix + tail), one member; nullopt when zlib fails.
  std::optional<std::string> With(std::string_view tail) const;

 private:
  GzipBody() = default;
  mutable std::mutex mu_;  // deflateCopy reads the stream; keep it to one reader at a time
  mutable z_stream zs_{};
  bool live_ = false;
  std::string head_;  // gzip header + the deflated prefix, up to the sync point
  uint32_t crc_ = 0;
  uint64_t size_ = 0;
};

}  // namespace kgpu::exporter
