// The CPU fast path: FlashAttention-2 style tiling with the online softmax, one sgemm per
// block product, OpenMP over cost-sorted work items. docs/kernels.md explains the choices.
#include "distca/kernels/attention.h"

#include <omp.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "distca/kernels/attention_traits.h"
#include "distca/kernels/blas.h"
#include "vec_math.h"

namespace distca::kernels {

std::mutex& kernel_mutex() {
  static std::mutex mu;
  return mu;
}
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Stacked query rows per block (block rows x heads of a GQA group) and keys per block, exported
// by AttentionTraits (callers depend on the query tile). Chosen by measurement
// (docs/benchmarks.md): M x kBlockKeys scores stay in L2 with the packed operands, and the
// sgemm calls are large enough that OpenBLAS's packing is amortised.
constexpr int64_t kBlockKeys = AttentionTraits::kBlockKeys;
// Query rows per sub-tile where a tile crosses the causal diagonal (used when the tile is
// taller, i.e. for GQA groups of 1 or 2 heads).
constexpr int64_t kDiagRows = 64;
// The backward's key blocks are its units of parallel work: a 1K-token task has only two
// 512-key blocks, of very unequal cost (causal, 3:1), so two threads would idle a third of
// the time. A task of 512 to 2K keys therefore uses 128- or 256-key blocks, so that it has at
// least 4 (measured on 2 cores, docs/benchmarks.md). Like everything below, the choice is a
// function of the task alone (not of the other tasks of the call, nor of the thread count):
// a task's bits do not depend on what it is fused with, which is what lets CAD and
// co-located execution agree bit for bit when they run the same tasks.
constexpr int64_t kMinBackwardBlocks = 4;
constexpr int64_t kMinBlockKeys = 128;
// The backward splits a (task, kv head)'s keys into chunks of about task_pairs / kChunkDivisor
// pairs (at least one block) so that one huge task still spreads over the threads; each chunk
// owns a private dQ partial, summed in chunk order afterwards (deterministic). A task's
// partials may take at most kPartialCap times its dQ; its chunks grow until they fit.
constexpr double kChunkDivisor = 64.0;
constexpr double kPartialCap = 4.0;

// 64-byte aligned scratch that lives as long as its thread and only grows. OpenMP keeps its
// team threads alive between parallel regions, so after the first call no kernel call pays
// for allocating (and page-faulting) megabytes of fresh memory, which matters for small
// problems: a 1K-token task takes a few milliseconds. Each thread owns its buffers, so calls
// from several threads at once never share one.
enum class ScratchSlot { kWork = 0, kPartial, kDsum, kCount };

float* thread_scratch(ScratchSlot slot, size_t n) {
  struct Buffer {
    float* p = nullptr;
    size_t n = 0;
    ~Buffer() {
      if (p) ::operator delete[](p, std::align_val_t(64));
    }
  };
  thread_local Buffer buffers[static_cast<int>(ScratchSlot::kCount)];
  Buffer& b = buffers[static_cast<int>(slot)];
  if (b.n < n) {
    if (b.p) ::operator delete[](b.p, std::align_val_t(64));
    b.p = static_cast<float*>(::operator new[](n * sizeof(float), std::align_val_t(64)));
    b.n = n;
  }
  return b.p;
}

// Flush-to-zero and denormals-are-zero on this thread while it runs kernel work, then the
// caller's mode comes back. Masked scores (exp2(-inf)) and far-below-max scores underflow, and
// every denormal result or operand costs a microcode assist on x86: measured on this machine,
// a 1K-token d=64 forward spent 2.2 cycles per score in the softmax with assists against 0.9
// without, and its sgemms ran 25% faster. Flushed values are below 1.2e-38 (probabilities
// that contribute nothing at fp32), and every thread uses the same mode, so results stay
// deterministic whatever the thread count.
class FlushDenormals {
 public:
#if defined(__SSE__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtzDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
#else
  FlushDenormals() = default;
#endif
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
#if defined(__SSE__)
  static constexpr unsigned kFtzDaz = 0x8040;  // MXCSR bits 15 (FTZ) and 6 (DAZ)
  unsigned saved_;
#endif
};


struct Geometry {
  int64_t H, Hkv, G, d, total_q;
  int64_t block_rows;  // query rows per block: AttentionTraits::query_tile_rows(G)
  float scale;
};

Geometry geometry(const AttentionParams& p) {
  Geometry g{};
  g.H = p.n_heads;
  g.Hkv = p.n_kv_heads;
  g.G = g.H / g.Hkv;
  g.d = p.head_dim;
  g.total_q = p.total_q();
  g.block_rows = AttentionTraits::query_tile_rows(g.G);
  g.scale = p.scale();
  return g;
}

struct TaskShape {
  int64_t q0, k0, q_len, kv_len, off;  // off: keys before the first query row's diagonal
};

TaskShape task_shape(const AttentionParams& p, int64_t t) {
  TaskShape s{};
  s.q0 = p.cu_seqlens_q[t];
  s.k0 = p.cu_seqlens_k[t];
  s.q_len = p.cu_seqlens_q[t + 1] - s.q0;
  s.kv_len = p.cu_seqlens_k[t + 1] - s.k0;
  s.off = s.kv_len - s.q_len;
  return s;
}

// Keys per backward block of a task with kv_len keys: 512, or less for 512 < kv_len < 2048
// (kMinBackwardBlocks blocks at least).
int64_t backward_block_keys(int64_t kv_len) {
  int64_t keys = kBlockKeys;
  while (keys > kMinBlockKeys && kv_len > keys && (kv_len + keys - 1) / keys < kMinBackwardBlocks) keys /= 2;
  return keys;
}

// Keys visible to query row i (exclusive end).
inline int64_t key_end(const AttentionParams& p, const TaskShape& s, int64_t i) {
  return p.causal ? std::min(s.kv_len, s.off + i + 1) : s.kv_len;
}
// First query row that sees key j.
inline int64_t first_row(const AttentionParams& p, const TaskShape& s, int64_t j) {
  return p.causal ? std::max<int64_t>(0, j - s.off) : 0;
}

// Pairs of rows [r0, r1) x keys [0, key limit).
double block_pairs(const AttentionParams& p, const TaskShape& s, int64_t r0, int64_t r1) {
  if (!p.causal) return static_cast<double>(r1 - r0) * static_cast<double>(s.kv_len);
  double total = 0;
  for (int64_t i = r0; i < r1; ++i) total += static_cast<double>(key_end(p, s, i));
  return total;
}

// Copies the G query heads of kv head `grp` for rows [r0, r0 + nr) of a (total, H, d) tensor
// into dst: (nr * G, d), stacked row (i, j) = row r0 + i, head grp * G + j, times `mul`.
void pack_rows(const float* src, const Geometry& g, int64_t row0, int64_t nr, int64_t grp,
               float mul, float* dst) {
  for (int64_t i = 0; i < nr; ++i) {
    const float* s = src + ((row0 + i) * g.H + grp * g.G) * g.d;
    float* o = dst + i * g.G * g.d;
    for (int64_t e = 0; e < g.G * g.d; ++e) o[e] = s[e] * mul;
  }
}

// Sets scores of stacked rows for query rows [r0, r0 + nr) to -inf where key kb + c is past
// the row's diagonal. S: (nr * G, lds).
void apply_causal_mask(float* S, int64_t lds, const Geometry& g, const TaskShape& s, int64_t r0,
                       int64_t nr, int64_t kb, int64_t nk) {
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t first_masked = std::max<int64_t>(0, s.off + r0 + i + 1 - kb);
    if (first_masked >= nk) continue;
    for (int64_t j = 0; j < g.G; ++j) {
      float* row = S + (i * g.G + j) * lds;
      for (int64_t c = first_masked; c < nk; ++c) row[c] = kNegInf;
    }
  }
}

struct WorkItem {
  int64_t task, group, begin, end;  // begin/end: query rows (forward) or key blocks (backward)
  double cost;
};

void sort_by_cost(std::vector<WorkItem>& items) {
  // Largest first for load balance; ties by position so the list is a function of the inputs.
  std::stable_sort(items.begin(), items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
}

// ---------------------------------------------------------------------------------------------
// Forward.

void forward_item(const AttentionParams& p, const Geometry& g, const WorkItem& w, float* ws) {
  const TaskShape s = task_shape(p, w.task);
  const int64_t r0 = w.begin, nr = w.end - w.begin, M = nr * g.G, d = g.d;
  const int64_t lds = kBlockKeys, ldkv = g.Hkv * d;
  float* Qp = ws;               // (M, d)
  float* Oacc = Qp + M * d;     // (M, d)
  float* S = Oacc + M * d;      // (M, kBlockKeys)
  float* m = S + M * lds;       // (M)
  float* l = m + M;             // (M)
  pack_rows(p.q, g, s.q0 + r0, nr, w.group, g.scale * kLog2e, Qp);
  std::fill(m, m + M, kNegInf);
  std::fill(l, l + M, 0.0f);
  const int64_t kend = key_end(p, s, r0 + nr - 1);
  const float* kbase = p.k + (s.k0 * g.Hkv + w.group) * d;
  const float* vbase = p.v + (s.k0 * g.Hkv + w.group) * d;
  // Query rows [a, b) of the tile take keys [kb, kb + nk): scores, mask, online softmax, P V.
  auto update = [&](int64_t a, int64_t b, int64_t kb, int64_t nk) {
    const int64_t ra = a * g.G, rb = b * g.G;  // stacked rows
    gemm<float>(false, true, rb - ra, nk, d, 1.0f, Qp + ra * d, d, kbase + kb * ldkv, ldkv, 0.0f, S + ra * lds, lds);
    if (p.causal) apply_causal_mask(S + ra * lds, lds, g, s, r0 + a, b - a, kb, nk);
    for (int64_t r = ra; r < rb; ++r) {
      float* row = S + r * lds;
      const float mnew = std::max(m[r], detail::row_max(row, nk));
      const float alpha = detail::exp2_scalar(m[r] - mnew);  // 0 on the first block
      l[r] = l[r] * alpha + detail::exp2_shift_sum(row, nk, mnew);
      m[r] = mnew;
      if (kb > 0) detail::scale_row(Oacc + r * d, d, alpha);
    }
    gemm<float>(false, false, rb - ra, d, nk, 1.0f, S + ra * lds, lds, vbase + kb * ldkv, ldkv, kb > 0 ? 1.0f : 0.0f,
                Oacc + ra * d, d);
  };
  // Keys [0, kfull) are visible to every row of the tile; a block reaching past kfull crosses
  // the causal diagonal, and there the tile goes in sub-tiles of kDiagRows rows that each stop
  // at their own last visible key, instead of computing (and masking) a rows x rows triangle:
  // a third of a 1K-token task's work with 256-row tiles. Sub-tiles sit at fixed offsets in
  // the tile, so a row's arithmetic still depends only on its place in the tile grid.
  const int64_t kfull = p.causal ? key_end(p, s, r0) : kend;
  // Keys [0, kend) in equal blocks of at most kBlockKeys (multiples of 16), so that no block
  // is a thin remainder (a 576-key tile: 288 + 288 rather than 512 + 64, whose sgemms run far
  // below peak). kend, hence the blocks, is a function of the tile's place in the document.
  const int64_t n_blocks = (kend + kBlockKeys - 1) / kBlockKeys;
  const int64_t block_keys = n_blocks <= 1 ? kend : ((kend + n_blocks - 1) / n_blocks + 15) / 16 * 16;
  for (int64_t kb = 0; kb < kend; kb += block_keys) {
    const int64_t nk = std::min(block_keys, kend - kb);
    if (kb + nk <= kfull || nr <= kDiagRows) {
      update(0, nr, kb, nk);
      continue;
    }
    for (int64_t a = 0; a < nr; a += kDiagRows) {
      const int64_t b = std::min(nr, a + kDiagRows);
      // A sub-tile none of whose rows reaches this block keeps its state: processing it would
      // add exact zeros.
      const int64_t nks = std::min(nk, key_end(p, s, r0 + b - 1) - kb);
      if (nks > 0) update(a, b, kb, nks);
    }
  }
  for (int64_t i = 0; i < nr; ++i) {
    for (int64_t j = 0; j < g.G; ++j) {
      const int64_t r = i * g.G + j, h = w.group * g.G + j, row = s.q0 + r0 + i;
      float* o = p.o + (row * g.H + h) * d;
      if (kend == 0) {  // no visible key: O = 0, LSE = -inf
        std::fill(o, o + d, 0.0f);
        p.lse[h * g.total_q + row] = kNegInf;
        continue;
      }
      const float inv = 1.0f / l[r];
      for (int64_t c = 0; c < d; ++c) o[c] = Oacc[r * d + c] * inv;
      p.lse[h * g.total_q + row] = (m[r] + std::log2(l[r])) * kLn2;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward.

struct Chunk {
  int64_t task, group, kb_begin, kb_end;  // key blocks [kb_begin, kb_end)
  int64_t keys;                           // keys per block of this task
  int64_t row_begin;                      // first query tile's row that any key of the chunk reaches
  int64_t partial_offset;                 // into the dQ partial buffer: (q_len - row_begin, G, d)
};

// Splits every (task, kv head)'s key blocks into chunks: about task pairs / kChunkDivisor per
// chunk, doubled until the task's partials fit in kPartialCap times its dQ. `block_cost[t]`:
// the cost of each key block of task t. Returns the chunks, (task, kv head) runs in order, and
// sets *partial_floats.
std::vector<Chunk> make_chunks(const AttentionParams& p, const Geometry& g,
                               const std::vector<std::vector<double>>& block_cost,
                               int64_t* partial_floats) {
  std::vector<Chunk> chunks;
  int64_t off = 0;
  for (int64_t t = 0; t < p.n_tasks; ++t) {
    const TaskShape s = task_shape(p, t);
    if (s.q_len == 0 && s.kv_len == 0) continue;
    const auto& bc = block_cost[static_cast<size_t>(t)];
    const int64_t keys = backward_block_keys(s.kv_len);
    const int64_t nb = static_cast<int64_t>(bc.size());
    double total = 0;
    for (double c : bc) total += c;
    // One kv head's chunking (every head of the task gets the same).
    std::vector<Chunk> one;
    int64_t rows = 0;  // partial rows of one head
    for (double target = std::max(total / kChunkDivisor, 1.0);; target *= 2) {
      one.clear();
      rows = 0;
      for (int64_t b = 0; b < nb;) {
        Chunk c{t, 0, b, b, keys, 0, 0};
        double cost = 0;
        while (c.kb_end < nb && (c.kb_end == b || cost + bc[static_cast<size_t>(c.kb_end)] <= target)) {
          cost += bc[static_cast<size_t>(c.kb_end)];
          ++c.kb_end;
        }
        // Rounded down to a query tile: backward_chunk's first tile starts there, and the
        // partial must own every row that tile writes.
        c.row_begin = std::min(s.q_len, first_row(p, s, b * keys)) / g.block_rows * g.block_rows;
        rows += s.q_len - c.row_begin;
        one.push_back(c);
        b = c.kb_end;
      }
      if (one.size() <= 1 || static_cast<double>(rows) <= kPartialCap * static_cast<double>(s.q_len)) break;
    }
    for (int64_t grp = 0; grp < g.Hkv; ++grp) {
      for (Chunk c : one) {
        c.group = grp;
        c.partial_offset = off;
        off += (s.q_len - c.row_begin) * g.G * g.d;
        chunks.push_back(c);
      }
    }
  }
  *partial_floats = off;
  return chunks;
}

void backward_chunk(const AttentionParams& p, const Geometry& g, const Chunk& c,
                    const float* Dsum, float* partial, float* ws) {
  const TaskShape s = task_shape(p, c.task);
  // Scratch rows are kBlockKeys wide whatever the task's block (scratch is sized for the call).
  const int64_t d = g.d, ldkv = g.Hkv * d, lds = kBlockKeys, br = g.block_rows;
  const int64_t Mmax = br * g.G;
  float* Qp = ws;                  // (M, d)
  float* dOp = Qp + Mmax * d;      // (M, d)
  float* S = dOp + Mmax * d;       // (M, kBlockKeys): scores, then P
  float* dP = S + Mmax * lds;      // (M, kBlockKeys): dP, then dS
  float* lse2 = dP + Mmax * lds;   // (M)
  float* Drow = lse2 + Mmax;       // (M)
  float* part = partial + c.partial_offset;  // (q_len - row_begin, G, d)
  const size_t koff = static_cast<size_t>((s.k0 * g.Hkv + c.group) * d);
  for (int64_t blk = c.kb_begin; blk < c.kb_end; ++blk) {
    const int64_t kb = blk * c.keys, nk = std::min(c.keys, s.kv_len - kb);
    const float* kblk = p.k + koff + kb * ldkv;
    const float* vblk = p.v + koff + kb * ldkv;
    float* dkblk = p.dk + koff + kb * ldkv;
    float* dvblk = p.dv + koff + kb * ldkv;
    // Zeroed up front (not by beta = 0 on the first product) because the first query blocks
    // see only a prefix of the key block (causal) and update only those rows.
    for (int64_t r = 0; r < nk; ++r) {
      std::fill(dkblk + r * ldkv, dkblk + r * ldkv + d, 0.0f);
      std::fill(dvblk + r * ldkv, dvblk + r * ldkv + d, 0.0f);
    }
    const int64_t row_start = (std::min(s.q_len, first_row(p, s, kb)) / br) * br;
    for (int64_t r0 = row_start; r0 < s.q_len; r0 += br) {
      const int64_t nr = std::min(br, s.q_len - r0), M = nr * g.G;
      // Keys of this block that any row of the query block sees: a prefix (causal).
      const int64_t nke = std::min(nk, key_end(p, s, r0 + nr - 1) - kb);
      float* part_rows = part + (r0 - c.row_begin) * g.G * d;  // (nr * G, d)
      // The chunk's first key block initialises its partial (beta = 0); later blocks add.
      const float beta = blk == c.kb_begin ? 0.0f : 1.0f;
      if (nke <= 0) {
        if (blk == c.kb_begin) std::fill(part_rows, part_rows + M * d, 0.0f);
        continue;
      }
      pack_rows(p.q, g, s.q0 + r0, nr, c.group, g.scale * kLog2e, Qp);
      pack_rows(p.d_o, g, s.q0 + r0, nr, c.group, 1.0f, dOp);
      for (int64_t i = 0; i < nr; ++i) {
        for (int64_t j = 0; j < g.G; ++j) {
          const int64_t h = c.group * g.G + j, row = s.q0 + r0 + i;
          lse2[i * g.G + j] = p.lse[h * g.total_q + row] * kLog2e;
          Drow[i * g.G + j] = Dsum[h * g.total_q + row];
        }
      }
      // Rows [a, b) of the tile against keys [kb, kb + nkp).
      auto update = [&](int64_t a, int64_t b, int64_t nkp) {
        const int64_t ra = a * g.G, mp = (b - a) * g.G;  // first stacked row, stacked rows
        float* Sp = S + ra * lds;
        float* dPp = dP + ra * lds;
        gemm<float>(false, true, mp, nkp, d, 1.0f, Qp + ra * d, d, kblk, ldkv, 0.0f, Sp, lds);
        if (p.causal) apply_causal_mask(Sp, lds, g, s, r0 + a, b - a, kb, nkp);
        for (int64_t r = 0; r < mp; ++r) detail::exp2_shift(Sp + r * lds, nkp, lse2[ra + r]);
        // dV += P^T dO
        gemm<float>(true, false, nkp, d, mp, 1.0f, Sp, lds, dOp + ra * d, d, 1.0f, dvblk, ldkv);
        // dP = dO V^T; dS = P o (dP - D)
        gemm<float>(false, true, mp, nkp, d, 1.0f, dOp + ra * d, d, vblk, ldkv, 0.0f, dPp, lds);
        for (int64_t r = 0; r < mp; ++r) detail::softmax_grad(dPp + r * lds, Sp + r * lds, nkp, Drow[ra + r]);
        // dK += scale * dS^T Q  (Qp carries scale * log2 e, hence ln 2)
        gemm<float>(true, false, nkp, d, mp, kLn2, dPp, lds, Qp + ra * d, d, 1.0f, dkblk, ldkv);
        // dQ partial += scale * dS K
        gemm<float>(false, false, mp, d, nkp, g.scale, dPp, lds, kblk, ldkv, beta, part_rows + ra * d, d);
      };
      // As in the forward: a tall tile whose rows reach different depths of this block goes in
      // kDiagRows-row sub-tiles, each taking only the keys its last row sees.
      const int64_t first_keys = std::min(nk, key_end(p, s, r0) - kb);
      if (!p.causal || first_keys >= nke || nr <= kDiagRows) {
        update(0, nr, nke);
        continue;
      }
      for (int64_t a = 0; a < nr; a += kDiagRows) {
        const int64_t b = std::min(nr, a + kDiagRows);
        const int64_t nks = std::min(nk, key_end(p, s, r0 + b - 1) - kb);
        if (nks > 0) {
          update(a, b, nks);
        } else if (blk == c.kb_begin) {  // rows that see nothing here still own a zero partial
          std::fill(part_rows + a * g.G * d, part_rows + b * g.G * d, 0.0f);
        }
      }
    }
  }
}

}  // namespace

double attention_scratch_bytes(int64_t total_q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                               bool backward, int threads) {
  const double G = static_cast<double>(n_heads / std::max<int64_t>(1, n_kv_heads));
  const double M = static_cast<double>(AttentionTraits::query_tile_rows(static_cast<int64_t>(G))) * G;
  const double d = static_cast<double>(head_dim), rows = static_cast<double>(total_q) * static_cast<double>(n_heads);
  // The sizes attention_forward / attention_backward pass to thread_scratch.
  const double fwd_tile = 2 * M * d + M * kBlockKeys + 2 * M;
  const double bwd_tile = 2 * M * d + 2 * M * kBlockKeys + 2 * M;
  double floats = std::max(1, threads) * (backward ? std::max(fwd_tile, bwd_tile) : fwd_tile);
  // make_chunks keeps a task's partials within kPartialCap times its dQ (one chunk: at most dQ).
  if (backward) floats += rows + kPartialCap * rows * d;
  return floats * sizeof(float);
}

void attention_forward(const AttentionParams& p) {
  DISTCA_CHECK(p.dtype == DType::kFloat32);
  const Geometry g = geometry(p);
  std::vector<WorkItem> items;
  for (int64_t t = 0; t < p.n_tasks; ++t) {
    const TaskShape s = task_shape(p, t);
    for (int64_t r0 = 0; r0 < s.q_len; r0 += g.block_rows) {
      const int64_t r1 = std::min(s.q_len, r0 + g.block_rows);
      // Each block also pays its packing and per-row overhead, hence the + rows * d.
      const double cost = block_pairs(p, s, r0, r1) + static_cast<double>((r1 - r0) * g.d);
      for (int64_t grp = 0; grp < g.Hkv; ++grp) items.push_back({t, grp, r0, r1, cost});
    }
  }
  sort_by_cost(items);
  const int64_t M = g.block_rows * g.G;
  const size_t ws_floats = static_cast<size_t>(2 * M * g.d + M * kBlockKeys + 2 * M);
  // OpenBLAS runs single-threaded inside our parallel regions (we parallelise over blocks).
  ScopedBlasThreads blas_guard(1);
  const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel if (n_items > 1)
  {
    FlushDenormals ftz;
    float* ws = thread_scratch(ScratchSlot::kWork, ws_floats);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_items; ++i) forward_item(p, g, items[static_cast<size_t>(i)], ws);
  }
}

void attention_backward(const AttentionParams& p) {
  DISTCA_CHECK(p.dtype == DType::kFloat32);
  const Geometry g = geometry(p);
  const int64_t d = g.d, total_q = g.total_q;

  // Per-task key-block costs (pairs per kv head, plus a per-block overhead) and the chunking.
  std::vector<std::vector<double>> block_cost(static_cast<size_t>(p.n_tasks));
  for (int64_t t = 0; t < p.n_tasks; ++t) {
    const TaskShape s = task_shape(p, t);
    const int64_t keys = backward_block_keys(s.kv_len);
    const int64_t nb = (s.kv_len + keys - 1) / keys;
    auto& bc = block_cost[static_cast<size_t>(t)];
    bc.assign(static_cast<size_t>(nb), static_cast<double>(keys * d));
    for (int64_t j = 0; j < s.kv_len; ++j) {
      bc[static_cast<size_t>(j / keys)] += static_cast<double>(s.q_len - std::min(s.q_len, first_row(p, s, j)));
    }
  }
  int64_t partial_floats = 0;
  const std::vector<Chunk> chunks = make_chunks(p, g, block_cost, &partial_floats);
  std::vector<WorkItem> items;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    double cost = 0;
    for (int64_t b = c.kb_begin; b < c.kb_end; ++b) cost += block_cost[static_cast<size_t>(c.task)][static_cast<size_t>(b)];
    items.push_back({static_cast<int64_t>(i), 0, 0, 0, cost});
  }
  sort_by_cost(items);
  // Runs of chunks of one (task, kv head): chunks of a run are consecutive in `chunks`.
  std::vector<int64_t> first_chunk;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i == 0 || chunks[i].task != chunks[i - 1].task || chunks[i].group != chunks[i - 1].group) {
      first_chunk.push_back(static_cast<int64_t>(i));
    }
  }
  first_chunk.push_back(static_cast<int64_t>(chunks.size()));
  const int64_t n_runs = static_cast<int64_t>(first_chunk.size()) - 1;

  // Both belong to the calling thread (reused across its calls); the team only reads and
  // writes them inside this call.
  float* Dsum = thread_scratch(ScratchSlot::kDsum, static_cast<size_t>(g.H * total_q));  // (n_heads, total_q)
  // Chunk partials of dQ, (rows from row_begin, G, d) per chunk; every element is written
  // (beta = 0) by the chunk's first key block before it is accumulated into.
  float* partial = thread_scratch(ScratchSlot::kPartial, static_cast<size_t>(partial_floats));
  const int64_t Mmax = g.block_rows * g.G;
  const size_t ws_floats = static_cast<size_t>(2 * Mmax * d + 2 * Mmax * kBlockKeys + 2 * Mmax);
  const int64_t n_items = static_cast<int64_t>(items.size());
  // OpenBLAS runs single-threaded inside our parallel regions (we parallelise over blocks).
  ScopedBlasThreads blas_guard(1);
  // One parallel region for the three phases: waking the team once matters for small batches
  // (and on a loaded machine every region start waits for every thread to be scheduled).
#pragma omp parallel if (n_items > 1 || total_q * g.H * d > (1 << 16))
  {
    FlushDenormals ftz;
    // D[h, row] = dO . O (the softmax backward's row term), one fixed-order sum per element.
#pragma omp for schedule(static)
    for (int64_t row = 0; row < total_q; ++row) {
      for (int64_t h = 0; h < g.H; ++h) {
        const float* a = p.d_o + (row * g.H + h) * d;
        const float* b = p.o + (row * g.H + h) * d;
        float acc = 0;
        for (int64_t c = 0; c < d; ++c) acc += a[c] * b[c];
        Dsum[h * total_q + row] = acc;
      }
    }
    {
      float* ws = thread_scratch(ScratchSlot::kWork, ws_floats);
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n_items; ++i) {
        backward_chunk(p, g, chunks[static_cast<size_t>(items[static_cast<size_t>(i)].task)],
                       Dsum, partial, ws);
      }
    }
    // dQ = sum of a run's chunk partials in chunk order, whatever thread computed them.
#pragma omp for schedule(dynamic, 1)
    for (int64_t run = 0; run < n_runs; ++run) {
      const Chunk& c0 = chunks[static_cast<size_t>(first_chunk[static_cast<size_t>(run)])];
      const TaskShape s = task_shape(p, c0.task);
      for (int64_t i = 0; i < s.q_len; ++i) {
        float* dst = p.dq + ((s.q0 + i) * g.H + c0.group * g.G) * d;
        std::fill(dst, dst + g.G * d, 0.0f);
      }
      for (int64_t ci = first_chunk[static_cast<size_t>(run)]; ci < first_chunk[static_cast<size_t>(run) + 1]; ++ci) {
        const Chunk& c = chunks[static_cast<size_t>(ci)];
        const float* part = partial + c.partial_offset;
        for (int64_t i = c.row_begin; i < s.q_len; ++i) {
          float* dst = p.dq + ((s.q0 + i) * g.H + c.group * g.G) * d;
          const float* src = part + (i - c.row_begin) * g.G * d;
          for (int64_t e = 0; e < g.G * d; ++e) dst[e] += src[e];
        }
      }
    }
  }
  // Query rows of tasks without keys (non-causal, kv_len 0) belong to no run: zero gradient.
  for (int64_t t = 0; t < p.n_tasks; ++t) {
    const TaskShape s = task_shape(p, t);
    if (s.kv_len == 0 && s.q_len > 0) {
      std::fill(p.dq + s.q0 * g.H * d, p.dq + (s.q0 + s.q_len) * g.H * d, 0.0f);
    }
  }
}

}  // namespace distca::kernels
