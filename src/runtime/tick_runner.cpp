// The runner: a forward, a backward or a mixed tick of layer steps (include/distca/runtime/tick_runner.h).
#include "distca/runtime/tick_runner.h"

#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>

#include "dispatcher_kv_once.h"

namespace distca::runtime {
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

Status TickRunner::add_direction(comm::Communicator& comm, const NanoPlans& plans, const AttentionDims& dims,
                                 int direction, const DispatcherOptions& options, const char* prefix) {
  DispatcherOptions o = options;
  const std::string pre(prefix);
  std::vector<Lane>& lanes = lanes_[static_cast<size_t>(direction)];
  if (mode_ == OverlapMode::kSingleStream) {
    o.label = pre.empty() ? "full" : pre;
    DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(comm, plans.full, dims, o));
    owned_.push_back(std::move(d));
    lanes.push_back({owned_.back().get(), direction == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0}});
    return Status::ok_status();
  }
  // The pair's K/V wire: the backward sides only where backward sends K/V (stateless).
  std::array<std::shared_ptr<const detail::KvOnce>, 2> once;
  if (kv_once_) once = detail::make_kv_once(plans, comm.rank(), o.stateless);
  for (int x = 0; x < 2; ++x) {
    o.label = (pre.empty() ? pre : pre + " ") + (x == 0 ? "ping" : "pong");
    o.kv_once = once[static_cast<size_t>(x)];
    DISTCA_ASSIGN_OR_RETURN(auto d, CaDispatcher::create(comm, plans.nano[static_cast<size_t>(x)], dims, o));
    owned_.push_back(std::move(d));
    lanes.push_back({owned_.back().get(), {x}});
  }
  if (direction == 1) std::swap(lanes[0], lanes[1]);  // backward: pong first
  return Status::ok_status();
}

Result<std::unique_ptr<TickRunner>> TickRunner::create(comm::Communicator& comm, const NanoPlans& plans,
                                                       const AttentionDims& dims, OverlapMode mode,
                                                       TraceRecorder* trace, bool stateless, bool kv_once) {
  std::unique_ptr<TickRunner> r(new TickRunner());
  r->comm_ = &comm;
  r->kv_once_ = kv_once;
  r->mode_ = mode;
  r->trace_ = trace;
  DispatcherOptions o;
  o.signal = mode == OverlapMode::kSignal;
  o.trace = trace;
  o.stateless = stateless;
  DISTCA_RETURN_IF_ERROR(r->add_direction(comm, plans, dims, 0, o, ""));
  // The backward runs on the forward's dispatchers, in its own lane order.
  r->lanes_[1] = r->lanes_[0];
  std::reverse(r->lanes_[1].begin(), r->lanes_[1].end());
  for (Lane& lane : r->lanes_[1]) std::reverse(lane.nanos.begin(), lane.nanos.end());
  return r;
}

Result<std::unique_ptr<TickRunner>> TickRunner::create_tick(comm::Communicator& comm, const NanoPlans* forward,
                                                            const NanoPlans* backward, const AttentionDims& dims,
                                                            OverlapMode mode, TraceRecorder* trace, bool kv_once) {
  std::unique_ptr<TickRunner> r(new TickRunner());
  r->comm_ = &comm;
  r->kv_once_ = kv_once;
  r->mode_ = mode;
  r->trace_ = trace;
  r->adopts_ = true;
  DispatcherOptions o;
  o.signal = mode == OverlapMode::kSignal;
  o.trace = trace;
  o.stateless = true;
  if (forward != nullptr) DISTCA_RETURN_IF_ERROR(r->add_direction(comm, *forward, dims, 0, o, "fwd"));
  if (backward != nullptr) DISTCA_RETURN_IF_ERROR(r->add_direction(comm, *backward, dims, 1, o, "bwd"));
  return r;
}

void TickRunner::linear(const LinearFn& fn, int nano, int layer, bool backward) {
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

namespace {

std::span<const float> in_rows(const float* p, int64_t rows, int64_t width) {
  return {p, p == nullptr ? size_t{0} : static_cast<size_t>(rows * width)};
}
std::span<float> out_rows(float* p, int64_t rows, int64_t width) {
  return {p, p == nullptr ? size_t{0} : static_cast<size_t>(rows * width)};
}

// OK when `rows` fit `need` and every buffer is given where rows are needed.
Status check_layer(const char* what, size_t layer, int64_t rows, int64_t need, std::initializer_list<const void*> bufs,
                   int rank) {
  const std::string at = std::string(what) + " layer " + std::to_string(layer) + " on rank " + std::to_string(rank);
  if (rows < need || rows < 0) {
    return Status::invalid_argument(at + ": the buffers hold " + std::to_string(rows) + " rows, the plan needs " +
                                    std::to_string(need));
  }
  for (const void* b : bufs) {
    if (need > 0 && b == nullptr) return Status::invalid_argument(at + ": a null buffer where the plan has rows");
  }
  return Status::ok_status();
}

}  // namespace

Status TickRunner::check_buffers(const TickIo& io) const {
  const int rank = comm_->rank();
  for (size_t d = 0; d < 2; ++d) {
    for (const Lane& lane : lanes_[d]) {
      const int64_t need = lane.disp->n_tokens();
      for (size_t l = 0; d == 0 && l < io.forward.size(); ++l) {
        const LayerForward& f = io.forward[l];
        DISTCA_RETURN_IF_ERROR(check_layer("forward", l, f.rows, need, {f.q, f.k, f.v, f.o}, rank));
      }
      for (size_t l = 0; d == 1 && l < io.backward.size(); ++l) {
        const LayerBackward& b = io.backward[l];
        DISTCA_RETURN_IF_ERROR(check_layer("backward", l, b.rows, need, {b.d_o, b.dq, b.dk, b.dv}, rank));
      }
      for (size_t l = 0; d == 1 && l < io.adopt.size(); ++l) {
        const LayerForward& a = io.adopt[l];
        DISTCA_RETURN_IF_ERROR(check_layer("adopted forward", l, a.rows, need, {a.q, a.k, a.v, a.o, a.lse}, rank));
      }
    }
  }
  return Status::ok_status();
}

Status TickRunner::forward_step(const TickIo& io, int j) {
  const LayerForward& b = io.forward[static_cast<size_t>(j)];
  const AttentionDims& dims = lanes_[0].front().disp->dims();
  const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
  for (const Lane& lane : lanes_[0]) {  // each lane's Q/KV travel under the next lane's work
    if (j > 0) DISTCA_RETURN_IF_ERROR(lane.disp->finish_forward(j - 1));
    for (int x : lane.nanos) linear(io.linear_forward, x, j, false);
    DISTCA_RETURN_IF_ERROR(lane.disp->start_forward(j, in_rows(b.q, b.rows, qf), in_rows(b.k, b.rows, kvf),
                                                    in_rows(b.v, b.rows, kvf), out_rows(b.o, b.rows, qf),
                                                    out_rows(b.lse, b.rows, dims.n_heads)));
  }
  return Status::ok_status();
}

Status TickRunner::backward_step(const TickIo& io, int j) {
  const int L = static_cast<int>(io.backward.size());
  const int l = L - 1 - j;  // the layer this step starts
  const LayerBackward& b = io.backward[static_cast<size_t>(l)];
  const bool accumulate = lanes_[1].size() > 1;  // nano-batch plans share K/V rows
  const AttentionDims& dims = lanes_[1].front().disp->dims();
  const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
  for (size_t i = 0; i < lanes_[1].size(); ++i) {
    const Lane& lane = lanes_[1][i];
    if (j > 0) DISTCA_RETURN_IF_ERROR(lane.disp->finish_backward(l + 1));
    for (int x : lane.nanos) linear(io.linear_backward, x, l + 1, true);
    if (accumulate && i == 0) {  // the first lane adds first, the next after: a fixed order
      const size_t n = static_cast<size_t>(lane.disp->n_tokens() * lane.disp->dims().kv_floats());
      std::fill_n(b.dk, n, 0.0f);
      std::fill_n(b.dv, n, 0.0f);
    }
    DISTCA_RETURN_IF_ERROR(lane.disp->start_backward(l, in_rows(b.d_o, b.rows, qf), out_rows(b.dq, b.rows, qf),
                                                     out_rows(b.dk, b.rows, kvf), out_rows(b.dv, b.rows, kvf),
                                                     accumulate ? BackwardWrite::kAccumulate : BackwardWrite::kOverwrite));
  }
  return Status::ok_status();
}

Status TickRunner::finish_forward(const TickIo& io, int L) {
  for (const Lane& lane : lanes_[0]) {
    DISTCA_RETURN_IF_ERROR(lane.disp->finish_forward(L - 1));
    for (int x : lane.nanos) linear(io.linear_forward, x, L, false);
  }
  return Status::ok_status();
}

Status TickRunner::finish_backward(const TickIo& io) {
  for (const Lane& lane : lanes_[1]) {
    DISTCA_RETURN_IF_ERROR(lane.disp->finish_backward(0));
    for (int x : lane.nanos) linear(io.linear_backward, x, 0, true);
  }
  return Status::ok_status();
}

Status TickRunner::run(const TickIo& io) {
  const CallTimer timer(total_s_);
  const bool fwd = !io.forward.empty(), bwd = !io.backward.empty();
  DISTCA_CHECK_MSG(fwd || bwd, "a runner pass without layers");
  DISTCA_CHECK_MSG(!fwd || !lanes_[0].empty(), "a forward on a runner without forward plans");
  DISTCA_CHECK_MSG(!bwd || !lanes_[1].empty(), "a backward on a runner without backward plans");
  // A tick's runner serves every direction it has on every rank (collectives).
  DISTCA_CHECK_MSG(!adopts_ || (fwd == !lanes_[0].empty() && bwd == !lanes_[1].empty()),
                   "a tick must run every direction it was planned with");
  const int L = static_cast<int>(fwd ? io.forward.size() : io.backward.size());
  DISTCA_CHECK(!fwd || !bwd || io.backward.size() == io.forward.size());
  if (bwd && adopts_) DISTCA_CHECK(io.adopt.size() == io.backward.size());
  DISTCA_RETURN_IF_ERROR(check_buffers(io));
  if (bwd && adopts_) {
    for (const Lane& lane : lanes_[1]) {
      const AttentionDims& dims = lane.disp->dims();
      const int64_t qf = dims.q_floats(), kvf = dims.kv_floats();
      for (int l = 0; l < L; ++l) {
        const LayerForward& a = io.adopt[static_cast<size_t>(l)];
        DISTCA_CHECK_MSG(a.lse != nullptr, "adopted forward without its LSE, layer " + std::to_string(l));
        lane.disp->adopt_forward(l, in_rows(a.q, a.rows, qf), in_rows(a.k, a.rows, kvf), in_rows(a.v, a.rows, kvf),
                                 in_rows(a.o, a.rows, qf), in_rows(a.lse, a.rows, dims.n_heads));
      }
    }
  } else {
    DISTCA_CHECK_MSG(io.adopt.empty(), "only a tick's backward adopts a forward");
  }
  for (int j = 0; j < L; ++j) {
    if (fwd) DISTCA_RETURN_IF_ERROR(forward_step(io, j));
    if (bwd) DISTCA_RETURN_IF_ERROR(backward_step(io, j));
    if (fwd) {
      for (const Lane& lane : lanes_[0]) DISTCA_RETURN_IF_ERROR(lane.disp->serve_forward(j));
    }
    if (bwd) {
      for (const Lane& lane : lanes_[1]) DISTCA_RETURN_IF_ERROR(lane.disp->serve_backward(L - 1 - j));
    }
  }
  if (fwd) DISTCA_RETURN_IF_ERROR(finish_forward(io, L));
  if (bwd) DISTCA_RETURN_IF_ERROR(finish_backward(io));
  return Status::ok_status();
}

Status TickRunner::forward(const std::vector<LayerForward>& layers, const LinearFn& linear) {
  TickIo io;
  io.forward = layers;
  io.linear_forward = linear;
  return run(io);
}

Status TickRunner::backward(const std::vector<LayerBackward>& layers, const LinearFn& linear) {
  TickIo io;
  io.backward = layers;
  io.linear_backward = linear;
  return run(io);
}

RunnerTimes TickRunner::times() const {
  RunnerTimes t;
  t.linear = linear_s_;
  for (const auto& d : owned_) t.waited += d->waited_seconds();
  t.attention = std::max(0.0, total_s_ - t.linear - t.waited);
  return t;
}

int64_t TickRunner::last_bytes_sent() const {
  int64_t bytes = 0;
  for (const auto& d : owned_) bytes += d->last_forward_bytes_sent() + d->last_backward_bytes_sent();
  return bytes;
}

}  // namespace distca::runtime
