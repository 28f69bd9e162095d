// The checks shared by `distca attention` and distca.attention_forward/backward
// (kernels/attention_inputs.h): shapes without data, the softmax scale, the output bytes, and
// the parameters built once the data are there.
#include "distca/kernels/attention_inputs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace distca::kernels {
namespace {

AttentionInputs inputs(std::vector<int64_t> q, std::vector<int64_t> k, int64_t cu = 2) {
  AttentionInputs in;
  in.q = {"q", q};
  in.k = {"k", k};
  in.v = {"v", k};
  in.cu_seqlens_q = {"cu_seqlens_q", {cu}};
  in.cu_seqlens_k = {"cu_seqlens_k", {cu}};
  return in;
}

std::string message(const Status& st) { return st.ok() ? "OK" : st.message(); }

TEST(AttentionInputs, ShapesAcceptedAndRefusedNamingTheArgument) {
  EXPECT_EQ(message(check_shapes(inputs({8, 4, 16}, {8, 2, 16}))), "OK");
  EXPECT_EQ(message(check_shapes(inputs({8, 0, 16}, {8, 2, 16}))), "q: shape (8, 0, 16) needs n_heads and head_dim > 0");
  EXPECT_EQ(message(check_shapes(inputs({8, 4, 16}, {8, 3, 16}))), "k: n_kv_heads 3 must divide q's n_heads 4");
  EXPECT_EQ(message(check_shapes(inputs({8, 4, 16}, {8, 2, 8}))), "k: head_dim 8 differs from q's 16");
  AttentionInputs v_differs = inputs({8, 4, 16}, {8, 2, 16});
  v_differs.v.shape = {7, 2, 16};
  EXPECT_EQ(message(check_shapes(v_differs)), "v: shape (7, 2, 16) differs from k (8, 2, 16)");
  EXPECT_EQ(message(check_shapes(inputs({8, 4, 16}, {8, 2, 16}, 0))), "cu_seqlens_q: needs at least one entry");
  AttentionInputs cu_differs = inputs({8, 4, 16}, {8, 2, 16});
  cu_differs.cu_seqlens_k.shape = {3};
  EXPECT_EQ(message(check_shapes(cu_differs)), "cu_seqlens_k: 3 entries but cu_seqlens_q has 2");
  AttentionInputs flat = inputs({8, 4, 16}, {8, 2, 16});
  flat.q.shape = {8, 64};
  EXPECT_EQ(message(check_shapes(flat)), "q: 2-d array, expected 3-d");
}

// Dimensions a NumPy view can have (a broadcast allocates nothing) but the kernel's int32
// parameters cannot hold: refused before anything reads or copies the data.
TEST(AttentionInputs, DimensionsBeyondInt32AreRefused) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_EQ(message(check_shapes(inputs({1, big + 4, 16}, {1, 4, 16}))),
            "q: dimensions exceed int32 (shape (1, 4294967300, 16))");
  // Without the check n_kv_heads would wrap to 2 and divide n_heads 4.
  EXPECT_EQ(message(check_shapes(inputs({8, 4, 16}, {8, big + 2, 16}))),
            "k: dimensions exceed int32 (shape (8, 4294967298, 16))");
  EXPECT_EQ(message(check_shapes(inputs({8, 4, 16}, {8, 2, 16}, int64_t{1} << 33))),
            "cu_seqlens_q: more than 2^31 - 1 tasks");
}

TEST(AttentionInputs, BackwardShapes) {
  AttentionInputs in = inputs({8, 4, 16}, {8, 2, 16});
  in.d_o = AttentionArray{"d_o", {8, 4, 16}};
  in.o = AttentionArray{"o", {8, 4, 16}};
  in.lse = AttentionArray{"lse", {4, 8}};
  EXPECT_EQ(message(check_shapes(in)), "OK");
  in.lse->shape = {4, int64_t{1} << 33};
  EXPECT_EQ(message(check_shapes(in)), "lse: shape (4, 8589934592) differs from (n_heads, total_q) = (4, 8)");
  in.lse->shape = {4, 8};
  in.d_o->shape = {8, 4, 15};
  EXPECT_EQ(message(check_shapes(in)), "d_o: shape (8, 4, 15) differs from q (8, 4, 16)");
}

TEST(AttentionInputs, SoftmaxScaleMustBePositiveAndFiniteAsFloat) {
  EXPECT_TRUE(check_softmax_scale(0.125, "--scale").ok());
  EXPECT_EQ(message(check_softmax_scale(-1, "softmax_scale")),
            "softmax_scale: must be a finite number > 0 within float32 range (got -1)");
  EXPECT_FALSE(check_softmax_scale(0, "--scale").ok());
  EXPECT_FALSE(check_softmax_scale(1e300, "--scale").ok());  // inf as a float
  EXPECT_FALSE(check_softmax_scale(1e-60, "--scale").ok());  // 0 as a float: the "default"
  EXPECT_FALSE(check_softmax_scale(std::nan(""), "--scale").ok());
}

TEST(AttentionInputs, OutputBytesCountEveryOutput) {
  AttentionInputs in = inputs({8, 4, 16}, {6, 2, 16});
  EXPECT_EQ(attention_output_bytes(in), 4.0 * (8 * 4 * 16 + 4 * 8));  // o and lse
  in.d_o = AttentionArray{"d_o", {8, 4, 16}};
  EXPECT_EQ(attention_output_bytes(in), 4.0 * (2 * 8 * 4 * 16 + 4 * 8 + 2 * 6 * 2 * 16));  // + dq, dk, dv
}

TEST(AttentionInputs, ParamsFromDataAndTheChecksThatReadIt) {
  const AttentionInputs in = inputs({8, 4, 16}, {8, 2, 16});
  const std::vector<float> x(8 * 4 * 16);
  const int32_t cu[] = {0, 8}, short_cu[] = {0, 4}, decreasing[] = {3, 8};
  auto p = make_params(in, x.data(), x.data(), x.data(), cu, cu, true, 0.5f);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->n_tasks, 1);
  EXPECT_EQ(p->n_heads, 4);
  EXPECT_EQ(p->n_kv_heads, 2);
  EXPECT_EQ(p->head_dim, 16);
  EXPECT_EQ(p->softmax_scale, 0.5f);
  EXPECT_EQ(message(make_params(in, x.data(), x.data(), x.data(), short_cu, cu, true, 0).status()),
            "cu_seqlens_q: last entry 4 must equal total_q 8 (rows of q)");
  EXPECT_EQ(message(make_params(in, x.data(), x.data(), x.data(), cu, decreasing, true, 0).status()),
            "cu_seqlens_k: cu_seqlens_k[0] must be 0 (got 3)");
  EXPECT_EQ(message(make_params(in, x.data(), x.data(), x.data(), cu, cu, true, -2.0f).status()),
            "softmax_scale: softmax_scale must be finite and >= 0 (0: 1/sqrt(head_dim))");
}

}  // namespace
}  // namespace distca::kernels
