"""Parallel builds ahead of measurement.

Building is most of a candidate's measuring cost, and it needs no quiet machine: a batch is
compiled by a pool of build processes (one per core) *before* its candidates are timed one by one
in the sandbox, which then only loads the built library. A build that raises is a `build_error`,
one past the deadline a `build_timeout` (the pool kills that worker); both are results, never
exceptions. The pool is TVM's popen pool: it kills a worker past its deadline and respawns it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from tuner.measure import Invalidity, MeasureInput

_WORKLOADS: dict[str, Any] = {}


def build_kernel(inp_json: str, out_dir: str, whole: bool = False
                 ) -> tuple[str, float, list[tuple[tuple[int, ...], str]]]:
    """(In a build process.) Replay, strip weight packing (unless `whole`), compile, export;
    returns (path, secs, the built function's parameter specs). The library is a `.so` for this
    machine's architecture and a `.tar` for another one (no cross linker needed)."""
    from schedules.registry import replay
    from tuner import tvm_api as tv
    from tuner.workloads import parse_spec

    t0 = time.perf_counter()
    inp = MeasureInput.from_json(inp_json)
    wl = _WORKLOADS.get(inp.workload_key)
    if wl is None:
        wl = _WORKLOADS[inp.workload_key] = parse_spec(inp.workload_spec)
    sch = replay(wl.mod(), inp.trace_json)
    mod = sch.mod if whole else tv.strip_layout_rewrite(sch.mod)
    target = tv.make_target(inp.target)
    rt = tv.compile_module(mod, target)
    name = f"{inp.trial_id}-whole" if whole else inp.trial_id
    path = tv.export_library(rt, os.path.join(out_dir, name + tv.library_suffix(target)))
    return path, time.perf_counter() - t0, tv.param_specs(mod)


def _warm_up() -> None:
    """(In a build process.) Import what every build needs (~1.2 s), ahead of the first batch."""
    import schedules.registry  # noqa: F401
    import tuner.workloads  # noqa: F401


@dataclass(frozen=True)
class Built:
    path: str | None  # the kernel library, or None when the build failed
    build_s: float | None = None
    invalidity: Invalidity | None = None
    error_msg: str | None = None
    params: list[tuple[tuple[int, ...], str]] | None = None  # (shape, dtype) of each parameter


class Prebuilder:
    def __init__(self, workers: int = 2) -> None:
        from tuner.tvm_api import PopenPoolExecutor

        self._workers = workers
        self._pool: Any = None
        self._pool_cls = PopenPoolExecutor
        self._timeout: float | None = None
        self._dir = tempfile.mkdtemp(prefix="tunefarm-build-")

    def warm(self, build_timeout_s: float) -> None:
        """Start the build processes now, without waiting for them: each imports TVM and the
        build's modules while the caller gets its first batch ready."""
        pool = self._ensure_pool(build_timeout_s)
        for _ in range(self._workers):
            pool.submit(_warm_up)

    def _ensure_pool(self, timeout: float) -> Any:
        if self._pool is None or self._timeout != timeout:
            self.close_pool()
            self._pool = self._pool_cls(max_workers=self._workers, timeout=timeout)
            self._timeout = timeout
        return self._pool

    def build(self, inputs: list[MeasureInput], *, whole: bool = False) -> dict[str, Built]:
        """Build each input (the kernel, or with `whole` the program with its weight packing);
        failures and timeouts are `Built`s without a path."""
        if not inputs:
            return {}
        timeout = max(inp.options.build_timeout_s for inp in inputs)
        pool = self._ensure_pool(timeout)
        futures = [(inp, pool.submit(build_kernel, inp.to_json(), self._dir, whole))
                   for inp in inputs]
        out: dict[str, Built] = {}
        for inp, fut in futures:
            try:
                path, secs, params = fut.result()
                out[inp.trial_id] = Built(path, secs, params=[(tuple(s), d) for s, d in params])
            except TimeoutError:
                out[inp.trial_id] = Built(None, None, Invalidity.BUILD_TIMEOUT,
                                          f"build did not finish within {timeout:g} s; worker killed")
            except ChildProcessError as exc:
                out[inp.trial_id] = Built(None, None, Invalidity.BUILD_ERROR,
                                          f"the build process died: {exc}")
            except Exception as exc:  # noqa: BLE001 - a failed build is data
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                msg = " | ".join(lines[:2] + (["..."] + lines[-3:] if len(lines) > 5 else lines[2:]))
                out[inp.trial_id] = Built(None, None, Invalidity.BUILD_ERROR,
                                          f"{type(exc).__name__}: {msg}"[:2000])
        return out

    def discard(self, path: str | None) -> None:
        if path:
            try:
                os.remove(path)
            except OSError:
                pass

    def close_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def close(self) -> None:
        self.close_pool()
        shutil.rmtree(self._dir, ignore_errors=True)
