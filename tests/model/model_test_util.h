// Shared fixtures for the model tests: the tiny configuration and a packed set of documents.
#pragma once

#include <cstdint>
#include <vector>

#include "distca/core/rng.h"
#include "distca/core/specs.h"
#include "distca/data/batch.h"
#include "distca/model/llama.h"

namespace distca::model::testing {

// 2 layers, hidden 32, 4 heads, 2 kv heads, head_dim 8, ffn 48, vocab 37.
inline ModelSpec tiny_spec() {
  ModelSpec s;
  s.name = "test-tiny";
  s.n_layers = 2;
  s.hidden = 32;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.ffn = 48;
  s.vocab = 37;
  return s;
}

// One rank's local tokens: documents placed one after another, each wholly local.
struct Packed {
  std::vector<Piece> pieces;
  std::vector<int32_t> tokens;     // (n)
  std::vector<int32_t> positions;  // (n)
  std::vector<int32_t> targets;    // (n), -1 at each document's last token
  StepInputs inputs() const { return {tokens, positions, targets, {}}; }
};

// Appends a document of the given tokens (ids), logical positions start.. (start > 0 only
// for the RoPE tests: the piece itself is recorded as a whole document).
inline void append_doc(Packed& p, int64_t doc_id, const std::vector<int32_t>& ids,
                       int32_t start = 0) {
  const auto len = static_cast<int64_t>(ids.size());
  p.pieces.push_back({doc_id, 0, len, len});
  for (int64_t i = 0; i < len; ++i) {
    p.tokens.push_back(ids[static_cast<size_t>(i)]);
    p.positions.push_back(start + static_cast<int32_t>(i));
    p.targets.push_back(i + 1 < len ? ids[static_cast<size_t>(i + 1)] : -1);
  }
}

inline std::vector<int32_t> random_ids(Rng& rng, int64_t len, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(len));
  for (auto& t : ids) t = static_cast<int32_t>(rng.uniform_int(static_cast<uint64_t>(vocab)));
  return ids;
}

// Three documents of lengths 17, 13 and 10 (40 tokens).
inline Packed three_docs(uint64_t seed, int64_t vocab) {
  Rng rng(seed, 99);
  Packed p;
  append_doc(p, 0, random_ids(rng, 17, vocab));
  append_doc(p, 1, random_ids(rng, 13, vocab));
  append_doc(p, 2, random_ids(rng, 10, vocab));
  return p;
}

// Randomises the norm gains around 1 so the gradient checks see gains that matter.
template <class T>
void perturb_gains(Llama<T>& m, uint64_t seed) {
  Rng rng(seed, 7);
  for (const TensorInfo& t : m.layout()) {
    if (t.decay) continue;
    for (int64_t e = 0; e < t.size(); ++e) {
      m.params()[static_cast<size_t>(t.offset + e)] = static_cast<T>(rng.uniform(0.5, 1.5));
    }
  }
}

}  // namespace distca::model::testing
