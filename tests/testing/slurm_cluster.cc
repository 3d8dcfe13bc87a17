#include "testing/slurm_cluster.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/files.h"
#include "common/strings.h"
#include "testing/poll.h"
#include "testing/spawn.h"

namespace kgpu::testing {
namespace fs = std::filesystem;
namespace {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

bool Executable(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    if (::access((std::string(dir) + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string Tail(const std::string& path, size_t n) {
  auto text = kgpu::ReadFile(path);  // common/files.h (not testing::ReadFile)
  if (!text) return "";
  std::vector<std::string> lines;
  std::stringstream in(*text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::string out;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) out += lines[i] + "\n";
  return out;
}

bool Alive(pid_t pid) {
  if (pid <= 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) return false;             // our child, reaped now
  if (r < 0) return ::kill(pid, 0) == 0;  // not our child (detached): signal probe
  return true;
}

}  // namespace

std::string SlurmCluster::Unavailable() {
  if (::geteuid() != 0) return "needs root (munged --force, mknod, slurmd)";
  for (const char* b : {"munged", "slurmctld", "slurmd", "scontrol", "squeue", "sbatch"}) {
    if (!Executable(b))
      return Cat(b, " is not installed (scripts/install-deps.sh installs slurmctld slurmd slurm-client munge)");
  }
  return "";
}

SlurmCluster::SlurmCluster(SlurmClusterOptions options) : options_(std::move(options)) {
  if (options_.base.empty()) {
    char tmpl[] = "/tmp/kgpu-slurm-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) {
      base_ = tmpl;
      own_base_ = true;
    }
  } else {
    base_ = options_.base;
    fs::create_directories(base_);
  }
}

SlurmCluster::~SlurmCluster() {
  if (!options_.detach) Stop();
}

pid_t SlurmCluster::Spawn(const std::string& name, const std::vector<std::string>& argv) {
  const std::string log = Cat(base_, "/log/", name, ".out");
  const std::string conf_env = Cat("SLURM_CONF=", conf());
  const bool detach = options_.detach;
  SpawnOptions o;
  o.log = log;
  o.append = true;
  o.stdin_null = true;
  o.die_with_parent = !detach;  // detached: a new session that outlives the harness
  o.close_other_fds = true;
  o.reset_signals = true;
  o.env = {conf_env};
  const pid_t pid = kgpu::testing::Spawn(argv, o);
  if (pid > 0) {
    pids_[name] = pid;
    std::ofstream(Cat(base_, "/run/", name, ".pid")) << pid << "\n";
  }
  return pid;
}

ProcessResult SlurmCluster::Run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) const {
  ProcessOptions po;
  po.timeout = timeout;
  po.env.emplace_back("SLURM_CONF", conf());
  auto r = RunProcess(argv, po);
  if (!r.ok()) {
    ProcessResult f;
    f.err = std::string(r.status().message());
    return f;
  }
  return *r;
}

std::string SlurmCluster::State(const std::string& node) const {
  const auto r = Run({"scontrol", "-o", "show", "node", node}, std::chrono::seconds(15));
  if (r.exit_code != 0) return "";
  const auto p = r.out.find(" State=");
  if (p == std::string::npos) return "";
  const auto e = r.out.find(' ', p + 7);
  return r.out.substr(p + 7, e == std::string::npos ? std::string::npos : e - p - 7);
}

std::string SlurmCluster::Reason(const std::string& node) const {
  const auto r = Run({"scontrol", "-o", "show", "node", node}, std::chrono::seconds(15));
  const auto p = r.out.find(" Reason=");
  if (r.exit_code != 0 || p == std::string::npos) return "";
  std::string reason = r.out.substr(p + 8);
  while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
  if (const auto b = reason.rfind(" ["); b != std::string::npos && !reason.empty() && reason.back() == ']') {
    reason.resize(b);
  }
  return reason;
}

std::string SlurmCluster::Submit(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"sbatch", "--parsable", "-o", "/dev/null", "-e", "/dev/null"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = Run(argv);
  if (r.exit_code != 0) return "";
  std::string id = r.out;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  if (const auto semi = id.find(';'); semi != std::string::npos) id.resize(semi);
  return id;
}

std::string SlurmCluster::JobState(const std::string& id) const {
  auto r = Run({"squeue", "-h", "-t", "all", "-j", id, "-o", "%T"});
  std::string s = r.out;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return r.exit_code == 0 ? s : "";
}

bool SlurmCluster::WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds deadline,
                           std::chrono::milliseconds every) {
  return testing::WaitFor(cond, deadline, every);
}

std::string SlurmCluster::Logs(size_t lines_per_file) const {
  std::string out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base_ + "/log", ec)) {
    out += Cat("--- ", e.path().string(), "\n", Tail(e.path().string(), lines_per_file));
  }
  return out;
}

absl::Status SlurmCluster::WaitNodesIdle(const std::vector<std::string>& nodes) {
  std::string last;
  const bool ok = WaitFor(
      [&] {
        for (const auto& n : nodes) {
          last = Cat(n, ": '", State(n), "'");
          const std::string s = State(n);
          if (s.rfind("IDLE", 0) != 0 || s.find("NOT_RESPONDING") != std::string::npos ||
              s.find("UNKNOWN") != std::string::npos) {
            return false;
          }
        }
        return true;
      },
      options_.deadline, std::chrono::milliseconds(200));
  if (!ok)
    return absl::DeadlineExceededError(
        Cat("nodes not IDLE after ", options_.deadline.count(), " s (", last, ")\n", Logs()));
  return absl::OkStatus();
}

absl::Status SlurmCluster::Start() {
  if (auto why = Unavailable(); !why.empty()) return absl::FailedPreconditionError(why);
  if (base_.empty()) return absl::InternalError("no directory for the cluster (mkdtemp failed, or Start after Stop)");
  ::chmod(base_.c_str(), 0755);
  for (const char* d : {"etc", "state", "log", "run", "munge", "spool", "dev"}) fs::create_directories(base_ + "/" + d);
  ::chmod((base_ + "/munge").c_str(), 0755);
  const std::string key = base_ + "/munge/munge.key";
  {
    std::ifstream rnd("/dev/urandom", std::ios::binary);
    std::string bytes(1024, '\0');
    rnd.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::ofstream(key, std::ios::binary) << bytes;
    ::chmod(key.c_str(), 0400);
  }
  ctld_port_ = FreePort();
  std::string node_lines, gres_conf;
  for (const auto& n : options_.nodes) {
    node_ports_[n] = FreePort();
    fs::create_directories(Cat(base_, "/spool/", n));
    fs::create_directories(dev_dir(n));
    for (unsigned i = 0; i < options_.gpus_per_node; ++i) {
      const std::string dev = Cat(dev_dir(n), "/nvidia", i);
      if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(195, i)) != 0 && errno != EEXIST) {
        fs::create_symlink("/dev/null", dev);
      }
    }
    std::string params = options_.node_params.count(n) ? options_.node_params.at(n) : "";
    if (params.empty()) {
      params = Cat("CPUs=", options_.cpus_per_node, " RealMemory=1000");
      if (options_.gpus_per_node > 0) params += Cat(" Gres=gpu:tesla:", options_.gpus_per_node);
    }
    node_lines += Cat("NodeName=", n, " NodeAddr=127.0.0.1 NodeHostname=localhost Port=", node_ports_[n], " ", params,
                      " State=UNKNOWN\n");
    if (options_.gpus_per_node > 0) {
      gres_conf += Cat("NodeName=", n, " Name=gpu Type=tesla File=", dev_dir(n), "/nvidia[0-",
                       options_.gpus_per_node - 1, "]\n");
    }
  }
  if (!options_.gres_conf.empty()) gres_conf = options_.gres_conf;
  std::ofstream(base_ + "/etc/gres.conf") << gres_conf;
  std::ofstream(conf()) << Cat(
      "# A private test cluster written by tests/testing/slurm_cluster.cc\n"
      "ClusterName=kgputest\nSlurmctldHost=localhost\nSlurmUser=root\nSlurmdUser=root\n"
      "SlurmctldPort=",
      ctld_port_, "\n",
      "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny\n"
      "AuthType=auth/munge\nCredType=cred/munge\n"
      "AuthInfo=socket=",
      base_, "/munge/munge.socket.2\n", "StateSaveLocation=", base_, "/state\n", "SlurmdSpoolDir=", base_,
      "/spool/%n\n", "SlurmctldPidFile=", base_, "/run/slurmctld.daemon.pid\n", "SlurmdPidFile=", base_,
      "/run/slurmd-%n.daemon.pid\n", "SlurmctldLogFile=", base_, "/log/slurmctld.log\n", "SlurmdLogFile=", base_,
      "/log/slurmd-%n.log\n",
      "SlurmctldDebug=info\nSlurmdDebug=info\nMailProg=/bin/true\n"
      "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
      "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\nMpiDefault=none\n"
      "SwitchType=switch/none\nSchedulerType=sched/backfill\n"
      "SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=2\n"
      "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
      "GresTypes=",
      options_.gres_types, "\n",
      "ReturnToService=2\nSlurmctldTimeout=30\nSlurmdTimeout=300\nInactiveLimit=0\nKillWait=5\nMinJobAge=300\n",
      node_lines, "PartitionName=batch Nodes=", Join(options_.nodes, ","), " Default=YES MaxTime=INFINITE State=UP\n",
      options_.extra_conf, "\n");

  auto fail = [&](absl::Status s) {
    Stop();
    return s;
  };
  const std::string sock = base_ + "/munge/munge.socket.2";
  if (Spawn("munged", {"munged", "-F", "--force", "--key-file=" + key, "--socket=" + sock,
                       "--pid-file=" + base_ + "/munge/munged.daemon.pid", "--log-file=" + base_ + "/log/munged.log",
                       "--seed-file=" + base_ + "/munge/munged.seed"}) <= 0) {
    return fail(absl::InternalError("cannot start munged"));
  }
  if (!WaitFor([&] { return fs::exists(sock); }, options_.deadline)) {
    return fail(absl::DeadlineExceededError(Cat("munged did not create ", sock, "\n", Logs())));
  }
  if (auto s = StartController(); !s.ok()) return fail(s);
  for (const auto& n : options_.nodes) {
    if (Spawn("slurmd-" + n, {"slurmd", "-D", "-N", n}) <= 0) return fail(absl::InternalError("cannot start slurmd"));
  }
  if (auto s = WaitNodesIdle(options_.nodes); !s.ok()) return fail(s);
  return absl::OkStatus();
}

absl::Status SlurmCluster::StartController() {
  if (Spawn("slurmctld", {"slurmctld", "-D", "-i"}) <= 0) return absl::InternalError("cannot start slurmctld");
  std::string last;
  if (!WaitFor(
          [&] {
            const auto r = Run({"scontrol", "ping"}, std::chrono::seconds(15));
            last = r.out + r.err;
            return r.exit_code == 0 && r.out.find("is UP") != std::string::npos;
          },
          options_.deadline, std::chrono::milliseconds(200))) {
    return absl::DeadlineExceededError(Cat("slurmctld does not answer a ping: ", last, "\n", Logs()));
  }
  return absl::OkStatus();
}

void SlurmCluster::Kill(const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (pids_.count(n) && Alive(pids_[n])) ::kill(pids_[n], SIGTERM);
  }
  for (const auto& n : names) {
    if (!pids_.count(n)) continue;
    const pid_t pid = pids_[n];
    if (!WaitFor([&] { return !Alive(pid); }, std::chrono::seconds(20), std::chrono::milliseconds(50))) {
      ::kill(pid, SIGKILL);
      WaitFor([&] { return !Alive(pid); }, std::chrono::seconds(10), std::chrono::milliseconds(20));
    }
    pids_.erase(n);
    std::remove(Cat(base_, "/run/", n, ".pid").c_str());
  }
}

absl::Status SlurmCluster::StopController() {
  if (!pids_.count("slurmctld")) return absl::FailedPreconditionError("slurmctld is not running");
  Kill({"slurmctld"});
  return absl::OkStatus();
}

absl::Status SlurmCluster::StopSlurmd(const std::string& node) {
  if (!pids_.count("slurmd-" + node)) return absl::FailedPreconditionError(Cat("slurmd ", node, " is not running"));
  Kill({"slurmd-" + node});
  return absl::OkStatus();
}

absl::Status SlurmCluster::StartSlurmd(const std::string& node, bool as_rebooted) {
  std::vector<std::string> argv = {"slurmd", "-D", "-N", node};
  if (as_rebooted) argv.insert(argv.begin() + 2, "-b");
  if (Spawn("slurmd-" + node, argv) <= 0) return absl::InternalError("cannot start slurmd");
  const bool ok = WaitFor(
      [&] {
        const std::string s = State(node);
        return !s.empty() && s.find("NOT_RESPONDING") == std::string::npos && s.find("UNKNOWN") == std::string::npos &&
               s.find("POWERING_UP") == std::string::npos;
      },
      options_.deadline, std::chrono::milliseconds(200));
  return ok ? absl::OkStatus() : absl::DeadlineExceededError(Cat("slurmd ", node, " did not register\n", Logs()));
}

void SlurmCluster::EnablePowerSave(const std::string& kgpu, const std::string& kubeconfig) {
  const std::string hooks = base_ + "/hooks";
  fs::create_directories(hooks);
  for (const std::string event : {"suspend", "resume"}) {
    const std::string path = Cat(hooks, "/", event);
    std::ofstream(path) << "#!/bin/sh\nexec " << kgpu << " slurm-bridge hook " << event << " --kubeconfig "
                        << kubeconfig << " \"$1\" >>" << hooks << "/hooks.log 2>&1\n";
    fs::permissions(path, fs::perms::owner_all);
  }
  std::string nodes;
  for (const auto& n : options_.nodes) nodes += (nodes.empty() ? "" : ",") + n;
  options_.extra_conf +=
      Cat("SuspendProgram=", hooks, "/suspend\nResumeProgram=", hooks,
          "/resume\nSuspendTime=3600\nSuspendExcNodes=", nodes, "\nSuspendTimeout=5\nResumeTimeout=90\n");
}

std::vector<std::pair<std::string, absl::Status>> SlurmCluster::ServeResumeRequests(
    const std::function<void(const std::string&)>& before) {
  std::vector<std::pair<std::string, absl::Status>> served;
  for (const auto& n : options_.nodes) {
    const std::string request = Cat(base_, "/resume-", n);
    std::error_code ec;
    if (!fs::remove(request, ec)) continue;
    if (before) before(n);
    (void)StopSlurmd(n);
    served.emplace_back(n, StartSlurmd(n, /*as_rebooted=*/true));
  }
  return served;
}

void SlurmCluster::Stop() {
  if (base_.empty()) return;
  std::vector<std::string> daemons, rest;
  for (const auto& [name, pid] : pids_) (name == "munged" ? rest : daemons).push_back(name);
  Kill(daemons);
  Kill(rest);
  if (own_base_ && std::getenv("KGPU_KEEP_SLURM") == nullptr) {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }
  base_.clear();
}

void StopDetachedCluster(const std::string& base) {
  std::vector<pid_t> pids;
  std::error_code ec;
  std::vector<std::pair<bool, pid_t>> all;  // (is munged, pid)
  for (const auto& e : fs::directory_iterator(base + "/run", ec)) {
    const std::string name = e.path().filename();
    if (name.size() < 5 || name.substr(name.size() - 4) != ".pid" || name.find(".daemon.") != std::string::npos)
      continue;
    if (auto t = kgpu::ReadFile(e.path().string()))
      all.emplace_back(name == "munged.pid", static_cast<pid_t>(std::atoi(t->c_str())));
  }
  for (bool munge_pass : {false, true}) {
    for (const auto& [m, p] : all) {
      if (m == munge_pass && p > 0) ::kill(p, SIGTERM);
    }
    for (const auto& [m, p] : all) {
      if (m != munge_pass || p <= 0) continue;
      const pid_t pid = p;  // clang (C++20 as it implements it) cannot capture a structured binding
      if (!SlurmCluster::WaitFor([&] { return ::kill(pid, 0) != 0; }, std::chrono::seconds(20),
                                 std::chrono::milliseconds(50))) {
        ::kill(pid, SIGKILL);
      }
    }
  }
  fs::remove_all(base, ec);
}

}  // namespace kgpu::testing
