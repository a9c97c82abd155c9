"""Benchmark: where a `make demo` point's time goes, and the analysis stage before/after, side by side in one run.

Reads a finished point of a demo run (default: the tiny registry's demo root, unit tiny-math-s0, checkpoint 25):
its `timings.json` (wall seconds per stage as the demo ran it: rollouts, scoring, analysis). Then, `--reps` times
from the point's cached features, it re-runs the point's whole analysis (`PointRun.analysis`: 10,000 replicates,
every bound method's inputs) and its Gram-space stage on its own (the two Gram halves and `bootstrap_gram`, called
as `analyse_point` calls them; checked against the analysis's own replicates), that stage alternating the code
before this change (kept here: the Gram matrices by `det_matmul` over every row, resampled weights of every group,
passed to `bootstrap_gram` as its `weights`) and after (the package's: `live_gram` skips zero rows;
`resampled_weights` weighs the non-homogeneous groups only). It prints median CPU and wall seconds per stage (Gram
matrices, bootstrap, the rest of the analysis), their ratios, and whether the two arms' outputs are byte-identical
(the Gram matrices and every bootstrap array). The whole analysis runs the package's code only, so the analysis
before this change is derived: the rest of the analysis plus the old Gram-space stage.

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

from stalebook.core import Domain, group_advantages
from stalebook.point import PointConfig, PointRun
from stalebook.protocol import SPLITS, GramHalf, Rollouts, bootstrap_gram, det_matmul, resampled_weights


def old_build(cand, val) -> GramHalf:
    "GramHalf.build before: det_matmul over every row (zero rows included)."
    V, W = cand.vectors, val.vectors.reshape(-1, val.d)
    return GramHalf(np.einsum("nkd,nld->nkl", V, V), det_matmul(W, V.reshape(-1, cand.d).T), det_matmul(W, W.T), val.n)


def old_resampled_weights(rewards, idx, std=True, eps=1e-6):
    "resampled_weights before: every group's advantages (homogeneous groups give 0)."
    c, n, K = idx.shape
    a = group_advantages(np.take_along_axis(np.broadcast_to(rewards, idx.shape), idx, -1), std, eps)
    flat = (np.arange(c * n)[:, None] * K + idx.reshape(c * n, K)).ravel()
    return np.bincount(flat, weights=a.ravel(), minlength=c * n * K).reshape(c, n, K)


ARMS = {"before": (old_build, old_resampled_weights), "after": (GramHalf.build, resampled_weights)}


def timed(fn):
    "(result of fn(), CPU seconds, wall seconds)."
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def gram_stage_inputs(p: PointRun) -> tuple:
    """(cand, val, the rest of `bootstrap_gram`'s arguments) of the point's analysis, as `PointRun.analysis` and
    `analyse_point` make them (its observed sets and tie keys read from the analysis's result `p.res`)."""
    cfg, ro = p.cfg, lambda role, h: Rollouts(p.fresh[role, h]["rewards"], p.fresh[role, h]["vectors"])
    dom = Domain(cfg.seed, ("point", "analysis", cfg.checkpoint))
    fixed = {nm: m for nm, m in p.res.selected.items() if nm not in ("control", "dilute")}
    kw = dict(
        chunk=None, std=cfg.std_normalize, eps=cfg.adv_eps, keep_scores=True, control=dom.child("control", "boot")
    )
    args = (fixed, p.res.keys["A"], p.res.keys["B"], cfg.k, dom, cfg.n_boot)
    return {h: ro("candidates", h) for h in SPLITS}, {h: ro("validation", h) for h in SPLITS}, args, kw


def run_gram_stage(p: PointRun, inputs, variant: str) -> tuple[dict, str, np.ndarray]:
    "The Gram-space stage with the `before` or `after` code: (seconds, digest of its outputs, its Rel replicates)."
    build, weights = ARMS[variant]
    cand, val, args, kw = inputs
    halves, g_cpu, g_wall = timed(lambda: {h: build(cand[h], val[h]) for h in "AB"})
    bt, b_cpu, b_wall = timed(lambda: bootstrap_gram(cand, val, *args, **kw, halves=halves, weights=weights))
    digest = hashlib.sha256()
    for h in "AB":
        for m in (halves[h].G, halves[h].CT, halves[h].GW):
            digest.update(np.ascontiguousarray(m).tobytes())
    for k in sorted(bt):
        digest.update(k.encode() + np.ascontiguousarray(bt[k]).tobytes())
    t = {"gram_cpu": g_cpu, "bootstrap_cpu": b_cpu, "gram_wall": g_wall, "bootstrap_wall": b_wall}
    return t, digest.hexdigest(), bt["rel"]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", default="runs/tiny/units/tiny-math-s0")
    ap.add_argument("--checkpoint", type=int, default=25)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--out", default=str(Path(__file__).resolve().parents[1] / "results" / "records" / "bench_demo_time.json")
    )
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
    inputs = None
    for r in range(a.reps):
        _, a_cpu, a_wall = timed(p.analysis)  # the whole analysis, the package's code
        inputs = inputs or gram_stage_inputs(p)
        stage = {}
        for v in ("before", "after") if r % 2 == 0 else ("after", "before"):
            stage[v], d, rel = run_gram_stage(p, inputs, v)
            assert np.array_equal(rel, p.res.boot["rel"]), f"{v}: not the analysis's own Gram-space stage"
            digests.setdefault(v, d)
            assert digests[v] == d, f"{v}: Gram-space stage not reproducible"
        for v in ("before", "after"):  # the rest of the analysis is the same code in both arms
            t = dict(stage[v])
            t["rest_cpu"] = a_cpu - stage["after"]["gram_cpu"] - stage["after"]["bootstrap_cpu"]
            t["analysis_cpu"] = t["rest_cpu"] + t["gram_cpu"] + t["bootstrap_cpu"]
            t["analysis_wall"] = a_wall - stage["after"]["gram_wall"] - stage["after"]["bootstrap_wall"]
            t["analysis_wall"] += t["gram_wall"] + t["bootstrap_wall"]
            runs[v].append(t)
            print(f"  rep {r} {v:6s} " + "  ".join(f"{k} {x:6.2f}" for k, x in t.items()), flush=True)
    med = {v: {k: statistics.median(t[k] for t in ts) for k in ts[0]} for v, ts in runs.items()}
    same = digests["before"] == digests["after"]
    print(f"\nmedians of {a.reps} (CPU and wall seconds; the machine may be shared):")
    print(f"  {'stage':16s} {'before':>8s} {'after':>8s} {'ratio':>7s}")
    for k in med["before"]:
        b, f = med["before"][k], med["after"][k]
        print(f"  {k:16s} {b:8.2f} {f:8.2f} {b / f if f > 0 else float('nan'):6.2f}x")
    print(f"  byte-identical outputs (Gram matrices, every bootstrap array): {'yes' if same else 'NO'}")
    out = dict(
        point=str(pdir), demo_stage_wall_s=demo, reps=a.reps, median=med, runs=runs, identical=same, digests=digests
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
