"""Interop with stock TVM: the tuning database to and from MetaSchedule's `JSONDatabase`
directory (`database_workload.json` + `database_tuning_record.json`), as `tunefarm db export
--format metaschedule DIR` and `tunefarm db import DIR` do.

Export writes every record of every target (those tunefarm measured as failures with run_secs
[1e10], so TVM sees them as invalid too), and beside them `tunefarm_workloads.json`: the op spec
of each workload that has one (TVM's files hold only its module), so that an import registers it
under the same key (`tunefarm best dense --shape ...` finds it). Import keeps every record it
reads and adds a measurement only once (under whatever trial id it is stored) however often the
directory is imported; since records are only added, the best of a workload can only stay or
get faster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.core.errors import SpecError
from tuner.core.tvm_api import ms
from tuner.db.catalog import register_workload
from tuner.db.store import Store
from tuner.interop.ms_database import TunefarmDatabase
from tuner.workloads import parse_spec

WORKLOADS_JSON = "database_workload.json"
RECORDS_JSON = "database_tuning_record.json"
SPECS_JSON = "tunefarm_workloads.json"  # [{"key", "spec"}] of the op-spec workloads exported
MAX_SPECS_BYTES = 64 << 20


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
    src = TunefarmDatabase(store, device_key)
    records = src.get_all_tuning_records()
    for rec in records:
        wl = dst.commit_workload(rec.workload.mod)
        dst.commit_tuning_record(ms.database.TuningRecord(
            rec.trace, wl, rec.run_secs, rec.target, rec.args_info))
    _write_specs(store, d)
    return Transfer(len(records), len(records))


def _write_specs(store: Store, d: Path) -> None:
    """The op specs of the store's op-spec workloads (a `tir` one is its module: TVM's files
    hold it), merged with those already in the directory."""
    path = d / SPECS_JSON
    specs = {e["key"]: e for e in _read_specs(d)}
    for key, spec_json in store.op_specs():
        specs[key] = {"key": key, "spec": json.loads(spec_json)}
    path.write_text(json.dumps(sorted(specs.values(), key=lambda e: e["key"]), indent=1))


def _read_specs(d: Path) -> list[dict[str, Any]]:
    path = d / SPECS_JSON
    if not path.is_file():
        return []
    if path.stat().st_size > MAX_SPECS_BYTES:
        raise SpecError(f"{path} is larger than {MAX_SPECS_BYTES >> 20} MiB", field="directory")
    try:
        entries = json.loads(path.read_text())
    except ValueError as exc:
        raise SpecError(f"{path} is not JSON: {exc}", field="directory") from exc
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("key"), str)
            and isinstance(e.get("spec"), dict) for e in entries):
        raise SpecError(f"{path} is not a list of {{key, spec}} objects", field="directory")
    return entries


def import_metaschedule(store: Store, directory: str | Path, *,
                        device_key: str = "local") -> Transfer:
    """Add the records of a JSONDatabase directory to the store, for `device_key`."""
    d = Path(directory)
    for name in (WORKLOADS_JSON, RECORDS_JSON):
        if not (d / name).is_file():
            raise FileNotFoundError(f"{d / name} does not exist: not a MetaSchedule database")
    _register_intrinsics(d)
    for entry in _read_specs(d):  # op-spec workloads under their own keys, before their modules
        wl = parse_spec(entry["spec"])
        if wl.op != "tir" and wl.key == entry["key"]:  # a spec that names another key: ignored
            register_workload(store, wl)
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
