// Cost tables (--cost-table FILE): text -> parse_json_text -> cost_table_from_json. A table
// that loads must build a model whose predictions are positive and finite everywhere.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/cost/profiled.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto j = distca::parse_json_text(text, "table.json");
  if (!j.ok()) return 0;
  auto t = distca::cost_table_from_json(*j, "table.json");
  if (!t.ok()) return 0;
  auto again = distca::cost_table_from_json(distca::to_json(*t), "again");
  FUZZ_CHECK(again.ok());
  distca::ProfiledCostModel model(std::move(*t));
  const auto& tb = model.table();
  // Grid points, midpoints, below and beyond the grid.
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
