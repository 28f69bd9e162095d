// The fast path against the naive references: the fp64 reference is the truth, and the fast
// path's error must stay within 2x the error of a plain fp32 implementation on the same
// inputs. For the forward the inputs are Q, K, V; for the backward they are Q, K, V, dO and the
// forward's O and LSE (attention.h), so the fp32 baseline is reference_backward_from_lse fed
// with the fast forward's O and LSE: an fp32 LSE near 8 carries ~5e-7 absolute rounding, which
// any backward that takes LSE inherits, and a baseline that ignored LSE would not. Also: LSE, empty tasks, GQA, non-causal, bitwise determinism across thread
// counts, and validate().
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "distca/kernels/attention.h"
#include "distca/kernels/attention_traits.h"
#include "distca/kernels/profiler.h"
#include "distca/kernels/reference.h"

namespace distca::kernels {
namespace {

using Tasks = std::vector<std::pair<int64_t, int64_t>>;

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// max |a - ref| over finite entries; entries where ref is -inf must match exactly.
double max_err(const std::vector<float>& a, const std::vector<double>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double e = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      EXPECT_EQ(static_cast<double>(a[i]), ref[i]) << "entry " << i;
      continue;
    }
    EXPECT_TRUE(std::isfinite(a[i])) << "entry " << i;
    e = std::max(e, std::abs(static_cast<double>(a[i]) - ref[i]));
  }
  return e;
}
double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) {
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  }
  return m;
}

// The tolerance: 2x the plain fp32 implementation's error, floored at one fp32 ulp of the
// largest reference value (so an exactly-representable case does not demand bit equality).
void expect_within(const char* what, const std::vector<float>& fast, const std::vector<float>& naive32,
                   const std::vector<double>& ref64) {
  const double e_fast = max_err(fast, ref64);
  const double e_naive = max_err(naive32, ref64);
  const double floor = FLT_EPSILON * max_abs(ref64);
  EXPECT_LE(e_fast, 2.0 * std::max(e_naive, floor))
      << what << ": fast-path error " << e_fast << " vs plain fp32 error " << e_naive;
}

struct Case {
  Tasks tasks;
  int32_t heads, kv_heads, head_dim;
  bool causal = true;
};

void check_case(const Case& c, uint64_t seed) {
  AttentionProblem pr = make_problem(c.tasks, c.heads, c.kv_heads, c.head_dim, seed);
  pr.causal = c.causal;
  AttentionParams p = params_for(pr);
  ASSERT_TRUE(validate(p).ok()) << validate(p).message();
  attention_forward(p);
  attention_backward(p);

  const size_t nq = pr.q.size(), nk = pr.k.size(), nl = pr.lse.size();
  // fp64 reference
  const auto q64 = to_double(pr.q), k64 = to_double(pr.k), v64 = to_double(pr.v), do64 = to_double(pr.d_o);
  std::vector<double> o64(nq), lse64(nl), dq64(nq), dk64(nk), dv64(nk);
  reference_forward<double>(p, q64.data(), k64.data(), v64.data(), o64.data(), lse64.data());
  reference_backward<double>(p, q64.data(), k64.data(), v64.data(), do64.data(), dq64.data(), dk64.data(),
                             dv64.data());
  // plain fp32
  std::vector<float> o32(nq), lse32(nl), dq32(nq), dk32(nk), dv32(nk);
  reference_forward<float>(p, pr.q.data(), pr.k.data(), pr.v.data(), o32.data(), lse32.data());
  reference_backward_from_lse<float>(p, pr.q.data(), pr.k.data(), pr.v.data(), pr.o.data(), pr.lse.data(),
                                     pr.d_o.data(), dq32.data(), dk32.data(), dv32.data());

  expect_within("O", pr.o, o32, o64);
  expect_within("LSE", pr.lse, lse32, lse64);
  expect_within("dQ", pr.dq, dq32, dq64);
  expect_within("dK", pr.dk, dk32, dk64);
  expect_within("dV", pr.dv, dv32, dv64);
}

TEST(AttentionFastPath, SingleQueryRow) {
  check_case({{{1, 300}}, 4, 4, 64}, 1);
  check_case({{{1, 2}, {1, 513}}, 2, 2, 32}, 2);
}

// A task with one key: P = 1, O = v, so dS = dO.v - dO.O cancels exactly in the true gradient.
// The plain fp32 loop reproduces the cancellation bit for bit (same summation order for both
// dot products) while the fast path computes dO.v in sgemm and dO.O in its own loop, leaving
// ~1 ulp of dO.v; so here the bound is absolute, at a few ulp of the terms.
TEST(AttentionFastPath, SingleKeyTask) {
  AttentionProblem pr = make_problem({{1, 1}, {1, 1}}, 2, 2, 32, 2);
  const AttentionParams p = params_for(pr);
  attention_forward(p);
  attention_backward(p);
  const auto q64 = to_double(pr.q), k64 = to_double(pr.k), v64 = to_double(pr.v), do64 = to_double(pr.d_o);
  std::vector<double> o64(pr.o.size()), lse64(pr.lse.size()), dq64(pr.q.size()), dk64(pr.k.size()), dv64(pr.v.size());
  reference_forward<double>(p, q64.data(), k64.data(), v64.data(), o64.data(), lse64.data());
  reference_backward<double>(p, q64.data(), k64.data(), v64.data(), do64.data(), dq64.data(), dk64.data(), dv64.data());
  EXPECT_EQ(max_err(pr.o, o64), 0.0);
  EXPECT_LT(max_err(pr.lse, lse64), 1e-6);
  EXPECT_LT(max_err(pr.dq, dq64), 1e-6);
  EXPECT_LT(max_err(pr.dk, dk64), 1e-6);
  EXPECT_LT(max_err(pr.dv, dv64), 1e-6);
}

TEST(AttentionFastPath, SquareTask) { check_case({{{300, 300}}, 2, 2, 64}, 3); }

TEST(AttentionFastPath, ShorterQueryThanContext) { check_case({{{70, 333}, {129, 700}}, 2, 1, 128}, 4); }

TEST(AttentionFastPath, ShardWhoseKeyBlocksStartMidQueryTile) {
  // 600 query rows at the end of a 1300-key context, GQA 4 (64-row query tiles): the backward
  // cuts the keys into several chunks whose first query row (key - 700) is not a multiple of
  // the tile, so each chunk's dQ partial must start at the tile its first product writes.
  check_case({{{600, 1300}}, 4, 1, 32}, 12);
  // Two such tasks, so chunks of different tasks sit side by side in the partial buffer.
  check_case({{{500, 1100}, {200, 900}}, 8, 2, 32}, 13);
  // G = 1: 256-row tiles that cross the diagonal go in 64-row sub-tiles, some of which see no
  // key of a chunk's first block and must still zero their partial rows.
  check_case({{{500, 1100}, {256, 256}, {300, 300}}, 2, 2, 32}, 14);
}

TEST(AttentionFastPath, EmptyTasks) {
  // q_len 0 tasks (with and without keys) between real ones; their keys get zero gradients.
  check_case({{{0, 0}, {5, 17}, {0, 40}, {0, 0}, {33, 33}, {0, 300}}, 4, 2, 32}, 5);
}

TEST(AttentionFastPath, ManyTinyTasksAndOneHuge) {
  Tasks t;
  for (int i = 0; i < 40; ++i) t.push_back({1 + i % 5, 1 + i % 5 + i % 3});
  t.insert(t.begin() + 17, {600, 600});
  check_case({t, 2, 2, 64}, 6);
}

TEST(AttentionFastPath, GqaRatiosAndHeadDims) {
  const Tasks t = {{40, 40}, {100, 260}, {1, 77}, {257, 257}};
  check_case({t, 4, 4, 32}, 7);    // ratio 1
  check_case({t, 4, 1, 64}, 8);    // ratio 4
  check_case({t, 8, 1, 128}, 9);   // ratio 8
  check_case({t, 16, 2, 32}, 10);  // ratio 8, two groups
}

TEST(AttentionFastPath, NonCausal) {
  check_case({{{50, 20}, {1, 300}, {0, 10}, {7, 0}}, 4, 2, 64, false}, 11);
}

TEST(AttentionFastPath, NoVisibleKeyGivesZeroOutputAndMinusInfLse) {
  AttentionProblem pr = make_problem({{3, 0}}, 2, 1, 32, 12);
  pr.causal = false;
  std::fill(pr.o.begin(), pr.o.end(), 7.0f);
  std::fill(pr.dq.begin(), pr.dq.end(), 7.0f);
  const AttentionParams p = params_for(pr);
  attention_forward(p);
  attention_backward(p);
  for (float x : pr.o) EXPECT_EQ(x, 0.0f);
  for (float x : pr.lse) EXPECT_TRUE(std::isinf(x) && x < 0);
  for (float x : pr.dq) EXPECT_EQ(x, 0.0f);
}

TEST(AttentionFastPath, ExplicitScaleIsUsed) {
  AttentionProblem pr = make_problem({{20, 40}}, 2, 2, 32, 13);
  AttentionParams p = params_for(pr);
  p.softmax_scale = 0.37f;
  attention_forward(p);
  const auto q64 = to_double(pr.q), k64 = to_double(pr.k), v64 = to_double(pr.v);
  std::vector<double> o64(pr.o.size()), lse64(pr.lse.size());
  reference_forward<double>(p, q64.data(), k64.data(), v64.data(), o64.data(), lse64.data());
  EXPECT_LT(max_err(pr.o, o64), 1e-5);
  EXPECT_LT(max_err(pr.lse, lse64), 1e-5);
}

// Same inputs, 1, 2 and 4 threads: every output bit equal. The batch has one task large
// enough that the backward splits its keys into several chunks with dQ partials.
TEST(AttentionDeterminism, BitwiseAcrossThreadCounts) {
  const Tasks t = {{3, 9}, {1500, 1500}, {0, 5}, {64, 700}, {2, 2}};
  std::vector<std::vector<float>> first;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 4}) {
    omp_set_num_threads(threads);
    AttentionProblem pr = make_problem(t, 4, 2, 64, 14);
    const AttentionParams p = params_for(pr);
    attention_forward(p);
    attention_backward(p);
    std::vector<std::vector<float>> outs = {pr.o, pr.lse, pr.dq, pr.dk, pr.dv};
    if (first.empty()) {
      first = outs;
      continue;
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      ASSERT_EQ(outs[i].size(), first[i].size());
      EXPECT_EQ(std::memcmp(outs[i].data(), first[i].data(), outs[i].size() * sizeof(float)), 0)
          << "output " << i << " differs with " << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

// Central finite differences of L = sum(dO * O) against the fp64 reference backward.
TEST(AttentionReference, GradientsMatchFiniteDifferences) {
  for (bool causal : {true, false}) {
    AttentionProblem pr = make_problem({{2, 3}, {3, 3}, {0, 2}}, 4, 2, 4, 15);
    pr.causal = causal;
    const AttentionParams p = params_for(pr);
    auto q = to_double(pr.q), k = to_double(pr.k), v = to_double(pr.v), dO = to_double(pr.d_o);
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
    reference_backward<double>(p, q.data(), k.data(), v.data(), dO.data(), dq.data(), dk.data(), dv.data());
    auto loss = [&]() {
      std::vector<double> o(q.size()), lse(pr.lse.size());
      reference_forward<double>(p, q.data(), k.data(), v.data(), o.data(), lse.data());
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i) l += o[i] * dO[i];
      return l;
    };
    const double h = 1e-6;
    auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      for (size_t i = 0; i < x.size(); ++i) {
        const double keep = x[i];
        x[i] = keep + h;
        const double lp = loss();
        x[i] = keep - h;
        const double lm = loss();
        x[i] = keep;
        EXPECT_NEAR(grad[i], (lp - lm) / (2 * h), 1e-7) << name << "[" << i << "] causal=" << causal;
      }
    };
    check(q, dq, "dq");
    check(k, dk, "dk");
    check(v, dv, "dv");
  }
}

TEST(AttentionValidate, RefusesBadShapes) {
  AttentionProblem pr = make_problem({{4, 8}, {2, 2}}, 4, 2, 32, 16);
  AttentionParams p = params_for(pr);
  EXPECT_TRUE(validate(p).ok());
  AttentionParams bad = p;
  bad.n_heads = 3;
  EXPECT_NE(validate(bad).message().find("n_kv_heads"), std::string::npos);
  std::vector<int32_t> cu = {0, 5, 4};
  bad = p;
  bad.cu_seqlens_q = cu.data();
  EXPECT_NE(validate(bad).message().find("cu_seqlens_q"), std::string::npos);
  std::vector<int32_t> cu2 = {1, 5, 6};
  bad = p;
  bad.cu_seqlens_k = cu2.data();
  EXPECT_NE(validate(bad).message().find("cu_seqlens_k"), std::string::npos);
  std::vector<int32_t> cuq = {0, 9, 11};  // q_len 9 > kv_len 8
  bad = p;
  bad.cu_seqlens_q = cuq.data();
  EXPECT_NE(validate(bad).message().find("q_len"), std::string::npos);
  bad.causal = false;
  bad.max_seqlen_q = 0;  // recomputed: 9 exceeds the 4 params_for derived
  EXPECT_TRUE(validate(bad).ok());
  bad = p;
  bad.head_dim = 0;
  EXPECT_FALSE(validate(bad).ok());
}

TEST(AttentionFlops, PairsMatchBruteForce) {
  AttentionProblem pr = make_problem({{3, 5}, {0, 4}, {6, 6}}, 2, 1, 8, 17);
  AttentionParams p = params_for(pr);
  // causal: rows see 3,4,5 / none / 1..6 keys
  EXPECT_EQ(attention_pairs(p), 3 + 4 + 5 + 21);
  EXPECT_EQ(attention_forward_flops(p), 4.0 * 8 * 2 * 33);
  EXPECT_EQ(attention_backward_flops(p), 2.5 * 4.0 * 8 * 2 * 33);
  p.causal = false;
  EXPECT_EQ(attention_pairs(p), 15 + 0 + 36);
}

// The traits' contract: a task holding rows [a, b) of a document with context [0, b) gives its
// rows the whole-document call's O and LSE bits when a is a multiple of query_tile_rows(G) and
// b is one too or the document's end: the property the CA runtime's padding relies on.
TEST(AttentionTraits, TaskOnTileBoundariesGivesTheWholeDocumentBits) {
  EXPECT_EQ(AttentionTraits::query_tile_rows(1), 256);
  EXPECT_EQ(AttentionTraits::query_tile_rows(4), 64);
  EXPECT_EQ(AttentionTraits::query_tile_rows(512), 1);
  for (const auto& [heads, kv_heads] : std::vector<std::pair<int32_t, int32_t>>{{1, 1}, {4, 2}, {4, 1}, {16, 2}}) {
    const int64_t G = heads / kv_heads, tile = AttentionTraits::query_tile_rows(G), d = 16;
    const int64_t L = 3 * tile + 37;
    AttentionProblem whole = make_problem({{L, L}}, heads, kv_heads, static_cast<int32_t>(d), 31 + static_cast<uint64_t>(G));
    attention_forward(params_for(whole));
    const int64_t qf = heads * d;
    for (const auto& [a, b] : std::vector<std::pair<int64_t, int64_t>>{{0, tile}, {tile, 2 * tile}, {tile, L}, {2 * tile, L}}) {
      const std::vector<int32_t> cu_q = {0, static_cast<int32_t>(b - a)}, cu_k = {0, static_cast<int32_t>(b)};
      std::vector<float> o(static_cast<size_t>((b - a) * qf)), lse(static_cast<size_t>((b - a) * heads));
      AttentionParams p;
      p.q = whole.q.data() + a * qf;
      p.k = whole.k.data();
      p.v = whole.v.data();
      p.cu_seqlens_q = cu_q.data();
      p.cu_seqlens_k = cu_k.data();
      p.n_tasks = 1;
      p.n_heads = heads;
      p.n_kv_heads = kv_heads;
      p.head_dim = static_cast<int32_t>(d);
      p.o = o.data();
      p.lse = lse.data();
      ASSERT_TRUE(validate(p).ok());
      attention_forward(p);
      const std::string what = "G " + std::to_string(G) + " rows [" + std::to_string(a) + ", " + std::to_string(b) + ")";
      EXPECT_EQ(0, std::memcmp(o.data(), whole.o.data() + a * qf, o.size() * sizeof(float))) << what;
      for (int64_t h = 0; h < heads; ++h) {
        EXPECT_EQ(0, std::memcmp(lse.data() + h * (b - a), whole.lse.data() + h * L + a,
                                 static_cast<size_t>(b - a) * sizeof(float)))
            << what << " head " << h;
      }
    }
  }
}

// The scratch estimate bounds what the calls allocate: it grows with the problem and covers
// the backward's dQ partials (at most kPartialCap = 4 times dQ).
TEST(AttentionTraits, ScratchEstimateCoversTheBackwardPartials) {
  const double fwd = attention_scratch_bytes(4096, 8, 2, 64, false, 2);
  const double bwd = attention_scratch_bytes(4096, 8, 2, 64, true, 2);
  EXPECT_GT(fwd, 0.0);
  EXPECT_GE(bwd - fwd, 4.0 * 4096 * 8 * 64 * sizeof(float));
  EXPECT_GT(attention_scratch_bytes(4096, 8, 2, 64, false, 4), fwd);
  EXPECT_GE(problem_memory_bytes(1024, 2048, 4, 2, 32),
            (4.0 * 1024 * 4 * 32 + 4.0 * 2048 * 2 * 32 + 1024 * 4) * sizeof(float) +
                attention_scratch_bytes(1024, 4, 2, 32, true, omp_get_max_threads()));
}

}  // namespace
}  // namespace distca::kernels
