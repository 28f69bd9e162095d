// The batch memory estimates shared by the CLI and the Python module (data/batch_memory.h).
#include "distca/data/batch_memory.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "distca/core/memory.h"

namespace distca {
namespace {

TEST(BatchMemory, ShapeOfCountsRanksAndPiecesOfTheLargestBatch) {
  const Batch a{2, 32, {{{0, 0, 16, 16}, {1, 0, 16, 32}}, {{1, 16, 16, 32}}}};
  const Batch b{3, 16, {{{0, 0, 16, 16}}, {{1, 0, 16, 16}}, {{2, 0, 16, 16}}}};
  const BatchShape one = shape_of(a);
  EXPECT_EQ(one.batches, 1);
  EXPECT_EQ(one.ranks, 2);
  EXPECT_EQ(one.pieces, 3);
  const BatchShape both = shape_of(std::vector<Batch>{a, b});
  EXPECT_EQ(both.batches, 2);
  EXPECT_EQ(both.ranks, 3);
  EXPECT_EQ(both.pieces, 3);
  // 64 bytes per piece and per rank list per batch, 16 MiB for the process.
  EXPECT_EQ(batches_bytes(both), (16 << 20) + 2 * (64 * 3 + 64 * 3));
  EXPECT_EQ(batch_json_bytes(one), 1600 * 3 + 512 * 2);
}

// Estimated from the options: never fewer pieces than the draw makes.
TEST(BatchMemory, EstimatedShapeBoundsTheDraw) {
  WorkloadOptions o;
  o.dist = "fixed:48";
  o.ranks = 4;
  o.tokens_per_rank = 64;
  o.batches = 2;
  ASSERT_TRUE(o.validate().ok());
  const auto est = estimate_shape(o);
  ASSERT_TRUE(est.ok()) << est.status().message();
  const auto drawn = make_batches(o);
  ASSERT_TRUE(drawn.ok());
  const BatchShape real = shape_of(*drawn);
  EXPECT_EQ(est->batches, real.batches);
  EXPECT_EQ(est->ranks, real.ranks);
  EXPECT_GE(est->pieces, real.pieces);
}

TEST(BatchMemory, JsonFileMemoryIsSixteenBytesPerByte) {
  const std::string path = ::testing::TempDir() + "/batch_memory_test.json";
  std::ofstream(path) << std::string(4096, ' ') << "{}";
  set_memory_limit(16 * 4098);
  EXPECT_TRUE(check_json_file_memory(path, "--batch x").ok());
  set_memory_limit(16 * 4098 - 1);
  const Status st = check_json_file_memory(path, "--batch x");
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(st.message().rfind("--batch x needs about 64.0 KiB", 0), 0u) << st.message();
  set_memory_limit(0);
  EXPECT_TRUE(check_json_file_memory(path + ".missing", "--batch x").ok());  // its reader says why
  std::remove(path.c_str());
}

}  // namespace
}  // namespace distca
