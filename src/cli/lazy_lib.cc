#include "cli/lazy_lib.h"

#include <dlfcn.h>

#include "common/strings.h"

namespace kgpu::cli::lazy {

void Lib::Open() {
  std::call_once(once_, [this] {
    handle_ = dlopen(soname_, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* why = dlerror();
      error_ = Cat("cannot load ", soname_, " (", why != nullptr ? why : "unknown error",
                   "): install the Debian package ", package_);
    }
  });
}

void* Lib::Symbol(const char* name) {
  Open();
  if (handle_ == nullptr) return nullptr;
  // The handle's own lookup scope: the library itself first, never the kgpu executable's
  // forwarding definition of the same name.
  return dlsym(handle_, name);
}

const std::string& Lib::Error() {
  Open();
  return error_;
}

}  // namespace kgpu::cli::lazy
