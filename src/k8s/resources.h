#pragma once
// The API resources kgpu uses, with their group/version, kind and scope: one table for the
// client's paths and the API server stand-in's discovery.
//
// Thread-safety: immutable data and pure functions.

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgpu::k8s {

struct Resource {
  std::string_view group;    // "" for the core group
  std::string_view version;  // "v1"
  std::string_view plural;   // "pods"
  std::string_view kind;     // "Pod"
  bool namespaced;
  std::vector<std::string_view> short_names;
  std::vector<std::string_view> subresources;  // "status", "binding", "eviction"
  int since_minor = 0;  // the first Kubernetes 1.x serving this group/version (resource.k8s.io/v1: 34)

  std::string GroupVersion() const;  // "v1", "policy/v1"
  // "/api/v1" or "/apis/<group>/<version>".
  std::string Prefix() const;
  // The collection (name empty) or object path; ns empty for cluster scope or all namespaces.
  std::string Path(std::string_view ns = "", std::string_view name = "", std::string_view subresource = "") const;
};

const std::vector<Resource>& Resources();
// By plural ("pods"), kind ("Pod") or short name ("po").
const Resource* FindResource(std::string_view name);

// j[key] for reading an API object: an empty object when j is not an object or has no such key,
// or it is null (const operator[] on a missing key is undefined behaviour in nlohmann::json).
const nlohmann::json& Field(const nlohmann::json& j, std::string_view key);

// Percent-encodes a query value.
std::string UrlEncode(std::string_view s);

// RFC 3339 times as the API writes them: "2026-12-03T08:30:00Z" and MicroTime
// "2026-12-03T08:30:00.123456Z".
std::string NowRfc3339();
std::string NowMicroTime();
// RFC 3339 ("2025-01-02T03:04:05Z", "2025-01-02T03:04:05.5+01:00"), as metav1.Time reads it;
// nullopt when it does not parse. A time past system_clock's end (2262) is its end.
std::optional<std::chrono::system_clock::time_point> ParseRfc3339Time(std::string_view text);
// The same as seconds since the epoch.
std::optional<double> ParseRfc3339(std::string_view t);

}  // namespace kgpu::k8s
