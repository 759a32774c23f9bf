#include "loadgen/http_client.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>

namespace tessera {
namespace {

using SteadyClock = std::chrono::steady_clock;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// Debian's libcpp-httplib is built with CPPHTTPLIB_SEND_FLAGS 0 (no MSG_NOSIGNAL), so a send()
// to a connection the server has just reset raises SIGPIPE, which would end the whole bench.
// The signal is synchronous (sent to the thread that wrote): block it in this thread for the
// request, drop one that became pending meanwhile, and restore the mask. No process-wide change.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

}  // namespace

Result<HttpUrl> parse_http_url(std::string_view url) {
  HttpUrl u;
  std::string_view rest = url;
  if (rest.rfind("http://", 0) == 0) {
    rest.remove_prefix(7);
  } else if (rest.rfind("https://", 0) == 0) {
    return Status::unimplemented(fmt::format("url '{}': https is not supported; use http://", url));
  } else if (rest.find("://") != std::string_view::npos) {
    return Status::invalid_argument(fmt::format("url '{}': only http:// is supported", url));
  }
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  u.path_prefix = slash == std::string_view::npos ? "" : std::string(rest.substr(slash));
  while (!u.path_prefix.empty() && u.path_prefix.back() == '/') u.path_prefix.pop_back();
  if (authority.empty()) return Status::invalid_argument(fmt::format("url '{}': no host", url));
  if (authority.front() == '[') {  // [::1]:8000
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return Status::invalid_argument(fmt::format("url '{}': unclosed '['", url));
    u.host = std::string(authority.substr(1, close - 1));
    authority.remove_prefix(close + 1);
    if (!authority.empty() && authority.front() != ':')
      return Status::invalid_argument(fmt::format("url '{}': expected ':' after ']'", url));
  } else {
    const size_t colon = authority.rfind(':');
    u.host = std::string(authority.substr(0, colon));
    authority = colon == std::string_view::npos ? std::string_view() : authority.substr(colon);
  }
  if (!authority.empty()) {
    const std::string port(authority.substr(1));
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || p < 1 || p > 65535)
      return Status::invalid_argument(fmt::format("url '{}': bad port '{}'", url, port));
    u.port = static_cast<int>(p);
  }
  if (u.host.empty()) return Status::invalid_argument(fmt::format("url '{}': no host", url));
  return u;
}

std::string HttpClientResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return "";
}

// cpp-httplib 0.11 bounds the connect and each read or write (poll() with a timeout before
// every recv()/send()), but has no limit on a whole request. The watchdog supplies it: armed
// with the request's deadline, it calls httplib::Client::stop() once the deadline passes (the
// library's one thread-safe way to end a request in flight: shutdown() on the socket, so the
// blocked poll() returns), and again every 10 ms until disarmed, in case the request was still
// connecting the first time.
struct HttpClient::Impl {
  Impl(const HttpUrl& url, const HttpClientOptions& options) : client(url.host, url.port) {
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);
    client.set_decompress(false);  // bodies are timed as they come off the socket
    client.set_follow_location(false);
    client.set_url_encode(false);  // paths go out as given
    client.set_read_timeout(options.read_timeout);
    client.set_write_timeout(options.read_timeout);
    watchdog = std::thread([this] { watch(); });
  }
  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      quit = true;
    }
    cv.notify_one();
    watchdog.join();
  }

  // Waking the watchdog costs a context switch on the request's critical path (before it is
  // sent, so it would add to TTFT); it is woken only when it sleeps past the new deadline. It
  // then finds a disarmed or later deadline when it wakes and sleeps on.
  void arm(SteadyClock::time_point deadline) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu);
      armed = deadline;
      fired = false;
      wake = deadline < sleeping_until;
    }
    if (wake) cv.notify_one();
  }
  // True when the deadline passed while armed (the request was or will be cut short).
  bool disarm() {
    std::lock_guard<std::mutex> lock(mu);
    armed.reset();
    return fired;
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mu);
    while (!quit) {
      if (!armed) {
        sleeping_until = SteadyClock::time_point::max();
        cv.wait(lock);
        continue;
      }
      const auto when = *armed;
      if (SteadyClock::now() < when) {
        sleeping_until = when;
        cv.wait_until(lock, when);
        continue;
      }
      fired = true;
      client.stop();
      sleeping_until = SteadyClock::now() + std::chrono::milliseconds(10);
      cv.wait_until(lock, sleeping_until);
    }
  }

  httplib::Client client;
  std::mutex mu;  // guards armed, fired, quit, sleeping_until
  std::condition_variable cv;
  std::optional<SteadyClock::time_point> armed;
  bool fired = false;
  bool quit = false;
  SteadyClock::time_point sleeping_until = SteadyClock::time_point::min();  // the watchdog's wake-up
  std::thread watchdog;  // last: started once the members it uses exist
};

HttpClient::HttpClient(HttpUrl url, HttpClientOptions options)
    : url_(std::move(url)), options_(options), impl_(std::make_unique<Impl>(url_, options_)) {}

HttpClient::~HttpClient() = default;

void HttpClient::close() { impl_->client.stop(); }  // no request in flight: closes the socket

bool HttpClient::connected() const { return impl_->client.is_socket_open() != 0; }

Result<HttpClientResponse> HttpClient::request(std::string_view method, std::string_view path, std::string_view body,
                                               SteadyClock::time_point deadline, const HttpBodyCallback& on_body) {
  const std::string where = fmt::format("{}:{}", url_.host, url_.port);
  const bool bracket = url_.host.find(':') != std::string::npos;  // an IPv6 literal
  httplib::Request req;
  req.method = std::string(method);
  req.path = url_.path_prefix + std::string(path);
  req.headers = {{"Host", bracket ? fmt::format("[{}]:{}", url_.host, url_.port) : where},
                 {"User-Agent", "tessera-bench"},
                 {"Accept", "*/*"}};
  if (!body.empty() || method != "GET") {
    req.body = std::string(body);
    req.headers.emplace("Content-Type", "application/json");
    // The library adds Content-Length itself for a body, and "0" for an empty POST, PUT or PATCH.
    if (body.empty() && method != "POST" && method != "PUT" && method != "PATCH")
      req.headers.emplace("Content-Length", "0");
  }

  HttpClientResponse resp;
  bool head_seen = false, to_callback = false, stopped = false;
  SteadyClock::time_point last_bytes;  // when the request was sent or the last piece arrived
  req.response_handler = [&](const httplib::Response& r) {
    head_seen = true;
    resp.status = r.status;
    to_callback = on_body && r.status >= 200 && r.status < 300;
    return true;
  };
  // Called for each recv() that returned body bytes; the library reads nothing further first.
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    last_bytes = SteadyClock::now();
    if (!to_callback) {
      resp.body.append(data, n);
      return true;
    }
    if (!on_body(std::string_view(data, n))) stopped = true;
    return !stopped;
  };

  const SigpipeBlock no_sigpipe;
  for (int attempt = 0;; ++attempt) {
    const auto now = SteadyClock::now();
    if (now >= deadline) return Status::deadline_exceeded(fmt::format("{}: request deadline passed", where));
    const bool reused = connected();
    impl_->client.set_connection_timeout(
        std::min<SteadyClock::duration>(options_.connect_timeout, deadline - now));
    head_seen = to_callback = stopped = false;
    resp = HttpClientResponse{};
    last_bytes = now;
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    impl_->arm(deadline);
    const bool ok = impl_->client.send(req, res, error);
    const bool deadline_passed = impl_->disarm();
    // A body framed by the connection's close also "ends" when the watchdog shuts it down.
    const bool close_delimited = !res.has_header("Content-Length") && !res.has_header("Transfer-Encoding");
    if (ok && deadline_passed && close_delimited && res.status != 204 && method != "HEAD")
      return Status::deadline_exceeded(fmt::format("{}: request deadline passed", where));
    // After a cancel (the callback said stop) the library has closed the connection.
    if (ok || (error == httplib::Error::Canceled && stopped)) {
      resp.status = res.status;
      for (const auto& [k, v] : res.headers) resp.headers.emplace_back(k, v);
      return resp;
    }
    if (deadline_passed) return Status::deadline_exceeded(fmt::format("{}: request deadline passed", where));
    // A kept-alive connection may have been closed by the server just before we used it.
    const bool lost = error == httplib::Error::Read || error == httplib::Error::Write;
    if (lost && reused && !head_seen && attempt == 0) continue;
    switch (error) {
      case httplib::Error::Connection:
        return Status::unavailable(fmt::format("connect to {}: refused, unreachable or unknown host", where));
      case httplib::Error::ConnectionTimeout:
        return Status::deadline_exceeded(
            fmt::format("connect to {}: no answer in {} ms", where, options_.connect_timeout.count()));
      case httplib::Error::Write:
        return Status::unavailable(fmt::format("{}: send failed (connection closed or reset)", where));
      case httplib::Error::Read:
        // The library reports a timeout, a reset, an early close and bad framing alike; only
        // the silence can be told apart, from the clock.
        if (SteadyClock::now() - last_bytes >= options_.read_timeout)
          return Status::deadline_exceeded(
              fmt::format("{}: no data for {} ms", where, options_.read_timeout.count()));
        return Status::unavailable(
            fmt::format("{}: connection closed, reset or malformed response {}", where,
                        head_seen ? "in the body" : "before the response head"));
      default:
        return Status::unavailable(fmt::format("{}: {}", where, httplib::to_string(error)));
    }
  }
}

Result<HttpClientResponse> HttpClient::get(std::string_view path, std::chrono::milliseconds timeout) {
  return request("GET", path, "", SteadyClock::now() + timeout);
}

bool SseParser::feed(std::string_view bytes, const std::function<bool(std::string_view data)>& on_event) {
  pending_.append(bytes);
  size_t pos = 0;
  bool go_on = true;
  for (;;) {
    const size_t nl = pending_.find('\n', pos);
    if (nl == std::string::npos) break;
    std::string_view line(pending_.data() + pos, nl - pos);
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {  // end of event
      if (has_data_ && go_on) go_on = on_event(data_);
      data_.clear();
      has_data_ = false;
      continue;
    }
    if (line.front() == ':') continue;  // comment
    const size_t colon = line.find(':');
    const std::string_view field = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_.append(value);
      has_data_ = true;
    }
  }
  pending_.erase(0, pos);
  return go_on;
}

}  // namespace tessera
