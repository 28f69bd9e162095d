// The whole model with tensor parallelism (Llama created with a TP communicator) against the
// unsharded model: one step's loss and gradients in fp64, and 20 AdamW steps in fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iostream>
#include <memory>
#include <mutex>
#include <vector>

#include "distca/comm/group.h"
#include "distca/comm/local.h"
#include "distca/model/llama.h"
#include "distca/model/local_attention.h"
#include "distca/model/optimizer.h"
#include "distca/model/tensor_parallel.h"
#include "model_test_util.h"

namespace distca::model {
namespace {

using testing::CountingCommunicator;

int64_t target_count(const testing::Packed& p) {
  return std::count_if(p.targets.begin(), p.targets.end(), [](int32_t t) { return t >= 0; });
}

// What a run gives: the loss of every step and the final parameters and gradients, in the
// full layout.
template <class T>
struct Outcome {
  std::vector<double> losses;
  std::vector<T> params, grads;
};

// `steps` steps of forward_backward (+ AdamW when train) on the batch three_docs(1).
// tp = 0: the unsharded model. Otherwise `world` ranks as TP groups of tp consecutive ranks
// (TP innermost), every group on the same batches; the result is group `group`'s.
template <class T>
Outcome<T> run(int64_t steps, bool train, int tp, int world = 0, int group = 0) {
  const ModelSpec spec = testing::tiny_spec();
  const int64_t n_full = param_count(spec);
  Outcome<T> out;
  out.params.assign(static_cast<size_t>(n_full), T(0));
  out.grads = out.params;
  std::mutex mu;
  auto rank_fn = [&](comm::Communicator* tpc, bool report) -> Status {
    const int64_t size = tpc == nullptr ? 1 : tpc->size(), rank = tpc == nullptr ? 0 : tpc->rank();
    DISTCA_ASSIGN_OR_RETURN(auto m, Llama<T>::create(spec, 64, 3, {}, std::nullopt, 1, tpc));
    DISTCA_ASSIGN_OR_RETURN(auto opt, AdamW::create(static_cast<int64_t>(m.params().size()),
                                                    decay_groups(m.layout())));
    std::vector<double> losses;
    for (int64_t step = 0; step < steps; ++step) {
      const testing::Packed p = testing::three_docs(1, spec.vocab);  // learnable: the same batch
      DISTCA_ASSIGN_OR_RETURN(auto ex, LocalAttentionExecutor<T>::create(
                                           spec.n_heads / size, spec.n_kv_heads / size,
                                           spec.head_dim, p.pieces));
      m.zero_grads();
      const int64_t count = target_count(p);
      DISTCA_ASSIGN_OR_RETURN(StepLoss loss, m.forward_backward(p.inputs(), ex, 1.0 / count));
      DISTCA_RETURN_IF_ERROR(m.sync_replicated_grads());
      std::vector<double> sums{loss.loss_sum, static_cast<double>(loss.count)};
      if (tpc != nullptr) DISTCA_RETURN_IF_ERROR(tpc->all_reduce_sum(std::span<double>(sums)));
      if (sums[1] != static_cast<double>(count)) return Status::internal("target count differs");
      losses.push_back(sums[0] / sums[1]);
      if constexpr (std::is_same_v<T, float>) {
        if (train) DISTCA_RETURN_IF_ERROR(opt.step(m.params(), m.grads(), 3e-3));
      }
    }
    if (!report) return Status::ok_status();
    std::lock_guard<std::mutex> lock(mu);
    const TpDims d = tp_dims(spec, size, rank);
    tp_unshard_params<T>(spec, d, m.params().data(), out.params.data());
    tp_unshard_params<T>(spec, d, m.grads().data(), out.grads.data());
    out.losses = losses;
    return Status::ok_status();
  };
  if (tp == 0) {
    const Status st = rank_fn(nullptr, true);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  }
  const Status st = comm::run_local(world, [&](comm::Communicator& c) -> Status {
    const int g = c.rank() / tp;
    std::vector<int> members;
    for (int i = 0; i < tp; ++i) members.push_back(g * tp + i);
    DISTCA_ASSIGN_OR_RETURN(auto tpc, comm::GroupCommunicator::create(c, members, 11));
    return rank_fn(tpc.get(), g == group);
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

// max |a - b| / max |b| over the whole vector.
template <class T>
double rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

TEST(TensorParallelModel, InitialisationIsTheUnshardedModel) {
  const Outcome<float> ref = run<float>(0, false, 0);
  const Outcome<float> tp = run<float>(0, false, 2, 2);
  EXPECT_EQ(tp.params, ref.params);
}

// One step in fp64: the loss and every gradient (replicated ones after sync_replicated_grads)
// match the unsharded model to rounding, on both TP groups of TP 2 x DP 2.
TEST(TensorParallelModel, StepMatchesUnshardedInDouble) {
  const Outcome<double> ref = run<double>(1, false, 0);
  for (int group : {0, 1}) {
    const Outcome<double> tp = run<double>(1, false, 2, 4, group);
    ASSERT_EQ(tp.losses.size(), 1u);
    EXPECT_NEAR(tp.losses[0], ref.losses[0], 1e-13 * ref.losses[0]);
    EXPECT_LE(rel_diff(tp.grads, ref.grads), 1e-12);
  }
}

// 20 AdamW steps in fp32: TP 2 stays within float rounding of TP 1 (docs/model.md gives the
// measured figures).
TEST(TensorParallelModel, TwentyStepsStayAtRoundingInFloat) {
  const Outcome<float> ref = run<float>(20, true, 0);
  const Outcome<float> tp = run<float>(20, true, 2, 2);
  ASSERT_EQ(tp.losses.size(), 20u);
  double worst = 0;
  for (size_t s = 0; s < 20; ++s) {
    worst = std::max(worst, std::abs(tp.losses[s] - ref.losses[s]) / ref.losses[s]);
  }
  const double params = rel_diff(tp.params, ref.params);
  std::cout << "TP 2 vs TP 1 over 20 steps: largest relative loss difference " << worst
            << ", parameters " << params << "\n";
  EXPECT_LT(worst, 1e-6);
  EXPECT_LT(params, 1e-5);
  EXPECT_LT(ref.losses.back(), ref.losses.front());  // it trains
}

// The sequence cut (tp_sp_pieces): for every step length, cut and T, the ranks' pieces tile
// the step once, each side of the cut is split over the ranks in rank order with shares that
// differ by at most one row (the ranges a step runs as: no rank's sequence-parallel work
// waits on another's), a rank holds at most ceil(n / T) rows (the model's buffers), and
// without a cut the split is tp_rows. tp_range_rows gives the same shares of each side.
TEST(TensorParallelModel, SequenceCutGivesEveryRankAnEvenShareOfEachSide) {
  for (int tp : {1, 2, 3, 4}) {
    for (int64_t n : {0, 1, 5, 12, 40, 47}) {
      for (int64_t cut = 0; cut <= n; ++cut) {
        const bool has_cut = cut > 0 && cut < n;
        std::vector<int> owner(static_cast<size_t>(n), -1);
        for (const RowRange side : {RowRange{0, has_cut ? cut : n}, RowRange{has_cut ? cut : n, n}}) {
          if (side.size() == 0) continue;
          int64_t lo = side.size(), hi = 0, next = side.begin;
          for (int r = 0; r < tp; ++r) {
            TpStep<float> s;
            s.n = side.size();
            s.total = n;
            s.first = side.begin;
            s.cut = cut;
            const RowRange own = tp_range_rows(s, tp, r);
            const std::array<RowRange, 2> pieces = tp_sp_pieces(n, cut, tp, r);
            const RowRange piece = side.begin == 0 && has_cut ? pieces[0] : pieces[has_cut ? 1 : 0];
            ASSERT_EQ(own.size(), piece.size()) << tp << " " << n << " " << cut << " " << r;
            if (own.size() > 0) {
              EXPECT_EQ(own.begin + side.begin, piece.begin) << tp << " " << n << " " << cut << " " << r;
              EXPECT_EQ(piece.begin, next) << "rank order";
              next = piece.end;
            }
            lo = std::min(lo, own.size());
            hi = std::max(hi, own.size());
            for (int64_t t = piece.begin; t < piece.end; ++t) {
              EXPECT_EQ(owner[static_cast<size_t>(t)], -1) << "row " << t << " owned twice";
              owner[static_cast<size_t>(t)] = r;
            }
          }
          EXPECT_LE(hi - lo, 1) << tp << " " << n << " " << cut;
        }
        for (int r = 0; r < tp; ++r) {
          const std::array<RowRange, 2> pieces = tp_sp_pieces(n, cut, tp, r);
          EXPECT_LE(pieces[0].size() + pieces[1].size(), (n + tp - 1) / tp);
          if (!has_cut) {
            EXPECT_EQ(pieces[0].begin, tp_rows(n, tp, r).begin);
            EXPECT_EQ(pieces[0].end, tp_rows(n, tp, r).end);
          }
        }
        EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << "a row without an owner";
      }
    }
  }
}

// A phased step as two ranges [0, cut) and [cut, n) with begin_step's sequence cut, on TP 2 in
// fp64: the loss and every gradient match the unsharded model (forward_backward) to rounding,
// and each rank holds its pieces' rows (boundary_row_count).
TEST(TensorParallelModel, PhasedStepWithASequenceCutMatchesUnsharded) {
  const ModelSpec spec = testing::tiny_spec();
  const Outcome<double> ref = run<double>(1, false, 0);
  const testing::Packed p = testing::three_docs(1, spec.vocab);
  const int64_t n = static_cast<int64_t>(p.tokens.size()), cut = 23;  // 40 rows: 11 + 9 and 12 + 8
  std::vector<double> grads(static_cast<size_t>(param_count(spec)), 0.0);
  double loss = 0;
  std::mutex mu;
  const Status st = comm::run_local(2, [&](comm::Communicator& c) -> Status {
    DISTCA_ASSIGN_OR_RETURN(auto tpc, comm::GroupCommunicator::create(c, {0, 1}, 11));
    DISTCA_ASSIGN_OR_RETURN(auto m, Llama<double>::create(spec, 64, 3, {}, std::nullopt, 1, tpc.get()));
    DISTCA_ASSIGN_OR_RETURN(auto ex, LocalAttentionExecutor<double>::create(spec.n_heads / 2, spec.n_kv_heads / 2,
                                                                            spec.head_dim, p.pieces));
    m.zero_grads();
    DISTCA_RETURN_IF_ERROR(m.begin_step(p.inputs(), {}, 0, cut));
    const std::array<RowRange, 2> pieces = tp_sp_pieces(n, cut, 2, c.rank());
    EXPECT_EQ(m.boundary_row_count(), pieces[0].size() + pieces[1].size());
    const RowRange a{0, cut}, b{cut, n};
    const int L = static_cast<int>(spec.n_layers);
    // Lock step: each phase on a then b in forward, b then a in backward.
    for (int l = 0; l < L; ++l) {
      for (const RowRange r : {a, b}) m.forward_pre(l, r);
      const LayerAttentionIo<double> io = m.attention_io(l);
      DISTCA_RETURN_IF_ERROR(ex.forward(l, io.q, io.k, io.v, io.o));
      for (const RowRange r : {a, b}) m.forward_post(l, r);
    }
    const int64_t count = target_count(p);
    for (const RowRange r : {a, b}) m.forward_head(r);
    for (const RowRange r : {b, a}) m.backward_head(r, 1.0 / count);
    for (int l = L - 1; l >= 0; --l) {
      for (const RowRange r : {b, a}) m.backward_post(l, r);
      const LayerAttentionIo<double> io = m.attention_io(l);
      DISTCA_RETURN_IF_ERROR(ex.backward(l, io.d_o, io.dq, io.dk, io.dv));
      for (const RowRange r : {b, a}) m.backward_pre(l, r);
    }
    DISTCA_RETURN_IF_ERROR(m.tp_status());
    DISTCA_RETURN_IF_ERROR(m.sync_replicated_grads());
    std::vector<double> sums{m.step_loss().loss_sum, static_cast<double>(m.step_loss().count)};
    DISTCA_RETURN_IF_ERROR(tpc->all_reduce_sum(std::span<double>(sums)));
    if (sums[1] != static_cast<double>(count)) return Status::internal("target count differs");
    std::lock_guard<std::mutex> lock(mu);
    tp_unshard_params<double>(spec, tp_dims(spec, 2, c.rank()), m.grads().data(), grads.data());
    loss = sums[0] / sums[1];
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(ref.losses.size(), 1u);
  EXPECT_NEAR(loss, ref.losses[0], 1e-13 * ref.losses[0]);
  EXPECT_LE(rel_diff(grads, ref.grads), 1e-12);
}

// The TP collectives of one step, counted at the communicator, against their enumeration from
// the layer structure (docs/model.md, "Tensor parallelism"), the count the simulator charges
// (tests/sim/test_sim_tp.cpp, SimTensorParallel.MeasuredCollectiveFit...): per layer and
// direction two all-gathers and two reduce-scatters; the embedding's reduce-scatter (forward)
// and all-gather (backward); the final norm's all-gather and its reduce-scatter; the
// vocabulary-parallel cross-entropy's two all-gathers; then sync_replicated_grads' one
// all-reduce (a reduce-scatter and an all-gather). Overlapped (one message each way per
// collective at TP 2): the layers' eight per layer, the final norm's two and the embedding's
// all-gather; the rest blocking. Bytes: each collective moves n h floats over the two ranks.
TEST(TensorParallelModel, CollectivesPerStepFollowTheLayerStructure) {
  const ModelSpec spec = testing::tiny_spec();
  std::vector<int64_t> step_calls(2), sync_calls(2), sends(2), recvs(2), bytes(2);
  const auto n = static_cast<int64_t>(testing::three_docs(1, spec.vocab).tokens.size());
  const Status st = comm::run_local(2, [&](comm::Communicator& c) -> Status {
    DISTCA_ASSIGN_OR_RETURN(auto group, comm::GroupCommunicator::create(c, {0, 1}, 11));
    CountingCommunicator tpc(*group);
    DISTCA_ASSIGN_OR_RETURN(auto m, Llama<float>::create(spec, 64, 3, {}, std::nullopt, 1, &tpc));
    const testing::Packed p = testing::three_docs(1, spec.vocab);
    DISTCA_ASSIGN_OR_RETURN(auto ex, LocalAttentionExecutor<float>::create(spec.n_heads / 2, spec.n_kv_heads / 2,
                                                                           spec.head_dim, p.pieces));
    m.zero_grads();
    DISTCA_RETURN_IF_ERROR(m.forward_backward(p.inputs(), ex, 1.0).status());
    step_calls[static_cast<size_t>(c.rank())] = tpc.calls;
    sends[static_cast<size_t>(c.rank())] = tpc.sends;
    recvs[static_cast<size_t>(c.rank())] = tpc.recvs;
    bytes[static_cast<size_t>(c.rank())] = tpc.send_bytes;
    DISTCA_RETURN_IF_ERROR(m.sync_replicated_grads());
    sync_calls[static_cast<size_t>(c.rank())] = tpc.calls - step_calls[static_cast<size_t>(c.rank())];
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  const int64_t rows_collectives = 2 * (4 * spec.n_layers + 2), overlapped = 8 * spec.n_layers + 3;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(step_calls[static_cast<size_t>(r)] + sends[static_cast<size_t>(r)], rows_collectives + 2) << r;
    EXPECT_EQ(sends[static_cast<size_t>(r)], overlapped) << r;
    EXPECT_EQ(recvs[static_cast<size_t>(r)], overlapped) << r;
    EXPECT_EQ(sync_calls[static_cast<size_t>(r)], 2) << r;
  }
  EXPECT_EQ(bytes[0] + bytes[1], overlapped * n * spec.hidden * static_cast<int64_t>(sizeof(float)));
}

}  // namespace
}  // namespace distca::model
