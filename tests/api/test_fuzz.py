"""A Schemathesis fuzz run of the whole API, generated from its own OpenAPI document.

The app runs in process (ASGI) on the real PostgreSQL and Redis of the fixtures. Every operation
is called with requests that fit its schema (positive) and with requests that do not (negative),
as an admin, a user and a worker (so authorization paths run too): once with generated path ids
(mostly unknown: 404s) and once with the ids of a real job and a real worker (so bodies and
queries reach the handlers behind the lookups). Checks: no answer is a server error (>= 500),
every 4xx is an RFC 9457 problem (`application/problem+json` with `code`, `status`, `detail`),
and the answers conform to the document: every status and content type declared, bodies and
headers as their schemas say, negative requests refused, positive ones accepted (but for the
refusals JSON Schema cannot express: SEMANTIC).

Reproducible (derandomized Hypothesis, no example database, no shrinking) and bounded: at least
MIN_CASES cases, about half a minute on two cores, BUDGET_S at most.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from api.errors import STATUS
from tests.api.conftest import SUBMIT

pytestmark = [pytest.mark.parametrize("db_url", ["postgresql"], indirect=True),
              pytest.mark.timeout(300)]

MIN_CASES = 1000
EXAMPLES = 8  # per operation, generation mode, caller and ids (trivial operations run fewer)
# wall clock of the fuzzing itself; the test fails when it runs out. 15 examples took 49 s on a
# Zen 4 in the whole suite and ran out of 110 s on a Zen 3 (after 3,150 cases); 8 take half
BUDGET_S = 150.0
# never run: revoking tokens could revoke the fuzzer's own
SKIP = {("DELETE", "/v1/tokens/{token_id}")}
# never with a real id: a real worker's lease waits up to 10 s for work that never comes
UNPINNED = {("POST", "/v1/workers/{worker_id}/lease")}
PROBLEM_FIELDS = {"type", "title", "status", "detail", "code"}


# What JSON Schema cannot say: an op's shape rules, TVMScript's vetting, a target TVM refuses,
# whether a cursor or event id is one this API handed out. A schema-valid request may be refused
# with these codes only; any other refusal (`validation_error`, `malformed_json`, ...) means the
# document is looser than the validators, and fails the run.
SEMANTIC = {"invalid_spec", "invalid_target", "bad_cursor", "bad_event_id",
            "idempotency_conflict", "implausible_latency"}


def positive_data_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """Schemathesis' positive_data_acceptance, except for the refusals named in SEMANTIC."""
    from schemathesis.checks import positive_data_acceptance

    if response.status_code in (400, 422):
        try:
            code = json.loads(response.content).get("code")
        except (ValueError, AttributeError):
            code = None
        if code in SEMANTIC:
            return None
    return positive_data_acceptance(ctx, response, case)  # type: ignore[no-any-return]


def _conformance() -> list[Any]:
    from schemathesis import checks as c

    return [c.not_a_server_error, c.status_code_conformance, c.content_type_conformance,
            c.response_schema_conformance, c.response_headers_conformance,
            c.negative_data_rejection, positive_data_accepted]


CONFORMANCE = _conformance()


def problem_json(ctx: Any, response: Any, case: Any) -> bool | None:
    """A Schemathesis check: every 4xx answer is an RFC 9457 problem with a stable code."""
    if not 400 <= response.status_code < 500:
        return None
    ctype = (response.headers.get("content-type") or [""])[0]
    assert ctype == "application/problem+json", (
        f"{response.status_code} answered as {ctype!r}: {response.content[:200]!r}")
    body = json.loads(response.content)
    missing = PROBLEM_FIELDS - set(body)
    assert not missing, f"a {response.status_code} problem without {sorted(missing)}: {body}"
    assert body["status"] == response.status_code, body
    assert isinstance(body["code"], str) and body["code"] and body["detail"], body
    assert body["code"] in STATUS, f"{body['code']!r} is not a code of api.errors.STATUS"
    return True


@dataclass
class Tally:
    cases: Counter[str] = field(default_factory=Counter)  # by operation
    statuses: Counter[int] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)  # of the problems answered
    failures: list[str] = field(default_factory=list)

    def count(self, op: Any, response: Any) -> None:
        self.cases[op.label] += 1
        self.statuses[response.status_code] += 1
        if response.status_code >= 400:
            try:
                self.codes[str(json.loads(response.content).get("code"))] += 1
            except (ValueError, AttributeError):
                self.codes["(not a problem)"] += 1


@pytest.fixture
def fuzz_app(api_settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """(schema, app): the API with its lifespan run by Schemathesis' ASGI client (on the event
    loop its requests use), rate limits out of the fuzzer's way (its negative cases send no
    token: refused tokens per address are limited too); stopped afterwards."""
    import schemathesis
    from schemathesis.python import asgi

    from api import deps
    from api.app import create_app

    monkeypatch.setattr(deps, "AUTH_FAILURES_PER_S", 1e6, raising=False)
    monkeypatch.setattr(deps, "AUTH_FAILURES_BURST", 1_000_000, raising=False)
    settings = api_settings.model_copy(update={"rate_per_s": 1e6, "rate_burst": 1_000_000})
    app = create_app(settings)
    schema = schemathesis.openapi.from_asgi("/v1/openapi.json", app)  # starts the lifespan
    try:
        yield schema, app
    finally:
        asgi.shutdown_lifespans()


def _real_ids(schema: Any, callers: dict[str, dict[str, str]]) -> dict[str, str]:
    """A cancelled job of the fuzz user (its event stream ends at once) and a worker of the
    fuzz admin: the path ids the pinned runs use."""
    job = schema["/v1/jobs"]["POST"].Case(body=SUBMIT).call(headers=callers["user"])
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    cancel = schema["/v1/jobs/{job_id}/cancel"]["POST"].Case(path_parameters={"job_id": job_id})
    assert cancel.call(headers=callers["user"]).status_code == 202
    worker = schema["/v1/workers"]["POST"].Case(body={
        "name": "fuzz-worker", "device_key": "local", "target": {"kind": "llvm"}})
    registered = worker.call(headers=callers["worker"])
    assert registered.status_code == 201, registered.text
    return {"job_id": job_id, "worker_id": registered.json()["id"]}


def _fuzz(op: Any, mode: Any, headers: dict[str, str], path: dict[str, str] | None,
          tally: Tally) -> None:
    """EXAMPLES generated cases of one operation (Hypothesis raises the first failure)."""
    from hypothesis import HealthCheck, Phase, given, settings

    @given(case=op.as_strategy(generation_mode=mode, path_parameters=path))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    def fuzz(case: Any) -> None:
        response = case.call(headers=headers)
        tally.count(op, response)
        case.validate_response(response, checks=[*CONFORMANCE, problem_json])

    fuzz()


def _runs(op: Any, ids: dict[str, str]) -> list[dict[str, str] | None]:
    """Path parameters of each run of `op`: generated (None), and the real ids if it has any."""
    names = re.findall(r"{(\w+)}", op.path)
    if not names or (op.method.upper(), op.path) in UNPINNED or not set(names) <= set(ids):
        return [None]
    return [None, {name: ids[name] for name in names}]


def test_fuzz_the_api(fuzz_app: tuple[Any, Any]) -> None:
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    from tuner.db.tokens import create_token

    schema, app = fuzz_app
    store = app.state.ctx.store
    # the fuzzer's own tokens and ids: nothing it does touches another test's
    callers = {who: {"Authorization": f"Bearer {create_token(store, who, name=f'fuzz-{who}')}"}
               for who in ("admin", "user", "worker")}
    ids = _real_ids(schema, callers)
    ops = [r.ok() for r in schema.get_all_operations()]
    tally = Tally()
    start = time.monotonic()
    for op in (op for op in ops if (op.method.upper(), op.path) not in SKIP):
        for path in _runs(op, ids):
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                for who, headers in callers.items():
                    assert time.monotonic() - start < BUDGET_S, (
                        f"the fuzz run is over its {BUDGET_S:.0f} s budget after "
                        f"{sum(tally.cases.values())} cases ({op.label})")
                    try:
                        _fuzz(op, mode, headers, path, tally)
                    except Unsatisfiable:  # nothing to get wrong (no parameters, no body)
                        assert mode is GenerationMode.NEGATIVE, op.label
                    except (Exception, BaseExceptionGroup) as exc:  # all, not the first
                        ids_ = "real ids" if path else "generated ids"
                        tally.failures.append(f"{op.label} ({mode.value}, as {who}, {ids_}): "
                                              f"{exc}")
    total = sum(tally.cases.values())
    print(f"\nfuzz: {total} cases over {len(tally.cases)} operations in "
          f"{time.monotonic() - start:.1f} s; statuses {dict(sorted(tally.statuses.items()))}; "
          f"problems {dict(tally.codes.most_common())}")
    assert not tally.failures, "\n\n".join(tally.failures)
    assert total >= MIN_CASES, tally.cases
    assert tally.codes["rate_limited"] == 0, "a rate limit kept cases from the handlers"


# a stateful run follows the links Schemathesis infers between operations (a job submitted, then
# read, its records paged, cancelled; a worker registered, then heartbeats and results); never
# the calls that wait (a lease, the event stream of a job that may still be queued) nor a revoke
STATEFUL_EXCLUDED = ("/v1/workers/{worker_id}/lease", "/v1/jobs/{job_id}/events",
                     "/v1/tokens/{token_id}")
STATEFUL_BUDGET_S = 90.0


def test_stateful_workflows_conform(fuzz_app: tuple[Any, Any]) -> None:
    """Sequences of calls, each answer feeding the next (ids from bodies), as each kind of
    caller; every answer checked for conformance like the single-call run."""
    from hypothesis import HealthCheck, settings

    from tuner.db.tokens import create_token

    schema, app = fuzz_app
    store = app.state.ctx.store
    callers = {who: {"Authorization": f"Bearer {create_token(store, who, name=f'flow-{who}')}"}
               for who in ("user", "worker", "admin")}
    workflow = schema.exclude(path=list(STATEFUL_EXCLUDED)).as_state_machine()
    steps: Counter[str] = Counter()
    failures: list[str] = []
    start = time.monotonic()
    for who, headers in callers.items():

        class Flow(workflow):  # type: ignore[misc, valid-type]
            caller = headers

            def get_call_kwargs(self, case: Any) -> dict[str, Any]:
                return {"headers": self.caller}

            def validate_response(self, response: Any, case: Any, additional_checks: Any = None,
                                  **kwargs: Any) -> None:
                steps[f"{case.operation.label} -> {response.status_code}"] += 1
                assert time.monotonic() - start < STATEFUL_BUDGET_S, "over the stateful budget"
                case.validate_response(response, checks=[*CONFORMANCE, problem_json])

        try:
            Flow.run(settings=settings(max_examples=12, stateful_step_count=6, deadline=None,
                                       derandomize=True, database=None,
                                       suppress_health_check=list(HealthCheck)))
        except (Exception, BaseExceptionGroup) as exc:
            failures.append(f"as {who}: {exc}")
    total = sum(steps.values())
    print(f"\nstateful: {total} calls in {time.monotonic() - start:.1f} s; "
          f"{dict(steps.most_common(12))}")
    assert not failures, "\n\n".join(failures)
    # ids flowed from one answer into the next call's path
    assert total >= 100 and any("{" in s for s in steps), steps
