"""The GRPO+LoRA trainer: SIGKILL resume is bit-identical, the lineage check, objective switches refused, bad configs,
adapters loadable by plain peft, and (slow) the tiny model learns (multi-process, fault injection)."""
import importlib.util, json, math, os, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from stalebook.core import Domain, read_jsonl

EXE = str(Path(sys.executable).parent / "stalebook")
TIMING = {"t_gen", "t_step"}
ROOT = Path(__file__).resolve().parents[1]


def _write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(obj))
    return path


def _run(*args, fault=None, timeout=600):
    env = {**os.environ, "STALEBOOK_FAULT": fault or "", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([EXE, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)


def _train_cfg(root, snap, **kw):
    cfg = dict(out=str(root / "run"), snapshot=str(snap), domain="math", n_tasks=24, steps=12, prompts_per_step=3,
               sampling=dict(group_size=4, max_new_tokens=8, groups_per_batch=3), lineage_steps=[0, 5, 10],
               checkpoint_every=5, lr=0.01)
    cfg.update(kw)
    return _write(root / "train.yaml", cfg)


def _steps(run):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_jsonl(run / "steps.jsonl").records]


def test_train_resume_bit_identical_under_sigkill(tmp_path, tiny_snapshot):
    ref = _train_cfg(tmp_path / "ref", tiny_snapshot)
    r = _run("train", ref, "--quiet"); assert r.returncode == 0, r.stderr[-2000:]
    flt = _train_cfg(tmp_path / "flt", tiny_snapshot)
    g = Domain(0, ("test", "train-faults")).numpy()
    faults = [f"step:{s}" for s in sorted(g.choice(np.arange(1, 12), 4, replace=False))]
    faults.insert(2, "ckpt:5"); faults.append("ckpt:10")     # two kills in the middle of a checkpoint write
    faults = sorted(set(faults), key=lambda f: int(f.split(":")[1]) + (0.5 if f.startswith("ckpt") else 0))
    kills = 0
    for f in faults:
        r = _run("train", flt, "--quiet", fault=f)
        if r.returncode == -9: kills += 1
        else: assert r.returncode == 0, r.stderr[-2000:]
    assert kills >= 5, f"only {kills} kills landed ({faults})"
    r = _run("train", flt, "--quiet"); assert r.returncode == 0, r.stderr[-2000:]
    a, b = tmp_path / "ref" / "run", tmp_path / "flt" / "run"
    for rel in ["ckpt/step-000012/adapter/adapter_model.safetensors", "lineage/step-000010/adapter/adapter_model.safetensors",
                "lineage.json"]:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    for f in ["state.safetensors", "state.json"]:                       # optimizer, scheduler, RNG state
        assert (a / "ckpt/step-000012" / f).read_bytes() == (b / "ckpt/step-000012" / f).read_bytes(), f
    from safetensors.torch import load_file
    st = load_file(str(a / "ckpt/step-000012/state.safetensors"))
    assert any(k.endswith("exp_avg_sq") for k in st) and float(max(v.abs().max() for k, v in st.items() if "exp_avg" in k)) > 0
    assert _steps(a) == _steps(b) and len(_steps(a)) == 12
    from stalebook.trainer import check_lineage
    assert check_lineage(a) == [] and check_lineage(b) == []


def test_lineage_check_detects_broken_chain(tmp_path, tiny_snapshot):
    cfgp = _train_cfg(tmp_path, tiny_snapshot, steps=6, lineage_steps=[0, 5])
    r = _run("train", cfgp, "--quiet"); assert r.returncode == 0, r.stderr[-2000:]
    from stalebook.trainer import check_lineage
    run = tmp_path / "run"
    assert check_lineage(run) == []
    lin = json.loads((run / "lineage.json").read_text())
    assert [c["step"] for c in lin["chain"]] == [0, 5, 6]
    bad = dict(lin); bad["chain"] = [dict(c) for c in lin["chain"]]; bad["chain"][1]["parent"] = "0" * 64
    (run / "lineage.json").write_text(json.dumps(bad))
    assert any("parent" in p for p in check_lineage(run))
    (run / "lineage.json").write_text(json.dumps(lin))
    f = run / "lineage" / "step-000005" / "meta.json"; f.write_text(f.read_text().replace('"step": 5', '"step": 55'))
    assert any("content hash" in p for p in check_lineage(run))


def test_objective_switch_refused(tmp_path, tiny_snapshot):
    cfgp = _train_cfg(tmp_path, tiny_snapshot, steps=2, lineage_steps=[0])
    assert _run("train", cfgp, "--quiet").returncode == 0
    cfg = yaml.safe_load(cfgp.read_text()); cfg["objective"] = "sft"; cfgp.write_text(yaml.safe_dump(cfg))
    r = _run("train", cfgp, "--quiet")
    assert r.returncode == 2 and "objective" in r.stderr and r.stderr.count("\n") == 1


def test_bad_train_config_one_line_error(tmp_path):
    p = _write(tmp_path / "bad.yaml", {"out": str(tmp_path / "r"), "stepz": 3})
    r = _run("train", p)
    assert r.returncode == 2 and "unknown field 'stepz'" in r.stderr and str(p) in r.stderr and r.stderr.count("\n") == 1
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
    cfgp = _train_cfg(tmp_path, tiny_snapshot, steps=3, lineage_steps=[0])
    assert _run("train", cfgp, "--quiet").returncode == 0
    ck = tmp_path / "run" / "ckpt" / "step-000003"
    from stalebook.rollouts import completion_logprobs, load_run_policy
    m, tok = load_run_policy(str(tiny_snapshot), str(ck), "cpu", "float32")
    m.eval()
    prompt, comp = "12+7=", tok("19").input_ids[-2:] + [tok.eos_token_id]
    with torch.no_grad():
        lp, mk = completion_logprobs(m, [tok(prompt).input_ids], [comp])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", PEFT_LOAD, str(tiny_snapshot), str(ck / "adapter"), prompt, json.dumps(comp)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    np.testing.assert_allclose(json.loads(r.stdout.strip().splitlines()[-1]), lp[0, mk[0]].numpy(), rtol=0, atol=1e-6)
def _learn_tiny():
    spec = importlib.util.spec_from_file_location("learn_tiny", ROOT / "benchmarks" / "learn_tiny.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m


def test_pooled_group_stats_matches_direct():
    "The start/end SE reconstructed from per-step (mean, SE, n) equals the SE computed from the group means."
    import numpy as np
    g = np.random.default_rng(0)
    groups = [g.random(int(n)) for n in g.integers(2, 9, 7)]
    recs = [dict(n_groups=len(x), reward_mean=float(x.mean()), reward_se=float(x.std(ddof=1) / math.sqrt(len(x)))) for x in groups]
    allg = np.concatenate(groups)
    mu, se, n = _learn_tiny().pooled_group_stats(recs)
    assert n == len(allg) and abs(mu - allg.mean()) < 1e-12
    assert abs(se - allg.std(ddof=1) / math.sqrt(len(allg))) < 1e-12


@pytest.mark.slow
def test_grpo_raises_math_reward(tmp_path):
    from stalebook.core import load_config
    from stalebook.model import default_snapshot
    from stalebook.trainer import Trainer, TrainConfig
    lt = _learn_tiny()
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        snap = default_snapshot(log=lambda *a: None)                 # the full warm-started tiny snapshot (built once)
        cfg = load_config(TrainConfig, ROOT / "configs" / "tiny" / "train-math.yaml",
                          overrides=dict(out=str(tmp_path / "run"), snapshot=str(snap), steps=100, lineage_steps=[0, 100]))
        recs = Trainer(cfg).run(progress=False).log.records
    finally:
        torch.set_num_threads(old)
    assert len(recs) == 100
    s = lt.train_summary(recs, 10)
    print(f"math reward first 10 steps {s['start']:.3f} ± {s['start_se']:.3f} -> last 10 {s['end']:.3f} ± {s['end_se']:.3f}; "
          f"zero-advantage groups {s['zero_adv_total']}/{s['groups_total']}")
    assert s["diff"] > 2 * s["diff_se"], s
    assert 0 < s["zero_adv_total"] < s["groups_total"]               # counted, and not every group is homogeneous
