// The dispatcher's data movement as tables (include/distca/runtime_cuda/row_tables.h).
#include "distca/runtime_cuda/row_tables.h"

#include <algorithm>
#include <climits>
#include <map>
#include <string>

#include "distca/core/check.h"

namespace distca::runtime::device {
namespace {
size_t sz(int64_t x) { return static_cast<size_t>(x); }
}  // namespace

int64_t table_rows(const CopyTable& t) {
  int64_t n = 0;
  for (const RowRun& r : t) n += r.rows;
  return n;
}

CopyTable inverse(const CopyTable& t) {
  CopyTable out;
  out.reserve(t.size());
  for (const RowRun& r : t) out.push_back({r.dst, r.src, r.rows});
  return out;
}

std::vector<int64_t> expand_pairs(const CopyTable& t) {
  std::vector<int64_t> out;
  out.reserve(sz(2 * table_rows(t)));
  for (const RowRun& r : t) {
    for (int64_t i = 0; i < r.rows; ++i) {
      out.push_back(r.src + i);
      out.push_back(r.dst + i);
    }
  }
  return out;
}

void apply_copy(const CopyTable& t, const float* src, const Window& sw, float* dst, const Window& dw, int64_t width) {
  for (const RowRun& r : t) {
    for (int64_t i = 0; i < r.rows; ++i) {
      const float* s = src + (r.src + i) * sw.row_stride + sw.col;
      float* d = dst + (r.dst + i) * dw.row_stride + dw.col;
      for (int64_t c = 0; c < width; ++c) d[c * dw.col_stride] = s[c * sw.col_stride];
    }
  }
}

GatherAdd make_gather_add(const std::vector<std::pair<int64_t, int64_t>>& contributions) {
  // Destination slots in first-contribution order; sources kept in list order per slot.
  std::map<int64_t, size_t> slot;
  std::vector<std::vector<int64_t>> per;
  GatherAdd g;
  for (const auto& [s, d] : contributions) {
    auto [it, fresh] = slot.emplace(d, per.size());
    if (fresh) {
      per.emplace_back();
      g.dst.push_back(d);
    }
    per[it->second].push_back(s);
  }
  g.offsets.assign(1, 0);
  for (const auto& srcs : per) {
    g.src.insert(g.src.end(), srcs.begin(), srcs.end());
    g.offsets.push_back(static_cast<int64_t>(g.src.size()));
  }
  return g;
}

void apply_gather_add(const GatherAdd& g, const float* src, const Window& sw, float* dst, const Window& dw,
                      int64_t width) {
  for (size_t k = 0; k < g.dst.size(); ++k) {
    float* d = dst + g.dst[k] * dw.row_stride + dw.col;
    for (int64_t j = g.offsets[k]; j < g.offsets[k + 1]; ++j) {
      const float* s = src + g.src[sz(j)] * sw.row_stride + sw.col;
      for (int64_t c = 0; c < width; ++c) d[c * dw.col_stride] += s[c * sw.col_stride];
    }
  }
}

Result<FusedLayout> fused_layout(const Plan& plan, const DocumentIndex& index, int rank, int64_t tile) {
  DISTCA_CHECK(tile >= 1);
  const ServerPlan& sp = plan.servers[sz(rank)];
  FusedLayout f;
  int64_t cq = 0, ck = 0;
  f.cu_q.assign(1, 0);
  f.cu_k.assign(1, 0);
  for (const ServerTask& st : sp.tasks) {
    const TaskPlacement& t = st.task;
    const int64_t a0 = (t.q_begin / tile) * tile;
    const int64_t b1 = std::min(index.doc_len(t.doc), (t.q_end + tile - 1) / tile * tile);
    f.q_row.push_back(cq + (t.q_begin - a0));
    f.pad_rows += (b1 - a0) - (t.q_end - t.q_begin);
    cq += b1 - a0;
    ck += b1;
    if (cq > INT32_MAX || ck > INT32_MAX) {
      return Status::invalid_argument("plan: fused call of server " + std::to_string(rank) + " exceeds int32 rows");
    }
    f.cu_q.push_back(static_cast<int32_t>(cq));
    f.cu_k.push_back(static_cast<int32_t>(ck));
  }
  return f;
}

CopyTable home_rows(const DocumentIndex& index, int rank, const PeerVector<std::vector<RowBlock>>& blocks,
                    const PeerVector<int64_t>& displs) {
  CopyTable t;
  for (const auto& [p, peer_blocks] : blocks.entries()) {
    int64_t w = displs[p];
    for (const RowBlock& b : peer_blocks) {
      const int64_t l = index.local_row(rank, b.doc, b.begin);
      DISTCA_CHECK_MSG(l >= 0, "plan block not held by this rank");
      if (b.rows() > 0) t.push_back({l, w, b.rows()});
      w += b.rows();
    }
  }
  return t;
}

ServerTables server_tables(const Plan& plan, int rank, const FusedLayout& fused) {
  const ServerPlan& sp = plan.servers[sz(rank)];
  ServerTables s;
  std::vector<std::pair<int64_t, int64_t>> to_send, to_home;  // (fused context row, dst row)
  for (size_t t = 0; t < sp.tasks.size(); ++t) {
    const ServerTask& st = sp.tasks[t];
    const int64_t ql = st.task.q_end - st.task.q_begin, q0 = fused.q_row[t];
    if (ql > 0) (st.task.home == rank ? s.q_local : s.q_recv).push_back({st.q_offset, q0, ql});
    int64_t row = fused.cu_k[t];
    for (const Segment& seg : st.kv) {
      if (seg.len <= 0) continue;
      (seg.received ? s.kv_recv : s.kv_local).push_back({seg.offset, row, seg.len});
      for (int64_t i = 0; i < seg.len; ++i) (seg.received ? to_send : to_home).emplace_back(row + i, seg.offset + i);
      row += seg.len;
    }
  }
  s.out_local = inverse(s.q_local);
  s.out_send = inverse(s.q_recv);
  s.dkv_send = make_gather_add(to_send);
  s.dkv_home = make_gather_add(to_home);
  return s;
}

GatherAdd home_dkv_add(const DocumentIndex& index, int rank, const Exchange& dkv) {
  std::vector<std::pair<int64_t, int64_t>> c;  // (wire row, local row)
  for (const RowRun& r : home_rows(index, rank, dkv.recv_blocks, dkv.recv_displs)) {
    for (int64_t i = 0; i < r.rows; ++i) c.emplace_back(r.dst + i, r.src + i);
  }
  return make_gather_add(c);
}

Result<RankTables> rank_tables(const Plan& plan, const DocumentIndex& index, int rank, int64_t tile) {
  RankTables t;
  DISTCA_ASSIGN_OR_RETURN(t.fused, fused_layout(plan, index, rank, tile));
  const RankPlan& rp = plan.ranks[sz(rank)];
  // Only the directions whose blocks name this rank's own rows: homes send kQ, kKv, kDO and
  // receive kOLse, kDQ (kDKv is summed, not copied); the other blocks name the peer's rows.
  for (ExchangeKind k : {ExchangeKind::kQ, ExchangeKind::kKv, ExchangeKind::kDO}) {
    const Exchange& x = rp.exchange(k);
    t.pack[static_cast<size_t>(k)] = home_rows(index, rank, x.send_blocks, x.send_displs);
  }
  for (ExchangeKind k : {ExchangeKind::kOLse, ExchangeKind::kDQ}) {
    const Exchange& x = rp.exchange(k);
    t.unpack[static_cast<size_t>(k)] = inverse(home_rows(index, rank, x.recv_blocks, x.recv_displs));
  }
  t.dkv_add = home_dkv_add(index, rank, rp.exchange(ExchangeKind::kDKv));
  t.server = server_tables(plan, rank, t.fused);
  return t;
}

}  // namespace distca::runtime::device
