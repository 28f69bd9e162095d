"""scripts/sim_split.py: the per-rank busy and idle split of a bench train --compare result,
against a hand computation on a small document."""

import importlib.util
import json
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "sim_split.py")
spec = importlib.util.spec_from_file_location("sim_split", SCRIPT)
sim_split = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim_split)

DOC = {"modes": [
    {"label": "colocated", "median_s": 8.0, "rank_idle": [0.25, 0.0],
     "sim": {"ok": True, "step_s": 6.0, "rank_busy_s": [4.5, 6.0], "rank_idle": [0.25, 0.0]}},
    {"label": "percp cp 2", "median_s": 9.0, "rank_idle": [0.1, 0.1], "sim": {"ok": False, "error": "refused"}},
]}


def test_split_by_hand():
    rows = sim_split.split(DOC)
    label, step, sim, ranks = rows[0]
    assert (label, step, sim) == ("colocated", 8.0, 6.0)
    # busy measured = step x (1 - idle): 8 x 0.75 = 6, 8 x 1 = 8
    assert ranks == [(0, 6.0, 4.5, 0.25, 0.25), (1, 8.0, 6.0, 0.0, 0.0)]
    assert rows[1] == ("percp cp 2", 9.0, None, [])


def test_cli_prints_ratios_and_refuses_bad_input(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(DOC))
    out = subprocess.run([sys.executable, SCRIPT, str(path)], capture_output=True, text=True, check=True).stdout
    assert "colocated | 8.000 | 6.000 | 0.75 | 0: 6.000, 4.500, 0.75, 25.0%, 25.0%; 1: 8.000, 6.000, 0.75, 0.0%, 0.0%" in out
    assert "percp cp 2 | 9.000 | refused" in out
    bad = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("distca: error: ")
