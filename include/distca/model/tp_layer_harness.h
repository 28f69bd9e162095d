// One decoder layer's tensor-parallel forward and backward on fixed inputs, the attention
// itself left out: what `distca profile` times for the TP peers' wait (links.tp_wait,
// train/profile.cpp) and bench/bench_tp_overlap compares blocking against overlapped.
//
// Each run calls the layer's four TP functions of tensor_parallel.h in the trainer's order
// (tp_attention_in_forward, tp_attention_out_mlp_forward, tp_attention_out_mlp_backward,
// tp_attention_in_backward): with the collectives blocking, 4 all-gathers and 4
// reduce-scatters of `rows` rows over the group. The attention's output and the gradients of
// q, k, v are fixed random values (seeded: the same on every run and every machine), as are
// the weights (this rank's shard), the residual stream and the RoPE tables; d(out) is the
// output itself. Not thread-safe: one rank's buffers, one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "distca/comm/communicator.h"
#include "distca/core/specs.h"
#include "distca/core/status.h"
#include "distca/model/tensor_parallel.h"

namespace distca::model {

class TpLayerHarness {
 public:
  // Preconditions (checked): check_tp(spec, tp) holds, 0 <= rank < tp, rows >= tp.
  TpLayerHarness(const ModelSpec& spec, int tp, int rank, int64_t rows);

  // One forward and backward of the layer on `group` (size tp, this rank `rank`); overlap:
  // TpStep::overlap. Errors: the group's.
  Status run(comm::Communicator& group, bool overlap);

  // The last run's q, out, dx, d(o) and weight gradients, concatenated: the same bits
  // whether the run overlapped or not.
  std::vector<float> outputs() const;

  // Bytes one rank's harness of `rows` rows holds at its largest during run(), an upper
  // bound: its buffers (at the largest rank's share of the rows) and the layer functions'
  // temporaries (three (rows, hidden) buffers and a reduce-scatter's receive of them). For
  // the memory check before a profile starts. Preconditions as the constructor's.
  static double peak_bytes(const ModelSpec& spec, int tp, int64_t rows);

 private:
  TpDims d_;
  int64_t n_ = 0, nr_ = 0;
  std::vector<float> shard_, grad_, x_, rstd1_, xn1_, q_, k_, v_, o_, x_mid_, rstd2_, xn2_, g_, u_, a_, out_, dx_, d_o_,
      dq_, dk_, dv_, cos_, sin_;
};

}  // namespace distca::model
