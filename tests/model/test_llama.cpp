// The whole model: gradients against central finite differences (fp64), fp32 against fp64,
// document isolation, RoPE at logical positions, loss bookkeeping, determinism, validation.
#include "distca/model/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <vector>


#include "distca/core/rng.h"
#include "distca/model/local_attention.h"
#include "model_test_util.h"

namespace distca::model {
namespace {

using testing::append_doc;
using testing::Packed;
using testing::random_ids;
using testing::three_docs;
using testing::tiny_spec;

template <class T>
LocalAttentionExecutor<T> executor_for(
    const ModelSpec& s, const Packed& p,
    LocalAttentionBackend backend = LocalAttentionBackend::kReference) {
  auto ex = LocalAttentionExecutor<T>::create(s.n_heads, s.n_kv_heads, s.head_dim, p.pieces,
                                              backend);
  DISTCA_CHECK_MSG(ex.ok(), ex.status().to_string());
  return std::move(ex).value();
}

template <class T>
Llama<T> make_model(uint64_t seed, double init_std, int64_t max_tokens = 64) {
  LlamaOptions opt;
  opt.init_std = init_std;
  auto m = Llama<T>::create(tiny_spec(), max_tokens, seed, opt);
  DISTCA_CHECK_MSG(m.ok(), m.status().to_string());
  return std::move(m).value();
}

// The mean loss over targets of the packed documents, forward only.
double mean_loss(Llama<double>& m, const Packed& p) {
  auto ex = executor_for<double>(m.spec(), p);
  auto r = m.forward(p.inputs(), ex);
  DISTCA_CHECK(r.ok());
  return r->loss_sum / static_cast<double>(r->count);
}

TEST(LlamaGradients, MatchCentralFiniteDifferencesForEveryTensor) {
  // A larger init than training's 0.02 keeps every path (attention scores, SwiGLU's
  // curvature) far from linear, so a wrong term shows up.
  Llama<double> m = make_model<double>(21, 0.3);
  testing::perturb_gains(m, 21);
  const Packed p = three_docs(5, m.spec().vocab);
  auto ex = executor_for<double>(m.spec(), p);
  const int64_t count = 40 - 3;
  auto r = m.forward_backward(p.inputs(), ex, 1.0 / count);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->count, count);
  const std::vector<double> grads(m.grads().begin(), m.grads().end());

  Rng rng(3);
  const double h = 1e-5;
  int checked = 0;
  for (const TensorInfo& t : m.layout()) {
    // The element with the largest gradient plus a few random ones.
    int64_t arg = 0;
    for (int64_t e = 1; e < t.size(); ++e) {
      if (std::abs(grads[t.offset + e]) > std::abs(grads[t.offset + arg])) arg = e;
    }
    ASSERT_GT(std::abs(grads[t.offset + arg]), 1e-4) << t.name << " has no gradient to check";
    std::vector<int64_t> picks = {arg};
    for (int i = 0; i < 5; ++i) picks.push_back(static_cast<int64_t>(rng.uniform_int(t.size())));
    for (const int64_t e : picks) {
      double& w = m.params()[static_cast<size_t>(t.offset + e)];
      const double keep = w;
      w = keep + h;
      const double up = mean_loss(m, p);
      w = keep - h;
      const double down = mean_loss(m, p);
      w = keep;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grads[t.offset + e];
      EXPECT_NEAR(analytic, numeric, 1e-9 + 1e-5 * std::abs(numeric))
          << t.name << "[" << e << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6 * static_cast<int>(m.layout().size()));
}

class LlamaBackend : public ::testing::TestWithParam<LocalAttentionBackend> {};

// fp32 (with either attention backend) against the fp64 model that passed finite differences.
TEST_P(LlamaBackend, Fp32GradientsAgreeWithFp64) {
  Llama<double> md = make_model<double>(22, 0.1);
  testing::perturb_gains(md, 22);
  Llama<float> mf = make_model<float>(22, 0.1);
  for (size_t i = 0; i < md.params().size(); ++i) {
    mf.params()[i] = static_cast<float>(md.params()[i]);
    md.params()[i] = mf.params()[i];  // both models hold exactly the same values
  }
  const Packed p = three_docs(6, md.spec().vocab);
  auto exd = executor_for<double>(md.spec(), p);
  auto exf = executor_for<float>(mf.spec(), p, GetParam());
  auto rd = md.forward_backward(p.inputs(), exd, 1.0 / 37);
  auto rf = mf.forward_backward(p.inputs(), exf, 1.0 / 37);
  ASSERT_TRUE(rd.ok() && rf.ok());
  EXPECT_NEAR(rf->loss_sum, rd->loss_sum, 1e-5 * rd->loss_sum);
  for (const TensorInfo& t : md.layout()) {
    double diff = 0, ref = 0;
    for (int64_t e = 0; e < t.size(); ++e) {
      const double a = md.grads()[static_cast<size_t>(t.offset + e)];
      const double b = mf.grads()[static_cast<size_t>(t.offset + e)];
      diff += (a - b) * (a - b);
      ref += a * a;
    }
    EXPECT_LT(std::sqrt(diff), 1e-4 * std::sqrt(ref)) << t.name;
  }
}

TEST(LlamaGradients, ScaleAndAccumulationAreExact) {
  Llama<float> m = make_model<float>(23, 0.05);
  const Packed p = three_docs(7, m.spec().vocab);
  auto ex = executor_for<float>(m.spec(), p);
  ASSERT_TRUE(m.forward_backward(p.inputs(), ex, 1.0).ok());
  const std::vector<float> g1(m.grads().begin(), m.grads().end());
  m.zero_grads();
  ASSERT_TRUE(m.forward_backward(p.inputs(), ex, 0.5).ok());
  for (size_t i = 0; i < g1.size(); ++i) ASSERT_EQ(m.grads()[i], 0.5f * g1[i]) << i;
  // Accumulates. Not bit-exact: sgemm with beta = 1 may add C into its partial sums in a
  // different order than a separate addition would.
  ASSERT_TRUE(m.forward_backward(p.inputs(), ex, 0.5).ok());
  for (size_t i = 0; i < g1.size(); ++i) {
    ASSERT_NEAR(m.grads()[i], g1[i], 1e-6 * (1 + std::abs(g1[i]))) << i;
  }
}

TEST_P(LlamaBackend, ChangingOneDocumentLeavesTheOthersUntouched) {
  Llama<float> m = make_model<float>(24, 0.1);
  Packed p = three_docs(8, m.spec().vocab);
  auto ex = executor_for<float>(m.spec(), p, GetParam());
  std::vector<float> loss1(p.tokens.size()), loss2(p.tokens.size());
  auto r1 = m.forward(p.inputs(), ex, loss1);
  ASSERT_TRUE(r1.ok());
  // Every document's last token has no target: 40 tokens, 37 targets, zero loss at the ends.
  EXPECT_EQ(r1->count, 37);
  for (const size_t end : {16u, 29u, 39u}) {
    EXPECT_EQ(p.targets[end], -1);
    EXPECT_EQ(loss1[end], 0.0f);
  }
  // New tokens (and targets) for document 1 (rows 17..29).
  Rng rng(77);
  const auto ids = random_ids(rng, 13, m.spec().vocab);
  for (size_t i = 0; i < 13; ++i) {
    p.tokens[17 + i] = ids[i];
    p.targets[17 + i] = i + 1 < 13 ? ids[i + 1] : -1;
  }
  auto r2 = m.forward(p.inputs(), ex, loss2);
  ASSERT_TRUE(r2.ok());
  bool doc1_changed = false;
  for (size_t i = 0; i < loss1.size(); ++i) {
    if (i >= 17 && i < 30) {
      doc1_changed |= loss1[i] != loss2[i];
    } else {
      EXPECT_EQ(loss1[i], loss2[i]) << "row " << i;  // same bits: nothing crosses documents
    }
  }
  EXPECT_TRUE(doc1_changed);
}

TEST(LlamaDocuments, RopeUsesLogicalPositionsRelatively) {
  Llama<double> m = make_model<double>(25, 0.3);
  Rng rng(9);
  const auto a = random_ids(rng, 12, m.spec().vocab);
  const auto b = random_ids(rng, 9, m.spec().vocab);
  Packed base, shifted, shuffled;
  append_doc(base, 0, a);
  append_doc(base, 1, b);
  append_doc(shifted, 0, a);
  append_doc(shifted, 1, b, 100);  // the same document at logical positions 100..108
  shuffled = base;
  std::swap(shuffled.positions[12 + 2], shuffled.positions[12 + 6]);
  std::vector<double> l_base(21), l_shift(21), l_shuffle(21);
  auto ex = executor_for<double>(m.spec(), base);
  ASSERT_TRUE(m.forward(base.inputs(), ex, l_base).ok());
  ASSERT_TRUE(m.forward(shifted.inputs(), ex, l_shift).ok());
  ASSERT_TRUE(m.forward(shuffled.inputs(), ex, l_shuffle).ok());
  // Attention sees only relative rotations, so shifting a document's positions keeps its loss.
  double change = 0;
  for (size_t i = 0; i < 21; ++i) {
    EXPECT_NEAR(l_shift[i], l_base[i], 1e-10) << i;
    change += std::abs(l_shuffle[i] - l_base[i]);
  }
  // ...but the positions do reach the model: swapping two breaks it.
  EXPECT_GT(change, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Backends, LlamaBackend,
                         ::testing::Values(LocalAttentionBackend::kReference,
                                           LocalAttentionBackend::kKernel),
                         [](const auto& info) {
                           return info.param == LocalAttentionBackend::kKernel ? "kernel"
                                                                               : "reference";
                         });

TEST(LlamaLoss, ReportWeightsSelectTargets) {
  Llama<float> m = make_model<float>(26, 0.1);
  Packed p = three_docs(10, m.spec().vocab);
  std::vector<float> weights(p.tokens.size(), 0.0f);
  for (size_t i = 9; i < 17; ++i) weights[i] = 1.0f;   // second half of document 0
  for (size_t i = 35; i < 40; ++i) weights[i] = 1.0f;  // second half of document 2 (39: no target)
  StepInputs in = p.inputs();
  in.report_weights = weights;
  auto ex = executor_for<float>(m.spec(), p);
  std::vector<float> loss(p.tokens.size());
  auto r = m.forward_backward(in, ex, 1.0 / 37, loss);
  ASSERT_TRUE(r.ok());
  double want_sum = 0, want_all = 0;
  for (size_t i = 0; i < loss.size(); ++i) {
    want_all += loss[i];
    if (p.targets[i] >= 0) want_sum += weights[i] * loss[i];
  }
  EXPECT_NEAR(r->report_sum, want_sum, 1e-9 * want_all);
  EXPECT_EQ(r->report_weight, 11.0);  // rows 16 and 39 end their documents: no target
  EXPECT_NEAR(r->loss_sum, want_all, 1e-9 * want_all);
  // At initialisation the loss is close to uniform guessing.
  EXPECT_NEAR(r->loss_sum / r->count, std::log(37.0), 0.2);
}

TEST(LlamaDeterminism, SameSeedSameBits) {
  Llama<float> a = make_model<float>(27, 0.02);
  Llama<float> b = make_model<float>(27, 0.02);
  Llama<float> c = make_model<float>(28, 0.02);
  ASSERT_EQ(std::memcmp(a.params().data(), b.params().data(), a.params().size_bytes()), 0);
  EXPECT_NE(std::memcmp(a.params().data(), c.params().data(), a.params().size_bytes()), 0);
  const Packed p = three_docs(11, a.spec().vocab);
  auto ex = executor_for<float>(a.spec(), p);
  auto ra = a.forward_backward(p.inputs(), ex, 1.0 / 37);
  auto rb = b.forward_backward(p.inputs(), ex, 1.0 / 37);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->loss_sum, rb->loss_sum);
  EXPECT_EQ(std::memcmp(a.grads().data(), b.grads().data(), a.grads().size_bytes()), 0);
  // And again on the same object (the workspace is reused).
  const std::vector<float> g(a.grads().begin(), a.grads().end());
  a.zero_grads();
  auto ra2 = a.forward_backward(p.inputs(), ex, 1.0 / 37);
  ASSERT_TRUE(ra2.ok());
  EXPECT_EQ(ra2->loss_sum, ra->loss_sum);
  EXPECT_EQ(std::memcmp(a.grads().data(), g.data(), a.grads().size_bytes()), 0);
}

TEST(LlamaDeterminism, DocumentAloneOrPackedAgrees) {
  // Row-wise the model is independent of the other rows; sgemm's blocking may still depend on
  // the row count, so this checks closeness and reports whether the bits matched.
  Llama<float> m = make_model<float>(29, 0.1, 256);
  Rng rng(12);
  const auto a = random_ids(rng, 50, m.spec().vocab);
  const auto b = random_ids(rng, 123, m.spec().vocab);
  Packed alone, packed;
  append_doc(alone, 0, a);
  append_doc(packed, 1, b);
  append_doc(packed, 0, a);
  std::vector<float> la(50), lp(173);
  auto ea = executor_for<float>(m.spec(), alone);
  auto ep = executor_for<float>(m.spec(), packed);
  ASSERT_TRUE(m.forward(alone.inputs(), ea, la).ok());
  ASSERT_TRUE(m.forward(packed.inputs(), ep, lp).ok());
  int same_bits = 0;
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_NEAR(lp[123 + i], la[i], 1e-5 * (1 + la[i])) << i;
    same_bits += lp[123 + i] == la[i];
  }
  std::cout << "[info] per-token loss bit-identical alone vs packed: " << same_bits << " / 50\n";
}

TEST(LlamaValidation, RefusesBadInputs) {
  Llama<float> m = make_model<float>(30, 0.02, 40);
  Packed p = three_docs(12, m.spec().vocab);
  auto ex = executor_for<float>(m.spec(), p);
  EXPECT_TRUE(m.forward(p.inputs(), ex).ok());

  Packed bad = p;
  bad.tokens[3] = 37;
  Status st = m.forward(bad.inputs(), ex).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tokens[3]"), std::string::npos) << st.message();
  bad = p;
  bad.targets[5] = -2;
  EXPECT_NE(m.forward(bad.inputs(), ex).status().message().find("targets[5]"), std::string::npos);
  bad = p;
  bad.positions[0] = -1;
  EXPECT_FALSE(m.forward(bad.inputs(), ex).ok());
  bad = p;
  bad.positions.pop_back();
  EXPECT_FALSE(m.forward(bad.inputs(), ex).ok());

  // An executor set up for a different token count.
  Packed shorter;
  append_doc(shorter, 0, {1, 2, 3});
  auto ex3 = executor_for<float>(m.spec(), shorter);
  EXPECT_FALSE(m.forward(p.inputs(), ex3).ok());
  // An executor with other heads.
  auto ex_heads = LocalAttentionExecutor<float>::create(2, 2, 8, p.pieces);
  ASSERT_TRUE(ex_heads.ok());
  EXPECT_FALSE(m.forward(p.inputs(), *ex_heads).ok());
  // More tokens than the workspace holds.
  Packed longer = p;
  append_doc(longer, 3, {1, 2});
  auto ex42 = executor_for<float>(m.spec(), longer);
  EXPECT_FALSE(m.forward(longer.inputs(), ex42).ok());
  // A rank with no tokens still runs (collective executors need every rank).
  Packed none;
  auto ex0 = executor_for<float>(m.spec(), none);
  auto r0 = m.forward_backward(none.inputs(), ex0, 1.0);
  ASSERT_TRUE(r0.ok());
  EXPECT_EQ(r0->count, 0);

  ModelSpec odd = tiny_spec();
  odd.head_dim = 7;
  EXPECT_FALSE(Llama<float>::create(odd, 8, 1).ok());
  EXPECT_FALSE(Llama<float>::create(tiny_spec(), 0, 1).ok());
  LlamaOptions opt;
  opt.rope_theta = 0;
  EXPECT_FALSE(Llama<float>::create(tiny_spec(), 8, 1, opt).ok());
}

TEST(LlamaLayout, ParameterCountsAndMemory) {
  // Llama-3-8B with untied embeddings has 8,030,261,248 parameters.
  auto l8 = model_preset("llama-8b");
  ASSERT_TRUE(l8.ok());
  EXPECT_EQ(param_count(*l8), 8030261248LL);

  const ModelSpec s = tiny_spec();
  const auto layout = param_layout(s);
  ASSERT_EQ(layout.size(), 1u + 9u * 2 + 2);
  int64_t next = 0;
  for (const TensorInfo& t : layout) {
    EXPECT_EQ(t.offset, next) << t.name;  // contiguous, in order
    next += t.size();
    EXPECT_EQ(t.decay, !t.name.ends_with("norm")) << t.name;
  }
  EXPECT_EQ(next, param_count(s));
  EXPECT_EQ(layout[2].name, "layers.0.wq");
  EXPECT_EQ(layout[2].rows, 32);
  EXPECT_EQ(layout[3].rows, 16);  // wk: (kv_dim, hidden)

  // Hand count for the test spec (h 32, q 32, kv 16, ffn 48, vocab 37, head_dim 8, 2 layers):
  // per layer 4*32 + 2 + 2*32 + 2*16 + 3*48 = 370, final 2*32 + 1 + 37 + 8 = 110, loss 1;
  // scratch 2*32 + 2*32 + 4*16 (dk, dv in two sets by layer parity) + 3*48 = 336.
  const ModelMemory mem = model_memory(s);
  EXPECT_EQ(mem.param_bytes, 4 * param_count(s));
  EXPECT_EQ(mem.saved_activation_bytes_per_token, 4 * (2 * 370 + 110 + 1));
  EXPECT_EQ(mem.scratch_bytes_per_token, 4 * 336);

  Llama<float> m = make_model<float>(31, 0.02);
  EXPECT_EQ(m.tensor("layers.1.w2").offset, layout[18].offset);
  // Norm gains start at 1.
  for (int64_t e = 0; e < 32; ++e) EXPECT_EQ(m.params()[m.tensor("final_norm").offset + e], 1.0f);
}

}  // namespace
}  // namespace distca::model
