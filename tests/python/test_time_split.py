"""scripts/time_split.py: where each timed step of a bench train --compare result goes, per
rank, against a hand computation."""

import importlib.util
import json
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "time_split.py")
spec = importlib.util.spec_from_file_location("time_split", SCRIPT)
time_split = importlib.util.module_from_spec(spec)
spec.loader.exec_module(time_split)


def split(step, linear, attention, comm, wait):
    return {"step_s": step, "linear_s": linear, "attention_s": attention, "optimizer_s": 0.5,
            "comm_s": comm, "attention_comm_s": comm / 2, "wait_s": wait, "plan_s": 0.01,
            "plan_wait_s": 0.25, "bytes_sent": 0}


DOC = {"modes": [
    # rank 0 computes 2 + 1 + 0.5 = 3.5 s of its 5 s step, rank 1 1 + 0.5 + 0.5 = 2 s
    {"label": "cad pingpong", "rank_time_split": [[split(5.0, 2.0, 1.0, 0.5, 0.25)],
                                                   [split(5.0, 1.0, 0.5, 1.0, 1.0)]]},
    {"label": "no split", "median_s": 1.0},
]}


def test_rows_by_hand():
    rows = list(time_split.rows(DOC))
    assert len(rows) == 1  # a mode without rank_time_split is left out
    label, i, step, ranks, ideal, busiest = rows[0]
    assert (label, i, step) == ("cad pingpong", 0, 5.0)
    assert (ideal, busiest) == (2.75, 3.5)  # mean and max of 3.5 and 2
    # rest = step - compute - comm - barrier - plan wait: 5 - 3.5 - 0.5 - 0.25 - 0.25, 5 - 2 - 1 - 1 - 0.25
    assert [r["rest_s"] for r in ranks] == [0.5, 0.75]


def test_cli_prints_the_split_and_refuses_bad_input(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(DOC))
    out = subprocess.run([sys.executable, SCRIPT, str(path)], capture_output=True, text=True, check=True).stdout
    assert ("cad pingpong, 0 | 5.000 | 2.750 | 1.818 | 3.500 | 0: 2.000, 1.000, 0.500, 0.500 (0.250), 0.250, "
            "0.2500, 0.500; 1: 1.000, 0.500, 0.500, 1.000 (0.500), 1.000, 0.2500, 0.750") in out
    bad = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("distca: error: ")
