"""torch's float32 CPU GEMMs routed through numpy's OpenBLAS (`stalebook.gemm`, the pinned default): the routed
ops equal numpy's own matmul bit for bit, autograd through them matches torch's own kernels and finite differences,
every other dtype falls through to torch's kernel, a pinned process routes by default and `STALEBOOK_GEMM=torch`
leaves torch's kernels in place, and the routed
products and the tiny model's stages give the same bits under emulated CPUs of both vendors."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_core import EMULATED_CPUS

from stalebook.core import GEMM_VAR, NUMERICS_VAR, PINNED_NUMERICS
from stalebook.gemm import GEMM, TORCH_KERNELS, openblas_threads, route_gemms


@pytest.fixture
def routed():
    """The routed kernels in this process for one test; after it, what this process's numerics chose (`GEMM`: routed
    when pinned, torch's own when native), which other tests in this worker process compute with."""
    route_gemms(True)
    yield
    route_gemms(GEMM == "openblas")


def bits(t) -> bytes:
    return np.ascontiguousarray(t.detach().numpy() if isinstance(t, torch.Tensor) else t).tobytes()


def _operands(g, m, k, n, layout):
    "(a, b) of shapes (m, k), (k, n) in a layout: row-major, column-major (transposed views) or strided (a slice)."
    a, b = torch.randn(m, 2 * k, generator=g), torch.randn(n, k, generator=g)
    if layout == "strided":
        return a[:, ::2], b.T
    return (a[:, :k].contiguous(), b.T.contiguous()) if layout == "row" else (a[:, :k].T.contiguous().T, b.T)


@pytest.mark.parametrize("layout", ["row", "column", "strided"])
@pytest.mark.parametrize("shape", [(33, 67, 129), (1, 576, 49), (64, 8, 576), (5, 1, 3), (7, 0, 4), (0, 5, 4)])
def test_mm_equals_numpy_matmul(routed, shape, layout):
    a, b = _operands(torch.Generator().manual_seed(1), *shape, layout)
    want = np.matmul(a.numpy(), b.numpy())  # numpy's own matmul of the same arrays (a copy where numpy needs one)
    assert bits(torch.mm(a, b)) == bits(want)
    assert bits(a @ b) == bits(want)
    out = torch.empty(shape[0], shape[2])
    torch.mm(a, b, out=out)
    assert bits(out) == bits(want)


def test_addmm_alpha_beta_broadcast_and_nan_addend(routed):
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(9, 17, generator=g), torch.randn(17, 5, generator=g)
    ab = np.matmul(a.numpy(), b.numpy())
    for c in (torch.randn(5, generator=g), torch.randn(9, 1, generator=g), torch.randn(9, 5, generator=g)):
        assert bits(torch.addmm(c, a, b)) == bits(ab + c.numpy())
        got = torch.addmm(c, a, b, beta=0.5, alpha=-3.0)
        assert bits(got) == bits(np.float32(-3.0) * ab + np.float32(0.5) * c.numpy())
    nan = torch.full((5,), float("nan"))
    assert bits(torch.addmm(nan, a, b, beta=0)) == bits(ab)  # beta = 0: the addend is ignored, as torch does
    out = torch.empty(9, 5)
    torch.addmm(torch.ones(5), a, b, out=out)
    assert bits(out) == bits(ab + np.float32(1))
    lin = torch.nn.functional.linear(a, b.T.contiguous(), torch.ones(5))  # a 2-d linear with bias: addmm
    assert bits(lin) == bits(ab + np.float32(1))


def test_batched_products_equal_numpy(routed):
    g = torch.Generator().manual_seed(3)
    a, b, c = torch.randn(4, 6, 7, generator=g), torch.randn(4, 7, 3, generator=g), torch.randn(4, 6, 3, generator=g)
    ab = np.matmul(a.numpy(), b.numpy())
    assert bits(torch.bmm(a, b)) == bits(ab)
    assert bits(torch.bmm(a, b.transpose(1, 2).contiguous().transpose(1, 2))) == bits(ab)
    assert bits(torch.baddbmm(c, a, b, beta=2.0, alpha=0.5)) == bits(np.float32(0.5) * ab + np.float32(2.0) * c.numpy())
    out = torch.empty(4, 6, 3)
    torch.bmm(a, b, out=out)
    assert bits(out) == bits(ab)
    # matmul's broadcasting folds into mm/bmm: a shared weight and an expanded (stride 0) batch
    w = torch.randn(7, 5, generator=g)
    assert bits(a @ w) == bits(np.matmul(a.numpy(), w.numpy()))
    q, k = torch.randn(2, 3, 6, 4, generator=g), torch.randn(2, 1, 4, 6, generator=g)
    assert bits(q @ k) == bits(np.matmul(q.numpy(), k.numpy()))


def test_other_dtypes_and_bad_shapes_fall_through(routed):
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(12, 9, generator=g), torch.randn(9, 6, generator=g)
    cases = [(a.double(), b.double()), (a.bfloat16(), b.bfloat16()), ((a * 9).long(), (b * 9).long())]
    route_gemms(False)
    own = [torch.mm(x, y) for x, y in cases] + [torch.bmm(x[None], y[None]) for x, y in cases]
    route_gemms(True)
    got = [torch.mm(x, y) for x, y in cases] + [torch.bmm(x[None], y[None]) for x, y in cases]
    assert all(x.dtype == y.dtype and bits(x.float()) == bits(y.float()) for x, y in zip(own, got))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(a, a)  # torch's own kernel raises its own error
    out = torch.empty(0)
    torch.mm(a, b, out=out)  # an out= tensor to be resized: torch's kernel
    assert out.shape == (12, 6)
    assert bits(out) != b"" and torch.allclose(out, torch.from_numpy(a.numpy() @ b.numpy()), rtol=1e-5, atol=1e-5)


def test_autograd_through_routed_products(routed):
    "A Linear layer's gradients through the routed kernels: torch's own kernels' to rounding, and finite differences."
    g = torch.Generator().manual_seed(5)
    x, w, bias = torch.randn(6, 11, generator=g), torch.randn(7, 11, generator=g), torch.randn(7, generator=g)

    def grads():
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, bias))
        torch.nn.functional.linear(xs[None].expand(3, 6, 11), ws, bs).tanh().sum().backward()
        return xs.grad, ws.grad, bs.grad

    routed_grads = grads()
    route_gemms(False)
    own_grads = grads()
    route_gemms(True)
    for r, o in zip(routed_grads, own_grads):
        torch.testing.assert_close(r, o, rtol=1e-5, atol=1e-5)
    # central differences of the loss in float64 (through torch's own float64 kernels) along one direction each
    loss = lambda x_, w_: torch.nn.functional.linear(x_[None].expand(3, 6, 11), w_, bias.double()).tanh().sum()
    xd, wd, h = x.double(), w.double(), 1e-6
    for i, (d, grad) in enumerate(
        ((torch.randn(6, 11, generator=g), routed_grads[0]), (torch.randn(7, 11, generator=g), routed_grads[1]))
    ):
        dd = d.double()
        num = (
            (loss(xd + h * dd, wd) - loss(xd - h * dd, wd)) / (2 * h)
            if i == 0
            else (loss(xd, wd + h * dd) - loss(xd, wd - h * dd)) / (2 * h)
        )
        assert abs(float(num) - float((grad.double() * dd).sum())) < 1e-4 * max(1.0, abs(float(num)))


def test_threads_follow_torch_and_openblas_returns_to_one(routed):
    "At 2 torch threads a routed product runs on 2 OpenBLAS threads, reproducibly; OpenBLAS is back at 1 after it."
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(512, 576, generator=g), torch.randn(576, 1536, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = [bits(a @ b) for _ in range(3)]
        torch.set_num_threads(1)
        one = bits(a @ b)
    finally:
        torch.set_num_threads(before)
    set_threads, get_threads = openblas_threads()
    assert get_threads() == 1  # back at the pin's one thread after each routed product
    set_threads(2)
    try:
        numpy_two = bits(np.matmul(a.numpy(), b.numpy()))  # numpy's own call on two OpenBLAS threads
    finally:
        set_threads(1)
    assert two[0] == two[1] == two[2] == numpy_two
    assert one == bits(np.matmul(a.numpy(), b.numpy()))  # numpy's own call, on the pin's one OpenBLAS thread


def _child(env_extra: dict, code: str) -> subprocess.CompletedProcess:
    drop = (*PINNED_NUMERICS, NUMERICS_VAR, GEMM_VAR, "OMP_WAIT_POLICY")  # what the pin sets: the child's own choice
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run([sys.executable, "-c", code], env=base | env_extra, capture_output=True, text=True)


SWITCH = (
    "import stalebook.model, torch, numpy as np, json, os; from stalebook import gemm;"
    "from stalebook.core import pin_numerics;"
    "a, b = torch.randn(40, 50), torch.randn(50, 30);"
    "print(json.dumps([gemm.GEMM, 'gemm.py' in torch._C._dispatch_dump('aten::mm'),"
    " bool(torch.equal(a @ b, torch.from_numpy(a.numpy() @ b.numpy()))), pin_numerics().get('gemm'),"
    " stalebook.model.numerics_state().get('gemm'), os.environ.get('OMP_WAIT_POLICY')]))"
)


def test_default_routes_and_torch_keeps_torch_kernels():
    "A pinned process routes by default; STALEBOOK_GEMM=torch and the native numerics keep torch's own kernels."
    default, torch_, native, active = (
        _child(env, SWITCH)
        for env in ({}, {GEMM_VAR: "torch"}, {NUMERICS_VAR: "native"}, {"OMP_WAIT_POLICY": "ACTIVE"})
    )
    for r in (default, torch_, native, active):
        assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(default.stdout) == ["openblas", True, True, "openblas", "openblas", "PASSIVE"]
    assert json.loads(torch_.stdout) == ["torch", False, False, None, None, None]  # MKL's bits, no python kernel
    assert json.loads(native.stdout) == ["torch", False, False, None, None, None]  # native keeps torch's kernels
    assert json.loads(active.stdout)[-1] == "ACTIVE"  # a wait policy the environment sets is kept
    bad = _child({GEMM_VAR: "mkl"}, "import stalebook")
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "stalebook: error: STALEBOOK_GEMM='mkl': expected 'openblas' or 'torch'"
    )


def test_original_kernels_are_torch_own(routed):
    "The kernels fallen through to are torch's CPU kernels (not the routed ones): float32 through them is MKL's."
    a, b = torch.randn(20, 30), torch.randn(30, 10)
    keys = torch._C._dispatch_keyset_full()
    route_gemms(False)
    own = torch.mm(a, b)
    route_gemms(True)
    assert bits(TORCH_KERNELS["mm"].call_boxed(keys, a, b)) == bits(own)


REIMPORT = (
    "import stalebook.gemm as first, sys, json, torch;"
    "[sys.modules.pop(m) for m in list(sys.modules) if m.split('.')[0] == 'stalebook'];"
    "import stalebook.gemm as second;"
    "dump = lambda: torch._C._dispatch_dump('aten::mm').splitlines();"
    "n = lambda: sum(l.startswith('CPU:') and 'gemm.py' in l for l in dump());"
    "a, b = torch.randn(64, 96), torch.randn(96, 80);"
    "out = [n(), bool(torch.equal(a @ b, torch.from_numpy(a.numpy() @ b.numpy())))];"
    "second.route_gemms(False); out += [n(), first.route_gemms(True) and second.route_gemms(True), n()];"
    "print(json.dumps(out))"
)


def test_a_second_import_shares_the_routing():
    """The package imported afresh in one process (nbcheck does, for every notebook of a worker) finds the routing the
    first import installed: one routed kernel at torch's CPU key, and giving it back through either copy leaves none
    (before, the first copy's kernel stayed active behind the second's: `route_gemms(False)` did not restore MKL)."""
    r = _child({}, REIMPORT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == [1, True, 0, True, 1]


VENDOR = (
    "import json, sys, stalebook; from stalebook.numerics import gemm_hashes, model_hashes;"
    "from stalebook.model import shipped_snapshot, numerics_state;"
    "out = gemm_hashes(1) | model_hashes(shipped_snapshot(), 1);"
    "out['meta'] = numerics_state().get('gemm'); print(json.dumps(out))"
)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="qemu-user (Debian's qemu-user) is not installed")
def test_routed_stages_agree_on_emulated_cpus_of_both_vendors():
    """The routed products of the models' shapes (`gemm/...` keys) and the tiny model's forward, backward and
    optimizer stages with the routing on: the same hashes here and under an emulated Intel and an emulated AMD CPU."""
    base = {k: v for k, v in os.environ.items() if k not in (*PINNED_NUMERICS, NUMERICS_VAR)} | {GEMM_VAR: "openblas"}
    runs = {
        cpu: subprocess.Popen(
            [*(["qemu-x86_64", "-cpu", cpu] if cpu else []), sys.executable, "-c", VENDOR],
            env=base,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cpu in ("", *EMULATED_CPUS)
    }
    got = {}
    for cpu, p in runs.items():
        out, err = p.communicate(timeout=1800)
        assert p.returncode == 0, f"{cpu}: {err[-2000:]}"
        got[cpu] = json.loads(out.strip().splitlines()[-1])
        assert got[cpu].pop("meta") == "openblas"
    assert len(got[""]) > 40
    for cpu in EMULATED_CPUS:
        assert [k for k in got[""] if got[cpu].get(k) != got[""][k]] == [], cpu
