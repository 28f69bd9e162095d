// The rows of the simulator's Chrome trace (simulator.h); core/trace.h writes the document.
#include "distca/sim/simulator.h"

namespace distca::sim {

TraceMetadata trace_metadata(const SimResult& result) {
  TraceMetadata m;
  for (size_t u = 0; u < result.per_unit.size(); ++u) {
    const auto pid = static_cast<int64_t>(u);
    m.processes.push_back({pid,
                           "unit " + std::to_string(u) + " (stage " + std::to_string(result.per_unit[u].stage) + ")",
                           pid,
                           {{0, "compute"}, {1, "communication"}}});
  }
  m.other_data = {{"strategy", result.strategy.name()},
                  {"model", result.model},
                  {"gpus", result.gpus},
                  {"iteration_seconds", result.iteration_seconds}};
  return m;
}

}  // namespace distca::sim
