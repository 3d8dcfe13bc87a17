#pragma once
// Runs a program without a shell (posix_spawnp: a PATH lookup for a name without '/', argv as
// given), with extra environment variables (the last of a name wins), a wall-clock deadline (SIGKILL when it passes)
// and its stdout and stderr captured until it exits (what a daemon it started writes later, holding the pipes, is not
// waited for). The child starts with no signals blocked and default dispositions, whatever the caller's mask is (a
// daemon that blocks SIGTERM for sigwait would otherwise pass that on).
//
// Thread-safety: reentrant; each call is its own process.

#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kgpu {

struct ProcessResult {
  int exit_code = -1;      // exit status; 128+N when killed by signal N
  bool timed_out = false;  // killed because the deadline passed
  bool cancelled = false;  // killed because ProcessOptions::cancel was set
  std::string out, err;
  std::chrono::milliseconds elapsed{0};
};

struct ProcessOptions {
  std::vector<std::pair<std::string, std::string>> env;  // added to (or replacing in) the caller's
  std::chrono::milliseconds timeout{10000};
  size_t max_output = 16 << 20;  // bytes kept per stream; the rest is read and dropped
  // Set (by another thread) to kill the program now (SIGKILL), as when its deadline passes; the
  // result then says cancelled. Null: never.
  const std::atomic<bool>* cancel = nullptr;
  // The program writes to the caller's stderr (a credential plugin's prompts and warnings, as
  // client-go passes them through) instead of into ProcessResult::err.
  bool inherit_stderr = false;
};

// Errors only when the program cannot be started (not found, not executable): FailedPrecondition
// whose SpawnErrno() is posix_spawn's error; a program that runs and fails is an OK result with
// its exit code.
absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv, const ProcessOptions& options = {});

// The errno of a RunProcess that could not start the program (ENOENT, EACCES ...), else 0.
int SpawnErrno(const absl::Status& s);

// "argv[0] arg1 ..." for messages, quoted as a POSIX shell reads it (an argument with a blank,
// a quote, a backslash or a shell operator in '...'), so SplitCommandLine gives argv back.
std::string CommandLine(const std::vector<std::string>& argv);

// A command line as a POSIX shell splits it into words, without running a shell: blanks separate
// words; '...' is literal; "..." is literal but for \ before $ ` " \ or a newline; a backslash
// outside quotes takes the next character literally. Nothing is expanded, so what only a shell
// would act on is an error that says to quote it or to run sh -c: an unquoted operator or
// expansion (| & ; < > ( ) $ ` * ? [), # or ~ starting a word, $ or ` inside "...", a line break
// before more text (a second command), a NUL byte, an unterminated quote, a trailing backslash,
// an empty line. `what` names the input in errors (e.g. "--resume-command").
absl::StatusOr<std::vector<std::string>> SplitCommandLine(std::string_view line, std::string_view what);

}  // namespace kgpu
