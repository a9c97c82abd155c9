"""The BOLT comparison's figures and claim table, read through the registry (configs/registries/bolt-tiny.yaml, kind
`bolt` of nbs/37_bolt_study): the units are run by `stalebook run bolt-tiny` (idempotent, resumable; `--run` here
does the same), checked by `stalebook status bolt-tiny`, frozen by `stalebook freeze bolt-tiny`. This script reads
the results of the units that pass every contract, aggregates them (stalebook.bolt.aggregate_study, with the
training seconds of the units' timings.json sidecars), adds the time and memory rows of bench_bolt.py's ratios to
the claim table and draws figures/bolt_time.png, figures/bolt_rounds.png, figures/bolt_beta.png (titles say
PARTIAL while any unit is missing or failing).

    PYTHONPATH=. python benchmarks/study_bolt.py [--registry bolt-tiny] [--root DIR] [--run] [--only 'math-*']
                                                 [--json benchmarks/results/study_bolt.json]
    PYTHONPATH=. python benchmarks/study_bolt.py --legacy-root runs/bolt     # a run made before the registry existed

`--legacy-root` reads a results folder of the earlier layout <root>/<domain>/s<seed>/<label> (the same units, run by
`run_arm`/`run_sweep` directly, without phase records): those results are aggregated as they are, and marked as not
contract-checked. Wall times are those of the shared 2-core machine they ran on.
"""

import argparse
import json
import sys
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
import numpy as np  # isort: skip

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def unit_folder(root: Path, uid: str, legacy: bool) -> Path:
    from stalebook.bolt import unit_label
    from stalebook.units import unit_dir

    if not legacy:
        return unit_dir(root, uid)
    d, s, label = unit_label(uid)
    return root / d / f"s{s}" / label


def collect(reg, root: Path, legacy: bool):
    """Results and timings of the arm units, sweep rows, and which units were counted (passing, or present for a
    legacy root)."""
    from stalebook.contracts import registry_status

    if legacy:
        ok, state = None, "legacy run (layout before the registry; contracts not checked)"
    else:
        st = registry_status(reg, root)
        ok, state = {r["item"] for r in st["rows"] if r["state"] == "pass"}, st["state"]
    arms, sweeps = {}, {}
    for uid, u in reg.units().items():
        folder = unit_folder(root, uid, legacy)
        if ok is not None and uid not in ok:
            continue
        if u.kind == "arm" and (folder / "result.json").exists():
            tf = folder / "timings.json"
            arms[uid] = dict(
                result=json.loads((folder / "result.json").read_text()),
                timings=json.loads(tf.read_text()) if tf.exists() else None,
            )
        elif u.kind == "sweep" and (folder / "sweep.json").exists():
            sweeps[uid] = json.loads((folder / "sweep.json").read_text())
    return arms, sweeps, state


def figures(agg, sweeps, study, tag=""):
    import matplotlib.pyplot as plt

    from stalebook.core import save_figure

    colors = dict(bolt="C0", refit="C1", positive="C2", grpo="C3", iterative="C4")
    doms = [d for d in study.domains if d in agg]
    # 1. held-out pass rate against cumulative training time (reference sampling included for the static arms)
    fig, ax = plt.subplots(1, len(doms), figsize=(5.5 * len(doms), 3.6), squeeze=False)
    for a_, d in zip(ax[0], doms):
        for arm, c in colors.items():
            if arm not in agg[d]:
                continue
            cv = agg[d][arm]["curve"]
            m, se = np.array([v[0] for v in cv["heldout pass"]]), np.array([v[1] for v in cv["heldout pass"]])
            a_.errorbar(cv["seconds"], m, se, marker="o", ms=3, capsize=2, color=c, label=arm)
        a_.set(
            xlabel="training wall time, s (seed mean; static arms: + reference sampling)",
            ylabel="held-out pass rate",
            title=f"{tag}{d}: held-out pass rate vs training time",
        )
        a_.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, "bolt_time", dpi=80)
    plt.close(fig)
    # 2. one-shot vs iterative BOLT over rounds (measured at every round boundary)
    fig, ax = plt.subplots(1, len(doms), figsize=(5.5 * len(doms), 3.6), squeeze=False)
    for a_, d in zip(ax[0], doms):
        for arm, ls in (("bolt", "-"), ("iterative", "--")):
            if arm not in agg[d]:
                continue
            cv = agg[d][arm]["curve"]
            for pool, mk in (("train pass", "o"), ("heldout pass", "s")):
                m, se = np.array([v[0] for v in cv[pool]]), np.array([v[1] for v in cv[pool]])
                a_.errorbar(
                    cv["steps"],
                    m,
                    se,
                    ls=ls,
                    marker=mk,
                    ms=3,
                    capsize=2,
                    color=colors[arm],
                    label=f"{'one-shot' if arm == 'bolt' else 'iterative'} BOLT, {pool.split()[0]} prompts",
                )
        a_.set(
            xlabel=(
                "optimizer step (iterative: a new reference every "
                f"{getattr(study, d).train.steps // study.rounds} steps)"
            ),
            ylabel="pass rate",
            title=f"{tag}{d}: one-shot vs iterative BOLT",
        )
        a_.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, "bolt_rounds", dpi=80)
    plt.close(fig)
    # 3. the beta frontier on real data: ESS, relative variance of Z-hat, BOLT accuracy against beta
    sd = [d for d in study.sweep_domains if d in agg]
    if not sd or not sweeps:
        return
    d = sd[0]
    S = [v for k, v in sweeps.items() if k.startswith(d + "-")]
    betas = [r["beta"] for r in S[0]["rows"]]
    o = np.argsort(betas)
    b = np.array(betas)[o]
    get = lambda key: np.array([[s["rows"][i][key] for i in o] for s in S])
    fig, ax = plt.subplots(1, 3, figsize=(15, 3.8))
    ax[0].errorbar(
        b,
        get("ess").mean(0),
        get("ess").std(0, ddof=1) / np.sqrt(len(S)) if len(S) > 1 else None,
        fmt="o",
        color="k",
        label=f"measured (Kish, datasets A, B; {len(S)} seeds)",
    )
    ax[0].plot(b, get("ess_exact").mean(0), "-", label="binary closed form, exact N, at p̂ from C")
    ax[0].plot(b, get("ess_pop").mean(0), ":", label="binary closed form, population limit")
    ax[0].set(xscale="log", xlabel="β", ylabel="mean ESS / N", title=f"{tag}{d}: ESS fraction of the BOLT weights")
    ax[1].plot(b, get("relvar").mean(0), "ko", label="measured Σ(Ẑ_A−Ẑ_B)²/2 / ΣẐ_AẐ_B")
    ax[1].plot(b, get("relvar_closed").mean(0), "-", label="binary closed form at p̂ from C")
    ax[1].set(
        xscale="log",
        yscale="log",
        xlabel="β",
        ylabel="pooled Var(Ẑ)/Z²",
        title=f"{d}: relative variance of Ẑ (N={S[0]['n']})",
    )
    acc = []
    for lab, r in agg[d].items():
        if lab == "bolt" or lab.startswith("bolt-beta"):
            beta = 0.5 if lab == "bolt" else float(lab[9:])
            if lab == "bolt":
                beta = getattr(study, d).beta
            acc.append((beta, *r["metrics"]["heldout pass"][:2], *r["metrics"]["train pass"][:2]))
    acc.sort()
    A = np.array(acc)
    ax[2].errorbar(A[:, 0], A[:, 1], A[:, 2], marker="o", capsize=2, label="BOLT, held-out prompts")
    ax[2].errorbar(A[:, 0], A[:, 3], A[:, 4], marker="s", capsize=2, label="BOLT, training prompts")
    for arm, c in (("grpo", "C3"), ("refit", "C1"), ("positive", "C2")):
        if arm in agg[d]:
            ax[2].axhline(agg[d][arm]["metrics"]["heldout pass"][0], color=c, ls="--", lw=1, label=f"{arm} (held-out)")
    ax[2].axhline(agg[d]["bolt"]["base"]["heldout pass"][0], color="gray", ls=":", label="π_ref (held-out)")
    ax[2].set(xscale="log", xlabel="β", ylabel="pass rate", title=f"{d}: BOLT accuracy vs β")
    for a_ in ax:
        a_.set_xticks(b, [f"{x:g}" for x in b])
        a_.xaxis.set_minor_locator(plt.NullLocator())
        a_.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, "bolt_beta", dpi=80)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registry", default="bolt-tiny", help="a bolt registry: NAME, NAME:SLICE or a YAML file")
    ap.add_argument("--root", default=None, help="the registry's results folder (default: its `out`)")
    ap.add_argument(
        "--legacy-root", default=None, help="read a results folder of the layout before the registry instead"
    )
    ap.add_argument("--run", action="store_true", help="first run (or resume) the units, as `stalebook run` does")
    ap.add_argument("--only", default=None, help="with --run: unit ids or patterns")
    ap.add_argument("--json", default=str(HERE / "results/study_bolt.json"))
    ap.add_argument(
        "--bench", default=str(HERE / "results/bench_bolt.json"), help="bench_bolt.py's JSON for the time/memory claims"
    )
    a = ap.parse_args()
    from stalebook.bolt import aggregate_study, arm_table, claim_rows, claim_table
    from stalebook.core import atomic_write_json, config_dict
    from stalebook.registry import load_registry, registry_hash, registry_root
    from stalebook.units import run_registry

    reg = load_registry(a.registry)
    legacy = a.legacy_root is not None
    root = Path(a.legacy_root) if legacy else registry_root(reg, a.root)
    if a.run and not legacy:
        run_registry(reg, root, a.only, progress=sys.stderr.isatty())
    arms, sweeps, state = collect(reg, root, legacy)
    agg = aggregate_study(arms)
    bench = json.loads(Path(a.bench).read_text())["ratios"] if Path(a.bench).exists() else None
    rows = claim_rows({d: {k: v for k, v in D.items() if not k.startswith("bolt-beta")} for d, D in agg.items()}, bench)
    tables = {d: arm_table(agg, d) for d in agg}
    n_units, n_done = len(reg.units()), len(arms) + len(sweeps)
    unit_s = {uid: u["timings"]["phases"] for uid, u in arms.items() if u["timings"]}
    secs = {uid: round(sum(p["seconds"] for p in ph.values()), 1) for uid, ph in unit_s.items()}
    out = dict(
        registry=reg.name,
        registry_hash=registry_hash(reg),
        study=config_dict(reg.spec),
        state=state,
        n_units=n_units,
        n_finished=n_done,
        unit_seconds=secs,
        wall_seconds_arms=round(sum(secs.values()), 1),
        aggregate=agg,
        sweeps=sweeps,
        claims=rows,
        tables=tables,
        units=arms,
        machine="2 CPU cores shared with other jobs (two unit workers), torch 1 thread per unit",
    )
    if (
        legacy and (root / "unit-seconds.json").exists()
    ):  # the earlier runner's wall seconds per unit (one process each)
        out["unit_wall_seconds"] = w = json.loads((root / "unit-seconds.json").read_text())
        out["wall_seconds_total"] = round(sum(w.values()), 1)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(a.json, out)
    tag = (
        ""
        if state in ("complete", "frozen") or (legacy and n_done == n_units)
        else f"PARTIAL ({n_done}/{n_units} units) - "
    )
    figures(agg, sweeps, reg.spec, tag)
    for d, t in tables.items():
        print(f"\n## {d}\n{t}")
    print("\n" + claim_table(rows))
    print(
        f"\n{reg.name}: {n_done}/{n_units} units counted ({state}); "
        f"arm units' measured phases {sum(secs.values()) / 3600:.2f} h -> {a.json}"
    )


if __name__ == "__main__":
    main()
