// A Llama-style decoder with hand-written forward and backward (BLAS for the matrix products):
// token embedding, per layer [RMSNorm, Q/K/V projections, RoPE at each token's logical
// position, grouped-query core attention through an executor, O projection, residual,
// RMSNorm, SwiGLU feed-forward, residual], final RMSNorm, LM head (untied), cross-entropy over
// next tokens within each document.
//
// One rank's step: the model sees this rank's local tokens only. For each token the caller
// (the data loader) gives its logical position within its document (RoPE uses it; a document
// split across ranks keeps its positions) and its target, the next token of the SAME document
// or -1 when there is none (a document's last token). The loader knows the next token even
// when it lives on another rank, so no loss crosses a document boundary and none is lost at a
// rank boundary. Attention isolation between documents is the executor's job
// (attention_executor.h).
//
// Loss and gradient scaling for data parallelism: forward_backward returns the SUM of the
// per-token losses and the COUNT of tokens with a target, and its gradients are those of
// grad_scale * sum. A trainer that wants the global mean over all ranks passes
// grad_scale = 1 / (global count); the all-reduced SUM of the ranks' gradients is then the
// gradient of the global mean loss, and sum(loss_sum) / sum(count) is that loss, exactly.
//
// Reported secondary loss: StepInputs::report_weights (optional, one weight per token) selects
// which targets count in a reported loss that does not train: report_sum = sum of w_t * loss_t
// and report_weight = sum of w_t, over tokens with a target. The copy task passes 1 for the
// second half of each document and 0 elsewhere; training still uses every target.
//
// Parameters live in one contiguous buffer (params()), gradients in another of the same
// layout (grads()), so the DP all-reduce and the optimizer work on one span each. Layout,
// layer-major (docs/model.md), every matrix (out, in) row-major as in nn.Linear:
//   embedding           (vocab, hidden)
//   for each layer l:   attn_norm (hidden), wq (q_dim, hidden), wk (kv_dim, hidden),
//                       wv (kv_dim, hidden), wo (hidden, q_dim), ffn_norm (hidden),
//                       w1 (ffn, hidden) gate, w3 (ffn, hidden) up, w2 (hidden, ffn) down
//   final_norm          (hidden)
//   lm_head             (vocab, hidden)
// A pipeline stage owning layers [a, b) therefore owns one contiguous range of the buffer.
// Weight decay applies to every matrix (embedding and lm_head included), not to the norm gains
// (TensorInfo::decay).
//
// Initialisation (deterministic from the seed): matrices ~ N(0, init_std^2), with wo and w2
// scaled by 1/sqrt(2 n_layers) (the residual-branch outputs); norm gains 1. Tensor i draws from
// Rng(seed, i), so a tensor's values do not depend on the sizes of the others.
//
// Activations kept for backward live in a workspace allocated once for max_tokens tokens
// (model_memory() gives the bytes, docs/model.md lists the regions). Logits take vocab values
// per token; for large vocabularies they dominate (chunking them is a later optimisation).
//
// Numerics: T = float for training (fp32 storage and BLAS sgemm; per-row reductions, softmax
// and the loss sum in double); T = double exists for the gradient checks in tests.
// Determinism: the same inputs and parameters give the same bits (loss and gradients) for any
// OpenMP team size and any OpenBLAS thread count (layers.h, "Threads"; tests/model/
// test_threads.cpp checks 1, 2 and 3 threads).
//
// Phased step (docs/model.md, "Phased step"). Besides the blocking forward / forward_backward,
// a step can be driven phase by phase on row ranges, so that a schedule (the runtime's ping-pong
// nano-batches) runs one nano-batch's linear work while another's attention exchange is in
// flight. The blocking calls are exactly this sequence with the single range [0, n) and the
// executor's forward / backward on attention_io's buffers (one copy of the model code):
//   begin_step(in)
//   for l in 0..L-1:   forward_pre(l, r); [attention forward of layer l]; forward_post(l, r)
//   forward_head(r)
//   backward_head(r, grad_scale)
//   for l in L-1..0:   backward_post(l, r); [attention backward of layer l]; backward_pre(l, r)
// A phase reads and writes only rows [begin, end) of the step's buffers, plus the parameters
// (read) and its tensors' gradients (accumulated). What each reads and writes:
//   begin_step:    validates; RoPE tables and layer 0's x for ALL rows; zeroes the step's loss.
//   forward_pre:   x_l rows -> rstd1, xn1 rows; q, k, v rows of attention_io(l) (after RoPE).
//   forward_post:  o rows of attention_io(l), x_l rows -> x_mid, rstd2, xn2, g, u, a rows and
//                  x_{l+1} rows (the final block's x for l = L-1).
//   forward_head:  x_L rows -> final norm, logits and per-token loss rows; adds the rows' sums
//                  to step_loss(); per_token_loss rows if begin_step was given that span.
//   backward_head: logits rows (overwritten in place by dlogits) -> dx rows = d(x_L);
//                  lm_head, final_norm gradients.
//   backward_post: dx rows = d(x_{l+1}) -> w2, w1, w3, ffn_norm, wo gradients; d_o rows of
//                  attention_io(l); dx rows = d(x_mid).
//   backward_pre:  dq, dk, dv rows of attention_io(l) (dq, dk inverse-rotated in place),
//                  dx rows = d(x_mid) -> wq, wk, wv, attn_norm gradients; dx rows = d(x_l);
//                  for l = 0 the embedding gradient of the rows' tokens, in row order.
// Order constraints, per range r (the caller's schedule must respect them; the model checks
// only the cheap preconditions: a successful begin_step, 0 <= begin <= end <= n, the layer):
//   - forward_pre(l, r) after forward_post(l-1, r) (l = 0: after begin_step).
//   - the attention of layer l for the queries of r needs q of r and k, v of every row that
//     those queries see: a range holding a PREFIX of every document (positions 0..p of each)
//     sees only its own rows; a range of suffixes also needs forward_pre(l, prefix range).
//   - forward_post(l, r) after the o rows of r for layer l are written.
//   - forward_head(r) after forward_post(L-1, r); backward_head(r) after forward_head(r) and
//     at most once per step (it consumes the logits rows).
//   - backward_post(l, r) after backward_head(r) (l = L-1) or backward_pre(l+1, r).
//   - backward_pre(l, r) after dq, dk, dv rows of r for layer l are complete. dk, dv of a
//     key row sum over every query that sees it: the rows of a prefix range receive
//     contributions from the suffix range's queries, so backward runs the suffixes first
//     (mirrored: a suffix range's keys are seen by its own queries only).
// Buffer lifetimes: q, k, v, o of layer l are layer l's own and stay valid and unchanged from
// forward_pre(l) / the attention until the next step's forward_pre(l) (as the executor contract
// needs: an executor may keep pointers to them).
// d_o and dq are one buffer for all layers: the attention backward of layer l must have read
// d_o rows of r (and written dq rows of r, read by backward_pre(l, r)) before
// backward_post(l-1, r) / the attention backward of layer l-1 writes them; rows of different
// ranges never interfere. dk, dv come in two sets by layer parity, so the attention backward of
// layer l-1 may write its dk, dv while layer l's are still being completed (summed by an
// exchange in flight); layer l's set is next written by layer l-2's attention backward, which
// must wait until backward_pre(l, r') has read it for every range r'. The spans of the StepInputs
// given to begin_step (and per_token_loss) must stay valid until the step's last phase.
// Determinism of the phased step: a weight gradient accumulates in CALL order, each tensor in
// exactly one kind of phase (lm_head, final_norm: backward_head; w2, w1, w3, ffn_norm, wo:
// backward_post(l); wq, wk, wv, attn_norm: backward_pre(l); embedding: backward_pre(0)). So the
// same calls in the same order give the same bits, and so do two call orders that give every
// tensor its row ranges in the same order (interleaving the layers differently changes
// nothing); StepLoss sums the ranges in forward_head's call order. Different range splits give
// the same function up to float rounding only (a product's rows depend on the rows it is
// computed with, and a weight gradient sums its ranges' partial products in another order).
//
// Pipeline stages (docs/model.md, "Pipeline stages"). create() with a StageRange [first, last)
// builds one stage of the model: layers first..last-1, plus the embedding if first = 0 and the
// final norm, LM head and loss if last = n_layers.
//   - params() / grads() hold only the stage's tensors: the contiguous range of the full
//     buffer from param_offset() (the embedding, or layers.first.attn_norm) to the lm_head (last
//     stage) or layers.(last-1).w2, with the values of the whole model's same elements (tensor
//     i draws from Rng(seed, i), i its index in the FULL layout). layout() lists the stage's
//     tensors with offsets RELATIVE to params() (full offset = offset + param_offset());
//     tensor(name) finds the stage's tensors only.
//   - Layer numbers in the phases and attention_io are the model's (global) ones, in
//     [first, last); an executor sees the same layer numbers as on the whole model.
//   - Boundaries. On a stage without the embedding the caller writes the previous stage's
//     output rows into stage_input() after begin_step and before forward_pre(first, rows); on
//     a stage without the head, stage_output() holds the rows of the residual stream after
//     forward_post(last - 1, rows). In backward, a stage without the head takes d(output) rows
//     written into stage_output_grad() and starts with backward_post(last - 1, rows) (there is
//     no backward_head); after backward_pre(first, rows) a stage without the embedding holds
//     d(input) rows in stage_input_grad(). forward_head / backward_head exist only on the last
//     stage (DISTCA_CHECK). Every stage takes the micro-batch's full StepInputs and validates
//     them alike (positions drive RoPE everywhere; tokens are embedded only on the first stage,
//     targets read only on the last).
//   - Slots. `slots` activation workspaces, each for max_tokens tokens, hold micro-batches in
//     flight (1F1B keeps up to P - s of them on stage s). begin_step(in, loss, k) starts a
//     micro-batch in slot k and selects it; select_slot(k) selects a started slot again; every
//     phase, attention_io's q, k, v, o, stage_input / stage_output, and step_loss() act on the
//     selected slot. The backward scratch (dx, d_o, dq, dk, dv, so stage_output_grad and
//     stage_input_grad, which are one buffer) is shared: one micro-batch's backward at a time
//     (the forward phases of other slots may run between its phases: they do not touch it).
//     A slot's buffers stay valid until its next begin_step; the spans given to a slot's
//     begin_step must stay valid until that slot's last phase (its backward). Gradients
//     accumulate in call order as on the whole model, so a 1F1B order whose backwards run
//     m = 0, 1, ... gives the bits of the micro-batches run one after the other.
//   - The blocking forward / forward_backward run the whole model only (slot 0); on a stage
//     they return InvalidArgument.
//
// Tensor parallelism (docs/model.md, "Tensor parallelism"). create() with a TP communicator of
// T ranks builds TP rank r's share of the model (tensor_parallel.h): params() / grads() /
// layout() in tp_param_layout(spec, T, r) (its heads' rows of wq, wk, wv and columns of wo,
// its ffn rows of w1, w3 and columns of w2, its vocabulary rows of the embedding and the LM
// head; the norm gains whole), param_offset() in that layout; initialisation slices the
// unsharded model's values, so every T starts from the same model. Every TP rank of a group
// takes the SAME StepInputs (all n rows); begin_step (with the embedding) and the phases are
// collective over the group (same calls, same order, same ranges). attention_io's q, k, v, o,
// d_o, dq, dk, dv hold the rank's heads for all n rows; an executor is set up for those heads
// (n_heads / T, n_kv_heads / T). The residual stream, norms and per-token loss are
// sequence-parallel: the rank holds rows tp_sp_pieces(n, sp_cut, T, rank) of the step
// (begin_step's sp_cut; without one tp_rows(n, T, rank)), and a phase on rows r computes them
// for r's rows among those (own_rows; possibly none; r must not cross the cut). The
// workspace's residual stream, its rstd, dx, stage_input / stage_output and their gradients
// hold only those rows, in row order from row 0 (boundary_row_count(), at most
// ceil(max_tokens / T)); the other rows of
// per_token_loss are not written. So step_loss() is the
// sum over the rank's rows (the group's sums add up to the step's), and the norm gains'
// gradients are partial until sync_replicated_grads(). A failed TP collective is kept in
// tp_status() (the blocking calls return it) and turns the later phases into no-ops. Pipeline
// stages take a TP communicator too: each TP rank of a stage exchanges its boundary rows with
// the same TP index of its neighbours (so they must agree on sp_cut).
//
// Thread safety: one thread at a time per object; a step uses the calling thread's OpenMP team.
// Distinct objects may run in distinct threads (ranks as threads); they share OpenBLAS's
// process-wide thread count, which such a process sets to one around them (the trainer does).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/model/attention_executor.h"

namespace distca::model {

// Model-layer options beyond the sizes of ModelSpec.
struct LlamaOptions {
  double rope_theta = 10000.0;  // RoPE base
  double rms_eps = 1e-5;        // RMSNorm epsilon
  double init_std = 0.02;       // standard deviation of the matrices at initialisation
  // With a TP communicator: TpStep::overlap of every layer phase (model/tensor_parallel.h,
  // "Overlap"); the same bits either way.
  bool tp_overlap = true;
  // rope_theta > 1, rms_eps > 0, init_std > 0, all finite; the message names the field.
  Status validate() const;
};

// One tensor of the parameter buffer.
struct TensorInfo {
  std::string name;    // "embedding", "layers.3.wq", "final_norm", "lm_head", ...
  int64_t offset = 0;  // first element in params()
  int64_t rows = 0;    // (rows, cols); a vector has rows = 1
  int64_t cols = 0;
  bool decay = false;  // AdamW weight decay applies (matrices yes, norm gains no)
  int64_t size() const { return rows * cols; }
};

// The layout above for a spec (precondition: spec.validate().ok()).
std::vector<TensorInfo> param_layout(const ModelSpec& spec);
int64_t param_count(const ModelSpec& spec);

// Layers [first, last) of a pipeline stage (docs/model.md, "Pipeline stages"). The first
// stage (first = 0) also holds the embedding; the last (last = n_layers) the final norm, the
// LM head and the loss.
struct StageRange {
  int64_t first = 0, last = 0;
  bool has_embedding() const { return first == 0; }
  bool has_head(int64_t n_layers) const { return last == n_layers; }
  int64_t size() const { return last - first; }
};

// Stage s of p (precondition 0 <= s < p <= n_layers, DISTCA_CHECK): n_layers split as evenly
// as possible, the first n_layers % p stages one layer more (Megatron-LM also splits evenly).
// E.g. 10 layers over 4 stages: [0, 3) [3, 6) [6, 8) [8, 10).
StageRange stage_layers(int64_t n_layers, int64_t p, int64_t s);

// Memory of one model replica (or stage), for peak-memory accounting. bytes_per_element: 4
// for fp32.
struct ModelMemory {
  int64_t param_bytes = 0;                   // params(); grads() is the same again
  int64_t saved_activation_bytes_per_token = 0;  // kept from forward for backward, per slot
  int64_t scratch_bytes_per_token = 0;       // backward's temporaries (one layer's worth),
                                             // shared by the slots
  int64_t slots = 1;                         // activation workspaces (micro-batches in flight)
  int64_t activation_bytes_per_token() const {
    return slots * saved_activation_bytes_per_token + scratch_bytes_per_token;
  }
};
// The whole model with one slot (= stage_memory(spec, {0, n_layers}, 1, bytes_per_element)).
ModelMemory model_memory(const ModelSpec& spec, int64_t bytes_per_element = 4, int64_t tp = 1);
// A pipeline stage's part (preconditions: spec valid, 0 <= first < last <= n_layers,
// slots >= 1): its parameters, and per token of max_tokens its per-slot saved activations
// (its layers; on the last stage the final block, logits and loss; elsewhere the stage's
// output rows; RoPE tables everywhere) and the shared backward scratch.
// tp: a TP rank's share (precondition check_tp(spec, tp).ok(); "Tensor parallelism" below):
// its layers' shards (the embedding and head whole), its heads' and ffn columns' activations
// (the residual stream and the gathered norm outputs stay (n, h)), and the TP temporaries.
ModelMemory stage_memory(const ModelSpec& spec, StageRange stage, int64_t slots,
                         int64_t bytes_per_element = 4, int64_t tp = 1);

// One rank's local tokens for one step; all spans have n elements (report_weights: n or 0).
struct StepInputs {
  std::span<const int32_t> tokens;          // (n) in [0, vocab)
  std::span<const int32_t> positions;       // (n) >= 0, logical position within the document
  std::span<const int32_t> targets;         // (n) in [0, vocab), or -1 for none
  std::span<const float> report_weights;    // (n) or empty (then report_* stay 0)
};

struct StepLoss {
  double loss_sum = 0;       // sum over tokens with a target of -log p(target)
  int64_t count = 0;         // tokens with a target
  double report_sum = 0;     // sum over tokens with a target of w_t * loss_t
  double report_weight = 0;  // sum over tokens with a target of w_t
};

// Rows [begin, end) of the step's local tokens: one nano-batch of a phased step.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// One layer's core-attention buffers over ALL n local rows of the step (phased step). Pointers
// into the model's workspace, fixed for the model's lifetime (row t at t * width).
// Part `index` of `parts` of [0, total): as even as possible, the first total % parts parts one
// longer (precondition 0 <= index < parts, total >= 0; DISTCA_CHECK). E.g. 10 over 4:
// [0, 3) [3, 6) [6, 8) [8, 10). stage_layers and tensor parallelism's splits use it.
RowRange even_split(int64_t total, int64_t parts, int64_t index);

template <class T>
struct LayerAttentionIo {
  T* q = nullptr;    // (n, n_heads, head_dim)    written by forward_pre (after RoPE)
  T* k = nullptr;    // (n, n_kv_heads, head_dim) written by forward_pre (after RoPE)
  T* v = nullptr;    // (n, n_kv_heads, head_dim) written by forward_pre
  T* o = nullptr;    // (n, n_heads, head_dim)    written by the caller's attention, read by
                     //                           forward_post (and backward_post)
  T* d_o = nullptr;  // (n, n_heads, head_dim)    written by backward_post; one for all layers
  T* dq = nullptr;   // (n, n_heads, head_dim)    written by the caller's attention backward,
                     //                           read (and inverse-rotated) by backward_pre
  T* dk = nullptr;   // (n, n_kv_heads, head_dim) idem; layers l and l-1 use DIFFERENT buffers
  T* dv = nullptr;   // (n, n_kv_heads, head_dim) idem (two sets, by layer parity)
};

template <class T>
struct TpLayerActs;  // tensor_parallel.h
template <class T>
struct TpStep;
template <class T>
struct TpHeadActs;

template <class T>
class Llama {
 public:
  // Validates the spec (and head_dim even, for RoPE), max_tokens > 0, the options, the stage
  // (0 <= first < last <= n_layers; default: the whole model) and slots >= 1; the message
  // names the field. Allocates params, grads (zeroed) and `slots` workspaces.
  // tp: null, or the TP group's communicator (size T > 1 checked with check_tp; "Tensor
  // parallelism" above); the model keeps the pointer, which must outlive it.
  static Result<Llama> create(const ModelSpec& spec, int64_t max_tokens, uint64_t seed,
                              const LlamaOptions& options = {},
                              std::optional<StageRange> stage = std::nullopt, int64_t slots = 1,
                              comm::Communicator* tp = nullptr);

  const ModelSpec& spec() const { return spec_; }
  const LlamaOptions& options() const { return options_; }
  int64_t max_tokens() const { return max_tokens_; }
  // The stage's tensors, offsets relative to params() (the whole model: param_layout(spec)).
  const std::vector<TensorInfo>& layout() const { return layout_; }
  // The tensor named `name` among the stage's (DISTCA_CHECK that it exists).
  const TensorInfo& tensor(const std::string& name) const;
  StageRange stage() const { return stage_; }
  // How many rows of the selected slot's step this rank holds in the sequence-parallel
  // regions: those of tp_sp_pieces(n, sp_cut, T, rank) with TP, all n rows without. Only these
  // rows (from row 0) of stage_input, stage_output and their gradients are read or written.
  int64_t boundary_row_count() const;
  bool has_embedding() const { return stage_.has_embedding(); }
  bool has_head() const { return stage_.has_head(spec_.n_layers); }
  // The element of the full parameter buffer (param_layout) where params() starts.
  int64_t param_offset() const { return param_offset_; }
  int64_t slots() const { return static_cast<int64_t>(slot_state_.size()); }
  int slot() const { return slot_; }  // the selected slot
  int64_t tp_size() const { return tp_ == nullptr ? 1 : tp_->size(); }
  int64_t tp_rank() const { return tp_ == nullptr ? 0 : tp_->rank(); }
  // The first failure of a TP collective in a phase (OK without TP); after one, phases do
  // nothing. The caller fails the group with it (comm/communicator.h).
  const Status& tp_status() const { return tp_status_; }
  // TP: sums the replicated tensors' gradients (the norm gains, final norm included) over the
  // TP group, in rank order. Collective; OK at once without TP.
  Status sync_replicated_grads();

  std::span<T> params() { return params_; }
  std::span<const T> params() const { return params_; }
  std::span<T> grads() { return grads_; }
  std::span<const T> grads() const { return grads_; }
  void zero_grads();

  // forward / forward_backward: the blocking path, kept only as the tests' independent
  // reference (the trainer drives the phased calls below through the runtime's runners).
  // The whole model only (a stage gets InvalidArgument); slot 0.
  // Evaluation: forward only (the executor's forward is called, never its backward).
  // per_token_loss: (n) or empty; receives -log p(target) per token, 0 where the target is -1.
  Result<StepLoss> forward(const StepInputs& in, BasicAttentionExecutor<T>& executor,
                           std::span<T> per_token_loss = {});

  // Forward and backward: ADDS the gradient of grad_scale * loss_sum to grads() (call
  // zero_grads() first unless accumulating micro-batches).
  Result<StepLoss> forward_backward(const StepInputs& in, BasicAttentionExecutor<T>& executor,
                                    double grad_scale, std::span<T> per_token_loss = {});

  // Phased step (header comment above; preconditions checked with DISTCA_CHECK).
  // Validates the inputs as forward does (the same messages, minus the executor's), computes
  // the RoPE tables, embeds all rows into layer 0's x and zeroes step_loss(). in's spans and
  // per_token_loss ((n) or empty) must stay valid until the step's last phase. On error no
  // phase may run until a begin_step succeeds.
  // Pipeline stages: starts the micro-batch in `slot` (0 <= slot < slots(), else
  // InvalidArgument) and selects it; on a stage without the embedding nothing is embedded
  // (stage_input() receives the rows) and per_token_loss must be empty without the head.
  // A failed begin_step leaves that slot unusable until its next successful one.
  // TP: sp_cut (0: none) is the sequence cut of the rank's rows (tp_sp_pieces): the row where
  // the step's second range (nano-batch) starts when it runs as [0, sp_cut) and [sp_cut, n),
  // so each TP rank holds an even share of each; every phase's rows must then lie on one side
  // of it. Ignored without TP.
  Status begin_step(const StepInputs& in, std::span<T> per_token_loss = {}, int slot = 0,
                    int64_t sp_cut = 0);
  // Selects a slot whose begin_step succeeded (DISTCA_CHECK).
  void select_slot(int slot);
  // first <= layer < last. q, k, v, o of the selected slot; d_o, dq, dk, dv shared.
  LayerAttentionIo<T> attention_io(int layer);
  // Stage boundaries of the selected slot, (n, hidden) row-major, n = its step's tokens (TP:
  // the rank's rows boundary_row_count() only, from row 0).
  // stage_input: only without the embedding; stage_output: only without the head.
  // stage_output_grad (without the head) and stage_input_grad (without the embedding) are
  // the backward's dx, one buffer shared by the slots (header comment above).
  T* stage_input();
  const T* stage_output();
  T* stage_output_grad();
  const T* stage_input_grad();
  void forward_pre(int layer, RowRange rows);
  void forward_post(int layer, RowRange rows);
  void forward_head(RowRange rows);
  // The sums of the forward_head calls of the selected slot's step so far.
  StepLoss step_loss() const { return slot_state_[static_cast<size_t>(slot_)].loss; }
  // grad_scale finite (forward_backward's argument).
  void backward_head(RowRange rows, double grad_scale);
  void backward_post(int layer, RowRange rows);
  void backward_pre(int layer, RowRange rows);

 private:
  Llama() = default;
  struct LayerPtrs;   // one layer's parameter (or gradient) tensors
  struct LayerActs;   // one layer's saved activations
  struct FinalActs;   // the final block's saved activations and the RoPE tables
  struct Scratch;     // backward's temporaries
  LayerPtrs layer_ptrs(T* base, int64_t layer) const;
  LayerActs layer_acts(int64_t layer);
  int64_t layer_elems() const;  // one layer's workspace elements
  // The index of row `row` (the rank's, or the end of its rows) in the sequence-parallel
  // buffers: the rank's rows before it with TP, row itself without.
  int64_t sp(int64_t row) const;
  FinalActs final_acts();
  Scratch scratch();
  // The executor-independent checks of a step's inputs.
  Status check_inputs(const StepInputs& in, std::span<T> per_token_loss) const;
  Status check_executor(const BasicAttentionExecutor<T>& executor, int64_t n) const;
  // begin_step's checks (then the executor's when given, then grad_scale's), then the step's
  // set-up; nothing is written before every check passed.
  Status start_step(const StepInputs& in, std::span<T> per_token_loss,
                    const BasicAttentionExecutor<T>* executor, double grad_scale, int slot,
                    int64_t sp_cut = 0);
  void check_rows(RowRange rows) const;
  // InvalidArgument naming `call` unless this is the whole model.
  Status check_whole(const char* call) const;
  void check_phase(int layer, RowRange rows) const;
  Status run_forward(BasicAttentionExecutor<T>& executor);
  Status run_backward(BasicAttentionExecutor<T>& executor, double grad_scale);
  // TP (llama_tp.cpp): the rows of `rows` this TP rank owns in the sequence-parallel regions
  // (rows itself without TP), the layer phases, and create's sharded initialisation.
  RowRange own_rows(RowRange rows) const;
  void tp_forward_pre(int layer, RowRange rows);
  void tp_forward_post(int layer, RowRange rows);
  void tp_backward_post(int layer, RowRange rows);
  void tp_backward_pre(int layer, RowRange rows);
  // begin_step's vocabulary-parallel embedding of the step's rows (collective).
  Status tp_embed();
  void tp_forward_head(RowRange rows);
  void tp_backward_head(RowRange rows, double grad_scale);
  TpHeadActs<T> tp_head_acts(RowRange rows);
  TpLayerActs<T> tp_layer_acts(int layer, RowRange rows);
  TpStep<T> tp_step(RowRange rows);
  void init_params(uint64_t seed, size_t first_tensor);
  // Layer 0's backward: the embedding gradient of the rows' tokens from dx, in row order.
  void add_embedding_grads(RowRange rows);

  // One slot's phased step (begin_step).
  struct SlotState {
    bool ready = false;
    StepInputs in;
    std::span<T> per_token_loss;
    int64_t n = 0;
    int64_t sp_cut = 0;  // begin_step's (TP)
    StepLoss loss;
  };
  SlotState& cur() { return slot_state_[static_cast<size_t>(slot_)]; }
  const SlotState& cur() const { return slot_state_[static_cast<size_t>(slot_)]; }

  ModelSpec spec_;
  LlamaOptions options_;
  int64_t max_tokens_ = 0;
  StageRange stage_;
  int64_t param_offset_ = 0;
  int64_t sp_rows_ = 0;  // rows of the sequence-parallel regions (TP: ceil(max_tokens / T),
                         // the most tp_sp_pieces gives a rank)
  std::vector<TensorInfo> layout_;  // the stage's tensors, offsets relative to params_
  std::vector<T> params_;  // (the stage's parameter count)
  std::vector<T> grads_;   // (idem)
  // Workspace, each region sized for max_tokens (docs/model.md lists them):
  std::vector<T> acts_;     // per slot: the stage's layers' LayerActs, then the final block
  int64_t slot_elems_ = 0;  // elements of acts_ per slot
  std::vector<T> scratch_;  // backward temporaries (shared by the slots)
  std::vector<T> loss_;     // (slots, max_tokens) per-token loss; empty without the head
  std::vector<double> stats_;  // TP with the head: (slots, max_tokens, 2) the cross-entropy's
                               // per-row maximum and sum (tensor_parallel.h)
  std::vector<SlotState> slot_state_;  // (slots)
  int slot_ = 0;                       // the selected slot
  comm::Communicator* tp_ = nullptr;   // the TP group (null: no TP)
  Status tp_status_;
};

extern template class Llama<float>;
extern template class Llama<double>;

}  // namespace distca::model
