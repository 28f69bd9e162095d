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

Result<std::unique_ptr<TickRunner>> TickRunner::create(comm::Communicator& comm, const Plan* forward,
                                                       const Plan* backward, const AttentionDims& dims, bool signal,
                                                       TraceRecorder* trace) {
  std::unique_ptr<TickRunner> r(new TickRunner());
  r->comm_ = &comm;
  r->trace_ = trace;
  DispatcherOptions o;
  o.signal = signal;
  o.trace = trace;
  o.stateless = true;
  if (forward != nullptr) {
    o.label = "fwd";
    DISTCA_ASSIGN_OR_RETURN(r->fwd_, CaDispatcher::create(comm, *forward, dims, o));
  }
  if (backward != nullptr) {
    o.label = "bwd";
    DISTCA_ASSIGN_OR_RETURN(r->bwd_, CaDispatcher::create(comm, *backward, dims, o));
  }
  return r;
}

void TickRunner::linear(const LinearFn& fn, int nano, int layer, bool backward, const char* name) {
  if (!fn) return;
  const auto c0 = std::chrono::steady_clock::now();
  const double t0 = trace_ ? trace_->now_us() : 0;
  fn(nano, layer, backward);
  if (trace_) {
    TraceEvent e{name, "compute", 0, comm_->rank(), t0, trace_->now_us()};
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
  if (bwd_) {
    for (int l = 0; l < L; ++l) {
      const LayerForward& a = adopt[static_cast<size_t>(l)];
      DISTCA_CHECK_MSG(a.lse != nullptr, "adopted forward without its LSE, layer " + std::to_string(l));
      bwd_->adopt_forward(l, a.q, a.k, a.v, a.o, a.lse);
    }
  }
  for (int j = 0; j < L; ++j) {
    if (fwd_) {
      if (j > 0) DISTCA_RETURN_IF_ERROR(fwd_->finish_forward(j - 1));
      linear(linear_f, 0, j, false, "fwd linear");
      linear(linear_f, 1, j, false, "fwd linear");
      const LayerForward& b = fw[static_cast<size_t>(j)];
      DISTCA_RETURN_IF_ERROR(fwd_->start_forward(j, b.q, b.k, b.v, b.o, b.lse));
    }
    const int lb = L - 1 - j;  // the backward's layer of this step
    if (bwd_) {
      if (j > 0) DISTCA_RETURN_IF_ERROR(bwd_->finish_backward(lb + 1));
      linear(linear_b, 1, lb + 1, true, "bwd linear");
      linear(linear_b, 0, lb + 1, true, "bwd linear");
      const LayerBackward& b = bw[static_cast<size_t>(lb)];
      DISTCA_RETURN_IF_ERROR(bwd_->start_backward(lb, b.d_o, b.dq, b.dk, b.dv, BackwardWrite::kOverwrite));
    }
    if (fwd_) DISTCA_RETURN_IF_ERROR(fwd_->serve_forward(j));
    if (bwd_) DISTCA_RETURN_IF_ERROR(bwd_->serve_backward(lb));
  }
  if (fwd_) {
    if (L > 0) DISTCA_RETURN_IF_ERROR(fwd_->finish_forward(L - 1));
    linear(linear_f, 0, L, false, "fwd linear");
    linear(linear_f, 1, L, false, "fwd linear");
  }
  if (bwd_) {
    if (L > 0) DISTCA_RETURN_IF_ERROR(bwd_->finish_backward(0));
    linear(linear_b, 1, 0, true, "bwd linear");
    linear(linear_b, 0, 0, true, "bwd linear");
  }
  total_s_ += seconds_since(t_run);
  return Status::ok_status();
}

RunnerTimes TickRunner::times() const {
  RunnerTimes t;
  t.linear = linear_s_;
  for (const auto* d : {fwd_.get(), bwd_.get()}) {
    if (d != nullptr) t.waited += d->waited_seconds();
  }
  t.other = std::max(0.0, total_s_ - t.linear - t.waited);
  return t;
}

int64_t TickRunner::last_bytes_sent() const {
  int64_t bytes = 0;
  for (const auto* d : {fwd_.get(), bwd_.get()}) {
    if (d != nullptr) bytes += d->last_forward_bytes_sent() + d->last_backward_bytes_sent();
  }
  return bytes;
}

}  // namespace distca::runtime
