// Cost rates, the unit attention cost, the recorder and the memory model (engine.h;
// docs/simulation-model.md has the formulas and the reasons).
#include <algorithm>
#include <cstdio>

#include "distca/plan/auto_tolerance.h"
#include "engine.h"

namespace distca::sim::detail {

UnitAttentionCost::UnitAttentionCost(const SimOptions& o)
    : model_(o.model),
      unit_flops_(static_cast<double>(o.cluster.gpus_per_node) * o.cluster.hw.peak_flops * o.attention_efficiency),
      tile_(o.attention_tile),
      table_(o.attention_table) {
  seconds_per_pair_ = attention_forward_flops(model_, 1.0) / unit_flops_ * (1.0 + kAttentionBackwardFactor);
  if (table_ == nullptr && o.hardware_profile != nullptr) {
    profile_table_ = std::make_shared<const ProfiledCostModel>(o.hardware_profile->attention_total());
    table_ = profile_table_.get();
  }
  if (table_ != nullptr) {
    const CostTable& t = table_->table();
    const double model_per_pair = static_cast<double>(model_.n_heads * model_.head_dim);
    const double table_per_pair = static_cast<double>(t.n_heads * t.head_dim);
    table_scale_ = model_per_pair / table_per_pair / static_cast<double>(o.cluster.gpus_per_node);
  }
}

double UnitAttentionCost::table_seconds(int64_t q_len, int64_t kv_len) const {
  return table_->task_cost(q_len, kv_len) * table_scale_;
}

Rates::Rates(const SimOptions& opt) : o(opt), cost(opt) {
  const ModelSpec& m = o.model;
  gpus_per_unit = o.cluster.gpus_per_node;
  units = o.cluster.units();
  units_per_stage = o.cluster.units_per_stage();
  pp = o.cluster.pp;
  const double unit_peak = static_cast<double>(gpus_per_unit) * o.cluster.hw.peak_flops * o.mfu;
  linear_fwd_per_token = linear_forward_flops_per_token(m) / unit_peak;
  linear_bwd_per_token = linear_fwd_per_token * (o.activation_checkpointing ? 3.0 : 2.0);
  const double pre = 2.0 * static_cast<double>(m.hidden) * static_cast<double>(m.q_dim() + 2 * m.kv_dim());
  pre_share = pre / linear_forward_flops_per_token(m);
  lm_head_fwd_per_token = o.lm_head ? lm_head_forward_flops_per_token(m) / unit_peak : 0.0;
  lm_head_bwd_per_token = 2.0 * lm_head_fwd_per_token;
  exchange = Link{static_cast<double>(gpus_per_unit) * o.cluster.hw.inter_node_bw, o.cluster.hw.inter_node_latency};
  p2p_link = exchange;
  const auto price = static_cast<double>(o.topology.inter_host_price);
  cad_links = {exchange.bytes_per_second, exchange.bytes_per_second * price, exchange.latency};
  unit_hosts = o.topology.host;
  tp_link = Link{o.cluster.hw.intra_node_bw, o.cluster.hw.intra_node_latency};
  tp_explicit = gpus_per_unit > 1 && (o.tp_collectives || o.hardware_profile != nullptr);
  host = host_model(o).value();  // simulate() checked it
  if (o.hardware_profile != nullptr) apply_hardware_profile(*o.hardware_profile);
  if (o.tolerance_auto) {  // validate() checked the profile and the strategy
    std::unique_ptr<AttentionCostModel> table;
    const bool overlap = o.strategy.cad_mode != CadMode::kSingleStream;
    auto m = auto_tolerance_model(*o.hardware_profile, o.topology, overlap, &table);
    DISTCA_CHECK_MSG(m.ok(), m.status().to_string().c_str());
    auto_table = std::move(table);
    auto_model = std::make_shared<const AutoToleranceModel>(*m);
  }
  row_bytes = distca::row_bytes(m, o.dtype_bytes);
  stage_layers.assign(static_cast<size_t>(pp), m.n_layers / pp);
  for (int64_t s = 0; s < m.n_layers % pp; ++s) ++stage_layers[static_cast<size_t>(s)];
}

void Rates::apply_hardware_profile(const HardwareProfile& hp) {
  const ModelSpec& m = o.model;
  const double G = static_cast<double>(gpus_per_unit);
  // All ranks compute at once when there are several, the G ranks of one unit included (the
  // profile's concurrent figures, taken with every rank of its run computing); a lone rank
  // runs alone. Under processor sharing the concurrent figures are the base rates whatever the
  // units (sharing.h rescales them).
  const bool concurrent = units * gpus_per_unit > 1 || host.active();
  const ProfileShape shape{m.hidden, m.n_heads, m.n_kv_heads, m.head_dim, m.ffn, m.vocab, 1};
  // Seconds per token of (layer, pass) at the model's shapes: its FLOPs per row / the rate
  // measured for that product (the same rate whatever the row count; the profile's rows set
  // the rate's blocking).
  auto per_token = [&](const char* layer, GemmPass pass) {
    const auto [in, out] = shape.in_out(layer);
    const double flops = 2.0 * static_cast<double>(in) * static_cast<double>(out);
    return flops / (G * hp.gemm_rate(layer, pass, concurrent));
  };
  double fwd = 0, bwd = 0, pre = 0;
  for (size_t i = 0; i + 1 < kProfileLayerCount; ++i) {  // the layer's seven; the LM head below
    const char* layer = kProfileLayers[i];
    const double f = per_token(layer, GemmPass::kForward);
    fwd += f;
    if (i < 3) pre += f;  // Q, K, V: the pre-attention part
    bwd += per_token(layer, GemmPass::kBackwardData) + per_token(layer, GemmPass::kBackwardWeight);
  }
  // The element-wise work between the GEMMs (profile_elementwise.h), when measured: per token
  // of a layer into its linear work (the pre-attention share stays the GEMMs'), the final
  // norm and loss into the LM head's, the optimizer per parameter after the all-reduce.
  double ew_fwd = 0, ew_bwd = 0, loss_fwd = 0, loss_bwd = 0;
  if (hp.elementwise) {
    const ElementwiseProfile& e = *hp.elementwise;
    ew_fwd = e.layer_forward.get(concurrent) / G;
    ew_bwd = e.layer_backward.get(concurrent) / G;
    loss_fwd = e.loss_forward.get(concurrent) / G;
    loss_bwd = e.loss_backward.get(concurrent) / G;
    optimizer_per_param = e.optimizer.get(concurrent) / G;
  }
  pre_share = pre / fwd;
  fwd += ew_fwd;
  bwd += ew_bwd;
  linear_fwd_per_token = fwd;
  linear_bwd_per_token = bwd + (o.activation_checkpointing ? fwd : 0.0);  // + the recomputed forward
  lm_head_fwd_per_token = o.lm_head ? per_token("lm_head", GemmPass::kForward) + loss_fwd : 0.0;
  lm_head_bwd_per_token = o.lm_head ? per_token("lm_head", GemmPass::kBackwardData) +
                                          per_token("lm_head", GemmPass::kBackwardWeight) + loss_bwd
                                    : 0.0;
  if (o.attention_table == nullptr) attn_fwd_share = 1.0 / (1.0 + hp.attention_backward_ratio());
  // The fits are time = intercept + wire / bw (network.h's Link): p2p's exchange is one
  // message, so its intercept is the per-message latency; the all-to-all's had ranks - 1
  // messages per rank (every rank to every other), so each costs intercept / (ranks - 1) and
  // the model gives the measured exchange back (2 ranks: the intercept itself).
  if (hp.all_to_all) {
    const auto messages = static_cast<double>(std::max<int64_t>(1, hp.ranks - 1));
    exchange = Link{G * hp.all_to_all->bytes_per_second, hp.all_to_all->latency_seconds / messages};
  }
  if (hp.p2p) p2p_link = Link{G * hp.p2p->bytes_per_second, hp.p2p->latency_seconds};
  if (hp.comm_cpu) comm_cpu_per_byte = hp.comm_cpu->seconds_per_byte;
  if (const std::optional<LinkRates> l = profile_link_rates(hp, o.topology.inter_host_price)) {
    cad_links = {G * l->inter_host_bytes_per_second, G * l->intra_host_bytes_per_second, l->message_seconds};
  }
  // TP peers exchange over one rank's link (the same fit, not G of them); where the profile
  // measured the TP collectives themselves (the trainer's group communicator and its waits),
  // that fit: a collective of kTpProfileGroup ranks sent one message per rank, so its intercept
  // is the per-message latency.
  if (hp.all_to_all) tp_link = Link{exchange.bytes_per_second / G, exchange.latency};
  if (hp.tp_collective) {
    const auto messages = static_cast<double>(kTpProfileGroup - 1);
    tp_link = Link{hp.tp_collective->bytes_per_second, hp.tp_collective->latency_seconds / messages};
  }
  // The peers' wait is charged where every rank has its cores. Under processor sharing a rank
  // that waits for its peer yields its core to another rank, and the fluid model already
  // shares the cores among the computing units (sharing.h), so the wait would count twice.
  if (hp.tp_wait && !host.active()) tp_wait = hp.tp_wait->seconds_per_compute_second;
}

namespace {

// Rows [first, first + rows) of a micro-batch of `total` rows held by TP rank p of G, as the
// runtime splits them (model::tp_sp_pieces): without a sequence cut (cut <= 0 or >= total) its
// share even_split(total, G, p); with one, its even share of [0, cut) (the remainder on the
// last ranks) and of [cut, total) (the remainder on the first ranks).
double tp_rank_rows(double first, double rows, double total, double cut, int64_t G, int64_t p) {
  auto overlap = [&](double b, double e) { return std::max(0.0, std::min(e, first + rows) - std::max(b, first)); };
  auto share = [&](int64_t n, int64_t q) {  // rank q's [begin, end) of even_split(n, G)
    const int64_t base = n / G, extra = n % G;
    const int64_t b = q * base + std::min(q, extra);
    return std::pair<double, double>{static_cast<double>(b), static_cast<double>(b + base + (q < extra ? 1 : 0))};
  };
  const auto n = static_cast<int64_t>(total), c = static_cast<int64_t>(cut);
  if (c <= 0 || c >= n) {
    const auto [b, e] = share(n, p);
    return overlap(b, e);
  }
  // [0, c) mirrored: rank p holds what rank G - 1 - p would hold of the reversed range.
  const auto [rb, re] = share(c, G - 1 - p);
  const auto [sb, se] = share(n - c, p);
  return overlap(cut - re, cut - rb) + overlap(cut + sb, cut + se);
}

}  // namespace

Rates::TpCost Rates::tp_slot(double first, double rows, double total, bool bwd, int64_t k, int64_t stage) const {
  TpCost c;
  if (!tp_explicit) return c;
  const int64_t G = gpus_per_unit, n = stage_layers[static_cast<size_t>(stage)];
  const auto peers = static_cast<double>(G - 1);
  // One all-gather or reduce-scatter of the range's (rows, hidden) activations: an all-gather
  // sends rank p's r_p rows to each peer and receives the rest, a reduce-scatter sends its
  // partial sums of the rest and receives G - 1 partials of its r_p rows; either way the
  // slowest side of the slowest rank moves max((G - 1) r_p, rows - r_p) rows, in G - 1
  // messages each way, and the G ranks send (G - 1) rows rows together.
  const double row = static_cast<double>(o.model.hidden * o.dtype_bytes);
  // Without pipeline stages the trainer cuts each TP rank's sequence-parallel rows at the
  // nano-batch boundary (train/step.cpp's sp_cut): a range that is one nano-batch of a split
  // micro-batch ends or starts at the cut.
  const bool split = pp == 1 && rows < total;
  const double cut = split ? (first == 0 ? rows : first) : 0.0;
  auto rows_collective = [&](double f, double r, int64_t count) {
    if (!(r > 0)) return;
    double side = 0;
    for (int64_t p = 0; p < G; ++p) {
      const double mine = tp_rank_rows(f, r, total, cut, G, p);
      side = std::max(side, std::max(peers * mine, r - mine));
    }
    const double one = all_to_all_unit_seconds(tp_link, side * row, side * row, G - 1, G - 1);
    c.seconds += static_cast<double>(count) * one;
    c.bytes += static_cast<double>(count) * peers * r * row;
  };
  // Per layer: the pre-attention norm's all-gather (backward: the reduce-scatter of its
  // input gradient), then after attention the output projection's reduce-scatter, the MLP
  // norm's all-gather and the down projection's reduce-scatter (backward: the mirror).
  const int64_t pre = 1, post = 3;
  rows_collective(first, rows, k == 0 ? (bwd ? post : pre) : (k == n ? (bwd ? pre : post) : pre + post));
  if (rows > 0) c.wait_per_compute = tp_wait;
  const bool head_slot = stage == pp - 1 && o.lm_head && k == (bwd ? 0 : n);
  if (head_slot) {
    // The final norm's all-gather (backward: its reduce-scatter); the vocabulary-parallel
    // cross-entropy's two all-gathers of per-row figures (its maximum, then its sum of
    // exponentials and target logit: 8 and 16 bytes a row to every peer).
    rows_collective(first, rows, 1);
    if (!bwd && rows > 0) {
      for (const double per_row : {8.0, 16.0}) {
        const double sent = peers * per_row * rows;
        c.seconds += all_to_all_unit_seconds(tp_link, sent, sent, G - 1, G - 1);
        c.bytes += static_cast<double>(G) * sent;
      }
    }
  }
  // The embedding: backward an all-gather of the range's input gradient; forward a
  // reduce-scatter of the whole micro-batch (charged with the range that starts it), or with
  // a sequence cut one per side of it (model::Llama::embed_forward), each with its range.
  if (stage == 0 && k == (bwd ? n : 0)) {
    if (bwd || split) {
      rows_collective(first, rows, 1);
    } else if (first == 0) {
      rows_collective(0.0, total, 1);
    }
  }
  return c;
}

double Rates::stage_params(int64_t s) const {
  const ModelSpec& m = o.model;
  const double h = static_cast<double>(m.hidden);
  const double per_layer = h * static_cast<double>(m.q_dim() + 2 * m.kv_dim()) +  // Q, K, V
                           static_cast<double>(m.q_dim()) * h +                   // O
                           3.0 * h * static_cast<double>(m.ffn) +                 // SwiGLU
                           2.0 * h;                                               // two RMSNorms
  double p = per_layer * static_cast<double>(stage_layers[static_cast<size_t>(s)]);
  if (s == 0) p += h * static_cast<double>(m.vocab);  // embedding
  if (s == pp - 1 && o.lm_head) p += h * static_cast<double>(m.vocab) + h;  // LM head, final norm
  return p;
}

double grad_sync_seconds(const Rates& rates, int64_t s, double* bytes_per_unit) {
  // fp32 gradients, TP-sharded over the G GPUs of a unit; each GPU rings with its peers of
  // the other units (G rings in parallel, so a unit moves G times a GPU's bytes at G x bw).
  const double gpu_bytes = rates.stage_params(s) * 4.0 / static_cast<double>(rates.gpus_per_unit);
  double moved = 0;
  const double t = ring_all_reduce_seconds(rates.exchange, rates.units_per_stage,
                                           gpu_bytes * static_cast<double>(rates.gpus_per_unit), &moved);
  if (bytes_per_unit != nullptr) *bytes_per_unit = moved;
  return rates.o.grad_sync ? t : 0.0;
}

void run_grad_sync(const Rates& R, Recorder& rec, const std::vector<double>& stage_start,
                   const std::vector<double>& unit_free, SimResult& r) {
  r.iteration_seconds = 0;
  r.grad_sync_seconds = 0;
  for (int64_t s = 0; s < R.pp; ++s) {
    double bytes = 0;
    const double gs = grad_sync_seconds(R, s, &bytes);
    const double start = stage_start[static_cast<size_t>(s)];
    for (int64_t i = 0; i < R.units_per_stage && gs > 0; ++i) {
      const int64_t u = s * R.units_per_stage + i;
      rec.comm(u, start, gs, bytes, bytes, "grad all-reduce", -1);
      rec.wait(u, unit_free[static_cast<size_t>(u)], start + gs, start, /*barrier_before_start=*/true);
    }
    r.grad_sync_seconds = std::max(r.grad_sync_seconds, gs);
    r.iteration_seconds = std::max(r.iteration_seconds, start + gs);
    if (R.optimizer_per_param <= 0) continue;
    // Every unit then steps its stage's parameters (its optimizer shard with
    // shard_optimizer), as the runtime's finish_step does after the all-reduce.
    const double shards = R.o.shard_optimizer ? static_cast<double>(R.units_per_stage) : 1.0;
    const double base = R.optimizer_per_param * R.stage_params(s) / shards;
    for (int64_t i = 0; i < R.units_per_stage; ++i) {
      const int64_t u = s * R.units_per_stage + i;
      const double t0 = std::max(unit_free[static_cast<size_t>(u)], gs > 0 ? start + gs : start);
      const double dur = rec.linear(u, t0, base, "optimizer", -1);
      r.iteration_seconds = std::max(r.iteration_seconds, t0 + dur);
    }
  }
}

Recorder::Recorder(int64_t units, bool keep_events, Sharing* sharing)
    : stats_(static_cast<size_t>(units)),
      compute_since_tp_(static_cast<size_t>(units), 0.0),
      keep_(keep_events),
      sharing_(sharing) {}

double Recorder::compute(int64_t u, double start, double dur, const char* name, int64_t mb,
                         double UnitStats::*bucket) {
  if (sharing_ != nullptr) dur = sharing_->stretch(u, start, dur);
  if (dur <= 0) return dur;
  auto& s = stats_[static_cast<size_t>(u)];
  s.*bucket += dur;
  s.busy += dur;
  compute_since_tp_[static_cast<size_t>(u)] += dur;
  if (keep_) keep_event(u, kComputeTrack, name, start, dur, mb);
  return dur;
}

// Seconds become the trace's microseconds here; the span keeps its start exactly and its end
// as start + duration (the JSON's "dur" is their difference).
void Recorder::keep_event(int64_t u, int64_t track, const char* name, double start, double dur, int64_t mb) {
  TraceEvent e{name, track == kComputeTrack ? "compute" : "comm", u, track, start * 1e6, start * 1e6 + dur * 1e6};
  if (mb >= 0) e.args.push_back({"microbatch", mb});
  events_.push_back(std::move(e));
}

double Recorder::linear(int64_t u, double start, double dur, const char* name, int64_t mb) {
  return compute(u, start, dur, name, mb, &UnitStats::linear);
}

double Recorder::attention(int64_t u, double start, double dur, const char* name, int64_t mb) {
  return compute(u, start, dur, name, mb, &UnitStats::attention);
}

double Recorder::tp(int64_t u, double start, const Rates::TpCost& c, int64_t mb) {
  stats_[static_cast<size_t>(u)].tp_bytes += c.bytes;
  if (!(c.seconds > 0)) return 0.0;
  double& since = compute_since_tp_[static_cast<size_t>(u)];
  const double seconds = c.seconds + c.wait_per_compute * since;
  since = 0;
  comm(u, start, seconds, 0, 0, "TP collectives", mb);
  wait(u, start, start + seconds, start);
  return seconds;
}

void Recorder::comm(int64_t u, double start, double dur, double sent, double recv, const char* name, int64_t mb) {
  auto& s = stats_[static_cast<size_t>(u)];
  s.bytes_sent += sent;
  s.bytes_received += recv;
  if (dur <= 0) return;
  s.comm += dur;
  if (keep_) keep_event(u, kCommTrack, name, start, dur, mb);
}

void Recorder::wait(int64_t u, double ready, double until, double start, bool barrier_before_start) {
  if (until <= ready) return;
  auto& s = stats_[static_cast<size_t>(u)];
  s.exposed_comm += until - std::max(ready, start);
  s.comm_blocked += until - (barrier_before_start ? std::max(ready, start) : ready);
}

namespace {

std::string gb(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", b / 1e9);
  return buf;
}

// SimOptions::framework's bytes per GPU of a unit of `stage` (docs/simulation-model.md,
// "Framework memory"); per_step_bytes: its activations and buffers per GPU.
double framework_bytes(const Rates& rates, int64_t stage, int64_t exchange_peers, double per_step_bytes) {
  const FrameworkMemory& f = rates.o.framework;
  // Ring communicators: tensor parallelism inside the unit, the stage's gradient all-reduce
  // (each GPU connects to its two ring neighbours per channel).
  auto neighbours = [](int64_t ring) -> int64_t { return ring > 2 ? 2 : ring - 1; };
  const int64_t ring_peers =
      neighbours(rates.gpus_per_unit) + (rates.o.grad_sync ? neighbours(rates.units_per_stage) : 0);
  // Point to point: the strategy's exchange peers and the neighbouring pipeline stages.
  int64_t p2p_peers = exchange_peers;
  if (stage > 0) ++p2p_peers;
  if (stage < rates.pp - 1) ++p2p_peers;
  const double connections = static_cast<double>(f.ring_channels * ring_peers + f.p2p_channels * p2p_peers);
  return f.context_bytes + f.comm_buffer_bytes * connections +
         per_step_bytes * f.fragmentation / (1.0 - f.fragmentation);
}

}  // namespace

void apply_memory(const Rates& rates, const std::vector<MemoryInput>& in, SimResult& r) {
  const SimOptions& o = rates.o;
  const ModelSpec& m = o.model;
  const double G = static_cast<double>(rates.gpus_per_unit);
  const double dt = static_cast<double>(o.dtype_bytes);
  const double h = static_cast<double>(m.hidden);
  // Bytes per token per layer a layer stores for backward (whole unit; / G per GPU under
  // sequence + tensor parallelism). Full: RMSNorm inputs and outputs, Q, K, V, O, SwiGLU
  // gate, up and product, plus the fp32 LSE. Checkpointing: the layer input and O (so core
  // attention is not recomputed), plus the LSE.
  const double lse = 4.0 * static_cast<double>(m.n_heads);
  const double full = dt * (4.0 * h + 2.0 * static_cast<double>(m.q_dim()) + 2.0 * static_cast<double>(m.kv_dim()) +
                            3.0 * static_cast<double>(m.ffn)) + lse;
  const double stored = o.activation_checkpointing ? dt * (h + static_cast<double>(m.q_dim())) + lse : full;
  const double capacity = o.cluster.hw.memory_bytes;
  r.peak_memory = 0;
  r.oom = false;
  r.oom_unit = -1;
  r.oom_reason.clear();
  for (int64_t u = 0; u < rates.units; ++u) {
    const int64_t s = u / rates.units_per_stage;
    const double layers = static_cast<double>(rates.stage_layers[static_cast<size_t>(s)]);
    const MemoryInput& mi = in[static_cast<size_t>(u)];
    MemoryStats& ms = r.per_unit[static_cast<size_t>(u)].memory;
    const double params = rates.stage_params(s);
    ms.params = params * dt / G;
    ms.grads = params * 4.0 / G;
    ms.optimizer = params * 12.0 / G / (o.shard_optimizer ? static_cast<double>(rates.units_per_stage) : 1.0);
    ms.activations = stored * layers * mi.tokens_in_flight / G;
    // Transients of one micro-batch: the layer being recomputed (checkpointing) and, on the
    // last stage, the logits (dtype_bytes per vocabulary entry, vocab-parallel over G).
    double transient = o.activation_checkpointing ? full * mi.tokens_max / G : 0.0;
    if (s == rates.pp - 1 && o.lm_head) transient += dt * static_cast<double>(m.vocab) * mi.tokens_max / G;
    // Kept and transient remote rows (K/V, CAD server buffers): the engines' peaks, added
    // (an upper bound: the kept peak and the in-flight layer's peak may fall apart).
    ms.buffers = (mi.kept_bytes + mi.transient_bytes) / G + transient;
    ms.kv_buffers = (mi.kept_kv_bytes + mi.transient_kv_bytes) / G;
    ms.framework = framework_bytes(rates, s, mi.exchange_peers, ms.activations + ms.buffers);
    const double total = ms.total();
    r.peak_memory = std::max(r.peak_memory, total);
    if (total > capacity && !r.oom) {
      r.oom = true;
      r.oom_unit = u;
      r.oom_reason = "unit " + std::to_string(u) + ": " + gb(total) + " per GPU needed > " + gb(capacity) +
                     " (params " + gb(ms.params) + ", grads " + gb(ms.grads) + ", optimizer " + gb(ms.optimizer) +
                     ", activations " + gb(ms.activations) + ", buffers " + gb(ms.buffers) + ", framework " +
                     gb(ms.framework) + ")";
    }
  }
}

}  // namespace distca::sim::detail
