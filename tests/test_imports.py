"""The package's import graph: every module imports in a fresh interpreter, imports only point down the layer
order below, there is no cycle, and a function-local import is only of an optional or heavy dependency (or the entry
point's one lazy import of the commands layer), with a comment saying why. A new module must be placed in LAYERS (the
test fails on an unplaced module)."""

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "stalebook"

# Lower layers first. A module may import modules of lower layers, and of its own layer when that makes no cycle.
LAYERS = [
    ["core"],
    [
        "claims",
        "theory.tree",
        "theory.estimators",
        "theory.margin",
        "theory.nonident",
        "theory.reliability",
        "theory.staleness",
        "theory.async_sim",
        "theory.boltzmann",
        "protocol",
        "sandbox",
        "audit_formats",
    ],
    ["analysis"],
    ["calibration"],
    ["verdict", "design"],
    ["tasks"],
    ["snapshot"],
    ["registry"],  # the machinery of studies, below the engine: it imports no study, no trainer, no point
    ["units"],
    ["contracts"],
    ["executors"],
    ["gemm"],
    ["model"],
    ["pretrained"],
    ["warmstart"],
    ["preflight"],
    ["rollouts"],
    ["objectives"],
    ["trainer", "scoring", "pipeline"],
    ["point", "bolt"],
    ["ranking_study", "staleness_study", "bolt_study", "numerics", "audit"],  # the three study wings on one floor
    ["report"],
    ["commands"],
    ["cli"],
]
LAYER = {m: i for i, ms in enumerate(LAYERS) for m in ms}
# Function-local imports are allowed only for these (heavy or optional) top-level packages, each with a comment.
LAZY_OK = {
    "torch",
    "vllm",
    "ray",
    "papermill",
    "jupyter_client",
    "tqdm",
    "math_verify",
    "matplotlib",
    "gguf",
    "martingale",
    "pyarrow",
}
# The one function-local stalebook import, also with a comment: the entry point imports the commands layer (which
# loads torch and transformers) only when a command runs, so that `stalebook --help` stays instant.
LAZY_STALEBOOK = {("cli", "commands")}


def modules() -> list[str]:
    out = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).with_suffix("")
        if rel.name in ("__init__", "_modidx"):
            continue
        out.append(".".join(rel.parts))
    return out


def _resolve(mod: str, node: ast.ImportFrom) -> list[str]:
    "Absolute stalebook module names (without the 'stalebook.' prefix) an ImportFrom refers to."
    if node.level:
        base = ["stalebook", *mod.split(".")[:-1]][: len(mod.split(".")) + 1 - node.level]
        full = ".".join(base + ([node.module] if node.module else []))
    else:
        full = node.module or ""
    if not (full == "stalebook" or full.startswith("stalebook.")):
        return []
    names = [full] if full != "stalebook" else [f"stalebook.{a.name}" for a in node.names]
    out = []
    for n in names:
        m = n.removeprefix("stalebook.")
        if m in ("", "__init__") or n == "stalebook":
            continue
        out.append(m if m in LAYER or m in modules() else m.rsplit(".", 1)[0] if "." in m else m)
    return out


def import_edges(mod: str):
    """(stalebook modules imported, function-local imports as (lineno, top-level package, line text, the stalebook
    modules it imports))."""
    src = (PKG / Path(*mod.split("."))).with_suffix(".py").read_text()
    tree, lines = ast.parse(src), src.splitlines()
    edges, local = set(), []
    top_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            targets = _resolve(mod, node)
        elif isinstance(node, ast.Import):
            targets = [a.name.removeprefix("stalebook.") for a in node.names if a.name.startswith("stalebook.")]
        else:
            continue
        edges |= {t for t in targets if t != mod}
        if id(node) not in top_level and not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            pkg = (
                node.module
                if isinstance(node, ast.ImportFrom) and not node.level
                else (node.names[0].name if isinstance(node, ast.Import) else "stalebook")
            ) or ""
            local.append((node.lineno, pkg.split(".")[0], lines[node.lineno - 1].strip(), tuple(targets)))
    return edges, local


def graph() -> dict:
    return {m: import_edges(m)[0] for m in modules()}


def layer_violations(g: dict) -> list[str]:
    bad = [f"{m}: not placed in LAYERS" for m in g if m not in LAYER]
    for m, deps in sorted(g.items()):
        for d in sorted(deps):
            if m in LAYER and d in LAYER and LAYER[d] > LAYER[m]:
                bad.append(f"{m} imports {d} (layer {LAYER[d]} above {LAYER[m]})")
    return bad


def cycles(g: dict) -> list[list[str]]:
    "Every cycle found by depth-first search (as the list of modules on it)."
    found, state = [], {}

    def dfs(u, stack):
        state[u] = 1
        stack.append(u)
        for v in sorted(g.get(u, ())):
            if state.get(v) == 1:
                found.append(stack[stack.index(v) :] + [v])
            elif v not in state:
                dfs(v, stack)
        stack.pop()
        state[u] = 2

    for u in sorted(g):
        if u not in state:
            dfs(u, [])
    return found


def test_layer_order_and_no_cycles():
    g = graph()
    assert set(g) >= {"core", "cli", "model", "snapshot", "preflight", "rollouts", "trainer", "scoring", "point"}
    assert layer_violations(g) == []
    assert cycles(g) == []
    assert not any("cli" in deps for m, deps in g.items()), "nothing imports the entry point"
    assert {m for m, deps in g.items() if "commands" in deps} == {"cli"}, "only the entry point imports the commands"


def test_function_local_imports_are_only_lazy_heavy_dependencies():
    bad = []
    for m in modules():
        for lineno, pkg, line, targets in import_edges(m)[1]:
            if targets and not {(m, t) for t in targets} <= LAZY_STALEBOOK:
                bad.append(f"stalebook/{m.replace('.', '/')}.py:{lineno}: function-local stalebook import: {line}")
            elif not targets and pkg not in LAZY_OK:
                bad.append(f"stalebook/{m.replace('.', '/')}.py:{lineno}: function-local import of {pkg}: {line}")
            elif "#" not in line:
                bad.append(
                    f"stalebook/{m.replace('.', '/')}.py:{lineno}: lazy import without a comment saying why: {line}"
                )
    assert bad == []


MACHINERY = ("registry", "units", "contracts", "executors")  # what runs, checks and freezes any study
ENGINE_AND_STUDIES = {"model", "rollouts", "trainer", "scoring", "pipeline", "point", "bolt", "objectives"}


def machinery_violations(g: dict) -> list[str]:
    "Every import of a generic module that reaches a study wing or the engine, directly or through another module."
    studies = {m for m in g if m.endswith("_study")} | ENGINE_AND_STUDIES
    bad = []
    for m in MACHINERY:
        seen, todo = set(), list(g[m])
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo += g.get(d, ())
        bad += [f"{m} reaches {d}" for d in sorted(seen & studies)]
    return bad


def test_study_machinery_imports_no_study_and_no_engine():
    """The generic machinery (registry, units, contracts, executors) imports no study wing and nothing of the
    engine, not even through another module; a study registers its kind and contracts itself, and the commands
    layer imports the wings. The check is not vacuous: a units -> trainer edge added to the graph is reported."""
    g = graph()
    assert {"ranking_study", "staleness_study", "bolt_study"} <= set(g)
    assert machinery_violations(g) == []
    assert {"ranking_study", "staleness_study", "bolt_study"} <= g["commands"]
    g["units"] = set(g["units"]) | {"trainer"}
    assert "units reaches trainer" in machinery_violations(g)


def test_checks_catch_a_back_edge_and_a_cycle():
    "The checks above are not vacuous: an upward import and a cycle added to the real graph are both reported."
    g = {m: set(d) for m, d in graph().items()}
    g["model"].add("trainer")  # a back-edge: model importing trainer, a higher layer
    assert f"model imports trainer (layer {LAYER['trainer']} above {LAYER['model']})" in layer_violations(g)
    assert any(c[0] in ("model", "rollouts", "trainer") for c in cycles(g))


def _fresh_import(m: str):
    code = (
        f"import sys, stalebook.{m}\n"
        "print(' '.join(sorted(k.removeprefix('stalebook.') for k in sys.modules if k.startswith('stalebook.'))))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return m, r.returncode, r.stdout.split(), r.stderr[-800:]


# slow (70 s here: one interpreter per module); the static layer and cycle checks above stay in the default run
@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    "Each module imports by itself, and what it loads at run time stays at or below its layer (no hidden back-edge)."
    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(_fresh_import, modules()))
    bad = []
    for m, rc, loaded, err in results:
        if rc != 0:
            bad.append(f"{m}: import failed: {err}")
            continue
        for d in loaded:
            d = d if d in LAYER else d.rsplit(".", 1)[0]
            if d in LAYER and m in LAYER and LAYER[d] > LAYER[m]:
                bad.append(f"{m} loads {d} at import time")
    assert bad == []
