#!/usr/bin/env python3
"""The all-to-all baseline of goep's GPU benchmarks (DESIGN.md section 6).

What a PyTorch user would otherwise run for expert parallelism: a pack
(index_select of each token row once per destination rank), one
torch.distributed.all_to_all_single (NCCL on GPUs, gloo on CPUs) and a
permute into expert-major order; combine sends the rows back and sums each
token's returned rows in fp32. Timed like `eprun bench`: CUDA events around
each call on every rank (wall clock on CPUs), the cross-rank maximum per
iteration, median / p90 / p99 over the iterations after warm-up; GB/s =
received rows x hidden x dtype size per rank (mean over ranks) / median
time. In the same run: a device-to-device copy of the same bytes on every
rank and, when the process sees two GPUs or more, a peer copy between
GPUs 0 and 1 (the NVLink ceiling). Every run checks its results: rows
encode (source rank, token, column), receivers check every received and
permuted row, and combine's output is checked against n x row (n = the
token's destination ranks) rounded once.

The routing is uniform top-k (distinct experts per token, seeded per
rank); the layout (split sizes, routing exchange, permute indices) runs
once per case before the timed loop, as goep's Layout does.

Launch one process per GPU, with torchrun, eprun launch or mpirun:

    torchrun --nproc-per-node 8 scripts/a2a_baseline.py \\
        --tokens 128,4096 --hidden 7168 --experts 256 --topk 8 --json a2a.json
    eprun launch -n 8 -- python3 scripts/a2a_baseline.py ...
    mpirun -n 8 python3 scripts/a2a_baseline.py ...

(on a CPU-only machine it runs on gloo: eprun launch -n 4 -- python3 ...).
Keep NCCL_NVLS_ENABLE=0 on multi-GPU machines (set here if unset).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

CALLS = ["dispatch", "dispatch-permute", "combine", "unpermute-combine"]


def ints(s):
    return [int(v) for v in s.split(",") if v]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=ints, default=[128, 4096], help="tokens per rank (comma-separated list)")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--iters", type=int, default=50, help="timed iterations per call")
    p.add_argument("--warmup", type=int, default=10, help="untimed iterations per call")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--calls", default=",".join(CALLS), help="calls to time, of: " + ",".join(CALLS))
    p.add_argument("--json", help="write the record (every row, the environment) to FILE")
    a = p.parse_args()
    a.calls = [c for c in a.calls.split(",") if c]
    for c in a.calls:
        if c not in CALLS:
            p.error(f"--calls: unknown call {c!r}")
    if a.topk < 1 or a.topk > a.experts or a.hidden < 1 or a.iters < 1 or a.warmup < 0:
        p.error("need 1 <= topk <= experts, hidden >= 1, iters >= 1, warmup >= 0")
    if any(t < 0 for t in a.tokens):
        p.error("--tokens: negative")
    return a


def row_values(src, tok, hidden, dtype, device):
    """Rows that say where they come from, exact in bf16: column 0 is the
    source rank, columns 1 and 2 the token (mod 256 and / 256), the others
    a hash of (source, token, column) as multiples of 1/8 below 32, so no
    two rows of one run are equal (tokens below 65536, hidden >= 3)."""
    tok = tok.unsqueeze(1)
    src = src.reshape(-1, 1) if torch.is_tensor(src) else torch.full_like(tok, src)
    h = torch.arange(hidden, device=device).unsqueeze(0)
    v = ((src * 131 + tok * 7 + h) % 251).to(torch.float32) / 8
    ids = torch.cat([src, tok % 256, tok // 256], dim=1).to(torch.float32)
    n = min(3, hidden)
    v[:, :n] = ids[:, :n]
    return v.to(dtype)


def routing(seed, rank, T, E, K):
    """Rank's top-k routing, [T, K] distinct experts (any rank can draw any
    rank's, which the checks use)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + T)
    return torch.rand(T, E, generator=g).topk(K, dim=1).indices


def a2a(out, inp, out_splits, in_splits):
    """all_to_all_single of rows, as bytes (the same bytes move; gloo has
    no bf16)."""
    dist.all_to_all_single(out.view(torch.uint8), inp.view(torch.uint8), out_splits, in_splits)


class Timer:
    """Per-call time in microseconds: CUDA events on a GPU, else wall clock."""

    def __init__(self, cuda):
        self.cuda = cuda

    def __call__(self, fn):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) * 1e3
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6


def stats(xs):
    s = sorted(xs)

    def q(p):
        return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]

    return {"median": statistics.median(s), "p90": q(0.90), "p99": q(0.99), "min": s[0], "max": s[-1]}


def all_max(times, device):
    """Cross-rank maximum per iteration."""
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_sum(v, device):
    t = torch.tensor([float(v)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item()


class Case:
    """One shape: the routing, the layout and the buffers of one rank."""

    def __init__(self, a, T, dtype, device):
        R, rank = dist.get_world_size(), dist.get_rank()
        E, K, H = a.experts, a.topk, a.hidden
        if E % R:
            raise SystemExit(f"a2a_baseline: --experts {E} is not a multiple of the {R} ranks")
        L = E // R
        self.T, self.H, self.K, self.L, self.R = T, H, K, L, R
        self.device, self.dtype = device, dtype
        idx = routing(a.seed, rank, T, E, K).to(device)
        dest = idx // L
        tok = torch.arange(T, device=device)
        self.x = row_values(rank, tok, H, dtype, device)
        # Send order: destination ascending, then token ascending; a token
        # goes once to each rank that owns one of its experts.
        send_tok, send_slots, counts = [], [], []
        for d in range(R):
            m = (dest == d).any(dim=1)
            t = tok[m]
            send_tok.append(t)
            send_slots.append(torch.where(dest[m] == d, idx[m] - d * L, torch.full_like(idx[m], -1)))
            counts.append(int(t.numel()))
        self.send_tok = torch.cat(send_tok)
        self.send_counts = counts
        self.n_dest = (torch.stack([(dest == d).any(dim=1) for d in range(R)], dim=1).sum(dim=1)
                       if T else torch.zeros(0, dtype=torch.int64, device=device))
        rc = torch.empty(R, dtype=torch.int64, device=device)
        dist.all_to_all_single(rc, torch.tensor(counts, dtype=torch.int64, device=device))
        self.recv_counts = rc.tolist()
        N = sum(self.recv_counts)
        self.N = N
        # The receivers learn each row's token and local experts (layout).
        self.recv_tok = torch.empty(N, dtype=torch.int64, device=device)
        dist.all_to_all_single(self.recv_tok, self.send_tok, self.recv_counts, self.send_counts)
        slots = torch.cat(send_slots) if T else torch.zeros(0, K, dtype=torch.int64, device=device)
        self.recv_slots = torch.empty(N, K, dtype=torch.int64, device=device)
        dist.all_to_all_single(self.recv_slots, slots.contiguous(), self.recv_counts, self.send_counts)
        self.recv_src = torch.repeat_interleave(torch.arange(R, device=device),
                                                torch.tensor(self.recv_counts, device=device))
        # Expert-major permutation: for each local expert, the rows (in
        # receive order) with a slot for it.
        perm = [torch.nonzero((self.recv_slots == l).any(dim=1)).flatten() for l in range(L)]
        self.perm_rows = torch.cat(perm) if perm else torch.zeros(0, dtype=torch.int64, device=device)
        # What this rank must receive, from every rank's routing drawn
        # here (not from the layout's exchange): rows of (source, token)
        # in receive order, and the expert-major order of their copies.
        want_src, want_tok, want_slots = [], [], []
        for s in range(R):
            d = routing(a.seed, s, T, E, K)
            m = (d // L == rank).any(dim=1)
            want_tok.append(torch.nonzero(m).flatten())
            want_src.append(torch.full((int(m.sum()),), s, dtype=torch.int64))
            want_slots.append(torch.where(d[m] // L == rank, d[m] - rank * L, torch.full_like(d[m], -1)))
        self.want_src = torch.cat(want_src).to(device)
        self.want_tok = torch.cat(want_tok).to(device)
        ws = torch.cat(want_slots).to(device)
        self.want_perm = torch.cat([torch.nonzero((ws == l).any(dim=1)).flatten() for l in range(L)])
        # Each token's copies on each rank (unpermute-combine sums them).
        self.copies = torch.stack([(dest == d).sum(dim=1) for d in range(R)], dim=1).to(torch.float32) \
            if T else torch.zeros(0, R, device=device)
        # Buffers of the timed calls.
        self.send_x = torch.empty(len(self.send_tok), H, dtype=dtype, device=device)
        self.recv_x = torch.empty(N, H, dtype=dtype, device=device)
        self.perm_x = torch.empty(len(self.perm_rows), H, dtype=dtype, device=device)
        self.back_x = torch.empty(len(self.send_tok), H, dtype=dtype, device=device)
        self.out = torch.empty(T, H, dtype=dtype, device=device)
        self.acc = torch.empty(T, H, dtype=torch.float32, device=device)
        self.z = torch.empty(N, H, dtype=dtype, device=device)
        self.zacc = torch.empty(N, H, dtype=torch.float32, device=device)
        # recv_x and perm_x hold what the combine calls send back, whatever
        # calls are timed.
        self.dispatch_permute()

    # The calls. Each runs on the current stream; the timer synchronizes.
    def dispatch(self):
        torch.index_select(self.x, 0, self.send_tok, out=self.send_x)
        a2a(self.recv_x, self.send_x, self.recv_counts, self.send_counts)

    def dispatch_permute(self):
        self.dispatch()
        torch.index_select(self.recv_x, 0, self.perm_rows, out=self.perm_x)

    def combine(self):
        # The received rows go back to their sources (z = recv_x), which
        # sum each token's rows in fp32 and round once.
        a2a(self.back_x, self.recv_x, self.send_counts, self.recv_counts)
        self.acc.zero_()
        self.acc.index_add_(0, self.send_tok, self.back_x.to(torch.float32))
        self.out.copy_(self.acc)

    def unpermute_combine(self):
        # Unpermute: each received row is the fp32 sum of its permuted
        # copies (perm_x), rounded once; then combine.
        self.zacc.zero_()
        self.zacc.index_add_(0, self.perm_rows, self.perm_x.to(torch.float32))
        self.z.copy_(self.zacc)
        a2a(self.back_x, self.z, self.send_counts, self.recv_counts)
        self.acc.zero_()
        self.acc.index_add_(0, self.send_tok, self.back_x.to(torch.float32))
        self.out.copy_(self.acc)

    def run(self, call):
        {"dispatch": self.dispatch, "dispatch-permute": self.dispatch_permute,
         "combine": self.combine, "unpermute-combine": self.unpermute_combine}[call]()

    # The checks: the number of wrong rows of the call's output.
    def wrong(self, call):
        H, dev = self.H, self.device
        if call in ("dispatch", "dispatch-permute"):
            if self.N != len(self.want_tok):
                return max(self.N, len(self.want_tok))  # the wrong rows came
            want = row_values(self.want_src, self.want_tok, H, self.dtype, dev)
            bad = int((self.recv_x != want).any(dim=1).sum())
            if call == "dispatch-permute":
                if len(self.perm_rows) != len(self.want_perm):
                    return bad + max(len(self.perm_rows), len(self.want_perm))
                bad += int((self.perm_x != want[self.want_perm]).any(dim=1).sum())
            return bad
        # combine: each token comes back once per destination rank, as
        # sent (combine), or (unpermute-combine) as the fp32 sum of its c
        # permuted copies there, rounded to the dtype; the source sums them
        # in fp32 and rounds once. The values are small, so every fp32 sum
        # and product here is exact.
        if not self.T:
            return 0
        base = row_values(dist.get_rank(), torch.arange(self.T, device=dev), H, torch.float32, dev)
        if call == "combine":
            want = (base * self.n_dest.to(torch.float32).unsqueeze(1)).to(self.dtype)
        else:
            acc = torch.zeros(self.T, H, dtype=torch.float32, device=dev)
            for d in range(self.R):
                acc += (base * self.copies[:, d:d + 1]).to(self.dtype).to(torch.float32)
            want = acc.to(self.dtype)
        return int((self.out != want).any(dim=1).sum())


def copy_baseline(nbytes, timer, iters, warmup, device):
    """A device-to-device (host: memory) copy of nbytes on every rank."""
    n = max(1, nbytes)
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    return [timer(lambda: dst.copy_(src)) for _ in range(iters)]


def peer_copy(nbytes, iters, warmup):
    """GB/s of a copy from GPU 0 to GPU 1 (CUDA events on GPU 0), or None."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    with torch.cuda.device(0):
        timer = Timer(True)
        for _ in range(warmup):
            dst.copy_(src)
        ts = [timer(lambda: dst.copy_(src, non_blocking=True)) for _ in range(iters)]
    return {"bytes": nbytes, "time_us": stats(ts), "GBps": nbytes / statistics.median(ts) / 1e3,
            "p2p": torch.cuda.can_device_access_peer(0, 1)}


def rendezvous_env():
    """Fills torch's env:// variables from the launcher's: torchrun sets
    them; eprun launch sets RANK, WORLD_SIZE, LOCAL_RANK and
    GOEP_MASTER_ADDR/PORT (free for torch's store, since no goep program
    runs here); mpirun sets OMPI_COMM_WORLD_* (then MASTER_ADDR defaults
    to 127.0.0.1 and MASTER_PORT to 29500: one host)."""
    e = os.environ
    for ours, theirs in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
                         ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")):
        if ours not in e and theirs in e:
            e[ours] = e[theirs]
    e.setdefault("MASTER_ADDR", e.get("GOEP_MASTER_ADDR", "127.0.0.1"))
    e.setdefault("MASTER_PORT", e.get("GOEP_MASTER_PORT", "29500"))
    e.setdefault("RANK", "0")
    e.setdefault("WORLD_SIZE", "1")


def main():
    a = parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rendezvous_env()
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, R = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    timer = Timer(cuda)
    env = {
        "torch": torch.__version__, "backend": dist.get_backend(), "world_size": R,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "gpu": torch.cuda.get_device_name() if cuda else None, "host": platform.node(),
        "python": platform.python_version(),
        "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("NCCL_", "NVSHMEM_", "TORCH_SYMM"))},
    }
    rows = []
    if rank == 0:
        print(f"# a2a baseline: torch {env['torch']} {env['backend']} ranks {R} experts {a.experts} "
              f"topk {a.topk} hidden {a.hidden} {a.dtype} iters {a.iters} (+{a.warmup} warm-up)", flush=True)
        print(f"# {'call':<18} {'tokens':>7} {'time_us':>10} {'p99_us':>10} {'GBps':>8} {'copy_GBps':>9} {'ratio':>6} {'wrong':>6}")
    for T in a.tokens:
        c = Case(a, T, dtype, device)
        nbytes = c.N * a.hidden * c.x.element_size()
        mean_bytes = all_sum(nbytes, device) / R
        copy_t = all_max(copy_baseline(nbytes, timer, a.iters, a.warmup, device), device)
        copy_gbps = mean_bytes / statistics.median(copy_t) / 1e3
        for call in a.calls:
            for _ in range(a.warmup):
                c.run(call)
            times = []
            for _ in range(a.iters):
                dist.barrier()
                times.append(timer(lambda: c.run(call)))
            if cuda:
                torch.cuda.synchronize()
            wrong = int(all_sum(c.wrong(call), device))
            t = stats(all_max(times, device))
            gbps = mean_bytes / t["median"] / 1e3
            rows.append({"call": call, "tokens": T, "hidden": a.hidden, "topk": a.topk, "experts": a.experts,
                         "dtype": a.dtype, "ranks": R, "time_us": t, "bytes_per_rank": mean_bytes, "GBps": gbps,
                         "copy_time_us": stats(copy_t), "copy_GBps": copy_gbps, "ratio_to_copy": gbps / copy_gbps if copy_gbps else None,
                         "wrong": wrong})
            if rank == 0:
                print(f"  {call:<18} {T:>7} {t['median']:>10.1f} {t['p99']:>10.1f} {gbps:>8.2f} "
                      f"{copy_gbps:>9.2f} {gbps / copy_gbps if copy_gbps else 0:>6.2f} {wrong:>6}", flush=True)
        c = None  # free the case's buffers before the next one is built
    peer = peer_copy(64 << 20, a.iters, a.warmup) if rank == 0 else None
    bad = sum(r["wrong"] for r in rows)
    if rank == 0:
        if peer:
            print(f"# peer copy GPU 0 -> 1: {peer['GBps']:.1f} GB/s ({peer['bytes']} bytes, p2p {peer['p2p']})")
        print(f"# check: {'OK' if bad == 0 else f'{bad} WRONG rows'}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"env": env, "config": vars(a), "rows": rows, "peer_copy": peer, "wrong": bad}, f, indent=1)
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
