// The ping-pong timeline (plan/pingpong_model.h) and `--tolerance auto` with it: closed forms
// where no byte moves, the link's effect, and the choice on the bench train batch over a slow
// link against the ladder's fixed tolerances.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distca/cost/analytic.h"
#include "distca/plan/auto_tolerance.h"
#include "distca/plan/kv_once.h"
#include "distca/plan/pingpong_model.h"
#include "distca/plan/plan_json.h"
#include "distca/plan/topology_relay.h"
#include "plan_test_util.h"

namespace distca {
namespace {

class LinearSeconds final : public AttentionCostModel {
 public:
  double task_cost(int64_t q_len, int64_t kv_len) const override {
    return 1e-9 * static_cast<double>(causal_pairs(kv_len - q_len, kv_len));
  }
  std::string unit() const override { return "seconds"; }
};

AutoToleranceModel model(const AttentionCostModel* seconds, double rate) {
  AutoToleranceModel m;
  m.seconds = seconds;
  m.inter_host_bytes_per_second = rate;
  m.intra_host_bytes_per_second = rate * 8;
  m.linear_forward_seconds_per_row = 2e-5;
  m.linear_backward_seconds_per_row = 4e-5;
  m.attention_backward_share = 0.7;
  return m;
}

ScheduleOptions opts(double tolerance) {
  ScheduleOptions o;
  o.model = test::test_model();
  o.align_rows = 128;
  o.tolerance = tolerance;
  return o;
}

// bench train's batch: rank 0 one document of `tokens`, the others 512-token documents.
Batch bench_batch(int64_t ranks, int64_t tokens) {
  Batch b;
  b.ranks = ranks;
  b.tokens_per_rank = tokens;
  b.per_rank.resize(static_cast<size_t>(ranks));
  int64_t id = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    const int64_t len = r == 0 ? tokens : 512;
    for (int64_t t = 0; t + len <= tokens; t += len) b.per_rank[static_cast<size_t>(r)].push_back({id++, 0, len, len});
  }
  return b;
}

int64_t bytes_sent(const Plan& p) {
  int64_t n = 0;
  for (const RankPlan& r : p.ranks) {
    for (const Exchange& e : r.exchanges) n += e.send_rows() * e.row_bytes;
  }
  return n;
}

// Nothing moves (every rank holds the same documents): each rank runs alone, so the step is
// the largest rank's sum of its linear work ((layers + 1) blocks per direction) and its
// attention (layers per direction), whatever the link.
TEST(PingPongModel, WithoutBytesTheStepIsTheLargestRanksCompute) {
  const LinearSeconds seconds;
  Batch b;
  b.ranks = 3;
  b.tokens_per_rank = 2048;
  b.per_rank = {{{0, 0, 2048, 2048}}, {{1, 0, 2048, 2048}}, {{2, 0, 1024, 1024}, {3, 0, 1024, 1024}}};
  auto plans = plan_nano_batches(b, SchedulerSpec{}, opts(1.0));  // a band wide enough for all
  ASSERT_TRUE(plans.ok()) << plans.status().to_string();
  ASSERT_EQ(bytes_sent(plans->full), 0);
  const AutoToleranceModel m = model(&seconds, 1e3);
  for (const int64_t layers : {1, 3}) {
    double want = 0;
    for (size_t r = 0; r < 3; ++r) {
      double attention = 0;
      for (const ServerTask& t : plans->full.servers[r].tasks) {
        attention += 1e-9 * static_cast<double>(causal_pairs(t.task.q_begin, t.task.q_end));
      }
      const double rows = static_cast<double>(plans->full.ranks[r].tokens);
      want = std::max(want, static_cast<double>(layers + 1) * rows * 6e-5 + static_cast<double>(layers) * attention);
    }
    const PingPongPrediction p = predict_pingpong(*plans, m, layers);
    EXPECT_NEAR(p.seconds, want, 1e-12 * want);
    EXPECT_EQ(p.seconds, p.signal_seconds);
  }
}

// A faster link never predicts a slower step; a link fast enough hides everything, a slow one
// exposes at least the transfer of the largest message past every compute on the receiver.
TEST(PingPongModel, TheLinkSetsTheExposedTime) {
  const LinearSeconds seconds;
  const Batch b = bench_batch(2, 8192);
  auto plans = plan_nano_batches(b, SchedulerSpec{}, opts(0.05));
  ASSERT_TRUE(plans.ok());
  double before = 1e300;
  for (const double rate : {1e6, 1e7, 1e8, 1e9, 1e15}) {
    const PingPongPrediction p = predict_pingpong(*plans, model(&seconds, rate), 2);
    EXPECT_LE(p.seconds, before) << rate;
    EXPECT_GE(p.exposed(), 0) << rate;
    before = p.seconds;
    if (rate == 1e15) {
      EXPECT_LT(p.exposed(), 1e-6 * p.seconds);
    }
  }
  // At 1 MB/s the largest single dispatch alone outlasts the signal step.
  int64_t largest = 0;
  for (const Plan& nano : plans->nano) {
    const Exchange& q = nano.ranks[0].exchange(ExchangeKind::kQ);
    const Exchange& kv = nano.ranks[0].exchange(ExchangeKind::kKv);
    largest = std::max(largest, q.send_rows() * q.row_bytes + kv.send_rows() * kv.row_bytes);
  }
  const PingPongPrediction slow = predict_pingpong(*plans, model(&seconds, 1e6), 2);
  EXPECT_GT(slow.seconds, static_cast<double>(largest) / 1e6);
}

// On bench train's batch, the pong dispatch (the moved top of rank 0's document with all its
// K/V) hides only behind rank 1's ping attention: on a slow link the timeline predicts it
// exposed, and --tolerance auto keeps the work home (fewer bytes) where the fast link moves it.
TEST(PingPongModel, AutoMovesLessOnASlowLink) {
  const LinearSeconds seconds;
  const Batch b = bench_batch(2, 8192);
  ScheduleOptions o = opts(0.05);
  o.model.n_layers = 2;
  auto fast = choose_tolerance(b, SchedulerSpec{}, o, model(&seconds, 1e11));
  auto slow = choose_tolerance(b, SchedulerSpec{}, o, model(&seconds, 1e7));
  ASSERT_TRUE(fast.ok() && slow.ok());
  ASSERT_EQ(slow->predicted_signal.size(), std::size(kAutoTolerances));
  for (size_t i = 0; i < slow->predicted.size(); ++i) {
    EXPECT_LE(slow->predicted_seconds, slow->predicted[i]);
    EXPECT_GE(slow->predicted[i], slow->predicted_signal[i]);
  }
  auto bytes_at = [&](double tol) {
    auto p = plan_nano_batches(b, SchedulerSpec{}, opts(tol));
    return bytes_sent(p->full);
  };
  EXPECT_LT(bytes_at(slow->tolerance), bytes_at(fast->tolerance));
  EXPECT_LE(fast->tolerance, 0.05);
  EXPECT_EQ(fast->cut_fraction, 0);  // a fast link keeps the L / sqrt(2) split
  // The chosen plan's exposed time is below the compute it stands in for: the step it
  // predicts beats the plan that moves nothing (tolerance 1: the colocated step).
  EXPECT_LE(slow->predicted_seconds, slow->predicted.back());
}

// The choice recomputed from the timeline at every (tolerance, cut): per tolerance the rule's
// cut unless another is more than the margin faster, then 0.05 unless the fastest tolerance
// (ties: the tighter) is more than the margin faster; plan_nano_batches at the choice gives
// the predicted step.
TEST(PingPongModel, ChoiceIsTheBestTimelineOverTolerancesAndCuts) {
  const LinearSeconds seconds;
  int other_cuts = 0, other_bands = 0;
  for (const double rate : {3e6, 3e7, 3e8}) {
    for (const int64_t ranks : {2, 4}) {
      const Batch b = bench_batch(ranks, 4096);
      ScheduleOptions o = opts(0.05);
      o.model.n_layers = 2;
      const AutoToleranceModel m = model(&seconds, rate);
      auto c = choose_tolerance(b, SchedulerSpec{}, o, m);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      ASSERT_EQ(c->cuts.size(), std::size(kAutoTolerances));
      double best = 0;
      size_t best_i = 0;
      for (size_t i = 0; i < std::size(kAutoTolerances); ++i) {
        o.tolerance = kAutoTolerances[i];
        double rule = 0, t = 0, cut = 0;
        for (const double f : kAutoCutFractions) {
          auto p = plan_nano_batches(b, SchedulerSpec{}, o, f);
          ASSERT_TRUE(p.ok());
          const double s = predict_pingpong(*p, m, 2).seconds;
          if (f == 0) {
            rule = t = s;
          } else if (s < t && s < (1 - kAutoCutMargin) * rule) {
            t = s;
            cut = f;
          }
        }
        EXPECT_EQ(c->predicted[i], t) << rate << " " << i;
        EXPECT_EQ(c->cuts[i], cut) << rate << " " << i;
        other_cuts += cut != 0;
        if (i == 0 || t < best) {
          best = t;
          best_i = i;
        }
      }
      const size_t dflt = 2;
      ASSERT_EQ(kAutoTolerances[dflt], 0.05);
      if (!(best < (1 - kAutoToleranceMargin) * c->predicted[dflt])) best_i = dflt;
      other_bands += best_i != dflt;
      EXPECT_EQ(c->tolerance, kAutoTolerances[best_i]);
      EXPECT_EQ(c->cut_fraction, c->cuts[best_i]);
      o.tolerance = c->tolerance;
      auto chosen = plan_nano_batches(b, SchedulerSpec{}, o, c->cut_fraction);
      ASSERT_TRUE(chosen.ok());
      EXPECT_EQ(predict_pingpong(*chosen, m, 2).seconds, c->predicted_seconds);
    }
  }
  EXPECT_GT(other_cuts, 0);   // the link-aware cut is exercised
  EXPECT_GT(other_bands, 0);  // and a band other than the default
}

// Bytes rank `from` sends rank `to` in nano plan x's exchanges `kinds`, plus `wire` when given.
int64_t pair_bytes(const Plan& plan, std::initializer_list<ExchangeKind> kinds, const std::vector<Exchange>* wire,
                   size_t from, size_t to) {
  int64_t n = 0;
  std::vector<const Exchange*> all;
  for (const ExchangeKind k : kinds) all.push_back(&plan.ranks[from].exchange(k));
  if (wire != nullptr) all.push_back(&(*wire)[from]);
  for (const Exchange* e : all) n += e->send_counts[to] * e->row_bytes;
  return n;
}

// Two ranks, one layer, written out step by step from the contract (pingpong_model.h): each
// exchange is one message each way, starting once both ranks posted and the direction is
// free, lasting message_seconds + bytes / rate, and completing on both ranks with the later
// message. Checked with and without the K/V wire, on a slow and a fast link, and with the link
// free (signal).
TEST(PingPongModel, TwoRanksOneLayerByHand) {
  const LinearSeconds seconds;
  const Batch b = bench_batch(2, 4096);
  auto plans = plan_nano_batches(b, SchedulerSpec{}, opts(0.05));
  ASSERT_TRUE(plans.ok());
  const std::array<std::vector<Exchange>, 2> wire = nano_kv_wire(*plans, false);
  for (const bool kv_once : {true, false}) {
    for (const double rate : {2e6, 2e8}) {
      for (const auto& [free, cpu] : {std::pair{false, 0.0}, {true, 0.0}, {false, 2e-7}, {true, 2e-7}}) {
        AutoToleranceModel m = model(&seconds, rate);
        m.kv_once = kv_once;
        m.message_seconds = 3e-4;
        // Each byte a rank sends or receives takes `cpu` seconds from the compute beside it,
        // spread over the transfer's window (none in signal mode: no bytes).
        m.comm_cpu_seconds_per_byte = cpu;
        // Per nano-batch x and rank r: linear and attention seconds.
        double lf[2][2], lb[2][2], af[2][2], ab[2][2];
        // Per exchange (dispatch, return, backward dispatch, backward return) and nano-batch:
        // bytes 0 -> 1 and 1 -> 0.
        int64_t bytes[4][2][2];
        for (size_t x = 0; x < 2; ++x) {
          const Plan& nano = plans->nano[x];
          for (size_t r = 0; r < 2; ++r) {
            const double rows = static_cast<double>(plans->split.tokens[r][x]);
            lf[x][r] = rows * 2e-5;
            lb[x][r] = rows * 4e-5;
            double att = 0;
            for (const ServerTask& t : nano.servers[r].tasks) {
              att += 1e-9 * static_cast<double>(causal_pairs(t.task.q_begin, t.task.q_end));
            }
            af[x][r] = 0.3 * att;
            ab[x][r] = 0.7 * att;
            const size_t o = 1 - r;
            bytes[0][x][r] = kv_once ? pair_bytes(nano, {ExchangeKind::kQ}, &wire[x], r, o)
                                     : pair_bytes(nano, {ExchangeKind::kQ, ExchangeKind::kKv}, nullptr, r, o);
            bytes[1][x][r] = pair_bytes(nano, {ExchangeKind::kOLse}, nullptr, r, o);
            bytes[2][x][r] = pair_bytes(nano, {ExchangeKind::kDO}, nullptr, r, o);
            bytes[3][x][r] = pair_bytes(nano, {ExchangeKind::kDQ, ExchangeKind::kDKv}, nullptr, r, o);
            if (free) bytes[0][x][r] = bytes[1][x][r] = bytes[2][x][r] = bytes[3][x][r] = 0;
          }
        }
        double c0 = 0, c1 = 0;            // the ranks' clocks
        double out0 = 0, out1 = 0;        // rank 0 -> 1 and 1 -> 0 directions free from
        std::vector<std::array<double, 3>> live[2];  // per rank: (start, end, cpu) of transfers in flight
        auto post = [&](int e, int x) {  // the completion time on both ranks
          const double posted = std::max(c0, c1);
          const double s01 = std::max({c0, c1, out0}), s10 = std::max({c0, c1, out1});
          out0 = s01 + static_cast<double>(bytes[e][x][0]) / rate;
          out1 = s10 + static_cast<double>(bytes[e][x][1]) / rate;
          const double done = std::max(out0, out1) + 3e-4;
          const double moved = static_cast<double>(bytes[e][x][0] + bytes[e][x][1]);  // each rank's sent + received
          if (cpu > 0 && moved > 0) {
            for (auto& l : live) l.push_back({posted, done, cpu * moved});
          }
          return done;
        };
        auto charged = [&](std::vector<std::array<double, 3>>& l, double t, double d) {
          std::erase_if(l, [t](const auto& w) { return w[1] <= t; });
          double extra = 0;
          for (const auto& w : l) extra += w[2] * std::max(0.0, std::min(w[1], t + d) - std::max(w[0], t)) / (w[1] - w[0]);
          return d + extra;
        };
        auto run = [&](const double (&t)[2][2], int x) {
          c0 += charged(live[0], c0, t[x][0]);
          c1 += charged(live[1], c1, t[x][1]);
        };
        auto wait = [&](double done) { c0 = std::max(c0, done), c1 = std::max(c1, done); };
        run(lf, 0);
        const double d0 = post(0, 0);
        run(lf, 1);
        const double d1 = post(0, 1);
        wait(d0);
        run(af, 0);
        const double o0 = post(1, 0);
        wait(d1);
        run(af, 1);
        const double o1 = post(1, 1);
        wait(o0);
        run(lf, 0);
        wait(o1);
        run(lf, 1);
        run(lb, 1);  // backward: pong first
        const double e1 = post(2, 1);
        run(lb, 0);
        const double e0 = post(2, 0);
        wait(e1);
        run(ab, 1);
        const double r1 = post(3, 1);
        wait(e0);
        run(ab, 0);
        const double r0 = post(3, 0);
        wait(r1);
        run(lb, 1);
        wait(r0);
        run(lb, 0);
        const double want = std::max(c0, c1);
        const PingPongPrediction p = predict_pingpong(*plans, m, 1);
        EXPECT_NEAR(free ? p.signal_seconds : p.seconds, want, 1e-12 * want) << kv_once << " " << rate << " " << free << " " << cpu;
      }
    }
  }
}

class NoSeconds final : public AttentionCostModel {
 public:
  double task_cost(int64_t, int64_t) const override { return 0; }
  std::string unit() const override { return "seconds"; }
};

// bytes[e][x][s * 4 + p]: exchange e (dispatch, return, backward dispatch, backward return) of
// nano-batch x from rank s to rank p of 4, each plan's own K/V with its relays applied to the
// dispatch (the relay's share moves from the holder to the relay); `relayed` counts the
// relayed blocks, `both_send` the dispatches in which ranks 0 and 1 both send to host 1.
using HandBytes = std::array<std::array<std::vector<int64_t>, 2>, 4>;
HandBytes two_host_bytes(const NanoPlans& plans, const std::vector<int64_t>& host, size_t& relayed, size_t& both_send) {
  HandBytes bytes;
  relayed = both_send = 0;
  for (size_t x = 0; x < 2; ++x) {
    const Plan& nano = plans.nano[x];
    for (auto& e : bytes) e[x].assign(16, 0);
    for (size_t s = 0; s < 4; ++s) {
      for (size_t p = 0; p < 4; ++p) {
        if (s == p) continue;
        bytes[0][x][s * 4 + p] = pair_bytes(nano, {ExchangeKind::kQ, ExchangeKind::kKv}, nullptr, s, p);
        bytes[1][x][s * 4 + p] = pair_bytes(nano, {ExchangeKind::kOLse}, nullptr, s, p);
        bytes[2][x][s * 4 + p] = pair_bytes(nano, {ExchangeKind::kDO}, nullptr, s, p);
        bytes[3][x][s * 4 + p] = pair_bytes(nano, {ExchangeKind::kDQ, ExchangeKind::kDKv}, nullptr, s, p);
      }
    }
    for (const RelayedBlock& r : kv_relay(nano, host)) {
      const int64_t n = r.rows * nano.ranks[static_cast<size_t>(r.server)].exchange(ExchangeKind::kKv).row_bytes;
      bytes[0][x][static_cast<size_t>(r.holder * 4 + r.server)] -= n;
      bytes[0][x][static_cast<size_t>(r.relay * 4 + r.server)] += n;
      ++relayed;
    }
    both_send += bytes[0][x][0 * 4 + 2] + bytes[0][x][0 * 4 + 3] > 0 && bytes[0][x][1 * 4 + 2] + bytes[0][x][1 * 4 + 3] > 0;
  }
  return bytes;
}

// Two ranks per host, one layer, written out from the contract (pingpong_model.h) with the
// links as hosts have them: between hosts a host's ranks share its one outgoing and one
// incoming direction (tbf on the host's end), inside a host each rank has its own; K/V blocks
// a host's second server needs go once across, to the relay (plan/topology_relay.h), and on
// from it inside the host. Ranks 0 and 1 each hold a long document, ranks 2 and 3 short ones,
// planned with the topology. A timeline with a link per rank (the old model) differs.
TEST(PingPongModel, TwoHostsOfTwoRanksOneLayerByHand) {
  const LinearSeconds seconds;
  Batch b = bench_batch(4, 4096);
  b.per_rank[1] = {{1000, 0, 4096, 4096}};
  const std::vector<int64_t> host = {0, 0, 1, 1};
  // Tolerance 0.05 at the default price: a plan where both of host 0's ranks send across and a
  // K/V block is relayed (the asserts below; at tolerance 0 the planner now prefers a better
  // balanced plan without a relay, docs/scheduler.md "Tightening").
  ScheduleOptions o = opts(0.05);
  o.topology.host = host;
  o.topology.inter_host_price = 8;
  auto plans = plan_nano_batches(b, SchedulerSpec{}, o);
  ASSERT_TRUE(plans.ok()) << plans.status().to_string();
  const double inter = 2e6, intra = 5e7, msg = 2e-4;
  AutoToleranceModel m = model(&seconds, inter);
  m.intra_host_bytes_per_second = intra;
  m.message_seconds = msg;
  m.kv_once = false;
  size_t relayed = 0, both_send = 0;
  const HandBytes bytes = two_host_bytes(*plans, host, relayed, both_send);
  ASSERT_GT(both_send, 0u);  // host 0's two ranks share its link in a dispatch
  ASSERT_GT(relayed, 0u);    // and a K/V block is relayed
  double c[4] = {0, 0, 0, 0};
  // [class][endpoint]: class 1 (between hosts) by host, class 0 by rank.
  double out[2][4] = {}, in[2][4] = {};
  auto post = [&](int e, size_t x) {
    std::array<double, 4> done = {c[0], c[1], c[2], c[3]};
    for (size_t s = 0; s < 4; ++s) {
      for (size_t p = 0; p < 4; ++p) {
        if (s == p) continue;
        const int k = host[s] != host[p] ? 1 : 0;
        const size_t so = k == 1 ? static_cast<size_t>(host[s]) : s, pi = k == 1 ? static_cast<size_t>(host[p]) : p;
        const double start = std::max({c[s], c[p], out[k][so], in[k][pi]});
        out[k][so] = in[k][pi] = start + static_cast<double>(bytes[e][x][s * 4 + p]) / (k == 1 ? inter : intra);
        done[s] = std::max(done[s], out[k][so] + msg);
        done[p] = std::max(done[p], out[k][so] + msg);
      }
    }
    return done;
  };
  auto wait = [&](const std::array<double, 4>& d) {
    for (size_t r = 0; r < 4; ++r) c[r] = std::max(c[r], d[r]);
  };
  // Per rank: linear (forward 2e-5, backward 4e-5 per row) and attention (0.3 forward, 0.7 backward).
  auto run = [&](size_t x, bool linear, bool backward) {
    for (size_t r = 0; r < 4; ++r) {
      if (linear) {
        c[r] += static_cast<double>(plans->split.tokens[r][x]) * (backward ? 4e-5 : 2e-5);
        continue;
      }
      double att = 0;
      for (const ServerTask& t : plans->nano[x].servers[r].tasks) {
        att += 1e-9 * static_cast<double>(causal_pairs(t.task.q_begin, t.task.q_end));
      }
      c[r] += (backward ? 0.7 : 0.3) * att;
    }
  };
  run(0, true, false);
  const auto d0 = post(0, 0);
  run(1, true, false);
  const auto d1 = post(0, 1);
  wait(d0);
  run(0, false, false);
  const auto o0 = post(1, 0);
  wait(d1);
  run(1, false, false);
  const auto o1 = post(1, 1);
  wait(o0);
  run(0, true, false);
  wait(o1);
  run(1, true, false);
  run(1, true, true);  // backward: pong first
  const auto e1 = post(2, 1);
  run(0, true, true);
  const auto e0 = post(2, 0);
  wait(e1);
  run(1, false, true);
  const auto r1 = post(3, 1);
  wait(e0);
  run(0, false, true);
  const auto r0 = post(3, 0);
  wait(r1);
  run(1, true, true);
  wait(r0);
  run(0, true, true);
  const double want = *std::max_element(c, c + 4);
  const PingPongPrediction p = predict_pingpong(*plans, m, 1);
  EXPECT_NEAR(p.seconds, want, 1e-12 * want) << "relayed blocks " << relayed;
}

// The messages' fixed cost, with (next to) no compute to hide it: each layer's dispatch and
// return follow each other in both directions (ping's and pong's side by side), so the signal
// step is 2 x 2 x layers messages long.
TEST(PingPongModel, MessagesCostTheirLatencyEvenWithoutBytes) {
  const NoSeconds none;
  const Batch b = bench_batch(2, 4096);
  auto plans = plan_nano_batches(b, SchedulerSpec{}, opts(0.05));
  ASSERT_TRUE(plans.ok());
  AutoToleranceModel m = model(&none, 1e9);
  m.linear_forward_seconds_per_row = 1e-15;
  m.linear_backward_seconds_per_row = 0;
  m.message_seconds = 1e-3;
  for (const int64_t layers : {1, 3}) {
    const PingPongPrediction p = predict_pingpong(*plans, m, layers);
    EXPECT_NEAR(p.signal_seconds, 4e-3 * static_cast<double>(layers), 1e-9) << layers;
    EXPECT_GT(p.seconds, p.signal_seconds);
  }
}

// --kv-once auto: on unless the timeline predicts off faster by the margin; on a free link on.
TEST(PingPongModel, KvOncePaysFollowsTheTimeline) {
  const LinearSeconds seconds;
  for (const int64_t ranks : {2, 4}) {
    const Batch b = bench_batch(ranks, 4096);
    auto plans = plan_nano_batches(b, SchedulerSpec{}, opts(0.05));
    ASSERT_TRUE(plans.ok());
    for (const double rate : {1e6, 3e7, 1e9, kMaxLinkBandwidth}) {
      AutoToleranceModel m = model(&seconds, rate);
      const double on = predict_pingpong(*plans, m, 2).seconds;
      m.kv_once = false;
      const double off = predict_pingpong(*plans, m, 2).seconds;
      EXPECT_EQ(kv_once_pays(*plans, m, 2), !(off < (1 - kAutoToleranceMargin) * on)) << ranks << " " << rate;
      if (rate == kMaxLinkBandwidth) {
        EXPECT_TRUE(kv_once_pays(*plans, m, 2));
      }
    }
  }
  AutoToleranceModel single = model(&seconds, 1e6);
  single.overlap = false;  // no timeline: on
  auto plans = plan_nano_batches(bench_batch(2, 4096), SchedulerSpec{}, opts(0.05));
  ASSERT_TRUE(plans.ok());
  EXPECT_TRUE(kv_once_pays(*plans, single, 2));
}

// Where the link costs nothing (the fastest rate a model takes), auto plans the batch exactly
// as the default tolerance and cut do: the same plans, byte for byte (their JSON with every
// task and exchange), on bench train's batch and on drawn batches.
TEST(PingPongModel, FreeLinkPlansAsTheDefault) {
  const LinearSeconds seconds;
  std::vector<Batch> all = {bench_batch(2, 8192), bench_batch(4, 4096)};
  for (const char* dist : {"prolong", "pretrain"}) {
    const std::vector<Batch> drawn = test::drawn_batches(dist, 4, 8192, 3, 5);
    all.insert(all.end(), drawn.begin(), drawn.end());
  }
  AutoToleranceModel m = model(&seconds, kMaxLinkBandwidth);
  m.intra_host_bytes_per_second = kMaxLinkBandwidth;
  for (const Batch& b : all) {
    ScheduleOptions o = opts(0.05);
    o.model.n_layers = 2;
    auto c = choose_tolerance(b, SchedulerSpec{}, o, m);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->tolerance, 0.05);
    EXPECT_EQ(c->cut_fraction, 0);
    ScheduleOptions chosen = o;
    chosen.tolerance = c->tolerance;
    auto a = plan_nano_batches(b, SchedulerSpec{}, chosen, c->cut_fraction);
    auto d = plan_nano_batches(b, SchedulerSpec{}, o);
    ASSERT_TRUE(a.ok() && d.ok());
    EXPECT_EQ(plan_to_json(a->full).dump(), plan_to_json(d->full).dump());
    for (size_t x = 0; x < 2; ++x) {
      EXPECT_EQ(plan_to_json(a->nano[x]).dump(), plan_to_json(d->nano[x]).dump());
    }
  }
}

}  // namespace
}  // namespace distca
