// The dispatcher's call-order policy (dispatcher.h): a phased call out of order is a
// programming error and aborts through DISTCA_CHECK with a message naming the call, the layer,
// the expected and the actual phase; the allowed re-entries (a forward after a finished
// forward, a forward after release) work and give the same outputs. A buffer smaller than the
// plan's rows aborts the same way, naming the buffer, before any row is read or written.
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
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

// Every buffer one float short of the plan's rows: the call aborts naming it (without the
// check the dispatcher wrote the last row past the caller's buffer).
TEST_F(DispatcherOrderDeathTest, BuffersSmallerThanThePlanAbortNamingTheBuffer) {
  OneRank r;
  const int64_t n = r.batch.rank_tokens(0);
  auto short_of = [](std::vector<float>& x) { return std::span<float>(x).first(x.size() - 1); };
  const std::string need_q = "the plan needs " + std::to_string(n * r.dims.q_floats()) + " \\(" + std::to_string(n) + " rows";
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) { return d.forward(0, short_of(r.q), r.k, r.v, r.o, r.lse); }),
               "start_forward\\(layer 0\\): buffer q holds " + std::to_string(r.q.size() - 1) + " floats, " + need_q);
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) { return d.forward(0, r.q, short_of(r.k), r.v, r.o, r.lse); }),
               "start_forward\\(layer 0\\): buffer k holds");
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) { return d.forward(0, r.q, r.k, short_of(r.v), r.o, r.lse); }),
               "start_forward\\(layer 0\\): buffer v holds");
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) { return d.forward(0, r.q, r.k, r.v, short_of(r.o), r.lse); }),
               "start_forward\\(layer 0\\): buffer o holds");
  EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) { return d.forward(0, r.q, r.k, r.v, r.o, short_of(r.lse)); }),
               "start_forward\\(layer 0\\): buffer lse holds");
  auto backward_death = [&](std::span<const float> d_o, std::span<float> dq, std::span<float> dk, std::span<float> dv,
                            const std::string& name) {
    EXPECT_DEATH((void)r.with_dispatcher([&](CaDispatcher& d) {
                   DISTCA_RETURN_IF_ERROR(r.fwd(d, 0));
                   return d.backward(0, d_o, dq, dk, dv);
                 }),
                 "start_backward\\(layer 0\\): buffer " + name + " holds");
  };
  std::vector<float> d_o = r.d_o, dq = r.dq, dk = r.dk, dv = r.dv;
  backward_death(short_of(d_o), r.dq, r.dk, r.dv, "d_o");
  backward_death(r.d_o, short_of(dq), r.dk, r.dv, "dq");
  backward_death(r.d_o, r.dq, short_of(dk), r.dv, "dk");
  backward_death(r.d_o, r.dq, r.dk, short_of(dv), "dv");
  auto stateless = [&](auto body) {
    return comm::run_local(1, [&](comm::Communicator& c) -> Status {
      DispatcherOptions o;
      o.stateless = true;
      DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(c, r.plan, r.dims, o));
      body(*d);
      return Status::ok_status();
    });
  };
  EXPECT_DEATH((void)stateless([&](CaDispatcher& d) { d.adopt_forward(0, r.q, r.k, r.v, r.o, short_of(r.lse)); }),
               "adopt_forward\\(layer 0\\): buffer lse holds");
  EXPECT_DEATH((void)stateless([&](CaDispatcher& d) { d.adopt_forward(0, r.q, r.k, r.v, short_of(r.o), r.lse); }),
               "adopt_forward\\(layer 0\\): buffer o holds");
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
