#include "common/status.h"

namespace tessera {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorrupt: return "corrupt";
    case StatusCode::kUnimplemented: return "unimplemented";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kIoError: return "i/o error";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kDeadlineExceeded: return "deadline exceeded";
    case StatusCode::kAborted: return "aborted";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  std::string s(status_code_name(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::with_context(std::string_view prefix) const {
  if (is_ok()) return *this;
  std::string m(prefix);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

}  // namespace tessera
