"""The report notebook: its parameters; a report of a partially run registry says PARTIAL in its file names, figure titles
and tables; once frozen it does not, and its table is the frozen one byte for byte."""
import json, sys
from pathlib import Path

import pytest

from stalebook.contracts import freeze
from stalebook.report import run_report
from stalebook.units import run_registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from test_units import ranking_registry   # noqa: E402  (the reduced registry the unit tests use)


def test_report_notebook_parameters():
    import papermill as pm
    params = pm.inspect_notebook(str(ROOT / "nbs" / "experiments" / "report.ipynb"))
    assert {k: (v["inferred_type_name"], v["default"]) for k, v in params.items()} == {
        "registry": ("str", '"tiny:demo"'), "root": ("str", '""'), "out": ("str", '"report"')}


def test_partial_then_frozen_report(tmp_path, tiny_snapshot, monkeypatch):
    monkeypatch.setenv("STALEBOOK_FIGURES", str(tmp_path / "figures"))     # the kernel inherits it: figures stay out of the project
    reg = ranking_registry(tmp_path, tiny_snapshot, name="rep", checkpoints=(2,), seeds=(0, 1))
    root = tmp_path / "root"
    run_registry(reg, root, only="tiny-math-s0", progress=False, log=lambda *a: None)
    nb = run_report(reg, root)
    assert nb.name == "report-PARTIAL.ipynb"
    figs = sorted(p.name for p in (root / "report").glob("*.png"))
    assert figs == [f"report-rep-{w}-PARTIAL.png" for w in ("gain-ratio", "rel", "verdicts")]
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == figs
    assert (root / "report/table-PARTIAL.md").read_text().startswith("# PARTIAL - Tiny-model demonstration")
    text = nb.read_text()
    assert "PARTIAL - registry rep: 1 of 2 points pass every contract" in text
    run_registry(reg, root, progress=False, log=lambda *a: None)
    freeze(reg, root)
    nb = run_report(reg, root)
    assert nb.name == "report.ipynb"
    assert sorted(p.name for p in (root / "report").glob("report-*[!L].png")) == [f"report-rep-{w}.png" for w in ("gain-ratio", "rel", "verdicts")]
    assert (root / "report/table.md").read_bytes() == (root / "frozen/table.md").read_bytes()
    assert json.loads((root / "report/table.json").read_text())["partial"] is False
