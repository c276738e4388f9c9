"""Parallel builds ahead of measurement.

Building is most of a candidate's measuring cost, and it needs no quiet machine: a batch is
compiled by a pool of build processes (one per core) *before* its candidates are timed one by one
in the sandbox, which then only loads the built library. A build that raises is a `build_error`,
one past the deadline a `build_timeout` (the pool kills that worker); both are results, never
exceptions. The pool is TVM's popen pool: it kills a worker past its deadline and respawns it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.core import zygote
from tuner.core.isolation import Limits, child_env
from tuner.measure import Invalidity, MeasureInput
from tuner.measure.evaluate import first_line

if TYPE_CHECKING:
    from tuner.core.tvm_api import PopenPoolExecutor

_WORKLOADS: dict[str, Any] = {}


def build_kernel(inp_json: str, out_dir: str, whole: bool = False
                 ) -> tuple[str, float, list[tuple[tuple[int, ...], str]]]:
    """(In a build process.) Replay, strip weight packing (unless `whole`), compile, export;
    returns (path, secs, the built function's parameter specs). The library is a `.so` for this
    machine's architecture and a `.tar` for another one (no cross linker needed)."""
    from schedules.registry import replay
    from tuner.core import tvm_api as tv
    from tuner.core.prepack import kernel as kernel_of
    from tuner.workloads import parse_spec

    t0 = time.perf_counter()
    inp = MeasureInput.from_json(inp_json)
    wl = _WORKLOADS.get(inp.workload_key)
    if wl is None:
        wl = _WORKLOADS[inp.workload_key] = parse_spec(inp.workload_spec)
    sch = replay(wl.mod(), inp.trace_json)
    mod = sch.mod if whole else kernel_of(sch.mod)
    target = tv.make_target(inp.target)
    rt = tv.compile_module(mod, target)
    name = f"{inp.trial_id}-whole" if whole else inp.trial_id
    path = tv.export_library(rt, os.path.join(out_dir, name + tv.library_suffix(target)))
    return path, time.perf_counter() - t0, tv.param_specs(mod)


def reference_outputs(spec_json: str, seed: int) -> tuple[list[Any], str]:
    """(In a build process.) The reference outputs of a workload for its inputs of `seed`, and
    how a candidate's outputs start (`Prepared.fill`). For a `tir` workload that is its
    unscheduled program compiled and run: code from a submission, which a worker never runs in
    its own process (it holds the worker's token)."""
    import json

    from tuner.measure.evaluate import Prepared

    prep = Prepared(json.loads(spec_json), seed)
    return prep.ensure_reference(lambda _msg: None, ""), prep.ensure_fill()


def file_sha256(path: str) -> str:
    """The sha256 (hex) of a file's bytes: the name an artifact is checked by before loading."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    sha256: str | None = None  # of the library's bytes, taken as soon as the build returned it


def _sandboxed_init(user: str) -> None:
    """(In a build process, as root.) Import what builds need, then drop to `user`: the
    interpreter may live where that user cannot read (see `Limits.drop_now`)."""
    from tuner.measure.sandbox import warm_imports

    warm_imports()
    Limits(memory_mb=None, cpu_s=None, fsize_mb=None, user=user).drop_now()


def _sandboxed_pool(limits: Limits, build_dir: str) -> type[PopenPoolExecutor]:
    """TVM's popen pool whose build processes start like every untrusted child: `child_env()`,
    `limits.preexec()` (own session, rlimits, no root), and a build directory they can write."""
    import sys
    import threading

    from tuner.core.tvm_api import PopenPoolExecutor, PopenWorker

    late_drop = limits.drop_ids() is not None and not limits.can_exec(sys.executable)
    start = limits.keep_root() if late_drop else limits
    ids = limits.drop_ids()
    if ids is not None:
        os.chown(build_dir, *ids)

    class Worker(PopenWorker):
        def _start(self) -> None:
            if self._proc is not None:
                return
            main_read, worker_write = os.pipe()
            worker_read, main_write = os.pipe()
            self._proc = zygote.popen(
                "tvm.exec.popen_worker", str(worker_read), str(worker_write), limits=start,
                pass_fds=(worker_read, worker_write), stdout=self._stdout,
                stderr=self._stderr, env=child_env({"TMPDIR": build_dir, "HOME": build_dir}),
                cwd=os.getcwd())
            os.close(worker_read)
            os.close(worker_write)
            self._reader = os.fdopen(main_read, "rb")
            self._writer = os.fdopen(main_write, "wb")

    class Pool(PopenPoolExecutor):
        def __init__(self, max_workers: int, timeout: float) -> None:
            init, args = (_sandboxed_init, (limits.user,)) if late_drop else (None, ())
            super().__init__(max_workers=max_workers, timeout=timeout, initializer=init,
                             initargs=args)

        def _worker_run(self, fn: Callable[..., object], args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> object:
            with self._lock:
                tid = threading.get_ident()
                proc = self._worker_map.get(tid)
                if proc is None:
                    proc = self._worker_map[tid] = Worker(
                        self._initializer, self._initargs, self._maximum_process_uses,
                        self._stdout, self._stderr)
            proc.send(fn, args, kwargs, self._timeout)
            return proc.recv()

    return Pool


class Prebuilder:
    def __init__(self, workers: int = 2) -> None:
        self._workers = workers
        self._pool: PopenPoolExecutor | None = None
        self._timeout: float | None = None
        self._dir = tempfile.mkdtemp(prefix="tunefarm-build-")
        os.chmod(self._dir, 0o711)  # the sandbox (maybe another user) loads libraries by path
        self._pool_cls = _sandboxed_pool(Limits.from_settings(), self._dir)

    def warm(self, build_timeout_s: float) -> None:
        """Start the build processes now, without waiting for them: each imports TVM and the
        build's modules while the caller gets its first batch ready."""
        pool = self._ensure_pool(build_timeout_s)
        for _ in range(self._workers):
            pool.submit(_warm_up)

    def _ensure_pool(self, timeout: float) -> PopenPoolExecutor:
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
                path = self.own_file(path)
                out[inp.trial_id] = Built(path, secs, params=[(tuple(s), d) for s, d in params],
                                          sha256=file_sha256(path))
            except TimeoutError:
                out[inp.trial_id] = Built(
                    None, None, Invalidity.BUILD_TIMEOUT,
                    f"build did not finish within {timeout:g} s; worker killed")
            except ChildProcessError as exc:
                out[inp.trial_id] = Built(None, None, Invalidity.BUILD_ERROR,
                                          f"the build process died: {exc}")
            except Exception as exc:  # a failed build is data
                out[inp.trial_id] = Built(None, None, Invalidity.BUILD_ERROR, first_line(exc))
        return out

    def own_file(self, path: object) -> str:
        """`path` as a build process returned it, if it names a regular file (no link) inside
        this builder's directory: a build process runs untrusted code, so the path it answers
        is checked before anything reads, hashes or removes it. ValueError otherwise."""
        root = os.path.realpath(self._dir) + os.sep
        if (not isinstance(path, str) or os.path.islink(path) or not os.path.isfile(path)
                or not os.path.realpath(path).startswith(root)):
            raise ValueError(f"the build process answered a path outside its build directory: "
                             f"{str(path)[:200]!r}")
        return path

    def reference(self, spec: dict[str, Any], seed: int,
                  timeout_s: float) -> tuple[list[Any], str]:
        """The reference outputs of a workload and its candidates' output fill
        (`reference_outputs`), computed in a build process. Raises RuntimeError naming why when
        that process fails, dies or runs past its deadline (the running pool's build deadline,
        else `timeout_s`)."""
        import json

        pool = self._ensure_pool(self._timeout or timeout_s)
        try:
            outputs, fill = pool.submit(reference_outputs, json.dumps(spec), seed).result()
            return list(outputs), str(fill)
        except TimeoutError as exc:
            raise RuntimeError(f"the reference (the unscheduled program) did not finish within "
                               f"{self._timeout:g} s") from exc
        except ChildProcessError as exc:
            raise RuntimeError(f"the reference (the unscheduled program) killed its process: "
                               f"{exc}") from exc
        except Exception as exc:
            raise RuntimeError(f"the reference (the unscheduled program) failed: "
                               f"{first_line(exc)}") from exc

    def discard(self, path: str | None) -> None:
        if path:
            with contextlib.suppress(OSError):
                os.remove(path)

    def close_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def close(self) -> None:
        self.close_pool()
        shutil.rmtree(self._dir, ignore_errors=True)
