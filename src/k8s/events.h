#pragma once
// An Event recorder (events.k8s.io/v1) that aggregates repeats as client-go's events
// broadcaster does: the first occurrence creates an Event; a repeat of the same
// (regarding object, reason, action, type, note) within `series_window` patches the existing
// Event's series (count, lastObservedTime) instead of creating another.
//
// Thread-safety: Record() may be called from any thread (it serialises its API calls).

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "k8s/client.h"

namespace kgpu::k8s {

struct ObjectRef {
  std::string api_version = "v1";
  std::string kind;
  std::string ns;
  std::string name;
  std::string uid;
};

class EventRecorder {
 public:
  EventRecorder(Client& client, std::string controller, std::string instance,
                std::chrono::seconds series_window = std::chrono::minutes(6));
  // type: "Normal" or "Warning". The Event goes to the regarding object's namespace
  // ("default" for cluster-scoped objects, as kubelet does for Nodes).
  absl::Status Record(const ObjectRef& regarding, std::string_view type, std::string_view reason,
                      std::string_view action, std::string_view note);

 private:
  struct Seen {
    std::string ns, name;
    int64_t count = 1;
    std::chrono::steady_clock::time_point last;
  };
  Client& client_;
  std::string controller_, instance_;
  std::chrono::seconds window_;
  std::mutex mu_;
  std::map<std::string, Seen> seen_;
};

}  // namespace kgpu::k8s
