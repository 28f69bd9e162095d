// K/V relays (plan/topology_relay.h) in the dispatcher: a plan with hosts runs its K|V
// exchange in two stages, and gives bit for bit the outputs and gradients of the same plan
// without hosts (direct K|V), in-place and stateless servers alike; every rank sends what
// the relays say (the holder less, the relay more), and the bytes in all are the plan's.
#include <gtest/gtest.h>

#include "distca/comm/local.h"
#include "distca/plan/topology_relay.h"
#include "runtime_check.h"

namespace distca::runtime::testing {
namespace {

struct Sent {
  int64_t fwd = 0, bwd = 0;
};

Status run_one(comm::Communicator& comm, const Problem& pr, const Plan& plan, const DispatcherOptions& options,
               RankOutputs* out, Sent* sent) {
  int64_t bwd = 0;
  DISTCA_RETURN_IF_ERROR(run_dispatcher(comm, pr, plan, out, options, &bwd));
  // run_dispatcher keeps no forward figure: a second forward on a fresh dispatcher gives it.
  DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(comm, plan, pr.dims, options));
  const int64_t qf = pr.dims.q_floats(), kvf = pr.dims.kv_floats();
  const int r = comm.rank();
  const auto q = local_rows(pr, plan.batch, r, pr.q, qf), k = local_rows(pr, plan.batch, r, pr.k, kvf),
             v = local_rows(pr, plan.batch, r, pr.v, kvf);
  std::vector<float> o(q.size());
  DISTCA_RETURN_IF_ERROR(d->forward(0, q, k, v, o));
  if (o != out->o) return Status::internal("a second forward differs");
  sent->fwd = d->last_forward_bytes_sent();
  sent->bwd = bwd;
  return Status::ok_status();
}

TEST(KvRelay, SameBitsAndTheRelaysBytes) {
  const AttentionDims dims{4, 2, 16, 0};
  int64_t relayed_plans = 0;
  for (int ranks : {2, 3, 4, 6}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      const Batch batch = random_batch(ranks, 384, 700 + seed * 10 + static_cast<uint64_t>(ranks));
      const Problem pr = make_problem(batch, dims, 17 + seed, false);
      ScheduleOptions so = schedule_options(dims);
      so.topology.host.clear();
      for (int r = 0; r < ranks; ++r) so.topology.host.push_back((r + static_cast<int>(seed)) % (ranks > 3 ? 3 : 2));
      for (const char* name : {"cad", "colocated", "cad-symmetric", "percp:2"}) {
        if (std::string(name) == "percp:2" && ranks % 2 != 0) continue;
        auto hosted = make_plan(batch, parse_scheduler(name).value(), so);
        ASSERT_TRUE(hosted.ok()) << hosted.status().to_string();
        Plan direct = *hosted;
        direct.hosts.clear();
        const std::vector<RelayedBlock> relayed = kv_relay(*hosted, hosted->hosts);
        relayed_plans += relayed.empty() ? 0 : 1;
        for (bool stateless : {false, true}) {
          DispatcherOptions o;
          o.stateless = stateless;
          std::vector<RankOutputs> a(static_cast<size_t>(ranks)), b(a.size());
          std::vector<Sent> sa(a.size()), sb(a.size());
          for (const Plan* p : {&*hosted, &direct}) {
            const bool relay = p == &*hosted;
            Status st = comm::run_local(ranks, [&](comm::Communicator& c) {
              const auto r = static_cast<size_t>(c.rank());
              return run_one(c, pr, *p, o, relay ? &a[r] : &b[r], relay ? &sa[r] : &sb[r]);
            });
            ASSERT_TRUE(st.ok()) << st.to_string();
          }
          // What each rank sends with relays: the holder less, the relay as much more.
          std::vector<int64_t> moved(a.size(), 0);
          const int64_t row = 2 * dims.kv_floats() * static_cast<int64_t>(sizeof(float));
          for (const RelayedBlock& rb : relayed) {
            moved[static_cast<size_t>(rb.holder)] -= rb.rows * row;
            moved[static_cast<size_t>(rb.relay)] += rb.rows * row;
          }
          for (size_t r = 0; r < a.size(); ++r) {
            const std::string what = std::string(name) + " ranks " + std::to_string(ranks) + " seed " +
                                     std::to_string(seed) + (stateless ? " stateless" : "") + " rank " + std::to_string(r);
            EXPECT_TRUE(a[r].o == b[r].o && a[r].lse == b[r].lse) << what;
            EXPECT_TRUE(a[r].dq == b[r].dq && a[r].dk == b[r].dk && a[r].dv == b[r].dv) << what;
            EXPECT_EQ(sa[r].fwd, sb[r].fwd + moved[r]) << what;
            EXPECT_EQ(sa[r].bwd, sb[r].bwd + (stateless ? moved[r] : 0)) << what;
          }
        }
      }
    }
  }
  EXPECT_GE(relayed_plans, 10);  // the relays ran (10 plans relay)
}

}  // namespace
}  // namespace distca::runtime::testing
