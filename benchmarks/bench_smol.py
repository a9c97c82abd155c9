"""CPU benchmark on SmolLM2-135M-Instruct as imported (`make smol`), side by side in one run:

* generation: stalebook's sampler (`sample_batch` with the hf backend: chat-template prompts, left padding, the
  domain sampler, stop at <|im_end|>) against transformers' own greedy `model.generate` on the same rendered,
  left-padded prompts. The sampler runs at temperature 1e-4, where its float64 inverse-CDF draw is the argmax, so
  both produce the same tokens (checked); reported as completion tokens/s (stop token included).
* one GRPO step (`Trainer.train_step`: sample, rewards, behaviour log-probs, forward/backward, AdamW) with LoRA on
  the attention projections, P prompts x K, digit-match reward; its generation share is reported too.

    PYTHONPATH=. python benchmarks/bench_smol.py [--prompts 8] [--k 2] [--tokens 16] [--threads 2] [--reps 2]
"""

import argparse
import re
import tempfile
import time

import torch


def _digit_match(task, text):
    return float(task.answer in re.findall(r"-?\d+", text)), {}


def main(argv=None):
    from stalebook.core import Domain
    from stalebook.model import LoraSpec, left_pad, pad_token_id, smol_snapshot, split_at_stop, stop_token_ids
    from stalebook.rollouts import SamplingConfig, load_run_policy, make_sampler, prompt_token_ids, sample_batch
    from stalebook.tasks import Task
    from stalebook.trainer import TrainConfig, Trainer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    snap, system = smol_snapshot(), "You are a helpful assistant."
    lora = LoraSpec(r=8, target_modules="attention")
    model, tok = load_run_policy(str(snap), "", "cpu", "float32", lora=lora)
    model.eval()
    pairs = [(i % 10, (3 * i + 4) % 10) for i in range(a.prompts)]
    tasks = [
        Task(f"b{x}-{y}-{i}", "math", f"What is {x}+{y}? Answer with the number only.", str(x + y))
        for i, (x, y) in enumerate(pairs)
    ]
    stops, pad = stop_token_ids(tok, model.generation_config), pad_token_id(tok, model.generation_config)

    # generation: the sampler (near-greedy) vs model.generate (greedy), same prompts, same tokens
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
        f"SmolLM2-135M-Instruct (Q4_1 dequantized), float32 CPU, {a.threads} threads; {a.prompts} prompts, "
        f"<= {a.tokens} new tokens, {n} completion tokens, identical tokens: yes"
    )
    for k, v in times.items():
        print(f"  generation {k:18s} {n / min(v):7.1f} tokens/s  ({min(v):.2f} s)")
    print("  sample answer:", repr(gen.texts[0]))

    # one GRPO step
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
        tr = Trainer(cfg, model, tok, tasks=tasks, reward_fn=_digit_match)
        rec = tr.train_step()
    print(
        f"  GRPO step ({a.prompts} x K={a.k}, {rec['n_tokens']} tokens): {rec['t_step']:.2f} s "
        f"(generation {rec['t_gen']:.2f} s), loss {rec['loss']:.4f}, reward {rec['reward_mean']:.3f}"
    )


if __name__ == "__main__":
    main()
