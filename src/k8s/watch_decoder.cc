#include "k8s/watch_decoder.h"

#include "common/strings.h"

namespace kgpu::k8s {

absl::Status WatchDecoder::Emit(std::vector<WatchEvent>& out) {
  nlohmann::json j = nlohmann::json::parse(buf_, nullptr, /*allow_exceptions=*/false);
  buf_.clear();
  if (j.is_discarded()) return absl::DataLossError("watch stream: an event is not valid JSON");
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string() || !j.contains("object") ||
      !j["object"].is_object()) {
    return absl::DataLossError("watch stream: an event lacks a string 'type' or an object 'object'");
  }
  out.push_back({j["type"].get<std::string>(), std::move(j["object"])});
  return absl::OkStatus();
}

absl::Status WatchDecoder::Feed(std::string_view bytes, std::vector<WatchEvent>& out) {
  if (!error_.ok()) return error_;
  for (char c : bytes) {
    if (depth_ == 0) {
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
      if (c != '{') {
        error_ = absl::DataLossError(Cat("watch stream: unexpected byte 0x",
                                         static_cast<int>(static_cast<unsigned char>(c)), " between events"));
        return error_;
      }
    }
    buf_.push_back(c);
    if (buf_.size() > max_) {
      error_ = absl::ResourceExhaustedError(Cat("watch stream: an event is larger than ", max_, " bytes"));
      return error_;
    }
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) {
        if (auto s = Emit(out); !s.ok()) {
          error_ = s;
          return error_;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kgpu::k8s
