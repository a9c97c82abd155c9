"Theory III: behaviour-aware GRPO surrogate, staleness bias, two-constraint rule, async simulator."

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stalebook.core import Domain, assert_checks
from stalebook.theory import async_sim as asim
from stalebook.theory import staleness as stl
from stalebook.theory.tree import Tree, random_logits, sample_responses, seq_probs


def test_registered_checks_pass():
    assert_checks(
        stl.check_surrogate_gradient()
        + stl.check_noise_zero_mean()
        + asim.check_async_lag_bound()
        + asim.check_collapse_criterion()
    )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    V=st.integers(2, 3),
    T=st.integers(1, 3),
    K=st.integers(2, 6),
    agg=st.sampled_from(["token", "sequence"]),
    beta=st.sampled_from([0.0, 0.05]),
    eps=st.sampled_from([0.1, 0.2, np.inf]),
    scale=st.floats(0.05, 1.5),
)
def test_analytic_H_matches_autograd(seed, V, T, K, agg, beta, eps, scale):
    g = Domain(seed, ("test", "H")).numpy()
    tr = Tree(V, T)
    th = random_logits(tr, g)
    ph = th + scale * random_logits(tr, g)
    ref = random_logits(tr, g)
    R = (g.random(tr.N) < 0.5).astype(float)
    ms = stl.exact_masses(tr, ph, R, K)
    t = torch.tensor(th, requires_grad=True)
    stl.surrogate_value(tr, t, torch.tensor(ph), ms, eps, agg, beta, torch.tensor(ref)).backward()
    np.testing.assert_allclose(stl.surrogate_grad(tr, th, ph, ms, eps, agg, beta, ref), t.grad.numpy(), atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), K=st.integers(2, 5))
def test_no_bias_on_policy_and_binomial_vs_bruteforce(seed, K):
    g = Domain(seed, ("test", "onpol")).numpy()
    tr = Tree(2, 2)
    th, ph = random_logits(tr, g), random_logits(tr, g)
    R = (g.random(tr.N) < 0.5).astype(float)
    assert np.abs(stl.decompose(tr, th, th, R, K, g)["delta"]).max() == 0.0
    bf = stl.brute_surrogate(tr, th, ph, R, K)
    assert abs(bf - stl.surrogate_value(tr, th, ph, stl.exact_masses(tr, ph, R, K))) < 1e-12


def test_vectorised_sampler_law():
    "The vectorised group sampler and the tree engine's sampler draw from the same (enumerated) law."
    from scipy.stats import chisquare

    tr = Tree(2, 3)
    th = random_logits(tr, Domain(0, ("test", "smp")).numpy())
    a = sample_responses(
        tr, np.broadcast_to(th, (4000,) + th.shape), 5, Domain(0, ("test", "smp", "a")).numpy()
    ).ravel()
    b = sample_responses(tr, th, 20000, Domain(0, ("test", "smp", "b")).numpy())
    p = seq_probs(tr, th)
    for x in (a, b):
        assert chisquare(np.bincount(x, minlength=tr.N), len(x) * p).pvalue > 1e-4


def test_stability_bound_properties():
    S = np.array([1, 2, 4, 8, 16, 32])
    b = stl.stability_bound(0.3, 1.0, 5.0, S, 200)
    np.testing.assert_allclose(b["eta"], np.minimum(b["local"], b["horizon"]))
    assert (np.diff(b["local"]) < 0).all() and (np.diff(b["horizon"]) == 0).all()
    assert list(b["binding"]) == ["local" if l <= h else "horizon" for l, h in zip(b["local"], b["horizon"])]


def test_simulator_batch_equals_single_runs():
    "Vectorising over runs does not couple them: a batch of exact runs equals the runs one by one."
    env = asim.make_env(5, P=5, d=3)
    eta, S = np.array([0.3, 1.0, 2.0]), np.array([1, 3, 7])
    batch = asim.simulate(env, eta, S, 25)
    for i in range(3):
        one = asim.simulate(env, eta[i : i + 1], S[i : i + 1], 25)
        np.testing.assert_allclose(one["J"][0], batch["J"][i], atol=1e-13)
        np.testing.assert_allclose(one["theta"][:, 0], batch["theta"][:, i], atol=1e-12)


def test_bias_ratio_converges_and_linear_in_S():
    env = asim.make_env(0, **asim.ENV_KW)
    b = asim.bias_vs_lag(env, [1, 4, 16], np.array([1e-3, 1e-2]), **asim.SETTINGS["grpo"]["sim"])
    np.testing.assert_allclose(b["ratio"][:, 0], b["limit"], rtol=0.02)
    assert abs(np.polyfit(np.log(b["S"]), np.log(b["delta"][:, 0]), 1)[0] - 1) < 0.01


def test_quick_sweep_runs(capsys):
    "`stalebook study staleness-sim --quick`: the reduced grid of both settings and the bias curve, nothing written."
    from stalebook.commands import cmd_study

    assert cmd_study(["staleness-sim", "--quick"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[grpo] ") and "\n[unclipped] " in out and "bias: limit " in out
