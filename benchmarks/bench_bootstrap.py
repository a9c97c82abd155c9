"""Benchmark: Gram-space bootstrap (stalebook.protocol) vs a naive numpy loop on the same statistic.

One point: n=256 candidate prompts, 8 rollouts per prompt per half, 64 validation prompts (8 rollouts
per half), k_sketch=1024, 10,000 replicates. The statistic is the protocol's: per replicate, resample
rollouts within each prompt in halves A and B (candidates and validation), recompute GRPO advantages,
gradients, cosines, u = (s^A+s^B)/2, Rel_k and the gains of two fixed selected sets.

scipy.stats.bootstrap cannot express it (it resamples whole observations along one axis; this statistic
needs independent within-prompt resampling in 4 x (256 or 64) groups, then a top-k overlap), so the
baseline is the naive loop `bootstrap_naive` (explicit resampling of the vectors, sums of vectors,
cosines), run on the SAME RNG chunks. By default it runs `--naive-reps` replicates and extrapolates
linearly to 10,000 (it is a plain per-replicate loop: its cost is linear); `--naive-reps 10000` runs it fully.
Agreement of the first `--naive-reps` replicates is checked too.

Two ratios are printed, both against the naive loop's 10,000 replicates: the Gram-space bootstrap alone, and
the whole `analyse_point` with the default bound (observed statistics, the bootstrap with the negative
control's replicate sets, the model world, the delete-one-rollout jackknife and the Gaussian SDs — every
bound method's inputs, no gradient recomputed). Exit status 1 if the latter is below 10x. Results go to
results/records/bench_bootstrap.json.

    python benchmarks/bench_bootstrap.py [--naive-reps 500]
"""

import argparse
import os
import sys
import time
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
import numpy as np  # isort: skip

from stalebook.analysis import analyse_point
from stalebook.core import Domain, atomic_write_json
from stalebook.protocol import (
    DEFAULT_BOUND,
    SPLITS,
    bootstrap_gram,
    bootstrap_naive,
    point_scores,
    synthetic_point,
    synthetic_pool,
    tie_keys,
    topk_mask,
)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--K", type=int, default=8)
    p.add_argument("--n-val", type=int, default=64)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--reps", type=int, default=10_000)
    p.add_argument("--naive-reps", type=int, default=500)
    p.add_argument(
        "--out", default=str(Path(__file__).resolve().parents[1] / "results" / "records" / "bench_bootstrap.json")
    )
    a = p.parse_args(argv)
    D = Domain(0, ("bench", "bootstrap"))
    pool = synthetic_pool(D, a.n, a.n_val, a.d, sigma_v=0.3)
    cand, val = synthetic_point(pool, D.child("point"), a.K, a.K)
    keys = {h: tie_keys(D, h, a.n) for h in SPLITS}
    masks = {
        "fresh": topk_mask(point_scores(cand, val)["R"][0], a.k, keys["R"]),
        "stale": topk_mask(D.child("stale").numpy().random(a.n), a.k, keys["R"]),
    }
    chunk = 256  # same chunks for both implementations
    t0 = time.perf_counter()
    g = bootstrap_gram(cand, val, masks, keys["A"], keys["B"], a.k, D, a.reps, chunk=chunk)
    t_gram = time.perf_counter() - t0
    nr = min(a.naive_reps, a.reps)
    t0 = time.perf_counter()
    nv = bootstrap_naive(cand, val, masks, keys["A"], keys["B"], a.k, D, nr, chunk=chunk)
    t_naive_part = time.perf_counter() - t0
    t_naive = t_naive_part * a.reps / nr
    err = max(np.abs(g[s][:nr] - nv[s]).max() for s in g)
    stale = {"stale": D.child("stale-g").numpy().standard_normal((a.n, a.d))}
    t0 = time.perf_counter()
    res = analyse_point(cand, val, a.k, D, stale=stale, n_boot=a.reps)
    t_point = time.perf_counter() - t0
    print(
        f"point: n={a.n} K={a.K}/half n_val={a.n_val} d={a.d} k={a.k} replicates={a.reps}; "
        f"cpus={len(os.sched_getaffinity(0))}, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"Gram-space bootstrap ({a.reps} replicates): {t_gram:.2f} s")
    print(
        f"naive loop: {t_naive_part:.2f} s for {nr} replicates -> {t_naive:.1f} s for {a.reps}"
        + (" (extrapolated, linear)" if nr < a.reps else "")
    )
    print(
        f"speed-up, bootstrap alone: {t_naive / t_gram:.1f}x   "
        f"max |Gram - naive| over the first {nr} replicates: {err:.2e}"
    )
    print(
        f"analyse_point, bound={DEFAULT_BOUND} (observed stats, "
        "bootstrap + control, model world, jackknife, Gaussian SDs; "
        f"{a.reps} replicates): {t_point:.2f} s -> speed-up over the naive bootstrap alone: {t_naive / t_point:.1f}x"
    )
    print(
        f"Rel_k {res.rel:.3f} bounds {np.round(res.bounds('rel'), 3)}, "
        f"fresh gain {res.gain_fresh:.4f} bounds {np.round(res.bounds('gain_fresh'), 4)}"
    )
    atomic_write_json(
        a.out,
        dict(
            config=vars(a) | {"out": None},
            t_gram_s=round(t_gram, 2),
            t_naive_s=round(t_naive, 1),
            naive_measured_reps=nr,
            t_analyse_point_s=round(t_point, 2),
            bound=DEFAULT_BOUND,
            speedup_bootstrap=round(t_naive / t_gram, 1),
            speedup_analyse_point=round(t_naive / t_point, 1),
            max_abs_diff=err,
            load_average=round(os.getloadavg()[0], 1),
        ),
    )
    return 0 if (t_naive / t_point >= 10 and err < 1e-9) else 1


if __name__ == "__main__":
    sys.exit(main())
