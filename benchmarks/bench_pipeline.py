"""Throughput of pipelined vs synchronous GRPO, side by side in one run, on the math and the code domain.

For each domain the same TrainConfig (the embedded tiny model, or `--snapshot DIR`, e.g. SmolLM2's warm start with
`--domains math_nl --system-prompt "You are a helpful assistant."`; P prompts x K responses, L new tokens, N steps) is
run (1) synchronously — `Trainer.run`, one process: sample, teacher-force, verify, learn, in turn — and (2) pipelined —
`stalebook.pipeline.run_pipeline`: a generator process (sample, teacher-force, verify) and the learner process,
`on_stale: block` at `max_staleness` 1, queue of 2 batches. Both use 1 torch thread per process. Reported: learner
steps/s and learned (completion) tokens/s over the whole run (process start-up and model load included) and in the
steady state (from step `warm` on), their pipelined/synchronous ratios, the realised lags, and per run the means over
steps of the training-inference mismatch diagnostics (`mismatch/*`: trainer vs sampler log-probs) and, pipelined,
the off-policy ones (`objectives.offpolicy_stats`: the learner's policy vs the stale one that sampled). The runs
alternate (sync, pipe, sync, pipe, ...) so that a change in the shared machine's load hits both. On code the rewards
run in sandboxed subprocesses; the verifier measured is identified by the content hashes of stalebook/sandbox.py and
stalebook/tasks.py written into the results.

    .venv/bin/python benchmarks/bench_pipeline.py [--domains math code] [--repeats 2]
        [--steps-math 24] [--steps-code 10] [--snapshot DIR --system-prompt TEXT --lr LR -L L]
        [--json results/records/bench_pipeline.json]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
from benchargs import add_record

import numpy as np  # isort: skip

HERE = Path(__file__).resolve().parent


def _cfg(domain, out, steps, pipelined, P, K, L, snapshot="", system_prompt="", lr=3e-3):
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import AsyncConfig, TrainConfig

    async_cfg = (
        AsyncConfig(mode="pipelined", max_staleness=1, on_stale="block", queue_size=2) if pipelined else AsyncConfig()
    )
    return TrainConfig(
        out=str(out),
        snapshot=snapshot,
        domain=domain,
        n_tasks=256,
        steps=steps,
        prompts_per_step=P,
        lr=lr,
        sampling=SamplingConfig(
            group_size=K, max_new_tokens=L, groups_per_batch=P, system_prompt=system_prompt or None
        ),
        lineage_steps=(0,),
        checkpoint_every=max(steps, 1),
        async_training=async_cfg,
        mismatch_diagnostics=True,
        threads=1,
    )


def diagnostics(recs) -> dict:
    "Means over steps of the records' mismatch/* and off-policy (`objectives.offpolicy_stats`) statistics."
    off = ("logr_max_abs", "logr_mean_abs", "kl_behav_k3", "clip_frac", "is_ess_frac", "is_log_max", "is_beyond_frac")
    keys = sorted({k for r in recs for k in r if k.startswith("mismatch/") or k in off})
    return {k: float(np.mean(v)) for k in keys if (v := [r[k] for r in recs if r.get(k) is not None])}


def run_sync(domain, out, steps, warm, **kw):
    from stalebook.trainer import Trainer

    t0 = time.perf_counter()
    tr = Trainer(_cfg(domain, out, steps, False, **kw)).run(progress=False)
    wall = time.perf_counter() - t0
    recs = tr.log.records
    ts = np.array([r["t_step"] for r in recs])
    tok = np.array([r["n_tokens"] for r in recs])
    return dict(
        wall_s=wall,
        steps_per_s=len(recs) / wall,
        tokens_per_s=tok.sum() / wall,
        steady_steps_per_s=(len(recs) - warm) / ts[warm:].sum(),
        steady_tokens_per_s=tok[warm:].sum() / ts[warm:].sum(),
        reward_mean=float(np.mean([r["reward_mean"] for r in recs])),
        diagnostics=diagnostics(recs),
    )


def run_pipe(domain, out, steps, warm, **kw):
    from stalebook.pipeline import run_pipeline

    t0 = time.perf_counter()
    man = run_pipeline(_cfg(domain, out, steps, True, **kw), progress=False)
    wall = time.perf_counter() - t0
    from stalebook.core import read_jsonl

    recs = read_jsonl(Path(out) / "steps.jsonl").records
    td = np.array([r["t_done"] for r in recs])
    tok = np.array([r["n_tokens"] for r in recs])
    span = td[-1] - td[warm - 1]
    return dict(
        wall_s=wall,
        steps_per_s=len(recs) / wall,
        tokens_per_s=tok.sum() / wall,
        steady_steps_per_s=(len(recs) - warm) / span,
        steady_tokens_per_s=tok[warm:].sum() / span,
        reward_mean=float(np.mean([r["reward_mean"] for r in recs])),
        lag_histogram=man["lag_histogram"],
        max_lag=man["max_lag"],
        lag_bound_held=man["lag_bound_held"],
        learner_wait_s=float(sum(r["t_wait"] for r in recs)),
        gen_sample_s=float(sum(r["t_sample"] for r in recs)),
        gen_reward_s=float(sum(r["t_reward"] for r in recs)),
        diagnostics=diagnostics(recs),
    )


def verifier_id() -> dict:
    from stalebook.core import hash_file

    root = HERE.parent
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    return dict(
        commit=commit,
        sandbox_py_sha256=hash_file(root / "stalebook" / "sandbox.py"),
        tasks_py_sha256=hash_file(root / "stalebook" / "tasks.py"),
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", nargs="+", default=["math", "code"], choices=["math", "code", "math_nl", "code_nl"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps-math", type=int, default=24)
    ap.add_argument("--steps-code", type=int, default=10)
    ap.add_argument("--warm", type=int, default=3, help="steps excluded from the steady-state rates")
    ap.add_argument("-P", type=int, default=8)
    ap.add_argument("-K", type=int, default=8)
    ap.add_argument("-L", type=int, default=0, help="max new tokens (default: 8 on math, 12 on code)")
    ap.add_argument("--snapshot", default="", help="a snapshot folder (default: the embedded tiny model)")
    ap.add_argument("--system-prompt", default="", help="the system turn of a chat snapshot's prompts")
    ap.add_argument("--lr", type=float, default=3e-3)
    add_record(ap, "bench_pipeline")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    from stalebook.snapshot import read_lock

    out = dict(
        machine=f"{os.cpu_count()} CPUs, shared with other workers (load average at start {os.getloadavg()[0]:.1f})",
        snapshot=dict(folder=args.snapshot or "embedded tiny", revision=read_lock(args.snapshot)["revision"])
        if args.snapshot
        else "embedded tiny",
        lr=args.lr,
        verifier=verifier_id(),
        P=args.P,
        K=args.K,
        warm=args.warm,
        domains={},
    )
    t_all = time.time()
    for dom in args.domains:
        steps, L = (args.steps_math, 8) if dom.startswith("math") else (args.steps_code, 12)
        L = args.L or L
        kw = dict(P=args.P, K=args.K, L=L, snapshot=args.snapshot, system_prompt=args.system_prompt, lr=args.lr)
        runs = {"sync": [], "pipelined": []}
        for rep in range(args.repeats):
            for mode, fn in (("sync", run_sync), ("pipelined", run_pipe)):
                d = tmp / f"{dom}-{mode}-{rep}"
                r = fn(dom, d, steps, args.warm, **kw)
                shutil.rmtree(d, ignore_errors=True)
                runs[mode].append(r)
                print(
                    f"{dom} {mode:9s} rep {rep}: "
                    f"{r['steps_per_s']:.3f} steps/s ({r['steady_steps_per_s']:.3f} steady), "
                    f"{r['tokens_per_s']:.0f} tokens/s ({r['steady_tokens_per_s']:.0f} steady), "
                    f"wall {r['wall_s']:.1f} s, load {os.getloadavg()[0]:.1f}"
                    + (f", lags {r['lag_histogram']}" if mode == "pipelined" else ""),
                    flush=True,
                )
        med = {
            m: {
                k: float(np.median([r[k] for r in rs]))
                for k in ("steps_per_s", "tokens_per_s", "steady_steps_per_s", "steady_tokens_per_s")
            }
            for m, rs in runs.items()
        }
        ratio = {k: med["pipelined"][k] / med["sync"][k] for k in med["sync"]}
        out["domains"][dom] = dict(
            steps=steps, max_new_tokens=L, runs=runs, median=med, ratio_pipelined_over_sync=ratio
        )
        print(
            f"{dom}: pipelined / synchronous (median of {args.repeats}): steps/s x{ratio['steps_per_s']:.2f} "
            f"(steady x{ratio['steady_steps_per_s']:.2f}), "
            f"tokens/s x{ratio['tokens_per_s']:.2f} (steady x{ratio['steady_tokens_per_s']:.2f})",
            flush=True,
        )
    out["wall_s"] = round(time.time() - t_all, 1)
    from stalebook.core import atomic_write_json

    atomic_write_json(args.json, json.loads(json.dumps(out, default=float)))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {args.json} ({out['wall_s']:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
