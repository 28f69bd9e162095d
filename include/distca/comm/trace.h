// A small timeline recorder for proving overlap of communication and compute, written as
// Chrome trace JSON (open in Perfetto or chrome://tracing).
//
// Times are microseconds since the recorder's epoch on std::chrono::steady_clock
// (CLOCK_MONOTONIC: shared by every process of one machine, so ranks started together on one
// host can be merged directly; across hosts align them with a barrier before taking the
// epoch).
//
// Thread safety: record() and events() may be called from any thread (one mutex).
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "distca/core/status.h"

namespace distca::comm {

struct TraceEvent {
  std::string name;      // "compute", "exchange", ...
  std::string category;  // "compute", "comm", ...
  int pid = 0;           // Chrome's process row; 0 unless several jobs are merged
  int tid = 0;           // Chrome's thread row: the rank
  double start_us = 0;   // from the epoch
  double end_us = 0;     // >= start_us
};

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

// {"traceEvents":[{"name":..,"cat":..,"ph":"X","ts":..,"dur":..,"pid":..,"tid":..},...],
//  "displayTimeUnit":"ms"}
std::string chrome_trace_json(std::span<const TraceEvent> events);

// Byte encoding of events, for gathering them to one rank through a Communicator.
std::vector<std::byte> pack_trace_events(std::span<const TraceEvent> events);
Result<std::vector<TraceEvent>> unpack_trace_events(std::span<const std::byte> bytes);

}  // namespace distca::comm
