#!/usr/bin/python3
"""CAD attention across torch.distributed ranks, driven by distca.plan (docs/python.md).

Every rank holds its packed tokens' Q, K, V (its share of the batch, as in data parallel
training). Per step every rank calls `distca.plan` on the same batch and gets the same plan
(the planner is deterministic); the plan says which query rows each rank serves as an
*attention server* and which K/V context rows it needs. One `torch.autograd.Function`
(`CADAttention`) then runs one layer's core attention:

  forward   Q rows and K/V rows go to the servers (all-to-all-v), each server runs one fused
            varlen causal call over its tasks, O rows come home;
  backward  dO rows go to the servers, each server runs the fused backward, dQ rows come home
            and the dK/dV partial sums go back to the ranks that hold those K/V rows, which
            add them up (a K/V row can serve queries on several servers).

The script checks O, dQ, dK and dV against attention over each whole document in one
process (float64 torch) and exits 1 on a mismatch. It is a template: `plan_step`,
`RankLayout`, `exchange_rows` and `CADAttention` are what an integrator copies into a
Megatron / TorchTitan attention layer; the rest (inputs, reference, launcher) is scaffolding.

  /usr/bin/python3 examples/torch_cad_attention.py --world-size 2     # spawns 2 processes
  torchrun --nproc-per-node 4 examples/torch_cad_attention.py          # or under torchrun

CPU only (gloo backend, distca's CPU kernel on the server). On GPUs the server call becomes
flash-attn's varlen kernel and the backend NCCL; the layouts and exchanges stay the same.
"""

import argparse
import hashlib
import math
import os
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    import distca
except ImportError:  # run from a source checkout: fall back to the build tree (README's build)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "build", "release", "python"))
    try:
        import distca
    except ImportError as e:
        print(f"distca: error: cannot import distca ({e}); build it (README) and set "
              "PYTHONPATH=build/release/python", file=sys.stderr)
        sys.exit(2)

# The check's tolerance: |got - ref| <= ATOL + RTOL * |ref| elementwise, ref in float64. The
# distributed run computes in float32 (unit roundoff 6e-8); a softmax row sums up to
# max_doc_len terms and a dK/dV row sums partials over every query of its document, so the
# rounding error grows with the sums' lengths (about 1e-6 relative at 1-2K tokens) but stays
# orders of magnitude below any indexing mistake (a wrong or missing row is off by O(1)).
RTOL, ATOL = 1e-4, 1e-5


# ---------------------------------------------------------------------------------------------
# The integration layer: plan once per step, lay it out as torch tensors, run every layer.
# ---------------------------------------------------------------------------------------------

def plan_step(my_pieces, tokens_per_rank, model, scheduler, tolerance):
    """Plans one step from this rank's packed documents.

    my_pieces: this rank's pieces (doc, offset, len, doc_len) in token-buffer order (what a
    packed-sequence data loader knows: its cu_seqlens plus global document ids). Every rank
    gathers every rank's pieces, so every rank plans the same batch and gets the same plan:
    no broadcast of the plan is needed (planning takes milliseconds, far less than a step).
    """
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, list(my_pieces))
    batch = distca.Batch(per_rank, tokens_per_rank)
    return distca.plan(batch, model=model, scheduler=scheduler, tolerance=tolerance, dtype="fp32")


def _index(a):
    # The plan's arrays are read-only NumPy views; torch only reads index tensors, so share
    # the memory (on GPUs: .to(device, non_blocking=True) once per step).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(a)


class ExchangeLayout:
    """One all-to-all-v of this rank (docs/python.md, `plan.exchange(r, kind)`)."""

    def __init__(self, ex):
        self.send_counts = ex.send_counts.tolist()  # [R] rows to each peer (0 to itself)
        self.recv_counts = ex.recv_counts.tolist()  # [R] rows from each peer
        self.send_local = _index(ex.send_local)     # (n_send,) token-buffer row of each sent row
        self.recv_local = _index(ex.recv_local)     # (n_recv,) token-buffer row of each received row
        self.n_send, self.n_recv = sum(self.send_counts), sum(self.recv_counts)


class RankLayout:
    """Everything rank `rank` needs from one step's plan, built once per step and shared by
    every attention layer of the step (the documents, hence the layouts, are the same in every
    layer; only Q, K, V differ)."""

    def __init__(self, plan, rank, mode="a2a"):
        self.rank, self.mode = rank, mode
        self.tokens = plan.tokens(rank)  # T: rows of this rank's token buffer
        for kind in distca.EXCHANGES:    # q, kv, o_lse, do, dq, dkv
            setattr(self, kind, ExchangeLayout(plan.exchange(rank, kind)))
        srv = plan.server(rank)
        # Fused query row j = row q_source[j] of cat(token buffer, q receive buffer); the same
        # index puts fused O / dQ row j into cat(token buffer, o_lse / dq send buffer).
        self.q_source = _index(srv.q_source)     # (total_q,)
        # Fused K/V row j = row kv_source[j] of cat(token buffer, kv receive buffer); indices
        # repeat (a context row of several tasks), so dK/dV go back with index_add_.
        self.kv_source = _index(srv.kv_source)   # (total_kv,)
        self.cu_seqlens_q = srv.cu_seqlens_q     # (n_tasks + 1,) int32, NumPy (the CPU kernel's)
        self.cu_seqlens_k = srv.cu_seqlens_k     # (n_tasks + 1,) int32
        self.n_tasks = len(self.cu_seqlens_q) - 1


def exchange_rows(send, ex, mode):
    """All-to-all-v of rows: send (ex.n_send, *row) -> (ex.n_recv, *row).

    Peer p's rows are the consecutive slice [displs[p], displs[p] + counts[p]) on both sides
    (the plan's displacements are the counts' dense prefix sums). `a2a` is one
    all_to_all_single (gloo and NCCL support it); `p2p` is grouped isend/irecv, for a backend
    or a sparse pattern where point to point is better. Both move the same bytes."""
    send = send.contiguous()
    recv = send.new_empty((ex.n_recv, *send.shape[1:]))
    if mode == "a2a":
        dist.all_to_all_single(recv, send, ex.recv_counts, ex.send_counts)
        return recv
    ops, s_off, r_off = [], 0, 0
    for peer, (ns, nr) in enumerate(zip(ex.send_counts, ex.recv_counts)):
        if ns:
            ops.append(dist.P2POp(dist.isend, send[s_off:s_off + ns], peer))
        if nr:
            ops.append(dist.P2POp(dist.irecv, recv[r_off:r_off + nr], peer))
        s_off, r_off = s_off + ns, r_off + nr
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return recv


# The server's fused call. distca's CPU kernel takes NumPy float32 views (no copy). On GPUs
# this is flash_attn_varlen_func(fq, fk, fv, cu_q, cu_k, max_q, max_k, causal=True) (flash-attn
# >= 2.1 aligns the causal mask bottom-right, as the plan's tasks need: a task's queries are
# the last rows of its context [0, q_end)) and its backward with the saved LSE.

def server_forward(fq, fk, fv, lay):
    o, lse = distca.attention_forward(fq.numpy(), fk.numpy(), fv.numpy(),
                                      lay.cu_seqlens_q, lay.cu_seqlens_k, causal=True)
    return torch.from_numpy(o), torch.from_numpy(lse)  # (total_q, H, D), (H, total_q)


def server_backward(fq, fk, fv, fo, lse, fdo, lay):
    dq, dk, dv = distca.attention_backward(fq.numpy(), fk.numpy(), fv.numpy(), fo.numpy(),
                                           lse.numpy(), fdo.numpy(), lay.cu_seqlens_q,
                                           lay.cu_seqlens_k, causal=True)
    return torch.from_numpy(dq), torch.from_numpy(dk), torch.from_numpy(dv)


class CADAttention(torch.autograd.Function):
    """Core attention of this rank's tokens, computed on the attention servers of the plan.

    q: (T, H, D), k, v: (T, HKV, D) float32, this rank's token buffer (the plan's row order);
    returns o (T, H, D). Causal within each document. Collective: every rank of the group
    calls it (forward and backward) with its own tensors and the same step's plan.
    """

    @staticmethod
    def forward(ctx, q, k, v, lay):
        T, (H, D) = lay.tokens, q.shape[1:]
        if q.shape[0] != T or k.shape[0] != T or k.shape != v.shape or q.dtype != torch.float32:
            raise ValueError(f"CADAttention: q {tuple(q.shape)}, k, v {tuple(k.shape)} must be float32 "
                             f"rows of this rank's token buffer ({T} rows)")
        # K and V travel together: one exchange with the K row and the V row of each token.
        kv = torch.stack((k, v), dim=1)                                            # (T, 2, HKV, D)
        q_send = q.index_select(0, lay.q.send_local)                               # (n_q_send, H, D)
        kv_send = kv.index_select(0, lay.kv.send_local)                            # (n_kv_send, 2, HKV, D)
        q_recv = exchange_rows(q_send, lay.q, lay.mode)                            # (n_q_recv, H, D)
        kv_recv = exchange_rows(kv_send, lay.kv, lay.mode)                         # (n_kv_recv, 2, HKV, D)

        # Server side: gather the fused call's inputs in task order.
        fq = torch.cat((q, q_recv)).index_select(0, lay.q_source)                  # (total_q, H, D)
        fkv = torch.cat((kv, kv_recv)).index_select(0, lay.kv_source)              # (total_kv, 2, HKV, D)
        fk, fv = fkv[:, 0].contiguous(), fkv[:, 1].contiguous()                    # (total_kv, HKV, D)
        fo, lse = server_forward(fq, fk, fv, lay)                # (total_q, H, D), (H, total_q)

        # Rows of home-served tasks land in the token buffer, the others in the send buffer.
        o_all = q.new_zeros((T + lay.o_lse.n_send, H, D))                          # (T + n_o_send, H, D)
        o_all.index_copy_(0, lay.q_source, fo)
        o = o_all[:T].clone()                                                      # (T, H, D)
        o_recv = exchange_rows(o_all[T:], lay.o_lse, lay.mode)                     # (n_o_recv, H, D)
        o.index_copy_(0, lay.o_lse.recv_local, o_recv)

        # The server keeps what its backward needs (its fused inputs, O and LSE: the runtime's
        # keeping servers), so the backward moves only dO out and dQ, dK/dV back, and the LSE
        # stays on the server (the runtime's o_lse rows carry it home for its stateless
        # servers, whose homes send Q, O, LSE again with dO).
        ctx.save_for_backward(fq, fk, fv, fo, lse)
        ctx.lay = lay
        return o

    @staticmethod
    def backward(ctx, d_o):
        lay = ctx.lay
        fq, fk, fv, fo, lse = ctx.saved_tensors
        T, (H, D), (HKV, _) = lay.tokens, fq.shape[1:], fk.shape[1:]
        d_o = d_o.contiguous()                                                     # (T, H, D)
        do_recv = exchange_rows(d_o.index_select(0, lay.do.send_local), lay.do, lay.mode)  # (n_do_recv, H, D)
        fdo = torch.cat((d_o, do_recv)).index_select(0, lay.q_source)              # (total_q, H, D)
        fdq, fdk, fdv = server_backward(fq, fk, fv, fo, lse, fdo, lay)             # like fq, fk, fv

        # dQ: one row per query, like O.
        dq_all = fq.new_zeros((T + lay.dq.n_send, H, D))                           # (T + n_dq_send, H, D)
        dq_all.index_copy_(0, lay.q_source, fdq)
        dq = dq_all[:T].clone()                                                    # (T, H, D)
        dq.index_copy_(0, lay.dq.recv_local, exchange_rows(dq_all[T:], lay.dq, lay.mode))

        # dK/dV: a fused K/V row appears once per task that reads it, so sum (index_add_, in
        # fused order); then the holder adds the servers' partials, its own first and the
        # peers' ascending (the receive buffer's order): a fixed order, reproducible bits (on
        # CPU; CUDA's index_add_ adds atomically unless torch.use_deterministic_algorithms).
        dkv_all = fq.new_zeros((T + lay.dkv.n_send, 2, HKV, D))    # (T + n_dkv_send, 2, HKV, D)
        dkv_all.index_add_(0, lay.kv_source, torch.stack((fdk, fdv), dim=1))
        dkv = dkv_all[:T].clone()                                                  # (T, 2, HKV, D)
        dkv.index_add_(0, lay.dkv.recv_local, exchange_rows(dkv_all[T:], lay.dkv, lay.mode))
        return dq, dkv[:, 0], dkv[:, 1], None


# ---------------------------------------------------------------------------------------------
# Scaffolding: inputs, the single-process reference, the check, the launcher.
# ---------------------------------------------------------------------------------------------

def make_inputs(args, step, rank, tokens):
    """Rank `rank`'s Q, K, V and the loss weights W (dL/dO) of step `step`, float32 (a fixed
    seed per (step, rank), so the reference can redraw any rank's)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    q = torch.randn((tokens, args.heads, args.head_dim), generator=g)      # (T, H, D)
    k = torch.randn((tokens, args.kv_heads, args.head_dim), generator=g)   # (T, HKV, D)
    v = torch.randn((tokens, args.kv_heads, args.head_dim), generator=g)   # (T, HKV, D)
    w = torch.randn((tokens, args.heads, args.head_dim), generator=g)      # (T, H, D)
    return q, k, v, w


def reference_attention(q, k, v):
    """Causal attention over one whole document: q (L, H, D), k, v (L, HKV, D) -> (L, H, D);
    query head h reads kv head h // (H / HKV), scale 1/sqrt(D) (the kernel's conventions)."""
    n = q.shape[0]
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(q.shape[2])         # (H, L, L)
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hij,jhd->ihd", s.softmax(dim=-1), v)


def reference(args, step, batch, rank):
    """O, dQ, dK, dV of rank `rank`'s token buffer from attention over whole documents, in
    float64 with torch autograd (independent of the plan, the exchanges and the kernel)."""
    sizes = [batch.rank_tokens(p) for p in range(batch.ranks)]
    start = [sum(sizes[:p]) for p in range(batch.ranks)]
    ins = [make_inputs(args, step, p, sizes[p]) for p in range(batch.ranks)]
    q, k, v, w = (torch.cat([x[i] for x in ins]).double().requires_grad_(i < 3) for i in range(4))
    # Global row of every (doc, position), from the batch's pieces (token buffers concatenated).
    rows, mine = {}, set()
    for p, pieces in enumerate(batch.per_rank):
        row = start[p]
        for doc, offset, length, doc_len in pieces:
            rows.setdefault(doc, [None] * doc_len)[offset:offset + length] = range(row, row + length)
            row += length
            if p == rank:
                mine.add(doc)
    o = torch.zeros_like(q)
    # Documents are independent: only those this rank holds rows of, one backward each (the
    # gradients accumulate in the leaves; a (H, L, L) graph at a time).
    for doc in sorted(mine):
        idx = torch.tensor(rows[doc])
        od = reference_attention(q[idx], k[idx], v[idx])
        o[idx] = od.detach()
        (od * w[idx]).sum().backward()
    mine_rows = slice(start[rank], start[rank] + sizes[rank])
    return [x[mine_rows] for x in (o, q.grad, k.grad, v.grad)]


def model_spec(args):
    # The plan's byte counts (and so the planner's cost of moving a row) follow the real shapes.
    hidden = args.heads * args.head_dim
    return distca.ModelSpec("example", 1, hidden, args.heads, args.kv_heads, args.head_dim, 4 * hidden, 32000)


def run_step(args, step, rank, world):
    # A data loader would hand each rank its packed documents; here every rank draws the
    # same batch and keeps its own pieces (what it would know by itself).
    batch = distca.workload(dist=args.dist, ranks=world, tokens_per_rank=args.tokens_per_rank,
                            seed=args.seed, layout=args.layout, max_doc_len=args.max_doc_len, batch=step)
    plan = plan_step(batch.per_rank[rank], args.tokens_per_rank, model_spec(args), args.scheduler,
                     args.tolerance)
    lay = RankLayout(plan, rank, args.exchange)

    q, k, v, w = make_inputs(args, step, rank, lay.tokens)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o = CADAttention.apply(q, k, v, lay)      # (T, H, D); a model would call this in every layer
    (o * w).sum().backward()                  # dL/dO = w; collective: every rank runs backward
    got = [o.detach(), q.grad, k.grad, v.grad]
    if args.corrupt and step == 0 and rank == world - 1:
        got[2][0, 0, 0] += 1e-3               # for the tests: the check must catch one wrong value

    want = reference(args, step, plan.batch, rank)
    err = torch.tensor([(g.double() - r).abs().max().item() if g.numel() else 0.0 for g, r in zip(got, want)])
    bad = torch.tensor([float(not torch.allclose(g.double(), r, rtol=RTOL, atol=ATOL))
                        for g, r in zip(got, want)])
    # One digest of every rank's results: equal digests are equal bits (the exchanges and the
    # dK/dV sums have a fixed order, so a2a and p2p, any launcher, give the same).
    digests = [None] * world
    dist.all_gather_object(digests, hashlib.sha256(b"".join(t.numpy().tobytes() for t in got)).hexdigest())
    moved = torch.tensor([float(lay.q.n_send), float(lay.kv.n_send)])
    for t, op in ((err, dist.ReduceOp.MAX), (bad, dist.ReduceOp.MAX), (moved, dist.ReduceOp.SUM)):
        dist.all_reduce(t, op=op)
    if rank == 0:
        s = plan.summary
        print(f"step {step}: {world} ranks, {s['documents']} documents, {s['tasks']} tasks, "
              f"{int(moved[0])} query rows and {int(moved[1])} K/V rows sent to servers; "
              f"max |err| o {err[0]:.2e} dq {err[1]:.2e} dk {err[2]:.2e} dv {err[3]:.2e}; "
              f"bits {hashlib.sha256(''.join(digests).encode()).hexdigest()[:16]}", flush=True)
    return [n for n, b in zip(("O", "dQ", "dK", "dV"), bad.tolist()) if b]


def worker(rank, world, args, init_method):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        failed = sorted({n for step in range(args.steps) for n in run_step(args, step, rank, world)})
    finally:
        dist.destroy_process_group()
    if failed:
        if rank == 0:
            print(f"distca: error: {', '.join(failed)} differ from the single-process reference "
                  f"(rtol {RTOL:g}, atol {ATOL:g})", file=sys.stderr, flush=True)
        sys.exit(1)
    if rank == 0:
        print(f"ok: O, dQ, dK, dV match the float64 single-process reference (rtol {RTOL:g}, atol {ATOL:g})",
              flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2, help="processes to spawn (ignored under torchrun)")
    p.add_argument("--steps", type=int, default=2, help="training steps (a new batch and plan each)")
    p.add_argument("--dist", default="pretrain", help="document lengths (distca workload --dist)")
    p.add_argument("--tokens-per-rank", type=int, default=1024)
    p.add_argument("--layout", default="contiguous", help="contiguous | head-tail")
    p.add_argument("--max-doc-len", type=int, default=0, help="cap on document length (0: none)")
    p.add_argument("--scheduler", default="cad", help="cad | cad-symmetric | percp:N | ... (distca plan)")
    p.add_argument("--tolerance", type=float, default=0.05, help="the planner's load tolerance")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--exchange", choices=("a2a", "p2p"), default="a2a",
                   help="all_to_all_single, or grouped isend/irecv")
    p.add_argument("--threads", type=int, default=0,
                   help="torch and kernel threads per process (0: cores / processes)")
    p.add_argument("--corrupt", action="store_true", help=argparse.SUPPRESS)  # tests: the check must fail
    args = p.parse_args(argv)

    def fail(msg):
        print(f"distca: error: {msg}", file=sys.stderr)
        sys.exit(2)
    for name in ("world_size", "steps", "tokens_per_rank", "heads", "kv_heads", "head_dim"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive (got {getattr(args, name)})")
    if args.threads < 0:
        fail(f"--threads must be non-negative (got {args.threads})")
    if args.heads % args.kv_heads:
        fail(f"--kv-heads must divide --heads (got {args.kv_heads} and {args.heads})")
    if "WORLD_SIZE" in os.environ:  # under torchrun: its world size wins
        args.world_size = int(os.environ["WORLD_SIZE"])
    if args.threads == 0:
        args.threads = max(1, (os.cpu_count() or 1) // args.world_size)
    # The workload and planner options are checked here, before any process starts, with the
    # CLI's messages (they name the flag).
    try:
        b = distca.workload(dist=args.dist, ranks=args.world_size, tokens_per_rank=args.tokens_per_rank,
                            seed=args.seed, layout=args.layout, max_doc_len=args.max_doc_len)
        distca.plan(b, model=model_spec(args), scheduler=args.scheduler, tolerance=args.tolerance,
                    dtype="fp32")
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # The kernel's OpenMP threads: read when a process loads the module, so set before spawning.
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        worker(int(os.environ["RANK"]), args.world_size, args, "env://")
        return
    # Standalone: spawn the ranks on this machine; a file rendezvous needs no free port.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(worker, args=(args.world_size, args, f"file://{tmp}/rendezvous"),
                     nprocs=args.world_size, join=True)
        except mp.ProcessExitedException as e:  # a rank exited 1 (mismatch): it said why
            sys.exit(e.exit_code if e.exit_code and e.exit_code > 0 else 1)


if __name__ == "__main__":
    main()
