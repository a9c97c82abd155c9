"""Public seams only: the benchmarks and the tests reach stalebook through its public functions and its extension
points (a data source's hooks, the sampler, objective and unit-kind registries, documented parameters), never by
patching it. Scanned with `ast`, in every file of benchmarks/ and tests/ (and in the Python programs they hold as
strings, run in a fresh interpreter): no assignment to (or deletion of) an attribute of a stalebook module, class or
function; no `setattr`, `monkeypatch.setattr`, `mock.patch` aimed at stalebook; no method of a stalebook class replaced
on an object; no private name (`_x`, dunders excepted) read from stalebook or imported from it."""

import ast

from conftest import ROOT

PKG = ROOT / "stalebook"
# this file holds the offences its own check must find (as source text): it is not scanned
SCANNED = sorted(f for d in ("benchmarks", "tests") for f in (ROOT / d).glob("*.py") if f.name != "test_seams.py")
PATCHERS = {"setattr", "delattr", "object", "patch"}  # (an entry added to a registry dict is an extension point)


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_names() -> tuple[set, set]:
    """(private names stalebook defines: functions, classes, module-level names, attributes it stores; public methods
    of its classes, those attached by `@patch` or by `Class.name = f` included)."""
    trees = [ast.parse(f.read_text()) for f in PKG.rglob("*.py") if f.name != "_modidx.py"]
    nodes = [n for t in trees for n in ast.walk(t)]
    classes = {n.name for n in nodes if isinstance(n, ast.ClassDef)}
    priv, methods = set(), set()
    for n in nodes:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            priv.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            priv.add(n.attr)
            if isinstance(n.value, ast.Name) and n.value.id in classes:
                methods.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            priv.add(n.id)
        if isinstance(n, ast.ClassDef):  # (properties are data to their users)
            defs = [b for b in n.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
            methods |= {b.name for b in defs if "property" not in map(ast.unparse, b.decorator_list)}
        if isinstance(n, ast.FunctionDef) and any(ast.unparse(d) == "patch" for d in n.decorator_list):
            methods.add(n.name)
    return {x for x in priv if private(x)}, {m for m in methods if not m.startswith("_")}


PRIVATE, METHODS = package_names()


def root(e) -> str | None:
    "The name an attribute chain (`a.b.c`) starts from; None for anything else (a call, a subscript)."
    while isinstance(e, ast.Attribute):
        e = e.value
    return e.id if isinstance(e, ast.Name) else None


def imported_elsewhere(tree) -> set:
    "Names bound by importing anything but stalebook (`torch`, `np`, ...)."
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.asname or a.name.split(".")[0] for a in n.names if a.name.split(".")[0] != "stalebook"}
        elif isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").split(".")[0] != "stalebook"):
            out |= {a.asname or a.name for a in n.names}
    return out


def stalebook_names(tree) -> set:
    "Names that stand for stalebook objects: what is imported from it, and plain aliases of those (`T = tr.Trainer`)."
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in n.names if a.name.split(".")[0] == "stalebook"}
        elif isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == "stalebook":
            names |= {a.asname or a.name for a in n.names}
    grown = True
    while grown:
        grown = False
        for n in ast.walk(tree):
            if isinstance(n, ast.Assign) and root(n.value) in names:
                new = {t.id for t in n.targets if isinstance(t, ast.Name)} - names
                names |= new
                grown |= bool(new)
    return names


def violations(src: str, where: str, line0: int = 0) -> list[str]:
    "Every offence of source `src` as 'WHERE:LINE: what' (LINE counted from `line0` + 1)."
    tree, bad = ast.parse(src), []
    sb, other = stalebook_names(tree), imported_elsewhere(tree) | {"self", "cls"}
    ours = lambda e: root(e) in sb or (isinstance(e, ast.Constant) and str(e.value).startswith("stalebook"))
    add = lambda n, what: bad.append(f"{where}:{line0 + n.lineno}: {what}")
    for n in ast.walk(tree):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
            for t in (x for y in targets for x in (y.elts if isinstance(y, ast.Tuple) else [y])):
                if not isinstance(t, ast.Attribute):
                    continue
                if root(t.value) in sb:
                    add(n, f"assigns a stalebook attribute: {ast.unparse(t)}")
                elif t.attr in METHODS and root(t.value) not in other:
                    add(n, f"replaces a method of a stalebook object: {ast.unparse(t)}")
        elif isinstance(n, ast.Call) and n.args:
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if name in PATCHERS and ours(n.args[0]):
                add(n, f"patches stalebook: {ast.unparse(n.func)}({ast.unparse(n.args[0])}, ...)")
            if name in ("getattr", "hasattr") and len(n.args) > 1 and ours(n.args[0]):
                attr = n.args[1].value if isinstance(n.args[1], ast.Constant) else ""
                if isinstance(attr, str) and private(attr):
                    add(n, f"reads a private name of stalebook: {attr}")
        elif isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "stalebook":
            bad += [f"{where}:{line0 + n.lineno}: imports a private name: {a.name}" for a in n.names if private(a.name)]
        elif isinstance(n, ast.Attribute) and private(n.attr) and (root(n.value) in sb or n.attr in PRIVATE):
            add(n, f"reads a private name of stalebook: {ast.unparse(n)}")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and "stalebook" in n.value:
            try:  # a program a test or a benchmark runs in another interpreter
                inner = ast.parse(n.value)
            except SyntaxError:
                continue
            if stalebook_names(inner):
                bad += violations(n.value, where, line0 + n.lineno - 1)
    return bad


def test_benchmarks_and_tests_use_public_seams_only():
    bad = [b for f in SCANNED for b in violations(f.read_text(), str(f.relative_to(ROOT)))]
    assert len(SCANNED) > 40 and not bad, "\n".join(bad)


def test_the_scan_finds_each_kind_of_offence():
    "Each offence the rule names is found, with its line; the public spellings next to them are not."
    src = """
import stalebook.trainer as tr
from stalebook import sandbox
from stalebook.scoring import _padded
from stalebook.trainer import Trainer
T = tr.Trainer
tr.batch_rewards = lambda *a: []
T.generate = None
monkeypatch.setattr(sandbox, "FORK_SERVER", "")
setattr(tr, "policy_hash", str)
monkeypatch.setattr("stalebook.tasks.reward", None)
x = sandbox._uid()
trainer.generate = None
y = pool._idle
code = "import stalebook.protocol as P\\nP.det_matmul = 1\\n"
ok = sandbox.GRACE_S, Trainer(cfg, data=data), pool.uid_source, getattr(sandbox, "Pool")
pool.uid_source = lambda: 1
"""
    lines = sorted(int(b.split(":", 2)[1]) for b in violations(src, "x"))
    assert lines == [4, 7, 8, 9, 10, 11, 12, 13, 14, 16], violations(src, "x")  # (16: the string program's line 2)
