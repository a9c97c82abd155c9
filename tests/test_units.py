"""Units of work across processes: the unit lock, phase kills and resumes (synthetic kind), >= 10 kills of
`stalebook run` on a reduced ranking registry giving byte-identical results and frozen table, two independent
code-domain stores with identical bytes, and a family that refuses to resume another objective's lineage."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import EXE, content_files, ranking_registry, run, synthetic_registry

from stalebook.core import Domain

# ---------------------------------------------------------------- synthetic kind: lock, kills, other processes


# Each kill is a process start (seconds of imports): `full` (4 kills) runs with the slow tests; `quick`, in the default
# run, one of each kind.
@pytest.mark.parametrize(
    "full", [pytest.param(True, marks=pytest.mark.slow, id="full"), pytest.param(False, id="quick")]
)
def test_synthetic_kills_resume_to_identical_outputs(tmp_path, full):
    "Kills inside a phase and between a phase's work and its record: the rerun ends with the undisturbed bytes."
    reg = synthetic_registry(tmp_path)
    assert run(["run", reg, "--root", tmp_path / "a"]).returncode == 0
    kills = 0
    faults = ["synthetic:0/1", "phase:u000/p2", "synthetic:1/0", "phase:u002/p0"][: 4 if full else 2]
    for fault in faults:
        r = run(["run", reg, "--root", tmp_path / "b"], env={"STALEBOOK_FAULT": fault})
        kills += r.returncode == -signal.SIGKILL
    assert kills == len(faults)
    assert run(["run", reg, "--root", tmp_path / "b"]).returncode == 0
    assert content_files(tmp_path / "a") == content_files(tmp_path / "b")
    # each phase's work ran once per attempt that reached it; the unit killed after p2's work ran p2 twice
    ev = [json.loads(l) for l in (tmp_path / "b/units/u000/attempts.jsonl").read_text().splitlines()]
    assert [e["phase"] for e in ev if e["event"] == "done"] == ["p0", "p1", "p2"]


def test_a_unit_runs_in_one_process_at_a_time(tmp_path):
    "A second process on a unit whose lock is held is refused with one line; the first finishes undisturbed."
    from stalebook.core import StalebookError
    from stalebook.registry import load_registry
    from stalebook.units import run_unit

    reg = synthetic_registry(tmp_path, units=1, phases=2, work_s=4.0)
    first = subprocess.Popen(
        [EXE, "run", str(reg), "--root", str(tmp_path / "r")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for _ in range(1200):
        if (tmp_path / "r/units/u000/attempts.jsonl").exists():
            break
        time.sleep(0.05)
    with pytest.raises(StalebookError, match="another process is running it"):
        run_unit(load_registry(reg), "u000", tmp_path / "r")
    assert first.wait(timeout=120) == 0
    ev = [json.loads(l)["event"] for l in (tmp_path / "r/units/u000/attempts.jsonl").read_text().splitlines()]
    assert ev == ["start", "done", "start", "done"]  # the refused call started nothing


# ---------------------------------------------------------------- the ranking family under SIGKILL


def _kill_run(reg, root, delay, start_timeout=600) -> bool:
    """Start `stalebook run`, wait until it has started its work (its first `[run]` line: imports and checks done),
    then SIGKILL its whole process group (papermill kernel included) `delay` s later; True if it was still running.
    Timing from that line, not from the start, keeps the moment inside the work however long the start-up takes on a
    loaded machine."""
    p = subprocess.Popen(
        [EXE, "run", str(reg), "--root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    started = threading.Event()

    def read():
        for line in p.stdout:
            if line.startswith("[run]"):
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    t0 = time.perf_counter()
    while not started.wait(0.05):
        if p.poll() is not None or time.perf_counter() - t0 > start_timeout:
            break
    try:
        p.wait(timeout=delay if started.is_set() else 0)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return True
    finally:
        reader.join(timeout=10)


def kill_and_compare(tmp_path, reg, faults, min_kills=10):
    t0 = time.perf_counter()
    r = run(["run", reg, "--root", tmp_path / "ref"])
    assert r.returncode == 0, r.stderr[-3000:]
    t_ref = time.perf_counter() - t0
    assert run(["freeze", reg, "--root", tmp_path / "ref"]).returncode == 0
    t0 = time.perf_counter()
    assert run(["run", reg, "--root", tmp_path / "ref"]).returncode == 0  # nothing left to do: start-up and checks only
    t_noop = time.perf_counter() - t0
    kills = 0
    for fault in faults:  # deterministic moments: mid-step, mid-checkpoint, mid-store (in the run
        r = run(
            ["run", reg, "--root", tmp_path / "k"], env={"STALEBOOK_FAULT": fault}
        )  # or in the point's kernel), before a record
        assert r.returncode != 0, (
            f"fault {fault} did not fire: its moment had passed and the run finished (reorder the faults)"
        )
        kills += 1
    # random moments, until enough kills landed: each run is killed a random share of at most 1/(2 min_kills) of the
    # reference run's work after its start-up, so the kills land inside the work that is left instead of after it
    share = max(t_ref - t_noop, 1.0) / (2 * min_kills)
    for x in Domain(0, ("test", "run-kills")).numpy().uniform(0.2, 1.0, 30):
        if kills >= min_kills:
            break
        kills += _kill_run(reg, tmp_path / "k", x * share)
    assert kills >= min_kills, kills
    print(f"{kills} kills ({len(faults)} at fault points), reference run {t_ref:.0f} s, start-up {t_noop:.1f} s")
    r = run(["run", reg, "--root", tmp_path / "k"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert run(["freeze", reg, "--root", tmp_path / "k"]).returncode == 0
    a, b = content_files(tmp_path / "ref"), content_files(tmp_path / "k")
    assert sorted(a) == sorted(b)
    assert [f for f in a if a[f] != b[f]] == []
    return a, kills


# slow (80 s here): the default run kills units in test_synthetic_kills_resume_to_identical_outputs, stores in
# test_rollouts and training in test_trainer
@pytest.mark.slow
def test_run_killed_at_random_moments_gives_identical_results_and_frozen_table(tmp_path, tiny_snapshot):
    """>= 10 kills of `stalebook run` (6 at fault points inside training, stores, the point kernel and between a phase
    and its record; the rest SIGKILLs of the process group at random moments) and a final rerun: every content file —
    results, replicates, executed notebook, manifests, phase records, lineage, stores, frozen table — is byte-identical
    to an uninterrupted run in another root (which is also the two-independent-runs check for a point)."""
    reg = ranking_registry(tmp_path, tiny_snapshot)
    faults = ["step:1", "ckpt:2", "phase:tiny-math-s0/train", "group:5", "phase:tiny-math-s0/stale", "group:9"]
    files, kills = kill_and_compare(tmp_path, reg, faults)
    assert {
        "frozen/table.json",
        "frozen/table.md",
        "units/tiny-math-s0/points/c-000002/point.ipynb",
        "units/tiny-math-s0/points/c-000002/boot.npz",
    } <= set(files)
    table = json.loads(files["frozen/table.json"])
    assert (
        str(tmp_path) not in files["frozen/table.json"].decode()
        and str(tmp_path) not in files["units/tiny-math-s0/points/c-000002/point.ipynb"].decode()
    )
    assert len(table["rows"]) == 4 and table["content_hash"]


@pytest.mark.slow
@pytest.mark.long
def test_tiny_demo_killed_at_random_moments(tmp_path):
    "The same on the tiny registry's demo slice (3 families, 9 points: tens of minutes on 2 cores)."
    # in the order they come: s0's training, s0's train record, a store of s0, s1's checkpoint 25, a store of s1
    kill_and_compare(
        tmp_path, "tiny:demo", ["step:20", "phase:tiny-math-s0/train", "group:40", "ckpt:25", "group:20"], min_kills=10
    )


# ---------------------------------------------------------------- artifacts are content: a code-domain store


def test_two_code_domain_stores_are_byte_identical(tmp_path, tiny_snapshot):
    "Two independent runs of a code-domain store (other folder, other process): identical files apart from the sidecar."
    code = """
import sys
from pathlib import Path
from stalebook.core import Domain
from stalebook.model import load_policy, policy_hash
from stalebook.rollouts import RolloutStore, SamplingConfig, generate_store, numerics_of, rollout_domain
from stalebook.tasks import synthetic_tasks
model, tok = load_policy(sys.argv[1])
tasks = synthetic_tasks("code", 6, Domain(0, ("test", "code-store")))
ph = policy_hash(model)
st = RolloutStore(sys.argv[2], ph, rollout_domain(0, ph, "test"),
                  SamplingConfig(group_size=4, max_new_tokens=10, groups_per_batch=3),
                  [t.id for t in tasks], numerics=numerics_of(model))
generate_store(model, tok, tasks, st, progress=False)
print(st.path.name)
"""
    names = []
    for d in ("a", "b"):
        r = subprocess.run(
            [sys.executable, "-c", code, str(tiny_snapshot), str(tmp_path / d)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        names.append(r.stdout.strip())
    assert names[0] == names[1]
    a, b = content_files(tmp_path / "a"), content_files(tmp_path / "b")
    assert sorted(a) == sorted(b) == [f"{names[0]}/{f}" for f in ("complete.json", "groups.jsonl", "manifest.json")]
    assert a == b
    recs = [json.loads(l) for l in a[f"{names[0]}/groups.jsonl"].decode().splitlines()]
    assert all("wall_s" not in d for r in recs for d in r["details"]) and all(
        r["details"][0]["domain"] == "code" for r in recs
    )


# ---------------------------------------------------------------- the objective of a lineage


def test_sft_family_never_resumes_a_grpo_lineage(tmp_path, tiny_snapshot):
    "A GRPO family's training folder copied into an SFT family's unit: the SFT unit refuses it (and the reverse)."
    from stalebook.ranking_study import family_phases
    from stalebook.registry import load_registry
    from stalebook.units import Unit, run_unit, unit_dir

    g = load_registry(ranking_registry(tmp_path, tiny_snapshot, name="g", checkpoints=(2,)))
    sft = ranking_registry(tmp_path, tiny_snapshot, name="s", checkpoints=(2,), objective="sft", table="appendix")
    # the GRPO family's train phase only, then its training folder spliced into the SFT family's unit
    u = Unit(
        g,
        "tiny-math-s0",
        g.units()["tiny-math-s0"],
        unit_dir(tmp_path / "rg", "tiny-math-s0"),
        progress=False,
        log=lambda *a: None,
    )
    family_phases(u)[0].run()
    shutil.copytree(u.dir / "train", unit_dir(tmp_path / "rs", "tiny-math-s0") / "train")
    with pytest.raises(Exception) as e:
        run_unit(load_registry(sft), "tiny-math-s0", tmp_path / "rs", log=lambda *a: None)
    assert "an SFT run never resumes from a GRPO checkpoint" in str(e.value)


def test_a_phase_computed_on_the_other_gemm_path_is_not_done(tmp_path):
    "A phase record from the other GEMM path (torch's MKL GEMMs vs numpy's OpenBLAS) is not done, and says why."
    from stalebook.core import pin_numerics
    from stalebook.units import Phase, phase_problems, record_path, write_record

    (tmp_path / "out.txt").write_text("x")
    ph = Phase("p0", lambda: None, outputs=("out.txt",))
    write_record(tmp_path, "u", ph, {}, None)
    assert phase_problems(tmp_path, ph, {}) == []
    f = record_path(tmp_path, "p0")
    rec = json.loads(f.read_text())
    routed = rec["environment"].pop("gemm", None) == "openblas"
    assert routed == (pin_numerics().get("gemm") == "openblas")
    if not routed:  # this process computes with torch's GEMMs: the record claims the routed path instead
        rec["environment"]["gemm"] = "openblas"
    f.write_text(json.dumps(rec))
    mode = rec["environment"]["numerics"]
    was, now = (mode, f"{mode} (GEMMs: openblas)") if routed else (f"{mode} (GEMMs: openblas)", mode)
    assert phase_problems(tmp_path, ph, {}) == [f"ran under numerics {was}, this process computes {now}"]
