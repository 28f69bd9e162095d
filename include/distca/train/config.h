// TrainConfig: everything one `distca train` run needs, from flags, a TOML file (--config) or
// the embedded default (configs/default.toml writes it out). docs/training.md lists the keys.
//
// Sources, lowest priority first: the embedded default (TrainConfig{}), the TOML file, flags.
// TOML keys are the flag names with '_' for '-' (tokens_per_rank for --tokens-per-rank), plus
// an optional [model_overrides] table of ModelSpec fields (n_layers, hidden, n_heads,
// n_kv_heads, head_dim, ffn, vocab). Unknown keys and wrongly typed values are refused with one
// line naming the file and the key.
//
// Thread safety: plain values; the functions are pure apart from reading the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/plan/chunking.h"
#include "distca/runtime/overlap_mode.h"

namespace distca::train {

struct ModelOverrides {
  std::optional<int64_t> n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab;
};

enum class TrainMode {
  kCad,        // core attention disaggregated: planned every step, run by the runtime's runners
  kColocated,  // every rank serves its own attention (the colocated plan through the same runners)
  // WLB-LLM: each micro-batch's documents re-packed whole over the data-parallel ranks to
  // balance their work under a token cap (plan/chunking.h, wlb_repack); with cp > 1 the long
  // ones sharded head-tail over a CP group. Then served like colocated.
  kWlb,
  // Per-document context parallelism of every document over groups of cp ranks (THD style;
  // plan/chunking.h, percp_repack). Then served like colocated.
  kPerCp,
};
// "cad" | "colocated" | "wlb" | "percp"; the message names `flag` ("--mode must be cad,
// colocated, wlb or percp (got 'x')").
Result<TrainMode> parse_train_mode(const std::string& text, const std::string& flag = "--mode");
const char* train_mode_name(TrainMode mode);

inline constexpr double kDefaultWlbCap = 1.2;

struct TrainConfig {
  // Model: a preset (core/specs.h) and overrides of its fields. The default narrows `tiny` to
  // 2 layers of width 128: the 4-layer, 256-wide preset did not discover copying within 600
  // steps here (docs/training.md). Setting `model` (key or flag) drops the overrides of
  // lower-priority sources.
  std::string model = "tiny";
  ModelOverrides model_overrides{2, 128, 4, 2, 32, 256, std::nullopt};
  // Parallelism.
  int64_t ranks = 2;
  std::string backend = "local";  // local | mpi
  TrainMode mode = TrainMode::kCad;
  std::string scheduler = "cad";  // cad mode only: cad | cad-symmetric | percp:C
  double tolerance = 0.05;        // cad scheduler tolerance
  // --tolerance auto (TOML tolerance = "auto"): chosen for every micro-batch by
  // choose_tolerance (plan/auto_tolerance.h) from `hardware`, a `distca profile
  // --hardware-out` file with link figures. cad mode, cad or cad-symmetric, pp 1 only.
  bool tolerance_auto = false;
  // Also --mode wlb: the chunking's work from this profile (train/wlb_profile.h).
  std::string hardware;
  // The planner's topology (plan/topology.h; cad mode, pp 1): ranks_per_host N, or host_map
  // "0,0,1,1", or host_map "mpi" (MPI's shared-memory split, --backend mpi); none: no
  // topology. inter_host_price 0: the default price.
  int64_t ranks_per_host = 0;
  std::string host_map;
  int64_t inter_host_price = 0;
  // cad mode only: pingpong | single-stream | signal (runtime/pingpong.h); unset: pingpong.
  // Refused with --mode colocated, which has no exchange to overlap.
  std::optional<runtime::OverlapMode> overlap;
  // cad mode, ping-pong: K/V once per server across the nano-batch pair (docs/runtime.md, "K/V
  // once per server"): "on", "off", or "auto" (per micro-batch from the ping-pong timeline of
  // `hardware`'s link, plan/auto_tolerance.h kv_once_pays; on without `hardware` or under
  // --pp > 1). The same bits either way: only the bytes' timing changes.
  std::string kv_once = "on";
  // wlb and percp: context-parallel group size, dividing the data-parallel ranks (dp()); 1
  // (no CP) otherwise. percp needs cp >= 2.
  int64_t cp = 1;
  // wlb only: a rank holds at most wlb_cap x the mean tokens of a micro-batch (>= 1; unset: 1.2).
  std::optional<double> wlb_cap;
  // wlb with cp > 1 only: documents longer than this are sharded over a CP group (>= 1; unset:
  // the default rule, plan/chunking.h cp_shard_threshold).
  std::optional<int64_t> cp_threshold;
  // Pipeline parallelism: pp stages (ranks = dp x pp), each step micro_batches micro-batches
  // per data-parallel replica, in 1F1B order (plan/pipeline_schedule.h; cad runs its slots
  // as pooled ticks). pp > 1 needs micro_batches >= pp, pp <= the model's layers, and with
  // --mode cad pp dividing the layers. micro_batches > 1 with pp = 1 is gradient accumulation
  // (either mode).
  int64_t pp = 1;
  int64_t micro_batches = 1;
  // Tensor parallelism (model/tensor_parallel.h, docs/training.md): tp ranks share each layer,
  // Megatron-style with sequence parallelism; ranks = tp x pp x dp, TP innermost: world rank
  // = (stage * dp + replica) * tp + t. tp must divide the model's heads and KV heads and be
  // at most its feed-forward width and vocabulary.
  int64_t tp = 1;
  // With tp > 1: "on" overlaps each TP collective with its layer's products (Megatron-LM's TP
  // communication overlap; model/tensor_parallel.h, "Overlap"), "off" runs them blocking
  // between the products. The same bits either way.
  std::string tp_overlap = "on";
  // "on": each rank makes its plans on a background thread, up to one step ahead of the step
  // that runs them; "off": inline, when the step needs them. The same plans either way, so
  // the same bits (docs/training.md, "Planning ahead").
  std::string plan_ahead = "on";
  // Optimisation.
  int64_t steps = 500;
  double lr = 3e-3;        // peak learning rate
  double min_lr = 3e-4;    // cosine floor
  int64_t warmup = 20;     // warm-up steps (capped at steps)
  double weight_decay = 0.01;
  double clip = 1.0;       // global-norm clip; <= 0 disables
  uint64_t seed = 1;
  // Data: "copy" or "text:DIR".
  std::string data = "copy";
  // Copy task: tokens are drawn from [0, copy_vocab) (0: the model's vocabulary). A small
  // alphabet lets a small model discover copying (induction) within a few hundred steps;
  // the model still predicts over its whole vocabulary, so the loss starts near ln(vocab).
  int64_t copy_vocab = 32;
  int64_t tokens_per_rank = 256;    // multiple of 16
  // Skewed by default: the pretrain-like length distribution at 256 tokens per rank gives
  // mostly 16-token documents and now and then long ones (capped at 128), so some steps put
  // a long (quadratic) document on one rank and short ones on the other. Short documents are
  // what lets the model discover copying quickly.
  std::string dist = "pretrain";
  int64_t max_doc_len = 128;        // 0: no cap
  // Outputs.
  std::string checkpoint_dir;       // empty: no checkpoints
  int64_t checkpoint_every = 0;     // 0: only at the end (when checkpoint_dir is set)
  std::string metrics;              // JSONL path; empty: none
  std::string trace;                // Chrome trace of the last step; empty: none

  // Every field; the message names the flag (--ranks, --lr, ...).
  Status validate() const;
  // The topology and --tolerance auto rules of validate alone.
  Status validate_topology_and_auto() const;
  // The rules of cp, wlb_cap and cp_threshold alone (part of validate()).
  Status validate_chunking() const;
  // The preset with the overrides applied, validated (message names --model or the key).
  Result<ModelSpec> model_spec() const;
  // Data-parallel replicas: ranks / (pp x tp).
  int64_t dp() const { return pp > 0 && tp > 0 ? ranks / (pp * tp) : ranks; }
  double wlb_cap_or_default() const { return wlb_cap.value_or(kDefaultWlbCap); }
  // The most tokens one rank holds of a micro-batch: tokens_per_rank, or under wlb the cap of
  // the re-pack (plan/chunking.h, chunking_rank_cap). Buffers and the memory estimate use it.
  int64_t rank_capacity() const;
  // `overlap`, or pingpong when unset (cad mode's default).
  runtime::OverlapMode overlap_or_default() const { return overlap.value_or(runtime::OverlapMode::kPingPong); }
  // How a step runs its micro-batches, for reports: "1F1B" (colocated, pp > 1), "1F1B ticks,
  // attention pooled over the stages" (cad, pp > 1), "gradient accumulation" (pp = 1,
  // micro_batches > 1), "" (neither).
  std::string schedule_name() const;
  // The directory of data = "text:DIR" (empty for copy).
  std::string text_dir() const;
};

// The documented range of every model field (docs/training.md, "Model overrides"), checked
// for the preset with its overrides before anything is sized or allocated: a spec within them
// keeps every count and byte figure of the model within int64 and every dimension within
// BLAS's 32-bit sizes. Cross-field rules stay with ModelSpec::validate (n_kv_heads divides
// n_heads), model_spec() (head_dim even) and TrainConfig::validate (tokens_per_rank times the
// widest layer within BLAS's range).
struct ModelRange {
  const char* key;  // the [model_overrides] key, as ModelSpec's field
  int64_t ModelSpec::*field;
  int64_t min, max;
};
const std::vector<ModelRange>& model_ranges();
// invalid_argument "model_overrides.hidden must be in 1..65536 (got 4611686018427387904)".
Status check_model_ranges(const ModelSpec& spec);

// Applies the keys of a TOML file on top of `config` (does not validate the result).
// Errors: unreadable file, TOML syntax (file:line), unknown key, wrong type; one line each.
Status apply_toml_file(const std::string& path, TrainConfig& config);
// Same, from TOML text; `origin` names it in messages.
Status apply_toml_text(const std::string& text, const std::string& origin, TrainConfig& config);

// The re-pack options of --mode wlb / percp for `spec`, with the kernel's query tile
// `tile_rows`: cap, cp and cp_threshold from the config; work in causal pairs (cost nullptr)
// with each token's linear layers weighing their FLOPs over one causal pair's attention FLOPs
// (cost/step_flops.h, forward and backward over every layer and the head), so a document of
// length L weighs linear_per_token x L + L (L + 1) / 2.
ChunkingOptions chunking_options(const TrainConfig& config, const ModelSpec& spec, int64_t tile_rows);

}  // namespace distca::train
