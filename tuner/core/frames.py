"""`inspect.stack()` without the source lookups: what TVMScript's decorators read of the stack, at
a small fraction of the cost.

Every `@T.prim_func`, `@R.function` and `@I.ir_module` evaluation calls `inspect.stack()` first
(to tell a function defined in an `ir_module` class from a free one, and to find the enclosing
scopes' locals). `inspect.stack()` resolves each frame's module by scanning `sys.modules` again
for every frame whose file is not on disk (`<frozen runpy>`, the parser's `<ast>`), and opens
the source of every frame: with torch imported (thousands of modules) and pytest's deep stacks,
importing TVM's CUDA intrinsics (a few hundred decorators) took 34 s, and a model job's parse
child spent about a third of each parse there. TVM reads three things of each entry: the frame,
its line number and the current line (`code_context`); this gives those from `linecache`, and
`None` as the context of a frame without a source file, as `inspect.stack()` does.

Standard library only (`tuner.core.tvm_api` installs it into TVM's parser entry modules).
"""

from __future__ import annotations

import inspect
import linecache
import sys
from types import FrameType, ModuleType


def stack(context: int = 1) -> list[inspect.FrameInfo]:
    """The caller's stack, innermost first, as `inspect.stack(context)` lists it (`context` 0 or
    1: no more than the current line, all TVM asks for)."""
    frames: list[inspect.FrameInfo] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        lineno = frame.f_lineno or code.co_firstlineno
        line = linecache.getline(code.co_filename, lineno) if context > 0 else ""
        frames.append(inspect.FrameInfo(frame, code.co_filename, lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames


class _Inspect(ModuleType):
    """`inspect` with `stack` replaced, for one module's namespace."""

    def __getattr__(self, name: str) -> object:
        return getattr(inspect, name)


def install(module: ModuleType) -> None:
    """Make `module`'s `inspect.stack()` this module's `stack` (other `inspect` names unchanged);
    nothing where `module` does not use `inspect`."""
    if getattr(module, "inspect", None) is not inspect:
        return
    proxy = _Inspect("inspect", inspect.__doc__)
    proxy.stack = stack  # type: ignore[attr-defined]
    module.inspect = proxy  # type: ignore[attr-defined]
