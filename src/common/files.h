#pragma once
// Small file helpers.
//
// Thread-safety: reentrant.

#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

#include "absl/status/statusor.h"
#include "common/strings.h"

namespace kgpu {

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
inline absl::StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                                 std::string_view fix) {
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
    return absl::InvalidArgumentError(
        Cat(name, " is a directory, not a ", what, " (", fix, "; a ConfigMap mounted as a directory needs the file's "
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
