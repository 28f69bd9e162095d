#include "distca/core/status.h"

#include <cstdio>
#include <cstdlib>

namespace distca {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kCorrupt: return "corrupt";
    case StatusCode::kOutOfMemory: return "out of memory";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

namespace detail {
void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "distca: check failed at %s:%d: %s%s%s%s\n", file, line, condition,
               message.empty() ? "" : " (", message.c_str(), message.empty() ? "" : ")");
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace distca
