#include "distca/model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

namespace distca::model {
namespace {
bool finite(double x) { return std::isfinite(x); }
}  // namespace

Status AdamWConfig::validate() const {
  if (!finite(beta1) || beta1 < 0 || beta1 >= 1) {
    return Status::invalid_argument("beta1 must be in [0, 1)");
  }
  if (!finite(beta2) || beta2 < 0 || beta2 >= 1) {
    return Status::invalid_argument("beta2 must be in [0, 1)");
  }
  if (!finite(eps) || eps <= 0) return Status::invalid_argument("eps must be positive");
  if (!finite(weight_decay) || weight_decay < 0) {
    return Status::invalid_argument("weight_decay must be non-negative");
  }
  return Status::ok_status();
}

std::vector<ParamGroup> decay_groups(std::span<const TensorInfo> layout) {
  std::vector<ParamGroup> out;
  for (const TensorInfo& t : layout) {
    if (!out.empty() && out.back().decay == t.decay &&
        out.back().offset + out.back().size == t.offset) {
      out.back().size += t.size();
    } else {
      out.push_back({t.offset, t.size(), t.decay});
    }
  }
  return out;
}

Result<AdamW> AdamW::create(int64_t n_params, std::vector<ParamGroup> groups,
                            const AdamWConfig& config) {
  DISTCA_RETURN_IF_ERROR(config.validate());
  if (n_params < 0) return Status::invalid_argument("n_params must be non-negative");
  int64_t next = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].offset != next || groups[i].size < 0) {
      return Status::invalid_argument("param group " + std::to_string(i) + " starts at " +
                                      std::to_string(groups[i].offset) + ", expected " +
                                      std::to_string(next));
    }
    next += groups[i].size;
  }
  if (next != n_params) {
    return Status::invalid_argument("param groups cover " + std::to_string(next) + " of " +
                                    std::to_string(n_params) + " parameters");
  }
  AdamW a;
  a.config_ = config;
  a.groups_ = std::move(groups);
  a.m_.assign(static_cast<size_t>(n_params), 0.0f);
  a.v_.assign(static_cast<size_t>(n_params), 0.0f);
  return a;
}

// Vectorised: this file is compiled with -fno-math-errno (src/model/CMakeLists.txt), since the
// square root's errno check would keep the update loop scalar; the operations stay the same
// correctly rounded ones, so the bits do too.
Status AdamW::step(std::span<float> params, std::span<const float> grads, double lr) {
  if (static_cast<int64_t>(params.size()) != n_params()) {
    return Status::invalid_argument("params: " + std::to_string(params.size()) +
                                    " elements, optimizer has " + std::to_string(n_params()));
  }
  if (static_cast<int64_t>(grads.size()) != n_params()) {
    return Status::invalid_argument("grads: " + std::to_string(grads.size()) +
                                    " elements, optimizer has " + std::to_string(n_params()));
  }
  if (!finite(lr) || lr < 0) return Status::invalid_argument("lr must be finite and >= 0");
  ++step_;
  const double b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step_));
  // Raw restrict pointers: the four arrays never overlap, and saying so lets the compiler
  // vectorise the loop (the same IEEE operations per element, so the same bits).
  float* __restrict p_all = params.data();
  const float* __restrict g_all = grads.data();
  float* __restrict m_all = m_.data();
  float* __restrict v_all = v_.data();
  for (const ParamGroup& g : groups_) {
    const double shrink = g.decay ? 1.0 - lr * config_.weight_decay : 1.0;
    const int64_t end = g.offset + g.size;
    // Element-wise: any thread split gives the same bits.
#pragma omp parallel for simd schedule(static) if (g.size > (1 << 16))
    for (int64_t i = g.offset; i < end; ++i) {
      const double grad = g_all[i];
      const double m = b1 * m_all[i] + (1.0 - b1) * grad;
      const double v = b2 * v_all[i] + (1.0 - b2) * grad * grad;
      m_all[i] = static_cast<float>(m);
      v_all[i] = static_cast<float>(v);
      const double p = p_all[i] * shrink;
      p_all[i] = static_cast<float>(p - lr * (m / bc1) / (std::sqrt(v / bc2) + eps));
    }
  }
  return Status::ok_status();
}

double global_norm(std::span<const float> grads) { return std::sqrt(squared_norm(grads)); }

double norm_from_tensor_squares(std::span<const double> squares) {
  double ss = 0;
  for (const double x : squares) ss += x;
  return std::sqrt(ss);
}

double squared_norm(std::span<const float> grads) {
  // A fixed summation tree, whatever the thread count: fixed chunks, each summed with eight
  // interleaved accumulators (lane j takes elements j, j + 8, ...: vectorisable without
  // reassociating), the lanes and then the chunks added in a fixed order.
  constexpr int64_t kChunk = 1 << 14, kLanes = 8;
  const auto n = static_cast<int64_t>(grads.size());
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(static_cast<size_t>(chunks));
  const float* g = grads.data();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    double lane[kLanes] = {};
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(g[i + j]) * g[i + j];
    }
    for (int64_t j = 0; i < end; ++i, ++j) lane[j] += static_cast<double>(g[i]) * g[i];
    part[static_cast<size_t>(c)] =
        ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  double ss = 0;
  for (const double p : part) ss += p;
  return ss;
}

double clip_grad_norm(std::span<float> grads, double max_norm) {
  const double norm = global_norm(grads);
  clip_to_norm(grads, norm, max_norm);
  return norm;
}

void clip_to_norm(std::span<float> grads, double norm, double max_norm) {
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    const double scale = max_norm / norm;
    float* g = grads.data();
    const auto n = static_cast<int64_t>(grads.size());
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(g[i] * scale);
  }
}

Status LrSchedule::validate() const {
  if (!finite(max_lr) || max_lr < 0) return Status::invalid_argument("max_lr must be >= 0");
  if (!finite(min_lr) || min_lr < 0 || min_lr > max_lr) {
    return Status::invalid_argument("min_lr must be in [0, max_lr]");
  }
  if (total_steps <= 0) return Status::invalid_argument("total_steps must be positive");
  if (warmup_steps < 0 || warmup_steps > total_steps) {
    return Status::invalid_argument("warmup_steps must be in [0, total_steps]");
  }
  return Status::ok_status();
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) {
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (step >= total_steps) return min_lr;
  const double r = static_cast<double>(step - warmup_steps) /
                   static_cast<double>(total_steps - warmup_steps);
  return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * r));
}

}  // namespace distca::model
