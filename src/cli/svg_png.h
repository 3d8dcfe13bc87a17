#pragma once
// An SVG picture written as PNG, for `kgpu sim --plot FILE.png`: librsvg draws the SVG onto a cairo
// image surface, and cairo writes the PNG. Both come from librsvg-2.so.2 (Debian: librsvg2-2,
// which depends on libcairo2), loaded with dlopen on the first call (src/cli/lazy_lib.h): only this
// one option needs them, so neither is a dependency of the kgpu executable or its package (the
// package suggests librsvg2-2). Without the library the error names the package to install.
//
// Thread-safety: PngAvailable and WriteSvgAsPng may be called from any thread; librsvg and cairo
// draw into objects of the call's own.

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kgpu::cli {

// OK when librsvg (with cairo) can be loaded and has every function WriteSvgAsPng calls; else
// FailedPrecondition naming the library and the Debian package.
absl::Status PngAvailable();

// Draws `svg` (a complete document with width and height) at `scale` times its size and writes
// the PNG to `path` (through a temporary file in the same directory, renamed into place, so a
// failure never leaves half a picture). Errors name the path and say what to fix.
absl::Status WriteSvgAsPng(std::string_view svg, const std::string& path, double scale);

}  // namespace kgpu::cli
