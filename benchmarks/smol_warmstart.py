"""The format warm start of SmolLM2-135M-Instruct on one family (`math_nl`, `code_nl`), built, timed and recorded.

Measures the temperature-1 pass rate of the snapshot as imported on the warm start's own evaluation prompts (the same
prompts, sampler and sampling domain the build then uses for the warm-started model: a like-for-like "before"),
builds the warm-started snapshot with `stalebook.warmstart.warmstart_snapshot` (the spec's defaults unless options say
otherwise), and writes the record: the spec, the wall time of the build, the new snapshot's revision, its loss curve
and measured pass rate (from its build record), and the "before" measurement. `--rl-check` adds the pass rate of the
warm-started snapshot measured by the RL sampler (`rollouts.sample_batch`, backend hf) on a run's own task pool
(`task_pool(family, n, seed, level)`), the prompts an RL run would train on.

    PYTHONPATH=. python benchmarks/smol_warmstart.py [--family math_nl]
        [--out runs/snapshots/smollm2-135m-instruct-math] [--steps N] [--batch B] [--lr LR] [--threads T]
        [--rl-check] [--json results/records/smol_warmstart.json]

The code family's record: `--family code_nl --out runs/snapshots/smollm2-135m-instruct-code --rl-check
--json results/records/smol_warmstart_code.json`.
"""

import json
import math
import os
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path


def _parser():
    from benchargs import add_record

    from stalebook.core import CommandParser
    from stalebook.warmstart import WarmStartSpec

    ap = CommandParser(prog="smol_warmstart.py", description=__doc__.splitlines()[0])
    ap.add_argument("--snapshot", default="", help="the imported snapshot (default: the `make smol` one)")
    ap.add_argument("--out", default="runs/snapshots/smollm2-135m-instruct-math", help="warm-started snapshot folder")
    add_record(ap, "smol_warmstart")
    ap.add_argument("--no-before", action="store_true", help="skip the as-imported measurement")
    ap.add_argument("--rl-check", action="store_true", help="also measure with the RL sampler on a run's task pool")
    for f in fields(WarmStartSpec):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    return ap


def _rl_check(snap: str, spec) -> dict:
    "Pass rate of `snap` by the RL sampler on a run's task pool (eval_n prompts x eval_k samples, temperature 1)."
    from stalebook.core import Domain
    from stalebook.model import load_policy
    from stalebook.rollouts import SamplingConfig, make_sampler, sample_batch, task_pool
    from stalebook.tasks import rewards

    model, tok = load_policy(snap, device="cpu", dtype="float32")
    tasks = task_pool(spec.family, spec.eval_n, spec.seed, spec.level)
    sc = SamplingConfig(
        group_size=spec.eval_k,
        max_new_tokens=spec.max_new_tokens,
        groups_per_batch=spec.eval_n,
        system_prompt=spec.system,
    )
    gen = sample_batch(make_sampler("hf", model, tok), tasks, Domain(spec.seed, ("bench", "smol_warmstart")), sc)
    r = [x for x, _ in rewards([t for t in tasks for _ in range(spec.eval_k)], gen.texts)]
    p, m = sum(r) / len(r), len(r)
    per = [sum(r[i * spec.eval_k : (i + 1) * spec.eval_k]) / spec.eval_k for i in range(spec.eval_n)]
    se_p = math.sqrt(sum((x - p) ** 2 for x in per) / (len(per) - 1) / len(per))
    return {
        "pass_rate": round(p, 4),
        "se": round(math.sqrt(p * (1 - p) / m), 4),
        "se_prompts": round(se_p, 4),
        "samples": m,
        "tasks": f"task_pool({spec.family!r}, {spec.eval_n}, seed {spec.seed}, level {spec.level})",
        "sampler": "rollouts.sample_batch, backend hf",
    }


def main(argv=None) -> int:
    import torch

    from stalebook.model import keep_freed_memory, load_policy
    from stalebook.pretrained import smol_snapshot
    from stalebook.snapshot import read_lock
    from stalebook.tasks import synthetic_tasks
    from stalebook.warmstart import WarmStartSpec, chat_pass_rate, warmstart_snapshot

    a = _parser().parse_args(argv)
    spec = WarmStartSpec(**{f.name: getattr(a, f.name) for f in fields(WarmStartSpec)})
    spec.check()
    src = Path(a.snapshot) if a.snapshot else smol_snapshot()
    keep_freed_memory()
    before = None
    if not a.no_before:
        torch.set_num_threads(spec.threads)
        model, tok = load_policy(src)
        evals = synthetic_tasks(spec.family, spec.eval_n, spec.domain("eval"), spec.level)
        t0 = time.time()
        before = chat_pass_rate(model, tok, evals, spec.system, spec.domain("sample"), spec.eval_k, spec.max_new_tokens)
        before["wall_s"] = round(time.time() - t0, 1)
        print(f"as imported: pass rate {before['pass_rate']:.3f} ± {before['se']:.3f} ({before['wall_s']} s)")
        del model
    t0 = time.time()
    lock = warmstart_snapshot(src, a.out, spec, overwrite=True)
    wall = time.time() - t0
    build = json.loads((Path(a.out) / "stalebook_build.json").read_text())
    rec = {
        "what": f"format warm start of SmolLM2-135M-Instruct (Q4_1 GGUF dequantized) on {spec.family}, CPU float32",
        "command": "PYTHONPATH=. python benchmarks/smol_warmstart.py " + " ".join(argv or sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "threads": spec.threads, "note": "2 cores shared with other jobs"},
        "spec": asdict(spec),
        "parent_revision": read_lock(src)["revision"],
        "revision": lock["revision"],
        "wall_s": round(wall, 1),
        "band": [0.2, 0.8],
        "in_band": 0.2 <= build["pass_rate"]["pass_rate"] <= 0.8,
        "before": before,
        "build": {k: build[k] for k in ("weights", "loss_curve", "pass_rate")},
    }
    if a.rl_check:
        t1 = time.time()
        rec["rl_sampler_check"] = {**_rl_check(a.out, spec), "wall_s": round(time.time() - t1, 1)}
        print(f"RL sampler, run task pool: {rec['rl_sampler_check']}")
    Path(a.json).write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.json}: revision {lock['revision'][:16]}, build {wall:.0f} s")
    return 0


if __name__ == "__main__":
    from stalebook.core import StalebookError

    try:
        sys.exit(main())
    except StalebookError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
