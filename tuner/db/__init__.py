"""The SQL tuning database (SQLite or PostgreSQL) and its MetaSchedule adapter.

`tuner.db.ms_database.TunefarmDatabase` imports TVM; it is not imported here so that the
database can be used without paying for `import tvm`.
"""

from __future__ import annotations

from .catalog import register_workload
from .engine import UPGRADE_COMMAND, normalize_url, target_key
from .models import Base, JobState
from .rows import JobRow, MeasuredRow, NewRecord, RecordRow, TargetRef, TrainingRow, WorkloadRow
from .store import Store

__all__ = [
    "UPGRADE_COMMAND", "Base", "JobRow", "JobState", "MeasuredRow", "NewRecord", "RecordRow",
    "Store", "TargetRef", "TrainingRow", "WorkloadRow", "normalize_url", "register_workload",
    "target_key",
]
