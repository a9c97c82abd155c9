"""tools/nbcheck.py, the executable-paper check: committed text outputs must match the re-executed ones.

Each test runs the tool as `make nbtest` does (a subprocess) on a fixture notebook inside a throwaway
project that has this repo's `[tool.nbdev]` settings, so `--save`, nbdev-clean and the flags behave as
in `nbs/`. About 10 tool runs of ~2 s each."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "nbcheck.py"
BIN = Path(sys.executable).parent


def _load_tool():
    spec = importlib.util.spec_from_file_location("nbcheck_under_test", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


nbcheck = _load_tool()


def _code(id_, src):
    return {"cell_type": "code", "execution_count": None, "id": id_, "metadata": {}, "outputs": [], "source": src}


CELLS = [
    {"cell_type": "markdown", "id": "aa000000", "metadata": {}, "source": "# Fixture\n\nA deterministic notebook."},
    _code(
        "aa000001",
        "import tempfile, time\nt0 = time.perf_counter()\nprint('total', 3 * 7)\n"
        "print(f'took {time.perf_counter() - t0 + 1.5:.2f} s, wrote', tempfile.mkdtemp())",
    ),
    _code("aa000002", "from IPython.display import Markdown\nMarkdown(f'**{2 + 2}** of {5} checks passed')"),
    _code("aa000003", "class Thing: pass\nThing()"),
    _code("aa000004", "#| slow\nprint('slow result', 6 * 7)"),
    _code("aa000005", "#| eval: false\nraise RuntimeError('never run')"),
    _code("aa000006", "import sys\nprint('a warning', file=sys.stderr)\nprint('kept')"),
    _code("aa000007", "x = 1  # no output"),
]


def _project(d: Path) -> Path:
    "A project with this repo's nbdev settings and one fixture notebook `nbs/fx.ipynb` (not yet executed)."
    shutil.copy(ROOT / "pyproject.toml", d / "pyproject.toml")
    (d / "nbs").mkdir()
    nb = {
        "cells": CELLS,
        "metadata": {"kernelspec": {"display_name": "python3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (d / "nbs" / "fx.ipynb").write_text(json.dumps(nb, indent=1) + "\n")
    return d


@pytest.fixture
def proj(tmp_path):
    return _project(tmp_path)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    "`--save` once: (the saved notebook's text, the run's stderr), copied into each test's project by `saved`."
    d = _project(tmp_path_factory.mktemp("saved"))
    r = run(d, "--save")
    assert r.returncode == 0, r.stderr
    return (d / "nbs" / "fx.ipynb").read_text(), r.stderr


def run(proj, *args, env=None):
    return subprocess.run(
        [sys.executable, str(TOOL), *args, "nbs/fx.ipynb"],
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=300,
        env=None if env is None else {**os.environ, **env},
    )


def cells(proj):
    return {c["id"]: c for c in json.loads((proj / "nbs" / "fx.ipynb").read_text())["cells"]}


def edit(proj, fn):
    p = proj / "nbs" / "fx.ipynb"
    nb = json.loads(p.read_text())
    fn({c["id"]: c for c in nb["cells"]})
    p.write_text(json.dumps(nb, indent=1) + "\n")


@pytest.fixture
def saved(proj, saved_run):
    (proj / "nbs" / "fx.ipynb").write_text(saved_run[0])
    return proj


def test_save_then_check_passes_and_nbdev_clean_keeps_it(saved, saved_run):
    proj = saved
    assert "cell 7 (id aa000006): stderr not stored" in saved_run[1]
    c = cells(proj)
    assert "".join(c["aa000001"]["outputs"][0]["text"]).startswith("total 21\ntook ")
    assert c["aa000002"]["outputs"][0]["data"]["text/markdown"] == ["**4** of 5 checks passed"]
    assert c["aa000003"]["outputs"][0]["data"]["text/plain"] == ["<__main__.Thing>"]  # nbdev-clean's id removal
    assert c["aa000004"]["outputs"] == [] and c["aa000005"]["outputs"] == []  # slow, eval: false: not run
    assert [o["name"] for o in c["aa000006"]["outputs"]] == ["stdout"]
    assert all(x.get("execution_count") is None for x in c.values() if x["cell_type"] == "code")
    before = (proj / "nbs" / "fx.ipynb").read_bytes()
    subprocess.run([str(BIN / "nbdev-clean")], cwd=proj, check=True, capture_output=True)
    assert (proj / "nbs" / "fx.ipynb").read_bytes() == before, "nbdev-clean changed a notebook written by --save"
    r = run(proj)
    assert r.returncode == 0, r.stderr
    assert "fx.ipynb: 4 of 4 cells with committed text outputs match" in r.stdout and "Success." in r.stdout


def test_a_check_leaves_no_temporary_folder(saved, tmp_path):
    """The fixture's first cell makes a folder with `tempfile.mkdtemp()`, and a check's figures go to a scratch folder:
    both made under the check's $TMPDIR, both gone when it ends (and the check still passes: paths are normalised)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = run(saved, env={"TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stderr
    assert "fx.ipynb: 4 of 4 cells with committed text outputs match" in r.stdout
    assert list(tmp.iterdir()) == []


def test_a_path_a_notebook_leaves_in_the_environment_is_not_made_again(tmp_path):
    """As torch does with its compile cache (TORCHINDUCTOR_CACHE_DIR, set to a folder under the temp dir on first use):
    one notebook leaves a path under its temp folder in a variable, the next one in the same process makes it again.
    Each notebook starts from the environment the check had, so nothing is left behind."""
    proj = _project(tmp_path)
    nb = json.loads((proj / "nbs" / "fx.ipynb").read_text())
    for name, src in [
        ("a", "import os, tempfile\nos.environ.setdefault('FX_CACHE', os.path.join(tempfile.gettempdir(), 'cache'))"),
        ("b", "import os, tempfile\nos.makedirs(os.environ.get('FX_CACHE', tempfile.mkdtemp()), exist_ok=True)"),
    ]:
        (proj / "nbs" / f"{name}.ipynb").write_text(json.dumps(nb | {"cells": [_code(f"{name}0000000", src)]}))
    (proj / "nbs" / "fx.ipynb").unlink()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run(
        [sys.executable, str(TOOL), "--n-workers", "0", "nbs"],
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert r.returncode == 0, r.stderr
    assert list(tmp.iterdir()) == []


def test_hand_edited_output_fails_naming_notebook_and_cell(saved):
    proj = saved

    def f(c):
        c["aa000001"]["outputs"][0]["text"][0] = "total 22\n"
        c["aa000002"]["outputs"][0]["data"]["text/markdown"] = ["**5** of 5 checks passed"]

    edit(proj, f)
    r = run(proj)
    assert r.returncode != 0
    assert "notebook fx.ipynb cell 2 (id aa000001): committed output differs:" in r.stderr
    assert "-total 22\n+total 21" in r.stderr
    assert "notebook fx.ipynb cell 3 (id aa000002): committed output differs:" in r.stderr
    assert "-**5** of 5 checks passed\n+**4** of 5 checks passed" in r.stderr
    assert "cell 7 " not in r.stderr


def test_normalised_differences_pass(saved):
    proj = saved

    def f(c):  # another machine: other timing, temp dir and memory address; extra trailing blanks
        c["aa000001"]["outputs"][0]["text"] = [
            "total 21  \n",
            "took 73.40 s, wrote /tmp/pytest-of-ci/xyz_123/abc\n",
            "\n",
        ]
        c["aa000003"]["outputs"][0]["data"]["text/plain"] = ["<__main__.Thing at 0x7f3a2b1c0d90>"]

    edit(proj, f)
    r = run(proj)
    assert r.returncode == 0, r.stderr


def test_slow_cells_keep_outputs_and_are_checked_only_with_flags_slow(saved):
    proj = saved
    edit(
        proj,
        lambda c: c["aa000004"].update(
            outputs=[{"name": "stdout", "output_type": "stream", "text": ["slow result 41\n"]}]
        ),
    )
    assert run(proj).returncode == 0  # not executed: the committed output is kept, unchecked
    r = run(proj, "--flags", "slow")
    assert r.returncode != 0
    assert "notebook fx.ipynb cell 5 (id aa000004): committed output differs:" in r.stderr
    assert "-slow result 41\n+slow result 42" in r.stderr


def test_failing_cell_fails_the_run(proj):
    edit(proj, lambda c: c["aa000007"].update(source="assert 1 == 2, 'broken'"))
    r = run(proj)
    assert r.returncode != 0
    assert "AssertionError" in r.stderr and "fx.ipynb" in r.stderr


def test_module_registries_do_not_leak_between_notebooks(proj):
    "One worker runs both notebooks in turn; what the first registers in a stalebook module is gone for the second."

    def nb(src):
        return (
            json.dumps(
                {
                    "cells": [_code("bb000001", src)],
                    "metadata": {"kernelspec": {"name": "python3", "display_name": "python3", "language": "python"}},
                    "nbformat": 4,
                    "nbformat_minor": 5,
                },
                indent=1,
            )
            + "\n"
        )

    (proj / "nbs" / "a1.ipynb").write_text(nb("import stalebook.core as c\nc.CHECKS['leak'] = print"))
    (proj / "nbs" / "a2.ipynb").write_text(
        nb("import stalebook.core as c\nassert 'leak' not in c.CHECKS, 'leaked from a1'")
    )
    r = subprocess.run(
        [sys.executable, str(TOOL), "--n-workers", "1", "--file-re", "^a[12]"],
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]


def test_save_refuses_progress_noise_and_huge_text(proj):
    before = (proj / "nbs" / "fx.ipynb").read_text()
    edit(
        proj, lambda c: c["aa000007"].update(source="for i in range(3): print(f'\\r{i}/3', end='')\nprint('x' * 30000)")
    )
    noisy = (proj / "nbs" / "fx.ipynb").read_text()
    r = run(proj, "--save")
    assert r.returncode != 0
    assert "cell 8 (id aa000007): not saved:" in r.stderr
    assert "progress-bar noise in stdout" in r.stderr and f"> {nbcheck.TEXT_CAP}" in r.stderr
    assert (proj / "nbs" / "fx.ipynb").read_text() == noisy != before  # nothing written


RECORD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import nbcheck, nbdev.test as t
ran, orig = [], nbcheck.RecordingShell.cell
def cell(self, c, *a, **k):
    ran.append(c.id); return orig(self, c, *a, **k)
nbcheck.RecordingShell.cell = cell
ok, _ = nbcheck.check_nb("nbs/fx.ipynb", skip_flags=["slow", "gpu"])
assert ok
print(json.dumps([[c.id for c in t.nb_test_cells("nbs/fx.ipynb", ["slow", "gpu"])], ran]))
"""


def test_cells_run_are_nbdev_tests_cells(proj):
    "The cells the check executes are exactly those nbdev-test's own selection names."
    r = subprocess.run(
        [sys.executable, "-c", RECORD, str(TOOL.parent)], cwd=proj, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    want, got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == want == ["aa000001", "aa000002", "aa000003", "aa000006", "aa000007"]


def test_normalise_rules():
    n = nbcheck.normalise
    assert (
        n("done in 12.3 s (0:01:02), 45.1it/s")
        == n("done in 0.7 s (0:00:09), 3.0it/s")
        == "done in <time> (<clock>), <rate>"
    )
    assert n("<Foo at 0x7f00aa11bb22>") == "<Foo>"
    assert n("id 0x7f00aa11bb22") == "id 0x<addr>"
    assert n(f"{nbcheck.ROOT}/runs/x.json") == "<root>/runs/x.json"
    assert n("wrote /tmp/tmpab12cd/result.json, ok") == "wrote <tmp>, ok"
    assert n("\x1b[31mred\x1b[0m") == "red"
    assert n("10%|#     | 1/10\nresult 3\n\n") == "\nresult 3"
    assert n("step 5/10\rstep 10/10") == "step 10/10"
    assert n("at 2026-01-02T03:04:05.123Z") == "at <timestamp>"
    assert n("k = 5 samples, 3 steps, 0.25 share") == "k = 5 samples, 3 steps, 0.25 share"  # not timings


def test_comparable_ignores_stderr_html_and_image_pixels():
    out = lambda png: [
        {"output_type": "stream", "name": "stderr", "text": "noise"},
        {"output_type": "display_data", "data": {"image/png": png, "text/plain": "<Figure>", "text/html": "<b>x</b>"}},
    ]
    assert nbcheck.comparable(out("AAAA")) == nbcheck.comparable(out("BBBB")) == "[text/plain]\n<Figure>\n[image/png]"
    assert nbcheck.comparable([{"output_type": "display_data", "data": {"image/png": "AAAA"}}]) is None
    split = [
        {"output_type": "stream", "name": "stdout", "text": "ab"},
        {"output_type": "stream", "name": "stdout", "text": "c\n"},
    ]
    assert nbcheck.comparable(split) == "[stdout]\nabc"


def test_cells_tagged_measured_are_shown_but_not_compared():
    cell = lambda text, tags: {
        "id": "c1",
        "cell_type": "code",
        "metadata": {"tags": tags},
        "outputs": [{"output_type": "stream", "name": "stdout", "text": text}],
    }
    committed = lambda tags: {"cells": [cell("ratio 11.2x\n", tags)]}
    ran = [cell("ratio 9.7x\n", [])]
    msgs, n = nbcheck.compare_cells("nb.ipynb", committed([]), ran)
    assert n == 1 and len(msgs) == 1 and "nb.ipynb cell 1 (id c1)" in msgs[0]
    assert nbcheck.compare_cells("nb.ipynb", committed(["measured"]), ran) == ([], 0)


def test_prose_numbers_must_be_shown_by_an_output():
    md = lambda text: {"cell_type": "markdown", "id": "m1", "metadata": {}, "source": text}
    out = lambda text, tags=(): {
        "cell_type": "code",
        "id": "c1",
        "metadata": {"tags": list(tags)},
        "outputs": [{"output_type": "stream", "name": "stdout", "text": text}],
    }
    nb = lambda text, *cells: {"cells": [*cells, md(text)]}
    assert nbcheck.prose_numbers(nb("the gain is 0.123 here", out("gain 0.123\n"))) == []
    assert (
        nbcheck.prose_numbers(nb("$x = 0.456$, `0.789`, 3 apples, 1.5 s", out("gain 0.123\n"))) == []
    )  # math, code, < 2 decimals
    msgs = nbcheck.prose_numbers(nb("the gain is 0.124 here", out("gain 0.123\n")))
    assert msgs == ["cell 2 (id m1): prose quotes 0.124, which no output of the notebook shows"]
    assert (
        nbcheck.prose_numbers(nb("took 0.123", out("gain 0.123\n", ["measured"]))) != []
    )  # a measured cell supports nothing


def test_outputs_to_save_caps():
    img = {
        "output_type": "display_data",
        "metadata": {},
        "data": {"image/png": "A" * (nbcheck.IMAGE_CAP + 1), "text/plain": "<Figure>"},
    }
    out = lambda t: {"output_type": "stream", "name": "stdout", "text": t}
    assert nbcheck.outputs_to_save([img])[1] == [f"image/png of {nbcheck.IMAGE_CAP + 1} bytes > {nbcheck.IMAGE_CAP}"]
    assert (
        "the absolute path of this checkout" in nbcheck.outputs_to_save([out(f"wrote {nbcheck.ROOT}/runs/x\n")])[1][0]
    )
    keep, problems, dropped = nbcheck.outputs_to_save(
        [out("a\n"), {"output_type": "stream", "name": "stderr", "text": "w"}, out("b\n")]
    )
    assert (problems, dropped) == ([], True) and keep == [
        {"output_type": "stream", "name": "stdout", "text": ["a\n", "b\n"]}
    ]
