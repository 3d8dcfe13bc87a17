#include "common/fast_json.h"

#include <cctype>
#include <cstdint>
#include <memory>

#include <simdjson.h>

namespace kgpu {
namespace {
using json = nlohmann::json;
namespace dom = simdjson::dom;

// Values as nlohmann's parser types them: non-negative integers are number_unsigned.
json Convert(dom::element e) {
  switch (e.type()) {
    case dom::element_type::ARRAY: {
      json out = json::array();
      auto& v = out.get_ref<json::array_t&>();
      dom::array a;
      if (e.get_array().get(a) != simdjson::SUCCESS) return out;  // the type was checked
      v.reserve(a.size());
      for (dom::element x : a) v.push_back(Convert(x));
      return out;
    }
    case dom::element_type::OBJECT: {
      json out = json::object();
      dom::object o;
      if (e.get_object().get(o) != simdjson::SUCCESS) return out;
      for (dom::key_value_pair f : o)
        out[std::string(f.key)] = Convert(f.value);  // a repeated key: the last wins, as nlohmann
      return out;
    }
    case dom::element_type::INT64: {
      const int64_t v = e.get_int64().value_unsafe();
      return v >= 0 ? json(static_cast<uint64_t>(v)) : json(v);
    }
    case dom::element_type::UINT64:
      return json(e.get_uint64().value_unsafe());
    case dom::element_type::DOUBLE:
      return json(e.get_double().value_unsafe());
    case dom::element_type::STRING:
      return json(std::string(e.get_string().value_unsafe()));
    case dom::element_type::BOOL:
      return json(e.get_bool().value_unsafe());
    case dom::element_type::NULL_VALUE:
      return json(nullptr);
  }
  return json();
}

// An array whose every element is a string, copied out; nullopt otherwise.
std::optional<std::vector<std::string>> StringArray(dom::element e) {
  if (e.type() != dom::element_type::ARRAY) return std::nullopt;
  dom::array a;
  if (e.get_array().get(a) != simdjson::SUCCESS) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(a.size());
  for (dom::element x : a) {
    if (x.type() != dom::element_type::STRING) return std::nullopt;
    out.emplace_back(x.get_string().value_unsafe());
  }
  return out;
}

// One parser per thread keeps its buffers between requests; a text above this size gets a parser
// of its own, so that one large request does not pin its memory for the thread's lifetime.
constexpr size_t kKeepParserBytes = size_t{1} << 20;

// `text` parsed into `*root`, which lives until this thread's next parse (or as long as `*own`,
// the parser a large text gets). False when simdjson rejects the text.
bool ParseRoot(std::string_view text, std::unique_ptr<dom::parser>* own, dom::element* root) {
  thread_local dom::parser kept;
  dom::parser* parser = &kept;
  if (text.size() > kKeepParserBytes) {
    *own = std::make_unique<dom::parser>();
    parser = own->get();
  }
  return parser->parse(text.data(), text.size(), /*realloc_if_needed=*/true).get(*root) == simdjson::SUCCESS;
}

}  // namespace

std::optional<FastJson> ParseJsonFast(std::string_view text, const std::function<bool(std::string_view)>& divert) {
  std::unique_ptr<dom::parser> own;
  dom::element root;
  if (!ParseRoot(text, &own, &root)) return std::nullopt;
  FastJson out;
  if (root.type() != dom::element_type::OBJECT || !divert) {
    out.doc = Convert(root);
    return out;
  }
  out.doc = json::object();
  dom::object top;
  if (root.get_object().get(top) != simdjson::SUCCESS) return std::nullopt;
  for (dom::key_value_pair f : top) {
    std::string key(f.key);
    if (divert(key)) {
      if (auto strings = StringArray(f.value)) {
        out.doc[key] = json::array();
        std::erase_if(out.strings, [&](const auto& s) { return s.first == key; });  // a repeated key: the last wins
        out.strings.emplace_back(std::move(key), std::move(*strings));
        continue;
      }
    }
    std::erase_if(out.strings, [&](const auto& s) { return s.first == key; });
    out.doc[key] = Convert(f.value);
  }
  return out;
}

std::optional<std::vector<std::pair<std::string, int64_t>>> ParseStringIntArrayFast(std::string_view text,
                                                                                    std::string_view str_key,
                                                                                    std::string_view int_key) {
  auto fold_equal = [](std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
        return false;
    }
    return true;
  };
  std::unique_ptr<dom::parser> own;
  dom::element root;
  if (!ParseRoot(text, &own, &root)) return std::nullopt;
  dom::array items;
  if (root.get_array().get(items) != simdjson::SUCCESS) return std::nullopt;
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(items.size());
  for (dom::element item : items) {
    dom::object o;
    if (item.get_object().get(o) != simdjson::SUCCESS || o.size() != 2) return std::nullopt;
    std::optional<std::string_view> str;
    std::optional<int64_t> num;
    for (dom::key_value_pair f : o) {
      if (fold_equal(f.key, str_key) && !str && f.value.type() == dom::element_type::STRING) {
        str = f.value.get_string().value_unsafe();
      } else if (fold_equal(f.key, int_key) && !num && f.value.type() == dom::element_type::INT64) {
        num = f.value.get_int64().value_unsafe();
      } else {
        return std::nullopt;
      }
    }
    if (!str || !num) return std::nullopt;
    out.emplace_back(std::string(*str), *num);
  }
  return out;
}

}  // namespace kgpu
