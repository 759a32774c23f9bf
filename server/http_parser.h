// HTTP/1.1 request-head parsing and response framing for the coordinator's HTTP server
// (server/http_server.h). Pure functions on byte strings: no sockets, no state, so every
// branch is unit-testable and fuzzable without a network.
//
// What is accepted (RFC 9112, strict where leniency would hide request smuggling):
//   * request line `METHOD SP target SP HTTP/1.x`; leading empty lines are skipped;
//     lines end in CRLF or a bare LF;
//   * header fields `name: value`, name a token, no whitespace before the colon, no obs-fold,
//     no control characters except HTAB in values;
//   * bodies framed by Content-Length only. Any Transfer-Encoding is refused with 411 (a
//     chunked request body is not supported; clients send Content-Length);
//   * "Expect: 100-continue" (the server answers 100 before reading the body); any other
//     expectation gets 417.
// Thread-safety: all functions are pure; HttpRequest is a value.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;         // "GET", "POST", ... as sent (case-sensitive per RFC)
  std::string target;         // request-target as sent: "/v1/models?x=1"
  std::string path;           // target up to '?', not percent-decoded; "/" for absolute-form
  std::string query;          // after '?', without it; empty when absent
  int version_minor = 1;      // HTTP/1.<version_minor>: 0 or 1
  HttpHeaders headers;        // names as sent (original case), values trimmed of OWS
  std::string body;           // exactly Content-Length bytes
  std::string remote_address; // "127.0.0.1:54321" (set by the server)

  // The first header named `name` (ASCII case-insensitive), or "" when absent.
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

struct HttpParseLimits {
  size_t max_header_bytes = 64 * 1024;  // request line + headers + blank line
  size_t max_header_count = 128;
};

// The parsed head of one request (everything before the body).
struct HttpRequestHead {
  HttpRequest request;        // body empty
  size_t head_bytes = 0;      // bytes of the head including leading blank lines and terminator
  size_t content_length = 0;  // body bytes that follow the head
  bool keep_alive = true;     // HTTP/1.1 default, "Connection: close" clears; 1.0 needs keep-alive
  bool expect_continue = false;  // "Expect: 100-continue"
};

struct HttpParseError {
  int status = 400;           // 400, 411, 417, 431, 505
  std::string message;        // for the error body: says what was wrong
};

// Where the head that starts `data` ends: the offset just past the blank line, or npos when
// the blank line has not arrived yet. `scan_from` lets a caller that calls again after each
// read skip bytes it already searched (pass the previous data.size()).
size_t find_head_end(std::string_view data, size_t scan_from = 0);

// Parses a complete head (`head` = data[0, find_head_end(data))). Returns false and fills
// `error` when the head is malformed or over a limit.
bool parse_request_head(std::string_view head, const HttpParseLimits& limits, HttpRequestHead* out,
                        HttpParseError* error);

// "OK", "Not Found", ...; "Unknown" for codes without a phrase here.
std::string_view http_reason_phrase(int status);

// An OpenAI-style error object: {"error":{"message":..,"type":..,"param":null,"code":<status>}}
// with type "invalid_request_error" for 4xx and "server_error" otherwise.
std::string http_error_body(int status, std::string_view message);

// Appends `s` as a JSON string literal (with quotes) to `out`.
void append_json_string(std::string* out, std::string_view s);

// True for a header name that is an RFC token and a value free of CR, LF and NUL: what the
// server requires of application-supplied headers before it writes them.
bool is_valid_header_name(std::string_view name);
bool is_valid_header_value(std::string_view value);

// ASCII case-insensitive equality.
bool iequals(std::string_view a, std::string_view b);

}  // namespace tessera
