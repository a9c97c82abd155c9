"""Benchmark: where a `make demo` point's time goes, and the analysis's replicate stage before/after, side by side.

Reads a finished point of a demo run (default: the demo's root, unit tiny-math-s0, checkpoint 25): its
`timings.json` (wall seconds per stage as the demo ran it: rollouts, scoring, analysis). Then, `--reps` times from
the point's cached features, it re-runs the point's whole analysis (`point.analysis`: 10,000 replicates, every
bound method's inputs) and its replicate stage on its own (the two reference halves and `bootstrap_gram`, called as
`analyse_point` calls them; the package's arm checked against the analysis's own replicates), alternating the code
before this change (kept here: the cross-Gram form, `CrossGramHalf` — C^T = W V^T [M, nK] and G_W = W W^T [M, M]
built once by `det_matmul` on the nonzero rows, then per replicate omega C^T and omega G_W omega) and after (the
package's `GramHalf`: per replicate g*_val = omega W, then V g*_val). It prints median CPU and wall seconds per stage
(the halves' matrices, the bootstrap, the rest of the analysis) and their ratios, and how far the two arms' outputs
are apart (the same numbers summed in another order: every replicate score within 1e-12, Rel_k replicates equal
but for a tie the order can flip). The whole analysis runs the package's code only, so the analysis before this
change is derived: the rest of the analysis plus the old replicate stage.

    python benchmarks/bench_demo_time.py [--unit runs/tiny-demo/units/tiny-math-s0] [--checkpoint 25] [--reps 3]
"""

import argparse
import dataclasses
import hashlib
import json
import statistics
import time
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
from benchargs import add_reps

import numpy as np  # isort: skip

from stalebook.core import Domain
from stalebook.point import PointConfig, PointFeatures, PointRun, analysis, features, fresh_rollouts, stale_rollouts
from stalebook.protocol import SPLITS, GramHalf, Rollouts, blas_matmul, bootstrap_gram, cosine_of_parts, det_matmul


def nonzero_gram(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    "`det_matmul(a, b.T)` on the nonzero rows of `a` and `b` (zero rows give +0 entries), as the old build did."
    out = np.zeros((len(a), len(b)))
    ra, rb = np.flatnonzero(a.any(1)), np.flatnonzero(b.any(1))
    if len(ra) and len(rb):
        out[np.ix_(ra, rb)] = det_matmul(a[ra], b[rb].T)
    return out


@dataclasses.dataclass
class CrossGramHalf:
    "The replicate stage before this change: G [n,K,K], C^T = W V^T [M, n*K], G_W = W W^T [M, M]."

    G: np.ndarray
    CT: np.ndarray
    GW: np.ndarray
    n_val: int

    @classmethod
    def build(cls, cand: Rollouts, val: Rollouts) -> "CrossGramHalf":
        V, W = cand.vectors, val.vectors.reshape(-1, val.d)
        return cls(np.einsum("nkd,nld->nkl", V, V), nonzero_gram(W, V.reshape(-1, cand.d)), nonzero_gram(W, W), val.n)

    def scores(self, wc: np.ndarray, wv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c, n, K = wc.shape
        om = wv.reshape(c, -1) / self.n_val
        lv, lc = np.flatnonzero((om != 0).any(0)), np.flatnonzero((wc != 0).any((0, 2)))
        om, w = om[:, lv], wc[:, lc]
        key = (lv.tobytes(), lc.tobytes())
        if getattr(self, "cache", (None,))[0] != key:  # the same rows in almost every chunk: copied once, as before
            cols = (lc[:, None] * K + np.arange(K)).ravel()
            self.cache = key, (self.CT[np.ix_(lv, cols)], self.G[lc], self.GW[np.ix_(lv, lv)])
        CT, G, GW = self.cache[1]
        dot, nc2 = np.zeros((c, n)), np.zeros((c, n))
        dot[:, lc] = (blas_matmul(om, CT).reshape(c, len(lc), K) * w).sum(-1)
        nc2[:, lc] = (blas_matmul(w.transpose(1, 0, 2), G).transpose(1, 0, 2) * w).sum(-1)
        nv2 = (blas_matmul(om, GW) * om).sum(-1)[:, None]
        zero = ~(wc != 0).any(-1) | (nc2 <= 0)
        return cosine_of_parts(dot, nc2, nv2, ~zero), zero


ARMS = {"before": CrossGramHalf.build, "after": GramHalf.build}


def timed(fn):
    "(result of fn(), CPU seconds, wall seconds)."
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def gram_stage_inputs(p: PointRun, ft: PointFeatures, res) -> tuple:
    """(cand, val, the rest of `bootstrap_gram`'s arguments) of the point's analysis, as `point.analysis` and
    `analyse_point` make them from the features `ft` (its observed sets and tie keys read from the analysis's result
    `res`)."""
    cfg, ro = p.cfg, lambda role, h: Rollouts(ft.fresh[role, h]["rewards"], ft.fresh[role, h]["vectors"])
    dom = Domain(cfg.seed, ("point", "analysis", cfg.checkpoint))
    fixed = {nm: m for nm, m in res.selected.items() if nm not in ("control", "dilute")}
    kw = dict(
        chunk=None, std=cfg.std_normalize, eps=cfg.adv_eps, keep_scores=True, control=dom.child("control", "boot")
    )
    args = (fixed, res.keys["A"], res.keys["B"], cfg.k, dom, cfg.n_boot)
    return {h: ro("candidates", h) for h in SPLITS}, {h: ro("validation", h) for h in SPLITS}, args, kw


def run_gram_stage(p: PointRun, inputs, variant: str) -> tuple[dict, str, dict]:
    "The replicate stage with the `before` or `after` code: (seconds, digest of its outputs, its output arrays)."
    cand, val, args, kw = inputs
    halves, g_cpu, g_wall = timed(lambda: {h: ARMS[variant](cand[h], val[h]) for h in "AB"})
    bt, b_cpu, b_wall = timed(lambda: bootstrap_gram(cand, val, *args, **kw, halves=halves))
    digest = hashlib.sha256()
    for k in sorted(bt):
        digest.update(k.encode() + np.ascontiguousarray(bt[k]).tobytes())
    t = {"gram_cpu": g_cpu, "bootstrap_cpu": b_cpu, "gram_wall": g_wall, "bootstrap_wall": b_wall}
    return t, digest.hexdigest(), bt


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", default="runs/tiny-demo/units/tiny-math-s0")
    ap.add_argument("--checkpoint", type=int, default=25)
    add_reps(ap, 3)
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
    stale_store = stale_rollouts(p)
    pi_hash, stores = fresh_rollouts(p)
    ft = features(p, pi_hash, stale_store, stores)
    print(f"{pdir}: the demo's own stage wall times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in demo.items()))
    runs = {"before": [], "after": []}
    digests, outs = {}, {}
    inputs = None
    for r in range(a.reps):
        (res, _), a_cpu, a_wall = timed(lambda: analysis(p, pi_hash, ft))  # the whole analysis, the package's code
        inputs = inputs or gram_stage_inputs(p, ft, res)
        stage = {}
        for v in ("before", "after") if r % 2 == 0 else ("after", "before"):
            stage[v], d, outs[v] = run_gram_stage(p, inputs, v)
            digests.setdefault(v, d)
            assert digests[v] == d, f"{v}: replicate stage not reproducible"
        assert np.array_equal(outs["after"]["rel"], res.boot["rel"]), "after: not the analysis's own replicates"
        for v in ("before", "after"):  # the rest of the analysis is the same code in both arms
            t = dict(stage[v])
            t["rest_cpu"] = a_cpu - stage["after"]["gram_cpu"] - stage["after"]["bootstrap_cpu"]
            t["analysis_cpu"] = t["rest_cpu"] + t["gram_cpu"] + t["bootstrap_cpu"]
            t["analysis_wall"] = a_wall - stage["after"]["gram_wall"] - stage["after"]["bootstrap_wall"]
            t["analysis_wall"] += t["gram_wall"] + t["bootstrap_wall"]
            runs[v].append(t)
            print(f"  rep {r} {v:6s} " + "  ".join(f"{k} {x:6.2f}" for k, x in t.items()), flush=True)
    med = {v: {k: statistics.median(t[k] for t in ts) for k in ts[0]} for v, ts in runs.items()}
    scores = ("sA", "sB", "u")
    apart = max(float(np.abs(outs["before"][k] - outs["after"][k]).max()) for k in scores)
    rel_equal = float((outs["before"]["rel"] == outs["after"]["rel"]).mean())
    print(f"\nmedians of {a.reps} (CPU and wall seconds; the machine may be shared):")
    print(f"  {'stage':16s} {'before':>8s} {'after':>8s} {'ratio':>7s}")
    for k in med["before"]:
        b, f = med["before"][k], med["after"][k]
        print(f"  {k:16s} {b:8.2f} {f:8.2f} {b / f if f > 0 else float('nan'):6.2f}x")
    print(
        f"  outputs: max |before - after| of every replicate score {apart:.1e}; Rel_k replicates equal {rel_equal:.4f}"
    )
    out = dict(point=str(pdir), demo_stage_wall_s=demo, reps=a.reps, median=med, runs=runs)
    out |= dict(max_abs_score_difference=apart, rel_replicates_equal=rel_equal, digests=digests)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if apart < 1e-12 else 1


if __name__ == "__main__":
    raise SystemExit(main())
