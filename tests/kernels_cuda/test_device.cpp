// cuda_device_info() on any machine: a device with sane properties, or a clean "no CUDA device".
#include <gtest/gtest.h>

#include "distca/kernels_cuda/device.h"

namespace distca::kernels {
namespace {

TEST(CudaDevice, InfoOrNoDevice) {
  Result<CudaDeviceInfo> info = cuda_device_info();
  if (!info.ok()) {
    ASSERT_EQ(info.status().code(), StatusCode::kNotFound) << info.status().to_string();
    EXPECT_NE(info.status().message().find("no CUDA device"), std::string::npos);
    GTEST_SKIP() << info.status().message();
  }
  EXPECT_FALSE(info->name.empty());
  EXPECT_GE(info->sm_major, 8) << "the kernels need sm_80+ (built for " << info->name << ")";
  EXPECT_GT(info->sm_count, 0);
  EXPECT_GT(info->global_memory_bytes, 0);
}

}  // namespace
}  // namespace distca::kernels
