"""The BOLT comparison on the embedded tiny model: every unit of a `BoltStudy` (configs/studies/bolt-tiny.yaml), then
the aggregate table, the claim table and the three figures.

Each unit is `stalebook.bolt.run_arm(config, <out>/<name>)` (or `run_sweep`): idempotent and resumable, so an
interrupted study is continued by running this script again (finished units return their stored results). All units
share one store root, so the arms of a seed share their reference dataset and their step-0 measurement.

    PYTHONPATH=. python benchmarks/study_bolt.py [--config configs/studies/bolt-tiny.yaml] [--domains math code]
                                                 [--aggregate-only] [--json benchmarks/results/study_bolt.json]

Writes the JSON (study config, per-unit results and timings, the aggregate, the beta sweeps, the claim rows, the
Markdown tables) and figures/bolt_time.png, figures/bolt_rounds.png, figures/bolt_beta.png. Wall times are those of
this shared 2-core machine (other jobs running); `unit_seconds` records each unit's wall time in the process that
finished it.
"""
import argparse, json, sys, time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run_units(study, units, log):
    from stalebook.bolt import run_arm, run_sweep
    from stalebook.core import atomic_write_json
    tf = Path(study.out) / "unit-seconds.json"
    secs = json.loads(tf.read_text()) if tf.exists() else {}
    t_all = time.perf_counter()
    for i, (name, kind, cfg) in enumerate(units):
        out = Path(study.out) / name
        done = (out / ("result.json" if kind == "arm" else "sweep.json")).exists()
        t0 = time.perf_counter()
        if kind == "arm": run_arm(cfg, out, progress=sys.stderr.isatty(), log=lambda *a: None)
        else: run_sweep(cfg, out, (*study.betas, cfg.beta), progress=sys.stderr.isatty())
        if not done:
            secs[name] = round(time.perf_counter() - t0, 1)
            atomic_write_json(tf, secs)
        log(f"[{i + 1}/{len(units)}] {name}: {'stored' if done else f'{secs[name]:.0f} s'} "
            f"(this run {time.perf_counter() - t_all:.0f} s)")
    return secs


def collect(study, units):
    arms, sweeps = {}, {}
    for name, kind, _ in units:
        out = Path(study.out) / name
        if kind == "arm" and (out / "result.json").exists():
            arms[name] = dict(result=json.loads((out / "result.json").read_text()), timings=json.loads((out / "timings.json").read_text()))
        elif kind == "sweep" and (out / "sweep.json").exists():
            sweeps[name] = json.loads((out / "sweep.json").read_text())
    return arms, sweeps


def figures(agg, sweeps, study):
    import matplotlib.pyplot as plt
    from stalebook.core import save_figure
    colors = dict(bolt="C0", refit="C1", positive="C2", grpo="C3", iterative="C4")
    doms = [d for d in study.domains if d in agg]
    # 1. held-out pass rate against cumulative training time (reference sampling included for the static arms)
    fig, ax = plt.subplots(1, len(doms), figsize=(5.5 * len(doms), 3.6), squeeze=False)
    for a_, d in zip(ax[0], doms):
        for arm, c in colors.items():
            if arm not in agg[d]: continue
            cv = agg[d][arm]["curve"]
            m, se = np.array([v[0] for v in cv["heldout pass"]]), np.array([v[1] for v in cv["heldout pass"]])
            a_.errorbar(cv["seconds"], m, se, marker="o", ms=3, capsize=2, color=c, label=arm)
        a_.set(xlabel="training wall time, s (mean over seeds; static arms include reference sampling)", ylabel="held-out pass rate",
               title=f"{d}: held-out pass rate vs training time")
        a_.legend(fontsize=7)
    fig.tight_layout(); save_figure(fig, "bolt_time", dpi=80); plt.close(fig)
    # 2. one-shot vs iterative BOLT over rounds (measured at every round boundary)
    fig, ax = plt.subplots(1, len(doms), figsize=(5.5 * len(doms), 3.6), squeeze=False)
    for a_, d in zip(ax[0], doms):
        for arm, ls in (("bolt", "-"), ("iterative", "--")):
            if arm not in agg[d]: continue
            cv = agg[d][arm]["curve"]
            for pool, mk in (("train pass", "o"), ("heldout pass", "s")):
                m, se = np.array([v[0] for v in cv[pool]]), np.array([v[1] for v in cv[pool]])
                a_.errorbar(cv["steps"], m, se, ls=ls, marker=mk, ms=3, capsize=2, color=colors[arm],
                            label=f"{'one-shot' if arm == 'bolt' else 'iterative'} BOLT, {pool.split()[0]} prompts")
        a_.set(xlabel=f"optimizer step (iterative: a new reference every {getattr(study, d).train.steps // study.rounds} steps)",
               ylabel="pass rate", title=f"{d}: one-shot vs iterative BOLT")
        a_.legend(fontsize=7)
    fig.tight_layout(); save_figure(fig, "bolt_rounds", dpi=80); plt.close(fig)
    # 3. the beta frontier on real data: ESS, relative variance of Z-hat, BOLT accuracy against beta
    sd = [d for d in study.sweep_domains if d in agg]
    if not sd or not sweeps: return
    d = sd[0]
    S = [v for k, v in sweeps.items() if k.startswith(d + "/")]
    betas = [r["beta"] for r in S[0]["rows"]]
    o = np.argsort(betas); b = np.array(betas)[o]
    get = lambda key: np.array([[s["rows"][i][key] for i in o] for s in S])
    fig, ax = plt.subplots(1, 3, figsize=(15, 3.8))
    ax[0].errorbar(b, get("ess").mean(0), get("ess").std(0, ddof=1) / np.sqrt(len(S)) if len(S) > 1 else None, fmt="o", color="k",
                   label=f"measured (Kish, datasets A, B; {len(S)} seeds)")
    ax[0].plot(b, get("ess_exact").mean(0), "-", label="binary closed form, exact N, at p̂ from C")
    ax[0].plot(b, get("ess_pop").mean(0), ":", label="binary closed form, population limit")
    ax[0].set(xscale="log", xlabel="β", ylabel="mean ESS / N", title=f"{d}: ESS fraction of the BOLT weights")
    ax[1].plot(b, get("relvar").mean(0), "ko", label="measured Σ(Ẑ_A−Ẑ_B)²/2 / ΣẐ_AẐ_B")
    ax[1].plot(b, get("relvar_closed").mean(0), "-", label="binary closed form at p̂ from C")
    ax[1].set(xscale="log", yscale="log", xlabel="β", ylabel="pooled Var(Ẑ)/Z²", title=f"{d}: relative variance of Ẑ (N={S[0]['n']})")
    acc = []
    for lab, r in agg[d].items():
        if lab == "bolt" or lab.startswith("bolt-beta"):
            beta = 0.5 if lab == "bolt" else float(lab[9:])
            if lab == "bolt": beta = getattr(study, d).beta
            acc.append((beta, *r["metrics"]["heldout pass"][:2], *r["metrics"]["train pass"][:2]))
    acc.sort()
    A = np.array(acc)
    ax[2].errorbar(A[:, 0], A[:, 1], A[:, 2], marker="o", capsize=2, label="BOLT, held-out prompts")
    ax[2].errorbar(A[:, 0], A[:, 3], A[:, 4], marker="s", capsize=2, label="BOLT, training prompts")
    for arm, c in (("grpo", "C3"), ("refit", "C1"), ("positive", "C2")):
        if arm in agg[d]: ax[2].axhline(agg[d][arm]["metrics"]["heldout pass"][0], color=c, ls="--", lw=1, label=f"{arm} (held-out)")
    ax[2].axhline(agg[d]["bolt"]["base"]["heldout pass"][0], color="gray", ls=":", label="π_ref (held-out)")
    ax[2].set(xscale="log", xlabel="β", ylabel="pass rate", title=f"{d}: BOLT accuracy vs β")
    for a_ in ax:
        a_.set_xticks(b, [f"{x:g}" for x in b]); a_.xaxis.set_minor_locator(plt.NullLocator()); a_.legend(fontsize=7)
    fig.tight_layout(); save_figure(fig, "bolt_beta", dpi=80); plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/studies/bolt-tiny.yaml"))
    ap.add_argument("--domains", nargs="*", default=None, help="run only these domains' units (default: the config's)")
    ap.add_argument("--aggregate-only", action="store_true", help="do not run units; aggregate what is finished")
    ap.add_argument("--json", default=str(HERE / "results/study_bolt.json"))
    ap.add_argument("--bench", default=str(HERE / "results/bench_bolt.json"), help="bench_bolt.py's JSON for the time/memory claims")
    a = ap.parse_args()
    import torch
    from stalebook.bolt import BoltStudy, aggregate_study, arm_table, claim_rows, claim_table, study_units
    from stalebook.core import atomic_write_json, config_dict, load_config
    study = load_config(BoltStudy, a.config)
    units = study_units(study)
    log = lambda s: print(s, flush=True)
    if not a.aggregate_only:
        run = [u for u in units if a.domains is None or u[0].split("/")[0] in a.domains]
        log(f"{len(run)} units ({len(units)} in the study); torch threads {torch.get_num_threads()}")
        run_units(study, run, log)
    arms, sweeps = collect(study, units)
    agg = aggregate_study(arms)
    bench = json.loads(Path(a.bench).read_text())["ratios"] if Path(a.bench).exists() else None
    rows = claim_rows({d: {k: v for k, v in D.items() if not k.startswith("bolt-beta")} for d, D in agg.items()}, bench)
    tf = Path(study.out) / "unit-seconds.json"
    secs = json.loads(tf.read_text()) if tf.exists() else {}
    tables = {d: arm_table(agg, d) for d in agg}
    out = dict(study=config_dict(study), n_units=len(units), n_finished=len(arms) + len(sweeps), unit_seconds=secs,
               wall_seconds_total=round(sum(secs.values()), 1), aggregate=agg, sweeps=sweeps, claims=rows, tables=tables,
               units={k: v for k, v in arms.items()}, machine="2 CPU cores shared with other jobs, torch 1 thread")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(a.json, out)
    figures(agg, sweeps, study)
    for d, t in tables.items(): print(f"\n## {d}\n{t}")
    print("\n" + claim_table(rows))
    print(f"\n{len(arms) + len(sweeps)}/{len(units)} units finished; unit wall time total {sum(secs.values()) / 3600:.2f} h -> {a.json}")


if __name__ == "__main__":
    main()
