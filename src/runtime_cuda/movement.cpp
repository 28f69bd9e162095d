// One layer's copies, phase by phase (include/distca/runtime_cuda/movement.h).
#include "distca/runtime_cuda/movement.h"

namespace distca::runtime::device {
namespace {
size_t idx(ExchangeKind k) { return static_cast<size_t>(k); }
}  // namespace

Status HostMover::copy(const CopyTable& t, const float* src, const Window& sw, float* dst, const Window& dw,
                       int64_t width) {
  apply_copy(t, src, sw, dst, dw, width);
  return Status::ok_status();
}

Status HostMover::gather_add(const GatherAdd& g, const float* src, const Window& sw, float* dst, const Window& dw,
                             int64_t width) {
  apply_gather_add(g, src, sw, dst, dw, width);
  return Status::ok_status();
}

Status pack_forward(const RankTables& t, const LayerDims& d, RowMover& m, const float* q, const float* k,
                    const float* v, float* q_send, float* kv_send) {
  const int64_t qf = d.qf, kvf = d.kvf;
  DISTCA_RETURN_IF_ERROR(m.copy(t.pack[idx(ExchangeKind::kQ)], q, {qf, 0, 1}, q_send, {qf, 0, 1}, qf));
  const CopyTable& kv = t.pack[idx(ExchangeKind::kKv)];
  DISTCA_RETURN_IF_ERROR(m.copy(kv, k, {kvf, 0, 1}, kv_send, {2 * kvf, 0, 1}, kvf));
  return m.copy(kv, v, {kvf, 0, 1}, kv_send, {2 * kvf, kvf, 1}, kvf);
}

Status assemble_forward(const RankTables& t, const LayerDims& d, RowMover& m, const float* q, const float* k,
                        const float* v, const float* q_recv, const float* kv_recv, float* fq, float* fk, float* fv) {
  const int64_t qf = d.qf;
  const ServerTables& s = t.server;
  DISTCA_RETURN_IF_ERROR(m.copy(s.q_local, q, {qf, 0, 1}, fq, {qf, 0, 1}, qf));
  DISTCA_RETURN_IF_ERROR(m.copy(s.q_recv, q_recv, {qf, 0, 1}, fq, {qf, 0, 1}, qf));
  return assemble_kv(t, d, m, k, v, kv_recv, fk, fv);
}

Status assemble_kv(const RankTables& t, const LayerDims& d, RowMover& m, const float* k, const float* v,
                   const float* kv_recv, float* fk, float* fv) {
  const int64_t kvf = d.kvf;
  const ServerTables& s = t.server;
  DISTCA_RETURN_IF_ERROR(m.copy(s.kv_local, k, {kvf, 0, 1}, fk, {kvf, 0, 1}, kvf));
  DISTCA_RETURN_IF_ERROR(m.copy(s.kv_local, v, {kvf, 0, 1}, fv, {kvf, 0, 1}, kvf));
  DISTCA_RETURN_IF_ERROR(m.copy(s.kv_recv, kv_recv, {2 * kvf, 0, 1}, fk, {kvf, 0, 1}, kvf));
  return m.copy(s.kv_recv, kv_recv, {2 * kvf, kvf, 1}, fv, {kvf, 0, 1}, kvf);
}

Status scatter_forward(const RankTables& t, const LayerDims& d, RowMover& m, const float* fo, const float* flse,
                       float* o, float* lse, float* olse_send) {
  const int64_t qf = d.qf, H = d.n_heads, of = qf + H, tq = t.fused.cu_q.back();
  const ServerTables& s = t.server;
  const Window fused_lse{1, 0, tq};  // (H, total_q): a row's H values are total_q apart
  DISTCA_RETURN_IF_ERROR(m.copy(s.out_local, fo, {qf, 0, 1}, o, {qf, 0, 1}, qf));
  if (lse != nullptr) DISTCA_RETURN_IF_ERROR(m.copy(s.out_local, flse, fused_lse, lse, {H, 0, 1}, H));
  DISTCA_RETURN_IF_ERROR(m.copy(s.out_send, fo, {qf, 0, 1}, olse_send, {of, 0, 1}, qf));
  return m.copy(s.out_send, flse, fused_lse, olse_send, {of, qf, 1}, H);
}

Status unpack_forward(const RankTables& t, const LayerDims& d, RowMover& m, const float* olse_recv, float* o,
                      float* lse) {
  const int64_t qf = d.qf, H = d.n_heads, of = qf + H;
  const CopyTable& un = t.unpack[idx(ExchangeKind::kOLse)];
  DISTCA_RETURN_IF_ERROR(m.copy(un, olse_recv, {of, 0, 1}, o, {qf, 0, 1}, qf));
  return lse != nullptr ? m.copy(un, olse_recv, {of, qf, 1}, lse, {H, 0, 1}, H) : Status::ok_status();
}

Status pack_backward(const RankTables& t, const LayerDims& d, RowMover& m, bool stateless, const float* d_o,
                     const float* q, const float* o, const float* home_lse, float* do_send) {
  const int64_t qf = d.qf, H = d.n_heads, wf = do_row_floats(d, stateless);
  const CopyTable& pk = t.pack[idx(ExchangeKind::kDO)];
  DISTCA_RETURN_IF_ERROR(m.copy(pk, d_o, {qf, 0, 1}, do_send, {wf, 0, 1}, qf));
  if (!stateless) return Status::ok_status();
  DISTCA_RETURN_IF_ERROR(m.copy(pk, q, {qf, 0, 1}, do_send, {wf, qf, 1}, qf));
  DISTCA_RETURN_IF_ERROR(m.copy(pk, o, {qf, 0, 1}, do_send, {wf, 2 * qf, 1}, qf));
  return m.copy(pk, home_lse, {H, 0, 1}, do_send, {wf, 3 * qf, 1}, H);
}

Status assemble_backward(const RankTables& t, const LayerDims& d, RowMover& m, bool stateless, const float* d_o,
                         const float* q, const float* o, const float* home_lse, const float* do_recv, float* fdo,
                         float* fq, float* fo, float* flse) {
  const int64_t qf = d.qf, H = d.n_heads, wf = do_row_floats(d, stateless), tq = t.fused.cu_q.back();
  const ServerTables& s = t.server;
  DISTCA_RETURN_IF_ERROR(m.copy(s.q_local, d_o, {qf, 0, 1}, fdo, {qf, 0, 1}, qf));
  DISTCA_RETURN_IF_ERROR(m.copy(s.q_recv, do_recv, {wf, 0, 1}, fdo, {qf, 0, 1}, qf));
  if (!stateless) return Status::ok_status();
  const Window fused_lse{1, 0, tq};
  DISTCA_RETURN_IF_ERROR(m.copy(s.q_local, q, {qf, 0, 1}, fq, {qf, 0, 1}, qf));
  DISTCA_RETURN_IF_ERROR(m.copy(s.q_recv, do_recv, {wf, qf, 1}, fq, {qf, 0, 1}, qf));
  DISTCA_RETURN_IF_ERROR(m.copy(s.q_local, o, {qf, 0, 1}, fo, {qf, 0, 1}, qf));
  DISTCA_RETURN_IF_ERROR(m.copy(s.q_recv, do_recv, {wf, 2 * qf, 1}, fo, {qf, 0, 1}, qf));
  DISTCA_RETURN_IF_ERROR(m.copy(s.q_local, home_lse, {H, 0, 1}, flse, fused_lse, H));
  return m.copy(s.q_recv, do_recv, {wf, 3 * qf, 1}, flse, fused_lse, H);
}

Status scatter_dq(const RankTables& t, const LayerDims& d, RowMover& m, const float* fdq, float* dq, float* dq_send) {
  const int64_t qf = d.qf;
  DISTCA_RETURN_IF_ERROR(m.copy(t.server.out_local, fdq, {qf, 0, 1}, dq, {qf, 0, 1}, qf));
  return m.copy(t.server.out_send, fdq, {qf, 0, 1}, dq_send, {qf, 0, 1}, qf);
}

Status unpack_dq(const RankTables& t, const LayerDims& d, RowMover& m, const float* dq_recv, float* dq) {
  return m.copy(t.unpack[idx(ExchangeKind::kDQ)], dq_recv, {d.qf, 0, 1}, dq, {d.qf, 0, 1}, d.qf);
}

Status sum_dkv_server(const RankTables& t, const LayerDims& d, RowMover& m, const float* fdk, const float* fdv,
                      float* dkv_send, float* home_dk, float* home_dv) {
  const int64_t kvf = d.kvf;
  const ServerTables& s = t.server;
  DISTCA_RETURN_IF_ERROR(m.gather_add(s.dkv_send, fdk, {kvf, 0, 1}, dkv_send, {2 * kvf, 0, 1}, kvf));
  DISTCA_RETURN_IF_ERROR(m.gather_add(s.dkv_send, fdv, {kvf, 0, 1}, dkv_send, {2 * kvf, kvf, 1}, kvf));
  DISTCA_RETURN_IF_ERROR(m.gather_add(s.dkv_home, fdk, {kvf, 0, 1}, home_dk, {kvf, 0, 1}, kvf));
  return m.gather_add(s.dkv_home, fdv, {kvf, 0, 1}, home_dv, {kvf, 0, 1}, kvf);
}

Status sum_dkv_home(const RankTables& t, const LayerDims& d, RowMover& m, const float* dkv_recv, float* acc_dk,
                    float* acc_dv) {
  const int64_t kvf = d.kvf;
  DISTCA_RETURN_IF_ERROR(m.gather_add(t.dkv_add, dkv_recv, {2 * kvf, 0, 1}, acc_dk, {kvf, 0, 1}, kvf));
  return m.gather_add(t.dkv_add, dkv_recv, {2 * kvf, kvf, 1}, acc_dv, {kvf, 0, 1}, kvf);
}

}  // namespace distca::runtime::device
