// The simulator's network model (src/sim/network.h): every term against a hand-computed closed
// form (one message below / at / above the half-bandwidth size, a two-unit and a four-unit
// all-to-all of a given byte matrix, incast, the rings), the invariants (no bytes and no
// message cost nothing; more bytes or one more message are never faster), the peer lists'
// bookkeeping (sorted, deduplicated, checked bounds), and the plan's message pairs against a
// byte matrix built by hand from traffic.h's rules, pair by pair, for every exchange; through
// the CAD engine, signal mode is ping-pong's messages without their bytes; through the engines
// by hand: a CP ring of 4 units, a colocated incast, CAD's latencies on 3 units.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include "distca/core/specs.h"
#include "distca/cost/analytic.h"
#include "distca/data/workload.h"
#include "distca/plan/cad.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/pool.h"
#include "distca/plan/traffic.h"
#include "distca/sim/simulator.h"
#include "network.h"
#include "sim_test_util.h"

namespace distca::sim::detail {
namespace {

// 8 GPUs x 50 GB/s, 10 us per message: the h200 preset's unit.
const Link kLink{8 * 50e9, 10e-6};

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

// The all-to-all of a dense byte matrix, the engines' per-unit form summed here: bytes[i * n + j]
// is what unit i sends unit j (the diagonal is ignored; entries > 0 are messages). Returns the
// slowest unit's part; unit_seconds (if not null) gets every unit's part.
double all_to_all_seconds(const Link& link, int64_t n, const std::vector<double>& bytes,
                          std::vector<double>* unit_seconds = nullptr) {
  const auto N = static_cast<size_t>(n);
  std::vector<double> sent(N, 0.0), recv(N, 0.0);
  std::vector<int64_t> sends(N, 0), receives(N, 0);
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = 0; j < N; ++j) {
      const double b = bytes[i * N + j];
      if (i == j || !(b > 0)) continue;
      sent[i] += b;
      recv[j] += b;
      ++sends[i];
      ++receives[j];
    }
  }
  double worst = 0;
  if (unit_seconds != nullptr) unit_seconds->assign(N, 0.0);
  for (size_t i = 0; i < N; ++i) {
    const double t = all_to_all_unit_seconds(link, sent[i], recv[i], sends[i], receives[i]);
    if (unit_seconds != nullptr) (*unit_seconds)[i] = t;
    worst = std::max(worst, t);
  }
  return worst;
}

TEST(NetworkLink, MessageCostAndHalfBandwidthSize) {
  const double B = kLink.bytes_per_second, lat = kLink.latency;
  const double s_half = kLink.half_bandwidth_bytes();
  EXPECT_DOUBLE_EQ(s_half, lat * B);  // 4 MB per unit = 500 KB per GPU
  EXPECT_EQ(kLink.message_seconds(0), 0.0);
  EXPECT_EQ(kLink.effective_bandwidth(0), 0.0);
  // bw(s) = B s / (s + s_half): below, at and above the half-bandwidth size.
  for (const double s : {s_half / 4, s_half, 4 * s_half, 1e3 * s_half}) {
    EXPECT_LT(rel(kLink.message_seconds(s), lat + s / B), 1e-15);
    EXPECT_LT(rel(kLink.effective_bandwidth(s), B * s / (s + s_half)), 1e-12);
  }
  EXPECT_LT(rel(kLink.effective_bandwidth(s_half / 4), B / 5), 1e-12);
  EXPECT_LT(rel(kLink.effective_bandwidth(s_half), B / 2), 1e-12);
  EXPECT_LT(rel(kLink.effective_bandwidth(4 * s_half), 0.8 * B), 1e-12);
  EXPECT_LT(kLink.effective_bandwidth(s_half), kLink.effective_bandwidth(2 * s_half));
  EXPECT_DOUBLE_EQ(p2p_seconds(kLink, 3e6), lat + 3e6 / B);
}

TEST(NetworkAllToAll, TwoUnitsIsOneMessageEachWay) {
  // Unit 0 sends a, unit 1 sends b: each sends one message and receives one, full duplex.
  const double a = 6e6, b = 2e6;
  std::vector<double> unit;
  const double t = all_to_all_seconds(kLink, 2, {0, a, b, 0}, &unit);
  const double want = kLink.latency + std::max(a, b) / kLink.bytes_per_second;
  EXPECT_LT(rel(t, want), 1e-15);
  ASSERT_EQ(unit.size(), 2u);
  EXPECT_LT(rel(unit[0], want), 1e-15);  // sends a, receives b
  EXPECT_LT(rel(unit[1], want), 1e-15);  // receives a
  // One way only: the receiver's part is the same message.
  EXPECT_LT(rel(all_to_all_seconds(kLink, 2, {0, a, 0, 0}), kLink.latency + a / kLink.bytes_per_second), 1e-15);
  // The diagonal is not a message.
  EXPECT_EQ(all_to_all_seconds(kLink, 2, {5e6, 0, 0, 7e6}), 0.0);
}

TEST(NetworkAllToAll, FourUnitsByHand) {
  // bytes[i][j] from i to j (MB):
  //        to 0  1  2  3
  //   0  [  -  4  0  2 ]   unit 0: sends 2 msgs / 6 MB, receives 1 msg / 1 MB
  //   1  [  1  -  3  0 ]   unit 1: sends 2 / 4,  receives 2 / 4+8 = 12
  //   2  [  0  8  -  0 ]   unit 2: sends 1 / 8,  receives 2 / 3+5 = 8
  //   3  [  0  0  5  - ]   unit 3: sends 1 / 5,  receives 1 / 2
  const double M = 1e6;
  const std::vector<double> bytes = {0, 4 * M, 0, 2 * M, 1 * M, 0, 3 * M, 0, 0, 8 * M, 0, 0, 0, 0, 5 * M, 0};
  const double lat = kLink.latency, B = kLink.bytes_per_second;
  const double want[4] = {std::max(2 * lat + 6 * M / B, 1 * lat + 1 * M / B),
                          std::max(2 * lat + 4 * M / B, 2 * lat + 12 * M / B),
                          std::max(1 * lat + 8 * M / B, 2 * lat + 8 * M / B),
                          std::max(1 * lat + 5 * M / B, 1 * lat + 2 * M / B)};
  std::vector<double> unit;
  const double t = all_to_all_seconds(kLink, 4, bytes, &unit);
  for (int i = 0; i < 4; ++i) EXPECT_LT(rel(unit[static_cast<size_t>(i)], want[i]), 1e-15) << i;
  EXPECT_LT(rel(t, 2 * lat + 12 * M / B), 1e-15);  // unit 1's receive side
  // The per-unit form (totals + message counts, what the engines accumulate) agrees.
  EXPECT_DOUBLE_EQ(all_to_all_unit_seconds(kLink, 4 * M, 12 * M, 2, 2), unit[1]);
  // The old bandwidth-only formula (lat + max(sent, recv) / B) is the one-message case and a
  // lower bound here.
  EXPECT_GT(t, lat + 12 * M / B);
}

TEST(NetworkAllToAll, IncastPaysEveryMessageAtTheReceiver) {
  // Three senders to unit 0, s bytes each: the receiver's NIC takes 3 messages and 3 s bytes;
  // each sender one message.
  const double s = 1e6, lat = kLink.latency, B = kLink.bytes_per_second;
  std::vector<double> bytes(16, 0.0);
  for (int i = 1; i < 4; ++i) bytes[static_cast<size_t>(i) * 4 + 0] = s;
  std::vector<double> unit;
  const double t = all_to_all_seconds(kLink, 4, bytes, &unit);
  EXPECT_LT(rel(unit[0], 3 * lat + 3 * s / B), 1e-15);
  for (int i = 1; i < 4; ++i) EXPECT_LT(rel(unit[static_cast<size_t>(i)], lat + s / B), 1e-15);
  EXPECT_DOUBLE_EQ(t, unit[0]);
  // The same bytes as one message from one sender cost one latency less twice over.
  EXPECT_LT(rel(all_to_all_seconds(kLink, 2, {0, 0, 3 * s, 0}), lat + 3 * s / B), 1e-15);
}

TEST(NetworkAllToAll, NoBytesNoCostAndMoreIsNeverFaster) {
  EXPECT_EQ(all_to_all_seconds(kLink, 4, std::vector<double>(16, 0.0)), 0.0);
  EXPECT_EQ(all_to_all_unit_seconds(kLink, 0, 0, 0, 0), 0.0);
  // Signal mode: messages without payload cost their latencies.
  EXPECT_DOUBLE_EQ(all_to_all_unit_seconds(kLink, 0, 0, 3, 2), 3 * kLink.latency);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> size(0, 8e6);
  std::bernoulli_distribution present(0.4);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 2 + trial % 7;
    const auto N = static_cast<size_t>(n);
    std::vector<double> bytes(N * N, 0.0);
    for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = present(rng) ? size(rng) : 0.0;
    const double t = all_to_all_seconds(kLink, n, bytes);
    const size_t k = static_cast<size_t>(trial) % bytes.size();
    if (k / N == k % N) continue;  // the diagonal is no message
    std::vector<double> more = bytes;
    more[k] += 1e5;  // more bytes on a pair (a new message when it had none)
    EXPECT_GE(all_to_all_seconds(kLink, n, more), t) << trial;
  }
}

TEST(NetworkRings, AllReduceClosedForm) {
  const double lat = kLink.latency, B = kLink.bytes_per_second;
  double moved = -1;
  EXPECT_EQ(ring_all_reduce_seconds(kLink, 1, 1e9, &moved), 0.0);
  EXPECT_EQ(moved, 0.0);
  const double t = ring_all_reduce_seconds(kLink, 8, 1e9, &moved);
  EXPECT_LT(rel(moved, 2.0 * 7 / 8 * 1e9), 1e-15);
  EXPECT_LT(rel(t, 2 * 7 * lat + moved / B), 1e-15);
  EXPECT_GT(ring_all_reduce_seconds(kLink, 8, 2e9), t);
}

TEST(NetworkPeers, SortedDeduplicatedTransposedAndMerged) {
  PeerLists m(70);
  m.add(65, 69);
  m.add(0, 69);
  m.add(0, 1);
  m.add(0, 69);  // twice: one message
  m.add(3, 3);   // the diagonal is no message
  EXPECT_FALSE(m.normalized());
  m.normalize();
  EXPECT_EQ(m.size(), 3);
  EXPECT_FALSE(m.has(3, 3));
  EXPECT_TRUE(m.has(0, 1) && m.has(0, 69) && m.has(65, 69));
  std::vector<int64_t> s, r;
  m.counts(s, r);
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[65], 1);
  EXPECT_EQ(r[69], 2);
  EXPECT_EQ(r[1], 1);
  EXPECT_EQ(r[3], 0);
  const PeerLists t = m.transposed();
  EXPECT_TRUE(t.normalized());
  EXPECT_EQ(t.size(), 3);
  EXPECT_TRUE(t.has(69, 0) && t.has(69, 65) && t.has(1, 0));
  EXPECT_FALSE(t.has(0, 69));
  EXPECT_EQ(t.transposed().size(), 3);
  EXPECT_TRUE(t.transposed().has(0, 69));
  PeerLists u(70);
  u.add(0, 69);  // already in m: the union counts it once
  u.add(2, 0);
  u.normalize();
  u.merge(m);
  EXPECT_EQ(u.size(), 4);
  u.counts(s, r);
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[2], 1);
  EXPECT_EQ(r[69], 2);
  // add_counts adds (a mixed tick's two directions are two exchanges: their counts add up).
  m.add_counts(s, r);
  EXPECT_EQ(s[0], 4);
  EXPECT_EQ(r[69], 4);
  EXPECT_TRUE(PeerLists(5).empty());
  EXPECT_FALSE(u.empty());
  // Insertion order does not matter: the same set gives the same lists.
  PeerLists a(70), b(70);
  for (const auto& [f, to] : std::vector<std::pair<int, int>>{{5, 7}, {1, 2}, {5, 1}, {69, 0}}) a.add(f, to);
  for (const auto& [f, to] : std::vector<std::pair<int, int>>{{69, 0}, {5, 1}, {1, 2}, {5, 7}, {1, 2}}) b.add(f, to);
  a.normalize();
  b.normalize();
  std::vector<int64_t> sa, ra, sb, rb;
  a.counts(sa, ra);
  b.counts(sb, rb);
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(ra, rb);
  EXPECT_EQ(a.size(), b.size());
}

TEST(NetworkPeersDeathTest, BoundsAndSizesAreChecked) {
  PeerLists m(4), other(5);
  EXPECT_DEATH(m.add(0, 4), "check failed");
  EXPECT_DEATH(m.add(-1, 2), "check failed");
  EXPECT_DEATH(m.merge(other), "check failed");
  m.add(0, 1);  // unnormalized: reading it is a bug
  std::vector<int64_t> s, r;
  EXPECT_DEATH(m.counts(s, r), "check failed");
}

// The per-(from, to) bytes of a plan, by traffic.h's rules written out here (forward Q h -> s
// and O + LSE s -> h per task served away; K/V once per (document, server) for the context
// rows [0, E) held elsewhere, E the largest q_end of the document's tasks on the server;
// backward dO h -> s, dQ s -> h, dK/dV s -> holder of every row received). [ranks x ranks].
struct HandBytes {
  int64_t n = 0;
  std::vector<double> q, kv, o_lse, d_o, dq, dkv;
  double at(const std::vector<double>& m, int64_t i, int64_t j) const { return m[static_cast<size_t>(i * n + j)]; }
};
HandBytes hand_bytes(const DocumentIndex& index, const std::vector<TaskPlacement>& tasks, const RowBytes& rb) {
  HandBytes h;
  h.n = index.ranks();
  const auto N = static_cast<size_t>(h.n);
  for (auto* m : {&h.q, &h.kv, &h.o_lse, &h.d_o, &h.dq, &h.dkv}) m->assign(N * N, 0.0);
  auto add = [&](std::vector<double>& m, int64_t i, int64_t j, double b) {
    if (i != j) m[static_cast<size_t>(i) * N + static_cast<size_t>(j)] += b;
  };
  std::map<std::pair<int64_t, int64_t>, int64_t> context_end;  // (doc, server) -> E
  for (const TaskPlacement& t : tasks) {
    const auto rows = static_cast<double>(t.q_end - t.q_begin);
    add(h.q, t.home, t.server, rows * static_cast<double>(rb.q));
    add(h.o_lse, t.server, t.home, rows * static_cast<double>(rb.o + rb.lse));
    add(h.d_o, t.home, t.server, rows * static_cast<double>(rb.o));
    add(h.dq, t.server, t.home, rows * static_cast<double>(rb.q));
    int64_t& e = context_end[{t.doc, t.server}];
    e = std::max(e, t.q_end);
  }
  for (const auto& [key, end] : context_end) {
    const auto [doc, server] = key;
    for (const HeldRun& run : index.runs(doc)) {
      const int64_t rows = std::min(run.end, end) - run.begin;
      if (rows <= 0) continue;
      add(h.kv, run.rank, server, static_cast<double>(rows * rb.kv));
      add(h.dkv, server, run.rank, static_cast<double>(rows * rb.kv));
    }
  }
  return h;
}

// add_plan_peers' pairs against the hand-made byte matrix, pair by pair, for every exchange
// CAD runs: dispatch (Q + K/V), its return (O + LSE: the query pairs reversed), the backward's
// dO (the query pairs) and its return (dQ + dK/dV: dispatch reversed). The matrix is first
// checked against compute_traffic's per-rank sums (so it is traffic.h's). Plain ranks and a
// pool of stages 0 and 2 of 3 over every unit (stage 1's units serve).
TEST(NetworkPeers, PlanPairsMatchTrafficBytes) {
  const ModelSpec m = model_preset("llama-8b").value();
  const RowBytes rb = row_bytes(m, 2);
  for (const bool pooled_case : {false, true}) {
    for (const uint64_t seed : {1u, 2u, 3u}) {
      WorkloadOptions w;
      w.dist = "prolong";
      w.ranks = 4;
      w.tokens_per_rank = 16384;
      w.batches = 2;
      w.seed = seed;
      const std::vector<Batch> mbs = make_batches(w).value();
      Batch b = mbs[0];
      std::vector<int64_t> unit_of;
      int64_t units = 4;
      if (pooled_case) {
        const std::vector<PoolMember> members = {{0, 0, false, &mbs[0]}, {2, 1, false, &mbs[1]}};
        const PooledBatch pb = pool_batches(members, 3, 4).value();
        b = pb.batch;
        unit_of = pb.unit_of;
        units = 12;
        ASSERT_EQ(unit_of.size(), 12u);
        EXPECT_EQ(unit_of[8], 8);  // stage 2's first unit; stage 1's units hold nothing and serve
      }
      ScheduleOptions so;
      so.model = m;
      so.tolerance = 0.05;
      const auto sched = schedule_cad(b, so, nullptr);
      ASSERT_TRUE(sched.ok()) << sched.status().to_string();
      const DocumentIndex index(sched->batch);
      const Traffic t = compute_traffic(index, sched->tasks, rb);
      const HandBytes h = hand_bytes(index, sched->tasks, rb);
      const int64_t n = h.n;
      for (int64_t i = 0; i < n; ++i) {
        double fs = 0, fr = 0, bs = 0, br = 0;
        for (int64_t j = 0; j < n; ++j) {
          fs += h.at(h.q, i, j) + h.at(h.kv, i, j) + h.at(h.o_lse, i, j);
          fr += h.at(h.q, j, i) + h.at(h.kv, j, i) + h.at(h.o_lse, j, i);
          bs += h.at(h.d_o, i, j) + h.at(h.dq, i, j) + h.at(h.dkv, i, j);
          br += h.at(h.d_o, j, i) + h.at(h.dq, j, i) + h.at(h.dkv, j, i);
        }
        const RankBytes& want = t.per_rank[static_cast<size_t>(i)];
        EXPECT_EQ(fs, static_cast<double>(want.fwd_sent)) << seed << " rank " << i;
        EXPECT_EQ(fr, static_cast<double>(want.fwd_recv)) << seed << " rank " << i;
        EXPECT_EQ(bs, static_cast<double>(want.bwd_sent)) << seed << " rank " << i;
        EXPECT_EQ(br, static_cast<double>(want.bwd_recv)) << seed << " rank " << i;
      }
      PeerLists dispatch(units), queries(units);
      add_plan_peers(index, sched->tasks, pooled_case ? &unit_of : nullptr, dispatch, queries);
      const PeerLists ret = queries.transposed(), bwd_ret = dispatch.transposed();
      auto unit = [&](int64_t r) { return pooled_case ? unit_of[static_cast<size_t>(r)] : r; };
      int64_t d_pairs = 0, r_pairs = 0, bd_pairs = 0, br_pairs = 0;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ui = unit(i), uj = unit(j);
          const bool d = h.at(h.q, i, j) + h.at(h.kv, i, j) > 0, r = h.at(h.o_lse, i, j) > 0;
          const bool bd = h.at(h.d_o, i, j) > 0, br = h.at(h.dq, i, j) + h.at(h.dkv, i, j) > 0;
          EXPECT_EQ(dispatch.has(ui, uj), d) << seed << " " << i << " -> " << j;
          EXPECT_EQ(ret.has(ui, uj), r) << seed << " " << i << " -> " << j;
          EXPECT_EQ(queries.has(ui, uj), bd) << seed << " " << i << " -> " << j;
          EXPECT_EQ(bwd_ret.has(ui, uj), br) << seed << " " << i << " -> " << j;
          d_pairs += d;
          r_pairs += r;
          bd_pairs += bd;
          br_pairs += br;
        }
      }
      // Nothing outside the pooled units' pairs.
      EXPECT_EQ(dispatch.size(), d_pairs);
      EXPECT_EQ(ret.size(), r_pairs);
      EXPECT_EQ(queries.size(), bd_pairs);
      EXPECT_EQ(bwd_ret.size(), br_pairs);
      EXPECT_GT(d_pairs, 0) << "seed " << seed << ": the plan moved nothing";
      EXPECT_GT(r_pairs, 0) << "seed " << seed << ": no query served away";
    }
  }
}

// Through the CAD engine: signal mode sends the plan's messages without payload, so with free
// bandwidth ping-pong and signal run the same messages and take the same time; with latency
// the exchanges cost more than nothing (the plan moves bytes), and latency never speeds up.
TEST(NetworkEngine, SignalIsPingPongWithoutBytes) {
  WorkloadOptions w;
  w.dist = "prolong";
  w.ranks = 4;
  w.tokens_per_rank = 32768;
  w.batches = 1;
  w.seed = 5;
  const std::vector<Batch> mbs = make_batches(w).value();
  auto run = [&](const char* strategy, double bw, double lat) {
    SimOptions o;
    o.model = model_preset("llama-8b").value();
    o.cluster.hw = hardware_preset("h200").value();
    o.cluster.hw.inter_node_bw = bw;
    o.cluster.hw.inter_node_latency = lat;
    o.cluster.gpus_per_node = 8;
    o.cluster.gpus = 32;
    o.strategy = parse_strategy(strategy).value();
    auto r = simulate(o, mbs);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r->iteration_seconds : 0.0;
  };
  const double pp = run("cad:pingpong", 1e30, 10e-6), sig = run("cad:signal", 1e30, 10e-6);
  EXPECT_LT(rel(pp, sig), 1e-12);
  EXPECT_GT(run("cad:signal", 50e9, 10e-6), run("cad:signal", 50e9, 0.0));
  EXPECT_GE(run("cad:single-stream", 50e9, 100e-6), run("cad:single-stream", 50e9, 10e-6));
}


// ---- through the engines, by hand ------------------------------------------------------------

constexpr double kLat = 10e-6, kB = 8 * 50e9;  // the h200 preset's unit link

// The seconds of every trace span named `name` on unit `u` (forward and backward alike).
std::vector<double> span_seconds(const SimResult& r, const std::string& name, int64_t u) {
  std::vector<double> out;
  for (const TraceEvent& e : r.events) {
    if (e.name == name && e.pid == u) out.push_back((e.end_us - e.start_us) * 1e-6);
  }
  return out;
}

// percp:4 over 4 units, one document of 4T tokens: percp_repack gives unit i the head
// [iT/2, (i+1)T/2) and the tail [(7-i)T/2, (8-i)T/2), T rows. The group all-gathers the whole
// document: each unit sends its T rows to the 3 others and receives their 3T rows, 3 messages
// each way, so its part is 3 lat + 3T kv / B; the backward gathers again and reduce-scatters
// the dK/dV partials (the same part again).
TEST(NetworkEngine, PerCpAllGatherOfFourUnitsByHand) {
  const int64_t T = 8192;
  SimOptions o = testing::options("percp:4", 4);
  o.grad_sync = false;
  o.lm_head = false;
  o.record_events = true;
  const SimResult r = testing::run(o, {pack_documents({4 * T}, 4, T, Layout::kContiguous)});
  const double rows = static_cast<double>(row_bytes(o.model, 2).kv) * static_cast<double>(3 * T);  // 3T rows
  const double part = 3 * kLat + rows / kB;
  for (int64_t u = 0; u < 4; ++u) {
    const auto U = static_cast<size_t>(u);
    const std::vector<double> gathers = span_seconds(r, "K/V all-gather", u);
    EXPECT_EQ(gathers.size(), 64u) << u;  // one per layer, forward and backward
    for (const double s : gathers) EXPECT_LT(rel(s, part), 1e-9) << u;
    const std::vector<double> refetches = span_seconds(r, "K/V re-fetch (recompute)", u);
    EXPECT_EQ(refetches.size(), 32u) << u;
    for (const double s : refetches) EXPECT_LT(rel(s, part), 1e-9) << u;
    const std::vector<double> scatters = span_seconds(r, "dK/dV reduce-scatter", u);
    EXPECT_EQ(scatters.size(), 32u) << u;
    for (const double s : scatters) EXPECT_LT(rel(s, part), 1e-9) << u;
    // The forward's gather, the recompute's, the backward's, and the reduce-scatter.
    EXPECT_LT(rel(r.per_unit[U].bytes_received, 32 * 4 * rows), 1e-12) << u;
    EXPECT_LT(rel(r.per_unit[U].bytes_sent, 32 * 4 * rows), 1e-12) << u;
  }
}

// Colocated packing of one document of 3T tokens over 3 units: unit 2 fetches T rows from each
// of units 0 and 1 (incast, k_in = 2), unit 1 fetches T rows from unit 0 and sends its own to
// unit 2, unit 0 sends to both (k_out = 2).
TEST(NetworkEngine, ColocatedIncastPaysEveryMessage) {
  const int64_t T = 8192;
  SimOptions o = testing::options("colocated", 3);
  o.grad_sync = false;
  o.lm_head = false;
  o.record_events = true;
  const SimResult r = testing::run(o, {pack_documents({3 * T}, 3, T, Layout::kContiguous)});
  const double rows = static_cast<double>(T) * static_cast<double>(row_bytes(o.model, 2).kv);
  const double want[3] = {2 * kLat + 2 * rows / kB, kLat + rows / kB, 2 * kLat + 2 * rows / kB};
  for (int64_t u = 0; u < 3; ++u) {
    const std::vector<double> spans = span_seconds(r, "K/V fetch", u);
    ASSERT_EQ(spans.size(), 32u) << u;
    for (const double s : spans) EXPECT_LT(rel(s, want[u]), 1e-9) << u;
    // The backward's dK/dV return goes over the same pairs reversed: the same part.
    for (const double s : span_seconds(r, "dK/dV return", u)) EXPECT_LT(rel(s, want[u]), 1e-9) << u;
  }
}

// CAD on 3 units, latency only (free bandwidth, free compute): unit 0 holds one long document,
// units 1 and 2 short ones (under two tiles: never split). The plan serves shards of the long
// document on units 1 and 2 (checked: they serve more pairs than their own), so in every
// exchange unit 0 talks to 2 peers. On the link model (plan/link_model.h) a message's latency
// does not hold its link: every exchange costs one latency however many peers a unit has
// (the all-to-all pricing charged max(k_out, k_in) lat = 2 lat).
TEST(NetworkEngine, ThreeUnitCadPaysOneLatencyPerExchange) {
  const int64_t T = 32768;
  std::vector<int64_t> lengths = {T};
  for (int64_t i = 0; i < 2 * T / 128; ++i) lengths.push_back(128);
  const Batch b = pack_documents(lengths, 3, T, Layout::kContiguous);
  const double lat = 1e-3;
  auto run = [&](const char* strategy) {
    SimOptions o = testing::options(strategy, 3);
    o.grad_sync = false;
    o.lm_head = false;
    o.cluster.hw.inter_node_bw = 1e30;
    o.cluster.hw.inter_node_latency = lat;
    o.cluster.hw.peak_flops = 1e40;
    return testing::run(o, {b});
  };
  const double own_pairs = static_cast<double>(T / 128) * 128.0 * 129.0 / 2.0 * 32;  // 32 layers
  const SimResult r = run("cad:single-stream");
  ASSERT_EQ(r.per_unit.size(), 3u);
  EXPECT_GT(r.per_unit[1].attention_pairs, own_pairs);
  EXPECT_GT(r.per_unit[2].attention_pairs, own_pairs);
  // 4 exchanges per layer (Q/KV, O + LSE, dO, dQ/dKV) of one latency each.
  EXPECT_LT(rel(r.iteration_seconds, 32 * 4 * lat), 1e-9) << r.iteration_seconds;
  // Signal: ping's and pong's exchanges are posted at the same time (free compute) and end
  // together, one latency later: again 4 latencies per layer.
  const SimResult sig = run("cad:signal");
  EXPECT_LT(rel(sig.iteration_seconds, 32 * 4 * lat), 1e-9) << sig.iteration_seconds;
}

// The spans named `name` on unit u starting at or after `from` seconds, in time order (seconds).
std::vector<std::pair<double, double>> spans_after(const SimResult& r, const std::string& name, int64_t u, double from) {
  std::vector<std::pair<double, double>> out;
  for (const TraceEvent& e : r.events) {
    if (e.name == name && e.pid == u && e.start_us * 1e-6 >= from) out.emplace_back(e.start_us * 1e-6, e.end_us * 1e-6);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Ping-pong's backward runs its lanes as the runtime's TickRunner does: pong first (ping's
// pre-CA backward reads pong's dK/dV partials), so pong's dQ/dKV return of a layer is waited
// for before the next layer's linear work. One layer, two units over a slow link: the
// backward's end, composed by hand from the trace's compute spans and exchange durations in
// the runtime's order, is the engine's; ping first would end elsewhere (checked: the order
// matters here).
TEST(NetworkEngine, PingPongBackwardRunsPongFirstAsTheRuntime) {
  const int64_t T = 16384;
  std::vector<int64_t> lengths = {T};
  for (int64_t i = 0; i < T / 512; ++i) lengths.push_back(512);
  SimOptions o = testing::options("cad:pingpong", 2);
  o.model.n_layers = 1;
  o.grad_sync = false;
  o.lm_head = false;
  o.record_events = true;
  o.cluster.hw.inter_node_bw = 0.2e9;  // exchanges as long as the compute they hide behind
  const SimResult r = testing::run(o, {pack_documents(lengths, 2, T, Layout::kContiguous)});
  ASSERT_EQ(r.per_unit.size(), 2u);
  // The forward ends with its tail's pong linear work on each unit; the network is free by
  // then (the tail waited for the forward's returns).
  double c[2], fwd_end = 0;
  for (int64_t u = 0; u < 2; ++u) {
    const auto tail = spans_after(r, "fwd linear pong", u, 0);
    ASSERT_FALSE(tail.empty());
    c[u] = tail.back().second;
    fwd_end = std::max(fwd_end, c[u]);
  }
  for (const char* n : {"fwd linear ping", "fwd linear pong", "fwd attention ping", "fwd attention pong"}) {
    for (int64_t u = 0; u < 2; ++u) {
      for (const auto& s : spans_after(r, n, u, 0)) ASSERT_LE(s.second, fwd_end) << n;
    }
  }
  // The backward's compute per unit: slot 0's linear, its attention, then the tail's linear.
  double lin[2][2][2] = {}, att[2][2] = {};  // lin[u][x][slot], att[u][x]
  const char* kLinName[2] = {"bwd linear ping", "bwd linear pong"};
  const char* kAttName[2] = {"bwd attention ping", "bwd attention pong"};
  for (int64_t u = 0; u < 2; ++u) {
    for (int x = 0; x < 2; ++x) {
      const auto l = spans_after(r, kLinName[x], u, c[u]);
      ASSERT_EQ(l.size(), 2u) << u << " " << x;  // every unit holds rows of both nano-batches
      for (int k = 0; k < 2; ++k) lin[u][x][k] = l[static_cast<size_t>(k)].second - l[static_cast<size_t>(k)].first;
      for (const auto& a : spans_after(r, kAttName[x], u, c[u])) att[u][x] += a.second - a.first;
    }
  }
  // Each exchange's collective length (network.h; 0 when the nano-batch moves nothing).
  auto length = [&](const std::string& name) {
    double len = 0;
    for (int64_t u = 0; u < 2; ++u) {
      for (const auto& s : spans_after(r, name, u, c[u])) len = std::max(len, s.second - s.first);
    }
    return len;
  };
  const double dis[2] = {length("dO dispatch ping"), length("dO dispatch pong")};
  const double ret[2] = {length("dQ/dKV return ping"), length("dQ/dKV return pong")};
  ASSERT_GT(dis[0] + dis[1], 0);
  ASSERT_GT(ret[0] + ret[1], 0);
  // The backward by hand, lanes in `order`: linear and dispatch per lane, then attention and
  // return per lane, then the tail's linear per lane after its return. A collective starts
  // when every unit issued it and the previous one ended.
  auto by_hand = [&](const int (&order)[2]) {
    double t[2] = {c[0], c[1]}, net = fwd_end, d_end[2], r_end[2];
    for (const int x : order) {
      for (int u = 0; u < 2; ++u) t[u] += lin[u][x][0];
      d_end[x] = std::max({net, t[0], t[1]}) + dis[x];
      net = d_end[x];
    }
    for (const int x : order) {
      for (int u = 0; u < 2; ++u) t[u] = std::max(t[u], d_end[x]) + att[u][x];
      r_end[x] = std::max({net, t[0], t[1]}) + ret[x];
      net = r_end[x];
    }
    for (const int x : order) {
      for (int u = 0; u < 2; ++u) t[u] = std::max(t[u], r_end[x]) + lin[u][x][1];
    }
    return std::max(t[0], t[1]);
  };
  const double pong_first = by_hand({1, 0}), ping_first = by_hand({0, 1});
  EXPECT_LT(rel(r.iteration_seconds, pong_first), 1e-9) << r.iteration_seconds << " vs " << pong_first;
  EXPECT_GT(rel(ping_first, pong_first), 1e-3) << "the lane order does not matter in this test";
}


// A backward layer of per-document CP reads in the trace as it runs: the linear backward (with
// the recompute), the recompute's K/V re-fetch, the attention backward's all-gather, the
// attention backward, then the reduce-scatter of the dK/dV it produced; back to back (the
// group's members arrive together), so the layer takes their sum.
TEST(NetworkEngine, BackwardSpansRunRecomputeRefetchAttentionReturn) {
  const int64_t T = 8192;
  SimOptions o = testing::options("percp:2", 2);
  o.grad_sync = false;
  o.lm_head = false;
  o.record_events = true;
  const SimResult r = testing::run(o, {pack_documents({2 * T}, 2, T, Layout::kContiguous)});
  const std::vector<std::string> order = {"bwd linear", "K/V re-fetch (recompute)", "K/V all-gather", "bwd attention",
                                          "dK/dV reduce-scatter"};
  for (int64_t u = 0; u < 2; ++u) {
    std::vector<const TraceEvent*> bwd;
    for (const TraceEvent& e : r.events) {
      if (e.pid == u && std::find(order.begin(), order.end(), e.name) != order.end()) bwd.push_back(&e);
    }
    std::sort(bwd.begin(), bwd.end(), [](const TraceEvent* a, const TraceEvent* b) { return a->start_us < b->start_us; });
    // The forward's all-gathers come first.
    bwd.erase(bwd.begin(), std::find_if(bwd.begin(), bwd.end(), [](const TraceEvent* e) { return e->name == "bwd linear"; }));
    ASSERT_EQ(bwd.size(), 5u * 32) << u;
    for (size_t i = 0; i < bwd.size(); ++i) {
      EXPECT_EQ(bwd[i]->name, order[i % 5]) << u << " span " << i;
      if (i % 5 != 0) {
        EXPECT_DOUBLE_EQ(bwd[i]->start_us, bwd[i - 1]->end_us) << u << " span " << i;
      }
    }
  }
}

}  // namespace
}  // namespace distca::sim::detail
