"""tools/docs.py, the static docs site: built from nbs/ and opened page by page in headless Chromium.

Every page must load, every <img> must have loaded (naturalWidth > 0) and every internal link must
point at an existing page and, with a fragment, an existing id there. Needs Debian's `chromium` and
`chromium-driver` (installed by .ci/run) and selenium (dev extra); without them the browser test skips
and says why. The site build takes ~15 s of CPU, the browser pass a few seconds."""

import importlib.util
import json
import shutil
import sys
import warnings
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("docs_under_test", ROOT / "tools" / "docs.py")
docs = sys.modules[spec.name] = importlib.util.module_from_spec(
    spec
)  # registered: page workers unpickle by module name
spec.loader.exec_module(docs)

CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
]


def _skip(reason):
    "Skip, and say so in pytest's warnings summary too (shown without -rs)."
    warnings.warn(reason, stacklevel=2)
    pytest.skip(reason)


def browser(tmp):
    "A headless Chromium driven by selenium, or pytest.skip with the reason."
    try:
        from selenium import webdriver
    except ImportError:
        _skip("selenium is not installed (pip install -e '.[dev]'): browser check of the docs site skipped")
    exe, drv = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not exe or not drv:
        _skip(
            "chromium / chromium-driver not installed (apt-get install chromium chromium-driver): "
            "browser check of the docs site skipped"
        )
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = exe
    for f in CHROME_FLAGS + [f"--user-data-dir={tmp / 'chrome-profile'}"]:
        opts.add_argument(f)
    return webdriver.Chrome(options=opts, service=Service(executable_path=drv))


PAGE_JS = """
const imgs = [...document.images].map(i => [i.getAttribute('src').slice(0, 80), i.complete, i.naturalWidth]);
const links = [...document.querySelectorAll('a[href]')].map(a => a.href);
const ids = [...document.querySelectorAll('[id]')].map(e => e.id)\
.concat([...document.querySelectorAll('a[name]')].map(a => a.name));
return {ready: document.readyState, title: document.title, imgs, links, ids,
        text: document.body ? document.body.innerText.length : 0, \
nav: document.querySelectorAll('nav.site-nav a').length};
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = browser(tmp_path_factory.mktemp("chrome"))
    d.set_page_load_timeout(60)
    yield d
    d.quit()


def crawl(drv, site: Path) -> dict:
    "Open every .html page of `site`; return {page: info} with images, links and ids as the browser sees them."
    pages = {}
    for f in sorted(site.rglob("*.html")):
        drv.get(f.as_uri())
        pages[f.resolve()] = drv.execute_script(PAGE_JS)
    return pages


def check_site(site: Path, pages: dict) -> list[str]:
    bad = []
    for f, info in pages.items():
        name = f.relative_to(site.resolve())
        if info["ready"] != "complete" or not info["title"] or info["text"] < 50:
            bad.append(f"{name}: page did not load ({info['ready']}, {info['text']} chars)")
        if info["nav"] < 3:
            bad.append(f"{name}: no sidebar")
        bad += [f"{name}: image {src} did not load" for src, done, w in info["imgs"] if not (done and w > 0)]
        for href in info["links"]:
            u = urlparse(href)
            if u.scheme != "file":
                continue  # external links are not checked
            target = Path(unquote(u.path)).resolve()
            if not target.is_relative_to(site.resolve()):
                bad.append(f"{name}: link {href} leaves the site")
                continue
            if target.suffix == ".html":
                if target not in pages:
                    bad.append(f"{name}: link {href}: no such page")
                    continue
                if u.fragment and unquote(u.fragment) not in pages[target]["ids"]:
                    bad.append(f"{name}: link {href}: no such anchor")
            elif not target.is_file():
                bad.append(f"{name}: link {href}: no such file")
    return bad


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "_docs"
    s = docs.Site(out)
    s.build()
    return s


def test_reading_order_lists_every_notebook(tmp_path):
    "The sidebar of _quarto.yml (the site's order) names every notebook in nbs/, index first, then by number."
    site = docs.Site(tmp_path / "_docs")  # its pages are read from the sidebar: nothing to build
    want = sorted(
        p for p in docs.NBS.rglob("*.ipynb") if not any(x.startswith((".", "_")) for x in p.relative_to(docs.NBS).parts)
    )
    assert sorted(site.pages) == want
    assert site.pages[0].name == "index.ipynb"
    top = [p.name for p in site.pages if p.parent == docs.NBS][1:]
    assert top == sorted(top) and all(n[:2].isdigit() for n in top)


# slow: the real site's build (about 35 s here); test_committed_outputs_render builds and opens a small one
@pytest.mark.slow
def test_links_and_figures_are_rewritten(site):
    html = (site.out / "12_margin.html").read_text()
    assert (
        'src="figures/margin_certificate.png"' in html and (site.out / "figures" / "margin_certificate.png").is_file()
    )
    assert 'href="index.html#the-three-papers"' in html
    assert 'id="the-three-papers"' in (site.out / "index.html").read_text()
    assert (
        "#| export" not in html and "default_exp" not in html and "from fastcore.test import" not in html
    )  # directives, hidden cells
    assert "In&nbsp;[" not in html and "In [" not in html
    assert not site.warnings, site.warnings


def test_slugify_matches_pandoc():
    assert docs.slugify("The three papers") == "the-three-papers"
    assert docs.slugify("Figure: the certificate region") == "figure-the-certificate-region"
    assert docs.slugify("1. Setup & run") == "setup-run"
    assert docs.slugify("g = H_on + ξ") == "g-h_on-ξ"


@pytest.mark.slow
def test_every_page_loads_with_images_and_links(driver, site):
    pages = crawl(driver, site.out)
    assert len(pages) == len(site.pages)
    bad = check_site(site.out, pages)
    assert not bad, "\n".join(bad)
    n_img = sum(len(i["imgs"]) for i in pages.values())
    assert n_img >= 10  # the figures of the theory notebooks


def test_committed_outputs_render(driver, tmp_path):
    "A notebook's committed outputs (text, Markdown, an embedded PNG) appear on its page; the browser sees the image."
    import base64
    import struct
    import zlib

    def png(w, h):
        raw = b"".join(b"\x00" + b"\x80\x20\x20" * w for _ in range(h))
        chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b"")
        )

    nbs = tmp_path / "nbs"
    (nbs).mkdir()
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "f.png").write_bytes(png(8, 6))
    (nbs / "_quarto.yml").write_text(
        "website:\n  sidebar:\n    contents:\n      - index.ipynb\n"
        "      - section: Theory\n        contents: '/1*.ipynb'\n"
    )
    md = lambda i, s: {"cell_type": "markdown", "id": i, "metadata": {}, "source": s}
    code = lambda i, s, outs: {
        "cell_type": "code",
        "execution_count": None,
        "id": i,
        "metadata": {},
        "outputs": outs,
        "source": s,
    }
    nb = lambda cells: {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (nbs / "index.ipynb").write_text(
        json.dumps(nb([md("i0", "# Home\n\nRead [the theorem](10_thm.ipynb#a-claim) first.")]))
    )
    (nbs / "10_thm.ipynb").write_text(
        json.dumps(
            nb(
                [
                    md(
                        "t0",
                        "# A theorem\n\n## A claim\n\n![figure](../figures/f.png) and [back](index.ipynb).\n\n"
                        "If $\\Delta_k>2e$ the top-$k$ set is certified:\n\n$$\\hat S=\\arg\\max_i s_i$$\n\n"
                        "Code keeps its dollars: `echo $HOME`.",
                    ),
                    code("t1", "#| hide\nimport secret_helper", []),
                    code(
                        "t2",
                        "print(7 * 6)",
                        [{"name": "stdout", "output_type": "stream", "text": ["forty-two: 42 ($5 and $6)\n"]}],
                    ),
                    code(
                        "t3",
                        "show()",
                        [
                            {
                                "output_type": "display_data",
                                "metadata": {},
                                "data": {
                                    "image/png": base64.b64encode(png(20, 10)).decode(),
                                    "text/plain": ["<Figure>"],
                                },
                            },
                            {
                                "output_type": "execute_result",
                                "execution_count": None,
                                "metadata": {},
                                "data": {
                                    "text/markdown": ["| check | value |\n|---|---|\n| margin | 0.49 |"],
                                    "text/plain": ["<Markdown>"],
                                },
                            },
                        ],
                    ),
                ]
            )
        )
    )
    s = docs.Site(tmp_path / "_docs", nbs=nbs, root=tmp_path)
    s.build()
    assert not s.warnings, s.warnings
    html = (tmp_path / "_docs" / "10_thm.html").read_text()
    assert "forty-two: 42" in html and "secret_helper" not in html and "<td>0.49</td>" in html
    assert html.count("data:image/png;base64,") == 1
    pages = crawl(driver, tmp_path / "_docs")
    assert not check_site(tmp_path / "_docs", pages)
    thm = pages[(tmp_path / "_docs" / "10_thm.html").resolve()]
    assert sorted(w for _, _, w in thm["imgs"]) == [8, 20]
    # the math is MathML the browser draws (no script, no network): inline and display, each with a size on screen;
    # no TeX is left in the text a reader sees, and code and outputs keep their dollars
    assert not any(w in html for w in ("MathJax.js", "libs/mathjax", "x-mathjax-config"))
    driver.get((tmp_path / "_docs" / "10_thm.html").as_uri())
    maths, text = driver.execute_script(MATH_JS)
    assert [m[0] for m in maths] == ["inline", "inline", "block"] and all(w > 0 and h > 0 for _, w, h, _ in maths)
    assert maths[0][3] == "\u0394k>2e"  # the formula's glyphs: Delta, k, >, 2, e
    assert not docs.MATH.search(text.replace("$5 and $6", "")), text
    assert "echo $HOME" in text and "forty-two: 42 ($5 and $6)" in text


MATH_JS = """
const maths = [...document.querySelectorAll('math')].map(m => {const r = m.getBoundingClientRect();
  return [m.getAttribute('display'), r.width, r.height, m.textContent];});
return [maths, document.body.innerText];
"""


# slow: the real site's build (test_links_and_figures_are_rewritten's); the small site above checks the same in the
# default run
@pytest.mark.slow
def test_a_theory_page_shows_its_math_offline(driver, site):
    "12_margin's formulas (its certificate: Delta_k > 2e) drawn as MathML; no raw $...$ on the page."
    driver.get((site.out / "12_margin.html").as_uri())
    maths, text = driver.execute_script(MATH_JS)
    assert len(maths) >= 20 and all(w > 0 and h > 0 for _, w, h, _ in maths)
    assert not docs.MATH.search(text), docs.MATH.search(text)
    assert any("\u0394" in m[3] for m in maths)  # the certificate's Delta_k, as a glyph, not as TeX


def test_readme_starts_with_what_it_is():
    """README.md (generated from nbs/index.ipynb) opens with the title, one paragraph saying what stalebook is and for
    whom (it links the glossary, which is there), then `make demo` and `make test` as its first code block, and one
    figure before the claims table, which has one column per model."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = text.split("\n\n")
    assert blocks[0] == "# stalebook"
    assert "```" not in blocks[1] and "](#glossary)" in blocks[1] and "\n## Glossary\n" in text
    assert blocks[2].startswith("```sh\n") and text.index("```") == text.index(blocks[2])
    assert [ln.split("#")[0].strip() for ln in blocks[2].splitlines()[1:-1]] == ["make demo", "make test"]
    lines = text.splitlines()
    table = next(i for i, ln in enumerate(lines) if ln.startswith("| paper | claim |"))
    assert sum(ln.startswith("![") for ln in lines[:table]) == 1
    head = [c.strip() for c in lines[table].strip("|").split("|")]
    assert head[:3] == ["paper", "claim", "exact / simulated"] and {"tiny", "SmolLM2-135M"} <= set(head)
