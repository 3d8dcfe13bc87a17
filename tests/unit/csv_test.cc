// common/csv.h: the one CSV reader, read as Go's encoding/csv reads (dcgm-exporter's counters
// file): quotes, "" and \r\n, comment lines, field counts, and errors at line:column.

#include "common/csv.h"

#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace kgpu {
namespace {

using Fields = std::vector<std::string>;

std::vector<Fields> AllFields(const std::vector<CsvRecord>& records) {
  std::vector<Fields> out;
  for (const auto& r : records) out.push_back(r.fields);
  return out;
}

std::string ErrorOf(std::string_view text, const CsvOptions& options = {}) {
  auto r = ReadCsv(text, "x.csv", options);
  if (r.ok()) return "ok";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(Csv, QuotedFieldsHoldCommasQuotesAndLineEnds) {
  auto r = ReadCsv("a,\"b, c\",\"say \"\"hi\"\"\",\"\"\n", "x.csv");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].fields, (Fields{"a", "b, c", "say \"hi\"", ""}));
  // Columns are where each field starts: the opening quote of a quoted one.
  ASSERT_EQ((*r)[0].positions.size(), 4u);
  EXPECT_EQ((*r)[0].positions[1].column, 3);
  EXPECT_EQ((*r)[0].positions[2].column, 10);
  EXPECT_EQ((*r)[0].positions[3].column, 23);
  EXPECT_FALSE((*r)[0].positions[0].quoted);
  EXPECT_TRUE((*r)[0].positions[1].quoted);
}

TEST(Csv, CrlfReadsAsLfAlsoInsideQuotesAndRecordsKeepTheirStartLine) {
  auto r = ReadCsv("h1,h2\r\n\"multi\r\nline\",x\r\n\r\n\"a\nb\nc\",y\r\nlast,z", "x.csv");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(AllFields(*r), (std::vector<Fields>{{"h1", "h2"}, {"multi\nline", "x"}, {"a\nb\nc", "y"}, {"last", "z"}}));
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].line, 1);
  EXPECT_EQ((*r)[1].line, 2);  // spans lines 2-3
  EXPECT_EQ((*r)[1].positions[1].line, 3);
  EXPECT_EQ((*r)[1].positions[1].column, 7);
  EXPECT_EQ((*r)[2].line, 5);  // after the empty line 4; spans 5-7
  EXPECT_EQ((*r)[3].line, 8);  // no line end after the last record
}

TEST(Csv, ALoneCarriageReturnIsDataAndAFinalOneIsDropped) {
  auto r = ReadCsv("a\rb,c\r\nd,e\r", "x.csv");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(AllFields(*r), (std::vector<Fields>{{"a\rb", "c"}, {"d", "e"}}));
}

TEST(Csv, EmptyLinesAndCommentLinesAreSkipped) {
  CsvOptions o;
  o.comment = '#';
  o.fields_per_record = -1;
  auto r = ReadCsv("# Format: DCGM field, type, help\n\n\r\nDCGM_FI_A, gauge, x\n  # not a comment\n#last", "x.csv", o);
  ASSERT_TRUE(r.ok()) << r.status();
  // As in Go, only a line that starts with the comment character is a comment.
  EXPECT_EQ(AllFields(*r), (std::vector<Fields>{{"DCGM_FI_A", " gauge", " x"}, {"  # not a comment"}}));
  EXPECT_EQ((*r)[0].line, 4);
  EXPECT_EQ((*r)[1].line, 5);
  // Without a comment character, # is data.
  auto plain = ReadCsv("#a,b\n", "x.csv");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(AllFields(*plain), (std::vector<Fields>{{"#a", "b"}}));
  // Nothing but blank lines and comments: no records.
  auto none = ReadCsv("\n\r\n# x\n", "x.csv", o);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  auto empty = ReadCsv("", "x.csv");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
}

TEST(Csv, BlanksAreDataUnlessTrimLeadingSpace) {
  CsvOptions o;
  o.fields_per_record = -1;
  auto raw = ReadCsv("a, b ,\t\"c\"x\n", "x.csv", o);
  // ` b ` is kept as written; `\t"c"x` starts with a tab, so it is unquoted and its quote is bare.
  ASSERT_FALSE(raw.ok());
  auto kept = ReadCsv("a, b ,c\n", "x.csv", o);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(AllFields(*kept), (std::vector<Fields>{{"a", " b ", "c"}}));
  o.trim_leading_space = true;
  auto trimmed = ReadCsv("a, b ,\t \"c, d\"\n", "x.csv", o);
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  EXPECT_EQ(AllFields(*trimmed), (std::vector<Fields>{{"a", "b ", "c, d"}}));
  EXPECT_EQ((*trimmed)[0].positions[2].column, 9);  // after the blanks
}

TEST(Csv, ABareQuoteIsAnErrorAtItsLineAndColumn) {
  // dcgm-exporter's file with a blank before the quoted help: Go refuses it, and so do we.
  EXPECT_EQ(ErrorOf("a,b,c\nDCGM_FI_A, gauge, \"help, with a comma\"\n"),
            "x.csv:2:19: bare \" in a field that is not quoted (quote the whole field and double each \" in it, as in "
            "\"say \"\"hi\"\"\"; a quoted field starts with \" right after the ',', with no blank before it)");
  EXPECT_EQ(ErrorOf("ab\"c\n").rfind("x.csv:1:3: bare \"", 0), 0u);
}

TEST(Csv, AQuoteThatClosesAFieldMustEndIt) {
  EXPECT_EQ(ErrorOf("\"a\"b,c\n"),
            "x.csv:1:3: the quote that closes the field opened at column 1 is followed by 'b' (write \"\" for a \" "
            "inside a quoted field, and ',' or the line end right after the closing \")");
  // The field opened on line 1 and closes on line 2: the error is on line 2, in the record of line 1.
  EXPECT_EQ(ErrorOf("x,\"a\nb\"\x01\n"),
            "x.csv:2:2: the quote that closes the field opened on line 1, column 3 is followed by '\\x01' in the "
            "record that starts on line 1 (write \"\" for a \" inside a quoted field, and ',' or the line end right "
            "after the closing \")");
}

TEST(Csv, AnUnterminatedQuoteIsReportedWhereItOpens) {
  EXPECT_EQ(ErrorOf("a,b\nc,\"d\ne,f\n"),
            "x.csv:2:3: quoted field is not closed: the text ends inside it (add the closing \", and write \"\" for "
            "each \" inside the field)");
}

TEST(Csv, FieldCountsAsGoChecksThem) {
  // 0: the first record sets the count.
  EXPECT_EQ(ErrorOf("a,b,c\n1,2,3\n\n1,2\n"),
            "x.csv:4:4: record has 2 fields, the first record (line 1) has 3 (add the missing field; an empty field "
            "is nothing between two ',')");
  CsvOptions header;
  header.header = true;
  EXPECT_EQ(ErrorOf("h1,h2,h3,h4,h5\n1,2,3,4,5\n1,2,3,4\n", header),
            "x.csv:3:8: record has 4 fields, the header has 5 (add the missing field; an empty field is nothing "
            "between two ',')");
  EXPECT_EQ(ErrorOf("h1,h2\n1,2,3,4\n", header),
            "x.csv:2:5: record has 4 fields, the header has 2 (quote a field that holds ',', as in \"a, b\", or "
            "remove the extra field)");
  // > 0: exactly so many, the first record too.
  CsvOptions three;
  three.fields_per_record = 3;
  EXPECT_EQ(ErrorOf("a,b\n", three).rfind("x.csv:1:4: record has 2 fields, expected 3 (", 0), 0u);
  EXPECT_EQ(ErrorOf("a,b,c\n", three), "ok");
  // < 0: any number.
  CsvOptions any;
  any.fields_per_record = -1;
  auto r = ReadCsv("a\nb,c\nd,e,f\n", "x.csv", any);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(AllFields(*r), (std::vector<Fields>{{"a"}, {"b", "c"}, {"d", "e", "f"}}));
}

TEST(Csv, AByteOrderMarkIsSkipped) {
  CsvOptions o;
  o.comment = '#';
  auto r = ReadCsv("\xEF\xBB\xBF# comment\nsn,x\n\"1\",2\n", "x.csv", o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(AllFields(*r), (std::vector<Fields>{{"sn", "x"}, {"1", "2"}}));
  auto first = ReadCsv("\xEF\xBB\xBF\"a\",b\n", "x.csv");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(AllFields(*first), (std::vector<Fields>{{"a", "b"}}));
  EXPECT_EQ((*first)[0].positions[0].column, 1);  // columns count from after the mark
}

TEST(Csv, ErrorsAreEscapedAndRepeated) {
  CsvReader reader("ok\n\x1B[31m\"\n", "x.csv");
  auto first = reader.Next();
  ASSERT_TRUE(first.ok() && *first) << first.status();
  auto bad = reader.Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(std::string(bad.status().message()).rfind("x.csv:2:6: bare \"", 0), 0u) << bad.status();
  auto again = reader.Next();
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status(), bad.status());
  // A separator that cannot be one is refused before any record.
  CsvOptions o;
  o.comma = '"';
  EXPECT_EQ(ErrorOf("a\n", o).rfind("x.csv: CSV separator '\"'", 0), 0u);
  o.comma = ',';
  o.comment = ',';
  EXPECT_NE(ErrorOf("a\n", o), "ok");
}

TEST(Csv, TheStreamingReaderKeepsEveryFieldOfARecordValid) {
  // Many fields unescaped into the reader's buffer (each "" and \r\n forces a copy): the views of the
  // first stay valid while the buffer grows for the last.
  std::string text;
  Fields want;
  for (int i = 0; i < 64; ++i) {
    const std::string value = std::string(40, static_cast<char>('a' + i % 26)) + "\"" + std::to_string(i) + "\n.";
    want.push_back(value);
    text += (i ? "," : "") + std::string("\"") + value.substr(0, 40) + "\"\"" + std::to_string(i) + "\r\n.\"";
  }
  text += "\nplain";
  CsvOptions any;
  any.fields_per_record = -1;
  CsvReader reader(text, "x.csv", any);
  auto more = reader.Next();
  ASSERT_TRUE(more.ok() && *more) << more.status();
  ASSERT_EQ(reader.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(reader.field(i), want[i]) << i;
  more = reader.Next();
  ASSERT_TRUE(more.ok() && *more) << more.status();
  EXPECT_EQ(reader.line(), 66);
  EXPECT_EQ(reader.fields(), (std::vector<std::string_view>{"plain"}));
  more = reader.Next();
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(*more);
}

TEST(Csv, WhatAppendCsvRecordWritesReadsBack) {
  CsvOptions o;
  o.comment = '#';
  o.fields_per_record = -1;
  o.trim_leading_space = true;
  const std::string bom = "\xEF\xBB\xBF";
  const std::vector<Fields> records = {
      {"", "a,b", "say \"hi\"", " lead", "multi\nline", "cr\r", "crlf\r\nkept", "#not first"},
      {"#first", "x"},
      {""},
      {bom + "bom", "plain"},
  };
  std::string text;
  for (const auto& r : records) AppendCsvRecord(text, r, o);
  auto back = ReadCsv(text, "x.csv", o);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(AllFields(*back), records) << text;
  std::string simple;
  AppendCsvRecord(simple, std::vector<std::string_view>{"a", "b c", "d,e"});
  EXPECT_EQ(simple, "a,b c,\"d,e\"\n");
}

}  // namespace
}  // namespace kgpu
