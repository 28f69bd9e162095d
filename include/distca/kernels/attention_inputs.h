// The arrays of one varlen attention call as a caller received them (the CLI's .npy files,
// the Python module's NumPy arrays), checked with one set of rules before anything is
// copied, allocated or computed: `distca attention` and distca.attention_forward /
// attention_backward give the same message for the same input, each naming the argument
// its own way ("--q" for the CLI, "q" for Python).
//
// Order of use: check_shapes (shapes only, no data read), the memory estimate
// (attention_output_bytes plus attention_scratch_bytes, core/memory.h), then make_params once
// the data are in C order (it reads cu_seqlens).
//
// Thread safety: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distca/core/status.h"
#include "distca/kernels/attention.h"

namespace distca::kernels {

// One argument: the name its messages start with and its shape (C order).
struct AttentionArray {
  std::string name;
  std::vector<int64_t> shape;
};

// The arguments of a call (layouts as in kernels/attention.h). The forward takes q, k, v and
// the two cu_seqlens; a backward adds d_o, and o and lse when the caller supplies the
// forward's outputs (Python) rather than recomputing them (the CLI).
struct AttentionInputs {
  AttentionArray q, k, v, cu_seqlens_q, cu_seqlens_k;
  std::optional<AttentionArray> d_o, o, lse;
  std::string scale_name = "softmax_scale";  // the softmax scale's name in messages

  bool backward() const { return d_o.has_value(); }
  // "--q (8, 2, 16) --k (8, 2, 16) --do": the arguments the memory estimate grows with.
  std::string describe() const;
};

// The shapes against each other, without reading any data: q, k, v, d_o, o 3-d and lse,
// cu_seqlens 1-d (callers check their element types); n_heads, n_kv_heads and head_dim
// positive; v, k alike; k's head_dim equal to q's; n_kv_heads divides n_heads; d_o and o
// like q; lse (n_heads, total_q); the two cu_seqlens of one length n_tasks + 1 >= 1; every
// dimension within int32 (what the kernel's parameters hold). kInvalidArgument naming the
// argument.
Status check_shapes(const AttentionInputs& in);

// A softmax scale the caller set: finite, > 0, and still so as a float32 (a double beyond
// float range would become inf, one below its smallest value the kernel's "default" 0).
// kInvalidArgument "<scale_name>: must be a finite number > 0 within float32 range (got -1)".
Status check_softmax_scale(double scale, const std::string& scale_name);

// Bytes of the outputs of the call: o and lse, with dq, dk and dv for a backward (fp32).
// Precondition: check_shapes(in).ok().
double attention_output_bytes(const AttentionInputs& in);

// The kernel's parameters of the call over C-order data: the shapes of `in`, the pointers
// given, then the checks that read cu_seqlens (their last entries equal q's and k's rows, and
// validate(), whose message is prefixed with the argument it is about). `scale` is the
// kernel's softmax_scale (0: 1/sqrt(head_dim); others checked by check_softmax_scale first).
// Output pointers are left null. Precondition: check_shapes(in).ok().
Result<AttentionParams> make_params(const AttentionInputs& in, const float* q, const float* k, const float* v,
                                    const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, bool causal,
                                    float scale);

// The outputs of one call in attention.h's layouts (dq, dk, dv empty without a backward).
struct AttentionOutputs {
  std::vector<float> o, lse, dq, dk, dv;
};
// Runs the forward, and with `backward` the backward on p.d_o, into outputs it allocates (p's
// output pointers are replaced); `reference`: the fp32 reference (reference.h) instead of the
// fast path. Preconditions: make_params returned p; the caller holds kernel_mutex() when other
// threads may run kernels.
AttentionOutputs run_attention(AttentionParams p, bool backward, bool reference);

}  // namespace distca::kernels
