"""Build the docs site into `_docs/`.

    python tools/docs.py               # Quarto binary on PATH: `nbdev-docs`; otherwise the static site below
    python tools/docs.py --static      # always the static site
    python tools/docs.py --out DIR     # static site into DIR

The static site needs no Quarto and no network: one HTML page per notebook (nbconvert's `lab` template,
without `In [ ]:` prompts), showing the notebook's *committed* outputs (nothing is executed), with
* the reading order and sections of the sidebar in `nbs/_quarto.yml` (`website.sidebar.contents`: file
  names and globs such as `/1*.ipynb`, expanded in name order), as a sidebar on every page plus
  previous / next links; `index.ipynb` becomes `index.html`;
* what nbdev's docs leave out left out here too: `#| hide` cells and `default_exp` cells, directive
  lines (`#| export`, ...); `#| echo: false` hides a cell's input, `#| output: false` its outputs,
  `#| include: false` the whole cell. Exported cells keep their source (nbdev-docs shows a signature);
* links rewritten: `NN_name.ipynb#anchor` -> the generated page, heading ids in Pandoc/Quarto form
  (`## The three papers` -> `#the-three-papers`, so the same links work on GitHub, Quarto and here);
  a relative link or image to a file of the repository (e.g. `../figures/x.png`) is copied into the site
  (files under `nbs/` keep their path relative to `nbs/`, others their path relative to the repo root);
  images in outputs are embedded (data URIs, as the notebook stores them);
* math rendered at build time: the TeX between `$…$` and `$$…$$` in Markdown (cells and Markdown outputs; never
  in code) becomes MathML (latex2mathml), which browsers draw natively, so a page shows its math offline, with no
  script and no CDN (a formula latex2mathml cannot read stays as its TeX in `<code>`, with a warning);
* one shared stylesheet (`lab.css`, nbconvert's JupyterLab styles) plus `site.css` (layout).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
# TeX in rendered Markdown: $$display$$, or $inline$ (not `$ 5`, `\\$`, `$5 and $6`: no space inside the delimiters,
# no digit or word character after the closing one)
MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$\w])\$(?=\S)([^$\n]+?)(?<![\s\\])\$(?![\w$])", re.S)
TEX_FIXES = [(re.compile(r"\\arg(?![A-Za-z])"), r"\\operatorname{arg}")]  # commands latex2mathml does not know
ASSET_CAP = 5_000_000  # bytes: a linked file larger than this is not copied into the site

SITE_CSS = """
body.jp-Notebook { margin: 0; padding: 0 0 0 18rem; }
nav.site-nav { position: fixed; top: 0; left: 0; bottom: 0; width: 16.5rem; overflow-y: auto; padding: 1rem 0.75rem;
  background: #f6f7f9; border-right: 1px solid #dde1e6; font: 14px/1.45 system-ui, sans-serif; }
nav.site-nav .site-title { display: block; font-size: 1.25rem; font-weight: 600; color: #1d2b3a; \
text-decoration: none; margin-bottom: .75rem; }
nav.site-nav .section { margin: .9rem 0 .25rem; font-size: .78rem; font-weight: 600; text-transform: uppercase; \
letter-spacing: .04em; color: #5b6675; }
nav.site-nav ul { list-style: none; margin: 0; padding: 0; }
nav.site-nav li a { display: block; padding: .18rem .4rem; border-radius: 4px; color: #25364a; text-decoration: none; }
nav.site-nav li a:hover { background: #e6eaf0; }
nav.site-nav li a.current { background: #dbe6f7; font-weight: 600; }
nav.site-nav .num { display: inline-block; min-width: 1.6rem; color: #7a8594; font-variant-numeric: tabular-nums; }
main { max-width: 62rem; margin: 0 auto; padding: 1.5rem 2rem 3rem; }
main img { max-width: 100%; height: auto; }
main pre { overflow-x: auto; }
main .jp-RenderedMarkdown pre { margin-bottom: 1em; }
.site-pager { display: flex; justify-content: space-between; max-width: 62rem; margin: 0 auto; padding: 0 2rem 3rem;
  font: 14px system-ui, sans-serif; }
.site-pager a { text-decoration: none; }
.site-source { font: 12px system-ui, sans-serif; color: #7a8594; margin: 0 0 1rem; }
@media (max-width: 900px) { body.jp-Notebook { padding-left: 0; } nav.site-nav { position: static; width: auto; } }
"""


# -------------------------------------------------------------------------------------- reading order
def load_sidebar(nbs: Path = NBS) -> list[tuple[str | None, list[Path]]]:
    "[(section title or None, [notebook paths])] from `_quarto.yml`'s `website.sidebar.contents`, globs expanded."
    import yaml

    cfg = yaml.safe_load((nbs / "_quarto.yml").read_text(encoding="utf-8"))
    contents = (cfg.get("website", {}).get("sidebar", {}) or {}).get("contents") or ["/*.ipynb"]

    def expand(item) -> list[Path]:
        if isinstance(item, dict):
            item = item.get("href") or item.get("file") or ""
        pat = str(item)
        rec = not pat.startswith("/")  # Quarto globs match recursively unless they start with `/`
        pat = pat.lstrip("/")
        if not any(ch in pat for ch in "*?["):
            return [nbs / pat] if (nbs / pat).exists() else []
        hits = glob.glob(str(nbs / ("**/" + pat if rec else pat)), recursive=rec)
        return sorted(
            (Path(h) for h in hits if not Path(h).name.startswith(("_", "."))), key=lambda p: str(p.relative_to(nbs))
        )

    out = []
    for item in contents:
        if isinstance(item, dict) and "section" in item:
            sub = item.get("contents") or []
            paths = [p for s in ([sub] if isinstance(sub, str) else sub) for p in expand(s)]
            out.append((item["section"], paths))
        else:
            out.append((None, expand(item)))
    seen, res = set(), []
    for sec, paths in out:  # a page appears once, where the sidebar first names it
        keep = [p for p in paths if p not in seen and p.suffix == ".ipynb"]
        seen.update(keep)
        if keep:
            res.append((sec, keep))
    return res


def page_of(nb: Path, nbs: Path = NBS) -> str:
    "Site-relative page of a notebook: `nbs/12_margin.ipynb` -> `12_margin.html`."
    return nb.relative_to(nbs).with_suffix(".html").as_posix()


def nb_title(nb: dict, fallback: str) -> str:
    "The notebook's first `# ` heading, else `fallback`."
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            m = re.search(r"^#\s+(.+)$", "".join(c["source"]), re.M)
            if m:
                return re.sub(r"[`*_]", "", m.group(1)).strip()
    return fallback


# ----------------------------------------------------------------------------------- notebook -> page
_dir_re = re.compile(r"^\s*#\s*\|\s*([\w-]+)\s*:?\s*(.*?)\s*$")


def reader_cells(nb):
    """The cells a reader sees (nbformat node, modified in place): hidden and default_exp cells dropped, directives
    removed."""
    keep = []
    for c in nb.cells:
        if c.cell_type != "code":
            keep.append(c)
            continue
        lines = c.source.splitlines(True)
        dirs, i = {}, 0
        while i < len(lines) and (m := _dir_re.match(lines[i])):
            dirs[m.group(1)] = m.group(2).lower()
            i += 1
        if "hide" in dirs or "default_exp" in dirs or dirs.get("include") == "false":
            continue
        c.source = "".join(lines[i:]).strip("\n")
        tags = set(c.metadata.get("tags", []))
        if dirs.get("echo") == "false":
            tags.add("site-hide-input")
        if dirs.get("output") == "false":
            tags.add("site-hide-output")
        c.metadata["tags"] = sorted(tags)
        if not c.source and not c.get("outputs"):
            continue
        keep.append(c)
    nb.cells = keep
    return nb


def slugify(text: str) -> str:
    """Pandoc's auto identifier (Quarto's): keep letters, digits, `_ - .`; spaces to `-`; lowercase; from the first
    letter."""
    text = unicodedata.normalize("NFC", text).strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "_-. \n")
    text = re.sub(r"\s+", "-", text)
    m = re.search(r"[^\W\d_]", text)
    return text[m.start() :] if m else "section"


def _rel(target: str, page: str) -> str:
    "Site path `target` as a link relative to site page `page`."
    return os.path.relpath(target, os.path.dirname(page) or ".").replace(os.sep, "/")


class Site:
    def __init__(self, out: Path, nbs: Path = NBS, root: Path = ROOT, jobs: int = 2):
        self.out, self.nbs, self.root, self.jobs = Path(out), Path(nbs), Path(root), jobs
        self.order = load_sidebar(self.nbs)
        self.pages = [p for _, ps in self.order for p in ps]
        self.titles = {}
        self.assets, self.warnings = {}, []
        self.lab_css = None

    # -- links and assets
    def _site_path(self, f: Path) -> str:
        "Where a repository file lands in the site."
        f = f.resolve()
        base = self.nbs.resolve() if f.is_relative_to(self.nbs.resolve()) else self.root.resolve()
        return f.relative_to(base).as_posix()

    def rewrite_url(self, url: str, nb: Path, page: str) -> str:
        "A link or image source of notebook `nb` as it must read on site page `page`."
        if not url or url.startswith(("#", "data:", "mailto:")) or re.match(r"^[a-z][a-z0-9+.-]*:", url, re.I):
            return url
        path, _, frag = url.partition("#")
        if not path:
            return url
        f = (nb.parent / path).resolve()
        if f.suffix == ".ipynb":
            if f in {p.resolve() for p in self.pages}:
                return _rel(page_of(f, self.nbs.resolve()), page) + ("#" + frag if frag else "")
            self.warnings.append(f"{nb.name}: link to {url}: notebook not in the sidebar of _quarto.yml")
            return url
        if not f.is_relative_to(self.root.resolve()) or not f.is_file():
            self.warnings.append(f"{nb.name}: link to {url}: no such file in the repository")
            return url
        if f.stat().st_size > ASSET_CAP:
            self.warnings.append(f"{nb.name}: link to {url}: larger than {ASSET_CAP} bytes, not copied")
            return url
        dest = self._site_path(f)
        self.assets[dest] = f
        return _rel(dest, page) + ("#" + frag if frag else "")

    # -- math
    def render_math(self, soup, name: str) -> int:
        "Replace the TeX in `soup`'s rendered Markdown by MathML (in place); how many formulas were replaced."
        from bs4 import BeautifulSoup
        from latex2mathml.converter import convert

        n = 0
        for node in list(soup.find_all(string=MATH)):
            if node.find_parent(["code", "pre", "script", "style", "math"]) or not node.find_parent(
                class_="jp-RenderedMarkdown"
            ):
                continue
            parts, last = [], 0
            for m in MATH.finditer(node):
                tex = m.group(1) if m.group(1) is not None else m.group(2)
                for pat, rep in TEX_FIXES:
                    tex = pat.sub(rep, tex)
                parts.append(soup.new_string(node[last : m.start()]))
                try:
                    mathml = convert(tex.strip(), display="block" if m.group(1) is not None else "inline")
                    parts.append(BeautifulSoup(mathml, "html.parser"))
                    n += 1
                except Exception as e:  # latex2mathml's own errors have no common base class
                    self.warnings.append(f"{name}: formula ${tex}$ not converted ({type(e).__name__}): kept as TeX")
                    code = soup.new_tag("code")
                    code.string = m.group(0)
                    parts.append(code)
                last = m.end()
            parts.append(soup.new_string(node[last:]))
            node.replace_with(*parts)
        return n

    # -- one page
    def render(self, nb_path: Path) -> str:
        import nbformat
        from bs4 import BeautifulSoup, Comment
        from nbconvert import HTMLExporter
        from nbconvert.preprocessors import TagRemovePreprocessor

        page = page_of(nb_path, self.nbs)
        nb = reader_cells(nbformat.read(nb_path, as_version=4))
        ex = HTMLExporter(template_name="lab", exclude_input_prompt=True, exclude_output_prompt=True)
        ex.register_preprocessor(
            TagRemovePreprocessor(
                remove_input_tags={"site-hide-input"}, remove_all_outputs_tags={"site-hide-output"}, enabled=True
            ),
            enabled=True,
        )
        html, _ = ex.from_notebook_node(nb)
        soup = BeautifulSoup(html, "html.parser")
        title = self.titles[nb_path]
        soup.title.string = f"{title} – stalebook"
        for s in soup.find_all("script", src=re.compile("require|mathjax", re.I)):
            s.decompose()  # widgets loader: none here; MathJax: the math is MathML already
        for s in soup.find_all("script", type="text/x-mathjax-config"):
            s.decompose()
        for c in soup.find_all(string=lambda t: isinstance(t, Comment) and "mathjax" in t.lower()):
            c.extract()
        self.render_math(soup, nb_path.name)
        styles = soup.head.find_all("style")  # nbconvert's styles, the same on every page: one shared file
        css = "\n".join(s.string or "" for s in styles)
        for s in styles:
            s.decompose()
        soup.head.append(soup.new_tag("link", rel="stylesheet", href=_rel("lab.css", page)))
        soup.head.append(soup.new_tag("link", rel="stylesheet", href=_rel("site.css", page)))
        # heading ids in Pandoc/Quarto form, unique per page
        used = {}
        for h in soup.find_all(re.compile(r"^h[1-6]$")):
            a = h.find("a", class_="anchor-link")
            text = h.get_text().rstrip("¶").strip()
            sid = slugify(text)
            n = used.get(sid, 0)
            used[sid] = n + 1
            if n:
                sid = f"{sid}-{n}"
            h["id"] = sid
            if a is not None:
                a["href"] = "#" + sid
        for tag, attr in (("a", "href"), ("img", "src")):
            for el in soup.find_all(tag):
                if el.get(attr) and not (tag == "a" and "anchor-link" in (el.get("class") or [])):
                    el[attr] = self.rewrite_url(el[attr], nb_path, page)
        soup.body.insert(0, self.nav(soup, page))
        main = soup.body.find("main")
        src = soup.new_tag("p", attrs={"class": "site-source"})
        src.string = f"notebook: nbs/{nb_path.relative_to(self.nbs).as_posix()}"
        main.insert(0, src)
        main.insert_after(self.pager(soup, nb_path, page))
        return str(soup), css

    def nav(self, soup, page: str):
        nav = soup.new_tag("nav", attrs={"class": "site-nav"})
        home = soup.new_tag("a", attrs={"class": "site-title", "href": _rel("index.html", page)})
        home.string = "stalebook"
        nav.append(home)
        for sec, paths in self.order:
            if sec:
                d = soup.new_tag("div", attrs={"class": "section"})
                d.string = sec
                nav.append(d)
            ul = soup.new_tag("ul")
            for p in paths:
                target = page_of(p, self.nbs)
                li, a = soup.new_tag("li"), soup.new_tag("a", href=_rel(target, page))
                if target == page:
                    a["class"] = "current"
                m = re.match(r"^(\d+[a-z]?)_", p.name)  # 18a_analysis: a notebook that follows 18
                if m:
                    num = soup.new_tag("span", attrs={"class": "num"})
                    num.string = m.group(1)
                    a.append(num)
                a.append("Overview" if p == self.nbs / "index.ipynb" else self.titles[p])
                li.append(a)
                ul.append(li)
            nav.append(ul)
        return nav

    def pager(self, soup, nb_path: Path, page: str):
        div = soup.new_tag("div", attrs={"class": "site-pager"})
        i = self.pages.index(nb_path)
        for j, label in ((i - 1, "← "), (i + 1, "")):
            span = soup.new_tag("span")
            if 0 <= j < len(self.pages):
                a = soup.new_tag("a", href=_rel(page_of(self.pages[j], self.nbs), page))
                a.string = label + self.titles[self.pages[j]] + (" →" if not label else "")
                span.append(a)
            div.append(span)
        return div

    # -- whole site
    def build(self) -> list[Path]:
        import json

        if self.out.exists():
            shutil.rmtree(self.out)
        self.out.mkdir(parents=True)
        for p in self.pages:
            self.titles[p] = nb_title(json.loads(p.read_text(encoding="utf-8")), p.stem)
        if not any(p.name == "index.ipynb" and p.parent == self.nbs for p in self.pages):
            raise SystemExit("nbs/_quarto.yml: the sidebar must list index.ipynb (the site's front page)")
        written, css = [], set()
        jobs = min(self.jobs, len(self.pages))
        if jobs > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as ex:
                results = list(ex.map(_render_page, [self] * len(self.pages), self.pages))
        else:
            results = [_render_page(self, p) for p in self.pages]
        for p, (html, c, assets, warnings) in zip(self.pages, results):
            dest = self.out / page_of(p, self.nbs)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(html, encoding="utf-8")
            written.append(dest)
            css.add(c)
            self.assets.update(assets)
            self.warnings += warnings
        if len(css) != 1:
            raise SystemExit("nbconvert produced different styles for different pages: cannot share lab.css")
        self.lab_css = css.pop()
        (self.out / "lab.css").write_text(self.lab_css or "", encoding="utf-8")
        (self.out / "site.css").write_text(SITE_CSS, encoding="utf-8")
        for dest, src in self.assets.items():
            (self.out / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, self.out / dest)
        return written


def _render_page(site: Site, nb_path: Path):
    "One page in a worker: (html, css, copied files, warnings)."
    site.assets, site.warnings = {}, []
    html, css = site.render(nb_path)
    return html, css, site.assets, site.warnings


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--static", action="store_true", help="build the static site even when Quarto is installed")
    ap.add_argument("--out", default=str(ROOT / "_docs"), help="output folder of the static site (default _docs/)")
    ap.add_argument("--jobs", type=int, default=2, help="pages rendered in parallel (default 2)")
    args = ap.parse_args(argv)
    if shutil.which("quarto") and not args.static:
        print("quarto found: nbdev-docs")
        return subprocess.call([str(Path(sys.executable).with_name("nbdev-docs"))], cwd=ROOT)
    site = Site(Path(args.out), jobs=args.jobs)
    written = site.build()
    for w in site.warnings:
        print("warning:", w, file=sys.stderr)
    size = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    print(
        f"static site (no quarto): {len(written)} pages, {len(site.assets)} copied files, "
        f"math as MathML, {size / 1e6:.1f} MB in {args.out}; "
        f"open {Path(args.out) / 'index.html'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
