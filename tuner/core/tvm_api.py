"""The only module in tunefarm that imports TVM.

TVM's Python API moves between releases (`tvm.tir` became `tvm.tirx`/`tvm.s_tir`, targets became
JSON dicts, `tvm.nd` became `tvm.runtime.tensor`). Everything tunefarm needs from TVM is re-exported
or wrapped here, so the next move touches one file. The traps met so far are noted where they
are worked around (the ffi pin: `check_pins`; the broken VNNI intrinsic: `schedules/intrinsics.py`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, SupportsInt

from .errors import EnvironmentMismatch, SpecError, TargetError

if TYPE_CHECKING:
    import torch

REQUIRED = {"apache-tvm": "0.27.0.post1", "apache-tvm-ffi": "0.1.14.post1"}


def check_pins(version: Callable[[str], str] = importlib.metadata.version) -> None:
    """Refuse to run against TVM / tvm-ffi versions that are known to crash.

    apache-tvm-ffi 0.1.15.x segfaults inside `tvm.ir.save_json`, which every database write and
    every build needs; failing loudly here beats a segfault in the middle of a tuning job.
    """
    for dist, wanted in REQUIRED.items():
        try:
            got = version(dist)
        except importlib.metadata.PackageNotFoundError as exc:
            raise EnvironmentMismatch(
                f"{dist} is not installed; tunefarm needs {dist}=={wanted}") from exc
        if got != wanted:
            raise EnvironmentMismatch(
                f"{dist}=={got} is installed but tunefarm needs {dist}=={wanted} "
                f"(apache-tvm-ffi 0.1.15.x segfaults in tvm.ir.save_json). "
                f"Fix: pip install '{dist}=={wanted}'"
            )


check_pins()

# Before TVM is imported: its ~50 `_ffi_api` modules each list all ~2,000 global function names
# (`tuner.core.ffi_names` says why that is an eighth of `import tvm` and what it does instead).
import tvm_ffi  # noqa: E402

from . import ffi_names  # noqa: E402

ffi_names.install(tvm_ffi)

# TVM itself, and TVM's classes named in the project's signatures. mypy reads TVM's own sources
# for them (`follow_untyped_imports` in pyproject.toml), so a parameter that says `Schedule` is
# checked as one. `Expr` is both a TIR PrimExpr and a relax expression (one class in TVM 0.27).
import tvm  # noqa: E402
from tvm import relax, te, topi  # noqa: E402
from tvm.ir import BaseFunc, GlobalVar, IRModule  # noqa: E402
from tvm.ir.expr import Expr  # noqa: E402
from tvm.ir.utils import derived_object  # noqa: E402
from tvm.runtime import Module as RuntimeModule  # noqa: E402
from tvm.runtime import Tensor  # noqa: E402
from tvm.s_tir import SBlock, Schedule, Trace  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.s_tir.schedule import ExprRV, LoopRV, SBlockRV  # noqa: E402
from tvm.support.popen_pool import PopenPoolExecutor, PopenWorker  # noqa: E402
from tvm.target import Target  # noqa: E402
from tvm.tirx import Buffer, IndexMap, PrimFunc, Stmt, Var  # noqa: E402

logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)


def _cheap_decorator_stacks() -> None:
    """TVMScript's decorators read the stack with `inspect.stack()`, which costs them tens of
    milliseconds each in a process with many modules (`tuner.core.frames` says why and what it
    gives instead)."""
    import importlib

    from . import frames

    for name in ("tvm.tirx.script.parser.entry", "tvm.script.parser.ir.entry",
                 "tvm.relax.script.parser.entry"):
        frames.install(importlib.import_module(name))


_cheap_decorator_stacks()

__all__ = [
    "BaseFunc",
    "Buffer",
    "Expr",
    "ExprRV",
    "GlobalVar",
    "IRModule",
    "IndexMap",
    "LoopRV",
    "PopenPoolExecutor",
    "PopenWorker",
    "PrimFunc",
    "RuntimeModule",
    "SBlock",
    "SBlockRV",
    "Schedule",
    "Stmt",
    "Target",
    "Tensor",
    "Trace",
    "Var",
    "apply_trace",
    "buffer_dtype",
    "buffer_elem_offset",
    "buffer_shape",
    "buffer_strides",
    "canonical_target_json",
    "compile_module",
    "const_shape",
    "derived_object",
    "expr_dtype",
    "func_body",
    "func_params",
    "fuse",
    "host_target_dict",
    "load_json",
    "load_tensor_intrins",
    "make_target",
    "module_functions",
    "ms",
    "num_tensor_elements",
    "param_bytes",
    "param_specs",
    "prim_func_from_tvmscript",
    "relax",
    "relax_from_exported_program",
    "reorder",
    "sample_init_population",
    "save_json",
    "shash_hex",
    "split_loop",
    "strip_layout_rewrite",
    "structural_equal",
    "structural_hash",
    "target_to_dict",
    "te",
    "tensor_type",
    "topi",
    "trace_decisions",
    "trace_to_json",
    "tune_context",
    "tvm",
    "tvm_ffi",
    "tvm_version",
    "vload",
]


@functools.cache
def tvm_version() -> str:
    return f"tvm={tvm.__version__};ffi={importlib.metadata.version('apache-tvm-ffi')}"


def structural_hash(obj: object) -> int:
    return int(tvm_ffi.structural_hash(obj)) & 0xFFFFFFFFFFFFFFFF


def shash_hex(obj: object) -> str:
    """The structural hash as 16 hex digits: how tunefarm names a workload's module and a
    candidate program (`cand_hash`) in the database."""
    return f"{structural_hash(obj):016x}"


def structural_equal(a: object, b: object) -> bool:
    return bool(tvm_ffi.structural_equal(a, b))


def save_json(obj: object) -> str:
    return str(tvm.ir.save_json(obj))


def load_json(text: str) -> tvm_ffi.Object:
    return tvm.ir.load_json(text)


# ---------------------------------------------------------------------------------------------
# what TVM's annotations miss: fields reflected through the FFI (a buffer is a Var typed
# BufferType whose `shape`, `dtype`, ... are properties set on Var at import), schedule
# primitives annotated `*loops: list[LoopRV]` though each argument is one LoopRV, parameters
# annotated Expr or list that take ints or any sequence. Each gap is typed here once; every
# value is TVM's own, returned as is.


def func_params(func: PrimFunc) -> Sequence[Var]:
    """`func.params`: buffer parameters are Vars typed BufferType (0.27 has no buffer_map)."""
    return func.params  # type: ignore[attr-defined]


def func_body(func: PrimFunc) -> Stmt:
    return func.body  # type: ignore[attr-defined]


def module_functions(mod: IRModule) -> Mapping[GlobalVar, BaseFunc]:
    return mod.functions  # type: ignore[attr-defined]


def buffer_shape(buf: Expr) -> Sequence[Expr]:
    """`buf.shape` of a buffer Var (a load's `source` is typed Expr)."""
    return buf.shape  # type: ignore[attr-defined]


def const_shape(buf: Expr) -> list[int]:
    """`[int(d) for d in buf.shape]`: TypeError for a symbolic dimension (int() of an Expr)."""
    return [int(d) for d in buf.shape]  # type: ignore[attr-defined]


def buffer_dtype(buf: Expr) -> str:
    """`buf.dtype` of a buffer Var: a `tvm_ffi.dtype`, which is a str."""
    return buf.dtype  # type: ignore[attr-defined]


def buffer_strides(buf: Expr) -> Sequence[Expr]:
    return buf.strides  # type: ignore[attr-defined]


def buffer_elem_offset(buf: Expr) -> Expr:
    return buf.elem_offset  # type: ignore[attr-defined]


def vload(buf: Expr, begin: Sequence[Expr | int], dtype: str) -> Expr:
    """`buf.vload(begin, dtype)`: a load of `dtype` (e.g. float32x8) from `begin`."""
    return buf.vload(begin, dtype)  # type: ignore[attr-defined]


def expr_dtype(expr: Expr) -> str:
    """`expr.ty.dtype` of a PrimExpr (its type is a PrimType): a `tvm_ffi.dtype`, a str."""
    return expr.ty.dtype  # type: ignore[attr-defined]


def tensor_type(shape: Sequence[int], dtype: str) -> relax.TensorType:
    """`relax.TensorType(shape, dtype)` of a constant shape (TVM converts the ints)."""
    return relax.TensorType(shape, dtype)  # type: ignore[arg-type]


def fuse(sch: Schedule, *loops: LoopRV) -> LoopRV:
    return sch.fuse(*loops)  # type: ignore[arg-type]


def reorder(sch: Schedule, *loops: LoopRV) -> None:
    sch.reorder(*loops)  # type: ignore[arg-type]


def split_loop(sch: Schedule, loop: LoopRV, factors: Sequence[int | ExprRV | None]) -> list[LoopRV]:
    """`sch.split(loop, factors)`, factors any sequence (TVM's `list` is invariant)."""
    return sch.split(loop, factors)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# targets


def host_target_dict(num_cores: int | None = None) -> dict[str, Any]:
    """This CPU as an explicit target. Never `mcpu: native`: LLVM 22 silently falls back to generic
    code (no AVX-512) for it. Where the CPU's model implies features this machine does not offer
    (a virtual machine that hides AVX-512 from a Zen 4), `mattr` turns them off: code built for the
    bare `mcpu` would die of SIGILL here."""
    from .config import physical_cores

    cpu, mattr = _host_cpu()
    spec: dict[str, Any] = {"kind": "llvm", "mcpu": cpu}
    if mattr:
        spec["mattr"] = list(mattr)
    spec["num-cores"] = int(num_cores or physical_cores())
    return spec


@functools.cache
def _host_cpu() -> tuple[str, tuple[str, ...]]:
    """LLVM's name of this CPU, and the fewest `-feature`s that take from that CPU model what this
    machine lacks (CPUID's view: `GetHostCPUFeatures`). Turning off `avx512f` turns off every
    AVX-512 extension with it, so the cover is usually one or two entries plus odd system ones."""
    g = tvm_ffi.get_global_func
    cpu = str(g("tvm.codegen.llvm.GetHostCPUName")())
    host = {str(k): bool(v) for k, v in g("tvm.codegen.llvm.GetHostCPUFeatures")().items()}
    if not host:
        return cpu, ()

    def enabled(mattr: list[str]) -> set[str]:
        on_in_model = _llvm_features(cpu, mattr)
        return {f for f, on in host.items() if not on and f in on_in_model}

    missing = enabled([])
    off: list[str] = []
    while missing:  # greedy cover: the feature whose removal takes the most missing ones with it
        best = max(sorted(missing), key=lambda f: len(missing - enabled([*off, "-" + f])))
        off.append("-" + best)
        left = enabled(off)
        if left >= missing:  # LLVM would not turn it off: stop rather than loop
            break
        missing = left
    still_on = enabled(off)  # empty, unless LLVM would not turn something off
    for entry in list(off):  # a greedy cover may hold an entry that later ones made redundant
        rest = [o for o in off if o != entry]
        if enabled(rest) <= still_on:
            off = rest
    return cpu, tuple(off) + _features_beyond_model(cpu, off, host)


def _llvm_features(cpu: str, mattr: list[str]) -> frozenset[str]:
    """The features LLVM turns on for `cpu` with `mattr`: one map per target (asking
    `target.llvm_cpu_has_feature` feature by feature made a target machine each time, and the
    covers above cost 0.12 s in every process that makes the host target)."""
    t = tvm.target.Target({"kind": "llvm", "mcpu": cpu, "mattr": mattr})
    return frozenset(str(f) for f in tvm_ffi.get_global_func("target.llvm_get_cpu_features")(t))


def _features_beyond_model(cpu: str, off: list[str], host: dict[str, bool]) -> tuple[str, ...]:
    """The vector and tile ISA features CPUID reports that LLVM's model of `cpu` lacks, as
    `+feature`s: a virtual machine can report an older CPU model (a Sapphire Rapids seen as
    "rocketlake") with AVX512-BF16 and AMX present. AMX only where the kernel grants this
    process the tile state: without it the first tile instruction faults."""

    def missing(mattr: list[str]) -> set[str]:
        return wanted - _llvm_features(cpu, mattr)

    wanted = {f for f, on in host.items() if on and f.startswith(("avx", "amx"))}
    if not amx_granted():
        wanted = {f for f in wanted if not f.startswith("amx")}
    add = sorted(missing(list(off)))
    for entry in list(add):  # drop what another entry implies (amx-bf16 implies amx-tile)
        rest = [a for a in add if a != entry]
        if not missing([*off, *("+" + a for a in rest)]):
            add = rest
    return tuple("+" + a for a in add)


@functools.cache
def amx_granted() -> bool:
    """Whether Linux grants this process AMX's tile state (arch_prctl ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA): the request a process makes before its first tile instruction. Asking
    changes nothing but the permission; False off x86-64 Linux or where the kernel refuses."""
    import ctypes
    import platform
    import sys

    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(158, 0x1023, 18)) == 0  # SYS_arch_prctl


def _plain(o: Any) -> Any:
    if isinstance(o, str | int | float | bool) or o is None:
        return o
    if hasattr(o, "items"):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, list | tuple) or type(o).__name__ in ("Array", "List"):
        return [_plain(v) for v in o]
    if hasattr(o, "value"):
        return o.value
    if hasattr(o, "export"):  # nested Target (host)
        return _plain(o.export())
    return str(o)


def target_to_dict(target: Target) -> dict[str, Any]:
    """Canonical dict of a `tvm.target.Target` (TVM fills defaults such as `keys`)."""
    d = _plain(target.export())
    d.pop("tag", None) if d.get("tag") == "" else None
    return d


def canonical_target_json(target: Target) -> str:
    return json.dumps(target_to_dict(target), sort_keys=True, separators=(",", ":"))


def make_target(spec: str | dict[str, Any]) -> Target:
    """A `tvm.target.Target` from `"host"`, a JSON dict, or a JSON string of one.

    Rejects what TVM would silently accept and miscompile: an `llvm` mcpu that LLVM does not know
    (incl. `native`) falls back to generic code without AVX-512.
    """
    if isinstance(spec, str):
        text = spec.strip()
        if text in ("host", "local", ""):
            spec = host_target_dict()
        elif text.startswith("{"):
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TargetError(f"not valid JSON: {exc.msg}", field="target") from exc
        else:
            raise TargetError(
                f"{text!r} is not a target: give 'host' or a JSON dict such as "
                '{"kind": "llvm", "mcpu": "znver5", "num-cores": 2} '
                "(TVM 0.27 no longer parses 'llvm -mcpu=...' strings)",
                field="target",
            )
    if not isinstance(spec, dict) or "kind" not in spec:
        raise TargetError('must be "host" or a JSON object with a "kind"', field="target")
    spec = dict(spec)
    if (spec.get("kind") == "llvm" and spec.get("mcpu") in (None, "native", "host")
            and (spec.get("mcpu") is not None or "mtriple" not in spec)):
        here = host_target_dict()
        spec["mcpu"] = here["mcpu"]
        if here.get("mattr"):  # what this CPU lacks, then what the caller asked for
            spec["mattr"] = [*here["mattr"], *spec.get("mattr", [])]
    if spec.get("kind") == "llvm" and "mcpu" in spec:
        triple = (spec.get("mtriple")
                  or str(tvm_ffi.get_global_func("target.llvm_get_system_triple")()))
        valid = tvm_ffi.get_global_func("target.llvm_is_valid_cpu")(str(spec["mcpu"]), str(triple))
        if not valid:
            raise TargetError(
                f"LLVM does not know mcpu {spec['mcpu']!r} for triple {triple!r}; it would "
                "silently generate generic code", field="target.mcpu")
    if spec.get("kind") == "llvm" and "num-cores" not in spec:
        from .config import physical_cores

        spec["num-cores"] = physical_cores()
    try:
        return tvm.target.Target(spec)
    except Exception as exc:  # TVM raises ValueError/TVMError with a long message
        raise TargetError(str(exc).splitlines()[0][:300], field="target") from exc


# ---------------------------------------------------------------------------------------------
# traces and schedules


def _json_default(o: object) -> object:
    return o.value if hasattr(o, "value") else str(o)


def trace_to_json(trace: Trace) -> str:
    """Full trace (postprocessing included) as JSON: replaying it reproduces the candidate."""
    return json.dumps(trace.as_json(remove_postproc=False), default=_json_default)


def trace_decisions(trace: Trace) -> list[list[Any]]:
    """The sampling decisions of a trace: `[[instruction_index, kind, decision], ...]`."""
    out: list[list[Any]] = []
    for idx, inst in enumerate(trace.insts):
        if inst in trace.decisions:
            out.append([idx, inst.kind.name, _plain(trace.decisions[inst])])
    return out


def apply_trace(mod: IRModule, trace_json: str) -> Schedule:
    """Replay a trace JSON onto a fresh schedule of `mod`; returns the Schedule."""
    sch = Schedule(mod)
    Trace.apply_json_to_schedule(json.loads(trace_json), sch)
    return sch


def strip_layout_rewrite(mod: IRModule) -> IRModule:
    """Drop the weight-packing blocks MetaSchedule's RewriteLayout adds for layout-free weights:
    the kernel then takes the weight pre-packed (packing is paid once at compile time for model
    constants; relax's SplitLayoutRewritePreproc does the same in a pipeline). TVM's pass takes
    only packings that are plain copies: `tuner.core.prepack.kernel` takes any."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)


def param_specs(mod: IRModule) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each parameter of `mod["main"]`."""
    # in TVM 0.27 a PrimFunc has no buffer_map: buffer params are Vars typed BufferType
    return [(tuple(int(d) for d in p.shape), str(p.dtype)) for p in mod["main"].params]


def param_bytes(mod: IRModule) -> int:
    """Bytes of the parameters of `mod["main"]`: what one run reads and writes at least (0 if
    a shape is not static)."""
    import numpy as np

    try:
        return int(sum(int(np.prod(shape)) * tvm.DataType(dtype).itemsize
                       for shape, dtype in param_specs(mod)))
    except (TypeError, ValueError, AttributeError):
        return 0


def compile_module(mod: IRModule, target: Target) -> RuntimeModule:
    """Build an (already scheduled) IRModule for `target`; returns the runtime module."""
    return tvm.compile(mod, target=target).mod


def prim_func_from_tvmscript(text: str) -> PrimFunc:
    """Parse TVMScript text (already vetted by `tuner.workloads.tvmscript`) into a PrimFunc."""
    obj = tvm.script.from_source(text)
    if isinstance(obj, tvm.IRModule):
        funcs = [f for f in module_functions(obj).values() if isinstance(f, tvm.tirx.PrimFunc)]
        if len(funcs) != 1:
            raise ValueError(f"expected one PrimFunc in the module, found {len(funcs)}")
        obj = funcs[0]
    if not isinstance(obj, tvm.tirx.PrimFunc):
        raise ValueError(f"expected a PrimFunc, got {type(obj).__name__}")
    return obj


def relax_from_exported_program(program: torch.export.ExportedProgram) -> IRModule:
    """The relax IRModule of a `torch.export` program, its weights bound as constants (TVM's
    torch frontend; needs torch, an optional extra)."""
    from tvm.relax.frontend.torch import from_exported_program

    return from_exported_program(program)


def num_tensor_elements(shape: Iterable[SupportsInt]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


# ---------------------------------------------------------------------------------------------
# MetaSchedule


def _lazy_tensor_intrin_package() -> None:
    """Make `import tvm.s_tir.tensor_intrin` cheap.

    `TuneContext.__init__` imports the package, whose `__init__` registers ~110 intrinsics for
    every backend (about 11 s here; 7.7 s of it CUDA). tunefarm registers the few intrinsics a
    space needs itself (e.g. `schedules/`), so install the package as an empty namespace whose
    submodules (`...tensor_intrin.x86`) still import on demand.
    """
    import importlib.util
    import sys
    import types

    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:  # pragma: no cover
        return
    pkg = types.ModuleType(name, "tensor intrinsics (submodules load on demand; see tunefarm)")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__package__ = name
    sys.modules[name] = pkg
    import tvm.s_tir as _s_tir

    _s_tir.tensor_intrin = pkg  # type: ignore[attr-defined]
    # x86's two VNNI/AVX-512 dots (0.25-0.45 s: TVMScript parsing) load where MetaSchedule's
    # default CPU rules are used (`tune_context`, `TunefarmDatabase`) or a trace names them
    # (`schedules.intrinsics.register_for_trace`), not in every build and measuring process


_lazy_tensor_intrin_package()


def load_tensor_intrins(backend: str) -> ModuleType:
    """Import `tvm.s_tir.tensor_intrin.<backend>` ("cuda", "arm_cpu", ...), which registers that
    backend's tensor intrinsics (cuda: ~8 s); returns the module (its `*_INTRIN` names)."""
    import importlib

    return importlib.import_module(f"tvm.s_tir.tensor_intrin.{backend}")


def sample_init_population(strategy: ms.search_strategy.SearchStrategy, n: int) -> list[Schedule]:
    """`n` random schedules from a pre-tuned EvolutionarySearch's design spaces (each space's
    trace replayed with fresh decisions, then postprocessed), without evolution: the search's
    own initial-population sampler (a private FFI function, named here so a move touches one
    line)."""
    sample = (ms._ffi_api  # type: ignore[attr-defined]  # FFI-registered: invisible to mypy
              .SearchStrategyEvolutionarySearchSampleInitPopulation)
    return list(sample(strategy, n))


def tune_context(mod: IRModule, target: Target, *,
                 space: ms.space_generator.SpaceGenerator.SpaceGeneratorType,
                 strategy: ms.search_strategy.SearchStrategy.SearchStrategyType, seed: int,
                 num_threads: int, task_name: str = "main") -> ms.TuneContext:
    # the default spaces of these targets name intrinsics from these modules (x86: VNNI, ...)
    keys = set(target.keys)
    default_rules = isinstance(space, str | ms.space_generator.PostOrderApply)
    for mod_name, needed in (("x86", default_rules and "cpu" in keys),
                             ("arm_cpu", "arm_cpu" in keys), ("cuda", "cuda" in keys),
                             ("rocm", "rocm" in keys), ("hexagon", "hexagon" in keys)):
        if needed:
            load_tensor_intrins(mod_name)
    return ms.TuneContext(mod=mod, target=target, space_generator=space, search_strategy=strategy,
                          task_name=task_name, rand_state=seed, num_threads=num_threads)


def design_spaces(ctx: ms.TuneContext) -> list[Schedule]:
    """The design spaces of a tune context. A space that TVM cannot build for this workload (its
    schedule rules fail on it, e.g. a tile of a loop whose extent overflows the sampler) is a
    SpecError naming the TVM error, not a traceback out of the search."""
    try:
        return list(ctx.generate_design_space())
    except (RuntimeError, ValueError) as exc:  # what TVM raises (ScheduleError, InternalError)
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"no design space can be generated for this workload: {first}") from exc


# ---------------------------------------------------------------------------------------------
# libraries and RPC (tuner.measure.rpc, tests.support.rpcfarm)


def library_suffix(target: Target) -> str:
    """`.so` for this machine's architecture; `.tar` (objects, no cross linker needed: the board
    links them when it loads the library) for another one, e.g. an aarch64 target here."""
    triple = str(target.attrs.get("mtriple", "") or "") if hasattr(target, "attrs") else ""
    if not triple:
        return ".so"
    host = str(tvm_ffi.get_global_func("target.llvm_get_system_triple")())
    return ".so" if triple.split("-")[0] == host.split("-")[0] else ".tar"


def export_library(rt: RuntimeModule, path: str) -> str:
    """Write a runtime module to `path` (`.so` links with the host compiler, `.tar` does not)."""
    rt.export_library(path)
    return path


def rpc_tracker_summary(host: str, port: int) -> dict[str, Any]:
    """The tracker's summary: {"queue_info": {key: {"free", "pending"}}, "server_info": [...]}."""
    tracker = tvm.rpc.connect_tracker(host, port)
    try:
        return dict(_plain(tracker.summary()))
    finally:
        tracker.close()


def rpc_request_server(host: str, port: int, key: str, *, timeout_s: float,
                       priority: int = 1) -> tuple[str, int, str]:
    """Ask the tracker for a free server of `key`: (server host, port, match key).

    Unlike `TrackerSession.request`, which blocks forever while no server is free, this raises
    TimeoutError after `timeout_s`; closing the connection withdraws the request (the tracker
    skips requests whose connection is closed)."""
    import socket
    import struct

    from tvm.rpc import base

    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
            raise ConnectionError(f"{host}:{port} is not an RPC tracker")
        base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", priority])
        value = base.recvjson(sock)  # socket.timeout (a TimeoutError) past timeout_s
        if value[0] != base.TrackerCode.SUCCESS:
            raise ConnectionError(f"the tracker refused the request: {value!r}")
        url, srv_port, matchkey = value[1]
        return str(url), int(srv_port), str(matchkey)
    finally:
        sock.close()


def rpc_connect(host: str, port: int, matchkey: str, *,
                session_timeout_s: float) -> tvm.rpc.RPCSession:
    """Open an RPC session on a server (the server ends it after `session_timeout_s`)."""
    return tvm.rpc.connect(host, port, key=matchkey, session_timeout=session_timeout_s)
