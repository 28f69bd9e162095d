// The device movement kernels (runtime_cuda/pack.h) against their host references, bitwise: the
// whole simulated layer of movement_sim.h run once with the host mover and once with the
// device mover, every buffer of every rank compared with memcmp. Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>

#include "distca/kernels/attention_traits.h"
#include "distca/runtime_cuda/pack.h"
#include "movement_sim.h"
#include "plan_fixtures.h"

namespace distca::runtime::device {
namespace {

using testing::HostMover;
using testing::Mover;
using testing::RankBuffers;
using testing::Sim;

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

// Uploads the buffers, runs the kernel, downloads the destination; a CUDA failure fails the test.
class DeviceMover final : public Mover {
 public:
  void copy(const CopyTable& t, const std::vector<float>& src, const Window& sw, std::vector<float>& dst,
            const Window& dw, int64_t width) override {
    auto d = DeviceCopy::upload(t);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    run([&](const float* s, float* o) { return d->run(s, sw, o, dw, width, nullptr); }, src, dst);
  }
  void gather_add(const GatherAdd& g, const std::vector<float>& src, const Window& sw, std::vector<float>& dst,
                  const Window& dw, int64_t width) override {
    auto d = DeviceGatherAdd::upload(g);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    run([&](const float* s, float* o) { return d->run(s, sw, o, dw, width, nullptr); }, src, dst);
  }
  int launches = 0;

 private:
  template <class Fn>
  void run(Fn fn, const std::vector<float>& src, std::vector<float>& dst) {
    float *ds = nullptr, *dd = nullptr;
    const size_t sb = std::max<size_t>(src.size(), 1) * sizeof(float), db = std::max<size_t>(dst.size(), 1) * sizeof(float);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&ds), sb), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dd), db), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(ds, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dd, dst.data(), dst.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    Status st = fn(ds, dd);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dst.data(), dd, dst.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(ds);
    cudaFree(dd);
    ++launches;
  }
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
      HostMover hm;
      DeviceMover dm;
      const Sim h = testing::simulate(plan.value(), heads, kv_heads, head_dim, tile, hm, 5);
      const Sim d = testing::simulate(plan.value(), heads, kv_heads, head_dim, tile, dm, 5);
      ASSERT_GT(dm.launches, 0);
      for (size_t r = 0; r < h.ranks.size(); ++r) {
        const RankBuffers &a = h.ranks[r], &b = d.ranks[r];
        const std::string what = std::to_string(ranks) + " ranks, " + name + ", rank " + std::to_string(r);
        for (auto m : {&RankBuffers::q_send, &RankBuffers::kv_send, &RankBuffers::fq, &RankBuffers::fk,
                       &RankBuffers::fv, &RankBuffers::o, &RankBuffers::lse, &RankBuffers::olse_send,
                       &RankBuffers::dkv_send, &RankBuffers::home_dk, &RankBuffers::dk}) {
          EXPECT_TRUE(same(a.*m, b.*m)) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace distca::runtime::device
