// One link model for the ping-pong timeline and the simulator's CAD exchanges
// (plan/link_model.h): a hand-computed exchange with two ranks of a host sharing its link,
// and, for one plan, the simulator's exchanges posted on the model give the timeline's times.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "distca/data/batch.h"
#include "distca/data/workload.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/kv_once.h"
#include "distca/plan/link_model.h"
#include "distca/plan/nano_plan.h"
#include "distca/plan/pingpong_model.h"
#include "distca/plan/pool.h"
#include "cad_contribution.h"
#include "engine.h"
#include "network.h"
#include "sim_test_util.h"

namespace distca::sim::detail {
namespace {

constexpr double kRate = 1e6;  // bytes per second between hosts
constexpr double kLat = 1e-3;  // seconds per message

// 2 hosts x 2 ranks, everyone posts at 0; rank 0 sends B to rank 3 and rank 1 sends B to
// rank 2, B = one second of the link. By hand, pairs in (s, p) order: the empty (0,2) ends at
// lat; (0,3) holds host 0's outgoing and host 1's incoming direction over [0, 1] s and ends at
// 1 + lat; (1,2) waits for them and holds them over [1, 2] s, ending at 2 + lat; the empty
// (1,3) queues behind it (ends 2 + lat); host 1's messages back are empty on directions nobody
// used (end lat). So rank 0 completes at 1 + lat, ranks 1, 2 and 3 at 2 + lat. The all-to-all
// pricing (every unit's own NIC: one message of B each way) gives 1 + lat on every rank, and
// so does the link model without hosts (each rank its own link).
TEST(LinkModel, TwoRanksOfAHostShareItsLinkByHand) {
  const LinkRates rates{kRate, 8 * kRate, kLat};
  const std::vector<PairMessage> msgs = {{0, 3, kRate}, {1, 2, kRate}};
  ExchangeLinks shared(4, {0, 0, 1, 1}, rates);
  const ExchangeTimes t = shared.post({0, 0, 0, 0}, msgs);
  const std::vector<double> want = {1 + kLat, 2 + kLat, 2 + kLat, 2 + kLat};
  for (size_t r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(t.done[r], want[r]) << r;
  const Link old{kRate, kLat};
  for (size_t r = 0; r < 4; ++r) {
    const double sent = r < 2 ? kRate : 0, recv = r < 2 ? 0 : kRate;
    const double priced = all_to_all_unit_seconds(old, sent, recv, r < 2 ? 1 : 0, r < 2 ? 0 : 1);
    EXPECT_DOUBLE_EQ(priced, 1 + kLat) << r;
  }
  ExchangeLinks own(4, {}, rates);
  for (const double d : own.post({0, 0, 0, 0}, msgs).done) EXPECT_DOUBLE_EQ(d, 1 + kLat);
  // The next exchange queues behind this one on host 0's link: 0 -> 3 again, posted at 0,
  // starts when the direction frees at 2 s.
  const ExchangeTimes next = shared.post({0, 0, 0, 0}, {{0, 3, kRate}});
  EXPECT_DOUBLE_EQ(next.done[0], 3 + kLat);
  // Signal (free): the messages and their order stay, no bytes: one latency after the posts.
  ExchangeLinks sig(4, {0, 0, 1, 1}, rates);
  for (const double d : sig.post({0, 0.5, 0, 0}, msgs, true).done) EXPECT_DOUBLE_EQ(d, 0.5 + kLat);
}

// An empty message queues behind the bytes on its directions but holds neither: no hosts, 4
// ranks; 0 sends B to 1 (1 s) and 2 sends B to 3. Rank 2's empty message to rank 1 waits for
// rank 1's incoming direction (ends 1 + lat), but 2 -> 3 after it starts at 0 and ends at
// 1 + lat, not at 2 + lat behind it: every rank completes at 1 + lat. (At 512 units the
// opposite rule, an empty message holding its sender until its receiver is free, chained
// the units' queues and nearly doubled bench simulate's cad step.)
TEST(LinkModel, AnEmptyMessageHoldsNoDirection) {
  ExchangeLinks l(4, {}, LinkRates{kRate, kRate, kLat});
  const ExchangeTimes t = l.post({0, 0, 0, 0}, {{0, 1, kRate}, {2, 3, kRate}});
  for (size_t r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(t.done[r], 1 + kLat) << r;
}

// A pair's entries add up (a relay's negative entry included), whatever their order.
TEST(LinkModel, EntriesOfAPairAddUpInAnyOrder) {
  const LinkRates rates{kRate, 8 * kRate, kLat};
  ExchangeLinks a(3, {0, 0, 1}, rates), b(3, {0, 0, 1}, rates);
  const ExchangeTimes x = a.post({0, 0.25, 0}, {{0, 2, 300}, {1, 0, 50}, {0, 2, 200}, {0, 2, -100}});
  const ExchangeTimes y = b.post({0, 0.25, 0}, {{1, 0, 50}, {0, 2, 400}});
  EXPECT_EQ(x.done, y.done);
  EXPECT_DOUBLE_EQ(x.all_posted, 0.25);
}

// One plan, two books: the timeline's exchanges (plan/pingpong_model.h pingpong_exchanges,
// from the plan's layouts, K/V by the wire and relayed by the hosts) and the simulator's
// (cad_contribution.h, from the task lists and the relayed wire as plan_tick fills them) post
// the same messages,
// so the link model gives the same completion times bit for bit, for any posting times.
TEST(LinkModel, SimulatorAndTimelinePriceOnePlanAlike) {
  SimOptions o = testing::options("cad", 4);
  o.cluster.gpus_per_node = 1;
  o.cluster.gpus = 4;
  o.topology.host = {0, 0, 1, 1};
  const Rates R(o);
  // Rank 0 one long document, the others short ones: its shards go to every other rank,
  // two of them on host 1 (so K/V relays).
  std::vector<int64_t> lengths = {16384};
  for (int i = 0; i < 3 * 16384 / 512; ++i) lengths.push_back(512);
  const Batch batch = pack_documents(lengths, 4, 16384, Layout::kContiguous);
  const PooledBatch pooled = pool_tick(Tick{false, {PipeOp{0, 0, false}}}, std::vector<Batch>{batch}, 1, 4).value();
  ScheduleOptions so;
  so.model = o.model;
  so.dtype_bytes = o.dtype_bytes;
  so.tolerance = o.tolerance;
  so.cost = &R.cost;
  so.align_rows = o.attention_tile;
  so.topology.host = pooled_hosts(R, pooled);
  const NanoSchedule ns = schedule_nano_batches(pooled.batch, SchedulerSpec{}, so).value();
  const NanoPlans plans = plan_nano_batches(pooled.batch, SchedulerSpec{}, so).value();
  ASSERT_EQ(plans.full.hosts, (std::vector<int64_t>{0, 0, 1, 1}));
  const DocumentIndex index(ns.split.batch);
  const KvWireBytes wire = relayed_kv_wire(R, pooled, index, ns.full, ns.split);
  Contribution c;
  c.init(4);
  PlanStats ps;
  bool relayed = false, moved = false;
  for (int x = 0; x < 2; ++x) {
    fill_nano_contribution(R, pooled, index, ns.nano[static_cast<size_t>(x)], x, false, c, ps, &wire);
    const std::array<std::vector<PairMessage>, 4> tl = pingpong_exchanges(plans, true, static_cast<size_t>(x));
    for (const PairMessage& m : tl[0]) relayed = relayed || m.bytes < 0;
    const std::array<const Contribution::Messages*, 4> sim = {&c.fwd_dispatch_msgs[x], &c.fwd_return_msgs[x],
                                                              &c.bwd_dispatch_msgs[x], &c.bwd_return_msgs[x]};
    for (size_t k = 0; k < 4; ++k) {
      for (const std::vector<double>& posted : {std::vector<double>{0, 0, 0, 0}, std::vector<double>{0, 3e-3, 1e-3, 2e-3}}) {
        ExchangeLinks a(4, o.topology.host, R.cad_links), b(4, o.topology.host, R.cad_links);
        const ExchangeTimes ts = a.post(posted, *sim[k]);
        EXPECT_EQ(ts.done, b.post(posted, tl[k]).done) << "nano " << x << " exchange " << k;
        const double last = *std::max_element(posted.begin(), posted.end());
        moved = moved || *std::max_element(ts.done.begin(), ts.done.end()) > last + R.cad_links.message_seconds;
      }
    }
  }
  EXPECT_TRUE(relayed) << "the plan relays K/V inside host 1";
  EXPECT_TRUE(moved) << "some exchange moves bytes";
}

}  // namespace
}  // namespace distca::sim::detail
