"""The SQL tuning database (SQLite or PostgreSQL): jobs, workloads, records, tokens, workers.

Its MetaSchedule adapter, `tuner.interop.ms_database.TunefarmDatabase`, replays traces and lives
a layer up (`tuner.interop`); nothing here imports TVM, so the database can be used without
paying for `import tvm`.
"""

from __future__ import annotations

from .catalog import register_workload
from .engine import UPGRADE_COMMAND, normalize_url, target_key
from .rows import JobRow, MeasuredRow, NewRecord, RecordRow, TargetRef, TrainingRow, WorkloadRow
from .store import Store
from .tables import Base, JobState

__all__ = [
    "UPGRADE_COMMAND", "Base", "JobRow", "JobState", "MeasuredRow", "NewRecord", "RecordRow",
    "Store", "TargetRef", "TrainingRow", "WorkloadRow", "normalize_url", "register_workload",
    "target_key",
]
