"""Executable-paper check: run the notebooks exactly as `nbdev-test` does, and fail when a committed text
output no longer matches what the cell prints today.

    python tools/nbcheck.py --n-workers 2 --skip-folder-re '^experiments$'    # check (what `make test` runs)
    python tools/nbcheck.py --flags slow nbs/14_reliability.ipynb             # also re-check `slow` cells
    python tools/nbcheck.py --save nbs/12_margin.ipynb                        # execute and store the outputs

Execution is nbdev's own: `nbdev.test.nbdev_test` (file selection, config, `--flags`, `--n-workers`,
`--timing`, cell timeout) calls `nbdev.test.test_nb` (frontmatter `skip_exec`, `#| eval: false`, the
`tst_flags` `slow`/`gpu`, cwd = the notebook's folder, `IN_TEST=1`, execnb's `CaptureShell`). This tool
only swaps in a `test_nb` that calls the original one with a shell subclass that records which cells ran
and what they output; so every notebook runs once, and a failing cell fails the run as under `nbdev-test`.

What is compared, per code cell that ran in this run and whose committed outputs hold text:
stdout streams (consecutive ones joined), and the `text/markdown` and `text/plain` data of results and
displays, in order; an image counts as a one-line `[image/png]` placeholder (its presence is checked,
its pixels are not). Not compared: stderr (warnings, progress lines), `text/html` (a rendering of the
same object), errors (a raising cell fails the run anyway). Cells without committed text outputs are
not checked; cells that did not run (`slow` without `--flags slow`, `eval: false`) keep their outputs.
Figures a checked notebook saves go to a scratch folder (`$STALEBOOK_FIGURES`), so a check writes nothing tracked;
with `--save` they go to `figures/` with the outputs.

Prose is checked against the outputs: a number with two or more decimals that a Markdown cell quotes (outside
`$math$` and `code` spans) must appear in some committed output of the same notebook (`prose_numbers`), so a
result is never only retyped — it is shown by a cell whose output the comparison checks.

A cell tagged `measured` (cell metadata `"tags": ["measured"]`) holds a wall-clock measurement (a throughput,
a speed ratio) or a property of the machine (which isolation its sandbox gets): `--save` keeps its outputs \
so a reader sees what was measured, but they are never compared,
because no normalisation makes a timing repeat on another machine. Only such cells carry the tag; \
everything else is compared.

Numerics: nbcheck imports `stalebook.core` before any worker starts, which pins the CPU numerics (ATen's
capability, MKL's reproducibility branch, oneDNN's ISA) in the environment every notebook inherits, so the
committed outputs are compared with what any x86-64 CPU with AVX2 computes. A worker whose numerics are not
pinned (no AVX2, or `STALEBOOK_NUMERICS=native`) still runs every notebook and its checks, but neither compares
nor saves outputs, and says so.

Normalisation, applied to both sides before comparing (`normalise`):
* ANSI escapes removed; a carriage return keeps only the text after it (what a terminal shows);
  tqdm-style bar lines (`37%|####  | 37/100`) dropped;
* memory addresses: nbdev-clean's ` at 0x7f..` removal, then any other `0x` + 8 or more hex digits -> `0x<addr>`;
* timings: ISO timestamps -> `<timestamp>`, clock times `0:01:02` / `01:02.5` -> `<clock>`, a number
  followed by `s`/`ms`/`us`/`µs`/`ns`/`sec`/`secs`/`seconds`/`min`/`h` -> `<time>`, \
rates `12.3 it/s` / `s/it` -> `<rate>`;
* absolute paths: the checkout root -> `<root>`, the temp dir (and `/tmp`) followed by a path -> `<tmp>`,
  the home directory -> `~`;
* trailing whitespace on each line and trailing blank lines removed.

`--save` executes the notebooks and writes the new outputs of the cells that ran into the notebook
file, then applies nbdev-clean's own `clean_nb` with this repo's config (execution counts dropped,
output metadata dropped, ` at 0x..` removed), so a later `nbdev-clean` leaves the file unchanged.
It drops stderr streams (named in its report) and refuses to write a notebook (naming the cell) whose
outputs hold progress-bar noise (a carriage return or a tqdm bar in stdout, a widget), more than
`TEXT_CAP` (20 KB) of text in one cell, an image larger than `IMAGE_CAP` (250 KB, base64), or the
absolute path of the checkout (it differs on every clone: print paths relative to it).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import nbdev.test as _nbt
from execnb.shell import CaptureShell

ROOT = Path(__file__).resolve().parents[1]
TEXT_CAP = 20_000  # bytes of text (stdout + text/* data) one cell may store
IMAGE_CAP = 250_000  # bytes of one base64 image
DIFF_LINES = 40  # lines of unified diff shown per differing cell
COMPARED_MIME = ("text/markdown", "text/plain")
MEASURED_TAG = "measured"  # cell tag: its outputs are kept (saved) but never compared
_orig_test_nb = getattr(_nbt, "_nbcheck_orig", _nbt.test_nb)  # nbdev's own, even when imported twice
_nbt._nbcheck_orig = _orig_test_nb

# ---------------------------------------------------------------------------------------------- normalise
_ansi = re.compile(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")
_bar = re.compile(r"^.*\d+%\|.*\|.*$", re.M)
_repr_at = re.compile(r"(<.*?)( at 0x[0-9a-fA-F]+)(>)")  # what nbdev-clean removes (clean_ids)
_addr = re.compile(r"0x[0-9a-fA-F]{8,}")
_stamp = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?")
_clock = re.compile(r"(?<![\d:.])\d{1,2}:\d\d(?::\d\d)?(?:\.\d+)?(?![\d:])")
_rate = re.compile(r"\d+(?:\.\d+)?\s?(?:it/s|s/it)")
_time = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|seconds|secs|sec|min|s|h)(?![\w/])")


def _path_subs() -> list[tuple[re.Pattern, str]]:
    "Absolute paths to replace, longest first: checkout root, temp dir, home."
    subs, seen = [], set()
    for p, name in [(str(ROOT), "<root>"), (os.path.realpath(ROOT), "<root>")]:  # first: a checkout may lie in /tmp
        if p not in seen and len(p) > 1:
            seen.add(p)
            subs.append((re.compile(re.escape(p)), name))
    tmp = {tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir()), "/tmp"}
    for p in sorted(tmp, key=len, reverse=True):
        subs.append((re.compile(re.escape(p.rstrip("/")) + r"/[^\s'\"`)\],:;]*"), "<tmp>"))
    if len(str(Path.home())) > 1:
        subs.append((re.compile(re.escape(str(Path.home()))), "~"))
    return subs


def normalise(text: str) -> str:
    "The comparable form of one output text (see the module docstring for the rules)."
    text = _ansi.sub("", text)
    text = "\n".join(l.rsplit("\r", 1)[-1] for l in text.split("\n"))
    text = _bar.sub("", text)
    text = _repr_at.sub(r"\1\3", text)
    text = _addr.sub("0x<addr>", text)
    for pat, rep in _path_subs():
        text = pat.sub(rep, text)
    text = _stamp.sub("<timestamp>", text)
    text = _clock.sub("<clock>", text)
    text = _rate.sub("<rate>", text)
    text = _time.sub("<time>", text)
    lines = [l.rstrip() for l in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- comparable
def _join(v) -> str:
    return v if isinstance(v, str) else "".join(v)


def comparable(outputs) -> str | None:
    "The compared text of a cell's outputs (normalised), or None if they hold no compared text."
    parts, has_text = [], False  # parts: [kind, raw text]; consecutive stdout streams are joined raw
    for o in outputs or []:
        ot = o.get("output_type")
        if ot == "stream" and o.get("name") == "stdout":
            if parts and parts[-1][0] == "stdout":
                parts[-1][1] += _join(o.get("text", ""))
            else:
                parts.append(["stdout", _join(o.get("text", ""))])
            has_text = True
        elif ot in ("execute_result", "display_data"):
            data = o.get("data", {})
            for m in COMPARED_MIME:
                if m in data:
                    parts.append([m, _join(data[m])])
                    has_text = True
            parts += [[m, None] for m in sorted(data) if m.startswith("image/")]
    if not has_text:
        return None
    return "\n".join(f"[{k}]" if v is None else f"[{k}]\n" + normalise(v) for k, v in parts)


_math_code = re.compile(r"\$\$.*?\$\$|\$[^$\n]*\$|`[^`\n]*`", re.S)
_quoted = re.compile(r"(?<![\w.])[+\u2212-]?(\d+\.\d{2,})(?![\w.])")


def prose_numbers(nb: dict) -> list[str]:
    """A message for every number with two or more decimals that a Markdown cell quotes (outside `$math$` and
    `code`) and that no committed output of the same notebook contains: prose may quote a result only where an
    output shows it, so the output comparison checks the quote too."""
    out = "\n".join(
        comparable([o]) or ""
        for c in nb.get("cells", [])
        for o in c.get("outputs", [])
        if MEASURED_TAG not in c.get("metadata", {}).get("tags", [])
    )  # shown, not compared: no support
    msgs = []
    for i, c in enumerate(nb.get("cells", [])):
        if c.get("cell_type") != "markdown":
            continue
        for x in _quoted.findall(_math_code.sub(" ", _join(c.get("source", "")))):
            if x not in out:
                msgs.append(f"cell {i + 1} (id {c.get('id')}): prose quotes {x}, which no output of the notebook shows")
    return msgs


def compare_cells(name: str, committed: dict, ran: list) -> tuple[list[str], int]:
    """(a message for every cell in `ran` (executed cells) whose committed text outputs differ, number of cells
    compared)."""
    by_id = {c.get("id"): (i, c) for i, c in enumerate(committed["cells"])}
    msgs, n = [], 0
    for cell in ran:
        i, old = by_id.get(cell.get("id"), (None, None))
        if old is None:
            continue
        if MEASURED_TAG in old.get("metadata", {}).get("tags", []):
            continue  # a wall-clock measurement: shown, not compared
        want = comparable(old.get("outputs"))
        if want is None:
            continue
        n += 1
        got = comparable(cell.get("outputs")) or ""
        if got == want:
            continue
        diff = list(
            difflib.unified_diff(want.splitlines(), got.splitlines(), "committed", "re-executed", n=2, lineterm="")
        )
        if len(diff) > DIFF_LINES:
            diff = diff[:DIFF_LINES] + [f"... ({len(diff) - DIFF_LINES} more diff lines)"]
        msgs.append(
            f"notebook {name} cell {i + 1} (id {cell.get('id')}): committed output differs:\n" + "\n".join(diff)
        )
    return msgs, n


# ----------------------------------------------------------------------------------------------- saving
def _text_size(o) -> int:
    if o.get("output_type") == "stream":
        return len(_join(o.get("text", "")).encode())
    return sum(len(_join(v).encode()) for k, v in o.get("data", {}).items() if k.startswith("text/"))


def outputs_to_save(outputs) -> tuple[list, list[str], bool]:
    "(outputs to store, problems that refuse the save, whether stderr was dropped) for one executed cell."
    keep, problems, dropped = [], [], False
    for o in outputs or []:
        o = json.loads(json.dumps(o))  # plain dicts, detached from the executed notebook
        if o.get("output_type") == "stream":
            if o.get("name") != "stdout":
                dropped = True
                continue
            txt = _join(o["text"])
            if "\r" in txt or _bar.search(_ansi.sub("", txt)):
                problems.append("progress-bar noise in stdout")
            if keep and keep[-1].get("output_type") == "stream":
                keep[-1]["text"] = _join(keep[-1]["text"]) + txt
                continue
            o["text"] = txt
        if o.get("output_type") == "error":
            problems.append(f"an error output ({o.get('ename')})")
        data = o.get("data", {})
        if any("widget" in k for k in data):
            problems.append("a widget output (progress bar?)")
        for k, v in data.items():
            if k.startswith("image/") and len(_join(v)) > IMAGE_CAP:
                problems.append(f"{k} of {len(_join(v))} bytes > {IMAGE_CAP}")
        keep.append(o)
    if any(
        str(ROOT) in _join(o.get("text", ""))
        or any(str(ROOT) in _join(v) for k, v in o.get("data", {}).items() if k.startswith("text/"))
        for o in keep
    ):
        problems.append(
            f"the absolute path of this checkout ({ROOT}): print paths relative to it, which every clone shares"
        )
    size = sum(_text_size(o) for o in keep)
    if size > TEXT_CAP:
        problems.append(f"{size} bytes of text > {TEXT_CAP}")
    for o in keep:
        if o.get("output_type") == "stream":
            o["text"] = o["text"].splitlines(True)
    return keep, sorted(set(problems)), dropped


def save_outputs(fn: Path, committed: dict, ran: list) -> tuple[bool, list[str]]:
    "Write the outputs of the cells in `ran` into `fn`, then nbdev-clean it; False and messages if refused."
    from fastcore.nbio import dict2nb, write_nb
    from fastcore.xtras import working_directory
    from nbdev.clean import nbdev_clean
    from nbdev.config import get_config

    if get_config(fn.parent).clear_all:
        return False, [f"{fn}: clear_all = true, nbdev-clean would remove the outputs"]
    idx = {c.get("id"): i for i, c in enumerate(committed["cells"])}
    msgs, refused = [], False
    for cell in ran:
        i = idx.get(cell.get("id"))
        if i is None or committed["cells"][i].get("cell_type") != "code":
            continue
        outs, problems, dropped = outputs_to_save(cell.get("outputs"))
        where = f"notebook {fn.name} cell {i + 1} (id {cell.get('id')})"
        if problems:
            refused = True
            msgs.append(f"{where}: not saved: " + "; ".join(problems))
        if dropped:
            msgs.append(f"{where}: stderr not stored")
        committed["cells"][i]["outputs"] = outs
    if refused:
        return False, msgs
    write_nb(dict2nb(committed), fn)
    with working_directory(fn.parent):
        nbdev_clean.__wrapped__(fname=str(fn))  # the repo's own clean, as `nbdev-clean` run there
    return True, msgs


# ------------------------------------------------------------------------------------ nbdev integration
class RecordingShell(CaptureShell):
    "execnb's shell, remembering the cells it executed (with their fresh outputs) for `check_nb`."

    ran: list | None = None

    def cell(self, cell, *args, **kwargs):
        r = super().cell(cell, *args, **kwargs)
        if cell.cell_type == "code" and RecordingShell.ran is not None:
            RecordingShell.ran.append(cell)
        return r


def numerics_mode() -> str:
    """This worker's numerics ('pinned', 'native' or 'unpinned'), decided by `stalebook.core` before any notebook
    loads torch; the kernels of every notebook the worker runs inherit the pinned environment."""
    import stalebook.core

    return stalebook.core.pin_numerics()["mode"]


def forget_package(name: str = "stalebook") -> None:
    """Drop the package's modules from `sys.modules` after a notebook, so the next notebook that the same worker
    process runs imports them afresh. Otherwise module-level registries leak between notebooks (a unit kind or a
    check that one notebook re-defines in its own namespace stays registered for the next one); in JupyterLab
    every notebook has its own kernel, and the test must see what a reader sees."""
    for m in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[m]


@contextlib.contextmanager
def notebook_tempdir(name: str):
    """Python's temporary folder (`tempfile.tempdir`, and `$TMPDIR` for the processes a notebook starts) set to a
    fresh folder for one notebook and removed, with everything the notebook made there, when it ends: an example cell's
    `tempfile.mkdtemp()` holds snapshots, stores and runs, and a check must not leave them behind in /tmp."""
    d = tempfile.mkdtemp(prefix=f"nbcheck-{Path(name).stem}-")
    saved = tempfile.tempdir, dict(os.environ)
    tempfile.tempdir, os.environ["TMPDIR"] = d, d
    try:
        yield d
    finally:
        # the environment as it was, too: a library that cached a path under `d` in a variable (torch's compile cache,
        # TORCHINDUCTOR_CACHE_DIR, set on first use) would make it again there after the folder is gone
        tempfile.tempdir = saved[0]
        os.environ.clear()
        os.environ.update(saved[1])
        shutil.rmtree(d, ignore_errors=True)


def check_nb(fn, *args, write: bool = False, save: bool = False, **kwargs):
    "nbdev's `test_nb` (its own `save` is never used), then the committed-output comparison, or with `write`"
    " the `--save` of the outputs. Returns `(passed, seconds)` as `test_nb` does."
    fn = Path(fn)
    committed = json.loads(fn.read_text(encoding="utf-8"))
    mode = numerics_mode()
    _nbt.CaptureShell, RecordingShell.ran = RecordingShell, []
    try:
        with notebook_tempdir(fn.name):
            ok, secs = _orig_test_nb(fn, *args, save=False, **kwargs)
    finally:
        ran, RecordingShell.ran = RecordingShell.ran, None
        forget_package()
    if not ok:
        return ok, secs
    if mode != "pinned":  # another machine's kernels: its outputs are not the committed ones' to compare or replace
        print(
            f"{fn.name}: ran; outputs not {'saved' if write else 'compared'} (numerics {mode}, not pinned)", flush=True
        )
        return not write, secs
    if write:
        ok, msgs = save_outputs(fn, committed, ran)
        for m in msgs:
            print(m, file=sys.__stderr__, flush=True)
        if ok:
            print(f"saved outputs of {len(ran)} executed cells: {fn.name}", flush=True)
        return ok, secs
    msgs, n = compare_cells(fn.name, committed, ran)
    msgs += [f"notebook {fn.name} {m}" for m in prose_numbers(committed)]
    for m in msgs:
        print(m, file=sys.__stderr__, flush=True)
    if n:
        print(f"{fn.name}: {n - len(msgs)} of {n} cells with committed text outputs match", flush=True)
    return not msgs, secs


def main(argv=None):
    "`nbdev-test`'s command line plus `--save`."
    from fastcore.script import _run_cli
    from nbdev.test import nbdev_test

    argv = list(sys.argv[1:] if argv is None else argv)
    print(f"nbcheck: numerics {numerics_mode()}", flush=True)  # pinned here, before any worker starts
    if "-h" in argv or "--help" in argv:
        print(__doc__)
    save = "--save" in argv
    if save:
        argv.remove("--save")
    else:  # a check writes nothing tracked: the figures its notebooks save go to a scratch folder, not figures/
        os.environ["STALEBOOK_FIGURES"] = tempfile.mkdtemp(prefix="nbcheck-figures-")  # removed when the check ends
    # Workers unpickle the function by module name; IPython replaces `__main__` in a worker once it has
    # run a notebook, so the function must come from the importable module `nbcheck`, not `__main__`.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import nbcheck

    _nbt.test_nb = functools.partial(nbcheck.check_nb, write=save)
    prev, sys.argv = sys.argv, [sys.argv[0]] + argv
    try:
        _run_cli(nbdev_test.__wrapped__, False, ["path"])  # nbdev-test's own argument parsing
    finally:
        _nbt.test_nb, sys.argv = _orig_test_nb, prev
        if not save:
            shutil.rmtree(os.environ.pop("STALEBOOK_FIGURES"), ignore_errors=True)


if __name__ == "__main__":
    main()
