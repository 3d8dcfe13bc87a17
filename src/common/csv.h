#pragma once
// The one CSV reader of kgpu (dcgm-exporter's counters file, `kgpu sim`'s Alibaba trace), reading
// as Go's encoding/csv reads, since dcgm-exporter reads its counters file with it (Comment '#'):
//   - a record ends at \n; \r\n reads as \n, inside a quoted field too; any other \r is data; the
//     last record needs no line end;
//   - a field that starts with " is quoted: it may hold the separator, line ends, and "" for one ";
//     its closing " must be followed by the separator or the end of the line;
//   - a " in a field that does not start with one is an error (Go's ErrBareQuote; LazyQuotes off):
//     in `a, "b, c"` the blank before the quote makes the field unquoted, so that line is refused
//     as Go refuses it;
//   - empty lines are skipped, and so is a line whose first byte is the comment character (one
//     that starts with a blank and then the comment character is a record);
//   - blanks are data: trim_leading_space is Go's TrimLeadingSpace (Unicode white space before a
//     field); callers that trim fields (dcgm-exporter trims ' ' after reading) trim themselves;
//   - fields_per_record as Go's FieldsPerRecord: 0, the first record sets the count; > 0, exactly
//     that many; < 0, any number.
// Where it differs from Go, on purpose: a UTF-8 byte-order mark at the start of the text is
// skipped (spreadsheets write one; Go keeps it in the first field) and columns on line 1 count
// from after it; an unterminated quoted field is reported where it opens (Go reports the end of
// the text, which says nothing about where the quote is missing); too many fields are reported at
// the first extra field and too few at the end of the record (Go: column 1); the separator and
// the comment character are single ASCII bytes; LazyQuotes is not offered.
//
// Why our own reader and not Debian's libcsv (libcsv3): libcsv has no comment lines, drops blanks
// around unquoted fields, ends a record at a lone \r, accepts a bare " in an unquoted field
// unless in strict mode, checks no field count and reports no line or column. Each of those would
// need code around it, and the result would still not read what Go reads.
//
// Errors are InvalidArgument "<origin>:<line>:<column>: <what> (<fix>)", with every byte that a
// terminal must not receive escaped; lines and columns are 1-based, columns count bytes (as Go's
// ParseError and FieldPos do).
//
// Thread-safety: a CsvReader is used by one thread at a time; the functions are pure.

#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kgpu {

struct CsvOptions {
  char comma = ',';  // the separator: an ASCII byte other than '"', '\r', '\n' and NUL
  char comment = 0;  // 0: no comment lines; else an ASCII byte, not '"', '\r', '\n' or `comma`
  int fields_per_record = 0;
  bool trim_leading_space = false;
  bool header = false;  // the first record names the columns: messages call it "the header"
};

// Where a field starts: its first byte, the opening quote of a quoted field (its text starts one
// column later).
struct CsvPosition {
  int line = 0;
  int column = 0;
  bool quoted = false;
};

// Reads records one at a time, without a copy of the text: a field is a view into the text when
// it can be (an unquoted field, a quoted one without "" or \r\n inside) and into one buffer of the
// reader otherwise, and the reader's vectors keep their capacity, so reading a large trace costs
// no allocation per record. `text` must outlive the reader.
class CsvReader {
 public:
  CsvReader(std::string_view text, std::string_view origin, const CsvOptions& options = {});
  CsvReader(const CsvReader&) = delete;
  CsvReader& operator=(const CsvReader&) = delete;

  // The next record: true when there is one, false at the end of the text, or the error (which
  // every later call returns again).
  absl::StatusOr<bool> Next();

  // The current record; the views are valid until the next call of Next().
  int line() const { return record_line_; }  // where the record starts
  size_t size() const { return fields_.size(); }
  std::string_view field(size_t i) const { return fields_[i]; }
  const std::vector<std::string_view>& fields() const { return fields_; }
  CsvPosition position(size_t i) const { return positions_[i]; }
  const std::vector<CsvPosition>& positions() const { return positions_; }

 private:
  struct Span {
    bool in_buffer;
    size_t begin;
    size_t size;
  };
  absl::Status ReadRecord();
  void NewLine(size_t next) {
    ++line_no_;
    line_start_ = next;
  }
  int Column(size_t at) const { return static_cast<int>(at - line_start_) + 1; }
  bool LineEndAt(size_t at) const;
  absl::Status Error(int line, int column, std::string_view what, std::string_view fix) const;
  absl::Status CheckCount(CsvPosition end);

  std::string_view text_;
  std::string origin_;
  CsvOptions options_;
  absl::Status error_;
  size_t pos_ = 0;
  int line_no_ = 1;
  size_t line_start_ = 0;
  int record_line_ = 0;
  int expected_ = -1;   // the field count every record must have; -1: any (or not known yet)
  int first_line_ = 0;  // where the record that set expected_ starts (fields_per_record 0)
  std::string buffer_;
  std::vector<Span> spans_;
  std::vector<std::string_view> fields_;
  std::vector<CsvPosition> positions_;
};

// One record, owning its fields.
struct CsvRecord {
  int line = 0;  // where the record starts
  std::vector<std::string> fields;
  std::vector<CsvPosition> positions;
};

// Every record of `text`, or the first error.
absl::StatusOr<std::vector<CsvRecord>> ReadCsv(std::string_view text, std::string_view origin,
                                               const CsvOptions& options = {});

// Appends one field as the reader reads it back: quoted (with each " doubled) when it holds the
// separator, a quote or a line end, starts with white space, or, as the first field of a record
// (`first`), starts with the comment character or a byte-order mark; an empty field when it is the
// record's only one (`alone`: an empty line is skipped), or when trim_leading_space and a white space
// separator would drop it; as written otherwise (Go's csv.Writer quotes by much the same rule). A
// \r\n inside a field is written \r\r\n, since the reader reads \r\n as \n (Go's writer does not,
// so its \r\n comes back as \n).
void AppendCsvField(std::string& out, std::string_view field, const CsvOptions& options, bool first, bool alone);

// Appends `fields` (strings or string views; at least one, as every record read has) as one record
// and a \n.
template <typename Range>
void AppendCsvRecord(std::string& out, const Range& fields, const CsvOptions& options = {}) {
  const bool alone = std::ranges::distance(fields) == 1;
  bool first = true;
  for (const auto& f : fields) {
    if (!first) out.push_back(options.comma);
    AppendCsvField(out, std::string_view(f), options, first, alone);
    first = false;
  }
  out.push_back('\n');
}

}  // namespace kgpu
