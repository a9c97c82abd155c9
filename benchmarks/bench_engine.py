"""CPU benchmark of Engine II on the tiny model: generation tokens/s (hf backend) and GRPO train-step time
with a breakdown.

Generation: `hf_sample` (HF `generate` + the domain-driven inverse-CDF sampler) on a realistic batch
(P prompts x K samples, default 8 x 8 = 64 rows, max_new_tokens 16), repeated; reported as completion
tokens/s (tokens up to and including EOS) and row-steps/s (B x generated length: what `generate`
computes). For scale, the same batch with plain `generate(do_sample=True)` (torch's global RNG).

Train step: the real `Trainer.train_step`, instrumented (not re-implemented) through its public seams: a data
source (`OnlineData` subclass) that times its hooks, sampling (`generate`), rewards (`score`: `batch_rewards`, on
the verifier thread) and the teacher-forced behaviour pass (`behaviour_logprobs`, no grad); torch's hooks for the
differentiable forward (the model's forward passes with gradients on), backward and the optimizer step; the policy
hash (once per step) timed on its own, apart from the steps. The rest is "other" (decoding, log-softmax, advantages,
loss, logging). Checkpoint writes are timed separately.

    PYTHONPATH=. python benchmarks/bench_engine.py [--config configs/tiny/train-math.yaml] [--steps 10] [--json PATH]
"""

import argparse
import atexit
import contextlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchargs import add_record, add_threads

import stalebook  # noqa: F401  (pins the CPU numerics before torch loads)

# isort: split
import torch

from stalebook.core import load_config
from stalebook.model import policy_hash
from stalebook.trainer import OnlineData, TrainConfig, Trainer

HERE = Path(__file__).resolve().parent


def bench_generation(model, tok, tasks, P, K, L, reps):
    from stalebook.core import Domain
    from stalebook.rollouts import SamplingConfig, group_uniforms, hf_sample

    sc = SamplingConfig(group_size=K, max_new_tokens=L, groups_per_batch=P)
    rows = []
    for rep in range(reps + 1):  # rep 0 = warm-up
        batch = tasks[rep * P : (rep + 1) * P]
        u = torch.cat([group_uniforms(Domain(0, ("bench", "gen", t.id)), K, L) for t in batch])
        t0 = time.perf_counter()
        _, comps, _ = hf_sample(model, tok, [t.prompt for t in batch for _ in range(K)], u, sc)
        dt = time.perf_counter() - t0
        if rep:
            rows.append((dt, sum(map(len, comps)), len(comps) * max(map(len, comps))))
    # plain HF sampling for comparison (global RNG; not used by the engine)
    plain = []
    enc = tok([t.prompt for t in tasks[:P] for _ in range(K)], return_tensors="pt", padding=True)
    model.eval()
    for rep in range(reps + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                **enc, do_sample=True, max_new_tokens=L, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
            )
        if rep:
            plain.append((time.perf_counter() - t0, (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]))
    t = sum(r[0] for r in rows)
    return dict(
        batch_rows=P * K,
        prompts=P,
        group_size=K,
        max_new_tokens=L,
        reps=reps,
        s_per_batch=statistics.median(r[0] for r in rows),
        completion_tokens_per_s=sum(r[1] for r in rows) / t,
        row_steps_per_s=sum(r[2] for r in rows) / t,
        mean_completion_len=sum(r[1] for r in rows) / (reps * P * K),
        plain_generate_row_steps_per_s=sum(r[1] for r in plain) / sum(r[0] for r in plain),
    )


class Timers:
    def __init__(self):
        self.t = {}

    @contextlib.contextmanager
    def __call__(self, k):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.t[k] = self.t.get(k, 0.0) + time.perf_counter() - t0


class TimedData(OnlineData):
    "The trainer's data (online RL), its hooks timed in `T`: sampling, rewards and the behaviour pass."

    def __init__(self, T: Timers):
        super().__init__()
        self.T = T

    def generate(self, tr, prompts, ph):
        with self.T("sampling"):
            return super().generate(tr, prompts, ph)

    def score(self, *a, **kw):  # the verifier, on the trainer's verifier thread (mostly hidden behind the passes)
        with self.T("rewards"):
            return super().score(*a, **kw)

    def behaviour_logprobs(self, tr, gen):
        with self.T("teacher-forced forward (no grad)"):
            return super().behaviour_logprobs(tr, gen)


def instrument(tr, T: Timers):
    """Time what the data source does not see: the model's forward passes with gradients on (torch forward hooks),
    backward (torch.Tensor.backward wrapped) and the optimizer step (its hooks); returns an undo function."""
    st = {}

    def since(key, start):
        T.t[key] = T.t.get(key, 0.0) + time.perf_counter() - st.pop(start)

    grad_on = lambda f: lambda *a: f() if torch.is_grad_enabled() else None
    hooks = [
        tr.model.register_forward_pre_hook(grad_on(lambda: st.__setitem__("fwd", time.perf_counter()))),
        tr.model.register_forward_hook(grad_on(lambda: since("forward (grad)", "fwd"))),
        tr.opt.register_step_pre_hook(lambda *a: st.__setitem__("opt", time.perf_counter())),
        tr.opt.register_step_post_hook(lambda *a: since("optimizer step", "opt")),
    ]
    back = torch.Tensor.backward

    def bw(self, *a, **kw):
        with T("backward"):
            return back(self, *a, **kw)

    torch.Tensor.backward = bw

    def undo():
        torch.Tensor.backward = back
        for h in hooks:
            h.remove()

    return undo


def time_policy_hash(model, reps: int = 5) -> float:
    "Median seconds of `policy_hash(model)` (train_step hashes the weights that sample once per step)."
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        policy_hash(model)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bench_train(cfg_path, steps, snapshot, domain=None):
    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    atexit.register(shutil.rmtree, tmp, True)  # the run's folder goes when the benchmark ends
    ov = dict(out=str(tmp / "run"), steps=steps + 1, lineage_steps=[0], checkpoint_every=10**6)
    if snapshot is not None:
        ov["snapshot"] = snapshot
    if domain:
        ov["domain"] = domain
    cfg = load_config(TrainConfig, cfg_path, overrides=ov)
    T = Timers()
    t0 = time.perf_counter()
    tr = Trainer(cfg, data=TimedData(T))
    t_init = time.perf_counter() - t0  # includes load + step-0 checkpoint
    tr.log.append(tr.train_step())  # warm-up
    T.t.clear()
    undo = instrument(tr, T)
    try:
        t0 = time.perf_counter()
        recs = []
        for _ in range(steps):
            recs.append(tr.train_step())
        total = time.perf_counter() - t0
    finally:
        undo()
    ck = []
    for _ in range(3):
        t0 = time.perf_counter()
        tr.checkpoint()
        ck.append(time.perf_counter() - t0)
    per = {k: v / steps for k, v in T.t.items()}
    per["policy hash"] = time_policy_hash(tr.model)
    per["other"] = total / steps - sum(per.values())
    return dict(
        config=str(cfg_path),
        domain=cfg.domain,
        prompts_per_step=cfg.prompts_per_step,
        group_size=cfg.sampling.group_size,
        max_new_tokens=cfg.sampling.max_new_tokens,
        steps=steps,
        s_per_step=total / steps,
        breakdown_s=per,
        tokens_per_step=sum(r["n_tokens"] for r in recs) / steps,
        reward_mean=sum(r["reward_mean"] for r in recs) / steps,
        checkpoint_s=statistics.median(ck),
        trainer_init_s=t_init,
        n_trainable=sum(p.numel() for p in tr.params),
        n_params=sum(p.numel() for p in tr.model.parameters()),
    )


def main(argv=None):
    p = argparse.ArgumentParser(description="Engine II CPU benchmark (tiny model)")
    p.add_argument("--config", default=str(HERE.parent / "configs" / "tiny" / "train-math.yaml"))
    p.add_argument("--snapshot", default=None, help='default: the config\'s ("" = embedded tiny)')
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--gen-reps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--code", action="store_true", help="also time a code-domain train step (sandboxed rewards)")
    add_record(p)
    add_threads(p)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    from stalebook.core import Domain
    from stalebook.rollouts import load_run_policy
    from stalebook.tasks import synthetic_tasks

    snap = a.snapshot
    model, tok = load_run_policy(snap or "", "", "cpu", "float32")
    res = {"torch_threads": torch.get_num_threads(), "torch": torch.__version__}
    for dom in ("math", "code"):
        tasks = synthetic_tasks(dom, a.prompts * (a.gen_reps + 1), Domain(0, ("bench", dom)))
        g = bench_generation(model, tok, tasks, a.prompts, a.group_size, a.max_new_tokens, a.gen_reps)
        res[f"generation_{dom}"] = g
        print(
            f"generation ({dom} prompts, {g['batch_rows']} rows = {a.prompts} x {a.group_size}, "
            f"max_new_tokens {a.max_new_tokens}): "
            f"{g['s_per_batch'] * 1e3:.0f} ms/batch, {g['completion_tokens_per_s']:.0f} completion tokens/s "
            f"(mean length {g['mean_completion_len']:.1f}), {g['row_steps_per_s']:.0f} row-steps/s; "
            f"plain generate(do_sample) {g['plain_generate_row_steps_per_s']:.0f} row-steps/s",
            flush=True,
        )
    del model
    runs = [("math", None)] + ([("code", "code")] if a.code else [])
    for name, dom in runs:
        cfgp = a.config if dom is None else str(Path(a.config).with_name("train-code.yaml"))
        t = bench_train(cfgp, a.steps, snap, None)
        res[f"train_{name}"] = t
        print(
            f"train step ({t['domain']}, {t['prompts_per_step']} prompts x {t['group_size']}, "
            f"max_new_tokens {t['max_new_tokens']}, "
            f"{t['tokens_per_step']:.0f} completion tokens/step, "
            f"{t['n_trainable']:,} LoRA of {t['n_params']:,} params): "
            f"{t['s_per_step'] * 1e3:.0f} ms/step over {t['steps']} steps"
        )
        for k, v in sorted(t["breakdown_s"].items(), key=lambda kv: -kv[1]):
            print(f"    {k:34s} {v * 1e3:8.1f} ms  ({100 * v / t['s_per_step']:4.1f} %)")
        print(f"    checkpoint write (every 5 steps)   {t['checkpoint_s'] * 1e3:8.1f} ms", flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
