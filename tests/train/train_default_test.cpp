// The embedded default run (`distca train` with no arguments) learns the copy task: the
// second-half loss starts near ln(512) = 6.24 (uniform over the model's vocabulary) and its
// final value (mean over the last tenth of the run) falls below kThreshold. Measured: about
// 0.3-0.5 nats (docs/training.md); below 1.0 needs every piece of attention to reach the right
// keys, and stays above ln(32) = 3.47 (the best loss without copying) otherwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

constexpr double kThreshold = 1.0;

TEST(TrainDefault, SecondHalfLossFallsBelowThreshold) {
  const auto metrics = std::filesystem::temp_directory_path() / "distca_train_default.jsonl";
  const std::string cmd = std::string(DISTCA_CLI) + " train --metrics " + metrics.string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  const auto pos = out.rfind("final loss: ");
  ASSERT_NE(pos, std::string::npos) << out;
  const double final_loss = std::stod(out.substr(pos + 12));
  std::ifstream in(metrics);
  std::string line;
  std::getline(in, line);
  const double first = nlohmann::json::parse(line)["report_loss"].get<double>();
  EXPECT_GT(first, 5.5);  // starts near ln(512)
  EXPECT_LT(final_loss, kThreshold) << out;
  std::filesystem::remove(metrics);
}

}  // namespace
