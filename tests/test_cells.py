"""Cells a reader can take in: every exported cell of the notebooks at most 60 lines, their median at most 25, and
at least 80 % followed by their example or check (`tools/cellstats.py` counts them; a class too long for one cell is
layered into named classes, each in its own cell with its check, never patched in across cells)."""

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


def test_exported_cells_meet_the_targets():
    every = [c for p in cellstats.notebooks([]) for c in cellstats.cells(p)]
    n, over, mx, med, fol = cellstats.summary(every)
    assert n > 500, "notebooks not found"
    long = [(c["nb"], c["name"], c["lines"]) for c in every if c["lines"] > cellstats.LIMIT]
    assert not long, f"exported cells over {cellstats.LIMIT} lines: {long}"
    assert med <= 25 and fol >= 80, (med, fol)
