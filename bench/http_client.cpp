#include "bench/http_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace tessera {
namespace {

using SteadyClock = std::chrono::steady_clock;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

int poll_timeout_ms(SteadyClock::time_point deadline, std::chrono::milliseconds cap) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left.count(), cap.count())));
}

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

HttpClient::HttpClient(HttpUrl url, HttpClientOptions options) : url_(std::move(url)), options_(options) {}

HttpClient::~HttpClient() { close(); }

void HttpClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  eof_ = false;
  buffer_.clear();
}

Status HttpClient::connect_socket(SteadyClock::time_point deadline) {
  close();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(url_.port);
  const int rc = ::getaddrinfo(url_.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) return Status::unavailable(fmt::format("{}:{}: {}", url_.host, url_.port, gai_strerror(rc)));
  const auto connect_deadline = std::min(deadline, SteadyClock::now() + options_.connect_timeout);
  std::string last_error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int polled = ::poll(&p, 1, poll_timeout_ms(connect_deadline, options_.connect_timeout));
      if (polled == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        r = err == 0 ? 0 : -1;
        errno = err;
      } else {
        r = -1;
        if (polled == 0) errno = ETIMEDOUT;
      }
    }
    if (r == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (fd_ < 0) return Status::unavailable(fmt::format("connect to {}:{}: {}", url_.host, url_.port, last_error));
  return Status::ok();
}

Status HttpClient::send_all(std::string_view data, SteadyClock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      const int r = ::poll(&p, 1, poll_timeout_ms(deadline, options_.read_timeout));
      if (r == 0) return Status::deadline_exceeded(fmt::format("{}:{}: send timed out", url_.host, url_.port));
      continue;
    }
    return Status::unavailable(fmt::format("{}:{}: send: {}", url_.host, url_.port, std::strerror(errno)));
  }
  return Status::ok();
}

Status HttpClient::fill(SteadyClock::time_point deadline) {
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      buffer_.append(buf, static_cast<size_t>(n));
      return Status::ok();
    }
    if (n == 0) {
      eof_ = true;
      return Status::unavailable(fmt::format("{}:{}: connection closed by the server", url_.host, url_.port));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return Status::unavailable(fmt::format("{}:{}: recv: {}", url_.host, url_.port, std::strerror(errno)));
    if (SteadyClock::now() >= deadline)
      return Status::deadline_exceeded(fmt::format("{}:{}: request deadline passed", url_.host, url_.port));
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, poll_timeout_ms(deadline, options_.read_timeout));
    if (r == 0) {
      if (SteadyClock::now() >= deadline)
        return Status::deadline_exceeded(fmt::format("{}:{}: request deadline passed", url_.host, url_.port));
      return Status::deadline_exceeded(
          fmt::format("{}:{}: no data for {} ms", url_.host, url_.port, options_.read_timeout.count()));
    }
  }
}

Result<HttpClientResponse> HttpClient::request(std::string_view method, std::string_view path, std::string_view body,
                                               SteadyClock::time_point deadline, const HttpBodyCallback& on_body) {
  std::string req = fmt::format("{} {}{} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: tessera-bench\r\nAccept: */*\r\n",
                                method, url_.path_prefix, path, url_.host, url_.port);
  if (!body.empty() || method != "GET") {
    req += fmt::format("Content-Type: application/json\r\nContent-Length: {}\r\n", body.size());
  }
  req += "\r\n";
  req += body;
  const bool head_request = method == "HEAD";
  for (int attempt = 0;; ++attempt) {
    const bool reused = fd_ >= 0;
    if (!reused) TESSERA_RETURN_IF_ERROR(connect_socket(deadline));
    bool nothing_received = false;
    auto r = exchange(req, head_request, deadline, on_body, &nothing_received);
    // A kept-alive connection may have been closed by the server just before we used it.
    if (!r.is_ok() && reused && nothing_received && attempt == 0) {
      close();
      continue;
    }
    if (!r.is_ok()) close();
    return r;
  }
}

Result<HttpClientResponse> HttpClient::get(std::string_view path, std::chrono::milliseconds timeout) {
  return request("GET", path, "", SteadyClock::now() + timeout);
}

Result<HttpClientResponse> HttpClient::exchange(std::string_view request_bytes, bool head_request,
                                                SteadyClock::time_point deadline, const HttpBodyCallback& on_body,
                                                bool* nothing_received) {
  *nothing_received = true;
  TESSERA_RETURN_IF_ERROR(send_all(request_bytes, deadline));
  HttpClientResponse resp;
  // Head. Interim 1xx responses are skipped.
  size_t head_end = std::string::npos;
  for (;;) {
    while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (buffer_.size() > 1 << 20) return Status::corrupt("response head over 1 MiB");
      TESSERA_RETURN_IF_ERROR(fill(deadline));
      *nothing_received = false;
    }
    *nothing_received = false;
    const std::string_view head(buffer_.data(), head_end);
    const size_t line_end = head.find("\r\n");
    const std::string_view status_line = head.substr(0, line_end);
    if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12)
      return Status::corrupt(fmt::format("bad status line '{}'", status_line));
    resp.status = std::atoi(std::string(status_line.substr(9, 3)).c_str());
    resp.headers.clear();
    size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
    while (pos < head.size()) {
      size_t e = head.find("\r\n", pos);
      if (e == std::string_view::npos) e = head.size();
      const std::string_view line = head.substr(pos, e - pos);
      const size_t colon = line.find(':');
      if (colon != std::string_view::npos)
        resp.headers.emplace_back(std::string(trim(line.substr(0, colon))), std::string(trim(line.substr(colon + 1))));
      pos = e + 2;
    }
    const bool http10 = status_line.rfind("HTTP/1.0", 0) == 0;
    buffer_.erase(0, head_end + 4);
    if (resp.status >= 100 && resp.status < 200) continue;
    // Framing.
    const std::string connection = resp.header("Connection");
    bool keep_alive = !http10 && !iequals(connection, "close");
    if (http10 && iequals(connection, "keep-alive")) keep_alive = true;
    const bool to_callback = on_body && resp.status >= 200 && resp.status < 300;
    bool stopped = false;
    auto deliver = [&](std::string_view piece) {
      if (piece.empty() || stopped) return;
      if (to_callback) {
        if (!on_body(piece)) stopped = true;
      } else {
        resp.body.append(piece);
      }
    };
    const bool no_body = head_request || resp.status == 204 || resp.status == 304;
    const std::string te = resp.header("Transfer-Encoding");
    const std::string cl = resp.header("Content-Length");
    if (no_body) {
      // nothing
    } else if (!te.empty() && te.find("chunked") != std::string::npos) {
      for (;;) {
        size_t le;
        while ((le = buffer_.find("\r\n")) == std::string::npos) TESSERA_RETURN_IF_ERROR(fill(deadline));
        const std::string size_text = buffer_.substr(0, std::min(le, buffer_.find(';')));
        char* end = nullptr;
        const unsigned long long size = std::strtoull(size_text.c_str(), &end, 16);
        if (size_text.empty() || (end && *end != '\0' && *end != ' ' && *end != '\t'))
          return Status::corrupt(fmt::format("bad chunk size '{}'", size_text));
        buffer_.erase(0, le + 2);
        if (size == 0) {
          // Trailer section up to an empty line.
          for (;;) {
            while ((le = buffer_.find("\r\n")) == std::string::npos) TESSERA_RETURN_IF_ERROR(fill(deadline));
            const bool empty = le == 0;
            buffer_.erase(0, le + 2);
            if (empty) break;
          }
          break;
        }
        size_t left = size;
        while (left > 0) {
          if (buffer_.empty()) TESSERA_RETURN_IF_ERROR(fill(deadline));
          const size_t take = std::min(left, buffer_.size());
          deliver(std::string_view(buffer_.data(), take));
          buffer_.erase(0, take);
          left -= take;
          if (stopped) break;
        }
        if (stopped) break;
        while (buffer_.size() < 2) TESSERA_RETURN_IF_ERROR(fill(deadline));
        if (buffer_.compare(0, 2, "\r\n") != 0) return Status::corrupt("chunk not followed by CRLF");
        buffer_.erase(0, 2);
      }
    } else if (!cl.empty()) {
      size_t left = std::strtoull(cl.c_str(), nullptr, 10);
      while (left > 0) {
        if (buffer_.empty()) TESSERA_RETURN_IF_ERROR(fill(deadline));
        const size_t take = std::min(left, buffer_.size());
        deliver(std::string_view(buffer_.data(), take));
        buffer_.erase(0, take);
        left -= take;
        if (stopped) break;
      }
    } else {
      // Body until the server closes the connection.
      keep_alive = false;
      for (;;) {
        deliver(buffer_);
        buffer_.clear();
        if (stopped) break;
        Status s = fill(deadline);
        if (!s.is_ok()) {
          if (eof_) break;
          return s;
        }
      }
    }
    if (stopped || !keep_alive) close();
    return resp;
  }
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
