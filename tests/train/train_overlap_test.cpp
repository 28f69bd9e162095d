// `distca train`'s overlap modes on the local backend (issue 13): pingpong, single-stream and
// colocated compute the same function (bitwise where their attention tasks are the same, within
// float rounding otherwise), signal changes no parameter, the trace holds every rank's last
// step, and the time split adds up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "distca/model/llama.h"
#include "distca/train/config.h"
#include "distca/train/trainer.h"
#include "train_test_util.h"

namespace distca::train {
namespace {

// Long enough documents that the split cuts some of them (two query tiles of 128 rows for
// this GQA group) and cad moves work between ranks.
TrainConfig overlap_config(int64_t ranks) {
  TrainConfig c = testing::small_model_config(2);
  c.ranks = ranks;
  c.tokens_per_rank = 512;
  c.dist = "uniform:16:1024";
  c.max_doc_len = 0;
  c.steps = 20;
  c.warmup = 5;
  return c;
}

TrainResult train(TrainConfig c, const std::string& mode, const std::string& overlap) {
  c.mode = parse_train_mode(mode).value();
  if (!overlap.empty()) c.overlap = runtime::parse_overlap_mode(overlap).value();
  TrainResult r;
  const Status st = run_training_local(c, {}, &r);
  EXPECT_TRUE(st.ok()) << mode << " " << overlap << ": " << st.message();
  return r;
}

// ||a - b|| / ||b|| over the whole parameter vector. Elementwise ratios are not a measure of
// rounding here: AdamW divides by sqrt(v), so a gradient element that rounding moves around
// zero moves its parameter by up to the learning rate per step whatever the gradient's size.
double relative_norm_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (double{a[i]} - double{b[i]}) * (double{a[i]} - double{b[i]});
    norm += double{b[i]} * double{b[i]};
  }
  return std::sqrt(diff / norm);
}

struct Difference {
  double loss = 0;    // largest relative difference of a step's loss
  double params = 0;  // relative norm difference of the final parameters
  bool bitwise = false;
};

Difference compare(const TrainResult& a, const TrainResult& b) {
  Difference d;
  EXPECT_EQ(a.steps.size(), b.steps.size());
  d.bitwise = a.final_params == b.final_params && a.steps.size() == b.steps.size();
  for (size_t i = 0; i < a.steps.size() && i < b.steps.size(); ++i) {
    d.loss = std::max(d.loss, std::abs(a.steps[i].loss - b.steps[i].loss) / std::abs(b.steps[i].loss));
    d.bitwise = d.bitwise && a.steps[i].loss == b.steps[i].loss;
  }
  d.params = relative_norm_difference(a.final_params, b.final_params);
  return d;
}

// Over 20 steps on 1 to 4 ranks. One rank: every mode runs the same tasks (nothing moves, the
// nano plans' tasks are the full plan's), and a key row's dK/dV is the sum of two partials,
// which commutes: bitwise. More ranks: cad moves pieces of documents, so a key row's gradient
// sums partials from several servers in another association in each mode; the differences
// must stay at float rounding (the bound below; docs/runtime.md, "Numerics" has the figures).
TEST(Overlap, PingPongSingleStreamAndColocatedComputeTheSameFunction) {
  for (int64_t ranks = 1; ranks <= 4; ++ranks) {
    const TrainConfig c = overlap_config(ranks);
    const TrainResult pp = train(c, "cad", "pingpong");
    const TrainResult ss = train(c, "cad", "single-stream");
    const TrainResult colo = train(c, "colocated", "");
    ASSERT_EQ(pp.steps.size(), 20u);
    bool moved = false;
    for (const StepMetrics& m : pp.steps) moved |= m.imbalance_after < m.imbalance_before - 1e-9;
    for (const auto& [name, other] : {std::pair{"single-stream", &ss}, std::pair{"colocated", &colo}}) {
      const Difference d = compare(pp, *other);
      if (ranks == 1) {
        EXPECT_TRUE(d.bitwise) << name << ": loss " << d.loss << " params " << d.params;
      }
      EXPECT_LT(d.loss, 1e-6) << ranks << " ranks, pingpong vs " << name;
      EXPECT_LT(d.params, 1e-5) << ranks << " ranks, pingpong vs " << name;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2e/%.2e", d.loss, d.params);
      std::string key = "r";
      key.append(std::to_string(ranks)).append("_").append(name);
      RecordProperty(key, buf);
      std::printf("%lld ranks, pingpong vs %s: loss %.2e, parameters %.2e (relative norm)%s\n",
                  static_cast<long long>(ranks), name, d.loss, d.params, d.bitwise ? ", bitwise" : "");
    }
    if (ranks > 1) {
      EXPECT_TRUE(moved) << ranks << " ranks: the comparison must exercise re-placement";
    }
  }
}

// The same config twice gives the same bits (the schedule fixes every sum's order, whatever
// the timing of the rank threads).
TEST(Overlap, PingPongIsDeterministic) {
  const TrainConfig c = overlap_config(3);
  const TrainResult a = train(c, "cad", "pingpong");
  const TrainResult b = train(c, "cad", "pingpong");
  EXPECT_TRUE(compare(a, b).bitwise);
}

// Signal is a timing ablation: the steps run (1-byte exchanges), nothing is updated, no
// checkpoint is written, and the result says its outputs are invalid.
TEST(Overlap, SignalLeavesTheParametersAndWritesNoCheckpoint) {
  TrainConfig c = overlap_config(2);
  c.steps = 3;
  c.warmup = 1;
  const auto dir = std::filesystem::temp_directory_path() / "distca_overlap_signal_ckpt";
  std::filesystem::remove_all(dir);
  c.checkpoint_dir = dir.string();
  const TrainResult r = train(c, "cad", "signal");
  EXPECT_FALSE(r.outputs_valid);
  EXPECT_EQ(r.checkpoints_written, 0);
  EXPECT_FALSE(std::filesystem::exists(dir));
  auto spec = c.model_spec();
  ASSERT_TRUE(spec.ok());
  auto initial = model::Llama<float>::create(*spec, c.tokens_per_rank, c.seed);
  ASSERT_TRUE(initial.ok());
  EXPECT_TRUE(std::vector<float>(initial->params().begin(), initial->params().end()) == r.final_params);
  const TrainResult pp = train(c, "cad", "pingpong");
  EXPECT_TRUE(pp.outputs_valid);
  EXPECT_FALSE(pp.final_params == r.final_params);
}

// The trace of the last step: every rank's linear work of both nano-batches in every layer,
// alternating ping and pong, the exchanges of both, all inside the step.
TEST(Overlap, TraceHoldsEveryRanksLastStep) {
  TrainConfig c = overlap_config(3);
  c.steps = 2;
  c.warmup = 1;
  c.trace = (std::filesystem::temp_directory_path() / "distca_overlap_unused.json").string();
  const TrainResult r = train(c, "cad", "pingpong");
  ASSERT_FALSE(r.trace.empty());
  const double step_us = r.steps.back().seconds * 1e6;
  std::map<int64_t, std::vector<const TraceEvent*>> linear;
  std::set<std::pair<int64_t, std::string>> exchanges;
  for (const TraceEvent& e : r.trace) {
    EXPECT_GE(e.start_us, 0) << e.name;
    EXPECT_LE(e.end_us, step_us * 1.5 + 1e5) << e.name;
    if (e.name.find("linear") != std::string::npos) linear[e.tid].push_back(&e);
    if (e.category == "comm") exchanges.insert({e.tid, e.name});
  }
  // L + 1 calls per nano-batch in forward and in backward.
  const size_t per_rank = 2 * 2 * (2 + 1);
  ASSERT_EQ(linear.size(), 3u);
  for (auto& [rank, events] : linear) {
    std::sort(events.begin(), events.end(), [](auto* a, auto* b) { return a->start_us < b->start_us; });
    EXPECT_EQ(events.size(), per_rank) << "rank " << rank;
    // Forward: ping, pong, ping, ...; backward: pong, ping, ... (pong first, pingpong.h).
    for (size_t i = 0; i < events.size(); ++i) {
      const bool backward = i >= per_rank / 2;
      const std::string want = std::string((i % 2 == 0) != backward ? "ping" : "pong") + (backward ? " linear bwd" : " linear");
      EXPECT_EQ(events[i]->name, want) << "rank " << rank << " call " << i;
    }
    for (const char* x : {"ping q", "ping kv", "ping o_lse", "pong q", "pong kv", "pong o_lse", "ping do",
                          "pong do", "ping dq", "pong dkv"}) {
      EXPECT_TRUE(exchanges.count({rank, x})) << "rank " << rank << " has no exchange " << x;
    }
  }
}

// The per-step split adds up to no more than the step (communication counts only the waits).
TEST(Overlap, TimeSplitFitsInTheStep) {
  TrainConfig c = overlap_config(2);
  c.steps = 4;
  c.warmup = 1;
  for (const char* overlap : {"pingpong", "single-stream"}) {
    const TrainResult r = train(c, "cad", overlap);
    for (const StepMetrics& m : r.steps) {
      const double parts = m.busy_s() + m.comm_s + m.wait_s;
      EXPECT_GT(m.optimizer_s, 0);
      EXPECT_LE(parts, m.seconds * 1.001 + 1e-4) << overlap << " step " << m.step;
      EXPECT_GT(m.linear_s, 0);
      EXPECT_GT(m.attention_s, 0);
      EXPECT_EQ(m.nano_tokens[0] + m.nano_tokens[1], c.tokens_per_rank);
      EXPECT_GT(m.nano_tokens[0], 0);
    }
  }
}

}  // namespace
}  // namespace distca::train
