"""`stalebook numerics trace`: the trace repeats in a process, `--compare` names the first differing stage, counts the
differing ones (a stage only one trace has counts) and exits 1, shows `meta/` keys without comparing them, and a bad
`--compare` file or `--threads` is a one-line error. The trace under emulated CPUs is test_core's (slow); this file's
tests themselves run under emulated AVX2-only CPUs of both vendors in the slow run (they read the CPU's numpy targets
in-process)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stalebook.numerics import compare_report, trace_differences


def test_compare_names_the_first_differing_stage(tmp_path, cli):
    r = cli("numerics", "trace", "--out", tmp_path / "here.json")
    assert r.returncode == 0 and r.stdout == "", r.stderr
    here = json.loads((tmp_path / "here.json").read_text())
    stages = [k for k in here if not k.startswith("meta/")]
    assert stages[0].startswith("np/") and stages[-1].startswith("analysis/")  # in the order a run computes them
    for prefix in ("op/t1/f32/exact_sqrt/", "forward/t1/", "backward/t1/", "optimizer/t1/adamw", "sample/t1/"):
        assert any(k.startswith(prefix) for k in stages), prefix
    for prefix in ("grpo_sync/t1/", "grpo_fixed_lag/t1/", "bolt/t1/", "store/t1/", "scoring/t1/", "np/f64/lexsort/"):
        assert any(k.startswith(prefix) for k in stages), prefix
    # another machine's numpy targets, different from this one's by construction (whatever ISA this CPU has)
    simd = here["meta/numpy_simd"]
    other = "AVX2,FMA3" if simd != "AVX2,FMA3" else "AVX2,FMA3,AVX512F"
    there = dict(here) | {"optimizer/t1/adamw": "0" * 16, "meta/numpy_simd": other}
    del there["analysis/arrays"]
    (tmp_path / "there.json").write_text(json.dumps(there))
    r = cli("numerics", "trace", "--compare", tmp_path / "there.json", "--out", tmp_path / "again.json")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"numerics trace: 2 of {len(stages)} stages differ from ")
    assert "first: optimizer/t1/adamw (0000000000000000 there, " in lines[0]
    assert lines[1].startswith("  analysis/arrays: None there, ")
    assert lines[2] == f"  (not compared) meta/numpy_simd: {other} there, {simd} here"
    assert json.loads((tmp_path / "again.json").read_text()) == here  # a second process computes the same bytes


def test_differences_and_report():
    a = {"meta/x": "1", "s/1": "a", "s/2": "b"}
    assert trace_differences(a, dict(a)) == []
    assert trace_differences(a, {"meta/x": "2", "s/1": "a", "s/2": "c", "s/3": "d"}) == ["s/2", "s/3"]
    assert trace_differences(a, {"s/1": "a"}) == ["s/2"]
    lines, rc = compare_report(a, dict(a), "ref.json")
    assert rc == 0 and lines == ["numerics trace: all 2 stages equal those of ref.json"]


@pytest.mark.parametrize(
    "content, says",
    [(None, "no such file"), ("{not json", "not a JSON trace"), ("[1, 2]", "not a trace"), ('{"a": 1}', "not a trace")],
)
def test_a_bad_compare_file_is_one_line(tmp_path, cli, content, says):
    f = tmp_path / "ref.json"
    if content is not None:
        f.write_text(content)
    r = cli("numerics", "trace", "--compare", f)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr and str(f) in r.stderr, r.stderr


@pytest.mark.parametrize("threads", ["0", "1,x", ""])
def test_bad_threads_are_one_line(cli, threads):
    r = cli("numerics", "trace", "--threads", threads)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--threads" in r.stderr, r.stderr


# CPUs without AVX-512 that qemu-user presents to one process: an Intel (Haswell) and an AMD (EPYC Milan). The tests
# above read this process's numpy targets (`meta/numpy_simd`); under emulation they run where numpy finds AVX2 only,
# whatever the host has, so a test that holds only on an AVX-512 host fails here.
EMULATED_AVX2_CPUS = ("Haswell-v4", "EPYC-Milan-v1")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="qemu-user (Debian's qemu-user) is not installed")
def test_this_file_passes_on_emulated_avx2_only_cpus(tmp_path):
    "This file's default tests, each run in a pytest process under each emulated CPU at once (a few minutes)."
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow"]
    runs = {
        cpu: subprocess.Popen(
            ["qemu-x86_64", "-cpu", cpu, *cmd, "--basetemp", str(tmp_path / cpu)],
            cwd=Path(__file__).parent.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for cpu in EMULATED_AVX2_CPUS
    }
    for cpu, p in runs.items():
        out, _ = p.communicate(timeout=1800)
        assert p.returncode == 0 and " passed" in out and "failed" not in out, f"{cpu}:\n{out[-3000:]}"
