"""Scoring benchmarks (issue: Study), ratios measured side by side in one run.

(a) scoring all four estimators (one forward + four weighted backwards with per-rollout hooks)
    vs one plain training forward+backward over the same rollouts              (goal <= 3.5x)
(b) CountSketch vs a dense Gaussian projection (TRAK-style blocked matmul) at D = 1e6, k = 8192
    (goal >= 20x faster) and vs a plain copy of the vector                     (goal <= 2x)
(c) stale scoring (reuse stored rollouts, score under pi) vs fresh scoring including generation

    .venv/bin/python benchmarks/bench_scoring.py [--snapshot DIR] [--rows 64]
"""

import argparse
import atexit
import json
import shutil
import tempfile
import time
from pathlib import Path

import stalebook  # noqa: F401  # isort: skip  (first: pins the CPU numerics before numpy and torch load)
import torch  # isort: skip

from stalebook.core import Domain


def best(fn, reps=5):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def bench_sketch(D=1_000_000, k=8192, block=65536):
    from stalebook.scoring import CountSketch

    g = torch.randn(D, generator=Domain(0, ("bench", "g")).torch())
    cs = CountSketch(D, k, Domain(0, ("bench", "cs")))
    cs(g[None])  # build the CSR matrix once (cached)
    t_cs = best(lambda: cs(g[None]))
    t_copy = best(lambda: g.clone())
    gen = Domain(0, ("bench", "dense")).torch()

    def dense():  # TRAK-style: Gaussian projection generated and applied in blocks
        out = torch.zeros(k)
        gen.manual_seed(0)
        for s in range(0, D, block):
            P = torch.randn(k, min(block, D - s), generator=gen) / k**0.5
            out += P @ g[s : s + block]
        return out

    t_dense = best(dense, reps=1)
    return dict(
        D=D,
        k=k,
        countsketch_s=t_cs,
        copy_s=t_copy,
        dense_s=t_dense,
        dense_over_cs=t_dense / t_cs,
        cs_over_copy=t_cs / t_copy,
    )


def bench_scoring(snapshot, rows=64, threads=2):
    "Scoring's costs on `rows` stored rollouts of the tiny model at `threads` torch threads (seconds, best of 5)."
    from stalebook.model import LoraSpec, load_policy, policy_hash
    from stalebook.rollouts import (
        SamplingConfig,
        completion_logprobs,
        generate_store,
        numerics_of,
        policy_store,
    )
    from stalebook.scoring import CountSketch, fresh_features, lora_dim, stale_features
    from stalebook.tasks import synthetic_tasks

    torch.set_num_threads(threads)
    model, tok = load_policy(snapshot, lora=LoraSpec())
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=Domain(0, ("bench", n)).torch())
    ph = policy_hash(model)
    K, G = 8, rows // 8
    tasks = synthetic_tasks("math", G, Domain(0, ("bench", "tasks")))
    cfg = SamplingConfig(group_size=K, max_new_tokens=16, groups_per_batch=G)
    tmp = Path(tempfile.mkdtemp(prefix="bench-scoring-"))
    atexit.register(shutil.rmtree, tmp, True)  # the store goes when the benchmark ends
    t0 = time.perf_counter()
    st = generate_store(
        model,
        tok,
        tasks,
        policy_store(tmp, ph, 0, "bench", cfg, tasks, numerics_of(model)),
        progress=False,
    )
    t_gen = time.perf_counter() - t0
    sk = CountSketch(lora_dim(model), 1024, Domain(0, ("bench", "sk")))
    recs = st.records
    pids = [r["prompt_ids"] for r in recs for _ in r["tokens"]]
    comps = [c for r in recs for c in r["tokens"]]

    def train_fb():
        lp, m = completion_logprobs(model, pids, comps, micro_batch=rows, pad_id=tok.pad_token_id)
        (lp * m).sum().backward()
        model.zero_grad(set_to_none=True)

    t_train = best(train_fb)
    t_stale = best(lambda: stale_features(model, recs, sk, tok.pad_token_id, rows))
    t_fresh = best(lambda: fresh_features(model, recs, sk, tok.pad_token_id, rows))
    ntok = sum(len(c) for c in comps)
    return dict(
        rollouts=rows,
        tokens=ntok,
        lora_dim=lora_dim(model),
        train_fwd_bwd_s=t_train,
        score4_s=t_stale,
        score4_over_train=t_stale / t_train,
        generation_s=t_gen,
        fresh_score_s=t_fresh,
        fresh_incl_generation_s=t_gen + t_fresh,
        stale_over_fresh_incl_gen=t_stale / (t_gen + t_fresh),
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--snapshot", default="")
    ap.add_argument("--rows", type=int, default=64)
    a = ap.parse_args()
    from stalebook.model import default_snapshot

    snap = a.snapshot or str(default_snapshot())
    s = bench_sketch()
    print(
        f"(b) CountSketch D={s['D']:,} k={s['k']}: {s['countsketch_s'] * 1e3:.2f} ms | dense Gaussian (blocked) "
        f"{s['dense_s']:.2f} s -> {s['dense_over_cs']:.0f}x faster (goal >= 20x) | copy {s['copy_s'] * 1e3:.2f} ms "
        f"-> CountSketch/copy = {s['cs_over_copy']:.2f}x (goal <= 2x)"
    )
    r = bench_scoring(snap, a.rows)
    print(
        f"(a) {r['rollouts']} rollouts, {r['tokens']} tokens, D={r['lora_dim']}: "
        f"four estimators {r['score4_s'] * 1e3:.0f} ms vs "
        f"one training fwd+bwd {r['train_fwd_bwd_s'] * 1e3:.0f} ms -> {r['score4_over_train']:.2f}x (goal <= 3.5x)"
    )
    print(
        f"(c) stale scoring {r['score4_s'] * 1e3:.0f} ms "
        f"vs fresh (generation {r['generation_s'] * 1e3:.0f} ms + scoring "
        f"{r['fresh_score_s'] * 1e3:.0f} ms) -> stale/fresh = {r['stale_over_fresh_incl_gen']:.2f}x"
    )
    print(json.dumps(dict(sketch=s, scoring=r)))
