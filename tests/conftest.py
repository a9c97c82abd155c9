"""Shared fixtures: one reduced tiny snapshot per test session (a few SFT steps, locked), built under a tmp dir."""
import pytest

REDUCED = dict(max_steps=30, first_eval=10**9, require_band=False)

@pytest.fixture(scope="session")
def tiny_snapshot(tmp_path_factory):
    "A locked tiny snapshot built with a reduced step count (the full build is the `slow` test)."
    from stalebook.model import TinySpec
    from stalebook.model import ensure_tiny_snapshot
    d = tmp_path_factory.mktemp("snap") / "tiny"
    ensure_tiny_snapshot(d, TinySpec(**REDUCED), log=lambda *a: None)
    return d
