"""Generate README.md from nbs/index.ipynb without Quarto (nbdev-readme needs the Quarto binary,
which is not installable on our machines). Markdown cells are copied verbatim; code cells that are
not hidden become fenced python blocks. Links and images `../X` (relative to nbs/, where the notebook is, e.g.
`../results/tiny-demo/rel.png`) become `X` (relative to the README). A code cell marked `#| echo: false`
contributes its committed Markdown output (a table computed from the results, checked by `tools/nbcheck.py` like
every output). Deterministic: `python tools/readme.py --check` fails if README.md is out of date.
`python tools/readme.py --stats` prints the README's length: words (whitespace-separated, as `wc -w`) and the
median sentence length in words (`prose_stats`; tests/test_readme.py holds the targets)."""

import json
import re
import statistics
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[1]


def render(nb_path=root / "nbs" / "index.ipynb"):
    "README.md's text from the notebook."
    nb = json.loads(Path(nb_path).read_text(encoding="utf-8"))
    parts = []
    for c in nb["cells"]:
        src = "".join(c["source"]).strip("\n")
        if not src:
            continue
        if c["cell_type"] == "markdown":
            parts.append(src.replace("](../", "]("))  # the notebook sits in nbs/, the README at the root
        elif c["cell_type"] == "code" and "#| echo: false" in src:  # its committed Markdown output, not its code
            parts += [
                "".join(o["data"]["text/markdown"]).strip("\n")
                for o in c.get("outputs", [])
                if "text/markdown" in o.get("data", {})
            ]
        elif c["cell_type"] == "code" and not src.lstrip().startswith("#| hide"):
            parts.append("```python\n" + src + "\n```")
    return (
        "\n\n".join(parts)
        + "\n\n<!-- generated from nbs/index.ipynb by tools/readme.py; edit the notebook, not this file -->\n"
    )


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*`(\[])")  # '. ' before a capital, emphasis, code or a bracket


def sentences(text):
    """The prose sentences of a Markdown text: code blocks, HTML comments, tables, headings and images left out;
    a paragraph or a list item is never joined to the next; inside one, a sentence ends at . ! or ? followed by
    a space and a capital letter, `*`, a backtick, `(` or `[` (so "e.g. the" and "1.5 s" do not end one)."""
    text = re.sub(r"<!--.*?-->", "", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.S)
    out = []
    for para in re.split(r"\n\s*\n", text):
        kept = "\n".join(ln for ln in para.splitlines() if not ln.lstrip().startswith(("|", "#", "![")))
        for item in re.split(r"\n(?=\s*(?:\* |\d+\. ))", kept):
            item = re.sub(r"^\s*(?:\* |\d+\. )", "", item)  # a list item's marker is not a word of it
            out += [s for s in SENTENCE_END.split(" ".join(item.split())) if s.split()]
    return out


def prose_stats(text):
    "(words, median sentence length in words, number of sentences) of a Markdown text."
    lengths = [len(s.split()) for s in sentences(text)]
    return len(text.split()), statistics.median(lengths), len(lengths)


if __name__ == "__main__":
    text = render()
    out = root / "README.md"
    if "--stats" in sys.argv:
        words, median, n = prose_stats(out.read_text(encoding="utf-8"))
        print(f"README.md: {words} words, {n} sentences, median sentence {median} words")
    elif "--check" in sys.argv:
        if not out.exists() or out.read_text(encoding="utf-8") != text:
            sys.exit("README.md is out of date: run `make readme` (python tools/readme.py)")
    else:
        out.write_text(text, encoding="utf-8")
