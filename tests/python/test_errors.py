"""Bad arguments raise ValueError (RuntimeError for failed work) with the one line the CLI
prints for the same input: stderr == "distca: error: " + str(exception) + newline, exit 2."""

from pathlib import Path

import pytest

import distca
from conftest import run_cli

BASE = dict(dist="prolong", ranks=4, tokens_per_rank=4096, seed=1)
FLAG = {"dist": "--dist", "ranks": "--ranks", "tokens_per_rank": "--tokens-per-rank", "seed": "--seed",
        "layout": "--layout", "max_doc_len": "--max-doc-len", "long_prob": "--long-prob"}

WORKLOAD_CASES = [
    {"ranks": 0},
    {"ranks": -3},
    {"tokens_per_rank": 1000},
    {"dist": "bogus"},
    {"dist": "uniform:9:3"},
    {"dist": "file:/nonexistent/lengths.json"},
    {"layout": "diagonal"},
    {"max_doc_len": 8},
    {"long_prob": 1.5},
]


def cli_error(*args):
    rc, out, err = run_cli(*args, check=False)
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith("distca: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    return err[len("distca: error: "):-1]


def workload_flags(kw):
    return [x for k, v in kw.items() for x in (FLAG[k], v)]


@pytest.mark.parametrize("bad", WORKLOAD_CASES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_workload_errors_match_cli(cli, bad):
    kw = {**BASE, **bad}
    with pytest.raises(ValueError) as e:
        distca.workload(**kw)
    assert str(e.value) == cli_error("workload", *workload_flags(kw))


PLAN_CASES = [
    {"scheduler": "nope"},
    {"scheduler": "percp:3"},
    {"tolerance": 2.0},
    {"tolerance": -0.1},
    {"model": "llama-1t"},
    {"dtype": "fp16"},
    {"wlb_mem_cap": 0.5},
    {"align_rows": 0},
    {"cost_table": "/nonexistent/table.json"},
]
PLAN_FLAG = {"scheduler": "--scheduler", "tolerance": "--tolerance", "model": "--model", "dtype": "--dtype",
             "wlb_mem_cap": "--wlb-mem-cap", "align_rows": "--align-rows", "cost_table": "--cost-table"}


@pytest.mark.parametrize("bad", PLAN_CASES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_plan_errors_match_cli(cli, bad):
    batch = distca.workload(**BASE)
    with pytest.raises(ValueError) as e:
        distca.plan(batch, **bad)
    args = [x for k, v in bad.items() for x in (PLAN_FLAG[k], v)]
    assert str(e.value) == cli_error("plan", *workload_flags(BASE), *args)


def test_bad_batch_file_matches_cli(cli, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"ranks": 2, "tokens_per_rank": 16, "per_rank": [[{"doc": 0, "offset": 0, "len": 32, "doc_len": 32}], []]}')
    with pytest.raises(ValueError) as e:
        distca.Batch.load(str(path))
    assert str(e.value) == cli_error("plan", "--batch", path)
    with pytest.raises(ValueError) as e:
        distca.Batch.load(str(tmp_path / "missing.json"))
    assert str(e.value) == cli_error("plan", "--batch", tmp_path / "missing.json")


# The recorded 2-rank hardware profile of the simulator's tests (distca profile --hardware-out).
SIM_PROFILE = str(Path(__file__).resolve().parents[1] / "sim" / "data" / "hardware-profile-2rank.json")
SIM_CASES = [
    ({"gpus": 0}, ["--gpus", 0]),
    ({"gpus": 12}, ["--gpus", 12]),
    ({"gpus": 16, "strategy": "magic"}, ["--gpus", 16, "--strategy", "magic"]),
    ({"gpus": 16, "mfu": 0.0}, ["--gpus", 16, "--mfu", 0]),
    ({"gpus": 16, "hardware": "tpu"}, ["--gpus", 16, "--hardware", "tpu"]),
    ({"gpus": 16, "pp": 3}, ["--gpus", 16, "--pp", 3]),
    ({"gpus": 16, "tokens_per_rank": 100}, ["--gpus", 16, "--tokens-per-rank", 100]),
    ({"gpus": 16, "dtype": "fp16"}, ["--gpus", 16, "--dtype", "fp16"]),
    # A hardware profile measured the linear rate itself: --mfu is refused, from Python too.
    ({"gpus": 2, "model": "tiny", "hardware": SIM_PROFILE, "mfu": 0.5},
     ["--gpus", 2, "--model", "tiny", "--hardware", SIM_PROFILE, "--mfu", 0.5]),
]


@pytest.mark.parametrize("kw,args", SIM_CASES, ids=[str(a) for _, a in SIM_CASES])
def test_simulate_errors_match_cli(cli, kw, args):
    with pytest.raises(ValueError) as e:
        distca.simulate(**kw)
    assert str(e.value) == cli_error("simulate", *args)


def test_batch_and_kernel_arguments():
    with pytest.raises(ValueError, match=r"^ranks must be positive \(got 0\)$"):
        distca.Batch.from_lengths([16], ranks=0, tokens_per_rank=16)
    with pytest.raises(ValueError, match=r"^lengths\[1\] must be positive \(got 0\)$"):
        distca.Batch.from_lengths([16, 0], ranks=1, tokens_per_rank=32)
    with pytest.raises(ValueError, match="rank 0"):  # Batch::validate names the rank
        distca.Batch([[(0, 0, 64, 64)]], tokens_per_rank=32)
    with pytest.raises(TypeError):
        distca.plan(distca.workload(**BASE), model=3)
