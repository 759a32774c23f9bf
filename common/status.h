// Status and Result<T>: how expected failures travel in Tessera.
//
// A Status is either OK or a code plus a message a user can act on
// ("model.safetensors: tensor 'x' has shape [3, 4], expected [4, 3]").
// Result<T> holds either a T or a non-OK Status. Neither throws.
// Thread-safety: values; no shared state.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tessera {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad input from a user or a file's content
  kNotFound,          // missing file, tensor, field, key
  kCorrupt,           // a file that is truncated or malformed
  kUnimplemented,     // valid input that this build cannot handle
  kOutOfRange,        // an index or id outside its valid range
  kResourceExhausted, // memory, blocks, queue slots
  kIoError,           // the OS refused (open, mmap, read, write)
  kUnavailable,       // a peer or device is absent or gone
  kDeadlineExceeded,  // a timeout expired
  kAborted,           // cancelled by a client or shutdown
  kInternal,          // a bug: should not happen
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  static Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
  static Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
  static Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
  static Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status deadline_exceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
  static Status aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "not found: model.safetensors: no tensor 'lm_head.weight'"
  std::string to_string() const;
  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK.
  Status with_context(std::string_view prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                     // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {                // NOLINT: implicit by design
    assert(!std::get<Status>(v_).is_ok() && "Result constructed from an OK Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tessera

#define TESSERA_CONCAT_INNER_(a, b) a##b
#define TESSERA_CONCAT_(a, b) TESSERA_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define TESSERA_RETURN_IF_ERROR(expr)                    \
  do {                                                   \
    ::tessera::Status tessera_status_ = (expr);          \
    if (!tessera_status_.is_ok()) return tessera_status_; \
  } while (0)

// `TESSERA_ASSIGN_OR_RETURN(auto x, make_x());` binds the value or returns the error.
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(TESSERA_CONCAT_(tessera_result_, __LINE__), lhs, expr)
#define TESSERA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.is_ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
