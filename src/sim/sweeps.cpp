// Sweep driver, output files (CSV, gnuplot script, SVG) and the fig4b model.
//
// fig4b is a self-contained FLOPs-only model rather than a run of the simulator's wlb
// strategy: the figure's point is the DP-straggler idle time that WLB-LLM's greedy leaves when
// documents cannot cross DP groups, and the framing that reproduces it
// (../shared/notes/simulator.md) trades CP for DP inside a fixed 8-unit cluster, which is a
// different question from "how long does one iteration of strategy X take".
#include "distca/sim/sweeps.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <system_error>

#include "distca/core/io.h"
#include "distca/core/specs.h"
#include "distca/cost/analytic.h"
#include "distca/data/workload.h"
#include "sweeps_internal.h"

extern char** environ;

namespace distca::sim {
namespace fs = std::filesystem;

namespace detail {

std::string CsvTable::render() const {
  std::string out;
  auto line = [&out](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      DISTCA_CHECK_MSG(cells[i].find_first_of(",\"\n") == std::string::npos,
                       "CSV cell needs quoting: " + cells[i]);
      if (i) out += ',';
      out += cells[i];
    }
    out += '\n';
  };
  line(columns);
  for (const auto& r : rows) {
    DISTCA_CHECK(r.size() == columns.size());
    line(r);
  }
  return out;
}

std::string fmt(double v, int digits) {
  if (std::isnan(v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string fmt_int(int64_t v) { return std::to_string(v); }

double percentile(std::vector<double> v, double q) {
  DISTCA_CHECK(!v.empty() && q >= 0 && q <= 1);
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

void report(const SweepProgressFn& fn, int64_t done, int64_t total, const std::string& what) {
  if (fn) fn(SweepProgress{done, total, what});
}

namespace {

// The first executable `gnuplot` on PATH, or "".
std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  if (!path) return "";
  std::string p = path;
  size_t start = 0;
  while (start <= p.size()) {
    const size_t end = std::min(p.find(':', start), p.size());
    // An empty PATH entry means the current directory.
    const fs::path dir = end > start ? fs::path(p.substr(start, end - start)) : fs::path(".");
    const fs::path cand = dir / "gnuplot";
    std::error_code ec;
    if (::access(cand.c_str(), X_OK) == 0 && fs::is_regular_file(cand, ec)) return cand.string();
    start = end + 1;
  }
  return "";
}

// Runs gnuplot on `script` with working directory `dir`, writing `outfile` (a name inside
// dir). Output and errors of gnuplot go to /dev/null (libraries never print). Returns "" on
// success, else one line why the plot was skipped.
std::string run_gnuplot(const std::string& exe, const std::string& dir, const std::string& script,
                        const std::string& outfile) {
  // gnuplot's single-quoted strings cannot hold a single quote.
  if (dir.find('\'') != std::string::npos || outfile.find('\'') != std::string::npos)
    return "the output directory name contains a single quote";
  const std::string setup = "cd '" + dir + "'; outfile='" + outfile + "'";
  std::vector<std::string> args = {exe, "-e", setup, script};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  if (posix_spawn_file_actions_init(&actions) != 0) return "cannot start gnuplot";
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return "cannot start gnuplot";
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return "lost track of gnuplot";
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "gnuplot failed (exit " +
           std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")";
  return "";
}

}  // namespace

Status write_sweep_outputs(const SweepOptions& options, const CsvTable& table,
                           const std::string& gnuplot_body, SweepSummary& summary) {
  const fs::path dir = fs::absolute(options.out_dir).lexically_normal();
  const std::string csv = (dir / (options.name + ".csv")).string();
  const std::string gp = (dir / (options.name + ".gp")).string();
  const std::string svg = (dir / (options.name + ".svg")).string();
  DISTCA_RETURN_IF_ERROR(write_file_atomic(csv, table.render()));
  summary.csv_paths.push_back(csv);

  std::string script;
  script += "# " + options.name + ": generated by `distca simulate --sweep " + options.name +
            "`; redraw with `cd DIR && gnuplot " + options.name + ".gp`.\n";
  script += "if (!exists(\"outfile\")) outfile = '" + options.name + ".svg'\n";
  script += "set terminal svg size 1100,650 dynamic enhanced font 'Helvetica,13' background rgb 'white'\n";
  script += "set output outfile\n";
  script += "set datafile separator comma\n";
  script += "set grid\n";
  script += gnuplot_body;
  if (script.back() != '\n') script += '\n';
  script += "unset output\n";
  DISTCA_RETURN_IF_ERROR(write_file_atomic(gp, script));
  summary.script_paths.push_back(gp);

  if (!options.plot) {
    summary.plot_note = "--no-plot";
    return {};
  }
  const std::string exe = find_gnuplot();
  if (exe.empty()) {
    summary.plot_note = "gnuplot not found on PATH (run the .gp script later)";
    return {};
  }
  // Draw into a temporary name, then rename: the plot appears whole or not at all.
  const std::string tmp_name = "." + options.name + ".svg.tmp." + std::to_string(::getpid());
  const std::string note = run_gnuplot(exe, dir.string(), gp, tmp_name);
  const fs::path tmp = dir / tmp_name;
  std::error_code ec;
  if (!note.empty() || !fs::is_regular_file(tmp, ec) || fs::file_size(tmp, ec) == 0) {
    fs::remove(tmp, ec);
    summary.plot_note = note.empty() ? "gnuplot wrote nothing" : note;
    return {};
  }
  fs::rename(tmp, svg, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return Status::io_error("cannot write '" + svg + "': " + ec.message());
  }
  summary.plot_paths.push_back(svg);
  return {};
}

}  // namespace detail

std::vector<std::string> sweep_names() { return {"fig4b", "fig9", "fig10", "fig11", "fig12"}; }

Status validate_sweep(const SweepOptions& options) {
  const auto names = sweep_names();
  if (std::find(names.begin(), names.end(), options.name) == names.end()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    return Status::invalid_argument("--sweep: unknown sweep '" + options.name + "' (expected one of " +
                                    list + ")");
  }
  if (options.batches < 1 || options.batches > 10000)
    return Status::invalid_argument("--batches must be in 1..10000 (got " +
                                    std::to_string(options.batches) + ")");
  if (!options.dist.empty()) {
    if (options.name != "fig4b")
      return Status::invalid_argument("--dist applies to --sweep fig4b only (the other sweeps draw their own)");
    WorkloadOptions wo;
    wo.dist = options.dist;
    DISTCA_RETURN_IF_ERROR(LengthDistribution::create(wo).status());
  }
  if (options.out_dir.empty()) return Status::invalid_argument("--out: an output directory is required");
  std::error_code ec;
  const fs::path out = options.out_dir;
  const auto st = fs::status(out, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st))
      return Status::invalid_argument("--out '" + options.out_dir + "' exists and is not a directory");
    if (::access(options.out_dir.c_str(), W_OK | X_OK) != 0)
      return Status::invalid_argument("--out '" + options.out_dir + "' is not writable");
    return {};
  }
  fs::path parent = fs::absolute(out, ec).lexically_normal().parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec))
    return Status::invalid_argument("--out '" + options.out_dir + "': parent directory '" +
                                    parent.string() + "' does not exist");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    return Status::invalid_argument("--out '" + options.out_dir + "': cannot create it in '" +
                                    parent.string() + "' (not writable)");
  return {};
}

// ---- fig4b -------------------------------------------------------------------------------

WlbGroups wlb_greedy_groups(const std::vector<int64_t>& lengths, int64_t groups, double token_cap,
                            double alpha, double beta) {
  DISTCA_CHECK(groups >= 1 && token_cap > 0 && alpha >= 0 && beta >= 0);
  const size_t n = lengths.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  // Longest first; stable so equal lengths keep their index order (determinism).
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  WlbGroups g;
  g.group_of.assign(n, -1);
  g.work.assign(static_cast<size_t>(groups), 0.0);
  g.tokens.assign(static_cast<size_t>(groups), 0);
  for (size_t i : order) {
    const int64_t len = lengths[i];
    DISTCA_CHECK(len > 0);
    int64_t best = -1, least = 0;
    for (int64_t k = 0; k < groups; ++k) {
      const auto ku = static_cast<size_t>(k);
      if (g.work[ku] < g.work[static_cast<size_t>(least)]) least = k;
      if (static_cast<double>(g.tokens[ku] + len) <= token_cap &&
          (best < 0 || g.work[ku] < g.work[static_cast<size_t>(best)]))
        best = k;
    }
    const int64_t k = best >= 0 ? best : least;
    const auto ku = static_cast<size_t>(k);
    const double l = static_cast<double>(len);
    g.group_of[i] = k;
    g.work[ku] += alpha * (l * (l + 1) / 2) + beta * l;
    g.tokens[ku] += len;
  }
  return g;
}

namespace {

constexpr int64_t kFig4bUnits = 8;            // node-units (TP=8 inside each: 64 GPUs)
constexpr int64_t kFig4bUnitTokens = 512 * 1024;

}  // namespace

Result<std::vector<Fig4bPoint>> fig4b_points(const Fig4bOptions& options) {
  if (options.dps.empty()) return Status::invalid_argument("dps: at least one DP degree is required");
  for (int64_t dp : options.dps)
    if (dp < 1 || kFig4bUnits % dp != 0)
      return Status::invalid_argument("dps: " + std::to_string(dp) + " does not divide 8");
  if (options.caps.empty()) return Status::invalid_argument("caps: at least one cap is required");
  for (double c : options.caps)
    if (!(c >= 1.0) || !std::isfinite(c))
      return Status::invalid_argument("caps: a token cap must be >= 1 (got " + detail::fmt(c, 3) + ")");
  if (options.batches < 1 || options.batches > 10000)
    return Status::invalid_argument("batches must be in 1..10000 (got " + std::to_string(options.batches) + ")");
  DISTCA_ASSIGN_OR_RETURN(const ModelSpec model, model_preset(options.model));

  // Work per causal pair (forward + backward attention) and per token (forward + backward
  // linear layers), per layer; the layer count cancels in every ratio reported.
  const double alpha = attention_forward_flops(model, 1.0) + attention_backward_flops(model, 1.0);
  const double beta = 3.0 * linear_forward_flops_per_token(model);

  WorkloadOptions wo;
  wo.dist = options.dist;
  wo.ranks = kFig4bUnits;
  wo.tokens_per_rank = kFig4bUnitTokens;
  wo.batches = options.batches;
  wo.seed = options.seed;
  DISTCA_ASSIGN_OR_RETURN(const std::vector<Batch> batches, make_batches(wo));

  // Documents of each batch: every piece is independent (a document cut at a unit boundary
  // becomes separate documents, as the data loader of the framing would see it).
  std::vector<std::vector<int64_t>> docs(batches.size());
  for (size_t b = 0; b < batches.size(); ++b)
    for (const auto& rank : batches[b].per_rank)
      for (const Piece& p : rank) docs[b].push_back(p.len);

  std::vector<Fig4bPoint> out;
  for (double cap : options.caps) {
    for (int64_t dp : options.dps) {
      Fig4bPoint pt;
      pt.dp = dp;
      pt.cp = kFig4bUnits / dp;
      pt.cap = cap;
      std::vector<double> idle, div, bound;
      double ndocs = 0;
      for (const auto& lens : docs) {
        const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
        const double group_cap = cap * static_cast<double>(total) / static_cast<double>(dp);
        const WlbGroups g = wlb_greedy_groups(lens, dp, group_cap, alpha / static_cast<double>(pt.cp),
                                              beta / static_cast<double>(pt.cp));
        const double wmax = *std::max_element(g.work.begin(), g.work.end());
        const double wsum = std::accumulate(g.work.begin(), g.work.end(), 0.0);
        const double wmean = wsum / static_cast<double>(dp);
        idle.push_back(wmax > 0 ? 1.0 - wmean / wmax : 0.0);
        const int64_t tmax = *std::max_element(g.tokens.begin(), g.tokens.end());
        div.push_back(static_cast<double>(tmax) * static_cast<double>(dp) / static_cast<double>(total));
        // Kept whole, the largest document alone bounds the busiest group from below.
        double biggest = 0;
        for (int64_t l : lens) {
          const double x = static_cast<double>(l);
          biggest = std::max(biggest, (alpha * x * (x + 1) / 2 + beta * x) / static_cast<double>(pt.cp));
        }
        bound.push_back(1.0 - wmean / std::max(wmean, biggest));
        ndocs += static_cast<double>(lens.size());
      }
      const double nb = static_cast<double>(docs.size());
      pt.idle_fraction = std::accumulate(idle.begin(), idle.end(), 0.0) / nb;
      pt.idle_p10 = detail::percentile(idle, 0.10);
      pt.idle_p90 = detail::percentile(idle, 0.90);
      pt.token_divergence = std::accumulate(div.begin(), div.end(), 0.0) / nb;
      pt.idle_whole_docs_bound = std::accumulate(bound.begin(), bound.end(), 0.0) / nb;
      pt.documents = ndocs / nb;
      out.push_back(pt);
    }
  }
  return out;
}

namespace {

// The paper's Figure 4b (idle fraction at 512K): only DP=4 and DP=8 are quoted.
double paper_fig4b(int64_t dp) {
  if (dp == 4) return 0.19;
  if (dp == 8) return 0.55;
  return std::nan("");
}

Result<SweepSummary> run_fig4b(const SweepOptions& options, const SweepProgressFn& progress) {
  Fig4bOptions fo;
  fo.batches = options.batches;
  fo.seed = options.seed;
  if (!options.dist.empty()) fo.dist = options.dist;
  if (options.quick) fo.dps = {2, 4, 8};
  detail::report(progress, 0, 1, "fig4b: WLB greedy over DP groups, 8 x 512K tokens");
  DISTCA_ASSIGN_OR_RETURN(const auto points, fig4b_points(fo));
  detail::report(progress, 1, 1, "fig4b done");

  detail::CsvTable t;
  t.columns = {"dp", "cp", "cap", "idle_fraction", "idle_p10", "idle_p90", "token_divergence",
               "idle_whole_docs_bound", "documents_per_batch", "batches", "paper_idle_fraction"};
  SweepSummary s;
  s.name = options.name;
  for (const auto& p : points) {
    t.rows.push_back({detail::fmt_int(p.dp), detail::fmt_int(p.cp), detail::fmt(p.cap, 2),
                      detail::fmt(p.idle_fraction), detail::fmt(p.idle_p10), detail::fmt(p.idle_p90),
                      detail::fmt(p.token_divergence), detail::fmt(p.idle_whole_docs_bound),
                      detail::fmt(p.documents, 2), detail::fmt_int(options.batches),
                      detail::fmt(paper_fig4b(p.dp), 2)});
    if (p.dp >= 2)
      s.headline.emplace_back("idle_fraction dp=" + std::to_string(p.dp) + " cap=" + detail::fmt(p.cap, 1),
                              p.idle_fraction);
  }
  const std::string body = R"GP(set title "Figure 4b: DP-straggler idle time of WLB variable-length chunking (8 x 512K tokens, DP x CP = 8)"
set xlabel "DP degree (CP = 8 / DP)"
set ylabel "idle fraction of GPU time (%)"
set logscale x 2
set xrange [0.8:10]
set yrange [0:100]
set key top left
plot 'fig4b.csv' skip 1 using 1:($3==1.0 ? 100*$4 : NaN):($3==1.0 ? 100*$5 : NaN):($3==1.0 ? 100*$6 : NaN) with yerrorlines lw 2 pt 7 title "ours, cap c = 1.0 (p10-p90 bars)", \
     '' skip 1 using 1:($3==1.2 ? 100*$4 : NaN) with linespoints lw 2 pt 5 title "ours, cap c = 1.2", \
     '' skip 1 using 1:($3==1.0 ? 100*$8 : NaN) with linespoints dt 2 pt 6 title "bound: documents kept whole (c = 1.0)", \
     '' skip 1 using 1:($3==1.0 ? 100*$11 : NaN) with points pt 9 ps 2 title "paper"
)GP";
  DISTCA_RETURN_IF_ERROR(detail::write_sweep_outputs(options, t, body, s));
  return s;
}

}  // namespace

Result<SweepSummary> run_sweep(const SweepOptions& options, const SweepProgressFn& progress) {
  DISTCA_RETURN_IF_ERROR(validate_sweep(options));
  std::error_code ec;
  if (!fs::exists(options.out_dir, ec)) {
    fs::create_directory(options.out_dir, ec);
    if (ec) return Status::io_error("--out '" + options.out_dir + "': cannot create it: " + ec.message());
  }
  if (options.name == "fig4b") return run_fig4b(options, progress);
  if (options.name == "fig9") return detail::run_fig9(options, progress);
  if (options.name == "fig10") return detail::run_fig10(options, progress);
  if (options.name == "fig11") return detail::run_fig11(options, progress);
  return detail::run_fig12(options, progress);
}

}  // namespace distca::sim
