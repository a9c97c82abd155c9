"""Registries: the five study files load with the registered sizes; a bad field is a one-line error naming the file and
the field; the study's rules (GRPO tables, the SFT appendix, 10,000 replicates, fields set by the study) are refused at
load; a missing or unlocked snapshot is reported with how to prepare and lock it, and nothing starts. No model runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stalebook.core import ConfigError, config_dict
from stalebook.registry import (
    ModelSpec,
    load_registry,
    registry_hash,
    registry_problems,
    registry_root,
    snapshot_problem,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "name,units,points",
    [
        ("tiny", 6, 24),
        ("tiny:demo", 2, 4),
        ("main", 10, 40),
        ("extension", 18, 72),
        ("sft-ablation", 20, 80),
        ("smol", 6, 18),
        ("smol:demo", 2, 4),
        ("smol:pilot", 2, 2),
        ("smol:pilot_code", 2, 2),
    ],
)
def test_registered_sizes(name, units, points):
    reg = load_registry(name)
    fams = reg.units()
    assert (len(fams), sum(len(f.checkpoints) for f in fams.values())) == (units, points)
    assert all(f.point.n_boot == 10_000 for f in fams.values())


def test_study_shapes():
    tiny = load_registry("tiny")
    assert {(f.domain, f.seed) for f in tiny.units().values()} == {(d, s) for d in ("math", "code") for s in (0, 1, 2)}
    assert all(
        f.checkpoints == (0, 25, 100, 400)
        and f.train.steps == 400
        and f.train.lineage_steps == (0, 25, 100, 400)
        and f.train.snapshot == ""
        and tiny.models[f.model].embedded
        for f in tiny.units().values()
    )
    main = load_registry("main").units()
    assert {f.seed for f in main.values()} == set(range(5)) and {f.domain for f in main.values()} == {"math", "code"}
    ext = load_registry("extension")
    assert "confounded" in ext.description and len({f.model for f in ext.units().values()}) == 3
    sft = load_registry("sft-ablation")
    assert sft.spec.table == "appendix" and all(
        f.objective == "sft" and f.train.objective == "sft" for f in sft.units().values()
    )
    assert "not RLVR" in sft.description
    smol = load_registry("smol:demo")  # the real chat model: its system turn chosen, generation shares each prompt
    assert all(
        f.domain == "math_nl"
        and f.train.sampling.system_prompt == "You are a helpful assistant."
        and f.point.shared_prefix
        and f.train.shared_prefix
        and not smol.models[f.model].embedded
        for f in smol.units().values()
    )
    full = load_registry("smol")  # math and code: each family on the snapshot warm-started on its own answer format
    assert {(f.model, f.domain) for f in full.units().values()} == {("smol", "math_nl"), ("smol-code", "code_nl")}
    assert {m: full.models[m].snapshot.rsplit("-", 1)[1] for m in full.models} == {"smol": "math", "smol-code": "code"}


def test_hash_is_the_study_not_the_prose(tmp_path):
    text = (ROOT / "configs/registries/tiny.yaml").read_text()
    (tmp_path / "tiny.yaml").write_text(text.replace("a demonstration of", "a showcase of"))
    assert registry_hash(load_registry(tmp_path / "tiny.yaml")) == registry_hash(load_registry("tiny"))
    (tmp_path / "tiny.yaml").write_text(text.replace("seeds: [0, 1, 2]", "seeds: [0, 1, 3]", 1))
    assert registry_hash(load_registry(tmp_path / "tiny.yaml")) != registry_hash(load_registry("tiny"))
    assert registry_hash(load_registry("tiny:demo")) != registry_hash(load_registry("tiny"))
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import stalebook.ranking_study; from stalebook.registry import *;"
            "print(registry_hash(load_registry('tiny')))",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.stdout.strip() == registry_hash(load_registry("tiny"))  # the same in another process
    bare = subprocess.run(  # a process that loaded no study wing knows no study kind, and says how to load them
        [sys.executable, "-c", "from stalebook.registry import load_registry; load_registry('tiny')"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert (
        bare.returncode != 0 and "unknown kind 'ranking'" in bare.stderr and "import stalebook.commands" in bare.stderr
    )
    assert registry_root(load_registry("tiny:demo")).name == "tiny-demo"


BASE = """name: t
kind: ranking
models: {tiny: {}}
study:
  table: demo
  blocks: [{models: [tiny], domains: [math], seeds: [0]}]
"""


@pytest.mark.parametrize(
    "edit,msg",
    [
        (("domains: [math]", "domains: [physics]"), "field 'study.blocks[0].domains[0]'"),
        (("seeds: [0]", "seedz: [0]"), "unknown field 'study.blocks[0].seedz'"),
        (("models: [tiny]", "models: [olmo]"), "field 'study.blocks[0].models': unknown model 'olmo'"),
        (("table: demo", "table: demo\n  train: {lrr: 1}"), "unknown field 'study.blocks[0].train.lrr'"),
        (("table: demo", "table: demo\n  train: {steps: 50}"), "field 'study.blocks[0].train.steps': set by the study"),
        (
            ("table: demo", "table: demo\n  point: {checkpoint: 3}"),
            "field 'study.blocks[0].point.checkpoint': set by the study",
        ),
        (
            ("table: demo", "table: demo\n  point: {n_boot: 9999}"),
            "9,999 bootstrap replicates; the analysis contract needs exactly 10,000",
        ),
        (("table: demo", "table: demo\n  objective: sft"), "objective 'sft' cannot fill the demo table"),
        (("table: demo", "table: main\n  objective: sft"), "objective 'sft' cannot fill the main table"),
        (("table: demo", "table: appendix"), "table 'appendix' holds only the positive-only SFT ablation"),
        (("table: demo", "table: demo\n  checkpoints: [25, 0]"), "checkpoints must be increasing"),
        (("kind: ranking", "kind: rankin"), "field 'kind': unknown kind 'rankin'"),
        (
            ("seeds: [0]}]", "seeds: [0]}, {models: [tiny], domains: [math], seeds: [0]}]"),
            "unit 'tiny-math-s0' is registered twice",
        ),
    ],
)
def test_bad_registry_is_one_line_naming_file_and_field(tmp_path, edit, msg):
    f = tmp_path / "t.yaml"
    f.write_text(BASE.replace(*edit))
    with pytest.raises(ConfigError) as e:
        load_registry(f)
    assert msg in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_every_slice_is_typed_when_the_registry_loads(tmp_path):
    "A bad field in a slice is refused on loading the registry or any other slice of it, naming the slice."
    f = tmp_path / "t.yaml"
    f.write_text(BASE + "slices:\n  ok: {table: demo}\n  broken: {blocks: [{models: [tiny], domainz: [math]}]}\n")
    for spec in (f, f"{f}:ok", f"{f}:broken"):
        with pytest.raises(ConfigError) as e:
            load_registry(spec)
        assert str(e.value).startswith(f"{f} (slice broken): unknown field 'study.blocks[0].domainz'"), str(e.value)
    f.write_text(BASE + "slices:\n  ok: {table: demo}\n")
    assert load_registry(f"{f}:ok").name == "t:ok" and load_registry(f).name == "t"


def test_cli_bad_registry_one_line(tmp_path, cli):
    f = tmp_path / "t.yaml"
    f.write_text(BASE.replace("seeds: [0]", "seeds: [zero]"))
    r = cli("status", str(f))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "study.blocks[0].seeds[0]" in r.stderr
    r = cli("run", "nope-registry")
    assert r.returncode == 2 and "registry 'nope-registry' not found" in r.stderr and "tiny" in r.stderr


def test_status_and_run_of_main_without_its_snapshot(tmp_path, cli, monkeypatch):
    "On a machine without the 7B snapshot: which snapshot, how to prepare and lock it, exit != 0, nothing started."
    monkeypatch.delenv("STALEBOOK_OLMO3_7B", raising=False)
    for cmd in ("status", "run"):
        r = cli(cmd, "main", "--root", tmp_path / "root")
        assert r.returncode != 0, cmd
        assert "model 'olmo-3-7b' needs a local snapshot: $STALEBOOK_OLMO3_7B is not set" in r.stderr, (cmd, r.stderr)
        assert (
            "allenai/Olmo-3-1025-7B" in r.stderr
            and "stalebook snapshot lock DIR" in r.stderr
            and "nothing was started" in r.stderr
        )
        assert not (tmp_path / "root").exists()


def test_snapshot_folder_unlocked_or_of_another_revision(tmp_path, monkeypatch):
    from stalebook.snapshot import write_lock

    d = tmp_path / "snap"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.setenv("STALEBOOK_TEST_7B", str(d))
    m = ModelSpec(snapshot_env="STALEBOOK_TEST_7B", source="org/m")
    assert f"is not locked (no stalebook.lock.json); run `stalebook snapshot lock {d}`" in snapshot_problem("m", m)
    lock = write_lock(d, domains=("math",))
    assert snapshot_problem("m", m) is None
    assert "the registry was written for 000000" in snapshot_problem(
        "m", ModelSpec(snapshot_env="STALEBOOK_TEST_7B", revision="0" * 64)
    )
    assert snapshot_problem("m", ModelSpec(snapshot=str(d), revision=lock["revision"])) is None
    reg = load_registry("main")
    monkeypatch.setenv("STALEBOOK_OLMO3_7B", str(d))
    assert registry_problems(reg) == []


def test_a_relative_snapshot_lies_under_the_project_root_from_any_cwd(tmp_path, monkeypatch):
    "A point runs in its own folder (a papermill kernel): the registry's relative snapshot must not follow the cwd."
    from stalebook.core import project_root

    root = project_root()
    m = ModelSpec(snapshot="runs/snapshots/x", prepare="make smol-warm")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STALEBOOK_PROJECT", str(root))
    assert m.folder() == str(root / "runs/snapshots/x")
    monkeypatch.setenv("STALEBOOK_TEST_SNAP", "rel/dir")
    assert ModelSpec(snapshot_env="STALEBOOK_TEST_SNAP").folder() == str(tmp_path / "rel/dir")
    assert "to prepare it: run `make smol-warm`" in snapshot_problem("smol", m)
    # the added field stays out of the registry hash while unset, so earlier registries keep their hash
    assert "prepare" not in config_dict(ModelSpec(snapshot="a"))
