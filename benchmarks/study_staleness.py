"""The staleness x learning-rate study on the embedded tiny model (configs/studies/staleness-tiny.yaml).

Every cell (optimizer, S, eta, seed) is one call of `stalebook.pipeline.run_cell(config, out_dir)`: an exact-lag
(`sync-every`) GRPO run of the trainer, judged by the collapse criterion fixed in nbs/29_pipeline.ipynb, idempotent
and resumable — so this script can be killed and rerun, and finished cells are read back. When every cell of the
grid is done it analyses each optimizer's sweep with the controlled simulator's functions (`analyse_sweep`,
`rule_constants`), draws figures/study_staleness_*.png and writes benchmarks/results/study_staleness.json.

    nice -n 10 .venv/bin/python benchmarks/study_staleness.py [--config configs/studies/staleness-tiny.yaml]
        [--jobs 1] [--only-analyse] [--max-cells N] [--out DIR] [--json PATH] [--figures PREFIX]
"""
import argparse, json, os, sys, time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _j(x):
    "JSON-able copy of numpy-laden results (nan/inf -> None)."
    if isinstance(x, dict): return {str(k): _j(v) for k, v in x.items()}
    if isinstance(x, (np.ndarray, list, tuple)): return [_j(v) for v in x]
    if isinstance(x, (float, np.floating)): return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer): return int(x)
    if isinstance(x, np.bool_): return bool(x)
    if isinstance(x, np.str_): return str(x)
    return x


def cells(study: dict) -> list[tuple[str, dict]]:
    "(cell folder relative to the study's out, cell config) for every cell of the grid; seeds outermost (early cells give a full picture)."
    out = []
    for seed in study["seeds"]:
        for opt, o in study["optimizers"].items():
            for S in study["staleness"]:
                for lr in o["lr"]:
                    train = json.loads(json.dumps(study["train"]))
                    train.update(seed=seed, lr=lr, optimizer=opt, **{k: v for k, v in o.items() if k != "lr"})
                    train.setdefault("async_training", {})["staleness"] = S
                    cfg = dict(train=train, criterion=study.get("criterion", {}), eval_n=study.get("eval_n", 32), eval_k=study.get("eval_k", 4))
                    out.append((f"{opt}/S{S}/lr{lr:g}/seed{seed}", cfg))
    return out


def _one(args):
    rel, cfg, root = args
    from stalebook.pipeline import run_cell
    t0 = time.time()
    r = run_cell(cfg, Path(root) / rel)
    return rel, r["t_collapse"], r["steps_done"], time.time() - t0


def run_all(study: dict, root: Path, jobs: int, max_cells: int | None) -> None:
    allc = cells(study)
    todo = [(rel, cfg, str(root)) for rel, cfg in allc if not (root / rel / "results.json").exists()]
    print(f"study {study['name']}: {len(allc)} cells, {len(allc) - len(todo)} done, {len(todo)} to run"
          f"{f' (this call: {max_cells})' if max_cells is not None else ''}, {jobs} job(s)", flush=True)
    if max_cells is not None: todo = todo[:max_cells]
    t0 = time.time()
    def report(i, got):
        rel, tc, done, dt = got
        print(f"[{i + 1}/{len(todo)}] {rel}: t_collapse {tc}, {done} steps, {dt:.0f} s (elapsed {time.time() - t0:.0f} s)", flush=True)
    if jobs > 1:
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(jobs) as pool:
            for i, got in enumerate(pool.imap_unordered(_one, todo)): report(i, got)
    else:
        for i, got in enumerate(map(_one, todo)): report(i, got)


def analyse(study: dict, root: Path, json_path: Path, fig_prefix: str) -> dict:
    from stalebook.core import atomic_write_json, save_figure
    from stalebook.pipeline import study_report, study_sweep
    from stalebook.theory.async_sim import plot_cosine, plot_phase, plot_tcollapse
    import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
    res = {}
    for rel, _ in cells(study):
        f = root / rel / "results.json"
        if not f.exists(): raise SystemExit(f"{f}: missing; run the grid first")
        r = json.loads(f.read_text()); r["wall_s"] = json.loads((root / rel / "timings.json").read_text())["wall_s"]
        res.setdefault(rel.split("/")[0], []).append(r)
    ends = [(root / rel / "timings.json").stat().st_mtime for rel, _ in cells(study)]
    starts = [e - json.loads((root / rel / "timings.json").read_text())["wall_s"] for e, (rel, _) in zip(ends, cells(study))]
    out = dict(study=study["name"], config=str(study.get("_path", "")), cells=sum(len(v) for v in res.values()),
               cpu_seconds_cells=round(sum(r["wall_s"] for v in res.values() for r in v), 1),
               wall_clock_h=round((max(ends) - min(starts)) / 3600, 3),           # first cell's start to last cell's end
               machine=f"{os.cpu_count()} CPUs shared with other workers; cells niced", optimizers={})
    figs = {k: plt.subplots(1, len(res), figsize=(5.2 * len(res), 4.2), squeeze=False) for k in ("phase", "tcollapse", "cosine")}
    for j, (opt, rs) in enumerate(res.items()):
        sw = study_sweep(rs)
        rep = study_report(sw)
        an, rc = rep["analysis"], rep["rule"]
        coll = sw["t_c"] >= 0
        ev = np.array([[r["eval"].get("start", np.nan), r["eval"].get("end", np.nan), r["t_collapse"] >= 0] for r in rs], float)
        lag_max = np.nanmax(sw["lag"][:, :, :, sw["S"].max():], axis=(1, 2, 3)) if sw["steps"] > sw["S"].max() else None
        # the rule's prediction vs the measured boundary, per S (eta_max median over seeds; censored at the grid top)
        pred = np.asarray(rc["eta"], float)
        out["optimizers"][opt] = dict(
            S=sw["S"], eta=sw["eta"], seeds=sw["seeds"], steps=sw["steps"],
            collapsed_frac=rep["collapsed_frac"], t_collapse=sw["t_c"], tc_median=rep["tc_median"],
            eta_max=an["eta_max"], eta_max_median=an["eta_max_median"], censored=an["censored"],
            slope_reps=an["slope_reps"], slope_boot_ci=an["slope_boot_ci"], S_eta_max=an["S_eta_max"], cv_S_eta_max=an["cv_S_eta_max"],
            tc_coef_a_b_logeta_c_logS=an["tc_coef"], tc_coef_ci=an["tc_coef_ci"], n_collapsed=an["n_collapsed"],
            MSeta_mean=an["MSeta_mean"], MSeta_cv=an["MSeta_cv"], learner_time=rep["learner_time"],
            grad_cos_collapsed=float(np.nanmean(an["cos_collapsed"])) if len(an["cos_collapsed"]) else None,
            grad_cos_stable=float(np.nanmean(an["cos_stable"])) if len(an["cos_stable"]) else None,
            grad_cos_stable_abs=float(np.nanmean(np.abs(an["cos_stable"]))) if len(an["cos_stable"]) else None,
            update_cos_collapsed=float(np.nanmean(rep["ucos_collapsed"])) if len(rep["ucos_collapsed"]) else None,
            update_cos_stable=float(np.nanmean(rep["ucos_stable"])) if len(rep["ucos_stable"]) else None,
            rule={k: rc[k] for k in ("G_upd", "R_batch", "R_crit", "local", "horizon", "eta", "binding")},
            rule_vs_measured=dict(predicted_eta=pred, measured_eta_max=an["eta_max_median"],
                                  ratio_measured_over_predicted=an["eta_max_median"] / pred,
                                  safe=bool(np.all(~np.isfinite(an["eta_max_median"]) | (pred <= an["eta_max_median"])))),
            heldout=dict(start_mean=float(np.nanmean(ev[:, 0])), end_stable=float(np.nanmean(ev[ev[:, 2] == 0, 1])) if (ev[:, 2] == 0).any() else None,
                         end_collapsed=float(np.nanmean(ev[ev[:, 2] == 1, 1])) if (ev[:, 2] == 1).any() else None),
            max_lag_after_warmup=lag_max,
            cpu_seconds=round(sum(r["wall_s"] for r in rs), 1))
        title = f"{opt} ({'plain SGD' if opt == 'sgd' else 'AdamW'}), embedded model"
        plot_phase(figs["phase"][1][0, j], sw, an, rc, title)
        plot_tcollapse(figs["tcollapse"][1][0, j], sw, title)
        plot_cosine(figs["cosine"][1][0, j], sw, title)
        o = out["optimizers"][opt]
        print(f"[{opt}] eta_max(S)={np.round(an['eta_max_median'], 5)} slope CI={np.round(an['slope_boot_ci'], 3)} "
              f"CV(S eta_max)={an['cv_S_eta_max']:.2f} t_c coef={np.round(an['tc_coef'], 2)} CI={np.round(an['tc_coef_ci'], 2).tolist()} "
              f"M S eta={an['MSeta_mean']:.3g} (CV {an['MSeta_cv']:.2f}) cos coll/stable={o['grad_cos_collapsed']}/{o['grad_cos_stable']} "
              f"rule G={rc['G_upd']:.3g} Rb={rc['R_batch']:.3g} Rc={rc['R_crit']:.3g} pred={np.round(pred, 5)}", flush=True)
    for k, (fig, _) in figs.items():
        fig.tight_layout(); save_figure(fig, f"{fig_prefix}_{k}"); plt.close(fig)
    atomic_write_json(json_path, _j(out))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(HERE.parent / "configs" / "studies" / "staleness-tiny.yaml"))
    ap.add_argument("--out", default=None, help="override the study's out folder")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--max-cells", type=int, default=None, help="run at most this many missing cells, then stop")
    ap.add_argument("--only-analyse", action="store_true")
    ap.add_argument("--json", default=str(HERE / "results" / "study_staleness.json"))
    ap.add_argument("--figures", default="study_staleness", help="figure name prefix under figures/")
    a = ap.parse_args(argv)
    from stalebook.core import read_mapping
    study = read_mapping(a.config); study["_path"] = a.config
    root = Path(a.out or study["out"])
    t0 = time.time()
    if not a.only_analyse: run_all(study, root, a.jobs, a.max_cells)
    if all((root / rel / "results.json").exists() for rel, _ in cells(study)):
        analyse(study, root, Path(a.json), a.figures)
    print(f"wall {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
