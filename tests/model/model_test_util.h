// Shared fixtures for the model tests: the tiny configuration and a packed set of documents.
#pragma once

#include <cstdint>
#include <vector>

#include <memory>
#include <span>
#include <string>

#include "distca/comm/communicator.h"
#include "distca/core/rng.h"
#include "distca/core/specs.h"
#include "distca/data/batch.h"
#include "distca/model/llama.h"
#include "distca/model/tensor_parallel.h"

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

// Forwards the collectives to `inner`, counting them: every blocking collective of the base
// class (all_gather, all_reduce_sum, ...) runs on all_to_all_v, so `calls` is the group's
// blocking collectives; the overlapped ones are point-to-point messages on kTpOverlapTag
// (counted with their bytes; any other tag is refused).
class CountingCommunicator final : public comm::Communicator {
 public:
  explicit CountingCommunicator(comm::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }
  Status barrier() override { return ++calls, inner_.barrier(); }
  Status all_to_all_v(const comm::AllToAllV& a) override { return ++calls, inner_.all_to_all_v(a); }
  Result<std::unique_ptr<comm::Exchange>> start_all_to_all_v(const comm::AllToAllV& a) override {
    return ++calls, inner_.start_all_to_all_v(a);
  }
  Result<std::unique_ptr<comm::Exchange>> start_send(std::span<const std::byte> data, int peer, int tag,
                                                     const char* label) override {
    if (tag != kTpOverlapTag) return Status::internal("start_send: not a TP collective");
    ++sends;
    send_bytes += static_cast<int64_t>(data.size());
    return inner_.start_send(data, peer, tag, label);
  }
  Result<std::unique_ptr<comm::Exchange>> start_recv(std::span<std::byte> data, int peer, int tag,
                                                     const char* label) override {
    if (tag != kTpOverlapTag) return Status::internal("start_recv: not a TP collective");
    ++recvs;
    return inner_.start_recv(data, peer, tag, label);
  }
  void fail(const Status& cause) override { inner_.fail(cause); }
  int64_t calls = 0, sends = 0, recvs = 0, send_bytes = 0;

 private:
  comm::Communicator& inner_;
};

}  // namespace distca::model::testing
