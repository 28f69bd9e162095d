// Tensor parallelism (Megatron-LM style) with sequence parallelism: one decoder layer's math
// split over a TP group of T ranks (docs/model.md, "Tensor parallelism").
//
// What each rank of a TP group holds (rank r of T):
//   - Heads: query heads [r H/T, (r+1) H/T) and KV heads [r KV/T, (r+1) KV/T) (T divides
//     both). Contiguous slices keep grouped-query attention intact: query head h reads KV head
//     h / (H/KV), and H/T = (H/KV) (KV/T), so a rank's query heads read only its own KV heads.
//   - Column-parallel (output rows sharded): wq (its heads' rows), wk, wv (its KV heads'
//     rows), w1 and w3 (its rows ffn = even_split(f, T, r) of the feed-forward width).
//   - Row-parallel (input columns sharded): wo (its heads' columns), w2 (its ffn columns).
//   - Vocabulary-parallel (Megatron-LM style): the embedding and the LM head, rows
//     vocab = even_split(V, T, r) of the vocabulary. The embedding: each rank writes the rows of
//     the tokens in its vocabulary range (zeros elsewhere) and a reduce-scatter gives each rank
//     its rows (one addend is non-zero, so the sum is exact); its gradient: the rank's rows of
//     d(x) all-gathered, each rank adding those of its tokens in row order. The LM head: the
//     final norm's output all-gathered, logits (n, V/T) per rank; the cross-entropy through
//     two all-gathers of per-row figures (the local maximum, then the local sum of exp(logit -
//     max) and the target's logit), combined in rank order (tp_vocab_cross_entropy_forward).
//   - Replicated: attn_norm, ffn_norm and the final norm. With sequence parallelism every rank
//     applies them to its OWN token rows only, so their compute is split by T, not repeated;
//     their gradients are partial sums over the rank's rows and need one all-reduce over the
//     TP group per step (tp_all_reduce_replicated).
//   - Sequence parallel regions: the residual stream, the norms and the per-token loss live on
//     the rank's rows of the step's n tokens, tp_sp_pieces(n, cut, T, r) (without a sequence
//     cut tp_rows(n, T, r); with one, its share of each side). A phase on a range of rows
//     (a nano-batch) handles the range's share of those rows (TpStep: possibly none), so
//     which rank holds a row depends on the cut, not on how the step is cut into ranges. Entering a
//     column-parallel block, the normed rows are all-gathered (every rank needs all n
//     rows); leaving a row-parallel block, the (n, h) partial products are reduce-scattered
//     (each rank receives the sum for its rows). Backward mirrors it: the gradient of an
//     all-gather is a reduce-scatter and vice versa. Per layer and direction: 2 all-gathers
//     and 2 reduce-scatters of (n, h) elements, each moving (T-1)/T n h elements per rank
//     (the communication volume of one all-reduce, in two halves).
//
// Overlap (Megatron-LM's TP communication overlap; TpStep::overlap, on by default): the layer
// functions hide each of those collectives behind its own products instead of running it
// between two products. All-pairs point-to-point messages on kTpOverlapTag (each rank sends
// its block straight to each peer: T - 1 messages per rank, the bytes of the blocking form).
//   - All-gather then column-parallel products (xn1 -> q, k, v; xn2 -> g, u, a; the final
//     norm's xn -> logits; backward d(out) -> d(a), d(g), d(u) and d(x_mid) -> d(o)): post
//     the receives, send the rank's rows, compute the products of the rows it holds, then of
//     each peer's rows as they arrive.
//   - Row-parallel products then reduce-scatter (o @ wo^T, a @ w2^T; backward the input
//     gradients of wq, wk, wv, of w1, w3 and of the LM head): compute peer r + 1's rows and
//     send them, then r + 2's, ..., then the rank's own, then the weight gradients (one
//     product over all rows), then wait and add the partials in rank order as below.
//   The products run on whole row tiles of kernels::gemm_tiled (kGemmTileRows): a tile once
//   all its rows are there (gather) or when the first block it meets is sent (scatter). So
//   every tile is the BLAS call the blocking form makes and the bits are the blocking form's
//   (a product over part of a tile is not: OpenBLAS then rounds some elements differently).
//   Not overlapped: the embedding's reduce-scatter and its backward's all-gather (nothing to
//   hide behind; the latter adds rows to d(emb) in row order), the cross-entropy's gathers.
//
// Determinism: every reduction has a fixed order. A reduce-scatter sums the T partial products
// in rank order ((p_0 + p_1) + p_2) + ..., the same bits on every backend. It is NOT the bits of
// the unsharded layer: there one GEMM sums over the whole inner dimension in BLAS's order,
// here each rank's GEMM sums over its slice and the slices are then added. So a row-parallel
// product (wo, w2 forward; the input gradients of wq, wk, wv, w1, w3 backward) and the
// replicated tensors' gradients (summed per rank over its rows, then over ranks) agree with
// T = 1 to float rounding. So do the column-parallel products, though each output element is
// the same dot product of the same operands: BLAS picks its kernel by the product's width, and
// a narrower product may accumulate in another order (measured with OpenBLAS). T = 1 is the
// unsharded layer bit for bit (tests/model/test_tensor_parallel.cpp).
//
// Buffer conventions: as layers.h (row-major; a weight (out, in)); `n` is the step's token
// count on the whole TP group (of the range: TpStep), `n_r` the rank's rows of them
// (tp_range_rows; tp_rows(n, T, r).size() for a whole step). "(n_r, h)"
// buffers hold the rank's rows only; "(n, ...)" buffers hold every row in token order.
// Backward functions accumulate into weight gradients and, where they say so, into input
// gradients, like layers.h.
//
// Collective contract: every function taking a Communicator is collective over the TP group
// (comm.size() = T, comm.rank() = r): all ranks call it in the same order with the same n.
// A non-OK Status is the group's failure (communicator.h). The communicator is typically a
// GroupCommunicator over the TP ranks of a larger job.
//
// Thread safety: no state; one thread per rank as the communicator requires.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/model/llama.h"

namespace distca::model {

// The rows of TP rank r: even_split(n, tp, r).
inline RowRange tp_rows(int64_t n, int tp, int rank) { return even_split(n, tp, rank); }

// The rows TP rank r holds in the sequence-parallel regions of a step of `total` rows with
// the sequence cut `cut`. Without a cut (cut <= 0 or cut >= total): tp_rows(total, T, r) and
// an empty second piece. With one: the rank's share of [0, cut) and its share of
// [cut, total), each split over the ranks in rank order, so a step run as two ranges (the
// nano-batches [0, cut) and [cut, total)) gives every rank an even share of each range and no
// TP rank computes a range's sequence-parallel rows while its peers wait for it. [0, cut)
// puts its remainder rows on the last ranks, [cut, total) on the first (even_split), so a
// rank holds at most ceil(total / T) rows in all. The pieces ascend; the rank's buffers hold
// piece 0's rows, then piece 1's.
std::array<RowRange, 2> tp_sp_pieces(int64_t total, int64_t cut, int tp, int rank);

// InvalidArgument (one line naming the sizes) unless tp >= 1 divides spec.n_heads and
// spec.n_kv_heads and tp <= spec.ffn.
Status check_tp(const ModelSpec& spec, int64_t tp);

// param_layout(spec) with every tensor in TP rank `rank`'s shape (tp_tensor_slice), offsets
// packed in the same order (precondition: check_tp(spec, tp).ok(), 0 <= rank < tp). tp = 1 is
// param_layout(spec).
std::vector<TensorInfo> tp_param_layout(const ModelSpec& spec, int64_t tp, int64_t rank);

// One TP rank's share of a layer (precondition: check_tp(spec, tp).ok(), 0 <= rank < tp).
struct TpDims {
  int64_t tp = 1, rank = 0;
  int64_t h = 0, hd = 0;               // hidden, head_dim
  int64_t heads = 0, kv_heads = 0;     // the rank's query and KV heads
  int64_t head0 = 0, kv_head0 = 0;     // its first query head and first KV head
  RowRange ffn;                        // its columns of the feed-forward width
  RowRange vocab;                      // its rows of the embedding and the LM head
  int64_t qd() const { return heads * hd; }
  int64_t kvd() const { return kv_heads * hd; }
  int64_t f() const { return ffn.size(); }
  // The rank's parameters of one layer in the shard layout below.
  int64_t layer_params() const { return 2 * h + (qd() + 2 * kvd()) * h + h * qd() + 3 * f() * h; }
};
TpDims tp_dims(const ModelSpec& spec, int64_t tp, int64_t rank);

// The block of a full tensor (an entry of param_layout) that rank d.rank holds: rows
// [row0, row0 + rows) x columns [col0, col0 + cols); the whole tensor for a replicated one.
struct TensorSlice {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};
TensorSlice tp_tensor_slice(const TensorInfo& full, const TpDims& d);
// Whether a tensor is split over the TP group (embedding, wq, wk, wv, wo, w1, w3, w2, lm_head)
// or replicated (the norm gains).
bool tp_sharded(const TensorInfo& t);

// A layer's tensors, in the order of the full layout (llama.h): attn_norm (h), wq, wk, wv, wo,
// ffn_norm (h), w1, w3, w2. Full: the shapes of llama.h. Shard (TpDims d): wq (d.qd, h),
// wk (d.kvd, h), wv (d.kvd, h), wo (h, d.qd), w1 (d.f, h), w3 (d.f, h), w2 (h, d.f), contiguous
// in that order (d.layer_params() elements).
template <class T>
struct TpLayerTensors {
  T* attn_norm;
  T* wq;
  T* wk;
  T* wv;
  T* wo;
  T* ffn_norm;
  T* w1;
  T* w3;
  T* w2;
};
// Pointers into a rank's contiguous shard of one layer.
template <class T>
TpLayerTensors<T> tp_layer_tensors(const TpDims& d, T* shard);

// full: one layer's contiguous parameters in the full layout (llama.h); shard: (d.layer_params())
// receives rank d.rank's share. tp_unshard_layer is the inverse: it writes rank d.rank's share
// into its places in `full` (calling it for every rank rebuilds the layer; the replicated norm
// gains are copied from each rank, so they must agree).
template <class T>
void tp_shard_layer(const ModelSpec& spec, const TpDims& d, const T* full, T* shard);
template <class T>
void tp_unshard_layer(const ModelSpec& spec, const TpDims& d, const T* shard, T* full);
// The same for the whole model: full in param_layout(spec), shard in
// tp_param_layout(spec, d.tp, d.rank). A checkpoint keeps the full layout whatever T: a TP run
// unshards every rank's parameters into it on save and shards them on load.
template <class T>
void tp_shard_params(const ModelSpec& spec, const TpDims& d, const T* full, T* shard);
template <class T>
void tp_unshard_params(const ModelSpec& spec, const TpDims& d, const T* shard, T* full);

// The point-to-point tag of the overlapped collectives (every TP function taking a
// Communicator sends and receives on it; the caller keeps it free on the TP communicator's
// ranks). Each function completes all of its messages before it returns.
inline constexpr int kTpOverlapTag = comm::kP2pTagLimit - 1;

// The sequence-parallel collectives over the rows of tp_rows(n, T, r), blocking (one
// all-to-all-v each; the layer functions use the overlapped forms, "Overlap" above).
// all: (n, width); on entry the rank's own rows hold its values; on return all rows do.
template <class T>
Status tp_all_gather_rows(comm::Communicator& tp, T* all, int64_t n, int64_t width);
// partial: (n, width), this rank's addend for every row; out: (n_r, width) receives
// sum over ranks p in rank order of partial_p's rows of this rank. out must not overlap partial.
template <class T>
Status tp_reduce_scatter_rows(comm::Communicator& tp, const T* partial, T* out, int64_t n,
                              int64_t width);
// The replicated tensors' gradients summed over the TP group (rank order, in place).
Status tp_all_reduce_replicated(comm::Communicator& tp, std::span<float> grads);
Status tp_all_reduce_replicated(comm::Communicator& tp, std::span<double> grads);

// One layer's saved activations on a TP rank (the caller owns the buffers).
template <class T>
struct TpLayerActs {
  const T* x = nullptr;  // (n_r, h) the residual stream entering the layer
  T* rstd1 = nullptr;    // (n_r)
  T* xn1 = nullptr;      // (n, h) attn_norm(x), gathered
  T* q = nullptr;        // (n, d.heads, hd) after RoPE
  T* k = nullptr;        // (n, d.kv_heads, hd) after RoPE
  T* v = nullptr;        // (n, d.kv_heads, hd)
  T* o = nullptr;        // (n, d.heads, hd) the caller's attention output on the rank's heads
  T* x_mid = nullptr;    // (n_r, h) x + attention block output
  T* rstd2 = nullptr;    // (n_r)
  T* xn2 = nullptr;      // (n, h) ffn_norm(x_mid), gathered
  T* g = nullptr;        // (n, d.f) gate
  T* u = nullptr;        // (n, d.f) up
  T* a = nullptr;        // (n, d.f) silu(g) * u
  T* out = nullptr;      // (n_r, h) the layer's output (x_mid + feed-forward block output)
};

// The step's shared inputs: RoPE tables for all n rows ((n, hd/2) each, layers.h rope_tables)
// and the RMSNorm epsilon. The n rows are rows [first, first + n) of a step of `total` rows
// (total 0: the whole step, first 0) with the sequence cut `cut` (0: none); rank p's rows of
// the sequence-parallel regions are the range's share of tp_sp_pieces(total, cut, T, p)
// (tp_range_rows), and "n_r" is their count.
template <class T>
struct TpStep {
  int64_t n = 0;
  const T* rope_cos = nullptr;
  const T* rope_sin = nullptr;
  double rms_eps = 1e-5;
  int64_t total = 0, first = 0;
  int64_t cut = 0;
  // true: the layer functions overlap each collective with the products next to it ("Overlap"
  // above); false: the blocking reference (each collective whole, between the products).
  bool overlap = true;
};
// Rank `rank`'s rows of a step's range, relative to the range: [first, first + n) intersected
// with the rank's pieces, shifted by -first (an empty range where they do not meet).
// Precondition (DISTCA_CHECK): the range meets at most one of the rank's pieces (a range on
// one side of the cut, or any range without one).
template <class T>
RowRange tp_range_rows(const TpStep<T>& s, int tp, int rank);

// x -> rstd1, xn1 (gathered), q, k, v on the rank's heads (after RoPE).
template <class T>
Status tp_attention_in_forward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                               const TpLayerTensors<const T>& w, const TpLayerActs<T>& a);
// o -> x_mid = x + reduce_scatter(o @ wo^T); then the feed-forward block: rstd2, xn2
// (gathered), g, u, a, out = x_mid + reduce_scatter(a @ w2^T).
template <class T>
Status tp_attention_out_mlp_forward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                                    const TpLayerTensors<const T>& w, const TpLayerActs<T>& a);
// Backward of tp_attention_out_mlp_forward. dx: (n_r, h) holds d(out) on entry and d(x_mid) on
// return; d_o: (n, d.heads, hd) receives d(o). Accumulates into g's wo, ffn_norm (partial over
// the rank's rows), w1, w3, w2.
template <class T>
Status tp_attention_out_mlp_backward(comm::Communicator& tp, const TpDims& d,
                                     const TpStep<T>& s, const TpLayerTensors<const T>& w,
                                     const TpLayerTensors<T>& g, const TpLayerActs<T>& a,
                                     T* dx, T* d_o);
// Backward of tp_attention_in_forward. dq (n, d.heads, hd), dk, dv (n, d.kv_heads, hd): the
// attention's input gradients on the rank's heads; dq and dk are inverse-rotated in place.
// dx: (n_r, h) holds d(x_mid) on entry and d(x) on return (the residual passes d(x_mid)).
// Accumulates into g's wq, wk, wv, attn_norm (partial over the rank's rows).
template <class T>
Status tp_attention_in_backward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                                const TpLayerTensors<const T>& w, const TpLayerTensors<T>& g,
                                const TpLayerActs<T>& a, T* dq, T* dk, const T* dv, T* dx);

// Vocabulary parallelism (the header comment). `s` gives the rows as for the layer functions;
// tokens, targets: (n) of the range.
// x (n_r, h) receives the embedding of the rank's rows; emb: the rank's rows (d.vocab, h).
template <class T>
Status tp_embedding_forward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                            const T* emb, const int32_t* tokens, T* x);
// dx (n_r, h): d(x) of the rank's rows; adds every row's gradient whose token is in d.vocab
// to demb (the rank's rows), in row order (the unsharded model's order).
template <class T>
Status tp_embedding_backward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                             const int32_t* tokens, const T* dx, T* demb);
// Cross-entropy over logits split by vocabulary: logits (n, d.vocab.size()) the rank's
// columns; loss (n) receives -log p(target) of every row (0 where the target is -1), the
// same on every rank; stats (n, 2) the row's maximum logit and sum of exp(logit - maximum)
// over the whole vocabulary, for the backward. Two all-gathers of per-row figures; the sums
// combine in rank order.
template <class T>
Status tp_vocab_cross_entropy_forward(comm::Communicator& tp, const TpDims& d, int64_t n,
                                      const T* logits, const int32_t* targets, T* loss,
                                      double* stats);
// dlogits (n, d.vocab.size()) = scale (softmax - onehot) of the rank's columns (may be logits
// itself); no communication.
template <class T>
void tp_vocab_cross_entropy_backward(const TpDims& d, int64_t n, T* dlogits, const T* logits,
                                     const double* stats, const int32_t* targets, double scale);

// The final block on a TP rank: final norm of the rank's rows, gathered, LM head columns of
// the rank's vocabulary, the loss.
template <class T>
struct TpHeadActs {
  const T* x = nullptr;      // (n_r, h) the residual stream after the last layer
  T* rstd = nullptr;         // (n_r)
  T* xn = nullptr;           // (n, h) final_norm(x), gathered
  T* logits = nullptr;       // (n, d.vocab.size()); d(logits) after the backward
  double* stats = nullptr;   // (n, 2) tp_vocab_cross_entropy_forward's
  T* loss = nullptr;         // (n) per-token loss, every row
};
template <class T>
Status tp_head_forward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                       const T* final_norm, const T* lm_head, const TpHeadActs<T>& a,
                       const int32_t* targets);
// dx (n_r, h) receives d(x) (overwritten); accumulates into g_final_norm (partial over the
// rank's rows) and g_lm_head (the rank's rows).
template <class T>
Status tp_head_backward(comm::Communicator& tp, const TpDims& d, const TpStep<T>& s,
                        const T* final_norm, const T* lm_head, T* g_final_norm, T* g_lm_head,
                        const TpHeadActs<T>& a, const int32_t* targets, double scale, T* dx);

}  // namespace distca::model
