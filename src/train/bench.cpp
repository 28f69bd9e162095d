// The training benchmark's runs and measurements (train/bench.h).
#include "distca/train/bench.h"


#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "distca/core/memory.h"
#include "distca/core/stats.h"
#include "distca/cost/analytic.h"
#include "distca/kernels/blas.h"
#include "distca/kernels/profiler.h"
#include "distca/train/memory.h"

namespace distca::train {

std::vector<BenchMode> data_parallel_modes() {
  return {{"colocated", "colocated", ""},
          {"cad single-stream", "cad", "single-stream"},
          {"cad pingpong", "cad", "pingpong"},
          {"cad signal", "cad", "signal"}};
}

std::vector<BenchMode> pipeline_modes() {
  return {{"colocated 1F1B", "colocated", ""}, {"cad pingpong", "cad", "pingpong"},
          {"cad single-stream", "cad", "single-stream"}};
}

std::vector<BenchMode> bench_modes(const BenchOptions& f) { return f.pp > 1 ? pipeline_modes() : data_parallel_modes(); }

int64_t long_doc(const BenchOptions& f) { return f.long_doc > 0 ? f.long_doc : f.tokens; }

ModelSpec bench_spec(const BenchOptions& f) {
  ModelSpec m;
  m.name = "bench-train";
  m.n_layers = f.layers;
  m.hidden = f.width;
  m.head_dim = f.head_dim;
  m.n_heads = f.width / f.head_dim;
  m.n_kv_heads = m.n_heads % 2 == 0 ? m.n_heads / 2 : m.n_heads;
  m.ffn = std::max<int64_t>(64, (8 * f.width / 3 + 32) / 64 * 64);
  m.vocab = f.vocab;
  return m;
}

TrainConfig make_config(const BenchOptions& f, int64_t ranks, const BenchMode& mode) {
  const ModelSpec m = bench_spec(f);
  TrainConfig c;
  c.model = "tiny";
  c.model_overrides = {m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.head_dim, m.ffn, m.vocab};
  c.ranks = ranks;
  c.backend = f.backend;
  // The modes are this file's constants (or names bench validate read back): they parse.
  c.mode = parse_train_mode(mode.mode).value();
  if (*mode.overlap != '\0') c.overlap = runtime::parse_overlap_mode(mode.overlap).value();
  c.tolerance = f.tolerance;
  // Only the cad modes have a band (colocated refuses --tolerance auto).
  if (f.tolerance_auto && c.mode == TrainMode::kCad) {
    c.tolerance_auto = true;
    c.hardware = f.hardware;
  }
  if (c.mode == TrainMode::kCad) {
    c.kv_once = f.kv_once;
    if (f.kv_once == "auto") c.hardware = f.hardware;
    c.ranks_per_host = f.ranks_per_host;
  }
  c.steps = f.steps;
  c.tokens_per_rank = f.tokens;
  // The data come from DataSource::fixed; dist and max_doc_len only describe them to the
  // validation and to the memory estimate (longest document).
  c.dist = "fixed:" + std::to_string(long_doc(f));
  c.max_doc_len = std::max(long_doc(f), f.short_doc);
  c.copy_vocab = std::min<int64_t>(32, f.vocab);
  c.pp = f.pp;
  c.tp = f.tp;
  c.tp_overlap = f.tp_overlap;
  c.micro_batches = f.micro_batches > 0 ? f.micro_batches : 1;
  return c;
}

namespace {

// One rank's documents of `len` tokens filling `tokens`, ids from `id` on.
void fill_rank(std::vector<Piece>& pieces, int64_t tokens, int64_t len, int64_t& id) {
  for (int64_t t = 0; t + len <= tokens; t += len) pieces.push_back({id++, 0, len, len});
}

}  // namespace

Batch dp_batch(const BenchOptions& f, int64_t n) {
  Batch b;
  b.ranks = n;
  b.tokens_per_rank = f.tokens;
  b.per_rank.resize(static_cast<size_t>(n));
  int64_t id = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t len = r == 0 || f.workload == "uniform" ? long_doc(f) : f.short_doc;
    fill_rank(b.per_rank[static_cast<size_t>(r)], f.tokens, len, id);
  }
  return b;
}

std::vector<Batch> pipeline_batches(const BenchOptions& f, int64_t dp) {
  std::vector<Batch> out;
  for (int64_t m = 0; m < f.micro_batches; ++m) {
    Batch b;
    b.ranks = dp;
    b.tokens_per_rank = f.tokens;
    b.per_rank.resize(static_cast<size_t>(dp));
    int64_t id = 0;
    const int64_t len = m % 4 == 0 || f.workload == "uniform" ? long_doc(f) : f.short_doc;
    for (int64_t r = 0; r < dp; ++r) fill_rank(b.per_rank[static_cast<size_t>(r)], f.tokens, len, id);
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<Batch> bench_batches(const BenchOptions& f, int64_t ranks) {
  return f.pp > 1 ? pipeline_batches(f, ranks / f.pp) : std::vector<Batch>{dp_batch(f, ranks / f.tp)};
}

std::vector<TrainingFlops> rank_step_flops(const ModelSpec& m, const Batch& b) {
  std::vector<TrainingFlops> out;
  for (const auto& pieces : b.per_rank) {
    double pairs = 0, tokens = 0;
    for (const Piece& p : pieces) {
      pairs += static_cast<double>(document_pairs(p.len));
      tokens += static_cast<double>(p.len);
    }
    out.push_back(training_step_flops(m, tokens, pairs));
  }
  return out;
}

TrainingFlops total_step_flops(const ModelSpec& m, const std::vector<Batch>& batches) {
  TrainingFlops s;
  for (const Batch& b : batches) {
    for (const auto& pieces : b.per_rank) {
      for (const Piece& p : pieces) {
        const TrainingFlops f = training_step_flops(m, static_cast<double>(p.len), static_cast<double>(document_pairs(p.len)));
        s.linear += f.linear;
        s.attention += f.attention;
      }
    }
  }
  return s;
}

namespace {

// The model's linear shapes for a nano-batch of rows (QKV, O, gate+up, down), the sgemm probe's.
std::vector<kernels::SgemmShape> linear_shapes(const ModelSpec& m) {
  return {{m.hidden, m.q_dim() + 2 * m.kv_dim()}, {m.q_dim(), m.hidden}, {m.hidden, 2 * m.ffn}, {m.ffn, m.hidden}};
}

}  // namespace

int64_t sgemm_rows(const BenchOptions& f) { return std::min<int64_t>(4096, std::max<int64_t>(16, f.tokens / 2)); }

double measure_sgemm(const BenchOptions& f, int rank) {
  return kernels::measure_sgemm_flops(sgemm_rows(f), linear_shapes(bench_spec(f)), static_cast<uint64_t>(rank));
}

Status probe_sgemm_round(comm::Communicator& comm, const BenchOptions& f, std::vector<double>& best) {
  DISTCA_RETURN_IF_ERROR(comm.barrier());
  const double rate = measure_sgemm(f, comm.rank());
  DISTCA_ASSIGN_OR_RETURN(std::vector<double> rates, comm.all_gather_value(rate));
  for (size_t r = 0; r < rates.size() && r < best.size(); ++r) best[r] = std::max(best[r], rates[r]);
  return {};
}

Status check_bench_memory(const BenchOptions& f, int64_t ranks, bool lead, const std::vector<BenchMode>& modes,
                          int64_t processes_here) {
  std::vector<TrainConfig> configs;
  for (const BenchMode& m : modes) configs.push_back(make_config(f, ranks, m));
  return check_configs_memory(f, ranks, lead, configs,
                              static_cast<double>(kernels::sgemm_probe_bytes(sgemm_rows(f), linear_shapes(bench_spec(f)))),
                              processes_here);
}

Status check_configs_memory(const BenchOptions& f, int64_t ranks, bool lead, const std::vector<TrainConfig>& configs,
                            double extra_per_rank, int64_t processes_here) {
  MemoryInputs mi;
  mi.mpi = f.backend == "mpi";
  mi.ranks_in_process = mi.mpi ? 1 : ranks;
  mi.threads_per_rank = mi.mpi ? 2 : 1;  // one compute thread (+ mpi's progress thread)
  mi.lead = lead;
  double need = 0;
  for (const TrainConfig& cfg : configs) {
    DISTCA_ASSIGN_OR_RETURN(ModelSpec spec, cfg.model_spec());
    need = std::max(need, estimate_train_memory(cfg, spec, mi).process_total());
  }
  need += extra_per_rank * static_cast<double>(mi.ranks_in_process);
  const int64_t here = mi.mpi ? std::max<int64_t>(1, processes_here) : 1;
  const std::string what = "bench train --tokens-per-rank " + std::to_string(f.tokens) + " --width " +
                           std::to_string(f.width) + " --layers " + std::to_string(f.layers) +
                           (mi.mpi ? (here > 1 ? " x " + std::to_string(here) + " processes on this machine" : "")
                                   : " --ranks " + std::to_string(ranks));
  return check_memory(need * static_cast<double>(here), what);
}

comm::Settings bench_settings(const BenchOptions& f) {
  comm::Settings s;
  s.add("command", "bench train").add("--width", f.width).add("--layers", f.layers).add("--head-dim", f.head_dim);
  s.add("--vocab", f.vocab).add("--tokens-per-rank", f.tokens).add("--long-doc", f.long_doc);
  s.add("--short-doc", f.short_doc).add("--workload", f.workload).add("--rounds", f.rounds).add("--steps", f.steps);
  s.add("--warmup-steps", f.warmup_steps).add("--tolerance", f.tolerance).add("--pp", f.pp).add("--tp", f.tp);
  s.add("--tp-overlap", f.tp_overlap);
  s.add("--tolerance auto", f.tolerance_auto).add("--kv-once", f.kv_once).add("--ranks-per-host", f.ranks_per_host);
  s.add("--compare", f.compare).add("--seed", f.seed);
  s.add("--micro-batches", f.micro_batches).add("--trace given", !f.trace.empty());
  return s;
}

nlohmann::json bench_flags_json(const BenchOptions& f) {
  return {{"width", f.width},         {"layers", f.layers},       {"head_dim", f.head_dim},
          {"vocab", f.vocab},         {"tokens_per_rank", f.tokens}, {"long_doc", long_doc(f)},
          {"short_doc", f.short_doc}, {"tolerance", f.tolerance},  {"pp", f.pp},
          {"micro_batches", f.micro_batches}, {"workload", f.workload}, {"tolerance_auto", f.tolerance_auto},
          {"tp", f.tp}, {"tp_overlap", f.tp_overlap}, {"kv_once", f.kv_once}, {"ranks_per_host", f.ranks_per_host}};
}

Result<BenchOptions> bench_flags_from_json(const nlohmann::json& j) {
  BenchOptions f;
  if (!j.is_object()) return Status::invalid_argument("bench_flags: not an object");
  auto integer = [&](const char* k, int64_t& v, int64_t lo, int64_t hi) -> Status {
    if (!j.contains(k) || !j[k].is_number_integer()) return Status::invalid_argument(std::string("bench_flags.") + k + ": missing or not an integer");
    v = j[k].get<int64_t>();
    if (v < lo || v > hi) return Status::invalid_argument(std::string("bench_flags.") + k + ": out of range");
    return {};
  };
  DISTCA_RETURN_IF_ERROR(integer("width", f.width, 16, int64_t{1} << 16));
  DISTCA_RETURN_IF_ERROR(integer("layers", f.layers, 1, 64));
  DISTCA_RETURN_IF_ERROR(integer("head_dim", f.head_dim, 2, int64_t{1} << 16));
  DISTCA_RETURN_IF_ERROR(integer("vocab", f.vocab, 2, int64_t{1} << 20));
  DISTCA_RETURN_IF_ERROR(integer("tokens_per_rank", f.tokens, 16, int64_t{1} << 24));
  DISTCA_RETURN_IF_ERROR(integer("long_doc", f.long_doc, 16, int64_t{1} << 24));
  DISTCA_RETURN_IF_ERROR(integer("short_doc", f.short_doc, 16, int64_t{1} << 24));
  DISTCA_RETURN_IF_ERROR(integer("pp", f.pp, 1, 64));
  DISTCA_RETURN_IF_ERROR(integer("micro_batches", f.micro_batches, 0, 4096));
  if (j.contains("tp")) DISTCA_RETURN_IF_ERROR(integer("tp", f.tp, 1, 64));  // absent: recorded before --tp, 1
  // Absent: recorded before --ranks-per-host, none.
  if (j.contains("ranks_per_host")) DISTCA_RETURN_IF_ERROR(integer("ranks_per_host", f.ranks_per_host, 0, 1 << 20));
  if (!j.contains("tolerance") || !j["tolerance"].is_number()) return Status::invalid_argument("bench_flags.tolerance: missing or not a number");
  f.tolerance = j["tolerance"].get<double>();
  if (!(f.tolerance >= 0 && f.tolerance <= 1)) return Status::invalid_argument("bench_flags.tolerance: out of range");
  if (j.contains("tolerance_auto")) {  // absent in files written before the flag existed
    if (!j["tolerance_auto"].is_boolean()) return Status::invalid_argument("bench_flags.tolerance_auto: not a boolean");
    f.tolerance_auto = j["tolerance_auto"].get<bool>();
  }
  if (j.contains("tp_overlap")) {  // absent in files written before the flag existed: on
    if (!j["tp_overlap"].is_string()) return Status::invalid_argument("bench_flags.tp_overlap: not a string");
    f.tp_overlap = j["tp_overlap"].get<std::string>();
    if (f.tp_overlap != "on" && f.tp_overlap != "off") return Status::invalid_argument("bench_flags.tp_overlap: not on or off");
  }
  if (j.contains("kv_once")) {  // absent in files written before the flag existed: on
    if (!j["kv_once"].is_string()) return Status::invalid_argument("bench_flags.kv_once: not a string");
    f.kv_once = j["kv_once"].get<std::string>();
    if (f.kv_once != "on" && f.kv_once != "off" && f.kv_once != "auto") {
      return Status::invalid_argument("bench_flags.kv_once: not on, off or auto");
    }
  }
  if (!j.contains("workload") || !j["workload"].is_string()) return Status::invalid_argument("bench_flags.workload: missing or not a string");
  f.workload = j["workload"].get<std::string>();
  if (f.workload != "skewed" && f.workload != "uniform") return Status::invalid_argument("bench_flags.workload: not skewed or uniform");
  if (f.width % f.head_dim != 0 || f.tokens % f.long_doc != 0 || f.tokens % f.short_doc != 0) {
    return Status::invalid_argument("bench_flags: head_dim, long_doc or short_doc do not divide width or tokens_per_rank");
  }
  if (f.pp > 1 && f.micro_batches < f.pp) return Status::invalid_argument("bench_flags.micro_batches: fewer than pp");
  return f;
}

double paired_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (b[i] > 0) r.push_back(a[i] / b[i]);
  }
  return median(r);
}

void RankFigures::add(const TrainResult& result, int64_t warmup_steps) {
  idle.resize(std::max(idle.size(), result.rank_steps.size()));
  exposed.resize(idle.size());
  for (size_t r = 0; r < result.rank_steps.size(); ++r) {
    for (size_t s = static_cast<size_t>(warmup_steps); s < result.rank_steps[r].size() && s < result.steps.size(); ++s) {
      const double t = result.steps[s].seconds;  // rank 0's: the job's step (it ends in a barrier)
      const StepMetrics& m = result.rank_steps[r][s];
      idle[r].push_back(t > 0 ? 1.0 - m.busy_s() / t : 0.0);
      exposed[r].push_back(t > 0 ? m.comm_s / t : 0.0);
    }
  }
}
std::vector<double> RankFigures::median_idle() const {
  std::vector<double> out;
  for (const auto& v : idle) out.push_back(median(v));
  return out;
}
std::vector<double> RankFigures::median_exposed() const {
  std::vector<double> out;
  for (const auto& v : exposed) out.push_back(median(v));
  return out;
}

namespace {

// Rank 0's timed steps of one --pp 1 run folded into m.
void add_dp_run(const BenchOptions& f, TrainResult& result, const std::vector<int64_t>& peaks, DpModeFigures& m) {
  std::vector<double> mine;
  for (size_t s = static_cast<size_t>(f.warmup_steps); s < result.steps.size(); ++s) {
    const StepMetrics& st = result.steps[s];
    mine.push_back(st.seconds);
    m.linear.push_back(st.linear_s);
    m.attention.push_back(st.attention_s);
    m.comm.push_back(st.comm_s);
    m.wait.push_back(st.wait_s);
    m.optimizer.push_back(st.optimizer_s);
    m.other.push_back(st.seconds - st.busy_s() - st.comm_s - st.wait_s);
    m.tp_comm.push_back(st.tp_comm_s);
    m.imbalance.push_back(st.imbalance_after);
    m.bytes_sent = st.bytes_sent;
  }
  m.steps.insert(m.steps.end(), mine.begin(), mine.end());
  m.round_median.push_back(median(mine));
  m.per_rank.add(result, f.warmup_steps);
  m.buffers = result.buffer_bytes;
  m.outputs_valid = result.outputs_valid;
  for (size_t r = 0; r < m.peak.size(); ++r) {
    // Local backend: one process holds every rank; its peak is rank 0's entry.
    const int64_t p = f.backend == "mpi" ? peaks[r] : (r == 0 ? peaks[0] : 0);
    m.peak[r] = std::max(m.peak[r], p);
  }
}

}  // namespace

Status run_data_parallel_bench(comm::Communicator& comm, const BenchOptions& f, const DataSource& data,
                               bool process_lead, TraceRecorder* recorder, DpFigures* out) {
  const int64_t n = comm.size();
  const bool lead = comm.rank() == 0;
  const std::vector<BenchMode> modes = data_parallel_modes();
  const kernels::ScopedComputeThreads one_thread(1);
  DpFigures fig;
  fig.sgemm.assign(static_cast<size_t>(n), 0);
  fig.modes.resize(modes.size());
  for (DpModeFigures& m : fig.modes) m.peak.assign(static_cast<size_t>(n), 0);
  TrainHooks hooks;
  hooks.data = &data;
  for (int round = 0; round < f.rounds; ++round) {
    DISTCA_RETURN_IF_ERROR(probe_sgemm_round(comm, f, fig.sgemm));
    for (size_t mi = 0; mi < modes.size(); ++mi) {
      TrainConfig cfg = make_config(f, n, modes[mi]);
      const bool traced = !f.trace.empty() && round + 1 == f.rounds && mi == kDpPingPong;
      if (traced) cfg.trace = f.trace;  // the trainer records the run's last step; the caller writes it
      hooks.trace = traced ? recorder : nullptr;
      DISTCA_RETURN_IF_ERROR(comm.barrier());  // nothing allocates while the mark is reset
      int resident = process_lead ? (reset_peak_resident() ? 1 : 0) : 1;
      DISTCA_RETURN_IF_ERROR(comm.barrier());
      TrainResult result;
      DISTCA_RETURN_IF_ERROR(run_training(cfg, comm, hooks, lead ? &result : nullptr));
      DISTCA_RETURN_IF_ERROR(comm.barrier());  // local backend: every rank thread is done
      const int64_t peak = process_lead ? peak_resident_bytes() : 0;
      DISTCA_ASSIGN_OR_RETURN(std::vector<int64_t> peaks, comm.all_gather_value(peak));
      DISTCA_ASSIGN_OR_RETURN(std::vector<int> res, comm.all_gather_value(resident));
      if (!lead) continue;
      fig.resident = fig.resident && std::all_of(res.begin(), res.end(), [](int x) { return x == 1; });
      add_dp_run(f, result, peaks, fig.modes[mi]);
      if (traced) fig.trace = std::move(result.trace);
    }
  }
  if (lead) *out = std::move(fig);
  return Status::ok_status();
}

namespace {

// Rank 0's timed steps of one --pp > 1 run folded into m.
void add_pipeline_run(const BenchOptions& f, int64_t ranks, const TrainResult& result, PipeModeFigures& m) {
  const int64_t dp = ranks / f.pp;
  std::vector<double> mine;
  for (size_t s = static_cast<size_t>(f.warmup_steps); s < result.steps.size(); ++s) {
    const double t = result.steps[s].seconds;
    mine.push_back(t);
    m.tokens = result.steps[s].tokens;
    double busy_sum = 0;
    for (int64_t stage = 0; stage < f.pp; ++stage) {
      double idle = 0;
      for (int64_t d = 0; d < dp; ++d) {
        const double busy = result.rank_steps[static_cast<size_t>(stage * dp + d)][s].busy_s();
        busy_sum += busy;
        idle += t > 0 ? 1.0 - busy / t : 0.0;
      }
      m.stage_idle[static_cast<size_t>(stage)].push_back(idle / static_cast<double>(dp));
    }
    m.busy_mean.push_back(busy_sum / static_cast<double>(ranks));
  }
  m.steps.insert(m.steps.end(), mine.begin(), mine.end());
  m.round_median.push_back(median(mine));
  m.per_rank.add(result, f.warmup_steps);
}

}  // namespace

Status run_pipeline_bench(comm::Communicator& comm, const BenchOptions& f, const DataSource& data, PipeFigures* out) {
  const int64_t n = comm.size();
  const bool lead = comm.rank() == 0;
  const std::vector<BenchMode> modes = pipeline_modes();
  const kernels::ScopedComputeThreads one_thread(1);
  PipeFigures fig;
  fig.sgemm.assign(static_cast<size_t>(n), 0);
  fig.modes.resize(modes.size());
  for (PipeModeFigures& m : fig.modes) m.stage_idle.resize(static_cast<size_t>(f.pp));
  TrainHooks hooks;
  hooks.data = &data;
  for (int round = 0; round < f.rounds; ++round) {
    DISTCA_RETURN_IF_ERROR(probe_sgemm_round(comm, f, fig.sgemm));
    for (size_t mi = 0; mi < modes.size(); ++mi) {
      const TrainConfig cfg = make_config(f, n, modes[mi]);
      DISTCA_RETURN_IF_ERROR(comm.barrier());
      TrainResult result;
      DISTCA_RETURN_IF_ERROR(run_training(cfg, comm, hooks, lead ? &result : nullptr));
      if (lead) add_pipeline_run(f, n, result, fig.modes[mi]);
    }
  }
  if (lead) *out = std::move(fig);
  return Status::ok_status();
}

}  // namespace distca::train
