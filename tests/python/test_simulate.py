"""distca.simulate against `distca simulate --json`: the same dict for the same options
(plan_seconds, a timing, left out), drawn or from given micro-batches."""

import json
from pathlib import Path

import pytest

import distca
from conftest import cli_json, run_cli
from test_plan_cli import equal


# The recorded 2-rank hardware profile of the simulator's tests (distca profile --hardware-out).
PROFILE = str(Path(__file__).resolve().parents[1] / "sim" / "data" / "hardware-profile-2rank.json")


def drop_timing(j):
    j["plan"].pop("plan_seconds")
    return j


@pytest.mark.parametrize("kw,args", [
    (dict(gpus=32, strategy="cad", dist="pretrain", tokens_per_rank=16384),
     ["--gpus", 32, "--strategy", "cad", "--dist", "pretrain", "--tokens-per-rank", 16384]),
    (dict(gpus=64, strategy="wlb", pp=2, dist="prolong", tokens_per_rank=16384, seed=3, checkpointing=False),
     ["--gpus", 64, "--strategy", "wlb", "--pp", 2, "--dist", "prolong", "--tokens-per-rank", 16384, "--seed", 3,
      "--no-checkpointing"]),
    (dict(gpus=32, strategy="percp:2", tokens_per_rank=8192, model="llama-34b", hardware="local-cpu",
          gpus_per_node=4, dtype="fp32"),
     ["--gpus", 32, "--strategy", "percp:2", "--tokens-per-rank", 8192, "--model", "llama-34b",
      "--hardware", "local-cpu", "--gpus-per-node", 4, "--dtype", "fp32"]),
    (dict(gpus=64, pp=2, strategy="cad", tokens_per_rank=8192, cad_servers="stateless", inter_node_bw=12.5,
          memory_gb=40.0),
     ["--gpus", 64, "--pp", 2, "--strategy", "cad", "--tokens-per-rank", 8192, "--cad-servers", "stateless",
      "--inter-node-bw", 12.5, "--memory-gb", 40]),
    (dict(gpus=4, pp=2, strategy="cad:pingpong", tokens_per_rank=8192, model="tiny", hardware=PROFILE, dtype="fp32"),
     ["--gpus", 4, "--pp", 2, "--strategy", "cad:pingpong", "--tokens-per-rank", 8192, "--model", "tiny",
      "--hardware", PROFILE, "--dtype", "fp32"]),
], ids=["cad", "wlb-pp2", "percp-cpu", "cad-pp2-stateless", "hardware-profile"])
def test_simulate_equals_cli(cli, kw, args):
    equal(drop_timing(distca.simulate(**kw)), drop_timing(cli_json("simulate", *args)), "simulate")


def test_simulate_given_batches(cli, tmp_path):
    _, text, _ = run_cli("workload", "--dist", "pretrain", "--ranks", 4, "--tokens-per-rank", 8192,
                         "--batches", 2, "--json", "--full")
    path = tmp_path / "mbs.json"
    path.write_text(text)
    batches = distca.load_batches(str(path))
    assert len(batches) == 2
    got = distca.simulate(32, batches=batches, strategy="cad")
    want = cli_json("simulate", "--gpus", 32, "--batch", path, "--strategy", "cad")
    equal(drop_timing(got), drop_timing(want), "simulate")
    with pytest.raises(ValueError, match="nodes per pipeline stage"):
        distca.simulate(64, batches=batches)
    assert json.dumps(got)  # plain JSON values
