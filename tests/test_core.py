"""Multi-process and fault-injection tests of stalebook.core (the fast checks live in nbs/00_core.ipynb)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stalebook.core import ConfigError, Domain, JsonlLog, atomic_write, cpu_flags, hash_dir, load_config, read_jsonl

parts = st.one_of(st.text(max_size=8), st.integers(min_value=-(2**40), max_value=2**40))
paths = st.lists(parts, max_size=4).map(tuple)


def _streams_in_subprocess(domains, hashseed):
    code = textwrap.dedent("""
        import json, sys, torch
        from stalebook.core import Domain
        out = []
        for root, path in json.load(sys.stdin):
            d = Domain(root, tuple(path))
            out.append([d.numpy().random(4).tolist(), torch.rand(4, generator=d.torch(), dtype=torch.float64).tolist()])
        json.dump(out, sys.stdout)
    """)
    env = {**os.environ, "PYTHONHASHSEED": str(hashseed)}
    r = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(domains), capture_output=True, text=True, env=env, check=True
    )
    return json.loads(r.stdout)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2**31), paths), min_size=2, max_size=40, unique=True))
def test_rng_streams_reproducible_across_processes_and_distinct(doms):
    doms = [[r, list(p)] for r, p in doms]
    a = _streams_in_subprocess(doms, 1)
    b = _streams_in_subprocess(doms, 2)
    assert a == b  # same stream in two processes, any hash seed
    here = [[Domain(r, tuple(p)).numpy().random(4).tolist()] for r, p in doms]
    assert [x[:1] for x in a] == here  # ... and in this one
    firsts = [tuple(x[0]) for x in a]
    assert len(set(firsts)) == len(firsts)  # distinct domains, distinct numpy streams
    assert len({tuple(x[1]) for x in a}) == len(a)  # ... and distinct torch streams


@given(paths, paths)
def test_distinct_paths_distinct_keys(p, q):
    if p != q:
        assert Domain(0, p).hex != Domain(0, q).hex


def test_hash_dir_follows_symlinks_like_hf_cache(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    (plain / "w.bin").write_bytes(b"\x01" * 10)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "aaa").write_text("{}")
    (blobs / "bbb").write_bytes(b"\x01" * 10)
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "config.json").symlink_to(blobs / "aaa")
    (snap / "w.bin").symlink_to(blobs / "bbb")
    assert hash_dir(plain) == hash_dir(snap)


WRITER = textwrap.dedent("""
    import sys, os
    from stalebook.core import atomic_write
    path, n = sys.argv[1], int(sys.argv[2])
    i = 0
    while True:
        i += 1
        atomic_write(path, (str(i % 10) * n).encode())
""")


def test_sigkill_during_atomic_write_leaves_old_or_new(tmp_path):
    target = tmp_path / "f.bin"
    n = 4 << 20  # 4 MiB per write so kills land mid-write
    atomic_write(target, b"0" * n)
    seen = set()
    for trial in range(8):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(n)])
        time.sleep(0.4 + 0.13 * trial)
        p.send_signal(signal.SIGKILL)
        p.wait()
        data = target.read_bytes()
        assert len(data) == n and data == data[:1] * n, "partial or mixed file after SIGKILL"
        seen.add(data[:1])
    assert len(seen) >= 2, "writer never completed a replacement; test did not exercise anything"
    leftovers = [f for f in os.listdir(tmp_path) if f != "f.bin"]
    assert all(f.startswith(".f.bin.tmp-") for f in leftovers)  # only orphaned temp files, never the target


def test_truncated_jsonl_tail_dropped_and_reported(tmp_path):
    p = tmp_path / "log.jsonl"
    log = JsonlLog(p)
    for i in range(5):
        log.append({"i": i, "x": [i] * 3})
    full = p.read_bytes()
    for cut in range(1, len(full.splitlines()[-1]) + 1):  # every possible torn last record
        p.write_bytes(full[:-cut])
        with pytest.warns(UserWarning, match="truncated"):
            r = read_jsonl(p)
        assert [x["i"] for x in r.records] == [0, 1, 2, 3] and "dropped" in r.dropped


def test_config_unknown_field_names_field_and_file(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class C:
        lr: float
        steps: int = 1

    p = tmp_path / "c.yaml"
    p.write_text("lr: 0.1\nstpes: 3\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown field 'stpes'"):
        load_config(C, p)


def test_cli_help_lists_subcommands():
    r = subprocess.run([Path(sys.executable).parent / "stalebook", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    from stalebook.cli import COMMANDS

    for name, (_, helptext) in COMMANDS.items():
        assert name in r.stdout and helptext in r.stdout


def test_cli_version_and_bad_args():
    from stalebook import __version__

    exe = Path(sys.executable).parent / "stalebook"
    r = subprocess.run([exe, "version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == __version__
    r = subprocess.run([exe, "version", "--nope"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--nope" in r.stderr
    r = subprocess.run([exe, "verify", "--json", "--only", "core."], capture_output=True, text=True)
    assert r.returncode == 0 and all(row["passed"] for row in json.loads(r.stdout))


# ------------------------------------------------------------------------------------------ pinned numerics
# What a CPU without AVX-512 gives each library, simulated on this one: MKL and oneDNN limited to AVX2, OpenBLAS's
# Haswell kernels, numpy's SIMD loops without their AVX-512 variants, torch's AVX2 kernels.
AVX2_MACHINE = {
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "ATEN_CPU_CAPABILITY": "avx2",
}
ASKS_AVX512 = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}


def _grpo_bytes(tmp, snap, name, env):
    "Three GRPO steps through `stalebook train` in a process started with `env` (over a clean environment)."
    import yaml

    from stalebook.core import NUMERICS_VAR, PINNED_NUMERICS

    d = tmp / name
    d.mkdir()
    cfg = dict(
        out=str(d / "run"),
        snapshot=str(snap),
        domain="math",
        n_tasks=12,
        steps=3,
        prompts_per_step=2,
        sampling=dict(group_size=4, max_new_tokens=8, groups_per_batch=2),
        lineage_steps=[0, 3],
        checkpoint_every=3,
        lr=0.01,
    )
    (d / "train.yaml").write_text(yaml.safe_dump(cfg))
    base = {k: v for k, v in os.environ.items() if k not in (*PINNED_NUMERICS, NUMERICS_VAR, *AVX2_MACHINE)}
    exe = str(Path(sys.executable).parent / "stalebook")
    r = subprocess.run([exe, "train", str(d / "train.yaml"), "--quiet"], env={**base, **env}, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    ck = d / "run" / "lineage" / "step-000003"
    meta = json.loads((ck / "meta.json").read_text())
    steps = [
        {k: v for k, v in r.items() if k not in ("t_gen", "t_step")}
        for r in read_jsonl(d / "run" / "steps.jsonl").records
    ]
    assert any(r["grad_norm"] > 0 for r in steps), "no step moved the weights: the comparison would be vacuous"
    return (ck / "adapter" / "adapter_model.safetensors").read_bytes() + json.dumps(steps).encode(), meta["numerics"]


# slow (23 s here: 5 training processes); in the default run nbs/38_numerics compares every stage with the trace
# committed from another CPU, and test_protocol checks the BLAS kernels
@pytest.mark.slow
def test_pinned_numerics_give_the_same_bytes_on_another_cpu(tmp_path, shipped_snapshot):
    "The same GRPO steps: pinned, whatever the start-up environment asks for; unpinned, they differ."
    tiny_snapshot = shipped_snapshot  # warm-started: the steps have non-zero advantages, so the weights move
    pinned, mode = _grpo_bytes(tmp_path, tiny_snapshot, "pinned", {})
    assert mode == "float32/cpu/openblas"  # the pinned default: GEMMs in numpy's OpenBLAS
    avx512 = "avx512f" in cpu_flags()  # no process is started asking for an ISA this CPU lacks
    asks = [("asks-avx512", {**ASKS_AVX512, "MKL_ENABLE_INSTRUCTIONS": "AVX512"})] if avx512 else []
    for name, env in [*asks, ("avx2", AVX2_MACHINE)]:
        got, got_mode = _grpo_bytes(tmp_path, tiny_snapshot, name, env)
        assert got == pinned and got_mode == mode, name
    if not avx512:
        pytest.skip("this CPU has no AVX-512: the unpinned AVX-512 computation cannot be run here")
    native, nmode = _grpo_bytes(tmp_path, tiny_snapshot, "native", {"STALEBOOK_NUMERICS": "native", **ASKS_AVX512})
    assert nmode == "float32/cpu/native"
    native_avx2, _ = _grpo_bytes(
        tmp_path, tiny_snapshot, "native-avx2", {"STALEBOOK_NUMERICS": "native", **AVX2_MACHINE}
    )
    assert native != native_avx2  # unpinned, the two "machines" compute other bytes
    assert native != pinned


def test_unpinnable_or_late_pin_is_recorded_and_said(tmp_path):
    "A process that loaded torch (or numpy) first runs unpinned, says so in one line, and records it."
    code = "import torch; from stalebook.model import numerics_state; print(numerics_state()['mode'])"
    from stalebook.core import NUMERICS_VAR, PINNED_NUMERICS

    base = {k: v for k, v in os.environ.items() if k not in (*PINNED_NUMERICS, NUMERICS_VAR)}
    r = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "unpinned", r.stderr
    assert r.stderr.count("\n") == 1 and "torch was loaded before stalebook" in r.stderr
    # numpy picks its SIMD loops and OpenBLAS kernels when it loads: loaded first, it is not pinned either
    code = "import numpy; import stalebook.core as c; print(c.NUMERICS)"
    r = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "unpinned", r.stderr
    assert r.stderr.count("\n") == 1 and "numpy was loaded before stalebook" in r.stderr
    code = "import stalebook, numpy, os; print(stalebook.core.NUMERICS, os.environ['OPENBLAS_CORETYPE'])"
    r = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["pinned", "Haswell"], r.stderr
    r = subprocess.run(
        [sys.executable, "-c", "import stalebook"], env={**base, NUMERICS_VAR: "fast"}, capture_output=True, text=True
    )
    assert (
        r.returncode == 2 and r.stderr == "stalebook: error: STALEBOOK_NUMERICS='fast': expected 'pinned' or 'native'\n"
    )


# CPUs qemu-user presents to one process (same host, other CPUID): another vendor's CPU without AVX-512 (AMD EPYC Milan:
# MKL and OpenBLAS see AuthenticAMD) and an Intel CPU without AVX-512 (numpy and OpenBLAS take their AVX2 paths).
EMULATED_CPUS = ("EPYC-Milan-v1", "Haswell-v4")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="qemu-user (Debian's qemu-user) is not installed")
def test_every_stage_agrees_on_emulated_cpus_of_both_vendors(tmp_path):
    """`stalebook numerics trace` (every stage a run computes: torch and numpy op families, forward, backward,
    optimizer steps, sampling, GRPO sync and fixed-lag, BOLT, a rollout store, scoring, a point analysis) on this CPU
    and under each of `EMULATED_CPUS`, run at once: every stage's hash must be this CPU's. An emulated CPU is evidence
    about dispatch by CPUID (vendor, ISA), not about what real silicon computes; 38_numerics compares the CPU it runs
    on with the committed trace (results/records/numerics_trace.json), so its check on a real AMD machine is the
    real-silicon comparison. A few minutes under emulation."""
    from stalebook.core import NUMERICS_VAR, PINNED_NUMERICS

    base = {k: v for k, v in os.environ.items() if k not in (*PINNED_NUMERICS, NUMERICS_VAR)}
    trace = [sys.executable, str(Path(sys.executable).parent / "stalebook"), "numerics", "trace"]
    r = subprocess.run([*trace, "--out", str(tmp_path / "here.json")], env=base, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    here = json.loads((tmp_path / "here.json").read_text())
    runs = {
        cpu: subprocess.Popen(
            ["qemu-x86_64", "-cpu", cpu, *trace, "--compare", str(tmp_path / "here.json")]
            + ["--out", str(tmp_path / f"{cpu}.json")],
            env=base,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cpu in EMULATED_CPUS
    }
    for cpu, p in runs.items():
        out, err = p.communicate(timeout=1800)
        assert p.returncode == 0, f"{cpu}: {out[-3000:]}{err[-2000:]}"
        emulated = json.loads((tmp_path / f"{cpu}.json").read_text())
        assert "AVX2" in emulated["meta/numpy_simd"] and "AVX512F" not in emulated["meta/numpy_simd"], cpu
        assert json.loads(emulated["meta/numerics"])["mode"] == json.loads(here["meta/numerics"])["mode"] == "pinned"
    if "avx512f" in cpu_flags():  # the comparison is between AVX-512 loops here and AVX2 loops there
        assert "AVX512F" in here["meta/numpy_simd"]


def test_openblas_threads_pinned_to_one():
    """OpenBLAS's threaded dot product splits a long sum between its threads, so its bytes follow the thread count
    (the machine's cores, by default). A pinned process runs OpenBLAS on one thread whatever the environment asks:
    the same bytes started with OPENBLAS_NUM_THREADS=1 and =2."""
    from stalebook.core import NUMERICS_VAR, PINNED_NUMERICS

    code = (
        "import stalebook, numpy as np; g = np.random.default_rng(0); x, y = g.standard_normal((2, 2_000_001)); "
        "print(repr(float(x @ y)), stalebook.core.NUMERICS)"
    )
    base = {k: v for k, v in os.environ.items() if k not in (*PINNED_NUMERICS, NUMERICS_VAR)}
    out = [
        subprocess.run(
            [sys.executable, "-c", code], env=base | {"OPENBLAS_NUM_THREADS": t}, capture_output=True, text=True
        ).stdout.split()
        for t in ("1", "2")
    ]
    assert out[0][1] == "pinned" and out[0] == out[1], out
