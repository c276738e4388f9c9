"""Knob importance (`tuner.core.importance`): ω² of a one-way analysis of variance over log
latency, checked on cases with a known answer and by properties over random data."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.core.importance import knob_importance, omega_squared


def test_a_knob_that_sets_the_latency_explains_it_all_and_a_constant_one_nothing() -> None:
    values = [1, 1, 2, 2, 4, 4, 8, 8]
    lat = [1e-3 * v for v in values]
    assert omega_squared(values, lat) == pytest.approx(1.0, abs=1e-6)
    assert omega_squared([7] * 8, lat) == 0.0
    # a tile knob (a list of factors) groups by the whole tile
    assert omega_squared([[2, v] for v in values], lat) == pytest.approx(1.0, abs=1e-6)


def test_noise_is_explained_by_chance_only() -> None:
    rng = random.Random(7)
    lat = [math.exp(rng.gauss(0, 1)) for _ in range(400)]
    noise = [rng.choice("abcd") for _ in lat]
    w2 = omega_squared(noise, lat)
    assert w2 is not None and w2 < 0.03  # η² would be ~0.0075 above zero by chance alone


def test_half_the_variance_is_half() -> None:
    # log latency = a + b with a and b independent, equal variance: each explains half
    lat, a_col, b_col = [], [], []
    for a in (0.0, 1.0):
        for b in (0.0, 1.0):
            for _ in range(25):
                lat.append(math.exp(a + b))
                a_col.append(a)
                b_col.append(b)
    assert omega_squared(a_col, lat) == pytest.approx(0.5, abs=0.02)
    assert omega_squared(b_col, lat) == pytest.approx(0.5, abs=0.02)


def test_what_cannot_be_estimated_is_none() -> None:
    assert omega_squared([1, 2, 3], [1.0, 2.0, 3.0]) is None  # too few
    assert omega_squared([1, 2, 3, 4, 5], [1.0, 2.0, 3.0, 4.0, 5.0]) is None  # a value each


def test_importance_uses_the_valid_measurements_that_name_the_knob() -> None:
    knobs = {"mr": [2, 2, 4, 4, 8, 8, None, 2], "nv": [1, 1, 1, 1, 1, 1, 1, 1]}
    lat = [2e-3, 2e-3, 4e-3, 4e-3, 8e-3, 8e-3, 1e-3, None]
    ok = [True, True, True, True, True, True, True, False]
    imp = knob_importance(knobs, lat, ok)
    assert imp["mr"] == pytest.approx(1.0, abs=1e-6) and imp["nv"] == 0.0


@given(st.lists(st.tuples(st.integers(0, 5), st.floats(1e-6, 1.0)), min_size=0, max_size=60),
       st.floats(1e-3, 1e3))
def test_properties(pairs: list[tuple[int, float]], scale: float) -> None:
    values = [v for v, _ in pairs]
    lat = [t for _, t in pairs]
    w2 = omega_squared(values, lat)
    assert w2 is None or 0.0 <= w2 <= 1.0
    # the unit of latency does not matter (log latency: a factor is an offset)
    scaled = omega_squared(values, [t * scale for t in lat])
    assert (w2 is None) == (scaled is None)
    if w2 is not None and scaled is not None:
        assert scaled == pytest.approx(w2, abs=1e-6)
    # nor the order of the measurements
    assert omega_squared(values[::-1], lat[::-1]) == (
        pytest.approx(w2, abs=1e-9) if w2 is not None else None)
