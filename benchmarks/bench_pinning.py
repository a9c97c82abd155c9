"""What the pinned numerics cost, measured side by side in one run: the pin (GEMMs routed through numpy's OpenBLAS on
its Haswell kernels, the default), the old pin (`STALEBOOK_GEMM=torch`: torch's GEMMs in MKL's COMPATIBLE branch)
and `STALEBOOK_NUMERICS=native` (the machine's own kernels).

The mode is fixed at process start, so each measurement runs in a process of its own, the three modes alternating
in every round (pin, old pin, native, pin, ...) to spread the machine's noise over all three. Per process, after a
warm-up, on `--threads` torch threads (a run's `threads`; default 1):
  * tiny GRPO step: `Trainer.train_step` (configs/tiny/train-math.yaml: 16 prompts x 16 samples)
  * tiny scoring: all four estimators' features of 64 stored rollouts (`stale_features`, bench_scoring)
  * tiny sampling: seconds per token of stalebook's sampler (`hf_sample`), 64 rows x 16 tokens
and with `--smol`, on SmolLM2-135M-Instruct as `make smol` imports it (LoRA r 8 on the attention projections;
bench_smol's tasks, chat template and system prompt):
  * smollm2 sampling: seconds per token of stalebook's sampler, 8 prompts x 32 tokens
  * smollm2 GRPO step: one `Trainer.train_step` (8 prompts x K 2, 16 tokens: sample, rewards, behaviour pass,
    forward/backward, AdamW; bench_smol.grpo_step)
  * smollm2 scoring: the four estimators on 64 rollouts (16 groups x K 4, 16 tokens) at a policy one GRPO step
    after the one that sampled them (bench_smol.scoring_overhead)
Every process also runs its sampler against HF `generate` (greedy, KV cache, the same left-padded prompts) on the
tiny model (and SmolLM2): the sampler at temperature 1e-4, where its float64 inverse-CDF draw is the argmax, so both
give the same tokens (checked); seconds per token of each, interleaved, medians over `--reps`.
With `--demo`, once per mode, the main job (`stalebook demo tiny:demo`, `--workers`) in a folder of its own: its wall
time and, summed over its points (`timings.json`), a tiny point's stages: rollouts, scoring, analysis.

The record (`--json`): {"stages": [{"name", "model", "pinned_s", "native_s", "old_pinned_s"}], "sampler_vs_generate",
"runs", ...}: medians over rounds, seconds (sampling stages: seconds per token). It is rewritten after every round,
so a run that is stopped keeps its complete rounds (`--from-log` rebuilds it from the lines a run printed).

    .venv/bin/python benchmarks/bench_pinning.py [--rounds 2] [--steps 3]
    .venv/bin/python benchmarks/bench_pinning.py --smol --demo --rounds 3 --json results/records/bench_pinning.json
"""

import argparse
import atexit
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchargs import add_record, add_reps, add_threads

import stalebook  # noqa: F401  (first: pins the numerics, or not, before bench_engine loads torch)

HERE = Path(__file__).resolve().parent
PATH = os.pathsep.join([str(HERE), str(Path(stalebook.__file__).resolve().parents[1])])  # workers: this stalebook
MODES = {  # mode: the environment its processes start with (over this one, the numerics variables removed)
    "pinned": {},
    "old_pinned": {"STALEBOOK_GEMM": "torch"},
    "native": {"STALEBOOK_NUMERICS": "native"},
}
NUMERICS_KEYS = ("STALEBOOK_NUMERICS", "STALEBOOK_GEMM", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
STAGES = {  # record key: (stage name, model)
    "grpo_step_s": ("grpo_step", "tiny"),
    "scoring_s": ("scoring_64", "tiny"),
    "tiny_sampling_s": ("sampling_per_token", "tiny"),
    "demo_rollouts_s": ("point_rollouts", "tiny"),
    "demo_scoring_s": ("point_scoring", "tiny"),
    "demo_analysis_s": ("point_analysis", "tiny"),
    "demo_job_s": ("demo_job", "tiny"),
    "smol_sampling_s": ("sampling_per_token", "smollm2"),
    "smol_grpo_step_s": ("grpo_step", "smollm2"),
    "smol_scoring_s": ("scoring_64", "smollm2"),
}


def _median_time(f, reps: int) -> float:
    "Median seconds of `reps` calls of `f` after one warm-up call."
    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def sampler_vs_generate(model, tok, prompts: list, tokens: int, reps: int, system: str | None = None) -> dict:
    """Seconds per completion token of stalebook's sampler (`hf_sample`, temperature 1e-4: the argmax) and of HF
    `generate` (greedy) on the same left-padded prompts, interleaved, medians over `reps` after a warm-up; the
    two must give the same tokens."""
    import torch

    from stalebook.model import left_pad, pad_token_id, split_at_stop, stop_token_ids
    from stalebook.rollouts import SamplingConfig, hf_sample, prompt_token_ids

    sc = SamplingConfig(group_size=1, max_new_tokens=tokens, temperature=1e-4, system_prompt=system)
    stops, pad = stop_token_ids(tok, model.generation_config), pad_token_id(tok, model.generation_config)
    u = torch.rand(len(prompts), tokens, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    times, out = {"sampler": [], "generate": []}, {}

    def ours():
        out["ours"] = hf_sample(model, tok, prompts, u, sc)[1]

    def theirs():
        ids, att, _ = left_pad(prompt_token_ids(tok, prompts, sc), pad)  # what hf_sample renders, timed alike
        with torch.no_grad():
            g = model.generate(
                input_ids=ids,
                attention_mask=att,
                do_sample=False,
                max_new_tokens=tokens,
                eos_token_id=list(stops),
                pad_token_id=pad,
                temperature=None,
                top_p=None,
                top_k=None,
            )
        out["theirs"] = []
        for r in g[:, ids.shape[1] :].tolist():  # each row cut after its stop token, as the sampler cuts it
            body, stopped = split_at_stop(r, stops)
            out["theirs"].append(body + [r[len(body)]] if stopped else body)

    for rep in range(reps + 1):  # rep 0: warm-up
        order = (("sampler", ours), ("generate", theirs))
        for name, f in order if rep % 2 else order[::-1]:
            t0 = time.perf_counter()
            f()
            if rep:
                times[name].append(time.perf_counter() - t0)
    if out["ours"] != out["theirs"]:
        raise SystemExit("bench_pinning: the sampler and model.generate produced different tokens")
    n = sum(map(len, out["ours"]))
    return {f"{k}_s_per_token": statistics.median(v) / n for k, v in times.items()} | {"tokens": n}


def tiny_stages(threads: int, steps: int, reps: int) -> dict:
    "The tiny model's stages: a GRPO step, scoring 64 rollouts, and sampling against `generate`."
    import torch
    from bench_scoring import bench_scoring

    from stalebook.core import load_config
    from stalebook.model import default_snapshot, load_policy
    from stalebook.trainer import TrainConfig, Trainer

    snap = str(default_snapshot())
    tmp = Path(tempfile.mkdtemp(prefix="bench-pinning-"))
    atexit.register(shutil.rmtree, tmp, True)  # the run's folder goes when the worker ends
    ov = dict(out=str(tmp / "run"), snapshot=snap, steps=steps + 1, lineage_steps=[0], checkpoint_every=10**6)
    tr = Trainer(load_config(TrainConfig, HERE.parent / "configs" / "tiny" / "train-math.yaml", overrides=ov))
    torch.set_num_threads(threads)
    tr.log.append(tr.train_step())  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        tr.log.append(tr.train_step())
    rec = dict(grpo_step_s=(time.perf_counter() - t0) / steps)
    rec["scoring_s"] = bench_scoring(snap, 64, threads)["score4_s"]
    model, tok = load_policy(snap)
    prompts = [f"{a}+{b}=" for a, b in zip(range(3, 40, 5), range(7, 30, 3)) for _ in range(8)]  # 64 rows
    sg = sampler_vs_generate(model, tok, prompts, 16, reps)
    return rec | dict(tiny_sampling_s=sg["sampler_s_per_token"], tiny_generate_s=sg["generate_s_per_token"])


def smol_stages(threads: int, reps: int) -> dict:
    "SmolLM2-135M-Instruct's stages (`make smol`): sampling against `generate`, a GRPO step, scoring 64 rollouts."
    from bench_smol import _tasks, grpo_step, scoring_overhead

    from stalebook.model import LoraSpec, compute_setup
    from stalebook.pretrained import smol_snapshot
    from stalebook.rollouts import load_run_policy

    compute_setup(threads)
    snap, system = smol_snapshot(), "You are a helpful assistant."
    lora = LoraSpec(r=8, target_modules="attention")
    model, tok = load_run_policy(str(snap), "", "cpu", "float32", lora=lora)
    model.eval()
    prompts = [t.prompt for t in _tasks(8, "b")]
    sg = sampler_vs_generate(model, tok, prompts, 32, reps, system)
    a = argparse.Namespace(prompts=8, k=2, tokens=16, threads=threads)
    step = grpo_step(a, snap, model, tok, system, lora)
    a = argparse.Namespace(groups=16, score_k=4, score_tokens=16, sketch=1024, score_reps=1, threads=threads)
    sc = scoring_overhead(a, snap, system, lora)
    return dict(
        smol_sampling_s=sg["sampler_s_per_token"],
        smol_generate_s=sg["generate_s_per_token"],
        smol_grpo_step_s=step["t_step"],
        smol_scoring_s=sc["median_s"]["score_four_estimators"],
    )


def worker(a) -> dict:
    "One process: its numerics and its stages."
    from stalebook.model import numerics_state

    rec = dict(numerics=numerics_state()) | tiny_stages(a.threads, a.steps, a.reps)
    if a.smol:
        rec |= smol_stages(a.threads, a.reps)
    return rec


def demo_stages(mode: str, workers: int) -> dict:
    "The main job in `mode` in a folder of its own: its wall seconds and its points' stages, summed."
    with tempfile.TemporaryDirectory(prefix="bench-pinning-demo-") as d:
        t0 = time.perf_counter()
        subprocess.run(
            [
                str(Path(sys.executable).parent / "stalebook"),
                "demo",
                "tiny:demo",
                "--root",
                d,
                "--workers",
                str(workers),
            ],
            env=_env(mode),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - t0
        tm = [json.loads(f.read_text()) for f in sorted(Path(d).rglob("timings.json"))]
        if not tm:
            raise SystemExit(f"bench_pinning: the {mode} demo left no point timings under {d}")
        return dict(
            demo_job_s=wall,
            demo_points=len(tm),
            demo_rollouts_s=sum(t["stale_rollouts"] + t["fresh_rollouts"] for t in tm),  # a point's own rollouts
            demo_scoring_s=sum(t["scoring"] for t in tm),
            demo_analysis_s=sum(t["analysis"] for t in tm),
        )


def _env(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in NUMERICS_KEYS} | {"PYTHONPATH": PATH}
    return env | MODES[mode]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed tiny GRPO steps per process")
    add_reps(ap, 3, "timed repetitions of the sampling stages (median)")
    add_threads(ap)
    ap.add_argument("--smol", action="store_true", help="also SmolLM2-135M-Instruct's stages (needs `make smol`)")
    ap.add_argument("--demo", action="store_true", help="also the main job once per mode")
    ap.add_argument("--workers", type=int, default=2, help="with --demo: the demo's run-stage workers")
    add_record(ap)
    ap.add_argument("--from-log", default="", help="the record of the rounds a stopped run printed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for name in ("rounds", "steps", "reps", "threads", "workers"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.from_log:
        runs = runs_from_log(Path(a.from_log).read_text())
        rounds = min(len(v) for v in runs.values())
        print(json.dumps(record({m: v[:rounds] for m, v in runs.items()}, a, rounds)["stages"], indent=1))
        return
    if a.worker:
        print(json.dumps(worker(a)))
        return
    if a.smol:
        from stalebook.pretrained import smol_snapshot

        smol_snapshot()  # no snapshot: its one-line error now, not after the first round
    flags = ["--steps", str(a.steps), "--reps", str(a.reps), "--threads", str(a.threads), *(["--smol"] * a.smol)]
    runs = {m: [] for m in MODES}
    for r in range(a.rounds):
        for mode in MODES:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", *flags], env=_env(mode), capture_output=True, text=True
            )
            if out.returncode:
                raise SystemExit(f"bench_pinning: the {mode} worker failed:\n{out.stderr[-3000:]}")
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            if a.demo and r == 0:
                rec |= demo_stages(mode, a.workers)
            num = rec.pop("numerics")
            want = ("pinned", "openblas") if mode == "pinned" else ("pinned" if mode == "old_pinned" else mode, None)
            if (num["mode"], num.get("gemm")) != want:
                raise SystemExit(f"bench_pinning: the {mode} worker computed in {num['mode']}, GEMMs {num.get('gemm')}")
            runs[mode].append(rec)
            print(f"round {r} {mode}: " + ", ".join(f"{k} {v:.4g}" for k, v in rec.items()), flush=True)
        rec = record(runs, a, r + 1)  # written after every round: a run that is stopped keeps its complete rounds
    for st in rec["stages"]:
        print(
            f"{st['model']:8s} {st['name']:19s} pinned/native {st['pinned_s'] / st['native_s']:.2f}x, "
            f"old pin/pinned {st['old_pinned_s'] / st['pinned_s']:.2f}x, old pin/native "
            f"{st['old_pinned_s'] / st['native_s']:.2f}x"
        )
    for m, v in rec["sampler_vs_generate"].items():
        print(f"{m:8s} sampler / generate (pinned): {v['pinned']:.2f}x the tokens/s")


def runs_from_log(text: str) -> dict:
    "{mode: [stage values of one process]} from the lines `round <r> <mode>: key value, ...` that a run printed."
    runs = {}
    for line in text.splitlines():
        if m := re.match(r"round \d+ (\w+): (.*)$", line):
            runs.setdefault(m[1], []).append({k: float(v) for k, v in re.findall(r"(\w+) ([\d.e+-]+)", m[2])})
    return runs


def record(runs: dict, a, rounds: int) -> dict:
    "The record of the rounds so far (medians per stage and mode), written to `--json` if given."
    med = {m: {k: statistics.median(x[k] for x in v if k in x) for k in v[0]} for m, v in runs.items()}
    stages = [
        dict(name=n, model=model, **{f"{m}_s": med[m][k] for m in MODES})
        for k, (n, model) in STAGES.items()
        if all(k in med[m] for m in MODES)
    ]
    ratios = {  # tokens/s of the sampler over generate's: seconds per token of generate over the sampler's
        model: {m: med[m][f"{p}_generate_s"] / med[m][f"{p}_sampling_s"] for m in MODES}
        for model, p in (("tiny", "tiny"), ("smollm2", "smol"))
        if f"{p}_generate_s" in med["pinned"]
    }
    cpu = (
        x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("model n")
    )
    rec = dict(
        stages=stages,
        sampler_vs_generate=ratios,
        note="pinned_s: the pin (GEMMs in numpy's OpenBLAS, Haswell kernels: the default); old_pinned_s: the pin with "
        "STALEBOOK_GEMM=torch (MKL's COMPATIBLE GEMMs, the default before issue 54); native_s: STALEBOOK_NUMERICS="
        "native. Medians over rounds of one process per mode, modes alternating; sampling stages in seconds per "
        "token; point_* stages: a demo's points summed (one demo per mode); sampler_vs_generate: the sampler's "
        "tokens/s over HF generate's (greedy, same tokens) per mode.",
        rounds=rounds,
        threads=a.threads,
        demo_workers=a.workers if a.demo else None,
        cpu=next(cpu, ""),
        runs=runs,
    )
    if a.json:
        tmp = Path(a.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=2) + "\n")
        os.replace(tmp, a.json)
    return rec


if __name__ == "__main__":
    main()
