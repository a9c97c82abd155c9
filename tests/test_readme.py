"""The README's length targets (issue 56): at most 2,500 words and a median sentence of at most 25 words, measured by
`tools/readme.py`'s `prose_stats` on the committed README.md (which `tools/readme.py --check` keeps in sync with
nbs/index.ipynb); and the measure itself, on a text whose counts are known by construction."""

import importlib.util
import re
from pathlib import Path

from stalebook.registry import load_registry

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("readme_tool", ROOT / "tools" / "readme.py")
readme = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme)  # the module's command line runs only under __main__


def test_the_measure_counts_what_a_reader_reads():
    s3, s5, s7 = "One two three.", "Four five six seven eight!", "A b c, e.g. d 1.5 s?"  # 3, 5 and 7 words
    text = "\n".join(
        [
            "# A heading of five words",
            "",
            s3 + " " + s5,
            "",
            "* " + s7,
            "",
            "| a | table |",
            "",
            "```sh",
            "x y z",
            "```",
        ]
    )
    assert readme.sentences(text) == [s3, s5, s7]  # heading, table and code are not prose; "e.g." ends nothing
    words, median, n = readme.prose_stats(text)
    assert (words, median, n) == (len(text.split()), 5, 3)


def test_readme_is_short_and_its_sentences_too():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text == readme.render()  # the committed README is the notebook's
    words, median, n = readme.prose_stats(text)
    assert words <= 2500, f"README.md has {words} words (target <= 2,500)"
    assert median <= 25, f"README.md's median sentence is {median} words over {n} sentences (target <= 25)"


def test_readme_numbers_are_the_sources():
    """The README's numbers about the demo and the setup, against what defines them: the demo slice's families and
    points from the `tiny:demo` registry, the torch pin from the Makefile's `TORCH` default."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    units = load_registry("tiny:demo").units()
    points = sum(len(f.checkpoints) for f in units.values())
    assert f"`stalebook demo tiny:demo`: {len(units)} families, {points} points" in text
    pin = re.search(r"^TORCH\s*\?=\s*torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert re.findall(r"torch(?: |==)(\d+\.\d+\.\d+)", text) == [pin, pin]  # the two commands' comment and setup
