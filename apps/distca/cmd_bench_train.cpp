// `distca bench train`: whole training steps of `distca train`'s model and trainer on a fixed
// skewed batch (rank 0 long documents, every other rank short ones; --workload uniform: every
// rank the long ones), timed in four modes on one communicator, round-robin: colocated, cad
// single-stream, cad pingpong and cad signal
// (docs/benchmarks.md, "Training step"). With --pp > 1 the pipeline benchmark instead
// (bench_train_pipeline.cpp); with --compare every mode on drawn documents
// (bench_train_compare.cpp).
//
//   mpirun -np 2 distca bench train --backend mpi --json -
//
// Every mode is one train::run_training call of --steps steps; its first --warmup-steps are
// discarded. Step time is the trainer's StepMetrics::seconds on rank 0, which includes the
// barrier before the gradient all-reduce, i.e. waiting for the slowest rank. Under mpirun every
// rank runs the same steps and only rank 0 prints. On the local backend the ranks are threads
// sharing the process's cores and memory, so its figures are a smoke test.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_train.h"
#include "command.h"
#include "launcher.h"
#include "distca/comm/launch.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/trace.h"
#include "distca/cost/analytic.h"
#include "distca/cost/step_flops.h"
#include "distca/kernels/blas.h"
#include "distca/kernels/profiler.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/memory.h"
#include "distca/train/trainer.h"

namespace distca::cli {
namespace bench_train {

constexpr std::array<Mode, 4> kModes{{{"colocated", "colocated", ""},
                                      {"cad single-stream", "cad", "single-stream"},
                                      {"cad pingpong", "cad", "pingpong"},
                                      {"cad signal", "cad", "signal"}}};
constexpr size_t kColocated = 0, kSingle = 1, kPingPong = 2, kSignal = 3;

int64_t long_doc(const TrainBenchFlags& f) { return f.long_doc > 0 ? f.long_doc : f.tokens; }

// Width-scaled `tiny` heads: head_dim fixed, half as many K/V heads (GQA) when the count is
// even; SwiGLU ffn about 8/3 of the width, on a multiple of 64.
ModelSpec bench_spec(const TrainBenchFlags& f) {
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

train::TrainConfig make_config(const TrainBenchFlags& f, int64_t ranks, const Mode& mode) {
  const ModelSpec m = bench_spec(f);
  train::TrainConfig c;
  c.model = "tiny";
  c.model_overrides = {m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.head_dim, m.ffn, m.vocab};
  c.ranks = ranks;
  c.backend = f.backend;
  // The modes are this file's constants (or names bench validate read back): they parse.
  c.mode = train::parse_train_mode(mode.mode).value();
  if (*mode.overlap != '\0') c.overlap = runtime::parse_overlap_mode(mode.overlap).value();
  c.tolerance = f.tolerance;
  c.steps = f.steps;
  c.tokens_per_rank = f.tokens;
  // The data come from DataSource::fixed; dist and max_doc_len only describe them to the
  // validation and to the memory estimate (longest document).
  c.dist = "fixed:" + std::to_string(long_doc(f));
  c.max_doc_len = std::max(long_doc(f), f.short_doc);
  c.copy_vocab = std::min<int64_t>(32, f.vocab);
  c.pp = f.pp;
  c.micro_batches = f.micro_batches > 0 ? f.micro_batches : 1;
  return c;
}

// Skewed: rank 0 documents of long_doc tokens, ranks 1..n-1 documents of short_doc tokens;
// uniform: every rank documents of long_doc tokens.
Batch dp_batch(const TrainBenchFlags& f, int64_t n) {
  Batch b;
  b.ranks = n;
  b.tokens_per_rank = f.tokens;
  b.per_rank.resize(static_cast<size_t>(n));
  int64_t id = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t len = r == 0 || f.workload == "uniform" ? long_doc(f) : f.short_doc;
    for (int64_t t = 0; t + len <= f.tokens; t += len) b.per_rank[static_cast<size_t>(r)].push_back({id++, 0, len, len});
  }
  return b;
}

// FLOPs of one step (forward + backward) per rank under colocated: its own documents' attention
// and its tokens' linear work (projections, SwiGLU, LM head), counted as cost/analytic.h does.
struct StepFlops {
  std::vector<double> linear, attention;  // [ranks]
  double total(size_t r) const { return linear[r] + attention[r]; }
};
StepFlops step_flops(const ModelSpec& m, const Batch& b) {
  StepFlops s;
  for (const auto& pieces : b.per_rank) {
    double pairs = 0, tokens = 0;
    for (const Piece& p : pieces) {
      pairs += static_cast<double>(document_pairs(p.len));
      tokens += static_cast<double>(p.len);
    }
    const TrainingFlops f = training_step_flops(m, tokens, pairs);
    s.linear.push_back(f.linear);
    s.attention.push_back(f.attention);
  }
  return s;
}

// The model's linear shapes for a nano-batch of rows (QKV, O, gate+up, down), the sgemm probe's.
std::vector<kernels::SgemmShape> linear_shapes(const ModelSpec& m) {
  return {{m.hidden, m.q_dim() + 2 * m.kv_dim()}, {m.q_dim(), m.hidden}, {m.hidden, 2 * m.ffn}, {m.ffn, m.hidden}};
}
int64_t sgemm_rows(const TrainBenchFlags& f) { return std::min<int64_t>(4096, std::max<int64_t>(16, f.tokens / 2)); }
Status probe_sgemm_round(comm::Communicator& comm, const TrainBenchFlags& f, std::vector<double>& best) {
  DISTCA_RETURN_IF_ERROR(comm.barrier());
  const double rate = measure_sgemm(f, comm.rank());
  DISTCA_ASSIGN_OR_RETURN(std::vector<double> rates, comm.all_gather_value(rate));
  for (size_t r = 0; r < rates.size() && r < best.size(); ++r) best[r] = std::max(best[r], rates[r]);
  return {};
}

double measure_sgemm(const TrainBenchFlags& f, int rank) {
  return kernels::measure_sgemm_flops(sgemm_rows(f), linear_shapes(bench_spec(f)), static_cast<uint64_t>(rank));
}

// The memory every mode's run needs in this process, against the limit (--max-memory).
Status check_bench_memory(const TrainBenchFlags& f, int64_t ranks, bool lead, const std::vector<Mode>& modes) {
  std::vector<train::TrainConfig> configs;
  for (const Mode& m : modes) configs.push_back(make_config(f, ranks, m));
  return check_configs_memory(f, ranks, lead, configs,
                              static_cast<double>(kernels::sgemm_probe_bytes(sgemm_rows(f), linear_shapes(bench_spec(f)))));
}

Status check_configs_memory(const TrainBenchFlags& f, int64_t ranks, bool lead, const std::vector<train::TrainConfig>& configs,
                            double extra_per_rank) {
  train::MemoryInputs mi;
  mi.mpi = f.backend == "mpi";
  mi.ranks_in_process = mi.mpi ? 1 : ranks;
  mi.threads_per_rank = mi.mpi ? 2 : 1;  // one compute thread (+ mpi's progress thread)
  mi.lead = lead;
  double need = 0;
  for (const train::TrainConfig& cfg : configs) {
    DISTCA_ASSIGN_OR_RETURN(ModelSpec spec, cfg.model_spec());
    need = std::max(need, train::estimate_train_memory(cfg, spec, mi).process_total());
  }
  need += extra_per_rank * static_cast<double>(mi.ranks_in_process);
  const int64_t here = mi.mpi ? std::max<int64_t>(1, env_int("OMPI_COMM_WORLD_LOCAL_SIZE")) : 1;
  const std::string what = "bench train --tokens-per-rank " + std::to_string(f.tokens) + " --width " +
                           std::to_string(f.width) + " --layers " + std::to_string(f.layers) +
                           (mi.mpi ? (here > 1 ? " x " + std::to_string(here) + " processes on this machine" : "")
                                   : " --ranks " + std::to_string(ranks));
  return check_memory(need * static_cast<double>(here), what);
}

comm::Settings bench_settings(const TrainBenchFlags& f) {
  comm::Settings s;
  s.add("command", "bench train").add("--width", f.width).add("--layers", f.layers).add("--head-dim", f.head_dim);
  s.add("--vocab", f.vocab).add("--tokens-per-rank", f.tokens).add("--long-doc", f.long_doc);
  s.add("--short-doc", f.short_doc).add("--workload", f.workload).add("--rounds", f.rounds).add("--steps", f.steps);
  s.add("--warmup-steps", f.warmup_steps).add("--tolerance", f.tolerance).add("--pp", f.pp);
  s.add("--micro-batches", f.micro_batches).add("--trace given", !f.trace.empty());
  s.add("--compare", f.compare).add("--seed", f.seed);
  return s;
}

}  // namespace bench_train

namespace {

using namespace bench_train;

struct ModeFigures {
  std::vector<double> steps;                  // timed steps of every round, seconds
  std::vector<double> round_median;           // [rounds]
  std::vector<double> linear, attention, comm, wait, optimizer;  // per timed step
  std::vector<double> other;  // the step's rest: planning, inputs, runner set-up
  std::vector<int64_t> peak;                  // [ranks] max over rounds (VmHWM or estimate)
  std::vector<int64_t> buffers;               // [ranks] the trainer's buffer estimate
  int64_t bytes_sent = 0;
  bool outputs_valid = true;
  RankFigures per_rank;                       // every rank's idle and exposed communication
};

struct Figures {
  std::array<ModeFigures, kModes.size()> modes;
  std::vector<double> sgemm;  // [ranks] FLOP/s
  bool resident = true;       // peaks are VmHWM (false: clear_refs unwritable, buffer estimates)
  std::vector<TraceEvent> trace;  // --trace: every rank's events of the traced step
};

// One rank's whole benchmark; `process_lead`: this thread measures its process's memory
// (every mpi rank; rank 0's thread of the local backend); `recorder`: the mpi communicator's
// trace recorder (null: the trainer's own). Figures are filled on rank 0.
Status run_rank(comm::Communicator& comm, const TrainBenchFlags& f, const train::DataSource& data, bool process_lead,
                TraceRecorder* recorder, Figures* out) {
  const int64_t n = comm.size();
  const bool lead = comm.rank() == 0;
  const kernels::ScopedComputeThreads one_thread(1);
  Figures fig;
  fig.sgemm.assign(static_cast<size_t>(n), 0);
  for (ModeFigures& m : fig.modes) m.peak.assign(static_cast<size_t>(n), 0);
  train::TrainHooks hooks;
  hooks.data = &data;
  for (int round = 0; round < f.rounds; ++round) {
    DISTCA_RETURN_IF_ERROR(probe_sgemm_round(comm, f, fig.sgemm));
    for (size_t mi = 0; mi < kModes.size(); ++mi) {
      train::TrainConfig cfg = make_config(f, n, kModes[mi]);
      const bool traced = !f.trace.empty() && round + 1 == f.rounds && mi == kPingPong;
      if (traced) cfg.trace = f.trace;  // the trainer records the run's last step; we write it
      hooks.trace = traced ? recorder : nullptr;
      ModeFigures& m = fig.modes[mi];
      DISTCA_RETURN_IF_ERROR(comm.barrier());  // nothing allocates while the mark is reset
      int resident = process_lead ? (reset_peak_resident() ? 1 : 0) : 1;
      DISTCA_RETURN_IF_ERROR(comm.barrier());
      train::TrainResult result;
      DISTCA_RETURN_IF_ERROR(train::run_training(cfg, comm, hooks, lead ? &result : nullptr));
      DISTCA_RETURN_IF_ERROR(comm.barrier());  // local backend: every rank thread is done
      const int64_t peak = process_lead ? peak_resident_bytes() : 0;
      DISTCA_ASSIGN_OR_RETURN(std::vector<int64_t> peaks, comm.all_gather_value(peak));
      DISTCA_ASSIGN_OR_RETURN(std::vector<int> res, comm.all_gather_value(resident));
      if (!lead) continue;
      fig.resident = fig.resident && std::all_of(res.begin(), res.end(), [](int x) { return x == 1; });
      std::vector<double> mine;
      for (size_t s = static_cast<size_t>(f.warmup_steps); s < result.steps.size(); ++s) {
        const train::StepMetrics& st = result.steps[s];
        mine.push_back(st.seconds);
        m.linear.push_back(st.linear_s);
        m.attention.push_back(st.attention_s);
        m.comm.push_back(st.comm_s);
        m.wait.push_back(st.wait_s);
        m.optimizer.push_back(st.optimizer_s);
        m.other.push_back(st.seconds - st.busy_s() - st.comm_s - st.wait_s);
        m.bytes_sent = st.bytes_sent;
      }
      m.steps.insert(m.steps.end(), mine.begin(), mine.end());
      m.round_median.push_back(median(mine));
      m.per_rank.add(result, f.warmup_steps);
      m.buffers = result.buffer_bytes;
      if (traced) fig.trace = std::move(result.trace);
      m.outputs_valid = result.outputs_valid;
      for (size_t r = 0; r < m.peak.size(); ++r) {
        // Local backend: one process holds every rank; its peak is rank 0's entry.
        const int64_t p = f.backend == "mpi" ? peaks[r] : (r == 0 ? peaks[0] : 0);
        m.peak[r] = std::max(m.peak[r], p);
      }
    }
  }
  if (lead) *out = std::move(fig);
  return Status::ok_status();
}

std::string mib(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.0f", static_cast<double>(b) / (1024.0 * 1024.0));
  return s;
}

// Median over rounds of a / b, each round's two modes paired (they ran back to back, so a slow
// period of a shared host falls on both).
double paired(const ModeFigures& a, const ModeFigures& b) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(a.round_median.size(), b.round_median.size()); ++i) {
    if (b.round_median[i] > 0) r.push_back(a.round_median[i] / b.round_median[i]);
  }
  return median(r);
}

int report(const TrainBenchFlags& f, int64_t ranks, const Figures& fig, const std::shared_ptr<const HardwareProfile>& hw) {
  const ModelSpec spec = bench_spec(f);
  const Batch batch = dp_batch(f, ranks);
  const StepFlops fl = step_flops(spec, batch);
  double fmax = 0, fsum = 0, rate_sum = 0;
  for (size_t r = 0; r < fl.linear.size(); ++r) fmax = std::max(fmax, fl.total(r)), fsum += fl.total(r);
  for (double x : fig.sgemm) rate_sum += x;
  const double ideal = fmax / (fsum / static_cast<double>(ranks));
  const auto& md = fig.modes;
  const double pp = median(md[kPingPong].steps), sig = median(md[kSignal].steps);
  const double exposed = pp > 0 ? (pp - sig) / pp : 0;
  const double exposed_paired = 1.0 - 1.0 / paired(md[kPingPong], md[kSignal]);
  const double sp_pp = paired(md[kColocated], md[kPingPong]);
  const double slowdown = paired(md[kSingle], md[kPingPong]) - 1.0;

  nlohmann::json j;
  j["format"] = kBenchTrainFormat;
  j["bench_flags"] = bench_flags_json(f);
  j["backend"] = f.backend;
  j["ranks"] = ranks;
  j["omp_threads"] = 1;
  j["model"] = {{"hidden", spec.hidden},         {"layers", spec.n_layers}, {"n_heads", spec.n_heads},
                {"n_kv_heads", spec.n_kv_heads}, {"head_dim", spec.head_dim}, {"ffn", spec.ffn},
                {"vocab", spec.vocab}};
  j["tokens_per_rank"] = f.tokens;
  j["long_doc"] = long_doc(f);
  j["short_doc"] = f.short_doc;
  j["rounds"] = f.rounds;
  j["steps"] = f.steps;
  j["warmup_steps"] = f.warmup_steps;
  j["sgemm_flops"] = fig.sgemm;
  j["flops_per_rank"] = {{"linear", fl.linear}, {"attention", fl.attention}};
  j["ideal_speedup"] = ideal;
  j["memory_source"] = fig.resident ? "vmhwm" : "buffer_estimate";
  j["modes"] = nlohmann::json::array();

  const char* local_note = f.backend == "local" ? " (whole process: every rank thread)" : "";
  std::string out;
  appendf(out, "distca bench train: %lld ranks (%s backend), 1 OpenMP thread per rank, OpenBLAS on 1 thread\n",
          static_cast<long long>(ranks), f.backend.c_str());
  appendf(out, "model: width %lld, %lld layers, %lld heads (%lld K/V) x %lld, ffn %lld, vocab %lld\n",
          static_cast<long long>(spec.hidden), static_cast<long long>(spec.n_layers), static_cast<long long>(spec.n_heads),
          static_cast<long long>(spec.n_kv_heads), static_cast<long long>(spec.head_dim), static_cast<long long>(spec.ffn),
          static_cast<long long>(spec.vocab));
  if (f.workload == "uniform") {
    appendf(out, "workload: uniform, %lld tokens per rank; every rank %lld document(s) of %lld\n",
            static_cast<long long>(f.tokens), static_cast<long long>(f.tokens / long_doc(f)),
            static_cast<long long>(long_doc(f)));
  } else {
    appendf(out, "workload: skewed, %lld tokens per rank; rank 0 %lld document(s) of %lld, the others %lld of %lld\n",
            static_cast<long long>(f.tokens), static_cast<long long>(f.tokens / long_doc(f)),
            static_cast<long long>(long_doc(f)), static_cast<long long>(f.tokens / f.short_doc),
            static_cast<long long>(f.short_doc));
  }
  appendf(out, "FLOPs per step, colocated:");
  for (size_t r = 0; r < fl.linear.size(); ++r) {
    appendf(out, " rank %zu %.1f G (linear %.1f, attention %.1f)%s", r, fl.total(r) / 1e9, fl.linear[r] / 1e9,
            fl.attention[r] / 1e9, r + 1 < fl.linear.size() ? ";" : "\n");
  }
  appendf(out, "sgemm at the model's linear shapes (%lld rows, 1 thread; best round), GFLOP/s per rank:",
          static_cast<long long>(sgemm_rows(f)));
  for (double x : fig.sgemm) appendf(out, " %.1f", x / 1e9);
  appendf(out, "\n%d round(s) x %lld steps per mode, the first %lld of each run discarded; medians\n", f.rounds,
          static_cast<long long>(f.steps), static_cast<long long>(f.warmup_steps));
  appendf(out, "%-18s %9s %10s %6s %8s %8s %8s %8s %8s %8s %6s %6s %9s  %s\n", "mode", "step s", "tokens/s", "MFU", "linear",
          "attn", "comm", "wait", "optim", "other", "idle", "exp", "sent MiB", fig.resident ? "peak MiB per rank" : "buffers MiB per rank");
  for (size_t mi = 0; mi < kModes.size(); ++mi) {
    const ModeFigures& m = md[mi];
    const double t = median(m.steps);
    const double tps = t > 0 ? static_cast<double>(ranks * f.tokens) / t : 0;
    const double mfu = t > 0 && rate_sum > 0 ? fsum / t / rate_sum : 0;
    const std::vector<int64_t>& mem = fig.resident ? m.peak : m.buffers;
    std::string mems;
    for (size_t r = 0; r < mem.size(); ++r) {
      if (f.backend == "local" && fig.resident && r > 0) break;
      mems += (r ? " " : "") + mib(mem[r]);
    }
    const std::vector<double> idle = m.per_rank.median_idle(), exposed = m.per_rank.median_exposed();
    appendf(out, "%-18s %9.3f %10.0f %5.1f%% %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %5.1f%% %5.1f%% %9.1f  %s%s%s\n",
            kModes[mi].name, t, tps, 100 * mfu, median(m.linear), median(m.attention), median(m.comm), median(m.wait),
            median(m.optimizer), median(m.other), 100 * mean_of(idle), 100 * mean_of(exposed), static_cast<double>(m.bytes_sent) / (1024.0 * 1024.0),
            mems.c_str(), fig.resident ? local_note : "", m.outputs_valid ? "" : "  (signal: 1-byte exchanges, outputs invalid)");
    j["modes"].push_back({{"name", kModes[mi].name},
                          {"mode", kModes[mi].mode},
                          {"overlap", kModes[mi].overlap},
                          {"median_s", t},
                          {"steps_s", m.steps},
                          {"round_median_s", m.round_median},
                          {"tokens_per_s", tps},
                          {"mfu", mfu},
                          {"linear_s", median(m.linear)},
                          {"attention_s", median(m.attention)},
                          {"comm_s", median(m.comm)},
                          {"wait_s", median(m.wait)},
                          {"optimizer_s", median(m.optimizer)},
                          {"other_s", median(m.other)},
                          {"bytes_sent", m.bytes_sent},
                          {"peak_bytes", fig.resident ? nlohmann::json(m.peak) : nlohmann::json(nullptr)},
                          {"buffer_bytes", m.buffers},
                          {"rank_idle", idle},
                          {"rank_exposed", exposed},
                          {"mean_idle", mean_of(idle)},
                          {"mean_exposed", mean_of(exposed)},
                          {"outputs_valid", m.outputs_valid}});
  }
  if (hw) {
    // The simulator on the measured profile, beside the measured medians (issue 17's check).
    appendf(out, "sim (hardware profile %s, %lld ranks at once): step s, of measured, idle, exposed (means over ranks):",
            f.hardware.c_str(), static_cast<long long>(hw->ranks));
    for (size_t mi = 0; mi < kModes.size(); ++mi) {
      const SimFigures sim = predict(f, ranks, kModes[mi], rate_sum / static_cast<double>(ranks), nullptr, hw, {batch});
      const double t = median(md[mi].steps);
      if (sim.ok) {
        appendf(out, " %s %.3f s (%.2f), %.1f%%, %.1f%%%s", kModes[mi].name, sim.step_s, t > 0 ? sim.step_s / t : 0.0,
                100 * mean_of(sim.rank_idle), 100 * mean_of(sim.rank_exposed), mi + 1 < kModes.size() ? ";" : "\n");
      } else {
        appendf(out, " %s: %s%s", kModes[mi].name, sim.error.c_str(), mi + 1 < kModes.size() ? ";" : "\n");
      }
      j["modes"][mi]["sim"] = sim_json(sim, t);
    }
    j["simulator"] = {{"hardware", "hardware profile " + f.hardware}};
  }
  nlohmann::json sp = nlohmann::json::object();
  for (size_t mi = 1; mi < kModes.size(); ++mi) sp[kModes[mi].overlap] = paired(md[kColocated], md[mi]);
  j["speedup_paired"] = sp;
  j["pingpong_over_ideal"] = sp_pp / ideal;
  j["single_stream_slowdown"] = slowdown;
  j["exposed"] = exposed;
  j["exposed_paired"] = exposed_paired;

  appendf(out, "time split: rank 0's StepMetrics, medians (comm = exchanges waited for + all-reduces; wait = behind the "
               "slowest rank; other = the step's rest: planning, inputs); idle = 1 - (linear + attn) / step, exp = comm "
               "/ step, each rank's own, mean over ranks; sent = rank 0's attention bytes sent, last layer, forward + "
               "backward\n");
  appendf(out, "ideal speedup (FLOPs, perfect balance: max / mean over ranks): %.3f\n", ideal);
  appendf(out, "speedup over colocated (paired by round): single-stream %.3f, pingpong %.3f, signal %.3f\n",
          sp["single-stream"].get<double>(), sp["pingpong"].get<double>(), sp["signal"].get<double>());
  appendf(out, "pingpong / ideal speedup: %.3f\n", sp_pp / ideal);
  appendf(out, "single-stream slower than pingpong: %+.1f%% (paired)\n", 100 * slowdown);
  appendf(out, "exposed: %.1f%% ((pingpong - signal) / pingpong, medians; paired %.1f%%)\n", 100 * exposed,
          100 * exposed_paired);
  appendf(out, "MFU: model FLOPs per step / step time / (sum of the ranks' sgemm rates)\n");
  if (!fig.resident) {
    appendf(out, "peak memory: /proc/self/clear_refs is not writable here, so the column is the trainer's buffer "
                 "estimate (TrainResult::buffer_bytes), not resident memory\n");
  } else {
    appendf(out, "peak memory: VmHWM of each rank process%s, reset before every run\n", local_note);
  }
  std::vector<std::pair<std::string, std::string>> files;
  if (!f.trace.empty()) {
    TraceMetadata meta;
    TraceProcess proc{0, "distca bench train", 0, {}};
    for (int64_t r = 0; r < ranks; ++r) proc.threads.emplace_back(r, "rank " + std::to_string(r));
    meta.processes.push_back(std::move(proc));
    meta.other_data = {{"mode", "cad pingpong"}, {"round", f.rounds}, {"step", f.steps - 1}, {"backend", f.backend}};
    files.emplace_back(f.trace, chrome_trace_json(fig.trace, meta));
  }
  return finish_report(f, std::move(out), j, std::move(files));
}

std::vector<Mode> bench_modes(const TrainBenchFlags& f) {
  return f.pp > 1 ? pipeline_modes() : std::vector<Mode>(kModes.begin(), kModes.end());
}

// What the trainer's config checks would refuse of the model and the pipeline, said in bench
// train's flags (the trainer's messages name `--mode cad` and `[model_overrides]`, which bench
// train does not have).
Status check_pipeline_flags(const TrainBenchFlags& f, int64_t ranks) {
  const ModelSpec m = bench_spec(f);
  // The trainer's model ranges (train::model_ranges), each named by the flag that sets it.
  const std::pair<const char*, const char*> flag_of[] = {
      {"n_layers", "--layers"}, {"hidden", "--width"}, {"n_heads", "--width / --head-dim (query heads)"},
      {"n_kv_heads", "--width / --head-dim (K/V heads)"}, {"head_dim", "--head-dim"},
      {"ffn", "--width (ffn: about 8/3 of it)"}, {"vocab", "--vocab"}};
  for (const train::ModelRange& r : train::model_ranges()) {
    const int64_t v = m.*(r.field);
    if (v >= r.min && v <= r.max) continue;
    std::string flag = r.key;
    for (const auto& [key, name] : flag_of) {
      if (flag == key) flag = name;
    }
    return Status::invalid_argument(flag + " gives " + r.key + " " + std::to_string(v) + ", outside the trainer's " +
                                    std::to_string(r.min) + ".." + std::to_string(r.max));
  }
  const int64_t widest = std::max({m.hidden, m.q_dim(), m.kv_dim(), m.ffn, m.vocab});
  if (widest > INT32_MAX / f.tokens) {
    return Status::invalid_argument("--tokens-per-rank " + std::to_string(f.tokens) + " times the model's widest layer (" +
                                    std::to_string(widest) + ") exceeds the BLAS int range (2^31 - 1)");
  }
  if (f.pp == 1) return {};
  const std::string pp = "--pp " + std::to_string(f.pp);
  if (ranks % f.pp != 0) {
    return Status::invalid_argument(pp + " must divide the ranks (" + std::to_string(ranks) +
                                    (f.backend == "mpi" ? ": mpirun -np)" : ": --ranks)"));
  }
  if (f.micro_batches < f.pp) {
    return Status::invalid_argument("--micro-batches " + std::to_string(f.micro_batches) + " is fewer than " + pp +
                                    " (1F1B needs at least one micro-batch per stage)");
  }
  // Every pipeline run includes the cad modes, whose ticks run the same layers on every stage.
  if (f.layers % f.pp != 0) {
    return Status::invalid_argument(pp + " must divide --layers " + std::to_string(f.layers) +
                                    " (the cad modes run the same layers on every stage per tick)");
  }
  return {};
}

}  // namespace

int64_t bench_train::run_ranks(const TrainBenchFlags& f) {
  return f.backend == "mpi" ? std::max<int64_t>(detect_launcher().size == 1 ? 1 : 2, detect_launcher().size) : f.ranks;
}

Status bench_train::check_flags(const TrainBenchFlags& f, bool ranks_given) {
  auto multiple16 = [](const char* flag, int64_t v) -> Status {
    if (v <= 0 || v % 16 != 0) {
      return Status::invalid_argument(std::string(flag) + " must be a positive multiple of 16 (got " + std::to_string(v) + ")");
    }
    return {};
  };
  DISTCA_RETURN_IF_ERROR(multiple16("--width", f.width));
  DISTCA_RETURN_IF_ERROR(multiple16("--tokens-per-rank", f.tokens));
  if (!f.compare) {  // --compare draws its documents
    DISTCA_RETURN_IF_ERROR(multiple16("--short-doc", f.short_doc));
    if (f.long_doc != 0) DISTCA_RETURN_IF_ERROR(multiple16("--long-doc", f.long_doc));
    if (f.tokens % long_doc(f) != 0) return Status::invalid_argument("--long-doc must divide --tokens-per-rank");
    if (f.tokens % f.short_doc != 0) return Status::invalid_argument("--short-doc must divide --tokens-per-rank");
  }
  if (f.head_dim <= 0 || f.head_dim % 2 != 0 || f.width % f.head_dim != 0) {
    return Status::invalid_argument("--head-dim must be even and divide --width (got " + std::to_string(f.head_dim) + ")");
  }
  if (f.steps <= f.warmup_steps) {
    return Status::invalid_argument("--steps (" + std::to_string(f.steps) + ") must exceed --warmup-steps (" +
                                    std::to_string(f.warmup_steps) + ")");
  }
  if (f.backend == "mpi" && ranks_given) return Status::invalid_argument("--ranks applies to --backend local (mpi: mpirun -np)");
  if (f.backend == "local" && detect_launcher().size > 1) {
    return Status::invalid_argument("--backend local under mpirun would run one independent benchmark per process; add --backend mpi");
  }
  DISTCA_RETURN_IF_ERROR(check_distinct_outputs({{"--json", f.json, true}, {"--trace", f.trace}}));
  if (!f.json.empty() && f.json != "-") {
    if (Status st = check_output_path(f.json); !st.ok()) return Status::invalid_argument("--json: " + st.message());
  }
  if (!f.trace.empty()) {
    if (Status st = check_output_path(f.trace); !st.ok()) return Status::invalid_argument("--trace: " + st.message());
  }
  // The trainer's own checks (model, workload) for every mode.
  const int64_t ranks = run_ranks(f);
  if (f.pp > 1 && !f.trace.empty()) return Status::invalid_argument("--trace is not recorded with --pp (yet)");
  if (f.pp == 1 && !f.cost_table.empty()) return Status::invalid_argument("--cost-table applies to --pp > 1 (the simulator's prediction)");
  if (f.pp == 1 && f.micro_batches > 1) return Status::invalid_argument("--micro-batches applies to --pp > 1");
  if (!f.cost_table.empty() && !std::ifstream(f.cost_table)) {
    return Status::invalid_argument("--cost-table " + f.cost_table + ": cannot be read");
  }
  DISTCA_RETURN_IF_ERROR(check_pipeline_flags(f, ranks));
  if (f.compare) return {};  // its mode entries are checked with its options (CompareOptions::validate)
  // The trainer's own checks (train/config.h) for every mode. The checks above answer every
  // case they know in bench train's own flags; one that still reaches the trainer says so, since
  // its message names `distca train`'s flags and keys.
  for (const Mode& m : bench_modes(f)) {
    if (Status st = make_config(f, ranks, m).validate(); !st.ok()) {
      return Status::invalid_argument("the flags make a training run that distca train refuses (mode " +
                                      std::string(m.name) + "): " + st.message());
    }
  }
  return {};
}

namespace {

int run(const TrainBenchFlags& f, bool ranks_given) {
  if (f.compare) return run_compare_bench(f, ranks_given);
  const bool first = detect_launcher().rank <= 0;  // before the group exists only rank 0 speaks
  if (Status st = check_flags(f, ranks_given); !st.ok()) return first ? fail_input(st.message()) : kExitBadInput;
  if (f.pp > 1) return run_pipeline(f);
  auto loaded = load_hardware_flag(f);
  if (!loaded.ok()) return first ? fail_input(loaded.status().message()) : kExitBadInput;
  const std::shared_ptr<const HardwareProfile> hw = *loaded;
  const kernels::ScopedBlasThreads one_blas_thread(1);
  Figures fig;
  // With --trace on mpi the communicator records its exchanges' transfers too (declared before
  // the launch, whose communicator records into it until it is gone).
  TraceRecorder recorder;
  const bool mpi = f.backend == "mpi";
  comm::LaunchOptions lo{mpi ? comm::Backend::kMpi : comm::Backend::kLocal, f.ranks, {}};
  lo.mpi.timeout_s = f.mpi_timeout;
  if (mpi && !f.trace.empty()) lo.mpi.trace = &recorder;
  std::optional<train::DataSource> data;
  // Every process checks its own memory; the lowest rank that refused speaks, and all stop.
  auto prepare = [&](const comm::GroupInfo& g) -> Status {
    // One rank only under a launcher that says so (mpirun -np 1: the validation's 1-rank run).
    if (mpi && g.size < 2 && detect_launcher().size != 1) {
      return Status::invalid_argument("--backend mpi needs at least 2 ranks (mpirun -np 2 ...)");
    }
    if (Status mem = check_bench_memory(f, g.size, g.rank == 0, bench_modes(f)); !mem.ok()) {
      return Status::invalid_argument(mem.message());
    }
    DISTCA_ASSIGN_OR_RETURN(data, train::DataSource::fixed(dp_batch(f, g.size), std::min<int64_t>(32, f.vocab), 1));
    return Status::ok_status();
  };
  const comm::Launched launched = comm::launch(lo, bench_settings(f), prepare, [&](comm::Communicator& c, int slot) {
    return run_rank(c, f, *data, slot == 0, mpi && !f.trace.empty() ? &recorder : nullptr, &fig);
  });
  if (!launched.status.ok()) return launch_failed(launched);
  if (!launched.speaks) return kExitOk;
  return report(f, launched.group.size, fig, hw);
}

Runner setup(CLI::App& app) {
  auto f = std::make_shared<TrainBenchFlags>();
  app.add_option("--backend", f->backend, "local (rank threads) or mpi (under mpirun)")
      ->check(CLI::IsMember({"local", "mpi"}));
  CLI::Option* ranks = app.add_option("--ranks", f->ranks, "ranks of the local backend (default 2)")->check(CLI::Range(2, 64));
  app.add_option("--width", f->width, "model width (hidden size; multiple of 16, default 512)")
      ->check(CLI::Range(int64_t{16}, int64_t{65536}));
  app.add_option("--layers", f->layers, "transformer layers (default 2)")->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--head-dim", f->head_dim, "head dimension: width / it query heads, half as many K/V heads (default 64)")
      ->check(CLI::Range(int64_t{2}, int64_t{1024}));
  app.add_option("--vocab", f->vocab, "vocabulary (default 512)")->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  CLI::Option* tokens_opt = app.add_option(
      "--tokens-per-rank", f->tokens,
      "tokens per rank per step (multiple of 16; default 8192, with --pp > 1 4096 per micro-batch: the defaults fit "
      "4 ranks of a 24 GiB machine, about 11 GiB at -np 4; larger runs are refused by the memory estimate)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--long-doc", f->long_doc, "length of rank 0's documents (default: one of --tokens-per-rank)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--short-doc", f->short_doc, "length of the other ranks' documents (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--rounds", f->rounds, "rounds; each runs every mode once (default 3)")->check(CLI::Range(1, 1000));
  app.add_option("--steps", f->steps, "steps per run (default 3)")->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("--warmup-steps", f->warmup_steps, "first steps of every run not timed (default 1)")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  app.add_option("--tolerance", f->tolerance, "cad scheduler's balance tolerance (default 0.05)")->check(CLI::Range(0.0, 1.0));
  add_mpi_timeout(app, f->mpi_timeout, "mpi");
  app.add_option("--json", f->json, "write the figures as JSON to FILE (- for stdout)");
  app.add_option("--trace", f->trace, "write a Chrome trace (Perfetto) of the last round's cad pingpong, last step");
  app.add_option("--pp", f->pp, "pipeline stages (ranks = replicas x stages): colocated 1F1B against cad's "
                               "1F1B ticks with pooled attention, micro-batches of skewed attention (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  app.add_option("--micro-batches", f->micro_batches, "--pp: micro-batches per replica and step (default 2 x --pp)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--cost-table", f->cost_table, "--pp: the simulator's attention seconds from a `distca profile` table");
  app.add_option("--workload", f->workload,
                 "skewed (rank 0, with --pp micro-batches 0, 4, ...: --long-doc documents, the rest --short-doc) or "
                 "uniform (every rank and micro-batch --long-doc documents; default skewed); with --compare pretrain "
                 "or prolong (drawn documents up to a rank's tokens; default pretrain)")
      ->check(CLI::IsMember({"skewed", "uniform", "pretrain", "prolong"}));
  app.add_flag("--compare", f->compare,
               "every mode on one configuration, paired round by round on the same drawn steps: colocated, cad "
               "single-stream, cad pingpong (step time, idle, exposed communication, bytes, peak memory per rank)");
  app.add_option("--seed", f->seed, "--compare: the seed of the drawn documents (default 1)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 62));
  app.add_option("--hardware", f->hardware,
                 "the simulator's hardware profile of this machine (`distca profile --hardware-out`: GEMM rates, "
                 "attention, links): its prediction beside every mode's measured step");
  CLI::Option* layers_opt = app.get_option("--layers");
  CLI::Option* workload_opt = app.get_option("--workload");
  CLI::Option* long_opt = app.get_option("--long-doc");
  CLI::Option* short_opt = app.get_option("--short-doc");
  CLI::Option* seed_opt = app.get_option("--seed");
  return [f, ranks, layers_opt, tokens_opt, workload_opt, long_opt, short_opt, seed_opt] {
    TrainBenchFlags g = *f;
    const bool drawn = g.workload == "pretrain" || g.workload == "prolong";
    const bool first = detect_launcher().rank <= 0;  // before the group exists only rank 0 speaks
    if (!g.compare && (drawn || seed_opt->count() > 0)) {
      return first ? fail_input(std::string(drawn ? "--workload " + g.workload : "--seed") + " applies to --compare")
                   : kExitBadInput;
    }
    if (g.compare) {
      if (workload_opt->count() > 0 && !drawn) {
        return first ? fail_input("--compare draws its documents: --workload pretrain or prolong (got " + g.workload + ")")
                     : kExitBadInput;
      }
      if (workload_opt->count() == 0) g.workload = "pretrain";
      g.doc_flags_given = long_opt->count() > 0 || short_opt->count() > 0;
      // 16K tokens per rank (8K per micro-batch with --pp): attention a real share of the step.
      if (tokens_opt->count() == 0) g.tokens = 16384;
    }
    if (g.pp > 1 && g.micro_batches == 0) g.micro_batches = 2 * g.pp;
    // 2 x --pp micro-batches of 8192 tokens would need 17-21 GiB at 4 ranks (--pp 2, 4).
    if (g.pp > 1 && tokens_opt->count() == 0) g.tokens = g.compare ? 8192 : 4096;
    if (g.pp > 1 && layers_opt->count() == 0) g.layers = (g.layers + g.pp - 1) / g.pp * g.pp;
    return run(g, ranks->count() > 0);
  };
}

}  // namespace

DISTCA_REGISTER_COMMAND(bench_train, {"train", "bench",
                                      "Training step: colocated vs cad single-stream, pingpong and signal", 63,
                                      &setup});

}  // namespace distca::cli
