// The ping-pong timeline (include/distca/plan/pingpong_model.h).
#include "distca/plan/pingpong_model.h"

#include <algorithm>
#include <array>
#include <vector>

#include "distca/core/check.h"
#include "distca/plan/kv_once.h"
#include "distca/plan/link_model.h"
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

// An exchange as the timeline sees it: the messages every rank sends (plan/link_model.h).
struct Transfer {
  std::vector<PairMessage> sends;
};

// `wire` ([ranks], optional): one more exchange per rank (the K/V wire of plan/kv_once.h).
Transfer transfer(const Plan& plan, std::initializer_list<ExchangeKind> kinds,
                  const std::vector<Exchange>* wire = nullptr) {
  const size_t n = plan.ranks.size();
  Transfer t;
  for (size_t r = 0; r < n; ++r) {
    std::vector<const Exchange*> exchanges;
    for (const ExchangeKind k : kinds) exchanges.push_back(&plan.ranks[r].exchange(k));
    if (wire != nullptr) exchanges.push_back(&(*wire)[r]);
    for (const Exchange* ex : exchanges) {
      const Exchange& e = *ex;
      for (const auto& [p, rows] : e.send_counts.entries()) {
        if (rows <= 0) continue;
        t.sends.push_back({static_cast<int64_t>(r), static_cast<int64_t>(p), static_cast<double>(rows * e.row_bytes)});
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
    const auto bytes = static_cast<double>(b.rows * kv[static_cast<size_t>(b.server)]->row_bytes);
    t.sends.push_back({b.holder, b.server, -bytes});
    t.sends.push_back({b.relay, b.server, bytes});
  }
}

// The ranks' clocks, their exchanges priced by the link model (plan/link_model.h), their
// compute slowed by the CPU the transfers beside it take (charge_transfer_cpu).
class Timeline {
 public:
  Timeline(const Plan& plan, const AutoToleranceModel& m, bool free)
      : free_(free),
        cpu_per_byte_(free ? 0.0 : m.comm_cpu_seconds_per_byte),
        clock_(plan.ranks.size(), 0.0),
        links_(static_cast<int64_t>(plan.ranks.size()), plan.hosts, m.link_rates()),
        draws_(plan.ranks.size()) {}

  // Every rank posts `t` at its clock; returns when it completes on each rank.
  std::vector<double> post(const Transfer& t) {
    const ExchangeTimes x = links_.post(clock_, t.sends, free_);
    for (size_t r = 0; r < clock_.size() && cpu_per_byte_ > 0; ++r) {
      if (x.moved[r] > 0 && x.done[r] > x.all_posted) draws_[r].push_back({x.all_posted, x.done[r], cpu_per_byte_ * x.moved[r]});
    }
    return x.done;
  }
  void wait(const std::vector<double>& done) {
    for (size_t r = 0; r < clock_.size(); ++r) clock_[r] = std::max(clock_[r], done[r]);
  }
  void run(const std::vector<double>& seconds) {
    for (size_t r = 0; r < clock_.size(); ++r) clock_[r] += charge_transfer_cpu(draws_[r], clock_[r], seconds[r]);
  }
  double end() const { return *std::max_element(clock_.begin(), clock_.end()); }

 private:
  const bool free_;
  const double cpu_per_byte_;
  std::vector<double> clock_;
  ExchangeLinks links_;
  std::vector<std::vector<CpuDraw>> draws_;  // [rank] transfers whose CPU is not yet charged
};

double simulate(const NanoPlans& plans, const AutoToleranceModel& m, int64_t layers, bool free) {
  const std::array<NanoFigures, 2> f = {figures(plans.nano[0], plans.split.tokens, 0, m),
                                        figures(plans.nano[1], plans.split.tokens, 1, m)};
  std::array<Transfer, 2> dispatch, ret, back_dispatch, back_ret;
  for (size_t x = 0; x < 2; ++x) {
    std::array<std::vector<PairMessage>, 4> e = pingpong_exchanges(plans, m.kv_once, x);
    dispatch[x].sends = std::move(e[0]);
    ret[x].sends = std::move(e[1]);
    back_dispatch[x].sends = std::move(e[2]);
    back_ret[x].sends = std::move(e[3]);
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

std::array<std::vector<PairMessage>, 4> pingpong_exchanges(const NanoPlans& plans, bool kv_once, size_t x) {
  DISTCA_CHECK(x < 2);
  const std::array<std::vector<Exchange>, 2> kv = nano_kv_wire(plans, false);
  Transfer dispatch = kv_once ? transfer(plans.nano[x], {ExchangeKind::kQ}, &kv[x])
                              : transfer(plans.nano[x], {ExchangeKind::kQ, ExchangeKind::kKv});
  // The K/V as it travels (the wire, or the nano plan's own), relayed as the runtime does.
  std::vector<const Exchange*> travels;
  for (size_t r = 0; r < plans.full.ranks.size(); ++r) {
    travels.push_back(kv_once ? &kv[x][r] : &plans.nano[x].ranks[r].exchange(ExchangeKind::kKv));
  }
  relay(dispatch, kv_relay(kv_once ? plans.full : plans.nano[x], travels, plans.full.hosts), travels);
  return {std::move(dispatch.sends), transfer(plans.nano[x], {ExchangeKind::kOLse}).sends,
          transfer(plans.nano[x], {ExchangeKind::kDO}).sends,
          transfer(plans.nano[x], {ExchangeKind::kDQ, ExchangeKind::kDKv}).sends};
}

PingPongPrediction predict_pingpong(const NanoPlans& plans, const AutoToleranceModel& model, int64_t layers) {
  DISTCA_CHECK(layers >= 1 && model.pingpong());
  PingPongPrediction p;
  p.seconds = simulate(plans, model, layers, false);
  p.signal_seconds = simulate(plans, model, layers, true);
  return p;
}

}  // namespace distca
