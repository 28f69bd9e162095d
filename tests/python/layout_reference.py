"""The plan's layout rules (include/distca/plan/plan.h, plan/validate.h) recomputed from the
batch and the tasks alone, in plain Python: the independent reference of test_layout.py."""

from collections import defaultdict

import numpy as np


def token_rows(batch):
    """Per rank, the (doc, position) of every row of its token buffer, pieces in order."""
    out = []
    for pieces in batch.per_rank:
        rows = [(d, off + i) for (d, off, n, _) in pieces for i in range(n)]
        out.append(np.array(rows, dtype=np.int64).reshape(-1, 2))
    return out


def held_runs(batch):
    """doc -> [(begin, end, rank)] sorted by begin (one run per piece)."""
    runs = defaultdict(list)
    for r, pieces in enumerate(batch.per_rank):
        for (d, off, n, _) in pieces:
            runs[d].append((off, off + n, r))
    for d in runs:
        runs[d].sort()
    return runs


def canonical_receives(plan, batch):
    """Per server s: (q, kv) where q[h] / kv[h] is the list of (doc, begin, end) blocks s
    receives from rank h, rebuilt from s's tasks in fused-call order (plan.h):
      q   the tasks with home h != s, in task order, their query rows
      kv  per document in the order of its first task on s, the context [0, E) (E = the
          largest q_end of its tasks on s) restricted to the runs h holds, increasing."""
    runs = held_runs(batch)
    out = []
    for s in range(plan.ranks):
        q, kv = defaultdict(list), defaultdict(list)
        order, need = [], {}
        for doc, qb, qe, home, _, _ in plan.server(s).tasks.tolist():
            if home != s:
                q[home].append((doc, qb, qe))
            if doc not in need:
                order.append(doc)
                need[doc] = 0
            need[doc] = max(need[doc], qe)
        for d in order:
            for (b, e, h) in runs[d]:
                if b < need[d] and h != s:
                    kv[h].append((d, b, min(e, need[d])))
        out.append((q, kv))
    return out


def rows_of(blocks):
    return [(d, p) for (d, b, e) in blocks for p in range(b, e)]
