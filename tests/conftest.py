"""Shared fixtures: one reduced tiny snapshot per test session (a few SFT steps, locked), built under a tmp dir."""

import pytest

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
