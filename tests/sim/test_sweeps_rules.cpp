// Tests of fig9 / fig10's configuration rules and their spread columns: the memory-limit batch
// (the chosen batch fits WLB-ideal and one more sequence does not, by simulate()'s own OOM
// flag), the fixed rule, the p10/p50/p90 columns against per-iteration figures recomputed here
// with simulate() and percentiles computed here, the cost table (the H100 CSV when
// ../shared/data has it), and the refusals of --cost-table and --batch-rule.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distca/core/specs.h"
#include "distca/cost/options.h"
#include "distca/cost/profiled.h"
#include "distca/sim/simulator.h"
#include "distca/sim/sweeps.h"
#include "support/cli_fixture.h"

namespace fs = std::filesystem;
using distca::sim::SweepOptions;

namespace {

struct TempDir : distca::testing::TempDir {
  TempDir() : distca::testing::TempDir("sweeps_rules") {}
};
using distca::testing::slurp;

struct Csv {
  std::vector<std::map<std::string, std::string>> rows;
  double num(size_t r, const std::string& c) const {
    const auto it = rows.at(r).find(c);
    EXPECT_NE(it, rows.at(r).end()) << "no column " << c;
    return it == rows.at(r).end() || it->second.empty() ? std::nan("") : std::stod(it->second);
  }
  const std::string& str(size_t r, const std::string& c) const { return rows.at(r).at(c); }
};

Csv parse_csv(const std::string& text) {
  auto split = [](const std::string& line) {
    std::vector<std::string> out;
    std::string cell;
    for (char ch : line) {
      if (ch == ',') {
        out.push_back(cell);
        cell.clear();
      } else {
        cell += ch;
      }
    }
    out.push_back(cell);
    return out;
  };
  Csv csv;
  std::stringstream ss(text);
  std::string line;
  std::getline(ss, line);
  const auto cols = split(line);
  while (std::getline(ss, line)) {
    const auto cells = split(line);
    EXPECT_EQ(cells.size(), cols.size()) << line;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < cells.size() && i < cols.size(); ++i) row[cols[i]] = cells[i];
    csv.rows.push_back(row);
  }
  return csv;
}

Csv run_quick(const std::string& name, const fs::path& dir, int64_t batches, const std::string& rule = "",
              const std::string& table = "") {
  SweepOptions o;
  o.name = name;
  o.out_dir = dir.string();
  o.batches = batches;
  o.quick = true;
  o.batch_rule = rule;
  o.cost_table = table;
  auto r = distca::sim::run_sweep(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? parse_csv(slurp(r->csv_paths.at(0))) : Csv{};
}

// Percentile q of v by linear interpolation between order statistics (numpy's default),
// written out here rather than taken from the library.
double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto i = static_cast<size_t>(pos);
  if (i + 1 >= v.size()) return v.back();
  return v[i] + (v[i + 1] - v[i]) * (pos - static_cast<double>(i));
}

// The options a sweep row ran with: h200 nodes, `gpus` GPUs, PP `pp`.
distca::sim::SimOptions options(const std::string& model, int64_t gpus, int64_t pp,
                                const distca::ProfiledCostModel* table = nullptr) {
  distca::sim::SimOptions o;
  o.model = distca::model_preset(model).value();
  o.cluster = distca::sim::make_cluster("h200", gpus).value();
  o.cluster.pp = pp;
  o.attention_table = table;
  return o;
}

// Iterations of m micro-batches of `seqs` sequences of max_doc_len over `ups` units.
std::vector<std::vector<distca::Batch>> iterations(const std::string& dataset, int64_t max_doc_len, int64_t ups,
                                                   int64_t seqs, int64_t m, int64_t count) {
  auto mbs = distca::sim::sweep_microbatches(dataset, max_doc_len, ups, seqs * max_doc_len / ups, m * count, 42);
  EXPECT_TRUE(mbs.ok()) << mbs.status().to_string();
  std::vector<std::vector<distca::Batch>> out;
  if (!mbs.ok()) return out;
  for (int64_t i = 0; i < count; ++i)
    out.emplace_back(mbs->begin() + i * m, mbs->begin() + (i + 1) * m);
  return out;
}

// Per-iteration seconds of `o` (and whether any iteration is out of memory).
std::vector<double> seconds(const distca::sim::SimOptions& o, const std::vector<std::vector<distca::Batch>>& iters,
                            bool& oom) {
  std::vector<double> out;
  oom = false;
  for (const auto& it : iters) {
    auto r = distca::sim::simulate(o, it);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) return out;
    out.push_back(r->iteration_seconds);
    oom = oom || r->oom;
  }
  return out;
}

// Whether WLB-ideal fits at some CP degree on every iteration, by simulate()'s OOM flag.
bool wlb_fits(distca::sim::SimOptions o, const std::vector<std::vector<distca::Batch>>& iters) {
  for (int64_t c = 1; c <= o.cluster.units_per_stage(); c *= 2) {
    o.strategy = distca::sim::parse_strategy("wlb:" + std::to_string(c)).value();
    bool oom = false;
    seconds(o, iters, oom);
    if (!oom) return true;
  }
  return false;
}

}  // namespace

// The memory-limit rule (the default): the batch fits WLB-ideal, one more sequence does not.
TEST(SweepBatchRule, Fig9MemoryLimitFitsAndTheNextBatchDoesNot) {
  TempDir tmp;
  const Csv csv = run_quick("fig9", tmp.path, 2);
  ASSERT_EQ(csv.rows.size(), 2u);
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    const std::string dataset = csv.str(r, "dataset");
    EXPECT_EQ(csv.str(r, "batch_rule"), "memory-limit");
    const auto n = static_cast<int64_t>(csv.num(r, "sequences"));
    const auto L = static_cast<int64_t>(csv.num(r, "max_doc_len"));
    ASSERT_GE(n, 1);
    EXPECT_EQ(csv.num(r, "tokens_per_unit"), static_cast<double>(n * L / 8));
    const auto o = options("llama-8b", 64, 1);
    EXPECT_TRUE(wlb_fits(o, iterations(dataset, L, 8, n, 1, 2))) << dataset << " " << n;
    EXPECT_FALSE(wlb_fits(o, iterations(dataset, L, 8, n + 1, 1, 2))) << dataset << " " << n + 1;
    EXPECT_EQ(csv.num(r, "wlb_oom"), 0);
  }
}

// fig10: the same at the PP degree WLB-ideal chose (m = 2 PP micro-batches, batches / PP
// iterations).
TEST(SweepBatchRule, Fig10MemoryLimitPerPpDegree) {
  TempDir tmp;
  const int64_t batches = 2;
  const Csv csv = run_quick("fig10", tmp.path, batches);
  ASSERT_EQ(csv.rows.size(), 2u);
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    const auto pp = static_cast<int64_t>(csv.num(r, "wlb_pp"));
    const auto n = static_cast<int64_t>(csv.num(r, "wlb_sequences"));
    const auto L = static_cast<int64_t>(csv.num(r, "max_doc_len"));
    const int64_t count = std::max<int64_t>(1, batches / pp);
    EXPECT_EQ(csv.num(r, "wlb_microbatches"), static_cast<double>(2 * pp));
    EXPECT_EQ(csv.num(r, "wlb_tokens_per_unit"), static_cast<double>(n * L / (8 / pp)));
    const auto o = options("llama-8b", 64, pp);
    EXPECT_TRUE(wlb_fits(o, iterations(csv.str(r, "dataset"), L, 8 / pp, n, 2 * pp, count)));
    EXPECT_FALSE(wlb_fits(o, iterations(csv.str(r, "dataset"), L, 8 / pp, n + 1, 2 * pp, count)));
    // Both sides at the same PP degree ran the same batches.
    if (csv.num(r, "cad_pp") == csv.num(r, "wlb_pp")) {
      EXPECT_EQ(csv.num(r, "cad_sequences"), csv.num(r, "wlb_sequences"));
      EXPECT_EQ(csv.num(r, "speedup_same_batches"), 1);
    }
  }
}

// The fixed rule keeps the framing before the memory search: 512K tokens per node for 8B.
TEST(SweepBatchRule, FixedRuleKeepsTheFixedTokensPerNode) {
  TempDir tmp;
  const Csv csv = run_quick("fig9", tmp.path, 1, "fixed");
  ASSERT_EQ(csv.rows.size(), 2u);
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    EXPECT_EQ(csv.str(r, "batch_rule"), "fixed");
    EXPECT_EQ(csv.num(r, "tokens_per_unit"), 512.0 * 1024);
    EXPECT_EQ(csv.num(r, "sequences"), 32);
  }
}

// The spread columns: per-iteration seconds of each side at its chosen configuration,
// recomputed with simulate(), and their percentiles computed here.
TEST(SweepSpread, Fig9ColumnsArePercentilesOfTheRecomputedIterations) {
  TempDir tmp;
  const int64_t batches = 5;
  const Csv csv = run_quick("fig9", tmp.path, batches, "fixed");
  ASSERT_EQ(csv.rows.size(), 2u);
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    const std::string dataset = csv.str(r, "dataset");
    const auto iters = iterations(dataset, static_cast<int64_t>(csv.num(r, "max_doc_len")), 8,
                                  static_cast<int64_t>(csv.num(r, "sequences")), 1, batches);
    auto o = options("llama-8b", 64, 1);
    o.strategy = distca::sim::parse_strategy("wlb:" + std::to_string(static_cast<int64_t>(csv.num(r, "wlb_cp")))).value();
    bool oom = false;
    const auto w = seconds(o, iters, oom);
    o.strategy = distca::sim::parse_strategy("cad").value();
    o.tolerance = csv.num(r, "cad_tolerance");
    o.cad_stateless = csv.str(r, "cad_servers") == "stateless";
    const auto c = seconds(o, iters, oom);
    ASSERT_EQ(w.size(), static_cast<size_t>(batches));
    ASSERT_EQ(c.size(), static_cast<size_t>(batches));
    std::vector<double> sp;
    for (size_t i = 0; i < w.size(); ++i) sp.push_back(w[i] / c[i]);  // same tokens: time ratio
    const double tol = 6e-5;  // the CSV's 4 decimals
    for (const auto& [q, suffix] : std::vector<std::pair<double, std::string>>{{0.1, "_p10"}, {0.5, "_p50"}, {0.9, "_p90"}}) {
      EXPECT_NEAR(csv.num(r, "speedup" + suffix), pct(sp, q), tol) << dataset << suffix;
      EXPECT_NEAR(csv.num(r, "wlb_seconds" + suffix), pct(w, q), tol) << dataset << suffix;
      EXPECT_NEAR(csv.num(r, "cad_seconds" + suffix), pct(c, q), tol) << dataset << suffix;
    }
    // With five iterations the p50 is the middle one of the sorted list.
    std::vector<double> sorted = sp;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_NEAR(csv.num(r, "speedup_p50"), sorted[2], tol);
    EXPECT_LE(csv.num(r, "speedup_p10"), csv.num(r, "speedup_p90"));
  }
}

// fig11 and fig12 carry the spread of their ratios too: p50 within the p10-p90 band, and at
// tolerance 0 fig12's ratio to itself is 1 on every iteration.
TEST(SweepSpread, Fig11AndFig12RatioSpreads) {
  TempDir tmp;
  const Csv f11 = run_quick("fig11", tmp.path, 3);
  for (size_t r = 0; r < f11.rows.size(); ++r) {
    EXPECT_LE(f11.num(r, "single_stream_over_pingpong_p10"), f11.num(r, "single_stream_over_pingpong_p50"));
    EXPECT_LE(f11.num(r, "single_stream_over_pingpong_p50"), f11.num(r, "single_stream_over_pingpong_p90"));
  }
  const Csv f12 = run_quick("fig12", tmp.path, 3);
  for (size_t r = 0; r < f12.rows.size(); ++r) {
    if (f12.num(r, "tolerance") == 0) {
      for (const char* c : {"seconds_vs_tolerance_0_p10", "seconds_vs_tolerance_0_p50", "seconds_vs_tolerance_0_p90"})
        EXPECT_EQ(f12.num(r, c), 1.0) << c;
    }
    EXPECT_LE(f12.num(r, "cad_seconds_p10"), f12.num(r, "cad_seconds_p90"));
  }
}

// --cost-table: every configuration's attention from the table. With the public H100 CSV (when
// ../shared/data has it) the fig9 row's WLB-ideal time is simulate()'s with that table.
TEST(SweepCostTable, H100TableDrivesEveryConfiguration) {
  const std::string file = std::string(DISTCA_SHARED_DATA_DIR) + "/attn-time-h100.csv";
  if (!fs::exists(file)) GTEST_SKIP() << "no " << file << " (the H100 table is optional input)";
  TempDir tmp;
  const Csv analytic = run_quick("fig9", tmp.path, 2, "fixed");
  const Csv h100 = run_quick("fig9", tmp.path, 2, "fixed", file);
  ASSERT_EQ(h100.rows.size(), 2u);
  auto loaded = distca::load_cost_table_option(file);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const auto* table = dynamic_cast<const distca::ProfiledCostModel*>(loaded->get());
  ASSERT_NE(table, nullptr);
  for (size_t r = 0; r < h100.rows.size(); ++r) {
    EXPECT_EQ(h100.str(r, "attention"), "table");
    EXPECT_EQ(analytic.str(r, "attention"), "analytic");
    EXPECT_NE(h100.num(r, "wlb_seconds"), analytic.num(r, "wlb_seconds"));
    auto o = options("llama-8b", 64, 1, table);
    o.strategy = distca::sim::parse_strategy("wlb:" + std::to_string(static_cast<int64_t>(h100.num(r, "wlb_cp")))).value();
    bool oom = false;
    const auto w = seconds(o, iterations(h100.str(r, "dataset"), 128 * 1024, 8, 32, 1, 2), oom);
    ASSERT_EQ(w.size(), 2u);
    EXPECT_NEAR(h100.num(r, "wlb_seconds"), (w[0] + w[1]) / 2, 6e-5);
  }
  const Csv f12 = run_quick("fig12", tmp.path, 1, "", file);
  for (size_t r = 0; r < f12.rows.size(); ++r) EXPECT_EQ(f12.str(r, "attention"), "table");
}

TEST(SweepCostTable, RefusalsBeforeAnyWork) {
  TempDir tmp;
  SweepOptions o;
  o.name = "fig9";
  o.out_dir = (tmp.path / "out").string();
  o.cost_table = (tmp.path / "missing.csv").string();
  auto st = distca::sim::validate_sweep(o);
  EXPECT_EQ(st.code(), distca::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--cost-table"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("missing.csv"), std::string::npos) << st.message();
  o.cost_table.clear();
  o.batch_rule = "largest";
  st = distca::sim::validate_sweep(o);
  EXPECT_NE(st.message().find("--batch-rule"), std::string::npos) << st.message();
  o.name = "fig11";
  o.batch_rule = "fixed";
  EXPECT_NE(distca::sim::validate_sweep(o).message().find("--batch-rule"), std::string::npos);
  o.batch_rule.clear();
  o.name = "fig4b";
  o.cost_table = (tmp.path / "t.json").string();
  EXPECT_NE(distca::sim::validate_sweep(o).message().find("--cost-table"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp.path / "out"));
}

// Through the CLI: exit 2, one line naming the flag, nothing created.
TEST(SweepCostTable, CliRefusesMissingTableAndBadBatchRuleWithOneLine) {
  TempDir tmp;
  const fs::path out = tmp.path / "figs";
  for (const std::string& args :
       {std::string("--cost-table ") + (tmp.path / "nope.csv").string(), std::string("--batch-rule biggest"),
        std::string("--batch-rule")}) {
    const fs::path o = tmp.path / "o", e = tmp.path / "e";
    const std::string cmd = std::string(DISTCA_CLI) + " simulate --sweep fig9 --quick --no-plot --out " + out.string() +
                            " " + args + " >" + o.string() + " 2>" + e.string();
    const int rc = std::system(cmd.c_str());
    const std::string err = slurp(e);
    EXPECT_EQ(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 2) << args << ": " << err;
    const std::string flag = args.substr(0, args.find(' '));
    EXPECT_NE(err.find(flag), std::string::npos) << args << ": " << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << args << ": " << err;
    EXPECT_FALSE(fs::exists(out)) << args;
  }
  // --batch-rule without --sweep.
  const std::string cmd = std::string(DISTCA_CLI) + " simulate --gpus 64 --batch-rule fixed >/dev/null 2>" +
                          (tmp.path / "e2").string();
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 2);
  EXPECT_NE(slurp(tmp.path / "e2").find("--batch-rule"), std::string::npos);
}

// Both table formats, without ../shared: a CSV written here (forward times of a document of L
// tokens at 300 TFLOP/s with this head configuration) and the same table as `distca profile`
// JSON give the same fig12 rows, and a row is simulate()'s with that table.
TEST(SweepCostTable, CsvAndJsonTablesGiveTheSameRowsAsSimulate) {
  TempDir tmp;
  const fs::path csv = tmp.path / "t.csv", json = tmp.path / "t.json";
  {
    std::ofstream f(csv);
    f << "L,cp,tp,duration_per_doc\n";
    for (int64_t L = 1024; L <= (int64_t{1} << 20); L *= 4) {
      const double pairs = static_cast<double>(L) * static_cast<double>(L + 1) / 2;
      const double flops = 4.0 * 128 * 64 * pairs;  // the CSV's heads: 64 x 128
      f << L << ",1,1," << 1e3 * flops / 300e12 << "\n";
    }
  }
  auto loaded = distca::load_cost_table_option(csv.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const auto* table = dynamic_cast<const distca::ProfiledCostModel*>(loaded->get());
  ASSERT_NE(table, nullptr);
  std::ofstream(json) << distca::to_json(table->table()).dump();
  const Csv from_csv = run_quick("fig12", tmp.path / "a", 2, "", csv.string());
  const Csv from_json = run_quick("fig12", tmp.path / "b", 2, "", json.string());
  const Csv analytic = run_quick("fig12", tmp.path / "c", 2);
  ASSERT_EQ(from_csv.rows.size(), from_json.rows.size());
  ASSERT_FALSE(from_csv.rows.empty());
  for (size_t r = 0; r < from_csv.rows.size(); ++r) {
    EXPECT_EQ(from_csv.rows[r], from_json.rows[r]) << r;
    EXPECT_EQ(from_csv.str(r, "attention"), "table");
    EXPECT_NE(from_csv.num(r, "cad_seconds"), analytic.num(r, "cad_seconds")) << r;
  }
  // Row 0: 8B at tolerance 0, 128K tokens per node on 8 nodes.
  ASSERT_EQ(from_csv.str(0, "model"), "llama-8b");
  auto o = options("llama-8b", 64, 1, table);
  o.strategy = distca::sim::parse_strategy("cad").value();
  o.tolerance = from_csv.num(0, "tolerance");
  bool oom = false;
  const auto secs = seconds(o, iterations("pretrain", 128 * 1024, 8, 8, 1, 2), oom);
  ASSERT_EQ(secs.size(), 2u);
  EXPECT_NEAR(from_csv.num(0, "cad_seconds"), (secs[0] + secs[1]) / 2, 6e-5);
}
