"""Shared fixtures: one reduced tiny snapshot per test session (a few SFT steps, locked), built under a tmp dir."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import stalebook  # noqa: F401  (first: pins the CPU numerics before any test loads torch)
import stalebook.commands  # noqa: F401  (the composition root: every study kind registered, as in a command)

REDUCED = dict(max_steps=30, first_eval=10**9, require_band=False)


@pytest.fixture(scope="session")
def tiny_snapshot(tmp_path_factory):
    "A locked tiny snapshot built with a reduced step count (the full build is the `slow` test)."
    from stalebook.model import TinySpec, ensure_tiny_snapshot

    d = tmp_path_factory.mktemp("snap") / "tiny"
    ensure_tiny_snapshot(d, TinySpec(**REDUCED), log=lambda *a: None)
    return d


@pytest.fixture(scope="session")
def shipped_snapshot():
    "The tiny snapshot shipped with the package (a warm-started model: its GRPO steps have non-zero advantages)."
    from stalebook.model import shipped_snapshot

    d = shipped_snapshot()
    assert d is not None, "stalebook/data/tiny is missing or does not verify against its lock"
    return d


@pytest.fixture
def cli(capsys):
    """`stalebook ARGS` run in this process: an object with returncode, stdout and stderr like subprocess.run's. For the
    CLI's error paths (each subprocess would spend seconds importing torch); the console script itself is run in
    test_core."""
    from types import SimpleNamespace

    from stalebook.cli import main

    def call(*args):
        capsys.readouterr()
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)

    return call


# Helpers the test files share (import them: `from conftest import write_yaml, train_cfg, run_code, CLI`).
ROOT = Path(__file__).resolve().parents[1]
CLI = "import sys; from stalebook.cli import main; sys.exit(main(sys.argv[1:]))"
EXE = str(Path(sys.executable).parent / "stalebook")  # the console script of this venv


def write_yaml(path, obj):
    "Write `obj` as YAML to `path` (parents made); the path."
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(obj))
    return path


def train_cfg(root, snap, **kw):
    "A small math training config (12 steps, lineage 0/5/10) on snapshot `snap`, written to root/train.yaml."
    cfg = dict(
        out=str(root / "run"),
        snapshot=str(snap),
        domain="math",
        n_tasks=24,
        steps=12,
        prompts_per_step=3,
        sampling=dict(group_size=4, max_new_tokens=8, groups_per_batch=3),
        lineage_steps=[0, 5, 10],
        checkpoint_every=5,
        lr=0.01,
    )
    cfg.update(kw)
    return write_yaml(root / "train.yaml", cfg)


def run_code(code, *args, env_extra=None, drop=(), cwd=None, timeout=300):
    """Run Python `code` (dedented) with `args` in a fresh interpreter, in folder `cwd`, no HF_* variables nor those
    named in `drop`, the repo on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k not in drop}
    env.update({"PYTHONPATH": str(ROOT), **(env_extra or {})})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def run(args, env=None, timeout=900):
    "`stalebook ARGS` in a process of its own (the console script), `env` added to this process's environment."
    return subprocess.run(
        [EXE, *map(str, args)], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout
    )


def small_run(out, snap, **kw):
    """A finished 2-step training run (lineage 0 and 2; 4 prompts x 4 samples of 6 tokens, lr 0.05) on snapshot `snap`
    in folder `out`, `kw` overriding TrainConfig fields; its Trainer."""
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import TrainConfig, Trainer

    base = dict(
        steps=2,
        lineage_steps=(0, 2),
        prompts_per_step=4,
        lr=0.05,
        sampling=SamplingConfig(group_size=4, max_new_tokens=6),
    )
    return Trainer(TrainConfig(out=str(out), snapshot=str(snap), **(base | kw))).run(progress=False)


# Files that describe a run rather than its content (wall-clock, host, pid, absolute paths): never hashed, excluded from
# byte comparisons. train/steps.jsonl carries per-step t_gen/t_step, train/config.yaml the run's `out`.
SIDECARS = {
    "attempts.jsonl",
    "timings.json",
    "point.timings.json",
    "timings.jsonl",
    ".lock",
    "steps.jsonl",
    "config.yaml",
}


def content_files(root: Path) -> dict:
    "{relpath: bytes} of every file under root that is content: no sidecar, nothing of the executors' queue/."
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in SIDECARS and p.relative_to(root).parts[0] != "queue"
    }


def synthetic_registry(tmp: Path, units=3, phases=3, work_s=0.0, name="syn") -> Path:
    "A registry of the synthetic kind (`units` units of `phases` phases, each working `work_s` s), written to tmp."
    f = tmp / f"{name}.yaml"
    f.write_text(f"name: {name}\nkind: synthetic\nstudy: {{units: {units}, phases: {phases}, work_s: {work_s}}}\n")
    return f


def ranking_registry(
    tmp: Path, snap, name="kill", checkpoints=(2,), seeds=(0,), objective="grpo", table="demo", train_extra=""
) -> Path:
    "A reduced ranking registry on snapshot `snap` (one math block of the tiny model, small train and point settings)."
    f = tmp / f"{name}.yaml"
    f.write_text(f"""name: {name}
kind: ranking
models: {{tiny: {{snapshot: {snap}}}}}
study:
  table: {table}
  objective: {objective}
  checkpoints: {list(checkpoints)}
  train: {{prompts_per_step: 8, lr: 0.05, checkpoint_every: 1, \
sampling: {{group_size: 8, max_new_tokens: 6}}{train_extra}}}
  point: {{n_candidates: 12, n_validation: 4, k: 3, group_size: 4, max_new_tokens: 6, \
groups_per_batch: 4, k_sketch: 256}}
  blocks: [{{models: [tiny], domains: [math], seeds: {list(seeds)}}}]
""")
    return f


@pytest.fixture
def snap(tiny_snapshot, tmp_path):
    "A copy of the tiny snapshot that a test may damage."
    d = tmp_path / "snap"
    shutil.copytree(tiny_snapshot, d)
    return d
