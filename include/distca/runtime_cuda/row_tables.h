// What the dispatcher's data movement copies, as tables a device kernel can run: the host
// side of the CA dispatcher on the GPU (runtime/dispatcher.h describes the movement; this file
// says it row by row). Plain C++, built and tested in every configuration; the kernels that
// run the tables are in runtime_cuda/pack.h (DISTCA_CUDA=ON), and apply_copy / apply_gather_add
// below are their host references (the GPU tests compare bitwise against them).
//
// Two kinds of table:
//   CopyTable   runs of consecutive rows: dst rows [dst, dst + rows) <- src rows [src, ...).
//               With a Window per side (which columns of a row, how rows and columns are
//               strided), one table covers each copy of the dispatcher: pack a home's rows
//               into a send buffer, unpack a receive buffer, assemble the fused call's
//               inputs, scatter its outputs. Each destination row is written at most once.
//   GatherAdd   for each destination row, its source rows in a fixed order: dst[d] +=
//               src[s_1]; dst[d] += src[s_2]; ... exactly in the order the CPU dispatcher
//               adds them (a server's dK/dV partials in task order; a home's received
//               partials in ascending rank order), so the float sums are bitwise the CPU's.
//
// Buffers: row r of a buffer starts at element r * row_stride; column c of it at offset
// col + c * col_stride (col_stride 1 for the row-major (rows, floats) buffers; the fused call's
// LSE is (n_heads, total_q): row_stride 1, col_stride total_q).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "distca/plan/doc_index.h"
#include "distca/plan/plan.h"
#include "distca/runtime_cuda/window.h"

namespace distca::runtime::device {

struct RowRun {
  int64_t src = 0;
  int64_t dst = 0;
  int64_t rows = 0;
  bool operator==(const RowRun&) const = default;
};


using CopyTable = std::vector<RowRun>;

int64_t table_rows(const CopyTable& t);
// The table with every run's src and dst swapped (pack <-> unpack of the same layout).
CopyTable inverse(const CopyTable& t);
// One (src row, dst row) pair per row, run order: the device form (a thread block per pair).
std::vector<int64_t> expand_pairs(const CopyTable& t);  // [2 * table_rows]: src0, dst0, src1, ...

// dst(row d, col c) = src(row s, col c) for every pair of t and c < width.
void apply_copy(const CopyTable& t, const float* src, const Window& sw, float* dst, const Window& dw, int64_t width);

struct GatherAdd {
  std::vector<int64_t> dst;      // destination rows, each once, in first-contribution order
  std::vector<int64_t> offsets;  // [dst.size() + 1] CSR offsets into src
  std::vector<int64_t> src;      // source rows, per destination in addition order
  bool operator==(const GatherAdd&) const = default;
};

// Builds the CSR from (src row, dst row) contributions listed in addition order.
GatherAdd make_gather_add(const std::vector<std::pair<int64_t, int64_t>>& contributions);
// For every destination d: dst(d, c) += src(s, c) for its sources in order, c < width.
void apply_gather_add(const GatherAdd& g, const float* src, const Window& sw, float* dst, const Window& dw, int64_t width);

// The fused call of a server as the dispatcher runs it: tasks padded to whole query tiles
// (CaDispatcher::align_tasks; runtime/dispatcher.h, query_tile_rows). q_row[t]: fused row of
// the task's first query row. cu_q / cu_k: [tasks + 1].
struct FusedLayout {
  std::vector<int32_t> cu_q, cu_k;
  std::vector<int64_t> q_row;
  int64_t pad_rows = 0;
};
// Errors: a fused call over int32 rows (as the dispatcher). Precondition: tile >= 1.
Result<FusedLayout> fused_layout(const Plan& plan, const DocumentIndex& index, int rank, int64_t tile);

// A home's rows of an exchange: local row -> wire row, peers ascending, blocks in order (the
// dispatcher's for_rows). Pack = this table (src: token buffer, dst: send buffer) over the
// send blocks; unpack = inverse of it over the receive blocks.
CopyTable home_rows(const DocumentIndex& index, int rank, const PeerVector<std::vector<RowBlock>>& blocks,
                    const PeerVector<int64_t>& displs);

// A server's tables (one server = one rank of the plan), from its plan and fused layout:
struct ServerTables {
  // Query rows into the fused Q (and dO): from the token buffer (local homes) / the kQ (kDO)
  // receive buffer; fused row = dst.
  CopyTable q_local, q_recv;
  // Context rows into the fused K and V: from the token buffer / the kKv receive buffer.
  CopyTable kv_local, kv_recv;
  // Fused output rows (O, LSE, dQ) to the token buffer (local homes) / the kOLse (kDQ) send
  // buffer: src = fused row. The inverse of q_local / q_recv.
  CopyTable out_local, out_send;
  // dK / dV partials: fused context row -> the kDKv send buffer (received rows) / the server's
  // own (n_tokens) partial (local rows), in task order.
  GatherAdd dkv_send, dkv_home;
};
ServerTables server_tables(const Plan& plan, int rank, const FusedLayout& fused);

// The home's sum of received dK/dV partials: kDKv receive row -> token row, in the
// dispatcher's order (ascending peers, blocks in order).
GatherAdd home_dkv_add(const DocumentIndex& index, int rank, const Exchange& dkv);

// Every table one rank needs for a layer of `plan` (what a device dispatcher uploads once per
// plan). Home side, indexed by exchange kind: `pack[k]` (token rows -> send rows, over the send
// blocks) for kQ, kKv, kDO and `unpack[k]` (receive rows -> token rows, over the receive
// blocks) for kOLse, kDQ, the others empty (their blocks name the peer's rows); `dkv_add` sums
// the received dK/dV partials.
// Server side: `server` over `fused`. Errors: fused_layout's.
struct RankTables {
  FusedLayout fused;
  std::array<CopyTable, kNumExchanges> pack, unpack;
  GatherAdd dkv_add;
  ServerTables server;
};
Result<RankTables> rank_tables(const Plan& plan, const DocumentIndex& index, int rank, int64_t tile);

}  // namespace distca::runtime::device
