// Per-document CP through the all-gather (train/cp_attention.h) against whole-document
// attention: the forward (O, LSE) bitwise the whole-document kernel call, dQ within 2e-6 of
// it, dK/dV within 2x the kernel's own error against the naive fp64 reference
// (kernels/reference.h) and within 1e-5 of the kernel (the dispatcher's bounds,
// runtime/runtime_check.h); and the bytes each rank sends against a formula over the layout's
// documents, computed here.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "distca/comm/group.h"
#include "distca/comm/local.h"
#include "distca/kernels/reference.h"
#include "distca/plan/chunking.h"
#include "distca/train/cp_attention.h"
#include "runtime/runtime_check.h"

namespace distca::train {
namespace {

using runtime::AttentionDims;
using namespace distca::runtime::testing;  // NOLINT(google-build-using-namespace)

// Forward and backward bytes per rank, from the documents: a document held by more than one
// rank belongs to one gather (its CP group's when every holder is in that group, else the one
// over every rank). Forward, each rank sends its rows of the gather's documents (K and V) to
// the gather's other members; backward, the same again (the re-gather) plus, in the
// reduce-scatter, its dK/dV partials of every gathered row it does not hold.
std::pair<std::vector<int64_t>, std::vector<int64_t>> expected_bytes(const Batch& b, int64_t cp, const AttentionDims& d) {
  std::map<int64_t, std::set<int64_t>> holders;
  std::map<std::pair<int64_t, int64_t>, int64_t> held;  // (doc, rank) -> rows
  for (int64_t r = 0; r < b.ranks; ++r) {
    for (const Piece& p : b.per_rank[static_cast<size_t>(r)]) {
      holders[p.doc].insert(r);
      held[{p.doc, r}] += p.len;
    }
  }
  const int64_t row = 2 * d.kv_floats() * 4;
  // Gather g: -1 the wide one, else the CP group's index; its rows per rank.
  std::map<int64_t, std::vector<int64_t>> rows;
  for (const auto& [doc, hs] : holders) {
    if (hs.size() < 2) continue;
    const bool one_group = *hs.begin() / cp == *hs.rbegin() / cp;
    auto& v = rows[one_group ? *hs.begin() / cp : -1];
    v.resize(static_cast<size_t>(b.ranks), 0);
    for (int64_t r : hs) v[static_cast<size_t>(r)] += held[{doc, r}];
  }
  std::vector<int64_t> fwd(static_cast<size_t>(b.ranks), 0), bwd(fwd);
  for (const auto& [g, v] : rows) {
    const int64_t first = g < 0 ? 0 : g * cp, end = g < 0 ? b.ranks : (g + 1) * cp;
    int64_t total = 0;
    for (int64_t r = first; r < end; ++r) total += v[static_cast<size_t>(r)];
    for (int64_t r = first; r < end; ++r) {
      const int64_t mine = v[static_cast<size_t>(r)];
      fwd[static_cast<size_t>(r)] += (end - first - 1) * mine * row;
      bwd[static_cast<size_t>(r)] += (end - first - 1) * mine * row + (total - mine) * row;
    }
  }
  return {fwd, bwd};
}

struct Case {
  std::string name;
  Batch layout;
  int64_t cp;
};

// Runs one layer forward and backward of `layout` on every rank; compares and counts.
void check_case(const Case& c, const AttentionDims& dims, int64_t& group_docs, int64_t& wide_docs) {
  const Problem pr = make_problem(c.layout, dims, 21, /*with_fp64=*/true);
  const int n = static_cast<int>(c.layout.ranks);
  const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
  std::vector<RankOutputs> outs(static_cast<size_t>(n));
  std::vector<int64_t> fwd(static_cast<size_t>(n)), bwd(static_cast<size_t>(n));
  const Status st = comm::run_local(n, [&](comm::Communicator& world) -> Status {
    const int r = world.rank();
    std::vector<int> members;
    for (int64_t i = r / c.cp * c.cp; i < (r / c.cp + 1) * c.cp; ++i) members.push_back(static_cast<int>(i));
    DISTCA_ASSIGN_OR_RETURN(auto group, comm::GroupCommunicator::create(world, members, 7));
    DISTCA_ASSIGN_OR_RETURN(CpAttention att, CpAttention::create(c.layout, r, c.cp, dims, 2));
    const auto q = local_rows(pr, c.layout, r, pr.q, qf), k = local_rows(pr, c.layout, r, pr.k, kvf),
               v = local_rows(pr, c.layout, r, pr.v, kvf), d_o = local_rows(pr, c.layout, r, pr.d_o, qf);
    RankOutputs& out = outs[static_cast<size_t>(r)];
    out.o.assign(q.size(), NAN), out.dq.assign(q.size(), NAN), out.dk.assign(k.size(), NAN), out.dv.assign(k.size(), NAN);
    DISTCA_RETURN_IF_ERROR(att.forward(1, *group, world, q.data(), k.data(), v.data(), out.o.data()));
    DISTCA_RETURN_IF_ERROR(att.backward(1, *group, world, q.data(), k.data(), v.data(), out.o.data(), d_o.data(),
                                        out.dq.data(), out.dk.data(), out.dv.data()));
    out.lse = att.lse_rows(1);
    fwd[static_cast<size_t>(r)] = att.last_forward_bytes();
    bwd[static_cast<size_t>(r)] = att.last_backward_bytes();
    return {};
  });
  ASSERT_TRUE(st.ok()) << c.name << ": " << st.to_string();
  Comparison all;
  for (int r = 0; r < n; ++r) all.merge(compare(pr, c.layout, r, outs[static_cast<size_t>(r)]));
  EXPECT_TRUE(check_close(all).ok()) << c.name << ": " << describe(all);
  const auto [want_fwd, want_bwd] = expected_bytes(c.layout, c.cp, dims);
  EXPECT_EQ(fwd, want_fwd) << c.name;
  EXPECT_EQ(bwd, want_bwd) << c.name;
  const CpBytes counted = cp_attention_bytes(c.layout, c.cp, dims);
  EXPECT_EQ(counted.forward, want_fwd) << c.name;
  EXPECT_EQ(counted.backward, want_bwd) << c.name;
  std::map<int64_t, std::set<int64_t>> holders;
  for (int64_t r = 0; r < n; ++r) {
    for (const Piece& p : c.layout.per_rank[static_cast<size_t>(r)]) holders[p.doc].insert(r);
  }
  for (const auto& [doc, hs] : holders) {
    if (hs.size() < 2) continue;
    (*hs.begin() / c.cp == *hs.rbegin() / c.cp ? group_docs : wide_docs) += 1;
  }
}

TEST(CpAttention, MatchesWholeDocumentAttentionForwardAndBackward) {
  int64_t group_docs = 0, wide_docs = 0;
  for (const AttentionDims dims : {AttentionDims{4, 2, 16, 0}, AttentionDims{8, 2, 8, 0}}) {
    for (int ranks : {2, 4}) {
      const Batch batch = random_batch(ranks, 512, 500 + static_cast<uint64_t>(ranks));
      for (int64_t cp = 1; cp <= ranks; cp *= 2) {
        std::vector<Case> cases;
        cases.push_back({"loader packing", batch, cp});
        if (cp > 1) {
          ChunkingOptions wlb;
          wlb.cp = cp;
          wlb.cp_threshold = 64;
          cases.push_back({"wlb", wlb_repack(batch, wlb).value(), cp});
          cases.push_back({"percp", percp_repack(batch, cp).value(), cp});
        }
        for (const Case& c : cases) {
          SCOPED_TRACE(c.name + ", " + std::to_string(ranks) + " ranks, cp " + std::to_string(cp) + ", heads " +
                       std::to_string(dims.n_heads));
          check_case(c, dims, group_docs, wide_docs);
        }
      }
    }
  }
  // Both collectives were exercised.
  EXPECT_GT(group_docs, 4);
  EXPECT_GT(wide_docs, 4);
}

// The forward against the naive fp64 reference directly (not through the fast kernel): every
// O element within 2x the fast kernel's own error plus 1e-7.
TEST(CpAttention, ForwardAgainstTheNaiveReference) {
  const AttentionDims dims{4, 2, 16, 0};
  const Batch batch = random_batch(4, 512, 77);
  const Batch laid = percp_repack(batch, 2).value();
  const Problem pr = make_problem(laid, dims, 5, false);
  std::vector<int32_t> cu{0};
  for (const auto& [id, d] : pr.docs) cu.push_back(static_cast<int32_t>(d.row0 + d.len));
  kernels::AttentionParams shape;
  shape.cu_seqlens_q = cu.data(), shape.cu_seqlens_k = cu.data();
  shape.n_tasks = static_cast<int32_t>(pr.docs.size());
  shape.n_heads = dims.n_heads, shape.n_kv_heads = dims.n_kv_heads, shape.head_dim = dims.head_dim;
  auto to64 = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const auto q64 = to64(pr.q), k64 = to64(pr.k), v64 = to64(pr.v);
  std::vector<double> o64(q64.size()), lse64(static_cast<size_t>(pr.rows * dims.n_heads));
  kernels::reference_forward<double>(shape, q64.data(), k64.data(), v64.data(), o64.data(), lse64.data());
  const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
  double err = 0, kernel_err = 0;
  for (size_t i = 0; i < o64.size(); ++i) kernel_err = std::max(kernel_err, std::fabs(pr.o[i] - o64[i]));
  const Status st = comm::run_local(4, [&](comm::Communicator& world) -> Status {
    const int r = world.rank();
    DISTCA_ASSIGN_OR_RETURN(auto group, comm::GroupCommunicator::create(world, {r / 2 * 2, r / 2 * 2 + 1}, 7));
    DISTCA_ASSIGN_OR_RETURN(CpAttention att, CpAttention::create(laid, r, 2, dims, 1));
    const auto q = local_rows(pr, laid, r, pr.q, qf), k = local_rows(pr, laid, r, pr.k, kvf), v = local_rows(pr, laid, r, pr.v, kvf);
    std::vector<float> o(q.size());
    DISTCA_RETURN_IF_ERROR(att.forward(0, *group, world, q.data(), k.data(), v.data(), o.data()));
    const std::vector<float> want = local_rows(pr, laid, r, std::vector<float>(o64.begin(), o64.end()), qf);
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < o.size(); ++i) err = std::max(err, std::fabs(static_cast<double>(o[i]) - static_cast<double>(want[i])));
    return {};
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_GT(kernel_err, 0);
  EXPECT_LE(err, 2 * kernel_err + 1e-7) << "kernel's own error " << kernel_err;
}

}  // namespace
}  // namespace distca::train
