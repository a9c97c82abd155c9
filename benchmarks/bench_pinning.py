"""What pinning the CPU numerics costs (issue: Reproducible on every machine), measured side by side in one run.

Every stalebook process pins torch/MKL/oneDNN to the AVX2 kernels and MKL's COMPATIBLE reproducibility branch
(`stalebook.core.pin_numerics`); `STALEBOOK_NUMERICS=native` runs the machine's own kernels. The mode is fixed at
process start, so each measurement runs in its own process, pinned and native alternating (ABAB...) to spread the
machine's noise over both. Measured per process, after a warm-up:
  * a GRPO step of the tiny model (`Trainer.train_step`, configs/tiny/train-math.yaml: 16 prompts x 16 samples)
  * a scoring pass (all four estimators' features of 64 stored rollouts, `stale_features`)
and the ratios pinned / native of the medians over rounds.

    .venv/bin/python benchmarks/bench_pinning.py [--rounds 2] [--steps 3] [--json PATH]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import stalebook  # noqa: F401  (first: pins the numerics, or not, before bench_engine loads torch)

HERE = Path(__file__).resolve().parent


def worker(steps: int) -> dict:
    "One process: its numerics, seconds per GRPO step and per scoring pass."
    import tempfile
    import time

    from bench_scoring import bench_scoring

    from stalebook.core import load_config
    from stalebook.model import default_snapshot, numerics_state
    from stalebook.trainer import TrainConfig, Trainer

    snap = str(default_snapshot())
    out = Path(tempfile.mkdtemp(prefix="bench-pinning-")) / "run"
    ov = dict(out=str(out), snapshot=snap, steps=steps + 1, lineage_steps=[0], checkpoint_every=10**6)
    tr = Trainer(load_config(TrainConfig, HERE.parent / "configs" / "tiny" / "train-math.yaml", overrides=ov))
    tr.log.append(tr.train_step())  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        tr.log.append(tr.train_step())
    step_s = (time.perf_counter() - t0) / steps
    sc = bench_scoring(snap, 64)
    return dict(numerics=numerics_state(), grpo_step_s=step_s, scoring_s=sc["score4_s"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.steps)))
        return
    runs = {"pinned": [], "native": []}
    for r in range(a.rounds):
        for mode in ("pinned", "native"):
            env = {**os.environ, "STALEBOOK_NUMERICS": mode, "PYTHONPATH": str(HERE)}
            for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA"):
                env.pop(k, None)
            out = subprocess.run(
                [sys.executable, __file__, "--worker", "--steps", str(a.steps)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            runs[mode].append(rec)
            print(
                f"round {r} {mode:6s} ({rec['numerics']['aten']}, MKL {rec['numerics']['mkl_cbwr']}): "
                f"GRPO step {rec['grpo_step_s']:.3f} s, scoring pass {rec['scoring_s']:.3f} s",
                flush=True,
            )
    med = {m: {k: statistics.median(x[k] for x in v) for k in ("grpo_step_s", "scoring_s")} for m, v in runs.items()}
    ratio = {k: med["pinned"][k] / med["native"][k] for k in med["pinned"]}
    print(
        f"pinned / native: GRPO step {ratio['grpo_step_s']:.2f}x, scoring pass {ratio['scoring_s']:.2f}x "
        f"(medians over {a.rounds} rounds)"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(dict(runs=runs, median=med, ratio=ratio), indent=2))


if __name__ == "__main__":
    main()
