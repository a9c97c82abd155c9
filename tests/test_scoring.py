"""Scoring on a real (tiny) model: the uncapped stale g11 is an unbiased estimate of the on-policy gradient."""

import sys
from pathlib import Path

import numpy as np
import torch

from stalebook.core import Domain

EXE = str(Path(sys.executable).parent / "stalebook")


def _half_vocab_reward(tok):
    "A reward with signal even for an untrained model: 1 if the first completion character is a digit < 5."

    def r(task, text):
        return (1.0 if text[:1] in "01234" else 0.0), {}

    return r


def test_g11_sample_is_unbiased_for_on_policy_gradient(tmp_path, tiny_snapshot):
    """Uncapped g11 from stale rollouts of beta (raw rewards) vs REINFORCE from fresh rollouts of pi:
    both estimate grad E_pi[R]; their means along a fixed direction agree within 3 SE."""
    from stalebook.model import LoraSpec, load_policy, policy_hash
    from stalebook.rollouts import RolloutStore, SamplingConfig, generate_store, numerics_of, rollout_domain
    from stalebook.scoring import fresh_features, stale_features
    from stalebook.tasks import Task

    model, tok = load_policy(
        str(tiny_snapshot), dtype="float64", lora=LoraSpec(r=2, target_modules=("q_proj", "v_proj"))
    )
    g = Domain(0, ("test", "unbiased")).torch()
    lora_b = [(n, p) for n, p in model.named_parameters() if "lora_B" in n]
    with torch.no_grad():
        for _n, p in lora_b:
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    beta_hash = policy_hash(model)
    beta_state = {n: p.detach().clone() for n, p in lora_b}
    with torch.no_grad():
        for _n, p in lora_b:
            p.add_(0.15 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    pi_hash = policy_hash(model)
    pi_state = {n: p.detach().clone() for n, p in lora_b}
    M, K = 160, 4
    tasks = [Task(f"p{i}", "math", "3+4=", "7") for i in range(M)]  # one prompt, M independent groups
    cfg = SamplingConfig(group_size=K, max_new_tokens=3, groups_per_batch=16)
    rf = _half_vocab_reward(tok)
    ids = [t.id for t in tasks]
    num = numerics_of(model)

    def load(state):
        with torch.no_grad():
            for n, p in lora_b:
                p.copy_(state[n])

    load(beta_state)
    stale = generate_store(
        model,
        tok,
        tasks,
        RolloutStore(tmp_path, beta_hash, rollout_domain(0, beta_hash, "s"), cfg, ids, numerics=num),
        rf,
        False,
    )
    load(pi_state)
    fresh = generate_store(
        model,
        tok,
        tasks,
        RolloutStore(tmp_path, pi_hash, rollout_domain(0, pi_hash, "f"), cfg, ids, numerics=num),
        rf,
        False,
    )
    probe = generate_store(
        model,
        tok,
        tasks,
        RolloutStore(tmp_path, pi_hash, rollout_domain(0, pi_hash, "v"), cfg, ids, numerics=num),
        rf,
        False,
    )
    gs, _, gap = stale_features(model, stale.records, None, tok.pad_token_id, 64, which=("11",), normalise=None)
    R, V = fresh_features(model, fresh.records, None, tok.pad_token_id, 64)
    Rp, Vp = fresh_features(model, probe.records, None, tok.pad_token_id, 64)
    v = (Rp[..., None] * Vp).mean((0, 1))
    v /= np.linalg.norm(v)  # direction from an independent sample
    a = gs["11"] @ v  # per-group g11 along v  [M]
    b = (R[..., None] * V).mean(1) @ v  # per-group REINFORCE along v [M]
    se = np.sqrt(a.var(ddof=1) / M + b.var(ddof=1) / M)
    assert gap > 0.01, "pi and beta must differ"
    assert b.mean() > 3 * b.std(ddof=1) / np.sqrt(M), "no signal along v: the test would be vacuous"
    assert abs(a.mean() - b.mean()) < 3 * se, (a.mean(), b.mean(), se)
