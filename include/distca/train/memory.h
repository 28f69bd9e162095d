// What one `distca train` process will allocate, estimated from the config before anything is
// allocated (docs/training.md, "Memory"). The CLI refuses a run whose estimate exceeds the
// memory limit (check_memory) with exit 2.
//
// The estimate is an upper bound of the process's peak resident memory (VmHWM), built from:
//   per rank   parameters, gradients, AdamW m and v (4 fp32 copies), the all-reduce's
//              receive and slice buffers (1 + 1/ranks copies), the activations kept for
//              backward plus backward's scratch (model_memory() x tokens per rank; with
//              pipelines the largest stage's stage_memory() in its slots), a bound
//              on the dispatcher's row buffers, the step's plan (every rank builds the whole
//              plan: its per-peer tables grow with ranks squared), and the threads the rank
//              runs (its own and its OpenMP team; each touches a stack, an OpenBLAS packing
//              buffer and a malloc arena: a measured constant);
//   once       the process's baseline (code, libraries, MPI), the text corpus (shared by the
//              rank threads), rank 0's checkpoint copies (a resumed checkpoint held for the
//              run; the copy, serialised bytes and writer's copy of one being written), and the metrics
//              JSONL kept in memory.
// Under the local backend a process holds every rank; under mpi one.
//
// Tokens per rank are the largest rank's (TrainConfig::rank_capacity: wlb's chunking lets
// ranks hold up to its cap). The dispatcher bound assumes a rank's received and fused query
// rows stay within kDispatchRowFactor x its tokens T, and its received K/V and fused context
// rows within kDispatchRowFactor x T + 2 x the longest document (a task's context is its document's
// prefix, duplicated on every server that holds a piece of it), twice that with ping-pong
// (two plans live at once, and pong's tasks read ping's rows again), summed over the live
// plans, and twice that for CAD's pipeline ticks (a forward and a backward pooled plan at
// once; their servers are stateless, so only one layer's rows live); run_training checks every
// step's plan against these limits and fails the run if one is exceeded (the estimate then was
// not a bound), before the dispatcher allocates.
//
// wlb and percp run no dispatcher: their attention goes through the CP runner
// (train/cp_attention.h), whose buffers take the dispatcher term's place (cp_row_limits): per
// in-flight micro-batch the gathered K/V of the shared documents (G rows), the tasks' K/V
// contexts (X rows), the LSE of every layer over the padded query rows (Q), and at backward's
// peak as many dK/dV partials and context gradients again plus four padded query-shaped
// buffers, with the gather's send block. run_training checks every micro-batch's rows against
// cp_row_limits before the CP runner allocates them.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "distca/core/specs.h"
#include "distca/train/config.h"

namespace distca::train {

// Rows a rank's dispatcher may receive or gather, in multiples of its own tokens (measured
// peaks stay below 2.6; docs/training.md).
inline constexpr int64_t kDispatchRowFactor = 4;

struct TrainMemoryEstimate {
  // Per rank.
  int64_t model_state = 0;   // params, grads, AdamW m and v
  int64_t all_reduce = 0;    // gradient all-reduce buffers
  int64_t activations = 0;   // saved activations + backward scratch
  int64_t dispatcher = 0;    // bound on the dispatcher's buffers (kDispatchRowFactor); 0 in wlb, percp
  int64_t cp_buffers = 0;    // wlb, percp: bound on the CP runner's buffers (cp_row_limits)
  int64_t plan = 0;          // the step's plan (per-peer tables: ranks^2)
  int64_t threads = 0;       // this rank's threads (stacks, BLAS buffers, arenas)
  // Once per process.
  int64_t baseline = 0;      // code, libraries, MPI
  int64_t data = 0;          // text corpus as tokens (+ the largest file's bytes while read)
  int64_t checkpoints = 0;   // rank 0: resumed checkpoint + one being written
  int64_t metrics = 0;       // the JSONL kept in memory

  int64_t ranks_in_process = 1;
  int64_t per_rank() const {
    return model_state + all_reduce + activations + dispatcher + cp_buffers + plan + threads;
  }
  // What the process needs at its peak.
  double process_total() const {
    return static_cast<double>(per_rank()) * static_cast<double>(ranks_in_process) +
           static_cast<double>(baseline + data + checkpoints + metrics);
  }
};

struct MemoryInputs {
  int64_t ranks_in_process = 1;  // config.ranks (local backend) or 1 (mpi)
  int64_t threads_per_rank = 0;  // 0: the rank's OpenMP team (omp_get_max_threads), +1 under mpi
  int64_t text_bytes = 0;        // sum of the text corpus's file sizes (0: copy task)
  int64_t text_files = 0;
  int64_t largest_text_file = 0;
  bool lead = true;              // this process holds rank 0 (checkpoints, metrics)
  bool resume = false;
  bool mpi = false;
};

TrainMemoryEstimate estimate_train_memory(const TrainConfig& config, const ModelSpec& spec,
                                          const MemoryInputs& in);

// The flags the estimate grows with, for check_memory's message: "--ranks 1024
// --tokens-per-rank 256 --model tiny".
std::string memory_flags(const TrainConfig& config);

// The most rows one rank's dispatcher may hold under the estimate (see above).
struct DispatchRowLimits {
  int64_t q = 0;   // received Q rows; the fused call's query rows
  int64_t kv = 0;  // received K/V rows; the fused call's context rows
};
DispatchRowLimits dispatch_row_limits(const TrainConfig& config);

// The most rows one rank's CP runner (wlb, percp) may hold for one micro-batch, bounds that
// hold for every layout the re-packs make (so the check in run_training is an invariant):
// every gathered row is a row of the micro-batch (G <= dp x tokens_per_rank, or dp x the cap
// under wlb's re-pack across micro-batches); a task's context is a prefix of its document, a
// rank holds at most two pieces (head and tail) of a shared document, a document held whole
// on one rank reads only its own rows, and the split into two nano-batches cuts at most one
// piece more, so X <= T + 2 G + the longest document; a task's padded query rows lie within its
// context, so Q <= X (short shared documents under percp are padded to nearly their whole
// length on every holder).
struct CpRowLimits {
  int64_t gathered = 0;  // G: rows of the all-gathered K/V (group and dp classes together)
  int64_t context = 0;   // X: the fused call's context rows
  int64_t query = 0;     // Q: the fused call's padded query rows
};
CpRowLimits cp_row_limits(const TrainConfig& config);

// Micro-batches pipeline stage `stage` holds at once: min(micro_batches, pp - stage) (both
// modes run every stage in its 1F1B order), 1 without pipelines.
int64_t pipeline_slots(const TrainConfig& config, int64_t stage);

}  // namespace distca::train
