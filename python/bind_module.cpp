// The extension module distca._distca: ModelSpec and the presets here, the rest in
// bind_batch.cpp, bind_plan.cpp, bind_simulate.cpp, bind_attention.cpp (docs/python.md).
#include <pybind11/stl.h>

#include "bind_common.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"

namespace distca::python {

void raise_status(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorrupt:
      throw py::value_error(status.message());
    case StatusCode::kOutOfMemory: {
      // check_memory's hint names the CLI's flag; the module's is set_max_memory.
      std::string message = status.message();
      const std::string flag = "--max-memory";
      if (const size_t at = message.find(flag); at != std::string::npos) message.replace(at, flag.size(), "distca.set_max_memory");
      PyErr_SetString(PyExc_MemoryError, message.c_str());
      throw py::error_already_set();
    }
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
ModelSpec.preset("llama-8b"). Checked when made and again when used (fields may be set
after): every field in 1..2^24, n_kv_heads divides n_heads, n_heads x head_dim at most
2^24, at most 2^52 parameters; ValueError naming the field otherwise.
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
  m.def(
      "set_max_memory",
      [](const py::object& size) {
        if (size.is_none()) return set_memory_limit(0);
        if (py::isinstance<py::str>(size)) return set_memory_limit(take(parse_byte_size(size.cast<std::string>())));
        if (py::isinstance<py::int_>(size) && !py::isinstance<py::bool_>(size)) {
          const auto bytes = size.cast<int64_t>();
          if (bytes < 0) raise_value_error("set_max_memory: expected a size >= 0 (got " + std::to_string(bytes) + ")");
          return set_memory_limit(static_cast<uint64_t>(bytes));
        }
        throw py::type_error("set_max_memory: expected a size such as \"8G\", a number of bytes, or None");
      },
      py::arg("size"), R"doc(
The memory limit every call checks its estimate against before it allocates (the CLI's
--max-memory): "512M", "8G", "1.5GiB", a number of bytes, or None / 0 for the machine's
available memory (the default). A call whose estimate exceeds it raises MemoryError naming
the arguments that size it. Process-wide.
)doc");
  m.def("max_memory", &memory_limit_bytes, "The memory limit in force, in bytes (0: unknown, no limit).");
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
