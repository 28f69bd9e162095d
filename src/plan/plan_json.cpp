// JSON forms of a plan (plan_json.h; keys documented in docs/plan-format.md).
#include "distca/plan/plan_json.h"
#include "distca/core/stats.h"

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

namespace distca {
namespace {

using nlohmann::json;

json rank_bytes_json(const RankBytes& b) {
  return {{"fwd_sent", b.fwd_sent}, {"fwd_recv", b.fwd_recv}, {"bwd_sent", b.bwd_sent}, {"bwd_recv", b.bwd_recv}};
}

// The dense [ranks] forms the JSON keeps (docs/plan-format.md): an empty list, or a zero
// count, for every peer the sparse layout leaves out.
json blocks_json(const PeerVector<std::vector<RowBlock>>& per_peer) {
  json out = json::array();
  for (size_t p = 0; p < per_peer.size(); ++p) {
    json list = json::array();
    for (const RowBlock& b : per_peer[p]) list.push_back({b.doc, b.begin, b.end});
    out.push_back(std::move(list));
  }
  return out;
}

json counts_json(const PeerVector<int64_t>& counts) { return json(counts.dense()); }

// Displacements as the dense prefix sums of the counts: what an all-to-all-v of [ranks]
// expects, including the (unused) displacement of a peer with no rows.
json displs_json(const PeerVector<int64_t>& counts) {
  json out = json::array();
  int64_t at = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    out.push_back(at);
    at += counts[p];
  }
  return out;
}

}  // namespace

json plan_summary_json(const Plan& plan, double plan_seconds) {
  const PlanMetrics& m = plan.metrics;
  const TrafficBreakdown& t = m.traffic.bytes;
  json s;
  s["scheduler"] = plan.scheduler.name();
  s["tolerance"] = plan.tolerance;
  s["align_rows"] = plan.align_rows;
  s["dtype"] = plan.dtype_bytes == 4 ? "fp32" : "bf16";
  s["cost_unit"] = plan.cost_unit;
  s["ranks"] = plan.batch.ranks;
  s["servers"] = static_cast<int64_t>(plan.servers.size());
  s["tasks"] = plan.num_tasks();
  s["documents"] = plan.batch.num_documents();
  int64_t tokens = 0;
  for (int64_t x : m.tokens) tokens += x;
  s["tokens"] = tokens;
  s["load_max_over_mean"] = m.load_max_over_mean;
  s["load_before_max_over_mean"] = m.load_before_max_over_mean;
  s["tokens_max_over_mean"] = m.tokens_max_over_mean;
  s["comm_bytes_total"] = m.comm_bytes_total;
  s["comm_bytes_backward"] = m.comm_bytes_backward;
  s["comm_bytes_max_rank"] = m.comm_bytes_max_rank;
  s["allgather_bytes"] = m.allgather.bytes;
  if (!plan.hosts.empty()) {
    s["hosts"] = plan.hosts;
    s["inter_host_price"] = plan.inter_host_price;
  }
  s["intra_host_bytes"] = m.host_bytes.intra_fwd;
  s["inter_host_bytes"] = m.host_bytes.inter_fwd;
  s["intra_host_bytes_backward"] = m.host_bytes.intra_bwd;
  s["inter_host_bytes_backward"] = m.host_bytes.inter_bwd;
  s["exchange_bytes"] = {{"q", t.q}, {"kv", t.kv}, {"o_lse", t.o_lse}, {"do", t.d_o}, {"dq", t.dq}, {"dkv", t.dkv}};
  s["plan_seconds"] = plan_seconds;
  json rows = json::array();
  for (size_t r = 0; r < plan.servers.size(); ++r) {
    const RankBytes& b = m.per_rank[r];
    rows.push_back({{"rank", static_cast<int64_t>(r)},
                    {"tokens", m.tokens[r]},
                    {"load_before", m.loads_before[r]},
                    {"load", m.loads[r]},
                    {"tasks", static_cast<int64_t>(plan.servers[r].tasks.size())},
                    {"bytes_out", b.fwd_sent},
                    {"bytes_in", b.fwd_recv},
                    {"bwd_bytes_out", b.bwd_sent},
                    {"bwd_bytes_in", b.bwd_recv}});
  }
  s["per_rank"] = std::move(rows);
  return s;
}

json plan_to_json(const Plan& plan) {
  json p;
  p["scheduler"] = plan.scheduler.name();
  p["tolerance"] = plan.tolerance;
  p["align_rows"] = plan.align_rows;
  p["dtype_bytes"] = plan.dtype_bytes;
  p["cost_unit"] = plan.cost_unit;
  if (!plan.hosts.empty()) {
    p["hosts"] = plan.hosts;
    p["inter_host_price"] = plan.inter_host_price;
  }
  p["row_bytes"] = {{"q", plan.row_bytes.q}, {"kv", plan.row_bytes.kv}, {"o", plan.row_bytes.o}, {"lse", plan.row_bytes.lse}};
  p["batch"] = batch_to_json(plan.batch);
  json servers = json::array();
  for (size_t s = 0; s < plan.servers.size(); ++s) {
    const ServerPlan& sp = plan.servers[s];
    json tasks = json::array();
    for (const ServerTask& st : sp.tasks) {
      json kv = json::array();
      for (const Segment& seg : st.kv) kv.push_back({seg.received ? "recv" : "local", seg.offset, seg.len});
      tasks.push_back({{"doc", st.task.doc},
                       {"q_begin", st.task.q_begin},
                       {"q_end", st.task.q_end},
                       {"home", st.task.home},
                       {"q_offset", st.q_offset},
                       {"kv", std::move(kv)}});
    }
    servers.push_back({{"rank", static_cast<int64_t>(s)},
                       {"load", sp.load},
                       {"cu_seqlens_q", sp.cu_seqlens_q},
                       {"cu_seqlens_k", sp.cu_seqlens_k},
                       {"tasks", std::move(tasks)}});
  }
  p["servers"] = std::move(servers);
  json ranks = json::array();
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankPlan& rp = plan.ranks[r];
    json ex;
    for (int k = 0; k < kNumExchanges; ++k) {
      const Exchange& e = rp.exchanges[static_cast<size_t>(k)];
      ex[exchange_name(static_cast<ExchangeKind>(k))] = {{"row_bytes", e.row_bytes},
                                                        {"send_counts", counts_json(e.send_counts)},
                                                        {"send_displs", displs_json(e.send_counts)},
                                                        {"recv_counts", counts_json(e.recv_counts)},
                                                        {"recv_displs", displs_json(e.recv_counts)},
                                                        {"send_rows", blocks_json(e.send_blocks)},
                                                        {"recv_rows", blocks_json(e.recv_blocks)}};
    }
    ranks.push_back({{"rank", static_cast<int64_t>(r)},
                     {"tokens", rp.tokens},
                     {"bytes", rank_bytes_json(plan.metrics.per_rank[r])},
                     {"exchanges", std::move(ex)}});
  }
  p["ranks"] = std::move(ranks);
  return p;
}

json summarize_batches(const std::vector<json>& summaries) {
  DISTCA_CHECK(!summaries.empty());
  json out;
  const json& first = summaries.front();
  for (const char* key : {"scheduler", "tolerance", "align_rows", "dtype", "cost_unit", "ranks", "hosts",
                          "inter_host_price"}) {
    if (first.contains(key)) out[key] = first[key];
  }
  for (const char* key : {"servers", "tasks", "documents", "tokens", "load_before_max_over_mean",
                          "tokens_max_over_mean", "comm_bytes_total", "comm_bytes_backward",
                          "comm_bytes_max_rank", "allgather_bytes", "intra_host_bytes", "inter_host_bytes",
                          "intra_host_bytes_backward", "inter_host_bytes_backward", "plan_seconds"}) {
    std::vector<double> v;
    for (const json& s : summaries) v.push_back(s[key].get<double>());
    out[key] = median(std::move(v));
  }
  double worst = 0;
  for (const json& s : summaries) worst = std::max(worst, s["load_max_over_mean"].get<double>());
  out["load_max_over_mean"] = worst;
  out["batches"] = static_cast<int64_t>(summaries.size());
  out["per_batch"] = summaries;
  return out;
}

}  // namespace distca
