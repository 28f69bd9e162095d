// A host emulation of the CUDA features the tiled kernels use, so that their code runs on a
// CPU in a test (tests/kernels_cuda/test_emulated.cpp includes the .cu files with
// DISTCA_CUDA_EMULATION defined). Only for testing; never part of the library.
//
// One block runs at a time: each of its threads is a ucontext coroutine on one OS thread,
// switched at every barrier (__syncthreads) and at every warp-collective operation (shuffles,
// ldmatrix, mma.sync: each lane posts its operands, the warp meets, each lane computes its
// result from the PTX ISA's fragment tables, the warp meets again). cp.async copies at once.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

namespace distca::emu {

struct Idx {
  unsigned x = 0, y = 0, z = 0;
};

class BlockRunner {
 public:
  static BlockRunner*& current() {
    static BlockRunner* r = nullptr;
    return r;
  }

  // Runs body() as `threads` threads of block (bx, by) with `smem` bytes of dynamic shared
  // memory. Precondition: threads is a multiple of 32.
  static void run(unsigned bx, unsigned by, int threads, size_t smem, const std::function<void()>& body) {
    BlockRunner r(bx, by, threads, smem, body);
    current() = &r;
    r.schedule();
    current() = nullptr;
  }

  Idx thread_idx() const { return {static_cast<unsigned>(cur_), 0, 0}; }
  Idx block_dim() const { return {static_cast<unsigned>(threads_), 1, 1}; }
  Idx block_idx() const { return {bx_, by_, 0}; }
  unsigned char* smem() { return smem_.data(); }

  // Barrier over the whole block (group = -1) or one warp (group = warp index).
  void barrier(int group) {
    const int first = group < 0 ? 0 : group * 32, size = group < 0 ? threads_ : 32;
    int& arrived = group < 0 ? block_arrived_ : warp_arrived_[group];
    if (++arrived == size) {
      arrived = 0;
      for (int t = first; t < first + size; ++t) waiting_[t] = false;
      return;
    }
    waiting_[cur_] = true;
    swapcontext(&ctx_[cur_], &sched_);
  }

  // Warp collective: every lane posts `in` (of type In, <= 64 bytes), the warp meets, each lane
  // reads all 32 posts through f(posts, lane), the warp meets again.
  template <class In, class F>
  auto collective(const In& in, F f) {
    static_assert(sizeof(In) <= sizeof(Slot), "collective operand too large");
    const int warp = cur_ / 32, lane = cur_ % 32;
    std::memcpy(&slots_[cur_], &in, sizeof(In));
    barrier(warp);
    In all[32];
    for (int l = 0; l < 32; ++l) std::memcpy(&all[l], &slots_[warp * 32 + l], sizeof(In));
    auto out = f(all, lane);
    barrier(warp);
    return out;
  }

 private:
  struct Slot {
    unsigned char bytes[64];
  };

  BlockRunner(unsigned bx, unsigned by, int threads, size_t smem, const std::function<void()>& body)
      : bx_(bx), by_(by), threads_(threads), body_(body), smem_(smem, 0xcd), ctx_(threads),
        stacks_(threads, std::vector<char>(kStack)), waiting_(threads, false), done_(threads, false),
        warp_arrived_(threads / 32, 0), slots_(threads) {}

  static void trampoline() {
    BlockRunner* r = current();
    r->body_();
    r->done_[r->cur_] = true;
    swapcontext(&r->ctx_[r->cur_], &r->sched_);
  }

  void schedule() {
    for (int t = 0; t < threads_; ++t) {
      getcontext(&ctx_[t]);
      ctx_[t].uc_stack.ss_sp = stacks_[t].data();
      ctx_[t].uc_stack.ss_size = kStack;
      ctx_[t].uc_link = &sched_;
      makecontext(&ctx_[t], &BlockRunner::trampoline, 0);
    }
    for (bool again = true; again;) {
      again = false;
      for (int t = 0; t < threads_; ++t) {
        if (done_[t] || waiting_[t]) continue;
        cur_ = t;
        swapcontext(&sched_, &ctx_[t]);
        again = true;
      }
      if (!again && std::any_of(done_.begin(), done_.end(), [](bool d) { return !d; })) {
        std::abort();  // deadlock: some thread waits at a barrier the others never reach
      }
    }
  }

  static constexpr size_t kStack = 64 * 1024;
  unsigned bx_, by_;
  int threads_;
  std::function<void()> body_;
  std::vector<unsigned char> smem_;
  ucontext_t sched_{};
  std::vector<ucontext_t> ctx_;
  std::vector<std::vector<char>> stacks_;
  std::vector<bool> waiting_, done_;
  int block_arrived_ = 0;
  std::vector<int> warp_arrived_;
  std::vector<Slot> slots_;
  int cur_ = 0;
};

inline Idx thread_idx() { return BlockRunner::current()->thread_idx(); }
inline Idx block_idx() { return BlockRunner::current()->block_idx(); }
inline Idx block_dim() { return BlockRunner::current()->block_dim(); }
inline void syncthreads() { BlockRunner::current()->barrier(-1); }
inline unsigned char* dynamic_smem() { return BlockRunner::current()->smem(); }
inline float shfl_xor(float v, int o) {
  return BlockRunner::current()->collective(v, [o](const float* all, int lane) { return all[lane ^ o]; });
}

}  // namespace distca::emu

// What the kernels' CUDA spellings mean under emulation (the CUDA headers already give the host
// compiler __global__, __device__, __host__ and __forceinline__).
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#define threadIdx (::distca::emu::thread_idx())
#define blockIdx (::distca::emu::block_idx())
#define blockDim (::distca::emu::block_dim())
#define __syncthreads() ::distca::emu::syncthreads()
#define __shfl_xor_sync(mask, v, o) ::distca::emu::shfl_xor((v), (o))
#define DISTCA_DYNAMIC_SMEM(name) unsigned char* name = ::distca::emu::dynamic_smem()
