// Fuzz target for the CSV reader (src/common/csv.cc) that reads dcgm-exporter's counters file and
// `kgpu sim`'s traces. Every input is read with several option sets (dcgm-exporter's, the trace's,
// Go's defaults, TrimLeadingSpace, a fixed field count). Properties: nothing crashes; an error reads
// "fuzz.csv:<line>:<column>: " with no byte a terminal must not receive; the streaming reader and
// ReadCsv agree; accepted records have at least one field, increasing start lines, positions at or
// after their record's start, and the field counts the options ask for; written back with
// AppendCsvRecord they read back the same; and a text without quotes, carriage returns or a
// byte-order mark reads as its non-empty lines split at the separator.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/csv.h"
#include "common/strings.h"

namespace {

using kgpu::CsvOptions;
using kgpu::CsvRecord;

void Expect(bool ok) {
  if (!ok) std::abort();
}

// "fuzz.csv:<digits>:<digits>: ..."
bool WellFormedError(const std::string& m) {
  constexpr std::string_view kOrigin = "fuzz.csv:";
  if (m.compare(0, kOrigin.size(), kOrigin) != 0 || kgpu::Printable(m) != m) return false;
  size_t i = kOrigin.size();
  for (int part = 0; part < 2; ++part) {
    const size_t start = i;
    while (i < m.size() && m[i] >= '0' && m[i] <= '9') ++i;
    if (i == start || i >= m.size() || m[i] != ':') return false;
    ++i;
  }
  return i < m.size() && m[i] == ' ';
}

std::vector<std::vector<std::string>> FieldsOf(const std::vector<CsvRecord>& records) {
  std::vector<std::vector<std::string>> out;
  for (const auto& r : records) out.push_back(r.fields);
  return out;
}

void Check(const std::string& text, const CsvOptions& options) {
  auto records = kgpu::ReadCsv(text, "fuzz.csv", options);

  // The streaming reader reads the same records, or stops at the same error.
  kgpu::CsvReader reader(text, "fuzz.csv", options);
  size_t index = 0;
  while (true) {
    auto more = reader.Next();
    if (!more.ok()) {
      Expect(!records.ok() && more.status() == records.status());
      break;
    }
    if (!*more) {
      Expect(records.ok() && index == records->size());
      break;
    }
    if (!records.ok()) continue;  // the stream yields the records before the error ReadCsv stops at
    Expect(index < records->size());
    const CsvRecord& r = (*records)[index++];
    Expect(reader.line() == r.line && reader.size() == r.fields.size());
    for (size_t i = 0; i < reader.size(); ++i) {
      Expect(reader.field(i) == r.fields[i]);
      const auto& a = reader.position(i);
      const auto& b = r.positions[i];
      Expect(a.line == b.line && a.column == b.column && a.quoted == b.quoted);
    }
  }

  if (!records.ok()) {
    Expect(records.status().code() == absl::StatusCode::kInvalidArgument);
    Expect(WellFormedError(std::string(records.status().message())));
    return;
  }
  int previous = 0;
  for (const auto& r : *records) {
    Expect(!r.fields.empty() && r.positions.size() == r.fields.size() && r.line > previous);
    previous = r.line;
    int line = r.line;
    for (const auto& p : r.positions) {
      Expect(p.line >= line && p.column >= 1);
      line = p.line;
    }
    for (const auto& f : r.fields) Expect(f.find("\r\n") == std::string::npos);
    if (options.fields_per_record > 0) Expect(r.fields.size() == static_cast<size_t>(options.fields_per_record));
    if (options.fields_per_record == 0) Expect(r.fields.size() == (*records)[0].fields.size());
  }

  // Written back, read back the same.
  std::string written;
  for (const auto& r : *records) kgpu::AppendCsvRecord(written, r.fields, options);
  auto again = kgpu::ReadCsv(written, "again.csv", options);
  Expect(again.ok() && FieldsOf(*again) == FieldsOf(*records));

  // Without quotes, carriage returns, comments, trimming or a byte-order mark, CSV is lines split
  // at the separator.
  if (text.find_first_of("\"\r") == std::string::npos && text.rfind("\xEF\xBB\xBF", 0) != 0 && options.comment == 0 &&
      !options.trim_leading_space && options.fields_per_record < 0) {
    std::vector<std::vector<std::string>> want;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      if (end > start) {
        std::vector<std::string> fields;
        for (size_t at = start;;) {
          const size_t comma = text.find(options.comma, at);
          if (comma == std::string::npos || comma >= end) {
            fields.push_back(text.substr(at, end - at));
            break;
          }
          fields.push_back(text.substr(at, comma - at));
          at = comma + 1;
        }
        want.push_back(fields);
      }
      start = end + 1;
    }
    Expect(FieldsOf(*records) == want);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  CsvOptions go;  // Go's defaults: the first record sets the field count
  Check(text, go);
  CsvOptions dcgm;  // dcgm-exporter's counters file
  dcgm.comment = '#';
  dcgm.fields_per_record = -1;
  Check(text, dcgm);
  CsvOptions trace;  // kgpu sim's traces
  trace.header = true;
  Check(text, trace);
  CsvOptions any;
  any.fields_per_record = -1;
  Check(text, any);
  CsvOptions trim;
  trim.trim_leading_space = true;
  trim.fields_per_record = -1;
  trim.comma = ';';
  trim.comment = '#';
  Check(text, trim);
  CsvOptions three;
  three.fields_per_record = 3;
  three.comma = '\t';
  Check(text, three);
  return 0;
}
