"""Fixtures of the measurer tests: one local RPC farm for the whole session (a tracker and two
servers start in about four seconds; tests/measure/test_rpc.py and the measurer contract share
it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.rpcfarm import LOOPBACK_KEY, LocalRpcFarm


@pytest.fixture(scope="session")
def rpc_farm() -> Iterator[LocalRpcFarm]:
    """A tracker and two RPC servers of key `LOOPBACK_KEY`, one thread each. A test that
    kills a server adds one back when it needs two."""
    with LocalRpcFarm(LOOPBACK_KEY, servers=2, num_threads=1) as farm:
        yield farm
