// Batch JSON (--batch FILE): text -> parse_json_text -> batch_from_json. A batch that loads
// must survive its own round trip.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/data/batch.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto j = distca::parse_json_text(text, "--batch fuzz");
  if (!j.ok()) return 0;
  auto b = distca::batch_from_json(*j);
  if (!b.ok()) return 0;
  FUZZ_CHECK(b->validate().ok());
  auto again = distca::batch_from_json(distca::batch_to_json(*b));
  FUZZ_CHECK(again.ok() && *again == *b);
  b->num_documents();
  for (int64_t r = 0; r < b->ranks; ++r) b->rank_tokens(r);
  return 0;
}
