// Which elements of a buffer's rows a movement table reads or writes (row_tables.h). Kept
// apart, and C++17, so the device code (nvcc) can include it without the plan's headers.
#pragma once

#include <cstdint>

namespace distca::runtime::device {

// Row r's column c is element r * row_stride + col + c * col_stride.
struct Window {
  int64_t row_stride = 0;  // elements between rows
  int64_t col = 0;         // first column's element offset within the row
  int64_t col_stride = 1;  // elements between columns
};

}  // namespace distca::runtime::device
