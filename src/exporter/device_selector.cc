#include "exporter/device_selector.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/strings.h"

namespace kgpu::exporter {

absl::StatusOr<DeviceSelector> ParseDeviceSelector(std::string_view flag, std::string_view value) {
  const std::string who = flag.empty() ? Cat("'", value, "'") : Cat(flag, " '", value, "'");
  auto fail = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        Cat(who, ": ", what,
            " (use f, g, i, g:0,1, i:0,2-4 or g:0+i:1: f every GPU or, on MIG GPUs, every GPU "
            "instance; g GPUs by index; i GPU instances by GPU_I_ID)"));
  };
  DeviceSelector s;
  if (value.empty()) return fail("empty selector");
  s.flex = false;
  bool saw_flex = false, saw_g = false, saw_i = false;
  size_t start = 0;
  int parts = 0;
  while (start <= value.size()) {
    const size_t plus = value.find('+', start);
    const std::string_view part =
        value.substr(start, plus == std::string_view::npos ? std::string_view::npos : plus - start);
    start = plus == std::string_view::npos ? value.size() + 1 : plus + 1;
    ++parts;
    if (part.empty()) return fail("empty selector");
    const size_t colon = part.find(':');
    const std::string_view letter = part.substr(0, colon);
    const bool has_range = colon != std::string_view::npos;
    const std::string_view range = has_range ? part.substr(colon + 1) : std::string_view();
    if (range.find(':') != std::string_view::npos) return fail("there can only be one range per letter");
    std::vector<unsigned> ids;
    if (has_range) {
      if (range.empty()) return fail("a ':' needs a list of numbers after it");
      size_t at = 0;
      while (at <= range.size()) {
        const size_t comma = range.find(',', at);
        const std::string_view item =
            range.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
        at = comma == std::string_view::npos ? range.size() + 1 : comma + 1;
        auto number = [](std::string_view t) -> std::optional<unsigned> {
          if (t.empty() || t.size() > 6 ||
              !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }))
            return std::nullopt;
          return static_cast<unsigned>(std::stoul(std::string(t)));
        };
        const size_t dash = item.find('-');
        const auto first = number(item.substr(0, dash));
        const auto last = dash == std::string_view::npos ? first : number(item.substr(dash + 1));
        if (!first || !last) return fail(Cat("'", item, "' is not a number or a range <number>-<number>"));
        if (*first > *last) return fail(Cat("in the range '", item, "' the start is above the end"));
        if (*last - *first >= 1024 || ids.size() + (*last - *first) >= 1024) return fail("more than 1024 indices");
        for (unsigned i = *first; i <= *last; ++i) ids.push_back(i);
      }
    }
    if (letter == "f") {
      if (has_range) return fail("f takes no range");
      saw_flex = true;
    } else if (letter == "g") {
      if (saw_g) return fail("g appears twice");
      saw_g = true;
      s.gpus = true;
      s.gpu_ids = std::move(ids);
    } else if (letter == "i") {
      if (saw_i) return fail("i appears twice");
      saw_i = true;
      s.instances = true;
      s.instance_ids = std::move(ids);
    } else {
      return fail(Cat("the only letters are f, g and i, not '", letter, "'"));
    }
  }
  if (saw_flex && parts > 1) return fail("f cannot be combined with g or i");
  s.flex = saw_flex;
  return s;
}

}  // namespace kgpu::exporter
