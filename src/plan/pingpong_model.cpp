// The ping-pong timeline (include/distca/plan/pingpong_model.h).
#include "distca/plan/pingpong_model.h"

#include <algorithm>
#include <array>
#include <vector>

#include "distca/core/check.h"
#include "distca/plan/kv_once.h"

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

// An exchange as the timeline sees it: bytes per (sender, receiver), by link class.
struct Transfer {
  // [rank] (peer, bytes) sent; and each rank's totals sent and received per link class.
  std::vector<std::vector<std::pair<size_t, int64_t>>> sends;
  std::vector<std::array<int64_t, 2>> out, in;  // [rank][0 intra, 1 inter]
};

// `wire` ([ranks], optional): one more exchange per rank (the K/V wire of plan/kv_once.h).
Transfer transfer(const Plan& plan, std::initializer_list<ExchangeKind> kinds,
                  const std::vector<Exchange>* wire = nullptr) {
  const size_t n = plan.ranks.size();
  Transfer t{std::vector<std::vector<std::pair<size_t, int64_t>>>(n), std::vector<std::array<int64_t, 2>>(n, {0, 0}),
             std::vector<std::array<int64_t, 2>>(n, {0, 0})};
  for (size_t r = 0; r < n; ++r) {
    std::vector<const Exchange*> exchanges;
    for (const ExchangeKind k : kinds) exchanges.push_back(&plan.ranks[r].exchange(k));
    if (wire != nullptr) exchanges.push_back(&(*wire)[r]);
    for (const Exchange* ex : exchanges) {
      const Exchange& e = *ex;
      for (const auto& [p, rows] : e.send_counts.entries()) {
        if (rows <= 0) continue;
        const int64_t bytes = rows * e.row_bytes;
        const size_t c = plan.hosts.empty() || plan.hosts[r] != plan.hosts[p] ? 1 : 0;
        t.sends[r].emplace_back(p, bytes);
        t.out[r][c] += bytes;
        t.in[p][c] += bytes;
      }
    }
  }
  return t;
}

class Timeline {
 public:
  Timeline(const Plan& plan, const AutoToleranceModel& m, bool free)
      : hosts_(plan.hosts), free_(free), clock_(plan.ranks.size(), 0.0) {
    // Without hosts every byte crosses the measured link (auto_tolerance.h).
    rate_[1] = m.inter_host_bytes_per_second;
    rate_[0] = plan.hosts.empty() ? m.inter_host_bytes_per_second : m.intra_host_bytes_per_second;
  }

  // Every rank posts `t` now; returns when it completes on each rank.
  std::vector<double> post(const Transfer& t) const {
    std::vector<double> done = clock_;
    for (size_t s = 0; s < t.sends.size(); ++s) {
      for (const auto& [p, bytes] : t.sends[s]) {
        const size_t c = hosts_.empty() || hosts_[s] != hosts_[p] ? 1 : 0;
        const double seconds =
            free_ ? 0.0 : static_cast<double>(std::max(t.out[s][c], t.in[p][c])) / rate_[c];
        done[p] = std::max(done[p], clock_[s] + seconds);
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
  std::array<double, 2> rate_{};
  std::vector<double> clock_;
};

double simulate(const NanoPlans& plans, const AutoToleranceModel& m, int64_t layers, bool free) {
  const std::array<NanoFigures, 2> f = {figures(plans.nano[0], plans.split.tokens, 0, m),
                                        figures(plans.nano[1], plans.split.tokens, 1, m)};
  std::array<Transfer, 2> dispatch, ret, back_dispatch, back_ret;
  const std::array<std::vector<Exchange>, 2> kv = nano_kv_wire(plans, false);
  for (size_t x = 0; x < 2; ++x) {
    dispatch[x] = transfer(plans.nano[x], {ExchangeKind::kQ}, &kv[x]);
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
