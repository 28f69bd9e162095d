// `--tolerance auto` (auto_tolerance.h).
#include "distca/plan/auto_tolerance.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "distca/core/check.h"
#include "distca/cost/profiled.h"
#include "distca/plan/nano_plan.h"
#include "distca/plan/pingpong_model.h"
#include "distca/plan/plan.h"
#include "distca/plan/topology_relay.h"

namespace distca {
namespace {

bool positive_rate(double r) { return std::isfinite(r) && r >= kMinLinkBandwidth && r <= kMaxLinkBandwidth * kMaxInterHostPrice; }

// Bytes rank r sends and receives (forward + backward) on each link, from the exchanges.
struct LinkBytes {
  int64_t inter_sent = 0, inter_recv = 0, intra_sent = 0, intra_recv = 0;
};

std::vector<LinkBytes> link_bytes(const Plan& plan) {
  std::vector<LinkBytes> out(plan.ranks.size());
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    for (const Exchange& e : plan.ranks[r].exchanges) {
      for (const auto& [p, rows] : e.send_counts.entries()) {
        const bool inter = !plan.hosts.empty() && plan.hosts[r] != plan.hosts[p];
        (inter ? out[r].inter_sent : out[r].intra_sent) += rows * e.row_bytes;
      }
      for (const auto& [p, rows] : e.recv_counts.entries()) {
        const bool inter = !plan.hosts.empty() && plan.hosts[r] != plan.hosts[p];
        (inter ? out[r].inter_recv : out[r].intra_recv) += rows * e.row_bytes;
      }
    }
  }
  // Relayed K/V rows cross to the relay's host once and reach the server from the relay.
  for (const RelayedBlock& b : kv_relay(plan, plan.hosts)) {
    const int64_t bytes = b.rows * plan.ranks[static_cast<size_t>(b.server)].exchange(ExchangeKind::kKv).row_bytes;
    out[static_cast<size_t>(b.holder)].inter_sent -= bytes;
    out[static_cast<size_t>(b.server)].inter_recv -= bytes;
    out[static_cast<size_t>(b.relay)].intra_sent += bytes;
    out[static_cast<size_t>(b.server)].intra_recv += bytes;
  }
  return out;
}

// max over ranks of the attention phase's predicted seconds (auto_tolerance.h).
double predict(const Plan& plan, const AutoToleranceModel& m) {
  const std::vector<LinkBytes> bytes = link_bytes(plan);
  // Without a topology every byte crosses the measured link.
  const double intra_rate = plan.hosts.empty() ? m.inter_host_bytes_per_second : m.intra_host_bytes_per_second;
  double worst = 0;
  for (size_t r = 0; r < plan.servers.size(); ++r) {
    double compute = 0;
    for (const ServerTask& t : plan.servers[r].tasks) {
      compute += m.seconds->task_cost(t.task.q_end - t.task.q_begin, t.task.q_end);
    }
    // A link carries both directions at once: the busier direction decides.
    const LinkBytes& b = bytes[r];
    const double comm = static_cast<double>(std::max(b.inter_sent, b.inter_recv)) / m.inter_host_bytes_per_second +
                        static_cast<double>(std::max(b.intra_sent, b.intra_recv)) / intra_rate;
    worst = std::max(worst, m.overlap ? std::max(compute, comm) : compute + comm);
  }
  return worst;
}

// Seconds per row of one layer's linear work in `pass` direction: the GEMMs of the layer
// (not the head) over the rows they were timed at, plus the element-wise figure.
double linear_seconds_per_row(const HardwareProfile& profile, bool backward) {
  double seconds = 0;
  for (const GemmRecord& g : profile.gemms) {
    if (g.layer == "lm_head" || (g.pass == GemmPass::kForward) == backward) continue;
    seconds += g.seconds_concurrent;
  }
  double per_row = seconds / static_cast<double>(profile.shape.tokens);
  if (profile.elementwise) {
    per_row += (backward ? profile.elementwise->layer_backward : profile.elementwise->layer_forward).concurrent;
  }
  return per_row;
}

Result<PingPongPrediction> predict_cut(const Batch& batch, const SchedulerSpec& spec, const ScheduleOptions& o,
                                       const AutoToleranceModel& model, double cut_fraction) {
  DISTCA_ASSIGN_OR_RETURN(NanoPlans plans, plan_nano_batches(batch, spec, o, cut_fraction));
  return predict_pingpong(plans, model, std::max<int64_t>(1, o.model.n_layers));
}

}  // namespace

Status AutoToleranceModel::validate() const {
  if (seconds == nullptr || seconds->unit() != "seconds") {
    return Status::invalid_argument("--tolerance auto needs an attention cost model in seconds");
  }
  if (!positive_rate(inter_host_bytes_per_second) || !positive_rate(intra_host_bytes_per_second)) {
    return Status::invalid_argument("--tolerance auto: link rates must be finite and positive");
  }
  const auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
  if (bad(linear_forward_seconds_per_row) || bad(linear_backward_seconds_per_row) ||
      bad(attention_backward_share) || attention_backward_share > 1 || bad(message_seconds) || message_seconds > 1 ||
      bad(comm_cpu_seconds_per_byte) || comm_cpu_seconds_per_byte > kMaxCommCpuSecondsPerByte) {
    return Status::invalid_argument("--tolerance auto: linear seconds must be finite and >= 0, the backward share in "
                                    "[0, 1], the seconds per message in [0, 1], the CPU per byte in [0, 1e-6]");
  }
  return Status::ok_status();
}

std::optional<LinkRates> profile_link_rates(const HardwareProfile& profile, int64_t inter_host_price) {
  const std::optional<LinkProfile>& link = profile.p2p ? profile.p2p : profile.all_to_all;
  if (!link) return std::nullopt;
  return LinkRates{link->bytes_per_second, link->bytes_per_second * static_cast<double>(inter_host_price),
                   std::clamp(link->latency_seconds, 0.0, 1.0)};
}

Result<AutoToleranceModel> auto_tolerance_model(const HardwareProfile& profile, const HostTopology& topology,
                                                bool overlap, std::unique_ptr<AttentionCostModel>* table,
                                                const std::string& flag) {
  const std::optional<LinkRates> link = profile_link_rates(profile, topology.inter_host_price);
  if (!link) {
    return Status::invalid_argument(flag + ": --tolerance auto needs a profile with link figures (one measured "
                                           "under mpirun with 2 or more ranks)");
  }
  DISTCA_RETURN_IF_ERROR(topology.validate(static_cast<int64_t>(topology.host.size())));
  *table = std::make_unique<ProfiledCostModel>(profile.attention_total());
  AutoToleranceModel m;
  m.seconds = table->get();
  m.inter_host_bytes_per_second = link->inter_host_bytes_per_second;
  m.intra_host_bytes_per_second = link->intra_host_bytes_per_second;
  m.overlap = overlap;
  m.linear_forward_seconds_per_row = linear_seconds_per_row(profile, false);
  m.linear_backward_seconds_per_row = linear_seconds_per_row(profile, true);
  const double ratio = profile.attention_backward_ratio();
  m.attention_backward_share = std::isfinite(ratio) && ratio >= 0 ? ratio / (1 + ratio) : 0.5;
  m.message_seconds = link->message_seconds;
  if (profile.comm_cpu) m.comm_cpu_seconds_per_byte = profile.comm_cpu->seconds_per_byte;
  DISTCA_RETURN_IF_ERROR(m.validate());
  return m;
}

Result<AutoToleranceChoice> choose_tolerance(const Batch& batch, const SchedulerSpec& spec,
                                             const ScheduleOptions& options, const AutoToleranceModel& model) {
  if (spec.kind != SchedulerKind::kCad && spec.kind != SchedulerKind::kCadSymmetric) {
    return Status::invalid_argument("--tolerance auto needs --scheduler cad or cad-symmetric (got " + spec.name() + ")");
  }
  DISTCA_RETURN_IF_ERROR(model.validate());
  AutoToleranceChoice choice;
  ScheduleOptions o = options;
  for (const double tol : kAutoTolerances) {
    o.tolerance = tol;
    double t = 0;
    if (model.pingpong()) {
      DISTCA_ASSIGN_OR_RETURN(PingPongPrediction best, predict_cut(batch, spec, o, model, 0));
      double cut = 0;
      for (const double f : kAutoCutFractions) {
        if (f == 0) continue;
        DISTCA_ASSIGN_OR_RETURN(PingPongPrediction p, predict_cut(batch, spec, o, model, f));
        // Strictly better than the best so far, and than the rule's by the margin.
        if (p.seconds < best.seconds && (cut != 0 || p.seconds < (1 - kAutoCutMargin) * best.seconds)) {
          best = p;
          cut = f;
        }
      }
      t = best.seconds;
      choice.cuts.push_back(cut);
      choice.predicted_signal.push_back(best.signal_seconds);
    } else {
      DISTCA_ASSIGN_OR_RETURN(Plan plan, make_plan(batch, spec, o));
      t = predict(plan, model);
    }
    choice.predicted.push_back(t);
  }
  // The default band, unless the fastest other band beats it by the margin (ties: tighter).
  const size_t n = choice.predicted.size();
  const size_t kept = static_cast<size_t>(
      std::find(std::begin(kAutoTolerances), std::end(kAutoTolerances), kAutoDefaultTolerance) -
      std::begin(kAutoTolerances));
  DISTCA_CHECK(kept < n);
  size_t best = kept;
  for (size_t i = 0; i < n; ++i) {
    if (i != kept && choice.predicted[i] < (1 - kAutoToleranceMargin) * choice.predicted[kept] &&
        (best == kept || choice.predicted[i] < choice.predicted[best])) {
      best = i;
    }
  }
  choice.tolerance = kAutoTolerances[best];
  choice.cut_fraction = choice.cuts.empty() ? 0 : choice.cuts[best];
  choice.predicted_seconds = choice.predicted[best];
  return choice;
}

bool kv_once_pays(const NanoPlans& plans, const AutoToleranceModel& model, int64_t layers) {
  if (!model.pingpong()) return true;
  AutoToleranceModel m = model;
  m.kv_once = true;
  const double on = predict_pingpong(plans, m, layers).seconds;
  m.kv_once = false;
  const double off = predict_pingpong(plans, m, layers).seconds;
  return !(off < (1 - kAutoToleranceMargin) * on);
}

}  // namespace distca
