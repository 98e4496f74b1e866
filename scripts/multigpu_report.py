#!/usr/bin/env python3
"""The multi-GPU report of one run: goep against the peer-copy ceiling and
against NCCL.

    python3 scripts/multigpu_report.py EPRUN.json [EPRUN.json...] --nccl NCCL.json

EPRUN.json are `eprun bench --json` records (scripts/multigpu-run.sh writes
them for the DeepSeek-V3 decode and prefill shapes); NCCL.json is
scripts/a2a_baseline.py's record of the same run, which also holds the
GPU 0 -> 1 peer copy. For every goep row (call, tokens, mode, dtype) it
prints: the median time, nvl GB/s (DESIGN.md section 6: every received
row) and its ratio to the peer-copy GB/s (the NVLink ceiling; goal 0.9 at
4096 tokens), the GB/s of the rows read from another GPU only
(nvl_peer_GBps, which the peer copy bounds; with R GPUs about (R-1)/R of
the rows, so at EP2 the first ratio counts half the rows twice over) and
its ratio to the peer copy, the NCCL
baseline's time and GB/s for the same call, tokens, hidden, top-k and dtype
("-" where it has none), and goep's speedup
over it (NCCL time / goep time). Then the targets (docs/PERFORMANCE.md,
section 1.5): dispatch and combine at 4096 tokens against the ceiling, and at
128 tokens dispatch under 40 us and combine under 50 us (stated for EP8),
each marked met or not. A Markdown table with
--markdown (for docs/PERFORMANCE.md). Exits 1 when an input has wrong rows.
"""

import argparse
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("eprun", nargs="+", help="eprun bench --json records")
    p.add_argument("--nccl", help="scripts/a2a_baseline.py --json record of the same run")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    a = p.parse_args()

    nccl, peer, bad = {}, None, 0
    if a.nccl:
        rec = load(a.nccl)
        bad += rec.get("wrong", 0)
        for r in rec["rows"]:
            nccl[(r["call"], r["tokens"], r["hidden"], r["topk"], r["dtype"])] = r
        if rec.get("peer_copy"):
            peer = rec["peer_copy"]["GBps"]

    rows = []
    for path in a.eprun:
        rec = load(path)
        bad += rec.get("wrong", 0)
        launcher = rec.get("launcher", "")
        for r in rec["rows"]:
            t, gbps, pgbps = r["time"]["median_us"], r["nvl_GBps"], r.get("nvl_peer_GBps")
            n = nccl.get((r["call"], r["tokens"], r["hidden"], r["topk"], r["dtype"]))
            rows.append({
                "launcher": launcher, "ranks": r["ranks"], "call": r["call"], "tokens": r["tokens"],
                "mode": r["mode"], "dtype": r["dtype"], "us": t, "p99": r["time"]["p99_us"], "GBps": gbps,
                "peer": gbps / peer if peer else None,
                "pGBps": pgbps, "ppeer": pgbps / peer if peer and pgbps is not None else None,
                "nccl_us": n["time_us"]["median"] if n else None, "nccl_GBps": n["GBps"] if n else None,
                "speedup": n["time_us"]["median"] / t if n and t > 0 else None,
                "wrong": r.get("wrong", 0),
            })

    cols = [("launcher", "{}"), ("ranks", "{}"), ("call", "{}"), ("tokens", "{}"), ("mode", "{}"),
            ("dtype", "{}"), ("us", "{:.1f}"), ("p99", "{:.1f}"), ("GBps", "{:.1f}"), ("peer", "{:.2f}"),
            ("pGBps", "{:.1f}"), ("ppeer", "{:.2f}"),
            ("nccl_us", "{:.1f}"), ("nccl_GBps", "{:.1f}"), ("speedup", "{:.2f}"), ("wrong", "{}")]
    names = {"us": "time_us", "p99": "p99_us", "GBps": "nvl_GBps", "peer": "vs_peer_copy",
             "pGBps": "nvl_peer_GBps", "ppeer": "peer_vs_copy", "speedup": "vs_nccl"}

    def cell(r, k, f):
        return "-" if r[k] is None else f.format(r[k])

    if a.markdown:
        print("| " + " | ".join(names.get(k, k) for k, _ in cols) + " |")
        print("|" + "|".join("---" if k in ("launcher", "call", "mode", "dtype") else "---:" for k, _ in cols) + "|")
        for r in rows:
            print("| " + " | ".join(cell(r, k, f) for k, f in cols) + " |")
    else:
        print("  ".join(f"{names.get(k, k):>12}" for k, _ in cols))
        for r in rows:
            print("  ".join(f"{cell(r, k, f):>12}" for k, f in cols))

    print()
    print(f"# peer copy GPU 0 -> 1: {peer:.1f} GB/s" if peer else "# no peer copy in the NCCL record (one GPU?)")
    for r in rows:
        goal = None
        if r["tokens"] == 4096 and r["call"] in ("dispatch", "combine") and r["peer"] is not None:
            wire = f", {r['ppeer']:.2f} counting only the rows read from another GPU" if r["ppeer"] is not None else ""
            goal = (f"{r['call']} 4096 tokens {r['mode']} ({r['launcher']}, EP{r['ranks']}): {r['peer']:.2f} of the peer copy{wire}",
                    r["peer"] >= 0.9, "goal 0.9, DESIGN.md's bytes")
        if r["tokens"] == 128 and r["call"] in ("dispatch", "combine"):
            limit = 40 if r["call"] == "dispatch" else 50
            goal = (f"{r['call']} 128 tokens {r['mode']} ({r['launcher']}, EP{r['ranks']}): {r['us']:.1f} us",
                    r["us"] < limit, f"goal < {limit} us at EP8")
        if goal:
            print(f"# {'met' if goal[1] else 'NOT met'}: {goal[0]} ({goal[2]})")
    if bad:
        print(f"# {bad} WRONG rows in the inputs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
