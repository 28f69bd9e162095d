// The chunking's work from a measured hardware profile (include/distca/train/wlb_profile.h).
#include "distca/train/wlb_profile.h"

#include "distca/cost/step_flops.h"

namespace distca::train {

ChunkingOptions profiled_chunking(const HardwareProfile& profile, const ModelSpec& spec, ChunkingOptions options,
                                  std::shared_ptr<const AttentionCostModel>* table) {
  auto model = std::make_shared<const ProfiledCostModel>(profile.attention_total());
  double flops = 0, seconds = 0;
  for (const GemmRecord& g : profile.gemms) {
    flops += g.flops();
    seconds += g.seconds_concurrent;
  }
  const double rate = flops / seconds;
  const double per_token = training_step_flops(spec, 1, 0).linear / static_cast<double>(spec.n_layers) / rate;
  const double width = static_cast<double>(spec.n_heads * spec.head_dim) /
                       static_cast<double>(profile.shape.n_heads * profile.shape.head_dim);
  options.linear_per_token = per_token / width;
  options.cost = model.get();
  *table = std::move(model);
  return options;
}

Result<ChunkingOptions> load_profiled_chunking(const std::string& path, const ModelSpec& spec,
                                               const ChunkingOptions& options,
                                               std::shared_ptr<const AttentionCostModel>* table) {
  Result<HardwareProfile> profile = load_hardware_profile(path);
  if (!profile.ok()) return Status::invalid_argument("--hardware: " + profile.status().message());
  return profiled_chunking(*profile, spec, options, table);
}

}  // namespace distca::train
