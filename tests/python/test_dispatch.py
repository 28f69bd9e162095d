"""The layout arrays drive a whole CAD attention layer: every rank's exchanges emulated in
one process (an all-to-all-v is a copy of row ranges by counts and displacements), the fused
call gathered by q_source / kv_source, forward and backward, checked against whole-document
attention (distca.attention_* on each document alone). This is the recipe of
docs/python.md ("The arrays of a plan") run end to end."""

import numpy as np
import pytest

import distca
from layout_reference import token_rows

H, HKV, D = 4, 2, 16


def all_to_all(plan, kind, send):
    """send[r]: rank r's send buffer of `kind`; returns every rank's receive buffer."""
    exs = [plan.exchange(r, kind) for r in range(plan.ranks)]
    shape = send[0].shape[1:]
    recv = [np.zeros((e.recv_counts.sum(), *shape), np.float32) for e in exs]
    for s, es in enumerate(exs):
        for p in range(plan.ranks):
            n = es.send_counts[p]
            if n:
                ep = exs[p]
                assert ep.recv_counts[s] == n
                recv[p][ep.recv_displs[s]:ep.recv_displs[s] + n] = send[s][es.send_displs[p]:es.send_displs[p] + n]
    return recv


def whole_documents(batch, q, k, v, d_o):
    """Per document, attention over its rows in position order; returns per rank arrays
    (o, dq, dk, dv) laid out like the rank's token buffer."""
    rows = token_rows(batch)
    out = [[np.zeros_like(x[r]) for r in range(len(rows))] for x in (q, q, k, k)]
    by_doc = {}
    for r, ids in enumerate(rows):
        for i, (d, pos) in enumerate(ids.tolist()):
            by_doc.setdefault(d, {})[pos] = (r, i)
    # One varlen call, one task per whole document (q_len == kv_len == its length).
    idx = [where[pos] for d in sorted(by_doc) for where in [by_doc[d]] for pos in range(len(where))]
    lens = [len(by_doc[d]) for d in sorted(by_doc)]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    take = lambda xs: np.stack([xs[r][i] for r, i in idx])  # noqa: E731
    o, lse = distca.attention_forward(take(q), take(k), take(v), cu, cu)
    res = (o, *distca.attention_backward(take(q), take(k), take(v), o, lse, take(d_o), cu, cu))
    for row, (r, i) in enumerate(idx):
        for j in range(4):
            out[j][r][i] = res[j][row]
    return out


@pytest.mark.parametrize("scheduler,layout", [("cad", "contiguous"), ("percp:2", "head-tail"),
                                              ("cad-symmetric", "contiguous")])
def test_cad_layer_matches_whole_documents(scheduler, layout):
    batch = distca.workload(dist="pretrain", ranks=4, tokens_per_rank=2048, layout=layout, seed=11)
    plan = distca.plan(batch, model="tiny", scheduler=scheduler, tolerance=0.02)
    R = plan.ranks
    rng = np.random.default_rng(0)
    T = [plan.tokens(r) for r in range(R)]
    q = [rng.standard_normal((t, H, D), dtype=np.float32) for t in T]
    k = [rng.standard_normal((t, HKV, D), dtype=np.float32) for t in T]
    v = [rng.standard_normal((t, HKV, D), dtype=np.float32) for t in T]
    d_o = [rng.standard_normal((t, H, D), dtype=np.float32) for t in T]
    ex = lambda r, kind: plan.exchange(r, kind)  # noqa: E731

    # Forward: Q and K/V out, the fused call, O back.
    q_recv = all_to_all(plan, "q", [q[r][ex(r, "q").send_local] for r in range(R)])
    k_recv = all_to_all(plan, "kv", [k[r][ex(r, "kv").send_local] for r in range(R)])
    v_recv = all_to_all(plan, "kv", [v[r][ex(r, "kv").send_local] for r in range(R)])
    o_send, o_home, keep = [], [], []
    for r in range(R):
        srv = plan.server(r)
        fq = np.concatenate([q[r], q_recv[r]])[srv.q_source]
        fk = np.concatenate([k[r], k_recv[r]])[srv.kv_source]
        fv = np.concatenate([v[r], v_recv[r]])[srv.kv_source]
        fo, lse = distca.attention_forward(fq, fk, fv, srv.cu_seqlens_q, srv.cu_seqlens_k)
        keep.append((fq, fk, fv, fo, lse))
        o_all = np.zeros((T[r] + ex(r, "o_lse").send_counts.sum(), H, D), np.float32)
        o_all[srv.q_source] = fo
        o_home.append(o_all[:T[r]].copy())
        o_send.append(o_all[T[r]:])
    o_recv = all_to_all(plan, "o_lse", o_send)
    for r in range(R):
        o_home[r][ex(r, "o_lse").recv_local] = o_recv[r]

    # Backward: dO out, dQ and the dK/dV partials back (home sums its own first, then peers
    # ascending: the receive buffer's order).
    do_recv = all_to_all(plan, "do", [d_o[r][ex(r, "do").send_local] for r in range(R)])
    dq_send, dkv_send, dq_home, dk_home, dv_home = [], [], [], [], []
    for r in range(R):
        srv = plan.server(r)
        fq, fk, fv, fo, lse = keep[r]
        fdo = np.concatenate([d_o[r], do_recv[r]])[srv.q_source]
        fdq, fdk, fdv = distca.attention_backward(fq, fk, fv, fo, lse, fdo, srv.cu_seqlens_q, srv.cu_seqlens_k)
        dq_all = np.zeros((T[r] + ex(r, "dq").send_counts.sum(), H, D), np.float32)
        dq_all[srv.q_source] = fdq
        dk_all = np.zeros((T[r] + ex(r, "dkv").send_counts.sum(), HKV, D), np.float32)
        dv_all = np.zeros_like(dk_all)
        np.add.at(dk_all, srv.kv_source, fdk)
        np.add.at(dv_all, srv.kv_source, fdv)
        dq_home.append(dq_all[:T[r]].copy())
        dk_home.append(dk_all[:T[r]].copy())
        dv_home.append(dv_all[:T[r]].copy())
        dq_send.append(dq_all[T[r]:])
        dkv_send.append((dk_all[T[r]:], dv_all[T[r]:]))
    dq_recv = all_to_all(plan, "dq", dq_send)
    dk_recv = all_to_all(plan, "dkv", [a for a, _ in dkv_send])
    dv_recv = all_to_all(plan, "dkv", [b for _, b in dkv_send])
    for r in range(R):
        dq_home[r][ex(r, "dq").recv_local] = dq_recv[r]
        # Rows of one peer are distinct; np.add.at also sums a row received from several.
        np.add.at(dk_home[r], ex(r, "dkv").recv_local, dk_recv[r])
        np.add.at(dv_home[r], ex(r, "dkv").recv_local, dv_recv[r])

    want = whole_documents(plan.batch, q, k, v, d_o)
    for name, got, ref in (("o", o_home, want[0]), ("dq", dq_home, want[1]), ("dk", dk_home, want[2]),
                           ("dv", dv_home, want[3])):
        for r in range(R):
            np.testing.assert_allclose(got[r], ref[r], rtol=2e-4, atol=2e-5, err_msg=f"{name} rank {r}")
