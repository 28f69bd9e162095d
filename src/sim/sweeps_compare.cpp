// The machinery of the sweeps that run the cluster simulator (simulator.h): their workload,
// running a configuration over sampled iterations, each strategy's best configuration; and
// fig11 and fig12 (fig9 and fig10: sweeps_fig9_10.cpp). docs/simulation.md explains the
// configurations and every place where our numbers differ from the paper's.
//
// Shared protocol (the paper's, Section 6): every configuration averages `batches` sampled
// iterations, the SAME iterations for every strategy; WLB-ideal sweeps its CP degree (and, in
// 4D, the PP degree) and keeps the fastest configuration that fits in memory on every
// iteration; CAD (ping-pong) does the same over PP in 4D.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "distca/core/specs.h"
#include "distca/data/workload.h"
#include "distca/sim/simulator.h"
#include "distca/sim/sweeps.h"
#include "sweeps_internal.h"

namespace distca::sim::detail {
namespace {

// ---- workloads ------------------------------------------------------------------------------

// Re-cuts a drawn batch (contiguous layout) into `units` ranks of equal tokens: pieces of one
// document that become adjacent are merged, pieces that cross a new boundary are cut.
Batch repack(const Batch& drawn, int64_t units) {
  std::vector<Piece> stream;
  for (const auto& rank : drawn.per_rank) {
    for (const Piece& p : rank) {
      if (!stream.empty() && stream.back().doc == p.doc &&
          stream.back().offset + stream.back().len == p.offset) {
        stream.back().len += p.len;
      } else {
        stream.push_back(p);
      }
    }
  }
  const int64_t total = drawn.ranks * drawn.tokens_per_rank;
  DISTCA_CHECK(units > 0 && total % units == 0);
  Batch out;
  out.ranks = units;
  out.tokens_per_rank = total / units;
  out.per_rank.resize(static_cast<size_t>(units));
  int64_t r = 0, room = out.tokens_per_rank;
  for (Piece p : stream) {
    while (p.len > 0) {
      DISTCA_CHECK(r < units);
      const int64_t take = std::min(p.len, room);
      out.per_rank[static_cast<size_t>(r)].push_back(Piece{p.doc, p.offset, take, p.doc_len});
      p.offset += take;
      p.len -= take;
      room -= take;
      if (room == 0) {
        ++r;
        room = out.tokens_per_rank;
      }
    }
  }
  DISTCA_CHECK(r == units);
  return out;
}

}  // namespace

Result<std::vector<Batch>> draw(const WorkloadSpec& w, int64_t count, uint64_t seed) {
  const int64_t total = w.units * w.tokens_per_unit;
  if (w.units <= 0 || w.max_doc_len <= 0 || w.tokens_per_unit <= 0 || total % w.max_doc_len != 0 ||
      w.tokens_per_unit % kLengthQuantum != 0)
    return Status::invalid_argument("sweep workload: " + std::to_string(w.units) + " units x " +
                                    std::to_string(w.tokens_per_unit) + " tokens is not a whole number of " +
                                    std::to_string(w.max_doc_len) + "-token sequences");
  WorkloadOptions wo;
  wo.dist = w.dataset;
  wo.ranks = total / w.max_doc_len;
  wo.tokens_per_rank = w.max_doc_len;
  wo.max_doc_len = w.max_doc_len;
  wo.batches = count;
  wo.seed = seed;
  wo.prolong_long_prob = 0.8;  // the paper's 3D runs (../shared/data/README.md)
  DISTCA_ASSIGN_OR_RETURN(std::vector<Batch> drawn, make_batches(wo));
  std::vector<Batch> out;
  out.reserve(drawn.size());
  for (const Batch& b : drawn) out.push_back(repack(b, w.units));
  return out;
}

// ---- running configurations ---------------------------------------------------------------

Result<RunStats> run(const SimOptions& o, const std::vector<std::vector<Batch>>& iterations, bool stop_at_oom) {
  RunStats s;
  size_t ran = 0;
  double tokens = 0, secs = 0;
  for (const auto& mbs : iterations) {
    auto r = simulate(o, mbs);
    if (!r.ok()) return r.status().with_context(o.strategy.name() + " on " + std::to_string(o.cluster.gpus) + " GPUs");
    const SimResult& x = r.value();
    secs += x.iteration_seconds;
    tokens += static_cast<double>(x.tokens);
    s.bytes += x.bytes_total;
    s.ca_bytes += x.plan.comm_bytes_forward + x.plan.comm_bytes_backward;
    s.exposed_comm_fraction += x.exposed_comm_fraction;
    s.idle_fraction += x.idle_fraction;
    s.load_max_over_mean += x.plan.load_max_over_mean;
    s.peak_memory = std::max(s.peak_memory, x.peak_memory);
    s.oom = s.oom || x.oom;
    s.cp = x.cp_degree;
    s.dp = x.dp;
    s.iteration_seconds.push_back(x.iteration_seconds);
    s.iteration_tokens.push_back(static_cast<double>(x.tokens));
    ++ran;
    if (stop_at_oom && x.oom) break;
  }
  const double n = static_cast<double>(std::max<size_t>(ran, 1));
  s.seconds = secs / n;
  s.tokens_per_second = secs > 0 ? tokens / secs : 0;
  s.bytes /= n;
  s.ca_bytes /= n;
  s.exposed_comm_fraction /= n;
  s.idle_fraction /= n;
  s.load_max_over_mean /= n;
  return s;
}

bool better(const RunStats& a, const RunStats& b) {
  return (b.oom && !a.oom) || (a.oom == b.oom && a.tokens_per_second > b.tokens_per_second);
}

std::vector<int64_t> pow2_divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t c = 1; c <= n && n % c == 0; c *= 2) out.push_back(c);
  return out;
}

// Configurations that do not fit stop at their first iteration out of memory (at the
// memory-limit batch most CP degrees and keeping servers do not fit, and running them in full
// would double a sweep); only when nothing fits is every one run in full, so that the row
// reports the fastest, flagged oom. The chosen configuration is the same either way.
Result<RunStats> best_wlb(SimOptions o, const std::vector<std::vector<Batch>>& iterations) {
  for (const bool full : {false, true}) {
    RunStats best;
    bool have = false;
    for (int64_t c : pow2_divisors(o.cluster.units_per_stage())) {
      o.strategy = Strategy{StrategyKind::kWlb, c, CadMode::kPingPong};
      DISTCA_ASSIGN_OR_RETURN(RunStats s, run(o, iterations, !full));
      if (s.oom && !full) continue;
      if (!have || better(s, best)) {
        best = std::move(s);
        have = true;
      }
    }
    if (have) return best;
  }
  DISTCA_CHECK_MSG(false, "best_wlb: no CP degree ran");
  return RunStats{};
}

Result<bool> wlb_fits(SimOptions o, const std::vector<std::vector<Batch>>& iterations) {
  for (int64_t c : pow2_divisors(o.cluster.units_per_stage())) {
    o.strategy = Strategy{StrategyKind::kWlb, c, CadMode::kPingPong};
    DISTCA_ASSIGN_OR_RETURN(RunStats s, run(o, iterations, true));
    if (!s.oom) return true;
  }
  return false;
}

// Stateless servers: the paper's design, inputs sent again with dO, nothing kept. As
// best_wlb, configurations out of memory stop early unless nothing fits.
Result<RunStats> best_cad(SimOptions o, const std::vector<std::vector<Batch>>& iterations,
                          const std::vector<double>& tolerances, double& tolerance, bool& stateless) {
  o.strategy = Strategy{StrategyKind::kCad, 0, CadMode::kPingPong};
  for (const bool full : {false, true}) {
    RunStats best;
    bool have = false;
    for (double tol : tolerances) {
      o.tolerance = tol;
      for (bool sl : {false, true}) {
        o.cad_stateless = sl;
        DISTCA_ASSIGN_OR_RETURN(RunStats s, run(o, iterations, !full));
        const bool oom = s.oom;
        if (!(oom && !full) && (!have || better(s, best))) {
          best = std::move(s);
          tolerance = tol;
          stateless = sl;
          have = true;
        }
        if (!oom) break;  // keeping servers fit: no need for the stateless design
      }
    }
    if (have) return best;
  }
  DISTCA_CHECK_MSG(false, "best_cad: no tolerance given");
  return RunStats{};
}

Result<SimOptions> base_options(const std::string& model, int64_t gpus, int64_t pp, const ProfiledCostModel* table) {
  SimOptions o;
  o.attention_table = table;
  DISTCA_ASSIGN_OR_RETURN(o.model, model_preset(model));
  DISTCA_ASSIGN_OR_RETURN(o.cluster, make_cluster("h200", gpus));
  o.cluster.pp = pp;
  DISTCA_RETURN_IF_ERROR(o.validate());
  return o;
}

std::vector<std::vector<Batch>> group(std::vector<Batch> mbs, int64_t m) {
  std::vector<std::vector<Batch>> out;
  for (size_t i = 0; i + static_cast<size_t>(m) <= mbs.size(); i += static_cast<size_t>(m))
    out.emplace_back(std::make_move_iterator(mbs.begin() + static_cast<std::ptrdiff_t>(i)),
                     std::make_move_iterator(mbs.begin() + static_cast<std::ptrdiff_t>(i) + m));
  return out;
}

std::string short_model(const std::string& m) { return m == "llama-8b" ? "8B" : "34B"; }
std::string kilo(int64_t tokens) { return std::to_string(tokens / kK) + "K"; }

std::string col(const CsvTable& t, const std::string& name) {
  const auto it = std::find(t.columns.begin(), t.columns.end(), name);
  DISTCA_CHECK_MSG(it != t.columns.end(), "no column " + name);
  return std::to_string(it - t.columns.begin() + 1);
}

double ratio(double a, double b) { return b > 0 ? a / b : std::nan(""); }

std::vector<double> spread(const std::vector<double>& v) {
  if (v.empty()) return {std::nan(""), std::nan(""), std::nan("")};
  return {percentile(v, 0.10), percentile(v, 0.50), percentile(v, 0.90)};
}

namespace {

// ---- fig11 and fig12 ------------------------------------------------------------------------

// The ablation and tolerance sweeps use the paper's Figure 12 setting: Pretrain, max document
// 128K, 1M tokens per iteration for 8B and 512K for 34B on 8 nodes (the same per node on 16).
int64_t ablation_tokens_per_unit(const std::string& model) { return model == "llama-8b" ? 128 * kK : 64 * kK; }

// The name of the attention column: "analytic" or "table" (--cost-table).
std::string attention_name(const ProfiledCostModel* table) { return table ? "table" : "analytic"; }

// Per-iteration ratios a_i / b_i of two runs over the same iterations.
std::vector<double> per_iteration_ratio(const RunStats& a, const RunStats& b) {
  std::vector<double> out;
  for (size_t i = 0; i < std::min(a.iteration_seconds.size(), b.iteration_seconds.size()); ++i)
    out.push_back(ratio(a.iteration_seconds[i], b.iteration_seconds[i]));
  return out;
}

}  // namespace

Result<SweepSummary> run_fig11(const SweepOptions& options, const SweepProgressFn& progress,
                               const ProfiledCostModel* table) {
  struct Cfg { std::string model; int64_t gpus; };
  std::vector<Cfg> cfgs = {{"llama-8b", 64}, {"llama-8b", 128}, {"llama-34b", 64}, {"llama-34b", 128}};
  if (options.quick) cfgs = {{"llama-8b", 64}, {"llama-34b", 64}};
  CsvTable t;
  t.columns = {"model", "gpus", "max_doc_len", "tokens_per_unit", "batches", "attention", "signal_seconds",
               "pingpong_seconds", "single_stream_seconds", "pingpong_over_signal", "single_stream_over_pingpong",
               "single_stream_over_pingpong_p10", "single_stream_over_pingpong_p50", "single_stream_over_pingpong_p90",
               "pingpong_exposed_comm_fraction", "single_stream_exposed_comm_fraction", "ca_bytes_per_layer",
               "bytes_per_iteration",
               "paper_single_stream_over_pingpong_lo", "paper_single_stream_over_pingpong_hi"};
  SweepSummary s;
  s.name = options.name;
  int64_t done = 0;
  double worst = 0, best = 1e300;
  for (const auto& c : cfgs) {
    report(progress, done, static_cast<int64_t>(cfgs.size()),
           "fig11 " + short_model(c.model) + " " + std::to_string(c.gpus) + " GPUs");
    DISTCA_ASSIGN_OR_RETURN(SimOptions o, base_options(c.model, c.gpus, 1, table));
    const int64_t tpu = ablation_tokens_per_unit(c.model);
    const WorkloadSpec w{"pretrain", 128 * kK, o.cluster.units(), tpu};
    DISTCA_ASSIGN_OR_RETURN(auto mbs, draw(w, options.batches, options.seed));
    const auto iters = group(std::move(mbs), 1);
    RunStats r[3];
    const CadMode modes[3] = {CadMode::kSignal, CadMode::kPingPong, CadMode::kSingleStream};
    for (int i = 0; i < 3; ++i) {
      o.strategy = Strategy{StrategyKind::kCad, 0, modes[i]};
      DISTCA_ASSIGN_OR_RETURN(r[i], run(o, iters));
    }
    const double ss_pp = ratio(r[2].seconds, r[1].seconds);
    const auto sp = spread(per_iteration_ratio(r[2], r[1]));
    worst = std::max(worst, ss_pp);
    best = std::min(best, ss_pp);
    t.rows.push_back({c.model, fmt_int(c.gpus), fmt_int(128 * kK), fmt_int(tpu), fmt_int(options.batches),
                      attention_name(table), fmt(r[0].seconds, 4), fmt(r[1].seconds, 4), fmt(r[2].seconds, 4),
                      fmt(ratio(r[1].seconds, r[0].seconds), 4), fmt(ss_pp, 4), fmt(sp[0], 4), fmt(sp[1], 4),
                      fmt(sp[2], 4), fmt(r[1].exposed_comm_fraction, 4),
                      fmt(r[2].exposed_comm_fraction, 4), fmt(r[1].ca_bytes, 0), fmt(r[1].bytes, 0), "1.10", "1.17"});
    ++done;
  }
  report(progress, done, done, "fig11 done");
  s.headline.emplace_back("single-stream / ping-pong, min", best);
  s.headline.emplace_back("single-stream / ping-pong, max", worst);
  const std::string f = "fig11.csv";
  std::string body = "set title \"Figure 11: CAD ablation (Pretrain, max doc 128K): iteration time over signal\"\n";
  body += "set style data histogram\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n";
  body += "set ylabel \"iteration time / signal\"\nset yrange [0.9:*]\nset key top left\n";
  body += "plot '" + f + "' skip 1 using (1.0):xtic(sprintf(\"%s %d GPUs\", strcol(1), $2)) title \"signal\", \\\n";
  body += "     '' skip 1 using (column(" + col(t, "pingpong_seconds") + ")/column(" + col(t, "signal_seconds") +
          ")) title \"ping-pong\", \\\n";
  body += "     '' skip 1 using (column(" + col(t, "single_stream_seconds") + ")/column(" + col(t, "signal_seconds") +
          ")) title \"single-stream\"\n";
  DISTCA_RETURN_IF_ERROR(write_sweep_outputs(options, t, body, s));
  return s;
}

Result<SweepSummary> run_fig12(const SweepOptions& options, const SweepProgressFn& progress,
                               const ProfiledCostModel* table) {
  std::vector<double> tols;
  for (int i = 0; i <= 6; ++i) tols.push_back(0.05 * i);  // 0 .. 0.30
  if (options.quick) tols = {0.0, 0.15, 0.3};
  const std::vector<std::string> models = {"llama-8b", "llama-34b"};
  CsvTable t;
  // The paper's "communication volume" is CAD's own traffic: the CA-task bytes (per layer,
  // forward + backward); bytes_per_iteration also counts the DP gradient all-reduce, which no
  // tolerance changes.
  t.columns = {"model", "gpus", "max_doc_len", "tokens_per_unit", "batches", "attention", "tolerance", "cad_seconds",
               "cad_seconds_p10", "cad_seconds_p50", "cad_seconds_p90", "ca_bytes_per_layer", "bytes_per_iteration",
               "seconds_vs_tolerance_0", "seconds_vs_tolerance_0_p10", "seconds_vs_tolerance_0_p50",
               "seconds_vs_tolerance_0_p90", "bytes_vs_tolerance_0",
               "load_max_over_mean", "exposed_comm_fraction"};
  SweepSummary s;
  s.name = options.name;
  const int64_t total = static_cast<int64_t>(models.size() * tols.size());
  int64_t done = 0;
  for (const auto& model : models) {
    DISTCA_ASSIGN_OR_RETURN(SimOptions o, base_options(model, 64, 1, table));
    const int64_t tpu = ablation_tokens_per_unit(model);
    const WorkloadSpec w{"pretrain", 128 * kK, o.cluster.units(), tpu};
    DISTCA_ASSIGN_OR_RETURN(auto mbs, draw(w, options.batches, options.seed));
    const auto iters = group(std::move(mbs), 1);
    double sec0 = 0, bytes0 = 0;
    RunStats r0;
    for (double tol : tols) {
      report(progress, done, total, "fig12 " + short_model(model) + " tolerance " + fmt(tol, 2));
      o.strategy = Strategy{StrategyKind::kCad, 0, CadMode::kPingPong};
      o.tolerance = tol;
      DISTCA_ASSIGN_OR_RETURN(RunStats r, run(o, iters));
      if (tol == tols.front()) {
        sec0 = r.seconds;
        bytes0 = r.ca_bytes;
        r0 = r;
      }
      const auto secs = spread(r.iteration_seconds);
      const auto rel = spread(per_iteration_ratio(r, r0));
      t.rows.push_back({model, "64", fmt_int(128 * kK), fmt_int(tpu), fmt_int(options.batches), attention_name(table),
                        fmt(tol, 2), fmt(r.seconds, 4), fmt(secs[0], 4), fmt(secs[1], 4), fmt(secs[2], 4),
                        fmt(r.ca_bytes, 0), fmt(r.bytes, 0), fmt(ratio(r.seconds, sec0), 4), fmt(rel[0], 4),
                        fmt(rel[1], 4), fmt(rel[2], 4), fmt(ratio(r.ca_bytes, bytes0), 4), fmt(r.load_max_over_mean, 4),
                        fmt(r.exposed_comm_fraction, 4)});
      if (std::abs(tol - 0.15) < 1e-9)
        s.headline.emplace_back("CA bytes at tolerance 0.15 / at 0, " + short_model(model), ratio(r.ca_bytes, bytes0));
      ++done;
    }
  }
  report(progress, done, total, "fig12 done");
  const std::string f = "fig12.csv";
  std::string body = "set multiplot layout 1,2 title \"Figure 12: scheduler tolerance (Pretrain, max doc 128K, 64 GPUs)\"\n";
  body += "set xlabel \"tolerance\"\nset key top left\n";
  body += "set title \"iteration time relative to tolerance 0\"\nset ylabel \"seconds / seconds at 0\"\n";
  body += "plot for [m in \"llama-8b llama-34b\"] '" + f + "' skip 1 using (strcol(1) eq m ? $" + col(t, "tolerance") +
          " : NaN):" + col(t, "seconds_vs_tolerance_0") + " with linespoints lw 2 title m\n";
  body += "set title \"CA-task bytes relative to tolerance 0\"\nset ylabel \"bytes / bytes at 0\"\n";
  body += "plot for [m in \"llama-8b llama-34b\"] '" + f + "' skip 1 using (strcol(1) eq m ? $" + col(t, "tolerance") +
          " : NaN):" + col(t, "bytes_vs_tolerance_0") + " with linespoints lw 2 title m\n";
  body += "unset multiplot\n";
  DISTCA_RETURN_IF_ERROR(write_sweep_outputs(options, t, body, s));
  return s;
}

}  // namespace distca::sim::detail

namespace distca::sim {

Result<std::vector<Batch>> sweep_microbatches(const std::string& dataset, int64_t max_doc_len, int64_t units,
                                              int64_t tokens_per_unit, int64_t count, uint64_t seed) {
  if (count < 1) return Status::invalid_argument("sweep workload: count must be positive");
  return detail::draw(detail::WorkloadSpec{dataset, max_doc_len, units, tokens_per_unit}, count, seed);
}

}  // namespace distca::sim
