"""Which targets a request may name: an allowlist of kinds, attributes and values.

TVM accepts far more than a farm can serve or should let a user choose: kinds no worker has
(`c`, `rocm`, `hexagon`, ...), LLVM command-line options (`cl-opt`), a `num-cores` of 100000 or
-5, libraries to link. A target that comes from outside (a REST request, a worker's
registration) is checked here, attribute by attribute, before TVM sees it; the error names the
attribute (`target.cl-opt`). What passes is exactly what is then handed to TVM.

    check_target(spec, max_cores=64)   None, or TargetError(field="target.<attr>")

The canonical fields TVM adds itself (`keys`, an empty `tag`, an llvm target's derived
`feature.*` flags) are accepted, so a target read
back from a record or `GET /v1/best` can be sent again as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import TargetError

MAX_CORES = 256  # the default bound on `num-cores` when nothing tighter is known
_KEYS = frozenset({"cpu", "arm_cpu", "cuda", "gpu"})
_MCPU = re.compile(r"[a-z0-9][a-z0-9_.+-]{0,63}")
# x86-64 and AArch64 Linux/Android triples: x86_64-linux-gnu, aarch64-unknown-linux-gnu, ...
_TRIPLE = re.compile(r"(x86_64|aarch64|arm64)(-[a-z0-9_.]{1,24}){1,3}")
_MATTR = re.compile(r"[+-][a-z0-9][a-z0-9_.-]{0,31}")  # LLVM names: amx-tile, avx512vl, v8.2a
_ARCH = re.compile(r"sm_[0-9]{2,3}[a-z]?")
_FEATURE = re.compile(r"feature\.[a-z0-9_]{1,32}")
MAX_MATTRS = 32


def _str(pattern: re.Pattern[str], what: str) -> Callable[[str, object, int], None]:
    def check(field: str, value: object, _max_cores: int) -> None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise TargetError(f"{value!r} is not {what}", field=field)
    return check


def _int(lo: int, hi: int | None = None) -> Callable[[str, object, int], None]:
    """An integer in lo..hi (hi None: the request's core bound)."""
    def check(field: str, value: object, max_cores: int) -> None:
        top = max_cores if hi is None else hi
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= top:
            raise TargetError(f"must be an integer from {lo} to {top}, not {value!r}",
                              field=field)
    return check


def _mattr(field: str, value: object, _max_cores: int) -> None:
    if not isinstance(value, list) or len(value) > MAX_MATTRS:
        raise TargetError(f"must be a list of at most {MAX_MATTRS} features such as '+neon'",
                          field=field)
    for feature in value:
        if not isinstance(feature, str) or not _MATTR.fullmatch(feature):
            raise TargetError(f"{feature!r} is not a feature ('+name' or '-name')", field=field)


def _keys(field: str, value: object, _max_cores: int) -> None:
    if (not isinstance(value, list) or not value
            or not all(isinstance(k, str) and k in _KEYS for k in value)):
        raise TargetError(f"must be a list drawn from {sorted(_KEYS)}", field=field)


def _empty_tag(field: str, value: object, _max_cores: int) -> None:
    if value != "":
        raise TargetError("named target tags are not accepted: spell the target out",
                          field=field)


def _host(field: str, value: object, max_cores: int) -> None:
    if not isinstance(value, dict) or value.get("kind") != "llvm":
        raise TargetError('must be an llvm target dict, e.g. {"kind": "llvm"}', field=field)
    _check(value, field, max_cores)


_ATTRS: dict[str, dict[str, Callable[[str, object, int], None]]] = {
    "llvm": {"mcpu": _str(_MCPU, "a CPU name such as 'znver4'"),
             "mtriple": _str(_TRIPLE, "an x86_64 or aarch64 target triple"),
             "mattr": _mattr, "num-cores": _int(1), "keys": _keys, "tag": _empty_tag},
    "cuda": {"arch": _str(_ARCH, "a CUDA architecture such as 'sm_90'"),
             "max_num_threads": _int(1, 4096), "max_threads_per_block": _int(1, 4096),
             "thread_warp_size": _int(32, 64), "max_shared_memory_per_block": _int(1, 1 << 20),
             "registers_per_block": _int(1, 1 << 20), "keys": _keys, "tag": _empty_tag,
             "host": _host},
}


def _check(spec: dict[str, Any], prefix: str, max_cores: int) -> None:
    kind = spec.get("kind")
    if kind not in _ATTRS:
        raise TargetError(f"kind {kind!r} is not served here; use one of {sorted(_ATTRS)}",
                          field=f"{prefix}.kind")
    allowed = _ATTRS[kind]
    for name, value in spec.items():
        if name == "kind":
            continue
        if kind == "llvm" and isinstance(name, str) and _FEATURE.fullmatch(name):
            if not isinstance(value, bool):  # TVM's derived CPU features, as it exports them
                raise TargetError(f"must be true or false, not {value!r}", field=f"{prefix}.{name}")
            continue
        if not isinstance(name, str) or name not in allowed:
            raise TargetError(f"attribute {name!r} is not accepted for kind {kind!r} (allowed: "
                              f"{', '.join(sorted(allowed))})", field=f"{prefix}.{name}")
        allowed[name](f"{prefix}.{name}", value, max_cores)


def check_target(spec: object, *, max_cores: int = MAX_CORES) -> None:
    """Refuse a target dict that is not on the allowlist (TargetError naming the attribute).
    `max_cores` bounds `num-cores` (the cores of the workers that would run it)."""
    if not isinstance(spec, dict):
        raise TargetError('must be "host" or a JSON object with a "kind"', field="target")
    _check(spec, "target", max_cores)
