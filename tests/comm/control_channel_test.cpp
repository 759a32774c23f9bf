#include "comm/control_channel.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "comm/control_codec.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;

void exchange(const std::string& bind_endpoint) {
  auto server = ControlServer::bind(bind_endpoint);
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  auto client = ControlClient::connect((*server)->endpoint(), shard_identity(3));
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->send(Heartbeat{3, 11}).is_ok());
  auto got = (*server)->receive(milliseconds(5000));
  ASSERT_TRUE(got.is_ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->peer, "shard-3");
  ASSERT_TRUE((*got)->message.is_ok());
  EXPECT_EQ(std::get<Heartbeat>(*(*got)->message).last_step_id, 11u);
  ASSERT_TRUE((*server)->send("shard-3", ConfigureMsg{64, 16}).is_ok());
  auto reply = (*client)->receive(milliseconds(5000));
  ASSERT_TRUE(reply.is_ok() && reply->has_value());
  EXPECT_EQ(std::get<ConfigureMsg>(*(*reply)->message).num_blocks, 64);
}

TEST(ControlChannelTest, TcpEphemeralPort) { exchange("tcp://127.0.0.1:0"); }

TEST(ControlChannelTest, Ipc) { exchange("ipc:///tmp/tessera-test-" + std::to_string(::getpid())); }

TEST(ControlChannelTest, ReceiveTimesOut) {
  auto server = ControlServer::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(server.is_ok());
  auto got = (*server)->receive(milliseconds(20));
  ASSERT_TRUE(got.is_ok());
  EXPECT_FALSE(got->has_value());
}

TEST(ControlChannelTest, SendToUnknownPeerFails) {
  auto server = ControlServer::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(server.is_ok());
  EXPECT_FALSE((*server)->send("shard-9", Heartbeat{}).is_ok());
}

TEST(ControlChannelTest, MalformedAndMismatchedMessagesAreReportedNotFatal) {
  auto server = ControlServer::bind("tcp://127.0.0.1:0");
  ASSERT_TRUE(server.is_ok());
  auto client = ControlClient::connect((*server)->endpoint(), "shard-0");
  ASSERT_TRUE(client.is_ok());
  ASSERT_TRUE((*client)->send_bytes("not a capnp message!").is_ok());
  ASSERT_TRUE((*client)->send_bytes(encode_message(Heartbeat{0, 0}, 99)).is_ok());
  ASSERT_TRUE((*client)->send(Heartbeat{0, 1}).is_ok());
  auto a = (*server)->receive(milliseconds(5000));
  ASSERT_TRUE(a.is_ok() && a->has_value());
  EXPECT_FALSE((*a)->message.is_ok());
  auto b = (*server)->receive(milliseconds(5000));
  ASSERT_TRUE(b.is_ok() && b->has_value());
  ASSERT_FALSE((*b)->message.is_ok());
  EXPECT_NE((*b)->message.status().message().find("protocol version 99"), std::string::npos);
  auto c = (*server)->receive(milliseconds(5000));
  ASSERT_TRUE(c.is_ok() && c->has_value());
  EXPECT_TRUE((*c)->message.is_ok());
}

}  // namespace
}  // namespace tessera
