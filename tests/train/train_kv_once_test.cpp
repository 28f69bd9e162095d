// --kv-once (TrainConfig::kv_once) reaches the runner: `distca train` with K/V once off gives
// bitwise the losses, gradient norms and parameters of on (and of auto), in cad ping-pong at
// 2 and 3 ranks, with gradient accumulation and with pooled pipeline ticks, while on sends
// fewer bytes where the nano-batches share K/V; and the flag's bad values are refused.
#include <gtest/gtest.h>

#include <string>

#include "distca/train/config.h"
#include "distca/train/trainer.h"
#include "train_test_util.h"

namespace distca::train {
namespace {

TrainResult train(TrainConfig c, const std::string& kv_once) {
  c.kv_once = kv_once;
  return testing::train_local(c);
}

TrainConfig base_config() {
  TrainConfig c = testing::small_model_config(2);
  c.steps = 3;
  c.warmup = 2;
  c.tokens_per_rank = 512;
  c.dist = "uniform:128:512";
  c.max_doc_len = 0;
  return c;
}

TEST(KvOnce, OffGivesTheBitsOfOnAndSendsMoreKv) {
  struct Case {
    std::string what;
    int64_t ranks, pp, micro_batches;
  };
  const Case cases[] = {
      {"cad pingpong, 2 ranks", 2, 1, 1},
      {"cad pingpong, 3 ranks", 3, 1, 1},
      {"cad, 2 micro-batches", 2, 1, 2},
      {"cad pooled ticks, 2 stages x 2", 4, 2, 2},
  };
  int64_t saved = 0;
  for (const Case& k : cases) {
    TrainConfig c = base_config();
    c.ranks = k.ranks;
    c.pp = k.pp;
    c.micro_batches = k.micro_batches;
    const TrainResult on = train(c, "on");
    const TrainResult off = train(c, "off");
    testing::expect_same_numbers(on, off, k.what);
    for (size_t i = 0; i < on.steps.size() && i < off.steps.size(); ++i) {
      EXPECT_LE(on.steps[i].bytes_sent, off.steps[i].bytes_sent) << k.what << " step " << i;
      saved += off.steps[i].bytes_sent - on.steps[i].bytes_sent;
    }
  }
  EXPECT_GT(saved, 0);  // the switch reaches the runner: off resends pong's share of K/V
}

TEST(KvOnce, BadValuesAndCombinationsAreRefusedNamingTheFlag) {
  TrainConfig c = base_config();
  c.kv_once = "sometimes";
  EXPECT_EQ(c.validate().message(), "--kv-once must be on, off or auto (got 'sometimes')");
  c.kv_once = "auto";
  EXPECT_EQ(c.validate().message(), "--kv-once auto needs --hardware FILE (the link and attention figures)");
  c.kv_once = "off";
  c.mode = TrainMode::kColocated;
  EXPECT_EQ(c.validate().message(), "--kv-once applies to --mode cad only (got --mode colocated)");
  TrainConfig t;
  ASSERT_TRUE(apply_toml_text("kv_once = \"off\"\n", "test.toml", t).ok());
  EXPECT_EQ(t.kv_once, "off");
  EXPECT_TRUE(t.validate().ok());
}

}  // namespace
}  // namespace distca::train
