// make_problem and params_for (kernels/problem.h).
#include "distca/kernels/problem.h"

#include <algorithm>

#include "distca/core/check.h"
#include "distca/core/rng.h"

namespace distca::kernels {

AttentionProblem make_problem(const std::vector<std::pair<int64_t, int64_t>>& tasks, int32_t n_heads,
                              int32_t n_kv_heads, int32_t head_dim, uint64_t seed) {
  AttentionProblem pr;
  pr.n_heads = n_heads;
  pr.n_kv_heads = n_kv_heads;
  pr.head_dim = head_dim;
  pr.cu_q.push_back(0);
  pr.cu_k.push_back(0);
  for (const auto& [ql, kl] : tasks) {
    DISTCA_CHECK(ql >= 0 && kl >= 0);
    pr.cu_q.push_back(pr.cu_q.back() + static_cast<int32_t>(ql));
    pr.cu_k.push_back(pr.cu_k.back() + static_cast<int32_t>(kl));
  }
  const size_t nq = static_cast<size_t>(pr.cu_q.back()) * n_heads * head_dim;
  const size_t nk = static_cast<size_t>(pr.cu_k.back()) * n_kv_heads * head_dim;
  Rng rng(seed);
  auto fill = [&](std::vector<float>& x, size_t n) {
    x.resize(n);
    for (auto& e : x) e = static_cast<float>(rng.uniform(-1.0, 1.0));
  };
  fill(pr.q, nq);
  fill(pr.k, nk);
  fill(pr.v, nk);
  fill(pr.d_o, nq);
  pr.o.assign(nq, 0.0f);
  pr.dq.assign(nq, 0.0f);
  pr.dk.assign(nk, 0.0f);
  pr.dv.assign(nk, 0.0f);
  pr.lse.assign(static_cast<size_t>(pr.cu_q.back()) * n_heads, 0.0f);
  return pr;
}

AttentionParams params_for(AttentionProblem& pr) {
  AttentionParams p;
  p.q = pr.q.data();
  p.k = pr.k.data();
  p.v = pr.v.data();
  p.cu_seqlens_q = pr.cu_q.data();
  p.cu_seqlens_k = pr.cu_k.data();
  p.n_tasks = static_cast<int32_t>(pr.cu_q.size()) - 1;
  p.n_heads = pr.n_heads;
  p.n_kv_heads = pr.n_kv_heads;
  p.head_dim = pr.head_dim;
  for (int32_t t = 0; t < p.n_tasks; ++t) {
    p.max_seqlen_q = std::max(p.max_seqlen_q, pr.cu_q[t + 1] - pr.cu_q[t]);
    p.max_seqlen_k = std::max(p.max_seqlen_k, pr.cu_k[t + 1] - pr.cu_k[t]);
  }
  p.causal = pr.causal;
  p.o = pr.o.data();
  p.lse = pr.lse.data();
  p.d_o = pr.d_o.data();
  p.dq = pr.dq.data();
  p.dk = pr.dk.data();
  p.dv = pr.dv.data();
  return p;
}

}  // namespace distca::kernels
