// Length files (--dist file:PATH): the reader takes a path, so each input is written to one
// scratch file and read through LengthDistribution::create, the entry point the CLI uses. A
// distribution that loads must draw positive lengths that are multiples of 16.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "distca/core/rng.h"
#include "distca/data/workload.h"
#include "fuzz_check.h"

namespace {

const std::string& scratch_path() {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/distca-fuzz-lengths." +
           std::to_string(getpid());
  }();
  return path;
}

void write_scratch(const uint8_t* data, size_t size) {
  const int fd = open(scratch_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  FUZZ_CHECK(fd >= 0);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    FUZZ_CHECK(n > 0);
    done += static_cast<size_t>(n);
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit([] { unlink(scratch_path().c_str()); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_scratch(data, size);
  distca::WorkloadOptions options;
  options.dist = "file:" + scratch_path();
  options.ranks = 2;
  options.tokens_per_rank = 4096;
  options.max_doc_len = 2048;
  auto d = distca::LengthDistribution::create(options);
  if (!d.ok()) return 0;
  distca::Rng rng(size);
  for (int i = 0; i < 16; ++i) {
    FUZZ_CHECK(d->sample_base(rng) > 0);
    const int64_t len = d->sample(rng);
    FUZZ_CHECK(len > 0 && len % distca::kLengthQuantum == 0 && len <= options.max_doc_len);
  }
  return 0;
}
