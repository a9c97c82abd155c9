"""Time and peak memory of BOLT's training against online GRPO's, measured side by side in one run.

Both arms train a study section's budget (default: registry configs/registries/bolt-tiny.yaml, section `study.math`: 100
updates of 16 prompts x 16 completions, same LoRA, same prompt schedule; GRPO with the k3 KL at the same beta). Each
measurement is a fresh subprocess (`stalebook.bolt.train_arm` with a `Meter`) with its own store root, so BOLT samples
its reference dataset every time; repeats alternate the order (BOLT first, then GRPO first) so a drifting machine load
hits both. Reported per arm: the training phase's wall time and CPU time (process + finished children), BOLT's
reference-sampling phase, and the training phase's peak RSS (Linux VmHWM, reset at the phase start) and its own
allocation (peak minus the RSS at the phase start); on CUDA also torch's peak allocated bytes. The ratios are medians
over repeats of BOLT / GRPO.

    PYTHONPATH=. python benchmarks/bench_bolt.py [--registry bolt-tiny] [--domain math] [--repeats 2] [--steps 100]
                                                 [--out runs/bench_bolt] [--json results/records/bench_bolt.json]

The paper reports BOLT at about 0.15-0.25x GRPO's training time and 0.69-0.82x its peak memory (7B models, GPU).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
from benchargs import add_record

import numpy as np  # isort: skip

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHILD = r"""
import json, sys, dataclasses
from stalebook.bolt import Meter, train_arm
import stalebook.bolt_study  # noqa: F401  (registers the bolt kind of the registry this loads)
from stalebook.registry import load_registry
reg, arm, steps, out, domain = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
r = load_registry(reg)
base = getattr(r.spec, domain)
snap = r.models[r.spec.model].folder()  # '' = the embedded tiny model
at = base.eval.at if steps % base.eval.at == 0 else 1
cfg = dataclasses.replace(base, arm=arm, rounds=1, stores=out + "/stores",
                          train=dataclasses.replace(base.train, steps=steps, snapshot=snap),
                          eval=dataclasses.replace(base.eval, at=at))
m = Meter(cfg.train.device)
tr = train_arm(cfg, out + "/arm", meter=m)
recs = tr.log.records
print("RESULT " + json.dumps(dict(arm=arm, phases=m.phases, steps=len(recs),
                                  t_step_sum=sum(r["t_step"] for r in recs),
                                  t_gen_sum=sum(r.get("t_gen", 0.0) for r in recs))))
"""


def measure(cfgf, arm, steps, out, domain="math"):
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", CHILD, cfgf, arm, str(steps), str(out), domain],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if r.returncode != 0:
        raise SystemExit(f"{arm} failed:\n{r.stderr[-3000:]}")
    res = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("RESULT "))[7:])
    res["process_seconds"] = time.perf_counter() - t0
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--registry",
        default="bolt-tiny",
        help="a bolt registry (name or YAML file); its study section --domain is the budget",
    )
    ap.add_argument("--domain", default="math", help="the study section measured (math, code, math_nl, code_nl)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out", default=str(ROOT / "runs/bench_bolt"))
    add_record(ap, "bench_bolt")
    a = ap.parse_args()
    runs = []
    for rep in range(a.repeats):
        for arm in ("bolt", "grpo") if rep % 2 == 0 else ("grpo", "bolt"):
            r = measure(a.registry, arm, a.steps, Path(a.out) / f"{arm}-{rep}", a.domain)
            ph = r["phases"]
            print(
                f"repeat {rep} {arm:5s}: train {ph['train']['seconds']:7.1f} s "
                f"({ph['train']['cpu_seconds']:6.1f} CPU s)"
                + (f"  reference {ph['reference']['seconds']:6.1f} s" if "reference" in ph else "")
                + f"  (steps: generation {r['t_gen_sum']:6.1f} s, the rest {r['t_step_sum'] - r['t_gen_sum']:6.1f} s)"
                + f"  peak RSS {ph['train']['peak_rss_mib']:6.0f} MiB "
                f"(phase's own {ph['train']['peak_rss_mib'] - ph['train']['start_rss_mib']:5.0f} MiB)",
                flush=True,
            )
            runs.append(dict(repeat=rep, **r))
    pick = lambda arm, f: [f(r["phases"]) for r in runs if r["arm"] == arm]
    med = lambda arm, f: float(np.median(pick(arm, f)))
    train = lambda p: p["train"]["seconds"]
    total = lambda p: p["train"]["seconds"] + p.get("reference", {}).get("seconds", 0.0)
    cpu = lambda p: p["train"]["cpu_seconds"]
    cpu_total = lambda p: p["train"]["cpu_seconds"] + p.get("reference", {}).get("cpu_seconds", 0.0)
    peak = lambda p: max(p["train"]["peak_rss_mib"], p.get("reference", {}).get("peak_rss_mib", 0.0))
    peak_train = lambda p: p["train"]["peak_rss_mib"]
    alloc = lambda p: p["train"]["peak_rss_mib"] - p["train"]["start_rss_mib"]
    ratios = dict(
        time_ratio_train=med("bolt", train) / med("grpo", train),
        time_ratio_total=med("bolt", total) / med("grpo", total),
        cpu_ratio_train=med("bolt", cpu) / med("grpo", cpu),
        cpu_ratio_total=med("bolt", cpu_total) / med("grpo", cpu_total),
        peak_ratio=med("bolt", peak_train) / med("grpo", peak_train),
        peak_ratio_incl_reference=med("bolt", peak) / med("grpo", peak),
        alloc_ratio=med("bolt", alloc) / med("grpo", alloc),
    )
    if all("cuda_peak_mib" in r["phases"]["train"] for r in runs):
        ratios["cuda_peak_ratio"] = med("bolt", lambda p: p["train"]["cuda_peak_mib"]) / med(
            "grpo", lambda p: p["train"]["cuda_peak_mib"]
        )
    summary = {
        arm: dict(
            train_seconds=pick(arm, train),
            total_seconds=pick(arm, total),
            train_cpu_seconds=pick(arm, cpu),
            total_cpu_seconds=pick(arm, cpu_total),
            peak_rss_mib=pick(arm, peak_train),
            own_alloc_mib=pick(arm, alloc),
            reference_seconds=pick(arm, lambda p: p.get("reference", {}).get("seconds", 0.0)),
            step_generation_seconds=[r["t_gen_sum"] for r in runs if r["arm"] == arm],
            step_learn_seconds=[r["t_step_sum"] - r["t_gen_sum"] for r in runs if r["arm"] == arm],
        )
        for arm in ("bolt", "grpo")
    }
    out = dict(
        registry=a.registry,
        domain=a.domain,
        steps=a.steps,
        repeats=a.repeats,
        runs=runs,
        summary=summary,
        ratios=ratios,
        machine=f"{os.cpu_count()} CPU cores shared with other jobs "
        f"(load average {os.getloadavg()[0]:.1f} at the end), torch 1 thread, CPU float32",
    )
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    print("\nBOLT / GRPO (median of %d repeats, measured side by side):" % a.repeats)
    print(f"  training time        {ratios['time_ratio_train']:.3f}x   (paper: 0.15-0.25x)")
    print(f"  incl. reference      {ratios['time_ratio_total']:.3f}x")
    print(
        f"  training CPU time    {ratios['cpu_ratio_train']:.3f}x   (incl. reference {ratios['cpu_ratio_total']:.3f}x)"
    )
    print(f"  peak RSS (training)  {ratios['peak_ratio']:.3f}x   (paper: 0.69-0.82x peak GPU memory)")
    print(f"  phase's own alloc.   {ratios['alloc_ratio']:.3f}x")
    if "cuda_peak_ratio" in ratios:
        print(f"  CUDA peak allocated  {ratios['cuda_peak_ratio']:.3f}x")
    print(f"-> {a.json}")


if __name__ == "__main__":
    main()
