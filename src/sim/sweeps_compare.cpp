// fig9 .. fig12: the sweeps that run the cluster simulator (simulator.h) over the paper's
// configurations and compare strategies. docs/simulation.md explains the configurations and
// every place where our numbers differ from the paper's.
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

constexpr int64_t kK = 1024;

// ---- workloads ------------------------------------------------------------------------------

// A comparison sweep's workload (sweep_microbatches in sweeps.h).
struct WorkloadSpec {
  std::string dataset;  // "pretrain" | "prolong"
  int64_t max_doc_len = 128 * kK;
  int64_t units = 8;            // units of one pipeline stage (the Batch's ranks)
  int64_t tokens_per_unit = 0;  // per micro-batch
};

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

// `count` micro-batches of `w`; micro-batch i is the data layer's draw i of the seed.
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

// Tokens per unit (per micro-batch) of the comparison sweeps. The paper sets the batch to the
// most tokens its baseline fits (its Tables 3 and 4, not in our sources); we fix one figure per
// model and max document length that fits both WLB-ideal and CAD on H200 in our memory model
// and lands in the paper's range of batch sizes (2 to 32 sequences at 64 GPUs): 8B 512K per
// node (32 x 128K .. 8 x 512K); 34B 256K per node at 128K (16 x 128K), 128K per node beyond
// (4 x 256K, 2 x 512K).
int64_t tokens_per_unit_for(const std::string& model, int64_t max_doc_len, int64_t units) {
  const int64_t target = model == "llama-8b" ? 512 * kK : (max_doc_len <= 128 * kK ? 256 * kK : 128 * kK);
  // A whole number of sequences over the stage's units (384K sequences do not divide 256K).
  const int64_t seqs = std::max<int64_t>(1, units * target / max_doc_len);
  return seqs * max_doc_len / units;
}

// ---- running configurations ---------------------------------------------------------------

struct RunStats {
  double seconds = 0;           // mean iteration seconds
  double tokens_per_second = 0; // tokens of all iterations / their summed seconds
  double bytes = 0;             // mean bytes moved per iteration (all units, all traffic)
  double ca_bytes = 0;          // mean CA-task bytes per layer (forward + backward, all plans)
  double exposed_comm_fraction = 0;
  double idle_fraction = 0;
  double load_max_over_mean = 0;  // mean over iterations of the worst plan's load ratio
  double peak_memory = 0;         // bytes per GPU, max over iterations
  bool oom = false;               // some iteration does not fit
  int64_t cp = 0, dp = 0;
};

// Simulates each iteration (a group of micro-batches) with `o` and averages.
Result<RunStats> run(const SimOptions& o, const std::vector<std::vector<Batch>>& iterations) {
  RunStats s;
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
  }
  const double n = static_cast<double>(iterations.size());
  s.seconds = secs / n;
  s.tokens_per_second = secs > 0 ? tokens / secs : 0;
  s.bytes /= n;
  s.ca_bytes /= n;
  s.exposed_comm_fraction /= n;
  s.idle_fraction /= n;
  s.load_max_over_mean /= n;
  return s;
}

// Powers of two dividing n: 1, 2, 4, ...
std::vector<int64_t> pow2_divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t c = 1; c <= n && n % c == 0; c *= 2) out.push_back(c);
  return out;
}

// WLB-ideal: every CP degree, the fastest (by throughput) that fits on every iteration; when
// none fits, the fastest overall, flagged oom.
Result<RunStats> best_wlb(SimOptions o, const std::vector<std::vector<Batch>>& iterations) {
  RunStats best;
  bool have = false;
  for (int64_t c : pow2_divisors(o.cluster.units_per_stage())) {
    o.strategy = Strategy{StrategyKind::kWlb, c, CadMode::kPingPong};
    DISTCA_ASSIGN_OR_RETURN(RunStats s, run(o, iterations));
    const bool better = !have || (best.oom && !s.oom) ||
                        (best.oom == s.oom && s.tokens_per_second > best.tokens_per_second);
    if (better) {
      best = s;
      have = true;
    }
  }
  return best;
}

// The scheduler tolerances CAD is tuned over (the paper tunes it per model, its Figure 12, as
// WLB-ideal gets its CP degree swept): four in fig9, two in fig10 to keep its PP x CP x
// tolerance grid within a couple of minutes.
const std::vector<double> kCadTolerances = {0.0, 0.05, 0.1, 0.15};
const std::vector<double> kCadTolerances4d = {0.0, 0.1};

// CAD (ping-pong) at its best tolerance: the fastest that fits, else the fastest, flagged oom.
// Servers keep their forward inputs (the runtime's default); where that does not fit in
// memory, stateless servers (the paper's design: inputs sent again with dO, nothing kept) are
// tried too. `stateless` receives the design of the result.
Result<RunStats> best_cad(SimOptions o, const std::vector<std::vector<Batch>>& iterations,
                          const std::vector<double>& tolerances, double& tolerance, bool& stateless) {
  RunStats best;
  bool have = false;
  o.strategy = Strategy{StrategyKind::kCad, 0, CadMode::kPingPong};
  for (double tol : tolerances) {
    o.tolerance = tol;
    for (bool sl : {false, true}) {
      o.cad_stateless = sl;
      DISTCA_ASSIGN_OR_RETURN(RunStats s, run(o, iterations));
      const bool better = !have || (best.oom && !s.oom) ||
                          (best.oom == s.oom && s.tokens_per_second > best.tokens_per_second);
      if (better) {
        best = s;
        tolerance = tol;
        stateless = sl;
        have = true;
      }
      if (!s.oom) break;  // keeping servers fit: no need for the stateless design
    }
  }
  return best;
}

Result<SimOptions> base_options(const std::string& model, int64_t gpus, int64_t pp) {
  SimOptions o;
  DISTCA_ASSIGN_OR_RETURN(o.model, model_preset(model));
  DISTCA_ASSIGN_OR_RETURN(o.cluster, make_cluster("h200", gpus));
  o.cluster.pp = pp;
  DISTCA_RETURN_IF_ERROR(o.validate());
  return o;
}

// Groups consecutive micro-batches into iterations of m.
std::vector<std::vector<Batch>> group(std::vector<Batch> mbs, int64_t m) {
  std::vector<std::vector<Batch>> out;
  for (size_t i = 0; i + static_cast<size_t>(m) <= mbs.size(); i += static_cast<size_t>(m))
    out.emplace_back(std::make_move_iterator(mbs.begin() + static_cast<std::ptrdiff_t>(i)),
                     std::make_move_iterator(mbs.begin() + static_cast<std::ptrdiff_t>(i) + m));
  return out;
}

std::string short_model(const std::string& m) { return m == "llama-8b" ? "8B" : "34B"; }
std::string kilo(int64_t tokens) { return std::to_string(tokens / kK) + "K"; }

// 1-based column index of `name` in `t` (for gnuplot scripts).
std::string col(const CsvTable& t, const std::string& name) {
  const auto it = std::find(t.columns.begin(), t.columns.end(), name);
  DISTCA_CHECK_MSG(it != t.columns.end(), "no column " + name);
  return std::to_string(it - t.columns.begin() + 1);
}

double ratio(double a, double b) { return b > 0 ? a / b : std::nan(""); }

// ---- fig9 and fig10 -------------------------------------------------------------------------

struct CompareConfig {
  std::string model, dataset;
  int64_t max_doc_len = 0, gpus = 0;
};

// The paper's reported speedup ranges of CAD over WLB-ideal (NaN where it gives none).
std::pair<double, double> paper_range(bool fourd, const std::string& model, const std::string& dataset) {
  if (!fourd) return dataset == "pretrain" ? std::pair{1.07, 1.20} : std::pair{1.05, 1.12};
  if (model == "llama-8b") return dataset == "pretrain" ? std::pair{1.15, 1.30} : std::pair{1.10, 1.35};
  return dataset == "pretrain" ? std::pair{std::nan(""), 1.15} : std::pair{std::nan(""), 1.25};
}

std::vector<CompareConfig> compare_configs(bool fourd, bool quick) {
  std::vector<CompareConfig> out;
  for (const std::string model : {"llama-8b", "llama-34b"}) {
    if (quick && model != "llama-8b") continue;
    std::vector<int64_t> lens = {128 * kK, 256 * kK, (fourd && model == "llama-34b" ? 384 : 512) * kK};
    std::vector<int64_t> gpus = (fourd && model == "llama-34b") ? std::vector<int64_t>{128, 256, 512}
                                                                 : std::vector<int64_t>{64, 128, 256};
    if (quick) {
      lens = {128 * kK};
      gpus = {64};
    }
    for (const std::string dataset : {"pretrain", "prolong"})
      for (int64_t L : lens)
        for (int64_t g : gpus) out.push_back({model, dataset, L, g});
  }
  return out;
}

// PP degrees tried in 4D: powers of two up to 8 that leave at least one unit per stage.
std::vector<int64_t> pp_degrees(int64_t units, bool quick) {
  std::vector<int64_t> out;
  for (int64_t p = 1; p <= (quick ? 2 : 8) && units % p == 0; p *= 2) out.push_back(p);
  return out;
}

Result<SweepSummary> run_compare(const SweepOptions& options, const SweepProgressFn& progress, bool fourd) {
  const auto configs = compare_configs(fourd, options.quick);
  CsvTable t;
  t.columns = {"model", "dataset", "max_doc_len", "gpus", "units", "tokens_per_unit", "batches"};
  if (fourd) t.columns.insert(t.columns.end(), {"wlb_pp", "wlb_microbatches"});
  t.columns.insert(t.columns.end(), {"wlb_cp", "wlb_dp", "wlb_seconds", "wlb_tokens_per_second", "wlb_oom",
                                     "wlb_idle_fraction", "wlb_peak_memory_gb"});
  if (fourd) t.columns.insert(t.columns.end(), {"cad_pp", "cad_microbatches"});
  t.columns.insert(t.columns.end(), {"cad_tolerance", "cad_servers", "cad_seconds", "cad_tokens_per_second", "cad_oom", "cad_exposed_comm_fraction",
                                     "cad_load_max_over_mean", "cad_peak_memory_gb", "speedup", "paper_speedup_lo",
                                     "paper_speedup_hi"});
  SweepSummary s;
  s.name = options.name;
  std::map<std::string, std::pair<double, double>> ranges;  // dataset -> (min, max) speedup
  int64_t done = 0;
  for (const auto& c : configs) {
    const std::string what = options.name + " " + short_model(c.model) + " " + c.dataset + " " +
                             kilo(c.max_doc_len) + " " + std::to_string(c.gpus) + " GPUs";
    report(progress, done, static_cast<int64_t>(configs.size()), what);
    DISTCA_ASSIGN_OR_RETURN(SimOptions o3, base_options(c.model, c.gpus, 1));
    const int64_t units = o3.cluster.units();
    const int64_t tpu = tokens_per_unit_for(c.model, c.max_doc_len, units);

    RunStats wlb, cad;
    int64_t wlb_pp = 1, cad_pp = 1, wlb_m = 1, cad_m = 1;
    double cad_tol = 0;
    bool cad_sl = false;
    bool have_w = false, have_c = false;
    for (int64_t pp : fourd ? pp_degrees(units, options.quick) : std::vector<int64_t>{1}) {
      DISTCA_ASSIGN_OR_RETURN(SimOptions o, base_options(c.model, c.gpus, pp));
      // 4D: the same tokens per unit in each micro-batch for every PP degree (so about the
      // same activation memory per GPU: 1F1B keeps p micro-batches of L/p layers in flight on
      // the first stage) as long as a micro-batch holds a whole sequence; m = 2p micro-batches
      // (bubble (p-1)/(3p-1) < 1/3), so every PP degree runs the same global batch of 2 x the
      // 3D one, and batches / p iterations sample the same number of micro-batches for each p.
      const int64_t m = fourd ? 2 * pp : 1;
      const int64_t iterations = fourd ? std::max<int64_t>(1, options.batches / pp) : options.batches;
      const WorkloadSpec w{c.dataset, c.max_doc_len, units / pp,
                           tokens_per_unit_for(c.model, c.max_doc_len, units / pp)};
      DISTCA_ASSIGN_OR_RETURN(auto mbs, draw(w, iterations * m, options.seed));
      const auto iters = group(std::move(mbs), m);
      DISTCA_ASSIGN_OR_RETURN(RunStats sw, best_wlb(o, iters));
      double tol = 0;
      bool sl = false;
      DISTCA_ASSIGN_OR_RETURN(RunStats sc, best_cad(o, iters, fourd ? kCadTolerances4d : kCadTolerances, tol, sl));
      auto better = [](const RunStats& a, const RunStats& b) {
        return (b.oom && !a.oom) || (a.oom == b.oom && a.tokens_per_second > b.tokens_per_second);
      };
      if (!have_w || better(sw, wlb)) { wlb = sw; wlb_pp = pp; wlb_m = m; have_w = true; }
      if (!have_c || better(sc, cad)) { cad = sc; cad_pp = pp; cad_m = m; cad_tol = tol; cad_sl = sl; have_c = true; }
    }
    // A configuration that does not fit has no throughput to compare (the paper reports none).
    const double speedup =
        wlb.oom || cad.oom ? std::nan("") : ratio(cad.tokens_per_second, wlb.tokens_per_second);
    const auto [lo, hi] = paper_range(fourd, c.model, c.dataset);
    std::vector<std::string> row = {c.model, c.dataset, fmt_int(c.max_doc_len), fmt_int(c.gpus), fmt_int(units),
                                    fmt_int(tpu), fmt_int(options.batches)};
    if (fourd) row.insert(row.end(), {fmt_int(wlb_pp), fmt_int(wlb_m)});
    row.insert(row.end(), {fmt_int(wlb.cp), fmt_int(wlb.dp), fmt(wlb.seconds, 4), fmt(wlb.tokens_per_second, 0),
                           fmt_int(wlb.oom), fmt(wlb.idle_fraction, 4), fmt(wlb.peak_memory / 1e9, 1)});
    if (fourd) row.insert(row.end(), {fmt_int(cad_pp), fmt_int(cad_m)});
    row.insert(row.end(), {fmt(cad_tol, 2), cad_sl ? "stateless" : "keep", fmt(cad.seconds, 4), fmt(cad.tokens_per_second, 0), fmt_int(cad.oom),
                           fmt(cad.exposed_comm_fraction, 4), fmt(cad.load_max_over_mean, 4),
                           fmt(cad.peak_memory / 1e9, 1), fmt(speedup, 4), fmt(lo, 2), fmt(hi, 2)});
    t.rows.push_back(std::move(row));
    if (!std::isnan(speedup)) {
      const std::string key = short_model(c.model) + " " + c.dataset;
      auto [it, fresh] = ranges.try_emplace(key, speedup, speedup);
      if (!fresh) it->second = {std::min(it->second.first, speedup), std::max(it->second.second, speedup)};
    }
    ++done;
  }
  report(progress, done, done, options.name + " done");
  for (const auto& [key, r] : ranges) {
    s.headline.emplace_back("speedup min " + key, r.first);
    s.headline.emplace_back("speedup max " + key, r.second);
  }

  const std::string title = fourd ? "Figure 10 (4D): CAD over WLB-ideal, best PP x DP x CP of each"
                                  : "Figure 9 (3D, no PP): CAD (ping-pong) over WLB-ideal (best CP degree)";
  const std::string f = options.name + ".csv";
  std::string body = "set multiplot layout 2,2 title \"" + title + "\"\n";
  // Fixed ranges: a panel with no rows (--quick) must still draw.
  body += std::string("set logscale x 2\nset xrange [") + (fourd ? "48:700" : "48:350") +
          "]\nset xlabel \"GPUs\"\nset ylabel \"speedup (throughput ratio)\"\n";
  body += "set key bottom right font ',9' samplen 2\nset yrange [0.6:1.5]\n";
  body += "do for [m in \"llama-8b llama-34b\"] {\n  do for [d in \"pretrain prolong\"] {\n";
  body += "    set title sprintf(\"%s, %s\", m, d)\n";
  body += "    plot for [L in \"" + std::string(fourd ? "131072 262144 393216 524288" : "131072 262144 524288") +
          "\"] '" + f + "' skip 1 using ((strcol(1) eq m && strcol(2) eq d && strcol(3) eq L) ? $" +
          col(t, "gpus") + " : NaN):" + col(t, "speedup") +
          " with linespoints lw 2 title sprintf(\"ours, max doc %dK\", int(L)/1024), \\\n";
  body += "         '' skip 1 using ((strcol(1) eq m && strcol(2) eq d) ? $" + col(t, "gpus") + " : NaN):" +
          col(t, "paper_speedup_hi") + " smooth unique with lines dt 2 lc rgb 'black' title \"paper, top of range\", \\\n";
  body += "         '' skip 1 using ((strcol(1) eq m && strcol(2) eq d) ? $" + col(t, "gpus") + " : NaN):" +
          col(t, "paper_speedup_lo") + " smooth unique with lines dt 3 lc rgb 'black' title \"paper, bottom of range\"\n";
  body += "  }\n}\nunset multiplot\n";
  DISTCA_RETURN_IF_ERROR(write_sweep_outputs(options, t, body, s));
  return s;
}

// ---- fig11 and fig12 ------------------------------------------------------------------------

// The ablation and tolerance sweeps use the paper's Figure 12 setting: Pretrain, max document
// 128K, 1M tokens per iteration for 8B and 512K for 34B on 8 nodes (the same per node on 16).
int64_t ablation_tokens_per_unit(const std::string& model) { return model == "llama-8b" ? 128 * kK : 64 * kK; }

}  // namespace

Result<SweepSummary> run_fig9(const SweepOptions& options, const SweepProgressFn& progress) {
  return run_compare(options, progress, false);
}

Result<SweepSummary> run_fig10(const SweepOptions& options, const SweepProgressFn& progress) {
  return run_compare(options, progress, true);
}

Result<SweepSummary> run_fig11(const SweepOptions& options, const SweepProgressFn& progress) {
  struct Cfg { std::string model; int64_t gpus; };
  std::vector<Cfg> cfgs = {{"llama-8b", 64}, {"llama-8b", 128}, {"llama-34b", 64}, {"llama-34b", 128}};
  if (options.quick) cfgs = {{"llama-8b", 64}, {"llama-34b", 64}};
  CsvTable t;
  t.columns = {"model", "gpus", "max_doc_len", "tokens_per_unit", "batches", "signal_seconds", "pingpong_seconds",
               "single_stream_seconds", "pingpong_over_signal", "single_stream_over_pingpong",
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
    DISTCA_ASSIGN_OR_RETURN(SimOptions o, base_options(c.model, c.gpus, 1));
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
    worst = std::max(worst, ss_pp);
    best = std::min(best, ss_pp);
    t.rows.push_back({c.model, fmt_int(c.gpus), fmt_int(128 * kK), fmt_int(tpu), fmt_int(options.batches),
                      fmt(r[0].seconds, 4), fmt(r[1].seconds, 4), fmt(r[2].seconds, 4),
                      fmt(ratio(r[1].seconds, r[0].seconds), 4), fmt(ss_pp, 4), fmt(r[1].exposed_comm_fraction, 4),
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

Result<SweepSummary> run_fig12(const SweepOptions& options, const SweepProgressFn& progress) {
  std::vector<double> tols;
  for (int i = 0; i <= 6; ++i) tols.push_back(0.05 * i);  // 0 .. 0.30
  if (options.quick) tols = {0.0, 0.15, 0.3};
  const std::vector<std::string> models = {"llama-8b", "llama-34b"};
  CsvTable t;
  // The paper's "communication volume" is CAD's own traffic: the CA-task bytes (per layer,
  // forward + backward); bytes_per_iteration also counts the DP gradient all-reduce, which no
  // tolerance changes.
  t.columns = {"model", "gpus", "max_doc_len", "tokens_per_unit", "batches", "tolerance", "cad_seconds",
               "ca_bytes_per_layer", "bytes_per_iteration", "seconds_vs_tolerance_0", "bytes_vs_tolerance_0",
               "load_max_over_mean", "exposed_comm_fraction"};
  SweepSummary s;
  s.name = options.name;
  const int64_t total = static_cast<int64_t>(models.size() * tols.size());
  int64_t done = 0;
  for (const auto& model : models) {
    DISTCA_ASSIGN_OR_RETURN(SimOptions o, base_options(model, 64, 1));
    const int64_t tpu = ablation_tokens_per_unit(model);
    const WorkloadSpec w{"pretrain", 128 * kK, o.cluster.units(), tpu};
    DISTCA_ASSIGN_OR_RETURN(auto mbs, draw(w, options.batches, options.seed));
    const auto iters = group(std::move(mbs), 1);
    double sec0 = 0, bytes0 = 0;
    for (double tol : tols) {
      report(progress, done, total, "fig12 " + short_model(model) + " tolerance " + fmt(tol, 2));
      o.strategy = Strategy{StrategyKind::kCad, 0, CadMode::kPingPong};
      o.tolerance = tol;
      DISTCA_ASSIGN_OR_RETURN(RunStats r, run(o, iters));
      if (tol == tols.front()) {
        sec0 = r.seconds;
        bytes0 = r.ca_bytes;
      }
      t.rows.push_back({model, "64", fmt_int(128 * kK), fmt_int(tpu), fmt_int(options.batches), fmt(tol, 2),
                        fmt(r.seconds, 4), fmt(r.ca_bytes, 0), fmt(r.bytes, 0), fmt(ratio(r.seconds, sec0), 4),
                        fmt(ratio(r.ca_bytes, bytes0), 4), fmt(r.load_max_over_mean, 4),
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
