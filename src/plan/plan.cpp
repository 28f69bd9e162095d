// Builds a Plan from a Schedule (the layouts and their canonical order are defined in plan.h).
#include "distca/plan/plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

namespace distca {
namespace {

std::string task_ctx(size_t i, const TaskPlacement& t) {
  return "plan: task " + std::to_string(i) + " (doc " + std::to_string(t.doc) + ", rows [" +
         std::to_string(t.q_begin) + ", " + std::to_string(t.q_end) + "), home " +
         std::to_string(t.home) + ", server " + std::to_string(t.server) + ")";
}

Exchange empty_exchange(int64_t ranks, int64_t row_bytes) {
  Exchange e;
  e.row_bytes = row_bytes;
  const auto n = static_cast<size_t>(ranks);
  e.send_counts.assign(n, 0);
  e.send_displs.assign(n, 0);
  e.recv_counts.assign(n, 0);
  e.recv_displs.assign(n, 0);
  e.send_blocks.assign(n, {});
  e.recv_blocks.assign(n, {});
  return e;
}

void fill_counts(Exchange& e) {
  int64_t send = 0, recv = 0;
  for (size_t p = 0; p < e.send_blocks.size(); ++p) {
    int64_t s = 0, r = 0;
    for (const RowBlock& b : e.send_blocks[p]) s += b.rows();
    for (const RowBlock& b : e.recv_blocks[p]) r += b.rows();
    e.send_counts[p] = s;
    e.recv_counts[p] = r;
    e.send_displs[p] = send;
    e.recv_displs[p] = recv;
    send += s;
    recv += r;
  }
}

// Appends a segment, merging it into the previous one when the rows are consecutive.
void push_segment(std::vector<Segment>& segs, Segment s) {
  if (!segs.empty() && segs.back().received == s.received &&
      segs.back().offset + segs.back().len == s.offset) {
    segs.back().len += s.len;
  } else {
    segs.push_back(s);
  }
}

}  // namespace

const char* exchange_name(ExchangeKind kind) {
  switch (kind) {
    case ExchangeKind::kQ: return "q";
    case ExchangeKind::kKv: return "kv";
    case ExchangeKind::kOLse: return "o_lse";
    case ExchangeKind::kDO: return "do";
    case ExchangeKind::kDQ: return "dq";
    case ExchangeKind::kDKv: return "dkv";
  }
  return "?";
}

int64_t Exchange::send_rows() const {
  int64_t n = 0;
  for (int64_t c : send_counts) n += c;
  return n;
}

int64_t Exchange::recv_rows() const {
  int64_t n = 0;
  for (int64_t c : recv_counts) n += c;
  return n;
}

int64_t Plan::num_tasks() const {
  int64_t n = 0;
  for (const auto& s : servers) n += static_cast<int64_t>(s.tasks.size());
  return n;
}

std::vector<std::vector<int64_t>> percp_groups(const DocumentIndex& index, int64_t cp_degree) {
  DISTCA_CHECK(cp_degree > 0 && index.ranks() % cp_degree == 0);
  std::vector<std::vector<int64_t>> out;
  for (int64_t id : index.doc_ids()) {
    std::vector<int64_t> g;
    for (const HeldRun& run : index.runs(id)) g.push_back(run.rank / cp_degree);
    std::sort(g.begin(), g.end());
    g.erase(std::unique(g.begin(), g.end()), g.end());
    out.push_back(std::move(g));
  }
  return out;
}

Result<Plan> build_plan(const Schedule& schedule, const Batch& input, const SchedulerSpec& spec,
                        const ScheduleOptions& options) {
  const Batch& batch = schedule.batch;
  DISTCA_RETURN_IF_ERROR(batch.validate().with_context("plan"));
  const DocumentIndex index(batch);
  const int64_t R = batch.ranks;
  const auto n = static_cast<size_t>(R);

  Plan plan;
  plan.scheduler = spec;
  plan.tolerance = options.tolerance;
  plan.align_rows = options.align_rows;
  plan.dtype_bytes = options.dtype_bytes;
  plan.row_bytes = row_bytes(options.model, options.dtype_bytes);
  plan.cost_unit = options.cost != nullptr ? options.cost->unit() : "pairs";
  plan.batch = batch;
  plan.servers.assign(n, {});
  plan.ranks.assign(n, {});
  const RowBytes& rb = plan.row_bytes;

  for (size_t i = 0; i < schedule.tasks.size(); ++i) {
    const TaskPlacement& t = schedule.tasks[i];
    if (!index.contains(t.doc)) return Status::invalid_argument(task_ctx(i, t) + ": unknown document");
    if (t.q_begin < 0 || t.q_begin >= t.q_end || t.q_end > index.doc_len(t.doc)) {
      return Status::invalid_argument(task_ctx(i, t) + ": query rows outside the document or empty");
    }
    if (t.home < 0 || t.home >= R || t.server < 0 || t.server >= R) {
      return Status::invalid_argument(task_ctx(i, t) + ": rank out of range");
    }
    const HeldRun& run = index.run_at(t.doc, t.q_begin);
    if (run.rank != t.home || t.q_end > run.end) {
      return Status::invalid_argument(task_ctx(i, t) + ": query rows not inside one piece held by home");
    }
    plan.servers[static_cast<size_t>(t.server)].tasks.push_back({t, 0, {}});
  }

  for (int64_t r = 0; r < R; ++r) {
    auto& rp = plan.ranks[static_cast<size_t>(r)];
    rp.tokens = batch.rank_tokens(r);
    rp.exchanges[0] = empty_exchange(R, rb.q);
    rp.exchanges[1] = empty_exchange(R, rb.kv);
    rp.exchanges[2] = empty_exchange(R, rb.o + rb.lse);
    rp.exchanges[3] = empty_exchange(R, rb.o);
    rp.exchanges[4] = empty_exchange(R, rb.q);
    rp.exchanges[5] = empty_exchange(R, rb.kv);
  }
  auto ex = [&](int64_t r, ExchangeKind k) -> Exchange& {
    return plan.ranks[static_cast<size_t>(r)].exchanges[static_cast<size_t>(k)];
  };

  // Per server: (doc slot, run begin) -> position of that received run within its peer's
  // kKv list (displacement added once the counts are known). Same for Q per task.
  std::vector<std::map<std::pair<int64_t, int64_t>, int64_t>> kv_pos(n);
  std::vector<std::vector<int64_t>> q_pos(n);
  for (int64_t s = 0; s < R; ++s) {
    auto& sp = plan.servers[static_cast<size_t>(s)];
    std::vector<int64_t> peer_rows_q(n, 0), peer_rows_kv(n, 0);
    // Query blocks, in task order.
    for (const ServerTask& st : sp.tasks) {
      const TaskPlacement& t = st.task;
      q_pos[static_cast<size_t>(s)].push_back(peer_rows_q[static_cast<size_t>(t.home)]);
      if (t.home == s) continue;
      const RowBlock b{t.doc, t.q_begin, t.q_end};
      ex(s, ExchangeKind::kQ).recv_blocks[static_cast<size_t>(t.home)].push_back(b);
      ex(t.home, ExchangeKind::kQ).send_blocks[static_cast<size_t>(s)].push_back(b);
      peer_rows_q[static_cast<size_t>(t.home)] += b.rows();
    }
    // Context blocks: documents in order of their first task here, context [0, E).
    std::vector<std::pair<int64_t, int64_t>> docs;  // (doc, E) in first-appearance order
    std::map<int64_t, size_t> where;
    for (const ServerTask& st : sp.tasks) {
      auto [it, fresh] = where.emplace(st.task.doc, docs.size());
      if (fresh) docs.emplace_back(st.task.doc, st.task.q_end);
      else docs[it->second].second = std::max(docs[it->second].second, st.task.q_end);
    }
    for (const auto& [doc, end] : docs) {
      for (const HeldRun& run : index.runs(doc)) {
        if (run.begin >= end) break;
        if (run.rank == s) continue;
        const RowBlock b{doc, run.begin, std::min(end, run.end)};
        const auto h = static_cast<size_t>(run.rank);
        ex(s, ExchangeKind::kKv).recv_blocks[h].push_back(b);
        ex(run.rank, ExchangeKind::kKv).send_blocks[static_cast<size_t>(s)].push_back(b);
        kv_pos[static_cast<size_t>(s)][{index.slot(doc), run.begin}] = peer_rows_kv[h];
        peer_rows_kv[h] += b.rows();
      }
    }
  }
  // Mirrors: o_lse and dq are q reversed, do is q, dkv is kv reversed.
  for (int64_t r = 0; r < R; ++r) {
    const Exchange& q = ex(r, ExchangeKind::kQ);
    const Exchange& kv = ex(r, ExchangeKind::kKv);
    for (ExchangeKind k : {ExchangeKind::kOLse, ExchangeKind::kDQ}) {
      ex(r, k).send_blocks = q.recv_blocks;
      ex(r, k).recv_blocks = q.send_blocks;
    }
    ex(r, ExchangeKind::kDO).send_blocks = q.send_blocks;
    ex(r, ExchangeKind::kDO).recv_blocks = q.recv_blocks;
    ex(r, ExchangeKind::kDKv).send_blocks = kv.recv_blocks;
    ex(r, ExchangeKind::kDKv).recv_blocks = kv.send_blocks;
    for (auto& e : plan.ranks[static_cast<size_t>(r)].exchanges) fill_counts(e);
  }

  // Task inputs and cu_seqlens.
  for (int64_t s = 0; s < R; ++s) {
    auto& sp = plan.servers[static_cast<size_t>(s)];
    const Exchange& q = ex(s, ExchangeKind::kQ);
    const Exchange& kv = ex(s, ExchangeKind::kKv);
    int64_t cq = 0, ck = 0;
    sp.cu_seqlens_q.push_back(0);
    sp.cu_seqlens_k.push_back(0);
    for (size_t i = 0; i < sp.tasks.size(); ++i) {
      ServerTask& st = sp.tasks[i];
      const TaskPlacement& t = st.task;
      st.q_offset = t.home == s ? index.local_row(s, t.doc, t.q_begin)
                                : q.recv_displs[static_cast<size_t>(t.home)] + q_pos[static_cast<size_t>(s)][i];
      for (const HeldRun& run : index.runs(t.doc)) {
        if (run.begin >= t.q_end) break;
        const int64_t len = std::min(t.q_end, run.end) - run.begin;
        if (run.rank == s) {
          push_segment(st.kv, {false, run.local_row, len});
        } else {
          const int64_t pos = kv_pos[static_cast<size_t>(s)].at({index.slot(t.doc), run.begin});
          push_segment(st.kv, {true, kv.recv_displs[static_cast<size_t>(run.rank)] + pos, len});
        }
      }
      cq += t.q_end - t.q_begin;
      ck += t.q_end;
      if (ck > std::numeric_limits<int32_t>::max()) {
        return Status::invalid_argument("plan: server " + std::to_string(s) +
                                        ": fused call exceeds int32 cu_seqlens_k");
      }
      sp.cu_seqlens_q.push_back(static_cast<int32_t>(cq));
      sp.cu_seqlens_k.push_back(static_cast<int32_t>(ck));
      sp.load += task_cost(options.cost, t.q_end - t.q_begin, t.q_end);
    }
  }

  // Figures.
  PlanMetrics& m = plan.metrics;
  m.loads = server_loads(R, schedule.tasks, options.cost);
  m.loads_before = colocated_loads(input, options.cost);
  std::vector<double> tok;
  for (int64_t r = 0; r < R; ++r) {
    m.tokens.push_back(batch.rank_tokens(r));
    tok.push_back(static_cast<double>(m.tokens.back()));
  }
  m.load_max_over_mean = max_over_mean(m.loads);
  m.load_before_max_over_mean = max_over_mean(m.loads_before);
  m.tokens_max_over_mean = max_over_mean(tok);
  m.traffic = compute_traffic(index, schedule.tasks, rb);
  m.allgather.per_rank.assign(n, {});
  if (spec.kind == SchedulerKind::kPerCp) {
    // What CP moves (plan.h): the loader lays the head-tail shards out, so only the K/V
    // all-gather and the dK/dV reduce-scatter cross ranks.
    m.allgather = compute_allgather(index, spec.cp_degree, percp_groups(index, spec.cp_degree), rb);
    m.comm_bytes_total = m.allgather.bytes;
    m.comm_bytes_backward = m.allgather.bytes;
    m.per_rank = m.allgather.per_rank;
  } else {
    m.comm_bytes_total = m.traffic.bytes.forward();
    m.comm_bytes_backward = m.traffic.bytes.backward();
    m.per_rank = m.traffic.per_rank;
  }
  m.comm_bytes_max_rank = 0;
  for (const auto& r : m.per_rank) m.comm_bytes_max_rank = std::max(m.comm_bytes_max_rank, r.fwd());
  return plan;
}

}  // namespace distca
