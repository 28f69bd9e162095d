// CAD's per-op bookkeeping (cad_contribution.h).
#include "cad_contribution.h"

#include <algorithm>
#include <utility>

#include "distca/plan/traffic.h"

namespace distca::sim::detail {

using Vec = Contribution::Vec;

void Contribution::init(size_t units) {
  for (int x = 0; x < 2; ++x) {
    for (PeerLists* m : {&fwd_dispatch_peers[x], &fwd_return_peers[x], &bwd_dispatch_peers[x], &bwd_return_peers[x]}) {
      m->reset(static_cast<int64_t>(units));
    }
    for (Vec* v : {&tokens[x], &attention_seconds[x], &attention_pairs[x], &fwd_dispatch_sent[x],
                   &fwd_dispatch_recv[x], &fwd_return_sent[x], &fwd_return_recv[x], &bwd_dispatch_sent[x],
                   &bwd_dispatch_recv[x], &bwd_return_sent[x], &bwd_return_recv[x]}) {
      v->assign(units, 0.0);
    }
  }
  for (Vec* v : {&kept_bytes, &kept_kv, &fwd_transient, &fwd_transient_kv, &bwd_transient, &bwd_transient_kv}) {
    v->assign(units, 0.0);
  }
}

namespace {
void release(Vec& v) { Vec().swap(v); }

// The message pairs of nano-batch x of `c`, by unit (fill_nano_contribution's `wire`: K/V
// travels by the wire's pairs, forward nano-batch x's part, resent in backward all with pong).
void fill_peers(const Rates& R, const PooledBatch& pooled, const DocumentIndex& index,
                const std::vector<TaskPlacement>& list, int x, bool fresh_backward, const KvWireBytes* wire,
                Contribution& c) {
  auto wire_peers = [&](std::initializer_list<size_t> parts) {
    PeerLists p(R.units);
    for (const size_t part : parts) {
      for (const auto& [h, s] : wire->pairs[part]) {
        p.add(pooled.unit_of[static_cast<size_t>(h)], pooled.unit_of[static_cast<size_t>(s)]);
      }
    }
    p.normalize();
    return p;
  };
  PeerLists dispatch(R.units), queries(R.units);
  add_plan_peers(index, list, &pooled.unit_of, dispatch, queries);
  c.fwd_return_peers[x] = queries.transposed();   // O + LSE back
  c.bwd_return_peers[x] = dispatch.transposed();  // dQ and dK/dV back
  c.bwd_dispatch_peers[x] = queries;              // dO out (with the inputs again below)
  if (fresh_backward || R.o.cad_stateless) {
    c.bwd_dispatch_peers[x].merge(
        wire ? wire_peers(x == 1 ? std::initializer_list<size_t>{0, 1} : std::initializer_list<size_t>{}) : dispatch);
  }
  if (wire) {
    dispatch = wire_peers({static_cast<size_t>(x)});
    dispatch.merge(queries);
  }
  c.fwd_dispatch_peers[x] = std::move(dispatch);  // Q and K/V out
}

// The plan figures of nano-batch x (its traffic `b`): the forward's bytes as they travel (K/V
// by the wire when given) and the inputs as a backward resends them.
void count_plan_bytes(const Rates& R, const TrafficBreakdown& b, int x, bool fresh_backward, const KvWireBytes* wire,
                      PlanStats& ps) {
  const int64_t forward = b.q + b.o_lse + (wire ? wire->total[static_cast<size_t>(x)] : b.kv);
  const int64_t resent = b.q + b.o_lse + (!wire ? b.kv : x == 1 ? wire->total[0] + wire->total[1] : 0);
  if (fresh_backward) {  // the backward's own plan: dO out, dQ / dK/dV back, inputs again
    ps.comm_bytes_backward += static_cast<double>(b.backward() + resent);
  } else if (R.pp > 1) {  // a pipeline's forward plan: its backward is counted apart
    ps.comm_bytes_forward += static_cast<double>(forward);
  } else {
    ps.comm_bytes_forward += static_cast<double>(forward);
    ps.comm_bytes_backward += static_cast<double>(b.backward());
    if (R.o.cad_stateless) ps.comm_bytes_backward += static_cast<double>(resent);
  }
}
}  // namespace

void Contribution::release_forward() {
  for (int x = 0; x < 2; ++x) {
    for (Vec* v : {&attention_pairs[x], &fwd_dispatch_sent[x], &fwd_dispatch_recv[x], &fwd_return_sent[x],
                   &fwd_return_recv[x]}) {
      release(*v);
    }
    fwd_dispatch_peers[x].reset(fwd_dispatch_peers[x].units());
    fwd_return_peers[x].reset(fwd_return_peers[x].units());
  }
  release(fwd_transient);
  release(fwd_transient_kv);
}

void Contribution::release_exchanges() {
  release_forward();
  for (int x = 0; x < 2; ++x) {
    for (Vec* v : {&attention_seconds[x], &bwd_dispatch_sent[x], &bwd_dispatch_recv[x], &bwd_return_sent[x],
                   &bwd_return_recv[x]}) {
      release(*v);
    }
    bwd_dispatch_peers[x].reset(bwd_dispatch_peers[x].units());
    bwd_return_peers[x].reset(bwd_return_peers[x].units());
  }
  release(bwd_transient);
  release(bwd_transient_kv);
}

void fill_nano_contribution(const Rates& R, const PooledBatch& pooled, const DocumentIndex& index,
                            const std::vector<TaskPlacement>& list, int x, bool fresh_backward, Contribution& c,
                            PlanStats& ps, const KvWireBytes* wire) {
  const RowBytes& rb = R.row_bytes;
  const auto ranks = pooled.unit_of.size();
  // Pipelines plan every backward apart (one_f_one_b_ticks pools a micro-batch's backward
  // with other micro-batches than its forward), so their forward servers keep nothing.
  const bool backward_apart = R.pp > 1;
  const Traffic t = compute_traffic(index, list, rb);
  // Indexed by pooled rank; scattered to units below. q: queries out and back as dQ; out:
  // O + LSE back; dout: dO out.
  Vec q_sent(ranks, 0.0), q_recv(ranks, 0.0), out_sent(ranks, 0.0), out_recv(ranks, 0.0), dout_sent(ranks, 0.0),
      dout_recv(ranks, 0.0);
  for (const TaskPlacement& task : list) {
    const int64_t q = task.q_end - task.q_begin;
    const auto srv = static_cast<size_t>(task.server), home = static_cast<size_t>(task.home);
    const auto srv_u = static_cast<size_t>(pooled.unit_of[srv]);
    c.attention_seconds[x][srv_u] += R.cost.task_cost(q, task.q_end);
    c.attention_pairs[x][srv_u] += static_cast<double>(task_pairs(q, task.q_end));
    if (task.home == task.server) continue;
    const auto n = static_cast<double>(q);
    q_sent[home] += n * static_cast<double>(rb.q);
    q_recv[srv] += n * static_cast<double>(rb.q);
    out_sent[srv] += n * static_cast<double>(rb.o + rb.lse);
    out_recv[home] += n * static_cast<double>(rb.o + rb.lse);
    dout_sent[home] += n * static_cast<double>(rb.o);
    dout_recv[srv] += n * static_cast<double>(rb.o);
  }
  const auto xs = static_cast<size_t>(x);
  fill_peers(R, pooled, index, list, x, fresh_backward, wire, c);
  for (size_t rk = 0; rk < ranks; ++rk) {
    const RankBytes& b = t.per_rank[rk];
    const auto u = static_cast<size_t>(pooled.unit_of[rk]);
    // The plan's own K/V (what the server's kept contexts and dK/dV partials cover), and what
    // travels: the same, or the wire's part.
    const double kv_sent = static_cast<double>(b.fwd_sent) - q_sent[rk] - out_sent[rk];
    const double kv_recv = static_cast<double>(b.fwd_recv) - q_recv[rk] - out_recv[rk];
    const double wire_sent = wire ? static_cast<double>(wire->sent[xs][rk]) : kv_sent;
    const double wire_recv = wire ? static_cast<double>(wire->recv[xs][rk]) : kv_recv;
    // Resent in backward (stateless servers, pipelines): pong carries the whole wire.
    const double resent_kv_sent =
        !wire ? kv_sent : x == 1 ? static_cast<double>(wire->sent[0][rk] + wire->sent[1][rk]) : 0.0;
    const double resent_kv_recv =
        !wire ? kv_recv : x == 1 ? static_cast<double>(wire->recv[0][rk] + wire->recv[1][rk]) : 0.0;
    c.fwd_dispatch_sent[x][u] = q_sent[rk] + wire_sent;
    c.fwd_dispatch_recv[x][u] = q_recv[rk] + wire_recv;
    c.fwd_return_sent[x][u] = out_sent[rk];
    c.fwd_return_recv[x][u] = out_recv[rk];
    c.bwd_dispatch_sent[x][u] = dout_sent[rk];
    c.bwd_dispatch_recv[x][u] = dout_recv[rk];
    // dQ goes back the way Q came; dK/dV partials go back to the K/V holders.
    c.bwd_return_sent[x][u] = q_recv[rk] + kv_recv;
    c.bwd_return_recv[x][u] = q_sent[rk] + kv_sent;
    // Servers that keep their inputs hold the received rows and their outputs; stateless
    // ones (and backwards planned anew: every backward of a pipeline) get Q, K/V and O + LSE
    // again with dO.
    const bool keeps = !R.o.cad_stateless && !backward_apart;
    const double inputs = q_recv[rk] + kv_recv + c.fwd_return_sent[x][u];
    if (keeps) {
      c.kept_bytes[u] += inputs;
      c.kept_kv[u] += kv_recv;
    } else {  // the layer in flight only
      c.fwd_transient[u] += inputs;
      c.fwd_transient_kv[u] += kv_recv;
    }
    const bool resent = fresh_backward || R.o.cad_stateless;
    if (resent) {
      c.bwd_dispatch_sent[x][u] += q_sent[rk] + resent_kv_sent + out_recv[rk];
      c.bwd_dispatch_recv[x][u] += q_recv[rk] + resent_kv_recv + out_sent[rk];
    }
    c.bwd_transient[u] += c.bwd_dispatch_recv[x][u] + c.bwd_return_sent[x][u];
    c.bwd_transient_kv[u] += (resent ? 2.0 : 1.0) * kv_recv;  // K/V again, dK/dV partials
  }
  count_plan_bytes(R, t.bytes, x, fresh_backward, wire, ps);
}

void note_transients(const std::vector<Contribution*>& fwd, const std::vector<Contribution*>& bwd,
                     std::vector<double>& transient, std::vector<double>& transient_kv) {
  for (size_t u = 0; u < transient.size(); ++u) {
    double bytes = 0, kv = 0;
    for (const Contribution* c : fwd) {
      bytes += c->fwd_transient[u];
      kv += c->fwd_transient_kv[u];
    }
    for (const Contribution* c : bwd) {
      bytes += c->bwd_transient[u];
      kv += c->bwd_transient_kv[u];
    }
    transient[u] = std::max(transient[u], bytes);
    transient_kv[u] = std::max(transient_kv[u], kv);
  }
}

}  // namespace distca::sim::detail
