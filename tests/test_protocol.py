"""Tests of stalebook.protocol: Gram-space bootstrap vs explicit resampling, tie streams, gate/verdict, calibration."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from stalebook.core import Domain, group_advantages, homogeneous_groups
from stalebook.protocol import (SPLITS, Rollouts, cosine_scores, admissible, analyse_point, bootstrap_gram, bootstrap_naive, calibrate,
                                point_scores, pool_cell, prompt_gradients, reliability, synthetic_point, synthetic_pool,
                                synthetic_split, tie_keys, topk_mask, truth_mc, validation_gradient, verdict)


def _inputs(seed, n, n_val, d, K, K_val, frac_homog, k):
    D = Domain(seed, ("test", "gram"))
    pool = synthetic_pool(D, n, n_val, d, frac_homog=frac_homog)
    cand, val = synthetic_point(pool, D, K, K_val)
    keys = {h: tie_keys(D, h, n) for h in SPLITS}
    masks = {"fresh": topk_mask(point_scores(cand, val)["R"][0], k, keys["R"]),
             "rand": topk_mask(D.child("r").numpy().random(n), k, keys["R"])}
    return D, cand, val, keys, masks


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(4, 14), n_val=st.integers(1, 4), d=st.integers(2, 7),
       K=st.integers(2, 6), K_val=st.integers(2, 5), frac_homog=st.sampled_from([0.0, 0.3, 0.8]),
       std=st.booleans(), chunk=st.integers(1, 40))
def test_gram_bootstrap_equals_naive(seed, n, n_val, d, K, K_val, frac_homog, std, chunk):
    k = max(1, n // 3)
    D, cand, val, keys, masks = _inputs(seed, n, n_val, d, K, K_val, frac_homog, k)
    a = bootstrap_gram(cand, val, masks, keys["A"], keys["B"], k, D, 60, chunk=chunk, std=std, keep_scores=True)
    b = bootstrap_naive(cand, val, masks, keys["A"], keys["B"], k, D, 60, chunk=chunk, std=std, keep_scores=True)
    assert a.keys() == b.keys() == {"rel", "gain/fresh", "gain/rand", "sA", "sB", "u"} and all(len(a[s]) == 60 for s in a)
    for s in a:
        np.testing.assert_allclose(a[s], b[s], rtol=0, atol=1e-9, err_msg=s)


def test_gram_bootstrap_chunk_invariant():
    D, cand, val, keys, masks = _inputs(3, 12, 3, 5, 4, 3, 0.2, 4)
    runs = [bootstrap_gram(cand, val, masks, keys["A"], keys["B"], 4, D, 100, chunk=c) for c in (1, 7, 100, None)]
    assert np.ptp(runs[0]["gain/fresh"]) > 0 and np.ptp(runs[0]["rel"]) > 0       # the replicates vary
    for r in runs[1:]:
        for s in r: np.testing.assert_allclose(r[s], runs[0][s], rtol=0, atol=1e-12)


def test_observed_statistics_direct():
    D, cand, val, keys, masks = _inputs(5, 20, 4, 6, 5, 4, 0.4, 5)
    stale_g = Domain(5, ("stale",)).numpy().standard_normal((20, 6))
    r = analyse_point(cand, val, 5, D, stale={"g": stale_g, "s": np.arange(20.0)}, n_boot=50)
    # by hand: gradients, cosines, u, gains
    def cos(G, g): return np.array([x @ g / (np.linalg.norm(x) * np.linalg.norm(g)) if np.linalg.norm(x) > 0 else 0.0 for x in G])
    s = {h: cos(np.stack([(group_advantages(cand[h].rewards[i]) [:, None] * cand[h].vectors[i]).sum(0) for i in range(20)]),
                np.mean([(group_advantages(val[h].rewards[j])[:, None] * val[h].vectors[j]).sum(0) for j in range(4)], 0))
         for h in SPLITS}
    u = (s["A"] + s["B"]) / 2
    np.testing.assert_allclose(r.u, u, atol=1e-12)
    assert r.zero_grad == {h: int(homogeneous_groups(cand[h].rewards).sum()) for h in SPLITS}
    assert r.zero_grad["A"] > 0 and np.all(r.scores["A"][homogeneous_groups(cand["A"].rewards)] == 0)
    sel = lambda x, key: set(np.lexsort((-key, -x))[:5])
    assert set(np.flatnonzero(r.selected["fresh"])) == sel(s["R"], tie_keys(D, "R", 20))
    assert set(np.flatnonzero(r.selected["s"])) == set(range(15, 20))
    S = sorted(sel(s["R"], tie_keys(D, "R", 20)))
    assert abs(r.gain_fresh - (u[S].mean() - u.mean())) < 1e-12
    assert r.rel == len(sel(s["A"], tie_keys(D, "A", 20)) & sel(s["B"], tie_keys(D, "B", 20))) / 5


# ---------- gate and verdict boundaries ----------
@pytest.mark.parametrize("rel_lb,gain_lb,k,n,want", [
    (0.25, 1e-12, 4, 32, True), (0.25 - 1e-12, 1.0, 4, 32, False), (0.5, 0.0, 4, 32, False),
    (0.5, -1e-9, 4, 32, False), (1.0, 0.3, 16, 32, True)])
def test_admissible_boundaries(rel_lb, gain_lb, k, n, want):
    assert admissible(rel_lb, gain_lb, k, n) is want

F80 = [True] * 4 + [False]
@pytest.mark.parametrize("flags,g,lb,ub,fresh,kw,want", [
    (F80, 0.5, 0.01, 0.9, 1.0, {}, "Effective"),                # exactly 80% admissible, exactly 50% of fresh
    (F80, 0.5, 0.0, 0.9, 1.0, {}, "Inconclusive"),              # LB exactly 0
    (F80, 0.5 - 1e-9, 0.01, 0.9, 1.0, {}, "Inconclusive"),      # just under 50% of fresh
    ([True] * 3 + [False] * 2, 0.9, 0.5, 1.0, 1.0, {}, "Inconclusive"),   # 60% admissible
    (F80, -0.2, -0.5, 0.0, 1.0, {}, "Ineffective"),             # UB exactly 0
    (F80, -0.2, -0.5, 1e-12, 1.0, {}, "Inconclusive"),
    ([True] * 7 + [False] * 3, -0.2, -0.5, -0.1, 1.0, {}, "Inconclusive"),   # 70%
    ([True] * 10, 0.3, 0.1, 0.6, 1.0, {"preserve": 0.25}, "Effective"),
    ([True] * 10, 0.3, 0.1, 0.6, 1.0, {}, "Inconclusive"),
    (F80, 0.1, -0.1, 0.49, 1.0, {"futility": 0.5}, "Ineffective"),
    (F80, 0.1, -0.1, 0.5, 1.0, {"futility": 0.5}, "Inconclusive"),
    ([True] * 4 + [False], 0.9, 0.5, 1.0, 1.0, {"min_admissible": 0.81}, "Inconclusive"),
    ([], 0.9, 0.5, 1.0, 1.0, {}, "Inconclusive")])
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
        r_str.append(analyse_point(cand, val, k, D.child(s), n_boot=10).rel)
    tr = truth_mc(pool, D.child("truth"), k, T=2000)
    se = np.hypot(np.std(r_str) / np.sqrt(60), tr["rel_se"])
    assert abs(np.mean(r_str) - tr["rel"]) < 4 * se                 # streams: unbiased for the truth
    assert np.mean(r_idx) - tr["rel"] > 10 * se                     # index order: inflated
    assert np.mean(r_idx) >= 2 * k / n > tr["rel"]                  # ... enough to pass the 2k/n gate spuriously


# ---------- synthetic stale selectors -> verdicts ----------
def _cell(sigma_v, seeds=5, root=21):
    D = Domain(root, ("test", "cell", str(sigma_v)))
    n, k = 48, 8
    pool = synthetic_pool(D, n, 8, 16, sigma_v=sigma_v, frac_homog=0.1, signal=1.5)
    pts = []
    for s in range(seeds):
        dom = D.child("pt", s)
        cand, val = synthetic_point(pool, dom)
        extra, _ = synthetic_split(pool, dom.child("split", "S"))       # an independent fresh-like split
        g_s = prompt_gradients(extra)
        s_s = cosine_scores(g_s, validation_gradient(val["R"]))[0]
        pts.append(analyse_point(cand, val, k, dom, n_boot=2000, stale={
            "good": g_s, "random": dom.child("random").numpy().random(n), "harmful": -s_s}))
    return pts

def test_selector_verdicts():
    pts = _cell(0.2)
    assert all(admissible(p.rel_lb, p.gain_fresh_lb, p.k, p.n) for p in pts)
    assert pool_cell(pts, "good")["verdict"] == "Effective"                 # (a) as good as fresh
    assert pool_cell(pts, "harmful")["verdict"] == "Ineffective"            # (c) harmful: UB <= 0
    rnd = pool_cell(pts, "random")
    assert rnd["verdict"] != "Effective"
    assert pool_cell(pts, "random", futility=0.5)["verdict"] == "Ineffective"   # (b) useless, with futility
    noisy = _cell(1.0)                                                       # (d) reference too noisy to tell
    assert sum(admissible(p.rel_lb, p.gain_fresh_lb, p.k, p.n) for p in noisy) < 4
    for e in ("good", "random", "harmful"):
        assert pool_cell(noisy, e)["verdict"] == "Inconclusive"
    assert pool_cell(pts[:4] + [None], "good")["verdict"] == "Effective"     # a missing seed: 4/5 = 80%
    assert pool_cell(pts[:3] + [None, None], "good")["verdict"] == "Inconclusive"


# ---------- calibration ----------
def test_calibration_fast():
    c = calibrate(Domain(1, ("test", "calibration")), n_pools=2, seeds=40, sigma_v=0.7)
    print(f"fast calibration ({c['points']} points): cover Rel {c['cover_rel']:.3f}, gain {c['cover_gain']:.3f}")
    assert c["cover_rel"] >= 0.88 and c["cover_gain"] >= 0.88      # 80 points: 3 binomial SE below 95%

@pytest.mark.slow
def test_calibration_500():
    c = calibrate(Domain(2, ("test", "calibration")), n_pools=10, seeds=50, sigma_v=0.7)
    print(f"calibration ({c['points']} points): cover Rel {c['cover_rel']:.3f}, gain {c['cover_gain']:.3f}")
    assert c["points"] >= 500 and c["cover_rel"] >= 0.93 and c["cover_gain"] >= 0.93
