"""The staleness study as a registry (stalebook.staleness_study): its train section typed as a partial TrainConfig (a
wrong field or type refused at load in one line; unit configs unchanged); the committed registry's `reduced` slice run
as units (`run_unit` / `run_registry`), checked by its contracts, frozen, and analysed by `stalebook study staleness`;
the analysis checked against the cells' own results (~80 s on the shared 2-core machine); and (slow, ~85 s) a SIGKILLed
unit resumes to the same bytes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from stalebook.core import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).parent / "stalebook")


def _registry(tmp_path, snap):
    "The committed staleness-tiny registry with its model pointed at the session's reduced snapshot."
    d = yaml.safe_load((ROOT / "configs" / "registries" / "staleness-tiny.yaml").read_text())
    d["models"]["tiny"]["snapshot"] = str(snap)
    d["out"] = str(tmp_path / "root")
    f = tmp_path / "staleness-tiny.yaml"
    f.write_text(yaml.safe_dump(d))
    return f


def test_registry_is_the_committed_study():
    "The registry expands into the grid of the committed study results (S x eta x seeds per optimizer)."
    from stalebook.registry import load_registry

    units = load_registry("staleness-tiny").units()
    res = json.loads((ROOT / "results" / "records" / "study_staleness.json").read_text())
    assert res["cells"] == len(units) == 150
    for opt, o in res["optimizers"].items():
        got = {(u.S, u.lr, u.seed) for u in units.values() if u.optimizer == opt}
        assert got == {(S, lr, s) for S in o["S"] for lr in o["eta"] for s in o["seeds"]}


def test_train_section_is_a_typed_partial_trainconfig():
    """The study's train section is a partial TrainConfig: read as attributes at any depth, hashed as the mapping it was
    written as, and each cell's train is that mapping with the cell's fields laid over it (unit configs unchanged)."""
    from stalebook.core import config_dict
    from stalebook.registry import deep_merge, load_registry

    d = yaml.safe_load((ROOT / "configs" / "registries" / "staleness-tiny.yaml").read_text())
    for spec, train in [("staleness-tiny", d["study"]["train"]), ("staleness-tiny:reduced", None)]:
        reg = load_registry(spec)
        train = train or deep_merge(d["study"]["train"], d["slices"]["reduced"]["train"])
        assert type(reg.spec.train).__name__ == "PartialTrainConfig"
        assert (
            reg.spec.train.async_training.mode == "sync-every"
            and reg.spec.train.sampling.group_size == train["sampling"]["group_size"]
        )
        assert config_dict(reg.spec.train) == train  # unset fields are not hashed: the registry hash is unchanged
        for u in reg.units().values():
            per_cell = dict(seed=u.seed, lr=u.lr, optimizer=u.optimizer, async_training={"staleness": u.S})
            arm = next(a for a in reg.spec.optimizers if a.optimizer == u.optimizer)
            want = deep_merge(train, {**per_cell, "max_grad_norm": arm.max_grad_norm})
            assert json.loads(json.dumps(u.cell.train)) == want


BAD_TRAIN = [
    ("prompts_per_stepp: 4", "unknown field 'study.train.prompts_per_stepp'"),
    ("sampling: {group_size: 8, max_new_tokenz: 8}", "unknown field 'study.train.sampling.max_new_tokenz'"),
    ("steps: many", "field 'study.train.steps': expected int, got str 'many'"),
    ("clip_epsilon: [0.2]", "field 'study.train.clip_epsilon': expected float, got list"),
    ("async_training: {staleness: x}", "field 'study.train.async_training.staleness': expected int, got str 'x'"),
    ("async_training: {mode: sync-evry}", "field 'study.train.async_training.mode': must be one of"),
    ("lineage_steps: [0, x]", "field 'study.train.lineage_steps[1]': expected int, got str 'x'"),
]


def _bad_registry(tmp_path, line: str, where: str = "study") -> Path:
    "The committed registry with `line` (YAML) laid over its study's (or its `reduced` slice's) train section."
    from stalebook.registry import deep_merge

    d = yaml.safe_load((ROOT / "configs" / "registries" / "staleness-tiny.yaml").read_text())
    sec = d["study"] if where == "study" else d["slices"]["reduced"]
    sec["train"] = deep_merge(sec["train"], yaml.safe_load(line))
    f = tmp_path / "bad-staleness.yaml"
    f.write_text(yaml.safe_dump(d))
    return f


@pytest.mark.parametrize("line,msg", BAD_TRAIN)
def test_wrong_train_field_or_type_is_refused_at_load(tmp_path, line, msg):
    """A misspelled field or a value of the wrong type in the train section, nested ones included, in the study or in
    a slice that was not asked for: one line naming the registry file and the dotted field, when the registry loads."""
    from stalebook.core import ConfigError
    from stalebook.registry import load_registry

    for where in ("study", "slice"):
        f = _bad_registry(tmp_path, line, where)
        with pytest.raises(ConfigError) as e:
            load_registry(f)
        m = str(e.value)
        assert m.startswith(str(f) + ("" if where == "study" else " (slice reduced)") + ": "), m
        assert msg in m and "\n" not in m, m


def test_cli_status_of_a_bad_registry_is_one_line(tmp_path, cli):
    for line, msg in (BAD_TRAIN[0], BAD_TRAIN[4]):
        f = _bad_registry(tmp_path, line)
        r = cli("status", f)
        assert r.returncode != 0 and r.stdout == "", r
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"stalebook: error: {f}: ") and msg in r.stderr


def test_reduced_study_through_the_registry(tmp_path, tiny_snapshot, monkeypatch):
    """The `reduced` slice (S in {1, 4} x 2 learning rates x 2 seeds, AdamW, 12 steps): every cell a unit, status
    COMPLETE with every contract passing, the frozen table and the study's record agreeing with the cells' results.json,
    eta_max by hand, exact sync-every lags; a second run reads every unit back; `stalebook status` prints FROZEN."""
    monkeypatch.setenv("STALEBOOK_FIGURES", str(tmp_path / "fig"))
    from stalebook.contracts import registry_status
    from stalebook.registry import load_registry

    spec = f"{_registry(tmp_path, tiny_snapshot)}:reduced"
    reg = load_registry(spec)
    root = tmp_path / "root-reduced"
    from stalebook.commands import cmd_study

    args = ["--registry", spec, "--root", str(root), "--json", str(tmp_path / "res.json"), "--figures", "reduced"]
    assert cmd_study(["staleness", *args]) == 0
    status = registry_status(reg, root)
    assert status["state"] == "frozen" and status["totals"]["pass"] == 8
    assert all(not p for r in status["rows"] for p in r["contracts"].values())
    cells = {u: json.loads((root / "units" / u / "cell" / "results.json").read_text()) for u in reg.units()}
    out = json.loads((tmp_path / "res.json").read_text())
    o = out["optimizers"]["adamw"]
    table = json.loads((root / "frozen" / "table.json").read_text())
    assert (
        out["frozen_content_hash"] == table["content_hash"]
        and {k: v for k, v in o.items() if k != "cpu_seconds"} == table["summary"]["adamw"]
    )
    tc = np.array(o["t_collapse"])
    for uid, r in cells.items():
        u = reg.units()[uid]
        i, j, k = [1, 4].index(u.S), [1e-3, 0.3].index(u.lr), u.seed
        assert tc[i, j, k] == r["t_collapse"] and (r["S"], r["lr"], r["seed"]) == (u.S, u.lr, u.seed)
        S = u.S  # sync-every: s(t) = S floor(t / S) - 1, 0 before
        assert r["series"]["lag"][: r["steps_done"]] == [t - max(S * (t // S) - 1, 0) for t in range(r["steps_done"])]
        assert r["steps_done"] == 12 or r["t_collapse"] >= 0
    for i in range(2):  # eta_max per (S, seed) by hand: the largest grid eta with it and every smaller one stable
        for k in range(2):
            ok = [tc[i, j, k] < 0 for j in range(2)]
            assert o["eta_max"][i][k] == (None if not ok[0] else 0.3 if all(ok) else 1e-3)
    assert [(r["optimizer"], r["S"]) for r in table["rows"]] == [("adamw", 1), ("adamw", 4)]
    assert sorted(table["sources"]) == sorted(cells)
    assert all((tmp_path / "fig" / f"reduced_{k}.png").exists() for k in ("phase", "tcollapse", "cosine"))
    before = {u: (root / "units" / u / "cell" / "results.json").stat().st_mtime_ns for u in cells}
    from stalebook.units import run_registry

    assert run_registry(reg, root, progress=False, log=lambda *a: None) == {u: {"cell": "skipped"} for u in cells}
    assert before == {u: (root / "units" / u / "cell" / "results.json").stat().st_mtime_ns for u in cells}
    r = subprocess.run([EXE, "status", spec, "--root", str(root)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("FROZEN - registry staleness-tiny:reduced: all 8 points"), (
        r.stdout + r.stderr
    )


@pytest.mark.slow
@pytest.mark.long
def test_killed_unit_resumes_to_the_same_cell(tmp_path, tiny_snapshot):
    """One unit of the slice run by `stalebook run --only`, SIGKILLed after its step 7 (its run has a checkpoint at 6)
    and once inside its phase's record, then rerun: the same results.json and run files as an uninterrupted run."""
    spec = f"{_registry(tmp_path, tiny_snapshot)}:reduced"
    uid = "adamw-S4-lr0.001-s0"
    run = lambda root, fault="": subprocess.run(
        [EXE, "run", spec, "--only", uid, "--root", str(root), "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, "STALEBOOK_FAULT": fault},
    )
    r = run(tmp_path / "a")
    assert r.returncode == 0, r.stderr[-2000:]
    kills = 0
    for fault in ("step:7", f"phase:{uid}/cell"):
        r = run(tmp_path / "b", fault)
        kills += r.returncode == -9
    assert kills == 2
    r = run(tmp_path / "b")
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = tmp_path / "a" / "units" / uid, tmp_path / "b" / "units" / uid
    for rel in (
        "cell/results.json",
        "cell/run/lineage.json",
        "phases/cell.json",
        "cell/run/ckpt/step-000012/adapter/adapter_model.safetensors",
    ):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    strip = lambda d: [
        {k: v for k, v in x.items() if k not in ("t_gen", "t_step")}
        for x in read_jsonl(d / "cell/run/steps.jsonl").records
    ]
    assert strip(a) == strip(b) and len(strip(a)) == 12


def _flat_sweep(collapsed: bool, logratio: float) -> dict:
    "A synthetic study sweep (S in {1, 4} x 2 etas x 2 seeds, 30 steps), named as `pipeline.study_sweep` names it."
    steps, shp = 30, (2, 2, 2)
    t = np.arange(steps)
    series = dict(
        J=np.full(steps, 0.5),
        gnorm=np.ones(steps),
        lagdist=0.1 * (1 + t % 4),
        logratio=logratio * (1 + t % 4),
        drift=0.01 * t,
        cos=np.zeros(steps),
        ucos=np.zeros(steps),
        kl=np.zeros(steps),
        lag=(t % 4).astype(float),
    )
    sw = {k: np.broadcast_to(v, shp + (steps,)).copy() for k, v in series.items()}
    return dict(S=np.array([1, 4]), eta=np.array([1e-3, 0.3]), seeds=np.array([0, 1]), steps=steps, **sw) | dict(
        t_c=np.full(shp, 20 if collapsed else -1)
    )


@pytest.mark.parametrize(
    "collapsed,logratio", [(False, 0.0), (False, 0.05), (True, 0.05)], ids=["none-Rbatch-inf", "none", "all"]
)
def test_report_figures_render_without_collapse(tmp_path, collapsed, logratio):
    """The study's figures (`staleness_study.study_figures`: study_report, then plot_phase, plot_tcollapse, plot_cosine)
    render for a grid in which no run collapsed — R_crit is then inf, and with log-ratios that do not grow with the lag
    R_batch too, so the rule's bounds are inf (this raised 'Axis limits cannot be NaN or Inf') — and say so; and for
    a grid in which every run collapsed (no stable run: G_upd and the local bound NaN)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from stalebook.pipeline import study_report
    from stalebook.theory.async_sim import plot_cosine, plot_phase, plot_tcollapse

    sw = _flat_sweep(collapsed, logratio)
    rep = study_report(sw, n_boot=20)
    rc = rep["rule"]
    if not collapsed:
        assert rc["R_crit"] == np.inf and np.isinf(rc["horizon"]).all()
        assert (rc["R_batch"] == np.inf) == (logratio == 0.0)
    else:
        assert np.isnan(rc["G_upd"]) and np.isnan(rc["local"]).all()
    fig, ax = plt.subplots(1, 3)
    plot_phase(ax[0], sw, rep["analysis"], rc, "synthetic")
    plot_tcollapse(ax[1], sw, "synthetic")
    plot_cosine(ax[2], sw, "synthetic")
    fig.savefig(tmp_path / "f.png")
    plt.close(fig)
    lo, hi = ax[0].get_ylim()
    assert np.isfinite([lo, hi]).all() and 0 < lo < 1e-3 and hi > 0.3
    notes = [[t.get_text() for t in a.texts] for a in ax]
    if collapsed:
        assert notes == [[], [], []] and ax[1].get_legend() is not None
    else:
        assert notes[1] == ["no run collapsed"] and all(n and n[0].startswith("no run collapsed") for n in notes)
        assert ax[1].get_legend() is None
    assert (tmp_path / "f.png").stat().st_size > 0


def test_claims_read_each_models_record(monkeypatch):
    """The README's staleness rows (`staleness_study.claims`): per model, one verdict per optimizer of its committed
    study record, and the rule-vs-boundary check on it; a model without a record is 'not run', and giving it one is a
    line in STUDY_RECORDS."""
    import stalebook.staleness_study as ss

    rows = ss.claims()
    assert [c.status["smol"] for c in rows] == [  # one seed: no bootstrap over seeds, 3 collapsed runs with S > 0
        "adamw: undetermined",
        "adamw: undetermined",
        "adamw: reproduced",
        "adamw: not reproduced",
        "undetermined: R_crit estimated as 0 (adamw), so the rule's bound is 0",
    ]
    assert rows[1].status == {
        "exact": "grpo: not reproduced; unclipped: not reproduced",
        "tiny": "adamw: reproduced; sgd: reproduced",
        "smol": "adamw: undetermined",
    }
    monkeypatch.delitem(ss.STUDY_RECORDS, "smol")
    assert [c.status["smol"] for c in ss.claims()] == ["not run"] * 5
    monkeypatch.setitem(ss.STUDY_RECORDS, "smol", "study_staleness.json")  # another record under the smol column
    assert [c.status["smol"] for c in ss.claims()] == [c.status["tiny"] for c in rows]


def test_synchronous_diagnostics_change_nothing_but_the_record(tmp_path, shipped_snapshot):
    """S = 0 traced (`async_training.diagnostics`, what the study sets for its S = 0 cells) is the synchronous trainer:
    the same policy after every step and the same rewards as the untraced run, plus lag 0, behaviour distance 0, KL to
    the behaviour ~0 and the update's norm and cosines; its identity differs from the untraced run's."""
    from conftest import small_run

    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import AsyncConfig, identity_dict, run_identity

    # groups of 8 with room to answer: some step's gradient and the next are both non-zero (a cosine to check)
    kw = dict(
        steps=4, lineage_steps=(0, 4), shared_prefix=True, sampling=SamplingConfig(group_size=8, max_new_tokens=16)
    )
    plain = small_run(tmp_path / "plain", shipped_snapshot, **kw)
    traced = small_run(tmp_path / "traced", shipped_snapshot, async_training=AsyncConfig(diagnostics=True), **kw)
    a, b = plain.log.records, traced.log.records
    assert [r["policy_hash"] for r in a] == [r["policy_hash"] for r in b]
    assert [r["reward_mean"] for r in a] == [r["reward_mean"] for r in b] and len(b) == 4
    assert "lag" not in a[0] and [r["lag"] for r in b] == [0] * 4
    assert all(r["lag_dist"] == 0.0 and abs(r["kl_behav_k3"]) < 1e-6 and r["update_norm"] >= 0 for r in b)
    cos = [r["grad_cos"] for r in b]
    assert cos[0] is None and any(c is not None for c in cos) and all(c is None or -1 <= c <= 1 for c in cos)
    assert max(r["update_norm"] for r in b) > 0
    assert "async_training" not in identity_dict(plain.cfg)
    assert identity_dict(traced.cfg)["async_training"]["diagnostics"] is True
    assert run_identity(plain.cfg) != run_identity(traced.cfg)


def test_study_with_a_synchronous_row(tmp_path, tiny_snapshot, monkeypatch):
    """S in {0, 2} (one learning rate, one seed, the reduced slice's 12 steps): the S = 0 cell is the traced synchronous
    trainer (lag 0 at every step, the lag contract met), both cells pass every contract, and the study's analysis
    reports S = 0's eta_max without fitting it (S * eta_max undefined there)."""
    monkeypatch.setenv("STALEBOOK_FIGURES", str(tmp_path / "fig"))
    from stalebook.commands import cmd_study
    from stalebook.contracts import registry_status
    from stalebook.registry import load_registry

    f = _registry(tmp_path, tiny_snapshot)
    d = yaml.safe_load(f.read_text())
    d["slices"]["reduced"].update(staleness=[0, 2], seeds=[0])
    d["slices"]["reduced"]["optimizers"][0]["lr"] = [0.001]
    f.write_text(yaml.safe_dump(d))
    spec, root = f"{f}:reduced", tmp_path / "root0"
    assert cmd_study(["staleness", "--registry", spec, "--root", str(root), "--json", str(tmp_path / "r.json")]) == 0
    reg = load_registry(spec)
    status = registry_status(reg, root)
    assert status["totals"]["pass"] == 2 and all(not p for r in status["rows"] for p in r["contracts"].values())
    r0 = json.loads((root / "units" / "adamw-S0-lr0.001-s0" / "cell" / "results.json").read_text())
    n = r0["steps_done"]
    assert r0["S"] == 0 and r0["series"]["lag"][:n] == [0] * n and r0["series"]["lag_dist"][:n] == [0.0] * n
    o = json.loads((tmp_path / "r.json").read_text())["optimizers"]["adamw"]
    assert o["S"] == [0, 2] and o["S_eta_max"][0] is None
    assert o["eta_max"][0] == [None if r0["t_collapse"] >= 0 else 0.001]
