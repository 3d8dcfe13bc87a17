#include "common/csv.h"

#include "common/strings.h"

namespace kgpu {

namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";

bool ValidDelimiter(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u != 0 && u < 0x80 && c != '"' && c != '\r' && c != '\n';
}

// The length of the white space character (Go's unicode.IsSpace) at text[at], 0 when there is none.
size_t SpaceLength(std::string_view text, size_t at) {
  const auto byte = [&](size_t k) { return at + k < text.size() ? static_cast<unsigned char>(text[at + k]) : 0u; };
  const unsigned c0 = byte(0);
  if (c0 == ' ' || (c0 >= '\t' && c0 <= '\r')) return 1;
  if (c0 == 0xC2) return (byte(1) == 0x85 || byte(1) == 0xA0) ? 2 : 0;  // NEL, NO-BREAK SPACE
  if (c0 == 0xE1) return (byte(1) == 0x9A && byte(2) == 0x80) ? 3 : 0;  // OGHAM SPACE MARK
  if (c0 == 0xE3) return (byte(1) == 0x80 && byte(2) == 0x80) ? 3 : 0;  // IDEOGRAPHIC SPACE
  if (c0 == 0xE2) {
    const unsigned c1 = byte(1), c2 = byte(2);
    // U+2000-U+200A, U+2028, U+2029, U+202F, U+205F
    if (c1 == 0x80 && ((c2 >= 0x80 && c2 <= 0x8A) || c2 == 0xA8 || c2 == 0xA9 || c2 == 0xAF)) return 3;
    if (c1 == 0x81 && c2 == 0x9F) return 3;
  }
  return 0;
}

}  // namespace

CsvReader::CsvReader(std::string_view text, std::string_view origin, const CsvOptions& options)
    : text_(text), origin_(origin), options_(options) {
  if (text_.substr(0, kBom.size()) == kBom) pos_ = line_start_ = kBom.size();
  if (!ValidDelimiter(options_.comma) || (options_.comment != 0 && !ValidDelimiter(options_.comment)) ||
      options_.comma == options_.comment) {
    // A programming error, not the file's: said once, for every record.
    error_ = absl::InvalidArgumentError(
        Printable(Cat(origin_, ": CSV separator '", options_.comma, "' or comment character '", options_.comment,
                      "' cannot be used (ASCII, not '\"', a line end or NUL, and not the same)")));
  }
  if (options_.fields_per_record > 0) expected_ = options_.fields_per_record;
}

bool CsvReader::LineEndAt(size_t at) const {
  if (at >= text_.size()) return true;
  if (text_[at] == '\n') return true;
  // \r\n reads as \n, and a \r that ends the text is dropped (as Go drops it).
  return text_[at] == '\r' && (at + 1 == text_.size() || text_[at + 1] == '\n');
}

absl::Status CsvReader::Error(int line, int column, std::string_view what, std::string_view fix) const {
  std::string message = Cat(origin_, ":", line, ":", column, ": ", what);
  if (line != record_line_) message += Cat(" in the record that starts on line ", record_line_);
  message += Cat(" (", fix, ")");
  return absl::InvalidArgumentError(Printable(message));
}

absl::StatusOr<bool> CsvReader::Next() {
  if (!error_.ok()) return error_;
  buffer_.clear();
  spans_.clear();
  fields_.clear();
  positions_.clear();
  // Skip empty lines and comment lines: both are checked on a line's first byte only.
  const size_t n = text_.size();
  while (true) {
    if (pos_ >= n) return false;
    const char c = text_[pos_];
    if (options_.comment != 0 && c == options_.comment) {
      const size_t nl = text_.find('\n', pos_);
      if (nl == std::string_view::npos) {
        pos_ = n;
        return false;
      }
      pos_ = nl + 1;
      NewLine(pos_);
      continue;
    }
    if (c == '\n') {
      ++pos_;
      NewLine(pos_);
      continue;
    }
    if (c == '\r' && LineEndAt(pos_)) {
      ++pos_;  // the \n that follows (if any) is the next turn's
      continue;
    }
    break;
  }
  record_line_ = line_no_;
  if (auto status = ReadRecord(); !status.ok()) {
    error_ = status;
    return error_;
  }
  return true;
}

absl::Status CsvReader::ReadRecord() {
  const size_t n = text_.size();
  const char comma = options_.comma;
  size_t last_end = pos_;
  while (true) {  // one field per turn
    if (options_.trim_leading_space) {
      while (!LineEndAt(pos_)) {
        const size_t len = SpaceLength(text_, pos_);
        if (len == 0) break;
        pos_ += len;
      }
    }
    const CsvPosition start{line_no_, Column(pos_), pos_ < n && text_[pos_] == '"'};
    positions_.push_back(start);
    if (start.quoted) {
      ++pos_;
      size_t segment = pos_;  // the part of the field not yet in buffer_
      bool copied = false;
      const size_t buffer_begin = buffer_.size();
      while (true) {
        // The next quote or line end: a plain loop, the fields are short.
        while (pos_ < n && text_[pos_] != '"' && text_[pos_] != '\n') ++pos_;
        if (pos_ >= n) {
          return Error(start.line, start.column, "quoted field is not closed: the text ends inside it",
                       "add the closing \", and write \"\" for each \" inside the field");
        }
        if (text_[pos_] == '\n') {
          if (pos_ > segment && text_[pos_ - 1] == '\r') {  // \r\n inside the field reads as \n
            buffer_.append(text_.data() + segment, pos_ - 1 - segment);
            buffer_.push_back('\n');
            segment = pos_ + 1;
            copied = true;
          }
          ++pos_;
          NewLine(pos_);
          continue;
        }
        if (pos_ + 1 < n && text_[pos_ + 1] == '"') {  // "" is one quote
          buffer_.append(text_.data() + segment, pos_ + 1 - segment);
          pos_ += 2;
          segment = pos_;
          copied = true;
          continue;
        }
        break;  // the closing quote
      }
      if (copied) {
        buffer_.append(text_.data() + segment, pos_ - segment);
        spans_.push_back({true, buffer_begin, buffer_.size() - buffer_begin});
      } else {
        spans_.push_back({false, segment, pos_ - segment});
      }
      const int closing = Column(pos_);
      ++pos_;
      last_end = pos_;
      if (pos_ < n && text_[pos_] == comma) {
        ++pos_;
        continue;
      }
      if (!LineEndAt(pos_)) {
        const std::string opened = start.line == line_no_ ? Cat("at column ", start.column)
                                                          : Cat("on line ", start.line, ", column ", start.column);
        return Error(line_no_, closing,
                     Cat("the quote that closes the field opened ", opened, " is followed by '",
                         std::string_view(&text_[pos_], 1), "'"),
                     Cat("write \"\" for a \" inside a quoted field, and '", std::string_view(&comma, 1),
                         "' or the line end right after the closing \""));
      }
    } else {
      const size_t begin = pos_;
      while (pos_ < n && text_[pos_] != comma && text_[pos_] != '\n' && text_[pos_] != '"') ++pos_;
      if (pos_ < n && text_[pos_] == '"') {
        return Error(line_no_, Column(pos_), "bare \" in a field that is not quoted",
                     Cat("quote the whole field and double each \" in it, as in \"say \"\"hi\"\"\"; a quoted field "
                         "starts with \" right after the '",
                         std::string_view(&comma, 1), "', with no blank before it"));
      }
      if (pos_ < n && text_[pos_] == comma) {
        spans_.push_back({false, begin, pos_ - begin});
        ++pos_;
        continue;
      }
      last_end = pos_;
      if (last_end > begin && text_[last_end - 1] == '\r') --last_end;  // \r\n, or a \r that ends the text
      spans_.push_back({false, begin, last_end - begin});
    }
    break;  // the line end (or the end of the text) after the last field
  }
  // pos_ is at the line end: \n, \r\n, a final \r, or the end of the text; last_end right after the
  // last field, where a missing field would go.
  const CsvPosition record_end{line_no_, Column(last_end), false};
  if (pos_ < n && text_[pos_] == '\r') ++pos_;
  if (pos_ < n && text_[pos_] == '\n') {
    ++pos_;
    NewLine(pos_);
  }
  fields_.reserve(spans_.size());
  for (const Span& s : spans_) {
    fields_.push_back(s.in_buffer ? std::string_view(buffer_).substr(s.begin, s.size) : text_.substr(s.begin, s.size));
  }
  return CheckCount(record_end);
}

absl::Status CsvReader::CheckCount(CsvPosition end) {
  const int count = static_cast<int>(fields_.size());
  if (expected_ < 0) {
    if (options_.fields_per_record == 0) {
      expected_ = count;
      first_line_ = record_line_;
    }
    return absl::OkStatus();
  }
  if (count == expected_) return absl::OkStatus();
  std::string want;
  if (options_.fields_per_record > 0) {
    want = Cat("expected ", expected_);
  } else if (options_.header) {
    want = Cat("the header has ", expected_);
  } else {
    want = Cat("the first record (line ", first_line_, ") has ", expected_);
  }
  const std::string what = Cat("record has ", count, " field", count == 1 ? "" : "s", ", ", want);
  if (count > expected_) {
    const CsvPosition extra = positions_[static_cast<size_t>(expected_)];
    return Error(extra.line, extra.column, what,
                 Cat("quote a field that holds '", std::string_view(&options_.comma, 1), "', as in \"a",
                     std::string_view(&options_.comma, 1), " b\", or remove the extra field"));
  }
  return Error(end.line, end.column, what,
               Cat("add the missing field", expected_ - count == 1 ? "" : "s",
                   "; an empty field is nothing between two '", std::string_view(&options_.comma, 1), "'"));
}

absl::StatusOr<std::vector<CsvRecord>> ReadCsv(std::string_view text, std::string_view origin,
                                               const CsvOptions& options) {
  CsvReader reader(text, origin, options);
  std::vector<CsvRecord> out;
  while (true) {
    auto more = reader.Next();
    if (!more.ok()) return more.status();
    if (!*more) return out;
    CsvRecord& r = out.emplace_back();
    r.line = reader.line();
    r.fields.assign(reader.fields().begin(), reader.fields().end());
    r.positions = reader.positions();
  }
}

void AppendCsvField(std::string& out, std::string_view field, const CsvOptions& options, bool first, bool alone) {
  bool quote = false;
  if (field.empty()) {
    // An empty line is skipped; trim_leading_space skips a white space separator after another.
    quote = alone || (options.trim_leading_space && SpaceLength(std::string_view(&options.comma, 1), 0) > 0);
  } else {
    // White space first: trim_leading_space would drop it; a byte-order mark first: the reader
    // skips one that starts the text.
    quote = SpaceLength(field, 0) > 0 || (first && options.comment != 0 && field[0] == options.comment) ||
            (first && field.substr(0, kBom.size()) == kBom);
    for (size_t i = 0; !quote && i < field.size(); ++i) {
      const char c = field[i];
      quote = c == options.comma || c == '"' || c == '\n' || c == '\r';
    }
  }
  if (!quote) {
    out.append(field);
    return;
  }
  out.push_back('"');
  char previous = 0;
  for (const char c : field) {
    if (c == '"') out.push_back('"');
    if (c == '\n' && previous == '\r') out.push_back('\r');  // \r\n reads as \n: \r\r\n as \r\n
    out.push_back(c);
    previous = c;
  }
  out.push_back('"');
}

}  // namespace kgpu
