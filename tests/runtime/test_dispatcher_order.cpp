// The dispatcher's call-order policy (dispatcher.h): a phased call out of order is a
// programming error and aborts through DISTCA_CHECK with a message naming the call, the layer,
// the expected and the actual phase; the allowed re-entries (a forward after a finished
// forward, a forward after release) work and give the same outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "distca/comm/local.h"
#include "runtime_check.h"

namespace distca::runtime::testing {
namespace {

// One rank, a colocated plan over a small random batch, and buffers for one layer.
struct OneRank {
  AttentionDims dims{2, 1, 8, 0};
  Batch batch = random_batch(1, 128, 5);
  Plan plan;
  std::vector<float> q, k, v, d_o, o, lse, dq, dk, dv;

  OneRank() {
    auto p = make_plan(batch, parse_scheduler("colocated").value(), schedule_options(dims));
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    plan = std::move(p).value();
    const int64_t n = batch.rank_tokens(0);
    auto fill = [&](std::vector<float>& x, int64_t count, float base) {
      x.resize(static_cast<size_t>(count));
      for (size_t i = 0; i < x.size(); ++i) x[i] = base + 0.001f * static_cast<float>(i % 97);
    };
    fill(q, n * dims.q_floats(), 0.1f), fill(d_o, n * dims.q_floats(), -0.2f);
    fill(k, n * dims.kv_floats(), 0.3f), fill(v, n * dims.kv_floats(), -0.4f);
    o.assign(q.size(), NAN), dq.assign(q.size(), NAN), lse.assign(static_cast<size_t>(n * dims.n_heads), NAN);
    dk.assign(k.size(), NAN), dv.assign(k.size(), NAN);
  }

  // Runs `body` with a fresh dispatcher on a one-rank local group.
  template <class Fn>
  Status with_dispatcher(Fn body) {
    return comm::run_local(1, [&](comm::Communicator& c) -> Status {
      DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(c, plan, dims));
      return body(*d);
    });
  }
  Status fwd(CaDispatcher& d, int layer) { return d.forward(layer, q, k, v, o, lse); }
  Status bwd(CaDispatcher& d, int layer) { return d.backward(layer, d_o, dq, dk, dv); }
};

class DispatcherOrderDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(DispatcherOrderDeathTest, CallsOutOfOrderAbortNamingTheExpectedAndActualPhase) {
  OneRank r;
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) { return d.serve_forward(0); }),
               "serve_forward\\(0\\) out of order: expects the layer forward started, but it is idle");
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) { return r.bwd(d, 2); }),
               "start_backward\\(2\\) out of order: expects the layer forward finished, but it is idle");
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) {
                 DISTCA_RETURN_IF_ERROR(r.fwd(d, 0));
                 return d.finish_forward(0);
               }),
               "finish_forward\\(0\\) out of order: expects the layer forward served, but it is forward finished");
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) {
                 DISTCA_RETURN_IF_ERROR(d.start_forward(1, r.q, r.k, r.v, r.o, {}));
                 return d.start_forward(1, r.q, r.k, r.v, r.o, {});
               }),
               "start_forward\\(1\\) out of order: expects the layer idle .*, but it is forward started");
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) {
                 DISTCA_RETURN_IF_ERROR(r.fwd(d, 0));
                 DISTCA_RETURN_IF_ERROR(d.start_backward(0, r.d_o, r.dq, r.dk, r.dv,
                                                         BackwardWrite::kOverwrite));
                 return d.finish_backward(0);
               }),
               "finish_backward\\(0\\) out of order: expects the layer backward served, but it is backward started");
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) {
                 DISTCA_RETURN_IF_ERROR(r.fwd(d, 0));
                 d.release(0);
                 return r.bwd(d, 0);
               }),
               "start_backward\\(0\\) out of order: expects the layer forward finished, but it is idle");
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) {
                 DISTCA_RETURN_IF_ERROR(r.fwd(d, 0));
                 DISTCA_RETURN_IF_ERROR(r.bwd(d, 0));
                 return r.bwd(d, 0);  // backward drops the layer's state
               }),
               "start_backward\\(0\\) out of order");
}

// A forward may follow a finished forward (evaluation without backward) or a release, and the
// layers are independent: the outputs are those of a single forward + backward.
TEST(DispatcherOrder, RepeatedForwardAndReleaseAreAllowed) {
  OneRank once;
  ASSERT_TRUE(once.with_dispatcher([&](CaDispatcher& d) {
    DISTCA_RETURN_IF_ERROR(once.fwd(d, 0));
    return once.bwd(d, 0);
  }).ok());
  OneRank again;
  const Status st = again.with_dispatcher([&](CaDispatcher& d) {
    DISTCA_RETURN_IF_ERROR(again.fwd(d, 0));
    DISTCA_RETURN_IF_ERROR(again.fwd(d, 0));  // replaces the kept state
    DISTCA_RETURN_IF_ERROR(again.fwd(d, 1));
    d.release(1);
    DISTCA_RETURN_IF_ERROR(again.fwd(d, 1));
    DISTCA_RETURN_IF_ERROR(again.bwd(d, 1));
    return again.bwd(d, 0);
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(once.o, again.o);
  EXPECT_EQ(once.lse, again.lse);
  EXPECT_EQ(once.dq, again.dq);
  EXPECT_EQ(once.dk, again.dk);
  EXPECT_EQ(once.dv, again.dv);
}

}  // namespace
}  // namespace distca::runtime::testing
