#include "server/http_parser.h"

#include <fmt/format.h>

#include <cstring>

namespace tessera {
namespace {

char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool is_tchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_tchar(c)) return false;
  }
  return true;
}

// Printable for error messages: control bytes and non-ASCII become \xNN, long input is cut.
std::string printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 64; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > 64) out += "...";
  return out;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Splits a head into lines on LF, dropping one CR before each LF.
std::vector<std::string_view> split_lines(std::string_view head) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < head.size()) {
    size_t nl = head.find('\n', start);
    if (nl == std::string_view::npos) nl = head.size();
    std::string_view line = head.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = nl + 1;
  }
  return lines;
}

bool fail(HttpParseError* error, int status, std::string message) {
  error->status = status;
  error->message = std::move(message);
  return false;
}

bool parse_request_line(std::string_view line, HttpRequest* req, HttpParseError* error) {
  size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) {
    return fail(error, 400, fmt::format("malformed request line '{}'", printable(line)));
  }
  size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return fail(error, 400, fmt::format("malformed request line '{}'", printable(line)));
  }
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method)) {
    return fail(error, 400, fmt::format("malformed method '{}'", printable(method)));
  }
  if (target.empty()) return fail(error, 400, "empty request target");
  for (char c : target) {
    auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) {
      return fail(error, 400, fmt::format("request target '{}' has a control character",
                                          printable(target)));
    }
  }
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' ||
      version[5] < '0' || version[5] > '9' || version[7] < '0' || version[7] > '9') {
    return fail(error, 400, fmt::format("malformed HTTP version '{}'", printable(version)));
  }
  if (version[5] != '1') {
    return fail(error, 505, fmt::format("HTTP version '{}' is not supported; use HTTP/1.1",
                                        printable(version)));
  }
  req->method = std::string(method);
  req->target = std::string(target);
  req->version_minor = version[7] == '0' ? 0 : 1;

  // Origin-form "/p?q", absolute-form "http://h/p?q", asterisk-form "*".
  std::string_view rest = target;
  if (target.front() != '/' && target != "*") {
    size_t scheme = target.find("://");
    if (scheme == std::string_view::npos) {
      return fail(error, 400, fmt::format("malformed request target '{}'", printable(target)));
    }
    size_t slash = target.find_first_of("/?", scheme + 3);
    rest = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  size_t hash = rest.find('#');
  if (hash != std::string_view::npos) rest = rest.substr(0, hash);
  size_t q = rest.find('?');
  req->path = std::string(rest.substr(0, q));
  if (req->path.empty()) req->path = "/";
  req->query = q == std::string_view::npos ? std::string() : std::string(rest.substr(q + 1));
  return true;
}

bool parse_content_length(std::string_view value, size_t* out) {
  if (value.empty() || value.size() > 18) return false;  // 18 digits cannot overflow size_t
  size_t n = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return false;
    n = n * 10 + static_cast<size_t>(c - '0');
  }
  *out = n;
  return true;
}

// True when the comma-separated list `value` holds `token` (case-insensitive).
bool list_has_token(std::string_view value, std::string_view token) {
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string_view::npos) comma = value.size();
    if (iequals(trim_ows(value.substr(start, comma - start)), token)) return true;
    start = comma + 1;
  }
  return false;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return {};
}

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& kv : headers) {
    if (iequals(kv.first, name)) return true;
  }
  return false;
}

size_t find_head_end(std::string_view data, size_t scan_from) {
  // Leading empty lines before the request line are skipped (RFC 9112 §2.2), so the
  // terminator search starts at the first other byte.
  size_t start = 0;
  while (start < data.size() && (data[start] == '\r' || data[start] == '\n')) ++start;
  // A terminator "\n\n" or "\n\r\n" may straddle the previous scan's end: back up 2 bytes.
  size_t pos = scan_from > 2 ? scan_from - 2 : 0;
  if (pos < start) pos = start;
  while (pos < data.size()) {
    const void* hit = std::memchr(data.data() + pos, '\n', data.size() - pos);
    if (hit == nullptr) return std::string_view::npos;
    size_t nl = static_cast<const char*>(hit) - data.data();
    if (nl + 1 < data.size() && data[nl + 1] == '\n') return nl + 2;
    if (nl + 2 < data.size() && data[nl + 1] == '\r' && data[nl + 2] == '\n') return nl + 3;
    pos = nl + 1;
  }
  return std::string_view::npos;
}

bool parse_request_head(std::string_view head, const HttpParseLimits& limits, HttpRequestHead* out,
                        HttpParseError* error) {
  *out = HttpRequestHead();
  out->head_bytes = head.size();
  if (head.size() > limits.max_header_bytes) {
    return fail(error, 431, fmt::format("request head is {} bytes, over the limit of {}",
                                        head.size(), limits.max_header_bytes));
  }
  size_t start = 0;
  while (start < head.size() && (head[start] == '\r' || head[start] == '\n')) ++start;
  std::vector<std::string_view> lines = split_lines(head.substr(start));
  // The terminator leaves one empty line at the end; anything else empty is impossible
  // because find_head_end stops at the first blank line.
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return fail(error, 400, "empty request");
  HttpRequest& req = out->request;
  if (!parse_request_line(lines[0], &req, error)) return false;
  if (lines.size() - 1 > limits.max_header_count) {
    return fail(error, 431, fmt::format("request has {} header fields, over the limit of {}",
                                        lines.size() - 1, limits.max_header_count));
  }

  bool have_length = false;
  std::string connection;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    if (line.front() == ' ' || line.front() == '\t') {
      return fail(error, 400, "obsolete header line folding is not accepted");
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      return fail(error, 400, fmt::format("malformed header line '{}'", printable(line)));
    }
    std::string_view name = line.substr(0, colon);
    if (!is_token(name)) {
      return fail(error, 400, fmt::format("malformed header name '{}'", printable(name)));
    }
    std::string_view value = trim_ows(line.substr(colon + 1));
    for (char c : value) {
      auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && u != '\t') || u == 0x7f) {
        return fail(error, 400, fmt::format("header '{}' has a control character in its value",
                                            printable(name)));
      }
    }
    if (iequals(name, "content-length")) {
      size_t n = 0;
      if (!parse_content_length(value, &n)) {
        return fail(error, 400, fmt::format("malformed Content-Length '{}'", printable(value)));
      }
      if (have_length && n != out->content_length) {
        return fail(error, 400, "conflicting Content-Length headers");
      }
      have_length = true;
      out->content_length = n;
    } else if (iequals(name, "transfer-encoding")) {
      return fail(error, 411,
                  "Transfer-Encoding request bodies are not supported; send Content-Length");
    } else if (iequals(name, "connection")) {
      if (!connection.empty()) connection += ',';
      connection += value;
    } else if (iequals(name, "expect")) {
      if (!iequals(value, "100-continue")) {
        return fail(error, 417, fmt::format("unsupported Expect '{}'", printable(value)));
      }
      out->expect_continue = true;
    }
    req.headers.emplace_back(std::string(name), std::string(value));
  }
  if (req.version_minor == 0) {
    out->keep_alive = list_has_token(connection, "keep-alive");
  } else {
    out->keep_alive = !list_has_token(connection, "close");
  }
  return true;
}

std::string_view http_reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

void append_json_string(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          *out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        } else {
          out->push_back(c);  // UTF-8 passes through; messages here are ASCII
        }
    }
  }
  out->push_back('"');
}

std::string http_error_body(int status, std::string_view message) {
  std::string body = "{\"error\":{\"message\":";
  append_json_string(&body, message);
  body += status >= 400 && status < 500 ? ",\"type\":\"invalid_request_error\""
                                        : ",\"type\":\"server_error\"";
  body += fmt::format(",\"param\":null,\"code\":{}}}}}", status);
  return body;
}

bool is_valid_header_name(std::string_view name) { return is_token(name); }

bool is_valid_header_value(std::string_view value) {
  for (char c : value) {
    if (c == '\r' || c == '\n' || c == '\0') return false;
  }
  return true;
}

}  // namespace tessera
