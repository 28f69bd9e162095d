// CSV cost tables (--cost-table FILE.csv): text -> cost_table_from_csv. A table that loads must
// validate and build a model whose predictions are positive and finite on and off its grid.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "distca/cost/profiled.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto t = distca::cost_table_from_csv(text, "table.csv");
  if (!t.ok()) return 0;
  FUZZ_CHECK(t->validate("again").ok());
  FUZZ_CHECK(t->q_lens == t->kv_lens);
  const distca::ProfiledCostModel model(std::move(*t));
  const auto& tb = model.table();
  for (int64_t q : {int64_t{1}, tb.q_lens.front(), tb.q_lens.back(), tb.q_lens.back() + 1}) {
    for (int64_t kv : {tb.kv_lens.front(), (tb.kv_lens.front() + tb.kv_lens.back()) / 2, tb.kv_lens.back(),
                       tb.kv_lens.back() * 2}) {
      if (q > kv) continue;
      const double c = model.task_cost(q, kv);
      FUZZ_CHECK(std::isfinite(c) && c > 0);
    }
  }
  return 0;
}
