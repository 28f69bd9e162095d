// JSON inputs that name the offending field: parse_json_text (core/io.h) names the file and
// the byte of a syntax error, but a number out of double range (1e999) aborts nlohmann's DOM
// parser without any position. read_json_fields / parse_json_fields add the field's path
// ("per_rank[0][1].len", "batches[2].batch.ranks", "[7]" for an element of a top-level
// array) to any parse failure, found by a second, event-based pass over the text.
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/status.h"

namespace distca {

// The path of the value at which `text` stops parsing; "" when it parses, or when it fails
// outside any object or array.
std::string json_failure_path(const std::string& text);

// parse_json_text / read_json_file (regular files only, bounded) with the field appended to
// the message of a failure: "'b.json' holds a number out of range (...): field per_rank[0][0].len".
[[nodiscard]] Result<nlohmann::json> parse_json_fields(const std::string& text, const std::string& name);
[[nodiscard]] Result<nlohmann::json> read_json_fields(const std::string& path);

}  // namespace distca
