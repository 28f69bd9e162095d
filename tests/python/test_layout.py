"""The plan's NumPy arrays against the validator's rules (plan/validate.h), recomputed in
Python from the batch and the tasks (layout_reference.py): counts, displacements, no self
traffic, sender == receiver lists, the canonical row order, the mirrors, the fused call's
cu_seqlens and gather indices, coverage, and that the arrays are read-only views."""

import gc

import numpy as np
import pytest

import distca
from layout_reference import canonical_receives, rows_of, token_rows

SCHEDULERS = ["cad", "colocated", "wlb", "percp:2", "cad-symmetric"]


@pytest.fixture(scope="module", params=SCHEDULERS)
def planned(request):
    batch = distca.workload(dist="pretrain", ranks=8, tokens_per_rank=4096, layout="head-tail", seed=3)
    p = distca.plan(batch, model="tiny", scheduler=request.param, tolerance=0.02)
    p.validate()
    return p, p.batch  # wlb: local rows refer to its re-packed batch


def buffers(e, side):
    counts, displs = getattr(e, f"{side}_counts"), getattr(e, f"{side}_displs")
    rows = getattr(e, f"{side}_rows")
    return {peer: rows[displs[peer]:displs[peer] + counts[peer]] for peer in range(len(counts))}


def test_counts_displs_self(planned):
    p, _ = planned
    for r in range(p.ranks):
        for kind in distca.EXCHANGES:
            e = p.exchange(r, kind)
            for side in ("send", "recv"):
                c, d = getattr(e, f"{side}_counts"), getattr(e, f"{side}_displs")
                assert c.shape == d.shape == (p.ranks,) and c.dtype == d.dtype == np.int64
                assert c[r] == 0, "no self traffic"
                assert (d == np.concatenate([[0], np.cumsum(c)[:-1]])).all()
                assert getattr(e, f"{side}_rows").shape == (c.sum(), 2)
                assert getattr(e, f"{side}_local").shape == (c.sum(),)


def test_sender_equals_receiver(planned):
    p, _ = planned
    for kind in distca.EXCHANGES:
        sends = [buffers(p.exchange(r, kind), "send") for r in range(p.ranks)]
        recvs = [buffers(p.exchange(r, kind), "recv") for r in range(p.ranks)]
        for a in range(p.ranks):
            for b in range(p.ranks):
                assert (sends[a][b] == recvs[b][a]).all(), f"{kind}: {a} -> {b}"


def test_canonical_order_and_mirrors(planned):
    p, batch = planned
    for s, (q, kv) in enumerate(canonical_receives(p, batch)):
        recv_q = buffers(p.exchange(s, "q"), "recv")
        recv_kv = buffers(p.exchange(s, "kv"), "recv")
        for h in range(p.ranks):
            assert recv_q[h].tolist() == [list(x) for x in rows_of(q[h])], f"server {s} q from {h}"
            assert recv_kv[h].tolist() == [list(x) for x in rows_of(kv[h])], f"server {s} kv from {h}"
            # The mirrors of plan.h: o_lse and dq go back exactly as q came; do comes like q;
            # dkv goes back exactly as kv came.
            for kind, side, like in (("o_lse", "send", recv_q), ("dq", "send", recv_q),
                                     ("do", "recv", recv_q), ("dkv", "send", recv_kv)):
                assert (buffers(p.exchange(s, kind), side)[h] == like[h]).all(), f"server {s} {kind}"


def key(rows):
    """(doc, position) rows as one int64 each, for vectorised lookups."""
    return rows[:, 0] * (1 << 32) + rows[:, 1]


def lookup(held, rows):
    """Index of every row of `rows` in `held` ((n, 2) distinct rows), or -1."""
    keys, order = key(held), np.argsort(key(held))
    want = key(rows)
    at = np.searchsorted(keys[order], want).clip(0, max(len(keys) - 1, 0))
    found = len(keys) > 0 and keys[order][at] == want
    return np.where(found, order[at] if len(keys) else -1, -1)


def test_local_rows(planned):
    p, batch = planned
    tokens = token_rows(batch)
    for r in range(p.ranks):
        assert p.tokens(r) == batch.rank_tokens(r) == len(tokens[r])
        assert (p.token_rows(r) == tokens[r]).all()
        for kind in distca.EXCHANGES:
            e = p.exchange(r, kind)
            for side in ("send", "recv"):
                rows, local = getattr(e, f"{side}_rows"), getattr(e, f"{side}_local")
                assert (local == lookup(tokens[r], rows)).all(), f"rank {r} {kind} {side}_local"
            # Homes and holders send and get back only rows they hold; servers hold none of
            # the rows they receive.
            held_side = {"q": "send", "kv": "send", "do": "send", "o_lse": "recv", "dq": "recv", "dkv": "recv"}[kind]
            other = "recv" if held_side == "send" else "send"
            assert (getattr(e, f"{held_side}_local") >= 0).all()
            assert (getattr(e, f"{other}_local") == -1).all()


def ranges(docs, begins, ends):
    """(doc, position) rows of [begin, end) of each doc, concatenated."""
    n = ends - begins
    doc = np.repeat(docs, n)
    pos = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n) + np.repeat(begins, n)
    return np.stack([doc, pos], axis=1)


def test_fused_call_and_coverage(planned):
    p, batch = planned
    tokens = token_rows(batch)
    queried = []
    for s in range(p.ranks):
        v = p.server(s)
        tasks = v.tasks
        q_len, kv_len = tasks[:, 2] - tasks[:, 1], tasks[:, 2]
        assert v.cu_seqlens_q.dtype == v.cu_seqlens_k.dtype == np.int32
        assert v.cu_seqlens_q.tolist() == [0] + np.cumsum(q_len).tolist()
        assert v.cu_seqlens_k.tolist() == [0] + np.cumsum(kv_len).tolist()
        # Gathering by q_source / kv_source from concat(token rows, receive rows) yields
        # every task's query rows and its whole context, in order.
        q_ids = np.concatenate([tokens[s], p.exchange(s, "q").recv_rows])[v.q_source]
        kv_ids = np.concatenate([tokens[s], p.exchange(s, "kv").recv_rows])[v.kv_source]
        want_q = ranges(tasks[:, 0], tasks[:, 1], tasks[:, 2])
        assert (q_ids == want_q).all()
        assert (kv_ids == ranges(tasks[:, 0], np.zeros_like(tasks[:, 2]), tasks[:, 2])).all()
        queried.append(want_q)
    every = np.concatenate(tokens)
    got = np.concatenate(queried)
    assert len(got) == len(every) and (np.sort(key(got)) == np.sort(key(every))).all(), \
        "every query row exactly once"


def test_views_are_readonly_and_keep_the_plan_alive():
    batch = distca.workload(dist="prolong", ranks=4, tokens_per_rank=4096, seed=1)
    p = distca.plan(batch, model="tiny")
    e, v = p.exchange(1, "kv"), p.server(1)
    a, b = e.recv_rows, e.recv_rows
    assert np.shares_memory(a, b), "two reads view the same storage (no copy)"
    cu, cu2 = v.cu_seqlens_q, v.cu_seqlens_q
    assert np.shares_memory(cu, cu2)
    assert not a.flags.writeable and not cu.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = 1
    want = cu.tolist()
    del p, e, v, b, cu2
    gc.collect()
    assert cu.tolist() == want and a.shape[1] == 2  # the base keeps the plan's storage


def test_bad_lookups():
    p = distca.plan(distca.workload(dist="fixed:512", ranks=2, tokens_per_rank=1024), model="tiny")
    with pytest.raises(IndexError):
        p.exchange(2, "q")
    with pytest.raises(IndexError):
        p.server(-1)
    with pytest.raises(ValueError, match="unknown exchange 'x'"):
        p.exchange(0, "x")
