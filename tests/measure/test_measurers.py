"""The measurer contract (tests/support/measurer_contract.py) over every measurer: local (a
sandbox process here), rpc (boards behind a local RPC tracker) and remote (the farm: Redis, SQL
and a worker thread measuring with a real LocalMeasurer). Real builds, real kernels."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.measurer_contract import KINDS, Backend, MeasurerContract, supply

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", params=KINDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """One measurer per kind for the whole module (scenarios run grouped by kind)."""
    with supply(request.param, request) as b:
        yield b


class TestMeasurer(MeasurerContract):
    pass
