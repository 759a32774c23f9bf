// The coordinator's HTTP server over loopback with raw sockets: framing, keep-alive, limits,
// respond-later, streaming (600 concurrent streams), disconnects, backpressure, stop, and
// garbage input. Every wait is bounded by a deadline; nothing asserts on timing.
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "common/logging.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kWait = 10s;  // upper bound for anything that should happen "soon"

// ---------------------------------------------------------------------------------------------
// A small HTTP/1.1 client for the tests.

struct ParsedResponse {
  int status = 0;
  HttpHeaders headers;
  std::string body;                 // de-chunked
  std::vector<std::string> chunks;  // chunked: each chunk's payload
  bool chunked = false;
  std::string header(std::string_view name) const {
    for (const auto& [k, v] : headers) {
      if (iequals(k, name)) return v;
    }
    return {};
  }
};

// Parses one response at the start of `buf`. Returns the bytes it spans, 0 when incomplete
// (a body without framing is complete only at `eof`), or -1 when malformed.
long parse_response(std::string_view buf, bool eof, ParsedResponse* out) {
  size_t end = buf.find("\r\n\r\n");
  if (end == std::string_view::npos) return 0;
  *out = ParsedResponse();
  std::string_view head = buf.substr(0, end);
  size_t line_end = head.find("\r\n");
  std::string_view status_line = head.substr(0, line_end);
  if (status_line.substr(0, 9) != "HTTP/1.1 " || status_line.size() < 12) return -1;
  out->status = std::stoi(std::string(status_line.substr(9, 3)));
  size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) e = head.size();
    std::string_view line = head.substr(pos, e - pos);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return -1;
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    out->headers.emplace_back(std::string(line.substr(0, colon)), std::string(value));
    pos = e + 2;
  }
  size_t p = end + 4;
  if (out->status / 100 == 1) return static_cast<long>(p);
  if (iequals(out->header("transfer-encoding"), "chunked")) {
    out->chunked = true;
    for (;;) {
      size_t e = buf.find("\r\n", p);
      if (e == std::string_view::npos) return 0;
      size_t size = std::stoul(std::string(buf.substr(p, e - p)), nullptr, 16);
      if (buf.size() < e + 2 + size + 2) return 0;
      if (buf.substr(e + 2 + size, 2) != "\r\n") return -1;
      p = e + 2 + size + 2;
      if (size == 0) return static_cast<long>(p);
      out->chunks.emplace_back(buf.substr(e + 2, size));
      out->body += out->chunks.back();
    }
  }
  std::string length = out->header("content-length");
  if (!length.empty()) {
    size_t n = std::stoul(length);
    if (buf.size() < p + n) return 0;
    out->body = std::string(buf.substr(p, n));
    return static_cast<long>(p + n);
  }
  if (!eof) return 0;
  out->body = std::string(buf.substr(p));
  return static_cast<long>(buf.size());
}

class Client {
 public:
  explicit Client(int port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Client() { close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return connected_; }
  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  // Reads once (waiting up to `timeout`); false at EOF, reset or timeout.
  bool read_some(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char tmp[65536];
    ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  // The next final response (1xx are skipped), or nullopt at EOF / after kWait.
  std::optional<ParsedResponse> read_response() {
    auto deadline = Clock::now() + kWait;
    for (;;) {
      ParsedResponse r;
      long used = parse_response(buf_, eof_, &r);
      if (used < 0) return std::nullopt;
      if (used > 0) {
        buf_.erase(0, static_cast<size_t>(used));
        if (r.status / 100 == 1) continue;
        return r;
      }
      if (eof_ || Clock::now() > deadline) return std::nullopt;
      read_some(100ms);
    }
  }
  // True when the server closes the connection (EOF or reset) within kWait.
  bool wait_closed() {
    auto deadline = Clock::now() + kWait;
    while (!eof_ && Clock::now() < deadline) read_some(100ms);
    return eof_;
  }
  std::string& buffer() { return buf_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string buf_;
};

std::string get(std::string_view target, std::string_view extra = "") {
  return fmt::format("GET {} HTTP/1.1\r\nHost: test\r\n{}\r\n", target, extra);
}

std::string post(std::string_view target, std::string_view body, std::string_view extra = "") {
  return fmt::format("POST {} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     "Content-Length: {}\r\n{}\r\n{}",
                     target, body.size(), extra, body);
}

std::unique_ptr<HttpServer> start_server(HttpHandler handler, HttpServerOptions options = {}) {
  auto server = HttpServer::start(options, std::move(handler));
  EXPECT_TRUE(server.is_ok()) << server.status().to_string();
  return server.is_ok() ? std::move(server).value() : nullptr;
}

// Echoes the request as "METHOD path?query|x-test header|body".
void echo_handler(const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
  r->respond(200, "text/plain",
             fmt::format("{} {}?{}|{}|{}", req.method, req.path, req.query, req.header("X-Test"),
                         req.body));
}

// Waits until `pred` holds (checked under `mu`), at most kWait.
template <typename Pred>
bool wait_for(std::mutex& mu, std::condition_variable& cv, Pred pred) {
  std::unique_lock<std::mutex> lock(mu);
  return cv.wait_for(lock, kWait, pred);
}

// ---------------------------------------------------------------------------------------------
// Parser

TEST(HttpParser, FindsHeadEndAcrossReads) {
  std::string req = "\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\nBODY";
  size_t full = find_head_end(req);
  EXPECT_EQ(full, req.size() - 4);
  // Feeding byte by byte with scan_from gives the same answer as a full scan.
  size_t prev = 0;
  for (size_t n = 1; n <= req.size(); ++n) {
    size_t got = find_head_end(std::string_view(req).substr(0, n), prev);
    EXPECT_EQ(got, find_head_end(std::string_view(req).substr(0, n))) << n;
    if (got != std::string::npos) break;
    prev = n;
  }
  EXPECT_EQ(prev, full - 1);
  EXPECT_EQ(find_head_end("GET / HTTP/1.1\n\nrest"), 16u);
  EXPECT_EQ(find_head_end("GET / HTTP/1.1\r\nHost: x\r\n"), std::string::npos);
}

TEST(HttpParser, ParsesRequestLineHeadersAndTarget) {
  std::string head = "POST http://h:1/v1/x?a=1&b=2 HTTP/1.1\r\nContent-Length: 5\r\n"
                     "X-Thing:  v a l \r\nconnection: Keep-Alive, close\r\n\r\n";
  HttpRequestHead out;
  HttpParseError error;
  ASSERT_TRUE(parse_request_head(head, HttpParseLimits{}, &out, &error)) << error.message;
  EXPECT_EQ(out.request.method, "POST");
  EXPECT_EQ(out.request.path, "/v1/x");
  EXPECT_EQ(out.request.query, "a=1&b=2");
  EXPECT_EQ(out.request.header("x-THING"), "v a l");
  EXPECT_EQ(out.content_length, 5u);
  EXPECT_FALSE(out.keep_alive);
  EXPECT_EQ(out.head_bytes, head.size());

  ASSERT_TRUE(parse_request_head("GET /p HTTP/1.0\r\n\r\n", {}, &out, &error));
  EXPECT_FALSE(out.keep_alive);
  ASSERT_TRUE(parse_request_head("GET /p HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", {}, &out,
                                 &error));
  EXPECT_TRUE(out.keep_alive);
  ASSERT_TRUE(parse_request_head("GET /p HTTP/1.1\r\n\r\n", {}, &out, &error));
  EXPECT_TRUE(out.keep_alive);
}

TEST(HttpParser, RejectsMalformedHeads) {
  struct Case {
    const char* head;
    int status;
  };
  const Case cases[] = {
      {"GARBAGE\r\n\r\n", 400},
      {"GET /\r\n\r\n", 400},
      {"GET  / HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1 x\r\n\r\n", 400},
      {"G(T / HTTP/1.1\r\n\r\n", 400},
      {"GET / FTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET nopath HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nName : x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411},
      {"POST / HTTP/1.1\r\nExpect: magic\r\n\r\n", 417},
  };
  for (const Case& c : cases) {
    HttpRequestHead out;
    HttpParseError error;
    EXPECT_FALSE(parse_request_head(c.head, {}, &out, &error)) << c.head;
    EXPECT_EQ(error.status, c.status) << c.head << ": " << error.message;
    EXPECT_FALSE(error.message.empty());
  }
  HttpParseLimits small;
  small.max_header_count = 2;
  HttpRequestHead out;
  HttpParseError error;
  EXPECT_FALSE(parse_request_head("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", small, &out,
                                  &error));
  EXPECT_EQ(error.status, 431);
}

TEST(HttpParser, ErrorBodyIsAnOpenAIErrorObject) {
  EXPECT_EQ(http_error_body(413, "too \"big\"\n"),
            "{\"error\":{\"message\":\"too \\\"big\\\"\\n\",\"type\":\"invalid_request_error\","
            "\"param\":null,\"code\":413}}");
  EXPECT_NE(http_error_body(500, "x").find("server_error"), std::string::npos);
}

// Random bytes and mutated requests never crash the parser, and an incremental scan always
// agrees with a full one.
TEST(HttpParser, SurvivesRandomInput) {
  std::mt19937 rng(1234);
  const std::string seed = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
                           "Connection: keep-alive\r\n\r\nabc";
  const std::string alphabet = "GETPOST /?:\r\n\t-HTTP/1.01xContent-Length: 0123456789\x7f\x00";
  for (int iter = 0; iter < 20000; ++iter) {
    std::string data;
    if (iter % 2 == 0) {
      size_t n = rng() % 200;
      for (size_t i = 0; i < n; ++i) data.push_back(alphabet[rng() % alphabet.size()]);
    } else {
      data = seed;
      int mutations = 1 + static_cast<int>(rng() % 4);
      for (int m = 0; m < mutations; ++m) {
        size_t at = rng() % data.size();
        switch (rng() % 3) {
          case 0: data[at] = static_cast<char>(rng() & 0xff); break;
          case 1: data.erase(at, 1 + rng() % 4); break;
          default: data.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        }
        if (data.empty()) data = "x";
      }
    }
    size_t end = find_head_end(data);
    // Resuming a scan after a prefix that held no terminator finds the same end.
    size_t split = data.empty() ? 0 : rng() % data.size();
    if (find_head_end(std::string_view(data).substr(0, split)) == std::string::npos) {
      ASSERT_EQ(end, find_head_end(data, split)) << iter;
    }
    if (end != std::string::npos) {
      ASSERT_LE(end, data.size());
      HttpRequestHead out;
      HttpParseError error;
      if (!parse_request_head(std::string_view(data).substr(0, end), {}, &out, &error)) {
        ASSERT_TRUE(error.status >= 400 && error.status < 600);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Requests and responses

TEST(HttpServer, GetAndPostWithBodies) {
  auto server = start_server(echo_handler);
  ASSERT_TRUE(server);
  EXPECT_GT(server->port(), 0);
  Client c(server->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(get("/health?full=1", "X-Test: hi\r\n")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->header("Content-Type"), "text/plain");
  EXPECT_EQ(r->body, "GET /health?full=1|hi|");

  std::string body(100000, 'z');
  body += "{\"end\":true}";
  ASSERT_TRUE(c.send(post("/v1/completions", body)));
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /v1/completions?||" + body);
}

TEST(HttpServer, KeepAliveServesSequentialRequestsAndHonoursClose) {
  std::atomic<int> handled{0};
  auto server = start_server([&](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    ++handled;
    echo_handler(req, std::move(r));
  });
  ASSERT_TRUE(server);
  Client c(server->port());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c.send(post("/n", std::to_string(i))));
    auto r = c.read_response();
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->body, fmt::format("POST /n?||{}", i));
    EXPECT_EQ(r->header("Connection"), "keep-alive");
  }
  ASSERT_TRUE(c.send(get("/last", "Connection: close\r\n")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header("Connection"), "close");
  EXPECT_TRUE(c.wait_closed());
  EXPECT_EQ(handled.load(), 6);
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  auto server = start_server(echo_handler);
  ASSERT_TRUE(server);
  Client c(server->port());
  ASSERT_TRUE(c.send(post("/a", "1") + get("/b") + post("/c", "333")));
  for (const char* want : {"POST /a?||1", "GET /b?||", "POST /c?||333"}) {
    auto r = c.read_response();
    ASSERT_TRUE(r) << want;
    EXPECT_EQ(r->body, want);
  }
}

TEST(HttpServer, HeadAndHttp10AndExpectContinue) {
  auto server = start_server(echo_handler);
  ASSERT_TRUE(server);
  {
    Client c(server->port());
    ASSERT_TRUE(c.send("HEAD /h HTTP/1.1\r\n\r\n"));
    ASSERT_TRUE(c.read_some(kWait));
    EXPECT_NE(c.buffer().find("Content-Length: 10\r\n"), std::string::npos) << c.buffer();
    EXPECT_EQ(c.buffer().substr(c.buffer().size() - 4), "\r\n\r\n") << "HEAD must carry no body";
  }
  {
    Client c(server->port());
    ASSERT_TRUE(c.send("GET /old HTTP/1.0\r\n\r\n"));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "GET /old?||");
    EXPECT_TRUE(c.wait_closed());
  }
  {
    Client c(server->port());
    ASSERT_TRUE(c.send("POST /e HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"));
    ASSERT_TRUE(c.read_some(kWait));
    EXPECT_EQ(c.buffer(), "HTTP/1.1 100 Continue\r\n\r\n");
    ASSERT_TRUE(c.send("body"));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "POST /e?||body");
  }
}

TEST(HttpServer, OversizeBodyGets413WithJsonError) {
  HttpServerOptions options;
  options.max_body_bytes = 8 * 1024 * 1024;
  std::atomic<int> handled{0};
  auto server = start_server(
      [&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
        ++handled;
        r->respond(200, "text/plain", "no");
      },
      options);
  ASSERT_TRUE(server);
  Client c(server->port());
  std::string body(10 * 1000 * 1000, 'x');
  // The server answers from the headers; the client keeps sending meanwhile.
  std::thread sender([&] { c.send(post("/v1/completions", body)); });
  auto r = c.read_response();
  sender.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(r->header("Content-Type"), "application/json");
  EXPECT_NE(r->body.find("\"error\""), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("8388608"), std::string::npos) << r->body;
  EXPECT_EQ(handled.load(), 0);
  EXPECT_TRUE(c.wait_closed());

  // The server keeps serving others.
  Client ok(server->port());
  ASSERT_TRUE(ok.send(post("/x", "small")));
  auto r2 = ok.read_response();
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->status, 200);
}

TEST(HttpServer, MalformedRequestsGet4xxAndClose) {
  HttpServerOptions options;
  options.max_header_bytes = 4096;
  auto server = start_server(echo_handler, options);
  ASSERT_TRUE(server);
  struct Case {
    std::string request;
    int status;
  };
  const Case cases[] = {
      {"THIS IS NOT HTTP\r\n\r\n", 400},
      {"\x16\x03\x01\x02\x05\x01\x07\x01\xfc\x03\x03\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX-Big: " + std::string(5000, 'a') + "\r\n\r\n", 431},
      {"GET / HTTP/1.1\r\nX-Big: " + std::string(5000, 'a'), 431},  // no end in sight
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411},
      {"GET / HTTP/3.0\r\n\r\n", 505},
  };
  for (const Case& k : cases) {
    Client c(server->port());
    c.send(k.request);
    auto r = c.read_response();
    ASSERT_TRUE(r) << k.request.substr(0, 40);
    EXPECT_EQ(r->status, k.status) << k.request.substr(0, 40);
    EXPECT_NE(r->body.find("\"error\""), std::string::npos);
    EXPECT_EQ(r->header("Connection"), "close");
    EXPECT_TRUE(c.wait_closed());
  }
}

TEST(HttpServer, ConnectionsOverTheLimitGet503) {
  HttpServerOptions options;
  options.max_connections = 4;
  auto server = start_server(echo_handler, options);
  ASSERT_TRUE(server);
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<Client>(server->port()));
    ASSERT_TRUE(held.back()->send(get("/hold")));
    ASSERT_TRUE(held.back()->read_response());  // accepted and counted
  }
  Client extra(server->port());
  extra.send(get("/extra"));
  auto r = extra.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->header("Retry-After"), "1");
  EXPECT_TRUE(extra.wait_closed());
  // Closing one frees a slot.
  held.pop_back();
  bool served = false;
  for (int attempt = 0; attempt < 100 && !served; ++attempt) {
    Client again(server->port());
    again.send(get("/again"));
    auto r2 = again.read_response();
    served = r2 && r2->status == 200;
    if (!served) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(served);
}

TEST(HttpServer, StalledAndIdleClientsAreDropped) {
  HttpServerOptions options;
  options.request_timeout = 200ms;
  options.idle_timeout = 200ms;
  auto server = start_server(echo_handler, options);
  ASSERT_TRUE(server);
  Client half(server->port());
  ASSERT_TRUE(half.send("POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"a\":"));
  auto r = half.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
  EXPECT_TRUE(half.wait_closed());

  Client idle(server->port());
  EXPECT_TRUE(idle.wait_closed());
  EXPECT_TRUE(idle.buffer().empty());

  Client kept(server->port());
  ASSERT_TRUE(kept.send(get("/one")));
  ASSERT_TRUE(kept.read_response());
  EXPECT_TRUE(kept.wait_closed()) << "an idle keep-alive connection is closed";
}

// A client that sends its requests and then half-closes (shutdown(SHUT_WR)) gets every
// complete one it sent answered, then the connection closes; a request cut short by the
// half-close closes it at once (no 408 after the request timeout). (An EOF that arrives while a
// response is still pending is a disconnect, as nginx and uvicorn treat it: HttpServer cannot
// tell a half-close from a client that went away, and a client that went away should stop the
// work. ClientDisconnectWhileAwaitingResponseFiresOnDisconnect covers that.)
TEST(HttpServer, HalfClosedClientStillGetsItsResponses) {
  auto server = start_server(echo_handler);
  ASSERT_TRUE(server);
  for (int i = 0; i < 20; ++i) {
    Client c(server->port());
    ASSERT_TRUE(c.send(post("/v1/completions", "{\"i\":" + std::to_string(i) + "}")));
    ASSERT_EQ(::shutdown(c.fd(), SHUT_WR), 0);
    auto r = c.read_response();
    ASSERT_TRUE(r) << "request " << i << " got no response";
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "POST /v1/completions?||{\"i\":" + std::to_string(i) + "}");
    EXPECT_TRUE(c.wait_closed());
  }
  {  // pipelined requests
    Client c(server->port());
    ASSERT_TRUE(c.send(get("/first") + get("/second") + post("/third", "{}")));
    ASSERT_EQ(::shutdown(c.fd(), SHUT_WR), 0);
    for (const char* want : {"GET /first?||", "GET /second?||", "POST /third?||{}"}) {
      auto r = c.read_response();
      ASSERT_TRUE(r) << want;
      EXPECT_EQ(r->body, want);
    }
    EXPECT_TRUE(c.wait_closed());
  }
  {  // a body cut short: closed without an answer, long before the request timeout
    Client c(server->port());
    ASSERT_TRUE(c.send("POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"a\":"));
    ASSERT_EQ(::shutdown(c.fd(), SHUT_WR), 0);
    EXPECT_TRUE(c.wait_closed());  // within kWait, under the 30 s request timeout
    EXPECT_TRUE(c.buffer().empty());
  }
}

TEST(HttpServer, RespondLaterFromAnotherThread) {
  std::vector<std::thread> workers;
  std::mutex mu;
  auto server = start_server([&](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    std::lock_guard<std::mutex> lock(mu);
    workers.emplace_back([r, body = req.body] {
      std::this_thread::sleep_for(30ms);
      EXPECT_TRUE(r->respond(201, "application/json", "{\"later\":" + body + "}",
                             {{"X-Later", "yes"}, {"Content-Length", "999"}, {"Bad\r\nX", "1"}}));
      EXPECT_FALSE(r->respond(200, "text/plain", "twice"));
    });
  });
  ASSERT_TRUE(server);
  Client c(server->port());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.send(post("/slow", std::to_string(i))));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 201);
    EXPECT_EQ(r->header("X-Later"), "yes");
    EXPECT_EQ(r->body, fmt::format("{{\"later\":{}}}", i));
  }
  server->stop();
  std::lock_guard<std::mutex> lock(mu);
  for (auto& t : workers) t.join();
}

TEST(HttpServer, DroppedResponderAndThrowingHandlerGet500) {
  auto server = start_server([](const HttpRequest& req, std::shared_ptr<HttpResponder>) {
    if (req.path == "/throw") throw std::runtime_error("boom");
  });
  ASSERT_TRUE(server);
  Client c(server->port());
  for (const char* path : {"/drop", "/throw", "/drop"}) {
    ASSERT_TRUE(c.send(get(path)));
    auto r = c.read_response();
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 500);
    EXPECT_NE(r->body.find("server_error"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// Streaming

// Collects the streams the handler starts, keyed by the "id" query parameter.
struct StreamTable {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::shared_ptr<HttpStream>> streams;
  std::map<int, int> disconnects;

  HttpHandler handler() {
    return [this](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
      int id = std::stoi(req.query.substr(req.query.find('=') + 1));
      auto stream = r->start_stream(200, "text/event-stream", {{"X-Stream", std::to_string(id)}});
      stream->on_disconnect([this, id] {
        std::lock_guard<std::mutex> lock(mu);
        ++disconnects[id];
        cv.notify_all();
      });
      std::lock_guard<std::mutex> lock(mu);
      streams[id] = std::move(stream);
      cv.notify_all();
    };
  }
  std::shared_ptr<HttpStream> wait_stream(int id) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, kWait, [&] { return streams.count(id) > 0; });
    return streams.count(id) ? streams[id] : nullptr;
  }
  int disconnect_count(int id) {
    std::lock_guard<std::mutex> lock(mu);
    return disconnects.count(id) ? disconnects[id] : 0;
  }
  bool wait_disconnect(int id) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kWait, [&] { return disconnects.count(id) > 0; });
  }
};

TEST(HttpServer, StreamUsesChunksAndKeepsTheConnectionAlive) {
  StreamTable table;
  auto server = start_server(table.handler());
  ASSERT_TRUE(server);
  Client c(server->port());
  ASSERT_TRUE(c.send(get("/v1/completions?id=7")));
  auto stream = table.wait_stream(7);
  ASSERT_TRUE(stream);
  EXPECT_TRUE(stream->is_open());
  EXPECT_TRUE(stream->write("data: {\"a\":1}\n\n"));
  EXPECT_TRUE(stream->write(""));  // a no-op, not a terminator
  EXPECT_TRUE(stream->write("data: [DONE]\n\n"));
  EXPECT_TRUE(stream->close());
  EXPECT_FALSE(stream->write("late"));
  EXPECT_FALSE(stream->close());
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->chunked);
  EXPECT_EQ(r->header("Content-Type"), "text/event-stream");
  EXPECT_EQ(r->header("Cache-Control"), "no-cache");
  EXPECT_EQ(r->header("X-Stream"), "7");
  EXPECT_EQ(r->chunks, (std::vector<std::string>{"data: {\"a\":1}\n\n", "data: [DONE]\n\n"}));
  // The same connection serves the next request.
  ASSERT_TRUE(c.send(get("/v1/completions?id=8")));
  auto second = table.wait_stream(8);
  ASSERT_TRUE(second);
  second->write("x");
  second->close();
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->chunks, std::vector<std::string>{"x"});
  EXPECT_EQ(table.disconnect_count(7), 0);
}

TEST(HttpServer, Http10StreamEndsByClosing) {
  StreamTable table;
  auto server = start_server(table.handler());
  ASSERT_TRUE(server);
  Client c(server->port());
  ASSERT_TRUE(c.send("GET /s?id=1 HTTP/1.0\r\n\r\n"));
  auto stream = table.wait_stream(1);
  ASSERT_TRUE(stream);
  stream->write("ab");
  stream->write("cd");
  stream->close();
  EXPECT_TRUE(c.wait_closed());
  ParsedResponse r;
  ASSERT_GT(parse_response(c.buffer(), true, &r), 0);
  EXPECT_FALSE(r.chunked);
  EXPECT_EQ(r.body, "abcd");
}

// Raises the soft descriptor limit to the hard one; returns the soft limit now in force.
rlim_t raise_fd_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
    ::getrlimit(RLIMIT_NOFILE, &lim);
  }
  return lim.rlim_cur;
}

TEST(HttpServer, SixHundredConcurrentStreamsEachGetTheirOwnChunks) {
  rlim_t fds = raise_fd_limit();
  // Each stream costs two descriptors here (client and server ends).
  int n = static_cast<int>(std::min<rlim_t>(600, fds > 200 ? (fds - 200) / 2 : 0));
  if (n < 512) GTEST_SKIP() << "needs ~1400 file descriptors; the limit is " << fds;
  constexpr int kChunks = 20;
  constexpr int kProducers = 4;
  StreamTable table;
  auto server = start_server(table.handler());
  ASSERT_TRUE(server);

  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<Client>(server->port()));
    ASSERT_TRUE(clients.back()->connected()) << i;
    ASSERT_TRUE(clients.back()->send(get(fmt::format("/v1/completions?id={}", i),
                                         "Connection: close\r\n")));
  }
  ASSERT_TRUE(wait_for(table.mu, table.cv, [&] { return table.streams.size() == size_t(n); }))
      << table.streams.size() << " of " << n << " streams started";

  // Producers interleave writes over all streams, round by round.
  std::atomic<int> failed_writes{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int round = 0; round < kChunks; ++round) {
        for (int i = p; i < n; i += kProducers) {
          std::shared_ptr<HttpStream> s;
          {
            std::lock_guard<std::mutex> lock(table.mu);
            s = table.streams[i];
          }
          if (!s->write(fmt::format("data: {{\"id\":{},\"n\":{}}}\n\n", i, round))) ++failed_writes;
        }
      }
      for (int i = p; i < n; i += kProducers) {
        std::lock_guard<std::mutex> lock(table.mu);
        table.streams[i]->close();
      }
    });
  }

  // One reader polls every socket until each one is closed by the server.
  std::vector<pollfd> polls(n);
  for (int i = 0; i < n; ++i) polls[i] = {clients[i]->fd(), POLLIN, 0};
  int open = n;
  auto deadline = Clock::now() + 30s;
  std::vector<char> done(n, 0);
  while (open > 0 && Clock::now() < deadline) {
    if (::poll(polls.data(), polls.size(), 100) <= 0) continue;
    for (int i = 0; i < n; ++i) {
      if (done[i] || polls[i].revents == 0) continue;
      if (!clients[i]->read_some(0ms)) {
        done[i] = 1;
        polls[i].fd = -1;
        --open;
      }
    }
  }
  for (auto& t : producers) t.join();
  EXPECT_EQ(open, 0);
  EXPECT_EQ(failed_writes.load(), 0);
  for (int i = 0; i < n; ++i) {
    ParsedResponse r;
    std::string& buf = clients[i]->buffer();
    long used = parse_response(buf, true, &r);
    ASSERT_EQ(used, static_cast<long>(buf.size())) << "client " << i << " incomplete: " << buf;
    ASSERT_TRUE(r.chunked);
    ASSERT_EQ(r.header("X-Stream"), std::to_string(i));
    ASSERT_EQ(r.chunks.size(), size_t(kChunks)) << i;
    for (int round = 0; round < kChunks; ++round) {
      ASSERT_EQ(r.chunks[round], fmt::format("data: {{\"id\":{},\"n\":{}}}\n\n", i, round));
    }
    EXPECT_EQ(table.disconnect_count(i), 0);
  }
}

TEST(HttpServer, ClientDisconnectMidStreamFiresOnDisconnectOnce) {
  StreamTable table;
  auto server = start_server(table.handler());
  ASSERT_TRUE(server);
  auto c = std::make_unique<Client>(server->port());
  ASSERT_TRUE(c->send(get("/v1/chat/completions?id=3")));
  auto stream = table.wait_stream(3);
  ASSERT_TRUE(stream);
  ASSERT_TRUE(stream->write("data: first\n\n"));
  ASSERT_TRUE(c->read_some(kWait));  // headers and the first chunk arrived
  c->close();
  ASSERT_TRUE(table.wait_disconnect(3));
  EXPECT_FALSE(stream->write("data: after\n\n"));
  EXPECT_FALSE(stream->is_open());
  EXPECT_FALSE(stream->close());
  // A callback registered after the fact does not fire a second time.
  std::atomic<int> late{0};
  stream->on_disconnect([&] { ++late; });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(table.disconnect_count(3), 1);
  EXPECT_EQ(late.load(), 0);
  // The server is fine.
  Client other(server->port());
  ASSERT_TRUE(other.send(get("/x?id=4", "Connection: close\r\n")));
  auto s4 = table.wait_stream(4);
  ASSERT_TRUE(s4);
  s4->close();
  auto r = other.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(HttpServer, ClientDisconnectWhileAwaitingResponseFiresOnDisconnect) {
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<HttpResponder> held;
  int fired = 0;
  auto server = start_server([&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->on_disconnect([&] {
      std::lock_guard<std::mutex> lock(mu);
      ++fired;
      cv.notify_all();
    });
    std::lock_guard<std::mutex> lock(mu);
    held = std::move(r);
    cv.notify_all();
  });
  ASSERT_TRUE(server);
  auto c = std::make_unique<Client>(server->port());
  ASSERT_TRUE(c->send(post("/v1/completions", "{}")));
  ASSERT_TRUE(wait_for(mu, cv, [&] { return held != nullptr; }));
  EXPECT_TRUE(held->client_connected());
  c->close();
  ASSERT_TRUE(wait_for(mu, cv, [&] { return fired > 0; }));
  EXPECT_FALSE(held->client_connected());
  EXPECT_FALSE(held->respond(200, "text/plain", "too late"));
  auto stream = held->start_stream(200);
  ASSERT_TRUE(stream);
  EXPECT_FALSE(stream->write("x"));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(fired, 1);
}

TEST(HttpServer, SlowReaderIsDroppedWhenItsQueueOverflows) {
  HttpServerOptions options;
  options.max_output_bytes = 256 * 1024;
  StreamTable table;
  auto server = start_server(table.handler(), options);
  ASSERT_TRUE(server);
  Client c(server->port(), /*rcvbuf=*/4096);
  ASSERT_TRUE(c.send(get("/s?id=1")));
  auto stream = table.wait_stream(1);
  ASSERT_TRUE(stream);
  const std::string chunk(16 * 1024, 'y');
  bool refused = false;
  // The client never reads: kernel buffers fill, then the server's queue, then write fails.
  for (int i = 0; i < 100000 && !refused; ++i) {
    refused = !stream->write(chunk);
    if (i % 64 == 63) std::this_thread::sleep_for(1ms);  // let the loop move bytes to the kernel
  }
  EXPECT_TRUE(refused);
  ASSERT_TRUE(table.wait_disconnect(1));
  EXPECT_FALSE(stream->write("more"));
  EXPECT_TRUE(c.wait_closed());
  EXPECT_EQ(table.disconnect_count(1), 1);
}

TEST(HttpServer, DroppedStreamCutsTheConnection) {
  StreamTable table;
  auto server = start_server(table.handler());
  ASSERT_TRUE(server);
  Client c(server->port());
  ASSERT_TRUE(c.send(get("/s?id=1")));
  {
    auto stream = table.wait_stream(1);
    ASSERT_TRUE(stream);
    stream->write("partial");
    std::lock_guard<std::mutex> lock(table.mu);
    table.streams.clear();
  }
  EXPECT_TRUE(c.wait_closed());
  ParsedResponse r;
  EXPECT_EQ(parse_response(c.buffer(), false, &r), 0) << "the chunked body must be unterminated";
  EXPECT_EQ(table.disconnect_count(1), 0);
}

TEST(HttpServer, StopWithOpenStreamsReturnsAndEndsThem) {
  StreamTable table;
  auto server = start_server(table.handler());
  ASSERT_TRUE(server);
  constexpr int kStreams = 16;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<Client>(server->port()));
    ASSERT_TRUE(clients.back()->send(get(fmt::format("/s?id={}", i))));
  }
  ASSERT_TRUE(wait_for(table.mu, table.cv, [&] { return table.streams.size() == size_t(kStreams); }));
  for (auto& [id, s] : table.streams) EXPECT_TRUE(s->write("data: x\n\n"));
  // Writers keep going while the server stops.
  std::atomic<bool> writing{true};
  std::thread writer([&] {
    while (writing) {
      std::lock_guard<std::mutex> lock(table.mu);
      for (auto& [id, s] : table.streams) s->write("data: y\n\n");
    }
  });
  server->stop();
  server->stop();  // idempotent
  writing = false;
  writer.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(table.disconnect_count(i), 1) << i;
    EXPECT_FALSE(table.streams[i]->write("after stop"));
    EXPECT_TRUE(clients[i]->wait_closed());
  }
  server.reset();
  // Handles outlive the server safely.
  EXPECT_FALSE(table.streams[0]->write("after destruction"));
  EXPECT_FALSE(table.streams[0]->close());
}

// ---------------------------------------------------------------------------------------------
// Garbage

TEST(HttpServer, SurvivesGarbageAndPartialRequests) {
  HttpServerOptions options;
  options.max_body_bytes = 4096;
  options.max_header_bytes = 2048;
  options.request_timeout = 300ms;
  options.idle_timeout = 300ms;
  options.linger_timeout = 200ms;
  std::vector<std::shared_ptr<HttpStream>> streams;  // loop thread only
  auto server = start_server(
      [&](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
        if (req.path == "/stream") {
          auto s = r->start_stream(200);
          s->write("data: 1\n\n");
          if (req.body.size() % 2 == 0) s->close();
          streams.push_back(std::move(s));  // odd bodies leave the stream open
        } else if (req.path == "/later") {
          std::thread([r] { r->respond(200, "text/plain", "later"); }).detach();
        } else {
          echo_handler(req, std::move(r));
        }
      },
      options);
  ASSERT_TRUE(server);

  const std::vector<std::string> valid = {
      post("/v1/completions", "{\"prompt\":\"hi\"}"),
      get("/stream"),
      post("/stream", "odd"),
      get("/later"),
      "GET / HTTP/1.0\r\n\r\n",
      "POST /x HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\nabcd",
  };
  std::mt19937 rng(42);
  constexpr int kBatches = 12;
  constexpr int kPerBatch = 32;
  for (int batch = 0; batch < kBatches; ++batch) {
    std::vector<std::unique_ptr<Client>> clients;
    for (int k = 0; k < kPerBatch; ++k) {
      auto c = std::make_unique<Client>(server->port());
      std::string data;
      switch (rng() % 5) {
        case 0: {  // random bytes
          size_t n = rng() % 3000;
          for (size_t i = 0; i < n; ++i) data.push_back(static_cast<char>(rng() & 0xff));
          break;
        }
        case 1: {  // a valid request cut short
          const std::string& v = valid[rng() % valid.size()];
          data = v.substr(0, rng() % v.size());
          break;
        }
        case 2: {  // a valid request with a few bytes changed, removed or inserted
          data = valid[rng() % valid.size()];
          for (int m = 0; m < 3; ++m) {
            size_t at = rng() % data.size();
            if (rng() % 2) {
              data[at] = static_cast<char>(rng() & 0xff);
            } else {
              data.insert(at, std::string(1 + rng() % 8, static_cast<char>(rng() & 0xff)));
            }
          }
          break;
        }
        case 3: {  // several valid requests pipelined, the last one possibly cut
          for (int m = 0; m < 3; ++m) data += valid[rng() % valid.size()];
          data.resize(data.size() - rng() % 20);
          break;
        }
        default: {  // huge header or huge declared body
          data = rng() % 2 ? "GET / HTTP/1.1\r\nX: " + std::string(5000, 'h')
                           : "POST / HTTP/1.1\r\nContent-Length: 999999999\r\n\r\nxx";
          break;
        }
      }
      // Send in a few pieces; the server may already have closed (that is fine).
      size_t pos = 0;
      while (pos < data.size()) {
        size_t piece = 1 + rng() % (data.size() - pos);
        if (!c->send(std::string_view(data).substr(pos, piece))) break;
        pos += piece;
      }
      int ending = static_cast<int>(rng() % 3);
      if (ending == 0) c->close();                       // vanish abruptly
      if (ending == 1) ::shutdown(c->fd(), SHUT_WR);     // half-close
      clients.push_back(std::move(c));
    }
    for (auto& c : clients) {
      if (c->fd() >= 0) c->read_some(5ms);
    }
  }
  // Still serving.
  for (int i = 0; i < 3; ++i) {
    Client c(server->port());
    ASSERT_TRUE(c.send(post("/final", "ok")));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "POST /final?||ok");
  }
  server->stop();
  for (auto& s : streams) EXPECT_FALSE(s->write("x"));
}

TEST(HttpServer, StartFailsCleanlyOnABusyPort) {
  auto first = start_server(echo_handler);
  ASSERT_TRUE(first);
  HttpServerOptions options;
  options.port = first->port();
  auto second = HttpServer::start(options, echo_handler);
  // SO_REUSEADDR does not allow two listeners on one port.
  ASSERT_FALSE(second.is_ok());
  EXPECT_NE(second.status().message().find(std::to_string(first->port())), std::string::npos)
      << second.status().to_string();
  HttpServerOptions bad;
  bad.host = "not a host name!";
  EXPECT_FALSE(HttpServer::start(bad, echo_handler).is_ok());
}

}  // namespace
}  // namespace tessera
