// Shared pieces of the Python bindings (python/bind_*.cpp, docs/python.md).
//
// Errors: a non-OK Status becomes ValueError for the codes the CLI maps to exit 2
// (invalid_argument, not_found, corrupt), MemoryError for out_of_memory (a memory estimate
// over the limit, core/memory.h: checked before anything is allocated) and RuntimeError
// otherwise; the message is the one the CLI prints after "distca: error: ". No input reaches
// a DISTCA_CHECK or an abort: every binding checks its arguments with the library's rules
// (the CLI's) and its memory estimate first; a C++ exception (bad_alloc, ...) becomes a
// Python exception through pybind11, so nothing may throw inside an OpenMP region.
// Arrays: read-only NumPy views onto storage owned by a C++ object; the view's base keeps
// that object alive (a capsule holding a shared_ptr), so a view outlives the Python wrapper.
// Thread safety: call with the GIL held.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "distca/core/status.h"
#include "distca/data/batch.h"

namespace distca::python {

namespace py = pybind11;

// Throws the Python exception for `status`. Precondition: !status.ok().
[[noreturn]] void raise_status(const Status& status);
inline void check(const Status& status) {
  if (!status.ok()) raise_status(status);
}
template <class T>
T take(Result<T> result) {
  if (!result.ok()) raise_status(result.status());
  return std::move(result).value();
}
[[noreturn]] void raise_value_error(const std::string& message);

// A capsule that owns a copy of `owner` (keeps it alive while any view refers to it).
template <class T>
py::capsule keep_alive(const std::shared_ptr<T>& owner) {
  auto* held = new std::shared_ptr<T>(owner);
  return py::capsule(held, [](void* p) { delete static_cast<std::shared_ptr<T>*>(p); });
}

// A read-only view of `data` with `shape` (C order), based on `base`.
template <class T>
py::array readonly_view(const T* data, std::vector<py::ssize_t> shape, py::handle base) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = sizeof(T);
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  // numpy refuses a null pointer even for an empty array; any aligned address will do.
  static const T kEmpty{};
  py::array a(py::dtype::of<T>(), std::move(shape), std::move(strides), data ? data : &kEmpty, base);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

// Parses `text` as JSON into Python objects (json.loads).
py::object json_to_python(const std::string& text);

// The Python Batch: an immutable batch and where it came from (the keys `distca plan --json`
// and `distca simulate --json` add: dist, layout and seed for a drawn batch, batch_file for
// one read from a file; both empty for a batch built in memory).
struct PyBatch {
  std::shared_ptr<const Batch> batch;
  std::string dist;          // non-empty: drawn by workload()
  std::string layout;
  uint64_t seed = 0;
  int64_t tokens_per_rank = 0;  // the draw's --tokens-per-rank
  std::string batch_file;    // non-empty: read by Batch.load
};

void bind_batch(py::module_& m);
void bind_plan(py::module_& m);
void bind_simulate(py::module_& m);
void bind_attention(py::module_& m);


}  // namespace distca::python
