// CAD's per-op bookkeeping (cad_contribution.h).
#include "cad_contribution.h"

#include <algorithm>
#include <utility>

#include "distca/plan/topology_relay.h"
#include "distca/plan/traffic.h"

namespace distca::sim::detail {

using Vec = Contribution::Vec;

void Contribution::init(size_t units) {
  for (int x = 0; x < 2; ++x) {
    for (Messages* m : {&fwd_dispatch_msgs[x], &fwd_return_msgs[x], &bwd_dispatch_msgs[x], &bwd_return_msgs[x]}) {
      Messages().swap(*m);
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

}  // namespace

std::vector<int64_t> pooled_hosts(const Rates& R, const PooledBatch& pooled) {
  std::vector<int64_t> h;
  if (R.unit_hosts.empty()) return h;
  for (const int64_t u : pooled.unit_of) h.push_back(R.unit_hosts[static_cast<size_t>(u)]);
  return h;
}

KvWireBytes relayed_kv_wire(const Rates& R, const PooledBatch& pooled, const DocumentIndex& index,
                            const std::vector<TaskPlacement>& full, const NanoSplit& split) {
  KvWireBytes wire = kv_wire_bytes(index, full, split, R.row_bytes);
  const std::vector<int64_t> hosts = pooled_hosts(R, pooled);
  for (std::vector<ContextMessage>& m : wire.messages) relay_context(full, hosts, m);
  return wire;
}

namespace {

// The messages of nano-batch x of `c`, by unit, by traffic.h's byte rules: Q (and dO, dQ,
// O + LSE) per task away from home, K/V per context message (`context`, the plan's own) or
// by the wire's (fill_nano_contribution's `wire`: forward nano-batch x's part, resent in
// backward all with pong); dK/dV go back the plan's own context messages reversed. The
// forward's K/V is relayed inside a host (plan/topology_relay.h) as the runtime does; the
// wire's by the caller (relayed_kv_wire), who knows the full plan's tasks. `context` is
// relayed in place (its last use).
// Not inlined: GCC 12 inlining it into fill_nano_contribution reports a false
// -Wfree-nonheap-object on that function's vectors.
[[gnu::noinline]] void fill_messages(const Rates& R, const PooledBatch& pooled, const std::vector<TaskPlacement>& list,
                                     std::vector<ContextMessage>& context, int x, bool fresh_backward,
                                     const KvWireBytes* wire, Contribution& c) {
  const RowBytes& rb = R.row_bytes;
  auto unit = [&](int64_t rank) { return pooled.unit_of[static_cast<size_t>(rank)]; };
  using Messages = Contribution::Messages;
  const auto xs = static_cast<size_t>(x);
  Messages& fd = c.fwd_dispatch_msgs[xs];
  Messages& fr = c.fwd_return_msgs[xs];
  Messages& bd = c.bwd_dispatch_msgs[xs];
  Messages& br = c.bwd_return_msgs[xs];
  const bool resent = fresh_backward || R.o.cad_stateless;
  for (const TaskPlacement& t : list) {
    if (t.home == t.server) continue;
    const auto n = static_cast<double>(t.q_end - t.q_begin);
    const int64_t h = unit(t.home), srv = unit(t.server);
    fd.push_back({h, srv, n * static_cast<double>(rb.q)});
    fr.push_back({srv, h, n * static_cast<double>(rb.o + rb.lse)});
    bd.push_back({h, srv, n * static_cast<double>(rb.o)});
    if (resent) bd.push_back({h, srv, n * static_cast<double>(rb.q + rb.o + rb.lse)});
    br.push_back({srv, h, n * static_cast<double>(rb.q)});
  }
  auto add_kv = [&](Messages& to, const std::vector<ContextMessage>& from) {
    for (const ContextMessage& m : from) to.push_back({unit(m.holder), unit(m.server), static_cast<double>(m.bytes)});
  };
  for (const ContextMessage& m : context) br.push_back({unit(m.server), unit(m.holder), static_cast<double>(m.bytes)});
  if (resent) {
    if (!wire) {
      add_kv(bd, context);
    } else if (x == 1) {
      add_kv(bd, wire->messages[0]);
      add_kv(bd, wire->messages[1]);
    }
  }
  if (wire) {
    add_kv(fd, wire->messages[xs]);
  } else {
    relay_context(list, pooled_hosts(R, pooled), context);
    add_kv(fd, context);
  }
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
    Messages().swap(fwd_dispatch_msgs[x]);
    Messages().swap(fwd_return_msgs[x]);
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
    Messages().swap(bwd_dispatch_msgs[x]);
    Messages().swap(bwd_return_msgs[x]);
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
  std::vector<ContextMessage> context;
  const Traffic t = compute_traffic(index, list, rb, true, &context);
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
  fill_messages(R, pooled, list, context, x, fresh_backward, wire, c);
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
