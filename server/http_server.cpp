#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "common/check.h"
#include "common/logging.h"

namespace tessera {

using Clock = std::chrono::steady_clock;

namespace detail {

// How application threads hand work to the loop: exchanges with new output (or a new phase)
// are queued here and the loop is woken through an eventfd. Shared by the loop and every
// exchange so that a handle outliving the server still has a valid (stopped) mailbox.
struct LoopMailbox {
  std::mutex mu;
  std::vector<std::shared_ptr<HttpExchange>> dirty;  // guarded by mu
  bool stopped = false;                              // guarded by mu
  int wake_fd = -1;                                  // eventfd, owned

  ~LoopMailbox() {
    if (wake_fd >= 0) ::close(wake_fd);
  }
  void wake() const {
    uint64_t one = 1;
    ssize_t r = ::write(wake_fd, &one, sizeof one);
    (void)r;  // EAGAIN only when the counter is saturated: the loop is awake anyway
  }
  void post(std::shared_ptr<HttpExchange> exchange) {
    bool was_empty = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopped) return;
      was_empty = dirty.empty();
      dirty.push_back(std::move(exchange));
    }
    if (was_empty) wake();
  }
};

// The state of one request shared by its HttpResponder, its HttpStream and the loop. The
// loop finds the connection by conn_id; the exchange never points at the connection, so
// handles can outlive it safely.
struct HttpExchange : std::enable_shared_from_this<HttpExchange> {
  enum class Phase { kAwaiting, kResponded, kStreaming, kStreamClosed, kStreamCut };

  // Immutable after creation.
  std::shared_ptr<LoopMailbox> mailbox;
  uint64_t conn_id = 0;
  bool keep_alive = true;
  bool head_only = false;  // HEAD: the body is not sent
  bool chunked = true;     // HTTP/1.1; an HTTP/1.0 stream is delimited by closing
  size_t max_output_bytes = 0;
  // Bytes the loop holds for this exchange and has not sent yet (written by the loop).
  std::atomic<size_t> loop_unsent{0};

  std::mutex mu;
  Phase phase = Phase::kAwaiting;        // guarded by mu
  bool gone = false;                     // the exchange ended; guarded by mu
  bool overflow = false;                 // write() found the output queue full; guarded
  bool close_connection = false;         // the response asks to close; guarded
  bool queued = false;                   // in the mailbox; guarded
  bool disconnect_fired = false;         // guarded
  std::string pending;                   // bytes for the loop; guarded
  std::function<void()> on_disconnect;   // guarded

  bool unfinished() const { return phase == Phase::kAwaiting || phase == Phase::kStreaming; }

  // Called with mu held after changing pending/phase; the caller posts when this returns true.
  bool mark_queued() {
    if (queued) return false;
    queued = true;
    return true;
  }
  void post() { mailbox->post(shared_from_this()); }

  void set_on_disconnect(std::function<void()> callback);
  // Loop thread: the connection is finished with this exchange, normally or not. Fires the
  // callback when the response was unfinished.
  void end();
};

namespace {
void run_callback(const std::function<void()>& callback) {
  try {
    callback();
  } catch (const std::exception& e) {
    TESSERA_LOG_ERROR("http: on_disconnect callback threw: {}", e.what());
  } catch (...) {
    TESSERA_LOG_ERROR("http: on_disconnect callback threw");
  }
}
}  // namespace

void HttpExchange::set_on_disconnect(std::function<void()> callback) {
  std::function<void()> run_now;
  std::function<void()> old;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!unfinished()) return;  // the response is complete: nothing can disconnect it
    if (gone) {
      if (!disconnect_fired) {
        disconnect_fired = true;
        run_now = std::move(callback);
      }
    } else {
      old = std::move(on_disconnect);
      on_disconnect = std::move(callback);
    }
  }
  if (run_now) run_callback(run_now);
}

void HttpExchange::end() {
  // Callbacks are moved out and destroyed without the lock held: one that captures this
  // request's stream may run the stream's destructor, which takes the lock.
  std::function<void()> callback;
  bool fire = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    gone = true;
    pending.clear();
    callback = std::move(on_disconnect);
    on_disconnect = nullptr;
    if (unfinished() && !disconnect_fired && callback) {
      disconnect_fired = true;
      fire = true;
    }
  }
  if (fire) run_callback(callback);
}

}  // namespace detail

namespace {

using detail::HttpExchange;
using Phase = detail::HttpExchange::Phase;

bool is_framing_header(std::string_view name) {
  return iequals(name, "content-length") || iequals(name, "transfer-encoding") ||
         iequals(name, "connection");
}

struct HeadSpec {
  int status = 200;
  std::string_view content_type;
  const HttpHeaders* extra = nullptr;
  bool close = false;
  std::optional<size_t> content_length;
  bool chunked = false;
  bool no_cache = false;
};

std::string response_head(const HeadSpec& s) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\n", s.status, http_reason_phrase(s.status));
  if (!s.content_type.empty() && is_valid_header_value(s.content_type)) {
    h += fmt::format("Content-Type: {}\r\n", s.content_type);
  }
  if (s.content_length) h += fmt::format("Content-Length: {}\r\n", *s.content_length);
  if (s.chunked) h += "Transfer-Encoding: chunked\r\n";
  bool has_cache_control = false;
  if (s.extra != nullptr) {
    for (const auto& [name, value] : *s.extra) {
      if (!is_valid_header_name(name) || !is_valid_header_value(value)) {
        TESSERA_LOG_WARN("http: dropped a response header with an invalid name or value");
        continue;
      }
      if (is_framing_header(name)) {
        TESSERA_LOG_WARN("http: dropped response header '{}': the server sets framing", name);
        continue;
      }
      if (iequals(name, "cache-control")) has_cache_control = true;
      h += fmt::format("{}: {}\r\n", name, value);
    }
  }
  if (s.no_cache && !has_cache_control) h += "Cache-Control: no-cache\r\n";
  h += s.close ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
  return h;
}

std::string format_address(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    return fmt::format("[{}]:{}", host, ntohs(a->sin6_port));
  }
  return "unknown";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// HttpStream / HttpResponder

HttpStream::HttpStream(std::shared_ptr<detail::HttpExchange> exchange)
    : exchange_(std::move(exchange)) {}

HttpStream::~HttpStream() {
  if (!exchange_) return;
  bool post = false;
  std::function<void()> old;
  {
    std::lock_guard<std::mutex> lock(exchange_->mu);
    if (exchange_->gone || exchange_->phase != Phase::kStreaming) return;
    exchange_->phase = Phase::kStreamCut;
    old = std::move(exchange_->on_disconnect);
    exchange_->on_disconnect = nullptr;
    post = exchange_->mark_queued();
  }
  TESSERA_LOG_WARN("http: stream dropped without close(); cutting the connection");
  if (post) exchange_->post();
}

bool HttpStream::write(std::string chunk) {
  if (!exchange_) return false;
  HttpExchange& ex = *exchange_;
  if (chunk.empty()) return is_open();
  bool post = false;
  bool accepted = true;
  {
    std::lock_guard<std::mutex> lock(ex.mu);
    if (ex.gone || ex.phase != Phase::kStreaming) return false;
    if (ex.head_only) return true;
    size_t framed = chunk.size() + (ex.chunked ? 20 : 0);
    if (ex.pending.size() + ex.loop_unsent.load(std::memory_order_relaxed) + framed >
        ex.max_output_bytes) {
      // A client that does not read must not make the server buffer without limit: the loop
      // drops the connection and fires the callback.
      ex.overflow = true;
      ex.gone = true;
      ex.pending.clear();
      accepted = false;
    } else if (ex.chunked) {
      ex.pending += fmt::format("{:x}\r\n", chunk.size());
      ex.pending += chunk;
      ex.pending += "\r\n";
    } else {
      ex.pending += chunk;
    }
    post = ex.mark_queued();
  }
  if (post) ex.post();
  return accepted;
}

bool HttpStream::close() {
  if (!exchange_) return false;
  HttpExchange& ex = *exchange_;
  bool post = false;
  std::function<void()> old;
  {
    std::lock_guard<std::mutex> lock(ex.mu);
    if (ex.gone || ex.phase != Phase::kStreaming) return false;
    ex.phase = Phase::kStreamClosed;
    if (ex.chunked && !ex.head_only) ex.pending += "0\r\n\r\n";
    old = std::move(ex.on_disconnect);
    ex.on_disconnect = nullptr;
    post = ex.mark_queued();
  }
  if (post) ex.post();
  return true;
}

bool HttpStream::is_open() const {
  if (!exchange_) return false;
  std::lock_guard<std::mutex> lock(exchange_->mu);
  return !exchange_->gone && exchange_->phase == Phase::kStreaming;
}

void HttpStream::on_disconnect(std::function<void()> callback) {
  if (exchange_) exchange_->set_on_disconnect(std::move(callback));
}

HttpResponder::HttpResponder(std::shared_ptr<detail::HttpExchange> exchange)
    : exchange_(std::move(exchange)) {}

HttpResponder::~HttpResponder() {
  if (!exchange_) return;
  {
    std::lock_guard<std::mutex> lock(exchange_->mu);
    if (exchange_->gone || exchange_->phase != Phase::kAwaiting) return;
  }
  TESSERA_LOG_WARN("http: request dropped without a response; sending 500");
  respond_error(500, "the server dropped the request without a response");
}

bool HttpResponder::respond(int status, std::string content_type, std::string body,
                            HttpHeaders extra_headers) {
  TESSERA_CHECK(status >= 200 && status <= 599, "HTTP response status {} not in 200..599", status);
  if (!exchange_) return false;
  HttpExchange& ex = *exchange_;
  HeadSpec spec;
  spec.status = status;
  spec.content_type = content_type;
  spec.extra = &extra_headers;
  spec.close = !ex.keep_alive;
  spec.content_length = body.size();
  std::string bytes = response_head(spec);
  if (!ex.head_only) bytes += body;
  bool post = false;
  std::function<void()> old;
  {
    std::lock_guard<std::mutex> lock(ex.mu);
    if (ex.gone || ex.phase != Phase::kAwaiting) return false;
    ex.phase = Phase::kResponded;
    ex.close_connection = !ex.keep_alive;
    ex.pending += bytes;
    old = std::move(ex.on_disconnect);
    ex.on_disconnect = nullptr;
    post = ex.mark_queued();
  }
  if (post) ex.post();
  return true;
}

bool HttpResponder::respond_error(int status, std::string_view message, HttpHeaders extra_headers) {
  return respond(status, "application/json", http_error_body(status, message),
                 std::move(extra_headers));
}

std::shared_ptr<HttpStream> HttpResponder::start_stream(int status, std::string content_type,
                                                        HttpHeaders extra_headers) {
  TESSERA_CHECK(status >= 200 && status <= 599, "HTTP response status {} not in 200..599", status);
  if (!exchange_) return std::make_shared<HttpStream>(nullptr);
  HttpExchange& ex = *exchange_;
  // An HTTP/1.0 client cannot take chunks: its stream ends by closing the connection.
  bool close = !ex.keep_alive || !ex.chunked;
  HeadSpec spec;
  spec.status = status;
  spec.content_type = content_type;
  spec.extra = &extra_headers;
  spec.close = close;
  spec.chunked = ex.chunked && !ex.head_only;
  spec.no_cache = true;
  std::string head = response_head(spec);
  bool post = false;
  {
    std::lock_guard<std::mutex> lock(ex.mu);
    if (ex.phase != Phase::kAwaiting) return std::make_shared<HttpStream>(nullptr);
    if (ex.gone) return std::make_shared<HttpStream>(exchange_);  // closed: writes fail
    ex.phase = Phase::kStreaming;
    ex.close_connection = close;
    ex.pending += head;
    post = ex.mark_queued();
  }
  if (post) ex.post();
  return std::make_shared<HttpStream>(exchange_);
}

bool HttpResponder::client_connected() const {
  if (!exchange_) return false;
  std::lock_guard<std::mutex> lock(exchange_->mu);
  return !exchange_->gone && exchange_->unfinished();
}

void HttpResponder::on_disconnect(std::function<void()> callback) {
  if (exchange_) exchange_->set_on_disconnect(std::move(callback));
}

// ---------------------------------------------------------------------------------------------
// The event loop

class HttpServer::Impl {
 public:
  Impl(const HttpServerOptions& options, HttpHandler handler)
      : options_(options), handler_(std::move(handler)) {
    limits_.max_header_bytes = options.max_header_bytes;
    limits_.max_header_count = options.max_header_count;
    mailbox_ = std::make_shared<detail::LoopMailbox>();
    auto shortest = std::min({options.idle_timeout, options.request_timeout,
                              options.write_timeout, options.linger_timeout});
    tick_ = std::clamp(shortest / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(250));
  }
  ~Impl() {
    stop(std::chrono::milliseconds(0));
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
    if (reserve_fd_ >= 0) ::close(reserve_fd_);
  }

  Status open();
  Status start_thread();
  void stop(std::chrono::milliseconds flush);
  bool all_idle() const;  // no response in progress, nothing queued, no lingering close
  int port() const { return port_; }

 private:
  enum class ConnState { kReading, kBusy, kLinger };
  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    std::string remote;
    ConnState state = ConnState::kReading;
    bool closed = false;
    bool rejecting = false;  // over max_connections: answered 503, not counted as active
    uint32_t events = 0;     // current epoll interest
    std::string in;
    size_t scan_from = 0;
    std::optional<HttpRequestHead> head;  // parsed head whose body is still arriving
    bool sent_continue = false;
    std::string out;
    size_t out_off = 0;
    std::shared_ptr<HttpExchange> exchange;
    bool response_done = false;  // the current response has all its bytes in `out`
    bool close_after = false;    // close (linger) once `out` is sent
    // The client half-closed (EOF) with request bytes buffered: those requests are answered,
    // then the connection closes; nothing more is read.
    bool read_eof = false;
    uint64_t lingered_bytes = 0;
    Clock::time_point idle_since, request_start, last_write_progress, linger_deadline;
    bool out_pending() const { return out_off < out.size(); }
  };

  static constexpr uint64_t kListenId = 0;
  static constexpr uint64_t kWakeId = 1;
  static constexpr int kMaxRejecting = 256;
  static constexpr size_t kReadChunk = 64 * 1024;
  static constexpr uint64_t kMaxLingerBytes = 64ull << 20;

  void run();
  void accept_all();
  void on_event(Conn* c, uint32_t events);
  bool read_input(Conn* c, uint32_t events);
  size_t read_cap(const Conn* c) const;
  void advance(Conn* c);
  bool try_parse(Conn* c);
  void dispatch(Conn* c, HttpRequestHead head, std::string body);
  void service(Conn* c, const std::shared_ptr<HttpExchange>& ex);
  void process_mailbox();
  void send_error(Conn* c, int status, std::string_view message);
  void queue_output(Conn* c, std::string_view bytes);
  void flush(Conn* c);
  void start_linger(Conn* c);
  void update_interest(Conn* c);
  void check_timeouts();
  void close_conn(Conn* c);
  void close_all();
  Conn* find(uint64_t id) {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second.get();
  }

  const HttpServerOptions options_;
  HttpHandler handler_;
  HttpParseLimits limits_;
  std::chrono::milliseconds tick_{250};
  std::shared_ptr<detail::LoopMailbox> mailbox_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int reserve_fd_ = -1;  // released to shed connections when the process is out of fds
  int port_ = 0;
  std::thread thread_;
  std::mutex stop_mu_;
  std::atomic<bool> stop_requested_{false};
  std::chrono::milliseconds flush_{0};  // stop(): how long connections may finish (set before the flag)

  // Loop thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::vector<std::unique_ptr<Conn>> graveyard_;  // closed this iteration; freed at its end
  uint64_t next_id_ = 2;
  int active_ = 0;
  int rejecting_ = 0;
  Clock::time_point last_scan_;
};

Status HttpServer::Impl::open() {
  if (options_.max_connections <= 0 || options_.max_output_bytes == 0 ||
      options_.max_header_bytes == 0 || options_.idle_timeout.count() <= 0 ||
      options_.request_timeout.count() <= 0 || options_.write_timeout.count() <= 0 ||
      options_.linger_timeout.count() <= 0) {
    return Status::invalid_argument(
        "http: max_connections, max_output_bytes, max_header_bytes and the timeouts must be > 0");
  }
  if (options_.port < 0 || options_.port > 65535) {
    return Status::invalid_argument(fmt::format("http: port {} not in 0..65535", options_.port));
  }
  std::string where = fmt::format("{}:{}", options_.host, options_.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(options_.port);
  int gai = ::getaddrinfo(options_.host.empty() ? nullptr : options_.host.c_str(),
                          port_str.c_str(), &hints, &res);
  if (gai != 0) {
    return Status::invalid_argument(
        fmt::format("http: cannot resolve listen address {}: {}", where, gai_strerror(gai)));
  }
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                      ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::listen(fd, options_.listen_backlog) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
    break;
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) {
    return Status::io_error(fmt::format("http: cannot listen on {}: {}", where, last_error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return Status::io_error(fmt::format("http: getsockname on {}: {}", where, std::strerror(errno)));
  }
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  mailbox_->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || mailbox_->wake_fd < 0) {
    return Status::io_error(fmt::format("http: epoll/eventfd: {}", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
    return Status::io_error(fmt::format("http: epoll_ctl: {}", std::strerror(errno)));
  }
  ev.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, mailbox_->wake_fd, &ev) != 0) {
    return Status::io_error(fmt::format("http: epoll_ctl: {}", std::strerror(errno)));
  }
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  return Status::ok();
}

Status HttpServer::Impl::start_thread() {
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    return Status::resource_exhausted(fmt::format("http: cannot start the loop thread: {}", e.what()));
  }
  return Status::ok();
}

void HttpServer::Impl::stop(std::chrono::milliseconds flush) {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (!thread_.joinable()) return;
  TESSERA_CHECK(std::this_thread::get_id() != thread_.get_id(),
                "HttpServer::stop() called on the loop thread (from a handler or callback)");
  flush_ = flush;
  stop_requested_.store(true);
  mailbox_->wake();
  thread_.join();
}

void HttpServer::Impl::run() {
  constexpr int kMaxEvents = 256;
  epoll_event events[kMaxEvents];
  last_scan_ = Clock::now();
  std::optional<Clock::time_point> flush_until;  // stopping: the connections' last moment
  for (;;) {
    if (stop_requested_.load()) {
      if (!flush_until) {  // accept nothing more; let what is in progress finish
        flush_until = Clock::now() + flush_;
        if (listen_fd_ >= 0) {
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
          ::close(listen_fd_);
          listen_fd_ = -1;
        }
      }
      if (Clock::now() >= *flush_until || all_idle()) break;
    }
    int n = ::epoll_wait(epoll_fd_, events, kMaxEvents, static_cast<int>(tick_.count()));
    if (n < 0) {
      if (errno == EINTR) continue;
      TESSERA_LOG_ERROR("http: epoll_wait failed: {}; the server stops", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t id = events[i].data.u64;
      if (id == kListenId) {
        accept_all();
      } else if (id == kWakeId) {
        uint64_t value = 0;
        ssize_t r = ::read(mailbox_->wake_fd, &value, sizeof value);
        (void)r;
      } else if (Conn* c = find(id)) {
        on_event(c, events[i].events);
      }
    }
    process_mailbox();
    if (Clock::now() - last_scan_ >= tick_) check_timeouts();
    graveyard_.clear();
  }
  close_all();
}

bool HttpServer::Impl::all_idle() const {
  for (const auto& [id, c] : conns_)
    if (c->state != ConnState::kReading || c->out_pending()) return false;
  return true;
}

void HttpServer::Impl::accept_all() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && reserve_fd_ >= 0) {
        // Out of descriptors: free the reserve to accept and shed one pending connection, so
        // the level-triggered listen socket does not spin.
        ::close(reserve_fd_);
        int shed = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (shed >= 0) ::close(shed);
        reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        TESSERA_LOG_WARN("http: out of file descriptors; shed a connection");
        if (shed >= 0) continue;
      }
      return;
    }
    bool reject = active_ >= options_.max_connections;
    if (reject && rejecting_ >= kMaxRejecting) {
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto conn = std::make_unique<Conn>();
    Conn* c = conn.get();
    c->id = next_id_++;
    c->fd = fd;
    c->remote = format_address(ss);
    c->events = EPOLLIN | EPOLLRDHUP;
    c->idle_since = Clock::now();
    epoll_event ev{};
    ev.events = c->events;
    ev.data.u64 = c->id;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      TESSERA_LOG_WARN("http: epoll_ctl add: {}", std::strerror(errno));
      ::close(fd);
      continue;
    }
    conns_.emplace(c->id, std::move(conn));
    if (reject) {
      c->rejecting = true;
      ++rejecting_;
      send_error(c, 503, fmt::format("too many connections (limit {}); retry later",
                                     options_.max_connections));
      advance(c);
    } else {
      ++active_;
    }
  }
}

void HttpServer::Impl::on_event(Conn* c, uint32_t events) {
  if (events & EPOLLERR) {
    close_conn(c);
    return;
  }
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) {
    if (!read_input(c, events)) return;
  }
  if (events & EPOLLOUT) {
    flush(c);
    if (c->closed) return;
  }
  advance(c);
}

size_t HttpServer::Impl::read_cap(const Conn* c) const {
  // While a request is being answered, only a little pipelined input is buffered; reading
  // stops there (EPOLLRDHUP still reports a client that leaves).
  if (c->state == ConnState::kBusy) return options_.max_header_bytes;
  return options_.max_header_bytes + options_.max_body_bytes + kReadChunk;
}

bool HttpServer::Impl::read_input(Conn* c, uint32_t events) {
  if (c->read_eof && c->state != ConnState::kLinger) {  // nothing more can come; a hang-up: gone
    if (events & EPOLLHUP) {
      close_conn(c);
      return false;
    }
    return true;
  }
  char buf[kReadChunk];
  for (int i = 0; i < 16; ++i) {  // bounded per event so one client cannot starve the rest
    size_t want = sizeof buf;
    if (c->state != ConnState::kLinger) {
      size_t cap = read_cap(c);
      if (c->in.size() >= cap) {
        if (events & (EPOLLRDHUP | EPOLLHUP)) {
          close_conn(c);
          return false;
        }
        return true;
      }
      want = std::min(want, cap - c->in.size());
    }
    ssize_t n = ::recv(c->fd, buf, want, 0);
    if (n > 0) {
      if (c->state == ConnState::kLinger) {
        c->lingered_bytes += static_cast<uint64_t>(n);
        if (c->lingered_bytes > kMaxLingerBytes) {
          close_conn(c);
          return false;
        }
        continue;
      }
      if (c->state == ConnState::kReading && c->in.empty()) c->request_start = Clock::now();
      c->in.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    // An EOF while reading, with request bytes buffered: a half-close (shutdown(SHUT_WR) after
    // the request), so the buffered requests are still answered (a partial one closes the
    // connection in try_parse). An EOF while a request is served, or a reset: the client is gone.
    if (n == 0 && c->state == ConnState::kReading && !c->in.empty()) {
      c->read_eof = true;
      return true;
    }
    close_conn(c);
    return false;
  }
  return true;
}

void HttpServer::Impl::advance(Conn* c) {
  while (!c->closed) {
    if (c->state == ConnState::kBusy && c->response_done && !c->out_pending()) {
      if (c->exchange) {
        std::shared_ptr<HttpExchange> ex = std::move(c->exchange);
        ex->loop_unsent.store(0);
        ex->end();
      }
      c->response_done = false;
      if (c->close_after) {
        start_linger(c);
        break;
      }
      c->state = ConnState::kReading;
      c->idle_since = Clock::now();
      c->request_start = c->idle_since;
    }
    if (c->state == ConnState::kReading && !c->in.empty() && try_parse(c)) continue;
    break;
  }
  if (!c->closed) update_interest(c);
}

bool HttpServer::Impl::try_parse(Conn* c) {
  if (!c->head) {
    size_t end = find_head_end(c->in, c->scan_from);
    if (end == std::string::npos) {
      if (c->read_eof) {  // the rest of the head can never arrive
        close_conn(c);
        return false;
      }
      if (c->in.size() > options_.max_header_bytes) {
        send_error(c, 431, fmt::format("request head is over the limit of {} bytes",
                                       options_.max_header_bytes));
        return true;
      }
      c->scan_from = c->in.size();
      return false;
    }
    HttpRequestHead head;
    HttpParseError error;
    if (!parse_request_head(std::string_view(c->in).substr(0, end), limits_, &head, &error)) {
      send_error(c, error.status, error.message);
      return true;
    }
    if (head.content_length > options_.max_body_bytes) {
      send_error(c, 413, fmt::format("request body is {} bytes, over the limit of {} bytes",
                                     head.content_length, options_.max_body_bytes));
      return true;
    }
    c->head = std::move(head);
  }
  size_t need = c->head->head_bytes + c->head->content_length;
  if (c->in.size() < need && c->read_eof) {  // the rest of the body can never arrive
    close_conn(c);
    return false;
  }
  if (c->in.size() < need) {
    if (c->head->expect_continue && !c->sent_continue && c->head->request.version_minor == 1) {
      c->sent_continue = true;
      queue_output(c, "HTTP/1.1 100 Continue\r\n\r\n");
      flush(c);
    }
    return false;
  }
  HttpRequestHead head = std::move(*c->head);
  c->head.reset();
  std::string body = c->in.substr(head.head_bytes, head.content_length);
  c->in.erase(0, need);
  c->scan_from = 0;
  c->sent_continue = false;
  dispatch(c, std::move(head), std::move(body));
  return true;
}

void HttpServer::Impl::dispatch(Conn* c, HttpRequestHead head, std::string body) {
  auto ex = std::make_shared<HttpExchange>();
  ex->mailbox = mailbox_;
  ex->conn_id = c->id;
  ex->keep_alive = head.keep_alive;
  ex->head_only = head.request.method == "HEAD";
  ex->chunked = head.request.version_minor >= 1;
  ex->max_output_bytes = options_.max_output_bytes;
  c->exchange = ex;
  c->state = ConnState::kBusy;
  c->response_done = false;
  // After a half-close the last buffered request's response ends the connection.
  c->close_after = !head.keep_alive || (c->read_eof && c->in.empty());

  HttpRequest request = std::move(head.request);
  request.body = std::move(body);
  request.remote_address = c->remote;
  {
    auto responder = std::make_shared<HttpResponder>(ex);
    try {
      handler_(request, responder);
    } catch (const std::exception& e) {
      TESSERA_LOG_ERROR("http: handler for {} {} threw: {}", request.method, request.target,
                        e.what());
      responder->respond_error(500, "internal error while handling the request");
    } catch (...) {
      TESSERA_LOG_ERROR("http: handler for {} {} threw", request.method, request.target);
      responder->respond_error(500, "internal error while handling the request");
    }
  }  // a responder the handler neither answered nor kept sends 500 here
  if (!c->closed && c->exchange == ex) service(c, ex);
}

void HttpServer::Impl::service(Conn* c, const std::shared_ptr<HttpExchange>& ex) {
  std::string bytes;
  bool done = false, cut = false, overflow = false, close_connection = false;
  {
    std::lock_guard<std::mutex> lock(ex->mu);
    ex->queued = false;
    bytes.swap(ex->pending);
    done = ex->phase == Phase::kResponded || ex->phase == Phase::kStreamClosed;
    cut = ex->phase == Phase::kStreamCut;
    overflow = ex->overflow;
    close_connection = ex->close_connection;
  }
  if (overflow || cut) {
    if (overflow) {
      TESSERA_LOG_WARN("http: {}: client too slow (over {} bytes queued); dropping it", c->remote,
                       options_.max_output_bytes);
    }
    close_conn(c);
    return;
  }
  if (!bytes.empty()) queue_output(c, bytes);
  if (done) {
    c->response_done = true;
    c->close_after = c->close_after || close_connection;
  }
  flush(c);
}

void HttpServer::Impl::process_mailbox() {
  std::vector<std::shared_ptr<HttpExchange>> dirty;
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    dirty.swap(mailbox_->dirty);
  }
  for (const auto& ex : dirty) {
    Conn* c = find(ex->conn_id);
    // An exchange that is no longer its connection's current one has ended: nothing to do.
    if (c == nullptr || c->closed || c->exchange != ex) continue;
    service(c, ex);
    if (!c->closed) advance(c);
  }
}

void HttpServer::Impl::send_error(Conn* c, int status, std::string_view message) {
  TESSERA_LOG_DEBUG("http: {}: {} {}", c->remote, status, message);
  std::string body = http_error_body(status, message);
  HeadSpec spec;
  spec.status = status;
  spec.content_type = "application/json";
  spec.close = true;
  spec.content_length = body.size();
  HttpHeaders extra;
  if (status == 503) extra.emplace_back("Retry-After", "1");
  spec.extra = &extra;
  queue_output(c, response_head(spec) + body);
  c->in.clear();
  c->head.reset();
  c->state = ConnState::kBusy;
  c->response_done = true;
  c->close_after = true;
  flush(c);
}

void HttpServer::Impl::queue_output(Conn* c, std::string_view bytes) {
  if (!c->out_pending()) c->last_write_progress = Clock::now();
  c->out.append(bytes);
  if (c->exchange) c->exchange->loop_unsent.store(c->out.size() - c->out_off);
}

void HttpServer::Impl::flush(Conn* c) {
  while (c->out_pending()) {
    ssize_t n = ::send(c->fd, c->out.data() + c->out_off, c->out.size() - c->out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_off += static_cast<size_t>(n);
      c->last_write_progress = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_conn(c);  // EPIPE, ECONNRESET: the client is gone
    return;
  }
  if (!c->out_pending()) {
    c->out.clear();
    c->out_off = 0;
  } else if (c->out_off > (1u << 20)) {
    c->out.erase(0, c->out_off);
    c->out_off = 0;
  }
  if (c->exchange) c->exchange->loop_unsent.store(c->out.size() - c->out_off);
}

void HttpServer::Impl::start_linger(Conn* c) {
  // Half-close and drain what the client still sends, so that closing with unread input
  // does not reset the connection and destroy the response before the client reads it.
  ::shutdown(c->fd, SHUT_WR);
  c->state = ConnState::kLinger;
  c->in.clear();
  c->head.reset();
  c->linger_deadline = Clock::now() + options_.linger_timeout;
}

void HttpServer::Impl::update_interest(Conn* c) {
  // After a half-close nothing is read (EPOLLIN and EPOLLRDHUP would fire for ever); a hang-up
  // or error is reported regardless.
  uint32_t want = c->read_eof && c->state != ConnState::kLinger ? 0u : static_cast<uint32_t>(EPOLLRDHUP);
  if (c->state == ConnState::kLinger || (!c->read_eof && c->in.size() < read_cap(c))) want |= EPOLLIN;
  if (c->out_pending()) want |= EPOLLOUT;
  if (want == c->events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c->id;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c->fd, &ev) != 0) {
    TESSERA_LOG_WARN("http: epoll_ctl mod: {}", std::strerror(errno));
    close_conn(c);
    return;
  }
  c->events = want;
}

void HttpServer::Impl::check_timeouts() {
  Clock::time_point now = Clock::now();
  last_scan_ = now;
  std::vector<Conn*> timed_out_requests, to_close;
  for (auto& [id, conn] : conns_) {
    Conn* c = conn.get();
    switch (c->state) {
      case ConnState::kReading:
        if (c->in.empty() && !c->head) {
          if (now - c->idle_since > options_.idle_timeout) to_close.push_back(c);
        } else if (now - c->request_start > options_.request_timeout) {
          timed_out_requests.push_back(c);
        }
        break;
      case ConnState::kBusy:
        if (c->out_pending() && now - c->last_write_progress > options_.write_timeout) {
          to_close.push_back(c);
        }
        break;
      case ConnState::kLinger:
        if (now > c->linger_deadline) to_close.push_back(c);
        break;
    }
  }
  for (Conn* c : timed_out_requests) {
    send_error(c, 408, fmt::format("request not received within {} ms",
                                   options_.request_timeout.count()));
    advance(c);
  }
  for (Conn* c : to_close) close_conn(c);
}

void HttpServer::Impl::close_conn(Conn* c) {
  if (c->closed) return;
  c->closed = true;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  if (c->rejecting) {
    --rejecting_;
  } else {
    --active_;
  }
  std::shared_ptr<HttpExchange> ex = std::move(c->exchange);
  auto it = conns_.find(c->id);
  if (it != conns_.end()) {
    graveyard_.push_back(std::move(it->second));
    conns_.erase(it);
  }
  if (ex) ex->end();  // last: the callback may do anything but touch this loop
}

void HttpServer::Impl::close_all() {
  std::vector<std::shared_ptr<HttpExchange>> dirty;  // released after the lock
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    mailbox_->stopped = true;
    dirty.swap(mailbox_->dirty);
  }
  if (listen_fd_ >= 0) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
  std::vector<Conn*> all;
  all.reserve(conns_.size());
  for (auto& kv : conns_) all.push_back(kv.second.get());
  for (Conn* c : all) close_conn(c);
  graveyard_.clear();
}

// ---------------------------------------------------------------------------------------------

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options,
                                                      HttpHandler handler) {
  if (!handler) return Status::invalid_argument("http: no handler");
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  TESSERA_RETURN_IF_ERROR(impl->open());
  TESSERA_RETURN_IF_ERROR(impl->start_thread());
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port(); }

void HttpServer::stop(std::chrono::milliseconds flush) {
  if (impl_) impl_->stop(flush);
}

}  // namespace tessera
