"""What pinning the CPU numerics costs (issue: Reproducible on every machine), measured side by side in one run.

Every stalebook process pins torch/MKL/oneDNN to the AVX2 kernels and MKL's COMPATIBLE reproducibility branch
(`stalebook.core.pin_numerics`); `STALEBOOK_NUMERICS=native` runs the machine's own kernels. The mode is fixed at
process start, so each measurement runs in its own process, pinned and native alternating (ABAB...) to spread the
machine's noise over both. Measured per process, after a warm-up:
  * a GRPO step of the tiny model (`Trainer.train_step`, configs/tiny/train-math.yaml: 16 prompts x 16 samples)
  * a scoring pass (all four estimators' features of 64 stored rollouts, `stale_features`)
and the ratios pinned / native of the medians over rounds.

With `--gemm` (issue 54) a third process per round runs the pinned numerics with the float32 GEMMs routed through
numpy's OpenBLAS (`STALEBOOK_GEMM=openblas`, `stalebook.gemm`), and every process also measures (medians over
`--reps` after a warm-up):
  * tiny sampling: tokens/s of stalebook's sampler (`hf_sample`) on the shipped tiny model, 64 rows x 16 tokens
and, with `--smol` too, on a SmolLM2-135M-shaped Llama (SmolLM2's config, random weights: hidden 576, MLP 1536,
30 layers, 9/3 heads, vocabulary 49152, tied embeddings) with a rank-8 LoRA on q, k, v, o (`attach_lora`), on
`--threads` torch threads:
  * smol_fwd_bwd: forward and backward of 8 x 64 tokens (cross-entropy; LoRA gradients, input gradients through
    every layer: scoring's and a GRPO step's pass)
  * smol_sampling: tokens/s of HF `generate` (greedy, KV cache), 8 rows x 16 prompt tokens, 32 new tokens
The record (`--json`): {"stages": [{"name", "model", "pinned_s", "native_s", "old_pinned_s"}], "runs", ...}, where
`pinned_s` is the routed path, `old_pinned_s` the pin with MKL's COMPATIBLE GEMMs (seconds; sampling stages in
seconds per token).

    .venv/bin/python benchmarks/bench_pinning.py [--rounds 2] [--steps 3] [--json PATH]
    .venv/bin/python benchmarks/bench_pinning.py --gemm --smol --rounds 3 --json results/records/bench_pinning.json
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
from pathlib import Path

import stalebook  # noqa: F401  (first: pins the numerics, or not, before bench_engine loads torch)

HERE = Path(__file__).resolve().parent
PATH = os.pathsep.join([str(HERE), str(Path(stalebook.__file__).resolve().parents[1])])  # workers: this stalebook


def _median_time(f, reps: int) -> float:
    "Median seconds of `reps` calls of `f` after one warm-up call."
    import time

    f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def tiny_sampling(snap, reps: int) -> float:
    "Seconds per sampled token of `hf_sample` on the tiny model: 64 rows (8 prompts x 8) of up to 16 tokens."
    from stalebook.core import Domain
    from stalebook.model import load_policy
    from stalebook.rollouts import SamplingConfig, group_uniforms, hf_sample

    model, tok = load_policy(snap)
    prompts = [f"{a}+{b}=" for a, b in zip(range(3, 40, 5), range(7, 30, 3))]
    u = torch_cat([group_uniforms(Domain(0, ("bench", p)), 8, 16) for p in prompts])
    rows = [p for p in prompts for _ in range(8)]
    counted = []

    def run():
        _, comps, _ = hf_sample(model, tok, rows, u, SamplingConfig(max_new_tokens=16))
        counted.append(sum(len(c) for c in comps))

    return _median_time(run, reps) / max(1, counted[-1])


def torch_cat(xs):
    import torch

    return torch.cat(xs)


def smol_model(threads: int):
    "A SmolLM2-135M-shaped Llama with random weights and a fresh rank-8 LoRA (q, k, v, o)."
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from stalebook.core import Domain
    from stalebook.model import LoraSpec, attach_lora

    torch.set_num_threads(threads)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return attach_lora(LlamaForCausalLM(cfg), LoraSpec(), Domain(0, ("bench", "lora")))


def smol_stages(threads: int, reps: int) -> dict:
    "Seconds of a forward and backward of 8 x 64 tokens, and seconds per token of greedy sampling, SmolLM2-shaped."
    import torch

    model = smol_model(threads)
    ids = torch.randint(3, 49152, (8, 64), generator=torch.Generator().manual_seed(1))

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        logits = model(ids).logits
        torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        ).backward()

    fb = _median_time(fwd_bwd, reps)
    prompt = ids[:, :16]

    def sample():
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0)

    return dict(smol_fwd_bwd_s=fb, smol_sampling_s=_median_time(sample, reps) / (8 * 32))


def worker(steps: int, extra: bool = False, smol: bool = False, threads: int = 1, reps: int = 2) -> dict:
    "One process: its numerics, seconds per GRPO step and per scoring pass (and, `extra`, the sampling/SmolLM2 stages)."
    import tempfile
    import time

    from bench_scoring import bench_scoring

    from stalebook.core import load_config
    from stalebook.model import default_snapshot, numerics_state
    from stalebook.trainer import TrainConfig, Trainer

    snap = str(default_snapshot())
    tmp = Path(tempfile.mkdtemp(prefix="bench-pinning-"))
    atexit.register(shutil.rmtree, tmp, True)  # the run's folder goes when the worker ends
    out = tmp / "run"
    ov = dict(out=str(out), snapshot=snap, steps=steps + 1, lineage_steps=[0], checkpoint_every=10**6)
    tr = Trainer(load_config(TrainConfig, HERE.parent / "configs" / "tiny" / "train-math.yaml", overrides=ov))
    tr.log.append(tr.train_step())  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        tr.log.append(tr.train_step())
    step_s = (time.perf_counter() - t0) / steps
    sc = bench_scoring(snap, 64)
    rec = dict(numerics=numerics_state(), grpo_step_s=step_s, scoring_s=sc["score4_s"])
    if extra:
        rec["tiny_sampling_s"] = tiny_sampling(snap, reps)
    if smol:
        rec |= smol_stages(threads, reps)
    return rec


STAGES = {  # record key: (stage name, model)
    "grpo_step_s": ("grpo_step", "tiny"),
    "scoring_s": ("scoring", "tiny"),
    "tiny_sampling_s": ("sampling_per_token", "tiny"),
    "smol_fwd_bwd_s": ("forward_backward_8x64", "smollm2"),
    "smol_sampling_s": ("sampling_per_token", "smollm2"),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--gemm", action="store_true", help="also the pinned numerics with STALEBOOK_GEMM=openblas")
    ap.add_argument("--smol", action="store_true", help="also the SmolLM2-shaped stages (with --gemm)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the SmolLM2-shaped stages")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions of the sampling/SmolLM2 stages")
    ap.add_argument("--from-log", default="", help="with --gemm: the record of the rounds a stopped run printed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.from_log:
        runs = runs_from_log(Path(a.from_log).read_text())
        rounds = min(len(v) for v in runs.values())
        rec = gemm_record({m: v[:rounds] for m, v in runs.items()}, a, rounds)
        print(json.dumps(rec["stages"], indent=1))
        return
    if a.worker:
        print(json.dumps(worker(a.steps, a.gemm, a.smol, a.threads, a.reps)))
        return
    modes = ("pinned", "native", "openblas") if a.gemm else ("pinned", "native")
    runs = {m: [] for m in modes}
    flags = [*(["--gemm"] if a.gemm else []), *(["--smol"] if a.smol else [])]
    flags += ["--threads", str(a.threads), "--reps", str(a.reps)]
    for r in range(a.rounds):
        for mode in modes:
            env = {
                **os.environ,
                "STALEBOOK_NUMERICS": "pinned" if mode == "openblas" else mode,
                "PYTHONPATH": PATH,
            }
            for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "STALEBOOK_GEMM"):
                env.pop(k, None)
            if mode == "openblas":
                env["STALEBOOK_GEMM"] = "openblas"
            out = subprocess.run(
                [sys.executable, __file__, "--worker", "--steps", str(a.steps), *flags],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            if rec["numerics"].get("gemm", "torch") != ("openblas" if mode == "openblas" else "torch"):
                raise SystemExit(f"bench_pinning: the {mode} worker computed with GEMM {rec['numerics'].get('gemm')}")
            runs[mode].append(rec)
            more = "".join(f", {k} {rec[k]:.4g}" for k in STAGES if k in rec and k not in ("grpo_step_s", "scoring_s"))
            print(
                f"round {r} {mode:8s} ({rec['numerics']['aten']}, MKL {rec['numerics']['mkl_cbwr']}, "
                f"GEMM {rec['numerics'].get('gemm', 'torch')}): "
                f"GRPO step {rec['grpo_step_s']:.3f} s, scoring pass {rec['scoring_s']:.3f} s{more}",
                flush=True,
            )
        if a.gemm:  # the record so far: a long run that is stopped keeps its complete rounds
            gemm_record(runs, a, r + 1)
    keys = [k for k in STAGES if k in runs["pinned"][0]]
    med = {m: {k: statistics.median(x[k] for x in v) for k in keys} for m, v in runs.items()}
    ratio = {k: med["pinned"][k] / med["native"][k] for k in med["pinned"]}
    print(
        f"pinned / native: GRPO step {ratio['grpo_step_s']:.2f}x, scoring pass {ratio['scoring_s']:.2f}x "
        f"(medians over {a.rounds} rounds)"
    )
    if not a.gemm:
        if a.json:
            Path(a.json).write_text(json.dumps(dict(runs=runs, median=med, ratio=ratio), indent=2))
        return
    stages = gemm_record(runs, a, a.rounds)["stages"]
    for st in stages:
        print(
            f"{st['model']:8s} {st['name']:22s} routed/native {st['pinned_s'] / st['native_s']:.2f}x, "
            f"old pin/routed {st['old_pinned_s'] / st['pinned_s']:.2f}x, old pin/native "
            f"{st['old_pinned_s'] / st['native_s']:.2f}x"
        )


def runs_from_log(text: str) -> dict:
    "{mode: [stage values of one process]} from the lines `round <r> <mode> (...): ...` that a run printed."
    runs = {}
    for line in text.splitlines():
        m = re.match(r"round \d+ (\w+) +\(.*?\): GRPO step ([\d.e-]+) s, scoring pass ([\d.e-]+) s(.*)$", line)
        if m:
            rec = dict(grpo_step_s=float(m[2]), scoring_s=float(m[3]))
            rec |= {k: float(v) for k, v in re.findall(r", (\w+) ([\d.e+-]+)", m[4])}
            runs.setdefault(m[1], []).append(rec)
    return runs


def gemm_record(runs: dict, a, rounds: int) -> dict:
    "The `--gemm` record of the rounds so far (medians per stage and mode), written to `--json` if given."
    keys = [k for k in STAGES if k in runs["pinned"][0]]
    med = {m: {k: statistics.median(x[k] for x in v) for k in keys} for m, v in runs.items()}
    stages = [
        dict(
            name=STAGES[k][0],
            model=STAGES[k][1],
            pinned_s=med["openblas"][k],
            native_s=med["native"][k],
            old_pinned_s=med["pinned"][k],
        )
        for k in keys
    ]
    cpu = (
        x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("model n")
    )
    rec = dict(
        stages=stages,
        note="pinned_s: the pin with STALEBOOK_GEMM=openblas (numpy's OpenBLAS, Haswell kernels); old_pinned_s: "
        "the pin with MKL's COMPATIBLE GEMMs (today's default); native_s: STALEBOOK_NUMERICS=native. Medians "
        "over rounds of one process per mode, modes alternating; sampling stages in seconds per token.",
        rounds=rounds,
        smol_threads=a.threads,
        cpu=next(cpu, ""),
        runs=runs,
    )
    if a.json:
        Path(a.json).write_text(json.dumps(rec, indent=2) + "\n")
    return rec


if __name__ == "__main__":
    main()
