"""The report notebook: its parameters; a report of a partially run registry says PARTIAL in its file names, figure
titles and tables; once frozen it does not, and its table is the frozen one byte for byte. The report writes only
under the registry's root; publishing (the committed results the README reads) is refused for a registry that is not
frozen or whose report is not of the frozen table. A run's frozen table does not depend on the folders it ran in."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from stalebook.contracts import freeze
from stalebook.core import StalebookError, hash_json
from stalebook.protocol import DEFAULT_BOUND
from stalebook.registry import load_registry
from stalebook.report import PUBLISHED_FIGURES, publish_report, registry_decisions, run_report
from stalebook.theory.estimators import ESTIMATORS
from stalebook.units import run_registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from conftest import content_files, ranking_registry  # noqa: E402  (the reduced registry the unit tests use)


def test_report_notebook_parameters():
    import papermill as pm

    params = pm.inspect_notebook(str(ROOT / "nbs" / "experiments" / "report.ipynb"))
    assert {k: (v["inferred_type_name"], v["default"]) for k, v in params.items()} == {
        "registry": ("str", '"tiny:demo"'),
        "root": ("str", '""'),
        "out": ("str", '"report"'),
    }


def listing(d: Path) -> dict:
    "{relative path: (size, mtime_ns)} of every file under d ({} if d does not exist)."
    return {p.relative_to(d).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*") if p.is_file()}


def leaked(registry: str) -> list[Path]:
    "A registry's report figures or published results in this repository's figures/ or results/ (there must be none)."
    return [*(ROOT / "figures").glob(f"report-{registry}-*"), *(ROOT / "results").glob(f"{registry}*")]


def test_partial_then_frozen_report(tmp_path, tiny_snapshot, monkeypatch, cli):
    # a trap: anything still writing to "the project's figures/" (core.figures_dir) would land here; the kernel
    # inherits the variable
    monkeypatch.setenv("STALEBOOK_FIGURES", str(tmp_path / "figures"))
    assert not leaked("rep")
    reg = ranking_registry(tmp_path, tiny_snapshot, name="rep", checkpoints=(0, 2), seeds=(0, 1))
    root, res = tmp_path / "root", tmp_path / "results"
    run_registry(load_registry(reg), root, only="tiny-math-s0", progress=False, log=lambda *a: None)
    before = set(listing(root))
    nb = run_report(load_registry(reg), root)
    assert nb.name == "report-PARTIAL.ipynb"
    assert all(f.startswith("report/") for f in set(listing(root)) - before)  # only the report folder is new
    figs = sorted(p.name for p in (root / "report").glob("*.png"))
    assert figs == [f"report-rep-{w}-PARTIAL.png" for w in ("gain-ratio", "rel", "verdicts")]
    assert (root / "report/table-PARTIAL.md").read_text().startswith("# PARTIAL - Tiny-model demonstration")
    text = nb.read_text()
    assert "PARTIAL - registry rep: 2 of 4 points pass every contract" in text
    # publishing a partial registry is refused before anything runs, in one line, and writes nothing
    r = cli("report", reg, "--root", root, "--publish", "--results", res)
    assert r.returncode == 2 and r.stdout == ""
    assert (
        r.stderr == "stalebook: error: publish refused: PARTIAL - registry rep: 2 of 4 points pass every "
        "contract (0 failing, 2 missing); not paper numbers\n"
    )
    assert not res.exists() and not (root / "report/report.ipynb").exists()
    run_registry(load_registry(reg), root, progress=False, log=lambda *a: None)
    with pytest.raises(StalebookError, match="publish refused: COMPLETE - registry rep"):  # complete, not frozen
        publish_report(load_registry(reg), root, res)
    freeze(load_registry(reg), root)
    with pytest.raises(StalebookError, match="holds no report of the frozen table"):  # frozen, report still partial
        publish_report(load_registry(reg), root, res)
    assert not res.exists()
    nb = run_report(load_registry(reg), root)
    assert nb.name == "report.ipynb"
    assert sorted(p.name for p in (root / "report").glob("report-*[!L].png")) == [
        f"report-rep-{w}.png" for w in ("gain-ratio", "rel", "verdicts")
    ]
    assert (root / "report/table.md").read_bytes() == (root / "frozen/table.md").read_bytes()
    assert json.loads((root / "report/table.json").read_text())["partial"] is False
    # published: the frozen table byte for byte and the report's figures, in results/<registry>/
    out = publish_report(load_registry(reg), root, res)
    assert out == res / "rep"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["table.json", "table.md"] + [f"{w}.png" for w in PUBLISHED_FIGURES]
    )
    for f in ("table.json", "table.md"):
        assert (out / f).read_bytes() == (root / "frozen" / f).read_bytes()
    for w in PUBLISHED_FIGURES:
        assert (out / f"{w}.png").read_bytes() == (root / f"report/report-rep-{w}.png").read_bytes()
    assert not (tmp_path / "figures").exists()  # nothing went to the project's figures/ ...
    assert not leaked("rep")  # ... nor into the repository's figures/ or results/
    # what `stalebook demo` prints last: per cell and estimator gate and verdict (the frozen rows), both controls, the
    # forecast
    lines = registry_decisions(load_registry(reg), root, pools=6, draws=10, boot_reps=20, cells=200)
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
        # the positive control applies where pi = beta: at the behaviour checkpoint, and later only where training
        # has not moved the policy (a reduced model whose every group had zero advantage)
        (pos,) = [x for x in cell if "positive control" in x]
        same = [
            json.loads((root / f"units/tiny-math-s{s}/points/c-{c:06d}/result.json").read_text())["result"][
                "positive_control"
            ]
            is not None
            for s in (0, 1)
        ]
        assert all(same) or c != 0
        assert ("passed in" in pos and f"/{sum(same)} seeds" in pos) if any(same) else "n/a" in pos
    (fc,) = [ln for ln in lines if "predicted P(gate)" in ln]
    assert fc.startswith("tiny math c=0 ") and f"observed {rows[0, 'g00']['admissible']} of 2" in fc
    # --pilots: the gate passes pilot points predict at every cell's design against the observed ones, written and
    # published with the table; an unreadable pilot is refused in one line before anything runs
    rep_nb = root / "report/report.ipynb"
    t0 = rep_nb.stat().st_mtime_ns
    r = cli("report", reg, "--root", root, "--pilots", tmp_path / "none.json", "--publish", "--results", res)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"stalebook: error: stalebook report: no such file: {tmp_path / 'none.json'}\n"
    assert rep_nb.stat().st_mtime_ns == t0 and not (root / "report/forecast.json").exists()
    pilot = root / "units/tiny-math-s0/points/c-000000/result.json"
    r = cli("report", reg, "--root", root, "--pilots", pilot, "--publish", "--results", res)
    assert r.returncode == 0, r.stderr
    fc = json.loads((res / "rep/forecast.json").read_text())
    assert (res / "rep/forecast.json").read_bytes() == (root / "report/forecast.json").read_bytes()
    table = json.loads((res / "rep/table.json").read_text())
    assert fc["content_hash"] == table["content_hash"] and list(fc["pilots"]) == [str(pilot)]
    assert sorted(c["checkpoint"] for c in fc["cells"]) == [0, 2]
    for c in fc["cells"]:  # observed: the table's gate passes (counted by the freeze, not by the forecast)
        assert (c["observed"], c["registered"]) == (rows[c["checkpoint"], "g00"]["admissible"], 2)
        assert (c["pilots"], c["source"], len(c["per_seed"])) == (1, "pilots", 1) and 0 <= c["p_gate"] <= 1
    assert sum("predicted P(gate)" in ln and "from the pilots' mean Rel_k" in ln for ln in r.stdout.splitlines()) == 2
    # a frozen table that no longer hashes to its content hash (a hand-edited number) is not published
    f, t = root / "frozen/table.json", json.loads((root / "frozen/table.json").read_text())
    t["rows"][0]["verdict"] = "Effective" if t["rows"][0]["verdict"] != "Effective" else "Ineffective"
    f.write_text(json.dumps(t, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    with pytest.raises(StalebookError, match="does not hash to its content hash"):
        publish_report(load_registry(reg), root, tmp_path / "again")
    assert not (tmp_path / "again").exists()


# slow (27 s here: two runs of a registry); test_partial_then_frozen_report stays in the default run
@pytest.mark.slow
def test_frozen_table_does_not_depend_on_the_folders(tmp_path, tiny_snapshot, monkeypatch, cli):
    """The same registry run in two project folders, each with its own copy of the snapshot (as two clones at
    different paths would be), once by `run_registry` + `freeze` and once by `stalebook demo`: the frozen tables are
    byte-identical, content hash included, and so is every content file of the runs (peft records the base model's
    folder in adapter_config.json and its model card; stalebook's adapters do not). The demo writes only under the
    project's runs/ (its registry's root, the snapshot's lock) and says where its report is."""
    assert not leaked("where")
    monkeypatch.delenv("STALEBOOK_PROJECT", raising=False)
    monkeypatch.delenv("STALEBOOK_FIGURES", raising=False)
    roots = {}
    for side in ("a", "b"):
        d = tmp_path / side / "clone"  # a project: the demo resolves its paths from here
        (d / "configs").mkdir(parents=True)
        (d / "pyproject.toml").write_text("[tool.nbdev]\n")
        snap = d / "runs/snapshots/tiny"
        shutil.copytree(tiny_snapshot, snap)
        monkeypatch.setenv("STALEBOOK_TINY", str(snap))  # the embedded model's folder in this clone
        monkeypatch.chdir(d)
        reg = d / "configs/where.yaml"
        reg.write_text(
            ranking_registry(tmp_path / side, tiny_snapshot, name="where", checkpoints=(0, 1), seeds=(0,))
            .read_text()
            .replace(f"models: {{tiny: {{snapshot: {tiny_snapshot}}}}}", "out: runs/where\nmodels: {tiny: {}}")
        )
        assert "snapshot" not in reg.read_text()  # the embedded model: no folder in the registry (or its hash)
        root = roots[side] = d / "runs/where"
        before = set(listing(d))
        if side == "a":
            run_registry(load_registry(reg), root, progress=False, log=lambda *a: None)
            freeze(load_registry(reg), root)
        else:
            r = cli("demo", reg, "--workers", 1)  # the registry's `out`, under this project
            assert r.returncode == 0, r.stderr
            assert f"[demo] report: {root / 'report'} " in r.stdout
            assert (root / "report/report.ipynb").is_file()
        assert all(f.startswith("runs/") for f in set(listing(d)) - before)  # nothing outside runs/
        adapters = list(root.rglob("adapter_config.json"))
        assert adapters and all(str(tmp_path) not in p.read_text() for p in adapters)
    ta, tb = ((roots[s] / "frozen/table.json").read_bytes() for s in "ab")
    assert ta == tb and json.loads(ta)["content_hash"] == hash_json(
        {k: v for k, v in json.loads(ta).items() if k != "content_hash"}
    )
    content = {s: {k: v for k, v in content_files(roots[s]).items() if not k.startswith("report/")} for s in "ab"}
    assert content["a"] == content["b"]
    assert not leaked("where")  # nor into this repository's figures/ or results/


def test_the_ranking_claim_reads_each_models_published_table(tmp_path, monkeypatch):
    """The README's ranking row (`report.claims`): per model, the published frozen table's content hash, its number of
    points and the verdicts counted per checkpoint; a model with nothing published says how to publish it."""
    from stalebook.report import PUBLISHED, claims

    (tmp_path / "pyproject.toml").write_text("[tool.nbdev]\n")
    rows = [dict(checkpoint=0, verdict="Effective"), dict(checkpoint=0, verdict="Inconclusive")]
    t = dict(content_hash="ab" * 32, sources={"a": 1, "b": 2}, rows=rows + [dict(checkpoint=4, verdict="Ineffective")])
    smol = tmp_path / "results" / PUBLISHED["smol"][0]
    smol.mkdir(parents=True)
    (smol / "table.json").write_text(json.dumps(t))
    monkeypatch.setenv("STALEBOOK_PROJECT", str(tmp_path))
    (c,) = claims()
    verdicts = "c=0: Effective 1/2, Inconclusive 1/2; c=4: Ineffective 1/1"
    assert c.paper == "ranking" and c.status == {
        "tiny": PUBLISHED["tiny"][2],
        "smol": f"smol screened demo (frozen table `{'ab' * 8}`, 2 points): {verdicts}",
        "7b": "main study not yet run",
    }
    # a gate forecast of this table (`stalebook report --pilots`) adds the passes, observed and predicted; one of
    # another table is not read
    cells = [dict(observed=0, registered=2, expected=0.6), dict(observed=1, registered=1, expected=0.3)]
    (smol / "forecast.json").write_text(json.dumps(dict(content_hash="ab" * 32, cells=cells)))
    assert claims()[0].status["smol"].endswith(f"{verdicts}; gate passed in 1 of 3 seeds, 0.9 predicted from the pilot")
    (smol / "forecast.json").write_text(json.dumps(dict(content_hash="cd" * 32, cells=cells)))
    assert claims()[0].status["smol"].endswith(verdicts)
