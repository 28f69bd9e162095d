#include "distca/cost/cost_model.h"

#include "distca/cost/analytic.h"

namespace distca {

double PairsCostModel::task_cost(int64_t q_len, int64_t kv_len) const {
  return static_cast<double>(task_pairs(q_len, kv_len));
}

}  // namespace distca
