// The benchmarks' blocking HTTP/1.1 client, an adapter over cpp-httplib (Debian
// libcpp-httplib-dev 0.11): one TCP connection per HttpClient, reused across requests
// (keep-alive) and reopened when the server closed it. Bodies framed by Content-Length, chunked
// transfer coding, or connection close are handed to a callback piece by piece as each recv()
// returns them, so server-sent event streams can be timed token by token. Every wait is
// bounded: connect, each read (longest silence) and the whole request. No TLS (the servers
// under test are local or behind plain HTTP).
//
// Thread-safety: an HttpClient is used by one thread at a time; SseParser likewise. Each
// HttpClient owns one watchdog thread that enforces request deadlines.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tessera {

// "http://host:port/prefix" split into parts; the port defaults to 80 and the prefix ("/v1"
// style, no trailing slash) to "".
struct HttpUrl {
  std::string host;
  int port = 80;
  std::string path_prefix;
};
Result<HttpUrl> parse_http_url(std::string_view url);

struct HttpClientOptions {
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds read_timeout{120000};  // longest silence while waiting for bytes
};

struct HttpClientResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names as sent, sorted by name
  std::string body;  // empty when a body callback consumed it

  // The first header named `name` (ASCII case-insensitive), or "".
  std::string header(std::string_view name) const;
};

// Receives the (de-chunked) body piece by piece; return false to stop reading (the connection
// is then closed, and the request still counts as answered).
using HttpBodyCallback = std::function<bool(std::string_view piece)>;

class HttpClient {
 public:
  explicit HttpClient(HttpUrl url, HttpClientOptions options = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends `method path` (path below the URL's prefix, e.g. "/v1/completions") with `body`
  // (Content-Length; omitted when empty and the method is GET) and reads the response until
  // its end or `deadline`. With `on_body`, the body goes to the callback only when the status
  // is 2xx (an error body is still collected into the response). A request on a reused
  // connection that the server had closed is retried once on a new connection. Errors:
  // unavailable (connect failed; connection closed, reset or malformed response: the library
  // does not tell these apart), deadline_exceeded (`deadline`, connect_timeout, read_timeout).
  Result<HttpClientResponse> request(std::string_view method, std::string_view path, std::string_view body,
                                     std::chrono::steady_clock::time_point deadline,
                                     const HttpBodyCallback& on_body = {});

  // Convenience: GET with a timeout.
  Result<HttpClientResponse> get(std::string_view path, std::chrono::milliseconds timeout);

  void close();
  bool connected() const;

 private:
  struct Impl;  // the cpp-httplib client and the deadline watchdog; http_client.cpp only

  HttpUrl url_;
  HttpClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

// Splits a server-sent event stream into events and hands each event's data (its "data:"
// lines joined by '\n'; other fields ignored) to the callback. Returns false from feed() once
// the callback returned false.
class SseParser {
 public:
  bool feed(std::string_view bytes, const std::function<bool(std::string_view data)>& on_event);

 private:
  std::string pending_;  // an incomplete line
  std::string data_;     // the current event's data so far
  bool has_data_ = false;
};

}  // namespace tessera
