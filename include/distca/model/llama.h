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
// (model_memory() gives the bytes). Logits take vocab values per token; for large vocabularies
// they dominate (chunking them is a later optimisation).
//
// Numerics: T = float for training (fp32 storage and BLAS sgemm; per-row reductions, softmax
// and the loss sum in double); T = double exists for the gradient checks in tests.
// Determinism: the same inputs and parameters give the same bits (loss and gradients) for any
// OpenMP team size and any OpenBLAS thread count (layers.h, "Threads"; tests/model/
// test_threads.cpp checks 1, 2 and 3 threads).
//
// Thread safety: one thread at a time per object; a step uses the calling thread's OpenMP team.
// Distinct objects may run in distinct threads (ranks as threads); they share OpenBLAS's
// process-wide thread count, which such a process sets to one around them (the trainer does).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/model/attention_executor.h"

namespace distca::model {

// Model-layer options beyond the sizes of ModelSpec.
struct LlamaOptions {
  double rope_theta = 10000.0;  // RoPE base
  double rms_eps = 1e-5;        // RMSNorm epsilon
  double init_std = 0.02;       // standard deviation of the matrices at initialisation
  // rope_theta > 1, rms_eps > 0, init_std > 0, all finite; the message names the field.
  Status validate() const;
};

// Reads the keys "rope_theta", "rms_eps", "init_std" of a JSON object (absent keys keep the
// defaults, unknown keys are ignored), then validates.
Result<LlamaOptions> llama_options_from_json(const nlohmann::json& j);

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

// Memory of one model replica, for peak-memory accounting. bytes_per_element: 4 for fp32.
struct ModelMemory {
  int64_t param_bytes = 0;                   // params(); grads() is the same again
  int64_t saved_activation_bytes_per_token = 0;  // kept from forward for backward
  int64_t scratch_bytes_per_token = 0;       // backward's temporaries (one layer's worth)
  int64_t activation_bytes_per_token() const {
    return saved_activation_bytes_per_token + scratch_bytes_per_token;
  }
};
ModelMemory model_memory(const ModelSpec& spec, int64_t bytes_per_element = 4);

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

template <class T>
class Llama {
 public:
  // Validates the spec (and head_dim even, for RoPE), max_tokens > 0 and the options; the
  // message names the field. Allocates params, grads (zeroed) and the workspace.
  static Result<Llama> create(const ModelSpec& spec, int64_t max_tokens, uint64_t seed,
                              const LlamaOptions& options = {});

  const ModelSpec& spec() const { return spec_; }
  const LlamaOptions& options() const { return options_; }
  int64_t max_tokens() const { return max_tokens_; }
  const std::vector<TensorInfo>& layout() const { return layout_; }
  // The tensor named `name` (DISTCA_CHECK that it exists).
  const TensorInfo& tensor(const std::string& name) const;

  std::span<T> params() { return params_; }
  std::span<const T> params() const { return params_; }
  std::span<T> grads() { return grads_; }
  std::span<const T> grads() const { return grads_; }
  void zero_grads();

  // Evaluation: forward only (the executor's forward is called, never its backward).
  // per_token_loss: (n) or empty; receives -log p(target) per token, 0 where the target is -1.
  Result<StepLoss> forward(const StepInputs& in, BasicAttentionExecutor<T>& executor,
                           std::span<T> per_token_loss = {});

  // Forward and backward: ADDS the gradient of grad_scale * loss_sum to grads() (call
  // zero_grads() first unless accumulating micro-batches).
  Result<StepLoss> forward_backward(const StepInputs& in, BasicAttentionExecutor<T>& executor,
                                    double grad_scale, std::span<T> per_token_loss = {});

 private:
  Llama() = default;
  struct LayerPtrs;   // one layer's parameter (or gradient) tensors
  struct LayerActs;   // one layer's saved activations
  LayerPtrs layer_ptrs(T* base, int64_t layer) const;
  LayerActs layer_acts(int64_t layer);
  Status check_inputs(const StepInputs& in, const BasicAttentionExecutor<T>& executor,
                      std::span<T> per_token_loss) const;
  Result<StepLoss> run_forward(const StepInputs& in, BasicAttentionExecutor<T>& executor,
                               std::span<T> per_token_loss);
  Status run_backward(const StepInputs& in, BasicAttentionExecutor<T>& executor,
                      double grad_scale);

  ModelSpec spec_;
  LlamaOptions options_;
  int64_t max_tokens_ = 0;
  std::vector<TensorInfo> layout_;
  std::vector<T> params_;  // (param_count)
  std::vector<T> grads_;   // (param_count)
  // Workspace, each region sized for max_tokens (docs/model.md lists them):
  std::vector<T> acts_;     // saved activations: n_layers blocks of LayerActs, then the final ones
  std::vector<T> scratch_;  // backward temporaries
  std::vector<T> loss_;     // (max_tokens) per-token loss
};

extern template class Llama<float>;
extern template class Llama<double>;

}  // namespace distca::model
