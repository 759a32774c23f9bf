// Fuzz target: bytes from an HTTP client as the server's reader sees them: the head found,
// parsed under the server's limits, and the same bytes fed in two pieces (a head split across
// reads must be found at the same place).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/http_parser.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t end = find_head_end(all);
  // Found again when the bytes arrive in two reads (the scan resumes where it stopped).
  const size_t cut = size / 2;
  size_t resumed = find_head_end(all.substr(0, cut));
  if (resumed == std::string_view::npos) resumed = find_head_end(all, cut);
  if (resumed != end) __builtin_trap();
  if (end == std::string_view::npos) return 0;
  if (end > size) __builtin_trap();
  HttpParseLimits limits;
  limits.max_header_bytes = 4096;
  limits.max_header_count = 32;
  HttpRequestHead head;
  HttpParseError error;
  if (!parse_request_head(all.substr(0, end), limits, &head, &error)) {
    if (error.status < 400 || error.status > 599 || error.message.empty()) __builtin_trap();
    (void)http_error_body(error.status, error.message);
    return 0;
  }
  if (head.head_bytes != end) __builtin_trap();
  // What a handler reads of a request: headers by name and the error body with its text.
  (void)head.request.header("content-type");
  (void)head.request.has_header("Host");
  for (const auto& [name, value] : head.request.headers)
    if (!is_valid_header_name(name)) __builtin_trap();
  std::string body;
  append_json_string(&body, head.request.target);
  return 0;
}
