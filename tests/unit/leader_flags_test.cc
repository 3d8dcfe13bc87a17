// Leader election and durations on the command line of `kgpu extender` and `kgpu slurm-bridge
// run` (issue 35): kube-scheduler's --leader-elect* names and Go durations in both, bare numbers
// keeping their old unit, the old spellings hidden but accepted with a deprecation warning, and
// the test hook --crash-at hidden from --help. The command lines go through the functions main
// uses (AddExtenderFlags, AddSlurmBridgeCommands) and CLI11's parser.
#include <chrono>
#include <csignal>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include "cli/extender_cmd.h"
#include "cli/slurm_cmd.h"
#include "slurm/bridge.h"

namespace kgpu::cli {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::seconds;

// What parsing one command line gave.
struct Parsed {
  bool ok = true;
  int exit_code = 0;  // CLI11's; main turns every nonzero one into 2 (usage)
  std::string error;  // CLI11's message
  std::string err;    // what went to stderr while parsing (deprecation warnings)
};

Parsed ParseArgs(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"kgpu"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  Parsed p;
  ::testing::internal::CaptureStderr();
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    p.ok = false;
    p.exit_code = e.get_exit_code();
    p.error = e.what();
  }
  p.err = ::testing::internal::GetCapturedStderr();
  return p;
}

size_t Count(std::string_view text, std::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string_view::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// `kgpu extender ARGS...` as main declares it.
struct ExtenderCli {
  CLI::App app{"kgpu"};
  ExtenderFlags flags;
  CLI::App* cmd = nullptr;
  ExtenderCli() {
    cmd = app.add_subcommand("extender", "kube-scheduler extender");
    AddExtenderFlags(cmd, &flags);
  }
  Parsed Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "extender");
    return ParseArgs(app, args);
  }
};

// `kgpu slurm-bridge run|status ARGS...` as main declares it.
struct BridgeCli {
  CLI::App app{"kgpu"};
  SlurmBridgeFlags flags;
  SlurmBridgeCommands cmds;
  BridgeCli() { cmds = AddSlurmBridgeCommands(&app, &flags); }
  Parsed Parse(std::vector<std::string> args, const std::string& sub = "run") {
    args.insert(args.begin(), {"slurm-bridge", sub});
    return ParseArgs(app, args);
  }
};

std::string Warning(const std::string& cmd, const std::string& old_name, const std::string& use) {
  return cmd + ": " + old_name + " is deprecated, use " + use + " (removed in the next release)\n";
}

TEST(DurationFlag, GoDurationsAndBareNumbersInTheOldUnit) {
  const DurationFlagSpec secs{.bare_unit = "s"};
  auto d = ParseDurationFlag("--x", "1h30m", secs, seconds(1));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, minutes(90));
  d = ParseDurationFlag("--x", "90", secs, seconds(1));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, seconds(90));
  d = ParseDurationFlag("--x", "0.25", secs, milliseconds(1));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, milliseconds(250));
  d = ParseDurationFlag("--x", "300", {.bare_unit = "ms"}, milliseconds(1));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, milliseconds(300));
  d = ParseDurationFlag("--x", "0", {}, milliseconds(1));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->count(), 0);
  // Go's form only: a bare number is refused, naming the flag and the value.
  d = ParseDurationFlag("--interval", "300", {}, milliseconds(1));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("--interval '300'"), std::string_view::npos) << d.status();
  d = ParseDurationFlag("--cooldown", "1500ms", secs, seconds(1));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("--cooldown '1500ms': must be a whole number of seconds"), std::string_view::npos)
      << d.status();
  d = ParseDurationFlag("--x", "-1s", secs, seconds(1));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("must be at least 0s"), std::string_view::npos) << d.status();
  d = ParseDurationFlag("--x", "2h", {.max = hours(1)}, seconds(1));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("must be at most 1h0m0s"), std::string_view::npos) << d.status();
}

// ---------------------------------------------------------------------------------------------
// kgpu extender

TEST(ExtenderLeaderFlags, DefaultsAreKubeSchedulers) {
  ExtenderCli x;
  const Parsed p = x.Parse({});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_FALSE(x.flags.leader.enabled);
  EXPECT_EQ(x.flags.leader.resource_namespace, "kube-system");
  EXPECT_EQ(x.flags.leader.resource_name, "kgpu-extender");
  EXPECT_EQ(x.flags.leader.lease_duration, seconds(15));
  EXPECT_EQ(x.flags.leader.renew_deadline, seconds(10));
  EXPECT_EQ(x.flags.leader.retry_period, seconds(2));
  EXPECT_EQ(x.flags.options.state.preemption_hold, seconds(60));
  EXPECT_EQ(p.err, "");
}

TEST(ExtenderLeaderFlags, KubeSchedulersNamesAndGoDurations) {
  ExtenderCli x;
  const Parsed p =
      x.Parse({"--leader-elect", "--leader-elect-resource-namespace", "kgpu-system", "--leader-elect-resource-name",
               "ext", "--leader-elect-lease-duration=15s", "--leader-elect-renew-deadline", "9s",
               "--leader-elect-retry-period", "1500ms", "--preemption-hold", "2m", "--identity", "replica-1"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_TRUE(x.flags.leader.enabled);
  EXPECT_EQ(x.flags.leader.resource_namespace, "kgpu-system");
  EXPECT_EQ(x.flags.leader.resource_name, "ext");
  EXPECT_EQ(x.flags.leader.lease_duration, seconds(15));
  EXPECT_EQ(x.flags.leader.renew_deadline, seconds(9));
  EXPECT_EQ(x.flags.leader.retry_period, milliseconds(1500));
  EXPECT_EQ(x.flags.options.state.preemption_hold, minutes(2));
  EXPECT_EQ(x.flags.options.identity, "replica-1");
  EXPECT_EQ(p.err, "") << "no deprecation warning for the new names";
}

TEST(ExtenderLeaderFlags, LeaderElectTakesTrueAndFalse) {
  {
    ExtenderCli x;
    ASSERT_TRUE(x.Parse({"--leader-elect=true"}).ok);
    EXPECT_TRUE(x.flags.leader.enabled);
  }
  {
    ExtenderCli x;
    ASSERT_TRUE(x.Parse({"--leader-elect=false"}).ok);
    EXPECT_FALSE(x.flags.leader.enabled);
  }
}

// The extender took float seconds before: a bare number still counts seconds.
TEST(ExtenderLeaderFlags, BareNumbersKeepCountingSeconds) {
  ExtenderCli x;
  const Parsed p = x.Parse({"--leader-elect-lease-duration", "2", "--leader-elect-renew-deadline", "1.5",
                            "--leader-elect-retry-period", "0.25", "--preemption-hold", "90"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(x.flags.leader.lease_duration, seconds(2));
  EXPECT_EQ(x.flags.leader.renew_deadline, milliseconds(1500));
  EXPECT_EQ(x.flags.leader.retry_period, milliseconds(250));
  EXPECT_EQ(x.flags.options.state.preemption_hold, seconds(90));
  EXPECT_EQ(p.err, "");
}

TEST(ExtenderLeaderFlags, ABadDurationIsAUsageErrorNamingTheFlag) {
  {
    ExtenderCli x;
    const Parsed p = x.Parse({"--leader-elect-lease-duration", "15x"});
    ASSERT_FALSE(p.ok);
    EXPECT_NE(p.exit_code, 0);  // main: 2
    EXPECT_NE(p.error.find("--leader-elect-lease-duration"), std::string::npos) << p.error;
    EXPECT_NE(p.error.find("'15x'"), std::string::npos) << p.error;
  }
  {
    ExtenderCli x;
    const Parsed p = x.Parse({"--preemption-hold", "2h"});
    ASSERT_FALSE(p.ok);
    EXPECT_NE(p.error.find("--preemption-hold"), std::string::npos) << p.error;
    EXPECT_NE(p.error.find("at most 1h0m0s"), std::string::npos) << p.error;
  }
  // Out of order (retry < renew < lease, as kube-scheduler requires): exit 2 before the
  // kubeconfig is read.
  ExtenderCli x;
  ASSERT_TRUE(x.Parse({"--leader-elect-renew-deadline", "20s"}).ok);
  volatile std::sig_atomic_t stop = 1;
  std::ostringstream err;
  EXPECT_EQ(RunExtender(x.flags, &stop, err), 2);
  EXPECT_NE(err.str().find("--leader-elect-retry-period (2s) < --leader-elect-renew-deadline (20s) < "
                           "--leader-elect-lease-duration (15s) is required"),
            std::string::npos)
      << err.str();
}

TEST(ExtenderLeaderFlags, OldSpellingsStillWorkAndWarnOnce) {
  ExtenderCli x;
  const Parsed p = x.Parse({"--leader-elect", "--lease-namespace", "ns-1", "--lease-name", "lease-1"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(x.flags.leader.resource_namespace, "ns-1");
  EXPECT_EQ(x.flags.leader.resource_name, "lease-1");
  EXPECT_EQ(Count(p.err, Warning("kgpu extender", "--lease-namespace", "--leader-elect-resource-namespace")), 1u)
      << p.err;
  EXPECT_EQ(Count(p.err, Warning("kgpu extender", "--lease-name", "--leader-elect-resource-name")), 1u) << p.err;
  // Both spellings at once: refused rather than one silently winning.
  ExtenderCli y;
  const Parsed both = y.Parse({"--lease-name", "a", "--leader-elect-resource-name", "b"});
  EXPECT_FALSE(both.ok);
  EXPECT_NE(both.error.find("--lease-name"), std::string::npos) << both.error;
}

TEST(ExtenderLeaderFlags, HelpListsTheNewNamesOnly) {
  ExtenderCli x;
  const std::string help = x.cmd->help();
  for (const char* flag :
       {"--leader-elect ", "--leader-elect-resource-namespace", "--leader-elect-resource-name",
        "--leader-elect-lease-duration DURATION=15s", "--leader-elect-renew-deadline DURATION=10s",
        "--leader-elect-retry-period DURATION=2s", "--preemption-hold DURATION=1m0s", "--identity"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag << "\n" << help;
  }
  for (const char* old : {"--lease-namespace", "--lease-name"}) {
    EXPECT_EQ(help.find(old), std::string::npos) << old << "\n" << help;
  }
}

// ---------------------------------------------------------------------------------------------
// kgpu slurm-bridge run

TEST(BridgeLeaderFlags, DefaultsAreKubeSchedulersWithElectionOn) {
  BridgeCli b;
  const Parsed p = b.Parse({});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_TRUE(b.flags.leader.enabled);
  EXPECT_EQ(b.flags.leader.resource_namespace, "kube-system");
  EXPECT_EQ(b.flags.leader.resource_name, "kgpu-slurm-bridge");
  EXPECT_EQ(b.flags.leader.lease_duration, seconds(15));
  EXPECT_EQ(b.flags.leader.renew_deadline, seconds(10));
  EXPECT_EQ(b.flags.leader.retry_period, seconds(2));
  EXPECT_EQ(b.flags.interval, seconds(2));
  EXPECT_EQ(b.flags.confirm_gap, seconds(1));
  EXPECT_EQ(b.flags.slurm_timeout, seconds(10));
  EXPECT_EQ(b.flags.lend_threshold, seconds(30));
  EXPECT_EQ(b.flags.cooldown, seconds(120));
  EXPECT_EQ(b.flags.lend_hysteresis, seconds(60));
  EXPECT_EQ(b.flags.resume_retry, seconds(20));
  EXPECT_EQ(b.flags.resume_timeout, seconds(60));
  EXPECT_EQ(p.err, "");
}

TEST(BridgeLeaderFlags, KubeSchedulersNamesAndGoDurations) {
  BridgeCli b;
  const Parsed p = b.Parse({"--leader-elect=false",
                            "--leader-elect-resource-namespace",
                            "kgpu-system",
                            "--leader-elect-resource-name",
                            "bridge",
                            "--leader-elect-lease-duration=15s",
                            "--leader-elect-renew-deadline",
                            "8s",
                            "--leader-elect-retry-period",
                            "500ms",
                            "--interval",
                            "300ms",
                            "--confirm-gap",
                            "1.5s",
                            "--slurm-timeout",
                            "4s",
                            "--lend-threshold",
                            "1m",
                            "--reclaim-threshold",
                            "10m",
                            "--cooldown",
                            "0",
                            "--lend-hysteresis",
                            "90s",
                            "--lend-duration",
                            "1h",
                            "--force-delete-after",
                            "5m",
                            "--resume-retry",
                            "20s",
                            "--resume-timeout",
                            "2m",
                            "--identity",
                            "b-1"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_FALSE(b.flags.leader.enabled);
  EXPECT_EQ(b.flags.leader.resource_namespace, "kgpu-system");
  EXPECT_EQ(b.flags.leader.resource_name, "bridge");
  EXPECT_EQ(b.flags.leader.lease_duration, seconds(15));
  EXPECT_EQ(b.flags.leader.renew_deadline, seconds(8));
  EXPECT_EQ(b.flags.leader.retry_period, milliseconds(500));
  EXPECT_EQ(b.flags.interval, milliseconds(300));
  EXPECT_EQ(b.flags.confirm_gap, milliseconds(1500));
  EXPECT_EQ(b.flags.slurm_timeout, seconds(4));
  EXPECT_EQ(b.flags.lend_threshold, minutes(1));
  EXPECT_EQ(b.flags.reclaim_threshold, minutes(10));
  EXPECT_EQ(b.flags.cooldown, seconds(0));
  EXPECT_EQ(b.flags.lend_hysteresis, seconds(90));
  EXPECT_EQ(b.flags.lend_duration, hours(1));
  EXPECT_EQ(b.flags.force_delete_after, minutes(5));
  EXPECT_EQ(b.flags.resume_retry, seconds(20));
  EXPECT_EQ(b.flags.resume_timeout, minutes(2));
  EXPECT_EQ(b.flags.identity, "b-1");
  EXPECT_EQ(p.err, "");
  BridgeCli on;
  ASSERT_TRUE(on.Parse({"--leader-elect=true"}).ok);
  EXPECT_TRUE(on.flags.leader.enabled);
}

// The seconds flags took a plain number of seconds before: it still counts seconds.
TEST(BridgeLeaderFlags, BareNumbersKeepCountingSeconds) {
  BridgeCli b;
  const Parsed p = b.Parse({"--lend-threshold", "1", "--cooldown", "0", "--lend-hysteresis", "600",
                            "--reclaim-threshold", "600", "--lend-duration", "3600", "--resume-retry", "5"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(b.flags.lend_threshold, seconds(1));
  EXPECT_EQ(b.flags.cooldown, seconds(0));
  EXPECT_EQ(b.flags.lend_hysteresis, seconds(600));
  EXPECT_EQ(b.flags.reclaim_threshold, seconds(600));
  EXPECT_EQ(b.flags.lend_duration, hours(1));
  EXPECT_EQ(b.flags.resume_retry, seconds(5));
}

TEST(BridgeLeaderFlags, ABadDurationIsAUsageErrorNamingTheFlag) {
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"--interval", "2x"},
                                                        {"--leader-elect-lease-duration", "soon"},
                                                        {"--leader-elect-retry-period", "-2s"},
                                                        {"--lend-threshold", "1500ms"},
                                                        {"--slurm-timeout", "10"},  // a new flag: Go's form only
                                                        {"--lease-duration-ms", "abc"}}) {
    BridgeCli b;
    const Parsed p = b.Parse({flag + "=" + value});
    ASSERT_FALSE(p.ok) << flag << "=" << value;
    EXPECT_NE(p.exit_code, 0);  // main: 2
    EXPECT_NE(p.error.find(flag), std::string::npos) << p.error;
    EXPECT_NE(p.error.find("'" + value + "'"), std::string::npos) << p.error;
  }
  // Out of order: exit 2 before anything is contacted (no kubeconfig needed).
  BridgeCli b;
  ASSERT_TRUE(b.Parse({"--leader-elect-lease-duration", "5s", "--leader-elect-renew-deadline", "10s"}).ok);
  volatile std::sig_atomic_t stop = 1;
  std::ostringstream out;
  EXPECT_EQ(RunSlurmBridge(b.flags, &stop, out), 2);
  EXPECT_NE(out.str().find("--leader-elect-retry-period (2s) < --leader-elect-renew-deadline (10s) < "
                           "--leader-elect-lease-duration (5s) is required"),
            std::string::npos)
      << out.str();
}

TEST(BridgeLeaderFlags, OldSpellingsKeepTheirUnitsAndWarnOnce) {
  BridgeCli b;
  const Parsed p = b.Parse({"--no-leader-elect", "--leader-namespace", "ns-1", "--leader-name", "lease-1",
                            "--lease-duration-ms", "3000", "--renew-deadline-ms", "2000", "--retry-period-ms", "300",
                            "--interval-ms", "300", "--confirm-gap-ms", "500", "--slurm-timeout-ms", "4000"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_FALSE(b.flags.leader.enabled);
  EXPECT_EQ(b.flags.leader.resource_namespace, "ns-1");
  EXPECT_EQ(b.flags.leader.resource_name, "lease-1");
  EXPECT_EQ(b.flags.leader.lease_duration, milliseconds(3000));
  EXPECT_EQ(b.flags.leader.renew_deadline, milliseconds(2000));
  EXPECT_EQ(b.flags.leader.retry_period, milliseconds(300));
  EXPECT_EQ(b.flags.interval, milliseconds(300));
  EXPECT_EQ(b.flags.confirm_gap, milliseconds(500));
  EXPECT_EQ(b.flags.slurm_timeout, milliseconds(4000));
  const std::string cmd = "kgpu slurm-bridge run";
  for (const auto& [old_name, use] :
       std::vector<std::pair<std::string, std::string>>{{"--no-leader-elect", "--leader-elect=false"},
                                                        {"--leader-namespace", "--leader-elect-resource-namespace"},
                                                        {"--leader-name", "--leader-elect-resource-name"},
                                                        {"--lease-duration-ms", "--leader-elect-lease-duration"},
                                                        {"--renew-deadline-ms", "--leader-elect-renew-deadline"},
                                                        {"--retry-period-ms", "--leader-elect-retry-period"},
                                                        {"--interval-ms", "--interval"},
                                                        {"--confirm-gap-ms", "--confirm-gap"},
                                                        {"--slurm-timeout-ms", "--slurm-timeout"}}) {
    EXPECT_EQ(Count(p.err, Warning(cmd, old_name, use)), 1u) << old_name << "\n" << p.err;
  }
  EXPECT_EQ(Count(p.err, "is deprecated"), 9u) << p.err;
  // The other commands take --slurm-timeout-ms too, and say which command warned.
  BridgeCli s;
  const Parsed st = s.Parse({"--slurm-timeout-ms", "3000"}, "status");
  ASSERT_TRUE(st.ok) << st.error;
  EXPECT_EQ(s.flags.slurm_timeout, milliseconds(3000));
  EXPECT_EQ(Count(st.err, Warning("kgpu slurm-bridge status", "--slurm-timeout-ms", "--slurm-timeout")), 1u) << st.err;
}

TEST(BridgeLeaderFlags, HelpListsTheNewNamesAndHidesTheTestHook) {
  BridgeCli b;
  const std::string help = b.cmds.run->help();
  for (const char* flag :
       {"--leader-elect ", "--leader-elect-resource-namespace", "--leader-elect-resource-name",
        "--leader-elect-lease-duration DURATION=15s", "--leader-elect-renew-deadline DURATION=10s",
        "--leader-elect-retry-period DURATION=2s", "--interval DURATION=2s", "--confirm-gap DURATION=1s",
        "--slurm-timeout DURATION=10s", "--lend-threshold DURATION=30s", "--cooldown DURATION=2m0s", "--identity"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag << "\n" << help;
  }
  for (const char* hidden :
       {"--crash-at", "--no-leader-elect", "--leader-namespace", "--leader-name", "--lease-duration-ms",
        "--renew-deadline-ms", "--retry-period-ms", "--interval-ms", "--confirm-gap-ms", "--slurm-timeout-ms"}) {
    EXPECT_EQ(help.find(hidden), std::string::npos) << hidden << "\n" << help;
  }
  EXPECT_EQ(b.cmds.status->help().find("--slurm-timeout-ms"), std::string::npos);
  // --crash-at is hidden, not gone.
  ASSERT_FALSE(slurm::kCrashPoints.empty());
  const Parsed p = b.Parse({"--crash-at", slurm::kCrashPoints.front()});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(b.flags.crash_at, slurm::kCrashPoints.front());
}

}  // namespace
}  // namespace kgpu::cli
