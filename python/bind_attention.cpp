// distca.attention_forward / attention_backward (docs/python.md): the CPU kernel of
// kernels/attention.h on NumPy float32 arrays in its layout, for tests and small experiments.
// The arguments are checked as `distca attention` checks its files (kernels/attention_inputs.h),
// with its memory estimate, before any copy or allocation.
// The GIL is released during the kernel; calls are serialised by kernels::kernel_mutex()
// (the kernel uses OpenMP and sets OpenBLAS's thread count, so two must not run at once).
#include <pybind11/stl.h>

#include <omp.h>

#include <mutex>

#include "bind_common.h"
#include "distca/core/memory.h"
#include "distca/kernels/attention.h"
#include "distca/kernels/attention_inputs.h"

namespace distca::python {
namespace {

using F32 = py::array_t<float, py::array::c_style>;
using I32 = py::array_t<int32_t, py::array::c_style>;

// One argument checked for type, dtype and rank, not converted yet.
template <class T>
py::array typed(const py::handle& obj, const std::string& name, int ndim) {
  if (!py::isinstance<py::array>(obj)) throw py::type_error(name + ": expected a numpy array");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<T>())) {
    raise_value_error(name + ": expected dtype " + std::string(py::str(py::dtype::of<T>())) + ", got " +
                      std::string(py::str(a.dtype())));
  }
  if (a.ndim() != ndim) {
    raise_value_error(name + ": expected " + std::to_string(ndim) + " dimensions, got " + std::to_string(a.ndim()));
  }
  return a;
}

kernels::AttentionArray argument_shape(const std::string& name, const py::array& a) {
  return {name, std::vector<int64_t>(a.shape(), a.shape() + a.ndim())};
}

// The array in C order: itself, or a copy (counted by the estimate). A copy numpy cannot make
// raises numpy's exception (MemoryError), never a null array.
template <class T>
py::array_t<T, py::array::c_style> c_order(const py::array& a) {
  return py::array_t<T, py::array::c_style>(a);
}

// The arguments of a call, checked in `distca attention`'s order (kernels/attention_inputs.h):
// the scale, the shapes, the memory estimate (outputs, the copies of inputs not in C order,
// the kernel's scratch), and, once in C order, the checks that read cu_seqlens.
struct Call {
  kernels::AttentionInputs in;
  std::vector<py::array> given;  // in the order of names
  double copy_bytes = 0;

  void add(kernels::AttentionArray& slot, const std::string& name, py::array a) {
    slot = argument_shape(name, a);
    if (!(a.flags() & py::array::c_style)) copy_bytes += static_cast<double>(a.nbytes());
    given.push_back(std::move(a));
  }
};

// Returns the kernel's softmax_scale (0: the default, 1/sqrt(head_dim)).
float check_call(const Call& c, double scale) {
  if (scale != 0.0) check(kernels::check_softmax_scale(scale, "softmax_scale"));
  check(kernels::check_shapes(c.in));
  const auto& qs = c.in.q.shape;
  const double need = c.copy_bytes + kernels::attention_output_bytes(c.in) +
                      kernels::attention_scratch_bytes(qs[0], qs[1], c.in.k.shape[1], qs[2], c.in.backward(),
                                                       omp_get_max_threads());
  check(check_memory(need, c.in.describe()));
  return static_cast<float>(scale);
}

Call inputs(const py::handle& q, const py::handle& k, const py::handle& v, const py::handle& cq, const py::handle& ck) {
  Call c;
  c.add(c.in.q, "q", typed<float>(q, "q", 3));
  c.add(c.in.k, "k", typed<float>(k, "k", 3));
  c.add(c.in.v, "v", typed<float>(v, "v", 3));
  c.add(c.in.cu_seqlens_q, "cu_seqlens_q", typed<int32_t>(cq, "cu_seqlens_q", 1));
  c.add(c.in.cu_seqlens_k, "cu_seqlens_k", typed<int32_t>(ck, "cu_seqlens_k", 1));
  return c;
}

py::tuple forward(const py::handle& qo, const py::handle& ko, const py::handle& vo, const py::handle& cqo,
                  const py::handle& cko, bool causal, double softmax_scale) {
  Call c = inputs(qo, ko, vo, cqo, cko);
  const float scale = check_call(c, softmax_scale);
  const F32 q = c_order<float>(c.given[0]), k = c_order<float>(c.given[1]), v = c_order<float>(c.given[2]);
  const I32 cq = c_order<int32_t>(c.given[3]), ck = c_order<int32_t>(c.given[4]);
  kernels::AttentionParams p = take(kernels::make_params(c.in, q.data(), k.data(), v.data(), cq.data(), ck.data(), causal, scale));
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
                   bool causal, double softmax_scale) {
  Call c = inputs(qo, ko, vo, cqo, cko);
  c.in.o.emplace();
  c.in.lse.emplace();
  c.in.d_o.emplace();
  c.add(*c.in.o, "o", typed<float>(oo, "o", 3));
  c.add(*c.in.lse, "lse", typed<float>(lseo, "lse", 2));
  c.add(*c.in.d_o, "d_o", typed<float>(doo, "d_o", 3));
  const float scale = check_call(c, softmax_scale);
  const F32 q = c_order<float>(c.given[0]), k = c_order<float>(c.given[1]), v = c_order<float>(c.given[2]);
  const I32 cq = c_order<int32_t>(c.given[3]), ck = c_order<int32_t>(c.given[4]);
  const F32 o = c_order<float>(c.given[5]), lse = c_order<float>(c.given[6]), d_o = c_order<float>(c.given[7]);
  kernels::AttentionParams p = take(kernels::make_params(c.in, q.data(), k.data(), v.data(), cq.data(), ck.data(), causal, scale));
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
        py::arg("cu_seqlens_k"), py::kw_only(), py::arg("causal") = true, py::arg("softmax_scale") = 0.0, R"doc(
Varlen core attention forward (the fused call of a server), on float32 arrays:
  q (total_q, n_heads, head_dim); k, v (total_kv, n_kv_heads, head_dim)
  cu_seqlens_q, cu_seqlens_k (n_tasks + 1,) int32 prefix sums starting at 0
causal: task t's query row r sees keys 0 .. kv_len - q_len + r (bottom-right aligned).
softmax_scale: 0 means 1/sqrt(head_dim); any other value must be finite and > 0 within
float32 range. GQA: query head h reads kv head h // (n_heads // n_kv_heads). Returns (o, lse):
o like q, lse (n_heads, total_q) float32, natural log. Arrays not in C order are copied.
Arguments are checked with `distca attention`'s rules before anything is copied or
allocated: bad shapes or values raise ValueError naming the argument; a call whose outputs,
copies and kernel scratch exceed the memory limit (set_max_memory) raises MemoryError.
)doc");
  m.def("attention_backward", &backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"),
        py::arg("d_o"), py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::kw_only(), py::arg("causal") = true,
        py::arg("softmax_scale") = 0.0, R"doc(
Varlen core attention backward: from q, k, v, the forward's o and lse, and d_o (like o),
returns (dq, dk, dv) shaped like q, k, v (float32). Checks and errors as attention_forward's,
with o and d_o shaped like q and lse (n_heads, total_q).
)doc");
}

}  // namespace distca::python
