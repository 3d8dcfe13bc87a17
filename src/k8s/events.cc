#include "k8s/events.h"

#include <cstdio>
#include <random>

#include "common/strings.h"
#include "k8s/resources.h"

namespace kgpu::k8s {

EventRecorder::EventRecorder(Client& client, std::string controller, std::string instance,
                             std::chrono::seconds series_window)
    : client_(client), controller_(std::move(controller)), instance_(std::move(instance)), window_(series_window) {}

absl::Status EventRecorder::Record(const ObjectRef& regarding, std::string_view type, std::string_view reason,
                                   std::string_view action, std::string_view note) {
  const Resource* events = FindResource("events");
  for (const auto& r : Resources()) {
    if (r.group == "events.k8s.io") events = &r;
  }
  const std::string ns = regarding.ns.empty() ? "default" : regarding.ns;
  const std::string key = Cat(regarding.kind, "/", ns, "/", regarding.name, "/", regarding.uid, "|", reason, "|",
                              action, "|", type, "|", note);
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  // Forget series older than the window so the map stays bounded.
  for (auto it = seen_.begin(); it != seen_.end();) {
    it = now - it->second.last > window_ ? seen_.erase(it) : std::next(it);
  }
  if (auto it = seen_.find(key); it != seen_.end()) {
    Seen& s = it->second;
    const nlohmann::json patch = {{"series", {{"count", s.count + 1}, {"lastObservedTime", NowMicroTime()}}}};
    auto r = client_.Patch(events->Path(s.ns, s.name), patch, "application/merge-patch+json");
    if (r.ok()) {
      ++s.count;
      s.last = now;
      return absl::OkStatus();
    }
    if (!IsApiNotFound(r.status())) return r.status();
    seen_.erase(it);  // somebody deleted it: start a new one
  }
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
  const std::string name = Cat(regarding.name, ".", suffix);
  nlohmann::json ev = {
      {"apiVersion", "events.k8s.io/v1"},
      {"kind", "Event"},
      {"metadata", {{"name", name}, {"namespace", ns}}},
      {"eventTime", NowMicroTime()},
      {"reportingController", controller_},
      {"reportingInstance", instance_},
      {"action", action},
      {"reason", reason},
      {"note", std::string(note.substr(0, 1024))},
      {"type", type},
      {"regarding", {{"apiVersion", regarding.api_version}, {"kind", regarding.kind}, {"name", regarding.name}}},
  };
  if (!regarding.ns.empty()) ev["regarding"]["namespace"] = regarding.ns;
  if (!regarding.uid.empty()) ev["regarding"]["uid"] = regarding.uid;
  auto r = client_.Create(events->Path(ns), ev);
  if (!r.ok()) return r.status();
  seen_[key] = Seen{ns, name, 1, now};
  return absl::OkStatus();
}

}  // namespace kgpu::k8s
