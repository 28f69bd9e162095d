// Timelines as Chrome trace JSON (open in Perfetto or chrome://tracing): the one event type and
// writer below the runtime's measured traces (comm, runtime, `bench step`) and the simulator's
// modelled ones (`simulate --trace`).
//
// An event is a complete ("X") span [start_us, end_us) on row (pid, tid); times are
// microseconds from an epoch the producer chooses (the runtime: a steady_clock instant; the
// simulator: the iteration start).
//
// TraceRecorder: a thread-safe collector on std::chrono::steady_clock (CLOCK_MONOTONIC: shared
// by every process of one machine, so ranks started together on one host can be merged
// directly; across hosts align them with a barrier before taking the epoch). record() and
// events() may be called from any thread (one mutex). The free functions are pure.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "distca/core/status.h"

namespace distca {

// An integer shown in the viewer's details of an event ("microbatch": 3).
struct TraceArg {
  std::string key;
  int64_t value = 0;
  bool operator==(const TraceArg&) const = default;
};

struct TraceEvent {
  std::string name;      // "compute", "exchange", "fwd attention", ...
  std::string category;  // "compute", "comm", ...
  int64_t pid = 0;       // Chrome's process row (the runtime: 0 unless jobs are merged; sim: unit)
  int64_t tid = 0;       // Chrome's thread row (the runtime: the rank; sim: 0 compute, 1 comm)
  double start_us = 0;   // from the epoch
  double end_us = 0;     // >= start_us
  std::vector<TraceArg> args = {};  // "args" of the event; omitted from the JSON when empty
  bool operator==(const TraceEvent&) const = default;
};

// Names and order of the rows, and document-level facts ("otherData"), written as Chrome
// metadata ("M") events before the spans.
struct TraceProcess {
  int64_t pid = 0;
  std::string name;                        // "process_name"
  int64_t sort_index = 0;                  // "process_sort_index"
  std::vector<std::pair<int64_t, std::string>> threads;  // (tid, "thread_name")
};
using TraceValue = std::variant<int64_t, double, std::string>;
struct TraceMetadata {
  std::vector<TraceProcess> processes;
  std::vector<std::pair<std::string, TraceValue>> other_data;  // omitted when empty
};

// {"displayTimeUnit":"ms",["otherData":{...},]"traceEvents":[metadata..., spans...]}: one
// line, keys in lexicographic order, every span as {"args"?,"cat","dur","name","ph":"X","pid",
// "tid","ts"} with dur = end_us - start_us. Built one event at a time, so the memory beyond the
// result is that of one event.
std::string chrome_trace_json(std::span<const TraceEvent> events, const TraceMetadata& metadata = {});
// The metadata of one process `name` (pid 0) whose threads are ranks 0..ranks-1, each named
// "rank R": the trainer's and the training benchmark's traces.
TraceMetadata rank_trace_metadata(const std::string& name, int64_t ranks,
                                  std::vector<std::pair<std::string, TraceValue>> other_data);

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  TraceRecorder() : epoch_(Clock::now()) {}
  explicit TraceRecorder(Clock::time_point epoch) : epoch_(epoch) {}

  Clock::time_point epoch() const { return epoch_; }
  double now_us() const;
  double to_us(Clock::time_point t) const;

  void record(TraceEvent e);
  std::vector<TraceEvent> events() const;

 private:
  Clock::time_point epoch_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
};

// Byte encoding of events, for gathering them to one rank through a Communicator (host byte
// order: the ranks of one job share the architecture). unpack of a truncated or malformed
// encoding is kCorrupt.
std::vector<std::byte> pack_trace_events(std::span<const TraceEvent> events);
[[nodiscard]] Result<std::vector<TraceEvent>> unpack_trace_events(std::span<const std::byte> bytes);

}  // namespace distca
