// .npy files (--q, --k, ... of `distca attention`): bytes -> parse_npy. An array that loads
// must hold exactly its shape's element count and survive its own round trip.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "distca/core/npy.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto a = distca::parse_npy(std::string_view(reinterpret_cast<const char*>(data), size), "--q fuzz");
  if (!a.ok()) return 0;
  const int64_t n = a->size();
  FUZZ_CHECK(n >= 0);
  if (a->dtype == distca::NpyDtype::kFloat32) {
    FUZZ_CHECK(static_cast<int64_t>(a->f32.size()) == n && a->i32.empty());
    auto b = distca::parse_npy(distca::npy_bytes(a->f32.data(), a->shape), "again");
    FUZZ_CHECK(b.ok() && b->shape == a->shape && b->f32.size() == a->f32.size());
  } else {
    FUZZ_CHECK(static_cast<int64_t>(a->i32.size()) == n && a->f32.empty());
    auto b = distca::parse_npy(distca::npy_bytes(a->i32.data(), a->shape), "again");
    FUZZ_CHECK(b.ok() && b->shape == a->shape && b->i32 == a->i32);
  }
  return 0;
}
