// The extension module distca._distca: ModelSpec and the presets here, the rest in
// bind_batch.cpp, bind_plan.cpp, bind_simulate.cpp, bind_attention.cpp (docs/python.md).
#include <pybind11/stl.h>

#include "bind_common.h"
#include "distca/core/specs.h"

namespace distca::python {

void raise_status(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorrupt:
      throw py::value_error(status.message());
    default:
      throw std::runtime_error(status.message());
  }
}

void raise_value_error(const std::string& message) { throw py::value_error(message); }

py::object json_to_python(const std::string& text) {
  return py::module_::import("json").attr("loads")(text);
}

namespace {

void bind_specs(py::module_& m) {
  py::class_<ModelSpec>(m, "ModelSpec", R"doc(
Shapes of a Llama-style model (what the byte counts and FLOPs of a plan use).

ModelSpec(name, n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab) or
ModelSpec.preset("llama-8b"). Every field positive; n_kv_heads divides n_heads (checked
when the spec is used, with the CLI's message).
)doc")
      .def(py::init([](std::string name, int64_t n_layers, int64_t hidden, int64_t n_heads, int64_t n_kv_heads,
                       int64_t head_dim, int64_t ffn, int64_t vocab) {
             ModelSpec s{std::move(name), n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab};
             check(s.validate());
             return s;
           }),
           py::arg("name"), py::arg("n_layers"), py::arg("hidden"), py::arg("n_heads"), py::arg("n_kv_heads"),
           py::arg("head_dim"), py::arg("ffn"), py::arg("vocab"))
      .def_static(
          "preset", [](const std::string& name) { return take(model_preset(name)); }, py::arg("name"),
          "The preset `name` (see model_presets()); ValueError naming it when unknown.")
      .def_readwrite("name", &ModelSpec::name)
      .def_readwrite("n_layers", &ModelSpec::n_layers)
      .def_readwrite("hidden", &ModelSpec::hidden)
      .def_readwrite("n_heads", &ModelSpec::n_heads, "query heads")
      .def_readwrite("n_kv_heads", &ModelSpec::n_kv_heads, "key/value heads (GQA); divides n_heads")
      .def_readwrite("head_dim", &ModelSpec::head_dim)
      .def_readwrite("ffn", &ModelSpec::ffn, "SwiGLU intermediate size")
      .def_readwrite("vocab", &ModelSpec::vocab)
      .def("__repr__", [](const ModelSpec& s) {
        return "ModelSpec(name='" + s.name + "', n_layers=" + std::to_string(s.n_layers) +
               ", hidden=" + std::to_string(s.hidden) + ", n_heads=" + std::to_string(s.n_heads) +
               ", n_kv_heads=" + std::to_string(s.n_kv_heads) + ", head_dim=" + std::to_string(s.head_dim) +
               ", ffn=" + std::to_string(s.ffn) + ", vocab=" + std::to_string(s.vocab) + ")";
      });
  m.def("model_presets", &model_preset_names, "Names accepted by model= and ModelSpec.preset.");
  m.def("hardware_presets", &hardware_preset_names, "Names accepted by simulate(hardware=...).");
}

}  // namespace

PYBIND11_MODULE(_distca, m) {
  m.doc() = "distca's compiled core (import distca instead; docs/python.md).";
  // Types and functions take their module name from the scope's __name__ when bound: bound
  // under the public package's name, help() and signatures say distca.Plan, not
  // distca._distca.Plan (the package re-exports every name).
  py::object own_name = m.attr("__name__");
  m.attr("__name__") = "distca";
  bind_specs(m);
  bind_batch(m);
  bind_plan(m);
  bind_simulate(m);
  bind_attention(m);
  m.attr("__name__") = own_name;
}

}  // namespace distca::python
