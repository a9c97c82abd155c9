"""Calibration study of the protocol's one-sided 95% bounds (stalebook.calibration, section "Calibration study").

Synthetic pools that reproduce the protocol's own sampling (fixed prompts with per-prompt pass rates and
score-vector populations; R/A/B splits of K rollouts; the same Gram-space bootstrap, tie streams and sets),
with the truth conditional on the pool by Monte Carlo (`truth_mc`). Grid: 4 regimes (low/high reliability x
small/large fresh gain; the two-sided study adds a fifth, mid-reliability/small gain) x K in {4, 8, 16} x n in
{64, 256}, k = n/8; per cell `--pools` pools x `--seeds`
points; every bound method (percentile, bc, bca, basic, gaussian, model) on every point; the negative and
positive controls; and, per point, the design function's prediction of the gate's power from that point
alone (a one-point pilot).

Writes the per-cell counts to benchmarks/results/calibrate_bounds.json (deterministic: seeded, no times)
and the wall time to benchmarks/results/calibrate_bounds_timings.json. The notebook reads the former.

    python benchmarks/calibrate_bounds.py [--pools 5] [--seeds 15] [--n-boot 1000]
                                          [--only "low-rel/large-gain n=64 K=4" --out /tmp/x.json]
    python benchmarks/calibrate_bounds.py --two-sided   # the two-sided study (both bounds, diluted control,
                                                        # shrinkage diagnostics): calibrate_bounds_two_sided.json

The two-sided study's defaults: 4 pools x 10 points per cell (960 points), 400 replicates, 1,000 truth draws,
root seed 0; about 5 min of wall time on one core (benchmarks/results/calibrate_bounds_two_sided_timings.json).

The committed run: 1,800 points, 36 min wall / 13 min CPU on the shared 2-core machine (one BLAS thread).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core: the machine is shared
os.environ.setdefault("OMP_NUM_THREADS", "1")
import argparse
import sys
import time
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
import numpy as np  # isort: skip

from stalebook.calibration import (
    REGIMES_2S,
    calibrate_cell,
    calibration_grid,
    calibration_point_2s,
    cell_pool,
    choose_bound,
    choose_bound_2s,
    coverage_table,
    coverage_table_2s,
    summarise_cell,
    summarise_cell_2s,
)
from stalebook.core import Domain, atomic_write_json
from stalebook.design import design_power
from stalebook.protocol import DEFAULT_BOUND, truth_mc
from stalebook.theory.reliability import rho_from_rel

RESULTS = Path(__file__).resolve().parent / "results"


def two_sided(a) -> int:
    """The two-sided study: every method's LB and UB on the same points, both controls, the shrinkage diagnostics."""
    D = Domain(a.root, ("calibration", "two-sided"))
    cells, t0, per_cell = [], time.perf_counter(), {}
    grid = [
        c for c in calibration_grid(regimes=REGIMES_2S) if a.only is None or a.only in f"{c.regime} n={c.n} K={c.K}"
    ]
    for j, cell in enumerate(grid):
        t1, dom, rows = time.perf_counter(), D.child(cell.regime, cell.n, cell.K), []
        for p in range(a.pools):
            pool = cell_pool(cell, dom.child("pool", p))
            tr = truth_mc(pool, dom.child("truth", p), cell.k, cell.K, cell.K, a.truth_draws)
            rows += [calibration_point_2s(pool, tr, cell, dom.child("point", p, s), a.n_boot) for s in range(a.seeds)]
        s = summarise_cell_2s(cell, rows)
        cells.append(s)
        per_cell[f"{cell.regime} n={cell.n} K={cell.K}"] = round(time.perf_counter() - t1, 1)
        print(
            f"[{j + 1}/{len(grid)}] {cell.regime:20s} n={cell.n:3d} K={cell.K:2d}: true Rel {s['truth']['rel']:.3f} "
            f"shift of replicates (SDs) Rel {s['shift']['rel']:+.2f} fresh {s['shift']['gain_fresh']:+.2f}; "
            f"{DEFAULT_BOUND} UB cover fresh {s['methods'][DEFAULT_BOUND]['ub_cover']['gain_fresh'] / s['points']:.2f} "
            f"({time.perf_counter() - t1:.0f} s, total {time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    cfg = dict(pools=a.pools, seeds=a.seeds, n_boot=a.n_boot, truth_draws=a.truth_draws, root=a.root)
    atomic_write_json(a.out, dict(config=cfg | dict(points=sum(c["points"] for c in cells)), cells=cells))
    atomic_write_json(
        Path(a.out).with_name(Path(a.out).stem + "_timings.json"),
        dict(wall_s=round(time.perf_counter() - t0, 1), cells=per_cell, cpus=len(os.sched_getaffinity(0))),
    )
    if not a.only:
        ch = choose_bound_2s(coverage_table_2s(cells))
        print(f"rule: qualified {ch['qualified'] or 'none'}; chosen {ch['bound']}; failures {ch['fails']}")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--two-sided", action="store_true", help="the two-sided study (defaults below change)")
    p.add_argument("--pools", type=int, default=None, help="pools per cell (default 5; two-sided 4)")
    p.add_argument("--seeds", type=int, default=None, help="points per pool (default 15; two-sided 10)")
    p.add_argument("--n-boot", type=int, default=None, help="replicates per point (default 1000; two-sided 400)")
    p.add_argument(
        "--truth-draws", type=int, default=None, help="truth Monte Carlo draws (default 2000; two-sided 1000)"
    )
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument(
        "--only",
        default=None,
        help="run only the cells whose 'regime n=.. K=..' label contains this (a check of reproducibility)",
    )
    a = p.parse_args(argv)
    two = dict(pools=4, seeds=10, n_boot=400, truth_draws=1000, out=str(RESULTS / "calibrate_bounds_two_sided.json"))
    one = dict(pools=5, seeds=15, n_boot=1000, truth_draws=2000, out=str(RESULTS / "calibrate_bounds.json"))
    for nm, v in (two if a.two_sided else one).items():
        if getattr(a, nm) is None:
            setattr(a, nm, v)
    if a.two_sided:
        return two_sided(a)
    D = Domain(a.root, ("calibration", "bounds"))
    cells, t0, per_cell = [], time.perf_counter(), {}
    grid = [c for c in calibration_grid() if a.only is None or a.only in f"{c.regime} n={c.n} K={c.K}"]
    for j, cell in enumerate(grid):
        t1 = time.perf_counter()
        dom = D.child(cell.regime, cell.n, cell.K)
        rows = calibrate_cell(cell, dom, a.pools, a.seeds, a.n_boot, a.truth_draws)
        s = summarise_cell(cell, rows)
        q = cell.k / cell.n
        s["pilot"] = dict(
            p_gate=float(
                np.mean(
                    [
                        design_power(
                            rho_from_rel(r["est"]["rel"], q),
                            cell.n,
                            cell.k,
                            1,
                            bound="model",
                            pools=20,
                            draws=40,
                            cells=10,
                            domain=dom.child("pilot", i),
                        )["p_gate"]
                        for i, r in enumerate(rows)
                    ]
                )
            )
        )
        cells.append(s)
        per_cell[f"{cell.regime} n={cell.n} K={cell.K}"] = round(time.perf_counter() - t1, 1)
        m = s["methods"][DEFAULT_BOUND]
        print(
            f"[{j + 1}/{len(grid)}] {cell.regime:20s} n={cell.n:3d} K={cell.K:2d}: true Rel {s['truth']['rel']:.3f}, "
            f"{DEFAULT_BOUND} cover Rel {m['lb_cover']['rel'] / s['points']:.2f} "
            f"fresh {m['lb_cover']['gain_fresh'] / s['points']:.2f}, "
            f"gate {m['gate'] / s['points']:.2f} (pilot-predicted {s['pilot']['p_gate']:.2f}) "
            f"({time.perf_counter() - t1:.0f} s, total {time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    out = dict(
        config=dict(
            pools=a.pools,
            seeds=a.seeds,
            n_boot=a.n_boot,
            truth_draws=a.truth_draws,
            root=a.root,
            points=sum(c["points"] for c in cells),
        ),
        cells=cells,
    )
    atomic_write_json(a.out, out)
    wall = time.perf_counter() - t0
    atomic_write_json(
        Path(a.out).with_name(Path(a.out).stem + "_timings.json"),
        dict(
            wall_s=round(wall, 1),
            cells=per_cell,
            cpus=len(os.sched_getaffinity(0)),
            openblas_threads=os.environ.get("OPENBLAS_NUM_THREADS"),
        ),
    )
    if a.only:
        return 0
    tab = coverage_table(cells)
    for m, t in tab.items():
        print(
            m.ljust(10),
            "  ".join(
                f"{r}: Rel {v['rel']:.3f} fresh {v['gain_fresh']:.3f} stale {v['gain_stale']:.3f} "
                f"ctrlFP {v['control_fp']:.3f} power {v['power']:.3f}"
                for r, v in t.items()
            ),
        )
    ch = choose_bound(tab)
    print(
        f"rule: qualified {ch['qualified'] or 'none'}; chosen {ch['bound']}"
        + (" (closest conservative: none in band)" if ch["conservative_fallback"] else "")
        + f"; wall {wall:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
