// wlb's and percp's CP runner in the trainer (issue 26). Memory: the estimate's CP term
// (train/memory.h, cp_row_limits) bounds the trainer's accounting of real runs, within a
// stated margin, and `distca train` refuses a run whose CP buffers do not fit before any work.
// Trace: the collectives are spans of each rank's timeline, nested in their layer's attention
// span, and their wait spans add up to the step's attention_comm_s.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "distca/core/specs.h"
#include "distca/core/trace.h"
#include "distca/model/llama.h"
#include "distca/train/config.h"
#include "distca/train/memory.h"
#include "distca/train/trainer.h"
#include "support/cli_fixture.h"
#include "train_test_util.h"

namespace distca::train {
namespace {

namespace fs = std::filesystem;

// Long documents (up to 4 ranks' tokens), so wlb's sharding and percp's gathers carry most of
// the batch: the CP buffers are a fifth to a third of a rank's accounting.
TrainConfig cp_config(int64_t ranks, TrainMode mode) {
  TrainConfig c = testing::small_model_config(2);
  c.ranks = ranks;
  c.mode = mode;
  c.cp = 2;
  c.tokens_per_rank = 512;
  c.dist = "uniform:256:2048";
  c.max_doc_len = 0;
  c.steps = 3;
  c.warmup = 1;
  if (mode == TrainMode::kWlb) c.cp_threshold = 255;
  return c;
}

// The estimate's terms that the trainer's accounting covers (TrainResult::accounted_peak_bytes:
// model state, activations and the CP runner's buffers; not the all-reduce, plan or thread
// terms).
int64_t estimated_accounted(const TrainMemoryEstimate& e) { return e.model_state + e.activations + e.cp_buffers; }

// The largest rank's estimate bounds every rank's accounted peak, and is within kMargin of the
// largest: the bounds of cp_row_limits hold for any layout (a rank's context rows could reach
// T + 2 G, each padded query row a context row), which real batches do not reach. Measured at
// these configurations: 1.4-2.0 (printed below).
constexpr double kMargin = 2.5;

TEST(CpMemory, EstimateBoundsTheAccountedPeakOfRealRuns) {
  struct Case {
    int64_t ranks;
    TrainMode mode;
    int64_t pp;
  };
  for (const Case k : {Case{2, TrainMode::kPerCp, 1}, Case{2, TrainMode::kWlb, 1}, Case{4, TrainMode::kPerCp, 1},
                       Case{4, TrainMode::kWlb, 1}, Case{4, TrainMode::kWlb, 2}}) {
    TrainConfig c = cp_config(k.ranks, k.mode);
    if (k.pp > 1) {
      c.pp = k.pp;
      c.micro_batches = 2;
    }
    const std::string what = std::string(train_mode_name(k.mode)) + " ranks " + std::to_string(k.ranks) + " pp " +
                             std::to_string(k.pp);
    const ModelSpec spec = *c.model_spec();
    const TrainMemoryEstimate e = estimate_train_memory(c, spec, MemoryInputs{});
    EXPECT_EQ(e.dispatcher, 0) << what;  // no dispatcher runs
    EXPECT_GT(e.cp_buffers, 0) << what;
    TrainResult r;
    const Status st = run_training_local(c, {}, &r);
    ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
    const int64_t peak = *std::max_element(r.accounted_peak_bytes.begin(), r.accounted_peak_bytes.end());
    // The accounting without its CP buffers (state and activations alone) is the same for any
    // mode's rows, so the CP runner's share of the peak is what remains; it must be real.
    const int64_t state = 4 * static_cast<int64_t>(sizeof(float)) * model::param_count(spec) / k.pp;
    EXPECT_GT(peak - state, e.activations / 2) << what;
    const double ratio = static_cast<double>(estimated_accounted(e)) / static_cast<double>(peak);
    std::printf("%s: estimate %lld (cp %lld), accounted peak %lld, ratio %.2f\n", what.c_str(),
                static_cast<long long>(estimated_accounted(e)), static_cast<long long>(e.cp_buffers),
                static_cast<long long>(peak), ratio);
    EXPECT_GE(ratio, 1.0) << what;
    EXPECT_LE(ratio, kMargin) << what;
  }
}

// The CP term follows the rows: doubling the tokens per rank doubles it (every bound is linear
// in the rows), and it is counted once per in-flight micro-batch under pipelines.
TEST(CpMemory, CpTermGrowsWithRowsAndSlots) {
  TrainConfig c = cp_config(2, TrainMode::kPerCp);
  const ModelSpec spec = *c.model_spec();
  const TrainMemoryEstimate a = estimate_train_memory(c, spec, {});
  c.tokens_per_rank *= 2;
  const TrainMemoryEstimate b = estimate_train_memory(c, spec, {});
  EXPECT_NEAR(static_cast<double>(b.cp_buffers), 2.0 * static_cast<double>(a.cp_buffers), 8.0);
  const CpRowLimits l = cp_row_limits(c);
  EXPECT_EQ(l.gathered, 2 * 1024);           // dp x tokens per rank
  EXPECT_EQ(l.context, 1024 + 2 * 2048 + 2048);  // T + 2 G + the longest document (uncapped: G)
  c.tokens_per_rank /= 2;
  c.ranks = 4;
  c.pp = 2;
  c.micro_batches = 4;
  const TrainMemoryEstimate p = estimate_train_memory(c, spec, {});
  EXPECT_NEAR(static_cast<double>(p.cp_buffers), 2.0 * static_cast<double>(a.cp_buffers), 8.0);  // 2 slots
  c.mode = TrainMode::kColocated;
  c.cp = 1;
  EXPECT_EQ(estimate_train_memory(c, spec, {}).cp_buffers, 0);
}

int64_t arg(const TraceEvent& e, const std::string& key) {
  for (const TraceArg& a : e.args) {
    if (a.key == key) return a.value;
  }
  return -1;
}

bool inside(const TraceEvent& inner, const TraceEvent& outer) {
  return inner.start_us >= outer.start_us && inner.end_us <= outer.end_us;
}

// The traced step of percp cp 2 at 4 ranks: step 0's long document (1936 of its 2048 tokens)
// spans both CP groups (the dp-wide class) and the short one sits in group 1 (ranks 2 and 3),
// so group 1 runs both classes' collectives and group 0 the dp-wide ones.
// On every rank, per layer, one attention span per direction; each collective a comm span
// inside its layer's attention span with a wait span of the same extent; the kernel and the
// assembly inside it too; the linear calls of both nano-batches outside them; and the wait
// spans add up to the step's attention_comm_s (the same clock readings), within comm_s.
TEST(CpTrace, CollectivesAreNestedSpansThatAddUpToTheWaitedSeconds) {
  TrainConfig c = cp_config(4, TrainMode::kPerCp);
  c.steps = 1;
  c.trace = (fs::temp_directory_path() / "distca_cp_trace_unused.json").string();
  TrainResult r;
  const Status st = run_training_local(c, {}, &r);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_FALSE(r.trace.empty());
  std::map<int64_t, std::vector<const TraceEvent*>> by_rank;
  for (const TraceEvent& e : r.trace) by_rank[e.tid].push_back(&e);
  ASSERT_EQ(by_rank.size(), 4u);
  const int64_t layers = 2;
  for (auto& [rank, events] : by_rank) {
    std::map<std::pair<std::string, int64_t>, const TraceEvent*> calls;  // (direction, layer)
    for (const TraceEvent* e : events) {
      if (e->category != "cp") continue;
      EXPECT_TRUE(calls.insert({{e->name, arg(*e, "layer")}, e}).second) << "rank " << rank << " " << e->name;
    }
    EXPECT_EQ(calls.size(), static_cast<size_t>(2 * layers)) << "rank " << rank;
    std::set<std::string> collectives;
    double waited_us = 0;
    int linear = 0;
    for (const TraceEvent* e : events) {
      if (e->name.find("linear") != std::string::npos) {
        ++linear;
        for (const auto& [key, call] : calls) EXPECT_FALSE(inside(*e, *call) && e->end_us > e->start_us) << e->name;
        continue;
      }
      if (e->category == "cp") continue;
      const bool bwd = e->name == "attention bwd" || e->name.find("reduce-scatter") != std::string::npos;
      // Backward gathers the K/V again: an all-gather sits in either direction's span.
      const auto fwd_call = calls.find({"cp attention fwd", arg(*e, "layer")});
      const auto bwd_call = calls.find({"cp attention bwd", arg(*e, "layer")});
      ASSERT_TRUE(fwd_call != calls.end() && bwd_call != calls.end()) << "rank " << rank << " " << e->name;
      const bool in_fwd = inside(*e, *fwd_call->second), in_bwd = inside(*e, *bwd_call->second);
      EXPECT_TRUE(bwd ? in_bwd : in_fwd || in_bwd) << "rank " << rank << " " << e->name << " layer " << arg(*e, "layer");
      if (e->category == "comm") {
        collectives.insert(e->name);
        const auto wait = std::find_if(events.begin(), events.end(), [&](const TraceEvent* w) {
          return w->category == "wait" && w->name == e->name + " wait" && w->start_us == e->start_us &&
                 w->end_us == e->end_us && arg(*w, "layer") == arg(*e, "layer");
        });
        EXPECT_TRUE(wait != events.end()) << "rank " << rank << " " << e->name << " has no wait span";
      }
      if (e->category == "wait") waited_us += e->end_us - e->start_us;
    }
    EXPECT_EQ(linear, 2 * 2 * (static_cast<int>(layers) + 1)) << "rank " << rank;
    // Group 0 holds only pieces of the long document (dp-wide); group 1 also the short one.
    std::set<std::string> want{"cp all-gather kv (dp)", "cp reduce-scatter dkv (dp)"};
    if (rank >= 2) want.insert({"cp all-gather kv", "cp reduce-scatter dkv"});
    EXPECT_EQ(collectives, want) << "rank " << rank;
    const StepMetrics& m = r.rank_steps[static_cast<size_t>(rank)].back();
    EXPECT_GT(m.attention_comm_s, 0) << "rank " << rank;
    EXPECT_NEAR(waited_us * 1e-6, m.attention_comm_s, 1e-6) << "rank " << rank;
    EXPECT_LE(m.attention_comm_s, m.comm_s) << "rank " << rank;
  }
}

class CpMemoryCli : public distca::testing::CliFixture {
 protected:
  CpMemoryCli() : CliFixture("train_cp_memory", "train") {}
};

// A --max-memory that the run would fit without its CP buffers but not with them: refused with
// exit 2 and one line before any work (no metrics file).
TEST_F(CpMemoryCli, RunWhoseCpBuffersDoNotFitIsRefusedBeforeWork) {
  TrainConfig c = cp_config(2, TrainMode::kPerCp);
  c.model = "tiny";  // the preset, as --model tiny gives it
  c.model_overrides = {};
  c.tokens_per_rank = 4096;
  c.dist = "uniform:2048:8192";
  c.steps = 1;
  MemoryInputs mi;
  mi.ranks_in_process = 2;
  const TrainMemoryEstimate e = estimate_train_memory(c, *c.model_spec(), mi);
  ASSERT_GT(e.cp_buffers, 64 << 20);  // well above the estimate's other slack
  const double without_cp = e.process_total() - 2.0 * static_cast<double>(e.cp_buffers);
  const auto limit = static_cast<long long>(without_cp + static_cast<double>(e.cp_buffers));  // half the CP buffers
  const fs::path metrics = dir_ / "m.jsonl";
  const std::string args = "--mode percp --cp 2 --ranks 2 --tokens-per-rank 4096 --dist uniform:2048:8192 "
                           "--max-doc-len 0 --steps 1 --warmup 1 --model tiny --metrics " + metrics.string() +
                           " --max-memory " + std::to_string(limit);
  const distca::testing::CliRun r = run(args);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("distca: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--tokens-per-rank 4096"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(fs::exists(metrics));
}

}  // namespace
}  // namespace distca::train
