#include "cli/svg_png.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include <unistd.h>

#include "cli/lazy_lib.h"
#include "common/strings.h"

namespace kgpu::cli {

namespace {

// The C ABI of the few functions used, as librsvg's, GLib's and cairo's headers declare them
// (librsvg >= 2.52 for rsvg_handle_get_intrinsic_size_in_pixels; Debian 12 has 2.54). Handles
// are opaque; GError's layout is public (domain, code, message).
struct GError {
  uint32_t domain;
  int code;
  char* message;
};
struct RsvgRectangle {
  double x, y, width, height;
};
constexpr int kCairoFormatArgb32 = 0;  // cairo_format_t CAIRO_FORMAT_ARGB32
constexpr int kCairoStatusSuccess = 0;

struct Api {
  void* (*rsvg_handle_new_from_data)(const uint8_t*, size_t, GError**) = nullptr;
  int (*rsvg_handle_get_intrinsic_size_in_pixels)(void*, double*, double*) = nullptr;
  int (*rsvg_handle_render_document)(void*, void*, const RsvgRectangle*, GError**) = nullptr;
  void (*g_object_unref)(void*) = nullptr;
  void (*g_error_free)(GError*) = nullptr;
  void* (*cairo_image_surface_create)(int, int, int) = nullptr;
  int (*cairo_surface_status)(void*) = nullptr;
  void (*cairo_surface_destroy)(void*) = nullptr;
  void* (*cairo_create)(void*) = nullptr;
  int (*cairo_status)(void*) = nullptr;
  void (*cairo_scale)(void*, double, double) = nullptr;
  void (*cairo_destroy)(void*) = nullptr;
  int (*cairo_surface_write_to_png)(void*, const char*) = nullptr;
  const char* (*cairo_status_to_string)(int) = nullptr;
  std::string error;  // why the API is not usable ("" when it is)
};

const Api& Load() {
  static const Api api = [] {
    // librsvg's handle also finds its dependencies' symbols (GLib, GObject, cairo): dlsym on a
    // dlopen handle searches the library's whole dependency tree.
    static lazy::Lib lib("librsvg-2.so.2", "librsvg2-2");
    Api a;
    auto get = [&](auto*& fn, const char* name) {
      void* p = lib.Symbol(name);
      if (p == nullptr && a.error.empty()) {
        a.error = lib.Error().empty()
                      ? Cat("librsvg-2.so.2 has no ", name, " (PNG plots need librsvg >= 2.52 with cairo)")
                      : lib.Error();
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get(a.rsvg_handle_new_from_data, "rsvg_handle_new_from_data");
    get(a.rsvg_handle_get_intrinsic_size_in_pixels, "rsvg_handle_get_intrinsic_size_in_pixels");
    get(a.rsvg_handle_render_document, "rsvg_handle_render_document");
    get(a.g_object_unref, "g_object_unref");
    get(a.g_error_free, "g_error_free");
    get(a.cairo_image_surface_create, "cairo_image_surface_create");
    get(a.cairo_surface_status, "cairo_surface_status");
    get(a.cairo_surface_destroy, "cairo_surface_destroy");
    get(a.cairo_create, "cairo_create");
    get(a.cairo_status, "cairo_status");
    get(a.cairo_scale, "cairo_scale");
    get(a.cairo_destroy, "cairo_destroy");
    get(a.cairo_surface_write_to_png, "cairo_surface_write_to_png");
    get(a.cairo_status_to_string, "cairo_status_to_string");
    return a;
  }();
  return api;
}

// GError's message, freed.
std::string Take(const Api& api, GError* e) {
  if (e == nullptr) return "unknown error";
  std::string m = e->message != nullptr ? e->message : "unknown error";
  api.g_error_free(e);
  return m;
}

constexpr int kMaxPixels = 16384;  // per side: cairo's image surfaces stop at 32767

}  // namespace

absl::Status PngAvailable() {
  const Api& api = Load();
  if (!api.error.empty()) {
    return absl::FailedPreconditionError(Cat("PNG plots: ", api.error, "; or name a .svg file"));
  }
  return absl::OkStatus();
}

absl::Status WriteSvgAsPng(std::string_view svg, const std::string& path, double scale) {
  if (auto st = PngAvailable(); !st.ok()) return st;
  const Api& api = Load();
  if (!(scale > 0) || scale > 16)
    return absl::InvalidArgumentError(Cat("PNG scale ", std::to_string(scale), ": out of (0, 16]"));

  GError* gerr = nullptr;
  void* handle = api.rsvg_handle_new_from_data(reinterpret_cast<const uint8_t*>(svg.data()), svg.size(), &gerr);
  if (handle == nullptr) return absl::InvalidArgumentError(Cat("the SVG to draw is not valid: ", Take(api, gerr)));
  double w = 0, h = 0;
  if (api.rsvg_handle_get_intrinsic_size_in_pixels(handle, &w, &h) == 0 || !(w > 0) || !(h > 0)) {
    api.g_object_unref(handle);
    return absl::InvalidArgumentError("the SVG to draw has no width and height in absolute units");
  }
  if (w * scale > kMaxPixels || h * scale > kMaxPixels) {
    api.g_object_unref(handle);
    return absl::InvalidArgumentError(Cat("the PNG would be ", static_cast<int64_t>(std::ceil(w * scale)), "x",
                                          static_cast<int64_t>(std::ceil(h * scale)), " pixels (at most ", kMaxPixels,
                                          " a side)"));
  }
  const int pw = static_cast<int>(std::ceil(w * scale)), ph = static_cast<int>(std::ceil(h * scale));
  void* surface = api.cairo_image_surface_create(kCairoFormatArgb32, pw, ph);
  void* cr = api.cairo_create(surface);  // cairo returns error objects, never null
  std::string failure;
  if (int st = api.cairo_status(cr); st != kCairoStatusSuccess) {
    failure = Cat("cairo cannot draw a ", pw, "x", ph, " picture: ", api.cairo_status_to_string(st));
  } else {
    api.cairo_scale(cr, scale, scale);
    const RsvgRectangle viewport{0, 0, w, h};
    if (api.rsvg_handle_render_document(handle, cr, &viewport, &gerr) == 0) {
      failure = Cat("librsvg cannot draw the SVG: ", Take(api, gerr));
    }
  }
  api.cairo_destroy(cr);
  api.g_object_unref(handle);
  if (!failure.empty()) {
    api.cairo_surface_destroy(surface);
    return absl::InternalError(failure);
  }
  // Into a temporary file beside the target, then renamed: the old picture stays until the new
  // one is complete.
  const std::string tmp = Cat(path, ".tmp-", getpid());
  errno = 0;
  const int st = api.cairo_surface_write_to_png(surface, tmp.c_str());
  const int saved_errno = errno;
  api.cairo_surface_destroy(surface);
  if (st != kCairoStatusSuccess) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(Cat(Printable(path), ": cannot write the PNG (", api.cairo_status_to_string(st),
                                           saved_errno != 0 ? Cat(": ", std::strerror(saved_errno)) : "",
                                           "); check that its directory exists and is writable"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(
        Cat(Printable(path), ": cannot write the PNG (", std::strerror(e), "); check that it is a writable file path"));
  }
  return absl::OkStatus();
}

}  // namespace kgpu::cli

// ASan builds (make test): fontconfig, which librsvg's text layout (pango) loads, keeps its
// configuration and font caches for the life of the process and frees them only in FcFini(), which
// pango never calls (and calling it while pango holds fonts is unsafe). LeakSanitizer reports
// those caches at exit; they are fontconfig's, once per process, not ours.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __lsan_default_suppressions();
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libfontconfig.so\n";
}
#endif
