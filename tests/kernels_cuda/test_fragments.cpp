// The tiled kernels' fragment arithmetic (src/kernels_cuda/fragment_layout.h) checked on the
// host: ldmatrix (plain and .trans) and mma.m16n8k16 are emulated here from the PTX ISA's
// fragment tables, independently of that header, and a warp's worth of the kernels' address
// and register choices must compose into the exact products S = A B^T (Q K^T, K Q^T, dO V^T)
// and O = P B (P V, dS K, P^T dO, dS^T Q), with P taken from C fragments as the kernels do.
// Values are small integers, so every product is exact and compared with ==. Also: the
// swizzle permutes each row's chunks and every ldmatrix phase hits 8 distinct bank groups.
#include <array>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "fragment_layout.h"  // src/kernels_cuda (private include path of this test)

namespace distca::kernels::frag {
namespace {

struct Pair {
  float lo = 0, hi = 0;  // a 32-bit register holding two 16-bit elements (low = lower index)
};
using Regs4 = std::array<std::array<Pair, 4>, 32>;  // [lane][register] of an ldmatrix.x4
using CFrag = std::array<std::array<float, 4>, 32>;  // [lane][element] of one 16 x 8 C tile

// A (rows, D) tile of 16-bit elements laid out as the kernels' shared memory.
template <int D>
struct Tile {
  int rows;
  std::vector<float> mem;
  explicit Tile(int r) : rows(r), mem(static_cast<size_t>(r) * D) {}
  float& at(int r, int c) { return mem[swz<D>(r, c / 8) + c % 8]; }
};

// PTX ldmatrix.sync.aligned.m8n8.x4[.trans].b16: lanes 8i .. 8i + 7 give the row addresses
// (element offsets) of matrix i; lane l receives in register i, without .trans, row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i; with .trans, column l / 4 of rows
// 2 (l % 4) and 2 (l % 4) + 1.
Regs4 ldmatrix(const std::vector<float>& mem, const std::array<int, 32>& addr, bool trans) {
  Regs4 r{};
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 4; ++i) {
      if (!trans) {
        const int row = addr[8 * i + l / 4];
        r[l][i] = {mem[row + 2 * (l % 4)], mem[row + 2 * (l % 4) + 1]};
      } else {
        r[l][i] = {mem[addr[8 * i + 2 * (l % 4)] + l / 4], mem[addr[8 * i + 2 * (l % 4) + 1] + l / 4]};
      }
    }
  }
  return r;
}

// PTX mma.sync.aligned.m16n8k16.row.col.f32: with g = lane / 4, t = lane % 4,
// A: a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9];
// B: b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; C: c0 = C[g][2t], c1 = C[g][2t+1],
// c2 = C[g+8][2t], c3 = C[g+8][2t+1].
void mma(CFrag& c, const std::array<std::array<Pair, 4>, 32>& a, const std::array<Pair, 32>& b0,
         const std::array<Pair, 32>& b1) {
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    A[g][2 * t] = a[l][0].lo, A[g][2 * t + 1] = a[l][0].hi;
    A[g + 8][2 * t] = a[l][1].lo, A[g + 8][2 * t + 1] = a[l][1].hi;
    A[g][2 * t + 8] = a[l][2].lo, A[g][2 * t + 9] = a[l][2].hi;
    A[g + 8][2 * t + 8] = a[l][3].lo, A[g + 8][2 * t + 9] = a[l][3].hi;
    B[2 * t][g] = b0[l].lo, B[2 * t + 1][g] = b0[l].hi;
    B[2 * t + 8][g] = b1[l].lo, B[2 * t + 9][g] = b1[l].hi;
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int e = 0; e < 4; ++e) {
      float acc = 0;
      for (int k = 0; k < 16; ++k) acc += A[rows[e]][k] * B[k][cols[e]];
      c[l][e] += acc;
    }
  }
}

std::array<Pair, 32> reg(const Regs4& r, int i) {
  std::array<Pair, 32> out;
  for (int l = 0; l < 32; ++l) out[l] = r[l][i];
  return out;
}

template <int D>
void fill(Tile<D>& t, int seed) {
  for (int r = 0; r < t.rows; ++r) {
    for (int c = 0; c < D; ++c) t.at(r, c) = static_cast<float>((r * 7 + c * 3 + seed) % 7 - 3);
  }
}

// One warp's C = A B^T: A = rows [a0, a0 + 16) of `a`, B^T = rows [0, 8 nt) of `b` (both (., D)),
// with the kernels' addressing (a_row/a_chunk, b_row/b_chunk). Returns nt C fragments.
template <int D>
std::vector<CFrag> warp_abt(Tile<D>& a, int a0, Tile<D>& b, int nt) {
  std::vector<CFrag> c(nt, CFrag{});
  for (int kk = 0; kk < D / 16; ++kk) {
    std::array<int, 32> aa, ba;
    for (int l = 0; l < 32; ++l) aa[l] = swz<D>(a0 + a_row(l), a_chunk(l, kk));
    const Regs4 af = ldmatrix(a.mem, aa, false);
    for (int p = 0; p < nt / 2; ++p) {
      for (int l = 0; l < 32; ++l) ba[l] = swz<D>(b_row(l, p), b_chunk(l, kk));
      const Regs4 bf = ldmatrix(b.mem, ba, false);
      mma(c[2 * p], af, reg(bf, 0), reg(bf, 1));
      mma(c[2 * p + 1], af, reg(bf, 2), reg(bf, 3));
    }
  }
  return c;
}

// One warp's O = P B: P (16 x 16 ksteps) given as C fragments (2 ksteps of them), B = rows
// [0, 16 ksteps) of `b` ((k, D) layout, .trans loads). Returns D / 8 C fragments.
template <int D>
std::vector<CFrag> warp_pb(const std::vector<CFrag>& p, Tile<D>& b, int ksteps) {
  std::vector<CFrag> o(D / 8, CFrag{});
  for (int j = 0; j < ksteps; ++j) {
    std::array<std::array<Pair, 4>, 32> pa;
    for (int l = 0; l < 32; ++l) {
      for (int r = 0; r < 4; ++r) {
        const CFrag& src = p[c_to_a_tile(j, r)];
        pa[l][r] = {src[l][(r & 1) * 2], src[l][(r & 1) * 2 + 1]};
      }
    }
    for (int dd = 0; dd < D / 16; ++dd) {
      std::array<int, 32> ba;
      for (int l = 0; l < 32; ++l) ba[l] = swz<D>(bt_row(l, j), bt_chunk(l, dd));
      const Regs4 bf = ldmatrix(b.mem, ba, true);
      mma(o[2 * dd], pa, reg(bf, 0), reg(bf, 1));
      mma(o[2 * dd + 1], pa, reg(bf, 2), reg(bf, 3));
    }
  }
  return o;
}

template <int D>
void check_products() {
  // S = Q K^T for each of the 4 warps of a 64-row Q tile against a 64-key K tile (forward,
  // dQ), and S^T = K Q^T against a 32-row Q chunk (dK/dV: 4 n-tiles).
  Tile<D> q(64), k(64), chunk(32);
  fill(q, 1);
  fill(k, 2);
  fill(chunk, 3);
  for (int w = 0; w < 4; ++w) {
    for (auto [b, nt] : {std::pair<Tile<D>*, int>{&k, 8}, std::pair<Tile<D>*, int>{&chunk, 4}}) {
      const std::vector<CFrag> s = warp_abt(q, 16 * w, *b, nt);
      for (int n = 0; n < nt; ++n) {
        for (int l = 0; l < 32; ++l) {
          for (int e = 0; e < 4; ++e) {
            const int row = 16 * w + c_row(l, e), col = 8 * n + c_col(l, e);
            float want = 0;
            for (int c = 0; c < D; ++c) want += q.at(row, c) * b->at(col, c);
            ASSERT_EQ(s[n][l][e], want) << "D " << D << " warp " << w << " n-tile " << n << " lane " << l << " e " << e;
          }
        }
      }
    }
  }
  // O = P V with P from C fragments over 64 keys (forward, dQ = dS K) and over 32 query rows
  // (dV = P^T dO, dK = dS^T Q).
  for (int ksteps : {4, 2}) {
    std::vector<CFrag> p(2 * ksteps);
    for (int n = 0; n < 2 * ksteps; ++n) {
      for (int l = 0; l < 32; ++l) {
        for (int e = 0; e < 4; ++e) p[n][l][e] = static_cast<float>((c_row(l, e) * 5 + (8 * n + c_col(l, e)) * 3) % 5 - 2);
      }
    }
    Tile<D> v(16 * ksteps);
    fill(v, 4);
    const std::vector<CFrag> o = warp_pb(p, v, ksteps);
    for (int n = 0; n < D / 8; ++n) {
      for (int l = 0; l < 32; ++l) {
        for (int e = 0; e < 4; ++e) {
          const int row = c_row(l, e), col = 8 * n + c_col(l, e);
          float want = 0;
          for (int key = 0; key < 16 * ksteps; ++key) {
            want += static_cast<float>((row * 5 + key * 3) % 5 - 2) * v.at(key, col);
          }
          ASSERT_EQ(o[n][l][e], want) << "D " << D << " ksteps " << ksteps << " n-tile " << n << " lane " << l;
        }
      }
    }
  }
}

TEST(CudaFragments, ProductsComposeHeadDim64) { check_products<64>(); }
TEST(CudaFragments, ProductsComposeHeadDim128) { check_products<128>(); }

template <int D>
void check_swizzle() {
  for (int r = 0; r < 64; ++r) {
    std::set<int> chunks;
    for (int c = 0; c < D / 8; ++c) chunks.insert((swz<D>(r, c) - r * D) / 8);
    EXPECT_EQ(chunks.size(), static_cast<size_t>(D / 8));
    EXPECT_EQ(*chunks.rbegin(), D / 8 - 1);
  }
  // Every 8-lane phase of every ldmatrix the kernels issue reads 8 distinct 16-byte bank groups.
  auto distinct = [](const std::array<int, 32>& addr, const char* what) {
    for (int i = 0; i < 4; ++i) {
      std::set<int> groups;
      for (int l = 8 * i; l < 8 * i + 8; ++l) groups.insert((addr[l] * 2 / 16) % 8);
      EXPECT_EQ(groups.size(), 8u) << what << " matrix " << i;
    }
  };
  for (int kk = 0; kk < D / 16; ++kk) {
    for (int base : {0, 16, 32, 48}) {
      std::array<int, 32> a, b, t;
      for (int l = 0; l < 32; ++l) {
        a[l] = swz<D>(base + a_row(l), a_chunk(l, kk));
        b[l] = swz<D>(b_row(l, base / 16), b_chunk(l, kk));
        t[l] = swz<D>(bt_row(l, base / 16), bt_chunk(l, kk));
      }
      distinct(a, "A");
      distinct(b, "B");
      distinct(t, "B trans");
    }
  }
}

TEST(CudaFragments, SwizzleIsAConflictFreePermutation) {
  check_swizzle<64>();
  check_swizzle<128>();
}

}  // namespace
}  // namespace distca::kernels::frag
