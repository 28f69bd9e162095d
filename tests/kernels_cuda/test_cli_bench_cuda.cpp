// `distca bench attention --device cuda`: refused with one line (exit 2) where it cannot run,
// its CUDA-only flags refused on the CPU path, and on a GPU a short run's JSON.
//
// The binary is DISTCA_CLI (the build's), or $DISTCA_CLI where set: scripts/gpu-check.sh runs a
// prebuilt bundle from another directory on the device machine.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cli_fixture.h"
#include "distca/kernels_cuda/device.h"

namespace distca::testing {
namespace {

class BenchAttentionCuda : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = std::make_unique<TempDir>("bench_cuda"); }

  CliRun run(const std::string& args, int timeout_s = 0) const {
    const char* env = std::getenv("DISTCA_CLI");
    const std::string cli = env != nullptr && *env != '\0' ? env : DISTCA_CLI;
    const fs::path out = dir_->path / "stdout", err = dir_->path / "stderr";
    const std::string prefix = timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : "";
    const std::string cmd = prefix + cli + " bench attention " + args + " >" + out.string() + " 2>" + err.string();
    const int st = std::system(cmd.c_str());
    CliRun r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }
  void expect_one_line_refusal(const std::string& args, const std::string& needle) const {
    const CliRun r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("distca: error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }

  std::unique_ptr<TempDir> dir_;
};

TEST_F(BenchAttentionCuda, CudaFlagsNeedDeviceCuda) {
  expect_one_line_refusal("--dtype fp16", "--device cuda only");
  expect_one_line_refusal("--kernel tiled", "--device cuda only");
  expect_one_line_refusal("--device cuda --kernel fast", "--kernel");
  expect_one_line_refusal("--device tpu", "--device");
}

TEST_F(BenchAttentionCuda, WithoutAGpuIsRefused) {
  if (kernels::cuda_device_info().ok()) GTEST_SKIP() << "a GPU is present";
  expect_one_line_refusal("--device cuda", "--device cuda: no CUDA device");
}

TEST_F(BenchAttentionCuda, ShapesTheKernelsRefuseAreRefusedFirst) {
  const auto dev = kernels::cuda_device_info();
  if (!dev.ok()) GTEST_SKIP() << "SKIPPED (no GPU): " << dev.status().message();
  expect_one_line_refusal("--device cuda --kernel tiled --dtype fp32", "--kernel tiled --dtype fp32");
  expect_one_line_refusal("--device cuda --head-dims 512", "head_dim 512");
  expect_one_line_refusal("--device cuda --heads 4096 --max-len 1048576", "device memory");
}

TEST_F(BenchAttentionCuda, ShortRunJson) {
  const auto dev = kernels::cuda_device_info();
  if (!dev.ok()) GTEST_SKIP() << "SKIPPED (no GPU): " << dev.status().message();
  const CliRun r = run("--device cuda --max-len 1024 --context 1024 --repeats 1 --heads 4 --kv-heads 2 --json", 120);
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("device"), "cuda");
  EXPECT_GT(j.at("cublas_gemm_tflops").get<double>(), 0);
  ASSERT_FALSE(j.at("cases").empty());
  for (const auto& c : j.at("cases")) {
    EXPECT_GT(c.at("forward_tflops").get<double>(), 0) << c.dump();
    EXPECT_GT(c.at("backward_tflops").get<double>(), 0) << c.dump();
    EXPECT_EQ(c.at("forward_kernel"), "tiled") << c.dump();
    EXPECT_EQ(c.at("backward_kernel"), "tiled") << c.dump();
  }
  EXPECT_TRUE(j.at("summary").contains("head_dim_128"));
}

}  // namespace
}  // namespace distca::testing
