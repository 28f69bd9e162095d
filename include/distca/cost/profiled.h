// The profiled attention cost model: a table of measured forward+backward seconds over a grid
// of (q_len, kv_len) pairs (written by `distca profile`; format in docs/kernels.md, section
// "Cost table"), turned into a per-task time prediction as the paper's profiler does.
//
// Prediction for a task (q_len, kv_len), with F its forward+backward FLOPs (3.5 x the forward's
// 4 * head_dim * n_heads * pairs, for the table's head configuration):
//   - q_len == 0: 0.
//   - inside the grid: the measured throughput (F / seconds) at the four grid points that
//     bracket (q_len, kv_len) is interpolated bilinearly in (log2 q_len, log2 kv_len), and
//     time = F / throughput. A corner with q > kv (not measured under causal masking) takes
//     the throughput of the diagonal point (kv, kv) of its column.
//   - saturated region: where all four corners run at >= saturation_fraction of the peak
//     measured throughput, or beyond the largest grid lengths, time = F / peak (the paper's
//     "peak throughput times FLOPs").
//   - below the smallest grid length the nearest grid throughput is used (clamped).
// Throughput, not time, is interpolated because it varies slowly across the grid while time
// spans six orders of magnitude.
//
// Thread safety: immutable after construction; task_cost may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/status.h"
#include "distca/cost/cost_model.h"

namespace distca {

// What a loaded table may hold (CostTable::validate refuses anything outside, naming the
// field). A measured time is positive, finite, a normal double and within
// [kMinTaskSeconds, kMaxTaskSeconds]: a nanosecond is far below any real task's launch cost and
// a million seconds far above any task's run, so a value outside is a broken or hostile table
// (1e308 or a subnormal 1e-320 would overflow or vanish in the planner's sums). The other
// bounds keep every derived FLOP count and throughput finite.
inline constexpr int kCostTableVersion = 1;
inline constexpr double kMinTaskSeconds = 1e-9;
inline constexpr double kMaxTaskSeconds = 1e6;
inline constexpr int64_t kMaxCostTableHeads = 65536;     // n_heads, n_kv_heads
inline constexpr int64_t kMaxCostTableHeadDim = 65536;
inline constexpr int64_t kMaxCostTableLength = int64_t{1} << 40;  // a q_lens / kv_lens entry
inline constexpr size_t kMaxCostTableGrid = 1024;        // entries of q_lens and of kv_lens

// A cost table's free-form "hardware" description (a JSON object: cpu, threads, source). Held
// through a pointer so that this header, which most of the planner, simulator and trainer
// include, needs only <nlohmann/json_fwd.hpp>: nlohmann/json.hpp is among the costliest headers
// to compile (docs/development.md, "Building"). A value: copies are deep.
class HardwareNote {
 public:
  HardwareNote();  // an empty JSON object
  HardwareNote(const nlohmann::json& j);  // NOLINT(google-explicit-constructor): a JSON value
  HardwareNote(const HardwareNote& other);
  HardwareNote(HardwareNote&& other) noexcept;
  HardwareNote& operator=(const HardwareNote& other);
  HardwareNote& operator=(HardwareNote&& other) noexcept;
  HardwareNote& operator=(const nlohmann::json& j);
  ~HardwareNote();

  const nlohmann::json& json() const;
  nlohmann::json& json();
  nlohmann::json& operator[](const std::string& key);

 private:
  std::unique_ptr<nlohmann::json> json_;  // null only in a moved-from note, which reads as {}
};

struct CostTable {
  HardwareNote hardware;  // free-form description (cpu, threads)
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  std::vector<int64_t> q_lens;   // strictly increasing, positive
  std::vector<int64_t> kv_lens;  // strictly increasing, positive
  // seconds[i][j]: forward+backward time of one task (q_lens[i], kv_lens[j]); 0 (JSON null)
  // where q_lens[i] > kv_lens[j]. Every point with q <= kv is in [kMinTaskSeconds,
  // kMaxTaskSeconds].
  std::vector<std::vector<double>> seconds;
  double saturation_fraction = 0.9;

  // Forward+backward FLOPs of a bottom-right causal task under this head configuration.
  double task_flops(int64_t q_len, int64_t kv_len) const;
  // Checks the fields (names the offending one); `source` prefixes the message.
  Status validate(const std::string& source) const;
};

nlohmann::json to_json(const CostTable& table);
// The table's seconds as rows of q_lens, each over kv_lens; null where q_len > kv_len (the
// "seconds" array of to_json, and a hardware profile's attention grids).
nlohmann::json seconds_grid_json(const CostTable& table);
// `source` (a file name) names the input in error messages. Refuses (one line naming the file
// and the field): a "format" other than "distca-cost-table", a "version" other than
// kCostTableVersion, a field of the wrong JSON type, and whatever validate refuses.
Result<CostTable> cost_table_from_json(const nlohmann::json& j, const std::string& source);

class ProfiledCostModel final : public AttentionCostModel {
 public:
  // Precondition: table.validate("").ok().
  explicit ProfiledCostModel(CostTable table);
  double task_cost(int64_t q_len, int64_t kv_len) const override;  // seconds
  std::string unit() const override { return "seconds"; }
  double peak_flops() const { return peak_; }  // forward+backward FLOP/s, max over the grid
  const CostTable& table() const { return table_; }

 private:
  double throughput_at(size_t i, size_t j) const;  // grid point, diagonal-clamped
  CostTable table_;
  std::vector<std::vector<double>> tput_;  // FLOP/s at each grid point (0 where q > kv)
  double peak_ = 0;
};

// The CSV attention-time format of ../shared/data/attn-time-h100.csv (the public DistCA
// profiler's output): a header line "L,cp,tp,duration_per_doc", then one row per measurement:
// document length L (integer, 1..2^40), context- and tensor-parallel degrees cp and tp
// (integers, 1..65536) and the FORWARD time of one causal document of length L in
// milliseconds (finite, positive). (L, cp, tp) unique. The file does not carry its head
// configuration: it is the H100 file's, 64 query heads, 4 K/V heads, head_dim 128 (the
// kCsvTable* constants). Only the cp = 1, tp = 1 rows (one GPU, all heads) are used; there
// must be at least one.
// Extension to a cost table (docs/simulation-model.md, "CSV cost tables"):
//   - forward-only: seconds = forward x (1 + kAttentionBackwardFactor) (backward 2.5x), so the
//     simulator's forward share gives the measured forward back;
//   - diagonal-only: q_lens = kv_lens = the rows' L; a point q < kv takes the throughput of the
//     diagonal at the length whose causal pairs equal the task's (L_eq with L_eq (L_eq + 1) / 2
//     = pairs(q, kv)), interpolated in log2 L between the bracketing rows and clamped at the
//     ends: a task costs what a document of the same work costs.
inline constexpr int64_t kCsvTableHeads = 64;
inline constexpr int64_t kCsvTableKvHeads = 4;
inline constexpr int64_t kCsvTableHeadDim = 128;
// Refuses (one line naming `source`, the line number and the column): a missing or different
// header, a row without exactly four fields, a malformed or out-of-range number, a duplicate
// (L, cp, tp), no cp = 1, tp = 1 row.
Result<CostTable> cost_table_from_csv(const std::string& text, const std::string& source);

}  // namespace distca
