"""One root exception with a few subclasses; the CLI and the API map them to messages and
problem types in one place each."""

from __future__ import annotations


class TunefarmError(Exception):
    """Root of every error tunefarm raises on purpose. `code` is stable (used by the API)."""

    code = "tunefarm_error"


class SpecError(TunefarmError, ValueError):
    """A workload spec, TVMScript text or target is invalid. `field` names the offending field."""

    code = "invalid_spec"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.detail = message


class TargetError(SpecError):
    code = "invalid_target"


class EnvironmentMismatch(TunefarmError):
    """Installed packages do not match the pins tunefarm is known to work with."""

    code = "environment_mismatch"


class DatabaseError(TunefarmError):
    code = "database_error"


class NotFound(TunefarmError, LookupError):
    code = "not_found"


class Conflict(TunefarmError):
    """The request conflicts with the current state (e.g. an invalid job state transition)."""

    code = "invalid_transition"


class JobHandedOff(TunefarmError):
    """The job's state is not this run's to decide: another tuner resumes it (this process is
    stopping, lost the job's lease, or the job was cancelled under it). The search loop leaves
    the job's state as it is instead of marking it FAILED."""

    code = "job_handed_off"


class Unauthorized(TunefarmError):
    code = "unauthorized"


class Forbidden(TunefarmError):
    code = "forbidden"


class QuotaExceeded(TunefarmError):
    """A per-owner limit (queued jobs, trials per job, queued trials) would be exceeded; the API
    answers 429 with `Retry-After: retry_after` (seconds)."""

    code = "quota_exceeded"

    def __init__(self, message: str, *, retry_after: float = 60.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after
