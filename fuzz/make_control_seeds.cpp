// Writes the control codec fuzz target's seed corpus: one encoded message of each kind, with
// every field set, into the folder named (fuzz/make_seeds.py runs it on a scratch folder and packs
// that into fuzz/corpus/control_codec.tar.xz).
#include <cstdio>
#include <fstream>
#include <string>

#include "comm/control_codec.h"

using namespace tessera;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  auto write = [&](const std::string& name, const ControlMessage& m) {
    std::ofstream(dir + "/" + name, std::ios::binary) << encode_message(m);
  };
  ShardHello hello;
  hello.rank = 1;
  hello.world_size = 2;
  hello.tp_size = 2;
  hello.device = "cpu";
  hello.memory_available_bytes = 1ull << 33;
  hello.kv_bytes_per_token = 4096;
  hello.model_fingerprint = "llama:32:1:354";
  hello.hostname = "host-b";
  hello.pid = 4242;
  hello.weight_bytes = 123456;
  hello.max_step_tokens = 2048;
  hello.max_step_seqs = 64;
  hello.kv_dtype = KvDtype::kF16;
  hello.kv_window = 512;
  hello.kv_window_bytes_per_token = 1024;
  write("hello", hello);
  ConfigureMsg configure;
  configure.num_blocks = 1000;
  configure.block_size = 16;
  configure.kv_dtype = KvDtype::kF16;
  configure.num_window_blocks = 64;
  configure.draft_layers = 2;
  configure.draft_vocab = 8;
  configure.draft_ids = {3, 5, 7, 9, 11, 13, 17, 19};
  write("configure", configure);
  StepPlan plan;
  plan.step_id = 77;
  NewSequence ns;
  ns.seq_id = 5;
  ns.prompt_ids = {1, 400, 12, 9};
  ns.sampling.temperature = 0.7f;
  ns.sampling.top_k = 40;
  ns.sampling.top_p = 0.9f;
  ns.sampling.seed = 99;
  ns.sampling.has_seed = true;
  ns.sampling.n_logprobs = 2;
  ns.sampling.return_logprob = true;
  plan.new_sequences.push_back(ns);
  ScheduledSequence s;
  s.seq_id = 5;
  s.start_pos = 0;
  s.num_tokens = 4;
  s.sample = true;
  s.append_blocks = {0, 1};
  s.append_window_blocks = {2, -1};
  s.prompt_logprobs = true;
  s.banned_tokens = {2};
  ScheduledSequence spec = s;
  spec.seq_id = 6;
  spec.start_pos = 10;
  spec.num_tokens = 3;
  spec.draft_tokens = {8, 9};
  spec.reset_blocks = true;
  plan.scheduled = {s, spec};
  plan.finished = {1, 2};
  plan.block_copies = {{3, 4}};
  plan.window_block_copies = {{5, 6}};
  write("step_plan", plan);
  StepResult result;
  result.step_id = 77;
  result.rank = 0;
  result.tokens = {{5, 42, -0.5f, {{42, -0.5f}, {7, -1.25f}}}, {6, 9, -0.1f, {}}};
  result.prompt_logprobs = {{5, 1, 400, -3.0f, {{400, -3.0f}}}};
  result.compute_micros = 1500;
  result.comm_micros = 80;
  result.draft_micros = 20;
  write("step_result", result);
  StepResult failed;
  failed.step_id = 78;
  failed.error = "rank 1: out of memory";
  write("step_result_error", failed);
  write("heartbeat", Heartbeat{1, 77});
  write("shutdown", ShutdownMsg{"the server is shutting down"});
  write("abort", AbortMsg{{5, 6, 7}});
  write("refused", RefusedMsg{"model fingerprint differs"});
  write("step_masks", StepMasks{12, {{7, {0xffffffffu, 0x0000ff00u}}, {9, {}}}});
  std::printf("wrote the control message seeds to %s\n", dir.c_str());
  return 0;
}
