// Tests of fig9 .. fig12 (the sweeps that run the simulator), in --quick mode with few
// batches: CSV structure, the invariants each figure rests on, determinism, and each figure's
// rows against references computed here from docs/simulation-model.md's formulas (iteration
// time bounds, byte totals). No expected numbers are hard-coded: the paper's figures are
// compared in docs/simulation.md.
#include <unistd.h>

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

#include "distca/core/specs.h"
#include "distca/data/workload.h"
#include "distca/sim/simulator.h"
#include "distca/sim/sweeps.h"
#include "support/cli_fixture.h"

namespace fs = std::filesystem;
using distca::sim::SweepOptions;

namespace {

struct TempDir : distca::testing::TempDir {
  TempDir() : distca::testing::TempDir("sweeps_cmp") {}
};
using distca::testing::slurp;

// A parsed CSV: rows of column -> cell.
struct Csv {
  std::vector<std::string> columns;
  std::vector<std::map<std::string, std::string>> rows;
  double num(size_t r, const std::string& c) const {
    const std::string& s = rows.at(r).at(c);
    return s.empty() ? std::nan("") : std::stod(s);
  }
};

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

Csv parse_csv(const std::string& text) {
  Csv csv;
  std::stringstream ss(text);
  std::string line;
  std::getline(ss, line);
  csv.columns = split(line);
  while (std::getline(ss, line)) {
    const auto cells = split(line);
    EXPECT_EQ(cells.size(), csv.columns.size()) << line;
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < cells.size() && i < csv.columns.size(); ++i) row[csv.columns[i]] = cells[i];
    csv.rows.push_back(row);
  }
  return csv;
}

// Runs a quick sweep without plotting; returns the CSV text.
std::string run_quick(const std::string& name, const fs::path& dir, int64_t batches = 2) {
  SweepOptions o;
  o.name = name;
  o.out_dir = dir.string();
  o.batches = batches;
  o.quick = true;
  int64_t calls = 0;
  auto r = distca::sim::run_sweep(o, [&](const distca::sim::SweepProgress& p) {
    ++calls;
    EXPECT_LE(p.done, p.total);
  });
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return "";
  EXPECT_GT(calls, 0);
  EXPECT_EQ(r->csv_paths.size(), 1u);
  EXPECT_EQ(fs::path(r->csv_paths.at(0)).filename().string(), name + ".csv");
  EXPECT_TRUE(fs::exists(fs::path(dir) / (name + ".gp")));
  EXPECT_FALSE(r->headline.empty());
  return slurp(r->csv_paths.at(0));
}

void expect_columns(const Csv& csv, const std::vector<std::string>& want) {
  for (const auto& c : want)
    EXPECT_NE(std::find(csv.columns.begin(), csv.columns.end(), c), csv.columns.end()) << "missing column " << c;
}

bool is_pow2_divisor(double c, double n) {
  const auto ci = static_cast<int64_t>(c), ni = static_cast<int64_t>(n);
  return ci >= 1 && (ci & (ci - 1)) == 0 && ni % ci == 0;
}

// ---- independent references: docs/simulation-model.md's formulas, evaluated here ----------
//
// Nothing below calls the simulator or the planner: the rates, parameter count and gradient
// all-reduce are written out from the model document, and the work of a micro-batch is
// counted from its pieces (a piece of `len` rows at `offset` in its document attends
// len * offset + len (len + 1) / 2 causal pairs).
struct Reference {
  explicit Reference(const std::string& model_name) {
    m = distca::model_preset(model_name).value();
    hw = distca::hardware_preset("h200").value();
    const double h = static_cast<double>(m.hidden), q = static_cast<double>(m.q_dim()),
                 kv = static_cast<double>(m.kv_dim()), ffn = static_cast<double>(m.ffn),
                 vocab = static_cast<double>(m.vocab);
    const double unit_linear = G * hw.peak_flops * 0.5;     // --mfu 0.5
    const double unit_attention = G * hw.peak_flops * 0.5;  // --attention-efficiency 0.5
    linear_fwd = 2 * h * (2 * q + 2 * kv + 3 * ffn) / unit_linear;
    lm_head_fwd = 2 * h * vocab / unit_linear;
    attention_pair = 4.0 * static_cast<double>(m.head_dim * m.n_heads) * (1 + 2.5) / unit_attention;
    params = static_cast<double>(m.n_layers) * (h * (q + 2 * kv) + q * h + 3 * h * ffn + 2 * h) + vocab * h +
             vocab * h + h;
  }
  // Ring all-reduce of fp32 gradients over n units: bytes each unit sends, and seconds.
  double grad_bytes_per_unit(double n) const { return 2 * (n - 1) / n * params * 4; }
  double grad_seconds(double n) const {
    return grad_bytes_per_unit(n) / G / hw.inter_node_bw + 2 * (n - 1) * hw.inter_node_latency;
  }
  // A lower bound of one iteration of `mbs` on `units` units with PP degree `pp`: the busiest
  // unit does at least the mean work. pp = 1: the mean linear work (activation checkpointing:
  // backward 3x forward), LM head (backward 2x) and unpadded attention of every layer, then
  // the gradient all-reduce. pp > 1: the mean over stages of one stage's layers only.
  double iteration_lower_bound(const std::vector<distca::Batch>& mbs, int64_t units, int64_t pp) const {
    double tokens = 0, pairs = 0;
    for (const auto& b : mbs)
      for (const auto& rank : b.per_rank)
        for (const auto& piece : rank) {
          const auto len = static_cast<double>(piece.len), off = static_cast<double>(piece.offset);
          tokens += len;
          pairs += len * off + len * (len + 1) / 2;
        }
    const double per_unit_layer = (tokens * linear_fwd * 4 + pairs * attention_pair) / static_cast<double>(units / pp);
    if (pp > 1) return static_cast<double>(m.n_layers) / static_cast<double>(pp) * per_unit_layer;
    return static_cast<double>(m.n_layers) * per_unit_layer + tokens / static_cast<double>(units) * lm_head_fwd * 3 +
           grad_seconds(static_cast<double>(units));
  }
  // The mean over iterations (groups of `m` consecutive micro-batches) of the bound.
  double mean_lower_bound(const std::vector<distca::Batch>& mbs, size_t m, int64_t units, int64_t pp) const {
    double sum = 0;
    size_t n = 0;
    for (size_t i = 0; i + m <= mbs.size(); i += m, ++n)
      sum += iteration_lower_bound(std::vector<distca::Batch>(mbs.begin() + static_cast<std::ptrdiff_t>(i),
                                                              mbs.begin() + static_cast<std::ptrdiff_t>(i + m)),
                                   units, pp);
    return sum / static_cast<double>(n);
  }
  static constexpr double G = 8;  // h200 nodes
  distca::ModelSpec m;
  distca::HardwareSpec hw;
  double linear_fwd = 0, lm_head_fwd = 0, attention_pair = 0, params = 0;
};

// The micro-batches a comparison sweep row ran (sweep_microbatches, the documented workload).
// `tpu_column`: the row's tokens per unit (fig10: each side's own).
std::vector<distca::Batch> row_microbatches(const Csv& csv, size_t r, const std::string& dataset, int64_t units,
                                            int64_t count, const std::string& tpu_column = "tokens_per_unit") {
  auto mbs = distca::sim::sweep_microbatches(dataset, static_cast<int64_t>(csv.num(r, "max_doc_len")), units,
                                             static_cast<int64_t>(csv.num(r, tpu_column)), count, 42);
  EXPECT_TRUE(mbs.ok()) << mbs.status().to_string();
  return mbs.ok() ? std::move(mbs).value() : std::vector<distca::Batch>{};
}

}  // namespace

TEST(Fig9, QuickSweepHasTheColumnsAndConsistentSpeedups) {
  TempDir tmp;
  const std::string text = run_quick("fig9", tmp.path);
  const Csv csv = parse_csv(text);
  expect_columns(csv, {"model", "dataset", "max_doc_len", "gpus", "tokens_per_unit", "wlb_cp", "wlb_seconds",
                       "cad_servers", "cad_seconds", "speedup", "wlb_oom", "cad_oom"});
  ASSERT_EQ(csv.rows.size(), 2u);  // quick: 8B, 128K, 64 GPUs, both datasets
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    EXPECT_TRUE(is_pow2_divisor(csv.num(r, "wlb_cp"), csv.num(r, "units"))) << r;
    EXPECT_EQ(csv.num(r, "wlb_cp") * csv.num(r, "wlb_dp"), csv.num(r, "units"));
    EXPECT_GT(csv.num(r, "wlb_seconds"), 0);
    EXPECT_GT(csv.num(r, "cad_seconds"), 0);
    // Without PP both strategies process the same tokens: the throughput ratio is the
    // inverse ratio of iteration times.
    if (csv.num(r, "wlb_oom") == 0 && csv.num(r, "cad_oom") == 0) {
      EXPECT_NEAR(csv.num(r, "speedup"), csv.num(r, "wlb_seconds") / csv.num(r, "cad_seconds"),
                  2e-3 * csv.num(r, "speedup"));
    } else {
      EXPECT_TRUE(std::isnan(csv.num(r, "speedup")));
    }
  }
  // Same options, same bytes.
  TempDir again;
  EXPECT_EQ(run_quick("fig9", again.path), text);
}

TEST(Fig10, QuickSweepPicksAPpDegreeForEachStrategy) {
  TempDir tmp;
  const Csv csv = parse_csv(run_quick("fig10", tmp.path, 1));
  expect_columns(csv, {"wlb_pp", "cad_pp", "wlb_microbatches", "cad_microbatches", "speedup",
                       "wlb_tokens_per_second", "cad_tokens_per_second"});
  ASSERT_EQ(csv.rows.size(), 2u);
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    for (const char* s : {"wlb_pp", "cad_pp"}) {
      const double pp = csv.num(r, s);
      EXPECT_TRUE(pp == 1 || pp == 2) << s << " " << pp;
    }
    EXPECT_EQ(csv.num(r, "wlb_microbatches"), 2 * csv.num(r, "wlb_pp"));
    EXPECT_EQ(csv.num(r, "cad_microbatches"), 2 * csv.num(r, "cad_pp"));
    if (csv.num(r, "wlb_oom") == 0 && csv.num(r, "cad_oom") == 0) {
      EXPECT_NEAR(csv.num(r, "speedup"), csv.num(r, "cad_tokens_per_second") / csv.num(r, "wlb_tokens_per_second"),
                  2e-3 * csv.num(r, "speedup"));
    }
  }
}

TEST(Fig11, SignalIsNoSlowerThanPingPongWhichIsNoSlowerThanSingleStream) {
  TempDir tmp;
  const Csv csv = parse_csv(run_quick("fig11", tmp.path));
  expect_columns(csv, {"model", "gpus", "signal_seconds", "pingpong_seconds", "single_stream_seconds",
                       "single_stream_over_pingpong"});
  ASSERT_EQ(csv.rows.size(), 2u);
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    const double sig = csv.num(r, "signal_seconds"), pp = csv.num(r, "pingpong_seconds"),
                 ss = csv.num(r, "single_stream_seconds");
    EXPECT_GT(sig, 0);
    EXPECT_LE(sig, pp * (1 + 1e-3)) << r;
    EXPECT_LE(pp, ss * (1 + 1e-3)) << r;
    EXPECT_GE(csv.num(r, "single_stream_over_pingpong"), 1.0 - 1e-3);
    EXPECT_GT(csv.num(r, "ca_bytes_per_layer"), 0);
    EXPECT_GT(csv.num(r, "bytes_per_iteration"), csv.num(r, "ca_bytes_per_layer"));
  }
}

TEST(Fig12, BytesFallAsTheToleranceGrows) {
  TempDir tmp;
  const Csv csv = parse_csv(run_quick("fig12", tmp.path));
  expect_columns(csv, {"model", "tolerance", "cad_seconds", "ca_bytes_per_layer", "bytes_per_iteration",
                       "bytes_vs_tolerance_0", "load_max_over_mean"});
  ASSERT_EQ(csv.rows.size(), 6u);  // quick: 2 models x tolerance {0, 0.15, 0.3}
  for (size_t r = 0; r < csv.rows.size(); r += 3) {
    const std::string model = csv.rows[r].at("model");
    EXPECT_EQ(csv.num(r, "tolerance"), 0.0);
    EXPECT_NEAR(csv.num(r, "bytes_vs_tolerance_0"), 1.0, 1e-9);
    for (size_t k = r; k < r + 3; ++k) {
      EXPECT_EQ(csv.rows[k].at("model"), model);
      if (k > r) {
        EXPECT_GT(csv.num(k, "tolerance"), csv.num(k - 1, "tolerance"));
      }
      // The scheduler stops once every server is within tolerance x mean of the mean: the
      // worst plan's load ratio stays within 1 + tolerance (plus a hair for whole rows).
      EXPECT_GE(csv.num(k, "load_max_over_mean"), 1.0 - 1e-9);
      EXPECT_LE(csv.num(k, "load_max_over_mean"), 1.0 + csv.num(k, "tolerance") + 0.01) << model << " " << k;
    }
    // A looser tolerance stops the greedy earlier. It is not a prefix of the tighter run's
    // moves (so not strictly monotone step by step), but the loosest moves less than exact
    // balance and the middle one no more than it (1% slack).
    EXPECT_LE(csv.num(r + 1, "ca_bytes_per_layer"), csv.num(r, "ca_bytes_per_layer") * 1.01) << model;
    EXPECT_LT(csv.num(r + 2, "ca_bytes_per_layer"), csv.num(r, "ca_bytes_per_layer")) << model;
    // The relative column is that ratio, and the whole iteration's traffic (which adds the
    // gradient all-reduce and activations) is never below CAD's share of it.
    EXPECT_NEAR(csv.num(r + 2, "bytes_vs_tolerance_0"),
                csv.num(r + 2, "ca_bytes_per_layer") / csv.num(r, "ca_bytes_per_layer"), 1e-3);
  }
}

// ---- each sweep against the independent references ------------------------------------------

// fig9 (8B, 64 GPUs = 8 units, one micro-batch per iteration): no strategy beats the formulas'
// mean-work bound, and CAD, which balances attention to within its tolerance and hides most
// communication, lands close above it.
TEST(Fig9, IterationTimesAgainstTheFormulasBound) {
  TempDir tmp;
  const Csv csv = parse_csv(run_quick("fig9", tmp.path, 2));
  const Reference ref("llama-8b");
  ASSERT_EQ(csv.rows.size(), 2u);
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    const std::string dataset = csv.rows[r].at("dataset");
    const auto mbs = row_microbatches(csv, r, dataset, 8, 2);
    const double lb = ref.mean_lower_bound(mbs, 1, 8, 1);
    EXPECT_GE(csv.num(r, "cad_seconds"), lb * (1 - 1e-3)) << dataset;
    EXPECT_GE(csv.num(r, "wlb_seconds"), lb * (1 - 1e-3)) << dataset;
    // Above it: the tolerance's imbalance, tile padding and the exposed exchanges (1-2 %).
    EXPECT_LE(csv.num(r, "cad_seconds"), lb * (1 + csv.num(r, "cad_tolerance") + 0.05)) << dataset;
  }
}

// fig10 (4D): each strategy's chosen PP degree, m micro-batches per iteration.
TEST(Fig10, IterationTimesAgainstTheFormulasBound) {
  TempDir tmp;
  const Csv csv = parse_csv(run_quick("fig10", tmp.path, 1));
  const Reference ref("llama-8b");
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    const std::string dataset = csv.rows[r].at("dataset");
    for (const std::string s : {"wlb", "cad"}) {
      const auto pp = static_cast<int64_t>(csv.num(r, s + "_pp"));
      const auto m = static_cast<size_t>(csv.num(r, s + "_microbatches"));
      const auto mbs = row_microbatches(csv, r, dataset, 8 / pp, static_cast<int64_t>(m), s + "_tokens_per_unit");
      const double lb = ref.mean_lower_bound(mbs, m, 8, pp);
        EXPECT_GE(csv.num(r, s + "_seconds"), lb * (1 - 1e-3)) << dataset << " " << s;
      // Without PP (no bubble) CAD stays within its tolerance and a few % of it.
      if (s == "cad" && pp == 1) {
        EXPECT_LE(csv.num(r, "cad_seconds"), lb * (1 + csv.num(r, "cad_tolerance") + 0.05)) << dataset;
      }
    }
  }
}

// fig11 (8B and 34B, 64 GPUs, pretrain 128K).
TEST(Fig11, IterationTimesAndBytesAgainstTheFormulas) {
  TempDir tmp;
  const Csv csv = parse_csv(run_quick("fig11", tmp.path, 2));
  ASSERT_EQ(csv.rows.size(), 2u);
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    const Reference ref(csv.rows[r].at("model"));
    const auto mbs = row_microbatches(csv, r, "pretrain", 8, 2);
    const double lb = ref.mean_lower_bound(mbs, 1, 8, 1);
    // signal moves no bytes: above the bound only by the default tolerance (0.1), padding and
    // latency.
    EXPECT_GE(csv.num(r, "signal_seconds"), lb * (1 - 1e-3));
    EXPECT_LE(csv.num(r, "signal_seconds"), lb * (1 + 0.1 + 0.08));
    // Every byte of ping-pong's iteration is a CA-task byte (every layer) or the gradient
    // all-reduce's (8 units, the formula's parameter count).
    const double want = csv.num(r, "ca_bytes_per_layer") * static_cast<double>(ref.m.n_layers) +
                        8 * ref.grad_bytes_per_unit(8);
    EXPECT_NEAR(csv.num(r, "bytes_per_iteration"), want, 1e-9 * want) << csv.rows[r].at("model");
  }
}

// fig12: every tolerance row, time within the bound and its tolerance, bytes exactly.
TEST(Fig12, IterationTimesAndBytesAgainstTheFormulas) {
  TempDir tmp;
  const Csv csv = parse_csv(run_quick("fig12", tmp.path, 2));
  for (size_t r = 0; r < csv.rows.size(); ++r) {
    const Reference ref(csv.rows[r].at("model"));
    const auto mbs = row_microbatches(csv, r, "pretrain", 8, 2);
    const double lb = ref.mean_lower_bound(mbs, 1, 8, 1);
    const double tol = csv.num(r, "tolerance");
    EXPECT_GE(csv.num(r, "cad_seconds"), lb * (1 - 1e-3)) << r;
    EXPECT_LE(csv.num(r, "cad_seconds"), lb * (1 + tol + 0.08)) << r;
    const double want = csv.num(r, "ca_bytes_per_layer") * static_cast<double>(ref.m.n_layers) +
                        8 * ref.grad_bytes_per_unit(8);
    EXPECT_NEAR(csv.num(r, "bytes_per_iteration"), want, 1e-9 * want) << r;
  }
}

// ---- the workload and the selection of each strategy's best configuration -------------------

TEST(SweepWorkload, RecutsTheDataLayersSequencesIntoEqualUnits) {
  for (const std::string dataset : {"pretrain", "prolong"}) {
    for (int64_t tpu : {int64_t{64} * 1024, int64_t{512} * 1024}) {
      const int64_t L = 128 * 1024, units = 8;
      auto got = distca::sim::sweep_microbatches(dataset, L, units, tpu, 3, 42);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      // The reference: the data layer's own draw of units * tpu / L sequences of L tokens.
      distca::WorkloadOptions wo;
      wo.dist = dataset;
      wo.ranks = units * tpu / L;
      wo.tokens_per_rank = L;
      wo.max_doc_len = L;
      wo.batches = 3;
      wo.prolong_long_prob = 0.8;
      auto ref = distca::make_batches(wo);
      ASSERT_TRUE(ref.ok());
      ASSERT_EQ(got->size(), 3u);
      for (size_t b = 0; b < 3; ++b) {
        const distca::Batch& g = (*got)[b];
        ASSERT_TRUE(g.validate().ok()) << g.validate().to_string();
        ASSERT_EQ(g.ranks, units);
        for (int64_t r = 0; r < units; ++r) EXPECT_EQ(g.rank_tokens(r), tpu);
        // Same documents with the same lengths and tokens, in the same order.
        std::map<int64_t, std::pair<int64_t, int64_t>> gd, rd;  // doc -> (doc_len, tokens)
        std::vector<int64_t> gorder, rorder;
        for (const auto& rank : g.per_rank)
          for (const auto& p : rank) {
            if (gorder.empty() || gorder.back() != p.doc) gorder.push_back(p.doc);
            gd[p.doc].first = p.doc_len;
            gd[p.doc].second += p.len;
          }
        for (const auto& rank : (*ref)[b].per_rank)
          for (const auto& p : rank) {
            if (rorder.empty() || rorder.back() != p.doc) rorder.push_back(p.doc);
            rd[p.doc].first = p.doc_len;
            rd[p.doc].second += p.len;
          }
        EXPECT_EQ(gd, rd);
        EXPECT_EQ(gorder, rorder);
        for (const auto& [doc, v] : gd) EXPECT_LE(v.first, L) << doc;
      }
    }
  }
  EXPECT_FALSE(distca::sim::sweep_microbatches("pretrain", 128 * 1024, 8, 40 * 1024, 1, 42).ok());  // 2.5 sequences
  EXPECT_FALSE(distca::sim::sweep_microbatches("pretrain", 128 * 1024, 8, 64 * 1024 + 8, 1, 42).ok());
}

// fig9's WLB-ideal row must be the best CP degree, and its CAD row the best tolerance, over
// the same sampled iterations: recomputed here with simulate() directly.
TEST(Fig9, PicksTheBestCpDegreeAndTolerance) {
  TempDir tmp;
  const Csv csv = parse_csv(run_quick("fig9", tmp.path));
  ASSERT_FALSE(csv.rows.empty());
  const size_t r = 0;  // 8B, pretrain, 128K, 64 GPUs
  ASSERT_EQ(csv.rows[r].at("dataset"), "pretrain");
  auto mbs = distca::sim::sweep_microbatches("pretrain", static_cast<int64_t>(csv.num(r, "max_doc_len")),
                                             static_cast<int64_t>(csv.num(r, "units")),
                                             static_cast<int64_t>(csv.num(r, "tokens_per_unit")), 2, 42);
  ASSERT_TRUE(mbs.ok());
  distca::sim::SimOptions o;
  o.model = distca::model_preset("llama-8b").value();
  o.cluster = distca::sim::make_cluster("h200", 64).value();
  auto mean_seconds = [&](const distca::sim::SimOptions& opt, bool& oom) {
    double sum = 0;
    oom = false;
    for (const auto& b : *mbs) {
      auto res = distca::sim::simulate(opt, {b});
      EXPECT_TRUE(res.ok()) << res.status().to_string();
      sum += res->iteration_seconds;
      oom = oom || res->oom;
    }
    return sum / static_cast<double>(mbs->size());
  };
  double best = 1e300;
  int64_t best_cp = 0;
  for (int64_t cp : {1, 2, 4, 8}) {
    o.strategy = distca::sim::parse_strategy("wlb:" + std::to_string(cp)).value();
    bool oom = false;
    const double s = mean_seconds(o, oom);
    if (!oom && s < best) {
      best = s;
      best_cp = cp;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(csv.num(r, "wlb_cp")), best_cp);
  EXPECT_NEAR(csv.num(r, "wlb_seconds"), best, 1e-4 + 1e-6 * best);

  // CAD: at each tolerance servers that keep their inputs, else (out of memory) stateless ones.
  best = 1e300;
  double best_tol = -1;
  bool best_stateless = false;
  o.strategy = distca::sim::parse_strategy("cad").value();
  for (double tol : {0.0, 0.05, 0.1, 0.15}) {
    o.tolerance = tol;
    for (bool stateless : {false, true}) {
      o.cad_stateless = stateless;
      bool oom = false;
      const double s = mean_seconds(o, oom);
      if (!oom && s < best) {
        best = s;
        best_tol = tol;
        best_stateless = stateless;
      }
      if (!oom) break;
    }
  }
  EXPECT_NEAR(csv.num(r, "cad_tolerance"), best_tol, 1e-9);
  EXPECT_EQ(csv.rows[r].at("cad_servers"), best_stateless ? "stateless" : "keep");
  EXPECT_NEAR(csv.num(r, "cad_seconds"), best, 1e-4 + 1e-6 * best);
}

// Every sweep's gnuplot script draws (when gnuplot is installed), even with the few rows of
// --quick: a broken script would otherwise only show as a failed plot at a user's.
TEST(SweepsCompare, EveryScriptDrawsWhenGnuplotIsThere) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "no gnuplot on PATH";
  for (const std::string name : {"fig4b", "fig9", "fig10", "fig11", "fig12"}) {
    TempDir tmp;
    const std::string cmd = std::string(DISTCA_CLI) + " simulate --sweep " + name + " --quick --sweep-batches 1 --out " +
                            tmp.path.string() + " >" + (tmp.path / "out").string() + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << name << ": " << slurp(tmp.path / "out");
    EXPECT_NE(slurp(tmp.path / (name + ".svg")).find("<svg"), std::string::npos) << name;
  }
}
