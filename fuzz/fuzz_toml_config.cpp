// TOML configs (train --config FILE): text -> apply_toml_text -> validate -> model_spec.
// A config that validates must give a valid model within the documented ranges
// (check_model_ranges) and a fingerprint.
#include <cstddef>
#include <cstdint>
#include <string>

#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  distca::train::TrainConfig config;
  if (!distca::train::apply_toml_text(text, "fuzz.toml", config).ok()) return 0;
  // Output paths are the fuzzer's choice: keep validation from ever creating them.
  if (!config.metrics.empty()) config.metrics = "/proc/distca-fuzz/metrics.jsonl";
  if (!config.checkpoint_dir.empty()) config.checkpoint_dir = "/proc/distca-fuzz/ckpt";
  auto spec = config.model_spec();
  if (!config.validate().ok() || !spec.ok()) return 0;
  FUZZ_CHECK(!distca::train::fingerprint(config, *spec).empty());
  FUZZ_CHECK(distca::train::check_model_ranges(*spec).ok());
  config.text_dir();
  return 0;
}
