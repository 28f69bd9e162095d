// Regression tests of the crashes the libFuzzer targets found (docs/development.md, "Fuzzing")
// in readers of the data and train layers. The reproducers also live in fuzz/corpus, which
// tests/fuzz replays.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "distca/data/workload.h"
#include "distca/train/checkpoint.h"

namespace distca {
namespace {

std::string write_temp(const std::string& name, const std::string& bytes) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// fuzz_length_file: a JSON length file holding a number beyond double range ("[133E362]")
// threw nlohmann's out_of_range out of LengthDistribution::create (only parse_error was
// caught). Now one line naming the flag and the file.
TEST(FuzzRegression, LengthFileNumberOutOfRangeIsRefused) {
  for (const std::string text : {"[133E362]", "[1333e0703[116", "[16, 1e999]"}) {
    const std::string path = write_temp("lengths_out_of_range.json", text);
    WorkloadOptions o;
    o.dist = "file:" + path;
    o.tokens_per_rank = 4096;
    Result<LengthDistribution> d = Status::internal("not run");
    ASSERT_NO_THROW(d = LengthDistribution::create(o)) << text;
    ASSERT_FALSE(d.ok()) << text;
    EXPECT_EQ(d.status().message().rfind("--dist file:" + path + ": ", 0), 0u) << d.status().message();
    EXPECT_EQ(d.status().message().find('\n'), std::string::npos);
  }
}

// A checkpoint with a valid checksum and the parameter count patched to `n`.
std::string checkpoint_with_count(int64_t n) {
  train::Checkpoint c;
  c.fingerprint = "model=tiny";
  c.step = 3;
  c.params = {1, 2};
  c.adam_m = {3, 4};
  c.adam_v = {5, 6};
  std::string b = train::serialize_checkpoint(c);
  const size_t at = 8 + 4 + 8 + c.fingerprint.size() + 8 + 8 + 8;  // magic, version, fp, step, seed, adam_step
  std::memcpy(b.data() + at, &n, 8);
  const uint64_t h = train::fnv1a64(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &h, 8);
  return b;
}

// Found by reading the reader while fixing fuzz_checkpoint's first crash: n * 4 wrapped to a
// small byte count for n >= 2^62, so a checksummed file passed the size check and the reader
// tried to allocate 2^62 floats (std::length_error). Now "truncated or malformed".
TEST(FuzzRegression, CheckpointParamCountThatWrapsIsCorrupt) {
  for (int64_t n : {int64_t{1} << 62, (int64_t{1} << 62) + 1, INT64_MAX, int64_t{3}, int64_t{-1}}) {
    Result<train::Checkpoint> c = Status::internal("not run");
    ASSERT_NO_THROW(c = train::parse_checkpoint(checkpoint_with_count(n), "--resume x.ckpt")) << n;
    ASSERT_FALSE(c.ok()) << n;
    EXPECT_EQ(c.status().message(), "--resume x.ckpt: truncated or malformed") << n;
  }
  EXPECT_TRUE(train::parse_checkpoint(checkpoint_with_count(2), "x").ok());
}

// fuzz_checkpoint: a checkpoint with no parameters passed a null pointer to memcpy (undefined
// behaviour, reported by UBSan; fuzz/corpus/fuzz_checkpoint/crash-zero-params-null-memcpy).
// It is a valid, empty checkpoint; the asan preset runs this test under UBSan.
TEST(FuzzRegression, CheckpointWithoutParametersRoundTrips) {
  train::Checkpoint c;
  c.fingerprint = "model=tiny ranks=1";
  c.seed = 7;
  const std::string b = train::serialize_checkpoint(c);
  auto back = train::parse_checkpoint(b, "x");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->params.empty() && back->adam_m.empty() && back->adam_v.empty());
  EXPECT_EQ(back->seed, 7u);
  EXPECT_EQ(train::serialize_checkpoint(*back), b);
}

}  // namespace
}  // namespace distca
