// Device movement tables (include/distca/runtime_cuda/pack.h): ownership and checked launches.
#include "distca/runtime_cuda/pack.h"

#include <utility>
#include <vector>

#include "distca/core/cuda_check.h"
#include "pack_kernels.h"

namespace distca::runtime::device {
namespace {

Result<int64_t*> to_device(const std::vector<int64_t>& host) {
  if (host.empty()) return static_cast<int64_t*>(nullptr);
  void* p = nullptr;
  DISTCA_CUDA_CHECK(cudaMalloc(&p, host.size() * sizeof(int64_t)));
  const cudaError_t e = cudaMemcpy(p, host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    (void)cudaFree(p);
    return cuda_error_status(e, "cudaMemcpy(table)", __FILE__, __LINE__);
  }
  return static_cast<int64_t*>(p);
}

}  // namespace

DeviceCopy::~DeviceCopy() {
  if (pairs_) (void)cudaFree(pairs_);
}
DeviceCopy::DeviceCopy(DeviceCopy&& o) noexcept : pairs_(std::exchange(o.pairs_, nullptr)), rows_(std::exchange(o.rows_, 0)) {}
DeviceCopy& DeviceCopy::operator=(DeviceCopy&& o) noexcept {
  if (this != &o) {
    if (pairs_) (void)cudaFree(pairs_);
    pairs_ = std::exchange(o.pairs_, nullptr);
    rows_ = std::exchange(o.rows_, 0);
  }
  return *this;
}

Result<DeviceCopy> DeviceCopy::upload(const CopyTable& t) {
  DeviceCopy d;
  DISTCA_ASSIGN_OR_RETURN(d.pairs_, to_device(expand_pairs(t)));
  d.rows_ = table_rows(t);
  return d;
}

Status DeviceCopy::run(const float* src, const Window& sw, float* dst, const Window& dw, int64_t width,
                       cudaStream_t stream) const {
  DISTCA_CUDA_CHECK(launch_copy_rows(pairs_, rows_, src, sw, dst, dw, width, stream));
  return Status::ok_status();
}

DeviceGatherAdd::~DeviceGatherAdd() {
  if (data_) (void)cudaFree(data_);
}
DeviceGatherAdd::DeviceGatherAdd(DeviceGatherAdd&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), n_dst_(std::exchange(o.n_dst_, 0)), n_src_(std::exchange(o.n_src_, 0)) {}
DeviceGatherAdd& DeviceGatherAdd::operator=(DeviceGatherAdd&& o) noexcept {
  if (this != &o) {
    if (data_) (void)cudaFree(data_);
    data_ = std::exchange(o.data_, nullptr);
    n_dst_ = std::exchange(o.n_dst_, 0);
    n_src_ = std::exchange(o.n_src_, 0);
  }
  return *this;
}

Result<DeviceGatherAdd> DeviceGatherAdd::upload(const GatherAdd& g) {
  DeviceGatherAdd d;
  std::vector<int64_t> flat(g.dst);
  flat.insert(flat.end(), g.offsets.begin(), g.offsets.end());
  flat.insert(flat.end(), g.src.begin(), g.src.end());
  DISTCA_ASSIGN_OR_RETURN(d.data_, to_device(flat));
  d.n_dst_ = static_cast<int64_t>(g.dst.size());
  d.n_src_ = static_cast<int64_t>(g.src.size());
  return d;
}

Status DeviceGatherAdd::run(const float* src, const Window& sw, float* dst, const Window& dw, int64_t width,
                            cudaStream_t stream) const {
  const int64_t* offsets = data_ ? data_ + n_dst_ : nullptr;
  const int64_t* srcs = offsets ? offsets + n_dst_ + 1 : nullptr;
  DISTCA_CUDA_CHECK(launch_gather_add(data_, offsets, srcs, n_dst_, src, sw, dst, dw, width, stream));
  return Status::ok_status();
}

Status DeviceMover::copy(const CopyTable& t, const float* src, const Window& sw, float* dst, const Window& dw,
                         int64_t width) {
  auto it = copies_.find(&t);
  if (it == copies_.end()) {
    DISTCA_ASSIGN_OR_RETURN(DeviceCopy d, DeviceCopy::upload(t));
    it = copies_.emplace(&t, std::move(d)).first;
  }
  return it->second.run(src, sw, dst, dw, width, stream_);
}

Status DeviceMover::gather_add(const GatherAdd& g, const float* src, const Window& sw, float* dst, const Window& dw,
                               int64_t width) {
  auto it = sums_.find(&g);
  if (it == sums_.end()) {
    DISTCA_ASSIGN_OR_RETURN(DeviceGatherAdd d, DeviceGatherAdd::upload(g));
    it = sums_.emplace(&g, std::move(d)).first;
  }
  return it->second.run(src, sw, dst, dw, width, stream_);
}

}  // namespace distca::runtime::device
