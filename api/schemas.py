"""Request (…Create) and response (…Public) bodies of the REST API.

Responses are built by `tuner.db` helpers (`job_dict`, `record_dict`, `WorkerRow.to_dict`) and
described here for the OpenAPI document; requests are validated here before any work is done.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DEVICE_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
DeviceKey = Field(default="local", pattern=DEVICE_KEY_PATTERN,
                  description="Board class whose workers measure this (a Redis stream per key).")


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
    model_config = ConfigDict(extra="forbid")

    workload: dict[str, Any] = Field(
        description='Workload spec as tuner.workloads.parse_spec takes it, e.g. '
                    '{"op": "matmul", "shape": [128, 128, 128]} or {"op": "tir", "tvmscript": "..."}',
        examples=[{"op": "matmul", "shape": [128, 128, 128]}])
    target: str | dict[str, Any] = Field(
        default="host", description='"host" (the API machine\'s CPU) or a TVM target dict.')
    device_key: str = DeviceKey
    trials: int = Field(default=64, ge=1, le=100_000)
    wall_budget_s: float | None = Field(default=None, gt=0)
    space: str = Field(default="default", min_length=1, max_length=64)
    batch_size: int | None = Field(default=None, ge=1, le=4096)
    seed: int | None = Field(default=None, ge=0)
    early_stop: int | None = Field(default=None, ge=1)


class BestSoFar(BaseModel):
    trial_id: str
    latency_s: float | None
    gflops: float | None


class JobPublic(BaseModel):
    id: str
    state: str
    workload_key: str
    workload: dict[str, Any]
    target: dict[str, Any]
    device_key: str
    space: str
    trials: int
    trials_done: int
    wall_budget_s: float | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    best: BestSoFar | None = None
    error: str | None = None
    created_at: str
    updated_at: str
    started_at: str | None = None
    finished_at: str | None = None


class JobPage(BaseModel):
    items: list[JobPublic]
    next_cursor: str | None


class RecordPublic(BaseModel):
    model_config = ConfigDict(extra="allow")

    trial_id: str
    job_id: str | None
    workload_key: str
    target: dict[str, Any] | None
    device_key: str | None
    space: str
    invalidity: str
    error_msg: str | None
    latency_s: float | None
    latencies_s: list[float]
    cv: float | None
    gflops: float | None
    decisions: list[Any]
    trace: Any
    worker: str | None
    build_s: float | None
    tvm_version: str
    measured_at: str


class RecordPage(BaseModel):
    items: list[RecordPublic]
    next_cursor: str | None


class BestPublic(RecordPublic):
    workload: dict[str, Any]
    schedule_python: str


# --- workers -------------------------------------------------------------------------------


class WorkerCreate(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    device_key: str = DeviceKey
    target: dict[str, Any] = Field(description="The worker's TVM target dict (kind, mcpu, ...).")
    capabilities: dict[str, Any] = Field(default_factory=dict)
    tvm_version: str = Field(default="", max_length=64)
    hostname: str = Field(default="", max_length=255)


class WorkerRegistered(BaseModel):
    id: str
    lease_s: float
    heartbeat_s: float
    max_deliveries: int
    redis_prefix: str
    queue_wait_s: float


class Heartbeat(BaseModel):
    state: Literal["idle", "busy", "draining", "quarantined", "offline"] = "idle"
    measured: int = Field(default=0, ge=0)
    failures: int = Field(default=0, ge=0)
    infra_failures: int = Field(default=0, ge=0)


class WorkerPublic(BaseModel):
    id: str
    name: str
    device_key: str
    target: dict[str, Any]
    capabilities: dict[str, Any]
    tvm_version: str
    hostname: str
    state: str
    measured: int
    failures: int
    infra_failures: int
    registered_at: str
    last_seen_at: str


class ResultCreate(BaseModel):
    input: dict[str, Any] = Field(description="tuner.measure.MeasureInput as a dict (with context).")
    result: dict[str, Any] = Field(description="tuner.measure.MeasureResult as a dict.")


class ResultPublic(BaseModel):
    trial_id: str
    inserted: bool


# --- health --------------------------------------------------------------------------------


class Health(BaseModel):
    status: str
    checks: dict[str, str] | None = None
