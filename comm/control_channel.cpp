#include "comm/control_channel.h"

#include <zmq.hpp>

#include "comm/control_codec.h"

namespace tessera {
namespace {

constexpr int kLingerMs = 200;

Status zmq_status(const char* what, const zmq::error_t& e) {
  return Status::unavailable(std::string(what) + ": " + e.what());
}

// Polls one socket; returns the frames of one multipart message, or nothing on timeout.
Result<std::optional<std::vector<zmq::message_t>>> receive_frames(zmq::socket_t& socket,
                                                                  std::chrono::milliseconds timeout) {
  try {
    zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0};
    const int n = zmq::poll(&item, 1, timeout);
    if (n == 0 || !(item.revents & ZMQ_POLLIN)) return std::optional<std::vector<zmq::message_t>>();
    std::vector<zmq::message_t> frames;
    for (;;) {
      zmq::message_t frame;
      if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
      const bool more = frame.more();
      frames.push_back(std::move(frame));
      if (!more) break;
    }
    return std::optional<std::vector<zmq::message_t>>(std::move(frames));
  } catch (const zmq::error_t& e) {
    return zmq_status("zmq receive", e);
  }
}

}  // namespace

std::string shard_identity(int rank) { return "shard-" + std::to_string(rank); }

struct ControlServer::Impl {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::router};
};

ControlServer::~ControlServer() = default;

Result<std::unique_ptr<ControlServer>> ControlServer::bind(const std::string& endpoint) {
  std::unique_ptr<ControlServer> s(new ControlServer());
  s->impl_ = std::make_unique<Impl>();
  std::string address = endpoint;
  // "tcp://host:0" means an ephemeral port, which ZeroMQ spells "*".
  if (address.rfind("tcp://", 0) == 0 && address.size() > 2 && address.substr(address.size() - 2) == ":0")
    address = address.substr(0, address.size() - 1) + "*";
  try {
    s->impl_->socket.set(zmq::sockopt::linger, kLingerMs);
    s->impl_->socket.set(zmq::sockopt::router_mandatory, 1);
    s->impl_->socket.bind(address);
    s->endpoint_ = s->impl_->socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Status::unavailable("cannot bind control endpoint '" + endpoint + "': " + e.what());
  }
  return s;
}

Status ControlServer::send(const std::string& peer, const ControlMessage& message) {
  return send_bytes(peer, encode_message(message));
}

Status ControlServer::send_bytes(const std::string& peer, const std::string& bytes) {
  try {
    impl_->socket.send(zmq::buffer(peer), zmq::send_flags::sndmore);
    impl_->socket.send(zmq::buffer(bytes), zmq::send_flags::none);
    return Status::ok();
  } catch (const zmq::error_t& e) {
    return Status::unavailable("cannot send to " + peer + ": " + e.what());
  }
}

Result<std::optional<ReceivedMessage>> ControlServer::receive(std::chrono::milliseconds timeout) {
  TESSERA_ASSIGN_OR_RETURN(auto frames, receive_frames(impl_->socket, timeout));
  if (!frames) return std::optional<ReceivedMessage>();
  if (frames->size() != 2)
    return std::optional<ReceivedMessage>(ReceivedMessage{
        frames->empty() ? "" : frames->front().to_string(),
        Status::corrupt("expected 2 frames (identity, message), got " + std::to_string(frames->size()))});
  const zmq::message_t& body = (*frames)[1];
  return std::optional<ReceivedMessage>(
      ReceivedMessage{(*frames)[0].to_string(), decode_message(body.data(), body.size())});
}

struct ControlClient::Impl {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::dealer};
};

ControlClient::~ControlClient() = default;

Result<std::unique_ptr<ControlClient>> ControlClient::connect(const std::string& endpoint, const std::string& identity) {
  std::unique_ptr<ControlClient> c(new ControlClient());
  c->impl_ = std::make_unique<Impl>();
  try {
    c->impl_->socket.set(zmq::sockopt::linger, kLingerMs);
    c->impl_->socket.set(zmq::sockopt::routing_id, identity);
    c->impl_->socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return Status::unavailable("cannot connect to coordinator at '" + endpoint + "': " + e.what());
  }
  return c;
}

Status ControlClient::send(const ControlMessage& message) { return send_bytes(encode_message(message)); }

Status ControlClient::send_bytes(const std::string& bytes) {
  try {
    impl_->socket.send(zmq::buffer(bytes), zmq::send_flags::none);
    return Status::ok();
  } catch (const zmq::error_t& e) {
    return zmq_status("send to coordinator", e);
  }
}

Result<std::optional<ReceivedMessage>> ControlClient::receive(std::chrono::milliseconds timeout) {
  TESSERA_ASSIGN_OR_RETURN(auto frames, receive_frames(impl_->socket, timeout));
  if (!frames) return std::optional<ReceivedMessage>();
  if (frames->size() != 1)
    return std::optional<ReceivedMessage>(
        ReceivedMessage{"", Status::corrupt("expected 1 frame, got " + std::to_string(frames->size()))});
  const zmq::message_t& body = frames->front();
  return std::optional<ReceivedMessage>(ReceivedMessage{"", decode_message(body.data(), body.size())});
}

}  // namespace tessera
