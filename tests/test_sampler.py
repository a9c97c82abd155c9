"""The generation-backend seam: the bytes of today's tiny runs are pinned (sync and fixed-lag GRPO, a rollout store,
a BOLT reference step, held-out evaluation) so that routing every consumer through one sampler is shown to change
nothing; the fake backend trains; a backend that is not installed is refused when the config is read."""

from pathlib import Path

import pytest

from stalebook.core import hash_file, hash_json

ROOT = Path(__file__).resolve().parents[1]
TIMING = {"t_gen", "t_step"}


def digit_share(task, text):
    "A graded reward the reduced snapshot's samples vary in (so that every step moves the adapter)."
    return (sum(c.isdigit() for c in text) / len(text) if text else 0.0), {}


def _cfg(out, snap, **kw):
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import TrainConfig

    base = dict(
        out=str(out),
        snapshot=str(snap),
        n_tasks=12,
        steps=3,
        prompts_per_step=3,
        sampling=SamplingConfig(group_size=4, max_new_tokens=8, groups_per_batch=3),
        lineage_steps=(0,),
        lr=0.01,
    )
    return TrainConfig(**(base | kw))


def _run_hashes(tr) -> dict:
    recs = [{k: v for k, v in r.items() if k not in TIMING} for r in tr.log.records]
    from stalebook.model import policy_hash

    return dict(adapter=policy_hash(tr.model)[:16], log=hash_json(recs)[:16])


def pinned_bytes(tmp, snap) -> dict:
    "The hashes of a few small runs of every consumer of generation (see PINNED)."
    from stalebook.bolt import reference_trainer
    from stalebook.model import policy_hash
    from stalebook.pipeline import heldout_pass_rate
    from stalebook.rollouts import RolloutStore, SamplingConfig, generate_store, numerics_of, rollout_domain
    from stalebook.trainer import AsyncConfig, Trainer

    out = {}
    tr = Trainer(_cfg(tmp / "sync", snap), reward_fn=digit_share).run(progress=False)
    out["sync"] = _run_hashes(tr)
    out["heldout"] = heldout_pass_rate(tr.model, tr.tok, tr.cfg, 4, 4)
    kl = _cfg(tmp / "kl", snap, kl_beta=0.1, shared_prefix=True, micro_batch=5)
    out["sync_kl_prefix"] = _run_hashes(Trainer(kl, reward_fn=digit_share).run(progress=False))
    lag = _cfg(
        tmp / "lag",
        snap,
        async_training=AsyncConfig(staleness=1, mode="fixed-lag", correction="truncate", is_threshold=1.5),
    )
    out["fixed_lag"] = _run_hashes(Trainer(lag, reward_fn=digit_share).run(progress=False))
    tasks = tr.tasks[:5]
    sc = SamplingConfig(group_size=4, max_new_tokens=8, groups_per_batch=2)
    ph = policy_hash(tr.model)
    st = RolloutStore(
        tmp / "stores", ph, rollout_domain(0, ph, "pin"), sc, [t.id for t in tasks], numerics=numerics_of(tr.model)
    )
    generate_store(tr.model, tr.tok, tasks, st, progress=False)
    out["store"] = hash_file(st.path / "groups.jsonl")[:16]
    bolt = reference_trainer(_cfg(tmp / "bolt", snap, objective="sft", steps=2), "bolt", 0.5, reward_fn=digit_share)
    out["bolt"] = _run_hashes(bolt.run(progress=False))
    out["bolt_reference"] = hash_file(bolt.data.reference(bolt, 0)["store"].path / "groups.jsonl")[:16]
    return out


# The bytes of every consumer of generation (CPU, float32, threads 1, the reduced tiny snapshot), under the pinned
# numerics (GEMMs in numpy's OpenBLAS) with no torch sqrt anywhere (core.exact_sqrt, fused AdamW), computed on a real
# AMD EPYC Milan (AVX2 only); the whole set is checked natively here and the stages under emulated AMD and Intel CPUs
# by the numerics trace (tests/test_core.py). A process whose numerics are not pinned cannot compare them.
PINNED = {
    "sync": {"adapter": "9d74aa09bc39888c", "log": "cd15164d5a87aef8"},
    "heldout": 0.0,
    "sync_kl_prefix": {"adapter": "8e884dd191b52f01", "log": "e5191e9e39655816"},
    "fixed_lag": {"adapter": "59fb147a3f17a529", "log": "4d9e5693e11857ca"},
    "store": "4617b0a54ae9d31c",
    "bolt": {"adapter": "d1aa558f1d8291b4", "log": "742def966cc5d574"},
    "bolt_reference": "d88aace4f58f63e3",
}


def test_step_bytes_are_pinned(tmp_path, tiny_snapshot):
    from stalebook.model import numerics_state

    if (num := numerics_state())["mode"] != "pinned" or num.get("gemm") != "openblas":
        pytest.skip(f"constants recorded under the pinned numerics (GEMMs routed); this process runs {num}")
    got = pinned_bytes(tmp_path, tiny_snapshot)
    assert got == PINNED


def test_fake_backend_trains_and_records_the_mismatch(tmp_path, tiny_snapshot):
    """GRPO through the fake engine (its own bfloat16 copy, weights synced through published LoRA folders, per-sample
    seeds): the PPO ratio is still 1 (the trainer recomputes the behaviour log-probs), every step records the
    training–inference mismatch, small and non-zero, and a second run repeats the first bit for bit."""
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import Trainer

    sc = SamplingConfig(group_size=4, max_new_tokens=8, groups_per_batch=3, backend="fake")
    runs = [
        Trainer(_cfg(tmp_path / name, tiny_snapshot, sampling=sc), reward_fn=digit_share).run(progress=False)
        for name in ("a", "b")
    ]
    recs = [[{k: v for k, v in r.items() if k not in TIMING} for r in tr.log.records] for tr in runs]
    assert recs[0] == recs[1] and len(recs[0]) == 3
    for r in recs[0]:
        assert r["ratio_max_dev"] < 1e-5
        assert 0 < r["mismatch/logp_abs_diff_mean"] <= r["mismatch/logp_abs_diff_max"] < 1.0
        assert 0 <= r["mismatch/k3_kl"] < 1e-2 and 0 < r["mismatch/is_ess_frac"] <= 1 + 1e-12
        assert r["mismatch/is_min"] <= r["mismatch/is_mean"] <= r["mismatch/is_max"]
        assert r["mismatch/is_truncated_max"] == min(r["mismatch/is_max"], 2.0)
    assert len({r["policy_hash"] for r in recs[0]}) == 3  # the weights moved, and the engine followed them
    fk = runs[0].sampler
    assert fk.synced == recs[0][-1]["policy_hash"] and fk.folders.ids  # synced to the last step's weights


def test_hf_backend_records_the_mismatch_only_when_asked(tmp_path, tiny_snapshot):
    "With the hf sampler the diagnostics are opt-in (`mismatch_diagnostics`): the default records keep their bytes."
    from stalebook.trainer import Trainer

    tr = Trainer(_cfg(tmp_path / "m", tiny_snapshot, steps=1, mismatch_diagnostics=True), reward_fn=digit_share)
    r = tr.run(progress=False).log.records[0]
    assert r["mismatch/logp_abs_diff_max"] < 1e-4 and "mismatch/k3_kl" in r  # float64 sampler vs float32 trainer


@pytest.mark.parametrize("cmd", ["train", "rollouts"])
def test_backend_not_installed_is_refused_when_the_config_is_read(tmp_path, cli, cmd):
    import importlib.util

    import yaml

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"out": str(tmp_path / "r"), "sampling": {"backend": "vllm"}}))
    r = cli(cmd, p)
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert (
        str(p) in r.stderr and "sampling" in r.stderr and "backend 'vllm'" in r.stderr and "not installed" in r.stderr
    )
    assert not (tmp_path / "r").exists()


def test_a_backend_that_cannot_give_the_asked_guarantee_is_refused():
    from stalebook.core import ConfigError, from_dict
    from stalebook.rollouts import SAMPLERS, Sampler, SamplingConfig, backend_problem, register_sampler

    @register_sampler("seeded-test")
    class Seeded(Sampler):
        reproducible = "seeded"

    try:
        assert "not bit for bit" in backend_problem("seeded-test", "bitwise")
        assert backend_problem("seeded-test", "seeded") is None
        with pytest.raises(ConfigError, match="field 'sampling.backend'"):
            from_dict(SamplingConfig, {"backend": "nope"}, src="x.yaml", prefix="sampling.")
    finally:
        del SAMPLERS["seeded-test"]


def _private_names(tree) -> set:
    "Private functions, classes and attributes a module defines (`def _x`, `class _X`, `obj._x = ...`)."
    import ast

    defs = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    return {x for x in defs | attrs if x.startswith("_") and not x.startswith("__")}


# imports of another module's private helper that are allowed (none)
KNOWN: set[str] = set()


def test_no_module_uses_another_modules_private_names():
    """Across module boundaries only public names: no `x._name` attribute use and no `from m import _name` where
    `_name` is defined in another stalebook module and not in this one (the trainer's hooks are public)."""
    import ast

    files = sorted((ROOT / "stalebook").rglob("*.py"))
    trees = {f: ast.parse(f.read_text()) for f in files if f.name != "_modidx.py"}
    own = {f: _private_names(t) for f, t in trees.items()}
    bad = []
    for f, t in trees.items():
        others = set().union(*(v for g, v in own.items() if g != f)) - own[f]
        for n in ast.walk(t):
            if isinstance(n, ast.Attribute) and n.attr in others:
                bad.append(f"{f.name}:{n.lineno}: .{n.attr}")
            if isinstance(n, ast.ImportFrom):
                bad += [f"{f.name}:{n.lineno}: import {a.name}" for a in n.names if a.name in others]
    bad = [b for b in bad if b.split(":")[0] + ":" + b.split(":", 2)[2] not in KNOWN]
    assert not bad, bad


def test_gpu_check_dry_run(tmp_path, tiny_snapshot):
    """benchmarks/gpu_check.py on CPU: the GRPO step, the scoring pass and generation with hf and fake run; vllm is
    skipped with its reason (not installed here); the mismatch of the fake engine is measured and non-zero."""
    import json
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path), "--dry-run"]
        + ["--snapshot", str(tiny_snapshot)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    s = res["sections"]
    assert {"grpo_hf", "scoring", "generation_hf", "generation_fake"} <= set(s) and not res["errors"]
    assert s["grpo_hf"]["mismatch"]["mismatch/logp_abs_diff_max"] < 1e-4 and s["scoring"]["score4_s"] > 0
    assert s["generation_hf"]["repeats_bitwise"] and s["generation_fake"]["repeats_bitwise"]
    assert s["generation_fake"]["mismatch"]["mismatch/logp_abs_diff_mean"] > 0
    assert "vllm" in res["skipped"].get("generation_vllm", "") or "generation_vllm" in s
