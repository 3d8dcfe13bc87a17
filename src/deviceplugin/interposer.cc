#include "deviceplugin/interposer.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/share_cdi.h"
#include "common/files.h"
#include "common/log.h"
#include "common/remove_tree.h"
#include "common/strings.h"
#include "kubelet/checkpoint.h"

namespace kgpu::deviceplugin {

namespace {

// <shared_root>/ld.so.preload naming the library at its path inside the container.
absl::StatusOr<std::string> PreloadFile(const std::string& shared_root) {
  const std::string file = Cat(shared_root, "/ld.so.preload");
  const std::string want = Cat(api::kInterposerInContainer, "\n");
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

std::string InterposerConfig(const std::vector<InterposerLimit>& limits) {
  std::string text =
      "# The container's limits, for libkgpu-cuda.so (written by kgpu device-plugin; docs/isolation.md)\n";
  for (const auto& l : limits) {
    if (l.memory_mib > 0) text += Cat("memory ", l.uuid, " ", l.memory_mib << 20, "\n");
    if (l.cores > 0 && l.cores < 100) text += Cat("cores ", l.uuid, " ", l.cores, "\n");
  }
  return text;
}

absl::StatusOr<InterposerEdits> InterposerEditsFor(const std::string& interposer, const std::string& load,
                                                   const std::string& shared_root, const std::string& region,
                                                   const std::vector<InterposerLimit>& limits) {
  std::error_code mk;
  std::filesystem::create_directories(region, mk);
  if (!mk) std::filesystem::permissions(region, std::filesystem::perms::all, mk);
  if (mk) {
    return absl::UnavailableError(
        Cat("cannot create the accounting directory ", region, ": ", mk.message(), " (check --cuda-shared-root)"));
  }
  const std::string config = Cat(region, "/config"), file = Cat(region, "/", api::kRegionFile);
  if (auto st = WriteFileAtomically(config, InterposerConfig(limits), 0444); !st.ok()) {
    return absl::UnavailableError(Cat(st.message(), " (check --cuda-shared-root)"));
  }
  // The region itself starts empty (the library sizes and initialises it under a lock); an
  // existing one (a restarted container) is kept with its processes' charges.
  if (const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666); fd >= 0) {
    ::fchmod(fd, 0666);
    ::close(fd);
  } else {
    return absl::UnavailableError(
        Cat("cannot create the accounting region ", file, ": ", std::strerror(errno), " (check --cuda-shared-root)"));
  }
  InterposerEdits e;
  e.mounts.push_back({api::kInterposerInContainer, interposer, true});
  if (load == kInterposerLoadFile) {
    auto preload = PreloadFile(shared_root);
    if (!preload.ok()) return preload.status();
    e.mounts.push_back({"/etc/ld.so.preload", *preload, true});
  } else {
    e.envs.emplace_back("LD_PRELOAD", api::kInterposerInContainer);
  }
  e.envs.emplace_back("KGPU_CUDA_SHARED_DIR", api::kRegionInContainer);
  e.mounts.push_back({api::kRegionInContainer, region, true});
  e.mounts.push_back({Cat(api::kRegionInContainer, "/", api::kRegionFile), file, false});
  return e;
}

std::string TimeslicingRegion(const std::string& shared_root, const std::string& allocation_id) {
  return Cat(shared_root, "/timeslicing/", allocation_id);
}

absl::StatusOr<int> SweepTimeslicingRegions(const std::string& shared_root, const std::string& checkpoint_path,
                                            std::chrono::seconds grace) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(shared_root) / "timeslicing";
  // The directories before the checkpoint: one created after this listing is not judged.
  std::vector<std::pair<std::string, fs::file_time_type>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code tec;
    if (!it->is_directory(tec) || it->is_symlink(tec)) continue;
    const auto mtime = fs::last_write_time(it->path(), tec);
    if (!tec) found.emplace_back(it->path().filename().string(), mtime);
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::UnavailableError(Cat("cannot read ", dir.string(), ": ", ec.message(), " (check --cuda-shared-root)"));
  }
  if (found.empty()) return 0;
  auto text = ReadInputFile(checkpoint_path, "kubelet device-manager checkpoint", "check --kubelet-dir");
  if (!text.ok()) return text.status();
  auto mounted = kubelet::CheckpointedMountSources(*text, checkpoint_path);
  if (!mounted.ok()) return mounted.status();
  // Matched by the last two path elements (timeslicing/<allocation id>), so that a shared root
  // spelled differently when the container was admitted (a trailing slash, a link) still matches.
  std::set<std::string> held;
  for (const auto& m : *mounted) {
    const fs::path p = fs::path(m).lexically_normal();
    const fs::path leaf = p.has_filename() ? p : p.parent_path();
    if (leaf.parent_path().filename() == "timeslicing") held.insert(leaf.filename().string());
  }
  const auto now = fs::file_time_type::clock::now();
  int removed = 0;
  for (const auto& [id, mtime] : found) {
    if (held.contains(id) || now - mtime < grace) continue;
    const std::string path = (dir / id).string();
    if (auto st = RemoveTreeNoFollow(path); !st.ok()) {
      Log("deviceplugin")
          ->warn("cannot remove the accounting directory {} (no container mounts it): {}", path,
                 std::string(st.message()));
      continue;
    }
    Log("deviceplugin")->info("removed the accounting directory {}: no container kubelet keeps mounts it", path);
    ++removed;
  }
  return removed;
}

}  // namespace kgpu::deviceplugin
