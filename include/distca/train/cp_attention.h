// Per-document context parallelism through collectives: the core attention of
// `distca train --mode wlb` and `--mode percp` (docs/training.md, "Baselines: wlb and percp"),
// run the way WLB-LLM and Megatron/TransformerEngine's all-gather CP run it.
//
// The micro-batch's layout is every data-parallel rank's pieces in its row order (rank r's rows
// are its pieces laid one after another). Each document is in one class:
//   local  every piece on one rank: attention there, nothing moves;
//   group  pieces on several ranks, all in one CP group (ranks gC .. gC+C-1): the group
//          all-gathers the K/V rows of its group-class pieces (Communicator::all_gather_v on
//          the CP group's communicator);
//   wide   pieces on ranks of several CP groups (the loader's packing kept, a document cut
//          because no rank had room, or percp's document crossing a group boundary): the same
//          over the data-parallel communicator.
// Gather block of a rank (for one class): its pieces of that class in layout order, all their K
// rows, then all their V rows ((rows, n_kv_heads, head_dim) floats each); the gathered buffer is
// the members' blocks in rank order (all_gather_v's layout).
//
// Each rank then computes attention for its own pieces in one fused kernel call: the task of a
// piece [a, a + n) of a document of length L takes the query rows [a', b') - a rounded down and
// a + n rounded up (capped at L) to the kernel's query tile (kernels/attention_traits.h), the
// rows outside the piece zero - against the K/V of [0, b') (causal, bottom-right aligned), so
// every row's O and LSE are bitwise those of the whole-document call. The LSE is kept per layer
// for backward.
//
// Backward re-gathers the K/V (TransformerEngine's all-gather CP does the same instead of
// keeping the gathered K/V per layer), runs the kernel's backward on the same tasks (the padded
// rows get a zero output gradient, so they add exactly zero), sums each document position's
// dK/dV over the rank's tasks in task order, and reduce-scatters the group and wide classes'
// partials back to the rows' holders (Communicator::reduce_scatter_sum: a rank-order sum, so
// the bits do not depend on the backend or timing). dq, dk, dv are overwritten.
//
// Bytes (payload this rank sends): forward, (members - 1) x its block per gather; backward, the
// same again plus (class rows of the group - its own) x 2 x kv row bytes per reduce-scatter.
//
// Trace (set_trace): each call records, on row `tid`, its layer's span "cp attention fwd" /
// "cp attention bwd" (category "cp", arg layer) and inside it, in order: each collective as a
// "comm" span ("cp all-gather kv", "cp reduce-scatter dkv", "... (dp)" for the wide class) with
// a "wait" span of the same extent nested in it ("... wait": a blocking collective is exposed
// for all its time), the contexts' assembly ("cp assemble", compute) and the kernel ("attention
// fwd" / "attention bwd", compute). The wait spans are read from the same clock readings that
// waited_seconds() sums, so a step's wait spans add up to the runner's waited seconds, which
// StepMetrics::comm_s (and bench train --compare's exposed communication) counts.
//
// Thread safety: one object per rank, used by its thread; the calls are collective over the two
// communicators (every member makes the same calls in the same order). Kernel calls hold
// kernels::kernel_mutex().
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/status.h"
#include "distca/core/trace.h"
#include "distca/data/batch.h"
#include "distca/kernels/attention.h"
#include "distca/runtime/dispatcher.h"
#include "distca/runtime/tick_runner.h"

namespace distca::train {

// Bytes one rank sends per layer of forward and of backward (see above). [ranks]
struct CpBytes {
  std::vector<int64_t> forward, backward;
};
// The figures from the layout alone (what CpAttention counts as it sends).
CpBytes cp_attention_bytes(const Batch& layout, int64_t cp, const runtime::AttentionDims& dims);

class CpAttention {
 public:
  // layout: as above (validated); rank: this rank's index in it; cp divides layout.ranks;
  // layers: the layers whose LSE is kept. Errors: an invalid layout or cp, rank out of range.
  static Result<CpAttention> create(const Batch& layout, int64_t rank, int64_t cp, const runtime::AttentionDims& dims,
                                    int64_t layers);

  // One layer. cp_comm: this rank's CP group (its ranks in order); dp_comm: the layout's ranks.
  // q: (rows, n_heads, head_dim); k, v: (rows, n_kv_heads, head_dim); o: like q (written).
  Status forward(int64_t layer, comm::Communicator& cp_comm, comm::Communicator& dp_comm, const float* q,
                 const float* k, const float* v, float* o);
  // After forward(layer) with the same q, k, v, o. d_o, dq: like q; dk, dv: like k (written).
  Status backward(int64_t layer, comm::Communicator& cp_comm, comm::Communicator& dp_comm, const float* q,
                  const float* k, const float* v, const float* o, const float* d_o, float* dq, float* dk, float* dv);

  int64_t rows() const { return rows_; }
  // The rows the call's buffers hold (train/memory.h, cp_row_limits): the gathered K/V rows
  // (both classes), the fused call's context rows and padded query rows.
  int64_t gathered_rows() const { return group_.total + wide_.total; }
  int64_t context_rows() const { return cu_k_.back(); }
  int64_t query_rows() const { return cu_q_.back(); }
  // The LSE of layer `layer`'s last forward: (rows, n_heads).
  std::vector<float> lse_rows(int64_t layer) const;
  // Bytes sent by the last forward / backward call.
  int64_t last_forward_bytes() const { return fwd_bytes_; }
  int64_t last_backward_bytes() const { return bwd_bytes_; }
  // Seconds blocked in collectives, summed over calls.
  double waited_seconds() const { return waited_; }
  // Records the calls' spans into `trace` (not owned; nullptr: none) on row `tid`.
  void set_trace(TraceRecorder* trace, int64_t tid) {
    trace_ = trace;
    tid_ = tid;
  }
  // The largest buffers one call held (gathered rows, padded tasks), bytes.
  int64_t peak_buffer_bytes() const { return peak_bytes_; }

 private:
  enum Class : int { kLocal = 0, kGroup = 1, kWide = 2 };
  struct Source {  // where a document position's K/V row is
    int cls = kLocal;
    int64_t member = 0;  // the holder's rank in the layout
    int64_t row = 0;     // local: the row in this rank's buffers; else the row in the holder's block
  };
  struct Task {
    int64_t doc = 0, a = 0, n = 0, row = 0;  // the piece and its first local row
    int64_t qa = 0, qb = 0;                  // padded query rows (document positions)
  };
  struct Gather {  // one class's collective on one communicator
    std::vector<std::size_t> rows;  // [member] class rows of the member's block
    std::vector<int64_t> displ;     // [member] rows of the blocks before it
    int64_t total = 0;              // their sum
    int64_t first_member = 0;       // the layout rank of member 0
    std::vector<std::pair<int64_t, int64_t>> my_pieces;  // my class pieces' local rows [first, end)
    std::vector<float> buffer;      // gathered: per member, its K rows then its V rows
  };
  using TimePoint = TraceRecorder::Clock::time_point;
  CpAttention() = default;
  Status gather(Gather& g, comm::Communicator& comm, const float* k, const float* v, int64_t& bytes,
                const std::string& name);
  Status scatter_back(Gather& g, comm::Communicator& comm, std::vector<float>& partials, float* dk, float* dv,
                      int64_t& bytes, const std::string& name);
  // Both classes' gathers, group then dp (the order every member keeps).
  Status gather_all(comm::Communicator& cp_comm, comm::Communicator& dp_comm, const float* k, const float* v,
                    int64_t& bytes);
  // A span of the current call (no-op without a trace).
  void span(const std::string& name, const char* category, TimePoint t0, TimePoint t1) const;
  // A blocking collective's comm span with its wait span; adds its seconds to waited_.
  void collective_done(const std::string& name, TimePoint t0, TimePoint t1);
  const float* kv_row(const Source& s, const float* local, bool value) const;
  // The tasks' K/V contexts into kctx_, vctx_.
  void build_contexts(const float* k, const float* v);
  // rows (rows_, width) laid on the padded task rows, zeros outside the pieces; and back.
  std::vector<float> pad(const float* rows, int64_t width) const;
  void unpad(const std::vector<float>& padded, int64_t width, float* rows) const;
  // The kernel's arguments over the tasks (inputs: the padded q, kctx_, vctx_).
  kernels::AttentionParams params(const float* q_padded) const;
  void note_peak(int64_t extra_floats);

  runtime::AttentionDims dims_;
  int64_t rows_ = 0, tile_ = 1;
  std::vector<Task> tasks_;
  std::map<int64_t, std::vector<Source>> where_;  // [doc I hold] per position
  Gather group_, wide_;
  bool group_active_ = false, wide_active_ = false;  // the collectives run (same on every member)
  std::vector<int32_t> cu_q_, cu_k_;
  std::vector<float> kctx_, vctx_;
  std::vector<std::vector<float>> lse_;  // [layer] (n_heads, padded rows)
  int64_t fwd_bytes_ = 0, bwd_bytes_ = 0, peak_bytes_ = 0;
  double waited_ = 0;
  TraceRecorder* trace_ = nullptr;
  int64_t tid_ = 0, layer_ = 0;  // the trace's row; the layer of the call in progress
};

// The runner of one micro-batch in wlb and percp modes: the model's linear work in
// single-stream order (runtime/tick_runner.h: forward nano 0 then 1 before each layer's
// attention, backward 1 then 0) around CpAttention, so the linear layers give the bits they
// give under the dispatcher. run() takes a TickIo with forward or backward (not both; no
// adopt).
// trace (not owned; nullptr: none): the attention's spans (above) and the linear calls'
// ("ping linear", "pong linear bwd", ... as runtime::TickRunner records them) on row `tid`.
class CpRunner {
 public:
  CpRunner(CpAttention attention, comm::Communicator& cp_comm, comm::Communicator& dp_comm,
           TraceRecorder* trace = nullptr, int64_t tid = 0)
      : att_(std::move(attention)), cp_(cp_comm), dp_(dp_comm), trace_(trace), tid_(tid) {
    att_.set_trace(trace, tid);
  }
  Status run(const runtime::TickIo& io);
  runtime::RunnerTimes times() const;
  // Bytes sent by the last forward and backward of one layer (TickRunner::last_bytes_sent).
  int64_t last_bytes_sent() const { return att_.last_forward_bytes() + att_.last_backward_bytes(); }
  int64_t peak_buffer_bytes() const { return att_.peak_buffer_bytes(); }

 private:
  void linear(const runtime::LinearFn& fn, int nano, int layer, bool backward);
  CpAttention att_;
  std::vector<runtime::LayerForward> forward_;  // the forward's buffers, read again in backward
  comm::Communicator& cp_;
  comm::Communicator& dp_;
  TraceRecorder* trace_;
  int64_t tid_;
  double linear_s_ = 0, total_s_ = 0;
};

}  // namespace distca::train
