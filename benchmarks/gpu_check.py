"""GPU check of the engine, one prepared script (about 1-3 min on one GPU with the tiny snapshot; at most 8 min is
the budget): on a snapshot (`--snapshot`, any locked one; default a reduced tiny build made here), it runs

  1. a GRPO step through the Trainer (hf backend) with the mismatch diagnostics on: step time, generation time,
     peak memory, and the step record's `mismatch/*` keys;
  2. a scoring pass: a rollout store, then the four estimators' features (one forward, four weighted backwards,
     CountSketch on the device) against one training forward+backward;
  3. generation with every backend (`hf`, `vllm` on a GPU; `hf`, `fake` in a dry run): tokens/s, peak memory and the
     training–inference mismatch of its log-probs against the trainer's recomputed ones (`trainer.mismatch_stats`);
  4. where vLLM is installed, a GRPO step that samples through vLLM (`backend: vllm`, `reproducible: seeded`).

A backend that cannot run here is skipped with its reason (printed and recorded), not an error. Writes
OUT/gpu_check.json; exit code 0 when no section failed.

    python benchmarks/gpu_check.py --out DIR [--snapshot PATH] [--dtype bfloat16]
    python benchmarks/gpu_check.py --out DIR --dry-run      # CPU: the hf and fake paths; vllm skipped, reason stated
"""

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
import torch  # isort: skip

RES = {"sections": {}, "errors": {}, "skipped": {}}


def log(*a):
    print(*a, flush=True)


def sync(dev):
    if str(dev).startswith("cuda"):
        torch.cuda.synchronize()


def peak_reset(dev):
    if str(dev).startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(dev):
    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if str(dev).startswith("cuda") else None


def section(name, fn, *a, **kw):
    "Run one section: time it, record its result or its error, never raise."
    log(f"--- {name}")
    t0 = time.time()
    try:
        out = fn(*a, **kw) or {}
        RES["sections"][name] = {**out, "wall_s": round(time.time() - t0, 2)}
        log(f"    ok ({time.time() - t0:.1f} s): " + json.dumps(out, default=str)[:2000])
        return out
    except Exception as e:
        RES["errors"][name] = f"{type(e).__name__}: {e}"
        log(f"    FAILED ({time.time() - t0:.1f} s): {type(e).__name__}: {e}")
        traceback.print_exc()
        return None


def env_info(dev):
    import transformers

    d = dict(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__)
    d.update(device=str(dev), cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        d.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    try:
        import vllm

        d["vllm"] = vllm.__version__
    except Exception as e:  # not installed, or broken: the vllm sections say why
        d["vllm"] = f"unavailable ({type(e).__name__})"
    return d


def snapshot(a, out):
    "The snapshot to check: --snapshot (verified), else a reduced tiny build under OUT."
    from stalebook.snapshot import read_lock, verify_snapshot

    if a.snapshot:
        bad = verify_snapshot(a.snapshot, self_test=False)
        if bad:
            raise RuntimeError(f"--snapshot {a.snapshot}: {bad[0]}")
        return dict(path=a.snapshot, revision=read_lock(a.snapshot)["revision"][:16])
    from stalebook.model import TinySpec, ensure_tiny_snapshot

    d = out / "tiny"
    lock = ensure_tiny_snapshot(d, TinySpec(max_steps=60, first_eval=10**9, require_band=False), log=lambda *x: None)
    return dict(path=str(d), revision=lock["revision"][:16], built="reduced tiny")


def digits(task, text):
    "A graded toy reward (share of digits): any snapshot's groups vary in it, so the step has a gradient."
    return (sum(c.isdigit() for c in text) / len(text) if text else 0.0), {}


def train_config(out, snap, a, backend="hf", steps=2):
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import TrainConfig

    rep = "seeded" if backend == "vllm" else "bitwise"
    return TrainConfig(
        out=str(out),
        snapshot=str(snap),
        n_tasks=64,
        steps=steps,
        prompts_per_step=a.P,
        sampling=SamplingConfig(
            group_size=a.K, max_new_tokens=a.L, groups_per_batch=a.P, backend=backend, reproducible=rep
        ),
        lr=3e-3,
        lineage_steps=(0,),
        device=a.device,
        dtype=a.dtype,
        mismatch_diagnostics=True,
    )


def grpo(cfg):
    "Trainer init + cfg.steps GRPO steps; per-step times, peak memory, the last record's mismatch diagnostics."
    from stalebook.trainer import Trainer

    dev = cfg.device
    peak_reset(dev)
    t0 = time.time()
    tr = Trainer(cfg, reward_fn=digits)
    sync(dev)
    init_s, steps = time.time() - t0, []
    while tr.step < cfg.steps:
        t0 = time.time()
        rec = tr.train_step()
        sync(dev)
        tr.log.append(rec)
        steps.append(dict(step_s=round(time.time() - t0, 4), t_gen=rec["t_gen"], tokens=rec["n_tokens"]))
    t0 = time.time()
    tr.checkpoint()
    mm = {k: v for k, v in rec.items() if k.startswith("mismatch/")}
    return tr, dict(
        init_s=round(init_s, 2),
        steps=steps,
        step_s=steps[-1]["step_s"],
        checkpoint_s=round(time.time() - t0, 3),
        peak_gib=peak_gib(dev),
        ratio_max_dev=rec["ratio_max_dev"],
        reward_mean=rec["reward_mean"],
        mismatch=mm,
    )


def scoring(model, tok, a, out):
    "A rollout store, then the four estimators' features vs one training forward+backward (best of 3)."
    from stalebook.core import Domain
    from stalebook.model import policy_hash
    from stalebook.rollouts import (
        SamplingConfig,
        completion_logprobs,
        generate_store,
        numerics_of,
        policy_store,
    )
    from stalebook.scoring import CountSketch, lora_dim, stale_features
    from stalebook.tasks import synthetic_tasks

    dev = a.device
    tasks = synthetic_tasks("math", a.P, Domain(0, ("gpu_check", "score")))
    sc = SamplingConfig(group_size=a.K, max_new_tokens=a.L, groups_per_batch=a.P)
    ph = policy_hash(model)
    st = policy_store(out / "stores", ph, 0, "score", sc, tasks, numerics_of(model))
    t0 = time.time()
    generate_store(model, tok, tasks, st, digits, progress=False)
    sync(dev)
    t_gen, recs = time.time() - t0, st.records
    pids = [r["prompt_ids"] for r in recs for _ in r["tokens"]]
    comps = [c for r in recs for c in r["tokens"]]
    sk = CountSketch(lora_dim(model), a.k_sketch, Domain(0, ("gpu_check", "sk")))

    def train_fb():
        lp, m = completion_logprobs(model, pids, comps, micro_batch=len(comps), pad_id=tok.pad_token_id)
        (lp * m).sum().backward()
        model.zero_grad(set_to_none=True)

    def best(fn, reps=3):
        fn()
        ts = []
        for _ in range(reps):
            sync(dev)
            t0 = time.time()
            fn()
            sync(dev)
            ts.append(time.time() - t0)
        return min(ts)

    peak_reset(dev)
    t_train = best(train_fb)
    t_score = best(lambda: stale_features(model, recs, sk, tok.pad_token_id, len(comps)))
    return dict(
        rollouts=len(comps),
        tokens=sum(map(len, comps)),
        generation_s=round(t_gen, 3),
        train_fwd_bwd_s=round(t_train, 4),
        score4_s=round(t_score, 4),
        score4_over_train=round(t_score / t_train, 2),
        peak_gib=peak_gib(dev),
    )


def generation(model, tok, a, backend, out):
    "Sampling with one backend: tokens/s (best of reps after a warm-up), peak memory, mismatch vs the trainer."
    from stalebook.core import Domain
    from stalebook.objectives import mismatch_stats
    from stalebook.rollouts import SamplingConfig, backend_problem, completion_logprobs, make_sampler, sample_batch
    from stalebook.tasks import synthetic_tasks

    why = backend_problem(backend, "seeded")
    if why:
        RES["skipped"][f"generation_{backend}"] = why
        log(f"    skipped: {why}")
        return dict(skipped=why)
    dev = a.device
    opts = {} if backend == "hf" else {"adapters": out / f"lora-{backend}"}
    if backend == "vllm":
        opts["dtype"] = a.dtype
    sampler = make_sampler(backend, model, tok, **opts)
    sampler.sync_weights(model)
    tasks = synthetic_tasks("math", a.P, Domain(0, ("gpu_check", "gen")))
    sc = SamplingConfig(
        group_size=a.K, max_new_tokens=a.L, groups_per_batch=a.P, backend=backend, reproducible="seeded"
    )
    dom = Domain(0, ("gpu_check", "gen", backend))
    sample_batch(sampler, tasks, dom, sc)  # warm-up (vLLM: engine start, LoRA load)
    peak_reset(dev)
    times, gen = [], None
    for _ in range(a.reps):
        sync(dev)
        t0 = time.time()
        gen = sample_batch(sampler, tasks, dom, sc)
        sync(dev)
        times.append(time.time() - t0)
    again = sample_batch(sampler, tasks, dom, sc)
    with torch.no_grad():
        tf, m = completion_logprobs(model, gen.prompt_ids, gen.completions, pad_id=tok.pad_token_id)
    ntok = sum(map(len, gen.completions))
    return dict(
        rows=len(gen.completions),
        completion_tokens=ntok,
        s_per_batch=round(min(times), 4),
        tokens_per_s=round(ntok / min(times), 1),
        peak_gib=peak_gib(dev),
        repeats_bitwise=again.completions == gen.completions,
        reproducible=sampler.reproducible,
        mismatch=mismatch_stats(tf, gen.sampler_logp, m),
    )


def main(argv=None):
    p = argparse.ArgumentParser(description="GPU check: a GRPO step, a scoring pass, generation with each backend")
    p.add_argument("--out", required=True)
    p.add_argument("--snapshot", default=None, help="a locked snapshot (default: build a reduced tiny one under --out)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--dry-run", action="store_true", help="CPU, float32, small batches, backends hf and fake")
    p.add_argument("--backends", nargs="+", default=None, help="default: hf vllm (GPU), hf fake vllm (dry run)")
    a = p.parse_args(argv)
    if a.dry_run:
        a.device, a.dtype = "cpu", "float32"
    a.P, a.K, a.L, a.reps, a.k_sketch = (4, 4, 8, 1, 256) if a.dry_run else (16, 16, 64, 3, 8192)
    backends = a.backends or (["hf", "fake", "vllm"] if a.dry_run else ["hf", "vllm"])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    T0 = time.time()
    RES["args"] = {k: v for k, v in vars(a).items()}
    section("env", env_info, a.device)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        RES["errors"]["env"] = "CUDA not available (use --dry-run on a CPU machine)"
        return finish(out, T0)
    snap = section("snapshot", snapshot, a, out)
    if snap is None:
        return finish(out, T0)
    tr_box = {}

    def grpo_hf():
        tr_box["tr"], info = grpo(train_config(out / "grpo-hf", snap["path"], a))
        return info

    section("grpo_hf", grpo_hf)
    tr = tr_box.get("tr")
    if tr is not None:
        section("scoring", scoring, tr.model, tr.tok, a, out)
        for b in backends:
            section(f"generation_{b}", generation, tr.model, tr.tok, a, b, out)
    if "vllm" in backends:
        from stalebook.rollouts import backend_problem

        why = backend_problem("vllm", "seeded")
        if why:
            RES["skipped"]["grpo_vllm"] = why
            log(f"--- grpo_vllm\n    skipped: {why}")
        else:
            section("grpo_vllm", lambda: grpo(train_config(out / "grpo-vllm", snap["path"], a, "vllm"))[1])
    return finish(out, T0)


def finish(out, T0):
    RES["total_s"] = round(time.time() - T0, 1)
    RES["ok"] = not RES["errors"]
    (out / "gpu_check.json").write_text(json.dumps(RES, indent=1, default=str) + "\n")
    skipped = "".join(f"; skipped {k}: {v}" for k, v in RES["skipped"].items())
    log(
        f"=== gpu_check {'OK' if RES['ok'] else 'with errors: ' + ', '.join(RES['errors'])} in {RES['total_s']} s "
        f"-> {out / 'gpu_check.json'}{skipped}"
    )
    return 0 if RES["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
