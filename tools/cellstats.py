"""Exported-cell sizes of the notebooks: issue 40's cell targets (each exported cell at most 60 lines, a median of
at most 25, and at least 80 % followed by their example or check).

    python tools/cellstats.py                   # per notebook and total
    python tools/cellstats.py --list            # also the cells over the limit, longest first
    python tools/cellstats.py --list --unfollowed nbs/26_trainer.ipynb   # also the exported cells without a check

Counted: every code cell of nbs/*.ipynb (not nbs/experiments, not names starting with `_` or `.`) whose first
line is an export directive (`#| export`, `#| exports`, `#|export`, ...). Its size is its number of lines (blank
lines included). It is *followed* when the next code cell (markdown cells skipped) exists and is not itself
exported: that cell is its example or check.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60  # lines of one exported cell
_export = re.compile(r"^#\|\s*exports?\s*$")
_name = re.compile(r"^(?:async\s+def|def|class)\s+(\w+)|^(\w+)\s*[:=]", re.M)


def _lines(cell) -> list[str]:
    src = cell["source"]
    return (src if isinstance(src, str) else "".join(src)).splitlines()


def exported(cell) -> bool:
    "A code cell whose first line is an export directive."
    lines = _lines(cell)
    return cell["cell_type"] == "code" and bool(lines) and bool(_export.match(lines[0].strip()))


def first_name(lines: list[str]) -> str:
    "The first top-level def/class name of a cell (else the first assigned name, else '-')."
    text = "\n".join(lines)
    m = re.search(r"^(?:async\s+def|def|class)\s+(\w+)", text, re.M) or _name.search(text)
    return next((g for g in m.groups() if g), "-") if m else "-"


def cells(path: Path) -> list[dict]:
    "The exported cells of one notebook: id, lines, first name, followed."
    code = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    out = []
    for i, c in enumerate(code):
        if exported(c):
            nxt = code[i + 1] if i + 1 < len(code) else None
            lines = _lines(c)
            out.append(
                dict(
                    nb=path.name,
                    id=c.get("id", "?"),
                    lines=len(lines),
                    name=first_name(lines),
                    followed=nxt is not None and not exported(nxt),
                )
            )
    return out


def notebooks(paths: list[str]) -> list[Path]:
    if paths:
        return [Path(p) for p in paths]
    return sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith(("_", ".")))


def summary(cs: list[dict]) -> tuple:
    n = len(cs)
    if not n:
        return 0, 0, 0, 0.0, 0.0
    sizes = [c["lines"] for c in cs]
    return (
        n,
        sum(s > LIMIT for s in sizes),
        max(sizes),
        statistics.median(sizes),
        100 * sum(c["followed"] for c in cs) / n,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="notebooks (default: nbs/*.ipynb)")
    ap.add_argument("--list", action="store_true", help=f"list the cells over {LIMIT} lines")
    ap.add_argument("--unfollowed", action="store_true", help="with --list: also the cells not followed by a check")
    a = ap.parse_args(argv)
    every = []
    fmt = "{:<28} {:>5} {:>5} {:>5} {:>7} {:>9}"
    print(fmt.format("notebook", "cells", f">{LIMIT}", "max", "median", "followed"))
    for p in notebooks(a.paths):
        cs = cells(p)
        every += cs
        if cs:
            n, over, mx, med, fol = summary(cs)
            print(fmt.format(p.name, n, over, mx, f"{med:g}", f"{fol:.0f} %"))
    n, over, mx, med, fol = summary(every)
    print(fmt.format("total", n, over, mx, f"{med:g}", f"{fol:.1f} %"))
    if a.list:
        print(f"\ncells over {LIMIT} lines:")
        for c in sorted(every, key=lambda c: -c["lines"]):
            if c["lines"] > LIMIT:
                print(f"  {c['nb']:<28} {c['id']:<10} {c['lines']:>4}  {c['name']}")
        if a.unfollowed:
            print("\ncells not followed by an example or check:")
            for c in every:
                if not c["followed"]:
                    print(f"  {c['nb']:<28} {c['id']:<10} {c['lines']:>4}  {c['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
