"""Every Redis key tunefarm uses, in one place (a prefix per deployment, or per test)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "tunefarm:"

    TUNERS_GROUP = "tuners"
    WORKERS_GROUP = "workers"

    @classmethod
    def default(cls) -> Keys:
        from tuner.core.config import get_settings

        return cls(get_settings().redis_prefix)

    @property
    def jobs(self) -> str:
        """Stream of job ids for tuner processes (fields: job_id)."""
        return f"{self.prefix}jobs"

    def measure(self, device_key: str) -> str:
        """Stream of measurements for the workers of one board class (fields: input)."""
        return f"{self.prefix}measure:{device_key}"

    def parked(self, device_key: str) -> str:
        """Confirmation entries held back from the worker that measured the original (hash:
        entry id -> that worker's id): the next other worker of the key takes them."""
        return f"{self.prefix}parked:{device_key}"

    def dead(self, device_key: str) -> str:
        """Dead-lettered measurements (fields: input, reason, deliveries)."""
        return f"{self.prefix}dead:{device_key}"

    def events(self, job_id: str) -> str:
        """Stream of a job's events (fields: event, data): state, progress, record."""
        return f"{self.prefix}events:{job_id}"

    def lost(self, job_id: str) -> str:
        """Trials of a job the farm gave up on (fields: trial_id, reason)."""
        return f"{self.prefix}lost:{job_id}"

    def best(self, workload_key: str, target_key: str) -> str:
        """Cached best record (JSON) of a workload on a target+device."""
        return f"{self.prefix}best:{workload_key}:{target_key}"

    def cancelled(self, job_id: str) -> str:
        """Set while a job is cancelled: workers skip its measurements."""
        return f"{self.prefix}cancelled:{job_id}"

    def worker(self, worker_id: str) -> str:
        """Live stats of a worker (hash)."""
        return f"{self.prefix}worker:{worker_id}"
