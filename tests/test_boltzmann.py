"""Full-size acceptance tests of stalebook.theory.boltzmann (the cheap versions are the verify checks)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.special import log_softmax, rel_entr

from stalebook.core import Domain, homogeneous_groups
from stalebook.theory.boltzmann import (
    binary_ess_fraction,
    binary_expected_ess,
    binary_log_Z,
    bolt_log_weights,
    boltzmann_target,
    empirical_sft_mass,
    ess,
    ess_fraction,
    induced_target,
    iterative_bolt,
    kl,
    log_normalize,
    log_partition,
    matching_log_weights,
    mc_bolt_log_weights,
    mc_log_Z,
    optimality_stats,
    optimise_reg_value,
    random_problem,
    random_problems,
    refit_log_weights,
    reg_value,
    restricted_target,
    sft_grad,
    soft_value,
    support_price,
    tree_boltzmann_logits,
    tv,
    weighted_sft,
)

SET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
logits = lambda n: st.lists(st.floats(-6, 6), min_size=n, max_size=n).map(np.array)


@st.composite
def problem(draw, binary=False):
    N = draw(st.integers(2, 25))
    lpr = log_normalize(draw(logits(N)))
    r = np.array(draw(st.lists(st.sampled_from([0.0, 1.0]) if binary else st.floats(0, 1), min_size=N, max_size=N)))
    beta = draw(st.floats(0.05, 5.0))
    return lpr, r, beta, N


# ---- targets
def test_optimality_50_problems_1000_perturbations():
    worst, d_opt, d_tv, d_val = optimality_stats(random_problems(1, 50, "opt-full", brange=(0.05, 5.0)), 1000)
    print(
        f"min J(pi*)-J(pert) {worst:.3g}; max |J(pi*)-J(BFGS)| {d_opt:.3g}; TV {d_tv:.3g}; |J-beta log Z| {d_val:.3g}"
    )
    assert worst > 0 and d_opt <= 1e-8 and d_val <= 1e-12


@SET
@given(problem(), st.data())
def test_value_identity_kl(pb, data):
    "J(pi*) - J(pi) = beta KL(pi || pi*) for arbitrary pi (computed from the objective, not the formula)."
    lpr, r, beta, N = pb
    lp = log_normalize(data.draw(logits(N)))
    ls = boltzmann_target(lpr, r, beta)
    assert abs(reg_value(ls, lpr, r, beta) - reg_value(lp, lpr, r, beta) - beta * kl(lp, ls)) < 1e-10


@SET
@given(problem(), st.data())
def test_induced_target_and_matching_law(pb, data):
    lpr, r, beta, N = pb
    lq = log_normalize(data.draw(logits(N)))
    lw = data.draw(logits(N))
    lt = induced_target(lq, lw)
    # the induced target maximises the weighted log-likelihood E_q[w log pi] (Gibbs): beats any other pi
    a = np.exp(lq + lw)
    other = log_normalize(data.draw(logits(N)))
    assert a @ lt >= a @ other - 1e-12
    test_pi = np.exp(lt)
    assert abs(test_pi.sum() - 1) < 1e-12
    ls = boltzmann_target(lpr, r, beta)
    assert np.abs(np.exp(induced_target(lq, matching_log_weights(ls, lq))) - np.exp(ls)).max() < 1e-12
    lb = bolt_log_weights(lpr, r, beta)
    assert abs(np.exp(lpr + lb).sum() - 1) < 1e-12  # prompt-normalised: E_ref w = 1
    assert np.abs(lb - (r / beta - log_partition(lpr, r, beta))).max() < 1e-9
    assert np.abs(np.exp(induced_target(lpr, lb)) - np.exp(ls)).max() < 1e-12


@SET
@given(problem(binary=True))
def test_refit_differs_except_beta_to_zero(pb):
    lpr, r, beta, N = pb
    p = np.exp(lpr)[r > 0].sum()
    if p == 0 or p == 1:
        return
    lr = induced_target(lpr, refit_log_weights(r))
    d = tv(lr, boltzmann_target(lpr, r, beta))
    with np.errstate(over="ignore"):
        want = (1 - p) / (1 - p + p * np.exp(1 / beta))
    assert abs(d - want) < 1e-12
    assert (
        d > 0 or want < 1e-12
    )  # positive for every beta > 0; below 1e-12 tv (sums of probabilities) cannot resolve it
    assert tv(lr, boltzmann_target(lpr, r, 0.0)) < 1e-15


def test_refit_differs_nonbinary():
    g = Domain(0, ("test", "refit")).numpy()
    for beta in [0.01, 0.1, 1, 10]:
        lpr, r = random_problem(g, 20)
        assert tv(induced_target(lpr, refit_log_weights(r)), boltzmann_target(lpr, r, beta)) > 1e-2


def test_beta_zero_and_homogeneous_groups():
    r = np.array([[0.0] * 5, [1.0] * 5, [0, 1, 0, 1, 1.0], [3, 2, 1, 0, -1.0]])
    for beta in [10.0, 1.0, 1e-3, 1e-8, 0.0]:
        lw = mc_bolt_log_weights(r, beta)
        assert np.isfinite(lw[homogeneous_groups(r)]).all() and not np.isnan(lw).any()
        assert np.abs(np.exp(lw).mean(-1) - 1).max() < 1e-12
        assert np.all(np.exp(lw[homogeneous_groups(r)]) == 1.0)
    assert np.exp(mc_bolt_log_weights(r, 1e-8))[2].tolist() == pytest.approx([0, 5 / 3, 0, 5 / 3, 5 / 3])
    lpr = np.log([0.5, 0.3, 0.2])
    rr = np.array([0.0, 1.0, 1.0])
    assert soft_value(lpr, rr, 0.0) == 1.0 and abs(soft_value(lpr, rr, 1e-4) - 1.0) < 1e-3
    assert np.exp(boltzmann_target(lpr, rr, 0.0)).tolist() == pytest.approx([0, 0.6, 0.4])
    assert binary_ess_fraction(0.3, 0.0) == 0.3 and abs(binary_ess_fraction(0.3, 1e-3) - 0.3) < 1e-12


# ---- estimation
def test_mc_Z_unbiased_and_variance_general_reward():
    g = Domain(0, ("test", "mcZ")).numpy()
    for beta in [0.2, 1.0]:
        lpr, r = random_problem(g, 15)
        n, reps = 8, 10_000
        idx = g.choice(15, size=(reps, n), p=np.exp(lpr))
        zhat = np.exp(mc_log_Z(r[idx], beta))
        Z = np.exp(log_partition(lpr, r, beta))
        var = (np.exp(lpr) @ np.exp(2 * r / beta) - Z**2) / n  # exact by enumeration
        m2, m4 = zhat.var(ddof=1), ((zhat - zhat.mean()) ** 4).mean()
        assert abs(zhat.mean() - Z) / np.sqrt(var / reps) < 3
        assert abs(m2 - var) / np.sqrt((m4 - m2**2) / reps) < 4


def test_binary_closed_forms_and_ess_curve_vs_simulation():
    g = Domain(0, ("test", "ess")).numpy()
    n, reps = 16, 4000
    for p in [0.05, 0.3]:
        R = (g.random((reps, n)) < p).astype(float)
        for beta in [0.0, 0.1, 0.5, 2.0]:
            sim = ess(mc_bolt_log_weights(R, beta)) / n
            assert abs(sim.mean() - binary_expected_ess(p, beta, n)) < 4 * sim.std() / np.sqrt(reps) + 1e-12
            if beta:
                lpr, r = np.log([1 - p, p]), np.array([0.0, 1.0])
                assert abs(np.exp(binary_log_Z(p, beta)) - np.exp(log_partition(lpr, r, beta))) < 1e-10
                assert abs(binary_ess_fraction(p, beta) - ess_fraction(lpr, r, beta)) < 1e-12
    # population ESS fraction = large-n limit of Kish ESS/n, general reward
    lpr, r = random_problem(g, 10)
    beta = 0.4
    idx = g.choice(10, size=200_000, p=np.exp(lpr))
    assert abs(ess(r[idx] / beta) / len(idx) - ess_fraction(lpr, r, beta)) < 0.01


# ---- support gap
@SET
@given(problem(), st.data())
def test_support_gap_identity(pb, data):
    lpr, r, beta, N = pb
    S = np.array(data.draw(st.lists(st.booleans(), min_size=N, max_size=N)))
    S[data.draw(st.integers(0, N - 1))] = True
    lp = log_normalize(np.where(S, data.draw(logits(N)), -np.inf))
    ls, lS = boltzmann_target(lpr, r, beta), restricted_target(lpr, r, beta, S)
    price = support_price(lpr, r, beta, S)
    gap = reg_value(ls, lpr, r, beta) - reg_value(lp, lpr, r, beta)
    assert abs(gap - price - beta * kl(lp, lS)) < 1e-10 and gap >= price - 1e-12


def test_best_supported_policy_by_optimisation():
    "BFGS restricted to the stored support finds value J(pi*) - price."
    for lpr, r, beta, g in random_problems(2, 10, "gap-opt", Nrange=(4, 20), brange=(0.2, 3)):
        S = g.random(len(r)) < 0.5
        S[0] = True
        lo = np.full(len(r), -np.inf)
        lo[S] = optimise_reg_value(lpr[S], r[S], beta) if S.sum() > 1 else 0.0
        J_opt = reg_value(lo, lpr, r, beta)
        assert (
            abs(reg_value(boltzmann_target(lpr, r, beta), lpr, r, beta) - support_price(lpr, r, beta, S) - J_opt) < 1e-8
        )


def test_more_epochs_never_recover_support_gap():
    for lpr, r, beta, g in random_problems(3, 15, "epochs", Nrange=(20, 31), brange=(0.2, 2.0)):
        N = len(r)
        idx = g.choice(N, size=10, p=np.exp(lpr))
        S = np.bincount(idx, minlength=N) > 0
        a = empirical_sft_mass(idx, mc_bolt_log_weights(r[idx], beta), N)
        ls = boltzmann_target(lpr, r, beta)
        Js = reg_value(ls, lpr, r, beta)
        ms = np.exp(ls)[~S].sum()
        _, hist = weighted_sft(a, lpr, 3000, lr=1.5 / a.max(), opt="gd", every=25)
        L = np.stack([log_softmax(h) for _, h in hist])
        G = Js - reg_value(L, lpr, r, beta)
        m = np.exp(L)[:, ~S].sum(-1)
        lb = beta * (rel_entr(m, ms) + rel_entr(1 - m, 1 - ms))
        price = support_price(lpr, r, beta, S)
        assert np.all(G >= lb - 1e-12)  # chain-rule bound at every epoch
        assert np.all(np.diff(G) >= -1e-12)  # more epochs never reduce the gap
        assert G[-1] >= price and m[-1] < 1e-3


# ---- weighted SFT by optimisation, iterative BOLT
def test_sft_gradient_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    g = Domain(0, ("test", "grad")).numpy()
    th, a = g.standard_normal(9), g.random(9)
    t = torch.tensor(th, requires_grad=True)
    (torch.tensor(a) * torch.log_softmax(t, -1)).sum().backward()
    assert np.abs(t.grad.numpy() - sft_grad(th, a)).max() < 1e-14


def test_weighted_sft_gd_reaches_induced_target_50_problems():
    worst = 0.0
    for lpr, r, beta, g in random_problems(4, 50, "sft-full", Nrange=(4, 31), brange=(0.3, 3.0)):
        lq = log_normalize(g.standard_normal(len(r)))  # any full-support sampler
        lw = bolt_log_weights(lpr, r, beta) + lpr - lq  # matching law w = pi*/q
        a = np.exp(lq + lw)
        th = weighted_sft(a, lq, 3000, lr=1.5 / a.max(), opt="gd")
        worst = max(worst, tv(log_softmax(th), boltzmann_target(lpr, r, beta)))
    print(f"max TV(GD SFT, pi*) over 50 problems = {worst:.2e}")
    assert worst < 1e-6


@SET
@given(problem(), st.integers(1, 12))
def test_iterative_bolt_is_mirror_descent(pb, K):
    lpr, r, beta, N = pb
    it = iterative_bolt(lpr, r, beta, K)
    assert np.abs(np.exp(it[-1]) - np.exp(boltzmann_target(lpr, r, beta / K))).max() < 1e-10
    # each round is the KL-prox step argmax E r - beta KL(pi || pi_k)
    for k in range(K):
        assert abs(reg_value(it[k + 1], it[k], r, beta) - soft_value(it[k], r, beta)) < 1e-9


def test_iterative_bolt_by_sft_optimisation_compounds():
    "Each round fitted by GD (not the closed form) still lands on pi_ref exp(K r/beta) normalised."
    g = Domain(0, ("test", "pmd-sft")).numpy()
    lpr, r = random_problem(g, 10)
    beta, K = 1.0, 4
    th = lpr.copy()
    for _ in range(K):
        lk = log_softmax(th)
        a = np.exp(lk + bolt_log_weights(lk, r, beta))
        th = weighted_sft(a, th, 2000, lr=1.5 / a.max(), opt="gd")
    assert tv(log_softmax(th), boltzmann_target(lpr, r, beta / K)) < 1e-8


def test_tree_boltzmann_matches_sequence_level():
    from stalebook.theory.tree import Tree, random_logits, seq_logprobs

    g = Domain(0, ("test", "tree")).numpy()
    for V, T in [(2, 4), (3, 3), (4, 2)]:
        tr = Tree(V, T)
        th, R = random_logits(tr, g, batch=(3,)), g.random((3, tr.N))
        for beta in [0.05, 0.5, 5.0]:
            ts, v = tree_boltzmann_logits(tr, th, R, beta)
            lref = seq_logprobs(tr, th)
            assert np.abs(np.exp(seq_logprobs(tr, ts)) - np.exp(boltzmann_target(lref, R, beta))).max() < 1e-12
            assert np.abs(v - soft_value(lref, R, beta)).max() < 1e-10
