"""Request (…Create) and response (…Public) bodies of the REST API.

Requests are validated here before any work is done. The resources' public models (`JobPublic`,
`RecordPublic`, `BestPublic`, `WorkerPublic`) are defined once in `tuner.db.views`, built from
the stored rows (`JobPublic.from_row`, ...) and shared with the CLI's JSON output; they are
re-exported here, beside the API's own envelopes (pages, problems, acknowledgements), for the
routes and the OpenAPI document.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from tuner.db.views import (
    BestPublic,
    BestSoFar,
    JobPublic,
    ModelPublic,
    ModelTaskPublic,
    RecordPublic,
    WorkerPublic,
)

__all__ = [
    "DEVICE_KEY_PATTERN",
    "OP",
    "BestPublic",
    "BestSoFar",
    "DeviceKey",
    "Health",
    "Heartbeat",
    "JobCreate",
    "JobPage",
    "JobPoints",
    "JobPublic",
    "JsonInt",
    "ModelCreate",
    "ModelPage",
    "ModelPublic",
    "ModelTaskCreate",
    "ModelTaskPublic",
    "Problem",
    "RecordPage",
    "RecordPublic",
    "ResultCreate",
    "ResultPublic",
    "Whoami",
    "WorkerCreate",
    "WorkerPublic",
    "WorkerRegistered",
    "WorkloadBest",
]

DEVICE_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
DeviceKey = Field(default="local", pattern=DEVICE_KEY_PATTERN,
                  description="Board class whose workers measure this (a Redis stream per key).")
INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1  # counters stored in SQL INTEGER columns
MAX_JSON_DEPTH = 32  # nesting of a JSON object field (a spec, a target, capabilities)
NO_NUL = r"^[^\x00]*$"  # SQL text columns cannot hold NUL characters

# Request models are strict: JSON types are not coerced ("10" and true are not integers), floats
# are finite, integers bounded, and unknown fields refused (each a 422 naming the field).
STRICT = ConfigDict(extra="forbid", strict=True)


def integral(value: object) -> object:
    """10.0 is the integer 10 in JSON (and in JSON Schema's "integer"); 10.5 stays a float."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# an integer field of a strict request model: an integer or an integral float, never a string
# or a bool
JsonInt = Annotated[int, BeforeValidator(integral)]
# optional ones carry their bounds inside (outside, pydantic's schema of `X | None` loses them)
BatchSize = Annotated[int, Field(ge=1, le=4096), BeforeValidator(integral)]
Seed = Annotated[int, Field(ge=0, le=INT64_MAX), BeforeValidator(integral)]
EarlyStop = Annotated[int, Field(ge=1, le=100_000), BeforeValidator(integral)]


def _plain_json(value: dict[str, Any]) -> dict[str, Any]:
    """`value` if it nests at most MAX_JSON_DEPTH deep and holds only finite numbers."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("numbers must be finite (no NaN or Infinity)")
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_plain_json)]


class Problem(BaseModel):
    """RFC 9457 problem details (media type application/problem+json)."""

    type: str
    title: str
    status: int
    detail: str
    code: str = Field(description="Stable machine-readable error code.")
    instance: str | None = None
    field: str | None = None
    errors: list[dict[str, Any]] | None = None


# --- jobs ----------------------------------------------------------------------------------


class JobCreate(BaseModel):
    model_config = STRICT

    workload: JsonObject = Field(
        description='Workload spec as tuner.workloads.parse_spec takes it, e.g. '
                    '{"op": "matmul", "shape": [128, 128, 128]} or '
                    '{"op": "tir", "tvmscript": "..."}',
        examples=[{"op": "matmul", "shape": [128, 128, 128]}])
    target: Annotated[str, Field(max_length=4096, pattern=NO_NUL)] | JsonObject = Field(
        default="host", description='"host" (the API machine\'s CPU) or a TVM target dict.')
    device_key: str = DeviceKey
    trials: JsonInt = Field(default=64, ge=1, le=100_000)
    wall_budget_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    space: str = Field(default="default", min_length=1, max_length=64, pattern=NO_NUL)
    batch_size: BatchSize | None = None
    seed: Seed | None = None
    early_stop: EarlyStop | None = None


class JobPage(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None


class RecordPage(BaseModel):
    items: list[RecordPublic]
    next_cursor: str | None


OP = r"^[a-z][a-z0-9_]{0,31}$"  # a workload op name, as `Workload.op` stores it


class JobPoints(BaseModel):
    """A job's measurements as columns (index i of each list is the i-th record stored)."""

    flops: int = Field(description="Floating-point operations of one run of the workload (0: "
                                   "unknown, so no GFLOPS).")
    nbytes: int = Field(default=0, description="Bytes of the workload's parameters: the least a "
                                               "run moves (0: unknown, so no GB/s).")
    memory_bound: bool = Field(default=False, description=(
        "Under the board's balance (flop per byte): chart GB/s against the memory roof."))
    trial_id: list[str]
    latency_s: list[float | None]
    gflops: list[float | None]
    invalidity: list[str]
    worker: list[str | None]
    worker_name: list[str | None] = Field(description=(
        "The name the worker registered with (`tunefarm worker --name`), where `worker` is a "
        "registered worker's id; null for a board an RPC worker named itself."))
    build_s: list[float | None]
    predicted_s: list[float | None]
    measured_at: list[str]
    knobs: dict[str, list[Any]] = Field(default_factory=dict, description=(
        "One list per knob, named as `GET /v1/spaces` names the space's knobs (positionally, "
        "\"tile 0\", for the generated space): the value each record's candidate took, null "
        "where a record names no such knob (records measured before knobs were named)."))
    knob_importance: dict[str, float | None] = Field(default_factory=dict, description=(
        "Each knob's ω² over the valid records: the share of the variance of log latency its "
        "value alone explains (one-way ANOVA's effect size; interactions not separated); null "
        "where too few records or as many values as records."))


class WorkloadBest(BaseModel):
    """The best valid record of a workload on a target, and how far the search came from the
    first valid candidate measured there (`speedup` = first_s / best_s)."""

    workload_key: str
    op: str
    description: str
    target: dict[str, Any]
    device_key: str
    records: int
    valid: int
    best_s: float
    best_gflops: float | None
    best_trial_id: str
    first_s: float
    speedup: float
    last_measured_at: str
    task_names: list[str] = Field(
        default_factory=list, description="The names of the model tasks with this PrimFunc in "
        "the caller's own model jobs (every owner's for an admin; none for a worker), first "
        "few in name order.")


class Whoami(BaseModel):
    """The calling token, as the dashboard shows it, and what the farm knows of its boards."""

    name: str
    scope: str
    owner: str
    device_key: str | None = Field(description="The device key a worker token is bound to.")
    peak_gflops: dict[str, float] = Field(
        description="The fp32 peak of each device key whose operator declared one "
                    "(TUNEFARM_PEAK_GFLOPS), for '% of peak'.")
    peak_gbps: dict[str, float] = Field(default_factory=dict, description=(
        "The memory read bandwidth of each device key whose operator declared one "
        "(TUNEFARM_PEAK_GBPS), the roof of memory-bound jobs."))


# --- model jobs ----------------------------------------------------------------------------

TASK_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
MAX_MODEL_TASKS = 256


class ModelTaskCreate(BaseModel):
    model_config = STRICT

    name: str = Field(pattern=TASK_NAME, description="The PrimFunc's name in the model.")
    weight: JsonInt = Field(default=1, ge=1, le=1_000_000,
                        description="Calls per run of the model (the task scheduler's weight).")
    tvmscript: str = Field(min_length=1, pattern=NO_NUL,
                           description="The PrimFunc as TVMScript, vetted like a `tir` workload.")


class ModelCreate(BaseModel):
    """A model's tasks, extracted on the client (`tunefarm tune-model --api`): the service never
    loads a model file, only the PrimFuncs the build will look up."""

    model_config = STRICT

    name: str = Field(default="model", min_length=1, max_length=128, pattern=NO_NUL)
    tasks: list[ModelTaskCreate] = Field(min_length=1, max_length=MAX_MODEL_TASKS)
    target: Annotated[str, Field(max_length=4096, pattern=NO_NUL)] | JsonObject = Field(
        default="host", description='"host" (the API machine\'s CPU) or a TVM target dict.')
    device_key: str = DeviceKey
    trials: JsonInt = Field(default=256, ge=1, le=1_000_000, description="For the whole model.")
    round_trials: JsonInt = Field(default=16, ge=1, le=100_000,
                              description="Trials one task gets per round.")
    wall_budget_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    space: str = Field(default="default", min_length=1, max_length=64, pattern=NO_NUL)
    batch_size: BatchSize | None = None
    seed: Seed | None = None


class ModelPage(BaseModel):
    items: list[ModelPublic]
    next_cursor: str | None = None


# --- workers -------------------------------------------------------------------------------


class WorkerCreate(BaseModel):
    model_config = STRICT

    name: str = Field(min_length=1, max_length=128, pattern=NO_NUL)
    device_key: str = DeviceKey
    target: JsonObject = Field(description="The worker's TVM target dict (kind, mcpu, ...).")
    capabilities: JsonObject = Field(default_factory=dict)
    tvm_version: str = Field(default="", max_length=64, pattern=NO_NUL)
    hostname: str = Field(default="", max_length=255, pattern=NO_NUL)


class WorkerRegistered(BaseModel):
    id: str
    lease_s: float
    heartbeat_s: float
    max_deliveries: int
    queue_wait_s: float


class Heartbeat(BaseModel):
    model_config = STRICT

    state: Literal["idle", "busy", "draining", "quarantined", "offline"] = "idle"
    measured: JsonInt = Field(default=0, ge=0, le=INT32_MAX)
    failures: JsonInt = Field(default=0, ge=0, le=INT32_MAX)
    infra_failures: JsonInt = Field(default=0, ge=0, le=INT32_MAX)


def _dataclass_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of a `tuner.measure` dataclass as its `from_json` reads it: its
    definitions inlined, and no property it does not have."""
    from pydantic import TypeAdapter

    from tuner import measure

    schema = TypeAdapter(getattr(measure, name)).json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: object) -> object:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(dict(defs[ref.removeprefix("#/$defs/")]))
            out = {k: inline(v) for k, v in node.items() if k != "title"}
            if "properties" in out:
                out["additionalProperties"] = False
            return out
        return [inline(v) for v in node] if isinstance(node, list) else node

    return cast("dict[str, Any]", inline(schema))  # a dict inlines to a dict


class ResultCreate(BaseModel):
    """Checked field by field by `api.results` (NaN latencies, forged traces, ...: 422s that
    name the field inside, e.g. `result.latencies_s.0`)."""

    model_config = STRICT

    input: dict[str, Any] = Field(
        description="tuner.measure.MeasureInput as a dict (with context).",
        json_schema_extra=lambda s: s.update(_dataclass_schema("MeasureInput")))
    result: dict[str, Any] = Field(
        description="tuner.measure.MeasureResult as a dict.",
        json_schema_extra=lambda s: s.update(_dataclass_schema("MeasureResult")))


class ResultPublic(BaseModel):
    trial_id: str
    inserted: bool


# --- health --------------------------------------------------------------------------------


class Health(BaseModel):
    status: str
    checks: dict[str, str] | None = None
