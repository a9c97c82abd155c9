"""Cells a reader can take in: every exported cell of the notebooks at most 60 lines, their median at most 25, and
at least 80 % followed by their example or check (`tools/cellstats.py` counts them). Where the size and one idea
conflict, one idea wins: a class that is one thing stays one class in one cell (named in `ONE_CLASS`, with why),
never split into layers made to fit the count, and never patched in across cells (no `@patch` in the package)."""

import importlib.util
import json

from conftest import ROOT

spec = importlib.util.spec_from_file_location("cellstats", ROOT / "tools" / "cellstats.py")
cellstats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cellstats)


def notebook(tmp_path, *cells) -> list[dict]:
    "The exported cells `cellstats` finds in a notebook of code cells with these sources."
    nb = {"cells": [{"cell_type": "code", "id": f"c{i}", "source": s} for i, s in enumerate(cells)]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    return cellstats.cells(tmp_path / "x.ipynb")


def test_the_counter_sizes_exported_cells_and_finds_their_checks(tmp_path):
    long = "#| export\nclass A:\n" + "    x = 1\n" * 70
    got = notebook(tmp_path, long, "A()", "#| export\ndef f():\n    pass", "#|export\ng = 1")
    assert [(c["name"], c["lines"], c["followed"]) for c in got] == [("A", 72, True), ("f", 3, False), ("g", 2, False)]
    n, over, mx, med, fol = cellstats.summary(got)
    assert (n, over, mx, med, round(fol)) == (3, 1, 72, 3, 33)


# the classes allowed over the limit, and why each is one idea
ONE_CLASS = {
    "Trainer": "a run's state and its step: the loop, learn and the checkpoint share every field",
    "PointResult": "one point's estimates and the bounds, summary and arrays read from them",
}


def test_exported_cells_meet_the_targets():
    every = [c for p in cellstats.notebooks([]) for c in cellstats.cells(p)]
    n, over, mx, med, fol = cellstats.summary(every)
    assert n > 500, "notebooks not found"
    long = [(c["nb"], c["name"], c["lines"]) for c in every if c["lines"] > cellstats.LIMIT]
    long = [x for x in long if x[1] not in ONE_CLASS]
    assert not long, f"exported cells over {cellstats.LIMIT} lines: {long}"
    assert med <= 25 and fol >= 80, (med, fol)


def test_no_method_is_patched_in():
    "A class's methods are in its body: no fastcore `@patch` in the package's modules."
    patched = [
        (p.name, i + 1)
        for p in sorted((ROOT / "stalebook").rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines())
        if line.lstrip().startswith("@patch")
    ]
    assert not patched, patched
