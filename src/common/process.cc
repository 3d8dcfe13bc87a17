#include "common/process.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/strings.h"

extern char** environ;

namespace kgpu {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  void Close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

}  // namespace

namespace {
// What makes CommandLine quote an argument: blanks, quotes, backslash and what a shell would
// treat as an operator or an expansion (SplitCommandLine refuses those unquoted).
constexpr std::string_view kShellOperators = "|&;<>()$`*?[";
constexpr const char* kQuoteWorthy = " \t\n\r\"'\\|&;<>()$`*?[#~";
}  // namespace

std::string CommandLine(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    if (a.empty() || a.find_first_of(kQuoteWorthy) != std::string::npos) {
      out += '\'';
      for (char c : a) {
        if (c == '\'') {
          out += "'\\''";
        } else {
          out += c;
        }
      }
      out += '\'';
    } else {
      out += a;
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> SplitCommandLine(std::string_view line, std::string_view what) {
  const std::string shown = Printable(line);
  if (const size_t nul = line.find('\0'); nul != std::string_view::npos) {
    return absl::InvalidArgumentError(Cat(what, ": '", shown, "' has a NUL byte at offset ", nul));
  }
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;  // a word has started (so '' is an empty argument)
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if ((c == '\n' || c == '\r') && line.find_first_not_of(" \t\r\n", i) != std::string_view::npos) {
      return absl::InvalidArgumentError(Cat(what, ": '", shown, "' has a line break at offset ", i,
                                            ": one command only (a shell would run the rest as another)"));
    }
    if (!in_word && (c == '#' || c == '~')) {
      return absl::InvalidArgumentError(Cat(what, ": '", shown, "' has an unquoted ", c,
                                            " at the start of a word (offset ", i, "): a shell would read a ",
                                            c == '#' ? "comment" : "home directory", ", this is no shell; quote it ('",
                                            c, "')"));
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    if (c == '\\' && i + 1 < line.size() && line[i + 1] == '\n') {  // a line continuation: removed
      ++i;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (i + 1 == line.size()) {
        return absl::InvalidArgumentError(
            Cat(what, ": '", shown, "' ends in a backslash: remove it or quote it ('\\\\')"));
      }
      word += line[++i];
    } else if (c == '\'') {
      const size_t end = line.find('\'', i + 1);
      if (end == std::string_view::npos) {
        return absl::InvalidArgumentError(Cat(what, ": '", shown, "' has a ' at offset ", i, " that is never closed"));
      }
      word.append(line.substr(i + 1, end - i - 1));
      i = end;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size() && line[j + 1] == '\n') {
          ++j;  // a line continuation: removed
          continue;
        }
        if (line[j] == '\\' && j + 1 < line.size() &&
            std::string_view("$`\"\\").find(line[j + 1]) != std::string_view::npos) {
          ++j;
        } else if (line[j] == '$' || line[j] == '`') {
          return absl::InvalidArgumentError(Cat(what, ": '", shown, "' has ", line[j], " inside \"...\" at offset ", j,
                                                ": nothing is expanded (no shell runs it); write \\", line[j],
                                                " for the character, or run sh -c '...' for a shell"));
        }
        word += line[j];
      }
      if (j == line.size()) {
        return absl::InvalidArgumentError(Cat(what, ": '", shown, "' has a \" at offset ", i, " that is never closed"));
      }
      i = j;
    } else if (kShellOperators.find(c) != std::string_view::npos) {
      return absl::InvalidArgumentError(Cat(what, ": '", shown, "' has an unquoted ", c, " at offset ", i,
                                            ": no shell runs the command, so quote it ('", c,
                                            "') to pass it as an argument, or run sh -c '...' for a shell"));
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  if (words.empty()) return absl::InvalidArgumentError(Cat(what, ": empty command"));
  return words;
}

namespace {
constexpr char kSpawnErrnoPayload[] = "kgpu.process/spawn-errno";
}  // namespace

int SpawnErrno(const absl::Status& s) {
  const auto p = s.GetPayload(kSpawnErrnoPayload);
  return p ? std::atoi(std::string(*p).c_str()) : 0;
}

absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv, const ProcessOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("RunProcess: empty command");
  const auto start = std::chrono::steady_clock::now();
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError(Cat("pipe: ", std::strerror(errno)));
  Fd out_r{out_pipe[0]}, out_w{out_pipe[1]};
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return absl::InternalError(Cat("pipe: ", std::strerror(errno)));
  Fd err_r{err_pipe[0]}, err_w{err_pipe[1]};

  // Environment: the caller's, with options.env added or replacing (the last of a name wins, as
  // Go's exec.Cmd.Env).
  std::map<std::string, std::string> overrides;
  for (const auto& [k, v] : options.env) overrides[k] = v;
  std::vector<std::string> env_store;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos && overrides.count(kv.substr(0, eq))) continue;
    env_store.push_back(std::move(kv));
  }
  for (const auto& [k, v] : overrides) env_store.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argvp;
  for (auto& a : args) argvp.push_back(a.data());
  argvp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_w.fd, 1);
  if (!options.inherit_stderr) posix_spawn_file_actions_adddup2(&fa, err_w.fd, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argvp[0], &fa, &attr, argvp.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    absl::Status s = absl::FailedPreconditionError(
        Cat("cannot run ", argv[0], ": ", std::strerror(rc), " (is it installed and on PATH?)"));
    s.SetPayload(kSpawnErrnoPayload, absl::Cord(std::to_string(rc)));
    return s;
  }
  out_w.Close();
  err_w.Close();

  ProcessResult result;
  const auto deadline = start + options.timeout;
  bool out_open = true, err_open = true;
  char buf[8192];
  // The program has exited (reaped here): what is still in the pipes is read without waiting,
  // because a daemon it started may hold them open for ever (a resume command that starts slurmd).
  bool exited = false;
  int status = 0;
  while (out_open || err_open) {
    const auto now = std::chrono::steady_clock::now();
    const bool cancelled = options.cancel != nullptr && options.cancel->load();
    if (now >= deadline || cancelled) {
      if (!exited) {
        (cancelled ? result.cancelled : result.timed_out) = true;
        ::kill(pid, SIGKILL);
      }
      break;
    }
    const int wait_ms =
        exited ? 0
               : static_cast<int>(std::min<int64_t>(
                     50, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1));
    pollfd fds[2];
    int n = 0;
    int out_idx = -1, err_idx = -1;
    if (out_open) {
      fds[n] = {out_r.fd, POLLIN, 0};
      out_idx = n++;
    }
    if (err_open) {
      fds[n] = {err_r.fd, POLLIN, 0};
      err_idx = n++;
    }
    const int pr = ::poll(fds, static_cast<nfds_t>(n), wait_ms);
    if (pr < 0) {
      if (errno == EINTR) continue;
      if (!exited) ::kill(pid, SIGKILL);
      break;
    }
    if (pr == 0 && exited) break;  // exited, and nothing left to read now
    auto drain = [&](int idx, Fd& fd, std::string& into, bool& open) {
      if (idx < 0 || !(fds[idx].revents & (POLLIN | POLLHUP | POLLERR))) return;
      const ssize_t r = ::read(fd.fd, buf, sizeof(buf));
      if (r > 0) {
        const size_t room = options.max_output > into.size() ? options.max_output - into.size() : 0;
        into.append(buf, std::min(room, static_cast<size_t>(r)));
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        open = false;
      }
    };
    drain(out_idx, out_r, result.out, out_open);
    drain(err_idx, err_r, result.err, err_open);
    if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) exited = true;
  }
  while (!exited && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  result.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  return result;
}

}  // namespace kgpu
