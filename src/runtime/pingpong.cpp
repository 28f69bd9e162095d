// Ping-pong nano-batches and their schedule (include/distca/runtime/pingpong.h).
#include "distca/runtime/pingpong.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>


namespace distca::runtime {

Result<std::unique_ptr<PingPongRunner>> PingPongRunner::create(comm::Communicator& comm, const NanoPlans& plans,
                                                               const AttentionDims& dims, OverlapMode mode,
                                                               TraceRecorder* trace, bool stateless) {
  std::unique_ptr<PingPongRunner> r(new PingPongRunner());
  r->comm_ = &comm;
  r->mode_ = mode;
  r->trace_ = trace;
  DispatcherOptions o;
  o.signal = mode == OverlapMode::kSignal;
  o.trace = trace;
  o.stateless = stateless;
  if (mode == OverlapMode::kSingleStream) {
    o.label = "full";
    DISTCA_ASSIGN_OR_RETURN(r->full_, CaDispatcher::create(comm, plans.full, dims, o));
    return r;
  }
  for (int x = 0; x < 2; ++x) {
    o.label = x == 0 ? "ping" : "pong";
    DISTCA_ASSIGN_OR_RETURN(r->disp_[static_cast<size_t>(x)], CaDispatcher::create(comm, plans.nano[static_cast<size_t>(x)], dims, o));
  }
  return r;
}

void PingPongRunner::linear(const LinearFn& fn, int nano, int layer, bool backward) {
  if (!fn) return;
  const auto c0 = std::chrono::steady_clock::now();
  const double t0 = trace_ ? trace_->now_us() : 0;
  fn(nano, layer, backward);
  if (trace_) {
    TraceEvent e{std::string(nano == 0 ? "ping" : "pong") + (backward ? " linear bwd" : " linear"), "compute", 0,
                 comm_->rank(), t0, trace_->now_us()};
    e.args = {{"nano", nano}, {"layer", layer}};
    trace_->record(std::move(e));
  }
  linear_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
}

RunnerTimes PingPongRunner::times() const {
  RunnerTimes t;
  t.linear = linear_s_;
  for (const auto* d : {full_.get(), disp_[0].get(), disp_[1].get()}) {
    if (d != nullptr) t.waited += d->waited_seconds();
  }
  t.attention = std::max(0.0, total_s_ - t.linear - t.waited);
  return t;
}

int64_t PingPongRunner::last_bytes_sent() const {
  int64_t bytes = 0;
  for (const auto* d : {full_.get(), disp_[0].get(), disp_[1].get()}) {
    if (d != nullptr) bytes += d->last_forward_bytes_sent() + d->last_backward_bytes_sent();
  }
  return bytes;
}

namespace {

// Adds the wall time of a runner call to `total` on every return path.
class CallTimer {
 public:
  explicit CallTimer(double& total) : total_(total), t0_(std::chrono::steady_clock::now()) {}
  ~CallTimer() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

Status PingPongRunner::forward(const std::vector<LayerForward>& layers, const LinearFn& fn) {
  const CallTimer timer(total_s_);
  const int L = static_cast<int>(layers.size());
  if (mode_ == OverlapMode::kSingleStream) {
    for (int l = 0; l < L; ++l) {
      linear(fn, 0, l, false);
      linear(fn, 1, l, false);
      const LayerForward& b = layers[static_cast<size_t>(l)];
      DISTCA_RETURN_IF_ERROR(full_->forward(l, b.q, b.k, b.v, b.o, b.lse));
    }
    linear(fn, 0, L, false);
    linear(fn, 1, L, false);
    return Status::ok_status();
  }
  auto start = [&](int x, int l) {
    const LayerForward& b = layers[static_cast<size_t>(l)];
    return disp_[static_cast<size_t>(x)]->start_forward(l, b.q, b.k, b.v, b.o, b.lse);
  };
  // Tick by tick (docs/runtime.md): each nano-batch's exchange runs under the other's work.
  for (int l = 0; l < L; ++l) {
    if (l > 0) DISTCA_RETURN_IF_ERROR(disp_[0]->finish_forward(l - 1));
    linear(fn, 0, l, false);  // pong's O of layer l-1 in flight
    DISTCA_RETURN_IF_ERROR(start(0, l));
    if (l > 0) DISTCA_RETURN_IF_ERROR(disp_[1]->finish_forward(l - 1));
    linear(fn, 1, l, false);  // ping's Q/KV in flight
    DISTCA_RETURN_IF_ERROR(start(1, l));
    DISTCA_RETURN_IF_ERROR(disp_[0]->serve_forward(l));  // pong's Q/KV in flight
    DISTCA_RETURN_IF_ERROR(disp_[1]->serve_forward(l));  // ping's O in flight
  }
  if (L > 0) DISTCA_RETURN_IF_ERROR(disp_[0]->finish_forward(L - 1));
  linear(fn, 0, L, false);  // pong's O in flight
  if (L > 0) DISTCA_RETURN_IF_ERROR(disp_[1]->finish_forward(L - 1));
  linear(fn, 1, L, false);
  return Status::ok_status();
}

Status PingPongRunner::backward(const std::vector<LayerBackward>& layers, const LinearFn& fn) {
  const CallTimer timer(total_s_);
  const int L = static_cast<int>(layers.size());
  if (mode_ == OverlapMode::kSingleStream) {
    for (int l = L - 1; l >= 0; --l) {
      linear(fn, 1, l + 1, true);
      linear(fn, 0, l + 1, true);
      const LayerBackward& b = layers[static_cast<size_t>(l)];
      DISTCA_RETURN_IF_ERROR(full_->backward(l, b.d_o, b.dq, b.dk, b.dv, BackwardWrite::kOverwrite));
    }
    linear(fn, 1, 0, true);
    linear(fn, 0, 0, true);
    return Status::ok_status();
  }
  const int64_t kv_floats = n_tokens() * disp_[0]->dims().kv_floats();
  auto start = [&](int x, int l) {
    const LayerBackward& b = layers[static_cast<size_t>(l)];
    if (x == 1) {  // pong adds first, then ping: a fixed order whatever the timing
      std::memset(b.dk, 0, static_cast<size_t>(kv_floats) * sizeof(float));
      std::memset(b.dv, 0, static_cast<size_t>(kv_floats) * sizeof(float));
    }
    return disp_[static_cast<size_t>(x)]->start_backward(l, b.d_o, b.dq, b.dk, b.dv, BackwardWrite::kAccumulate);
  };
  for (int l = L - 1; l >= 0; --l) {
    if (l < L - 1) DISTCA_RETURN_IF_ERROR(disp_[1]->finish_backward(l + 1));
    linear(fn, 1, l + 1, true);  // ping's dQ/dKV of layer l+1 in flight
    DISTCA_RETURN_IF_ERROR(start(1, l));
    if (l < L - 1) DISTCA_RETURN_IF_ERROR(disp_[0]->finish_backward(l + 1));
    linear(fn, 0, l + 1, true);  // pong's dO in flight
    DISTCA_RETURN_IF_ERROR(start(0, l));
    DISTCA_RETURN_IF_ERROR(disp_[1]->serve_backward(l));  // ping's dO in flight
    DISTCA_RETURN_IF_ERROR(disp_[0]->serve_backward(l));  // pong's dQ/dKV in flight
  }
  if (L > 0) DISTCA_RETURN_IF_ERROR(disp_[1]->finish_backward(0));
  linear(fn, 1, 0, true);  // ping's dQ/dKV in flight
  if (L > 0) DISTCA_RETURN_IF_ERROR(disp_[0]->finish_backward(0));
  linear(fn, 0, 0, true);
  return Status::ok_status();
}

Status gather_trace(comm::Communicator& comm, const std::vector<TraceEvent>& mine,
                    std::vector<TraceEvent>* out) {
  const std::vector<std::byte> bytes = pack_trace_events(mine);
  const int64_t my_size = static_cast<int64_t>(bytes.size());
  DISTCA_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, comm.all_gather_value(my_size));
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<size_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
  sc[0] = bytes.size();
  std::vector<std::byte> recv;
  if (comm.rank() == 0) {
    size_t off = 0;
    for (size_t p = 0; p < n; ++p) {
      rc[p] = static_cast<size_t>(sizes[p]);
      rd[p] = off;
      off += rc[p];
    }
    recv.resize(off);
  }
  DISTCA_RETURN_IF_ERROR(comm.all_to_all_v({bytes.data(), sc, sd, recv.data(), rc, rd}));
  if (comm.rank() != 0) return Status::ok_status();
  out->clear();
  for (size_t p = 0; p < n; ++p) {
    DISTCA_ASSIGN_OR_RETURN(auto ev, unpack_trace_events(std::span<const std::byte>(recv.data() + rd[p], rc[p])));
    out->insert(out->end(), ev.begin(), ev.end());
  }
  return Status::ok_status();
}

}  // namespace distca::runtime
