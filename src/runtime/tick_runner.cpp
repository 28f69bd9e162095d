// One mixed tick of CAD's pipelined schedule (include/distca/runtime/tick_runner.h).
#include "distca/runtime/tick_runner.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace distca::runtime {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<std::unique_ptr<TickRunner>> TickRunner::create(comm::Communicator& comm, const NanoPlans* forward,
                                                       const NanoPlans* backward, const AttentionDims& dims,
                                                       OverlapMode mode, TraceRecorder* trace) {
  std::unique_ptr<TickRunner> r(new TickRunner());
  r->comm_ = &comm;
  r->trace_ = trace;
  r->mode_ = mode;
  DispatcherOptions o;
  o.signal = mode == OverlapMode::kSignal;
  o.trace = trace;
  o.stateless = true;
  const NanoPlans* plans[2] = {forward, backward};
  for (int d = 0; d < 2; ++d) {
    if (plans[d] == nullptr) continue;
    const char* dir = d == 0 ? "fwd" : "bwd";
    if (mode == OverlapMode::kSingleStream) {
      o.label = dir;
      DISTCA_ASSIGN_OR_RETURN(r->disp_[d][0], CaDispatcher::create(comm, plans[d]->full, dims, o));
      continue;
    }
    for (int x = 0; x < 2; ++x) {
      o.label = std::string(dir) + (x == 0 ? " ping" : " pong");
      DISTCA_ASSIGN_OR_RETURN(r->disp_[d][x], CaDispatcher::create(comm, plans[d]->nano[static_cast<size_t>(x)], dims, o));
    }
  }
  return r;
}

void TickRunner::linear(const LinearFn& fn, int nano, int layer, bool backward, const char* name) {
  if (!fn) return;
  const auto c0 = std::chrono::steady_clock::now();
  const double t0 = trace_ ? trace_->now_us() : 0;
  fn(nano, layer, backward);
  if (trace_) {
    TraceEvent e{std::string(nano == 0 ? "ping " : "pong ") + name, "compute", 0, comm_->rank(), t0, trace_->now_us()};
    e.args = {{"nano", nano}, {"layer", layer}};
    trace_->record(std::move(e));
  }
  linear_s_ += seconds_since(c0);
}

Status TickRunner::run(const std::vector<LayerForward>& fw, const LinearFn& linear_f,
                       const std::vector<LayerForward>& adopt, const std::vector<LayerBackward>& bw,
                       const LinearFn& linear_b) {
  const auto t_run = std::chrono::steady_clock::now();
  const int L = static_cast<int>(fw.size());
  DISTCA_CHECK(adopt.size() == fw.size() && bw.size() == fw.size());
  auto& F = disp_[0];
  auto& B = disp_[1];
  const bool has_f = F[0] != nullptr, has_b = B[0] != nullptr;
  const bool single = mode_ == OverlapMode::kSingleStream;
  for (auto& d : B) {
    if (d == nullptr) continue;
    for (int l = 0; l < L; ++l) {
      const LayerForward& a = adopt[static_cast<size_t>(l)];
      DISTCA_CHECK_MSG(a.lse != nullptr, "adopted forward without its LSE, layer " + std::to_string(l));
      d->adopt_forward(l, a.q, a.k, a.v, a.o, a.lse);
    }
  }
  auto start_f = [&](int x, int j) {
    const LayerForward& b = fw[static_cast<size_t>(j)];
    return F[static_cast<size_t>(x)]->start_forward(j, b.q, b.k, b.v, b.o, b.lse);
  };
  auto start_b = [&](int x, int l) {
    const LayerBackward& b = bw[static_cast<size_t>(l)];
    if (single) return B[0]->start_backward(l, b.d_o, b.dq, b.dk, b.dv, BackwardWrite::kOverwrite);
    if (x == 1) {  // pong adds first, then ping, as PingPongRunner
      const size_t n = static_cast<size_t>(B[1]->n_tokens() * B[1]->dims().kv_floats());
      std::fill_n(b.dk, n, 0.0f);
      std::fill_n(b.dv, n, 0.0f);
    }
    return B[static_cast<size_t>(x)]->start_backward(l, b.d_o, b.dq, b.dk, b.dv, BackwardWrite::kAccumulate);
  };
  for (int j = 0; j < L; ++j) {
    const int lb = L - 1 - j;  // the backward's layer of this step
    if (has_f && single) {
      if (j > 0) DISTCA_RETURN_IF_ERROR(F[0]->finish_forward(j - 1));
      linear(linear_f, 0, j, false, "fwd linear");
      linear(linear_f, 1, j, false, "fwd linear");
      DISTCA_RETURN_IF_ERROR(start_f(0, j));
    } else if (has_f) {
      for (int x = 0; x < 2; ++x) {  // each nano-batch's Q/KV travel under the other's work
        if (j > 0) DISTCA_RETURN_IF_ERROR(F[static_cast<size_t>(x)]->finish_forward(j - 1));
        linear(linear_f, x, j, false, "fwd linear");
        DISTCA_RETURN_IF_ERROR(start_f(x, j));
      }
    }
    if (has_b && single) {
      if (j > 0) DISTCA_RETURN_IF_ERROR(B[0]->finish_backward(lb + 1));
      linear(linear_b, 1, lb + 1, true, "bwd linear");
      linear(linear_b, 0, lb + 1, true, "bwd linear");
      DISTCA_RETURN_IF_ERROR(start_b(0, lb));
    } else if (has_b) {
      for (int x : {1, 0}) {  // pong first: its dK/dV partials reach ping's rows
        if (j > 0) DISTCA_RETURN_IF_ERROR(B[static_cast<size_t>(x)]->finish_backward(lb + 1));
        linear(linear_b, x, lb + 1, true, "bwd linear");
        DISTCA_RETURN_IF_ERROR(start_b(x, lb));
      }
    }
    if (has_f) {
      for (auto& d : F) {
        if (d != nullptr) DISTCA_RETURN_IF_ERROR(d->serve_forward(j));
      }
    }
    if (has_b) {
      for (int x : {1, 0}) {
        if (B[static_cast<size_t>(x)] != nullptr) DISTCA_RETURN_IF_ERROR(B[static_cast<size_t>(x)]->serve_backward(lb));
      }
    }
  }
  if (has_f) {
    if (single) {
      if (L > 0) DISTCA_RETURN_IF_ERROR(F[0]->finish_forward(L - 1));
      linear(linear_f, 0, L, false, "fwd linear");
      linear(linear_f, 1, L, false, "fwd linear");
    } else {
      for (int x = 0; x < 2; ++x) {
        if (L > 0) DISTCA_RETURN_IF_ERROR(F[static_cast<size_t>(x)]->finish_forward(L - 1));
        linear(linear_f, x, L, false, "fwd linear");
      }
    }
  }
  if (has_b) {
    if (single) {
      if (L > 0) DISTCA_RETURN_IF_ERROR(B[0]->finish_backward(0));
      linear(linear_b, 1, 0, true, "bwd linear");
      linear(linear_b, 0, 0, true, "bwd linear");
    } else {
      for (int x : {1, 0}) {
        if (L > 0) DISTCA_RETURN_IF_ERROR(B[static_cast<size_t>(x)]->finish_backward(0));
        linear(linear_b, x, 0, true, "bwd linear");
      }
    }
  }
  total_s_ += seconds_since(t_run);
  return Status::ok_status();
}

RunnerTimes TickRunner::times() const {
  RunnerTimes t;
  t.linear = linear_s_;
  for (const auto& dir : disp_) {
    for (const auto& d : dir) {
      if (d != nullptr) t.waited += d->waited_seconds();
    }
  }
  t.attention = std::max(0.0, total_s_ - t.linear - t.waited);
  return t;
}

int64_t TickRunner::last_bytes_sent() const {
  int64_t bytes = 0;
  for (const auto& dir : disp_) {
    for (const auto& d : dir) {
      if (d != nullptr) bytes += d->last_forward_bytes_sent() + d->last_backward_bytes_sent();
    }
  }
  return bytes;
}

}  // namespace distca::runtime
