"""distca.attention_forward / attention_backward against a NumPy float64 reference: causal
bottom-right masking over several tasks of unequal q_len <= kv_len, GQA, non-causal, a custom
scale, and the argument checks."""

import numpy as np
import pytest

import distca


def reference(q, k, v, cu_q, cu_k, causal, scale, d_o):
    """Per task: softmax(scale * q k^T) v with the bottom-right causal mask; the gradients by
    the textbook formulas. float64 throughout."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    group = n_heads // n_kv
    q, k, v, d_o = (x.astype(np.float64) for x in (q, k, v, d_o))
    o = np.zeros_like(q)
    lse = np.zeros((n_heads, q.shape[0]))
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for t in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[t], cu_q[t + 1]), slice(cu_k[t], cu_k[t + 1])
        q_len, kv_len = cu_q[t + 1] - cu_q[t], cu_k[t + 1] - cu_k[t]
        mask = np.ones((q_len, kv_len), bool)
        if causal:
            mask = np.arange(kv_len)[None, :] <= (kv_len - q_len + np.arange(q_len))[:, None]
        for h in range(n_heads):
            g = h // group
            s = scale * q[qs, h] @ k[ks, g].T
            s = np.where(mask, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            z = p.sum(axis=1, keepdims=True)
            p /= z
            o[qs, h] = p @ v[ks, g]
            lse[h, qs] = (m + np.log(z))[:, 0]
            dp = d_o[qs, h] @ v[ks, g].T
            ds = p * (dp - (dp * p).sum(axis=1, keepdims=True))
            dq[qs, h] = scale * ds @ k[ks, g]
            dk[ks, g] += scale * ds.T @ q[qs, h]
            dv[ks, g] += p.T @ d_o[qs, h]
    return o, lse, dq, dk, dv


@pytest.mark.parametrize("n_heads,n_kv,causal,scale", [(4, 4, True, 0.0), (4, 2, True, 0.0), (2, 1, False, 0.3)])
def test_matches_numpy_reference(n_heads, n_kv, causal, scale):
    rng = np.random.default_rng(5)
    q_lens, kv_lens = [37, 1, 64, 100], [37, 90, 130, 100]
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    d = 32
    q = rng.standard_normal((cu_q[-1], n_heads, d), dtype=np.float32)
    k = rng.standard_normal((cu_k[-1], n_kv, d), dtype=np.float32)
    v = rng.standard_normal((cu_k[-1], n_kv, d), dtype=np.float32)
    d_o = rng.standard_normal(q.shape, dtype=np.float32)
    o, lse = distca.attention_forward(q, k, v, cu_q, cu_k, causal=causal, softmax_scale=scale)
    assert o.dtype == lse.dtype == np.float32 and o.shape == q.shape and lse.shape == (n_heads, q.shape[0])
    dq, dk, dv = distca.attention_backward(q, k, v, o, lse, d_o, cu_q, cu_k, causal=causal, softmax_scale=scale)
    eff = scale or 1 / np.sqrt(d)
    ro, rlse, rdq, rdk, rdv = reference(q, k, v, cu_q, cu_k, causal, eff, d_o)
    for name, got, want in (("o", o, ro), ("lse", lse, rlse), ("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5, err_msg=name)


def test_deterministic_and_noncontiguous_input():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((48, 2, 16), dtype=np.float32)
    kv = rng.standard_normal((48, 2, 32), dtype=np.float32)
    k, v = kv[:, :, :16], kv[:, :, 16:]  # strided views are accepted (copied to C order)
    cu = np.array([0, 16, 48], np.int32)
    a = distca.attention_forward(q, k, v, cu, cu)
    b = distca.attention_forward(q, np.ascontiguousarray(k), np.ascontiguousarray(v), cu, cu)
    assert all((x == y).all() for x, y in zip(a, b))


def test_argument_checks():
    q = np.zeros((8, 2, 16), np.float32)
    cu = np.array([0, 8], np.int32)
    with pytest.raises(ValueError, match=r"^q: expected dtype float32, got float64$"):
        distca.attention_forward(q.astype(np.float64), q, q, cu, cu)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected dtype int32"):
        distca.attention_forward(q, q, q, cu.astype(np.int64), cu)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: last entry 4 must equal total_q 8 \(rows of q\)$"):
        distca.attention_forward(q, q, q, np.array([0, 4], np.int32), cu)
    with pytest.raises(ValueError):  # causal needs q_len <= kv_len (kernels::validate)
        distca.attention_forward(q, q[:4], q[:4], cu, np.array([0, 4], np.int32))
    with pytest.raises(ValueError, match="n_kv_heads"):
        distca.attention_forward(np.zeros((8, 3, 16), np.float32), q, q, cu, cu)
    with pytest.raises(ValueError, match=r"^lse: shape \(8, 2\) differs from \(n_heads, total_q\) = \(2, 8\)$"):
        distca.attention_backward(q, q, q, q, np.zeros((8, 2), np.float32), q, cu, cu)
