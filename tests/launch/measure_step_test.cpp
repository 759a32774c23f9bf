// `tessera plan --measure` / `tessera tune calibrate`'s decode steps (launch/measure_step.h) on a
// tiny synthetic model, with each KV element type the CPU backend stores (common/kv_config.h).
#include "launch/measure_step.h"

#include <gtest/gtest.h>

#include "common/kv_config.h"
#include "tests/model/loader_test_util.h"
#include "tools/testmodel/synthetic_model.h"

namespace tessera::cli {
namespace {

TEST(MeasureStep, RunsEveryKvDtypeTheCpuStores) {
  loader_test::TempDir dir;
  auto spec = synthetic_preset("tiny");
  ASSERT_TRUE(spec.is_ok());
  ASSERT_TRUE(write_synthetic_hf(*spec, dir.file("hf")).is_ok());
  for (const KvDtypeTraits& kv : all_kv_dtypes()) {
    SCOPED_TRACE(std::string(kv.name));
    MeasureArgs a;
    a.model = dir.file("hf");
    a.threads = 2;
    a.batch = 2;
    a.kv_dtype = kv.dtype;
    a.steps = 2;
    auto m = measure_decode_steps(a, 32);
    if (!kv.cpu) {  // bf16, fp8: planned only; the CPU KV cache refuses them, naming what it stores
      ASSERT_FALSE(m.is_ok());
      EXPECT_NE(m.status().message().find(kv_dtypes_stored_text(KvBackend::kCpu)), std::string::npos)
          << m.status().message();
      continue;
    }
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    const int64_t head_dim = spec->head_dim > 0 ? spec->head_dim : spec->hidden / spec->n_heads;
    EXPECT_EQ(m->kv_bytes_per_token,
              2 * static_cast<uint64_t>(spec->n_layers * spec->n_kv_heads) * kv_row_bytes(kv.dtype, head_dim));
    EXPECT_EQ(m->steps, 2);
    EXPECT_GT(m->step_median_s, 0.0);
  }
}

// The plan's default context is the model's whole length: measured a few positions shorter, as
// far as the timed steps leave room; a context past the model's length stays an error.
TEST(MeasureStep, TheWholeContextIsMeasuredAsFarAsTheStepsLeaveRoom) {
  loader_test::TempDir dir;
  auto spec = synthetic_preset("tiny");
  ASSERT_TRUE(spec.is_ok());
  ASSERT_TRUE(write_synthetic_hf(*spec, dir.file("hf")).is_ok());
  MeasureArgs a;
  a.model = dir.file("hf");
  a.threads = 1;
  a.steps = 2;
  auto m = measure_decode_steps(a, spec->max_positions);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->context, spec->max_positions - 2 - a.steps - 1);  // two warm-up steps, then the timed ones
  auto past = measure_decode_steps(a, spec->max_positions + 1);
  ASSERT_FALSE(past.is_ok());
  EXPECT_NE(past.status().message().find("exceeds the model's"), std::string::npos) << past.status().to_string();
}

}  // namespace
}  // namespace tessera::cli
