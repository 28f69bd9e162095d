// Hardware profiles (simulate --hardware FILE): text -> parse_json_text ->
// hardware_profile_from_json. A profile that loads must round-trip, give positive finite GEMM
// rates, and build an attention table whose predictions are positive and finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "distca/core/io.h"
#include "distca/cost/hardware_profile.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto j = distca::parse_json_text(text, "profile.json");
  if (!j.ok()) return 0;
  auto p = distca::hardware_profile_from_json(*j, "profile.json");
  if (!p.ok()) return 0;
  auto again = distca::hardware_profile_from_json(distca::to_json(*p), "again");
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(distca::to_json(*again) == distca::to_json(*p));
  for (const char* layer : distca::kProfileLayers) {
    for (auto pass : {distca::GemmPass::kForward, distca::GemmPass::kBackwardData, distca::GemmPass::kBackwardWeight}) {
      for (bool concurrent : {false, true}) {
        const double r = p->gemm_rate(layer, pass, concurrent);
        FUZZ_CHECK(std::isfinite(r) && r > 0);
      }
    }
  }
  const distca::ProfiledCostModel model(p->attention_total());
  const auto& tb = model.table();
  for (int64_t q : {int64_t{1}, tb.q_lens.front(), tb.q_lens.back(), tb.q_lens.back() + 1}) {
    for (int64_t kv : {tb.kv_lens.front(), tb.kv_lens.back(), tb.kv_lens.back() * 2}) {
      if (q > kv) continue;
      const double c = model.task_cost(q, kv);
      FUZZ_CHECK(std::isfinite(c) && c > 0);
    }
  }
  FUZZ_CHECK(std::isfinite(p->attention_backward_ratio()) && p->attention_backward_ratio() > 0);
  if (p->all_to_all) {
    const distca::LinkProfile l = distca::fit_link(p->all_to_all->points, static_cast<double>(p->ranks - 1));
    FUZZ_CHECK(std::isfinite(l.latency_seconds) && l.latency_seconds >= 0 && l.bytes_per_second >= 1);
  }
  if (p->tp_collective) {
    FUZZ_CHECK(p->ranks >= distca::kTpProfileGroup);
    const distca::LinkProfile l = distca::fit_link(p->tp_collective->points, 1.0);
    FUZZ_CHECK(std::isfinite(l.latency_seconds) && l.latency_seconds >= 0 && l.bytes_per_second >= 1);
  }
  return 0;
}
