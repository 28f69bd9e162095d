// Pipeline stages (llama.h, "Pipeline stages"): the layer split, a stage's slice of the
// parameters, and a chain of stage models (boundary rows passed by memcpy) against the whole
// model: bitwise, for one and two row ranges, and for micro-batches in 1F1B order over slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "distca/core/rng.h"
#include "distca/model/llama.h"
#include "distca/model/local_attention.h"
#include "model_test_util.h"

namespace distca::model {
namespace {

using testing::append_doc;
using testing::Packed;
using testing::random_ids;
using testing::tiny_spec;

ModelSpec four_layers() {
  ModelSpec s = tiny_spec();
  s.n_layers = 4;
  return s;
}

TEST(StageLayers, ContiguousCoveringEvenFirstStagesLarger) {
  for (int64_t n = 1; n <= 12; ++n) {
    for (int64_t p = 1; p <= n; ++p) {
      std::vector<int> owner(static_cast<size_t>(n), -1);
      int64_t expected_first = 0;
      for (int64_t s = 0; s < p; ++s) {
        const StageRange r = stage_layers(n, p, s);
        ASSERT_EQ(r.first, expected_first) << n << " " << p << " " << s;  // contiguous
        ASSERT_GT(r.size(), 0);
        // Sizes: the floor or the ceiling of n / p, ceilings first.
        const int64_t lo = n / p, hi = (n + p - 1) / p;
        EXPECT_TRUE(r.size() == lo || r.size() == hi) << n << " " << p << " " << s;
        if (s > 0) {
          EXPECT_LE(r.size(), stage_layers(n, p, s - 1).size());
        }
        EXPECT_EQ(r.has_embedding(), s == 0);
        EXPECT_EQ(r.has_head(n), s == p - 1);
        for (int64_t l = r.first; l < r.last; ++l) {
          EXPECT_EQ(owner[static_cast<size_t>(l)], -1) << "layer " << l << " twice";
          owner[static_cast<size_t>(l)] = static_cast<int>(s);
        }
        expected_first = r.last;
      }
      EXPECT_EQ(expected_first, n);
      for (int o : owner) EXPECT_GE(o, 0);
    }
  }
  // The documented example.
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
  for (int64_t s = 0; s < 4; ++s) {
    const StageRange r = stage_layers(10, 4, s);
    EXPECT_EQ(r.first, want[static_cast<size_t>(s)].first);
    EXPECT_EQ(r.last, want[static_cast<size_t>(s)].second);
  }
}

// At creation, a stage's parameters are the whole model's range, the stages tile the buffer,
// and the stage's layout is the full layout's slice shifted by param_offset().
TEST(Stages, ParamsAreTheWholeModelsRangeAndTileTheBuffer) {
  for (int64_t n_layers : {4, 5}) {
    ModelSpec spec = tiny_spec();
    spec.n_layers = n_layers;
    const auto whole = Llama<float>::create(spec, 8, 77).value();
    const std::vector<TensorInfo> full = param_layout(spec);
    for (int64_t p = 1; p <= n_layers; ++p) {
      int64_t next_offset = 0, next_tensor = 0, param_bytes = 0;
      for (int64_t s = 0; s < p; ++s) {
        const StageRange r = stage_layers(n_layers, p, s);
        const auto st = Llama<float>::create(spec, 8, 77, {}, r, 2).value();
        EXPECT_EQ(st.param_offset(), next_offset) << p << " " << s;
        const auto off = static_cast<size_t>(st.param_offset());
        ASSERT_LE(off + st.params().size(), whole.params().size());
        EXPECT_EQ(std::memcmp(st.params().data(), whole.params().data() + off,
                              st.params().size() * sizeof(float)),
                  0)
            << p << " " << s;
        for (const TensorInfo& t : st.layout()) {
          const TensorInfo& f = full[static_cast<size_t>(next_tensor++)];
          EXPECT_EQ(t.name, f.name);
          EXPECT_EQ(t.offset + st.param_offset(), f.offset) << t.name;
          EXPECT_EQ(t.size(), f.size());
          EXPECT_EQ(st.tensor(t.name).offset, t.offset);
        }
        EXPECT_EQ(st.grads().size(), st.params().size());
        EXPECT_EQ(st.has_embedding(), s == 0);
        EXPECT_EQ(st.has_head(), s == p - 1);
        next_offset += static_cast<int64_t>(st.params().size());
        const ModelMemory mem = stage_memory(spec, r, 2);
        EXPECT_EQ(mem.param_bytes, 4 * static_cast<int64_t>(st.params().size()));
        EXPECT_EQ(mem.slots, 2);
        EXPECT_EQ(mem.activation_bytes_per_token(),
                  2 * mem.saved_activation_bytes_per_token + mem.scratch_bytes_per_token);
        param_bytes += mem.param_bytes;
      }
      EXPECT_EQ(next_offset, param_count(spec));
      EXPECT_EQ(next_tensor, static_cast<int64_t>(full.size()));
      // Per slot, the stages together keep the whole model's activations plus, on each stage
      // without the head, its output rows and its own RoPE tables.
      const ModelMemory whole_mem = model_memory(spec);
      EXPECT_EQ(param_bytes, whole_mem.param_bytes);
      int64_t saved = 0;
      for (int64_t s = 0; s < p; ++s) {
        saved += stage_memory(spec, stage_layers(n_layers, p, s), 1)
                     .saved_activation_bytes_per_token;
      }
      EXPECT_EQ(saved, whole_mem.saved_activation_bytes_per_token +
                           4 * (p - 1) * (spec.hidden + spec.head_dim));
    }
  }
}

// One micro-batch. Rows [0, a) hold a prefix of every document: doc 2 whole, then doc 0 cut
// after `cut` tokens; rows [a, n) the rest of doc 0, then doc 1 whole (test_phased.cpp's split).
struct Micro {
  Packed packed;
  std::vector<float> report_weights;  // (n)
  int64_t a = 0;
  int64_t n() const { return static_cast<int64_t>(packed.tokens.size()); }
  StepInputs inputs() const {
    return {packed.tokens, packed.positions, packed.targets, report_weights};
  }
};

Micro make_micro(uint64_t seed, int64_t len2, int64_t len0, int64_t cut, int64_t len1) {
  const int64_t vocab = tiny_spec().vocab;
  Rng rng(seed, 5);
  Micro mb;
  append_doc(mb.packed, 2, random_ids(rng, len2, vocab));
  append_doc(mb.packed, 0, random_ids(rng, len0, vocab));
  append_doc(mb.packed, 1, random_ids(rng, len1, vocab));
  mb.packed.pieces = {
      {2, 0, len2, len2}, {0, 0, cut, len0}, {0, cut, len0 - cut, len0}, {1, 0, len1, len1}};
  mb.a = len2 + cut;
  for (int64_t t = 0; t < mb.n(); ++t) {
    mb.report_weights.push_back(static_cast<float>((t + seed) % 3) * 0.5f);
  }
  return mb;
}

LocalAttentionExecutor<float> executor_for(const Micro& mb) {
  const ModelSpec s = tiny_spec();
  auto ex = LocalAttentionExecutor<float>::create(s.n_heads, s.n_kv_heads, s.head_dim,
                                                  mb.packed.pieces, LocalAttentionBackend::kKernel);
  DISTCA_CHECK_MSG(ex.ok(), ex.status().to_string());
  return std::move(ex).value();
}

std::vector<RowRange> ranges_of(const Micro& mb, int count) {
  if (count == 1) return {{0, mb.n()}};
  return {{0, mb.a}, {mb.a, mb.n()}};
}

// The whole model (init std 0.2 and perturbed gains: far from linear) and its stages with the
// same parameters.
Llama<float> whole_model(const ModelSpec& spec) {
  LlamaOptions opt;
  opt.init_std = 0.2;
  Llama<float> m = Llama<float>::create(spec, 64, 41, opt).value();
  testing::perturb_gains(m, 41);
  return m;
}

// Slots: P - s on stage s when `in_flight_slots` (what 1F1B keeps alive), else 1.
std::vector<Llama<float>> stages_of(const Llama<float>& whole, int64_t p, bool in_flight_slots) {
  std::vector<Llama<float>> out;
  for (int64_t s = 0; s < p; ++s) {
    const StageRange r = stage_layers(whole.spec().n_layers, p, s);
    auto st = Llama<float>::create(whole.spec(), whole.max_tokens(), 41, whole.options(), r,
                                   in_flight_slots ? p - s : 1);
    DISTCA_CHECK_MSG(st.ok(), st.status().to_string());
    out.push_back(std::move(st).value());
    Llama<float>& m = out.back();
    std::copy_n(whole.params().begin() + m.param_offset(), m.params().size(), m.params().begin());
  }
  return out;
}

void copy_rows(float* dst, const float* src, const std::vector<RowRange>& ranges, int64_t h) {
  for (const RowRange r : ranges) {
    std::memcpy(dst + r.begin * h, src + r.begin * h, static_cast<size_t>(r.size() * h) * 4);
  }
}

// One stage's forward of a micro-batch in `slot`, ranges in lock step (each phase on the ranges
// in order, the attention of a layer on all rows). input: the previous stage's output rows
// (n, h); output receives this stage's.
void stage_forward(Llama<float>& st, const Micro& mb, int slot, LocalAttentionExecutor<float>& ex,
                   const std::vector<RowRange>& ranges, const std::vector<float>& input,
                   std::vector<float>& output, std::span<float> per_token_loss) {
  const int64_t h = st.spec().hidden;
  ASSERT_TRUE(st.begin_step(mb.inputs(), per_token_loss, slot).ok());
  if (!st.has_embedding()) copy_rows(st.stage_input(), input.data(), ranges, h);
  for (int l = static_cast<int>(st.stage().first); l < st.stage().last; ++l) {
    for (const RowRange r : ranges) st.forward_pre(l, r);
    const LayerAttentionIo<float> io = st.attention_io(l);
    ASSERT_TRUE(ex.forward(l, io.q, io.k, io.v, io.o).ok());
    for (const RowRange r : ranges) st.forward_post(l, r);
  }
  if (st.has_head()) {
    for (const RowRange r : ranges) st.forward_head(r);
  } else {
    output.assign(static_cast<size_t>(mb.n() * h), -1.0f);
    copy_rows(output.data(), st.stage_output(), ranges, h);
  }
}

// The mirror: ranges in reverse order. out_grad: d(output) rows from the next stage; in_grad
// receives d(input) rows.
void stage_backward(Llama<float>& st, const Micro& mb, int slot, LocalAttentionExecutor<float>& ex,
                    const std::vector<RowRange>& ranges, double grad_scale,
                    const std::vector<float>& out_grad, std::vector<float>& in_grad) {
  const int64_t h = st.spec().hidden;
  const std::vector<RowRange> rev(ranges.rbegin(), ranges.rend());
  st.select_slot(slot);
  if (st.has_head()) {
    for (const RowRange r : rev) st.backward_head(r, grad_scale);
  } else {
    copy_rows(st.stage_output_grad(), out_grad.data(), rev, h);
  }
  for (int l = static_cast<int>(st.stage().last) - 1; l >= st.stage().first; --l) {
    for (const RowRange r : rev) st.backward_post(l, r);
    const LayerAttentionIo<float> io = st.attention_io(l);
    ASSERT_TRUE(ex.backward(l, io.d_o, io.dq, io.dk, io.dv).ok());
    for (const RowRange r : rev) st.backward_pre(l, r);
  }
  if (!st.has_embedding()) {
    in_grad.assign(static_cast<size_t>(mb.n() * h), -1.0f);
    copy_rows(in_grad.data(), st.stage_input_grad(), rev, h);
  }
}

struct Op {
  bool forward;
  int m;
};

// Stage s's 1F1B order over P stages and M micro-batches: min(P - s - 1, M) warm-up forwards,
// then forward-backward pairs, then the remaining backwards.
std::vector<Op> one_f_one_b(int p, int m_count, int s) {
  std::vector<Op> ops;
  const int warm = std::min(p - s - 1, m_count);
  int f = 0, b = 0;
  while (f < warm) ops.push_back({true, f++});
  while (f < m_count) {
    ops.push_back({true, f++});
    ops.push_back({false, b++});
  }
  while (b < m_count) ops.push_back({false, b++});
  return ops;
}

std::vector<Op> one_after_another(int m_count) {
  std::vector<Op> ops;
  for (int m = 0; m < m_count; ++m) {
    ops.push_back({true, m});
    ops.push_back({false, m});
  }
  return ops;
}

struct PipelineResult {
  std::vector<StepLoss> loss;                 // [m], from the last stage
  std::vector<std::vector<float>> per_token;  // [m]
};

// Runs every stage's order, each op as soon as its inputs exist (forward of m after the
// previous stage's; backward of m after this stage's forward and the next stage's backward),
// the boundary rows in per-micro-batch mailboxes. Slot of m on stage s: m % slots.
PipelineResult run_pipeline(std::vector<Llama<float>>& stages, const std::vector<Micro>& micros,
                            const std::vector<std::vector<Op>>& orders, int range_count,
                            double grad_scale) {
  const int p = static_cast<int>(stages.size()), m_count = static_cast<int>(micros.size());
  std::vector<std::vector<LocalAttentionExecutor<float>>> ex(static_cast<size_t>(p));
  for (auto& row : ex) {
    for (const Micro& mb : micros) row.push_back(executor_for(mb));
  }
  auto at = [](auto& v, int i, int j) -> auto& {
    return v[static_cast<size_t>(i)][static_cast<size_t>(j)];
  };
  using Grid = std::vector<std::vector<std::vector<float>>>;
  Grid act(static_cast<size_t>(p), std::vector<std::vector<float>>(static_cast<size_t>(m_count)));
  Grid grad = act;
  std::vector<std::vector<char>> done_f(static_cast<size_t>(p),
                                        std::vector<char>(static_cast<size_t>(m_count), 0));
  auto done_b = done_f;
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<int> in_flight(static_cast<size_t>(p), 0);
  PipelineResult res;
  res.loss.resize(static_cast<size_t>(m_count));
  res.per_token.resize(static_cast<size_t>(m_count));
  const std::vector<float> none;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto& order = orders[static_cast<size_t>(s)];
      if (next[static_cast<size_t>(s)] == order.size()) continue;
      const Op op = order[next[static_cast<size_t>(s)]];
      Llama<float>& st = stages[static_cast<size_t>(s)];
      const Micro& mb = micros[static_cast<size_t>(op.m)];
      const int slot = op.m % static_cast<int>(st.slots());
      const auto ranges = ranges_of(mb, range_count);
      if (op.forward) {
        if (s > 0 && !at(done_f, s - 1, op.m)) continue;
        std::span<float> ptl;
        if (st.has_head()) {
          res.per_token[static_cast<size_t>(op.m)].assign(static_cast<size_t>(mb.n()), -1.0f);
          ptl = res.per_token[static_cast<size_t>(op.m)];
        }
        stage_forward(st, mb, slot, at(ex, s, op.m), ranges, s > 0 ? at(act, s - 1, op.m) : none,
                      at(act, s, op.m), ptl);
        if (st.has_head()) res.loss[static_cast<size_t>(op.m)] = st.step_loss();
        at(done_f, s, op.m) = 1;
        EXPECT_LE(++in_flight[static_cast<size_t>(s)], st.slots()) << "stage " << s;
      } else {
        if (!at(done_f, s, op.m) || (s + 1 < p && !at(done_b, s + 1, op.m))) continue;
        stage_backward(st, mb, slot, at(ex, s, op.m), ranges, grad_scale,
                       s + 1 < p ? at(grad, s + 1, op.m) : none, at(grad, s, op.m));
        at(done_b, s, op.m) = 1;
        --in_flight[static_cast<size_t>(s)];
      }
      ++next[static_cast<size_t>(s)];
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(next[static_cast<size_t>(s)], orders[static_cast<size_t>(s)].size())
        << "stage " << s << " deadlocked";
  }
  return res;
}

bool same_bits(const StepLoss& x, const StepLoss& y) {
  return std::memcmp(&x.loss_sum, &y.loss_sum, sizeof(double)) == 0 && x.count == y.count &&
         std::memcmp(&x.report_sum, &y.report_sum, sizeof(double)) == 0 &&
         std::memcmp(&x.report_weight, &y.report_weight, sizeof(double)) == 0;
}

bool same_bits(std::span<const float> x, std::span<const float> y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Every stage's gradients are the whole model's range, bitwise.
void expect_stage_grads(const std::vector<Llama<float>>& stages, const Llama<float>& whole,
                        const std::string& what) {
  for (const Llama<float>& st : stages) {
    const auto ref = whole.grads().subspan(static_cast<size_t>(st.param_offset()),
                                           st.grads().size());
    if (same_bits(st.grads(), ref)) continue;
    for (const TensorInfo& t : st.layout()) {
      const auto off = static_cast<size_t>(t.offset), size = static_cast<size_t>(t.size());
      EXPECT_TRUE(same_bits(st.grads().subspan(off, size), ref.subspan(off, size)))
          << what << ": " << t.name;
    }
  }
}

// The whole model's reference: forward_backward for one range; the same lock-step phases on
// the whole model (one stage) for two. Gradients accumulate over the micro-batches in order.
PipelineResult whole_reference(Llama<float>& whole, const std::vector<Micro>& micros,
                               int range_count, double grad_scale) {
  whole.zero_grads();
  if (range_count == 1) {
    PipelineResult res;
    for (const Micro& mb : micros) {
      auto ex = executor_for(mb);
      res.per_token.emplace_back(static_cast<size_t>(mb.n()), -1.0f);
      auto r = whole.forward_backward(mb.inputs(), ex, grad_scale, res.per_token.back());
      DISTCA_CHECK_MSG(r.ok(), r.status().to_string());
      res.loss.push_back(*r);
    }
    return res;
  }
  std::vector<Llama<float>> one;
  one.push_back(std::move(whole));
  const std::vector<std::vector<Op>> order = {one_after_another(static_cast<int>(micros.size()))};
  PipelineResult res = run_pipeline(one, micros, order, range_count, grad_scale);
  whole = std::move(one.front());
  return res;
}

void expect_same_result(const PipelineResult& got, const PipelineResult& ref,
                        const std::string& what) {
  ASSERT_EQ(got.loss.size(), ref.loss.size());
  for (size_t m = 0; m < ref.loss.size(); ++m) {
    EXPECT_GT(ref.loss[m].count, 0);
    EXPECT_TRUE(same_bits(got.loss[m], ref.loss[m]))
        << what << ", micro-batch " << m << ": loss " << got.loss[m].loss_sum << " vs "
        << ref.loss[m].loss_sum;
    EXPECT_TRUE(same_bits(got.per_token[m], ref.per_token[m])) << what << ", micro-batch " << m;
  }
}

// A chain of p stages (one micro-batch, one slot each) against the whole model, bitwise.
TEST(Stages, ChainOfStagesEqualsTheWholeModelBitwise) {
  const ModelSpec spec = four_layers();
  Llama<float> whole = whole_model(spec);
  const std::vector<Micro> micros = {make_micro(3, 9, 24, 10, 14)};
  const double grad_scale = 1.0 / 44;
  for (int ranges = 1; ranges <= 2; ++ranges) {
    const PipelineResult ref = whole_reference(whole, micros, ranges, grad_scale);
    for (int64_t p = 1; p <= spec.n_layers; ++p) {
      std::vector<Llama<float>> stages = stages_of(whole, p, false);
      const PipelineResult got = run_pipeline(stages, micros, std::vector<std::vector<Op>>(
                                                                  static_cast<size_t>(p),
                                                                  one_after_another(1)),
                                              ranges, grad_scale);
      const std::string what = "p " + std::to_string(p) + ", ranges " + std::to_string(ranges);
      expect_same_result(got, ref, what);
      expect_stage_grads(stages, whole, what);
    }
  }
}

// Micro-batches in 1F1B order over P - s slots on stage s give the bits of running them one
// after the other with one slot (and of the whole model's accumulated forward_backward): the
// backwards run in micro-batch order on every stage, so each gradient accumulates in the same
// order, and the forwards of other slots in between touch neither the gradients nor the
// shared backward scratch.
TEST(Stages, OneFOneBOverSlotsEqualsOneAfterAnother) {
  const ModelSpec spec = four_layers();
  Llama<float> whole = whole_model(spec);
  const std::vector<Micro> micros = {make_micro(3, 9, 24, 10, 14), make_micro(4, 5, 30, 7, 3),
                                     make_micro(5, 12, 11, 4, 20), make_micro(6, 2, 16, 9, 8)};
  int64_t targets = 0;
  for (const Micro& mb : micros) targets += mb.n() - 3;
  const double grad_scale = 1.0 / static_cast<double>(targets);
  for (int ranges = 1; ranges <= 2; ++ranges) {
    const PipelineResult ref = whole_reference(whole, micros, ranges, grad_scale);
    for (int p : {2, 3, 4}) {
      for (int m_count : {3, 4}) {
        const std::vector<Micro> ms(micros.begin(), micros.begin() + m_count);
        const std::string what = "p " + std::to_string(p) + ", m " + std::to_string(m_count) +
                                 ", ranges " + std::to_string(ranges);
        std::vector<std::vector<Op>> orders;
        for (int s = 0; s < p; ++s) orders.push_back(one_f_one_b(p, m_count, s));
        if (p == 2) {  // the order the lead's loop runs on the first of two stages
          ASSERT_EQ(orders[0].size(), static_cast<size_t>(2 * m_count));
          EXPECT_TRUE(orders[0][0].forward && orders[0][1].forward && !orders[0][2].forward);
        }
        std::vector<Llama<float>> piped = stages_of(whole, p, true);
        EXPECT_EQ(piped.front().slots(), p);
        EXPECT_EQ(piped.back().slots(), 1);
        const PipelineResult got = run_pipeline(piped, ms, orders, ranges, grad_scale);
        std::vector<Llama<float>> seq = stages_of(whole, p, false);
        const std::vector<std::vector<Op>> seq_orders(static_cast<size_t>(p),
                                                      one_after_another(m_count));
        const PipelineResult one = run_pipeline(seq, ms, seq_orders, ranges, grad_scale);
        expect_same_result(got, one, what + ", 1F1B vs one after another");
        for (size_t s = 0; s < piped.size(); ++s) {
          EXPECT_TRUE(same_bits(piped[s].grads(), seq[s].grads())) << what << ", stage " << s;
        }
        if (m_count == 4) {
          expect_same_result(got, ref, what + ", vs the whole model");
          expect_stage_grads(piped, whole, what + ", vs the whole model");
        }
      }
    }
  }
}

TEST(Stages, RefusesBadStagesSlotsAndWholeModelCalls) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const ModelSpec spec = four_layers();
  for (const StageRange bad : {StageRange{2, 2}, StageRange{-1, 2}, StageRange{3, 5}}) {
    const auto r = Llama<float>::create(spec, 8, 1, {}, bad);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().to_string().find("stage"), std::string::npos) << r.status().to_string();
  }
  const auto no_slots = Llama<float>::create(spec, 8, 1, {}, StageRange{0, 4}, 0);
  ASSERT_FALSE(no_slots.ok());
  EXPECT_NE(no_slots.status().to_string().find("slots"), std::string::npos);

  const Micro mb = make_micro(3, 9, 24, 10, 14);
  Llama<float> mid = Llama<float>::create(spec, 64, 1, {}, StageRange{1, 3}, 2).value();
  Llama<float> first = Llama<float>::create(spec, 64, 1, {}, StageRange{0, 2}).value();
  auto ex = executor_for(mb);
  const auto fb = mid.forward_backward(mb.inputs(), ex, 1.0);
  ASSERT_FALSE(fb.ok());
  EXPECT_NE(fb.status().to_string().find("phased step"), std::string::npos);
  EXPECT_FALSE(mid.begin_step(mb.inputs(), {}, 2).ok());
  std::vector<float> ptl(static_cast<size_t>(mb.n()));
  EXPECT_FALSE(mid.begin_step(mb.inputs(), ptl, 0).ok());  // no loss without the head
  EXPECT_DEATH(mid.select_slot(1), "begin_step");
  ASSERT_TRUE(mid.begin_step(mb.inputs(), {}, 1).ok());
  EXPECT_EQ(mid.slot(), 1);
  EXPECT_DEATH(mid.forward_pre(0, {0, 1}), "layer");
  EXPECT_DEATH(mid.forward_pre(3, {0, 1}), "layer");
  EXPECT_DEATH(mid.attention_io(3), "layer");
  EXPECT_DEATH(mid.forward_head({0, 1}), "head");
  EXPECT_DEATH(mid.backward_head({0, 1}, 1.0), "head");
  ASSERT_TRUE(first.begin_step(mb.inputs()).ok());
  EXPECT_DEATH(first.stage_input(), "embedding");
  EXPECT_DEATH(first.stage_input_grad(), "embedding");
  EXPECT_NE(first.stage_output(), nullptr);
  EXPECT_DEATH(first.forward_head({0, 1}), "head");
}

}  // namespace
}  // namespace distca::model
