#include "exporter/gzip_body.h"

namespace kgpu::exporter {
namespace {

constexpr int kLevel = 6;     // zlib's default: the prefix is deflated once, so ratio over speed
constexpr int kMemLevel = 8;  // zlib's default

// Runs deflate with `flush` until it has consumed its input and (for Z_FINISH) ended the stream.
bool Pump(z_stream* zs, std::string_view in, int flush, std::string* out) {
  zs->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs->avail_in = static_cast<uInt>(in.size());
  char buf[16384];
  for (;;) {
    zs->next_out = reinterpret_cast<Bytef*>(buf);
    zs->avail_out = sizeof buf;
    const int rc = deflate(zs, flush);
    if (rc == Z_STREAM_ERROR) return false;
    out->append(buf, sizeof buf - zs->avail_out);
    if (flush == Z_FINISH) {
      if (rc == Z_STREAM_END) return true;
    } else if (zs->avail_in == 0 && zs->avail_out != 0) {
      return true;  // all input consumed and all output flushed
    }
  }
}

void AppendLe32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

std::shared_ptr<const GzipBody> GzipBody::Make(std::string_view prefix) {
  std::shared_ptr<GzipBody> g(new GzipBody());
  // Raw deflate (negative window bits): the gzip header and trailer are written here, so that
  // the trailer can cover a tail deflated later from a copy of this state.
  if (deflateInit2(&g->zs_, kLevel, Z_DEFLATED, -MAX_WBITS, kMemLevel, Z_DEFAULT_STRATEGY) != Z_OK) return nullptr;
  g->live_ = true;
  // ID1 ID2 CM=deflate FLG=0 MTIME=0 XFL=0 OS=3 (Unix).
  g->head_.assign("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10);
  if (!Pump(&g->zs_, prefix, Z_SYNC_FLUSH, &g->head_)) return nullptr;
  g->crc_ = static_cast<uint32_t>(
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(prefix.data()), static_cast<uInt>(prefix.size())));
  g->size_ = prefix.size();
  return g;
}

GzipBody::~GzipBody() {
  if (live_) deflateEnd(&zs_);
}

std::optional<std::string> GzipBody::With(std::string_view tail) const {
  z_stream copy{};
  {
    std::lock_guard lock(mu_);
    if (deflateCopy(&copy, &zs_) != Z_OK) return std::nullopt;
  }
  std::string out;
  out.reserve(head_.size() + tail.size() / 2 + 64);
  out += head_;
  const bool ok = Pump(&copy, tail, Z_FINISH, &out);
  deflateEnd(&copy);
  if (!ok) return std::nullopt;
  const uLong tail_crc =
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(tail.data()), static_cast<uInt>(tail.size()));
  AppendLe32(&out, static_cast<uint32_t>(crc32_combine(crc_, tail_crc, static_cast<z_off_t>(tail.size()))));
  AppendLe32(&out, static_cast<uint32_t>((size_ + tail.size()) & 0xffffffffU));  // ISIZE: the length mod 2^32
  return out;
}

}  // namespace kgpu::exporter
