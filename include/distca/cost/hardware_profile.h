// A hardware profile: what `distca profile --hardware-out FILE` measured on one machine, in the
// form the simulator reads (`distca simulate --hardware FILE`, SimOptions::hardware_profile).
// Format: docs/simulation-model.md, section "Hardware profile". Three parts:
//   - the linear layers' GEMMs at one model's shapes, forward and both backward products, each
//     timed with one rank computing alone and with every rank of the run computing at once;
//   - forward and backward core attention over a (q_len, kv_len) grid;
//   - optionally (files written before it lack it), the element-wise work between the GEMMs
//     (RMSNorm, RoPE, SwiGLU, residual adds, the loss) per token and the optimizer step per
//     parameter, alone and concurrent like the GEMMs;
//   - under mpirun (ranks > 1): latency and bandwidth of all-to-all and point-to-point
//     exchanges through the project's Communicator, measured while every rank exchanges, and
//     optionally (files written before it lack it) of tensor parallelism's collectives: the
//     model's row all-gather and reduce-scatter through a TP group of two ranks, as the
//     trainer builds and times it.
//
// Units: seconds, bytes, FLOPs. Every rate is per rank (one process with threads_per_rank
// compute threads): the simulator multiplies by a unit's GPUs (gpus_per_node), as it does with
// a preset's per-GPU figures.
//
// Thread safety: plain data; the parsed profile is immutable once loaded and may be shared.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/cost/profiled.h"

namespace distca {

inline constexpr int kHardwareProfileVersion = 1;
inline constexpr const char* kHardwareProfileFormat = "distca-hardware-profile";
// Bounds of a loaded profile (beyond them the file is broken or hostile, and derived rates
// could overflow): counts and shapes, link figures.
inline constexpr int64_t kMaxProfileCount = 65536;          // cores, ranks, threads_per_rank
inline constexpr int64_t kMaxProfileDim = int64_t{1} << 24;  // a model dimension or token count
inline constexpr int64_t kMaxLinkBytes = int64_t{1} << 40;   // a link point's message size
inline constexpr size_t kMaxLinkPoints = 64;
inline constexpr double kMaxLinkLatency = 1.0;               // seconds per message
inline constexpr double kMinLinkBandwidth = 1.0;             // bytes/s
inline constexpr double kMaxLinkBandwidth = 1e15;
// The TP group size the profile's links.tp_collective was measured with.
inline constexpr int64_t kTpProfileGroup = 2;

// Which product of a linear layer y (n, out) = x (n, in) w^T, as model/layers.cpp calls them:
//   forward          y  (n, out)  = x (n, in) w^T        m = n,   n = out, k = in   (NT)
//   backward_data    dx (n, in)   = dy (n, out) w        m = n,   n = in,  k = out  (NN)
//   backward_weight  dw (out, in) = dy^T x               m = out, n = in,  k = n    (TN)
enum class GemmPass { kForward, kBackwardData, kBackwardWeight };
const char* gemm_pass_name(GemmPass pass);  // "forward" | "backward_data" | "backward_weight"

// The linear layers of one transformer layer plus the LM head, in this order.
inline constexpr const char* kProfileLayers[] = {"wq", "wk", "wv", "wo", "w1", "w3", "w2", "lm_head"};
inline constexpr size_t kProfileLayerCount = 8;

// The shapes the GEMMs were measured at: a Llama layer of this width (model/llama.h) on
// `tokens` rows.
struct ProfileShape {
  int64_t hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t tokens = 0;
  // (in, out) of linear layer `layer` (one of kProfileLayers).
  std::pair<int64_t, int64_t> in_out(const std::string& layer) const;
  // Every field in 1..kMaxProfileDim, n_kv_heads dividing n_heads, n_heads x head_dim at most
  // kMaxProfileDim; `prefix` starts the message ("profile.json: model.ffn must be ...").
  Status validate(const std::string& prefix) const;
};

struct GemmRecord {
  std::string layer;  // one of kProfileLayers
  GemmPass pass = GemmPass::kForward;
  int64_t m = 0, n = 0, k = 0;    // row-major C (m, n) = op(A) (m, k) op(B) (k, n)
  double seconds_alone = 0;       // median; this rank computing, the others waiting
  double seconds_concurrent = 0;  // every rank computing the same product at once: the slowest rank's median
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// The 24 products a profile holds, in file order (kProfileLayers x forward, backward_data,
// backward_weight), with their (m, n, k) at `shape` and zero seconds.
std::vector<GemmRecord> profile_gemm_list(const ProfileShape& shape);

// The TP peers' wait (JSON links.tp_wait): the TP ranks do the same work between two
// collectives, not in the same time, so the first to arrive waits for the other. A point is
// measured on a decoder layer's TP forward and backward (train/profile.cpp): per collective,
// `compute_seconds` of compute before it and `seconds` spent in it beyond what
// links.tp_collective charges for its bytes (the wait), each the mean over the grouped ranks.
// seconds_per_compute_second: the least-squares slope through the origin of seconds on
// compute_seconds over `points` (clamped to [0, kMaxTpWaitSlope]): the wait one collective
// adds per second of compute since the rank's previous collective.
inline constexpr double kMaxTpWaitSlope = 1.0;
inline constexpr size_t kMaxTpWaitPoints = 16;
struct TpWaitPoint {
  double compute_seconds = 0;
  double seconds = 0;
};
struct TpWaitProfile {
  double seconds_per_compute_second = 0;
  std::vector<TpWaitPoint> points;  // strictly increasing compute_seconds, at least 2
};
// The fit described above; points as TpWaitProfile::points.
TpWaitProfile fit_tp_wait(std::vector<TpWaitPoint> points);

// One exchange size: `bytes` per message (all-to-all: to each other rank, ranks - 1
// messages per rank; p2p: to the one peer), and its seconds: per repeat the slowest rank's
// time of the whole exchange, then the median over repeats.
struct LinkPoint {
  int64_t bytes = 0;
  double seconds = 0;
};
// The rate of a link fit comes from the sizes of at least its largest / kLinkRateSizes.
inline constexpr int64_t kLinkRateSizes = 64;
// A fit seconds = latency_seconds + bytes_on_wire / bytes_per_second over `points`, where
// bytes_on_wire is what one rank sends to other ranks: (ranks - 1) x bytes for all-to-all,
// bytes for p2p. bytes_per_second: plain least squares of seconds on wire bytes over the
// points of the largest sizes (bytes >= the largest / kLinkRateSizes; all points when fewer than
// two are), since a link may pass a small message at a burst's speed (tbf's bucket, a queue)
// and the model prices megabytes; latency_seconds: the smallest size's seconds less its wire
// bytes at that rate, at least 0.
struct LinkProfile {
  double latency_seconds = 0;   // per exchange: one message for p2p, ranks - 1 messages per
                                // rank for all-to-all
  double bytes_per_second = 0;  // per rank
  std::vector<LinkPoint> points;  // strictly increasing bytes
};
// The fit described above (points must hold at least one point with bytes > 0). `wire_factor`
// is ranks - 1 for all-to-all, 1 for p2p.
LinkProfile fit_link(std::vector<LinkPoint> points, double wire_factor);

// Seconds of one element-wise figure (model/profile_elementwise.h says what each holds):
// rank 0 alone and every rank at once (the slowest rank's), as GemmRecord's.
inline constexpr double kMaxElementwiseSeconds = 1.0;  // per token or per parameter
struct ElementwiseTerm {
  double alone = 0;
  double concurrent = 0;
  double get(bool concurrent_figure) const { return concurrent_figure ? concurrent : alone; }
};
// JSON "elementwise": {"<name>_seconds_per_token": {"alone": s, "concurrent": s}, ...,
// "optimizer_seconds_per_param": {...}}; every figure finite, in [0, kMaxElementwiseSeconds].
struct ElementwiseProfile {
  ElementwiseTerm layer_forward;   // per token, one layer's forward (norms, RoPE, SwiGLU, adds)
  ElementwiseTerm layer_backward;  // per token, one layer's backward
  ElementwiseTerm loss_forward;    // per token, the final norm and cross-entropy forward
  ElementwiseTerm loss_backward;   // per token, their backward
  ElementwiseTerm optimizer;       // per parameter, gradient clipping and the AdamW step
};

// The CPU a transfer takes from the compute running beside it (JSON links.comm_cpu, optional;
// only with ranks > 1): seconds of compute lost per byte a rank sends or receives while it
// computes (train/profile.cpp measure_comm_cpu says how), and the bytes per rank the
// measurement moved.
inline constexpr double kMaxCommCpuSecondsPerByte = 1e-6;  // 1 s per MB: far beyond any host
struct CommCpuProfile {
  double seconds_per_byte = 0;
  int64_t bytes = 0;
};

struct HardwareProfile {
  // The machine: CPU model, its online cores, processes that ran the profile at
  // once (mpirun -np), OpenMP compute threads per rank, OpenBLAS's kernel family.
  std::string cpu;
  int64_t cores = 1;
  int64_t ranks = 1;
  int64_t threads_per_rank = 1;
  std::string blas;
  // How the other ranks waited while rank 0 timed the alone figures (JSON machine.alone_waiters,
  // optional: "sleep" | "spin"). true ("sleep"): they slept in a barrier that polls every few
  // hundred microseconds, so with ranks > cores the alone figures are one rank on a core of
  // its own. false ("spin", and files written before the field): they spun in the
  // communicator's barrier, taking cores whenever the scheduler let them.
  bool alone_waiters_sleep = false;
  // The CPU quota every rank ran under, in cores (JSON machine.cpu_quota, optional: 0, or
  // absent, when some rank had none): the CFS quota over period of the rank's cgroup, the
  // least along its path (scripts/rank-cap.sh's --cpus). A capped rank computes at its quota
  // whether the others compute or wait, as a device does (docs/simulation-model.md,
  // "Processor sharing").
  double cpu_quota = 0;
  ProfileShape shape;
  // Every (layer, pass) of kProfileLayers x GemmPass exactly once, shapes from `shape`.
  std::vector<GemmRecord> gemms;
  // Forward and backward seconds of one task on the same grid and heads (backward also holds
  // the forward's recomputation the kernel does, as attention_backward runs it).
  CostTable attention_forward;
  CostTable attention_backward;
  bool attention_concurrent = false;  // measured with every rank running the same point
  // Absent in files written before it: the simulator then adds no element-wise work.
  std::optional<ElementwiseProfile> elementwise;
  std::optional<LinkProfile> all_to_all;  // present exactly when ranks > 1
  std::optional<LinkProfile> p2p;
  // Absent in files written before it (and with one rank): the simulator then charges
  // transfers no CPU.
  std::optional<CommCpuProfile> comm_cpu;
  // JSON links.tp_collective, optional (only when ranks > 1; absent in files written before
  // it, and then the simulator prices a TP collective on the all-to-all fit): one TP
  // collective - model::tp_all_gather_rows or tp_reduce_scatter_rows of `bytes / 4` floats
  // per rank - through a comm::GroupCommunicator of kTpProfileGroup consecutive ranks (TP
  // innermost, every group at once) right after a layer's product, as the trainer runs it:
  // the seconds its TimedCommunicator counts (the group's messages, the progress thread's
  // wake-ups, the receive buffer's first touch, the wait for a peer that computed the same
  // product). Point bytes: what one rank sends its peer; seconds: the mean over the grouped
  // ranks of each rank's mean over repeats (the trainer pays the slow tail too). Fit with wire
  // factor 1.
  std::optional<LinkProfile> tp_collective;
  // JSON links.tp_wait, optional (absent in files written before it: the simulator then
  // charges no wait beyond tp_collective's; written with tp_collective, refused without it).
  std::optional<TpWaitProfile> tp_wait;

  // The record of (layer, pass); precondition: validate() passed.
  const GemmRecord& gemm(const std::string& layer, GemmPass pass) const;
  // FLOP/s of (layer, pass): concurrent or alone.
  double gemm_rate(const std::string& layer, GemmPass pass, bool concurrent) const;
  // Forward + backward seconds per grid point: the table the planner and simulator read.
  CostTable attention_total() const;
  // Median over grid points of backward / forward seconds.
  double attention_backward_ratio() const;
  // Every field's range and the consistency rules above; `source` prefixes the message,
  // which names the field ("profile.json: gemm[3].seconds_alone must be ...").
  Status validate(const std::string& source) const;
};

nlohmann::json to_json(const HardwareProfile& profile);
// Refuses (one line naming `source` and the field): a "format" other than
// kHardwareProfileFormat, a "version" other than kHardwareProfileVersion, a missing or wrongly
// typed field, a number out of range or not finite, and whatever validate refuses.
Result<HardwareProfile> hardware_profile_from_json(const nlohmann::json& j, const std::string& source);
// Reads and checks a profile file (core/io.h read_json_file: regular file, bounded size).
Result<HardwareProfile> load_hardware_profile(const std::string& path);

// The cluster figures of a profile's machine for the simulator (`simulate --hardware FILE`):
// one rank per node (a unit is one rank), local-cpu's memory, the profile's best GEMM rate as
// the peak (shown only: the profile's own rates drive the linear layers) and its all-to-all
// link; named "profile <path>". Precondition: profile.validate() passed.
HardwareSpec profile_hardware_spec(const HardwareProfile& profile, const std::string& path);

// `--hardware NAME_OR_FILE` of `distca simulate` (and Python's simulate(hardware=...)): a
// preset (core/specs.h), else a hardware profile file. `profile` is null for a preset. Errors
// (one line, prefixed "--hardware: "): kInvalidArgument when the name is neither a preset nor a
// readable regular file, or what load_hardware_profile refuses.
struct ResolvedHardware {
  HardwareSpec spec;
  std::shared_ptr<const HardwareProfile> profile;
};
Result<ResolvedHardware> resolve_hardware(const std::string& name_or_path);

}  // namespace distca
