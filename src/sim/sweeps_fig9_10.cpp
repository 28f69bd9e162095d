// fig9 (3D) and fig10 (4D): CAD over WLB-ideal at each side's best configuration, with the
// batch size set by a batch rule (docs/simulation.md, "Figure 9" and "Figure 10"):
//   memory-limit (default, the paper's rule, its Section 6 and Tables 3/4): the batch is the
//     largest number of sequences of the max document length that WLB-ideal fits in memory at
//     some CP degree on every sampled iteration (the simulator's own OOM flag), per PP degree
//     in 4D; CAD runs the same batches.
//   fixed: the tokens per node fixed per model and max document length (the figures before
//     the rule existed), kept so that both framings can be compared.
// Beside every speedup the sweeps report its spread over iterations (p10/p50/p90 of the
// per-iteration throughput ratio) and each side's iteration-time spread.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "distca/sim/simulator.h"
#include "distca/sim/sweeps.h"
#include "sweeps_internal.h"

namespace distca::sim::detail {
namespace {

// The scheduler tolerances CAD is tuned over (the paper tunes it per model, its Figure 12, as
// WLB-ideal gets its CP degree swept): four in fig9, two in fig10 to keep its PP x CP x
// tolerance grid (times the batch search) within a few minutes.
const std::vector<double> kCadTolerances = {0.0, 0.05, 0.1, 0.15};
const std::vector<double> kCadTolerances4d = {0.0, 0.1};

// The memory search never goes past this many tokens per unit and micro-batch (16M: far past
// what any preset's 141 GB holds for the models here), so a memory model that never runs out
// still ends the search; a row that reaches it says "memory-limit-capped".
constexpr int64_t kMaxSearchTokensPerUnit = 16 * kK * kK;

// The fixed rule's sequences per micro-batch over `units` units: a fixed tokens-per-node figure
// per model and max document length that fitted both WLB-ideal and CAD on H200 in the memory
// model that predates the memory-limit rule, in the paper's range of batch sizes (2 to 32
// sequences at 64 GPUs): 8B 512K per node (32 x 128K .. 8 x 512K); 34B 256K per node at 128K
// (16 x 128K), 128K per node beyond (4 x 256K, 2 x 512K). A whole number of sequences over the
// stage's units (384K sequences do not divide 256K).
int64_t fixed_sequences(const std::string& model, int64_t max_doc_len, int64_t units) {
  const int64_t target = model == "llama-8b" ? 512 * kK : (max_doc_len <= 128 * kK ? 256 * kK : 128 * kK);
  return std::max<int64_t>(1, units * target / max_doc_len);
}

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

// One PP degree's setting: `iterations` iterations of m micro-batches, each `seqs` sequences
// of the max document length over `ups` units.
struct Setting {
  int64_t ups = 0, m = 1, iterations = 1;
};

Result<std::vector<std::vector<Batch>>> draw_iterations(const CompareConfig& c, const Setting& st, int64_t seqs,
                                                        uint64_t seed) {
  const WorkloadSpec w{c.dataset, c.max_doc_len, st.ups, seqs * c.max_doc_len / st.ups};
  DISTCA_ASSIGN_OR_RETURN(auto mbs, draw(w, st.iterations * st.m, seed));
  return group(std::move(mbs), st.m);
}

// The batch rule's sequences per micro-batch; `label` gets the batch_rule cell. memory-limit:
// the largest n at which WLB-ideal fits (some CP degree, every iteration): doubling (or halving)
// from the fixed rule's figure until the answer flips, then bisection, so the result n fits
// and n + 1 does not (both probed). 0 when not even one sequence fits.
Result<int64_t> batch_sequences(const std::string& rule, const SimOptions& o, const CompareConfig& c,
                                const Setting& st, uint64_t seed, std::string& label) {
  const int64_t start = fixed_sequences(c.model, c.max_doc_len, st.ups);
  label = rule;
  if (rule == "fixed") return start;
  const int64_t max_seqs = std::max<int64_t>(1, kMaxSearchTokensPerUnit * st.ups / c.max_doc_len);
  auto fits = [&](int64_t n) -> Result<bool> {
    DISTCA_ASSIGN_OR_RETURN(auto iters, draw_iterations(c, st, n, seed));
    return wlb_fits(o, iters);
  };
  int64_t lo = 0, hi = 0;  // lo fits (0: none known), hi does not (0: none known)
  int64_t n = std::min(start, max_seqs);
  DISTCA_ASSIGN_OR_RETURN(bool f, fits(n));
  if (f) {
    lo = n;
    while (hi == 0) {
      if (lo >= max_seqs) {
        label = rule + "-capped";
        return lo;
      }
      n = std::min(2 * lo, max_seqs);
      DISTCA_ASSIGN_OR_RETURN(f, fits(n));
      (f ? lo : hi) = n;
    }
  } else {
    hi = n;
    while (lo == 0) {
      if (hi == 1) return 0;
      n = hi / 2;
      DISTCA_ASSIGN_OR_RETURN(f, fits(n));
      (f ? lo : hi) = n;
    }
  }
  while (hi - lo > 1) {
    n = lo + (hi - lo) / 2;
    DISTCA_ASSIGN_OR_RETURN(f, fits(n));
    (f ? lo : hi) = n;
  }
  return lo;
}

// One strategy's chosen configuration in a row.
struct Side {
  RunStats s;
  int64_t pp = 1, m = 1, seqs = 0, tpu = 0;
  double tolerance = 0;
  bool stateless = false;
  bool have = false;
};

std::vector<double> per_iteration_throughput(const RunStats& s) {
  std::vector<double> out;
  for (size_t i = 0; i < s.iteration_seconds.size(); ++i)
    out.push_back(ratio(s.iteration_tokens[i], s.iteration_seconds[i]));
  return out;
}

// The CSV columns of Figure 9 (3D) or 10 (4D, fourd).
std::vector<std::string> compare_columns(bool fourd) {
  std::vector<std::string> cols;
  cols = {"model", "dataset", "max_doc_len", "gpus", "units", "batches", "batch_rule", "attention"};
  if (fourd) {
    cols.insert(cols.end(), {"wlb_pp", "wlb_microbatches", "wlb_sequences", "wlb_tokens_per_unit"});
  } else {
    cols.insert(cols.end(), {"sequences", "tokens_per_unit"});
  }
  cols.insert(cols.end(), {"wlb_cp", "wlb_dp", "wlb_seconds", "wlb_seconds_p10", "wlb_seconds_p50",
                                     "wlb_seconds_p90", "wlb_tokens_per_second", "wlb_oom", "wlb_idle_fraction",
                                     "wlb_peak_memory_gb"});
  if (fourd)
    cols.insert(cols.end(), {"cad_pp", "cad_microbatches", "cad_sequences", "cad_tokens_per_unit"});
  cols.insert(cols.end(), {"cad_tolerance", "cad_servers", "cad_seconds", "cad_seconds_p10",
                                     "cad_seconds_p50", "cad_seconds_p90", "cad_tokens_per_second", "cad_oom",
                                     "cad_exposed_comm_fraction", "cad_load_max_over_mean", "cad_peak_memory_gb",
                                     "speedup", "speedup_p10", "speedup_p50", "speedup_p90"});
  if (fourd) cols.push_back("speedup_same_batches");
  cols.insert(cols.end(), {"paper_speedup_lo", "paper_speedup_hi"});
  return cols;
}

// One configuration's CSV row (compare_columns' order).
std::vector<std::string> compare_row(const CompareConfig& c, const SweepOptions& options, bool fourd, bool table,
                                     int64_t units, const std::string& label, const Side& wlb, const Side& cad,
                                     double speedup, const std::vector<double>& per_iter) {
  const auto sp = spread(per_iter);
  const auto ws = spread(wlb.s.iteration_seconds), cs = spread(cad.s.iteration_seconds);
  const auto [lo, hi] = paper_range(fourd, c.model, c.dataset);
  std::vector<std::string> row = {c.model,        c.dataset, fmt_int(c.max_doc_len), fmt_int(c.gpus),
                                  fmt_int(units), fmt_int(options.batches), label, table ? "table" : "analytic"};
  if (fourd) {
    row.insert(row.end(), {fmt_int(wlb.pp), fmt_int(wlb.m), fmt_int(wlb.seqs), fmt_int(wlb.tpu)});
  } else {
    row.insert(row.end(), {fmt_int(wlb.seqs), fmt_int(wlb.tpu)});
  }
  row.insert(row.end(), {fmt_int(wlb.s.cp), fmt_int(wlb.s.dp), fmt(wlb.s.seconds, 4), fmt(ws[0], 4), fmt(ws[1], 4),
                         fmt(ws[2], 4), fmt(wlb.s.tokens_per_second, 0), fmt_int(wlb.s.oom),
                         fmt(wlb.s.idle_fraction, 4), fmt(wlb.s.peak_memory / 1e9, 1)});
  if (fourd) row.insert(row.end(), {fmt_int(cad.pp), fmt_int(cad.m), fmt_int(cad.seqs), fmt_int(cad.tpu)});
  row.insert(row.end(), {fmt(cad.tolerance, 2), cad.stateless ? "stateless" : "keep", fmt(cad.s.seconds, 4),
                         fmt(cs[0], 4), fmt(cs[1], 4), fmt(cs[2], 4), fmt(cad.s.tokens_per_second, 0),
                         fmt_int(cad.s.oom), fmt(cad.s.exposed_comm_fraction, 4), fmt(cad.s.load_max_over_mean, 4),
                         fmt(cad.s.peak_memory / 1e9, 1), fmt(speedup, 4), fmt(sp[0], 4), fmt(sp[1], 4),
                         fmt(sp[2], 4)});
  if (fourd) row.push_back(fmt_int(wlb.pp == cad.pp));
  row.insert(row.end(), {fmt(lo, 2), fmt(hi, 2)});
  return row;
}

// The gnuplot script of the figure, over the CSV `name`.csv of table t.
std::string compare_plot(bool fourd, const std::string& name, const CsvTable& t) {
  const std::string title = fourd ? "Figure 10 (4D): CAD over WLB-ideal, best PP x DP x CP of each"
                                  : "Figure 9 (3D, no PP): CAD (ping-pong) over WLB-ideal (best CP degree)";
  const std::string f = name + ".csv";
  std::string body = "set multiplot layout 2,2 title \"" + title + " (bars: p10-p90 over iterations)\"\n";
  // Fixed ranges: a panel with no rows (--quick) must still draw.
  body += std::string("set logscale x 2\nset xrange [") + (fourd ? "48:700" : "48:350") +
          "]\nset xlabel \"GPUs\"\nset ylabel \"speedup (throughput ratio)\"\n";
  body += "set key bottom right font ',9' samplen 2\nset yrange [0.6:1.6]\n";
  body += "do for [m in \"llama-8b llama-34b\"] {\n  do for [d in \"pretrain prolong\"] {\n";
  body += "    set title sprintf(\"%s, %s\", m, d)\n";
  body += "    plot for [L in \"" + std::string(fourd ? "131072 262144 393216 524288" : "131072 262144 524288") +
          "\"] '" + f + "' skip 1 using ((strcol(1) eq m && strcol(2) eq d && strcol(3) eq L) ? $" +
          col(t, "gpus") + " : NaN):" + col(t, "speedup") + ":" + col(t, "speedup_p10") + ":" +
          col(t, "speedup_p90") + " with yerrorlines lw 2 title sprintf(\"ours, max doc %dK\", int(L)/1024), \\\n";
  body += "         '' skip 1 using ((strcol(1) eq m && strcol(2) eq d) ? $" + col(t, "gpus") + " : NaN):" +
          col(t, "paper_speedup_hi") + " smooth unique with lines dt 2 lc rgb 'black' title \"paper, top of range\", \\\n";
  body += "         '' skip 1 using ((strcol(1) eq m && strcol(2) eq d) ? $" + col(t, "gpus") + " : NaN):" +
          col(t, "paper_speedup_lo") + " smooth unique with lines dt 3 lc rgb 'black' title \"paper, bottom of range\"\n";
  body += "  }\n}\nunset multiplot\n";
  return body;
}

Result<SweepSummary> run_compare(const SweepOptions& options, const SweepProgressFn& progress,
                                 const ProfiledCostModel* table, bool fourd) {
  const auto configs = compare_configs(fourd, options.quick);
  const std::string rule = options.batch_rule.empty() ? "memory-limit" : options.batch_rule;
  CsvTable t;
  t.columns = compare_columns(fourd);
  SweepSummary s;
  s.name = options.name;
  std::map<std::string, std::pair<double, double>> ranges;  // dataset -> (min, max) speedup
  int64_t done = 0;
  for (const auto& c : configs) {
    const std::string what = options.name + " " + short_model(c.model) + " " + c.dataset + " " +
                             kilo(c.max_doc_len) + " " + std::to_string(c.gpus) + " GPUs";
    report(progress, done, static_cast<int64_t>(configs.size()), what);
    DISTCA_ASSIGN_OR_RETURN(SimOptions o3, base_options(c.model, c.gpus, 1, table));
    const int64_t units = o3.cluster.units();

    Side wlb, cad;
    std::string label = rule;  // "-capped" when the search reached its ceiling at some PP degree
    for (int64_t pp : fourd ? pp_degrees(units, options.quick) : std::vector<int64_t>{1}) {
      DISTCA_ASSIGN_OR_RETURN(SimOptions o, base_options(c.model, c.gpus, pp, table));
      // 4D: m = 2p micro-batches (bubble (p-1)/(3p-1) < 1/3); batches / p iterations, so every
      // PP degree samples the same number of micro-batches. The batch rule sets the sequences
      // of one micro-batch at each PP degree (1F1B keeps up to p micro-batches in flight on
      // the first stage, so memory, not the rule's framing, decides how large it can be).
      Setting st;
      st.ups = units / pp;
      st.m = fourd ? 2 * pp : 1;
      st.iterations = fourd ? std::max<int64_t>(1, options.batches / pp) : options.batches;
      std::string pp_label;
      DISTCA_ASSIGN_OR_RETURN(const int64_t found, batch_sequences(rule, o, c, st, options.seed, pp_label));
      if (pp_label != rule) label = pp_label;
      // Nothing fits: one sequence, which WLB-ideal reports as out of memory.
      const int64_t seqs = std::max<int64_t>(1, found);
      DISTCA_ASSIGN_OR_RETURN(auto iters, draw_iterations(c, st, seqs, options.seed));
      DISTCA_ASSIGN_OR_RETURN(RunStats sw, best_wlb(o, iters));
      double tol = 0;
      bool sl = false;
      DISTCA_ASSIGN_OR_RETURN(RunStats sc, best_cad(o, iters, fourd ? kCadTolerances4d : kCadTolerances, tol, sl));
      const int64_t tpu = seqs * c.max_doc_len / st.ups;
      if (!wlb.have || better(sw, wlb.s)) wlb = Side{std::move(sw), pp, st.m, seqs, tpu, 0, false, true};
      if (!cad.have || better(sc, cad.s)) cad = Side{std::move(sc), pp, st.m, seqs, tpu, tol, sl, true};
    }
    // A configuration that does not fit has no throughput to compare (the paper reports none).
    const bool fit = !wlb.s.oom && !cad.s.oom;
    const double speedup = fit ? ratio(cad.s.tokens_per_second, wlb.s.tokens_per_second) : std::nan("");
    // The per-iteration throughput ratio, iteration i of each side: the same sampled batch
    // when both chose the same PP degree (always in 3D), else iteration i of each side's own.
    std::vector<double> per_iter;
    if (fit) {
      const auto a = per_iteration_throughput(cad.s), b = per_iteration_throughput(wlb.s);
      for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) per_iter.push_back(ratio(a[i], b[i]));
    }
    t.rows.push_back(compare_row(c, options, fourd, table != nullptr, units, label, wlb, cad, speedup, per_iter));
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

  const std::string body = compare_plot(fourd, options.name, t);
  DISTCA_RETURN_IF_ERROR(write_sweep_outputs(options, t, body, s));
  return s;
}

}  // namespace

Result<SweepSummary> run_fig9(const SweepOptions& options, const SweepProgressFn& progress,
                              const ProfiledCostModel* table) {
  return run_compare(options, progress, table, false);
}

Result<SweepSummary> run_fig10(const SweepOptions& options, const SweepProgressFn& progress,
                               const ProfiledCostModel* table) {
  return run_compare(options, progress, table, true);
}

}  // namespace distca::sim::detail
