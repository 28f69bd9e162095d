#include "distca/train/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include <toml++/toml.h>

#include "distca/core/io.h"
#include "distca/cost/step_flops.h"
#include "distca/data/workload.h"
#include "distca/plan/chunking.h"
#include "distca/plan/schedule.h"
#include "distca/plan/topology.h"

namespace distca::train {
namespace {

Status bad(const std::string& flag, const std::string& what) {
  return Status::invalid_argument(flag + " " + what);
}

bool finite(double x) { return std::isfinite(x); }

}  // namespace

Status TrainConfig::validate_topology_and_auto() const {
  const bool topology = ranks_per_host != 0 || !host_map.empty() || inter_host_price != 0;
  if (topology) {
    if (mode != TrainMode::kCad) return bad("--ranks-per-host / --host-map", "place attention: cad mode only");
    if (pp != 1) return bad("--ranks-per-host / --host-map", "need --pp 1 (pipeline plans span stages)");
    if (tp != 1) return bad("--ranks-per-host / --host-map", "need --tp 1 (not yet composed with tensor parallelism)");
    if (host_map == "mpi") {
      if (backend != "mpi") return bad("--host-map mpi", "needs --backend mpi (MPI's shared-memory split)");
      if (ranks_per_host != 0) return Status::invalid_argument("--ranks-per-host and --host-map exclude each other");
      HostTopology t;
      if (inter_host_price != 0) t.inter_host_price = inter_host_price;
      DISTCA_RETURN_IF_ERROR(t.validate(ranks));
    } else {
      DISTCA_RETURN_IF_ERROR(topology_from_flags(ranks_per_host, host_map, inter_host_price, ranks).status());
    }
  }
  if (kv_once != "on" && mode != TrainMode::kCad) {
    return bad("--kv-once", std::string("applies to --mode cad only (got --mode ") + train_mode_name(mode) + ")");
  }
  if (kv_once == "auto") {
    if (pp != 1) return bad("--kv-once auto", "needs --pp 1");
    if (hardware.empty()) return bad("--kv-once auto", "needs --hardware FILE (the link and attention figures)");
  }
  if (!tolerance_auto) {
    if (!hardware.empty() && mode != TrainMode::kWlb && kv_once != "auto") {
      return bad("--hardware", "is used only with --tolerance auto, --kv-once auto or --mode wlb");
    }
    return {};
  }
  if (mode != TrainMode::kCad) return bad("--tolerance auto", "needs --mode cad (colocated has no balance band)");
  const auto sched = parse_scheduler(scheduler);
  if (sched.ok() && sched->kind != SchedulerKind::kCad && sched->kind != SchedulerKind::kCadSymmetric) {
    return bad("--tolerance auto", "needs --scheduler cad or cad-symmetric (got " + scheduler + ")");
  }
  if (pp != 1) return bad("--tolerance auto", "needs --pp 1");
  if (hardware.empty()) return bad("--tolerance auto", "needs --hardware FILE (the link and attention figures)");
  return {};
}

Result<TrainMode> parse_train_mode(const std::string& text, const std::string& flag) {
  if (text == "cad") return TrainMode::kCad;
  if (text == "colocated") return TrainMode::kColocated;
  if (text == "wlb") return TrainMode::kWlb;
  if (text == "percp") return TrainMode::kPerCp;
  return bad(flag, "must be cad, colocated, wlb or percp (got '" + text + "')");
}

const char* train_mode_name(TrainMode mode) {
  switch (mode) {
    case TrainMode::kCad: return "cad";
    case TrainMode::kColocated: return "colocated";
    case TrainMode::kWlb: return "wlb";
    case TrainMode::kPerCp: return "percp";
  }
  return "?";
}

const std::vector<ModelRange>& model_ranges() {
  static const std::vector<ModelRange> ranges = {
      {"n_layers", &ModelSpec::n_layers, 1, 1024},      {"hidden", &ModelSpec::hidden, 1, 65536},
      {"n_heads", &ModelSpec::n_heads, 1, 1024},        {"n_kv_heads", &ModelSpec::n_kv_heads, 1, 1024},
      {"head_dim", &ModelSpec::head_dim, 2, 1024},      {"ffn", &ModelSpec::ffn, 1, 262144},
      {"vocab", &ModelSpec::vocab, 2, int64_t{1} << 24},
  };
  return ranges;
}

Status check_model_ranges(const ModelSpec& m) {
  for (const ModelRange& r : model_ranges()) {
    const int64_t v = m.*(r.field);
    if (v < r.min || v > r.max) {
      return bad(std::string("model_overrides.") + r.key, "must be in " + std::to_string(r.min) + ".." +
                                                          std::to_string(r.max) + " (got " + std::to_string(v) + ")");
    }
  }
  return {};
}

namespace {

// The --pp, --tp and --micro-batches rules of TrainConfig::validate, against the model `m`.
Status check_parallelism(const TrainConfig& c, const ModelSpec& m) {
  const int64_t ranks = c.ranks, pp = c.pp, tp = c.tp, micro_batches = c.micro_batches;
  const TrainMode mode = c.mode;
  if (pp < 1 || pp > 64) return bad("--pp", "must be in 1..64 (got " + std::to_string(pp) + ")");
  if (ranks % pp != 0) {
    return bad("--pp", std::to_string(pp) + " does not divide --ranks " + std::to_string(ranks));
  }
  if (tp < 1 || tp > 64) return bad("--tp", "must be in 1..64 (got " + std::to_string(tp) + ")");
  if (ranks % (pp * tp) != 0) {
    return bad("--tp", std::to_string(tp) + " x --pp " + std::to_string(pp) + " does not divide --ranks " +
                           std::to_string(ranks));
  }
  if (tp > 1) {
    // model::check_tp's rule, spelled out: the fuzzers build this file without the model layer.
    if (m.n_heads % tp != 0 || m.n_kv_heads % tp != 0) {
      return bad("--tp", std::to_string(tp) + " must divide the model's heads (" + std::to_string(m.n_heads) +
                             ") and KV heads (" + std::to_string(m.n_kv_heads) + ")");
    }
    if (m.ffn < tp || m.vocab < tp) {
      return bad("--tp", std::to_string(tp) + " exceeds the model's feed-forward width (" + std::to_string(m.ffn) +
                             ") or vocabulary (" + std::to_string(m.vocab) + ")");
    }
  }
  if (micro_batches < 1 || micro_batches > 4096) {
    return bad("--micro-batches", "must be in 1..4096 (got " + std::to_string(micro_batches) + ")");
  }
  if (pp > 1) {
    if (micro_batches < pp) {
      return bad("--micro-batches", std::to_string(micro_batches) + " is fewer than the " + std::to_string(pp) +
                                        " pipeline stages (1F1B needs at least one micro-batch per stage)");
    }
    if (pp > m.n_layers) {
      return bad("--pp", std::to_string(pp) + " stages exceed the model's " + std::to_string(m.n_layers) + " layers");
    }
    // Every tick's pooled exchanges are collective over all stages, layer by layer.
    if (mode == TrainMode::kCad && m.n_layers % pp != 0) {
      return bad("--pp", std::to_string(pp) + " with --mode cad must divide the model's " +
                             std::to_string(m.n_layers) + " layers (every stage runs the same layers per tick)");
    }
  }
  return {};
}

}  // namespace

Status TrainConfig::validate() const {
  DISTCA_ASSIGN_OR_RETURN(const ModelSpec spec, model_spec());
  if (ranks < 1 || ranks > 1024) return bad("--ranks", "must be in 1..1024 (got " + std::to_string(ranks) + ")");
  if (backend != "local" && backend != "mpi") return bad("--backend", "must be local or mpi (got '" + backend + "')");
  if (overlap && mode != TrainMode::kCad) {
    return bad("--overlap", std::string("applies to --mode cad only (") + train_mode_name(mode) +
                                " runs no attention exchange to overlap)");
  }
  if (kv_once != "on" && kv_once != "off" && kv_once != "auto") {
    return bad("--kv-once", "must be on, off or auto (got '" + kv_once + "')");
  }
  if (tp_overlap != "on" && tp_overlap != "off") {
    return bad("--tp-overlap", "must be on or off (got '" + tp_overlap + "')");
  }
  if (plan_ahead != "on" && plan_ahead != "off") {
    return bad("--plan-ahead", "must be on or off (got '" + plan_ahead + "')");
  }
  DISTCA_RETURN_IF_ERROR(check_parallelism(*this, spec));
  DISTCA_RETURN_IF_ERROR(validate_chunking());
  auto sched = parse_scheduler(scheduler);
  if (!sched.ok()) return bad("--scheduler", "is invalid: " + sched.status().message());
  if (sched->kind == SchedulerKind::kWlb) {
    return bad("--scheduler", "wlb re-packs documents before planning: use --mode wlb (cad mode takes cad, cad-symmetric or percp:C)");
  }
  if (sched->kind == SchedulerKind::kPerCp && dp() % sched->cp_degree != 0) {
    return bad("--scheduler", "percp:C needs C to divide the data-parallel ranks (--ranks / --pp)");
  }
  // The cad planners' range (ScheduleOptions::validate); checked here so a run is refused
  // before it starts rather than by rank 0's first plan.
  if (!finite(tolerance) || tolerance < 0 || tolerance > 1) {
    std::ostringstream got;
    got << tolerance;
    return bad("--tolerance", "must be in [0, 1] (got " + got.str() + ")");
  }
  DISTCA_RETURN_IF_ERROR(validate_topology_and_auto());
  if (steps < 1 || steps > 100000000) return bad("--steps", "must be in 1..100000000 (got " + std::to_string(steps) + ")");
  if (!finite(lr) || lr <= 0) return bad("--lr", "must be positive and finite");
  if (!finite(min_lr) || min_lr < 0 || min_lr > lr) return bad("--min-lr", "must be in [0, --lr]");
  if (warmup < 0) return bad("--warmup", "must be >= 0");
  if (!finite(weight_decay) || weight_decay < 0) return bad("--weight-decay", "must be >= 0 and finite");
  if (!finite(clip)) return bad("--clip", "must be finite");
  if (data != "copy" && (data.rfind("text:", 0) != 0 || data.size() == 5)) {
    return bad("--data", "must be copy or text:DIR (got '" + data + "')");
  }
  WorkloadOptions w;
  w.dist = dist;
  w.ranks = dp();
  w.tokens_per_rank = tokens_per_rank;
  w.max_doc_len = max_doc_len;
  w.seed = seed;
  DISTCA_RETURN_IF_ERROR(w.validate());
  if (data == "copy") {
    // Cheap check of the distribution's syntax; reading a file:PATH happens at the start.
    if (dist.rfind("file:", 0) != 0) DISTCA_RETURN_IF_ERROR(LengthDistribution::create(w).status());
  }
  // The model's matrix products take (tokens_per_rank, widest) operands in BLAS's 32-bit
  // sizes (model/llama.h): refused here, before any rank allocates.
  // (The largest rank's tokens: wlb's cap lets a rank hold more than tokens_per_rank.)
  const int64_t widest = std::max({spec.hidden, spec.q_dim(), spec.kv_dim(), spec.ffn, spec.vocab});
  if (widest > INT32_MAX / rank_capacity()) {
    return bad("--tokens-per-rank", std::to_string(tokens_per_rank) + " times the model's widest layer (" +
                                        std::to_string(widest) + ") exceeds the BLAS int range (2^31 - 1)");
  }
  if (copy_vocab < 0 || copy_vocab == 1) return bad("--copy-vocab", "must be 0 (the model's vocabulary) or >= 2");
  if (copy_vocab > 0 && copy_vocab > spec.vocab) {
    return bad("--copy-vocab", "must not exceed the model's vocabulary (" + std::to_string(spec.vocab) + ")");
  }
  if (checkpoint_every < 0) return bad("--checkpoint-every", "must be >= 0");
  if (checkpoint_every > 0 && checkpoint_dir.empty()) {
    return bad("--checkpoint-every", "needs --checkpoint-dir");
  }
  return {};
}

Status TrainConfig::validate_chunking() const {
  const bool chunked = mode == TrainMode::kWlb || mode == TrainMode::kPerCp;
  if (cp < 1 || cp > 1024) return bad("--cp", "must be in 1..1024 (got " + std::to_string(cp) + ")");
  if (cp > 1 && !chunked) {
    return bad("--cp", std::string("applies to --mode wlb or percp only (got --mode ") + train_mode_name(mode) + ")");
  }
  if (mode == TrainMode::kPerCp && cp < 2) return bad("--mode", "percp needs --cp C >= 2 (the CP degree)");
  if (chunked && tp > 1) return bad("--tp", "is not yet composed with --mode wlb or percp (use --tp 1)");
  if (pp >= 1 && ranks % pp == 0 && dp() % cp != 0) {
    return bad("--cp", std::to_string(cp) + " does not divide the " + std::to_string(dp()) +
                           " data-parallel ranks (--ranks / --pp)");
  }
  if (wlb_cap) {
    if (mode != TrainMode::kWlb) return bad("--wlb-cap", "applies to --mode wlb only");
    if (!finite(*wlb_cap) || *wlb_cap < 1) {
      std::ostringstream got;
      got << *wlb_cap;
      return bad("--wlb-cap", "must be >= 1 (got " + got.str() + ")");
    }
    if (*wlb_cap > 64) return bad("--wlb-cap", "must be at most 64 (a rank's buffers grow with it)");
  }
  if (cp_threshold) {
    if (mode != TrainMode::kWlb) return bad("--cp-threshold", "applies to --mode wlb only");
    if (cp < 2) return bad("--cp-threshold", "needs --cp C >= 2 (it selects the documents sharded over a CP group)");
    if (*cp_threshold < 1) return bad("--cp-threshold", "must be >= 1 (got " + std::to_string(*cp_threshold) + ")");
  }
  return {};
}

int64_t TrainConfig::rank_capacity() const {
  if (mode != TrainMode::kWlb) return tokens_per_rank;
  return chunking_rank_cap(dp() * tokens_per_rank, dp(), wlb_cap_or_default());
}

ChunkingOptions chunking_options(const TrainConfig& config, const ModelSpec& spec, int64_t tile_rows) {
  ChunkingOptions o;
  o.cap = config.wlb_cap_or_default();
  o.cp = config.cp;
  o.cp_threshold = config.cp_threshold.value_or(0);
  o.tile_rows = tile_rows;
  o.linear_per_token = training_step_flops(spec, 1, 0).linear / training_step_flops(spec, 0, 1).attention;
  return o;
}

Result<ModelSpec> TrainConfig::model_spec() const {
  auto preset = model_preset(model);
  if (!preset.ok()) return bad("--model", preset.status().message());
  ModelSpec m = *preset;
  const ModelOverrides& o = model_overrides;
  if (o.n_layers) m.n_layers = *o.n_layers;
  if (o.hidden) m.hidden = *o.hidden;
  if (o.n_heads) m.n_heads = *o.n_heads;
  if (o.n_kv_heads) m.n_kv_heads = *o.n_kv_heads;
  if (o.head_dim) m.head_dim = *o.head_dim;
  if (o.ffn) m.ffn = *o.ffn;
  if (o.vocab) m.vocab = *o.vocab;
  DISTCA_RETURN_IF_ERROR(check_model_ranges(m));
  Status st = m.validate();
  if (!st.ok()) return bad("model_overrides:", st.message());
  if (m.head_dim % 2 != 0) return bad("model_overrides.head_dim", "must be even (RoPE)");
  if (data.rfind("text:", 0) == 0 && m.vocab < 257) {
    return bad("--data", "text needs a vocabulary of at least 257 (256 bytes + end of document); the model has " + std::to_string(m.vocab));
  }
  return m;
}

std::string TrainConfig::schedule_name() const {
  if (pp > 1) return mode == TrainMode::kCad ? "1F1B ticks, attention pooled over the stages" : "1F1B";
  return micro_batches > 1 ? "gradient accumulation" : "";
}

std::string TrainConfig::text_dir() const {
  return data.rfind("text:", 0) == 0 ? data.substr(5) : std::string();
}

namespace {

template <class T>
Status get(const toml::node& node, const std::string& origin, const std::string& key, T& out);

// An enum key: a string parsed by `parse` (its message names the key).
template <class E, class Parse>
Status get_enum(const toml::node& node, const std::string& origin, const std::string& key, Parse parse, E& out) {
  std::string text;
  DISTCA_RETURN_IF_ERROR(get(node, origin, key, text));
  auto v = parse(text, origin + ": key '" + key + "'");
  if (!v.ok()) return v.status();
  out = *v;
  return {};
}

template <class T>
Status get(const toml::node& node, const std::string& origin, const std::string& key, T& out) {
  if constexpr (std::is_same_v<T, TrainMode>) {
    return get_enum(node, origin, key, parse_train_mode, out);
  } else if constexpr (std::is_same_v<T, std::optional<runtime::OverlapMode>>) {
    runtime::OverlapMode v{};
    DISTCA_RETURN_IF_ERROR(get_enum(node, origin, key, runtime::parse_overlap_mode, v));
    out = v;
    return {};
  } else if constexpr (std::is_same_v<T, std::optional<double>> || std::is_same_v<T, std::optional<int64_t>>) {
    typename T::value_type v{};
    DISTCA_RETURN_IF_ERROR(get(node, origin, key, v));
    out = v;
    return {};
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (auto v = node.value_exact<std::string>()) {
      // As for flags (apps/distca/flags.h): '' would pass as "not set" and take the default,
      // or slip past a rule that applies only to a key that is set (overlap with colocated).
      if (v->empty()) return Status::invalid_argument(origin + ": key '" + key + "' must not be empty");
      out = *v;
      return {};
    }
    return Status::invalid_argument(origin + ": key '" + key + "' must be a string");
  } else if constexpr (std::is_same_v<T, double>) {
    if (auto v = node.value<double>()) { out = *v; return {}; }
    return Status::invalid_argument(origin + ": key '" + key + "' must be a number");
  } else {
    if (auto v = node.value_exact<int64_t>()) {
      if constexpr (std::is_unsigned_v<T>) {
        if (*v < 0) return Status::invalid_argument(origin + ": key '" + key + "' must be >= 0");
      }
      out = static_cast<T>(*v);
      return {};
    }
    return Status::invalid_argument(origin + ": key '" + key + "' must be an integer");
  }
}

}  // namespace

Status apply_toml_text(const std::string& text, const std::string& origin, TrainConfig& c) {
  toml::table tbl;
  try {
    tbl = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return Status::invalid_argument(origin + ":" + std::to_string(e.source().begin.line) + ": " +
                                    std::string(e.description()));
  }
  // A file naming a model starts from that preset (its own [model_overrides] still apply).
  if (tbl.contains("model")) c.model_overrides = {};
  for (auto&& [k, node] : tbl) {
    const std::string key(k.str());
    if (key == "tolerance" && node.is_string()) {
      const auto t = parse_tolerance(node.value_or(std::string()), origin + ": key 'tolerance'");
      if (!t.ok()) return t.status();
      c.tolerance_auto = !t->has_value();
      c.tolerance = t->value_or(c.tolerance);
      continue;
    }
    if (key == "tolerance") c.tolerance_auto = false;
#define DISTCA_KEY(name) \
    if (key == #name) { DISTCA_RETURN_IF_ERROR(get(node, origin, key, c.name)); continue; }
    DISTCA_KEY(model) DISTCA_KEY(ranks) DISTCA_KEY(backend) DISTCA_KEY(mode)
    DISTCA_KEY(scheduler) DISTCA_KEY(tolerance) DISTCA_KEY(steps) DISTCA_KEY(lr)
    DISTCA_KEY(min_lr) DISTCA_KEY(warmup) DISTCA_KEY(weight_decay) DISTCA_KEY(clip)
    DISTCA_KEY(seed) DISTCA_KEY(data) DISTCA_KEY(copy_vocab) DISTCA_KEY(tokens_per_rank) DISTCA_KEY(dist)
    DISTCA_KEY(max_doc_len) DISTCA_KEY(checkpoint_dir) DISTCA_KEY(checkpoint_every)
    DISTCA_KEY(metrics) DISTCA_KEY(overlap) DISTCA_KEY(trace) DISTCA_KEY(pp) DISTCA_KEY(tp) DISTCA_KEY(tp_overlap) DISTCA_KEY(micro_batches)
    DISTCA_KEY(plan_ahead) DISTCA_KEY(kv_once) DISTCA_KEY(hardware) DISTCA_KEY(ranks_per_host) DISTCA_KEY(host_map)
    DISTCA_KEY(inter_host_price) DISTCA_KEY(cp) DISTCA_KEY(wlb_cap) DISTCA_KEY(cp_threshold)
#undef DISTCA_KEY
    if (key == "model_overrides") {
      const toml::table* sub = node.as_table();
      if (!sub) return Status::invalid_argument(origin + ": key 'model_overrides' must be a table");
      for (auto&& [k2, n2] : *sub) {
        const std::string key2(k2.str());
        const std::string full = "model_overrides." + key2;
        ModelOverrides& o = c.model_overrides;
        std::optional<int64_t>* slot = key2 == "n_layers"     ? &o.n_layers
                                       : key2 == "hidden"     ? &o.hidden
                                       : key2 == "n_heads"    ? &o.n_heads
                                       : key2 == "n_kv_heads" ? &o.n_kv_heads
                                       : key2 == "head_dim"   ? &o.head_dim
                                       : key2 == "ffn"        ? &o.ffn
                                       : key2 == "vocab"      ? &o.vocab
                                                              : nullptr;
        if (!slot) return Status::invalid_argument(origin + ": unknown key '" + full + "'");
        int64_t v = 0;
        DISTCA_RETURN_IF_ERROR(get(n2, origin, full, v));
        *slot = v;
      }
      continue;
    }
    return Status::invalid_argument(origin + ": unknown key '" + key + "'");
  }
  return {};
}

Status apply_toml_file(const std::string& path, TrainConfig& config) {
  auto text = read_file(path);
  if (!text.ok()) return Status::invalid_argument("--config " + path + ": " + text.status().message());
  return apply_toml_text(*text, path, config);
}

}  // namespace distca::train
