// The options every entry point shares (distca plan, simulate, bench train, the sweeps;
// Python's plan and simulate), parsed and loaded once, with the CLI flag's name in the message.
// Thread safety: pure functions (the loader reads the file it is given).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "distca/core/status.h"
#include "distca/cost/profiled.h"

namespace distca {

// `--dtype`: "bf16" -> 2 bytes, "fp32" -> 4; anything else invalid_argument "--dtype: expected
// bf16 or fp32, got '<text>'".
Result<int64_t> dtype_bytes_of(const std::string& dtype);

// `--cost-table FILE`: a path ending in ".csv" (any case) read as profiled.h's CSV format,
// anything else as the JSON written by `distca profile`. Errors name the file and the field,
// prefixed "--cost-table: " (the status code kept: a file that cannot be read is an I/O
// error, a malformed one invalid input).
Result<std::unique_ptr<ProfiledCostModel>> load_cost_table_option(const std::string& path);

}  // namespace distca
