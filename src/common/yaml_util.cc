#include "common/yaml_util.h"

#include <algorithm>

namespace kgpu::yaml {

std::string Position(std::string_view origin, const YAML::Mark& mark) {
  // yaml-cpp marks are 0-based; a null mark (-1) means "no position known".
  const int line = mark.line < 0 ? 1 : mark.line + 1;
  const int column = mark.column < 0 ? 1 : mark.column + 1;
  return Cat(Printable(origin), ":", line, ":", column);
}

absl::Status At(std::string_view origin, const YAML::Mark& mark, std::string_view what) {
  return absl::InvalidArgumentError(Cat(Position(origin, mark), ": ", Printable(what)));
}

absl::Status CheckKeys(std::string_view origin, const YAML::Node& map, std::string_view where,
                       const std::set<std::string>& allowed) {
  if (!map.IsMap()) return At(origin, map.Mark(), Cat(where, " must be a mapping"));
  for (const auto& kv : map) {
    if (!kv.first.IsScalar())
      return At(origin, kv.first.Mark(), Cat("a key in ", where, " must be a name, not a list or a mapping"));
    const auto key = kv.first.as<std::string>();
    if (allowed.count(key) == 0) {
      const std::string near = Nearest(key, allowed, std::max<size_t>(2, key.size() / 4));
      return At(origin, kv.first.Mark(),
                Cat("unknown key '", key, "' in ", where, near.empty() ? "" : Cat(" (did you mean ", near, "?)"),
                    " (allowed: ", Join(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<YAML::Node> Load(std::string_view text, std::string_view origin) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return At(origin, e.mark, Cat("not valid YAML: ", e.msg));
  }
}

}  // namespace kgpu::yaml
