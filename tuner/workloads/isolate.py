"""Parse untrusted TVMScript in a throwaway child process, never in the calling one.

TVM's TVMScript parser evaluates Python expressions with builtins. The API, the tuner, the builder
and the sandbox hold credentials (tokens, database URLs), so none of them runs it on a submission:
`parse_isolated(vetted)` starts `tuner.workloads.parse_child` as a lean child (forked by the
process's fork server, `tuner.core.zygote`) with `child_env()` (nothing secret),
`Limits.from_settings()` (address space, CPU seconds, file size, own session, no root; the child
applies them to itself before it reads anything) and `parse_timeout_s`, sends it the text, and loads
the PrimFunc it prints as TVM JSON with `tvm.ir.load_json` (data: no Python of the submission runs
here). The child vets the text again before parsing it (`parse_child.py`).

A crash, a limit, a timeout or unreadable output is a SpecError ("the TVMScript parser
failed/timed out ..."), never another exception. Results (PrimFuncs and the parser's own
rejections) are kept in an in-process LRU keyed by the sha256 of the text, so reparsing a stored
spec (GET /v1/best, the tuner, the builder) does not start a child each time; crashes and
timeouts are not cached.

The one exception: a process that is itself an untrusted child which dropped root after it
started (`in_dropped_sandbox`: the measurement sandbox or a build process when the unprivileged
user cannot run the interpreter) cannot start a child and parses in-process: it already has the
clean environment, the limits and no credentials.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..core import zygote
from ..core.config import get_settings
from ..core.errors import SpecError
from ..core.isolation import Limits, child_env

if TYPE_CHECKING:
    from ..core.tvm_api import PrimFunc

FIELD = "tvmscript"
CHILD_MODULE = "tuner.workloads.parse_child"
CACHE_SIZE = 256
PARSE_NICE = 10  # parse children run niced: the API that started them stays responsive
_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds the tuner package

_cache: OrderedDict[str, tuple[bool, PrimFunc | str]] = OrderedDict()
_lock = threading.Lock()


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_isolated(vetted: str) -> PrimFunc:
    """The PrimFunc of `vetted` (the output of `vet_tvmscript`), parsed in a child process, or
    SpecError(field="tvmscript")."""
    key = text_key(vetted)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
    if hit is None:
        (hit,) = _parse_in_child([vetted])
        with _lock:
            _cache[key] = hit
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    ok, value = hit
    if not ok:
        raise SpecError(cast(str, value), field=FIELD)
    return cast("PrimFunc", value)


def prime(vetted: list[str], *, chunk: int = 16) -> None:
    """Parse the texts of one submitter (a model's tasks) a chunk per child instead of one
    child each, into the cache `parse_isolated` reads: what the children cost is their start
    (about 2 s each), not the parse. A chunk that crashes, hits a limit or times out caches
    nothing: each of its texts is then parsed alone, as without `prime`."""
    with _lock:
        todo = list(dict.fromkeys(t for t in vetted if text_key(t) not in _cache))
    for i in range(0, len(todo), chunk):
        part = todo[i:i + chunk]
        try:
            results = _parse_in_child(part)
        except SpecError:
            continue
        with _lock:
            for text, hit in zip(part, results, strict=True):
                _cache[text_key(text)] = hit
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def prestart() -> None:
    """Start the parse children's fork server now: the API does it at start-up, so that the
    first texts it parses (and the requests served meanwhile) do not wait for it."""
    if not in_dropped_sandbox():
        zygote.prestart(idle=True)


def _parse_in_child(texts: list[str]) -> list[tuple[bool, PrimFunc | str]]:
    """For each vetted text, (True, PrimFunc) or (False, the parser's or vetter's message), all
    parsed in one child; SpecError (not cached) when the child crashes, hits a limit or times
    out (the timeout is `parse_timeout_s` per text)."""
    if in_dropped_sandbox():
        return [_parse_here(t) for t in texts]
    settings = get_settings()
    timeout = float(settings.parse_timeout_s) * len(texts)
    limits = Limits.from_settings(settings, cpu_s=min(settings.sandbox_cpu_s * len(texts),
                                                      math.ceil(timeout) + 1), nice=PARSE_NICE)
    # an unprivileged user may not reach this interpreter (e.g. under root's home): the child
    # then starts as root with the limits set, imports, and drops itself before reading the text
    late_drop = limits.drop_ids() is not None and not limits.can_exec(sys.executable)
    start = limits.keep_root() if late_drop else limits
    # the child confines itself (`Limits.apply_here`) before it reads the text: forked by the
    # fork server or spawned, never forked from this (large) process, whose threads a fork
    # would stall
    args = (f"--limits={start.as_json()}", *([f"--drop={limits.user}"] if late_drop else []))
    request = json.dumps({"texts": texts, "max_tvmscript_bytes": settings.max_tvmscript_bytes,
                          "max_tvmscript_nodes": settings.max_tvmscript_nodes})
    tmp = tempfile.mkdtemp(prefix="tunefarm-parse-")
    ids = limits.drop_ids()
    if ids is not None:
        os.chown(tmp, *ids)
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = child_env({"TMPDIR": tmp, "HOME": tmp, "TVM_NUM_THREADS": "1", "PYTHONPATH": path})
    try:
        proc = zygote.popen(CHILD_MODULE, *args, idle=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True, cwd=tmp)
        try:
            out, err = proc.communicate(request.encode("utf-8"), timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise SpecError(f"the TVMScript parser timed out after {timeout:g} s "
                            "(parse_timeout_s)", field=FIELD) from None
    except OSError as exc:
        raise SpecError(f"the TVMScript parser could not start: {exc}", field=FIELD) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    reply = _last_json_line(out)
    replies = reply.get("results") if reply is not None else None
    if proc.returncode != 0 or not isinstance(replies, list) or len(replies) != len(texts):
        raise SpecError(f"the TVMScript parser failed ({_why(proc.returncode, err)}; sandbox "
                        f"limits: {limits.describe()})", field=FIELD)
    return [_loaded(r) for r in replies]


def _loaded(reply: object) -> tuple[bool, PrimFunc | str]:
    """One text's result from the child's reply: the PrimFunc loaded from its TVM JSON (data:
    no Python of the submission runs here), or the rejection."""
    from ..core.tvm_api import load_json, tvm

    if not isinstance(reply, dict) or not reply.get("ok"):
        why = reply.get("error") if isinstance(reply, dict) else None
        return False, str(why or "the TVMScript parser rejected the text")[:400]
    try:
        func = load_json(str(reply["json"]))
    except Exception as exc:  # malformed JSON from the child: treat it as a failed parse
        raise SpecError(f"the TVMScript parser failed (unreadable result: "
                        f"{type(exc).__name__})", field=FIELD) from None
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise SpecError(f"the TVMScript parser failed (got a {type(func).__name__}, not a "
                        "PrimFunc)", field=FIELD)
    return True, func


def in_dropped_sandbox() -> bool:
    """Whether this process is itself an untrusted child that dropped root after it started (a
    measurement sandbox or build process started with `keep_root()` + `drop_now()`: clean
    environment, limits, no credentials): unprivileged and unable to run its own interpreter, so
    it can start no parse child. Only such a process parses in-process."""
    return os.geteuid() != 0 and not os.access(sys.executable, os.X_OK)


def _parse_here(vetted: str) -> tuple[bool, PrimFunc | str]:
    from ..core.tvm_api import prim_func_from_tvmscript

    try:
        return True, prim_func_from_tvmscript(vetted)
    except Exception as exc:  # DiagnosticError, TypeError, ValueError, ... from the parser
        return False, parser_error(exc, vetted)


_LOC = re.compile(r"-->\s*\S*?:(\d+):(\d+)")


def parser_error(exc: BaseException, text: str) -> str:
    """The parser's refusal of `text`, with a hint for TVM 0.27's dialect where it applies."""
    msg = f"TVMScript parser: {first_error_line(exc)}"
    if "not well-formed" in msg and "s_tir=True" not in text and "T.sblock" in text:
        msg += (" (hint: in TVM 0.27 a PrimFunc with T.sblock blocks is declared "
                "@T.prim_func(s_tir=True))")
    elif "T.block(" in text and "sblock" not in text:
        msg += " (hint: TVM 0.27 names blocks T.sblock, not T.block)"
    return msg


def first_error_line(exc: BaseException) -> str:
    """The first meaningful line of a TVMScript parser error, with its line number."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("note: run with")]
    msg = next((ln for ln in lines if ln.startswith("error:")), lines[0] if lines else "")
    msg = msg.removeprefix("error:").strip() or type(exc).__name__
    loc = _LOC.search(text)
    if loc:
        msg = f"line {loc.group(1)}: {msg}"
    return msg[:300]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session (preexec)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.communicate()


def _last_json_line(out: bytes) -> dict[str, Any] | None:
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        if line.strip():
            try:
                reply = json.loads(line)
            except ValueError:
                return None
            return reply if isinstance(reply, dict) else None
    return None


def _why(code: int | None, err: bytes) -> str:
    if code is not None and code < 0:
        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"exit code {code}"
    tail = [ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    return f"{what}: {tail[-1][:200]}" if tail else what
