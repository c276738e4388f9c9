"""Interop with stock TVM: the tuning database to and from MetaSchedule's `JSONDatabase`
directory (`database_workload.json` + `database_tuning_record.json`), as `tunefarm db export
--format metaschedule DIR` and `tunefarm db import DIR` do.

Export writes every record of every target (those tunefarm measured as failures with run_secs
[1e10], so TVM sees them as invalid too). Import keeps every record it reads and adds a record
only once however often the directory is imported; since records are only added, the best of a
workload can only stay or get faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..tvm_api import ms
from .ms_database import TunefarmDatabase
from .store import Store

WORKLOADS_JSON = "database_workload.json"
RECORDS_JSON = "database_tuning_record.json"


@dataclass(frozen=True)
class Transfer:
    read: int
    written: int


def export_metaschedule(store: Store, directory: str | Path, *,
                        device_key: str | None = None) -> Transfer:
    """Write the store's records (of `device_key`; None: every device) into a JSONDatabase
    directory (created; records already there are kept)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _register_intrinsics(d)
    dst = ms.database.JSONDatabase(str(d / WORKLOADS_JSON), str(d / RECORDS_JSON),
                                   allow_missing=True)
    records = TunefarmDatabase(store, device_key).get_all_tuning_records()
    for rec in records:
        wl = dst.commit_workload(rec.workload.mod)
        dst.commit_tuning_record(ms.database.TuningRecord(
            rec.trace, wl, rec.run_secs, rec.target, rec.args_info))
    return Transfer(len(records), len(records))


def import_metaschedule(store: Store, directory: str | Path, *,
                        device_key: str = "local") -> Transfer:
    """Add the records of a JSONDatabase directory to the store, for `device_key`."""
    d = Path(directory)
    for name in (WORKLOADS_JSON, RECORDS_JSON):
        if not (d / name).is_file():
            raise FileNotFoundError(f"{d / name} does not exist: not a MetaSchedule database")
    _register_intrinsics(d)
    src = ms.database.JSONDatabase(str(d / WORKLOADS_JSON), str(d / RECORDS_JSON),
                                   allow_missing=False)
    dst = TunefarmDatabase(store, device_key)
    records = src.get_all_tuning_records()
    added = sum(1 for rec in records if dst.import_record(rec))
    return Transfer(len(records), added)


def _register_intrinsics(d: Path) -> None:
    """Register the tensor intrinsics the directory's records name (tunefarm's templates
    tensorize with their own): `JSONDatabase` parses every trace as it loads."""
    from schedules.intrinsics import register_for_trace

    if (d / RECORDS_JSON).is_file():
        register_for_trace((d / RECORDS_JSON).read_text())
