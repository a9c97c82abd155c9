"Property tests of the margin certificate (Delta_k > 2e => equal top-k sets): theory.margin."

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stalebook.theory.margin import margin_certificate, min_pair_separation, tightness_example, topk


@st.composite
def instances(draw):
    n = draw(st.integers(2, 12))
    k = draw(st.integers(1, n - 1))
    # integer-valued true scores: ties and exact boundary cases are common
    s = np.array(draw(st.lists(st.integers(-8, 8), min_size=n, max_size=n)), dtype=float)
    amp = draw(st.sampled_from([0.0, 0.05, 0.25, 0.49, 0.5, 1.0, 3.0]))
    u = np.array(draw(st.lists(st.floats(-1, 1), min_size=n, max_size=n)))
    keys = [np.array(draw(st.permutations(list(range(n))))) for _ in range(2)]
    return s, s + amp * u, k, keys


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_certificate(inst):
    s, t, k, (k1, k2) = inst
    c = margin_certificate(s, t, k)
    assert c.e == np.abs(t - s).max()
    assert c.holds == (c.delta_k > 2 * c.e)
    if c.holds:
        T = topk(s, k, k1)
        # equality under any tie-break of either score vector
        for a in (k1, k2):
            for b in (k1, k2):
                assert np.array_equal(topk(s, k, a), topk(t, k, b))
        assert min_pair_separation(t, T) >= c.separation - 1e-12
        assert c.separation > 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=15), st.data())
def test_topk_is_k_largest(s, data):
    s = np.array(s)
    k = data.draw(st.integers(0, len(s)))
    key = np.array(data.draw(st.permutations(list(range(len(s))))))
    T = topk(s, k, key)
    assert len(T) == k and len(set(T.tolist())) == k
    if 0 < k < len(s):
        assert min_pair_separation(s, T) >= 0


def test_tightness():
    s, t, c, a, b = tightness_example()
    assert c.delta_k == 2 * c.e and not c.holds
    assert not np.array_equal(a, b)  # the tie-break decides the set
    assert not np.array_equal(b, topk(s, 1, [0, 1]))  # and one choice is wrong
