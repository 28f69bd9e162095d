// The settings a training run's ranks agree on (settings.h).
#include "distca/train/settings.h"

#include <optional>
#include <string>

namespace distca::train {

comm::Settings run_settings(const TrainConfig& c) {
  comm::Settings s;
  s.add("command", "train").add("--model", c.model);
  const ModelOverrides& m = c.model_overrides;
  const std::pair<const char*, const std::optional<int64_t>*> overrides[] = {
      {"n_layers", &m.n_layers}, {"hidden", &m.hidden}, {"n_heads", &m.n_heads}, {"n_kv_heads", &m.n_kv_heads},
      {"head_dim", &m.head_dim}, {"ffn", &m.ffn},       {"vocab", &m.vocab}};
  for (const auto& [name, v] : overrides) {
    s.add(std::string("model_overrides.") + name, *v ? std::to_string(**v) : std::string("unset"));
  }
  const bool cad = c.mode == TrainMode::kCad;
  s.add("--mode", train_mode_name(c.mode)).add("--scheduler", c.scheduler).add("--tolerance", c.tolerance);
  s.add("--tolerance auto", c.tolerance_auto).add("--hardware given", !c.hardware.empty());
  s.add("--ranks-per-host", c.ranks_per_host).add("--host-map", c.host_map).add("--inter-host-price", c.inter_host_price);
  s.add("--overlap", cad ? runtime::overlap_mode_name(c.overlap_or_default())
                         : c.overlap ? runtime::overlap_mode_name(*c.overlap) : "");
  s.add("--kv-once", c.kv_once);
  s.add("--pp", c.pp).add("--micro-batches", c.micro_batches).add("--plan-ahead", c.plan_ahead);
  s.add("--tp", c.tp).add("--tp-overlap", c.tp_overlap);
  s.add("--steps", c.steps).add("--lr", c.lr).add("--min-lr", c.min_lr).add("--warmup", c.warmup);
  s.add("--weight-decay", c.weight_decay).add("--clip", c.clip).add("--seed", c.seed);
  s.add("--data", c.data).add("--copy-vocab", c.copy_vocab).add("--tokens-per-rank", c.tokens_per_rank);
  s.add("--dist", c.dist).add("--max-doc-len", c.max_doc_len);
  s.add("--checkpoint-dir given", !c.checkpoint_dir.empty()).add("--checkpoint-every", c.checkpoint_every);
  s.add("--trace given", !c.trace.empty());
  return s;
}

}  // namespace distca::train
