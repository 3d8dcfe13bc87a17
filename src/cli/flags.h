#pragma once
// Flag helpers every command shares: duration flags in Go's form, deprecated spellings kept for
// one release, and kube-scheduler's leader-election flags (`kgpu extender`, `kgpu slurm-bridge run`).
//
// Thread-safety: set-up code, single-threaded.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kgpu::cli {

// ---------------------------------------------------------------------------------------------
// Duration flags. Go's form (time.ParseDuration: "15s", "2m", "1h30m", "250ms", as kube-scheduler's
// flags take them) is the canonical spelling of every duration flag. A flag that took a plain
// number before still takes one, counted in its old unit, so existing command lines keep their
// meaning.

struct DurationFlagSpec {
  // "s" or "ms": a bare number ("30", "0.25") counts in this unit (the flag's old form); "": Go's
  // form only (and "0").
  std::string_view bare_unit = {};
  std::chrono::nanoseconds min{0};
  std::chrono::nanoseconds max = std::chrono::nanoseconds::max();
};

// `text` as the duration flag `flag` reads it: Go's form or a bare number in spec.bare_unit,
// within [spec.min, spec.max] and a whole number of `resolution` (what the setting counts in: a
// second, a millisecond). InvalidArgument naming `flag` (when not empty) and the value otherwise.
absl::StatusOr<std::chrono::nanoseconds> ParseDurationFlag(std::string_view flag, std::string_view text,
                                                           const DurationFlagSpec& spec,
                                                           std::chrono::nanoseconds resolution);

// The option `name` (type DURATION, its default shown in Go's form from `current`), read by
// ParseDurationFlag when given; a bad value is a CLI11 ValidationError naming the flag (exit 2).
// `set` takes the value.
CLI::Option* AddDurationOptionNs(CLI::App* app, const std::string& name, std::chrono::nanoseconds current,
                                 std::chrono::nanoseconds resolution, std::function<void(std::chrono::nanoseconds)> set,
                                 const std::string& help, const DurationFlagSpec& spec);

// The same, storing into *out (std::chrono::seconds, milliseconds, ...: its period is the
// resolution; its value is the default shown).
template <typename Rep, typename Period>
CLI::Option* AddDurationOption(CLI::App* app, const std::string& name, std::chrono::duration<Rep, Period>* out,
                               const std::string& help, const DurationFlagSpec& spec = {}) {
  using D = std::chrono::duration<Rep, Period>;
  return AddDurationOptionNs(
      app, name, std::chrono::duration_cast<std::chrono::nanoseconds>(*out),
      std::chrono::duration_cast<std::chrono::nanoseconds>(D(1)),
      [out](std::chrono::nanoseconds d) { *out = std::chrono::duration_cast<D>(d); }, help, spec);
}

// ---------------------------------------------------------------------------------------------
// Deprecated spellings, accepted for one release: hidden from --help (CLI11's empty group); when
// one is used, one warning on stderr: "<cmd>: <old> is deprecated, use <use> (removed in the next
// release)" (`cmd` is e.g. "kgpu extender"), then `set` takes the value as given (a callback may
// throw CLI::ValidationError for a bad one).

std::string DeprecationWarning(std::string_view cmd, std::string_view old_name, std::string_view use);
CLI::Option* AddDeprecatedOption(CLI::App* app, const std::string& cmd, const std::string& old_name,
                                 const std::string& use, std::function<void(const std::string&)> set);
// A flag (no value): `set` gets CLI11's count (1; -1 for --flag=false).
CLI::Option* AddDeprecatedFlag(CLI::App* app, const std::string& cmd, const std::string& old_name,
                               const std::string& use, std::function<void(std::int64_t)> set);
// A duration in its old unit (spec.bare_unit; Go's form too), into *out (its period the resolution).
template <typename Rep, typename Period>
CLI::Option* AddDeprecatedDurationOption(CLI::App* app, const std::string& cmd, const std::string& old_name,
                                         const std::string& use, std::chrono::duration<Rep, Period>* out,
                                         const DurationFlagSpec& spec) {
  using D = std::chrono::duration<Rep, Period>;
  return AddDeprecatedOption(app, cmd, old_name, use, [old_name, out, spec](const std::string& text) {
    auto d = ParseDurationFlag("", text, spec, std::chrono::duration_cast<std::chrono::nanoseconds>(D(1)));
    if (!d.ok()) throw CLI::ValidationError(old_name, std::string(d.status().message()));
    *out = std::chrono::duration_cast<D>(*d);
  });
}

// ---------------------------------------------------------------------------------------------
// kube-scheduler's leader-election flags (component-base's LeaderElectionConfiguration, the
// names, defaults and Go durations kube-scheduler takes): --leader-elect[=true|false],
// --leader-elect-lease-duration, --leader-elect-renew-deadline, --leader-elect-retry-period,
// --leader-elect-resource-namespace, --leader-elect-resource-name. A bare number in a duration
// counts seconds (the extender's earlier form).
struct LeaderElectFlags {
  bool enabled = false;
  std::string resource_namespace = "kube-system";
  std::string resource_name;
  std::chrono::milliseconds lease_duration{15000}, renew_deadline{10000}, retry_period{2000};
};
// `what` ends the --leader-elect help ("only the Lease holder serves").
void AddLeaderElectFlags(CLI::App* app, LeaderElectFlags* flags, const std::string& what);
// retry period < renew deadline < lease duration, as kube-scheduler requires: InvalidArgument
// naming the three flags otherwise.
absl::Status CheckLeaderElectFlags(const LeaderElectFlags& flags);

}  // namespace kgpu::cli
