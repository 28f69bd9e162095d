// NumPy .npy files (format versions 1.0, 2.0 and 3.0), so users can feed the kernels from
// numpy or PyTorch (`np.save`, `torch.Tensor.numpy()`).
//
// Supported: little-endian float32 ('<f4') and int32 ('<i4'), C order. Anything else (other
// dtypes, big-endian, Fortran order, object arrays, a truncated or oversized payload, a
// malformed header) is refused with one line naming the input. The parser never trusts the
// header: every length is bounds-checked, the element count must match the payload exactly.
// Writing produces version 1.0 headers padded to 64 bytes, as numpy does.
//
// Thread safety: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "distca/core/status.h"

namespace distca {

enum class NpyDtype { kFloat32, kInt32 };
const char* npy_dtype_name(NpyDtype dtype);  // "float32" / "int32"

struct NpyArray {
  NpyDtype dtype = NpyDtype::kFloat32;
  std::vector<int64_t> shape;  // () for a scalar (one element)
  std::vector<float> f32;      // the data when dtype == kFloat32 (C order)
  std::vector<int32_t> i32;    // the data when dtype == kInt32

  int64_t size() const;  // product of shape (1 for a scalar)
};

// Parses the bytes of a .npy file; `name` (a file or flag) prefixes the one-line error.
Result<NpyArray> parse_npy(std::string_view bytes, const std::string& name);
Result<NpyArray> read_npy(const std::string& path);

// The bytes of a .npy file holding `data` with `shape` (size = product of shape).
std::string npy_bytes(const float* data, const std::vector<int64_t>& shape);
std::string npy_bytes(const int32_t* data, const std::vector<int64_t>& shape);
// Atomic writes (core/io.h write_file_atomic).
Status write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
Status write_npy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);

}  // namespace distca
