// The profiled cost model against synthetic tables whose answers are known in closed form.
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/cost/analytic.h"
#include "distca/cost/options.h"
#include "distca/cost/profiled.h"

namespace distca {
namespace {

// A table whose throughput at each grid point is tput(q, kv) (FLOP/s).
template <class F>
CostTable synthetic(const std::vector<int64_t>& qs, const std::vector<int64_t>& ks, F tput, double sat = 0.9) {
  CostTable t;
  t.n_heads = 2;
  t.n_kv_heads = 1;
  t.head_dim = 64;
  t.q_lens = qs;
  t.kv_lens = ks;
  t.saturation_fraction = sat;
  t.seconds.assign(qs.size(), std::vector<double>(ks.size(), 0.0));
  for (size_t i = 0; i < qs.size(); ++i) {
    for (size_t j = 0; j < ks.size(); ++j) {
      if (qs[i] <= ks[j]) t.seconds[i][j] = t.task_flops(qs[i], ks[j]) / tput(qs[i], ks[j]);
    }
  }
  return t;
}

const std::vector<int64_t> kGrid = {128, 256, 512, 1024, 2048};

TEST(ProfiledCost, TaskFlopsAreForwardPlusBackward) {
  CostTable t = synthetic(kGrid, kGrid, [](int64_t, int64_t) { return 1e9; });
  EXPECT_DOUBLE_EQ(t.task_flops(100, 300), 3.5 * 4 * 64 * 2 * static_cast<double>(task_pairs(100, 300)));
}

TEST(ProfiledCost, ConstantThroughputIsFlopsOverPeak) {
  const ProfiledCostModel m(synthetic(kGrid, kGrid, [](int64_t, int64_t) { return 5e10; }));
  EXPECT_EQ(m.unit(), "seconds");
  EXPECT_DOUBLE_EQ(m.peak_flops(), 5e10);
  EXPECT_EQ(m.task_cost(0, 0), 0.0);
  EXPECT_EQ(m.task_cost(0, 700), 0.0);
  for (auto [q, k] : {std::pair<int64_t, int64_t>{128, 128}, {200, 1500}, {1, 5}, {3000, 9000}, {700, 700}}) {
    EXPECT_NEAR(m.task_cost(q, k), m.table().task_flops(q, k) / 5e10, 1e-12 * m.task_cost(q, k) + 1e-18);
  }
}

// Throughput linear in (log2 q, log2 kv) and below saturation everywhere: bilinear
// interpolation in log coordinates reproduces it exactly between grid points.
TEST(ProfiledCost, BilinearInLogCoordinates) {
  auto f = [](double q, double k) { return 1e9 * (1 + 0.5 * std::log2(q / 128) + 0.25 * std::log2(k / 128)); };
  const ProfiledCostModel m(synthetic(kGrid, kGrid, [&](int64_t q, int64_t k) { return f(q, k); }, 1.0));
  for (auto [q, k] : {std::pair<int64_t, int64_t>{181, 1448}, {300, 600}, {128, 2000}, {700, 1900}}) {
    const double expect = m.table().task_flops(q, k) / f(static_cast<double>(q), static_cast<double>(k));
    EXPECT_NEAR(m.task_cost(q, k), expect, 1e-9 * expect) << q << " " << k;
  }
  // Grid points give back the measured seconds.
  EXPECT_NEAR(m.task_cost(256, 1024), m.table().seconds[1][3], 1e-12);
}

// Corners above the diagonal (q > kv) take the diagonal throughput of their column.
TEST(ProfiledCost, DiagonalCellsUseTheDiagonalThroughput) {
  auto f = [](int64_t q, int64_t k) { return 1e9 * static_cast<double>(q + 2 * k) / 128.0; };
  const ProfiledCostModel m(synthetic(kGrid, kGrid, f, 1.0));
  // (q, kv) = (300, 300): corners (256,256) (256,512) (512,256)->(256,256) (512,512).
  const double wq = std::log2(300.0 / 256), wk = wq;
  const double t00 = f(256, 256), t01 = f(256, 512), t10 = f(256, 256), t11 = f(512, 512);
  const double tput = (1 - wq) * ((1 - wk) * t00 + wk * t01) + wq * ((1 - wk) * t10 + wk * t11);
  EXPECT_NEAR(m.task_cost(300, 300), m.table().task_flops(300, 300) / tput, 1e-9 * m.task_cost(300, 300));
}

TEST(ProfiledCost, SaturatedRegionAndBeyondGridUsePeak) {
  // Throughput grows with q and saturates at 1e11 from q >= 512.
  auto f = [](int64_t q, int64_t) { return q >= 512 ? 1e11 : 1e11 * static_cast<double>(q) / 512.0; };
  const ProfiledCostModel m(synthetic(kGrid, kGrid, f, 0.95));
  EXPECT_DOUBLE_EQ(m.peak_flops(), 1e11);
  EXPECT_DOUBLE_EQ(m.task_cost(700, 1500), m.table().task_flops(700, 1500) / 1e11);
  EXPECT_DOUBLE_EQ(m.task_cost(4096, 65536), m.table().task_flops(4096, 65536) / 1e11);  // past the grid
  // Unsaturated: slower than peak would predict, and a shard costs more per FLOP than a big task.
  EXPECT_GT(m.task_cost(128, 1024), m.table().task_flops(128, 1024) / 1e11 * 1.5);
  // Below the grid: the smallest grid throughput.
  EXPECT_NEAR(m.task_cost(10, 20), m.table().task_flops(10, 20) / f(128, 128), 1e-15);
}

TEST(ProfiledCost, JsonRoundTripAndLoad) {
  CostTable t = synthetic(kGrid, kGrid, [](int64_t q, int64_t k) { return 1e9 * (1.0 + q + k); }, 1.0);
  t.hardware = {{"cpu", "test"}, {"threads", 2}};
  const nlohmann::json j = to_json(t);
  EXPECT_TRUE(j["seconds"][4][0].is_null());  // q 2048 > kv 128
  auto back = cost_table_from_json(j, "t.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->q_lens, t.q_lens);
  EXPECT_EQ(back->seconds, t.seconds);

  const std::string path = testing::TempDir() + "/cost_table_test.json";
  ASSERT_TRUE(write_file_atomic(path, j.dump()).ok());
  auto model = load_cost_table_option(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ((*model)->unit(), "seconds");
  EXPECT_NEAR((*model)->task_cost(256, 512), t.seconds[1][2], 1e-12 * t.seconds[1][2]);  // a grid point
  std::remove(path.c_str());
}

TEST(ProfiledCost, RefusesBadTables) {
  const nlohmann::json good = to_json(synthetic(kGrid, kGrid, [](int64_t, int64_t) { return 1e9; }));
  auto expect_bad = [&](nlohmann::json j, const std::string& needle) {
    auto r = cost_table_from_json(j, "bad.json");
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("bad.json: ", 0), 0u);
  };
  auto j = good;
  j["format"] = "other";
  expect_bad(j, "format");
  j = good;
  j["q_lens"] = {128, 128, 512, 1024, 2048};
  expect_bad(j, "q_lens");
  j = good;
  j["seconds"][1][3] = -1.0;
  expect_bad(j, "seconds[1][3]");
  j = good;
  j["seconds"][2][2] = nullptr;
  expect_bad(j, "seconds[2][2]");
  j = good;
  j["seconds"].erase(0);
  expect_bad(j, "seconds");
  j = good;
  j.erase("head_dim");
  expect_bad(j, "head_dim");
  auto missing = load_cost_table_option("/nonexistent/table.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/table.json"), std::string::npos);
}

// Class 10 of issue 12: times outside [kMinTaskSeconds, kMaxTaskSeconds] (1e308 overflowed the
// planner's sums, a subnormal 1e-320 made a throughput infinite) were accepted and failed only
// later, inside plan validation. Now the load refuses them naming the file and the cell.
TEST(ProfiledCost, RefusesTimesOutsideTheDocumentedRange) {
  const nlohmann::json good = to_json(synthetic(kGrid, kGrid, [](int64_t, int64_t) { return 1e9; }));
  for (double bad : {1e308, 1e-320, 1e-300, 0.5e-9, 2e6, 0.0}) {
    auto j = good;
    j["seconds"][1][3] = bad;
    auto r = cost_table_from_json(j, "bad.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message().rfind("bad.json: seconds[1][3] must be a time in [1e-09, 1e+06] seconds", 0), 0u)
        << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  }
  // The bounds themselves are valid times.
  for (double ok : {kMinTaskSeconds, kMaxTaskSeconds}) {
    auto j = good;
    j["seconds"][1][3] = ok;
    EXPECT_TRUE(cost_table_from_json(j, "ok.json").ok()) << ok;
  }
  // Through the file reader the message names the path.
  auto j = good;
  j["seconds"][0][0] = 1e308;
  const std::string path = testing::TempDir() + "/cost_table_huge.json";
  ASSERT_TRUE(write_file_atomic(path, j.dump()).ok());
  auto m = load_cost_table_option(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().rfind("--cost-table: " + path + ": seconds[0][0]", 0), 0u) << m.status().message();
  std::remove(path.c_str());
}

TEST(ProfiledCost, RefusesUnknownVersion) {
  const nlohmann::json good = to_json(synthetic(kGrid, kGrid, [](int64_t, int64_t) { return 1e9; }));
  EXPECT_EQ(good["version"], kCostTableVersion);
  for (const nlohmann::json& v : {nlohmann::json(2), nlohmann::json(0), nlohmann::json("1"), nlohmann::json(1.5),
                                  nlohmann::json(nullptr)}) {
    auto j = good;
    j["version"] = v;
    auto r = cost_table_from_json(j, "v.json");
    ASSERT_FALSE(r.ok()) << v.dump();
    EXPECT_EQ(r.status().message().rfind("v.json: \"version\" must be 1", 0), 0u) << r.status().message();
  }
  auto j = good;
  j.erase("version");
  EXPECT_FALSE(cost_table_from_json(j, "v.json").ok());
}

// Found by fuzz_cost_table: a non-string "format" threw nlohmann's type_error out of the
// reader (fuzz/corpus/fuzz_cost_table/crash-format-not-a-string). Every wrongly typed field
// is a one-line refusal.
TEST(ProfiledCost, WronglyTypedFieldsAreRefusedNotThrown) {
  const nlohmann::json good = to_json(synthetic(kGrid, kGrid, [](int64_t, int64_t) { return 1e9; }));
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"format", 1},           {"format", nlohmann::json::array()}, {"n_heads", "2"},
      {"n_heads", 2.5},        {"q_lens", 128},                     {"kv_lens", {"a"}},
      {"seconds", "x"},        {"seconds", {1, 2}},                 {"saturation_fraction", "0.9"},
      {"n_heads", 18446744073709551615ULL}};
  for (const auto& [key, value] : cases) {
    auto j = good;
    j[key] = value;
    Result<CostTable> r = Status::internal("not run");
    ASSERT_NO_THROW(r = cost_table_from_json(j, "t.json")) << key << "=" << value.dump();
    ASSERT_FALSE(r.ok()) << key << "=" << value.dump();
    EXPECT_EQ(r.status().message().rfind("t.json: ", 0), 0u);
    EXPECT_NE(r.status().message().find(key == "seconds" ? "seconds" : key), std::string::npos) << r.status().message();
  }
  auto j = good;
  j["seconds"][2][3] = "fast";
  auto r = cost_table_from_json(j, "t.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("seconds[2][3]"), std::string::npos) << r.status().message();
}

// Heads, dimensions and lengths are bounded so that FLOP counts and throughputs stay finite.
TEST(ProfiledCost, RefusesDimensionsBeyondTheBounds) {
  const nlohmann::json good = to_json(synthetic(kGrid, kGrid, [](int64_t, int64_t) { return 1e9; }));
  auto expect_bad = [](nlohmann::json j, const std::string& needle) {
    auto r = cost_table_from_json(j, "d.json");
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  auto j = good;
  j["n_heads"] = kMaxCostTableHeads * 2;
  expect_bad(j, "n_heads");
  j = good;
  j["head_dim"] = kMaxCostTableHeadDim + 1;
  expect_bad(j, "head_dim");
  j = good;
  j["kv_lens"][4] = kMaxCostTableLength * 2;
  expect_bad(j, "kv_lens[4]");
}

}  // namespace
}  // namespace distca
