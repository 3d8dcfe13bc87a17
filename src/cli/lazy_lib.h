// Lazily loaded shared libraries of the kgpu executable (src/cli/lazy_curl.cc,
// src/cli/lazy_httplib.cc).
//
// libcurl (the Kubernetes client) and libcpp-httplib (the exporter's HTTP server) pull ~30 shared
// libraries into a process (OpenSSL, GnuTLS, p11-kit, Kerberos, LDAP, ...) whose loading,
// relocation and constructors cost ~12 ms and ~8 MB of RSS at every start, also for the jobs that
// never talk HTTP (`kgpu device-plugin`, `kgpu devices`, `kgpu doctor` on a node). The kgpu
// executable therefore defines the few symbols of theirs that it calls (linked with --as-needed,
// so neither library is a DT_NEEDED of kgpu; tests/integration/lazy_libs_test.sh checks it) and
// loads the real library with dlopen on the first call, forwarding every call to it. Only the
// executable does this: the libraries and tests that link kgpu_k8s / kgpu_exporter directly use
// the real libraries as linked.
#pragma once

#include <mutex>
#include <string>

namespace kgpu::cli::lazy {

// One library, opened at most once (thread-safe) on the first Symbol() or Error() call.
class Lib {
 public:
  // soname: what dlopen is given; package: the Debian package that ships it (for the message).
  Lib(const char* soname, const char* package) : soname_(soname), package_(package) {}
  Lib(const Lib&) = delete;
  Lib& operator=(const Lib&) = delete;

  // The address of `name` in the library, or nullptr when the library cannot be loaded or lacks
  // the symbol (then Error() says which, with the fix).
  void* Symbol(const char* name);
  // Why the library is not available ("" when it is loaded).
  const std::string& Error();

 private:
  void Open();

  const char* soname_;
  const char* package_;
  std::once_flag once_;
  void* handle_ = nullptr;
  std::string error_;
};

}  // namespace kgpu::cli::lazy
