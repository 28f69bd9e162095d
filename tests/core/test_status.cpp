#include "distca/core/status.h"

#include <gtest/gtest.h>

namespace distca {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return Status::invalid_argument("--x must be positive (got " + std::to_string(v) + ")");
  return v;
}

Result<int> doubled(int v) {
  DISTCA_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

Status check_both(int a, int b) {
  DISTCA_RETURN_IF_ERROR(parse_positive(a).status());
  DISTCA_RETURN_IF_ERROR(parse_positive(b).status());
  return {};
}

TEST(Status, OkAndError) {
  EXPECT_TRUE(Status().ok());
  EXPECT_EQ(Status().to_string(), "OK");
  Status s = Status::invalid_argument("--ranks must be positive");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "invalid argument: --ranks must be positive");
  EXPECT_EQ(s.with_context("workload").message(), "workload: --ranks must be positive");
  EXPECT_TRUE(Status().with_context("x").ok());
}

TEST(Result, PropagatesValuesAndErrors) {
  auto good = doubled(4);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 8);
  auto bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "--x must be positive (got -1)");
  EXPECT_TRUE(check_both(1, 2).ok());
  EXPECT_EQ(check_both(1, 0).message(), "--x must be positive (got 0)");
}

TEST(ResultDeathTest, ValueOfErrorFailsCheck) {
  auto bad = doubled(0);
  EXPECT_DEATH((void)bad.value(), "check failed at .*status.h");
}

}  // namespace
}  // namespace distca
