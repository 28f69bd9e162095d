// A whole layer's data movement of the CA dispatcher, run from the tables of
// runtime_cuda/row_tables.h on every rank of a plan, with the all-to-all-v's simulated by
// copying blocks between the ranks' buffers. The copies go through a Mover: the host
// references (HostMover) or the device kernels (the GPU test's mover), so the same simulation
// checks the tables against independent values (test_row_tables.cpp) and the kernels against
// the host bitwise (test_pack_cuda.cpp).
//
// Values: token buffers hold encoded (doc, pos, column) values, so every destination row can be
// checked against what it must hold without the dispatcher's code. dK partials are random
// floats over many magnitudes, so a different addition order changes the bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "distca/core/rng.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/plan.h"
#include "distca/runtime_cuda/row_tables.h"

namespace distca::runtime::device::testing {

class Mover {
 public:
  virtual ~Mover() = default;
  virtual void copy(const CopyTable& t, const std::vector<float>& src, const Window& sw, std::vector<float>& dst,
                    const Window& dw, int64_t width) = 0;
  virtual void gather_add(const GatherAdd& g, const std::vector<float>& src, const Window& sw,
                          std::vector<float>& dst, const Window& dw, int64_t width) = 0;
};

class HostMover final : public Mover {
 public:
  void copy(const CopyTable& t, const std::vector<float>& src, const Window& sw, std::vector<float>& dst,
            const Window& dw, int64_t width) override {
    apply_copy(t, src.data(), sw, dst.data(), dw, width);
  }
  void gather_add(const GatherAdd& g, const std::vector<float>& src, const Window& sw, std::vector<float>& dst,
                  const Window& dw, int64_t width) override {
    apply_gather_add(g, src.data(), sw, dst.data(), dw, width);
  }
};

// Exact, distinct-enough floats for (doc, pos, col) of a tensor `salt`.
inline float encode(int64_t doc, int64_t pos, int64_t col, int salt) {
  const uint64_t h = (static_cast<uint64_t>(doc) * 1000003u + static_cast<uint64_t>(pos)) * 131u +
                     static_cast<uint64_t>(col) * 7u + static_cast<uint64_t>(salt) * 7919u;
  return static_cast<float>(h % 8388593u) + 0.25f;  // exact in float, never 0 (0 marks "untouched")
}

struct RankBuffers {
  // Home side, (tokens, floats per row).
  std::vector<float> q, k, v, o, lse, dk;
  // Wire buffers.
  std::vector<float> q_send, q_recv, kv_send, kv_recv, olse_send, olse_recv, dkv_send, dkv_recv;
  // Server side: the fused call's inputs, outputs (fo: written by the "kernel" below), flse
  // (H, total_q), fdk (total_kv, kvf).
  std::vector<float> fq, fk, fv, fo, flse, fdk;
  std::vector<float> home_dk;  // the server's own partial of its rows' dK
  FusedLayout fused;
  RankTables tables;  // what moved it all
};

struct Sim {
  const Plan* plan = nullptr;
  int64_t n_heads = 0, qf = 0, kvf = 0;
  std::vector<RankBuffers> ranks;
};

// One all-to-all-v of `ex` (rows of `row_floats`): rank r's recv block from p = p's send block to r.
inline void exchange(Sim& s, ExchangeKind kind, int64_t row_floats, std::vector<float> RankBuffers::*send,
                     std::vector<float> RankBuffers::*recv) {
  const size_t n = s.ranks.size();
  for (size_t r = 0; r < n; ++r) {
    const Exchange& rx = s.plan->ranks[r].exchange(kind);
    for (size_t p = 0; p < n; ++p) {
      const Exchange& px = s.plan->ranks[p].exchange(kind);
      const int64_t rows = rx.recv_counts[p];
      DISTCA_CHECK(rows == px.send_counts[r]);
      const float* from = (s.ranks[p].*send).data() + px.send_displs[r] * row_floats;
      float* to = (s.ranks[r].*recv).data() + rx.recv_displs[p] * row_floats;
      std::copy(from, from + rows * row_floats, to);
    }
  }
}

inline std::vector<float> zeros(int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); }

// Forward (pack Q/KV, exchange, assemble, scatter O/LSE, exchange, unpack) and the dK half of
// backward (server partials, exchange, home sum), all through `m`.
inline Sim simulate(const Plan& plan, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t tile, Mover& m,
                    uint64_t seed) {
  Sim s;
  s.plan = &plan;
  s.n_heads = n_heads;
  s.qf = n_heads * head_dim;
  s.kvf = n_kv_heads * head_dim;
  const int64_t qf = s.qf, kvf = s.kvf, H = n_heads, of = qf + H;
  const int n = static_cast<int>(plan.ranks.size());
  const DocumentIndex index(plan.batch);
  s.ranks.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {  // tables and token buffers
    RankBuffers& b = s.ranks[static_cast<size_t>(r)];
    auto tables = rank_tables(plan, index, r, tile);
    DISTCA_CHECK(tables.ok());
    b.tables = std::move(tables).value();
    b.fused = b.tables.fused;
    const int64_t tok = plan.ranks[static_cast<size_t>(r)].tokens;
    b.q = zeros(tok * qf), b.k = zeros(tok * kvf), b.v = zeros(tok * kvf), b.o = zeros(tok * qf);
    b.lse = zeros(tok * H), b.dk = zeros(tok * kvf);
    for (int64_t doc : index.doc_ids()) {
      for (const HeldRun& run : index.runs(doc)) {
        if (run.rank != r) continue;
        for (int64_t pos = run.begin; pos < run.end; ++pos) {
          const int64_t l = run.local_row + pos - run.begin;
          for (int64_t c = 0; c < qf; ++c) b.q[static_cast<size_t>(l * qf + c)] = encode(doc, pos, c, 1);
          for (int64_t c = 0; c < kvf; ++c) b.k[static_cast<size_t>(l * kvf + c)] = encode(doc, pos, c, 2);
          for (int64_t c = 0; c < kvf; ++c) b.v[static_cast<size_t>(l * kvf + c)] = encode(doc, pos, c, 3);
        }
      }
    }
  }
  for (int r = 0; r < n; ++r) {  // home: pack Q and K|V
    RankBuffers& b = s.ranks[static_cast<size_t>(r)];
    const RankPlan& rp = plan.ranks[static_cast<size_t>(r)];
    const Exchange& xq = rp.exchange(ExchangeKind::kQ);
    const Exchange& xkv = rp.exchange(ExchangeKind::kKv);
    b.q_send = zeros(xq.send_rows() * qf), b.q_recv = zeros(xq.recv_rows() * qf);
    b.kv_send = zeros(xkv.send_rows() * 2 * kvf), b.kv_recv = zeros(xkv.recv_rows() * 2 * kvf);
    m.copy(b.tables.pack[static_cast<size_t>(ExchangeKind::kQ)], b.q, {qf, 0, 1}, b.q_send, {qf, 0, 1}, qf);
    const CopyTable& kv = b.tables.pack[static_cast<size_t>(ExchangeKind::kKv)];
    m.copy(kv, b.k, {kvf, 0, 1}, b.kv_send, {2 * kvf, 0, 1}, kvf);
    m.copy(kv, b.v, {kvf, 0, 1}, b.kv_send, {2 * kvf, kvf, 1}, kvf);
  }
  exchange(s, ExchangeKind::kQ, qf, &RankBuffers::q_send, &RankBuffers::q_recv);
  exchange(s, ExchangeKind::kKv, 2 * kvf, &RankBuffers::kv_send, &RankBuffers::kv_recv);
  Rng rng(seed);
  for (int r = 0; r < n; ++r) {  // server: assemble, "run the kernel", scatter outputs
    RankBuffers& b = s.ranks[static_cast<size_t>(r)];
    const ServerTables& t = b.tables.server;
    const int64_t tq = b.fused.cu_q.back(), tk = b.fused.cu_k.back();
    b.fq = zeros(tq * qf), b.fk = zeros(tk * kvf), b.fv = zeros(tk * kvf);
    m.copy(t.q_local, b.q, {qf, 0, 1}, b.fq, {qf, 0, 1}, qf);
    m.copy(t.q_recv, b.q_recv, {qf, 0, 1}, b.fq, {qf, 0, 1}, qf);
    m.copy(t.kv_local, b.k, {kvf, 0, 1}, b.fk, {kvf, 0, 1}, kvf);
    m.copy(t.kv_local, b.v, {kvf, 0, 1}, b.fv, {kvf, 0, 1}, kvf);
    m.copy(t.kv_recv, b.kv_recv, {2 * kvf, 0, 1}, b.fk, {kvf, 0, 1}, kvf);
    m.copy(t.kv_recv, b.kv_recv, {2 * kvf, kvf, 1}, b.fv, {kvf, 0, 1}, kvf);
    // The "kernel": O and LSE of a fused query row encode its (doc, pos); pad rows stay 0.
    b.fo = zeros(tq * qf), b.flse = zeros(tq * H);
    const ServerPlan& sp = plan.servers[static_cast<size_t>(r)];
    for (size_t i = 0; i < sp.tasks.size(); ++i) {
      const TaskPlacement& tp = sp.tasks[i].task;
      for (int64_t pos = tp.q_begin; pos < tp.q_end; ++pos) {
        const int64_t row = b.fused.q_row[i] + pos - tp.q_begin;
        for (int64_t c = 0; c < qf; ++c) b.fo[static_cast<size_t>(row * qf + c)] = encode(tp.doc, pos, c, 4);
        for (int64_t h = 0; h < H; ++h) b.flse[static_cast<size_t>(h * tq + row)] = encode(tp.doc, pos, h, 5);
      }
    }
    const Exchange& xo = plan.ranks[static_cast<size_t>(r)].exchange(ExchangeKind::kOLse);
    b.olse_send = zeros(xo.send_rows() * of), b.olse_recv = zeros(xo.recv_rows() * of);
    m.copy(t.out_local, b.fo, {qf, 0, 1}, b.o, {qf, 0, 1}, qf);
    m.copy(t.out_local, b.flse, {1, 0, tq}, b.lse, {H, 0, 1}, H);
    m.copy(t.out_send, b.fo, {qf, 0, 1}, b.olse_send, {of, 0, 1}, qf);
    m.copy(t.out_send, b.flse, {1, 0, tq}, b.olse_send, {of, qf, 1}, H);
    // Backward's dK partials: random per fused context row, over many magnitudes.
    b.fdk = zeros(tk * kvf);
    for (auto& x : b.fdk) x = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform(-3.0, 3.0)));
    const Exchange& xd = plan.ranks[static_cast<size_t>(r)].exchange(ExchangeKind::kDKv);
    b.dkv_send = zeros(xd.send_rows() * 2 * kvf), b.dkv_recv = zeros(xd.recv_rows() * 2 * kvf);
    b.home_dk = zeros(plan.ranks[static_cast<size_t>(r)].tokens * kvf);
    m.gather_add(t.dkv_send, b.fdk, {kvf, 0, 1}, b.dkv_send, {2 * kvf, 0, 1}, kvf);
    m.gather_add(t.dkv_home, b.fdk, {kvf, 0, 1}, b.home_dk, {kvf, 0, 1}, kvf);
  }
  exchange(s, ExchangeKind::kOLse, of, &RankBuffers::olse_send, &RankBuffers::olse_recv);
  exchange(s, ExchangeKind::kDKv, 2 * kvf, &RankBuffers::dkv_send, &RankBuffers::dkv_recv);
  for (int r = 0; r < n; ++r) {  // home: unpack O/LSE, sum dK
    RankBuffers& b = s.ranks[static_cast<size_t>(r)];
    const CopyTable& un = b.tables.unpack[static_cast<size_t>(ExchangeKind::kOLse)];
    m.copy(un, b.olse_recv, {of, 0, 1}, b.o, {qf, 0, 1}, qf);
    m.copy(un, b.olse_recv, {of, qf, 1}, b.lse, {H, 0, 1}, H);
    b.dk = b.home_dk;
    m.gather_add(b.tables.dkv_add, b.dkv_recv, {2 * kvf, 0, 1}, b.dk, {kvf, 0, 1}, kvf);
  }
  return s;
}

}  // namespace distca::runtime::device::testing
