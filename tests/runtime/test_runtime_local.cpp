// The runtime on the local backend (1..8 ranks as threads): outputs and gradients against the
// whole-document kernel call, ping-pong against single-stream (the whole plan in one call),
// mixed-direction pipeline ticks, signal mode, the trace. The runner's tests give every layer
// its own inputs and hold the linear work to the runner's contract (runtime_check.h, LayerStack).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "distca/comm/local.h"
#include "distca/plan/chunking.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/validate.h"
#include "runtime_check.h"

namespace distca::runtime::testing {
namespace {

AttentionDims small_dims() { return AttentionDims{4, 2, 16, 0}; }

Comparison check_plan(const Problem& pr, const Plan& plan) {
  const int n = static_cast<int>(plan.ranks.size());
  std::vector<RankOutputs> outs(static_cast<size_t>(n));
  Status st = comm::run_local(n, [&](comm::Communicator& c) { return run_dispatcher(c, pr, plan, &outs[static_cast<size_t>(c.rank())]); });
  EXPECT_TRUE(st.ok()) << st.to_string();
  Comparison all;
  if (!st.ok()) return all;
  for (int r = 0; r < n; ++r) all.merge(compare(pr, plan.batch, r, outs[static_cast<size_t>(r)]));
  return all;
}

void expect_close(const Comparison& c, const std::string& what) {
  EXPECT_EQ(c.o.unequal, 0) << what;  // forward: bitwise
  EXPECT_EQ(c.lse.unequal, 0) << what;
  EXPECT_LE(c.o.max_abs, kFwdTol) << what;
  EXPECT_LE(c.lse.max_abs, kFwdTol) << what;
  EXPECT_LE(c.dq.max_abs, kFwdTol) << what;
  EXPECT_LE(c.dk_err_runtime, kBwdFactor * c.dk_err_kernel + 1e-7) << what;
  EXPECT_LE(c.dk.max_abs, 1e-5) << what;
  EXPECT_LE(c.dv.max_abs, 1e-5) << what;
}

TEST(RuntimeLocal, DispatcherMatchesWholeDocumentKernelForEverySchedulerAndRankCount) {
  const AttentionDims dims = small_dims();
  Comparison worst;
  for (int ranks = 1; ranks <= 8; ++ranks) {
    const int64_t tpr = ranks <= 4 ? 512 : 256;
    const Batch batch = random_batch(ranks, tpr, 100 + static_cast<uint64_t>(ranks));
    const Problem pr = make_problem(batch, dims, 7, /*with_fp64=*/true);
    const ScheduleOptions opt = schedule_options(dims);
    for (const std::string& name : scheduler_names(ranks)) {
      auto spec = parse_scheduler(name);
      ASSERT_TRUE(spec.ok());
      auto plan = make_plan(batch, spec.value(), opt);
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      ASSERT_TRUE(validate_plan(plan.value(), batch, nullptr).ok()) << name;
      const Comparison c = check_plan(pr, plan.value());
      const std::string what = std::to_string(ranks) + " ranks, " + name + ": " + describe(c);
      expect_close(c, what);
      worst.merge(c);
    }
  }
  std::printf("worst over all plans: %s\n", describe(worst).c_str());
}

TEST(RuntimeLocal, HeadTailLayoutAndGqaGroupsOfFour) {
  const AttentionDims dims{8, 2, 8, 0};
  const Batch batch = random_batch(4, 384, 9, Layout::kHeadTail);
  const Problem pr = make_problem(batch, dims, 11, true);
  for (std::string name : {"colocated", "cad"}) {
    auto plan = make_plan(batch, parse_scheduler(name).value(), schedule_options(dims));
    ASSERT_TRUE(plan.ok());
    const Comparison c = check_plan(pr, plan.value());
    expect_close(c, name + std::string(": ") + describe(c));
  }
}

// Per-document context parallelism (plan/chunking.h): documents sharded head-tail over CP
// groups, each shard served where it is held with its document's K/V gathered from the
// group's holders (dK/dV returned to them), against the whole-document kernel: the forward
// bitwise, the backward within the kernel's own rounding.
TEST(RuntimeLocal, ContextParallelLayoutsMatchTheWholeDocumentKernel) {
  const AttentionDims dims = small_dims();
  const ScheduleOptions opt = schedule_options(dims);
  int64_t sharded = 0;
  for (int ranks : {2, 4}) {
    const Batch batch = random_batch(ranks, 512, 300 + static_cast<uint64_t>(ranks));
    for (int64_t cp = 2; cp <= ranks; cp *= 2) {
      ChunkingOptions wlb;
      wlb.cp = cp;
      wlb.cp_threshold = 64;
      auto a = wlb_repack(batch, wlb);
      auto b = percp_repack(batch, cp);
      ASSERT_TRUE(a.ok() && b.ok());
      for (const auto& [name, laid] : {std::pair<std::string, Batch>{"wlb", *a}, {"percp", *b}}) {
        for (const auto& pieces : laid.per_rank) {
          for (size_t i = 0; i + 1 < pieces.size(); ++i) sharded += pieces[i].doc == pieces[i + 1].doc ? 1 : 0;
        }
        const Problem pr = make_problem(laid, dims, 13, /*with_fp64=*/true);
        auto plan = make_plan(laid, parse_scheduler("colocated").value(), opt);
        ASSERT_TRUE(plan.ok()) << plan.status().to_string();
        const Comparison c = check_plan(pr, plan.value());
        expect_close(c, std::to_string(ranks) + " ranks, " + name + " cp " + std::to_string(cp) + ": " + describe(c));
      }
    }
  }
  EXPECT_GT(sharded, 4);  // head and tail shards of one document side by side on a rank
}

// The nano-batch plans together compute every causal pair exactly once, and each alone only
// its own half's query rows.
TEST(RuntimeLocal, NanoPlansCoverEveryPairOnce) {
  const AttentionDims dims = small_dims();
  for (int ranks : {2, 3, 5}) {
    const Batch batch = random_batch(ranks, 512, 40 + static_cast<uint64_t>(ranks));
    for (const std::string& name : scheduler_names(ranks)) {
      auto np = plan_nano_batches(batch, parse_scheduler(name).value(), schedule_options(dims));
      ASSERT_TRUE(np.ok()) << np.status().to_string();
      // The scheduler ran on the split of the batch (wlb then re-packs it and splits again).
      const Batch split_input = split_nano_batches(batch, 1).value().batch;
      const Status valid = validate_plan(np->full, split_input, nullptr);
      ASSERT_TRUE(valid.ok()) << name << ": " << valid.to_string();
      auto c0 = brute_force_pair_counts(np->nano[0]);
      auto c1 = brute_force_pair_counts(np->nano[1]);
      ASSERT_TRUE(c0.ok() && c1.ok());
      for (const auto& [doc, counts] : c0.value()) {
        const auto& other = c1.value().at(doc);
        const int64_t L = static_cast<int64_t>(std::sqrt(static_cast<double>(counts.size())) + 0.5);
        for (int64_t q = 0; q < L; ++q) {
          for (int64_t k = 0; k < L; ++k) {
            const int32_t a = counts[static_cast<size_t>(q * L + k)], b = other[static_cast<size_t>(q * L + k)];
            ASSERT_EQ(a + b, k <= q ? 1 : 0) << name << " doc " << doc << " q " << q << " k " << k;
            if (q < np->split.cut_of(doc)) ASSERT_EQ(b, 0);
            else ASSERT_EQ(a, 0);
          }
        }
      }
      // Every plan runs on the split batch (ping's rows first on every rank), whose rank
      // totals are the input's (wlb's re-packed batch's for wlb).
      for (const Plan* p : {&np->full, &np->nano[0], &np->nano[1]}) ASSERT_EQ(p->batch, np->split.batch) << name;
      // Nano-batch x's query rows sit in its contiguous local range on their home rank: ping
      // in [0, t0), pong in [t0, t0 + t1) (a task's rows lie in one piece, so contiguously).
      const DocumentIndex index(np->split.batch);
      for (size_t x = 0; x < 2; ++x) {
        for (const ServerPlan& sp : np->nano[x].servers) {
          for (const ServerTask& st : sp.tasks) {
            const TaskPlacement& t = st.task;
            const auto& tok = np->split.tokens[static_cast<size_t>(t.home)];
            const int64_t lo = x == 0 ? 0 : tok[0], hi = x == 0 ? tok[0] : tok[0] + tok[1];
            const int64_t first = index.local_row(t.home, t.doc, t.q_begin), last = index.local_row(t.home, t.doc, t.q_end - 1);
            ASSERT_EQ(last - first, t.q_end - 1 - t.q_begin) << name;
            ASSERT_TRUE(first >= lo && last < hi) << name << " nano " << x << " doc " << t.doc << " rows " << first << ".."
                                                  << last << " outside [" << lo << ", " << hi << ")";
          }
        }
      }
      for (int64_t r = 0; r < ranks; ++r) {
        const auto& t = np->split.tokens[static_cast<size_t>(r)];
        EXPECT_EQ(t[0] + t[1], np->split.batch.rank_tokens(r)) << name << " rank " << r;
        if (name != "wlb") {
          EXPECT_EQ(t[0] + t[1], batch.rank_tokens(r)) << name << " rank " << r;
        }
      }
    }
  }
}

// Single-stream runs the whole plan as one call: its O and LSE are bitwise ping-pong's (both the
// whole-document call's), its gradients another association of the same partials; both match
// the kernel, every layer its own.
TEST(RuntimeLocal, PingPongAndSingleStreamMatchTheKernel) {
  const AttentionDims dims = small_dims();
  for (int ranks : {1, 2, 4}) {
    const Batch batch = random_batch(ranks, 512, 200 + static_cast<uint64_t>(ranks));
    const std::vector<Problem> layers = layer_problems(batch, dims, 5, 3, true);
    for (std::string name : {"colocated", "cad", "wlb"}) {
      auto np = plan_nano_batches(batch, parse_scheduler(name).value(), schedule_options(dims));
      ASSERT_TRUE(np.ok());
      std::vector<std::vector<RankOutputs>> pp(static_cast<size_t>(ranks)), ss(static_cast<size_t>(ranks));
      for (OverlapMode mode : {OverlapMode::kPingPong, OverlapMode::kSingleStream}) {
        auto& outs = mode == OverlapMode::kPingPong ? pp : ss;
        Status st = comm::run_local(ranks, [&](comm::Communicator& c) {
          bool valid = false;
          DISTCA_RETURN_IF_ERROR(run_runner(c, layers, np.value(), mode, nullptr, &outs[static_cast<size_t>(c.rank())], &valid));
          return valid ? Status::ok_status() : Status::internal("outputs flagged invalid");
        });
        ASSERT_TRUE(st.ok()) << name << ", " << overlap_mode_name(mode) << ": " << st.to_string();
      }
      Comparison all, single;
      for (int r = 0; r < ranks; ++r) {
        for (size_t l = 0; l < layers.size(); ++l) {
          const auto& a = pp[static_cast<size_t>(r)][l];
          const auto& b = ss[static_cast<size_t>(r)][l];
          EXPECT_TRUE(a.o == b.o && a.lse == b.lse) << name << " rank " << r << " layer " << l;
        }
        all.merge(compare_layers(layers, np->full.batch, r, pp[static_cast<size_t>(r)]));
        single.merge(compare_layers(layers, np->full.batch, r, ss[static_cast<size_t>(r)]));
      }
      expect_close(all, std::to_string(ranks) + " ranks " + name + " (ping-pong): " + describe(all));
      expect_close(single, std::to_string(ranks) + " ranks " + name + " (single-stream): " + describe(single));
    }
  }
}

// CAD's pipeline ticks: forwards of some stages and backwards of others in one pass, each
// direction pooled over every rank, ranks without an op serving only, a micro-batch's backward
// adopting its forward from an earlier tick. Every pass's every layer matches the
// whole-document reference, and the linear stand-in sees the contract kept. Every scheduler:
// those that keep a stage's rows on its ranks (all but wlb) adopt the micro-batch's own
// forward; wlb re-packs rows onto the ranks of idle stages (which then run linear work and
// need buffers of the plan's rows: placeholders there corrupted the heap before the runner
// checked them).
TEST(RuntimeLocal, MixedDirectionTicksMatchTheKernel) {
  const AttentionDims dims = small_dims();
  struct Case {
    int64_t stages, dp, micro_batches;
  };
  for (const Case& k : {Case{2, 1, 3}, Case{2, 2, 2}, Case{3, 1, 3}}) {
    // Not vacuous: some tick runs both directions.
    bool mixed = false;
    for (const auto& tick : one_f_one_b_ticks(k.stages, k.micro_batches)) {
      bool f = false, b = false;
      for (const PipeOp& op : tick) (op.backward ? b : f) = true;
      mixed = mixed || (f && b);
    }
    ASSERT_TRUE(mixed);
    const int ranks = static_cast<int>(k.stages * k.dp);
    for (const std::string& scheduler : scheduler_names(ranks)) {
      for (OverlapMode mode : {OverlapMode::kPingPong, OverlapMode::kSingleStream, OverlapMode::kSignal}) {
        if (scheduler != "cad" && mode == OverlapMode::kSignal) continue;
        std::vector<Comparison> worst(static_cast<size_t>(ranks));
        std::vector<TickStats> stats(static_cast<size_t>(ranks));
        Status st = comm::run_local(ranks, [&](comm::Communicator& c) {
          const size_t r = static_cast<size_t>(c.rank());
          return run_pipeline_ticks(c, k.stages, k.micro_batches, 2, dims, mode, scheduler, &worst[r], true, nullptr,
                                    &stats[r]);
        });
        const std::string what = std::to_string(k.stages) + " stages x " + std::to_string(k.dp) + ", " + scheduler +
                                 ", " + overlap_mode_name(mode);
        ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
        TickStats all;
        for (const TickStats& s : stats) {
          all.forward_rows += s.forward_rows, all.backward_rows += s.backward_rows;
          all.rows_off_stage += s.rows_off_stage, all.adopted_reference += s.adopted_reference;
          all.forward_only += s.forward_only;
        }
        // Every micro-batch's rows ran once in each direction, somewhere.
        EXPECT_EQ(all.forward_rows, k.stages * k.micro_batches * k.dp * 256) << what;
        EXPECT_EQ(all.backward_rows, all.forward_rows) << what;
        if (scheduler != "wlb") {  // the layout stays: each backward adopts its own forward
          EXPECT_EQ(all.rows_off_stage, 0) << what;
          EXPECT_EQ(all.adopted_reference, 0) << what << ": a backward did not adopt its own forward";
          EXPECT_EQ(all.forward_only, 0) << what;
        } else {
          EXPECT_GT(all.rows_off_stage, 0) << what << ": the re-pack case is not covered";
          EXPECT_GT(all.adopted_reference, 0) << what;
        }
        if (mode == OverlapMode::kSignal) continue;
        Comparison c;
        for (const Comparison& w : worst) c.merge(w);
        expect_close(c, what + ": " + describe(c));
      }
    }
  }
}

// A rank's buffers are checked against the plan before the runner touches one: placeholders of
// 0 rows on the ranks of an idle stage to which wlb's re-pack gave rows (what the pipeline-tick
// helper once gave them: the runner wrote past them and corrupted the heap), and buffers one
// row short, are refused with invalid_argument naming the layer and both row counts, and
// nothing is written.
TEST(RuntimeLocal, RunnerRefusesBuffersSmallerThanThePlan) {
  const AttentionDims dims = small_dims();
  const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
  const Batch member = random_batch(2, 256, 900);
  const PoolMember alone{0, 0, false, &member};
  auto pool = pool_batches(std::span<const PoolMember>(&alone, 1), 2, 2);  // stage 1 idle
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  auto np = plan_nano_batches(pool->batch, parse_scheduler("wlb").value(), schedule_options(dims));
  ASSERT_TRUE(np.ok()) << np.status().to_string();
  auto rows = [&](size_t r) { return np->split.tokens[r][0] + np->split.tokens[r][1]; };
  ASSERT_GT(rows(2) + rows(3), 0) << "the re-pack gave the idle stage no rows: nothing to refuse";
  for (const bool placeholders : {true, false}) {
    std::vector<std::string> errors(4);
    std::vector<int> untouched(4, 1);
    const Status st = comm::run_local(4, [&](comm::Communicator& c) -> Status {
      const size_t r = static_cast<size_t>(c.rank());
      const int64_t n = rows(r);
      std::vector<float> q(static_cast<size_t>(n * qf), 0.5f), kv(static_cast<size_t>(n * kvf), 0.5f);
      std::vector<float> o(q.size(), NAN), lse(static_cast<size_t>(n * dims.n_heads), NAN), idle(1, 42.0f);
      LayerForward f{q.data(), kv.data(), kv.data(), o.data(), lse.data(), n > 0 ? n - 1 : 0};
      if (placeholders) {
        f = r < 2 ? LayerForward{q.data(), kv.data(), kv.data(), o.data(), lse.data(), n}
                  : LayerForward{idle.data(), idle.data(), idle.data(), idle.data(), idle.data(), 0};
      }
      DISTCA_ASSIGN_OR_RETURN(auto runner, TickRunner::create_tick(c, &*np, nullptr, dims, OverlapMode::kPingPong));
      TickIo io;
      io.forward = {f};
      const Status s = runner->run(io);
      errors[r] = s.to_string();
      const bool refused = f.rows < n;
      untouched[r] = !refused || (idle[0] == 42.0f && std::all_of(o.begin(), o.end(), [](float x) { return std::isnan(x); }));
      return s;
    });
    EXPECT_FALSE(st.ok());
    for (size_t r = 0; r < 4; ++r) {
      const int64_t given = placeholders ? (r < 2 ? rows(r) : 0) : std::max<int64_t>(rows(r) - 1, 0);
      if (given >= rows(r)) continue;
      EXPECT_NE(errors[r].find("forward layer 0 on rank " + std::to_string(r) + ": the buffers hold " +
                               std::to_string(given) + " rows, the plan needs " + std::to_string(rows(r))),
                std::string::npos)
          << errors[r];
      EXPECT_TRUE(untouched[r]) << "rank " << r << " wrote into buffers it refused";
    }
  }
}

// ScheduleOptions::align_rows = the kernel's query tile: on a batch whose pieces lie on tile
// boundaries, cad's cuts and the nano-batch cut do too, so no server pads a single row; the
// outputs stay bitwise the whole-document call's. Unaligned planning of the same batch pads
// (so the zero is not vacuous).
TEST(RuntimeLocal, TileAlignedCadPlansPadNothing) {
  const AttentionDims dims{2, 1, 16, 0};
  const int64_t tile = query_tile_rows(dims);
  ASSERT_EQ(tile, 128);
  for (int ranks : {2, 3}) {
    // Rank 0: one document filling it; the others: documents of 2..5 tiles (cut on the tile
    // grid by the nano-batch split; a document under two tiles would go whole to one side).
    Batch batch;
    batch.ranks = ranks;
    batch.tokens_per_rank = 16 * tile;
    batch.per_rank.resize(static_cast<size_t>(ranks));
    batch.per_rank[0].push_back({0, 0, batch.tokens_per_rank, batch.tokens_per_rank});
    Rng rng(40 + static_cast<uint64_t>(ranks));
    int64_t id = 1;
    for (int r = 1; r < ranks; ++r) {
      for (int64_t used = 0; used < batch.tokens_per_rank;) {
        const int64_t rest = batch.tokens_per_rank - used;
        int64_t len = tile * (2 + static_cast<int64_t>(rng.uniform_int(4)));
        if (rest - len < 2 * tile) len = rest;
        batch.per_rank[static_cast<size_t>(r)].push_back({id++, 0, len, len});
        used += len;
      }
    }
    ASSERT_TRUE(batch.validate().ok());
    const Problem pr = make_problem(batch, dims, 21, true);
    for (int64_t align : {int64_t{1}, tile}) {
      ScheduleOptions opt = schedule_options(dims);
      opt.align_rows = align;
      auto np = plan_nano_batches(batch, parse_scheduler("cad").value(), opt);
      ASSERT_TRUE(np.ok()) << np.status().to_string();
      ASSERT_GT(np->full.metrics.traffic.bytes.forward(), 0) << "cad moved nothing";
      std::vector<int64_t> padded(static_cast<size_t>(ranks), 0);
      Status st = comm::run_local(ranks, [&](comm::Communicator& c) {
        for (const Plan* p : {&np->full, &np->nano[0], &np->nano[1]}) {
          DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(c, *p, dims));
          padded[static_cast<size_t>(c.rank())] += d->padded_query_rows();
        }
        return Status::ok_status();
      });
      ASSERT_TRUE(st.ok()) << st.to_string();
      const int64_t total = std::accumulate(padded.begin(), padded.end(), int64_t{0});
      if (align == 1) {
        EXPECT_GT(total, 0) << ranks << " ranks: the unaligned plan should cut off the grid";
        continue;
      }
      EXPECT_EQ(total, 0) << ranks << " ranks";
      std::vector<std::vector<RankOutputs>> outs(static_cast<size_t>(ranks));
      st = comm::run_local(ranks, [&](comm::Communicator& c) {
        bool valid = false;
        return run_runner(c, {pr}, np.value(), OverlapMode::kPingPong, nullptr, &outs[static_cast<size_t>(c.rank())], &valid);
      });
      ASSERT_TRUE(st.ok()) << st.to_string();
      Comparison all;
      for (int r = 0; r < ranks; ++r) all.merge(compare_layers({pr}, np->full.batch, r, outs[static_cast<size_t>(r)]));
      expect_close(all, std::to_string(ranks) + " ranks, aligned cad: " + describe(all));
    }
  }
}

// Stateless servers (inputs sent again in backward) compute the same bits as servers that keep
// them, and send exactly the forward's Q, O, LSE and K/V rows more in backward.
TEST(RuntimeLocal, StatelessServersGiveTheSameBitsForMoreBytes) {
  const AttentionDims dims = small_dims();
  for (int ranks : {1, 2, 3, 4}) {
    const Batch batch = random_batch(ranks, 384, 300 + static_cast<uint64_t>(ranks));
    const Problem pr = make_problem(batch, dims, 13, false);
    for (const std::string& name : scheduler_names(ranks)) {
      auto plan = make_plan(batch, parse_scheduler(name).value(), schedule_options(dims));
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      std::vector<RankOutputs> keep(static_cast<size_t>(ranks)), stateless(keep.size());
      std::vector<int64_t> keep_bytes(keep.size()), stateless_bytes(keep.size());
      for (bool sl : {false, true}) {
        DispatcherOptions o;
        o.stateless = sl;
        Status st = comm::run_local(ranks, [&](comm::Communicator& c) {
          const size_t r = static_cast<size_t>(c.rank());
          return run_dispatcher(c, pr, plan.value(), sl ? &stateless[r] : &keep[r], o, sl ? &stateless_bytes[r] : &keep_bytes[r]);
        });
        ASSERT_TRUE(st.ok()) << st.to_string();
      }
      for (int r = 0; r < ranks; ++r) {
        const size_t i = static_cast<size_t>(r);
        EXPECT_TRUE(keep[i].o == stateless[i].o && keep[i].lse == stateless[i].lse) << name << " rank " << r;
        EXPECT_TRUE(keep[i].dq == stateless[i].dq && keep[i].dk == stateless[i].dk && keep[i].dv == stateless[i].dv)
            << name << " rank " << r;
        const RankPlan& rp = plan->ranks[i];
        const int64_t extra = rp.exchange(ExchangeKind::kQ).send_rows() * (2 * dims.q_floats() + dims.n_heads) +
                              rp.exchange(ExchangeKind::kKv).send_rows() * 2 * dims.kv_floats();
        EXPECT_EQ(stateless_bytes[i], keep_bytes[i] + extra * static_cast<int64_t>(sizeof(float))) << name << " rank " << r;
      }
    }
  }
}

// A pipeline's mixed ticks (one_f_one_b_ticks) run a micro-batch's forward on one pooled plan and its
// backward on another: stateless servers recompute from Q, K, V, O and the LSE, and O and LSE
// are bitwise the same from any plan (tile alignment), so a backward on plan B after adopting
// the forward outputs of plan A gives bitwise what B's own forward + backward gives.
TEST(RuntimeLocal, AdoptedForwardGivesTheBackwardOfTheSamePlanBitwise) {
  const AttentionDims dims = small_dims();
  for (int ranks : {2, 3}) {
    const Batch batch = random_batch(ranks, 384, 500 + static_cast<uint64_t>(ranks));
    const Problem pr = make_problem(batch, dims, 17, false);
    auto plan_a = make_plan(batch, parse_scheduler("colocated").value(), schedule_options(dims));
    auto plan_b = make_plan(batch, parse_scheduler("cad").value(), schedule_options(dims));
    ASSERT_TRUE(plan_a.ok() && plan_b.ok());
    std::vector<RankOutputs> own(static_cast<size_t>(ranks)), adopted(own.size());
    DispatcherOptions o;
    o.stateless = true;
    Status st = comm::run_local(ranks, [&](comm::Communicator& c) -> Status {
      const size_t r = static_cast<size_t>(c.rank());
      DISTCA_RETURN_IF_ERROR(run_dispatcher(c, pr, plan_b.value(), &own[r], o));
      const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
      const auto q = local_rows(pr, batch, c.rank(), pr.q, qf), k = local_rows(pr, batch, c.rank(), pr.k, kvf),
                 v = local_rows(pr, batch, c.rank(), pr.v, kvf), d_o = local_rows(pr, batch, c.rank(), pr.d_o, qf);
      RankOutputs& out = adopted[r];
      out.o.assign(q.size(), NAN), out.dq.assign(q.size(), NAN), out.dk.assign(k.size(), NAN), out.dv.assign(k.size(), NAN);
      out.lse.assign(static_cast<size_t>(static_cast<int64_t>(q.size()) / qf * dims.n_heads), NAN);
      DISTCA_ASSIGN_OR_RETURN(auto a, CaDispatcher::create(c, plan_a.value(), dims, o));
      DISTCA_RETURN_IF_ERROR(a->forward(0, q, k, v, out.o, out.lse));
      DISTCA_ASSIGN_OR_RETURN(auto b, CaDispatcher::create(c, plan_b.value(), dims, o));
      b->adopt_forward(0, q, k, v, out.o, out.lse);
      return b->backward(0, d_o, out.dq, out.dk, out.dv);
    });
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (int r = 0; r < ranks; ++r) {
      const size_t i = static_cast<size_t>(r);
      EXPECT_TRUE(own[i].o == adopted[i].o && own[i].lse == adopted[i].lse) << ranks << " ranks, rank " << r;
      EXPECT_TRUE(own[i].dq == adopted[i].dq && own[i].dk == adopted[i].dk && own[i].dv == adopted[i].dv)
          << ranks << " ranks, rank " << r;
    }
  }
}

TEST(RuntimeLocal, StatelessPingPongEqualsKeepingServers) {
  const AttentionDims dims{8, 2, 8, 0};
  const int ranks = 3;
  const Batch batch = random_batch(ranks, 512, 77);
  const std::vector<Problem> layers = layer_problems(batch, dims, 17, 2, false);
  auto np = plan_nano_batches(batch, parse_scheduler("cad").value(), schedule_options(dims));
  ASSERT_TRUE(np.ok());
  std::vector<std::vector<RankOutputs>> keep(ranks), stateless(ranks);
  for (bool sl : {false, true}) {
    Status st = comm::run_local(ranks, [&](comm::Communicator& c) {
      bool valid = false;
      auto& out = sl ? stateless[static_cast<size_t>(c.rank())] : keep[static_cast<size_t>(c.rank())];
      return run_runner(c, layers, np.value(), OverlapMode::kPingPong, nullptr, &out, &valid, sl);
    });
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  for (size_t r = 0; r < keep.size(); ++r) {
    for (size_t l = 0; l < layers.size(); ++l) {
      const RankOutputs &a = keep[r][l], &b = stateless[r][l];
      EXPECT_TRUE(a.o == b.o && a.dq == b.dq && a.dk == b.dk && a.dv == b.dv) << "rank " << r << " layer " << l;
    }
  }
}

TEST(RuntimeLocal, SignalModeRunsAndFlagsOutputsInvalid) {
  const AttentionDims dims = small_dims();
  const Batch batch = random_batch(3, 512, 77);
  const std::vector<Problem> layers = layer_problems(batch, dims, 3, 2, false);
  auto np = plan_nano_batches(batch, parse_scheduler("cad").value(), schedule_options(dims));
  ASSERT_TRUE(np.ok());
  std::vector<int> valid(3, 1);
  Status st = comm::run_local(3, [&](comm::Communicator& c) {
    std::vector<RankOutputs> out;
    bool v = true;
    DISTCA_RETURN_IF_ERROR(run_runner(c, layers, np.value(), OverlapMode::kSignal, nullptr, &out, &v));
    valid[static_cast<size_t>(c.rank())] = v ? 1 : 0;
    return Status::ok_status();
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (int v : valid) EXPECT_EQ(v, 0);
}

TEST(RuntimeLocal, TraceHasComputeAndCommEventsForEveryRank) {
  const AttentionDims dims = small_dims();
  const int ranks = 3;
  const Batch batch = random_batch(ranks, 512, 91);
  const std::vector<Problem> layers = layer_problems(batch, dims, 3, 2, false);
  auto np = plan_nano_batches(batch, parse_scheduler("cad").value(), schedule_options(dims));
  ASSERT_TRUE(np.ok());
  TraceRecorder trace;
  std::vector<TraceEvent> gathered;
  Status st = comm::run_local(ranks, [&](comm::Communicator& c) {
    TraceRecorder mine(trace.epoch());
    std::vector<RankOutputs> out;
    bool v = false;
    DISTCA_RETURN_IF_ERROR(run_runner(c, layers, np.value(), OverlapMode::kPingPong, &mine, &out, &v));
    return gather_trace(c, mine.events(), &gathered);
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  const auto j = nlohmann::json::parse(chrome_trace_json(gathered));
  ASSERT_TRUE(j.contains("traceEvents"));
  std::map<int, std::set<std::string>> cats;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    cats[e["tid"].get<int>()].insert(e["cat"].get<std::string>());
  }
  ASSERT_EQ(cats.size(), static_cast<size_t>(ranks));
  for (const auto& [tid, set] : cats) {
    EXPECT_TRUE(set.count("compute")) << tid;
    EXPECT_TRUE(set.count("comm")) << tid;
  }
}

// Ranks whose plans disagree (each its own batch): the peers' row counts differ from what a
// rank's plan expects, and the exchange fails on the receiving side naming both byte counts,
// instead of a receive buffer sized by one plan taking the rows of another.
TEST(RuntimeLocal, RanksWithDisagreeingPlansFailTheExchange) {
  const AttentionDims dims = small_dims();
  std::vector<Plan> plans;
  for (uint64_t seed : {5, 6}) {
    auto plan = make_plan(random_batch(2, 256, seed), parse_scheduler("cad").value(), schedule_options(dims));
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    plans.push_back(std::move(plan).value());
  }
  ASSERT_NE(plans[0].ranks[0].exchanges, plans[1].ranks[0].exchanges) << "the plans agree: nothing to detect";
  const Status st = comm::run_local(2, [&](comm::Communicator& c) -> Status {
    const Plan& plan = plans[static_cast<size_t>(c.rank())];
    const int64_t n = plan.ranks[static_cast<size_t>(c.rank())].tokens;
    std::vector<float> q(static_cast<size_t>(n * dims.q_floats()), 0.5f), kv(static_cast<size_t>(n * dims.kv_floats()), 0.5f);
    std::vector<float> o(q.size()), lse(static_cast<size_t>(n * dims.n_heads));
    DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(c, plan, dims));
    return d->forward(0, q, kv, kv, o, lse);
  });
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("which expects"), std::string::npos) << st.to_string();
}

TEST(RuntimeLocal, RefusesAPlanForAnotherGroupSize) {
  const AttentionDims dims = small_dims();
  const Batch batch = random_batch(2, 256, 5);
  auto plan = make_plan(batch, parse_scheduler("cad").value(), schedule_options(dims));
  ASSERT_TRUE(plan.ok());
  Status st = comm::run_local(3, [&](comm::Communicator& c) {
    auto d = CaDispatcher::create(c, plan.value(), dims);
    return d.ok() ? Status::internal("accepted") : Status::ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_FALSE(parse_overlap_mode("ping").ok());
  EXPECT_EQ(parse_overlap_mode("single-stream").value(), OverlapMode::kSingleStream);
  EXPECT_FALSE((AttentionDims{4, 3, 8, 0}).validate().ok());
}

}  // namespace
}  // namespace distca::runtime::testing
