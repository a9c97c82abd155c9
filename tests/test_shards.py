"""tools/pytest_shards.py (what `make pytest` runs): the planner puts every test file in exactly one shard within the
longest-processing-time bound of the best split; the runner's exit status is a failing shard's, its output holds every
shard's log, and the per-file seconds it measures come from the shards' JUnit reports."""
import importlib.util, itertools, json, random, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "pytest_shards.py"
spec = importlib.util.spec_from_file_location("pytest_shards", TOOL)
shards = importlib.util.module_from_spec(spec); spec.loader.exec_module(shards)


def best_makespan(w: list[float], n: int) -> float:
    "The optimal split's longest shard, by trying every assignment (small cases only)."
    return min(max(sum(x for x, k in zip(w, a) if k == i) for i in range(n)) for a in itertools.product(range(n), repeat=len(w)))


def test_plan_covers_every_file_once_within_the_lpt_bound():
    rng = random.Random(0)
    for _ in range(40):
        n, m = rng.choice([2, 3]), rng.randint(1, 8)
        w = {f"test_{i}.py": rng.choice([1, 2, 5, 13, 40, 120]) * rng.random() + 0.1 for i in range(m)}
        plan = shards.plan(list(w), w, n)
        assert sorted(f for s in plan for f in s) == sorted(w) and len(plan) <= n
        assert plan == shards.plan(list(reversed(list(w))), w, n)             # deterministic, order-free
        longest = max(sum(w[f] for f in s) for s in plan)
        assert longest <= (4 / 3 - 1 / (3 * n)) * best_makespan(list(w.values()), n) + 1e-9   # Graham's LPT bound


def test_unlisted_file_counts_as_the_median():
    plan = shards.plan(["test_a.py", "test_b.py", "test_new.py"], {"test_a.py": 10, "test_b.py": 1}, 2)
    assert plan == [["test_a.py"], ["test_b.py", "test_new.py"]]


def _write(d: Path, files: dict) -> Path:
    d.mkdir()
    for name, body in files.items(): (d / name).write_text(body)
    return d


def _run(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_failing_shard_fails_the_run_and_every_log_is_shown(tmp_path):
    d = _write(tmp_path / "t", {"test_a.py": "import time\ndef test_a(): time.sleep(0.3)\n",
                               "test_b.py": "def test_b(): assert 1 == 2\n", "test_c.py": "def test_c(): pass\n"})
    r = _run("-n", 2, "--tests", d, "--write-durations")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "---- shard 0 (exit" in r.stdout and "---- shard 1 (exit" in r.stdout and "1 failed" in r.stdout and "2 passed" in r.stdout
    got = json.loads((d / "durations.json").read_text())
    assert sorted(got) == ["test_a.py", "test_b.py", "test_c.py"] and got["test_a.py"] >= 0.3 > got["test_c.py"]
    (d / "test_b.py").write_text("def test_b(): assert 2 == 2\n")
    r = _run("-n", 2, "--tests", d)
    assert r.returncode == 0 and "exit [0, 0]" in r.stdout, r.stdout + r.stderr


def test_no_tests_and_bad_arguments_are_errors(tmp_path):
    assert _run("-n", 2, "--tests", _write(tmp_path / "empty", {})).returncode == 5
    r = _run("-n", 0)
    assert r.returncode == 2 and "-n must be >= 1" in r.stderr
    r = _run("--tests", tmp_path / "nope")
    assert r.returncode == 2 and "not a directory" in r.stderr
