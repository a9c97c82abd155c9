"""Rollout stores: generation resumes bit-identically after SIGKILLs, a store refuses another policy hash
(multi-process)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_yaml

from stalebook.core import Domain, StalebookError, read_jsonl

EXE = str(Path(sys.executable).parent / "stalebook")
TIMING = {"t_gen", "t_step"}


def _run(*args, fault=None, timeout=600):
    env = {**os.environ, "STALEBOOK_FAULT": fault or "", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([EXE, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)


def _rollout_cfg(root, snap, **kw):
    cfg = dict(
        out=str(root / "stores"),
        snapshot=str(snap),
        domain="math",
        n_tasks=12,
        purpose="stale",
        sampling=dict(group_size=4, max_new_tokens=8, groups_per_batch=3),
    )
    cfg.update(kw)
    return write_yaml(root / "rollouts.yaml", cfg)


# Each kill is a process start (seconds of imports): `full` (5 kills) runs with the slow tests; `quick`, in the default
# run, 2 of them.
@pytest.mark.parametrize(
    "full", [pytest.param(True, marks=pytest.mark.slow, id="full"), pytest.param(False, id="quick")]
)
def test_generation_resume_bit_identical(tmp_path, tiny_snapshot, full):
    ref = _rollout_cfg(tmp_path / "ref", tiny_snapshot)
    r = _run("rollouts", ref, "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    flt = _rollout_cfg(tmp_path / "flt", tiny_snapshot)
    g = Domain(0, ("test", "gen-faults")).numpy()
    points = sorted(g.choice(np.arange(0, 12), 5, replace=False))
    if not full:
        points = points[1::3]  # groups 3 and 10
    for p in points:
        r = _run("rollouts", flt, "--quiet", fault=f"group:{p}")
        assert r.returncode == -9, r.stderr[-2000:]
    (store_f,) = (tmp_path / "flt" / "stores").iterdir()
    gf = store_f / "groups.jsonl"
    gf.write_bytes(gf.read_bytes()[:-7])  # plus a torn last record
    r = _run("rollouts", flt, "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    (store_r,) = (tmp_path / "ref" / "stores").iterdir()
    assert store_r.name == store_f.name
    assert (store_r / "groups.jsonl").read_bytes() == gf.read_bytes()
    recs = read_jsonl(gf).records
    assert [x["group"] for x in recs] == list(range(12))  # none lost, none duplicated


def test_store_refuses_other_policy_and_hash_changes(tmp_path, tiny_snapshot):
    from stalebook.model import LoraSpec, load_policy, policy_hash
    from stalebook.rollouts import RolloutStore, SamplingConfig, rollout_domain

    m, _ = load_policy(str(tiny_snapshot), lora=LoraSpec())
    h0 = policy_hash(m)
    name, p = next((n, p) for n, p in m.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        p.view(-1)[0] += 1e-3
    h1 = policy_hash(m)
    assert h1 != h0
    with torch.no_grad():
        p.view(-1)[0] -= 1e-3
    s = RolloutStore(tmp_path, h0, rollout_domain(0, h0, "stale"), SamplingConfig(), ["a", "b"])
    with pytest.raises(StalebookError, match="another policy hash"):
        RolloutStore(tmp_path, h1, rollout_domain(0, h0, "stale"), SamplingConfig(), ["a", "b"], path=s.path)
    with pytest.raises(StalebookError, match="another sampling hash"):
        RolloutStore(
            tmp_path, h0, rollout_domain(0, h0, "stale"), SamplingConfig(group_size=3), ["a", "b"], path=s.path
        )


def test_shared_prefix_matches_whole_rows_on_grpo_batches(tiny_snapshot):
    """`shared_prefix` (each distinct prompt's forward once, its KV cache continued by the rows sharing it) against
    whole rows, on a GRPO-shaped batch of code prompts of different lengths with micro-batches that split groups, on a
    LoRA policy: the same sampled completions, log-probs within 1e-4 and the same gradient up to float order (rel.
    1e-3)."""
    from stalebook.model import LoraSpec
    from stalebook.rollouts import (
        SamplingConfig,
        completion_logprobs,
        group_uniforms,
        hf_sample,
        load_run_policy,
        task_pool,
    )

    model, tok = load_run_policy(str(tiny_snapshot), "", "cpu", "float32", lora=LoraSpec(r=4), seed=0)
    tasks = task_pool("code", 5, 0)
    assert len({len(t.prompt) for t in tasks}) > 1  # left padding is exercised
    K, sc = 6, SamplingConfig(group_size=6, max_new_tokens=10)
    prompts = [t.prompt for t in tasks for _ in range(K)]
    u = torch.cat([group_uniforms(Domain(0, ("test", "prefix", t.id)), K, sc.max_new_tokens) for t in tasks])
    pa, ca, sa = hf_sample(model, tok, prompts, u, sc)
    pb, cb, sb = hf_sample(model, tok, prompts, u, sc, shared_prefix=True)
    assert (pa, ca) == (pb, cb)
    assert max(abs(x - y) for r, q in zip(sa, sb) for x, y in zip(r, q)) < 1e-4
    ca[0] = []  # an empty completion too
    got = {}
    for sp in (False, True):
        model.zero_grad()
        lp, m = completion_logprobs(model, pa, ca, micro_batch=8, pad_id=tok.pad_token_id, shared_prefix=sp)
        (lp * m).sum().backward()
        got[sp] = lp.detach(), m, torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])
    assert torch.equal(got[True][1], got[False][1])
    assert float((got[True][0] - got[False][0]).abs().max()) < 1e-4
    assert (
        float((got[True][2] - got[False][2]).norm() / got[False][2].norm()) < 1e-3 and float(got[False][2].norm()) > 0
    )


def test_a_shared_prefix_store_is_its_own_store_with_the_same_rollouts(tmp_path, tiny_snapshot):
    """A store generated with `shared_prefix` (a point's option for long chat prompts) runs each prompt's forward once
    per group in generation: another store (name and manifest bind the option; the other kind is refused at its path)
    with the same sampled tokens and rewards, sampler log-probs within 1e-4, and the very behaviour log-probs of whole
    rows (the bits the scoring pass recomputes, so the four estimators coincide at pi = beta)."""
    from stalebook.model import LoraSpec
    from stalebook.rollouts import RolloutStore, SamplingConfig, generate_store, load_run_policy, task_pool

    model, tok = load_run_policy(str(tiny_snapshot), "", "cpu", "float32", lora=LoraSpec(r=4), seed=0)
    tasks, sc = task_pool("math", 6, 0), SamplingConfig(group_size=4, max_new_tokens=8, groups_per_batch=3)
    dom, ids = Domain(0, ("test", "store-prefix")), [t.id for t in tasks]
    st = {
        sp: generate_store(
            model, tok, tasks, RolloutStore(tmp_path, "p" * 64, dom, sc, ids, shared_prefix=sp), progress=False
        )
        for sp in (False, True)
    }
    assert st[True].path != st[False].path and st[True].manifest["shared_prefix"] is True
    assert "shared_prefix" not in st[False].manifest  # stores made before the option keep their names
    with pytest.raises(StalebookError, match="another shared prefix"):
        RolloutStore(tmp_path, "p" * 64, dom, sc, ids, path=st[True].path)
    a, b = st[False].records, st[True].records
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b] and [r["rewards"] for r in a] == [
        r["rewards"] for r in b
    ]
    assert [r["logp"] for r in a] == [r["logp"] for r in b]
    sl = [(r["sampler_logp"], q["sampler_logp"]) for r, q in zip(a, b)]
    assert max(abs(x - y) for la, lb in sl for ra, rb in zip(la, lb) for x, y in zip(ra, rb)) < 1e-4


@pytest.mark.parametrize("domain", ["math", "code"])
def test_room_cache_samples_the_bits_of_dynamic_cache(tiny_snapshot, domain):
    """Generation appends into a `room_cache` (the completions' room reserved, no copy per step): on GRPO-shaped
    batches, whole rows and shared prefix, the sampled completions and the sampler's log-probs are bit for bit those of
    HF's own `DynamicCache` (`reserve_room=False`), and the cache's buffer holds the whole completion without moving."""
    import stalebook.rollouts as R
    from stalebook.model import LoraSpec

    model, tok = R.load_run_policy(str(tiny_snapshot), "", "cpu", "float32", lora=LoraSpec(r=4), seed=0)
    with torch.no_grad():  # a trained-looking adapter, not the zero init
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    tasks = R.task_pool(domain, 6, 0)
    K, sc = 8, R.SamplingConfig(group_size=8, max_new_tokens=12)
    prompts = [t.prompt for t in tasks for _ in range(K)]
    u = torch.cat([R.group_uniforms(Domain(0, ("test", "room", t.id)), K, sc.max_new_tokens) for t in tasks])
    seen = {}  # cache -> where each layer's keys start, after every forward step of generate (torch's forward hook)

    def after_forward(module, args, kwargs, out):
        c = kwargs.get("cache")
        if c is not None:
            seen.setdefault(c, []).append([l.keys.data_ptr() for l in c.layers])

    hook = model.get_base_model().register_forward_hook(after_forward, with_kwargs=True)
    try:
        ours = {sp: R.hf_sample(model, tok, prompts, u, sc, shared_prefix=sp) for sp in (False, True)}
    finally:
        hook.remove()
    made = [c for c in seen if len(seen[c]) > 1]  # the caches generate decoded with (a shared prompt's prefill: one)
    assert len(made) == 2 and all(
        isinstance(l, R.RoomLayer) and l.room == sc.max_new_tokens for c in made for l in c.layers
    )
    P = max(len(p) for p in ours[False][0])  # the padded prompt width
    W = P + max(len(c) for c in ours[False][1]) - 1  # prompt + the tokens fed back
    for c in made:  # one buffer per layer, allocated once: the keys never move (the shared prompt's cache holds P - 1)
        assert all(l.get_seq_length() == W for l in c.layers)
        assert all(ptrs == seen[c][0] for ptrs in seen[c]), "a layer's buffer moved"
    for sp in (False, True):
        assert R.hf_sample(model, tok, prompts, u, sc, shared_prefix=sp, reserve_room=False) == ours[sp]
    assert any(len(c) > 1 for c in ours[False][1])
