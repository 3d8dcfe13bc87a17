#include "cli/flags.h"

#include <iostream>

#include "common/duration.h"
#include "common/strings.h"

namespace kgpu::cli {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Digits with at most one decimal point ("30", "0.25"): a duration flag's old, unit-less form.
bool IsBareNumber(std::string_view s) {
  bool digits = false, dot = false;
  for (const char c : s) {
    if (c >= '0' && c <= '9') {
      digits = true;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      return false;
    }
  }
  return digits;
}

std::string UnitName(std::string_view bare_unit) {
  return bare_unit == "ms" ? "milliseconds" : bare_unit == "s" ? "seconds" : std::string(bare_unit);
}

}  // namespace

absl::StatusOr<std::chrono::nanoseconds> ParseDurationFlag(std::string_view flag, std::string_view text,
                                                           const DurationFlagSpec& spec,
                                                           std::chrono::nanoseconds resolution) {
  const bool bare = !spec.bare_unit.empty() && IsBareNumber(text);
  auto d = ParseGoDuration(flag, bare ? Cat(text, spec.bare_unit) : std::string(text));
  if (!d.ok()) {
    if (spec.bare_unit.empty()) return d.status();
    return absl::InvalidArgumentError(
        Cat(d.status().message(), "; a bare number counts ", UnitName(spec.bare_unit), " (the old form)"));
  }
  const std::string head = Cat(flag, flag.empty() ? "'" : " '", Printable(text), "'");
  if (*d < spec.min) return absl::InvalidArgumentError(Cat(head, ": must be at least ", FormatGoDuration(spec.min)));
  if (*d > spec.max) return absl::InvalidArgumentError(Cat(head, ": must be at most ", FormatGoDuration(spec.max)));
  if (resolution.count() > 1 && d->count() % resolution.count() != 0) {
    const std::string whole = resolution == seconds(1)        ? "a whole number of seconds"
                              : resolution == milliseconds(1) ? "a whole number of milliseconds"
                                                              : Cat("a multiple of ", FormatGoDuration(resolution));
    return absl::InvalidArgumentError(Cat(head, ": must be ", whole));
  }
  return *d;
}

CLI::Option* AddDurationOptionNs(CLI::App* app, const std::string& name, std::chrono::nanoseconds current,
                                 std::chrono::nanoseconds resolution, std::function<void(std::chrono::nanoseconds)> set,
                                 const std::string& help, const DurationFlagSpec& spec) {
  std::string text = help;
  text += spec.bare_unit.empty()
              ? " (a duration: 30s, 5m, 1h30m)"
              : Cat(" (a duration: 30s, 5m, 1h30m; a bare number counts ", UnitName(spec.bare_unit), ", the old form)");
  CLI::Option* opt = app->add_option_function<std::string>(
      name,
      [name, resolution, spec, apply = std::move(set)](const std::string& value) {
        auto d = ParseDurationFlag("", value, spec, resolution);
        // CLI11 names the flag before the message; main turns this into exit code 2.
        if (!d.ok()) throw CLI::ValidationError(name, std::string(d.status().message()));
        apply(*d);
      },
      text);
  opt->type_name("DURATION");
  opt->default_str(FormatGoDuration(current));
  return opt;
}

std::string DeprecationWarning(std::string_view cmd, std::string_view old_name, std::string_view use) {
  return Cat(cmd, ": ", old_name, " is deprecated, use ", use, " (removed in the next release)");
}

CLI::Option* AddDeprecatedOption(CLI::App* app, const std::string& cmd, const std::string& old_name,
                                 const std::string& use, std::function<void(const std::string&)> set) {
  // Given together with its replacement, the two would race (callbacks run in declaration order):
  // refused instead.
  const CLI::Option* replacement = app->get_option_no_throw(use);
  CLI::Option* opt = app->add_option_function<std::string>(
      old_name,
      [old_name, use, replacement, warning = DeprecationWarning(cmd, old_name, use),
       apply = std::move(set)](const std::string& value) {
        if (replacement != nullptr && replacement->count() > 0) {
          throw CLI::ValidationError(old_name, Cat("give ", use, " only (", old_name, " is its deprecated spelling)"));
        }
        std::cerr << warning << "\n";
        apply(value);
      },
      "");
  opt->group("");
  return opt;
}

CLI::Option* AddDeprecatedFlag(CLI::App* app, const std::string& cmd, const std::string& old_name,
                               const std::string& use, std::function<void(std::int64_t)> set) {
  const std::function<void(std::int64_t)> fn = [warning = DeprecationWarning(cmd, old_name, use),
                                                apply = std::move(set)](std::int64_t count) {
    std::cerr << warning << "\n";
    apply(count);
  };
  CLI::Option* opt = app->add_flag_function(old_name, fn, "");
  opt->group("");
  return opt;
}

void AddLeaderElectFlags(CLI::App* app, LeaderElectFlags* f, const std::string& what) {
  app->add_flag("--leader-elect", f->enabled,
                Cat("run as one of several replicas: ", what,
                    f->enabled ? " (default: on; --leader-elect=false for a single replica)" : " (default: off)"));
  app->add_option("--leader-elect-resource-namespace", f->resource_namespace, "namespace of the leader Lease")
      ->capture_default_str();
  app->add_option("--leader-elect-resource-name", f->resource_name, "name of the leader Lease")->capture_default_str();
  // kube-scheduler's defaults (15s, 10s, 2s). A bare number counts seconds: the extender took them so.
  const DurationFlagSpec spec{.bare_unit = "s", .min = milliseconds(10), .max = hours(24)};
  AddDurationOption(app, "--leader-elect-lease-duration", &f->lease_duration,
                    "how long a non-leader waits after the last renewal before it takes the Lease", spec);
  AddDurationOption(app, "--leader-elect-renew-deadline", &f->renew_deadline,
                    "how long the leader keeps trying to renew before it stops leading (< lease duration)", spec);
  AddDurationOption(app, "--leader-elect-retry-period", &f->retry_period,
                    "how long between attempts to acquire or renew (< renew deadline)", spec);
}

absl::Status CheckLeaderElectFlags(const LeaderElectFlags& f) {
  if (f.renew_deadline >= f.lease_duration || f.retry_period >= f.renew_deadline) {
    return absl::InvalidArgumentError(Cat("--leader-elect-retry-period (", FormatGoDuration(f.retry_period),
                                          ") < --leader-elect-renew-deadline (", FormatGoDuration(f.renew_deadline),
                                          ") < --leader-elect-lease-duration (", FormatGoDuration(f.lease_duration),
                                          ") is required, as in kube-scheduler"));
  }
  return absl::OkStatus();
}

}  // namespace kgpu::cli
