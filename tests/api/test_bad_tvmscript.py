"""Catalogue of hostile TVMScript submissions (op "tir"), through the real app: each is a 422
application/problem+json with code invalid_spec, writes no job, and leaves no side effect.

The hidden payload would create `{mark}` (in a world-writable directory, so a payload that ran in
the unprivileged parse child could create it too). POSTs go to /v1/jobs with a user token; GETs
to /v1/best?workload=<spec as JSON> with a worker token (a worker reads /v1/best as well)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import SUBMIT, bearer
from tests.kernels import SLOT_BASE as BASE
from tests.kernels import hidden as hide
from tests.kernels import payload

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
PROBLEM = "application/problem+json"


def hidden(char: str, where: str = "comment") -> str:
    """A valid function with the payload hidden after `char` (in a comment or a string); its
    marker path is filled in by the test."""
    return hide(char, where, "{mark}")


def body(text: str) -> dict[str, Any]:
    return {**SUBMIT, "workload": {"op": "tir", "tvmscript": text}}


# (id, request, expected_status, expected_code); a request is {"method", "tvmscript"} and
# optionally "spec" (the whole workload instead of {"op": "tir", "tvmscript": ...})
CASES: list[tuple[str, dict[str, Any], int, str]] = [
    *[(f"post-comment-{name}", {"method": "POST", "tvmscript": hidden(c)}, 422, "invalid_spec")
      for name, c in (("vertical-tab", "\v"), ("form-feed", "\f"), ("file-sep", "\x1c"),
                      ("group-sep", "\x1d"), ("record-sep", "\x1e"), ("next-line", "\x85"),
                      ("line-sep", "\u2028"), ("paragraph-sep", "\u2029"), ("lf", "\n"),
                      ("cr", "\r"), ("crlf", "\r\n"))],
    ("post-string-line-sep", {"method": "POST", "tvmscript": hidden("\u2028", "string")}, 422,
     "invalid_spec"),
    ("post-string-crlf", {"method": "POST", "tvmscript": hidden("\r\n", "string")}, 422,
     "invalid_spec"),
    ("post-nul", {"method": "POST", "tvmscript": BASE.format(slot="T.evaluate(0)\x00")}, 422,
     "invalid_spec"),
    ("post-bidi-override", {"method": "POST", "tvmscript": BASE.format(
        slot="T.evaluate(0)  # \u202e)0(etaulave.T")}, 422, "invalid_spec"),
    ("post-dunder-import",
     {"method": "POST", "tvmscript": BASE.format(slot=payload("{mark}"))}, 422, "invalid_spec"),
    # a data-dependent index is clamped (or proven in range, as `% 16` is): a loop bound read
    # from a buffer is refused, and so is an index the analyser cannot bound
    ("post-data-dependent-loop", {"method": "POST", "tvmscript": BASE.replace(
        "for i in range(16):", "for i in range(T.Cast(\"int32\", A[0])):").format(
        slot="T.evaluate(0)")}, 422, "invalid_spec"),
    ("post-unproven-index", {"method": "POST", "tvmscript": BASE.replace(
        "B[i] = A[i]", "B[T.bitwise_xor(i, 1024)] = A[i]").format(slot="T.evaluate(0)")},
     422, "invalid_spec"),
    ("post-vectorized-1024", {"method": "POST", "tvmscript": BASE.replace(
        "range(16)", "T.vectorized(1024)").replace("(16,)", "(1024,)").format(
        slot="T.evaluate(0)")}, 422, "invalid_spec"),
    ("post-unroll-4096", {"method": "POST", "tvmscript": BASE.replace(
        "range(16)", "T.unroll(4096)").replace("(16,)", "(4096,)").format(
        slot="T.evaluate(0)")}, 422, "invalid_spec"),
    ("post-total-allocation", {"method": "POST", "tvmscript": BASE.format(
        slot='X = T.alloc_buffer((40000000,), "float32")\n    '
             'Y = T.alloc_buffer((40000000,), "float32")')}, 422, "invalid_spec"),
    ("post-tvmscript-not-a-string", {"method": "POST", "spec": {"op": "tir", "tvmscript": 7}},
     422, "invalid_spec"),
    ("post-parser-error", {"method": "POST", "tvmscript": BASE.replace(
        "T.float32(2)", "T.float32(2, 3, 4)").format(slot="T.evaluate(0)")}, 422,
     "invalid_spec"),
    *[(f"best-comment-{name}", {"method": "GET", "tvmscript": hidden(c)}, 422, "invalid_spec")
      for name, c in (("vertical-tab", "\v"), ("next-line", "\x85"), ("line-sep", "\u2028"),
                      ("cr", "\r"))],
]


def _jobs(ctx: Any) -> list[str]:
    from sqlalchemy import select

    from tuner.db import tables as m

    with ctx.store.session() as s:
        return sorted(s.execute(select(m.Job.id)).scalars())


@pytest.mark.parametrize("case, request_, status, code", CASES, ids=[c[0] for c in CASES])
def test_bad_tvmscript(client: Any, ctx: Any, tokens: dict[str, str], mark: Path, case: str,
                       request_: dict[str, Any], status: int, code: str) -> None:
    spec = request_.get("spec") or {
        "op": "tir", "tvmscript": request_["tvmscript"].replace("{mark}", str(mark))}
    before = _jobs(ctx)
    if request_["method"] == "POST":
        resp = client.post("/v1/jobs", json={**SUBMIT, "workload": spec},
                           headers=bearer(tokens["user"]))
    else:
        # a user's query (a worker's is refused before any vetting: test_parse_budget.py)
        resp = client.get("/v1/best", params={"workload": json.dumps(spec)},
                          headers=bearer(tokens["user"]))
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == PROBLEM
    problem = resp.json()
    assert problem["code"] == code and problem["status"] == status and problem["detail"]
    assert not mark.exists()
    assert _jobs(ctx) == before


def test_the_api_parses_tvmscript_only_in_a_child(client: Any, tokens: dict[str, str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The API process never runs TVM's TVMScript parser: with it refusing in this process, a
    valid tir job is still accepted (parsed in the child) and /v1/best answers it."""
    from tuner.core import tvm_api
    from tuner.workloads import isolate

    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("TVMScript parsed in the API process")

    isolate.clear_cache()
    monkeypatch.setattr(tvm_api.tvm.script, "from_source", refuse)
    monkeypatch.setattr(tvm_api, "prim_func_from_tvmscript", refuse)
    spec = {"op": "tir", "tvmscript": BASE.format(slot="T.evaluate(0)  # ünïcode → fine")}
    resp = client.post("/v1/jobs", json={**SUBMIT, "workload": spec},
                       headers=bearer(tokens["user"]))
    assert resp.status_code == 202, resp.text
    best = client.get("/v1/best", params={"workload": json.dumps(spec)},
                      headers=bearer(tokens["worker"]))
    assert best.status_code == 404 and best.json()["code"] == "not_found", best.text
