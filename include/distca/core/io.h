// File helpers with the guarantees the CLI promises: errors name the file, and writes are
// atomic (the content goes to a temporary file in the same directory, is flushed, then renamed
// over the target), so a reader never sees a half-written output and a failed run leaves no
// partial file behind.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/status.h"

namespace distca {

Result<std::string> read_file(const std::string& path);
Status write_file_atomic(const std::string& path, const std::string& content);
// Parses a whole file as JSON; a syntax error names the file and the byte offset.
Result<nlohmann::json> read_json_file(const std::string& path);

}  // namespace distca
