#include "distca/kernels/attention_inputs.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "distca/kernels/reference.h"

namespace distca::kernels {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

Status bad(const AttentionArray& a, const std::string& what) {
  return Status::invalid_argument(a.name + ": " + what);
}

Status check_rank(const AttentionArray& a, size_t rank) {
  if (a.shape.size() == rank) return {};
  return bad(a, std::to_string(a.shape.size()) + "-d array, expected " + std::to_string(rank) + "-d");
}

Status check_like_q(const AttentionInputs& in, const std::optional<AttentionArray>& a) {
  if (!a) return {};
  DISTCA_RETURN_IF_ERROR(check_rank(*a, 3));
  if (a->shape != in.q.shape) return bad(*a, "shape " + shape_str(a->shape) + " differs from " + in.q.name + " " + shape_str(in.q.shape));
  return {};
}

// The argument a validate() message is about (its messages start with the field's name).
const std::string& subject(const AttentionInputs& in, const std::string& message) {
  auto starts = [&](const char* p) { return message.rfind(p, 0) == 0; };
  if (starts("softmax_scale")) return in.scale_name;
  if (starts("cu_seqlens_k") || starts("max_seqlen_k")) return in.cu_seqlens_k.name;
  if (starts("n_kv_heads") || starts("k and v")) return in.k.name;
  if (starts("n_heads") || starts("head_dim") || starts("q must")) return in.q.name;
  return in.cu_seqlens_q.name;  // cu_seqlens_q, max_seqlen_q, and "task t: q_len > kv_len"
}

double elements(const std::vector<int64_t>& shape) {
  double n = 1;
  for (int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

}  // namespace

std::string AttentionInputs::describe() const {
  return q.name + " " + shape_str(q.shape) + " " + k.name + " " + shape_str(k.shape) + (d_o ? " " + d_o->name : "");
}

Status check_shapes(const AttentionInputs& in) {
  for (const AttentionArray* a : {&in.q, &in.k, &in.v}) DISTCA_RETURN_IF_ERROR(check_rank(*a, 3));
  for (const AttentionArray* a : {&in.cu_seqlens_q, &in.cu_seqlens_k}) DISTCA_RETURN_IF_ERROR(check_rank(*a, 1));
  const auto& qs = in.q.shape;
  const auto& ks = in.k.shape;
  for (const AttentionArray* a : {&in.q, &in.k, &in.v}) {
    for (int64_t d : a->shape) {
      if (d < 0 || d > kInt32Max) return bad(*a, "dimensions exceed int32 (shape " + shape_str(a->shape) + ")");
    }
  }
  if (qs[1] <= 0 || qs[2] <= 0) return bad(in.q, "shape " + shape_str(qs) + " needs n_heads and head_dim > 0");
  if (ks != in.v.shape) return bad(in.v, "shape " + shape_str(in.v.shape) + " differs from " + in.k.name + " " + shape_str(ks));
  if (ks[2] != qs[2]) {
    return bad(in.k, "head_dim " + std::to_string(ks[2]) + " differs from " + in.q.name + "'s " + std::to_string(qs[2]));
  }
  if (ks[1] <= 0 || qs[1] % ks[1] != 0) {
    return bad(in.k, "n_kv_heads " + std::to_string(ks[1]) + " must divide " + in.q.name + "'s n_heads " +
                         std::to_string(qs[1]));
  }
  DISTCA_RETURN_IF_ERROR(check_like_q(in, in.d_o));
  DISTCA_RETURN_IF_ERROR(check_like_q(in, in.o));
  if (in.lse) {
    DISTCA_RETURN_IF_ERROR(check_rank(*in.lse, 2));
    if (in.lse->shape[0] != qs[1] || in.lse->shape[1] != qs[0]) {
      return bad(*in.lse, "shape " + shape_str(in.lse->shape) + " differs from (n_heads, total_q) = (" +
                              std::to_string(qs[1]) + ", " + std::to_string(qs[0]) + ")");
    }
  }
  const int64_t n_q = in.cu_seqlens_q.shape[0], n_k = in.cu_seqlens_k.shape[0];
  if (n_q < 1) return bad(in.cu_seqlens_q, "needs at least one entry");
  if (n_q - 1 > kInt32Max) return bad(in.cu_seqlens_q, "more than 2^31 - 1 tasks");
  if (n_k != n_q) {
    return bad(in.cu_seqlens_k, std::to_string(n_k) + " entries but " + in.cu_seqlens_q.name + " has " + std::to_string(n_q));
  }
  return {};
}

Status check_softmax_scale(double scale, const std::string& scale_name) {
  const auto f = static_cast<float>(scale);
  if (std::isfinite(f) && f > 0.0f) return {};
  char got[32];
  std::snprintf(got, sizeof got, "%g", scale);
  return Status::invalid_argument(scale_name + ": must be a finite number > 0 within float32 range (got " + got + ")");
}

double attention_output_bytes(const AttentionInputs& in) {
  const auto& qs = in.q.shape;
  const double o_lse = elements(qs) + static_cast<double>(qs[0]) * static_cast<double>(qs[1]);
  const double grads = in.backward() ? elements(qs) + 2 * elements(in.k.shape) : 0.0;
  return (o_lse + grads) * sizeof(float);
}

Result<AttentionParams> make_params(const AttentionInputs& in, const float* q, const float* k, const float* v,
                                    const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, bool causal,
                                    float scale) {
  const auto& qs = in.q.shape;
  const auto& ks = in.k.shape;
  const int64_t n = in.cu_seqlens_q.shape[0];
  if (cu_seqlens_q[n - 1] != qs[0]) {
    return bad(in.cu_seqlens_q, "last entry " + std::to_string(cu_seqlens_q[n - 1]) + " must equal total_q " +
                                    std::to_string(qs[0]) + " (rows of " + in.q.name + ")");
  }
  if (cu_seqlens_k[n - 1] != ks[0]) {
    return bad(in.cu_seqlens_k, "last entry " + std::to_string(cu_seqlens_k[n - 1]) + " must equal total_kv " +
                                    std::to_string(ks[0]) + " (rows of " + in.k.name + ")");
  }
  AttentionParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.cu_seqlens_q = cu_seqlens_q;
  p.cu_seqlens_k = cu_seqlens_k;
  p.n_tasks = static_cast<int32_t>(n - 1);
  p.n_heads = static_cast<int32_t>(qs[1]);
  p.n_kv_heads = static_cast<int32_t>(ks[1]);
  p.head_dim = static_cast<int32_t>(qs[2]);
  p.softmax_scale = scale;
  p.causal = causal;
  if (Status st = validate(p); !st.ok()) return Status::invalid_argument(subject(in, st.message()) + ": " + st.message());
  return p;
}

AttentionOutputs run_attention(AttentionParams p, bool backward, bool reference) {
  const auto q_size = static_cast<size_t>(p.total_q() * p.n_heads * p.head_dim);
  const auto kv_size = static_cast<size_t>(p.total_kv() * p.n_kv_heads * p.head_dim);
  AttentionOutputs out;
  out.o.resize(q_size);
  out.lse.resize(static_cast<size_t>(p.n_heads * p.total_q()));
  p.o = out.o.data();
  p.lse = out.lse.data();
  if (backward) {
    out.dq.resize(q_size);
    out.dk.resize(kv_size);
    out.dv.resize(kv_size);
    p.dq = out.dq.data();
    p.dk = out.dk.data();
    p.dv = out.dv.data();
  }
  if (reference) {
    reference_forward<float>(p, p.q, p.k, p.v, p.o, p.lse);
    if (backward) reference_backward<float>(p, p.q, p.k, p.v, p.d_o, p.dq, p.dk, p.dv);
  } else {
    attention_forward(p);
    if (backward) attention_backward(p);
  }
  return out;
}

}  // namespace distca::kernels
