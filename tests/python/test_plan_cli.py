"""distca.plan against `distca plan --json` on the same batch, field for field; the batch
and the whole plan (--full) too. plan_seconds is a timing and the only field left out."""

import json
import math

import pytest

import distca
from conftest import cli_json, run_cli

# (dist, ranks, tokens_per_rank, layout, scheduler): small, but with documents split across
# ranks so that every exchange carries rows.
CASES = [
    ("prolong", 8, 16384, "contiguous", "cad"),
    ("pretrain", 16, 8192, "head-tail", "cad"),
    ("uniform:16:4096", 8, 8192, "contiguous", "colocated"),
    ("pretrain", 8, 8192, "contiguous", "wlb"),
    ("prolong", 8, 8192, "head-tail", "percp:2"),
    ("fixed:3000", 4, 4096, "contiguous", "cad-symmetric"),
]


def equal(a, b, path="summary"):
    """Exact equality of two JSON values; numbers compared as numbers (an int the CLI prints
    may come back as a float from a median), failures name the field."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys differ: {sorted(set(a) ^ set(b))}"
        for k in a:
            equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            equal(x, y, f"{path}[{i}]")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        assert isinstance(b, (int, float)) and not isinstance(b, bool), f"{path}: {a!r} vs {b!r}"
        assert a == b or (math.isnan(a) and math.isnan(b)), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def flags(dist, ranks, tpr, layout, seed=7):
    return ["--dist", dist, "--ranks", ranks, "--tokens-per-rank", tpr, "--layout", layout, "--seed", seed]


@pytest.mark.parametrize("dist,ranks,tpr,layout,scheduler", CASES)
def test_summary_equals_cli(cli, dist, ranks, tpr, layout, scheduler):
    batch = distca.workload(dist=dist, ranks=ranks, tokens_per_rank=tpr, layout=layout, seed=7)
    p = distca.plan(batch, model="llama-8b", scheduler=scheduler, tolerance=0.05)
    want = cli_json("plan", *flags(dist, ranks, tpr, layout), "--scheduler", scheduler, "--tolerance", 0.05)
    got = p.summary
    assert got["plan_seconds"] > 0
    for s in (got, want):
        s.pop("plan_seconds")
    equal(got, want)


@pytest.mark.parametrize("dist,ranks,tpr,layout,scheduler", [CASES[0], CASES[2], CASES[4]])
def test_full_plan_and_batch_equal_cli(cli, dist, ranks, tpr, layout, scheduler):
    batch = distca.workload(dist=dist, ranks=ranks, tokens_per_rank=tpr, layout=layout, seed=7)
    drawn = cli_json("workload", *flags(dist, ranks, tpr, layout), "--full")
    assert distca.Batch.from_json(json.dumps(drawn["batch"])) == batch
    full = cli_json("plan", *flags(dist, ranks, tpr, layout), "--scheduler", scheduler, "--full",
                    "--model", "tiny", "--dtype", "fp32")
    p = distca.plan(batch, model="tiny", scheduler=scheduler, dtype="fp32")
    equal(p.to_dict(), full["plan"], "plan")
    assert p.row_bytes == full["plan"]["row_bytes"]
    # And every array view against the CLI's dense layouts.
    for r, rank in enumerate(full["plan"]["ranks"]):
        assert p.tokens(r) == rank["tokens"]
        for kind, ex in rank["exchanges"].items():
            e = p.exchange(r, kind)
            assert e.row_bytes == ex["row_bytes"]
            for name in ("send_counts", "send_displs", "recv_counts", "recv_displs"):
                assert getattr(e, name).tolist() == ex[name], f"rank {r} {kind} {name}"
            for side in ("send", "recv"):
                rows = [[d, pos] for peer in ex[f"{side}_rows"] for (d, b, end) in peer for pos in range(b, end)]
                assert getattr(e, f"{side}_rows").tolist() == rows, f"rank {r} {kind} {side}_rows"
    for s, server in enumerate(full["plan"]["servers"]):
        v = p.server(s)
        assert v.cu_seqlens_q.tolist() == server["cu_seqlens_q"]
        assert v.cu_seqlens_k.tolist() == server["cu_seqlens_k"]
        assert [t[:5] for t in v.tasks.tolist()] == [
            [t["doc"], t["q_begin"], t["q_end"], t["home"], t["q_offset"]] for t in server["tasks"]]


def test_batch_file_and_custom_model(cli, tmp_path):
    path = tmp_path / "batch.json"
    _, text, _ = run_cli("workload", "--dist", "pretrain", "--ranks", 4, "--tokens-per-rank", 4096,
                         "--json", "--full")
    path.write_text(text)
    batch = distca.Batch.load(str(path))
    assert batch.batch_file == str(path) and batch.dist is None
    p = distca.plan(batch, model=distca.ModelSpec.preset("llama-34b"), scheduler="cad", tolerance=0.1)
    want = cli_json("plan", "--batch", path, "--model", "llama-34b", "--tolerance", 0.1)
    got = p.summary
    for s in (got, want):
        s.pop("plan_seconds")
    equal(got, want)
    p.validate()


def test_pieces_and_lengths():
    lengths = [5000, 300, 12000, 700, 16]
    b = distca.Batch.from_lengths(lengths, ranks=3, tokens_per_rank=6000)
    pieces = b.pieces()
    assert pieces.shape[1] == 5 and pieces[:, 3].sum() == 18000  # every slot filled
    rebuilt = distca.Batch([[tuple(x[1:]) for x in pieces.tolist() if x[0] == r] for r in range(3)], 6000)
    assert rebuilt == b
    assert [b.rank_tokens(r) for r in range(3)] == [6000, 6000, 6000]
    # Document i gets id i, in order, the last one cut to fit.
    assert pieces[0].tolist() == [0, 0, 0, 5000, 5000]
    capped = distca.Batch.from_lengths(lengths, ranks=3, tokens_per_rank=6000, max_doc_len=4010)
    assert [p[4] for p in capped.pieces().tolist()][:2] == [4000, 300]  # 4010 rounds down to 4000


def test_from_lengths_packs_like_the_workload():
    # fixed:N (a multiple of 16) draws N every time: the workload's batch is the packing of
    # equal lengths (the last one cut to fit).
    drawn = distca.workload(dist="fixed:1008", ranks=3, tokens_per_rank=2048, layout="head-tail")
    assert distca.Batch.from_lengths([1008] * 7, ranks=3, tokens_per_rank=2048, layout="head-tail") == drawn
