#pragma once
// JSON text -> nlohmann::json through simdjson. kgpu works with nlohmann::json everywhere, but
// nlohmann's own parser spends ~5 ns per byte (0.65 ms on a filter request naming 5,000 nodes,
// more than the extender's decision); simdjson parses the same text ~20x faster, and converting
// its DOM costs only what is kept. A top-level array of strings (an extender request's NodeNames)
// can skip nlohmann altogether: `divert` names the keys whose string arrays come back as
// std::vector<std::string>.
//
// simdjson and nlohmann accept the same JSON (RFC 8259, UTF-8 validated) and produce equal values
// (the fuzz target checks it); where simdjson rejects a text, ParseJsonFast returns nullopt and the
// caller parses it again with nlohmann, whose error message names the byte that is wrong.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgpu {

struct FastJson {
  nlohmann::json doc;
  // Diverted top-level fields, in document order: key -> the strings. `doc` holds an empty array
  // under each such key, so field lookup on `doc` still sees it.
  std::vector<std::pair<std::string, std::vector<std::string>>> strings;
};

// nullopt: simdjson rejects the text (not JSON, invalid UTF-8, nested deeper than 1024).
// `divert(key)` is asked for each top-level key of an object whose value is an array of strings.
std::optional<FastJson> ParseJsonFast(std::string_view text, const std::function<bool(std::string_view)>& divert = {});

// A top-level array of objects that each have exactly a string member named `str_key` and an
// integer member named `int_key` (names compared ignoring ASCII case; an extender's
// HostPriorityList): the pairs, without a json value per element. nullopt for any other text,
// which the caller then decodes the general way (and explains).
std::optional<std::vector<std::pair<std::string, int64_t>>> ParseStringIntArrayFast(std::string_view text,
                                                                                    std::string_view str_key,
                                                                                    std::string_view int_key);

}  // namespace kgpu
