// Tests of the sweep driver (options, files, gnuplot handling) and of fig4b's model: the WLB
// greedy against brute force, and the structural checks and target bands of
// ../shared/notes/simulator.md.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "distca/core/rng.h"
#include "distca/sim/sweeps.h"
#include "support/cli_fixture.h"

namespace fs = std::filesystem;
using distca::Rng;
using distca::sim::Fig4bOptions;
using distca::sim::Fig4bPoint;
using distca::sim::SweepOptions;

namespace {

struct TempDir : distca::testing::TempDir {
  TempDir() : distca::testing::TempDir("sweeps") {}
};
using distca::testing::slurp;

double doc_work(int64_t len, double alpha, double beta) {
  const double l = static_cast<double>(len);
  return alpha * l * (l + 1) / 2 + beta * l;
}

const Fig4bPoint& find(const std::vector<Fig4bPoint>& pts, int64_t dp, double cap) {
  for (const auto& p : pts)
    if (p.dp == dp && std::abs(p.cap - cap) < 1e-12) return p;
  ADD_FAILURE() << "no point dp=" << dp << " cap=" << cap;
  return pts.front();
}

// The sweep at many batches: batch-to-batch spread is about 10 points at DP=4 and 8, so 1000
// batches put the mean within about 0.3 points of its limit and the bands below stay meaningful.
const std::vector<Fig4bPoint>& many_batches() {
  static const std::vector<Fig4bPoint> pts = [] {
    Fig4bOptions o;
    o.batches = 1000;
    auto r = distca::sim::fig4b_points(o);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.value();
  }();
  return pts;
}

}  // namespace

// ---- the greedy ---------------------------------------------------------------------------

// Replays the greedy's rule step by step with brute force over groups, and checks the LPT bound
// against the brute-force optimum when the cap does not bind.
TEST(WlbGreedy, MatchesItsRuleAndTheLptBoundOnTinyCases) {
  Rng rng(7, 0);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng.uniform_int(7));
    const int64_t groups = 1 + static_cast<int64_t>(rng.uniform_int(3));
    std::vector<int64_t> lens(static_cast<size_t>(n));
    for (auto& l : lens) l = 1 + static_cast<int64_t>(rng.uniform_int(6));  // ties are common
    const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
    const bool capped = trial % 2 == 0;
    const double cap = capped ? rng.uniform(1.0, 1.3) * static_cast<double>(total) / static_cast<double>(groups)
                              : 1e18;
    const double alpha = rng.uniform(0.0, 2.0), beta = rng.uniform(0.0, 2.0);
    const auto g = distca::sim::wlb_greedy_groups(lens, groups, cap, alpha, beta);
    ASSERT_EQ(g.group_of.size(), lens.size());

    // Replay: longest first, ties by index; the chosen group must have the least work among
    // groups with room, lowest index on ties; with no room anywhere, the least-loaded group.
    std::vector<size_t> order(lens.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return lens[a] != lens[b] ? lens[a] > lens[b] : a < b;
    });
    std::vector<double> work(static_cast<size_t>(groups), 0.0);
    std::vector<int64_t> tok(static_cast<size_t>(groups), 0);
    for (size_t i : order) {
      int64_t want = -1;
      for (int64_t k = 0; k < groups; ++k) {
        const bool room = static_cast<double>(tok[k] + lens[i]) <= cap;
        if (room && (want < 0 || work[k] < work[want])) want = k;
      }
      if (want < 0) {
        want = 0;
        for (int64_t k = 1; k < groups; ++k)
          if (work[k] < work[want]) want = k;
      }
      ASSERT_EQ(g.group_of[i], want) << "trial " << trial << " doc " << i;
      work[want] += doc_work(lens[i], alpha, beta);
      tok[want] += lens[i];
    }
    for (int64_t k = 0; k < groups; ++k) {
      EXPECT_NEAR(g.work[k], work[k], 1e-9 * (1 + work[k]));
      EXPECT_EQ(g.tokens[k], tok[k]);
    }

    if (!capped) {
      // Brute-force optimum over all groups^n assignments.
      double best = 1e300;
      int64_t combos = 1;
      for (int64_t i = 0; i < n; ++i) combos *= groups;
      for (int64_t c = 0; c < combos; ++c) {
        std::vector<double> w(static_cast<size_t>(groups), 0.0);
        int64_t x = c;
        for (int64_t i = 0; i < n; ++i, x /= groups) w[x % groups] += doc_work(lens[i], alpha, beta);
        best = std::min(best, *std::max_element(w.begin(), w.end()));
      }
      const double got = *std::max_element(g.work.begin(), g.work.end());
      EXPECT_GE(got, best * (1 - 1e-12));
      // Graham: longest-processing-time-first is within 4/3 - 1/(3m) of optimal.
      EXPECT_LE(got, best * (4.0 / 3.0 - 1.0 / (3.0 * static_cast<double>(groups))) * (1 + 1e-12) + 1e-12)
          << "trial " << trial;
    }
  }
}

TEST(WlbGreedy, RespectsTheCapWhenEverythingFits) {
  // Eight documents of 4 into 2 groups with cap 16: exactly fills both.
  const std::vector<int64_t> lens(8, 4);
  const auto g = distca::sim::wlb_greedy_groups(lens, 2, 16.0, 1.0, 0.0);
  EXPECT_EQ(g.tokens[0], 16);
  EXPECT_EQ(g.tokens[1], 16);
  // A document longer than the cap still lands somewhere (the least-loaded group).
  const auto h = distca::sim::wlb_greedy_groups({10, 1}, 2, 5.0, 1.0, 0.0);
  EXPECT_EQ(h.group_of[0], 0);
  EXPECT_EQ(h.group_of[1], 1);
}

// ---- fig4b: structure and bands -----------------------------------------------------------

TEST(Fig4b, IdleRisesWithDpAndStaysNearTheWholeDocumentBound) {
  const auto& pts = many_batches();
  ASSERT_EQ(pts.size(), 8u);
  for (double cap : {1.0, 1.2}) {
    EXPECT_NEAR(find(pts, 1, cap).idle_fraction, 0.0, 1e-12);
    EXPECT_LT(find(pts, 1, cap).idle_fraction, find(pts, 2, cap).idle_fraction);
    EXPECT_LT(find(pts, 2, cap).idle_fraction, find(pts, 4, cap).idle_fraction);
    EXPECT_LT(find(pts, 4, cap).idle_fraction, find(pts, 8, cap).idle_fraction);
    for (int64_t dp : {1, 2, 4, 8}) {
      const auto& p = find(pts, dp, cap);
      EXPECT_EQ(p.cp * p.dp, 8);
      // The bound is a per-batch lower bound, so it holds for the averages too.
      EXPECT_LE(p.idle_whole_docs_bound, p.idle_fraction + 1e-12);
      EXPECT_LE(p.idle_p10, p.idle_fraction);
      EXPECT_GE(p.idle_p90, p.idle_fraction);
    }
  }
  const auto& d4 = find(pts, 4, 1.0);
  const auto& d8 = find(pts, 8, 1.0);
  EXPECT_GE(d8.idle_fraction, 2.5 * d4.idle_fraction);
  // At DP=8 a group's budget is one unit: the idle time comes from unsplittable documents.
  EXPECT_LE(d8.idle_fraction - d8.idle_whole_docs_bound, 0.03);
}

TEST(Fig4b, TokenDivergenceAtCap12MatchesThePapersFigure4a) {
  const auto& pts = many_batches();
  for (int64_t dp : {2, 4, 8}) {
    const auto& p = find(pts, dp, 1.2);
    EXPECT_GE(p.token_divergence, 1.05) << "dp " << dp;
    EXPECT_LE(p.token_divergence, 1.20 + 1e-9) << "dp " << dp;
  }
  EXPECT_NEAR(find(pts, 1, 1.2).token_divergence, 1.0, 1e-12);
}

TEST(Fig4b, LandsInThePapersBands) {
  const auto& pts = many_batches();
  EXPECT_LE(find(pts, 2, 1.0).idle_fraction, 0.05);
  EXPECT_NEAR(find(pts, 4, 1.0).idle_fraction, 0.19, 0.07);
  EXPECT_NEAR(find(pts, 8, 1.0).idle_fraction, 0.55, 0.08);
}

// One fig4b row by hand. fixed:393216 (384K documents, no recipe, no elongation) packed into
// 8 units of 512K: document and unit boundaries (k x 384K, j x 512K; shared at 1536K and
// 3072K) cut the 4M tokens into 16 pieces: five of 384K, six of 256K, five of 128K. At DP = 8
// (CP = 1, cap 512K per group) the greedy puts the 384K pieces on groups 0-4, two 256K pieces
// on each of groups 5-7 (the 384K groups have no room for them) and the 128K pieces on groups
// 0-4: every group holds 512K tokens, groups 0-4 work a (384K^2 + 128K^2)/2, groups 5-7
// a (2 x 256K^2)/2 (plus the equal beta x 512K). alpha and beta are the documented Llama-3-8B
// FLOPs (docs/simulation.md, fig4b).
TEST(Fig4b, OneRowByHand) {
  Fig4bOptions o;
  o.dist = "fixed:393216";
  o.batches = 1;
  o.dps = {1, 8};
  o.caps = {1.0};
  auto r = distca::sim::fig4b_points(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const double h = 4096, q = 32 * 128, kv = 8 * 128, ffn = 14336;
  const double alpha = 4.0 * 32 * 128 * 3.5;
  const double beta = 3.0 * 2 * h * (2 * q + 2 * kv + 3 * ffn);
  auto work = [&](double len) { return alpha * len * (len + 1) / 2 + beta * len; };
  const double K = 1024;
  const double wa = work(384 * K) + work(128 * K), wb = 2 * work(256 * K);
  const double mean = (5 * wa + 3 * wb) / 8;
  const Fig4bPoint& d8 = find(*r, 8, 1.0);
  EXPECT_EQ(d8.cp, 1);
  EXPECT_NEAR(d8.idle_fraction, 1 - mean / wa, 1e-12);
  EXPECT_NEAR(d8.token_divergence, 1.0, 1e-12);
  EXPECT_NEAR(d8.idle_whole_docs_bound, 1 - mean / std::max(mean, work(384 * K)), 1e-12);
  EXPECT_EQ(d8.documents, 16);
  EXPECT_NEAR(d8.idle_p10, d8.idle_fraction, 1e-12);  // one batch
  const Fig4bPoint& d1 = find(*r, 1, 1.0);
  EXPECT_EQ(d1.cp, 8);
  EXPECT_NEAR(d1.idle_fraction, 0.0, 1e-12);
  EXPECT_EQ(d1.documents, 16);
}

TEST(Fig4b, RefusesBadOptions) {
  Fig4bOptions o;
  o.dps = {3};
  EXPECT_NE(distca::sim::fig4b_points(o).status().message().find("dps"), std::string::npos);
  o = {};
  o.caps = {0.9};
  EXPECT_NE(distca::sim::fig4b_points(o).status().message().find("caps"), std::string::npos);
  o = {};
  o.batches = 0;
  EXPECT_NE(distca::sim::fig4b_points(o).status().message().find("batches"), std::string::npos);
  o = {};
  o.model = "llama-7000b";
  EXPECT_FALSE(distca::sim::fig4b_points(o).ok());
}

// ---- the driver ---------------------------------------------------------------------------

TEST(Sweeps, NamesAreTheFivePaperFigures) {
  EXPECT_EQ(distca::sim::sweep_names(),
            (std::vector<std::string>{"fig4b", "fig9", "fig10", "fig11", "fig12"}));
}

TEST(Sweeps, ValidateRefusesBadOptionsBeforeAnyWork) {
  TempDir tmp;
  SweepOptions o;
  o.name = "fig4b";
  o.out_dir = (tmp.path / "out").string();
  EXPECT_TRUE(distca::sim::validate_sweep(o).ok());

  SweepOptions bad = o;
  bad.name = "fig5";
  auto st = distca::sim::validate_sweep(bad);
  EXPECT_NE(st.message().find("--sweep"), std::string::npos) << st.message();
  EXPECT_FALSE(distca::sim::run_sweep(bad).ok());

  bad = o;
  bad.batches = 0;
  EXPECT_NE(distca::sim::validate_sweep(bad).message().find("--sweep-batches"), std::string::npos);
  bad.batches_flag = "--batches";  // what the CLI sets when the user typed --batches
  EXPECT_EQ(distca::sim::validate_sweep(bad).message().rfind("--batches ", 0), 0u);

  // An output file of the sweep that cannot be written: refused naming --out, before any work.
  bad = o;
  bad.out_dir = tmp.path.string();
  fs::create_directories(tmp.path / "fig9.csv");
  bad.name = "fig9";
  st = distca::sim::validate_sweep(bad);
  EXPECT_NE(st.message().find("--out"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("fig9.csv"), std::string::npos) << st.message();
  fs::remove(tmp.path / "fig9.csv");

  bad = o;
  bad.out_dir = "";
  EXPECT_NE(distca::sim::validate_sweep(bad).message().find("--out"), std::string::npos);

  // A file where the directory should be.
  const fs::path file = tmp.path / "a_file";
  std::ofstream(file) << "x";
  bad = o;
  bad.out_dir = file.string();
  st = distca::sim::validate_sweep(bad);
  EXPECT_NE(st.message().find("--out"), std::string::npos) << st.message();
  EXPECT_FALSE(distca::sim::run_sweep(bad).ok());
  EXPECT_EQ(slurp(file), "x");

  // A missing parent.
  bad = o;
  bad.out_dir = (tmp.path / "no" / "such" / "dir").string();
  st = distca::sim::validate_sweep(bad);
  EXPECT_NE(st.message().find("--out"), std::string::npos) << st.message();
  EXPECT_FALSE(distca::sim::run_sweep(bad).ok());
  EXPECT_FALSE(fs::exists(tmp.path / "no"));

  // Unwritable (root ignores permission bits, so only checked as another user).
  if (::geteuid() != 0) {
    const fs::path ro = tmp.path / "ro";
    fs::create_directory(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    bad = o;
    bad.out_dir = ro.string();
    EXPECT_NE(distca::sim::validate_sweep(bad).message().find("not writable"), std::string::npos);
    fs::permissions(ro, fs::perms::owner_all);
  }
  EXPECT_FALSE(fs::exists(o.out_dir));  // validation creates nothing
}

TEST(Sweeps, Fig4bWritesCsvScriptAndDeterministicBytes) {
  TempDir tmp;
  SweepOptions o;
  o.name = "fig4b";
  o.out_dir = (tmp.path / "a").string();  // created by run_sweep
  o.batches = 12;
  std::vector<distca::sim::SweepProgress> seen;
  auto r = distca::sim::run_sweep(o, [&](const distca::sim::SweepProgress& p) { seen.push_back(p); });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->csv_paths.size(), 1u);
  // The library writes the data and the script; drawing is the CLI's (SweepsCli below).
  ASSERT_EQ(r->svg_paths.size(), 1u);
  EXPECT_EQ(fs::path(r->svg_paths[0]).filename(), "fig4b.svg");
  EXPECT_FALSE(fs::exists(r->svg_paths[0]));
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().done, seen.back().total);

  const std::string csv = slurp(r->csv_paths[0]);
  const std::string header = csv.substr(0, csv.find('\n'));
  for (const char* col : {"dp", "cp", "cap", "idle_fraction", "idle_p10", "idle_p90", "token_divergence",
                          "idle_whole_docs_bound"})
    EXPECT_NE(header.find(col), std::string::npos) << col;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 9);  // header + 4 DP x 2 caps
  EXPECT_TRUE(fs::exists(r->script_paths.at(0)));
  EXPECT_FALSE(r->headline.empty());

  // The headline agrees with the CSV's model.
  Fig4bOptions fo;
  fo.batches = 12;
  auto pts = distca::sim::fig4b_points(fo);
  ASSERT_TRUE(pts.ok());
  EXPECT_NEAR(r->headline.front().second, find(*pts, 2, 1.0).idle_fraction, 1e-12);

  // Same options, same bytes; another seed, other bytes.
  SweepOptions again = o;
  again.out_dir = (tmp.path / "b").string();
  auto r2 = distca::sim::run_sweep(again);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(slurp(r2->csv_paths[0]), csv);
  again.out_dir = (tmp.path / "c").string();
  again.seed = 43;
  auto r3 = distca::sim::run_sweep(again);
  ASSERT_TRUE(r3.ok());
  EXPECT_NE(slurp(r3->csv_paths[0]), csv);

  // No temporary files left behind.
  for (const auto& e : fs::directory_iterator(o.out_dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// Cross-check on the reference corpus itself (the parametric fit replaces it by default): the
// same framing drawn from ../shared/data/doclens-pretrain.json must land in the same bands.
TEST(Fig4b, ReferenceCorpusLandsInTheSameBands) {
  const std::string file = std::string(DISTCA_SHARED_DATA_DIR) + "/doclens-pretrain.json";
  if (!fs::exists(file)) GTEST_SKIP() << "no " << file;
  Fig4bOptions o;
  o.batches = 1000;
  o.dist = "file:" + file;
  auto r = distca::sim::fig4b_points(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_LE(find(*r, 2, 1.0).idle_fraction, 0.05);
  EXPECT_NEAR(find(*r, 4, 1.0).idle_fraction, 0.19, 0.07);
  EXPECT_NEAR(find(*r, 8, 1.0).idle_fraction, 0.55, 0.08);
  // The fit and the corpus agree within a few points at every DP.
  for (int64_t dp : {2, 4, 8})
    EXPECT_NEAR(find(*r, dp, 1.0).idle_fraction, find(many_batches(), dp, 1.0).idle_fraction, 0.04) << dp;
}

TEST(Sweeps, DistIsForFig4bOnlyAndIsCheckedUpFront) {
  TempDir tmp;
  SweepOptions o;
  o.name = "fig9";
  o.out_dir = tmp.path.string();
  o.dist = "pretrain";
  auto st = distca::sim::validate_sweep(o);
  EXPECT_NE(st.message().find("--dist"), std::string::npos) << st.message();
  o.name = "fig4b";
  EXPECT_TRUE(distca::sim::validate_sweep(o).ok());
  o.dist = "file:" + (tmp.path / "missing.json").string();
  st = distca::sim::validate_sweep(o);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("missing.json"), std::string::npos) << st.message();
  o.dist = "zipf";
  EXPECT_NE(distca::sim::validate_sweep(o).message().find("--dist"), std::string::npos);
}

// ---- through the CLI ------------------------------------------------------------------------

namespace {

// Runs the distca CLI with `args` (after `env`, e.g. "PATH=/x", when given); returns the exit
// code, stdout and stderr in out/err.
int run_cli(const std::string& args, const fs::path& dir, std::string& out, std::string& err,
            const std::string& env = "") {
  const fs::path o = dir / "cli.out", e = dir / "cli.err";
  const std::string cmd = (env.empty() ? "" : env + " ") + std::string(DISTCA_CLI) + " " + args + " >" + o.string() +
                          " 2>" + e.string();
  const int rc = std::system(cmd.c_str());
  out = slurp(o);
  err = slurp(e);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST(SweepsCli, Fig4bWritesItsFilesAndBadOutIsRefusedWithOneLine) {
  TempDir tmp;
  const fs::path out_dir = tmp.path / "figs";
  std::string out, err;
  ASSERT_EQ(run_cli("simulate --sweep fig4b --out " + out_dir.string() + " --batches 5 --no-plot", tmp.path, out, err),
            0)
      << err;
  EXPECT_TRUE(fs::exists(out_dir / "fig4b.csv"));
  EXPECT_TRUE(fs::exists(out_dir / "fig4b.gp"));
  EXPECT_FALSE(fs::exists(out_dir / "fig4b.svg"));
  EXPECT_NE(out.find("fig4b.csv"), std::string::npos) << out;
  // The CSV is the library's, byte for byte.
  SweepOptions o;
  o.name = "fig4b";
  o.out_dir = (tmp.path / "lib").string();
  o.batches = 5;
  auto r = distca::sim::run_sweep(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(slurp(out_dir / "fig4b.csv"), slurp(r->csv_paths.at(0)));

  // --out naming a file: exit 2, one line naming --out, the file untouched.
  const fs::path file = tmp.path / "not_a_dir";
  std::ofstream(file) << "keep";
  EXPECT_EQ(run_cli("simulate --sweep fig4b --out " + file.string(), tmp.path, out, err), 2);
  EXPECT_NE(err.find("--out"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(slurp(file), "keep");
  // An unknown sweep: exit 2, nothing created.
  EXPECT_EQ(run_cli("simulate --sweep fig99 --out " + (tmp.path / "new").string(), tmp.path, out, err), 2);
  EXPECT_NE(err.find("--sweep"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(tmp.path / "new"));
}

// The CLI draws the plot: with gnuplot on PATH the SVG is written whole (no temporary file
// left); without it one line says the plot was skipped and the run succeeds (the CSV and the
// script are the product); a gnuplot that fails is an error (exit 1, one line naming it).
TEST(SweepsCli, PlotsWithGnuplotSaysWhenMissingAndFailsWhenGnuplotFails) {
  TempDir tmp;
  std::string out, err;
  const bool have_gnuplot = std::system("command -v gnuplot >/dev/null 2>&1") == 0;
  const fs::path drawn = tmp.path / "drawn";
  ASSERT_EQ(run_cli("simulate --sweep fig4b --sweep-batches 2 --out " + drawn.string(), tmp.path, out, err), 0) << err;
  if (have_gnuplot) {
    EXPECT_NE(slurp(drawn / "fig4b.svg").find("<svg"), std::string::npos);
    EXPECT_NE(out.find("wrote " + (drawn / "fig4b.svg").string()), std::string::npos) << out;
  } else {
    EXPECT_NE(out.find("plot skipped: gnuplot not found"), std::string::npos) << out;
  }
  for (const auto& e : fs::directory_iterator(drawn))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();

  // Missing: PATH without gnuplot.
  const fs::path bin = tmp.path / "bin";
  fs::create_directory(bin);
  const fs::path hidden = tmp.path / "hidden";
  ASSERT_EQ(run_cli("simulate --sweep fig4b --sweep-batches 2 --out " + hidden.string(), tmp.path, out, err,
                    "PATH=" + bin.string()),
            0)
      << err;
  EXPECT_NE(out.find("plot skipped: gnuplot not found on PATH"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(hidden / "fig4b.csv"));
  EXPECT_TRUE(fs::exists(hidden / "fig4b.gp"));
  EXPECT_FALSE(fs::exists(hidden / "fig4b.svg"));

  // Failing: a gnuplot that exits 3.
  std::ofstream(bin / "gnuplot") << "#!/bin/sh\nexit 3\n";
  fs::permissions(bin / "gnuplot", fs::perms::owner_all);
  const fs::path failed = tmp.path / "failed";
  EXPECT_EQ(run_cli("simulate --sweep fig4b --sweep-batches 2 --out " + failed.string(), tmp.path, out, err,
                    "PATH=" + bin.string()),
            1);
  EXPECT_NE(err.find("gnuplot failed"), std::string::npos) << err;
  EXPECT_NE(err.find("exit 3"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_TRUE(fs::exists(failed / "fig4b.csv"));
  EXPECT_FALSE(fs::exists(failed / "fig4b.svg"));
  for (const auto& e : fs::directory_iterator(failed))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

