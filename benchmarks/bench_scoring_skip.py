"""Scoring a point's stores: only the rollouts that can carry weight, against every rollout (side by side, one run).

A group whose rewards are all equal has advantage 0, in every bootstrap resample too, so `fresh_features` and
`stale_features` leave its vectors at 0 and send only the other rollouts through the forward and backward passes; and
equal coefficient matrices (the four estimators at pi = beta) cost one backward pass. The baseline is the computation
without either: `per_rollout_gradients` over every rollout with one backward pass per estimator. Inputs: the stores of
one finished point (its run folder and checkpoint), e.g. a demo point under runs/tiny-demo. Printed: seconds (best of
`--reps`), the ratio, the share of rollouts skipped, and the largest difference of the features (relative to their
scale): the same numbers up to float32 rounding.

    .venv/bin/python benchmarks/bench_scoring_skip.py runs/tiny-demo/units/tiny-math-s0/train --checkpoint 25
"""

import argparse
import atexit
import shutil
import tempfile
import time

from benchargs import add_reps

import stalebook  # noqa: F401  (pins the CPU numerics before torch loads)

import numpy as np  # isort: skip
import torch  # isort: skip


def padded(rows, L, dtype=torch.float64):
    "Rows of floats zero-padded on the right to width L: [len(rows), L] (the baseline's own copy of what scoring does)."
    out = torch.zeros(len(rows), L, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def best(fn, reps):
    ts, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), out


def main(argv=None) -> int:
    from stalebook.core import Domain
    from stalebook.point import PointConfig, PointRun, fresh_rollouts, stale_rollouts
    from stalebook.scoring import (
        ESTIMATORS,
        CountSketch,
        estimator_coefs,
        fresh_features,
        lora_dim,
        per_rollout_gradients,
        stale_features,
        store_rows,
    )
    from stalebook.theory.estimators import advantages

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a family's training run folder (train/) whose point stores exist")
    ap.add_argument("--checkpoint", type=int, default=25)
    add_reps(ap, 2)
    a = ap.parse_args(argv)
    import json
    from pathlib import Path

    res = json.loads((Path(a.run).parent / "points" / f"c-{a.checkpoint:06d}" / "result.json").read_text())
    scratch = tempfile.mkdtemp(prefix="bench-scoring-skip-")  # the point's own folder, removed when the run ends
    atexit.register(shutil.rmtree, scratch, True)
    cfg = PointConfig(
        run=a.run,
        out=scratch,
        **{k: v for k, v in res["manifest"]["config"].items() if k in PointConfig.__dataclass_fields__},
    )
    pr = PointRun(cfg, progress=False)
    stale_store = stale_rollouts(pr)
    _, stores = fresh_rollouts(pr)
    D = lora_dim(pr.model)
    sk = CountSketch(D, cfg.k_sketch, Domain(cfg.seed, ("sketch", D, cfg.k_sketch)))
    pad, rows = pr.tok.pad_token_id, pr.rows
    st = stores["candidates", "R"]

    def fresh_all():
        pids, comps, _, r = store_rows(st.records)
        (v,), _, _ = per_rollout_gradients(
            pr.model, pids, comps, lambda lp, m, sl: [torch.ones_like(lp)], pad, sk, rows
        )
        return v.double().numpy().reshape(*r.shape, -1)

    def stale_all():
        pids, comps, logb, r = store_rows(stale_store.records)
        n, K = r.shape
        adv = torch.from_numpy(np.asarray(advantages(r, None, "group"), dtype=np.float64)).reshape(-1)
        lb_all = padded(logb, max(len(c) for c in comps))

        def coefs(lp, m, sl):
            lp = lp.double() * m
            co = estimator_coefs(lp, lb_all[sl, : lp.shape[1]] * m, adv[sl], torch.tensor(1.0 / K, dtype=lp.dtype))
            return [co[ab] + 0.0 * i for i, ab in enumerate(ESTIMATORS)]  # distinct tensors: four passes, as before

        ws, _, _ = per_rollout_gradients(pr.model, pids, comps, coefs, pad, sk, rows)
        return {ab: w.double().numpy().reshape(n, K, -1).sum(1) for ab, w in zip(ESTIMATORS, ws)}

    t_new_f, (_, vf) = best(lambda: fresh_features(pr.model, st.records, sk, pad, rows), a.reps)
    t_old_f, vo = best(fresh_all, a.reps)
    t_new_s, (gs, _, _) = best(lambda: stale_features(pr.model, stale_store.records, sk, pad, rows), a.reps)
    t_old_s, go = best(stale_all, a.reps)
    R = np.array([r["rewards"] for r in st.records])
    live = ~(R == R[:, :1]).all(1)
    rel = lambda x, y: float(np.abs(x - y).max() / np.abs(y).max())
    print(
        f"point: n={cfg.n_candidates} K={cfg.group_size} checkpoint {a.checkpoint}; groups skipped (all rewards "
        f"equal): fresh R {1 - live.mean():.2f}"
    )
    print(
        f"fresh R store: {t_new_f:.1f} s vs every rollout {t_old_f:.1f} s: {t_old_f / t_new_f:.2f}x faster; "
        f"max |diff| on the scored groups {rel(vf[live], vo[live]):.1e} of the scale, skipped groups all 0: "
        f"{bool((vf[~live] == 0).all())}"
    )
    print(
        f"stale store (four estimators): {t_new_s:.1f} s vs every rollout, four passes {t_old_s:.1f} s: "
        f"{t_old_s / t_new_s:.2f}x faster; max |diff| {max(rel(gs[ab], go[ab]) for ab in ESTIMATORS):.1e} of the "
        f"scale"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
