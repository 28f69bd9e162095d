#include "distca/core/io.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace distca {
namespace {

namespace fs = std::filesystem;

class IoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("distca_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(IoTest, AtomicWriteReplacesAndLeavesNoTemporary) {
  const std::string path = (dir_ / "out.json").string();
  ASSERT_TRUE(write_file_atomic(path, "first").ok());
  ASSERT_TRUE(write_file_atomic(path, "second").ok());
  auto text = read_file(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "second");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST_F(IoTest, WriteIntoMissingDirectoryFailsCleanly) {
  const std::string path = (dir_ / "no" / "such" / "out.json").string();
  Status s = write_file_atomic(path, "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), std::string::npos);
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(IoTest, ReadJsonErrorsNameTheFile) {
  const std::string missing = (dir_ / "missing.json").string();
  auto r = read_json_file(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos);

  const std::string bad = (dir_ / "bad.json").string();
  ASSERT_TRUE(write_file_atomic(bad, "{\"a\": [1, 2,").ok());
  auto b = read_json_file(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(bad), std::string::npos);

  const std::string good = (dir_ / "good.json").string();
  ASSERT_TRUE(write_file_atomic(good, "{\"a\": [1, 2]}").ok());
  auto g = read_json_file(good);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)["a"][1], 2);
}

}  // namespace
}  // namespace distca
