"""The BOLT comparison as a registry (kind `bolt`): the registry file types and expands into its 45 units; a reduced
slice of it (the `smoke` slice of configs/registries/bolt-tiny.yaml plus one swept beta and the sweep unit, on the
session's reduced snapshot) runs through `run_unit`, is skipped when run again, passes every contract, freezes, and
refuses tampered inputs by unit and contract with nothing frozen, and `stalebook study bolt` writes its record, figures
and claim rows from it (~1.5 min on the shared 2-core machine)."""

import json
from pathlib import Path

import pytest
import yaml

from stalebook.bolt_study import STORES
from stalebook.commands import cmd_status, cmd_study
from stalebook.contracts import FreezeRefused, freeze, problem_lines, registry_status
from stalebook.core import ConfigError
from stalebook.registry import load_registry
from stalebook.units import run_unit

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "configs/registries/bolt-tiny.yaml"


def test_the_registry_lists_its_units():
    reg = load_registry(REG)
    u = reg.units()
    assert len(u) == 3 * (5 + 4 + 1) + 3 * 5
    assert list(u)[:6] == [
        "math-s0-bolt",
        "math-s0-refit",
        "math-s0-positive",
        "math-s0-grpo",
        "math-s0-iterative",
        "math-s0-bolt-beta0.125",
    ]
    assert u["code-s2-grpo"].arm.train.sampling.max_new_tokens == 12 and u["math-s0-iterative"].arm.rounds == 4
    assert u["math-s1-sweep"].kind == "sweep" and u["math-s1-sweep"].betas == (0.125, 0.25, 1.0, 2.0, 0.5)
    assert all(c.arm.stores == STORES and c.arm.train.snapshot == "" and c.model == "tiny" for c in u.values())
    assert list(load_registry(f"{REG}:smoke").units()) == ["math-s0-bolt", "math-s0-refit", "math-s0-grpo"]


def test_bad_registry_fields_are_named(tmp_path):
    r = yaml.safe_load(REG.read_text())
    r["study"]["model"] = "olmo"
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(r))
    with pytest.raises(ConfigError, match=r"a.yaml: field 'study.model': unknown model 'olmo'"):
        load_registry(tmp_path / "a.yaml")
    r = yaml.safe_load(REG.read_text())
    r["study"]["math"]["beta"] = 0.0
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(r))
    with pytest.raises(ConfigError, match=r"b.yaml.*beta must be > 0"):
        load_registry(tmp_path / "b.yaml")


def test_a_reduced_slice_runs_checks_and_freezes(tmp_path, tiny_snapshot, capsys, monkeypatch):
    r = yaml.safe_load(REG.read_text())
    r["models"] = {"tiny": {"snapshot": str(tiny_snapshot)}}
    r["slices"]["smoke"].update(sweep_domains=["math"], betas=[2.0])
    f = tmp_path / "bolt.yaml"
    f.write_text(yaml.safe_dump(r))
    reg, root = load_registry(f"{f}:smoke"), tmp_path / "root"
    ids = list(reg.units())
    assert ids == ["math-s0-bolt", "math-s0-refit", "math-s0-grpo", "math-s0-bolt-beta2", "math-s0-sweep"]
    assert registry_status(reg, root)["totals"]["missing"] == 5
    quiet = dict(progress=False, log=lambda *a: None)
    for uid in ids:
        assert set(run_unit(reg, uid, root, **quiet).values()) == {"ran"}
    assert run_unit(reg, "math-s0-grpo", root, **quiet) == {"train": "skipped", "eval": "skipped", "result": "skipped"}
    st = registry_status(reg, root)
    assert st["state"] == "complete" and st["contracts"] == ["phases", "objective", "lineage", "reference", "budget"], (
        st
    )
    # the arms of the seed share one reference dataset (one store in the shared root) and one prompt schedule
    refs = {
        uid: json.loads((root / "units" / uid / "train/reference-0.json").read_text())["store"]
        for uid in ("math-s0-bolt", "math-s0-refit")
    }
    assert len(set(refs.values())) == 1 and (root / "stores" / refs["math-s0-bolt"] / "complete.json").is_file()
    res = {uid: json.loads((root / "units" / uid / "result.json").read_text()) for uid in ids[:4]}
    assert len({r["budget"]["prompt_schedule_hash"] for r in res.values()}) == 1
    # a phase whose output is gone runs again and writes the same bytes
    before = (root / "units/math-s0-bolt/result.json").read_bytes()
    (root / "units/math-s0-bolt/result.json").unlink()
    assert run_unit(reg, "math-s0-bolt", root, **quiet) == {"train": "skipped", "eval": "skipped", "result": "ran"}
    assert (root / "units/math-s0-bolt/result.json").read_bytes() == before
    # faults, each refused by unit and contract; freeze writes nothing
    w = root / "units/math-s0-refit/train/weighting.json"
    good_w = w.read_text()
    w.write_text(good_w.replace('"beta": 0.5', '"beta": 0.25'))
    rf = root / "units/math-s0-bolt/train/reference-0.json"
    good_r = rf.read_text()
    rec = json.loads(good_r)
    rec["policy_hash"] = "f" * 64
    rf.write_text(json.dumps(rec))
    lines = problem_lines(registry_status(reg, root))
    assert any(
        l.startswith("math-s0-refit objective: train/weighting.json: beta is 0.25, the arm's is 0.5") for l in lines
    ), lines
    assert any(
        l.startswith("math-s0-bolt reference: round 0: the reference dataset was sampled by policy ffffffffffff")
        for l in lines
    ), lines
    assert any(l.startswith("math-s0-bolt phases: phase train: train/reference-0.json: changed") for l in lines), lines
    with pytest.raises(FreezeRefused, match="freeze refused: 2 of 5 registered points"):
        freeze(reg, root)
    assert not (root / "frozen").exists()
    assert cmd_status([f"{f}:smoke", "--root", str(root)]) == 1 and "FAIL" in capsys.readouterr().out
    w.write_text(good_w)
    rf.write_text(good_r)
    fr = freeze(reg, root)
    t = fr["table"]
    assert [x["arm"] for x in t["rows"]] == ["bolt", "refit", "grpo", "bolt-beta2"] and set(t["sources"]) == set(ids)
    assert t["rows"][0]["heldout_pass"] == round(res["math-s0-bolt"]["eval"][-1]["heldout"]["pass_rate"], 4)
    assert list(t["sweeps"]) == ["math-s0-sweep"] and [x["beta"] for x in t["sweeps"]["math-s0-sweep"]] == [2.0, 0.5]
    assert freeze(reg, root)["written"] is False
    assert cmd_status([f"{f}:smoke", "--root", str(root)]) == 0 and capsys.readouterr().out.startswith("FROZEN")
    # the study's record, figures and claim rows from the frozen slice (`stalebook study bolt`; figures in tmp)
    monkeypatch.setenv("STALEBOOK_FIGURES", str(tmp_path / "fig"))
    assert (
        cmd_study(["bolt", "--registry", f"{f}:smoke", "--root", str(root), "--json", str(tmp_path / "sb.json")]) == 0
    )
    rec = json.loads((tmp_path / "sb.json").read_text())
    assert (rec["state"], rec["n_finished"], list(rec["sweeps"])) == ("frozen", 5, ["math-s0-sweep"])
    assert [c[0] for c in rec["claims"][-2:]] == ["training time BOLT / GRPO", "peak memory BOLT / GRPO"]
    # named after the slice: studying a slice never overwrites the whole tiny study's committed figures/bolt_*.png
    names = ["bolt_beta.png", "bolt_rounds.png", "bolt_time.png"]
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == [f"tiny_smoke_{n}" for n in names]
    assert "| claim | paper | embedded model | verdict |" in capsys.readouterr().out
