// The CSV cost-table format (cost/profiled.h cost_table_from_csv): the forward-only and
// diagonal-only extension against closed forms, the refusals, and the H100 file of
// ../shared/data (skipped without it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "distca/cost/analytic.h"
#include "distca/cost/options.h"
#include "distca/cost/profiled.h"

namespace distca {
namespace {

// Forward+backward FLOPs of a (q, kv) task under the CSV's heads (64 x 128), computed here.
double csv_flops(int64_t q, int64_t kv) {
  const double pairs = static_cast<double>(q) * static_cast<double>(2 * kv - q + 1) / 2.0;
  return 3.5 * 4.0 * 128.0 * 64.0 * pairs;
}

// A row whose forward time gives forward+backward throughput `tput` at the diagonal (L, L), ms.
std::string row(int64_t len, double tput) {
  std::ostringstream s;
  s.precision(17);
  s << len << ",1,1," << csv_flops(len, len) / tput / 3.5 * 1e3 << "\n";
  return s.str();
}

TEST(CostCsv, ConstantThroughputGivesFlopsOverThroughputEverywhere) {
  const double T = 4e14;
  // Other cp / tp rows are read and ignored.
  const std::string text = "L,cp,tp,duration_per_doc\n" + row(1024, T) + row(2048, T) + "2048,2,1,9.5\n" +
                           row(4096, T) + "1024,1,2,0.01\n";
  auto t = cost_table_from_csv(text, "h.csv");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->q_lens, (std::vector<int64_t>{1024, 2048, 4096}));
  EXPECT_EQ(t->kv_lens, t->q_lens);
  EXPECT_EQ(t->n_heads, 64);
  EXPECT_EQ(t->n_kv_heads, 4);
  EXPECT_EQ(t->head_dim, 128);
  const ProfiledCostModel m(*t);
  for (auto [q, kv] : {std::pair<int64_t, int64_t>{1024, 1024}, {1024, 4096}, {2048, 4096}, {1500, 3000}, {4096, 4096}}) {
    EXPECT_NEAR(m.task_cost(q, kv), csv_flops(q, kv) / T, 1e-9 * csv_flops(q, kv) / T) << q << " " << kv;
  }
  // Forward-only: the diagonal's forward share is the measured forward.
  EXPECT_NEAR(t->seconds[1][1] / 3.5, csv_flops(2048, 2048) / T / 3.5, 1e-12);
}

TEST(CostCsv, OffDiagonalTakesTheThroughputOfTheEqualWorkDocument) {
  // Two rows, throughput T at 1024 and 4T at 4096: the point (1024, 4096) has the work of a
  // document of L_eq tokens, L_eq (L_eq + 1) / 2 = pairs, and takes the throughput interpolated
  // in log2 L at L_eq.
  const double T = 1e14;
  auto t = cost_table_from_csv("L,cp,tp,duration_per_doc\n" + row(4096, 4 * T) + row(1024, T), "h.csv");
  ASSERT_TRUE(t.ok()) << t.status().message();
  const double pairs = 1024.0 * (2 * 4096 - 1024 + 1) / 2.0;
  const double l_eq = (std::sqrt(8 * pairs + 1) - 1) / 2;
  const double w = (std::log2(l_eq) - 10.0) / 2.0;
  const double tput = (1 - w) * T + w * 4 * T;
  EXPECT_NEAR(t->seconds[0][1], csv_flops(1024, 4096) / tput, 1e-12 * csv_flops(1024, 4096) / tput);
  EXPECT_EQ(t->seconds[1][0], 0.0);  // q > kv: not a task
  const ProfiledCostModel m(*t);
  EXPECT_NEAR(m.task_cost(1024, 4096), csv_flops(1024, 4096) / tput, 1e-9 * csv_flops(1024, 4096) / tput);
}

TEST(CostCsv, RefusesMalformedInputNamingTheLine) {
  const std::string h = "L,cp,tp,duration_per_doc\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {"L,cp,tp\n1,1,1,1\n", "line 1: the header must be"},
      {h + "1024,1,1\n", "line 2: expected 4 fields"},
      {h + "1024,1,1,1,1\n", "line 2: expected 4 fields"},
      {h + "01024,1,1,1\n", "line 2: L must be an integer"},
      {h + "-5,1,1,1\n", "line 2: L must be an integer"},
      {h + "1024,0,1,1\n", "line 2: cp must be an integer"},
      {h + "1024,1,x,1\n", "line 2: tp must be an integer"},
      {h + "1024,1,1,nan\n", "line 2: duration_per_doc must be"},
      {h + "1024,1,1,inf\n", "line 2: duration_per_doc must be"},
      {h + "1024,1,1,1e999\n", "line 2: duration_per_doc must be"},
      {h + "1024,1,1,0\n", "line 2: duration_per_doc must be"},
      {h + "1024,1,1,0x10\n", "line 2: duration_per_doc must be"},
      {h + "1024,1,1,1\n\n1024,1,1,2\n", "line 4: duplicate row for L 1024, cp 1, tp 1"},
      {h + "1024,2,1,1\n", "no row with cp = 1 and tp = 1"},
  };
  for (const auto& [text, expect] : cases) {
    auto t = cost_table_from_csv(text, "h.csv");
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(t.status().message().rfind("h.csv: ", 0), 0u) << t.status().message();
    EXPECT_NE(t.status().message().find(expect), std::string::npos) << text << ": " << t.status().message();
  }
  // Windows line ends and a missing final newline are fine.
  EXPECT_TRUE(cost_table_from_csv("L,cp,tp,duration_per_doc\r\n1024,1,1,0.5\r\n2048,1,1,2", "h.csv").ok());
}

TEST(CostCsv, LoadCostTableReadsCsvByExtension) {
  const auto dir = std::filesystem::temp_directory_path() / ("distca_cost_csv_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "t.CSV").string();
  std::ofstream(path) << "L,cp,tp,duration_per_doc\n1024,1,1,0.5\n2048,1,1,2\n";
  auto m = load_cost_table_option(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_NEAR((*m)->task_cost(1024, 1024), 0.5e-3 * 3.5, 0.5e-3 * 3.5 * 0.11);  // saturated: within 10%
  std::ofstream(path) << "{}";
  auto bad = load_cost_table_option(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(CostCsv, H100TableMatchesItsRowsOnTheDiagonal) {
  const std::string path = std::string(DISTCA_SHARED_DATA_DIR) + "/attn-time-h100.csv";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " absent";
  auto m = load_cost_table_option(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  int checked = 0;
  while (std::getline(in, line)) {
    int64_t len = 0, cp = 0, tp = 0;
    double ms = 0;
    if (std::sscanf(line.c_str(), "%ld,%ld,%ld,%lf", &len, &cp, &tp, &ms) != 4 || cp != 1 || tp != 1) continue;
    // Forward share of the prediction: the measured forward, or up to 10% less where the
    // table is saturated (F / peak, saturation_fraction 0.9).
    const double fwd = (*m)->task_cost(len, len) / 3.5;
    EXPECT_LE(fwd, ms * 1e-3 * (1 + 1e-9)) << len;
    EXPECT_GE(fwd, ms * 1e-3 * 0.9 * (1 - 1e-9)) << len;
    ++checked;
  }
  EXPECT_EQ(checked, 11);
  // The README's example: 16K documents take 13.50 ms forward.
  EXPECT_NEAR((*m)->task_cost(16384, 16384) / 3.5, 13.50e-3, 13.50e-3 * 0.1);
}

}  // namespace
}  // namespace distca

namespace distca {
namespace {

// fuzz_cost_csv's crash-f6b036fd...: a row of L = 4693872412 made causal_pairs' int64 product
// L (L + 1) overflow (UB). Lengths up to 2^40 are allowed, so the table's FLOPs are counted in
// doubles; the same holds for JSON tables.
TEST(CostCsv, LengthsBeyondInt64PairsDoNotOverflow) {
  auto t = cost_table_from_csv("L,cp,tp,duration_per_doc\n1024,1,1,1.055\n4693872412,1,1,13\n", "h.csv");
  ASSERT_TRUE(t.ok()) << t.status().message();
  const double L = 4693872412.0;
  EXPECT_DOUBLE_EQ(t->task_flops(4693872412, 4693872412), 3.5 * 4 * 128 * 64 * (L * (L + 1) / 2));
  const ProfiledCostModel m(*t);
  const double c = m.task_cost(int64_t{1} << 33, int64_t{1} << 40);
  EXPECT_TRUE(std::isfinite(c) && c > 0);
}

}  // namespace
}  // namespace distca
