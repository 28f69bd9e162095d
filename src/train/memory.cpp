#include "distca/train/memory.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "distca/model/llama.h"
#include "distca/model/tensor_parallel.h"

namespace distca::train {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
// Measured (docs/training.md, "Memory"): beyond its buffers a rank's thread adds about 2.5 MiB
// to VmHWM (its stack, OpenBLAS's packing buffers, a glibc malloc arena) and each further
// thread of its OpenMP team about 0.8 MiB (OMP_NUM_THREADS 1, 2, 8 at 4 and 8 ranks).
constexpr int64_t kRankThreadBytes = 4 * kMiB;
constexpr int64_t kTeamThreadBytes = 1 * kMiB;
// A process's resident baseline before any buffer: code, libraries, OpenBLAS and OpenMP
// start-up (measured 10-11 MiB), or with OpenMPI's (measured about 19 MiB per process).
constexpr int64_t kBaselineBytes = 16 * kMiB;
constexpr int64_t kMpiBaselineBytes = 32 * kMiB;
// One plan's bytes per (rank, peer) pair: six exchanges, each with four int64 per-peer
// vectors and two vectors of per-peer block lists (plan.h); make_plan's working copies and
// the dispatcher's copies of the counts at most double it.
constexpr int64_t kPlanBytesPerPeer = 2 * 6 * (4 * 8 + 2 * 24 + 2 * 16);
// Per token of the batch: the batch, the plan's tasks and segments, the rank's inputs.
constexpr int64_t kPlanBytesPerToken = 256;
// One JSONL line of metrics, generously.
constexpr int64_t kMetricsLineBytes = 512;

// Bytes as an int64, saturated at 2^58 (256 PiB): more than any machine, refused by
// check_memory, and small enough that the estimate's sums of terms cannot overflow.
int64_t to_bytes(double b) {
  constexpr double kMax = static_cast<double>(int64_t{1} << 58);
  return b >= kMax ? int64_t{1} << 58 : static_cast<int64_t>(std::ceil(b));
}

// wlb and percp: attention through the CP runner, no dispatcher.
bool collective_cp(const TrainConfig& c) { return c.mode == TrainMode::kWlb || c.mode == TrainMode::kPerCp; }

}  // namespace

int64_t pipeline_slots(const TrainConfig& c, int64_t stage) {
  if (c.pp <= 1) return 1;
  // Both modes run every stage in its 1F1B order (cad: as one_f_one_b_ticks).
  return std::min(c.micro_batches, c.pp - stage);
}

DispatchRowLimits dispatch_row_limits(const TrainConfig& c) {
  const int64_t all = c.ranks * c.tokens_per_rank;
  const int64_t longest = c.max_doc_len > 0 ? std::min(c.max_doc_len, all) : all;
  // Ping-pong keeps two plans' rows at once; pong's tasks read ping's rows as context again.
  const int64_t plans = c.mode == TrainMode::kCad && c.overlap_or_default() != runtime::OverlapMode::kSingleStream ? 2 : 1;
  // A pipeline tick of cad runs a forward and a backward pooled plan at once (each balanced
  // over every rank of the job, so a server's share stays within the same factor).
  const int64_t directions = c.mode == TrainMode::kCad && c.pp > 1 ? 2 : 1;
  const int64_t t = kDispatchRowFactor * c.rank_capacity();
  return {directions * t, directions * plans * (t + 2 * longest)};
}

CpRowLimits cp_row_limits(const TrainConfig& c) {
  // wlb's re-pack across micro-batches moves tokens between them: up to the cap on every rank.
  const int64_t per_rank = c.mode == TrainMode::kWlb && c.micro_batches > 1 ? c.rank_capacity() : c.tokens_per_rank;
  const int64_t gathered = c.dp() * per_rank;
  const int64_t all = c.dp() * per_rank;
  const int64_t longest = c.max_doc_len > 0 ? std::min(c.max_doc_len, all) : all;
  const int64_t context = c.rank_capacity() + 2 * gathered + longest;
  return {gathered, context, context};
}

TrainMemoryEstimate estimate_train_memory(const TrainConfig& c, const ModelSpec& spec, const MemoryInputs& in) {
  // Closed form (model_memory builds no per-layer table) and in double, each term saturated
  // (to_bytes): a config of absurd sizes gets a huge estimate that check_memory refuses, never
  // a wrapped, negative or small one, and sizing it allocates nothing.
  // TP: a rank holds its share of the layers and moves its heads' rows (config.validate
  // checked that tp divides the heads).
  const int64_t tp = c.tp >= 1 && model::check_tp(spec, c.tp).ok() ? c.tp : 1;
  const model::ModelMemory mem = model::model_memory(spec, 4, tp);
  const double P = static_cast<double>(mem.param_bytes);  // fp32 bytes of one copy of the parameters
  const double T = static_cast<double>(c.rank_capacity());  // the largest rank's tokens
  const double R = static_cast<double>(c.ranks);
  TrainMemoryEstimate e;
  e.ranks_in_process = in.ranks_in_process;
  e.model_state = to_bytes(4 * P);
  e.all_reduce = to_bytes(P + std::floor(P / R) + 64);
  // A pipeline's first stage keeps min(micro-batches, stages) micro-batches in flight (1F1B),
  // each with its dispatcher rows. Activations: stage s holds its own layers' in
  // pipeline_slots(s) slots plus the shared scratch (model::stage_memory, what Llama::create
  // allocates for it); a rank's bound is the largest stage's.
  const double in_flight = static_cast<double>(pipeline_slots(c, 0));
  double activations = static_cast<double>(mem.saved_activation_bytes_per_token) * in_flight +
                       static_cast<double>(mem.scratch_bytes_per_token);
  if (c.pp > 1 && c.pp <= spec.n_layers) {
    activations = 0;
    for (int64_t s = 0; s < c.pp; ++s) {
      const model::ModelMemory stage =
          model::stage_memory(spec, model::stage_layers(spec.n_layers, c.pp, s), pipeline_slots(c, s), 4, tp);
      activations = std::max(activations, static_cast<double>(stage.activation_bytes_per_token()));
    }
  }
  e.activations = to_bytes(activations * T);
  // Row bytes of the six exchanges (fp32): Q, K/V, O + lse, dO, dQ, dK/dV.
  const double heads = static_cast<double>(spec.n_heads / tp), kv_heads = static_cast<double>(spec.n_kv_heads / tp);
  const double q = heads * static_cast<double>(spec.head_dim) * 4;
  const double kv = 2 * kv_heads * static_cast<double>(spec.head_dim) * 4;
  const double lse = heads * 4, olse = q + lse;
  const DispatchRowLimits limits = dispatch_row_limits(c);
  const double rows_q = static_cast<double>(limits.q), rows_kv = static_cast<double>(limits.kv);
  const double layers = static_cast<double>(spec.n_layers);
  // Kept until backward, every layer: received Q and K/V. One layer's at a time: Q sent, O+lse
  // sent and received, the fused call's Q, O and lse, dO sent and received, dQ sent and
  // received (query-shaped); K/V sent, the fused context K and V, dK/dV sent and received.
  // cad pipelines run stateless servers (nothing kept from forward to backward: one layer's
  // rows at a time) and keep each in-flight micro-batch's LSE per layer at home instead.
  const bool stateless = c.mode == TrainMode::kCad && c.pp > 1;
  const double kept = stateless ? in_flight * layers * T * lse : in_flight * layers * (rows_q * q + rows_kv * kv);
  e.dispatcher = collective_cp(c) ? 0
                                  : to_bytes(kept + (stateless ? rows_q * (q + olse) + rows_kv * kv : 0) +
                                             rows_q * (q + 2 * olse + 2 * q + lse + 2 * q + 2 * q) +
                                             rows_kv * (kv + kv + 2 * kv));
  if (collective_cp(c)) {
    // The CP runner's buffers at backward's peak (memory.h), per in-flight micro-batch: the
    // gathered K/V and their dK/dV partials, the contexts and their gradients, the LSE of every
    // layer, four padded query-shaped buffers (q, o, dO, dQ), and the gather's send block.
    const CpRowLimits cp = cp_row_limits(c);
    const double g = static_cast<double>(cp.gathered), x = static_cast<double>(cp.context);
    const double qr = static_cast<double>(cp.query);
    e.cp_buffers = to_bytes(in_flight * (2 * g * kv + 2 * x * kv + layers * qr * lse + 4 * qr * q + T * kv));
  }
  // Planning ahead (src/train/planner.h) holds up to one step's units more than the step
  // runs: a unit is one micro-batch's plans, or a cad pipeline tick's two pooled directions
  // (2 (M + P - 1) ticks).
  const int64_t ahead = c.plan_ahead != "on" ? 0
                        : c.mode == TrainMode::kCad && c.pp > 1 ? 4 * (c.micro_batches + c.pp - 1)
                                                      : c.micro_batches;
  e.plan = to_bytes(static_cast<double>(1 + ahead) * (kPlanBytesPerPeer * R * R + kPlanBytesPerToken * R * T));
  // A rank thread is the master of its own OpenMP team; mpi adds the progress thread.
  const int64_t threads =
      in.threads_per_rank > 0 ? in.threads_per_rank : std::max(1, omp_get_max_threads()) + (in.mpi ? 1 : 0);
  // The planning thread of --plan-ahead on counts as a team thread.
  e.threads = kRankThreadBytes + kTeamThreadBytes * (threads - 1 + (c.plan_ahead == "on" ? 1 : 0));
  e.baseline = in.mpi ? kMpiBaselineBytes : kBaselineBytes;
  // Tokens are int32 per byte plus the end-of-document token, cut to max_doc_len; one file's
  // bytes while it is read.
  double tokens = static_cast<double>(in.text_bytes) + static_cast<double>(in.text_files);
  if (c.max_doc_len > 0) {
    tokens = std::min(tokens, static_cast<double>(in.text_files) * static_cast<double>(c.max_doc_len));
  }
  e.data = to_bytes(4 * tokens + static_cast<double>(in.largest_text_file));
  if (in.lead) {
    const double ckpt = 3 * P + 256;  // params, m, v
    // Writing: the Checkpoint copy, its serialised bytes and write_file_atomic's copy of them
    // (measured: 3.7 copies above a run without checkpoints). Resuming: the one read, held.
    e.checkpoints = to_bytes((c.checkpoint_dir.empty() ? 0 : 4 * ckpt) + (in.resume ? ckpt : 0));
    if (!c.metrics.empty()) e.metrics = to_bytes(2.0 * kMetricsLineBytes * static_cast<double>(c.steps));
  }
  return e;
}

std::string memory_flags(const TrainConfig& c) {
  return "--ranks " + std::to_string(c.ranks) + " --tokens-per-rank " + std::to_string(c.tokens_per_rank) +
         " --model " + c.model + (c.backend == "mpi" ? " (per mpi process)" : "");
}

}  // namespace distca::train
