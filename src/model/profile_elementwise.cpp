// The element-wise timing of the hardware profile (profile_elementwise.h): the trainer's
// phases of src/model/llama.cpp without their GEMMs, on buffers of the same shapes.
#include "distca/model/profile_elementwise.h"
#include "distca/core/stats.h"

#include <algorithm>
#include <span>
#include <vector>

#include "distca/core/check.h"
#include "distca/core/clock.h"
#include "distca/core/rng.h"
#include "distca/model/layers.h"
#include "distca/model/optimizer.h"

namespace distca::model {
namespace {

// One untimed run (first touch of the buffers, as the trainer's first step pays), then
// `repeats` timed measurements, each after `sync` and over at least `min_call_seconds`
// (time_calls: back-to-back runs): the median seconds per run.
Result<double> time_median(int repeats, const std::function<Status()>& sync, double min_call_seconds,
                           const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    if (sync) DISTCA_RETURN_IF_ERROR(sync());
    t.push_back(time_calls(fn, min_call_seconds, monotonic_seconds, monotonic_seconds()).per_call);
  }
  return median(std::move(t));
}

// The trainer's residual add (llama.cpp add_inplace): a plain loop on the calling thread.
void add_inplace(float* y, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

std::vector<float> filled(Rng& rng, int64_t count, double scale) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

}  // namespace

int64_t elementwise_optimizer_params(const ModelSpec& s) {
  const int64_t h = s.hidden;
  const int64_t layer = h * (s.q_dim() + 2 * s.kv_dim()) + s.q_dim() * h + 3 * h * s.ffn + 2 * h;
  return layer + 2 * s.vocab * h + h;  // + embedding, LM head, final norm
}

double elementwise_profile_bytes(const ModelSpec& s, int64_t tokens) {
  const auto n = static_cast<double>(tokens);
  const double per_row = static_cast<double>(8 * s.hidden + 2 * s.q_dim() + 2 * s.kv_dim() + s.head_dim +
                                             6 * s.ffn + s.vocab + 4);
  return 4.0 * n * per_row + 16.0 * static_cast<double>(elementwise_optimizer_params(s));
}

Result<ElementwiseSeconds> time_elementwise(const ModelSpec& s, int64_t tokens, int repeats,
                                            const std::function<Status()>& sync, uint64_t seed,
                                            double min_call_seconds) {
  DISTCA_CHECK(tokens >= 1 && repeats >= 1 && s.head_dim % 2 == 0);
  const int64_t n = tokens, h = s.hidden, qd = s.q_dim(), kvd = s.kv_dim(), f = s.ffn, v = s.vocab;
  const int64_t hd = s.head_dim;
  constexpr double kEps = 1e-5;
  Rng rng(seed, 17);
  // Forward: x (n, h) the layer input, x_mid and next (n, h) the residual stream, xn (n, h),
  // rstd (n), gain (h), q (n, qd), k (n, kvd), cos / sin (n, hd / 2), g, u, a (n, f).
  std::vector<float> x = filled(rng, n * h, 1.0), x_mid = filled(rng, n * h, 1.0), next = filled(rng, n * h, 1.0);
  std::vector<float> xn(static_cast<size_t>(n * h)), rstd(static_cast<size_t>(n));
  std::vector<float> gain = filled(rng, h, 1.0), q = filled(rng, n * qd, 1.0), k = filled(rng, n * kvd, 1.0);
  std::vector<float> cos_t(static_cast<size_t>(n * hd / 2)), sin_t(static_cast<size_t>(n * hd / 2));
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  rope_tables<float>(cos_t.data(), sin_t.data(), positions.data(), n, hd, 10000.0);
  std::vector<float> g = filled(rng, n * f, 1.0), u = filled(rng, n * f, 1.0), a(static_cast<size_t>(n * f));

  ElementwiseSeconds out;
  DISTCA_ASSIGN_OR_RETURN(double fwd, time_median(repeats, sync, min_call_seconds, [&] {
    rmsnorm_forward<float>(xn.data(), rstd.data(), x.data(), gain.data(), n, h, kEps);
    rope_apply<float>(q.data(), cos_t.data(), sin_t.data(), n, s.n_heads, hd, +1);
    rope_apply<float>(k.data(), cos_t.data(), sin_t.data(), n, s.n_kv_heads, hd, +1);
    add_inplace(x_mid.data(), x.data(), n * h);
    rmsnorm_forward<float>(xn.data(), rstd.data(), x_mid.data(), gain.data(), n, h, kEps);
    swiglu_forward<float>(a.data(), g.data(), u.data(), n, f);
    add_inplace(next.data(), x_mid.data(), n * h);
  }));
  out.layer_forward = fwd / static_cast<double>(n);

  // Backward: dx, dxn (n, h), dgain (h), da, dg, du (n, f); dq, dk rotate q, k back in place.
  std::vector<float> dx(static_cast<size_t>(n * h)), dxn = filled(rng, n * h, 1.0), dgain(static_cast<size_t>(h));
  std::vector<float> da = filled(rng, n * f, 1.0), dg(static_cast<size_t>(n * f)), du(static_cast<size_t>(n * f));
  DISTCA_ASSIGN_OR_RETURN(double bwd, time_median(repeats, sync, min_call_seconds, [&] {
    swiglu_backward<float>(dg.data(), du.data(), da.data(), g.data(), u.data(), n, f);
    rmsnorm_backward<float>(dx.data(), dgain.data(), dxn.data(), x_mid.data(), rstd.data(), gain.data(), n, h);
    rope_apply<float>(q.data(), cos_t.data(), sin_t.data(), n, s.n_heads, hd, -1);
    rope_apply<float>(k.data(), cos_t.data(), sin_t.data(), n, s.n_kv_heads, hd, -1);
    rmsnorm_backward<float>(dx.data(), dgain.data(), dxn.data(), x.data(), rstd.data(), gain.data(), n, h);
  }));
  out.layer_backward = bwd / static_cast<double>(n);

  // The head: logits (n, v), per-token loss (n), targets (n) in [0, v). The backward writes
  // the logits' gradient in place, as backward_head does.
  std::vector<float> logits = filled(rng, n * v, 1.0), loss(static_cast<size_t>(n));
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int32_t& t : targets) t = static_cast<int32_t>(rng.uniform_int(static_cast<uint64_t>(v)));
  DISTCA_ASSIGN_OR_RETURN(double lf, time_median(repeats, sync, min_call_seconds, [&] {
    rmsnorm_forward<float>(xn.data(), rstd.data(), x.data(), gain.data(), n, h, kEps);
    (void)cross_entropy_forward<float>(loss.data(), logits.data(), targets.data(), n, v);
  }));
  out.loss_forward = lf / static_cast<double>(n);
  DISTCA_ASSIGN_OR_RETURN(double lb, time_median(repeats, sync, min_call_seconds, [&] {
    cross_entropy_backward<float>(logits.data(), logits.data(), targets.data(), n, v, 1.0 / static_cast<double>(n));
    std::fill(dx.begin(), dx.end(), 0.0F);
    rmsnorm_backward<float>(dx.data(), dgain.data(), dxn.data(), x.data(), rstd.data(), gain.data(), n, h);
  }));
  out.loss_backward = lb / static_cast<double>(n);

  // The optimizer on one layer's parameters plus the embedding and the LM head; the clip
  // scales by a factor near 1 (the values stay normal over the repeats).
  const int64_t np = elementwise_optimizer_params(s);
  std::vector<float> params = filled(rng, np, 0.02), grads = filled(rng, np, 1e-3);
  DISTCA_ASSIGN_OR_RETURN(AdamW opt, AdamW::create(np, {ParamGroup{0, np, true}}));
  Status step_status;
  DISTCA_ASSIGN_OR_RETURN(double os, time_median(repeats, sync, min_call_seconds, [&] {
    clip_to_norm(grads, 1.0001, 1.0);
    if (Status st = opt.step(params, grads, 1e-4); !st.ok() && step_status.ok()) step_status = st;
  }));
  DISTCA_RETURN_IF_ERROR(step_status);
  out.optimizer = os / static_cast<double>(np);
  return out;
}

}  // namespace distca::model
