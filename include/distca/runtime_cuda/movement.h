// The CA dispatcher's copies of one layer on one rank, phase by phase, over a rank's tables
// (row_tables.h), executed by a RowMover: HostMover here (the reference), DeviceMover
// (runtime_cuda/pack.h) on the GPU. The functions fix WHICH table moves WHICH columns of WHICH
// buffer, so a device dispatcher and the tests share one statement of it.
//
// Buffers (floats, row-major, as runtime/dispatcher.h): token buffers q, o: (tokens, qf); k, v,
// dk, dv: (tokens, kvf); lse: (tokens, H). Wire rows: q: qf; kv, dkv: K row then V row (2 kvf);
// o_lse: O row then the H LSE values (qf + H). Fused call: fq, fo: (total_q, qf); fk, fv, fdk,
// fdv: (total_kv, kvf); flse: (H, total_q). qf = H * head_dim, kvf = Hkv * head_dim. Pointers
// are host or device memory as the mover expects; an optional (nullable) output is skipped.
//
// Thread safety: as the mover; the functions hold no state.
#pragma once

#include <cstdint>

#include "distca/core/status.h"
#include "distca/runtime_cuda/row_tables.h"

namespace distca::runtime::device {

class RowMover {
 public:
  virtual ~RowMover() = default;
  // apply_copy / apply_gather_add's contracts; the table must outlive the mover's use of it.
  virtual Status copy(const CopyTable& t, const float* src, const Window& sw, float* dst, const Window& dw,
                      int64_t width) = 0;
  virtual Status gather_add(const GatherAdd& g, const float* src, const Window& sw, float* dst, const Window& dw,
                            int64_t width) = 0;
};

// The host reference: apply_copy / apply_gather_add.
class HostMover final : public RowMover {
 public:
  Status copy(const CopyTable& t, const float* src, const Window& sw, float* dst, const Window& dw,
              int64_t width) override;
  Status gather_add(const GatherAdd& g, const float* src, const Window& sw, float* dst, const Window& dw,
                    int64_t width) override;
};

struct LayerDims {
  int64_t n_heads = 0, qf = 0, kvf = 0;
  static LayerDims of(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
    return {n_heads, n_heads * head_dim, n_kv_heads * head_dim};
  }
};

// Home, start of forward: Q rows into the kQ send buffer, K|V rows into the kKv one.
Status pack_forward(const RankTables& t, const LayerDims& d, RowMover& m, const float* q, const float* k,
                    const float* v, float* q_send, float* kv_send);
// Server: the fused Q, K, V from local rows and the received ones. Rows the tables do not
// name (tile padding) are left as they are: the caller zeroes them.
Status assemble_forward(const RankTables& t, const LayerDims& d, RowMover& m, const float* q, const float* k,
                        const float* v, const float* q_recv, const float* kv_recv, float* fq, float* fk, float* fv);
// Server: fused O and LSE to local homes' rows (o, lse) and into the kOLse send buffer.
Status scatter_forward(const RankTables& t, const LayerDims& d, RowMover& m, const float* fo, const float* flse,
                       float* o, float* lse, float* olse_send);
// Home, end of forward: received O (and LSE) rows into o, lse.
Status unpack_forward(const RankTables& t, const LayerDims& d, RowMover& m, const float* olse_recv, float* o,
                      float* lse);
// Server: the fused K and V alone (assemble_forward's second half; stateless servers run it
// again in backward, after the kKv exchange is repeated).
Status assemble_kv(const RankTables& t, const LayerDims& d, RowMover& m, const float* k, const float* v,
                   const float* kv_recv, float* fk, float* fv);

// Backward wire rows of kDO: dO (qf), or for stateless servers dO | Q | O | LSE (3 qf + H),
// the home's Q and O rows and its (tokens, H) LSE (home_lse).
inline int64_t do_row_floats(const LayerDims& d, bool stateless) { return stateless ? 3 * d.qf + d.n_heads : d.qf; }
// Home, start of backward: dO rows (stateless: with Q, O, LSE; else q, o, home_lse unused and
// may be null) into the kDO send buffer.
Status pack_backward(const RankTables& t, const LayerDims& d, RowMover& m, bool stateless, const float* d_o,
                     const float* q, const float* o, const float* home_lse, float* do_send);
// Server: the fused dO from local rows and received ones; stateless servers also rebuild the
// fused Q, O and LSE (H, total_q) from the same rows (else fq, fo, flse, q, o, home_lse unused).
Status assemble_backward(const RankTables& t, const LayerDims& d, RowMover& m, bool stateless, const float* d_o,
                         const float* q, const float* o, const float* home_lse, const float* do_recv, float* fdo,
                         float* fq, float* fo, float* flse);
// Server: fused dQ rows to local homes' dq and into the kDQ send buffer.
Status scatter_dq(const RankTables& t, const LayerDims& d, RowMover& m, const float* fdq, float* dq, float* dq_send);
// Home: received dQ rows into dq.
Status unpack_dq(const RankTables& t, const LayerDims& d, RowMover& m, const float* dq_recv, float* dq);

// Server, backward: dK/dV partials of the fused call, summed in task order into the kDKv send
// buffer (received rows) and the server's own (tokens, kvf) partials home_dk/home_dv (local
// rows). All three destinations must start at zero, as the CPU dispatcher's do.
Status sum_dkv_server(const RankTables& t, const LayerDims& d, RowMover& m, const float* fdk, const float* fdv,
                      float* dkv_send, float* home_dk, float* home_dv);
// Home, end of backward: the received partials added to acc_dk/acc_dv (holding the server's
// own partials) in ascending rank order.
Status sum_dkv_home(const RankTables& t, const LayerDims& d, RowMover& m, const float* dkv_recv, float* acc_dk,
                    float* acc_dv);

}  // namespace distca::runtime::device
