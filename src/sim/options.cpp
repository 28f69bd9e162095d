// Strategy parsing, cluster and option validation, micro-batch drawing (simulator.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "distca/plan/auto_tolerance.h"
#include "distca/cost/step_flops.h"
#include "distca/sim/simulator.h"

namespace distca::sim {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Parses a positive decimal integer; false on anything else.
bool parse_positive(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  auto [p, ec] = std::from_chars(b, e, out);
  return ec == std::errc() && p == e && out > 0;
}

}  // namespace

const char* cad_mode_name(CadMode mode) {
  switch (mode) {
    case CadMode::kPingPong: return "pingpong";
    case CadMode::kSingleStream: return "single-stream";
    case CadMode::kSignal: return "signal";
  }
  return "?";
}

std::string Strategy::name() const {
  switch (kind) {
    case StrategyKind::kColocated: return "colocated";
    case StrategyKind::kWlb: return cp_degree > 0 ? "wlb:" + std::to_string(cp_degree) : "wlb";
    case StrategyKind::kPerCp: return "percp:" + std::to_string(cp_degree);
    case StrategyKind::kCad:
      return cad_mode == CadMode::kPingPong ? "cad" : std::string("cad:") + cad_mode_name(cad_mode);
  }
  return "?";
}

Result<Strategy> parse_strategy(const std::string& text) {
  const std::string kForms =
      " (expected colocated, wlb, wlb:C, percp:C, cad, cad:pingpong, cad:single-stream or cad:signal)";
  Strategy s;
  const auto colon = text.find(':');
  const std::string head = text.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  const bool has_arg = colon != std::string::npos;
  if (head == "colocated" && !has_arg) {
    s.kind = StrategyKind::kColocated;
    return s;
  }
  if (head == "wlb" || head == "percp") {
    s.kind = head == "wlb" ? StrategyKind::kWlb : StrategyKind::kPerCp;
    if (!has_arg) {
      if (head == "percp") return Status::invalid_argument("--strategy percp needs a CP degree: percp:C");
      return s;
    }
    if (!parse_positive(arg, s.cp_degree)) {
      return Status::invalid_argument("--strategy " + text + ": the CP degree must be a positive integer");
    }
    return s;
  }
  if (head == "cad") {
    s.kind = StrategyKind::kCad;
    if (!has_arg || arg == "pingpong") return s;
    if (arg == "single-stream") {
      s.cad_mode = CadMode::kSingleStream;
      return s;
    }
    if (arg == "signal") {
      s.cad_mode = CadMode::kSignal;
      return s;
    }
  }
  return Status::invalid_argument("--strategy: unknown strategy '" + text + "'" + kForms);
}

Status ClusterSpec::validate() const {
  if (gpus <= 0) return Status::invalid_argument("--gpus must be positive (got " + std::to_string(gpus) + ")");
  if (gpus_per_node <= 0) {
    return Status::invalid_argument("--gpus-per-node must be positive (got " + std::to_string(gpus_per_node) + ")");
  }
  if (gpus % gpus_per_node != 0) {
    return Status::invalid_argument("--gpus " + std::to_string(gpus) + " is not a multiple of the node size " +
                                    std::to_string(gpus_per_node) + " (--gpus-per-node)");
  }
  if (pp <= 0) return Status::invalid_argument("--pp must be positive (got " + std::to_string(pp) + ")");
  if (units() % pp != 0) {
    return Status::invalid_argument("--pp " + std::to_string(pp) + " does not divide the " + std::to_string(units()) +
                                    " nodes (--gpus / --gpus-per-node)");
  }
  return hw.validate().with_context("hardware");
}

Result<ClusterSpec> make_cluster(const std::string& preset, int64_t gpus) {
  DISTCA_ASSIGN_OR_RETURN(HardwareSpec hw, hardware_preset(preset));
  ClusterSpec c;
  c.hw = hw;
  c.gpus = gpus;
  c.gpus_per_node = hw.gpus_per_node;
  c.pp = 1;
  DISTCA_RETURN_IF_ERROR(c.validate());
  return c;
}

FrameworkMemory FrameworkMemory::gpu() {
  // Sources and reasons: docs/simulation-model.md, "Framework memory".
  FrameworkMemory f;
  f.context_bytes = 768.0 * 1024 * 1024;     // the CUDA context with the libraries loaded
  f.comm_buffer_bytes = 4.0 * 1024 * 1024;   // NCCL_BUFFSIZE's default
  f.ring_channels = 16;
  f.p2p_channels = 2;
  f.fragmentation = 0.15;
  return f;
}

ChunkingOptions wlb_chunking(const SimOptions& options, int64_t cp) {
  ChunkingOptions c;
  c.cap = options.wlb_mem_cap;
  c.cp = cp;
  c.cp_threshold = options.wlb_cp_threshold;
  c.tile_rows = options.attention_tile;
  c.linear_per_token =
      training_step_flops(options.model, 1, 0).linear / training_step_flops(options.model, 0, 1).attention;
  return c;
}

Status SimOptions::validate() const {
  DISTCA_RETURN_IF_ERROR(model.validate().with_context("--model"));
  DISTCA_RETURN_IF_ERROR(cluster.validate());
  if (cluster.pp > model.n_layers) {
    return Status::invalid_argument("--pp " + std::to_string(cluster.pp) + " exceeds the model's " +
                                    std::to_string(model.n_layers) + " layers");
  }
  if (!(mfu > 0 && mfu <= 1)) return Status::invalid_argument("--mfu must be in (0, 1] (got " + num(mfu) + ")");
  if (!(attention_efficiency > 0 && attention_efficiency <= 1)) {
    return Status::invalid_argument("--attention-efficiency must be in (0, 1] (got " + num(attention_efficiency) + ")");
  }
  if (attention_tile < 1) {
    return Status::invalid_argument("--attention-tile must be positive (got " + std::to_string(attention_tile) + ")");
  }
  if (!(tolerance >= 0 && tolerance <= 1)) {
    return Status::invalid_argument("--tolerance must be in [0, 1] (got " + num(tolerance) + ")");
  }
  if (!(wlb_mem_cap >= 1 && std::isfinite(wlb_mem_cap))) {
    return Status::invalid_argument("--wlb-mem-cap must be >= 1 (got " + num(wlb_mem_cap) + ")");
  }
  if (wlb_cp_threshold < 0) {
    return Status::invalid_argument("--cp-threshold must be >= 0 (got " + std::to_string(wlb_cp_threshold) + ")");
  }
  const FrameworkMemory& f = framework;
  if (!(f.context_bytes >= 0 && std::isfinite(f.context_bytes) && f.comm_buffer_bytes >= 0 &&
        std::isfinite(f.comm_buffer_bytes) && f.ring_channels >= 0 && f.p2p_channels >= 0 &&
        f.fragmentation >= 0 && f.fragmentation < 1)) {
    return Status::invalid_argument("framework memory: every figure must be finite and >= 0, fragmentation < 1");
  }
  if (dtype_bytes != 2 && dtype_bytes != 4) {
    return Status::invalid_argument("--dtype: activation bytes must be 2 or 4 (got " + std::to_string(dtype_bytes) + ")");
  }
  if (tolerance_auto && (hardware_profile == nullptr || strategy.kind != StrategyKind::kCad ||
                         !profile_link_rates(*hardware_profile, 1))) {
    return Status::invalid_argument("--tolerance auto needs cad with a hardware profile with link figures");
  }
  if (!topology.empty() && static_cast<int64_t>(topology.host.size()) != cluster.units()) {
    return Status::invalid_argument("--ranks-per-host: the topology names " + std::to_string(topology.host.size()) +
                                    " units, the cluster has " + std::to_string(cluster.units()));
  }
  DISTCA_RETURN_IF_ERROR(topology.validate(static_cast<int64_t>(topology.host.size())));
  const int64_t ups = cluster.units_per_stage();
  if (strategy.kind == StrategyKind::kPerCp && strategy.cp_degree < 1) {
    return Status::invalid_argument("--strategy percp:C needs C >= 1");
  }
  if ((strategy.kind == StrategyKind::kPerCp || strategy.kind == StrategyKind::kWlb) && strategy.cp_degree > 0 &&
      ups % strategy.cp_degree != 0) {
    return Status::invalid_argument("--strategy " + strategy.name() + ": CP degree " +
                                    std::to_string(strategy.cp_degree) + " does not divide the " +
                                    std::to_string(ups) + " nodes of a pipeline stage");
  }
  if (attention_table != nullptr) {
    DISTCA_RETURN_IF_ERROR(attention_table->table().validate("--cost-table"));
  }
  if (hardware_profile != nullptr) DISTCA_RETURN_IF_ERROR(hardware_profile->validate("--hardware"));
  return Status::ok_status();
}

Status validate_draw(const WorkloadOptions& options, const ClusterSpec& cluster, int64_t microbatches) {
  DISTCA_RETURN_IF_ERROR(cluster.validate());
  if (microbatches < 1 || microbatches > 10000) {
    return Status::invalid_argument("--microbatches must be in 1..10000 (got " + std::to_string(microbatches) + ")");
  }
  // The data layer's limits (data/workload.h), checked here so that the flag the user typed is
  // the one named.
  constexpr int64_t kMaxRanks = int64_t{1} << 24;
  constexpr int64_t kMaxBatchTokens = int64_t{1} << 40;
  const int64_t ups = cluster.units_per_stage();
  const std::string nodes = std::to_string(ups) + " nodes per pipeline stage (--gpus " + std::to_string(cluster.gpus) +
                            " / --gpus-per-node " + std::to_string(cluster.gpus_per_node) + " / --pp " +
                            std::to_string(cluster.pp) + ")";
  if (ups > kMaxRanks) return Status::invalid_argument("--gpus: " + nodes + " exceed the 16777216 the workload can draw");
  if (options.tokens_per_rank > 0 && options.tokens_per_rank > kMaxBatchTokens / ups) {
    return Status::invalid_argument("--gpus: " + nodes + " of --tokens-per-rank " +
                                    std::to_string(options.tokens_per_rank) + " exceed 2^40 tokens per micro-batch");
  }
  WorkloadOptions w = options;
  w.ranks = ups;
  w.batches = microbatches;
  return w.validate();
}

Result<std::vector<Batch>> draw_microbatches(WorkloadOptions options, const ClusterSpec& cluster,
                                             int64_t microbatches) {
  DISTCA_RETURN_IF_ERROR(validate_draw(options, cluster, microbatches));
  options.ranks = cluster.units_per_stage();
  options.batches = microbatches;
  return make_batches(options);
}

namespace {

// Measured on this code (peak RSS growth of simulate() over many units and pieces) and
// rounded up: about 600 B per piece for cad without PP (its plans; colocated under 200 B),
// 5 KB per unit and 1.7 KB per (unit, micro-batch) with PP (CAD frees an op's exchanges after
// its last tick, and keeps its message pairs sparse); a kept event and its trace text about
// 0.37 KB.
constexpr double kBytesPerPiece = 1024;
constexpr double kBytesPerUnit = 8192;
constexpr double kBytesPerUnitMicrobatch = 2048;
constexpr double kBytesPerDrawnPiece = 64;  // a Piece (32 B) and the drawing's document list
constexpr double kBytesPerEvent = 512;
// Processor sharing (sharing.h) keeps two passes of every unit's compute intervals, 16 bytes
// each, in vectors that may have grown to twice their size: at most one interval per event
// max_trace_events counts.
constexpr double kBytesPerSharedInterval = 64;
// Events of one unit per (micro-batch, layer of its stage): linear and attention forward and
// backward, dispatch/return exchanges and waits of each phase (14-19 seen); per unit and
// micro-batch: the PP sends and receives and the LM head; per unit: the gradient all-reduce.
constexpr int64_t kEventsPerLayerSlot = 32;
constexpr int64_t kEventsPerMicrobatch = 16;
constexpr int64_t kEventsPerUnit = 16;

}  // namespace

double estimate_draw_bytes(const ClusterSpec& cluster, int64_t tokens_per_unit, int64_t microbatches) {
  const double pieces_per_unit = static_cast<double>(std::max<int64_t>(tokens_per_unit, 0)) / kLengthQuantum + 1;
  return static_cast<double>(microbatches) * static_cast<double>(cluster.units_per_stage()) * pieces_per_unit *
         kBytesPerDrawnPiece;
}

int64_t max_trace_events(const SimOptions& options, int64_t microbatches) {
  const ClusterSpec& c = options.cluster;
  const int64_t pp = std::max<int64_t>(c.pp, 1);
  const int64_t stage_layers = (options.model.n_layers + pp - 1) / pp;  // the largest stage
  return c.units() * (microbatches * (stage_layers * kEventsPerLayerSlot + kEventsPerMicrobatch) + kEventsPerUnit);
}

double estimate_simulate_bytes(const SimOptions& options, const std::vector<Batch>& microbatches) {
  double pieces = 0;
  for (const Batch& b : microbatches) {
    for (const auto& rank : b.per_rank) pieces += static_cast<double>(rank.size());
  }
  const auto units = static_cast<double>(options.cluster.units());
  const auto m = static_cast<double>(microbatches.size());
  double bytes = pieces * kBytesPerPiece + units * (kBytesPerUnit + m * kBytesPerUnitMicrobatch);
  // The re-packing baselines lay one micro-batch out at a time: a piece becomes at most 2C
  // head-tail shards (and never more than its rows); wlb's search goes up to C = every unit,
  // and by its default threshold wlb shards a document of length L only when 2C < (L + 1) /
  // tile, which bounds its shards at any C. Cuts at the cap add at most one piece per unit.
  const Strategy& st = options.strategy;
  if (st.kind == StrategyKind::kWlb || st.kind == StrategyKind::kPerCp) {
    const int64_t c = st.cp_degree > 0 ? st.cp_degree : options.cluster.units_per_stage();
    const bool by_tile = st.kind == StrategyKind::kWlb && options.wlb_cp_threshold == 0;
    double most = 0;
    for (const Batch& b : microbatches) {
      double shards = static_cast<double>(b.ranks);
      for (const auto& rank : b.per_rank) {
        for (const Piece& p : rank) {
          int64_t n = std::min(p.len, 2 * c);
          if (by_tile) n = std::min(n, std::max<int64_t>(1, (p.doc_len + 1) / options.attention_tile));
          shards += static_cast<double>(n);
        }
      }
      most = std::max(most, shards);
    }
    bytes += most * kBytesPerPiece;
  }
  const auto events = static_cast<double>(max_trace_events(options, static_cast<int64_t>(microbatches.size())));
  if (options.record_events) bytes += events * kBytesPerEvent;
  if (options.hardware_profile != nullptr) bytes += events * kBytesPerSharedInterval;  // may share
  return bytes;
}

}  // namespace distca::sim
