// distca.attention_forward / attention_backward (docs/python.md): the CPU kernel of
// kernels/attention.h on NumPy float32 arrays in its layout, for tests and small experiments.
// The GIL is released during the kernel; calls are serialised by kernels::kernel_mutex()
// (the kernel uses OpenMP and sets OpenBLAS's thread count, so two must not run at once).
#include <pybind11/stl.h>

#include <mutex>

#include "bind_common.h"
#include "distca/kernels/attention.h"

namespace distca::python {
namespace {

using F32 = py::array_t<float, py::array::c_style>;
using I32 = py::array_t<int32_t, py::array::c_style>;

template <class Array, class T>
Array as(const py::handle& obj, const char* name, int ndim) {
  if (!py::isinstance<py::array>(obj)) throw py::type_error(std::string(name) + ": expected a numpy array");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<T>())) {
    raise_value_error(std::string(name) + ": expected dtype " + std::string(py::str(py::dtype::of<T>())) + ", got " +
                      std::string(py::str(a.dtype())));
  }
  if (a.ndim() != ndim) {
    raise_value_error(std::string(name) + ": expected " + std::to_string(ndim) + " dimensions, got " +
                      std::to_string(a.ndim()));
  }
  return Array::ensure(a);  // C order (a copy only when the input is not)
}

void same_shape(const F32& a, const F32& b, const char* an, const char* bn) {
  for (int d = 0; d < 3; ++d) {
    if (a.shape(d) != b.shape(d)) {
      raise_value_error(std::string(bn) + ": shape must equal " + an + "'s (dimension " + std::to_string(d) + ": " +
                        std::to_string(b.shape(d)) + " != " + std::to_string(a.shape(d)) + ")");
    }
  }
}

// Fills the shapes of p from q, k, cu_q, cu_k and checks them against each other and the
// kernel's rules (kernels::validate, whose messages name the field).
kernels::AttentionParams params(const F32& q, const F32& k, const F32& v, const I32& cu_q, const I32& cu_k, bool causal,
                                float scale) {
  same_shape(k, v, "k", "v");
  if (cu_q.shape(0) < 1 || cu_q.shape(0) != cu_k.shape(0)) {
    raise_value_error("cu_seqlens_q and cu_seqlens_k: expected the same length n_tasks + 1 >= 1 (got " +
                      std::to_string(cu_q.shape(0)) + " and " + std::to_string(cu_k.shape(0)) + ")");
  }
  if (q.shape(2) != k.shape(2)) raise_value_error("k: head_dim must equal q's");
  kernels::AttentionParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.cu_seqlens_q = cu_q.data();
  p.cu_seqlens_k = cu_k.data();
  p.n_tasks = static_cast<int32_t>(cu_q.shape(0) - 1);
  p.n_heads = static_cast<int32_t>(q.shape(1));
  p.n_kv_heads = static_cast<int32_t>(k.shape(1));
  p.head_dim = static_cast<int32_t>(q.shape(2));
  p.softmax_scale = scale;
  p.causal = causal;
  check(kernels::validate(p));
  if (p.total_q() != q.shape(0)) {
    raise_value_error("q: " + std::to_string(q.shape(0)) + " rows, cu_seqlens_q ends at " + std::to_string(p.total_q()));
  }
  if (p.total_kv() != k.shape(0)) {
    raise_value_error("k: " + std::to_string(k.shape(0)) + " rows, cu_seqlens_k ends at " + std::to_string(p.total_kv()));
  }
  return p;
}

py::tuple forward(const py::handle& qo, const py::handle& ko, const py::handle& vo, const py::handle& cqo,
                  const py::handle& cko, bool causal, float scale) {
  F32 q = as<F32, float>(qo, "q", 3), k = as<F32, float>(ko, "k", 3), v = as<F32, float>(vo, "v", 3);
  I32 cq = as<I32, int32_t>(cqo, "cu_seqlens_q", 1), ck = as<I32, int32_t>(cko, "cu_seqlens_k", 1);
  kernels::AttentionParams p = params(q, k, v, cq, ck, causal, scale);
  F32 o({q.shape(0), q.shape(1), q.shape(2)});
  F32 lse({q.shape(1), q.shape(0)});
  p.o = o.mutable_data();
  p.lse = lse.mutable_data();
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(kernels::kernel_mutex());
    kernels::attention_forward(p);
  }
  return py::make_tuple(o, lse);
}

py::tuple backward(const py::handle& qo, const py::handle& ko, const py::handle& vo, const py::handle& oo,
                   const py::handle& lseo, const py::handle& doo, const py::handle& cqo, const py::handle& cko,
                   bool causal, float scale) {
  F32 q = as<F32, float>(qo, "q", 3), k = as<F32, float>(ko, "k", 3), v = as<F32, float>(vo, "v", 3);
  F32 o = as<F32, float>(oo, "o", 3), d_o = as<F32, float>(doo, "d_o", 3), lse = as<F32, float>(lseo, "lse", 2);
  I32 cq = as<I32, int32_t>(cqo, "cu_seqlens_q", 1), ck = as<I32, int32_t>(cko, "cu_seqlens_k", 1);
  same_shape(q, o, "q", "o");
  same_shape(q, d_o, "q", "d_o");
  if (lse.shape(0) != q.shape(1) || lse.shape(1) != q.shape(0)) {
    raise_value_error("lse: expected shape (n_heads, total_q) = (" + std::to_string(q.shape(1)) + ", " +
                      std::to_string(q.shape(0)) + ")");
  }
  kernels::AttentionParams p = params(q, k, v, cq, ck, causal, scale);
  F32 dq({q.shape(0), q.shape(1), q.shape(2)});
  F32 dk({k.shape(0), k.shape(1), k.shape(2)});
  F32 dv({k.shape(0), k.shape(1), k.shape(2)});
  p.o = const_cast<float*>(o.data());  // read only by the backward
  p.lse = const_cast<float*>(lse.data());
  p.d_o = d_o.data();
  p.dq = dq.mutable_data();
  p.dk = dk.mutable_data();
  p.dv = dv.mutable_data();
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(kernels::kernel_mutex());
    kernels::attention_backward(p);
  }
  return py::make_tuple(dq, dk, dv);
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def("attention_forward", &forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens_q"),
        py::arg("cu_seqlens_k"), py::kw_only(), py::arg("causal") = true, py::arg("softmax_scale") = 0.0f, R"doc(
Varlen core attention forward (the fused call of a server), on float32 arrays:
  q (total_q, n_heads, head_dim); k, v (total_kv, n_kv_heads, head_dim)
  cu_seqlens_q, cu_seqlens_k (n_tasks + 1,) int32 prefix sums starting at 0
causal: task t's query row r sees keys 0 .. kv_len - q_len + r (bottom-right aligned).
softmax_scale 0 means 1/sqrt(head_dim). GQA: query head h reads kv head h // (n_heads //
n_kv_heads). Returns (o, lse): o like q, lse (n_heads, total_q) float32, natural log.
Bad shapes raise ValueError naming the argument.
)doc");
  m.def("attention_backward", &backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"),
        py::arg("d_o"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::kw_only(), py::arg("causal") = true,
        py::arg("softmax_scale") = 0.0f, R"doc(
Varlen core attention backward: from q, k, v, the forward's o and lse, and d_o (like o),
returns (dq, dk, dv) shaped like q, k, v (float32).
)doc");
}

}  // namespace distca::python
