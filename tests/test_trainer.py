"""The GRPO+LoRA trainer: SIGKILL resume is bit-identical, the lineage check, objective switches refused, bad configs,
adapters loadable by plain peft, and (slow) the tiny model learns (multi-process, fault injection)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import train_cfg, write_yaml

from stalebook.core import Domain, read_jsonl

EXE = str(Path(sys.executable).parent / "stalebook")
TIMING = {"t_gen", "t_step"}
ROOT = Path(__file__).resolve().parents[1]


def _run(*args, fault=None, timeout=600):
    env = {**os.environ, "STALEBOOK_FAULT": fault or "", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([EXE, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)


# `stalebook train` with a graded reward the reduced snapshot's samples vary in (so that every step moves the adapter
# by construction: the package verifier may give a whole run of zero-advantage groups on the reduced snapshot).
_TRAIN_DIGIT_SHARE = """
import sys
import stalebook
from stalebook.core import load_config
from stalebook.trainer import TrainConfig, Trainer


def digit_share(task, text):
    return (sum(c.isdigit() for c in text) / len(text) if text else 0.0), {}


Trainer(load_config(TrainConfig, sys.argv[1]), reward_fn=digit_share).run(progress=False)
"""


def _run_digit_share(cfg, fault=None, timeout=600):
    env = {**os.environ, "STALEBOOK_FAULT": fault or "", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-c", _TRAIN_DIGIT_SHARE, str(cfg)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _steps(run):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_jsonl(run / "steps.jsonl").records]


# Each kill is a process start (seconds of imports): `full` (6 kills) runs with the slow tests; `quick`, in the default
# run, kills once after a step (resuming from the step-5 checkpoint) and once inside the step-10 checkpoint's write.
@pytest.mark.parametrize(
    "full", [pytest.param(True, marks=pytest.mark.slow, id="full"), pytest.param(False, id="quick")]
)
def test_train_resume_bit_identical_under_sigkill(tmp_path, tiny_snapshot, full):
    ref = train_cfg(tmp_path / "ref", tiny_snapshot)
    r = _run("train", ref, "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    flt = train_cfg(tmp_path / "flt", tiny_snapshot)
    g = Domain(0, ("test", "train-faults")).numpy()
    faults = [f"step:{s}" for s in sorted(g.choice(np.arange(1, 12), 4, replace=False))]
    faults.insert(2, "ckpt:5")
    faults.append("ckpt:10")  # two kills in the middle of a checkpoint write
    faults = sorted(set(faults), key=lambda f: int(f.split(":")[1]) + (0.5 if f.startswith("ckpt") else 0))
    min_kills = 5
    if not full:
        faults, min_kills = ["step:6", "ckpt:10"], 2
    kills = 0
    for f in faults:
        r = _run("train", flt, "--quiet", fault=f)
        if r.returncode == -9:
            kills += 1
        else:
            assert r.returncode == 0, r.stderr[-2000:]
    assert kills >= min_kills, f"only {kills} kills landed ({faults})"
    r = _run("train", flt, "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = tmp_path / "ref" / "run", tmp_path / "flt" / "run"
    for rel in [
        "ckpt/step-000012/adapter/adapter_model.safetensors",
        "lineage/step-000010/adapter/adapter_model.safetensors",
        "lineage.json",
    ]:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    for f in ["state.safetensors", "state.json"]:  # optimizer, scheduler, RNG state
        assert (a / "ckpt/step-000012" / f).read_bytes() == (b / "ckpt/step-000012" / f).read_bytes(), f
    from safetensors.torch import load_file

    st = load_file(str(a / "ckpt/step-000012/state.safetensors"))
    assert (
        any(k.endswith("exp_avg_sq") for k in st)
        and float(max(v.abs().max() for k, v in st.items() if "exp_avg" in k)) > 0
    )
    assert _steps(a) == _steps(b) and len(_steps(a)) == 12
    from stalebook.trainer import check_lineage

    assert check_lineage(a) == [] and check_lineage(b) == []


def test_lineage_check_detects_broken_chain(tmp_path, tiny_snapshot):
    cfgp = train_cfg(tmp_path, tiny_snapshot, steps=6, lineage_steps=[0, 5])
    r = _run("train", cfgp, "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    from stalebook.trainer import check_lineage

    run = tmp_path / "run"
    assert check_lineage(run) == []
    lin = json.loads((run / "lineage.json").read_text())
    assert [c["step"] for c in lin["chain"]] == [0, 5, 6]
    bad = dict(lin)
    bad["chain"] = [dict(c) for c in lin["chain"]]
    bad["chain"][1]["parent"] = "0" * 64
    (run / "lineage.json").write_text(json.dumps(bad))
    assert any("parent" in p for p in check_lineage(run))
    (run / "lineage.json").write_text(json.dumps(lin))
    f = run / "lineage" / "step-000005" / "meta.json"
    f.write_text(f.read_text().replace('"step": 5', '"step": 55'))
    assert any("content hash" in p for p in check_lineage(run))


def test_objective_switch_refused(tmp_path, tiny_snapshot, cli):
    cfgp = train_cfg(tmp_path, tiny_snapshot, steps=2, lineage_steps=[0])
    assert _run("train", cfgp, "--quiet").returncode == 0
    cfg = yaml.safe_load(cfgp.read_text())
    cfg["objective"] = "sft"
    cfgp.write_text(yaml.safe_dump(cfg))
    r = cli("train", cfgp, "--quiet")
    assert r.returncode == 2 and "objective" in r.stderr and r.stderr.count("\n") == 1


def test_bad_train_config_one_line_error(tmp_path, cli):
    p = write_yaml(tmp_path / "bad.yaml", {"out": str(tmp_path / "r"), "stepz": 3})
    r = cli("train", p)
    assert (
        r.returncode == 2 and "unknown field 'stepz'" in r.stderr and str(p) in r.stderr and r.stderr.count("\n") == 1
    )
    assert not (tmp_path / "r").exists()


PEFT_LOAD = """
import sys, json, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import PeftModel
snap, ad, prompt, comp = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
tok = AutoTokenizer.from_pretrained(snap)
m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(snap, local_files_only=True), ad).eval()
ids = tok(prompt).input_ids
x = torch.tensor([ids + comp])
with torch.no_grad(): lp = m(input_ids=x).logits[0, len(ids) - 1:-1].log_softmax(-1)
print(json.dumps(lp.gather(1, torch.tensor(comp)[:, None]).squeeze(1).tolist()))
"""


def test_adapter_loads_with_plain_peft_in_fresh_process(tmp_path, tiny_snapshot):
    cfgp = train_cfg(tmp_path, tiny_snapshot, steps=3, lineage_steps=[0])
    assert _run("train", cfgp, "--quiet").returncode == 0
    ck = tmp_path / "run" / "ckpt" / "step-000003"
    from stalebook.rollouts import completion_logprobs, load_run_policy

    m, tok = load_run_policy(str(tiny_snapshot), str(ck), "cpu", "float32")
    m.eval()
    prompt, comp = "12+7=", tok("19").input_ids[-2:] + [tok.eos_token_id]
    with torch.no_grad():
        lp, mk = completion_logprobs(m, [tok(prompt).input_ids], [comp])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", PEFT_LOAD, str(tiny_snapshot), str(ck / "adapter"), prompt, json.dumps(comp)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    np.testing.assert_allclose(json.loads(r.stdout.strip().splitlines()[-1]), lp[0, mk[0]].numpy(), rtol=0, atol=1e-6)


def _learn_tiny():
    if str(ROOT / "benchmarks") not in sys.path:  # its shared arguments (benchmarks/benchargs.py), as when run
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("learn_tiny", ROOT / "benchmarks" / "learn_tiny.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_pooled_group_stats_matches_direct():
    "The start/end SE reconstructed from per-step (mean, SE, n) equals the SE computed from the group means."
    import numpy as np

    g = np.random.default_rng(0)
    groups = [g.random(int(n)) for n in g.integers(2, 9, 7)]
    recs = [
        dict(n_groups=len(x), reward_mean=float(x.mean()), reward_se=float(x.std(ddof=1) / math.sqrt(len(x))))
        for x in groups
    ]
    allg = np.concatenate(groups)
    mu, se, n = _learn_tiny().pooled_group_stats(recs)
    assert n == len(allg) and abs(mu - allg.mean()) < 1e-12
    assert abs(se - allg.std(ddof=1) / math.sqrt(len(allg))) < 1e-12


@pytest.mark.slow
@pytest.mark.long
def test_grpo_raises_math_reward(tmp_path):
    from stalebook.core import load_config
    from stalebook.model import default_snapshot
    from stalebook.trainer import TrainConfig, Trainer

    lt = _learn_tiny()
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        snap = default_snapshot(log=lambda *a: None)  # the full warm-started tiny snapshot (built once)
        cfg = load_config(
            TrainConfig,
            ROOT / "configs" / "tiny" / "train-math.yaml",
            overrides=dict(out=str(tmp_path / "run"), snapshot=str(snap), steps=100, lineage_steps=[0, 100]),
        )
        recs = Trainer(cfg).run(progress=False).log.records
    finally:
        torch.set_num_threads(old)
    assert len(recs) == 100
    s = lt.train_summary(recs, 10)
    print(
        f"math reward first 10 steps {s['start']:.3f} ± {s['start_se']:.3f} "
        f"-> last 10 {s['end']:.3f} ± {s['end_se']:.3f}; "
        f"zero-advantage groups {s['zero_adv_total']}/{s['groups_total']}"
    )
    assert s["diff"] > 2 * s["diff_se"], s
    assert 0 < s["zero_adv_total"] < s["groups_total"]  # counted, and not every group is homogeneous


# ---------------------------------------------------------------- asynchronous GRPO
SYNC_KEYS = {
    "step",
    "policy_hash",
    "objective",
    "reward_mean",
    "reward_se",
    "zero_adv_groups",
    "n_groups",
    "loss",
    "grad_norm",
    "n_tokens",
    "lr",
    "clip_epsilon",
    "loss_agg",
    "t_gen",
    "t_step",
    "ratio_max_dev",
}


def _files(run):
    "Every file of a run directory (relative path -> bytes), the run's own absolute path removed from config.yaml."
    out = {}
    for p in sorted(run.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(run))] = p.read_bytes().replace(str(run).encode(), b"<run>")
    return out


def _drop_identity(f: dict, keys=("numerics", "parent", "hash")) -> dict:
    """`_files` with `keys` removed from checkpoint meta.json and lineage.json (and their chain entries): for runs of
    trainers from before a key existed (the numerics a run computes in, since the pinned numerics; the chain's
    hashes follow from meta.json)."""
    for k in [k for k in f if k.endswith("meta.json") or k == "lineage.json"]:
        d = json.loads(f[k])
        for e in [d, *d.get("chain", [])]:
            for key in keys:
                e.pop(key, None)
        f[k] = d
    return f


def test_staleness_zero_is_the_synchronous_trainer(tmp_path, tiny_snapshot):
    """S = 0 byte for byte: a run whose config has no async_training / optimizer fields (what the synchronous trainer
    was configured with) and one that spells them out at S = 0 write the same files — steps.jsonl (timing keys aside),
    config.yaml (run path aside), every checkpoint byte, lineage.json — with no async state and no new step keys."""
    a = train_cfg(tmp_path / "absent", tiny_snapshot, steps=6, lineage_steps=[0, 5])
    b = train_cfg(
        tmp_path / "explicit",
        tiny_snapshot,
        steps=6,
        lineage_steps=[0, 5],
        optimizer="adamw",
        async_training=dict(staleness=0, mode="fixed-lag", correction="none", level="token", clip_epsilon_high=None),
    )
    for c in (a, b):
        r = _run("train", c, "--quiet")
        assert r.returncode == 0, r.stderr[-2000:]
    ra, rb = tmp_path / "absent" / "run", tmp_path / "explicit" / "run"
    fa, fb = _files(ra), _files(rb)
    fa.pop("steps.jsonl")
    fb.pop("steps.jsonl")
    assert fa == fb and len(fa) > 10
    assert _steps(ra) == _steps(rb) and len(_steps(ra)) == 6
    assert all(set(r) == SYNC_KEYS for r in read_jsonl(rb / "steps.jsonl").records)
    assert not any("async" in f for f in fb) and "async_training" not in fb["config.yaml"].decode()


def _recs(cfg):
    from stalebook.trainer import Trainer

    return Trainer(cfg).run(progress=False).log.records


def test_async_lags_and_ratios(tmp_path, shipped_snapshot):
    """fixed-lag: lag exactly S after warm-up; sync-every: lags cycle 1..S; ratios differ from 1 once the lag is
    positive. On the shipped (warm-started) snapshot: the reduced one rarely earns a reward, so its learner may
    not move at all on some machines."""
    tiny_snapshot = shipped_snapshot
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import AsyncConfig, TrainConfig, lag_histogram

    mk = lambda name, **a: TrainConfig(
        out=str(tmp_path / name),
        snapshot=str(tiny_snapshot),
        n_tasks=16,
        steps=10,
        prompts_per_step=3,
        sampling=SamplingConfig(group_size=4, max_new_tokens=8),
        lineage_steps=(0,),
        lr=0.01,
        async_training=AsyncConfig(**a),
    )
    fl = _recs(mk("fl", staleness=3, mode="fixed-lag"))
    assert [r["lag"] for r in fl] == [0, 1, 2, 3, 3, 3, 3, 3, 3, 3] and [r["behaviour_step"] for r in fl[3:]] == list(
        range(7)
    )
    se = _recs(mk("se", staleness=4))
    assert [r["lag"] for r in se] == [0, 1, 2, 3, 1, 2, 3, 4, 1, 2] and lag_histogram(se) == {
        0: 1,
        1: 3,
        2: 3,
        3: 2,
        4: 1,
    }
    for recs in (fl, se):
        assert recs[0]["logr_max_abs"] < 1e-5 and recs[0]["lag_dist"] == 0.0
        moved = [r for r in recs if r["lag"] > 0 and r["lag_dist"] > 1e-3]  # the learner moved away from phi
        assert len(moved) >= 5 and all(r["logr_max_abs"] > 1e-5 and r["ratio_max_dev"] > 1e-5 for r in moved)
        assert all(r["kl_behav_k3"] >= 0 and 0 < r["is_ess_frac"] <= 1 + 1e-12 for r in recs)
        # a step's behaviour policy hash is the hash the learner had at its source step
        assert all(
            r["policy_hash"] == recs[r["behaviour_step"]]["policy_hash"]
            for r in recs
            if r["lag"] == r["step"] - r["behaviour_step"] and recs[r["behaviour_step"]]["lag"] == 0
        )
    tr = _recs(mk("tr", staleness=2, mode="fixed-lag", correction="truncate", level="sequence", is_threshold=1.5))
    assert all(r["ratio_max_dev"] == 0.0 and r["clip_frac"] == 0.0 for r in tr)  # decoupled: the PPO ratio is 1


# slow (40 s here: 9 processes); the default run resumes a fixed-lag run in nbs/26_trainer and kills a synchronous
# one in test_train_resume_bit_identical_under_sigkill[quick]
@pytest.mark.slow
def test_async_resume_bit_identical_under_sigkill(tmp_path, tiny_snapshot):
    """A fixed-lag S = 3 run killed 7 times — after steps and inside checkpoint writes — ends bit-identical. The reward
    is graded (`digit_share`), so every step moves the adapter: the resumes from the step-10 and step-15 checkpoints
    need behaviour snapshots that differ from theta_0 and from each other, on any CPU."""
    kw = dict(async_training=dict(staleness=3, mode="fixed-lag"), steps=16, lineage_steps=[0, 5, 10, 15])
    ref = train_cfg(tmp_path / "ref", tiny_snapshot, **kw)
    r = _run_digit_share(ref)
    assert r.returncode == 0, r.stderr[-2000:]
    flt = train_cfg(tmp_path / "flt", tiny_snapshot, **kw)
    faults = ["step:3", "ckpt:5", "step:8", "ckpt:10", "step:12", "ckpt:15", "step:15"]
    kills = 0
    for f in faults:
        r = _run_digit_share(flt, fault=f)
        if r.returncode == -9:
            kills += 1
        else:
            assert r.returncode == 0, r.stderr[-2000:]
    assert kills >= 5, f"only {kills} kills landed ({faults})"
    r = _run_digit_share(flt)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = tmp_path / "ref" / "run", tmp_path / "flt" / "run"
    for rel in [
        "ckpt/step-000016/adapter/adapter_model.safetensors",
        "ckpt/step-000016/state.safetensors",
        "ckpt/step-000016/async.safetensors",
        "lineage/step-000015/async.safetensors",
        "lineage.json",
    ]:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    from safetensors.torch import load_file

    st = load_file(str(a / "lineage/step-000015/async.safetensors"))
    snaps = sorted({int(k.split(".")[1]) for k in st if k.startswith("snap.")})
    assert snaps == [12, 13, 14, 15]  # theta_{t-3} .. theta_t
    flat = {s: torch.cat([v.reshape(-1) for k, v in sorted(st.items()) if k.startswith(f"snap.{s}.")]) for s in snaps}
    assert all(not torch.equal(flat[s], flat[s + 1]) for s in snaps[:-1])  # a non-trivial behaviour state
    ref_steps = _steps(a)
    assert _steps(a) == _steps(b) and len(ref_steps) == 16 and [r["lag"] for r in ref_steps][3:] == [3] * 13
    assert all(r["update_norm"] > 0 for r in ref_steps[10:]) and all(r["logr_max_abs"] > 1e-5 for r in ref_steps[10:])


def _offpolicy_inputs(seed=0, B=6, L=7):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(L)[None, :] < torch.randint(1, L + 1, (B,), generator=g)[:, None]
    theta = -torch.rand(B, L, generator=g) * 3  # log pi_theta (the trainer's, "old" in TRL)
    phi = theta + torch.randn(B, L, generator=g) * 0.4  # log pi_phi (the sampler's)
    return theta * mask, phi * mask, mask


def test_trl_importance_sampling_matches():
    """TRL's vLLM importance-sampling correction on identical inputs (TRL is not installed: its expression is quoted
    from huggingface/trl @ f2cd57710ae345ea6428ae95363267fcf38a3dc8, trl/trainer/grpo_trainer.py, lines 2581-2619):

        2581  per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
        2583  sequence_level_is = self.vllm_importance_sampling_mode in ["sequence_mask", "sequence_truncate"]
        2585      per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
        2590  vllm_importance_sampling_ratio = torch.exp(logps_diff)
        2596  if self.vllm_importance_sampling_mode in ["sequence_truncate", "token_truncate"]:
        2597      vllm_importance_sampling_ratio = torch.clamp(vllm_importance_sampling_ratio,
        2599          min=self.vllm_importance_sampling_clip_min, max=self.vllm_importance_sampling_clip_max)
        2602  elif self.vllm_importance_sampling_mode in ["sequence_mask", "token_mask"]:
                                                                   (min_val = -inf, max_val = clip_max)
        2614      invalid_mis_mask = (vllm_importance_sampling_ratio < min_val) |
                                     (vllm_importance_sampling_ratio > max_val)
        2617      vllm_importance_sampling_ratio = vllm_importance_sampling_ratio.masked_fill(invalid_mis_mask,
                                                                                              value=0.0)

    and applied as `per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]` (line 3118) before the masked
    aggregation, so TRL's effective per-token weight is that ratio times the mask. GSPO's sequence ratio (line 3058):
    `log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)`."""
    import math

    from stalebook.objectives import is_weights, level_log_ratio

    for seed in range(5):
        old, sampling, mask = _offpolicy_inputs(seed)
        cap = 1.0
        diff = (old - sampling) * mask
        for mode in ("sequence_mask", "sequence_truncate", "token_mask", "token_truncate"):
            lr = diff.sum(dim=-1, keepdim=True) if mode.startswith("sequence") else diff
            ratio = torch.exp(lr)
            if mode.endswith("truncate"):
                ratio = torch.clamp(ratio, min=None, max=cap)
            else:
                ratio = ratio.masked_fill((ratio < -math.inf) | (ratio > cap), value=0.0)
            trl = ratio * mask
            level, corr = mode.split("_")
            ours = is_weights(old - sampling, mask, "mask" if corr == "mask" else "truncate", level, cap)
            torch.testing.assert_close(ours, trl.expand_as(ours), rtol=0, atol=1e-6)
        z = is_weights(old - sampling, mask, "mask", "sequence", cap)[:, 0] == 0
        if seed == 0:
            assert 0 < z.sum() < len(z)  # the example masks some responses, not all
        gspo = ((old - sampling) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        torch.testing.assert_close(level_log_ratio(old - sampling, mask, "geometric")[:, 0], gspo)


def test_verl_rollout_is_matches():
    """verl's `rollout_is` weights on identical inputs (volcengine/verl @ b178a3cd56f58b2d502255daba591e92833930a7,
    verl/trainer/ppo/rollout_corr_helper.py, compute_rollout_correction_weights, lines 533-562):

        533  log_ratio_safe = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)  # token; SAFETY_BOUND = 20
        534  rollout_is_weights = torch.exp(log_ratio_safe)
        538  log_ratio_sum = verl_F.masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)  # sequence
        543  log_ratio_sum_safe = torch.clamp(log_ratio_sum, min=-SAFETY_BOUND, max=SAFETY_BOUND)
        544  rollout_is_weights = torch.exp(log_ratio_sum_safe).expand_as(log_ratio)
        550  rollout_is_weights = rollout_is_weights * response_mask
        562  rollout_is_weights = rollout_is_weights.clamp(max=rollout_is_threshold)

    (log_ratio = log pi_train - log pi_rollout). Inside the safety bound stalebook's `truncate` weights are the same."""
    from stalebook.objectives import is_weights

    for seed in range(5):
        train, rollout, mask = _offpolicy_inputs(seed)
        lr = train - rollout
        for level in ("token", "sequence"):
            if level == "token":
                w = torch.exp(torch.clamp(lr, min=-20, max=20))
            else:
                w = torch.exp(torch.clamp((lr * mask).sum(-1).unsqueeze(-1), min=-20, max=20)).expand_as(lr)
            verl = (w * mask).clamp(max=2.0)
            torch.testing.assert_close(is_weights(lr, mask, "truncate", level, 2.0), verl, rtol=0, atol=1e-6)


def test_offpolicy_loss_gradients_against_autograd_of_the_definition():
    "Each correction's gradient equals -agg(w A grad log pi) (decoupled) or PPO-clip's (none), computed independently."
    from stalebook.objectives import is_weights, offpolicy_grpo_loss

    theta, phi, mask = _offpolicy_inputs(3)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0, 0.3, 0.0])
    n = mask.sum()
    for corr in ("truncate", "mask"):
        for level in ("token", "sequence", "geometric"):
            t = theta.clone().requires_grad_(True)
            offpolicy_grpo_loss(t, phi, adv, mask, corr, level, 1.5)[0].backward()
            w = is_weights(theta - phi, mask, corr, level, 1.5)
            torch.testing.assert_close(t.grad, -(w * adv[:, None]) * mask / n)
    t = theta.clone().requires_grad_(True)
    offpolicy_grpo_loss(t, phi, adv, mask, "none", "token", clip_epsilon=0.2, clip_epsilon_high=0.28)[0].backward()
    r = torch.exp(theta - phi)
    active = torch.where(adv[:, None] > 0, r < 1.28, r > 0.8)  # PPO: the clip zeroes the gradient outside
    torch.testing.assert_close(t.grad, -(r * adv[:, None] * active) * mask / n)


def test_bad_async_config_one_line_error(tmp_path, cli):
    p = write_yaml(
        tmp_path / "bad.yaml", {"out": str(tmp_path / "r"), "async_training": {"staleness": 2, "mode": "lagged"}}
    )
    r = cli("train", p)
    assert r.returncode == 2 and "async_training.mode" in r.stderr and r.stderr.count("\n") == 1
    p = write_yaml(
        tmp_path / "bad2.yaml", {"out": str(tmp_path / "r"), "async_training": {"staleness": 0, "correction": "mask"}}
    )
    r = cli("train", p)
    assert r.returncode == 2 and "correction must stay at the default" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "r").exists()


def _trainer_at(commit: str, tmp_path):
    """stalebook/trainer.py as it was at `commit` (read from git, imported against today's other modules); skip without
    history."""
    r = subprocess.run(["git", "show", f"{commit}:stalebook/trainer.py"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"git history with {commit} not available")
    import importlib
    import re

    name = f"trainer_{commit}"
    src = re.sub(r"^from \.([\w.]+) import", r"from stalebook.\1 import", r.stdout, flags=re.M)
    # every optimizer step is fused AdamW now (the non-fused one takes a vendor-dependent sqrt): the old trainer too,
    # so that what is compared is what the test is about
    assert src.count("torch.optim.AdamW(") == 1
    src = src.replace("torch.optim.AdamW(", "torch.optim.AdamW(fused=True, params=")
    (tmp_path / f"{name}.py").write_text(src)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


@pytest.mark.slow
@pytest.mark.long
def test_staleness_zero_matches_the_pre_async_trainer(tmp_path, tiny_snapshot):
    """S = 0 against the synchronous trainer as it was before asynchrony existed (commit a91f1ef's stalebook/trainer.py,
    read from git; skipped when that history is not available): same step log and the same bytes in every file but
    the run-identity hashes (defined differently since)."""
    old = _trainer_at("a91f1ef", tmp_path)
    import stalebook.trainer as new
    from stalebook.rollouts import SamplingConfig

    kw = dict(
        snapshot=str(tiny_snapshot),
        n_tasks=16,
        steps=12,
        prompts_per_step=3,
        sampling=SamplingConfig(group_size=4, max_new_tokens=8),
        lineage_steps=(0, 5, 10),
        kl_beta=0.05,
        lr=0.01,
    )
    old.Trainer(old.TrainConfig(out=str(tmp_path / "old"), **kw)).run(progress=False)
    new.Trainer(new.TrainConfig(out=str(tmp_path / "new"), **kw)).run(progress=False)
    fa, fb = _files(tmp_path / "old"), _files(tmp_path / "new")
    assert _steps(tmp_path / "old") == _steps(tmp_path / "new")
    fa.pop("steps.jsonl")
    fb.pop("steps.jsonl")
    # the run identity in meta.json (and through it the chain's hashes) is defined differently since then: the
    # snapshot's lockfile revision instead of its folder. Everything else, weights and optimizer state included: the
    # same bytes.
    for f in (fa, fb):
        _drop_identity(f, ("config_hash", "numerics", "parent", "hash"))
    assert fa == fb, [k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)]


@pytest.mark.parametrize("case", ["kl-split-groups", "seq-mean-async-truncate"])
def test_micro_batch_backward_writes_the_bytes_of_one_backward(tmp_path, tiny_snapshot, case):
    """The learner runs its micro-batches forward and backward one at a time, last first, each waiting for its own
    groups' rewards. Against the trainer before that change (c36d6fd's, read from git: one backward through the whole
    batch's graph), on code batches of several micro-batches — one that splits groups, with the KL term; one with
    seq-mean, sequence-level truncated IS and a lag — every file of the run is the same bytes."""
    old = _trainer_at("c36d6fd", tmp_path)
    import stalebook.trainer as new
    from stalebook.rollouts import SamplingConfig

    kw = dict(
        snapshot=str(tiny_snapshot),
        n_tasks=16,
        steps=8,
        prompts_per_step=6,
        lineage_steps=(0, 8),
        lr=0.02,
        sampling=SamplingConfig(group_size=4, max_new_tokens=8),
        domain="code",
    )
    if case.startswith("kl"):
        kw.update(kl_beta=0.05, micro_batch=6)  # rows 0-5 | 6-11 | ...: group 1 spans two
    else:
        kw.update(
            micro_batch=8,
            loss_agg="seq-mean",
            async_training=dict(
                staleness=2, mode="fixed-lag", correction="truncate", level="sequence", is_threshold=1.5
            ),
        )

    def mk(m, name):
        k = dict(kw, out=str(tmp_path / name))
        if "async_training" in k:
            k["async_training"] = m.AsyncConfig(**k["async_training"])
        return m.TrainConfig(**k)

    old.Trainer(mk(old, "old")).run(progress=False)
    b = new.Trainer(mk(new, "new")).run(progress=False)
    assert len(b.log.records) == 8 and len({r["policy_hash"] for r in b.log.records}) > 1  # the weights moved
    fa, fb = _drop_identity(_files(tmp_path / "old")), _drop_identity(_files(tmp_path / "new"))
    assert _steps(tmp_path / "old") == _steps(tmp_path / "new")
    fa.pop("steps.jsonl")
    fb.pop("steps.jsonl")
    assert fa == fb and len(fa) > 10, [k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)]


def test_code_steps_verify_in_a_verifier_process_and_its_death_is_an_error(tmp_path, tiny_snapshot):
    """A code run's programs are verified by a VerifierProcess (another interpreter) with one fork server per core the
    model leaves; killed between steps, the next step fails naming it and logs nothing, and a new Trainer on the
    directory resumes and finishes with the bytes of a run that was never disturbed."""
    import os
    import signal

    from stalebook import sandbox
    from stalebook.core import StalebookError
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import TrainConfig, Trainer, verifier_workers

    kw = dict(
        snapshot=str(tiny_snapshot),
        domain="code",
        n_tasks=16,
        steps=4,
        prompts_per_step=3,
        checkpoint_every=2,
        sampling=SamplingConfig(group_size=4, max_new_tokens=8),
        lineage_steps=(0, 4),
        lr=0.02,
    )
    Trainer(TrainConfig(out=str(tmp_path / "straight"), **kw)).run(progress=False)
    tr = Trainer(TrainConfig(out=str(tmp_path / "killed"), **kw)).run(steps=2, progress=False)
    vp = tr.data.verifier_proc
    assert vp is not None and vp.p.pid != os.getpid() and vp.p.poll() is None
    assert vp.workers == verifier_workers(1) == max(1, sandbox.cores() - 1)
    os.kill(vp.p.pid, signal.SIGKILL)
    vp.p.wait()
    with pytest.raises(StalebookError, match="verifier process exited"):
        tr.run(progress=False)
    assert tr.step == 2 and len(read_jsonl(tmp_path / "killed" / "steps.jsonl").records) == 2
    Trainer(TrainConfig(out=str(tmp_path / "killed"), **kw)).run(progress=False)
    fa, fb = _files(tmp_path / "straight"), _files(tmp_path / "killed")
    assert _steps(tmp_path / "straight") == _steps(tmp_path / "killed")
    fa.pop("steps.jsonl")
    fb.pop("steps.jsonl")
    assert fa == fb and len(fa) > 10


def test_shared_prefix_off_is_the_identity_it_had_before(tmp_path, tiny_snapshot):
    """`shared_prefix` is a field added after runs were recorded: at its default every run keeps the identity, config
    hash and config.yaml it had under the trainer before the field existed (abaab16's, read from git); set, it is
    another run."""
    old = _trainer_at("abaab16", tmp_path)
    import stalebook.trainer as new
    from stalebook.core import config_hash

    kw = dict(snapshot=str(tiny_snapshot), domain="code", steps=40, lineage_steps=(0, 40), kl_beta=0.05)
    a, b = old.TrainConfig(out=str(tmp_path / "a"), **kw), new.TrainConfig(out=str(tmp_path / "a"), **kw)
    assert "shared_prefix" not in old.TrainConfig.__dataclass_fields__
    assert new.run_identity(b) == old.run_identity(a) and config_hash(b) == config_hash(a)
    old.save_run_config(a, tmp_path / "old.yaml")
    new.save_run_config(b, tmp_path / "new.yaml")
    assert (tmp_path / "old.yaml").read_bytes() == (tmp_path / "new.yaml").read_bytes()
    on = new.TrainConfig(out=str(tmp_path / "a"), shared_prefix=True, **kw)
    assert (
        new.run_identity(on) != new.run_identity(b)
        and "shared_prefix: true" in new.save_run_config(on, tmp_path / "on.yaml").read_text()
    )


def test_shared_prefix_run_resumes_bit_identical_and_verifies_on_a_thread(tmp_path, tiny_snapshot):
    """A shared-prefix run stopped after step 3 and resumed by a new Trainer writes the bytes of a straight run; the PPO
    ratio is exactly 1 (behaviour and gradient passes are the same function); the rewards are computed on the
    trainer's verifier thread; a verifier error reaches the caller with its message and leaves no step behind."""
    import threading

    from stalebook.rollouts import SamplingConfig
    from stalebook.tasks import reward
    from stalebook.trainer import TrainConfig, Trainer

    seen = set()

    def verifier(task, text):
        seen.add(threading.current_thread().name)
        return reward(task, text)

    kw = dict(
        snapshot=str(tiny_snapshot),
        n_tasks=16,
        steps=6,
        prompts_per_step=3,
        sampling=SamplingConfig(group_size=4, max_new_tokens=8),
        lineage_steps=(0, 5),
        checkpoint_every=3,
        lr=0.01,
        shared_prefix=True,
    )
    Trainer(TrainConfig(out=str(tmp_path / "straight"), **kw), reward_fn=verifier).run(progress=False)
    Trainer(TrainConfig(out=str(tmp_path / "resumed"), **kw), reward_fn=verifier).run(steps=3, progress=False)
    Trainer(TrainConfig(out=str(tmp_path / "resumed"), **kw), reward_fn=verifier).run(progress=False)
    fa, fb = _files(tmp_path / "straight"), _files(tmp_path / "resumed")
    assert _steps(tmp_path / "straight") == _steps(tmp_path / "resumed") and len(_steps(tmp_path / "resumed")) == 6
    fa.pop("steps.jsonl")
    fb.pop("steps.jsonl")
    assert fa == fb and len(fa) > 10
    assert all(r["ratio_max_dev"] == 0.0 for r in _steps(tmp_path / "straight"))
    assert seen == {"stalebook-verifier_0"}

    def broken(task, text):
        raise RuntimeError("verifier exploded")

    tr = Trainer(TrainConfig(out=str(tmp_path / "broken"), **kw), reward_fn=broken)
    with pytest.raises(RuntimeError, match="verifier exploded"):
        tr.train_step()
    log = tmp_path / "broken" / "steps.jsonl"
    assert tr.step == 0 and (not log.exists() or read_jsonl(log).records == [])


def test_a_trainer_process_keeps_the_memory_it_frees(tmp_path, tiny_snapshot):
    """Building a Trainer sets up its process (`compute_setup`): freed blocks stay in the heap, so buffers allocated
    again step after step are not page-faulted in afresh. Compared with the same process that builds no Trainer (glibc
    only)."""
    import platform

    if not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"):
        pytest.skip("glibc's mallopt only")
    script = f"""
import resource, sys, torch
from stalebook.trainer import Trainer, TrainConfig
if sys.argv[1] == "trainer":
    Trainer(TrainConfig(out={str(tmp_path / "run")!r}, snapshot={str(tiny_snapshot)!r}, steps=1, lineage_steps=(0,)))
def faults():
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20): torch.empty(48 << 18).fill_(1.0)       # 48 MiB, written, freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
faults(); print(faults())
"""
    got = {
        m: int(
            subprocess.run(
                [sys.executable, "-c", script, m], capture_output=True, text=True, check=True
            ).stdout.split()[-1]
        )
        for m in ("plain", "trainer")
    }
    assert got["plain"] > 20 * 10_000 and got["trainer"] < 1_000, got  # 12,288 pages per block, each time / none
