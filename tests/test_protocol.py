"""Tests of stalebook.protocol and the modules built on it (analysis, calibration, verdict, design): Gram-space
bootstrap vs explicit resampling, tie streams, gate/verdict, bound methods, controls, calibration of the default
bound, the design function and `stalebook design`.

Default-run times (shared 2-core machine): the whole file about 1-2 min; the reduced-grid coverage test is the
largest part (see its docstring)."""

import contextlib
import io
import json
import os

import numpy as np
import pytest
from conftest import run_code
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from stalebook.analysis import PointResult, analyse_point, check_bounds_contain_estimate, positive_control
from stalebook.calibration import (
    bound_calibrated,
    calibrate_cell,
    calibration_grid,
    calibration_point_2s,
    calibration_record,
    cell_pool,
    regime_of,
)
from stalebook.core import Domain, StalebookError, group_advantages, homogeneous_groups
from stalebook.design import design_power, latent_draws, pilot_model, pilot_models, predict_design, smallest_design
from stalebook.protocol import (
    BOUNDS,
    DEFAULT_BOUND,
    LEGACY_BOUND,
    SPLITS,
    GramHalf,
    Rollouts,
    admissible,
    bca_bounds,
    bias_z0,
    bootstrap_gram,
    bootstrap_naive,
    cosine_scores,
    dilute_factor,
    dilute_size,
    gaussian_rel_bounds,
    jackknife_moments,
    percentile_bounds,
    point_scores,
    prompt_gradients,
    reliability,
    selection_gain,
    synthetic_point,
    synthetic_pool,
    synthetic_split,
    tie_keys,
    topk_mask,
    truth_mc,
    validation_gradient,
    verdict,
)
from stalebook.theory.reliability import overlap_limit, overlap_slope, rho_from_rel
from stalebook.verdict import NOT_CALIBRATED, pool_cell


def _inputs(seed, n, n_val, d, K, K_val, frac_homog, k):
    D = Domain(seed, ("test", "gram"))
    pool = synthetic_pool(D, n, n_val, d, frac_homog=frac_homog)
    cand, val = synthetic_point(pool, D, K, K_val)
    keys = {h: tie_keys(D, h, n) for h in SPLITS}
    masks = {
        "fresh": topk_mask(point_scores(cand, val)["R"][0], k, keys["R"]),
        "rand": topk_mask(D.child("r").numpy().random(n), k, keys["R"]),
    }
    return D, cand, val, keys, masks


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(4, 14),
    n_val=st.integers(1, 4),
    d=st.integers(2, 7),
    K=st.integers(2, 6),
    K_val=st.integers(2, 5),
    frac_homog=st.sampled_from([0.0, 0.3, 0.8]),
    std=st.booleans(),
    chunk=st.integers(1, 40),
)
def test_gram_bootstrap_equals_naive(seed, n, n_val, d, K, K_val, frac_homog, std, chunk):
    k = max(1, n // 3)
    D, cand, val, keys, masks = _inputs(seed, n, n_val, d, K, K_val, frac_homog, k)
    kw = dict(chunk=chunk, std=std, keep_scores=True, control=D.child("control"))
    a = bootstrap_gram(cand, val, masks, keys["A"], keys["B"], k, D, 60, **kw)
    b = bootstrap_naive(cand, val, masks, keys["A"], keys["B"], k, D, 60, **kw)
    assert a.keys() == b.keys() == {"rel", "gain/fresh", "gain/rand", "gain/control", "sA", "sB", "u", "mask/control"}
    assert all(len(a[s]) == 60 for s in a)
    for s in a:
        np.testing.assert_allclose(a[s].astype(float), b[s].astype(float), rtol=0, atol=1e-9, err_msg=s)


def test_gram_bootstrap_chunk_invariant():
    D, cand, val, keys, masks = _inputs(3, 12, 3, 5, 4, 3, 0.2, 4)
    runs = [
        bootstrap_gram(cand, val, masks, keys["A"], keys["B"], 4, D, 100, chunk=c, control=D.child("c"))
        for c in (1, 7, 100, None)
    ]
    assert np.ptp(runs[0]["gain/fresh"]) > 0 and np.ptp(runs[0]["rel"]) > 0 and np.ptp(runs[0]["gain/control"]) > 0
    for r in runs[1:]:
        for s in r:
            np.testing.assert_allclose(r[s], runs[0][s], rtol=0, atol=1e-12)


def test_observed_statistics_direct():
    D, cand, val, keys, masks = _inputs(5, 20, 4, 6, 5, 4, 0.4, 5)
    stale_g = Domain(5, ("stale",)).numpy().standard_normal((20, 6))
    r = analyse_point(cand, val, 5, D, stale={"g": stale_g, "s": np.arange(20.0)}, n_boot=50)

    def cos(G, g):
        return np.array([x @ g / (np.linalg.norm(x) * np.linalg.norm(g)) if np.linalg.norm(x) > 0 else 0.0 for x in G])

    s = {
        h: cos(
            np.stack([(group_advantages(cand[h].rewards[i])[:, None] * cand[h].vectors[i]).sum(0) for i in range(20)]),
            np.mean([(group_advantages(val[h].rewards[j])[:, None] * val[h].vectors[j]).sum(0) for j in range(4)], 0),
        )
        for h in SPLITS
    }
    u = (s["A"] + s["B"]) / 2
    np.testing.assert_allclose(r.u, u, atol=1e-12)
    assert r.zero_grad == {h: int(homogeneous_groups(cand[h].rewards).sum()) for h in SPLITS}
    assert r.zero_grad["A"] > 0 and np.all(r.scores["A"][homogeneous_groups(cand["A"].rewards)] == 0)
    sel = lambda x, key: set(np.lexsort((-key, -x))[:5])
    assert set(np.flatnonzero(r.selected["fresh"])) == sel(s["R"], tie_keys(D, "R", 20))
    assert set(np.flatnonzero(r.selected["s"])) == set(range(15, 20))
    assert set(np.flatnonzero(r.selected["control"])) == sel(
        np.zeros(20), tie_keys(D, "control", 20)
    )  # its own tie stream
    S = sorted(sel(s["R"], tie_keys(D, "R", 20)))
    assert abs(r.gain_fresh - (u[S].mean() - u.mean())) < 1e-12
    assert r.rel == len(sel(s["A"], tie_keys(D, "A", 20)) & sel(s["B"], tie_keys(D, "B", 20))) / 5
    assert r.K == 5 and r.bound == DEFAULT_BOUND and r.summary()["bound"] == DEFAULT_BOUND
    with pytest.raises(ValueError, match="reserved"):
        analyse_point(cand, val, 5, D, stale={"control": stale_g}, n_boot=10)


# ---------- gate and verdict boundaries ----------
@pytest.mark.parametrize(
    "rel_lb,gain_lb,k,n,want",
    [
        (0.25, 1e-12, 4, 32, True),
        (0.25 - 1e-9, 1.0, 4, 32, False),  # under 2k/n by more than float rounding
        (16 / 36 - (15 / 36 - 8 / 36), 1.0, 36, 288, True),  # a shift bound on the grid point 9/36, a rounding under it
        (0.5, 0.0, 4, 32, False),
        (0.5, -1e-9, 4, 32, False),
        (1.0, 0.3, 16, 32, True),
    ],
)
def test_admissible_boundaries(rel_lb, gain_lb, k, n, want):
    assert admissible(rel_lb, gain_lb, k, n) is want


F80 = [True] * 4 + [False]


@pytest.mark.parametrize(
    "flags,g,lb,ub,fresh,kw,want",
    [
        (F80, 0.5, 0.01, 0.9, 1.0, {}, "Effective"),  # exactly 80% admissible, exactly 50% of fresh
        (F80, 0.5, 0.0, 0.9, 1.0, {}, "Inconclusive"),  # LB exactly 0
        (F80, 0.5 - 1e-9, 0.01, 0.9, 1.0, {}, "Inconclusive"),  # just under 50% of fresh
        ([True] * 3 + [False] * 2, 0.9, 0.5, 1.0, 1.0, {}, "Inconclusive"),  # 60% admissible
        (F80, -0.2, -0.5, 0.0, 1.0, {}, "Ineffective"),  # UB exactly 0
        (F80, -0.2, -0.5, 1e-12, 1.0, {}, "Inconclusive"),
        ([True] * 7 + [False] * 3, -0.2, -0.5, -0.1, 1.0, {}, "Inconclusive"),  # 70%
        ([True] * 10, 0.3, 0.1, 0.6, 1.0, {"preserve": 0.25}, "Effective"),
        ([True] * 10, 0.3, 0.1, 0.6, 1.0, {}, "Inconclusive"),
        (F80, 0.1, -0.1, 0.49, 1.0, {"futility": 0.5}, "Ineffective"),
        (F80, 0.1, -0.1, 0.5, 1.0, {"futility": 0.5}, "Inconclusive"),
        ([True] * 4 + [False], 0.9, 0.5, 1.0, 1.0, {"min_admissible": 0.81}, "Inconclusive"),
        ([], 0.9, 0.5, 1.0, 1.0, {}, "Inconclusive"),
    ],
)
def test_verdict_boundaries(flags, g, lb, ub, fresh, kw, want):
    assert verdict(flags, g, lb, ub, fresh, **kw) == want


# ---------- tie streams ----------
def test_tie_streams_remove_inflation():
    D = Domain(11, ("test", "ties"))
    n, k = 48, 12
    pool = synthetic_pool(D, n, 8, 16, frac_homog=0.7, signal=0.0)
    r_idx, r_str = [], []
    for s in range(60):
        cand, val = synthetic_point(pool, D.child(s))
        sc = point_scores(cand, val)
        idx = -np.arange(float(n))
        r_idx.append(reliability(topk_mask(sc["A"][0], k, idx), topk_mask(sc["B"][0], k, idx)))
        r_str.append(analyse_point(cand, val, k, D.child(s), n_boot=10, gauss_reps=50).rel)
    tr = truth_mc(pool, D.child("truth"), k, T=2000)
    se = np.hypot(np.std(r_str) / np.sqrt(60), tr["rel_se"])
    assert abs(np.mean(r_str) - tr["rel"]) < 4 * se  # streams: unbiased for the truth
    assert np.mean(r_idx) - tr["rel"] > 10 * se  # index order: inflated
    assert np.mean(r_idx) >= 2 * k / n > tr["rel"]  # ... enough to pass the 2k/n gate spuriously


# ---------- bound methods ----------
def test_bc_reduces_to_percentile_without_bias():
    r = Domain(0, ("test", "bc")).numpy().standard_normal(4999)
    sym = np.concatenate([r, -r, [0.0]]) + 1.5  # replicates centred exactly on the estimate 1.5
    assert bias_z0(1.5, sym) == 0.0
    np.testing.assert_allclose(bca_bounds(1.5, sym), percentile_bounds(sym), rtol=0, atol=1e-12)
    # an unbiased statistic with a real bootstrap: the mean of a symmetric sample, 20,000 replicates
    g = Domain(1, ("test", "bc")).numpy()
    x = g.standard_normal(200)
    reps = x[g.integers(0, 200, (20000, 200))].mean(1)
    sd = reps.std()
    assert abs(bias_z0(x.mean(), reps)) < 0.03
    np.testing.assert_allclose(bca_bounds(x.mean(), reps), percentile_bounds(reps), rtol=0, atol=0.05 * sd)
    assert (
        bca_bounds(x.mean() + sd, reps)[0] > percentile_bounds(reps)[0] + 0.5 * sd
    )  # an estimate above the replicates: BC moves


@settings(max_examples=25, deadline=None)
@given(
    rel=st.floats(0.15, 0.9), sd=st.floats(0.005, 0.1), nk=st.sampled_from([(64, 8), (256, 32), (64, 16), (200, 10)])
)
def test_gaussian_bound_inverts_overlap_limit(rel, sd, nk):
    n, k = nk
    q = k / n
    lo, hi = gaussian_rel_bounds(rel, n, k, sd)
    rho = rho_from_rel(rel, q)
    if rel > q:
        assert abs(float(overlap_limit(rho, q)) - rel) < 1e-9  # rho_hat = O^{-1}(Rel_k)
    se = sd / overlap_slope(float(np.clip(rho, -1 + 1e-6, 1 - 1e-6)), q)
    z = stats.norm.ppf(0.95)
    assert abs(lo - float(overlap_limit(np.clip(rho - z * se, -1, 1), q))) < 1e-12
    assert abs(hi - float(overlap_limit(np.clip(rho + z * se, -1, 1), q))) < 1e-12
    assert lo <= max(rel, q) + 1e-12 and hi >= max(rel, q) - 1e-12
    assert gaussian_rel_bounds(rel, n, k, 2 * sd)[0] <= lo + 1e-12  # wider SD, lower bound


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6), n=st.integers(5, 12), K=st.integers(2, 5), Kv=st.integers(2, 4), nv=st.integers(1, 3)
)
def test_jackknife_moments_equal_direct_deletion(seed, n, K, Kv, nv):
    k = max(1, n // 3)
    D, cand, val, keys, masks = _inputs(seed, n, nv, 4, K, Kv, 0.3, k)
    sc = {h: point_scores(cand, val)[h][0] for h in SPLITS}
    jm = jackknife_moments(cand, val, {h: GramHalf.build(cand[h], val[h]) for h in "AB"}, sc, keys, k, masks)

    def mom(theta):
        m = theta.shape[1]
        l = (m - 1) * (theta.mean(1, keepdims=True) - theta)
        return np.array([(l**2).sum() / m**2, (l**3).sum() / m**3])

    want = {s: np.zeros(2) for s in jm}
    for h, o in (("A", "B"), ("B", "A")):
        mo, gv = topk_mask(sc[o], k, keys[o]), validation_gradient(val[h])
        G = prompt_gradients(val[h])

        def stats_of(scores, h=h, o=o, mo=mo):
            return {
                "rel": reliability(topk_mask(scores, k, keys[h]), mo),
                **{nm: selection_gain((scores + sc[o]) / 2, m) for nm, m in masks.items()},
            }

        cand_rows = []
        for i in range(n):
            for y in range(K):
                gi = prompt_gradients(
                    Rollouts(np.delete(cand[h].rewards[i : i + 1], y, 1), np.delete(cand[h].vectors[i : i + 1], y, 1))
                )
                scores = sc[h].copy()
                scores[i] = cosine_scores(gi, gv)[0][0]
                cand_rows.append(stats_of(scores))
        val_rows = []
        for j in range(nv):
            for y in range(Kv):
                gj = prompt_gradients(
                    Rollouts(np.delete(val[h].rewards[j : j + 1], y, 1), np.delete(val[h].vectors[j : j + 1], y, 1))
                )[0]
                gvj = (G.sum(0) - G[j] + gj) / nv
                val_rows.append(stats_of(cosine_scores(prompt_gradients(cand[h]), gvj)[0]))
        for s in want:
            want[s] += mom(np.array([r[s] for r in cand_rows]).reshape(n, K)) + mom(
                np.array([r[s] for r in val_rows]).reshape(nv, Kv)
            )
    for s in jm:
        np.testing.assert_allclose(jm[s], want[s], rtol=1e-9, atol=1e-12, err_msg=s)


def test_point_result_roundtrip_and_old_loader():
    D, cand, val, keys, masks = _inputs(9, 16, 3, 5, 4, 3, 0.3, 4)
    r = analyse_point(cand, val, 4, D, stale={"g00": np.arange(16.0), "g11": -np.arange(16.0)}, n_boot=300)
    buf = io.BytesIO()
    np.savez(buf, **{k.replace("/", "__"): v for k, v in r.to_arrays().items()})
    buf.seek(0)
    summary = json.loads(json.dumps(r.summary()))
    with np.load(buf) as z:
        arrays = dict(z)
    back = PointResult.from_saved(summary, arrays)
    for m in BOUNDS:
        for s in r.stats:
            assert back.bounds(s, m) == pytest.approx(r.bounds(s, m), abs=1e-12)
    assert positive_control(back, D)["estimators"] == positive_control(r, D)["estimators"]
    # the loader of today's point notebook (boot dict only, old constructor fields) keeps working
    boot = {k.replace("__", "/"): v for k, v in arrays.items() if not k.startswith(("scores__", "keys__")) and k != "u"}
    old = PointResult(
        n=summary["n"],
        k=summary["k"],
        n_boot=summary["n_boot"],
        level=summary["level"],
        rel=summary["rel"],
        gain_fresh=summary["gain_fresh"],
        gain_stale=summary["gain_stale"],
        u=None,
        scores={},
        selected={},
        zero_grad=summary["zero_grad"],
        boot=boot,
    )
    for s in ("rel", "gain_fresh", "gain_stale/g00", "gain_stale/g11"):
        assert old.bounds(s) == pytest.approx(r.bounds(s), abs=1e-12)
    assert summary["rel_bounds"] == pytest.approx(list(r.bounds("rel"))) and summary["bound"] == DEFAULT_BOUND


# ---------- controls ----------
def test_negative_control_gain_mean_zero():
    "Over 60 independent points (n=64, k=8) the random control's gain averages 0 within 3 SE; its LB95 > 0 rarely."
    D = Domain(3, ("test", "negative"))
    pool = synthetic_pool(D, 64, 16, 16, sigma_v=0.3, frac_homog=0.3, signal=1.5)
    g, lb, ov = [], [], []
    for t in range(60):
        cand, val = synthetic_point(pool, D.child(t), 8, 8)
        r = analyse_point(cand, val, 8, D.child(t), n_boot=100, gauss_reps=50)
        g.append(r.gain_control)
        lb.append(r.bounds("gain_control")[0])
        ov.append((r.selected["control"] & r.selected["fresh"]).sum() / 8)
    g = np.array(g)
    assert abs(g.mean()) < 3 * g.std(ddof=1) / np.sqrt(len(g))
    assert np.std(g) > 0.01  # the control does move
    assert np.mean(np.array(lb) > 0) <= 0.10
    assert abs(np.mean(ov) - 8 / 64) < 3 * np.std(ov) / np.sqrt(len(ov)) + 1e-9  # independent of the fresh scores


def test_positive_control():
    D = Domain(4, ("test", "positive"))
    pool = synthetic_pool(D, 64, 16, 16, sigma_v=0.3, frac_homog=0.3, signal=1.5)
    rej, harm = [], []
    for t in range(40):
        dt = D.child(t)
        cand, val = synthetic_point(pool, dt, 8, 8)
        gs = prompt_gradients(synthetic_split(pool, dt.child("split", "S"), 8, 8)[0])
        r = analyse_point(cand, val, 8, dt, stale={"g00": gs, "g10": gs.copy(), "bad": -gs}, n_boot=20, gauss_reps=50)
        pc = positive_control(r, dt, ("g00", "g10"), n_perm=300)
        assert pc["coincide"] and pc["max_score_diff"] == 0.0
        rej.append(pc["estimators"]["g00"]["p_value"] < 0.05)
        harm.append(positive_control(r, dt, ("bad",), n_perm=300)["estimators"]["bad"]["p_value"] < 0.05)
    assert np.mean(rej) <= 0.15 and np.mean(harm) >= 0.9  # an exact 5% test, 40 points; a reversed selector: caught
    r2 = analyse_point(
        cand,
        val,
        8,
        dt,
        stale={"g00": gs, "g10": gs + 1e-3 * dt.numpy().standard_normal(gs.shape)},
        n_boot=20,
        gauss_reps=50,
    )
    assert not positive_control(r2, dt, n_perm=50)["coincide"]


# ---------- calibration of the default bound ----------
def test_bound_coverage_reduced_grid():
    """Coverage of both one-sided 95% bounds on a reduced grid: the four regimes at n=64, K in {4, 8},
    2 pools x 13 points per cell = 208 points, 300 replicates each (about 20 s of CPU).

    The two-sided study chose DEFAULT_BOUND by its rule; its LB and UB cover near 95% (the UB of Rel_k, which no
    decision uses, is left out here). At 208 points
    the binomial SE of a 95% coverage is 1.5 points, so the test's band is [90%, 99%] (about -3.3 / +2.7 SE) on each
    side. It still fails the old percentile default, whose upper bounds of the gains sit below their estimates
    (UB coverage well under 80%), and the bias-corrected one (below 90% on some side)."""
    cells = [c for c in calibration_grid(Ks=(4, 8), ns=(64,))]
    rows = []
    for c in cells:
        rows += calibrate_cell(
            c,
            Domain(1, ("test", "coverage", c.regime, c.K)),
            pools=2,
            seeds=13,
            n_boot=300,
            T=800,
            gauss_reps=100,
            n_perm=20,
        )
    assert len(rows) >= 200
    cover = lambda m, s, side: np.mean(
        [
            (r["bounds"][m][s][0] <= r["truth"][s]) if side == 0 else (r["bounds"][m][s][1] >= r["truth"][s])
            for r in rows
        ]
    )
    stats_ = ("rel", "gain_fresh", "gain_stale/same", "gain_stale/weak")
    got = {(s, side): cover(DEFAULT_BOUND, s, side) for s in stats_ for side in (0, 1) if (s, side) != ("rel", 1)}
    print(f"{len(rows)} points, {DEFAULT_BOUND} coverage (stat, 0=LB/1=UB):", {k: round(v, 3) for k, v in got.items()})
    for key, v in got.items():
        assert 0.90 <= v <= 0.99, (key, v)
    assert cover("percentile", "gain_fresh", 1) < 0.8  # the old default's UB lies below its estimate
    assert min(cover("bc", "gain_fresh", side) for side in (0, 1)) < 0.9  # the band can tell methods apart
    for m in (DEFAULT_BOUND, "model"):
        assert np.mean([r["bounds"][m]["gain_control"][0] > 0 for r in rows]) <= 0.08, (
            m
        )  # negative control: few false positives


def test_dilute_control_false_ineffective():
    """The diluted fresh selector (true gain = share x the fresh set's true gain > 0): with the default bound its
    UB95 <= 0 in at most 5% of 60 admissible-looking points plus noise (<= 10%), its UB covers its truth, and its
    mean gain is share x the fresh gain within 4 SE."""
    cell = calibration_grid(Ks=(8,), ns=(64,))[0]  # low reliability, small gain: the hardest case
    D = Domain(5, ("test", "dilute"))
    pool = cell_pool(cell, D.child("pool"))
    tr = truth_mc(pool, D.child("truth"), cell.k, cell.K, cell.K, 800)
    rows = [
        calibration_point_2s(pool, tr, cell, D.child("pt", s), n_boot=200, gauss_reps=50, diag_boot=20)
        for s in range(60)
    ]
    ub = np.array([r["bounds"][DEFAULT_BOUND]["gain_dilute"][1] for r in rows])
    truth = np.array([r["truth"]["gain_dilute"] for r in rows])
    assert (truth > 0).all()
    assert np.mean(ub <= 0) <= 0.10 and np.mean(ub >= truth) >= 0.85
    g = np.array([r["est"]["gain_dilute"] for r in rows])
    f = np.array([r["est"]["gain_fresh"] for r in rows])
    share = dilute_factor(dilute_size(cell.k, cell.n), cell.k, cell.n)
    assert abs(g.mean() - share * f.mean()) < 4 * g.std(ddof=1) / np.sqrt(len(g))
    assert all(
        r["bounds"][DEFAULT_BOUND][s][0] <= r["est"][s] <= r["bounds"][DEFAULT_BOUND][s][1]
        for r in rows
        for s in r["est"]
    )


def test_bounds_contain_estimate_and_legacy_method():
    """The registered check passes; a result saved without a method keeps the old default (percentile); an
    uncalibrated method makes a cell Inconclusive with the note, whatever its bounds say."""
    assert all(c.passed for c in check_bounds_contain_estimate())
    D, cand, val, keys, masks = _inputs(9, 16, 3, 5, 4, 3, 0.3, 4)
    r = analyse_point(cand, val, 4, D, stale={"g00": np.arange(16.0)}, n_boot=200)
    summary = {k: v for k, v in json.loads(json.dumps(r.summary())).items() if k != "bound"}
    old = PointResult.from_saved(summary, {k.replace("/", "__"): v for k, v in r.to_arrays().items()})
    assert old.bound == LEGACY_BOUND == "percentile" and old.bounds("gain_fresh") == r.bounds(
        "gain_fresh", "percentile"
    )
    assert PointResult.from_saved(r.summary(), r.to_arrays()).bound == DEFAULT_BOUND
    assert verdict([True] * 5, 1.0, 0.5, 1.5, 1.0, calibrated=False) == "Inconclusive"
    regimes = calibration_record()["centres"]
    assert not any(bound_calibrated("percentile", r) for r in regimes)  # its UB under-covers everywhere
    assert any(bound_calibrated(DEFAULT_BOUND, r) for r in regimes)
    cell = pool_cell([r] * 5, "g00", bound="percentile")
    assert cell["verdict"] == "Inconclusive" and cell["note"] == NOT_CALIBRATED
    assert pool_cell([r] * 5, "g00", bound="percentile", check_calibration=False)["note"] == ""


def test_the_tiny_demo_regime_is_calibrated():
    """Every cell of the committed demo table (results/tiny-demo, what the README reports) sits in a calibration regime
    (the nearest to its pooled Rel_k and fresh gain at the registry's n and k) where the default bound passed the
    two-sided rule for every quantity a decision uses: its verdicts are not Inconclusive for want of calibration."""
    from stalebook.registry import load_registry

    with open(os.path.join(os.path.dirname(__file__), "..", "results", "tiny-demo", "table.json")) as f:
        table = json.load(f)
    pc = next(iter(load_registry("tiny:demo").units().values())).point
    assert table["rows"] and all(r["checkpoint"] in (0, 25) for r in table["rows"])
    for r in table["rows"]:
        regime = regime_of(r["rel"], pc.n_candidates, pc.k, r["fresh_gain"])
        assert bound_calibrated(DEFAULT_BOUND, regime), (r["checkpoint"], regime)
    assert not bound_calibrated(DEFAULT_BOUND, "low-rel/small-gain")  # where the demo's c = 0 used to fall


# ---------- synthetic stale selectors -> verdicts ----------
def _cell(sigma_v, seeds=5, root=21):
    D = Domain(root, ("test", "cell", str(sigma_v)))
    n, k = 48, 8
    pool = synthetic_pool(D, n, 8, 16, sigma_v=sigma_v, frac_homog=0.1, signal=1.5)
    pts = []
    for s in range(seeds):
        dom = D.child("pt", s)
        cand, val = synthetic_point(pool, dom)
        extra, _ = synthetic_split(pool, dom.child("split", "S"))  # an independent fresh-like split
        g_s = prompt_gradients(extra)
        s_s = cosine_scores(g_s, validation_gradient(val["R"]))[0]
        pts.append(
            analyse_point(
                cand,
                val,
                k,
                dom,
                n_boot=2000,
                stale={"good": g_s, "random": dom.child("random").numpy().random(n), "harmful": -s_s},
            )
        )
    return pts


def test_selector_verdicts():
    pts = _cell(0.2)
    adm = [p for p in pts if admissible(p.rel_lb, p.gain_fresh_lb, p.k, p.n)]
    assert len(adm) >= 4  # the cell passes the 80% gate (with the model bound one seed's LB(Rel_k) is 0.25 < 2k/n)
    assert pool_cell(pts, "good")["verdict"] == "Effective"  # (a) as good as fresh
    assert pool_cell(pts, "harmful")["verdict"] == "Ineffective"  # (c) harmful: UB <= 0
    assert pool_cell(pts, "random")["verdict"] != "Effective"
    assert pool_cell(pts, "control")["verdict"] != "Effective"  # the negative control
    assert pool_cell(pts, "random", futility=0.5)["verdict"] == "Ineffective"  # (b) useless, with futility
    noisy = _cell(3.0)  # (d) reference too noisy to tell
    assert sum(admissible(p.rel_lb, p.gain_fresh_lb, p.k, p.n) for p in noisy) < 4
    for e in ("good", "random", "harmful"):
        assert pool_cell(noisy, e)["verdict"] == "Inconclusive"
    assert pool_cell(adm[:4] + [None], "good")["verdict"] == "Effective"  # a missing seed: 4/5 = 80%
    assert pool_cell(pts[:3] + [None, None], "good")["verdict"] == "Inconclusive"
    for m in BOUNDS:
        assert pool_cell(pts, "good", bound=m)["bound"] == m


# ---------- power and design ----------
def test_design_power_and_smallest_design():
    kw = dict(pools=20, draws=40, bound="model")
    a = design_power(0.5, 64, 8, seeds=5, **kw)
    assert a["p_effective"] + a["p_ineffective"] + a["p_inconclusive"] == pytest.approx(1.0)
    b = design_power(0.5, 512, 64, seeds=5, **kw)
    assert b["p_gate"] > a["p_gate"] and b["p_effective"] >= a["p_effective"]
    assert design_power(0.8, 256, 32, stale_ratio=-1.0, **kw)["p_ineffective"] > 0.5  # a harmful selector
    p = design_power(0.5, 128, 16, bound="percentile", pools=10, draws=20, boot_reps=40)
    assert p["p_gate"] < design_power(0.5, 128, 16, **kw)["p_gate"]  # the raw percentile reading: less power
    m = pilot_model(dict(n=64, k=8, K=8, rel=0.4, gain_fresh=0.1, gain_stale={"g00": 0.05}))
    assert m["stale_ratio"]["g00"] == pytest.approx(0.5) and m["rho"] == pytest.approx(rho_from_rel(0.4, 1 / 8))
    best, tried = smallest_design(m, 0.9, ns=(64, 128, 256), Ks=(8, 16, 32), pools=10, draws=30, bound="model")
    costs = [t["n"] * t["K"] for t in tried]
    assert costs == sorted(costs)
    if best is not None:
        assert best["p_gate"] >= 0.9 and all(t["p_gate"] < 0.9 for t in tried[:-1])
    assert (
        predict_design(m, 64, 16, 8, pools=5, draws=5, bound="model")["rho"]
        > predict_design(m, 64, 8, 8, pools=5, draws=5, bound="model")["rho"]
    )


def _varying_points(g, m: int, n: int = 256, k: int = 32, rho: float = 0.7, tau: float = 0.08) -> list[dict]:
    """m points whose split-half correlation varies between seeds, rho_s ~ N(rho, tau): each one draw of the Gaussian
    model at rho_s, its Rel_k's lower bound the estimate minus the model's spread at rho_s."""
    out = []
    for _ in range(m):
        r = float(np.clip(rho + tau * g.standard_normal(), 0.3, 0.95))
        L = latent_draws(r, n, k, pools=1, draws=40, domain=Domain(int(g.integers(2**31)), ("test", "pilot")))
        rel = float(L["rel"][0, 0])
        out.append(
            dict(
                n=n,
                k=k,
                K=16,
                rel=rel,
                rel_bounds=[rel - float(L["rel_spread"][0, 0]), 1.0],
                gain_fresh=0.15,
                gain_stale={"g00": 0.12},
            )
        )
    return out


def test_the_pilots_spread_enters_the_forecast():
    """When rho varies between seeds (rho_s ~ N(0.7, 0.15)), a forecast that takes the pilot's pooled rho as known is
    over-confident; one that widens the model's spread to the pilot points' (20) predicts the pass rate of 300 new
    seeds without bias. Over 4 simulation seeds (each forecast is itself noisy: 20 points estimate the spread)."""
    err_spread, err_known = [], []
    for seed in range(4):
        g = Domain(seed, ("test", "forecast")).numpy()
        pilot, new = _varying_points(g, 20, tau=0.15), _varying_points(g, 300, tau=0.15)
        observed = np.mean([s["rel_bounds"][0] >= 2 * 32 / 256 - 1e-12 for s in new])
        m = pilot_models(pilot)
        kw = dict(pools=30, draws=50, cells=10)
        known = m | dict(rel_sd_scale=1.0, spread_scale=1.0)
        assert m["rel_sd_scale"] > 1.2  # the pilot shows the extra spread
        err_spread.append(predict_design(m, 256, 16, 32, 1, **kw)["p_gate"] - observed)
        err_known.append(predict_design(known, 256, 16, 32, 1, **kw)["p_gate"] - observed)
    assert min(err_known) > 0 and np.mean(err_known) > 0.05, err_known  # rho taken as known: over-confident
    assert abs(np.mean(err_spread)) < 0.04, err_spread  # 300 new seeds per run: SE ~0.02


def test_cmd_design(tmp_path):
    from stalebook.commands import cmd_design  # the command layer loads torch; the rest of this file needs numpy only

    D, cand, val, keys, masks = _inputs(2, 32, 4, 6, 6, 4, 0.2, 4)
    r = analyse_point(cand, val, 4, D, stale={"g00": np.arange(32.0)}, n_boot=100)
    f = tmp_path / "result.json"
    f.write_text(json.dumps(dict(point={}, result=r.summary(), manifest={})))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cmd_design([str(f), "--seeds", "3", "--target", "0.5", "--bound", "model"]) == 0
    text = out.getvalue()
    assert (
        "pilot: n=32 k=4 K=6" in text
        and "P(gate)=" in text
        and "smallest design with P(gate) >= 0.5 (bound model)" in text
    )
    with pytest.raises(StalebookError, match="no such file"):
        cmd_design([str(tmp_path / "missing.json")])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(StalebookError, match="not JSON"):
        cmd_design([str(tmp_path / "bad.json")])
    (tmp_path / "partial.json").write_text(json.dumps({"result": {"n": 3}}))
    with pytest.raises(StalebookError, match="lacks"):
        cmd_design([str(tmp_path / "partial.json")])
    out = io.StringIO()  # several pilot points at one design: their spread enters the forecast
    with contextlib.redirect_stdout(out):
        assert cmd_design([str(f)] * 3 + ["--seeds", "2", "--target", "0.5"]) == 0
    assert "3 pilot points: Rel_k spread x1.00" in out.getvalue()  # identical points: no spread beyond the model's
    with contextlib.redirect_stdout(io.StringIO()):
        assert cmd_design([str(f)] * 2 + ["--seeds", "2", "--target", "0.5"]) == 0
    with pytest.raises(StalebookError, match="--rho with --n"):
        cmd_design(["--rho", "0.4"])
    with pytest.raises(StalebookError):
        cmd_design(["--rho", "x"])


@pytest.mark.slow
@pytest.mark.long
def test_default_bound_coverage_larger_grid():
    """All 24 cells of the study's grid, 1 pool x 12 points each (288 points, 1,000 replicates; about 4 CPU-minutes):
    the default's LB and UB in [90%, 99%]; the old percentile default's LB >= 99%."""
    rows = []
    for c in calibration_grid():
        rows += calibrate_cell(c, Domain(2, ("test", "coverage", c.regime, c.n, c.K)), pools=1, seeds=12, n_boot=1000)
    for s in ("rel", "gain_fresh", "gain_stale/same"):
        v = np.mean([r["bounds"][DEFAULT_BOUND][s][0] <= r["truth"][s] for r in rows])
        w = np.mean([r["bounds"][DEFAULT_BOUND][s][1] >= r["truth"][s] for r in rows])
        assert 0.90 <= v <= 0.99 and 0.90 <= w <= 0.99, (s, v, w)
        assert np.mean([r["bounds"]["percentile"][s][0] <= r["truth"][s] for r in rows]) >= 0.99


# The analysis in a fresh interpreter (stalebook imported first, as every entry point does); prints a hash of every
# number a point writes.
_XM_SCRIPT = """
import hashlib, json
import stalebook
import numpy as np
import stalebook.analysis as A
import stalebook.protocol as P
from stalebook.core import Domain
g = np.random.default_rng(3)
mu = g.standard_normal(512)
ro = lambda m: P.Rollouts((g.random((m, 8)) < 0.4) * 1.0, g.standard_normal((m, 8, 512)) + 0.3 * mu)
cand, val = {h: ro(48) for h in P.SPLITS}, {h: ro(12) for h in P.SPLITS}
res = A.analyse_point(cand, val, 12, Domain(0, ("test", "xm")), stale={"s": g.standard_normal((48, 512))}, n_boot=2000)
arr = res.to_arrays()
h = hashlib.sha256(json.dumps(res.summary(), sort_keys=True).encode())
for k in sorted(arr):
    h.update(k.encode() + np.ascontiguousarray(arr[k]).tobytes())
print(h.hexdigest())
"""


def _xm_hash(**env):
    r = run_code(_XM_SCRIPT, env_extra=env, drop=("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS"), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_analysis_bytes_follow_the_pin_not_the_users_blas_settings():
    """A pinned process's analysis (its bootstrap's products go through OpenBLAS) gives the same bytes whatever OpenBLAS
    kernels and threads the environment asked for: the pin overrides them (Sandybridge's kernels have no FMA, so they
    would sum otherwise; both run on any AVX2 CPU)."""
    assert _xm_hash() == _xm_hash(OPENBLAS_CORETYPE="Sandybridge", OPENBLAS_NUM_THREADS="2")
