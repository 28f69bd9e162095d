"""distca: plan, simulate and run core attention disaggregation (CAD) from Python.

The C++ planner, simulator and attention kernel of the `distca` CLI, with NumPy views of a
plan's exchange layouts (docs/python.md):

    import distca
    batch = distca.workload(dist="prolong", ranks=8, tokens_per_rank=65536, seed=42)
    plan = distca.plan(batch, model="llama-8b", scheduler="cad", tolerance=0.05)
    plan.summary["load_max_over_mean"]       # the keys of `distca plan --json`
    ex = plan.exchange(0, "q")               # ex.send_counts, ex.send_rows, ...
    srv = plan.server(0)                     # srv.cu_seqlens_q, srv.q_source, ...
    plan.validate()

Errors: ValueError for bad arguments, MemoryError for a call whose memory estimate exceeds
the limit (set_max_memory), RuntimeError for failed work; the message is the line `distca`
prints after "distca: error: ". No input takes the interpreter down.
"""

from ._distca import (
    Batch,
    Exchange,
    ModelSpec,
    Plan,
    Server,
    attention_backward,
    attention_forward,
    hardware_presets,
    load_batches,
    max_memory,
    model_presets,
    plan,
    set_max_memory,
    simulate,
    workload,
)

EXCHANGES = ("q", "kv", "o_lse", "do", "dq", "dkv")
"""The exchange kinds of a plan, in the order of docs/plan-format.md."""

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "EXCHANGES",
    "Exchange",
    "ModelSpec",
    "Plan",
    "Server",
    "attention_backward",
    "attention_forward",
    "hardware_presets",
    "load_batches",
    "max_memory",
    "model_presets",
    "plan",
    "set_max_memory",
    "simulate",
    "workload",
]
