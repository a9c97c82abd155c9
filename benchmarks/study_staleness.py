"""The staleness x learning-rate study on the embedded tiny model, through the registry \
(configs/registries/staleness-tiny.yaml).

Every cell (optimizer, S, eta, seed) is one unit of the `staleness` kind (stalebook.staleness_study): `units.run_unit`
runs, resumes or reads back its exact-lag (`sync-every`) GRPO run, judged by the collapse criterion fixed in
nbs/29_pipeline.ipynb — so this script can be killed and rerun, and finished cells are read back. `--jobs N` runs N
units at a time in separate processes (each under its unit's lock). When every cell passes its contracts
(`stalebook status`) it freezes the table (`stalebook freeze`), draws figures/<prefix>_{phase,tcollapse,cosine}.png
and writes benchmarks/results/study_staleness.json: the frozen table's per-optimizer summary plus the wall times
from the cells' timings.json sidecars (which never enter the frozen table).

    nice -n 10 .venv/bin/python benchmarks/study_staleness.py [--registry staleness-tiny[:SLICE]] [--root DIR]
        [--jobs 1] [--max-cells N] [--only-analyse] [--json PATH] [--figures PREFIX]
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _one(args):
    spec, uid, root = args
    from stalebook.units import run_unit

    t0 = time.time()
    got = run_unit(spec, uid, root, progress=False, log=lambda *a: None)
    r = json.loads((Path(root) / "units" / uid / "cell" / "results.json").read_text())
    return uid, got["cell"], r["t_collapse"], r["steps_done"], time.time() - t0


def run_all(spec: str, root: Path, jobs: int, max_cells: int | None) -> None:
    "Run (or resume) the registry's units that have no phase record yet; `jobs` processes at a time."
    from stalebook.registry import load_registry
    from stalebook.units import record_path, select_units, unit_dir

    reg = load_registry(spec)
    allu = select_units(reg)
    todo = [(spec, u, str(root)) for u in allu if not record_path(unit_dir(root, u), "cell").is_file()]
    print(
        f"registry {reg.name}: {len(allu)} cells, {len(allu) - len(todo)} done, {len(todo)} to run"
        f"{f' (this call: {max_cells})' if max_cells is not None else ''}, {jobs} job(s), root {root}",
        flush=True,
    )
    if max_cells is not None:
        todo = todo[:max_cells]
    t0 = time.time()

    def report(i, got):
        uid, how, tc, done, dt = got
        print(
            f"[{i + 1}/{len(todo)}] {uid}: {how}, t_collapse {tc}, {done} steps, "
            f"{dt:.0f} s (elapsed {time.time() - t0:.0f} s)",
            flush=True,
        )

    if jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(jobs) as pool:
            for i, got in enumerate(pool.imap_unordered(_one, todo)):
                report(i, got)
    else:
        for i, got in enumerate(map(_one, todo)):
            report(i, got)


def analyse(spec: str, root: Path, frozen: dict, json_path: Path, fig_prefix: str) -> dict:
    "Figures from the cells, and the results JSON: the frozen table's summaries plus wall times (sidecars)."
    import matplotlib

    from stalebook.core import atomic_write_json, save_figure
    from stalebook.registry import load_registry
    from stalebook.staleness_study import optimizer_analyses
    from stalebook.theory.async_sim import plot_cosine, plot_phase, plot_tcollapse
    from stalebook.units import unit_dir

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reg = load_registry(spec)
    units = reg.units()
    tim = {u: unit_dir(root, u) / "cell" / "timings.json" for u in units}
    wall = {u: json.loads(f.read_text())["wall_s"] for u, f in tim.items()}
    ends = {u: f.stat().st_mtime for u, f in tim.items()}
    summary = frozen["table"]["summary"]
    src = Path(reg.source).resolve()
    out = dict(
        study=reg.name,
        config=str(src.relative_to(HERE.parent)) if src.is_relative_to(HERE.parent) else str(src),
        frozen_content_hash=frozen["content_hash"],
        cells=len(units),
        cpu_seconds_cells=round(sum(wall.values()), 1),
        wall_clock_h=round(
            (max(ends.values()) - min(ends[u] - wall[u] for u in units)) / 3600, 3
        ),  # first start to last end
        machine=f"{os.cpu_count()} CPUs shared with other workers; cells niced",
        optimizers={},
    )
    an = optimizer_analyses(reg, root)
    figs = {
        k: plt.subplots(1, len(an), figsize=(5.2 * len(an), 4.2), squeeze=False)
        for k in ("phase", "tcollapse", "cosine")
    }
    for j, (opt, (sw, rep, _)) in enumerate(an.items()):
        o = out["optimizers"][opt] = dict(
            summary[opt], cpu_seconds=round(sum(wall[u] for u, c in units.items() if c.optimizer == opt), 1)
        )
        title = f"{opt} ({'plain SGD' if opt == 'sgd' else 'AdamW'}), embedded model"
        plot_phase(figs["phase"][1][0, j], sw, rep["analysis"], rep["rule"], title)
        plot_tcollapse(figs["tcollapse"][1][0, j], sw, title)
        plot_cosine(figs["cosine"][1][0, j], sw, title)
        r = o["rule"]
        print(
            f"[{opt}] eta_max(S)={o['eta_max_median']} slope CI={o['slope_boot_ci']} CV(S eta_max)={o['cv_S_eta_max']} "
            f"t_c coef={o['tc_coef_a_b_logeta_c_logS']} M S eta={o['MSeta_mean']} (CV {o['MSeta_cv']}) "
            f"cos coll/stable={o['grad_cos_collapsed']}/{o['grad_cos_stable']} "
            f"rule G={r['G_upd']} Rb={r['R_batch']} Rc={r['R_crit']} "
            f"pred={r['eta']}",
            flush=True,
        )
    for k, (fig, _) in figs.items():
        fig.tight_layout()
        save_figure(fig, f"{fig_prefix}_{k}")
        plt.close(fig)
    atomic_write_json(json_path, out)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--registry", default="staleness-tiny", help="registry name, NAME:SLICE, or a YAML file (FILE:SLICE)"
    )
    ap.add_argument("--root", default=None, help="results folder (default: the registry's `out`)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--max-cells", type=int, default=None, help="run at most this many missing cells, then stop")
    ap.add_argument("--only-analyse", action="store_true")
    ap.add_argument("--json", default=str(HERE / "results" / "study_staleness.json"))
    ap.add_argument("--figures", default="study_staleness", help="figure name prefix under figures/")
    a = ap.parse_args(argv)
    from stalebook.contracts import format_status, freeze, registry_status
    from stalebook.registry import load_registry, registry_root

    root = registry_root(load_registry(a.registry), a.root)
    t0 = time.time()
    if not a.only_analyse:
        run_all(a.registry, root, a.jobs, a.max_cells)
    st = registry_status(a.registry, root)
    print(format_status(st).splitlines()[0], flush=True)
    if st["state"] != "partial":
        fr = freeze(a.registry, root)
        print(
            f"[freeze] {'frozen' if fr['written'] else 'already frozen, identical'}: {fr['dir']} "
            f"(content hash {fr['content_hash'][:16]})"
        )
        analyse(a.registry, root, fr, Path(a.json), a.figures)
    print(f"wall {time.time() - t0:.0f} s", flush=True)
    return 1 if st["totals"]["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
