// The control-plane transport over ZeroMQ (the one file that uses the library; its exceptions
// become Status values here). The coordinator binds a ControlServer (ROUTER); each shard
// connects a ControlClient (DEALER) with identity "shard-<rank>". Every receive takes a
// timeout; sockets close with a finite linger.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "proto/control_messages.h"
#include "common/status.h"

namespace tessera {

struct ReceivedMessage {
  std::string peer;                 // sender identity (server side); empty on the client
  Result<ControlMessage> message;   // an error for a malformed or version-mismatched message
};

class ControlServer {
 public:
  ~ControlServer();
  // endpoint: "tcp://127.0.0.1:0" (port 0: an ephemeral port), "tcp://0.0.0.0:7000", "ipc:///tmp/x".
  static Result<std::unique_ptr<ControlServer>> bind(const std::string& endpoint);
  // The address peers connect to (ephemeral port resolved; 0.0.0.0 stays as bound).
  const std::string& endpoint() const { return endpoint_; }
  // Fails (kUnavailable) when the peer is not connected.
  Status send(const std::string& peer, const ControlMessage& message);
  Status send_bytes(const std::string& peer, const std::string& bytes);
  // nullopt on timeout.
  Result<std::optional<ReceivedMessage>> receive(std::chrono::milliseconds timeout);

 private:
  ControlServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
};

class ControlClient {
 public:
  ~ControlClient();
  static Result<std::unique_ptr<ControlClient>> connect(const std::string& endpoint, const std::string& identity);
  Status send(const ControlMessage& message);
  Status send_bytes(const std::string& bytes);
  Result<std::optional<ReceivedMessage>> receive(std::chrono::milliseconds timeout);

 private:
  ControlClient() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string shard_identity(int rank);

}  // namespace tessera
