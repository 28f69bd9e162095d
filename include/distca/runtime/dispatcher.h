// The CA dispatcher: runs one layer's core attention as a plan says (plan/plan.h), across the
// ranks of a Communicator. Every rank is a home (it holds its own tokens' Q/K/V and gets their
// O and gradients back) and an in-place attention server (it runs ONE fused kernel call over
// the tasks the plan gives it). docs/runtime.md draws the exchanges and the schedules.
//
// Forward, per rank:
//   start   pack Q rows (kQ send blocks) and K|V rows (kKv send blocks, deduplicated per
//           server by the plan) from the caller's buffers; start both all-to-all-v's.
//   serve   wait for them; assemble the fused Q and the per-task contiguous K/V contexts
//           (ServerTask::kv segments: local rows or received rows, a received row may feed
//           several tasks); one attention_forward; O|LSE rows of remote homes go into the kOLse
//           send buffer, local homes' rows straight into the caller's o; start kOLse.
//   finish  wait for kOLse; scatter received O (and LSE) rows to their local rows.
// K/V relays: with a multi-host plan (Plan::hosts), a K|V row that servers of one host need
// from another host crosses once (plan/topology_relay.h): the K|V exchange runs as two, the
// plan's rows less the relayed ones, then (in serve, once the first arrived) the relays
// forward theirs inside their hosts. The kKv receive buffer ends as the plan lays it out, so
// every number is the one without relays. Stateless backward sends K|V again the same way;
// dK|dV partials go straight to the holders as the plan says.
// K/V once (DispatcherOptions::kv_once, set by the runner on a nano-batch pair): the K|V
// exchange carries the pair's wire (plan/kv_once.h) instead of this plan's kKv; the first
// dispatch of a direction keeps what it received for the second, which fills its kKv receive
// buffer from both. The buffer again ends as the plan lays it out.
// Backward: by default servers KEEP their fused forward inputs and outputs (in-place servers,
// the byte rules of plan/traffic.h), so only dO travels out; dQ and dK|dV partials come back.
// Stateless servers (DispatcherOptions::stateless, the paper's design) drop them after
// forward: backward sends each query row's dO|Q|O|LSE (the kDO layout) and the K|V rows again
// (the kKv layout), so a server holds nothing between forward and backward, for more bytes.
// Both give the same bits. A server
// sums its tasks' dK/dV partials of one received row in task order; the home sums, for each
// of its rows, its own server-side partial first, then the received partials in ascending
// rank order (fixed order: the bits do not depend on timing).
//
// Wire rows (fp32): q and dO and dQ: n_heads*head_dim floats; kv and dkv: K row then V row,
// 2*n_kv_heads*head_dim floats; o_lse: O row then the row's n_heads LSE values.
//
// Signal mode (DispatcherOptions::signal): every exchange sends 1 byte to each peer the plan
// would send rows to, instead of the rows; the kernels still run (on zeros). Outputs are
// meaningless: outputs_valid() is false. It is the balance-only lower bound of the paper.
//
// Which rows a call writes: o, lse and dq only at the plan's query rows (the rows of its
// tasks' [q_begin, q_end) on this rank); a plan covering every document (any make_plan plan)
// covers every row. dk and dv: every row of the token buffer (BackwardWrite::kOverwrite; rows
// no task reads get 0) or += on every row (kAccumulate, for nano-batch plans that share K/V).
//
// The model's executor contract (model/attention_executor.h) maps 1:1: shape() <-> n_tokens()
// and dims(); forward(layer, q, k, v, o) <-> forward(layer, q, k, v, o, nullptr);
// backward(layer, d_o, dq, dk, dv) <-> backward(layer, d_o, dq, dk, dv). The caller's q, k, v
// and o must stay valid and unchanged from forward(layer) until backward(layer) returns (the
// contract guarantees it); the dispatcher keeps the rest (received rows, fused outputs, LSE)
// per layer until backward(layer) finishes or release(layer).
//
// Collectives: every call below that exchanges is collective: every rank of the group makes
// the same sequence of dispatcher calls (on every dispatcher sharing the Communicator), so
// the k-th exchange of every rank belongs together. On a non-OK Status from an exchange the
// caller must fail the group (Communicator::fail): the exchange handles are then abandoned.
//
// Thread safety: one dispatcher is used by one thread (its rank's). Kernel calls of all
// dispatchers of one process are serialised by kernels::kernel_mutex() (kernels/attention.h:
// the kernels use OpenMP and set OpenBLAS's thread count, so two must not run at once, as
// with the local backend's rank threads).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/trace.h"
#include "distca/core/status.h"
#include "distca/plan/doc_index.h"
#include "distca/plan/plan.h"

namespace distca::runtime {

namespace detail {
struct KvRelayLayout;  // src/runtime/dispatcher_relay.h
struct KvOnce;         // src/runtime/dispatcher_kv_once.h
struct KvWireSide;
}  // namespace detail

struct AttentionDims {
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  float softmax_scale = 0;  // 0: 1/sqrt(head_dim)
  int64_t q_floats() const { return int64_t{n_heads} * head_dim; }
  int64_t kv_floats() const { return int64_t{n_kv_heads} * head_dim; }
  // Positive, n_kv_heads divides n_heads; the message names the field.
  Status validate() const;
};

// Rows of the kernel's query tile for these dims: kernels::AttentionTraits::query_tile_rows of
// the GQA group (include/distca/kernels/attention_traits.h; the runtime keeps no copy). The
// dispatcher pads each task of its fused call to whole tiles of document positions, so every
// query row sits in the same tile as in a whole-document call: then O and LSE are bitwise
// those of the whole-document call (the traits' contract; docs/runtime.md, "Numerics").
// Precondition: dims.validate().ok().
int64_t query_tile_rows(const AttentionDims& dims);

struct DispatcherOptions {
  bool signal = false;                  // 1-byte exchanges (see above)
  TraceRecorder* trace = nullptr;  // not owned; events get tid = rank
  std::string label;                    // prefix of trace event names ("ping", "pong")
  bool stateless = false;               // servers keep nothing from forward to backward
  // Set by the runner (TickRunner) on the two dispatchers of a nano-batch pair: their K|V
  // exchanges carry the pair's K/V wire (plan/kv_once.h), each K/V row once per layer per
  // server and direction; null: this plan's kKv as it is. Same bits either way.
  std::shared_ptr<const detail::KvOnce> kv_once;
};

enum class BackwardWrite { kOverwrite, kAccumulate };

class CaDispatcher {
 public:
  // `plan` and `comm` must outlive the dispatcher; plan.ranks.size() == comm.size().
  // Fails (invalid_argument) on bad dims, a plan of another group size, or a plan whose
  // cu_seqlens do not match its tasks.
  static Result<std::unique_ptr<CaDispatcher>> create(comm::Communicator& comm, const Plan& plan,
                                                      const AttentionDims& dims,
                                                      const DispatcherOptions& options = {});
  ~CaDispatcher();
  CaDispatcher(const CaDispatcher&) = delete;
  CaDispatcher& operator=(const CaDispatcher&) = delete;

  int64_t n_tokens() const;  // rows of this rank's token buffer (plan.ranks[rank].tokens)
  const AttentionDims& dims() const { return dims_; }
  bool outputs_valid() const { return !options_.signal; }
  int rank() const { return rank_; }

  // Blocking calls: start + serve + finish.
  // q, o: (n_tokens, n_heads, head_dim); k, v: (n_tokens, n_kv_heads, head_dim);
  // lse (optional, a null span: none): (n_tokens, n_heads), natural log.
  // Buffer sizes: every buffer holds at least the rows above (rows beyond n_tokens are not
  // touched). A smaller one is a programming error: the call aborts through DISTCA_CHECK,
  // naming the call, the layer, the buffer and both sizes, before it reads or writes a row.
  Status forward(int layer, std::span<const float> q, std::span<const float> k, std::span<const float> v,
                 std::span<float> o, std::span<float> lse = {});
  // d_o, dq: like q; dk, dv: like k (sizes checked as above). Precondition: forward(layer)
  // finished on this dispatcher (checked: see the phase order below).
  Status backward(int layer, std::span<const float> d_o, std::span<float> dq, std::span<float> dk,
                  std::span<float> dv, BackwardWrite write = BackwardWrite::kOverwrite);

  // Phased calls, for overlap (runtime/pingpong.h). Output buffers are handed over at start
  // and must not be read until finish returns. Per layer the order is
  //   start_forward, serve_forward, finish_forward, start_backward, serve_backward,
  //   finish_backward
  // (the blocking forward/backward run three of them each). start_forward may also follow a
  // finished forward (the kept state is replaced, as for an evaluation step without backward)
  // or release(layer). Calls out of this order are a programming error, not bad input: they
  // abort through DISTCA_CHECK with a message naming the layer, the call, and the phase the
  // layer is in (they would otherwise leave the group's collectives mismatched). A non-OK
  // Status is only ever an exchange or kernel-parameter failure.
  Status start_forward(int layer, std::span<const float> q, std::span<const float> k,
                       std::span<const float> v, std::span<float> o, std::span<float> lse);
  Status serve_forward(int layer);
  Status finish_forward(int layer);
  Status start_backward(int layer, std::span<const float> d_o, std::span<float> dq, std::span<float> dk,
                        std::span<float> dv, BackwardWrite write);
  Status serve_backward(int layer);
  Status finish_backward(int layer);  // also drops the layer's kept state

  // Drops what the dispatcher keeps for `layer` (an evaluation step without backward).
  void release(int layer);

  // Stateless servers only (DispatcherOptions::stateless): puts `layer` in the state a
  // finished forward leaves, from the caller's buffers, so that backward(layer) can run on THIS
  // plan although the forward ran on another one (a pipeline's mixed ticks pool a
  // micro-batch's forward and its backward with different micro-batches, so the two are planned
  // apart). q, k, v, o: as for forward; lse: (n_tokens, n_heads), the forward's LSE of this
  // rank's rows (natural log), copied; every buffer at least that size (checked as for
  // forward, lse required). The buffers q, k, v, o must stay valid until backward(layer)
  // returns. Not collective (no exchange). Precondition: the layer is idle (DISTCA_CHECK, like
  // the phase order).
  void adopt_forward(int layer, std::span<const float> q, std::span<const float> k, std::span<const float> v,
                     std::span<const float> o, std::span<const float> lse);

  // Bytes this rank sent over the wire in the last completed forward / backward of any layer
  // (payload only; signal mode counts its bytes).
  int64_t last_forward_bytes_sent() const { return fwd_bytes_; }
  int64_t last_backward_bytes_sent() const { return bwd_bytes_; }
  // Query rows of this server's fused call beyond the plan's: the tile padding of
  // query_tile_rows. Zero when every task starts and ends on a tile boundary or a document's
  // end (ScheduleOptions::align_rows = query_tile_rows and pieces on tile boundaries).
  int64_t padded_query_rows() const { return pad_rows_; }
  // Seconds this rank has spent blocked waiting for exchanges to complete, over the
  // dispatcher's life (the exposed communication; packing and kernels are not included).
  double waited_seconds() const { return waited_s_; }
  // Row buffers of at least 64 KiB this dispatcher allocated fresh over its life, the rest
  // reusing the pages of buffers an earlier call released (take / give below). Bits do not
  // depend on it: every buffer is zeroed as it is taken.
  int64_t buffer_allocations() const { return allocations_; }

 private:
  struct LayerState;
  enum class Phase;  // where a layer is in the order above (dispatcher.cpp)
  CaDispatcher(comm::Communicator& comm, const Plan& plan, const AttentionDims& dims,
               const DispatcherOptions& options);
  // The layer's state, checked to be in `expected` (DISTCA_CHECK naming `call`, the layer, the
  // expected and the actual phase; a layer without state is in Phase::kIdle).
  LayerState& state_in(int layer, Phase expected, const char* call);
  // DISTCA_CHECKs that buffer `name` of `call` holds n_tokens() rows of `row_floats` floats.
  void check_buffer(const char* call, int layer, const char* name, size_t floats, int64_t row_floats) const;
  void check_forward_buffers(const char* call, int layer, std::span<const float> q, std::span<const float> k,
                             std::span<const float> v, std::span<const float> o) const;
  Status align_tasks();
  // The K|V wire of direction `dir` (0 forward, 1 backward) of a nano-batch pair, or null
  // (the plan's kKv travels as it is).
  const detail::KvWireSide* kv_side(int dir) const;
  // The K|V exchange as it travels in direction `dir`: the wire's, or the plan's kKv.
  const Exchange& kv_wire(int dir) const;
  // Packs s.kv_send by kv_wire(dir) from the caller's K and V and sizes s.kv_recv (the plan's
  // layout).
  void pack_kv(LayerState& s, int dir);
  // Starts the K|V exchange of s.kv_send (kv_wire(dir)): into s.kv_recv, or with a wire into
  // s.wire_recv; with K/V relays (plan/topology_relay.h) its first stage.
  Status start_kv(LayerState& s, int dir, double start_us);
  // Waits for it; with relays runs the second stage (inside hosts, its bytes added to *bytes);
  // with a wire fills s.kv_recv from it and the giver's rows (the pair's stash). Leaves
  // s.kv_recv as the plan lays it out.
  Status finish_kv(LayerState& s, int layer, int dir, int64_t* bytes);
  // Fills s.fk / s.fv (the fused call's contexts) from local rows and s.kv_recv.
  void assemble_kv(LayerState& s);
  // Row buffers of kPooledFloats floats or more come from spare_ (best fit within twice the
  // size) and go back to it, so a layer reuses the pages of the previous layer's (and its
  // forward's) buffers instead of faulting fresh zeroed pages in for every call: take(v, n)
  // leaves v sized n and zeroed, as v.assign(n, 0) does; give(v) empties v. The spares die
  // with the dispatcher (one micro-batch); a size no spare fits drops the smaller spares, so
  // the spares never hold more than the buffers the dispatcher had live at once before.
  static constexpr size_t kPooledFloats = size_t{1} << 14;
  void take(std::vector<float>& v, int64_t floats);
  void give(std::vector<float>& v);
  void give_all(LayerState& s);
  // Floats per row of the kDO exchange: dO, or dO|Q|O|LSE for stateless servers.
  int64_t do_row_floats() const {
    return options_.stateless ? 3 * dims_.q_floats() + dims_.n_heads : dims_.q_floats();
  }
  void trace(const char* what, const char* category, double start_us) const;

  comm::Communicator& comm_;
  const Plan& plan_;
  AttentionDims dims_;
  DispatcherOptions options_;
  std::string label_;  // options_.label + " " (or empty): prefix of exchange names
  int rank_ = 0;
  DocumentIndex index_;
  std::map<int, std::unique_ptr<LayerState>> layers_;
  std::unique_ptr<detail::KvRelayLayout> relay_;  // this rank's K/V relays (`on` false: none)
  // The fused call as run: tasks padded to the kernel's query tiles (see query_tile_rows).
  std::vector<int32_t> cu_q_, cu_k_;  // [tasks + 1]
  std::vector<int64_t> q_row_;        // [tasks] fused row of the task's first query row
  int64_t pad_rows_ = 0;              // fused query rows minus the plan's
  int64_t fwd_bytes_ = 0, bwd_bytes_ = 0;
  double waited_s_ = 0;
  std::vector<std::vector<float>> spare_;  // released row buffers (take / give), empty
  int64_t allocations_ = 0;                // pooled-size buffers allocated fresh (take found no spare)
};

}  // namespace distca::runtime
