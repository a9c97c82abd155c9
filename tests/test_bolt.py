"""BOLT on the engine: the weights of a real reference dataset are theory.boltzmann's, weighted SFT through the trainer
fits its induced target on an enumerable problem (BOLT and Refit each land nearest their own), bad input (a reference
from another policy, beta <= 0, an empty group) fails with one line naming the file or field, a BOLT step runs no
sampling and no reference forward, and a reduced comparison of all five arms runs end to end, idempotent and
resumable bit for bit (~1.5 min for the whole file on the shared 2-core machine); and (slow, 4-7 min) the notebook's
enumerable check's bounds hold over 20 seeds."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from stalebook.bolt import (
    ARMS,
    BoltConfig,
    EvalConfig,
    arm_train_config,
    open_reference,
    reference_store,
    reference_trainer,
    run_arm,
)
from stalebook.core import ConfigError, Domain, StalebookError, atomic_write_json, hash_file, load_config
from stalebook.model import policy_hash
from stalebook.objectives import sample_log_weights
from stalebook.rollouts import SamplingConfig, completion_logprobs, load_run_policy
from stalebook.tasks import ALPHABET, synthetic_tasks
from stalebook.theory.boltzmann import bolt_log_weights, induced_target, log_normalize, refit_log_weights, tv
from stalebook.trainer import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]


def digit_share(task, text):
    """A graded reward in [0, 1] that the reduced snapshot's samples actually vary in: the share of digits in the
    completion."""
    return (sum(c.isdigit() for c in text) / len(text) if text else 0.0), {}


def small_arm(snap, stores, arm, **kw):
    t = dataclasses.replace(
        BoltConfig().train,  # the BOLT study's training setting
        snapshot=str(snap),
        n_tasks=8,
        steps=4,
        prompts_per_step=4,
        checkpoint_every=2,
        lr=1e-2,
        sampling=SamplingConfig(group_size=4, max_new_tokens=6, groups_per_batch=4),
    )
    return BoltConfig(
        arm=arm,
        rounds=2 if arm == "iterative" else 1,
        train=t,
        stores=str(stores),
        eval=EvalConfig(n_heldout=8, n_train=4, k=4, n_retention=16, at=2, groups_per_batch=8),
        **kw,
    )


def test_bolt_weights_on_a_real_dataset_are_theory_boltzmanns(tmp_path, tiny_snapshot):
    cfg = TrainConfig(
        out=str(tmp_path / "run"),
        snapshot=str(tiny_snapshot),
        n_tasks=6,
        steps=2,
        prompts_per_step=3,
        objective="sft",
        lineage_steps=(0,),
        sampling=SamplingConfig(group_size=8, max_new_tokens=6, groups_per_batch=6),
    )
    beta = 0.3
    tr = reference_trainer(cfg, "bolt", beta, reward_fn=digit_share)
    ref = tr.data.reference(tr, 0)
    recs = [json.loads(l) for l in (ref["store"].path / "groups.jsonl").read_text().splitlines()]
    R = np.array([r["rewards"] for r in recs])
    assert len(np.unique(R)) > 2, "the check needs rewards that vary"
    # (a) the definition written out, from the stored file itself
    w = np.exp(ref["logw"])
    np.testing.assert_allclose(w, np.exp(R / beta) / np.exp(R / beta).mean(1, keepdims=True), rtol=1e-12)
    # (b) theory's population BOLT weights on each group's empirical law (duplicate completions merged): the same
    # numbers
    for g, rec in enumerate(recs):
        keys = [tuple(c) for c in rec["tokens"]]
        uniq = sorted(set(keys))
        idx = [uniq.index(k) for k in keys]
        lq = np.log(np.bincount(idx, minlength=len(uniq)) / len(keys))
        r_u = np.array([R[g][idx.index(j)] for j in range(len(uniq))])
        np.testing.assert_allclose(ref["logw"][g], bolt_log_weights(lq, r_u, beta)[idx], atol=1e-12)
    # (c) the dataset record: log Z-hat, ESS fraction and the weights as stored; the weights the step multiplies in
    s = json.loads((tr.dir / "reference-0.json").read_text())
    np.testing.assert_allclose(s["per_prompt"]["log_Z"], np.log(np.exp(R / beta).mean(1)), rtol=1e-12)
    np.testing.assert_allclose(s["per_prompt"]["ess_frac"], w.sum(1) ** 2 / (8 * (w**2).sum(1)), rtol=1e-12)
    np.testing.assert_allclose(s["per_prompt"]["weight"], w, rtol=1e-15)
    assert s["policy_hash"] == policy_hash(tr.model) and s["groups_sha256"] == hash_file(
        ref["store"].path / "groups.jsonl"
    )
    b = tr.data.batch(tr, tr.step)  # the step's Batch: the stored groups of its prompts, with rewards and weights
    rows = [s["per_prompt"]["task_id"].index(t.id) for t in b.prompts]
    np.testing.assert_array_equal(b.gen.weights.numpy(), w[rows].reshape(-1))
    np.testing.assert_array_equal(b.R.numpy(), R[rows])
    assert b.old is None and b.info == {"bolt/round": 0}
    np.testing.assert_array_equal(np.exp(sample_log_weights(R, "refit", beta)), R)


def _first_token_law(model, tok, tasks):
    V = len(tok)
    pids = [tok(t.prompt).input_ids for t in tasks for _ in range(V)]
    with torch.no_grad():
        lp, _ = completion_logprobs(model, pids, [[y] for _ in tasks for y in range(V)], 512, tok.pad_token_id)
    return lp[:, 0].double().view(len(tasks), V).numpy()


@pytest.mark.parametrize("weighting", ["bolt", "refit"])
def test_weighted_sft_through_the_trainer_fits_its_induced_target(tmp_path, tiny_snapshot, weighting):
    """One-token responses (enumerable): training through the real trainer moves the model's law on the stored support
    from q-hat to the induced target q-hat*w, and ends nearer it than the unweighted q-hat (plain SFT's target)."""
    beta, N = 0.5, 32
    odd = lambda t, x: (1.0 if len(x) == 1 and x in "13579" else 0.25 if len(x) == 1 and x.isdigit() else 0.0, {})
    tks = synthetic_tasks("math", 1, Domain(0, ("test", "bolt", "enum")))
    cfg = TrainConfig(
        out=str(tmp_path / weighting),
        snapshot=str(tiny_snapshot),
        steps=60,
        prompts_per_step=1,
        lr=3e-2,
        objective="sft",
        lineage_steps=(0,),
        checkpoint_every=60,
        sampling=SamplingConfig(group_size=N, max_new_tokens=1, groups_per_batch=1),
    )
    tr = reference_trainer(cfg, weighting, beta, tasks=tks, reward_fn=odd)
    y = np.array([c[0] for c in tr.data.reference(tr, 0)["store"].records[0]["tokens"]])
    V = len(tr.tok)
    with np.errstate(divide="ignore"):
        lq = np.log(np.bincount(y, minlength=V) / N)
    r = np.array(
        [odd(None, ALPHABET[v - 4])[0] if v >= 4 else 0.0 for v in range(V)]
    )  # vocab: 4 specials, then ALPHABET
    S = np.isfinite(lq)
    target = induced_target(lq, r / beta if weighting == "bolt" else refit_log_weights(r))
    assert tv(target, lq) > 0.15, "the weights must move the target away from q-hat for the check to mean something"
    cond = lambda l: log_normalize(np.where(S, l, -np.inf))
    l0 = _first_token_law(tr.model, tr.tok, tks)[0]
    tr.run(progress=False)
    l1 = _first_token_law(tr.model, tr.tok, tks)[0]
    d0, d1, d_plain = tv(cond(l0), target), tv(cond(l1), target), tv(cond(l1), lq)
    assert d1 < 0.4 * d0 and d1 < d_plain, (d0, d1, d_plain)


ENUM_SEEDS = 20


@pytest.mark.slow
@pytest.mark.long
def test_enumerable_check_margins_hold_over_seeds(tmp_path):
    """The notebook's enumerable check (30_bolt: 60 BOLT steps at beta = 1 on one prompt's 64 one-token samples, on the
    notebook's 60-step reduced snapshot) over 20 seeds, each its own prompt, reference samples, LoRA init and data
    order: in every seed the model's TV to q-hat*w ends below 0.5 of where it started and below 0.6 of its TV to
    Refit's q-hat*r, the bounds the notebook asserts for seeds 0-4 (measured with the routed GEMMs: largest ratios
    end/start 0.326 (seed 5, which starts at TV 0.065) and end/end_refit 0.44 (seed 3)). 2-7 min on 2 cores."""
    from stalebook.bolt import enumerable_check
    from stalebook.model import TinySpec, ensure_tiny_snapshot

    snap = tmp_path / "tiny"
    ensure_tiny_snapshot(snap, TinySpec(max_steps=60, first_eval=10**9, require_band=False), log=lambda *a: None)
    rel = {}
    for s in range(ENUM_SEEDS):
        c = enumerable_check(snap, tmp_path / f"enum-{s}", steps=60, n_prompts=1, seed=s)
        rel[s] = (c["tv_end"][0] / c["tv_start"][0], c["tv_end"][0] / c["tv_end_refit"][0])
    worst = np.max(list(rel.values()), 0)
    assert worst[0] < 0.5 and worst[1] < 0.6, {s: np.round(r, 3).tolist() for s, r in rel.items()}


def test_bad_input_names_the_file_or_field(tmp_path, tiny_snapshot):
    # beta <= 0: in a config file, and given to the trainer directly
    f = tmp_path / "arm.yaml"
    f.write_text(yaml.safe_dump({"arm": "bolt", "beta": -1.0}))
    with pytest.raises(ConfigError, match=rf"{f}.*beta must be > 0"):
        load_config(BoltConfig, f)
    cfg = TrainConfig(
        out=str(tmp_path / "t"), snapshot=str(tiny_snapshot), objective="sft", steps=2, lineage_steps=(0,)
    )
    with pytest.raises(StalebookError, match="beta must be > 0"):
        reference_trainer(cfg, "bolt", 0.0)
    # a reference dataset sampled by another policy (another LoRA init): refused, naming its manifest
    other, tok = load_run_policy(str(tiny_snapshot), "", "cpu", "float32", seed=1)
    tasks = synthetic_tasks("math", 8, Domain(0, ("tasks", "math", 0)))
    st = reference_store(
        other,
        tok,
        tasks,
        tmp_path / "other",
        1,
        SamplingConfig(group_size=4, max_new_tokens=6, groups_per_batch=4),
        reward_fn=digit_share,
    )
    arm = small_arm(tiny_snapshot, tmp_path / "stores", "bolt", reference=str(st.path))
    with pytest.raises(StalebookError, match=rf"{st.path / 'manifest.json'}: reference dataset was sampled by policy"):
        run_arm(arm, tmp_path / "arm-other", reward_fn=digit_share)
    # an empty group in an otherwise complete store of the right policy: refused, naming the line and the field
    mine, _ = load_run_policy(str(tiny_snapshot), "", "cpu", "float32", seed=0)
    good = reference_store(
        mine,
        tok,
        tasks,
        tmp_path / "mine",
        0,
        SamplingConfig(group_size=4, max_new_tokens=6, groups_per_batch=4),
        reward_fn=digit_share,
    )
    bad = tmp_path / "bad" / good.path.name
    shutil.copytree(good.path, bad)
    lines = (bad / "groups.jsonl").read_text().splitlines()
    rec = json.loads(lines[2])
    rec.update(rewards=[], tokens=[], logp=[], sampler_logp=[], details=[], texts=[])
    lines[2] = json.dumps(rec)
    (bad / "groups.jsonl").write_text("\n".join(lines) + "\n")
    atomic_write_json(bad / "complete.json", dict(n_groups=len(lines), groups_sha256=hash_file(bad / "groups.jsonl")))
    with pytest.raises(
        StalebookError, match=rf"{bad / 'groups.jsonl'}:3: group '{rec['task_id']}' is empty \(field 'rewards'"
    ):
        run_arm(
            small_arm(tiny_snapshot, tmp_path / "stores", "bolt", reference=str(bad)),
            tmp_path / "arm-bad",
            reward_fn=digit_share,
        )
    assert open_reference(good.path, policy_hash(mine)).complete
    with pytest.raises(StalebookError, match="rounds=3 must be >= 1 and divide steps=2"):
        reference_trainer(dataclasses.replace(cfg, out=str(tmp_path / "t3")), "bolt", 0.5, rounds=3)


def test_a_bolt_step_samples_nothing_and_runs_one_forward(tmp_path, tiny_snapshot):
    """Forward passes of the base model in one step: BOLT one (with gradients), GRPO with KL generation + three; the
    verifier is not called."""
    calls = []

    def counted(t, x):
        calls.append(1)
        return digit_share(t, x)

    mk = lambda out, obj, **kw: TrainConfig(
        out=str(tmp_path / out),
        snapshot=str(tiny_snapshot),
        n_tasks=4,
        steps=1,
        prompts_per_step=2,
        objective=obj,
        lineage_steps=(0,),
        micro_batch=64,
        sampling=SamplingConfig(group_size=4, max_new_tokens=6, groups_per_batch=2),
        **kw,
    )
    counts = {}
    for name, tr in (
        ("bolt", reference_trainer(mk("b", "sft"), "bolt", 0.5, reward_fn=counted)),
        ("grpo", Trainer(mk("g", "grpo", kl_beta=0.5), reward_fn=counted)),
    ):
        if name == "bolt":
            tr.data.reference(tr, 0)
        n0, fw = len(calls), []
        h = tr.model.get_base_model().model.register_forward_hook(lambda *a, fw=fw: fw.append(1))
        tr.run(progress=False)
        h.remove()
        counts[name] = (len(fw), len(calls) - n0)
    assert counts["bolt"] == (1, 0), counts
    assert counts["grpo"][0] > 3 and counts["grpo"][1] > 0, counts


def test_reduced_comparison_all_arms_matched_idempotent_resumable(tmp_path, tiny_snapshot):
    stores = tmp_path / "stores"
    res = {
        a: run_arm(small_arm(tiny_snapshot, stores, a), tmp_path / a, log=lambda *x: None, reward_fn=digit_share)
        for a in ARMS
    }
    # matched budget: one prompt schedule, one update count, one LoRA; the step-0 policy and its measurement are shared
    for key in ("prompt_schedule_hash", "optimizer_updates", "lora", "lr", "group_size"):
        assert len({json.dumps(r["budget"][key]) for r in res.values()}) == 1, key
    assert len({json.dumps(r["eval"][0], sort_keys=True) for r in res.values()}) == 1
    for a, r in res.items():
        e0, e1 = r["eval"][0], r["eval"][-1]
        assert e0["heldout"]["kl"] == 0.0 and e0["heldout"]["objective"] == e0["heldout"]["pass_rate"]
        assert e1["heldout"]["kl"] > 0 and e1["policy_hash"] != e0["policy_hash"], a
        assert [e["step"] for e in r["eval"]] == [0, 2, 4]
        tm = json.loads((tmp_path / a / "timings.json").read_text())
        assert tm["phases"]["train"]["seconds"] > 0 and set(tm["cumulative_seconds"]) == {"0", "2", "4"}
    assert (
        res["bolt"]["budget"]["completions_sampled"] == 8 * 4
        and res["grpo"]["budget"]["completions_sampled"] == 4 * 4 * 4
    )
    assert [r["round"] for r in res["iterative"]["reference"]] == [0, 1]
    assert res["iterative"]["reference"][0]["store"] == res["bolt"]["reference"][0]["store"]  # one dataset per pi_ref
    assert res["iterative"]["reference"][1]["policy_hash"] != res["bolt"]["reference"][0]["policy_hash"]
    # idempotent: a finished arm is returned untouched; another config on its folder is refused
    before = (tmp_path / "bolt" / "result.json").read_bytes()
    assert run_arm(small_arm(tiny_snapshot, stores, "bolt"), tmp_path / "bolt", log=lambda *x: None) == res["bolt"]
    assert (tmp_path / "bolt" / "result.json").read_bytes() == before
    with pytest.raises(StalebookError, match="another config"):
        run_arm(small_arm(tiny_snapshot, stores, "refit"), tmp_path / "bolt")
    # resumable: iterative BOLT stopped inside round 1 (its last checkpoint at step 3, round 1's pi_ref at step 2)
    # and continued by run_arm (the round's reference is then found on disk, not resampled) = the uninterrupted arm,
    # byte for byte
    cfg = small_arm(tiny_snapshot, stores, "iterative")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, checkpoint_every=1))
    full = run_arm(cfg, tmp_path / "it-full", log=lambda *x: None, reward_fn=digit_share)
    reference_trainer(
        arm_train_config(cfg, tmp_path / "it-cut"), "bolt", cfg.beta, cfg.rounds, stores, reward_fn=digit_share
    ).run(steps=3, progress=False)
    cut = run_arm(cfg, tmp_path / "it-cut", log=lambda *x: None, reward_fn=digit_share)
    assert cut == full and full["eval"] == res["iterative"]["eval"]
    f = "train/lineage/step-000004/adapter/adapter_model.safetensors"
    assert (tmp_path / "it-cut" / f).read_bytes() == (tmp_path / "it-full" / f).read_bytes()
