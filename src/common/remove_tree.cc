#include "common/remove_tree.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "common/strings.h"

namespace kgpu {

namespace {

absl::Status ErrnoStatus(int e, const std::string& what) {
  return absl::Status(absl::ErrnoToStatusCode(e), Cat(what, ": ", std::strerror(e)));
}

absl::Status RemoveUnder(int parent, const char* name, int depth) {
  if (depth > 16) return absl::FailedPreconditionError(Cat(name, ": nested too deep"));
  const int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOTDIR || errno == ELOOP) {  // a file or a link: the entry itself goes
      return ::unlinkat(parent, name, 0) == 0 || errno == ENOENT ? absl::OkStatus()
                                                                 : ErrnoStatus(errno, Cat("unlink ", name));
    }
    return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, Cat("open ", name));
  }
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return ErrnoStatus(errno, Cat("read ", name));
  }
  absl::Status st;
  while (dirent* e = ::readdir(d)) {
    const std::string_view entry = e->d_name;
    if (entry == "." || entry == "..") continue;
    if (auto sub = RemoveUnder(::dirfd(d), e->d_name, depth + 1); !sub.ok() && st.ok()) st = sub;
  }
  ::closedir(d);
  if (!st.ok()) return st;
  return ::unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno == ENOENT ? absl::OkStatus()
                                                                        : ErrnoStatus(errno, Cat("rmdir ", name));
}

}  // namespace

absl::Status RemoveTreeNoFollow(const std::string& dir) {
  const std::string parent = std::filesystem::path(dir).parent_path().string();
  const std::string leaf = std::filesystem::path(dir).filename().string();
  const int pfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0) return ErrnoStatus(errno, Cat("open ", parent));
  absl::Status st = RemoveUnder(pfd, leaf.c_str(), 0);
  ::close(pfd);
  return st;
}

}  // namespace kgpu
