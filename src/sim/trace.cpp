// Chrome trace output (simulator.h): complete ("X") events in microseconds, one process per
// unit with a compute thread and a communication thread, named by metadata events.
#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/sim/simulator.h"

namespace distca::sim {

std::string chrome_trace_json(const SimResult& result) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t u = 0; u < result.per_unit.size(); ++u) {
    const auto pid = static_cast<int64_t>(u);
    const std::string name = "unit " + std::to_string(u) + " (stage " + std::to_string(result.per_unit[u].stage) + ")";
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0}, {"args", {{"sort_index", pid}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "communication"}}}});
  }
  for (const TraceEvent& e : result.events) {
    nlohmann::json ev = {{"ph", "X"},
                         {"name", e.name},
                         {"cat", e.track == 0 ? "compute" : "comm"},
                         {"pid", e.unit},
                         {"tid", e.track},
                         {"ts", e.start * 1e6},
                         {"dur", e.duration * 1e6}};
    if (e.microbatch >= 0) ev["args"] = {{"microbatch", e.microbatch}};
    events.push_back(std::move(ev));
  }
  nlohmann::json out = {{"traceEvents", std::move(events)},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"strategy", result.strategy.name()},
                          {"model", result.model},
                          {"gpus", result.gpus},
                          {"iteration_seconds", result.iteration_seconds}}}};
  return out.dump() + "\n";
}

Status write_chrome_trace(const SimResult& result, const std::string& path) {
  if (result.events.empty()) {
    return Status::invalid_argument("--trace " + path + ": the simulation kept no events (record_events was off)");
  }
  return write_file_atomic(path, chrome_trace_json(result));
}

}  // namespace distca::sim
