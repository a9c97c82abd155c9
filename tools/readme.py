"""Generate README.md from nbs/index.ipynb without Quarto (nbdev-readme needs the Quarto binary,
which is not installable on our machines). Markdown cells are copied verbatim; code cells that are
not hidden become fenced python blocks. Links and images `../X` (relative to nbs/, where the notebook is, e.g.
`../results/tiny-demo/rel.png`) become `X` (relative to the README). A code cell marked `#| echo: false`
contributes its committed Markdown output (a table computed from the results, checked by `tools/nbcheck.py` like
every output). Deterministic: `python tools/readme.py --check` fails if README.md is out of date."""

import json
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[1]
nb = json.loads((root / "nbs" / "index.ipynb").read_text(encoding="utf-8"))
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
text = (
    "\n\n".join(parts)
    + "\n\n<!-- generated from nbs/index.ipynb by tools/readme.py; edit the notebook, not this file -->\n"
)
out = root / "README.md"
if "--check" in sys.argv:
    if not out.exists() or out.read_text(encoding="utf-8") != text:
        sys.exit("README.md is out of date: run `make readme` (python tools/readme.py)")
else:
    out.write_text(text, encoding="utf-8")
