"""How tunefarm starts a child process that handles untrusted input (a TVMScript parse, a
candidate's build or run): resource limits, an environment with nothing secret in it, and no root.

    child_env(extra)        the environment a child gets: PATH, locale, TVM's thread settings and
                            `extra`; never a TUNEFARM_* variable, a token or a database URL
    Limits.from_settings()  address space, CPU seconds, processes, file size (`Settings.sandbox_*`)
    Limits.preexec()        for `subprocess.Popen(preexec_fn=...)`: a new session, the limits,
                            then (when started as root) a network namespace of its own (no
                            network) and the unprivileged `sandbox_user`
    undumpable()            a process holding credentials (worker, API, tuner) hides its
                            environment and memory from other processes of its user

A child that exceeds its address space sees allocations fail (MemoryError, a TVM allocation
error), one over CPU time gets SIGXCPU/SIGKILL: either way the PARENT records a failure and lives.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import pwd
import resource
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace

from .config import Settings, get_settings

# what TVM, LLVM and a Python child need from the parent's environment (nothing else passes)
_PASS = ("PATH", "LANG", "LC_ALL", "TZ", "TVM_NUM_THREADS", "TVM_BIND_THREADS",
         "OMP_NUM_THREADS", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR")
_MB = 1 << 20


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of an untrusted child: `_PASS` from ours, then `extra`. HOME points
    at the temporary directory (nothing of the parent's home is read), PYTHONNOUSERSITE and
    PYTHONDONTWRITEBYTECODE keep the child off the parent's files."""
    env = {k: os.environ[k] for k in _PASS if k in os.environ}
    env.update(HOME=env.get("TMPDIR", "/tmp"), PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONHASHSEED="0")
    for k, v in (extra or {}).items():
        if k.upper().startswith("TUNEFARM_"):
            raise ValueError(f"{k} must not reach an untrusted child")
        env[k] = v
    return env


@dataclass(frozen=True)
class Limits:
    memory_mb: int | None = 8192  # RLIMIT_AS
    cpu_s: int | None = 1800  # RLIMIT_CPU (soft; the hard limit is 10 s later)
    nproc: int | None = 512  # RLIMIT_NPROC: only applied with `user` (it counts per user)
    fsize_mb: int | None = 1024  # RLIMIT_FSIZE
    user: str = "nobody"  # dropped to when the parent runs as root; "" keeps the parent's user
    offline: bool = True  # as root: a network namespace of its own (no interface but a down lo)
    nice: int = 0  # added to the child's niceness (a parse child yields the CPU to the API)

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **over: object) -> Limits:
        s = settings or get_settings()
        base = dict(memory_mb=s.sandbox_memory_mb, cpu_s=s.sandbox_cpu_s, nproc=s.sandbox_nproc,
                    fsize_mb=s.sandbox_fsize_mb, user=s.sandbox_user)
        base.update(over)
        return cls(**base)  # type: ignore[arg-type]

    def drop_ids(self) -> tuple[int, int] | None:
        """(uid, gid) to drop to: only when this process is root and `user` exists."""
        if not self.user or os.geteuid() != 0:
            return None
        try:
            pw = pwd.getpwnam(self.user)
        except KeyError:
            return None
        return pw.pw_uid, pw.pw_gid

    def describe(self) -> str:
        parts = [f"address space {self.memory_mb} MiB" if self.memory_mb else "",
                 f"CPU {self.cpu_s} s" if self.cpu_s else "",
                 f"file size {self.fsize_mb} MiB" if self.fsize_mb else ""]
        return ", ".join(p for p in parts if p)

    def preexec(self) -> Callable[[], None]:
        """A `preexec_fn`: runs in the child between fork and exec. Its own session (the parent
        kills the whole group), the limits, then no root."""
        ids = self.drop_ids()

        def apply() -> None:
            os.setsid()
            self._confine(ids)

        return apply

    def apply_here(self) -> None:
        """The same limits (and drop), applied by a process to itself: for a child started
        without a `preexec_fn` (forking a large parent to run one stalls the parent's threads
        for tens of milliseconds; a plain spawn does not), before it reads any input."""
        self._confine(self.drop_ids())

    def as_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_json(cls, text: str) -> Limits:
        d = json.loads(text)
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def _confine(self, ids: tuple[int, int] | None) -> None:
        if self.nice:
            os.nice(self.nice)
        if self.memory_mb:
            _set(resource.RLIMIT_AS, self.memory_mb * _MB)
        if self.cpu_s:
            _set(resource.RLIMIT_CPU, self.cpu_s, self.cpu_s + 10)
        if self.fsize_mb:
            _set(resource.RLIMIT_FSIZE, self.fsize_mb * _MB)
        _set(resource.RLIMIT_CORE, 0)
        if self.offline and os.geteuid() == 0:
            _no_network()
        if ids is not None:
            self._drop(ids)

    def drop_now(self) -> None:
        """Drop to `user` in this process now (the process limit too): for a child whose
        interpreter the unprivileged user cannot reach (e.g. a Python under root's home), which
        therefore starts as root with `keep_root().preexec()` and calls this once its imports
        are done."""
        ids = self.drop_ids()
        if ids is not None:
            self._drop(ids)

    def _drop(self, ids: tuple[int, int]) -> None:
        uid, gid = ids
        if self.nproc:
            _set(resource.RLIMIT_NPROC, self.nproc)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    def keep_root(self) -> Limits:
        """The same limits without the user drop (see `drop_now`)."""
        return replace(self, user="")

    def can_exec(self, path: str) -> bool:
        """Whether `user` can reach and run `path` (every directory above it searchable by
        others, or owned by that user); always True when no drop happens."""
        ids = self.drop_ids()
        if ids is None:
            return True
        real = os.path.realpath(path)
        parts = real.split(os.sep)
        for i in range(1, len(parts)):
            p = os.sep.join(parts[: i + 1]) or os.sep
            st = os.stat(p)
            need = stat.S_IXOTH if i < len(parts) - 1 else stat.S_IXOTH | stat.S_IROTH
            if st.st_uid != ids[0] and (st.st_mode & need) != need:
                return False
        return True


_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_CLONE_NEWNET = 0x40000000


def _no_network() -> None:
    """(In a child, before exec, as root.) Leave the host's network: a namespace of our own
    whose only interface is a loopback that is down, so a kernel, a build or a parse reaches
    no socket of the host or beyond. Linux only; elsewhere nothing changes."""
    if sys.platform.startswith("linux") and _LIBC.unshare(_CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")


def undumpable() -> bool:
    """Make this process non-dumpable (Linux `PR_SET_DUMPABLE` 0): processes of the same user,
    such as a sandbox child when the worker does not run as root, can no longer read its
    `/proc/<pid>/environ` or memory (where its token lives) nor ptrace it; no core dumps.
    A child gets its own flag back when it execs. Returns whether it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    pr_set_dumpable = 4
    return int(_LIBC.prctl(pr_set_dumpable, 0, 0, 0, 0)) == 0


def _set(which: int, soft: int, hard: int | None = None) -> None:
    """Lower a limit (never raise one above the current hard limit)."""
    _, cur_hard = resource.getrlimit(which)
    hard = soft if hard is None else hard
    if cur_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, cur_hard), min(hard, cur_hard)
    resource.setrlimit(which, (soft, hard))
