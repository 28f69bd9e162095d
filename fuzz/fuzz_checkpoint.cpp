// Checkpoints (train --resume FILE), read side. A checksum guards the whole file, so raw
// mutations rarely get past it: inputs whose first byte is odd are wrapped as magic + bytes +
// their FNV-1a checksum, which lets the fuzzer reach the field parser. A checkpoint that
// parses must hold three equal-length arrays and serialize back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "distca/train/checkpoint.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes;
  if (size > 0 && (data[0] & 1) != 0) {
    bytes.assign("DCACKPT\n");
    bytes.append(reinterpret_cast<const char*>(data) + 1, size - 1);
    const uint64_t h = distca::train::fnv1a64(bytes.data(), bytes.size());
    char tail[8];
    std::memcpy(tail, &h, 8);
    bytes.append(tail, 8);
  } else {
    bytes.assign(reinterpret_cast<const char*>(data), size);
  }
  auto c = distca::train::parse_checkpoint(bytes, "--resume fuzz");
  if (!c.ok()) return 0;
  FUZZ_CHECK(c->params.size() == c->adam_m.size() && c->params.size() == c->adam_v.size());
  FUZZ_CHECK(distca::train::serialize_checkpoint(*c) == bytes);
  return 0;
}
