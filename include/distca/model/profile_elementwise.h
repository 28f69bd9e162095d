// Timing of the element-wise work the trainer runs between the GEMMs and core attention, for
// the hardware profile (`distca profile --hardware-out`, cost/hardware_profile.h, field
// "elementwise"; docs/simulation-model.md, section "Hardware profile").
//
// What each figure holds mirrors src/model/llama.cpp's phases (fp32, the same functions):
//   layer_forward:  rmsnorm_forward x2, rope_apply (+1) on Q and K, the two residual adds,
//                   swiglu_forward: forward_pre + forward_post less their GEMMs
//   layer_backward: swiglu_backward, rmsnorm_backward x2, rope_apply (-1) on dQ and dK:
//                   backward_post + backward_pre less their GEMMs
//   loss_forward:   the final rmsnorm_forward and cross_entropy_forward (forward_head less the
//                   LM head's GEMM)
//   loss_backward:  cross_entropy_backward, zeroing dx, the final rmsnorm_backward
//   optimizer:      clip_to_norm (scaling every gradient) and one AdamW step, as the trainer's
//                   finish_step runs them after the gradient all-reduce, per parameter
// Not timed (small at the shapes profiled): rope_tables and the embedding gather / scatter,
// once per micro-batch rather than per layer, and the gradient norm (the runtime counts it in
// its communication phase).
//
// Thread safety: allocates its own buffers; runs on the calling thread's OpenMP team
// (kernels::ScopedComputeThreads), as the trainer does.
#pragma once

#include <cstdint>
#include <functional>

#include "distca/core/specs.h"
#include "distca/core/status.h"

namespace distca::model {

// Seconds per token (per parameter for the optimizer): the median over `repeats` timed runs of
// `tokens` rows (one layer's parameters plus the embedding and LM head for the optimizer),
// divided by the rows (parameters).
struct ElementwiseSeconds {
  double layer_forward = 0;
  double layer_backward = 0;
  double loss_forward = 0;
  double loss_backward = 0;
  double optimizer = 0;
};

// Parameters the optimizer figure is timed on at `spec`'s shapes.
int64_t elementwise_optimizer_params(const ModelSpec& spec);
// Bytes time_elementwise allocates at most (for the caller's memory check).
double elementwise_profile_bytes(const ModelSpec& spec, int64_t tokens);

// Times every figure above. `sync`, when set, runs before every timed run (a barrier: every
// rank starts each run together, as the profile's concurrent GEMMs do); `seed` fills the
// inputs; each timed run repeats its work back to back over at least `min_call_seconds`
// (core/clock.h time_calls; 0: once) and counts per run. Preconditions: spec valid with even
// head_dim, tokens >= 1, repeats >= 1. Errors: what `sync` returns.
Result<ElementwiseSeconds> time_elementwise(const ModelSpec& spec, int64_t tokens, int repeats,
                                            const std::function<Status()>& sync, uint64_t seed,
                                            double min_call_seconds = 0);

}  // namespace distca::model
