// The CUDA path's host side, run for real on any machine (no device needed): validation of the
// params, kernel choice, the tile schedule (every block exactly once, weights equal to a
// brute-force count over the mask, heaviest first), the workspace layout, the CUDA error
// messages, and that a bad call is refused before any CUDA call.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_shapes.h"  // src/kernels_cuda (private include path of this test)
#include "distca/core/cuda_check.h"
#include "distca/kernels_cuda/attention_cuda.h"
#include "distca/kernels_cuda/device.h"

namespace distca::kernels {
namespace {

using Tasks = std::vector<std::pair<int32_t, int32_t>>;

// Fake "device" addresses: never dereferenced by the planner, only checked for null and alignment.
template <class T>
T* fake(uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

struct Shape {
  std::vector<int32_t> cu_q{0}, cu_k{0};
  AttentionParams p;
};

Shape make_shape(const Tasks& tasks, int heads, int kv_heads, int d, DType dtype, bool causal = true) {
  Shape s;
  for (const auto& [q, k] : tasks) {
    s.cu_q.push_back(s.cu_q.back() + q);
    s.cu_k.push_back(s.cu_k.back() + k);
  }
  AttentionParams& p = s.p;
  p.dtype = dtype;
  p.n_tasks = static_cast<int32_t>(tasks.size());
  p.n_heads = heads;
  p.n_kv_heads = kv_heads;
  p.head_dim = d;
  p.causal = causal;
  p.q = fake<const float>(0x10000);
  p.k = fake<const float>(0x20000);
  p.v = fake<const float>(0x30000);
  p.o = fake<float>(0x40000);
  p.lse = fake<float>(0x50000);
  p.d_o = fake<const float>(0x60000);
  p.dq = fake<float>(0x70000);
  p.dk = fake<float>(0x80000);
  p.dv = fake<float>(0x90000);
  p.cu_seqlens_q = fake<const int32_t>(0xa0000);
  p.cu_seqlens_k = fake<const int32_t>(0xb0000);
  return s;
}

Result<CudaLaunchPlan> plan(const Shape& s, bool backward, CudaAttentionOptions o = {}) {
  return plan_cuda_attention(s.p, s.cu_q.data(), s.cu_k.data(), backward, o);
}

std::string error_of(const Result<CudaLaunchPlan>& r) {
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(CudaPlan, ChoosesTheTiledForwardWhereItApplies) {
  const Tasks tasks = {{100, 300}};
  auto bf = plan(make_shape(tasks, 4, 2, 128, DType::kBFloat16), true);
  ASSERT_TRUE(bf.ok()) << bf.status().to_string();
  EXPECT_EQ(bf->forward, CudaKernel::kTiled);
  EXPECT_EQ(bf->backward, CudaKernel::kTiled);
  EXPECT_EQ(bf->dq_rows, 64);
  EXPECT_EQ(bf->dkv_rows, 64);
  EXPECT_EQ(bf->dkv_chunk, 32);
  EXPECT_EQ(bf->dq_smem_bytes, (2 * 64 * 128 + 4 * 64 * 128) * 2);
  EXPECT_EQ(bf->dkv_smem_bytes, (2 * 64 * 128 + 4 * 32 * 128) * 2 + 4 * 32 * 4);
  EXPECT_EQ(bf->fwd_rows, cuda_shapes::kTiledRows);
  EXPECT_EQ(bf->fwd_smem_bytes, (64 * 128 + 4 * 64 * 128) * 2);
  EXPECT_EQ(plan(make_shape(tasks, 4, 2, 64, DType::kFloat16), false)->forward, CudaKernel::kTiled);
  EXPECT_EQ(plan(make_shape(tasks, 4, 2, 128, DType::kFloat32), false)->forward, CudaKernel::kSimple);
  EXPECT_EQ(plan(make_shape(tasks, 4, 2, 96, DType::kBFloat16), false)->forward, CudaKernel::kSimple);
  Shape misaligned = make_shape(tasks, 4, 2, 128, DType::kBFloat16);
  misaligned.p.k = fake<const float>(0x20008);
  EXPECT_EQ(plan(misaligned, false)->forward, CudaKernel::kSimple);
  EXPECT_EQ(plan(make_shape(tasks, 4, 2, 128, DType::kBFloat16), false, {CudaKernel::kSimple, CudaKernel::kAuto})->forward,
            CudaKernel::kSimple);
}

// The backward's own buffers: d_o is loaded by cp.async (16 bytes), dq/dk/dv are stored as
// 32-bit words. A view misaligned for them falls back to the simple backward (auto), or is
// refused naming the buffer (tiled forced); the forward does not read them and stays tiled.
TEST(CudaPlan, BackwardAlignmentOfItsOwnBuffers) {
  const Tasks tasks = {{100, 300}};
  const CudaAttentionOptions tiled{CudaKernel::kTiled, CudaKernel::kTiled};
  struct Off {
    const char* field;
    uintptr_t base, offset;
  };
  for (const Off& c : {Off{"d_o", 0x60000, 8}, Off{"dq", 0x70000, 2}, Off{"dk", 0x80000, 2}, Off{"dv", 0x90000, 2}}) {
    Shape s = make_shape(tasks, 4, 2, 128, DType::kBFloat16);
    const std::string f = c.field;
    if (f == "d_o") s.p.d_o = fake<const float>(c.base + c.offset);
    if (f == "dq") s.p.dq = fake<float>(c.base + c.offset);
    if (f == "dk") s.p.dk = fake<float>(c.base + c.offset);
    if (f == "dv") s.p.dv = fake<float>(c.base + c.offset);
    auto p = plan(s, true);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(p->forward, CudaKernel::kTiled) << f;
    EXPECT_EQ(p->backward, CudaKernel::kSimple) << f;
    EXPECT_EQ(plan(s, false, tiled)->forward, CudaKernel::kTiled) << f;
    const std::string why = error_of(plan(s, true, tiled));
    EXPECT_NE(why.find("backward kernel: tiled refused: "), std::string::npos) << why;
    EXPECT_NE(why.find(f == "d_o" ? "d_o must be 16-byte aligned" : "dq, dk and dv must be 4-byte aligned"),
              std::string::npos)
        << why;
  }
  // 4-byte aligned outputs and a 16-byte aligned d_o are enough.
  Shape ok = make_shape(tasks, 4, 2, 64, DType::kFloat16);
  ok.p.dq = fake<float>(0x70004);
  ok.p.d_o = fake<const float>(0x60010);
  EXPECT_EQ(plan(ok, true)->backward, CudaKernel::kTiled);
}

TEST(CudaPlan, RefusesWithTheFieldNamed) {
  const Tasks tasks = {{10, 20}};
  auto bad = make_shape(tasks, 4, 2, 64, DType::kFloat32);
  bad.p.dtype = static_cast<DType>(7);
  EXPECT_NE(error_of(plan(bad, false)).find("dtype"), std::string::npos);
  EXPECT_NE(error_of(plan(make_shape(tasks, 4, 2, 512, DType::kFloat32), false)).find("head_dim 512"), std::string::npos);
  EXPECT_NE(error_of(plan(make_shape(tasks, 4, 3, 64, DType::kFloat32), false)).find("n_kv_heads"), std::string::npos);
  EXPECT_NE(error_of(plan(make_shape({{30, 20}}, 4, 2, 64, DType::kFloat32), false)).find("q_len 30 > kv_len 20"),
            std::string::npos);
  auto no_o = make_shape(tasks, 4, 2, 64, DType::kFloat32);
  no_o.p.o = nullptr;
  EXPECT_NE(error_of(plan(no_o, false)).find("o and lse"), std::string::npos);
  auto no_dk = make_shape(tasks, 4, 2, 64, DType::kFloat32);
  no_dk.p.dk = nullptr;
  EXPECT_TRUE(plan(no_dk, false).ok());  // the forward does not need it
  EXPECT_NE(error_of(plan(no_dk, true)).find("dk and dv"), std::string::npos);
  auto no_cu = make_shape(tasks, 4, 2, 64, DType::kFloat32);
  EXPECT_NE(error_of(plan_cuda_attention(no_cu.p, nullptr, no_cu.cu_k.data(), false)).find("host cu_seqlens"),
            std::string::npos);
  no_cu.p.cu_seqlens_k = nullptr;
  EXPECT_NE(error_of(plan(no_cu, false)).find("device arrays"), std::string::npos);
  const CudaAttentionOptions tiled{CudaKernel::kTiled, CudaKernel::kTiled};
  EXPECT_NE(error_of(plan(make_shape(tasks, 4, 2, 64, DType::kFloat32), false, tiled)).find("bf16/fp16"),
            std::string::npos);
  EXPECT_NE(error_of(plan(make_shape(tasks, 4, 2, 96, DType::kBFloat16), false, tiled)).find("head_dim 64 or 128"),
            std::string::npos);
  EXPECT_NE(error_of(plan(make_shape(tasks, 4, 2, 64, DType::kFloat32), true, {CudaKernel::kAuto, CudaKernel::kTiled}))
                .find("backward kernel: tiled refused: it takes bf16/fp16"),
            std::string::npos);
}

// Brute force: the number of `keys`-key blocks the rows [r0, r1) of a task touch through the mask.
int32_t key_blocks_touched(int32_t ql, int32_t kl, bool causal, int32_t r0, int32_t r1, int32_t keys) {
  int32_t last = -1;
  for (int32_t r = r0; r < r1; ++r) {
    for (int32_t j = 0; j < kl; ++j) {
      if (!causal || j <= kl - ql + r) last = std::max(last, j);
    }
  }
  return last < 0 ? 0 : last / keys + 1;
}
// Brute force: the number of `chunk`-row steps from the first query row that sees any of the
// key rows [j0, j1) to the task's end.
int32_t query_steps(int32_t ql, int32_t kl, bool causal, int32_t j0, int32_t chunk) {
  int32_t first = ql;
  for (int32_t r = 0; r < ql; ++r) {
    if (!causal || j0 <= kl - ql + r) {
      first = r;
      break;
    }
  }
  return (ql - first + chunk - 1) / chunk;
}

void expect_schedule(const std::vector<CudaTile>& tiles, const std::vector<int32_t>& lens, int32_t rows,
                     const std::function<int32_t(int32_t, int32_t)>& weight) {
  std::map<std::pair<int32_t, int32_t>, int> seen;
  for (const CudaTile& t : tiles) {
    ++seen[{t.task, t.block}];
    EXPECT_EQ(t.weight, weight(t.task, t.block)) << "task " << t.task << " block " << t.block;
  }
  size_t expected = 0;
  for (size_t t = 0; t < lens.size(); ++t) {
    for (int32_t b = 0; b * rows < lens[t]; ++b) {
      ++expected;
      EXPECT_EQ((seen[{static_cast<int32_t>(t), b}]), 1) << "task " << t << " block " << b;
    }
  }
  EXPECT_EQ(tiles.size(), expected);
  for (size_t i = 1; i < tiles.size(); ++i) {
    const CudaTile &a = tiles[i - 1], &b = tiles[i];
    EXPECT_TRUE(a.weight > b.weight || (a.weight == b.weight && std::tie(a.task, a.block) < std::tie(b.task, b.block)))
        << "order at " << i;
  }
}

TEST(CudaPlan, TilesCoverEveryBlockOnceHeaviestFirst) {
  const Tasks tasks = {{0, 50}, {1, 1}, {64, 64}, {65, 200}, {7, 1000}, {130, 130}, {0, 0}, {200, 333}};
  for (bool causal : {true, false}) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {  // the simple and the tiled schedules
      const Shape s = make_shape(tasks, 8, 2, 128, dt, causal);
      auto r = plan(s, true);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      std::vector<int32_t> ql, kl;
      for (const auto& [q, k] : tasks) ql.push_back(q), kl.push_back(k);
      expect_schedule(r->fwd_tiles, ql, r->fwd_rows, [&](int32_t t, int32_t b) {
        return key_blocks_touched(ql[t], kl[t], causal, b * r->fwd_rows, std::min(ql[t], (b + 1) * r->fwd_rows),
                                  r->fwd_keys);
      });
      expect_schedule(r->dq_tiles, ql, r->dq_rows, [&](int32_t t, int32_t b) {
        return key_blocks_touched(ql[t], kl[t], causal, b * r->dq_rows, std::min(ql[t], (b + 1) * r->dq_rows),
                                  r->dq_keys);
      });
      expect_schedule(r->dkv_tiles, kl, r->dkv_rows, [&](int32_t t, int32_t b) {
        return query_steps(ql[t], kl[t], causal, b * r->dkv_rows, r->dkv_chunk);
      });
      EXPECT_EQ(r->total_q, 467);
      EXPECT_EQ(r->total_kv, 1778);
    }
  }
}

TEST(CudaPlan, WorkspaceHoldsTheTilesThenD) {
  const Shape s = make_shape({{100, 300}, {5, 9}}, 4, 1, 64, DType::kFloat32);
  auto f = plan(s, false);
  auto b = plan(s, true);
  ASSERT_TRUE(f.ok() && b.ok());
  const auto wf = cuda_shapes::workspace_layout(*f, 4);
  EXPECT_EQ(wf.total, wf.tiles_bytes);  // no D for a forward
  EXPECT_EQ(f->workspace_bytes, wf.total);
  const auto wb = cuda_shapes::workspace_layout(*b, 4);
  for (int64_t off : {wb.dq_tiles, wb.dkv_tiles, wb.dsum, wb.total}) EXPECT_EQ(off % 256, 0);
  EXPECT_GE(wb.dq_tiles, static_cast<int64_t>(b->fwd_tiles.size() * sizeof(CudaTile)));
  EXPECT_GE(wb.dkv_tiles - wb.dq_tiles, static_cast<int64_t>(b->dq_tiles.size() * sizeof(CudaTile)));
  EXPECT_GE(wb.dsum - wb.dkv_tiles, static_cast<int64_t>(b->dkv_tiles.size() * sizeof(CudaTile)));
  EXPECT_GE(wb.total - wb.dsum, 4 * 105 * static_cast<int64_t>(sizeof(float)));
  EXPECT_EQ(b->workspace_bytes, wb.total);
}

TEST(CudaCheck, MessageNamesTheCallAndPlace) {
  EXPECT_TRUE(cuda_error_status(cudaSuccess, "x", "f.cu", 1).ok());
  const Status st = cuda_error_status(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "src/x.cu", 12);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(st.message(), "CUDA error cudaErrorMemoryAllocation (out of memory) in cudaMalloc(&p, n) at src/x.cu:12");
  EXPECT_TRUE(cuda_no_device(cudaErrorNoDevice));
  EXPECT_FALSE(cuda_no_device(cudaErrorMemoryAllocation));
}

TEST(CudaAttentionRunner, RefusesBadParamsBeforeAnyCudaCall) {
  Shape s = make_shape({{30, 20}}, 4, 2, 64, DType::kFloat32);  // q_len > kv_len under causal
  CudaAttention att;
  const Status st = att.forward(s.p, s.cu_q.data(), s.cu_k.data(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(att.backward(s.p, s.cu_q.data(), s.cu_k.data(), nullptr).code(), StatusCode::kInvalidArgument);
}

// Without a device, a valid call fails at its first CUDA call with a Status naming it (the
// CUDA_CHECK path, exercised for real); with one, this test has nothing to say.
TEST(CudaAttentionRunner, NoDeviceIsAStatusNotACrash) {
  if (cuda_device_info().ok()) GTEST_SKIP() << "a CUDA device is present (the device tests cover this path)";
  Shape s = make_shape({{10, 20}}, 4, 2, 64, DType::kFloat32);
  CudaAttention att;
  const Status st = att.forward(s.p, s.cu_q.data(), s.cu_k.data(), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
  EXPECT_NE(st.message().find("CUDA error"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("attention_cuda.cpp:"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace distca::kernels
