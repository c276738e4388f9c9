"""Settings from the environment (prefix `TUNEFARM_`), overridable per call (e.g. `--db`)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("tunefarm", appauthor=False))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNEFARM_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None  # None: sqlite:///<data_dir>/tunefarm.db

    # workload limits (bad specs are rejected before anything is built)
    max_tensor_elements: int = 1 << 26  # per tensor (256 MiB of fp32)
    max_ops: float = 1e13  # FLOP (or int-op) count of one workload
    # loop iterations of one `tir` workload whatever its loops compute (its unscheduled
    # reference runs them all: a loop of no arithmetic counts no FLOP)
    max_iterations: float = 1e11
    # a worker's result is refused when faster than any device: under this many seconds a call,
    # or above this many operations per second (a whole H200 runs about 1e15 dense fp16)
    min_plausible_latency_s: float = 1e-8
    max_plausible_ops_per_s: float = 1e15
    max_tvmscript_bytes: int = 64 * 1024
    max_tvmscript_nodes: int = 20_000

    # measurement protocol
    build_timeout_s: float = 60.0
    run_timeout_s: float = 30.0
    min_repeat_ms: float = 40.0
    repeats: int = 5
    cache_flush: bool = False
    num_threads: int | None = None  # None: the target's num-cores (else this machine's cores)
    # a candidate whose first timed repeat (half as long as the others: a screen) is slower than
    # the job's best times this is timed once only (0: every candidate gets `repeats`)
    prune_factor: float = Field(default=1.2, ge=0.0)
    # ... and one whose faster of its first two repeats is slower than the best times this gets
    # those two only (0: no limit after the second repeat). Both chosen from 9 fused-suite jobs
    # (527 candidates) timed 5 times each: replayed under these limits, 9% fewer repeats than
    # under 1.5 and 1.1, and no job's best changed (tuner.measure.evaluate.time_kernel,
    # bench.racing)
    confirm_factor: float = Field(default=1.05, ge=0.0)
    noise_cv: float = 0.10  # records whose samples vary more than this (stdev/mean) are "noisy"

    # search
    batch_size: int = 16
    seed: int | None = None
    # jobs start from the farm's cost model of their target (tuner.search.farm_model) and, with
    # no records of their own, from related workloads' best schedules (tuner.search.transfer);
    # off: each job learns from its own workload's records only, and no job updates the model
    cost_model_transfer: bool = True

    # service: API, queues, leases (see docs/service.md)
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "tunefarm:"
    api_url: str = "http://127.0.0.1:8000"  # where workers and `tunefarm submit` reach the API
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    token: str | None = None  # bearer token of this client or worker (TUNEFARM_TOKEN)
    lease_s: float = 30.0  # a measurement entry idle this long is handed to another worker
    heartbeat_s: float = 5.0
    max_deliveries: int = 3  # deliveries of one measurement before it is dead-lettered
    queue_wait_s: float = 900.0  # a trial no worker finished by then is a worker_lost failure
    no_worker_timeout_s: float = 600.0  # a job whose device key has no live worker this long fails
    job_lease_s: float = 30.0  # a tuner that stops renewing this long loses its job to another
    # no single worker sets a best: a worker's valid result is served by GET /v1/best only once
    # a second measurement (another live worker of the key when there is one) confirms it, at
    # the slower of the two medians (API: results stored as farm records; tuner: a new best is
    # measured again). Off: a worker's result is served as it was posted
    confirm_best: bool = True
    quarantine_after: int = 3  # infrastructure failures in a row before a worker quarantines itself
    probe_s: float = 10.0  # between health probes of a quarantined worker's board
    # the dashboard's "% of peak": fp32 GFLOPS of a board of each device key, as its operator
    # measured it (bench/peak.c), e.g. TUNEFARM_PEAK_GFLOPS='{"local": 230}'
    peak_gflops: dict[str, float] = {}
    # ... and its memory read bandwidth, the roof of memory-bound kernels (softmax, norms, GEMV),
    # also from bench/peak.c, e.g. TUNEFARM_PEAK_GBPS='{"local": 32}'
    peak_gbps: dict[str, float] = {}

    # emulated boards (`tunefarm board qemu-aarch64 up`: an aarch64 board under qemu-user): device
    # key -> the factor its RPC deadlines (upload, run, session) are multiplied by. Their
    # latencies are emulation's: shown as such, and never trained on by the farm's cost model
    emulated_keys: dict[str, float] = {"qemu-aarch64": 20.0}

    def emulated(self, device_key: str) -> bool:
        return device_key in self.emulated_keys

    def deadline_factor(self, device_key: str) -> float:
        return max(1.0, float(self.emulated_keys.get(device_key, 1.0)))

    def balance(self, device_key: str) -> float | None:
        """Peak GFLOPS over peak GB/s of a device key where both are declared (flop per byte:
        a kernel below it is memory-bound), else None."""
        f, b = self.peak_gflops.get(device_key), self.peak_gbps.get(device_key)
        return f / b if f and b else None

    # security (docs/security.md): sandboxes, quotas, HTTP limits
    sandbox_memory_mb: int = 8192  # address space of a build/run/parse child (RLIMIT_AS)
    sandbox_cpu_s: int = 1800  # CPU seconds of one child (RLIMIT_CPU); deadlines are per phase
    sandbox_nproc: int = 512  # processes+threads of the sandbox user (only when dropping to it)
    sandbox_fsize_mb: int = 1024  # largest file a child may write (RLIMIT_FSIZE)
    sandbox_user: str = "nobody"  # children drop to this user when started as root ("": never)
    parse_timeout_s: float = 60.0  # a TVMScript parse child running longer is killed
    # children (sandbox, build processes, TVMScript parsers) forked from one server per process
    # that imported TVM once (tuner.core.zygote); off: each child a new interpreter
    fork_server: bool = True
    # per API process: requests parsing TVMScript at once, more waiting at most parse_wait_s,
    # and new texts one principal may have parsed a minute (api.parsegate)
    parse_slots: int = 2
    parse_queue: int = 8
    parse_wait_s: float = 10.0
    parse_per_min: float = 120.0
    max_queued_jobs: int = 50  # per owner: queued + running jobs
    max_trials_per_job: int = 20_000
    max_queued_trials: int = 200_000  # per owner: trials of queued + running jobs
    rate_per_s: float = 100.0  # per principal and API process: requests per second (sustained)
    rate_burst: int = 400  # per principal and API process: requests at once
    max_body_bytes: int = 1 << 20  # request bodies larger than this are refused with 413
    metrics_token: str | None = None  # if set, GET /metrics needs `Authorization: Bearer` it
    token_cache_s: float = 1.0  # a revoked token is refused by every API process within this
    trial_ttl_s: float = 3600.0  # an issued trial accepts its result until then (and once)
    # signs the API's Redis best-cache entries (unset: a random secret per API process, so each
    # trusts only its own entries); API processes sharing a Redis should share one
    cache_secret: str | None = None

    # observability: /metrics of a tuner or worker (0: none; `--metrics-port` overrides), logs
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 for a scraper on another host
    log_format: Literal["text", "json"] = "text"  # json: one object per line, with job/trial ids

    def job_seed(self, seed: int | None) -> int:
        """A job's search seed: the explicit one, else TUNEFARM_SEED, else 0."""
        if seed is not None:
            return int(seed)
        return self.seed if self.seed is not None else 0

    def job_batch_size(self, batch_size: int | None) -> int:
        """A job's batch size: the explicit one (a positive number), else TUNEFARM_BATCH_SIZE."""
        return int(batch_size) if batch_size else self.batch_size

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        private_dir(self.data_dir)
        return f"sqlite:///{self.data_dir / 'tunefarm.db'}"


def private_dir(path: Path) -> None:
    """The data directory (the database, tokens, logs): created 0700, tightened to 0700 if this
    user owns it and others could enter it."""
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    st = path.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(path, 0o700)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except Exception:  # pragma: no cover - psutil is a dependency
        return os.cpu_count() or 1
