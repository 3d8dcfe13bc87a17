#include "deviceplugin/interposer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/files.h"
#include "common/strings.h"
#include "deviceplugin/share_cdi.h"

namespace kgpu::deviceplugin {

namespace {

// <shared_root>/ld.so.preload naming the library at its path inside the container.
absl::StatusOr<std::string> PreloadFile(const std::string& shared_root) {
  const std::string file = Cat(shared_root, "/ld.so.preload");
  const std::string want = Cat(kInterposerInContainer, "\n");
  {
    std::ifstream in(file);
    std::stringstream have;
    have << in.rdbuf();
    if (in && have.str() == want) return file;
  }
  if (auto st = WriteFileAtomically(file, want, 0644); !st.ok()) {
    return absl::UnavailableError(Cat(st.message(), " (check --cuda-shared-root)"));
  }
  return file;
}

}  // namespace

absl::StatusOr<InterposerEdits> InterposerEditsFor(const std::string& interposer, const std::string& load,
                                                   const std::string& shared_root, const std::string& region) {
  std::error_code mk;
  std::filesystem::create_directories(region, mk);
  if (!mk) std::filesystem::permissions(region, std::filesystem::perms::all, mk);
  if (mk) {
    return absl::UnavailableError(Cat("cannot create the accounting directory ", region, ": ", mk.message(),
                                      " (check --cuda-shared-root)"));
  }
  InterposerEdits e;
  e.mounts.push_back({kInterposerInContainer, interposer, true});
  if (load == kInterposerLoadFile) {
    auto file = PreloadFile(shared_root);
    if (!file.ok()) return file.status();
    e.mounts.push_back({"/etc/ld.so.preload", *file, true});
  } else {
    e.envs.emplace_back("LD_PRELOAD", kInterposerInContainer);
  }
  e.envs.emplace_back("KGPU_CUDA_SHARED_DIR", kRegionInContainer);
  e.mounts.push_back({kRegionInContainer, region, false});
  return e;
}

}  // namespace kgpu::deviceplugin
