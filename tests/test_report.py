"""The report notebook: its parameters; a report of a partially run registry says PARTIAL in its file names, figure
titles and tables; once frozen it does not, and its table is the frozen one byte for byte."""

import json
import sys
from pathlib import Path

from stalebook.contracts import freeze
from stalebook.protocol import DEFAULT_BOUND
from stalebook.report import registry_decisions, run_report
from stalebook.theory.estimators import ESTIMATORS
from stalebook.units import run_registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from test_units import ranking_registry  # noqa: E402  (the reduced registry the unit tests use)


def test_report_notebook_parameters():
    import papermill as pm

    params = pm.inspect_notebook(str(ROOT / "nbs" / "experiments" / "report.ipynb"))
    assert {k: (v["inferred_type_name"], v["default"]) for k, v in params.items()} == {
        "registry": ("str", '"tiny:demo"'),
        "root": ("str", '""'),
        "out": ("str", '"report"'),
    }


def test_partial_then_frozen_report(tmp_path, tiny_snapshot, monkeypatch):
    monkeypatch.setenv(
        "STALEBOOK_FIGURES", str(tmp_path / "figures")
    )  # the kernel inherits it: figures stay out of the project
    reg = ranking_registry(tmp_path, tiny_snapshot, name="rep", checkpoints=(0, 2), seeds=(0, 1))
    root = tmp_path / "root"
    run_registry(reg, root, only="tiny-math-s0", progress=False, log=lambda *a: None)
    nb = run_report(reg, root)
    assert nb.name == "report-PARTIAL.ipynb"
    figs = sorted(p.name for p in (root / "report").glob("*.png"))
    assert figs == [f"report-rep-{w}-PARTIAL.png" for w in ("gain-ratio", "rel", "verdicts")]
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == figs
    assert (root / "report/table-PARTIAL.md").read_text().startswith("# PARTIAL - Tiny-model demonstration")
    text = nb.read_text()
    assert "PARTIAL - registry rep: 2 of 4 points pass every contract" in text
    run_registry(reg, root, progress=False, log=lambda *a: None)
    freeze(reg, root)
    nb = run_report(reg, root)
    assert nb.name == "report.ipynb"
    assert sorted(p.name for p in (root / "report").glob("report-*[!L].png")) == [
        f"report-rep-{w}.png" for w in ("gain-ratio", "rel", "verdicts")
    ]
    assert (root / "report/table.md").read_bytes() == (root / "frozen/table.md").read_bytes()
    assert json.loads((root / "report/table.json").read_text())["partial"] is False
    # what `stalebook demo` prints last: per cell and estimator gate and verdict (the frozen rows), both controls, the
    # forecast
    lines = registry_decisions(reg, root, pools=6, draws=10, boot_reps=20, cells=200)
    assert lines[0].startswith(f"decisions (frozen; bounds: {DEFAULT_BOUND}")
    rows = {(r["checkpoint"], r["estimator"]): r for r in json.loads((root / "frozen/table.json").read_text())["rows"]}
    for c in (0, 2):
        cell = [ln for ln in lines if ln.startswith(f"tiny math c={c} ")]
        for ab in ESTIMATORS:
            (ln,) = [x for x in cell if f"stale g{ab}" in x]
            r = rows[c, f"g{ab}"]
            assert f"{r['admissible']}/2" in ln and r["verdict"] in ln and (r["note"] in ln if r["note"] else True)
        assert any("negative control" in x and "seeds" in x for x in cell)
        # the false-Ineffective control counts at the points that passed the gate (their fresh gain is positive)
        dil = [x for x in cell if "diluted control" in x]
        n_gate = rows[c, "g00"]["admissible"]
        assert (len(dil) == 1 and f"/{n_gate} seeds" in dil[0]) if n_gate else not dil
        (pos,) = [x for x in cell if "positive control" in x]
        assert (
            ("passed in" in pos and "/2 seeds" in pos) if c == 0 else "n/a" in pos
        )  # pi = beta only at the behaviour checkpoint
    (fc,) = [ln for ln in lines if "predicted P(gate)" in ln]
    assert fc.startswith("tiny math c=0 ") and f"observed {rows[0, 'g00']['admissible']} of 2" in fc


def test_control_summary_counts_false_ineffective_at_gated_points():
    """The diluted control counts where the gate passed (there the fresh gain is shown positive): per point, its own
    UB95 <= 0 from `dilute_control`; points that did not pass the gate, or are missing, are left out."""
    from stalebook.core import Domain
    from stalebook.protocol import analyse_point, dilute_control, synthetic_point, synthetic_pool
    from stalebook.report import control_summary

    D = Domain(0, ("test", "controls"))
    pool = synthetic_pool(D, 48, 8, 16, sigma_v=0.2, frac_homog=0.1, signal=1.5)
    pts = []
    for s in range(3):
        cand, val = synthetic_point(pool, D.child(s))
        res = analyse_point(cand, val, 8, D.child(s, "analysis"), n_boot=200)
        summ = res.summary() | dict(admissible=s != 2, negative_control={"false_positive": False})
        pts.append((res, summ))
    cs = control_summary(pts + [(None, None)])
    gated = [dilute_control(p) for p, _ in pts[:2]]
    assert cs["seeds"] == 4 and cs["points"] == 3
    assert cs["dilute_points"] == 2 and cs["dilute_fi"] == sum(d["false_ineffective"] for d in gated)
