// ParseJsonFast (simdjson -> nlohmann::json) must give what nlohmann's own parser gives, value for
// value and type for type, and leave to the caller every text simdjson rejects.
#include "common/fast_json.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kgpu {
namespace {
using json = nlohmann::json;

void ExpectSameAsNlohmann(const std::string& text) {
  SCOPED_TRACE(text);
  const auto fast = ParseJsonFast(text);
  ASSERT_TRUE(fast.has_value());
  const json slow = json::parse(text);
  EXPECT_EQ(fast->doc, slow);
  EXPECT_EQ(fast->doc.dump(), slow.dump());  // the same types too: 5 is unsigned, -5 signed, 5.0 a double
  EXPECT_TRUE(fast->strings.empty());
}

TEST(FastJson, ValuesAndTypesAsNlohmannParsesThem) {
  for (
      const char* text : {
          R"({"a":1,"b":-2,"c":2.5,"d":1e3,"e":true,"f":null,"g":"x","h":[1,"y",{"z":[]}],"i":{}})",
          R"([0, -0, 18446744073709551615, -9223372036854775808, 9223372036854775807, 0.1, 1E-7])",
          R"({"esc":"\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00","utf8":"é😀","empty":""})",
          R"({"dup":1,"dup":2})",  // a repeated key: the last wins
          R"("just a string")",
          "42",
          "null",
          "[]",
          R"({"metadata":{"name":"p","annotations":{"kgpu.io/gpu-model":"A100"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"kgpu.io/gpu":"1"}}}]}})",
      }) {
    ExpectSameAsNlohmann(text);
  }
}

TEST(FastJson, RejectedTextIsLeftToTheCaller) {
  for (const char* text : {"", "{", R"({"a":})", "[1,]", "{'a':1}", "nul", "\"\xff\"", R"({"a":1} x)"}) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(ParseJsonFast(text).has_value());
  }
}

TEST(FastJson, DivertedStringArraysSkipTheJsonTree) {
  auto is_names = [](std::string_view k) { return k == "NodeNames" || k == "nodenames"; };
  auto f = ParseJsonFast(R"({"Pod":{"x":1},"NodeNames":["a","b"],"Other":["c"]})", is_names);
  ASSERT_TRUE(f.has_value());
  ASSERT_EQ(f->strings.size(), 1U);
  EXPECT_EQ(f->strings[0].first, "NodeNames");
  EXPECT_EQ(f->strings[0].second, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f->doc, json::parse(R"({"Pod":{"x":1},"NodeNames":[],"Other":["c"]})"));
  // Not an array of strings: kept in the tree, where the caller's checks name the problem.
  auto mixed = ParseJsonFast(R"({"NodeNames":["a",1]})", is_names);
  ASSERT_TRUE(mixed.has_value());
  EXPECT_TRUE(mixed->strings.empty());
  EXPECT_EQ(mixed->doc, json::parse(R"({"NodeNames":["a",1]})"));
  // A repeated key: the last one wins, diverted or not.
  auto twice = ParseJsonFast(R"({"NodeNames":["a"],"NodeNames":null})", is_names);
  ASSERT_TRUE(twice.has_value());
  EXPECT_TRUE(twice->strings.empty());
  EXPECT_TRUE(twice->doc.at("NodeNames").is_null());
  auto both = ParseJsonFast(R"({"NodeNames":["a"],"nodenames":["b"]})", is_names);
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->strings.size(), 2U);
}

TEST(FastJson, StringIntArraysOnlyWhenExactlyThatShape) {
  auto ok = ParseStringIntArrayFast(R"([{"Host":"a","Score":3},{"score":-1,"host":"b"}])", "Host", "Score");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, (std::vector<std::pair<std::string, int64_t>>{{"a", 3}, {"b", -1}}));
  EXPECT_TRUE(ParseStringIntArrayFast("[]", "Host", "Score").has_value());
  for (const char* other :
       {R"(null)", R"({"Host":"a","Score":1})", R"([{"Host":"a"}])", R"([{"Host":"a","Score":1.5}])",
        R"([{"Host":"a","Score":1,"X":2}])", R"([{"Host":"a","host":"b"}])", R"([{"Host":null,"Score":1}])",
        R"([{"Host":"a","Score":"1"}])", R"([1])", "[{"}) {
    SCOPED_TRACE(other);
    EXPECT_FALSE(ParseStringIntArrayFast(other, "Host", "Score").has_value());
  }
}

}  // namespace
}  // namespace kgpu
