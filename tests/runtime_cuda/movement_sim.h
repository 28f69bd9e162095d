// A whole layer's data movement of the CA dispatcher on every rank of a plan, run by the
// library's phase functions (runtime_cuda/movement.h) with the all-to-all-v's simulated by
// copying blocks between the ranks' buffers. Buffers live in a Space: host memory with the
// HostMover (test_row_tables.cpp checks the result against independent values), or device
// memory with the DeviceMover (test_pack_cuda.cpp requires the host's bits).
//
// Values: token buffers hold encoded (doc, pos, column) values, so every destination row can be
// checked against what it must hold without the dispatcher's code; the "kernel" writes encoded
// O/LSE; dK/dV partials are random floats over many magnitudes, so another addition order
// changes the bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "distca/core/check.h"
#include "distca/core/rng.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/plan.h"
#include "distca/runtime_cuda/movement.h"
#include "distca/runtime_cuda/row_tables.h"

namespace distca::runtime::device::testing {

// Where the simulation's buffers live. alloc: n floats, zeroed; copy: n floats within the space.
class Space {
 public:
  virtual ~Space() = default;
  virtual float* alloc(size_t n) = 0;
  virtual void upload(float* dst, const std::vector<float>& src) = 0;
  virtual std::vector<float> download(const float* src, size_t n) = 0;
  virtual void copy(float* dst, const float* src, size_t n) = 0;
  virtual RowMover& mover() = 0;
};

class HostSpace final : public Space {
 public:
  float* alloc(size_t n) override { return bufs_.emplace_back(std::max<size_t>(n, 1), 0.0f).data(); }
  void upload(float* dst, const std::vector<float>& src) override { std::copy(src.begin(), src.end(), dst); }
  std::vector<float> download(const float* src, size_t n) override { return std::vector<float>(src, src + n); }
  void copy(float* dst, const float* src, size_t n) override { std::copy(src, src + n, dst); }
  RowMover& mover() override { return mover_; }

 private:
  std::deque<std::vector<float>> bufs_;
  HostMover mover_;
};

// Exact, distinct-enough floats for (doc, pos, col) of a tensor `salt`; never 0 (0 marks "untouched").
inline float encode(int64_t doc, int64_t pos, int64_t col, int salt) {
  const uint64_t h = (static_cast<uint64_t>(doc) * 1000003u + static_cast<uint64_t>(pos)) * 131u +
                     static_cast<uint64_t>(col) * 7u + static_cast<uint64_t>(salt) * 7919u;
  return static_cast<float>(h % 8388593u) + 0.25f;
}

struct Buf {
  float* p = nullptr;
  size_t n = 0;
};

// One rank's buffers, downloaded to the host at the end.
struct RankBuffers {
  std::vector<float> q, k, v, o, lse, dk, dv;                                   // token buffers
  std::vector<float> q_send, q_recv, kv_send, kv_recv, olse_send, olse_recv, dkv_send, dkv_recv;
  std::vector<float> fq, fk, fv, fo, flse, fdk, fdv;                            // the fused call
  std::vector<float> home_dk, home_dv;  // the server's own partials of its rows
  // Backward: dO in, dQ out; the kDO / kDQ wire buffers; the fused dO and, for stateless
  // servers, the fused Q, O, LSE rebuilt from the kDO rows (fq2, fo2, flse2).
  std::vector<float> d_o, dq, do_send, do_recv, dq_send, dq_recv, fdo, fq2, fo2, flse2;
  FusedLayout fused;
  RankTables tables;  // what moved it all
};

struct Sim {
  const Plan* plan = nullptr;
  LayerDims dims;
  std::vector<RankBuffers> ranks;
};

// The same buffers as RankBuffers, in the space.
struct RankSpace {
  Buf q, k, v, o, lse, dk, dv, q_send, q_recv, kv_send, kv_recv, olse_send, olse_recv, dkv_send, dkv_recv;
  Buf fq, fk, fv, fo, flse, fdk, fdv, home_dk, home_dv;
  Buf d_o, dq, do_send, do_recv, dq_send, dq_recv, fdo, fq2, fo2, flse2, fdq;
};

inline Sim simulate(const Plan& plan, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t tile, Space& sp,
                    uint64_t seed, bool stateless = false) {
  Sim s;
  s.plan = &plan;
  s.dims = LayerDims::of(n_heads, n_kv_heads, head_dim);
  const int64_t qf = s.dims.qf, kvf = s.dims.kvf, H = n_heads, of = qf + H;
  const int n = static_cast<int>(plan.ranks.size());
  const DocumentIndex index(plan.batch);
  RowMover& m = sp.mover();
  s.ranks.resize(static_cast<size_t>(n));
  std::vector<RankSpace> b(static_cast<size_t>(n));
  auto alloc = [&](int64_t floats) { return Buf{sp.alloc(static_cast<size_t>(floats)), static_cast<size_t>(floats)}; };
  auto upload = [&](int64_t floats, const std::vector<float>& host) {
    Buf x = alloc(floats);
    sp.upload(x.p, host);
    return x;
  };
  auto ok = [](const Status& st) { DISTCA_CHECK_MSG(st.ok(), st.to_string()); };
  for (int r = 0; r < n; ++r) {  // tables, token buffers, wire and fused buffers (zeroed)
    RankBuffers& h = s.ranks[static_cast<size_t>(r)];
    RankSpace& x = b[static_cast<size_t>(r)];
    auto tables = rank_tables(plan, index, r, tile);
    DISTCA_CHECK(tables.ok());
    h.tables = std::move(tables).value();
    h.fused = h.tables.fused;
    const RankPlan& rp = plan.ranks[static_cast<size_t>(r)];
    const int64_t tok = rp.tokens, tq = h.fused.cu_q.back(), tk = h.fused.cu_k.back();
    std::vector<float> q(static_cast<size_t>(tok * qf)), k(static_cast<size_t>(tok * kvf)), v(k.size());
    for (int64_t doc : index.doc_ids()) {
      for (const HeldRun& run : index.runs(doc)) {
        if (run.rank != r) continue;
        for (int64_t pos = run.begin; pos < run.end; ++pos) {
          const auto l = static_cast<size_t>(run.local_row + pos - run.begin);
          for (int64_t c = 0; c < qf; ++c) q[l * static_cast<size_t>(qf) + static_cast<size_t>(c)] = encode(doc, pos, c, 1);
          for (int64_t c = 0; c < kvf; ++c) k[l * static_cast<size_t>(kvf) + static_cast<size_t>(c)] = encode(doc, pos, c, 2);
          for (int64_t c = 0; c < kvf; ++c) v[l * static_cast<size_t>(kvf) + static_cast<size_t>(c)] = encode(doc, pos, c, 3);
        }
      }
    }
    x.q = upload(tok * qf, q), x.k = upload(tok * kvf, k), x.v = upload(tok * kvf, v);
    x.o = alloc(tok * qf), x.lse = alloc(tok * H), x.dk = alloc(tok * kvf), x.dv = alloc(tok * kvf);
    const Exchange &xq = rp.exchange(ExchangeKind::kQ), &xkv = rp.exchange(ExchangeKind::kKv);
    const Exchange &xo = rp.exchange(ExchangeKind::kOLse), &xd = rp.exchange(ExchangeKind::kDKv);
    x.q_send = alloc(xq.send_rows() * qf), x.q_recv = alloc(xq.recv_rows() * qf);
    x.kv_send = alloc(xkv.send_rows() * 2 * kvf), x.kv_recv = alloc(xkv.recv_rows() * 2 * kvf);
    x.olse_send = alloc(xo.send_rows() * of), x.olse_recv = alloc(xo.recv_rows() * of);
    x.dkv_send = alloc(xd.send_rows() * 2 * kvf), x.dkv_recv = alloc(xd.recv_rows() * 2 * kvf);
    x.fq = alloc(tq * qf), x.fk = alloc(tk * kvf), x.fv = alloc(tk * kvf);
    x.home_dk = alloc(tok * kvf), x.home_dv = alloc(tok * kvf);
  }
  // One all-to-all-v of `kind`: rank r's receive block from p is p's send block to r.
  auto exchange = [&](ExchangeKind kind, int64_t row_floats, Buf RankSpace::*send, Buf RankSpace::*recv) {
    for (size_t r = 0; r < b.size(); ++r) {
      const Exchange& rx = plan.ranks[r].exchange(kind);
      for (size_t p = 0; p < b.size(); ++p) {
        const Exchange& px = plan.ranks[p].exchange(kind);
        const int64_t rows = rx.recv_counts[p];
        DISTCA_CHECK(rows == px.send_counts[r]);
        if (rows == 0) continue;
        sp.copy((b[r].*recv).p + rx.recv_displs[p] * row_floats, (b[p].*send).p + px.send_displs[r] * row_floats,
                static_cast<size_t>(rows * row_floats));
      }
    }
  };
  for (int r = 0; r < n; ++r) {
    RankSpace& x = b[static_cast<size_t>(r)];
    ok(pack_forward(s.ranks[static_cast<size_t>(r)].tables, s.dims, m, x.q.p, x.k.p, x.v.p, x.q_send.p, x.kv_send.p));
  }
  exchange(ExchangeKind::kQ, qf, &RankSpace::q_send, &RankSpace::q_recv);
  exchange(ExchangeKind::kKv, 2 * kvf, &RankSpace::kv_send, &RankSpace::kv_recv);
  Rng rng(seed);
  for (int r = 0; r < n; ++r) {  // server: assemble, "run the kernel", scatter, dK/dV partials
    RankBuffers& h = s.ranks[static_cast<size_t>(r)];
    RankSpace& x = b[static_cast<size_t>(r)];
    const RankTables& t = h.tables;
    ok(assemble_forward(t, s.dims, m, x.q.p, x.k.p, x.v.p, x.q_recv.p, x.kv_recv.p, x.fq.p, x.fk.p, x.fv.p));
    const int64_t tq = h.fused.cu_q.back(), tk = h.fused.cu_k.back();
    std::vector<float> fo(static_cast<size_t>(tq * qf)), flse(static_cast<size_t>(tq * H));
    const ServerPlan& srv = plan.servers[static_cast<size_t>(r)];
    for (size_t i = 0; i < srv.tasks.size(); ++i) {
      const TaskPlacement& tp = srv.tasks[i].task;
      for (int64_t pos = tp.q_begin; pos < tp.q_end; ++pos) {
        const int64_t row = h.fused.q_row[i] + pos - tp.q_begin;
        for (int64_t c = 0; c < qf; ++c) fo[static_cast<size_t>(row * qf + c)] = encode(tp.doc, pos, c, 4);
        for (int64_t hd = 0; hd < H; ++hd) flse[static_cast<size_t>(hd * tq + row)] = encode(tp.doc, pos, hd, 5);
      }
    }
    x.fo = upload(tq * qf, fo), x.flse = upload(tq * H, flse);
    ok(scatter_forward(t, s.dims, m, x.fo.p, x.flse.p, x.o.p, x.lse.p, x.olse_send.p));
    std::vector<float> fdk(static_cast<size_t>(tk * kvf)), fdv(fdk.size());
    for (auto* f : {&fdk, &fdv}) {
      for (auto& e : *f) e = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform(-3.0, 3.0)));
    }
    x.fdk = upload(tk * kvf, fdk), x.fdv = upload(tk * kvf, fdv);
    ok(sum_dkv_server(t, s.dims, m, x.fdk.p, x.fdv.p, x.dkv_send.p, x.home_dk.p, x.home_dv.p));
  }
  exchange(ExchangeKind::kOLse, of, &RankSpace::olse_send, &RankSpace::olse_recv);
  exchange(ExchangeKind::kDKv, 2 * kvf, &RankSpace::dkv_send, &RankSpace::dkv_recv);
  for (int r = 0; r < n; ++r) {  // home: unpack O/LSE; own partials, then the received ones
    RankSpace& x = b[static_cast<size_t>(r)];
    const RankTables& t = s.ranks[static_cast<size_t>(r)].tables;
    ok(unpack_forward(t, s.dims, m, x.olse_recv.p, x.o.p, x.lse.p));
    sp.copy(x.dk.p, x.home_dk.p, x.dk.n);
    sp.copy(x.dv.p, x.home_dv.p, x.dv.n);
    ok(sum_dkv_home(t, s.dims, m, x.dkv_recv.p, x.dk.p, x.dv.p));
  }
  // Backward's dO / dQ path (the dK/dV partials ran above).
  const int64_t wf = do_row_floats(s.dims, stateless);
  for (int r = 0; r < n; ++r) {  // home: pack dO (stateless: with Q, O and the forward's LSE)
    RankSpace& x = b[static_cast<size_t>(r)];
    const RankPlan& rp = plan.ranks[static_cast<size_t>(r)];
    const int64_t tok = rp.tokens;
    std::vector<float> d_o(static_cast<size_t>(tok * qf));
    for (int64_t doc : index.doc_ids()) {
      for (const HeldRun& run : index.runs(doc)) {
        if (run.rank != r) continue;
        for (int64_t pos = run.begin; pos < run.end; ++pos) {
          const auto l = static_cast<size_t>(run.local_row + pos - run.begin);
          for (int64_t c = 0; c < qf; ++c) d_o[l * static_cast<size_t>(qf) + static_cast<size_t>(c)] = encode(doc, pos, c, 6);
        }
      }
    }
    x.d_o = upload(tok * qf, d_o), x.dq = alloc(tok * qf);
    const Exchange &xd = rp.exchange(ExchangeKind::kDO), &xq = rp.exchange(ExchangeKind::kDQ);
    x.do_send = alloc(xd.send_rows() * wf), x.do_recv = alloc(xd.recv_rows() * wf);
    x.dq_send = alloc(xq.send_rows() * qf), x.dq_recv = alloc(xq.recv_rows() * qf);
    ok(pack_backward(s.ranks[static_cast<size_t>(r)].tables, s.dims, m, stateless, x.d_o.p, x.q.p, x.o.p, x.lse.p,
                     x.do_send.p));
  }
  exchange(ExchangeKind::kDO, wf, &RankSpace::do_send, &RankSpace::do_recv);
  for (int r = 0; r < n; ++r) {  // server: assemble, "run the backward kernel", scatter dQ
    RankBuffers& h = s.ranks[static_cast<size_t>(r)];
    RankSpace& x = b[static_cast<size_t>(r)];
    const int64_t tq = h.fused.cu_q.back();
    x.fdo = alloc(tq * qf), x.fq2 = alloc(tq * qf), x.fo2 = alloc(tq * qf), x.flse2 = alloc(tq * H);
    ok(assemble_backward(h.tables, s.dims, m, stateless, x.d_o.p, x.q.p, x.o.p, x.lse.p, x.do_recv.p, x.fdo.p, x.fq2.p,
                         x.fo2.p, x.flse2.p));
    std::vector<float> fdq(static_cast<size_t>(tq * qf));
    const ServerPlan& srv = plan.servers[static_cast<size_t>(r)];
    for (size_t i = 0; i < srv.tasks.size(); ++i) {
      const TaskPlacement& tp = srv.tasks[i].task;
      for (int64_t pos = tp.q_begin; pos < tp.q_end; ++pos) {
        const int64_t row = h.fused.q_row[i] + pos - tp.q_begin;
        for (int64_t c = 0; c < qf; ++c) fdq[static_cast<size_t>(row * qf + c)] = encode(tp.doc, pos, c, 7);
      }
    }
    x.fdq = upload(tq * qf, fdq);
    ok(scatter_dq(h.tables, s.dims, m, x.fdq.p, x.dq.p, x.dq_send.p));
  }
  exchange(ExchangeKind::kDQ, qf, &RankSpace::dq_send, &RankSpace::dq_recv);
  for (int r = 0; r < n; ++r) {
    RankSpace& x = b[static_cast<size_t>(r)];
    ok(unpack_dq(s.ranks[static_cast<size_t>(r)].tables, s.dims, m, x.dq_recv.p, x.dq.p));
  }
  for (int r = 0; r < n; ++r) {  // back to the host
    RankBuffers& h = s.ranks[static_cast<size_t>(r)];
    RankSpace& x = b[static_cast<size_t>(r)];
    auto get = [&](const Buf& y) { return sp.download(y.p, y.n); };
    h.q = get(x.q), h.k = get(x.k), h.v = get(x.v), h.o = get(x.o), h.lse = get(x.lse), h.dk = get(x.dk), h.dv = get(x.dv);
    h.q_send = get(x.q_send), h.q_recv = get(x.q_recv), h.kv_send = get(x.kv_send), h.kv_recv = get(x.kv_recv);
    h.olse_send = get(x.olse_send), h.olse_recv = get(x.olse_recv), h.dkv_send = get(x.dkv_send), h.dkv_recv = get(x.dkv_recv);
    h.fq = get(x.fq), h.fk = get(x.fk), h.fv = get(x.fv), h.fo = get(x.fo), h.flse = get(x.flse);
    h.fdk = get(x.fdk), h.fdv = get(x.fdv), h.home_dk = get(x.home_dk), h.home_dv = get(x.home_dv);
    h.d_o = get(x.d_o), h.dq = get(x.dq), h.do_send = get(x.do_send), h.do_recv = get(x.do_recv);
    h.dq_send = get(x.dq_send), h.dq_recv = get(x.dq_recv), h.fdo = get(x.fdo), h.fq2 = get(x.fq2), h.fo2 = get(x.fo2);
    h.flse2 = get(x.flse2);
  }
  return s;
}

}  // namespace distca::runtime::device::testing
