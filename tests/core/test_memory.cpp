// core/memory.h: --max-memory sizes and the budget check every command runs before allocating.
#include "distca/core/memory.h"

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace distca {
namespace {

TEST(ByteSize, AcceptsBinaryUnits) {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"1048576", 1048576},         {"1", 1},
      {"512M", 512ull << 20},       {"8G", 8ull << 30},
      {"8g", 8ull << 30},           {"1.5GiB", 3ull << 29},
      {"2T", 2ull << 40},           {"4K", 4096},
      {"4KB", 4096},                {"4kib", 4096},
      {"100B", 100},                {"0.5K", 512},
  };
  for (const Case& c : cases) {
    auto r = parse_byte_size(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status().message();
    EXPECT_EQ(*r, c.bytes) << c.text;
  }
}

TEST(ByteSize, RefusesWithOneLineNamingTheFlag) {
  for (const char* text : {"", "G", "12Q", "-1", "0", "0.1", "1.2.3", ".", "1e3", "1 G", " 1G", "1GG", "nan",
                           "inf", "0x10", "1P", "99999999999T", "8Gi"}) {
    auto r = parse_byte_size(text);
    ASSERT_FALSE(r.ok()) << "'" << text << "' accepted as " << *r;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--max-memory"), std::string::npos) << r.status().message();
    std::string quoted = "'";  // (built in steps: GCC 12 warns falsely on "'" + std::string + "'")
    quoted.append(text).push_back('\'');
    EXPECT_NE(r.status().message().find(quoted), std::string::npos) << r.status().message();
  }
}

class MemoryLimitTest : public ::testing::Test {
 protected:
  void TearDown() override { set_memory_limit(0); }
};

TEST_F(MemoryLimitTest, OverrideDecidesAndIsNamed) {
  set_memory_limit(uint64_t{1} << 30);
  EXPECT_EQ(memory_limit_bytes(), uint64_t{1} << 30);
  EXPECT_TRUE(check_memory(double(uint64_t{1} << 30), "--ranks 8").ok());  // exactly the limit fits
  const Status s = check_memory(double(uint64_t{3} << 29), "--ranks 8192 --tokens-per-rank 16");
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(s.message().find("--ranks 8192 --tokens-per-rank 16"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1.5 GiB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--max-memory"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST_F(MemoryLimitTest, NonFiniteEstimateIsRefused) {
  set_memory_limit(uint64_t{1} << 40);
  EXPECT_FALSE(check_memory(std::nan(""), "--x").ok());
  EXPECT_FALSE(check_memory(HUGE_VAL, "--x").ok());
}

TEST_F(MemoryLimitTest, ZeroRestoresTheMachineLimit) {
  set_memory_limit(1024);
  set_memory_limit(0);
  const uint64_t available = available_memory_bytes();
  if (available == 0) GTEST_SKIP() << "no /proc/meminfo";
  // The machine's figure changes over time; the override must be gone, not equal to it.
  EXPECT_GT(memory_limit_bytes(), uint64_t{1024});
  EXPECT_TRUE(check_memory(1 << 20, "--small").ok());
}

TEST(FormatBytes, PicksTheUnit) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(12345678), "11.8 MiB");
  EXPECT_EQ(format_bytes(3.0 * (uint64_t{1} << 39)), "1.5 TiB");
}

TEST(MallocHugetlb, AppendsTheTunable) {
  EXPECT_EQ(with_malloc_hugetlb(""), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(with_malloc_hugetlb("glibc.malloc.check=3"), "glibc.malloc.check=3:glibc.malloc.hugetlb=1");
  EXPECT_EQ(with_malloc_hugetlb("glibc.malloc.check=3:"), "glibc.malloc.check=3:glibc.malloc.hugetlb=1");
  // A longer name that starts with the tunable's is another tunable.
  EXPECT_EQ(with_malloc_hugetlb("glibc.malloc.hugetlbx=0"), "glibc.malloc.hugetlbx=0:glibc.malloc.hugetlb=1");
}

TEST(MallocHugetlb, LeavesTheUsersChoice) {
  for (const char* t : {"glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=1", "glibc.malloc.hugetlb=2",
                        "glibc.malloc.check=3:glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=0:glibc.malloc.check=3"}) {
    EXPECT_EQ(with_malloc_hugetlb(t), std::nullopt) << t;
  }
}

// Sets GLIBC_TUNABLES for one test and restores what the process had.
class TunablesEnv {
 public:
  explicit TunablesEnv(const char* value) {
    if (const char* old = std::getenv("GLIBC_TUNABLES")) saved_ = old;
    if (value == nullptr) {
      ::unsetenv("GLIBC_TUNABLES");
    } else {
      ::setenv("GLIBC_TUNABLES", value, 1);
    }
  }
  ~TunablesEnv() {
    if (saved_) {
      ::setenv("GLIBC_TUNABLES", saved_->c_str(), 1);
    } else {
      ::unsetenv("GLIBC_TUNABLES");
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST(MallocHugetlb, ReadsTheEnvironment) {
  {
    TunablesEnv env(nullptr);
    EXPECT_EQ(malloc_hugetlb_tunable(), "");
    EXPECT_FALSE(malloc_on_huge_pages());
  }
  {
    TunablesEnv env("glibc.malloc.check=3:glibc.malloc.hugetlb=0");
    EXPECT_EQ(malloc_hugetlb_tunable(), "0");
    EXPECT_FALSE(malloc_on_huge_pages());
  }
  {
    TunablesEnv env("glibc.malloc.hugetlb=1");
    EXPECT_EQ(malloc_hugetlb_tunable(), "1");
    EXPECT_EQ(malloc_on_huge_pages(), transparent_huge_pages_available());
  }
}

}  // namespace
}  // namespace distca
