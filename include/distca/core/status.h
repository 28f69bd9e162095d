// Status and Result: how recoverable errors travel in distca.
//
// Contract: library code never prints and never exits. A condition a caller can cause (bad
// flag, malformed file, impossible configuration) comes back as a non-OK Status or a Result
// holding one; its message is one line that names the offending input (flag, field or file),
// ready for the CLI to print as is. Broken internal invariants are not Status: they fail a
// DISTCA_CHECK (check.h).
//
// Thread safety: Status and Result are plain values; distinct objects may be used from
// distinct threads freely.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "distca/core/check.h"

namespace distca {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something malformed or out of range
  kNotFound,         // a named file, preset or key does not exist
  kIoError,          // reading or writing failed
  kCorrupt,          // data failed a checksum or a structural check
  kOutOfMemory,      // a configuration does not fit
  kInternal,         // a lower layer (MPI, BLAS, ...) reported an error
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  static Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
  static Status out_of_memory(std::string m) { return {StatusCode::kOutOfMemory, std::move(m)}; }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: --ranks must be positive (got 0)"; "OK" when ok().
  std::string to_string() const;

  // Returns a copy whose message is "context: message" (for errors crossing a layer).
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T>: a T or a non-OK Status. Accessing value() of an error fails a check.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    DISTCA_CHECK_MSG(!std::get<Status>(v_).ok(), "Result constructed from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    DISTCA_CHECK_MSG(ok(), "value() of an error Result: " + status().to_string());
    return std::get<T>(v_);
  }
  const T& value() const& {
    DISTCA_CHECK_MSG(ok(), "value() of an error Result: " + status().to_string());
    return std::get<T>(v_);
  }
  T&& value() && {
    DISTCA_CHECK_MSG(ok(), "value() of an error Result: " + status().to_string());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace distca

#define DISTCA_CONCAT_INNER_(a, b) a##b
#define DISTCA_CONCAT_(a, b) DISTCA_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is not OK.
#define DISTCA_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::distca::Status distca_st_ = (expr);       \
    if (!distca_st_.ok()) return distca_st_;    \
  } while (0)

// DISTCA_ASSIGN_OR_RETURN(auto x, f()): evaluates f() (a Result), returns its Status on
// error, otherwise moves the value into the declaration.
#define DISTCA_ASSIGN_OR_RETURN(lhs, expr) \
  DISTCA_ASSIGN_OR_RETURN_IMPL_(DISTCA_CONCAT_(distca_res_, __LINE__), lhs, expr)
#define DISTCA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
