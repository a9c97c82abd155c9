"""Full staleness x learning-rate sweep of the controlled async GRPO simulator (Theory III, seed 001).

Runs both settings over S in {1,2,4,8,16,32} x 12 learning rates x 6 replicates (300 learner steps, sampled
K=8 groups on 32 prompts), writes figures/staleness_*.png and benchmarks/results/sweep_staleness.json,
and prints the acceptance numbers. Target: <= 3 minutes on 2 cores.
    PYTHONPATH=. python benchmarks/sweep_staleness.py [--reps 6] [--steps 300] [--quick]
"""

import argparse
import sys
import time
import warnings
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
import numpy as np  # isort: skip

from stalebook.core import atomic_write_json, save_figure
from stalebook.theory.async_sim import (
    ENV_KW,
    SETTINGS,
    analyse_sweep,
    bias_vs_lag,
    make_env,
    plot_bias,
    plot_cosine,
    plot_phase,
    plot_tcollapse,
    rule_constants,
    run_sweep,
)


def _j(x):
    if isinstance(x, dict):
        return {k: _j(v) for k, v in x.items()}
    if isinstance(x, (np.ndarray, list, tuple)):
        return [_j(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.str_):
        return str(x)
    return x


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="S in {1,4,16}, 6 etas, 2 reps, 200 steps; no files")
    a = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = time.time()
    env = make_env(0, **ENV_KW)
    Ss = [1, 4, 16] if a.quick else [1, 2, 4, 8, 16, 32]
    out, sweeps = {}, {}
    for name, st in SETTINGS.items():
        etas = st["etas"][::2] if a.quick else st["etas"]
        ts = time.time()
        sw = run_sweep(env, Ss, etas, 2 if a.quick else a.reps, 200 if a.quick else a.steps, **st["kw"])
        an, rc = analyse_sweep(sw), rule_constants(sw, 0.2)  # R_batch at the reference clip radius 0.2 in both settings
        sweeps[name] = (sw, an, rc)
        cs, cc = an["cos_stable"], an["cos_collapsed"]
        out[name] = dict(
            kw=st["kw"],
            eta=sw["eta"],
            S=sw["S"],
            seconds=time.time() - ts,
            collapsed_frac=(sw["t_c"] >= 0).mean(-1),
            eta_max=an["eta_max"],
            eta_max_median=an["eta_max_median"],
            censored=an["censored"],
            slope_reps=an["slope_reps"],
            slope_boot_ci=an["slope_boot_ci"],
            S_eta_max=an["S_eta_max"],
            cv_S_eta_max=an["cv_S_eta_max"],
            tc_coef_a_b_logeta_c_logS=an["tc_coef"],
            tc_coef_ci=an["tc_coef_ci"],
            n_collapsed=an["n_collapsed"],
            MSeta_mean=an["MSeta_mean"],
            MSeta_cv=an["MSeta_cv"],
            cos_collapsed_mean=float(np.nanmean(cc)) if len(cc) else None,
            cos_stable_mean=float(np.nanmean(cs)) if len(cs) else None,
            cos_stable_abs_mean=float(np.nanmean(np.abs(cs))) if len(cs) else None,
            rule={k: rc[k] for k in ("G_upd", "R_batch", "R_crit", "local", "horizon", "binding")},
        )
        print(
            f"[{name}] {time.time() - ts:.1f}s  eta_max(S)={np.round(an['eta_max_median'], 3)}  "
            f"slope={np.round(an['slope_boot_ci'], 3)}"
            f"  CV(S eta_max)={an['cv_S_eta_max']:.2f}  t_c coef(a,b,c)={np.round(an['tc_coef'], 2)}"
            f"  M S eta={an['MSeta_mean']:.3g} (CV {an['MSeta_cv']:.2f})  "
            f"cos coll/stable={out[name]['cos_collapsed_mean']}/{out[name]['cos_stable_mean']}",
            flush=True,
        )
    bias = bias_vs_lag(env, [1, 2, 4, 8, 16, 32], np.geomspace(1e-3, 3, 10), **SETTINGS["grpo"]["sim"])
    out["bias"] = dict(
        S=bias["S"],
        eta=bias["eta"],
        ratio=bias["ratio"],
        limit=bias["limit"],
        slope_in_S_smallest_eta=float(np.polyfit(np.log(bias["S"]), np.log(bias["delta"][:, 0]), 1)[0]),
    )
    total = time.time() - t0
    out["seconds_total"] = total
    print(
        f"bias: limit {bias['limit']:.4g}, "
        f"slope of log||delta|| on log S at eta=1e-3: {out['bias']['slope_in_S_smallest_eta']:.4f}"
    )
    print(f"total {total:.1f}s")
    if a.quick:
        return 0
    root = Path(__file__).resolve().parents[1]
    atomic_write_json(root / "benchmarks" / "results" / "sweep_staleness.json", _j(out))
    for kind, fn in (("phase", plot_phase), ("tcollapse", plot_tcollapse), ("cosine", plot_cosine)):
        fig, axs = plt.subplots(1, 2, figsize=(9, 3.6))
        for ax, (name, (sw, an, rc)) in zip(axs, sweeps.items()):
            fn(ax, sw, an, rc, SETTINGS[name]["title"]) if kind == "phase" else fn(ax, sw, SETTINGS[name]["title"])
        fig.tight_layout()
        save_figure(fig, f"staleness_{kind}")
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(4.8, 3.4))
    plot_bias(ax, bias)
    fig.tight_layout()
    save_figure(fig, "staleness_bias_ratio")
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
