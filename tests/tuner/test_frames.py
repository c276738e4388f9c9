"""`tuner.core.frames.stack`: what TVMScript's decorators read of `inspect.stack()`, the same."""

from __future__ import annotations

import inspect
import os

from tuner.core import frames


def _both() -> tuple[list[inspect.FrameInfo], list[inspect.FrameInfo]]:
    return frames.stack(), inspect.stack()


def test_the_cheap_stack_lists_the_frames_lines_and_context_inspect_lists() -> None:
    cheap, full = _both()
    assert len(cheap) == len(full)
    for c, f in zip(cheap, full, strict=True):
        assert (c.frame, c.filename, c.lineno, c.function) == (f.frame, f.filename, f.lineno,
                                                              f.function)
        if os.path.exists(f.filename):  # a frame of a source file: its current line
            assert c.code_context == f.code_context
    # the innermost frame (the caller) has its source line, as TVM's class check reads it
    assert cheap[0].function == "_both" and "frames.stack()" in (cheap[0].code_context or [""])[0]


def test_tvm_parser_entries_use_it_and_tvmscript_in_a_class_still_parses() -> None:
    import importlib

    from tuner.core import tvm_api as tv

    for name in ("tvm.tirx.script.parser.entry", "tvm.script.parser.ir.entry",
                 "tvm.relax.script.parser.entry"):
        assert importlib.import_module(name).inspect.stack is frames.stack
    from tvm.script import ir as I
    from tvm.script import tirx as T

    @I.ir_module
    class Module:
        @T.prim_func
        def double(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")) -> None:
            for i in range(4):
                b[i] = a[i] * T.float32(2)

    assert "double" in [gv.name_hint for gv in tv.module_functions(Module)]
