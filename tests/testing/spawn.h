#pragma once
// Test helper: start a child process from a multi-threaded test without deadlocking it.
//
// After fork() in a process with threads (gRPC and HTTP servers, informers), the child has a copy
// of memory in which another thread may hold the allocator's lock; under ASan a child that
// allocates before exec (a std::string, setenv, a vector of argv) can then block forever, and the
// test sees a "process" that never logs a line and ignores SIGTERM. Spawn() builds the program
// path, argv, the environment and the log descriptor before fork(); the child calls only
// async-signal-safe functions (prctl, setsid, sigaction, dup2, close, execve).
//
// Thread-safety: call from any thread; the child dies with the calling thread when
// die_with_parent is set (PR_SET_PDEATHSIG is per thread), as the tests want.

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

extern char** environ;

namespace kgpu::testing {

struct SpawnOptions {
  std::string log;               // stdout and stderr go to this file; empty: inherited
  bool append = false;           // append to `log` instead of truncating it
  bool stdin_null = false;       // stdin from /dev/null
  bool die_with_parent = true;   // SIGKILL when the test dies; false: a new session (setsid)
  bool close_other_fds = false;  // close every descriptor above 2, like a daemon would
  bool reset_signals = false;    // default dispositions and an empty mask for the child
  std::vector<std::string> env;  // "KEY=VALUE" entries that override or add to the environment (later wins)
};

// Resolves `name` as execvp would (searched on PATH when it has no '/'); "" if not found.
inline std::string FindProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = (end > start ? dirs.substr(start, end - start) : ".") + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// Starts argv[0] with argv; returns the child's pid, or -1 with errno set when the program is
// not found, the log cannot be opened or fork fails.
inline pid_t Spawn(const std::vector<std::string>& argv, const SpawnOptions& o = {}) {
  if (argv.empty()) return errno = EINVAL, -1;
  const std::string program = FindProgram(argv[0]);
  if (program.empty()) return errno = ENOENT, -1;
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const auto& add : o.env) {  // a later entry for a key replaces an earlier one
    const std::string key = add.substr(0, add.find('=') + 1);
    auto it = std::find_if(env.begin(), env.end(), [&](const std::string& e) { return e.rfind(key, 0) == 0; });
    if (it != env.end()) {
      *it = add;
    } else {
      env.push_back(add);
    }
  }
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int log_fd =
      o.log.empty() ? -1
                    : ::open(o.log.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (o.append ? O_APPEND : O_TRUNC), 0644);
  if (!o.log.empty() && log_fd < 0) return -1;
  const int null_fd = o.stdin_null ? ::open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (o.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
    } else {
      ::setsid();
    }
    if (o.reset_signals) {
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD}) ::sigaction(s, &dfl, nullptr);
    }
    if (null_fd >= 0) ::dup2(null_fd, 0);
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    if (o.close_other_fds) {
      for (int fd = 3; fd < 1024; ++fd) ::close(fd);
    }
    ::execve(program.c_str(), args.data(), envp.data());
    ::_exit(127);
  }
  const int saved = errno;
  if (log_fd >= 0) ::close(log_fd);
  if (null_fd >= 0) ::close(null_fd);
  errno = saved;
  return pid;
}

}  // namespace kgpu::testing
