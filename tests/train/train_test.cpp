// Tests of the train layer: config parsing, the copy/text data streams against independent
// recomputation, checkpoint integrity, and the trainer's bitwise properties (cad == colocated,
// resume == uninterrupted) on the local backend.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <limits>

#include <filesystem>
#include <fstream>
#include <cstdio>
#include <map>
#include <cstdlib>
#include <omp.h>
#include <string>

#include "distca/core/io.h"
#include "distca/data/workload.h"
#include "distca/kernels/blas.h"
#include "distca/train/checkpoint.h"
#include "distca/train/config.h"
#include "distca/train/data.h"
#include "distca/train/memory.h"
#include "distca/train/trainer.h"
#include "train_test_util.h"
#include "distca/model/llama.h"
#include "distca/model/local_attention.h"
#include "distca/model/optimizer.h"

namespace distca::train {
namespace {

// A model small enough for many steps in a test.
TrainConfig small_config() { return testing::small_run_config(); }

TEST(Config, DefaultIsValid) {
  const TrainConfig d;
  ASSERT_TRUE(d.validate().ok()) << d.validate().to_string();
}

// configs/default.toml is the embedded default written out.
TEST(Config, ShippedDefaultTomlIsTheEmbeddedDefault) {
  TrainConfig c = small_config();
  c.lr = 1;
  ASSERT_TRUE(apply_toml_file(std::string(DISTCA_SOURCE_DIR) + "/configs/default.toml", c).ok());
  const TrainConfig d;
  auto s1 = c.model_spec(), s2 = d.model_spec();
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(fingerprint(c, *s1), fingerprint(d, *s2));
  for (const char* name : {"cad-8ranks.toml", "text-example.toml", "pipeline-4stages.toml"}) {
    TrainConfig e;
    Status st = apply_toml_file(std::string(DISTCA_SOURCE_DIR) + "/configs/" + name, e);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(e.validate().ok()) << name << ": " << e.validate().to_string();
  }
}

TEST(Config, TomlSetsKeysAndOverrides) {
  TrainConfig c;
  const std::string text =
      "ranks = 4\nmode = \"colocated\"\nlr = 1\nsteps = 7\ndata = \"text:/tmp\"\n"
      "[model_overrides]\nn_layers = 3\nvocab = 300\n";
  ASSERT_TRUE(apply_toml_text(text, "t.toml", c).ok());
  EXPECT_EQ(c.ranks, 4);
  EXPECT_EQ(c.mode, TrainMode::kColocated);
  EXPECT_EQ(c.lr, 1.0);  // integers are accepted for floating-point keys
  EXPECT_EQ(c.steps, 7);
  auto spec = c.model_spec();
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->n_layers, 3);
  EXPECT_EQ(spec->vocab, 300);
  EXPECT_EQ(c.text_dir(), "/tmp");
}

TEST(Config, BadKeysAndValuesNameTheKey) {
  struct Case { std::string text, needle; };
  for (const Case& k : std::vector<Case>{{"rnaks = 2\n", "'rnaks'"},
                                         {"ranks = \"two\"\n", "'ranks'"},
                                         {"[model_overrides]\nlayers = 2\n", "'model_overrides.layers'"},
                                         {"mode = \n", "t.toml:1"},
                                         {"mode = \"fast\"\n", "t.toml: key 'mode' must be cad, colocated, wlb or percp (got 'fast')"},
                                         {"overlap = \"both\"\n", "t.toml: key 'overlap' must be pingpong, single-stream or signal"},
                                         {"mode = \"colocated\"\noverlap = \"\"\n", "key 'overlap' must not be empty"}}) {
    TrainConfig c;
    Status st = apply_toml_text(k.text, "t.toml", c);
    ASSERT_FALSE(st.ok()) << k.text;
    EXPECT_NE(st.message().find(k.needle), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
  }
  struct Bad { std::function<void(TrainConfig&)> set; std::string flag; };
  for (const Bad& b : std::vector<Bad>{{[](TrainConfig& c) { c.ranks = 0; }, "--ranks"},
                                       {[](TrainConfig& c) { c.backend.assign("nccl"); }, "--backend"},
                                       {[](TrainConfig& c) { c.lr = -1; }, "--lr"},
                                       // assign(): GCC 12's -Wrestrict misfires on operator= of short literals here (its bug 105329).
                                       {[](TrainConfig& c) { c.data.assign("txt"); }, "--data"},
                                       {[](TrainConfig& c) {
                                          c.mode = TrainMode::kColocated;
                                          c.overlap = runtime::OverlapMode::kSingleStream;
                                        },
                                        "--overlap"},
                                       {[](TrainConfig& c) { c.tokens_per_rank = 100; }, "--tokens-per-rank"},
                                       {[](TrainConfig& c) { c.model.assign("huge"); }, "--model"},
                                       {[](TrainConfig& c) { c.scheduler.assign("wlb"); }, "--scheduler"},
                                       {[](TrainConfig& c) { c.checkpoint_every = 3; }, "--checkpoint-every"}}) {
    TrainConfig c;
    b.set(c);
    Status st = c.validate();
    ASSERT_FALSE(st.ok()) << b.flag;
    EXPECT_NE(st.message().find(b.flag), std::string::npos) << st.message();
  }
}

// Every model field has a documented range (train::model_ranges), refused naming the key just
// outside it and accepted at its ends.
TEST(Config, ModelOverridesOutsideTheirRangesAreRefusedNamingTheKey) {
  for (const ModelRange& r : model_ranges()) {
    for (const int64_t v : {r.min - 1, r.max + 1, int64_t{1} << 62, std::numeric_limits<int64_t>::min()}) {
      TrainConfig c;
      ModelSpec spec = *c.model_spec();
      spec.*(r.field) = v;
      const Status st = check_model_ranges(spec);
      ASSERT_FALSE(st.ok()) << r.key << " " << v;
      EXPECT_EQ(st.message(), "model_overrides." + std::string(r.key) + " must be in " + std::to_string(r.min) + ".." +
                                  std::to_string(r.max) + " (got " + std::to_string(v) + ")");
    }
  }
  TrainConfig c;
  c.model_overrides.n_layers = 10000000;
  EXPECT_NE(c.validate().message().find("model_overrides.n_layers must be in 1..1024"), std::string::npos);
  c = TrainConfig{};
  c.model_overrides.hidden = int64_t{1} << 62;
  EXPECT_NE(c.validate().message().find("model_overrides.hidden"), std::string::npos);
  // At the ends of the ranges: accepted by the ranges (the trainer's cross-field rules aside).
  c = TrainConfig{};
  c.model_overrides = {1024, 65536, 1024, 1024, 2, 262144, int64_t{1} << 24};
  EXPECT_TRUE(check_model_ranges(*c.model_spec()).ok());
  // The widest layer times tokens_per_rank must fit BLAS's int: vocab 2^24 x 256 tokens does not.
  c = TrainConfig{};
  c.model_overrides.vocab = int64_t{1} << 24;
  EXPECT_NE(c.validate().message().find("--tokens-per-rank 256 times the model's widest layer (16777216) exceeds"),
            std::string::npos)
      << c.validate().message();
}

// The memory estimate is closed-form arithmetic: sizing a model of 10 million layers allocates
// nothing (it used to build a 9-entries-per-layer table of tensor names first: about 1.8 GB),
// and a model past int64 in bytes gets a saturated, refusable figure, never a wrapped one.
TEST(Memory, EstimateOfAHugeModelAllocatesNothing) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "RLIMIT_AS does not mix with ASan's shadow memory";
#else
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const rlimit limit{512 << 20, 512 << 20};  // 512 MiB of address space for the child
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
    TrainConfig c;
    ModelSpec spec = *c.model_spec();
    spec.n_layers = 10000000;
    const TrainMemoryEstimate e = estimate_train_memory(c, spec, MemoryInputs{});
    // 4 fp32 copies of about 10^7 x 0.4 M parameters: far beyond the 512 MiB.
    _exit(e.process_total() > 1e12 && e.per_rank() > 0 ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
#endif
  TrainConfig c;
  c.tokens_per_rank = int64_t{1} << 36;
  c.micro_batches = 4096;
  ModelSpec wide = *c.model_spec();
  wide.n_layers = 1024;
  wide.vocab = int64_t{1} << 24;
  const TrainMemoryEstimate e = estimate_train_memory(c, wide, MemoryInputs{});
  for (int64_t term : {e.model_state, e.activations, e.dispatcher, e.plan}) EXPECT_GT(term, 0);
  // About 74 MB per token x 2^36 tokens: past int64 as a product of int64s, saturated here.
  EXPECT_EQ(e.activations, int64_t{1} << 58);
  EXPECT_GE(e.process_total(), std::ldexp(1.0, 58));
}

// Reassembles every document of a step from the ranks' inputs and checks it against the copy
// task's definition and the batch's layout.
TEST(Data, CopyTaskMatchesItsDefinition) {
  TrainConfig c = small_config();
  c.ranks = 3;
  c.dist = "uniform:16:512";  // documents cross rank boundaries
  c.max_doc_len = 0;
  c.copy_vocab = 32;
  auto ds = DataSource::create(c, 64);
  ASSERT_TRUE(ds.ok());
  WorkloadOptions w;
  w.dist = c.dist;
  w.ranks = c.ranks;
  w.tokens_per_rank = c.tokens_per_rank;
  w.max_doc_len = c.max_doc_len;
  w.seed = c.seed;
  w.batches = 4;
  auto ref = make_batches(w);
  ASSERT_TRUE(ref.ok());
  int split_docs = 0;
  for (int64_t step = 0; step < 4; ++step) {
    const Batch b = ds->batch(step);
    ASSERT_EQ(b, (*ref)[static_cast<size_t>(step)]);
    std::map<int64_t, std::vector<int32_t>> tok, tgt, pos;
    std::map<int64_t, std::vector<float>> rw;
    std::map<int64_t, int64_t> len, ranks_of;
    for (int64_t r = 0; r < c.ranks; ++r) {
      const RankInputs in = ds->rank_inputs(step, b, r);
      ASSERT_EQ(static_cast<int64_t>(in.tokens.size()), b.rank_tokens(r));
      size_t i = 0;
      for (const Piece& p : b.per_rank[static_cast<size_t>(r)]) {
        ++ranks_of[p.doc];
        len[p.doc] = p.doc_len;
        for (int64_t j = 0; j < p.len; ++j, ++i) {
          EXPECT_EQ(in.positions[i], p.offset + j);
          tok[p.doc].push_back(in.tokens[i]);
          tgt[p.doc].push_back(in.targets[i]);
          pos[p.doc].push_back(in.positions[i]);
          rw[p.doc].push_back(in.report_weights[i]);
        }
      }
    }
    for (const auto& [doc, t] : tok) {
      const int64_t n = len[doc];
      ASSERT_EQ(static_cast<int64_t>(t.size()), n);
      split_docs += ranks_of[doc] > 1;
      const int64_t half = (n + 1) / 2;
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_GE(t[static_cast<size_t>(i)], 0);
        EXPECT_LT(t[static_cast<size_t>(i)], 32);
        if (i >= half) {
          EXPECT_EQ(t[static_cast<size_t>(i)], t[static_cast<size_t>(i - half)]);
        }
        EXPECT_EQ(tgt[doc][static_cast<size_t>(i)], i + 1 < n ? t[static_cast<size_t>(i + 1)] : -1);
        EXPECT_EQ(rw[doc][static_cast<size_t>(i)], (i + 1 < n && i + 1 > half) ? 1.0f : 0.0f);
      }
    }
    EXPECT_NE(ds->document(step, b, 0), ds->document(step + 1, ds->batch(step + 1), 0));
  }
  EXPECT_GT(split_docs, 0);  // the check covered documents split across ranks
}

TEST(Data, TextDirectoryIsByteTokensPlusEndOfDocument) {
  const auto dir = std::filesystem::temp_directory_path() / "distca_train_text_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "sub");
  std::map<std::string, std::string> files = {{"a.txt", "hello world\n"},
                                              {"sub/b.txt", std::string("\xff\x01zz", 4)}};
  for (const auto& [name, text] : files) std::ofstream(dir / name, std::ios::binary) << text;
  TrainConfig c = small_config();
  c.data = "text:" + dir.string();
  c.tokens_per_rank = 16;
  c.ranks = 2;
  auto ds = DataSource::create(c, 300);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  EXPECT_EQ(ds->num_text_documents(), 2);
  const Batch b = ds->batch(0);
  for (int64_t r = 0; r < 2; ++r) {
    const RankInputs in = ds->rank_inputs(0, b, r);
    size_t i = 0;
    for (const Piece& p : b.per_rank[static_cast<size_t>(r)]) {
      const auto doc = ds->document(0, b, p.doc);
      // Each document is one of the files' bytes + EOD (possibly cut by packing).
      bool matches = false;
      for (const auto& [name, text] : files) {
        std::vector<int32_t> want;
        for (char ch : text) want.push_back(static_cast<unsigned char>(ch));
        want.push_back(kEndOfDocument);
        if (doc.size() <= want.size() && std::equal(doc.begin(), doc.end(), want.begin())) matches = true;
      }
      EXPECT_TRUE(matches);
      for (int64_t j = 0; j < p.len; ++j, ++i) EXPECT_EQ(in.report_weights[i], 1.0f);
    }
  }
  TrainConfig bad = c;
  bad.data = "text:" + (dir / "missing").string();
  auto st = DataSource::create(bad, 300);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("--data"), std::string::npos);
  std::filesystem::remove_all(dir);
}

Checkpoint sample_checkpoint() {
  Checkpoint c;
  c.fingerprint = "model=tiny ranks=2 seed=1";
  c.step = 5;
  c.seed = 1;
  c.adam_step = 5;
  for (int i = 0; i < 100; ++i) {
    c.params.push_back(0.5f * static_cast<float>(i));
    c.adam_m.push_back(-1.0f * static_cast<float>(i));
    c.adam_v.push_back(2.0f + static_cast<float>(i));
  }
  return c;
}

// DataSource::fixed over a list: batch(i) is batch i mod n, and its tokens are drawn per step
// like the single batch's (which is the one-element list); lists of mixed shapes or none, and a
// rank not full, are refused naming the batch.
TEST(Data, FixedListCyclesByIndex) {
  auto make = [](int64_t len) {
    Batch b;
    b.ranks = 2;
    b.tokens_per_rank = 64;
    b.per_rank.resize(2);
    int64_t id = 0;
    for (auto& r : b.per_rank) {
      for (int64_t t = 0; t < 64; t += len) r.push_back({id++, 0, len, len});
    }
    return b;
  };
  const std::vector<Batch> list{make(64), make(16), make(32)};
  auto src = DataSource::fixed(list, 32, 7);
  ASSERT_TRUE(src.ok()) << src.status().message();
  for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(src->batch(i), list[static_cast<size_t>(i % 3)]) << i;
  auto one = DataSource::fixed(list[1], 32, 7);
  auto one_list = DataSource::fixed(std::vector<Batch>{list[1]}, 32, 7);
  ASSERT_TRUE(one.ok() && one_list.ok());
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(one->batch(i), list[1]);
    EXPECT_EQ(one->rank_inputs(i, one->batch(i), 1).tokens, one_list->rank_inputs(i, one_list->batch(i), 1).tokens);
  }
  // Step 4 reads list[1], as does step 1, but draws its own tokens.
  EXPECT_NE(src->rank_inputs(4, src->batch(4), 0).tokens, src->rank_inputs(1, src->batch(1), 0).tokens);
  EXPECT_FALSE(DataSource::fixed(std::vector<Batch>{}, 32, 7).ok());
  Batch wide = make(16);
  wide.tokens_per_rank = 128;
  for (auto& r : wide.per_rank) {
    for (int64_t t = 64; t < 128; t += 16) r.push_back({static_cast<int64_t>(100 + t + (&r - wide.per_rank.data()) * 1000), 0, 16, 16});
  }
  auto mixed = DataSource::fixed(std::vector<Batch>{list[0], wide}, 32, 7);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("fixed batch 1"), std::string::npos) << mixed.status().message();
  Batch short_rank = make(16);
  short_rank.per_rank[1].pop_back();
  auto bad = DataSource::fixed(std::vector<Batch>{list[0], short_rank}, 32, 7);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fixed batch 1: rank 1"), std::string::npos) << bad.status().message();
}

TEST(Checkpoint, RoundTripsAndDetectsEveryFlippedByteAndTruncation) {
  const Checkpoint c = sample_checkpoint();
  const std::string bytes = serialize_checkpoint(c);
  auto back = parse_checkpoint(bytes, "f");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->params, c.params);
  EXPECT_EQ(back->adam_m, c.adam_m);
  EXPECT_EQ(back->adam_v, c.adam_v);
  EXPECT_EQ(back->step, 5);
  EXPECT_EQ(back->fingerprint, c.fingerprint);
  for (size_t i = 0; i < bytes.size(); i += 7) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    auto r = parse_checkpoint(bad, "f");
    ASSERT_FALSE(r.ok()) << "byte " << i;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  }
  for (size_t n : {size_t{0}, size_t{10}, bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_FALSE(parse_checkpoint(bytes.substr(0, n), "f").ok()) << n;
  }
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 1;
  auto r = parse_checkpoint(flipped, "--resume f");
  EXPECT_EQ(r.status().message(), "--resume f: checksum mismatch (file corrupt)");
}

TEST(Checkpoint, FingerprintMismatchIsRefusedWithTheKey) {
  const auto path = (std::filesystem::temp_directory_path() / "distca_ckpt_fp_test.ckpt").string();
  Checkpoint c = sample_checkpoint();
  ASSERT_TRUE(write_checkpoint(path, c).ok());
  auto ok = read_checkpoint(path, c.fingerprint);
  ASSERT_TRUE(ok.ok());
  auto bad = read_checkpoint(path, "model=tiny ranks=4 seed=1");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "--resume " + path + ": was written for ranks=2; this run has ranks=4");
  std::filesystem::remove(path);
}

// fingerprint() leaves out pp and micro_batches at 1: a pipeline checkpoint resumed without a
// pipeline (and the reverse) names them, with their defaults, instead of nothing.
TEST(Checkpoint, FingerprintMismatchNamesKeysPresentOnOneSideOnly) {
  const auto path = (std::filesystem::temp_directory_path() / "distca_ckpt_fp_pp_test.ckpt").string();
  TrainConfig piped;
  piped.ranks = 4;
  piped.pp = 4;
  piped.micro_batches = 4;
  piped.model_overrides.n_layers = 4;
  TrainConfig plain = piped;
  plain.pp = 1;
  plain.micro_batches = 1;
  Checkpoint c = sample_checkpoint();
  c.fingerprint = fingerprint(piped, *piped.model_spec());
  ASSERT_TRUE(write_checkpoint(path, c).ok());
  auto bad = read_checkpoint(path, fingerprint(plain, *plain.model_spec()));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "--resume " + path +
                                        ": was written for micro_batches=4, pp=4; this run has micro_batches=1, pp=1");
  c.fingerprint = fingerprint(plain, *plain.model_spec());
  ASSERT_TRUE(write_checkpoint(path, c).ok());
  bad = read_checkpoint(path, fingerprint(piped, *piped.model_spec()));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "--resume " + path +
                                        ": was written for micro_batches=1, pp=1; this run has micro_batches=4, pp=4");
  std::filesystem::remove(path);
}

std::vector<double> losses(const TrainResult& r) {
  std::vector<double> out;
  for (const auto& s : r.steps) out.push_back(s.loss);
  return out;
}

// cad and colocated run the same model code and differ only in where attention runs; the
// dispatcher's fixed-order sums and tile alignment make them the same function bit for bit as
// long as no key row's dK/dV gathers more than two partials (two terms add the same in either
// order). At 2 ranks that holds here; with more ranks a document cut by the nano-batch split
// and spread over three servers sums three partials in another association, so 3 and more
// ranks agree within rounding instead (train_overlap_test, Overlap.*: below 3e-9 in the loss).
TEST(Trainer, CadAndColocatedGiveIdenticalLossesAndParameters) {
  for (int64_t ranks : {2}) {
    TrainConfig c = small_config();
    c.ranks = ranks;
    c.dist = "uniform:16:384";
    TrainResult cad, colo;
    c.mode = TrainMode::kCad;
    ASSERT_TRUE(run_training_local(c, {}, &cad).ok());
    c.mode = TrainMode::kColocated;
    ASSERT_TRUE(run_training_local(c, {}, &colo).ok());
    ASSERT_EQ(cad.steps.size(), 20u);
    double max_diff = 0;
    bool planner_moved_work = false;
    for (size_t i = 0; i < cad.steps.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(cad.steps[i].loss - colo.steps[i].loss));
      planner_moved_work |= cad.steps[i].imbalance_after < colo.steps[i].imbalance_after - 1e-9;
    }
    EXPECT_EQ(max_diff, 0.0) << ranks << " ranks";
    EXPECT_EQ(losses(cad), losses(colo));
    EXPECT_TRUE(cad.final_params == colo.final_params);
    EXPECT_TRUE(planner_moved_work);  // the comparison exercised real re-placement
  }
}

// When cad cuts chunks out of pieces longer than its 128-row minimum, a key row's dK/dV is
// summed from partials of several servers, associated differently from the colocated call
// (docs/runtime.md, "Numerics"), so the two runs may differ in the last bits. They must still
// compute the same function: the losses agree to within float rounding over the run.
TEST(Trainer, CadAndColocatedAgreeWhenCadSplitsPieces) {
  TrainConfig c = small_config();
  c.ranks = 2;
  c.tokens_per_rank = 512;
  c.dist = "uniform:256:1024";  // pieces of hundreds of rows: cad splits inside them
  c.steps = 5;
  c.warmup = 1;
  TrainResult cad, colo;
  c.mode = TrainMode::kCad;
  ASSERT_TRUE(run_training_local(c, {}, &cad).ok());
  c.mode = TrainMode::kColocated;
  ASSERT_TRUE(run_training_local(c, {}, &colo).ok());
  ASSERT_EQ(cad.steps.size(), 5u);
  bool planner_moved_work = false;
  double max_diff = 0;
  for (size_t i = 0; i < cad.steps.size(); ++i) {
    EXPECT_NEAR(cad.steps[i].loss, colo.steps[i].loss, 1e-5 * std::abs(colo.steps[i].loss)) << "step " << i;
    max_diff = std::max(max_diff, std::abs(cad.steps[i].loss - colo.steps[i].loss));
    planner_moved_work |= cad.steps[i].imbalance_after < colo.steps[i].imbalance_after - 1e-9;
  }
  EXPECT_TRUE(planner_moved_work);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", max_diff);
  RecordProperty("max_loss_difference", buf);
}

// The distributed loop against an independent single-process reference: the same documents,
// each whole, through the model with the local reference attention executor, and the same
// optimizer steps. Both must agree up to summation order, step after step (so the backward
// pass through the dispatcher, split documents included, gives the right gradients).
TEST(Trainer, MatchesASingleProcessReferenceLoop) {
  TrainConfig c = small_config();
  c.ranks = 3;
  c.dist = "uniform:16:384";  // documents split across ranks
  c.steps = 4;
  c.warmup = 1;
  TrainResult r;
  ASSERT_TRUE(run_training_local(c, {}, &r).ok());
  ASSERT_EQ(r.steps.size(), 4u);
  auto spec = c.model_spec();
  ASSERT_TRUE(spec.ok());
  auto ds = DataSource::create(c, spec->vocab);
  ASSERT_TRUE(ds.ok());
  auto model = model::Llama<float>::create(*spec, c.ranks * c.tokens_per_rank, c.seed);
  ASSERT_TRUE(model.ok());
  model::AdamWConfig acfg;
  acfg.weight_decay = c.weight_decay;
  auto opt = model::AdamW::create(model::param_count(*spec), model::decay_groups(model->layout()), acfg);
  ASSERT_TRUE(opt.ok());
  model::LrSchedule sched{c.lr, c.min_lr, c.warmup, c.steps};
  for (int64_t step = 0; step < c.steps; ++step) {
    const Batch b = ds->batch(step);
    std::map<int64_t, int64_t> doc_len;
    for (const auto& rank : b.per_rank) for (const Piece& p : rank) doc_len[p.doc] = p.doc_len;
    std::vector<Piece> pieces;
    std::vector<int32_t> tokens, positions, targets;
    std::vector<float> weights;
    for (const auto& [doc, n] : doc_len) {
      pieces.push_back({doc, 0, n, n});
      const auto t = ds->document(step, b, doc);
      for (int64_t i = 0; i < n; ++i) {
        tokens.push_back(t[static_cast<size_t>(i)]);
        positions.push_back(static_cast<int32_t>(i));
        targets.push_back(i + 1 < n ? t[static_cast<size_t>(i + 1)] : -1);
        weights.push_back((i + 1 < n && i + 1 > (n + 1) / 2) ? 1.0f : 0.0f);
      }
    }
    auto ex = model::LocalAttentionExecutor<float>::create(spec->n_heads, spec->n_kv_heads, spec->head_dim, pieces);
    ASSERT_TRUE(ex.ok());
    int64_t count = 0;
    for (int32_t t : targets) count += t >= 0;
    model->zero_grads();
    auto loss = model->forward_backward({tokens, positions, targets, weights}, *ex, 1.0 / static_cast<double>(count));
    ASSERT_TRUE(loss.ok()) << loss.status().to_string();
    model::clip_grad_norm(model->grads(), c.clip);
    ASSERT_TRUE(opt->step(model->params(), model->grads(), sched.at(step)).ok());
    const auto& m = r.steps[static_cast<size_t>(step)];
    EXPECT_NEAR(m.loss, loss->loss_sum / static_cast<double>(loss->count), 2e-5) << "step " << step;
    EXPECT_NEAR(m.report_loss, loss->report_sum / loss->report_weight, 2e-5) << "step " << step;
  }
  double max_diff = 0;
  for (size_t i = 0; i < r.final_params.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(r.final_params[i] - model->params()[i])));
  }
  EXPECT_LT(max_diff, 1e-4);
}

TEST(Trainer, ResumeIsBitwiseIdenticalToAnUninterruptedRun) {
  const auto dir = std::filesystem::temp_directory_path() / "distca_train_resume_test";
  std::filesystem::remove_all(dir);
  TrainConfig c = small_config();
  c.steps = 12;
  c.checkpoint_dir = dir.string();
  c.checkpoint_every = 5;
  TrainResult straight;
  ASSERT_TRUE(run_training_local(c, {}, &straight).ok());
  ASSERT_EQ(straight.checkpoints_written, 3);  // steps 5, 10 and the end
  auto spec = c.model_spec();
  ASSERT_TRUE(spec.ok());
  auto ck = read_checkpoint((dir / "step-00000005.ckpt").string(), fingerprint(c, *spec));
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->step, 5);
  TrainConfig c2 = c;
  c2.checkpoint_dir = (dir / "resumed").string();
  c2.mode = TrainMode::kColocated;  // modes compute the same bits, so a resume may switch
  TrainHooks hooks;
  hooks.resume = &*ck;
  TrainResult resumed;
  ASSERT_TRUE(run_training_local(c2, hooks, &resumed).ok());
  ASSERT_EQ(resumed.steps.size(), 7u);
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(resumed.steps[i].step, straight.steps[i + 5].step);
    EXPECT_EQ(resumed.steps[i].loss, straight.steps[i + 5].loss) << i;
    EXPECT_EQ(resumed.steps[i].report_loss, straight.steps[i + 5].report_loss) << i;
  }
  EXPECT_TRUE(resumed.final_params == straight.final_params);
  // The final checkpoints agree byte for byte too.
  auto a = read_file((dir / "step-00000012.ckpt").string());
  auto b = read_file((dir / "resumed" / "step-00000012.ckpt").string());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == *b);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace distca::train

namespace distca::train {
namespace {

// The trainer runs OpenBLAS single-threaded (bitwise agreement with mpi) and gives the
// caller's setting back afterwards instead of leaving the process changed.
TEST(Blas, TrainingRestoresTheCallersBlasThreadCount) {
  const kernels::ScopedBlasThreads two(2);
  const int before = kernels::blas_threads();
  ASSERT_EQ(before, 2);  // this build's OpenBLAS honours the setting
  TrainConfig c = small_config();
  c.steps = 1;
  TrainResult r;
  ASSERT_TRUE(run_training_local(c, {}, &r).ok());
  EXPECT_EQ(kernels::blas_threads(), before);
}

// The one gemm wrapper refuses what cblas would mishandle (it prints and carries on): ints out
// of range and leading dimensions that do not fit the operand.
TEST(BlasDeathTest, GemmChecksDimensionsAgainstIntMax) {
  float a = 1, b = 1, c = 0;
  EXPECT_DEATH(kernels::gemm<float>(false, false, int64_t{1} << 31, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1),
               "gemm dimensions must be in \\[0, INT_MAX\\]");
  EXPECT_DEATH(kernels::gemm<float>(false, false, 1 << 17, 1 << 15, 1, 1.0f, &a, 1, &b, 1 << 15, 0.0f, &c, 1 << 15),
               "at most INT_MAX elements");
  EXPECT_DEATH(kernels::gemm<float>(false, false, 2, 2, 3, 1.0f, &a, 2, &b, 2, 0.0f, &c, 2), "lda");
  // In range: an ordinary product.
  const float x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {1, 0, 0, 1, 1, 1};
  float z[4] = {};
  kernels::gemm<float>(false, false, 2, 2, 3, 1.0f, x, 3, y, 2, 0.0f, z, 2);  // (2x3)(3x2)
  EXPECT_EQ(z[0], 4.0f);
  EXPECT_EQ(z[1], 5.0f);
  EXPECT_EQ(z[2], 10.0f);
  EXPECT_EQ(z[3], 11.0f);
}

}  // namespace
}  // namespace distca::train

namespace distca::train {
namespace {

// Saves an environment variable and puts it back (or removes it) at scope exit.
class SavedEnv {
 public:
  explicit SavedEnv(const char* name) : name_(name) {
    const char* v = std::getenv(name);
    had_ = v != nullptr;
    if (had_) value_.assign(v);
  }
  ~SavedEnv() {
    if (had_) {
      setenv(name_, value_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  SavedEnv(const SavedEnv&) = delete;
  SavedEnv& operator=(const SavedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string value_;
};

// One rank computes with the spare cores (an OpenMP team per rank) without changing a bit: the
// run with OMP_NUM_THREADS=2 ends with the losses and parameters of the run with 1. The team
// size each run really used is read inside the rank thread (on_step runs there).
TEST(Trainer, OneRankGivesTheSameBitsWithOneAndTwoThreads) {
  TrainConfig c = small_config();
  c.ranks = 1;
  c.model_overrides.hidden = 128;
  c.model_overrides.ffn = 256;
  c.model_overrides.vocab = 256;
  c.tokens_per_rank = 256;
  c.steps = 4;
  c.warmup = 1;
  const SavedEnv saved("OMP_NUM_THREADS");
  TrainResult runs[2];
  for (int t = 1; t <= 2; ++t) {
    // What the OpenMP runtime would have read from OMP_NUM_THREADS at start-up.
    ASSERT_EQ(setenv("OMP_NUM_THREADS", t == 1 ? "1" : "2", 1), 0);
    const kernels::ScopedComputeThreads as_read(t);
    int used = 0;
    TrainHooks hooks;
    hooks.on_step = [&](const StepMetrics&) { used = omp_get_max_threads(); };
    ASSERT_TRUE(run_training_local(c, hooks, &runs[t - 1]).ok());
    EXPECT_EQ(used, t);
  }
  ASSERT_EQ(runs[0].steps.size(), runs[1].steps.size());
  for (size_t i = 0; i < runs[0].steps.size(); ++i) {
    EXPECT_EQ(runs[0].steps[i].loss, runs[1].steps[i].loss) << "step " << i;
    EXPECT_EQ(runs[0].steps[i].grad_norm, runs[1].steps[i].grad_norm) << "step " << i;
  }
  EXPECT_TRUE(runs[0].final_params == runs[1].final_params);
}

// The policy: an explicit OMP_NUM_THREADS, then OPENBLAS_NUM_THREADS, else the usable cores
// shared among the ranks on this machine (at least one thread each).
TEST(Trainer, ThreadsPerRankPolicy) {
  const SavedEnv omp("OMP_NUM_THREADS"), blas("OPENBLAS_NUM_THREADS");
  unsetenv("OMP_NUM_THREADS");
  unsetenv("OPENBLAS_NUM_THREADS");
  const int cores = kernels::usable_cores();
  EXPECT_EQ(kernels::compute_threads_per_rank(1), cores);
  EXPECT_EQ(kernels::compute_threads_per_rank(2), std::max(1, cores / 2));
  EXPECT_EQ(kernels::compute_threads_per_rank(int64_t{cores} * 4), 1);
  setenv("OPENBLAS_NUM_THREADS", "3", 1);
  EXPECT_EQ(kernels::compute_threads_per_rank(64), 3);
  setenv("OMP_NUM_THREADS", "5", 1);
  {
    const kernels::ScopedComputeThreads as_read(5);
    EXPECT_EQ(kernels::compute_threads_per_rank(64), 5);
  }
}

}  // namespace
}  // namespace distca::train
