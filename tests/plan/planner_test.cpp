// The planner's arithmetic against hand-computed bills: every expected value below is written
// out from the model's dimensions, not taken from the planner. Configs are written in the test
// (Llama-2-7B, Llama-3-8B, Llama-3-70B, Llama-2-70B), the cards are the datasheet presets.
#include "plan/planner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "tests/default_model_file.h"
#include "tests/testdata.h"

namespace tessera {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

ModelConfig config(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                   int64_t max_positions) {
  ModelConfig c;
  c.hidden = hidden;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.ffn = ffn;
  c.vocab = vocab;
  c.max_positions = max_positions;
  return c;
}

// Gemma-3-270M's shape: 15 of 18 layers local (every 6th global), window 512, context 32768.
ModelConfig gemma3_270m() {
  ModelConfig c = config(640, 18, 4, 1, 2048, 262144, 32768);
  c.arch = Architecture::kGemma3;
  c.head_dim = 256;
  c.qk_norm = true;
  c.tie_embeddings = true;
  c.sliding_window = 512;
  c.local_layers = gemma_local_layers(18, 6);
  return c;
}

ModelConfig llama2_7b() { return config(4096, 32, 32, 32, 11008, 32000, 4096); }
ModelConfig llama3_8b() { return config(4096, 32, 32, 8, 14336, 128256, 8192); }
ModelConfig llama3_70b() { return config(8192, 80, 64, 8, 28672, 128256, 8192); }
ModelConfig llama2_70b() { return config(8192, 80, 64, 8, 28672, 32000, 4096); }

PrecisionSpec precision(const char* name) {
  auto p = precision_preset(name);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return std::move(p).value();
}

CardSpec card(const char* name) {
  auto c = card_preset(name);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return std::move(c).value();
}

PlanInput input(const ModelConfig& c, const char* prec, const char* card_name, int tp = 1) {
  PlanInput in;
  in.model = c;
  in.model_name = "test";
  in.weights = precision(prec);
  in.embeddings = precision(prec);
  in.tp = tp;
  in.card = card(card_name);
  return in;
}

Plan plan_of(const PlanInput& in) {
  auto p = make_plan(in);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return std::move(p).value();
}

bool has_warning(const Plan& p, std::string_view needle, bool fatal) {
  for (const PlanWarning& w : p.warnings)
    if (w.fatal == fatal && w.message.find(needle) != std::string::npos) return true;
  return false;
}

// Warnings other than the notice that the runtime stores fp32 or fp16 KV.
std::vector<std::string> real_warnings(const Plan& p) {
  std::vector<std::string> out;
  for (const PlanWarning& w : p.warnings)
    if (w.message.find("today, so a run holds") == std::string::npos) out.push_back(w.message);
  return out;
}

TEST(PlannerTest, KvDtypeOtherThanTheRuntimesIsFlagged) {
  // The CUDA backend stores fp32 or fp16; fp8 would hold twice the tokens fp16 does.
  PlanInput in = input(llama2_7b(), "F16", "A100-80GB");
  in.kv_dtype = KvDtype::kF16;
  EXPECT_FALSE(has_warning(plan_of(in), "today, so a run holds", false));
  in.kv_dtype = KvDtype::kFp8;
  EXPECT_TRUE(has_warning(
      plan_of(in), "KV dtype fp8: Tessera's CUDA KV cache stores fp32 or fp16 today, so a run holds 2x fewer tokens",
      false));
  in.kv_dtype = KvDtype::kBF16;
  EXPECT_TRUE(has_warning(plan_of(in), "holds its tokens in fp16, not", false));
  in.kv_dtype = KvDtype::kF32;
  EXPECT_TRUE(plan_of(in).warnings.empty());
  // The CPU backend likewise.
  PlanInput cpu = input(llama2_7b(), "F16", "A100-80GB");
  cpu.card.is_cpu = true;  // as cpu_card() makes it from the probe
  cpu.kv_dtype = KvDtype::kF16;
  EXPECT_FALSE(has_warning(plan_of(cpu), "today, so a run holds", false));
  cpu.kv_dtype = KvDtype::kFp8;
  EXPECT_TRUE(
      has_warning(plan_of(cpu), "CPU KV cache stores fp32, fp16 or int8 today, so a run holds 2x fewer", false));
  // int8 runs on the CPU, not yet on CUDA.
  cpu.kv_dtype = KvDtype::kInt8;
  EXPECT_FALSE(has_warning(plan_of(cpu), "today, so a run holds", false));
  in.kv_dtype = KvDtype::kInt8;
  EXPECT_TRUE(has_warning(plan_of(in), "KV dtype int8: Tessera's CUDA KV cache stores fp32 or fp16 today", false));
}

TEST(PlannerTest, PrecisionBitsIncludeScales) {
  struct Case {
    const char* name;
    double bits;
  };
  const Case cases[] = {{"F16", 16},   {"bf16", 16},    {"INT8", 8},        {"int4", 4.25},      {"Q4_K", 4.5},
                        {"Q8_0", 8.5}, {"Q4_0", 4.5},   {"Q6_K", 6.5625},   {"2-bit", 2.5},      {"ternary", 2.0},
                        {"TERNARY-B5", 1.6}, {"F32", 32},   {"Q2_K", 2.625},    {"q3_k", 3.4375},    {"TQ1_0", 1.6875},
                        {"TQ2_0", 2.0625}};
  for (const Case& c : cases) EXPECT_DOUBLE_EQ(precision(c.name).bits_per_weight(), c.bits) << c.name;
  // INT4 group 128: 64 B nibbles + 2 B scale + 1 B zero + 1 B pad per group; INT8 adds the fp32
  // scale per row that I8_CH stores (common/dtype.h).
  EXPECT_EQ(precision("INT4").matrix_bytes(4096, 4096), 4096ull * (4096 / 128) * 68);
  EXPECT_EQ(precision("INT8").matrix_bytes(10, 4096), 10ull * (4096 + 4));
  EXPECT_EQ(precision("Q4_K").row_bytes(300), 2ull * 144);  // a partial super-block is stored whole
  EXPECT_FALSE(precision_preset("int3").is_ok());
  EXPECT_NE(precision_preset("int3").status().message().find("Q4_K"), std::string::npos);
}

TEST(PlannerTest, Llama2_7bF16WeightsAndKv) {
  const Plan p = plan_of(input(llama2_7b(), "F16", "A100-80GB"));
  const uint64_t per_layer = (4096ull * 4096 * 4 + 3ull * 4096 * 11008) * 2;  // q,k,v,o + gate,up,down
  EXPECT_EQ(p.memory.layer_weight_bytes, 32 * per_layer);
  EXPECT_EQ(p.memory.embedding_bytes, 32000ull * 4096 * 2);
  EXPECT_EQ(p.memory.lm_head_bytes, 32000ull * 4096 * 2);
  EXPECT_EQ(p.memory.vector_bytes, (2ull * 4096 * 32 + 4096) * 2);
  EXPECT_EQ(p.memory.weight_bytes, 13'476'831'232ull);
  EXPECT_EQ(p.memory.model_weight_bytes, p.memory.weight_bytes);
  // 2 (K, V) x 32 layers x 32 KV heads x 128 x 2 B = 512 KiB.
  EXPECT_EQ(p.memory.kv_bytes_per_token, 2ull * 32 * 32 * 128 * 2);
  EXPECT_EQ(p.memory.kv_bytes_per_token, 512 * 1024ull);
}

TEST(PlannerTest, Llama2_7bTpSplitsEverythingButTheEmbedding) {
  const Plan p = plan_of(input(llama2_7b(), "F16", "A100-80GB", 2));
  // q,k,v: 2048 rows each; o: 2048 columns; gate,up: 5504 rows; down: 5504 columns.
  const uint64_t per_layer = (3ull * 2048 * 4096 + 4096ull * 2048 + 3ull * 5504 * 4096) * 2;
  EXPECT_EQ(p.memory.layer_weight_bytes, 32 * per_layer);
  EXPECT_EQ(p.memory.embedding_bytes, 32000ull * 4096 * 2);  // replicated
  EXPECT_EQ(p.memory.lm_head_bytes, 16000ull * 4096 * 2);    // vocabulary split
  EXPECT_EQ(p.memory.kv_heads_per_rank, 16);
  EXPECT_EQ(p.memory.kv_bytes_per_token, 2ull * 32 * 16 * 128 * 2);
  EXPECT_FALSE(p.memory.kv_heads_replicated);
}

TEST(PlannerTest, Llama2_7bInt4ByTp) {
  const PrecisionSpec int4 = precision("INT4");
  for (int tp : {1, 2}) {
    const Plan p = plan_of(input(llama2_7b(), "INT4", "A100-80GB", tp));
    const uint64_t rows_4096 = 4096 / 128 * 68, rows_ffn = 11008ull / tp / 128 * 68;
    const uint64_t heads = 4096ull / tp;
    const uint64_t per_layer = 3 * heads * rows_4096 + 4096 * (heads / 128 * 68) + 2 * (11008ull / tp) * rows_4096 +
                               4096 * rows_ffn;
    EXPECT_EQ(p.memory.layer_weight_bytes, 32 * per_layer) << "tp " << tp;
    EXPECT_EQ(p.memory.embedding_bytes, int4.matrix_bytes(32000, 4096));
    EXPECT_FALSE(has_warning(p, "straddle", false)) << "tp " << tp;
  }
  // 11008 / 4 = 2752 columns of down per rank: not a multiple of the 128-element group.
  const Plan p4 = plan_of(input(llama2_7b(), "INT4", "A100-80GB", 4));
  EXPECT_TRUE(has_warning(p4, "straddle", false));
}

TEST(PlannerTest, Llama3_8bBf16AndGqaReplication) {
  const Plan p = plan_of(input(llama3_8b(), "BF16", "H100-80GB"));
  const uint64_t per_layer = (4096ull * 4096 * 2 + 2ull * 1024 * 4096 + 3ull * 4096 * 14336) * 2;
  EXPECT_EQ(p.memory.layer_weight_bytes, 32 * per_layer);
  EXPECT_EQ(p.memory.weight_bytes, 32 * per_layer + 2 * 128256ull * 4096 * 2 + (2ull * 4096 * 32 + 4096) * 2);
  EXPECT_EQ(p.memory.weight_bytes, 16'060'522'496ull);
  EXPECT_EQ(p.memory.kv_bytes_per_token, 2ull * 32 * 8 * 128 * 2);  // 128 KiB

  // TP 8: one KV head per rank; TP 16: 8 KV heads cannot split 16 ways, each is held by 2 ranks.
  const Plan p8 = plan_of(input(llama3_8b(), "BF16", "H100-80GB", 8));
  EXPECT_EQ(p8.memory.kv_heads_per_rank, 1);
  EXPECT_FALSE(p8.memory.kv_heads_replicated);
  const Plan p16 = plan_of(input(llama3_8b(), "BF16", "H100-80GB", 16));
  EXPECT_EQ(p16.memory.kv_heads_per_rank, 1);
  EXPECT_TRUE(p16.memory.kv_heads_replicated);
  EXPECT_EQ(p16.memory.kv_bytes_per_token, 2ull * 32 * 1 * 128 * 2);
  // k and v keep one head (128 rows) per rank although 8 / 16 would be half a head.
  const uint64_t per_layer16 = (2ull * 4096 * 256 + 2ull * 128 * 4096 + 3ull * 4096 * 896) * 2;
  EXPECT_EQ(p16.memory.layer_weight_bytes, 32 * per_layer16);

  PlanInput bad = input(llama3_8b(), "BF16", "H100-80GB", 3);
  auto r = make_plan(bad);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("32 query heads cannot be split over TP 3"), std::string::npos);
}

TEST(PlannerTest, Llama3_70bKvAndQ4kWeights) {
  const Plan p = plan_of(input(llama3_70b(), "Q4_K", "H200-141GB"));
  // 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 327,680 B = 320 KiB.
  EXPECT_EQ(p.memory.kv_bytes_per_token, 327'680ull);
  EXPECT_EQ(p.memory.kv_bytes_per_token_model, 327'680ull);
  const uint64_t r8192 = 8192 / 256 * 144, r28672 = 28672 / 256 * 144;
  const uint64_t per_layer = (8192ull + 2 * 1024 + 8192 + 2 * 28672) * r8192 + 8192ull * r28672;
  EXPECT_EQ(p.memory.layer_weight_bytes, 80 * per_layer);
  EXPECT_EQ(p.memory.embedding_bytes, 128256ull * r8192);

  PlanInput fp8 = input(llama3_70b(), "Q4_K", "H200-141GB", 4);
  fp8.kv_dtype = KvDtype::kFp8;
  EXPECT_EQ(plan_of(fp8).memory.kv_bytes_per_token, 2ull * 80 * 2 * 128 * 1);
  // int8: 128 values and a 4-byte scale per token and KV head.
  fp8.kv_dtype = KvDtype::kInt8;
  EXPECT_EQ(plan_of(fp8).memory.kv_bytes_per_token, 2ull * 80 * 2 * (128 + 4));
  EXPECT_EQ(plan_of(fp8).memory.kv_bytes_per_token_model, 2ull * 80 * 8 * (128 + 4));
}

TEST(PlannerTest, KvBlocksWithHeadroom) {
  PlanInput in = input(llama2_7b(), "F16", "A100-40GB");
  in.block_size = 16;
  in.max_step_tokens = 2048;
  in.max_batch = 32;
  const Plan p = plan_of(in);
  const uint64_t memory = 40960 * kMiB;
  const uint64_t headroom = memory / 10;  // 4 GiB exactly
  const uint64_t workspace = 2048ull * (3 * 4096 + 2 * 4096 + 2 * 4096 + 2 * 11008) * 2 + 32ull * 32000 * 4;
  EXPECT_EQ(p.memory.workspace_bytes, workspace);
  EXPECT_EQ(p.memory.headroom_bytes, headroom);
  const uint64_t room = memory - headroom - kGiB - 13'476'831'232ull - workspace;
  EXPECT_EQ(static_cast<uint64_t>(p.memory.kv_room_bytes), room);
  EXPECT_EQ(p.memory.kv_blocks, static_cast<int64_t>(room / (16 * 524'288ull)));
  EXPECT_EQ(p.memory.kv_blocks, 2848);
  EXPECT_EQ(p.memory.kv_tokens, 2848 * 16);
  EXPECT_EQ(p.memory.blocks_per_sequence, 256);  // context 4096
  EXPECT_EQ(p.memory.sequences_at_context, 2848 / 256);
  EXPECT_TRUE(real_warnings(p).empty()) << real_warnings(p).front();

  // Without headroom the same card holds more blocks.
  in.headroom = 0;
  EXPECT_EQ(plan_of(in).memory.kv_blocks, static_cast<int64_t>((room + headroom) / (16 * 524'288ull)));
}

TEST(PlannerTest, FragmentationForFixedAndUniformLengths) {
  // Fixed 1000 tokens in blocks of 16: 63 blocks, the last holds 8 tokens and 8 empty slots.
  Fragmentation f = expected_fragmentation(SequenceLengths::fixed(1000), 16);
  EXPECT_DOUBLE_EQ(f.unused_slots, 8);
  EXPECT_DOUBLE_EQ(f.blocks, 63);
  EXPECT_DOUBLE_EQ(f.fraction, 8.0 / 1008);
  EXPECT_DOUBLE_EQ(expected_fragmentation(SequenceLengths::fixed(4096), 16).fraction, 0);

  // Uniform over 1..16 with blocks of 16: 15 + 14 + ... + 1 + 0 empty slots over 16 lengths.
  auto u16 = SequenceLengths::uniform(1, 16);
  ASSERT_TRUE(u16.is_ok());
  f = expected_fragmentation(*u16, 16);
  EXPECT_NEAR(f.unused_slots, 120.0 / 16, 1e-12);
  EXPECT_NEAR(f.fraction, 7.5 / 16, 1e-12);

  // Uniform over 1..4096: every residue equally likely -> 7.5 empty slots; E[blocks] = 128.5.
  auto u = SequenceLengths::uniform(1, 4096);
  ASSERT_TRUE(u.is_ok());
  f = expected_fragmentation(*u, 16);
  EXPECT_NEAR(f.unused_slots, 7.5, 1e-9);
  EXPECT_NEAR(f.blocks, 128.5, 1e-9);
  EXPECT_NEAR(f.fraction, 7.5 / (128.5 * 16), 1e-12);

  auto parsed = parse_length_distribution("uniform:1:16", 4096);
  ASSERT_TRUE(parsed.is_ok());
  EXPECT_EQ(parsed->points.size(), 16u);
  EXPECT_DOUBLE_EQ(parsed->mean(), 8.5);
  auto geo = parse_length_distribution("geometric:500", 100000);
  ASSERT_TRUE(geo.is_ok());
  EXPECT_NEAR(geo->mean(), 500, 1.0);
  EXPECT_EQ(parse_length_distribution("fixed:9000", 4096)->max(), 4096);  // cut at the context
  EXPECT_FALSE(parse_length_distribution("normal:3", 4096).is_ok());
  EXPECT_FALSE(parse_length_distribution("uniform:9:3", 4096).is_ok());
  EXPECT_FALSE(parse_length_distribution("fixed:abc", 4096).is_ok());
}

TEST(PlannerTest, FragmentationWarning) {
  PlanInput in = input(llama2_7b(), "F16", "A100-80GB");
  in.block_size = 1024;
  in.lengths = SequenceLengths::fixed(1100);  // 2 blocks, 948 of 2048 slots empty
  Plan p = plan_of(in);
  EXPECT_NEAR(p.memory.fragmentation.fraction, 948.0 / 2048, 1e-12);
  EXPECT_TRUE(has_warning(p, "fragmentation", false));
  in.block_size = 16;  // 1100 = 68 x 16 + 12: 4 empty slots of 1104
  p = plan_of(in);
  EXPECT_NEAR(p.memory.fragmentation.fraction, 4.0 / 1104, 1e-12);
  EXPECT_FALSE(has_warning(p, "fragmentation", false));
}

TEST(PlannerTest, DecodeFloorAndCrossover) {
  PlanInput in = input(llama2_7b(), "F16", "A100-80GB");
  in.decode_context = 0;
  Plan p = plan_of(in);
  // Layers + LM head + one embedding row + norms, read once per step.
  const uint64_t read = 32 * (4096ull * 4096 * 4 + 3ull * 4096 * 11008) * 2 + 32000ull * 4096 * 2 + 4096 * 2 +
                        (2ull * 4096 * 32 + 4096) * 2;
  EXPECT_EQ(p.time.weight_bytes_read, read);
  EXPECT_DOUBLE_EQ(p.time.weight_read_s, static_cast<double>(read) / 2039e9);
  EXPECT_DOUBLE_EQ(p.time.floor_s, p.time.weight_read_s);
  EXPECT_FALSE(p.time.compute_bound);
  // F16 reads 2 B per multiply-add (2 FLOP): compute catches up at about peak / bandwidth = 153.
  EXPECT_GT(p.time.crossover_batch, 150);
  EXPECT_LT(p.time.crossover_batch, 156);
  in.batch = 256;
  p = plan_of(in);
  EXPECT_TRUE(p.time.compute_bound);
  EXPECT_DOUBLE_EQ(p.time.floor_s, p.time.compute_s);

  // KV read at batch 8, context 1000: 8 x 1000 x 512 KiB.
  in.batch = 8;
  in.decode_context = 1000;
  p = plan_of(in);
  EXPECT_EQ(p.time.kv_bytes_read, 8ull * 1000 * 524'288);
  EXPECT_DOUBLE_EQ(p.time.memory_s, p.time.weight_read_s + static_cast<double>(8ull * 1000 * 524'288) / 2039e9);

  // Launches: the CUDA forward pass's 16 per layer + 8 per step.
  EXPECT_EQ(p.time.launches_per_step, 16 * 32 + 8);
  EXPECT_DOUBLE_EQ(p.time.launch_s, (16 * 32 + 8) * 5e-6);
  EXPECT_DOUBLE_EQ(p.time.launch_graph_s, 10e-6 + (16 * 32 + 8) * 1e-6);
  EXPECT_EQ(p.time.all_reduce_s, 0);
}

TEST(PlannerTest, AllReduceTime) {
  LinkSpec link{"test", 100e9, 0};
  EXPECT_DOUBLE_EQ(ring_all_reduce_s(1'000'000'000, 4, link), 2.0 * 3 / 4 * 1e9 / 100e9);
  EXPECT_DOUBLE_EQ(ring_all_reduce_s(1'000'000'000, 1, link), 0);
  link.hop_latency_s = 2e-6;
  EXPECT_DOUBLE_EQ(ring_all_reduce_s(0, 8, link), 14 * 2e-6);

  // Llama-2-70B at TP 8 on A100 NVLink: 2 all-reduces per layer of batch x 8192 x 2 B.
  PlanInput in = input(llama2_70b(), "INT4", "A100-80GB", 8);
  in.batch = 4;
  const Plan p = plan_of(in);
  const double one = 2.0 * 7 / 8 * (4.0 * 8192 * 2) / 300e9 + 14 * 2e-6;
  EXPECT_EQ(p.time.all_reduces_per_step, 160);
  EXPECT_EQ(p.time.all_reduce_bytes, 4ull * 8192 * 2);
  EXPECT_NEAR(p.time.all_reduce_s, 160 * one, 1e-12);
  EXPECT_EQ(p.time.launches_per_step, 18 * 80 + 9);
  // The PCIe link is slower.
  in.use_slow_link = true;
  EXPECT_GT(plan_of(in).time.all_reduce_s, p.time.all_reduce_s);
}

TEST(PlannerTest, WarningsWhenItDoesNotFit) {
  // 70B in F16 (138 GB) on one 80 GB card.
  const Plan f16 = plan_of(input(llama2_70b(), "F16", "A100-80GB"));
  EXPECT_TRUE(has_warning(f16, "exceed", true));
  EXPECT_EQ(f16.memory.kv_blocks, 0);
  EXPECT_LT(f16.memory.kv_room_bytes, 0);

  // Weights that fit in memory but not under the headroom: Llama-2-7B F16 (13.5 GB) on a
  // 14.5 GiB card leaves less than 10% free.
  PlanInput tight = input(llama2_7b(), "F16", "A100-40GB");
  tight.card.memory_bytes = 14'800'000'000ull;
  const Plan t = plan_of(tight);
  EXPECT_TRUE(has_warning(t, "no room for KV", true));
  EXPECT_FALSE(has_warning(t, "exceed", true));

  // Room for KV, but less than one sequence of 131072 tokens at fp32 KV (256 KiB per token).
  PlanInput longctx = input(llama3_8b(), "BF16", "A100-40GB");
  longctx.context_length = 131072;
  longctx.kv_dtype = KvDtype::kF32;
  const Plan l = plan_of(longctx);
  EXPECT_GT(l.memory.kv_blocks, 0);
  EXPECT_TRUE(has_warning(l, "less than one sequence", false));
  longctx.kv_dtype = KvDtype::kF16;
  EXPECT_FALSE(has_warning(plan_of(longctx), "less than one sequence", false));

  // A batch the KV room cannot hold.
  PlanInput batch = input(llama2_7b(), "F16", "A100-40GB");
  batch.batch = 64;
  batch.max_batch = 64;
  EXPECT_TRUE(has_warning(plan_of(batch), "needs", false));
  batch.batch = 8;
  EXPECT_FALSE(has_warning(plan_of(batch), "needs", false));
}

// The source article's case: a 70B model in 4-bit on one A100 80 GB.
TEST(PlannerTest, Article70bInt4OnA100_80) {
  PlanInput in = input(llama2_70b(), "INT4", "A100-80GB");
  const Plan p = plan_of(in);
  const uint64_t r8192 = 8192 / 128 * 68, r28672 = 28672 / 128 * 68;
  const uint64_t per_layer = (8192ull + 2 * 1024 + 8192 + 2 * 28672) * r8192 + 8192ull * r28672;
  const uint64_t weights = 80 * per_layer + 2 * 32000ull * r8192 + (2ull * 8192 * 80 + 8192) * 2;
  EXPECT_EQ(p.memory.weight_bytes, weights);
  // "About 35 GB": 36.6 GB = 34.1 GiB.
  EXPECT_GT(p.memory.weight_bytes, 34 * kGiB);
  EXPECT_LT(p.memory.weight_bytes, 35 * kGiB);
  // ~320 KiB of fp16 KV per token.
  EXPECT_EQ(p.memory.kv_bytes_per_token, 327'680ull);
  // The real room for KV: 80 GiB - 10% - 1 GiB reserve - weights - workspace.
  const uint64_t memory = 81920 * kMiB;
  const uint64_t workspace = 2048ull * (3 * 8192 + 2 * 8192 + 2 * 1024 + 2 * 28672) * 2 + 32ull * 32000 * 4;
  const uint64_t room = memory - memory / 10 - kGiB - weights - workspace;
  EXPECT_EQ(static_cast<uint64_t>(p.memory.kv_room_bytes), room);
  EXPECT_EQ(p.memory.kv_tokens, static_cast<int64_t>(room / (16 * 327'680ull) * 16));
  EXPECT_GT(p.memory.kv_tokens, 100'000);  // ~117k tokens, 29 sequences of 4096
  EXPECT_EQ(p.memory.sequences_at_context, static_cast<int64_t>(room / (16 * 327'680ull) / 256));
  // The batch-1 floor: ~36.5 GB of weights read at 2039 GB/s = 17.9 ms per token.
  EXPECT_GT(p.time.weight_read_s, 17e-3);
  EXPECT_LT(p.time.weight_read_s, 18e-3);
  in.decode_context = 0;
  EXPECT_NEAR(plan_of(in).time.floor_s, p.time.weight_read_s, 1e-12);
  EXPECT_TRUE(real_warnings(p).empty());

  // Llama-3-70B (vocab 128256): larger embedding and LM head, the same KV per token.
  const Plan p3 = plan_of(input(llama3_70b(), "INT4", "A100-80GB"));
  EXPECT_EQ(p3.memory.kv_bytes_per_token, 327'680ull);
  EXPECT_GT(p3.time.weight_read_s, 17e-3);
  EXPECT_LT(p3.time.weight_read_s, 18.5e-3);

  const std::string text = format_plan(p);
  EXPECT_NE(text.find("327680 B (320.0 KiB)"), std::string::npos) << text;
  const auto j = nlohmann::json::parse(plan_to_json(p));
  EXPECT_EQ(j["memory"]["kv_bytes_per_token"].get<uint64_t>(), 327'680ull);
  EXPECT_EQ(j["memory"]["weight_bytes"].get<uint64_t>(), weights);
  EXPECT_EQ(j["warnings"].size(), p.warnings.size());
  EXPECT_EQ(real_warnings(p).size(), 0u);
}

// The window pool (common/kv_config.h): the windowed layers' KV in max_batch sequences' worth of
// window blocks, the rest of the room in blocks of the 3 global layers.
TEST(PlannerTest, Gemma3WindowPool) {
  PlanInput in = input(gemma3_270m(), "Q8_0", "A100-80GB");
  in.kv_dtype = KvDtype::kF32;
  in.context_length = 32768;
  in.max_batch = 32;
  in.max_step_tokens = 2048;
  const Plan p = plan_of(in);
  const MemoryBill& m = p.memory;
  // 2 (K, V) x 1 KV head x 256 x 4 B per layer: 3 global, 15 windowed.
  EXPECT_EQ(m.windowed_layers, 15);
  EXPECT_EQ(m.window, 512);
  EXPECT_EQ(m.kv_bytes_per_token, 2ull * 18 * 256 * 4);
  EXPECT_EQ(m.kv_bytes_per_token_global, 2ull * 3 * 256 * 4);
  EXPECT_EQ(m.kv_bytes_per_token_windowed, 2ull * 15 * 256 * 4);
  // ceil((512 - 1) / 16) + 1 = 33 blocks a sequence between steps, + 2 for its piece, 32
  // sequences, + a step of 2048 tokens.
  EXPECT_EQ(m.window_blocks_per_sequence, 33);
  EXPECT_EQ(m.window_pool_blocks, window_pool_blocks(512, 2048, 16, 32));
  EXPECT_EQ(m.window_pool_blocks, 35 * 32 + 128);
  ASSERT_TRUE(m.window_pool);
  EXPECT_EQ(m.window_block_bytes, 16ull * 30720);
  EXPECT_EQ(m.window_pool_bytes, 1248ull * 16 * 30720);
  ASSERT_GT(m.kv_room_bytes, 0);
  const auto room = static_cast<uint64_t>(m.kv_room_bytes);
  EXPECT_EQ(m.kv_block_bytes, 16ull * 6144);
  EXPECT_EQ(m.kv_blocks, static_cast<int64_t>((room - 1248ull * 16 * 30720) / (16 * 6144)));
  EXPECT_EQ(m.kv_tokens, m.kv_blocks * 16);
  // A 32k sequence needs 2048 blocks of the global layers; the windowed layers' share is in the
  // window pool, so about 6x the sequences of one pool fit.
  EXPECT_EQ(m.blocks_per_sequence, 2048);
  EXPECT_EQ(m.sequences_at_context, m.kv_blocks / 2048);
  const int64_t one_pool = static_cast<int64_t>(room / (16 * 36864)) / 2048;
  EXPECT_GT(m.sequences_at_context, 5 * one_pool);
  EXPECT_LE(m.sequences_at_context, static_cast<int64_t>(room / (16 * 6144)) / 2048);
  EXPECT_DOUBLE_EQ(m.sequences_at_lengths, static_cast<double>(m.kv_blocks) / 2048);
  // The tied Q8_0 table is billed once, and read once a step as the LM head.
  EXPECT_EQ(m.embedding_bytes, 262144ull * 640 / 32 * 34);
  EXPECT_EQ(m.lm_head_bytes, 0u);
  EXPECT_TRUE(real_warnings(p).empty()) << real_warnings(p).front();

  // Decode reads a windowed layer's last 512 keys only: at batch 4, context 32768 ...
  in.batch = 4;
  in.decode_context = 32768;
  Plan d = plan_of(in);
  EXPECT_EQ(d.time.kv_bytes_read, 4ull * (32768 * 6144 + 512 * 30720));
  EXPECT_DOUBLE_EQ(d.time.kv_read_s, static_cast<double>(4ull * (32768 * 6144 + 512 * 30720)) / 2039e9);
  EXPECT_DOUBLE_EQ(d.time.flops, 4 * (2.0 * static_cast<double>(d.memory.matrix_params_per_rank) +
                                      4.0 * 1024 * (3.0 * 32768 + 15.0 * 512)));
  // ... and every key below the window.
  in.decode_context = 100;
  d = plan_of(in);
  EXPECT_EQ(d.time.kv_bytes_read, 4ull * 100 * 36864);

  const std::string text = format_plan(p);
  EXPECT_NE(text.find("15 layers: the last 512 positions"), std::string::npos) << text;
  EXPECT_NE(text.find("1248 blocks"), std::string::npos) << text;
  EXPECT_EQ(text.find("held for the full context"), std::string::npos) << text;
  const auto j = nlohmann::json::parse(plan_to_json(p));
  EXPECT_EQ(j["max_step_tokens"].get<int64_t>(), 2048);
  EXPECT_TRUE(j["memory"]["window_pool"].get<bool>());
  EXPECT_EQ(j["memory"]["window_pool_blocks"].get<int64_t>(), 1248);
  EXPECT_EQ(j["memory"]["kv_bytes_per_token_global"].get<uint64_t>(), 6144u);
  EXPECT_EQ(j["memory"]["kv_bytes_per_token_windowed"].get<uint64_t>(), 30720u);
  EXPECT_EQ(j["memory"]["kv_blocks"].get<int64_t>(), m.kv_blocks);

  // A bigger step budget adds its pieces' blocks.
  in.max_step_tokens = 8192;
  EXPECT_EQ(plan_of(in).memory.window_pool_blocks, 35 * 32 + 512);
  in.max_step_tokens = 0;
  EXPECT_FALSE(make_plan(in).is_ok());
}

// When the window pool for max_batch would need as much as one pool holds, the coordinator keeps
// one pool: every layer's KV for the whole context.
TEST(PlannerTest, Gemma3WindowPoolTooBigForTheRoomIsOnePool) {
  PlanInput in = input(gemma3_270m(), "Q8_0", "A100-80GB");
  in.kv_dtype = KvDtype::kF32;
  in.max_batch = 4096;  // 35 x 4096 window blocks: more than the ~125k blocks of one pool
  const Plan p = plan_of(in);
  const MemoryBill& m = p.memory;
  EXPECT_EQ(m.window_pool_blocks, window_pool_blocks(512, in.max_step_tokens, 16, 4096));
  EXPECT_FALSE(m.window_pool);
  EXPECT_EQ(m.window_pool_bytes, 0u);
  EXPECT_EQ(m.kv_block_bytes, 16ull * 36864);
  EXPECT_EQ(m.kv_blocks, static_cast<int64_t>(static_cast<uint64_t>(m.kv_room_bytes) / (16 * 36864)));
  EXPECT_LT(m.kv_blocks, m.window_pool_blocks);
  EXPECT_TRUE(has_warning(p, "one pool keeps all 18 layers' KV for the whole context", false));
  EXPECT_NE(format_plan(p).find("not split"), std::string::npos);
}

// A model without windowed layers plans one pool, as before the window pool; so does one whose
// every layer is windowed (no window pool: windowed_kv_layers is empty).
TEST(PlannerTest, OnePoolWithoutWindowedLayers) {
  PlanInput in = input(llama2_7b(), "F16", "A100-80GB");
  in.batch = 8;
  in.decode_context = 1000;
  Plan p = plan_of(in);
  EXPECT_EQ(p.memory.windowed_layers, 0);
  EXPECT_FALSE(p.memory.window_pool);
  EXPECT_EQ(p.memory.window_pool_blocks, 0);
  EXPECT_EQ(p.memory.kv_bytes_per_token_global, p.memory.kv_bytes_per_token);
  EXPECT_EQ(p.memory.kv_bytes_per_token_windowed, 0u);
  EXPECT_EQ(p.memory.kv_block_bytes, 16 * p.memory.kv_bytes_per_token);
  EXPECT_EQ(p.memory.kv_blocks, static_cast<int64_t>(static_cast<uint64_t>(p.memory.kv_room_bytes) / (16 * 524'288ull)));
  EXPECT_EQ(p.time.kv_bytes_read, 8ull * 1000 * 524'288);
  EXPECT_EQ(format_plan(p).find("window"), std::string::npos);

  ModelConfig mistral = llama2_7b();
  mistral.max_positions = 32768;
  mistral.sliding_window = 4096;  // every layer
  in = input(mistral, "F16", "A100-80GB");
  in.batch = 2;
  in.decode_context = 8000;
  p = plan_of(in);
  EXPECT_EQ(p.memory.windowed_layers, 0);
  EXPECT_FALSE(p.memory.window_pool);
  EXPECT_EQ(p.memory.kv_blocks, static_cast<int64_t>(static_cast<uint64_t>(p.memory.kv_room_bytes) / (16 * 524'288ull)));
  EXPECT_EQ(p.time.kv_bytes_read, 2ull * 8000 * 524'288);
  EXPECT_NE(format_plan(p).find("their KV is held for the full context"), std::string::npos);
}

// The stored mix's group divides the rows it bills: Gemma-3-270M's rows of 640 are not rounded up
// to 768 (three groups of 256).
TEST(PlannerTest, StoredPrecisionGroupDividesTheRows) {
  const uint64_t bytes = 68'106'240, elems = 100'270'080;  // the 270M file's layer matrices
  const PrecisionSpec g256 = precision_from_totals("stored", bytes, elems);
  const PrecisionSpec g128 = precision_from_totals("stored", bytes, elems, 128);
  EXPECT_EQ(g256.group_elems, 256);
  EXPECT_EQ(g128.group_elems, 128);
  EXPECT_EQ(g128.group_bytes, 87);  // 128 x 5.434 bits = 86.9 B
  EXPECT_EQ(g128.row_bytes(640), 5u * 87);
  EXPECT_EQ(g256.row_bytes(640), 3u * 174);
}

// The real file: Q8_0 embedding tied to the head, mixed Q4_K_M layers, 15 windowed layers.
TEST(PlannerTest, Gemma3RealFile) {
  const std::string file = testing::default_model_file();
  if (file.empty()) GTEST_SKIP() << "no default model file";
  auto model = load_plan_model(file);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  ASSERT_TRUE(model->has_weights);
  EXPECT_TRUE(model->config.tie_embeddings);
  EXPECT_DOUBLE_EQ(model->stored_embeddings.bits_per_weight(), 8.5);
  PlanInput in = input(model->config, "Q8_0", "A100-80GB");
  in.weights = model->stored_layers;
  in.embeddings = model->stored_embeddings;
  in.kv_dtype = KvDtype::kF32;
  const Plan p = plan_of(in);
  EXPECT_EQ(p.memory.embedding_bytes, 262144ull * 640 / 32 * 34);
  EXPECT_EQ(p.memory.lm_head_bytes, 0u);
  // The file's layer matrices are 68,106,240 B; the average rounds to half a byte per 128.
  EXPECT_NEAR(static_cast<double>(p.memory.layer_weight_bytes), 68'106'240.0, 68'106'240.0 * 0.001);
  EXPECT_EQ(p.memory.windowed_layers, 15);
  EXPECT_TRUE(p.memory.window_pool);
}

TEST(PlannerTest, ValidatesInput) {
  PlanInput in = input(llama2_7b(), "F16", "A100-80GB");
  in.block_size = 8;
  EXPECT_FALSE(make_plan(in).is_ok());
  in.block_size = 16;
  in.headroom = 1.0;
  EXPECT_FALSE(make_plan(in).is_ok());
  in.headroom = 0.1;
  in.batch = 0;
  EXPECT_FALSE(make_plan(in).is_ok());
}

TEST(PlannerTest, PresetsAndCards) {
  auto c = model_preset("Llama-3-70B");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->vocab, 128256);
  EXPECT_TRUE(c->validate("preset").is_ok());
  for (const std::string& name : model_preset_names()) {
    auto m = model_preset(name);
    ASSERT_TRUE(m.is_ok()) << name;
    EXPECT_TRUE(m->validate(name).is_ok()) << name;
  }
  EXPECT_FALSE(model_preset("gpt-5").is_ok());
  EXPECT_EQ(card("a100").name, "A100-80GB");
  EXPECT_EQ(card("A100-40G").name, "A100-40GB");
  EXPECT_EQ(card("h200").memory_bandwidth, 4800e9);
  EXPECT_FALSE(card_preset("v100").is_ok());
  EXPECT_TRUE(parse_kv_dtype("FP8").is_ok());
  EXPECT_EQ(kv_dtype_bytes(*parse_kv_dtype("bf16")), 2);
  EXPECT_EQ(*parse_kv_dtype("INT8"), KvDtype::kInt8);
  EXPECT_EQ(kv_dtype_name(KvDtype::kInt8), "int8");
  EXPECT_EQ(kv_row_bytes(KvDtype::kInt8, 256), 260u);
  EXPECT_EQ(kv_row_bytes(KvDtype::kF16, 256), 512u);
  EXPECT_NE(parse_kv_dtype("int4").status().message().find("int8"), std::string::npos);
  EXPECT_FALSE(parse_kv_dtype("int2").is_ok());
}

TEST(PlannerTest, LoadsModelsFromFiles) {
  const std::string dir = testdata_dir() + "/stories260K";
  TESSERA_REQUIRE_TESTDATA(dir + "/stories260K-f32.gguf");
  auto gguf = load_plan_model(dir + "/stories260K-f32.gguf");
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_TRUE(gguf->has_weights);
  EXPECT_DOUBLE_EQ(gguf->stored_layers.bits_per_weight(), 32);
  auto hf = load_plan_model(dir + "/hf");
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  EXPECT_EQ(hf->config.hidden, gguf->config.hidden);
  auto json = load_plan_model(dir + "/hf/config.json");
  ASSERT_TRUE(json.is_ok()) << json.status().to_string();
  EXPECT_FALSE(json->has_weights);
  EXPECT_FALSE(load_plan_model(dir + "/missing.gguf").is_ok());
}

TEST(PlannerTest, ProbesTheLocalCpu) {
  CpuProbeOptions o;
  o.threads = 1;
  o.buffer_bytes = 16 * kMiB;
  o.passes = 2;
  auto probe = probe_local_cpu(o);
  ASSERT_TRUE(probe.is_ok()) << probe.status().to_string();
  EXPECT_EQ(probe->threads, 1);
  EXPECT_GT(probe->read_bandwidth, 0);
  EXPECT_GT(probe->fma_flops, 0);
  EXPECT_GT(probe->dispatch_s, 0);
  const CardSpec cpu = cpu_card(*probe);
  EXPECT_TRUE(cpu.is_cpu);
  EXPECT_EQ(cpu.activation_bytes, 4);
  PlanInput in = input(llama2_7b(), "Q8_0", "A100-80GB");
  in.card = cpu;
  in.card.memory_bytes = 64 * kGiB;  // a known size, whatever this machine has
  const Plan p = plan_of(in);
  EXPECT_EQ(p.memory.reserve_bytes, 0u);
  EXPECT_EQ(p.time.launch_graph_s, p.time.launch_s);  // no graphs on the CPU
}

}  // namespace
}  // namespace tessera
