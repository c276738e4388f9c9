"""tvm-ffi's list of global function names, read once per change instead of once per module.

`import tvm` runs `tvm_ffi.init_ffi_api(prefix, module)` for each of its ~50 `_ffi_api` modules, and
each call lists every global function TVM has registered (about 2,000 names, one FFI call per
name) to keep those under its prefix: about an eighth of `import tvm`'s time, paid by every
process tunefarm starts (the sandbox, the builders, the parse children, the CLI). The names change
only when a function is registered or removed; `install` makes the registry's listing keep
the last list and read it again only when the count of names has changed or a name was removed
through the registry.

Standard library only (`tuner.core.tvm_api` installs it into `tvm_ffi.registry` before it imports
TVM).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any


def install(ffi: ModuleType) -> None:
    """Give `ffi.registry` (`ffi` is the `tvm_ffi` package) a `list_global_func_names` that lists
    again only when the count of global functions changed or `remove_global_func` (the package's
    or the registry's) ran since; idempotent. A name removed through the C API alone is not seen."""
    registry = ffi.registry
    if getattr(registry.list_global_func_names, "_tunefarm_cached", False):
        return
    get_global_func: Callable[[str], Any] = registry.get_global_func
    remove: Callable[[str], None] = registry.remove_global_func
    lock = threading.Lock()
    known: dict[str, Any] = {"count": -1, "names": []}

    def list_global_func_names() -> list[str]:
        functor = get_global_func("ffi.FunctionListGlobalNamesFunctor")()
        count = int(functor(-1))
        with lock:
            if count != known["count"]:
                known["names"] = [functor(i) for i in range(count)]
                known["count"] = count
            return list(known["names"])

    def remove_global_func(name: str) -> None:
        with lock:
            known["count"] = -1  # a removal and a registration leave the count as it was
        remove(name)

    list_global_func_names._tunefarm_cached = True  # type: ignore[attr-defined]
    list_global_func_names.__wrapped__ = registry.list_global_func_names  # type: ignore[attr-defined]
    list_global_func_names.__doc__ = registry.list_global_func_names.__doc__
    registry.list_global_func_names = list_global_func_names  # type: ignore[attr-defined]
    registry.remove_global_func = remove_global_func  # type: ignore[attr-defined]
    ffi.remove_global_func = remove_global_func  # type: ignore[attr-defined]
