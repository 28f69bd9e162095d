// The fixed-input TP layer (model/tp_layer_harness.h).
#include "distca/model/tp_layer_harness.h"

#include <algorithm>

#include "distca/core/check.h"
#include "distca/core/rng.h"

namespace distca::model {
namespace {

std::vector<float> random_vec(int64_t count, uint64_t stream, double scale) {
  Rng rng(7, stream);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& e : v) e = static_cast<float>(scale * rng.normal());
  return v;
}

}  // namespace

TpLayerHarness::TpLayerHarness(const ModelSpec& spec, int tp, int rank, int64_t rows) : n_(rows) {
  DISTCA_CHECK(check_tp(spec, tp).ok() && 0 <= rank && rank < tp && rows >= tp);
  d_ = tp_dims(spec, tp, rank);
  nr_ = tp_rows(n_, tp, rank).size();
  const int64_t h = d_.h, qd = d_.qd(), kvd = d_.kvd(), f = d_.f();
  shard_ = random_vec(d_.layer_params(), 1 + static_cast<uint64_t>(rank), 0.05);
  for (int64_t i = 0; i < h; ++i) shard_[static_cast<size_t>(i)] += 1.0f;  // attn_norm around 1
  x_ = random_vec(nr_ * h, 10 + static_cast<uint64_t>(rank), 1.0);
  o_ = random_vec(n_ * qd, 20, 1.0);
  dq_ = random_vec(n_ * qd, 21, 1.0);
  dk_ = random_vec(n_ * kvd, 22, 1.0);
  dv_ = random_vec(n_ * kvd, 23, 1.0);
  cos_ = random_vec(n_ * d_.hd / 2, 24, 1.0);
  sin_ = random_vec(n_ * d_.hd / 2, 25, 1.0);
  rstd1_.resize(static_cast<size_t>(nr_));
  rstd2_ = rstd1_;
  xn1_.resize(static_cast<size_t>(n_ * h));
  xn2_ = xn1_;
  q_.resize(static_cast<size_t>(n_ * qd));
  k_.resize(static_cast<size_t>(n_ * kvd));
  v_ = k_;
  g_.resize(static_cast<size_t>(n_ * f));
  u_ = a_ = g_;
  x_mid_.resize(static_cast<size_t>(nr_ * h));
  out_ = dx_ = x_mid_;
  d_o_ = q_;
}

Status TpLayerHarness::run(comm::Communicator& group, bool overlap) {
  const auto w = tp_layer_tensors<const float>(d_, shard_.data());
  grad_.assign(shard_.size(), 0.0f);
  const auto gw = tp_layer_tensors<float>(d_, grad_.data());
  const TpLayerActs<float> acts{x_.data(),     rstd1_.data(), xn1_.data(), q_.data(), k_.data(),
                                v_.data(),     o_.data(),     x_mid_.data(), rstd2_.data(), xn2_.data(),
                                g_.data(),     u_.data(),     a_.data(),   out_.data()};
  TpStep<float> s{n_, cos_.data(), sin_.data(), 1e-5};
  s.overlap = overlap;
  // The backward rewrites its q and k gradients in place (RoPE's inverse): fresh copies.
  std::vector<float> dq = dq_, dk = dk_;
  DISTCA_RETURN_IF_ERROR(tp_attention_in_forward<float>(group, d_, s, w, acts));
  DISTCA_RETURN_IF_ERROR(tp_attention_out_mlp_forward<float>(group, d_, s, w, acts));
  std::copy(out_.begin(), out_.end(), dx_.begin());
  DISTCA_RETURN_IF_ERROR(tp_attention_out_mlp_backward<float>(group, d_, s, w, gw, acts, dx_.data(), d_o_.data()));
  return tp_attention_in_backward<float>(group, d_, s, w, gw, acts, dq.data(), dk.data(), dv_.data(), dx_.data());
}

double TpLayerHarness::peak_bytes(const ModelSpec& spec, int tp, int64_t rows) {
  DISTCA_CHECK(check_tp(spec, tp).ok() && rows >= tp);
  TpDims d = tp_dims(spec, tp, 0);
  for (int r = 1; r < tp; ++r) {  // the rank with the most feed-forward columns
    const TpDims e = tp_dims(spec, tp, r);
    if (e.f() > d.f()) d = e;
  }
  const auto n = static_cast<double>(rows), nr = static_cast<double>((rows + tp - 1) / tp);
  const auto h = static_cast<double>(d.h), qd = static_cast<double>(d.qd()), kvd = static_cast<double>(d.kvd()),
             f = static_cast<double>(d.f()), hd = static_cast<double>(d.hd);
  const double floats = 2 * static_cast<double>(d.layer_params())         // shard, grad
                        + n * (2 * h + 5 * qd + 6 * kvd + 3 * f + hd)     // gathered rows, q..v, o, d(o), dq..dv + copies, g u a, RoPE
                        + nr * (4 * h + 2)                                 // x, x_mid, out, dx, rstd1, rstd2
                        + 4 * n * h;                                       // the layer functions' temporaries
  return floats * sizeof(float);
}

std::vector<float> TpLayerHarness::outputs() const {
  std::vector<float> bits = q_;
  for (const auto* t : {&out_, &dx_, &d_o_, &grad_}) bits.insert(bits.end(), t->begin(), t->end());
  return bits;
}

}  // namespace distca::model
