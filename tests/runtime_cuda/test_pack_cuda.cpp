// The device movement (runtime_cuda/pack.h: DeviceMover running the library's phase functions)
// against the host reference, bitwise: the whole simulated layer of movement_sim.h run once in
// host memory with the HostMover and once in device memory with the DeviceMover, every buffer
// of every rank compared with memcmp. Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>

#include "distca/kernels/attention_traits.h"
#include "distca/runtime_cuda/pack.h"
#include "movement_sim.h"
#include "plan_fixtures.h"

namespace distca::runtime::device {
namespace {

using testing::HostSpace;
using testing::RankBuffers;
using testing::Sim;
using testing::Space;

// "" when a GPU is usable, else why not (the skip message).
std::string no_gpu() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  }
  return count > 0 ? "" : "no CUDA device: cudaGetDeviceCount found none";
}

// Device memory; every call checked (a CUDA failure aborts the program with its message, as a
// test helper without a Status to return). Synchronous copies order the mover's kernels (legacy
// default stream) before every read.
class DeviceSpace final : public Space {
 public:
  ~DeviceSpace() override {
    for (float* p : bufs_) (void)cudaFree(p);
  }
  float* alloc(size_t n) override {
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float)), "cudaMalloc");
    check(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(float)), "cudaMemset");
    bufs_.push_back(static_cast<float*>(p));
    return bufs_.back();
  }
  void upload(float* dst, const std::vector<float>& src) override {
    check(cudaMemcpy(dst, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  std::vector<float> download(const float* src, size_t n) override {
    std::vector<float> out(n);
    check(cudaMemcpy(out.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return out;
  }
  void copy(float* dst, const float* src, size_t n) override {
    check(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
  }
  RowMover& mover() override { return mover_; }
  int64_t uploads() const { return mover_.uploads(); }

 private:
  static void check(cudaError_t e, const char* what) {
    DISTCA_CHECK_MSG(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e));
  }
  std::vector<float*> bufs_;
  DeviceMover mover_{nullptr};
};

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(PackCuda, DeviceMovementEqualsHostBitwiseForEverySchedulerAndRankCount) {
  if (const std::string why = no_gpu(); !why.empty()) GTEST_SKIP() << why;
  const int32_t heads = 8, kv_heads = 2, head_dim = 64;  // rows of 512 / 128 floats: several warps per row
  const int64_t tile = kernels::AttentionTraits::query_tile_rows(heads / kv_heads);
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Batch batch = testing::fixture_batch(ranks, 512, 90 + static_cast<uint64_t>(ranks));
    for (const std::string& name : testing::fixture_schedulers(ranks)) {
      auto plan = make_plan(batch, parse_scheduler(name).value(), testing::fixture_options(heads, kv_heads, head_dim));
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      for (bool stateless : {false, true}) {
        HostSpace hs;
        DeviceSpace ds;
        const Sim h = testing::simulate(plan.value(), heads, kv_heads, head_dim, tile, hs, 5, stateless);
        const Sim d = testing::simulate(plan.value(), heads, kv_heads, head_dim, tile, ds, 5, stateless);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_GT(ds.uploads(), 0);
        for (size_t r = 0; r < h.ranks.size(); ++r) {
          const RankBuffers &a = h.ranks[r], &b = d.ranks[r];
          const std::string what = std::to_string(ranks) + " ranks, " + name + ", rank " + std::to_string(r) +
                                   (stateless ? ", stateless" : "");
          for (auto m : {&RankBuffers::q_send, &RankBuffers::kv_send, &RankBuffers::q_recv, &RankBuffers::kv_recv,
                         &RankBuffers::fq, &RankBuffers::fk, &RankBuffers::fv, &RankBuffers::o, &RankBuffers::lse,
                         &RankBuffers::olse_send, &RankBuffers::olse_recv, &RankBuffers::dkv_send, &RankBuffers::dkv_recv,
                         &RankBuffers::home_dk, &RankBuffers::home_dv, &RankBuffers::dk, &RankBuffers::dv,
                         &RankBuffers::do_send, &RankBuffers::do_recv, &RankBuffers::fdo, &RankBuffers::fq2,
                         &RankBuffers::fo2, &RankBuffers::flse2, &RankBuffers::dq_send, &RankBuffers::dq}) {
            EXPECT_TRUE(same(a.*m, b.*m)) << what;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace distca::runtime::device
