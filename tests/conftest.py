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


def run_code(code, *args, env_extra=None, timeout=300):
    "Run Python `code` (dedented) with `args` in a fresh interpreter, no HF_* variables, the repo on PYTHONPATH."
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"PYTHONPATH": str(ROOT), **(env_extra or {})})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.fixture
def snap(tiny_snapshot, tmp_path):
    "A copy of the tiny snapshot that a test may damage."
    d = tmp_path / "snap"
    shutil.copytree(tiny_snapshot, d)
    return d
