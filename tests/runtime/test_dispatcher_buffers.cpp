// The dispatcher's row buffers (dispatcher.h, buffer_allocations): a layer reuses the pages
// the previous layer's calls released instead of allocating fresh ones, and reuse changes no
// output: every layer, run through one dispatcher, still matches its own whole-document
// kernel call (forward bitwise, gradients within the runtime's bounds).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "distca/comm/local.h"
#include "runtime_check.h"

namespace distca::runtime::testing {
namespace {

// Runs forwards of layers 0..L-1, then backwards of L-1..0, on one dispatcher per rank of a
// two-rank cad plan; each layer has its own inputs. Returns every rank's fresh allocations.
std::vector<int64_t> run_layers(const Batch& batch, const AttentionDims& dims, int layers) {
  const std::vector<Problem> pr = layer_problems(batch, dims, 7, layers, /*with_fp64=*/true);
  auto plan = make_plan(batch, parse_scheduler("cad").value(), schedule_options(dims));
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  std::vector<int64_t> allocations(2, 0);
  const Status st = comm::run_local(2, [&](comm::Communicator& c) -> Status {
    const int r = c.rank();
    const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
    std::vector<std::vector<float>> q, k, v, d_o;
    std::vector<RankOutputs> out(static_cast<size_t>(layers));
    for (const Problem& p : pr) {
      q.push_back(local_rows(p, plan->batch, r, p.q, qf)), k.push_back(local_rows(p, plan->batch, r, p.k, kvf));
      v.push_back(local_rows(p, plan->batch, r, p.v, kvf)), d_o.push_back(local_rows(p, plan->batch, r, p.d_o, qf));
    }
    const int64_t n = static_cast<int64_t>(q[0].size()) / qf;
    DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(c, *plan, dims));
    for (int l = 0; l < layers; ++l) {
      RankOutputs& o = out[static_cast<size_t>(l)];
      o.o.assign(q[0].size(), NAN), o.dq.assign(q[0].size(), NAN), o.lse.assign(static_cast<size_t>(n * dims.n_heads), NAN);
      o.dk.assign(k[0].size(), NAN), o.dv.assign(k[0].size(), NAN);
      const auto i = static_cast<size_t>(l);
      DISTCA_RETURN_IF_ERROR(d->forward(l, q[i], k[i], v[i], o.o, o.lse));
    }
    for (int l = layers - 1; l >= 0; --l) {
      RankOutputs& o = out[static_cast<size_t>(l)];
      DISTCA_RETURN_IF_ERROR(d->backward(l, d_o[static_cast<size_t>(l)], o.dq, o.dk, o.dv));
    }
    DISTCA_RETURN_IF_ERROR(check_close(compare_layers(pr, plan->batch, r, out)).with_context("rank " + std::to_string(r)));
    allocations[static_cast<size_t>(r)] = d->buffer_allocations();
    return Status::ok_status();
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  return allocations;
}

TEST(DispatcherBuffers, LaterLayersReuseReleasedBuffersAndKeepTheirOutputs) {
  // Rank 0 one long document, rank 1 short ones: cad moves rows both ways, so every exchange
  // and every fused buffer is well above the pooled size.
  Batch batch;
  batch.ranks = 2;
  batch.tokens_per_rank = 1024;
  batch.per_rank = {{Piece{0, 0, 1024, 1024}}, {}};
  for (int64_t i = 0; i < 4; ++i) batch.per_rank[1].push_back(Piece{1 + i, 0, 256, 256});
  const AttentionDims dims{4, 2, 16, 0};
  constexpr int kLayers = 4;
  const std::vector<int64_t> one = run_layers(batch, dims, 1);
  const std::vector<int64_t> many = run_layers(batch, dims, kLayers);
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_GT(one[r], 0);
    std::printf("rank %zu: fresh buffers, 1 layer %lld, %d layers %lld\n", r, static_cast<long long>(one[r]), kLayers,
                static_cast<long long>(many[r]));
    // Only the forward's kept fused call (Q, O, LSE, K, V: five buffers) needs new pages per
    // further layer; the exchanges' buffers and the backward's come from released ones.
    EXPECT_LE(many[r], one[r] + (kLayers - 1) * 5);
    EXPECT_LT(many[r], kLayers * one[r]);
  }
}

}  // namespace
}  // namespace distca::runtime::testing
