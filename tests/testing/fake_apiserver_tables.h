#pragma once
// meta.k8s.io/v1 Tables as kube-apiserver's printers build them (pkg/printers/internalversion/
// printers.go, 1.32), for `kubectl get` (which asks `Accept: application/json;as=Table;...` and
// shows what the server's columns say; without a Table it shows only NAME and AGE). The server
// always generates the wide columns (priority 1); kubectl shows them with -o wide. Kinds: Pod,
// Node, Event (core and events.k8s.io), Namespace, ResourceQuota, PodDisruptionBudget, Lease;
// any other kind gets Name and Age.
//
// Thread-safety: pure functions (the ages read the clock).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgpu::testing {

// The Table of `items` (all of kind `kind`) at list version `rv`; each row's object is the item.
nlohmann::json TableOf(const std::string& kind, const std::vector<nlohmann::json>& items, const std::string& rv);

// apimachinery's duration.HumanDuration: how kubectl shows an age ("5m3s", "3h", "2d4h").
std::string HumanAge(double seconds);

}  // namespace kgpu::testing
