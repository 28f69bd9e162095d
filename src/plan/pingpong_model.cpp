// The ping-pong timeline (include/distca/plan/pingpong_model.h).
#include "distca/plan/pingpong_model.h"

#include <algorithm>
#include <array>
#include <vector>

#include "distca/core/check.h"
#include "distca/plan/kv_once.h"
#include "distca/plan/topology_relay.h"

namespace distca {
namespace {

// One nano plan's figures the timeline reads, per rank.
struct NanoFigures {
  std::vector<double> linear_fwd, linear_bwd, attend_fwd, attend_bwd;
};

NanoFigures figures(const Plan& plan, const std::vector<std::array<int64_t, 2>>& tokens, size_t x,
                    const AutoToleranceModel& m) {
  const size_t n = plan.servers.size();
  NanoFigures f{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
  for (size_t r = 0; r < n; ++r) {
    const double rows = static_cast<double>(tokens[r][x]);
    f.linear_fwd[r] = rows * m.linear_forward_seconds_per_row;
    f.linear_bwd[r] = rows * m.linear_backward_seconds_per_row;
    double total = 0;
    for (const ServerTask& t : plan.servers[r].tasks) {
      total += m.seconds->task_cost(t.task.q_end - t.task.q_begin, t.task.q_end);
    }
    f.attend_fwd[r] = total * (1 - m.attention_backward_share);
    f.attend_bwd[r] = total * m.attention_backward_share;
  }
  return f;
}

// An exchange as the timeline sees it: [rank] (peer, bytes) sent.
struct Transfer {
  std::vector<std::vector<std::pair<size_t, int64_t>>> sends;
};

// `wire` ([ranks], optional): one more exchange per rank (the K/V wire of plan/kv_once.h).
Transfer transfer(const Plan& plan, std::initializer_list<ExchangeKind> kinds,
                  const std::vector<Exchange>* wire = nullptr) {
  const size_t n = plan.ranks.size();
  Transfer t{std::vector<std::vector<std::pair<size_t, int64_t>>>(n)};
  for (size_t r = 0; r < n; ++r) {
    std::vector<const Exchange*> exchanges;
    for (const ExchangeKind k : kinds) exchanges.push_back(&plan.ranks[r].exchange(k));
    if (wire != nullptr) exchanges.push_back(&(*wire)[r]);
    for (const Exchange* ex : exchanges) {
      const Exchange& e = *ex;
      for (const auto& [p, rows] : e.send_counts.entries()) {
        if (rows <= 0) continue;
        t.sends[r].emplace_back(p, rows * e.row_bytes);
      }
    }
  }
  return t;
}

// K/V relays (plan/topology_relay.h) on a dispatch: a relayed block leaves its holder once,
// for the relay, and reaches the host's other servers from the relay inside the host. The
// runtime forwards it in a second exchange after the first; the timeline counts it in the
// dispatch (a host's own link is fast next to the one between hosts).
void relay(Transfer& t, const std::vector<RelayedBlock>& blocks, const std::vector<const Exchange*>& kv) {
  for (const RelayedBlock& b : blocks) {
    const int64_t bytes = b.rows * kv[static_cast<size_t>(b.server)]->row_bytes;
    t.sends[static_cast<size_t>(b.holder)].emplace_back(static_cast<size_t>(b.server), -bytes);
    t.sends[static_cast<size_t>(b.relay)].emplace_back(static_cast<size_t>(b.server), bytes);
  }
}

// The link as the timeline sees it: an outgoing and an incoming direction per link class,
// each carrying one message at a time in the order posted (tbf's queue on each end of a
// host's link; both directions carry at once). Between hosts the directions are the host's:
// its ranks share its one link (a NIC, tbf on the host's end), so two ranks of a host sending
// across wait for each other; inside a host (or without hosts) each rank has its own. A message from s to p starts once
// both have posted the exchange (MPI's rendezvous moves a large message only after the
// receive is matched) and both directions are free, and lasts message_seconds plus its bytes
// over the class's rate; an exchange completes on a rank when every message it sends or
// receives has (the runner's wait covers both, and every pair exchanges a message, empty or
// not, so an exchange also waits for peers that send it nothing).
class Timeline {
 public:
  Timeline(const Plan& plan, const AutoToleranceModel& m, bool free)
      : hosts_(plan.hosts),
        free_(free),
        message_seconds_(m.message_seconds),
        clock_(plan.ranks.size(), 0.0),
        out_free_(plan.ranks.size(), {0.0, 0.0}),
        in_free_(plan.ranks.size(), {0.0, 0.0}) {
    // Without hosts every byte crosses the measured link (auto_tolerance.h).
    rate_[1] = m.inter_host_bytes_per_second;
    rate_[0] = plan.hosts.empty() ? m.inter_host_bytes_per_second : m.intra_host_bytes_per_second;
    // Class 1 directions: the host's (plan.hosts is canonical: ids in [0, ranks)), or the rank's.
    endpoint_.resize(clock_.size());
    for (size_t r = 0; r < endpoint_.size(); ++r) endpoint_[r] = plan.hosts.empty() ? r : static_cast<size_t>(plan.hosts[r]);
  }

  // Every rank posts `t` at its clock; returns when it completes on each rank.
  std::vector<double> post(const Transfer& t) {
    const size_t n = clock_.size();
    std::vector<double> done = clock_;
    std::vector<std::vector<int64_t>> bytes(n, std::vector<int64_t>(n, 0));
    for (size_t s = 0; s < n; ++s) {
      for (const auto& [p, b] : t.sends[s]) bytes[s][p] += b;
    }
    for (size_t s = 0; s < n; ++s) {
      for (size_t p = 0; p < n; ++p) {
        if (p == s) continue;
        const size_t c = hosts_.empty() || hosts_[s] != hosts_[p] ? 1 : 0;
        double& out = out_free_[c == 1 ? endpoint_[s] : s][c];
        double& in = in_free_[c == 1 ? endpoint_[p] : p][c];
        const double start = std::max({clock_[s], clock_[p], out, in});
        const double busy = free_ ? 0.0 : static_cast<double>(bytes[s][p]) / rate_[c];
        out = in = start + busy;
        const double end = start + busy + message_seconds_;
        done[s] = std::max(done[s], end);
        done[p] = std::max(done[p], end);
      }
    }
    return done;
  }
  void wait(const std::vector<double>& done) {
    for (size_t r = 0; r < clock_.size(); ++r) clock_[r] = std::max(clock_[r], done[r]);
  }
  void run(const std::vector<double>& seconds) {
    for (size_t r = 0; r < clock_.size(); ++r) clock_[r] += seconds[r];
  }
  double end() const { return *std::max_element(clock_.begin(), clock_.end()); }

 private:
  const std::vector<int64_t>& hosts_;
  const bool free_;
  const double message_seconds_;
  std::array<double, 2> rate_{};
  std::vector<double> clock_;
  // [rank][class]: the direction is free from; class 1 at index endpoint_[rank].
  std::vector<std::array<double, 2>> out_free_, in_free_;
  std::vector<size_t> endpoint_;  // [rank] the index of its host's class-1 directions
};

double simulate(const NanoPlans& plans, const AutoToleranceModel& m, int64_t layers, bool free) {
  const std::array<NanoFigures, 2> f = {figures(plans.nano[0], plans.split.tokens, 0, m),
                                        figures(plans.nano[1], plans.split.tokens, 1, m)};
  std::array<Transfer, 2> dispatch, ret, back_dispatch, back_ret;
  const std::array<std::vector<Exchange>, 2> kv = nano_kv_wire(plans, false);
  for (size_t x = 0; x < 2; ++x) {
    dispatch[x] = m.kv_once ? transfer(plans.nano[x], {ExchangeKind::kQ}, &kv[x])
                            : transfer(plans.nano[x], {ExchangeKind::kQ, ExchangeKind::kKv});
    // The K/V as it travels (the wire, or the nano plan's own), relayed as the runtime does.
    std::vector<const Exchange*> travels;
    for (size_t r = 0; r < plans.full.ranks.size(); ++r) {
      travels.push_back(m.kv_once ? &kv[x][r] : &plans.nano[x].ranks[r].exchange(ExchangeKind::kKv));
    }
    relay(dispatch[x], kv_relay(m.kv_once ? plans.full : plans.nano[x], travels, plans.full.hosts), travels);
    ret[x] = transfer(plans.nano[x], {ExchangeKind::kOLse});
    back_dispatch[x] = transfer(plans.nano[x], {ExchangeKind::kDO});
    back_ret[x] = transfer(plans.nano[x], {ExchangeKind::kDQ, ExchangeKind::kDKv});
  }
  Timeline t(plans.full, m, free);
  std::array<std::vector<double>, 2> in_flight, back;  // returns of the layer before
  for (int64_t l = 0; l < layers; ++l) {
    std::array<std::vector<double>, 2> sent;
    for (size_t x = 0; x < 2; ++x) {
      if (l > 0) t.wait(back[x]);
      t.run(f[x].linear_fwd);
      sent[x] = t.post(dispatch[x]);
    }
    for (size_t x = 0; x < 2; ++x) {
      t.wait(sent[x]);
      t.run(f[x].attend_fwd);
      back[x] = t.post(ret[x]);
    }
  }
  for (size_t x = 0; x < 2; ++x) {
    t.wait(back[x]);
    t.run(f[x].linear_fwd);
  }
  // Backward: pong (1) first.
  constexpr std::array<size_t, 2> kOrder = {1, 0};
  for (int64_t l = layers - 1; l >= 0; --l) {
    std::array<std::vector<double>, 2> sent;
    for (const size_t x : kOrder) {
      if (l < layers - 1) t.wait(in_flight[x]);
      t.run(f[x].linear_bwd);
      sent[x] = t.post(back_dispatch[x]);
    }
    for (const size_t x : kOrder) {
      t.wait(sent[x]);
      t.run(f[x].attend_bwd);
      in_flight[x] = t.post(back_ret[x]);
    }
  }
  for (const size_t x : kOrder) {
    t.wait(in_flight[x]);
    t.run(f[x].linear_bwd);
  }
  return t.end();
}

}  // namespace

PingPongPrediction predict_pingpong(const NanoPlans& plans, const AutoToleranceModel& model, int64_t layers) {
  DISTCA_CHECK(layers >= 1 && model.pingpong());
  PingPongPrediction p;
  p.seconds = simulate(plans, model, layers, false);
  p.signal_seconds = simulate(plans, model, layers, true);
  return p;
}

}  // namespace distca
