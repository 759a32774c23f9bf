// The coordinator's HTTP/1.1 server (ARCHITECTURE.md): one epoll event-loop thread serving thousands
// of keep-alive connections and streaming responses (server-sent events) at once, so no stream
// ever waits for another's thread. No third-party HTTP library.
//
// Request flow: the loop reads and parses a request (server/http_parser.h), then calls the
// application's HttpHandler on the loop thread with the request and a shared HttpResponder.
// The handler must be quick (parse, validate, enqueue to the engine thread); it completes the
// request then or later, from any thread, with exactly one of
//   * responder->respond(status, content_type, body): a Content-Length response, or
//   * responder->start_stream(status, "text/event-stream"): a chunked response whose chunks
//     the application writes with stream->write() and ends with stream->close().
// One request per connection is processed at a time; pipelined requests wait their turn.
//
// Thread-safety and lifetimes:
//   * HttpServer: start() / port() / stop() / the destructor from the owning thread; never from
//     a handler or callback (stop() joins the loop thread).
//   * HttpResponder and HttpStream: every method is thread-safe and non-blocking (a mutex held
//     for a copy; the loop is woken through an eventfd). Both are shared handles that may
//     outlive the connection and the server: once the client is gone (disconnect, timeout,
//     backpressure overflow, server stop) respond() and write() return false and nothing else
//     happens. They hold only the request's exchange state, never the socket.
//   * on_disconnect: at most one callback runs per request, on the loop thread, when the
//     connection ends before the response was complete (before respond(), or before
//     stream->close()): client disconnect, write timeout, output-queue overflow, or server
//     stop. If the connection is already gone when the callback is registered (and none ran
//     yet), it runs at once on the registering thread. The callback must be quick and must not call HttpServer::stop(); it may call the handle's
//     methods. Callbacks are released after they run or when the response completes, so a
//     callback that captures the stream does not keep it alive forever.
//   * A responder dropped without a response sends 500. A stream dropped without close() cuts
//     the connection (the client sees a truncated chunked body) and fires no callback.
//
// Limits (HttpServerOptions): head size (431), body size (413, checked from Content-Length
// before the body is read), connections (503 then close), request reception time (408 then
// close: a client that sends half a request and stalls is dropped), keep-alive idle time,
// write stall time and per-connection queued output (both drop the connection and fire
// on_disconnect). Client EOF (FIN) while a request is in progress counts as a disconnect.
// max_output_bytes bounds stream writes only; respond() bodies are queued whole.
//
// One loop thread serves every connection: handlers and callbacks must not block it.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "server/http_parser.h"

namespace tessera {

namespace detail {
struct HttpExchange;
}

// A chunked streaming response. Created by HttpResponder::start_stream().
class HttpStream {
 public:
  explicit HttpStream(std::shared_ptr<detail::HttpExchange> exchange);
  ~HttpStream();  // without close(): cuts the connection, no callback
  HttpStream(const HttpStream&) = delete;
  HttpStream& operator=(const HttpStream&) = delete;

  // Queues `chunk` as one HTTP chunk (an empty chunk is a no-op: it would end the body).
  // Returns false, queueing nothing, once the client is gone or the stream closed. When the
  // connection's unsent output would exceed HttpServerOptions::max_output_bytes the
  // connection is dropped (on_disconnect fires) and false is returned.
  bool write(std::string chunk);
  // Ends the body (terminating chunk); the connection then serves its next request or closes
  // (Connection: close / HTTP/1.0). Idempotent; false when already closed or gone.
  bool close();
  // True while write() can succeed.
  bool is_open() const;
  // See the file comment. Replaces an earlier callback.
  void on_disconnect(std::function<void()> callback);

 private:
  std::shared_ptr<detail::HttpExchange> exchange_;  // null for a stream that was never valid
};

// Completes one request. Created by the server and handed to the HttpHandler.
class HttpResponder {
 public:
  explicit HttpResponder(std::shared_ptr<detail::HttpExchange> exchange);
  ~HttpResponder();  // without respond() or start_stream(): sends 500
  HttpResponder(const HttpResponder&) = delete;
  HttpResponder& operator=(const HttpResponder&) = delete;

  // Sends a complete response with Content-Length. `status` is 200..599. `extra_headers` must
  // not set Content-Length, Transfer-Encoding or Connection (the server owns framing; such
  // entries, and any with invalid names or values, are dropped with a warning). Returns false
  // when the request was already answered or the client is gone.
  bool respond(int status, std::string content_type, std::string body,
               HttpHeaders extra_headers = {});
  // respond(status, "application/json", http_error_body(status, message)).
  bool respond_error(int status, std::string_view message, HttpHeaders extra_headers = {});
  // Sends the status line and headers (Transfer-Encoding: chunked, Cache-Control: no-cache)
  // and returns the stream for the body. Never null: when the client is gone or the request
  // was already answered, the returned stream is closed (write() returns false).
  std::shared_ptr<HttpStream> start_stream(int status,
                                           std::string content_type = "text/event-stream",
                                           HttpHeaders extra_headers = {});
  // False once the client is gone (and after the response completed).
  bool client_connected() const;
  // See the file comment; also covers non-streaming requests still waiting for respond().
  void on_disconnect(std::function<void()> callback);

 private:
  std::shared_ptr<detail::HttpExchange> exchange_;
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpResponder>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";        // numeric address or name; "0.0.0.0" / "::" for all
  int port = 0;                          // 0: an ephemeral port (see HttpServer::port())
  size_t max_header_bytes = 64 * 1024;   // request line + headers; over: 431
  size_t max_header_count = 128;         // over: 431
  size_t max_body_bytes = 8 * 1024 * 1024;  // Content-Length over this: 413
  int max_connections = 4096;            // open client connections; over: 503 and close
  size_t max_output_bytes = 8 * 1024 * 1024;  // unsent bytes queued per connection (streams)
  std::chrono::milliseconds idle_timeout{60000};     // keep-alive connection with no request
  std::chrono::milliseconds request_timeout{30000};  // first byte to full request; over: 408
  std::chrono::milliseconds write_timeout{30000};    // pending output with no progress
  std::chrono::milliseconds linger_timeout{2000};    // draining input after a closing response
  int listen_backlog = 1024;
};

class HttpServer {
 public:
  // Binds, listens and starts the loop thread. Errors name the host and port.
  static Result<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options,
                                                   HttpHandler handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;  // the bound port (the ephemeral one when options.port was 0)
  // Stops accepting, closes every connection (firing on_disconnect for unfinished responses
  // on the loop thread), and joins the loop thread. With flush > 0 the connections first get up
  // to that long to finish what they are sending (responses and streams in progress, their
  // queued bytes, lingering closes) while nothing new is accepted; otherwise it returns
  // promptly: it never waits for streams or handlers' deferred work. Idempotent.
  void stop(std::chrono::milliseconds flush = std::chrono::milliseconds(0));

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
