// The accuracy criterion of the CUDA kernel tests (attention_check.h) and its same-precision
// baselines, on any machine: the CPU fast path (fp32 compute, outputs rounded) must meet it for
// every dtype, as a correct device kernel must, and an output off in one row must fail it. Built
// with the full configuration only: the CPU fast path needs OpenBLAS and OpenMP.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "attention_check.h"

namespace distca::kernels {
namespace {

using namespace check;  // NOLINT: Case, Outputs, check_case, kPack, ... (attention_check.h)

// The criterion and its same-precision baselines, exercised on any machine: the CPU fast path
// (fp32 compute, outputs rounded) must meet it for every dtype, as a correct device kernel must.
TEST(CudaAttentionCriterion, CpuFastPathMeetsIt) {
  check_case(kPack, DType::kBFloat16, run_cpu, 21);  // (the long pack once: the reference is slow)
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    check_case(kEdges, t, run_cpu, 22);
    check_case(kGqa, t, run_cpu, 23);
  }
}

// It can fail: an output off by a few units of bf16 in one row is caught.
Outputs run_cpu_one_row_off(AttentionProblem& pr, DType t) {
  Outputs out = run_cpu(pr, t);
  for (int c = 0; c < 128; ++c) out.o[5 * 4 * 128 + c] += 0.03f;  // row 5, head 0 of kPack
  return out;
}
TEST(CudaAttentionCriterion, CatchesAWrongRow) {
  EXPECT_NONFATAL_FAILURE(check_case(kPack, DType::kBFloat16, run_cpu_one_row_off, 24), "device error");
}

}  // namespace
}  // namespace distca::kernels
