"""Benchmark: where a `make demo` point's time goes, and the analysis stage before/after, side by side in one run.

Reads a finished point of a demo run (default: the tiny registry's demo root, unit tiny-math-s0, checkpoint 25):
its `timings.json` (wall seconds per stage as the demo ran it: rollouts, scoring, analysis). Then it re-runs the
point's analysis (`analysis.analyse_point`: 10,000 replicates, every bound method's inputs) from the point's cached
features, `--reps` times, alternating the code before this change (the Gram matrices by `det_matmul` over every
row, resampled weights of every group) and after (`live_gram`: zero rows skipped; weights of the non-homogeneous
groups only), and prints median CPU and wall seconds per stage (Gram matrices, bootstrap, the rest), their
ratios, and whether the two results are byte-identical (every boot array and the summary's JSON).

    python benchmarks/bench_demo_time.py [--unit runs/tiny/units/tiny-math-s0] [--checkpoint 25] [--reps 3]
"""

import argparse
import dataclasses
import hashlib
import json
import statistics
import time
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
import numpy as np  # isort: skip

from stalebook import protocol
from stalebook.core import group_advantages, hash_json
from stalebook.point import PointConfig, PointRun


def old_build(cls, cand, val):
    "GramHalf.build before: det_matmul over every row (zero rows included)."
    V, W = cand.vectors, val.vectors.reshape(-1, val.d)
    return cls(
        np.einsum("nkd,nld->nkl", V, V),
        protocol.det_matmul(W, V.reshape(-1, cand.d).T),
        protocol.det_matmul(W, W.T),
        val.n,
    )


def old_resampled_weights(rewards, idx, std=True, eps=1e-6):
    "resampled_weights before: every group's advantages (homogeneous groups give 0)."
    c, n, K = idx.shape
    a = group_advantages(np.take_along_axis(np.broadcast_to(rewards, idx.shape), idx, -1), std, eps)
    flat = (np.arange(c * n)[:, None] * K + idx.reshape(c * n, K)).ravel()
    return np.bincount(flat, weights=a.ravel(), minlength=c * n * K).reshape(c, n, K)


class Timed:
    "Accumulate CPU and wall seconds of a wrapped function."

    def __init__(self, fn):
        self.fn, self.cpu, self.wall = fn, 0.0, 0.0

    def __call__(self, *a, **kw):
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            return self.fn(*a, **kw)
        finally:
            self.cpu += time.process_time() - c0
            self.wall += time.perf_counter() - w0


def run_analysis(p: PointRun, variant: str) -> tuple[dict, dict]:
    "One analysis of the point with the `before` or `after` code: (stage seconds, digest of its outputs)."
    new_build, new_rw = protocol.GramHalf.__dict__["build"], protocol.resampled_weights
    if variant == "before":
        protocol.GramHalf.build = classmethod(old_build)
        protocol.resampled_weights = old_resampled_weights
    build = Timed(protocol.GramHalf.build)
    boot = Timed(protocol.bootstrap_gram)
    protocol.GramHalf.build, protocol.bootstrap_gram = build, boot
    try:
        c0, w0 = time.process_time(), time.perf_counter()
        summ = p.analysis()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        protocol.GramHalf.build, protocol.resampled_weights = new_build, new_rw
        protocol.bootstrap_gram = boot.fn
    arrays = p.res.to_arrays()
    digest = hashlib.sha256()
    for k in sorted(arrays):
        digest.update(k.encode() + np.ascontiguousarray(arrays[k]).tobytes())
    t = {
        "gram_cpu": build.cpu,
        "bootstrap_cpu": boot.cpu,
        "rest_cpu": cpu - build.cpu - boot.cpu,
        "analysis_cpu": cpu,
        "analysis_wall": wall,
    }
    return t, {"boot": digest.hexdigest(), "summary": hash_json(summ)}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", default="runs/tiny/units/tiny-math-s0")
    ap.add_argument("--checkpoint", type=int, default=25)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "bench_demo_time.json"))
    a = ap.parse_args(argv)
    unit, c = Path(a.unit), a.checkpoint
    pdir = unit / "points" / f"c-{c:06d}"
    res = json.loads((pdir / "result.json").read_text())
    demo = json.loads((pdir / "timings.json").read_text())
    fields = {f.name for f in dataclasses.fields(PointConfig)}
    conf = {k: v for k, v in res["manifest"]["config"].items() if k in fields}
    cfg = PointConfig(**conf, run=str(unit / "train"), out=str(pdir))
    p = PointRun(cfg, progress=False)  # stores and features are found complete: nothing is recomputed
    p.stale_rollouts(), p.fresh_rollouts(), p.features()
    print(f"{pdir}: the demo's own stage wall times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in demo.items()))
    runs = {"before": [], "after": []}
    digests = {}
    for r in range(a.reps):
        for v in ("before", "after") if r % 2 == 0 else ("after", "before"):
            t, d = run_analysis(p, v)
            runs[v].append(t)
            digests.setdefault(v, d)
            assert digests[v] == d, f"{v}: analysis not reproducible"
            print(f"  rep {r} {v:6s} " + "  ".join(f"{k} {x:6.2f}" for k, x in t.items()), flush=True)
    med = {v: {k: statistics.median(t[k] for t in ts) for k in ts[0]} for v, ts in runs.items()}
    same = digests["before"] == digests["after"]
    print(f"\nmedians of {a.reps} (CPU and wall seconds; the machine may be shared):")
    print(f"  {'stage':16s} {'before':>8s} {'after':>8s} {'ratio':>7s}")
    for k in med["before"]:
        b, f = med["before"][k], med["after"][k]
        print(f"  {k:16s} {b:8.2f} {f:8.2f} {b / f if f > 0 else float('nan'):6.2f}x")
    print(f"  byte-identical outputs (every boot array, summary JSON): {'yes' if same else 'NO'}")
    out = dict(
        point=str(pdir), demo_stage_wall_s=demo, reps=a.reps, median=med, runs=runs, identical=same, digests=digests
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
