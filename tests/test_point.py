"""The experiment point: killed anywhere it resumes to the identical result; bad configs are one line; the papermill
notebook's parameters are exactly PointConfig's fields."""

import ast
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
import yaml
from conftest import EXE, ROOT, run_code, small_run

from stalebook.core import Domain
from stalebook.snapshot import read_lock


def _point_setup(tmp_path, snap):
    return small_run(tmp_path / "run", snap).dir


# slow (45 s here: 11 processes); in the default run test_rollouts kills store generation (the point's stores)
@pytest.mark.slow
def test_point_killed_anywhere_resumes_to_identical_result(tmp_path, tiny_snapshot):
    run = _point_setup(tmp_path, tiny_snapshot)
    small = dict(
        n_candidates=12,
        n_validation=4,
        k=3,
        group_size=4,
        max_new_tokens=6,
        groups_per_batch=4,
        k_sketch=256,
        n_boot=500,
        checkpoint=2,
    )
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump(dict(run=str(run), **small)))
    t0 = time.perf_counter()
    r = subprocess.run([EXE, "point", str(cfg), "--inline"], capture_output=True, text=True)
    t_ref = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    ref = (run / "points/c-000002/result.json").read_bytes()
    for d in ("points", "rollouts", "features"):
        shutil.rmtree(run / d)
    # kills: inside stale generation, inside fresh generation, and at random wall-clock moments
    kills = 0
    for fault in ["group:5", "group:2", "group:9", "group:1", "group:3", "group:10"]:  # mid-store, several stores
        r = subprocess.run(
            [EXE, "point", str(cfg), "--inline"],
            capture_output=True,
            text=True,
            env={**os.environ, "STALEBOOK_FAULT": fault},
        )
        kills += r.returncode == -9
    assert kills >= 5
    # plus SIGKILLs at random wall-clock moments of a whole run (generation, scoring or analysis)
    for dly in Domain(0, ("test", "point-kills")).numpy().uniform(0.3, 0.95, 3) * t_ref:
        p = subprocess.Popen([EXE, "point", str(cfg), "--inline"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            p.wait(timeout=dly)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
    before = {f: f.read_text().splitlines() for f in (run / "rollouts").glob("*/groups.jsonl")}
    r = subprocess.run([EXE, "point", str(cfg), "--inline"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (run / "points/c-000002/result.json").read_bytes() == ref  # the identical result file
    for f, lines in before.items():  # finished groups kept, not redone
        now = f.read_text().splitlines()
        assert now[: len(lines)] == lines or now[: len(lines) - 1] == lines[:-1]  # (a torn last line is regenerated)


def test_point_bad_config_one_line_error(tmp_path, cli):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump(dict(run=str(tmp_path / "nope"), k=3, n_candidates=2)))
    r = cli("point", str(cfg))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "k < n_candidates" in r.stderr
    cfg.write_text(yaml.safe_dump(dict(run=str(tmp_path / "nope"))))
    r = cli("point", str(cfg), "--inline")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nope" in r.stderr
    cfg.write_text(
        yaml.safe_dump(dict(run=str(tmp_path / "nope"), bound="student"))
    )  # an unknown bound method: refused when read
    r = cli("point", str(cfg), "--inline")
    assert (
        r.returncode == 2
        and r.stderr.count("\n") == 1
        and "bound: unknown method 'student'" in r.stderr
        and "percentile" in r.stderr
    )


def _annotation(t: str) -> str:
    """One spelling for optional types: the notebook writes `Optional[X]` (papermill parses it), the dataclass `X |
    None`."""
    m = re.fullmatch(r"Optional\[(.+)\]", t)
    return f"{m.group(1)} | None" if m else t


def parameter_mismatches(cls, params: dict, extra=("progress",)) -> list[str]:
    "Differences between a papermill parameters cell (`papermill.inspect_notebook`) and the fields of dataclass `cls`."
    fields = {f.name: f for f in dataclasses.fields(cls)}
    bad = [f"{k}: in the notebook, not a field" for k in sorted(set(params) - set(fields) - set(extra))]
    bad += [f"{k}: a field, missing from the notebook" for k in sorted(set(fields) - set(params))]
    for k in sorted(set(fields) & set(params)):
        f, p = fields[k], params[k]
        if _annotation(p["inferred_type_name"]) != f.type:
            bad.append(f"{k}: type {p['inferred_type_name']} != {f.type}")
        if f.default is not dataclasses.MISSING and ast.literal_eval(p["default"]) != f.default:
            bad.append(f"{k}: default {p['default']} != {f.default!r}")
    return bad


def test_papermill_parameters_are_exactly_pointconfig():
    """The parameters cell of the point notebook has exactly PointConfig's fields, types and defaults; one added field
    is caught."""
    import papermill as pm

    from stalebook.point import PointConfig

    params = pm.inspect_notebook(str(ROOT / "nbs" / "experiments" / "point.ipynb"))
    assert parameter_mismatches(PointConfig, params) == []
    Extended = dataclasses.make_dataclass(
        "Extended", [("new_knob", "int", dataclasses.field(default=3))], bases=(PointConfig,)
    )
    assert parameter_mismatches(Extended, params) == ["new_knob: a field, missing from the notebook"]
    changed = {**params, "k_sketch": {**params["k_sketch"], "default": "512"}}
    assert parameter_mismatches(PointConfig, changed) == ["k_sketch: default 512 != 1024"]


def test_point_kernel_elsewhere_finds_this_process_default_snapshot(tmp_path, tiny_snapshot, shipped_snapshot):
    """A run whose config leaves `snapshot` empty uses the embedded default: the snapshot shipped with the package,
    used as it is (before it shipped, the project's runs/snapshots/tiny, found from the working folder). A study's
    point kernel starts in the unit's folder; when that folder is outside the project, the kernel must still use the
    default this process uses, not look for (and build) one under the unit's folder or the project's."""
    proj, unit = tmp_path / "project", tmp_path / "results" / "unit"
    (proj / "runs" / "snapshots").mkdir(parents=True)
    unit.mkdir(parents=True)
    (proj / "pyproject.toml").write_text("[tool.nbdev]\n")
    shutil.copytree(tiny_snapshot, proj / "runs" / "snapshots" / "tiny")
    (unit / "runs").write_text("a file: a snapshot built under the unit's folder fails at once\n")
    script = f"""
from stalebook.point import PointConfig, execute_point
from stalebook.rollouts import SamplingConfig
from stalebook.trainer import Trainer, TrainConfig
Trainer(TrainConfig(out={str(unit / "train")!r}, snapshot="", steps=2, lineage_steps=(0, 2), prompts_per_step=4,
                    lr=0.05, sampling=SamplingConfig(group_size=4, max_new_tokens=6))).run(progress=False)
r = execute_point(PointConfig(run="train", checkpoint=2, n_candidates=12, n_validation=4, k=3, group_size=4,
                              max_new_tokens=6, groups_per_batch=4, k_sketch=256, n_boot=200), cwd={str(unit)!r})
print("RESULT", r["point"]["checkpoint"])
"""
    r = run_code(script, drop=("STALEBOOK_TINY",), cwd=proj, timeout=600)
    assert r.returncode == 0 and "RESULT 2" in r.stdout, r.stderr[-3000:]
    assert (unit / "runs").is_file() and (
        unit / "train" / "points" / "c-000002" / "point.ipynb"
    ).is_file()  # run by papermill
    assert sorted(p.name for p in (proj / "runs" / "snapshots").iterdir()) == ["tiny"]  # nothing built or locked
    res = json.loads((unit / "train" / "points" / "c-000002" / "result.json").read_text())
    assert res["manifest"]["snapshot_revision"] == read_lock(shipped_snapshot)["revision"]  # the shipped one
