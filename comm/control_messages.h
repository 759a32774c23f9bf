// The control-plane messages (proto/tessera.capnp) as plain C++ values. Only
// comm/control_codec.cpp knows Cap'n Proto; everything else uses these structs.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/kv_config.h"
#include "common/sampling_params.h"

namespace tessera {

inline constexpr uint32_t kProtocolVersion = 1;  // fields added since (kvDtype) default to what older peers meant

struct ShardHello {
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t tp_size = 1;
  std::string device;
  uint64_t memory_available_bytes = 0;
  uint64_t kv_bytes_per_token = 0;
  std::string model_fingerprint;
  std::string hostname;
  int32_t pid = 0;
  uint64_t weight_bytes = 0;
  int64_t max_step_tokens = 0;  // a GPU shard's workspace limits (0: none, the CPU backend)
  int64_t max_step_seqs = 0;
  KvDtype kv_dtype = KvDtype::kF32;  // its KV cache's elements (kv_bytes_per_token is in them)
};

struct ConfigureMsg {
  int64_t num_blocks = 0;
  int32_t block_size = 16;
  KvDtype kv_dtype = KvDtype::kF32;  // the coordinator planned with it; the shard must store it
};

struct NewSequence {
  uint64_t seq_id = 0;
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
};

struct ScheduledSequence {
  uint64_t seq_id = 0;
  int64_t start_pos = 0;
  int32_t num_tokens = 0;
  bool sample = false;
  std::vector<int32_t> append_blocks;
  bool reset_blocks = false;
  bool prompt_logprobs = false;
  std::vector<int32_t> banned_tokens;  // given probability 0 when this step samples
};

struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

struct StepPlan {
  uint64_t step_id = 0;
  std::vector<NewSequence> new_sequences;
  std::vector<ScheduledSequence> scheduled;
  std::vector<uint64_t> finished;
  std::vector<BlockCopy> block_copies;
};

struct StepToken {
  uint64_t seq_id = 0;
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

struct PromptLogprob {
  uint64_t seq_id = 0;
  int64_t position = 0;
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

struct StepResult {
  uint64_t step_id = 0;
  int32_t rank = 0;
  std::vector<StepToken> tokens;
  std::string error;
  uint64_t compute_micros = 0;
  uint64_t comm_micros = 0;
  std::vector<PromptLogprob> prompt_logprobs;
};

struct Heartbeat {
  int32_t rank = -1;
  uint64_t last_step_id = 0;
};

struct ShutdownMsg {
  std::string reason;
};

struct AbortMsg {
  std::vector<uint64_t> seq_ids;
};

struct RefusedMsg {
  std::string reason;
};

using ControlMessage = std::variant<ShardHello, ConfigureMsg, StepPlan, StepResult, Heartbeat, ShutdownMsg,
                                    AbortMsg, RefusedMsg>;

}  // namespace tessera
