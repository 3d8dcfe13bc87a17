#pragma once
// resource.Quantity (k8s.io/apimachinery/pkg/api/resource) for the values kgpu handles: a
// decimal number with an optional suffix, decimal SI (m, k, M, G, T, P, E), binary SI (Ki,
// Mi, Gi, Ti, Pi, Ei) or an exponent (1e3). Held exactly in milli-units, which covers every
// CPU, memory and device count we meet; Format() writes the canonical form the API prints
// for integers ("2", "1Gi", "500m").
//
// Thread-safety: a value type.

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kgpu::k8s {

struct Quantity {
  int64_t milli = 0;
  bool binary = false;  // parsed with a binary suffix: formatted back with one when exact

  static std::optional<Quantity> Parse(std::string_view s);
  std::string Format() const;
  // The form kube-apiserver stores and prints (resource.Quantity's canonical String(): the largest
  // suffix that keeps the number whole, "8000" -> "8k", "1.5" -> "1500m", "1024Mi" -> "1Gi"; a
  // binary quantity below 1024 or with a fraction is written in decimal SI, "0.5Ki" -> "512").
  std::string Canonical() const;
  bool IsInteger() const { return milli % 1000 == 0; }
  int64_t Value() const { return milli / 1000; }  // whole units, truncated
  Quantity operator+(const Quantity& o) const { return {milli + o.milli, binary || o.binary}; }
  auto operator<=>(const Quantity& o) const { return milli <=> o.milli; }
  bool operator==(const Quantity& o) const { return milli == o.milli; }
};

}  // namespace kgpu::k8s
