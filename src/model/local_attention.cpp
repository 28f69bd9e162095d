#include "distca/model/local_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <unordered_set>

#include "distca/kernels/attention.h"

namespace distca::model {

namespace {

// The kernel call over whole documents (one task per document, q = kv, causal): inputs and
// shapes; the caller sets the outputs (and the backward's gradients).
kernels::AttentionParams whole_document_params(const AttentionShape& shape, const std::vector<int32_t>& cu_seqlens,
                                               int32_t max_seqlen, const float* q, const float* k, const float* v) {
  kernels::AttentionParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.cu_seqlens_q = cu_seqlens.data();
  p.cu_seqlens_k = cu_seqlens.data();
  p.n_tasks = static_cast<int32_t>(cu_seqlens.size()) - 1;
  p.n_heads = static_cast<int32_t>(shape.n_heads);
  p.n_kv_heads = static_cast<int32_t>(shape.n_kv_heads);
  p.head_dim = static_cast<int32_t>(shape.head_dim);
  p.max_seqlen_q = max_seqlen;
  p.max_seqlen_k = max_seqlen;
  p.causal = true;
  return p;
}

// p[j - begin] = exp(scale * q_i . k_j - max) over the keys j in [begin, i] (the causal part of
// row i's segment; key j at k + j * stride + offset); returns their sum, in j order.
template <class T>
double causal_exp_row(const T* qi, const T* k, int64_t begin, int64_t i, int64_t stride, int64_t offset,
                      int64_t hd, double scale, double* p) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = begin; j <= i; ++j) {
    const T* kj = k + j * stride + offset;  // (head_dim)
    double dot = 0;
    for (int64_t c = 0; c < hd; ++c) dot += static_cast<double>(qi[c]) * kj[c];
    p[j - begin] = dot * scale;
    mx = std::max(mx, p[j - begin]);
  }
  double sum = 0;
  for (int64_t j = begin; j <= i; ++j) {
    p[j - begin] = std::exp(p[j - begin] - mx);
    sum += p[j - begin];
  }
  return sum;
}

}  // namespace

template <class T>
Result<LocalAttentionExecutor<T>> LocalAttentionExecutor<T>::create(
    int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, std::span<const Piece> pieces,
    LocalAttentionBackend backend) {
  if (n_heads <= 0) return Status::invalid_argument("n_heads must be positive");
  if (n_kv_heads <= 0) return Status::invalid_argument("n_kv_heads must be positive");
  if (head_dim <= 0) return Status::invalid_argument("head_dim must be positive");
  if (n_heads % n_kv_heads != 0) {
    return Status::invalid_argument("n_kv_heads (" + std::to_string(n_kv_heads) +
                                    ") must divide n_heads (" + std::to_string(n_heads) + ")");
  }
  if (backend == LocalAttentionBackend::kKernel && !std::is_same_v<T, float>) {
    return Status::invalid_argument("the kernel attention backend is fp32 only");
  }
  LocalAttentionExecutor e;
  e.backend_ = backend;
  e.shape_.n_heads = n_heads;
  e.shape_.n_kv_heads = n_kv_heads;
  e.shape_.head_dim = head_dim;
  DISTCA_RETURN_IF_ERROR(e.set_layout(pieces));
  return e;
}

template <class T>
Status LocalAttentionExecutor<T>::set_layout(std::span<const Piece> pieces) {
  std::vector<Segment> segs;
  std::unordered_set<int64_t> finished;  // documents whose run of rows has ended
  int64_t row = 0;
  int64_t cur_doc = -1;
  int64_t cur_next = 0;     // next expected offset in the current document
  int64_t cur_doc_len = 0;  // current document's length
  bool open = false;
  auto close = [&](size_t i) -> Status {
    if (cur_next != cur_doc_len) {
      return Status::invalid_argument(
          "piece " + std::to_string(i) + ": document " + std::to_string(cur_doc) + " has " +
          std::to_string(cur_next) + " of its " + std::to_string(cur_doc_len) +
          " tokens on this rank; documents split across ranks need the CA runtime");
    }
    finished.insert(cur_doc);
    open = false;
    return Status::ok_status();
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const std::string where = "piece " + std::to_string(i) + " (doc " + std::to_string(p.doc) + ")";
    if (p.len <= 0) return Status::invalid_argument(where + ": len must be positive");
    if (p.offset < 0 || p.doc_len < p.offset + p.len) {
      return Status::invalid_argument(where + ": offset/len outside doc_len");
    }
    if (open && p.doc == cur_doc) {
      if (p.offset != cur_next || p.doc_len != cur_doc_len) {
        return Status::invalid_argument(where + ": offset " + std::to_string(p.offset) +
                                        " does not continue the previous piece (expected " +
                                        std::to_string(cur_next) + ")");
      }
      cur_next += p.len;
      segs.back().end += p.len;
    } else {
      if (open) DISTCA_RETURN_IF_ERROR(close(i));
      if (finished.count(p.doc) != 0) {
        return Status::invalid_argument(where + ": the document's pieces are not adjacent in the "
                                        "local order");
      }
      if (p.offset != 0) {
        return Status::invalid_argument(
            where + ": starts at offset " + std::to_string(p.offset) +
            "; documents split across ranks need the CA runtime");
      }
      open = true;
      cur_doc = p.doc;
      cur_next = p.len;
      cur_doc_len = p.doc_len;
      segs.push_back({row, row + p.len});
    }
    row += p.len;
  }
  if (open) DISTCA_RETURN_IF_ERROR(close(pieces.size()));
  if (row > INT32_MAX) return Status::invalid_argument("pieces: more than 2^31 - 1 tokens");
  segments_ = std::move(segs);
  shape_.n_tokens = row;
  kept_.clear();
  lse_.clear();
  cu_seqlens_.assign(1, 0);
  max_seqlen_ = 0;
  for (const Segment& sg : segments_) {
    cu_seqlens_.push_back(static_cast<int32_t>(sg.end));
    max_seqlen_ = std::max(max_seqlen_, static_cast<int32_t>(sg.end - sg.begin));
  }
  if (backend_ == LocalAttentionBackend::kReference) {
    const auto kv_elems = static_cast<size_t>(row * shape_.n_kv_heads * shape_.head_dim);
    dk_acc_.assign(kv_elems, 0.0);
    dv_acc_.assign(kv_elems, 0.0);
    scratch_.assign(static_cast<size_t>(2 * std::max<int64_t>(row, 1)), 0.0);
  }
  return Status::ok_status();
}

template <class T>
Status LocalAttentionExecutor<T>::forward(int layer, const T* q, const T* k, const T* v, T* o) {
  if (layer < 0) return Status::invalid_argument("layer must be non-negative");
  if (static_cast<size_t>(layer) >= kept_.size()) kept_.resize(static_cast<size_t>(layer) + 1);
  const Kept kp{q, k, v, o};
  kept_[static_cast<size_t>(layer)] = kp;
  if (backend_ == LocalAttentionBackend::kKernel) return kernel_forward(layer, kp, o);
  return reference_forward(kp, o);
}

template <class T>
Status LocalAttentionExecutor<T>::reference_forward(const Kept& kp, T* o) {
  const T* q = kp.q;
  const T* k = kp.k;
  const T* v = kp.v;
  const int64_t nh = shape_.n_heads, nkv = shape_.n_kv_heads, hd = shape_.head_dim;
  const int64_t group = nh / nkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  double* p = scratch_.data();  // (segment length) probabilities of one query row
  std::vector<double> acc(static_cast<size_t>(hd));  // (head_dim)
  for (const Segment& s : segments_) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = s.begin; i < s.end; ++i) {
        const T* qi = q + (i * nh + h) * hd;  // (head_dim)
        const double sum = causal_exp_row(qi, k, s.begin, i, nkv * hd, kh * hd, hd, scale, p);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = s.begin; j <= i; ++j) {
          const T* vj = v + (j * nkv + kh) * hd;  // (head_dim)
          const double w = p[j - s.begin] / sum;
          for (int64_t c = 0; c < hd; ++c) acc[static_cast<size_t>(c)] += w * vj[c];
        }
        T* oi = o + (i * nh + h) * hd;  // (head_dim)
        for (int64_t c = 0; c < hd; ++c) oi[c] = static_cast<T>(acc[static_cast<size_t>(c)]);
      }
    }
  }
  return Status::ok_status();
}

template <class T>
Status LocalAttentionExecutor<T>::backward(int layer, const T* d_o, T* dq, T* dk, T* dv) {
  if (layer < 0 || static_cast<size_t>(layer) >= kept_.size() ||
      kept_[static_cast<size_t>(layer)].q == nullptr) {
    return Status::invalid_argument("attention backward of layer " + std::to_string(layer) +
                                    " before its forward");
  }
  const Kept& kp = kept_[static_cast<size_t>(layer)];
  if (backend_ == LocalAttentionBackend::kKernel) {
    return kernel_backward(layer, kp, d_o, dq, dk, dv);
  }
  return reference_backward(kp, d_o, dq, dk, dv);
}

template <class T>
Status LocalAttentionExecutor<T>::reference_backward(const Kept& kp, const T* d_o, T* dq, T* dk,
                                                     T* dv) {
  const int64_t nh = shape_.n_heads, nkv = shape_.n_kv_heads, hd = shape_.head_dim;
  const int64_t group = nh / nkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::fill(dk_acc_.begin(), dk_acc_.end(), 0.0);
  std::fill(dv_acc_.begin(), dv_acc_.end(), 0.0);
  const int64_t n = shape_.n_tokens;
  double* p = scratch_.data();       // (segment length) probabilities of one query row
  double* dp = scratch_.data() + n;  // (segment length) dO . v_j
  std::vector<double> dqi(static_cast<size_t>(hd));  // (head_dim)
  for (const Segment& s : segments_) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = s.begin; i < s.end; ++i) {
        const T* qi = kp.q + (i * nh + h) * hd;   // (head_dim)
        const T* doi = d_o + (i * nh + h) * hd;   // (head_dim)
        const double sum = causal_exp_row(qi, kp.k, s.begin, i, nkv * hd, kh * hd, hd, scale, p);
        // D = sum_j p_j (dO . v_j) = dO . o
        double big_d = 0;
        for (int64_t j = s.begin; j <= i; ++j) {
          p[j - s.begin] /= sum;
          const T* vj = kp.v + (j * nkv + kh) * hd;
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c) dot += static_cast<double>(doi[c]) * vj[c];
          dp[j - s.begin] = dot;
          big_d += p[j - s.begin] * dot;
        }
        std::fill(dqi.begin(), dqi.end(), 0.0);
        for (int64_t j = s.begin; j <= i; ++j) {
          const double pj = p[j - s.begin];
          const double ds = pj * (dp[j - s.begin] - big_d) * scale;  // d score_ij
          const T* kj = kp.k + (j * nkv + kh) * hd;
          double* dkj = dk_acc_.data() + (j * nkv + kh) * hd;
          double* dvj = dv_acc_.data() + (j * nkv + kh) * hd;
          for (int64_t c = 0; c < hd; ++c) {
            dqi[static_cast<size_t>(c)] += ds * kj[c];
            dkj[c] += ds * qi[c];
            dvj[c] += pj * doi[c];
          }
        }
        T* dq_row = dq + (i * nh + h) * hd;
        for (int64_t c = 0; c < hd; ++c) dq_row[c] = static_cast<T>(dqi[static_cast<size_t>(c)]);
      }
    }
  }
  for (size_t e = 0; e < dk_acc_.size(); ++e) {
    dk[e] = static_cast<T>(dk_acc_[e]);
    dv[e] = static_cast<T>(dv_acc_[e]);
  }
  return Status::ok_status();
}

template <class T>
Status LocalAttentionExecutor<T>::kernel_forward(int layer, const Kept& kp, T* o) {
  if constexpr (std::is_same_v<T, float>) {
    if (shape_.n_tokens == 0) return Status::ok_status();
    if (static_cast<size_t>(layer) >= lse_.size()) lse_.resize(static_cast<size_t>(layer) + 1);
    std::vector<float>& lse = lse_[static_cast<size_t>(layer)];  // (n_heads, n_tokens)
    lse.resize(static_cast<size_t>(shape_.n_heads * shape_.n_tokens));
    kernels::AttentionParams p = whole_document_params(shape_, cu_seqlens_, max_seqlen_, kp.q, kp.k, kp.v);
    p.o = o;
    p.lse = lse.data();
    DISTCA_RETURN_IF_ERROR(kernels::validate(p));
    kernels::attention_forward(p);
    return Status::ok_status();
  } else {
    (void)layer;
    (void)kp;
    (void)o;
    return Status::internal("kernel attention backend with a non-fp32 executor");
  }
}

template <class T>
Status LocalAttentionExecutor<T>::kernel_backward(int layer, const Kept& kp, const T* d_o, T* dq,
                                                  T* dk, T* dv) {
  if constexpr (std::is_same_v<T, float>) {
    if (shape_.n_tokens == 0) return Status::ok_status();
    if (static_cast<size_t>(layer) >= lse_.size()) {
      return Status::invalid_argument("attention backward of layer " + std::to_string(layer) +
                                      " before its forward");
    }
    kernels::AttentionParams p = whole_document_params(shape_, cu_seqlens_, max_seqlen_, kp.q, kp.k, kp.v);
    p.o = const_cast<float*>(kp.o);  // read only in backward (the params struct is shared)
    p.lse = lse_[static_cast<size_t>(layer)].data();
    p.d_o = d_o;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    DISTCA_RETURN_IF_ERROR(kernels::validate(p));
    kernels::attention_backward(p);
    return Status::ok_status();
  } else {
    (void)layer;
    (void)kp;
    (void)d_o;
    (void)dq;
    (void)dk;
    (void)dv;
    return Status::internal("kernel attention backend with a non-fp32 executor");
  }
}

template class LocalAttentionExecutor<float>;
template class LocalAttentionExecutor<double>;

}  // namespace distca::model
