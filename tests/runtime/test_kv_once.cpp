// K/V once per server across the nano-batch pair (plan/kv_once.h, TickRunner's kv_once): the
// runner with the pair's K/V wire gives bit for bit the outputs and gradients of the runner
// without it, for every scheduler at 1-4 ranks, on one host and with K/V relays on two or
// three, in-place and stateless servers, and through pipeline ticks; and each rank sends the
// K/V bytes of the rows its servers need counted directly from the plans' tasks: every
// context row a server reads, in either nano-batch, once per layer and direction.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <tuple>

#include "distca/comm/local.h"
#include "distca/plan/kv_once.h"
#include "distca/plan/nano_plan.h"
#include "distca/plan/topology_relay.h"
#include "runtime_check.h"

namespace distca::runtime::testing {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_bits(const RankOutputs& a, const RankOutputs& b) {
  return same_bits(a.o, b.o) && same_bits(a.lse, b.lse) && same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) &&
         same_bits(a.dv, b.dv);
}

// One micro-batch's runner, forward then backward; `bytes`: the last layer's bytes sent.
Status run_pair(comm::Communicator& comm, const std::vector<Problem>& layers, const NanoPlans& plans, bool stateless,
                bool kv_once, std::vector<RankOutputs>* out, int64_t* bytes) {
  const int r = comm.rank();
  const auto& t = plans.split.tokens[static_cast<size_t>(r)];
  LayerStack stack(layers, plans.split.batch.per_rank[static_cast<size_t>(r)], {t[0], t[1]}, true);
  DISTCA_ASSIGN_OR_RETURN(auto runner, TickRunner::create(comm, plans, layers.front().dims, OverlapMode::kPingPong,
                                                          nullptr, stateless, kv_once));
  DISTCA_RETURN_IF_ERROR(runner->forward(stack.forward(), stack.linear()));
  DISTCA_RETURN_IF_ERROR(runner->backward(stack.backward(), stack.linear()));
  DISTCA_RETURN_IF_ERROR(stack.status());
  out->clear();
  for (int l = 0; l < stack.layers(); ++l) out->push_back(stack.outputs(l));
  *bytes = runner->last_bytes_sent();
  return Status::ok_status();
}

// [rank] K/V rows each rank sends when every server gets each context row it reads once: for
// every server, the set of (document, position) rows of the contexts [0, q_end) of its tasks
// in either nano plan, less its own, each charged to the rank that holds it.
std::vector<int64_t> once_rows_sent(const NanoPlans& plans) {
  const DocumentIndex index(plans.split.batch);
  std::vector<int64_t> sent(static_cast<size_t>(index.ranks()), 0);
  for (size_t s = 0; s < plans.nano[0].servers.size(); ++s) {
    std::set<std::pair<int64_t, int64_t>> rows;
    for (const Plan& p : plans.nano) {
      for (const ServerTask& st : p.servers[s].tasks) {
        for (int64_t pos = 0; pos < st.task.q_end; ++pos) rows.emplace(st.task.doc, pos);
      }
    }
    for (const auto& [doc, pos] : rows) {
      const int64_t holder = index.run_at(doc, pos).rank;
      if (holder != static_cast<int64_t>(s)) ++sent[static_cast<size_t>(holder)];
    }
  }
  return sent;
}

TEST(KvOnce, SameBitsAndEachRowOncePerServer) {
  const AttentionDims dims{4, 2, 16, 0};
  int64_t saved_cases = 0, relayed_cases = 0;
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      const Batch batch = random_batch(ranks, 320, 300 + 10 * seed + static_cast<uint64_t>(ranks));
      const std::vector<Problem> layers = layer_problems(batch, dims, 60 + seed, 2, false);
      for (const bool hosted : {false, true}) {
        if (hosted && ranks < 2) continue;
        ScheduleOptions so = schedule_options(dims);
        so.align_rows = query_tile_rows(dims);
        for (int r = 0; hosted && r < ranks; ++r) so.topology.host.push_back((r + static_cast<int>(seed)) % (ranks > 2 ? 3 : 2));
        for (const std::string& name : scheduler_names(ranks)) {
          auto plans = plan_nano_batches(batch, parse_scheduler(name).value(), so);
          ASSERT_TRUE(plans.ok()) << plans.status().to_string();
          const std::vector<int64_t> once = once_rows_sent(*plans);
          for (const bool stateless : {false, true}) {
            std::array<std::vector<std::vector<RankOutputs>>, 2> out;
            std::array<std::vector<int64_t>, 2> bytes;
            for (const bool kv_once : {false, true}) {
              auto& o = out[kv_once ? 1 : 0];
              auto& b = bytes[kv_once ? 1 : 0];
              o.assign(static_cast<size_t>(ranks), {});
              b.assign(static_cast<size_t>(ranks), 0);
              const Status st = comm::run_local(ranks, [&](comm::Communicator& c) {
                const auto r = static_cast<size_t>(c.rank());
                return run_pair(c, layers, *plans, stateless, kv_once, &o[r], &b[r]);
              });
              ASSERT_TRUE(st.ok()) << st.to_string();
            }
            const int64_t row = 2 * dims.kv_floats() * static_cast<int64_t>(sizeof(float));
            const int64_t times = stateless ? 2 : 1;  // stateless backward sends K|V again
            int64_t on = 0, off = 0;
            for (size_t r = 0; r < static_cast<size_t>(ranks); ++r) {
              const std::string what = name + " ranks " + std::to_string(ranks) + " seed " + std::to_string(seed) +
                                       (hosted ? " hosted" : "") + (stateless ? " stateless" : "") + " rank " +
                                       std::to_string(r);
              for (size_t l = 0; l < out[0][r].size(); ++l) EXPECT_TRUE(same_bits(out[0][r][l], out[1][r][l])) << what;
              on += bytes[1][r], off += bytes[0][r];
              if (hosted) continue;  // relays move bytes between ranks (runtime_kv_relay_test)
              int64_t planned = 0;   // the plans' own K|V rows
              for (const Plan& p : plans->nano) planned += p.ranks[r].exchange(ExchangeKind::kKv).send_rows();
              EXPECT_EQ(bytes[1][r], bytes[0][r] + times * (once[r] - planned) * row) << what;
            }
            EXPECT_LE(on, off) << name;
            saved_cases += on < off ? 1 : 0;
            relayed_cases += hosted && !kv_relay(plans->full, plans->full.hosts).empty() ? 1 : 0;
          }
        }
      }
    }
  }
  EXPECT_GE(saved_cases, 20);    // the wire saved bytes
  EXPECT_GE(relayed_cases, 10);  // and ran with relays
}

// The wire's bytes as the simulator counts them from task lists equal the wire's layouts.
TEST(KvOnce, WireBytesFromTasksMatchTheLayouts) {
  const AttentionDims dims{4, 2, 16, 0};
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Batch batch = random_batch(ranks, 512, 40 + static_cast<uint64_t>(ranks));
    ScheduleOptions so = schedule_options(dims);
    for (const std::string& name : scheduler_names(ranks)) {
      const SchedulerSpec spec = parse_scheduler(name).value();
      auto ns = schedule_nano_batches(batch, spec, so);
      ASSERT_TRUE(ns.ok()) << ns.status().to_string();
      auto plans = plan_nano_batches(batch, spec, so);
      ASSERT_TRUE(plans.ok());
      const RowBytes rb = plans->full.row_bytes;
      const KvWireBytes b = kv_wire_bytes(DocumentIndex(ns->split.batch), ns->full, ns->split, rb);
      const auto wire = nano_kv_wire(*plans, false);
      for (size_t x = 0; x < 2; ++x) {
        int64_t total = 0;
        for (size_t r = 0; r < static_cast<size_t>(ranks); ++r) {
          EXPECT_EQ(b.sent[x][r], wire[x][r].send_rows() * rb.kv) << name << " nano " << x << " rank " << r;
          EXPECT_EQ(b.recv[x][r], wire[x][r].recv_rows() * rb.kv) << name << " nano " << x << " rank " << r;
          total += wire[x][r].send_rows() * rb.kv;
        }
        EXPECT_EQ(b.total[x], total) << name;
      }
    }
  }
}

// Pipeline ticks (stateless servers, both directions in one pass): the same bits with and
// without the wire.
TEST(KvOnce, PipelineTicksSameBits) {
  const AttentionDims dims{4, 2, 16, 0};
  for (const char* scheduler : {"cad", "cad-symmetric"}) {
    std::array<std::vector<std::vector<RankOutputs>>, 2> out;
    for (const bool kv_once : {false, true}) {
      auto& o = out[kv_once ? 1 : 0];
      o.assign(4, {});
      const Status st = comm::run_local(4, [&](comm::Communicator& c) {
        Comparison worst;
        return run_pipeline_ticks(c, 2, 3, 2, dims, OverlapMode::kPingPong, scheduler, &worst, kv_once,
                                  &o[static_cast<size_t>(c.rank())]);
      });
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
    for (size_t r = 0; r < 4; ++r) {
      ASSERT_EQ(out[0][r].size(), out[1][r].size());
      EXPECT_FALSE(out[0][r].empty());
      for (size_t i = 0; i < out[0][r].size(); ++i) EXPECT_TRUE(same_bits(out[0][r][i], out[1][r][i])) << scheduler << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace distca::runtime::testing
