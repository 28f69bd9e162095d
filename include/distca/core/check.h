// Invariant checks. A failed check is a bug in distca, not a user error: it prints
// "distca: check failed at FILE:LINE: CONDITION (MESSAGE)" to stderr and aborts. Checks stay
// on in release builds; they guard cheap conditions only (never inside an inner loop).
#pragma once

#include <string>

namespace distca::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);
}  // namespace distca::detail

#define DISTCA_CHECK(cond)                                                  \
  do {                                                                      \
    if (!(cond)) ::distca::detail::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define DISTCA_CHECK_MSG(cond, msg)                                            \
  do {                                                                         \
    if (!(cond)) ::distca::detail::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
