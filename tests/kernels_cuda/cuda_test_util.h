// Helpers of the CUDA kernel tests: host rounding to bf16/fp16, device buffers, and the skip
// every device test starts with.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "distca/kernels/attention.h"
#include "distca/kernels_cuda/device.h"

namespace distca::kernels::testing {

// GTEST_SKIP()s the calling test on a machine without a usable GPU, with the reason.
#define DISTCA_SKIP_WITHOUT_GPU()                                                        \
  do {                                                                                   \
    const auto distca_dev_ = ::distca::kernels::cuda_device_info();                      \
    if (!distca_dev_.ok()) GTEST_SKIP() << "SKIPPED (no GPU): " << distca_dev_.status().message(); \
  } while (0)

inline uint16_t float_to_bf16(float f) {  // round to nearest even; inputs are finite
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_fp16(float f) {
  const __half_raw r = __float2half_rn(f);
  return r.x;
}
inline float fp16_to_float(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}

// x rounded to dtype and back (identity for float32).
inline float round_to(DType t, float x) {
  switch (t) {
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(x));
    case DType::kFloat16: return fp16_to_float(float_to_fp16(x));
    case DType::kFloat32: break;
  }
  return x;
}
inline int dtype_bytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }
// The unit roundoff's double: the gap between 1 and the next value of the type.
inline double dtype_epsilon(DType t) {
  return t == DType::kBFloat16 ? 0x1p-7 : t == DType::kFloat16 ? 0x1p-10 : 0x1p-23;
}
inline const char* dtype_name(DType t) {
  return t == DType::kBFloat16 ? "bf16" : t == DType::kFloat16 ? "fp16" : "fp32";
}

// Host floats as the bytes of dtype.
inline std::vector<unsigned char> encode(DType t, const std::vector<float>& x) {
  std::vector<unsigned char> out(x.size() * dtype_bytes(t));
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const uint16_t b = t == DType::kBFloat16 ? float_to_bf16(x[i]) : float_to_fp16(x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}
inline std::vector<float> decode(DType t, const std::vector<unsigned char>& bytes) {
  const size_t n = bytes.size() / dtype_bytes(t);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kFloat32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      out[i] = t == DType::kBFloat16 ? bf16_to_float(b) : fp16_to_float(b);
    }
  }
  return out;
}

// A device allocation freed on destruction (tests only: failures are test failures).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&p_, bytes), cudaSuccess) << "cudaMalloc " << bytes;
    }
  }
  ~DeviceBuffer() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }

  void* get() const { return p_; }
  void upload(const void* host) {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(p_, host, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> h(bytes_);
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(h.data(), p_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return h;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace distca::kernels::testing
