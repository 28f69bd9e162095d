#include "distca/cost/analytic.h"

#include <gtest/gtest.h>

#include "distca/cost/cost_model.h"

namespace distca {
namespace {

// Brute force: query p attends keys 0..p.
int64_t brute_pairs(int64_t a, int64_t b) {
  int64_t n = 0;
  for (int64_t q = a; q < b; ++q)
    for (int64_t k = 0; k < b; ++k) n += (k <= q);
  return n;
}

// Bottom-right causal mask of a (q_len, kv_len) task: row r sees keys 0..kv_len-q_len+r.
int64_t brute_task_pairs(int64_t q_len, int64_t kv_len) {
  int64_t n = 0;
  for (int64_t r = 0; r < q_len; ++r)
    for (int64_t k = 0; k < kv_len; ++k) n += (k <= kv_len - q_len + r);
  return n;
}

TEST(Analytic, CausalPairsMatchBruteForce) {
  for (int64_t b = 0; b <= 40; ++b) {
    for (int64_t a = 0; a <= b; ++a) {
      ASSERT_EQ(causal_pairs(a, b), brute_pairs(a, b)) << a << "," << b;
      ASSERT_EQ(task_pairs(b - a, b), brute_task_pairs(b - a, b)) << a << "," << b;
    }
  }
  EXPECT_EQ(document_pairs(524288), int64_t{524288} * 524289 / 2);
}

TEST(Analytic, PairsAddUpOverSplits) {
  // A document's pairs are the sum over any partition of its query rows.
  const int64_t len = 1000;
  const int64_t cuts[] = {0, 17, 128, 500, 501, 999, 1000};
  int64_t total = 0;
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) total += causal_pairs(cuts[i], cuts[i + 1]);
  EXPECT_EQ(total, document_pairs(len));
}

TEST(Analytic, FlopsFollowTheSharedArithmetic) {
  const ModelSpec m = model_preset("llama-8b").value();
  EXPECT_DOUBLE_EQ(attention_forward_flops(m, 1.0), 4.0 * 128 * 32);
  EXPECT_DOUBLE_EQ(attention_backward_flops(m, 10.0), 2.5 * 10 * 4.0 * 128 * 32);
  // 2 h (2h + 2 h_kv + 3 i) with h = 4096, h_kv = 1024, i = 14336.
  EXPECT_DOUBLE_EQ(linear_forward_flops_per_token(m), 2.0 * 4096 * (2.0 * 4096 + 2.0 * 1024 + 3.0 * 14336));
  EXPECT_DOUBLE_EQ(lm_head_forward_flops_per_token(m), 2.0 * 4096 * 128256);
}

TEST(Analytic, RowBytes) {
  const ModelSpec m = model_preset("llama-8b").value();
  RowBytes bf16 = row_bytes(m, 2);
  EXPECT_EQ(bf16.q, 4096 * 2);
  EXPECT_EQ(bf16.kv, 2 * 1024 * 2);
  EXPECT_EQ(bf16.o, 4096 * 2);
  EXPECT_EQ(bf16.lse, 32 * 4);
  RowBytes fp32 = row_bytes(m, 4);
  EXPECT_EQ(fp32.q, 2 * bf16.q);
  EXPECT_EQ(fp32.lse, bf16.lse);
}

// Appendix A's t: Llama-34B on H200 at 50% MFU of 990 TFLOP/s, the full linear FLOPs (K and V
// projections both counted): 2.864 us per token.
TEST(Analytic, AppendixALinearSecondsPerToken) {
  const ModelSpec m = model_preset("llama-34b").value();
  const HardwareSpec hw = hardware_preset("h200").value();
  EXPECT_NEAR(linear_seconds_per_token(m, hw, 0.5), 2.864e-6, 0.001e-6);
}

TEST(CostModel, PairsModelIsTaskPairs) {
  PairsCostModel cost;
  EXPECT_EQ(cost.unit(), "pairs");
  EXPECT_DOUBLE_EQ(cost.task_cost(0, 10), 0.0);
  EXPECT_DOUBLE_EQ(cost.task_cost(3, 10), static_cast<double>(brute_task_pairs(3, 10)));
}

}  // namespace
}  // namespace distca
