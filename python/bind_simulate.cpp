// distca.simulate (docs/python.md): one training iteration on a simulated cluster, the value
// `distca simulate --json` prints. The options go through the CLI's mapping and checks
// (sim::make_sim_options, sim/request.h), so the messages are the CLI's.
#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "bind_common.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/core/specs.h"
#include "distca/cost/profiled.h"
#include "distca/sim/request.h"
#include "distca/sim/simulator.h"

namespace distca::python {
namespace {

py::object simulate(int64_t gpus, const std::string& dist, int64_t tokens_per_rank, const std::string& layout,
                    int64_t max_doc_len, uint64_t seed, double long_prob, const std::optional<std::vector<PyBatch>>& batches,
                    const std::string& model, const std::string& hardware, int64_t gpus_per_node, int64_t pp,
                    int64_t microbatches, const std::string& strategy, std::optional<double> mfu,
                    std::optional<double> attention_efficiency,
                    int64_t attention_tile, const std::string& cost_table, double tolerance, double wlb_mem_cap,
                    const std::string& dtype, bool shard_optimizer, bool checkpointing, bool lm_head, bool grad_sync,
                    const std::string& cad_servers, std::optional<double> inter_node_bw,
                    std::optional<double> inter_node_latency, std::optional<double> memory_gb) {
  sim::SimRequest req;
  req.model = model;
  req.hardware = hardware;
  req.gpus = gpus;
  if (gpus_per_node != 0) req.gpus_per_node = gpus_per_node;  // 0: the preset's
  req.pp = pp;
  req.strategy = strategy;
  req.mfu = mfu;
  req.attention_efficiency = attention_efficiency;
  req.attention_tile = attention_tile;
  req.cost_table = cost_table;
  req.tolerance = tolerance;
  req.wlb_mem_cap = wlb_mem_cap;
  req.dtype = dtype;
  req.shard_optimizer = shard_optimizer;
  req.activation_checkpointing = checkpointing;
  req.lm_head = lm_head;
  req.grad_sync = grad_sync;
  req.cad_servers = cad_servers;
  req.inter_node_gbps = inter_node_bw;
  req.inter_node_latency_us = inter_node_latency;
  req.memory_gb = memory_gb;
  sim::SimSetup setup = take(sim::make_sim_options(req));
  const sim::SimOptions& so = setup.options;
  const std::string memory_flags = "--gpus " + std::to_string(gpus) + " --pp " + std::to_string(pp);
  const int64_t ups = so.cluster.units_per_stage();
  std::vector<Batch> mbs;
  std::string batch_file;
  WorkloadOptions w;
  if (!batches) {
    if (microbatches < 0) raise_value_error("--microbatches must be positive");
    const int64_t count = microbatches > 0 ? microbatches : (so.cluster.pp > 1 ? 2 * so.cluster.pp : 1);
    if (count > 10000) raise_value_error("--microbatches must be at most 10000");
    w.dist = dist;
    w.tokens_per_rank = tokens_per_rank;
    w.max_doc_len = max_doc_len;
    w.seed = seed;
    w.prolong_long_prob = long_prob;
    w.layout = take(parse_layout(layout));
    check(sim::validate_draw(w, so.cluster, count));
    check(check_memory(sim::estimate_draw_bytes(so.cluster, w.tokens_per_rank, count),
                       memory_flags + " --tokens-per-rank " + std::to_string(w.tokens_per_rank) + " --microbatches " +
                           std::to_string(count)));
    Status s;
    {
      py::gil_scoped_release release;
      auto drawn = sim::draw_microbatches(w, so.cluster, count);
      if (drawn.ok()) mbs = std::move(drawn).value();
      else s = drawn.status();
    }
    check(s);
  } else {
    if (microbatches != 0) raise_value_error("--microbatches: with --batch every batch of the file is one micro-batch");
    if (batches->empty()) raise_value_error("batches: expected at least one micro-batch");
    for (size_t j = 0; j < batches->size(); ++j) {
      const Batch& b = *(*batches)[j].batch;
      if (b.ranks != ups) {
        raise_value_error("batches[" + std::to_string(j) + "] has " + std::to_string(b.ranks) +
                          " ranks; the cluster has " + std::to_string(ups) + " nodes per pipeline stage");
      }
      mbs.push_back(b);
    }
    batch_file = (*batches)[0].batch_file;
  }
  // The micro-batches are known now: what simulate() allocates follows from their pieces.
  check(check_memory(sim::estimate_simulate_bytes(so, mbs),
                     memory_flags +
                         (batches ? " --batch " + (batch_file.empty() ? std::string("(batches)") : batch_file)
                                  : " --tokens-per-rank " + std::to_string(tokens_per_rank)) +
                         " (" + std::to_string(mbs.size()) + " micro-batches)"));
  Result<sim::SimResult> result = Status::internal("not run");
  {
    py::gil_scoped_release release;
    result = sim::simulate(so, mbs);
  }
  nlohmann::json j = sim::to_json(take(std::move(result)));
  if (!batches) {
    j["dist"] = dist;
    j["seed"] = seed;
    j["tokens_per_unit"] = tokens_per_rank;
  } else {
    j["batch_file"] = batch_file.empty() ? nlohmann::json(nullptr) : nlohmann::json(batch_file);
  }
  return json_to_python(j.dump());
}

}  // namespace

void bind_simulate(py::module_& m) {
  m.def("simulate", &simulate, py::arg("gpus"), py::kw_only(), py::arg("dist") = "prolong",
        py::arg("tokens_per_rank") = 512 * 1024, py::arg("layout") = "contiguous", py::arg("max_doc_len") = 0,
        py::arg("seed") = 42, py::arg("long_prob") = 0.3, py::arg("batches") = py::none(),
        py::arg("model") = "llama-8b", py::arg("hardware") = "h200", py::arg("gpus_per_node") = 0, py::arg("pp") = 1,
        py::arg("microbatches") = 0, py::arg("strategy") = "cad", py::arg("mfu") = py::none(),
        py::arg("attention_efficiency") = py::none(), py::arg("attention_tile") = 128, py::arg("cost_table") = "",
        py::arg("tolerance") = 0.1, py::arg("wlb_mem_cap") = 1.2, py::arg("dtype") = "bf16",
        py::arg("shard_optimizer") = true, py::arg("checkpointing") = true, py::arg("lm_head") = true,
        py::arg("grad_sync") = true, py::arg("cad_servers") = "keep", py::arg("inter_node_bw") = py::none(),
        py::arg("inter_node_latency") = py::none(), py::arg("memory_gb") = py::none(), R"doc(
Simulates one training iteration as `distca simulate --json` does and returns that dict
(docs/simulation-model.md lists the keys). Every keyword is the CLI flag of the same name
(--no-checkpointing is checkpointing=False, and so on; gpus_per_node=0, microbatches=0,
mfu=None and attention_efficiency=None mean the CLI's defaults; inter_node_bw in GB/s per GPU, inter_node_latency in
microseconds). The micro-batches are drawn from dist/tokens_per_rank/seed (one rank per
node of a stage), or given as batches=[Batch, ...] (each with one rank per node of a
stage), like --batch. hardware: a preset or a hardware profile file (distca profile
--hardware-out; its GEMM rates, attention and links then replace mfu, attention_efficiency
and the preset's links). The GIL is released while drawing and simulating. Bad options raise
ValueError with the CLI's message.
)doc");
}

}  // namespace distca::python
