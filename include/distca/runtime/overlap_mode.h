// How ping-pong runs a micro-batch's exchanges (runtime/pingpong.h, docs/runtime.md
// "Ping-pong"): overlapped (pingpong), the no-overlap baseline (single-stream), or pingpong
// with 1-byte exchanges (signal, a timing ablation). Its own file so that the trainer's
// configuration (and the fuzzed config parser) can name it without the runners.
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "distca/core/status.h"

namespace distca::runtime {

enum class OverlapMode { kPingPong, kSingleStream, kSignal };
// "pingpong" | "single-stream" | "signal"; the message names `flag`.
Result<OverlapMode> parse_overlap_mode(const std::string& text, const std::string& flag = "--mode");
const char* overlap_mode_name(OverlapMode mode);

}  // namespace distca::runtime
