// The CA dispatcher (include/distca/runtime/dispatcher.h).
#include "distca/runtime/dispatcher.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "distca/core/check.h"
#include "distca/kernels/attention.h"
#include "distca/kernels/attention_traits.h"
#include "dispatcher_kv_once.h"
#include "dispatcher_relay.h"

namespace distca::runtime {

Status AttentionDims::validate() const {
  if (n_heads <= 0) return Status::invalid_argument("n_heads must be positive");
  if (n_kv_heads <= 0) return Status::invalid_argument("n_kv_heads must be positive");
  if (head_dim <= 0) return Status::invalid_argument("head_dim must be positive");
  if (n_heads % n_kv_heads != 0) return Status::invalid_argument("n_kv_heads must divide n_heads");
  return Status::ok_status();
}

namespace {

size_t sz(int64_t x) { return static_cast<size_t>(x); }

// One all-to-all-v in flight, with the 1-byte buffers of signal mode (which must live until
// the exchange completes; moving the vectors keeps their storage).
struct InFlight {
  std::unique_ptr<comm::Exchange> handle;
  std::vector<std::byte> sig_send, sig_recv;
  double start_us = 0;
  int64_t bytes_sent = 0;
};

// Starts the exchange `ex` of rows of `row_floats` floats into `f` (started at `start_us` for
// the trace): send rows from `send`, receive into `recv` (both laid out by ex's
// displacements, in rows).
// `name` labels the transfer in a backend's own trace (AllToAllV::label).
Status start_exchange(comm::Communicator& comm, const Exchange& ex, const float* send, float* recv,
                      int64_t row_floats, bool signal, double start_us, const std::string& name, InFlight& out) {
  const size_t n = sz(comm.size());
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  InFlight f;
  f.start_us = start_us;
  const std::byte* sp = reinterpret_cast<const std::byte*>(send);
  std::byte* rp = reinterpret_cast<std::byte*>(recv);
  if (signal) {
    f.sig_send.assign(n, std::byte{1});
    f.sig_recv.assign(n, std::byte{0});
    for (size_t p = 0; p < n; ++p) {
      sc[p] = ex.send_counts[p] > 0 ? 1 : 0;
      rc[p] = ex.recv_counts[p] > 0 ? 1 : 0;
      sd[p] = rd[p] = p;
      f.bytes_sent += static_cast<int64_t>(sc[p]);
    }
    sp = f.sig_send.data();
    rp = f.sig_recv.data();
  } else {
    const size_t rb = sz(row_floats) * sizeof(float);
    for (size_t p = 0; p < n; ++p) {
      sc[p] = sz(ex.send_counts[p]) * rb;
      sd[p] = sz(ex.send_displs[p]) * rb;
      rc[p] = sz(ex.recv_counts[p]) * rb;
      rd[p] = sz(ex.recv_displs[p]) * rb;
      f.bytes_sent += static_cast<int64_t>(sc[p]);
    }
  }
  comm::AllToAllV a{sp, sc, sd, rp, rc, rd};
  a.label = name.c_str();
  auto h = comm.start_all_to_all_v(a);
  if (!h.ok()) return h.status();
  f.handle = std::move(h).value();
  out = std::move(f);
  return Status::ok_status();
}

// Calls fn(local_row, wire_row) for every row of `blocks` (per peer, in order from displs),
// in ascending peer order. A block lies inside one piece, so its local rows are consecutive.
template <class Fn>
void for_rows(const DocumentIndex& index, int rank, const PeerVector<std::vector<RowBlock>>& blocks,
              const PeerVector<int64_t>& displs, Fn fn) {
  // Only the peers that hold blocks, ascending (the order a dense walk would visit them in).
  for (const auto& [p, peer_blocks] : blocks.entries()) {
    int64_t w = displs[p];
    for (const RowBlock& b : peer_blocks) {
      const int64_t l = index.local_row(rank, b.doc, b.begin);
      DISTCA_CHECK_MSG(l >= 0, "plan block not held by this rank");
      for (int64_t i = 0; i < b.rows(); ++i) fn(l + i, w + i);
      w += b.rows();
    }
  }
}

// The server's fused call (forward, or backward once the caller adds dO and the gradients):
// q, o (total_q, H, d); k, v (total_kv, Hkv, d); lse (H, total_q); cu_q / cu_k [tasks + 1].
kernels::AttentionParams fused_params(const AttentionDims& dims, const std::vector<int32_t>& cu_q,
                                      const std::vector<int32_t>& cu_k, const float* q, const float* k,
                                      const float* v, float* o, float* lse) {
  kernels::AttentionParams p;
  p.q = q, p.k = k, p.v = v;
  p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data();
  p.n_tasks = static_cast<int32_t>(cu_q.size()) - 1;
  p.n_heads = dims.n_heads, p.n_kv_heads = dims.n_kv_heads, p.head_dim = dims.head_dim;
  p.softmax_scale = dims.softmax_scale;
  p.causal = true;
  p.o = o, p.lse = lse;
  return p;
}

void copy_row(const float* src, float* dst, int64_t n) {
  std::memcpy(dst, src, sz(n) * sizeof(float));
}
void add_row(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

// A layer's position in the call order of dispatcher.h; each phased call moves it one step.
enum class CaDispatcher::Phase {
  kIdle,              // no state (never started, finished backward, or released)
  kForwardStarted,    // start_forward: Q and K|V exchanges in flight
  kForwardServed,     // serve_forward: fused forward ran, O|LSE exchange in flight
  kForwardFinished,   // finish_forward: outputs delivered; fused state kept for backward
  kBackwardStarted,   // start_backward: dO (and, stateless, the inputs again) in flight
  kBackwardServed,    // serve_backward: fused backward ran, dQ and dK|dV exchanges in flight
};

namespace {
const char* phase_name(int p) {
  static const char* const kNames[] = {"idle (no forward started)", "forward started", "forward served",
                                       "forward finished", "backward started", "backward served"};
  return p >= 0 && p < 6 ? kNames[p] : "?";
}
}  // namespace

struct CaDispatcher::LayerState {
  Phase phase = Phase::kIdle;
  // Caller buffers (forward, then backward).
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  float *o = nullptr, *lse = nullptr;
  const float* d_o = nullptr;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  BackwardWrite write = BackwardWrite::kOverwrite;
  // Wire buffers, (rows, row floats) laid out by the plan's exchanges.
  std::vector<float> q_send, q_recv, kv_send, kv_recv, olse_send, olse_recv;
  std::vector<float> do_send, do_recv, dq_send, dq_recv, dkv_send, dkv_recv;
  // The fused call (server side), kept from forward to backward (dropped after forward by
  // stateless servers and rebuilt in backward):
  //   fq, fo: (total_q, n_heads, head_dim); fk, fv: (total_kv, n_kv_heads, head_dim);
  //   flse: (n_heads, total_q).
  std::vector<float> fq, fk, fv, fo, flse;
  // This server's own share of the dK / dV of this rank's rows, (n_tokens, n_kv_heads,
  // head_dim), summed over its tasks in task order by serve_backward; finish_backward adds the
  // received partials to it.
  std::vector<float> home_dk, home_dv;
  // Stateless servers: the LSE of this rank's own rows, (n_tokens, n_heads), which the home
  // sends back with Q and O in backward.
  std::vector<float> home_lse;
  InFlight ex_q, ex_kv, ex_olse, ex_do, ex_dq, ex_dkv;
  // K/V relays (dispatcher_relay.h): the two exchanges' buffers, while they run.
  std::vector<float> kv1_send, kv1_recv, kv2_send, kv2_recv;
  InFlight ex_kv2;
  // The K/V wire of a nano-batch pair (dispatcher_kv_once.h): what arrived, in the wire's
  // layout, until finish_kv has filled kv_recv from it.
  std::vector<float> wire_recv;
};

CaDispatcher::CaDispatcher(comm::Communicator& comm, const Plan& plan, const AttentionDims& dims,
                           const DispatcherOptions& options)
    : comm_(comm),
      plan_(plan),
      dims_(dims),
      options_(options),
      label_(options.label.empty() ? "" : options.label + " "),
      rank_(comm.rank()),
      index_(plan.batch) {}

CaDispatcher::~CaDispatcher() = default;

Result<std::unique_ptr<CaDispatcher>> CaDispatcher::create(comm::Communicator& comm, const Plan& plan,
                                                           const AttentionDims& dims,
                                                           const DispatcherOptions& options) {
  DISTCA_RETURN_IF_ERROR(dims.validate());
  const size_t n = sz(comm.size());
  if (plan.ranks.size() != n || plan.servers.size() != n) {
    return Status::invalid_argument("plan has " + std::to_string(plan.ranks.size()) +
                                    " ranks but the communicator has " + std::to_string(n));
  }
  const ServerPlan& sp = plan.servers[sz(comm.rank())];
  if (sp.cu_seqlens_q.size() != sp.tasks.size() + 1 || sp.cu_seqlens_k.size() != sp.tasks.size() + 1) {
    return Status::invalid_argument("plan: cu_seqlens of server " + std::to_string(comm.rank()) +
                                    " do not match its tasks");
  }
  for (size_t t = 0; t < sp.tasks.size(); ++t) {
    const TaskPlacement& tp = sp.tasks[t].task;
    if (sp.cu_seqlens_q[t + 1] - sp.cu_seqlens_q[t] != tp.q_end - tp.q_begin ||
        sp.cu_seqlens_k[t + 1] - sp.cu_seqlens_k[t] != tp.q_end) {
      return Status::invalid_argument("plan: cu_seqlens of server " + std::to_string(comm.rank()) +
                                      " disagree with task " + std::to_string(t));
    }
  }
  for (const auto& ex : plan.ranks[sz(comm.rank())].exchanges) {
    if (ex.send_counts.size() != n || ex.recv_counts.size() != n) {
      return Status::invalid_argument("plan: exchange layout is not sized for " + std::to_string(n) + " ranks");
    }
  }
  std::unique_ptr<CaDispatcher> d(new CaDispatcher(comm, plan, dims, options));
  DISTCA_RETURN_IF_ERROR(d->align_tasks());
  d->relay_ = std::make_unique<detail::KvRelayLayout>(detail::make_kv_relay_layout(plan, comm.rank()));
  return d;
}

int64_t query_tile_rows(const AttentionDims& dims) {
  return kernels::AttentionTraits::query_tile_rows(dims.n_heads / dims.n_kv_heads);
}

// Pads every task of the fused call so that its query tiles are the whole-document call's:
// rows [a, b) become [a', b') with a' = a rounded down and b' = b rounded up (capped at the
// document's length) to the kernel's query tile; context [0, b'). Pad query rows are zeros
// (their outputs are dropped, their dO is 0 so they add exact zeros to dK/dV); pad context
// rows [b, b') are zeros that no real row sees. Row i of the padded task sees keys up to
// a' + i, its document position, as before.
Status CaDispatcher::align_tasks() {
  const ServerPlan& sp = plan_.servers[sz(rank_)];
  const int64_t tile = query_tile_rows(dims_);
  int64_t cq = 0, ck = 0;
  cu_q_.assign(1, 0);
  cu_k_.assign(1, 0);
  q_row_.clear();
  pad_rows_ = 0;
  for (const ServerTask& st : sp.tasks) {
    const TaskPlacement& t = st.task;
    const int64_t a0 = (t.q_begin / tile) * tile;
    const int64_t b1 = std::min(index_.doc_len(t.doc), (t.q_end + tile - 1) / tile * tile);
    q_row_.push_back(cq + (t.q_begin - a0));
    pad_rows_ += (b1 - a0) - (t.q_end - t.q_begin);
    cq += b1 - a0;
    ck += b1;
    if (cq > INT32_MAX || ck > INT32_MAX) return Status::invalid_argument("plan: fused call of server " + std::to_string(rank_) + " exceeds int32 rows");
    cu_q_.push_back(static_cast<int32_t>(cq));
    cu_k_.push_back(static_cast<int32_t>(ck));
  }
  return Status::ok_status();
}

int64_t CaDispatcher::n_tokens() const { return plan_.ranks[sz(rank_)].tokens; }

CaDispatcher::LayerState& CaDispatcher::state_in(int layer, Phase expected, const char* call) {
  auto& s = layers_[layer];
  if (!s) s = std::make_unique<LayerState>();
  DISTCA_CHECK_MSG(s->phase == expected,
                   std::string(call) + "(" + std::to_string(layer) + ") out of order: expects the layer " +
                       phase_name(static_cast<int>(expected)) + ", but it is " +
                       phase_name(static_cast<int>(s->phase)));
  return *s;
}

void CaDispatcher::release(int layer) {
  auto it = layers_.find(layer);
  if (it == layers_.end()) return;
  give_all(*it->second);
  layers_.erase(it);
}

void CaDispatcher::take(std::vector<float>& v, int64_t floats) {
  const size_t n = sz(floats);
  if (n >= kPooledFloats && v.capacity() < n) {
    give(v);
    // Best fit among the spares that waste at most half their floats.
    size_t best = spare_.size();
    for (size_t i = 0; i < spare_.size(); ++i) {
      const size_t c = spare_[i].capacity();
      if (c >= n && c <= 2 * n && (best == spare_.size() || c < spare_[best].capacity())) best = i;
    }
    if (best < spare_.size()) {
      v.swap(spare_[best]);
      spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(best));
    } else {
      // None fits: drop the spares too small for this size (a bound on what the pool holds),
      // then allocate.
      std::erase_if(spare_, [n](const std::vector<float>& b) { return b.capacity() < n; });
      ++allocations_;
    }
  }
  v.assign(n, 0.0f);
}

void CaDispatcher::give(std::vector<float>& v) {
  if (v.capacity() >= kPooledFloats) {
    spare_.push_back(std::move(v));
    spare_.back().clear();
  }
  v = {};
}

void CaDispatcher::give_all(LayerState& s) {
  for (std::vector<float>* b : {&s.q_send, &s.q_recv, &s.kv_send, &s.kv_recv, &s.olse_send, &s.olse_recv, &s.do_send,
                                &s.do_recv, &s.dq_send, &s.dq_recv, &s.dkv_send, &s.dkv_recv, &s.fq, &s.fk, &s.fv,
                                &s.fo, &s.flse, &s.home_dk, &s.home_dv, &s.home_lse, &s.kv1_send, &s.kv1_recv,
                                &s.kv2_send, &s.kv2_recv, &s.wire_recv}) {
    give(*b);
  }
}

void CaDispatcher::trace(const char* what, const char* category, double start_us) const {
  if (!options_.trace) return;
  TraceEvent e;
  e.name = options_.label.empty() ? std::string(what) : options_.label + " " + what;
  e.category = category;
  e.tid = rank_;
  e.start_us = start_us;
  e.end_us = options_.trace->now_us();
  options_.trace->record(std::move(e));
}

namespace {

// Waits for `f`; traces the transfer ("comm": start to the moment it was seen complete) and
// the exposed part ("wait": time blocked here); adds the blocked seconds to *waited.
Status finish_exchange(InFlight& f, TraceRecorder* trace, int rank, const std::string& name, double* waited) {
  if (!f.handle) return Status::ok_status();
  const auto c0 = std::chrono::steady_clock::now();
  const double t0 = trace ? trace->now_us() : 0;
  const bool done = f.handle->test();
  Status st = f.handle->wait();
  f.handle.reset();
  *waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  if (trace) {
    const double t1 = trace->now_us();
    trace->record({name, "comm", 0, rank, f.start_us, done ? t0 : t1});
    if (!done) trace->record({name + " wait", "wait", 0, rank, t0, t1});
  }
  return st;
}

}  // namespace

void CaDispatcher::check_buffer(const char* call, int layer, const char* name, size_t floats, int64_t row_floats) const {
  const int64_t need = n_tokens() * row_floats;
  DISTCA_CHECK_MSG(static_cast<int64_t>(floats) >= need,
                   std::string(call) + "(layer " + std::to_string(layer) + "): buffer " + name + " holds " +
                       std::to_string(floats) + " floats, the plan needs " + std::to_string(need) + " (" +
                       std::to_string(n_tokens()) + " rows of " + std::to_string(row_floats) + ") on rank " +
                       std::to_string(rank_));
}

void CaDispatcher::check_forward_buffers(const char* call, int layer, std::span<const float> q,
                                         std::span<const float> k, std::span<const float> v,
                                         std::span<const float> o) const {
  const int64_t qf = dims_.q_floats(), kvf = dims_.kv_floats();
  check_buffer(call, layer, "q", q.size(), qf);
  check_buffer(call, layer, "k", k.size(), kvf);
  check_buffer(call, layer, "v", v.size(), kvf);
  check_buffer(call, layer, "o", o.size(), qf);
}

Status CaDispatcher::start_forward(int layer, std::span<const float> q, std::span<const float> k,
                                   std::span<const float> v, std::span<float> o, std::span<float> lse) {
  const double t0 = options_.trace ? options_.trace->now_us() : 0;
  check_forward_buffers("start_forward", layer, q, k, v, o);
  if (lse.data() != nullptr) check_buffer("start_forward", layer, "lse", lse.size(), dims_.n_heads);
  // A finished forward may be replaced (an evaluation step runs no backward).
  auto it = layers_.find(layer);
  if (it != layers_.end() && it->second->phase == Phase::kForwardFinished) it->second->phase = Phase::kIdle;
  LayerState& s = state_in(layer, Phase::kIdle, "start_forward");
  give_all(s);
  s = LayerState{};
  s.phase = Phase::kForwardStarted;
  s.q = q.data(), s.k = k.data(), s.v = v.data(), s.o = o.data(), s.lse = lse.data();
  if (options_.stateless) take(s.home_lse, n_tokens() * dims_.n_heads);
  const RankPlan& rp = plan_.ranks[sz(rank_)];
  const Exchange& xq = rp.exchange(ExchangeKind::kQ);
  const int64_t qf = dims_.q_floats();
  take(s.q_send, xq.send_rows() * qf);
  take(s.q_recv, xq.recv_rows() * qf);
  {  // signal mode does the same copies: only the wire differs
    for_rows(index_, rank_, xq.send_blocks, xq.send_displs, [&](int64_t l, int64_t w) {
      copy_row(s.q + l * qf, s.q_send.data() + w * qf, qf);
    });
    pack_kv(s, 0);
  }
  trace("pack q/kv", "compute", t0);
  const double ts = options_.trace ? options_.trace->now_us() : 0;
  DISTCA_RETURN_IF_ERROR(start_exchange(comm_, xq, s.q_send.data(), s.q_recv.data(), qf, options_.signal, ts, label_ + "q", s.ex_q));
  DISTCA_RETURN_IF_ERROR(start_kv(s, 0, ts));
  fwd_bytes_ = s.ex_q.bytes_sent + s.ex_kv.bytes_sent;
  return Status::ok_status();
}

const detail::KvWireSide* CaDispatcher::kv_side(int dir) const {
  const auto& once = options_.kv_once;
  return once && once->side[sz(dir)].on ? &once->side[sz(dir)] : nullptr;
}

const Exchange& CaDispatcher::kv_wire(int dir) const {
  const detail::KvWireSide* w = kv_side(dir);
  return w ? w->wire : plan_.ranks[sz(rank_)].exchange(ExchangeKind::kKv);
}

void CaDispatcher::pack_kv(LayerState& s, int dir) {
  const Exchange& wire = kv_wire(dir);
  const int64_t kvf = dims_.kv_floats();
  take(s.kv_send, wire.send_rows() * 2 * kvf);
  take(s.kv_recv, plan_.ranks[sz(rank_)].exchange(ExchangeKind::kKv).recv_rows() * 2 * kvf);
  for_rows(index_, rank_, wire.send_blocks, wire.send_displs, [&](int64_t l, int64_t w) {
    copy_row(s.k + l * kvf, s.kv_send.data() + w * 2 * kvf, kvf);
    copy_row(s.v + l * kvf, s.kv_send.data() + w * 2 * kvf + kvf, kvf);
  });
}

Status CaDispatcher::start_kv(LayerState& s, int dir, double start_us) {
  const int64_t f = 2 * dims_.kv_floats();
  const detail::KvWireSide* side = kv_side(dir);
  const Exchange& wire = kv_wire(dir);
  const detail::KvRelayLayout& relay = side ? side->relay : *relay_;
  float* recv = s.kv_recv.data();
  if (side) {
    take(s.wire_recv, wire.recv_rows() * f);
    recv = s.wire_recv.data();
  }
  if (!relay.on) {
    return start_exchange(comm_, wire, s.kv_send.data(), recv, f, options_.signal, start_us, label_ + "kv", s.ex_kv);
  }
  take(s.kv1_send, relay.first.send_rows() * f);
  take(s.kv1_recv, relay.first.recv_rows() * f);
  detail::copy_rows(relay.pack_first, s.kv_send.data(), s.kv1_send.data(), f);
  return start_exchange(comm_, relay.first, s.kv1_send.data(), s.kv1_recv.data(), f, options_.signal, start_us,
                        label_ + "kv", s.ex_kv);
}

Status CaDispatcher::finish_kv(LayerState& s, int layer, int dir, int64_t* bytes) {
  DISTCA_RETURN_IF_ERROR(finish_exchange(s.ex_kv, options_.trace, rank_, label_ + "kv", &waited_s_));
  const int64_t f = 2 * dims_.kv_floats();
  const detail::KvWireSide* side = kv_side(dir);
  const detail::KvRelayLayout& relay = side ? side->relay : *relay_;
  float* recv = side ? s.wire_recv.data() : s.kv_recv.data();
  if (relay.on) {
    // The relays forward what their host's other servers need; every row lands where the
    // layout as it travels puts it, so what follows is as without relays.
    detail::copy_rows(relay.unpack_first, s.kv1_recv.data(), recv, f);
    take(s.kv2_send, relay.second.send_rows() * f);
    take(s.kv2_recv, relay.second.recv_rows() * f);
    detail::copy_rows(relay.pack_second, recv, s.kv2_send.data(), f);
    const double ts = options_.trace ? options_.trace->now_us() : 0;
    DISTCA_RETURN_IF_ERROR(start_exchange(comm_, relay.second, s.kv2_send.data(), s.kv2_recv.data(), f,
                                          options_.signal, ts, label_ + "kv relay", s.ex_kv2));
    *bytes += s.ex_kv2.bytes_sent;
    DISTCA_RETURN_IF_ERROR(finish_exchange(s.ex_kv2, options_.trace, rank_, label_ + "kv relay", &waited_s_));
    detail::copy_rows(relay.unpack_second, s.kv2_recv.data(), recv, f);
    give(s.kv1_send), give(s.kv1_recv), give(s.kv2_send), give(s.kv2_recv);
  }
  if (!side) return Status::ok_status();
  // The wire to the plan's layout: this exchange's rows, then (taker) the giver's.
  detail::copy_rows(side->own, s.wire_recv.data(), s.kv_recv.data(), f);
  auto& stash = options_.kv_once->stash->rows;
  const auto key = std::make_pair(layer, dir);
  if (side->giver) {
    stash[key] = std::move(s.wire_recv);
    s.wire_recv = {};
    return Status::ok_status();
  }
  give(s.wire_recv);
  auto it = stash.find(key);
  DISTCA_CHECK_MSG(it != stash.end(), "kv once: layer " + std::to_string(layer) +
                                          " served before the nano-batch that gives its K/V rows");
  detail::copy_rows(side->given, it->second.data(), s.kv_recv.data(), f);
  give(it->second);
  stash.erase(it);
  return Status::ok_status();
}

void CaDispatcher::assemble_kv(LayerState& s) {
  const ServerPlan& sp = plan_.servers[sz(rank_)];
  const int64_t kvf = dims_.kv_floats();
  take(s.fk, cu_k_.back() * kvf);
  take(s.fv, cu_k_.back() * kvf);
  for (size_t t = 0; t < sp.tasks.size(); ++t) {
    int64_t row = cu_k_[t];
    for (const Segment& seg : sp.tasks[t].kv) {
      if (!seg.received) {  // consecutive local rows: one copy each for K and V
        std::memcpy(s.fk.data() + row * kvf, s.k + seg.offset * kvf, sz(seg.len * kvf) * sizeof(float));
        std::memcpy(s.fv.data() + row * kvf, s.v + seg.offset * kvf, sz(seg.len * kvf) * sizeof(float));
        row += seg.len;
        continue;
      }
      for (int64_t i = 0; i < seg.len; ++i, ++row) {
        const float* r = s.kv_recv.data() + (seg.offset + i) * 2 * kvf;
        copy_row(r, s.fk.data() + row * kvf, kvf);
        copy_row(r + kvf, s.fv.data() + row * kvf, kvf);
      }
    }
  }
}

Status CaDispatcher::serve_forward(int layer) {
  LayerState& s = state_in(layer, Phase::kForwardStarted, "serve_forward");
  const std::string lbl = options_.label.empty() ? "" : options_.label + " ";
  DISTCA_RETURN_IF_ERROR(finish_exchange(s.ex_q, options_.trace, rank_, lbl + "q", &waited_s_));
  DISTCA_RETURN_IF_ERROR(finish_kv(s, layer, 0, &fwd_bytes_));
  double t0 = options_.trace ? options_.trace->now_us() : 0;
  const ServerPlan& sp = plan_.servers[sz(rank_)];
  const int64_t qf = dims_.q_floats(), H = dims_.n_heads;
  const int64_t nt = static_cast<int64_t>(sp.tasks.size());
  const int64_t total_q = cu_q_.back();
  take(s.fq, total_q * qf);
  take(s.fo, total_q * qf);
  take(s.flse, total_q * H);
  // Assemble: query rows of each task, then its context [0, q_end) from the kv segments.
  for (int64_t t = 0; t < nt; ++t) {
    const ServerTask& st = sp.tasks[sz(t)];
    const int64_t ql = st.task.q_end - st.task.q_begin, q0 = q_row_[sz(t)];
    const float* src = st.task.home == rank_ ? s.q + st.q_offset * qf : s.q_recv.data() + st.q_offset * qf;
    std::memcpy(s.fq.data() + q0 * qf, src, sz(ql * qf) * sizeof(float));
  }
  assemble_kv(s);
  trace("assemble", "compute", t0);
  t0 = options_.trace ? options_.trace->now_us() : 0;
  if (nt > 0) {
    kernels::AttentionParams p = fused_params(dims_, cu_q_, cu_k_, s.fq.data(), s.fk.data(), s.fv.data(), s.fo.data(),
                                              s.flse.data());
    DISTCA_RETURN_IF_ERROR(kernels::validate(p));
    std::lock_guard<std::mutex> lock(kernels::kernel_mutex());
    kernels::attention_forward(p);
  }
  trace("attention fwd", "compute", t0);
  t0 = options_.trace ? options_.trace->now_us() : 0;
  // Outputs: local homes straight to the caller, remote homes into the kOLse send buffer.
  const Exchange& xo = plan_.ranks[sz(rank_)].exchange(ExchangeKind::kOLse);
  const int64_t of = qf + H;
  take(s.olse_send, xo.send_rows() * of);
  take(s.olse_recv, xo.recv_rows() * of);
  for (int64_t t = 0; t < nt; ++t) {
    const ServerTask& st = sp.tasks[sz(t)];
    const int64_t ql = st.task.q_end - st.task.q_begin, q0 = q_row_[sz(t)];
    for (int64_t i = 0; i < ql; ++i) {
      const float* orow = s.fo.data() + (q0 + i) * qf;
      if (st.task.home == rank_) {
        copy_row(orow, s.o + (st.q_offset + i) * qf, qf);
        for (float* lse : {s.lse, options_.stateless ? s.home_lse.data() : nullptr}) {
          if (!lse) continue;
          for (int64_t h = 0; h < H; ++h) lse[(st.q_offset + i) * H + h] = s.flse[sz(h * total_q + q0 + i)];
        }
      } else {
        float* w = s.olse_send.data() + (st.q_offset + i) * of;
        copy_row(orow, w, qf);
        for (int64_t h = 0; h < H; ++h) w[qf + h] = s.flse[sz(h * total_q + q0 + i)];
      }
    }
  }
  trace("pack o", "compute", t0);
  const double ts = options_.trace ? options_.trace->now_us() : 0;
  DISTCA_RETURN_IF_ERROR(start_exchange(comm_, xo, s.olse_send.data(), s.olse_recv.data(), of, options_.signal, ts, label_ + "o_lse", s.ex_olse));
  fwd_bytes_ += s.ex_olse.bytes_sent;
  // A stateless server forgets the fused call; backward sends its inputs again.
  if (options_.stateless) give(s.fq), give(s.fk), give(s.fv), give(s.fo), give(s.flse);
  s.phase = Phase::kForwardServed;
  return Status::ok_status();
}

Status CaDispatcher::finish_forward(int layer) {
  LayerState& s = state_in(layer, Phase::kForwardServed, "finish_forward");
  const std::string lbl = options_.label.empty() ? "" : options_.label + " ";
  DISTCA_RETURN_IF_ERROR(finish_exchange(s.ex_olse, options_.trace, rank_, lbl + "o_lse", &waited_s_));
  const double t0 = options_.trace ? options_.trace->now_us() : 0;
  const Exchange& xo = plan_.ranks[sz(rank_)].exchange(ExchangeKind::kOLse);
  const int64_t qf = dims_.q_floats(), H = dims_.n_heads, of = qf + H;
  {  // signal mode does the same copies: only the wire differs
    for_rows(index_, rank_, xo.recv_blocks, xo.recv_displs, [&](int64_t l, int64_t w) {
      const float* r = s.olse_recv.data() + w * of;
      copy_row(r, s.o + l * qf, qf);
      if (s.lse) copy_row(r + qf, s.lse + l * H, H);
      if (options_.stateless) copy_row(r + qf, s.home_lse.data() + l * H, H);
    });
  }
  // The wire buffers of the forward are not needed any more; the fused call is kept.
  give(s.q_send), give(s.q_recv), give(s.kv_send), give(s.kv_recv), give(s.olse_send), give(s.olse_recv);
  trace("unpack o", "compute", t0);
  s.phase = Phase::kForwardFinished;
  return Status::ok_status();
}

Status CaDispatcher::forward(int layer, std::span<const float> q, std::span<const float> k, std::span<const float> v,
                             std::span<float> o, std::span<float> lse) {
  DISTCA_RETURN_IF_ERROR(start_forward(layer, q, k, v, o, lse));
  DISTCA_RETURN_IF_ERROR(serve_forward(layer));
  return finish_forward(layer);
}

void CaDispatcher::adopt_forward(int layer, std::span<const float> q, std::span<const float> k,
                                 std::span<const float> v, std::span<const float> o, std::span<const float> lse) {
  DISTCA_CHECK_MSG(options_.stateless, "adopt_forward needs stateless servers (layer " + std::to_string(layer) + ")");
  check_forward_buffers("adopt_forward", layer, q, k, v, o);
  check_buffer("adopt_forward", layer, "lse", lse.size(), dims_.n_heads);
  LayerState& s = state_in(layer, Phase::kIdle, "adopt_forward");
  give_all(s);
  s = LayerState{};
  s.q = q.data(), s.k = k.data(), s.v = v.data();
  // Backward reads o only (the stateless kDO rows); the forward's output pointer is not kept.
  s.o = const_cast<float*>(o.data());
  s.home_lse.assign(lse.begin(), lse.begin() + n_tokens() * dims_.n_heads);
  s.phase = Phase::kForwardFinished;
}

Status CaDispatcher::start_backward(int layer, std::span<const float> d_o, std::span<float> dq, std::span<float> dk,
                                    std::span<float> dv, BackwardWrite write) {
  const int64_t kvf = dims_.kv_floats();
  check_buffer("start_backward", layer, "d_o", d_o.size(), dims_.q_floats());
  check_buffer("start_backward", layer, "dq", dq.size(), dims_.q_floats());
  check_buffer("start_backward", layer, "dk", dk.size(), kvf);
  check_buffer("start_backward", layer, "dv", dv.size(), kvf);
  LayerState& s = state_in(layer, Phase::kForwardFinished, "start_backward");
  const double t0 = options_.trace ? options_.trace->now_us() : 0;
  s.d_o = d_o.data(), s.dq = dq.data(), s.dk = dk.data(), s.dv = dv.data(), s.write = write;
  const Exchange& xd = plan_.ranks[sz(rank_)].exchange(ExchangeKind::kDO);
  const int64_t qf = dims_.q_floats(), H = dims_.n_heads;
  const int64_t wf = do_row_floats();
  take(s.do_send, xd.send_rows() * wf);
  take(s.do_recv, xd.recv_rows() * wf);
  {  // signal mode does the same copies: only the wire differs
    for_rows(index_, rank_, xd.send_blocks, xd.send_displs, [&](int64_t l, int64_t w) {
      float* row = s.do_send.data() + w * wf;
      copy_row(s.d_o + l * qf, row, qf);
      if (options_.stateless) {  // dO | Q | O | LSE
        copy_row(s.q + l * qf, row + qf, qf);
        copy_row(s.o + l * qf, row + 2 * qf, qf);
        copy_row(s.home_lse.data() + l * H, row + 3 * qf, H);
      }
    });
  }
  if (options_.stateless) pack_kv(s, 1);  // K|V again, as in forward
  trace("pack do", "compute", t0);
  const double ts = options_.trace ? options_.trace->now_us() : 0;
  DISTCA_RETURN_IF_ERROR(start_exchange(comm_, xd, s.do_send.data(), s.do_recv.data(), wf, options_.signal, ts, label_ + "do", s.ex_do));
  bwd_bytes_ = s.ex_do.bytes_sent;
  if (options_.stateless) {
    DISTCA_RETURN_IF_ERROR(start_kv(s, 1, ts));
    bwd_bytes_ += s.ex_kv.bytes_sent;
  }
  s.phase = Phase::kBackwardStarted;
  return Status::ok_status();
}

Status CaDispatcher::serve_backward(int layer) {
  LayerState& s = state_in(layer, Phase::kBackwardStarted, "serve_backward");
  const std::string lbl = options_.label.empty() ? "" : options_.label + " ";
  DISTCA_RETURN_IF_ERROR(finish_exchange(s.ex_do, options_.trace, rank_, lbl + "do", &waited_s_));
  if (options_.stateless) DISTCA_RETURN_IF_ERROR(finish_kv(s, layer, 1, &bwd_bytes_));
  double t0 = options_.trace ? options_.trace->now_us() : 0;
  const ServerPlan& sp = plan_.servers[sz(rank_)];
  const RankPlan& rp = plan_.ranks[sz(rank_)];
  const int64_t qf = dims_.q_floats(), kvf = dims_.kv_floats(), H = dims_.n_heads, wf = do_row_floats();
  const int64_t nt = static_cast<int64_t>(sp.tasks.size());
  const int64_t total_q = cu_q_.back(), total_kv = cu_k_.back();
  // The fused call's gradients: fdo, fdq (total_q, n_heads, head_dim); fdk, fdv (total_kv,
  // n_kv_heads, head_dim), a row per (task, context row), so a K/V row read by several tasks
  // has several partials here.
  std::vector<float> fdo, fdq, fdk, fdv;
  take(fdo, total_q * qf);
  take(fdq, total_q * qf);
  take(fdk, total_kv * kvf);
  take(fdv, total_kv * kvf);
  if (options_.stateless) {  // the fused inputs again: Q, O, LSE with dO, then the contexts
    take(s.fq, total_q * qf);
    take(s.fo, total_q * qf);
    take(s.flse, total_q * H);
    assemble_kv(s);
  }
  for (int64_t t = 0; t < nt; ++t) {
    const ServerTask& st = sp.tasks[sz(t)];
    const int64_t ql = st.task.q_end - st.task.q_begin, q0 = q_row_[sz(t)];
    const bool local = st.task.home == rank_;
    for (int64_t i = 0; i < ql; ++i) {
      const int64_t l = st.q_offset + i, f = q0 + i;  // local (or wire) row, fused row
      const float* w = local ? nullptr : s.do_recv.data() + l * wf;
      copy_row(local ? s.d_o + l * qf : w, fdo.data() + f * qf, qf);
      if (!options_.stateless) continue;
      copy_row(local ? s.q + l * qf : w + qf, s.fq.data() + f * qf, qf);
      copy_row(local ? s.o + l * qf : w + 2 * qf, s.fo.data() + f * qf, qf);
      const float* lse = local ? s.home_lse.data() + l * H : w + 3 * qf;
      for (int64_t h = 0; h < H; ++h) s.flse[sz(h * total_q + f)] = lse[h];
    }
  }
  if (options_.stateless) give(s.kv_send), give(s.kv_recv);
  trace("assemble do", "compute", t0);
  t0 = options_.trace ? options_.trace->now_us() : 0;
  if (nt > 0) {
    kernels::AttentionParams p = fused_params(dims_, cu_q_, cu_k_, s.fq.data(), s.fk.data(), s.fv.data(), s.fo.data(),
                                              s.flse.data());
    p.d_o = fdo.data(), p.dq = fdq.data(), p.dk = fdk.data(), p.dv = fdv.data();
    std::lock_guard<std::mutex> lock(kernels::kernel_mutex());
    kernels::attention_backward(p);
  }
  trace("attention bwd", "compute", t0);
  t0 = options_.trace ? options_.trace->now_us() : 0;
  const Exchange& xdq = rp.exchange(ExchangeKind::kDQ);
  const Exchange& xdkv = rp.exchange(ExchangeKind::kDKv);
  take(s.dq_send, xdq.send_rows() * qf);
  take(s.dq_recv, xdq.recv_rows() * qf);
  take(s.dkv_send, xdkv.send_rows() * 2 * kvf);
  take(s.dkv_recv, xdkv.recv_rows() * 2 * kvf);
  // The server's own share of its local rows' dK/dV, summed over tasks in task order.
  take(s.home_dk, n_tokens() * kvf);
  take(s.home_dv, n_tokens() * kvf);
  for (int64_t t = 0; t < nt; ++t) {
    const ServerTask& st = sp.tasks[sz(t)];
    const int64_t ql = st.task.q_end - st.task.q_begin, q0 = q_row_[sz(t)];
    if (st.task.home == rank_) {
      for (int64_t i = 0; i < ql; ++i) copy_row(fdq.data() + (q0 + i) * qf, s.dq + (st.q_offset + i) * qf, qf);
    } else {
      std::memcpy(s.dq_send.data() + st.q_offset * qf, fdq.data() + q0 * qf, sz(ql * qf) * sizeof(float));
    }
    int64_t row = cu_k_[sz(t)];
    for (const Segment& seg : st.kv) {
      for (int64_t i = 0; i < seg.len; ++i, ++row) {
        if (seg.received) {
          float* w = s.dkv_send.data() + (seg.offset + i) * 2 * kvf;
          add_row(fdk.data() + row * kvf, w, kvf);
          add_row(fdv.data() + row * kvf, w + kvf, kvf);
        } else {
          add_row(fdk.data() + row * kvf, s.home_dk.data() + (seg.offset + i) * kvf, kvf);
          add_row(fdv.data() + row * kvf, s.home_dv.data() + (seg.offset + i) * kvf, kvf);
        }
      }
    }
  }
  // The fused call is done: only the home partials are kept for finish_backward.
  give(s.fq), give(s.fk), give(s.fv), give(s.fo), give(s.flse), give(s.home_lse);
  give(fdo), give(fdq), give(fdk), give(fdv);
  trace("pack dq/dkv", "compute", t0);
  const double ts = options_.trace ? options_.trace->now_us() : 0;
  DISTCA_RETURN_IF_ERROR(start_exchange(comm_, xdq, s.dq_send.data(), s.dq_recv.data(), qf, options_.signal, ts, label_ + "dq", s.ex_dq));
  DISTCA_RETURN_IF_ERROR(start_exchange(comm_, xdkv, s.dkv_send.data(), s.dkv_recv.data(), 2 * kvf, options_.signal, ts, label_ + "dkv", s.ex_dkv));
  bwd_bytes_ += s.ex_dq.bytes_sent + s.ex_dkv.bytes_sent;
  s.phase = Phase::kBackwardServed;
  return Status::ok_status();
}

Status CaDispatcher::finish_backward(int layer) {
  LayerState& s = state_in(layer, Phase::kBackwardServed, "finish_backward");
  const std::string lbl = options_.label.empty() ? "" : options_.label + " ";
  DISTCA_RETURN_IF_ERROR(finish_exchange(s.ex_dq, options_.trace, rank_, lbl + "dq", &waited_s_));
  DISTCA_RETURN_IF_ERROR(finish_exchange(s.ex_dkv, options_.trace, rank_, lbl + "dkv", &waited_s_));
  const double t0 = options_.trace ? options_.trace->now_us() : 0;
  const RankPlan& rp = plan_.ranks[sz(rank_)];
  const int64_t qf = dims_.q_floats(), kvf = dims_.kv_floats();
  const Exchange& xdq = rp.exchange(ExchangeKind::kDQ);
  const Exchange& xdkv = rp.exchange(ExchangeKind::kDKv);
  std::vector<float>& acc_k = s.home_dk;  // (n_tokens, kvf): own partial first
  std::vector<float>& acc_v = s.home_dv;
  {  // signal mode does the same copies: only the wire differs
    for_rows(index_, rank_, xdq.recv_blocks, xdq.recv_displs, [&](int64_t l, int64_t w) {
      copy_row(s.dq_recv.data() + w * qf, s.dq + l * qf, qf);
    });
    // Then the servers' partials in ascending rank order (for_rows walks peers ascending).
    for_rows(index_, rank_, xdkv.recv_blocks, xdkv.recv_displs, [&](int64_t l, int64_t w) {
      add_row(s.dkv_recv.data() + w * 2 * kvf, acc_k.data() + l * kvf, kvf);
      add_row(s.dkv_recv.data() + w * 2 * kvf + kvf, acc_v.data() + l * kvf, kvf);
    });
  }
  const int64_t n = n_tokens() * kvf;
  if (s.write == BackwardWrite::kOverwrite) {
    std::memcpy(s.dk, acc_k.data(), sz(n) * sizeof(float));
    std::memcpy(s.dv, acc_v.data(), sz(n) * sizeof(float));
  } else {
    add_row(acc_k.data(), s.dk, n);
    add_row(acc_v.data(), s.dv, n);
  }
  trace("unpack dq/dkv", "compute", t0);
  give_all(s);
  layers_.erase(layer);
  return Status::ok_status();
}

Status CaDispatcher::backward(int layer, std::span<const float> d_o, std::span<float> dq, std::span<float> dk,
                              std::span<float> dv, BackwardWrite write) {
  DISTCA_RETURN_IF_ERROR(start_backward(layer, d_o, dq, dk, dv, write));
  DISTCA_RETURN_IF_ERROR(serve_backward(layer));
  return finish_backward(layer);
}

}  // namespace distca::runtime
