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
  e.send_counts = PeerVector<int64_t>(n);
  e.send_displs = PeerVector<int64_t>(n);
  e.recv_counts = PeerVector<int64_t>(n);
  e.recv_displs = PeerVector<int64_t>(n);
  e.send_blocks = PeerVector<std::vector<RowBlock>>(n);
  e.recv_blocks = PeerVector<std::vector<RowBlock>>(n);
  return e;
}

// Counts and displacements of one direction from its blocks: only the peers with rows get
// entries (the sparse layout of plan.h).
void fill_direction(const PeerVector<std::vector<RowBlock>>& blocks, PeerVector<int64_t>& counts,
                    PeerVector<int64_t>& displs) {
  int64_t at = 0;
  for (const auto& [p, list] : blocks.entries()) {
    int64_t rows = 0;
    for (const RowBlock& b : list) rows += b.rows();
    if (rows == 0) continue;
    counts.mut(p) = rows;
    displs.mut(p) = at;
    at += rows;
  }
}

void fill_counts(Exchange& e) {
  fill_direction(e.send_blocks, e.send_counts, e.send_displs);
  fill_direction(e.recv_blocks, e.recv_counts, e.recv_displs);
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
  for (const auto& [p, c] : send_counts.entries()) n += c;
  return n;
}

int64_t Exchange::recv_rows() const {
  int64_t n = 0;
  for (const auto& [p, c] : recv_counts.entries()) n += c;
  return n;
}

int64_t Plan::num_tasks() const {
  int64_t n = 0;
  for (const auto& s : servers) n += static_cast<int64_t>(s.tasks.size());
  return n;
}

PlanSize plan_size(const Schedule& schedule) {
  const DocumentIndex index(schedule.batch);
  PlanSize size;
  std::map<std::pair<int64_t, int64_t>, int64_t> context;  // (server, doc) -> E
  for (const TaskPlacement& t : schedule.tasks) {
    ++size.tasks;
    if (t.home != t.server) ++size.q_blocks;
    if (!index.contains(t.doc)) continue;
    int64_t& e = context[{t.server, t.doc}];
    e = std::max(e, t.q_end);
  }
  for (const auto& [key, end] : context) {
    for (const HeldRun& run : index.runs(key.second)) {
      if (run.begin >= end) break;
      if (run.rank != key.first) ++size.kv_blocks;
    }
  }
  return size;
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

namespace {

Exchange& exchange_of(Plan& plan, int64_t r, ExchangeKind k) {
  return plan.ranks[static_cast<size_t>(r)].exchanges[static_cast<size_t>(k)];
}

// Step 1: every task checked against the batch and appended to its server, in schedule order.
Status assign_tasks(const Schedule& schedule, const DocumentIndex& index, Plan& plan) {
  const int64_t R = index.ranks();
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
  return Status::ok_status();
}

// Step 2: every rank's token count and six empty exchanges with their row sizes.
void init_ranks(const Batch& batch, Plan& plan) {
  const RowBytes& rb = plan.row_bytes;
  const int64_t kRowBytes[kNumExchanges] = {rb.q, rb.kv, rb.o + rb.lse, rb.o, rb.q, rb.kv};
  for (int64_t r = 0; r < batch.ranks; ++r) {
    auto& rp = plan.ranks[static_cast<size_t>(r)];
    rp.tokens = batch.rank_tokens(r);
    for (int k = 0; k < kNumExchanges; ++k) rp.exchanges[static_cast<size_t>(k)] = empty_exchange(batch.ranks, kRowBytes[k]);
  }
}

// Where a server's received rows sit within their peer's part of the receive buffer (the
// peer's displacement is added once the counts are known).
struct ReceivePositions {
  std::vector<int64_t> q;                                  // [task]
  std::map<std::pair<int64_t, int64_t>, int64_t> kv;       // (doc slot, run begin) -> row
};

// Step 3, one server: its q blocks (task order) and kv blocks (documents in order of their
// first task, context [0, E) per held run), on both ends of each pair. `peer_rows` is a
// [ranks] scratch vector of zeros, left zeroed.
ReceivePositions lay_out_server(int64_t s, const DocumentIndex& index, Plan& plan, std::vector<int64_t>& peer_rows) {
  ReceivePositions pos;
  const auto& sp = plan.servers[static_cast<size_t>(s)];
  std::vector<size_t> touched;
  auto bump = [&](size_t peer, int64_t rows) {
    if (peer_rows[peer] == 0) touched.push_back(peer);
    peer_rows[peer] += rows;
  };
  auto reset = [&] {
    for (size_t p : touched) peer_rows[p] = 0;
    touched.clear();
  };
  for (const ServerTask& st : sp.tasks) {
    const TaskPlacement& t = st.task;
    pos.q.push_back(peer_rows[static_cast<size_t>(t.home)]);
    if (t.home == s) continue;
    const RowBlock b{t.doc, t.q_begin, t.q_end};
    exchange_of(plan, s, ExchangeKind::kQ).recv_blocks.mut(static_cast<size_t>(t.home)).push_back(b);
    exchange_of(plan, t.home, ExchangeKind::kQ).send_blocks.mut(static_cast<size_t>(s)).push_back(b);
    bump(static_cast<size_t>(t.home), b.rows());
  }
  reset();
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
      exchange_of(plan, s, ExchangeKind::kKv).recv_blocks.mut(h).push_back(b);
      exchange_of(plan, run.rank, ExchangeKind::kKv).send_blocks.mut(static_cast<size_t>(s)).push_back(b);
      pos.kv[{index.slot(doc), run.begin}] = peer_rows[h];
      bump(h, b.rows());
    }
  }
  reset();
  return pos;
}

// Step 4: o_lse and dq are q reversed, do is q, dkv is kv reversed; then counts and
// displacements from the blocks.
void mirror_exchanges(Plan& plan) {
  for (auto& rp : plan.ranks) {
    auto& x = rp.exchanges;
    const Exchange& q = x[static_cast<size_t>(ExchangeKind::kQ)];
    const Exchange& kv = x[static_cast<size_t>(ExchangeKind::kKv)];
    for (ExchangeKind k : {ExchangeKind::kOLse, ExchangeKind::kDQ}) {
      x[static_cast<size_t>(k)].send_blocks = q.recv_blocks;
      x[static_cast<size_t>(k)].recv_blocks = q.send_blocks;
    }
    x[static_cast<size_t>(ExchangeKind::kDO)].send_blocks = q.send_blocks;
    x[static_cast<size_t>(ExchangeKind::kDO)].recv_blocks = q.recv_blocks;
    x[static_cast<size_t>(ExchangeKind::kDKv)].send_blocks = kv.recv_blocks;
    x[static_cast<size_t>(ExchangeKind::kDKv)].recv_blocks = kv.send_blocks;
    for (auto& e : x) fill_counts(e);
  }
}

// Step 5, one server: every task's q_offset and kv segments, cu_seqlens and the load.
Status assign_task_inputs(int64_t s, const DocumentIndex& index, const ReceivePositions& pos,
                          const AttentionCostModel* cost, Plan& plan) {
  auto& sp = plan.servers[static_cast<size_t>(s)];
  const Exchange& q = exchange_of(plan, s, ExchangeKind::kQ);
  const Exchange& kv = exchange_of(plan, s, ExchangeKind::kKv);
  int64_t cq = 0, ck = 0;
  sp.cu_seqlens_q.push_back(0);
  sp.cu_seqlens_k.push_back(0);
  for (size_t i = 0; i < sp.tasks.size(); ++i) {
    ServerTask& st = sp.tasks[i];
    const TaskPlacement& t = st.task;
    st.q_offset = t.home == s ? index.local_row(s, t.doc, t.q_begin)
                              : q.recv_displs[static_cast<size_t>(t.home)] + pos.q[i];
    for (const HeldRun& run : index.runs(t.doc)) {
      if (run.begin >= t.q_end) break;
      const int64_t len = std::min(t.q_end, run.end) - run.begin;
      if (run.rank == s) {
        push_segment(st.kv, {false, run.local_row, len});
      } else {
        const int64_t at = pos.kv.at({index.slot(t.doc), run.begin});
        push_segment(st.kv, {true, kv.recv_displs[static_cast<size_t>(run.rank)] + at, len});
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
    sp.load += task_cost(cost, t.q_end - t.q_begin, t.q_end);
  }
  return Status::ok_status();
}

// Step 6: the reported figures (plan.h, PlanMetrics).
PlanMetrics compute_metrics(const Schedule& schedule, const DocumentIndex& index, const Batch& input,
                            const SchedulerSpec& spec, const ScheduleOptions& options, const RowBytes& rb) {
  const Batch& batch = schedule.batch;
  const int64_t R = batch.ranks;
  PlanMetrics m;
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
  m.allgather.per_rank.assign(static_cast<size_t>(R), {});
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
  return m;
}

}  // namespace

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

  DISTCA_RETURN_IF_ERROR(assign_tasks(schedule, index, plan));
  init_ranks(batch, plan);
  std::vector<ReceivePositions> positions(n);
  std::vector<int64_t> peer_rows(n, 0);
  for (int64_t s = 0; s < R; ++s) positions[static_cast<size_t>(s)] = lay_out_server(s, index, plan, peer_rows);
  mirror_exchanges(plan);
  for (int64_t s = 0; s < R; ++s) {
    DISTCA_RETURN_IF_ERROR(assign_task_inputs(s, index, positions[static_cast<size_t>(s)], options.cost, plan));
  }
  plan.metrics = compute_metrics(schedule, index, input, spec, options, plan.row_bytes);
  return plan;
}

}  // namespace distca
