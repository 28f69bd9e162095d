// Builds a Plan from a Schedule (the layouts and their canonical order are defined in plan.h).
#include "distca/plan/plan.h"
#include "distca/plan/topology_relay.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <utility>
#include <vector>

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

// Appends a segment, merging it into the previous one when the rows are consecutive.
void push_segment(SegmentList& segs, Segment s) {
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

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point& t) {
  const Clock::time_point now = Clock::now();
  const double s = std::chrono::duration<double>(now - t).count();
  t = now;
  return s;
}

Exchange& exchange_of(Plan& plan, int64_t r, ExchangeKind k) {
  return plan.ranks[static_cast<size_t>(r)].exchanges[static_cast<size_t>(k)];
}

// The document slot of every task, grouped by server: task j of server s (schedule order)
// has slot[start[s] + j].
struct TaskGroups {
  std::vector<size_t> start;  // [ranks + 1]
  std::vector<int64_t> slot;  // [tasks]
};

// Step 1: every task checked against the batch (the first bad one in schedule order is
// named), then appended to its server in schedule order, each server's list sized once.
Status assign_tasks(const Schedule& schedule, const DocumentIndex& index, Plan& plan, TaskGroups& g) {
  const int64_t R = index.ranks();
  const size_t n = schedule.tasks.size();
  std::vector<int64_t> slot_in_order(n);
  g.slot.resize(n);
  g.start.assign(static_cast<size_t>(R) + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const TaskPlacement& t = schedule.tasks[i];
    const int64_t slot = index.slot(t.doc);
    if (slot < 0) return Status::invalid_argument(task_ctx(i, t) + ": unknown document");
    if (t.q_begin < 0 || t.q_begin >= t.q_end || t.q_end > index.slot_len(slot)) {
      return Status::invalid_argument(task_ctx(i, t) + ": query rows outside the document or empty");
    }
    if (t.home < 0 || t.home >= R || t.server < 0 || t.server >= R) {
      return Status::invalid_argument(task_ctx(i, t) + ": rank out of range");
    }
    const HeldRun& run = index.run_at_slot(slot, t.q_begin);
    if (run.rank != t.home || t.q_end > run.end) {
      return Status::invalid_argument(task_ctx(i, t) + ": query rows not inside one piece held by home");
    }
    slot_in_order[i] = slot;
    ++g.start[static_cast<size_t>(t.server) + 1];
  }
  for (size_t s = 0; s < static_cast<size_t>(R); ++s) {
    plan.servers[s].tasks.reserve(g.start[s + 1]);
    g.start[s + 1] += g.start[s];
  }
  for (size_t i = 0; i < n; ++i) {
    const TaskPlacement& t = schedule.tasks[i];
    auto& tasks = plan.servers[static_cast<size_t>(t.server)].tasks;
    g.slot[g.start[static_cast<size_t>(t.server)] + tasks.size()] = slot_in_order[i];
    tasks.push_back({t, 0, {}});
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

// Scratch of steps 3 and 4, sized once per plan and left ready for the next server, so a
// server costs O(its tasks, blocks and peers), never O(ranks) or O(documents).
struct Scratch {
  Scratch(size_t ranks, size_t slots, size_t runs)
      : peer_rows(ranks, 0), displ_q(ranks, 0), displ_kv(ranks, 0), by_peer(ranks), doc_entry(slots, -1),
        run_row(runs, 0) {}
  std::vector<int64_t> peer_rows;                 // [ranks] rows so far per peer; zero between uses
  std::vector<int64_t> displ_q, displ_kv;         // [ranks] the peer's receive displacement
  std::vector<std::vector<RowBlock>> by_peer;     // [ranks] receive blocks; empty between uses
  std::vector<size_t> peers;                      // the peers touched
  std::vector<int64_t> doc_entry;                 // [slots] index into docs, or -1
  std::vector<std::pair<int64_t, int64_t>> docs;  // (slot, E) in order of first task
  std::vector<int64_t> run_row;                   // [runs] row within the peer's part (kv)
  std::vector<int64_t> q_row;                     // [server's tasks] row within the peer's part
};

// Moves the blocks gathered in s.by_peer into `e`'s receive side in ascending peer order,
// with their counts and displacements (plan.h), and records each peer's displacement.
void emit_receive(Scratch& s, Exchange& e, std::vector<int64_t>& displ) {
  std::sort(s.peers.begin(), s.peers.end());
  int64_t at = 0;
  auto& blocks = e.recv_blocks.entries_mut();
  auto& counts = e.recv_counts.entries_mut();
  auto& displs = e.recv_displs.entries_mut();
  blocks.reserve(s.peers.size());
  counts.reserve(s.peers.size());
  displs.reserve(s.peers.size());
  for (size_t p : s.peers) {
    const int64_t rows = s.peer_rows[p];
    displ[p] = at;
    counts.emplace_back(p, rows);
    displs.emplace_back(p, at);
    blocks.emplace_back(p, std::move(s.by_peer[p]));
    s.by_peer[p] = {};
    s.peer_rows[p] = 0;
    at += rows;
  }
  s.peers.clear();
}

void add_block(Scratch& s, size_t peer, const RowBlock& b) {
  if (s.peer_rows[peer] == 0) s.peers.push_back(peer);
  s.by_peer[peer].push_back(b);
  s.peer_rows[peer] += b.rows();
}

// Step 3, one server: its q blocks (task order) and kv blocks (documents in order of their
// first task, context [0, E) per held run), on both ends of each pair, with the server's
// receive counts and displacements.
void lay_out_server(int64_t s, const DocumentIndex& index, const TaskGroups& g, Plan& plan, Scratch& x) {
  const auto& sp = plan.servers[static_cast<size_t>(s)];
  const size_t first = g.start[static_cast<size_t>(s)];
  x.q_row.resize(sp.tasks.size());
  for (size_t j = 0; j < sp.tasks.size(); ++j) {
    const TaskPlacement& t = sp.tasks[j].task;
    const auto h = static_cast<size_t>(t.home);
    x.q_row[j] = x.peer_rows[h];
    if (t.home == s) continue;
    const RowBlock b{t.doc, t.q_begin, t.q_end};
    add_block(x, h, b);
    exchange_of(plan, t.home, ExchangeKind::kQ).send_blocks.mut(static_cast<size_t>(s)).push_back(b);
  }
  emit_receive(x, exchange_of(plan, s, ExchangeKind::kQ), x.displ_q);
  for (size_t j = 0; j < sp.tasks.size(); ++j) {
    const auto slot = static_cast<size_t>(g.slot[j + first]);
    const int64_t end = sp.tasks[j].task.q_end;
    if (x.doc_entry[slot] < 0) {
      x.doc_entry[slot] = static_cast<int64_t>(x.docs.size());
      x.docs.emplace_back(static_cast<int64_t>(slot), end);
    } else {
      auto& e = x.docs[static_cast<size_t>(x.doc_entry[slot])].second;
      e = std::max(e, end);
    }
  }
  for (const auto& [slot, end] : x.docs) {
    x.doc_entry[static_cast<size_t>(slot)] = -1;
    const int64_t doc = index.doc_ids()[static_cast<size_t>(slot)];
    const auto runs = index.slot_runs(slot);
    const size_t run0 = index.first_run(slot);
    for (size_t i = 0; i < runs.size(); ++i) {
      const HeldRun& run = runs[i];
      if (run.begin >= end) break;
      if (run.rank == s) continue;
      const RowBlock b{doc, run.begin, std::min(end, run.end)};
      const auto h = static_cast<size_t>(run.rank);
      x.run_row[run0 + i] = x.peer_rows[h];
      add_block(x, h, b);
      exchange_of(plan, run.rank, ExchangeKind::kKv).send_blocks.mut(static_cast<size_t>(s)).push_back(b);
    }
  }
  x.docs.clear();
  emit_receive(x, exchange_of(plan, s, ExchangeKind::kKv), x.displ_kv);
}

// Step 4, one server (right after its layout, while the scratch holds its positions): every
// task's q_offset and kv segments, cu_seqlens and the load. Only peers this server receives
// from are read from x.displ_q / x.displ_kv, and lay_out_server just set those.
Status assign_task_inputs(int64_t s, const DocumentIndex& index, const TaskGroups& g, const AttentionCostModel* cost,
                          Plan& plan, Scratch& x) {
  auto& sp = plan.servers[static_cast<size_t>(s)];
  const size_t first = g.start[static_cast<size_t>(s)];
  const TaskCost task(cost);
  int64_t cq = 0, ck = 0;
  sp.cu_seqlens_q.reserve(sp.tasks.size() + 1);
  sp.cu_seqlens_k.reserve(sp.tasks.size() + 1);
  sp.cu_seqlens_q.push_back(0);
  sp.cu_seqlens_k.push_back(0);
  for (size_t j = 0; j < sp.tasks.size(); ++j) {
    ServerTask& st = sp.tasks[j];
    const TaskPlacement& t = st.task;
    const int64_t slot = g.slot[j + first];
    if (t.home == s) {
      const HeldRun& run = index.run_at_slot(slot, t.q_begin);
      st.q_offset = run.local_row + (t.q_begin - run.begin);
    } else {
      st.q_offset = x.displ_q[static_cast<size_t>(t.home)] + x.q_row[j];
    }
    const auto runs = index.slot_runs(slot);
    const size_t run0 = index.first_run(slot);
    size_t used = 0;
    while (used < runs.size() && runs[used].begin < t.q_end) ++used;
    st.kv.reserve(used);  // in place for up to SegmentList::kInline
    for (size_t i = 0; i < used; ++i) {
      const HeldRun& run = runs[i];
      const int64_t len = std::min(t.q_end, run.end) - run.begin;
      if (run.rank == s) {
        push_segment(st.kv, {false, run.local_row, len});
      } else {
        push_segment(st.kv, {true, x.displ_kv[static_cast<size_t>(run.rank)] + x.run_row[run0 + i], len});
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
    sp.load += task(t.q_end - t.q_begin, t.q_end);
  }
  return Status::ok_status();
}

// Step 5: the send sides of q and kv get their counts; o_lse and dq are q reversed, do is
// q, dkv is kv reversed (blocks, counts and displacements copied: they are the same
// function of the same blocks).
void mirror_exchanges(Plan& plan) {
  for (auto& rp : plan.ranks) {
    auto& x = rp.exchanges;
    Exchange& q = x[static_cast<size_t>(ExchangeKind::kQ)];
    Exchange& kv = x[static_cast<size_t>(ExchangeKind::kKv)];
    fill_direction(q.send_blocks, q.send_counts, q.send_displs);
    fill_direction(kv.send_blocks, kv.send_counts, kv.send_displs);
    auto copy = [](const Exchange& from, bool from_send, Exchange& to, bool to_send) {
      (to_send ? to.send_blocks : to.recv_blocks) = from_send ? from.send_blocks : from.recv_blocks;
      (to_send ? to.send_counts : to.recv_counts) = from_send ? from.send_counts : from.recv_counts;
      (to_send ? to.send_displs : to.recv_displs) = from_send ? from.send_displs : from.recv_displs;
    };
    for (ExchangeKind k : {ExchangeKind::kOLse, ExchangeKind::kDQ}) {
      copy(q, false, x[static_cast<size_t>(k)], true);
      copy(q, true, x[static_cast<size_t>(k)], false);
    }
    copy(q, true, x[static_cast<size_t>(ExchangeKind::kDO)], true);
    copy(q, false, x[static_cast<size_t>(ExchangeKind::kDO)], false);
    copy(kv, false, x[static_cast<size_t>(ExchangeKind::kDKv)], true);
    copy(kv, true, x[static_cast<size_t>(ExchangeKind::kDKv)], false);
  }
}

// The exchanges' bytes, read off the layouts: rows sent and received times row bytes. They
// are compute_traffic's figures by construction (the layouts are its rules spelled out, and
// validate_plan checks both the layouts against the tasks and these figures against the
// layouts), at O(ranks + peers) instead of another pass over the tasks.
Traffic layout_traffic(const Plan& plan) {
  Traffic t;
  t.per_rank.assign(plan.ranks.size(), {});
  int64_t* kind_total[kNumExchanges] = {&t.bytes.q, &t.bytes.kv, &t.bytes.o_lse, &t.bytes.d_o, &t.bytes.dq, &t.bytes.dkv};
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    RankBytes& pr = t.per_rank[r];
    for (int k = 0; k < kNumExchanges; ++k) {
      const Exchange& e = plan.ranks[r].exchanges[static_cast<size_t>(k)];
      const int64_t sent = e.send_rows() * e.row_bytes, recv = e.recv_rows() * e.row_bytes;
      *kind_total[k] += sent;
      (k < 3 ? pr.fwd_sent : pr.bwd_sent) += sent;
      (k < 3 ? pr.fwd_recv : pr.bwd_recv) += recv;
    }
  }
  return t;
}

}  // namespace

HostBytes host_bytes(const Plan& plan, const std::vector<int64_t>& hosts) {
  HostBytes h;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    for (int k = 0; k < kNumExchanges; ++k) {
      const Exchange& e = plan.ranks[r].exchanges[static_cast<size_t>(k)];
      for (const auto& [p, rows] : e.send_counts.entries()) {
        const bool inter = !hosts.empty() && hosts[r] != hosts[p];
        (k < 3 ? (inter ? h.inter_fwd : h.intra_fwd) : (inter ? h.inter_bwd : h.intra_bwd)) += rows * e.row_bytes;
      }
    }
  }
  // A relayed K/V block comes from a server of the receiver's own host (topology_relay.h).
  if (plan.ranks.empty()) return h;
  const int64_t kv_row = plan.ranks.front().exchange(ExchangeKind::kKv).row_bytes;
  for (const RelayedBlock& b : kv_relay(plan, hosts)) {
    h.inter_fwd -= b.rows * kv_row;
    h.intra_fwd += b.rows * kv_row;
  }
  return h;
}

namespace {

// Step 6: the reported figures (plan.h, PlanMetrics). A server's load was summed over its
// tasks in schedule order, exactly as server_loads sums them, so it is reused bit for bit.
PlanMetrics compute_metrics(const DocumentIndex& index, const Batch& input,
                            const SchedulerSpec& spec, const RowBytes& rb, const AttentionCostModel* cost,
                            const Plan& plan) {
  const int64_t R = index.ranks();
  PlanMetrics m;
  m.loads.reserve(static_cast<size_t>(R));
  for (const ServerPlan& sp : plan.servers) m.loads.push_back(sp.load);
  m.loads_before = colocated_loads(input, cost);
  std::vector<double> tok;
  m.tokens.reserve(static_cast<size_t>(R));
  tok.reserve(static_cast<size_t>(R));
  for (const RankPlan& rp : plan.ranks) {
    m.tokens.push_back(rp.tokens);
    tok.push_back(static_cast<double>(rp.tokens));
  }
  m.load_max_over_mean = max_over_mean(m.loads);
  m.load_before_max_over_mean = max_over_mean(m.loads_before);
  m.tokens_max_over_mean = max_over_mean(tok);
  m.traffic = layout_traffic(plan);
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
  m.host_bytes = host_bytes(plan, plan.hosts);
  return m;
}

}  // namespace

double PlanPhases::total() const {
  return validate_s + schedule_s + index_s + tasks_s + layouts_s + mirror_s + metrics_s;
}

namespace {

// build_plan's body. `owned`: the schedule's batch, handed over to the plan instead of copied
// (make_plan), or nullptr. `batch_checked`: the caller has validated schedule.batch.
Result<Plan> build(const Schedule& schedule, Batch* owned, bool batch_checked, const Batch& input,
                   const SchedulerSpec& spec, const ScheduleOptions& options, PlanPhases* phases) {
  Clock::time_point t = Clock::now();
  PlanPhases local;
  PlanPhases& ph = phases != nullptr ? *phases : local;
  const Batch& batch = schedule.batch;
  if (!batch_checked) DISTCA_RETURN_IF_ERROR(batch.validate().with_context("plan"));
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
  if (!options.topology.empty()) {
    DISTCA_RETURN_IF_ERROR(options.topology.validate(R));
    plan.hosts = canonical_hosts(options.topology.host);
    plan.inter_host_price = options.topology.inter_host_price;
  }
  plan.servers.assign(n, {});
  plan.ranks.assign(n, {});
  ph.index_s = seconds_since(t);

  TaskGroups groups;
  DISTCA_RETURN_IF_ERROR(assign_tasks(schedule, index, plan, groups));
  init_ranks(batch, plan);
  ph.tasks_s = seconds_since(t);
  Scratch scratch(n, index.doc_ids().size(), index.num_runs());
  for (int64_t s = 0; s < R; ++s) {
    lay_out_server(s, index, groups, plan, scratch);
    DISTCA_RETURN_IF_ERROR(assign_task_inputs(s, index, groups, options.cost, plan, scratch));
  }
  ph.layouts_s = seconds_since(t);
  mirror_exchanges(plan);
  ph.mirror_s = seconds_since(t);
  plan.metrics = compute_metrics(index, input, spec, plan.row_bytes, options.cost, plan);
  if (owned != nullptr) plan.batch = std::move(*owned);
  else plan.batch = batch;
  ph.metrics_s = seconds_since(t);
  return plan;
}

}  // namespace

Result<Plan> build_plan(const Schedule& schedule, const Batch& input, const SchedulerSpec& spec,
                        const ScheduleOptions& options, PlanPhases* phases) {
  return build(schedule, nullptr, false, input, spec, options, phases);
}

Result<Plan> detail::build_plan_from(Schedule&& schedule, const Batch& validated_input, const SchedulerSpec& spec,
                                     const ScheduleOptions& options, PlanPhases* phases) {
  // Equal to a valid batch is valid: a comparison is cheaper than a second validation.
  const bool checked = schedule.batch == validated_input;
  return build(schedule, &schedule.batch, checked, validated_input, spec, options, phases);
}

}  // namespace distca
