"""Targets from outside pass an allowlist (`tuner.core.targets`): a job or a best-schedule query
naming a kind no worker serves, an LLVM command-line option, or a `num-cores` out of range is a
422 `invalid_target` naming the attribute, and nothing is written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.api.conftest import MATMUL, SUBMIT, bearer

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"

LLVM = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}
# (id, target, the attribute the problem names)
CASES: list[tuple[str, Any, str]] = [
    ("llvm-command-line-options", {**LLVM, "cl-opt": ["-time-passes"]}, "target.cl-opt"),
    ("num-cores-too-many", {**LLVM, "num-cores": 100_000}, "target.num-cores"),
    ("num-cores-negative", {**LLVM, "num-cores": -5}, "target.num-cores"),
    ("num-cores-zero", {**LLVM, "num-cores": 0}, "target.num-cores"),
    ("num-cores-a-string", {**LLVM, "num-cores": "2"}, "target.num-cores"),
    ("num-cores-a-bool", {**LLVM, "num-cores": True}, "target.num-cores"),
    ("kind-c", {"kind": "c"}, "target.kind"),
    ("kind-rocm", {"kind": "rocm"}, "target.kind"),
    ("kind-hexagon", {"kind": "hexagon"}, "target.kind"),
    ("no-kind", {"mcpu": "znver3"}, "target.kind"),
    ("link-a-library", {**LLVM, "libs": ["cblas"]}, "target.libs"),
    ("opt-level", {**LLVM, "opt-level": 0}, "target.opt-level"),
    ("mtriple-of-another-arch", {**LLVM, "mtriple": "riscv64-linux-gnu"}, "target.mtriple"),
    ("mtriple-with-options", {"kind": "llvm", "mtriple": "x86_64-linux-gnu -O0"},
     "target.mtriple"),
    ("mattr-not-a-feature", {**LLVM, "mattr": ["-mllvm=-x"]}, "target.mattr"),
    ("mattr-not-a-list", {**LLVM, "mattr": "+avx2"}, "target.mattr"),
    ("mcpu-with-spaces", {**LLVM, "mcpu": "znver3 -O0"}, "target.mcpu"),
    ("a-named-tag", {**LLVM, "tag": "nvidia/a100"}, "target.tag"),
    ("keys-unknown", {**LLVM, "keys": ["cpu", "fpga"]}, "target.keys"),
    ("cuda-bad-arch", {"kind": "cuda", "arch": "sm_90; rm"}, "target.arch"),
    ("cuda-host-not-llvm", {"kind": "cuda", "arch": "sm_90", "host": {"kind": "c"}},
     "target.host"),
    ("cuda-host-with-options", {"kind": "cuda", "arch": "sm_90",
                                "host": {"kind": "llvm", "cl-opt": ["-x"]}},
     "target.host.cl-opt"),
]


def _jobs(ctx: Any) -> int:
    from sqlalchemy import func, select

    from tuner.db import tables as m

    with ctx.store.session() as s:
        return int(s.scalar(select(func.count()).select_from(m.Job)) or 0)


@pytest.mark.parametrize("as_json_text", [False, True], ids=["dict", "json-text"])
@pytest.mark.parametrize("case, target, field", CASES, ids=[c[0] for c in CASES])
def test_a_job_with_a_bad_target_is_refused(client: Any, ctx: Any, tokens: dict[str, str],
                                            case: str, target: Any, field: str,
                                            as_json_text: bool) -> None:
    sent = json.dumps(target) if as_json_text else target
    resp = client.post("/v1/jobs", json={**SUBMIT, "target": sent}, headers=bearer(tokens["user"]))
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body = resp.json()
    assert body["code"] == "invalid_target", body
    assert body["field"] == field, body
    assert _jobs(ctx) == 0


def test_best_with_a_bad_target_is_refused(client: Any, tokens: dict[str, str]) -> None:
    resp = client.get("/v1/best", params={"workload": json.dumps(MATMUL),
                                          "target": json.dumps({**LLVM, "cl-opt": ["-x"]})},
                      headers=bearer(tokens["user"]))
    assert resp.status_code == 422 and resp.json()["field"] == "target.cl-opt", resp.text


def test_targets_on_the_allowlist_are_accepted(client: Any, tokens: dict[str, str]) -> None:
    from tuner.core import tvm_api as tv

    for target in ("host", tv.host_target_dict(num_cores=2),
                   {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
                   {"kind": "cuda", "arch": "sm_80", "max_num_threads": 1024,
                    "thread_warp_size": 32, "host": {"kind": "llvm"}}):
        resp = client.post("/v1/jobs", json={**SUBMIT, "target": target, "trials": 1},
                           headers=bearer(tokens["user"]))
        assert resp.status_code == 202, (target, resp.text)
        # the canonical target it stored (keys added by TVM) is accepted again as it is
        stored = resp.json()["target"]
        again = client.post("/v1/jobs", json={**SUBMIT, "target": stored, "trials": 1},
                            headers=bearer(tokens["user"]))
        assert again.status_code == 202, (stored, again.text)


def test_num_cores_is_bounded_by_the_device_keys_workers(client: Any, ctx: Any,
                                                         tokens: dict[str, str]) -> None:
    """Once workers of a device key registered, a job may ask for at most their cores."""
    from tuner.core import tvm_api as tv

    four = {**tv.host_target_dict(), "num-cores": 4}
    for cores in (2, 4):  # two workers: 2 and 4 cores
        resp = client.post("/v1/workers", headers=bearer(tokens["worker"]), json={
            "name": f"w{cores}", "device_key": "rack", "target": {**four, "num-cores": cores},
            "tvm_version": "test", "hostname": "h"})
        assert resp.status_code == 201, resp.text
    over = client.post("/v1/jobs", headers=bearer(tokens["user"]), json={
        **SUBMIT, "device_key": "rack", "target": {**four, "num-cores": 8}})
    assert over.status_code == 422, over.text
    assert over.json()["field"] == "target.num-cores" and "at most 4" in over.json()["detail"]
    assert _jobs(ctx) == 0
    ok = client.post("/v1/jobs", headers=bearer(tokens["user"]), json={
        **SUBMIT, "device_key": "rack", "target": four})
    assert ok.status_code == 202, ok.text
    elsewhere = client.post("/v1/jobs", headers=bearer(tokens["user"]), json={
        **SUBMIT, "device_key": "no-workers-yet", "target": {**four, "num-cores": 8}})
    assert elsewhere.status_code == 202, elsewhere.text  # no worker says otherwise yet
