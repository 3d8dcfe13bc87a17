// A fake nvidia-cuda-mps-control for tests: a TEST DOUBLE, not product code.
//
// NVIDIA's MPS control daemon needs a GPU. This stand-in speaks the same line protocol over
// $CUDA_MPS_PIPE_DIRECTORY/control (default /tmp/nvidia-mps) and records every command it is told
// in $CUDA_MPS_LOG_DIRECTORY/control.log (default /var/log/nvidia-mps) as "[ts] CMD <line>", which
// is what tests check.
//
//   nvidia-cuda-mps-control -d   start the daemon in the background; returns once it listens
//   nvidia-cuda-mps-control -f   run the daemon in the foreground, logging to stderr as well
//   nvidia-cuda-mps-control      client: send each stdin line as one command, print the replies
//
// Test hooks, read when the daemon starts: KGPU_FAKE_MPS_START_DELAY_MS=<n> sleeps n ms before
// binding the socket (so -d returns late); KGPU_FAKE_MPS_FAIL=1 refuses to start at all.

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace {

volatile sig_atomic_t g_stop = 0;
bool g_log_to_stderr = false;

void OnSignal(int) {
  g_stop = 1;
}

std::string Env(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

struct Paths {
  std::string pipe_dir = Env("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps");
  std::string log_dir = Env("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps");
  std::string Socket() const { return pipe_dir + "/control"; }
  std::string PidFile() const { return pipe_dir + "/nvidia-cuda-mps-control.pid"; }
  std::string LogFile() const { return log_dir + "/control.log"; }
};

// Appends "[YYYY-MM-DD HH:MM:SS.mmm] <msg>" to control.log (and stderr in -f mode).
void Log(const Paths& paths, const std::string& msg) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm local{};
  localtime_r(&now.tv_sec, &local);
  char stamp[64];
  const size_t len = std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
  std::snprintf(stamp + len, sizeof stamp - len, ".%03ld", now.tv_nsec / 1000000);
  const std::string line = "[" + std::string(stamp) + "] " + msg + "\n";
  if (FILE* f = std::fopen(paths.LogFile().c_str(), "a")) {
    std::fputs(line.c_str(), f);
    std::fclose(f);
  }
  if (g_log_to_stderr) std::fputs(line.c_str(), stderr);
}

bool MkdirP(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    if (mkdir(path.substr(0, i).c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool FillAddr(const std::string& path, sockaddr_un& addr) {
  if (path.size() >= sizeof addr.sun_path) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return true;
}

// A socket connected to the daemon at `path`, or -1.
int Connect(const std::string& path) {
  sockaddr_un addr{};
  if (!FillAddr(path, addr)) return -1;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

void WriteAll(int fd, const std::string& data) {
  for (size_t off = 0; off < data.size();) {
    const ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// One command line from a client: up to '\n', EOF, or 2 s of silence.
std::string ReadCommand(int fd) {
  std::string line;
  char c = 0;
  while (line.size() < 4096) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 2000) <= 0 || read(fd, &c, 1) != 1 || c == '\n') break;
    line += c;
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

struct State {
  double percentage = 100.0;
  std::map<unsigned long, std::string> pinned_mem_limit;  // device ordinal -> "40960M"
};

std::string OneDecimal(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f\n", v);
  return buf;
}

// The reply ("" for none) to one command; sets `quit` for the quit command.
std::string Handle(State& state, const std::string& line, bool& quit) {
  static const std::regex kNumber(R"(\d+(\.\d+)?)");
  static const std::regex kMemLimit(R"(\d+(\.\d+)?(K|KB|M|MB|G|GB)?)");
  static const std::regex kOrdinal(R"(\d{1,9})");
  std::istringstream in(line);
  std::vector<std::string> args;
  for (std::string word; in >> word;) args.push_back(word);
  const std::string cmd = args.empty() ? "" : args[0];
  if (cmd == "quit") {
    quit = true;
    return "";
  }
  if (cmd == "set_default_active_thread_percentage") {
    if (args.size() != 2 || !std::regex_match(args[1], kNumber) || std::stod(args[1]) > 100) {
      return "Invalid percentage\n";
    }
    state.percentage = std::stod(args[1]);
    return OneDecimal(state.percentage);  // the real daemon echoes the value it set
  }
  if (cmd == "get_default_active_thread_percentage") return OneDecimal(state.percentage);
  if (cmd == "set_default_device_pinned_mem_limit") {
    if (args.size() != 3 || !std::regex_match(args[1], kOrdinal) || !std::regex_match(args[2], kMemLimit)) {
      return "Invalid memory limit\n";
    }
    state.pinned_mem_limit[std::stoul(args[1])] = args[2];
    return "";
  }
  if (cmd == "get_default_device_pinned_mem_limit") {
    if (args.size() != 2 || !std::regex_match(args[1], kOrdinal)) return "Invalid device\n";
    const auto it = state.pinned_mem_limit.find(std::stoul(args[1]));
    return (it == state.pinned_mem_limit.end() ? "0" : it->second) + "\n";
  }
  if (cmd == "get_server_list" || cmd == "get_client_list") return "";  // no MPS servers here
  return "Unrecognized command: " + line + "\n";
}

// Binds the control socket, writes the pid file and logs Startup. The listening fd, or -1 + `err`.
int StartListening(const Paths& paths, std::string& err) {
  if (const long delay = std::atol(Env("KGPU_FAKE_MPS_START_DELAY_MS", "0").c_str()); delay > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  }
  for (const std::string& dir : {paths.pipe_dir, paths.log_dir}) {
    if (!MkdirP(dir)) {
      err = "cannot create " + dir + ": " + std::strerror(errno);
      return -1;
    }
  }
  sockaddr_un addr{};
  if (!FillAddr(paths.Socket(), addr)) {
    err = "socket path too long: " + paths.Socket();
    return -1;
  }
  unlink(paths.Socket().c_str());  // a stale socket: nothing answered on it
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 16) != 0) {
    err = "cannot listen on " + paths.Socket() + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    return -1;
  }
  FILE* pid_file = std::fopen(paths.PidFile().c_str(), "w");
  if (pid_file == nullptr) {
    err = "cannot write " + paths.PidFile() + ": " + std::strerror(errno);
    close(fd);
    unlink(paths.Socket().c_str());
    return -1;
  }
  std::fprintf(pid_file, "%d\n", static_cast<int>(getpid()));
  std::fclose(pid_file);
  Log(paths, "Startup");
  return fd;
}

void Shutdown(const Paths& paths, int listen_fd) {
  close(listen_fd);
  unlink(paths.Socket().c_str());
  unlink(paths.PidFile().c_str());
  Log(paths, "Shutdown");
}

// The accept loop: one command per connection, until quit or SIGTERM/SIGINT.
int Serve(const Paths& paths, int listen_fd) {
  State state;
  bool quit = false;
  while (!quit && g_stop == 0) {
    pollfd pfd{listen_fd, POLLIN, 0};
    if (poll(&pfd, 1, 200) <= 0) continue;
    const int client = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    const std::string line = ReadCommand(client);
    if (line.empty()) {  // a bare connect (a readiness probe, "already running" check): not a command
      close(client);
      continue;
    }
    Log(paths, "CMD " + line);
    const std::string reply = Handle(state, line, quit);
    // On quit, clean up before closing the connection: once the client returns, all is gone.
    if (quit) Shutdown(paths, listen_fd);
    WriteAll(client, reply);
    close(client);
  }
  if (!quit) Shutdown(paths, listen_fd);
  return 0;
}

int RunDaemon(bool foreground) {
  const Paths paths;
  if (Env("KGPU_FAKE_MPS_FAIL", "") == "1") {
    std::fputs("fake: start refused\n", stderr);
    return 1;
  }
  if (const int fd = Connect(paths.Socket()); fd >= 0) {
    close(fd);
    std::fputs("An instance of this daemon is already running\n", stderr);
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;  // no SA_RESTART: poll() wakes up
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::string err;
  if (foreground) {
    g_log_to_stderr = true;
    const int fd = StartListening(paths, err);
    if (fd < 0) std::fprintf(stderr, "nvidia-cuda-mps-control: %s\n", err.c_str());
    return fd < 0 ? 1 : Serve(paths, fd);
  }
  int ready[2];  // the daemon writes "ok" or an error here once it listens (or fails to)
  if (pipe2(ready, O_CLOEXEC) != 0) return std::perror("pipe"), 1;
  const pid_t pid = fork();
  if (pid < 0) return std::perror("fork"), 1;
  if (pid == 0) {
    close(ready[0]);
    setsid();
    const int null_fd = open("/dev/null", O_RDWR);
    for (int fd = 0; fd <= 2; ++fd) dup2(null_fd, fd);
    if (null_fd > 2) close(null_fd);
    // Like a real daemon, keep no descriptor the starter had open (a build lock, a test's pipes).
    for (int fd = 3; fd < 1024; ++fd) {
      if (fd != ready[1]) close(fd);
    }
    const int fd = StartListening(paths, err);
    WriteAll(ready[1], fd >= 0 ? "ok" : err);
    close(ready[1]);
    return fd < 0 ? 1 : Serve(paths, fd);
  }
  close(ready[1]);
  const std::string status = ReadAll(ready[0]);
  close(ready[0]);
  if (status == "ok") return 0;
  std::fprintf(stderr, "nvidia-cuda-mps-control: %s\n",
               status.empty() ? "the daemon exited before it was ready" : status.c_str());
  return 1;
}

int RunClient() {
  const Paths paths;
  signal(SIGPIPE, SIG_IGN);
  for (std::string line; std::getline(std::cin, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const int fd = Connect(paths.Socket());
    if (fd < 0) {
      std::fputs("Cannot find MPS control daemon process\n", stderr);
      return 1;
    }
    WriteAll(fd, line + "\n");
    const std::string reply = ReadAll(fd);
    close(fd);
    std::fputs(reply.c_str(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 1) return RunClient();
  if (argc == 2 && std::strcmp(argv[1], "-d") == 0) return RunDaemon(false);
  if (argc == 2 && std::strcmp(argv[1], "-f") == 0) return RunDaemon(true);
  std::fputs("usage: nvidia-cuda-mps-control [-d | -f]  (fake, for tests)\n", stderr);
  return 1;
}
