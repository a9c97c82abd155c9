"""The main job measured: its wall time, and its predicted against its observed verdicts over repeats.

(a) Wall time. `stalebook demo REGISTRY` (default tiny:demo: the shipped tiny snapshot, nothing cached) into a
fresh results root in a temporary folder, exactly as `make demo` runs it but for `--root`; printed: wall seconds,
the CPU seconds of the job's processes, the load average around it, and the job's own decisions.

(b) Predicted vs observed. The demo's design is repeated with other seeds: repeat r registers the demo slice's
families with seeds {b_r, b_r + 1, ...} (as many as the slice has; base seeds 10, 20, 30, ... by default), in a
copy of the registry YAML in a temporary folder (the tracked file is never edited), and runs the job's run stage
(`stalebook run ... --executor shared`, the demo's workers) into its own root. Per repeat and checkpoint: the seeds
whose point passed the gate, whether every seed did, and each estimator's verdict. The prediction is
`report.gate_forecast` (`stalebook design`'s model: P(gate) per seed, P(verdict) per cell) on a pilot: the points
of run (a) (or `--pilot-root`, a results root of the same registry and design), pooled over their seeds, per
checkpoint, with `--pilot-results` (result.json files of other seeds at the same design) pooled in; from three pilot
points on the forecast widens the model's spread of Rel_k to the one between them (`protocol.pilot_models`), with two
it takes rho as known. P(every seed passes) = P(gate)^seeds for independent seeds. The repeats never see the pilot's
seeds.

A cell's verdict is Inconclusive also where its regime (nearest calibration regime to the cell's mean Rel_k and fresh
gain) is one the bound is not calibrated in; each repeat prints the regime, the summary how often it was calibrated.
CPU-heavy (each repeat trains its families and runs every point): run it once, in the background, e.g. (rerun
with the same --keep to print the summary again: finished units are not run again)

    .venv/bin/python benchmarks/bench_demo.py [--registry tiny:demo] [--repeats 5] [--base-seeds 10 20 30 40 50]
        [--skip-wall --pilot-root DIR] [--pilot-results R.json ...] [--keep DIR] [--json FILE] \
        > /tmp/bench_demo.log 2>&1 &
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchargs import add_record

import stalebook  # noqa: F401  (pins the CPU numerics before torch loads)

REPO = Path(__file__).resolve().parent.parent
CLI = [str(Path(sys.executable).parent / "stalebook")]  # the venv's console script, as `make demo` calls it


def registry_copy(spec: str, folder: Path, seeds_from: int | None = None) -> str:
    """A copy of registry `spec` (NAME:SLICE) in `folder`; with `seeds_from` the slice's blocks (else the study's)
    register seeds seeds_from, seeds_from + 1, ... (as many as each block had). Returns the copy's NAME:SLICE spec."""
    from stalebook.core import read_mapping
    from stalebook.registry import registry_path

    base, _, sl = spec.partition(":")
    data = read_mapping(registry_path(base))
    if seeds_from is not None:
        section = data["slices"][sl] if sl and "blocks" in data["slices"][sl] else data["study"]
        for b in section["blocks"]:
            b["seeds"] = [seeds_from + i for i in range(len(b["seeds"]))]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{Path(base).stem}.json"
    path.write_text(json.dumps(data, indent=1))
    return f"{path}:{sl}" if sl else str(path)


def timed(cmd: list[str], log: Path) -> dict:
    "Run `cmd` in the repository root, its output to `log`; wall seconds, children's CPU seconds, load averages."
    ru0, la0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg(), time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    wall, ru1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return dict(rc=rc, wall_s=wall, cpu_s=cpu, load_before=la0[0], load_after=os.getloadavg()[0], log=str(log))


def gate_of(s: dict) -> bool:
    """A point's gate from its bounds by the package's rule (`protocol.admissible`), not the flag its result stored:
    a point run before a change of the rule (e.g. the rounding at 2k/n) is counted by the rule of today."""
    from stalebook.protocol import admissible

    return admissible(s["rel_bounds"][0], s["gain_fresh_bounds"][0], s["k"], s["n"])


def cells_of(spec: str, root: Path) -> dict:
    """{checkpoint: dict(gate=[bool per seed], seeds, verdicts={estimator: verdict}, summaries=[...])} of the
    registry's (single-cell-per-checkpoint) study under `root`."""
    from stalebook.calibration import bound_calibrated, regime_of
    from stalebook.contracts import registry_status
    from stalebook.ranking_study import registry_cells
    from stalebook.registry import load_registry
    from stalebook.report import study_view

    reg = load_registry(spec)
    cells = registry_cells(reg, root, registry_status(reg, root))
    rows = study_view(reg, root)["table"]["rows"]
    out = {}
    for (m, d, tag, c), pts in cells.items():
        sums = [r for _, r, _ in pts]
        verdicts = {
            r["estimator"]: r["verdict"]
            for r in rows
            if (r["model"], r["domain"], r["tag"], r["checkpoint"]) == (m, d, tag, c)
        }
        got = [s for s in sums if s is not None]
        regime = (
            regime_of(
                sum(s["rel"] for s in got) / len(got),
                got[0]["n"],
                got[0]["k"],
                sum(s["gain_fresh"] for s in got) / len(got),
            )
            if got
            else None
        )
        out[(m, d, tag, c)] = dict(
            regime=regime,
            calibrated=bool(got) and bound_calibrated(got[0]["bound"], regime),
            gate=[bool(s and gate_of(s)) for s in sums],
            rel_lb=[s["rel_bounds"][0] if s else None for s in sums],
            missing=sum(s is None for s in sums),
            seeds=len(sums),
            verdicts=verdicts,
            summaries=[s for s in sums if s is not None],
        )
    return out


def forecasts(pilot: dict, extra: list[Path] = ()) -> dict:
    """{cell: gate_forecast} of a pilot's cells (its points pooled over seeds, with the points `extra` of the same
    design and checkpoint: other seeds' result.json files), for the cells' registered seeds."""
    from stalebook.report import gate_forecast

    more = {}
    for f in extra:
        data = json.loads(Path(f).read_text())
        more.setdefault(data["manifest"]["config"]["checkpoint"], []).append(data["result"])
    return {
        key: gate_forecast(c["summaries"] + more.get(key[3], []), c["seeds"])
        for key, c in pilot.items()
        if c["summaries"]
    }


def cell_name(key) -> str:
    m, d, tag, c = key
    return f"{m} {d}{' ' + tag if tag else ''} c={c}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--registry", default="tiny:demo", help="NAME:SLICE (default tiny:demo)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of the design with other seeds (default 5)")
    ap.add_argument("--base-seeds", type=int, nargs="*", help="first seed of each repeat (default 10, 20, ...)")
    ap.add_argument("--skip-wall", action="store_true", help="skip (a); needs --pilot-root")
    ap.add_argument("--pilot-root", help="results root of the registry whose points are the pilot (default: (a)'s)")
    ap.add_argument(
        "--pilot-results",
        nargs="+",
        default=[],
        help="more pilot points (result.json of other seeds at the same design; their checkpoint picks the cell)",
    )
    ap.add_argument("--keep", help="keep the results roots under this folder (default: a temporary folder, removed)")
    add_record(ap)
    args = ap.parse_args(argv)
    if args.skip_wall and not args.pilot_root:
        ap.error("--skip-wall needs --pilot-root (the points the prediction is made from)")
    bases = args.base_seeds or [10 * (i + 1) for i in range(args.repeats)]
    from stalebook.registry import load_registry
    from stalebook.report import demo_workers

    reg = load_registry(args.registry)
    workers = demo_workers(reg)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_demo-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"bench_demo: {args.registry}, {os.cpu_count()} cores, workers {workers}, under {work}", flush=True)
    out = dict(registry=args.registry, cores=os.cpu_count(), workers=workers)
    try:
        if not args.skip_wall:
            spec, root = registry_copy(args.registry, work / "wall"), work / "wall" / "root"
            t = timed([*CLI, "demo", spec, "--root", str(root)], work / "wall" / "demo.log")
            out["wall"] = t
            print(
                f"\n(a) stalebook demo {args.registry} (fresh root, shipped snapshot): rc {t['rc']}, "
                f"wall {t['wall_s']:.0f} s, CPU {t['cpu_s']:.0f} s, load {t['load_before']:.1f} -> "
                f"{t['load_after']:.1f}",
                flush=True,
            )
            text = Path(t["log"]).read_text()
            print(text[text.find("[demo] decisions") :].rstrip() if "[demo] decisions" in text else text[-3000:])
            if t["rc"] != 0:
                return 1
            pilot_spec, pilot_root = spec, root
        else:
            pilot_spec, pilot_root = args.registry, Path(args.pilot_root)
        pilot = cells_of(pilot_spec, pilot_root)
        fc = forecasts(pilot, [Path(p) for p in args.pilot_results])
        print("\n(b) prediction (stalebook design's model on the pilot's points, pooled over its seeds):")
        for key, f in fc.items():
            print(
                f"  {cell_name(key):22s} n={f['n']} K={f['K']} k={f['k']} ({f['bound']}), rho {f['rho']:.3f} from "
                f"{f['pilots']} points (Rel_k spread x{f['rel_sd_scale']:.2f}, LB offset x{f['spread_scale']:.2f} "
                f"the model's): "
                f"P(gate) {f['p_gate']:.2f} per seed, P(all {f['registered']} pass) "
                f"{f['p_gate'] ** f['registered']:.2f}; P(Effective/Ineffective/Inconclusive) "
                f"{f['p_effective']:.2f}/{f['p_ineffective']:.2f}/{f['p_inconclusive']:.2f}; "
                f"pilot passed {f['observed']}/{f['pilots']}",
                flush=True,
            )
        reps = []
        for i, b in enumerate(bases):
            d = work / f"repeat-{b}"
            spec = registry_copy(args.registry, d, seeds_from=b)
            run = ["--executor", "local"] if workers == 1 else ["--executor", "shared", "--workers", str(workers)]
            t = timed([*CLI, "run", spec, "--root", str(d / "root"), "--quiet", *run], d / "run.log")
            cells = cells_of(spec, d / "root") if t["rc"] == 0 else {}
            reps.append(
                dict(
                    base=b,
                    run=t,
                    cells={cell_name(k): {x: v[x] for x in v if x != "summaries"} for k, v in cells.items()},
                )
            )
            print(
                f"\nrepeat {i + 1}/{len(bases)} (seeds from {b}): rc {t['rc']}, wall {t['wall_s']:.0f} s, "
                f"CPU {t['cpu_s']:.0f} s",
                flush=True,
            )
            for key, c in cells.items():
                f = fc.get(key)
                vs = sorted(set(c["verdicts"].values()))
                print(
                    f"  {cell_name(key):22s} gate {sum(c['gate'])}/{c['seeds']} "
                    f"(Rel_k LB95 {' '.join('-' if x is None else f'{x:.3f}' for x in c['rel_lb'])}) "
                    f"{'(all pass)' if all(c['gate']) else '          '}"
                    f"  predicted P(all) {f['p_gate'] ** c['seeds'] if f else float('nan'):.2f}"
                    f"  {c['regime']} ({'calibrated' if c['calibrated'] else 'bound not calibrated'})"
                    f"  verdicts {', '.join(f'{e} {v}' for e, v in c['verdicts'].items()) if len(vs) > 1 else vs}",
                    flush=True,
                )
        out["forecast"] = {cell_name(k): {x: v for x, v in f.items()} for k, f in fc.items()}
        out["repeats"] = reps
        print(f"\nsummary over {len(reps)} repeats (predicted from the pilot; observed in the repeats):")
        for key, f in fc.items():
            name = cell_name(key)
            got = [r["cells"][name] for r in reps if name in r["cells"]]
            if not got:
                continue
            allp = sum(all(c["gate"]) for c in got)
            per_seed = sum(sum(c["gate"]) for c in got) / sum(c["seeds"] for c in got)
            verd = [v for c in got for v in c["verdicts"].values()]
            cal = sum(c["calibrated"] for c in got)
            obs = {v: verd.count(v) / len(verd) for v in ("Effective", "Ineffective", "Inconclusive")}
            print(
                f"  {name:22s} all seeds pass: {allp}/{len(got)} observed vs {f['p_gate'] ** f['registered']:.2f} "
                f"predicted; per seed {per_seed:.2f} vs {f['p_gate']:.2f}; verdicts (over repeats x estimators) "
                f"E/I/Inc {obs['Effective']:.2f}/{obs['Ineffective']:.2f}/{obs['Inconclusive']:.2f} vs predicted "
                f"{f['p_effective']:.2f}/{f['p_ineffective']:.2f}/{f['p_inconclusive']:.2f} "
                f"(the forecast does not model the calibration-regime rule; "
                f"cell in a calibrated regime in {cal}/{len(got)} repeats)"
            )
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
