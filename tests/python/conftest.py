"""Shared fixtures of the Python tests (run by CTest: tests/python/CMakeLists.txt).

The module is found through PYTHONPATH (CTest sets it to <build>/python); when it was not
built (DISTCA_PYTHON=OFF) every test is skipped with one clear reason, which CTest reports as
a skip. The CLI binary comes from DISTCA_CLI (CTest sets it), else build/release/apps/distca.
"""

import json
import os
import subprocess

import pytest

try:
    import distca  # noqa: F401
except ImportError as e:  # pragma: no cover - only without the module
    pytest.skip(f"distca module not built (configure with -DDISTCA_PYTHON=ON): {e}", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("DISTCA_CLI", os.path.join(ROOT, "build", "release", "apps", "distca"))


def run_cli(*args, check=True):
    """Runs the distca CLI; returns (returncode, stdout, stderr)."""
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"distca {' '.join(map(str, args))} failed ({p.returncode}): {p.stderr}")
    return p.returncode, p.stdout, p.stderr


def cli_json(*args):
    """The JSON a command prints (`workload --json` is a flag; the others take - for stdout)."""
    return json.loads(run_cli(*args, "--json", *([] if args[0] == "workload" else ["-"]))[1])


@pytest.fixture(scope="session")
def cli():
    if not os.access(CLI, os.X_OK):
        pytest.fail(f"the distca CLI is not built at {CLI} (set DISTCA_CLI)")
    return CLI
