"""Hostile arguments never take the interpreter down (docs/development.md, "Input and output"):
every call checks its arguments with the CLI's rules and its memory estimate before it copies
or allocates anything, and every failure reaches Python as an exception.

Each case runs in a fresh interpreter, so a crash or an abort fails the case instead of killing
the test runner: the child must exit 0 after catching exactly the expected exception with the
expected message. The child's address space is capped (RLIMIT_AS) so that a case that slips
through fails fast instead of filling the machine, and its memory limit is set to 4 GiB
(distca.set_max_memory) so that the estimates refuse the same calls on any machine."""

import os
import re
import resource
import subprocess
import sys
import textwrap

import pytest

import distca  # noqa: F401  (skips the module without it: conftest.py)

ADDRESS_SPACE = 8 << 30

PROLOGUE = """
import numpy as np
import distca
distca.set_max_memory("4G")
"""

EPILOGUE = """
except BaseException as e:
    print(type(e).__name__)
    print(e)
    raise SystemExit(0)
print("no exception")
raise SystemExit(3)
"""


def cap_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_isolated(body, setup=""):
    """Runs `setup` then `body` (which must raise) in a new interpreter; returns (exception
    type name, message). Fails on a signal, an abort or a call that did not raise."""
    code = PROLOGUE + textwrap.dedent(setup) + "try:\n" + textwrap.indent(textwrap.dedent(body), "    ") + EPILOGUE
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                       preexec_fn=cap_address_space, env=dict(os.environ, OMP_NUM_THREADS="1"))
    how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
    assert p.returncode == 0, f"{how}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-2000:]}"
    kind, _, message = p.stdout.partition("\n")
    return kind, message.rstrip("\n")


# The arrays of a small valid call, for cases that replace one argument.
SMALL = """
q = np.zeros((8, 4, 16), np.float32)
kv = np.zeros((8, 4, 16), np.float32)
cu = np.array([0, 8], np.int32)
o, lse = distca.attention_forward(q, kv, kv, cu, cu)
"""

# (id, body, exception, regex the message starts with). Each failed before the checks existed: a segfault on
# the null array of a copy numpy could not make, an abort on an exception thrown inside the
# kernel's OpenMP region or on a failed check, or no error at all where the CLI refuses.
CASES = [
    ("broadcast_q_copy_refused_by_estimate",
     "distca.attention_forward(np.broadcast_to(q[:1], (2**30, 4, 16)), kv, kv, np.array([0, 2**30], np.int32), cu)",
     "MemoryError",
     r"q \(1073741824, 4, 16\) k \(8, 4, 16\) needs about [0-9.]+ GiB, more than the 4\.0 GiB allowed by "
     r"distca\.set_max_memory"),
    ("broadcast_cu_seqlens_too_many_tasks",
     "distca.attention_forward(q, kv, kv, np.broadcast_to(cu[:1], (2**33,)), cu)",
     "ValueError", r"cu_seqlens_q: more than 2\^31 - 1 tasks"),
    ("broadcast_cu_seqlens_copy_refused_by_estimate",
     "c = np.broadcast_to(cu[:1], (2**31,))\ndistca.attention_forward(q, kv, kv, c, c)",
     "MemoryError", r"q \(8, 4, 16\) k \(8, 4, 16\) needs about [0-9.]+ GiB"),
    ("broadcast_lse_backward",
     "distca.attention_backward(q, kv, kv, o, np.broadcast_to(lse[:1, :1], (4, 2**33)), q, cu, cu)",
     "ValueError", r"lse: shape \(4, 8589934592\) differs from \(n_heads, total_q\) = \(4, 8\)"),
    ("dimension_beyond_int32",
     "distca.attention_forward(np.broadcast_to(q[:1, :1], (1, 2**32 + 4, 16)), kv, kv, cu, cu)",
     "ValueError", r"q: dimensions exceed int32 \(shape \(1, 4294967300, 16\)\)"),
    ("kernel_scratch_refused_by_estimate",
     "one = np.zeros((1, 1, 1), np.float32)\nc1 = np.array([0, 1], np.int32)\n"
     "distca.attention_forward(np.zeros((1, 2**24, 1), np.float32), one, one, c1, c1)",
     "MemoryError", r"q \(1, 16777216, 1\) k \(1, 1, 1\) needs about [0-9.]+ GiB"),
    ("negative_softmax_scale",
     "distca.attention_forward(q, kv, kv, cu, cu, softmax_scale=-1)",
     "ValueError", r"softmax_scale: must be a finite number > 0 within float32 range \(got -1\)"),
    ("softmax_scale_below_float32",
     "distca.attention_backward(q, kv, kv, o, lse, q, cu, cu, softmax_scale=1e-60)",
     "ValueError", r"softmax_scale: must be a finite number > 0 within float32 range \(got 1e-60\)"),
    ("model_dimension_2_62",
     "distca.ModelSpec('x', 2, 4096, 32, 8, 2**62, 14336, 128256)",
     "ValueError", r"head_dim must be in 1\.\.2\^24 = 16777216 \(got 4611686018427387904\)"),
    ("plan_with_model_field_set_to_2_62",
     "m = distca.ModelSpec.preset('llama-8b')\nm.n_heads = 2**62\n"
     "distca.plan(distca.workload(ranks=2, tokens_per_rank=4096), model=m)",
     "ValueError", r"--model: n_heads must be in 1\.\.2\^24 = 16777216 \(got 4611686018427387904\)"),
    ("model_row_bytes_overflow",
     "distca.ModelSpec('x', 2, 4096, 4096, 4096, 8192, 14336, 1000)",
     "ValueError", r"n_heads x head_dim must be at most 2\^24 = 16777216 \(got 33554432\)"),
    ("model_parameter_count_overflow",
     "distca.ModelSpec('x', 2**24, 2**24, 1, 1, 1, 2**24, 1)",
     "ValueError", r"the model's parameter count \(1\.42e\+22\) exceeds 2\^52"),
    ("workload_refused_by_estimate",
     "distca.workload(dist='fixed:16', ranks=2**20, tokens_per_rank=2**20)",
     "MemoryError", r"--ranks 1048576 --tokens-per-rank 1048576 --batches 1 needs about [0-9.]+ TiB"),
    ("from_lengths_refused_by_estimate",
     "distca.Batch.from_lengths([16] * 10, 2**24, 16, layout='head-tail')",
     "MemoryError", r"--ranks 16777216 --tokens-per-rank 16 \(10 lengths\) needs about [0-9.]+ GiB"),
    ("plan_refused_by_estimate",
     "b = distca.workload(ranks=512, tokens_per_rank=4096)\ndistca.set_max_memory('1M')\ndistca.plan(b)",
     "MemoryError", r"--ranks 512 --tokens-per-rank 4096 needs about [0-9.]+ MiB, more than the 1\.0 MiB"),
    ("simulate_refused_by_estimate",
     "distca.set_max_memory('1K')\ndistca.simulate(8, tokens_per_rank=4096)",
     "MemoryError", r"--gpus 8 --pp 1 --tokens-per-rank 4096 --microbatches 1 needs about [0-9.]+ KiB"),
    ("plan_row_arrays_refused_by_estimate",
     "b = distca.Batch([[(0, 0, 2**30, 2**30)]], 2**30)\np = distca.plan(b, model='tiny', scheduler='colocated')\n"
     "p.token_rows(0)",
     "MemoryError", r"the row arrays of rank 0 needs about 16\.0 GiB"),
    ("plan_gather_indices_refused_by_estimate",
     "b = distca.Batch([[(0, 0, 2**30, 2**30)]], 2**30)\np = distca.plan(b, model='tiny', scheduler='colocated')\n"
     "p.server(0).q_source",
     "MemoryError", r"the gather indices of server 0 needs about 16\.0 GiB"),
]


@pytest.mark.parametrize("body,kind,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_call_raises(body, kind, message):
    got_kind, got_message = run_isolated(body, SMALL)
    assert got_kind == kind, (got_kind, got_message)
    assert re.match(message, got_message), got_message


def test_batch_file_refused_by_estimate(tmp_path):
    path = tmp_path / "batch.json"
    path.write_text(distca.workload(ranks=8, tokens_per_rank=65536).to_json())
    kind, message = run_isolated(f"distca.set_max_memory('1K')\ndistca.Batch.load({str(path)!r})")
    assert kind == "MemoryError" and message.startswith(f"--batch {path} needs about "), (kind, message)


def test_set_max_memory_round_trip():
    distca.set_max_memory("3G")
    assert distca.max_memory() == 3 << 30
    distca.set_max_memory(12345)
    assert distca.max_memory() == 12345
    distca.set_max_memory(None)
    assert distca.max_memory() > 0
    with pytest.raises(ValueError, match="expected a size"):
        distca.set_max_memory("lots")
    with pytest.raises(TypeError):
        distca.set_max_memory(1.5)
