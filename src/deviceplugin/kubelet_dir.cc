#include "deviceplugin/kubelet_dir.h"

#include <cerrno>
#include <system_error>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/strings.h"

namespace kgpu::deviceplugin {
namespace {

constexpr char kFix[] =
    "set --kubelet-dir / KGPU_KUBELET_DIR to kubelet's device-plugin directory (default "
    "/var/lib/kubelet/device-plugins) and mount it read-write into the pod (hostPath)";

// The longest socket name the plugin creates there ("nvidia-mig-7g.141gb.shared.sock" and the like).
constexpr size_t kLongestSocketName = 48;

std::string Kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device node";
  return "not a directory";
}

}  // namespace

absl::Status CheckKubeletDir(const std::string& dir) {
  const std::string name = Printable(dir);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(Cat("kubelet directory ", name,
                                     " does not exist: is kubelet running on this node (it creates the directory)? ",
                                     kFix));
    }
    return absl::PermissionDeniedError(
        Cat("kubelet directory ", name, ": ", std::error_code(err, std::generic_category()).message(), "; ", kFix));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        Cat("kubelet directory ", name, " is not a directory (it is ", Kind(st.st_mode), "); ", kFix));
  }
  if (dir.size() + 1 + kLongestSocketName >= sizeof(sockaddr_un::sun_path)) {
    return absl::FailedPreconditionError(Cat("kubelet directory ", name, " is too long a path (", dir.size(),
                                             " bytes) for the unix sockets served in it (at most ",
                                             sizeof(sockaddr_un::sun_path) - 2 - kLongestSocketName, "); ", kFix));
  }
  // What creating a socket needs: write and search permission, on a writable file system. A probe
  // file answers for both (access() does not see a read-only mount for root).
  const std::string probe = Cat(dir, "/.kgpu-write-check-", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EROFS) {
      return absl::FailedPreconditionError(Cat(
          "kubelet directory ", name, " is on a read-only file system: the plugin cannot create its sockets; ", kFix));
    }
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(Cat("kubelet directory ", name, " is not writable by this process (uid ",
                                             ::geteuid(), "): run the plugin as root, or ", kFix));
    }
    if (err != EEXIST) {
      return absl::FailedPreconditionError(Cat("kubelet directory ", name, ": cannot create files in it: ",
                                               std::error_code(err, std::generic_category()).message(), "; ", kFix));
    }
    return absl::OkStatus();  // a leftover probe of an earlier process with our pid: creating works
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

}  // namespace kgpu::deviceplugin
