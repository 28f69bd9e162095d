// Device kernels that run the dispatcher's movement tables (row_tables.h) on device buffers:
// pack, unpack, assemble and scatter (DeviceCopy), and the ordered partial sums (DeviceGatherAdd).
// Built only with DISTCA_CUDA=ON (target distca_runtime_cuda). Their host references are
// apply_copy / apply_gather_add; the GPU tests require bitwise equality with them (copies are
// exact; the sums add in the table's order in fp32; the kernels are built with --fmad=false).
//
// A table is uploaded once per plan (upload) and run per layer (run); run only enqueues on the
// given stream. Buffers are device pointers laid out as the Window says; a run writes only the
// destination elements its table names.
//
// Errors: every CUDA call is checked (core/cuda_check.h: the call, file and line); a launch
// error is returned by run; a fault inside a kernel surfaces at the caller's next synchronising
// check.
//
// Thread safety: a table object is immutable after upload; runs on different streams may
// overlap as long as their destinations do not.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>

#include "distca/core/status.h"
#include "distca/runtime_cuda/movement.h"
#include "distca/runtime_cuda/row_tables.h"

namespace distca::runtime::device {

class DeviceCopy {
 public:
  DeviceCopy() = default;
  ~DeviceCopy();
  DeviceCopy(DeviceCopy&& o) noexcept;
  DeviceCopy& operator=(DeviceCopy&& o) noexcept;
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

  // Copies the table's (src, dst) row pairs to the device (synchronous: small, once per plan).
  static Result<DeviceCopy> upload(const CopyTable& t);
  int64_t rows() const { return rows_; }
  // dst(d, c) = src(s, c) for every pair and c < width, enqueued on `stream`.
  Status run(const float* src, const Window& sw, float* dst, const Window& dw, int64_t width,
             cudaStream_t stream) const;

 private:
  int64_t* pairs_ = nullptr;  // device: [2 * rows_] src0, dst0, src1, dst1, ...
  int64_t rows_ = 0;
};

class DeviceGatherAdd {
 public:
  DeviceGatherAdd() = default;
  ~DeviceGatherAdd();
  DeviceGatherAdd(DeviceGatherAdd&& o) noexcept;
  DeviceGatherAdd& operator=(DeviceGatherAdd&& o) noexcept;
  DeviceGatherAdd(const DeviceGatherAdd&) = delete;
  DeviceGatherAdd& operator=(const DeviceGatherAdd&) = delete;

  static Result<DeviceGatherAdd> upload(const GatherAdd& g);
  int64_t destinations() const { return n_dst_; }
  // For every destination d: dst(d, c) += src(s, c) over its sources in table order.
  Status run(const float* src, const Window& sw, float* dst, const Window& dw, int64_t width,
             cudaStream_t stream) const;

 private:
  int64_t* data_ = nullptr;  // device: dst [n_dst], offsets [n_dst + 1], src [n_src]
  int64_t n_dst_ = 0, n_src_ = 0;
};

// A RowMover on the device: each table is uploaded at its first use (cached by address: a
// table must outlive the mover and not change) and run on `stream`. Pointers are device memory.
class DeviceMover final : public RowMover {
 public:
  explicit DeviceMover(cudaStream_t stream) : stream_(stream) {}
  Status copy(const CopyTable& t, const float* src, const Window& sw, float* dst, const Window& dw,
              int64_t width) override;
  Status gather_add(const GatherAdd& g, const float* src, const Window& sw, float* dst, const Window& dw,
                    int64_t width) override;
  int64_t uploads() const { return static_cast<int64_t>(copies_.size() + sums_.size()); }

 private:
  cudaStream_t stream_;
  std::map<const CopyTable*, DeviceCopy> copies_;
  std::map<const GatherAdd*, DeviceGatherAdd> sums_;
};

}  // namespace distca::runtime::device
