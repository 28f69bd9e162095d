// Ping-pong's overlap modes (include/distca/runtime/overlap_mode.h).
#include "distca/runtime/overlap_mode.h"

namespace distca::runtime {

Result<OverlapMode> parse_overlap_mode(const std::string& text, const std::string& flag) {
  if (text == "pingpong") return OverlapMode::kPingPong;
  if (text == "single-stream") return OverlapMode::kSingleStream;
  if (text == "signal") return OverlapMode::kSignal;
  return Status::invalid_argument(flag + " must be pingpong, single-stream or signal (got '" + text + "')");
}

const char* overlap_mode_name(OverlapMode mode) {
  switch (mode) {
    case OverlapMode::kPingPong: return "pingpong";
    case OverlapMode::kSingleStream: return "single-stream";
    case OverlapMode::kSignal: return "signal";
  }
  return "?";
}

}  // namespace distca::runtime
