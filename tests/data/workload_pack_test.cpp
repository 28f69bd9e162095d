// Packing, layouts, determinism, length files, option validation and the batch JSON format.
#include <algorithm>
#include <cstdint>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distca/core/rng.h"
#include "distca/cost/analytic.h"
#include "distca/data/workload.h"

namespace distca {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("distca_data_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

int64_t total_tokens(const Batch& b) {
  int64_t t = 0;
  for (int64_t r = 0; r < b.ranks; ++r) t += b.rank_tokens(r);
  return t;
}

// Random small configurations: both layouts conserve tokens, fill every rank exactly (the
// generator always draws enough documents), never overfill, and validate.
TEST(Packing, ConservesTokensAndNeverOverfills) {
  Rng pick(11);
  const char* dists[] = {"pretrain", "prolong", "fixed:40", "uniform:1:3000", "uniform:16:16"};
  for (int trial = 0; trial < 300; ++trial) {
    WorkloadOptions o;
    o.dist = dists[pick.uniform_int(5)];
    o.ranks = 1 + static_cast<int64_t>(pick.uniform_int(9));
    o.tokens_per_rank = 16 * (1 + static_cast<int64_t>(pick.uniform_int(512)));
    o.max_doc_len = pick.bernoulli(0.3) ? 16 + static_cast<int64_t>(pick.uniform_int(5000)) : 0;
    o.seed = pick.next_u64();
    o.batches = 2;
    for (Layout layout : {Layout::kContiguous, Layout::kHeadTail}) {
      o.layout = layout;
      auto batches = make_batches(o);
      ASSERT_TRUE(batches.ok()) << batches.status().to_string();
      for (const Batch& b : *batches) {
        ASSERT_TRUE(b.validate().ok()) << b.validate().to_string() << " dist " << o.dist;
        ASSERT_EQ(b.ranks, o.ranks);
        for (int64_t r = 0; r < b.ranks; ++r) ASSERT_EQ(b.rank_tokens(r), o.tokens_per_rank);
        const int64_t cap = o.max_doc_len / 16 * 16;
        for (const auto& rank : b.per_rank) {
          for (const Piece& p : rank) {
            ASSERT_EQ(p.doc_len % 16, 0);
            if (cap > 0) {
              ASSERT_LE(p.doc_len, cap);
            }
          }
        }
      }
    }
  }
}

TEST(Packing, ConservesGivenLengthsInOrder) {
  // pack_documents keeps every document that fits, in order, and cuts only the last one.
  Rng rng(12);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t ranks = 1 + static_cast<int64_t>(rng.uniform_int(6));
    const int64_t t = 1 + static_cast<int64_t>(rng.uniform_int(200));
    std::vector<int64_t> lengths(1 + rng.uniform_int(30));
    for (auto& l : lengths) l = 1 + static_cast<int64_t>(rng.uniform_int(300));
    const Batch b = pack_documents(lengths, ranks, t, Layout::kContiguous);
    ASSERT_TRUE(b.validate().ok()) << b.validate().to_string();
    int64_t sum = 0;
    for (auto l : lengths) sum += l;
    ASSERT_EQ(total_tokens(b), std::min(sum, ranks * t));
    // Reading ranks in order yields documents 0, 1, 2, ... each from offset 0 upwards.
    int64_t doc = 0, next = 0;
    for (const auto& rank : b.per_rank) {
      for (const Piece& p : rank) {
        if (p.doc != doc) {
          ASSERT_EQ(next, lengths[static_cast<size_t>(doc)]);
          ASSERT_EQ(p.doc, doc + 1);
          doc = p.doc;
          next = 0;
        }
        ASSERT_EQ(p.offset, next);
        next += p.len;
        // Only the document that crosses the end of the batch is cut, to what fits.
        int64_t before = 0;
        for (int64_t i = 0; i < doc; ++i) before += lengths[static_cast<size_t>(i)];
        ASSERT_EQ(p.doc_len, std::min(lengths[static_cast<size_t>(doc)], ranks * t - before));
      }
    }
    ASSERT_EQ(next, b.per_rank.back().empty() ? next : b.per_rank.back().back().doc_len);
  }
}

// The head-tail reference, written independently: per document spanning k >= 2 ranks with
// n_j tokens on its j-th rank, head_j = floor(n_j / 2 / 16) * 16 from the front in rank order
// and tail_j = n_j - head_j from the back in rank order. Returns, per (rank, doc), the set of
// token positions held.
std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> head_tail_reference(const Batch& contiguous) {
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> spans;  // doc -> (rank, n)
  std::map<int64_t, int64_t> doc_len;
  for (int64_t r = 0; r < contiguous.ranks; ++r) {
    for (const Piece& p : contiguous.per_rank[static_cast<size_t>(r)]) {
      spans[p.doc].push_back({r, p.len});
      doc_len[p.doc] = p.doc_len;
    }
  }
  std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> out;
  for (const auto& [doc, list] : spans) {
    if (list.size() == 1) {
      for (int64_t i = 0; i < doc_len[doc]; ++i) out[{list[0].first, doc}].insert(i);
      continue;
    }
    int64_t front = 0, back = doc_len[doc];
    for (const auto& [rank, n] : list) {
      const int64_t head = n / 32 * 16;
      for (int64_t i = 0; i < head; ++i) out[{rank, doc}].insert(front + i);
      for (int64_t i = 0; i < n - head; ++i) out[{rank, doc}].insert(back - 1 - i);
      front += head;
      back -= n - head;
    }
  }
  return out;
}

TEST(Packing, HeadTailMatchesReference) {
  Rng rng(13);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t ranks = 1 + static_cast<int64_t>(rng.uniform_int(6));
    const int64_t t = 16 * (1 + static_cast<int64_t>(rng.uniform_int(20)));
    std::vector<int64_t> lengths(1 + rng.uniform_int(10));
    for (auto& l : lengths) l = 16 * (1 + static_cast<int64_t>(rng.uniform_int(40)));
    const Batch c = pack_documents(lengths, ranks, t, Layout::kContiguous);
    const Batch h = pack_documents(lengths, ranks, t, Layout::kHeadTail);
    ASSERT_TRUE(h.validate().ok()) << h.validate().to_string();
    std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> got;
    for (int64_t r = 0; r < h.ranks; ++r) {
      ASSERT_EQ(h.rank_tokens(r), c.rank_tokens(r));
      // At most two pieces of one document per rank, each a multiple of 16 long here.
      std::map<int64_t, int> count;
      for (const Piece& p : h.per_rank[static_cast<size_t>(r)]) {
        ASSERT_LE(++count[p.doc], 2);
        ASSERT_EQ(p.offset % 16, 0);
        for (int64_t i = 0; i < p.len; ++i) ASSERT_TRUE((got[{r, p.doc}].insert(p.offset + i).second));
      }
    }
    ASSERT_EQ(got, head_tail_reference(c));
  }
}

TEST(Packing, HeadTailWorkedExample) {
  // docs/workloads.md: 3 ranks of 128 tokens, documents of 64 and 320 tokens.
  const Batch h = pack_documents({64, 320}, 3, 128, Layout::kHeadTail);
  const std::vector<std::vector<Piece>> expected = {
      {{0, 0, 64, 64}, {1, 0, 32, 320}, {1, 288, 32, 320}},
      {{1, 32, 64, 320}, {1, 224, 64, 320}},
      {{1, 96, 128, 320}},
  };
  EXPECT_EQ(h.per_rank, expected);
}

TEST(Workload, SameSeedSameBatchesAndStreamsAreIndependent) {
  for (const char* dist : {"pretrain", "prolong", "uniform:16:5000"}) {
    WorkloadOptions o;
    o.dist = dist;
    o.ranks = 4;
    o.tokens_per_rank = 65536;
    o.batches = 3;
    auto a = make_batches(o), b = make_batches(o);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b) << dist;
    // Asking for more batches leaves the earlier ones unchanged.
    o.batches = 5;
    auto c = make_batches(o);
    ASSERT_TRUE(c.ok());
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ((*a)[i], (*c)[i]) << dist;
    EXPECT_NE((*c)[3], (*c)[4]) << dist;
    o.seed = 43;
    auto d = make_batches(o);
    ASSERT_TRUE(d.ok());
    EXPECT_NE((*a)[0], (*d)[0]) << dist;
  }
}

TEST(Workload, PairCountsEqualBruteForce) {
  // Co-located attention pairs of every piece (its queries over the document prefix), through
  // causal_pairs, against a double loop over (query, key) positions.
  WorkloadOptions o;
  o.dist = "uniform:1:200";
  o.ranks = 5;
  o.tokens_per_rank = 256;
  o.batches = 20;
  for (Layout layout : {Layout::kContiguous, Layout::kHeadTail}) {
    o.layout = layout;
    auto batches = make_batches(o);
    ASSERT_TRUE(batches.ok());
    for (const Batch& b : *batches) {
      int64_t all_fast = 0;
      for (const auto& rank : b.per_rank) {
        for (const Piece& p : rank) {
          int64_t brute = 0;
          for (int64_t q = p.offset; q < p.offset + p.len; ++q) {
            for (int64_t k = 0; k < p.doc_len; ++k) brute += k <= q;
          }
          ASSERT_EQ(causal_pairs(p.offset, p.offset + p.len), brute);
          all_fast += causal_pairs(p.offset, p.offset + p.len);
        }
      }
      // Summed over a batch, the pieces give every document's full triangle.
      int64_t docs = 0;
      std::map<int64_t, int64_t> lens;
      for (const auto& rank : b.per_rank) for (const Piece& p : rank) lens[p.doc] = p.doc_len;
      for (auto [d, l] : lens) docs += l * (l + 1) / 2;
      ASSERT_EQ(all_fast, docs);
    }
  }
}

TEST(Workload, LengthFilesInBothFormats) {
  const std::string json = temp_path("lens.json"), lines = temp_path("lens.txt");
  write(json, "[100, 70000, 5, 3000]");
  write(lines, "100\n70000\n\n 5 \r\n3000\n");
  std::vector<std::vector<Batch>> results;
  for (const auto& path : {json, lines}) {
    WorkloadOptions o;
    o.dist = "file:" + path;
    o.ranks = 2;
    o.tokens_per_rank = 65536 * 2;  // elongation 2
    o.batches = 4;
    auto d = LengthDistribution::create(o);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_DOUBLE_EQ(d->elongation(), 2.0);
    Rng rng(14);
    std::set<int64_t> base, final_lengths;
    int longs = 0;
    for (int i = 0; i < 20000; ++i) {
      base.insert(d->sample_base(rng));
      const int64_t l = d->sample(rng);
      final_lengths.insert(l);
      longs += l == 140000;
    }
    EXPECT_EQ(base, (std::set<int64_t>{5, 100, 3000, 70000}));
    // Elongated by 2 and rounded up to 16.
    EXPECT_EQ(final_lengths, (std::set<int64_t>{16, 208, 6000, 140000}));
    // One long in four: reweighted share 4 * 0.25 / (0.5 * 0.75 + 4 * 0.25) = 0.727 (+- 0.02).
    EXPECT_NEAR(longs / 20000.0, 1.0 / 1.375, 0.02);
    auto b = make_batches(o);
    ASSERT_TRUE(b.ok());
    results.push_back(std::move(b).value());
  }
  // Both formats hold the same lengths, so the same seed gives the same batches.
  EXPECT_EQ(results[0], results[1]);
  std::filesystem::remove(json);
  std::filesystem::remove(lines);
}

Status create_status(const std::string& dist, int64_t ranks = 2, int64_t tpr = 1024, int64_t cap = 0,
                     int64_t batches = 1, double long_prob = 0.3) {
  WorkloadOptions o;
  o.dist = dist;
  o.ranks = ranks;
  o.tokens_per_rank = tpr;
  o.max_doc_len = cap;
  o.batches = batches;
  o.prolong_long_prob = long_prob;
  auto d = make_batches(o);
  return d.ok() ? Status() : d.status();
}

void expect_error(const Status& st, const std::string& flag) {
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(flag), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
}

TEST(Workload, BadOptionsNameTheFlag) {
  expect_error(create_status("foo"), "--dist");
  expect_error(create_status("fixed:0"), "--dist");
  expect_error(create_status("fixed:-5"), "--dist");
  expect_error(create_status("fixed:abc"), "--dist");
  expect_error(create_status("uniform:5"), "--dist");
  expect_error(create_status("uniform:9:3"), "--dist");
  expect_error(create_status("uniform:0:3"), "--dist");
  expect_error(create_status("file:"), "--dist");
  expect_error(create_status("pretrain", 0), "--ranks");
  expect_error(create_status("pretrain", -3), "--ranks");
  expect_error(create_status("pretrain", 2, 0), "--tokens-per-rank");
  expect_error(create_status("pretrain", 2, -16), "--tokens-per-rank");
  expect_error(create_status("pretrain", 2, 100), "--tokens-per-rank");
  expect_error(create_status("pretrain", 2, 8), "--tokens-per-rank");
  expect_error(create_status("pretrain", int64_t{1} << 20, int64_t{1} << 30), "--ranks");
  expect_error(create_status("pretrain", 2, 1024, 15), "--max-doc-len");
  expect_error(create_status("pretrain", 2, 1024, -1), "--max-doc-len");
  expect_error(create_status("pretrain", 2, 1024, 0, 0), "--batches");
  expect_error(create_status("prolong", 2, 1024, 0, 1, 1.5), "--long-prob");
  expect_error(create_status("prolong", 2, 1024, 0, 1, -0.1), "--long-prob");
  EXPECT_FALSE(parse_layout("diagonal").ok());
  expect_error(parse_layout("diagonal").status(), "--layout");

  const std::string missing = temp_path("missing.json");
  expect_error(create_status("file:" + missing), "--dist file:");
  const std::string bad = temp_path("bad.txt");
  write(bad, "10\n20\n\n30\n40\n50\nseven\n");
  auto st = create_status("file:" + bad);
  expect_error(st, "--dist file:");
  EXPECT_NE(st.message().find("line 7"), std::string::npos) << st.message();
  write(bad, "[1, 2, -3]");
  expect_error(create_status("file:" + bad), "element 2");
  write(bad, "[1, 2,");
  expect_error(create_status("file:" + bad), "not valid JSON");
  write(bad, "\n\n");
  expect_error(create_status("file:" + bad), "no lengths");
  std::filesystem::remove(bad);
}

TEST(BatchJson, RoundTrip) {
  WorkloadOptions o;
  o.dist = "pretrain";
  o.ranks = 4;
  o.tokens_per_rank = 32768;
  o.layout = Layout::kHeadTail;
  o.batches = 5;
  auto batches = make_batches(o);
  ASSERT_TRUE(batches.ok());
  for (const Batch& b : *batches) {
    nlohmann::json j = batch_to_json(b);
    j["comment"] = "unknown keys are ignored";
    auto back = batch_from_json(nlohmann::json::parse(j.dump()));
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, b);
  }
}

// Thousands of random mutations of a valid batch document: the reader never crashes, and
// either accepts a batch that validates or returns one line.
TEST(BatchJson, FuzzedDocumentsAreAcceptedValidOrRefusedInOneLine) {
  const Batch seed_batch = pack_documents({40, 300, 16, 90, 7}, 3, 160, Layout::kHeadTail);
  const nlohmann::json valid = batch_to_json(seed_batch);
  Rng rng(15);
  const nlohmann::json values[] = {0, -1, 1, 16, 159, 160, 161, 1 << 30, int64_t{1} << 62, INT64_MAX, UINT64_MAX, 2.5, "x", nullptr,
                                   nlohmann::json::array(), nlohmann::json::object(), true};
  const char* keys[] = {"doc", "offset", "len", "doc_len"};
  int accepted = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    nlohmann::json j = valid;
    const int mutations = 1 + static_cast<int>(rng.uniform_int(3));
    for (int m = 0; m < mutations; ++m) {
      auto& pr = j["per_rank"];
      const auto v = values[rng.uniform_int(std::size(values))];
      switch (rng.uniform_int(9)) {
        case 8:
          // A huge piece that is inside its own document: only the rank budget refuses it.
          if (pr.is_array() && !pr.empty() && pr[0].is_array()) {
            pr[0].push_back({{"doc", 99}, {"offset", 0}, {"len", int64_t{1} << 62}, {"doc_len", int64_t{1} << 62}});
          }
          break;
        case 0: j["ranks"] = v; break;
        case 1: j["tokens_per_rank"] = v; break;
        case 2: j.erase(rng.bernoulli(0.5) ? "ranks" : "per_rank"); break;
        case 3:
          if (pr.is_array() && !pr.empty()) pr.erase(rng.uniform_int(pr.size()));
          break;
        case 4:
          if (pr.is_array() && !pr.empty()) {
            auto& rank = pr[rng.uniform_int(pr.size())];
            if (rank.is_array() && !rank.empty()) {
              auto& piece = rank[rng.uniform_int(rank.size())];
              if (piece.is_object()) piece[keys[rng.uniform_int(4)]] = v;
            }
          }
          break;
        case 5:
          if (pr.is_array() && !pr.empty()) {
            auto& rank = pr[rng.uniform_int(pr.size())];
            if (rank.is_array() && !rank.empty()) rank.erase(rng.uniform_int(rank.size()));
          }
          break;
        case 6:
          if (pr.is_array() && !pr.empty()) pr[rng.uniform_int(pr.size())] = v;
          break;
        default:
          if (pr.is_array() && pr.size() >= 2) {
            const size_t a = rng.uniform_int(pr.size()), b = rng.uniform_int(pr.size());
            if (pr[a].is_array() && !pr[a].empty() && pr[b].is_array()) {
              pr[b].push_back(pr[a].back());
              pr[a].erase(pr[a].size() - 1);
            }
          }
      }
    }
    auto r = batch_from_json(j);
    if (r.ok()) {
      ++accepted;
      EXPECT_TRUE(r->validate().ok());
    } else {
      EXPECT_FALSE(r.status().message().empty());
      EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
    }
  }
  // Moving a piece between ranks that have room keeps a batch valid, so some are accepted.
  EXPECT_GT(accepted, 0);
}

// The reference corpora, when present: file:PATH reads them, and the generators' base
// quantiles agree with the files' own (pretrain p10-p90 within 2%, prolong within 3%).
TEST(SharedData, GeneratorsMatchReferenceFiles) {
  const std::string dir = DISTCA_SHARED_DATA_DIR;
  for (const char* name : {"pretrain", "prolong"}) {
    const std::string path = dir + "/doclens-" + name + ".json";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " absent";
    WorkloadOptions o;
    o.dist = std::string("file:") + path;
    o.ranks = 8;
    o.tokens_per_rank = 131072;
    auto file_dist = LengthDistribution::create(o);
    ASSERT_TRUE(file_dist.ok()) << file_dist.status().to_string();
    o.dist = name;
    auto fit = LengthDistribution::create(o);
    ASSERT_TRUE(fit.ok());
    std::vector<double> a(400000), b(400000);
    Rng ra(16), rb(17);
    for (auto& x : a) x = static_cast<double>(file_dist->sample_base(ra));
    for (auto& x : b) x = static_cast<double>(fit->sample_base(rb));
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    const double tol = std::string(name) == "pretrain" ? 0.02 : 0.03;
    for (double p : {0.10, 0.25, 0.50, 0.75, 0.90}) {
      const double qa = a[static_cast<size_t>(p * (a.size() - 1))], qb = b[static_cast<size_t>(p * (b.size() - 1))];
      EXPECT_NEAR(qb, qa, tol * qa) << name << " p" << p * 100;
    }
    o.dist = std::string("file:") + path;
    auto batches = make_batches(o);
    ASSERT_TRUE(batches.ok());
    EXPECT_TRUE((*batches)[0].validate().ok());
  }
}

}  // namespace
}  // namespace distca
