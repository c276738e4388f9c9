"""What the `tunefarm` commands share: the consoles, the option types, and the helpers that turn
command-line arguments into a workload, a target and a store, and an error into exit code 2.

Invariants: a command reports a `TunefarmError` through `fail` (one red line on stderr, exit 2,
never a traceback); results go to stdout, everything else to stderr or the rich console.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from tuner.core.config import get_settings
from tuner.core.errors import TunefarmError

if TYPE_CHECKING:
    from tuner.db.store import Store
    from tuner.workloads import Workload

# no markup: what the commands print holds text from outside (shapes, target dicts, file and token
# names, device keys, messages from the API), which rich would read as style tags ("[local]"
# vanished, "[/x]" raised MarkupError); styles are given explicitly (`Text.assemble`, `style=`)
console = Console(markup=False)
err = Console(stderr=True, markup=False)

DbOpt = Annotated[str | None, typer.Option(
    "--db", help="Database URL (default: TUNEFARM_DATABASE_URL, else SQLite in the user data "
                 "directory).")]
OpArg = Annotated[str, typer.Argument(
    help="matmul, dense, batch_matmul, conv2d, depthwise_conv2d, softmax, dense_int8, or tir")]
ShapeOpt = Annotated[str | None, typer.Option(
    "--shape", help="Op shape, e.g. 512,512,512 (M,N,K).")]
ParamOpt = Annotated[list[str] | None, typer.Option(
    "--param", "-p", help="Op parameter key=value (stride, padding, dilation, layout, dtype).")]
TargetOpt = Annotated[str, typer.Option(
    "--target", help='"host" (this CPU) or a JSON target dict.')]
ScriptOpt = Annotated[Path | None, typer.Option("--tvmscript", help="TVMScript file (op 'tir').")]
# a job's options, spelled the same on tune, submit and tune-model (tests/tuner/test_cli.py)
BatchSizeOpt = Annotated[int | None, typer.Option(
    min=1, help="Candidates measured per batch (default TUNEFARM_BATCH_SIZE).")]
SeedOpt = Annotated[int | None, typer.Option(help="Search seed (default TUNEFARM_SEED, else 0).")]
EarlyStopOpt = Annotated[int | None, typer.Option(
    min=1, help="Stop after N trials without a new best.")]
WallBudgetOpt = Annotated[float | None, typer.Option(
    "--wall-budget-s", "--wall-budget", min=1,
    help="Stop after this many seconds (a model: start no new round after them).")]


def open_store(db: str | None) -> Store:
    """The tuning database at `db` (default: the settings' URL), migrated if needed."""
    from tuner.db.store import Store

    return Store(db or get_settings().resolved_database_url())


def workload_arg(op: str, shape: str | None, params: list[str] | None,
                 tvmscript: Path | None) -> Workload:
    """The workload the command line names (op, --shape, -p key=value, --tvmscript)."""
    from tuner.core.errors import SpecError
    from tuner.workloads import from_cli, parse_spec

    if op == "tir":
        if tvmscript is None:
            raise SpecError("op 'tir' needs --tvmscript FILE", field="tvmscript")
        try:
            text = tvmscript.read_text()
        except OSError as exc:  # missing, a directory, unreadable
            raise SpecError(f"cannot read {tvmscript}: {exc.strerror or exc}",
                            field="tvmscript") from exc
        except UnicodeDecodeError as exc:
            raise SpecError(f"{tvmscript} is not UTF-8 text", field="tvmscript") from exc
        return parse_spec({"op": "tir", "tvmscript": text})
    if shape is None:
        raise SpecError(f"--shape is required for op {op!r}", field="shape")
    kv: dict[str, str] = {}
    for item in params or []:
        if "=" not in item:
            raise SpecError(f"expected key=value, got {item!r}", field="param")
        k, v = item.split("=", 1)
        kv[k.strip()] = v.strip()
    return from_cli(op, shape, kv)


def target_arg(spec: str, *, runnable_here: bool = False) -> dict[str, Any]:
    """The target `--target` names, as a dict, checked against the allowlist the API applies
    (`tuner.core.targets`); `runnable_here`: refuse one this machine cannot run (local tuning
    measures here), `num-cores` above its cores included."""
    from tuner.core import tvm_api as tv
    from tuner.core.config import physical_cores
    from tuner.core.errors import TargetError
    from tuner.core.targets import MAX_CORES, check_target

    if spec.strip().startswith("{"):  # the API's allowlist, cores bounded by what runs it
        try:
            given = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise TargetError(f"not valid JSON: {exc.msg}", field="target") from exc
        check_target(given, max_cores=physical_cores() if runnable_here else MAX_CORES)
    d = tv.target_to_dict(tv.make_target(spec))
    if runnable_here:
        host_triple = str(tv.tvm_ffi.get_global_func("target.llvm_get_system_triple")())
        triple = d.get("mtriple", host_triple)
        if d["kind"] != "llvm" or triple.split("-")[0] != host_triple.split("-")[0]:
            raise TargetError(f"{json.dumps(d)} does not run on this machine ({host_triple}): "
                              "local tuning measures here; use a worker on such a board",
                              field="target")
    return d


def fail(exc: TunefarmError) -> NoReturn:
    # soft wrap: a long message (a target dict) stays one line, to be read or copied whole
    err.print(Text.assemble(("error:", "bold red"), f" {exc}"), soft_wrap=True)
    raise typer.Exit(2)


def rate(flops: int, nbytes: int, device_key: str) -> tuple[str, Any]:
    """(unit, seconds -> text) of a workload's throughput: GB/s of its parameters for a
    memory-bound one (`memory_bound`: its roof is the bandwidth), else GFLOPS; with the device
    key's declared roof (TUNEFARM_PEAK_GBPS / TUNEFARM_PEAK_GFLOPS), its share of it."""
    from tuner.core.config import get_settings
    from tuner.core.measurements import gbps, gflops, memory_bound

    s = get_settings()
    if memory_bound(flops, nbytes, s.balance(device_key)):
        unit, work, roof = "GB/s", nbytes, s.peak_gbps.get(device_key)
    else:
        unit, work, roof = "GFLOPS", flops, s.peak_gflops.get(device_key)

    def text(seconds: float | None) -> str:
        value = (gbps if unit == "GB/s" else gflops)(work, seconds)
        if value is None:
            return "-"
        return f"{value:.1f}" + (f" ({value / roof:.0%} of {roof:g})" if roof else "")

    return unit, text


def fmt_s(s: float | None) -> str:
    """A latency for people: ms above a millisecond, else us."""
    if s is None:
        return "-"
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def host_port(text: str) -> tuple[str, int]:
    """`HOST:PORT` of an RPC tracker (--rpc-tracker)."""
    from tuner.core.errors import SpecError

    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SpecError(f"expected HOST:PORT, got {text!r}", field="rpc-tracker")
    return host, int(port)
