"""bench/placements.py's copies: each starts at the asked offset of a page, with equal values."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bench.placements import PAGE, STEP, offsets, placed


@pytest.mark.parametrize("offset", [0, 64, 1408, PAGE - STEP])
@pytest.mark.parametrize("dtype", ["float32", "int8", "int64"])
def test_a_placed_copy_starts_at_its_offset_with_the_same_values(offset: int, dtype: str) -> None:
    value = (np.arange(3 * 1026) % 251).astype(dtype).reshape(3, 1026)
    copy = placed(value, offset)
    assert copy.ctypes.data % PAGE == offset
    assert copy.dtype == value.dtype and copy.shape == value.shape
    np.testing.assert_array_equal(copy, value)
    copy[0, 0] = 7  # a copy: the source stays as it was
    assert value[0, 0] == 0


def test_offsets_are_cache_line_steps_within_a_page() -> None:
    got = offsets(random.Random(0), 1000)
    assert all(0 <= o < PAGE and o % STEP == 0 for o in got)
    assert len(set(got)) > 32  # spread over the page, not one place
