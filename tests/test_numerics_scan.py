"""No vendor-dependent numerics in the package: a scan of stalebook's source for calls that would reach torch's CPU
`sqrt` (MKL's vector math, whose result depends on the CPU vendor) or an optimizer that takes it (AdamW/Adam without
the fused kernel). numpy's and math's `sqrt` are IEEE everywhere and allowed; a line that must call torch's own
`sqrt` on purpose (a GPU path) carries the marker `numerics: ieee` and says why."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stalebook"
EXACT_MODULES = {"np", "numpy", "math", "cmath"}  # their sqrt is the IEEE root
MARKER = "numerics: ieee"
OPTIMIZERS_WITH_SQRT = {"AdamW", "Adam", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam"}


def _is_half(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, float) and node.value == 0.5


def _base_name(node) -> str | None:
    "The leftmost name of `a.b.c` (None for a call result or a subscript)."
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def vendor_dependent_calls(source: str, filename: str = "<src>") -> list[str]:
    "`file:line: what` for every call in `source` that may reach torch's CPU sqrt or a non-fused Adam-type step."
    lines, found = source.splitlines(), []

    def flag(node, what):
        if MARKER not in lines[node.lineno - 1]:
            found.append(f"{filename}:{node.lineno}: {what}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and _is_half(node.right):
            flag(node, "`** 0.5` (use core.exact_sqrt, np.sqrt or math.sqrt)")
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in ("sqrt", "sqrt_") and not (isinstance(f, ast.Attribute) and _base_name(f) in EXACT_MODULES):
            flag(node, f"`{ast.unparse(f)}(...)`: torch's sqrt (use core.exact_sqrt)")
        if name in ("pow", "pow_", "float_power") and any(
            _is_half(a) for a in [*node.args, *(k.value for k in node.keywords)]
        ):
            flag(node, f"`{ast.unparse(f)}(..., 0.5)`: torch's sqrt (use core.exact_sqrt)")
        if name in OPTIMIZERS_WITH_SQRT and _base_name(f) not in EXACT_MODULES:
            fused = [k for k in node.keywords if k.arg == "fused"]
            if not (fused and isinstance(fused[0].value, ast.Constant) and fused[0].value.value is True):
                flag(node, f"`{ast.unparse(f)}(...)` without fused=True: its step takes torch's sqrt (use model.adamw)")
    return found


def test_the_scan_names_what_it_must():
    """The scanner itself: every vendor-dependent form is named and the exact ones are not (else the package scan
    below could pass by construction)."""
    bad = """
import torch
a = torch.sqrt(x)
b = x.sqrt()
c = x.sqrt_()
d = var ** 0.5
e = torch.pow(x, 0.5)
f = x.pow(0.5)
g = torch.optim.AdamW(ps, lr=1e-3)
h = torch.optim.Adam(ps, lr=1e-3, fused=False)
i = AdamW(ps)
"""
    good = """
import math, numpy as np
a = np.sqrt(x)
b = math.sqrt(2)
c = x ** 2
d = torch.optim.AdamW(ps, lr=1e-3, fused=True)
e = torch.optim.SGD(ps, lr=1e-3)
f = x.sqrt()  # numerics: ieee (a CUDA tensor)
g = exact_sqrt(x)
h = torch.rsqrt(x)
"""
    got = vendor_dependent_calls(bad)
    assert [int(s.split(":")[1]) for s in got] == list(range(3, 12)), got
    assert vendor_dependent_calls(good) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_package_has_no_vendor_dependent_sqrt(path):
    "Every module of the package: no torch sqrt, no `** 0.5`, no Adam-type optimizer without the fused kernel."
    assert vendor_dependent_calls(path.read_text(), str(path.relative_to(PACKAGE.parent))) == []


HEAVY = ("numpy", "torch", "scipy", "matplotlib", "transformers", "peft")


def first_heavy_before_stalebook(source: str) -> str | None:
    "The first module-level import of numpy/torch/... that comes before any stalebook import (None: pinned first)."
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(n.split(".")[0] == "stalebook" for n in names):
            return None
        if any(n.split(".")[0] in HEAVY for n in names):
            return f"line {node.lineno}: {ast.unparse(node)}"
    return None


def test_the_import_order_check_names_what_it_must():
    assert (
        first_heavy_before_stalebook("import os\nimport numpy as np\nimport stalebook\n")
        == "line 2: import numpy as np"
    )
    assert first_heavy_before_stalebook("import os\nimport stalebook\nimport numpy as np\n") is None
    assert first_heavy_before_stalebook("from torch import nn\nfrom stalebook.core import Domain\n").startswith(
        "line 1"
    )


@pytest.mark.parametrize("path", sorted((PACKAGE.parent / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_entry_points_import_stalebook_before_numpy_and_torch(path):
    """numpy, OpenBLAS and torch choose their kernels when they load, so a script that loads one before stalebook runs
    unpinned (and says so): every benchmark imports stalebook first."""
    assert first_heavy_before_stalebook(path.read_text()) is None
