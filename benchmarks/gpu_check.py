"""GPU check of Engine II (hf backend): one GRPO step and one generation on CUDA, float32 and bfloat16;
CPU/CUDA policy-hash and log-prob agreement for the same adapter; and a ~1B-parameter random Llama
snapshot (bf16, same character tokenizer) run through exactly the same code path (`load_policy` via the
Trainer, one GRPO step, one generation) — the "7B snapshot on a GPU without code changes" claim at a
smaller scale. Prints times and peak memory; writes `DIR/gpu_check.json`. Never part of CI.

    PYTHONPATH=. python3 benchmarks/gpu_check.py --out DIR [--snapshot runs/snapshots/tiny]
    PYTHONPATH=. python3 benchmarks/gpu_check.py --out /tmp/gc --device cpu --small      # CPU dry run of the code path

Needs torch, transformers, peft, safetensors, tokenizers, numpy, pyyaml, tqdm (the last two come with
transformers). It does not use papermill, fastcore or filelock. Without `--snapshot` it builds the tiny
snapshot (the full SFT warm start, ~2 min on one core; `--small` builds a reduced one in seconds).
Every section is guarded: a failure is recorded in the JSON (and printed) and the next section runs.
"""

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

RES = {"sections": {}, "errors": {}}


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


def section(name):
    "Decorator: run, time, record the result or the error, never raise."

    def deco(fn):
        def run(*a, **kw):
            log(f"--- {name}")
            t0 = time.time()
            try:
                out = fn(*a, **kw)
                RES["sections"][name] = {**(out or {}), "wall_s": round(time.time() - t0, 2)}
                log(f"    ok ({time.time() - t0:.1f} s): " + json.dumps(out, default=str)[:1500])
                return out
            except Exception as e:
                RES["errors"][name] = f"{type(e).__name__}: {e}"
                log(f"    FAILED ({time.time() - t0:.1f} s): {type(e).__name__}: {e}")
                traceback.print_exc()
                return None

        return run

    return deco


def env_info(dev):
    import numpy
    import peft
    import safetensors
    import tokenizers
    import transformers

    d = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        peft=peft.__version__,
        numpy=numpy.__version__,
        safetensors=safetensors.__version__,
        tokenizers=tokenizers.__version__,
        device=str(dev),
        cuda_available=torch.cuda.is_available(),
        cpu_threads=torch.get_num_threads(),
    )
    if torch.cuda.is_available():
        d.update(
            cuda=torch.version.cuda,
            gpu=torch.cuda.get_device_name(0),
            gpu_mem_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
        )
    return d


def train_cfg(out, snap, dev, dtype, steps, K=8, P=8, L=8, lineage=None):
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import TrainConfig

    return TrainConfig(
        out=str(out),
        snapshot=str(snap),
        domain="math",
        n_tasks=64,
        steps=steps,
        prompts_per_step=P,
        sampling=SamplingConfig(group_size=K, max_new_tokens=L, groups_per_batch=P),
        lr=3e-3,
        lineage_steps=tuple(lineage or (0, steps)),
        checkpoint_every=5,
        device=dev,
        dtype=dtype,
    )


def grpo_steps(cfg, reward_fn=None):
    "Trainer init (loads the snapshot through load_run_policy) + cfg.steps GRPO steps; per-step times."
    from stalebook.trainer import Trainer

    dev = cfg.device
    peak_reset(dev)
    t0 = time.time()
    tr = Trainer(cfg, reward_fn=reward_fn)
    sync(dev)
    t_init = time.time() - t0
    steps = []
    for _ in range(cfg.steps):
        t0 = time.time()
        rec = tr.train_step()
        sync(dev)
        tr.log.append(rec)
        steps.append(
            dict(
                wall_s=round(time.time() - t0, 4),
                t_gen=rec["t_gen"],
                reward=rec["reward_mean"],
                zero_adv=rec["zero_adv_groups"],
                ratio_max_dev=rec["ratio_max_dev"],
                grad_norm=round(rec["grad_norm"], 6),
                n_tokens=rec["n_tokens"],
            )
        )
    t0 = time.time()
    tr._checkpoint()
    sync(dev)
    t_ck = time.time() - t0
    return tr, dict(
        init_s=round(t_init, 2),
        steps=steps,
        checkpoint_s=round(t_ck, 3),
        peak_gib=peak_gib(dev),
        param_dtype=str(next(tr.model.parameters()).dtype),
        lora_dtype=str(next(p for n, p in tr.model.named_parameters() if "lora_A" in n).dtype),
        n_params=sum(p.numel() for p in tr.model.parameters()),
        n_trainable=sum(p.numel() for p in tr.params),
    )


def generation(model, tok, dev, P=8, K=8, L=16, reps=3):
    "hf_sample on P x K rows (domain sampler), median of `reps` after one warm-up."
    from stalebook.core import Domain
    from stalebook.rollouts import SamplingConfig, group_uniforms, hf_sample
    from stalebook.tasks import synthetic_tasks

    tasks = synthetic_tasks("math", P, Domain(0, ("gpu_check", "gen")))
    sc = SamplingConfig(group_size=K, max_new_tokens=L, groups_per_batch=P)
    u = torch.cat([group_uniforms(Domain(0, ("gpu_check", "u", t.id)), K, L) for t in tasks])
    times, ntok, comps = [], 0, None
    peak_reset(dev)
    for r in range(reps + 1):
        sync(dev)
        t0 = time.time()
        _, comps, _ = hf_sample(model, tok, [t.prompt for t in tasks for _ in range(K)], u, sc)
        sync(dev)
        if r:
            times.append(time.time() - t0)
            ntok += sum(map(len, comps))
    times.sort()
    return dict(
        rows=P * K,
        max_new_tokens=L,
        s_per_batch=round(times[len(times) // 2], 4),
        completion_tokens_per_s=round(ntok / sum(times), 1),
        row_steps_per_s=round(P * K * L / times[len(times) // 2], 1),
        peak_gib=peak_gib(dev),
    ), comps


def scoring(model, tok, dev, out, reward_fn=None, P=8, K=8, L=16, k_sketch=8192):
    """Study scoring on the device: a (P x K) rollout store, then the four estimators (one forward + four
    weighted backwards with per-rollout hooks, CountSketch on the device) vs one training forward+backward."""
    from stalebook.core import Domain
    from stalebook.model import policy_hash
    from stalebook.rollouts import (
        RolloutStore,
        SamplingConfig,
        completion_logprobs,
        generate_store,
        numerics_of,
        rollout_domain,
    )
    from stalebook.scoring import CountSketch, fresh_features, lora_dim, stale_features
    from stalebook.tasks import synthetic_tasks

    torch.use_deterministic_algorithms(True, warn_only=True)
    tasks = synthetic_tasks("math", P, Domain(0, ("gpu_check", "score")))
    sc = SamplingConfig(group_size=K, max_new_tokens=L, groups_per_batch=P)
    ph = policy_hash(model)
    t0 = time.time()
    st = generate_store(
        model,
        tok,
        tasks,
        RolloutStore(
            out / "stores", ph, rollout_domain(0, ph, "score"), sc, [t.id for t in tasks], numerics=numerics_of(model)
        ),
        reward_fn,
        progress=False,
    )
    sync(dev)
    t_gen = time.time() - t0
    recs = st.records
    pids = [r["prompt_ids"] for r in recs for _ in r["tokens"]]
    comps = [c for r in recs for c in r["tokens"]]
    D = lora_dim(model)
    sk = CountSketch(D, k_sketch, Domain(0, ("gpu_check", "sk")))

    def train_fb():
        lp, m = completion_logprobs(model, pids, comps, micro_batch=P * K, pad_id=tok.pad_token_id)
        (lp * m).sum().backward()
        model.zero_grad(set_to_none=True)

    def best(fn, reps=3):
        fn()
        sync(dev)
        ts = []
        for _ in range(reps):
            t0 = time.time()
            fn()
            sync(dev)
            ts.append(time.time() - t0)
        return min(ts)

    peak_reset(dev)
    t_train = best(train_fb)
    t_score = best(lambda: stale_features(model, recs, sk, tok.pad_token_id, P * K))
    g, _, gap = stale_features(model, recs, sk, tok.pad_token_id, P * K)
    same = all(torch.equal(torch.from_numpy(g["00"]), torch.from_numpy(g[ab])) for ab in g)
    t_fresh = best(lambda: fresh_features(model, recs, sk, tok.pad_token_id, P * K))
    g2, _, _ = stale_features(model, recs, sk, tok.pad_token_id, P * K)
    return dict(
        rollouts=P * K,
        tokens=sum(map(len, comps)),
        lora_dim=D,
        k_sketch=k_sketch,
        generation_s=round(t_gen, 3),
        train_fwd_bwd_s=round(t_train, 4),
        score4_s=round(t_score, 4),
        score4_over_train=round(t_score / t_train, 2),
        fresh_score_s=round(t_fresh, 4),
        stale_over_fresh_incl_gen=round(t_score / (t_gen + t_fresh), 3),
        pi_eq_beta_max_abs_logratio=gap,
        four_estimators_identical_at_pi_eq_beta=bool(same),
        rerun_bitwise_identical=bool(all(np.array_equal(g[ab], g2[ab]) for ab in g)),
        peak_gib=peak_gib(dev),
    )


def main(argv=None):
    p = argparse.ArgumentParser(description="Engine II GPU check (hf backend)")
    p.add_argument("--out", required=True)
    p.add_argument("--snapshot", default=None, help="a locked tiny snapshot to reuse (default: build one under --out)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--small", action="store_true", help="dry run: reduced tiny build, small 'large' model, fewer steps")
    p.add_argument("--big-hidden", type=int, default=2048)
    p.add_argument("--big-layers", type=int, default=20)
    p.add_argument("--big-intermediate", type=int, default=5632)
    p.add_argument("--big-heads", type=int, default=16)
    p.add_argument("--skip-big", action="store_true")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = a.device
    if a.small:
        a.big_hidden, a.big_layers, a.big_intermediate, a.big_heads = 64, 2, 128, 4
    T0 = time.time()
    RES["args"] = vars(a)
    if dev.startswith("cuda") and not torch.cuda.is_available():
        log("CUDA not available")
        RES["errors"]["env"] = "CUDA not available"
    section("env")(env_info)(dev)

    from stalebook.core import Domain
    from stalebook.model import policy_hash
    from stalebook.rollouts import completion_logprobs, load_run_policy

    # 1. the tiny snapshot --------------------------------------------------------------------------
    @section("tiny_snapshot")
    def tiny():
        from stalebook.model import ensure_tiny_snapshot
        from stalebook.snapshot import read_lock, verify_snapshot

        if a.snapshot:
            bad = verify_snapshot(a.snapshot, self_test=False)
            if bad:
                raise RuntimeError(f"--snapshot {a.snapshot}: {bad[0]}")
            return dict(path=a.snapshot, built=False, revision=read_lock(a.snapshot)["revision"][:16])
        from stalebook.model import TinySpec

        spec = (
            TinySpec(max_steps=60, first_eval=10**9, require_band=False)
            if a.small
            else TinySpec(threads=max(1, min(4, os.cpu_count() or 1)))
        )
        d = out / "tiny"
        lock = ensure_tiny_snapshot(d, spec, log=lambda *x: log("   ", *x))
        return dict(path=str(d), built=True, reduced=a.small, revision=lock["revision"][:16])

    t = tiny()
    if t is None:
        return finish(out, T0)
    snap = t["path"]

    # 2. a reference adapter trained for 2 steps on CPU; its hash and log-probs on CPU ----------------
    @section("cpu_reference")
    def cpu_ref():
        tr, info = grpo_steps(train_cfg(out / "cpu-ref", snap, "cpu", "float32", 2, lineage=(0, 2)))
        ck = out / "cpu-ref" / "lineage" / "step-000002"
        m, tok = load_run_policy(snap, str(ck), "cpu", "float32")
        return dict(adapter=str(ck), policy_hash=policy_hash(m), grpo=info)

    ref = cpu_ref()

    def probe_batch(tok):
        from stalebook.core import Domain
        from stalebook.tasks import synthetic_tasks

        ts = synthetic_tasks("math", 16, Domain(0, ("gpu_check", "probe")))
        pids = [tok(t.prompt).input_ids for t in ts]
        comps = [tok(t.answer, add_special_tokens=False).input_ids + [tok.eos_token_id] for t in ts]
        return pids, comps

    cpu_lp = None
    if ref:
        m, tok = load_run_policy(snap, ref["adapter"], "cpu", "float32")
        pids, comps = probe_batch(tok)
        with torch.no_grad():
            cpu_lp = completion_logprobs(m, pids, comps, pad_id=tok.pad_token_id)
        fresh_cpu = policy_hash(load_run_policy(snap, "", "cpu", "float32")[0])

    # 3. tiny on the device: hash / log-prob agreement, one GRPO step, one generation, per dtype ------
    for dt in a.dtypes:

        @section(f"tiny_{dt}_agreement")
        def agree(dt=dt):
            r = {}
            fresh = policy_hash(load_run_policy(snap, "", dev, dt)[0])
            r["fresh_lora_hash_equal_cpu_f32"] = fresh == fresh_cpu
            if ref is None:
                return r
            m, tok = load_run_policy(snap, ref["adapter"], dev, dt)
            h = policy_hash(m)
            r.update(
                policy_hash=h[:16],
                adapter_hash_equal_cpu_f32=h == ref["policy_hash"],
                lora_dtype=str(next(p for n, p in m.named_parameters() if "lora_A" in n).dtype),
            )
            pids, comps = probe_batch(tok)
            with torch.no_grad():
                lp, mk = completion_logprobs(m, pids, comps, pad_id=tok.pad_token_id)
            r["max_abs_logprob_diff_vs_cpu_f32"] = float((lp.float().cpu() - cpu_lp[0]).abs()[cpu_lp[1]].max())
            return r

        agree()

        @section(f"tiny_{dt}_grpo")
        def tiny_grpo(dt=dt):
            tr, info = grpo_steps(train_cfg(out / f"tiny-{dt}", snap, dev, dt, 2 if a.small else 3))
            g, _ = generation(tr.model, tr.tok, dev, reps=2 if a.small else 5)
            info["generation"] = g
            return info

        tiny_grpo()

    # 4. a ~1B random Llama snapshot, bf16, same tokenizer, same code path ----------------------------
    if not a.skip_big:
        big = out / "big"

        @section("big_build")
        def big_build():
            import shutil

            from transformers import LlamaForCausalLM

            from stalebook.model import build_char_tokenizer, tiny_llama_config
            from stalebook.snapshot import write_lock
            from stalebook.tasks import ALPHABET

            tok = build_char_tokenizer(ALPHABET)
            cfg = tiny_llama_config(
                len(tok),
                hidden=a.big_hidden,
                layers=a.big_layers,
                heads=a.big_heads,
                intermediate=a.big_intermediate,
                max_positions=128,
            )
            t0 = time.time()
            with torch.random.fork_rng(devices=[0] if dev.startswith("cuda") else []):
                torch.manual_seed(Domain(0, ("gpu_check", "big")).seed64())
                with torch.device(dev):  # initialise on the device (fast), store bf16
                    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
            sync(dev)
            t_init = time.time() - t0
            n = sum(p.numel() for p in model.parameters())
            if big.exists():
                shutil.rmtree(big)
            t0 = time.time()
            model.save_pretrained(big, safe_serialization=True)
            tok.save_pretrained(big)
            t_save = time.time() - t0
            del model
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()
            t0 = time.time()
            lock = write_lock(big, domains=("math",))
            t_lock = time.time() - t0
            size = sum(f.stat().st_size for f in big.iterdir())
            return dict(
                n_params=n,
                gib_on_disk=round(size / 2**30, 3),
                init_s=round(t_init, 2),
                save_s=round(t_save, 2),
                lock_s=round(t_lock, 2),
                revision=lock["revision"][:16],
            )

        b = big_build()

        if b is not None:

            @section("big_bfloat16_grpo")
            def big_grpo():
                # a random model never solves a task: a toy reward ("contains a 7") keeps the groups heterogeneous,
                # so the step has a non-zero gradient; everything else is the production path
                toy = lambda t, x: (float("7" in x), {"toy": True})
                tr, info = grpo_steps(
                    train_cfg(out / "big-run", big, dev, "bfloat16", 2, K=8, P=8, L=16), reward_fn=toy
                )
                g, _ = generation(tr.model, tr.tok, dev, reps=1 if a.small else 3)
                info["generation"] = g
                info["scoring"] = scoring(
                    tr.model, tr.tok, dev, out / "big-score", reward_fn=toy, k_sketch=256 if a.small else 8192
                )
                return info

            big_grpo()
            if not a.small:
                import shutil

                shutil.rmtree(big, ignore_errors=True)
                shutil.rmtree(out / "big-run", ignore_errors=True)
    return finish(out, T0)


def finish(out, T0):
    RES["total_s"] = round(time.time() - T0, 1)
    RES["ok"] = not RES["errors"]
    (out / "gpu_check.json").write_text(json.dumps(RES, indent=1, default=str) + "\n")
    log(
        f"=== gpu_check {'OK' if RES['ok'] else 'with errors: ' + ', '.join(RES['errors'])} in {RES['total_s']} s "
        f"-> {out / 'gpu_check.json'}"
    )
    return 0 if RES["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
