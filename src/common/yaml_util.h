#pragma once
// Helpers for strict YAML config parsers: every error names the input and the position,
// "<origin>:<line>:<column>: <what is wrong>", unknown keys are errors, and scalars convert with
// a message instead of an exception.
//
// Thread-safety: pure functions.

#include <yaml-cpp/yaml.h>

#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/strings.h"

namespace kgpu::yaml {

absl::Status At(std::string_view origin, const YAML::Mark& mark, std::string_view what);

// Fails on any key of `map` not in `allowed`; `where` names the mapping in the message.
absl::Status CheckKeys(std::string_view origin, const YAML::Node& map, std::string_view where,
                       const std::set<std::string>& allowed);

template <typename T>
absl::StatusOr<T> Scalar(std::string_view origin, const YAML::Node& node, std::string_view what) {
  if (!node.IsScalar()) return At(origin, node.Mark(), Cat(what, " must be a single value"));
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    return At(origin, node.Mark(), Cat(what, " has an invalid value '", node.Scalar(), "'"));
  }
}

// Loads a document; syntax errors come back positioned.
absl::StatusOr<YAML::Node> Load(std::string_view text, std::string_view origin);

}  // namespace kgpu::yaml
