#pragma once
// Small file helpers.
//
// Thread-safety: reentrant.

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

#include <sys/stat.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/strings.h"

namespace kgpu {

// `abs_path` ("/dev/nvidia0", "/driver/nvidia-caps/mig-minors") as seen under the host root `root`
// (NVIDIA_DRIVER_ROOT, NVIDIA_DEV_ROOT, --proc-root): "/" or "" leave it as it is; trailing
// slashes of `root` are dropped ("/host/" + "/dev/x" is "/host/dev/x").
inline std::string UnderRoot(std::string_view root, std::string_view abs_path) {
  while (!root.empty() && root.back() == '/') root.remove_suffix(1);
  return Cat(root, abs_path);
}

// Writes `contents` to `path` so that a reader sees the old file or the new one, never half of
// either: a temporary file of its own next to it (mkstemps: concurrent writers of the same path
// never share one), with `mode`, renamed over `path`; the temporary file is removed when a step
// fails. Errors name the file and the step ("cannot write <tmp>: <why>", "cannot rename <tmp> to
// <path>: <why>"); callers append the fix.
inline absl::Status WriteFileAtomically(const std::string& path, std::string_view contents, mode_t mode = 0644) {
  std::string tmp = path + ".XXXXXX.tmp";
  const int fd = ::mkstemps(tmp.data(), 4);
  if (fd < 0) return absl::UnavailableError(Cat("cannot write ", Printable(tmp), ": ", std::strerror(errno)));
  // `err`: the errno of the step that failed, taken before close() or unlink() can change it.
  auto fail = [&](std::string_view step, int err) {
    ::unlink(tmp.c_str());
    return absl::UnavailableError(Cat("cannot ", step, ": ", std::strerror(err)));
  };
  size_t done = 0;
  int err = 0;
  while (done < contents.size() && err == 0) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) err = n < 0 ? errno : EIO;
    done += n > 0 ? static_cast<size_t>(n) : 0;
  }
  if (err == 0 && ::fchmod(fd, mode) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) return fail(Cat("write ", Printable(tmp)), err);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return fail(Cat("rename ", Printable(tmp), " to ", Printable(path)), errno);
  return absl::OkStatus();
}

// The whole content of a file, or nullopt when it cannot be read.
inline std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// An input file named by the operator (a config file, a counters CSV): its content, or an error
// that says which of "missing", "a directory", "not readable" it is, names the file (escaped) and
// ends with `fix` (e.g. "check --config-file / CONFIG_FILE"). `what` names the kind of file.
inline absl::StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what, std::string_view fix) {
  const std::string name = Printable(path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string why = std::error_code(err, std::generic_category()).message();
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(Cat(name, ": the ", what, " does not exist (", fix, ")"));
    }
    return absl::PermissionDeniedError(Cat(name, ": cannot read the ", what, ": ", why, " (", fix, ")"));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(Cat(name, " is a directory, not a ", what, " (", fix,
                                          "; a ConfigMap mounted as a directory needs the file's "
                                          "name appended)"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const std::string why = std::error_code(errno, std::generic_category()).message();
    return absl::PermissionDeniedError(Cat(name, ": cannot read the ", what, ": ", why, " (", fix, ")"));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return absl::DataLossError(Cat(name, ": read error in the ", what, " (", fix, ")"));
  return buf.str();
}

}  // namespace kgpu
