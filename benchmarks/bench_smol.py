"""CPU benchmark on SmolLM2-135M-Instruct as imported (`make smol`), side by side in one run:

* generation: stalebook's sampler (`sample_batch` with the hf backend: chat-template prompts, left padding, the
  domain sampler, stop at <|im_end|>) against transformers' own greedy `model.generate` on the same rendered,
  left-padded prompts. The sampler runs at temperature 1e-4, where its float64 inverse-CDF draw is the argmax, so
  both produce the same tokens (checked); reported as completion tokens/s (stop token included).
* one GRPO step (`Trainer.train_step`: sample, rewards, behaviour log-probs, forward/backward, AdamW) with LoRA on
  the attention projections, P prompts x K, digit-match reward; its generation share is reported too.
* the scoring overhead (issue 30 item 6): on G groups x K rollouts sampled by the trainer (LoRA on the attention
  projections, digit-match reward) and then one GRPO step taken (so the policy that scores is not the one that
  sampled, as for a stale store), side by side: one scoring pass of the four estimators
  (`scoring.stale_features`: one forward, four weighted backwards with per-rollout LoRA gradients read by hooks,
  CountSketch to k) against one training forward+backward on the same rollouts (`Trainer.objective`: the GRPO loss
  and its backward, no optimizer step); the fresh score vectors (`scoring.fresh_features`) too. Each timed
  `--score-reps` times after a warm-up, interleaved; medians and the ratio scoring / train fwd+bwd, in wall time
  and in process CPU time (the machine may be shared: CPU time is what contention does not stretch).

Numbers go to results/records/bench_smol.json (`--json ''`: none).

    PYTHONPATH=. python benchmarks/bench_smol.py [--prompts 8] [--k 2] [--tokens 16] [--threads 2] [--reps 2]
        [--groups 8] [--score-k 4] [--score-tokens 32] [--sketch 1024] [--score-reps 3] [--json PATH]
"""

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

from benchargs import add_record, add_reps, add_threads

import stalebook  # noqa: F401  (pins the CPU numerics before torch loads)
from stalebook.core import atomic_write

RESULTS = Path(__file__).resolve().parents[1] / "results" / "records" / "bench_smol.json"


def _digit_match(task, text):
    return float(task.answer in re.findall(r"-?\d+", text)), {}


def _tasks(n: int, prefix: str):
    pairs = [(i % 10, (3 * i + 4) % 10) for i in range(n)]
    return [_task(f"{prefix}{x}-{y}-{i}", x, y) for i, (x, y) in enumerate(pairs)]


def _task(tid, x, y):
    from stalebook.tasks import Task

    return Task(tid, "math", f"What is {x}+{y}? Answer with the number only.", str(x + y))


def generation_vs_generate(a, model, tok, system) -> dict:
    "The sampler (near-greedy) vs model.generate (greedy): same prompts, same tokens, tokens/s of each."
    import torch

    from stalebook.core import Domain
    from stalebook.model import left_pad, pad_token_id, split_at_stop, stop_token_ids
    from stalebook.rollouts import SamplingConfig, make_sampler, prompt_token_ids, sample_batch

    tasks = _tasks(a.prompts, "b")
    stops, pad = stop_token_ids(tok, model.generation_config), pad_token_id(tok, model.generation_config)
    sc = SamplingConfig(
        group_size=1, max_new_tokens=a.tokens, groups_per_batch=a.prompts, temperature=1e-4, system_prompt=system
    )
    sampler = make_sampler("hf", model, tok)
    ids, att, _ = left_pad(prompt_token_ids(tok, [t.prompt for t in tasks], sc), pad)
    times = {"stalebook sampler": [], "model.generate": []}
    for rep in range(a.reps + 1):  # rep 0: warm-up
        t0 = time.perf_counter()
        gen = sample_batch(sampler, tasks, Domain(0, ("bench", "smol", rep)), sc)
        t1 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=att,
                do_sample=False,
                max_new_tokens=a.tokens,
                eos_token_id=list(stops),
                pad_token_id=pad,
                temperature=None,
                top_p=None,
                top_k=None,
            )
        t2 = time.perf_counter()
        ref = []
        for r in out[:, ids.shape[1] :].tolist():
            body, stopped = split_at_stop(r, stops)
            ref.append(body + [r[len(body)]] if stopped else body)
        assert gen.completions == ref, "the sampler and model.generate produced different tokens"
        if rep:
            times["stalebook sampler"].append(t1 - t0)
            times["model.generate"].append(t2 - t1)
    n = sum(map(len, gen.completions))
    print(
        f"SmolLM2-135M-Instruct (Q4_1 GGUF dequantized, not the original weights), float32 CPU, {a.threads} threads; "
        f"{a.prompts} prompts, <= {a.tokens} new tokens, {n} completion tokens, identical tokens: yes"
    )
    for k, v in times.items():
        print(f"  generation {k:18s} {n / min(v):7.1f} tokens/s  ({min(v):.2f} s)")
    print("  sample answer:", repr(gen.texts[0]))
    return {
        "prompts": a.prompts,
        "max_new_tokens": a.tokens,
        "completion_tokens": n,
        "identical_tokens": True,
        "best_of_reps": a.reps,
        **{k.replace(" ", "_").replace(".", "_") + "_tokens_per_s": round(n / min(v), 2) for k, v in times.items()},
        **{k.replace(" ", "_").replace(".", "_") + "_s": round(min(v), 4) for k, v in times.items()},
    }


def grpo_step(a, snap, model, tok, system, lora) -> dict:
    "One `Trainer.train_step`: sample, rewards, behaviour log-probs, forward/backward, AdamW."
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import TrainConfig, Trainer

    with tempfile.TemporaryDirectory() as d:
        cfg = TrainConfig(
            out=d,
            snapshot=str(snap),
            steps=1,
            lineage_steps=(0,),
            prompts_per_step=a.prompts,
            sampling=SamplingConfig(
                group_size=a.k, max_new_tokens=a.tokens, groups_per_batch=a.prompts, system_prompt=system
            ),
            lora=lora,
            threads=a.threads,
            micro_batch=a.prompts * a.k,
        )
        tr = Trainer(cfg, model, tok, tasks=_tasks(a.prompts, "b"), reward_fn=_digit_match)
        rec = tr.train_step()
    print(
        f"  GRPO step ({a.prompts} x K={a.k}, {rec['n_tokens']} tokens): {rec['t_step']:.2f} s "
        f"(generation {rec['t_gen']:.2f} s), loss {rec['loss']:.4f}, reward {rec['reward_mean']:.3f}"
    )
    keep = ("n_tokens", "t_step", "t_gen", "loss", "reward_mean")
    return {"prompts": a.prompts, "group_size": a.k, "max_new_tokens": a.tokens, **{k: rec[k] for k in keep}}


def scoring_overhead(a, snap, system, lora) -> dict:
    """One scoring pass of the four estimators (and of the fresh score vectors) vs one training forward+backward
    (`Trainer.objective`) on the same G x K rollouts, interleaved, `a.score_reps` times after a warm-up."""
    import numpy as np

    from stalebook.core import Domain
    from stalebook.objectives import backprop, objective_of, resolved
    from stalebook.rollouts import SamplingConfig, load_run_policy
    from stalebook.scoring import CountSketch, fresh_features, lora_dim, stale_features
    from stalebook.theory.estimators import ESTIMATORS
    from stalebook.trainer import TrainConfig, Trainer

    G, K, B = a.groups, a.score_k, a.groups * a.score_k
    model, tok = load_run_policy(str(snap), "", "cpu", "float32", lora=lora)
    tasks = [_task(f"s{i}", (7 * i + 3) % 50, (11 * i + 5) % 50) for i in range(G)]
    sc = SamplingConfig(group_size=K, max_new_tokens=a.score_tokens, groups_per_batch=G, system_prompt=system)
    with tempfile.TemporaryDirectory() as d:
        cfg = TrainConfig(
            out=d,
            snapshot=str(snap),
            steps=1,
            lineage_steps=(0,),
            prompts_per_step=G,
            sampling=sc,
            lora=lora,
            lr=1e-3,
            threads=a.threads,
            micro_batch=B,  # one micro-batch, as the scoring pass (rows_per_batch = B)
        )
        tr = Trainer(cfg, model, tok, tasks=tasks, reward_fn=_digit_match)
        b = tr.data.batch(tr, tr.step)
        b.R = resolved(b.R)
        gen, R, old, mask = b.gen, b.R, b.old, b.mask
        tr.learn(b)  # one step: the policy that scores is not the one that sampled
        records = [  # the store records of these groups (`scoring.store_rows` reads them)
            {
                "prompt_ids": gen.prompt_ids[g * K],
                "tokens": gen.completions[g * K : (g + 1) * K],
                "logp": [old[i, mask[i]].tolist() for i in range(g * K, (g + 1) * K)],
                "rewards": R[g].tolist(),
            }
            for g in range(G)
        ]
        sketch = CountSketch(lora_dim(model), a.sketch, Domain(0, ("bench", "smol", "sketch")))
        pad = tok.pad_token_id

        def train_fwd_bwd():
            tr.opt.zero_grad(set_to_none=True)
            grpo = objective_of("grpo")(model, tok.pad_token_id, b, tr.cfg, 1, tr.step)  # lag 1: no ratio check
            loss, _, _ = backprop(grpo)  # GRPO's losses and their backward
            assert all(p.grad is not None for p in tr.params)
            tr.opt.zero_grad(set_to_none=True)
            return float(loss)

        def score4():
            model.eval()
            return stale_features(model, records, sketch, pad, B, ESTIMATORS)

        def fresh():
            model.eval()
            return fresh_features(model, records, sketch, pad, B)

        parts = {"train_fwd_bwd": train_fwd_bwd, "score_four_estimators": score4, "fresh_score_vectors": fresh}
        times, cpu = {k: [] for k in parts}, {k: [] for k in parts}
        for rep in range(a.score_reps + 1):  # rep 0: warm-up
            for k, fn in parts.items():
                t0, c0 = time.perf_counter(), time.process_time()
                out = fn()
                if rep:
                    times[k].append(time.perf_counter() - t0)
                    cpu[k].append(time.process_time() - c0)
                if k == "score_four_estimators":
                    feats, _, gap = out
                    assert set(feats) == set(ESTIMATORS) and all(np.isfinite(f).all() for f in feats.values())
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    n_prompt, n_comp = sum(map(len, gen.prompt_ids)), int(mask.sum())
    ratio4 = med["score_four_estimators"] / med["train_fwd_bwd"]
    ratio1 = med["fresh_score_vectors"] / med["train_fwd_bwd"]
    ratio4_cpu = med_cpu["score_four_estimators"] / med_cpu["train_fwd_bwd"]
    print(
        f"  scoring overhead: {G} groups x K={K} = {B} rollouts, {n_comp} completion tokens (+{n_prompt} prompt), "
        f"LoRA D={lora_dim(model):,}, sketch k={a.sketch}, {a.threads} thread(s), median of {a.score_reps}:\n"
        f"    four estimators (1 fwd + 4 bwd) {med['score_four_estimators']:.2f} s / train fwd+bwd "
        f"{med['train_fwd_bwd']:.2f} s = {ratio4:.2f}x; fresh vectors (1 fwd + 1 bwd) "
        f"{med['fresh_score_vectors']:.2f} s = {ratio1:.2f}x; max |log pi - log beta| {gap:.3f}\n"
        f"    in process CPU time: four estimators {med_cpu['score_four_estimators']:.2f} s / train fwd+bwd "
        f"{med_cpu['train_fwd_bwd']:.2f} s = {ratio4_cpu:.2f}x"
    )
    return {
        "groups": G,
        "group_size": K,
        "rollouts": B,
        "max_new_tokens": a.score_tokens,
        "completion_tokens": n_comp,
        "prompt_tokens": n_prompt,
        "reward_mean": float(R.mean()),
        "lora": {"r": lora.r, "target_modules": lora.target_modules},
        "lora_dim": lora_dim(model),
        "sketch_k": a.sketch,
        "micro_batch": B,
        "reps": a.score_reps,
        "seconds": {k: [round(t, 4) for t in v] for k, v in times.items()},
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "cpu_seconds": {k: [round(t, 4) for t in v] for k, v in cpu.items()},
        "median_cpu_s": {k: round(v, 4) for k, v in med_cpu.items()},
        "ratio_four_estimators_over_train": round(ratio4, 3),
        "ratio_fresh_over_train": round(ratio1, 3),
        "ratio_four_estimators_over_train_cpu": round(ratio4_cpu, 3),
        "max_abs_logratio": gap,
        "train": "Trainer.objective: GRPO clipped loss over the B rows + backward into the LoRA tensors "
        "(no optimizer step)",
        "scoring": "scoring.stale_features (g00, g10, g01, g11) at the policy after one GRPO step, store sampled "
        "before it; scoring.fresh_features on the same rows",
    }


def main(argv=None):
    from stalebook.core import environment
    from stalebook.model import LoraSpec, compute_setup, numerics_state
    from stalebook.pretrained import smol_snapshot
    from stalebook.rollouts import load_run_policy
    from stalebook.snapshot import read_lock

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    add_threads(ap, 2)
    add_reps(ap, 2)
    ap.add_argument("--groups", type=int, default=8, help="scoring overhead: groups G")
    ap.add_argument("--score-k", type=int, default=4, help="scoring overhead: rollouts per group K")
    ap.add_argument("--score-tokens", type=int, default=32, help="scoring overhead: max new tokens per rollout")
    ap.add_argument("--sketch", type=int, default=1024, help="scoring overhead: CountSketch dimension k")
    ap.add_argument("--score-reps", type=int, default=3, help="scoring overhead: timed repeats (median)")
    add_record(ap, "bench_smol")
    a = ap.parse_args(argv)
    for name in ("prompts", "k", "tokens", "threads", "reps", "groups", "score_k", "score_tokens", "sketch"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.score_reps < 3:
        ap.error(f"--score-reps must be >= 3 (a median of repeats), got {a.score_reps}")
    compute_setup(a.threads)
    snap, system = smol_snapshot(), "You are a helpful assistant."
    lora = LoraSpec(r=8, target_modules="attention")
    t0 = time.perf_counter()
    model, tok = load_run_policy(str(snap), "", "cpu", "float32", lora=lora)
    model.eval()
    res = {
        "model": "SmolLM2-135M-Instruct as imported: a Q4_1 GGUF dequantized to float32, not the original weights",
        "snapshot": {"name": snap.name, "revision": read_lock(snap)["revision"]},
        "threads": a.threads,
        "system_prompt": system,
        "generation": generation_vs_generate(a, model, tok, system),
        "grpo_step": grpo_step(a, snap, model, tok, system, lora),
    }
    res["scoring_overhead"] = scoring_overhead(a, snap, system, lora)
    res.update(wall_s=round(time.perf_counter() - t0, 1), numerics=numerics_state(), environment=environment())
    if a.json:
        atomic_write(Path(a.json), json.dumps(res, indent=1) + "\n")
        print(f"  wrote {a.json}")


if __name__ == "__main__":
    main()
